//! `verify`: folds the whole log and checks it.
//!
//! - Every outcome decodes, its headers agree with its body, the `Lh-Prev-Seq` chain of each partition is unbroken,
//!   and each command has one decision whose parts follow each other ([`crate::fold`]).
//! - Re-deciding: every command whose outcome carries this tool's decider version is decided again against the
//!   state before it, and must give the recorded outcome; every command of the partition before it that got no
//!   outcome must still get none (a duplicate, a heartbeat that changes nothing, a dead letter). A command the log
//!   no longer holds (past `LH_CMD`'s retention) or an outcome of an older decider can only be folded: the report
//!   says which ranges.
//! - The domain's invariants at every step, on what the step touched: nothing leaves a terminal state, leases
//!   within capacity and none on a resource that left, an identifier is never handed out while held nor bound to
//!   two resources, nor handed out again before its pool's cool-down has passed since it was freed, a claim is
//!   freed only after its holder's partition let it go (with a terminal state, or as a returned grant); and every invariant of the domain over a whole partition every
//!   [`FULL_CHECK_EVERY`] outcomes of it and at the end.
//! - The projection's tables equal a fresh fold (a digest per table), when there is a projection to compare.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use futures::StreamExt;
use leasehold_domain::{Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, encode_part};
use leasehold_log::CommandRecord;
use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::mentions::Mentions;
use leasehold_schemas::outcome::{Decision, Effect};
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{LeaseId, Outcome, PoolName, Position, RejectionKind, ResourceId};
use serde::Serialize;

use crate::fold::{Failure, Fold, Step};

/// How often (in outcomes of one partition) every invariant of the domain is checked over the whole partition.
pub const FULL_CHECK_EVERY: u64 = 10_000;

/// A range of outcome sequences and how many outcomes in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Span {
    pub count: u64,
    pub first: u64,
    pub last: u64,
}

impl Span {
    fn add(&mut self, seq: u64) {
        if self.count == 0 {
            self.first = seq;
        }
        self.count += 1;
        self.last = seq;
    }
}

/// What `verify` found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub partitions: u32,
    pub outcomes: u64,
    pub commands: u64,
    pub dead_letters: u64,
    /// Commands decided again, with their outcome parts, which equal the recorded ones.
    pub redecided: Span,
    /// Commands the log shows no outcome for, decided again to none.
    pub without_outcome: u64,
    /// Outcomes that could only be folded: their command is past the command log's retention.
    pub folded_only_commands_gone: Span,
    /// Outcomes that could only be folded: their command is not held although older commands of the partition are
    /// (retention moved while a live log was read, or the log was altered).
    pub folded_only_commands_missing: Span,
    /// Outcomes that could only be folded: an older decider version made them.
    pub folded_only_older_decider: Span,
    /// Outcomes that could only be folded: their command is in a newer schema than this tool knows.
    pub folded_only_newer_schema: Span,
    /// Commands read but not decided yet (after their partition's last outcome).
    pub undecided: u64,
    /// Whole-partition invariant checks made.
    pub full_checks: u64,
    pub projection: Option<ProjectionCheck>,
    pub failure: Option<Failure>,
}

/// The projection compared with a fresh fold.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectionCheck {
    /// The outcome the projection was as of, where the fresh fold was compared.
    pub applied: u64,
    pub tables: usize,
    /// Tables whose digests differ.
    pub differing: Vec<String>,
}

/// A projection to compare with a fresh fold: its last applied outcome and its table digests.
#[derive(Debug, Clone)]
pub struct Projection {
    pub applied: u64,
    pub digests: std::collections::BTreeMap<String, String>,
}

/// The facts about claims that span partitions, kept across the whole fold.
#[derive(Debug, Default)]
struct Claims {
    /// (pool, value) -> the resource it is bound to (from `claim-bound` until the holder lets it go).
    bound: HashMap<(PoolName, PoolValue), ResourceId>,
    /// Grants a holder's partition let go (`claim-releasable` with a value, `grant-returned`): the pool may free
    /// them. (pool, resource, value, token).
    releasable: HashSet<(PoolName, ResourceId, PoolValue, Position)>,
    /// Grants made by pools and not freed yet: (pool, holder, value, token = the grant's position). A holder binds
    /// only what its pool granted it.
    granted: HashSet<(PoolName, ResourceId, PoolValue, Position)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("report", &self.report).finish_non_exhaustive()
    }
}

