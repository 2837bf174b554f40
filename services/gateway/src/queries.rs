//! The read models: resources, leases, agents, pools, dead letters.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::{LeaseQuery, Page, ResourceQuery};
use leasehold_schemas::ids::{AgentName, LeaseId, PoolName, ResourceRef};
use serde::{Deserialize, Serialize};

use crate::{Api, error, path_param, unavailable};

/// Every state a resource may be in, in the order of its life.
pub(crate) const RESOURCE_STATES: &[&str] =
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
    let parsed = match resource_ref(&reference) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    found("resource", &reference, api.reader.resource(&parsed))
}

/// `reference` read as a resource reference, `<agent>.<id>`; `Err` says why it is not one (a 400).
pub(crate) fn resource_ref(reference: &str) -> Result<ResourceRef, String> {
    reference.parse().map_err(|e| format!("{reference:?} is not a resource reference <agent>.<id>: {e}"))
}

/// The most records one page holds (`limit` above it is this).
const MAX_PAGE: usize = 10_000;

/// The query of a list (`GET /v1/resources`, `GET /v1/leases`): filters, `all`, and keyset paging (`after`, `limit`).
/// `attr` may be given several times (`attr=team=ci&attr=zone=a`): every one must match.
#[derive(Debug, Default)]
pub(crate) struct ListQuery {
    /// The query as given, in order: what the link to the next page carries.
    pairs: Vec<(String, String)>,
    pub(crate) agent: Option<String>,
    pub(crate) state: Option<String>,
    pub(crate) kind: Option<String>,
    resource: Option<String>,
    pub(crate) holder: Option<String>,
    pub(crate) attrs: Vec<(String, String)>,
    pub(crate) all: bool,
    pub(crate) after: Option<String>,
    pub(crate) limit: Option<usize>,
}

impl ListQuery {
    /// Reads `pairs`, taking only the names in `allowed` (anything else is a 400, as an unknown field is elsewhere);
    /// `Err` says what is wrong.
    fn parse(pairs: Vec<(String, String)>, allowed: &[&str]) -> Result<ListQuery, String> {
        let bad = |message: String| format!("bad query: {message}");
        let mut query = ListQuery::default();
        for (name, value) in &pairs {
            if !allowed.contains(&name.as_str()) {
                return Err(bad(format!("unknown parameter \"{name}\"; this list takes {}", allowed.join(", "))));
            }
            let once = |slot: &mut Option<String>| {
                if slot.replace(value.clone()).is_some() {
                    return Err(bad(format!("{name} is given twice")));
                }
                Ok(())
            };
            match name.as_str() {
                "agent" => once(&mut query.agent)?,
                "state" => once(&mut query.state)?,
                "kind" => once(&mut query.kind)?,
                "resource" => once(&mut query.resource)?,
                "holder" => once(&mut query.holder)?,
                "after" => once(&mut query.after)?,
                "attr" => match value.split_once('=') {
                    Some((key, attr)) if !key.is_empty() => query.attrs.push((key.to_owned(), attr.to_owned())),
                    _ => return Err(bad(format!("attr \"{value}\" is not name=value"))),
                },
                "all" => {
                    query.all = match value.as_str() {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => return Err(bad(format!("all \"{other}\" is not true or false"))),
                    }
                }
                "limit" => match value.parse::<usize>() {
                    Ok(0) | Err(_) => return Err(bad(format!("limit \"{value}\" is not a positive number"))),
                    Ok(limit) => query.limit = Some(limit.min(MAX_PAGE)),
                },
                _ => unreachable!("only allowed names get here"),
            }
        }
        query.pairs = pairs;
        Ok(query)
    }

