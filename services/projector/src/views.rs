//! The records of the read models, in JSON: what `GET /v1/...` and the CLI show. Each is made from the partition
//! state the projector folds (the domain's own fold, so a read model can never disagree with the writer's view), as
//! of the outcome that last touched it. One part is followed from the outcomes instead: a lost resource's quarantined
//! handle ([`QuarantineView`]), which the state forgets once the handle is ordered destroyed, and whose resource
//! record may be forgotten from the state before its handle comes back.

use std::collections::BTreeMap;

use leasehold_domain::PartitionState;
use leasehold_domain::state::{
    Agent, ClaimSlot, Holding, Lease, LeaseState, Placement, PlacementState, Pool, Resource, ResourceState,
};
use leasehold_schemas::Outcome;
use leasehold_schemas::ids::{ResourceId, Timestamp};
use leasehold_schemas::outcome::{Effect, FreeCause, GarbageCause};
use leasehold_schemas::settings::{ClusterPolicy, GcMode};
use serde::{Deserialize, Serialize};

/// A resource as the log last decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceView {
    /// `<agent>.<id>`
    #[serde(rename = "ref")]
    pub reference: String,
    pub agent: String,
    pub id: String,
    pub kind: String,
    pub capacity: u32,
    #[serde(rename = "attrs")]
    pub attributes: BTreeMap<String, String>,
    pub parent: Option<String>,
    pub upstream_suspect: bool,
    /// `pending`, `active`, `paused`, `suspect`, `releasing`, `destroyed`, `lost`, `orphaned`, `failed`.
    pub state: String,
    /// Why it is in that state: a pause, a suspicion, a release; and for every terminal state its reason —
    /// `destroyed`: `{"release": <the release cause it answered, or null>, "confirmed_by": <its agent>}`; `lost`:
    /// `{"found_missing_by": <its agent>, "observation": {"epoch", "obs"}}`; `orphaned`: `{"agent_gone_at": <unix
    /// ms or null>, "freed_because": "its holder's agent w1 was declared gone at <time>"}`; `failed`: the driver's
    /// error, as a string.
    pub detail: Option<serde_json::Value>,
    /// Log time of its allocation (unix ms).
    pub allocated_at: u64,
    pub native_id: Option<String>,
    pub claims: Vec<ClaimView>,
    /// Live leases (waiting or active), first come first.
    pub leases: Vec<LeaseBrief>,
    pub terminal_at: Option<u64>,
    /// For a `lost` resource whose handle came back on its agent's machine: the quarantine of that handle.
    pub quarantined: Option<QuarantineView>,
    /// For a `releasing` resource: why its agent could not finish the destroy yet (something else uses it), as last
    /// reported (`destroy-blocked`). Followed from the outcomes, like `quarantined`.
    #[serde(default)]
    pub destroy_blocked: Option<DestroyBlockedView>,
    /// Log time it entered its current state (unix ms). Followed from the outcomes; `null` in records written before
    /// it was kept.
    #[serde(default)]
    pub state_since: Option<u64>,
    /// For a state that waits on something: on what, and since when. Worked out when the record is read (the
    /// gateway's `GET /v1/resources/{ref}`), from the record and its agent's as they are then: never stored.
    #[serde(default)]
    pub waiting_on: Option<WaitingOn>,
    /// While it is live and holds no lease: since when (its allocation, or the end of its last lease), log time in
    /// unix ms. What a drain's grace counts from.
    #[serde(default)]
    pub idle_since: Option<u64>,
    /// The longest a lease may be held (from its grant) while others wait, in ms; `null`: no limit.
    #[serde(default)]
    pub max_lease_ms: Option<u64>,
    /// The outcome sequence that allocated it.
    pub created_seq: u64,
    /// Log time of the outcome this record is as of (unix ms).
    pub updated_at: u64,
    /// The outcome sequence this record is as of.
    pub as_of: u64,
}

/// The handle of a `lost` resource found on its agent's machine again (`handle-reappeared`): quarantined, untouched
/// by the agent, until a release of the lost resource orders it destroyed (`garbage-destroy-ordered`) and the agent
/// reports it destroyed (`garbage-destroyed`). Followed from the outcomes, since the partition state keeps only the
/// part still pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineView {
    /// The position of `handle-reappeared`.
    pub position: u64,
    /// Log time it was found (unix ms).
    pub found_at: u64,
    /// The position of the `garbage-destroy-ordered` a release of the lost resource made; `null` while quarantined.
    pub destroy_ordered: Option<u64>,
    /// Who released it (the issuer of that release), and why.
    pub released_by: Option<String>,
    pub reason: Option<String>,
    /// Log time its agent reported the handle destroyed (unix ms).
    pub destroyed_at: Option<u64>,
}

