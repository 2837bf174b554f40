//! Every command leasehold understands, in its class, with its stable type name.
//!
//! - `op`: producers and operators ask for something (allocate, acquire, release, pause...).
//! - `agent`: an agent tells what it observed on its own machine (register, heartbeat, reports).
//! - `sys`: the sweeper asks for time-driven and cross-partition work.
//!
//! The type name (`op.allocate`, `agent.sync`...) is the wire's discriminant: a body is encoded as its struct alone,
//! so adding a command never changes the bytes of another.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::envelope::CommandClass;
use crate::ids::{
    AgentName, Issuer, Key, LeaseId, Millis, PoolName, Position, QuotaName, ResourceId, ResourceRef, Source, Timestamp,
};
use crate::outcome::FreeCause;
use crate::pool::{OrphanPolicy, PoolKind, PoolValue};
use crate::settings::{AgentSettings, ClusterPolicy, GcMode};

/// At most this many handles may be named in one report or one resync chunk (about 140 KiB of ids), so that an
/// outcome always has room for the rest of the work when a decision must continue.
pub const MAX_REPORT_HANDLES: usize = 8192;

// ---------------------------------------------------------------------------------------------------------------
// op: producers and operators

/// Put a resource `pending` on an agent; once its claims are bound, the agent creates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allocate {
    pub agent: AgentName,
    pub resource: ResourceId,
    /// What the driver makes: `container`, `volume`, `vm`... (`[a-z0-9][a-z0-9_.-]{0,62}`).
    pub kind: String,
    /// How many live leases it takes at once.
    pub capacity: u32,
    #[serde(default, deserialize_with = "crate::codec::unique_keys")]
    pub attributes: BTreeMap<String, String>,
    /// A resource this one depends on; when it leaves for good, this one is released.
    pub parent: Option<ResourceRef>,
    /// One identifier is claimed from each of these pools before the resource is created.
    #[serde(default)]
    pub pools: Vec<PoolName>,
    /// How long the resource may wait for its pools' identifiers (log time from its allocation); past it, the
    /// allocation is given up (`resource-releasing`, cause `wait-timeout`). `None`: it waits until released.
    /// Added in schema version 2 (a version 1 allocation has none).
    #[serde(default)]
    pub wait: Option<Millis>,
}

impl Allocate {
    /// An allocation of `resource` on `agent`: `capacity` leases at once, no attributes, no parent, no pools.
    pub fn new(agent: AgentName, resource: ResourceId, kind: impl Into<String>, capacity: u32) -> Self {
        Allocate {
            agent,
            resource,
            kind: kind.into(),
            capacity,
            attributes: BTreeMap::new(),
            parent: None,
            pools: Vec::new(),
            wait: None,
        }
    }
}

/// Ask for a lease on a resource. Granted at once on an `active` resource with spare capacity; waits on a
/// `pending` one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Acquire {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub lease: LeaseId,
    /// Who holds the lease (a build, a job, a task): for people and audit only.
    pub holder: String,
    /// The lease expires this long after its grant or its last renewal; `None`: held until released.
    pub ttl: Option<Millis>,
    /// A waiting lease fails after this long; `None`: it waits as long as the resource is `pending`. On an `active`
    /// resource at capacity, a lease queues only when this is given (without it, the acquire is refused
    /// `at-capacity`).
    pub wait_timeout: Option<Millis>,
    /// Its place in the queue of a busy resource: higher first, then first come (and a waiter's priority rises
    /// with its wait). At most the cap the cluster policy gives its issuer (0 for an issuer it names no cap for).
    /// 0 when absent; a priority above 0 needs schema version 5.
    #[serde(default)]
    pub priority: u8,
}

/// Extend an active lease; `ttl` `None` keeps the lease's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Renew {
    pub agent: AgentName,
    pub lease: LeaseId,
    pub token: Position,
    pub ttl: Option<Millis>,
}

/// Give a lease back. An active lease needs its token; a waiting lease has none yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseLease {
    pub agent: AgentName,
    pub lease: LeaseId,
    pub token: Option<Position>,
}

/// Order a resource destroyed. Its leases break at once; its claims stay held until the agent confirms it gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub reason: Option<String>,
}

/// No new leases on an active resource (maintenance); existing leases stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub reason: Option<String>,
    /// The pause ends by itself at this log time.
    pub until: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unpause {
    pub agent: AgentName,
    pub resource: ResourceId,
}

/// Change a resource's attributes or capacity (while `active` or `paused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Update {
    pub agent: AgentName,
    pub resource: ResourceId,
    #[serde(default, deserialize_with = "crate::codec::unique_keys")]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
    pub capacity: Option<u32>,
    /// The longest a lease may be held while others wait (from its grant): a renew that would hold it longer is
    /// refused while the queue is not empty. `Some(0)` removes the limit; `None` keeps the resource's. Added in
    /// schema version 5.
    #[serde(default)]
    pub max_lease: Option<Millis>,
}

/// An operator (or a lease holder) saw the resource fail: it turns `suspect` and a health check is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportFailureByOperator {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub detail: String,
}

/// Take an agent out of service: no new placements, and everything it holds is released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetireAgent {
    pub agent: AgentName,
    /// Refuse, changing nothing, if any resource of the agent holds a live lease when the command is decided: the
    /// condition the operator saw (`agent retire` without `--yes`) travels with the command, so a projection that
    /// was behind cannot release a leased resource by surprise. Added in schema version 4.
    #[serde(default)]
    pub only_if_unleased: bool,
}

impl RetireAgent {
    pub fn new(agent: AgentName) -> Self {
        RetireAgent { agent, only_if_unleased: false }
    }
}

/// Cordon an agent and release what it holds as it falls idle (schema version 4): each resource is released once
/// it holds no lease and has been idle for `grace`, and whatever is left at the deadline. `op.uncordon-agent` ends
/// the drain; what was released stays released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainAgent {
    pub agent: AgentName,
    /// From the drain's decision; `None`: no deadline, only idle resources are released.
    pub deadline: Option<Millis>,
    /// How long a resource must have held no lease before it is released; `None`: the policy's default.
    pub grace: Option<Millis>,
    pub reason: Option<String>,
}

/// How a placement chooses among the agents that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementStrategy {
    /// The agent with the fewest resources of the kind (ties: the name).
    #[default]
    Spread,
    /// The agent with the most resources of the kind that still has room (ties: the name).
    Pack,
}

/// Allocate a resource on whichever live, schedulable agent fits (schema version 4): a placement, keyed by the
/// resource id in a partition of its own. It reserves room on one agent and makes at most one resource, whatever
/// is retried or crashes. The fields after `wait` choose the agent; the others are those of `op.allocate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Place {
    pub resource: ResourceId,
    pub kind: String,
    pub capacity: u32,
    #[serde(default, deserialize_with = "crate::codec::unique_keys")]
    pub attributes: BTreeMap<String, String>,
    pub parent: Option<ResourceRef>,
    #[serde(default)]
    pub pools: Vec<PoolName>,
    /// How long the request may wait for room (from its acceptance) and then, once placed, for its pools'
    /// identifiers (from its allocation). `None`: no waiting for room (no candidate is a refusal).
    #[serde(default)]
    pub wait: Option<Millis>,
    /// Labels the agent must carry, every one (`zone=a`).
    #[serde(default, deserialize_with = "crate::codec::unique_keys")]
    pub select: BTreeMap<String, String>,
    #[serde(default)]
    pub strategy: PlacementStrategy,
}

impl Place {
    /// A placement of `resource` on any agent that takes `kind`: `capacity` leases at once, spread, no labels, no
    /// wait, no attributes, parent or pools.
    pub fn new(resource: ResourceId, kind: impl Into<String>, capacity: u32) -> Self {
        Place {
            resource,
            kind: kind.into(),
            capacity,
            attributes: BTreeMap::new(),
            parent: None,
            pools: Vec::new(),
            wait: None,
            select: BTreeMap::new(),
            strategy: PlacementStrategy::Spread,
        }
    }

