//! What leaves the process: no log line (at debug level) and no `Debug`
//! carries an API key, a hook's header value, the signing secret or a
//! MongoDB password; webhooks ignore proxy settings of the environment.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::support::{TestReceiver, expect};

const API_KEY: &str = "admin-key-Zq8vW3nT5yR1";
const HOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SECRET_PART: &str = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const HOOK_CREDENTIAL: &str = "hook-credential-Kd93Jf";
const MONGO_PASSWORD: &str = "mongo-pass-X7wq2";

/// The `txgate` binary with `env`, every line it writes kept.
fn spawn(dir: &std::path::Path, env: &[(&str, &str)]) -> (Child, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir)
        .env("TXGATE_LISTEN", "127.0.0.1:0")
        .env("TXGATE_LOG_FORMAT", "json")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("txgate starts");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    for pipe in [Box::new(out) as Box<dyn std::io::Read + Send>, Box::new(err)] {
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
    }
    (child, lines)
}

fn address(lines: &Mutex<Vec<String>>) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        for line in lines.lock().unwrap().iter() {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                if v["message"] == "txgate listening" {
                    return format!("http://{}", v["addr"].as_str().unwrap());
                }
            }
        }
        assert!(std::time::Instant::now() < deadline, "txgate did not start: {:?}", lines.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No line shows a secret; and there were at least `min` lines to search.
fn assert_clean(lines: &Mutex<Vec<String>>, min: usize) {
    let lines = lines.lock().unwrap();
    assert!(lines.len() >= min, "debug logging is on: {lines:?}");
    for secret in [API_KEY, SECRET_PART, HOOK_CREDENTIAL, MONGO_PASSWORD] {
        if let Some(line) = lines.iter().find(|l| l.contains(secret)) {
            panic!("a log line shows a secret: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_logs_carry_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = TestReceiver::start().await;
    let keys = format!("{API_KEY}:admin");
    let (mut child, lines) = spawn(
        dir.path(),
        &[
            ("RUST_LOG", "debug"),
            ("TXGATE_API_KEYS", &keys),
            ("TXGATE_HOOK_SECRET", HOOK_SECRET),
            ("TXGATE_HOOK_ALLOW", "127.0.0.1:*"),
            ("TXGATE_LISTEN", "127.0.0.1:0"),
        ],
    );
    let base = address(&lines);
    let http = reqwest::Client::new();
    let txn = json!({
        "actions": [{"op": "insert", "collection": "c", "id": "x", "data": {}}],
        "hooks": [{"url": receiver.url("/h"), "headers": {"Authorization": HOOK_CREDENTIAL}}],
    });
    let res = http.post(format!("{base}/v1/transactions")).bearer_auth(API_KEY).json(&txn).send().await.unwrap();
    let committed = expect(res, 200).await;
    assert_eq!(receiver.next(Duration::from_secs(10)).await.header("authorization"), HOOK_CREDENTIAL);
    let id = committed["id"].as_str().unwrap();
    for path in [format!("/v1/transactions/{id}"), "/v1/deliveries".into(), "/metrics".into()] {
        let res = http.get(format!("{base}{path}")).bearer_auth(API_KEY).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
    }
    let res = http.get(format!("{base}/v1/transactions")).bearer_auth("wrong-key-but-long-enough").send().await;
    assert_eq!(res.unwrap().status(), 401);
    tokio::time::sleep(Duration::from_millis(500)).await;
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    child.wait().unwrap();
    assert_clean(&lines, 20);
    // The configuration itself was logged, with the credentials redacted.
    assert!(lines.lock().unwrap().iter().any(|l| l.contains("\"configuration\"") && l.contains("[redacted]")));

    // A MongoDB URI with a password: the gateway cannot reach it, and says
    // so without the password.
    let uri = format!("mongodb://user:{MONGO_PASSWORD}@127.0.0.1:1/db?serverSelectionTimeoutMS=500");
    let (mut child, lines) = spawn(dir.path(), &[("RUST_LOG", "debug"), ("TXGATE_MONGODB_URI", &uri)]);
    let status = child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!status.success(), "an unreachable store stops the start");
    assert_clean(&lines, 2);
    assert!(lines.lock().unwrap().iter().any(|l| l.contains("mongodb://user:[redacted]@127.0.0.1:1")));
}

/// A hook's or a subscription's URL carries credentials (user, password,
/// a token in its query string): only a key that may write what it belongs
/// to is shown it whole; others see it redacted, and no log line shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_hook_and_subscription_urls_are_shown_only_to_writers() {
    const PASSWORD: &str = "url-pass-P4ssw0rd";
    const TOKEN: &str = "url-token-8Hn2q";
    let dir = tempfile::tempdir().unwrap();
    let receiver = TestReceiver::start().await;
    let keys = format!(
        "{API_KEY}:admin,writer-key-Ln4vQ8xZ2:read@c+write@c,reader-key-Wq7nB3kM1:read@c,everywhere-reader-Jx5:read"
    );
    let (mut child, lines) =
        spawn(dir.path(), &[("RUST_LOG", "debug"), ("TXGATE_API_KEYS", &keys), ("TXGATE_HOOK_ALLOW", "127.0.0.1:*")]);
    let base = address(&lines);
    let http = reqwest::Client::new();
    let secret_url = receiver.url(&format!("/h?token={TOKEN}")).replace("http://", &format!("http://svc:{PASSWORD}@"));
    let redacted = receiver.url("/h?[redacted]").replace("http://", "http://[redacted]@");
    let get = async |path: &str, key: &str| {
        let res = http.get(format!("{base}{path}")).bearer_auth(key).send().await.unwrap();
        expect(res, 200).await
    };
    let (writer, reader, everywhere) = ("writer-key-Ln4vQ8xZ2", "reader-key-Wq7nB3kM1", "everywhere-reader-Jx5");

    let txn = json!({
        "actions": [{"op": "insert", "collection": "c", "id": "x", "data": {}}],
        "hooks": [{"url": secret_url}],
    });
    let res = http.post(format!("{base}/v1/transactions")).bearer_auth(writer).json(&txn).send().await.unwrap();
    let id = expect(res, 200).await["id"].as_str().unwrap().to_owned();
    receiver.next(Duration::from_secs(10)).await;
    let path = format!("/v1/transactions/{id}");
    assert_eq!(get(&path, writer).await["request"]["hooks"][0]["url"], secret_url.as_str());
    assert_eq!(get(&path, reader).await["request"]["hooks"][0]["url"], redacted.as_str());
    let listed = get("/v1/transactions", reader).await;
    assert_eq!(listed["items"][0]["request"]["hooks"][0]["url"], redacted.as_str(), "{listed}");

    let sub = json!({"url": secret_url, "collections": ["c"]});
    let res = http.post(format!("{base}/v1/subscriptions")).bearer_auth(writer).json(&sub).send().await.unwrap();
    let created = expect(res, 201).await;
    assert_eq!(created["url"], secret_url.as_str(), "its creator is shown what it sent");
    let path = format!("/v1/subscriptions/{}", created["id"].as_str().unwrap());
    assert_eq!(get(&path, writer).await["url"], secret_url.as_str());
    assert_eq!(get(&path, reader).await["url"], redacted.as_str());
    assert_eq!(get("/v1/subscriptions", reader).await["items"][0]["url"], redacted.as_str());

    let deliveries = get("/v1/deliveries", everywhere).await;
    let urls: Vec<&str> = deliveries["items"].as_array().unwrap().iter().map(|d| d["url"].as_str().unwrap()).collect();
    assert!(!urls.is_empty() && urls.iter().all(|u| *u == redacted), "{urls:?}");
    let deliveries = get("/v1/deliveries", API_KEY).await;
    assert!(deliveries["items"].as_array().unwrap().iter().all(|d| d["url"] == secret_url.as_str()), "{deliveries}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    child.wait().unwrap();
    let lines = lines.lock().unwrap();
    assert!(lines.len() > 10, "debug logging is on");
    for secret in [PASSWORD, TOKEN] {
        if let Some(line) = lines.iter().find(|l| l.contains(secret)) {
            panic!("a log line shows a URL's credential: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_ignore_the_proxy_settings_of_the_environment() {
    // A "proxy" that would relay anything: it must never be asked.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut conn, _)) = proxy.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(&str, &str)> = ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
        .into_iter()
        .map(|k| (k, proxy_url.as_str()))
        .chain([("TXGATE_HOOK_TIMEOUT_MS", "500")])
        .collect();
    let (mut child, lines) = spawn(dir.path(), &env);
    let base = address(&lines);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // A name no resolver here knows: reachable only through the proxy.
    let txn = json!({
        "actions": [{"op": "insert", "collection": "c", "id": "x", "data": {}}],
        "hooks": [{"url": "http://hooks.example.com/paid"}],
    });
    let committed = expect(http.post(format!("{base}/v1/transactions")).json(&txn).send().await.unwrap(), 200).await;
    let delivery = committed["hooks"][0]["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = expect(http.get(format!("{base}/v1/deliveries/{delivery}")).send().await.unwrap(), 200).await;
        if d["attempts"].as_array().is_some_and(|a| a.len() >= 2) {
            assert_ne!(d["status"], "delivered", "{d}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no attempts: {d}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0, "the proxy was used");
    child.kill().unwrap();
    child.wait().unwrap();
}
