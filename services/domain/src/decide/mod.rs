//! `decide`: one command against the current partition state gives one outcome. No I/O, no clock, no randomness,
//! no configuration: the same state, context and command always give the same outcome.
//!
//! Each command type has its own function in a submodule; they share the "units" here (leave for good, order a
//! release, activate), which keep one resource's effects together so that a huge decision can stop between two
//! resources and continue in a follow-up `sys.continue`.

mod agents;
mod leases;
mod pools;
mod reports;

pub use reports::expected_listing;
mod resources;

use leasehold_schemas::codec;
use leasehold_schemas::command::{Command, Continue};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Key, ObsStamp, Position, ResourceId, Timestamp};
use leasehold_schemas::outcome::{BreakReason, CommandSummary, Decision, Effect, ReleaseCause, Work};
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{CommandClass, Envelope, Outcome, Rejection, RejectionKind};

use crate::state::{Agent, ClaimSlot, LeaseState, PartitionState, Resource, ResourceState};

/// The version of these rules. Outcomes carry it; re-deciding history is checked within one version.
pub const DECIDER_VERSION: u32 = 1;
/// The most leases one resource can take (bounds the effects of one resource leaving).
pub const MAX_CAPACITY: u32 = 1024;
/// The most pools one resource claims from.
pub const MAX_POOLS_PER_RESOURCE: usize = 8;
pub const MAX_ATTRIBUTES: usize = 64;
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 64;
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;
/// Reasons, details and native ids.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Lease holders (they are repeated in every lease effect).
pub const MAX_HOLDER_BYTES: usize = 128;
/// A bound on the effects of one unit of work: one resource's transition with all its leases (at most
/// `MAX_CAPACITY` grants of about 190 bytes each) and claims.
pub const MAX_UNIT_BYTES: usize = 200 * 1024;
const OUTCOME_OVERHEAD_BYTES: usize = 4 * 1024;
/// Past this many bytes of effects, a decision stops before its next unit and continues later, so that the last
/// unit and the rest of the work (which a report reserves room for) still fit in `codec::MAX_OUTCOME_BYTES`.
pub const EFFECT_BUDGET_BYTES: usize = codec::MAX_OUTCOME_BYTES - MAX_UNIT_BYTES - OUTCOME_OVERHEAD_BYTES;
/// The issuer of the commands the writer sends itself.
pub const WRITER_ISSUER: &str = "leasehold-writer";

/// What the log says about the command being decided: its sequence and the time the log stamped on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    pub cmd_seq: u64,
    pub log_time: Timestamp,
}

/// Decides one command. A command id already answered within the horizon gets its first outcome back (whose
/// `cmd_seq` is the first command's: `apply` then changes nothing).
pub fn decide(state: &PartitionState, ctx: &Ctx, envelope: &Envelope) -> Outcome {
    if let Some(first) = state.recent.by_id.get(&envelope.command_id) {
        return first.as_ref().clone();
    }
    let now = state.now.max(ctx.log_time);
    let mut decider = Decider { state, envelope, now, out: Effects::new(state.next_position) };
    let decision = match decider.run() {
        Ok(()) => Decision::Accepted { first_position: state.next_position, effects: decider.out.list },
        Err(rejection) => Decision::Rejected(rejection),
    };
    outcome(state, ctx, envelope, now, decision)
}

/// The recorded outcome for a command the decider could not decide (it panicked): the partition moves on and the
/// failure is on record.
pub fn internal_error_outcome(state: &PartitionState, ctx: &Ctx, envelope: &Envelope, detail: &str) -> Outcome {
    let now = state.now.max(ctx.log_time);
    let mut message = format!("the decider failed on this command: {detail}");
    message.truncate(MAX_TEXT_BYTES);
    let decision = Decision::Rejected(Rejection::new(RejectionKind::InternalError, message));
    outcome(state, ctx, envelope, now, decision)
}

fn outcome(state: &PartitionState, ctx: &Ctx, envelope: &Envelope, now: Timestamp, decision: Decision) -> Outcome {
    Outcome {
        decider_version: DECIDER_VERSION,
        partition: state.partition,
        command: CommandSummary {
            id: envelope.command_id,
            class: envelope.class,
            type_name: envelope.type_name().to_owned(),
            issuer: envelope.issuer.clone(),
            issued_at: envelope.issued_at,
            key: envelope.body.key(),
        },
        cmd_seq: ctx.cmd_seq,
        log_time: ctx.log_time,
        decided_at: now,
        decision,
    }
}

/// The commands an outcome asks its writer to send itself (`sys.continue` for each `ContinueRequested`). Their
/// ids derive from the partition and position, so a writer that re-decides after a failover sends the same ones.
pub fn follow_ups(outcome: &Outcome) -> Vec<Envelope> {
    outcome
        .positioned_effects()
        .filter(|(_, effect)| matches!(effect, Effect::ContinueRequested { .. }))
        .map(|(position, _)| {
            let mut entropy = [0u8; 10];
            entropy[..4].copy_from_slice(&outcome.partition.to_be_bytes());
            entropy[4..].copy_from_slice(&position.0.to_be_bytes()[2..]);
            let id = CommandId::from_parts(outcome.decided_at.0, entropy);
            let issuer = Issuer::new(WRITER_ISSUER).expect("the writer's issuer name is valid");
            let body = Continue { key: outcome.command.key.clone(), origin: position };
            let mut envelope = Envelope::new(id, issuer, outcome.decided_at, body);
            envelope.causation_id = Some(outcome.command.id.as_uuid());
            envelope
        })
        .collect()
}

