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
/// The most subschemas a schema may apply to a document's values, level
/// by level, `$ref`s followed (see [`levels`]).
pub(crate) const MAX_EXPANSION: u64 = 100_000;
/// The most subschema checks one document may cost (its values at each
/// depth times the subschemas that may apply there): a document that
/// would cost more is refused unchecked (see [`Compiled::cost`]).
pub const MAX_CHECK_COST: u64 = 2_000_000;
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
    /// How many subschemas may apply to a value at each depth.
    pub levels: Vec<u64>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("levels", &self.levels).finish_non_exhaustive()
    }
}

/// `schema` checked against the bounds and compiled; `Invalid` points into
/// the schema (the request body).
pub fn compile(schema: &Value) -> Result<Compiled, Invalid> {
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
    let levels = levels(schema, &walk.anchors)?;
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
    Ok(Compiled { validator, levels })
}

impl Compiled {
    /// A bound on the subschema checks of `data`: its values at each depth
    /// times the subschemas that may apply there.
    pub fn cost(&self, data: &Value) -> u64 {
        let mut values = Vec::new();
        values_by_depth(data, 0, &mut values);
        values.iter().zip(&self.levels).fold(0u64, |sum, (n, k)| sum.saturating_add(n.saturating_mul(*k)))
    }

    /// Every way `data` fails the schema (at most [`MAX_ERRORS`], and how
    /// many more), each pointing at the field to blame.
    pub fn violations(&self, data: &Value) -> (Vec<Violation>, usize) {
        let cost = self.cost(data);
        if cost > MAX_CHECK_COST {
            let detail = format!(
                "checking this document could take {cost} subschema checks (its values at each depth times the \
                 subschemas that may apply there), over the limit of {MAX_CHECK_COST}: send a smaller document, or \
                 declare a simpler schema"
            );
            return (vec![Violation { pointer: String::new(), keyword: "cost".into(), detail }], 0);
        }
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
const IN_PLACE: &[&str] = &["allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas"];
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

/// How many subschemas may apply to the values at each depth of a
/// document (`[k]`: at depth `k`, the document itself at 0), every `$ref`
/// followed: level by level, each subschema that applies at one depth
/// brings its in-place subschemas (`allOf`, `$ref`, …) at that depth and
/// its subschemas of values inside (`properties`, `items`, …) at the
/// next. A bound on the work of a check: a value at depth `k` is checked
/// against at most `[k]` subschemas. Refused past [`MAX_EXPANSION`] in all.
fn levels(schema: &Value, anchors: &HashMap<String, String>) -> Result<Vec<u64>, Invalid> {
    let mut graph = Graph { root: schema, anchors, closures: HashMap::new(), open: Vec::new() };
    let mut out = Vec::new();
    let mut level: HashMap<String, u64> = HashMap::from([(String::new(), 1)]);
    let mut total: u64 = 0;
    while !level.is_empty() && out.len() <= MAX_DATA_DEPTH {
        let (mut here, mut next) = (0u64, HashMap::new());
        for (pointer, times) in level {
            let (size, inside) = graph.closure(&pointer);
            here = here.saturating_add(size.saturating_mul(times));
            for (child, n) in inside.iter() {
                let slot: &mut u64 = next.entry(child.clone()).or_default();
                *slot = slot.saturating_add(n.saturating_mul(times));
            }
        }
        total = total.saturating_add(here);
        if total > MAX_EXPANSION {
            return Err(Invalid::new(
                "",
                format!(
                    "the schema could apply more than {MAX_EXPANSION} subschemas to a document's values, every $ref \
                     followed: share fewer references under anyOf/oneOf/allOf, or nest them less"
                ),
            ));
        }
        out.push(here);
        level = next;
    }
    Ok(out)
}

/// In-place closure of a subschema: how many subschemas apply with it to
/// one value, and the subschemas (by pointer, with how often) they apply
/// to the values inside.
type Closure = (u64, std::rc::Rc<Vec<(String, u64)>>);

struct Graph<'a> {
    root: &'a Value,
    anchors: &'a HashMap<String, String>,
    closures: HashMap<String, Closure>,
    /// The subschemas being closed over (a `$ref` back to one of them
    /// adds nothing: the validator stops such a loop).
    open: Vec<String>,
}

impl Graph<'_> {
    fn closure(&mut self, pointer: &str) -> Closure {
        if let Some(c) = self.closures.get(pointer) {
            return c.clone();
        }
        if self.open.iter().any(|p| p == pointer) {
            return (0, std::rc::Rc::default());
        }
        let Some(Value::Object(members)) = self.root.pointer(pointer) else {
            return (1, std::rc::Rc::default());
        };
        self.open.push(pointer.to_owned());
        let mut size: u64 = 1;
        let mut inside: Vec<(String, u64)> = Vec::new();
        for (name, value) in members {
            let at = format!("{pointer}/{}", crate::document::rules::escape(name));
            let mut close = |graph: &mut Self, target: String| {
                let (n, below) = graph.closure(&target);
                size = size.saturating_add(n);
                inside.extend(below.iter().cloned());
            };
            if name == "$ref" {
                if let Some(target) = self.target(value.as_str().unwrap_or_default()) {
                    close(self, target);
                }
            } else if IN_PLACE.contains(&name.as_str()) {
                for child in children(name, value, &at) {
                    close(self, child);
                }
            } else if INSIDE.contains(&name.as_str()) {
                inside.extend(children(name, value, &at).into_iter().map(|c| (c, 1)));
            }
            if size > MAX_EXPANSION {
                break;
            }
        }
        self.open.pop();
        // Merged by pointer, so that what grows level by level is counts.
        let mut merged: HashMap<String, u64> = HashMap::new();
        for (p, n) in inside {
            let slot = merged.entry(p).or_default();
            *slot = slot.saturating_add(n);
        }
        let closure: Closure = (size, std::rc::Rc::new(merged.into_iter().collect()));
        self.closures.insert(pointer.to_owned(), closure.clone());
        closure
    }

