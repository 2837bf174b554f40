//! `GET /ui/leases/{ref}`: one lease — its holder, state, token, resource, times, place in the queue, priority, and
//! why it ended — and its timeline ([`super::timeline`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::views::{LeaseView, QueuePlace, ResourceView, queue_places};
use leasehold_projector::{Error, Reader};
use maud::{Markup, html};

use super::parts::{detail, not_found, state, time_or_dash};
use super::{Page, Ui, bdi, encode, link, now_ms, page, timeline, unavailable};
use crate::history::{PageQuery, lease_thing};
use crate::queries::resource_ref;

/// The live leases of `resource` (waiting or active, first come first), each as its own record, and the place in the
/// queue of each waiting one at `now`: read by the lease ids its record lists, so a resource with a long past costs
/// what it holds now.
pub(crate) fn live_leases(
    reader: &Reader,
    resource: &ResourceView,
    now: u64,
) -> Result<(Vec<LeaseView>, BTreeMap<String, QueuePlace>), Error> {
    let mut leases = Vec::with_capacity(resource.leases.len());
    for brief in &resource.leases {
        if let Some(lease) = reader.lease(&brief.id)? {
            leases.push(lease);
        }
    }
    let places = queue_places(&leases, now);
    Ok((leases, places))
}

/// A place in the queue in words: its position (1 is granted next) and the priority it has now, aged.
pub(crate) fn place_text(place: &QueuePlace) -> String {
    format!("#{} in the queue (effective priority {})", place.position, place.effective_priority)
}

/// `GET /ui/leases/{ref}[?before=SEQ|after=SEQ]`: the query pages its timeline (the newest steps without one).
pub(crate) async fn get<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    reference: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let (reference, thing, steps) = match timeline::asked(reference, query, lease_thing) {
        Ok(asked) => asked,
        Err(response) => return response,
    };
    let reader = &ui.api.reader;
    let lease = match reader.lease(&reference) {
        Ok(Some(lease)) => lease,
        Ok(None) => return not_found("lease", &reference),
        Err(e) => return unavailable(e),
    };
    let now = now_ms();
    // Its place in the queue is among the waiting leases of its resource, as they are now.
    let mut place = None;
    if lease.state == "waiting"
        && let Ok(parsed) = resource_ref(&lease.resource)
    {
        match reader.resource(&parsed).and_then(|r| r.map(|r| live_leases(reader, &r, now)).transpose()) {
            Ok(live) => place = live.and_then(|(_, places)| places.get(&lease.id).copied()),
            Err(e) => return unavailable(e),
        }
    }
    let base = format!("/ui/leases/{}", encode(&reference));
    let timeline = timeline::for_thing(&ui.api, &thing, steps, &base).await;
    let title = format!("Lease {reference}");
    let body = html! { (fields(&lease, place)) (timeline) };
    page(Page::new(title).under("/ui/resources"), body).into_response()
}

fn fields(lease: &LeaseView, place: Option<QueuePlace>) -> Markup {
    html! {
        section id="lease" {
            dl.fields {
                dt { "Lease" } dd.mono { (lease.id) }
                dt { "Holder" } dd { (bdi(&lease.holder)) }
                dt { "State" } dd { (state(&lease.state)) }
                dt { "Resource" } dd { (link("/ui/resources", &lease.resource)) }
                dt { "Token" } dd { @match lease.token { Some(token) => { (token) }, None => { "–" } } }
                dt { "Priority" } dd { (lease.priority) }
                @if let Some(place) = &place {
                    dt { "Queue" } dd { (place_text(place)) }
                }
                dt { "Asked" } dd { (time_or_dash(Some(lease.requested_at).filter(|at| *at > 0))) }
                dt { "Granted" } dd { (time_or_dash(lease.granted_at)) }
                dt { "Expires" } dd { (time_or_dash(lease.expires_at)) }
                @if lease.state == "waiting" {
                    dt { "Waits until" } dd { (time_or_dash(lease.wait_until)) }
                }
                dt { "Time to live" } dd {
                    @match lease.ttl_ms { Some(ms) => { (leasehold_schemas::Millis(ms).to_string()) }, None => { "none" } }
                }
                dt { "Ended" } dd { (time_or_dash(lease.terminal_at)) }
                @if let Some(why) = &lease.detail {
                    dt { "Why" } dd { (detail(why)) }
                }
                dt { "As of outcome" } dd { (lease.as_of) }
            }
        }
    }
}
