//! `GET /ui/feed`: the live feed — the latest outcomes read from the log, newest first, one line each (who asked
//! for what, on which key, and what was decided, with links to what it is about), filtered by key, command type and
//! rejection. The page is whole without JavaScript (as of its loading); the script follows `/v1/events` from the
//! outcome after the last one read and adds each new one at the top, filtered the same way.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::ids::Key;
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{Command, Decision, Outcome, codec};
use maud::{Markup, html};

use super::{Page, Ui, bdi, encode, link, page, problem, timestamp};
use crate::events::About;

/// How many lines the page shows.
const SHOWN: usize = 50;
/// The most outcomes the page reads back through to find them (filters may keep few).
const SCAN: usize = 5_000;
/// How far back (in outcome sequences) a key's outcomes are looked for: its index makes each read cheap, but a key
/// with few outcomes in a long log would otherwise be looked for back to the start.
const KEYED_SPAN: u64 = 1_000_000;
/// Outcomes read from the log at once.
const READ_CHUNK: usize = 500;
/// The most lines the script keeps (the oldest go first).
const KEPT: usize = 200;

/// The filters, as the form sends them.
#[derive(Debug, Default)]
struct Filters {
    /// The key as the log and the events name it (`w1`, `@ips`), and parsed.
    key_text: String,
    key: Option<Key>,
    type_name: Option<&'static str>,
    rejected: bool,
}

impl Filters {
    fn parse(pairs: &[(String, String)]) -> Result<Filters, Markup> {
        let mut filters = Filters::default();
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in pairs {
            let value = value.trim();
            // A filter given twice would mean whichever came last: it is refused, as the API refuses it.
            if ["key", "type", "rejected"].contains(&name.as_str()) {
                if seen.contains(&name.as_str()) {
                    return Err(html! { code { (name) } " is given twice." });
                }
                seen.push(name);
            }
            match name.as_str() {
                "key" if value.is_empty() => {}
                "key" => match value.parse::<Key>() {
                    Ok(key) => {
                        filters.key_text = key.token();
                        filters.key = Some(key);
                    }
                    Err(e) => {
                        return Err(html! {
                            (bdi(value)) " is not a key: an agent name (" code { "w1" } "), or a pool's name after @ ("
                            code { "@ips" } "): " (e.to_string())
                        });
                    }
                },
                "type" if value.is_empty() => {}
                "type" => match Command::TYPE_NAMES.iter().find(|t| **t == value) {
                    Some(t) => filters.type_name = Some(t),
                    None => return Err(html! { "No command type is called " (bdi(value)) "." }),
                },
                "rejected" => filters.rejected = matches!(value, "1" | "on" | "true"),
                other => {
                    return Err(html! {
                        "This page takes " code { "key" } ", " code { "type" } " and " code { "rejected" } ", not "
                        (bdi(other)) "."
                    });
                }
            }
        }
        Ok(filters)
    }

    /// Whether a line shows `outcome` (the key is the log's filter).
    fn keeps(&self, outcome: &Outcome) -> bool {
        self.type_name.is_none_or(|t| outcome.command.type_name == t)
            && (!self.rejected || outcome.rejection().is_some())
            && self.key.as_ref().is_none_or(|key| outcome.command.key == *key)
    }
}

/// The latest outcomes the filters keep, newest first, and how far the log was read.
struct Latest {
    lines: Vec<(u64, Outcome)>,
    /// The last outcome sequence when the page was read: the script follows from the one after.
    end: u64,
    /// The earliest sequence read, when the reading stopped before the log's start with fewer than [`SHOWN`] lines.
    stopped_at: Option<u64>,
}

