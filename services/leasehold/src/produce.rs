//! The producer commands (`allocate`, `acquire`, `renew`, ... `pool define`): each builds one `op` command with ids
//! the command line chooses (so a retry of the same command is idempotent), sends it through the gateway or straight
//! to JetStream (`--nats`) with `leasehold_client`, waits for its outcome and prints what it made.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail};
pub(crate) use leasehold_client::produce::{LeaseRecord, LeaseRef, Transport, submit_to_log};
use leasehold_schemas::command::{
    Acquire, Allocate, ConfirmLoss, CordonAgent, DefinePool, DeletePool, DrainAgent, FreeOrphan, Pause, Place,
    PlacementStrategy, Release, ReleaseLease, Renew, ReportFailureByOperator, RetireAgent, UncordonAgent, Unpause,
    UnretireAgent, Update, UpdatePool,
};
use leasehold_schemas::outcome::ReleaseCause;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::{
    AgentName, Command, CommandId, Effect, Envelope, Issuer, LeaseId, Millis, PoolName, Position, ResourceId,
    ResourceRef, Timestamp,
};

use leasehold_schemas::text::shown;

use crate::GlobalArgs;
use crate::client::{CommandStatus, Error, SeqOutcome};
use crate::nats_args::NatsArgs;
use crate::output::{self, Clock, OutputFormat};
use crate::policy::BadCommandLine;

/// What every producer command takes besides its own arguments. The NATS flags are `serve`'s, told what they mean
/// here; the replica count is the log's own (read with its partition count), so a producer does not show it.
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("nats", |a| a.help(
        "Publish straight to NATS JetStream at this URL (comma-separated for several servers) instead of through \
         the gateway, and read the outcome from the log. Credentials go in --creds or --user/--password, never in \
         the URL"
    )),
    mut_arg("replicas", |a| a.hide(true)),
)]
pub(crate) struct ProduceArgs {
    /// How long to wait for the command's outcome (`30s`, `2min`, `1h`: past the gateway's cap of 5min on one
    /// request, the wait goes on in rounds). With `acquire --block`, also how long to wait for the grant.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// The command's id (a UUIDv7, canonical form); default: a new one. Give the id of a command whose outcome is
    /// unknown (exit status 3) to send it again: the log stores a command id once and it is decided at most once.
    #[arg(long, value_name = "UUID")]
    pub(crate) command_id: Option<CommandId>,
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
}

