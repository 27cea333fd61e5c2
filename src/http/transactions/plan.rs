//! A transaction request checked and resolved into a [`Plan`]: every
//! bound and rule is checked here, before anything is written.

use std::collections::HashSet;

use axum::http::HeaderValue;

use super::wire::{
    ActionIn, CheckAction, DeleteAction, HookIn, HookMethod, InsertAction, ReplaceAction, TransactionIn, UpdateAction,
};
use crate::actor::Actor;
use crate::document::rules::{self, Invalid, Patch};
use crate::hooks::guard::HookGuard;
use crate::http::error::{ApiError, ProblemCode};
use crate::txn::TxnConfig;
use crate::txn::plan::{Action, ActionOp, Plan};

fn validate_hook(hook: &HookIn, i: usize, guard: &HookGuard) -> Result<(), ApiError> {
    let p = format!("/hooks/{i}");
    if HookMethod::parse(&hook.method).is_none() {
        return Err(Invalid::new(format!("{p}/method"), "method must be POST, PUT, PATCH, DELETE or GET").into());
    }
    guard.destination(&hook.url, &format!("{p}/url"))?;
    for (name, value) in &hook.headers {
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() || HeaderValue::from_str(value).is_err() {
            return Err(Invalid::new(format!("{p}/headers/{name}"), "not a valid HTTP header").into());
        }
        if let Some(why) = crate::hooks::send::refused_header(name) {
            return Err(Invalid::new(format!("{p}/headers/{name}"), why).into());
        }
    }
    if let Some(body) = &hook.body {
        rules::check_body_depth(body, &format!("{p}/body"))?;
    }
    Ok(())
}

/// Check the request and resolve it into a plan.
pub(super) fn plan(
    input: TransactionIn,
    actor: &Actor,
    request: String,
    key: Option<String>,
    cfg: &TxnConfig,
    guard: &HookGuard,
) -> Result<Plan, ApiError> {
    if input.actions.is_empty() || input.actions.len() > cfg.max_actions {
        return Err(Invalid::new("/actions", format!("a transaction has 1..{} actions", cfg.max_actions)).into());
    }
    if input.hooks.len() > cfg.max_hooks {
        return Err(Invalid::new("/hooks", format!("a transaction has at most {} hooks", cfg.max_hooks)).into());
    }
    for (i, hook) in input.hooks.iter().enumerate() {
        validate_hook(hook, i, guard)?;
    }
    let schema_version = match input.schema_version {
        Some(v) if v < 1 => return Err(Invalid::new("/schema_version", "schema_version must be at least 1").into()),
        v => v.unwrap_or(1),
    };
    let mut seen = HashSet::new();
    let mut actions = Vec::with_capacity(input.actions.len());
    for (i, action) in input.actions.into_iter().enumerate() {
        let p = format!("/actions/{i}");
        let check_version = |v: Option<i64>| match v {
            Some(v) if v < 1 => Err(Invalid::new(format!("{p}/if_version"), "if_version must be at least 1")),
            v => Ok(v),
        };
        let (collection, id, op, if_version) = match action {
            ActionIn::Insert(InsertAction { collection, id, data, .. }) => {
                let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                (collection, id, ActionOp::Insert(rules::user_data(&data, &format!("{p}/data"))?), None)
            }
            ActionIn::Update(UpdateAction { collection, id, if_version, set, unset, inc, .. }) => {
                let patch = Patch::parse(set.as_ref(), unset.as_deref(), inc.as_ref(), &p)?;
                (collection, id, ActionOp::Update(patch), check_version(if_version)?)
            }
            ActionIn::Replace(ReplaceAction { collection, id, if_version, data, .. }) => {
                let data = rules::user_data(&data, &format!("{p}/data"))?;
                (collection, id, ActionOp::Replace(data), check_version(if_version)?)
            }
            ActionIn::Delete(DeleteAction { collection, id, if_version, .. }) => {
                (collection, id, ActionOp::Delete, check_version(if_version)?)
            }
            ActionIn::Check(CheckAction { collection, id, if_version, .. }) => {
                (collection, id, ActionOp::Check, check_version(if_version)?)
            }
        };
        rules::check_collection(&collection, &format!("{p}/collection"))?;
        rules::check_id(&id, &format!("{p}/id"))?;
        if !seen.insert((collection.clone(), id.clone())) {
            return Err(ApiError::new(
                ProblemCode::DuplicateMember,
                format!("document {collection}/{id} appears more than once"),
            )
            .action(i));
        }
        actions.push(Action { collection, id, op, if_version });
    }
    Ok(Plan {
        actions,
        schema_version,
        request,
        idempotency_key: key,
        hooks: input.hooks.into_iter().map(HookIn::into_hook).collect(),
        indexed: Default::default(),
        unique: Default::default(),
        claimed: Default::default(),
        schemas: Default::default(),
        warned: Default::default(),
        key: actor.name().map(str::to_owned),
        user: actor.user().cloned(),
    })
}