    /// The allocation this placement makes on `agent`.
    pub fn allocation_on(&self, agent: AgentName) -> Allocate {
        Allocate {
            agent,
            resource: self.resource,
            kind: self.kind.clone(),
            capacity: self.capacity,
            attributes: self.attributes.clone(),
            parent: self.parent.clone(),
            pools: self.pools.clone(),
            wait: self.wait,
        }
    }
}

/// Give up a placement that is not placed yet (schema version 4). A placed one is released as any resource is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelPlacement {
    pub resource: ResourceId,
    pub reason: Option<String>,
}

/// Bring a retired agent back into service, on record (retirement is sticky: registering again does not end it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnretireAgent {
    pub agent: AgentName,
}

/// Stop new allocations (and placements) on an agent, on record; what it holds, and its leases, go on (schema
/// version 3). Sticky like retirement: registering again does not end it, only `op.uncordon-agent` does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CordonAgent {
    pub agent: AgentName,
    /// Why, for whoever looks at the agent later.
    pub reason: Option<String>,
}

/// Let an agent take new allocations again, on record (schema version 3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UncordonAgent {
    pub agent: AgentName,
}

/// The operator confirms that an agent whose circuit breaker tripped really lost what it reported missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmLoss {
    pub agent: AgentName,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefinePool {
    pub pool: PoolName,
    pub kind: PoolKind,
    /// A freed identifier is handed out again only after this long; `None`: the partition policy's
    /// `claim_cooldown` at the time of the definition (60 s while no policy is recorded).
    pub cooldown: Option<Millis>,
    /// What an orphaned holder's identifier does: `release` (freed at orphaning, as before) or `hold` (held until
    /// its agent confirms the destroy, or an operator frees it with `op.free-orphan`). Added in schema version 5.
    #[serde(default, deserialize_with = "crate::codec::unit_variant")]
    pub orphans: OrphanPolicy,
}

/// Change a pool's definition: grow it (IPv4: the same network address with a shorter prefix; slots: more of them;
/// ports: the same first port and a later last one), change its exclusions, or its cool-down. A slot pool may also
/// get fewer slots, even none (a quota lowered): what is held stays held, and nothing is handed out while as many as
/// the count are held. Shrinking an IPv4 or port pool is refused. An identifier excluded while held stays held until
/// freed, and is never handed out again after that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdatePool {
    pub pool: PoolName,
    pub kind: PoolKind,
    /// `None`: keep the pool's cool-down.
    pub cooldown: Option<Millis>,
    /// `None`: keep the pool's orphan policy. A new policy reaches holders with the grants carried after it (schema
    /// version 5).
    #[serde(default, deserialize_with = "crate::codec::unit_variant_option")]
    pub orphans: Option<OrphanPolicy>,
}

/// Remove a pool nobody holds or waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeletePool {
    pub pool: PoolName,
}

/// Change the settings of one partition: each field given replaces the partition's, each `None` keeps it.
/// `partition` must name the partition that decides it (a guard against routing mistakes); `key` only routes the
/// command there (`subjects::settings_key` gives one per partition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPartitionSettings {
    pub key: Key,
    pub partition: u32,
    pub outcome_horizon: Option<Millis>,
    /// The whole cluster policy (a recorded policy is replaced, never removed).
    pub policy: Option<ClusterPolicy>,
    /// Change anything only if the partition has no policy yet; otherwise change nothing (rejected
    /// `already-done`). `serve` sends its flags so: two processes started with different flags never flip the
    /// recorded policy back and forth.
    pub if_no_policy: bool,
    /// What agents of the partition do with garbage (handles of no live resource): `destroy` (ordered on record) or
    /// `dry-run` (recorded, never ordered). `None` keeps the partition's. Added in schema version 2.
    #[serde(default, deserialize_with = "crate::codec::unit_variant_option")]
    pub gc: Option<GcMode>,
    /// The highest lease priority each issuer may ask for, by issuer prefix (the longest prefix that matches an
    /// issuer names its cap; an issuer no prefix matches may ask for 0 only). `Some` replaces the partition's whole
    /// map; `None` keeps it. Added in schema version 5.
    #[serde(default, deserialize_with = "crate::codec::unique_keys_option")]
    pub max_priority: Option<BTreeMap<String, u8>>,
}

// ---------------------------------------------------------------------------------------------------------------
// agent: observations an agent makes of its own machine

/// A new agent process asks for an epoch: the position of the `AgentRegistered` effect its registration gets.
/// Observations of any other epoch are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    pub agent: AgentName,
    /// Chosen at random by the process, so it can recognise its own registration on its subject.
    #[serde(deserialize_with = "crate::ids::canonical_uuid")]
    pub incarnation: Uuid,
    /// "My disk was wiped": losing everything in the first reports is expected, not a fault.
    pub wiped: bool,
    /// The agent's own settings; `None`: it follows its partition's policy, as that policy changes.
    pub settings: Option<AgentSettings>,
    /// What placement may select it by (`zone=a`), as the operator started it (schema version 3).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How many resources of each kind it takes, from pending to releasing (`container=50`); a kind it does not
    /// name is not limited by it, and never placed on it (schema version 3).
    #[serde(default)]
    pub capacity: BTreeMap<String, u32>,
}

impl Register {
    /// A registration of `agent` by the process `incarnation`: not wiped, following its partition's policy,
    /// declaring no labels and no capacity.
    pub fn new(agent: AgentName, incarnation: Uuid) -> Self {
        Register {
            agent,
            incarnation,
            wiped: false,
            settings: None,
            labels: BTreeMap::new(),
            capacity: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub agent: AgentName,
    pub epoch: Position,
}

/// A `pending` resource now exists on the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportCreated {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub resource: ResourceId,
    /// The driver's own id for it (a container id, a volume path).
    pub native_id: Option<String>,
}

/// The agent's periodic report: differences between its assignment set (as of `watermark`) and its machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncReport {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    /// Every effect on this agent up to this position has been applied by the agent.
    pub watermark: Position,
    /// Pending handles now present.
    #[serde(default)]
    pub created: Vec<ResourceId>,
    /// Handles that should exist and do not.
    #[serde(default)]
    pub missing: Vec<ResourceId>,
    /// Releasing handles now absent.
    #[serde(default)]
    pub destroyed: Vec<ResourceId>,
    /// Creates and destroys still running: they count as present.
    #[serde(default)]
    pub in_flight: Vec<ResourceId>,
    /// How many handles of its assignment set (as of `watermark`) the agent holds, present or in flight, and their
    /// digest: resources it knows of as pending (created), active, paused, suspect or releasing, that are on the
    /// machine or whose create or destroy is running. Garbage (handles of no known resource) is not counted.
    pub count: u64,
    pub digest: HandleDigest,
}

impl SyncReport {
    /// A report that names nothing yet (lists empty, count 0, empty digest): callers fill in what they saw.
    pub fn new(agent: AgentName, epoch: Position, obs: u64, watermark: Position) -> Self {
        SyncReport {
            agent,
            epoch,
            obs,
            watermark,
            created: Vec::new(),
            missing: Vec::new(),
            destroyed: Vec::new(),
            in_flight: Vec::new(),
            count: 0,
            digest: HandleDigest::default(),
        }
    }
}

