//! The query commands (`get`, `ls`, `leases`, `agents`, `pool ls`, `command`, `watch`, `dlq ls`): each reads the
//! gateway's read models and prints them as a table or as the gateway's own JSON.

use anyhow::{Context, bail};
use leasehold_schemas::{CommandId, Key, ResourceRef};
use serde_json::Value;

use crate::GlobalArgs;
use crate::client::{CommandStatus, Follower, Gateway};
use crate::output::{self, Clock, OutputFormat, Table, cell};

/// `leasehold ls`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LsArgs {
    /// Only the resources of this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Only resources in this state (`pending`, `active`, `paused`, `suspect`, `releasing`, `destroyed`, `lost`,
    /// `orphaned`, `failed`).
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// Only resources of this kind.
    #[arg(long)]
    pub(crate) kind: Option<String>,
    #[command(flatten)]
    pub(crate) list: ListArgs,
}

/// `leasehold leases`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LeasesArgs {
    /// The resource, `<agent>.<id>`; default: every lease.
    #[arg(value_name = "REF")]
    pub(crate) resource: Option<ResourceRef>,
    #[command(flatten)]
    pub(crate) list: ListArgs,
}

/// What `ls` and `leases` share: filters the gateway applies, paging, and `--watch`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ListArgs {
    /// Only records with this attribute (`leases`: whose resource has it), `name=value` (repeatable: all must match).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = crate::produce::parse_attr)]
    pub(crate) attrs: Vec<(String, String)>,
    /// Only leases of this holder (`ls`: resources with a live lease of this holder).
    #[arg(long)]
    pub(crate) holder: Option<String>,
    /// Also the records that ended (destroyed, failed, lost, orphaned resources; released, expired... leases) more
    /// than an hour ago, which are left out otherwise.
    #[arg(long)]
    pub(crate) all: bool,
    /// At most this many, in reference order; when there are more, stderr says how to ask for the next ones.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) limit: Option<u32>,
    /// Only the records after this reference (the next page: what `--limit` said).
    #[arg(long, value_name = "REF")]
    pub(crate) after: Option<String>,
    /// Draw the table again whenever the gateway's event feed reports an outcome (at most a few times a second),
    /// until Ctrl-C.
    #[arg(long, conflicts_with = "after")]
    pub(crate) watch: bool,
}

impl ListArgs {
    /// The query parameters of the gateway's list.
    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        let mut query: Vec<(&'static str, String)> =
            self.attrs.iter().map(|(name, value)| ("attr", format!("{name}={value}"))).collect();
        query.extend(self.holder.clone().map(|h| ("holder", h)));
        if self.all {
            query.push(("all", "true".to_owned()));
        }
        query.extend(self.limit.map(|l| ("limit", l.to_string())));
        query.extend(self.after.clone().map(|a| ("after", a)));
        query
    }
}

/// `leasehold watch`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct WatchArgs {
    /// Only the outcomes of this agent, or of a pool written `@name`; default: every outcome.
    #[arg(long)]
    pub(crate) key: Option<Key>,
    /// Start at this outcome sequence (`1`: from the beginning); default: only outcomes from now on. After a
    /// restart of the gateway, `watch` resumes after the last outcome it printed (before it printed any, from now
    /// on again).
    #[arg(long)]
    pub(crate) from: Option<u64>,
}

/// `leasehold dlq ls`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DlqLsArgs {
    /// Start at this dead-letter sequence.
    #[arg(long)]
    pub(crate) from: Option<u64>,
    /// At most this many (the gateway gives at most 1000 at once).
    #[arg(long)]
    pub(crate) limit: Option<usize>,
}

/// What `get` shows: a resource by its reference, or one allocated without an agent by its id alone (`~` before
/// it is accepted too, as the placement's key is written).
#[derive(Debug, Clone)]
pub(crate) enum GetTarget {
    Resource(ResourceRef),
    Placement(leasehold_schemas::ResourceId),
}

impl std::str::FromStr for GetTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(reference) = s.parse::<ResourceRef>() {
            return Ok(GetTarget::Resource(reference));
        }
        match s.strip_prefix('~').unwrap_or(s).parse::<leasehold_schemas::ResourceId>() {
            Ok(id) => Ok(GetTarget::Placement(id)),
            Err(_) => Err(format!("{s:?} is neither a resource reference (<agent>.<id>) nor a resource id")),
        }
    }
}

/// The query commands, as `lib.rs` dispatches them.
#[derive(Debug)]
pub(crate) enum QueryCmd {
    Get(ResourceRef),
    Placement(leasehold_schemas::ResourceId),
    Ls(LsArgs),
    Leases(LeasesArgs),
    Agents,
    Pools,
    Command(CommandId),
    Watch(WatchArgs),
    DeadLetters(DlqLsArgs),
}

