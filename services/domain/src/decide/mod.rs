//! `decide`: one command against the current partition state gives one outcome. No I/O, no clock, no randomness,
//! no configuration: the same state, context and command always give the same outcome.
//!
//! Each command type has its own function in a submodule; they share the "units" here (leave for good, order a
//! release, activate), which keep one resource's effects together so that a huge decision can stop between two
//! resources. Such a decision is one outcome in parts: [`decide`] gives the first part, and while
//! [`PartitionState::pending`] says a decision is unfinished, [`continue_work`] gives the next one. The writer
//! appends every part before it decides anything else, so nothing can come between the parts of a decision.

mod agents;
pub use agents::MAX_PRIORITY_CAPS;
mod garbage;
mod leases;
mod placement;
mod pools;
mod quotas;
pub use quotas::{MAX_QUOTA_KINDS, MAX_QUOTA_PRINCIPALS};
mod reports;

pub use reports::expected_listing;
mod resources;

use std::collections::BTreeSet;
use std::fmt;

use leasehold_schemas::codec;
use leasehold_schemas::command::Command;
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, Key, LeaseId, ObsStamp, Position, ResourceId, Source, Timestamp,
};
use leasehold_schemas::outcome::{BreakReason, CommandSummary, Decision, Effect, FreeCause, ReleaseCause, Work};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{CommandClass, Envelope, Outcome, Rejection, RejectionKind};

use crate::state::{Agent, ClaimSlot, Lease, LeaseState, PartitionState, Resource, ResourceState, queue_order};

/// The version of these rules. Outcomes carry it; re-deciding history is checked within one version.
pub const DECIDER_VERSION: u32 = 6;
/// How far ahead of the log's time an id may be stamped (UUIDv7 ids carry their issuer's clock): further ahead, the
/// issuer's clock is wrong, and the id is refused ("fix the issuer's clock"). An id from the future would be
/// remembered, asked about and waited for until its own time plus the horizon; NTP keeps clocks within a second.
pub const MAX_ID_AHEAD: leasehold_schemas::Millis = leasehold_schemas::Millis::from_mins(5);
/// How long a resource of a draining agent must have held no lease before it is released, when the drain names no
/// grace (`op.drain-agent` `grace: null`): long enough for a holder that releases and acquires again (the next step
/// of a build) to keep it.
pub const DEFAULT_DRAIN_GRACE: leasehold_schemas::Millis = leasehold_schemas::Millis::from_mins(5);
/// The most leases one resource can take (bounds the effects of one resource leaving).
pub const MAX_CAPACITY: u32 = 1024;
/// The most leases that may wait on one resource beyond its capacity (with the active ones, they bound the effects
/// of one resource leaving, and of one decision serving its queue: at most `MAX_CAPACITY` grants and this many
/// failures fit in `MAX_UNIT_BYTES`).
pub const MAX_QUEUED: usize = 256;
/// The most pools one resource claims from.
pub const MAX_POOLS_PER_RESOURCE: usize = 8;
pub const MAX_ATTRIBUTES: usize = 64;
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 64;
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;
/// Reasons, details and native ids.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Lease holders (they are repeated in every lease effect).
pub const MAX_HOLDER_BYTES: usize = 128;
/// Excluded addresses or ports of one pool (each is repeated in its `pool-defined`).
pub const MAX_POOL_EXCLUSIONS: usize = 4096;
/// A rejection's message: what it echoes of a command is shortened to fit.
pub const MAX_MESSAGE_BYTES: usize = 2048;
/// A bound on the effects of one unit of work: one resource's transition with all its leases (at most
/// `MAX_CAPACITY` grants of about 190 bytes each) and claims.
pub const MAX_UNIT_BYTES: usize = 200 * 1024;
const OUTCOME_OVERHEAD_BYTES: usize = 4 * 1024;
/// Past this many bytes of effects, a decision stops before its next unit and continues in the next part, so that
/// the last unit and the rest of the work (which a report reserves room for) still fit in
/// `codec::MAX_OUTCOME_BYTES`.
pub const EFFECT_BUDGET_BYTES: usize = codec::MAX_OUTCOME_BYTES - MAX_UNIT_BYTES - OUTCOME_OVERHEAD_BYTES;

/// What the log says about the command being decided: its sequence and the time the log stamped on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    pub cmd_seq: u64,
    pub log_time: Timestamp,
}

