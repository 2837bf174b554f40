//! A thing's history from the projection's timeline index: `GET /v1/resources/{ref}/history`,
//! `/v1/leases/{ref}/history`, `/v1/pools/{name}/{value}/history`, and the timeline of the pages.
//!
//! The rows are `leasehold-replay history`'s ([`timeline::Row`]: the same steps by the same rule, the same fields)
//! without the state after each step, which only a fold of the log gives. A row's correlation id is read from the
//! command in the log, as replay reads it: none once the log no longer holds the command.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use leasehold_log::Log;
use leasehold_projector::timeline::{self, Row, Thing};
use leasehold_projector::{At, History};
use leasehold_schemas::codec;
use leasehold_schemas::ids::{LeaseId, PoolName};

use crate::{Api, error, unavailable};

/// The steps a page holds when the request names no `limit`.
pub(crate) const DEFAULT_LIMIT: usize = 1000;
/// The most steps a page holds.
const MAX_LIMIT: usize = 10_000;
/// Commands read from the log at once (for their correlation ids): on JetStream each is a round trip.
const COMMAND_READS: usize = 16;

/// One step of a page, with what a page shows beside its row.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) row: Row,
    /// The log time of the command (unix ms): the row's `time`.
    pub(crate) at: u64,
    /// A confirmation that changed nothing worth reading alone ([`timeline::routine`]).
    pub(crate) routine: bool,
}

/// A page of a thing's history, oldest first, and where the pages beside it start.
#[derive(Debug, Clone)]
pub(crate) struct Steps {
    pub(crate) steps: Vec<Step>,
    /// Steps come before this page: ask `before=` this.
    pub(crate) older: Option<u64>,
    /// Steps come after this page: ask `after=` this.
    pub(crate) newer: Option<u64>,
}

/// Why a page could not be read.
#[derive(Debug)]
pub(crate) enum Unreadable {
    Projection(leasehold_projector::Error),
    Log(leasehold_log::Error),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Projection(e) => write!(f, "the projection cannot be read: {e}"),
            Unreadable::Log(e) => write!(f, "the log cannot be read: {e}"),
        }
    }
}

/// A page of `thing`'s history: its rows from the timeline index, with the correlation ids of their commands.
pub(crate) async fn steps<L: Log>(api: &Api<L>, thing: &Thing, at: At, limit: usize) -> Result<Steps, Unreadable> {
    let History { entries, older, newer } = api.reader.history(thing, at, limit).map_err(Unreadable::Projection)?;
    let mut wanted: Vec<u64> = entries.iter().map(|e| e.outcome.cmd_seq).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let read: Vec<_> = futures::stream::iter(wanted.iter().copied())
        .map(|seq| api.log.command_at(seq))
        .buffered(COMMAND_READS)
        .collect()
        .await;
    let mut correlations = std::collections::BTreeMap::new();
    for (seq, command) in wanted.into_iter().zip(read) {
        let correlation = command
            .map_err(Unreadable::Log)?
            .and_then(|c| codec::decode_command(&c.payload).ok())
            .and_then(|envelope| envelope.correlation_id)
            .map(|id| id.to_string());
        correlations.insert(seq, correlation);
    }
    let steps = entries
        .iter()
        .map(|entry| Step {
            row: Row::new(
                entry.seq,
                &entry.outcome,
                &entry.effects,
                correlations.get(&entry.outcome.cmd_seq).cloned().flatten(),
            ),
            at: entry.outcome.log_time.0,
            routine: timeline::routine(&entry.outcome, &entry.effects),
        })
        .collect();
    Ok(Steps { steps, older, newer })
}

/// `?after=SEQ` (the steps after it), `?before=SEQ` (the nearest steps before it), `?limit=N`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    pub(crate) after: Option<u64>,
    pub(crate) before: Option<u64>,
    pub(crate) limit: Option<usize>,
}

impl PageQuery {
    /// Where the page starts, and how long it is; `first`: where a query naming neither end starts.
    pub(crate) fn at(&self, first: At) -> Result<(At, usize), String> {
        let at = match (self.after, self.before) {
            (Some(_), Some(_)) => return Err("give after or before, not both".to_owned()),
            (Some(after), None) => At::After(after),
            (None, Some(before)) => At::Before(before),
            (None, None) => first,
        };
        let limit = match self.limit {
            Some(0) => return Err("limit must be a positive number".to_owned()),
            Some(limit) => limit.min(MAX_LIMIT),
            None => DEFAULT_LIMIT,
        };
        Ok((at, limit))
    }
}

