//! `GET /v1/events?key=&from=`: outcomes as server-sent events, in log order, from a sequence, following — the feed a
//! producer in another language reads to learn its lease token, or an operator to watch an agent.
//!
//! The stream opens with `event: open`, `id: <from - 1>`, `data: {"from": N}`: where it starts, so that a client
//! that reconnects before any outcome came (`Last-Event-ID`) misses none decided in between. Then each event is
//! `event: outcome`, `id: <seq>`, `data: {"seq": N, "outcome": {...}, "about": {...}}` (`about`: what the outcome
//! is about, to link to, see [`About`]). A client that reconnects with
//! `Last-Event-ID` resumes after it. An error (the log gone, an outcome that cannot be read) is one `event: error`
//! whose data is `{"error": "..."}`, and the stream ends.
//!
//! Streams are bounded: at most [`crate::GatewayConfig::events_max_streams`] at once (one more is answered 503 with
//! `Retry-After`). Each is a task that follows the log and hands events to the response through a bounded channel;
//! a client that reads nothing for [`crate::GatewayConfig::events_stall_timeout`] while that channel is full (its
//! connection's buffers full before it) is dropped: its stream ends and its connection is closed
//! ([`crate::connection`]), so that it holds no place, memory or follow of the log, and the drop is counted
//! ([`EventsMetrics`]). It resumes, when it comes back, from the last event it got (`Last-Event-ID`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::codec;
use leasehold_schemas::ids::Key;
use leasehold_schemas::subjects::partition_of_key;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::{self, error::SendTimeoutError};
use tokio_util::sync::CancellationToken;

use crate::connection::Connection;
use crate::session::SessionEnd;
use crate::{Api, error, unavailable};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    /// An agent name, or `@pool`; none: every outcome.
    key: Option<String>,
    /// The first outcome sequence to send; none: only outcomes from now on.
    from: Option<u64>,
}

/// The key of a query: `w1` is an agent, `@ips` a pool.
/// An agent (`w1`), a pool (`@ips`) or a placement (`~<resource id>`).
fn parse_key(text: &str) -> Result<Key, String> {
    text.parse::<Key>().map_err(|e| e.to_string())
}

pub(crate) async fn events<L: Log>(
    State(api): State<Arc<Api<L>>>,
    connection: Option<Extension<ConnectInfo<Connection>>>,
    session: Option<Extension<SessionEnd>>,
    query: Result<Query<EventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    let filter = match &query.key {
        None => OutcomeFilter::All,
        Some(text) => match parse_key(text) {
            Ok(key) => OutcomeFilter::Key { partition: partition_of_key(&key, api.log.partitions()), key: key.token() },
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: key {text:?}: {e}")),
        },
    };
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    let from = match (resume, query.from) {
        (Some(last), _) => match last.checked_add(1) {
            Some(next) => Some(next),
            None => return error(StatusCode::BAD_REQUEST, format!("Last-Event-ID {last} is no outcome sequence")),
        },
        (None, Some(from)) => Some(from.max(1)),
        // From now on: where "now" is is read once the stream has its place.
        (None, None) => None,
    };
    // A stream holds a task and a follow of the log for as long as its client stays: their number is bounded.
    let metrics = api.config.events_metrics.clone();
    let Ok(permit) = api.event_streams.clone().try_acquire_owned() else {
        metrics.refused.inc();
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the gateway already serves {} streams of events, its most (serve --events-max-streams): retry in a \
                 few seconds, resuming with Last-Event-ID",
                api.config.events_max_streams
            ),
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
        return response;
    };
    let from = if let Some(from) = from {
        from
    } else {
        let last = match &filter {
            OutcomeFilter::Key { partition, .. } | OutcomeFilter::Partition(partition) => {
                api.log.last_outcome_seq(*partition).await
            }
            OutcomeFilter::All => api.reader.applied().map_err(|e| leasehold_log::Error::Storage(e.to_string())),
        };
        match last {
            Ok(last) => last + 1,
            Err(e) => return unavailable("the log cannot be read", e),
        }
    };
    let feed = api.log.follow(filter, from);
    let (sender, receiver) = mpsc::channel(api.config.events_buffer.max(1));
    let open_stream = OpenStream::new(permit, metrics);
    let cut = connection.map(|Extension(ConnectInfo(connection))| connection);
    let session = session.map(|Extension(end)| end);
    let stall = api.config.events_stall_timeout;
    tokio::spawn(follow(feed, sender, open_stream, stall, cut, session, api.shutdown.clone()));
    let shutdown = api.shutdown.clone();
    let open =
        Event::default().event("open").id((from - 1).to_string()).data(serde_json::json!({ "from": from }).to_string());
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        let event = receiver.recv().await?;
        Some((Ok::<_, Infallible>(event), receiver))
    })
    .take_until(async move { shutdown.cancelled().await });
    let stream = futures::stream::once(async move { Ok::<_, Infallible>(open) }).chain(stream);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// How long a client refused for too many streams is asked to wait.
