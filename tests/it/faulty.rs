//! The tests' fault injector: one layer of the store stack
//! ([`txgate_store::layer`]) that either counts operations and strikes at
//! the n-th ([`Fault`]: crash tests), or lets a rule decide, operation by
//! operation, to delay, hang or fail it ([`Act`]: fault tests). Chains and
//! batches of appends go down write by write, each a point of its own.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txgate::config::Config;
use txgate_store::layer::{Layer, Layered, Op as StoreOp};
use txgate_store::{Document, Durability, DynStore, Record, Store, StoreError, StoreResult, doc};

use crate::support::{Backend, TestApp, TestStore, test_config};

/// Where and how a fault strikes.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    None,
    /// The n-th operation fails without reaching the store.
    ErrorBefore(usize),
    /// The n-th operation reaches the store, but the caller sees an error.
    ErrorAfter(usize),
    /// The process dies just before the n-th operation.
    Crash(usize),
    /// The process dies just after the n-th operation reached the store.
    CrashAfter(usize),
    /// The process dies just after the n-th operation, and the store loses
    /// every write made since its last synced one (the embedded store's
    /// crash model, docs/design.md §1).
    CrashLosingUnsynced(usize),
}

/// What a rule does with one operation.
#[derive(Clone, Debug)]
pub enum Act {
    Pass,
    /// Wait, then carry it out (a slow store).
    Delay(Duration),
    /// Say so at the gate, wait until the test opens it, then carry it out.
    Hold(Arc<Gate>),
    /// Never answer.
    Hang,
    /// Fail without reaching the store.
    FailBefore,
    /// Carry it out, then report a failure.
    FailAfter,
}

/// One store operation, as a rule sees it.
pub struct Op<'a> {
    pub kind: &'static str,
    pub coll: &'a str,
    pub id: Option<&'a str>,
    /// The fields a conditional update sets.
    pub set: Option<&'a Document>,
}

/// Where [`Act::Hold`] holds operations: a test waits until one has
/// reached it ([`Gate::reached`]), looks, then lets them go ([`Gate::open`]).
#[derive(Debug, Default)]
pub struct Gate {
    reached: AtomicBool,
    opened: AtomicBool,
    moved: tokio::sync::Notify,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Until an operation has reached the gate.
    pub async fn reached(&self) {
        self.until(|g| g.reached.load(Ordering::SeqCst)).await;
    }

    /// Lets every held operation go on, and every later one through.
    pub fn open(&self) {
        self.opened.store(true, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    pub async fn pass(&self) {
        self.reached.store(true, Ordering::SeqCst);
        self.moved.notify_waiters();
        self.until(|g| g.opened.load(Ordering::SeqCst)).await;
    }

    async fn until(&self, holds: impl Fn(&Self) -> bool) {
        crate::support::woken_until(&self.moved, || holds(self)).await;
    }
}

type Rule = Box<dyn FnMut(&Op) -> Act + Send>;

enum Mode {
    Counted(Fault),
    Ruled(Mutex<Rule>),
}

/// The fault layer. After a crash every operation hangs forever, as
/// nothing more leaves a dead process.
pub struct Faults {
    mode: Mode,
    count: AtomicUsize,
    pub crashed: AtomicBool,
    /// What each write since the last synced one replaced, oldest first:
    /// a crash that loses unsynced writes puts these back.
    unsynced: Mutex<Vec<(String, String, Option<Record>)>>,
    /// Operations past the gate and not finished.
    in_flight: AtomicUsize,
    /// Wakes [`Faults::died`] and [`Faults::stop`]: an operation ended, or
    /// the process died.
    moved: tokio::sync::Notify,
    /// No operation starts any more (a crash is under way).
    stopping: AtomicBool,
    /// Orders writes when a crash is to lose the unsynced ones.
    serial: tokio::sync::Mutex<()>,
}

/// A store with the fault layer over it.
pub type FaultyStore = Layered<Faults>;

/// `inner` with `fault` injected at the operation it names.
pub fn faulty(inner: DynStore, fault: Fault) -> Arc<FaultyStore> {
    Arc::new(Layered::new(inner, Faults::new(Mode::Counted(fault))))
}

/// `inner`, each operation delayed, hung or failed as `rule` decides.
pub fn rigged(inner: DynStore, rule: impl FnMut(&Op) -> Act + Send + 'static) -> Arc<FaultyStore> {
    Arc::new(Layered::new(inner, Faults::new(Mode::Ruled(Mutex::new(Box::new(rule))))))
}

/// A gateway over a fresh store of `backend` with a [`rigged`] layer.
pub async fn rigged_app(
    backend: Backend,
    tweak: impl FnOnce(&mut Config),
    rule: impl FnMut(&Op) -> Act + Send + 'static,
) -> Option<TestApp> {
    let ts = TestStore::new(backend).await?;
    let mut config = test_config(ts.config.clone());
    tweak(&mut config);
    let store: DynStore = rigged(Arc::clone(&ts.store), rule);
    Some(TestApp::on_store(config, store, Some(ts)).await)
}

/// Counts an operation in flight until it ends, or is dropped.
struct InFlight<'a>(&'a Faults);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
}

fn injected() -> StoreError {
    StoreError::Unavailable("injected fault".into())
}

/// The operations faults strike: reads and writes. Pings, syncs, the close,
/// backups and index work pass.
fn struck(name: &str) -> bool {
    matches!(name, "get" | "scan" | "get_many" | "collections" | "insert" | "append" | "replace" | "update" | "delete")
}

