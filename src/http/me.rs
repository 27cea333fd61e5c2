//! `GET /v1/me`: who the request's credential names and what it may do,
//! for a console or an app to show the signed-in user.

use std::sync::Arc;

use axum::Json;
use axum::extract::Request;
use serde::Serialize;
use utoipa_axum::routes;

use super::auth::Access;
use super::guard::{Guard, On, Routes};
use super::problems::{Problems, problems};
use crate::actor::Actor;
use crate::identity::User;

pub(crate) fn router() -> Routes {
    Routes::new().guarded(Guard::Read(On::Handler), routes!(me))
}

/// Who the caller is.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(example = json!({
    "kind": "user", "issuer": "https://id.example.com/realms/shop", "subject": "u-17",
    "roles": ["shopper"], "grants": ["read@products", "write@carts"], "expires_at": "2026-12-06T10:00:00Z"
}))]
pub(crate) struct Me {
    /// `key`, `user`, `anonymous`, or `anyone` (no credentials configured).
    kind: &'static str,
    /// The API key's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    /// The user's issuer (`iss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    issuer: Option<String>,
    /// The user's `sub`.
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    /// The user's roles, as the token carries them (mapped or not).
    #[serde(skip_serializing_if = "Option::is_none")]
    roles: Option<Vec<String>>,
    /// What the caller may do, in the grants' grammar (`read@orders`);
    /// absent when everything is allowed (no credentials configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    grants: Option<Vec<String>>,
    /// Every claim of the user's token (its own contents, shown back to
    /// its holder: a name or an email for a console to show).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    claims: Option<serde_json::Map<String, serde_json::Value>>,
    /// When the user's token expires (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
}

problems!(
    /// What `v1.me.get` can answer besides its success.
    MeProblems = Problems::of(&[])
);

/// Who am I
///
/// The caller as the gateway sees it: an API key by its name, or a user
/// by issuer and subject with their roles, and what the credential grants.
#[utoipa::path(get, path = "/v1/me", operation_id = "v1.me.get", tag = "operations",
    responses(MeProblems, (status = 200, description = "The caller", body = Me)))]
async fn me(actor: Actor, access: Access, req: Request) -> Json<Me> {
    let user = req.extensions().get::<Arc<User>>().cloned();
    let mut me = Me {
        kind: "anyone",
        name: None,
        issuer: None,
        subject: None,
        roles: None,
        claims: None,
        grants: access.grant_names(),
        expires_at: None,
    };
    match (&actor, user) {
        (Actor::Key(name), _) => {
            me.kind = "key";
            me.name = Some(name.clone());
        }
        (Actor::User(_), Some(user)) => {
            me.kind = "user";
            me.issuer = Some(user.issuer.clone());
            me.subject = Some(user.subject.clone());
            me.roles = Some(user.roles.clone());
            me.claims = Some(user.claims.clone());
            me.expires_at = Some(crate::clock::rfc3339(crate::store::DateTime::from_system_time(user.expires)));
        }
        (Actor::Anyone, _) if me.grants.is_some() => me.kind = "anonymous",
        _ => {}
    }
    Json(me)
}
