//! `/v1/events`: the change-event log as a Server-Sent Events stream, or
//! as JSON pages for clients that cannot hold a connection (docs/design.md §5).
//!
//! A stream reads the log from the store at its own pace: the next read
//! happens only when the client has taken what came before, so a slow or
//! paused client holds one read's worth of events, never a growing queue.
//! It wakes when this process appends, and polls for what other instances
//! append.

use crate::http::problems::{Problems, problems};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::http::guard::{Guard, On, Routes};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::LastEventId;
use super::error::{ApiError, ProblemCode};
use super::extract::ApiQuery;
use crate::document::rules::Invalid;
use crate::events::ruled::RuledReader;
use crate::events::set::SetFilter;
use crate::events::{Event, EventType, Filter, Log, READ_BATCH, ReadError, Ready};
use crate::keys::Scope;
use crate::store::PAGE_BYTES;

pub(crate) fn router() -> Routes {
    // The handler checks the collections the filter names, or limits the
    // log to those granted.
    Routes::new().guarded(Guard::ByMethod(On::Handler), routes!(events))
}

/// How often an idle stream looks for events other instances appended.
const POLL: Duration = Duration::from_millis(250);
/// How soon a stream stopped at a gap looks again.
const GAP_RETRY: Duration = Duration::from_millis(20);
/// How long a stream that has just sent waits before it reads again.
const COALESCE: Duration = Duration::from_millis(10);
/// The comment line an idle stream gets.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Reads of streams catching up (far behind the head, reading the store
/// rather than the recent reads all streams share) that run at once on an
/// instance; the others wait their turn. Old filtered streams then take a
/// bounded share of the store and the cores, and a read that passes the
/// store's deadline is not joined by ever more of them.
pub(crate) const CATCH_UP_READS: usize = 4;
/// Positions one read of a stream catching up takes (at most 4 MiB of
/// events either way).
const CATCH_UP_BATCH: usize = 100;
/// The most event bytes one piece of a stream carries: a client that stops
/// reading holds at most this beyond what its last read found.
const CHUNK_BYTES: usize = 64 * 1024;
/// How long a stream whose read failed first waits; doubled after each
/// failure in a row, up to [`MAX_RETRY`].
const RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(15);
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;
/// Most positions one page request reads: a filter that matches little
/// returns fewer items (even none) with a `next` that moves forward,
/// instead of reading the whole log in one request.
const PAGE_SCAN: usize = 20 * READ_BATCH;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    /// Only events about these collections, comma-separated (a
    /// `transaction.committed` event: when one of its members is).
    pub collections: Option<String>,
    /// Only these event types, comma-separated.
    #[param(
        example = "document.created,document.updated",
        pattern = r"^(?:document\.(?:created|updated|deleted|expired)|transaction\.committed)(?:,(?:document\.(?:created|updated|deleted|expired)|transaction\.committed))*$"
    )]
    pub types: Option<String>,
    /// Start after this position: the `seq` of the last event received,
    /// or the `next` of the last page. A stream without it (and without
    /// `Last-Event-ID`) starts at the end of the log; a page without it
    /// at the oldest retained event.
    #[param(value_type = Option<i64>, minimum = 0)]
    pub after: Option<String>,
    /// Page size of a JSON page (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// A filter (JSON, see `Filter`) over the documents of the one
    /// collection `collections` names: only the changes that add a
    /// document to the filtered set, change one in it, or take one out of
    /// it (marked `"left": true`). A ready index must serve it, as a
    /// query's (400 `index_required`).
    #[param(value_type = Option<String>, example = r#"{"status":"open"}"#)]
    pub filter: Option<String>,
    /// A ticket (`POST /v1/events/tickets`) in place of the
    /// `Authorization` header, for `EventSource`: used once, within 60 s,
    /// for the stream it was asked for (the other parameters must be the
    /// ticket's; `after` and `Last-Event-ID` may be given, else the
    /// ticket's `after` applies).
    pub ticket: Option<String>,
}