pub(crate) async fn run(command: QueryCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    let gateway = crate::client::gateway(global)?;
    let format = global.output;
    let clock = Clock::system();
    match command {
        QueryCmd::Get(reference) => {
            output::know("ref", &reference);
            let Some(record) = gateway.get::<Value>(&["v1", "resources", &reference.to_string()], &[]).await? else {
                bail!("no resource {reference} is known (the gateway at {} answered 404)", global.server);
            };
            print(format, &record, |r| resource_fields(r, &clock))?;
        }
        QueryCmd::Placement(id) => {
            output::know("id", id);
            let Some(placement) = gateway.get::<Value>(&["v1", "placements", &id.to_string()], &[]).await? else {
                bail!(
                    "no placement of {id} is known (the gateway at {} answered 404); a resource allocated with --agent \
                     is shown by its reference, <agent>.<id>",
                    global.server
                );
            };
            let placed = placement.get("reference").and_then(Value::as_str).map(str::to_owned);
            let record = match &placed {
                Some(reference) => gateway.get::<Value>(&["v1", "resources", reference], &[]).await?,
                None => None,
            };
            match (record, format) {
                (Some(record), _) => print(format, &record, |r| resource_fields(r, &clock))?,
                (None, OutputFormat::Json) => output::emit(&output::json(&placement)?),
                (None, OutputFormat::Table) => output::emit(&placement_fields(&placement, &clock)),
            }
        }
        QueryCmd::Ls(args) => {
            let mut query: Vec<(&str, String)> = [("agent", args.agent), ("state", args.state), ("kind", args.kind)]
                .into_iter()
                .filter_map(|(name, value)| Some((name, value?)))
                .collect();
            query.extend(args.list.query());
            let segments = ["v1", "resources"];
            listing(&gateway, &segments, &query, &args.list, format, &|r, c| resources_table(r, c)).await?;
        }
        QueryCmd::Leases(args) => {
            let mut query: Vec<(&str, String)> = args.resource.iter().map(|r| ("resource", r.to_string())).collect();
            query.extend(args.list.query());
            let segments = ["v1", "leases"];
            listing(&gateway, &segments, &query, &args.list, format, &|r, c| leases_table(r, c)).await?;
        }
        QueryCmd::Agents => {
            let records = list(&gateway, &["v1", "agents"], &[]).await?;
            print(format, &records, |r| agents_table(r, &clock))?;
        }
        QueryCmd::Pools => {
            let records = list(&gateway, &["v1", "pools"], &[]).await?;
            print(format, &records, pools_table)?;
        }
        QueryCmd::DeadLetters(args) => {
            let query: Vec<(&str, String)> =
                [("from", args.from.map(|f| f.to_string())), ("limit", args.limit.map(|l| l.to_string()))]
                    .into_iter()
                    .filter_map(|(name, value)| Some((name, value?)))
                    .collect();
            let records = list(&gateway, &["v1", "dlq"], &query).await?;
            print(format, &records, dead_letters_table)?;
        }
        QueryCmd::Command(id) => {
            output::know("command_id", id);
            let Some(status) = gateway.get::<CommandStatus>(&["v1", "commands", &id.to_string()], &[]).await? else {
                bail!("no command {id} is known (the gateway at {} answered 404)", global.server);
            };
            match format {
                OutputFormat::Json => output::emit(&output::json(&status)?),
                OutputFormat::Table => output::emit(&command_text(&status, &clock)),
            }
        }
        QueryCmd::Watch(args) => watch(&gateway, args, format).await?,
    }
    Ok(())
}

/// A list the gateway answers with an array.
async fn list(gateway: &Gateway, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<Vec<Value>> {
    gateway.get::<Vec<Value>>(segments, query).await?.with_context(|| format!("/{} is not there", segments.join("/")))
}

/// A table the gateway answers in pages (`ls`, `leases`): one page (every record without `--limit`), with a note on
/// stderr naming the next when there is one; with `--watch`, drawn again at each outcome of the event feed.
async fn listing(
    gateway: &Gateway,
    segments: &[&str],
    query: &[(&str, String)],
    args: &ListArgs,
    format: OutputFormat,
    table: &dyn Fn(&Vec<Value>, &Clock) -> String,
) -> anyhow::Result<()> {
    if args.watch {
        return watch_list(gateway, segments, query, format, table).await;
    }
    let (records, next) = gateway
        .get_page::<Vec<Value>>(segments, query)
        .await?
        .with_context(|| format!("/{} is not there", segments.join("/")))?;
    print(format, &records, |r| table(r, &Clock::system()))?;
    if let Some(next) = next {
        eprintln!(
            "{} shown; there may be more: the next ones with --after {}",
            records.len(),
            leasehold_schemas::text::shown(&next)
        );
    }
    Ok(())
}

/// How often at most `--watch` draws its table again.
const REDRAW_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Draws the list, then again whenever the event feed reports outcomes (those that land within [`REDRAW_EVERY`] of a
/// drawing make one more drawing), until Ctrl-C. On a terminal each drawing replaces the last; otherwise each is
/// printed after the last (json: one array a line).
async fn watch_list(
    gateway: &Gateway,
    segments: &[&str],
    query: &[(&str, String)],
    format: OutputFormat,
    table: &dyn Fn(&Vec<Value>, &Clock) -> String,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let terminal = std::io::stdout().is_terminal();
    let mut clock = Clock::system();
    let draw = async |clock: &Clock| -> anyhow::Result<()> {
        let records = list(gateway, segments, query).await?;
        match format {
            OutputFormat::Json => output::emit(&format!("{}\n", serde_json::to_string(&records)?)),
            OutputFormat::Table if terminal => output::emit(&format!("\x1b[H\x1b[2J{}", table(&records, clock))),
            OutputFormat::Table => output::emit(&format!("{}\n", table(&records, clock))),
        }
        Ok(())
    };
    // The feed is open before the first drawing: an outcome that lands while it is drawn makes the next one.
    let mut follower = Follower::new(gateway.clone(), None, None);
    follower.open().await?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    draw(&clock).await?;
    let mut last = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            event = follower.next() => { event?; }
        }
        // Outcomes come in bursts: gather those of the next moment into one drawing.
        let at = last + REDRAW_EVERY;
        loop {
            tokio::select! {
                _ = &mut interrupted => return Ok(()),
                () = tokio::time::sleep_until(at) => break,
                event = follower.next() => { event?; }
            }
        }
        clock.now = output::now_ms();
        draw(&clock).await?;
        last = tokio::time::Instant::now();
    }
}

fn print<T: serde::Serialize>(format: OutputFormat, value: &T, table: impl Fn(&T) -> String) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => output::emit(&output::json(value)?),
        OutputFormat::Table => output::emit(&table(value)),
    }
    Ok(())
}

