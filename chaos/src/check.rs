//! The checks, made from outside after the run has settled: the streams read directly (no leasehold server asked),
//! the agents' machines listed by their own means (the directories, `docker ps`), and `leasehold-replay verify`
//! run as its own process over the same log with the stopped projector's tables.
//!
//! Safety (each a violation, failing the run):
//! - every command has at most one decision: one outcome record per part, all of one command sequence (`twice`;
//!   checked for every command in the log, the agents' too), and every acknowledged command has one, none missing
//!   where its partition decided later commands (`skipped`);
//! - every acknowledged command is in `LH_CMD` at the sequence its ack gave, under its id (`lost`);
//! - each partition's outcomes are in command order, each decision's parts 0, 1, ... in a row, and every outcome's
//!   `Lh-Prev-Seq` names the partition's outcome before it (`order`, `chain`);
//! - nothing is on an agent's machine that the log does not hold as there (`leftover`): a directory or container of a
//!   resource the fold of the log has destroyed, or never heard of;
//! - the log folds with the domain's own fold (`fold`);
//! - `leasehold-replay verify` passes (`verify`): it re-decides every command, checks the domain's invariants at every
//!   step (an identifier never bound to two live resources among them; the workload's pool holds its orphans'
//!   addresses, so there is no orphan exception to count) and compares the projection with a fresh fold.
//!
//! Liveness (reported, not failing): acknowledged commands still undecided when the settle period ended.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use leasehold_domain::state::ResourceState;
use leasehold_log::jetstream::JetStream;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_replay::fold::Fold;
use leasehold_schemas::{ResourceId, codec};
use serde::Serialize;
use tokio::time::Instant;

use crate::producer::Acked;

/// A page of outcomes read at once.
const PAGE: usize = 1_000;

/// One broken promise.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Violation {
    pub(crate) kind: &'static str,
    pub(crate) detail: String,
}

/// What the checks found.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Findings {
    pub(crate) violations: Vec<Violation>,
    /// Acknowledged commands not decided when the settle period ended.
    pub(crate) undecided: Vec<String>,
    pub(crate) outcomes: u64,
    pub(crate) verify: Option<serde_json::Value>,
    /// Objects on the machines, all of which the log holds.
    pub(crate) on_machines: u64,
    /// Resources the log still has releasing or pending when the machines were compared (liveness).
    pub(crate) releasing: u64,
    pub(crate) pending: u64,
}

impl Findings {
    fn violation(&mut self, kind: &'static str, detail: String) {
        self.violations.push(Violation { kind, detail });
    }
}

/// Where an agent keeps its resources, for the leftover check.
#[derive(Debug, Clone)]
pub(crate) enum Machine {
    /// The dir driver's root.
    Dir { agent: String, root: PathBuf },
    /// The docker driver: objects labelled with the agent.
    Docker { agent: String },
}

/// Every outcome of the log, in order, read through at least each partition's last outcome as the log said it was
/// before the reading began (writers may go on appending meanwhile: what comes after is read too, or not).
pub(crate) async fn read_all(log: &JetStream) -> anyhow::Result<Vec<StoredOutcome>> {
    let mut ends = Vec::new();
    for partition in 0..log.partitions() {
        ends.push(log.last_outcome_seq(partition).await?);
    }
    let mut all = Vec::new();
    let mut from = 1;
    loop {
        let page = log.read_outcomes(&OutcomeFilter::All, from, PAGE).await?;
        let Some(last) = page.last() else { break };
        from = last.seq + 1;
        all.extend(page);
    }
    for (partition, end) in ends.into_iter().enumerate() {
        let seen = all.iter().rev().find(|o| o.partition as usize == partition).map_or(0, |o| o.seq);
        anyhow::ensure!(
            seen >= end,
            "partition {partition}'s last outcome was {end}, but reading the stream ended at {seen}"
        );
    }
    Ok(all)
}