impl QuarantineView {
    /// `previous` followed through what `outcome` says of resource `id`'s handle.
    pub fn follow(previous: Option<QuarantineView>, outcome: &Outcome, id: ResourceId) -> Option<QuarantineView> {
        let mut current = previous;
        for (position, effect) in outcome.positioned_effects() {
            match effect {
                Effect::HandleReappeared { resource, .. } if *resource == id => {
                    current = Some(QuarantineView {
                        position: position.0,
                        found_at: outcome.decided_at.0,
                        destroy_ordered: None,
                        released_by: None,
                        reason: None,
                        destroyed_at: None,
                    });
                }
                Effect::GarbageDestroyOrdered { handle, cause } if *handle == id => {
                    if let Some(q) = current.as_mut() {
                        q.destroy_ordered = Some(position.0);
                        if let GarbageCause::Released { by, reason } = cause {
                            q.released_by = Some(by.to_string());
                            q.reason = reason.clone();
                        }
                    }
                }
                Effect::GarbageDestroyed { handle, .. } if *handle == id => {
                    if let Some(q) = current.as_mut().filter(|q| q.destroy_ordered.is_some()) {
                        q.destroyed_at = Some(outcome.decided_at.0);
                    }
                }
                _ => {}
            }
        }
        current
    }

    /// True while the handle is on the machine and nothing has ordered it destroyed.
    pub fn is_pending(&self) -> bool {
        self.destroy_ordered.is_none()
    }
}

/// What a resource in a waiting state waits on, in words, and since when (log time, unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingOn {
    pub on: String,
    pub since: Option<u64>,
}

impl WaitingOn {
    /// What `resource` waits on, with `agent` (its agent's record, if any) as it is now: `None` for a state that waits
    /// on nothing (active, or ended).
    pub fn of(resource: &ResourceView, agent: Option<&AgentView>) -> Option<WaitingOn> {
        let waiting = WaitingOn::of_state(resource, agent);
        let Some(drained) = drain_clause(resource, agent) else {
            return waiting;
        };
        Some(match waiting {
            Some(WaitingOn { on, since }) => WaitingOn { on: format!("{on}; {drained}"), since },
            None => WaitingOn { on: drained, since: agent.and_then(|a| a.drain.as_ref()).map(|d| d.since) },
        })
    }

    fn of_state(resource: &ResourceView, agent: Option<&AgentView>) -> Option<WaitingOn> {
        let name = &resource.agent;
        let on = match resource.state.as_str() {
            "pending" => {
                let wanted: Vec<&str> =
                    resource.claims.iter().filter(|c| c.status == "wanted").map(|c| c.pool.as_str()).collect();
                if wanted.is_empty() {
                    format!("waiting for {name} to create it{}", agent_clause(name, agent))
                } else {
                    format!("waiting for an identifier of pool {}", wanted.join(", pool "))
                }
            }
            "releasing" => {
                let blocked =
                    resource.destroy_blocked.as_ref().map(|b| format!(" (it says: {})", b.detail)).unwrap_or_default();
                format!("waiting for {name} to confirm the destroy{blocked}{}", agent_clause(name, agent))
            }
            "suspect" => format!("waiting for its health check on {name}{}", agent_clause(name, agent)),
            "paused" => {
                let until = resource.detail.as_ref().and_then(|d| d.get("until")).and_then(|u| u.as_u64());
                match until {
                    Some(until) => format!("paused: waiting for an unpause, or until {}", Timestamp(until)),
                    None => "paused: waiting for an unpause".to_owned(),
                }
            }
            // Since the parent turned suspect, which the record does not keep: no time is given.
            "active" if resource.upstream_suspect => {
                let on =
                    format!("new leases wait: its parent {} is suspect", resource.parent.as_deref().unwrap_or("?"));
                return Some(WaitingOn { on, since: None });
            }
            _ => return None,
        };
        Some(WaitingOn { on, since: resource.state_since })
    }
}

/// When a live resource of a draining agent is released, as its record and its agent's say now.
fn drain_clause(resource: &ResourceView, agent: Option<&AgentView>) -> Option<String> {
    let drain = agent?.drain.as_ref()?;
    if !matches!(resource.state.as_str(), "pending" | "active" | "paused" | "suspect") {
        return None;
    }
    let grace = leasehold_schemas::Millis(drain.grace_ms);
    let idle_due = resource
        .leases
        .is_empty()
        .then(|| Timestamp(resource.idle_since.unwrap_or(drain.since).max(drain.since)).saturating_add(grace));
    let deadline = drain.deadline.map(Timestamp);
    let when = match (idle_due, deadline) {
        (Some(idle), Some(deadline)) if deadline < idle => format!("released at the drain's deadline {deadline}"),
        (Some(idle), _) => format!("released at {idle}, once it has held no lease for {grace}"),
        (None, Some(deadline)) => format!(
            "released once its leases end and it has held none for {grace}, or at the drain's deadline {deadline}"
        ),
        (None, None) => format!("released once its leases end and it has held none for {grace}"),
    };
    Some(format!("its agent {} drains: {when}", resource.agent))
}

