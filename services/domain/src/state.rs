//! Partition state: the agents, resources, leases and pools whose keys hash to one partition, folded from outcomes.
//!
//! State is only ever changed by [`crate::apply`]. It is deliberately not `Serialize`: the log of outcomes is the
//! durable form, and state is what folding it gives.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use leasehold_schemas::Uuid;
use leasehold_schemas::command::{HandleDigest, quota_kind_of};
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, LeaseId, Millis, ObsStamp, PoolName, Position, QuotaName, ResourceId, ResourceRef,
    Source, Timestamp,
};
use leasehold_schemas::outcome::{BreakReason, CommandSummary, FreeCause, ReleaseCause, SuspectCause, Work};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind, PoolValue};
use leasehold_schemas::settings::{AgentSettings, ClusterPolicy, GcMode, PartitionSettings};

/// Everything one partition's writer knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    pub(crate) partition: u32,
    pub(crate) partitions: u32,
    pub(crate) now: Timestamp,
    /// The command sequence and part of the last outcome applied.
    pub(crate) cursor: u64,
    pub(crate) cursor_part: u32,
    pub(crate) next_position: Position,
    pub(crate) settings: PartitionSettings,
    pub(crate) agents: BTreeMap<AgentName, Agent>,
    pub(crate) resources: BTreeMap<ResourceId, Resource>,
    pub(crate) leases: BTreeMap<LeaseId, Lease>,
    pub(crate) pools: BTreeMap<PoolName, Pool>,
    /// Placements whose key falls in this partition, by their resource id, until forgotten after they end.
    pub(crate) placements: BTreeMap<ResourceId, Placement>,
    /// Resource ids this partition answered "absent" for (a child's adoption asked about a parent it never knew):
    /// an allocation of one is refused, so the answer stays true. Kept until the id could no longer be allocated.
    pub(crate) absent: BTreeSet<ResourceId>,
    /// What agents of this partition do with garbage.
    pub(crate) gc_mode: GcMode,
    /// The highest lease priority an issuer may ask for, by issuer prefix (`op.set-partition-settings`
    /// `max_priority`); an issuer no prefix matches may ask for 0 only.
    pub(crate) priority_caps: BTreeMap<String, u8>,
    /// The quotas recorded in this partition (`op.set-quota`), by name.
    pub(crate) quotas: BTreeMap<QuotaName, Quota>,
    pub(crate) recent: RecentCommands,
    /// A decision whose last part so far ends with `decision-continues`: its next part comes before anything else.
    pub(crate) pending: Option<PendingDecision>,
    /// Grants this partition sent straight back (`grant-returned`): never bound here later. Kept while the
    /// resource is in state, or until its id can no longer be allocated.
    pub(crate) returned_grants: BTreeSet<(ResourceRef, PoolName, Position)>,
    /// Terminal records, released pool holders and returned grants of unknown resources, by the log time from which
    /// the horizon counts for each.
    pub(crate) forget: BTreeSet<(Timestamp, Forget)>,
    /// The latest "since" of anything forgotten (a command id, a terminal resource or lease...): ids stamped at or
    /// before it may have been forgotten, so they are refused rather than decided or allocated a second time, even
    /// after the horizon grows.
    pub(crate) forgotten_up_to: Timestamp,
    /// Bytes of effects after which decisions that can continue stop and continue in the next part. Not a decision
    /// setting: where parts split changes nothing in the effects. Tests make it small to split often.
    pub(crate) split_budget: usize,
}

/// A quota as this partition records it: the most resources of each kind its principals may hold at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    pub max: BTreeMap<String, u32>,
    pub principals: Vec<Issuer>,
}

/// Something to drop from state once the horizon has passed since its time. Each names the record it was made for:
/// a resource or lease id is never used twice, and a released holder's record or a returned grant is named by
/// position, so a newer record under the same name is never erased by an older entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Forget {
    /// A terminal resource, with the position that made it terminal (its entry in `Agent::left_by_position`).
    Resource(ResourceId, Position),
    Lease(LeaseId),
    /// The record of a released holder, named by the position that ended its claim.
    PoolHolder(PoolName, ResourceRef, Position),
    ReturnedGrant(ResourceRef, PoolName, Position),
    /// An id recorded absent (see `PartitionState::absent`).
    Absent(ResourceId),
    /// A placement that ended (bound, failed or cancelled).
    Placement(ResourceId),
}

/// Command ids decided within the horizon, with the command sequence that decided them: a retry is answered
/// "already decided at N" (its outcome is in the log and the projection), and nothing is appended.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct RecentCommands {
    pub(crate) by_id: BTreeMap<CommandId, u64>,
    /// By the time the horizon counts from for each: the latest of its decision, its issuer time and its id's
    /// time, so that a retry is answered from memory for as long as it is not stale.
    pub(crate) order: BTreeSet<(Timestamp, CommandId)>,
}

