//! `GET /ui`: the overview — counts by state, agents by health, pools by fill, each partition's lag, dead letters,
//! and what is stuck.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::ResourceQuery;
use leasehold_projector::views::{AgentView, ResourceView};
use maud::{Markup, html};

use super::{Page, Ui, age, bdi, encode, link, now_ms, page, timestamp, unavailable};

/// How long a resource may stay in a waiting state before the overview and the resources page call it stuck:
/// (state, minutes). A paused resource waits on an operator by design and is never stuck.
pub(crate) const STUCK_AFTER: &[(&str, u64)] = &[("pending", 2), ("suspect", 5), ("releasing", 5)];

/// The most records of one state the overview reads to find the stuck ones (each state's index, in reference
/// order): what it lists is then "stuck among the first N", which the page says.
const STUCK_SCAN: usize = 2_000;

/// The most stuck resources listed per state.
const STUCK_SHOWN: usize = 20;

/// How long `resource` has been stuck (ms) as of `now`, if its state has a threshold and it is past it.
pub(crate) fn stuck_for(resource: &ResourceView, now: u64) -> Option<u64> {
    let (_, minutes) = STUCK_AFTER.iter().find(|(state, _)| *state == resource.state)?;
    let since = resource.state_since.unwrap_or(resource.updated_at);
    let waited = now.saturating_sub(since);
    (waited >= minutes * 60_000).then_some(waited)
}

/// An agent's health, in the words of the overview: one of [`HEALTHS`].
pub(crate) fn health_of(agent: &AgentView) -> Vec<&'static str> {
    let mut health = Vec::new();
    match agent.status.as_str() {
        "live" => health.push("live"),
        "stalled" => health.push("stalled"),
        "gone" => health.push("gone"),
        "suspect" => health.push("breaker tripped"),
        "retired" => health.push("retired"),
        _ => {}
    }
    if agent.retired && !health.contains(&"retired") {
        health.push("retired");
    }
    if agent.cordon.is_some() && agent.drain.is_none() {
        health.push("cordoned");
    }
    if agent.drain.is_some() {
        health.push("draining");
    }
    if !agent.driver.available {
        health.push("driver unavailable");
    }
    health
}

/// Every health an agent may be counted under, in the order the overview shows them.
pub(crate) const HEALTHS: &[&str] =
    &["live", "stalled", "gone", "breaker tripped", "retired", "cordoned", "draining", "driver unavailable"];

/// The stuck resources of one state: the state, its threshold (minutes), each stuck resource with how long it has
/// waited (longest first), and whether the scan stopped before the state's end.
type StuckInState<'a> = (&'a str, u64, Vec<(ResourceView, u64)>, bool);

pub(crate) async fn get<L: Log>(State(ui): State<Arc<Ui<L>>>) -> Response {
    match render(&ui).await {
        Ok(markup) => markup.into_response(),
        Err(e) => unavailable(e),
    }
}

