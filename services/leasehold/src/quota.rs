//! Quotas: `leasehold quota set|ls|rm`.
//!
//! A quota is recorded in every partition (`op.set-quota`, one command per partition on its settings key, as `policy
//! set` sends the policy) and counted by one `slots` pool per kind, `quota-<name>-<kind>`: an allocation by one of
//! its principals claims a slot there, so the limit holds across partitions. `quota set` defines (or changes) those
//! pools first, each with as many slots as the kind's maximum, orphans held (an orphan's slot counts until its destroy
//! is confirmed) and no cool-down, and sends the quota only once every pool is in place: no partition decides an
//! allocation under a quota whose pool is missing. `quota ls` reads the quotas from `GET /v1/policy` and what each
//! pool holds from `GET /v1/pools/<pool>`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use leasehold_projector::{HolderView, PolicyView, PoolView, QuotaView};
use leasehold_schemas::command::{DefinePool, SetQuota, UpdatePool, quota_kind_of, quota_pool};
use leasehold_schemas::ids::QuotaName;
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::{Issuer, Key, Millis, PoolName};
use serde::Serialize;

use crate::GlobalArgs;
use crate::client::{CommandStatus, Gateway};
use crate::output::{self, OutputFormat, Table};
use crate::policy::{BadCommandLine, partitions_text};
use crate::produce::{ProduceArgs, Transport};

/// How many holders of a kind a table names (`--output json` lists them all).
const HOLDERS_NAMED: usize = 5;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum QuotaCmd {
    /// Set or change a quota: the most resources of each kind its principals may hold at once, all partitions
    /// together. Defines (or changes) the pool `quota-NAME-KIND` of each kind first, then sends the quota to every
    /// partition. Give the whole quota each time: a kind left out is no longer limited (its pool is left), a
    /// principal left out no longer counted.
    Set(QuotaSetArgs),
    /// List the quotas: for each kind, how many are held of the maximum, and by which resources.
    Ls,
    /// Remove a quota from every partition. What its principals hold keeps its slots until each resource ends; the
    /// pools are left, to be deleted with `leasehold pool delete` once empty.
    Rm(QuotaRmArgs),
}

