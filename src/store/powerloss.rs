//! The power-loss harness of the embedded store: a workload on a
//! [`SimDisk`], crashed at each of its writes and syncs in turn, and the
//! store reopened on what the crash left (docs/design.md §1; docs/operating.md,
//! "Durability", says what is promised).
//!
//! The workload drives the store the way the gateway does, one call at a
//! time: documents written with their change event and outbox (one chain),
//! transactions (the record and a member's lock unsynced, the commit CAS
//! synced, the roll-forward unsynced), refused conditional writes,
//! deletes, log appends, syncs, index changes, an online index build made
//! a few records a step (across the clean reopen), an index dropped and
//! made again and another made over existing records (offline builds),
//! checkpoints (the journal is kept small so they come often), a clean
//! close and reopen half-way and another at the end, followed by an online
//! build whose last step alone makes it durable. After every call the
//! harness keeps the store's whole state (records, index declarations and
//! their states): the history of commits. An answer counts as given when
//! the store records it, just before it answers ([`Options::on_answer`]). A crash comes at the n-th write or sync of the device; the
//! harness then opens the store on the surviving image and checks that
//! - it opens, without a panic;
//! - its state is the state after some call of the history, at or after
//!   the last call acknowledged as synced before the crash (every
//!   acknowledged synced write is there, and nothing later than a lost
//!   write is);
//! - every index entry matches its record, and nothing else is indexed
//!   (an online build cut short may lack entries, and its counts are
//!   those of the entries it has; built again from its first record, as a
//!   restarted gateway builds it, it lacks none; once recorded ready, it
//!   lacks none without being built again);
//! - it takes writes again;
//! - damage to what its journal says was synced refuses the start
//!   ([`synced_damage_refused`], on the synced-only image).
//!
//! A two-crash sequence goes on from there: the recovered store writes a
//! little more, crashes again with its last writes unsynced, and is
//! checked the same way. A second, uniform workload (inserts whose journal
//! entries all have one size) is crashed at each of its writes and syncs
//! and always continued this way: after a crash that lost a generation's
//! first entry but kept later ones, the next generation's entries line up
//! with the stale ones, which must never be taken for new.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::embedded::{EmbeddedStore, OnAnswer, Options};
use super::simdisk::{Keep, SimDisk};
use super::{Document, Durability, IndexSpec, LOG_SEQ, Store, Update, Write};

/// A store's whole state: `(collection, id) -> BSON`.
pub(crate) type State = BTreeMap<(String, String), Vec<u8>>;

/// The states after each call, and the last one a synced answer covers.
#[derive(Default)]
struct Trace {
    history: Vec<State>,
    acked: usize,
}

/// How much of the crash space to cover.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub seed: u64,
    /// Survivor images per crash point (the first keeps everything written,
    /// the second only what was synced, the rest random subsets).
    pub images_per_point: usize,
    /// Every n-th crash point also runs a two-crash sequence (0: none).
    pub two_crash_every: u64,
    /// Every n-th crash point also crashes the reopen of its last image
    /// at each of the reopen's writes and syncs, and opens a third time
    /// (0: none).
    pub recovery_every: u64,
    /// Print a line per this many crash points (0: quiet).
    pub progress_every: u64,
}

/// What a sweep covered.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Writes and syncs of the whole workload: the crash points.
    pub ops: u64,
    pub crash_points: u64,
    pub images: u64,
    pub two_crash: u64,
    /// Crashes inside a reopen (recovery), each checked on its images.
    pub recovery_crashes: u64,
    /// Images whose synced journal entries were then damaged, each start
    /// refused (see [`synced_damage_refused`]).
    pub damage_refused: u64,
    /// Crash points by the operation interrupted.
    pub by_op: BTreeMap<&'static str, u64>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {}, {} writes and syncs in the workload, {} crash points ({:?}), {} survivor images, {} two-crash \
             sequences, {} crashes inside recovery, {} damaged synced entries refused",
            self.seed,
            self.ops,
            self.crash_points,
            self.by_op,
            self.images,
            self.two_crash,
            self.recovery_crashes,
            self.damage_refused
        )
    }
}

fn options() -> Options {
    Options {
        cache_bytes: 1 << 20,
        // Syncs come only from the workload (deterministic).
        sync_interval: Duration::from_secs(3600),
        checkpoint_bytes: 6 << 10,
        // Checkpoints come only from the journal's size (deterministic).
        checkpoint_interval: None,
        quick_repair: true,
        // Seals with every sync, not after an idle moment (deterministic).
        seal_delay: Duration::ZERO,
        ..Options::default()
    }
}

