//! Power loss on a simulated disk (see `txgate_store::powerloss`): the
//! embedded store crashed at every write and sync of a workload, reopened
//! on what each crash left, and checked.

use txgate_store::powerloss::{Sweep, sweep};

/// Every crash point of the workload once, with four survivor images
/// each (everything written, only what was synced, two random subsets
/// with the interrupted write possibly torn), and a two-crash sequence at
/// every third point. The seed changes per run unless
/// `TXGATE_POWER_SEED` pins it; a failure names it. The bench's
/// `--power` sweeps more images per point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_survives_power_loss_at_every_write_and_sync() {
    let seed = std::env::var("TXGATE_POWER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let cfg = Sweep { seed, images_per_point: 4, two_crash_every: 3, recovery_every: 6, progress_every: 0 };
    let report = sweep(&cfg).await.unwrap_or_else(|e| panic!("{e}"));
    eprintln!("power loss: {report}");
    assert!(report.recovery_crashes > 100, "the reopen was crashed {} times", report.recovery_crashes);
    assert!(report.damage_refused > 300, "{} damaged synced entries", report.damage_refused);
    assert_eq!(report.crash_points, report.ops, "every write and sync was a crash point");
    assert!(
        report.by_op.get("sync").copied().unwrap_or(0) > 10 && report.by_op.get("write").copied().unwrap_or(0) > 50
    );
}

