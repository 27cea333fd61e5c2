//! Stored data outlives releases: a data directory written by the release
//! before journal format 2 (`tests/fixtures/embedded-v1`, with entries
//! still in its format-1 journal and a document whose outbox is set) opens
//! under this one, with everything in it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::restart::start_with;
use crate::support::expect;

fn copy_fixture(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embedded-v1");
    for name in ["txgate.redb", "txgate.journal"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

async fn get(client: &reqwest::Client, url: String) -> (u16, Value) {
    let res = client.get(url).header("accept", "application/json").send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_data_directory_of_the_previous_release_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture(dir.path());
    let journal = dir.path().join("txgate.journal");
    assert_ne!(&std::fs::read(&journal).unwrap()[..8], b"txgjrnl\0", "the fixture's journal is format 1");
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let (mut child, base) = start_with(dir.path(), &[]);
    let docs = format!("{base}/v1/collections/notes/documents");
    let n1 = expect(client.get(format!("{docs}/n1")).send().await.unwrap(), 200).await;
    assert_eq!((n1["version"].as_i64(), n1["data"]["title"].as_str()), (Some(2), Some("first, edited")), "{n1}");
    let n2 = expect(client.get(format!("{docs}/n2")).send().await.unwrap(), 200).await;
    assert_eq!((n2["version"].as_i64(), n2["data"]["title"].as_str()), (Some(2), Some("second")), "{n2}");
    assert_eq!(client.get(format!("{docs}/n3")).send().await.unwrap().status(), 410);
    let n4 = expect(client.get(format!("{docs}/n4")).send().await.unwrap(), 200).await;
    assert_eq!(n4["data"]["ordered"], true, "{n4}");
    let o1 = expect(client.get(format!("{base}/v1/collections/orders/documents/o-1")).send().await.unwrap(), 200).await;
    assert_eq!(o1["data"]["total"], 5);
    // The event n1's outbox held reaches the log (recovery publishes it).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, page) = get(&client, format!("{base}/v1/events?after=0&limit=1000")).await;
        assert_eq!(status, 200, "{page}");
        let ids: Vec<&str> = page["items"].as_array().unwrap().iter().filter_map(|e| e["id"].as_str()).collect();
        if ids.contains(&"notes/n1/2") {
            assert!(ids.contains(&"notes/n3/2") && ids.contains(&"notes/n1/1"), "{ids:?}");
            break;
        }
        assert!(Instant::now() < until, "n1's outbox event never reached the log: {ids:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The transaction's delivery is still recorded.
    let (status, deliveries) = get(&client, format!("{base}/v1/deliveries")).await;
    assert_eq!(status, 200);
    assert_eq!(deliveries["items"].as_array().map(Vec::len), Some(1), "{deliveries}");
    // The journal is format 2 from the first generation this release began.
    assert_eq!(&std::fs::read(&journal).unwrap()[..8], b"txgjrnl\0");
    // A write, a clean stop, a restart: everything is still there.
    let res = client.post(&docs).json(&serde_json::json!({"_id": "n5", "after": "upgrade"})).send().await.unwrap();
    assert_eq!(res.status(), 201);
    stop(&mut child);
    let (mut child, base) = start_with(dir.path(), &[]);
    let docs = format!("{base}/v1/collections/notes/documents");
    for id in ["n1", "n2", "n4", "n5"] {
        assert_eq!(client.get(format!("{docs}/{id}")).send().await.unwrap().status(), 200, "{id}");
    }
    stop(&mut child);
}

/// SIGTERM, and wait for the process to end cleanly.
pub fn stop(child: &mut std::process::Child) {
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = child.wait().unwrap();
    assert!(status.success(), "txgate ended with {status}");
}
