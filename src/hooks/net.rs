//! The HTTP clients deliveries go out with, and the send-time half of the
//! destination guard: a DNS resolver that hands the connector only vetted
//! addresses, so what is checked is what is connected to (no window for a
//! second lookup to answer differently).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use super::guard::{HookGuard, forbidden};

/// Resolves names and drops every address [`forbidden`] refuses.
struct VettingResolver;

impl Resolve for VettingResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let vetted: Vec<SocketAddr> = found.iter().copied().filter(|a| !forbidden(a.ip())).collect();
            if vetted.is_empty() {
                let err: Box<dyn std::error::Error + Send + Sync> = if found.is_empty() {
                    format!("{host} has no address").into()
                } else {
                    format!(
                        "destination not allowed: {host} resolves only to loopback, private, link-local or metadata \
                         addresses; allow it with TXGATE_HOOK_ALLOW"
                    )
                    .into()
                };
                return Err(err);
            }
            Ok(Box::new(vetted.into_iter()) as Addrs)
        })
    }
}

/// The two clients: `vetted` for ordinary destinations (only public
/// addresses are connected to), `allowed` for destinations the operator
/// listed in `TXGATE_HOOK_ALLOW`. Neither follows redirects.
#[derive(Clone)]
pub struct Clients {
    vetted: reqwest::Client,
    allowed: reqwest::Client,
    guard: Arc<HookGuard>,
}

impl Clients {
    pub fn new(guard: Arc<HookGuard>, timeout: Duration) -> Result<Self, String> {
        let build = |resolver: Option<Arc<VettingResolver>>| {
            let mut b = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                // Proxy variables of the environment are ignored: through a
                // proxy, the address check would vet the proxy, not the
                // destination.
                .no_proxy()
                .timeout(timeout)
                .connect_timeout(timeout.min(Duration::from_secs(10)))
                .pool_idle_timeout(Duration::from_secs(30))
                .user_agent(concat!("txgate/", env!("CARGO_PKG_VERSION")));
            if let Some(r) = resolver {
                b = b.dns_resolver(r);
            }
            b.build().map_err(|e| format!("cannot build the HTTP client: {e}"))
        };
        Ok(Self { vetted: build(Some(Arc::new(VettingResolver)))?, allowed: build(None)?, guard })
    }

    /// The client to reach `url` with, or why it may not be reached.
    pub fn for_url(&self, url: &Url) -> Result<&reqwest::Client, String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err("destination not allowed: hook URLs must be http or https".into());
        }
        let port = url.port_or_known_default().unwrap_or(0);
        let (name, literal) = match url.host() {
            None => return Err("destination not allowed: the URL has no host".into()),
            Some(Host::Domain(d)) => (d.trim_end_matches('.').to_ascii_lowercase(), None),
            Some(Host::Ipv4(v4)) => (v4.to_string(), Some(IpAddr::V4(v4))),
            Some(Host::Ipv6(v6)) => (v6.to_string(), Some(IpAddr::V6(v6))),
        };
        if self.guard.allowed(&name, port) {
            return Ok(&self.allowed);
        }
        // An address literal is never looked up, so it is checked here.
        if literal.is_some_and(forbidden) || self.guard.check_url(url).is_err() {
            return Err(format!(
                "destination not allowed: {name} is a loopback, private, link-local or metadata address; allow it \
                 with TXGATE_HOOK_ALLOW"
            ));
        }
        Ok(&self.vetted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients(allow: &str) -> Clients {
        Clients::new(Arc::new(HookGuard::new(allow).unwrap()), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn literals_and_localhost_need_an_allow_pattern() {
        let c = clients("127.0.0.1:9000");
        let url = |u: &str| Url::parse(u).unwrap();
        assert!(c.for_url(&url("http://127.0.0.1:9000/x")).is_ok());
        assert!(c.for_url(&url("http://127.0.0.1:9001/x")).is_err());
        assert!(c.for_url(&url("http://localhost:9000/x")).is_err());
        assert!(c.for_url(&url("http://[::ffff:10.0.0.1]/")).is_err());
        assert!(c.for_url(&url("ftp://example.com/")).is_err());
        assert!(c.for_url(&url("https://example.com/hook")).is_ok());
    }

    #[tokio::test]
    async fn names_resolving_to_internal_addresses_are_refused() {
        let err = VettingResolver.resolve("localhost".parse().unwrap()).await.err().expect("refused");
        assert!(err.to_string().contains("destination not allowed"), "{err}");
    }
}