/// Whether the outcome of a command type is kept for idempotency. Heartbeats and reports are not: they are
/// frequent, a heartbeat is idempotent by nature, and a report is ordered by its observation number (a repeated
/// one is stale).
pub(crate) fn remembered(type_name: &str) -> bool {
    !matches!(type_name, "agent.heartbeat" | "agent.sync" | "agent.resync-chunk")
}

type Verdict = Result<(), Rejection>;

fn reject<T>(kind: RejectionKind, message: impl Into<String>) -> Result<T, Rejection> {
    Err(Rejection::new(kind, message))
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
    limit: usize,
}

impl Effects {
    fn new(first: Position) -> Self {
        Effects { first, list: Vec::new(), bytes: 0, n_sized: 0, limit: EFFECT_BUDGET_BYTES }
    }

    /// Keeps `bytes` free for the rest of the work, should the decision have to continue.
    fn reserve(&mut self, bytes: usize) {
        self.limit = self.limit.saturating_sub(bytes);
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

    fn over_budget(&mut self) -> bool {
        self.bytes += self.list[self.n_sized..].iter().map(codec::encoded_len).sum::<usize>();
        self.n_sized = self.list.len();
        self.bytes >= self.limit
    }
}

struct Decider<'s> {
    state: &'s PartitionState,
    envelope: &'s Envelope,
    now: Timestamp,
    out: Effects,
}

impl<'s> Decider<'s> {
    fn run(&mut self) -> Verdict {
        let envelope = self.envelope;
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
            Command::Continue(c) => self.continue_work(c),
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
                ClaimSlot::Bound { value, token } => (Some(*value), Some(*token)),
                ClaimSlot::Returned { .. } => continue,
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

    /// A pending resource observed present: active, and its waiting leases granted first come first served.
    fn activate(&mut self, resource: &Resource, stamp: ObsStamp, native_id: Option<String>) {
        self.out.push(Effect::ResourceActivated { resource: resource.id, stamp, native_id });
        for lease in self.state.live_leases_of(resource) {
            match lease.state {
                LeaseState::Waiting { until: Some(until) } if until <= self.now => {
                    self.out.push(Effect::LeaseFailed { lease: lease.id });
                }
                LeaseState::Waiting { .. } => {
                    self.out.push(Effect::LeaseGranted {
                        lease: lease.id,
                        resource: resource.id,
                        holder: lease.holder.clone(),
                        ttl: lease.ttl,
                        expires_at: lease.ttl.map(|ttl| self.now.saturating_add(ttl)),
                    });
                }
                _ => {}
            }
        }
    }

    /// Orphans one resource of a gone agent.
    fn orphan_unit(&mut self, resource: &Resource) {
        self.leave_for_good(resource, Effect::ResourceOrphaned { resource: resource.id });
    }

    /// Stops a decision that grew past its budget: the rest continues in a `sys.continue`.
    fn continue_later(&mut self, work: Work) {
        self.out.push(Effect::ContinueRequested { work });
    }

    fn continue_work(&mut self, command: &Continue) -> Verdict {
        let Some((key, work)) = self.state.continuations.get(&command.origin) else {
            return reject(
                RejectionKind::AlreadyDone,
                format!("no work waits at {} (it was already taken up)", command.origin),
            );
        };
        if *key != command.key {
            return reject(
                RejectionKind::Invalid,
                format!("the work at {} is about {key}, not {}", command.origin, command.key),
            );
        }
        self.out.push(Effect::ContinuationTaken { origin: command.origin });
        let Key::Agent(agent_name) = key else {
            return Ok(());
        };
        let Some(agent) = self.state.agents.get(agent_name) else {
            return Ok(());
        };
        // An agent that registered again since (no longer gone, or no longer retired) keeps what is left.
        match work {
            Work::OrphanResources {} if agent.liveness == crate::state::Liveness::Gone => self.orphan_rest(agent),
            Work::ReleaseResources {} if agent.retired => self.release_rest(agent),
            Work::OrphanResources {} | Work::ReleaseResources {} => {}
            Work::Report { report, mark_losses } => self.continue_report(agent, report, *mark_losses),
            Work::Chunk { chunk, mark_losses } => self.continue_chunk(agent, chunk, *mark_losses),
        }
        Ok(())
    }

    /// Orphans the agent's non-terminal resources, as many as the budget allows.
    fn orphan_rest(&mut self, agent: &'s Agent) {
        for resource in self.state.resources_of(agent).filter(|r| !r.state.is_terminal()) {
            if self.out.over_budget() {
                self.continue_later(Work::OrphanResources {});
                return;
            }
            self.orphan_unit(resource);
        }
    }

    /// Releases the retired agent's live resources, as many as the budget allows.
    fn release_rest(&mut self, agent: &'s Agent) {
        let live = |r: &&Resource| matches!(r.state, ResourceState::Pending) || r.state.is_held();
        for resource in self.state.resources_of(agent).filter(live) {
            if self.out.over_budget() {
                self.continue_later(Work::ReleaseResources {});
                return;
            }
            self.order_release(resource, ReleaseCause::AgentRetired {}, BreakReason::ResourceLeft);
        }
    }
}

/// Checks free text from a command.
fn check_text(what: &str, text: &str) -> Verdict {
    if text.len() > MAX_TEXT_BYTES {
        return reject(
            RejectionKind::Invalid,
            format!("{what} is {} bytes; at most {MAX_TEXT_BYTES} bytes are kept", text.len()),
        );
    }
    Ok(())
}
