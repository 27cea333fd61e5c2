//! End users: access tokens from OpenID Connect issuers (docs/guides/users.md).
//!
//! A token is a JWT checked as RFC 7519, RFC 8725 and RFC 9068 ask: signed
//! by a key of its issuer's JWKS (or, for HS256, the issuer's own secret)
//! with an `alg` the issuer allows and the key fits; `exp`, `nbf` and `iat`
//! within the clock leeway; `iss` one configured issuer exactly; `aud` one
//! of that issuer's audiences; `typ`, when given, `JWT` or `at+jwt`. A
//! `crit` header is refused; `jku`, `x5u`, `jwk` and `x5c` are never
//! followed. A token checked once is remembered until the earlier of its
//! `exp` and the time its key may be relied on, so a key removed from the
//! JWKS stops serving once the cached set expires. Nothing of a token or a
//! key is ever logged.

mod jwks;
pub(crate) mod settings;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::keys::Grant;
pub(crate) use settings::{IssuerConfig, Rate};

/// The longest token taken.
pub(crate) const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Tokens remembered as checked, per instance.
const MAX_CACHED: usize = 10_000;
/// Roles read from one token.
const MAX_ROLES: usize = 256;
/// Keys a token without `kid` is tried against.
const MAX_KEYS_TRIED: usize = 8;

/// A user, as a checked token names them.
#[derive(Debug)]
pub(crate) struct User {
    /// The issuer's URL, as `iss` carries it.
    pub issuer: String,
    /// The issuer's configured name.
    pub issuer_name: String,
    pub subject: String,
    /// The token's roles (mapped or not).
    pub roles: Vec<String>,
    /// Every claim of the token.
    pub claims: Map<String, Value>,
    /// What the roles that map grant.
    pub grants: Vec<Grant>,
    /// Its request rate.
    pub rate: Rate,
    /// Where its roles let it send hooks (URL prefixes).
    pub hooks: Vec<String>,
    /// The token's `exp`.
    pub expires: SystemTime,
}

impl User {
    /// Whether its roles let it send hooks to `url` (as parsed, so that
    /// the host is compared whole).
    pub(crate) fn may_hook(&self, url: &str) -> bool {
        let Ok(url) = url::Url::parse(url) else { return false };
        self.hooks.iter().any(|prefix| url.as_str().starts_with(prefix.as_str()))
    }

    /// What keeps this user's requests apart from everyone else's
    /// (idempotency keys, shares): a digest of issuer and subject.
    pub(crate) fn scope(&self) -> String {
        let digest = Sha256::digest(format!("user\0{}\0{}", self.issuer, self.subject).as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Why a token is refused: its problem code and a description that names
/// no part of the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub code: TokenCode,
    pub detail: String,
    /// The name of the issuer the token's `iss` names, if any.
    pub issuer: Option<String>,
}

/// The reasons a token is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenCode {
    Malformed,
    Expired,
    NotYetValid,
    Audience,
    Issuer,
    Signature,
    Algorithm,
    Type,
    Header,
    Key,
    Claims,
    /// No key can be had from the issuer (a 503, not the token's fault).
    IssuerUnavailable,
}

fn refuse(code: TokenCode, detail: impl Into<String>) -> Refusal {
    Refusal { code, detail: detail.into(), issuer: None }
}

/// Whether `token` has the shape of a JWT (three base64url segments), as
/// an API key must not.
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts[..2].iter().all(|p| !p.is_empty())
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

struct Issuer {
    config: IssuerConfig,
    keys: jwks::KeyCache,
    hs256: Option<DecodingKey>,
}

/// Tokens checked lately, by digest: the user, and until when.
type Checked = HashMap<[u8; 32], (Arc<User>, Instant)>;

/// The configured issuers, their keys, and the tokens checked lately.
pub(crate) struct Issuers {
    by_url: HashMap<String, Issuer>,
    checked: Mutex<Checked>,
}

impl Issuers {
    pub(crate) fn new(configs: &[IssuerConfig], metrics: &Arc<crate::metrics::Metrics>) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("txgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client builds");
        let by_url = configs
            .iter()
            .map(|c| {
                let issuer = Issuer {
                    keys: jwks::KeyCache::new(c, client.clone(), Arc::clone(metrics)),
                    hs256: c.hs256_secret.as_deref().map(|s| DecodingKey::from_secret(s).expect("a secret is a key")),
                    config: c.clone(),
                };
                (c.url.clone(), issuer)
            })
            .collect();
        Self { by_url, checked: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn configs(&self) -> impl Iterator<Item = &IssuerConfig> {
        self.by_url.values().map(|i| &i.config)
    }

    /// Fetch every issuer's keys (at start: the first token waits for
    /// nothing; a provider down is logged, not fatal).
    pub(crate) async fn warm(&self) {
        futures::future::join_all(self.by_url.values().map(|i| i.keys.warm())).await;
    }

    /// The user `token` names, or why it is refused.
    pub(crate) async fn verify(&self, token: &str) -> Result<Arc<User>, Refusal> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(refuse(TokenCode::Malformed, format!("the token is larger than {MAX_TOKEN_BYTES} bytes")));
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.remembered(&digest) {
            return Ok(user);
        }
        let (user, until) = self.check(token).await.map_err(|mut refusal| {
            let iss = token.split('.').nth(1).and_then(|p| URL_SAFE_NO_PAD.decode(p).ok()).and_then(|b| {
                serde_json::from_slice::<Map<String, Value>>(&b).ok()?.get("iss")?.as_str().map(str::to_owned)
            });
            refusal.issuer = iss.and_then(|iss| self.by_url.get(&iss)).map(|i| i.config.name.clone());
            refusal
        })?;
        let user = Arc::new(user);
        let mut checked = self.checked.lock().expect("token cache lock");
        if checked.len() >= MAX_CACHED {
            let now = Instant::now();
            checked.retain(|_, (_, until)| *until > now);
            if checked.len() >= MAX_CACHED {
                checked.clear();
            }
        }
        checked.insert(digest, (Arc::clone(&user), until));
        Ok(user)
    }

