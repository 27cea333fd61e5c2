//! The builds of declared indexes and the drops of deleted ones: the
//! `index_builds` worker's passes (see the module above for the protocol).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{
    BUILD_BATCH, CACHE_TTL, DURABLE_EVERY, Declaration, GRACE, INDEXES, Indexes, LEASE, MAX_NAMED, MAX_REST, Physical,
    Progress, RENEW_EVERY, State, breaks_rule, physical_name, same_fields, unique,
};
use crate::document::{StagedOp, StoredDoc};
use crate::store::scans::{DOCS_LIVE, INDEXES_BY_STATE, TXNS_BY_STATUS};
use crate::store::shape::fields;
use crate::store::{Bson, DateTime, Durability, StoreResult, Update, Write};
use crate::txn::record::{Status, TXNS, TxnRecord};

impl Indexes {
    /// One pass over the builds and drops there are to do: drops at once,
    /// builds each started as a task of its own unless running already.
    /// A collection's builds run one after another; the collections'
    /// take steps in turn (`turn`), so that a small collection's build
    /// never waits for a large one's to end.
    pub(crate) async fn pass(self: &Arc<Self>, stop: &CancellationToken) -> StoreResult<()> {
        for state in [State::Dropping, State::Building] {
            let found = self.store.scan(INDEXES, INDEXES_BY_STATE.scan(vec![state.to_bson()]).limit(100)).await?;
            for record in found {
                if stop.is_cancelled() {
                    return Ok(());
                }
                let d = match Declaration::from_record(record) {
                    Ok(d) => d,
                    Err(e) => {
                        crate::store::report_unreadable(&e);
                        continue;
                    }
                };
                let waited = self.clock.now().timestamp_millis() - d.updated_at.timestamp_millis();
                if waited < GRACE.as_millis() as i64 {
                    continue;
                }
                if state == State::Dropping {
                    // One that fails is tried again on the next pass; the
                    // others go on meanwhile.
                    if let Err(err) = self.drop_now(&d).await {
                        tracing::warn!(collection = %d.coll, index = %d.name, error = %err, "index drop failed; retrying");
                    }
                    continue;
                }
                if !self.running.lock().expect("running builds").insert(d.key.clone()) {
                    continue;
                }
                let lane = Arc::clone(self.lanes.lock().expect("build lanes").entry(d.coll.clone()).or_default());
                let (this, stop) = (Arc::clone(self), stop.clone());
                self.tasks.spawn(async move {
                    let key = d.key.clone();
                    {
                        let _lane = lane.lock().await;
                        let (coll, name) = (d.coll.clone(), d.name.clone());
                        if let Err(err) = this.build(d, &stop).await {
                            tracing::warn!(collection = %coll, index = %name, error = %err, "index build failed; retrying");
                        }
                    }
                    this.running.lock().expect("running builds").remove(&key);
                    this.built.notify_waiters();
                    // A lane no build holds or waits for is let go.
                    let mut lanes = this.lanes.lock().expect("build lanes");
                    lanes.retain(|_, lane| Arc::strong_count(lane) > 1);
                });
            }
        }
        Ok(())
    }

    /// Until no build of this instance is running (each has finished,
    /// failed or stopped).
    pub(crate) async fn builds_idle(&self) {
        crate::wake::until(&self.built, || self.running.lock().expect("running builds").is_empty()).await;
    }

    /// Wait for the builds running to stop (they stop at `stop`).
    pub(crate) async fn builds_stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    async fn drop_now(&self, d: &Declaration) -> StoreResult<()> {
        let declared = self.get(&d.coll, &d.name).await?;
        if declared.is_none_or(|live| live.physical != d.physical) {
            self.store.drop_index(&d.coll, &d.physical).await?;
            // Whatever this record says: a name an earlier release gave two
            // declarations may hold the other one's unique values.
            unique::drop_all(&self.store, &d.physical).await?;
        }
        let filter = fields(&shapes::Dropping { state: State::Dropping, physical: &d.physical });
        self.store.delete(INDEXES, &d.key, filter).await?;
        tracing::info!(collection = %d.coll, index = %d.name, "index dropped");
        Ok(())
    }