pub struct Verifier {
    fold: Fold,
    report: Report,
    claims: Claims,
    since_full: Vec<u64>,
    fresh: Option<(leasehold_projector::Projector, Projection, Vec<leasehold_log::StoredOutcome>)>,
}

impl Verifier {
    /// A verifier of a log of `partitions` partitions; `projection`: one to compare with a fresh fold.
    pub fn new(partitions: u32, projection: Option<Projection>) -> anyhow::Result<Self> {
        let fresh = match projection {
            Some(projection) => Some((leasehold_projector::Projector::in_memory(partitions)?, projection, Vec::new())),
            None => None,
        };
        Ok(Verifier {
            fold: Fold::new(partitions),
            report: Report { partitions, ..Report::default() },
            claims: Claims::default(),
            since_full: vec![0; partitions as usize],
            fresh,
        })
    }

    /// Re-decides as writers splitting long decisions after `bytes` of effects did (tests' small part size).
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.fold = self.fold.with_split_budget(bytes);
        self
    }

    /// Checks every entry of `entries`; stops at the first failure. `progress` is told each outcome's sequence.
    pub async fn run(
        mut self,
        mut entries: futures::stream::BoxStream<'static, Result<leasehold_log::export::Entry, leasehold_log::Error>>,
        mut progress: impl FnMut(u64),
    ) -> anyhow::Result<Report> {
        while let Some(entry) = entries.next().await {
            // A source that cannot be read (a damaged file, a cut stream, the log unreachable) says nothing about
            // the log: the tool could not do what was asked.
            let entry = entry
                .map_err(|e| anyhow::anyhow!("reading the log after outcome {}: {e}", self.fold.last_outcome()))?;
            let step = match self.fold.admit(entry) {
                Ok(Some(step)) => step,
                Ok(None) => continue,
                Err(failure) => {
                    self.fail(failure);
                    return Ok(self.finish_report());
                }
            };
            if let Err(failure) = self.step(&step) {
                self.fail(failure);
                return Ok(self.finish_report());
            }
            progress(step.seq());
        }
        if let Err(failure) = self.finish() {
            self.fail(failure);
        }
        Ok(self.finish_report())
    }

    fn fail(&mut self, failure: Failure) {
        self.report.failure.get_or_insert(failure);
    }

    fn finish_report(mut self) -> Report {
        self.report.outcomes = self.fold.outcomes;
        self.report.commands = self.fold.commands;
        self.report.dead_letters = self.fold.dead_letters;
        self.report
    }

    fn step(&mut self, step: &Step) -> Result<(), Failure> {
        let partition = step.partition();
        let before = self.fold.state(partition);
        for record in &step.unanswered {
            without_outcome(&mut self.report, before, record)?;
        }
        redecide(&mut self.report, before, step)?;
        let touched = Touched::before(before, &step.outcome);
        check_grants(before, step)?;
        self.fold.apply(step)?;
        let after = self.fold.state(partition);
        touched.check_after(after).map_err(|detail| Failure::outcome(step.seq(), partition, detail))?;
        self.claims.check(step).map_err(|detail| Failure::outcome(step.seq(), partition, detail))?;
        let since = &mut self.since_full[partition as usize];
        *since += 1;
        if *since >= FULL_CHECK_EVERY {
            *since = 0;
            self.full_check(partition, step.seq())?;
        }
        self.project(step)?;
        Ok(())
    }

    /// Every invariant of the domain over one partition.
    fn full_check(&mut self, partition: u32, seq: u64) -> Result<(), Failure> {
        self.report.full_checks += 1;
        leasehold_domain::invariants::check(self.fold.state(partition))
            .map_err(|e| Failure::outcome(seq, partition, format!("after it, an invariant of the domain fails: {e}")))
    }

    /// Feeds the fresh projection, and compares it with the recorded one once it has reached the outcome the
    /// recorded one is as of.
    fn project(&mut self, step: &Step) -> Result<(), Failure> {
        let Some((projector, recorded, batch)) = &mut self.fresh else { return Ok(()) };
        if step.seq() > recorded.applied {
            return Ok(());
        }
        batch.push(step.stored.clone());
        if batch.len() >= leasehold_projector::MAX_BATCH || step.seq() == recorded.applied {
            projector
                .apply_batch(batch)
                .map_err(|e| Failure::outcome(step.seq(), step.partition(), format!("the fresh projection: {e}")))?;
            batch.clear();
        }
        if step.seq() == recorded.applied {
            self.compare_projection(step.seq(), step.partition())?;
        }
        Ok(())
    }

    fn compare_projection(&mut self, seq: u64, partition: u32) -> Result<(), Failure> {
        let Some((projector, recorded, _)) = self.fresh.take() else { return Ok(()) };
        let fresh = projector
            .digests()
            .map_err(|e| Failure::outcome(seq, partition, format!("the fresh projection's digests: {e}")))?;
        let mut differing: Vec<String> = fresh
            .iter()
            .filter(|(table, digest)| recorded.digests.get(**table) != Some(*digest))
            .map(|(table, _)| (*table).to_owned())
            .collect();
        differing.extend(recorded.digests.keys().filter(|t| !fresh.contains_key(t.as_str())).cloned());
        let check = ProjectionCheck { applied: recorded.applied, tables: fresh.len(), differing: differing.clone() };
        self.report.projection = Some(check);
        if !differing.is_empty() {
            return Err(Failure {
                what: "outcome",
                seq,
                partition: None,
                detail: format!(
                    "the projection as of this outcome differs from a fresh fold of the log in table(s) {}: rebuild \
                     it (`leasehold-replay rebuild`)",
                    differing.join(", ")
                ),
            });
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Failure> {
        if let Some((_, recorded, _)) = &self.fresh {
            if recorded.applied > self.fold.last_outcome() {
                return Err(Failure {
                    what: "outcome",
                    seq: recorded.applied,
                    partition: None,
                    detail: format!(
                        "the projection says it applied outcomes up to {}, but the log ends at {}",
                        recorded.applied,
                        self.fold.last_outcome()
                    ),
                });
            }
            if recorded.applied == 0 {
                self.compare_projection(0, 0)?;
            }
        }
        for partition in 0..self.fold.partitions() {
            self.full_check(partition, self.fold.last_outcome())?;
        }
        // Commands after their partition's last outcome: decided to none (a duplicate, an idle heartbeat), or not
        // decided yet (the writer is behind, or stopped).
        for (partition, record) in self.fold.undecided() {
            let state = self.fold.state(partition);
            let decided_to_none = match leasehold_worker::admit(partition, state.partitions(), record) {
                // Dead-lettered.
                Err(_) => true,
                Ok(envelope) => {
                    let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
                    matches!(
                        catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))),
                        Ok(Ok(Decided::AlreadyDecided { .. } | Decided::Unchanged))
                    )
                }
            };
            if decided_to_none {
                self.report.without_outcome += 1;
            } else {
                self.report.undecided += 1;
            }
        }
        Ok(())
    }
}

