//! `GET /ui/pools` and `GET /ui/pools/{name}`: every pool with its kind, size and fill, and the quotas with what
//! holds them; one pool with every held identifier and its holder, every cooling identifier and when its cool-down
//! ends, and who waits.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use leasehold_log::Log;
use leasehold_projector::views::{HolderView, PoolView, QuotaView};
use leasehold_schemas::command::quota_pool;
use leasehold_schemas::ids::{Millis, PoolName, QuotaName, ResourceRef};
use leasehold_schemas::pool::PoolKind;
use maud::{Markup, html};

use super::parts::{name_param, not_found};
use super::{Page, Ui, bdi, encode, link, now_ms, page, timestamp, unavailable};

/// The pool's definition, as the domain reads it (`None`: a record this build cannot read).
fn kind_of(pool: &PoolView) -> Option<PoolKind> {
    serde_json::from_value(pool.kind.clone()).ok()
}

/// A definition in words: `IPv4 10.0.0.0/24 without 10.0.0.1`, `16 slots`, `ports 8000–8099`.
fn kind_text(pool: &PoolView) -> Markup {
    let list =
        |items: Vec<String>| if items.is_empty() { String::new() } else { format!(" without {}", items.join(", ")) };
    match kind_of(pool) {
        Some(PoolKind::Ipv4 { network, prefix_len, exclude }) => {
            let exclude = list(exclude.iter().map(ToString::to_string).collect());
            html! { "IPv4 " code { (network) "/" (prefix_len) } (exclude) }
        }
        Some(PoolKind::Slots { count: 1 }) => html! { "1 slot" },
        Some(PoolKind::Slots { count }) => html! { (count) " slots" },
        Some(PoolKind::Ports { first, last, exclude }) => {
            let exclude = list(exclude.iter().map(ToString::to_string).collect());
            html! { "ports " (first) "–" (last) (exclude) }
        }
        None => html! { code { (pool.kind.to_string()) } },
    }
}

/// How many identifiers the pool can hand out, by the domain's own count (`None`: its definition cannot be read).
pub(crate) fn size_of(pool: &PoolView) -> Option<u64> {
    kind_of(pool).map(|kind| kind.n_usable())
}

/// `held / size (n%)`, or only `held` where the size is not known.
pub(crate) fn fill(pool: &PoolView) -> Markup {
    match size_of(pool) {
        Some(size) if size > 0 => {
            let percent = pool.held.saturating_mul(100) / size;
            let shown = format!("{} / {size} ({percent}%)", pool.held);
            match (pool.held >= size, percent >= 90) {
                (true, _) => html! { span.badge.bad { (shown) } },
                (false, true) => html! { span.badge.warn { (shown) } },
                (false, false) => html! { (shown) },
            }
        }
        Some(size) => html! { (pool.held) " / " (size) },
        None => html! { (pool.held) },
    }
}

/// One quota, as recorded in the partitions that have it the same way.
struct Quota {
    name: String,
    view: QuotaView,
    partitions: Vec<u32>,
}