impl Faults {
    fn new(mode: Mode) -> Self {
        Self {
            mode,
            count: AtomicUsize::new(0),
            crashed: AtomicBool::new(false),
            unsynced: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            moved: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// Resolves once the simulated process has died.
    pub async fn died(&self) {
        self.until(|f| f.crashed.load(Ordering::SeqCst)).await;
    }

    /// The simulated process dies here.
    fn die(&self) {
        self.crashed.store(true, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    async fn until(&self, holds: impl Fn(&Self) -> bool) {
        crate::support::woken_until(&self.moved, || holds(self)).await;
    }

    pub fn ops(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    pub fn triggered(&self) -> bool {
        let n = match self.mode {
            Mode::Counted(
                Fault::ErrorBefore(n)
                | Fault::ErrorAfter(n)
                | Fault::Crash(n)
                | Fault::CrashAfter(n)
                | Fault::CrashLosingUnsynced(n),
            ) => n,
            _ => return false,
        };
        self.ops() >= n
    }

    fn fault(&self) -> Fault {
        match self.mode {
            Mode::Counted(fault) => fault,
            Mode::Ruled(_) => Fault::None,
        }
    }

    /// Undo every write since the last synced one, newest first.
    async fn lose_unsynced(&self, below: &dyn Store) {
        let undo = std::mem::take(&mut *self.unsynced.lock().unwrap());
        for (coll, id, before) in undo.into_iter().rev() {
            let now = below.get(&coll, &id).await.unwrap();
            match (now, before) {
                (Some(_), Some(before)) => assert!(below.replace(&coll, &id, doc! {}, before).await.unwrap()),
                (Some(_), None) => assert!(below.delete(&coll, &id, doc! {}).await.unwrap()),
                (None, Some(before)) => assert!(below.insert(&coll, before).await.unwrap()),
                (None, None) => {}
            }
        }
    }

    /// The moment of a crash, from inside the operation it strikes:
    /// nothing new starts, and what was already sent (operations issued
    /// side by side with this one) lands. Only then is the process dead,
    /// so that nothing it sent lands after whoever takes over has looked.
    async fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.until(|f| f.in_flight.load(Ordering::SeqCst) <= 1).await;
    }

    async fn gate<T>(&self, below: &dyn Store, run: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        if self.crashed.load(Ordering::SeqCst) || self.stopping.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _counted = InFlight(self);
        self.gated(below, n, run).await
    }

    async fn gated<T>(&self, below: &dyn Store, n: usize, run: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        match self.fault() {
            Fault::ErrorBefore(k) if k == n => Err(injected()),
            Fault::ErrorAfter(k) if k == n => {
                let _ = run.await;
                Err(injected())
            }
            Fault::Crash(k) if k == n => {
                self.stop().await;
                self.die();
                std::future::pending().await
            }
            Fault::CrashAfter(k) if k == n => {
                let _ = run.await;
                self.stop().await;
                self.die();
                std::future::pending().await
            }
            Fault::CrashLosingUnsynced(k) if k == n => {
                let _ = run.await;
                self.stop().await;
                // Then the unsynced suffix is lost.
                self.lose_unsynced(below).await;
                self.die();
                std::future::pending().await
            }
            _ => run.await,
        }
    }

    /// A write when a crash is to lose the unsynced ones: one at a time,
    /// so that each one's pre-image is exact and the log holds them in the
    /// order they landed.
    async fn logged_write<T>(
        &self,
        below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let _serial = self.serial.lock().await;
        if self.crashed.load(Ordering::SeqCst) || self.stopping.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        let id = op.detail.and_then(|w| w.id.clone());
        let durability = op.durability.unwrap_or(Durability::Synced);
        let logged = match (id, durability) {
            (Some(id), Durability::Unsynced) => {
                // Logged before it lands: a crash right after it loses it too.
                let before = below.get(op.coll, &id).await?;
                self.unsynced.lock().unwrap().push((op.coll.to_owned(), id.clone(), before.clone()));
                Some((id, before))
            }
            _ => None,
        };
        let answer = self.gate(below, run).await?;
        if durability == Durability::Synced {
            // Durable, and everything before it with it.
            self.unsynced.lock().unwrap().clear();
        } else if let Some((id, before)) = logged {
            // It changed nothing, so there is nothing to lose.
            if below.get(op.coll, &id).await? == before {
                self.unsynced.lock().unwrap().pop();
            }
        }
        Ok(answer)
    }

    async fn ruled<T>(
        &self,
        rule: &Mutex<Rule>,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let id = op.detail.and_then(|w| w.id.as_deref());
        let set = op.detail.and_then(|w| w.set.as_ref());
        let seen = Op { kind: op.name, coll: op.coll, id, set };
        let act = (rule.lock().unwrap())(&seen);
        match act {
            Act::Pass => run.await,
            Act::Delay(d) => {
                tokio::time::sleep(d).await;
                run.await
            }
            Act::Hold(gate) => {
                gate.pass().await;
                run.await
            }
            Act::Hang => std::future::pending().await,
            Act::FailBefore => Err(injected()),
            Act::FailAfter => {
                let _ = run.await;
                Err(injected())
            }
        }
    }
}

impl Layer for Faults {
    async fn around<T: Send>(
        &self,
        below: &dyn Store,
        op: &StoreOp<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if !struck(op.name) {
            return run.await;
        }
        match &self.mode {
            Mode::Ruled(rule) => self.ruled(rule, op, run).await,
            Mode::Counted(Fault::CrashLosingUnsynced(_)) if op.writes > 0 => self.logged_write(below, op, run).await,
            Mode::Counted(_) => self.gate(below, run).await,
        }
    }

    fn inspects(&self) -> bool {
        true
    }

    /// Chains and batches go write by write through the faults, used as
    /// the store underneath would have them used.
    fn splits_chains(&self) -> bool {
        true
    }
}
