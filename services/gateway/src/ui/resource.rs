//! `GET /ui/resources/{ref}`: one resource — its fields, what it waits on, its claims, its live leases with their
//! places in the queue, a quarantined handle or a blocked destroy, and the command that created it.
//!
//! The page is read ([`read`]) and then rendered ([`render`]) with its timeline, the section of its history made by
//! [`super::timeline`] from the projection's timeline index (paged by the page's `?before=` and `?after=`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_projector::views::{LeaseView, QueuePlace, ResourceView};
use maud::{Markup, html};

use super::lease::{live_leases, place_text};
use super::parts::{attributes, bad_request, detail, not_found, state, stuck_badge, time_or_dash};
use super::{Page, Ui, bdi, encode, link, now_ms, page, timeline, timestamp, unavailable};
use crate::history::{PageQuery, resource_thing};
use crate::queries::resource_ref;

/// What the page of one resource shows, as read at `now` (unix ms).
pub(crate) struct Shown {
    pub(crate) resource: ResourceView,
    /// Its live leases, first come first, and the place in the queue of each waiting one.
    pub(crate) leases: Vec<LeaseView>,
    pub(crate) places: BTreeMap<String, QueuePlace>,
    /// The id of the command whose outcome created it, while the log holds that outcome.
    pub(crate) created_by: Option<String>,
    pub(crate) now: u64,
}

/// `GET /ui/resources/{ref}[?before=SEQ|after=SEQ]`: the query pages its timeline (the newest steps without one).
pub(crate) async fn get<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    reference: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let (reference, thing, steps) = match timeline::asked(reference, query, resource_thing) {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let shown = match read(&ui, &reference).await {
        Ok(shown) => shown,
        Err(response) => return response,
    };
    let base = format!("/ui/resources/{}", encode(&reference));
    let timeline = timeline::for_thing(&ui.api, &thing, steps, &base).await;
    render(&shown, Some(timeline)).into_response()
}

/// Reads what the page of resource `reference` shows; a bad reference is a 400 page, an unknown one a 404 page.
pub(crate) async fn read<L: Log>(ui: &Ui<L>, reference: &str) -> Result<Shown, Response> {
    let parsed = resource_ref(reference).map_err(|message| bad_request(&message))?;
    let reader = &ui.api.reader;
    let resource = match reader.resource(&parsed) {
        Ok(Some(resource)) => resource,
        Ok(None) => return Err(not_found("resource", reference)),
        Err(e) => return Err(unavailable(e)),
    };
    let now = now_ms();
    let (leases, places) = live_leases(reader, &resource, now).map_err(unavailable)?;
    let created_by = created_by(ui, resource.created_seq).await;
    Ok(Shown { resource, leases, places, created_by, now })
}

/// The command of the outcome at `seq`, if the log still holds it (a log that cannot be read now leaves it unknown:
/// the page shows the rest).
async fn created_by<L: Log>(ui: &Ui<L>, seq: u64) -> Option<String> {
    let read = ui.api.log.read_outcomes(&OutcomeFilter::All, seq, 1).await;
    read.ok()?.into_iter().find(|stored| stored.seq == seq).map(|stored| stored.cmd_id)
}

/// The whole page of `shown`, with `timeline` (its history) as its last section when there is one.
pub(crate) fn render(shown: &Shown, timeline: Option<Markup>) -> Markup {
    let resource = &shown.resource;
    let body = html! {
        (summary(shown))
        (fields(resource))
        (claims(resource))
        (leases(shown))
        (trouble(resource))
        @if let Some(timeline) = timeline { (timeline) }
    };
    page(Page::new(format!("Resource {}", resource.reference)).under("/ui/resources"), body)
}

/// Its state, what it waits on and since when, whether it is stuck, and the command that made it.
fn summary(shown: &Shown) -> Markup {
    let resource = &shown.resource;
    html! {
        section id="summary" {
            p {
                (state(&resource.state)) " since " (time_or_dash(resource.state_since)) " "
                (stuck_badge(resource, shown.now))
            }
            @match &resource.waiting_on {
                Some(waiting) => {
                    p.waiting {
                        "Waiting on: " (bdi(&waiting.on))
                        @if let Some(since) = waiting.since { " (since " (timestamp(since)) ")" }
                    }
                }
                None => { p.note { "It waits on nothing." } }
            }
            p {
                "Created by "
                @match &shown.created_by {
                    Some(id) => { "command " (link("/ui/commands", id)) }
                    None => { "a command the log no longer holds (outcome " (resource.created_seq) ")" }
                }
                "."
            }
        }
    }
}