    fn remembered(&self, digest: &[u8; 32]) -> Option<Arc<User>> {
        let mut checked = self.checked.lock().expect("token cache lock");
        match checked.get(digest) {
            Some((user, until)) if Instant::now() < *until => Some(Arc::clone(user)),
            Some(_) => {
                checked.remove(digest);
                None
            }
            None => None,
        }
    }

    /// Check `token`: the user, and until when the answer may be reused.
    async fn check(&self, token: &str) -> Result<(User, Instant), Refusal> {
        let malformed = |what: &str| refuse(TokenCode::Malformed, format!("the token is not a JWT: {what}"));
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("it must be three base64url segments"));
        };
        let header: Map<String, Value> = URL_SAFE_NO_PAD
            .decode(header)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| malformed("its header is not base64url JSON"))?;
        let claims: Map<String, Value> = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| malformed("its claims are not base64url JSON"))?;
        let alg_name = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg_name.eq_ignore_ascii_case("none") || alg_name.is_empty() {
            return Err(refuse(TokenCode::Algorithm, "an unsigned token (alg none) is never accepted"));
        }
        if header.contains_key("crit") {
            return Err(refuse(TokenCode::Header, "the token has a crit header: no extension is understood"));
        }
        if let Some(typ) = header.get("typ") {
            let typ = typ.as_str().unwrap_or("").to_ascii_lowercase();
            if !matches!(typ.as_str(), "jwt" | "at+jwt" | "application/at+jwt" | "application/jwt") {
                return Err(refuse(TokenCode::Type, "the token's typ is neither JWT nor at+jwt"));
            }
        }
        let iss = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        let Some(issuer) = self.by_url.get(iss) else {
            return Err(refuse(TokenCode::Issuer, "the token's iss is not a configured issuer"));
        };
        let alg = alg_name
            .parse::<Algorithm>()
            .ok()
            .filter(|a| issuer.config.algorithms.contains(a))
            .ok_or_else(|| refuse(TokenCode::Algorithm, "the issuer's tokens may not use the token's alg"))?;
        let kid = header.get("kid").and_then(Value::as_str);
        let (keys, key_until): (Vec<DecodingKey>, Instant) = if alg == Algorithm::HS256 {
            let secret = issuer.hs256.clone().expect("HS256 is allowed only with a secret");
            (vec![secret], Instant::now() + Duration::from_secs(3600))
        } else {
            match issuer.keys.lookup(kid).await {
                jwks::Lookup::Found(keys, until) => {
                    let fitting: Vec<DecodingKey> =
                        keys.into_iter().filter(|k| k.fits(alg)).map(|k| k.decoding).collect();
                    if fitting.is_empty() {
                        return Err(refuse(TokenCode::Algorithm, "the signing key is not one for the token's alg"));
                    }
                    (fitting, until)
                }
                jwks::Lookup::Unknown => {
                    return Err(refuse(TokenCode::Key, "the issuer's key set holds no key with the token's kid"));
                }
                jwks::Lookup::Unavailable => {
                    return Err(refuse(
                        TokenCode::IssuerUnavailable,
                        format!("the keys of issuer {:?} cannot be fetched; retry later", issuer.config.name),
                    ));
                }
            }
        };
        let mut validation = Validation::new(alg);
        validation.leeway = issuer.config.leeway.as_secs();
        validation.set_issuer(&[&issuer.config.url]);
        validation.set_audience(&issuer.config.audiences);
        // `sub` is checked below (a client's own token may name it by
        // `client_id`).
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        let mut last = None;
        // A token without `kid` is tried against a few keys at most: a
        // refused token costs a bounded number of signature checks.
        for key in keys.iter().take(MAX_KEYS_TRIED) {
            match jsonwebtoken::decode::<Value>(token, key, &validation) {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(match e.kind() {
                ErrorKind::ExpiredSignature => refuse(TokenCode::Expired, "the token has expired"),
                ErrorKind::ImmatureSignature => refuse(TokenCode::NotYetValid, "the token is not valid yet (nbf)"),
                ErrorKind::InvalidAudience | ErrorKind::MissingRequiredClaim(_) if !claims.contains_key("aud") => {
                    refuse(TokenCode::Audience, "the token names no audience")
                }
                ErrorKind::InvalidAudience => refuse(TokenCode::Audience, "the token is not for txgate's audience"),
                ErrorKind::InvalidIssuer => refuse(TokenCode::Issuer, "the token's iss is not the issuer's"),
                ErrorKind::InvalidSignature => refuse(TokenCode::Signature, "the token's signature does not verify"),
                ErrorKind::InvalidAlgorithm => refuse(TokenCode::Algorithm, "the signing key is not one for the alg"),
                ErrorKind::MissingRequiredClaim(claim) => {
                    refuse(TokenCode::Claims, format!("the token has no {claim} claim"))
                }
                ErrorKind::InvalidClaimFormat(claim) => {
                    refuse(TokenCode::Claims, format!("the token's {claim} claim is malformed"))
                }
                _ => malformed("it cannot be decoded"),
            });
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let leeway = issuer.config.leeway.as_secs();
        // NumericDates may have fractions (RFC 7519 §2).
        match claims.get("iat") {
            None => {}
            Some(iat) => match iat.as_f64() {
                Some(iat) if iat <= (now + leeway) as f64 => {}
                Some(_) => return Err(refuse(TokenCode::NotYetValid, "the token was issued in the future (iat)")),
                None => return Err(refuse(TokenCode::Claims, "the token's iat claim is malformed")),
            },
        }
        // The subject; a token a client got for itself (client credentials)
        // may name it only as `client_id` (RFC 9068 §2.2).
        let subject = match claims.get("sub").or_else(|| claims.get("client_id")) {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 255 => s.clone(),
            None => return Err(refuse(TokenCode::Claims, "the token has no sub claim")),
            Some(_) => {
                return Err(refuse(TokenCode::Claims, "the token's sub must be a string of 1 to 255 characters"));
            }
        };
        // Within a year: no instant computed from it can overflow.
        let exp = claims.get("exp").and_then(Value::as_f64).map_or(now, |e| e.max(0.0) as u64).min(now + 366 * 86_400);
        let roles = roles_of(&claims, &issuer.config.roles_claim);
        let config = &issuer.config;
        let grants: Vec<Grant> = roles.iter().filter_map(|r| config.roles.get(r)).flatten().cloned().collect();
        let rate = roles
            .iter()
            .filter_map(|r| config.rates.get(r))
            .copied()
            .max_by(|a, b| a.per_second().total_cmp(&b.per_second()))
            .unwrap_or(config.rate);
        let mut hooks: Vec<String> = roles.iter().filter_map(|r| config.hooks.get(r)).flatten().cloned().collect();
        hooks.sort();
        hooks.dedup();
        let expires = UNIX_EPOCH + Duration::from_secs(exp);
        let until = key_until.min(Instant::now() + Duration::from_secs(exp.saturating_sub(now)));
        Ok((
            User {
                issuer: config.url.clone(),
                issuer_name: config.name.clone(),
                subject,
                roles,
                claims,
                grants,
                rate,
                hooks,
                expires,
            },
            until,
        ))
    }
}

