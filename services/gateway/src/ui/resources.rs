//! `GET /ui/resources`: resources filtered as `GET /v1/resources` filters them (agent, state, kind, attributes,
//! holder, `all`), a page at a time by key (`after`), with what each waits on and how long it has been stuck.
//!
//! A page reads only its own records (from its key on, in the index of the agent or state asked for) and the records
//! of the agents it shows, so it costs the same at the first page of ten resources and deep in 100,000.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::views::{AgentView, ResourceView, WaitingOn};
use maud::{Markup, html};

use super::parts::{attributes, bad_request, state, stuck_badge};
use super::{Page, Ui, bdi, link, now_ms, page, timestamp, unavailable};
use crate::queries::{ListQuery, RESOURCE_STATES, ResourceList, resource_list};

/// Resources per page unless `limit` asks for fewer or more.
const PAGE: usize = 100;

/// The most resources one page shows (a `limit` above it is this).
const MAX_PAGE: usize = 1_000;

pub(crate) async fn get<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Query(pairs) = match query {
        Ok(query) => query,
        Err(e) => return bad_request(&format!("bad query: {}", e.body_text())),
    };
    // The form sends every field, empty ones too: an empty field is no filter.
    let pairs = pairs.into_iter().filter(|(_, value)| !value.is_empty()).collect();
    let ResourceList { query, mut filters } = match resource_list(pairs, ui.api.config.list_ended_for) {
        Ok(list) => list,
        Err(message) => return bad_request(&message),
    };
    filters.limit = Some(filters.limit.unwrap_or(PAGE).min(MAX_PAGE));
    let reader = &ui.api.reader;
    let listed = match reader.resources_page(&filters) {
        Ok(listed) => listed,
        Err(e) => return unavailable(e),
    };
    let agents = match reader.agents_named(listed.records.iter().map(|r| r.agent.as_str())) {
        Ok(agents) => agents,
        Err(e) => return unavailable(e),
    };
    let body = html! {
        (form(&query))
        p.note {
            (listed.records.len()) " shown, in reference order"
            @if !query.all { "; those that ended over an hour ago are left out unless \"all\" is ticked" }
            "."
        }
        (table(&listed.records, &agents, now_ms()))
        (pager(&query, listed.next.as_deref()))
    };
    page(Page::new("Resources").under("/ui/resources"), body).into_response()
}

/// The filters, as a form that sends them back (GET, so a page's address is its query).
fn form(query: &ListQuery) -> Markup {
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    html! {
        form.filters method="get" action="/ui/resources" {
            label { "Agent" input type="text" name="agent" value=(text(&query.agent)); }
            label {
                "State"
                select name="state" {
                    option value="" { "any" }
                    @for s in RESOURCE_STATES {
                        option value=(s) selected[query.state.as_deref() == Some(*s)] { (s) }
                    }
                }
            }
            label { "Kind" input type="text" name="kind" value=(text(&query.kind)); }
            @for (name, value) in &query.attrs {
                label { "Attribute" input type="text" name="attr" value={ (name) "=" (value) }; }
            }
            label { "Attribute" input type="text" name="attr" placeholder="name=value"; }
            label { "Holder" input type="text" name="holder" value=(text(&query.holder)); }
            label {
                span { input type="checkbox" name="all" value="true" checked[query.all]; " all" }
                span.note { "with ended over an hour ago" }
            }
            button type="submit" { "Filter" }
            a href="/ui/resources" { "Clear" }
        }
    }
}

fn table(records: &[ResourceView], agents: &BTreeMap<String, AgentView>, now: u64) -> Markup {
    html! {
        @if records.is_empty() {
            p { "No resource matches." }
        } @else {
            table {
                thead {
                    tr {
                        th { "Resource" } th { "Kind" } th { "Agent" } th { "State" } th { "Since" }
                        th { "Waiting on" } th { "Holders" } th { "Attributes" }
                    }
                }
                tbody {
                    @for resource in records {
                        @let waiting = WaitingOn::of(resource, agents.get(&resource.agent));
                        tr {
                            td.id { (link("/ui/resources", &resource.reference)) }
                            td { (bdi(&resource.kind)) }
                            td { (link("/ui/agents", &resource.agent)) }
                            td { (state(&resource.state)) " " (stuck_badge(resource, now)) }
                            td { (timestamp(resource.state_since.unwrap_or(resource.updated_at))) }
                            td { @if let Some(waiting) = &waiting { (bdi(&waiting.on)) } }
                            td {
                                @for (i, lease) in resource.leases.iter().enumerate() {
                                    @if i > 0 { ", " }
                                    (bdi(&lease.holder))
                                    @if lease.state != "active" { " (" (lease.state) ")" }
                                }
                            }
                            td { (attributes(&resource.attributes)) }
                        }
                    }
                }
            }
        }
    }
}

/// Links to the first page (when this is not it) and to the next (when this page is full): the same filters, and
/// the key of the last resource shown as `after`, exactly as `GET /v1/resources` names its next page.
fn pager(query: &ListQuery, next: Option<&str>) -> Markup {
    html! {
        nav.pager {
            @if query.after.is_some() {
                a href={ "/ui/resources?" (query.query_after(None)) } { "First page" }
            }
            @if let Some(next) = next {
                a rel="next" href={ "/ui/resources?" (query.query_after(Some(next))) } { "Next page" }
            }
        }
    }
}