/// A new simulated disk; the database file keeps redb's assumptions of
/// the medium.
fn new_disk() -> SimDisk {
    let disk = SimDisk::new();
    disk.slow_syncs(Duration::from_micros(50));
    disk.byte_atomic(super::embedded::DATABASE_FILE);
    disk.byte_atomic("txgate.redb.new");
    disk
}

fn open(disk: &SimDisk) -> Result<EmbeddedStore, String> {
    let answers = disk.clone();
    let options = Options { on_answer: Some(OnAnswer(Arc::new(move || answers.answering()))), ..options() };
    EmbeddedStore::open_on(Arc::new(disk.clone()), &options).map_err(|e| format!("the store does not open: {e}"))
}

fn doc(pairs: &[(&str, super::Bson)]) -> Document {
    let mut d = Document::new();
    for (k, v) in pairs {
        d.insert(*k, v.clone());
    }
    d
}

fn set(pairs: &[(&str, super::Bson)]) -> Update {
    Update { set: doc(pairs), unset: Vec::new() }
}

fn unset(field: &str) -> Update {
    Update { set: Document::new(), unset: vec![field.to_owned()] }
}

fn indexes() -> Vec<(&'static str, IndexSpec)> {
    let spec = |name: &str, fields: &[&str], unique: bool, sparse: bool| IndexSpec {
        name: name.into(),
        fields: fields.iter().map(|f| (*f).to_owned()).collect(),
        unique,
        sparse,
        // Counts kept for the non-unique, non-sparse ones (as for a
        // declared query index), so a crash is checked against them too.
        counted: !unique && !sparse,
    };
    vec![
        ("docs", spec("by_email", &["email"], true, false)),
        ("docs", spec("by_status", &["status", "n"], false, false)),
        ("docs", spec("locked", &["lock"], false, true)),
        ("ev", spec("by_seq", &[LOG_SEQ], true, false)),
        ("txns", spec("by_status", &["status"], false, false)),
    ]
}

/// The index the workload declares half-way and builds online, a few
/// records a step, while its other writes go on (and across its clean
/// reopen).
const ONLINE: (&str, &str) = ("docs", "by_n_online");

/// Where the workload records [`ONLINE`] ready.
const READY: &str = "ready";

/// The workload's turn at which [`ONLINE`] is declared.
const ONLINE_AT: i64 = 14;

/// The workload's turn at which an index is dropped and made again, and
/// [`scratch_spec`] made, over the records there.
const OFFLINE_AT: i64 = 25;

/// An index the workload makes over the records of `scratch`.
fn scratch_spec() -> IndexSpec {
    IndexSpec { name: "by_n".into(), fields: vec!["n".into()], unique: false, sparse: true, counted: false }
}

fn online_spec() -> IndexSpec {
    IndexSpec {
        name: ONLINE.1.into(),
        fields: vec!["n".into(), "status".into()],
        unique: false,
        sparse: false,
        counted: true,
    }
}

/// The index the workload declares after its last clean reopen and builds
/// online to its end with nothing in the journal: the build's last step
/// alone makes it durable (no checkpoint comes before it).
const LAST_ONLINE: (&str, &str) = ("scratch", "n_online");

fn last_online_spec() -> IndexSpec {
    IndexSpec { name: LAST_ONLINE.1.into(), fields: vec!["n".into()], unique: false, sparse: false, counted: true }
}

/// A whole build of `index` from its first record, as a gateway
/// restarted after a crash makes it, made durable at its end.
async fn build_online(store: &EmbeddedStore, (coll, name): (&str, &str)) -> super::StoreResult<()> {
    let mut after = None;
    while let Some(next) = store.build_index_step(coll, name, after.as_deref(), 3).await? {
        after = Some(next);
    }
    store.build_index_step(coll, name, None, 0).await?;
    Ok(())
}

/// Whether a call, begun when the store's answers stood at `answers`
/// ([`SimDisk::answers`]), was answered before the crash: an answer after
/// it acknowledged nothing. The store records its answer before giving it,
/// so a crash right after (in a checkpoint the answer did not wait for)
/// still counts the answer as given; a call answered without the writer
/// counts as given unless the crash had come by its end.
fn answered_before_crash(disk: &SimDisk, (answers, given): (u64, u64)) -> bool {
    match disk.answers() {
        (now, _) if now == answers => !disk.crashed(),
        (now, now_given) => now_given - given == now - answers,
    }
}