/// The ticket a stream is opened with, not spent yet: found by admission,
/// or here when no credentials are configured.
async fn claimed_ticket(
    state: &AppState,
    query: &EventsQuery,
    peeked: Option<crate::tickets::Peeked>,
) -> Result<Option<crate::tickets::Peeked>, ApiError> {
    let Some(ticket) = &query.ticket else { return Ok(None) };
    let peeked = match peeked {
        Some(peeked) => peeked,
        None => state.tickets.peek(ticket).await.map_err(super::auth::ticket_refused)?,
    };
    let s = &peeked.claimed.stream;
    if (&s.collections, &s.types, &s.filter) != (&query.collections, &query.types, &query.filter) {
        return Err(super::auth::ticket_refused(crate::tickets::Refused::Invalid(
            "the ticket is for another stream: give the collections, types and filter it was asked for",
        )));
    }
    Ok(Some(peeked))
}

/// Use the ticket a stream or page is opened with: a conditional write, so
/// that of several requests with it, on any instances, one is served.
async fn spend(state: &AppState, ticket: &Option<crate::tickets::Peeked>) -> Result<(), ApiError> {
    match ticket {
        Some(ticket) => state.tickets.spend(&ticket.id).await.map_err(super::auth::ticket_refused),
        None => Ok(()),
    }
}

/// A page of events.
#[derive(Serialize, ToSchema)]
pub(crate) struct EventPage {
    pub items: Vec<Event>,
    /// The position to continue after (`after=`): the last position read,
    /// never past a gap that may still fill. The same as `after` when
    /// nothing new was found.
    pub next: u64,
}

/// The filter of `query`, for a caller with `access`: a key limited to
/// some collections may name only those, and sees only events telling of
/// nothing else.
pub(super) fn filter(query: &EventsQuery, access: &Access) -> Result<Filter, ApiError> {
    let collections = query
        .collections
        .as_deref()
        .map(|s| s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect::<Vec<String>>());
    let types = match query.types.as_deref() {
        None => None,
        // Strict, as the description's pattern: no empty or padded parts.
        Some(s) => Some(s.split(',').map(|t| event_type(t, "/query/types")).collect::<Result<Vec<_>, _>>()?),
    };
    // A name no collection can have matches nothing: refused, as a
    // misspelling would be.
    for name in collections.iter().flatten() {
        crate::document::rules::check_collection(name, "/query/collections")?;
    }
    access.check_all(Scope::Read, collections.iter().flatten().map(String::as_str))?;
    Ok(Filter { collections, types, within: access.collections(Scope::Read), admin: access.collections(Scope::Admin) })
}

/// The filtered set of `query` (`filter` with one collection), served by
/// a ready index as a query's filter must be.
pub(super) async fn set_filter(state: &AppState, query: &EventsQuery) -> Result<Option<Arc<SetFilter>>, ApiError> {
    let Some(text) = &query.filter else { return Ok(None) };
    let names: Vec<&str> =
        query.collections.as_deref().unwrap_or_default().split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let [collection] = names.as_slice() else {
        let detail = "a filter applies to one collection: name it alone in collections";
        return Err(ApiError::bad_request(ProblemCode::InvalidFilter, detail).pointer("/query/collections", detail));
    };
    let filter = super::queries::filter_param(text)?;
    let planning = crate::query::plan::Planning::Count { filter: &filter };
    if let Err(why) = state.indexes.plan(collection, planning).await? {
        let err = state.queries.unserved(collection, why, planning).await;
        return Err(super::queries::unserved(collection, err));
    }
    Ok(Some(Arc::new(SetFilter { collection: (*collection).to_owned(), filter: filter.matcher() })))
}

/// Event type `t`, or why not (at `pointer`).
pub(crate) fn event_type(t: &str, pointer: &str) -> Result<EventType, Invalid> {
    EventType::parse(t).ok_or_else(|| {
        let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        Invalid::new(pointer, format!("unknown event type {t:?}; known: {}", known.join(", ")))
    })
}

pub(super) fn position(value: &str, pointer: &str) -> Result<u64, ApiError> {
    value
        .parse::<i64>()
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| Invalid::new(pointer, "a position is an integer from 0 to 2^63-1").into())
}

fn expired(err: ReadError) -> ApiError {
    match err {
        ReadError::Expired { .. } => ApiError::new(ProblemCode::CursorExpired, err.to_string()),
        ReadError::Store(e) => e.into(),
    }
}

/// Whether the client asked for JSON rather than a stream.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(",");
    accept.contains("application/json") && !accept.contains("text/event-stream")
}