/// A decision not finished yet: its last part so far, and the work the next part does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDecision {
    pub cmd_seq: u64,
    /// The last part applied.
    pub part: u32,
    pub log_time: Timestamp,
    pub command: CommandSummary,
    pub work: Work,
}

impl PendingDecision {
    pub fn next_part(&self) -> u32 {
        self.part + 1
    }
}

impl PartitionState {
    /// The empty state of partition `partition` of `partitions`.
    pub fn new(partition: u32, partitions: u32) -> Self {
        assert!(partitions > 0 && partition < partitions, "partition {partition} of {partitions} does not exist");
        PartitionState {
            partition,
            partitions,
            now: Timestamp(0),
            cursor: 0,
            cursor_part: 0,
            next_position: Position(1),
            settings: PartitionSettings::default(),
            agents: BTreeMap::new(),
            resources: BTreeMap::new(),
            leases: BTreeMap::new(),
            pools: BTreeMap::new(),
            placements: BTreeMap::new(),
            absent: BTreeSet::new(),
            gc_mode: GcMode::Destroy,
            priority_caps: BTreeMap::new(),
            quotas: BTreeMap::new(),
            recent: RecentCommands::default(),
            pending: None,
            returned_grants: BTreeSet::new(),
            forget: BTreeSet::new(),
            forgotten_up_to: Timestamp(0),
            split_budget: crate::decide::EFFECT_BUDGET_BYTES,
        }
    }

