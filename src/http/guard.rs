//! Who may call a route, declared beside the route: each module's router
//! adds its routes through [`Routes::guarded`] with their [`Guard`], and
//! admission ([`super::auth::admit`]) reads the guard of the route a
//! request matched. A route cannot be added without one.

use std::collections::HashMap;

use axum::http::Method;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

use super::AppState;
use crate::keys::Scope;

/// The scope a route needs, and where its collections are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Anyone, with or without a key (health and readiness).
    Public,
    /// `read` for `GET`, `HEAD` and `OPTIONS`, `write` for the others.
    ByMethod(On),
    /// `read` whatever the method (a query or a merge sent as `POST`).
    Read(On),
    /// `admin` whatever the method (an operator action).
    Admin(On),
    /// `read` for `GET`, `HEAD` and `OPTIONS`, `admin` for the others (a
    /// declaration any reader may read).
    ReadOrAdmin(On),
    /// The API description: anyone's, and a read of the collections its
    /// `collections` parameter names (checked by the handler) when it
    /// has one.
    Described,
}

/// Which collections a guarded route's grant must cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum On {
    /// The one its path names (`{collection}`).
    Path,
    /// Those its handler finds in the body, the query or the records it
    /// reads, checked there through the caller's `Access`; admission only
    /// asks that the key have the scope on some collection.
    Handler,
    /// Every collection (deliveries, `/metrics`, a backup).
    Everywhere,
}

impl Guard {
    /// The scope a request by `method` with `query` needs; `None` for a
    /// public route.
    pub(crate) fn needs_for(self, method: &Method, query: Option<&str>) -> Option<(Scope, On)> {
        match self {
            Guard::Described => {
                let named = query.is_some_and(|q| q.split('&').any(|p| p.split('=').next() == Some("collections")));
                named.then_some((Scope::Read, On::Handler))
            }
            other => other.needs(method),
        }
    }

    /// The scope a request by `method` needs; `None` for a public route.
    pub(crate) fn needs(self, method: &Method) -> Option<(Scope, On)> {
        match self {
            Guard::Public | Guard::Described => None,
            Guard::ByMethod(on) => {
                let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
                Some((if reads { Scope::Read } else { Scope::Write }, on))
            }
            Guard::Read(on) => Some((Scope::Read, on)),
            Guard::Admin(on) => Some((Scope::Admin, on)),
            Guard::ReadOrAdmin(on) => {
                let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
                Some((if reads { Scope::Read } else { Scope::Admin }, on))
            }
        }
    }
}

/// The guard of each route, by its path as the router matches it.
pub(crate) type Guards = HashMap<String, Guard>;

/// Routes being assembled, each with its guard.
pub(crate) struct Routes {
    router: OpenApiRouter<AppState>,
    guards: Guards,
}

impl Routes {
    pub(crate) fn new() -> Self {
        Self { router: OpenApiRouter::new(), guards: Guards::new() }
    }

    /// The routes of one path (one `routes!`), all under `guard`.
    pub(crate) fn guarded(mut self, guard: Guard, routes: UtoipaMethodRouter<AppState>) -> Self {
        for path in routes.1.paths.keys() {
            self.guard(path, guard);
        }
        self.router = self.router.routes(routes);
        self
    }

    /// A route added to the router apart (`/metrics`), under `guard`.
    pub(crate) fn guard(&mut self, path: &str, guard: Guard) {
        let before = self.guards.insert(path.to_owned(), guard);
        assert!(before.is_none_or(|b| b == guard), "{path} is declared with two guards");
    }

    pub(crate) fn merge(mut self, other: Routes) -> Self {
        for (path, guard) in &other.guards {
            self.guard(path, *guard);
        }
        self.router = self.router.merge(other.router);
        self
    }

    pub(crate) fn into_parts(self) -> (OpenApiRouter<AppState>, Guards) {
        (self.router, self.guards)
    }
}