    /// Give each declaration whose store index name another declaration
    /// shares a name of its own, and build it again; returns how many.
    ///
    /// Releases before this one named a store index after its declaration's
    /// name and millisecond, so two collections declaring one name in one
    /// millisecond, or a name deleted and declared again within one, shared
    /// the store index's name and with it the unique values reserved under
    /// it. Each such declaration leaves the shared name to be dropped (its
    /// store index on its collection, and every value reserved under it,
    /// after [`GRACE`], as a delete does) and is built again under a new
    /// name: its documents are checked and their values reserved anew, and
    /// a duplicate fails the build naming the documents. A failed one stays
    /// failed under its new name. Runs when an instance's builder starts:
    /// every instance of this release names new indexes apart, so once all
    /// have started no new shared name appears. Each step is a conditional
    /// write, so instances doing it at once do it once.
    pub(crate) async fn separate_shared(&self) -> StoreResult<usize> {
        let mut all: Vec<Declaration> = Vec::new();
        for state in [State::Building, State::Ready, State::Failed, State::Dropping] {
            let mut after: Option<String> = None;
            loop {
                let scan = INDEXES_BY_STATE.scan(vec![state.to_bson()]).after(after.as_deref()).limit(BUILD_BATCH);
                let found = self.store.scan(INDEXES, scan).await?;
                let full = found.len() == BUILD_BATCH;
                for record in found {
                    after = crate::store::record_id(&record).map(str::to_owned);
                    match Declaration::from_record(record) {
                        Ok(d) => all.push(d),
                        Err(e) => crate::store::report_unreadable(&e),
                    }
                }
                if !full {
                    break;
                }
            }
        }
        let mut by_name: std::collections::HashMap<&str, Vec<&Declaration>> = std::collections::HashMap::new();
        for d in &all {
            by_name.entry(d.physical.as_str()).or_default().push(d);
        }
        let mut separated = 0;
        for group in by_name.values().filter(|g| g.len() > 1) {
            for d in group.iter().filter(|d| d.state != State::Dropping) {
                if self.separate(d).await? {
                    separated += 1;
                }
            }
        }
        Ok(separated)
    }

    /// [`Self::separate_shared`] for `d`: `false` when it changed meanwhile
    /// (another instance separated it, or it was deleted).
    async fn separate(&self, d: &Declaration) -> StoreResult<bool> {
        let now = self.clock.now();
        // What is left to drop of the shared name first, under a key of its
        // own, as a delete leaves it (already there when this name was
        // deleted and declared again within a millisecond).
        self.store.insert(INDEXES, d.dropping(now).record()).await?;
        let state = if d.state == State::Failed { State::Failed } else { State::Building };
        let renamed = Declaration {
            physical: physical_name(&d.name),
            state,
            progress: None,
            reason: if state == State::Failed { d.reason.clone() } else { None },
            documents: if state == State::Failed { d.documents.clone() } else { Vec::new() },
            // Built as if declared now: writes and transactions learn of
            // the new name before its build reads their documents.
            created_at: now,
            updated_at: now,
            owner: None,
            lease_until: None,
            ..d.clone()
        };
        let filter = fields(&Physical { physical: &d.physical });
        let done = self.store.replace(INDEXES, &d.key, filter, renamed.record()).await?;
        if done {
            self.forget(&d.coll);
            self.wake.notify_one();
            tracing::warn!(
                collection = %d.coll,
                index = %d.name,
                "index shared its store name with another declaration (named by an earlier release): built again under a name of its own"
            );
        }
        Ok(done)
    }

    /// Take the build's lease (`false`: another instance holds it), or
    /// renew it, with the build's progress.
    async fn lease(&self, d: &mut Declaration, progress: Option<Progress>) -> StoreResult<bool> {
        let now = self.clock.now();
        let until = DateTime::from_millis(now.timestamp_millis() + LEASE.as_millis() as i64);
        let held = d.owner.as_deref() == Some(self.instance.as_str());
        let filter = if held {
            fields(&shapes::Held { state: State::Building, owner: &self.instance })
        } else {
            fields(&shapes::Leased { state: State::Building, lease_until: d.lease_until })
        };
        if !held && d.lease_until.is_some_and(|u| u > now) && !self.leased_before_opening(d) {
            return Ok(false);
        }
        let set = shapes::Lease { owner: &self.instance, lease_until: until, progress: progress.as_ref() };
        let ok = self.store.update(INDEXES, &d.key, filter, Update::fields(&set)).await?;
        if ok {
            d.owner = Some(self.instance.clone());
            d.lease_until = Some(until);
            d.progress = progress.or(d.progress.take());
        }
        Ok(ok)
    }