/// The offsets of the entries of a format-3 journal's current generation
/// (its salt, after the magic, version and a reserved word; entries after
/// the header sector and the two seal slots).
pub fn entry_offsets(journal: &[u8]) -> Vec<usize> {
    assert_eq!(&journal[..8], b"txgjrnl\0");
    assert_eq!(u32::from_le_bytes(journal[8..12].try_into().unwrap()), 3, "format 3");
    let salt = &journal[16..24];
    let mut out = Vec::new();
    let mut at = 3 * 512;
    while at + 32 <= journal.len() {
        let len = u32::from_le_bytes(journal[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || &journal[at + 8..at + 16] != salt {
            break;
        }
        out.push(at);
        at = (at + 32 + len).next_multiple_of(8);
    }
    out
}

/// A synced journal entry damaged on disk (a flipped byte) with synced
/// entries after it: the gateway refuses to start, naming the file and
/// offset, rather than drop acknowledged writes; `txgate journal
/// truncate --at` is the operator's explicit way past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_damaged_synced_journal_entry_stops_the_start_until_an_operator_truncates() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = crate::restart::start_with(dir.path(), &[]);
    let url = format!("{base}/v1/collections/things/documents");
    for i in 0..6 {
        let res = client.post(&url).json(&serde_json::json!({"_id": format!("t{i}"), "i": i})).send().await.unwrap();
        assert_eq!(res.status(), 201);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let journal = dir.path().join("txgate.journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let offsets = entry_offsets(&bytes);
    assert!(offsets.len() >= 6, "{offsets:?}");
    let damaged = offsets[1];
    bytes[damaged + 40] ^= 0x55;
    std::fs::write(&journal, &bytes).unwrap();

    let out = refused_start(dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("txgate.journal") && stderr.contains(&format!("offset {damaged}")),
        "the error names the file and offset: {stderr}"
    );
    assert!(stderr.contains("journal truncate"), "the error says the way out: {stderr}");

    let truncate = |at: usize| {
        Command::new(env!("CARGO_BIN_EXE_txgate"))
            .env_clear()
            .env("TXGATE_DATA_DIR", dir.path())
            .args(["journal", "truncate", "--at", &at.to_string()])
            .output()
            .unwrap()
    };
    let wrong = truncate(damaged + 1);
    assert!(!wrong.status.success(), "only an entry boundary is accepted");
    // A directory whose database is gone is refused, and no empty database
    // is made beside the journal.
    let database = dir.path().join("txgate.redb");
    let aside = dir.path().join("txgate.redb.aside");
    std::fs::rename(&database, &aside).unwrap();
    let missing = truncate(damaged);
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && said.contains("does not exist"), "{said}");
    assert!(!database.exists(), "no database was made");
    std::fs::rename(&aside, &database).unwrap();
    // A dry run says what the cut drops, and writes nothing.
    let before = std::fs::read(&journal).unwrap();
    let dry = Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir.path())
        .args(["journal", "truncate", "--at", &damaged.to_string(), "--dry-run"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    assert!(
        said.contains("dry run") && said.contains("txgate.journal") && said.contains("1 entries before offset"),
        "{said}"
    );
    assert!(said.contains("acknowledged (synced) entries would be lost, LSNs"), "{said}");
    assert_eq!(std::fs::read(&journal).unwrap(), before, "a dry run writes nothing");
    let cut = truncate(damaged);
    assert!(cut.status.success(), "{}", String::from_utf8_lossy(&cut.stderr));
    let said = String::from_utf8_lossy(&cut.stdout);
    assert!(said.contains("1 entries before offset") && said.contains("are kept"), "{said}");

    let (mut child, base) = crate::restart::start_with(dir.path(), &[]);
    let url = format!("{base}/v1/collections/things/documents");
    // What the cut dropped is gone for good (t5 was in a later entry);
    // the store serves and takes writes.
    assert_eq!(client.get(format!("{url}/t5")).send().await.unwrap().status(), 404);
    let res = client.post(&url).json(&serde_json::json!({"_id": "after"})).send().await.unwrap();
    assert_eq!(res.status(), 201);
    // A running gateway's journal is never cut.
    let busy = truncate(0);
    let said = String::from_utf8_lossy(&busy.stderr);
    assert!(!busy.status.success() && said.contains("is in use"), "{said}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Start the gateway on `dir`, which must refuse to start: its output,
/// or a failure (never a wait without end) if it starts serving.
fn refused_start(dir: &std::path::Path) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir)
        .env("TXGATE_LISTEN", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > until {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("the gateway started on a damaged journal: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the gateway exited 0 on a damaged journal");
    out
}

/// The state a power cut leaves of a gateway's data directory: the
/// database as of `at_checkpoint` (its file copied while nothing had been
/// committed since the last checkpoint), the journal as it is.
fn power_cut(dir: &std::path::Path, at_checkpoint: &[u8]) {
    std::fs::write(dir.join("txgate.redb"), at_checkpoint).unwrap();
}

/// The journal's header damaged on disk while it holds acknowledged
/// writes the database does not (a power cut before a checkpoint): the
/// gateway refuses to start, for any byte of the magic flipped and for a
/// zeroed header sector, rather than read the file as another format or
/// as empty; with the header whole the same directory replays every
/// write. `journal truncate --at 0` is the way past it, dropping the
/// journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_damaged_journal_header_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let quiet = [("TXGATE_CHECKPOINT_INTERVAL_MS", "3600000")];
    // A first start makes the collection; a clean stop checkpoints it.
    let (mut child, base) = crate::restart::start_with(dir.path(), &quiet);
    let url = format!("{base}/v1/collections/things/documents");
    let res = client.post(&url).json(&serde_json::json!({"_id": "t0"})).send().await.unwrap();
    assert_eq!(res.status(), 201);
    crate::upgrade::stop(&mut child);
    let (mut child, base) = crate::restart::start_with(dir.path(), &quiet);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let checkpointed = std::fs::read(dir.path().join("txgate.redb")).unwrap();
    let url = format!("{base}/v1/collections/things/documents");
    for i in 1..=60 {
        let res = client.post(&url).json(&serde_json::json!({"_id": format!("t{i}"), "i": i})).send().await.unwrap();
        assert_eq!(res.status(), 201);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    power_cut(dir.path(), &checkpointed);
    let journal = dir.path().join("txgate.journal");
    let whole = std::fs::read(&journal).unwrap();
    let sector = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = whole.clone();
        f(&mut d);
        d
    };
    let mut cases: Vec<(String, Vec<u8>)> =
        (0..8).map(|i| (format!("magic byte {i} flipped"), sector(&|d| d[i] ^= 0x20))).collect();
    cases.push(("the header sector zeroed".into(), sector(&|d| d[..512].fill(0))));
    for (what, bytes) in &cases {
        std::fs::write(&journal, bytes).unwrap();
        let out = refused_start(dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("txgate.journal") && stderr.contains("damaged at offset 0"),
            "{what}: the error names the file and offset: {stderr}"
        );
        assert!(stderr.contains("journal truncate --at 0"), "{what}: {stderr}");
        // The evidence stays: no new generation overwrote the header.
        assert!(std::fs::read(&journal).unwrap() == *bytes, "{what}: the journal was written");
    }
    // The same directory with the header whole: every acknowledged write.
    let copy = tempfile::tempdir().unwrap();
    std::fs::write(copy.path().join("txgate.redb"), &checkpointed).unwrap();
    std::fs::write(copy.path().join("txgate.journal"), &whole).unwrap();
    let (mut child, base) = crate::restart::start_with(copy.path(), &[]);
    let url = format!("{base}/v1/collections/things/documents");
    for i in [1, 30, 60] {
        assert_eq!(client.get(format!("{url}/t{i}")).send().await.unwrap().status(), 200, "t{i} replayed");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The operator's way past a damaged header: drop the whole journal.
    let cut = std::process::Command::new(env!("CARGO_BIN_EXE_txgate"))
        .env_clear()
        .env("TXGATE_DATA_DIR", dir.path())
        .args(["journal", "truncate", "--at", "0"])
        .output()
        .unwrap();
    assert!(cut.status.success(), "{}", String::from_utf8_lossy(&cut.stderr));
    let (mut child, base) = crate::restart::start_with(dir.path(), &[]);
    let url = format!("{base}/v1/collections/things/documents");
    assert_eq!(client.get(format!("{url}/t0")).send().await.unwrap().status(), 200);
    assert_eq!(client.get(format!("{url}/t1")).send().await.unwrap().status(), 404, "the journal's writes are gone");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A panic in the writer thread stops the process (exit 70) instead of
/// leaving one that still reads, and reports healthy, but cannot write.
/// Run in a child process: the test binary itself, running the ignored
/// test below.
#[test]
fn embedded_writer_panic_stops_the_process() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "power::writer_panic_child", "--ignored", "--nocapture"])
        .env("TXGATE_WRITER_PANIC_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("the writer panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by embedded_writer_panic_stops_the_process in a child process"]
async fn writer_panic_child() {
    use std::sync::Arc;
    use txgate_store::embedded::{EmbeddedStore, Options};
    use txgate_store::simdisk::SimDisk;
    use txgate_store::{Durability, Store, Write};
    if std::env::var_os("TXGATE_WRITER_PANIC_CHILD").is_none() {
        return;
    }
    let disk = SimDisk::new();
    let store = EmbeddedStore::open_on(Arc::new(disk.clone()), &Options::default()).unwrap();
    disk.panic_at(disk.ops() + 1);
    let record = mongodb::bson::doc! {"_id": "x"};
    let outcome = store.write("c", Write::Insert(record), Durability::Synced).await;
    // The write's caller may hear of the failure (its answer dropped as the
    // writer unwinds) just before the writer stops the process: give it
    // time. Not reached when the process stops.
    std::thread::sleep(std::time::Duration::from_secs(10));
    eprintln!("the write returned {outcome:?}");
    std::process::exit(0);
}

mod writer {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use mongodb::bson::doc;
    use txgate_store::embedded::{EmbeddedStore, MAX_BATCH_BYTES, Options};
    use txgate_store::simdisk::SimDisk;
    use txgate_store::{Durability, Store, Write};

    fn open(disk: &SimDisk, options: &Options) -> EmbeddedStore {
        EmbeddedStore::open_on(Arc::new(disk.clone()), options).unwrap()
    }

    /// Queued writes larger in all than a batch may hold: no batch journals
    /// much more than its bound, large batches are split into entries,
    /// and a restart from what was written (no checkpoint) replays them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_batches_are_bounded_in_bytes_and_replay_whole() {
        let disk = SimDisk::new();
        let options = Options { checkpoint_bytes: u64::MAX, checkpoint_interval: None, ..Options::default() };
        let store = open(&disk, &options);
        const RECORD: usize = 3 << 20;
        // 42 MiB queued at once, more than one batch may hold.
        let writes = (0..14).map(|i| {
            let record = doc! {"_id": format!("r{i:02}"), "fill": "x".repeat(RECORD)};
            store.write("big", Write::Insert(record), Durability::Unsynced)
        });
        for outcome in futures::future::join_all(writes).await {
            assert!(outcome.unwrap());
        }
        // A chain larger than one entry holds, and is one entry all the
        // same: a crash keeps it whole or drops it whole.
        let entries = store.stats().entries.load(Ordering::Relaxed);
        let chain: Vec<_> =
            (0..4).map(|i| ("big", Write::Insert(doc! {"_id": format!("c{i}"), "fill": "y".repeat(RECORD)}))).collect();
        assert_eq!(store.write_in_order(chain, Durability::Synced).await.unwrap(), 4);
        assert!(store.capabilities().atomic_chains);
        let stats = store.stats();
        assert_eq!(stats.entries.load(Ordering::Relaxed), entries + 1, "the chain went to the journal in one entry");
        let max = stats.max_batch_bytes.load(Ordering::Relaxed) as usize;
        assert!(max <= MAX_BATCH_BYTES + RECORD + 4096, "a batch journaled {max} bytes");
        assert!(stats.entries.load(Ordering::Relaxed) > stats.commits.load(Ordering::Relaxed), "large batches split");
        // As a killed process leaves it: redb unsynced, the journal written.
        let after = disk.settled();
        let reopened = open(&after, &options);
        let all = reopened.dump().unwrap();
        assert_eq!(all.keys().filter(|(c, _)| c == "big").count(), 18);
        assert_eq!(reopened.get("big", "c3").await.unwrap().unwrap().get_str("fill").unwrap().len(), RECORD);
        reopened.close().await.unwrap();
        store.close().await.unwrap();
    }

    /// Refused conditional writes put their record back in the writer's
    /// cache counting its real size: the cache stays within its byte bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_recent_record_cache_stays_within_its_byte_bound() {
        let disk = SimDisk::new();
        let store = open(&disk, &Options::default());
        const RECORD: usize = 40 << 10;
        for i in 0..1200 {
            let record = doc! {"_id": format!("r{i:04}"), "v": 1, "fill": "x".repeat(RECORD)};
            assert!(store.write("c", Write::Insert(record), Durability::Unsynced).await.unwrap());
        }
        let mut max_records = 0;
        for i in 0..1200 {
            let refused = Write::Update {
                id: &format!("r{i:04}"),
                filter: doc! {"v": 2},
                update: txgate_store::Update { set: doc! {"v": 3}, unset: Vec::new() },
            };
            assert!(!store.write("c", refused, Durability::Unsynced).await.unwrap());
            max_records = max_records.max(store.stats().recent_records.load(Ordering::Relaxed));
        }
        let held = max_records as usize * RECORD;
        assert!(held <= 32 << 20, "the cache held {max_records} records of {RECORD} bytes");
        assert!(store.stats().recent_bytes.load(Ordering::Relaxed) as usize <= 32 << 20);
        store.close().await.unwrap();
    }

    /// Under continuous load (the queue never empty) unsynced writes are
    /// still synced at least every sync interval: the interval is a
    /// deadline, not a wait for an idle moment. The load lasts over a
    /// second, so a writer that synced only when its queue ran dry would
    /// leave a write unsynced for about that long; the bound allows the interval, the
    /// batch running when it passed and the one it was in, plus 250 ms for
    /// the writer thread being descheduled on a loaded 2-core machine
    /// (62 ms was seen with the suite running, against a 1 ms interval).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_sync_interval_is_kept_under_continuous_load() {
        const DESCHEDULED: Duration = Duration::from_millis(250);
        let disk = SimDisk::new();
        // No checkpoint (it would make the writes durable too, and hide a
        // missing sync).
        let options = Options {
            sync_interval: Duration::from_millis(1),
            checkpoint_bytes: u64::MAX,
            checkpoint_interval: None,
            ..Options::default()
        };
        let store = open(&disk, &options);
        // All queued at once, so the writer's queue is never empty until
        // the end (writers that wait for each answer leave it empty
        // between batches, where an idle writer syncs anyway).
        let writes = (0..80_000).map(|i| {
            let record = doc! {"_id": format!("r{i:06}"), "fill": "x".repeat(100)};
            store.write("c", Write::Insert(record), Durability::Unsynced)
        });
        let started = std::time::Instant::now();
        for outcome in futures::future::join_all(writes).await {
            assert!(outcome.unwrap());
        }
        let elapsed = started.elapsed();
        let stats = store.stats();
        let (syncs, commits) = (stats.syncs.load(Ordering::Relaxed), stats.commits.load(Ordering::Relaxed));
        assert!(commits >= 5, "the writes came in {commits} batches");
        let waited = Duration::from_nanos(stats.max_unsynced_nanos.load(Ordering::Relaxed));
        let batch = Duration::from_nanos(stats.max_batch_nanos.load(Ordering::Relaxed));
        let bound = options.sync_interval + batch * 2 + DESCHEDULED;
        assert!(bound < elapsed / 2, "the bound ({bound:?}) would not tell a sync only when idle apart");
        assert!(
            syncs >= 2 && waited <= bound,
            "{syncs} syncs for {commits} batches over {elapsed:?}: a write waited {waited:?} unsynced \
             (interval {:?}, longest batch {batch:?})",
            options.sync_interval
        );
        store.close().await.unwrap();
    }

    /// Commits are checkpointed within the checkpoint interval, however
    /// little journal they wrote: under a steady trickle of writes (a
    /// checkpoint then writes a few pages, not seconds' worth), and once
    /// the writes stop (an idle writer checkpoints what is left). What a
    /// crash then leaves of redb's file alone (the journal lost) holds
    /// every write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_commits_are_checkpointed_within_the_interval() {
        let disk = SimDisk::new();
        disk.byte_atomic(txgate_store::embedded::DATABASE_FILE);
        let options = Options {
            checkpoint_bytes: u64::MAX,
            checkpoint_interval: Some(Duration::from_millis(100)),
            ..Options::default()
        };
        let store = open(&disk, &options);
        let checkpoints = || store.stats().checkpoints.load(Ordering::Relaxed);
        let at_open = checkpoints();
        // A write every 5 ms for 0.8 s: the queue is never idle for a
        // whole interval.
        let started = std::time::Instant::now();
        let mut i = 0;
        while started.elapsed() < Duration::from_millis(800) {
            let record = doc! {"_id": format!("r{i:05}"), "n": i as i64};
            assert!(store.write("c", Write::Insert(record), Durability::Synced).await.unwrap());
            i += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let during = checkpoints() - at_open;
        assert!(during >= 3, "{during} checkpoints in 0.8 s of writes with an interval of 0.1 s");
        // Idle: what the last interval wrote is checkpointed too.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(checkpoints() > at_open + during, "no checkpoint once the writes stopped");
        assert!(!store.stats().unsynced.load(Ordering::SeqCst));
        // Power lost, and the journal with it: redb's file holds them all.
        disk.crash_now();
        store.close().await.unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
        let image = disk.crash().unwrap().survivor(txgate_store::simdisk::Keep::Durable, &mut rng);
        txgate_store::disk::Disk::remove(&image, txgate_store::embedded::JOURNAL_FILE).unwrap();
        let reopened = open(&image, &options);
        let held = reopened.dump().unwrap().keys().filter(|(c, _)| c == "c").count();
        assert_eq!(held, i, "redb's durable file holds {held} of {i} writes");
        reopened.close().await.unwrap();
    }
    /// Fails every all-or-nothing chain: before it reaches the store, or
    /// after it landed (the caller hears an error either way).
    struct FailAllOrNothing {
        landed: bool,
    }

    impl txgate_store::layer::Layer for FailAllOrNothing {
        async fn around<T: Send>(
            &self,
            _: &dyn txgate_store::Store,
            op: &txgate_store::layer::Op<'_>,
            run: impl std::future::Future<Output = txgate_store::StoreResult<T>> + Send,
        ) -> txgate_store::StoreResult<T> {
            if op.name != "write_all_or_nothing" {
                return run.await;
            }
            if self.landed {
                run.await?;
            }
            Err(txgate_store::StoreError::Unavailable("injected".into()))
        }
    }

    /// When the all-or-nothing commit of a transaction errs, its outcome is
    /// learned before the answer (rule zero): the id is fenced with an
    /// aborted record, so a commit that did not land never will (the answer
    /// is a store error, nothing written), and one that landed is answered
    /// committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_an_all_or_nothing_commit_that_errs_is_settled_before_the_answer() {
        use txgate::testing::document::StoredDoc;
        use txgate::testing::metrics::Metrics;
        use txgate::testing::txn::TxnConfig;
        use txgate::testing::txn::commit::TxnError;
        use txgate::testing::txn::plan::{Action, ActionOp, Plan};
        use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
        use txgate_store::layer::Layered;
        use txgate_store::{DateTime, DynStore};

        for landed in [false, true] {
            let embedded: DynStore = Arc::new(open(&SimDisk::new(), &Options::default()));
            txgate::migrate(embedded.as_ref()).await.unwrap();
            let d = StoredDoc::new_live("a".into(), doc! {"n": 1_i64}, 1, 1, DateTime::now());
            assert!(embedded.insert("acc", d.to_record()).await.unwrap());
            let store: DynStore = Arc::new(Layered::new(embedded.clone(), FailAllOrNothing { landed }));
            assert!(store.capabilities().all_or_nothing);
            let (txns, _) = txgate::transactions(store, TxnConfig::default(), Arc::new(Metrics::default()));
            let plan = Plan {
                actions: vec![Action {
                    collection: "acc".into(),
                    id: "a".into(),
                    op: ActionOp::Replace(doc! {"n": 2_i64}),
                    if_version: Some(1),
                }],
                schema_version: 1,
                request: "{}".into(),
                idempotency_key: None,
                hooks: Vec::new(),
                indexed: Default::default(),
                unique: Default::default(),
                claimed: Default::default(),
                schemas: Default::default(),
                warned: Default::default(),
                key: None,
                user: None,
            };
            let txn = "01900000-0000-7000-8000-000000000001".to_owned();
            let outcome = txns.execute(&plan, Some(txn.clone())).await;
            let rec = TxnRecord::from_record(embedded.get(TXNS, &txn).await.unwrap().unwrap()).unwrap();
            let doc = StoredDoc::from_record(embedded.get("acc", "a").await.unwrap().unwrap()).unwrap();
            if landed {
                assert_eq!(outcome.unwrap().record.id, txn);
                assert_eq!(rec.status, Status::Done);
                assert_eq!(doc.meta.v, 2);
            } else {
                assert!(matches!(outcome, Err(TxnError::Store { .. })), "{outcome:?}");
                assert_eq!(rec.status, Status::Aborted, "fenced");
                assert_eq!(doc.meta.v, 1, "nothing written");
            }
            txns.tasks().close();
            txns.tasks().wait().await;
            embedded.close().await.unwrap();
        }
    }

    /// A transaction whose members are free commits as one all-or-nothing
    /// commit: per k = 2 update transaction 6 writes (two post-images, two
    /// document events and the transaction's, the record inserted
    /// finished), one journal entry, one sync; no lock is ever stored. A
    /// member that is no longer as the request expects writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_a_transaction_of_free_members_is_one_commit_of_six_writes() {
        use serde_json::json;
        use txgate::testing::document::StoredDoc;
        use txgate::testing::document::rules::Patch;
        use txgate::testing::events::EVENTS;
        use txgate::testing::metrics::Metrics;
        use txgate::testing::txn::TxnConfig;
        use txgate::testing::txn::plan::{Action, ActionOp, Plan};
        use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
        use txgate_store::{DateTime, DynStore};

        let embedded = Arc::new(open(&SimDisk::new(), &Options::default()));
        let store: DynStore = embedded.clone();
        txgate::migrate(store.as_ref()).await.unwrap();
        for id in ["a", "b"] {
            let d = StoredDoc::new_live(id.into(), doc! {"n": 1_i64}, 1, 1, DateTime::now());
            assert!(store.insert("acc", d.to_record()).await.unwrap());
        }
        let (txns, _) = txgate::transactions(store.clone(), TxnConfig::default(), Arc::new(Metrics::default()));
        let plan = |if_version| {
            let patch = Patch::parse(None, None, Some(json!({"n": 2}).as_object().unwrap()), "").unwrap();
            let action = |id: &str| Action {
                collection: "acc".into(),
                id: id.into(),
                op: ActionOp::Update(patch.clone()),
                if_version: Some(if_version),
            };
            Plan {
                actions: vec![action("a"), action("b")],
                schema_version: 1,
                request: "{}".into(),
                idempotency_key: None,
                hooks: Vec::new(),
                indexed: Default::default(),
                unique: Default::default(),
                claimed: Default::default(),
                schemas: Default::default(),
                warned: Default::default(),
                key: None,
                user: None,
            }
        };
        let stats = embedded.stats();
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let before = (count(&stats.writes), count(&stats.entries), count(&stats.syncs));
        let committed = txns.execute(&plan(1), None).await.unwrap();
        let after = (count(&stats.writes), count(&stats.entries), count(&stats.syncs));
        assert_eq!(after.0 - before.0, 6, "writes");
        assert_eq!(after.1 - before.1, 1, "journal entries");
        assert_eq!(after.2 - before.2, 1, "syncs");
        let id = committed.record.id;
        let rec = TxnRecord::from_record(store.get(TXNS, &id).await.unwrap().unwrap()).unwrap();
        assert_eq!(rec.status, Status::Done);
        assert!(rec.committed_at.is_some() && rec.finished_at.is_some());
        for d in ["a", "b"] {
            let d = StoredDoc::from_record(store.get("acc", d).await.unwrap().unwrap()).unwrap();
            let n = d.data.get("n").and_then(|n| n.as_i64().or(n.as_i32().map(i64::from)));
            assert_eq!((d.meta.v, d.meta.txn.as_deref(), n), (2, None, Some(3)), "n incremented by 2");
        }
        for event in ["acc/a/2", "acc/b/2", &format!("_txns/{id}")] {
            assert!(store.get(EVENTS, event).await.unwrap().is_some(), "{event} is in the log");
        }
        // At version 1 no more: nothing is written, and nothing is left.
        let writes = count(&stats.writes);
        assert!(txns.execute(&plan(1), None).await.is_err());
        for d in ["a", "b"] {
            let d = StoredDoc::from_record(store.get("acc", d).await.unwrap().unwrap()).unwrap();
            assert_eq!((d.meta.v, d.meta.txn.as_deref()), (2, None));
        }
        assert!(count(&stats.writes) > writes);
        txns.tasks().close();
        txns.tasks().wait().await;
        store.close().await.unwrap();
    }
}