/// A command the log shows no outcome for must get none when decided again.
fn without_outcome(report: &mut Report, state: &PartitionState, record: &CommandRecord) -> Result<(), Failure> {
    let partition = state.partition();
    let envelope = match leasehold_worker::admit(partition, state.partitions(), record) {
        Ok(envelope) => envelope,
        // A dead letter (or a command of a newer schema, which a writer of this version leaves alone).
        Err(_) => return Ok(()),
    };
    let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
    match catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))) {
        Ok(Ok(Decided::AlreadyDecided { .. } | Decided::Unchanged)) => {
            report.without_outcome += 1;
            Ok(())
        }
        Ok(Ok(Decided::Append(outcome))) => Err(Failure::command(
            record.seq,
            partition,
            format!(
                "the log has no outcome for this {} ({}), but deciding it again gives one: {}",
                envelope.type_name(),
                envelope.command_id,
                summary(&outcome)
            ),
        )),
        Ok(Err(e)) => Err(Failure::command(record.seq, partition, format!("deciding it again: {e}"))),
        Err(_) => Err(Failure::command(
            record.seq,
            partition,
            "the log has no outcome for it, and deciding it again panics".to_owned(),
        )),
    }
}

/// Decides `step`'s command (or makes its part) again against the state before it: it must give the recorded outcome.
fn redecide(report: &mut Report, state: &PartitionState, step: &Step) -> Result<(), Failure> {
    let (seq, partition, recorded) = (step.seq(), step.partition(), &step.outcome);
    if recorded.decider_version != DECIDER_VERSION {
        report.folded_only_older_decider.add(seq);
        return Ok(());
    }
    let redecided = if recorded.part == 0 {
        let Some(record) = &step.command else {
            if step.command_missing {
                report.folded_only_commands_missing.add(seq);
            } else {
                report.folded_only_commands_gone.add(seq);
            }
            return Ok(());
        };
        let envelope = match leasehold_worker::admit(partition, state.partitions(), record) {
            Ok(envelope) => envelope,
            // A newer schema than this tool's (decoded again only on this rare path): it can only be folded.
            Err(_)
                if codec::decode_command(&record.payload).is_err_and(|e| e.kind() == CodecErrorKind::NewerSchema) =>
            {
                report.folded_only_newer_schema.add(seq);
                return Ok(());
            }
            Err(why) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!("it answers command {}, which a writer must dead-letter ({why})", record.seq),
                ));
            }
        };
        let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
        match catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))) {
            Ok(Ok(Decided::Append(outcome))) => Some(outcome),
            Ok(Ok(Decided::AlreadyDecided { cmd_seq })) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!(
                        "deciding command {} again says it was decided already (at command {cmd_seq}), but the \
                             log has this outcome for it",
                        record.seq
                    ),
                ));
            }
            Ok(Ok(Decided::Unchanged)) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    "deciding its command again changes nothing (no outcome), but the log has this one",
                ));
            }
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("deciding its command again: {e}"))),
            Err(_) => None,
        }
    } else {
        match catch_unwind(AssertUnwindSafe(|| continue_work(state))) {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("making this part again: {e}"))),
            Err(_) => None,
        }
    };
    if same_decision(state, recorded, redecided.as_ref()) {
        report.redecided.add(seq);
        return Ok(());
    }
    let detail = match &redecided {
        Some(outcome) => difference(recorded, outcome),
        None => format!("deciding it again panics, but the log has {}", summary(recorded)),
    };
    Err(Failure::outcome(
        seq,
        partition,
        format!("the recorded outcome differs from what decide gives today: {detail}"),
    ))
}