/// One chunk of a full resync: "in id range `[lo, hi)` I hold exactly `held` (and `in_flight` is running)".
/// Each chunk is decided on its own; `hi` `None` means the end of the id space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResyncChunk {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub watermark: Position,
    #[serde(deserialize_with = "crate::ids::canonical_uuid")]
    pub lo: Uuid,
    #[serde(default, deserialize_with = "crate::ids::canonical_uuid_option")]
    pub hi: Option<Uuid>,
    #[serde(default)]
    pub held: Vec<ResourceId>,
    #[serde(default)]
    pub in_flight: Vec<ResourceId>,
}

impl ResyncChunk {
    /// True when `id` falls in `[lo, hi)`.
    pub fn covers(&self, id: ResourceId) -> bool {
        let id = id.as_uuid();
        id >= self.lo && self.hi.is_none_or(|hi| id < hi)
    }
}

/// Handles on the machine that are not in the agent's assignment set as of `watermark` (garbage: of no resource the
/// agent knows, or of one that left). Sent after a creation grace period, in chunks of at most
/// [`MAX_REPORT_HANDLES`], and only when that set changes. The writer decides each handle on record: a destroy ordered
/// (`garbage-destroy-ordered`), a handle of a `lost` resource quarantined (`handle-reappeared`), or, in a dry run,
/// what would have been done (`garbage-dry-run`). The agent destroys only what the log ordered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GarbageReport {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub watermark: Position,
    #[serde(default)]
    pub handles: Vec<ResourceId>,
    /// The agent runs with `--gc dry-run`: record, order nothing.
    pub dry_run: bool,
}

/// The agent destroyed a handle it was ordered to destroy: the resource's release (`ordered` is its
/// `resource-releasing`) or a garbage handle's (`ordered` is its `garbage-destroy-ordered`). Sent at once, as a
/// create is, so a freed identifier comes back without waiting for the next sync report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportDestroyed {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub resource: ResourceId,
    pub ordered: Position,
}

/// Whether the agent's driver can list the machine's resources (its root mounted, its daemon answering). Sent when
/// that changes from what the log records: a driver that cannot list judges nothing (no report is made from it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverStatus {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub available: bool,
    /// Why not, when unavailable (the driver's error).
    pub detail: String,
}

/// What the driver said went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// A definitive creation error: the handle does not and will not exist.
    CreateFailed,
    /// The resource exists but misbehaves: a health check is due.
    Unhealthy,
    /// A destroy cannot finish while something else uses the resource (a volume a container mounts): the agent
    /// tries again, and the reason is on record (schema version 3).
    DestroyBlocked,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportFailure {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub resource: ResourceId,
    #[serde(deserialize_with = "crate::codec::unit_variant")]
    pub failure: FailureKind,
    pub detail: String,
}

/// The result of the driver's `check` on a `suspect` resource. `request` is the position of the
/// `health-check-requested` it answers: a check asked for before the resource last turned suspect says nothing about
/// the failure reported since, and is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthResult {
    pub agent: AgentName,
    pub epoch: Position,
    pub obs: u64,
    pub resource: ResourceId,
    pub request: Position,
    pub healthy: bool,
    pub detail: String,
}

// ---------------------------------------------------------------------------------------------------------------
// sys: the sweeper. Time-driven ones are requests: early ones are rejected `not-yet-due`.

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpireLease {
    pub agent: AgentName,
    pub lease: LeaseId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitTimeout {
    pub agent: AgentName,
    pub lease: LeaseId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTimeout {
    pub agent: AgentName,
    pub resource: ResourceId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpirePause {
    pub agent: AgentName,
    pub resource: ResourceId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkStalled {
    pub agent: AgentName,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkGone {
    pub agent: AgentName,
}

/// Orphan one resource of a `gone` agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Orphan {
    pub agent: AgentName,
    pub resource: ResourceId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestHealthCheck {
    pub agent: AgentName,
    pub resource: ResourceId,
}

/// To a pool: `holder` wants one identifier. `source` is the `ClaimWanted` effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub pool: PoolName,
    pub holder: ResourceRef,
    pub source: Source,
}

/// To a resource: the pool granted `value` with `token`. `source` is the `ClaimGranted` effect; `wanted` is the
/// `ClaimWanted` effect the grant answers (the grant's own `source`): a resource binds only a grant of its own
/// claim and sends any other straight back. `definition`: the pool's definition when the grant was carried, for
/// IPv4 pools (schema version 3): the resource's agent puts the address on a network of that subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindClaim {
    pub holder: ResourceRef,
    pub pool: PoolName,
    pub value: PoolValue,
    pub token: Position,
    pub source: Source,
    pub wanted: Source,
    #[serde(default)]
    pub definition: Option<PoolKind>,
    /// The pool's orphan policy when the grant was carried (schema version 5): with `hold`, the holder's partition
    /// keeps the identifier held if the holder is orphaned, instead of sending it back.
    #[serde(default, deserialize_with = "crate::codec::unit_variant")]
    pub orphans: OrphanPolicy,
}

/// To a pool: give back the claim of `holder` with `token` (`None`: withdraw a holder still waiting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Free {
    pub pool: PoolName,
    pub holder: ResourceRef,
    pub token: Option<Position>,
    pub source: Source,
    /// Why the holder let the identifier go, as its partition recorded it (schema version 5; `released` before).
    #[serde(default)]
    pub cause: FreeCause,
}

/// An operator frees what an orphan still holds of pools that hold an orphan's identifiers (schema version 5): the
/// orphan's machine is known to be gone, or its agent will not come back to confirm the destroy. `pool` `None`: every
/// identifier it holds. The cause travels with the free, and `why` says who freed it and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeOrphan {
    pub agent: AgentName,
    pub resource: ResourceId,
    #[serde(default)]
    pub pool: Option<PoolName>,
    /// Why, on record (required: an address handed out again while its machine may still use it is worth a word).
    pub reason: String,
}

/// Set, change or remove a quota in one partition (schema version 6): the most resources of each kind in `max`
/// that the issuers in `principals` may hold at once, counted across every partition by one `slots` pool per kind
/// ([`quota_pool`]; defined by the operator's `quota set` before this is sent). An allocation by one of them of a
/// kind in `max` claims a slot of that pool. `max` and `principals` both empty remove the quota. Sent to every
/// partition; `partition` must name the one that decides it, `key` routes it there (`subjects::settings_key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetQuota {
    pub key: Key,
    pub partition: u32,
    pub quota: QuotaName,
    #[serde(default)]
    pub max: BTreeMap<String, u32>,
    #[serde(default)]
    pub principals: Vec<Issuer>,
}

/// The pool that counts `kind` for `quota`: `quota-<quota>-<kind>`, if that is a pool name (a kind with a dot, or
/// a name over 63 bytes, has none: a quota refuses such a kind).
pub fn quota_pool(quota: &QuotaName, kind: &str) -> Option<PoolName> {
    PoolName::new(format!("quota-{quota}-{kind}")).ok()
}

/// The kind `pool` would count for `quota`, read from its name (the inverse of [`quota_pool`], without building a
/// name): `Some("container")` for `quota-team-a-container` and `team-a`.
pub fn quota_kind_of<'p>(pool: &'p PoolName, quota: &QuotaName) -> Option<&'p str> {
    pool.as_str().strip_prefix("quota-")?.strip_prefix(quota.as_str())?.strip_prefix('-')
}

/// To a holder (schema version 6): its claim on a quota's pool was queued there (the quota is full), and its
/// allocation gave no `wait`, so it is refused rather than left waiting. `source`: the pool's `claim-queued`
/// (its partition and position); `held` and `holders` (at most [`MAX_QUOTA_HOLDERS_NAMED`]): the pool's holders as
/// the sender saw them, for the cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverQuota {
    pub holder: ResourceRef,
    pub pool: PoolName,
    pub source: Source,
    pub held: u32,
    #[serde(default)]
    pub holders: Vec<ResourceRef>,
}

/// How many holders a refusal over quota names.
pub const MAX_QUOTA_HOLDERS_NAMED: usize = 5;