    /// Whether `d`'s lease was taken (see [`lease_owner`]) under an earlier opening of a store
    /// one process opens at a time: its holder is dead, whatever the
    /// lease's time says (a restart takes the build over at once).
    fn leased_before_opening(&self, d: &Declaration) -> bool {
        let Some(opening) = self.store.opening() else { return false };
        d.owner.as_deref().is_some_and(|owner| owner.strip_prefix(opening).is_none_or(|rest| !rest.starts_with('.')))
    }

    /// End a build this instance holds: ready, or failed with `reason`.
    async fn finish(&self, d: &Declaration, failed: Option<(String, Vec<String>)>) -> StoreResult<()> {
        let now = self.clock.now();
        let set = match &failed {
            None => Update::fields(&shapes::Ready {
                state: State::Ready,
                updated_at: now,
                owner: None,
                lease_until: None,
                progress: None,
            }),
            Some((reason, ids)) => Update::fields(&shapes::Failed {
                state: State::Failed,
                updated_at: now,
                owner: None,
                lease_until: None,
                progress: None,
                reason,
                documents: ids,
            }),
        };
        let filter = fields(&shapes::Held { state: State::Building, owner: &self.instance });
        if self.store.update(INDEXES, &d.key, filter, set).await? {
            self.forget(&d.coll);
            match failed {
                None => tracing::info!(collection = %d.coll, index = %d.name, "index ready"),
                Some((reason, _)) => {
                    tracing::warn!(collection = %d.coll, index = %d.name, %reason, "index build failed")
                }
            }
        }
        Ok(())
    }

    /// Claim `values` (each a value of `u` and the document of `coll`
    /// holding it), in order: a value claimed already is a duplicate, and
    /// both documents are named in `duplicates` (each once, up to
    /// [`MAX_NAMED`]). The batch's reservations are read first: one its
    /// document owns already (claimed by an earlier pass of this build that
    /// did not finish, or by the document's own write) is left as it is.
    /// The others are claimed unsynced (the build's end, synced, makes them
    /// durable): the values nobody has reserved as inserts written
    /// together, and each value someone else has reserved (or that was
    /// reserved meanwhile, or that an earlier document of the batch
    /// holds too) on its own, after them.
    async fn claim_held(
        &self,
        coll: &str,
        u: &unique::Unique,
        values: &[(Vec<u8>, String)],
        duplicates: &mut Vec<String>,
    ) -> StoreResult<()> {
        let ids: Vec<String> = values.iter().map(|(key, _)| u.id(key)).collect();
        let found = self.store.get_many(unique::UNIQUE, &ids).await?;
        let found: std::collections::HashMap<&str, &crate::store::Record> =
            found.iter().filter_map(|r| Some((crate::store::record_id(r)?, r))).collect();
        let (mut free, mut reserved) = (Vec::new(), Vec::new());
        let mut first = std::collections::HashSet::new();
        for (value, id) in values.iter().zip(&ids) {
            match found.get(id.as_str()) {
                // A value an earlier document of the batch holds too: it
                // will be reserved by then (a duplicate, unless that
                // document's own write gives it up meanwhile).
                None if !first.insert(id.as_str()) => reserved.push(value),
                None => free.push(value),
                Some(reservation) if unique::owned_by(reservation, &value.1) => {}
                Some(_) => reserved.push(value),
            }
        }
        let mut left = free.as_slice();
        while !left.is_empty() {
            let now = self.clock.now();
            let inserts = left
                .iter()
                .map(|(key, id)| (unique::UNIQUE, Write::Insert(unique::first_claim(u, key, id, now))))
                .collect();
            let applied = self.store.unsynced().in_order(inserts).await?;
            let Some((refused, rest)) = left[applied..].split_first() else { break };
            left = rest;
            reserved.push(refused);
        }
        for (key, id) in reserved {
            let now = self.clock.now();
            if let Err(dup) = unique::claim(&self.store, coll, u, key, (id, &[]), now, Durability::Unsynced).await? {
                for id in [dup.existing, id.clone()] {
                    if duplicates.len() < MAX_NAMED && !duplicates.contains(&id) {
                        duplicates.push(id);
                    }
                }
            }
        }
        Ok(())
    }

