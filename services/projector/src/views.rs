//! The records of the read models, in JSON: what `GET /v1/...` and the CLI show. Each is made from the partition
//! state the projector folds (the domain's own fold, so a read model can never disagree with the writer's view), as
//! of the outcome that last touched it. One part is followed from the outcomes instead: a lost resource's quarantined
//! handle ([`QuarantineView`]), which the state forgets once the handle is ordered destroyed, and whose resource
//! record may be forgotten from the state before its handle comes back.

use std::collections::BTreeMap;

use leasehold_domain::PartitionState;
use leasehold_domain::state::{Agent, ClaimSlot, Holding, Lease, LeaseState, Pool, Resource, ResourceState};
use leasehold_schemas::Outcome;
use leasehold_schemas::ids::{ResourceId, Timestamp};
use leasehold_schemas::outcome::{Effect, GarbageCause};
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
    /// `wanted` (waiting for the pool to grant an identifier), `bound` or `returned`.
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
    pub as_of: u64,
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
    pub as_of: u64,
}

/// Who cordoned an agent, why, and since when (log time, unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CordonView {
    pub by: String,
    pub reason: Option<String>,
    pub since: u64,
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
    pub as_of: u64,
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
            as_of,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    pub name: String,
    pub kind: serde_json::Value,
    pub cooldown_ms: u64,
    pub held: u64,
    pub waiting: u64,
    /// Freed identifiers whose cool-down has not ended: as of `updated_at` in the projection; the gateway answers
    /// it as of its own clock ([`PoolView::at`]), since the record changes only when the pool's outcomes do.
    pub cooling: u64,
    /// When each of those cool-downs ends (unix ms, earliest first).
    pub cooling_until: Vec<u64>,
    /// Log time of the outcome this record is as of (unix ms).
    pub updated_at: u64,
    pub as_of: u64,
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
                let freed_because = match gone_at {
                    Some(at) => format!("its holder's agent {agent} was declared gone at {at}"),
                    None => format!("its holder's agent {agent} was declared gone"),
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
                    ClaimSlot::Bound { value, token } => ("bound", Some(value.to_string()), Some(token.0)),
                    ClaimSlot::Returned { token } => ("returned", None, token.map(|t| t.0)),
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
            as_of,
        }
    }
}

impl PoolView {
    /// The record of `pool` as of the outcome at `as_of`, decided at `updated_at`. The pool keeps a freed identifier
    /// in its cooling queue until it is handed out again, cooled or not: only those still cooling then count.
    pub fn of(pool: &Pool, as_of: u64, updated_at: Timestamp) -> Self {
        let cooling_until: Vec<u64> = pool
            .cooling
            .keys()
            .map(|(freed_at, _)| freed_at.saturating_add(pool.cooldown))
            .filter(|until| *until > updated_at)
            .map(|until| until.0)
            .collect();
        PoolView {
            name: pool.name.to_string(),
            kind: json(&pool.kind),
            cooldown_ms: pool.cooldown.0,
            held: pool.held.len() as u64,
            waiting: pool.waiters.len() as u64,
            cooling: cooling_until.len() as u64,
            cooling_until,
            updated_at: updated_at.0,
            as_of,
        }
    }

    /// The record as of `now` (unix ms; never before the record's own time): `cooling` counts only the cool-downs
    /// not ended by then.
    pub fn at(mut self, now: u64) -> Self {
        let now = now.max(self.updated_at);
        self.cooling_until.retain(|until| *until > now);
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