/// The quotas of every partition, one row for each way a quota is recorded (a quota is set in every partition; a
/// change under way may leave them different for a while).
fn quotas(policies: &[leasehold_projector::views::PolicyView]) -> Vec<Quota> {
    let mut out: Vec<Quota> = Vec::new();
    for policy in policies {
        for (name, view) in &policy.quotas {
            match out.iter_mut().find(|q| q.name == *name && q.view == *view) {
                Some(quota) => quota.partitions.push(policy.partition),
                None => out.push(Quota { name: name.clone(), view: view.clone(), partitions: vec![policy.partition] }),
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.partitions.cmp(&b.partitions)));
    out
}

/// `GET /ui/pools`
pub(crate) async fn list<L: Log>(State(ui): State<Arc<Ui<L>>>) -> Response {
    match render_list(&ui) {
        Ok(markup) => markup.into_response(),
        Err(e) => unavailable(e),
    }
}

fn render_list<L: Log>(ui: &Ui<L>) -> Result<Markup, leasehold_projector::Error> {
    let reader = &ui.api.reader;
    let now = now_ms();
    let pools: Vec<PoolView> = reader.pools()?.into_iter().map(|pool| pool.at(now)).collect();
    let policies = reader.policies()?;
    let partitions = policies.len();
    let quotas = quotas(&policies);
    // The holders of each quota's counting pools, read once per pool.
    let mut holders: BTreeMap<String, Vec<HolderView>> = BTreeMap::new();
    for quota in &quotas {
        let Ok(name) = QuotaName::new(quota.name.as_str()) else { continue };
        for kind in quota.view.max.keys() {
            if let Some(pool) = quota_pool(&name, kind)
                && !holders.contains_key(pool.as_str())
            {
                holders.insert(pool.to_string(), reader.holders(pool.as_str())?);
            }
        }
    }
    let body = html! {
        section id="pools" {
            h2 { "Pools " span.count { (pools.len()) } }
            p.note {
                "Size: how many identifiers the pool can hand out (without the network and broadcast addresses of a "
                "subnet, and its exclusions). Cooling: freed identifiers whose cool-down has not ended now; they are "
                "not handed out again before it ends. Orphans: what an orphaned holder's identifier does (release: "
                "freed at orphaning; hold: kept until its agent confirms the destroy or an operator frees it)."
            }
            @if pools.is_empty() { p { "No pool is defined." } }
            @else {
                table {
                    thead {
                        tr {
                            th { "Pool" } th { "Kind" } th.num { "Size" } th.num { "Held" } th.num { "Waiting" }
                            th.num { "Cooling" } th { "Orphans" } th { "Cool-down" }
                        }
                    }
                    tbody {
                        @for pool in &pools {
                            tr {
                                td { (link("/ui/pools", &pool.name)) }
                                td { (kind_text(pool)) }
                                td.num { @match size_of(pool) { Some(size) => { (size) }, None => { "?" } } }
                                td.num { (fill(pool)) }
                                td.num { (pool.waiting) }
                                td.num { (pool.cooling) }
                                td { (pool.orphans) }
                                td { (Millis(pool.cooldown_ms)) }
                            }
                        }
                    }
                }
            }
        }
        section id="quotas" {
            h2 { "Quotas " span.count { (quotas.iter().map(|q| &q.name).collect::<std::collections::BTreeSet<_>>().len()) } }
            p.note {
                "A quota limits how many resources of each kind its principals (the issuers named) may hold at once, "
                "across every partition: each kind is counted by a slot pool, " code { "quota-<quota>-<kind>" }
                ", whose holders are the resources counted."
            }
            @if quotas.is_empty() { p { "No quota is recorded." } }
            @else {
                table {
                    thead { tr { th { "Quota" } th { "Principals" } th { "Kind" } th.num { "Held / max" } th { "Held by" } } }
                    tbody {
                        @for quota in &quotas {
                            @let name = QuotaName::new(quota.name.as_str()).ok();
                            @let kinds: Vec<(Option<&String>, Option<&u32>)> = if quota.view.max.is_empty() {
                                vec![(None, None)]
                            } else {
                                quota.view.max.iter().map(|(kind, max)| (Some(kind), Some(max))).collect()
                            };
                            @let rows = kinds.len();
                            @for (i, (kind, max)) in kinds.into_iter().enumerate() {
                                @let pool = name.as_ref().zip(kind).and_then(|(name, kind)| quota_pool(name, kind));
                                @let held = pool.as_ref().and_then(|p| holders.get(p.as_str()));
                                tr {
                                    @if i == 0 {
                                        td rowspan=(rows) {
                                            (bdi(&quota.name))
                                            @if quota.partitions.len() < partitions {
                                                br; span.note { "in partitions " (quota.partitions.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) }
                                            }
                                        }
                                        td rowspan=(rows) {
                                            @for (j, principal) in quota.view.principals.iter().enumerate() {
                                                @if j > 0 { ", " }
                                                (bdi(principal))
                                            }
                                        }
                                    }
                                    td { @if let Some(kind) = kind { (bdi(kind)) } @else { "–" } }
                                    td.num {
                                        @if let Some(max) = max {
                                            (held.map_or(0, Vec::len)) " / " (max)
                                        }
                                    }
                                    td {
                                        @if let Some(pool) = &pool {
                                            "pool " (link("/ui/pools", pool.as_str())) ": "
                                            @match held {
                                                Some(held) if !held.is_empty() => {
                                                    @for (j, h) in held.iter().enumerate() {
                                                        @if j > 0 { ", " }
                                                        (link("/ui/resources", &h.holder))
                                                    }
                                                }
                                                _ => { "nothing" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page(Page::new("Pools").under("/ui/pools"), body))
}

/// `GET /ui/pools/{name}`
pub(crate) async fn one<L: Log>(State(ui): State<Arc<Ui<L>>>, name: Result<Path<String>, PathRejection>) -> Response {
    let name = match name_param(name, "a pool name", |n| PoolName::new(n)) {
        Ok(name) => name,
        Err(response) => return response,
    };
    match render_one(&ui, &name) {
        Ok(Some(markup)) => markup.into_response(),
        Ok(None) => not_found("pool", &name),
        Err(e) => unavailable(e),
    }
}

/// A held identifier, its holder, and whether the holder is an orphan its pool holds it for.
struct Held {
    holder: HolderView,
    for_orphan: bool,
}

fn render_one<L: Log>(ui: &Ui<L>, name: &str) -> Result<Option<Markup>, leasehold_projector::Error> {
    let reader = &ui.api.reader;
    let now = now_ms();
    let Some(pool) = reader.pools()?.into_iter().find(|p| p.name == name).map(|p| p.at(now)) else {
        return Ok(None);
    };
    let mut held = Vec::new();
    for holder in reader.holders(name)? {
        // The pool's partition does not know what became of a holder in another: its own record says.
        let resource = match holder.holder.parse::<ResourceRef>() {
            Ok(reference) => reader.resource(&reference)?,
            Err(_) => None,
        };
        let for_orphan = resource.is_some_and(|r| {
            r.state == "orphaned" || r.claims.iter().any(|c| c.pool == name && c.status == "held-for-orphan")
        });
        held.push(Held { holder, for_orphan });
    }
    let orphans_held = held.iter().filter(|h| h.for_orphan).count();
    let body = html! {
        section id="pool" {
            h2 { "Definition" }
            dl.fields {
                dt { "Kind" } dd { (kind_text(&pool)) }
                dt { "Size" } dd { @match size_of(&pool) { Some(size) => { (size) " identifiers" }, None => { "?" } } }
                dt { "Held" } dd { (fill(&pool)) @if orphans_held > 0 { ", " (orphans_held) " of them for orphans" } }
                dt { "Waiting" } dd { (pool.waiting) }
                dt { "Cooling" } dd { (pool.cooling) " now" }
                dt { "Cool-down" } dd { (Millis(pool.cooldown_ms)) }
                dt { "Orphans" } dd {
                    (pool.orphans)
                    @if pool.orphans == "hold" { " (an orphan's identifier is kept until its agent confirms the destroy or an operator frees it)" }
                    @else { " (an orphan's identifier is freed when its agent is declared gone)" }
                }
                dt { "As of" } dd { "outcome " (pool.as_of) ", " (timestamp(pool.updated_at)) }
            }
            p { a href={ "/ui/feed?key=" (encode(&format!("@{name}"))) } { "Its outcomes in the live feed" } }
        }
        section id="held" {
            h2 { "Held " span.count { (held.len()) } }
            @if held.is_empty() { p { "Nothing is held." } }
            @else {
                table {
                    thead { tr { th { "Identifier" } th { "Holder" } th.num { "Token" } th { "" } } }
                    tbody {
                        @for h in &held {
                            tr {
                                td.mono { (h.holder.value) }
                                td { (link("/ui/resources", &h.holder.holder)) }
                                td.num { @match h.holder.token { Some(token) => { (token) }, None => { "–" } } }
                                td {
                                    @if h.for_orphan {
                                        span.badge.warn { "held for an orphan" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        section id="cooling" {
            h2 { "Cooling " span.count { (pool.cooling_values.len()) } }
            @if pool.cooling_values.is_empty() { p { "No identifier is cooling." } }
            @else {
                p.note { "Freed identifiers, not handed out again before their cool-down ends; earliest end first." }
                table {
                    thead { tr { th { "Identifier" } th { "Cool-down ends" } } }
                    tbody {
                        @for cooling in &pool.cooling_values {
                            tr {
                                td.mono { (cooling.value) }
                                td { (timestamp(cooling.until)) " (in " (super::age(cooling.until, now)) ")" }
                            }
                        }
                    }
                }
            }
        }
        section id="waiting" {
            h2 { "Waiting " span.count { (pool.waiters.len()) } }
            @if pool.waiters.is_empty() { p { "Nobody waits for an identifier." } }
            @else {
                p.note { "First come, first granted." }
                ol {
                    @for waiter in &pool.waiters { li { (link("/ui/resources", waiter)) } }
                }
            }
        }
    };
    Ok(Some(page(Page::new(format!("Pool {name}")).under("/ui/pools"), body)))
}
