//! One issuer's signing keys: found by OpenID Connect discovery, fetched
//! from its JWKS, kept as long as the answer's `Cache-Control` says
//! (within the configured bounds), fetched again for a `kid` they do not
//! hold at most once per `keys_refetch_secs`, and kept serving past their
//! time for up to `keys_stale_secs` while the provider cannot be reached.
//! Only the issuer's own configured addresses are ever fetched: a token's
//! `jku`, `x5u` or `jwk` header is never followed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::settings::{IssuerConfig, KeyTimes, fetchable};

/// The most a discovery document or a JWKS may weigh.
const MAX_BODY: usize = 256 * 1024;
/// The most keys one JWKS may hold (more are ignored).
const MAX_KEYS: usize = 64;
/// Time for one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest time between two attempts while the provider fails.
const RETRY: Duration = Duration::from_secs(5);

/// A usable key.
#[derive(Clone)]
pub(crate) struct Key {
    pub kid: Option<String>,
    /// The `alg` the JWK names, if it names one.
    pub alg: Option<Algorithm>,
    pub decoding: DecodingKey,
    jwk: Jwk,
}

impl Key {
    /// Whether this key may check a token signed with `alg`: its kind
    /// and curve fit, and it names no other algorithm.
    pub(super) fn fits(&self, alg: Algorithm) -> bool {
        if self.alg.is_some_and(|a| a != alg) {
            return false;
        }
        match (&self.jwk.algorithm, alg) {
            (
                AlgorithmParameters::RSA(_),
                Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512,
            ) => true,
            (AlgorithmParameters::EllipticCurve(p), Algorithm::ES256) => p.curve == EllipticCurve::P256,
            (AlgorithmParameters::EllipticCurve(p), Algorithm::ES384) => p.curve == EllipticCurve::P384,
            (AlgorithmParameters::OctetKeyPair(p), Algorithm::EdDSA) => p.curve == EllipticCurve::Ed25519,
            _ => false,
        }
    }
}

/// What a lookup found.
pub(crate) enum Lookup {
    /// The keys that may have signed it, and until when they may be relied on.
    Found(Vec<Key>, Instant),
    /// The issuer's keys hold none with that `kid` (after a fetch, or too
    /// soon after one to fetch again).
    Unknown,
    /// No keys could be had (the provider cannot be reached, and no good
    /// keys are at hand or they are past the stale bound).
    Unavailable,
}

#[derive(Default)]
struct State {
    keys: Vec<Key>,
    /// When the keys were fetched, and until when they are fresh.
    fetched: Option<(Instant, Instant)>,
    /// The last attempt, successful or not.
    attempted: Option<Instant>,
    /// The last fetch for a `kid` fresh keys did not hold.
    refetched: Option<Instant>,
    /// Found by discovery (or configured).
    jwks_url: Option<String>,
    last_error: Option<String>,
}

