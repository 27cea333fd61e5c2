//! `POST /v1/admin/backup`: an online backup of the embedded store, taken
//! while documents are being written, holds exactly a prefix of them (every
//! one acknowledged before the request, none missing below the last it
//! holds), opens as a store of its own, and a gateway started on it serves
//! them. MongoDB has no online backup: 409 `backup_unsupported`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::config::StoreConfig;
use txgate::testing::document::{StoredDoc, View};
use txgate::testing::keys::parse_keys;
use txgate_store::Store;
use txgate_store::embedded::EmbeddedStore;

use crate::support::{Backend, TestApp, expect, expect_problem, test_config};

const COLL: &str = "things";
const BACKUP: &str = "/v1/admin/backup";

fn doc_id(n: usize) -> String {
    format!("t{n:05}")
}

/// What document `n` holds: some padding, so that records span pages.
fn doc_data(n: usize) -> Value {
    json!({"n": n, "pad": "x".repeat(200 + n % 50)})
}

/// One task creating `t00001`, `t00002`, ... one after another until told
/// to stop: the order of `acked` is the history's.
struct Writer {
    acked: Arc<Mutex<Vec<String>>>,
    /// Wakes [`Writer::until_acked`] after each acknowledged create.
    pushed: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(app: &TestApp) -> Self {
        let (client, url) = (app.client.clone(), format!("{}/v1/collections/{COLL}/documents", app.base));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let pushed = Arc::new(tokio::sync::Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (acked, pushed, stop) = (Arc::clone(&acked), Arc::clone(&pushed), Arc::clone(&stop));
            tokio::spawn(async move {
                for n in 1.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let mut body = doc_data(n);
                    body["_id"] = json!(doc_id(n));
                    let res = client.post(&url).json(&body).send().await.expect("create sent");
                    let status = res.status().as_u16();
                    assert_eq!(status, 201, "creating {}: {}", doc_id(n), res.text().await.unwrap_or_default());
                    acked.lock().unwrap().push(doc_id(n));
                    pushed.notify_waiters();
                }
            })
        };
        Self { acked, pushed, stop, task }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Until `n` creates are acknowledged.
    async fn until_acked(&self, n: usize) {
        let acked = crate::support::woken_until(&self.pushed, || self.acked() >= n);
        if tokio::time::timeout(Duration::from_secs(30), acked).await.is_err() {
            panic!("only {} of {n} creates acknowledged", self.acked());
        }
    }

    /// Stop after the create in flight; every id acknowledged, in order.
    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the writer ends without a failed create");
        Arc::try_unwrap(self.acked).expect("the writer is done").into_inner().unwrap()
    }
}

fn data_dir(app: &TestApp) -> PathBuf {
    match &app.config.store {
        StoreConfig::Embedded { data_dir, .. } => data_dir.clone(),
        other => panic!("an embedded gateway, not {other:?}"),
    }
}

