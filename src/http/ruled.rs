//! The HTTP side of per-document rules (docs/guides/rules.md): the
//! caller as rules see them, how a collection's rules judge them, and
//! the answers rules give (404 for what the caller may not read, 403
//! `rule_denied`, `Txgate-Grant`).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderValue;
use axum::http::request::Parts;
use axum::response::Response;

use super::AppState;
use super::auth::Access;
use super::error::ApiError;
use crate::actor::Actor;
use crate::documents::DocError;
use crate::identity::User;
use crate::rules::{Denied, Judged, Kind, Principal};

/// The header naming the grant an answer was allowed by.
pub(crate) const GRANT_HEADER: &str = "txgate-grant";

/// The request's caller, as rules see them.
pub(crate) struct Who(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let actor = parts.extensions.get::<Actor>().cloned().unwrap_or_default();
        let user = parts.extensions.get::<Arc<User>>().cloned();
        let configured = parts.extensions.get::<Access>().is_some_and(Access::configured);
        Ok(Who(Principal::of(&actor, user.as_deref(), configured)))
    }
}

/// The request's caller as rules see them, and as records name them:
/// what a write needs.
pub(crate) struct Acting {
    pub who: Principal,
    pub actor: Actor,
}

impl<S: Send + Sync> FromRequestParts<S> for Acting {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Who(who) = Who::from_request_parts(parts, state).await?;
        let actor = parts.extensions.get::<Actor>().cloned().unwrap_or_default();
        Ok(Acting { who, actor })
    }
}

/// How `coll`'s rules in force now judge `who`.
pub(crate) async fn judged(state: &AppState, coll: &str, who: &Principal) -> Result<Judged, ApiError> {
    if who.kind == Kind::Open {
        return Ok(Judged::Free);
    }
    let versions = state.rules.of(coll).await.map_err(ApiError::from)?;
    Ok(Judged::of(versions.current.as_deref(), who, &state.rules.now_string()))
}

/// The answer to a refusal: 404 for what the caller may not read.
pub(crate) fn denied(denied: Denied) -> ApiError {
    match denied {
        Denied::Hidden => DocError::NotFound.into(),
        Denied::Forbidden { detail, pointer } => ApiError::rule_denied(detail, pointer),
    }
}

impl From<Denied> for DocError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Hidden => DocError::NotFound,
            Denied::Forbidden { detail, pointer } => DocError::Denied { detail, pointer },
        }
    }
}

/// `response` with `Txgate-Grant: <value>`.
pub(crate) fn with_grant(mut response: Response, value: Option<String>) -> Response {
    if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
        response.headers_mut().insert(GRANT_HEADER, v);
    }
    response
}

/// Under rules, a tombstone is as if there were nothing: its existence
/// is not revealed.
pub(crate) fn hide_tombstone(err: DocError, judged: &Judged) -> DocError {
    match (err, judged) {
        (DocError::Deleted { .. }, Judged::Ruled(_)) => DocError::NotFound,
        (DocError::Duplicate { index, .. }, Judged::Ruled(_)) => DocError::Duplicate { index, existing: String::new() },
        (err, _) => err,
    }
}

/// The judge of a change to one document under `judged`: the document
/// as read must be one the caller may read (else 404) and, for a delete
/// (`deleting`), delete; the change must be one a grant allows. The
/// grant that allowed it is left in `granted`, as `Txgate-Grant` names it.
pub(crate) fn guard<'a>(
    judged: &'a Judged,
    (deleting, replacing): (bool, bool),
    touched: &'a [(&'a str, String)],
    granted: &'a std::sync::Mutex<Option<String>>,
) -> impl Fn(&crate::store::Document, Option<&mut crate::store::Document>) -> Result<(), DocError> + Sync + 'a {
    move |before, after| {
        let Judged::Ruled(judge) = judged else { return Ok(()) };
        let grant = match after {
            None if deleting => judge.delete(before)?,
            None => {
                if judge.sees(crate::rules::Action::Read, before).is_none() {
                    return Err(DocError::NotFound);
                }
                // Before the patch applies: how it would (`inc` on a hidden
                // non-number) tells nothing of a field it may not write.
                let update = crate::rules::Action::Update;
                return match touched.iter().find(|(f, _)| !judge.allowing(update).any(|a| a.grant.writes(f))) {
                    None => Ok(()),
                    Some((field, pointer)) => Err(DocError::Denied {
                        detail: format!("no grant of the caller's lets it write {field:?}"),
                        pointer: Some(pointer.clone()),
                    }),
                };
            }
            Some(after) => {
                if replacing {
                    judge.keep_hidden(before, after);
                }
                judge.keep_set(before, after);
                judge.update(before, after)?
            }
        };
        *granted.lock().expect("grant") = Some(judge.header(&grant));
        Ok(())
    }
}