/// What the agent's record says of it, for a resource that waits on it: when it was last heard from and how it is,
/// when that is not plainly live.
fn agent_clause(name: &str, agent: Option<&AgentView>) -> String {
    let Some(agent) = agent else {
        return format!("; {name} has never registered");
    };
    let mut trouble = Vec::new();
    if agent.status != "live" {
        trouble.push(agent.status.clone());
    }
    if let Some(detail) = &agent.driver.detail {
        trouble.push(format!("its driver is unavailable: {detail}"));
    }
    let trouble = if trouble.is_empty() { String::new() } else { format!(", {}", trouble.join(", ")) };
    format!("; {name} last heard from {}{trouble}", Timestamp(agent.last_seen))
}

/// Why a releasing resource's destroy has not finished: what its agent last said (`destroy-blocked`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyBlockedView {
    pub detail: String,
    /// Log time it was reported (unix ms).
    pub at: u64,
}

impl DestroyBlockedView {
    /// `previous` followed through what `outcome` says of resource `id`, while it is `releasing` (`state`).
    pub fn follow(
        previous: Option<DestroyBlockedView>,
        outcome: &Outcome,
        id: ResourceId,
        state: &ResourceState,
    ) -> Option<DestroyBlockedView> {
        if !matches!(state, ResourceState::Releasing { .. }) {
            return None;
        }
        let reported = outcome.effects().iter().rev().find_map(|effect| match effect {
            Effect::DestroyBlocked { resource, detail } if *resource == id => {
                Some(DestroyBlockedView { detail: detail.clone(), at: outcome.decided_at.0 })
            }
            _ => None,
        });
        reported.or(previous)
    }
}

/// A live lease as its resource lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBrief {
    /// `<agent>.<lease id>`
    pub id: String,
    pub holder: String,
    pub state: String,
}

/// A resource's claim on one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimView {
    pub pool: String,
    /// `wanted` (waiting for the pool to grant an identifier), `bound`, `held-for-orphan` (an orphan keeps it: its
    /// pool holds an orphan's identifiers until its agent confirms the destroy or an operator frees it) or
    /// `returned`.
    pub status: String,
    /// The identifier held (an address, a slot), once bound.
    pub id: Option<String>,
    pub token: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// `<agent>.<lease id>`: what every lease command takes.
    pub id: String,
    /// `<agent>.<resource id>`
    pub resource: String,
    pub holder: String,
    /// `waiting`, `active`, `released`, `broken`, `expired`, `failed`.
    pub state: String,
    /// The lease token (the position of its grant), while active.
    pub token: Option<u64>,
    pub expires_at: Option<u64>,
    pub wait_until: Option<u64>,
    pub ttl_ms: Option<u64>,
    pub detail: Option<serde_json::Value>,
    pub terminal_at: Option<u64>,
    /// Its priority in the queue of a busy resource (0 unless it asked for more).
    #[serde(default)]
    pub priority: u8,
    /// The log time it asked (it waits from then; its effective priority ages from then).
    #[serde(default)]
    pub requested_at: u64,
    /// The position of its first effect: among waiters of equal effective priority, the earlier goes first.
    #[serde(default)]
    pub requested_pos: u64,
    #[serde(default)]
    pub granted_at: Option<u64>,
    pub as_of: u64,
}

/// A waiting lease's place in its resource's queue, as `leases` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePlace {
    /// 1 for the next to be granted.
    pub position: usize,
    /// Its priority plus one per `AGING_STEP` waited, at the `now` it was computed for.
    pub effective_priority: u64,
}