/// What the writer does with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Append this outcome (the first part of the decision; while the state after it has a pending decision,
    /// [`continue_work`] gives the next part).
    Append(Outcome),
    /// The command id was decided within the horizon, at this command sequence (its outcome is in the log and the
    /// projection): append nothing and ack.
    AlreadyDecided { cmd_seq: u64 },
    /// A heartbeat that changes nothing: append nothing and ack (deciding it again changes nothing either).
    Unchanged,
}

/// A writer that asks the core for something out of order: a bug in the writer, never a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterError {
    /// A decision's parts are unfinished: its next part comes before any other command.
    PartsPending { cmd_seq: u64, next_part: u32 },
    /// No decision is unfinished: there is no next part to make.
    NothingPending,
    /// The command's sequence is not after the last one decided: the log is read strictly in order.
    NotAfterCursor { cursor: u64, cmd_seq: u64 },
}

impl fmt::Display for WriterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriterError::PartsPending { cmd_seq, next_part } => write!(
                f,
                "the decision of command {cmd_seq} is unfinished: append its part {next_part} (continue_work) before \
                 deciding anything else"
            ),
            WriterError::NothingPending => f.write_str("no decision is unfinished: there is no next part to make"),
            WriterError::NotAfterCursor { cursor, cmd_seq } => write!(
                f,
                "command {cmd_seq} is not after the last one decided ({cursor}): commands are decided strictly in \
                 log order"
            ),
        }
    }
}

impl std::error::Error for WriterError {}

fn refuse_while_pending(state: &PartitionState) -> Result<(), WriterError> {
    match &state.pending {
        Some(pending) => Err(WriterError::PartsPending { cmd_seq: pending.cmd_seq, next_part: pending.next_part() }),
        None => Ok(()),
    }
}

/// Decides one command: the first part of its outcome, or "already decided" for a command id remembered within the
/// horizon, or "unchanged" for a heartbeat that changes nothing. Refused (a writer bug) while a decision is
/// unfinished.
pub fn decide(state: &PartitionState, ctx: &Ctx, envelope: &Envelope) -> Result<Decided, WriterError> {
    refuse_while_pending(state)?;
    if ctx.cmd_seq <= state.cursor {
        return Err(WriterError::NotAfterCursor { cursor: state.cursor, cmd_seq: ctx.cmd_seq });
    }
    if let Some(cmd_seq) = state.recent.by_id.get(&envelope.command_id).copied().or_else(|| renewed_by(state, envelope))
    {
        return Ok(Decided::AlreadyDecided { cmd_seq });
    }
    let now = state.now.max(ctx.log_time);
    let mut decider = Decider::new(state, &envelope.issuer, Some(envelope.command_id), now);
    let decision = match decider.run(envelope) {
        Ok(()) => Decision::Accepted { first_position: state.next_position, effects: decider.out.list },
        Err(rejection) => Decision::Rejected(rejection),
    };
    if matches!(envelope.body, Command::Heartbeat(_))
        && matches!(&decision, Decision::Accepted { effects, .. } if effects.is_empty())
    {
        return Ok(Decided::Unchanged);
    }
    Ok(Decided::Append(first_part(state, ctx, envelope, decision)))
}

/// The answer a heartbeat that changed nothing ([`Decided::Unchanged`]) gets: an empty accepted outcome, which is
/// not appended.
pub(crate) fn unchanged_outcome(state: &PartitionState, ctx: &Ctx, envelope: &Envelope) -> Outcome {
    let decision = Decision::Accepted { first_position: state.next_position, effects: vec![] };
    first_part(state, ctx, envelope, decision)
}

/// The next part of the unfinished decision: it does what the last part left (`decision-continues`), as much as fits,
/// and ends with `decision-continues` again if there is more. Refused (a writer bug) when nothing is pending.
pub fn continue_work(state: &PartitionState) -> Result<Outcome, WriterError> {
    let pending = state.pending.as_ref().ok_or(WriterError::NothingPending)?;
    let mut decider = Decider::new(state, &pending.command.issuer, None, state.now);
    decider.continue_work(&pending.work);
    let decision = Decision::Accepted { first_position: state.next_position, effects: decider.out.list };
    Ok(next_part(state, pending, decision))
}

