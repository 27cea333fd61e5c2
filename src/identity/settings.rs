//! Issuers as the configuration gives them: `[[issuers]]` tables in the
//! TOML file, or one issuer by `TXGATE_ISSUER*` variables. Everything is
//! checked at start; a setting that could let a forged token through
//! (`none`, HS256 without a secret of the issuer's own, no audience) is
//! refused there, never at the first request.

use std::collections::BTreeMap;
use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde::Deserialize;

use crate::keys::Grant;

/// One `[[issuers]]` table.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerEntry {
    /// The issuer identifier, exactly as tokens carry it in `iss` and as
    /// discovery answers it.
    pub url: String,
    /// A label for logs, metrics and the console (default: the URL's
    /// host).
    #[serde(default)]
    pub name: Option<String>,
    /// The audiences txgate accepts; a token must name one of them.
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Allowed `alg` values (default RS256, PS256, ES256, EdDSA).
    #[serde(default)]
    pub algorithms: Option<Vec<String>>,
    /// Clock leeway for `exp`, `nbf` and `iat`, in seconds (default 30).
    #[serde(default)]
    pub leeway_secs: Option<u64>,
    /// Where the roles are: a claim name (`roles`, or a namespaced one such
    /// as `https://example.com/roles`) or a dotted path
    /// (`realm_access.roles`). Default `roles`.
    #[serde(default)]
    pub roles_claim: Option<String>,
    /// Each role's grants, in the API keys' grammar (`read@products+write@carts`).
    #[serde(default)]
    pub roles: BTreeMap<String, String>,
    /// Each role's request rate (`20/s`, `600/min`); the most generous of a
    /// user's roles applies, else `rate`.
    #[serde(default)]
    pub rates: BTreeMap<String, String>,
    /// Where each role's users may send hooks (a transaction's `hooks`, a
    /// subscription's `url`): URL prefixes, each `http(s)://host[:port]/`
    /// and any path. A user sends hooks only where one of their roles
    /// allows (none by default).
    #[serde(default)]
    pub hooks: BTreeMap<String, Vec<String>>,
    /// A user's request rate when no role of theirs sets one (default
    /// `50/s`).
    #[serde(default)]
    pub rate: Option<String>,
    /// Requests all of this issuer's users may have in flight at once on
    /// one instance (default: half the instance's limit).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Event streams all of this issuer's users may have open at once on
    /// one instance (default: half the instance's limit).
    #[serde(default)]
    pub max_streams: Option<usize>,
    /// Requests one user may have in flight at once on one instance
    /// (default 32).
    #[serde(default)]
    pub max_concurrency_per_user: Option<usize>,
    /// Event streams one user may have open at once on one instance
    /// (default 10).
    #[serde(default)]
    pub max_streams_per_user: Option<usize>,
    /// The shared secret for HS256, for this issuer alone (at least 32
    /// bytes); HS256 is accepted only with it.
    #[serde(default)]
    pub hs256_secret: Option<IssuerSecret>,
    /// The JWKS address, when the provider has no discovery document.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The console's client id at this provider (a public client using
    /// PKCE); without it the console offers no sign-in with this issuer.
    #[serde(default)]
    pub console_client_id: Option<String>,
    /// How long keys are kept when the JWKS answer says nothing of caching,
    /// and the bounds put on what it says, in seconds.
    #[serde(default)]
    pub keys_cache_secs: Option<u64>,
    #[serde(default)]
    pub keys_min_cache_secs: Option<u64>,
    #[serde(default)]
    pub keys_max_cache_secs: Option<u64>,
    /// Shortest time between two fetches of the JWKS for a `kid` it did
    /// not hold, in seconds (default 30).
    #[serde(default)]
    pub keys_refetch_secs: Option<u64>,
    /// How long the last good keys keep serving past their expiry while the
    /// provider cannot be reached, in seconds (default 6 hours).
    #[serde(default)]
    pub keys_stale_secs: Option<u64>,
}