/// Whether `recorded` is what a writer of today records for `redecided` (`None`: the decider panicked). A writer
/// records an internal error instead of a decision that panics, does not encode, or does not fold.
fn same_decision(state: &PartitionState, recorded: &Outcome, redecided: Option<&Outcome>) -> bool {
    let internal = matches!(&recorded.decision, Decision::Rejected(r) if r.kind == RejectionKind::InternalError);
    match redecided {
        Some(outcome) if outcome == recorded => true,
        None => internal,
        Some(_) if !internal => false,
        Some(outcome) => {
            if encode_part(outcome.clone()).is_ok_and(|(encoded, _)| encoded == *recorded) {
                return true;
            }
            let mut scratch = state.clone();
            !matches!(catch_unwind(AssertUnwindSafe(|| apply(&mut scratch, outcome))), Ok(Ok(())))
        }
    }
}

/// An outcome in a few words.
fn summary(outcome: &Outcome) -> String {
    match &outcome.decision {
        Decision::Rejected(r) => format!("a rejection ({r})"),
        Decision::Accepted { effects, .. } => format!(
            "{} accepted with {} effect(s){}",
            outcome.command.type_name,
            effects.len(),
            effects.first().map(|e| format!(", first {}", e.name())).unwrap_or_default()
        ),
    }
}

