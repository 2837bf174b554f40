//! `GET /ui/agents` and `GET /ui/agents/{name}`: every agent with its health, when it was last heard from, its
//! breaker, driver, cordon and drain, and its capacity used per kind; one agent in full, with its settings in force
//! and its first resources.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::ResourceQuery;
use leasehold_projector::views::AgentView;
use leasehold_schemas::ids::{AgentName, Millis};
use leasehold_schemas::settings::AgentSettings;
use maud::{Markup, html};

use super::overview::{HEALTHS, health_of, stuck_for};
use super::parts::{name_param, not_found};
use super::{Page, Ui, age, bdi, encode, link, now_ms, page, problem, timestamp, unavailable};

/// How many of an agent's resources its page lists (the resources page, filtered by the agent, has them all).
const RESOURCES_SHOWN: usize = 50;

/// The badge class of a health: how much an operator should worry.
fn health_class(health: &str) -> &'static str {
    match health {
        "live" => "good",
        "gone" | "breaker tripped" | "driver unavailable" => "bad",
        "stalled" | "cordoned" | "draining" => "warn",
        _ => "",
    }
}

/// The agent's healths as badges.
fn badges(agent: &AgentView) -> Markup {
    html! {
        @for (i, health) in health_of(agent).into_iter().enumerate() {
            @if i > 0 { " " }
            span class={ "badge " (health_class(health)) } { (health) }
        }
    }
}

/// When it was last heard from (a report or a heartbeat): how long ago, and the time.
fn heard(now: u64, agent: &AgentView) -> Markup {
    html! { (age(now, agent.last_seen)) " ago, " (timestamp(agent.last_seen)) }
}

fn breaker(agent: &AgentView) -> Markup {
    html! {
        @match &agent.breaker {
            Some(b) => {
                "tripped " (timestamp(b.tripped_at)) ": a report would have lost " (b.would_lose) " of its "
                (b.live) " live resources (nothing was marked; "
                code { "leasehold agent confirm-loss" } " lets the losses through)"
            }
            None => { "–" }
        }
    }
}

fn driver(agent: &AgentView) -> Markup {
    html! {
        @if agent.driver.available {
            "available"
        } @else {
            span.badge.bad { "unavailable" }
            @if let Some(detail) = &agent.driver.detail { " " (bdi(detail)) }
        }
    }
}

fn cordon(agent: &AgentView) -> Markup {
    html! {
        @match &agent.cordon {
            Some(c) => {
                "by " (bdi(&c.by))
                @if let Some(reason) = &c.reason { ": " (bdi(reason)) }
                ", since " (timestamp(c.since))
            }
            None => { "–" }
        }
    }
}

fn drain(agent: &AgentView, full: bool) -> Markup {
    html! {
        @match &agent.drain {
            Some(d) => {
                (d.left) " left, "
                @match d.deadline {
                    Some(deadline) => { "deadline " (timestamp(deadline)) }
                    None => { "no deadline" }
                }
                @if full {
                    "; by " (bdi(&d.by))
                    @if let Some(reason) = &d.reason { ": " (bdi(reason)) }
                    ", since " (timestamp(d.since)) "; a resource is released once it has held no lease for "
                    (Millis(d.grace_ms))
                }
            }
            None => { "–" }
        }
    }
}

/// Every kind it declared a capacity for or uses, with `used / capacity` (`–`: no capacity declared, not limited).
fn capacity(agent: &AgentView) -> Markup {
    let mut kinds: Vec<&String> = agent.capacity.keys().chain(agent.used.keys()).collect();
    kinds.sort();
    kinds.dedup();
    html! {
        @if kinds.is_empty() { "–" }
        @for (i, kind) in kinds.iter().enumerate() {
            @if i > 0 { br; }
            (bdi(kind)) " " (agent.used.get(*kind).copied().unwrap_or(0)) " / "
            @match agent.capacity.get(*kind) { Some(n) => { (n) }, None => { "–" } }
        }
    }
}

fn labels(agent: &AgentView) -> Markup {
    html! {
        @if agent.labels.is_empty() { "–" }
        @for (i, (name, value)) in agent.labels.iter().enumerate() {
            @if i > 0 { ", " }
            (bdi(name)) "=" (bdi(value))
        }
    }
}