/// The backup's directory: under `<data dir>/backups`, named
/// `YYYYMMDDTHHMMSSZ-xxxxxx`.
fn backup_path(app: &TestApp, answer: &Value) -> PathBuf {
    let path = PathBuf::from(answer["path"].as_str().expect("path"));
    assert!(path.is_absolute(), "{answer}");
    let backups = std::path::absolute(data_dir(app).join("backups")).unwrap();
    assert_eq!(path.parent(), Some(backups.as_path()), "{answer}");
    let name = path.file_name().unwrap().to_str().unwrap();
    let (stamp, suffix) = name.split_once('-').unwrap_or_else(|| panic!("{name}"));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    assert!(stamp.len() == 16 && digits(&stamp[..8]) && &stamp[8..9] == "T" && digits(&stamp[9..15]), "{name}");
    assert!(stamp.ends_with('Z') && suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
    assert!(path.join(txgate_store::embedded::DATABASE_FILE).is_file(), "{} holds a database", path.display());
    path
}

/// The ids of `COLL` the store at `dir` holds, in order, each checked to
/// hold the data it was created with; the store's indexes checked and its
/// record count compared with the backup's answer.
async fn held_documents(dir: &Path, answer: &Value) -> Vec<String> {
    let store = EmbeddedStore::open(dir).expect("the backup opens as a store");
    store.verify_indexes().expect("the backup's indexes match its records");
    let all = store.dump().expect("dump");
    assert_eq!(all.len() as u64, answer["records"].as_u64().unwrap(), "the answer counts every record: {answer}");
    let ids: Vec<String> = all.keys().filter(|(c, _)| c == COLL).map(|(_, id)| id.clone()).collect();
    for (i, id) in ids.iter().enumerate() {
        let record = store.get(COLL, id).await.unwrap().unwrap_or_else(|| panic!("{id} in the dump, not by get"));
        let View::Live(live) = StoredDoc::from_record(record).unwrap().committed_view() else {
            panic!("{id} is not a live document in the backup");
        };
        assert_eq!(Value::Object(live.data_json()), doc_data(i + 1), "{id}'s data");
    }
    // Dropped, not closed: a closed store keeps its file locked for the
    // rest of the process, and a gateway opens this directory next.
    drop(store);
    ids
}

/// The store in `config`'s directory, opened at once: a dropped embedded
/// store has let go of its file.
async fn reopen(config: &StoreConfig) -> txgate_store::DynStore {
    match txgate::open_store(config).await {
        Ok(store) => crate::support::templated(store),
        Err(err) => panic!("the backup does not open as a data directory: {err}"),
    }
}

/// A backup taken while one task creates documents holds exactly the first
/// k of them for some k: at least every one acknowledged before the
/// request was sent, each with its data; and a gateway restored from it
/// serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backup_while_writing_holds_a_prefix_and_restores() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let writer = Writer::start(&app);
    writer.until_acked(40).await;
    let acked_before = writer.acked();
    // No body at all: every member is optional.
    let answer = expect(app.request(Method::POST, BACKUP).send().await.unwrap(), 201).await;
    // Writes go on after it too.
    writer.until_acked(writer.acked() + 20).await;
    let acked = writer.stop().await;
    let path = backup_path(&app, &answer);
    for field in ["records", "bytes", "journal_position", "took_ms"] {
        assert!(answer[field].is_u64(), "{field}: {answer}");
    }
    assert!(answer["bytes"].as_u64().unwrap() > 0 && answer["journal_position"].as_u64().unwrap() > 0, "{answer}");

    let held = held_documents(&path, &answer).await;
    assert!(held.len() >= acked_before, "{} held, {acked_before} acknowledged before the backup", held.len());
    assert!(held.len() <= acked.len(), "{} held, {} ever acknowledged", held.len(), acked.len());
    assert_eq!(held, acked[..held.len()], "the backup holds a prefix of the creates");
    assert!(held.len() < acked.len(), "creates acknowledged after the backup are not in it");

    // A gateway on the backup's directory serves what it holds.
    let config = StoreConfig::Embedded {
        data_dir: path.clone(),
        cache_mb: 16,
        sync_interval: txgate::config::DEFAULT_SYNC_INTERVAL,
        checkpoint_interval: txgate::config::DEFAULT_CHECKPOINT_INTERVAL,
    };
    let store = reopen(&config).await;
    let restored = TestApp::on_store(test_config(config), Arc::clone(&store), None).await;
    let last = held.last().unwrap();
    let doc = expect(restored.get(&format!("/v1/collections/{COLL}/documents/{last}")).await, 200).await;
    assert_eq!(doc["data"], doc_data(held.len()), "{doc}");
    let missing = &acked[held.len()];
    expect_problem(restored.get(&format!("/v1/collections/{COLL}/documents/{missing}")).await, 404, "not_found").await;
    restored.stop().await;
    drop(store);
    app.stop().await;
}

/// Each backup gets a directory of its own, and nothing half-written is
/// left beside them. A body is optional; one given is `{}` or is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backups_get_their_own_directories() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    expect(app.post(&format!("/v1/collections/{COLL}/documents"), &json!({"_id": doc_id(1), "n": 1})).await, 201).await;
    let first = expect(app.request(Method::POST, BACKUP).send().await.unwrap(), 201).await;
    let second = expect(app.post(BACKUP, &json!({})).await, 201).await;
    let (first, second) = (backup_path(&app, &first), backup_path(&app, &second));
    assert_ne!(first, second);
    let mut names: Vec<String> = std::fs::read_dir(first.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected: Vec<String> =
        [&first, &second].iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_owned()).collect();
    expected.sort();
    assert_eq!(names, expected, "two whole backups, no .partial left");

    expect_problem(app.post(BACKUP, &json!({"to": "/tmp"})).await, 422, "validation_failed").await;
    expect_problem(app.post(BACKUP, &json!([])).await, 422, "validation_failed").await;
    let res = app.request(Method::POST, BACKUP).header("content-type", "application/json").body("{").send().await;
    expect_problem(res.unwrap(), 400, "invalid_json").await;
    let res = app.request(Method::POST, BACKUP).header("content-type", "text/plain").body("now").send().await;
    expect_problem(res.unwrap(), 415, "unsupported_media_type").await;
    assert_eq!(std::fs::read_dir(first.parent().unwrap()).unwrap().count(), 2, "refused requests write nothing");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_has_no_online_backup() {
    let Some(app) = TestApp::spawn(Backend::Mongodb).await else { return };
    let problem =
        expect_problem(app.request(Method::POST, BACKUP).send().await.unwrap(), 409, "backup_unsupported").await;
    assert!(problem["detail"].as_str().unwrap().contains("own tools"), "{problem}");
    app.stop().await;
}

