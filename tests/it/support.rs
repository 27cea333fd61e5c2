//! The test harness: a real gateway on `127.0.0.1:0` against a real store,
//! one store (temp directory or MongoDB database) per test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, RequestBuilder, Response};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use txgate::config::{Config, StoreConfig};
use txgate_store::DynStore;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Mongodb,
    /// `store::memory` (the protocol's unit tests run on it): the store
    /// suite only, where no gateway is started.
    Memory,
}

/// The MongoDB-wire server the tests use. Missing is a failure: the test
/// script starts one; set `TXGATE_TEST_MONGO=skip` to opt out explicitly.
pub fn mongodb_uri() -> Option<String> {
    match std::env::var("TXGATE_TEST_MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => Some(uri),
        _ if std::env::var("CI").as_deref() != Ok("true")
            && std::env::var("TXGATE_TEST_MONGO").as_deref() == Ok("skip") =>
        {
            eprintln!("SKIPPED: MongoDB-backed test (TXGATE_TEST_MONGO=skip)");
            None
        }
        _ => panic!(
            "TXGATE_TEST_MONGODB_URI is not set: run the tests with scripts/test, which starts a MongoDB-wire server \
             (or set TXGATE_TEST_MONGO=skip outside CI to skip MongoDB-backed tests)"
        ),
    }
}

/// A fresh, empty store for one test.
pub struct TestStore {
    pub store: DynStore,
    pub config: StoreConfig,
    pub _dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// A fresh store with the migrations applied, as a gateway leaves it.
    pub async fn new(backend: Backend) -> Option<Self> {
        let ts = Self::unmigrated(backend).await?;
        txgate::testing::migrate::run(ts.store.as_ref()).await.expect("migrations apply");
        Some(ts)
    }

    pub async fn unmigrated(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Embedded => {
                let dir = tempfile::tempdir().expect("temp dir");
                let config = StoreConfig::Embedded {
                    data_dir: dir.path().to_owned(),
                    cache_mb: 64,
                    sync_interval: txgate::config::DEFAULT_SYNC_INTERVAL,
                    checkpoint_interval: txgate::config::DEFAULT_CHECKPOINT_INTERVAL,
                };
                let store = txgate::open_store(&config).await.expect("embedded store opens");
                Some(Self { store: templated(store), config, _dir: Some(dir) })
            }
            Backend::Memory => {
                let store: DynStore = Arc::new(txgate_store::memory::MemoryStore::default());
                // No configuration opens it: one naming no directory, so
                // nothing tries to reopen it from disk.
                let config = StoreConfig::Mongodb { uri: "memory:".into(), database: "memory".into() };
                Some(Self { store: templated(store), config, _dir: None })
            }
            Backend::Mongodb => {
                let uri = mongodb_uri()?;
                let database = format!("it_{}", uuid::Uuid::now_v7().simple());
                let config = StoreConfig::Mongodb { uri, database };
                let store = txgate::open_store(&config).await.expect("mongodb store opens");
                Some(Self { store: templated(store), config, _dir: None })
            }
        }
    }
}

/// `store` with the index templates of user collections, so that what a
/// test writes straight to it is indexed as the gateway's writes are.
pub fn templated(store: DynStore) -> DynStore {
    Arc::new(txgate_store::templates::Templates::over(store, txgate::testing::migrate::templates()))
}

pub fn test_config(store: StoreConfig) -> Config {
    let mut config = Config { store, ..Config::default() };
    config.txn.lock_wait = Duration::from_millis(300);
    // The wall clock, moved on by `TestApp::advance` where a test needs
    // retention, TTL or a lease to come due.
    config.txn.clock = txgate::testing::clock::Clock::shifted();
    // Hooks go to local test receivers only.
    config.hook_guard = txgate::testing::hooks::guard::HookGuard::new("127.0.0.1:*").expect("allow pattern");
    config
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub store: DynStore,
    pub config: Config,
    shutdown: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
    /// Work the gateway's requests left for after their answers, and its
    /// workers.
    handles: txgate::testing::Handles,
    /// Wakes [`TestApp::until`] after each write to the store.
    writes: Arc<txgate_store::layer::Layered<Writes>>,
    _store: Option<TestStore>,
}

