//! `txgate rules test FILE` (docs/guides/rules.md, "Testing rules"): a
//! declarative suite run against a collection's rules in memory, with the
//! evaluator the gateway uses ([`super::eval`]) and the planner its
//! queries use: principals as claim sets, fixture documents, requests,
//! and what each must answer. No server, no store.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::eval::{Denied, Judged, Principal, PrincipalIn};
use super::model::{Action, GrantSpec};
use super::stored::RuleSet;
use crate::document::rules::user_data;
use crate::query::filter::Filter;
use crate::query::plan::{Declared, Planning};
use crate::store::Document;
use crate::store::convert::document_to_object;

/// Cases one suite holds at most.
const MAX_CASES: usize = 10_000;
/// Documents one suite holds at most.
const MAX_DOCUMENTS: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Suite {
    collection: String,
    rules: RulesIn,
    /// The indexes declared (ready), each as `PUT` takes its fields: a
    /// list or count no index serves answers `index_required`.
    #[serde(default)]
    indexes: Option<Vec<Vec<String>>>,
    principals: BTreeMap<String, PrincipalIn>,
    #[serde(default)]
    documents: Vec<Map<String, Value>>,
    /// The time `when` sees (RFC 3339; default: now).
    #[serde(default)]
    now: Option<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesIn {
    grants: Vec<GrantSpec>,
}

/// What a case asks.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "snake_case")]
enum Request {
    Read,
    List,
    Count,
    Create,
    Update,
    Delete,
    Stream,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[serde(default)]
    name: Option<String>,
    /// The principal's name in `principals`.
    #[serde(rename = "as")]
    who: String,
    request: Request,
    #[serde(default)]
    id: Option<String>,
    /// A create's document, or a replace's.
    #[serde(default)]
    document: Option<Map<String, Value>>,
    /// A patch's `set` (top-level fields).
    #[serde(default)]
    set: Option<Map<String, Value>>,
    /// A list's or count's filter.
    #[serde(default)]
    filter: Option<Value>,
    /// A stream case: the document before and after a change (`null`:
    /// absent, as before a create or after a delete).
    #[serde(default)]
    before: Option<Value>,
    #[serde(default)]
    after: Option<Value>,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// `allow`, `deny` (403), `not_found` (404), `index_required`; for a
    /// stream case, `sent`, `left` or `none`.
    outcome: String,
    #[serde(default)]
    grant: Option<String>,
    #[serde(default)]
    pointer: Option<String>,
    /// The fields a read, or a sent event, shows.
    #[serde(default)]
    fields: Option<BTreeSet<String>>,
    /// The ids a list answers, in id order.
    #[serde(default)]
    ids: Option<Vec<String>>,
    #[serde(default)]
    count: Option<u64>,
}

/// What running a suite found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One line per case: `ok <name>` or `FAIL <name>: …`.
    pub lines: Vec<String>,
    pub failed: usize,
}

/// What one case answered.
#[derive(Debug, Default, PartialEq)]
struct Got {
    outcome: String,
    grant: Option<String>,
    pointer: Option<String>,
    fields: Option<BTreeSet<String>>,
    ids: Option<Vec<String>>,
    count: Option<u64>,
}

impl Got {
    fn of(outcome: &str) -> Self {
        Got { outcome: outcome.to_owned(), ..Default::default() }
    }
}