/// An issuer's HS256 secret: its `Debug` never shows it.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct IssuerSecret(pub String);

impl std::str::FromStr for IssuerSecret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(IssuerSecret(s.to_owned()))
    }
}

impl std::fmt::Debug for IssuerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Debug for IssuerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerEntry")
            .field("url", &self.url)
            .field("name", &self.name)
            .field("audiences", &self.audiences)
            .field("roles", &self.roles)
            .field("hs256_secret", &self.hs256_secret.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

/// A request rate: a bucket of `quota` requests refilled over `window`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub quota: u32,
    pub window: Duration,
}

impl Rate {
    pub const DEFAULT: Rate = Rate { quota: 50, window: Duration::from_secs(1) };

    /// `N/s`, `N/min` or `N/h`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let bad = || format!("{spec:?} is not a rate (N/s, N/min or N/h, N from 1 to 1000000)");
        let (n, unit) = spec.trim().split_once('/').ok_or_else(bad)?;
        let quota: u32 = n.trim().parse().map_err(|_| bad())?;
        if !(1..=1_000_000).contains(&quota) {
            return Err(bad());
        }
        let window = match unit.trim() {
            "s" => Duration::from_secs(1),
            "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        Ok(Rate { quota, window })
    }

    /// Requests per second it refills.
    pub fn per_second(self) -> f64 {
        f64::from(self.quota) / self.window.as_secs_f64()
    }
}

/// An issuer, checked.
#[derive(Clone)]
pub struct IssuerConfig {
    pub url: String,
    pub name: String,
    pub audiences: Vec<String>,
    pub algorithms: Vec<Algorithm>,
    pub leeway: Duration,
    pub roles_claim: String,
    pub roles: BTreeMap<String, Vec<Grant>>,
    pub rates: BTreeMap<String, Rate>,
    /// Each role's hook destinations, as URL prefixes ending in `/`.
    pub hooks: BTreeMap<String, Vec<String>>,
    pub rate: Rate,
    pub max_concurrency: Option<usize>,
    pub max_streams: Option<usize>,
    pub max_concurrency_per_user: usize,
    pub max_streams_per_user: usize,
    pub hs256_secret: Option<Vec<u8>>,
    pub jwks_url: Option<String>,
    pub console_client_id: Option<String>,
    pub keys: KeyTimes,
}

impl std::fmt::Debug for IssuerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerConfig")
            .field("url", &self.url)
            .field("name", &self.name)
            .field("audiences", &self.audiences)
            .field("algorithms", &self.algorithms)
            .field("roles", &self.roles)
            .field("hs256_secret", &self.hs256_secret.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

/// How long keys are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyTimes {
    pub default: Duration,
    pub min: Duration,
    pub max: Duration,
    pub refetch: Duration,
    pub stale: Duration,
}

impl Default for KeyTimes {
    fn default() -> Self {
        Self {
            default: Duration::from_secs(300),
            min: Duration::from_secs(60),
            max: Duration::from_secs(86_400),
            refetch: Duration::from_secs(30),
            stale: Duration::from_secs(6 * 3600),
        }
    }
}

const DEFAULT_ALGORITHMS: [Algorithm; 4] = [Algorithm::RS256, Algorithm::PS256, Algorithm::ES256, Algorithm::EdDSA];
const ALLOWED: [Algorithm; 10] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
    Algorithm::HS256,
];

/// Whether `url` may be fetched: `https`, or `http` to a loopback host
/// (a provider on the same machine).
pub(crate) fn fetchable(url: &str) -> Result<url::Url, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if loopback => Ok(parsed),
        _ => Err(format!("{url:?} must be https (http only on a loopback host)")),
    }
}

fn secs(name: &str, value: Option<u64>, default: Duration) -> Result<Duration, String> {
    match value {
        Some(0) => Err(format!("{name} must be greater than 0")),
        Some(s) => Ok(Duration::from_secs(s)),
        None => Ok(default),
    }
}