pub use txgate::testing::woken_until;

/// How long [`TestApp::until`] waits for what it waits for.
pub const UNTIL: Duration = Duration::from_secs(30);

/// A store layer that wakes its waiters after every write that reached the
/// store below (whatever its outcome): what [`TestApp::until`] re-checks
/// its condition on, instead of a timer.
#[derive(Default)]
pub struct Writes {
    written: tokio::sync::Notify,
}

impl txgate_store::layer::Layer for Writes {
    async fn around<T: Send>(
        &self,
        _below: &dyn txgate_store::Store,
        op: &txgate_store::layer::Op<'_>,
        run: impl std::future::Future<Output = txgate_store::StoreResult<T>> + Send,
    ) -> txgate_store::StoreResult<T> {
        let out = run.await;
        if op.writes > 0 || op.durability.is_some() {
            self.written.notify_waiters();
        }
        out
    }
}

impl TestApp {
    /// A gateway on a fresh store; `None` only when MongoDB tests are
    /// explicitly skipped.
    pub async fn spawn(backend: Backend) -> Option<Self> {
        Self::spawn_with(backend, |_| {}).await
    }

    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> Option<Self> {
        let ts = TestStore::new(backend).await?;
        let mut config = test_config(ts.config.clone());
        tweak(&mut config);
        let store = Arc::clone(&ts.store);
        Some(Self::on_store(config, store, Some(ts)).await)
    }

    /// A gateway over an existing store (several instances on one store,
    /// or a store wrapped for fault injection).
    pub async fn on_store(config: Config, store: DynStore, keep: Option<TestStore>) -> Self {
        // TXGATE_TEST_LOG=<filter> shows the gateways' logs (e.g. `txgate=debug`).
        static LOG: std::sync::Once = std::sync::Once::new();
        LOG.call_once(|| {
            if let Ok(filter) = std::env::var("TXGATE_TEST_LOG") {
                let _ = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .with_test_writer()
                    .try_init();
            }
        });
        let writes = Arc::new(txgate_store::layer::Layered::new(store, Writes::default()));
        let store: DynStore = Arc::clone(&writes) as DynStore;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let shutdown = CancellationToken::new();
        let (tracker, handles) = tokio::sync::oneshot::channel();
        let server = {
            let (config, store, shutdown) = (config.clone(), Arc::clone(&store), shutdown.clone());
            tokio::spawn(async move {
                txgate::testing::serve(config, store, listener, shutdown, Some(tracker)).await.expect("gateway runs");
            })
        };
        let handles = handles.await.expect("the gateway starts");
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
        Self { base, client, store, config, shutdown, server: Some(server), handles, writes, _store: keep }
    }

    /// One whole pass of the gateway's worker `name` (`recovery`,
    /// `deliveries`, `subscriptions`, `ttl`, `purge`, `event_purge`,
    /// `index_builds`), now: what a test waits for instead of the next one.
    pub async fn run_once(&self, name: &str) {
        if let Err(err) = self.try_run_once(name).await {
            panic!("a pass of {name} failed: {err}");
        }
    }

    /// Once what requests left for after their answers is done, one pass
    /// of every worker in turn: whatever background work the data so far
    /// gives, done now.
    pub async fn run_every_worker_once(&self) {
        self.settled().await;
        for name in self.handles.names() {
            self.run_once(name).await;
        }
    }

    /// [`Self::run_once`], for a pass the test expects to fail.
    pub async fn try_run_once(&self, name: &str) -> txgate_store::StoreResult<()> {
        self.handles.run_once(name).await
    }

    /// Until `holds` answers `true`, checked now and again after each write
    /// that reaches the gateway's store (its own, its workers' and the
    /// test's through [`Self::store`]); at most [`UNTIL`], then a failure
    /// naming `what`.
    pub async fn until(&self, what: &str, mut holds: impl AsyncFnMut() -> bool) {
        let wait = async {
            loop {
                let written = self.writes.layer().written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                if holds().await {
                    return;
                }
                written.await;
            }
        };
        if tokio::time::timeout(UNTIL, wait).await.is_err() {
            panic!("{what}: not within {UNTIL:?}");
        }
    }