/// The first difference between the recorded outcome and the one decided again.
fn difference(recorded: &Outcome, redecided: &Outcome) -> String {
    match (&recorded.decision, &redecided.decision) {
        (
            Decision::Accepted { first_position: a, effects: ea },
            Decision::Accepted { first_position: b, effects: eb },
        ) => {
            if a != b {
                return format!("recorded effects start at position {a}, decide's at {b}");
            }
            for (i, (x, y)) in ea.iter().zip(eb).enumerate() {
                if x != y {
                    return format!(
                        "effect {i} (position {}): recorded {}; decide gives {}",
                        a.0 + i as u64,
                        leasehold_cli_common::output::effect(x),
                        leasehold_cli_common::output::effect(y)
                    );
                }
            }
            if ea.len() != eb.len() {
                return format!("recorded {} effect(s); decide gives {}", ea.len(), eb.len());
            }
            let mut fields = Vec::new();
            if recorded.decided_at != redecided.decided_at {
                fields.push(format!("decided_at {} vs {}", recorded.decided_at, redecided.decided_at));
            }
            if recorded.log_time != redecided.log_time {
                fields.push(format!("log_time {} vs {}", recorded.log_time, redecided.log_time));
            }
            if recorded.command != redecided.command {
                fields.push("the command summary".to_owned());
            }
            format!(
                "same effects, but {}",
                if fields.is_empty() { "other fields".to_owned() } else { fields.join(", ") }
            )
        }
        _ => format!("recorded {}; decide gives {}", summary(recorded), summary(redecided)),
    }
}

/// What a step touched, with the states before it: to check what changed and nothing else.
struct Touched {
    resources: Vec<(ResourceId, Option<&'static str>, bool)>,
    leases: Vec<(LeaseId, Option<&'static str>, bool)>,
    /// Resources an effect said may let their claims go: they must be terminal after.
    releasable: Vec<ResourceId>,
}

impl Touched {
    fn before(state: &PartitionState, outcome: &Outcome) -> Touched {
        let mut touched = Touched { resources: Vec::new(), leases: Vec::new(), releasable: Vec::new() };
        for effect in outcome.effects() {
            let m = Mentions::of(effect);
            for id in m.resources {
                let before = state.resource(id).map(|r| (r.state.name(), r.state.is_terminal()));
                touched.resources.push((id, before.map(|b| b.0), before.is_some_and(|b| b.1)));
            }
            for id in m.leases {
                let before = state.lease(id).map(|l| (l.state.name(), !l.state.is_live()));
                touched.leases.push((id, before.map(|b| b.0), before.is_some_and(|b| b.1)));
            }
            if let Effect::ClaimReleasable { resource, .. } = effect {
                touched.releasable.push(*resource);
            }
        }
        touched
    }

    fn check_after(&self, state: &PartitionState) -> Result<(), String> {
        for (id, before, was_terminal) in &self.resources {
            let Some(resource) = state.resource(*id) else { continue };
            if *was_terminal && Some(resource.state.name()) != *before {
                return Err(format!(
                    "resource {id} left its terminal state {} for {}",
                    before.unwrap_or("-"),
                    resource.state.name()
                ));
            }
            // Only granted leases take capacity: waiting ones (queued on a busy resource, or waiting for it to be
            // made) hold none.
            let active = state
                .live_leases_of(resource)
                .filter(|lease| matches!(lease.state, leasehold_domain::state::LeaseState::Active { .. }))
                .count() as u64;
            if active > u64::from(resource.capacity) {
                return Err(format!(
                    "resource {id} has {active} active leases over its capacity {}",
                    resource.capacity
                ));
            }
            let live = state.live_leases_of(resource).count() as u64;
            if resource.state.has_left() && live > 0 {
                return Err(format!("resource {id} is {} with {live} live lease(s)", resource.state.name()));
            }
        }
        for (id, before, was_terminal) in &self.leases {
            let Some(lease) = state.lease(*id) else { continue };
            if *was_terminal && Some(lease.state.name()) != *before {
                return Err(format!(
                    "lease {id} left its terminal state {} for {}",
                    before.unwrap_or("-"),
                    lease.state.name()
                ));
            }
        }
        for id in &self.releasable {
            if state.resource(*id).is_some_and(|r| !r.state.is_terminal()) {
                return Err(format!("resource {id} let a claim go while it is not in a terminal state"));
            }
        }
        Ok(())
    }
}

/// An identifier is handed out only when nobody holds it: the grants of a step, in order, against the pool's held
/// identifiers before it (an identifier freed earlier in the same step may be granted again).
fn check_grants(state: &PartitionState, step: &Step) -> Result<(), Failure> {
    let leasehold_schemas::Key::Pool(name) = &step.outcome.command.key else { return Ok(()) };
    let Some(pool) = state.pool(name) else { return Ok(()) };
    let mut freed: Vec<PoolValue> = Vec::new();
    let mut granted: Vec<PoolValue> = Vec::new();
    for effect in step.outcome.effects() {
        match effect {
            Effect::ClaimFreed { value, .. } => freed.push(*value),
            Effect::ClaimGranted { holder, value, .. } => {
                let held_by = pool.held.get(value).filter(|_| !freed.contains(value));
                if let Some(other) = held_by {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!("{value} of pool {name} is granted to {holder} while {other} holds it"),
                    ));
                }
                if granted.contains(value) {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!("{value} of pool {name} is granted twice in one decision"),
                    ));
                }
                // A freed identifier rests its pool's cool-down before it is handed out again.
                let now = step.outcome.decided_at;
                let resting = pool.cooling.iter().find(|(_, v)| *v == value).map(|((freed, _), _)| *freed);
                if let Some(freed) = resting.filter(|freed| freed.0.saturating_add(pool.cooldown.0) > now.0) {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!(
                            "{value} of pool {name} is granted to {holder} {} ms before its cool-down ends (freed at \
                             {}, cool-down {} ms)",
                            freed.0 + pool.cooldown.0 - now.0,
                            freed.0,
                            pool.cooldown.0
                        ),
                    ));
                }
                granted.push(*value);
            }
            _ => {}
        }
    }
    Ok(())
}