impl IssuerEntry {
    /// The issuer, checked; errors name it by its place (`issuer #n`).
    pub fn resolve(&self, n: usize) -> Result<IssuerConfig, String> {
        let at = |e: String| format!("issuer #{n}: {e}");
        let parsed = fetchable(&self.url).map_err(at)?;
        if self.url.len() > 512 {
            return Err(at("url is longer than 512 characters".into()));
        }
        let name = match &self.name {
            Some(name) if name.is_empty() || name.len() > 64 => {
                return Err(at(format!("name {name:?} must be 1 to 64 characters")));
            }
            Some(name) => name.clone(),
            None => parsed.host_str().unwrap_or("issuer").to_owned(),
        };
        let audiences: Vec<String> =
            self.audiences.iter().map(|a| a.trim().to_owned()).filter(|a| !a.is_empty()).collect();
        if audiences.is_empty() {
            return Err(at("audiences is required: a token must name one of txgate's audiences".into()));
        }
        let algorithms = match &self.algorithms {
            None => DEFAULT_ALGORITHMS.to_vec(),
            Some(list) => {
                let mut algs = Vec::new();
                for a in list {
                    let alg = a
                        .parse::<Algorithm>()
                        .ok()
                        .filter(|alg| ALLOWED.contains(alg))
                        .ok_or_else(|| {
                            at(format!(
                                "algorithm {a:?} is not accepted (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256)"
                            ))
                        })?;
                    if !algs.contains(&alg) {
                        algs.push(alg);
                    }
                }
                if algs.is_empty() {
                    return Err(at("algorithms names none".into()));
                }
                algs
            }
        };
        let secret = self.hs256_secret.as_ref().map(|s| s.0.as_bytes().to_vec());
        match (algorithms.contains(&Algorithm::HS256), &secret) {
            (true, None) => return Err(at("HS256 needs hs256_secret, a secret of this issuer alone".into())),
            (false, Some(_)) => return Err(at("hs256_secret is set but HS256 is not among algorithms".into())),
            (true, Some(s)) if s.len() < 32 => return Err(at("hs256_secret must be at least 32 bytes".into())),
            _ => {}
        }
        let mut roles = BTreeMap::new();
        for (role, spec) in &self.roles {
            let grants = spec
                .split('+')
                .map(|g| Grant::parse(g.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| at(format!("role {role:?}: {e}")))?;
            roles.insert(role.clone(), grants);
        }
        let mut rates = BTreeMap::new();
        for (role, spec) in &self.rates {
            if !roles.contains_key(role) {
                return Err(at(format!("rates names role {role:?}, which roles does not map")));
            }
            rates.insert(role.clone(), Rate::parse(spec).map_err(|e| at(format!("rates.{role}: {e}")))?);
        }
        let mut hooks = BTreeMap::new();
        for (role, prefixes) in &self.hooks {
            if !roles.contains_key(role) {
                return Err(at(format!("hooks names role {role:?}, which roles does not map")));
            }
            if prefixes.len() > 64 {
                return Err(at(format!("hooks.{role}: at most 64 destinations")));
            }
            let checked = prefixes
                .iter()
                .map(|p| hook_prefix(p).map_err(|e| at(format!("hooks.{role}: {e}"))))
                .collect::<Result<Vec<_>, _>>()?;
            hooks.insert(role.clone(), checked);
        }
        let rate = match &self.rate {
            Some(spec) => Rate::parse(spec).map_err(|e| at(format!("rate: {e}")))?,
            None => Rate::DEFAULT,
        };
        if let Some(url) = &self.jwks_url {
            fetchable(url).map_err(|e| at(format!("jwks_url: {e}")))?;
        }
        let d = KeyTimes::default();
        let keys = KeyTimes {
            default: secs("keys_cache_secs", self.keys_cache_secs, d.default).map_err(at)?,
            min: secs("keys_min_cache_secs", self.keys_min_cache_secs, d.min).map_err(at)?,
            max: secs("keys_max_cache_secs", self.keys_max_cache_secs, d.max).map_err(at)?,
            refetch: secs("keys_refetch_secs", self.keys_refetch_secs, d.refetch).map_err(at)?,
            stale: self.keys_stale_secs.map_or(d.stale, Duration::from_secs),
        };
        if keys.min > keys.max {
            return Err(at("keys_min_cache_secs is above keys_max_cache_secs".into()));
        }
        let roles_claim = self.roles_claim.clone().unwrap_or_else(|| "roles".into());
        if roles_claim.is_empty() || roles_claim.len() > 256 {
            return Err(at("roles_claim must be 1 to 256 characters".into()));
        }
        Ok(IssuerConfig {
            url: self.url.clone(),
            name,
            audiences,
            algorithms,
            leeway: Duration::from_secs(self.leeway_secs.unwrap_or(30).min(600)),
            roles_claim,
            roles,
            rates,
            hooks,
            rate,
            max_concurrency: self.max_concurrency.filter(|&n| n > 0),
            max_streams: self.max_streams.filter(|&n| n > 0),
            max_concurrency_per_user: self.max_concurrency_per_user.filter(|&n| n > 0).unwrap_or(32),
            max_streams_per_user: self.max_streams_per_user.filter(|&n| n > 0).unwrap_or(10),
            hs256_secret: secret,
            jwks_url: self.jwks_url.clone(),
            console_client_id: self.console_client_id.clone().filter(|c| !c.is_empty()),
            keys,
        })
    }
}

/// `TXGATE_ISSUER_ROLES`: `role=grant[+grant];role=...`.
/// A hook destination prefix, checked: an absolute `http` or `https` URL
/// without credentials, query or fragment, as a prefix ending in `/` (so
/// `https://hooks.example.com` never lets `https://hooks.example.com.evil/`
/// through).
fn hook_prefix(spec: &str) -> Result<String, String> {
    let url = url::Url::parse(spec.trim()).map_err(|e| format!("{spec:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{spec:?} is not an http or https URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{spec:?} may not hold credentials, a query or a fragment"));
    }
    let mut prefix = url.as_str().to_owned();
    if !prefix.ends_with('/') {
        prefix.push('/');
    }
    Ok(prefix)
}

