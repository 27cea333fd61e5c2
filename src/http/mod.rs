//! The HTTP API: router, shared state, OpenAPI document and the operational
//! endpoints (`/healthz`, `/readyz`, `/openapi.json`, `/docs`).

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod collections;
mod conflicts;
mod console;
pub(crate) mod contract;
pub(crate) mod deliveries;
mod described;
pub(crate) mod documents;
mod envelope;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod extract;
mod guard;
pub(crate) mod indexes;
pub(crate) mod limits;
mod me;
pub(crate) mod observe;
pub(crate) mod paging;
mod params;
pub(crate) mod problems;
pub(crate) mod queries;
mod rate;
mod reads;
pub(crate) mod ruled;
mod rules;
mod schemas;
pub(crate) mod serve;
pub(crate) mod strict;
pub(crate) mod subscriptions;
mod tickets;
pub(crate) mod transactions;

use crate::http::problems::{Problems, problems};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, State};
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Cors;
use crate::documents::Documents;
use crate::store::DynStore;
use crate::txn::Transactions;
use error::{ApiError, PROBLEM_JSON, ProblemCode};

/// What every handler can reach: one shared [`Shared`], so that the
/// clone each request's extractors and middleware take is one reference
/// count, not one per part.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

impl AppState {
    pub(crate) fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
pub(crate) struct Shared {
    pub documents: Arc<Documents>,
    pub store: DynStore,
    pub txns: Arc<Transactions>,
    /// Work that outlives its request (a transaction whose client hung up,
    /// a backup), waited for at shutdown.
    pub follow_ups: crate::follow_ups::FollowUps,
    pub hooks: Arc<crate::hooks::Hooks>,
    pub hook_guard: Arc<crate::hooks::guard::HookGuard>,
    pub events: Arc<crate::events::Log>,
    pub subscriptions: Arc<crate::subscriptions::Subscriptions>,
    pub collections: Arc<crate::collections::Collections>,
    pub indexes: Arc<crate::indexes::Indexes>,
    pub rules: Arc<crate::rules::Rules>,
    pub queries: Arc<crate::queries::Queries>,
    pub positioned: Arc<crate::positioned::Positioned>,
    pub conflicts: Arc<crate::conflicts::Conflicts>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Cancelled when the gateway shuts down: open event streams end.
    pub stop: tokio_util::sync::CancellationToken,
    /// One permit per event stream that may be open at once.
    pub streams: Arc<tokio::sync::Semaphore>,
    /// The reads of event streams catching up (far behind the head) that
    /// may run at once (`events::CATCH_UP_READS`).
    pub catch_up: Arc<tokio::sync::Semaphore>,
    /// Stream tickets, issued and claimed.
    pub tickets: Arc<crate::tickets::Tickets>,
    /// Where `POST /v1/admin/backup` writes, one backup at a time.
    pub backups: admin::Backups,
    /// Seals the cursors of lists a key sees only part of.
    pub seal: crate::seal::Seal,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "txgate",
        description = "HTTP/JSON gateway for MongoDB: multi-document transactions, optimistic locking, durable post-commit webhooks.\n\nErrors are RFC 9457 `application/problem+json` with a stable `code`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
        contact(name = "txgate"),
    ),
    tags(
        (name = "collections", description = "Collections: TTL policies and live counts"),
        (name = "documents", description = "Single documents with optimistic locking; queries and counts"),
        (name = "indexes", description = "Declared indexes: what queries are served by"),
        (name = "rules", description = "Per-document rules: which documents and fields each caller may read and write"),
        (name = "schemas", description = "Validation: a JSON Schema per collection and document schema version, checked on every write"),
        (name = "transactions", description = "Multi-document transactions"),
        (name = "deliveries", description = "Post-commit hook deliveries"),
        (name = "events", description = "Change events: a resumable stream and pages"),
        (name = "subscriptions", description = "Change events as webhooks"),
        (name = "operations", description = "Health, readiness and backups"),
    ),
    components(schemas(conflicts::ChangeOut))
)]
struct ApiDoc;

/// The routes, the OpenAPI document describing them, and each route's
/// guard.
pub(crate) fn api() -> (Router<AppState>, utoipa::openapi::OpenApi, guard::Guards) {
    let (routes, guards) = guard::Routes::new()
        .merge(collections::router())
        .merge(documents::router())
        .merge(conflicts::router())
        .merge(queries::router())
        .merge(reads::router())
        .merge(indexes::router())
        .merge(transactions::router())
        .merge(deliveries::router())
        .merge(events::router())
        .merge(tickets::router())
        .merge(subscriptions::router())
        .merge(admin::router())
        .merge(me::router())
        .merge(rules::router())
        .merge(schemas::router())
        .guarded(guard::Guard::Public, routes!(healthz))
        .guarded(guard::Guard::Public, routes!(readyz))
        .into_parts();
    let (router, document) = OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(routes).split_for_parts();
    (router, document, guards)
}