    /// The same empty state, whose long decisions split into parts after `bytes` of effects (at least one unit of
    /// work per part). For tests and simulations: the effects of a decision are the same whatever the split.
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.split_budget = bytes.min(crate::decide::EFFECT_BUDGET_BYTES);
        self
    }

    /// The state as a snapshot: a cache of the fold, valid only for this build's `DECIDER_VERSION` (the worker
    /// records that beside it and ignores a snapshot of any other version).
    pub fn to_snapshot(&self) -> Result<Vec<u8>, leasehold_schemas::codec::CodecError> {
        leasehold_schemas::codec::encode_snapshot(self)
    }

    /// A state from [`PartitionState::to_snapshot`], splitting long decisions after `split_budget` bytes (not part of
    /// the snapshot's meaning: where decisions split changes nothing in their effects).
    pub fn from_snapshot(bytes: &[u8]) -> Result<Self, leasehold_schemas::codec::CodecError> {
        leasehold_schemas::codec::decode_snapshot(bytes)
    }

    pub fn split_budget(&self) -> usize {
        self.split_budget
    }

    pub fn partition(&self) -> u32 {
        self.partition
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Partition time: the latest log time decided so far.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The command log sequence of the last outcome applied.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The part of the last outcome applied (0 for the first part of a decision).
    pub fn cursor_part(&self) -> u32 {
        self.cursor_part
    }

    /// The decision whose next part must be appended before anything else is decided.
    pub fn pending(&self) -> Option<&PendingDecision> {
        self.pending.as_ref()
    }

    /// Ids stamped at or before this time may have been forgotten: they are refused.
    pub fn forgotten_up_to(&self) -> Timestamp {
        self.forgotten_up_to
    }

    /// The position the next effect will get.
    pub fn next_position(&self) -> Position {
        self.next_position
    }

    /// The position of the last effect (0 before the first).
    pub fn last_position(&self) -> Position {
        Position(self.next_position.0 - 1)
    }

    pub fn settings(&self) -> &PartitionSettings {
        &self.settings
    }

    /// The policy this partition follows: the recorded one, or the default while none was ever recorded.
    pub fn policy(&self) -> &ClusterPolicy {
        self.settings.policy()
    }

    /// An agent's effective settings: its own if it registered with them, else the partition's current policy (so
    /// changing the policy changes every agent that follows it). Every decision about an agent reads these.
    pub fn settings_of<'a>(&'a self, agent: &'a Agent) -> &'a AgentSettings {
        agent.settings.as_ref().unwrap_or(&self.policy().agent)
    }

    pub fn agent(&self, name: &AgentName) -> Option<&Agent> {
        self.agents.get(name)
    }

    /// The lease priority caps by issuer prefix.
    pub fn priority_caps(&self) -> &BTreeMap<String, u8> {
        &self.priority_caps
    }

    /// The quotas recorded here, by name.
    pub fn quotas(&self) -> &BTreeMap<QuotaName, Quota> {
        &self.quotas
    }

    /// The quota whose principals name `issuer` (a principal is in one quota at most), with its name.
    pub fn quota_of(&self, issuer: &Issuer) -> Option<(&QuotaName, &Quota)> {
        self.quotas.iter().find(|(_, quota)| quota.principals.contains(issuer))
    }

    /// The quota and kind that `pool` counts, if it is one of the pools of a quota recorded here.
    pub fn quota_counted_by(&self, pool: &PoolName) -> Option<(&QuotaName, &str, u32)> {
        self.quotas.iter().find_map(|(name, quota)| {
            let (kind, max) = quota.max.get_key_value(quota_kind_of(pool, name)?)?;
            Some((name, kind.as_str(), *max))
        })
    }

    /// The highest lease priority `issuer` may ask for: the cap of the longest prefix that matches it, else 0.
    pub fn priority_cap_of(&self, issuer: &str) -> (u8, Option<&str>) {
        self.priority_caps
            .iter()
            .filter(|(prefix, _)| issuer.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or((0, None), |(prefix, cap)| (*cap, Some(prefix.as_str())))
    }

    /// The waiting leases of a resource in the order they would be granted now (see [`queue_order`]).
    pub fn queue_of<'a>(&'a self, resource: &'a Resource) -> Vec<&'a Lease> {
        queue_order(self.live_leases_of(resource).filter(|l| matches!(l.state, LeaseState::Waiting { .. })), self.now)
    }

    pub fn agents(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    pub fn resource(&self, id: ResourceId) -> Option<&Resource> {
        self.resources.get(&id)
    }

    pub fn resources(&self) -> impl Iterator<Item = &Resource> {
        self.resources.values()
    }

    pub fn lease(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    pub fn pool(&self, name: &PoolName) -> Option<&Pool> {
        self.pools.get(name)
    }

    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.values()
    }

    pub fn placement(&self, id: ResourceId) -> Option<&Placement> {
        self.placements.get(&id)
    }

    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.placements.values()
    }

    /// What the partition's agents do with garbage.
    pub fn gc_mode(&self) -> GcMode {
        self.gc_mode
    }

    /// True when this partition answered a child's adoption that resource id `id` is absent: it is never allocated.
    pub fn is_absent(&self, id: ResourceId) -> bool {
        self.absent.contains(&id)
    }

    /// The agent of this partition that holds room for a placement of resource id `id`, and the room: its commit
    /// would make a resource of that id here.
    pub fn reserved(&self, id: ResourceId) -> Option<(&AgentName, &Reservation)> {
        self.agents.values().find_map(|a| a.reservations.get(&id).map(|r| (&a.name, r)))
    }

    /// Why `agent` (of this partition) can take no placement of resource id `id`, if it cannot: the one rule the
    /// partition decides a reservation by and the sweeper chooses candidates by.
    pub fn id_taken(&self, agent: &Agent, id: ResourceId) -> Option<IdTaken<'_>> {
        if let Some(existing) = self.resources.get(&id) {
            return Some(IdTaken::Exists(existing));
        }
        if self.absent.contains(&id) {
            return Some(IdTaken::Absent);
        }
        if agent.lost_ids.contains(&id) || agent.garbage_order_of(id).is_some() {
            return Some(IdTaken::UsedBefore);
        }
        // A record of that id may have been here and been forgotten (this partition's horizon can be shorter than
        // the placement's): as an allocation of it would be, it is refused rather than made a second time.
        (id.time() <= self.forgotten_up_to).then_some(IdTaken::MaybeForgotten)
    }

    /// The command sequence that decided a command id, while it is remembered (within the horizon).
    pub fn decided_at_seq(&self, id: CommandId) -> Option<u64> {
        self.recent.by_id.get(&id).copied()
    }

    /// How many command ids are remembered for idempotency.
    pub fn n_recent_commands(&self) -> usize {
        self.recent.by_id.len()
    }

    /// True when this grant was sent straight back by this partition: it is never bound here.
    pub fn grant_returned(&self, holder: &ResourceRef, pool: &PoolName, token: Position) -> bool {
        self.returned_grants.contains(&(holder.clone(), pool.clone(), token))
    }

    /// The resources of an agent, in id order.
    pub fn resources_of<'a>(&'a self, agent: &'a Agent) -> impl Iterator<Item = &'a Resource> + 'a {
        agent.resources.iter().filter_map(|id| self.resources.get(id))
    }

    /// The live (waiting or active) leases of a resource.
    pub fn live_leases_of<'a>(&'a self, resource: &'a Resource) -> impl Iterator<Item = &'a Lease> + 'a {
        resource.live_leases.values().filter_map(|id| self.leases.get(id))
    }
}

