//! leasehold's front door: an HTTP/JSON API (axum) for producers and operators, and `/metrics` for Prometheus.
//!
//! ```text
//!   POST /v1/commands[?wait=true&timeout=30s]   a command in JSON -> published on its ingress subject
//!   POST /v1/commands/batch                     a JSON array of commands -> published together, one answer each
//!   GET  /v1/commands/{id}                      its outcome, or "dead-lettered" with the reason
//!   GET  /v1/resources/{ref}  /v1/resources?agent=&state=&kind=
//!   GET  /v1/leases?resource=  /v1/leases/{ref}  /v1/agents  /v1/pools  /v1/pools/{name}  /v1/dlq
//!   GET  /v1/resources/{ref}/history  /v1/leases/{ref}/history  /v1/pools/{name}/{value}/history
//!                                               the steps about it, from the timeline index (?after=&before=&limit=)
//!   GET  /v1/events?key=&from=                  outcomes as server-sent events, following
//!   GET  /healthz  /readyz  /metrics
//!   GET  /ui/...                                the operator's view: HTML pages (read-only)
//! ```
//!
//! Commands are decoded with the strict decoding of `schemas` (a 400 names the field path and the value; nothing is
//! published), and only `op` commands are taken (403 for `agent` and `sys`: DESIGN section 12). Queries read the
//! projector's read models in the same process; `?wait=true` returns once the outcome is decided *and* projected,
//! so a query right after it sees what it did. A process that runs no gateway role still serves `/healthz` and
//! `/metrics` ([`metrics_only`]), so every `serve` process can be scraped.
//!
//! `/healthz` is liveness (a role, an agent or a partition stopped: 503); `/readyz` is readiness (every role of the
//! process ready: 200, else 503 naming what each waits on). Until [`GatewayConfig::ready`] says the gateway is ready,
//! commands are refused with 503 and `Retry-After`, nothing published ([`ready`]).
//!
//! With [`GatewayConfig::tokens`], every `/v1/...` request needs `Authorization: Bearer <token>` (401 otherwise,
//! before anything is read or published), and a command's issuer is the principal of its token, whatever its body
//! says ([`auth`]). The operator's view trades a token for a read-only session at its login page ([`session`]): its
//! cookie is taken on reads (`GET`, `HEAD`) only. Without tokens (development, on loopback: `leasehold serve`
//! enforces that), the body's issuer stays.

#![forbid(unsafe_code)]
// Handlers answer errors as ready responses, once per request: boxing them would save nothing that matters.
#![allow(clippy::result_large_err)]

mod auth;
mod batch;
mod commands;
mod connection;
mod dead;
mod events;
mod export;
mod history;
mod metrics;
mod queries;
mod ready;
mod session;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold_log::Log;
use leasehold_projector::{Projector, Reader};
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use auth::{MIN_TOKEN_LEN, TokenFileError, TokenFileErrorKind, Tokens};
pub use batch::{BatchAnswer, BatchRefusal, MAX_BATCH_BYTES, MAX_BATCH_COMMANDS};
pub use commands::{CommandStatus, DeadLetterView, PositionedOutcome};
pub use dead::DeadView;
pub use events::EventsMetrics;
pub use metrics::ProjectionMetrics;
pub use ready::{Readiness, ReadyCheck};
pub use session::MAX_SESSION_TTL;

/// Settings of the gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// How long `?wait=true` waits when the request names no `timeout`.
    pub default_wait: Duration,
    /// The longest `timeout` a request may ask for.
    pub max_wait: Duration,
    /// The bearer tokens callers must present on `/v1/...`, each naming the principal recorded as the issuer of its
    /// commands; `None`: no authentication, and the issuer is what the command says (development only).
    pub tokens: Option<Arc<Tokens>>,
    /// The most commands of concurrent requests published together (batched ingest); 1 publishes each alone.
    pub ingest_batch: usize,
    /// Whether the gateway takes commands yet (default: always): until it does, `POST /v1/commands` and
    /// `/v1/commands/batch` answer 503 with `Retry-After` and publish nothing, so no command overtakes what the
    /// process stores first.
    pub ready: ReadyCheck,
    /// How long after it ended a terminal record (a destroyed resource, a released lease...) is still listed by
    /// `GET /v1/resources` and `/v1/leases` without `all=true`.
    pub list_ended_for: Duration,
    /// With tokens: how long a session of the operator's view lasts from its login (at most [`MAX_SESSION_TTL`]).
    pub ui_session_ttl: Duration,
    /// With tokens: the most sessions of the operator's view kept at once; a login beyond it ends the oldest.
    pub ui_sessions_max: usize,
    /// Whether browsers reach the gateway over TLS (a proxy in front of it ends TLS): session cookies are then
    /// `Secure`, never sent over plain HTTP.
    pub behind_tls: bool,
    /// The most streams of `GET /v1/events` open at once; one more is answered 503 with `Retry-After`.
    pub events_max_streams: usize,
    /// How long a stream of events waits for a client that does not read (its connection full, the events between
    /// the log and it all waiting) before it ends the stream and closes the connection; the client resumes from
    /// its last id.
    pub events_stall_timeout: Duration,
    /// How many events wait, per stream, between the log and a client's connection (beyond what the connection's
    /// buffers hold): when they are all waiting, the client is not reading.
    pub events_buffer: usize,
    /// The counts of the streams of events (open, refused, dropped), registered by whoever owns the registry.
    pub events_metrics: EventsMetrics,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            default_wait: Duration::from_secs(30),
            max_wait: Duration::from_secs(300),
            tokens: None,
            ingest_batch: leasehold_log::MAX_APPEND_RECORDS,
            ready: ReadyCheck::ready(),
            list_ended_for: Duration::from_secs(3600),
            ui_session_ttl: Duration::from_secs(12 * 3600),
            ui_sessions_max: 10_000,
            behind_tls: false,
            events_max_streams: 256,
            events_stall_timeout: Duration::from_secs(30),
            events_buffer: 64,
            events_metrics: EventsMetrics::default(),
        }
    }
}

