//! Judging a caller and documents by a collection's rules, in memory: the
//! one evaluator the gateway and `txgate rules test` share.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::model::{Action, Grant, Source, placeholder};
use super::stored::RuleSet;
use crate::query::filter::{Filter, Matcher};
use crate::store::convert::json_to_bson;
use crate::store::{Bson, Document};

/// Who asks, as rules see them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Principal {
    pub kind: Kind,
    /// A user's subject.
    pub sub: Option<String>,
    /// A user's issuer.
    pub iss: Option<String>,
    /// An API key's name.
    pub key: Option<String>,
    pub roles: Vec<String>,
    pub claims: Map<String, Value>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No credentials are configured: rules never apply.
    #[default]
    Open,
    Key,
    User,
    Anonymous,
}

impl Principal {
    /// The value `source` takes for this caller, if it has one.
    fn value(&self, source: &Source) -> Option<Value> {
        match source {
            Source::Sub => self.sub.clone().map(Value::String),
            Source::Iss => self.iss.clone().map(Value::String),
            Source::Key => self.key.clone().map(Value::String),
            Source::Claim(path) => {
                let mut parts = path.split('.');
                let first = self.claims.get(parts.next()?)?;
                parts.try_fold(first, |v, p| v.get(p)).cloned()
            }
        }
    }

    /// What `when` filters see: the caller and the time.
    fn context(&self, now: &str) -> Document {
        let mut doc = Document::new();
        let mut put = |k: &str, v: Option<&String>| {
            if let Some(v) = v {
                doc.insert(k, v.clone());
            }
        };
        put("sub", self.sub.as_ref());
        put("iss", self.iss.as_ref());
        put("key", self.key.as_ref());
        doc.insert("now", now);
        if let Bson::Document(claims) = json_to_bson(&Value::Object(self.claims.clone())) {
            doc.insert("claims", claims);
        }
        doc
    }

    /// Whether `grant` names this caller (by role, key or as anonymous).
    fn named_by(&self, grant: &Grant) -> bool {
        match self.kind {
            Kind::Open => false,
            Kind::Key => self.key.as_ref().is_some_and(|k| grant.keys.contains(k)),
            Kind::User => grant.roles.contains("*") || self.roles.iter().any(|r| grant.roles.contains(r)),
            Kind::Anonymous => grant.anonymous,
        }
    }
}

/// Who an access check is about: a user (issuer, subject, roles,
/// claims), an API key by name, or an anonymous caller. Absent: the
/// caller itself.
#[derive(serde::Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrincipalIn {
    #[serde(default)]
    pub sub: Option<String>,
    #[serde(default)]
    pub iss: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub claims: Map<String, Value>,
    #[serde(default)]
    pub anonymous: bool,
}

impl PrincipalIn {
    /// The principal it names; `Err`: why it names none.
    pub(crate) fn principal(&self) -> Result<Principal, &'static str> {
        let kind = match (&self.key, &self.sub, self.anonymous) {
            (Some(_), None, false) => Kind::Key,
            (None, Some(_), false) => Kind::User,
            (None, None, true) => Kind::Anonymous,
            _ => return Err("a principal is a user (sub), a key, or anonymous: one of them"),
        };
        Ok(Principal {
            kind,
            sub: self.sub.clone(),
            iss: self.iss.clone(),
            key: self.key.clone(),
            roles: self.roles.clone(),
            claims: self.claims.clone(),
        })
    }
}

/// A grant that applies to the caller, its `match` resolved for them.
#[derive(Debug)]
pub(crate) struct Applied {
    pub grant: Arc<Grant>,
    /// The resolved `match` (empty: every document).
    pub filter: Filter,
    matcher: Matcher,
}

impl Applied {
    pub(crate) fn matches(&self, data: &Document) -> bool {
        self.matcher.matches(data)
    }

    /// The top-level fields its `match` looks at.
    pub(crate) fn fields(&self) -> impl Iterator<Item = &str> {
        self.matcher.fields()
    }
}

/// Why a grant does not apply to a caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NotApplied {
    pub grant: String,
    pub why: String,
}

/// How a collection's rules see one caller.
#[derive(Debug)]
pub(crate) enum Judged {
    /// No rules, or a caller they leave alone: keys and scopes decide.
    Free,
    Ruled(Judge),
}

/// The grants of a collection's rules that apply to one caller.
#[derive(Debug)]
pub(crate) struct Judge {
    pub collection: String,
    pub version: i64,
    pub applied: Vec<Applied>,
    pub not_applied: Vec<NotApplied>,
}

/// What a caller may see of a document: through which grant (the first
/// that matches), and which fields (`None`: all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub grant: String,
    pub fields: Option<BTreeSet<String>>,
}

/// A write refused by the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// The caller may not read the document: as if there were none.
    Hidden,
    /// Refused: why, and the field (a JSON pointer) when one is to blame.
    Forbidden { detail: String, pointer: Option<String> },
}