/// Run the suite in `text` (JSON). `Err`: the suite itself is not valid.
pub fn run(text: &str) -> Result<Outcome, String> {
    let suite: Suite = serde_json::from_str(text).map_err(|e| format!("the suite is not valid: {e}"))?;
    if suite.cases.len() > MAX_CASES || suite.documents.len() > MAX_DOCUMENTS {
        return Err(format!("a suite holds at most {MAX_CASES} cases and {MAX_DOCUMENTS} documents"));
    }
    let rules = RuleSet::checked(&suite.collection, 1, suite.rules.grants)
        .map_err(|e| format!("rules{}: {}", e.pointer, e.message))?;
    let mut documents: Vec<(String, Document)> = Vec::new();
    for (i, doc) in suite.documents.iter().enumerate() {
        let mut doc = doc.clone();
        let id = match doc.shift_remove("_id") {
            Some(Value::String(id)) => id,
            _ => return Err(format!("documents/{i}: each document has a string _id")),
        };
        let data = user_data(&doc, &format!("/documents/{i}")).map_err(|e| e.to_string())?;
        documents.push((id, data));
    }
    documents.sort_by(|a, b| a.0.cmp(&b.0));
    let now = suite.now.clone().unwrap_or_else(|| super::now_string(crate::store::DateTime::now()));
    let indexes: Option<Vec<Declared>> = suite.indexes.as_ref().map(|list| {
        list.iter()
            .enumerate()
            .map(|(i, fields)| Declared { name: format!("index-{i}"), fields: fields.clone() })
            .collect()
    });
    let mut out = Outcome::default();
    for (i, case) in suite.cases.iter().enumerate() {
        let name = case.name.clone().unwrap_or_else(|| format!("case {i}"));
        let Some(who) = suite.principals.get(&case.who) else {
            return Err(format!("cases/{i}: no principal {:?}", case.who));
        };
        let who = who.principal().map_err(|e| format!("principals/{}: {e}", case.who))?;
        let judged = Judged::of(Some(&rules), &who, &now);
        let got = answer(case, &who, &judged, &documents, indexes.as_deref()).map_err(|e| format!("cases/{i}: {e}"))?;
        match differs(&case.expect, &got) {
            None => out.lines.push(format!("ok   {name}")),
            Some(why) => {
                out.failed += 1;
                out.lines.push(format!("FAIL {name}: {why}"));
            }
        }
    }
    Ok(out)
}

fn data_of(value: &Value, at: &str) -> Result<Option<Document>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => {
            let mut map = map.clone();
            map.shift_remove("_id");
            user_data(&map, at).map(Some).map_err(|e| e.to_string())
        }
        _ => Err(format!("{at} is a document or null")),
    }
}

fn denied(d: Denied) -> Got {
    match d {
        Denied::Hidden => Got::of("not_found"),
        Denied::Forbidden { pointer, .. } => Got { pointer, ..Got::of("deny") },
    }
}