    /// Move the gateway's clock on by `by`: retention, TTL ages and leases
    /// come due as if that much time had passed.
    pub fn advance(&self, by: Duration) {
        assert!(self.config.txn.clock.advance(by), "the gateway's clock is not the tests' shifted one");
    }

    /// Wait until the work this gateway's requests left for after their
    /// answers is done: an event a single write sent on its way is in the
    /// log, a commit is rolled forward.
    pub async fn settled(&self) {
        let idle = tokio::time::timeout(Duration::from_secs(20), self.handles.idle()).await;
        assert!(idle.is_ok(), "the gateway's follow-up work never ended");
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }

    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path).send().await.expect("request sent")
    }

    pub async fn send_json(&self, method: Method, path: &str, body: &Value) -> Response {
        self.request(method, path).json(body).send().await.expect("request sent")
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.send_json(Method::POST, path, body).await
    }

    /// Stop the gateway and wait for it to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(20), server).await.expect("gateway stops in time").unwrap();
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A transaction record with `status`, its lease ending `expires_in_ms`
/// from now, holding update locks on `members` of `coll`; for writing
/// straight to the store.
pub fn txn_record(
    id: &str,
    status: txgate::testing::txn::record::Status,
    expires_in_ms: i64,
    coll: &str,
    members: &[&str],
) -> txgate::testing::txn::record::TxnRecord {
    use txgate::testing::txn::record::{Member, TxnRecord};
    let now = txgate_store::DateTime::now();
    TxnRecord {
        id: id.into(),
        status,
        started_at: now,
        expires_at: txgate_store::DateTime::from_millis(now.timestamp_millis() + expires_in_ms),
        committed_at: status.is_committed().then_some(now),
        finished_at: None,
        request: "{}".into(),
        members: members
            .iter()
            .map(|m| Member {
                collection: coll.into(),
                id: (*m).into(),
                op: txgate::testing::document::StagedOp::Update,
                base_v: None,
            })
            .collect(),
        results: status.is_committed().then(Vec::new),
        idempotency_key: None,
        abort_reason: None,
        failure: None,
        hook_count: 0,
        hooks: Vec::new(),
        key: None,
        user: None,
    }
}

/// The JSON body of a response, asserting its status first.
pub async fn expect(response: Response, status: u16) -> Value {
    let got = response.status().as_u16();
    let text = response.text().await.expect("body");
    assert_eq!(got, status, "unexpected status; body: {text}");
    if text.is_empty() { Value::Null } else { serde_json::from_str(&text).expect("JSON body") }
}

/// A problem+json response with `status` and `code`; returns the body.
pub async fn expect_problem(response: Response, status: u16, code: &str) -> Value {
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body = expect(response, status).await;
    assert_eq!(content_type.as_deref(), Some("application/problem+json"), "body: {body}");
    assert_eq!(body["code"], code, "body: {body}");
    assert_eq!(body["status"], status);
    body
}

/// Run one conformance test against both backends, the backend in the name.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Embedded).await
                }
            )*
        }
        mod mongodb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Mongodb).await
                }
            )*
        }
    };
}