/// `leasehold quota set`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct QuotaSetArgs {
    /// The quota's name (`[a-z0-9][a-z0-9_-]`, at most 63 bytes).
    pub(crate) name: QuotaName,
    /// The most resources of KIND its principals may hold at once, `dir=5` (0: none of it at all). Repeatable, one
    /// per kind.
    #[arg(long = "max", value_name = "KIND=N", value_parser = parse_max, required = true)]
    pub(crate) max: Vec<(String, u32)>,
    /// An issuer the quota counts (`ci:team-a`: what `--issuer` or `--as-principal` sends as, or a gateway token's
    /// principal). Repeatable. A principal is under one quota at most.
    #[arg(long = "principal", value_name = "P", required = true)]
    pub(crate) principals: Vec<Issuer>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold quota rm`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct QuotaRmArgs {
    /// The quota's name.
    pub(crate) name: QuotaName,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `dir=5`
pub(crate) fn parse_max(text: &str) -> Result<(String, u32), String> {
    let (kind, n) = text.rsplit_once('=').ok_or_else(|| format!("{text:?} is not KIND=N, e.g. dir=5"))?;
    let n = n.parse::<u32>().map_err(|_| format!("{n:?} is not a number of resources (0 to {})", u32::MAX))?;
    Ok((kind.to_owned(), n))
}

/// A quota as `quota set` asks for it, checked as the partitions check it: nothing is sent for one they would
/// refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    name: QuotaName,
    max: BTreeMap<String, u32>,
    /// Sorted, as the partitions record them.
    principals: Vec<Issuer>,
}

impl Wanted {
    fn of(args: &QuotaSetArgs) -> Result<Self, BadCommandLine> {
        let name = &args.name;
        let mut max = BTreeMap::new();
        for (kind, n) in &args.max {
            if quota_pool(name, kind).is_none()
                || !kind.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            {
                return Err(BadCommandLine(format!(
                    "--max {}: a quota's kind is [a-z0-9][a-z0-9_-]* (no dot), short enough that its pool \
                     quota-{name}-<kind> is at most 63 bytes; nothing was sent",
                    leasehold_schemas::text::shown(kind)
                )));
            }
            if max.insert(kind.clone(), *n).is_some() {
                return Err(BadCommandLine(format!("--max {kind} is given twice; nothing was sent")));
            }
        }
        if max.len() > leasehold_domain::MAX_QUOTA_KINDS {
            return Err(BadCommandLine(format!(
                "{} kinds given; a quota limits at most {}; nothing was sent",
                max.len(),
                leasehold_domain::MAX_QUOTA_KINDS
            )));
        }
        let mut principals = args.principals.clone();
        principals.sort();
        if let Some(twice) = principals.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(BadCommandLine(format!("--principal {} is given twice; nothing was sent", twice[0])));
        }
        if principals.len() > leasehold_domain::MAX_QUOTA_PRINCIPALS {
            return Err(BadCommandLine(format!(
                "{} principals given; a quota names at most {}; nothing was sent",
                principals.len(),
                leasehold_domain::MAX_QUOTA_PRINCIPALS
            )));
        }
        Ok(Wanted { name: name.clone(), max, principals })
    }
}

pub(crate) async fn run(cmd: QuotaCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    let gateway = crate::client::gateway(global)?;
    match cmd {
        QuotaCmd::Set(args) => set(args, &gateway, global).await,
        QuotaCmd::Ls => ls(&gateway, global.output).await,
        QuotaCmd::Rm(args) => rm(args, &gateway, global).await,
    }
}

/// Every partition's policy view, where the quotas are (with the key that routes each partition's settings).
async fn policies(gateway: &Gateway) -> anyhow::Result<Vec<PolicyView>> {
    let views: Vec<PolicyView> = gateway
        .get(&["v1", "policy"], &[])
        .await?
        .context("the gateway has no /v1/policy: is it older than this command line?")?;
    if views.is_empty() {
        bail!("the gateway knows of no partition");
    }
    Ok(views)
}

/// What became of a quota's pool of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum PoolChange {
    Defined,
    Changed,
    Unchanged,
}

#[derive(Debug, Serialize)]
struct PoolSet {
    kind: String,
    pool: String,
    slots: u32,
    change: PoolChange,
}

/// What `quota set --output json` prints.
#[derive(Debug, Serialize)]
struct SetReport<'a> {
    quota: &'a str,
    max: &'a BTreeMap<String, u32>,
    principals: Vec<&'a str>,
    pools: Vec<PoolSet>,
    /// Kinds the quota limited before and no longer does, each with its pool (left as it is).
    dropped: Vec<(String, String)>,
    accepted_in: Vec<u32>,
    unchanged_in: Vec<u32>,
    statuses: Vec<CommandStatus>,
}

async fn set(args: QuotaSetArgs, gateway: &Gateway, global: &GlobalArgs) -> anyhow::Result<()> {
    if args.produce.command_id.is_some() {
        return Err(BadCommandLine("--command-id names one command; quota set sends several".into()).into());
    }
    let wanted = Wanted::of(&args)?;
    let name = &wanted.name;
    let views = policies(gateway).await?;
    // A principal is under one quota: said here, before a pool is touched (a partition refuses it too).
    for principal in &wanted.principals {
        let under: BTreeSet<&String> = views
            .iter()
            .flat_map(|view| &view.quotas)
            .filter(|(other, quota)| {
                *other != name.as_str() && quota.principals.iter().any(|p| p == principal.as_str())
            })
            .map(|(other, _)| other)
            .collect();
        if let Some(other) = under.first() {
            bail!(
                "quota set {name}: principal {principal} is already under quota {other}, and a principal is under one \
                 quota: take it out there first (`leasehold quota set {other}` without it, or `leasehold quota rm \
                 {other}`); nothing was sent"
            );
        }
    }
    // A pool name is `quota-<name>-<kind>`: another quota's pool may have the same name (`a-b` and `c` against `a`
    // and `b-c`). Refused here, before any pool is touched: a partition refuses the quota too, but only after the
    // pool was changed.
    for kind in wanted.max.keys() {
        let mine = quota_pool(name, kind).expect("checked in Wanted::of");
        let theirs = views.iter().flat_map(|view| &view.quotas).find_map(|(other, quota)| {
            let other_name = QuotaName::new(other.as_str()).ok().filter(|q| q != name)?;
            quota_kind_of(&mine, &other_name).filter(|k| quota.max.contains_key(*k)).map(|k| (other, k))
        });
        if let Some((other, other_kind)) = theirs {
            bail!(
                "quota set {name}: kind {kind} would be counted by pool {mine}, which counts kind {other_kind} of quota                  {other}; name the quota otherwise; nothing was sent"
            );
        }
    }
    let existing: BTreeSet<String> = gateway
        .get::<Vec<PoolView>>(&["v1", "pools"], &[])
        .await?
        .context("/v1/pools is not there")?
        .into_iter()
        .map(|pool| pool.name)
        .collect();
    // The kinds counted by a pool before (a maximum of 0 has none).
    let before: BTreeSet<String> = views
        .iter()
        .filter_map(|view| view.quotas.get(name.as_str()))
        .flat_map(|quota| quota.max.iter().filter(|(_, max)| **max > 0).map(|(kind, _)| kind.clone()))
        .collect();
    let issuer = crate::produce::sender(global)?;
    if wanted.principals.contains(&issuer) {
        bail!(
            "quota set {name}: it names its own sender {issuer}: under a quota an issuer sends only a producer's \
             requests, so it could not change or remove the quota again; set it as another issuer (--issuer); nothing \
             was sent"
        );
    }
    let transport = crate::produce::transport(global, &args.produce.nats).await?;
    let (format, timeout) = (global.output, args.produce.timeout);

    // The pools first: a partition that records the quota counts its principals' allocations there at once.
    let mut pools = Vec::new();
    for (kind, max) in &wanted.max {
        let pool = quota_pool(name, kind).expect("checked in Wanted::of");
        if *max == 0 && !existing.contains(pool.as_str()) {
            // None of the kind at all: allocations are refused outright, nothing is counted.
            continue;
        }
        // Lowered to none: the pool is closed (0 slots), so what waits for a slot gets none.
        let change = slots_pool(&transport, &issuer, &pool, *max, format, timeout).await?;
        pools.push(PoolSet { kind: kind.clone(), pool: pool.to_string(), slots: *max, change });
    }

    let (mut accepted_in, mut unchanged_in, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    for view in &views {
        let key: Key = view.key.parse().with_context(|| format!("the gateway's key {:?}", view.key))?;
        let body = SetQuota {
            key,
            partition: view.partition,
            quota: name.clone(),
            max: wanted.max.clone(),
            principals: wanted.principals.clone(),
        };
        let what = format!("quota set {name} (partition {})", view.partition);
        let sent = send(&transport, &issuer, body, format, timeout, &what).await;
        // What was accepted before a failure stays accepted: the error says where the quota stands.
        let (status, changed) = match sent {
            Err(e) if !accepted_in.is_empty() => {
                return Err(e.context(format!(
                    "quota set {name}: already accepted in {}; run it again once the cause is fixed (partitions \
                     that have it answer `already set so`)",
                    partitions_text(&accepted_in)
                )));
            }
            other => other?,
        };
        if changed {
            accepted_in.push(view.partition)
        } else {
            unchanged_in.push(view.partition)
        }
        statuses.push(status);
    }

    let dropped: Vec<(String, String)> = before
        .iter()
        .filter(|kind| !wanted.max.contains_key(*kind))
        .filter_map(|kind| quota_pool(name, kind).map(|pool| (kind.clone(), pool.to_string())))
        .collect();
    if format == OutputFormat::Json {
        let report = SetReport {
            quota: name.as_str(),
            max: &wanted.max,
            principals: wanted.principals.iter().map(Issuer::as_str).collect(),
            pools,
            dropped,
            accepted_in,
            unchanged_in,
            statuses,
        };
        output::emit(&output::json(&report)?);
        return Ok(());
    }
    let mut text = match (accepted_in.is_empty(), unchanged_in.is_empty()) {
        (false, true) => format!("quota set {name}: accepted in {}\n", partitions_text(&accepted_in)),
        (false, false) => format!(
            "quota set {name}: accepted in {}; unchanged in {} (they have it already)\n",
            partitions_text(&accepted_in),
            partitions_text(&unchanged_in)
        ),
        (true, _) => {
            format!("quota set {name}: unchanged in {} (they have it already)\n", partitions_text(&unchanged_in))
        }
    };
    let pool_words: Vec<String> = pools
        .iter()
        .map(|p| match p.change {
            PoolChange::Defined => format!("{} defined with {}", p.pool, slots_text(p.slots)),
            PoolChange::Changed => format!("{} changed to {}", p.pool, slots_text(p.slots)),
            PoolChange::Unchanged => format!("{} has {} already", p.pool, slots_text(p.slots)),
        })
        .collect();
    let mut rows = vec![
        ("quota", name.to_string()),
        ("principals", wanted.principals.iter().map(Issuer::as_str).collect::<Vec<_>>().join(", ")),
        ("max", max_text(&wanted.max)),
    ];
    if !pool_words.is_empty() {
        rows.push(("pools", pool_words.join("; ")));
    }
    text.push_str(&output::fields(&rows));
    for (kind, pool) in &dropped {
        let line = format!(
            "kind {kind} is no longer limited: its pool {pool} is left as it is (what holds a slot keeps it until the \
             resource ends); delete it with `leasehold pool delete {pool}` once it is empty"
        );
        text.push_str(&leasehold_schemas::text::escape_for_display(&line));
        text.push('\n');
    }
    output::emit(&text);
    Ok(())
}

/// Makes `pool` a `slots` pool of `count` slots that holds an orphan's slot and has no cool-down: defined, or
/// changed when it exists otherwise.
async fn slots_pool(
    transport: &Transport,
    issuer: &Issuer,
    pool: &PoolName,
    count: u32,
    format: OutputFormat,
    timeout: std::time::Duration,
) -> anyhow::Result<PoolChange> {
    let kind = PoolKind::Slots { count };
    // No pool is defined with 0 slots; one that exists is closed so (a quota lowered to none).
    if count > 0 {
        let define = DefinePool {
            pool: pool.clone(),
            kind: kind.clone(),
            cooldown: Some(Millis(0)),
            orphans: OrphanPolicy::Hold,
        };
        let envelope = crate::produce::envelope(issuer, None, define);
        let status = crate::produce::decided_through(transport, format, timeout, &envelope).await?;
        match rejection_kind(&status) {
            None if status.status == "accepted" => return Ok(PoolChange::Defined),
            Some("already-done") => return Ok(PoolChange::Unchanged),
            Some("already-exists") => {}
            _ => {
                crate::produce::accepted(status, format, &format!("quota set: pool define {pool}"))?;
                return Ok(PoolChange::Defined);
            }
        }
    }
    let update = UpdatePool { pool: pool.clone(), kind, cooldown: Some(Millis(0)), orphans: Some(OrphanPolicy::Hold) };
    let envelope = crate::produce::envelope(issuer, None, update);
    let status = crate::produce::decided_through(transport, format, timeout, &envelope).await?;
    if rejection_kind(&status) == Some("already-done") {
        return Ok(PoolChange::Unchanged);
    }
    crate::produce::accepted(status, format, &format!("quota set: pool update {pool}"))?;
    Ok(PoolChange::Changed)
}

/// The kind of a rejected command's rejection (`None`: not rejected).
fn rejection_kind(status: &CommandStatus) -> Option<&str> {
    status.rejection.as_ref().filter(|_| status.status == "rejected").map(|r| r.kind.as_str())
}

/// Sends one `op.set-quota` and waits for its decision: its status, and whether it changed the partition (false:
/// `already-done`, the partition has it so already). Any other rejection is an error that says why.
async fn send(
    transport: &Transport,
    issuer: &Issuer,
    body: SetQuota,
    format: OutputFormat,
    timeout: std::time::Duration,
    what: &str,
) -> anyhow::Result<(CommandStatus, bool)> {
    let envelope = crate::produce::envelope(issuer, None, body);
    let status = crate::produce::decided_through(transport, format, timeout, &envelope).await?;
    if rejection_kind(&status) == Some("already-done") {
        return Ok((status, false));
    }
    let kept = status.clone();
    crate::produce::accepted(status, format, what)?;
    Ok((kept, true))
}

/// `1 slot`, `2 slots`
fn slots_text(n: u32) -> String {
    if n == 1 { "1 slot".to_owned() } else { format!("{n} slots") }
}

/// `dir=2, vm=5`
fn max_text(max: &BTreeMap<String, u32>) -> String {
    max.iter()
        .map(|(kind, n)| if *n == 0 { format!("{kind}=0 (none at all)") } else { format!("{kind}={n}") })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One kind of a quota as `quota ls` shows it.
#[derive(Debug, Serialize)]
struct KindUse {
    kind: String,
    max: u32,
    /// The pool that counts it (none for a maximum of 0: nothing is counted).
    pool: Option<String>,
    /// The pool's slots as defined (`None`: the pool is not there).
    pool_slots: Option<u64>,
    held: u64,
    waiting: u64,
    holders: Vec<Holding>,
}

#[derive(Debug, Serialize)]
struct Holding {
    holder: String,
    slot: String,
}

/// A quota as `quota ls` shows it: as most partitions have it, and which partitions differ.
#[derive(Debug, Serialize)]
struct QuotaUse {
    name: String,
    principals: Vec<String>,
    kinds: Vec<KindUse>,
    /// The partitions that have it so.
    partitions: Vec<u32>,
    /// The partitions without it (a `quota set` that did not reach them).
    missing_in: Vec<u32>,
    /// The partitions that have it otherwise, with what they have.
    different_in: Vec<(u32, QuotaView)>,
}

async fn ls(gateway: &Gateway, format: OutputFormat) -> anyhow::Result<()> {
    let views = policies(gateway).await?;
    let pools: Vec<PoolView> = gateway.get(&["v1", "pools"], &[]).await?.context("/v1/pools is not there")?;
    let names: BTreeSet<&String> = views.iter().flat_map(|view| view.quotas.keys()).collect();
    let mut quotas = Vec::new();
    for name in names {
        // The quota as most partitions have it (the first such, in partition order, on a tie).
        let mut versions: Vec<(&QuotaView, Vec<u32>)> = Vec::new();
        let mut missing_in = Vec::new();
        for view in &views {
            match view.quotas.get(name) {
                None => missing_in.push(view.partition),
                Some(quota) => match versions.iter_mut().find(|(q, _)| *q == quota) {
                    Some((_, partitions)) => partitions.push(view.partition),
                    None => versions.push((quota, vec![view.partition])),
                },
            }
        }
        let most = versions.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
        let at = versions.iter().position(|(_, p)| p.len() == most).unwrap_or(0);
        let (quota, partitions) = versions.remove(at);
        let different_in: Vec<(u32, QuotaView)> = versions
            .into_iter()
            .flat_map(|(q, partitions)| partitions.into_iter().map(move |p| (p, q.clone())))
            .collect();
        let mut kinds = Vec::new();
        for (kind, max) in &quota.max {
            let pool = QuotaName::new(name.as_str()).ok().and_then(|q| quota_pool(&q, kind));
            let record = pool.as_ref().and_then(|pool| pools.iter().find(|p| p.name == pool.as_str()));
            // A maximum of 0 has a pool only if it was lowered to none (the pool closed, its holders still there).
            let pool = pool.filter(|_| *max > 0 || record.is_some());
            let holders: Vec<HolderView> = match (&pool, record) {
                (Some(pool), Some(_)) => gateway.get(&["v1", "pools", pool.as_str()], &[]).await?.unwrap_or_default(),
                _ => Vec::new(),
            };
            let mut holders: Vec<Holding> =
                holders.into_iter().map(|h| Holding { holder: h.holder, slot: h.value }).collect();
            holders.sort_by(|a, b| a.holder.cmp(&b.holder));
            kinds.push(KindUse {
                kind: kind.clone(),
                max: *max,
                pool: pool.map(|p| p.to_string()),
                pool_slots: record.and_then(|r| r.kind.get("slots")).and_then(|s| s["count"].as_u64()),
                held: record.map_or(0, |r| r.held),
                waiting: record.map_or(0, |r| r.waiting),
                holders,
            });
        }
        quotas.push(QuotaUse {
            name: name.clone(),
            principals: quota.principals.clone(),
            kinds,
            partitions,
            missing_in,
            different_in,
        });
    }
    match format {
        OutputFormat::Json => output::emit(&output::json(&quotas)?),
        OutputFormat::Table => output::emit(&ls_table(&quotas, views.len())),
    }
    Ok(())
}

fn ls_table(quotas: &[QuotaUse], n_partitions: usize) -> String {
    if quotas.is_empty() {
        return "no quotas (set one with `leasehold quota set NAME --max KIND=N --principal P`)\n".to_owned();
    }
    let mut table = Table::new(&["QUOTA", "PRINCIPALS", "KIND", "HELD/MAX", "WAITING", "HOLDERS"]);
    for quota in quotas {
        for (idx, kind) in quota.kinds.iter().enumerate() {
            let (name, principals) = match idx {
                0 => (quota.name.clone(), quota.principals.join(", ")),
                _ => (String::new(), String::new()),
            };
            let held = match (&kind.pool, kind.pool_slots) {
                (None, _) => "none allowed".to_owned(),
                (Some(pool), None) => format!("{}/{} (pool {pool} missing)", kind.held, kind.max),
                (Some(_), Some(slots)) if slots != u64::from(kind.max) => {
                    format!("{}/{} (its pool has {slots} slots)", kind.held, kind.max)
                }
                (Some(_), Some(_)) => format!("{}/{}", kind.held, kind.max),
            };
            let mut holders: Vec<String> = kind.holders.iter().take(HOLDERS_NAMED).map(|h| h.holder.clone()).collect();
            if kind.holders.len() > HOLDERS_NAMED {
                holders.push(format!("and {} more", kind.holders.len() - HOLDERS_NAMED));
            }
            let holders = if holders.is_empty() { "-".to_owned() } else { holders.join(", ") };
            table.row(vec![name, principals, kind.kind.clone(), held, kind.waiting.to_string(), holders]);
        }
    }
    let mut text = table.render();
    for quota in quotas {
        let mut says = Vec::new();
        if !quota.missing_in.is_empty() {
            says.push(format!("not set in {}", partitions_text(&quota.missing_in)));
        }
        if !quota.different_in.is_empty() {
            let partitions: Vec<u32> = quota.different_in.iter().map(|(p, _)| *p).collect();
            says.push(format!("set otherwise in {}", partitions_text(&partitions)));
        }
        if !says.is_empty() {
            text.push_str(&leasehold_schemas::text::escape_for_display(&format!(
                "quota {}: the partitions disagree: shown as {} of {n_partitions} have it; {} (a `quota set` that did \
                 not reach every partition?): run `leasehold quota set {}` again with the whole quota to align them",
                quota.name,
                quota.partitions.len(),
                says.join("; "),
                quota.name
            )));
            text.push('\n');
        }
    }
    text
}

/// What `quota rm --output json` prints.
#[derive(Debug, Serialize)]
struct RmReport<'a> {
    quota: &'a str,
    removed_in: Vec<u32>,
    /// Partitions that had no such quota.
    absent_in: Vec<u32>,
    /// The quota's pools, left as they are.
    pools: Vec<String>,
    statuses: Vec<CommandStatus>,
}

async fn rm(args: QuotaRmArgs, gateway: &Gateway, global: &GlobalArgs) -> anyhow::Result<()> {
    if args.produce.command_id.is_some() {
        return Err(BadCommandLine("--command-id names one command; quota rm sends one per partition".into()).into());
    }
    let name = &args.name;
    let views = policies(gateway).await?;
    let pools: BTreeSet<String> = views
        .iter()
        .filter_map(|view| view.quotas.get(name.as_str()))
        .flat_map(|quota| quota.max.keys())
        .filter_map(|kind| quota_pool(name, kind).map(|pool| pool.to_string()))
        .collect();
    // Only pools that exist (a maximum of 0 given at once has none).
    let records: Vec<PoolView> = gateway.get(&["v1", "pools"], &[]).await?.unwrap_or_default();
    let pools: BTreeSet<String> = pools.into_iter().filter(|p| records.iter().any(|r| r.name == *p)).collect();
    let issuer = crate::produce::sender(global)?;
    let transport = crate::produce::transport(global, &args.produce.nats).await?;
    let (format, timeout) = (global.output, args.produce.timeout);
    // Sent to every partition, whatever the read models say (they may lag a `quota set` just made): a partition
    // without the quota answers `already-done`.
    let (mut removed_in, mut absent_in, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    for view in &views {
        let key: Key = view.key.parse().with_context(|| format!("the gateway's key {:?}", view.key))?;
        let body =
            SetQuota { key, partition: view.partition, quota: name.clone(), max: BTreeMap::new(), principals: vec![] };
        let what = format!("quota rm {name} (partition {})", view.partition);
        let (status, removed) = match send(&transport, &issuer, body, format, timeout, &what).await {
            Err(e) if !removed_in.is_empty() => {
                return Err(e.context(format!(
                    "quota rm {name}: already removed from {}; run it again once the cause is fixed",
                    partitions_text(&removed_in)
                )));
            }
            other => other?,
        };
        if removed {
            removed_in.push(view.partition)
        } else {
            absent_in.push(view.partition)
        }
        statuses.push(status);
    }
    // Allocations that wait for a slot of its pools claimed it before the quota went: each pool grows to hold them
    // all, so every one is served at once, as an allocation made now would be (it claims no slot).
    let mut served = Vec::new();
    for record in records.iter().filter(|r| pools.contains(&r.name) && r.waiting > 0) {
        let count = record.kind.get("slots").and_then(|s| s["count"].as_u64()).unwrap_or(0);
        let wanted = u32::try_from(record.held + record.waiting).unwrap_or(u32::MAX);
        if u64::from(wanted) > count {
            let pool = PoolName::new(record.name.as_str()).context("a quota's pool name")?;
            slots_pool(&transport, &issuer, &pool, wanted, format, timeout).await?;
            served.push(format!("{} ({} waiting)", record.name, record.waiting));
        }
    }
    if format == OutputFormat::Json {
        let report =
            RmReport { quota: name.as_str(), removed_in, absent_in, pools: pools.into_iter().collect(), statuses };
        output::emit(&output::json(&report)?);
        return Ok(());
    }
    if removed_in.is_empty() {
        output::emit(&format!("quota rm {name}: no partition has quota {name}: nothing to remove\n"));
        return Ok(());
    }
    let mut text = format!("quota rm {name}: removed from {}", partitions_text(&removed_in));
    if !absent_in.is_empty() {
        text.push_str(&format!(" (not set in {})", partitions_text(&absent_in)));
    }
    text.push_str("\nwhat its principals hold keeps its slot until each resource ends; new allocations claim none");
    if !served.is_empty() {
        text.push_str(&format!(
            "\nallocations that waited for a slot are served: {} grew to hold them",
            served.join(", ")
        ));
    }
    if !pools.is_empty() {
        let pools: Vec<String> = pools.into_iter().collect();
        text.push_str(&format!(
            "\nits pools are left: {}; delete each with `leasehold pool delete NAME` once it is empty (`leasehold pool \
             ls` shows what they hold)",
            pools.join(", ")
        ));
    }
    text.push('\n');
    output::emit(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<crate::Cli, clap::Error> {
        use clap::Parser as _;
        crate::Cli::try_parse_from(std::iter::once("leasehold").chain(argv.iter().copied()))
    }

    fn wanted(argv: &[&str]) -> Result<Wanted, String> {
        let cli = parse(argv).map_err(|e| e.to_string())?;
        let crate::Cmd::Quota(QuotaCmd::Set(args)) = cli.command else { panic!("not quota set") };
        Wanted::of(&args).map_err(|e| e.to_string())
    }

    #[test]
    fn a_quota_is_checked_before_anything_is_sent() {
        let ok = wanted(&[
            "quota",
            "set",
            "team-a",
            "--max",
            "dir=2",
            "--max",
            "vm=0",
            "--principal",
            "ci:b",
            "--principal",
            "ci:a",
        ])
        .unwrap();
        assert_eq!(ok.max, BTreeMap::from([("dir".to_owned(), 2), ("vm".to_owned(), 0)]));
        assert_eq!(ok.principals, vec![Issuer::new("ci:a").unwrap(), Issuer::new("ci:b").unwrap()], "sorted");
        assert_eq!(max_text(&ok.max), "dir=2, vm=0 (none at all)");
        for (argv, says) in [
            (&["quota", "set", "t", "--max", "dir=2"][..], "--principal"),
            (&["quota", "set", "t", "--principal", "p"][..], "--max"),
            (&["quota", "set", "T", "--max", "dir=2", "--principal", "p"][..], "quota name"),
            (&["quota", "set", "t", "--max", "dir", "--principal", "p"][..], "is not KIND=N"),
            (&["quota", "set", "t", "--max", "dir=-1", "--principal", "p"][..], "is not a number"),
            (&["quota", "set", "t", "--max", "dir=2", "--principal", "has space"][..], "--principal"),
            (&["quota", "set", "t", "--max", "a.b=2", "--principal", "p"][..], "no dot"),
            (&["quota", "set", "t", "--max", "Dir=2", "--principal", "p"][..], "[a-z0-9]"),
            (&["quota", "set", "t", "--max", "dir=2", "--max", "dir=3", "--principal", "p"][..], "given twice"),
            (&["quota", "set", "t", "--max", "dir=2", "--principal", "p", "--principal", "p"][..], "given twice"),
        ] {
            let error = wanted(argv).unwrap_err();
            assert!(error.contains(says), "{argv:?}: {error}");
        }
        let long_kind = format!("{}=1", "k".repeat(60));
        assert!(
            wanted(&["quota", "set", "t", "--max", &long_kind, "--principal", "p"]).unwrap_err().contains("63 bytes")
        );
        assert!(parse(&["quota", "rm", "t"]).is_ok() && parse(&["quota", "ls"]).is_ok());
    }

    fn holders(n: usize) -> Vec<Holding> {
        (0..n).map(|i| Holding { holder: format!("w1.r{i}"), slot: i.to_string() }).collect()
    }

    #[test]
    fn the_list_shows_use_against_the_maximum_and_where_partitions_disagree() {
        let quota = QuotaUse {
            name: "team-a".into(),
            principals: vec!["ci:a".into(), "ci:b".into()],
            kinds: vec![
                KindUse {
                    kind: "dir".into(),
                    max: 2,
                    pool: Some("quota-team-a-dir".into()),
                    pool_slots: Some(2),
                    held: 2,
                    waiting: 1,
                    holders: holders(2),
                },
                KindUse {
                    kind: "vm".into(),
                    max: 7,
                    pool: Some("quota-team-a-vm".into()),
                    pool_slots: Some(7),
                    held: 7,
                    waiting: 0,
                    holders: holders(7),
                },
                KindUse {
                    kind: "gpu".into(),
                    max: 0,
                    pool: None,
                    pool_slots: None,
                    held: 0,
                    waiting: 0,
                    holders: vec![],
                },
            ],
            partitions: vec![0, 1, 2],
            missing_in: vec![3],
            different_in: vec![],
        };
        let text = ls_table(&[quota], 4);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("QUOTA   PRINCIPALS  KIND  HELD/MAX      WAITING  HOLDERS"), "{text}");
        assert!(lines[1].contains("team-a  ci:a, ci:b  dir   2/2") && lines[1].ends_with("w1.r0, w1.r1"), "{text}");
        assert!(lines[2].contains("vm    7/7") && lines[2].ends_with("w1.r4, and 2 more"), "{text}");
        assert!(lines[3].contains("gpu   none allowed"), "{text}");
        assert!(
            lines[4]
                .starts_with("quota team-a: the partitions disagree: shown as 3 of 4 have it; not set in partition 3"),
            "{text}"
        );
        assert!(ls_table(&[], 4).starts_with("no quotas"));
    }
}
