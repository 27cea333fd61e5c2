//! A collection's JSON Schema (2020-12) checked against the bounds a
//! declaration must keep (docs/guides/validation.md, "Bounds"), compiled
//! once, and the errors of a document against it as a form can show them.
//!
//! The bounds make the check of one document cost a bounded time whatever
//! an admin declares: the schema's size, depth and keyword count; `$ref`
//! only within the schema (never fetched); patterns run by a linear-time
//! engine; `uniqueItems` only under a `maxItems`; and the number of
//! subschemas one value of a document can be checked against, counted
//! with every `$ref` followed (a schema that doubles at each level is
//! refused, however small it is written).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::document::rules::{Invalid, MAX_DATA_DEPTH};

/// The largest schema a declaration takes, as JSON.
pub(crate) const MAX_BYTES: usize = 64 * 1024;
/// How deeply a schema may nest (objects and arrays).
pub(crate) const MAX_DEPTH: usize = 32;
/// The most object members a schema may hold in all.
pub(crate) const MAX_KEYWORDS: usize = 2_000;
/// The most subschemas one value may be checked against, `$ref`s
/// followed (see [`expansion`]).
pub(crate) const MAX_EXPANSION: u64 = 100_000;
/// The largest `maxItems` a `uniqueItems` may be under.
pub(crate) const MAX_UNIQUE_ITEMS: u64 = 10_000;
/// The most errors a refusal lists (the rest are counted in its detail).
pub(crate) const MAX_ERRORS: usize = 50;
/// The bytes a pattern's compiled program may take.
const PATTERN_BYTES: usize = 1 << 20;
/// The one draft taken.
pub(crate) const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

/// One way a document fails its schema: where in the document, the
/// keyword that failed, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
pub struct Violation {
    /// JSON pointer of the offending field in the document (for a missing
    /// required field, where it would be).
    #[schema(example = "/total")]
    pub pointer: String,
    /// The schema keyword that failed (`type`, `required`, `minimum`, …).
    #[schema(example = "minimum")]
    pub keyword: String,
    #[schema(example = "-1 is less than the minimum of 0")]
    pub detail: String,
}

/// A declared schema, checked and compiled.
pub struct Compiled {
    pub validator: jsonschema::Validator,
    /// How many subschemas one value may be checked against.
    pub expansion: u64,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("expansion", &self.expansion).finish_non_exhaustive()
    }
}

/// `schema` checked against the bounds and compiled; `Invalid` points into
/// the schema (the request body).
pub(crate) fn compile(schema: &Value) -> Result<Compiled, Invalid> {
    let size = serde_json::to_vec(schema).map_or(usize::MAX, |b| b.len());
    if size > MAX_BYTES {
        return Err(Invalid::new(
            "",
            format!("a schema takes at most {MAX_BYTES} bytes as JSON; this one takes {size}"),
        ));
    }
    if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
        return Err(Invalid::new("", "a schema is a JSON object (or true or false)"));
    }
    let mut walk = Walk { keywords: 0, anchors: HashMap::new() };
    walk.check(schema, "", 1)?;
    if let Value::Object(root) = schema
        && let Some(draft) = root.get("$schema")
        && draft.as_str().map(|d| d.trim_end_matches('#')) != Some(DRAFT)
    {
        return Err(Invalid::new("/$schema", format!("the only draft taken is {DRAFT}")));
    }
    let expansion = expansion(schema, &walk.anchors)?;
    let options = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .should_ignore_unknown_formats(false)
        .offline()
        .with_pattern_options(
            jsonschema::PatternOptions::regex().size_limit(PATTERN_BYTES).dfa_size_limit(PATTERN_BYTES),
        );
    let validator = options.build(schema).map_err(|e| {
        let at = e.schema_path().to_string();
        Invalid::new(at, format!("not a valid schema: {}", e.masked()))
    })?;
    Ok(Compiled { validator, expansion })
}