// -----------------------------------------------------------------------------------------------------------------
// Agents

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Liveness {
    Live,
    /// No heartbeat for `stall_after`: no new placements.
    Stalled,
    /// No heartbeat for `orphan_after`: its resources are orphaned; it must register again.
    Gone,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    pub name: AgentName,
    pub liveness: Liveness,
    /// Retired by an operator: no new placements; what it holds is released.
    pub retired: bool,
    /// `Some` while the circuit breaker holds: the agent is `suspect`.
    pub breaker: Option<Breaker>,
    /// The position of the current incarnation's registration.
    pub epoch: Position,
    pub incarnation: Uuid,
    pub wiped: bool,
    /// The settings it registered with; `None`: it follows the partition's policy
    /// ([`PartitionState::settings_of`] gives the effective ones).
    pub settings: Option<AgentSettings>,
    /// The last heartbeat recorded (coalesced: at most every `stall_after / 3`).
    pub last_seen: Timestamp,
    /// The last observation decided.
    pub last_obs: ObsStamp,
    /// The watermark of the last report or chunk decided.
    pub last_watermark: Position,
    /// The next sync report (and the resync chunks before it) mark losses without the breaker: set by a wiped
    /// registration or a confirmed loss, cleared by `AgentBreakerRearmed`.
    pub breaker_bypass: bool,
    /// The report that used the last bypass: its losses (some may be marked by later parts after the breaker
    /// is armed again) do not count against the breaker's window.
    pub bypass_spent_on: Option<ObsStamp>,
    /// Log times of the losses marked recently under the breaker (for its window).
    pub recent_losses: VecDeque<Timestamp>,
    /// Every resource of the agent still in state, in id order.
    pub resources: BTreeSet<ResourceId>,
    /// Releasing resources by the position that ordered their destruction.
    pub releasing: BTreeMap<Position, ResourceId>,
    /// What the writer believes the agent holds: `active`, `paused` and `suspect` resources, with their count and
    /// digest, and by creation position (to leave out what a report's watermark could not know of).
    pub n_held: u64,
    pub held_digest: HandleDigest,
    pub held_by_creation: BTreeMap<Position, ResourceId>,
    /// `Some(why)` while the agent's driver cannot list the machine's resources.
    pub driver_unavailable: Option<String>,
    /// When it was declared gone (its resources orphaned then), while it is gone.
    pub gone_at: Option<Timestamp>,
    /// Handles of `lost` resources that reappeared on the machine, by the position that quarantined them: untouched
    /// until a command on record orders them destroyed.
    pub quarantined: BTreeMap<ResourceId, Position>,
    /// Resources of this agent recorded `lost` whose records were forgotten after the horizon: a handle of one that
    /// reappears is still quarantined, never taken for garbage.
    pub lost_ids: BTreeSet<ResourceId>,
    /// Garbage handles ordered destroyed, with the position of the order, not yet reported destroyed.
    pub garbage_orders: BTreeMap<ResourceId, Position>,
    /// Its resources that reached a terminal state, by that position, while their records are in state: a report
    /// whose watermark is before one comes from a view in which it was still there.
    pub left_by_position: BTreeMap<Position, ResourceId>,
    /// `Some` while an operator has cordoned it: no new allocations on it; what it holds goes on.
    pub cordon: Option<Cordon>,
    /// `Some` while it drains (it is cordoned too): its resources are released as they fall idle, the rest at the
    /// deadline. Ended by `uncordon`, with the cordon.
    pub drain: Option<Drain>,
    /// What it declared at its last registration that declared anything (`agent-declared`): labels for placement,
    /// and how many resources of each kind it takes.
    pub labels: BTreeMap<String, String>,
    pub capacity: BTreeMap<String, u32>,
    /// Its resources from pending to releasing, by kind: what its capacity counts, with its reservations.
    pub by_kind: BTreeMap<Box<str>, u32>,
    /// Room held for placements (`capacity-reserved`), by resource id, until committed or cancelled.
    pub reservations: BTreeMap<ResourceId, Reservation>,
}

impl Agent {
    /// What its capacity for `kind` counts now: its resources from pending to releasing, and its reservations.
    pub fn used(&self, kind: &str) -> u32 {
        let reserved = self.reservations.values().filter(|r| &*r.kind == kind).count();
        self.by_kind.get(kind).copied().unwrap_or(0) + u32::try_from(reserved).unwrap_or(u32::MAX)
    }

    /// Why it takes no new allocation or placement now, if it takes none.
    pub fn unschedulable(&self) -> Option<Unschedulable<'_>> {
        Some(match (self.liveness, self.retired, self.breaker.is_some()) {
            (Liveness::Gone, _, _) => Unschedulable::Gone,
            (_, true, _) => Unschedulable::Retired,
            (Liveness::Stalled, _, _) => Unschedulable::Stalled,
            (_, _, true) => Unschedulable::Suspect,
            (Liveness::Live, false, false) => {
                if let Some(why) = &self.driver_unavailable {
                    Unschedulable::DriverUnavailable(why)
                } else if let Some(drain) = &self.drain {
                    Unschedulable::Draining(drain)
                } else {
                    Unschedulable::Cordoned(self.cordon.as_ref()?)
                }
            }
        })
    }

    /// True when every label of `select` is one of its labels, with the same value.
    pub fn matches(&self, select: &BTreeMap<String, String>) -> bool {
        select.iter().all(|(key, value)| self.labels.get(key) == Some(value))
    }
}

