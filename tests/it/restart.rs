//! The embedded store keeps every acknowledged write across `kill -9`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::expect;

/// The real `txgate` binary on the embedded store in `dir`, on a free port.
fn start(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir)
        .env("TXGATE_LISTEN", "127.0.0.1:0")
        .env("TXGATE_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("txgate starts");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let parsed: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("log line is not JSON: {line}"));
            if parsed["message"] == "txgate listening" {
                let _ = tx.send(parsed["addr"].as_str().unwrap().to_owned());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(20)).expect("txgate reports its address");
    (child, format!("http://{addr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = start(dir.path());
    let url = format!("{base}/v1/collections/things/documents");
    // Concurrent writers, so several writes share a group commit.
    let writes: Vec<_> = (0..40)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                client.post(&url).json(&json!({"_id": format!("t{i:02}"), "i": i})).send().await.unwrap()
            })
        })
        .collect();
    for w in writes {
        assert_eq!(w.await.unwrap().status(), 201);
    }
    let res = client.patch(format!("{url}/t07")).json(&json!({"inc": {"i": 100}})).send().await.unwrap();
    expect(res, 200).await;
    assert_eq!(client.delete(format!("{url}/t08")).send().await.unwrap().status(), 204);
    child.kill().expect("SIGKILL"); // no graceful shutdown
    child.wait().unwrap();

    let (mut child, base) = start(dir.path());
    let url = format!("{base}/v1/collections/things/documents");
    let page = expect(client.get(format!("{url}?limit=100")).send().await.unwrap(), 200).await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 39);
    let t07 = expect(client.get(format!("{url}/t07")).send().await.unwrap(), 200).await;
    assert_eq!((t07["version"].as_i64(), t07["data"]["i"].as_i64()), (Some(2), Some(107)));
    assert_eq!(client.get(format!("{url}/t08")).send().await.unwrap().status(), 410);
    child.kill().unwrap();
    child.wait().unwrap();
}
