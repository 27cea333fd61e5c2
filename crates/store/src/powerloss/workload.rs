//! The workloads the power-loss harness crashes (see the module above):
//! the main one, what a recovered store writes before its second crash,
//! and the uniform one, with the state after each call kept in a
//! [`Trace`].

use std::collections::BTreeMap;

use super::{SimDisk, Trace, open};
use crate::embedded::EmbeddedStore;
use crate::{Document, Durability, IndexSpec, LOG_SEQ, Store, Update, Write};

pub(super) fn doc(pairs: &[(&str, crate::Bson)]) -> Document {
    let mut d = Document::new();
    for (k, v) in pairs {
        d.insert(*k, v.clone());
    }
    d
}

fn set(pairs: &[(&str, crate::Bson)]) -> Update {
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
pub(super) const ONLINE: (&str, &str) = ("docs", "by_n_online");

/// Where the workload records [`ONLINE`] ready.
pub(super) const READY: &str = "ready";

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
pub(super) const LAST_ONLINE: (&str, &str) = ("scratch", "n_online");

fn last_online_spec() -> IndexSpec {
    IndexSpec { name: LAST_ONLINE.1.into(), fields: vec!["n".into()], unique: false, sparse: false, counted: true }
}

/// A whole build of `index` from its first record, as a gateway
/// restarted after a crash makes it, made durable at its end.
pub(super) async fn build_online(store: &EmbeddedStore, (coll, name): (&str, &str)) -> crate::StoreResult<()> {
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
async fn document_write(store: &EmbeddedStore, id: &str, v: i64, status: &str, n: i64) -> crate::StoreResult<usize> {
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
) -> (crate::StoreResult<usize>, bool) {
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
pub(super) async fn workload(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace) -> Result<(), String> {
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
                Ok::<_, crate::StoreError>(())
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
                    filter: doc(&[("lock", crate::Bson::Null)]),
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
            Ok::<_, crate::StoreError>(())
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
pub(super) async fn more(disk: &SimDisk, store: &mut EmbeddedStore, trace: &mut Trace) -> Result<(), String> {
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
pub(super) async fn uniform(
    disk: &SimDisk,
    store: &mut EmbeddedStore,
    trace: &mut Trace,
    tag: char,
) -> Result<(), String> {
    trace.history.push(store.dump_with_catalog().map_err(|e| e.to_string())?);
    for j in 0..24 {
        let r = doc(&[("_id", format!("{tag}{j:04}").into()), ("pad", "u".repeat(120).into())]);
        let synced = j % 4 == 3;
        let durability = if synced { Durability::Synced } else { Durability::Unsynced };
        step!(disk, store, trace, synced, store.write("uniform", Write::Insert(r), durability));
    }
    Ok(())
}