/// The roles at `path`: a claim of that name, or else a dotted path into
/// nested objects; an array of strings, or a string of space-separated
/// names.
fn roles_of(claims: &Map<String, Value>, path: &str) -> Vec<String> {
    let value = claims.get(path).or_else(|| {
        let mut parts = path.split('.');
        let mut at = claims.get(parts.next()?)?;
        for part in parts {
            at = at.as_object()?.get(part)?;
        }
        Some(at)
    });
    let mut roles: Vec<String> = match value {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    roles.truncate(MAX_ROLES);
    roles
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_found_by_name_or_path() {
        let claims: Map<String, Value> = serde_json::from_value(serde_json::json!({
            "roles": ["a", "b", 3],
            "realm_access": {"roles": ["shopper"]},
            "https://example.com/roles": ["ns"],
            "scope": "read write",
        }))
        .unwrap();
        assert_eq!(roles_of(&claims, "roles"), ["a", "b"]);
        assert_eq!(roles_of(&claims, "realm_access.roles"), ["shopper"]);
        assert_eq!(roles_of(&claims, "https://example.com/roles"), ["ns"]);
        assert_eq!(roles_of(&claims, "scope"), ["read", "write"]);
        assert!(roles_of(&claims, "missing.path").is_empty());
    }

    #[test]
    fn jwt_shapes() {
        assert!(looks_like_jwt("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.abc-_"));
        assert!(looks_like_jwt("a.b.c"));
        assert!(!looks_like_jwt("abcdefghijklmnop"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt("a b.c.d"));
    }
}