fn fields(resource: &ResourceView) -> Markup {
    html! {
        section id="fields" {
            h2 { "Fields" }
            dl.fields {
                dt { "Reference" } dd.mono { (resource.reference) }
                dt { "Kind" } dd { (bdi(&resource.kind)) }
                dt { "Capacity" } dd { (resource.capacity) }
                dt { "Agent" } dd { (link("/ui/agents", &resource.agent)) }
                dt { "State" } dd { (state(&resource.state)) }
                dt { "Since" } dd { (time_or_dash(resource.state_since)) }
                dt { "Detail" } dd { @match &resource.detail { Some(d) => { (detail(d)) }, None => { "–" } } }
                dt { "Attributes" } dd { (attributes(&resource.attributes)) }
                dt { "Parent" } dd {
                    @match &resource.parent { Some(parent) => { (link("/ui/resources", parent)) }, None => { "–" } }
                }
                dt { "Upstream suspect" } dd { (if resource.upstream_suspect { "yes" } else { "no" }) }
                dt { "Native id" } dd {
                    @match &resource.native_id { Some(id) => { (bdi(id)) }, None => { "–" } }
                }
                dt { "Allocated at" } dd { (timestamp(resource.allocated_at)) }
                @if resource.terminal_at.is_some() {
                    dt { "Ended at" } dd { (time_or_dash(resource.terminal_at)) }
                }
                @if resource.idle_since.is_some() {
                    dt { "Idle since" } dd { (time_or_dash(resource.idle_since)) }
                }
                @if let Some(ms) = resource.max_lease_ms {
                    dt { "Longest lease while others wait" } dd { (leasehold_schemas::Millis(ms).to_string()) }
                }
                dt { "Created at outcome" } dd { (resource.created_seq) }
                dt { "As of outcome" } dd { (resource.as_of) " (" (timestamp(resource.updated_at)) ")" }
            }
        }
    }
}

fn claims(resource: &ResourceView) -> Markup {
    html! {
        section id="claims" {
            h2 { "Claims" }
            @if resource.claims.is_empty() {
                p.note { "It claims nothing from a pool." }
            } @else {
                table {
                    thead { tr { th { "Pool" } th { "Status" } th { "Identifier" } th.num { "Token" } } }
                    tbody {
                        @for claim in &resource.claims {
                            tr {
                                td { (link("/ui/pools", &claim.pool)) }
                                td { (claim.status) }
                                td { @match &claim.id { Some(id) => { (bdi(id)) }, None => { "–" } } }
                                td.num { @match claim.token { Some(token) => { (token) }, None => { "–" } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn leases(shown: &Shown) -> Markup {
    html! {
        section id="leases" {
            h2 { "Leases" }
            @if shown.leases.is_empty() {
                p.note { "No lease is held or waiting." }
            } @else {
                table {
                    thead {
                        tr {
                            th { "Lease" } th { "Holder" } th { "State" } th { "Queue" } th.num { "Priority" }
                            th { "Granted" } th { "Expires" }
                        }
                    }
                    tbody {
                        @for lease in &shown.leases {
                            tr {
                                td.id { (link("/ui/leases", &lease.id)) }
                                td { (bdi(&lease.holder)) }
                                td { (state(&lease.state)) }
                                td { @if let Some(place) = shown.places.get(&lease.id) { (place_text(place)) } }
                                td.num { (lease.priority) }
                                td { (time_or_dash(lease.granted_at)) }
                                td { (time_or_dash(lease.expires_at)) }
                            }
                        }
                    }
                }
            }
            p.note {
                "Live leases only; " code { "leasehold leases " (shown.resource.reference) " --all" }
                " lists the ended ones too."
            }
        }
    }
}

/// A quarantined handle of a lost resource, and a destroy its agent reported blocked: shown when present.
fn trouble(resource: &ResourceView) -> Markup {
    html! {
        @if let Some(q) = &resource.quarantined {
            section id="quarantine" {
                h2 { "Quarantined handle" }
                dl.fields {
                    dt { "Found again" } dd { (timestamp(q.found_at)) " (position " (q.position) ")" }
                    dt { "Destroy ordered" } dd {
                        @match q.destroy_ordered { Some(at) => { "at position " (at) }, None => { "not yet: release it to order it" } }
                    }
                    @if let Some(by) = &q.released_by { dt { "Released by" } dd { (bdi(by)) } }
                    @if let Some(reason) = &q.reason { dt { "Reason" } dd { (bdi(reason)) } }
                    dt { "Destroyed" } dd { (time_or_dash(q.destroyed_at)) }
                }
            }
        }
        @if let Some(blocked) = &resource.destroy_blocked {
            section id="destroy-blocked" {
                h2 { "Destroy blocked" }
                p { (bdi(&blocked.detail)) " (reported " (timestamp(blocked.at)) ")" }
            }
        }
    }
}