/// To a pool: serve waiters with identifiers whose cool-down has passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TickPool {
    pub pool: PoolName,
}

/// What a parent's state means for its children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParentState {
    /// The parent left for good (`releasing` or terminal): release the child.
    Left,
    /// The parent is `suspect`: flag the child `suspect-upstream`.
    Suspect,
    /// The parent is healthy again: clear the flag.
    Healthy,
    /// The parent's partition has never known it and records it as absent (it refuses a later allocation of that
    /// id): release the child. Added after the first fixtures: at the end, so the other discriminants stay.
    Absent,
}

/// To a child resource: its parent's state. `source` is the parent's effect that says so: a state change, or the
/// `child-adopted` that answered the child's adoption (then `answers` is the child's `resource-allocated`, which is
/// how the child knows the answer is about its own life, not a message sent before it existed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cascade {
    pub child: ResourceRef,
    pub parent: ResourceRef,
    #[serde(deserialize_with = "crate::codec::unit_variant")]
    pub parent_state: ParentState,
    pub source: Source,
    pub answers: Option<Source>,
}

/// To a parent resource in another partition: a child was allocated (`source`: its `resource-allocated`) and needs
/// the parent's state as of now. The answer (`child-adopted`) is carried back as a `cascade` with `answers` set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adopt {
    pub parent: ResourceRef,
    pub child: ResourceRef,
    pub source: Source,
}

/// To an agent: reserve room for the placement of `resource` (schema version 4). `source` is the placement's
/// `placement-wanted`. The agent's partition checks, atomically, that the agent is live, schedulable, carries the
/// labels and has room; the reservation counts against its capacity until committed or cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reserve {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub kind: String,
    #[serde(default, deserialize_with = "crate::codec::unique_keys")]
    pub select: BTreeMap<String, String>,
    pub source: Source,
}

/// To a placement: `agent` reserved room for it (`capacity-reserved` at `token`, which is `source`). The placement
/// binds the first reservation it hears of and no other (schema version 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindPlacement {
    pub resource: ResourceId,
    pub agent: AgentName,
    pub token: Position,
    /// The agent's use of the kind with this reservation, and its capacity for the kind: what the outcome says.
    pub used: u32,
    pub capacity: u32,
    pub source: Source,
}

/// To an agent: the placement bound its reservation `token` (`source`: the `placement-bound`): make the resource
/// (schema version 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitPlacement {
    pub allocation: Allocate,
    pub token: Position,
    pub source: Source,
    /// The issuer of the `op.place` (schema version 6): its quota counts the resource. `None`: the placement's
    /// issuer is under no quota (and a commit of an older version).
    #[serde(default)]
    pub principal: Option<Issuer>,
}

/// To an agent: a reservation its placement did not bind (it bound another, or ended): give the room back (schema
/// version 4). `source`: the placement's partition as far as the sender saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelReservation {
    pub agent: AgentName,
    pub resource: ResourceId,
    pub token: Position,
    pub source: Source,
}

/// To a placement: the reservation it bound (`token` of `agent`) has ended on the agent, made into the resource by
/// its commit: the placement's work is done, and it is forgotten a horizon later, not before (schema version 5).
/// `source`: the agent's partition as far as the sender saw it, past `token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosePlacement {
    pub resource: ResourceId,
    pub agent: AgentName,
    pub token: Position,
    pub source: Source,
}

/// To a placement: no agent fits now, and why ("no agent with zone=a", "all 4 full"). A placement that may wait
/// records that it waits and on what; one that may not, or whose wait has passed, is refused (schema version 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unplaceable {
    pub resource: ResourceId,
    pub why: String,
}

/// To a draining agent: release `resource` if it is idle past the drain's grace, or the drain's deadline has
/// passed (schema version 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRelease {
    pub agent: AgentName,
    pub resource: ResourceId,
}

// ---------------------------------------------------------------------------------------------------------------
// The enum of all commands, their type names and classes.

macro_rules! commands {
    ($( $variant:ident($body:ident) = $class:ident $name:literal, )*) => {
        /// Every command. The variant is the wire's type name; the body is encoded on its own.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Command {
            $( $variant($body), )*
        }

        impl Command {
            /// Every type name, in declaration order.
            pub const TYPE_NAMES: &'static [&'static str] = &[$($name),*];

            /// The stable type name: `op.allocate`, `agent.sync`...
            pub fn type_name(&self) -> &'static str {
                match self {
                    $( Command::$variant(_) => $name, )*
                }
            }

            pub fn class(&self) -> CommandClass {
                match self {
                    $( Command::$variant(_) => CommandClass::$class, )*
                }
            }

            pub(crate) fn encode_body(&self, out: &mut impl std::io::Write) -> Result<(), crate::codec::CodecError> {
                match self {
                    $( Command::$variant(body) => crate::codec::encode_into(body, out), )*
                }
            }

            /// Decodes a body of type `type_name`; returns the command and the bytes read.
            pub(crate) fn decode_body(
                type_name: &str,
                bytes: &[u8],
            ) -> Result<(Command, usize), crate::codec::CodecError> {
                match type_name {
                    $( $name => {
                        let (body, read) = crate::codec::decode_from::<$body>(bytes)?;
                        Ok((Command::$variant(body), read))
                    } )*
                    other => Err(crate::codec::CodecError::unknown_type(other)),
                }
            }


            /// Decodes the body of a JSON command of type `type_name` from the whole payload.
            pub(crate) fn body_from_json(
                type_name: &str,
                payload: &[u8],
            ) -> Result<Command, crate::codec::CodecError> {
                match type_name {
                    $( $name => crate::codec::body_from_json::<$body>(payload).map(Command::$variant), )*
                    other => Err(crate::codec::CodecError::unknown_type(other)),
                }
            }
        }

        /// Serializes a command's body as its own struct (for the JSON form).
        pub(crate) struct BodyRef<'a>(pub(crate) &'a Command);

        impl Serialize for BodyRef<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self.0 {
                    $( Command::$variant(body) => body.serialize(serializer), )*
                }
            }
        }

        $(
            impl From<$body> for Command {
                fn from(body: $body) -> Command {
                    Command::$variant(body)
                }
            }
        )*
    };
}