impl Judged {
    /// How `rules` (`None`: the collection has none) see `who` at `now`
    /// (RFC 3339).
    pub(crate) fn of(rules: Option<&RuleSet>, who: &Principal, now: &str) -> Judged {
        let Some(rules) = rules else { return Judged::Free };
        let ruled = match who.kind {
            Kind::Open => false,
            Kind::User | Kind::Anonymous => true,
            // A key keeps its scopes unless a grant names it.
            Kind::Key => rules.grants.iter().any(|g| who.named_by(g)),
        };
        if !ruled {
            return Judged::Free;
        }
        let context = who.context(now);
        let mut applied = Vec::new();
        let mut not_applied = Vec::new();
        for grant in &rules.grants {
            match apply(grant, who, &context) {
                Ok(a) => applied.push(a),
                Err(why) => not_applied.push(NotApplied { grant: grant.name.clone(), why }),
            }
        }
        Judged::Ruled(Judge { collection: rules.collection.clone(), version: rules.version, applied, not_applied })
    }
}

fn apply(grant: &Arc<Grant>, who: &Principal, context: &Document) -> Result<Applied, String> {
    if !who.named_by(grant) {
        return Err(match who.kind {
            Kind::Key => "it does not name this key".to_owned(),
            Kind::Anonymous => "it does not apply to anonymous callers".to_owned(),
            _ => "none of the caller's roles is among its roles".to_owned(),
        });
    }
    if let Some(when) = &grant.when
        && !when.matches(context)
    {
        return Err("its when does not hold for the caller".to_owned());
    }
    let filter = match &grant.template {
        None => Filter::default(),
        Some(template) => {
            let value = resolve(template, who, false)?;
            Filter::parse(&value)
                .map_err(|e| format!("its match does not hold a filter for this caller: {}", e.message))?
        }
    };
    let matcher = filter.matcher();
    Ok(Applied { grant: Arc::clone(grant), filter, matcher })
}

