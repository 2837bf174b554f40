//! `GET /v1/events?key=&from=`: outcomes as server-sent events, in log order, from a sequence, following — the feed a
//! producer in another language reads to learn its lease token, or an operator to watch an agent.
//!
//! The stream opens with `event: open`, `id: <from - 1>`, `data: {"from": N}`: where it starts, so that a client
//! that reconnects before any outcome came (`Last-Event-ID`) misses none decided in between. Then each event is
//! `event: outcome`, `id: <seq>`, `data: {"seq": N, "outcome": {...}}`. A client that reconnects with
//! `Last-Event-ID` resumes after it. An error (the log gone, an outcome that cannot be read) is one `event: error`
//! whose data is `{"error": "..."}`, and the stream ends.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::codec;
use leasehold_schemas::ids::Key;
use leasehold_schemas::subjects::partition_of_key;
use serde::Deserialize;

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
            Some(next) => next,
            None => return error(StatusCode::BAD_REQUEST, format!("Last-Event-ID {last} is no outcome sequence")),
        },
        (None, Some(from)) => from.max(1),
        (None, None) => {
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
        }
    };
    let feed = api.log.follow(filter, from);
    let shutdown = api.shutdown.clone();
    let open =
        Event::default().event("open").id((from - 1).to_string()).data(serde_json::json!({ "from": from }).to_string());
    let stream = futures::stream::unfold(Some(feed), |feed| async move {
        let mut feed: BoxStream<'static, _> = feed?;
        match feed.next().await {
            Some(Ok(stored)) => match event(&stored) {
                Ok(event) => Some((Ok::<_, Infallible>(event), Some(feed))),
                Err(e) => Some((Ok(error_event(&e)), None)),
            },
            Some(Err(e)) => Some((Ok(error_event(&e.to_string())), None)),
            None => None,
        }
    })
    .take_until(async move { shutdown.cancelled().await });
    let stream = futures::stream::once(async move { Ok::<_, Infallible>(open) }).chain(stream);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

fn event(stored: &StoredOutcome) -> Result<Event, String> {
    let outcome = codec::decode_outcome(&stored.payload)
        .map_err(|e| format!("the outcome at {} cannot be read: {e}", stored.seq))?;
    let data = serde_json::json!({ "seq": stored.seq, "outcome": outcome });
    Ok(Event::default().event("outcome").id(stored.seq.to_string()).data(data.to_string()))
}

/// `{"error": ...}` as the stream's last event, its message escaped for display as [`crate::error`]'s are.
fn error_event(message: &str) -> Event {
    let message = leasehold_schemas::text::escape_for_display(message);
    Event::default().event("error").data(serde_json::json!({ "error": message }).to_string())
}