async fn render<L: Log>(ui: &Ui<L>) -> Result<Markup, String> {
    let reader = &ui.api.reader;
    let now = now_ms();
    let counts = reader.counts().map_err(|e| e.to_string())?;
    let agents = reader.agents().map_err(|e| e.to_string())?;
    let mut pools = reader.pools().map_err(|e| e.to_string())?;
    // Fullest first (a pool whose size cannot be read last), then by name.
    let fullness = |pool: &leasehold_projector::views::PoolView| match super::pools::size_of(pool) {
        Some(size) if size > 0 => pool.held.saturating_mul(1_000_000) / size,
        _ => 0,
    };
    pools.sort_by(|a, b| fullness(b).cmp(&fullness(a)).then_with(|| a.name.cmp(&b.name)));
    let applied = reader.applied().map_err(|e| e.to_string())?;
    let mut stuck: Vec<StuckInState<'_>> = Vec::new();
    for (state, minutes) in STUCK_AFTER {
        let query =
            ResourceQuery { state: Some((*state).to_owned()), limit: Some(STUCK_SCAN), ..ResourceQuery::default() };
        let page = reader.resources_page(&query).map_err(|e| e.to_string())?;
        let mut found: Vec<(ResourceView, u64)> =
            page.records.into_iter().filter_map(|r| stuck_for(&r, now).map(|waited| (r, waited))).collect();
        found.sort_by_key(|b| std::cmp::Reverse(b.1));
        stuck.push((state, *minutes, found, page.next.is_some()));
    }
    let mut lags = Vec::new();
    for partition in 0..ui.api.log.partitions() {
        let end = ui.api.log.last_outcome_seq(partition).await.map_err(|e| e.to_string())?;
        let writers = ui.health.workers.as_ref().and_then(|w| w.lag_seconds(partition));
        lags.push((partition, end, end.saturating_sub(applied), writers));
    }
    let (dead_total, dead) = ui.api.dead.latest(&ui.api.log, 5).await.map_err(|e| e.to_string())?;
    let mut by_health: BTreeMap<&str, Vec<&AgentView>> = BTreeMap::new();
    for agent in &agents {
        for health in health_of(agent) {
            by_health.entry(health).or_default().push(agent);
        }
    }
    let failures = ui.health.failures.list();
    let body = html! {
        @if !failures.is_empty() {
            section.alert {
                h2 { "Stopped in this process" }
                ul { @for failure in &failures { li { (bdi(failure)) } } }
            }
        }
        section id="stuck" {
            h2 { "Stuck" }
            p.note {
                "A resource is stuck once it has been "
                @for (i, (state, minutes)) in STUCK_AFTER.iter().enumerate() {
                    @if i > 0 { ", " }
                    (state) " for " (minutes) " min"
                }
                " or longer (a paused resource waits on an operator and is never stuck)."
            }
            @let any = stuck.iter().any(|(_, _, found, _)| !found.is_empty());
            @if !any { p.ok { "Nothing is stuck." } }
            @for (state, _, found, more) in &stuck {
                @if !found.is_empty() {
                    h3 { (state) " " span.count { (found.len()) } }
                    @if *more { p.note { "Among the first " (STUCK_SCAN) " " (state) " resources." } }
                    table {
                        thead { tr { th { "Resource" } th { "Stuck for" } th { "Since" } th { "Waiting on" } } }
                        tbody {
                            @for (resource, waited) in found.iter().take(STUCK_SHOWN) {
                                @let agent = agents.iter().find(|a| a.name == resource.agent);
                                @let waiting = leasehold_projector::views::WaitingOn::of(resource, agent);
                                tr {
                                    td { (link("/ui/resources", &resource.reference)) }
                                    td { span.badge.stuck { (age(now, now.saturating_sub(*waited))) } }
                                    td { (timestamp(resource.state_since.unwrap_or(resource.updated_at))) }
                                    td { @if let Some(w) = waiting { (bdi(&w.on)) } }
                                }
                            }
                        }
                    }
                    @if found.len() > STUCK_SHOWN {
                        p { a href={ "/ui/resources?state=" (encode(state)) } { "All " (state) " resources" } }
                    }
                }
            }
        }
        section id="counts" {
            h2 { "By state" }
            table {
                thead { tr { th { "Records" } th { "State" } th.num { "How many" } } }
                tbody {
                    @for ((what, state), n) in counts.iter().filter(|(_, n)| *n > 0) {
                        tr {
                            td { (what) }
                            td {
                                @if what == "resources" {
                                    a href={ "/ui/resources?state=" (encode(state)) } { (state) }
                                } @else { (state) }
                            }
                            td.num { (n) }
                        }
                    }
                }
            }
        }
        section id="agents" {
            h2 { "Agents by health" }
            @if agents.is_empty() { p { "No agent has registered." } }
            table {
                thead { tr { th { "Health" } th.num { "Agents" } th { "Which" } } }
                tbody {
                    @for health in HEALTHS {
                        @let listed = by_health.get(health).map(Vec::as_slice).unwrap_or_default();
                        tr {
                            td { a href={ "/ui/agents?health=" (encode(health)) } { (health) } }
                            td.num { (listed.len()) }
                            td {
                                @for (i, agent) in listed.iter().take(10).enumerate() {
                                    @if i > 0 { ", " }
                                    (link("/ui/agents", &agent.name))
                                }
                                @if listed.len() > 10 { " and " (listed.len() - 10) " more" }
                            }
                        }
                    }
                }
            }
        }
        section id="pools" {
            h2 { "Pools by fill" }
            @if pools.is_empty() { p { "No pool is defined." } }
            @else {
                p.note { "Fullest first: held identifiers of what the pool can hand out." }
                table {
                    thead { tr { th { "Pool" } th { "Fill" } th.num { "Waiting" } th.num { "Cooling" } } }
                    tbody {
                        @for pool in &pools {
                            tr {
                                td { (link("/ui/pools", &pool.name)) }
                                td { (super::pools::fill(pool)) }
                                td.num { (pool.waiting) }
                                td.num { (pool.cooling_until.iter().filter(|until| **until > now).count()) }
                            }
                        }
                    }
                }
            }
        }
        section id="lag" {
            h2 { "Partitions" }
            p.note {
                "The projector has applied the log up to outcome " (applied) ". A partition's projection lag is its "
                "log end (the sequence of its last outcome) minus that: how far behind the pages are. The writers' lag "
                "is how long the last command they decided had waited, by log time (the metric "
                code { "leasehold_partition_lag_seconds" } ")"
                @if ui.health.workers.is_none() { "; this process runs no writer, so it is read on the workers' /metrics" }
                "."
            }
            table {
                thead { tr { th.num { "Partition" } th.num { "Log end" } th.num { "Projection lag" } th.num { "Writers' lag" } } }
                tbody {
                    @for (partition, end, lag, writers) in &lags {
                        tr {
                            td.num { (partition) }
                            td.num { (end) }
                            td.num { (lag) }
                            td.num { @match writers { Some(s) => { (format!("{s:.1} s")) }, None => { "–" } } }
                        }
                    }
                }
            }
        }
        section id="dead" {
            h2 { "Dead letters " span.count { (dead_total) } }
            @if dead.is_empty() { p.ok { "No command was dead-lettered." } }
            @else {
                table {
                    thead { tr { th.num { "#" } th { "Command" } th { "Subject" } th { "Reason" } } }
                    tbody {
                        @for letter in &dead {
                            tr {
                                td.num { (letter.seq) }
                                td { @match &letter.command_id { Some(id) => { (link("/ui/commands", id)) }, None => { "(no id)" } } }
                                td { (bdi(&letter.subject)) }
                                td { (bdi(&letter.reason)) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page(Page::new("Overview").under("/ui"), body))
}