/// One request a [`TestReceiver`] got.
#[derive(Clone, Debug)]
pub struct Received {
    pub at: std::time::Instant,
    pub method: String,
    pub path: String,
    pub headers: axum::http::HeaderMap,
    pub body: axum::body::Bytes,
    /// The status it was answered with.
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

#[derive(Default)]
struct Behaviour {
    /// Answers for the next requests, in order (status, extra headers).
    script: std::collections::VecDeque<(u16, Vec<(&'static str, String)>)>,
    /// How long to take over each answer.
    delay: Duration,
    /// Requests that have arrived (answered or not).
    arrived: usize,
    /// Wakes [`TestReceiver::arrived`] as each one arrives.
    arrival: Arc<tokio::sync::Notify>,
}

/// A webhook receiver (axum on `127.0.0.1:0`): records every request in a
/// channel and answers 200, or what it was told to answer next.
pub struct TestReceiver {
    pub addr: std::net::SocketAddr,
    behaviour: Arc<std::sync::Mutex<Behaviour>>,
    rx: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Received>>,
    stop: CancellationToken,
}

impl TestReceiver {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// On a given address (a receiver that was "down" comes back there).
    pub async fn start_on(addr: &str) -> Self {
        use axum::extract::{Request, State};
        type Shared = (Arc<std::sync::Mutex<Behaviour>>, tokio::sync::mpsc::UnboundedSender<Received>);
        async fn handle(State((behaviour, tx)): State<Shared>, req: Request) -> axum::response::Response {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            let (answer, delay) = {
                let mut b = behaviour.lock().unwrap();
                b.arrived += 1;
                b.arrival.notify_waiters();
                (b.script.pop_front().unwrap_or((200, Vec::new())), b.delay)
            };
            tokio::time::sleep(delay).await;
            let _ = tx.send(Received {
                at: std::time::Instant::now(),
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
                status: answer.0,
            });
            let mut res = axum::response::Response::new(axum::body::Body::from("ok"));
            *res.status_mut() = axum::http::StatusCode::from_u16(answer.0).unwrap();
            for (name, value) in answer.1 {
                res.headers_mut().insert(name, value.parse().unwrap());
            }
            res
        }
        let listener = tokio::net::TcpListener::bind(addr).await.expect("receiver binds");
        let addr = listener.local_addr().unwrap();
        let behaviour = Arc::new(std::sync::Mutex::new(Behaviour::default()));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let router = axum::Router::new().fallback(handle).with_state((Arc::clone(&behaviour), tx));
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(until.cancelled_owned()).await;
        });
        Self { addr, behaviour, rx: tokio::sync::Mutex::new(rx), stop }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answer the next `n` requests with `status`.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.answer_next(n, status, &[]);
    }

    /// Answer the next `n` requests with `status` and `headers`.
    pub fn answer_next(&self, n: usize, status: u16, headers: &[(&'static str, &str)]) {
        let headers: Vec<_> = headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        let mut b = self.behaviour.lock().unwrap();
        b.script.extend(std::iter::repeat_n((status, headers), n));
    }

    pub fn delay(&self, delay: Duration) {
        self.behaviour.lock().unwrap().delay = delay;
    }

    /// The next request, waiting up to `within`.
    /// Until `n` requests have arrived, answered or not (a slow receiver's
    /// are still being answered).
    pub async fn arrived(&self, n: usize, within: Duration) {
        let arrival = Arc::clone(&self.behaviour.lock().unwrap().arrival);
        let arrived = woken_until(&arrival, || self.behaviour.lock().unwrap().arrived >= n);
        if tokio::time::timeout(within, arrived).await.is_err() {
            panic!("{} of {n} requests arrived", self.behaviour.lock().unwrap().arrived);
        }
    }

    pub async fn next(&self, within: Duration) -> Received {
        tokio::time::timeout(within, self.rx.lock().await.recv())
            .await
            .unwrap_or_else(|_| panic!("no request reached the receiver within {within:?}"))
            .expect("receiver running")
    }

    /// Whatever arrives within `within` (for "nothing is sent" checks).
    pub async fn collect_for(&self, within: Duration) -> Vec<Received> {
        let mut rx = self.rx.lock().await;
        let mut out = Vec::new();
        let until = tokio::time::Instant::now() + within;
        while let Ok(Some(r)) = tokio::time::timeout_at(until, rx.recv()).await {
            out.push(r);
        }
        out
    }

    /// Stop listening (the receiver is "down" from now on).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for TestReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A Server-Sent Events client over one streaming response.
pub struct SseStream {
    response: Response,
    buffer: String,
}

/// One event of a stream: its `id` and its `data` as JSON.
#[derive(Clone, Debug)]
pub struct SseEvent {
    pub id: Option<String>,
    /// The `event:` field (`reauth`); `None` for a change event.
    pub event: Option<String>,
    pub data: Value,
}

impl SseStream {
    /// Open `path` on `app` as a stream, with `Last-Event-ID` when given.
    pub async fn open(app: &TestApp, path: &str, last_event_id: Option<&str>) -> Self {
        Self::open_url(&format!("{}{path}", app.base), last_event_id).await
    }

    /// Open `url` as a stream, with `Last-Event-ID` when given.
    pub async fn open_url(url: &str, last_event_id: Option<&str>) -> Self {
        match Self::try_open_url(url, last_event_id).await {
            Ok(stream) => stream,
            Err(status) => panic!("stream {url}: {status}"),
        }
    }

    /// [`SseStream::open_url`], or the status it was refused with.
    pub async fn try_open_url(url: &str, last_event_id: Option<&str>) -> Result<Self, u16> {
        let mut req = reqwest::Client::new().get(url);
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        Self::try_open(req).await
    }

    /// Open the stream `req` asks for (its own headers: a credential).
    pub async fn try_open(req: reqwest::RequestBuilder) -> Result<Self, u16> {
        let response = req.header("accept", "text/event-stream").send().await.expect("stream opens");
        if response.status() != 200 {
            return Err(response.status().as_u16());
        }
        let kind = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        Ok(Self { response, buffer: String::new() })
    }

    /// The next event within `within` (comments skipped); `None` on
    /// timeout or at the end of the stream.
    pub async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut event = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some(SseEvent { id, event, data: serde_json::from_str(&data).expect("event data is JSON") });
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk()).await.ok()?.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until `n` have come or `within` passes.
    pub async fn take(&mut self, n: usize, within: Duration) -> Vec<SseEvent> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        while out.len() < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(e) => out.push(e),
                None => break,
            }
        }
        out
    }