/// Why an agent takes no new allocation or placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unschedulable<'a> {
    Gone,
    Retired,
    Stalled,
    Suspect,
    DriverUnavailable(&'a str),
    Draining(&'a Drain),
    Cordoned(&'a Cordon),
}

impl Unschedulable<'_> {
    /// One word for counting agents by it: `gone`, `retired`, `stalled`, `suspect`, `driver-unavailable`,
    /// `draining`, `cordoned`.
    pub fn word(&self) -> &'static str {
        match self {
            Unschedulable::Gone => "gone",
            Unschedulable::Retired => "retired",
            Unschedulable::Stalled => "stalled",
            Unschedulable::Suspect => "suspect",
            Unschedulable::DriverUnavailable(_) => "driver-unavailable",
            Unschedulable::Draining(_) => "draining",
            Unschedulable::Cordoned(_) => "cordoned",
        }
    }
}

/// What follows "agent w1 is": "stalled (no recent heartbeat)", "cordoned (by op:alice since T: kernel)".
impl fmt::Display for Unschedulable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unschedulable::Gone => f.write_str("gone"),
            Unschedulable::Retired => f.write_str("retired"),
            Unschedulable::Stalled => f.write_str("stalled (no recent heartbeat)"),
            Unschedulable::Suspect => f.write_str("suspect (its circuit breaker tripped)"),
            Unschedulable::DriverUnavailable(why) => {
                write!(f, "unable to list its machine: its driver is unavailable ({why})")
            }
            Unschedulable::Draining(drain) => write!(f, "draining ({drain})"),
            Unschedulable::Cordoned(cordon) => write!(f, "cordoned ({cordon})"),
        }
    }
}

/// "by op:alice since T: kernel upgrade".
impl fmt::Display for Cordon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "by {} since {}", self.by, self.since)?;
        match &self.reason {
            Some(reason) => write!(f, ": {reason}"),
            None => Ok(()),
        }
    }
}

/// "by op:alice since T, grace 5min, deadline T: kernel upgrade".
impl fmt::Display for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "by {} since {}, grace {}", self.by, self.since, self.grace)?;
        if let Some(deadline) = self.deadline {
            write!(f, ", deadline {deadline}")?;
        }
        match &self.reason {
            Some(reason) => write!(f, ": {reason}"),
            None => Ok(()),
        }
    }
}

/// Room an agent holds for a placement: counted against its capacity until the placement commits it (it becomes
/// the resource) or it is cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub kind: Box<str>,
    /// The position of its `capacity-reserved`.
    pub token: Position,
    /// The placement's `placement-wanted`.
    pub source: leasehold_schemas::Source,
    /// The agent's use of the kind with this reservation, and its capacity for the kind, when it was made.
    pub used: u32,
    pub capacity: u32,
}

/// An allocation that named no agent: it seeks one, binds one reservation, and ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub request: leasehold_schemas::command::Place,
    /// Who asked (the issuer of its `op.place`): the commit names it, so its quota counts the resource.
    pub issuer: Issuer,
    /// The position of its `placement-wanted`: the source of its reservations.
    pub wanted_at: Position,
    pub at: Timestamp,
    /// How long it may wait for room.
    pub until: Option<Timestamp>,
    pub state: PlacementState,
}

impl Placement {
    pub fn id(&self) -> ResourceId {
        self.request.resource
    }