/// The next part of `pending`, with `decision`.
fn next_part(state: &PartitionState, pending: &crate::state::PendingDecision, decision: Decision) -> Outcome {
    let (command, cmd_seq, part) = (pending.command.clone(), pending.cmd_seq, pending.next_part());
    outcome(state, command, cmd_seq, part, pending.log_time, state.now, decision)
}

/// The recorded outcome for a command the decider could not decide (it panicked): the partition moves on and the
/// failure is on record. Refused (a writer bug) while a decision is unfinished: see [`abandon_pending`].
pub fn internal_error_outcome(
    state: &PartitionState,
    ctx: &Ctx,
    envelope: &Envelope,
    detail: &str,
) -> Result<Outcome, WriterError> {
    refuse_while_pending(state)?;
    Ok(first_part(state, ctx, envelope, Decision::Rejected(internal_error(detail))))
}

/// The last part of an unfinished decision whose next part the decider could not make (it panicked): the work
/// left is abandoned, on record, and the partition moves on.
pub fn abandon_pending(state: &PartitionState, detail: &str) -> Result<Outcome, WriterError> {
    let pending = state.pending.as_ref().ok_or(WriterError::NothingPending)?;
    let decision = Decision::Rejected(internal_error(&format!("the rest of the decision was abandoned: {detail}")));
    Ok(next_part(state, pending, decision))
}

fn internal_error(detail: &str) -> Rejection {
    Rejection::new(RejectionKind::InternalError, bounded(format!("the decider failed on this command: {detail}")))
}

/// The first part of the outcome of `envelope`, decided at `max(partition time, log time)`.
fn first_part(state: &PartitionState, ctx: &Ctx, envelope: &Envelope, decision: Decision) -> Outcome {
    let now = state.now.max(ctx.log_time);
    outcome(state, CommandSummary::of(envelope), ctx.cmd_seq, 0, ctx.log_time, now, decision)
}

fn outcome(
    state: &PartitionState,
    command: CommandSummary,
    cmd_seq: u64,
    part: u32,
    log_time: Timestamp,
    now: Timestamp,
    decision: Decision,
) -> Outcome {
    Outcome {
        decider_version: DECIDER_VERSION,
        partition: state.partition,
        command,
        cmd_seq,
        part,
        log_time,
        decided_at: now,
        decision,
    }
}

/// Encodes a part for the log: the writer appends these bytes, and this is where the size cap is checked, once, on
/// the encoding the append needs anyway (not in `decide`, on every decision). A part the codec refuses (over the cap:
/// a bug in the budgets, never expected; the property tests hold every part under it) is recorded as an internal
/// error instead of wedging the partition: a first part becomes a rejection, a later part abandons the rest. Returns
/// the part to apply, which is the one encoded.
pub fn encode_part(outcome: Outcome) -> Result<(Outcome, Vec<u8>), codec::CodecError> {
    match codec::encode_outcome(&outcome) {
        Ok(bytes) => Ok((outcome, bytes)),
        Err(e) => {
            let detail = format!("its outcome does not encode: {e}");
            let recorded = Outcome { decision: Decision::Rejected(internal_error(&detail)), ..outcome };
            let bytes = codec::encode_outcome(&recorded)?;
            Ok((recorded, bytes))
        }
    }
}

/// Shortens a message to `MAX_MESSAGE_BYTES` at a character boundary.
fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        message.truncate(message.floor_char_boundary(MAX_MESSAGE_BYTES - 3));
        message.push_str("...");
    }
    message
}

/// A command's text as a rejection echoes it: quoted, and cut after 64 bytes with its full length said.
pub(crate) fn echo(text: &str) -> String {
    const SHOWN: usize = 64;
    if text.len() <= SHOWN {
        return format!("{text:?}");
    }
    format!("{:?}... ({} bytes)", &text[..text.floor_char_boundary(SHOWN)], text.len())
}

/// Whether a command id is remembered for idempotency once decided. Heartbeats and reports are not: they are
/// frequent, a heartbeat is idempotent by nature, and a report is ordered by its observation number (a repeated
/// one is stale). A `not-yet-due` answer is not either: the same request, sent again later, is decided then.
/// An accepted renew is remembered by its lease instead (`Lease::last_renew`): a lease renewed every minute must not
/// keep a day of command ids.
pub(crate) fn remembered(outcome: &Outcome) -> bool {
    let type_name = outcome.command.type_name.as_str();
    let accepted_renew = type_name == "op.renew" && outcome.rejection().is_none();
    !matches!(type_name, "agent.heartbeat" | "agent.sync" | "agent.resync-chunk" | "agent.report-garbage")
        && !accepted_renew
        && outcome.rejection().is_none_or(|r| r.kind != RejectionKind::NotYetDue)
}