/// `TXGATE_ISSUER_HOOKS`: `role=prefix[,prefix];role=...`.
pub(crate) fn parse_hooks(spec: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut hooks = BTreeMap::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (role, prefixes) = item
            .split_once('=')
            .ok_or_else(|| format!("TXGATE_ISSUER_HOOKS: {item:?} must be role=prefix[,prefix]"))?;
        let list = prefixes.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect();
        hooks.insert(role.trim().to_owned(), list);
    }
    Ok(hooks)
}

pub(crate) fn parse_roles(spec: &str) -> Result<BTreeMap<String, String>, String> {
    let mut roles = BTreeMap::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (role, grants) =
            item.split_once('=').ok_or_else(|| format!("TXGATE_ISSUER_ROLES: {item:?} must be role=grant[+grant]"))?;
        roles.insert(role.trim().to_owned(), grants.trim().to_owned());
    }
    Ok(roles)
}

/// Checks that every issuer is named once and has a distinct URL.
pub(crate) fn distinct(issuers: &[IssuerConfig]) -> Result<(), String> {
    let mut urls = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    for i in issuers {
        if !urls.insert(i.url.as_str()) {
            return Err(format!("issuer {:?} is configured twice", i.url));
        }
        if !names.insert(i.name.as_str()) {
            return Err(format!("two issuers are named {:?}: give each a name", i.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> IssuerEntry {
        IssuerEntry {
            url: "https://id.example.com/realms/shop".into(),
            audiences: vec!["txgate".into()],
            roles: [("shopper".to_owned(), "read@products+write@carts".to_owned())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_issuer_resolves_with_safe_defaults() {
        let issuer = entry().resolve(1).unwrap();
        assert_eq!(issuer.name, "id.example.com");
        assert_eq!(issuer.algorithms, DEFAULT_ALGORITHMS.to_vec());
        assert_eq!(issuer.roles["shopper"].len(), 2);
        assert_eq!(issuer.rate, Rate::DEFAULT);
        assert_eq!(issuer.leeway, Duration::from_secs(30));
    }

    #[test]
    fn unsafe_issuers_are_refused_at_start() {
        let refused = |f: &dyn Fn(&mut IssuerEntry)| {
            let mut e = entry();
            f(&mut e);
            e.resolve(1).unwrap_err()
        };
        assert!(refused(&|e| e.audiences.clear()).contains("audiences"));
        assert!(refused(&|e| e.algorithms = Some(vec!["none".into()])).contains("not accepted"));
        assert!(refused(&|e| e.algorithms = Some(vec!["HS256".into()])).contains("hs256_secret"));
        assert!(refused(&|e| e.hs256_secret = Some(IssuerSecret("x".repeat(40)))).contains("HS256"));
        assert!(
            refused(&|e| {
                e.algorithms = Some(vec!["HS256".into()]);
                e.hs256_secret = Some(IssuerSecret("short".into()));
            })
            .contains("32 bytes")
        );
        assert!(refused(&|e| e.url = "http://id.example.com".into()).contains("https"));
        assert!(refused(&|e| e.roles.insert("x".into(), "root".into()).map_or((), drop)).contains("role \"x\""));
        assert!(refused(&|e| e.rates.insert("nobody".into(), "5/s".into()).map_or((), drop)).contains("nobody"));
        assert!(refused(&|e| e.rate = Some("5/day".into())).contains("rate"));
        let mut local = entry();
        local.url = "http://127.0.0.1:9000/issuer".into();
        assert!(local.resolve(1).is_ok(), "http on loopback");
    }

    #[test]
    fn hook_destinations_are_prefixes_that_end_a_host_or_a_path() {
        assert_eq!(hook_prefix("https://hooks.example.com").unwrap(), "https://hooks.example.com/");
        assert_eq!(hook_prefix("https://hooks.example.com:8443/shop").unwrap(), "https://hooks.example.com:8443/shop/");
        for bad in [
            "hooks.example.com",
            "ftp://x.example/",
            "https://u:p@x.example/",
            "https://x.example/?a=1",
            "https://x.example/#f",
        ] {
            assert!(hook_prefix(bad).is_err(), "{bad}");
        }
        let prefix = hook_prefix("https://hooks.example.com").unwrap();
        let matches = |url: &str| url::Url::parse(url).unwrap().as_str().starts_with(prefix.as_str());
        assert!(matches("https://hooks.example.com/a"));
        assert!(!matches("https://hooks.example.com.evil.io/a"));
        assert!(!matches("https://hooks.example.com:444/a"));
        assert!(!matches("https://user@hooks.example.com/a"));
        let hooks = parse_hooks("shopper=https://a.example/,https://b.example/x; support=https://c.example").unwrap();
        assert_eq!(hooks["shopper"].len(), 2);
        assert_eq!(hooks["support"], vec!["https://c.example".to_owned()]);
        assert!(parse_hooks("shopper").is_err());
    }

    #[test]
    fn rates_parse() {
        assert_eq!(Rate::parse("20/s").unwrap(), Rate { quota: 20, window: Duration::from_secs(1) });
        assert_eq!(Rate::parse("600/min").unwrap().per_second(), 10.0);
        for bad in ["0/s", "x/s", "5", "5/day", "2000000/s"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_roles("a=read; b=write@x+read").unwrap().len(), 2);
        assert!(parse_roles("a").is_err());
    }
}
