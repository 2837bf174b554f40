//! The read models: resources, leases, agents, pools, dead letters.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::ResourceQuery;
use leasehold_schemas::ids::{AgentName, LeaseId, PoolName, ResourceRef};
use serde::{Deserialize, Serialize};

use crate::{Api, error, path_param, unavailable};

const RESOURCE_STATES: &[&str] =
    &["pending", "active", "paused", "suspect", "releasing", "destroyed", "lost", "orphaned", "failed"];

fn found<T: Serialize>(what: &str, name: &str, value: Result<Option<T>, leasehold_projector::Error>) -> Response {
    match value {
        Ok(Some(value)) => Json(value).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no {what} {name}")),
        Err(e) => unavailable("the projection cannot be read", e),
    }
}

fn all<T: Serialize>(value: Result<Vec<T>, leasehold_projector::Error>) -> Response {
    match value {
        Ok(value) => Json(value).into_response(),
        Err(e) => unavailable("the projection cannot be read", e),
    }
}

fn bad_query(e: QueryRejection) -> Response {
    error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text()))
}

pub(crate) async fn resource<L: Log>(
    State(api): State<Arc<Api<L>>>,
    reference: Result<Path<String>, PathRejection>,
) -> Response {
    let reference = match path_param(reference) {
        Ok(reference) => reference,
        Err(response) => return response,
    };
    let parsed: ResourceRef = match reference.parse() {
        Ok(parsed) => parsed,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{reference:?} is not a resource reference <agent>.<id>: {e}"),
            );
        }
    };
    found("resource", &reference, api.reader.resource(&parsed))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResourcesQuery {
    agent: Option<String>,
    state: Option<String>,
    kind: Option<String>,
}

pub(crate) async fn resources<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<ResourcesQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    if let Some(agent) = &query.agent
        && let Err(e) = AgentName::new(agent.as_str())
    {
        return error(StatusCode::BAD_REQUEST, format!("bad query: agent: {e}"));
    }
    if let Some(state) = &query.state
        && !RESOURCE_STATES.contains(&state.as_str())
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!("bad query: state {state:?} is not one of {}", RESOURCE_STATES.join(", ")),
        );
    }
    all(api.reader.resources(&ResourceQuery { agent: query.agent, state: query.state, kind: query.kind }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeasesQuery {
    resource: Option<String>,
}

pub(crate) async fn leases<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<LeasesQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    match query.resource {
        None => all(api.reader.leases()),
        Some(reference) => match reference.parse::<ResourceRef>() {
            Ok(parsed) => all(api.reader.leases_of(&parsed.to_string())),
            Err(e) => error(StatusCode::BAD_REQUEST, format!("bad query: resource {reference:?}: {e}")),
        },
    }
}

/// A lease by its reference, `<agent>.<lease id>`.
pub(crate) async fn lease<L: Log>(
    State(api): State<Arc<Api<L>>>,
    reference: Result<Path<String>, PathRejection>,
) -> Response {
    let reference = match path_param(reference) {
        Ok(reference) => reference,
        Err(response) => return response,
    };
    let parsed = reference
        .split_once('.')
        .ok_or_else(|| "no '.' between the agent and the lease id".to_owned())
        .and_then(|(agent, lease)| {
            AgentName::new(agent).map_err(|e| e.to_string())?;
            lease.parse::<LeaseId>().map_err(|e| e.to_string())
        });
    if let Err(e) = parsed {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{reference:?} is not a lease reference <agent>.<lease id>: {e}"),
        );
    }
    found("lease", &reference, api.reader.lease(&reference))
}

pub(crate) async fn agents<L: Log>(State(api): State<Arc<Api<L>>>) -> Response {
    all(api.reader.agents())
}

/// `GET /v1/policy`: the cluster policy of every partition, with the key that routes its settings.
pub(crate) async fn policy<L: Log>(State(api): State<Arc<Api<L>>>) -> Response {
    all(api.reader.policies())
}

/// The pools, each as of now by this process's clock: a record changes only when its pool's outcomes do, and
/// `cooling` counts only the cool-downs not ended yet.
pub(crate) async fn pools<L: Log>(State(api): State<Arc<Api<L>>>) -> Response {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let now = u64::try_from(now).unwrap_or(u64::MAX);
    all(api.reader.pools().map(|pools| pools.into_iter().map(|pool| pool.at(now)).collect::<Vec<_>>()))
}

/// Who holds each identifier of a pool.
pub(crate) async fn pool_holders<L: Log>(
    State(api): State<Arc<Api<L>>>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let name = match path_param(name) {
        Ok(name) => name,
        Err(response) => return response,
    };
    if let Err(e) = PoolName::new(name.as_str()) {
        return error(StatusCode::BAD_REQUEST, format!("{name:?} is not a pool name: {e}"));
    }
    match api.reader.pools() {
        Ok(pools) if pools.iter().any(|p| p.name == name) => all(api.reader.holders(&name)),
        Ok(_) => error(StatusCode::NOT_FOUND, format!("no pool {name}")),
        Err(e) => unavailable("the projection cannot be read", e),
    }
}

/// Every placement the partitions keep (open ones, and ended ones until the outcome horizon), by resource id.
pub(crate) async fn placements<L: Log>(State(api): State<Arc<Api<L>>>) -> Response {
    all(api.reader.placements())
}

/// One placement: where it went, or what it waits on, or why it was refused.
pub(crate) async fn placement<L: Log>(
    State(api): State<Arc<Api<L>>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_param(id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    let id = match id.strip_prefix('~').unwrap_or(&id).parse::<leasehold_schemas::ResourceId>() {
        Ok(id) => id.to_string(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{id:?} is not a resource id: {e}")),
    };
    match api.reader.placement(&id) {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no placement of {id} is known")),
        Err(e) => unavailable("the projection cannot be read", e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadQuery {
    from: Option<u64>,
    limit: Option<usize>,
}

/// Dead letters, oldest first (`?from=SEQ&limit=N`, at most 1000 at once).
pub(crate) async fn dead_letters<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<DeadQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    let limit = query.limit.unwrap_or(1000).min(1000);
    match api.dead.list(&api.log, query.from.unwrap_or(1), limit).await {
        Ok(list) => Json(list).into_response(),
        Err(e) => unavailable("the dead letters cannot be read", e),
    }
}