    /// True while it seeks an agent (not bound, failed or cancelled).
    pub fn is_open(&self) -> bool {
        matches!(self.state, PlacementState::Seeking | PlacementState::Waiting { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementState {
    Seeking,
    /// No agent fits; it waits for room.
    Waiting {
        why: String,
        since: Timestamp,
    },
    /// Placed on `agent`'s reservation `token`. Kept until `closed` (its commit is on record in the agent's
    /// partition), then forgotten a horizon later: a commit that is late, however late, still finds it.
    Bound {
        agent: AgentName,
        token: Position,
        used: u32,
        capacity: u32,
        at: Timestamp,
        closed: bool,
    },
    Failed {
        why: String,
        at: Timestamp,
    },
    Cancelled {
        by: leasehold_schemas::Issuer,
        reason: Option<String>,
        at: Timestamp,
    },
}

/// Why a partition takes no placement of a resource id (see [`PartitionState::id_taken`]).
#[derive(Debug)]
pub enum IdTaken<'a> {
    /// A resource of that id is on record here.
    Exists(&'a Resource),
    /// A child's adoption asked for it as its parent, and was answered "absent": it is never allocated.
    Absent,
    /// It was this agent's, lost or a garbage handle.
    UsedBefore,
    /// It is no newer than what this partition has forgotten: it may have been used here before.
    MaybeForgotten,
}

/// Who cordoned an agent, why and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cordon {
    pub by: leasehold_schemas::Issuer,
    pub reason: Option<String>,
    pub since: Timestamp,
}

/// An agent's drain: who asked for it, why, since when, and how its resources are released — each once it has held no
/// lease for `grace` (counted from the later of `since` and the resource's `idle_since`), and all at `deadline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub by: leasehold_schemas::Issuer,
    pub reason: Option<String>,
    /// When the drain began. A drain asked for again with other settings keeps it.
    pub since: Timestamp,
    pub deadline: Option<Timestamp>,
    pub grace: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    pub tripped_at: Timestamp,
    /// The report that tripped it would have lost `would_lose` of the agent's `live` resources.
    pub would_lose: u32,
    pub live: u32,
    /// The watermark of the report that tripped it: only a sync report at or past it can clear it (one that knows
    /// less judges nothing, and so would see nothing missing).
    pub watermark: Position,
}

impl Agent {
    /// True while the breaker holds.
    pub fn is_suspect(&self) -> bool {
        self.breaker.is_some()
    }

    /// Losses marked within the breaker window (`loss_window`, from the agent's effective settings) ending at
    /// `now`.
    pub fn losses_in_window(&self, loss_window: Millis, now: Timestamp) -> u32 {
        let since = now.saturating_sub(loss_window);
        self.recent_losses.iter().filter(|t| **t > since).count() as u32
    }

    /// True when `id` is this agent's resource recorded lost (in state or forgotten since).
    pub fn lost_id_known(&self, state: &PartitionState, id: ResourceId) -> bool {
        self.lost_ids.contains(&id)
            || state.resource(id).is_some_and(|r| r.agent == self.name && matches!(r.state, ResourceState::Lost { .. }))
    }

    /// The position of the garbage order still pending for `handle`, if any.
    pub fn garbage_order_of(&self, handle: ResourceId) -> Option<Position> {
        self.garbage_orders.get(&handle).copied()
    }

    /// The status a person would read: `live`, `stalled`, `gone`, `suspect`, `retired`.
    pub fn status(&self) -> &'static str {
        match (self.liveness, self.retired, self.breaker.is_some()) {
            (Liveness::Gone, _, _) => "gone",
            (_, true, _) => "retired",
            (_, _, true) => "suspect",
            (Liveness::Stalled, _, _) => "stalled",
            (Liveness::Live, _, _) => "live",
        }
    }
}

// -----------------------------------------------------------------------------------------------------------------
// Resources

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResourceState {
    Pending,
    Active,
    Paused {
        reason: Option<String>,
        until: Option<Timestamp>,
    },
    /// A failure was reported; `paused` keeps a pause it interrupted, restored when the health check passes.
    /// (Boxed, as the release cause: a resource record stays small, and 100,000 of them are held in memory.)
    Suspect {
        cause: Box<SuspectCause>,
        paused: Option<Box<PauseInfo>>,
        /// The last `health-check-requested` since the resource turned suspect (a new failure resets it): a health
        /// result must answer exactly that check, so one asked for before the latest failure is refused.
        asked: Option<Position>,
    },
    Releasing {
        cause: Box<ReleaseCause>,
    },
    /// Confirmed destroyed by its agent; `cause` is the release it answered.
    Destroyed {
        cause: Option<Box<ReleaseCause>>,
    },
    /// Found missing by the agent's observation `stamp`.
    Lost {
        stamp: ObsStamp,
    },
    /// Its agent was declared gone at `gone_at` (and stayed gone past `orphan_after`): nobody can confirm anything.
    Orphaned {
        gone_at: Option<Timestamp>,
    },
    Failed {
        detail: String,
    },
}

impl ResourceState {
    pub fn name(&self) -> &'static str {
        match self {
            ResourceState::Pending => "pending",
            ResourceState::Active => "active",
            ResourceState::Paused { .. } => "paused",
            ResourceState::Suspect { .. } => "suspect",
            ResourceState::Releasing { .. } => "releasing",
            ResourceState::Destroyed { .. } => "destroyed",
            ResourceState::Lost { .. } => "lost",
            ResourceState::Orphaned { .. } => "orphaned",
            ResourceState::Failed { .. } => "failed",
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ResourceState::Destroyed { .. }
                | ResourceState::Lost { .. }
                | ResourceState::Orphaned { .. }
                | ResourceState::Failed { .. }
        )
    }

    /// `active`, `paused` or `suspect`: observed present and meant to exist.
    pub fn is_held(&self) -> bool {
        matches!(self, ResourceState::Active | ResourceState::Paused { .. } | ResourceState::Suspect { .. })
    }

    /// Left for good: `releasing` or terminal.
    pub fn has_left(&self) -> bool {
        matches!(self, ResourceState::Releasing { .. }) || self.is_terminal()
    }
}

/// What a pending resource is given up by (see [`crate::due::create_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingClock {
    /// Waiting for its pools' identifiers, at most until this log time (its allocation's `wait`).
    WaitsUntil(Timestamp),
    /// Its create was ordered at this log time: the create timeout counts from it.
    OrderedAt(Timestamp),
}

/// A pause: why, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseInfo {
    pub reason: Option<String>,
    pub until: Option<Timestamp>,
}