commands! {
    Allocate(Allocate) = Op "op.allocate",
    Acquire(Acquire) = Op "op.acquire",
    Renew(Renew) = Op "op.renew",
    ReleaseLease(ReleaseLease) = Op "op.release-lease",
    Release(Release) = Op "op.release",
    Pause(Pause) = Op "op.pause",
    Unpause(Unpause) = Op "op.unpause",
    Update(Update) = Op "op.update",
    ReportFailureByOperator(ReportFailureByOperator) = Op "op.report-failure",
    RetireAgent(RetireAgent) = Op "op.retire-agent",
    ConfirmLoss(ConfirmLoss) = Op "op.confirm-loss",
    DefinePool(DefinePool) = Op "op.define-pool",
    UpdatePool(UpdatePool) = Op "op.update-pool",
    DeletePool(DeletePool) = Op "op.delete-pool",
    SetPartitionSettings(SetPartitionSettings) = Op "op.set-partition-settings",
    Register(Register) = Agent "agent.register",
    Heartbeat(Heartbeat) = Agent "agent.heartbeat",
    ReportCreated(ReportCreated) = Agent "agent.report-created",
    Sync(SyncReport) = Agent "agent.sync",
    ResyncChunk(ResyncChunk) = Agent "agent.resync-chunk",
    ReportFailure(ReportFailure) = Agent "agent.report-failure",
    HealthResult(HealthResult) = Agent "agent.health-result",
    ExpireLease(ExpireLease) = Sys "sys.expire-lease",
    WaitTimeout(WaitTimeout) = Sys "sys.wait-timeout",
    CreateTimeout(CreateTimeout) = Sys "sys.create-timeout",
    ExpirePause(ExpirePause) = Sys "sys.expire-pause",
    MarkStalled(MarkStalled) = Sys "sys.mark-stalled",
    MarkGone(MarkGone) = Sys "sys.mark-gone",
    Orphan(Orphan) = Sys "sys.orphan",
    RequestHealthCheck(RequestHealthCheck) = Sys "sys.request-health-check",
    Claim(Claim) = Sys "sys.claim",
    BindClaim(BindClaim) = Sys "sys.bind-claim",
    Free(Free) = Sys "sys.free",
    TickPool(TickPool) = Sys "sys.tick-pool",
    Cascade(Cascade) = Sys "sys.cascade",
    Adopt(Adopt) = Sys "sys.adopt",
    UnretireAgent(UnretireAgent) = Op "op.unretire-agent",
    GarbageReport(GarbageReport) = Agent "agent.report-garbage",
    ReportDestroyed(ReportDestroyed) = Agent "agent.report-destroyed",
    DriverStatus(DriverStatus) = Agent "agent.driver-status",
    CordonAgent(CordonAgent) = Op "op.cordon-agent",
    UncordonAgent(UncordonAgent) = Op "op.uncordon-agent",
    Place(Place) = Op "op.place",
    CancelPlacement(CancelPlacement) = Op "op.cancel-placement",
    DrainAgent(DrainAgent) = Op "op.drain-agent",
    Reserve(Reserve) = Sys "sys.reserve",
    BindPlacement(BindPlacement) = Sys "sys.bind-placement",
    CommitPlacement(CommitPlacement) = Sys "sys.commit-placement",
    CancelReservation(CancelReservation) = Sys "sys.cancel-reservation",
    Unplaceable(Unplaceable) = Sys "sys.unplaceable",
    DrainRelease(DrainRelease) = Sys "sys.drain-release",
    ClosePlacement(ClosePlacement) = Sys "sys.close-placement",
    FreeOrphan(FreeOrphan) = Op "op.free-orphan",
    SetQuota(SetQuota) = Op "op.set-quota",
    OverQuota(OverQuota) = Sys "sys.over-quota",
}

/// The last subject token of a command: the resource or lease it is about, or `_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectId {
    Resource(ResourceId),
    Lease(LeaseId),
    None,
}

impl fmt::Display for SubjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectId::Resource(id) => write!(f, "{id}"),
            SubjectId::Lease(id) => write!(f, "{id}"),
            SubjectId::None => f.write_str("_"),
        }
    }
}

impl Command {
    /// The agent or pool this command is about: it picks the partition that decides it.
    pub fn key(&self) -> Key {
        let agent = |a: &AgentName| Key::Agent(a.clone());
        let pool = |p: &PoolName| Key::Pool(p.clone());
        match self {
            Command::Allocate(c) => agent(&c.agent),
            Command::Acquire(c) => agent(&c.agent),
            Command::Renew(c) => agent(&c.agent),
            Command::ReleaseLease(c) => agent(&c.agent),
            Command::Release(c) => agent(&c.agent),
            Command::Pause(c) => agent(&c.agent),
            Command::Unpause(c) => agent(&c.agent),
            Command::Update(c) => agent(&c.agent),
            Command::ReportFailureByOperator(c) => agent(&c.agent),
            Command::RetireAgent(c) => agent(&c.agent),
            Command::ConfirmLoss(c) => agent(&c.agent),
            Command::UnretireAgent(c) => agent(&c.agent),
            Command::CordonAgent(c) => agent(&c.agent),
            Command::UncordonAgent(c) => agent(&c.agent),
            Command::GarbageReport(c) => agent(&c.agent),
            Command::ReportDestroyed(c) => agent(&c.agent),
            Command::DriverStatus(c) => agent(&c.agent),
            Command::DefinePool(c) => pool(&c.pool),
            Command::UpdatePool(c) => pool(&c.pool),
            Command::DeletePool(c) => pool(&c.pool),
            Command::SetPartitionSettings(c) => c.key.clone(),
            Command::Register(c) => agent(&c.agent),
            Command::Heartbeat(c) => agent(&c.agent),
            Command::ReportCreated(c) => agent(&c.agent),
            Command::Sync(c) => agent(&c.agent),
            Command::ResyncChunk(c) => agent(&c.agent),
            Command::ReportFailure(c) => agent(&c.agent),
            Command::HealthResult(c) => agent(&c.agent),
            Command::ExpireLease(c) => agent(&c.agent),
            Command::WaitTimeout(c) => agent(&c.agent),
            Command::CreateTimeout(c) => agent(&c.agent),
            Command::ExpirePause(c) => agent(&c.agent),
            Command::MarkStalled(c) => agent(&c.agent),
            Command::MarkGone(c) => agent(&c.agent),
            Command::Orphan(c) => agent(&c.agent),
            Command::RequestHealthCheck(c) => agent(&c.agent),
            Command::Claim(c) => pool(&c.pool),
            Command::BindClaim(c) => agent(&c.holder.agent),
            Command::Free(c) => pool(&c.pool),
            Command::TickPool(c) => pool(&c.pool),
            Command::Cascade(c) => agent(&c.child.agent),
            Command::Adopt(c) => agent(&c.parent.agent),
            Command::Place(c) => Key::Placement(c.resource),
            Command::CancelPlacement(c) => Key::Placement(c.resource),
            Command::DrainAgent(c) => agent(&c.agent),
            Command::Reserve(c) => agent(&c.agent),
            Command::BindPlacement(c) => Key::Placement(c.resource),
            Command::CommitPlacement(c) => agent(&c.allocation.agent),
            Command::CancelReservation(c) => agent(&c.agent),
            Command::Unplaceable(c) => Key::Placement(c.resource),
            Command::DrainRelease(c) => agent(&c.agent),
            Command::ClosePlacement(c) => Key::Placement(c.resource),
            Command::FreeOrphan(c) => agent(&c.agent),
            Command::SetQuota(c) => c.key.clone(),
            Command::OverQuota(c) => agent(&c.holder.agent),
        }
    }

    /// True for what a producer bound to a principal may send (`op@<principal>` subjects): its own allocations,
    /// placements and leases and what it does to resources (not a resource's `max_lease`). Pools, policy, quotas and agents are the operator's.
    pub fn is_producer_request(&self) -> bool {
        matches!(
            self,
            Command::Allocate(_)
                | Command::Place(_)
                | Command::CancelPlacement(_)
                | Command::Acquire(_)
                | Command::Renew(_)
                | Command::ReleaseLease(_)
                | Command::Release(_)
                | Command::Pause(_)
                | Command::Unpause(_)
        ) || matches!(self, Command::Update(c) if c.max_lease.is_none())
    }

