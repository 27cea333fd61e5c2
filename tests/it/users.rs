//! End users' access tokens over HTTP: an issuer served by the test
//! (discovery and a JWKS it can rotate, slow down or take down), tokens
//! signed in-process, hostile tokens, streams that outlive a token, and
//! per-user limits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Method;
use serde_json::{Value, json};
use txgate::config::IssuerEntry;

use crate::support::{Backend, SseStream, TestApp, expect, expect_problem};

const AUDIENCE: &str = "txgate-api";

/// A signing key of the test's issuer.
#[derive(Clone)]
pub(crate) struct Signer {
    kid: &'static str,
    alg: Algorithm,
    pem: &'static [u8],
}

pub(crate) const RSA_A: Signer =
    Signer { kid: "rsa-a", alg: Algorithm::RS256, pem: include_bytes!("../fixtures/tokens/rsa-a.pem") };
const RSA_B: Signer =
    Signer { kid: "rsa-b", alg: Algorithm::RS256, pem: include_bytes!("../fixtures/tokens/rsa-b.pem") };
const EC: Signer =
    Signer { kid: "ec-p256", alg: Algorithm::ES256, pem: include_bytes!("../fixtures/tokens/ec-p256.pem") };
const ED: Signer =
    Signer { kid: "ed25519", alg: Algorithm::EdDSA, pem: include_bytes!("../fixtures/tokens/ed25519.pem") };

impl Signer {
    fn encoding(&self) -> EncodingKey {
        match self.alg {
            Algorithm::RS256 | Algorithm::PS256 => EncodingKey::from_rsa_pem(self.pem).unwrap(),
            Algorithm::ES256 => EncodingKey::from_ec_pem(self.pem).unwrap(),
            _ => EncodingKey::from_ed_pem(self.pem).unwrap(),
        }
    }

    /// The public JWK, as a provider publishes it.
    fn jwk(&self) -> Value {
        let mut jwk =
            serde_json::to_value(jsonwebtoken::jwk::Jwk::from_encoding_key(&self.encoding(), self.alg).unwrap())
                .unwrap();
        jwk["kid"] = json!(self.kid);
        jwk["use"] = json!("sig");
        jwk
    }

    pub(crate) fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_owned());
        header.typ = Some("at+jwt".to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding()).unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// What the test issuer serves.
#[derive(Default)]
struct Served {
    keys: Vec<Value>,
    /// The `Cache-Control` of the JWKS.
    cache: Option<String>,
    /// Answers 503 to everything.
    down: bool,
    /// Never answers the JWKS (a provider that hangs).
    hang: bool,
    /// What discovery names as the issuer (default: its own URL).
    claims_issuer: Option<String>,
    discovery_fetches: usize,
    jwks_fetches: usize,
}

/// An OpenID Connect issuer the test runs: discovery and a JWKS.
pub(crate) struct Issuer {
    url: String,
    served: Arc<Mutex<Served>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Issuer {
    pub(crate) async fn start(keys: &[&Signer]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/realms/shop", listener.local_addr().unwrap());
        let served =
            Arc::new(Mutex::new(Served { keys: keys.iter().map(|k| k.jwk()).collect(), ..Default::default() }));
        let (state, own) = (Arc::clone(&served), url.clone());
        let app = axum::Router::new()
            .route(
                "/realms/shop/.well-known/openid-configuration",
                axum::routing::get({
                    let (state, own) = (Arc::clone(&state), own.clone());
                    move || {
                        let (state, own) = (Arc::clone(&state), own.clone());
                        async move {
                            let mut s = state.lock().unwrap();
                            s.discovery_fetches += 1;
                            if s.down {
                                return (axum::http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({})));
                            }
                            let issuer = s.claims_issuer.clone().unwrap_or_else(|| own.clone());
                            let body = json!({"issuer": issuer, "jwks_uri": format!("{own}/jwks")});
                            (axum::http::StatusCode::OK, axum::Json(body))
                        }
                    }
                }),
            )
            .route(
                "/realms/shop/jwks",
                axum::routing::get(move || {
                    let state = Arc::clone(&state);
                    async move {
                        let hang = {
                            let mut s = state.lock().unwrap();
                            s.jwks_fetches += 1;
                            s.hang
                        };
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        let s = state.lock().unwrap();
                        if s.down {
                            return axum::response::IntoResponse::into_response(
                                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            );
                        }
                        let mut response =
                            axum::response::IntoResponse::into_response(axum::Json(json!({"keys": s.keys})));
                        if let Some(cache) = &s.cache {
                            response.headers_mut().insert("cache-control", cache.parse().unwrap());
                        }
                        response
                    }
                }),
            );
        let stop = tokio_util::sync::CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(async move { until.cancelled().await }).await.unwrap();
        });
        Self { url, served, stop }
    }

    fn served(&self) -> std::sync::MutexGuard<'_, Served> {
        self.served.lock().unwrap()
    }

    /// This issuer as the gateway is configured with it.
    pub(crate) fn entry(&self) -> IssuerEntry {
        IssuerEntry {
            url: self.url.clone(),
            name: Some("shop".into()),
            audiences: vec![AUDIENCE.into()],
            roles_claim: Some("realm_access.roles".into()),
            roles: [
                ("shopper".to_owned(), "read@products+write@carts".to_owned()),
                ("support".to_owned(), "read".to_owned()),
            ]
            .into(),
            ..Default::default()
        }
    }

    /// A valid token for `subject` with `roles`, signed by the first key.
    fn token(&self, subject: &str, roles: &[&str]) -> String {
        RSA_A.sign(&self.claims(subject, roles))
    }

    /// The claims of a valid token for `subject` with `roles`.
    pub(crate) fn claims(&self, subject: &str, roles: &[&str]) -> Value {
        json!({
            "iss": self.url, "sub": subject, "aud": [AUDIENCE, "account"],
            "iat": now(), "exp": now() + 300, "realm_access": {"roles": roles},
            "email": format!("{subject}@example.com"),
        })
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn gateway(issuer: &Issuer, tweak: impl FnOnce(&mut IssuerEntry)) -> TestApp {
    gateway_on(Backend::Embedded, issuer, tweak).await.unwrap()
}

/// A gateway on `backend` (`None` only when MongoDB tests are skipped).
async fn gateway_on(backend: Backend, issuer: &Issuer, tweak: impl FnOnce(&mut IssuerEntry)) -> Option<TestApp> {
    let mut entry = issuer.entry();
    tweak(&mut entry);
    let resolved = entry.resolve(1).unwrap();
    TestApp::spawn_with(backend, move |c| c.issuers = vec![resolved]).await
}

fn as_user(app: &TestApp, method: Method, path: &str, token: &str) -> reqwest::RequestBuilder {
    app.request(method, path).bearer_auth(token)
}

/// A token assembled by hand: `header` and `claims` as given, signed (or
/// not) as `sign` says.
fn forged(header: &Value, claims: &Value, sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
    let head = URL_SAFE_NO_PAD.encode(serde_json::to_vec(header).unwrap());
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap());
    let input = format!("{head}.{body}");
    let signature = URL_SAFE_NO_PAD.encode(sign(input.as_bytes()));
    format!("{input}.{signature}")
}