/// A thing's page as the API's answer: a JSON array of rows, with `Link` naming the pages beside it (`rel="next"`:
/// the newer steps, `rel="prev"`: the older ones), limit kept.
async fn answer<L: Log>(api: &Api<L>, path: &str, thing: &Thing, query: &PageQuery) -> Response {
    let (at, limit) = match query.at(At::First) {
        Ok(at) => at,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {e}")),
    };
    let page = match steps(api, thing, at, limit).await {
        Ok(page) => page,
        Err(e) => return unavailable("the history cannot be read", e),
    };
    let rows: Vec<&Row> = page.steps.iter().map(|s| &s.row).collect();
    let mut response = Json(rows).into_response();
    let limit = query.limit.map(|n| format!("&limit={n}")).unwrap_or_default();
    let mut links = Vec::new();
    if let Some(newer) = page.newer {
        links.push(format!("<{path}?after={newer}{limit}>; rel=\"next\""));
    }
    if let Some(older) = page.older {
        links.push(format!("<{path}?before={older}{limit}>; rel=\"prev\""));
    }
    if !links.is_empty()
        && let Ok(value) = axum::http::HeaderValue::from_str(&links.join(", "))
    {
        response.headers_mut().insert(axum::http::header::LINK, value);
    }
    response
}

fn bad_query(e: QueryRejection) -> Response {
    error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text()))
}

/// A resource's reference (`<agent>.<id>`) as the thing its history is kept for.
pub(crate) fn resource_thing(reference: &str) -> Result<Thing, String> {
    crate::queries::resource_ref(reference).map(|r| Thing::Resource(r.resource))
}

/// A lease's reference (`<agent>.<lease id>`) as the thing its history is kept for.
pub(crate) fn lease_thing(reference: &str) -> Result<Thing, String> {
    crate::queries::check_lease_ref(reference)?;
    let (_, lease) = reference.split_once('.').ok_or_else(|| format!("{reference:?}: no lease id"))?;
    lease.parse::<LeaseId>().map(Thing::Lease).map_err(|e| format!("{reference:?}: {e}"))
}

/// `GET /v1/resources/{ref}/history?after=&before=&limit=`
pub(crate) async fn resource<L: Log>(
    State(api): State<Arc<Api<L>>>,
    reference: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    by_reference(&api, reference, query, "resources", resource_thing).await
}

/// `GET /v1/leases/{ref}/history?after=&before=&limit=`
pub(crate) async fn lease<L: Log>(
    State(api): State<Arc<Api<L>>>,
    reference: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    by_reference(&api, reference, query, "leases", lease_thing).await
}

/// The history of the thing `reference` names in `/v1/<collection>/{ref}/history`, read as `thing_of` reads it.
async fn by_reference<L: Log>(
    api: &Api<L>,
    reference: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
    collection: &str,
    thing_of: fn(&str) -> Result<Thing, String>,
) -> Response {
    let reference = match crate::path_param(reference) {
        Ok(reference) => reference,
        Err(response) => return response,
    };
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    match thing_of(&reference) {
        Ok(thing) => answer(api, &format!("/v1/{collection}/{reference}/history"), &thing, &query).await,
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// `GET /v1/pools/{name}/{value}/history?after=&before=&limit=`: `value` as the pool shows it (`10.0.0.7`,
/// `slot 3`, `port 8080`), or a bare number for a pool of slots or ports.
pub(crate) async fn value<L: Log>(
    State(api): State<Arc<Api<L>>>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let (name, text) = match path {
        Ok(Path(path)) => path,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad path: {}", e.body_text())),
    };
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    let pool = match PoolName::new(name.as_str()) {
        Ok(pool) => pool,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{name:?} is not a pool name: {e}")),
    };
    let kind = match api.reader.pools() {
        Ok(pools) => pools
            .into_iter()
            .find(|p| p.name == name)
            .and_then(|p| serde_json::from_value::<leasehold_schemas::pool::PoolKind>(p.kind).ok()),
        Err(e) => return unavailable("the projection cannot be read", e),
    };
    let value = match timeline::parse_value(&text, kind.as_ref()) {
        Ok(value) => value,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let path = format!("/v1/pools/{name}/{}/history", crate::queries::encode(&value.to_string()));
    answer(&api, &path, &Thing::Value(pool, value), &query).await
}
