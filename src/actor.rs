//! Who a service call is made for. A request's caller is found once, by
//! the HTTP layer's admission (`http/auth.rs`), and handed to every service
//! that records or checks who acts: a change event names the key or the
//! user that made it, a transaction record and a subscription keep theirs.
//! The gateway's own background work acts as [`Actor::Gateway`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Who acts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Actor {
    /// Whoever reaches a gateway that has no credentials configured, or a
    /// request without credentials where anonymous access is configured.
    #[default]
    Anyone,
    /// A request made with the API key of this name.
    Key(String),
    /// A request made with a user's access token.
    User(Arc<UserId>),
    /// The gateway itself (TTL expiry; recovery writes on behalf of the
    /// key a transaction record names).
    Gateway,
}

/// A user as records name them: `{kind: "user", issuer, subject}`. Never
/// the token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UserId {
    /// Always `user`.
    #[schema(example = "user")]
    pub kind: String,
    /// The issuer's URL (`iss`).
    pub issuer: String,
    /// The user's `sub` at that issuer.
    pub subject: String,
}

impl UserId {
    pub fn new(issuer: &str, subject: &str) -> Self {
        Self { kind: "user".into(), issuer: issuer.to_owned(), subject: subject.to_owned() }
    }
}

impl Actor {
    /// The name what this actor makes is recorded under: the key's name,
    /// or `None`.
    pub(crate) fn name(&self) -> Option<&str> {
        match self {
            Actor::Key(name) => Some(name),
            Actor::Anyone | Actor::User(_) | Actor::Gateway => None,
        }
    }

    /// What keeps what this actor owns (subscriptions) apart from what
    /// others own: the key's name, or `user:` and a digest of the user's
    /// issuer and subject (a key's name has no `:`); `None` for anyone.
    pub(crate) fn owner(&self) -> Option<String> {
        match self {
            Actor::Key(name) => Some(name.clone()),
            Actor::User(user) => {
                use sha2::{Digest, Sha256};
                let digest = Sha256::digest(format!("{}\0{}", user.issuer, user.subject).as_bytes());
                Some(format!("user:{}", digest[..16].iter().map(|b| format!("{b:02x}")).collect::<String>()))
            }
            Actor::Anyone | Actor::Gateway => None,
        }
    }

    /// The user this actor is, if a user.
    pub(crate) fn user(&self) -> Option<&UserId> {
        match self {
            Actor::User(user) => Some(user),
            _ => None,
        }
    }
}