/// The places in the queue of the waiting leases among `leases` (of one or more resources), by lease id, at `now`
/// (ms): the order the writer grants them in if room is made at `now` (see `leasehold_domain::state::queue_order`).
pub fn queue_places(leases: &[LeaseView], now: u64) -> BTreeMap<String, QueuePlace> {
    let step = leasehold_domain::state::AGING_STEP.0;
    let effective = |l: &LeaseView| u64::from(l.priority) + now.saturating_sub(l.requested_at) / step;
    let mut by_resource: BTreeMap<&str, Vec<&LeaseView>> = BTreeMap::new();
    for lease in leases.iter().filter(|l| l.state == "waiting") {
        by_resource.entry(lease.resource.as_str()).or_default().push(lease);
    }
    let mut places = BTreeMap::new();
    for (_, mut queue) in by_resource {
        queue.sort_by_key(|l| (std::cmp::Reverse(effective(l)), l.requested_pos));
        for (n, lease) in queue.into_iter().enumerate() {
            places.insert(lease.id.clone(), QueuePlace { position: n + 1, effective_priority: effective(lease) });
        }
    }
    places
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentView {
    pub name: String,
    /// `live`, `stalled`, `gone`, `suspect`, `retired`.
    pub status: String,
    pub epoch: u64,
    pub incarnation: String,
    pub last_seen: u64,
    /// Resources in state (not yet forgotten), and those observed present and meant to exist.
    pub resources: u64,
    pub held: u64,
    /// The settings in force: its own, or its partition's policy (`own_settings` says which).
    pub settings: serde_json::Value,
    pub own_settings: bool,
    /// While the circuit breaker holds (status `suspect`): why.
    pub breaker: Option<BreakerView>,
    /// Retired by an operator (sticky until `agent unretire`), whatever `status` says (a gone agent reads `gone`).
    pub retired: bool,
    /// While it is `gone`: log time it was declared gone (unix ms).
    pub gone_at: Option<u64>,
    /// Whether its driver can list the machine's resources, and if not why (as the agent recorded it).
    pub driver: DriverView,
    /// Handles of `lost` resources on its machine, quarantined until a release orders them destroyed.
    pub quarantined: u64,
    /// Garbage handles ordered destroyed and not yet reported destroyed.
    pub garbage_orders: u64,
    /// While an operator has it cordoned (no new allocations): who, why and since when.
    #[serde(default)]
    pub cordon: Option<CordonView>,
    /// While it drains (it is cordoned too): who asked, why, since when, how, and how many resources are left.
    #[serde(default)]
    pub drain: Option<DrainView>,
    /// What it declared at registration: labels for placement, and how many resources of each kind it takes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub capacity: BTreeMap<String, u32>,
    /// Its resources from pending to releasing, by kind: what the capacity counts.
    #[serde(default)]
    pub used: BTreeMap<String, u32>,
    pub as_of: u64,
}

/// Who cordoned an agent, why, and since when (log time, unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CordonView {
    pub by: String,
    pub reason: Option<String>,
    pub since: u64,
}

/// An agent's drain: its resources are released once each has held no lease for `grace_ms` (counted from the later
/// of `since` and the resource's `idle_since`), and whatever is left at `deadline`. Log times in unix ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainView {
    pub by: String,
    pub reason: Option<String>,
    pub since: u64,
    pub deadline: Option<u64>,
    pub grace_ms: u64,
    /// Its resources not released yet (pending, active, paused or suspect): 0 once it is drained.
    pub left: u64,
}

/// An agent's driver as the agent last recorded it (`agent-driver-unavailable`, `agent-driver-available`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverView {
    pub available: bool,
    /// Why it cannot list (a root gone, unmounted, no longer naming its agent); `null` while available.
    pub detail: Option<String>,
}

/// Why an agent is suspect: the report that tripped its breaker would have lost `would_lose` of its `live`
/// resources; nothing was marked. `leasehold agent confirm-loss NAME` lets the losses through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerView {
    pub would_lose: u32,
    pub live: u32,
    /// Log time it tripped (unix ms).
    pub tripped_at: u64,
}

/// The cluster policy of one partition, and the key that routes `op.set-partition-settings` to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    pub partition: u32,
    /// The routing key of the partition's settings (`leasehold_schemas::subjects::settings_key`), as a subject token
    /// (`@lh-settings-3`).
    pub key: String,
    /// False while no policy was ever recorded: the partition follows the defaults.
    pub recorded: bool,
    pub policy: ClusterPolicy,
    pub outcome_horizon_ms: u64,
    /// What the partition's agents do with garbage: `destroy` (ordered on record) or `dry-run` (recorded only).
    #[serde(default)]
    pub gc: GcMode,
    /// The highest lease priority each issuer prefix may ask for (an issuer no prefix matches: 0).
    #[serde(default)]
    pub max_priority: BTreeMap<String, u8>,
    /// The quotas recorded in the partition, by name (`op.set-quota`): what each counts (`max` by kind, each
    /// counted by the pool `quota-<name>-<kind>`) and for whom.
    #[serde(default)]
    pub quotas: BTreeMap<String, QuotaView>,
    pub as_of: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaView {
    pub max: BTreeMap<String, u32>,
    pub principals: Vec<String>,
}