/// The OpenAPI document as committed in `openapi/openapi.json`.
pub fn openapi_json() -> String {
    document_text(api().1)
}

fn document_text(derived: utoipa::openapi::OpenApi) -> String {
    text_of(&contract::document(derived))
}

fn text_of(document: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(document).expect("the document serializes");
    text.push('\n');
    text
}

/// `GET /openapi.json`: the committed description, or with
/// `?collections=a,b` one typed by those collections' schemas
/// ([`described`]).
async fn openapi(
    State(state): State<AppState>,
    access: auth::Access,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    spec: Arc<String>,
    base: Arc<serde_json::Value>,
) -> Result<Response, ApiError> {
    let param = query.as_deref().and_then(|q| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .ok()
            .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "collections").map(|(_, v)| v))
    });
    let json = [(header::CONTENT_TYPE, "application/json")];
    match param {
        None => Ok((json, spec.as_str().to_owned()).into_response()),
        Some(param) => {
            let names = described::named(&param)?;
            let doc = described::described(&state, &access, &base, &names).await?;
            Ok((json, text_of(&doc)).into_response())
        }
    }
}

/// The complete application router for `config`.
pub(crate) fn router(state: AppState, config: &crate::config::Config) -> Router {
    let (routes, derived, mut guards) = api();
    let document = contract::document(derived);
    let params = Arc::new(params::Params::of(&document));
    let spec = Arc::new(text_of(&document));
    let keyless = config.keyless();
    let metrics = Arc::clone(&state.metrics);
    // Behind the keys when there are any (a key with `read` on every
    // collection scrapes it).
    // Parameters are checked once the body is read (a refusal before it
    // would leave it unread on the connection).
    let base = Arc::new(document.clone());
    let routes = routes
        .route("/metrics", axum::routing::get(observe::metrics))
        .route(
            "/openapi.json",
            axum::routing::get(move |state, access, query| {
                openapi(state, access, query, Arc::clone(&spec), Arc::clone(&base))
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(params, params::known_only))
        .route_layer(axum::middleware::from_fn_with_state(
            (config.max_body_bytes, config.body_timeout),
            limits::read_body,
        ));
    let routes = if keyless {
        routes
    } else {
        // On matched routes only: an unknown path or method answers 404/405
        // without a key, as it reveals nothing. Before the body is read: a
        // request without a valid key reads nothing.
        // A key with `read` on every collection scrapes the metrics.
        guards.insert("/metrics".to_owned(), guard::Guard::ByMethod(guard::On::Everywhere));
        guards.insert("/openapi.json".to_owned(), guard::Guard::Described);
        let issuers = (!config.issuers.is_empty()).then(|| {
            let issuers = Arc::new(crate::identity::Issuers::new(&config.issuers, &state.metrics));
            // The keys are fetched at start, so that the first user waits
            // for nothing; a provider down is logged and retried on use.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let warming = Arc::clone(&issuers);
                runtime.spawn(async move { warming.warm().await });
            }
            issuers
        });
        let keys =
            auth::Admission::new(config, issuers, Arc::clone(&state.tickets), Arc::clone(&state.metrics), guards);
        routes.route_layer(axum::middleware::from_fn_with_state(Arc::new(keys), auth::admit))
    };
    console::routes(routes, &config.issuers)
        .route("/docs", axum::routing::get(docs_page))
        .route("/docs/redoc.standalone.js", axum::routing::get(docs_script))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        // Bodies are read (and bounded) by `limits::read_body`.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::map_response(problem_for_bare_errors))
        // Outside authentication: a preflight carries no credentials.
        .layer(tower::util::option_layer(cors_layer(&config.cors)))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(tokio::sync::Semaphore::new(config.max_concurrency.max(1))),
            limits::limit,
        ))
        .layer(tower::util::option_layer(
            keyless.then(|| axum::middleware::from_fn_with_state(Arc::new(config.cors.clone()), limits::same_origin)),
        ))
        .layer(tower::util::option_layer(keyless.then(|| axum::middleware::from_fn(limits::loopback_host))))
        .layer(axum::middleware::from_fn(limits::head_limits))
        .layer(axum::middleware::from_fn(limits::close_after_early_refusal))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| {
                    let route = req.extensions().get::<MatchedPath>().map_or("", MatchedPath::as_str);
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), route)
                })
                .on_request(())
                .on_response(|res: &Response, latency: Duration, _span: &tracing::Span| {
                    tracing::info!(
                        status = res.status().as_u16(),
                        // To the microsecond: most requests take less than a millisecond.
                        duration_ms = latency.as_micros() as f64 / 1000.0,
                        "request finished"
                    );
                }),
        )
        .layer(axum::middleware::from_fn_with_state(metrics, observe::record))
        .with_state(state)
}