impl Compiled {
    /// Every way `data` fails the schema (at most [`MAX_ERRORS`], and how
    /// many more), each pointing at the field to blame.
    pub(crate) fn violations(&self, data: &Value) -> (Vec<Violation>, usize) {
        let mut found = Vec::new();
        let mut more = 0;
        for error in self.validator.iter_errors(data) {
            for v in violations_of(&error) {
                if found.len() < MAX_ERRORS {
                    found.push(v);
                } else {
                    more += 1;
                }
            }
        }
        (found, more)
    }
}

/// What one error of the validator says, as violations: a missing
/// required field, and each property a schema does not allow, is pointed
/// at itself, where a form shows it.
fn violations_of(error: &jsonschema::ValidationError<'_>) -> Vec<Violation> {
    use jsonschema::error::ValidationErrorKind as Kind;
    let at = error.instance_path().to_string();
    let keyword = error.kind().keyword().to_owned();
    let below = |name: &str| format!("{at}/{}", crate::document::rules::escape(name));
    match error.kind() {
        Kind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            vec![Violation { pointer: below(name), keyword, detail: format!("{name:?} is required") }]
        }
        Kind::AdditionalProperties { unexpected } | Kind::UnevaluatedProperties { unexpected } => unexpected
            .iter()
            .map(|name| Violation {
                pointer: below(name),
                keyword: keyword.clone(),
                detail: format!("{name:?} is not allowed here"),
            })
            .collect(),
        _ => vec![Violation { pointer: at, keyword, detail: error.masked().to_string() }],
    }
}

/// The walk of a schema at its declaration: depth, member count, the
/// references it makes and the anchors it names.
struct Walk {
    keywords: usize,
    /// `$anchor` name → the pointer of the schema naming it.
    anchors: HashMap<String, String>,
}