problems!(
    /// What `v1.events.list` can answer besides its success.
    ListProblems = Problems::of(&[InvalidHeader, CursorBeyondHead, ValidationFailed, CursorExpired, InvalidFilter, IndexRequired, TicketInvalid, RuleDenied])
);

/// Read change events
///
/// Server-Sent Events by default: each event as `id: <seq>` and `data:
/// <the event as JSON>`, every matching event after the cursor, in `seq`
/// order, none lost; reconnect with `Last-Event-ID` (or `after=`) to go
/// on. A stream opens with the comment `: position <seq>`, the position
/// it starts after (a resume point before any event); an idle stream gets
/// a comment line every 15 s.
///
/// With `Accept: application/json`: one page, `{"items", "next"}`; pass
/// `next` as `after` for the following page. A page stops short of
/// `limit` once the events it read hold 4 MiB as stored.
///
/// With `filter` (and one collection in `collections`): only the changes
/// that add a document to the filtered set, change one in it, or take
/// one out of it (deleted, expired, or no longer matching: the event says
/// `"left": true`), and no `transaction.committed` event. Start it from
/// the `position` of a query page, a count or a batch read to keep a
/// list live without missing or repeating a change.
///
/// Only committed changes appear, each once per position. A cursor older
/// than the event retention answers 410 `cursor_expired`. An API key
/// limited to some collections may filter by those only, and sees only
/// events that tell of nothing else (not a transaction's with a member
/// elsewhere).
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "v1.events.list",
    tag = "events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<LastEventId>, Header, description = "The `id` of the last event received (a stream's cursor; `after=` wins when both are given)"),
    ),
    responses(ListProblems,
        (status = 200, description = "The event stream, or one page of events", content(
            (EventPage = "application/json"),
            (String = "text/event-stream"),
        )),
    )
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    access: Access,
    headers: HeaderMap,
    ticket: Option<axum::Extension<crate::tickets::Peeked>>,
    super::ruled::Who(who): super::ruled::Who,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let ticket = claimed_ticket(&state, &query, ticket.map(|axum::Extension(t)| t)).await?;
    let filter = filter(&query, &access)?;
    let set = set_filter(&state, &query).await?;
    // A filter on a field the rules hide would tell its values.
    if let (Some(set), Some(text)) = (&set, &query.filter)
        && let crate::rules::Judged::Ruled(judge) = super::ruled::judged(&state, &set.collection, &who).await?
    {
        let filter = super::queries::filter_param(text)?;
        let paths = filter.paths.keys().map(|p| (p.as_str(), "/query/filter".to_owned()));
        super::ruled::readable_paths(&judge, crate::rules::Action::Stream, paths)?;
    }
    // Each event judged by the rules of its collection, where they judge
    // this caller (docs/guides/rules.md, "Streams").
    let ruled =
        (who.kind != crate::rules::Kind::Open).then(|| Arc::new(RuledReader::new(who, Arc::clone(&state.rules))));
    // The grants the caller has now on the collections it names: a rule
    // change that takes every one away ends the stream with `reauth`, even
    // before it was sent an event.
    if let (Some(ruled), Some(collections)) = (&ruled, &filter.collections) {
        ruled.seed(collections).await?;
    }
    let last_event_id = headers.get("last-event-id");
    let from_header = match last_event_id {
        None => None,
        Some(id) => Some(
            id.to_str()
                .ok()
                .filter(|s| (1..=18).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| ApiError::new(ProblemCode::InvalidHeader, "Last-Event-ID is the seq of an event"))?,
        ),
    };
    let after = match (&query.after, from_header, ticket.as_ref().and_then(|t| t.claimed.stream.after.clone())) {
        (Some(after), _, _) => Some(position(after, "/query/after")?),
        (None, Some(from_header), _) => Some(from_header),
        (None, None, Some(after)) => Some(position(&after, "/after")?),
        (None, None, None) => None,
    };
    let log = Arc::clone(&state.events);
    // A client reads the events of every answer it had from this instance.
    log.settle().await;
    if let Some(after) = after {
        // A cursor no event has reached would wait for ever.
        let head = log.head().await?;
        if after > head {
            return Err(ApiError::new(
                ProblemCode::CursorBeyondHead,
                format!("the cursor {after} is beyond the log's last position ({head}): use a position an event had"),
            ));
        }
    }
    // Checked for a stream too, which has no pages: a value out of range
    // is refused the same whichever the client asked for.
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Invalid::new("/query/limit", format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    if wants_json(&headers) {
        spend(&state, &ticket).await?;
        let after = match after {
            Some(after) => after,
            None => log.floor().await?,
        };
        let page =
            page(&log, &filter, (ruled.as_deref(), set.as_deref()), after, limit as usize).await.map_err(expired)?;
        return Ok(axum::Json(page).into_response());
    }
    let start = match after {
        Some(after) => {
            let floor = log.floor().await?;
            if after < floor {
                return Err(expired(ReadError::Expired { after, floor }));
            }
            after
        }
        None => log.head().await?,
    };
    // Each open stream holds one of its caller's stream slots (and a
    // user's, one of their issuer's) and one of the instance's until it
    // ends (TXGATE_MAX_STREAMS_PER_KEY, an issuer's max_streams_per_user
    // and max_streams, TXGATE_MAX_STREAMS): no caller takes every slot.
    let Ok(key_slot) = access.stream_slot() else {
        tracing::debug!("event stream refused: the caller holds its share of the stream slots");
        return Err(ApiError::new(
            ProblemCode::Overloaded,
            "this API key has as many event streams open on this instance as its share allows \
             (TXGATE_MAX_STREAMS_PER_KEY; for a user, its issuer's max_streams_per_user, or all its users \
             max_streams); close one, retry later, or read pages (Accept: application/json)",
        )
        .retry(std::time::Duration::from_secs(5)));
    };
    let Ok(slot) = Arc::clone(&state.streams).try_acquire_owned() else {
        tracing::debug!("event stream refused: every stream slot is taken");
        return Err(ApiError::new(
            ProblemCode::Overloaded,
            "this instance has as many event streams open as it is configured to (TXGATE_MAX_STREAMS); retry later, \
             or read pages (Accept: application/json)",
        )
        .retry(std::time::Duration::from_secs(5)));
    };
    // Open: the ticket is used now, once (on whichever instance).
    spend(&state, &ticket).await?;
    let reader = Reader {
        ruled,
        lost: false,
        opened: Some(start),
        _slot: (slot, key_slot),
        log,
        filter,
        set,
        cursor: start,
        pending: VecDeque::new(),
        appended: state.events.subscribe(),
        catch_up: Arc::clone(&state.catch_up),
        failures: 0,
        stop: state.stop.clone(),
        idle_since: tokio::time::Instant::now(),
        _open: state.metrics.hold(&crate::metrics::EVENT_STREAMS_OPEN),
        ends: access.expires.map(until),
        reauthed: false,
        last_sent: start,
    };
    let stream = futures::stream::unfold(reader, Reader::next);
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            // Proxies that buffer responses (nginx) pass this one through.
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

/// `ready` as the reader sees it: judged by the rules that judge the
/// caller, and by the filtered set it follows.
async fn shown(
    log: &Log,
    ruled: Option<&RuledReader>,
    set: Option<&SetFilter>,
    ready: &Arc<Ready>,
) -> Result<Option<Arc<Ready>>, crate::store::StoreError> {
    match (ruled, set) {
        (Some(ruled), set) => ruled.judge(log, ready, set).await,
        (None, Some(set)) => set.judge(log, ready).await,
        (None, None) => Ok(Some(Arc::clone(ready))),
    }
}

/// One page: up to `limit` matching events after `after`.
async fn page(
    log: &Log,
    filter: &Filter,
    (ruled, set): (Option<&RuledReader>, Option<&SetFilter>),
    after: u64,
    limit: usize,
) -> Result<EventPage, ReadError> {
    let mut items = Vec::new();
    let mut next = after;
    let mut scanned = 0;
    let mut bytes = 0;
    loop {
        let batch = log.read_fresh(next, READ_BATCH).await?;
        bytes += batch.bytes;
        let mut read_to = batch.next;
        for ready in batch.events {
            if !filter.wants(&ready.event) {
                continue;
            }
            let Some(shown) = shown(log, ruled, set, &ready).await? else { continue };
            if items.len() == limit {
                // The page is full: the next one starts before this.
                read_to = shown.event.seq - 1;
                break;
            }
            items.push(shown.event.clone());
        }
        scanned += READ_BATCH;
        next = read_to;
        if items.len() == limit || !batch.more || scanned >= PAGE_SCAN || bytes >= PAGE_BYTES {
            return Ok(EventPage { items, next });
        }
    }
}

/// A stream's state between the events it hands out.
struct Reader {
    /// The position the stream starts after, sent first as a comment
    /// (`: position <seq>`) and then taken.
    opened: Option<u64>,
    log: Arc<Log>,
    filter: Filter,
    /// The filtered set the stream follows, if any.
    set: Option<Arc<SetFilter>>,
    /// The caller, whose events rules judge.
    ruled: Option<Arc<RuledReader>>,
    cursor: u64,
    pending: VecDeque<Arc<Ready>>,
    appended: tokio::sync::watch::Receiver<u64>,
    /// The instance's turns for reads of streams catching up.
    catch_up: Arc<tokio::sync::Semaphore>,
    /// Reads that failed in a row.
    failures: u32,
    stop: CancellationToken,
    /// When the stream last sent something.
    idle_since: tokio::time::Instant,
    /// Counts the stream as open until it is dropped.
    _open: crate::metrics::Held,
    /// The instance's stream slot and the key's (none without keys).
    _slot: (tokio::sync::OwnedSemaphorePermit, Vec<tokio::sync::OwnedSemaphorePermit>),
    /// When the credential the stream was opened with expires (a user's
    /// token): the stream then sends `event: reauth` and ends. `None`: an
    /// API key's stream, which does not.
    ends: Option<tokio::time::Instant>,
    /// Whether `reauth` was sent: the stream is over.
    reauthed: bool,
    /// Whether a rule change left the caller no grant (see [`Reader::take`]).
    lost: bool,
    /// The seq of the last event sent (at first, the position the stream
    /// starts after).
    last_sent: u64,
}

/// The instant of `expires` on the runtime's clock.
fn until(expires: std::time::SystemTime) -> tokio::time::Instant {
    let left = expires.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::Instant::now() + left
}

/// Sleeps until `ends`, or for ever.
async fn expiry(ends: Option<tokio::time::Instant>) {
    match ends {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Reader {
    /// How long to wait after a read that failed: [`RETRY`], doubled for
    /// each failure in a row up to [`MAX_RETRY`], so that streams do not
    /// add reads to a store that is not keeping up.
    fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        (RETRY * 2u32.saturating_pow(self.failures - 1)).min(MAX_RETRY)
    }

    /// Queue the events of `events` the stream wants, in order. On an
    /// error the cursor stays before the event that could not be judged.
    /// `Ok(true)`: the caller lost every grant of a collection's rules at
    /// an event (the cursor stays before it): the stream ends with
    /// `reauth` once what came before is sent.
    async fn take(&mut self, events: Vec<Arc<Ready>>) -> Result<bool, crate::store::StoreError> {
        for ready in events {
            if !self.filter.wants(&ready.event) {
                continue;
            }
            let shown = match shown(&self.log, self.ruled.as_deref(), self.set.as_deref(), &ready).await {
                Ok(shown) => shown,
                Err(err) => {
                    self.cursor = ready.event.seq - 1;
                    return Err(err);
                }
            };
            if self.ruled.as_ref().is_some_and(|r| r.lost()) {
                self.cursor = ready.event.seq - 1;
                return Ok(true);
            }
            self.pending.extend(shown);
        }
        Ok(false)
    }

    /// The next piece of the stream: every event one read found, as
    /// Server-Sent Events in one chunk (`id: <seq>`, `data: <JSON>`; the
    /// JSON of an event is one line), or a comment line after
    /// [`KEEP_ALIVE`] without one. The first piece is the comment
    /// `: position <seq>`, the position the stream starts after.
    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if self.stop.is_cancelled() || self.reauthed {
                return None;
            }
            if let Some(ends) = self.ends
                && tokio::time::Instant::now() >= ends
            {
                // The token expired: say so, and end. The client asks for a
                // ticket with the last id it saw, and misses nothing.
                self.ends = None;
                self.reauthed = true;
                let last = self.last_sent;
                let text =
                    format!("event: reauth\ndata: {{\"reason\":\"token_expired\",\"last_event_id\":\"{last}\"}}\n\n");
                return Some((Ok(Bytes::from(text)), self));
            }
            if self.lost && self.pending.is_empty() {
                // A rule change left the caller no grant: say so, and end.
                self.reauthed = true;
                let last = self.last_sent;
                let text =
                    format!("event: reauth\ndata: {{\"reason\":\"grants_changed\",\"last_event_id\":\"{last}\"}}\n\n");
                return Some((Ok(Bytes::from(text)), self));
            }
            if let Some(start) = self.opened.take() {
                // Every parser skips a comment; a client that has seen no
                // event yet resumes from here (`Last-Event-ID: <seq>`)
                // without missing one.
                return Some((Ok(Bytes::from(format!(": position {start}\n\n"))), self));
            }
            if !self.pending.is_empty() {
                // Pieces of at most CHUNK_BYTES (or one event): what the
                // connection holds for a client that stopped reading.
                let mut chunk = String::new();
                while let Some(ready) = self.pending.front() {
                    if !chunk.is_empty() && chunk.len() + ready.json.len() > CHUNK_BYTES {
                        break;
                    }
                    let _ = write!(chunk, "id: {}\ndata: {}\n\n", ready.event.seq, ready.json);
                    self.last_sent = ready.event.seq;
                    self.pending.pop_front();
                }
                self.idle_since = tokio::time::Instant::now();
                return Some((Ok(Bytes::from(chunk)), self));
            }
            if self.idle_since.elapsed() >= KEEP_ALIVE {
                self.idle_since = tokio::time::Instant::now();
                return Some((Ok(Bytes::from_static(b":\n\n")), self));
            }
            // A stream that has just sent reads again only after a moment,
            // so that under a steady flow each send carries what arrived
            // meanwhile: one wake-up and one write per stream every few
            // milliseconds, not per commit.
            let since = self.idle_since.elapsed();
            if since < COALESCE {
                tokio::select! {
                    () = self.stop.cancelled() => return None,
                    () = tokio::time::sleep(COALESCE - since) => {}
                    () = expiry(self.ends) => continue,
                }
            }
            // Changes from here on wake the wait below.
            self.appended.borrow_and_update();
            // Far behind the head: one of the instance's few turns, held
            // for the read and the judging of what it found.
            let turn = if self.log.behind(self.cursor) {
                tokio::select! {
                    () = self.stop.cancelled() => return None,
                    turn = Arc::clone(&self.catch_up).acquire_owned() => turn.ok(),
                    () = expiry(self.ends) => continue,
                }
            } else {
                None
            };
            let most = if turn.is_some() { CATCH_UP_BATCH } else { READ_BATCH };
            let wait = match self.log.read(self.cursor, most).await {
                Ok(batch) => {
                    let before = self.cursor;
                    match self.take(batch.events).await {
                        // Taken up to the event whose judging failed: read
                        // it again after a moment.
                        Err(err) => {
                            tracing::warn!(error = %err, "an event stream could not judge an event against its filter; retrying");
                            if !self.pending.is_empty() {
                                continue;
                            }
                            self.failed()
                        }
                        Ok(true) => {
                            self.lost = true;
                            continue;
                        }
                        Ok(false) => {
                            self.failures = 0;
                            self.cursor = batch.next;
                            if !self.pending.is_empty() || batch.more || (batch.next > before && !batch.gap) {
                                continue;
                            }
                            if batch.gap { GAP_RETRY } else { POLL }
                        }
                    }
                }
                Err(ReadError::Expired { after, floor }) => {
                    tracing::warn!(after, floor, "an event stream fell behind the retention; closing it");
                    return None;
                }
                Err(ReadError::Store(err)) => {
                    tracing::warn!(error = %err, "an event stream could not read the log; retrying");
                    self.failed()
                }
            };
            drop(turn);
            let wait = wait.min(KEEP_ALIVE.saturating_sub(self.idle_since.elapsed()));
            tokio::select! {
                () = self.stop.cancelled() => return None,
                _ = self.appended.changed(), if self.failures == 0 => {}
                () = tokio::time::sleep(wait) => {}
                () = expiry(self.ends) => {}
            }
        }
    }
}