    /// The resource or lease this command is about, for its subject: a resource's command history is one filter.
    pub fn subject_id(&self) -> SubjectId {
        use SubjectId::{Lease, None, Resource};
        match self {
            Command::Allocate(c) => Resource(c.resource),
            Command::Acquire(c) => Lease(c.lease),
            Command::Renew(c) => Lease(c.lease),
            Command::ReleaseLease(c) => Lease(c.lease),
            Command::Release(c) => Resource(c.resource),
            Command::Pause(c) => Resource(c.resource),
            Command::Unpause(c) => Resource(c.resource),
            Command::Update(c) => Resource(c.resource),
            Command::ReportFailureByOperator(c) => Resource(c.resource),
            Command::ReportCreated(c) => Resource(c.resource),
            Command::ReportFailure(c) => Resource(c.resource),
            Command::HealthResult(c) => Resource(c.resource),
            Command::ReportDestroyed(c) => Resource(c.resource),
            Command::ExpireLease(c) => Lease(c.lease),
            Command::WaitTimeout(c) => Lease(c.lease),
            Command::CreateTimeout(c) => Resource(c.resource),
            Command::ExpirePause(c) => Resource(c.resource),
            Command::Orphan(c) => Resource(c.resource),
            Command::RequestHealthCheck(c) => Resource(c.resource),
            Command::Claim(c) => Resource(c.holder.resource),
            Command::BindClaim(c) => Resource(c.holder.resource),
            Command::Free(c) => Resource(c.holder.resource),
            Command::Cascade(c) => Resource(c.child.resource),
            Command::Adopt(c) => Resource(c.parent.resource),
            Command::Place(c) => Resource(c.resource),
            Command::CancelPlacement(c) => Resource(c.resource),
            Command::Reserve(c) => Resource(c.resource),
            Command::BindPlacement(c) => Resource(c.resource),
            Command::CommitPlacement(c) => Resource(c.allocation.resource),
            Command::CancelReservation(c) => Resource(c.resource),
            Command::Unplaceable(c) => Resource(c.resource),
            Command::DrainRelease(c) => Resource(c.resource),
            Command::ClosePlacement(c) => Resource(c.resource),
            Command::FreeOrphan(c) => Resource(c.resource),
            Command::OverQuota(c) => Resource(c.holder.resource),
            Command::DrainAgent(_)
            | Command::SetQuota(_)
            | Command::RetireAgent(_)
            | Command::UnretireAgent(_)
            | Command::CordonAgent(_)
            | Command::UncordonAgent(_)
            | Command::GarbageReport(_)
            | Command::DriverStatus(_)
            | Command::ConfirmLoss(_)
            | Command::DefinePool(_)
            | Command::UpdatePool(_)
            | Command::DeletePool(_)
            | Command::SetPartitionSettings(_)
            | Command::Register(_)
            | Command::Heartbeat(_)
            | Command::Sync(_)
            | Command::ResyncChunk(_)
            | Command::MarkStalled(_)
            | Command::MarkGone(_)
            | Command::TickPool(_) => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Bodies of older schema versions, read into today's types.

pub(crate) mod legacy {
    //! The bodies whose layout changed since schema version 1, as version 1 wrote them. A command keeps the schema
    //! version it was written in, so a log written by an older leasehold decodes as it was written, into today's
    //! types (the fields added since take their "not given" value). Bodies that did not change decode as they are.

    use super::*;

    /// Version 1 of `op.allocate`: no `wait`.
    #[derive(Serialize, Deserialize)]
    struct AllocateV1 {
        agent: AgentName,
        resource: ResourceId,
        kind: String,
        capacity: u32,
        attributes: BTreeMap<String, String>,
        parent: Option<ResourceRef>,
        pools: Vec<PoolName>,
    }

    /// Version 1 of `op.set-partition-settings`: no `gc`.
    #[derive(Serialize, Deserialize)]
    struct SetPartitionSettingsV1 {
        key: Key,
        partition: u32,
        outcome_horizon: Option<Millis>,
        policy: Option<ClusterPolicy>,
        if_no_policy: bool,
    }

    /// Versions 2 to 4 of `op.set-partition-settings`: no `max_priority`.
    #[derive(Serialize, Deserialize)]
    struct SetPartitionSettingsV2 {
        key: Key,
        partition: u32,
        outcome_horizon: Option<Millis>,
        policy: Option<ClusterPolicy>,
        if_no_policy: bool,
        gc: Option<GcMode>,
    }

    /// Versions 1 to 4 of `op.acquire`: no `priority`.
    #[derive(Serialize, Deserialize)]
    struct AcquireV1 {
        agent: AgentName,
        resource: ResourceId,
        lease: LeaseId,
        holder: String,
        ttl: Option<Millis>,
        wait_timeout: Option<Millis>,
    }

    /// Versions 1 to 4 of `op.update`: no `max_lease`.
    #[derive(Serialize, Deserialize)]
    struct UpdateV1 {
        agent: AgentName,
        resource: ResourceId,
        set: BTreeMap<String, String>,
        remove: Vec<String>,
        capacity: Option<u32>,
    }

    /// Versions 1 and 2 of `agent.register`: no `labels`, no `capacity`.
    #[derive(Serialize, Deserialize)]
    struct RegisterV1 {
        agent: AgentName,
        incarnation: Uuid,
        wiped: bool,
        settings: Option<AgentSettings>,
    }

    /// Versions 1 to 3 of `op.retire-agent`: no `only_if_unleased`.
    #[derive(Serialize, Deserialize)]
    struct RetireAgentV1 {
        agent: AgentName,
    }

    /// Versions 1 to 4 of `op.define-pool`: no `orphans`.
    #[derive(Serialize, Deserialize)]
    struct DefinePoolV1 {
        pool: PoolName,
        kind: PoolKind,
        cooldown: Option<Millis>,
    }

    /// Versions 1 to 4 of `op.update-pool`: no `orphans`.
    #[derive(Serialize, Deserialize)]
    struct UpdatePoolV1 {
        pool: PoolName,
        kind: PoolKind,
        cooldown: Option<Millis>,
    }

    /// Versions 1 to 4 of `sys.free`: no `cause`.
    #[derive(Serialize, Deserialize)]
    struct FreeV1 {
        pool: PoolName,
        holder: ResourceRef,
        token: Option<Position>,
        source: Source,
    }

    /// Versions 4 and 5 of `sys.commit-placement`: no `principal`.
    #[derive(Serialize, Deserialize)]
    struct CommitPlacementV4 {
        allocation: Allocate,
        token: Position,
        source: Source,
    }

    /// Versions 3 and 4 of `sys.bind-claim`: no `orphans`.
    #[derive(Serialize, Deserialize)]
    struct BindClaimV3 {
        holder: ResourceRef,
        pool: PoolName,
        value: PoolValue,
        token: Position,
        source: Source,
        wanted: Source,
        definition: Option<PoolKind>,
    }

    /// Versions 1 and 2 of `sys.bind-claim`: no `definition`.
    #[derive(Serialize, Deserialize)]
    struct BindClaimV1 {
        holder: ResourceRef,
        pool: PoolName,
        value: PoolValue,
        token: Position,
        source: Source,
        wanted: Source,
    }

    /// The oldest schema version that expresses `command`: a command is written in it, so a leasehold that does not
    /// know a later version still reads everything that does not need one (agents and producers can be upgraded
    /// before the workers). 6 for `op.set-quota`, `sys.over-quota` and a commit that names its placement's
    /// principal; 5 for `sys.close-placement`, `op.free-orphan` and bodies that use a field added in version
    /// 5 (a pool's orphan policy, a free's cause, an acquire's priority, an update's `max_lease`, settings'
    /// `max_priority`), 4 for the commands added in version 4 (placement and drain) and a retirement with a
    /// condition, 3 for bodies that use a field or variant added in version 3, 2 for the commands added in version 2
    /// and for bodies that use a field or variant added then; 1 otherwise.
    pub(crate) fn oldest_version(command: &Command) -> u16 {
        let needs_six = match command {
            Command::SetQuota(_) | Command::OverQuota(_) => true,
            Command::CommitPlacement(c) => c.principal.is_some(),
            _ => false,
        };
        if needs_six {
            return 6;
        }
        let needs_five = match command {
            Command::ClosePlacement(_) | Command::FreeOrphan(_) => true,
            Command::DefinePool(c) => c.orphans != OrphanPolicy::Release,
            Command::UpdatePool(c) => c.orphans.is_some(),
            Command::BindClaim(c) => c.orphans != OrphanPolicy::Release,
            Command::Free(c) => c.cause != FreeCause::Released {},
            Command::Acquire(c) => c.priority != 0,
            Command::Update(c) => c.max_lease.is_some(),
            Command::SetPartitionSettings(c) => c.max_priority.is_some(),
            _ => false,
        };
        if needs_five {
            return 5;
        }
        let needs_four = match command {
            Command::Place(_)
            | Command::CancelPlacement(_)
            | Command::DrainAgent(_)
            | Command::Reserve(_)
            | Command::BindPlacement(_)
            | Command::CommitPlacement(_)
            | Command::CancelReservation(_)
            | Command::Unplaceable(_)
            | Command::DrainRelease(_) => true,
            Command::RetireAgent(c) => c.only_if_unleased,
            _ => false,
        };
        if needs_four {
            return 4;
        }
        let needs_three = match command {
            Command::CordonAgent(_) | Command::UncordonAgent(_) => true,
            Command::Register(c) => !c.labels.is_empty() || !c.capacity.is_empty(),
            Command::BindClaim(c) => c.definition.is_some(),
            Command::ReportFailure(c) => c.failure == FailureKind::DestroyBlocked,
            _ => false,
        };
        if needs_three {
            return 3;
        }
        let needs_two = match command {
            Command::UnretireAgent(_)
            | Command::GarbageReport(_)
            | Command::ReportDestroyed(_)
            | Command::DriverStatus(_) => true,
            Command::Allocate(c) => c.wait.is_some(),
            Command::SetPartitionSettings(c) => c.gc.is_some(),
            Command::Cascade(c) => c.parent_state == ParentState::Absent,
            _ => false,
        };
        if needs_two { 2 } else { 1 }
    }

    /// Encodes the body of `command` in the layout of `version` (from [`oldest_version`]).
    pub(crate) fn encode_body(
        version: u16,
        command: &Command,
        out: &mut impl std::io::Write,
    ) -> Result<(), crate::codec::CodecError> {
        if version < oldest_version(command) {
            return Err(crate::codec::CodecError::new(
                crate::codec::CodecErrorKind::Encode,
                format!(
                    "{} as it is needs schema version {}, not {version}",
                    command.type_name(),
                    oldest_version(command)
                ),
            ));
        }
        match (version, command) {
            (4 | 5, Command::CommitPlacement(c)) => crate::codec::encode_into(
                &CommitPlacementV4 { allocation: c.allocation.clone(), token: c.token, source: c.source },
                out,
            ),
            (1..=4, Command::DefinePool(c)) => crate::codec::encode_into(
                &DefinePoolV1 { pool: c.pool.clone(), kind: c.kind.clone(), cooldown: c.cooldown },
                out,
            ),
            (1..=4, Command::UpdatePool(c)) => crate::codec::encode_into(
                &UpdatePoolV1 { pool: c.pool.clone(), kind: c.kind.clone(), cooldown: c.cooldown },
                out,
            ),
            (1..=4, Command::Free(c)) => crate::codec::encode_into(
                &FreeV1 { pool: c.pool.clone(), holder: c.holder.clone(), token: c.token, source: c.source },
                out,
            ),
            (3 | 4, Command::BindClaim(c)) => {
                let v3 = BindClaimV3 {
                    holder: c.holder.clone(),
                    pool: c.pool.clone(),
                    value: c.value,
                    token: c.token,
                    source: c.source,
                    wanted: c.wanted,
                    definition: c.definition.clone(),
                };
                crate::codec::encode_into(&v3, out)
            }
            (1..=4, Command::Acquire(c)) => {
                let v1 = AcquireV1 {
                    agent: c.agent.clone(),
                    resource: c.resource,
                    lease: c.lease,
                    holder: c.holder.clone(),
                    ttl: c.ttl,
                    wait_timeout: c.wait_timeout,
                };
                crate::codec::encode_into(&v1, out)
            }
            (1..=4, Command::Update(c)) => {
                let v1 = UpdateV1 {
                    agent: c.agent.clone(),
                    resource: c.resource,
                    set: c.set.clone(),
                    remove: c.remove.clone(),
                    capacity: c.capacity,
                };
                crate::codec::encode_into(&v1, out)
            }
            (2..=4, Command::SetPartitionSettings(c)) => {
                let v2 = SetPartitionSettingsV2 {
                    key: c.key.clone(),
                    partition: c.partition,
                    outcome_horizon: c.outcome_horizon,
                    policy: c.policy.clone(),
                    if_no_policy: c.if_no_policy,
                    gc: c.gc,
                };
                crate::codec::encode_into(&v2, out)
            }
            (1..=3, Command::RetireAgent(c)) => {
                crate::codec::encode_into(&RetireAgentV1 { agent: c.agent.clone() }, out)
            }
            (1, Command::Allocate(c)) => {
                let v1 = AllocateV1 {
                    agent: c.agent.clone(),
                    resource: c.resource,
                    kind: c.kind.clone(),
                    capacity: c.capacity,
                    attributes: c.attributes.clone(),
                    parent: c.parent.clone(),
                    pools: c.pools.clone(),
                };
                crate::codec::encode_into(&v1, out)
            }
            (1 | 2, Command::Register(c)) => {
                let v1 = RegisterV1 {
                    agent: c.agent.clone(),
                    incarnation: c.incarnation,
                    wiped: c.wiped,
                    settings: c.settings.clone(),
                };
                crate::codec::encode_into(&v1, out)
            }
            (1 | 2, Command::BindClaim(c)) => {
                let v1 = BindClaimV1 {
                    holder: c.holder.clone(),
                    pool: c.pool.clone(),
                    value: c.value,
                    token: c.token,
                    source: c.source,
                    wanted: c.wanted,
                };
                crate::codec::encode_into(&v1, out)
            }
            (1, Command::SetPartitionSettings(c)) => {
                let v1 = SetPartitionSettingsV1 {
                    key: c.key.clone(),
                    partition: c.partition,
                    outcome_horizon: c.outcome_horizon,
                    policy: c.policy.clone(),
                    if_no_policy: c.if_no_policy,
                };
                crate::codec::encode_into(&v1, out)
            }
            _ => command.encode_body(out),
        }
    }

    /// The body of `type_name` as `version` wrote it, when that layout differs from today's; `None`: decode it as
    /// today's.
    pub(crate) fn decode_body(
        version: u16,
        type_name: &str,
        bytes: &[u8],
    ) -> Option<Result<(Command, usize), crate::codec::CodecError>> {
        if version >= 6 {
            return None;
        }
        if type_name == "sys.commit-placement" {
            let decoded = crate::codec::decode_from::<CommitPlacementV4>(bytes).map(|(v4, read)| {
                let body =
                    CommitPlacement { allocation: v4.allocation, token: v4.token, source: v4.source, principal: None };
                (Command::CommitPlacement(body), read)
            });
            return Some(decoded);
        }
        if version >= 5 {
            return None;
        }
        match type_name {
            "op.define-pool" => {
                let decoded = crate::codec::decode_from::<DefinePoolV1>(bytes).map(|(v1, read)| {
                    let body = DefinePool {
                        pool: v1.pool,
                        kind: v1.kind,
                        cooldown: v1.cooldown,
                        orphans: OrphanPolicy::Release,
                    };
                    (Command::DefinePool(body), read)
                });
                return Some(decoded);
            }
            "op.update-pool" => {
                let decoded = crate::codec::decode_from::<UpdatePoolV1>(bytes).map(|(v1, read)| {
                    let body = UpdatePool { pool: v1.pool, kind: v1.kind, cooldown: v1.cooldown, orphans: None };
                    (Command::UpdatePool(body), read)
                });
                return Some(decoded);
            }
            "sys.free" => {
                let decoded = crate::codec::decode_from::<FreeV1>(bytes).map(|(v1, read)| {
                    let body = Free {
                        pool: v1.pool,
                        holder: v1.holder,
                        token: v1.token,
                        source: v1.source,
                        cause: FreeCause::Released {},
                    };
                    (Command::Free(body), read)
                });
                return Some(decoded);
            }
            "sys.bind-claim" if version >= 3 => {
                let decoded = crate::codec::decode_from::<BindClaimV3>(bytes).map(|(v3, read)| {
                    let body = BindClaim {
                        holder: v3.holder,
                        pool: v3.pool,
                        value: v3.value,
                        token: v3.token,
                        source: v3.source,
                        wanted: v3.wanted,
                        definition: v3.definition,
                        orphans: OrphanPolicy::Release,
                    };
                    (Command::BindClaim(body), read)
                });
                return Some(decoded);
            }
            "op.acquire" => {
                let decoded = crate::codec::decode_from::<AcquireV1>(bytes).map(|(v1, read)| {
                    let body = Acquire {
                        agent: v1.agent,
                        resource: v1.resource,
                        lease: v1.lease,
                        holder: v1.holder,
                        ttl: v1.ttl,
                        wait_timeout: v1.wait_timeout,
                        priority: 0,
                    };
                    (Command::Acquire(body), read)
                });
                return Some(decoded);
            }
            "op.update" => {
                let decoded = crate::codec::decode_from::<UpdateV1>(bytes).map(|(v1, read)| {
                    let body = Update {
                        agent: v1.agent,
                        resource: v1.resource,
                        set: v1.set,
                        remove: v1.remove,
                        capacity: v1.capacity,
                        max_lease: None,
                    };
                    (Command::Update(body), read)
                });
                return Some(decoded);
            }
            "op.set-partition-settings" if version >= 2 => {
                let decoded = crate::codec::decode_from::<SetPartitionSettingsV2>(bytes).map(|(v2, read)| {
                    let body = SetPartitionSettings {
                        key: v2.key,
                        partition: v2.partition,
                        outcome_horizon: v2.outcome_horizon,
                        policy: v2.policy,
                        if_no_policy: v2.if_no_policy,
                        gc: v2.gc,
                        max_priority: None,
                    };
                    (Command::SetPartitionSettings(body), read)
                });
                return Some(decoded);
            }
            _ => {}
        }
        if version >= 4 {
            return None;
        }
        if type_name == "op.retire-agent" {
            let decoded = crate::codec::decode_from::<RetireAgentV1>(bytes)
                .map(|(v1, read)| (Command::RetireAgent(RetireAgent::new(v1.agent)), read));
            return Some(decoded);
        }
        if version >= 3 {
            return None;
        }
        if type_name == "agent.register" {
            let decoded = crate::codec::decode_from::<RegisterV1>(bytes).map(|(v1, read)| {
                let body = Register {
                    agent: v1.agent,
                    incarnation: v1.incarnation,
                    wiped: v1.wiped,
                    settings: v1.settings,
                    labels: BTreeMap::new(),
                    capacity: BTreeMap::new(),
                };
                (Command::Register(body), read)
            });
            return Some(decoded);
        }
        if type_name == "sys.bind-claim" {
            let decoded = crate::codec::decode_from::<BindClaimV1>(bytes).map(|(v1, read)| {
                let body = BindClaim {
                    holder: v1.holder,
                    pool: v1.pool,
                    value: v1.value,
                    token: v1.token,
                    source: v1.source,
                    wanted: v1.wanted,
                    definition: None,
                    orphans: OrphanPolicy::Release,
                };
                (Command::BindClaim(body), read)
            });
            return Some(decoded);
        }
        if version >= 2 {
            return None;
        }
        let decoded = match type_name {
            "op.allocate" => crate::codec::decode_from::<AllocateV1>(bytes).map(|(v1, read)| {
                let body = Allocate {
                    agent: v1.agent,
                    resource: v1.resource,
                    kind: v1.kind,
                    capacity: v1.capacity,
                    attributes: v1.attributes,
                    parent: v1.parent,
                    pools: v1.pools,
                    wait: None,
                };
                (Command::Allocate(body), read)
            }),
            "op.set-partition-settings" => {
                crate::codec::decode_from::<SetPartitionSettingsV1>(bytes).map(|(v1, read)| {
                    let body = SetPartitionSettings {
                        key: v1.key,
                        partition: v1.partition,
                        outcome_horizon: v1.outcome_horizon,
                        policy: v1.policy,
                        if_no_policy: v1.if_no_policy,
                        gc: None,
                        max_priority: None,
                    };
                    (Command::SetPartitionSettings(body), read)
                })
            }
            _ => return None,
        };
        Some(decoded)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The digest of an agent's listing.

/// An order-independent digest of a set of handles: the wrapping sum of a 64-bit mix of each id. The agent computes
/// it over the handles of its assignment set that it holds (present or in flight); the writer keeps the same sum
/// of what it believes the agent holds, so a drift the difference reports missed shows as a mismatch.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandleDigest(pub u64);

impl HandleDigest {
    fn mix(id: ResourceId) -> u64 {
        let bits = id.as_uuid().as_u128();
        let mut z = (bits as u64) ^ ((bits >> 64) as u64).rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn add(&mut self, id: ResourceId) {
        self.0 = self.0.wrapping_add(Self::mix(id));
    }

    pub fn remove(&mut self, id: ResourceId) {
        self.0 = self.0.wrapping_sub(Self::mix(id));
    }

    pub fn of<'a>(ids: impl IntoIterator<Item = &'a ResourceId>) -> HandleDigest {
        let mut digest = HandleDigest::default();
        for id in ids {
            digest.add(*id);
        }
        digest
    }
}

impl fmt::Display for HandleDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for HandleDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "digest({self})")
    }
}

/// In JSON a digest is 16 hex digits (a JSON number would lose bits in JavaScript); in bincode, a `u64`.
impl Serialize for HandleDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() { serializer.collect_str(self) } else { serializer.serialize_u64(self.0) }
    }
}