/// CORS for the configured origins: preflight on every route, the
/// request headers the API reads allowed, the response headers a client
/// needs (`ETag` for `If-Match`, `Location`, `Retry-After`) exposed. No
/// credentials: API keys travel in `Authorization`, which is allowed.
fn cors_layer(cors: &Cors) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{HeaderName, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origin = match cors {
        Cors::None => return None,
        Cors::Any => AllowOrigin::any(),
        Cors::Origins(list) => {
            AllowOrigin::list(list.iter().map(|o| HeaderValue::from_str(o).expect("origins are validated")))
        }
    };
    Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
            .allow_headers([
                header::IF_MATCH,
                header::IF_NONE_MATCH,
                HeaderName::from_static("idempotency-key"),
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
            ])
            .expose_headers([
                header::ETAG,
                header::LOCATION,
                header::RETRY_AFTER,
                header::WWW_AUTHENTICATE,
                HeaderName::from_static("idempotent-replayed"),
                HeaderName::from_static("ratelimit"),
                HeaderName::from_static("ratelimit-policy"),
                HeaderName::from_static(ruled::GRANT_HEADER),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

/// `/docs`: the API description rendered by a vendored Redoc (see
/// `docs/index.html`): the page loads nothing from anywhere but the gateway.
async fn docs_page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("docs/index.html")).into_response()
}

async fn docs_script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), (header::CACHE_CONTROL, "public, max-age=86400")],
        include_str!("docs/redoc.standalone.js"),
    )
        .into_response()
}

/// Error responses produced outside the handlers (unknown method, body
/// over the limit, ...) get a problem+json body like every other error.
async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let is_problem =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (code, detail) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            (ProblemCode::MethodNotAllowed, "this method is not allowed on this resource")
        }
        StatusCode::PAYLOAD_TOO_LARGE => (ProblemCode::PayloadTooLarge, "the request body is larger than the limit"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (ProblemCode::UnsupportedMediaType, "unsupported content type"),
        StatusCode::NOT_FOUND => (ProblemCode::NotFound, "not found"),
        s if s.is_server_error() => (ProblemCode::Internal, "internal error"),
        _ => (ProblemCode::BadRequest, "the request could not be understood"),
    };
    let allow = response.headers().get(header::ALLOW).cloned();
    let mut problem = ApiError::with_status(status, code, detail).into_response();
    if let Some(allow) = allow {
        problem.headers_mut().insert(header::ALLOW, allow);
    }
    problem
}

/// `GET /healthz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"status": "ok"}))]
struct Health {
    #[schema(value_type = HealthStatus)]
    status: HealthStatus,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
enum HealthStatus {
    Ok,
}

/// `GET /readyz`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"status": "ready", "store": "embedded"}))]
struct Ready {
    #[schema(value_type = ReadyStatus)]
    status: ReadyStatus,
    /// `embedded` or `mongodb`.
    store: &'static str,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
enum ReadyStatus {
    Ready,
}

problems!(
    /// What `v1.health.get` can answer besides its success.
    HealthProblems = Problems::of(&[RequestTimeout, PayloadTooLarge]).public()
);

/// Liveness
///
/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "v1.health.get", tag = "operations",
    responses(HealthProblems, (status = 200, description = "Up", body = Health)))]
async fn healthz() -> impl IntoResponse {
    axum::Json(Health { status: HealthStatus::Ok })
}

problems!(
    /// What `v1.ready.get` can answer besides its success.
    ReadyProblems = Problems::of(&[RequestTimeout, PayloadTooLarge, StoreUnavailable, NotReady]).public()
);

/// Readiness
///
/// The store answers and its migrations are applied.
#[utoipa::path(get, path = "/readyz", operation_id = "v1.ready.get", tag = "operations",
    responses(ReadyProblems,
        (status = 200, description = "Ready", body = Ready),
    ))]
async fn readyz(State(state): State<AppState>) -> Result<Response, ApiError> {
    let store = state.store.as_ref();
    store.ping().await?;
    if !crate::migrate::all_applied(store).await? {
        return Err(ApiError::new(ProblemCode::NotReady, "migrations are not applied yet"));
    }
    let mut response = axum::Json(Ready { status: ReadyStatus::Ready, store: store.backend() }).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