/// A clean stop (SIGTERM) checkpoints and closes the store: the journal's
/// current generation is empty, so the next start replays nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_clean_stop_leaves_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let (mut child, base) = crate::restart::start_with(dir.path(), &[]);
    let url = format!("{base}/v1/collections/things/documents");
    for i in 0..5 {
        let res = client.post(&url).json(&serde_json::json!({"_id": format!("t{i}")})).send().await.unwrap();
        assert_eq!(res.status(), 201);
    }
    let journal = dir.path().join("txgate.journal");
    assert!(!entry_offsets(&std::fs::read(&journal).unwrap()).is_empty(), "the writes are journaled");
    crate::upgrade::stop(&mut child);
    assert_eq!(entry_offsets(&std::fs::read(&journal).unwrap()), Vec::<usize>::new());
    let (mut child, base) = crate::restart::start_with(dir.path(), &[]);
    let res = client.get(format!("{base}/v1/collections/things/documents/t4")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    crate::upgrade::stop(&mut child);
}

/// A backup written onto a simulated disk: crashed at each of its own
/// writes and syncs, nothing is promised (a real backup is a `.partial`
/// directory until it is whole), but what is left never panics the open;
/// crashed right after it answered, every image of what the crash left
/// (only what was synced, and random subsets) opens as a store holding
/// every record it said it copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_backup_survives_power_loss_while_it_is_written() {
    use std::sync::Arc;
    use txgate_store::embedded::{DATABASE_FILE, EmbeddedStore, Options};
    use txgate_store::simdisk::{Keep, SimDisk};
    use txgate_store::{Durability, Store, Write};
    let dir = tempfile::tempdir().unwrap();
    let source = EmbeddedStore::open(&dir.path().join("data")).unwrap();
    for i in 0..300 {
        let record = mongodb::bson::doc! {"_id": format!("x{i:03}"), "p": "x".repeat(300)};
        source.write("c", Write::Insert(record), Durability::Unsynced).await.unwrap();
    }
    let options = Options { cache_bytes: 1 << 20, ..Options::default() };
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    let images = |crash: &txgate_store::simdisk::Crash, rng: &mut rand::rngs::StdRng| {
        [Keep::Durable, Keep::Random, Keep::Random].map(|keep| (keep, crash.survivor(keep, rng)))
    };
    let mut points = 0;
    for point in 1.. {
        let disk = SimDisk::new();
        disk.byte_atomic(DATABASE_FILE);
        disk.crash_at(point);
        let records = source.backup_onto(Arc::new(disk.clone())).await.unwrap();
        assert_eq!(records, 300);
        let Some(crash) = disk.crash() else {
            // Past the backup's last operation: crashed right after it
            // answered.
            disk.crash_now();
            for (keep, image) in images(&disk.crash().unwrap(), &mut rng) {
                let store = EmbeddedStore::open_on(Arc::new(image), &options)
                    .unwrap_or_else(|e| panic!("{keep:?}: the answered backup does not open: {e}"));
                let held = store.dump().unwrap().keys().filter(|(c, _)| c == "c").count();
                assert_eq!(held, 300, "{keep:?}: the answered backup lost records");
                store.close().await.unwrap();
            }
            break;
        };
        points += 1;
        for (_, image) in images(&crash, &mut rng) {
            if let Ok(store) = EmbeddedStore::open_on(Arc::new(image), &options) {
                store.close().await.unwrap();
            }
        }
    }
    assert!(points > 20, "the backup was crashed at {points} points");
    source.close().await.unwrap();
}

