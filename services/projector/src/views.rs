//! The records of the read models, in JSON: what `GET /v1/...` and the CLI show. Each is made from the partition
//! state the projector folds (the domain's own fold, so a read model can never disagree with the writer's view), as
//! of the outcome that last touched it.

use std::collections::BTreeMap;

use leasehold_domain::PartitionState;
use leasehold_domain::state::{Agent, ClaimSlot, Holding, Lease, LeaseState, Pool, Resource, ResourceState};
use leasehold_schemas::settings::ClusterPolicy;
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
    /// Why it is in that state, where the state says (a pause, a suspicion, a release, a failure).
    pub detail: Option<serde_json::Value>,
    /// Log time of its allocation (unix ms).
    pub allocated_at: u64,
    pub native_id: Option<String>,
    pub claims: Vec<ClaimView>,
    /// Live leases (waiting or active), first come first.
    pub leases: Vec<LeaseBrief>,
    pub terminal_at: Option<u64>,
    /// The outcome sequence that allocated it.
    pub created_seq: u64,
    /// Log time of the outcome this record is as of (unix ms).
    pub updated_at: u64,
    /// The outcome sequence this record is as of.
    pub as_of: u64,
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
    pub as_of: u64,
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
    pub cooling: u64,
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
            ResourceState::Failed { detail } => Some(serde_json::Value::String(detail.clone())),
            _ => None,
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
            as_of,
        }
    }
}

impl PoolView {
    pub fn of(pool: &Pool, as_of: u64) -> Self {
        PoolView {
            name: pool.name.to_string(),
            kind: json(&pool.kind),
            cooldown_ms: pool.cooldown.0,
            held: pool.held.len() as u64,
            waiting: pool.waiters.len() as u64,
            cooling: pool.cooling.len() as u64,
            as_of,
        }
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