fn hmac(secret: &[u8], input: &[u8]) -> Vec<u8> {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(input);
    mac.finalize().into_bytes().to_vec()
}

#[tokio::test]
async fn a_users_token_names_who_acts_and_grants_what_their_roles_map_to() {
    let issuer = Issuer::start(&[&RSA_A, &EC, &ED]).await;
    let app = gateway(&issuer, |_| {}).await;
    let ann = issuer.token("ann", &["shopper"]);
    // A write the role grants, recorded as the user's.
    let res = as_user(&app, Method::POST, "/v1/collections/carts/documents", &ann)
        .json(&json!({"_id": "c1", "items": 1}))
        .send()
        .await
        .unwrap();
    expect(res, 201).await;
    // A write it does not: 403, and the challenge says so.
    let res = as_user(&app, Method::POST, "/v1/collections/products/documents", &ann)
        .json(&json!({"_id": "p1"}))
        .send()
        .await
        .unwrap();
    let p = expect_problem(res, 403, "forbidden").await;
    assert!(p["detail"].as_str().unwrap().contains("user's roles"), "{p}");
    // Who am I.
    let me = expect(as_user(&app, Method::GET, "/v1/me", &ann).send().await.unwrap(), 200).await;
    assert_eq!(me["kind"], "user");
    assert_eq!(me["issuer"], issuer.url);
    assert_eq!(me["subject"], "ann");
    assert_eq!(me["roles"], json!(["shopper"]));
    assert_eq!(me["grants"], json!(["read@products", "write@carts"]));
    assert_eq!(me["claims"]["email"], "ann@example.com");
    // The event names the user, never the token.
    let page = expect(
        as_user(&app, Method::GET, "/v1/events?collections=carts", &ann)
            .header("accept", "application/json")
            .send()
            .await
            .unwrap(),
        200,
    )
    .await;
    let event = &page["items"][0];
    assert_eq!(event["actor"], json!({"kind": "user", "issuer": issuer.url, "subject": "ann"}), "{event}");
    assert!(event.get("key").is_none(), "{event}");
    assert!(!page.to_string().contains(&ann[..20]));
    // A transaction's events too.
    let res = as_user(&app, Method::POST, "/v1/transactions", &ann)
        .json(&json!({"actions": [{"op": "insert", "collection": "carts", "id": "c2", "data": {"items": 2}}]}))
        .send()
        .await
        .unwrap();
    expect(res, 200).await;
    app.settled().await;
    let page = expect(
        as_user(&app, Method::GET, "/v1/events?collections=carts", &ann)
            .header("accept", "application/json")
            .send()
            .await
            .unwrap(),
        200,
    )
    .await;
    let items = page["items"].as_array().unwrap();
    assert!(items.len() >= 2, "{page}");
    for event in items {
        assert_eq!(event["actor"]["subject"], "ann", "{event}");
    }
    // EC and EdDSA keys of the same issuer sign too.
    for signer in [&EC, &ED] {
        let token = signer.sign(&issuer.claims("bob", &["support"]));
        let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/c1", &token).send().await.unwrap();
        expect(res, 200).await;
    }
    // A client's own token may name it by `client_id` alone, and
    // NumericDates may have fractions.
    let mut claims = issuer.claims("-", &["support"]);
    claims.as_object_mut().unwrap().remove("sub");
    claims["client_id"] = json!("svc-7");
    claims["iat"] = json!(now() as f64 - 0.5);
    claims["exp"] = json!(now() as f64 + 60.25);
    let me = expect(as_user(&app, Method::GET, "/v1/me", &RSA_A.sign(&claims)).send().await.unwrap(), 200).await;
    assert_eq!(me["subject"], "svc-7");
    // A user whose roles map to nothing: 403 everywhere, and said so.
    let nobody = issuer.token("cy", &["guest"]);
    let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/c1", &nobody).send().await.unwrap();
    let challenge = res.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(challenge.contains("insufficient_scope"), "{challenge}");
    expect_problem(res, 403, "forbidden").await;
    // No credential at all: 401 with a bare challenge.
    let res = app.get("/v1/collections/carts/documents/c1").await;
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    expect_problem(res, 401, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn idempotency_keys_are_kept_apart_per_user() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(&issuer, |_| {}).await;
    let ann = issuer.token("ann", &["shopper"]);
    let bob = issuer.token("bob", &["shopper"]);
    let body = |id: &str| json!({"actions": [{"op": "insert", "collection": "carts", "id": id, "data": {}}]});
    let send = |token: &str, id: &str| {
        as_user(&app, Method::POST, "/v1/transactions", token).header("idempotency-key", "k-1").json(&body(id)).send()
    };
    let first = expect(send(&ann, "a").await.unwrap(), 200).await;
    // Bob's same key is his own: a new transaction, not Ann's answer.
    let other = expect(send(&bob, "b").await.unwrap(), 200).await;
    assert_ne!(first["id"], other["id"]);
    // Ann's retry is answered again.
    let again = expect(send(&ann, "a").await.unwrap(), 200).await;
    assert_eq!(first["id"], again["id"]);
    app.stop().await;
}

#[tokio::test]
async fn hostile_tokens_are_refused_each_with_its_code_and_never_a_5xx() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    // Something a token's headers point at: never contacted.
    let lure = crate::support::TestReceiver::start().await;
    let app = gateway(&issuer, |_| {}).await;
    let good = issuer.claims("ann", &["shopper"]);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = good.clone();
        f(&mut c);
        c
    };
    let rsa_public = {
        // The issuer's public key, as an attacker would use it for a secret.
        let jwk = RSA_A.jwk();
        jwk["n"].as_str().unwrap().as_bytes().to_vec()
    };
    let header = |alg: &str| json!({"alg": alg, "kid": "rsa-a", "typ": "JWT"});
    let sign_rsa = |header: &Header, claims: &Value| jsonwebtoken::encode(header, claims, &RSA_A.encoding()).unwrap();
    let mut jku = Header::new(Algorithm::RS256);
    jku.kid = Some("elsewhere".into());
    jku.jku = Some(lure.url("/jwks"));
    let mut x5u = Header::new(Algorithm::RS256);
    x5u.kid = Some("elsewhere".into());
    x5u.x5u = Some(lure.url("/cert"));
    let mut wrong_typ = Header::new(Algorithm::RS256);
    wrong_typ.kid = Some("rsa-a".into());
    wrong_typ.typ = Some("id_token+jwt".into());
    let cases: Vec<(&str, String, &str)> = vec![
        ("alg none", forged(&json!({"alg": "none", "typ": "JWT"}), &good, |_| Vec::new()), "token_algorithm"),
        ("alg None", forged(&json!({"alg": "None"}), &good, |_| Vec::new()), "token_algorithm"),
        (
            "the RSA key as an HS256 secret",
            forged(&header("HS256"), &good, |i| hmac(&rsa_public, i)),
            "token_algorithm",
        ),
        ("another issuer", RSA_A.sign(&with(&|c| c["iss"] = json!("https://evil.example"))), "token_issuer"),
        ("another audience", RSA_A.sign(&with(&|c| c["aud"] = json!("console-client"))), "token_audience"),
        ("no audience", RSA_A.sign(&with(&|c| drop(c.as_object_mut().unwrap().remove("aud")))), "token_audience"),
        ("expired", RSA_A.sign(&with(&|c| c["exp"] = json!(now() - 120))), "token_expired"),
        ("not yet valid", RSA_A.sign(&with(&|c| c["nbf"] = json!(now() + 600))), "token_not_yet_valid"),
        ("issued in the future", RSA_A.sign(&with(&|c| c["iat"] = json!(now() + 600))), "token_not_yet_valid"),
        ("no subject", RSA_A.sign(&with(&|c| drop(c.as_object_mut().unwrap().remove("sub")))), "token_claims"),
        ("no expiry", RSA_A.sign(&with(&|c| drop(c.as_object_mut().unwrap().remove("exp")))), "token_claims"),
        ("a key it does not hold", RSA_B.sign(&good), "token_key"),
        ("jku elsewhere", sign_rsa(&jku, &good), "token_key"),
        ("x5u elsewhere", sign_rsa(&x5u, &good), "token_key"),
        (
            "crit",
            forged(&json!({"alg": "RS256", "kid": "rsa-a", "crit": ["exp"], "exp": 1}), &good, |_| vec![1, 2, 3]),
            "token_header",
        ),
        ("typ of an ID token", sign_rsa(&wrong_typ, &good), "token_type"),
        ("oversized", format!("{}.{}.{}", "a".repeat(5000), "b".repeat(5000), "c"), "token_malformed"),
        ("not JSON", "bm90.anNvbg.c2ln".to_owned(), "token_malformed"),
    ];
    // A signature made by another key over the same header and claims.
    let tampered = {
        let token = RSA_A.sign(&good);
        let other = RSA_B.sign(&good);
        let (head_body, _) = token.rsplit_once('.').unwrap();
        let (_, signature) = other.rsplit_once('.').unwrap();
        format!("{head_body}.{signature}")
    };
    let mut cases = cases;
    cases.push(("signed by another key", tampered, "token_signature"));
    for (name, token, code) in cases {
        let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &token).send().await.unwrap();
        let challenge = res.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned());
        let status = res.status().as_u16();
        let body: Value = res.json().await.unwrap();
        assert_eq!((status, body["code"].as_str()), (401, Some(code)), "{name}: {body}");
        let challenge = challenge.unwrap_or_default();
        assert!(challenge.starts_with("Bearer error=\"invalid_token\""), "{name}: {challenge}");
        assert!(!body.to_string().contains(&token[token.len().saturating_sub(16)..]), "{name}: {body}");
    }
    assert!(lure.collect_for(Duration::from_millis(200)).await.is_empty(), "a token's jku or x5u was followed");
    // Counted by issuer and code, for an operator's alerts.
    let support = issuer.token("sam", &["support"]);
    let metrics = as_user(&app, Method::GET, "/metrics", &support).send().await.unwrap().text().await.unwrap();
    let count = |issuer: &str, code: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("txgate_token_refusals_total{")
                    && l.contains(&format!("issuer=\"{issuer}\""))
                    && l.contains(&format!("code=\"{code}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(count("shop", "token_expired"), Some(1), "{metrics}");
    assert_eq!(count("shop", "token_algorithm"), Some(3), "{metrics}");
    assert_eq!(count("unknown", "token_issuer"), Some(1), "{metrics}");
    // The good token still works after all that.
    let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &RSA_A.sign(&good)).send().await.unwrap();
    expect_problem(res, 404, "not_found").await;
    app.stop().await;
}