/// A backup taken while writes go on opens, and the store restored from it
/// survives power loss at each write and sync of its first minutes of
/// work (the backup's database is closed by redb, which the gateway's
/// own store never is: this checks that start too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_restored_backup_survives_power_loss() {
    use std::sync::Arc;
    use txgate_store::embedded::{DATABASE_FILE, EmbeddedStore, Options};
    use txgate_store::simdisk::SimDisk;
    use txgate_store::{Durability, Store, Write};
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(EmbeddedStore::open(&dir.path().join("data")).unwrap());
    let (started, writing) = tokio::sync::oneshot::channel();
    let writer = {
        let source = Arc::clone(&source);
        tokio::spawn(async move {
            let mut started = Some(started);
            for i in 0..400 {
                let record = mongodb::bson::doc! {"_id": format!("x{i:03}"), "p": "x".repeat(300)};
                source.write("c", Write::Insert(record), Durability::Synced).await.unwrap();
                if i == 20 {
                    let _ = started.take().expect("once").send(());
                }
            }
        })
    };
    // The backup starts with writes behind it and more on their way.
    writing.await.expect("the writer got going");
    let backup = dir.path().join("backup");
    let info = source.backup(&backup).await.unwrap().unwrap();
    writer.await.unwrap();
    source.close().await.unwrap();
    let options = Options {
        cache_bytes: 1 << 20,
        sync_interval: std::time::Duration::from_secs(3600),
        checkpoint_bytes: 6 << 10,
        checkpoint_interval: None,
        quick_repair: true,
        ..Options::default()
    };
    // The copy holds a prefix of the writes.
    let restored = EmbeddedStore::open_on(Arc::new(SimDisk::load(&backup).unwrap()), &options).unwrap();
    let held = restored.dump().unwrap().keys().filter(|(c, _)| c == "c").count();
    assert_eq!(held as u64, info.records, "the backup says how many records it holds");
    assert!(held > 0 && held <= 400);
    for i in 0..held {
        assert!(restored.get("c", &format!("x{i:03}")).await.unwrap().is_some(), "x{i:03} missing below x{held:03}");
    }
    restored.verify_indexes().unwrap();
    restored.close().await.unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    let fresh = || {
        let disk = SimDisk::load(&backup).unwrap();
        disk.byte_atomic(DATABASE_FILE);
        disk
    };
    let points = crash_first_work(fresh, 30, &options, Some(&format!("x{:03}", held - 1)), &mut rng).await;
    assert!(points > 50, "{points} crash points");
}