/// The command sequence of the last accepted renew of a lease, if `envelope` is that renew again.
fn renewed_by(state: &PartitionState, envelope: &Envelope) -> Option<u64> {
    let Command::Renew(renew) = &envelope.body else {
        return None;
    };
    let (id, cmd_seq) = state.leases.get(&renew.lease)?.last_renew?;
    (id == envelope.command_id).then_some(cmd_seq)
}

type Verdict = Result<(), Rejection>;

fn reject<T>(kind: RejectionKind, message: impl Into<String>) -> Result<T, Rejection> {
    Err(Rejection::new(kind, bounded(message.into())))
}

/// Effects of the decision being made, with their byte count against the budget. Effects are sized only when a
/// decision asks whether it is over budget (only decisions over many resources do), so an ordinary decision never
/// encodes its effects twice.
struct Effects {
    first: Position,
    list: Vec<Effect>,
    /// Bytes of `list[..n_sized]`.
    bytes: usize,
    n_sized: usize,
    /// Where decisions that can continue stop (the partition's split budget, minus what they reserve).
    split_limit: usize,
    /// Where decisions that cannot continue stop (pools serving waiters: the rest wait for the next tick).
    limit: usize,
}

impl Effects {
    fn new(first: Position, split_budget: usize) -> Self {
        Effects { first, list: Vec::new(), bytes: 0, n_sized: 0, split_limit: split_budget, limit: EFFECT_BUDGET_BYTES }
    }

    /// Keeps `bytes` free for the rest of the work, should the decision have to continue.
    fn reserve(&mut self, bytes: usize) {
        self.limit = self.limit.saturating_sub(bytes);
        self.split_limit = self.split_limit.saturating_sub(bytes);
    }

    /// Adds an effect and returns its position.
    fn push(&mut self, effect: Effect) -> Position {
        let position = self.next_position();
        self.list.push(effect);
        position
    }

    fn next_position(&self) -> Position {
        Position(self.first.0 + self.list.len() as u64)
    }

    fn size(&mut self) -> usize {
        self.bytes += self.list[self.n_sized..].iter().map(codec::encoded_len).sum::<usize>();
        self.n_sized = self.list.len();
        self.bytes
    }

    /// For decisions that can continue in a next part: stop before the next unit.
    fn over_budget(&mut self) -> bool {
        self.size() >= self.split_limit
    }

    /// For decisions that cannot continue: stop doing more.
    fn over_cap(&mut self) -> bool {
        self.size() >= self.limit
    }
}

struct Decider<'s> {
    state: &'s PartitionState,
    issuer: &'s Issuer,
    /// The id of the command being decided (none for the next part of a decision).
    command_id: Option<CommandId>,
    now: Timestamp,
    out: Effects,
}

impl<'s> Decider<'s> {
    fn new(state: &'s PartitionState, issuer: &'s Issuer, command_id: Option<CommandId>, now: Timestamp) -> Self {
        Decider { state, issuer, command_id, now, out: Effects::new(state.next_position, state.split_budget) }
    }

    /// Refuses an id (`what` names it) that was made longer ago than the horizon, at or before something this
    /// partition has forgotten (it may be a forgotten one), or further ahead than [`MAX_ID_AHEAD`].
    fn check_fresh_id(&self, what: &str, id: &dyn fmt::Display, stamped: Timestamp, kind: RejectionKind) -> Verdict {
        let horizon = self.state.settings.outcome_horizon;
        let advice = if kind == RejectionKind::StaleCommand { "issue a new command" } else { "choose a fresh UUIDv7" };
        if stamped.saturating_add(horizon) < self.now {
            return reject(
                kind,
                format!(
                    "{what} {id} was made at {stamped}, longer ago than the outcome horizon ({horizon}) before {}; \
                     {advice}",
                    self.now
                ),
            );
        }
        if stamped <= self.state.forgotten_up_to {
            return reject(
                kind,
                format!(
                    "{what} {id} was made at {stamped}, no later than what this partition has forgotten (up to {}; \
                     the outcome horizon was shorter then): it may have been decided before; {advice}",
                    self.state.forgotten_up_to
                ),
            );
        }
        self.check_not_ahead(what, id, stamped)
    }