#[tokio::test]
async fn hs256_is_taken_only_with_the_issuers_own_secret() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let secret = "an-issuer-secret-of-at-least-32-bytes!";
    let app = gateway(&issuer, |e| {
        e.algorithms = Some(vec!["RS256".into(), "HS256".into()]);
        e.hs256_secret = Some(txgate::config::IssuerSecret(secret.into()));
    })
    .await;
    let claims = issuer.claims("ann", &["shopper"]);
    let header = json!({"alg": "HS256", "typ": "JWT"});
    let own = forged(&header, &claims, |i| hmac(secret.as_bytes(), i));
    let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &own).send().await.unwrap();
    expect_problem(res, 404, "not_found").await;
    // The public RSA key as the secret: not the issuer's secret.
    let n = RSA_A.jwk()["n"].as_str().unwrap().to_owned();
    let forged_token = forged(&json!({"alg": "HS256", "kid": "rsa-a"}), &claims, |i| hmac(n.as_bytes(), i));
    let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &forged_token).send().await.unwrap();
    expect_problem(res, 401, "token_signature").await;
    app.stop().await;
}

#[tokio::test]
async fn keys_rotate_without_a_restart_and_a_removed_key_stops_once_its_cache_expires() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    issuer.served().cache = Some("max-age=1".into());
    let app = gateway(&issuer, |e| {
        e.keys_min_cache_secs = Some(1);
        e.keys_refetch_secs = Some(2);
    })
    .await;
    let read = |token: String| {
        let req = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &token);
        async move {
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            let body: Value = res.json().await.unwrap();
            (status, body["code"].as_str().unwrap_or_default().to_owned())
        }
    };
    let old = issuer.token("ann", &["shopper"]);
    assert_eq!(read(old.clone()).await, (404, "not_found".into()));
    // A new key appears: its tokens are taken at once (one fetch for the
    // unknown kid).
    issuer.served().keys.push(RSA_B.jwk());
    let fetches = issuer.served().jwks_fetches;
    let new = RSA_B.sign(&issuer.claims("ann", &["shopper"]));
    assert_eq!(read(new.clone()).await, (404, "not_found".into()));
    assert_eq!(issuer.served().jwks_fetches, fetches + 1);
    // Unknown kids do not make the gateway fetch on every request.
    let fetches = issuer.served().jwks_fetches;
    for n in 0..20 {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(format!("made-up-{n}"));
        let token = jsonwebtoken::encode(&header, &issuer.claims("ann", &["shopper"]), &RSA_A.encoding()).unwrap();
        assert_eq!(read(token).await.1, "token_key");
    }
    // (The set's own one-second lifetime may bring a fetch or two.)
    assert!(issuer.served().jwks_fetches <= fetches + 2, "{} fetches", issuer.served().jwks_fetches - fetches);
    // The old key is removed: once the cached set expires, its tokens (even
    // one checked before) are refused; the new key's still serve.
    issuer.served().keys.retain(|k| k["kid"] != "rsa-a");
    // The key cache runs on the wall clock (its lifetime is the JWKS
    // answer's max-age of one second).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut refused = false;
    while !refused && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        refused = read(old.clone()).await == (401, "token_key".into());
    }
    assert!(refused, "the removed key's token kept serving");
    assert_eq!(read(new).await, (404, "not_found".into()));
    app.stop().await;
}