impl<'de> Deserialize<'de> for HandleDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            let well_formed =
                text.len() == 16 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            well_formed
                .then(|| u64::from_str_radix(&text, 16).ok())
                .flatten()
                .map(HandleDigest)
                .ok_or_else(|| serde::de::Error::custom(format!("digest {text:?} is not 16 lowercase hex digits")))
        } else {
            u64::deserialize(deserializer).map(HandleDigest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_order_independent_and_removable() {
        let a = ResourceId::from_parts(1, [1; 10]);
        let b = ResourceId::from_parts(2, [2; 10]);
        let ab = HandleDigest::of([&a, &b]);
        assert_eq!(ab, HandleDigest::of([&b, &a]));
        let mut d = ab;
        d.remove(b);
        assert_eq!(d, HandleDigest::of([&a]));
        assert_ne!(HandleDigest::of([&a]), HandleDigest::of([&b]));
    }

    #[test]
    fn type_names_are_unique_and_prefixed_by_class() {
        let mut seen = std::collections::BTreeSet::new();
        for name in Command::TYPE_NAMES {
            assert!(seen.insert(*name), "duplicate type name {name}");
            let class = name.split('.').next().unwrap();
            assert!(["op", "agent", "sys"].contains(&class), "{name}");
        }
    }

    #[test]
    fn chunk_ranges_are_half_open() {
        let lo = ResourceId::from_parts(10, [0; 10]);
        let hi = ResourceId::from_parts(20, [0; 10]);
        let chunk = ResyncChunk {
            agent: AgentName::new("w1").unwrap(),
            epoch: Position(1),
            obs: 1,
            watermark: Position(1),
            lo: lo.as_uuid(),
            hi: Some(hi.as_uuid()),
            held: vec![],
            in_flight: vec![],
        };
        assert!(chunk.covers(lo));
        assert!(!chunk.covers(hi));
        assert!(chunk.covers(ResourceId::from_parts(15, [9; 10])));
    }
}