/// One call of the workload, then the state it left.
macro_rules! step {
    ($disk:expr, $store:expr, $trace:expr, $synced:expr, $call:expr) => {{
        let answers = $disk.answers();
        let result = $call.await;
        let answered_before = answered_before_crash($disk, answers);
        if let Err(err) = result {
            return Err(format!("the workload's call failed: {err}"));
        }
        $trace.history.push($store.dump_with_catalog().map_err(|e| e.to_string())?);
        if $synced && answered_before {
            $trace.acked = $trace.history.len() - 1;
        }
        if $disk.crashed() {
            return Ok(());
        }
    }};
}

/// A document write as the gateway makes it: the document with its event
/// in the outbox, the event appended to the log, the outbox cleared.
async fn document_write(store: &EmbeddedStore, id: &str, v: i64, status: &str, n: i64) -> super::StoreResult<usize> {
    let event = doc(&[("_id", format!("docs/{id}/{v}").into()), ("type", "document.updated".into())]);
    let record = doc(&[
        ("_id", id.into()),
        ("email", format!("{id}@example.com").into()),
        ("status", status.into()),
        ("n", n.into()),
        ("v", v.into()),
        ("outbox", event.clone().into()),
        ("pad", "x".repeat(200).into()),
    ]);
    let first = if v == 1 {
        Write::Insert(record)
    } else {
        Write::Replace { id, filter: doc(&[("v", (v - 1).into())]), record }
    };
    let chain = vec![
        ("docs", first),
        ("ev", Write::Append(event)),
        ("docs", Write::Update { id, filter: doc(&[("v", v.into())]), update: unset("outbox") }),
    ];
    store.write_in_order(chain, Durability::Synced).await
}

/// A document write (see [`document_write`]) with a reader polling the
/// document meanwhile; whether a read whose snapshot came before the crash
/// (it ended before the crash) saw the new version. Such a write was
/// visible, so it must survive as if answered: a commit is visible only
/// once durable.
async fn watched_write(
    disk: &SimDisk,
    store: &EmbeddedStore,
    id: &str,
    v: i64,
    status: &str,
    n: i64,
) -> (super::StoreResult<usize>, bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    let write = async {
        let result = document_write(store, id, v, status, n).await;
        done.store(true, Ordering::SeqCst);
        result
    };
    let watch = async {
        let mut seen = false;
        while !done.load(Ordering::SeqCst) {
            if let Ok(Some(record)) = store.get("docs", id).await {
                if record.get_i64("v").unwrap_or(0) >= v && !disk.crashed() {
                    seen = true;
                }
            }
            tokio::task::yield_now().await;
        }
        seen
    };
    tokio::join!(write, watch)
}

/// A clean close of `store` and an open again, its state kept in
/// `trace`; false once the disk has crashed.
async fn reopen(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace) -> Result<bool, String> {
    store.close().await.map_err(|e| e.to_string())?;
    if disk.crashed() {
        return Ok(false);
    }
    *store = open(disk)?;
    trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
    Ok(!disk.crashed())
}

