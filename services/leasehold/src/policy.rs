//! The cluster policy: `leasehold policy set|show`, and the policy flags `serve` records when the log has none.
//!
//! The policy lives in the log, one copy per partition (`op.set-partition-settings`), as Nomad's servers or
//! Kubernetes' controller manager own theirs: no process's configuration changes a decision. `policy set` reads the
//! current policy of every partition, changes only the fields given and sends the result to each partition; `serve`
//! records its flags only where no policy is recorded yet (`if_no_policy`), so two servers started with different
//! flags never flip it back and forth: the one that comes second warns about every difference instead. `serve` stores
//! these commands before its gateway takes any (see `ready.rs`), and looks at their decisions afterwards.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use leasehold_log::Log;
use leasehold_projector::PolicyView;
use leasehold_schemas::command::SetPartitionSettings;
use leasehold_schemas::settings::{ClusterPolicy, GcMode};
use leasehold_schemas::subjects::settings_key;
use leasehold_schemas::{Envelope, Issuer, Key, Millis};
use leasehold_worker::{WriterConfig, fold_partition};
use tokio_util::sync::CancellationToken;

use crate::GlobalArgs;
use crate::output::{self, OutputFormat, Table};
use crate::produce::{ProduceArgs, parse_millis};

/// A command line that asks for something that makes no sense: nothing was sent; exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadCommandLine(pub(crate) String);

/// The policy's fields as flags; each one not given keeps what is recorded (or, for `serve` on a log without a
/// policy, the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub(crate) struct PolicyFlags {
    /// Policy: no heartbeat for this long and an agent is stalled (nothing new is placed on it). Default 60s.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) stall_after: Option<Millis>,
    /// Policy: no heartbeat for this long and an agent is gone (its resources are orphaned). Default 24h.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) orphan_after: Option<Millis>,
    /// Policy: a pending resource not created within this long is released. Default 10min.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) create_timeout: Option<Millis>,
    /// Policy: the cool-down of pools defined without one. Default 60s.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) claim_cooldown: Option<Millis>,
    /// Policy: the loss breaker trips when a report would lose at least N resources and more than PCT % of the
    /// agent's live ones (within --loss-window). Default 5/50.
    #[arg(long, value_name = "N/PCT", value_parser = parse_max_loss)]
    pub(crate) max_loss: Option<(u32, u8)>,
    /// Policy: the window the loss breaker counts losses in. Default 10min.
    #[arg(long, value_name = "DURATION", value_parser = parse_millis)]
    pub(crate) loss_window: Option<Millis>,
}

/// `5/50`: at least 5 losses and more than 50 %.
pub(crate) fn parse_max_loss(text: &str) -> Result<(u32, u8), String> {
    let (n, pct) = text.split_once('/').ok_or_else(|| format!("{text:?} is not N/PCT, e.g. 5/50"))?;
    let n = n.parse::<u32>().map_err(|e| format!("{n:?} is not a number of losses: {e}"))?;
    let pct = pct.trim_end_matches('%');
    let pct = pct.parse::<u8>().ok().filter(|p| *p <= 100).ok_or_else(|| format!("{pct:?} is not a percentage"))?;
    Ok((n, pct))
}

impl PolicyFlags {
    /// `base` with the fields given here.
    pub(crate) fn apply_to(&self, base: &ClusterPolicy) -> ClusterPolicy {
        let mut policy = base.clone();
        let agent = &mut policy.agent;
        agent.stall_after = self.stall_after.unwrap_or(agent.stall_after);
        agent.orphan_after = self.orphan_after.unwrap_or(agent.orphan_after);
        agent.create_timeout = self.create_timeout.unwrap_or(agent.create_timeout);
        agent.loss_window = self.loss_window.unwrap_or(agent.loss_window);
        if let Some((n, pct)) = self.max_loss {
            agent.max_loss_min = n;
            agent.max_loss_percent = pct;
        }
        policy.claim_cooldown = self.claim_cooldown.unwrap_or(policy.claim_cooldown);
        policy
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == PolicyFlags::default()
    }