/// What the API handlers share: the log (to publish and to read outcomes and dead letters), the read models, and
/// the projector's last applied sequence (to wait for an outcome to be projected).
pub struct Api<L: Log> {
    log: L,
    /// Publishes the commands of concurrent requests together.
    ingest: leasehold_log::ingest::Ingest,
    reader: Reader,
    applied: tokio::sync::watch::Receiver<u64>,
    dead: dead::DeadLetters,
    /// The open streams of `GET /v1/events`, at most [`GatewayConfig::events_max_streams`].
    event_streams: Arc<tokio::sync::Semaphore>,
    config: GatewayConfig,
    shutdown: CancellationToken,
}

impl<L: Log> std::fmt::Debug for Api<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("partitions", &self.log.partitions()).finish_non_exhaustive()
    }
}

impl<L: Log> Api<L> {
    /// The API over `log` and the read models of `projector` (which runs in the same process). Streams of events
    /// end when `shutdown` is cancelled.
    pub fn new(log: L, projector: &Projector, config: GatewayConfig, shutdown: CancellationToken) -> Arc<Self> {
        let (reader, applied) = (projector.reader(), projector.subscribe());
        let ingest = leasehold_log::ingest::Ingest::start(log.clone(), config.ingest_batch);
        let event_streams = Arc::new(tokio::sync::Semaphore::new(config.events_max_streams));
        Arc::new(Api {
            log,
            ingest,
            reader,
            applied,
            dead: dead::DeadLetters::default(),
            event_streams,
            config,
            shutdown,
        })
    }
}

/// What `/healthz`, `/readyz` and `/metrics` need.
#[derive(Debug, Clone)]
pub struct Health {
    /// The roles this process runs.
    pub roles: Vec<String>,
    /// The process's metrics (every role registers its own).
    pub registry: Arc<Registry>,
    /// Gauges read from the projection at each scrape, when this process runs the projector.
    pub projection: Option<ProjectionMetrics>,
    /// Roles (or in-process agents) of this process that stopped on an error: `/healthz` answers 503 and names them
    /// (and names, without failing, what stopped only for one machine's resources: [`Failures::push_degraded`]).
    pub failures: Failures,
    /// The writers of this process, when it runs them: a partition they stopped on record makes `/healthz` answer
    /// 503 too.
    pub workers: Option<leasehold_worker::WorkerMetrics>,
    /// What `/readyz` asks each role of the process (none: ready as soon as it answers).
    pub ready: Readiness,
}

impl Health {
    /// The health of a process that runs `roles` with nothing registered, stopped or waited on yet, and no gauges of
    /// a projection: where a test, or a tool that serves the API alone, starts.
    pub fn of_roles(roles: &[&str]) -> Health {
        Health {
            roles: roles.iter().map(|role| (*role).to_owned()).collect(),
            registry: Arc::new(Registry::default()),
            projection: None,
            failures: Failures::default(),
            workers: None,
            ready: Readiness::default(),
        }
    }
}

/// What stopped in this process, said by whoever runs the roles.
#[derive(Debug, Clone, Default)]
pub struct Failures(Arc<std::sync::Mutex<Stopped>>);

#[derive(Debug, Default)]
struct Stopped {
    failing: Vec<String>,
    degraded: Vec<String>,
}