/// The workload; returns when it is done or the disk has crashed.
async fn workload(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace) -> Result<(), String> {
    trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
    for (coll, spec) in indexes() {
        step!(disk, store, trace, true, store.ensure_index(coll, spec));
    }
    let mut versions: BTreeMap<String, i64> = BTreeMap::new();
    // Where the online build goes on, while it is under way.
    let mut building: Option<Option<String>> = None;
    let mut build_steps = 0;
    for i in 0..36i64 {
        let id = format!("d{:02}", i % 9);
        let v = versions.get(&id).copied().unwrap_or(0) + 1;
        if i == ONLINE_AT {
            step!(disk, store, trace, true, store.declare_index(ONLINE.0, online_spec()));
            building = Some(None);
        } else if let Some(after) = building.take() {
            // A step of two records (unsynced), every second one made
            // durable, and the build's end.
            let mut next = None;
            step!(disk, store, trace, false, async {
                next = store.build_index_step(ONLINE.0, ONLINE.1, after.as_deref(), 2).await?;
                Ok::<_, super::StoreError>(())
            });
            build_steps += 1;
            if next.is_none() || build_steps % 2 == 0 {
                step!(disk, store, trace, false, store.build_index_step(ONLINE.0, ONLINE.1, None, 0));
            }
            if next.is_none() {
                // Ready, as the gateway records it (synced) once the
                // build's end is durable: from then on it is trusted whole.
                let ready = doc(&[("_id", ONLINE.1.into()), ("state", "ready".into())]);
                step!(disk, store, trace, true, store.write(READY, Write::Insert(ready), Durability::Synced));
            }
            building = next.map(Some);
        }
        if i == OFFLINE_AT {
            // An index dropped and made again over the records there (a
            // build in one durable commit, as a gateway drops a deleted
            // index, or one separated at upgrade, and builds its
            // replacement), and a new one over a collection's records:
            // after a crash each is there whole or not at all.
            let (coll, spec) = indexes().swap_remove(1);
            step!(disk, store, trace, true, store.drop_index(coll, &spec.name));
            step!(disk, store, trace, true, store.ensure_index(coll, spec));
            step!(disk, store, trace, true, store.ensure_index("scratch", scratch_spec()));
        }
        match i % 6 {
            0 | 3 => {
                let answers = disk.answers();
                let (result, seen) = watched_write(disk, store, &id, v, "open", i).await;
                let answered_before = answered_before_crash(disk, answers);
                if let Err(err) = result {
                    return Err(format!("the workload's call failed: {err}"));
                }
                trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
                if answered_before || seen {
                    trace.acked = trace.history.len() - 1;
                }
                if disk.crashed() {
                    return Ok(());
                }
                versions.insert(id, v);
            }
            1 => {
                // A transaction on `id`: record and lock, commit, roll forward.
                if v == 1 {
                    step!(disk, store, trace, true, document_write(store, &id, v, "new", i));
                    versions.insert(id.clone(), v);
                }
                let t = format!("t{i:02}");
                let txn =
                    doc(&[("_id", t.as_str().into()), ("status", "pending".into()), ("member", id.as_str().into())]);
                let lock = Write::Update {
                    id: &id,
                    filter: doc(&[("lock", super::Bson::Null)]),
                    update: set(&[("lock", t.as_str().into())]),
                };
                step!(
                    disk,
                    store,
                    trace,
                    false,
                    store.write_in_order(vec![("txns", Write::Insert(txn)), ("docs", lock)], Durability::Unsynced)
                );
                let commit = Write::Update {
                    id: &t,
                    filter: doc(&[("status", "pending".into())]),
                    update: set(&[("status", "committed".into())]),
                };
                step!(disk, store, trace, true, store.write("txns", commit, Durability::Synced));
                let forward = vec![
                    (
                        "docs",
                        Write::Update {
                            id: &id,
                            filter: doc(&[("lock", t.as_str().into())]),
                            update: set(&[("status", "paid".into()), ("n", (i * 100).into())]),
                        },
                    ),
                    (
                        "docs",
                        Write::Update { id: &id, filter: doc(&[("lock", t.as_str().into())]), update: unset("lock") },
                    ),
                    (
                        "txns",
                        Write::Update {
                            id: &t,
                            filter: doc(&[("status", "committed".into())]),
                            update: set(&[("status", "done".into())]),
                        },
                    ),
                ];
                step!(disk, store, trace, false, store.write_in_order(forward, Durability::Unsynced));
            }
            2 => {
                // A refused conditional write, then an unsynced burst.
                step!(
                    disk,
                    store,
                    trace,
                    true,
                    store.write(
                        "docs",
                        Write::Update {
                            id: &id,
                            filter: doc(&[("v", (-1).into())]),
                            update: set(&[("status", "never".into())])
                        },
                        Durability::Synced
                    )
                );
                for j in 0..3 {
                    let r =
                        doc(&[("_id", format!("u{i:02}{j}").into()), ("n", j.into()), ("pad", "y".repeat(300).into())]);
                    step!(disk, store, trace, false, store.write("scratch", Write::Insert(r), Durability::Unsynced));
                }
            }
            4 => {
                step!(disk, store, trace, true, store.sync());
                let old = format!("u{:02}1", i - 2);
                step!(
                    disk,
                    store,
                    trace,
                    true,
                    store.write("scratch", Write::Delete { id: &old, filter: Document::new() }, Durability::Synced)
                );
            }
            _ => {
                if i == 17 {
                    // A clean close and reopen half-way.
                    if !reopen(disk, store, trace).await? {
                        return Ok(());
                    }
                } else {
                    let r = doc(&[("_id", format!("p{i:02}").into()), ("pad", "z".repeat(2000).into())]);
                    step!(disk, store, trace, false, store.write("scratch", Write::Insert(r), Durability::Unsynced));
                }
            }
        }
    }
    // A clean close and reopen (the journal starts empty), then an online
    // build to its end: no checkpoint comes before its last step, which
    // alone makes it durable before it is recorded ready.
    if !reopen(disk, store, trace).await? {
        return Ok(());
    }
    step!(disk, store, trace, true, store.declare_index(LAST_ONLINE.0, last_online_spec()));
    let mut after: Option<String> = None;
    loop {
        let mut next = None;
        step!(disk, store, trace, false, async {
            next = store.build_index_step(LAST_ONLINE.0, LAST_ONLINE.1, after.as_deref(), 8).await?;
            Ok::<_, super::StoreError>(())
        });
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    step!(disk, store, trace, false, store.build_index_step(LAST_ONLINE.0, LAST_ONLINE.1, None, 0));
    let ready = doc(&[("_id", LAST_ONLINE.1.into()), ("state", "ready".into())]);
    step!(disk, store, trace, true, store.write(READY, Write::Insert(ready), Durability::Synced));
    Ok(())
}

/// A little more after a recovery: an index dropped and made again, then
/// writes of one size, the last ones unsynced.
async fn more(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace) -> Result<(), String> {
    trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
    for (coll, spec) in indexes() {
        step!(disk, store, trace, true, store.ensure_index(coll, spec));
    }
    // An index dropped, and made again over the records there (as a
    // gateway drops a deleted index, or one separated at upgrade, and
    // builds its replacement): after a crash it is there whole or not at
    // all.
    let (coll, spec) = indexes().swap_remove(1);
    step!(disk, store, trace, true, store.drop_index(coll, &spec.name));
    step!(disk, store, trace, true, store.ensure_index(coll, spec));
    for j in 0..8i64 {
        let r = doc(&[("_id", format!("m{j}").into()), ("n", j.into()), ("pad", "w".repeat(100).into())]);
        let synced = j % 3 == 0;
        let durability = if synced { Durability::Synced } else { Durability::Unsynced };
        step!(disk, store, trace, synced, store.write("more", Write::Insert(r), durability));
    }
    Ok(())
}

/// Inserts of one size (so every journal entry has one size), every fourth
/// synced: after a crash that lost a generation's first entry but kept
/// later ones, the next generation's entries line up with the old ones.
async fn uniform(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace, tag: char) -> Result<(), String> {
    trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
    for j in 0..24 {
        let r = doc(&[("_id", format!("{tag}{j:04}").into()), ("pad", "u".repeat(120).into())]);
        let synced = j % 4 == 3;
        let durability = if synced { Durability::Synced } else { Durability::Unsynced };
        step!(disk, store, trace, synced, store.write("uniform", Write::Insert(r), durability));
    }
    Ok(())
}

/// The uniform workload crashed at `point`, recovered from `images`
/// images, each then written again with the same workload, crashed with
/// its last writes unsynced, and recovered again.
pub(crate) async fn uniform_point(
    point: u64,
    images: usize,
    rng: &mut impl Rng,
    report: &mut Report,
) -> Result<(), String> {
    let disk = new_disk();
    disk.crash_at(point);
    let mut store = open(&disk)?;
    let mut trace = Trace::default();
    uniform(&disk, &mut store, &mut trace, 'a').await?;
    store.close().await.map_err(|e| e.to_string())?;
    let Some(crash) = disk.crash() else { return Ok(()) };
    report.crash_points += 1;
    for image in 0..images {
        // The second image, every time: the first pending write lost and
        // the rest kept; the recovered store crashed at its first write,
        // kept (its first entry, where the lost one was, with the stale
        // ones after it).
        let (keep, then) = match image {
            0 => (Keep::Durable, (Keep::Random, None)),
            1 => (Keep::AllButFirst, (Keep::All, Some(1))),
            _ => (Keep::Random, (Keep::Random, None)),
        };
        let survivor = crash.survivor(keep, rng);
        let context =
            |e: String| format!("uniform workload, crash at op {point} ({}), {keep:?} image {image}: {e}", crash.op);
        let (recovered, _) = recover(&survivor, &trace).await.map_err(context)?;
        crash_again(&survivor, recovered, Again::Uniform, then, rng).await.map_err(context)?;
        report.images += 1;
        report.two_crash += 1;
    }
    Ok(())
}

/// What a recovered store writes before its second crash.
enum Again {
    /// [`more`].
    More,
    /// [`uniform`] again.
    Uniform,
}

/// The second crash of a two-crash sequence: `recovered` (opened on
/// `survivor`) writes a little more, the disk crashes within its first 60
/// writes and syncs or else at the end (its last writes unsynced), and the
/// store is opened on a random survivor image and checked.
async fn crash_again(
    survivor: &SimDisk,
    mut recovered: EmbeddedStore,
    again: Again,
    (keep, at): (Keep, Option<u64>),
    rng: &mut impl Rng,
) -> Result<(), String> {
    let mut second = Trace::default();
    survivor.crash_at(survivor.ops() + at.unwrap_or_else(|| rng.random_range(1..=60)));
    match again {
        Again::More => more(survivor, &mut recovered, &mut second).await?,
        Again::Uniform => uniform(survivor, &mut recovered, &mut second, 'b').await?,
    }
    survivor.crash_now();
    recovered.close().await.map_err(|e| e.to_string())?;
    let crash = survivor.crash().expect("crashed");
    let image = crash.survivor(keep, rng);
    let (store, _) =
        recover(&image, &second).await.map_err(|e| format!("second crash at op {} ({}): {e}", crash.at, crash.op))?;
    store.close().await.map_err(|e| e.to_string())
}

/// Crash the reopen of `image` at each of its writes and syncs in turn
/// (replay, layout, the journal's new generation), and open a third time
/// on what each crash left, only what was synced and a random subset: the
/// same checks as after the first crash hold (recovery adds no state, so
/// the state is one at or after the last answered write of `trace`).
async fn crash_in_recovery(
    image: &SimDisk,
    trace: &Trace,
    rng: &mut impl Rng,
    report: &mut Report,
) -> Result<(), String> {
    let probe = image.copy();
    let store = open(&probe)?;
    let reopen_ops = probe.ops();
    store.close().await.map_err(|e| e.to_string())?;
    for k in 1..=reopen_ops {
        let disk = image.copy();
        disk.crash_at(k);
        let store = open(&disk).map_err(|e| format!("reopen with a crash at its op {k}: {e}"))?;
        store.close().await.map_err(|e| e.to_string())?;
        let Some(crash) = disk.crash() else { continue };
        for keep in [Keep::Durable, Keep::Random] {
            let third = crash.survivor(keep, rng);
            let (store, _) = recover(&third, trace).await.map_err(|e| {
                format!("crash inside recovery at its op {k} of {reopen_ops} ({}), survivors {keep:?}: {e}", crash.op)
            })?;
            store.close().await.map_err(|e| e.to_string())?;
            report.recovery_crashes += 1;
        }
    }
    Ok(())
}

/// Damage to what was synced refuses the start, on `image` as a crash
/// left it: the newest entry that a later entry records as synced, damaged
/// with the seals cleared (the proof is then in the entries alone, as
/// between a sync and its seal), and the entry the seal names, damaged with
/// the seals kept. Each open must be refused, naming the journal. How many
/// were refused.
fn synced_damage_refused(image: &SimDisk) -> Result<u64, String> {
    use super::embedded::JOURNAL_FILE;
    use super::embedded::journal::synced_evidence;
    let Some(data) = image.contents(JOURNAL_FILE) else { return Ok(0) };
    let Some(super::embedded::journal::Evidence { run, sealed, slots }) = synced_evidence(&data) else { return Ok(0) };
    let offset_of = |lsn: u64| run.iter().find(|e| e.1 == lsn).map(|e| e.0);
    let proven_by_later = run.iter().enumerate().filter_map(|(j, e)| offset_of(e.2).filter(|_| j > 0)).max();
    let mut cases = Vec::new();
    if let Some(at) = proven_by_later {
        cases.push((at, true, "recorded as synced by a later entry, seals cleared"));
    }
    if let Some(at) = sealed.and_then(offset_of) {
        cases.push((at, false, "named by the seal"));
    }
    let mut refused = 0;
    for (at, clear_seals, what) in cases {
        let damaged = image.copy();
        {
            use super::disk::Disk;
            let file = damaged.open_file(JOURNAL_FILE).map_err(|e| e.to_string())?;
            // The entry's number: its checksum fails.
            file.write(at as u64 + 16, &[data[at + 16] ^ 0x01]).map_err(|e| e.to_string())?;
            if clear_seals {
                for slot in slots {
                    file.write(slot, &[0u8; 512]).map_err(|e| e.to_string())?;
                }
            }
            file.sync_data().map_err(|e| e.to_string())?;
        }
        match open(&damaged) {
            Ok(store) => {
                drop(store);
                return Err(format!("a synced journal entry ({what}, offset {at}) was damaged, and the store opened"));
            }
            Err(e) if e.contains(JOURNAL_FILE) && e.contains("damaged") => refused += 1,
            Err(e) => return Err(format!("damage to a synced journal entry ({what}) refused otherwise: {e}")),
        }
    }
    Ok(refused)
}

/// Open the store on `image` and check it against `trace`; the store, and
/// which state of the history it holds.
async fn recover(image: &SimDisk, trace: &Trace) -> Result<(EmbeddedStore, usize), String> {
    let store = open(image)?;
    let state = store.dump_with_catalog().map_err(|e| e.to_string())?;
    let at = trace.history.iter().rposition(|h| *h == state);
    match at {
        None => {
            return Err(format!(
                "the recovered state ({} records) is no state of the history ({} states)",
                state.len(),
                trace.history.len()
            ));
        }
        Some(k) if k < trace.acked => {
            return Err(format!(
                "the recovered state is the one after call {k}, before call {} whose synced answer was given",
                trace.acked
            ));
        }
        Some(_) => {}
    }
    // An online build cut short has only some of its entries; a restarted
    // gateway builds it again from its first record. One recorded ready
    // has them all.
    let mut building = Vec::new();
    for index @ (coll, name) in [ONLINE, LAST_ONLINE] {
        let declared = store.indexes(coll).await.map_err(|e| e.to_string())?.iter().any(|s| s.name == name);
        let ready = store.get(READY, name).await.map_err(|e| e.to_string())?.is_some();
        if ready && !declared {
            return Err(format!("index {name} is recorded ready but not declared"));
        }
        if declared && !ready {
            building.push(index);
        }
    }
    store.verify_indexes_building(&building)?;
    for index in building {
        build_online(&store, index)
            .await
            .map_err(|e| format!("the online build of {} does not finish: {e}", index.1))?;
    }
    store.verify_indexes()?;
    Ok((store, at.unwrap_or(0)))
}

/// The first open of the data directory `dir` (a previous release's:
/// an older layout to upgrade, a journal of an older format, entries to
/// replay) crashed at each of its writes and syncs in turn, and the store
/// opened again on what each crash left (only what was synced, and a
/// random subset): it holds what the crash-free open holds, indexes
/// whole. The crashes checked.
pub async fn crash_the_first_open(dir: &std::path::Path, seed: u64) -> Result<u64, String> {
    let image = SimDisk::load(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    image.byte_atomic(super::embedded::DATABASE_FILE);
    image.byte_atomic("txgate.redb.new");
    let probe = image.copy();
    let store = open(&probe)?;
    store.verify_indexes()?;
    let trace = Trace { history: vec![store.dump_with_catalog().map_err(|e| e.to_string())?], acked: 0 };
    store.close().await.map_err(|e| e.to_string())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut report = Report::default();
    crash_in_recovery(&image, &trace, &mut rng, &mut report).await.map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(report.recovery_crashes)
}

/// Writes and syncs of the whole workload, crash-free.
pub(crate) async fn workload_ops() -> Result<u64, String> {
    let disk = new_disk();
    let mut store = open(&disk)?;
    workload(&disk, &mut store, &mut Trace::default()).await?;
    for (_, name) in [ONLINE, LAST_ONLINE] {
        if store.get(READY, name).await.map_err(|e| e.to_string())?.is_none() {
            return Err(format!("the workload's online build of {name} did not end"));
        }
    }
    store.verify_indexes()?;
    store.close().await.map_err(|e| e.to_string())?;
    Ok(disk.ops())
}

/// With `TXGATE_POWER_DUMP` naming a directory, a failing image's files
/// are written there (`image/`), with what was durable before the crash
/// (`durable/`) and the writes pending then (`pending.txt`), to be looked
/// at with other tools.
fn dump_failure(crash: &super::simdisk::Crash, survivor: &SimDisk, rng: &mut impl Rng) {
    let Some(dir) = std::env::var_os("TXGATE_POWER_DUMP").map(std::path::PathBuf::from) else { return };
    let durable = crash.survivor(Keep::Durable, rng);
    let write = || -> std::io::Result<()> {
        for (sub, disk) in [("image", survivor), ("durable", &durable)] {
            std::fs::create_dir_all(dir.join(sub))?;
            for name in disk.names() {
                std::fs::write(dir.join(sub).join(&name), disk.contents(&name).unwrap_or_default())?;
            }
        }
        let pending: String =
            crash.describe().iter().map(|(file, op, at, len)| format!("{file} {op} {at} {len}\n")).collect();
        std::fs::write(dir.join("pending.txt"), format!("{pending}interrupted: {:?}\n", crash.interrupted()))
    };
    match write() {
        Ok(()) => eprintln!("power loss: the failing image is in {}", dir.display()),
        Err(e) => eprintln!("power loss: cannot write the failing image to {}: {e}", dir.display()),
    }
}

/// Crash the workload at `point` and check `images` survivor images
/// (one of them two crashes deep when `two_crash`).
pub(crate) async fn crash_point(
    point: u64,
    images: usize,
    two_crash: bool,
    in_recovery: bool,
    rng: &mut impl Rng,
    report: &mut Report,
) -> Result<(), String> {
    let disk = new_disk();
    disk.crash_at(point);
    let mut store = open(&disk)?;
    let mut trace = Trace::default();
    workload(&disk, &mut store, &mut trace).await?;
    store.close().await.map_err(|e| e.to_string())?;
    let Some(crash) = disk.crash() else { return Ok(()) };

    report.crash_points += 1;
    *report.by_op.entry(crash.op).or_default() += 1;
    for image in 0..images {
        let keep = match image {
            0 => Keep::All,
            1 => Keep::Durable,
            _ => Keep::Random,
        };
        let survivor = crash.survivor(keep, rng);
        let context = |e: String| {
            format!(
                "crash at op {point} ({}), survivors {keep:?}, image {image}: {e} (interrupted: {:?}; pending: {:?})",
                crash.op,
                crash.interrupted(),
                crash.describe()
            )
        };
        if keep == Keep::Durable {
            report.damage_refused += synced_damage_refused(&survivor).map_err(context)?;
        }
        if in_recovery && image == images - 1 {
            crash_in_recovery(&survivor, &trace, rng, report).await.map_err(context)?;
        }
        let (recovered, _) = match recover(&survivor, &trace).await {
            Ok(recovered) => recovered,
            Err(e) => {
                dump_failure(&crash, &survivor, rng);
                return Err(context(e));
            }
        };
        report.images += 1;
        if two_crash && image == images - 1 {
            crash_again(&survivor, recovered, Again::More, (Keep::Random, None), rng).await.map_err(context)?;
            report.two_crash += 1;
        } else {
            // It takes writes again.
            let r = doc(&[("_id", "after".into())]);
            let ok = recovered
                .write("after", Write::Insert(r), Durability::Synced)
                .await
                .map_err(|e| context(e.to_string()))?;
            if !ok || recovered.get("after", "after").await.map_err(|e| e.to_string())?.is_none() {
                return Err(context("a write after recovery is not there".into()));
            }
            recovered.close().await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Crash the workload at every write and sync in turn.
pub async fn sweep(cfg: &Sweep) -> Result<Report, String> {
    let ops = workload_ops().await?;
    let mut report = Report { seed: cfg.seed, ops, ..Report::default() };
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    for point in 1..=ops {
        let two = cfg.two_crash_every > 0 && point % cfg.two_crash_every == 0;
        let in_recovery = cfg.recovery_every > 0 && point % cfg.recovery_every == 0;
        crash_point(point, cfg.images_per_point, two, in_recovery, &mut rng, &mut report)
            .await
            .map_err(|e| format!("seed {}: {e}", cfg.seed))?;
        if cfg.progress_every > 0 && point % cfg.progress_every == 0 {
            eprintln!("power loss: {point}/{ops} crash points, {} images", report.images);
        }
    }
    let uniform_ops = {
        let disk = new_disk();
        let mut store = open(&disk)?;
        uniform(&disk, &mut store, &mut Trace::default(), 'a').await?;
        store.close().await.map_err(|e| e.to_string())?;
        disk.ops()
    };
    report.ops += uniform_ops;
    for point in 1..=uniform_ops {
        uniform_point(point, cfg.images_per_point * 2, &mut rng, &mut report)
            .await
            .map_err(|e| format!("seed {}: {e}", cfg.seed))?;
    }
    Ok(report)
}