    /// Each flag given whose value differs from `recorded`, as `--flag VALUE (recorded: VALUE)`.
    pub(crate) fn differences(&self, recorded: &ClusterPolicy) -> Vec<String> {
        let a = &recorded.agent;
        let mut out = Vec::new();
        let mut compare = |flag: &str, given: Option<String>, recorded: String| {
            if let Some(given) = given.filter(|g| *g != recorded) {
                out.push(format!("--{flag} {given} (recorded: {recorded})"));
            }
        };
        compare("stall-after", self.stall_after.map(|m| m.to_string()), a.stall_after.to_string());
        compare("orphan-after", self.orphan_after.map(|m| m.to_string()), a.orphan_after.to_string());
        compare("create-timeout", self.create_timeout.map(|m| m.to_string()), a.create_timeout.to_string());
        compare("claim-cooldown", self.claim_cooldown.map(|m| m.to_string()), recorded.claim_cooldown.to_string());
        let max_loss = |(n, pct): (u32, u8)| format!("{n}/{pct}");
        compare("max-loss", self.max_loss.map(max_loss), max_loss((a.max_loss_min, a.max_loss_percent)));
        compare("loss-window", self.loss_window.map(|m| m.to_string()), a.loss_window.to_string());
        out
    }
}

/// Checks a policy before anything is sent; the error says what to change.
fn check(policy: &ClusterPolicy, partition: u32) -> Result<(), BadCommandLine> {
    policy.agent.check().map_err(|problem| {
        BadCommandLine(format!("the policy of partition {partition} would be refused: {problem}; nothing was sent"))
    })
}

/// `leasehold policy set`
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PolicySetArgs {
    #[command(flatten)]
    pub(crate) flags: PolicyFlags,
    /// What agents do with handles on their machines that no live resource owns: `destroy` (each ordered destroyed
    /// on record, the default) or `dry-run` (recorded as `garbage-dry-run`, nothing ordered or destroyed).
    #[arg(long, value_name = "destroy|dry-run")]
    pub(crate) gc: Option<GcMode>,
    /// The highest lease priority (`acquire --priority`) the issuers starting with PREFIX may ask for (`ci:=5`; a
    /// whole issuer is a prefix too; the longest prefix that matches an issuer gives its cap; an issuer no prefix
    /// matches may ask for 0 only); `PREFIX=none` removes the prefix's cap. Repeatable; the other prefixes keep
    /// theirs.
    #[arg(long = "max-priority", value_name = "PREFIX=N", value_parser = parse_max_priority)]
    pub(crate) max_priority: Vec<(String, Option<u8>)>,
    #[command(flatten)]
    pub(crate) produce: ProduceArgs,
}

/// `ci:=5`, or `ci:=none`.
pub(crate) fn parse_max_priority(text: &str) -> Result<(String, Option<u8>), String> {
    let (prefix, cap) =
        text.rsplit_once('=').ok_or_else(|| format!("{text:?} is not PREFIX=N (e.g. ci:=5) or PREFIX=none"))?;
    if leasehold_schemas::Issuer::new(prefix).is_err() {
        return Err(format!("{prefix:?} is not an issuer prefix (printable ASCII, no spaces, quotes or backslashes)"));
    }
    if cap == "none" {
        return Ok((prefix.to_owned(), None));
    }
    let cap = cap.parse::<u8>().map_err(|_| format!("{cap:?} is not a priority from 0 to 255, nor `none`"))?;
    Ok((prefix.to_owned(), Some(cap)))
}

