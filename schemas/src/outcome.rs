//! Outcomes and effects: the one message a writer appends for one command, and the facts inside it.
//!
//! An accepted outcome holds effects at consecutive positions starting at `first_position`. A rejected outcome holds
//! a reason that names the thing and why; it takes no position. Both are on record.
//!
//! A decision too large for one message is one outcome in consecutive parts (same `cmd_seq`, `part` 0, 1, 2...):
//! every part but the last ends with a `decision-continues` effect, and the writer appends the next part before it
//! decides anything else of the partition.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::command::{Place, ResyncChunk, SyncReport};
use crate::envelope::CommandClass;
use crate::ids::{
    AgentName, CommandId, Issuer, Key, LeaseId, Millis, ObsStamp, PoolName, Position, QuotaName, ResourceId,
    ResourceRef, Source, Timestamp,
};
use crate::pool::{OrphanPolicy, PoolKind, PoolValue};
use crate::settings::{AgentSettings, GcMode, PartitionSettings};

/// The one message a writer appends for one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The version of the decider that made this decision; re-deciding history is checked within ranges of one
    /// version.
    pub decider_version: u32,
    /// The partition that decided it.
    pub partition: u32,
    pub command: CommandSummary,
    /// The command's sequence in the command log: the log itself holds the writer's cursor.
    pub cmd_seq: u64,
    /// 0 for the first part of the decision; the next parts count on (see the module's documentation).
    pub part: u32,
    /// The time the log stamped on the command.
    pub log_time: Timestamp,
    /// `max(partition time, log_time)`: the time every deadline of this decision was set and checked with.
    pub decided_at: Timestamp,
    pub decision: Decision,
}

/// The command an outcome answers, for the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSummary {
    pub id: CommandId,
    pub class: CommandClass,
    pub type_name: String,
    pub issuer: Issuer,
    pub issued_at: Timestamp,
    /// The agent or pool the command was about: the outcome's subject.
    pub key: Key,
}