    /// Whether the server ended the stream within `within`.
    pub async fn ended(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return false,
                Ok(Ok(None)) | Ok(Err(_)) => return true,
                Ok(Ok(Some(chunk))) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
            }
        }
    }
}

/// One JSON page of `/v1/events`.
pub async fn events_page(app: &TestApp, query: &str) -> Value {
    let res = app
        .request(Method::GET, &format!("/v1/events?{query}"))
        .header("accept", "application/json")
        .send()
        .await
        .expect("sent");
    expect(res, 200).await
}

/// Every event after `after` through JSON pages, and the last `next`.
///
/// Pages are read until one comes back empty at the log's head: a page
/// stops before a position another helper took and has not filled yet
/// (it becomes a void entry), so an empty page alone does not mean the end.
pub async fn all_events(app: &TestApp, after: u64, extra: &str) -> (Vec<Value>, u64) {
    // Events of the writes answered so far are on their way to the log.
    app.settled().await;
    let log = txgate::testing::events::Log::new(
        Arc::clone(&app.store),
        txgate::testing::events::Tap::default(),
        app.config.events.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut next = after;
    let mut out = Vec::new();
    loop {
        let page = events_page(app, &format!("after={next}&limit=7{extra}")).await;
        let items = page["items"].as_array().expect("items").clone();
        let to = page["next"].as_u64().expect("next");
        assert!(to >= next, "next never goes back: {to} < {next}");
        next = to;
        if items.is_empty() {
            let head = log.head().await.expect("head");
            if next >= head {
                return (out, next);
            }
            assert!(Instant::now() < deadline, "the log never reached its head {head}: stuck at {next}");
            // A position taken and never filled (its writer failed): once
            // this gateway's own work is done, only its gap timeout closes it.
            app.settled().await;
            app.advance(app.config.events.gap_timeout + app.config.events.clock_skew + Duration::from_millis(1));
        }
        out.extend(items);
    }
}

/// The signing secret of the webhook tests (Standard Webhooks example key).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A gateway that signs its webhooks with [`SECRET`].
pub async fn signed_app(backend: Backend) -> Option<TestApp> {
    TestApp::spawn_with(backend, |c| {
        c.hooks.signer = Some(txgate::testing::hooks::sign::Signer::from_secret(SECRET).unwrap());
    })
    .await
}