#[tokio::test]
async fn the_last_good_keys_serve_while_the_provider_is_down() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    issuer.served().cache = Some("max-age=1".into());
    let app = gateway(&issuer, |e| e.keys_min_cache_secs = Some(1)).await;
    let token = issuer.token("ann", &["shopper"]);
    let status = |token: String| {
        let req = as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &token);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(token.clone()).await, 404);
    issuer.served().down = true;
    // Past the keys' lifetime, with the provider failing: still served.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        let fresh = issuer.token("ann", &["shopper"]);
        assert_eq!(status(fresh).await, 404);
    }
    assert_eq!(status(token).await, 404);
    app.stop().await;
    // A gateway that never had the keys: 503 with Retry-After, not a 401
    // blaming the token and not a 500.
    let app = gateway(&issuer, |_| {}).await;
    let res =
        as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &issuer.token("a", &[])).send().await.unwrap();
    assert!(res.headers().contains_key("retry-after"));
    expect_problem(res, 503, "issuer_unavailable").await;
    app.stop().await;
}

#[tokio::test]
async fn discovery_naming_another_issuer_is_refused() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    issuer.served().claims_issuer = Some("https://evil.example/realms/shop".into());
    let app = gateway(&issuer, |_| {}).await;
    let res =
        as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &issuer.token("a", &[])).send().await.unwrap();
    expect_problem(res, 503, "issuer_unavailable").await;
    assert_eq!(issuer.served().jwks_fetches, 0, "keys were fetched from a discovery document naming another issuer");
    app.stop().await;
}

