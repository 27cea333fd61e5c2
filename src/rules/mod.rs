//! Per-document rules (docs/guides/rules.md): per collection, grants that
//! say which callers may read, count, stream, create, update and delete
//! which documents, and which of their fields, judged identically on
//! every path that reads or writes a document.
//!
//! A collection with rules denies its users by default: a user's role
//! grants (scopes) are necessary, never sufficient, there. API keys keep
//! their scopes unless a grant names them. Every read under rules is the
//! caller's filter AND a grant's `match`, served by an index like any
//! query: no rule ever scans.

pub(crate) mod eval;
pub(crate) mod model;
pub(crate) mod stored;
pub(crate) mod suite;

pub(crate) use eval::{Denied, Judged, Kind, Principal, PrincipalIn};
pub(crate) use model::{Action, GrantSpec};
pub(crate) use stored::{Rules, SetError, Versions};

use crate::actor::Actor;
use crate::identity::User;

impl Principal {
    /// The caller a request's admission found: `configured` when the
    /// gateway has credentials (otherwise rules never apply).
    pub(crate) fn of(actor: &Actor, user: Option<&User>, configured: bool) -> Self {
        match (actor, user) {
            (_, Some(user)) => Principal {
                kind: Kind::User,
                sub: Some(user.subject.clone()),
                iss: Some(user.issuer.clone()),
                key: None,
                roles: user.roles.clone(),
                claims: user.claims.clone(),
            },
            (Actor::Key(name), None) => Principal { kind: Kind::Key, key: Some(name.clone()), ..Default::default() },
            _ if configured => Principal { kind: Kind::Anonymous, ..Default::default() },
            _ => Principal::default(),
        }
    }
}

/// `now` as `when` filters see it: RFC 3339 in UTC, to the millisecond.
pub(crate) fn now_string(now: crate::store::DateTime) -> String {
    crate::clock::rfc3339(now)
}