/// `recorded` with the caps given set or removed.
fn caps_with(recorded: &BTreeMap<String, u8>, given: &[(String, Option<u8>)]) -> BTreeMap<String, u8> {
    let mut caps = recorded.clone();
    for (prefix, cap) in given {
        match cap {
            Some(cap) => caps.insert(prefix.clone(), *cap),
            None => caps.remove(prefix),
        };
    }
    caps
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum PolicyCmd {
    /// Change the cluster policy: reads it, changes only the fields given, and sends it to every partition.
    Set(PolicySetArgs),
    /// Show the cluster policy (once when every partition agrees).
    Show,
}

pub(crate) async fn run(cmd: PolicyCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    let gateway = crate::client::gateway(global)?;
    let views: Vec<PolicyView> = gateway
        .get(&["v1", "policy"], &[])
        .await?
        .context("the gateway has no /v1/policy: is it older than this command line?")?;
    match cmd {
        PolicyCmd::Show => show(&views, global.output),
        PolicyCmd::Set(args) => set(args, views, global).await,
    }
}

async fn set(args: PolicySetArgs, views: Vec<PolicyView>, global: &GlobalArgs) -> anyhow::Result<()> {
    if args.flags.is_empty() && args.gc.is_none() && args.max_priority.is_empty() {
        return Err(BadCommandLine(
            "nothing to change: give at least one of --stall-after, --orphan-after, --create-timeout, \
             --claim-cooldown, --max-loss, --loss-window, --gc, --max-priority"
                .to_owned(),
        )
        .into());
    }
    if args.produce.command_id.is_some() {
        return Err(BadCommandLine("--command-id names one command; policy set sends one per partition".into()).into());
    }
    // Every partition's new policy is checked before the first one is sent: nothing is half-applied by a mistake.
    let planned: Vec<(PolicyView, ClusterPolicy)> = views
        .into_iter()
        .map(|view| {
            let policy = args.flags.apply_to(&view.policy);
            (view, policy)
        })
        .collect();
    for (view, policy) in &planned {
        check(policy, view.partition)?;
    }
    let issuer = crate::produce::sender(global)?;
    // One line for the whole cluster, not one per partition (JSON: each partition's command status).
    let (mut changed, mut unchanged_in, mut statuses) = (Vec::new(), Vec::new(), Vec::new());
    let mut now_in_force = None;
    for (view, policy) in planned {
        let what = format!("policy set: partition {}", view.partition);
        // Only what is given is sent: `--gc` alone leaves the policy (recorded or not) as it is.
        let unchanged = |p: &ClusterPolicy| view.recorded && *p == view.policy;
        let caps = caps_with(&view.max_priority, &args.max_priority);
        let in_force = (policy.clone(), args.gc.unwrap_or(view.gc), caps.clone());
        let policy = Some(policy).filter(|p| !args.flags.is_empty() && !unchanged(p));
        let gc = args.gc.filter(|mode| *mode != view.gc);
        let max_priority = Some(caps).filter(|caps| *caps != view.max_priority);
        now_in_force.get_or_insert(in_force);
        if policy.is_none() && gc.is_none() && max_priority.is_none() {
            unchanged_in.push(view.partition);
            continue;
        }
        let key: Key = view.key.parse().with_context(|| format!("the gateway's key {:?}", view.key))?;
        let body = SetPartitionSettings {
            key,
            partition: view.partition,
            outcome_horizon: None,
            policy,
            if_no_policy: false,
            gc,
            max_priority,
        };
        let envelope = crate::produce::envelope(&issuer, None, body);
        let sent = crate::produce::accepted_quietly(global, &args.produce, &envelope, &what).await;
        // What was accepted before a failure stays accepted: the error says where it stands.
        let sent = match sent {
            Err(e) if !changed.is_empty() => {
                Err(e.context(format!("policy set: already accepted in {}", partitions_text(&changed))))
            }
            other => other,
        };
        statuses.push(sent?);
        changed.push(view.partition);
    }
    if global.output == OutputFormat::Json {
        output::emit(&output::json(&statuses)?);
        return Ok(());
    }
    let mut line = match (changed.is_empty(), unchanged_in.is_empty()) {
        (false, true) => format!("policy set: accepted in {}", partitions_text(&changed)),
        (false, false) => format!(
            "policy set: accepted in {}; unchanged in {} (they have this policy already)",
            partitions_text(&changed),
            partitions_text(&unchanged_in)
        ),
        (true, _) => {
            format!("policy set: unchanged in {} (they have this policy already)", partitions_text(&unchanged_in))
        }
    };
    line.push('\n');
    if let Some((policy, gc, caps)) = now_in_force {
        line.push_str(&fields(&policy, gc, &caps));
    }
    output::emit(&line);
    Ok(())
}

fn show(views: &[PolicyView], format: OutputFormat) -> anyhow::Result<()> {
    if format == OutputFormat::Json {
        output::emit(&output::json(&views)?);
        return Ok(());
    }
    let Some(first) = views.first() else { bail!("the gateway knows of no partition") };
    let agree = views.iter().all(|v| {
        v.recorded == first.recorded
            && v.policy == first.policy
            && v.gc == first.gc
            && v.max_priority == first.max_priority
    });
    if agree {
        let whose = match first.recorded {
            true => format!("the policy of all {} partitions", views.len()),
            false => format!("no policy recorded in any of the {} partitions: the defaults", views.len()),
        };
        output::emit(&format!("{whose}\n{}", fields(&first.policy, first.gc, &first.max_priority)));
    } else {
        let mut table = Table::new(&[
            "PARTITION",
            "RECORDED",
            "STALL",
            "ORPHAN",
            "CREATE",
            "COOLDOWN",
            "MAX-LOSS",
            "WINDOW",
            "GC",
            "MAX-PRIORITY",
        ]);
        for view in views {
            let a = &view.policy.agent;
            table.row(vec![
                view.partition.to_string(),
                if view.recorded { "yes" } else { "no (defaults)" }.to_owned(),
                a.stall_after.to_string(),
                a.orphan_after.to_string(),
                a.create_timeout.to_string(),
                view.policy.claim_cooldown.to_string(),
                format!("{}/{}", a.max_loss_min, a.max_loss_percent),
                a.loss_window.to_string(),
                view.gc.to_string(),
                caps_text(&view.max_priority),
            ]);
        }
        output::emit(&format!(
            "the partitions disagree (a `policy set` that did not reach every partition?): run `leasehold policy set` \
             with the fields to align\n{}",
            table.render()
        ));
    }
    Ok(())
}

/// Priority caps in one cell: `ci:=5, op:=9`, or `none (every issuer: 0)`.
fn caps_text(caps: &BTreeMap<String, u8>) -> String {
    if caps.is_empty() {
        return "none (every issuer: 0)".to_owned();
    }
    caps.iter().map(|(prefix, cap)| format!("{prefix}={cap}")).collect::<Vec<_>>().join(", ")
}

fn fields(policy: &ClusterPolicy, gc: GcMode, caps: &BTreeMap<String, u8>) -> String {
    let a = &policy.agent;
    output::fields(&[
        ("stall-after", a.stall_after.to_string()),
        ("orphan-after", a.orphan_after.to_string()),
        ("create-timeout", a.create_timeout.to_string()),
        ("claim-cooldown", policy.claim_cooldown.to_string()),
        ("max-loss", format!("{}/{}", a.max_loss_min, a.max_loss_percent)),
        ("loss-window", a.loss_window.to_string()),
        ("gc", gc.to_string()),
        ("max-priority", caps_text(caps)),
    ])
}

/// Where `serve` left the policy of one partition when it seeded the log ([`seed_from_flags`]).
#[derive(Debug)]
pub(crate) enum Seeded {
    /// A policy was recorded there already.
    Recorded(ClusterPolicy),
    /// This process stored its policy command there (`if_no_policy`); its decision comes later.
    Published(Envelope),
    /// The log refused the policy command (nothing stored), with why.
    Refused(String),
}

/// The first half of what `serve` does with its policy flags (with the worker role, whose user may publish on the
/// settings subjects): stores, in every partition without a policy recorded, the flags' policy (the defaults for
/// flags not given) with `if_no_policy`, without waiting for the decisions. Each partition decides in log order, so
/// a command stored after these is decided under the policy: the gateway takes commands once they are stored.
/// `stored` is told of each partition found with a policy or given the command. A log that does not answer is
/// asked again (the same commands, so nothing is stored twice) until it does or `shutdown`; `None` then.
pub(crate) async fn seed_from_flags<L: Log>(
    log: &L,
    flags: &PolicyFlags,
    issuer: &Issuer,
    stored: &(dyn Fn(u32) + Send + Sync),
    shutdown: &CancellationToken,
) -> Option<Vec<(u32, Seeded)>> {
    // `serve` refused flags that make no sense before it started anything.
    let wanted = flags.apply_to(&ClusterPolicy::DEFAULT);
    let mut pause = Backoff::default();
    // The settings subject is where `policy set` and this seeding record a policy: reading it is a few outcomes,
    // where a fold of the partition would repeat the load the writers do at the same time. When it shows none,
    // the seeding says: `if_no_policy` is refused where a policy exists anyway.
    let mut seeded: Vec<(u32, Seeded)> = Vec::new();
    let mut to_publish: Vec<(u32, Envelope)> = Vec::new();
    for partition in 0..log.partitions() {
        let recorded = loop {
            match policy_on_settings_subject(log, partition).await {
                Ok(recorded) => break recorded,
                Err(e) if matches!(e.downcast_ref(), Some(leasehold_log::Error::Unavailable(_))) => {
                    tracing::warn!(partition, error = %format!("{e:#}"), "cannot read the recorded policy; asking again");
                    pause.wait(shutdown).await?;
                }
                // Seeded all the same: `if_no_policy` is refused where a policy is recorded.
                Err(e) => {
                    tracing::warn!(partition, error = %format!("{e:#}"), "cannot read the recorded policy");
                    break None;
                }
            }
        };
        match recorded {
            Some(policy) => {
                stored(partition);
                seeded.push((partition, Seeded::Recorded(policy)));
            }
            None => {
                let body = SetPartitionSettings {
                    key: settings_key(partition, log.partitions()),
                    partition,
                    outcome_horizon: None,
                    policy: Some(wanted.clone()),
                    if_no_policy: true,
                    gc: None,
                    max_priority: None,
                };
                to_publish.push((partition, crate::produce::envelope(issuer, None, body)));
            }
        }
    }
    // All at once: one write of the log for every partition (the commands go one by one where it cannot batch them).
    let mut to_publish: Vec<(u32, Envelope, leasehold_log::Publish)> = to_publish
        .into_iter()
        .filter_map(|(partition, envelope)| match leasehold_schemas::codec::encode_command(&envelope) {
            Ok(payload) => {
                let publish = leasehold_log::Publish {
                    subject: leasehold_schemas::subjects::ingress_subject_of(&envelope.body),
                    msg_id: envelope.command_id.to_string(),
                    payload: payload.into(),
                };
                Some((partition, envelope, publish))
            }
            Err(e) => {
                let why = format!("the policy command of partition {partition} does not encode: {e}");
                eprintln!("WARNING: policy: {why}");
                seeded.push((partition, Seeded::Refused(why)));
                None
            }
        })
        .collect();
    let mut pause = Backoff::default();
    while !to_publish.is_empty() {
        let commands: Vec<leasehold_log::Publish> = to_publish.iter().map(|(_, _, publish)| publish.clone()).collect();
        let answers = log.publish_commands(&commands).await;
        let mut again = Vec::new();
        for ((partition, envelope, publish), answer) in to_publish.into_iter().zip(answers) {
            match answer {
                Ok(_) => {
                    stored(partition);
                    seeded.push((partition, Seeded::Published(envelope)));
                }
                Err(e @ leasehold_log::Error::Refused(_)) => {
                    let why = format!(
                        "the log refused the policy command of partition {partition} ({e}): this process seeds no \
                         policy there; may its user publish on {} (a worker's may)?",
                        publish.subject
                    );
                    eprintln!("WARNING: policy: {why}");
                    seeded.push((partition, Seeded::Refused(why)));
                }
                Err(e) => {
                    tracing::warn!(partition, error = %e, "the policy command was not stored; sending it again");
                    again.push((partition, envelope, publish));
                }
            }
        }
        to_publish = again;
        if !to_publish.is_empty() {
            pause.wait(shutdown).await?;
        }
    }
    seeded.sort_by_key(|(partition, _)| *partition);
    Some(seeded)
}

/// The second half: once the policy commands are stored, what became of them. Where one was accepted, says so;
/// where a policy was recorded (before, or by another process first), never changes it but warns on stderr about
/// each flag given that differs; where no writer decided within `timeout`, warns. Returns the warnings printed.
pub(crate) async fn check_seeded<L: Log>(
    log: &L,
    flags: &PolicyFlags,
    seeded: Vec<(u32, Seeded)>,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let mut warnings = Vec::new();
    let mut recorded_here = Vec::new();
    for (partition, seeded) in seeded {
        let recorded = match seeded {
            Seeded::Refused(why) => {
                warnings.push(why);
                continue;
            }
            // Only when the settings subject shows a policy the flags contradict is the partition folded, for the
            // exact answer (a policy sent on another key of the partition is seen there).
            Seeded::Recorded(policy) if flags.differences(&policy).is_empty() => Some(policy),
            Seeded::Recorded(_) => recorded_policy(log, partition).await?,
            // Sent again under its id: stored once, and answered with its decision.
            Seeded::Published(envelope) => {
                let status = crate::produce::submit_to_log(log, &envelope, timeout).await?;
                match status.status.as_str() {
                    "accepted" => {
                        recorded_here.push(partition);
                        None
                    }
                    // Another process recorded one first: compare with it below.
                    "rejected" => recorded_policy(log, partition).await?,
                    other => {
                        let warning = format!(
                            "policy: partition {partition}: the policy from this process's flags is {other} (no \
                             writer decided it within {}); check with `leasehold policy show`",
                            humantime::format_duration(timeout)
                        );
                        eprintln!("WARNING: {warning}");
                        warnings.push(warning);
                        None
                    }
                }
            }
        };
        if let Some(recorded) = recorded {
            let differences = flags.differences(&recorded);
            if !differences.is_empty() {
                let warning = format!(
                    "policy: partition {partition} keeps its recorded policy, which this process's flags contradict: \
                     {}. The flags of `serve` only seed a log without a policy; change it with `leasehold policy set`",
                    differences.join(", ")
                );
                eprintln!("WARNING: {warning}");
                warnings.push(warning);
            }
        }
    }
    // One line, not one per partition.
    if !recorded_here.is_empty() {
        println!("policy: recorded from this process's flags in {}", partitions_text(&recorded_here));
    }
    Ok(warnings)
}

/// Partitions as ranges: "partitions 0..32 (32)", "partition 3", "partitions 0..4, 6 (5)".
pub(crate) fn partitions_text(partitions: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &p in partitions {
        match ranges.last_mut() {
            Some((_, end)) if *end == p => *end = p + 1,
            _ => ranges.push((p, p + 1)),
        }
    }
    let text: Vec<String> =
        ranges.iter().map(|(a, b)| if b - a == 1 { a.to_string() } else { format!("{a}..{b}") }).collect();
    match partitions {
        [one] => format!("partition {one}"),
        _ => format!("partitions {} ({})", text.join(", "), partitions.len()),
    }
}

/// A pause that doubles from 200 ms to 5 s, cut short by a shutdown (`None`).
#[derive(Debug)]
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(Duration::from_millis(200))
    }
}