    /// Refuses an id stamped more than [`MAX_ID_AHEAD`] after the log's time.
    fn check_not_ahead(&self, what: &str, id: &dyn fmt::Display, stamped: Timestamp) -> Verdict {
        if stamped > self.now.saturating_add(MAX_ID_AHEAD) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "{what} {id} says it was made at {stamped}, more than {MAX_ID_AHEAD} after the log's time {}; \
                     fix the issuer's clock",
                    self.now
                ),
            );
        }
        Ok(())
    }

    /// Refuses a `source` outside the partition `agent` lives in: what is said about `about` (one of its resources)
    /// comes from there (`what` names what was said). Returns that partition.
    fn check_from_home(
        &self,
        about: &dyn fmt::Display,
        agent: &AgentName,
        source: Source,
        what: &str,
    ) -> Result<u32, Rejection> {
        let home = partition_of_agent(agent, self.state.partitions);
        if source.partition != home {
            return reject(
                RejectionKind::Invalid,
                format!("{about} lives in partition {home}; {what} cannot come from {source}"),
            );
        }
        Ok(home)
    }

    fn run(&mut self, envelope: &Envelope) -> Verdict {
        let command = &envelope.body;
        if envelope.class != command.class() {
            return reject(
                RejectionKind::NotPermitted,
                format!(
                    "{} is a {} command, but it came as class {}",
                    command.type_name(),
                    command.class(),
                    envelope.class
                ),
            );
        }
        let horizon = self.state.settings.outcome_horizon;
        let id = envelope.command_id;
        self.check_fresh_id("command id", &id, id.time(), RejectionKind::StaleCommand)?;
        if envelope.issued_at.saturating_add(horizon) < self.now {
            return reject(
                RejectionKind::StaleCommand,
                format!(
                    "command {} was issued at {}, longer ago than the outcome horizon ({horizon}) before {}; \
                     issue a new command",
                    envelope.command_id, envelope.issued_at, self.now
                ),
            );
        }
        if envelope.issued_at > self.now.saturating_add(horizon) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "command {} says it was issued at {}, more than the outcome horizon ({horizon}) after the log's \
                     time {}; fix the issuer's clock",
                    envelope.command_id, envelope.issued_at, self.now
                ),
            );
        }
        let key = command.key();
        let home = partition_of_key(&key, self.state.partitions);
        if home != self.state.partition {
            return reject(
                RejectionKind::WrongPartition,
                format!("{key} belongs to partition {home}, not {}", self.state.partition),
            );
        }
        if envelope.class == CommandClass::Agent
            && let Key::Agent(agent) = &key
            && envelope.issuer.as_str() != agent.as_str()
        {
            return reject(
                RejectionKind::NotPermitted,
                format!(
                    "{} about agent {agent} was sent by {}: agents report only about themselves",
                    command.type_name(),
                    envelope.issuer
                ),
            );
        }
        // An issuer under a quota is a tenant: it sends what a producer bound to a principal may send, so it can
        // neither raise its quota nor change the pools that count it.
        if envelope.class == CommandClass::Op
            && !command.is_producer_request()
            && let Some((quota, _)) = self.state.quota_of(&envelope.issuer)
        {
            return reject(
                RejectionKind::NotPermitted,
                format!(
                    "{} is under quota {quota}: it sends allocations, placements, leases and what it does to \
                     resources; {} is the operator's",
                    envelope.issuer,
                    command.type_name()
                ),
            );
        }
        match command {
            Command::Allocate(c) => self.allocate(c),
            Command::Acquire(c) => self.acquire(c),
            Command::Renew(c) => self.renew(c),
            Command::ReleaseLease(c) => self.release_lease(c),
            Command::Release(c) => self.release(c),
            Command::Pause(c) => self.pause(c),
            Command::Unpause(c) => self.unpause(c),
            Command::Update(c) => self.update(c),
            Command::ReportFailureByOperator(c) => self.report_failure_by_operator(c),
            Command::RetireAgent(c) => self.retire_agent(c),
            Command::ConfirmLoss(c) => self.confirm_loss(c),
            Command::DefinePool(c) => self.define_pool(c),
            Command::UpdatePool(c) => self.update_pool(c),
            Command::DeletePool(c) => self.delete_pool(c),
            Command::SetPartitionSettings(c) => self.set_partition_settings(c),
            Command::Register(c) => self.register(c),
            Command::Heartbeat(c) => self.heartbeat(c),
            Command::ReportCreated(c) => self.report_created(c),
            Command::Sync(c) => self.sync(c),
            Command::ResyncChunk(c) => self.resync_chunk(c),
            Command::ReportFailure(c) => self.report_failure(c),
            Command::HealthResult(c) => self.health_result(c),
            Command::ExpireLease(c) => self.expire_lease(c),
            Command::WaitTimeout(c) => self.wait_timeout(c),
            Command::CreateTimeout(c) => self.create_timeout(c),
            Command::ExpirePause(c) => self.expire_pause(c),
            Command::MarkStalled(c) => self.mark_stalled(c),
            Command::MarkGone(c) => self.mark_gone(c),
            Command::Orphan(c) => self.orphan(c),
            Command::RequestHealthCheck(c) => self.request_health_check(c),
            Command::Claim(c) => self.claim(c),
            Command::BindClaim(c) => self.bind_claim(c),
            Command::Free(c) => self.free(c),
            Command::TickPool(c) => self.tick_pool(c),
            Command::Cascade(c) => self.cascade(c),
            Command::Adopt(c) => self.adopt(c),
            Command::UnretireAgent(c) => self.unretire_agent(c),
            Command::CordonAgent(c) => self.cordon_agent(c),
            Command::UncordonAgent(c) => self.uncordon_agent(c),
            Command::GarbageReport(c) => self.garbage_report(c),
            Command::ReportDestroyed(c) => self.report_destroyed(c),
            Command::DriverStatus(c) => self.driver_status(c),
            Command::Place(c) => self.place(c),
            Command::CancelPlacement(c) => self.cancel_placement(c),
            Command::Reserve(c) => self.reserve(c),
            Command::BindPlacement(c) => self.bind_placement(c),
            Command::CommitPlacement(c) => self.commit_placement(c),
            Command::CancelReservation(c) => self.cancel_reservation(c),
            Command::Unplaceable(c) => self.unplaceable(c),
            Command::DrainAgent(c) => self.drain_agent(c),
            Command::DrainRelease(c) => self.drain_release(c),
            Command::ClosePlacement(c) => self.close_placement(c),
            Command::FreeOrphan(c) => self.free_orphan(c),
            Command::SetQuota(c) => self.set_quota(c),
            Command::OverQuota(c) => self.over_quota(c),
        }
    }

    // --- lookups that reject with a message naming the thing --------------------------------------------------

    fn agent(&self, name: &AgentName) -> Result<&'s Agent, Rejection> {
        self.state.agents.get(name).ok_or_else(|| {
            Rejection::new(RejectionKind::Unknown, format!("agent {name} has never registered with this partition"))
        })
    }

    /// The agent, if it is not gone and `epoch` is its current one (`what` names the message in the rejection).
    fn incarnation(&self, name: &AgentName, epoch: Position, what: &str) -> Result<&'s Agent, Rejection> {
        let agent = self.agent(name)?;
        if agent.liveness == crate::state::Liveness::Gone {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {name} is gone and its resources are orphaned; register a new incarnation"),
            );
        }
        if epoch != agent.epoch {
            return reject(
                RejectionKind::WrongEpoch,
                format!("{what} from epoch {epoch} of agent {name}, whose current epoch is {}", agent.epoch),
            );
        }
        Ok(agent)
    }

    fn resource(&self, agent: &AgentName, id: ResourceId) -> Result<&'s Resource, Rejection> {
        match self.state.resources.get(&id) {
            Some(resource) if resource.agent == *agent => Ok(resource),
            Some(resource) => {
                reject(RejectionKind::Unknown, format!("resource {id} is on agent {}, not on {agent}", resource.agent))
            }
            None => reject(RejectionKind::Unknown, format!("resource {agent}.{id} is not known")),
        }
    }

    // --- units: one resource's effects, kept together ---------------------------------------------------------

    /// Breaks every live lease of a resource.
    fn break_leases(&mut self, resource: &Resource, reason: BreakReason) {
        for lease in resource.live_leases.values() {
            self.out.push(Effect::LeaseBroken { lease: *lease, reason });
        }
    }

    /// Sends every claim of a resource back to its pool (a terminal resource).
    fn return_claims(&mut self, resource: &Resource) {
        for (pool, slot) in &resource.claims {
            let (value, token) = match slot {
                ClaimSlot::Wanted { .. } => (None, None),
                ClaimSlot::Bound { value, token, .. } => (Some(*value), Some(*token)),
                ClaimSlot::Returned { .. } | ClaimSlot::HeldForOrphan { .. } => continue,
            };
            self.out.push(Effect::ClaimReleasable { resource: resource.id, pool: pool.clone(), value, token });
        }
    }

    /// A terminal transition: the effect, its leases broken, its claims returned.
    fn leave_for_good(&mut self, resource: &Resource, terminal: Effect) {
        self.out.push(terminal);
        self.break_leases(resource, BreakReason::ResourceLeft);
        self.return_claims(resource);
    }

    /// Orders a resource destroyed: its leases break now; its claims stay held until the agent confirms it gone.
    fn order_release(&mut self, resource: &Resource, cause: ReleaseCause, reason: BreakReason) {
        self.out.push(Effect::ResourceReleasing { resource: resource.id, cause });
        self.break_leases(resource, reason);
    }

    /// A pending resource observed present: active, and its waiting leases granted first come first served (unless
    /// its parent is suspect: they wait until the flag clears).
    fn activate(&mut self, resource: &Resource, stamp: ObsStamp, native_id: Option<String>) {
        self.out.push(Effect::ResourceActivated { resource: resource.id, stamp, native_id });
        self.serve_if_clear(resource);
    }

    /// A resource back to `active` (unpaused, healthy again): the leases that waited on it while it was not are
    /// served now, unless its parent is suspect.
    fn serve_if_clear(&mut self, resource: &Resource) {
        if resource.upstream_suspect().is_none() {
            self.serve_waiting(resource);
        }
    }

    /// Grants the waiting leases of a resource that can take them now, in queue order, up to its capacity; fails
    /// those whose wait is over.
    fn serve_waiting(&mut self, resource: &Resource) {
        self.serve_queue(resource, resource.capacity, None);
    }

    /// Grants waiting leases in queue order (highest effective priority, then first come: [`queue_order`]) while
    /// fewer than `capacity` leases would be active, `ending` (a lease this decision ends) not counted; fails the
    /// waiters whose wait is over. A resource that is not `active`, or whose parent is suspect, is not served: its
    /// waiters keep waiting.
    fn serve_queue(&mut self, resource: &Resource, capacity: u32, ending: Option<LeaseId>) {
        let live: Vec<&Lease> = self.state.live_leases_of(resource).filter(|lease| Some(lease.id) != ending).collect();
        let over =
            |lease: &Lease| matches!(lease.state, LeaseState::Waiting { until: Some(until) } if until <= self.now);
        let n_active = live.iter().filter(|lease| matches!(lease.state, LeaseState::Active { .. })).count();
        let waiting = live.iter().copied().filter(|lease| matches!(lease.state, LeaseState::Waiting { .. }));
        let room = (capacity as usize).saturating_sub(n_active);
        let chosen: BTreeSet<LeaseId> =
            queue_order(waiting.filter(|lease| !over(lease)), self.now).into_iter().take(room).map(|l| l.id).collect();
        // In arrival order, as the leases are listed: the choice is by queue order, the effects keep the list's.
        for lease in live {
            if over(lease) {
                self.out.push(Effect::LeaseFailed { lease: lease.id });
            } else if chosen.contains(&lease.id) {
                self.out.push(Effect::LeaseGranted {
                    lease: lease.id,
                    resource: resource.id,
                    holder: lease.holder.clone(),
                    ttl: lease.ttl,
                    expires_at: lease.ttl.map(|ttl| self.now.saturating_add(ttl)),
                });
            }
        }
    }

    /// Orphans one resource of a gone agent. A claim granted by a pool that holds an orphan's identifiers is kept
    /// (`claim-held-for-orphan`): its machine may be cut off rather than dead, and still use it. The others go back.
    /// After a lease of an `active` resource ends (or its capacity grows), the queue is served in the same decision.
    fn serve_if_active(&mut self, resource: &Resource, capacity: u32, ending: Option<LeaseId>) {
        if resource.state == ResourceState::Active && resource.upstream_suspect().is_none() {
            self.serve_queue(resource, capacity, ending);
        }
    }

    /// Orphans one resource of a gone agent.
    fn orphan_unit(&mut self, resource: &Resource) {
        self.out.push(Effect::ResourceOrphaned { resource: resource.id });
        self.break_leases(resource, BreakReason::ResourceLeft);
        for (pool, slot) in &resource.claims {
            let (value, token) = match slot {
                ClaimSlot::Bound { value, token, orphans: leasehold_schemas::pool::OrphanPolicy::Hold } => {
                    let (value, token) = (*value, *token);
                    self.out.push(Effect::ClaimHeldForOrphan {
                        resource: resource.id,
                        pool: pool.clone(),
                        value,
                        token,
                    });
                    continue;
                }
                ClaimSlot::Wanted { .. } => (None, None),
                ClaimSlot::Bound { value, token, .. } => (Some(*value), Some(*token)),
                ClaimSlot::Returned { .. } | ClaimSlot::HeldForOrphan { .. } => continue,
            };
            self.out.push(Effect::ClaimReleasable { resource: resource.id, pool: pool.clone(), value, token });
        }
    }

    /// Lets an orphan's held claims go back to their pools (of `pool` only, if named), with `cause`.
    fn free_held(&mut self, resource: &Resource, pool: Option<&leasehold_schemas::PoolName>, cause: &FreeCause) {
        for (name, slot) in &resource.claims {
            let ClaimSlot::HeldForOrphan { value, token } = slot else { continue };
            if pool.is_some_and(|p| p != name) {
                continue;
            }
            self.out.push(Effect::ClaimReleasable {
                resource: resource.id,
                pool: name.clone(),
                value: Some(*value),
                token: Some(*token),
            });
            self.out.push(Effect::ClaimReleaseCause {
                resource: resource.id,
                pool: name.clone(),
                cause: cause.clone(),
            });
        }
    }

    /// Stops a part that grew past its budget: the next part of the outcome does `work`.
    fn continue_later(&mut self, work: Work) {
        self.out.push(Effect::DecisionContinues { work });
    }

    /// The next part of the pending decision. Nothing can have been decided since its last part, so the work is
    /// done against exactly the state that part left.
    fn continue_work(&mut self, work: &Work) {
        let Key::Agent(agent_name) = &self.state.pending.as_ref().expect("a decision is pending").command.key else {
            return;
        };
        let Some(agent) = self.state.agents.get(agent_name) else {
            return;
        };
        match work {
            Work::OrphanResources {} => self.orphan_rest(agent),
            Work::ReleaseResources {} => self.release_rest(agent),
            Work::Report { report, mark_losses } => self.continue_report(agent, report, *mark_losses),
            Work::Chunk { chunk, mark_losses } => self.continue_chunk(agent, chunk, *mark_losses),
        }
    }

    /// Orphans the agent's non-terminal resources, at least one and as many as the budget allows.
    fn orphan_rest(&mut self, agent: &'s Agent) {
        for (n, resource) in self.state.resources_of(agent).filter(|r| !r.state.is_terminal()).enumerate() {
            if n > 0 && self.out.over_budget() {
                self.continue_later(Work::OrphanResources {});
                return;
            }
            self.orphan_unit(resource);
        }
    }

    /// Releases the retired agent's live resources, at least one and as many as the budget allows.
    fn release_rest(&mut self, agent: &'s Agent) {
        let live = |r: &&Resource| matches!(r.state, ResourceState::Pending) || r.state.is_held();
        for (n, resource) in self.state.resources_of(agent).filter(live).enumerate() {
            if n > 0 && self.out.over_budget() {
                self.continue_later(Work::ReleaseResources {});
                return;
            }
            self.order_release(resource, ReleaseCause::AgentRetired {}, BreakReason::ResourceLeft);
        }
    }
}

/// Checks free text from a command (its length only: it is never echoed).
fn check_text(what: &str, text: &str) -> Verdict {
    if text.len() > MAX_TEXT_BYTES {
        return reject(
            RejectionKind::Invalid,
            format!("{what} is {} bytes; at most {MAX_TEXT_BYTES} bytes are kept", text.len()),
        );
    }
    Ok(())
}