const RETRY_AFTER_SECONDS: &str = "5";

/// Moves the outcomes of `feed` to `sender` (the response's end) until the client goes, the log fails, the session
/// of the operator's view it was opened under ends (logout, expiry: a last `event: error` says so), or `shutdown`.
/// A client that takes none for `stall` while every place between is full is not reading: its stream
/// ends, its connection (when known) is cut, and the drop is counted.
async fn follow(
    mut feed: BoxStream<'static, Result<StoredOutcome, leasehold_log::Error>>,
    sender: mpsc::Sender<Event>,
    open_stream: OpenStream,
    stall: Duration,
    connection: Option<Connection>,
    session: Option<SessionEnd>,
    shutdown: CancellationToken,
) {
    let session_over = async {
        match &session {
            Some(end) => end.over().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(session_over);
    loop {
        let next = tokio::select! {
            next = feed.next() => next,
            () = sender.closed() => return,
            () = shutdown.cancelled() => return,
            () = &mut session_over => {
                // Said if there is room for it; the stream ends either way, and a reconnect meets the login.
                let _ = sender.try_send(error_event("the session ended (logged out or expired): log in again"));
                return;
            }
        };
        let (event, last) = match next {
            Some(Ok(stored)) => match event(&stored) {
                Ok(event) => (event, false),
                Err(e) => (error_event(&e), true),
            },
            Some(Err(e)) => (error_event(&e.to_string()), true),
            None => return,
        };
        let sent = tokio::select! {
            sent = sender.send_timeout(event, stall) => sent,
            () = shutdown.cancelled() => return,
            () = &mut session_over => return,
        };
        match sent {
            Ok(()) if !last => {}
            Ok(()) | Err(SendTimeoutError::Closed(_)) => return,
            Err(SendTimeoutError::Timeout(_)) => {
                open_stream.metrics.dropped.inc();
                tracing::info!(
                    peer = connection.as_ref().map(|c| c.peer.to_string()),
                    waited = %humantime::format_duration(stall),
                    "ended a stream of events whose client was not reading; it resumes with Last-Event-ID"
                );
                if let Some(connection) = &connection {
                    connection.cut.cancel();
                }
                return;
            }
        }
    }
}

/// A stream of events counted open: its place among [`crate::GatewayConfig::events_max_streams`] and the gauge,
/// both given back when it ends.
struct OpenStream {
    _permit: OwnedSemaphorePermit,
    metrics: EventsMetrics,
}

impl OpenStream {
    fn new(permit: OwnedSemaphorePermit, metrics: EventsMetrics) -> Self {
        metrics.streams.inc();
        OpenStream { _permit: permit, metrics }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.metrics.streams.dec();
    }
}

/// The counts of the streams of events: how many are open, how many were refused for being one too many, and how
/// many were ended because their client did not read.
#[derive(Debug, Clone, Default)]
pub struct EventsMetrics {
    streams: Gauge,
    refused: Counter,
    dropped: Counter,
}

impl EventsMetrics {
    /// The counts, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = EventsMetrics::default();
        registry.register("leasehold_event_streams", "Streams of GET /v1/events open now", metrics.streams.clone());
        registry.register(
            "leasehold_event_streams_refused",
            "Streams of GET /v1/events refused (503) because --events-max-streams were open",
            metrics.refused.clone(),
        );
        registry.register(
            "leasehold_event_streams_dropped",
            "Streams of GET /v1/events ended because their client did not read for --events-stall-timeout",
            metrics.dropped.clone(),
        );
        metrics
    }

    /// Streams open now.
    pub fn streams(&self) -> i64 {
        self.streams.get()
    }

    /// Streams refused so far for being one too many.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Streams ended so far because their client did not read.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

fn event(stored: &StoredOutcome) -> Result<Event, String> {
    let outcome = codec::decode_outcome(&stored.payload)
        .map_err(|e| format!("the outcome at {} cannot be read: {e}", stored.seq))?;
    let data = serde_json::json!({ "seq": stored.seq, "about": About::of(&outcome), "outcome": outcome });
    Ok(Event::default().event("outcome").id(stored.seq.to_string()).data(data.to_string()))
}

/// The most things of each sort [`About`] names.
pub(crate) const ABOUT_MAX: usize = 20;

/// What an outcome is about, named as the API names each (to link to): the agent or pool of its key, and the
/// resources (`<agent>.<id>`), leases (`<agent>.<lease id>`) and pools its effects mention
/// ([`leasehold_schemas::mentions::Mentions`]). At most [`ABOUT_MAX`] of each sort; `more` counts the others (a
/// report may mention thousands of resources). The live feed's lines, on the page and in its script, are made from
/// it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct About {
    pub(crate) agents: Vec<String>,
    pub(crate) pools: Vec<String>,
    pub(crate) resources: Vec<String>,
    pub(crate) leases: Vec<String>,
    pub(crate) more: usize,
}

impl About {
    pub(crate) fn of(outcome: &leasehold_schemas::Outcome) -> About {
        let mut about = About::default();
        let mut seen = std::collections::HashSet::new();
        let mut add = |list: &mut Vec<String>, more: &mut usize, sort: &'static str, name: String| {
            if seen.insert((sort, name.clone())) {
                if list.len() < ABOUT_MAX { list.push(name) } else { *more += 1 }
            }
        };
        // The resources and leases an agent's effects name by id are that agent's.
        let agent = match &outcome.command.key {
            Key::Agent(agent) => {
                add(&mut about.agents, &mut about.more, "agent", agent.to_string());
                Some(agent)
            }
            Key::Pool(pool) => {
                add(&mut about.pools, &mut about.more, "pool", pool.to_string());
                None
            }
            Key::Placement(_) => None,
        };
        for effect in outcome.effects() {
            let m = leasehold_schemas::mentions::Mentions::of(effect);
            if let Some(agent) = agent {
                for id in &m.resources {
                    add(&mut about.resources, &mut about.more, "resource", format!("{agent}.{id}"));
                }
                for id in &m.leases {
                    add(&mut about.leases, &mut about.more, "lease", format!("{agent}.{id}"));
                }
            }
            if !m.elsewhere.is_empty() {
                // Named there by id only: the effect itself names each by reference.
                let mut refs = Vec::new();
                references_in(&serde_json::to_value(effect).unwrap_or_default(), &mut refs);
                for reference in refs.into_iter().filter(|r| m.elsewhere.contains(&r.resource)) {
                    add(&mut about.resources, &mut about.more, "resource", reference.to_string());
                }
            }
            for pool in &m.pools {
                add(&mut about.pools, &mut about.more, "pool", pool.to_string());
            }
        }
        about
    }
}

/// Every text in `value` that is a resource reference (`<agent>.<id>`), in order.
fn references_in(value: &serde_json::Value, out: &mut Vec<leasehold_schemas::ResourceRef>) {
    match value {
        serde_json::Value::String(text) => out.extend(text.parse().ok()),
        serde_json::Value::Array(items) => items.iter().for_each(|item| references_in(item, out)),
        serde_json::Value::Object(fields) => fields.values().for_each(|field| references_in(field, out)),
        _ => {}
    }
}

/// `{"error": ...}` as the stream's last event, its message escaped for display as [`crate::error`]'s are.
fn error_event(message: &str) -> Event {
    let message = leasehold_schemas::text::escape_for_display(message);
    Event::default().event("error").data(serde_json::json!({ "error": message }).to_string())
}