impl CommandSummary {
    /// The summary of `envelope`'s command.
    pub fn of(envelope: &crate::Envelope) -> Self {
        CommandSummary {
            id: envelope.command_id,
            class: envelope.class,
            type_name: envelope.type_name().to_owned(),
            issuer: envelope.issuer.clone(),
            issued_at: envelope.issued_at,
            key: envelope.body.key(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Effects at positions `first_position`, `first_position + 1`, ...
    Accepted {
        first_position: Position,
        effects: Vec<Effect>,
    },
    Rejected(Rejection),
}

impl Outcome {
    /// The effects with their positions (none for a rejection).
    pub fn positioned_effects(&self) -> impl Iterator<Item = (Position, &Effect)> {
        let (first, effects) = match &self.decision {
            Decision::Accepted { first_position, effects } => (*first_position, effects.as_slice()),
            Decision::Rejected(_) => (Position::ZERO, &[][..]),
        };
        effects.iter().enumerate().map(move |(i, effect)| (Position(first.0.saturating_add(i as u64)), effect))
    }

    pub fn rejection(&self) -> Option<&Rejection> {
        match &self.decision {
            Decision::Rejected(rejection) => Some(rejection),
            Decision::Accepted { .. } => None,
        }
    }

    pub fn effects(&self) -> &[Effect] {
        match &self.decision {
            Decision::Accepted { effects, .. } => effects,
            Decision::Rejected(_) => &[],
        }
    }

    /// The oldest schema version that expresses this outcome: 6 when it holds a quota's effect or a release over
    /// quota, 5 when it holds `placement-closed`, an effect about an
    /// orphan's identifiers (pool orphan policies, held claims, free causes), `lease-queued`,
    /// `resource-max-lease-changed` or `priority-caps-changed`, 4 when it is about a placement or holds an effect or
    /// cause added in version 4, 3 when it holds an effect added in version 3, 2 when it holds an effect, a cause or
    /// a parent state added in version 2, else 1. An outcome is written in it, so a reader of an older version reads
    /// every outcome that needs nothing newer (see `codec::encode_outcome`).
    pub fn oldest_schema_version(&self) -> u16 {
        let needs_six = |effect: &Effect| match effect {
            Effect::QuotaSet { .. } | Effect::QuotaRemoved { .. } => true,
            Effect::ResourceReleasing { cause, .. } => matches!(cause, ReleaseCause::OverQuota { .. }),
            _ => false,
        };
        if self.effects().iter().any(needs_six) {
            return 6;
        }
        let needs_five = |effect: &Effect| {
            matches!(
                effect,
                Effect::PlacementClosed { .. }
                    | Effect::PoolOrphanPolicy { .. }
                    | Effect::ClaimOrphanPolicy { .. }
                    | Effect::ClaimHeldForOrphan { .. }
                    | Effect::ClaimReleaseCause { .. }
                    | Effect::ClaimFreedBecause { .. }
                    | Effect::LeaseQueued { .. }
                    | Effect::ResourceMaxLeaseChanged { .. }
                    | Effect::PriorityCapsChanged { .. }
            )
        };
        if self.effects().iter().any(needs_five) {
            return 5;
        }
        let needs_four = |effect: &Effect| match effect {
            Effect::PlacementWanted { .. }
            | Effect::PlacementWaiting { .. }
            | Effect::PlacementBound { .. }
            | Effect::PlacementFailed { .. }
            | Effect::PlacementCancelled { .. }
            | Effect::CapacityReserved { .. }
            | Effect::ReservationEnded { .. }
            | Effect::AgentDraining { .. } => true,
            Effect::ResourceReleasing { cause, .. } => matches!(cause, ReleaseCause::Drained { .. }),
            _ => false,
        };
        if matches!(self.command.key, Key::Placement(_)) || self.effects().iter().any(needs_four) {
            return 4;
        }
        let needs_three = |effect: &Effect| {
            matches!(
                effect,
                Effect::ClaimPoolDefinition { .. }
                    | Effect::DestroyBlocked { .. }
                    | Effect::AgentCordoned { .. }
                    | Effect::AgentUncordoned { .. }
                    | Effect::AgentDeclared { .. }
            )
        };
        if self.effects().iter().any(needs_three) {
            return 3;
        }
        let needs_two = |effect: &Effect| match effect {
            Effect::GarbageDestroyOrdered { .. }
            | Effect::GarbageDryRun { .. }
            | Effect::GarbageDestroyed { .. }
            | Effect::HandleReappeared { .. }
            | Effect::AgentDriverUnavailable { .. }
            | Effect::AgentDriverAvailable {}
            | Effect::AgentUnretired { .. }
            | Effect::GcModeChanged { .. }
            | Effect::AllocationWaitsUntil { .. } => true,
            Effect::ResourceReleasing { cause, .. } => {
                matches!(cause, ReleaseCause::ParentAbsent { .. } | ReleaseCause::WaitTimeout { .. })
            }
            Effect::ChildAdopted { parent_state, .. } => *parent_state == crate::command::ParentState::Absent,
            _ => false,
        };
        if self.effects().iter().any(needs_two) { 2 } else { 1 }
    }

    /// True when the decision goes on in a next part (this part ends with `decision-continues`).
    pub fn continues(&self) -> bool {
        matches!(self.effects().last(), Some(Effect::DecisionContinues { .. }))
    }
}

/// Why a command changed nothing. `kind` is for programs; `message` names the thing and the reason for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub message: String,
}

impl Rejection {
    pub fn new(kind: RejectionKind, message: impl Into<String>) -> Self {
        Rejection { kind, message: message.into() }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RejectionKind {
    /// The resource, lease, agent or pool is not known here.
    Unknown,
    /// The thing's state forbids this transition.
    InvalidState,
    /// The resource has no spare capacity.
    AtCapacity,
    /// A time-driven command came before its deadline.
    NotYetDue,
    /// An observation not newer than the last one decided for that agent.
    StaleObservation,
    /// An observation from an epoch that is not the agent's current one.
    WrongEpoch,
    /// The command was issued longer ago than the outcome horizon.
    StaleCommand,
    /// The lease or claim token does not match.
    TokenMismatch,
    /// The class or issuer may not send this command.
    NotPermitted,
    /// The thing already exists (with another definition).
    AlreadyExists,
    /// What was asked is already done (a second release, a repeated claim).
    AlreadyDone,
    /// The command is malformed (bad names, limits, values).
    Invalid,
    /// The command's key does not belong to the partition that received it.
    WrongPartition,
    /// The decider failed on this command; it was recorded instead of wedging the partition.
    InternalError,
    /// A cross-partition command older than what the target already saw from that source.
    StaleSource,
    /// A time-driven command found nothing to do.
    NothingToDo,
}

impl fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            RejectionKind::Unknown => "unknown",
            RejectionKind::InvalidState => "invalid-state",
            RejectionKind::AtCapacity => "at-capacity",
            RejectionKind::NotYetDue => "not-yet-due",
            RejectionKind::StaleObservation => "stale-observation",
            RejectionKind::WrongEpoch => "wrong-epoch",
            RejectionKind::StaleCommand => "stale-command",
            RejectionKind::TokenMismatch => "token-mismatch",
            RejectionKind::NotPermitted => "not-permitted",
            RejectionKind::AlreadyExists => "already-exists",
            RejectionKind::AlreadyDone => "already-done",
            RejectionKind::Invalid => "invalid",
            RejectionKind::WrongPartition => "wrong-partition",
            RejectionKind::InternalError => "internal-error",
            RejectionKind::StaleSource => "stale-source",
            RejectionKind::NothingToDo => "nothing-to-do",
        };
        f.write_str(text)
    }
}

/// Why a resource is being destroyed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseCause {
    Released {
        by: Issuer,
        reason: Option<String>,
    },
    HealthCheckFailed {
        detail: String,
    },
    ParentLeft {
        parent: ResourceRef,
    },
    CreateTimeout {},
    AgentRetired {},
    // Added in schema version 2: at the end, so the discriminants above stay.
    /// Its parent's partition never knew the parent and recorded it absent.
    ParentAbsent {
        parent: ResourceRef,
    },
    /// It waited for its pools' identifiers longer than its allocation's `wait`.
    WaitTimeout {
        waited: Millis,
    },
    /// Its agent is draining (schema version 4): it was idle past the drain's grace, or the drain's deadline came
    /// (`deadline`).
    Drained {
        by: Issuer,
        deadline: bool,
    },
    /// Its principal's quota was full for its kind and its allocation gave no `wait` (schema version 6): `held` of
    /// `max` were held, among them `holders`.
    OverQuota {
        quota: QuotaName,
        kind: String,
        max: u32,
        held: u32,
        holders: Vec<ResourceRef>,
    },
}