impl Failures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Stopped> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that something stopped, and why: `/healthz` fails.
    pub fn push(&self, what: impl Into<String>) {
        self.lock().failing.push(what.into());
    }

    /// Records that something stopped for one machine's resources only (an in-process agent whose driver cannot
    /// reach its root): the process still serves everything else, so `/healthz` names it under `degraded` and
    /// does not fail (restarting the process would not bring the disk back).
    pub fn push_degraded(&self, what: impl Into<String>) {
        self.lock().degraded.push(what.into());
    }

    pub fn list(&self) -> Vec<String> {
        self.lock().failing.clone()
    }

    pub fn degraded(&self) -> Vec<String> {
        self.lock().degraded.clone()
    }
}

/// The whole API: `/v1/...`, `/ui/...`, `/healthz`, `/readyz` and `/metrics`. With tokens, every `/v1/...` route
/// answers 401 to a request without a valid bearer token (a read may carry a session of the operator's view
/// instead), and every page of `/ui` but its login page asks for a session; `/healthz`, `/readyz` and `/metrics` never
/// ask for one (probes and scrapers hold no token, and they show counts and roles, not names).
pub fn router<L: Log>(api: Arc<Api<L>>, health: Health) -> Router {
    let access = api.config.tokens.clone().map(|tokens| {
        let sessions = session::Sessions::new(api.config.ui_session_ttl, api.config.ui_sessions_max);
        Arc::new(session::Access::new(tokens, sessions, api.config.behind_tls))
    });
    let api_for_ui = api.clone();
    let gate = || axum::middleware::from_fn_with_state(api.config.ready.clone(), ready::gate);
    let v1 = Router::new()
        .route("/v1/commands", post(commands::post::<L>).route_layer(gate()))
        // A static segment wins over a capture in axum's router, whatever the order: `batch` is never taken for an id.
        .route("/v1/commands/batch", post(batch::post::<L>).route_layer(gate()))
        .route("/v1/commands/{id}", get(commands::get::<L>))
        .route("/v1/resources", get(queries::resources::<L>))
        .route("/v1/resources/{reference}", get(queries::resource::<L>))
        .route("/v1/resources/{reference}/history", get(history::resource::<L>))
        .route("/v1/leases", get(queries::leases::<L>))
        .route("/v1/leases/{reference}", get(queries::lease::<L>))
        .route("/v1/leases/{reference}/history", get(history::lease::<L>))
        .route("/v1/agents", get(queries::agents::<L>))
        .route("/v1/pools", get(queries::pools::<L>))
        .route("/v1/policy", get(queries::policy::<L>))
        .route("/v1/pools/{name}", get(queries::pool_holders::<L>))
        .route("/v1/pools/{name}/{value}/history", get(history::value::<L>))
        .route("/v1/placements", get(queries::placements::<L>))
        .route("/v1/placements/{id}", get(queries::placement::<L>))
        .route("/v1/dlq", get(queries::dead_letters::<L>))
        .route("/v1/events", get(events::events::<L>))
        .route("/v1/export", get(export::export::<L>))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(api);
    let v1 = match &access {
        Some(access) => v1.route_layer(axum::middleware::from_fn_with_state(access.clone(), auth::authenticate)),
        None => v1,
    };
    let ui = ui::router(api_for_ui, health.clone(), access);
    v1.merge(ui).merge(metrics_only(health))
}

/// `/healthz`, `/readyz` and `/metrics` alone: what a process that runs no gateway role serves.
pub fn metrics_only(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(metrics::healthz))
        .route("/readyz", get(ready::readyz))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .with_state(Arc::new(health))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint: see the README for the API")
}

/// A known path with a method it does not take: the error in JSON like every other (axum's own 405 has no body).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, format!("{} does not take {method}", uri.path()))
}

/// Serves `router` on `listener` until `shutdown`; open streams of events end with it. Each connection can be closed
/// from inside a request ([`connection`]): a stream of events whose client stopped reading closes its connection.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let service = router.into_make_service_with_connect_info::<connection::Connection>();
    axum::serve(connection::Listener::new(listener), service)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

/// An error answer: `{"error": "..."}` with `status`. The message is escaped for display
/// ([`leasehold_schemas::text::escape_for_display`]): it echoes what the request said (a value that did not decode,
/// a name that is not one), and serde_json leaves C1 and bidi characters raw, so a terminal showing the body (`curl`,
/// `jq -r .error`) would act on them.
fn error(status: StatusCode, message: impl AsRef<str>) -> Response {
    let message = leasehold_schemas::text::escape_for_display(message.as_ref());
    (status, axum::Json(ErrorBody { error: &message })).into_response()
}

/// A path's one parameter; a path axum cannot decode (not UTF-8 once percent-decoded) is a 400 with a JSON error,
/// like every other, instead of axum's own plain text.
fn path_param(
    path: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<String, Response> {
    path.map(|axum::extract::Path(param)| param)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("bad path: {}", e.body_text())))
}

/// A failure of the read models or the log, as a 503 (the projection or the log may be back soon).
fn unavailable(what: &str, e: impl std::fmt::Display) -> Response {
    commands::Refusal::unavailable(what, e).into_response()
}