/// `leasehold allocate`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AllocateArgs {
    /// The resource's id (a UUIDv7, canonical form); default: a new one. Give it with --command-id to send an
    /// allocation whose outcome is unknown again.
    #[arg(long, value_name = "UUID")]
    pub(crate) id: Option<ResourceId>,
    /// The agent that will hold the resource. Without it, the resource is placed: on a live, schedulable agent
    /// that carries the --select labels and has room for the kind (its declared capacity), chosen by --spread
    /// (the default: fewest of the kind) or --pack (most, under capacity).
    #[arg(long)]
    pub(crate) agent: Option<AgentName>,
    /// Without --agent: a label the chosen agent must carry, `name=value` (repeatable; all must match).
    #[arg(long = "select", value_name = "NAME=VALUE", value_parser = parse_attr, conflicts_with = "agent")]
    pub(crate) select: Vec<(String, String)>,
    /// Without --agent: choose the agent with the most resources of the kind that still has room.
    #[arg(long, conflicts_with_all = ["agent", "spread"])]
    pub(crate) pack: bool,
    /// Without --agent: choose the agent with the fewest resources of the kind (the default).
    #[arg(long, conflicts_with = "agent")]
    pub(crate) spread: bool,
    /// What the agent's driver makes: `container`, `volume`, `dir`...
    #[arg(long)]
    pub(crate) kind: String,
    /// How many leases it takes at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) capacity: u32,
    /// A pool to claim one identifier from before the resource is created (repeatable).
    #[arg(long = "pool", value_name = "POOL")]
    pub(crate) pools: Vec<PoolName>,
    /// A resource (`<agent>.<id>`) this one depends on: when it leaves for good, this one is released.
    #[arg(long, value_name = "REF")]
    pub(crate) parent: Option<ResourceRef>,
    /// An attribute, `name=value` (repeatable).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    pub(crate) attrs: Vec<(String, String)>,
    /// With --pool: give the allocation up (released, cause `wait-timeout`) if its pools have not granted an
    /// identifier within this long (`30s`, `10min`); default: it waits until released. The create timeout counts
    /// only from the create order, once every identifier is bound. Without --agent: how long the request may wait
    /// for room on record (default: none; no agent with room is a refusal), and then for its pools.
    #[arg(long, value_parser = parse_millis, value_name = "DURATION")]
    pub(crate) wait: Option<Millis>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold acquire`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AcquireArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// Who holds the lease (a build, a job): free text for people and the audit trail.
    #[arg(long)]
    pub(crate) holder: String,
    /// The lease expires unless renewed within this long (`5min`); default: held until released.
    #[arg(long, value_parser = parse_millis)]
    pub(crate) ttl: Option<Millis>,
    /// A waiting lease fails after this long. On an active resource at capacity the lease queues only with it (and
    /// is refused `at-capacity` without it); on a pending one it waits, by default while the resource is pending.
    #[arg(long, value_parser = parse_millis)]
    pub(crate) wait_timeout: Option<Millis>,
    /// Its place in the queue of a busy resource: higher first (then first come; a waiter's priority rises by one
    /// each minute it waits). At most the cap the cluster policy gives the issuer (`policy set --max-priority`;
    /// 0 when none names it). Default 0.
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: u8,
    /// The lease's id (a UUIDv7, canonical form); default: a new one. Give it with --command-id to send an
    /// acquisition whose outcome is unknown again.
    #[arg(long, value_name = "UUID")]
    pub(crate) lease_id: Option<LeaseId>,
    /// Wait until a waiting lease is granted or ends, for at most --timeout (default 30s) counted from when it
    /// started waiting: prints the waiting lease (table), then the lease as it ends (json: only that). Exits 0 if
    /// granted, 1 if the lease ended otherwise, 4 if it is still waiting at the timeout (it keeps waiting: release
    /// it with `release-lease` if it is not wanted any more).
    #[arg(long)]
    pub(crate) block: bool,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold renew`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RenewArgs {
    /// The lease, `<agent>.<lease id>` (as `acquire` prints it).
    #[arg(value_name = "LEASE")]
    pub(crate) lease: LeaseRef,
    /// The lease token (as `acquire` prints it).
    #[arg(long)]
    pub(crate) token: u64,
    /// A new time to live; default: the lease's own.
    #[arg(long, value_parser = parse_millis)]
    pub(crate) ttl: Option<Millis>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold release-lease`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReleaseLeaseArgs {
    /// The lease, `<agent>.<lease id>`.
    #[arg(value_name = "LEASE")]
    pub(crate) lease: LeaseRef,
    /// The lease token; leave it out for a lease still waiting (it has none).
    #[arg(long)]
    pub(crate) token: Option<u64>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold release`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReleaseArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// Why, for the audit trail.
    #[arg(long)]
    pub(crate) reason: Option<String>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold pause`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PauseArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// Why, for people and the audit trail.
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// When the pause ends by itself: an RFC 3339 time in UTC (`2027-01-15T08:00:00Z`) or a duration from now on
    /// this machine's clock (`2h`). Default: until `unpause`.
    #[arg(long, value_name = "TIME", value_parser = parse_until)]
    pub(crate) until: Option<Timestamp>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold unpause`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UnpauseArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold update`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UpdateArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// A new capacity.
    #[arg(long)]
    pub(crate) capacity: Option<u32>,
    /// An attribute to add or replace, `name=value` (repeatable).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    pub(crate) attrs: Vec<(String, String)>,
    /// An attribute to remove, by name (repeatable).
    #[arg(long = "remove-attr", value_name = "NAME")]
    pub(crate) remove_attrs: Vec<String>,
    /// The longest a lease may be held (from its grant) while others wait for the resource (`2h`): a renew that
    /// would hold it longer is refused while the queue is not empty. `0` removes the limit.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) max_lease: Option<Millis>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold report-failure`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ReportFailureArgs {
    /// The resource, `<agent>.<id>`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// What is wrong with it (the resource turns suspect and its agent is asked for a health check).
    #[arg(long)]
    pub(crate) reason: String,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold pool define`
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("pool_kind").required(true).args(["ipv4", "slots", "ports"])))]
pub(crate) struct PoolDefineArgs {
    /// The pool's name.
    pub(crate) name: PoolName,
    /// The addresses of a subnet, `10.20.0.0/24` (without its network and broadcast addresses).
    #[arg(long, value_name = "CIDR", value_parser = parse_cidr)]
    pub(crate) ipv4: Option<(Ipv4Addr, u8)>,
    /// Slots `0` to `N - 1`.
    #[arg(long, value_name = "N")]
    pub(crate) slots: Option<u32>,
    /// Ports `FIRST` to `LAST` inclusive, `30000-30099`.
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_port_range)]
    pub(crate) ports: Option<(u16, u16)>,
    /// An address (with --ipv4) or a port (with --ports) the pool never hands out (repeatable).
    #[arg(long, value_name = "IP|PORT", conflicts_with = "slots")]
    pub(crate) exclude: Vec<String>,
    /// How long a freed identifier rests before it is handed out again (default: the policy's claim-cooldown when
    /// defined; `pool update` keeps the pool's).
    #[arg(long, value_parser = parse_millis)]
    pub(crate) cooldown: Option<Millis>,
    /// What an orphan's identifier does (a holder whose agent was declared gone): `release` (default: it goes
    /// back to the pool at once; an agent gone means its machine is gone) or `hold` (it stays held until the agent
    /// comes back and confirms the destroy, or `pool free-orphan` frees it: a cut-off machine may still use it).
    /// `pool update` keeps the pool's when not given.
    #[arg(long, value_name = "release|hold")]
    pub(crate) orphans: Option<leasehold_schemas::pool::OrphanPolicy>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold pool free-orphan`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PoolFreeOrphanArgs {
    /// The orphan, `<agent>.<id>`: a resource orphaned while it held an identifier of a pool defined with
    /// `--orphans hold`.
    #[arg(value_name = "REF")]
    pub(crate) resource: ResourceRef,
    /// Only its identifier of this pool (default: every one it holds).
    #[arg(long, value_name = "POOL")]
    pub(crate) pool: Option<PoolName>,
    /// Why it may be handed out again (on record: `why --ip` shows it), e.g. "machine scrapped".
    #[arg(long)]
    pub(crate) reason: String,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold pool delete`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PoolDeleteArgs {
    /// The pool's name. Refused while anyone holds one of its identifiers or waits for one.
    pub(crate) name: PoolName,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold agent retire`, `unretire` and `confirm-loss`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AgentNameArgs {
    /// The agent's name.
    pub(crate) name: AgentName,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold agent cordon`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CordonArgs {
    /// The agent's name.
    pub(crate) name: AgentName,
    /// Why, for whoever looks at the agent later (`leasehold agents` shows it).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold agent drain`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DrainArgs {
    /// The agent's name.
    pub(crate) name: AgentName,
    /// Release whatever is left this long after the drain is decided (`2h`), leases or not (they are broken);
    /// default: no deadline, a resource holding a lease stays until its leases end. Counted from each decision: a
    /// drain sent again with --deadline moves it.
    #[arg(long, value_parser = parse_millis, value_name = "DURATION")]
    pub(crate) deadline: Option<Millis>,
    /// How long a resource must have held no lease before it is released (`10m`), counted from the drain's start or
    /// the end of its last lease, whichever is later; default: 5min.
    #[arg(long, value_parser = parse_millis, value_name = "DURATION")]
    pub(crate) grace: Option<Millis>,
    /// Why, for whoever looks at the agent later (`leasehold agents` shows it).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `leasehold agent retire`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RetireArgs {
    /// The agent's name.
    pub(crate) name: AgentName,
    /// Print what a retirement would release, as the gateway's read models have it, marking what holds a lease;
    /// send nothing.
    #[arg(long, conflicts_with = "yes")]
    pub(crate) dry_run: bool,
    /// Release resources that hold a lease too (the leases are broken). Without it the retirement is refused,
    /// changing nothing, if any resource of the agent holds a lease when the log decides it.
    #[arg(long)]
    pub(crate) yes: bool,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `name=value`, split at the first `=`; the name is not empty.
pub(crate) fn parse_attr(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not name=value")),
    }
}

/// A duration (`30s`, `5min`, `1h 30m`) in milliseconds.
pub(crate) fn parse_millis(text: &str) -> Result<Millis, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration: {e}"))?;
    u64::try_from(duration.as_millis()).map(Millis).map_err(|_| format!("{text:?} is too long"))
}

/// An RFC 3339 time in UTC, or a duration from now.
pub(crate) fn parse_until(text: &str) -> Result<Timestamp, String> {
    if let Ok(duration) = humantime::parse_duration(text) {
        let until = SystemTime::now() + duration;
        return Ok(Timestamp(unix_ms(until)));
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(time) => Ok(Timestamp(unix_ms(time))),
        Err(e) => Err(format!(
            "{text:?} is neither an RFC 3339 time in UTC (2027-01-15T08:00:00Z) nor a duration from now (2h): {e}"
        )),
    }
}

use leasehold_client::produce::unix_ms;

/// `10.20.0.0/24`
pub(crate) fn parse_cidr(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let (network, prefix_len) =
        text.split_once('/').ok_or_else(|| format!("{text:?} is not a CIDR like 10.20.0.0/24"))?;
    let network = network.parse().map_err(|e| format!("{network:?} is not an IPv4 address: {e}"))?;
    let prefix_len = prefix_len.parse().map_err(|e| format!("{prefix_len:?} is not a prefix length: {e}"))?;
    Ok((network, prefix_len))
}

/// `30000-30099`
pub(crate) fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let (first, last) = text.split_once('-').ok_or_else(|| format!("{text:?} is not a range like 30000-30099"))?;
    let port = |p: &str| p.parse::<u16>().map_err(|e| format!("{p:?} is not a port: {e}"));
    Ok((port(first)?, port(last)?))
}

/// The issuer of the commands this process sends: `--issuer`, else `cli:$USER`, else `cli` (when `$USER` is unset
/// or is no issuer: printable ASCII without spaces, quotes or backslashes).
pub(crate) fn issuer(given: Option<&str>) -> anyhow::Result<Issuer> {
    if let Some(given) = given {
        return Issuer::new(given).map_err(|e| anyhow!("--issuer: {e}"));
    }
    let user = std::env::var("USER").ok();
    Ok(user
        .and_then(|user| Issuer::new(format!("cli:{user}")).ok())
        .unwrap_or_else(|| Issuer::new("cli").expect("a valid issuer")))
}

/// The issuer of this process's commands: `--as-principal`'s principal (refused with an `--issuer` that differs),
/// else [`issuer`].
pub(crate) fn sender(global: &GlobalArgs) -> anyhow::Result<Issuer> {
    let Some(principal) = global.as_principal.as_deref() else { return issuer(global.issuer.as_deref()) };
    let principal = bound_principal(principal)?;
    if let Some(given) = global.issuer.as_deref().filter(|given| *given != principal.as_str()) {
        return Err(BadCommandLine(format!(
            "--issuer {} and --as-principal {principal} disagree: a producer bound to a principal sends as that \
             principal only; leave --issuer out",
            shown(given)
        ))
        .into());
    }
    Ok(principal)
}

/// A principal a NATS producer can be bound to (`--as-principal`, `credentials producer --principal`): an issuer
/// that is one subject token.
pub(crate) fn bound_principal(text: &str) -> Result<Issuer, BadCommandLine> {
    let principal = Issuer::new(text).map_err(|e| BadCommandLine(format!("principal {}: {e}", shown(text))))?;
    if !leasehold_schemas::subjects::is_bindable(text) {
        return Err(BadCommandLine(format!(
            "principal {principal} cannot be bound to a NATS producer: its subjects are lh.in.op@<principal>.>, so a \
             principal is one subject token (no `.`, `*` or `>`)"
        )));
    }
    Ok(principal)
}

/// A map of attributes, refusing a name given twice.
fn attributes(pairs: &[(String, String)]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for (name, value) in pairs {
        if map.insert(name.clone(), value.clone()).is_some() {
            bail!("--attr {name} is given twice");
        }
    }
    Ok(map)
}

/// The pool kind `pool define` asks for, checked the way the writer checks it.
pub(crate) fn pool_kind(args: &PoolDefineArgs) -> anyhow::Result<PoolKind> {
    let kind = match (args.ipv4, args.slots, args.ports) {
        (Some((network, prefix_len)), None, None) => {
            let exclude = args
                .exclude
                .iter()
                .map(|ip| ip.parse::<Ipv4Addr>().map_err(|e| anyhow!("--exclude {ip:?} is not an IPv4 address: {e}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            PoolKind::Ipv4 { network, prefix_len, exclude }
        }
        (None, Some(count), None) => PoolKind::Slots { count },
        (None, None, Some((first, last))) => {
            let exclude = args
                .exclude
                .iter()
                .map(|port| port.parse::<u16>().map_err(|e| anyhow!("--exclude {port:?} is not a port: {e}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            PoolKind::Ports { first, last, exclude }
        }
        _ => bail!("give exactly one of --ipv4, --slots and --ports"),
    };
    kind.validate().map_err(|e| anyhow!("pool {}: {e}", args.name))?;
    Ok(kind)
}

/// Where the commands of this process go: JetStream with `--nats` (as a producer bound to `--as-principal`'s
/// principal when given), else the gateway of `--server` (refused with `--as-principal`: the gateway records its
/// token's principal as the issuer).
pub(crate) async fn transport(global: &GlobalArgs, nats: &NatsArgs) -> anyhow::Result<Transport> {
    let principal = global.as_principal.as_deref().map(bound_principal).transpose()?;
    // Partitions 0: learn the partition count from the streams `serve` created.
    match (nats.config(0), principal) {
        (None, None) => Ok(Transport::Gateway(crate::client::gateway(global)?)),
        (None, Some(principal)) => Err(BadCommandLine(format!(
            "--as-principal {principal} is for --nats only (a NATS user that may publish only as {principal}): \
             through a gateway, the gateway records its token's principal as the issuer; leave --as-principal out"
        ))
        .into()),
        (Some(config), None) => Ok(Transport::nats(config).await?),
        (Some(config), Some(principal)) => Ok(Transport::nats(config).await?.bound(principal)?),
    }
}

/// The outcomes of an accepted command; anything else is an error that says why (after printing the status on
/// stdout in JSON mode, so that a program sees the rejection's kind too).
pub(crate) fn accepted(status: CommandStatus, format: OutputFormat, what: &str) -> anyhow::Result<Vec<SeqOutcome>> {
    if status.status == "accepted" {
        return Ok(status.outcomes);
    }
    if format == OutputFormat::Json {
        output::emit(&output::json(&status)?);
    }
    let id = &status.command_id;
    match status.status.as_str() {
        // Reached only by a status `settle` let through: one still waiting is an unknown outcome there already.
        "pending" | "published" => bail!(
            "{what}: no outcome in time; command {id} is stored{} and will be decided when a worker serves its \
             partition: ask again with `leasehold command {id}`",
            status.command_seq.map(|seq| format!(" at command seq {seq}")).unwrap_or_default()
        ),
        _ => Ok(leasehold_client::produce::outcomes(status, what)?),
    }
}

/// An envelope for `body` from `issuer` with id `id` (default: a new one), stamped with this machine's clock.
/// The id is noted for a JSON error (see [`output::know`]).
pub(crate) fn envelope(issuer: &Issuer, id: Option<CommandId>, body: impl Into<Command>) -> Envelope {
    let envelope = leasehold_client::produce::envelope(issuer, id, body);
    output::know("command_id", envelope.command_id);
    envelope
}

/// The exit status of a command whose outcome is not known: it may have been stored, and may be decided later.
pub(crate) const EXIT_OUTCOME_UNKNOWN: u8 = 3;
/// The exit status of `acquire --block` when the lease is still waiting at the timeout.
pub(crate) const EXIT_STILL_WAITING: u8 = 4;

/// `acquire --block` gave up: the lease was still waiting at the timeout (it goes on waiting). Its message holds
/// the command to run again, already safe to show (see [`shell_word`]): it is printed as it is, to be pasted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct StillWaiting(pub(crate) String);

/// The status of a sent command once it is decided (or dead-lettered). When its outcome is not known (no outcome
/// within `timeout`, the gateway gone after it was sent...), prints what is known on stdout — `known`, the
/// reference the command line chose (table), or the status with it (json: `status` `pending`, `published`, or the
/// command line's own `unknown` when the gateway said nothing) — and returns an [`OutcomeUnknown`], which says on
/// stderr how to learn the outcome or send the command again.
fn settle(
    sent: Result<CommandStatus, Error>,
    envelope: &Envelope,
    timeout: Duration,
    format: OutputFormat,
    known: Option<(&str, String)>,
) -> anyhow::Result<CommandStatus> {
    let unknown = match leasehold_client::produce::settle(sent, envelope, timeout) {
        Ok(status) => {
            if status.duplicate {
                eprintln!(
                    "note: command {} was stored before (a command sent again): nothing was stored again; this is its \
                     outcome",
                    leasehold_schemas::text::shown(&status.command_id)
                );
            }
            return Ok(status);
        }
        Err(Error::OutcomeUnknown(unknown)) => unknown,
        Err(e) => return Err(e.into()),
    };
    match format {
        OutputFormat::Table => {
            if let Some((_, reference)) = &known {
                output::emit(&format!("{reference}\n"));
            }
        }
        OutputFormat::Json => {
            let status = unknown.status.clone().unwrap_or_else(|| CommandStatus {
                command_id: unknown.command_id.clone(),
                status: "unknown".to_owned(),
                command_seq: None,
                duplicate: false,
                rejection: None,
                outcomes: Vec::new(),
                dead_letter: None,
            });
            let mut value = serde_json::to_value(&status)?;
            if let (Some((field, reference)), serde_json::Value::Object(map)) = (known, &mut value) {
                map.insert(field.to_owned(), reference.into());
            }
            output::emit(&output::json(&value)?);
        }
    }
    Err(Error::OutcomeUnknown(unknown).into())
}

/// A lease as `acquire` prints it in a table.
fn lease_table(record: &LeaseRecord, clock: &Clock) -> String {
    output::fields(&[
        ("id", record.id.clone()),
        ("state", record.state.clone()),
        ("token", output::opt(record.token)),
        ("resource", record.resource.clone()),
        ("holder", record.holder.clone()),
        ("expires_at", clock.when(record.expires_at)),
        ("wait_until", clock.when(record.wait_until)),
    ])
}

/// A resource as the outcome of its allocation describes it, for `--nats` (no read model to ask). The same fields
/// as the gateway's resource records, those an allocation knows.
fn allocated_resource(reference: &ResourceRef, outcomes: &[SeqOutcome]) -> serde_json::Value {
    let mut record = serde_json::json!({ "ref": reference.to_string(), "agent": reference.agent.to_string(),
        "id": reference.resource.to_string(), "state": "pending", "leases": [], "parent": null, "detail": null,
        "native_id": null });
    let mut claims = Vec::new();
    for SeqOutcome { seq, outcome } in outcomes {
        for effect in outcome.effects() {
            match effect {
                Effect::ResourceAllocated { resource, kind, capacity, attributes, parent }
                    if *resource == reference.resource =>
                {
                    record["kind"] = kind.clone().into();
                    record["capacity"] = (*capacity).into();
                    record["attrs"] = serde_json::to_value(attributes).unwrap_or_default();
                    record["parent"] = parent.as_ref().map(ToString::to_string).into();
                    record["created_seq"] = (*seq).into();
                    record["updated_at"] = outcome.log_time.0.into();
                }
                Effect::ClaimWanted { resource, pool } if *resource == reference.resource => {
                    claims.push(
                        serde_json::json!({"pool": pool.to_string(), "id": null, "status": "wanted", "token": null}),
                    );
                }
                _ => {}
            }
        }
    }
    record["claims"] = claims.into();
    record
}

/// What became of the quota slot an allocation claimed (its issuer's quota charges its kind).
#[derive(Debug)]
enum QuotaSlot {
    /// It claimed none, or gave a `--wait` (it queues for a slot: not followed).
    NotCharged,
    /// Bound: the allocation goes on (its create is ordered once every pool has bound).
    Bound(PoolName),
    /// The resource was released (over quota: the quota was full and it gave no wait).
    Released(ReleaseCause),
    /// Neither within the timeout.
    Undecided(PoolName),
}

/// An allocation by an issuer under a quota claims a slot of the quota's pool besides the pools it named. Without
/// `--wait`, it is released at once when the quota is full: this follows the resource's outcomes from after
/// `outcomes` until the slot is bound or the resource released, for at most `timeout`, so that `allocate` says
/// which instead of leaving a refusal to be found later.
async fn quota_slot(
    transport: &Transport,
    reference: &ResourceRef,
    named: &[PoolName],
    wait: Option<Millis>,
    outcomes: &[SeqOutcome],
    timeout: Duration,
) -> anyhow::Result<QuotaSlot> {
    let mine = |resource: &ResourceId| *resource == reference.resource;
    let effects = || outcomes.iter().flat_map(|o| o.outcome.effects());
    let charged = effects().find_map(|effect| match effect {
        Effect::ClaimWanted { resource, pool } if mine(resource) && !named.contains(pool) => Some(pool.clone()),
        _ => None,
    });
    let Some(pool) = charged.filter(|_| wait.is_none()) else { return Ok(QuotaSlot::NotCharged) };
    let fate = |effect: &Effect| match effect {
        Effect::ClaimBound { resource, pool: bound, .. } if mine(resource) && *bound == pool => {
            Some(QuotaSlot::Bound(pool.clone()))
        }
        Effect::ResourceReleasing { resource, cause } if mine(resource) => Some(QuotaSlot::Released(cause.clone())),
        _ => None,
    };
    if let Some(decided) = effects().find_map(fate) {
        return Ok(decided);
    }
    let from = outcomes.iter().map(|o| o.seq).max().unwrap_or(0);
    let decided = follow_agent(transport, reference, from, timeout, "its quota's slot", |event| {
        event.outcome.effects().iter().find_map(fate)
    });
    Ok(decided.await?.unwrap_or(QuotaSlot::Undecided(pool)))
}

/// Follows the outcomes of `reference`'s agent after sequence `from` until `seen` finds what it looks for, for at most
/// `timeout` (`None`: not seen by then). `what` names what it waits for, should the stream end.
async fn follow_agent<T>(
    transport: &Transport,
    reference: &ResourceRef,
    from: u64,
    timeout: Duration,
    what: &str,
    mut seen: impl FnMut(&leasehold_client::SeqOutcome) -> Option<T>,
) -> anyhow::Result<Option<T>> {
    use futures::StreamExt as _;
    let mut events = transport.follow(&leasehold_schemas::Key::Agent(reference.agent.clone()), from + 1).await?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => bail!("allocate {reference}: the outcome stream ended while it waited for {what}"),
            Ok(Some(event)) => event?,
        };
        if let Some(found) = seen(&event) {
            return Ok(Some(found));
        }
    }
}

/// The words of an allocation released before it was made: its cause, and what to do over a quota.
fn released_because(cause: &ReleaseCause) -> String {
    let hint = match cause {
        ReleaseCause::OverQuota { max, .. } if *max > 0 => {
            "; give --wait DURATION to queue for a slot, or release one of them"
        }
        _ => "",
    };
    format!("{}{hint}", crate::words::release_cause(cause))
}

/// What is said of a quota slot not bound within the timeout.
fn undecided(pool: &PoolName, reference: &ResourceRef, timeout: Duration) -> String {
    format!(
        "; no slot of quota pool {pool} bound within {}: `leasehold get {reference}` shows what became of it",
        humantime::format_duration(timeout)
    )
}

/// The quota slot of a placed resource: its commit is the first outcome about it in its agent's partition after
/// `from` (the placement's own outcome); what it claimed is followed from there as [`quota_slot`] does.
async fn placed_quota_slot(
    transport: &Transport,
    reference: &ResourceRef,
    named: &[PoolName],
    wait: Option<Millis>,
    from: u64,
    timeout: Duration,
) -> anyhow::Result<QuotaSlot> {
    let mine = |resource: &ResourceId| *resource == reference.resource;
    let commit = follow_agent(transport, reference, from, timeout, "the commit", |event| {
        let made = event
            .outcome
            .effects()
            .iter()
            .any(|effect| matches!(effect, Effect::ResourceAllocated { resource, .. } if mine(resource)));
        made.then(|| event.clone())
    });
    // Not seen within the timeout: say nothing of a slot (the placement's words stand).
    let Some(commit) = commit.await? else { return Ok(QuotaSlot::NotCharged) };
    // Made and released in the same commit (a quota of 0 for its kind, its agent retired, its parent gone).
    let ended_at_birth = commit.outcome.effects().iter().find_map(|effect| match effect {
        Effect::ResourceReleasing { resource, cause } if mine(resource) => Some(cause.clone()),
        _ => None,
    });
    match ended_at_birth {
        Some(cause) => Ok(QuotaSlot::Released(cause)),
        None => quota_slot(transport, reference, named, wait, std::slice::from_ref(&commit), timeout).await,
    }
}

/// `allocate` without `--agent`: a placement. Prints the reference once placed (and, on stderr, where and why);
/// with `--wait`, says once on stderr what it waits for each time that changes.
async fn place(args: AllocateArgs, issuer: &Issuer, global: &GlobalArgs) -> anyhow::Result<()> {
    let format = global.output;
    let transport = transport(global, &args.produce.nats).await?;
    let resource = args.id.unwrap_or_else(ResourceId::generate);
    output::know("id", resource);
    let body = Place {
        resource,
        kind: args.kind,
        capacity: args.capacity,
        attributes: attributes(&args.attrs)?,
        parent: args.parent,
        pools: args.pools,
        wait: args.wait,
        select: attributes(&args.select)?,
        strategy: if args.pack { PlacementStrategy::Pack } else { PlacementStrategy::Spread },
    };
    let envelope = envelope(issuer, args.produce.command_id, body.clone());
    let sent = transport.submit(&envelope, args.produce.timeout).await;
    let status = settle(sent, &envelope, args.produce.timeout, format, Some(("id", resource.to_string())))?;
    let what = format!("place {resource}");
    let (mut record, from) =
        leasehold_client::PlacementRecord::answered(resource, status, |status| accepted(status, format, &what))?;
    let wait = body.wait.map(|w| Duration::from_millis(w.0)).unwrap_or_default();
    let deadline = tokio::time::Instant::now() + args.produce.timeout + wait;
    record
        .follow(&transport, resource, from, deadline, |record| {
            if record.state == "waiting" {
                eprintln!("{}", leasehold_schemas::text::shown(&record.describe(&body)));
            }
        })
        .await?;
    let mut words = record.describe(&body);
    // Placed: its commit, in the agent's partition, charges the issuer's quota, if any. Without a wait, follow the
    // slot as `allocate --agent` does: over quota the resource made is released at once.
    let placed = record.reference.as_deref().filter(|_| record.state == "placed").map(str::parse::<ResourceRef>);
    if let Some(reference) = placed.transpose().ok().flatten() {
        match placed_quota_slot(&transport, &reference, &body.pools, body.wait, from, args.produce.timeout).await? {
            QuotaSlot::Released(cause) => {
                bail!("allocate {resource}: placed on {}, then released: {}", reference.agent, released_because(&cause))
            }
            QuotaSlot::Bound(pool) => words.push_str(&format!("; its quota's slot is bound (pool {pool})")),
            QuotaSlot::Undecided(pool) => words.push_str(&undecided(&pool, &reference, args.produce.timeout)),
            QuotaSlot::NotCharged => {}
        }
    }
    match (record.state.as_str(), format) {
        ("placed", OutputFormat::Table) => {
            let reference = record.reference.clone().unwrap_or_default();
            output::emit(&format!("{reference}\n"));
            eprintln!("{}", leasehold_schemas::text::shown(&words));
        }
        ("placed", OutputFormat::Json) => {
            let reference = record.reference.clone().unwrap_or_default();
            let resource_record = match &transport {
                Transport::Gateway(gateway) => {
                    gateway.get::<serde_json::Value>(&["v1", "resources", &reference], &[]).await?
                }
                _ => None,
            };
            let value = serde_json::json!({ "placement": record, "said": words, "resource": resource_record });
            output::emit(&output::json(&value)?);
        }
        ("failed" | "cancelled", _) => {
            if format == OutputFormat::Json {
                output::emit(&output::json(&serde_json::json!({ "placement": record, "said": words }))?);
            }
            bail!("allocate {resource}: {words}");
        }
        _ => {
            if format == OutputFormat::Json {
                output::emit(&output::json(&serde_json::json!({ "placement": record, "said": words }))?);
            }
            let again = format!("leasehold get {resource}");
            return Err(StillWaiting(format!(
                "the placement of {resource} is still {} after {}: {words}; it goes on in the log (see `{again}`)",
                record.state,
                humantime::format_duration(args.produce.timeout + wait)
            ))
            .into());
        }
    }
    Ok(())
}

/// Runs one producer command.
pub(crate) async fn run(command: ProduceCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    let issuer = sender(global)?;
    let format = global.output;
    match command {
        ProduceCmd::Allocate(args) if args.agent.is_none() => place(args, &issuer, global).await?,
        ProduceCmd::Allocate(args) => {
            let transport = transport(global, &args.produce.nats).await?;
            let resource = args.id.unwrap_or_else(ResourceId::generate);
            let agent = args.agent.clone().expect("the placement's arm takes allocations without an agent");
            let reference = ResourceRef::new(agent.clone(), resource);
            output::know("ref", &reference);
            let kind = args.kind.clone();
            let body = Allocate {
                agent,
                resource,
                kind: args.kind,
                capacity: args.capacity,
                attributes: attributes(&args.attrs)?,
                parent: args.parent,
                pools: args.pools.clone(),
                wait: args.wait,
            };
            let envelope = envelope(&issuer, args.produce.command_id, body);
            let sent = transport.submit(&envelope, args.produce.timeout).await;
            let status = settle(sent, &envelope, args.produce.timeout, format, Some(("ref", reference.to_string())))?;
            let command_id = status.command_id.clone();
            let outcomes = accepted(status, format, &format!("allocate {reference}"))?;
            leasehold_client::produce::check_allocated(&command_id, &reference, &outcomes)?;
            let quota = quota_slot(&transport, &reference, &args.pools, args.wait, &outcomes, args.produce.timeout);
            let quota = match quota.await? {
                QuotaSlot::Released(cause) => {
                    bail!("allocate {reference}: accepted, then released: {}", released_because(&cause))
                }
                other => other,
            };
            match format {
                OutputFormat::Table => {
                    output::emit(&format!("{reference}\n"));
                    let mut words =
                        crate::words::accepted(&format!("allocate {reference}"), &outcomes, &Clock::system());
                    match quota {
                        // What the decision said ("waiting for an identifier of pool quota-...") is over: say what is.
                        QuotaSlot::Bound(pool) if args.pools.is_empty() => {
                            words = format!(
                                "allocated {reference}: {kind}, pending; its quota's slot is bound (pool {pool}); {} \
                                 is asked to create it",
                                reference.agent
                            );
                        }
                        QuotaSlot::Bound(pool) => words.push_str(&format!("; its quota's slot is bound (pool {pool})")),
                        QuotaSlot::Undecided(pool) => {
                            words.push_str(&undecided(&pool, &reference, args.produce.timeout))
                        }
                        QuotaSlot::NotCharged | QuotaSlot::Released(_) => {}
                    }
                    eprintln!("{}", leasehold_schemas::text::escape_for_display(&words));
                }
                OutputFormat::Json => {
                    let record = match &transport {
                        Transport::Gateway(gateway) => {
                            gateway.get::<serde_json::Value>(&["v1", "resources", &reference.to_string()], &[]).await?
                        }
                        _ => None,
                    };
                    let record = record.unwrap_or_else(|| allocated_resource(&reference, &outcomes));
                    output::emit(&output::json(&record)?);
                }
            }
        }
        ProduceCmd::Acquire(args) => acquire(args, &issuer, global).await?,
        ProduceCmd::Renew(args) => {
            let body = Renew {
                agent: args.lease.agent.clone(),
                lease: args.lease.lease,
                token: Position(args.token),
                ttl: args.ttl,
            };
            simple(
                global,
                &args.produce,
                envelope(&issuer, args.produce.command_id, body),
                &format!("renew {}", args.lease),
            )
            .await?;
        }
        ProduceCmd::ReleaseLease(args) => {
            let body = ReleaseLease {
                agent: args.lease.agent.clone(),
                lease: args.lease.lease,
                token: args.token.map(Position),
            };
            simple(
                global,
                &args.produce,
                envelope(&issuer, args.produce.command_id, body),
                &format!("release-lease {}", args.lease),
            )
            .await?;
        }
        ProduceCmd::Release(args) => {
            let what = format!("release {}", args.resource);
            let body = Release { agent: args.resource.agent, resource: args.resource.resource, reason: args.reason };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::Pause(args) => {
            let what = format!("pause {}", args.resource);
            let body = Pause {
                agent: args.resource.agent,
                resource: args.resource.resource,
                reason: args.reason,
                until: args.until,
            };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::Unpause(args) => {
            let what = format!("unpause {}", args.resource);
            let body = Unpause { agent: args.resource.agent, resource: args.resource.resource };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::Update(args) => {
            if args.capacity.is_none()
                && args.attrs.is_empty()
                && args.remove_attrs.is_empty()
                && args.max_lease.is_none()
            {
                bail!(
                    "update {}: nothing to change: give --capacity, --attr, --remove-attr or --max-lease",
                    args.resource
                );
            }
            let what = format!("update {}", args.resource);
            let body = Update {
                agent: args.resource.agent,
                resource: args.resource.resource,
                set: attributes(&args.attrs)?,
                remove: args.remove_attrs,
                capacity: args.capacity,
                max_lease: args.max_lease,
            };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::ReportFailure(args) => {
            let what = format!("report-failure {}", args.resource);
            let body = ReportFailureByOperator {
                agent: args.resource.agent,
                resource: args.resource.resource,
                detail: args.reason,
            };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::PoolDefine(args) => {
            let kind = pool_kind(&args)?;
            let what = format!("pool define {}", args.name);
            let body = DefinePool {
                pool: args.name,
                kind,
                cooldown: args.cooldown,
                orphans: args.orphans.unwrap_or_default(),
            };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::PoolUpdate(args) => {
            let kind = pool_kind(&args)?;
            let what = format!("pool update {}", args.name);
            let body = UpdatePool { pool: args.name, kind, cooldown: args.cooldown, orphans: args.orphans };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::PoolFreeOrphan(args) => {
            let what = format!("pool free-orphan {}", args.resource);
            let body = FreeOrphan {
                agent: args.resource.agent,
                resource: args.resource.resource,
                pool: args.pool,
                reason: args.reason,
            };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::PoolDelete(args) => {
            let what = format!("pool delete {}", args.name);
            let body = DeletePool { pool: args.name };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentRetire(args) if args.dry_run => retire_dry_run(&args, global).await?,
        ProduceCmd::AgentRetire(args) => {
            let what = format!("agent retire {}", args.name);
            // The condition the operator accepted travels in the command: the partition refuses it, changing
            // nothing, if a resource holds a lease when it decides, whatever a read model said before.
            let body = RetireAgent { agent: args.name, only_if_unleased: !args.yes };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentDrain(args) => {
            let what = format!("agent drain {}", args.name);
            let body = DrainAgent { agent: args.name, deadline: args.deadline, grace: args.grace, reason: args.reason };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentUnretire(args) => {
            let what = format!("agent unretire {}", args.name);
            let body = UnretireAgent { agent: args.name };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentCordon(args) => {
            let what = format!("agent cordon {}", args.name);
            let body = CordonAgent { agent: args.name, reason: args.reason };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentUncordon(args) => {
            let what = format!("agent uncordon {}", args.name);
            let body = UncordonAgent { agent: args.name };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
        ProduceCmd::AgentConfirmLoss(args) => {
            let what = format!("agent confirm-loss {}", args.name);
            let body = ConfirmLoss { agent: args.name };
            simple(global, &args.produce, envelope(&issuer, args.produce.command_id, body), &what).await?;
        }
    }
    Ok(())
}

/// `agent retire NAME --dry-run`: what a retirement would release (the agent's resources not yet released, as the
/// gateway's read models have them), marking those holding a lease; nothing is sent.
async fn retire_dry_run(args: &RetireArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    if args.produce.nats.nats.is_some() {
        bail!("agent retire --dry-run reads the gateway's read models; it takes no --nats");
    }
    let gateway = crate::client::gateway(global)?;
    let agents = gateway.get::<Vec<serde_json::Value>>(&["v1", "agents"], &[]).await?.unwrap_or_default();
    let Some(agent) = agents.iter().find(|a| a["name"] == args.name.as_str()) else {
        bail!("agent {} is not known to the gateway at {}", args.name, global.server);
    };
    let query = [("agent", args.name.to_string())];
    let records = gateway.get::<Vec<serde_json::Value>>(&["v1", "resources"], &query).await?.unwrap_or_default();
    let live =
        |r: &&serde_json::Value| matches!(r["state"].as_str(), Some("pending" | "active" | "paused" | "suspect"));
    let would_release: Vec<&serde_json::Value> = records.iter().filter(live).collect();
    let leased: Vec<&serde_json::Value> =
        would_release.iter().copied().filter(|r| r["leases"].as_array().is_some_and(|l| !l.is_empty())).collect();
    let retired = agent["retired"].as_bool() == Some(true);
    match global.output {
        OutputFormat::Json => output::emit(&output::json(&serde_json::json!({
            "agent": args.name.as_str(),
            "dry_run": true,
            "retired": retired,
            "would_release": would_release,
            "leased": leased.iter().map(|r| r["ref"].clone()).collect::<Vec<_>>(),
            "as_of": agent["as_of"],
        }))?),
        OutputFormat::Table => output::emit(&dry_run_text(&args.name, retired, &would_release, leased.len())),
    }
    Ok(())
}

/// The table of `agent retire --dry-run` and a line that says what the retirement would do.
fn dry_run_text(agent: &AgentName, retired: bool, would_release: &[&serde_json::Value], n_leased: usize) -> String {
    use output::cell;
    let mut text = String::new();
    if !would_release.is_empty() {
        let mut table = output::Table::new(&["REF", "KIND", "STATE", "LEASES"]);
        for record in would_release {
            let leases = record["leases"].as_array().map_or_else(Vec::new, |leases| {
                leases
                    .iter()
                    .map(|l| format!("{} (holder {}, {})", cell(&l["id"]), cell(&l["holder"]), cell(&l["state"])))
                    .collect()
            });
            let leases = if leases.is_empty() { "-".to_owned() } else { format!("LEASED: {}", leases.join(", ")) };
            table.row(vec![cell(&record["ref"]), cell(&record["kind"]), cell(&record["state"]), leases]);
        }
        text.push_str(&table.render());
    }
    let n = would_release.len();
    let resources = if n == 1 { "resource" } else { "resources" };
    let line = if retired {
        format!("agent {agent} is retired already: what it held is being released; nothing sent")
    } else if n_leased == 0 {
        format!("agent retire {agent} would release {n} {resources}, none holding a lease; nothing sent")
    } else {
        format!(
            "agent retire {agent} would release {n} {resources}, {n_leased} holding a lease; nothing sent. `leasehold \
             agent retire {agent}` is refused while one holds a lease: add --yes to release them anyway (their leases \
             are broken)"
        )
    };
    text.push_str(&line);
    text.push('\n');
    text
}

/// A producer command that prints its outcome: the command status in JSON, what changed in words in a table. A
/// rejection that says the state asked for already holds (a second release) is not a failure: it says so (json: the
/// status, as it is) and exits 0.
pub(crate) async fn simple(
    global: &GlobalArgs,
    produce: &ProduceArgs,
    envelope: Envelope,
    what: &str,
) -> anyhow::Result<()> {
    let status = decided(global, produce, &envelope).await?;
    let holds = status
        .rejection
        .as_ref()
        .filter(|_| status.status == "rejected")
        .and_then(|rejection| crate::words::end_state_holds(envelope.type_name(), rejection));
    if let Some(holds) = holds {
        match global.output {
            OutputFormat::Json => output::emit(&output::json(&status)?),
            OutputFormat::Table => {
                let holds = Clock::system().localize(&holds);
                output::emit(&format!("{}: {}\n", leasehold_schemas::text::shown(what), shown(&holds)));
            }
        }
        return Ok(());
    }
    let kept = status.clone();
    accepted(status, global.output, what)?;
    match global.output {
        OutputFormat::Json => output::emit(&output::json(&kept)?),
        OutputFormat::Table => {
            let text = crate::words::accepted(what, &kept.outcomes, &Clock::system());
            output::emit(&format!("{}\n", leasehold_schemas::text::escape_for_display(&text)));
        }
    }
    Ok(())
}

/// Sends `envelope` and waits for its outcome, as [`simple`] does, printing nothing: an error when it was not
/// accepted; its status when it was.
pub(crate) async fn accepted_quietly(
    global: &GlobalArgs,
    produce: &ProduceArgs,
    envelope: &Envelope,
    what: &str,
) -> anyhow::Result<leasehold_client::CommandStatus> {
    let status = decided(global, produce, envelope).await?;
    let kept = status.clone();
    accepted(status, global.output, what)?;
    Ok(kept)
}

/// Sends `envelope` and waits until it is decided (or dead-lettered): its status, whatever the decision; an error
/// when its outcome is not known (see [`settle`]) or it could not be sent.
async fn decided(
    global: &GlobalArgs,
    produce: &ProduceArgs,
    envelope: &Envelope,
) -> anyhow::Result<leasehold_client::CommandStatus> {
    let transport = transport(global, &produce.nats).await?;
    decided_through(&transport, global.output, produce.timeout, envelope).await
}

/// [`decided`], through a transport made already (a command line that sends several commands connects once).
pub(crate) async fn decided_through(
    transport: &Transport,
    format: OutputFormat,
    timeout: Duration,
    envelope: &Envelope,
) -> anyhow::Result<leasehold_client::CommandStatus> {
    let sent = transport.submit(envelope, timeout).await;
    settle(sent, envelope, timeout, format, None)
}

async fn acquire(args: AcquireArgs, issuer: &Issuer, global: &GlobalArgs) -> anyhow::Result<()> {
    let transport = transport(global, &args.produce.nats).await?;
    let lease = args.lease_id.unwrap_or_else(LeaseId::generate);
    let lease_ref = LeaseRef { agent: args.resource.agent.clone(), lease };
    output::know("lease", &lease_ref);
    let body = Acquire {
        agent: args.resource.agent.clone(),
        resource: args.resource.resource,
        lease,
        holder: args.holder.clone(),
        ttl: args.ttl,
        wait_timeout: args.wait_timeout,
        priority: args.priority,
    };
    let what = format!("acquire {}", args.resource);
    let envelope = envelope(issuer, args.produce.command_id, body.clone());
    let sent = transport.submit(&envelope, args.produce.timeout).await;
    let status = settle(sent, &envelope, args.produce.timeout, global.output, Some(("lease", lease_ref.to_string())))?;
    let command_id = status.command_id.clone();
    let outcomes = accepted(status, global.output, &what)?;
    let (mut record, last_seq) = LeaseRecord::acquired(&body, &command_id, &outcomes)?;
    if args.block && record.state == "waiting" {
        if global.output == OutputFormat::Table {
            output::emit(&lease_table(&record, &Clock::system()));
        }
        // The timeout counts from here: the acquisition itself is decided.
        let deadline = tokio::time::Instant::now() + args.produce.timeout;
        let queue = QueueWatch::new(global, &args, &lease_ref);
        queue.show().await;
        let waited = record.wait_with(&transport, &lease_ref, last_seq + 1, deadline, || queue.show()).await?;
        if !waited {
            if global.output == OutputFormat::Json {
                let mut value = serde_json::to_value(&record)?;
                if let serde_json::Value::Object(map) = &mut value {
                    map.insert("command_id".to_owned(), command_id.clone().into());
                }
                output::emit(&output::json(&value)?);
            }
            let again = wait_again(&args, global, &command_id, lease);
            return Err(StillWaiting(still_waiting(&record, args.produce.timeout, &again, &Clock::system())).into());
        }
    }
    match global.output {
        OutputFormat::Table => {
            let clock = Clock::system();
            let words = crate::words::accepted(&what, &outcomes, &clock);
            eprintln!("{}", leasehold_schemas::text::escape_for_display(&words));
            output::emit(&lease_table(&record, &clock));
        }
        OutputFormat::Json => output::emit(&output::json(&record)?),
    }
    if args.block && record.state != "active" {
        bail!("lease {lease_ref} was not granted: it is {}", record.state);
    }
    Ok(())
}

/// What `acquire --block` tells on stderr while its lease waits: its place in the resource's queue each time it
/// changes, from the gateway's lease records (with `--nats` there is no read model to ask: it says so once).
struct QueueWatch {
    gateway: Option<crate::client::Gateway>,
    resource: String,
    lease: String,
    last: std::sync::Mutex<Option<(usize, usize)>>,
}

impl QueueWatch {
    fn new(global: &GlobalArgs, args: &AcquireArgs, lease: &LeaseRef) -> Self {
        let gateway = match args.produce.nats.nats {
            Some(_) => {
                eprintln!("lease {lease} waits (its place in the queue is shown through a gateway, not with --nats)");
                None
            }
            None => crate::client::gateway(global).ok(),
        };
        QueueWatch { gateway, resource: args.resource.to_string(), lease: lease.to_string(), last: Default::default() }
    }

    /// Prints the lease's place when it changed since the last time (nothing when the gateway does not answer: the
    /// wait itself goes on).
    async fn show(&self) {
        let Some(gateway) = &self.gateway else { return };
        let query = [("resource", self.resource.clone())];
        let Ok(Some(leases)) = gateway.get::<Vec<leasehold_projector::LeaseView>>(&["v1", "leases"], &query).await
        else {
            return;
        };
        let places = leasehold_projector::queue_places(&leases, output::now_ms());
        let Some(place) = places.get(&self.lease) else { return };
        let now = (place.position, places.len());
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last != Some(now) {
            *last = Some(now);
            eprintln!(
                "lease {} is {} of {} in the queue of {} (effective priority {})",
                self.lease, place.position, now.1, self.resource, place.effective_priority
            );
        }
    }
}

/// What `acquire --block` says when it gives up on a lease that still waits; `again` is the command that waits on.
fn still_waiting(record: &LeaseRecord, waited: Duration, again: &str, clock: &Clock) -> String {
    let ends = match record.wait_until {
        Some(until) => format!("its wait ends by itself at {}", clock.when(Some(until))),
        None => "it has no wait timeout: it waits as long as the resource is pending".to_owned(),
    };
    format!(
        "still waiting after {}: lease {} is waiting; {ends}; it may still be granted: release it with `leasehold \
         release-lease {}` if it is not wanted any more, or wait longer with the same command and lease ids (another \
         acquisition would be refused): `{again}`",
        humantime::format_duration(waited),
        record.id,
        record.id
    )
}

/// The command line that sends this acquisition again, with its command id and lease id, and waits on: the same
/// body (holder, ttl, wait timeout), so the log and the gateway take it for the same command.
fn wait_again(args: &AcquireArgs, global: &GlobalArgs, command_id: &str, lease: LeaseId) -> String {
    let mut words = vec!["leasehold".to_owned()];
    if global.server != crate::client::DEFAULT_SERVER && args.produce.nats.nats.is_none() {
        words.extend(["--server".to_owned(), shell_word(&global.server)]);
    }
    words.extend(["acquire".to_owned(), args.resource.to_string(), "--holder".to_owned(), shell_word(&args.holder)]);
    if let Some(ttl) = args.ttl {
        words.extend(["--ttl".to_owned(), ttl.to_string()]);
    }
    if let Some(wait) = args.wait_timeout {
        words.extend(["--wait-timeout".to_owned(), wait.to_string()]);
    }
    if args.priority != 0 {
        words.extend(["--priority".to_owned(), args.priority.to_string()]);
    }
    words.extend([
        "--command-id".to_owned(),
        shell_word(command_id),
        "--lease-id".to_owned(),
        lease.to_string(),
        "--block".to_owned(),
        "--timeout".to_owned(),
        humantime::format_duration(args.produce.timeout).to_string().replace(' ', ""),
    ]);
    let nats = &args.produce.nats;
    if let Some(url) = &nats.nats {
        words.extend(["--nats".to_owned(), shell_word(url)]);
        if let Some(creds) = &nats.creds {
            words.extend(["--creds".to_owned(), shell_word(&creds.display().to_string())]);
        }
        if let Some(seed) = &nats.nkey_seed {
            words.extend(["--nkey-seed".to_owned(), shell_word(&seed.display().to_string())]);
        }
        if let Some(prefix) = &nats.inbox_prefix {
            words.extend(["--inbox-prefix".to_owned(), shell_word(prefix)]);
        }
        if let Some(user) = &nats.user {
            // The password is not repeated on stderr.
            words.extend(["--user".to_owned(), shell_word(user), "--password".to_owned(), "PASSWORD".to_owned()]);
        }
    }
    if let Some(issuer) = &global.issuer {
        words.extend(["--issuer".to_owned(), shell_word(issuer)]);
    }
    if let Some(principal) = &global.as_principal {
        words.extend(["--as-principal".to_owned(), shell_word(principal)]);
    }
    words.join(" ")
}

/// `text` as one word for a POSIX shell: as it is when that is safe, else in single quotes. A word with a control or
/// bidi character (see `leasehold_schemas::text`) is written in ANSI-C quotes instead (`$'x\e[31m'` as
/// `$'x\x1b[31m'`; bash, zsh, ksh and POSIX.1-2024 shells read them): the same word, safe to show on a terminal
/// and to paste.
pub(crate) fn shell_word(text: &str) -> String {
    use std::fmt::Write as _;
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if plain {
        return text.to_owned();
    }
    if !text.contains(leasehold_schemas::text::is_unsafe_for_display) {
        return format!("'{}'", text.replace('\'', "'\\''"));
    }
    let mut word = "$'".to_owned();
    for c in text.chars() {
        match c {
            '\\' => word.push_str("\\\\"),
            '\'' => word.push_str("\\'"),
            '\n' => word.push_str("\\n"),
            '\r' => word.push_str("\\r"),
            '\t' => word.push_str("\\t"),
            c if leasehold_schemas::text::is_unsafe_for_display(c) && (c as u32) < 0x80 => {
                let _ = write!(word, "\\x{:02x}", c as u32);
            }
            c if leasehold_schemas::text::is_unsafe_for_display(c) => {
                let _ = write!(word, "\\u{:04x}", c as u32);
            }
            c => word.push(c),
        }
    }
    word.push('\'');
    word
}

/// The producer commands, as `lib.rs` dispatches them.
#[derive(Debug)]
pub(crate) enum ProduceCmd {
    Allocate(AllocateArgs),
    Acquire(AcquireArgs),
    Renew(RenewArgs),
    ReleaseLease(ReleaseLeaseArgs),
    Release(ReleaseArgs),
    Pause(PauseArgs),
    Unpause(UnpauseArgs),
    Update(UpdateArgs),
    ReportFailure(ReportFailureArgs),
    PoolDefine(PoolDefineArgs),
    PoolUpdate(PoolDefineArgs),
    PoolDelete(PoolDeleteArgs),
    PoolFreeOrphan(PoolFreeOrphanArgs),
    AgentRetire(RetireArgs),
    AgentDrain(DrainArgs),
    AgentUnretire(AgentNameArgs),
    AgentCordon(CordonArgs),
    AgentUncordon(AgentNameArgs),
    AgentConfirmLoss(AgentNameArgs),
}

#[cfg(test)]
mod tests {
    use leasehold_schemas::Outcome;

    use super::*;

    #[test]
    fn attributes_are_name_equals_value() {
        assert_eq!(parse_attr("image=alpine:3.20"), Ok(("image".into(), "alpine:3.20".into())));
        assert_eq!(parse_attr("expr=a=b"), Ok(("expr".into(), "a=b".into())));
        assert_eq!(parse_attr("empty="), Ok(("empty".into(), String::new())));
        assert!(parse_attr("=x").is_err());
        assert!(parse_attr("novalue").is_err());
        let twice = attributes(&[("a".into(), "1".into()), ("a".into(), "2".into())]);
        assert!(twice.unwrap_err().to_string().contains("--attr a is given twice"));
    }

    #[test]
    fn durations_and_times() {
        assert_eq!(parse_millis("5min"), Ok(Millis(300_000)));
        assert_eq!(parse_millis("1500ms"), Ok(Millis(1500)));
        assert!(parse_millis("soon").is_err());
        assert_eq!(parse_until("2027-01-15T08:00:00Z"), Ok(Timestamp(1_800_000_000_000)));
        let now = unix_ms(SystemTime::now());
        let in_two_hours = parse_until("2h").unwrap().0;
        assert!((now + 7_200_000..now + 7_260_000).contains(&in_two_hours), "{in_two_hours} vs {now}");
        assert!(parse_until("tomorrow").unwrap_err().contains("RFC 3339"));
    }

    #[test]
    fn the_issuer_is_given_or_the_user() {
        assert_eq!(issuer(Some("op:alice@example")).unwrap().as_str(), "op:alice@example");
        assert!(issuer(Some("has space")).unwrap_err().to_string().starts_with("--issuer"));
        let default = issuer(None).unwrap();
        assert!(default.as_str() == "cli" || default.as_str().starts_with("cli:"), "{default}");
    }

    fn parse(argv: &[&str]) -> Result<crate::Cli, clap::Error> {
        use clap::Parser as _;
        crate::Cli::try_parse_from(std::iter::once("leasehold").chain(argv.iter().copied()))
    }

    const REF: &str = "w1.019b76da-9478-7111-9111-111111111111";
    const LEASE: &str = "w1.019b76da-9860-7333-b333-333333333333";

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        crate::Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let defaults = parse(&["get", REF]).unwrap();
        assert_eq!(defaults.global.server, "http://127.0.0.1:7420");
        assert_eq!(defaults.global.output, OutputFormat::Table);
        assert_eq!(defaults.global.issuer, None);
        for argv in [
            &["--output", "json", "--server", "http://h:1", "--issuer", "ci-7", "get", REF][..],
            &["get", REF, "--output", "json", "--server", "http://h:1", "--issuer", "ci-7"][..],
            &[
                "--output",
                "json",
                "pool",
                "define",
                "ips",
                "--slots",
                "2",
                "--server",
                "http://h:1",
                "--issuer",
                "ci-7",
            ][..],
        ] {
            let cli = parse(argv).unwrap();
            assert_eq!(cli.global.output, OutputFormat::Json, "{argv:?}");
            assert_eq!(cli.global.server, "http://h:1", "{argv:?}");
            assert_eq!(cli.global.issuer.as_deref(), Some("ci-7"), "{argv:?}");
        }
        assert!(parse(&["--output", "yaml", "agents"]).is_err());
    }

    #[test]
    fn producer_arguments_parse_to_their_values() {
        let cli = parse(&["acquire", REF, "--holder", "build-1", "--ttl", "5min", "--wait-timeout", "1m", "--block"]);
        let crate::Cmd::Acquire(args) = cli.unwrap().command else { panic!("not acquire") };
        assert_eq!(args.resource.to_string(), REF);
        assert_eq!((args.ttl, args.wait_timeout, args.block), (Some(Millis(300_000)), Some(Millis(60_000)), true));
        assert_eq!(args.produce.timeout, Duration::from_secs(30));
        assert!(args.produce.nats.nats.is_none());
        assert!(parse(&["acquire", REF]).is_err(), "--holder is required");
        assert!(parse(&["acquire", "not-a-ref", "--holder", "h"]).is_err());

        let crate::Cmd::ReleaseLease(args) = parse(&["release-lease", LEASE]).unwrap().command else { panic!() };
        assert_eq!((args.lease.to_string(), args.token), (LEASE.to_owned(), None));
        let crate::Cmd::Renew(args) = parse(&["renew", LEASE, "--token", "17"]).unwrap().command else { panic!() };
        assert_eq!((args.token, args.ttl), (17, None));
        assert!(parse(&["renew", LEASE]).is_err(), "renew needs the token");

        let argv = ["update", REF, "--capacity", "3", "--attr", "a=b", "--attr", "c=", "--remove-attr", "d"];
        let crate::Cmd::Update(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!(args.capacity, Some(3));
        assert_eq!(args.attrs, vec![("a".to_owned(), "b".to_owned()), ("c".to_owned(), String::new())]);
        assert_eq!(args.remove_attrs, vec!["d".to_owned()]);
        assert!(parse(&["update", REF, "--attr", "novalue"]).is_err());

        let argv = ["pause", REF, "--reason", "disk", "--until", "2027-01-15T08:00:00Z"];
        let crate::Cmd::Pause(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!(args.until, Some(Timestamp(1_800_000_000_000)));
        assert!(parse(&["report-failure", REF]).is_err(), "report-failure needs a reason");

        let argv = ["allocate", "--agent", "w1", "--kind", "dir", "--pool", "ips", "--pool", "gpus", "--parent", REF];
        let crate::Cmd::Allocate(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!((args.capacity, args.pools.len()), (1, 2));
        assert_eq!(args.parent.map(|p| p.to_string()).as_deref(), Some(REF));
        assert!(parse(&["allocate", "--agent", "W1", "--kind", "dir"]).is_err(), "agent names are lower-case");
    }

    #[test]
    fn nats_flags_go_together() {
        let argv =
            ["release", REF, "--nats", "nats://127.0.0.1:4222", "--user", "u", "--password", "p", "--timeout", "5s"];
        let crate::Cmd::Release(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!(args.produce.timeout, Duration::from_secs(5));
        let config = args.produce.nats.config(0).expect("--nats given");
        assert_eq!(config.url, "nats://127.0.0.1:4222");
        assert!(parse(&["release", REF, "--creds", "/x.creds"]).is_err(), "--creds needs --nats");
        assert!(parse(&["release", REF, "--nats", "nats://h", "--user", "u"]).is_err(), "--user needs --password");
        assert!(parse(&["get", REF, "--nats", "nats://h"]).is_err(), "queries go through the gateway");
    }

    #[test]
    fn query_arguments_parse() {
        let crate::Cmd::Watch(args) = parse(&["watch", "--key", "@ips", "--from", "5"]).unwrap().command else {
            panic!()
        };
        assert_eq!((args.key.map(|k| k.token()), args.from), (Some("@ips".to_owned()), Some(5)));
        assert!(parse(&["watch", "--key", "@"]).is_err());
        let crate::Cmd::Leases(args) = parse(&["leases"]).unwrap().command else { panic!() };
        assert!(args.resource.is_none() && !args.list.all && args.list.limit.is_none());
        let argv = ["ls", "--attr", "team=ci", "--attr", "zone=a", "--holder", "b-1", "--all", "--limit", "5"];
        let crate::Cmd::Ls(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!(
            args.list.query(),
            vec![
                ("attr", "team=ci".to_owned()),
                ("attr", "zone=a".to_owned()),
                ("holder", "b-1".to_owned()),
                ("all", "true".to_owned()),
                ("limit", "5".to_owned())
            ]
        );
        assert!(parse(&["leases", REF, "--limit", "0"]).is_err(), "a page holds at least one");
        assert!(parse(&["ls", "--watch", "--after", REF]).is_err(), "--watch draws the whole list");
        assert!(parse(&["leases", "--watch", "--holder", "h"]).is_ok());
        assert!(parse(&["command", "not-an-id"]).is_err());
        assert!(parse(&["ls", "--agent", "w1", "--state", "active", "--kind", "dir"]).is_ok());
        assert!(parse(&["dlq", "ls", "--from", "3", "--limit", "10"]).is_ok());
        assert!(parse(&["pool", "ls"]).is_ok());
    }

    #[test]
    fn pool_kinds_are_checked_before_sending() {
        use clap::Parser as _;
        let define = |argv: &[&str]| -> anyhow::Result<PoolKind> {
            let cli = crate::Cli::try_parse_from(argv)?;
            match cli.command {
                crate::Cmd::Pool(crate::PoolCmd::Define(args)) => pool_kind(&args),
                other => bail!("parsed as {other:?}"),
            }
        };
        let ipv4 = define(&["leasehold", "pool", "define", "ips", "--ipv4", "10.20.0.0/24", "--exclude", "10.20.0.1"]);
        assert_eq!(
            ipv4.unwrap(),
            PoolKind::Ipv4 {
                network: Ipv4Addr::new(10, 20, 0, 0),
                prefix_len: 24,
                exclude: vec![Ipv4Addr::new(10, 20, 0, 1)]
            }
        );
        assert_eq!(
            define(&["leasehold", "pool", "define", "gpus", "--slots", "4"]).unwrap(),
            PoolKind::Slots { count: 4 }
        );
        let host_bits = define(&["leasehold", "pool", "define", "ips", "--ipv4", "10.20.0.5/24"]).unwrap_err();
        assert!(host_bits.to_string().contains("did you mean 10.20.0.0/24"), "{host_bits}");
        assert!(define(&["leasehold", "pool", "define", "ips"]).is_err(), "a kind is required");
        assert!(define(&["leasehold", "pool", "define", "ips", "--slots", "4", "--ipv4", "10.0.0.0/8"]).is_err());
        assert!(define(&["leasehold", "pool", "define", "ips", "--slots", "4", "--exclude", "1"]).is_err());
        let ports = define(&["leasehold", "pool", "define", "p", "--ports", "30000-30099", "--exclude", "30080"]);
        assert_eq!(ports.unwrap(), PoolKind::Ports { first: 30000, last: 30099, exclude: vec![30080] });
    }

    #[test]
    fn an_allocation_without_a_read_model_is_described_by_its_outcome() {
        let outcome: Outcome = serde_json::from_value(serde_json::json!({
            "decider_version": 1, "partition": 5,
            "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.allocate",
                        "issuer": "cli", "issued_at": 1767225601000u64, "key": "w1"},
            "cmd_seq": 3, "part": 0, "log_time": 1767225601007u64, "decided_at": 1767225601007u64,
            "decision": {"accepted": {"first_position": 10, "effects": [
                {"resource-allocated": {"resource": "019b76da-9478-7111-9111-111111111111", "kind": "container",
                    "capacity": 2, "attributes": {"image": "alpine"}, "parent": null}},
                {"claim-wanted": {"resource": "019b76da-9478-7111-9111-111111111111", "pool": "ips"}}
            ]}}
        }))
        .unwrap();
        let reference: ResourceRef = "w1.019b76da-9478-7111-9111-111111111111".parse().unwrap();
        let record = allocated_resource(&reference, &[SeqOutcome { seq: 40, outcome }]);
        assert_eq!(record["ref"], reference.to_string());
        assert_eq!(record["state"], "pending");
        assert_eq!(record["capacity"], 2);
        assert_eq!(record["attrs"]["image"], "alpine");
        assert_eq!(record["created_seq"], 40);
        assert_eq!(record["claims"][0]["pool"], "ips");
        assert_eq!(record["claims"][0]["status"], "wanted");
    }

    #[test]
    fn only_an_accepted_status_goes_on() {
        let status = |status: &str| CommandStatus {
            command_id: "019b76da-abe8-7001-8000-000000000001".into(),
            status: status.into(),
            command_seq: Some(12),
            duplicate: false,
            rejection: (status == "rejected").then(|| crate::client::RejectionInfo {
                kind: "at-capacity".into(),
                message: "has 2 of 2 leases".into(),
            }),
            outcomes: Vec::new(),
            dead_letter: None,
        };
        assert!(accepted(status("accepted"), OutputFormat::Table, "acquire").is_ok());
        let rejected = accepted(status("rejected"), OutputFormat::Table, "acquire w1.x").unwrap_err().to_string();
        assert!(rejected.starts_with("acquire w1.x rejected (at-capacity): has 2 of 2 leases"), "{rejected}");
        let pending = accepted(status("pending"), OutputFormat::Table, "acquire").unwrap_err().to_string();
        assert!(pending.contains("leasehold command 019b76da-abe8-7001-8000-000000000001"), "{pending}");
    }

    #[test]
    fn resend_ids_are_canonical_uuidv7() {
        const ID: &str = "019b76da-abe8-7001-8000-000000000001";
        let argv = ["allocate", "--agent", "w1", "--kind", "dir", "--command-id", ID, "--id", &REF[3..]];
        let crate::Cmd::Allocate(args) = parse(&argv).unwrap().command else { panic!() };
        assert_eq!(args.produce.command_id.map(|id| id.to_string()).as_deref(), Some(ID));
        assert_eq!(args.id.map(|id| id.to_string()).as_deref(), Some(&REF[3..]));
        let crate::Cmd::Acquire(args) =
            parse(&["acquire", REF, "--holder", "h", "--lease-id", &LEASE[3..]]).unwrap().command
        else {
            panic!()
        };
        assert_eq!(args.lease_id.map(|id| id.to_string()).as_deref(), Some(&LEASE[3..]));
        let crate::Cmd::Release(args) = parse(&["release", REF]).unwrap().command else { panic!() };
        assert!(args.produce.command_id.is_none(), "default: a new id");
        for bad in [
            "019B76DA-ABE8-7001-8000-000000000001", // not lower-case
            "019b76daabe870018000000000000001",     // not hyphenated
            "6fa459ea-ee8a-3ca4-894e-db77e160355e", // version 3
            "not-a-uuid",
        ] {
            assert!(parse(&["release", REF, "--command-id", bad]).is_err(), "{bad}");
            assert!(parse(&["allocate", "--agent", "w1", "--kind", "dir", "--id", bad]).is_err(), "{bad}");
            assert!(parse(&["acquire", REF, "--holder", "h", "--lease-id", bad]).is_err(), "{bad}");
        }
    }

    fn allocate_envelope() -> Envelope {
        let body = Allocate::new("w1".parse().unwrap(), REF[3..].parse().unwrap(), "dir", 1);
        envelope(&issuer(Some("cli")).unwrap(), Some("019b76da-abe8-7001-8000-000000000001".parse().unwrap()), body)
    }

    #[test]
    fn a_pending_or_lost_command_is_an_unknown_outcome_with_exit_status_3() {
        let envelope = allocate_envelope();
        let pending = CommandStatus {
            command_id: envelope.command_id.to_string(),
            status: "pending".into(),
            command_seq: Some(12),
            duplicate: false,
            rejection: None,
            outcomes: Vec::new(),
            dead_letter: None,
        };
        let error =
            settle(Ok(pending.clone()), &envelope, Duration::from_secs(30), OutputFormat::Json, None).unwrap_err();
        assert_eq!(crate::exit_status(&error), EXIT_OUTCOME_UNKNOWN);
        let text = error.to_string();
        assert!(text.contains("it is stored at command seq 12, and no outcome came within 30s"), "{text}");
        assert!(text.contains("--command-id 019b76da-abe8-7001-8000-000000000001 --id 019b76da-9478"), "{text}");
        // From the transport, through anyhow's context: still an unknown outcome.
        let lost = Error::from(leasehold_client::OutcomeUnknown::new(&envelope, "the connection broke".into(), None));
        let error = settle(Err(lost), &envelope, Duration::from_secs(30), OutputFormat::Json, None).unwrap_err();
        assert_eq!(crate::exit_status(&error.context("allocate")), EXIT_OUTCOME_UNKNOWN);
        // Decided statuses go on; other errors stay what they are.
        let accepted = CommandStatus { status: "accepted".into(), ..pending };
        assert!(settle(Ok(accepted), &envelope, Duration::from_secs(30), OutputFormat::Json, None).is_ok());
        let refused = settle(
            Err(Error::Refused { reason: "refused".into(), source: None }),
            &envelope,
            Duration::ZERO,
            OutputFormat::Json,
            None,
        )
        .unwrap_err();
        assert_eq!(crate::exit_status(&refused), 1);
        let waiting = StillWaiting("still waiting".into());
        assert_eq!(crate::exit_status(&anyhow::Error::from(waiting)), EXIT_STILL_WAITING);
    }

    #[test]
    fn waiting_again_repeats_the_same_acquisition() {
        let argv = [
            "acquire",
            REF,
            "--holder",
            "build 1's",
            "--ttl",
            "5min",
            "--block",
            "--timeout",
            "90s",
            "--nats",
            "nats://h:4222",
            "--user",
            "u",
            "--password",
            "secret",
        ];
        let cli = parse(&argv).unwrap();
        let crate::Cmd::Acquire(args) = cli.command else { panic!() };
        let lease: LeaseId = LEASE[3..].parse().unwrap();
        let again = wait_again(&args, &cli.global, "019b76da-abe8-7001-8000-000000000001", lease);
        assert_eq!(
            again,
            format!(
                "leasehold acquire {REF} --holder 'build 1'\\''s' --ttl 5min --command-id \
                 019b76da-abe8-7001-8000-000000000001 --lease-id {} --block --timeout 1m30s --nats nats://h:4222 \
                 --user u --password PASSWORD",
                &LEASE[3..]
            )
        );
        assert!(!again.contains("secret"));
        // It parses back to the same acquisition.
        let words = ["acquire", REF, "--holder", "build 1's", "--ttl", "5min", "--lease-id", &LEASE[3..]];
        let crate::Cmd::Acquire(back) = parse(&words).unwrap().command else { panic!() };
        assert_eq!((back.holder, back.ttl), (args.holder, args.ttl));
    }

    #[test]
    fn a_word_with_control_characters_is_shown_in_ansi_c_quotes() {
        assert_eq!(shell_word("build-1"), "build-1");
        assert_eq!(shell_word("build 1's"), "'build 1'\\''s'");
        assert_eq!(shell_word("漢字"), "'漢字'");
        let word = shell_word("x\u{1b}[31mRED\rFAKE\u{202e}'\\");
        assert_eq!(word, r"$'x\x1b[31mRED\rFAKE\u202e\'\\'");
        assert!(!word.contains(leasehold_schemas::text::is_unsafe_for_display));
        // Pasted into bash, each word is the text again.
        for text in ["x\u{1b}[31mRED\rFAKE\u{202e}'\\", "a\nb\tc\u{7f}\u{9b}\u{200f}", "build 1's", "漢字"] {
            let pasted = std::process::Command::new("bash")
                .args(["-c", &format!("printf %s {}", shell_word(text))])
                .output()
                .expect("bash runs");
            assert_eq!(String::from_utf8(pasted.stdout).unwrap(), text, "{}", shell_word(text));
        }
    }

    #[test]
    fn giving_up_on_a_waiting_lease_says_when_its_wait_ends() {
        let clock = Clock::fixed(1_767_225_602_000 - 60_000, crate::output::Zone::utc());
        let mut record = LeaseRecord {
            id: LEASE.into(),
            resource: REF.into(),
            holder: "h".into(),
            state: "waiting".into(),
            token: None,
            expires_at: None,
            wait_until: Some(1_767_225_601_000),
        };
        let text = still_waiting(&record, Duration::from_secs(5), "leasehold acquire ...", &clock);
        assert!(
            text.starts_with(&format!(
                "still waiting after 5s: lease {LEASE} is waiting; its wait ends by itself at 2026-01-01T00:00:01Z (in 59 s)"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("`leasehold release-lease {LEASE}`")), "{text}");
        record.wait_until = None;
        assert!(still_waiting(&record, Duration::from_secs(5), "again", &clock).contains("it has no wait timeout"));
    }
}