/// A gateway that takes tokens without leeway, and two of Ann's tokens:
/// one that expires in 3 s, one in 5 minutes.
async fn expiring(issuer: &Issuer) -> (TestApp, String, String) {
    let app = gateway(issuer, |e| {
        e.leeway_secs = Some(0);
        e.rate = Some("10000/s".into());
    })
    .await;
    let token_for = |secs: u64| {
        let mut claims = issuer.claims("ann", &["shopper"]);
        claims["exp"] = json!(now() + secs);
        RSA_A.sign(&claims)
    };
    (app, token_for(3), token_for(300))
}

async fn write_cart(app: &TestApp, token: &str, n: usize) {
    let res = as_user(app, Method::POST, "/v1/collections/carts/documents", token)
        .json(&json!({"_id": format!("c{n}")}))
        .send()
        .await
        .unwrap();
    expect(res, 201).await;
}

/// Carts c1, c2… written with `token` while `stream` runs, each seen on
/// it, until it sends `reauth` and ends: the documents seen, and the
/// `reauth`.
async fn until_reauth(app: &TestApp, token: &str, stream: &mut SseStream) -> (Vec<String>, crate::support::SseEvent) {
    let mut seen = Vec::new();
    loop {
        write_cart(app, token, seen.len() + 1).await;
        let event = stream.next(Duration::from_secs(10)).await.expect("an event or reauth");
        if event.event.as_deref() == Some("reauth") {
            assert_eq!(event.data["reason"], "token_expired");
            assert!(stream.ended(Duration::from_secs(5)).await, "the stream ends after reauth");
            return (seen, event);
        }
        seen.push(event.data["document"].as_str().unwrap().to_owned());
    }
}

/// The rest of the carts, from a stream resumed after a `reauth`.
async fn resumed(stream: &mut SseStream, seen: &mut Vec<String>, total: usize) {
    while seen.len() < total {
        let event = stream.next(Duration::from_secs(10)).await.expect("every event");
        seen.push(event.data["document"].as_str().unwrap().to_owned());
    }
    assert_eq!(*seen, (1..=total).map(|i| format!("c{i}")).collect::<Vec<_>>(), "every event once, in order");
}

#[tokio::test]
async fn a_stream_opened_with_a_token_ends_at_its_expiry_with_reauth_and_resumes_without_loss() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let (app, short, long) = expiring(&issuer).await;
    let url = format!("{}/v1/events?collections=carts", app.base);
    let mut stream = SseStream::try_open(reqwest::Client::new().get(&url).bearer_auth(&short)).await.unwrap();
    let (mut seen, reauth) = until_reauth(&app, &long, &mut stream).await;
    // Writes go on past its end.
    let n = seen.len() + 1;
    for more in n + 1..n + 4 {
        write_cart(&app, &long, more).await;
    }
    // A new stream from the last id seen: every event once, in order.
    let last = reauth.data["last_event_id"].as_str().unwrap().to_owned();
    let mut again =
        SseStream::try_open(reqwest::Client::new().get(&url).bearer_auth(&long).header("last-event-id", last))
            .await
            .unwrap();
    resumed(&mut again, &mut seen, n + 3).await;
    // An expired token cannot open one.
    let expired = {
        let mut claims = issuer.claims("ann", &["shopper"]);
        claims["exp"] = json!(now() - 5);
        RSA_A.sign(&claims)
    };
    assert_eq!(SseStream::try_open(reqwest::Client::new().get(&url).bearer_auth(&expired)).await.err(), Some(401));
    app.stop().await;
}

#[tokio::test]
async fn one_users_flood_is_limited_while_another_user_is_served() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(&issuer, |e| {
        e.rate = Some("5/min".into());
        e.rates = [("support".to_owned(), "100/s".to_owned())].into();
    })
    .await;
    let ann = issuer.token("ann", &["shopper"]);
    let bob = issuer.token("bob", &["shopper"]);
    let agent = issuer.token("sam", &["support"]);
    let get = |token: &str| as_user(&app, Method::GET, "/v1/collections/carts/documents/x", token).send();
    for left in (0..5).rev() {
        let res = get(&ann).await.unwrap();
        assert_eq!(res.status(), 404);
        assert_eq!(res.headers()["ratelimit-policy"], "\"caller\";q=5;w=60");
        assert_eq!(res.headers()["ratelimit"].to_str().unwrap(), format!("\"caller\";r={left};t=0"));
    }
    let res = get(&ann).await.unwrap();
    let retry: u64 = res.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=12).contains(&retry), "{retry}");
    assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"caller\";r=0;t="));
    expect_problem(res, 429, "rate_limited").await;
    // Another user is served; a role with a higher rate has it.
    assert_eq!(get(&bob).await.unwrap().status(), 404);
    for _ in 0..20 {
        assert_eq!(get(&agent).await.unwrap().status(), 404);
    }
    app.stop().await;
}

/// Ask `app` for a ticket with `token` for `body`.
async fn ticket(app: &TestApp, token: &str, body: Value) -> Value {
    let res = as_user(app, Method::POST, "/v1/events/tickets", token).json(&body).send().await.unwrap();
    expect(res, 201).await
}

async fn open(app: &TestApp, url: &str) -> Result<SseStream, u16> {
    SseStream::try_open(reqwest::Client::new().get(format!("{}{url}", app.base))).await
}