impl Walk {
    fn check(&mut self, value: &Value, pointer: &str, depth: usize) -> Result<(), Invalid> {
        if depth > MAX_DEPTH && matches!(value, Value::Object(_) | Value::Array(_)) {
            return Err(Invalid::new(pointer, format!("a schema nests at most {MAX_DEPTH} levels")));
        }
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.check(item, &format!("{pointer}/{i}"), depth + 1)?;
                }
            }
            Value::Object(members) => {
                self.keywords += members.len();
                if self.keywords > MAX_KEYWORDS {
                    return Err(Invalid::new(pointer, format!("a schema holds at most {MAX_KEYWORDS} members")));
                }
                self.members(members, pointer)?;
                for (key, item) in members {
                    let at = format!("{pointer}/{}", crate::document::rules::escape(key));
                    self.check(item, &at, depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn members(&mut self, members: &Map<String, Value>, pointer: &str) -> Result<(), Invalid> {
        let at = |key: &str| format!("{pointer}/{}", crate::document::rules::escape(key));
        for key in ["$ref"] {
            if let Some(target) = members.get(key) {
                match target.as_str() {
                    Some(t) if t.starts_with('#') => {}
                    _ => {
                        return Err(Invalid::new(
                            at(key),
                            "a $ref names a part of this schema (\"#/$defs/…\" or \"#anchor\"): nothing is ever fetched",
                        ));
                    }
                }
            }
        }
        for key in ["$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"] {
            if members.contains_key(key) {
                return Err(Invalid::new(at(key), format!("{key} is not taken: use $ref within the schema")));
            }
        }
        if members.contains_key("$id") && !pointer.is_empty() {
            return Err(Invalid::new(at("$id"), "$id is taken at the schema's root only"));
        }
        if members.contains_key("$schema") && !pointer.is_empty() {
            return Err(Invalid::new(at("$schema"), "$schema is taken at the schema's root only"));
        }
        if let Some(name) = members.get("$anchor").and_then(Value::as_str) {
            self.anchors.insert(name.to_owned(), pointer.to_owned());
        }
        if members.get("uniqueItems") == Some(&Value::Bool(true)) {
            let bounded = members.get("maxItems").and_then(Value::as_u64).is_some_and(|m| m <= MAX_UNIQUE_ITEMS);
            if !bounded {
                return Err(Invalid::new(
                    at("uniqueItems"),
                    format!("uniqueItems needs a maxItems of at most {MAX_UNIQUE_ITEMS} beside it"),
                ));
            }
        }
        Ok(())
    }
}

/// Keywords whose subschemas apply to the same value.
const IN_PLACE: &[&str] = &["allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "$ref"];
/// Keywords whose subschemas apply to the values inside it.
const INSIDE: &[&str] = &[
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "items",
    "prefixItems",
    "contains",
    "unevaluatedItems",
    "contentSchema",
];

/// How many subschemas one value of a document (of the deepest data
/// allowed) can be checked against, every `$ref` followed: a bound on the
/// work of a check per value. Refused past [`MAX_EXPANSION`].
fn expansion(schema: &Value, anchors: &HashMap<String, String>) -> Result<u64, Invalid> {
    let mut count = Expansion { root: schema, anchors, memo: HashMap::new(), open: Vec::new() };
    let total = count.of(schema, "", MAX_DATA_DEPTH);
    if total > MAX_EXPANSION {
        return Err(Invalid::new(
            "",
            format!(
                "checking one value could take more than {MAX_EXPANSION} subschemas, every $ref followed: \
                 share fewer references under anyOf/oneOf/allOf, or nest them less"
            ),
        ));
    }
    Ok(total)
}

struct Expansion<'a> {
    root: &'a Value,
    anchors: &'a HashMap<String, String>,
    memo: HashMap<(String, usize), u64>,
    /// The schemas being counted (a `$ref` back to one of them at the
    /// same depth checks nothing more: the validator stops such a loop).
    open: Vec<(String, usize)>,
}

impl Expansion<'_> {
    fn of(&mut self, node: &Value, pointer: &str, depth: usize) -> u64 {
        let Value::Object(members) = node else { return 1 };
        let key = (pointer.to_owned(), depth);
        if let Some(n) = self.memo.get(&key) {
            return *n;
        }
        if self.open.contains(&key) {
            return 1;
        }
        self.open.push(key.clone());
        let mut total: u64 = 1;
        for (name, value) in members {
            let at = format!("{pointer}/{}", crate::document::rules::escape(name));
            let add = if name == "$ref" {
                self.reference(value.as_str().unwrap_or_default(), depth)
            } else if IN_PLACE.contains(&name.as_str()) {
                self.children(name, value, &at, depth)
            } else if INSIDE.contains(&name.as_str()) {
                if depth == 0 { 0 } else { self.children(name, value, &at, depth - 1) }
            } else {
                0
            };
            total = total.saturating_add(add);
            if total > MAX_EXPANSION {
                break;
            }
        }
        self.open.pop();
        self.memo.insert(key, total);
        total
    }

    /// The subschemas of keyword `name`: one schema, an array of them, or
    /// an object of them (by property name or pattern).
    fn children(&mut self, name: &str, value: &Value, at: &str, depth: usize) -> u64 {
        let by_name = matches!(name, "properties" | "patternProperties" | "dependentSchemas");
        match value {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .fold(0u64, |n, (i, item)| n.saturating_add(self.of(item, &format!("{at}/{i}"), depth))),
            Value::Object(members) if by_name => members.iter().fold(0u64, |n, (k, item)| {
                n.saturating_add(self.of(item, &format!("{at}/{}", crate::document::rules::escape(k)), depth))
            }),
            other => self.of(other, at, depth),
        }
    }

    fn reference(&mut self, target: &str, depth: usize) -> u64 {
        let pointer = match target.strip_prefix('#') {
            Some(p) if p.is_empty() || p.starts_with('/') => p.to_owned(),
            Some(anchor) => match self.anchors.get(anchor) {
                Some(p) => p.clone(),
                None => return 1,
            },
            None => return 1,
        };
        let decoded = percent_encoding::percent_decode_str(&pointer).decode_utf8_lossy().into_owned();
        match self.root.pointer(&decoded) {
            Some(node) => self.of(node, &decoded, depth),
            None => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(schema: Value) -> Invalid {
        compile(&schema).expect_err("refused")
    }

    #[test]
    fn errors_point_at_the_field_a_form_shows_them_beside() {
        let schema = json!({
            "type": "object",
            "required": ["customer"],
            "properties": {"customer": {"type": "string"}, "total": {"type": "number", "minimum": 0}, "lines": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": false
        });
        let compiled = compile(&schema).expect("compiles");
        let (found, more) = compiled.violations(&json!({"total": -1, "lines": ["a", 2], "x/y": 1}));
        assert_eq!(more, 0);
        let at: Vec<(&str, &str)> = found.iter().map(|v| (v.pointer.as_str(), v.keyword.as_str())).collect();
        for expected in
            [("/customer", "required"), ("/total", "minimum"), ("/lines/1", "type"), ("/x~1y", "additionalProperties")]
        {
            assert!(at.contains(&expected), "{expected:?} in {at:?}");
        }
        assert!(compiled.violations(&json!({"customer": "ada", "total": 3})).0.is_empty());
    }

    #[test]
    fn formats_are_checked() {
        let compiled = compile(&json!({"properties": {"mail": {"format": "email"}}})).expect("compiles");
        assert_eq!(compiled.violations(&json!({"mail": "nope"})).0[0].keyword, "format");
        assert!(refused(json!({"format": "emial"})).message.contains("not a valid schema"));
    }

    #[test]
    fn references_stay_within_the_schema() {
        assert_eq!(refused(json!({"$ref": "http://127.0.0.1:9/x.json"})).pointer, "/$ref");
        assert_eq!(refused(json!({"properties": {"a": {"$ref": "other.json#/x"}}})).pointer, "/properties/a/$ref");
        assert!(refused(json!({"$dynamicRef": "#x"})).message.contains("not taken"));
        assert!(refused(json!({"properties": {"a": {"$id": "http://x/"}}})).message.contains("root only"));
        assert!(refused(json!({"$ref": "#/$defs/missing"})).message.contains("not a valid schema"));
        // Recursion through a document's values is fine, and so is a loop.
        let tree = json!({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}});
        let compiled = compile(&tree).expect("a tree");
        assert!(compiled.violations(&json!({"children": [{"children": []}]})).0.is_empty());
        assert_eq!(compiled.violations(&json!({"children": [{"children": 3}]})).0[0].pointer, "/children/0/children");
        compile(&json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})).expect("a loop checks nothing");
    }

    #[test]
    fn a_schema_that_doubles_at_each_level_is_refused_however_small() {
        // Each level checks the next twice: 2^30 checks of one value.
        let mut defs = Map::new();
        for i in 0..30 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(format!("d{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next, "minimum": 1}]}));
        }
        defs.insert("d30".into(), json!({"type": "integer"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(refused(schema).message.contains("subschemas"));
        // And through a document's values: two branches per level.
        let both =
            json!({"anyOf": [{"properties": {"a": {"$ref": "#"}}}, {"properties": {"a": {"$ref": "#"}, "b": true}}]});
        assert!(refused(both).message.contains("subschemas"));
    }

    #[test]
    fn bounds_are_kept() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"properties": {"a": deep}});
        }
        assert!(refused(deep).message.contains("nests at most"));
        let many: Map<String, Value> = (0..2_100).map(|i| (format!("p{i}"), json!(true))).collect();
        assert!(refused(json!({"properties": many})).message.contains("members"));
        let big = "x".repeat(MAX_BYTES);
        assert!(refused(json!({"description": big})).message.contains("bytes"));
        assert_eq!(refused(json!({"uniqueItems": true})).pointer, "/uniqueItems");
        compile(&json!({"uniqueItems": true, "maxItems": 100})).expect("bounded uniqueItems");
        assert_eq!(refused(json!({"$schema": "http://json-schema.org/draft-07/schema#"})).pointer, "/$schema");
        compile(&json!({"$schema": DRAFT})).expect("2020-12");
        assert!(refused(json!([])).message.contains("JSON object"));
    }

    #[test]
    fn patterns_run_in_linear_time() {
        // Backtracking would take ages on this; the linear engine refuses
        // what it cannot run (look-around) and runs the rest in time.
        assert!(refused(json!({"pattern": "(?=a)"})).message.contains("not a valid schema"));
        let compiled = compile(&json!({"properties": {"s": {"pattern": "^(a+)+$"}}})).expect("compiles");
        let hostile = format!("{}!", "a".repeat(50_000));
        let started = std::time::Instant::now();
        assert_eq!(compiled.violations(&json!({"s": hostile})).0[0].keyword, "pattern");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }
}