/// A start refused on a damaged journal leaves redb's file as its last
/// checkpoint did (redb never closes it: see `disk::Fence`); once the
/// operator cuts the journal, the store that opens survives power loss at
/// each write and sync of its first work. (A file redb closed itself and
/// opened again can be left unopenable by a power loss in a later commit:
/// docs/redb-report.md. This sweep passes with the fence on the refused
/// path removed too: the path is safe either way, and the fence stays as
/// defence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_refused_start_leaves_the_database_as_it_was() {
    use std::sync::Arc;
    use txgate_store::disk::Disk;
    use txgate_store::embedded::{EmbeddedStore, JOURNAL_FILE};
    let options = sweep_options(6 << 10);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let image = synced_writes_then_power_cut(40, &options, &mut rng).await;
    // A byte of the journal's first entry flipped: the start is refused.
    let journal = image.contents(JOURNAL_FILE).unwrap();
    let first = entry_offsets(&journal)[0];
    let file = image.open_file(JOURNAL_FILE).unwrap();
    file.write(first as u64 + 40, &[journal[first + 40] ^ 0x55]).unwrap();
    file.sync_data().unwrap();
    let refused = EmbeddedStore::open_on(Arc::new(image.clone()), &options);
    assert!(refused.is_err(), "the start was not refused");
    // The operator drops the journal (`journal truncate --at 0`).
    file.write(0, &vec![0u8; journal.len()]).unwrap();
    file.sync_data().unwrap();
    drop(file);
    let points = crash_first_work(|| image.copy(), 20, &options, None, &mut rng).await;
    assert!(points > 30, "{points} crash points");
}