#[tokio::test]
async fn a_ticket_opens_its_stream_once_and_no_other() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(&issuer, |_| {}).await;
    let ann = issuer.token("ann", &["shopper"]);
    let write = |id: &str| {
        as_user(&app, Method::POST, "/v1/collections/carts/documents", &ann).json(&json!({"_id": id})).send()
    };
    expect(write("c0").await.unwrap(), 201).await;
    let t = ticket(&app, &ann, json!({"collections": "carts", "after": "0"})).await;
    let url = t["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with("/v1/events?collections=carts&ticket="), "{url}");
    assert!(t["expires_at"].as_str().unwrap().ends_with('Z'));
    // No Authorization header: the ticket stands in for it, and the
    // stream starts after the ticket's `after`.
    let mut stream = open(&app, &url).await.unwrap();
    let first = stream.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(first.data["document"], "c0");
    assert_eq!(first.data["actor"]["subject"], "ann");
    // Used: refused, whichever way.
    let res = app.get(&url).await;
    expect_problem(res, 401, "ticket_invalid").await;
    drop(stream);
    // Another stream than the one it was asked for: refused.
    let t = ticket(&app, &ann, json!({"collections": "carts"})).await;
    let ticket_only = format!("/v1/events?ticket={}", t["ticket"].as_str().unwrap());
    expect_problem(app.get(&ticket_only).await, 401, "ticket_invalid").await;
    let t = ticket(&app, &ann, json!({"collections": "carts"})).await;
    let elsewhere = format!("/v1/events?collections=products&ticket={}", t["ticket"].as_str().unwrap());
    expect_problem(app.get(&elsewhere).await, 401, "ticket_invalid").await;
    // Past its minute: refused.
    let t = ticket(&app, &ann, json!({"collections": "carts"})).await;
    app.advance(Duration::from_secs(61));
    expect_problem(app.get(t["url"].as_str().unwrap()).await, 401, "ticket_invalid").await;
    // Made up: refused.
    expect_problem(app.get(&format!("/v1/events?ticket={}", "A".repeat(43))).await, 401, "ticket_invalid").await;
    expect_problem(app.get("/v1/events?ticket=x").await, 401, "ticket_invalid").await;
    // A ticket for collections the user may not read is not issued.
    let res = as_user(&app, Method::POST, "/v1/events/tickets", &ann)
        .json(&json!({"collections": "payments"}))
        .send()
        .await
        .unwrap();
    expect_problem(res, 403, "forbidden").await;
    let res = as_user(&app, Method::POST, "/v1/events/tickets", &ann).json(&json!({"nope": 1})).send().await.unwrap();
    expect_problem(res, 422, "validation_failed").await;
    app.stop().await;
}

/// Two instances on one store race to open a stream with each ticket:
/// one does.
async fn a_ticket_opens_one_stream_across_instances(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let Some(first) = gateway_on(backend, &issuer, |_| {}).await else { return };
    let config = first.config.clone();
    let second = TestApp::on_store(config, std::sync::Arc::clone(&first.store), None).await;
    let ann = issuer.token("ann", &["shopper"]);
    for _ in 0..10 {
        let t = ticket(&first, &ann, json!({"collections": "carts"})).await;
        let url = t["url"].as_str().unwrap().to_owned();
        let (a, b) = tokio::join!(open(&first, &url), open(&second, &url));
        assert_eq!([a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count(), 1, "{:?} {:?}", a.err(), b.err());
    }
    second.stop().await;
    first.stop().await;
}

#[tokio::test]
async fn a_ticket_opens_one_stream_across_embedded_instances() {
    a_ticket_opens_one_stream_across_instances(Backend::Embedded).await;
}

#[tokio::test]
async fn a_ticket_opens_one_stream_across_mongodb_instances() {
    a_ticket_opens_one_stream_across_instances(Backend::Mongodb).await;
}

#[tokio::test]
async fn a_ticketed_stream_ends_at_the_tokens_expiry_and_a_new_ticket_misses_nothing() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let (app, short, long) = expiring(&issuer).await;
    let t = ticket(&app, &short, json!({"collections": "carts"})).await;
    let spare = ticket(&app, &short, json!({"collections": "carts"})).await;
    let mut stream = open(&app, t["url"].as_str().unwrap()).await.unwrap();
    let (mut seen, reauth) = until_reauth(&app, &long, &mut stream).await;
    let n = seen.len() + 1;
    write_cart(&app, &long, n + 1).await;
    // A ticket asked for with the token is no good once it has expired,
    // though within its minute.
    expect_problem(app.get(spare["url"].as_str().unwrap()).await, 401, "ticket_invalid").await;
    // The client asks for a new ticket (with a new token) from the last id.
    let last = reauth.data["last_event_id"].as_str().unwrap();
    let t = ticket(&app, &long, json!({"collections": "carts", "after": last})).await;
    let mut again = open(&app, t["url"].as_str().unwrap()).await.unwrap();
    resumed(&mut again, &mut seen, n + 1).await;
    app.stop().await;
}