/// Waits until every acknowledged command has an outcome, at most `bound`: the commands still without one.
pub(crate) async fn settle(log: &JetStream, acked: &[Acked], bound: Duration) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + bound;
    let mut waiting: std::collections::HashSet<&str> = acked.iter().map(|a| a.id.as_str()).collect();
    // Each round reads only the outcomes after the last one read.
    let mut from = 1;
    loop {
        // A read that fails (a server away) is tried again next round.
        if let Ok(page) = log.read_outcomes(&OutcomeFilter::All, from, PAGE).await
            && let Some(last) = page.last()
        {
            from = last.seq + 1;
            for outcome in &page {
                waiting.remove(outcome.cmd_id.as_str());
            }
            continue;
        }
        if waiting.is_empty() || Instant::now() > deadline {
            return Ok(acked.iter().filter(|a| waiting.contains(a.id.as_str())).map(|a| a.id.clone()).collect());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every acknowledged command is in `LH_CMD` where its ack said, under its id; those that are not are `lost`
/// (acknowledged writes the log dropped, or an ack that named another command's place).
pub(crate) async fn check_commands(log: &JetStream, acked: &[Acked], findings: &mut Findings) -> anyhow::Result<()> {
    let mut held: HashMap<u64, String> = HashMap::new();
    for partition in 0..log.partitions() {
        let mut after = 0;
        loop {
            let page = log.read_commands(partition, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for record in page {
                let id = codec::peek_command_id(&record.payload).map_or_else(String::new, |id| id.to_string());
                held.insert(record.seq, id);
            }
        }
    }
    for a in acked {
        match held.get(&a.seq) {
            Some(id) if *id == a.id => {}
            Some(other) => findings.violation(
                "lost",
                format!("command {} ({}) was acknowledged at LH_CMD {}, which holds {other}", a.id, a.type_name, a.seq),
            ),
            None => findings.violation(
                "lost",
                format!(
                    "command {} ({}) was acknowledged at LH_CMD {}, which the log does not hold",
                    a.id, a.type_name, a.seq
                ),
            ),
        }
    }
    Ok(())
}

/// The checks on the outcomes alone: one decision per acknowledged command, order and chain per partition.
pub(crate) fn check_outcomes(outcomes: &[StoredOutcome], acked: &[Acked], findings: &mut Findings) {
    findings.outcomes = outcomes.len() as u64;
    // Per command id (the producer's and everyone else's): every (command sequence, part, outcome) recorded.
    let mut by_id: HashMap<&str, Vec<(u64, u32, u64)>> = HashMap::new();
    for o in outcomes {
        by_id.entry(o.cmd_id.as_str()).or_default().push((o.cmd_seq, o.part, o.seq));
    }
    for (id, records) in &by_id {
        let mut seqs: Vec<u64> = records.iter().map(|r| r.0).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let mut parts: Vec<(u64, u32)> = records.iter().map(|r| (r.0, r.1)).collect();
        parts.sort_unstable();
        let before = parts.len();
        parts.dedup();
        if seqs.len() > 1 || parts.len() != before {
            let at: Vec<String> = records.iter().map(|r| format!("{} (command {} part {})", r.2, r.0, r.1)).collect();
            findings.violation("twice", format!("command {id} was decided more than once: outcomes {}", at.join(", ")));
        }
    }
    let mut decided_through: BTreeMap<u32, u64> = BTreeMap::new();
    for o in outcomes {
        let through = decided_through.entry(o.partition).or_default();
        *through = (*through).max(o.cmd_seq);
    }
    for a in acked.iter().filter(|a| !by_id.contains_key(a.id.as_str())) {
        let through = decided_through.get(&a.partition).copied().unwrap_or(0);
        if through > a.seq {
            findings.violation(
                "skipped",
                format!(
                    "command {} ({}, LH_CMD {}) has no outcome, though partition {} decided through command {through}",
                    a.id, a.type_name, a.seq, a.partition
                ),
            );
        } else {
            findings.undecided.push(a.id.clone());
        }
    }
    // Order and chain, per partition.
    let mut last: HashMap<u32, &StoredOutcome> = HashMap::new();
    for o in outcomes {
        let previous = last.insert(o.partition, o);
        let prev_seq = previous.map_or(0, |p| p.seq);
        if o.prev_seq != prev_seq {
            findings.violation(
                "chain",
                format!(
                    "outcome {} of partition {} names {} as the one before it; the partition's was {prev_seq}",
                    o.seq, o.partition, o.prev_seq
                ),
            );
        }
        let in_order = match previous {
            None => o.part == 0,
            Some(p) if p.cmd_seq == o.cmd_seq && p.cmd_id == o.cmd_id => o.part == p.part + 1,
            Some(p) => o.cmd_seq > p.cmd_seq && o.part == 0,
        };
        if !in_order {
            let before = previous
                .map_or("nothing".to_owned(), |p| format!("outcome {} (command {} part {})", p.seq, p.cmd_seq, p.part));
            findings.violation(
                "order",
                format!(
                    "outcome {} of partition {} (command {} part {}) follows {before}",
                    o.seq, o.partition, o.cmd_seq, o.part
                ),
            );
        }
    }
}

/// Where a resource of the fold stands, as far as its machine is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    Pending,
    Live,
    Releasing,
    Lost,
    Destroyed,
}

/// What the fold of the log says is on each agent's machine: each resource it has on it, by standing.
type Held = HashMap<String, HashMap<ResourceId, Standing>>;

/// The resources each agent's machine may hold: those the fold of the whole log has on it and not destroyed (`Err`:
/// the log cannot be folded, which is itself a violation).
pub(crate) async fn live_resources(log: &JetStream) -> anyhow::Result<Result<Held, String>> {
    let mut fold = Fold::new(log.partitions());
    let mut entries = leasehold_log::export::entries(log.clone(), None);
    while let Some(entry) = entries.next().await {
        let step = match fold.admit(entry?) {
            Ok(step) => step,
            Err(failure) => return Ok(Err(format!("{failure:?}"))),
        };
        if let Some(step) = step
            && let Err(failure) = fold.apply(&step)
        {
            return Ok(Err(format!("{failure:?}")));
        }
    }
    let mut out = Held::new();
    for state in fold.states() {
        for resource in state.resources() {
            let standing = match &resource.state {
                ResourceState::Destroyed { .. } => Standing::Destroyed,
                ResourceState::Lost { .. } => Standing::Lost,
                ResourceState::Releasing { .. } => Standing::Releasing,
                ResourceState::Pending => Standing::Pending,
                _ => Standing::Live,
            };
            out.entry(resource.agent.to_string()).or_default().insert(resource.id, standing);
        }
    }
    Ok(Ok(out))
}

/// The resource ids on a machine, as its driver would find them (canonical ids only).
pub(crate) async fn on_machine(machine: &Machine) -> anyhow::Result<Vec<ResourceId>> {
    match machine {
        Machine::Dir { root, .. } => {
            let mut out = Vec::new();
            let Ok(entries) = std::fs::read_dir(root) else { return Ok(out) };
            for entry in entries {
                let entry = entry?;
                if entry.file_type()?.is_dir()
                    && let Some(id) = entry.file_name().to_str().and_then(|n| n.parse::<ResourceId>().ok())
                {
                    out.push(id);
                }
            }
            Ok(out)
        }
        Machine::Docker { agent } => {
            let label = format!("label=io.leasehold.agent={agent}");
            let format = "{{.Label \"io.leasehold.resource\"}}";
            let mut out = Vec::new();
            for what in [&["ps", "-a"][..], &["volume", "ls"][..]] {
                let listed = tokio::process::Command::new("docker")
                    .args(what)
                    .args(["--filter", &label, "--format", format])
                    .output()
                    .await?;
                anyhow::ensure!(
                    listed.status.success(),
                    "docker {}: {}",
                    what.join(" "),
                    String::from_utf8_lossy(&listed.stderr)
                );
                for line in String::from_utf8_lossy(&listed.stdout).lines() {
                    if let Ok(id) = line.trim().parse::<ResourceId>() {
                        out.push(id);
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Nothing on the machines that the log does not hold there.
pub(crate) async fn check_machines(
    log: &JetStream,
    machines: &[Machine],
    findings: &mut Findings,
) -> anyhow::Result<()> {
    let live = match live_resources(log).await? {
        Ok(live) => live,
        Err(failure) => {
            findings
                .violation("fold", format!("the log cannot be folded, so the machines were not compared: {failure}"));
            return Ok(());
        }
    };
    let count = |standing| live.values().flat_map(HashMap::values).filter(|s| **s == standing).count() as u64;
    (findings.releasing, findings.pending) = (count(Standing::Releasing), count(Standing::Pending));
    for machine in machines {
        let agent = match machine {
            Machine::Dir { agent, .. } | Machine::Docker { agent } => agent,
        };
        let held = live.get(agent.as_str());
        for id in on_machine(machine).await? {
            findings.on_machines += 1;
            match held.and_then(|h| h.get(&id)) {
                None => findings
                    .violation("leftover", format!("{agent}'s machine holds {id}, which the log never gave {agent}")),
                Some(Standing::Destroyed) => findings.violation(
                    "leftover",
                    format!("{agent}'s machine still holds {id}, which the log says was destroyed"),
                ),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// `leasehold-replay verify --output json` over the log and `projection`, as its own process (this binary).
/// Its output is kept in `dir` (`verify.out`, `verify.err`).
pub(crate) async fn verify(
    exe: &Path,
    nats: &str,
    projection: &Path,
    dir: &Path,
    findings: &mut Findings,
) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(exe)
        .env("LEASEHOLD_CHAOS_EXEC", "replay")
        .args([
            "--nats",
            nats,
            "verify",
            "--output",
            "json",
            "--split-budget",
            crate::run::SPLIT_BUDGET,
            "--projection",
        ])
        .arg(projection)
        .output()
        .await?;
    std::fs::write(dir.join("verify.out"), &out.stdout)?;
    std::fs::write(dir.join("verify.err"), &out.stderr)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Option<serde_json::Value> = serde_json::from_str(stdout.trim())
        .ok()
        .or_else(|| stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok()));
    if !out.status.success() {
        let failure = verify_failure(report.as_ref(), &String::from_utf8_lossy(&out.stderr));
        findings.violation("verify", format!("leasehold-replay verify failed ({}): {failure}", out.status));
    }
    if out.status.success() && report.as_ref().and_then(|r| r.pointer("/report/projection")).is_none_or(|p| p.is_null())
    {
        findings.violation("verify", "leasehold-replay verify compared no projection with the log".to_owned());
    }
    findings.verify = report;
    Ok(())
}

/// Why `verify` failed, for the violation: the report's `failure` (`verify --output json` prints
/// `{"ok": false, "report": {"failure": {...}, ...}, ...}`), or its stderr when it printed no report.
fn verify_failure(report: Option<&serde_json::Value>, stderr: &str) -> String {
    report
        .and_then(|r| r.pointer("/report/failure"))
        .filter(|f| !f.is_null())
        .map_or_else(|| stderr.trim().to_owned(), ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_verify_is_reported_with_its_failure() {
        let report = serde_json::json!({
            "ok": false,
            "report": {
                "failure": { "detail": "10.99.0.2 of pool net is granted twice", "partition": 2, "seq": 272 },
                "outcomes": 271
            }
        });
        let failure = verify_failure(Some(&report), "");
        assert!(failure.contains("granted twice") && failure.contains("272"), "{failure}");
        assert_eq!(verify_failure(None, " cannot connect \n"), "cannot connect");
        let no_failure = serde_json::json!({ "ok": false, "report": { "failure": null } });
        assert_eq!(verify_failure(Some(&no_failure), "exit 1"), "exit 1");
    }

    /// Outcome `seq` of partition 0 answering command `cmd_seq` (id `id`), part `part`, after `prev_seq`.
    fn outcome(seq: u64, id: &str, cmd_seq: u64, part: u32, prev_seq: u64) -> StoredOutcome {
        StoredOutcome {
            seq,
            partition: 0,
            key: "a".to_owned(),
            cmd_id: id.to_owned(),
            cmd_seq,
            part,
            prev_seq,
            payload: bytes::Bytes::new(),
        }
    }

    fn acked(id: &str, seq: u64) -> Acked {
        Acked {
            id: id.to_owned(),
            seq,
            partition: 0,
            type_name: "op.allocate".to_owned(),
            at: std::time::Instant::now(),
        }
    }

    fn kinds(outcomes: &[StoredOutcome], acked: &[Acked]) -> (Vec<&'static str>, Vec<String>) {
        let mut findings = Findings::default();
        check_outcomes(outcomes, acked, &mut findings);
        (findings.violations.iter().map(|v| v.kind).collect(), findings.undecided)
    }

    #[test]
    fn a_clean_log_passes_and_each_broken_promise_has_its_kind() {
        let acked = [acked("c1", 1), acked("c2", 2), acked("c3", 3)];
        // c1 in two parts, then c2; c3 not decided yet (liveness, not a violation).
        let clean = [outcome(1, "c1", 1, 0, 0), outcome(2, "c1", 1, 1, 1), outcome(3, "c2", 2, 0, 2)];
        assert_eq!(kinds(&clean, &acked), (vec![], vec!["c3".to_owned()]));

        let twice = [clean[0].clone(), clean[1].clone(), clean[2].clone(), outcome(4, "c2", 0, 0, 3)];
        assert!(kinds(&twice, &acked).0.contains(&"twice"));

        let skipped = [clean[0].clone(), clean[1].clone(), outcome(3, "c3", 3, 0, 2)];
        assert_eq!(kinds(&skipped, &acked).0, vec!["skipped"]);

        let chain = [clean[0].clone(), clean[1].clone(), outcome(3, "c2", 2, 0, 1)];
        assert_eq!(kinds(&chain, &acked).0, vec!["chain"]);

        let order = [outcome(1, "c2", 2, 0, 0), outcome(2, "c1", 1, 0, 1), outcome(3, "c1", 1, 1, 2)];
        assert_eq!(kinds(&order, &acked).0, vec!["order"]);

        let part_missing = [outcome(1, "c1", 1, 1, 0), clean[2].clone()];
        assert_eq!(kinds(&part_missing, &acked).0, vec!["order", "chain"]);
    }
}