/// Why a holder let its pool identifier go (schema version 5): recorded where it is let go (`claim-release-cause`,
/// in the holder's partition), carried by `sys.free`, and recorded with the free (`claim-freed-because`, in the
/// pool's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FreeCause {
    /// The holder ended otherwise (destroyed, lost, failed, or a grant it could not keep): what every free meant
    /// before version 5.
    Released {},
    /// The holder was orphaned (its agent declared gone) and its pool releases an orphan's identifiers.
    Orphaned {},
    /// The orphan's agent came back and confirmed it destroyed the orphan's handle, at `at` (a pool that holds).
    OrphanDestroyed { at: Timestamp },
    /// An operator freed the orphan's identifier on record (`op.free-orphan`), a pool that holds.
    OrphanFreed { by: Issuer, reason: String },
}

impl Default for FreeCause {
    fn default() -> Self {
        FreeCause::Released {}
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SuspectCause {
    Operator { by: Issuer, detail: String },
    Agent { detail: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnpauseCause {
    Operator { by: Issuer },
    PauseExpired {},
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakReason {
    /// The resource left for good (released, lost, orphaned, failed, parent gone).
    ResourceLeft,
    /// The resource failed its health check.
    HealthCheckFailed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerClear {
    /// A report showed the handles again (or losses within the limit).
    HandlesBack {},
    /// An operator confirmed the loss.
    LossConfirmed { by: Issuer },
    /// The agent registered a wiped incarnation.
    Wiped {},
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResyncReason {
    DigestMismatch { expected_count: u64, reported_count: u64 },
    LossConfirmed {},
}

/// What a decision still has to do when a part would grow past the size cap: the next part does it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Work {
    /// Orphan the remaining non-terminal resources of a `gone` agent.
    OrphanResources {},
    /// Release the remaining live resources of a retired agent.
    ReleaseResources {},
    /// The rest of a sync report; losses are marked only if `mark_losses` (the breaker's verdict on the whole).
    Report { report: SyncReport, mark_losses: bool },
    /// The rest of a resync chunk (its range narrowed to what is left).
    Chunk { chunk: ResyncChunk, mark_losses: bool },
}

/// One fact inside an outcome. Every effect has a position; the outcome's key says which agent or pool it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    // Agents. The epoch of a registration is the position of its `AgentRegistered`.
    AgentRegistered {
        incarnation: Uuid,
        wiped: bool,
        /// The agent's effective settings at its registration: its own (`own_settings`), or its partition's policy
        /// then. The agent paces its heartbeats by their `stall_after`; an agent without settings of its own
        /// follows later policy changes in the writer's decisions at once, and in its heartbeat pace at its next
        /// registration.
        settings: AgentSettings,
        own_settings: bool,
        /// The agent stays retired: it registered only to finish releasing what it still holds.
        retired: bool,
    },
    AgentSeen {
        at: Timestamp,
    },
    AgentStalled {
        last_seen: Timestamp,
    },
    AgentRecovered {},
    AgentGone {
        last_seen: Timestamp,
    },
    AgentRetired {
        by: Issuer,
    },
    /// The circuit breaker tripped: a report would have lost `would_lose` of `live` resources. Nothing was marked.
    AgentSuspect {
        would_lose: u32,
        live: u32,
    },
    AgentBreakerCleared {
        reason: BreakerClear,
    },
    /// The breaker is back in force after the report it let through (a wiped incarnation, a confirmed loss).
    AgentBreakerRearmed {},
    ResyncRequested {
        reason: ResyncReason,
    },
    /// An observation was decided: later observations must carry a higher number. Reports carry their watermark.
    ObservationAccepted {
        stamp: ObsStamp,
        watermark: Option<Position>,
    },

    // Resources.
    ResourceAllocated {
        resource: ResourceId,
        kind: String,
        capacity: u32,
        attributes: BTreeMap<String, String>,
        parent: Option<ResourceRef>,
    },
    ClaimWanted {
        resource: ResourceId,
        pool: PoolName,
    },
    ClaimBound {
        resource: ResourceId,
        pool: PoolName,
        value: PoolValue,
        token: Position,
    },
    /// The agent must create the resource. Its position is the resource's creation position.
    CreateOrdered {
        resource: ResourceId,
    },
    ResourceActivated {
        resource: ResourceId,
        stamp: ObsStamp,
        native_id: Option<String>,
    },
    /// A resource already ordered destroyed was observed present (its create finished after the release).
    ResourceSeen {
        resource: ResourceId,
        stamp: ObsStamp,
        native_id: Option<String>,
    },
    ResourcePaused {
        resource: ResourceId,
        reason: Option<String>,
        until: Option<Timestamp>,
    },
    ResourceUnpaused {
        resource: ResourceId,
        cause: UnpauseCause,
    },
    ResourceUpdated {
        resource: ResourceId,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
        capacity: Option<u32>,
    },
    ResourceSuspect {
        resource: ResourceId,
        cause: SuspectCause,
    },
    HealthCheckRequested {
        resource: ResourceId,
    },
    ResourceHealthy {
        resource: ResourceId,
    },
    UpstreamFlagged {
        resource: ResourceId,
        parent: ResourceRef,
        suspect: bool,
        source: Source,
    },
    /// The agent must destroy the resource. Its position is the resource's destruction position.
    ResourceReleasing {
        resource: ResourceId,
        cause: ReleaseCause,
    },
    ResourceDestroyed {
        resource: ResourceId,
        stamp: ObsStamp,
    },
    ResourceLost {
        resource: ResourceId,
        stamp: ObsStamp,
    },
    ResourceOrphaned {
        resource: ResourceId,
    },
    ResourceFailed {
        resource: ResourceId,
        detail: String,
    },
    /// The resource's own claim may go back to its pool (`value`/`token` `None`: the holder was still waiting).
    /// Only ever with a terminal state.
    ClaimReleasable {
        resource: ResourceId,
        pool: PoolName,
        value: Option<PoolValue>,
        token: Option<Position>,
    },
    /// A grant that is not the resource's to keep (the resource is unknown, terminal, bound already, never claimed
    /// from the pool, or the grant answers another claim) goes straight back to its pool. The partition remembers
    /// it: the same grant is never bound here later.
    GrantReturned {
        resource: ResourceId,
        pool: PoolName,
        value: PoolValue,
        token: Position,
    },
    /// The answer to a child's adoption: the parent's state as of this position (a parent unknown here and too old
    /// to be allocated any more has left).
    ChildAdopted {
        parent: ResourceId,
        child: ResourceRef,
        child_source: Source,
        parent_state: crate::command::ParentState,
    },

    // Leases. A grant's position is the lease token.
    LeaseWaiting {
        lease: LeaseId,
        resource: ResourceId,
        holder: String,
        ttl: Option<Millis>,
        wait_until: Option<Timestamp>,
    },
    LeaseGranted {
        lease: LeaseId,
        resource: ResourceId,
        holder: String,
        ttl: Option<Millis>,
        expires_at: Option<Timestamp>,
    },
    LeaseRenewed {
        lease: LeaseId,
        ttl: Option<Millis>,
        expires_at: Option<Timestamp>,
    },
    LeaseReleased {
        lease: LeaseId,
    },
    LeaseBroken {
        lease: LeaseId,
        reason: BreakReason,
    },
    LeaseExpired {
        lease: LeaseId,
    },
    LeaseFailed {
        lease: LeaseId,
    },

    // Pools. A grant's position is the claim token.
    PoolDefined {
        kind: PoolKind,
        cooldown: Millis,
    },
    ClaimGranted {
        holder: ResourceRef,
        value: PoolValue,
        source: Source,
    },
    ClaimQueued {
        holder: ResourceRef,
        source: Source,
    },
    ClaimFreed {
        holder: ResourceRef,
        value: PoolValue,
        token: Position,
    },
    ClaimWithdrawn {
        holder: ResourceRef,
    },

    // The partition and the writer.
    PartitionSettingsChanged {
        settings: PartitionSettings,
    },
    /// This part of the outcome ends here; the next part (same command, `part + 1`) does `work`.
    DecisionContinues {
        work: Work,
    },

    // Added after the first wire fixtures: at the end, so the bincode discriminants of the effects above stay.
    /// The pool's definition changed (grown, exclusions or cool-down). `recovered`: identifiers below the pool's
    /// fresh index that the new definition makes usable and nobody holds (an old /30's broadcast address when it
    /// grows to /29, an exclusion lifted): they are handed out before cooled ones.
    PoolUpdated {
        kind: PoolKind,
        cooldown: Millis,
        recovered: Vec<PoolValue>,
    },
    PoolDeleted {},

    // Added in schema version 2.
    /// A handle on the agent's machine that is no live resource is to be destroyed: the agent destroys it only now.
    GarbageDestroyOrdered {
        handle: ResourceId,
        cause: GarbageCause,
    },
    /// A dry run (`--gc dry-run` or the policy's `gc`): this handle would have been ordered destroyed (or quarantined,
    /// `cause` says); nothing is ordered.
    GarbageDryRun {
        handle: ResourceId,
        cause: GarbageCause,
    },
    /// The agent destroyed a garbage handle the log ordered destroyed.
    GarbageDestroyed {
        handle: ResourceId,
        stamp: ObsStamp,
    },
    /// A handle of a resource recorded `lost` is on the machine again (a disk mounted late, a restored backup): it is
    /// quarantined, never touched by the agent, its claims never given back to it, until a command on record (a
    /// `release` of the lost resource) orders it destroyed.
    HandleReappeared {
        resource: ResourceId,
        stamp: ObsStamp,
    },
    /// The agent's driver cannot list the machine's resources: nothing is judged from it until it can again.
    AgentDriverUnavailable {
        detail: String,
    },
    AgentDriverAvailable {},
    /// Back in service after `retire`.
    AgentUnretired {
        by: Issuer,
    },
    /// What the partition's agents do with garbage from now on.
    GcModeChanged {
        mode: GcMode,
    },
    /// The resource waits for its pools' identifiers until `until` at the latest (its allocation's `wait`).
    AllocationWaitsUntil {
        resource: ResourceId,
        until: Timestamp,
    },
    /// Right after `claim-bound` of an IPv4 pool: the pool's definition as the grant carried it, for the agent to put
    /// the address on a network of that subnet (schema version 3).
    ClaimPoolDefinition {
        resource: ResourceId,
        pool: PoolName,
        definition: PoolKind,
    },
    /// The agent could not finish destroying the resource because something else uses it (`detail` says what): it
    /// tries again, and the resource stays `releasing` meanwhile (schema version 3).
    DestroyBlocked {
        resource: ResourceId,
        detail: String,
    },
    /// No new allocations or placements on the agent, until it is uncordoned (schema version 3).
    AgentCordoned {
        by: Issuer,
        reason: Option<String>,
    },
    /// The agent takes new allocations again (schema version 3).
    AgentUncordoned {
        by: Issuer,
    },
    /// At a registration: the labels and capacity the agent declares from now on, when they differ from what it
    /// declared before (schema version 3).
    AgentDeclared {
        labels: BTreeMap<String, String>,
        capacity: BTreeMap<String, u32>,
    },
    // Added in schema version 4: placement and drain.
    /// A placement was asked for (`op.place`): it seeks an agent. `until`: how long it may wait for room, if at
    /// all.
    PlacementWanted {
        request: Place,
        until: Option<Timestamp>,
    },
    /// No agent fits now; the placement waits for room, for the reason given.
    PlacementWaiting {
        resource: ResourceId,
        why: String,
    },
    /// The placement bound the reservation `token` of `agent`, which had `used` of `capacity` of the kind with
    /// it: the resource is made there and nowhere else.
    PlacementBound {
        resource: ResourceId,
        agent: AgentName,
        token: Position,
        used: u32,
        capacity: u32,
    },
    /// The placement ended without a place, for the reason given.
    PlacementFailed {
        resource: ResourceId,
        why: String,
    },
    PlacementCancelled {
        resource: ResourceId,
        by: Issuer,
        reason: Option<String>,
    },
    /// In the agent's partition: room for the placement of `resource` (from `source`, its `placement-wanted`) is
    /// held; it counts against the agent's capacity. Its position is the reservation's token.
    CapacityReserved {
        resource: ResourceId,
        kind: String,
        source: Source,
        used: u32,
        capacity: u32,
    },
    /// The reservation `token` ended: `committed` when it became the resource, else given back.
    ReservationEnded {
        resource: ResourceId,
        token: Position,
        committed: bool,
    },
    /// The agent drains: cordoned, its idle resources released after `grace`, the rest at `deadline`.
    AgentDraining {
        by: Issuer,
        reason: Option<String>,
        deadline: Option<Timestamp>,
        grace: Millis,
    },
    /// The reservation the placement bound has ended on its agent (the commit made the resource): the placement
    /// is done and is forgotten a horizon from now (schema version 5).
    PlacementClosed {
        resource: ResourceId,
    },
    // Added in schema version 5: pools that hold an orphan's identifiers.
    /// Right after `pool-defined` or alone (an update): the pool's orphan policy from now on, when it is not the
    /// default or changes.
    PoolOrphanPolicy {
        orphans: OrphanPolicy,
    },
    /// Right after `claim-bound`: the grant came from a pool that holds an orphan's identifiers, so the claim is kept
    /// if the resource is orphaned.
    ClaimOrphanPolicy {
        resource: ResourceId,
        pool: PoolName,
        orphans: OrphanPolicy,
    },
    /// The resource was orphaned and its claim is held, not sent back: until its agent confirms the destroy of its
    /// handle (`garbage-destroyed`) or an operator frees it (`op.free-orphan`).
    ClaimHeldForOrphan {
        resource: ResourceId,
        pool: PoolName,
        value: PoolValue,
        token: Position,
    },
    /// Right after `claim-releasable`, when the cause is not the plain one the terminal state says: why the claim
    /// goes back (an orphan's destroy confirmed, an operator's free).
    ClaimReleaseCause {
        resource: ResourceId,
        pool: PoolName,
        cause: FreeCause,
    },
    /// Right after `claim-freed`, when the free carried a cause other than `released`: why the holder let it go.
    ClaimFreedBecause {
        holder: ResourceRef,
        cause: FreeCause,
    },
    /// A lease queued behind others on a busy resource (or behind the leases a pending resource will take): granted
    /// in order of effective priority (`priority` plus one per `AGING_STEP` waited), then arrival, when room
    /// allows; fails at `wait_until` (schema version 5).
    LeaseQueued {
        lease: LeaseId,
        resource: ResourceId,
        holder: String,
        ttl: Option<Millis>,
        wait_until: Option<Timestamp>,
        priority: u8,
    },
    /// The longest a lease of the resource may be held while others wait changed (`None`: no limit) (schema
    /// version 5).
    ResourceMaxLeaseChanged {
        resource: ResourceId,
        max_lease: Option<Millis>,
    },
    /// The partition's lease priority caps, by issuer prefix, were replaced (schema version 5).
    PriorityCapsChanged {
        max_priority: BTreeMap<String, u8>,
    },
    /// A quota was set or changed in this partition (schema version 6): allocations by `principals` of a kind in
    /// `max` claim a slot of the quota's pool of that kind.
    QuotaSet {
        quota: QuotaName,
        max: BTreeMap<String, u32>,
        principals: Vec<Issuer>,
    },
    /// A quota was removed from this partition (schema version 6): what its principals hold keeps its slots until
    /// it ends; new allocations claim none.
    QuotaRemoved {
        quota: QuotaName,
    },
}

/// Why a garbage handle is destroyed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GarbageCause {
    /// No resource of this agent with that id is known: never allocated, or forgotten after the outcome horizon.
    Unknown {},
    /// Its resource was confirmed destroyed (the handle came back, or its destroy did not finish).
    Destroyed {},
    /// Its resource was orphaned while its agent was gone: its identifiers may have been granted again.
    Orphaned {},
    /// Its resource failed to be created: what is left of the attempt.
    Failed {},
    /// A quarantined handle of a `lost` resource, released by an operator.
    Released { by: Issuer, reason: Option<String> },
}

impl Effect {
    /// The effect as `name {its fields}`: its JSON form without the outer object (`lease-released
    /// {"lease":"..."}`, or the bare name for an effect without fields). Exact, not made safe to show: what the
    /// command lines print as JSON and what a timeline's rows carry (the gateway's and `leasehold-replay`'s alike).
    pub fn as_text(&self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) if map.len() == 1 => {
                let (name, fields) = map.into_iter().next().expect("one entry");
                match fields {
                    serde_json::Value::Object(inner) if inner.is_empty() => name,
                    fields => format!("{name} {fields}"),
                }
            }
            Ok(other) => other.to_string(),
            Err(e) => format!("{} (unprintable: {e})", self.name()),
        }
    }

    /// A short stable name for logs and timelines.
    pub fn name(&self) -> &'static str {
        match self {
            Effect::AgentRegistered { .. } => "agent-registered",
            Effect::AgentSeen { .. } => "agent-seen",
            Effect::AgentStalled { .. } => "agent-stalled",
            Effect::AgentRecovered {} => "agent-recovered",
            Effect::AgentGone { .. } => "agent-gone",
            Effect::AgentRetired { .. } => "agent-retired",
            Effect::AgentSuspect { .. } => "agent-suspect",
            Effect::AgentBreakerCleared { .. } => "agent-breaker-cleared",
            Effect::AgentBreakerRearmed {} => "agent-breaker-rearmed",
            Effect::ResyncRequested { .. } => "resync-requested",
            Effect::ObservationAccepted { .. } => "observation-accepted",
            Effect::ResourceAllocated { .. } => "resource-allocated",
            Effect::ClaimWanted { .. } => "claim-wanted",
            Effect::ClaimBound { .. } => "claim-bound",
            Effect::CreateOrdered { .. } => "create-ordered",
            Effect::ResourceActivated { .. } => "resource-activated",
            Effect::ResourceSeen { .. } => "resource-seen",
            Effect::ResourcePaused { .. } => "resource-paused",
            Effect::ResourceUnpaused { .. } => "resource-unpaused",
            Effect::ResourceUpdated { .. } => "resource-updated",
            Effect::ResourceSuspect { .. } => "resource-suspect",
            Effect::HealthCheckRequested { .. } => "health-check-requested",
            Effect::ResourceHealthy { .. } => "resource-healthy",
            Effect::UpstreamFlagged { .. } => "upstream-flagged",
            Effect::ResourceReleasing { .. } => "resource-releasing",
            Effect::ResourceDestroyed { .. } => "resource-destroyed",
            Effect::ResourceLost { .. } => "resource-lost",
            Effect::ResourceOrphaned { .. } => "resource-orphaned",
            Effect::ResourceFailed { .. } => "resource-failed",
            Effect::ClaimReleasable { .. } => "claim-releasable",
            Effect::GrantReturned { .. } => "grant-returned",
            Effect::ChildAdopted { .. } => "child-adopted",
            Effect::LeaseWaiting { .. } => "lease-waiting",
            Effect::LeaseGranted { .. } => "lease-granted",
            Effect::LeaseRenewed { .. } => "lease-renewed",
            Effect::LeaseReleased { .. } => "lease-released",
            Effect::LeaseBroken { .. } => "lease-broken",
            Effect::LeaseExpired { .. } => "lease-expired",
            Effect::LeaseFailed { .. } => "lease-failed",
            Effect::PoolDefined { .. } => "pool-defined",
            Effect::PoolUpdated { .. } => "pool-updated",
            Effect::PoolDeleted {} => "pool-deleted",
            Effect::ClaimGranted { .. } => "claim-granted",
            Effect::ClaimQueued { .. } => "claim-queued",
            Effect::ClaimFreed { .. } => "claim-freed",
            Effect::ClaimWithdrawn { .. } => "claim-withdrawn",
            Effect::PartitionSettingsChanged { .. } => "partition-settings-changed",
            Effect::DecisionContinues { .. } => "decision-continues",
            Effect::GarbageDestroyOrdered { .. } => "garbage-destroy-ordered",
            Effect::GarbageDryRun { .. } => "garbage-dry-run",
            Effect::GarbageDestroyed { .. } => "garbage-destroyed",
            Effect::HandleReappeared { .. } => "handle-reappeared",
            Effect::AgentDriverUnavailable { .. } => "agent-driver-unavailable",
            Effect::AgentDriverAvailable {} => "agent-driver-available",
            Effect::AgentUnretired { .. } => "agent-unretired",
            Effect::GcModeChanged { .. } => "gc-mode-changed",
            Effect::AllocationWaitsUntil { .. } => "allocation-waits-until",
            Effect::ClaimPoolDefinition { .. } => "claim-pool-definition",
            Effect::DestroyBlocked { .. } => "destroy-blocked",
            Effect::AgentCordoned { .. } => "agent-cordoned",
            Effect::AgentUncordoned { .. } => "agent-uncordoned",
            Effect::AgentDeclared { .. } => "agent-declared",
            Effect::PlacementWanted { .. } => "placement-wanted",
            Effect::PlacementWaiting { .. } => "placement-waiting",
            Effect::PlacementBound { .. } => "placement-bound",
            Effect::PlacementFailed { .. } => "placement-failed",
            Effect::PlacementCancelled { .. } => "placement-cancelled",
            Effect::CapacityReserved { .. } => "capacity-reserved",
            Effect::ReservationEnded { .. } => "reservation-ended",
            Effect::AgentDraining { .. } => "agent-draining",
            Effect::PlacementClosed { .. } => "placement-closed",
            Effect::PoolOrphanPolicy { .. } => "pool-orphan-policy",
            Effect::ClaimOrphanPolicy { .. } => "claim-orphan-policy",
            Effect::ClaimHeldForOrphan { .. } => "claim-held-for-orphan",
            Effect::ClaimReleaseCause { .. } => "claim-release-cause",
            Effect::ClaimFreedBecause { .. } => "claim-freed-because",
            Effect::LeaseQueued { .. } => "lease-queued",
            Effect::ResourceMaxLeaseChanged { .. } => "resource-max-lease-changed",
            Effect::PriorityCapsChanged { .. } => "priority-caps-changed",
            Effect::QuotaSet { .. } => "quota-set",
            Effect::QuotaRemoved { .. } => "quota-removed",
        }
    }
}
