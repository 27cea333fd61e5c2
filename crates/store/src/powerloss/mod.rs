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
use super::{Durability, Store, Write};

mod workload;

use workload::{LAST_ONLINE, ONLINE, READY, build_online, doc, more, uniform, workload};

/// A store's whole state: `(collection, id) -> BSON`.
pub type State = BTreeMap<(String, String), Vec<u8>>;

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

/// The uniform workload crashed at `point`, recovered from `images`
/// images, each then written again with the same workload, crashed with
/// its last writes unsynced, and recovered again.
pub(crate) async fn uniform_point(
    point: u64,
    images: usize,
    rng: &mut impl Rng,
    report: &mut Report,
) -> Result<(), String> {
    let (disk, trace) = run(Work::Uniform, Some(point)).await?;
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
        crash_again(&survivor, recovered, Work::Uniform, then, rng).await.map_err(context)?;
        report.images += 1;
        report.two_crash += 1;
    }
    Ok(())
}

/// A workload: what a new store writes ([`workload`], [`uniform`]), or
/// what a recovered one writes before its second crash ([`more`],
/// [`uniform`] again).
enum Work {
    /// [`workload`].
    Main,
    /// [`more`].
    More,
    /// [`uniform`].
    Uniform,
}

/// Workload `work` on a new disk that crashes at its `crash_at`-th write
/// or sync (if it comes), then the store closed: the disk and the history.
async fn run(work: Work, crash_at: Option<u64>) -> Result<(SimDisk, Trace), String> {
    let disk = new_disk();
    if let Some(point) = crash_at {
        disk.crash_at(point);
    }
    let mut store = open(&disk)?;
    let mut trace = Trace::default();
    match work {
        Work::Main => workload(&disk, &mut store, &mut trace).await?,
        Work::More => more(&disk, &mut store, &mut trace).await?,
        Work::Uniform => uniform(&disk, &mut store, &mut trace, 'a').await?,
    }
    store.close().await.map_err(|e| e.to_string())?;
    Ok((disk, trace))
}

/// The second crash of a two-crash sequence: `recovered` (opened on
/// `survivor`) writes a little more, the disk crashes within its first 60
/// writes and syncs or else at the end (its last writes unsynced), and the
/// store is opened on a random survivor image and checked.
async fn crash_again(
    survivor: &SimDisk,
    mut recovered: EmbeddedStore,
    again: Work,
    (keep, at): (Keep, Option<u64>),
    rng: &mut impl Rng,
) -> Result<(), String> {
    let mut second = Trace::default();
    survivor.crash_at(survivor.ops() + at.unwrap_or_else(|| rng.random_range(1..=60)));
    match again {
        Work::Main => workload(survivor, &mut recovered, &mut second).await?,
        Work::More => more(survivor, &mut recovered, &mut second).await?,
        Work::Uniform => uniform(survivor, &mut recovered, &mut second, 'b').await?,
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
    let (disk, trace) = run(Work::Main, Some(point)).await?;
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
            crash_again(&survivor, recovered, Work::More, (Keep::Random, None), rng).await.map_err(context)?;
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
    let uniform_ops = run(Work::Uniform, None).await?.0.ops();
    report.ops += uniform_ops;
    for point in 1..=uniform_ops {
        uniform_point(point, cfg.images_per_point * 2, &mut rng, &mut report)
            .await
            .map_err(|e| format!("seed {}: {e}", cfg.seed))?;
    }
    Ok(report)
}