fn answer(
    case: &Case,
    who: &Principal,
    judged: &Judged,
    documents: &[(String, Document)],
    indexes: Option<&[Declared]>,
) -> Result<Got, String> {
    let fixture = |id: &Option<String>| -> Result<Option<&Document>, String> {
        let id = id.as_deref().ok_or("this request names a document: give its id")?;
        Ok(documents.iter().find(|(d, _)| d == id).map(|(_, data)| data))
    };
    let Judged::Ruled(judge) = judged else {
        // Not judged by the rules: its scopes decide, as the gateway's.
        return Ok(Got::of("allow"));
    };
    Ok(match case.request {
        Request::Read => match fixture(&case.id)?.and_then(|d| judge.sees(Action::Read, d).map(|s| (d, s))) {
            None => Got::of("not_found"),
            Some((data, seen)) => {
                let mut shown = data.clone();
                super::eval::project(&mut shown, seen.fields.as_ref());
                Got { grant: Some(seen.grant), fields: Some(shown.keys().cloned().collect()), ..Got::of("allow") }
            }
        },
        Request::Create => {
            let doc = case.document.clone().ok_or("a create gives its document")?;
            let mut doc = doc;
            let id_given = doc.shift_remove("_id").is_some();
            let data = user_data(&doc, "/document").map_err(|e| e.to_string())?;
            match judge.create(who, &data, id_given) {
                Ok((made, grant)) => {
                    Got { grant: Some(grant), fields: Some(made.keys().cloned().collect()), ..Got::of("allow") }
                }
                Err(d) => denied(d),
            }
        }
        Request::Update => {
            let Some(before) = fixture(&case.id)? else { return Ok(Got::of("not_found")) };
            let mut after = match (&case.document, &case.set) {
                (Some(doc), None) => data_of(&Value::Object(doc.clone()), "/document")?.unwrap_or_default(),
                (None, Some(set)) => {
                    let mut after = before.clone();
                    let set = user_data(set, "/set").map_err(|e| e.to_string())?;
                    after.extend(set);
                    after
                }
                _ => return Err("an update gives a document (replace) or set (patch)".into()),
            };
            if judge.sees(Action::Read, before).is_none() {
                return Ok(Got::of("not_found"));
            }
            judge.keep_set(before, &mut after);
            match judge.update(before, &after) {
                Ok(grant) => Got { grant: Some(grant), ..Got::of("allow") },
                Err(d) => denied(d),
            }
        }
        Request::Delete => match fixture(&case.id)? {
            None => Got::of("not_found"),
            Some(before) => match judge.delete(before) {
                Ok(grant) => Got { grant: Some(grant), ..Got::of("allow") },
                Err(d) => denied(d),
            },
        },
        Request::List | Request::Count => {
            let action = if case.request == Request::List { Action::Read } else { Action::Count };
            let filter = match &case.filter {
                None => Filter::default(),
                Some(f) => Filter::parse(f).map_err(|e| format!("filter{}: {}", e.pointer, e.message))?,
            };
            let parts: Vec<_> = judge.allowing(action).collect();
            if parts.is_empty() {
                return Ok(Got::of("deny"));
            }
            if let Some(ready) = indexes {
                for part in &parts {
                    let both = filter.and(&part.filter);
                    let planning = if action == Action::Read {
                        Planning::Page { filter: &both, sort: &[] }
                    } else {
                        Planning::Count { filter: &both }
                    };
                    if !both.paths.is_empty() && planning.over(ready).is_err() {
                        return Ok(Got { grant: Some(part.grant.name.clone()), ..Got::of("index_required") });
                    }
                }
            }
            let ids: Vec<String> = documents
                .iter()
                .filter(|(_, d)| filter.matches(d) && parts.iter().any(|p| p.matches(d)))
                .map(|(id, _)| id.clone())
                .collect();
            if action == Action::Read {
                Got { ids: Some(ids), ..Got::of("allow") }
            } else {
                Got { count: Some(ids.len() as u64), ..Got::of("allow") }
            }
        }
        Request::Stream => {
            let before = data_of(case.before.as_ref().unwrap_or(&Value::Null), "/before")?;
            let after = data_of(case.after.as_ref().unwrap_or(&Value::Null), "/after")?;
            let was = before.as_ref().is_some_and(|d| judge.sees(Action::Stream, d).is_some());
            match after.as_ref().and_then(|d| judge.sees(Action::Stream, d).map(|s| (d, s))) {
                Some((data, seen)) => {
                    let mut shown = data.clone();
                    super::eval::project(&mut shown, seen.fields.as_ref());
                    let fields = document_to_object(&shown).keys().cloned().collect();
                    Got { grant: Some(seen.grant), fields: Some(fields), ..Got::of("sent") }
                }
                None if was => Got::of("left"),
                None => Got::of("none"),
            }
        }
    })
}

/// Why `got` is not what `expect` says (`None`: it is).
fn differs(expect: &Expect, got: &Got) -> Option<String> {
    if expect.outcome != got.outcome {
        return Some(format!("expected {}, got {}", expect.outcome, got.outcome));
    }
    if let Some(g) = &expect.grant
        && got.grant.as_ref() != Some(g)
    {
        return Some(format!("expected grant {g}, got {:?}", got.grant));
    }
    if let Some(p) = &expect.pointer
        && got.pointer.as_ref() != Some(p)
    {
        return Some(format!("expected the field {p}, got {:?}", got.pointer));
    }
    if let Some(f) = &expect.fields
        && got.fields.as_ref() != Some(f)
    {
        return Some(format!("expected the fields {f:?}, got {:?}", got.fields));
    }
    if let Some(ids) = &expect.ids
        && got.ids.as_ref() != Some(ids)
    {
        return Some(format!("expected the ids {ids:?}, got {:?}", got.ids));
    }
    if let Some(n) = expect.count
        && got.count != Some(n)
    {
        return Some(format!("expected the count {n}, got {:?}", got.count));
    }
    None
}