impl Backoff {
    async fn wait(&mut self, shutdown: &CancellationToken) -> Option<()> {
        let pause = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        tokio::select! {
            () = shutdown.cancelled() => None,
            () = tokio::time::sleep(pause) => Some(()),
        }
    }
}

/// The last policy recorded through the settings key of `partition` (`None`: none there).
async fn policy_on_settings_subject<L: Log>(log: &L, partition: u32) -> anyhow::Result<Option<ClusterPolicy>> {
    let key = settings_key(partition, log.partitions()).token();
    let filter = leasehold_log::OutcomeFilter::Key { partition, key };
    let mut policy = None;
    let mut from = 1;
    loop {
        let batch = log.read_outcomes(&filter, from, 256).await?;
        let Some(last) = batch.last() else { return Ok(policy) };
        from = last.seq + 1;
        for stored in &batch {
            let outcome = leasehold_schemas::codec::decode_outcome(&stored.payload)
                .with_context(|| format!("reading the settings of partition {partition}"))?;
            for effect in outcome.effects() {
                if let leasehold_schemas::outcome::Effect::PartitionSettingsChanged { settings } = effect {
                    policy = settings.policy.clone();
                }
            }
        }
    }
}

/// The policy recorded in `partition`, folded from the log (`None`: never recorded).
async fn recorded_policy<L: Log>(log: &L, partition: u32) -> anyhow::Result<Option<ClusterPolicy>> {
    let folded = fold_partition(log, partition, 0, &WriterConfig::default())
        .await
        .with_context(|| format!("reading the settings of partition {partition}"))?;
    Ok(folded.state.settings().policy.clone())
}