/// A resource's claim on one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimSlot {
    /// Asked for by the `ClaimWanted` at `wanted_at`; not bound yet.
    Wanted { wanted_at: Position },
    Bound {
        value: PoolValue,
        token: Position,
        /// The pool's orphan policy as the grant carried it (`claim-orphan-policy`): with `hold`, an orphaned
        /// resource keeps the claim.
        orphans: OrphanPolicy,
    },
    /// Given back (`ClaimReleasable`), with the token it had if it was bound, and why (`claim-release-cause`, or
    /// what its terminal state says).
    Returned { token: Option<Position>, cause: FreeCause },
    /// Kept by an orphaned resource of a pool that holds an orphan's identifiers (`claim-held-for-orphan`): until its
    /// agent confirms the destroy of its handle, or an operator frees it (`op.free-orphan`). The resource is kept in
    /// state meanwhile, whatever the horizon.
    HeldForOrphan { value: PoolValue, token: Position },
}

/// A resource's parent, and what the resource knows of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    pub reference: ResourceRef,
    /// The source of the last parent cascade (or adoption answer) taken; for a parent in the same partition, the
    /// allocation itself. `None` while a child of a parent in another partition waits for its adoption answer.
    pub seen: Option<Source>,
    /// Flagged `suspect-upstream`: no new leases.
    pub suspect: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub id: ResourceId,
    pub agent: AgentName,
    pub kind: Box<str>,
    pub capacity: u32,
    pub attributes: BTreeMap<String, String>,
    /// Boxed: most resources have none.
    pub parent: Option<Box<ParentLink>>,
    pub state: ResourceState,
    pub allocated_at: Timestamp,
    pub allocated_pos: Position,
    /// The position of `CreateOrdered`: the agent could know of it from this watermark on.
    pub create_ordered: Option<Position>,
    /// The position of `ResourceActivated`: from this watermark on, the agent knows it made it.
    pub activated_pos: Option<Position>,
    /// Where a pending resource's deadline comes from: its allocation's `wait`, or (once its create is ordered)
    /// the create timeout counted from the order. One at a time: the order ends the wait.
    pub pending_clock: Option<PendingClock>,
    /// The position of `ResourceReleasing`.
    pub destruction_ordered: Option<Position>,
    /// The last observation of presence.
    pub last_present: Option<ObsStamp>,
    pub native_id: Option<Box<str>>,
    pub claims: BTreeMap<PoolName, ClaimSlot>,
    /// Live (waiting or active) leases, by the position of their request: first come, first granted.
    pub live_leases: BTreeMap<Position, LeaseId>,
    /// The longest a lease may be held (from its grant) while others wait: a renew past it is refused then.
    pub max_lease: Option<Millis>,
    /// While it holds no live lease: since when (its allocation, or the end of its last live lease). What a drain's
    /// grace counts from; meaningless while it holds one.
    pub idle_since: Timestamp,
    pub terminal_at: Option<Timestamp>,
}

impl Resource {
    pub fn reference(&self) -> ResourceRef {
        ResourceRef::new(self.agent.clone(), self.id)
    }

    /// The position from which the agent could know it should create the resource.
    pub fn creation_position(&self) -> Position {
        self.create_ordered.unwrap_or(self.allocated_pos)
    }

    /// True while an orphan keeps an identifier of a pool that holds them.
    pub fn holds_for_orphan(&self) -> bool {
        self.claims.values().any(|slot| matches!(slot, ClaimSlot::HeldForOrphan { .. }))
    }

    pub fn all_claims_bound(&self) -> bool {
        self.claims.values().all(|slot| matches!(slot, ClaimSlot::Bound { .. }))
    }

    pub fn parent(&self) -> Option<&ResourceRef> {
        self.parent.as_ref().map(|link| &link.reference)
    }

    /// The parent, while the resource is flagged `suspect-upstream`.
    pub fn upstream_suspect(&self) -> Option<&ResourceRef> {
        self.parent.as_ref().filter(|link| link.suspect).map(|link| &link.reference)
    }

    /// What this resource's state means for its children: left for good, suspect, or healthy.
    pub fn as_parent(&self) -> leasehold_schemas::command::ParentState {
        use leasehold_schemas::command::ParentState;
        match self.state {
            _ if self.state.has_left() => ParentState::Left,
            ResourceState::Suspect { .. } => ParentState::Suspect,
            _ => ParentState::Healthy,
        }
    }

    /// What the resource last heard from its parent (`None`: no parent, or not adopted yet).
    pub fn parent_seen(&self) -> Option<Source> {
        self.parent.as_ref().and_then(|link| link.seen)
    }
}

// -----------------------------------------------------------------------------------------------------------------
// Leases

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseState {
    Waiting { until: Option<Timestamp> },
    Active { token: Position, expires_at: Option<Timestamp> },
    Released,
    Broken { reason: BreakReason },
    Expired,
    Failed,
}