const READER: &str = "reader-key-0123456789";
const WRITER: &str = "writer-key-0123456789";
const THINGS_ADMIN: &str = "things-admin-key-0123456789";
const ADMIN: &str = "admin-key-0123456789";

/// A backup copies every collection: it needs `admin` on all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_need_the_admin_scope() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        c.api_keys =
            parse_keys(&format!("{READER}:read,{WRITER}:write,{THINGS_ADMIN}:admin@{COLL},{ADMIN}:admin")).unwrap();
    })
    .await
    .unwrap();
    expect_problem(app.request(Method::POST, BACKUP).send().await.unwrap(), 401, "unauthorized").await;
    for key in [READER, WRITER, THINGS_ADMIN] {
        let res = app.request(Method::POST, BACKUP).bearer_auth(key).send().await.unwrap();
        let problem = expect_problem(res, 403, "forbidden").await;
        assert_eq!(problem["required_scope"], "admin", "{problem}");
    }
    let backups = data_dir(&app).join("backups");
    assert!(!backups.exists(), "refused requests write nothing");
    let res = app.request(Method::POST, BACKUP).bearer_auth(ADMIN).send().await.unwrap();
    backup_path(&app, &expect(res, 201).await);
    app.stop().await;
}

/// A backup that would leave less free space on the data's disk than the
/// reserve is refused before anything is written (507
/// `insufficient_storage`): a full disk would fail the journal's next
/// write, and the store with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_that_would_eat_into_the_reserve_is_refused() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.backups.reserve_bytes = u64::MAX / 2).await.unwrap();
    expect(app.post(&format!("/v1/collections/{COLL}/documents"), &json!({"_id": doc_id(1), "n": 1})).await, 201).await;
    let problem =
        expect_problem(app.request(Method::POST, BACKUP).send().await.unwrap(), 507, "insufficient_storage").await;
    assert!(problem["detail"].as_str().unwrap().contains("TXGATE_BACKUP_RESERVE_MB"), "{problem}");
    let backups = data_dir(&app).join("backups");
    assert!(!backups.exists() || std::fs::read_dir(&backups).unwrap().count() == 0, "nothing written");
    // The store goes on.
    expect(app.post(&format!("/v1/collections/{COLL}/documents"), &json!({"_id": doc_id(2), "n": 2})).await, 201).await;
    app.stop().await;
}

/// Once a backup is written, the oldest beyond `TXGATE_BACKUPS_KEPT` are
/// removed and named in the answer; what is not a backup is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_beyond_the_number_kept_are_removed_oldest_first() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.backups.kept = 2).await.unwrap();
    expect(app.post(&format!("/v1/collections/{COLL}/documents"), &json!({"_id": doc_id(1), "n": 1})).await, 201).await;
    let mut taken = Vec::new();
    for _ in 0..2 {
        let answer = expect(app.request(Method::POST, BACKUP).send().await.unwrap(), 201).await;
        assert_eq!(answer["removed"], json!([]), "{answer}");
        taken.push(backup_path(&app, &answer));
        // Names sort by the second they were taken in (by the gateway's clock).
        app.advance(Duration::from_secs(1));
    }
    let other = data_dir(&app).join("backups").join("copied-by-hand");
    std::fs::create_dir(&other).unwrap();
    let answer = expect(app.request(Method::POST, BACKUP).send().await.unwrap(), 201).await;
    let newest = backup_path(&app, &answer);
    assert_eq!(answer["removed"], json!([taken[0].to_str().unwrap()]), "{answer}");
    assert!(!taken[0].exists() && taken[1].exists() && newest.exists() && other.exists());
    app.stop().await;
}