impl Claims {
    /// Bindings across partitions: one resource per identifier; frees only of what a holder let go.
    fn check(&mut self, step: &Step) -> Result<(), String> {
        let pool_key = match &step.outcome.command.key {
            leasehold_schemas::Key::Pool(name) => Some(name),
            leasehold_schemas::Key::Agent(_) | leasehold_schemas::Key::Placement(_) => None,
        };
        for (position, effect) in step.outcome.positioned_effects() {
            match effect {
                Effect::ClaimGranted { holder, value, .. } => {
                    if let Some(pool) = pool_key {
                        self.granted.insert((pool.clone(), holder.resource, *value, position));
                    }
                }
                Effect::ClaimBound { resource, pool, value, token } => {
                    if !self.granted.contains(&(pool.clone(), *resource, *value, *token)) {
                        return Err(format!(
                            "{value} of pool {pool} is bound to {resource} under token {token}, which its pool never \
                             granted it (or freed already)"
                        ));
                    }
                    if let Some(other) = self.bound.insert((pool.clone(), *value), *resource)
                        && other != *resource
                    {
                        return Err(format!("{value} of pool {pool} is bound to {resource} while {other} holds it"));
                    }
                }
                Effect::ClaimReleasable { resource, pool, value: Some(value), token: Some(token) } => {
                    self.release_binding(pool, *value, *resource);
                    self.releasable.insert((pool.clone(), *resource, *value, *token));
                }
                Effect::GrantReturned { resource, pool, value, token } => {
                    self.releasable.insert((pool.clone(), *resource, *value, *token));
                }
                Effect::ClaimFreed { holder, value, token } => {
                    let Some(pool) = pool_key else { continue };
                    if !self.releasable.remove(&(pool.clone(), holder.resource, *value, *token)) {
                        return Err(format!(
                            "{value} of pool {pool} was freed from {holder} before its partition let the claim go \
                             (no claim-releasable or grant-returned for token {token})"
                        ));
                    }
                    self.release_binding(pool, *value, holder.resource);
                    self.granted.remove(&(pool.clone(), holder.resource, *value, *token));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn release_binding(&mut self, pool: &PoolName, value: PoolValue, resource: ResourceId) {
        let key = (pool.clone(), value);
        if self.bound.get(&key) == Some(&resource) {
            self.bound.remove(&key);
        }
    }
}
