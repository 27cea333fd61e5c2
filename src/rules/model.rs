//! A collection's rules as an admin writes them (`PUT
//! /v1/collections/{c}/rules`), checked once when they are set: each
//! grant's principals, its `when` over the caller, its `match` over the
//! document with `$auth` placeholders, its actions, fields and `set`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::document::rules::{Invalid, escape};
use crate::query::filter::{Cond, Filter};

/// Grants one collection's rules hold at most.
pub(crate) const MAX_GRANTS: usize = 32;
/// Roles, keys or fields one grant lists at most.
const MAX_LISTED: usize = 64;
/// The longest grant name, role, key name or placeholder.
const MAX_NAME: usize = 128;

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Action {
    /// By-id reads, batch reads and pages of queries.
    Read,
    /// Counts.
    Count,
    /// Change events: streams, pages of events and subscriptions.
    Stream,
    Create,
    /// Replace and patch.
    Update,
    Delete,
}

impl Action {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Count => "count",
            Action::Stream => "stream",
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }
}

/// The top-level fields a grant lets its principals read and write
/// (absent: all of them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FieldsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<Vec<String>>,
}

/// One grant, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "name": "own", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
    "actions": ["read", "count", "stream", "create", "update"], "set": {"owner": "sub"}
}))]
pub(crate) struct GrantSpec {
    /// The grant's name, unique in the collection's rules:
    /// `^[a-zA-Z][a-zA-Z0-9_-]{0,63}$`.
    #[schema(pattern = "^[a-zA-Z][a-zA-Z0-9_-]{0,63}$")]
    pub name: String,
    /// The users' roles it applies to (`*`: every user).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// The API keys, by name, it applies to: a key a grant names is
    /// under the collection's rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// Whether it applies to anonymous callers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anonymous: bool,
    /// A filter over the caller (`sub`, `iss`, `key`, `claims.<path>`,
    /// `now` as an RFC 3339 string): the grant applies only when it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::HashMap<String, Value>>)]
    pub when: Option<Value>,
    /// A filter over the document, with `{"$auth": "<placeholder>"}` in
    /// place of values taken from the caller.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::HashMap<String, Value>>)]
    pub matches: Option<Value>,
    #[schema(min_items = 1)]
    pub actions: Vec<Action>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<FieldsSpec>,
    /// Fields the gateway sets on create from the caller (field →
    /// placeholder), which the caller may not write.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Whether a create may choose its `_id` (otherwise the gateway
    /// assigns it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub choose_id: bool,
}

/// Where a placeholder's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A user's `sub`.
    Sub,
    /// A user's `iss`.
    Iss,
    /// An API key's name.
    Key,
    /// A claim of the user's token, by dotted path.
    Claim(String),
}

impl Source {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "sub" => Some(Source::Sub),
            "iss" => Some(Source::Iss),
            "key" => Some(Source::Key),
            _ => {
                let path = s.strip_prefix("claims.")?;
                let ok = !path.is_empty()
                    && path.len() <= MAX_NAME
                    && path.split('.').all(|p| !p.is_empty() && !p.starts_with('$'));
                ok.then(|| Source::Claim(path.to_owned()))
            }
        }
    }
}

/// A grant, checked.
#[derive(Debug)]
pub(crate) struct Grant {
    pub name: String,
    pub roles: BTreeSet<String>,
    pub keys: BTreeSet<String>,
    pub anonymous: bool,
    pub when: Option<Filter>,
    /// The `match` as written (placeholders in it); `None`: every document.
    pub template: Option<Value>,
    /// The top-level fields its `match` names: what a change event keeps
    /// of the document before it (docs/guides/rules.md, "Streams").
    pub named: BTreeSet<String>,
    pub actions: BTreeSet<Action>,
    pub read: Option<BTreeSet<String>>,
    pub write: Option<BTreeSet<String>>,
    pub set: Vec<(String, Source)>,
    pub choose_id: bool,
}

impl Grant {
    pub(crate) fn allows(&self, action: Action) -> bool {
        self.actions.contains(&action)
    }

    /// Whether the caller may write top-level field `field` through it.
    pub(crate) fn writes(&self, field: &str) -> bool {
        self.write.as_ref().is_none_or(|w| w.contains(field)) && !self.set.iter().any(|(f, _)| f == field)
    }
}