impl PolicyView {
    pub fn of(state: &PartitionState, as_of: u64) -> Self {
        let key = leasehold_schemas::subjects::settings_key(state.partition(), state.partitions());
        PolicyView {
            partition: state.partition(),
            key: key.token(),
            recorded: state.settings().policy.is_some(),
            policy: state.policy().clone(),
            outcome_horizon_ms: state.settings().outcome_horizon.0,
            gc: state.gc_mode(),
            max_priority: state.priority_caps().clone(),
            quotas: state
                .quotas()
                .iter()
                .map(|(name, quota)| {
                    let principals = quota.principals.iter().map(|p| p.as_str().to_owned()).collect();
                    (name.to_string(), QuotaView { max: quota.max.clone(), principals })
                })
                .collect(),
            as_of,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    pub name: String,
    pub kind: serde_json::Value,
    pub cooldown_ms: u64,
    /// What an orphaned holder's identifier does: `release` (freed at orphaning) or `hold`.
    pub orphans: String,
    pub held: u64,
    pub waiting: u64,
    /// Freed identifiers whose cool-down has not ended: as of `updated_at` in the projection; the gateway answers
    /// it as of its own clock ([`PoolView::at`]), since the record changes only when the pool's outcomes do.
    pub cooling: u64,
    /// When each of those cool-downs ends (unix ms, earliest first).
    pub cooling_until: Vec<u64>,
    /// The same cool-downs with their identifiers, earliest end first: what the operator's pool page lists. Empty in
    /// records written before it was kept (the projection is folded again when its layout changes).
    #[serde(default)]
    pub cooling_values: Vec<CoolingView>,
    /// The holders waiting for an identifier (`<agent>.<resource id>`), first come first: the order the pool grants
    /// them in.
    #[serde(default)]
    pub waiters: Vec<String>,
    /// Log time of the outcome this record is as of (unix ms).
    pub updated_at: u64,
    pub as_of: u64,
}

/// One freed identifier of a pool still cooling, and when its cool-down ends (unix ms): until then the pool does not
/// hand it out again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoolingView {
    pub value: String,
    pub until: u64,
}

/// A placement: an allocation that named no agent, and where it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementView {
    pub resource: String,
    pub kind: String,
    pub select: BTreeMap<String, String>,
    pub strategy: String,
    /// `seeking`, `waiting`, `placed`, `failed`, `cancelled`.
    pub state: String,
    /// Where it was placed (`placed`): the agent, and the resource's reference there.
    pub agent: Option<String>,
    pub reference: Option<String>,
    /// The agent's use of the kind with this resource, and its capacity for the kind (`placed`).
    pub used: Option<u32>,
    pub capacity: Option<u32>,
    /// What it waits on (`waiting`), why it failed (`failed`), or who cancelled it and why (`cancelled`).
    pub why: Option<String>,
    /// When it was asked for, when its state began, and how long it may wait for room (unix ms).
    pub asked_at: u64,
    pub since: u64,
    pub until: Option<u64>,
    pub as_of: u64,
}

impl PlacementView {
    pub fn of(placement: &Placement, as_of: u64) -> Self {
        let request = &placement.request;
        let (state, agent, used, capacity, why, since) = match &placement.state {
            PlacementState::Seeking => ("seeking", None, None, None, None, placement.at),
            PlacementState::Waiting { why, since } => ("waiting", None, None, None, Some(why.clone()), *since),
            PlacementState::Bound { agent, used, capacity, at, .. } => {
                ("placed", Some(agent.to_string()), Some(*used), Some(*capacity), None, *at)
            }
            PlacementState::Failed { why, at } => ("failed", None, None, None, Some(why.clone()), *at),
            PlacementState::Cancelled { by, reason, at } => {
                let why = match reason {
                    Some(reason) => format!("by {by}: {reason}"),
                    None => format!("by {by}"),
                };
                ("cancelled", None, None, None, Some(why), *at)
            }
        };
        PlacementView {
            resource: request.resource.to_string(),
            kind: request.kind.clone(),
            select: request.select.clone(),
            strategy: match request.strategy {
                leasehold_schemas::command::PlacementStrategy::Spread => "spread".to_owned(),
                leasehold_schemas::command::PlacementStrategy::Pack => "pack".to_owned(),
            },
            state: state.to_owned(),
            reference: agent.as_ref().map(|a| format!("{a}.{}", request.resource)),
            agent,
            used,
            capacity,
            why,
            asked_at: placement.at.0,
            since: since.0,
            until: placement.until.map(|t| t.0),
            as_of,
        }
    }
}

/// Who holds one identifier of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    pub pool: String,
    pub value: String,
    pub holder: String,
    pub token: Option<u64>,
    pub as_of: u64,
}