/// The store's options in these sweeps: syncs and checkpoints (every
/// `checkpoint_bytes` of journal) only when the work makes them, a seal
/// with every sync.
fn sweep_options(checkpoint_bytes: u64) -> txgate_store::embedded::Options {
    txgate_store::embedded::Options {
        cache_bytes: 1 << 20,
        sync_interval: std::time::Duration::from_secs(3600),
        checkpoint_bytes,
        checkpoint_interval: None,
        seal_delay: std::time::Duration::ZERO,
        ..Default::default()
    }
}

/// `writes` synced inserts (`c/x00`, ...) past the last checkpoint, then
/// a power cut: what was synced, where the journal holds them and redb's
/// file does not.
async fn synced_writes_then_power_cut(
    writes: usize,
    options: &txgate_store::embedded::Options,
    rng: &mut rand::rngs::StdRng,
) -> txgate_store::simdisk::SimDisk {
    use std::sync::Arc;
    use txgate_store::embedded::{DATABASE_FILE, EmbeddedStore};
    use txgate_store::simdisk::{Keep, SimDisk};
    use txgate_store::{Durability, Store, Write};
    let disk = SimDisk::new();
    disk.byte_atomic(DATABASE_FILE);
    let store = EmbeddedStore::open_on(Arc::new(disk.clone()), options).unwrap();
    for i in 0..writes {
        let record = mongodb::bson::doc! {"_id": format!("x{i:02}"), "p": "x".repeat(100)};
        store.write("c", Write::Insert(record), Durability::Synced).await.unwrap();
    }
    disk.crash_now();
    drop(store);
    disk.crash().unwrap().survivor(Keep::Durable, rng)
}