/// The `health` filter of the list: one of [`HEALTHS`], or none.
fn health_filter(pairs: &[(String, String)]) -> Result<Option<&'static str>, Response> {
    let mut health = None;
    for (name, value) in pairs {
        if name != "health" {
            return Err(bad_query(html! { "This page takes only " code { "health" } ", not " (bdi(name)) "." }));
        }
        if value.is_empty() {
            continue;
        }
        match HEALTHS.iter().find(|h| **h == value) {
            Some(h) if health.is_none() => health = Some(*h),
            Some(_) => return Err(bad_query(html! { code { "health" } " is given twice." })),
            None => {
                return Err(bad_query(html! {
                    "No health is called " (bdi(value)) "; it is one of " (HEALTHS.join(", ")) "."
                }));
            }
        }
    }
    Ok(health)
}

fn bad_query(why: Markup) -> Response {
    problem(StatusCode::BAD_REQUEST, "Bad query", html! { p { (why) } p { a href="/ui/agents" { "Every agent" } } })
}

/// `GET /ui/agents?health=`
pub(crate) async fn list<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let pairs = match query {
        Ok(Query(pairs)) => pairs,
        Err(e) => return bad_query(html! { (e.body_text()) }),
    };
    let health = match health_filter(&pairs) {
        Ok(health) => health,
        Err(response) => return response,
    };
    let agents = match ui.api.reader.agents() {
        Ok(agents) => agents,
        Err(e) => return unavailable(e),
    };
    let now = now_ms();
    let shown: Vec<&AgentView> = agents.iter().filter(|a| health.is_none_or(|h| health_of(a).contains(&h))).collect();
    let body = html! {
        form.filters method="get" action="/ui/agents" {
            label {
                "Health"
                select name="health" {
                    option value="" { "any" }
                    @for h in HEALTHS {
                        option value=(h) selected[health == Some(*h)] { (h) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        section id="agents" {
            h2 {
                @match health { Some(h) => { "Agents " (h) }, None => { "Every agent" } }
                " " span.count { (shown.len()) }
            }
            p.note {
                "Last heard: its last report or heartbeat, by log time. Capacity: resources of each kind from pending "
                "to releasing (with room held for placements) of what it declared at registration; – where it "
                "declared none (not limited)."
            }
            @if shown.is_empty() {
                p { @if agents.is_empty() { "No agent has registered." } @else { "No agent is " (health.unwrap_or("")) "." } }
            } @else {
                table {
                    thead {
                        tr {
                            th { "Agent" } th { "Status" } th { "Last heard" } th { "Breaker" } th { "Driver" }
                            th { "Cordon" } th { "Drain" } th { "Capacity used" } th { "Labels" }
                        }
                    }
                    tbody {
                        @for agent in &shown {
                            tr {
                                td { (link("/ui/agents", &agent.name)) }
                                td { (badges(agent)) }
                                td { (heard(now, agent)) }
                                td { (breaker(agent)) }
                                td { (driver(agent)) }
                                td { (cordon(agent)) }
                                td { (drain(agent, false)) }
                                td { (capacity(agent)) }
                                td { (labels(agent)) }
                            }
                        }
                    }
                }
            }
        }
    };
    page(Page::new("Agents").under("/ui/agents"), body).into_response()
}

/// `GET /ui/agents/{name}`
pub(crate) async fn one<L: Log>(State(ui): State<Arc<Ui<L>>>, name: Result<Path<String>, PathRejection>) -> Response {
    let name = match name_param(name, "an agent name", |n| AgentName::new(n)) {
        Ok(name) => name,
        Err(response) => return response,
    };
    match render(&ui, &name) {
        Ok(Some(markup)) => markup.into_response(),
        Ok(None) => not_found("agent", &name),
        Err(e) => unavailable(e),
    }
}

fn render<L: Log>(ui: &Ui<L>, name: &str) -> Result<Option<Markup>, leasehold_projector::Error> {
    let reader = &ui.api.reader;
    let Some(agent) = reader.agents()?.into_iter().find(|a| a.name == name) else {
        return Ok(None);
    };
    let now = now_ms();
    let shown_for = u64::try_from(ui.api.config.list_ended_for.as_millis()).unwrap_or(u64::MAX);
    let query = ResourceQuery {
        agent: Some(agent.name.clone()),
        ended_before: Some(now.saturating_sub(shown_for)),
        limit: Some(RESOURCES_SHOWN),
        ..ResourceQuery::default()
    };
    let resources = reader.resources_page(&query)?;
    let settings = serde_json::from_value::<AgentSettings>(agent.settings.clone()).ok();
    let all_resources = format!("/ui/resources?agent={}", encode(&agent.name));
    let body = html! {
        section id="agent" {
            h2 { "State" }
            dl.fields {
                dt { "Health" } dd { (badges(&agent)) }
                dt { "Status" } dd { (agent.status) @if agent.retired { " (retired by an operator)" } }
                dt { "Last heard" } dd { (heard(now, &agent)) }
                @if let Some(gone_at) = agent.gone_at { dt { "Declared gone" } dd { (timestamp(gone_at)) } }
                dt { "Epoch" } dd { (agent.epoch) }
                dt { "Incarnation" } dd.mono { (bdi(&agent.incarnation)) }
                dt { "Breaker" } dd { (breaker(&agent)) }
                dt { "Driver" } dd { (driver(&agent)) }
                dt { "Cordon" } dd { (cordon(&agent)) }
                dt { "Drain" } dd { (drain(&agent, true)) }
                dt { "Capacity used" } dd { (capacity(&agent)) }
                dt { "Labels" } dd { (labels(&agent)) }
                dt { "Resources" } dd { (agent.resources) " in state, " (agent.held) " held (observed present and meant to exist)" }
                dt { "Quarantined" } dd { (agent.quarantined) " handles of lost resources, kept until a release orders them destroyed" }
                dt { "Garbage" } dd { (agent.garbage_orders) " handles ordered destroyed, not reported destroyed yet" }
                dt { "As of" } dd { "outcome " (agent.as_of) }
            }
            p { a href={ "/ui/feed?key=" (encode(&agent.name)) } { "Its outcomes in the live feed" } }
        }
        section id="settings" {
            h2 { "Settings in force" }
            p.note {
                @if agent.own_settings { "Its own: it registered with them." }
                @else { "Its partition's policy (it registered without settings of its own, and follows the policy as it changes)." }
            }
            @match &settings {
                Some(s) => {
                    dl.fields {
                        dt { "Breaker" } dd { "trips when the losses of the last " (s.loss_window) " reach " (s.max_loss_min)
                            " and exceed " (s.max_loss_percent) "% of its live resources" }
                        dt { "Create timeout" } dd { "a pending resource older than " (s.create_timeout) " is released" }
                        dt { "Stalled after" } dd { (s.stall_after) " without a heartbeat" }
                        dt { "Gone after" } dd { (s.orphan_after) " without a heartbeat (its resources are orphaned)" }
                    }
                }
                None => { pre { (agent.settings.to_string()) } }
            }
        }
        section id="resources" {
            h2 { "Resources" }
            p.note {
                "Its first " (RESOURCES_SHOWN) " resources in reference order, leaving out those that ended over "
                (humantime::format_duration(ui.api.config.list_ended_for)) " ago. "
                a href=(all_resources) { "All its resources" } " (filters and pages)."
            }
            @if resources.records.is_empty() {
                p { "It has no resource to show." }
            } @else {
                table {
                    thead { tr { th { "Resource" } th { "Kind" } th { "State" } th { "Since" } th.num { "Leases" } } }
                    tbody {
                        @for resource in &resources.records {
                            @let since = resource.state_since.unwrap_or(resource.updated_at);
                            tr {
                                td { (link("/ui/resources", &resource.reference)) }
                                td { (bdi(&resource.kind)) }
                                td {
                                    span class={ "state-" (resource.state) } { (resource.state) }
                                    @if let Some(waited) = stuck_for(resource, now) {
                                        " " span.badge.stuck { "stuck for " (age(now, now.saturating_sub(waited))) }
                                    }
                                }
                                td { (timestamp(since)) }
                                td.num { (resource.leases.len()) }
                            }
                        }
                    }
                }
                @if resources.next.is_some() {
                    p { a href=(all_resources) { "More of its resources" } }
                }
            }
        }
    };
    Ok(Some(page(Page::new(format!("Agent {}", agent.name)).under("/ui/agents"), body)))
}