fn named(name: &str) -> bool {
    crate::document::rules::is_collection_name(name)
}

/// Check `specs`, each at `/grants/<i>`.
pub(crate) fn check(specs: &[GrantSpec]) -> Result<Vec<Grant>, Invalid> {
    if specs.len() > MAX_GRANTS {
        return Err(Invalid::new("/grants", format!("rules hold at most {MAX_GRANTS} grants")));
    }
    let mut names = BTreeSet::new();
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let at = format!("/grants/{i}");
            if !names.insert(spec.name.as_str()) {
                return Err(Invalid::new(format!("{at}/name"), format!("grant {:?} is named twice", spec.name)));
            }
            grant(spec, &at)
        })
        .collect()
}

fn listed(items: &[String], at: &str, what: &str) -> Result<BTreeSet<String>, Invalid> {
    if items.len() > MAX_LISTED {
        return Err(Invalid::new(at, format!("a grant lists at most {MAX_LISTED} {what}")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if s.is_empty() || s.len() > MAX_NAME || s.chars().any(char::is_control) {
                Err(Invalid::new(format!("{at}/{i}"), format!("{what} are 1 to {MAX_NAME} printable characters")))
            } else {
                Ok(s.clone())
            }
        })
        .collect()
}

fn top_fields(items: &[String], at: &str) -> Result<BTreeSet<String>, Invalid> {
    let set = listed(items, at, "fields")?;
    if let Some((i, f)) = items.iter().enumerate().find(|(_, f)| f.contains('.') || f.starts_with('$') || *f == "_id") {
        return Err(Invalid::new(
            format!("{at}/{i}"),
            format!("{f:?} is not a top-level data field: fields are named at the top level, never _id"),
        ));
    }
    Ok(set)
}

fn grant(spec: &GrantSpec, at: &str) -> Result<Grant, Invalid> {
    if !named(&spec.name) {
        return Err(Invalid::new(
            format!("{at}/name"),
            "a grant's name must match ^[a-zA-Z][a-zA-Z0-9_-]{0,63}$".to_owned(),
        ));
    }
    let roles = listed(&spec.roles, &format!("{at}/roles"), "roles")?;
    let keys = listed(&spec.keys, &format!("{at}/keys"), "keys")?;
    if roles.is_empty() && keys.is_empty() && !spec.anonymous {
        return Err(Invalid::new(at, "a grant applies to some roles, keys or anonymous callers; this one to none"));
    }
    if spec.actions.is_empty() {
        return Err(Invalid::new(format!("{at}/actions"), "a grant allows at least one action"));
    }
    let when = match &spec.when {
        None => None,
        Some(when) => Some(
            Filter::parse(when)
                .map_err(|e| Invalid::new(format!("{at}/when{}", e.pointer), e.message))
                .and_then(|f| no_exists(&f, &format!("{at}/when")).map(|()| f))?,
        ),
    };
    let mut named = BTreeSet::new();
    if let Some(template) = &spec.matches {
        // The filter with each placeholder given a value of its kind: it
        // must parse as every caller's will, and be one an index serves.
        let sample = sampled(template, &format!("{at}/match"), false)?;
        let filter = Filter::parse(&sample).map_err(|e| Invalid::new(format!("{at}/match{}", e.pointer), e.message))?;
        no_exists(&filter, &format!("{at}/match"))?;
        let ranges = filter.paths.iter().filter(|(_, c)| !matches!(c.as_slice(), [Cond::Eq(_)])).count();
        if ranges > 1 {
            return Err(Invalid::new(
                format!("{at}/match"),
                "a grant's match has conditions other than equality on one path at most: an index serves such a \
                 condition on one path only",
            ));
        }
        named = filter.paths.keys().map(|p| p.split('.').next().unwrap_or(p).to_owned()).collect();
    }
    let fields = spec.fields.clone().unwrap_or_default();
    let read = fields.read.as_deref().map(|r| top_fields(r, &format!("{at}/fields/read"))).transpose()?;
    let write = fields.write.as_deref().map(|w| top_fields(w, &format!("{at}/fields/write"))).transpose()?;
    if spec.set.len() > MAX_LISTED {
        return Err(Invalid::new(format!("{at}/set"), format!("a grant sets at most {MAX_LISTED} fields")));
    }
    let mut set = Vec::new();
    for (field, from) in &spec.set {
        let here = format!("{at}/set/{}", escape(field));
        top_fields(std::slice::from_ref(field), &here)?;
        let source = Source::parse(from).ok_or_else(|| {
            Invalid::new(&here, format!("{from:?} is not a placeholder: sub, iss, key or claims.<path>"))
        })?;
        set.push((field.clone(), source));
    }
    Ok(Grant {
        name: spec.name.clone(),
        roles,
        keys,
        anonymous: spec.anonymous,
        when,
        template: spec.matches.clone(),
        named,
        actions: spec.actions.iter().copied().collect(),
        read,
        write,
        set,
        choose_id: spec.choose_id,
    })
}

fn no_exists(filter: &Filter, at: &str) -> Result<(), Invalid> {
    match filter.exists_paths().first() {
        Some(path) => Err(Invalid::new(
            at,
            format!("$exists on {path:?}: a rule's filters are served by indexes, and no index serves $exists"),
        )),
        None => Ok(()),
    }
}

/// Whether `value` is a placeholder: `{"$auth": "<source>"}`.
pub(crate) fn placeholder(value: &Value) -> Option<&str> {
    match value {
        Value::Object(map) if map.len() == 1 => map.get("$auth").and_then(Value::as_str),
        _ => None,
    }
}

/// `template` with each placeholder as a sample value (a list where a
/// list goes): checks the placeholders on the way.
fn sampled(template: &Value, at: &str, list: bool) -> Result<Value, Invalid> {
    if let Some(source) = placeholder(template) {
        if Source::parse(source).is_none() {
            return Err(Invalid::new(
                format!("{at}/$auth"),
                format!("{source:?} is not a placeholder: sub, iss, key or claims.<path>"),
            ));
        }
        let sample = Value::String("sample".into());
        return Ok(if list { Value::Array(vec![sample]) } else { sample });
    }
    match template {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let in_list = matches!(k.as_str(), "$in" | "$nin");
                out.insert(k.clone(), sampled(v, &format!("{at}/{}", escape(k)), in_list)?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| sampled(v, &format!("{at}/{i}"), false))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> GrantSpec {
        serde_json::from_value(v).expect("a grant")
    }

    #[test]
    fn grants_are_checked_where_they_are_written() {
        let ok = spec(json!({"name": "own", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
            "actions": ["read"], "set": {"owner": "sub"}}));
        let grants = check(std::slice::from_ref(&ok)).expect("valid");
        assert_eq!(grants[0].set, vec![("owner".to_owned(), Source::Sub)]);
        assert!(!grants[0].writes("owner") && grants[0].writes("total"));

        let err = |v: Value| check(&[spec(v)]).expect_err("refused").pointer;
        assert_eq!(err(json!({"name": "a", "roles": ["r"], "actions": []})), "/grants/0/actions");
        assert_eq!(err(json!({"name": "a", "actions": ["read"]})), "/grants/0");
        assert_eq!(
            err(json!({"name": "a", "roles": ["r"], "actions": ["read"], "match": {"o": {"$auth": "password"}}})),
            "/grants/0/match/o/$auth"
        );
        assert_eq!(
            err(json!({"name": "a", "roles": ["r"], "actions": ["read"], "match": {"o": {"$exists": true}}})),
            "/grants/0/match"
        );
        assert_eq!(
            err(json!({"name": "a", "roles": ["r"], "actions": ["read"], "match": {"a": {"$gt": 1}, "b": {"$lt": 2}}})),
            "/grants/0/match"
        );
        assert_eq!(
            err(json!({"name": "a", "roles": ["r"], "actions": ["read"], "fields": {"read": ["a.b"]}})),
            "/grants/0/fields/read/0"
        );
        assert_eq!(
            err(json!({"name": "a", "roles": ["r"], "actions": ["read"], "set": {"o": "nope"}})),
            "/grants/0/set/o"
        );
        let twice = check(&[ok.clone(), ok]).expect_err("refused");
        assert_eq!(twice.pointer, "/grants/1/name");
        // A list placeholder where a list goes.
        check(&[spec(json!({"name": "team", "roles": ["agent"], "actions": ["read"],
            "match": {"team": {"$in": {"$auth": "claims.teams"}}}}))])
        .expect("a list placeholder");
    }
}