/// The first work of a store opened on `fresh()` (`writes` inserts, every
/// third synced) crashed at each of its writes and syncs in turn: every
/// image of what each crash left (everything written, only what was
/// synced, a random subset) opens with its indexes whole, and holds
/// record `kept` of collection `c` if one is named. The crash points.
async fn crash_first_work(
    fresh: impl Fn() -> txgate_store::simdisk::SimDisk,
    writes: usize,
    options: &txgate_store::embedded::Options,
    kept: Option<&str>,
    rng: &mut rand::rngs::StdRng,
) -> usize {
    use std::sync::Arc;
    use txgate_store::embedded::EmbeddedStore;
    use txgate_store::simdisk::Keep;
    use txgate_store::{Durability, Store, Write};
    let mut points = 0;
    for point in 1.. {
        let disk = fresh();
        disk.crash_at(point);
        let store = EmbeddedStore::open_on(Arc::new(disk.clone()), options).unwrap();
        for i in 0..writes {
            let record = mongodb::bson::doc! {"_id": format!("y{i:02}"), "p": "y".repeat(300)};
            let durability = if i % 3 == 0 { Durability::Synced } else { Durability::Unsynced };
            store.write("c", Write::Insert(record), durability).await.unwrap();
        }
        store.close().await.unwrap();
        let Some(crash) = disk.crash() else { break };
        points += 1;
        for keep in [Keep::All, Keep::Durable, Keep::Random] {
            let image = crash.survivor(keep, rng);
            let reopened = EmbeddedStore::open_on(Arc::new(image), options)
                .unwrap_or_else(|e| panic!("crash at op {point} ({}), {keep:?}: {e}", crash.op));
            reopened.verify_indexes().unwrap();
            if let Some(id) = kept {
                assert!(reopened.get("c", id).await.unwrap().is_some(), "crash at op {point}, {keep:?}: {id} lost");
            }
            reopened.close().await.unwrap();
        }
    }
    points
}

/// A crash after checkpoints needs no full repair of redb's file at the
/// next open: checkpoints save the allocator state (quick repair). Without
/// it redb walks the whole file (351 ms at a million documents here, see
/// docs/benchmarks.md, "Durability of the embedded store").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_open_after_a_crash_needs_no_full_repair() {
    use std::sync::Arc;
    use txgate_store::embedded::{DATABASE_FILE, EmbeddedStore, Options};
    use txgate_store::simdisk::{Keep, SimDisk};
    use txgate_store::{Durability, Store, Write};
    let options = Options { checkpoint_bytes: 16 << 10, ..Options::default() };
    for keep in [Keep::All, Keep::Durable] {
        let disk = SimDisk::new();
        disk.byte_atomic(DATABASE_FILE);
        let store = EmbeddedStore::open_on(Arc::new(disk.clone()), &options).unwrap();
        for i in 0..300 {
            let record = mongodb::bson::doc! {"_id": format!("x{i:03}"), "p": "x".repeat(300)};
            store.write("c", Write::Insert(record), Durability::Synced).await.unwrap();
        }
        assert!(store.stats().checkpoints.load(std::sync::atomic::Ordering::Relaxed) > 2);
        disk.crash_now();
        store.close().await.unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(3);
        let image = disk.crash().unwrap().survivor(keep, &mut rng);
        let reopened = EmbeddedStore::open_on(Arc::new(image), &options).unwrap();
        assert!(!reopened.repaired_at_open(), "{keep:?}: redb repaired the whole file");
        assert!(reopened.get("c", "x299").await.unwrap().is_some());
        reopened.close().await.unwrap();
    }
}

/// The first open of each previous release's data directory kept as a
/// fixture (older layouts to upgrade, a journal of format 2 with entries
/// to replay) crashed at each of its writes and syncs: every image of what
/// each crash left opens holding what the crash-free open holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_upgrade_and_replay_at_first_open_survive_power_loss() {
    use txgate_store::powerloss::crash_the_first_open;
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut total = 0;
    for name in [
        "embedded-v1",
        "embedded-layout1",
        "embedded-layout2",
        "embedded-shared-unique",
        "embedded-journal2-unreplayed",
    ] {
        let crashes = crash_the_first_open(&fixtures.join(name), 11).await.unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{name}: its first open crashed and checked {crashes} times");
        assert!(crashes >= 4, "{name}: the first open was crashed {crashes} times");
        total += crashes;
    }
    assert!(total > 40, "{total} crashes");
}