#[tokio::test]
async fn several_issuers_are_told_apart_by_iss() {
    let shop = Issuer::start(&[&RSA_A]).await;
    let partners = Issuer::start(&[&EC]).await;
    let mut second = partners.entry();
    second.name = Some("partners".into());
    second.roles = [("shopper".to_owned(), "read@products".to_owned())].into();
    let second = second.resolve(2).unwrap();
    let first = shop.entry().resolve(1).unwrap();
    let app = TestApp::spawn_with(Backend::Embedded, move |c| c.issuers = vec![first, second]).await.unwrap();
    let write =
        |token: String| as_user(&app, Method::POST, "/v1/collections/carts/documents", &token).json(&json!({})).send();
    // Each issuer's roles are its own.
    assert_eq!(write(RSA_A.sign(&shop.claims("ann", &["shopper"]))).await.unwrap().status(), 201);
    assert_eq!(write(EC.sign(&partners.claims("ann", &["shopper"]))).await.unwrap().status(), 403);
    // One issuer's key does not sign for the other.
    let res = write(RSA_A.sign(&partners.claims("ann", &["shopper"]))).await.unwrap();
    expect_problem(res, 401, "token_key").await;
    // The same subject at two issuers is two users.
    let me = |token: String| {
        let req = as_user(&app, Method::GET, "/v1/me", &token);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let a = me(RSA_A.sign(&shop.claims("ann", &["shopper"]))).await;
    let b = me(EC.sign(&partners.claims("ann", &["shopper"]))).await;
    assert_eq!((a["issuer"].as_str(), b["issuer"].as_str()), (Some(shop.url.as_str()), Some(partners.url.as_str())));
    app.stop().await;
}

/// A request whose body never finishes arriving holds its caller's permit.
async fn stalled(app: &TestApp, token: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://")).await.unwrap();
    let head = format!(
        "POST /v1/collections/carts/documents HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket
}

#[tokio::test]
async fn one_users_requests_in_flight_are_their_share_and_the_issuers_users_have_a_cap() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(&issuer, |e| {
        e.max_concurrency = Some(3);
        e.max_concurrency_per_user = Some(2);
    })
    .await;
    let token = |who: &str| issuer.token(who, &["shopper"]);
    let (ann, bob, cy) = (token("ann"), token("bob"), token("cy"));
    let get = |token: &str| as_user(&app, Method::GET, "/v1/collections/carts/documents/x", token).send();
    // The stalled requests are admitted once the gateway has read their
    // heads: until then, a request of the same caller may still pass.
    let refused = async |token: &str| {
        for _ in 0..1000 {
            let res = get(token).await.unwrap();
            if res.status() == 429 {
                return expect_problem(res, 429, "overloaded").await;
            }
            tokio::task::yield_now().await;
        }
        panic!("never refused");
    };
    let held = [stalled(&app, &ann).await, stalled(&app, &ann).await];
    // Ann's share is taken: 429 for her, while Bob is served.
    let p = refused(&ann).await;
    assert!(p["detail"].as_str().unwrap().contains("requests in flight"), "{p}");
    assert_eq!(get(&bob).await.unwrap().status(), 404);
    // Bob takes the issuer's third: every user of it is refused now.
    let third = stalled(&app, &bob).await;
    let p = refused(&cy).await;
    assert!(p["detail"].as_str().unwrap().contains("issuer"), "{p}");
    drop(held);
    drop(third);
    app.stop().await;
}

/// A user sends hooks (a transaction's, a subscription's) only where one
/// of their roles allows: by URL prefix, the host compared whole.
#[tokio::test]
async fn users_send_hooks_only_where_their_roles_allow() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let receiver = crate::support::TestReceiver::start().await;
    let allowed = receiver.url("/shop");
    let app = gateway(&issuer, |e| {
        e.hooks = [("shopper".to_owned(), vec![allowed.clone()])].into();
    })
    .await;
    let ann = issuer.token("ann", &["shopper"]);
    let sam = issuer.token("sam", &["support"]);
    let txn = |id: &str, url: String| json!({"actions": [{"op": "insert", "collection": "carts", "id": id, "data": {}}], "hooks": [{"url": url}]});
    let post = |who: &str, path: &str, body: &Value| as_user(&app, Method::POST, path, who).json(body).send();
    // Elsewhere on the same host, a path that only starts alike, the host
    // behind credentials, a role without hooks:
    // 403, and nothing written.
    let host = receiver.url("").replace("http://", "");
    let elsewhere = [receiver.url("/other"), receiver.url("/shopping"), format!("http://user:pw@{host}/shop/x")];
    for url in elsewhere {
        let res = post(&ann, "/v1/transactions", &txn("c0", url.clone())).await.unwrap();
        let problem = expect_problem(res, 403, "forbidden").await;
        assert!(problem["detail"].as_str().unwrap().starts_with("/hooks/0/url"), "{url}: {problem}");
    }
    let res = post(&sam, "/v1/transactions", &txn("c0", receiver.url("/shop/x"))).await.unwrap();
    expect_problem(res, 403, "forbidden").await;
    let res = as_user(&app, Method::GET, "/v1/collections/carts/documents/c0", &ann).send().await.unwrap();
    expect_problem(res, 404, "not_found").await;
    let sub = json!({"url": receiver.url("/other"), "collections": ["carts"]});
    expect_problem(post(&ann, "/v1/subscriptions", &sub).await.unwrap(), 403, "forbidden").await;
    // Under the allowed prefix: the transaction commits and its hook is
    // delivered; the subscription is made.
    expect(post(&ann, "/v1/transactions", &txn("c1", receiver.url("/shop/cart"))).await.unwrap(), 200).await;
    let hook = receiver.next(std::time::Duration::from_secs(10)).await;
    assert_eq!(hook.path, "/shop/cart");
    let sub = json!({"url": receiver.url("/shop/events"), "collections": ["carts"]});
    expect(post(&ann, "/v1/subscriptions", &sub).await.unwrap(), 201).await;
    app.stop().await;
}

#[tokio::test]
async fn deliveries_name_the_user_whose_transaction_they_deliver() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let receiver = crate::support::TestReceiver::start().await;
    let hooks = receiver.url("/");
    let app = gateway(&issuer, |e| e.hooks = [("shopper".to_owned(), vec![hooks])].into()).await;
    // ann reads every collection (support) and writes carts (shopper).
    let ann = issuer.token("ann", &["shopper", "support"]);
    let body = json!({
        "actions": [{"op": "insert", "collection": "carts", "id": "c1", "data": {}}],
        "hooks": [{"url": receiver.url("/hook")}],
    });
    let res = as_user(&app, Method::POST, "/v1/transactions", &ann).json(&body).send().await.unwrap();
    expect(res, 200).await;
    app.settled().await;
    let page = expect(as_user(&app, Method::GET, "/v1/deliveries", &ann).send().await.unwrap(), 200).await;
    let delivery = &page["items"][0];
    assert_eq!(delivery["actor"], json!({"kind": "user", "issuer": issuer.url, "subject": "ann"}), "{delivery}");
    assert!(delivery.get("key").is_none(), "{delivery}");
    // Another user who reads every collection is not shown it: its body
    // is ann's.
    let sam = issuer.token("sam", &["support"]);
    let page = expect(as_user(&app, Method::GET, "/v1/deliveries", &sam).send().await.unwrap(), 200).await;
    assert_eq!(page["items"], json!([]), "{page}");
    let id = delivery["id"].as_str().unwrap();
    let res = as_user(&app, Method::GET, &format!("/v1/deliveries/{id}"), &sam).send().await.unwrap();
    expect_problem(res, 404, "not_found").await;
    let res = as_user(&app, Method::GET, &format!("/v1/deliveries/{id}"), &ann).send().await.unwrap();
    expect(res, 200).await;
    app.stop().await;
}

