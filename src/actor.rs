//! Who a service call is made for. A request's caller is found once, by
//! the HTTP layer's admission (`http/auth.rs`), and handed to every service
//! that records or checks who acts: a change event names the key that made
//! it, a transaction record and a subscription keep theirs. The gateway's
//! own background work acts as [`Actor::Gateway`].

/// Who acts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Actor {
    /// Whoever reaches a gateway that has no API keys configured.
    #[default]
    Anyone,
    /// A request made with the API key of this name.
    Key(String),
    /// The gateway itself (TTL expiry; recovery writes on behalf of the
    /// key a transaction record names).
    Gateway,
}

impl Actor {
    /// The name what this actor makes is recorded under: the key's name,
    /// or `None`.
    pub(crate) fn name(&self) -> Option<&str> {
        match self {
            Actor::Key(name) => Some(name),
            Actor::Anyone | Actor::Gateway => None,
        }
    }
}