/// `txgate journal truncate` crashed at each of its writes and syncs:
/// every image of what a crash left either opens holding the entries
/// before the cut and nothing after, or is refused as before and the same
/// cut, run again, settles it. The database file is never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_journal_truncate_survives_power_loss() {
    use std::sync::Arc;
    use txgate_store::Store;
    use txgate_store::disk::Disk;
    use txgate_store::embedded::{DATABASE_FILE, EmbeddedStore, JOURNAL_FILE, truncate_journal};
    use txgate_store::simdisk::Keep;
    let options = sweep_options(1 << 20);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(13);
    let image = synced_writes_then_power_cut(30, &options, &mut rng).await;
    // A byte of the 11th entry flipped: the start is refused.
    let journal = image.contents(JOURNAL_FILE).unwrap();
    let offsets = entry_offsets(&journal);
    assert!(offsets.len() >= 30, "{} entries", offsets.len());
    let cut = offsets[10];
    let file = image.open_file(JOURNAL_FILE).unwrap();
    file.write(cut as u64 + 40, &[journal[cut + 40] ^ 0x55]).unwrap();
    file.sync_data().unwrap();
    drop(file);
    assert!(EmbeddedStore::open_on(Arc::new(image.copy()), &options).is_err(), "the start was not refused");
    let database = image.contents(DATABASE_FILE).unwrap();
    // The cut, crash-free: the first ten writes and nothing after.
    let expected = {
        let whole = image.copy();
        truncate_journal(&whole, cut as u64, false).unwrap();
        assert_eq!(whole.contents(DATABASE_FILE).unwrap(), database, "the cut wrote the database");
        let store = EmbeddedStore::open_on(Arc::new(whole), &options).unwrap();
        let dump = store.dump().unwrap();
        store.close().await.unwrap();
        dump
    };
    let kept: Vec<_> = expected.keys().filter(|(c, _)| c == "c").map(|(_, id)| id.clone()).collect();
    assert_eq!(kept, (0..10).map(|i| format!("x{i:02}")).collect::<Vec<_>>());
    let ops = {
        let probe = image.copy();
        truncate_journal(&probe, cut as u64, false).unwrap();
        probe.ops()
    };
    assert!(ops >= 3, "the cut made {ops} writes and syncs");
    let (mut opened, mut cut_again) = (0, 0);
    for point in 1..=ops {
        let disk = image.copy();
        disk.crash_at(point);
        truncate_journal(&disk, cut as u64, false).unwrap();
        let crash = disk.crash().expect("crashed");
        for keep in [Keep::All, Keep::Durable, Keep::Random, Keep::Random] {
            let survivor = crash.survivor(keep, &mut rng);
            let context = format!("crash at op {point} of {ops} ({}), {keep:?}", crash.op);
            assert_eq!(survivor.contents(DATABASE_FILE).unwrap(), database, "{context}: the cut wrote the database");
            let store = match EmbeddedStore::open_on(Arc::new(survivor.copy()), &options) {
                Ok(store) => {
                    opened += 1;
                    store
                }
                Err(refused) => {
                    assert!(refused.to_string().contains(JOURNAL_FILE), "{context}: {refused}");
                    truncate_journal(&survivor, cut as u64, false).unwrap_or_else(|e| panic!("{context}: {e}"));
                    cut_again += 1;
                    EmbeddedStore::open_on(Arc::new(survivor), &options)
                        .unwrap_or_else(|e| panic!("{context}: refused after the cut ran again: {e}"))
                }
            };
            assert!(store.dump().unwrap() == expected, "{context}: not the entries before the cut");
            store.verify_indexes().unwrap();
            store.close().await.unwrap();
        }
    }
    eprintln!("journal truncate: {ops} crash points; {opened} images opened, {cut_again} needed the cut again");
}

/// The reproduction of docs/redb-report.md, on redb alone: a database
/// file as it was durable before a power loss, and one 4 KiB page that
/// redb wrote (unsynced, the header untouched) in the flush of the commit
/// the power loss cut off. redb opens the file; with the page written over
/// it, which a power loss may keep, it does not ("Primary is corrupted
/// despite 2-phase commit"): the page belongs to the durable commit.
/// Ignored: it fails on redb 4.5 (the store keeps redb from writing after
/// its last checkpoint instead, see `disk::Fence`); run it with `--ignored`
/// against a new redb before the fence is taken out.
#[test]
#[ignore = "fails on redb 4.5: see docs/redb-report.md"]
fn redb_opens_its_file_after_a_power_loss_kept_one_page_of_an_unsynced_flush() {
    let (dir, durable, page) = redb_report_fixture();
    let mut image = durable;
    image[20480..20480 + 4096].copy_from_slice(&page);
    let path = dir.path().join("image.redb");
    std::fs::write(&path, image).unwrap();
    if let Err(e) = redb::Database::open(&path) {
        panic!("redb does not open the file: {e}");
    }
}

/// The fixture of docs/redb-report.md is sound: redb opens the durable
/// file as it is.
#[test]
fn redb_report_fixture_opens_as_it_was_durable() {
    let (dir, durable, _) = redb_report_fixture();
    let path = dir.path().join("durable.redb");
    std::fs::write(&path, durable).unwrap();
    redb::Database::open(&path).unwrap();
}

/// The fixture's durable file and the page, and a directory to open them in.
fn redb_report_fixture() -> (tempfile::TempDir, Vec<u8>, Vec<u8>) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/redb-overwritten-page");
    let durable = std::fs::read(fixture.join("durable.redb")).unwrap();
    let page = std::fs::read(fixture.join("page-at-20480.bin")).unwrap();
    assert_eq!((durable.len(), page.len()), (307_200, 4096));
    (tempfile::tempdir().unwrap(), durable, page)
}