    /// Terminal records that ended before this log time are left out: `shown_for` (an hour by default) before now
    /// by this process's clock, unless `all` is given.
    fn ended_before(&self, shown_for: Duration) -> Option<u64> {
        if self.all {
            return None;
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let shown_for = u64::try_from(shown_for.as_millis()).unwrap_or(u64::MAX);
        Some(u64::try_from(now).unwrap_or(u64::MAX).saturating_sub(shown_for))
    }

    /// A page as the answer: a JSON array, and when the page is full, `Link: <path?...&after=NEXT>; rel="next"` (the
    /// same query from the key after the last record).
    fn answer<T: Serialize>(&self, path: &str, page: Result<Page<T>, leasehold_projector::Error>) -> Response {
        let page = match page {
            Ok(page) => page,
            Err(e) => return unavailable("the projection cannot be read", e),
        };
        let mut response = Json(page.records).into_response();
        if let Some(next) = page.next {
            let link = format!("<{path}?{}>; rel=\"next\"", self.query_after(Some(&next)));
            if let Ok(value) = axum::http::HeaderValue::from_str(&link) {
                response.headers_mut().insert(axum::http::header::LINK, value);
            }
        }
        response
    }

    /// The query string of the same list from `after` on (`None`: from its start): every pair as given but
    /// `after`, each percent-encoded, then `after`. What the link to the next page carries.
    pub(crate) fn query_after(&self, after: Option<&str>) -> String {
        let mut query: Vec<String> = self
            .pairs
            .iter()
            .filter(|(name, _)| name != "after")
            .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
            .collect();
        query.extend(after.map(|after| format!("after={}", encode(after))));
        query.join("&")
    }
}

/// `text` percent-encoded for a query string or a path segment (every byte but the unreserved ones of RFC 3986):
/// the API's links and the operator's view's.
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `GET /v1/resources?agent=&state=&kind=&attr=k=v&holder=&all=&after=&limit=`
pub(crate) async fn resources<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Query(pairs) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    match resource_list(pairs, api.config.list_ended_for) {
        Ok(ResourceList { query, filters }) => query.answer("/v1/resources", api.reader.resources_page(&filters)),
        Err(message) => error(StatusCode::BAD_REQUEST, message),
    }
}

/// A list of resources as asked for: the query (whose pairs the link to the next page carries) and the read
/// model's filters it makes.
#[derive(Debug)]
pub(crate) struct ResourceList {
    pub(crate) query: ListQuery,
    pub(crate) filters: ResourceQuery,
}

/// Reads and checks `pairs` as `GET /v1/resources` takes them (`agent`, `state`, `kind`, `attr`, `holder`, `all`,
/// `after`, `limit`): records that ended more than `ended_for` ago are left out unless `all` is given. `Err` says
/// what is wrong with the query (a 400).
pub(crate) fn resource_list(pairs: Vec<(String, String)>, ended_for: Duration) -> Result<ResourceList, String> {
    let query = ListQuery::parse(pairs, &["agent", "state", "kind", "attr", "holder", "all", "after", "limit"])?;
    if let Some(agent) = &query.agent
        && let Err(e) = AgentName::new(agent.as_str())
    {
        return Err(format!("bad query: agent: {e}"));
    }
    if let Some(state) = &query.state
        && !RESOURCE_STATES.contains(&state.as_str())
    {
        return Err(format!("bad query: state {state:?} is not one of {}", RESOURCE_STATES.join(", ")));
    }
    let filters = ResourceQuery {
        agent: query.agent.clone(),
        state: query.state.clone(),
        kind: query.kind.clone(),
        attrs: query.attrs.clone(),
        holder: query.holder.clone(),
        ended_before: query.ended_before(ended_for),
        after: query.after.clone(),
        limit: query.limit,
    };
    Ok(ResourceList { query, filters })
}

/// `GET /v1/leases?resource=&holder=&attr=k=v&all=&after=&limit=`
pub(crate) async fn leases<L: Log>(
    State(api): State<Arc<Api<L>>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Query(pairs) = match query {
        Ok(query) => query,
        Err(e) => return bad_query(e),
    };
    let query = match ListQuery::parse(pairs, &["resource", "holder", "attr", "all", "after", "limit"]) {
        Ok(query) => query,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let resource = match &query.resource {
        None => None,
        Some(reference) => match reference.parse::<ResourceRef>() {
            Ok(parsed) => Some(parsed.to_string()),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: resource {reference:?}: {e}")),
        },
    };
    let filters = LeaseQuery {
        resource,
        holder: query.holder.clone(),
        attrs: query.attrs.clone(),
        ended_before: query.ended_before(api.config.list_ended_for),
        after: query.after.clone(),
        limit: query.limit,
    };
    query.answer("/v1/leases", api.reader.leases_page(&filters))
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
    if let Err(message) = check_lease_ref(&reference) {
        return error(StatusCode::BAD_REQUEST, message);
    }
    found("lease", &reference, api.reader.lease(&reference))
}

/// Whether `reference` is a lease reference, `<agent>.<lease id>`; `Err` says why not (a 400).
pub(crate) fn check_lease_ref(reference: &str) -> Result<(), String> {
    reference
        .split_once('.')
        .ok_or_else(|| "no '.' between the agent and the lease id".to_owned())
        .and_then(|(agent, lease)| {
            AgentName::new(agent).map_err(|e| e.to_string())?;
            lease.parse::<LeaseId>().map(|_| ()).map_err(|e| e.to_string())
        })
        .map_err(|e| format!("{reference:?} is not a lease reference <agent>.<lease id>: {e}"))
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