/// Reads the log backwards in windows (each read forwards, as the log reads), doubling them, until [`SHOWN`] lines
/// are found, [`SCAN`] outcomes were read, or the log's start.
async fn latest<L: Log>(log: &L, filters: &Filters) -> Result<Latest, String> {
    let (filter, end, span) = match &filters.key {
        Some(key) => {
            let partition = partition_of_key(key, log.partitions());
            let end = log.last_outcome_seq(partition).await.map_err(|e| e.to_string())?;
            (OutcomeFilter::Key { partition, key: key.token() }, end, KEYED_SPAN)
        }
        None => {
            let mut end = 0;
            for partition in 0..log.partitions() {
                end = end.max(log.last_outcome_seq(partition).await.map_err(|e| e.to_string())?);
            }
            // Every sequence is an outcome: the span read is what is read.
            (OutcomeFilter::All, end, SCAN as u64)
        }
    };
    let (mut lines, mut read, mut hi, mut window) = (Vec::new(), 0, end, 2 * SHOWN as u64);
    while hi > 0 && lines.len() < SHOWN && read < SCAN && end - hi < span {
        let lo = hi.saturating_sub(window.min(span - (end - hi)) - 1).max(1);
        let mut chunk = Vec::new();
        let mut from = lo;
        'window: while from <= hi {
            let batch = log.read_outcomes(&filter, from, READ_CHUNK).await.map_err(|e| e.to_string())?;
            let Some(last) = batch.last().map(|stored| stored.seq) else { break };
            for stored in batch {
                if stored.seq > hi {
                    break 'window;
                }
                chunk.push(stored);
            }
            from = last + 1;
        }
        read += chunk.len();
        for stored in chunk.into_iter().rev() {
            let outcome = codec::decode_outcome(&stored.payload)
                .map_err(|e| format!("the outcome at {} cannot be read: {e}", stored.seq))?;
            if filters.keeps(&outcome) && lines.len() < SHOWN {
                lines.push((stored.seq, outcome));
            }
        }
        hi = lo - 1;
        window = window.saturating_mul(2);
    }
    let stopped_at = (lines.len() < SHOWN && hi > 0).then_some(hi + 1);
    Ok(Latest { lines, end, stopped_at })
}

/// `GET /ui/feed?key=&type=&rejected=`
pub(crate) async fn get<L: Log>(
    State(ui): State<Arc<Ui<L>>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let bad = |why: Markup| {
        problem(
            StatusCode::BAD_REQUEST,
            "Bad filter",
            html! { p { (why) } p { a href="/ui/feed" { "The whole feed" } } },
        )
    };
    let pairs = match query {
        Ok(Query(pairs)) => pairs,
        Err(e) => return bad(html! { (e.body_text()) }),
    };
    let filters = match Filters::parse(&pairs) {
        Ok(filters) => filters,
        Err(why) => return bad(why),
    };
    match latest(&ui.api.log, &filters).await {
        Ok(latest) => render(&filters, &latest).into_response(),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            html! { p { "The log cannot be read: " (bdi(&e)) } },
        ),
    }
}

/// The link to what a key names: an agent's page, a pool's page; a placement has none.
fn key_link(key: &Key) -> Markup {
    match key {
        Key::Agent(agent) => link("/ui/agents", agent.as_str()),
        Key::Pool(pool) => html! { "@" (link("/ui/pools", pool.as_str())) },
        Key::Placement(resource) => html! { "placement " (resource.to_string()) },
    }
}

/// The command types whose accepted outcomes are routine (an agent saying it is alive): their lines are muted.
const ROUTINE: &[&str] = &["agent.heartbeat"];