fn json(value: impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

impl ResourceView {
    /// The record of `resource` in `state`, as of the outcome at `as_of` decided at `updated_at`; `created_seq` is
    /// that of the outcome that allocated it (the projector keeps it from the first record).
    pub fn of(state: &PartitionState, resource: &Resource, created_seq: u64, as_of: u64, updated_at: u64) -> Self {
        let detail = match &resource.state {
            ResourceState::Paused { reason, until } => {
                Some(serde_json::json!({ "reason": reason, "until": until.map(|t| t.0) }))
            }
            ResourceState::Suspect { cause, .. } => Some(json(cause)),
            ResourceState::Releasing { cause } => Some(json(cause)),
            ResourceState::Destroyed { cause } => Some(serde_json::json!({
                "release": cause.as_deref().map(json),
                "confirmed_by": resource.agent.as_str(),
            })),
            ResourceState::Lost { stamp } => Some(serde_json::json!({
                "found_missing_by": resource.agent.as_str(),
                "observation": json(stamp),
            })),
            ResourceState::Orphaned { gone_at } => {
                let agent = &resource.agent;
                let gone = match gone_at {
                    Some(at) => format!("its holder's agent {agent} was declared gone at {at}"),
                    None => format!("its holder's agent {agent} was declared gone"),
                };
                // A pool that holds an orphan's identifiers keeps them until the destroy is confirmed or an
                // operator frees them: then the claim says why.
                let freed_because = if resource.holds_for_orphan() {
                    format!(
                        "not freed yet: held for the orphan until {agent} confirms the destroy or an operator frees \
                         it ({gone})"
                    )
                } else {
                    let returned = resource.claims.values().find_map(|slot| match slot {
                        ClaimSlot::Returned { cause, .. } => Some(cause),
                        _ => None,
                    });
                    match returned {
                        Some(FreeCause::Released {} | FreeCause::Orphaned {}) | None => gone,
                        Some(FreeCause::OrphanDestroyed { at }) => {
                            format!("{gone}; held for the orphan until {agent} confirmed the destroy at {at}")
                        }
                        Some(FreeCause::OrphanFreed { by, reason }) => {
                            format!("{gone}; held for the orphan until {by} freed it: {reason}")
                        }
                    }
                };
                Some(serde_json::json!({ "agent_gone_at": gone_at.map(|t| t.0), "freed_because": freed_because }))
            }
            ResourceState::Failed { detail } => Some(serde_json::Value::String(detail.clone())),
            ResourceState::Pending | ResourceState::Active => None,
        };
        let claims = resource
            .claims
            .iter()
            .map(|(pool, slot)| {
                let (status, value, token) = match slot {
                    ClaimSlot::Wanted { .. } => ("wanted", None, None),
                    ClaimSlot::Bound { value, token, .. } => ("bound", Some(value.to_string()), Some(token.0)),
                    ClaimSlot::HeldForOrphan { value, token } => {
                        ("held-for-orphan", Some(value.to_string()), Some(token.0))
                    }
                    ClaimSlot::Returned { token, .. } => ("returned", None, token.map(|t| t.0)),
                };
                ClaimView { pool: pool.to_string(), status: status.to_owned(), id: value, token }
            })
            .collect();
        ResourceView {
            reference: resource.reference().to_string(),
            agent: resource.agent.to_string(),
            id: resource.id.to_string(),
            kind: resource.kind.to_string(),
            capacity: resource.capacity,
            attributes: resource.attributes.clone(),
            parent: resource.parent().map(ToString::to_string),
            upstream_suspect: resource.upstream_suspect().is_some(),
            state: resource.state.name().to_owned(),
            detail,
            allocated_at: resource.allocated_at.0,
            native_id: resource.native_id.as_deref().map(str::to_owned),
            claims,
            leases: state
                .live_leases_of(resource)
                .map(|lease| LeaseBrief {
                    id: format!("{}.{}", lease.agent, lease.id),
                    holder: lease.holder.clone(),
                    state: lease.state.name().to_owned(),
                })
                .collect(),
            terminal_at: resource.terminal_at.map(|t| t.0),
            // Followed from the outcomes by the projector (see [`QuarantineView::follow`]).
            quarantined: None,
            destroy_blocked: None,
            state_since: None,
            waiting_on: None,
            idle_since: (!resource.state.has_left() && resource.live_leases.is_empty())
                .then_some(resource.idle_since.0),
            max_lease_ms: resource.max_lease.map(|max| max.0),
            created_seq,
            updated_at,
            as_of,
        }
    }
}

impl LeaseView {
    pub fn of(lease: &Lease, as_of: u64) -> Self {
        let (token, expires_at, wait_until, detail) = match &lease.state {
            LeaseState::Active { token, expires_at } => (Some(token.0), expires_at.map(|t| t.0), None, None),
            LeaseState::Waiting { until } => (None, None, until.map(|t| t.0), None),
            LeaseState::Broken { reason } => (None, None, None, Some(json(reason))),
            _ => (None, None, None, None),
        };
        LeaseView {
            id: format!("{}.{}", lease.agent, lease.id),
            resource: format!("{}.{}", lease.agent, lease.resource),
            holder: lease.holder.clone(),
            state: lease.state.name().to_owned(),
            token,
            expires_at,
            wait_until,
            ttl_ms: lease.ttl.map(|t| t.0),
            detail,
            terminal_at: lease.terminal_at.map(|t| t.0),
            priority: lease.priority,
            requested_at: lease.requested_at.0,
            requested_pos: lease.requested_pos.0,
            granted_at: lease.granted_at.map(|t| t.0),
            as_of,
        }
    }
}

impl AgentView {
    pub fn of(state: &PartitionState, agent: &Agent, as_of: u64) -> Self {
        AgentView {
            name: agent.name.to_string(),
            status: agent.status().to_owned(),
            epoch: agent.epoch.0,
            incarnation: agent.incarnation.to_string(),
            last_seen: agent.last_seen.0,
            resources: agent.resources.len() as u64,
            held: agent.n_held,
            settings: json(state.settings_of(agent)),
            own_settings: agent.settings.is_some(),
            breaker: agent.breaker.map(|b| BreakerView {
                would_lose: b.would_lose,
                live: b.live,
                tripped_at: b.tripped_at.0,
            }),
            retired: agent.retired,
            gone_at: agent.gone_at.map(|t| t.0),
            driver: DriverView {
                available: agent.driver_unavailable.is_none(),
                detail: agent.driver_unavailable.clone(),
            },
            quarantined: agent.quarantined.len() as u64,
            garbage_orders: agent.garbage_orders.len() as u64,
            cordon: agent.cordon.as_ref().map(|c| CordonView {
                by: c.by.to_string(),
                reason: c.reason.clone(),
                since: c.since.0,
            }),
            drain: agent.drain.as_ref().map(|d| DrainView {
                by: d.by.to_string(),
                reason: d.reason.clone(),
                since: d.since.0,
                deadline: d.deadline.map(|t| t.0),
                grace_ms: d.grace.0,
                // Counted from pending to releasing, less those releasing: no pass over its resources.
                left: (agent.by_kind.values().map(|n| u64::from(*n)).sum::<u64>())
                    .saturating_sub(agent.releasing.len() as u64),
            }),
            labels: agent.labels.clone(),
            capacity: agent.capacity.clone(),
            // With the room held for placements: what a placement or an allocation is measured against.
            used: agent
                .by_kind
                .keys()
                .map(|kind| &**kind)
                .chain(agent.reservations.values().map(|r| &*r.kind))
                .map(|kind| (kind.to_owned(), agent.used(kind)))
                .collect(),
            as_of,
        }
    }
}

impl PoolView {
    /// The record of `pool` as of the outcome at `as_of`, decided at `updated_at`. The pool keeps a freed identifier
    /// in its cooling queue until it is handed out again, cooled or not: only those still cooling then count.
    pub fn of(pool: &Pool, as_of: u64, updated_at: Timestamp) -> Self {
        // The queue is in order of the frees, so of the ends too: the earliest first.
        let cooling_values: Vec<CoolingView> = pool
            .cooling
            .iter()
            .map(|((freed_at, _), value)| (freed_at.saturating_add(pool.cooldown), value))
            .filter(|(until, _)| *until > updated_at)
            .map(|(until, value)| CoolingView { value: value.to_string(), until: until.0 })
            .collect();
        let cooling_until: Vec<u64> = cooling_values.iter().map(|c| c.until).collect();
        PoolView {
            name: pool.name.to_string(),
            kind: json(&pool.kind),
            cooldown_ms: pool.cooldown.0,
            orphans: pool.orphans.to_string(),
            held: pool.held.len() as u64,
            waiting: pool.waiters.len() as u64,
            cooling: cooling_until.len() as u64,
            cooling_until,
            cooling_values,
            waiters: pool.waiters.values().map(ToString::to_string).collect(),
            updated_at: updated_at.0,
            as_of,
        }
    }

    /// The record as of `now` (unix ms; never before the record's own time): `cooling` counts only the cool-downs
    /// not ended by then, and `cooling_until` and `cooling_values` list only those.
    pub fn at(mut self, now: u64) -> Self {
        let now = now.max(self.updated_at);
        self.cooling_until.retain(|until| *until > now);
        self.cooling_values.retain(|cooling| cooling.until > now);
        self.cooling = self.cooling_until.len() as u64;
        self
    }
}

impl HolderView {
    /// The holder of `value` in `pool`, if it is held.
    pub fn of(pool: &Pool, value: &leasehold_schemas::pool::PoolValue, as_of: u64) -> Option<Self> {
        let holder = pool.held.get(value)?;
        let token = match pool.holders.get(holder) {
            Some(Holding::Granted { token, .. }) => Some(token.0),
            _ => None,
        };
        Some(HolderView {
            pool: pool.name.to_string(),
            value: value.to_string(),
            holder: holder.to_string(),
            token,
            as_of,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(state: &str, claims: serde_json::Value, extra: serde_json::Value) -> ResourceView {
        let mut record = serde_json::json!({
            "ref": "w1.r", "agent": "w1", "id": "r", "kind": "container", "capacity": 1, "attrs": {}, "parent": null,
            "upstream_suspect": false, "state": state, "detail": null, "allocated_at": 1, "native_id": null,
            "claims": claims, "leases": [], "terminal_at": null, "quarantined": null, "created_seq": 1,
            "updated_at": 1, "as_of": 1, "state_since": 1767225600000u64,
        });
        record.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(record).unwrap()
    }

    fn agent(status: &str, driver: Option<&str>) -> AgentView {
        serde_json::from_value(serde_json::json!({
            "name": "w1", "status": status, "epoch": 3, "incarnation": "i", "last_seen": 1767225660000u64,
            "resources": 1, "held": 1, "settings": {}, "own_settings": false, "breaker": null, "retired": false,
            "gone_at": null, "driver": {"available": driver.is_none(), "detail": driver}, "quarantined": 0,
            "garbage_orders": 0, "as_of": 1,
        }))
        .unwrap()
    }

    /// Each waiting state says on what, naming its agent's trouble; a state that waits on nothing says nothing.
    #[test]
    fn a_waiting_resource_says_on_what_and_since_when() {
        let wanted = serde_json::json!([{"pool": "net1", "status": "wanted", "id": null, "token": null}]);
        let on = |r: &ResourceView, a: Option<&AgentView>| WaitingOn::of(r, a).map(|w| w.on);
        let live = agent("live", None);
        let pending = resource("pending", wanted, serde_json::json!({}));
        assert_eq!(on(&pending, Some(&live)).as_deref(), Some("waiting for an identifier of pool net1"));
        assert_eq!(WaitingOn::of(&pending, Some(&live)).unwrap().since, Some(1767225600000));
        let ordered = resource("pending", serde_json::json!([]), serde_json::json!({}));
        assert_eq!(
            on(&ordered, Some(&agent("stalled", None))).as_deref(),
            Some("waiting for w1 to create it; w1 last heard from 2026-01-01T00:01:00.000Z, stalled")
        );
        let blocked = serde_json::json!({"destroy_blocked": {"detail": "volume in use by ci", "at": 1}});
        let releasing = resource("releasing", serde_json::json!([]), blocked);
        assert_eq!(
            on(&releasing, Some(&agent("live", Some("the root is not mounted")))).as_deref(),
            Some(
                "waiting for w1 to confirm the destroy (it says: volume in use by ci); w1 last heard from \
                 2026-01-01T00:01:00.000Z, its driver is unavailable: the root is not mounted"
            )
        );
        assert_eq!(
            on(&resource("suspect", serde_json::json!([]), serde_json::json!({})), None).as_deref(),
            Some("waiting for its health check on w1; w1 has never registered")
        );
        let paused =
            resource("paused", serde_json::json!([]), serde_json::json!({"detail": {"until": 1767229200000u64}}));
        assert_eq!(
            on(&paused, Some(&live)).as_deref(),
            Some("paused: waiting for an unpause, or until 2026-01-01T01:00:00.000Z")
        );
        assert_eq!(on(&resource("active", serde_json::json!([]), serde_json::json!({})), Some(&live)), None);
        assert_eq!(on(&resource("destroyed", serde_json::json!([]), serde_json::json!({})), Some(&live)), None);
        // A child flagged suspect-upstream waits for its parent only while it lives; the flag outlives its end.
        let flagged = serde_json::json!({"upstream_suspect": true, "parent": "w2.p"});
        let child = resource("active", serde_json::json!([]), flagged.clone());
        assert_eq!(
            WaitingOn::of(&child, Some(&live)),
            Some(WaitingOn { on: "new leases wait: its parent w2.p is suspect".to_owned(), since: None })
        );
        assert_eq!(on(&resource("destroyed", serde_json::json!([]), flagged), Some(&live)), None);
    }

    /// A live resource of a draining agent says when the drain releases it: after the grace from the later of the
    /// drain's start and the end of its last lease, or at the deadline when that comes first; a leased one, once its
    /// leases end.
    #[test]
    fn a_resource_of_a_draining_agent_says_when_it_is_released() {
        let on = |r: &ResourceView, a: &AgentView| WaitingOn::of(r, Some(a)).map(|w| w.on);
        let mut draining = agent("live", None);
        let since = 1767225600000u64;
        draining.drain = Some(DrainView {
            by: "op:alice".into(),
            reason: None,
            since,
            deadline: Some(since + 3_600_000),
            grace_ms: 600_000,
            left: 2,
        });
        let idle = resource("active", serde_json::json!([]), serde_json::json!({"idle_since": since + 60_000}));
        assert_eq!(
            WaitingOn::of(&idle, Some(&draining)),
            Some(WaitingOn {
                on: "its agent w1 drains: released at 2026-01-01T00:11:00.000Z, once it has held no lease for 10min"
                    .to_owned(),
                since: Some(since)
            })
        );
        let leased = resource(
            "active",
            serde_json::json!([]),
            serde_json::json!({"leases": [{"id": "w1.l", "holder": "ci", "state": "active"}]}),
        );
        assert_eq!(
            on(&leased, &draining).as_deref(),
            Some(
                "its agent w1 drains: released once its leases end and it has held none for 10min, or at the \
                 drain's deadline 2026-01-01T01:00:00.000Z"
            )
        );
        let late = resource("paused", serde_json::json!([]), serde_json::json!({"idle_since": since + 3_500_000}));
        assert_eq!(
            on(&late, &draining).as_deref(),
            Some(
                "paused: waiting for an unpause; its agent w1 drains: released at the drain's deadline 2026-01-01T01:00:00.000Z"
            )
        );
        assert_eq!(
            on(&resource("releasing", serde_json::json!([]), serde_json::json!({})), &draining)
                .map(|o| o.contains("drains")),
            Some(false)
        );
    }
}