pub(crate) fn resource_fields(record: &Value, clock: &Clock) -> String {
    let attrs = match &record["attrs"] {
        Value::Object(map) => map.iter().map(|(k, v)| format!("{k}={}", cell(v))).collect::<Vec<_>>().join(" "),
        other => cell(other),
    };
    let claims = match &record["claims"] {
        Value::Array(claims) => claims.iter().map(claim_text).collect::<Vec<_>>().join(", "),
        other => cell(other),
    };
    let leases = match &record["leases"] {
        Value::Array(leases) => leases
            .iter()
            .map(|l| match l {
                Value::Object(_) => format!("{} ({}, {})", cell(&l["id"]), cell(&l["state"]), cell(&l["holder"])),
                other => cell(other),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => cell(other),
    };
    let mut rows = vec![
        ("ref", cell(&record["ref"])),
        ("kind", cell(&record["kind"])),
        ("state", cell(&record["state"])),
        ("detail", detail_text(record, clock)),
    ];
    // Only a lost resource's handle is ever quarantined: the line is left out otherwise.
    if !record["quarantined"].is_null() {
        rows.push(("quarantined", quarantine_text(record, clock)));
    }
    // What a waiting state waits on, and for how long.
    if let Some(waiting) = record.get("waiting_on").filter(|w| w.is_object()) {
        let since =
            waiting["since"].as_u64().map(|ms| format!(" (since {}, {})", clock.time(Some(ms)), clock.ago(Some(ms))));
        // The gateway words it with UTC times; people read them in their zone.
        let on = clock.localize(&cell(&waiting["on"]));
        rows.push(("waiting_on", format!("{on}{}", since.unwrap_or_default())));
    }
    // Only while a destroy waits for something else to let go of the resource.
    if let Some(blocked) = record.get("destroy_blocked").filter(|b| !b.is_null()) {
        let since =
            blocked["at"].as_u64().map(|ms| format!(" (since {}, {})", clock.time(Some(ms)), clock.ago(Some(ms))));
        rows.push(("destroy_blocked", format!("{}{}", cell(&blocked["detail"]), since.unwrap_or_default())));
    }
    rows.extend([
        ("capacity", cell(&record["capacity"])),
        ("attrs", none_if_empty(attrs)),
        ("parent", cell(&record["parent"])),
        ("native_id", cell(&record["native_id"])),
        ("claims", none_if_empty(claims)),
        ("leases", none_if_empty(leases)),
        ("created_seq", cell(&record["created_seq"])),
        ("updated_at", clock.when(record["updated_at"].as_u64())),
    ]);
    output::fields(&rows)
}

/// A placement not (or not yet) made into a resource, field by field.
fn placement_fields(placement: &Value, clock: &Clock) -> String {
    let text = |name: &str| placement.get(name).and_then(Value::as_str).unwrap_or("").to_owned();
    let ms = |name: &str| placement.get(name).and_then(Value::as_u64);
    let state = text("state");
    let why = text("why");
    let since = ms("since").map(|t| format!("since {}", clock.when(Some(t)))).unwrap_or_default();
    let waiting_on = match state.as_str() {
        "waiting" => format!("placement waiting for room ({why}) {since}"),
        "seeking" => format!("placement seeking an agent {since}"),
        _ => String::new(),
    };
    let select: Vec<String> = placement
        .get("select")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
        .unwrap_or_default();
    // Placed: where, and how full the agent was with it (the resource itself shows once its agent's partition has
    // made it and the projection has it).
    let placed_on = match (placement.get("reference").and_then(Value::as_str), ms("used"), ms("capacity")) {
        (Some(reference), Some(used), Some(capacity)) => {
            format!("{reference} ({used} of {capacity} {})", text("kind"))
        }
        (Some(reference), _, _) => reference.to_owned(),
        _ => String::new(),
    };
    output::fields(&[
        ("id", text("resource")),
        ("kind", text("kind")),
        ("state", format!("placement {state}")),
        ("placed_on", none_if_empty(placed_on)),
        ("select", none_if_empty(select.join(","))),
        ("strategy", text("strategy")),
        ("why", none_if_empty(if state == "waiting" { String::new() } else { why.clone() })),
        ("waiting_on", none_if_empty(waiting_on)),
        ("asked_at", clock.when(ms("asked_at"))),
        ("wait_until", clock.when(ms("until"))),
    ])
}

/// Why a resource is in its state, in words where the record says it in a known shape: a release's cause, and the
/// reason every terminal state keeps; anything else as the record has it.
fn detail_text(record: &Value, clock: &Clock) -> String {
    let detail = &record["detail"];
    match (record["state"].as_str(), detail) {
        (Some("releasing"), Value::Object(_)) => format!("released: {}", cause_text(detail)),
        (Some("destroyed"), Value::Object(_)) => {
            let confirmed = format!("destroyed, as its agent {} confirmed", cell(&detail["confirmed_by"]));
            match &detail["release"] {
                Value::Null => confirmed,
                cause => format!("{confirmed}, after {}", cause_text(cause)),
            }
        }
        (Some("lost"), Value::Object(_)) => format!(
            "found missing by its agent {} (observation {} of epoch {})",
            cell(&detail["found_missing_by"]),
            cell(&detail["observation"]["obs"]),
            cell(&detail["observation"]["epoch"])
        ),
        (Some("orphaned"), Value::Object(_)) if detail["freed_because"].is_string() => {
            // The record says when in UTC, for programs; people read it in their zone.
            let because = clock.localize(&cell(&detail["freed_because"]));
            format!("freed because {because}")
        }
        _ => cell(detail),
    }
}

/// A release cause (`{"released": {"by", "reason"}}`, `{"create-timeout": {}}`...) in words.
fn cause_text(cause: &Value) -> String {
    let Some((name, fields)) = cause.as_object().filter(|c| c.len() == 1).and_then(|c| c.iter().next()) else {
        return cell(cause);
    };
    let reason = |field: &str| match &fields[field] {
        Value::Null => String::new(),
        value => format!(" ({})", cell(value)),
    };
    match name.as_str() {
        "released" => format!("a release by {}{}", cell(&fields["by"]), reason("reason")),
        "health-check-failed" => format!("a failed health check{}", reason("detail")),
        "parent-left" => format!("its parent {} left", cell(&fields["parent"])),
        "parent-absent" => format!("its parent {} was never known", cell(&fields["parent"])),
        "create-timeout" => "its create timed out".to_owned(),
        "agent-retired" => "its agent was retired".to_owned(),
        "drained" => {
            let when =
                if fields["deadline"].as_bool() == Some(true) { "at its deadline" } else { "idle past its grace" };
            format!("a drain asked for by {}, {when}", cell(&fields["by"]))
        }
        "wait-timeout" => format!("waiting {} for its pools", output::duration(fields["waited"].as_u64())),
        "over-quota" => match serde_json::from_value(cause.clone()) {
            Ok(leasehold_schemas::outcome::ReleaseCause::OverQuota { quota, kind, max, held, holders }) => {
                leasehold_cli_common::timeline::over_quota(&quota, &kind, max, held, &holders)
            }
            _ => cell(cause),
        },
        _ => cell(cause),
    }
}

/// A lost resource's handle found on its machine again: quarantined until a release orders it destroyed.
fn quarantine_text(record: &Value, clock: &Clock) -> String {
    let q = &record["quarantined"];
    if !q.is_object() {
        return "-".to_owned();
    }
    let found =
        format!("its handle reappeared at {} (position {})", clock.when(q["found_at"].as_u64()), cell(&q["position"]));
    match (&q["destroy_ordered"], q["destroyed_at"].as_u64()) {
        (Value::Null, _) => format!(
            "{found}; the agent leaves it alone until `leasehold release {}` orders it destroyed",
            cell(&record["ref"])
        ),
        (ordered, None) => {
            format!("{found}; ordered destroyed at position {} by {}", cell(ordered), cell(&q["released_by"]))
        }
        (ordered, Some(at)) => format!(
            "{found}; ordered destroyed at position {} by {}, destroyed at {}",
            cell(ordered),
            cell(&q["released_by"]),
            clock.when(Some(at))
        ),
    }
}

/// A resource's state for a list: a lost one whose handle is quarantined says so.
fn state_text(record: &Value) -> String {
    let q = &record["quarantined"];
    match (cell(&record["state"]), q.is_object()) {
        (state, true) if q["destroy_ordered"].is_null() => format!("{state} (quarantined)"),
        (state, true) if q["destroyed_at"].is_null() => format!("{state} (quarantined, destroy ordered)"),
        (state, _) => state,
    }
}

/// One claim of a resource: what it holds, or that it still waits for its pool (a pending resource is created only
/// once every claim is bound).
fn claim_text(claim: &Value) -> String {
    match claim["status"].as_str() {
        Some("wanted") => format!("{}: waiting for pool {}", cell(&claim["pool"]), cell(&claim["pool"])),
        _ => format!(
            "{}={} ({}, token {})",
            cell(&claim["pool"]),
            cell(&claim["id"]),
            cell(&claim["status"]),
            cell(&claim["token"])
        ),
    }
}

/// Why an agent is suspect: its breaker, from its record (`-` when it holds no breaker).
fn breaker_text(agent: &Value, clock: &Clock) -> String {
    match &agent["breaker"] {
        Value::Object(_) => format!(
            "breaker: a report would lose {} of {} live, tripped {}; confirm with `leasehold agent confirm-loss {}`",
            cell(&agent["breaker"]["would_lose"]),
            cell(&agent["breaker"]["live"]),
            clock.when(agent["breaker"]["tripped_at"].as_u64()),
            cell(&agent["name"])
        ),
        _ => "-".to_owned(),
    }
}

fn none_if_empty(text: String) -> String {
    if text.is_empty() { "-".to_owned() } else { text }
}

fn count(value: &Value) -> String {
    match value {
        Value::Array(items) => items.len().to_string(),
        other => cell(other),
    }
}

pub(crate) fn resources_table(records: &Vec<Value>, clock: &Clock) -> String {
    let mut table = Table::new(&["REF", "KIND", "STATE", "CAPACITY", "LEASES", "CLAIMS", "UPDATED"]);
    for r in records {
        let claims = match &r["claims"] {
            Value::Array(claims) => {
                claims.iter().map(|c| format!("{}={}", cell(&c["pool"]), cell(&c["id"]))).collect::<Vec<_>>().join(",")
            }
            other => cell(other),
        };
        table.row(vec![
            cell(&r["ref"]),
            cell(&r["kind"]),
            state_text(r),
            cell(&r["capacity"]),
            count(&r["leases"]),
            none_if_empty(claims),
            clock.ago(r["updated_at"].as_u64()),
        ]);
    }
    table.render()
}

#[allow(clippy::ptr_arg, reason = "the shape every table of `listing` has")]
pub(crate) fn leases_table(records: &Vec<Value>, clock: &Clock) -> String {
    // The queue of each busy resource, as the writer would grant it now (the reader's clock stands in for the log's).
    let views: Vec<leasehold_projector::LeaseView> =
        records.iter().filter_map(|r| serde_json::from_value(r.clone()).ok()).collect();
    let places = leasehold_projector::queue_places(&views, clock.now);
    let mut headers = vec!["ID", "RESOURCE", "HOLDER", "STATE", "TOKEN", "EXPIRES"];
    if !places.is_empty() {
        headers.extend(["QUEUE", "PRIORITY", "WAITING SINCE", "WAIT UNTIL"]);
    }
    // Each resource's leases together: the active ones by token, then the queue in order, then the ended ones.
    let mut rows: Vec<&Value> = records.iter().collect();
    if !places.is_empty() {
        let rank = |l: &Value| match (cell(&l["state"]).as_str(), places.get(&cell(&l["id"]))) {
            ("active", _) => (0, l["token"].as_u64().unwrap_or(0)),
            (_, Some(place)) => (1, place.position as u64),
            _ => (2, 0),
        };
        rows.sort_by_key(|l| (cell(&l["resource"]), rank(l)));
    }
    let mut table = Table::new(&headers);
    for l in rows {
        let mut row = vec![
            cell(&l["id"]),
            cell(&l["resource"]),
            cell(&l["holder"]),
            cell(&l["state"]),
            cell(&l["token"]),
            clock.ago(l["expires_at"].as_u64()),
        ];
        if !places.is_empty() {
            match places.get(&cell(&l["id"])) {
                Some(place) => row.extend([
                    place.position.to_string(),
                    format!("{} (asked {})", place.effective_priority, cell(&l["priority"])),
                    clock.ago(l["requested_at"].as_u64()),
                    clock.ago(l["wait_until"].as_u64()),
                ]),
                None => row.extend(["-".to_owned(), "-".to_owned(), "-".to_owned(), "-".to_owned()]),
            }
        }
        table.row(row);
    }
    table.render()
}

pub(crate) fn agents_table(records: &Vec<Value>, clock: &Clock) -> String {
    let mut table = Table::new(&[
        "NAME",
        "STATUS",
        "EPOCH",
        "LAST SEEN",
        "RESOURCES",
        "HELD",
        "CAPACITY",
        "DRIVER",
        "QUARANTINED",
        "WHY",
    ]);
    for a in records {
        let status = match (cell(&a["status"]), a["retired"].as_bool()) {
            // A gone agent reads `gone`, but its retirement still holds when it comes back.
            (status, Some(true)) if status != "retired" => format!("{status} (retired)"),
            (status, _) => status,
        };
        let status = match (a["drain"]["left"].as_u64(), a["cordon"].is_object()) {
            (Some(0), _) => format!("{status}, drained"),
            (Some(_), _) => format!("{status}, draining"),
            (None, true) => format!("{status}, cordoned"),
            (None, false) => status,
        };
        let driver = match a["driver"]["available"].as_bool() {
            Some(true) => "ok",
            Some(false) => "unavailable",
            None => "-",
        };
        let why: Vec<String> =
            [cordon_text(a, clock), driver_text(a), breaker_text(a, clock)].into_iter().filter(|w| w != "-").collect();
        table.row(vec![
            cell(&a["name"]),
            status,
            cell(&a["epoch"]),
            clock.ago(a["last_seen"].as_u64()),
            cell(&a["resources"]),
            cell(&a["held"]),
            capacity_text(a),
            driver.to_owned(),
            cell(&a["quarantined"]),
            if why.is_empty() { "-".to_owned() } else { why.join("; ") },
        ]);
    }
    table.render()
}

/// What an agent's declared capacity holds, kind by kind (`container 12/50, volume 0/200`; `-` without one).
fn capacity_text(agent: &Value) -> String {
    let Some(capacity) = agent["capacity"].as_object().filter(|c| !c.is_empty()) else {
        return "-".to_owned();
    };
    let used = &agent["used"];
    capacity
        .iter()
        .map(|(kind, limit)| {
            format!("{} {}/{}", leasehold_schemas::text::shown(kind), used[kind].as_u64().unwrap_or(0), cell(limit))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Who cordoned an agent, since when, and why (`-` while it is not cordoned); for a drain, how it goes too.
fn cordon_text(agent: &Value, clock: &Clock) -> String {
    let drain = &agent["drain"];
    if drain.is_object() {
        return drain_text(drain, clock);
    }
    let cordon = &agent["cordon"];
    if !cordon.is_object() {
        return "-".to_owned();
    }
    let why = match &cordon["reason"] {
        Value::Null => String::new(),
        reason => format!(": {}", cell(reason)),
    };
    format!("cordoned by {} since {}{why}", cell(&cordon["by"]), clock.when(cordon["since"].as_u64()))
}

/// A drain: how many resources are left, its deadline and grace, who asked, since when, and why.
fn drain_text(drain: &Value, clock: &Clock) -> String {
    let why = match &drain["reason"] {
        Value::Null => String::new(),
        reason => format!(": {}", cell(reason)),
    };
    let deadline = match drain["deadline"].as_u64() {
        Some(at) => format!("deadline {}", clock.when(Some(at))),
        None => "no deadline".to_owned(),
    };
    let grace = output::duration(drain["grace_ms"].as_u64());
    let state = match drain["left"].as_u64() {
        Some(0) => "drained".to_owned(),
        left => format!("draining ({} left; {deadline}; grace {grace})", output::opt(left)),
    };
    format!("{state} by {} since {}{why}", cell(&drain["by"]), clock.when(drain["since"].as_u64()))
}

/// Why an agent's driver cannot list its machine's resources, as the agent recorded it (`-` while it can).
fn driver_text(agent: &Value) -> String {
    match agent["driver"]["available"].as_bool() {
        Some(false) => format!("driver: {}", cell(&agent["driver"]["detail"])),
        _ => "-".to_owned(),
    }
}

/// A pool kind's JSON (`{"ipv4": {"network", "prefix_len", "exclude"}}`...) in a few words.
fn pool_kind(kind: &Value) -> String {
    let exclude = |v: &Value| match v.as_array() {
        Some(items) if !items.is_empty() => {
            format!(" without {}", items.iter().map(cell).collect::<Vec<_>>().join(","))
        }
        _ => String::new(),
    };
    if let Some(ipv4) = kind.get("ipv4") {
        format!("ipv4 {}/{}{}", cell(&ipv4["network"]), cell(&ipv4["prefix_len"]), exclude(&ipv4["exclude"]))
    } else if let Some(slots) = kind.get("slots") {
        format!("slots {}", cell(&slots["count"]))
    } else if let Some(ports) = kind.get("ports") {
        format!("ports {}-{}{}", cell(&ports["first"]), cell(&ports["last"]), exclude(&ports["exclude"]))
    } else {
        cell(kind)
    }
}

pub(crate) fn pools_table(records: &Vec<Value>) -> String {
    let mut table = Table::new(&["NAME", "KIND", "COOLDOWN", "ORPHANS", "HELD", "WAITING", "COOLING"]);
    for p in records {
        table.row(vec![
            cell(&p["name"]),
            pool_kind(&p["kind"]),
            output::duration(p["cooldown_ms"].as_u64()),
            // What an orphan's identifier does: `release` (at once) or `hold` (until confirmed or freed).
            p["orphans"].as_str().unwrap_or("release").to_owned(),
            cell(&p["held"]),
            cell(&p["waiting"]),
            cell(&p["cooling"]),
        ]);
    }
    table.render()
}

fn dead_letters_table(records: &Vec<Value>) -> String {
    let mut table = Table::new(&["SEQ", "PARTITION", "SOURCE SEQ", "SUBJECT", "COMMAND", "BYTES", "REASON"]);
    for d in records {
        let bytes = match &d["bytes"] {
            // The raw bytes (however the gateway spells them) are for `--output json`; the table says how many.
            Value::Array(items) => items.len().to_string(),
            Value::String(text) => format!("{} chars", text.len()),
            other => cell(other),
        };
        table.row(vec![
            cell(&d["seq"]),
            cell(&d["partition"]),
            cell(&d["source_seq"]),
            cell(&d["subject"]),
            letter_id(d),
            bytes,
            cell(&d["reason"]),
        ]);
    }
    table.render()
}

/// A dead letter's command id, marked when only its producer's `Nats-Msg-Id` names it.
fn letter_id(letter: &Value) -> String {
    match (&letter["command_id"], &letter["id_verified"]) {
        (Value::String(id), Value::Bool(false)) => format!("{id} (unverified)"),
        (id, _) => cell(id),
    }
}

fn command_text(status: &CommandStatus, clock: &Clock) -> String {
    let mut fields = vec![
        ("command", status.command_id.clone()),
        ("status", status.status.clone()),
        ("command_seq", output::opt(status.command_seq)),
        (
            "rejection",
            status.rejection.as_ref().map_or_else(|| "-".to_owned(), |r| format!("{}: {}", r.kind, r.message)),
        ),
        (
            "dead_letter",
            status.dead_letter.as_ref().map_or_else(
                || "-".to_owned(),
                |d| format!("{} (command seq {}, {})", d.reason, d.source_seq, d.subject),
            ),
        ),
    ];
    if status.dead_letter.as_ref().is_some_and(|d| d.id_verified == Some(false)) {
        fields.push((
            "id",
            "unverified: the dead letter's payload names no command id; this one is only the Nats-Msg-Id it was \
             published under"
                .to_owned(),
        ));
    }
    let mut text = output::fields(&fields);
    for outcome in &status.outcomes {
        text.push_str(&output::outcome_line(outcome.seq, &outcome.outcome, clock));
        text.push('\n');
    }
    text
}

/// Prints each outcome as it lands until interrupted (Ctrl-C ends it cleanly). When the gateway goes away (a
/// restart), it says so on stderr and connects again, resuming after the last outcome printed; a refused request
/// (`4xx`) ends it with an error.
async fn watch(gateway: &Gateway, args: WatchArgs, format: OutputFormat) -> anyhow::Result<()> {
    let key = args.key.as_ref().map(Key::token);
    let mut follower = Follower::new(gateway.clone(), key, args.from);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let clock = Clock::system();
    loop {
        let event = tokio::select! {
            _ = &mut interrupted => return Ok(()),
            event = follower.next() => event?,
        };
        match format {
            OutputFormat::Table => {
                output::emit(&format!("{}\n", output::outcome_line(event.seq, &event.outcome, &clock)));
            }
            OutputFormat::Json => output::emit(&format!("{}\n", serde_json::to_string(&event)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minute after the records' times (2026-01-01T00:00:01Z), in UTC.
    fn clock() -> Clock {
        Clock::fixed(1_767_225_661_000, crate::output::Zone::utc())
    }

    #[test]
    fn a_resource_reads_field_by_field() {
        let record = serde_json::json!({
            "ref": "w1.019b76da-9478-7111-9111-111111111111", "agent": "w1", "id": "019b76da-9478-7111-9111-111111111111",
            "kind": "container", "state": "active", "capacity": 2, "attrs": {"image": "alpine", "team": "ci"},
            "claims": [{"pool": "ips", "id": "10.20.0.7", "status": "bound", "token": 55}],
            "leases": [{"id": "w1.019b76da-9860-7333-b333-333333333333", "holder": "build-1", "state": "active"}],
            "created_seq": 40, "updated_at": 1767225601000u64, "parent": null, "detail": null, "native_id": "d41d"
        });
        let text = resource_fields(&record, &clock());
        assert!(text.contains("ref          w1.019b76da-9478-7111-9111-111111111111\n"), "{text}");
        assert!(text.contains("attrs        image=alpine team=ci\n"), "{text}");
        assert!(text.contains("claims       ips=10.20.0.7 (bound, token 55)\n"), "{text}");
        assert!(text.contains("leases       w1.019b76da-9860-7333-b333-333333333333 (active, build-1)\n"), "{text}");
        assert!(text.contains("updated_at   2026-01-01T00:00:01Z (60 s ago)\n"), "{text}");
        assert!(text.contains("parent       -\n"), "{text}");
    }

    #[test]
    fn a_placement_says_where_it_went_or_what_it_waits_on() {
        let placed = serde_json::json!({
            "resource": "019b76da-9478-7111-9111-111111111111", "kind": "volume", "select": {"zone": "a"},
            "strategy": "spread", "state": "placed", "agent": "a1",
            "reference": "a1.019b76da-9478-7111-9111-111111111111", "used": 3, "capacity": 10, "why": null,
            "asked_at": 1767225601000u64, "since": 1767225601000u64, "until": null, "as_of": 9
        });
        let text = placement_fields(&placed, &clock());
        assert!(
            text.contains(
                "state       placement placed
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "placed_on   a1.019b76da-9478-7111-9111-111111111111 (3 of 10 volume)
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "waiting_on  -
"
            ),
            "{text}"
        );
        let mut waiting = placed.clone();
        waiting["state"] = "waiting".into();
        waiting["why"] = "zone=a: 2 agents full".into();
        for field in ["agent", "reference", "used", "capacity"] {
            waiting[field] = serde_json::Value::Null;
        }
        let text = placement_fields(&waiting, &clock());
        assert!(
            text.contains(
                "placed_on   -
"
            ),
            "{text}"
        );
        assert!(text.contains("waiting_on  placement waiting for room (zone=a: 2 agents full) since"), "{text}");
    }

    #[test]
    fn pool_kinds_read_in_a_few_words() {
        let ipv4 = serde_json::json!({"ipv4": {"network": "10.20.0.0", "prefix_len": 24, "exclude": ["10.20.0.1"]}});
        assert_eq!(pool_kind(&ipv4), "ipv4 10.20.0.0/24 without 10.20.0.1");
        assert_eq!(pool_kind(&serde_json::json!({"slots": {"count": 16}})), "slots 16");
        let ports = serde_json::json!({"ports": {"first": 30000, "last": 30099, "exclude": []}});
        assert_eq!(pool_kind(&ports), "ports 30000-30099");
    }

    #[test]
    fn lists_are_one_row_each() {
        let leases = vec![serde_json::json!({"id": "w1.l", "resource": "w1.r", "holder": "h", "state": "waiting",
            "token": null, "expires_at": null, "wait_until": null})];
        assert_eq!(
            leases_table(&leases, &clock()),
            "ID    RESOURCE  HOLDER  STATE    TOKEN  EXPIRES\nw1.l  w1.r      h       waiting  -      -\n"
        );
        let agents =
            vec![serde_json::json!({"name": "w1", "status": "live", "epoch": 3, "last_seen": 1767225601000u64,
            "resources": 2, "held": 1, "retired": false, "driver": {"available": true, "detail": null},
            "quarantined": 0})];
        assert!(
            agents_table(&agents, &clock())
                .ends_with("w1    live    3      60 s ago   2          1     -         ok      0            -\n"),
            "{}",
            agents_table(&agents, &clock())
        );
    }

    #[test]
    fn an_agent_shows_its_driver_its_quarantine_and_a_retirement_that_outlives_gone() {
        let agents =
            vec![serde_json::json!({"name": "w1", "status": "gone", "epoch": 3, "last_seen": 1767225601000u64,
            "resources": 2, "held": 0, "retired": true, "quarantined": 2,
            "driver": {"available": false, "detail": "the root /srv/w1 is not mounted"}})];
        let table = agents_table(&agents, &clock());
        let row = table.lines().nth(1).expect("a row");
        assert!(row.starts_with("w1    gone (retired)  3 "), "{table}");
        assert!(row.contains(" unavailable  2 "), "{table}");
        assert!(row.ends_with("driver: the root /srv/w1 is not mounted"), "{table}");
    }

    #[test]
    fn a_cordoned_agent_says_who_since_when_and_why() {
        let agents = vec![
            serde_json::json!({"name": "w1", "status": "live", "epoch": 3, "last_seen": 1767225601000u64,
            "resources": 2, "held": 2, "retired": false, "quarantined": 0, "driver": {"available": true, "detail": null},
            "cordon": {"by": "op:alice", "reason": "kernel \u{1b}[31mupgrade", "since": 1767225600000u64}}),
        ];
        let table = agents_table(&agents, &clock());
        let row = table.lines().nth(1).expect("a row");
        assert!(row.starts_with("w1    live, cordoned  3 "), "{table}");
        let declared = vec![serde_json::json!({"name": "w1", "status": "live", "epoch": 3, "last_seen": 1u64,
            "resources": 13, "held": 12, "capacity": {"container": 50, "volume": 200}, "used": {"container": 12},
            "driver": {"available": true, "detail": null}, "quarantined": 0})];
        assert!(
            agents_table(&declared, &clock()).contains("  container 12/50, volume 0/200  "),
            "{}",
            agents_table(&declared, &clock())
        );
        assert!(
            row.ends_with("cordoned by op:alice since 2026-01-01T00:00:00Z (61 s ago): kernel \\x1b[31mupgrade"),
            "the reason is shown escaped: {table}"
        );
    }

    #[test]
    fn a_draining_agent_says_how_many_are_left_its_deadline_and_who_asked() {
        let draining = |left: u64| {
            vec![serde_json::json!({"name": "w1", "status": "live", "epoch": 3, "last_seen": 1767225601000u64,
            "resources": 2, "held": 2, "retired": false, "quarantined": 0, "driver": {"available": true, "detail": null},
            "cordon": {"by": "op:alice", "reason": "kernel upgrade", "since": 1767225600000u64},
            "drain": {"by": "op:alice", "reason": "kernel upgrade", "since": 1767225600000u64,
                "deadline": 1767232800000u64, "grace_ms": 300000, "left": left}})]
        };
        let table = agents_table(&draining(3), &clock());
        let row = table.lines().nth(1).expect("a row");
        assert!(row.starts_with("w1    live, draining  3 "), "{table}");
        assert!(
            row.ends_with(
                "draining (3 left; deadline 2026-01-01T02:00:00Z (in 1 h 58 min); grace 5min) by op:alice since \
                 2026-01-01T00:00:00Z (61 s ago): kernel upgrade"
            ),
            "{table}"
        );
        let table = agents_table(&draining(0), &clock());
        let row = table.lines().nth(1).expect("a row");
        assert!(row.starts_with("w1    live, drained  3 "), "{table}");
        assert!(row.ends_with("drained by op:alice since 2026-01-01T00:00:00Z (61 s ago): kernel upgrade"), "{table}");
        let cause = serde_json::json!({"drained": {"by": "op:alice", "deadline": true}});
        assert_eq!(cause_text(&cause), "a drain asked for by op:alice, at its deadline");
        let cause = serde_json::json!({"drained": {"by": "op:alice", "deadline": false}});
        assert_eq!(cause_text(&cause), "a drain asked for by op:alice, idle past its grace");
        let holders = ["w1.019b76da-9478-7111-9111-111111111111", "w1.019b76da-9478-7111-9111-111111111112"];
        let cause = serde_json::json!({"over-quota": {"quota": "team-a", "kind": "dir", "max": 2, "held": 2,
            "holders": holders}});
        assert_eq!(
            cause_text(&cause),
            format!("quota team-a is full for dir, 2 of 2 held: {}, {}; it gave no wait", holders[0], holders[1])
        );
    }

    #[test]
    fn terminal_states_say_why_in_words() {
        let record = |state: &str, detail: Value| serde_json::json!({"ref": "w1.r", "state": state, "detail": detail});
        let destroyed = record(
            "destroyed",
            serde_json::json!({"release": {"released": {"by": "op:alice", "reason": "done"}}, "confirmed_by": "w1"}),
        );
        assert_eq!(
            detail_text(&destroyed, &clock()),
            "destroyed, as its agent w1 confirmed, after a release by op:alice (done)"
        );
        let retired = record("destroyed", serde_json::json!({"release": {"agent-retired": {}}, "confirmed_by": "w1"}));
        assert_eq!(
            detail_text(&retired, &clock()),
            "destroyed, as its agent w1 confirmed, after its agent was retired"
        );
        let lost = record("lost", serde_json::json!({"found_missing_by": "w1", "observation": {"epoch": 3, "obs": 7}}));
        assert_eq!(detail_text(&lost, &clock()), "found missing by its agent w1 (observation 7 of epoch 3)");
        let orphaned = record(
            "orphaned",
            serde_json::json!({"agent_gone_at": 1767225601000u64,
                "freed_because": "its holder's agent w1 was declared gone at 2026-01-01T00:00:01Z (60 s ago)"}),
        );
        assert_eq!(
            detail_text(&orphaned, &clock()),
            "freed because its holder's agent w1 was declared gone at 2026-01-01T00:00:01Z (60 s ago)"
        );
        assert_eq!(detail_text(&record("failed", "no space left".into()), &clock()), "no space left");
        let releasing = record("releasing", serde_json::json!({"create-timeout": {}}));
        assert_eq!(detail_text(&releasing, &clock()), "released: its create timed out");
        assert_eq!(detail_text(&record("active", Value::Null), &clock()), "-");
    }

    #[test]
    fn a_quarantined_handle_shows_in_get_and_ls() {
        let mut record = serde_json::json!({"ref": "w1.r", "kind": "dir", "state": "lost", "capacity": 1,
            "leases": [], "claims": [], "updated_at": 1767225601000u64,
            "quarantined": {"position": 40, "found_at": 1767225601000u64, "destroy_ordered": null,
                "released_by": null, "reason": null, "destroyed_at": null}});
        assert_eq!(
            quarantine_text(&record, &clock()),
            "its handle reappeared at 2026-01-01T00:00:01Z (60 s ago) (position 40); the agent leaves it alone until \
             `leasehold release w1.r` orders it destroyed"
        );
        assert!(resources_table(&vec![record.clone()], &clock()).contains(" lost (quarantined) "));
        record["quarantined"]["destroy_ordered"] = 42.into();
        record["quarantined"]["released_by"] = "op:bob".into();
        assert!(quarantine_text(&record, &clock()).ends_with("; ordered destroyed at position 42 by op:bob"));
        assert!(resources_table(&vec![record.clone()], &clock()).contains(" lost (quarantined, destroy ordered) "));
        record["quarantined"]["destroyed_at"] = 1767225602000u64.into();
        assert!(quarantine_text(&record, &clock()).ends_with(", destroyed at 2026-01-01T00:00:02Z (59 s ago)"));
        assert!(resources_table(&vec![record.clone()], &clock()).contains(" lost "));
        assert!(!resources_table(&vec![record.clone()], &clock()).contains("quarantined"));
        record["quarantined"] = Value::Null;
        assert_eq!(quarantine_text(&record, &clock()), "-");
    }

    #[test]
    fn a_dead_letter_known_only_by_its_producers_id_is_marked_unverified() {
        let letters = vec![
            serde_json::json!({"seq": 1, "partition": 2, "source_seq": 7, "subject": "lh.cmd.2.op.w1._",
                "reason": "oversized", "command_id": "019b76da-abe8-7001-8000-000000000001", "id_verified": true,
                "bytes": 0}),
            serde_json::json!({"seq": 2, "partition": 2, "source_seq": 8, "subject": "lh.cmd.2.op.w1._",
                "reason": "unknown format", "command_id": "019b76da-abe8-7001-8000-000000000002",
                "id_verified": false, "bytes": 9}),
            serde_json::json!({"seq": 3, "partition": 2, "source_seq": 9, "subject": "lh.cmd.2.op.w1._",
                "reason": "empty", "command_id": null, "id_verified": false, "bytes": 0}),
        ];
        let table = dead_letters_table(&letters);
        let rows: Vec<&str> = table.lines().collect();
        assert!(
            rows[1].contains(" 019b76da-abe8-7001-8000-000000000001 ") && !rows[1].contains("unverified"),
            "{table}"
        );
        assert!(rows[2].contains(" 019b76da-abe8-7001-8000-000000000002 (unverified) "), "{table}");
        assert!(rows[3].contains(" - "), "{table}");

        let status: CommandStatus = serde_json::from_value(serde_json::json!({
            "command_id": "019b76da-abe8-7001-8000-000000000002", "status": "dead-lettered", "command_seq": 8,
            "duplicate": false, "rejection": null, "outcomes": [], "detail": "unverified id: ...",
            "dead_letter": {"reason": "unknown format", "source_seq": 8, "subject": "lh.cmd.2.op.w1._",
                "id_verified": false}}))
        .unwrap();
        let text = command_text(&status, &clock());
        assert!(text.contains("status       dead-lettered\n"), "{text}");
        assert!(text.contains("dead_letter  unknown format (command seq 8, lh.cmd.2.op.w1._)\n"), "{text}");
        assert!(text.contains("id           unverified: "), "{text}");
        let mut verified = status.clone();
        verified.dead_letter.as_mut().unwrap().id_verified = Some(true);
        assert!(!command_text(&verified, &clock()).contains("unverified"));
        // A gateway from before the mark says nothing of it.
        verified.dead_letter.as_mut().unwrap().id_verified = None;
        assert!(!command_text(&verified, &clock()).contains("unverified"));
    }

    #[test]
    fn a_suspect_agent_says_why_and_a_waiting_claim_says_so() {
        let agent = serde_json::json!({"name": "w1", "status": "suspect", "breaker":
            {"would_lose": 12, "live": 20, "tripped_at": 1767225601000u64}});
        assert_eq!(
            breaker_text(&agent, &clock()),
            "breaker: a report would lose 12 of 20 live, tripped 2026-01-01T00:00:01Z (60 s ago); confirm with \
             `leasehold agent confirm-loss w1`"
        );
        let claim = serde_json::json!({"pool": "ips", "id": null, "status": "wanted", "token": null});
        assert_eq!(claim_text(&claim), "ips: waiting for pool ips");
    }
}