/// An issuer's key cache.
pub(crate) struct KeyCache {
    issuer: String,
    /// The issuer's name, for the metrics.
    name: String,
    metrics: Arc<crate::metrics::Metrics>,
    configured_jwks: Option<String>,
    times: KeyTimes,
    client: reqwest::Client,
    state: std::sync::Mutex<State>,
    /// Held while fetching: one fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

impl KeyCache {
    pub(super) fn new(issuer: &IssuerConfig, client: reqwest::Client, metrics: Arc<crate::metrics::Metrics>) -> Self {
        Self {
            issuer: issuer.url.clone(),
            name: issuer.name.clone(),
            metrics,
            configured_jwks: issuer.jwks_url.clone(),
            times: issuer.keys,
            client,
            state: std::sync::Mutex::new(State::default()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// The keys with `kid` (every key when the token names none). A
    /// lookup of keys at hand (fresh, or past their time while another
    /// lookup fetches) never waits for a fetch; fetches are one at a time.
    pub(super) async fn lookup(&self, kid: Option<&str>) -> Lookup {
        let matching = |state: &State| -> Vec<Key> {
            state.keys.iter().filter(|k| kid.is_none() || k.kid.as_deref() == kid).cloned().collect()
        };
        if let Some(found) = self.at_hand(kid) {
            return found;
        }
        let _fetching = match self.fetching.try_lock() {
            Ok(fetching) => fetching,
            Err(_) => {
                // A fetch is under way (perhaps to a provider that hangs):
                // keys past their time serve meanwhile, within the stale
                // bound; only a lookup they cannot serve waits for it.
                let stale = {
                    let state = self.state.lock().expect("key cache lock");
                    match self.stale(&state, Instant::now(), &matching(&state)) {
                        found @ Lookup::Found(..) => Some(found),
                        _ => None,
                    }
                };
                if let Some(found) = stale {
                    return found;
                }
                self.fetching.lock().await
            }
        };
        // Another lookup may have fetched while this one waited.
        if let Some(found) = self.at_hand(kid) {
            return found;
        }
        let now = Instant::now();
        let (jwks_url, attempted, failing, fresh, refetched) = {
            let state = self.state.lock().expect("key cache lock");
            let fresh = state.fetched.is_some_and(|(_, until)| now < until);
            (state.jwks_url.clone(), state.attempted, state.last_error.is_some(), fresh, state.refetched)
        };
        let recent = |at: Option<Instant>, within: Duration| at.is_some_and(|at| now.duration_since(at) < within);
        if fresh {
            // Fresh keys without this kid: perhaps a new key, fetched at most
            // once per `keys_refetch_secs` however many unknown kids come.
            if recent(refetched, self.times.refetch) {
                return Lookup::Unknown;
            }
            self.state.lock().expect("key cache lock").refetched = Some(now);
        } else if failing && recent(attempted, RETRY) {
            // The provider failed moments ago: do not hammer it.
            let state = self.state.lock().expect("key cache lock");
            return self.stale(&state, now, &matching(&state));
        }
        let fetched = self.fetch(jwks_url).await;
        let outcome = if fetched.is_ok() { "ok" } else { "error" };
        self.metrics.count(&crate::metrics::ISSUER_KEY_FETCHES, &[&self.name, outcome], 1);
        let mut state = self.state.lock().expect("key cache lock");
        state.attempted = Some(now);
        match fetched {
            Ok((url, keys, life)) => {
                let now = Instant::now();
                state.jwks_url = Some(url);
                state.keys = keys;
                state.fetched = Some((now, now + life));
                state.last_error = None;
                let found = matching(&state);
                if found.is_empty() { Lookup::Unknown } else { Lookup::Found(found, now + life) }
            }
            Err(e) => {
                tracing::warn!(issuer = %self.issuer, error = %e, "cannot fetch the issuer's keys");
                state.last_error = Some(e);
                self.stale(&state, now, &matching(&state))
            }
        }
    }

    /// Fresh keys with `kid`, if held.
    fn at_hand(&self, kid: Option<&str>) -> Option<Lookup> {
        let state = self.state.lock().expect("key cache lock");
        let (_, until) = state.fetched?;
        if Instant::now() >= until {
            return None;
        }
        let found: Vec<Key> = state.keys.iter().filter(|k| kid.is_none() || k.kid.as_deref() == kid).cloned().collect();
        (!found.is_empty()).then(|| Lookup::Found(found, until))
    }

    /// The keys past their time while the provider fails, within the
    /// stale bound.
    fn stale(&self, state: &State, now: Instant, found: &[Key]) -> Lookup {
        match state.fetched {
            Some((_, until)) if now < until + self.times.stale => {
                if found.is_empty() {
                    Lookup::Unknown
                } else {
                    // Relied on for moments at a time while stale.
                    Lookup::Found(found.to_vec(), now + RETRY)
                }
            }
            _ => Lookup::Unavailable,
        }
    }

    /// The JWKS address, its keys and how long they may be kept.
    async fn fetch(&self, known_url: Option<String>) -> Result<(String, Vec<Key>, Duration), String> {
        let jwks_url = match (&self.configured_jwks, known_url) {
            (Some(url), _) => url.clone(),
            (None, Some(url)) => url,
            (None, None) => self.discover().await?,
        };
        let (body, max_age) = self.get(&jwks_url).await?;
        let keys = signing_keys(&body)?;
        let life = max_age.unwrap_or(self.times.default).clamp(self.times.min, self.times.max);
        tracing::info!(issuer = %self.issuer, keys = keys.len(), cache_secs = life.as_secs(), "issuer keys fetched");
        Ok((jwks_url, keys, life))
    }

    /// The JWKS address, from `<issuer>/.well-known/openid-configuration`,
    /// whose `issuer` must be the configured one exactly.
    async fn discover(&self) -> Result<String, String> {
        let url = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
        let (body, _) = self.get(&url).await?;
        #[derive(serde::Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let doc: Discovery =
            serde_json::from_slice(&body).map_err(|e| format!("the discovery document is not usable: {e}"))?;
        if doc.issuer != self.issuer {
            return Err(format!(
                "discovery names the issuer {:?}, not the configured {:?}: refused",
                doc.issuer, self.issuer
            ));
        }
        fetchable(&doc.jwks_uri).map_err(|e| format!("discovery's jwks_uri: {e}"))?;
        Ok(doc.jwks_uri)
    }

    /// `url`'s body (bounded) and its `Cache-Control` lifetime. Errors name
    /// the address without its query.
    async fn get(&self, url: &str) -> Result<(Vec<u8>, Option<Duration>), String> {
        let shown = url.split(['?', '#']).next().unwrap_or(url);
        let mut response = self
            .client
            .get(url)
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("GET {shown}: {}", without_url(&e)))?;
        if !response.status().is_success() {
            return Err(format!("GET {shown}: {}", response.status()));
        }
        let headers = response.headers();
        let text = |name| headers.get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok());
        let max_age = text(reqwest::header::CACHE_CONTROL)
            .and_then(max_age)
            .or_else(|| expires(text(reqwest::header::EXPIRES)?, text(reqwest::header::DATE)));
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("GET {shown}: {}", without_url(&e)))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(format!("GET {shown}: the answer is larger than {MAX_BODY} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, max_age))
    }

    /// Fetch now (at start), so that the first token waits for nothing.
    pub(super) async fn warm(&self) {
        let _ = self.lookup(Some("\u{0}warm-up")).await;
    }
}

/// The signing keys of a JWKS: each key read on its own, so that one of a
/// kind or curve not known here (an encryption key on X25519) leaves the
/// others usable; encryption keys and shared secrets are left out.
fn signing_keys(body: &[u8]) -> Result<Vec<Key>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("the JWKS is not a key set: {e}"))?;
    let keys: Vec<Key> = set
        .keys
        .into_iter()
        .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
        .filter(|jwk| !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))))
        // Shared secrets are never taken from a key set.
        .filter(|jwk| !matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)))
        .filter_map(|jwk| {
            let decoding = DecodingKey::from_jwk(&jwk).ok()?;
            let alg = match jwk.common.key_algorithm {
                None => None,
                // A key for something else than signing.
                Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
            };
            Some(Key { kid: jwk.common.key_id.clone(), alg, decoding, jwk })
        })
        .take(MAX_KEYS)
        .collect();
    if keys.is_empty() {
        return Err("the JWKS holds no usable signing key".into());
    }
    Ok(keys)
}

fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "").replace(" ()", "");
    }
    text
}

/// The lifetime `Expires` gives (counted from `Date`, else from now), for
/// an answer without `Cache-Control: max-age`.
fn expires(expires: &str, date: Option<&str>) -> Option<Duration> {
    let expires = httpdate::parse_http_date(expires).ok()?;
    let from = date.and_then(|d| httpdate::parse_http_date(d).ok()).unwrap_or_else(std::time::SystemTime::now);
    Some(expires.duration_since(from).unwrap_or_default())
}

/// The lifetime `Cache-Control` gives: `max-age` (or `s-maxage`), zero
/// for `no-store` or `no-cache`.
fn max_age(value: &str) -> Option<Duration> {
    let mut age = None;
    for directive in value.split(',').map(str::trim) {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(v) = lower.strip_prefix("max-age=").or_else(|| lower.strip_prefix("s-maxage=")) {
            age = v.trim_matches('"').parse::<u64>().ok().map(Duration::from_secs).or(age);
        }
    }
    age
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_set_with_keys_of_other_kinds_keeps_its_signing_keys() {
        let body = serde_json::json!({"keys": [
            // Keycloak publishes an encryption key beside its signing key.
            {"kty": "RSA", "kid": "enc", "use": "enc", "alg": "RSA-OAEP", "n": "sXch", "e": "AQAB"},
            {"kty": "OKP", "kid": "x", "crv": "X25519", "x": "hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo"},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "EC", "kid": "sig", "alg": "ES256", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "kid": "odd", "alg": "ECDH-ES", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            "not a key",
        ]});
        let keys = signing_keys(body.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref().unwrap()).collect();
        assert_eq!(kids, ["sig"]);
        assert!(keys[0].fits(Algorithm::ES256) && !keys[0].fits(Algorithm::ES384) && !keys[0].fits(Algorithm::RS256));
        assert!(signing_keys(br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).is_err());
        assert!(signing_keys(b"[]").is_err());
    }

    #[test]
    fn cache_control_gives_the_lifetime() {
        assert_eq!(max_age("public, max-age=600"), Some(Duration::from_secs(600)));
        assert_eq!(max_age("s-maxage=60"), Some(Duration::from_secs(60)));
        assert_eq!(max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(max_age("public"), None);
        assert_eq!(max_age("max-age=x"), None);
        let (date, later) = ("Sun, 06 Dec 2026 10:00:00 GMT", "Sun, 06 Dec 2026 10:10:00 GMT");
        assert_eq!(expires(later, Some(date)), Some(Duration::from_secs(600)));
        assert_eq!(expires(date, Some(later)), Some(Duration::ZERO), "already expired");
        assert_eq!(expires("0", Some(date)), None);
    }
}