    /// Build `d`: check every live document, declare the store index, add
    /// the documents' entries; then ready (or failed).
    async fn build(&self, mut d: Declaration, stop: &CancellationToken) -> StoreResult<()> {
        if !self.lease(&mut d, None).await? {
            return Ok(());
        }
        // Declared on the same fields as another at the same moment (on
        // another instance): the one declared first builds.
        let declared = self.list(&d.coll).await?;
        let first = same_fields(&declared, &d.name, &d.fields)
            .find(|o| o.state == State::Ready || (o.created_at, &o.name) < (d.created_at, &d.name));
        if let Some(other) = first {
            let reason = format!("index {} is declared on the same fields; delete one of them", other.name);
            return self.finish(&d, Some((reason, Vec::new()))).await;
        }
        if !self.after_transactions(&mut d, stop).await? {
            return Ok(());
        }
        let live = crate::store::IndexQuery::live();
        let total = self.store.count(&d.coll, &live).await?;
        tracing::info!(collection = %d.coll, index = %d.name, documents = total, "index build started");
        let paths: Vec<(String, String)> = d.paths().map(|p| (d.name.clone(), p.to_owned())).collect();
        let (mut after, mut done, mut offenders) = (None::<String>, 0u64, Vec::new());
        let unique = d.unique.then(|| unique::Unique::of(&d));
        let mut duplicates: Vec<String> = Vec::new();
        let mut pace = Pace::new();
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let turn = self.turn.lock().await;
            pace.start();
            let scan = DOCS_LIVE.scan(vec![Bson::Boolean(false)]).after(after.as_deref()).limit(BUILD_BATCH);
            let batch = self.store.scan(&d.coll, scan).await?;
            let full = batch.len() == BUILD_BATCH;
            // A unique index's values, claimed once the batch is checked.
            let mut values: Vec<(Vec<u8>, String)> = Vec::new();
            for record in batch {
                after = crate::store::record_id(&record).map(str::to_owned);
                done += 1;
                let Ok(doc) = StoredDoc::from_record(record) else { continue };
                if let Some(detail) = breaks_rule(&paths, &doc.data) {
                    if offenders.len() < MAX_NAMED {
                        offenders.push((doc.id, detail));
                    }
                    continue;
                }
                if let Some(key) = unique.as_ref().and_then(|u| u.value(&doc.data)) {
                    values.push((key, doc.id));
                }
            }
            if let Some(u) = &unique {
                self.claim_held(&d.coll, u, &values, &mut duplicates).await?;
            }
            if !full {
                break;
            }
            pace.rest(stop).await;
            drop(turn);
            if pace.renew() {
                let progress = Progress { phase: "checking".into(), done, total };
                if !self.lease(&mut d, Some(progress)).await? {
                    return Ok(());
                }
            }
        }
        if !offenders.is_empty() {
            // The first documents' own breaks of the rule (an array, an
            // object, or strings over the index's bytes); `documents` names
            // them all.
            let mut broken: Vec<String> =
                offenders.iter().take(3).map(|(id, detail)| format!("{id}: {detail}")).collect();
            if offenders.len() > 3 {
                broken.push(format!("and {} more", offenders.len() - 3));
            }
            let reason = format!(
                "documents break the rule of indexed paths ({}): {}; change them and declare the index again",
                d.paths().collect::<Vec<_>>().join(", "),
                broken.join("; ")
            );
            let ids = offenders.into_iter().map(|(id, _)| id).collect();
            return self.finish(&d, Some((reason, ids))).await;
        }
        if !duplicates.is_empty() {
            let reason = format!(
                "documents hold the same value at the paths of this unique index ({}); change them and declare it again",
                d.paths().collect::<Vec<_>>().join(", ")
            );
            return self.finish(&d, Some((reason, duplicates))).await;
        }
        self.store.declare_index(&d.coll, d.spec()).await?;
        let (mut after, mut done, mut steps) = (None::<String>, 0u64, 0u64);
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let turn = self.turn.lock().await;
            pace.start();
            let step = self.store.build_index_step(&d.coll, &d.physical, after.as_deref(), BUILD_BATCH).await?;
            let Some(next) = step else { break };
            after = Some(next);
            done += BUILD_BATCH as u64;
            steps += 1;
            if steps % DURABLE_EVERY == 0 {
                // Made durable every few steps: such a pause of the writer
                // grows with the steps it makes durable (at a million
                // documents, about 50 ms for two and 125 ms for ten).
                self.store.build_index_step(&d.coll, &d.physical, None, 0).await?;
            }
            pace.rest(stop).await;
            drop(turn);
            if pace.renew() {
                let progress = Progress { phase: "indexing".into(), done: done.min(total), total };
                if !self.lease(&mut d, Some(progress)).await? {
                    return Ok(());
                }
            }
        }
        // Every step durable before the index serves.
        self.store.build_index_step(&d.coll, &d.physical, None, 0).await?;
        self.finish(&d, None).await
    }
}