/// `live` as the caller may see it under `judged`: its fields projected,
/// and the grant that shows it. `Err`: the caller may not read it.
pub(crate) fn shown(judged: &Judged, live: &mut crate::document::Live) -> Result<Option<String>, DocError> {
    let Judged::Ruled(judge) = judged else { return Ok(None) };
    let seen = judge.sees(crate::rules::Action::Read, &live.data).ok_or(DocError::NotFound)?;
    crate::rules::eval::project(&mut live.data, seen.fields.as_ref());
    Ok(Some(judge.header(&seen.grant)))
}

/// What a write answers of the document it wrote, under `judged`: the
/// fields the caller may read (none, when it may read none of it).
pub(crate) fn written_shown(judged: &Judged, live: &mut crate::document::Live) {
    if let Judged::Ruled(judge) = judged {
        match judge.sees(crate::rules::Action::Read, &live.data) {
            Some(seen) => crate::rules::eval::project(&mut live.data, seen.fields.as_ref()),
            None => live.data.clear(),
        }
    }
}

/// 403 `rule_denied` where `coll`'s rules judge `who` on a path that
/// does not judge documents by rules yet (`what`: the path, for the
/// detail): the caller is refused rather than shown what the rules hide
/// (docs/limitations.md, "Rules").
pub(crate) async fn not_under_rules(state: &AppState, coll: &str, who: &Principal, what: &str) -> Result<(), ApiError> {
    match judged(state, coll, who).await? {
        Judged::Free => Ok(()),
        Judged::Ruled(judge) => Err(denied(Denied::Forbidden {
            detail: format!(
                "{what} on collection {coll:?} is not open to callers its rules (version {}) judge: use the \
                 single-document routes",
                judge.version
            ),
            pointer: None,
        })),
    }
}

/// Whether the rules of any of `collections` judge `who`: a record that
/// names documents there (a transaction's) is not shown to them.
pub(crate) async fn judged_in_any(state: &AppState, who: &Principal, collections: &[&str]) -> Result<bool, ApiError> {
    if who.kind == Kind::Open {
        return Ok(false);
    }
    for coll in collections {
        if matches!(judged(state, coll, who).await?, Judged::Ruled(_)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// 403 `rule_denied` when a filter or sort of a read by `action` names a
/// field (`paths`, each with its pointer) that a grant the read goes
/// through does not let the caller read: matching or ordering by it would
/// tell its values.
pub(crate) fn readable_paths<'a>(
    judge: &crate::rules::eval::Judge,
    action: crate::rules::Action,
    paths: impl IntoIterator<Item = (&'a str, String)>,
) -> Result<(), ApiError> {
    for (path, pointer) in paths {
        let top = path.split('.').next().unwrap_or(path);
        if let Some(a) = judge.allowing(action).find(|a| a.grant.read.as_ref().is_some_and(|r| !r.contains(top))) {
            return Err(denied(Denied::Forbidden {
                detail: format!(
                    "grant {} does not let the caller read {top:?}, so no read may filter or sort by it",
                    a.grant.name
                ),
                pointer: Some(pointer),
            }));
        }
    }
    Ok(())
}

/// 403 `forbidden` unless the caller may send a hook to `url` (at
/// `pointer`): a user only where one of their roles allows it (the
/// issuer's `hooks`, docs/guides/users.md), an anonymous caller nowhere;
/// API keys wherever the gateway sends hooks.
pub(crate) fn hook_allowed(who: &Principal, user: Option<&User>, url: &str, pointer: &str) -> Result<(), ApiError> {
    let allowed = match who.kind {
        Kind::User => user.is_some_and(|u| u.may_hook(url)),
        Kind::Anonymous => false,
        Kind::Key | Kind::Open => true,
    };
    if allowed {
        return Ok(());
    }
    let detail = format!(
        "{pointer}: the caller's roles allow no hooks to this destination (an admin allows destinations per role: the \
         issuer's hooks)"
    );
    Err(ApiError::new(super::error::ProblemCode::Forbidden, detail))
}