impl LeaseState {
    pub fn name(&self) -> &'static str {
        match self {
            LeaseState::Waiting { .. } => "waiting",
            LeaseState::Active { .. } => "active",
            LeaseState::Released => "released",
            LeaseState::Broken { .. } => "broken",
            LeaseState::Expired => "expired",
            LeaseState::Failed => "failed",
        }
    }

    pub fn is_live(&self) -> bool {
        matches!(self, LeaseState::Waiting { .. } | LeaseState::Active { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: LeaseId,
    pub resource: ResourceId,
    pub agent: AgentName,
    pub holder: String,
    pub ttl: Option<Millis>,
    pub state: LeaseState,
    /// The position of its first effect (waiting or granted): its place in the queue.
    pub requested_pos: Position,
    /// Its priority in the queue of a busy resource (0 unless it asked for more).
    pub priority: u8,
    /// The log time it started waiting (or was granted at once): what its aging counts from.
    pub requested_at: Timestamp,
    /// The log time of its grant.
    pub granted_at: Option<Timestamp>,
    pub terminal_at: Option<Timestamp>,
    /// The last accepted renew: its command id and command sequence. A lease renewed every minute would otherwise
    /// keep 1,440 command ids a day in memory: a retry of the last renew is recognised here, and a renew with an
    /// older id (UUIDv7 ids are ordered by their issuer's clock) is refused.
    pub last_renew: Option<(CommandId, u64)>,
}

// -----------------------------------------------------------------------------------------------------------------
// Pools

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Holding {
    Waiting {
        queued_at: Position,
        source: Source,
    },
    /// `orphans`: the pool's orphan policy when it granted, which the grant carries to its holder (`sys.bind-claim`):
    /// a holder keeps the policy of its grant, even if the pool's changes before the grant is carried.
    Granted {
        value: PoolValue,
        token: Position,
        source: Source,
        orphans: OrphanPolicy,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub name: PoolName,
    pub kind: PoolKind,
    pub cooldown: Millis,
    /// What an orphaned holder's identifier does (`pool-orphan-policy`); carried to holders with each grant.
    pub orphans: OrphanPolicy,
    /// Index of the next identifier never handed out (identifiers never used come first). Identifiers are never
    /// materialised: a /16 is this index, not 65,536 entries.
    pub next_fresh: u64,
    /// Usable identifiers below `next_fresh` that nobody holds and that are not cooling: made usable by a change of
    /// definition (a grown /30's old broadcast address, a lifted exclusion). Handed out after fresh ones, before
    /// cooled ones. At most the old definition's exclusions and reserved addresses.
    pub recovered: BTreeSet<PoolValue>,
    /// Freed identifiers, least recently freed first: `(freed at, position of the free)`.
    pub cooling: BTreeMap<(Timestamp, Position), PoolValue>,
    pub held: BTreeMap<PoolValue, ResourceRef>,
    pub holders: BTreeMap<ResourceRef, Holding>,
    /// Holders waiting, first in first out (by the position of their `ClaimQueued`).
    pub waiters: BTreeMap<Position, ResourceRef>,
    /// Holders whose claim ended: the source of that claim (sent again, it is stale) and the position of the effect
    /// that ended it (which names this record: a holder's claim may end more than once, with the same source).
    pub released: BTreeMap<ResourceRef, (Source, Position)>,
}

impl Pool {
    /// How many more identifiers the pool, defined as `kind`, may hand out once `leaving` of its holders have let
    /// go: for slots, never more held than the count, so a count lowered below what is held (a quota lowered) hands
    /// out nothing until fewer are held, whichever slots they hold; any other kind is bounded by its identifiers.
    pub fn room_as(&self, kind: &PoolKind, leaving: usize) -> usize {
        match kind {
            PoolKind::Slots { count } => {
                usize::try_from(*count).unwrap_or(usize::MAX).saturating_sub(self.held.len().saturating_sub(leaving))
            }
            PoolKind::Ipv4 { .. } | PoolKind::Ports { .. } => usize::MAX,
        }
    }

    /// When the least recently freed identifier finishes its cool-down.
    pub fn next_cooled_at(&self) -> Option<Timestamp> {
        self.cooling.keys().next().map(|(freed_at, _)| freed_at.saturating_add(self.cooldown))
    }
}

// -----------------------------------------------------------------------------------------------------------------
// The queue of a busy resource

/// How long a waiter waits for its effective priority to rise by one. A waiter of priority `p` ranks above every lease
/// that arrives later once it has waited `(cap - p) * AGING_STEP`, `cap` being the highest priority anyone may ask.
pub const AGING_STEP: Millis = Millis::from_secs(60);

/// A waiter's rank at `now`: its priority plus one for each full [`AGING_STEP`] it has waited (on log time).
pub fn effective_priority(lease: &Lease, now: Timestamp) -> u64 {
    u64::from(lease.priority) + now.since(lease.requested_at).0 / AGING_STEP.0
}

/// Waiting leases in the order they are granted at `now`: highest effective priority first, then first come.
pub fn queue_order<'a>(waiting: impl Iterator<Item = &'a Lease>, now: Timestamp) -> Vec<&'a Lease> {
    let mut queue: Vec<&Lease> = waiting.collect();
    queue.sort_by_key(|lease| (std::cmp::Reverse(effective_priority(lease, now)), lease.requested_pos));
    queue
}