/// One outcome as a line: the script (`assets/app.js`, `feedLine`) builds the same from the event's data.
pub(crate) fn line(seq: u64, outcome: &Outcome) -> Markup {
    let about = About::of(outcome);
    let key_pool = match &outcome.command.key {
        Key::Pool(pool) => Some(pool.to_string()),
        _ => None,
    };
    let pools: Vec<&String> = about.pools.iter().filter(|p| Some(*p) != key_pool.as_ref()).collect();
    // What it is about, by sort (its key's pool is linked already), each sort a group of links.
    let groups: Vec<(&str, &str, Vec<&String>)> = [
        ("resource", "/ui/resources", about.resources.iter().collect()),
        ("lease", "/ui/leases", about.leases.iter().collect()),
        ("pool", "/ui/pools", pools),
    ]
    .into_iter()
    .filter(|(_, _, names)| !names.is_empty())
    .collect();
    let command = &outcome.command;
    let class = match outcome.rejection() {
        Some(_) => Some("rejected"),
        None => ROUTINE.contains(&command.type_name.as_str()).then_some("routine"),
    };
    html! {
        li class=[class] data-seq=(seq) {
            a.seq href={ "/ui/commands/" (encode(&command.id.to_string())) } { "#" (seq) }
            " " (timestamp(outcome.decided_at.0)) " "
            code { (command.type_name) }
            " on " (key_link(&command.key))
            " by " (bdi(command.issuer.as_str()))
            @if outcome.part > 0 { " (part " (outcome.part + 1) ")" }
            ": "
            @match &outcome.decision {
                Decision::Accepted { effects, .. } => {
                    span.badge.good { "accepted" } " " (effects.len()) @if effects.len() == 1 { " effect" } @else { " effects" }
                }
                Decision::Rejected(rejection) => {
                    span.badge.bad { "rejected" } " " (bdi(&rejection.to_string()))
                }
            }
            @if !groups.is_empty() {
                div.effects {
                    "about "
                    @for (g, (word, prefix, names)) in groups.iter().enumerate() {
                        @if g > 0 { "; " }
                        @for (i, name) in names.iter().enumerate() { @if i > 0 { ", " } (word) " " (link(prefix, name)) }
                    }
                    @if about.more > 0 { " and " (about.more) " more" }
                }
            }
        }
    }
}

fn render(filters: &Filters, latest: &Latest) -> Markup {
    let mut events = format!("/v1/events?from={}", latest.end + 1);
    if !filters.key_text.is_empty() {
        events.push_str(&format!("&key={}", encode(&filters.key_text)));
    }
    let body = html! {
        form.filters method="get" action="/ui/feed" {
            label { "Key (agent, or @pool)" input type="text" name="key" value=(filters.key_text) placeholder="w1 or @ips"; }
            label {
                "Command type"
                select name="type" {
                    option value="" { "any" }
                    @for t in Command::TYPE_NAMES {
                        option value=(t) selected[filters.type_name == Some(*t)] { (t) }
                    }
                }
            }
            label { "Rejected only" input type="checkbox" name="rejected" value="1" checked[filters.rejected]; }
            button type="submit" { "Show" }
        }
        section id="outcomes" {
            p.note {
                "The latest " (SHOWN) " outcomes"
                @if filters.key.is_some() || filters.type_name.is_some() || filters.rejected { " these filters keep" }
                ", newest first, as of outcome " (latest.end) " when this page was loaded. Each line: its sequence "
                "(a link to the command), when it was decided, the command's type, the agent or pool it was about, "
                "who sent it, and what was decided."
                @if let Some(at) = latest.stopped_at {
                    " Only " (latest.lines.len()) " were found reading back to outcome " (at) "."
                }
            }
            p id="feed-status" class="note" {
                "Not following: without JavaScript this list stays as it was loaded; reload the page for newer "
                "outcomes. With it, each outcome decided from now on is added at the top."
            }
            @if latest.lines.is_empty() { p.empty { "No outcome to show." } }
            ol id="feed" class="timeline"
                data-events=(events)
                data-key=(filters.key_text)
                data-type=(filters.type_name.unwrap_or(""))
                data-rejected=(if filters.rejected { "1" } else { "" })
                data-max=(KEPT)
                data-routine=(ROUTINE.join(" "))
            {
                @for (seq, outcome) in &latest.lines { (line(*seq, outcome)) }
            }
        }
    };
    page(Page::new("Live feed").under("/ui/feed"), body)
}