#[cfg(test)]
mod tests {

    #[test]
    fn partitions_read_as_ranges() {
        assert_eq!(partitions_text(&[3]), "partition 3");
        assert_eq!(partitions_text(&(0..32).collect::<Vec<_>>()), "partitions 0..32 (32)");
        assert_eq!(partitions_text(&[0, 1, 2, 3, 6, 9, 10]), "partitions 0..4, 6, 9..11 (7)");
    }
    use super::*;

    fn secs(n: u64) -> Millis {
        Millis::from_secs(n)
    }

    #[test]
    fn flags_change_only_what_they_name() {
        let flags = PolicyFlags { stall_after: Some(secs(30)), max_loss: Some((3, 40)), ..Default::default() };
        let policy = flags.apply_to(&ClusterPolicy::DEFAULT);
        assert_eq!(policy.agent.stall_after, secs(30));
        assert_eq!((policy.agent.max_loss_min, policy.agent.max_loss_percent), (3, 40));
        assert_eq!(policy.agent.orphan_after, ClusterPolicy::DEFAULT.agent.orphan_after);
        assert_eq!(policy.claim_cooldown, ClusterPolicy::DEFAULT.claim_cooldown);
        assert!(PolicyFlags::default().is_empty());
    }

    #[test]
    fn differences_name_each_flag_given_that_disagrees() {
        let recorded = ClusterPolicy::DEFAULT;
        let flags = PolicyFlags {
            stall_after: Some(secs(60)),
            orphan_after: Some(Millis::from_hours(1)),
            max_loss: Some((5, 60)),
            ..Default::default()
        };
        assert_eq!(
            flags.differences(&recorded),
            ["--orphan-after 1h (recorded: 24h)", "--max-loss 5/60 (recorded: 5/50)"]
        );
        assert!(PolicyFlags::default().differences(&recorded).is_empty(), "flags not given never disagree");
    }

    #[test]
    fn nonsense_is_refused_before_sending() {
        let flags = PolicyFlags { orphan_after: Some(secs(30)), ..Default::default() };
        let err = check(&flags.apply_to(&ClusterPolicy::DEFAULT), 2).unwrap_err().to_string();
        assert!(err.contains("partition 2") && err.contains("must be longer than stall_after"), "{err}");
        assert_eq!(parse_max_loss("5/50"), Ok((5, 50)));
        assert_eq!(parse_max_loss("5/50%"), Ok((5, 50)));
        assert!(parse_max_loss("5/150").is_err());
        assert!(parse_max_loss("5").is_err());
    }
}