    /// The pointer a local `$ref` names.
    fn target(&self, target: &str) -> Option<String> {
        let pointer = match target.strip_prefix('#')? {
            p if p.is_empty() || p.starts_with('/') => p.to_owned(),
            anchor => self.anchors.get(anchor)?.clone(),
        };
        Some(percent_encoding::percent_decode_str(&pointer).decode_utf8_lossy().into_owned())
    }
}

/// The subschemas of keyword `name` at `at`: one schema, an array of them,
/// or an object of them (by property name or pattern).
fn children(name: &str, value: &Value, at: &str) -> Vec<String> {
    let by_name = matches!(name, "properties" | "patternProperties" | "dependentSchemas");
    match value {
        Value::Array(items) => (0..items.len()).map(|i| format!("{at}/{i}")).collect(),
        Value::Object(members) if by_name => {
            members.keys().map(|k| format!("{at}/{}", crate::document::rules::escape(k))).collect()
        }
        _ => vec![at.to_owned()],
    }
}

/// The values of `data` at each depth (the document itself at 0).
fn values_by_depth(data: &Value, depth: usize, out: &mut Vec<u64>) {
    if out.len() <= depth {
        out.resize(depth + 1, 0);
    }
    out[depth] += 1;
    match data {
        Value::Array(items) => items.iter().for_each(|v| values_by_depth(v, depth + 1, out)),
        Value::Object(members) => members.values().for_each(|v| values_by_depth(v, depth + 1, out)),
        _ => {}
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
    fn a_document_costing_too_much_to_check_is_refused_unchecked() {
        // About 2^16 subschemas per item: accepted, and each item costs that much.
        let mut defs = Map::new();
        for i in 0..14 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(format!("d{i}"), json!({"allOf": [{"$ref": next}, {"$ref": next}]}));
        }
        defs.insert("d14".into(), json!({"type": "integer"}));
        let schema = json!({"$defs": defs, "type": "array", "items": {"$ref": "#/$defs/d0"}});
        let compiled = compile(&schema).expect("accepted");
        assert!(compiled.levels[1] >= 1 << 15, "{:?}", &compiled.levels[..2]);
        assert!(compiled.violations(&json!([1, 2, 3])).0.is_empty());
        let many = Value::Array((0..1_000).map(|i| json!(i)).collect());
        let (found, _) = compiled.violations(&many);
        assert_eq!((found[0].pointer.as_str(), found[0].keyword.as_str()), ("", "cost"));
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

#[cfg(test)]
mod chains {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_long_chain_of_references_is_compiled_on_a_small_stack() {
        let mut defs = Map::new();
        for i in 0..990 {
            defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert("d990".into(), json!({"type": "integer"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        let handle = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let compiled = compile(&schema);
                compiled.map(|c| c.violations(&json!("x")).0.len())
            })
            .unwrap();
        // The longest chain the member bound allows (two members a link).
        assert_eq!(handle.join().expect("no stack overflow"), Ok(1));
    }

    #[test]
    fn the_deepest_document_is_checked_against_a_recursive_schema_on_a_small_stack() {
        let tree = json!({"type": "object", "properties": {"c": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}});
        let mut doc = json!({"c": 5});
        for _ in 0..MAX_DATA_DEPTH - 1 {
            doc = json!({"c": doc});
        }
        let handle = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || compile(&tree).map(|c| c.violations(&doc).0.len()))
            .unwrap();
        assert_eq!(handle.join().expect("no stack overflow"), Ok(1));
    }
}