impl Indexes {
    /// Wait until no transaction over `d`'s collection that began before
    /// every write knew of `d` (its declaration, plus [`CACHE_TTL`] and a
    /// second of clocks apart) is in flight: pending, or committed and not
    /// rolled forward. Such a transaction staged its members without the
    /// index's checks (no unique value claimed, no rule of indexed paths),
    /// and a build that read its documents before its roll-forward wrote
    /// them would never meet its values. `false`: the build is no longer
    /// this instance's, or it stops.
    async fn after_transactions(&self, d: &mut Declaration, stop: &CancellationToken) -> StoreResult<bool> {
        let known = DateTime::from_millis(
            d.created_at.timestamp_millis().saturating_add((CACHE_TTL + Duration::from_secs(1)).as_millis() as i64),
        );
        let (mut logged, mut renewed) = (false, None::<Instant>);
        loop {
            if stop.is_cancelled() {
                return Ok(false);
            }
            let mut waiting = 0;
            for status in [Status::Pending, Status::Committed] {
                let mut after: Option<String> = None;
                loop {
                    let scan = TXNS_BY_STATUS.scan(vec![status.to_bson()]).after(after.as_deref()).limit(BUILD_BATCH);
                    let found = self.store.scan(TXNS, scan).await?;
                    let full = found.len() == BUILD_BATCH;
                    for record in found {
                        after = crate::store::record_id(&record).map(str::to_owned);
                        // One that cannot be read is reported where it is
                        // read for itself (its recovery).
                        let Ok(txn) = TxnRecord::from_record(record) else { continue };
                        let over = txn.members.iter().any(|m| m.collection == d.coll && m.op != StagedOp::Check);
                        if over && txn.started_at < known {
                            waiting += 1;
                        }
                    }
                    if !full {
                        break;
                    }
                }
            }
            if waiting == 0 {
                return Ok(true);
            }
            if !logged {
                tracing::info!(collection = %d.coll, index = %d.name, transactions = waiting, "index build waits for transactions in flight at its declaration");
                logged = true;
            }
            // Recorded at once, then renewed as a build renews (each is a
            // durable write).
            if renewed.is_none_or(|at| at.elapsed() >= RENEW_EVERY) {
                let progress = Progress { phase: "waiting".into(), done: 0, total: waiting };
                if !self.lease(d, Some(progress)).await? {
                    return Ok(false);
                }
                renewed = Some(Instant::now());
            }
            tokio::select! {
                () = stop.cancelled() => return Ok(false),
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    }
}

/// A build's pace: after each step it rests as long as the step took (at
/// most [`MAX_REST`]), so writes, reads and the rest of the gateway keep
/// at least half of the writer and of the cores; it renews its lease, and
/// records its progress, every [`RENEW_EVERY`] rather than after each step
/// (each renewal is a durable write).
struct Pace {
    step: Instant,
    renewed: Instant,
}

impl Pace {
    fn new() -> Self {
        Pace { step: Instant::now(), renewed: Instant::now() }
    }

    fn start(&mut self) {
        self.step = Instant::now();
    }

    /// Whether the lease is due for renewal (it is then taken as renewed).
    fn renew(&mut self) -> bool {
        let due = self.renewed.elapsed() >= RENEW_EVERY;
        if due {
            self.renewed = Instant::now();
        }
        due
    }

    async fn rest(&self, stop: &CancellationToken) {
        let rest = self.step.elapsed().min(MAX_REST);
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(rest) => {}
        }
    }
}

/// A new instance's name as a build's lease owner: under the store's
/// opening where it has one, so that a build leased under another opening
/// is taken over at once (`Indexes::leased_before_opening`).
pub(crate) fn lease_owner(store: &dyn crate::store::Store) -> String {
    match store.opening() {
        Some(opening) => format!("{opening}.{}", uuid::Uuid::new_v4()),
        None => uuid::Uuid::new_v4().to_string(),
    }
}

/// The builder of declared indexes, and the dropper of deleted ones.
pub(crate) struct Builds {
    pub indexes: Arc<Indexes>,
    pub interval: Duration,
}

#[async_trait::async_trait]
impl crate::worker::Worker for Builds {
    fn name(&self) -> &'static str {
        "index_builds"
    }