/// `template` with each placeholder replaced by the caller's value: a
/// scalar, or a list of scalars where a list goes.
fn resolve(template: &Value, who: &Principal, list: bool) -> Result<Value, String> {
    if let Some(name) = placeholder(template) {
        let source = Source::parse(name).ok_or_else(|| format!("{name:?} is not a placeholder"))?;
        let value = who.value(&source).ok_or_else(|| format!("the caller has no {name}"))?;
        let scalar = |v: &Value| !matches!(v, Value::Array(_) | Value::Object(_));
        let fits = match &value {
            Value::Array(items) => list && items.iter().all(scalar),
            other => !list && scalar(other),
        };
        if !fits {
            let kind = if list { "a list of scalars" } else { "a scalar" };
            return Err(format!("the caller's {name} is not {kind}"));
        }
        return Ok(value);
    }
    match template {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                out.insert(k.clone(), resolve(v, who, matches!(k.as_str(), "$in" | "$nin"))?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items.iter().map(|v| resolve(v, who, false)).collect::<Result<_, _>>().map(Value::Array),
        other => Ok(other.clone()),
    }
}

impl Judge {
    /// The value of `Txgate-Grant` for `grant`.
    pub(crate) fn header(&self, grant: &str) -> String {
        format!("{}/{grant}@{}", self.collection, self.version)
    }

    /// The grants that apply and allow `action`.
    pub(crate) fn allowing(&self, action: Action) -> impl Iterator<Item = &Applied> {
        self.applied.iter().filter(move |a| a.grant.allows(action))
    }

    /// What the caller may see of `data` by `action` (read or stream):
    /// `None`, nothing.
    pub(crate) fn sees(&self, action: Action, data: &Document) -> Option<Seen> {
        let mut seen: Option<Seen> = None;
        for a in self.allowing(action).filter(|a| a.matches(data)) {
            match &mut seen {
                None => seen = Some(Seen { grant: a.grant.name.clone(), fields: a.grant.read.clone() }),
                Some(s) => {
                    s.fields = match (s.fields.take(), &a.grant.read) {
                        (Some(mut mine), Some(more)) => {
                            mine.extend(more.iter().cloned());
                            Some(mine)
                        }
                        _ => None,
                    }
                }
            }
        }
        seen
    }

    /// Why the caller may not `action`, for a 403.
    fn refusal(&self, action: Action, tried: &[(String, String)]) -> Denied {
        let mut why: Vec<String> = tried.iter().map(|(g, w)| format!("grant {g}: {w}")).collect();
        if why.is_empty() {
            why.push(format!("no grant of the caller's allows {}", action.as_str()));
        }
        Denied::Forbidden {
            detail: format!(
                "the rules of collection {:?} (version {}) do not allow this {}: {}",
                self.collection,
                self.version,
                action.as_str(),
                why.join("; ")
            ),
            pointer: None,
        }
    }

    /// A create of `data` (with `id_given` when the caller chose its
    /// `_id`): the data as stored (with the grant's `set`), and the grant.
    pub(crate) fn create(
        &self,
        who: &Principal,
        data: &Document,
        id_given: bool,
    ) -> Result<(Document, String), Denied> {
        let mut tried = Vec::new();
        let mut blamed = None;
        for a in self.allowing(Action::Create) {
            let g = &a.grant;
            if id_given && !g.choose_id {
                tried.push((g.name.clone(), "it does not let the caller choose _id".to_owned()));
                blamed.get_or_insert_with(|| "/_id".to_owned());
                continue;
            }
            if let Some(field) = data.keys().find(|f| !g.writes(f)) {
                tried.push((g.name.clone(), format!("it does not let the caller write {field:?}")));
                blamed.get_or_insert_with(|| format!("/{}", crate::document::rules::escape(field)));
                continue;
            }
            let mut out = data.clone();
            match set_fields(g, who, &mut out) {
                Ok(()) => {}
                Err(why) => {
                    tried.push((g.name.clone(), why));
                    continue;
                }
            }
            if !a.matches(&out) {
                tried.push((g.name.clone(), "the document it would create does not match it".to_owned()));
                continue;
            }
            return Ok((out, g.name.clone()));
        }
        Err(with_pointer(self.refusal(Action::Create, &tried), blamed, tried.len() == 1))
    }

    /// An update from `before` to `after`: the grant that allows it.
    /// `after` keeps the `set` fields of `before` the caller did not send
    /// (see [`keep_set`]).
    pub(crate) fn update(&self, before: &Document, after: &Document) -> Result<String, Denied> {
        if self.sees(Action::Read, before).is_none() {
            return Err(Denied::Hidden);
        }
        let changed = changed_fields(before, after);
        let mut tried = Vec::new();
        let mut blamed = None;
        for a in self.allowing(Action::Update) {
            let g = &a.grant;
            if !a.matches(before) {
                tried.push((g.name.clone(), "the document does not match it".to_owned()));
                continue;
            }
            if let Some(field) = changed.iter().find(|f| !g.writes(f)) {
                tried.push((g.name.clone(), format!("it does not let the caller write {field:?}")));
                blamed.get_or_insert_with(|| format!("/{}", crate::document::rules::escape(field)));
                continue;
            }
            if !a.matches(after) {
                tried.push((g.name.clone(), "the document would no longer match it".to_owned()));
                continue;
            }
            return Ok(g.name.clone());
        }
        Err(with_pointer(self.refusal(Action::Update, &tried), blamed, tried.len() == 1))
    }

    /// A delete of `before`: the grant that allows it.
    pub(crate) fn delete(&self, before: &Document) -> Result<String, Denied> {
        if self.sees(Action::Read, before).is_none() {
            return Err(Denied::Hidden);
        }
        match self.allowing(Action::Delete).find(|a| a.matches(before)) {
            Some(a) => Ok(a.grant.name.clone()),
            None => Err(self.refusal(Action::Delete, &[])),
        }
    }

    /// `after` (a replace's) with the fields of `before` the caller may not
    /// read: a replace never drops what its caller cannot see.
    pub(crate) fn keep_hidden(&self, before: &Document, after: &mut Document) {
        let Some(Seen { fields: Some(readable), .. }) = self.sees(Action::Read, before) else { return };
        for (k, v) in before {
            if !readable.contains(k) && !after.contains_key(k) {
                after.insert(k.clone(), v.clone());
            }
        }
    }

    /// `after` with the `set` fields (of every grant) that `before` holds
    /// and the caller left out: a replace never drops what the gateway set.
    pub(crate) fn keep_set(&self, before: &Document, after: &mut Document) {
        for a in &self.applied {
            for (field, _) in &a.grant.set {
                if !after.contains_key(field)
                    && let Some(v) = before.get(field)
                {
                    after.insert(field.clone(), v.clone());
                }
            }
        }
    }
}

fn with_pointer(denied: Denied, blamed: Option<String>, only: bool) -> Denied {
    match denied {
        Denied::Forbidden { detail, .. } if only => Denied::Forbidden { detail, pointer: blamed },
        other => other,
    }
}

/// Set `grant`'s `set` fields of `data` from the caller.
fn set_fields(grant: &Grant, who: &Principal, data: &mut Document) -> Result<(), String> {
    for (field, source) in &grant.set {
        let value =
            who.value(source).ok_or_else(|| format!("the caller has no value for the field {field:?} it sets"))?;
        data.insert(field.clone(), json_to_bson(&value));
    }
    Ok(())
}

/// The top-level fields whose values differ between `before` and `after`.
pub(crate) fn changed_fields(before: &Document, after: &Document) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (k, v) in after {
        if before.get(k) != Some(v) {
            out.insert(k.clone());
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            out.insert(k.clone());
        }
    }
    out
}

/// `data` with only `fields` (`None`: all of it).
pub(crate) fn project(data: &mut Document, fields: Option<&BTreeSet<String>>) {
    if let Some(fields) = fields {
        let drop: Vec<String> = data.keys().filter(|k| !fields.contains(*k)).cloned().collect();
        for k in drop {
            data.remove(&k);
        }
    }
}