#[tokio::test]
async fn anonymous_access_is_only_what_it_is_granted() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let entry = issuer.entry().resolve(1).unwrap();
    let app = TestApp::spawn_with(Backend::Embedded, move |c| {
        c.issuers = vec![entry];
        c.anonymous = Some(vec![txgate::testing::keys::Grant::parse("read@products").unwrap()]);
    })
    .await
    .unwrap();
    // Served without a credential, as far as the grant goes.
    expect_problem(app.get("/v1/collections/products/documents/p1").await, 404, "not_found").await;
    let res = app.post("/v1/collections/products/documents", &json!({"_id": "p1"})).await;
    expect_problem(res, 403, "forbidden").await;
    expect_problem(app.get("/v1/collections/carts/documents/c1").await, 403, "forbidden").await;
    let me = expect(app.get("/v1/me").await, 200).await;
    assert_eq!(me, json!({"kind": "anonymous", "grants": ["read@products"]}));
    // A credential that is there is checked, never taken as anonymous.
    let res = as_user(&app, Method::GET, "/v1/collections/products/documents/p1", "x.y.z").send().await.unwrap();
    expect_problem(res, 401, "token_malformed").await;
    for header in ["Basic YW5uOnB3", "Bearer", "Token abc"] {
        let res = app.request(Method::GET, "/v1/collections/products/documents/p1").header("authorization", header);
        let res = res.send().await.unwrap();
        assert!(res.headers()["www-authenticate"].to_str().unwrap().contains("invalid_token"), "{header}");
        expect_problem(res, 401, "unauthorized").await;
    }
    // The scheme's name in any case (RFC 9110).
    let token = issuer.token("ann", &["shopper"]);
    let res = app.request(Method::GET, "/v1/me").header("authorization", format!("BEARER {token}")).send().await;
    assert_eq!(expect(res.unwrap(), 200).await["subject"], "ann");
    app.stop().await;
}

#[tokio::test]
async fn a_provider_that_hangs_holds_up_one_request_not_every_user() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    issuer.served().cache = Some("max-age=1".into());
    let app = gateway(&issuer, |e| e.keys_min_cache_secs = Some(1)).await;
    let token = issuer.token("ann", &["shopper"]);
    let read = || as_user(&app, Method::GET, "/v1/collections/carts/documents/x", &token).send();
    assert_eq!(read().await.unwrap().status(), 404);
    issuer.served().hang = true;
    let fetches = issuer.served().jwks_fetches;
    // Past the keys' lifetime, one request fetches them again, and waits
    // for a provider that does not answer (up to the fetch's timeout)...
    let mut first = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while first.is_none() && std::time::Instant::now() < deadline {
        let waiting = tokio::spawn(read());
        tokio::time::sleep(Duration::from_millis(200)).await;
        if issuer.served().jwks_fetches > fetches {
            first = Some(waiting);
        } else {
            assert_eq!(waiting.await.unwrap().unwrap().status(), 404);
        }
    }
    let first = first.expect("a request fetched the keys again");
    // ... while every other one is served from the keys at hand meanwhile.
    for _ in 0..5 {
        assert_eq!(read().await.unwrap().status(), 404);
    }
    assert!(!first.is_finished(), "the fetching request was not held up by the provider");
    assert_eq!(first.await.unwrap().unwrap().status(), 404, "served from the stale keys once the fetch gave up");
    app.stop().await;
}

#[tokio::test]
async fn users_streams_are_their_share_and_a_refused_ticket_is_not_spent() {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let app = gateway(&issuer, |e| {
        e.max_streams_per_user = Some(1);
        e.max_streams = Some(2);
    })
    .await;
    let token = |who: &str| issuer.token(who, &["shopper"]);
    let (ann, bob, cy) = (token("ann"), token("bob"), token("cy"));
    let url = format!("{}/v1/events?collections=carts", app.base);
    let stream = |token: &str| SseStream::try_open(reqwest::Client::new().get(&url).bearer_auth(token));
    let first = stream(&ann).await.unwrap();
    // Ann's share is one stream; her ticket is refused while it is open,
    // and stays good for when it is closed.
    let t = ticket(&app, &ann, json!({"collections": "carts"})).await;
    let ticketed = t["url"].as_str().unwrap();
    assert_eq!(open(&app, ticketed).await.err(), Some(429));
    // Bob has his own; Cy finds the issuer's two taken.
    let second = stream(&bob).await.unwrap();
    assert_eq!(stream(&cy).await.err(), Some(429));
    drop(first);
    let mut again = None;
    for _ in 0..200 {
        // The slot comes back once the server sees the connection closed.
        match open(&app, ticketed).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(429) => tokio::task::yield_now().await,
            Err(status) => panic!("the ticket was spent by a refusal: {status}"),
        }
    }
    assert!(again.is_some(), "the ticket opened its stream once a slot was free");
    drop(second);
    app.stop().await;
}