    /// A pass without the grace a new declaration waits out in `run`
    /// (a build still checks that grace against the clock), ended when
    /// every build it started, or found running, has ended.
    async fn run_once(&self) -> StoreResult<()> {
        self.indexes.separate_shared().await?;
        self.indexes.pass(&CancellationToken::new()).await?;
        self.indexes.builds_idle().await;
        Ok(())
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        // Once, before the first pass (again on each pass until it has run).
        let mut separated = false;
        loop {
            if !separated {
                match self.indexes.separate_shared().await {
                    Ok(_) => separated = true,
                    Err(err) => {
                        tracing::warn!(error = %err, "could not look for index names shared between declarations; retrying")
                    }
                }
            }
            if let Err(err) = self.indexes.pass(&stop).await {
                tracing::warn!(error = %err, "index build pass failed; retrying");
            }
            tokio::select! {
                () = stop.cancelled() => return self.indexes.builds_stopped().await,
                () = self.indexes.wake.notified() => {
                    // A new declaration waits out its grace first.
                    tokio::select! {
                        () = stop.cancelled() => return self.indexes.builds_stopped().await,
                        () = tokio::time::sleep(GRACE) => {}
                    }
                }
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

/// The fields of a declaration a build's steps filter on and set.
mod shapes {
    use serde::Serialize;

    use super::{Progress, State};
    use crate::store::DateTime;

    /// Being dropped, standing for this store index.
    #[derive(Serialize)]
    pub(super) struct Dropping<'a> {
        pub state: State,
        pub physical: &'a str,
    }

    /// Building under `owner`'s lease.
    #[derive(Serialize)]
    pub(super) struct Held<'a> {
        pub state: State,
        pub owner: &'a str,
    }

    /// Building with its lease as read (none: never taken).
    #[derive(Serialize)]
    pub(super) struct Leased {
        pub state: State,
        pub lease_until: Option<DateTime>,
    }

    /// A lease taken or renewed, with the build's progress.
    #[derive(Serialize)]
    pub(super) struct Lease<'a> {
        pub owner: &'a str,
        pub lease_until: DateTime,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub progress: Option<&'a Progress>,
    }

    /// A build that ended ready: no lease, no progress.
    #[derive(Serialize)]
    pub(super) struct Ready {
        pub state: State,
        pub updated_at: DateTime,
        pub owner: Option<String>,
        pub lease_until: Option<DateTime>,
        pub progress: Option<Progress>,
    }

    /// A build that failed, with why and the documents that caused it.
    #[derive(Serialize)]
    pub(super) struct Failed<'a> {
        pub state: State,
        pub updated_at: DateTime,
        pub owner: Option<String>,
        pub lease_until: Option<DateTime>,
        pub progress: Option<Progress>,
        pub reason: &'a str,
        pub documents: &'a [String],
    }
}
