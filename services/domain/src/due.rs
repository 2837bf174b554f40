//! When time-driven work falls due, in log time: what a sweeper needs to know when to ask, and what `decide`
//! checks when it is asked (one source of truth, so the two never disagree about a deadline).

use leasehold_schemas::ids::{Millis, Timestamp};

use crate::state::{Agent, Lease, LeaseState, PartitionState, Resource, ResourceState};

/// A recorded heartbeat may lag the real last one by up to a third of `stall_after` (heartbeats are coalesced),
/// so silence is judged from the recorded one plus that third: an agent is never called stalled or gone early.
pub(crate) fn coalesce_interval(stall_after: Millis) -> Millis {
    Millis(stall_after.0 / 3)
}

/// When `agent` is stalled if it is not heard from.
pub fn stall_due(_state: &PartitionState, agent: &Agent) -> Timestamp {
    let settings = &agent.settings;
    agent.last_seen.saturating_add(settings.stall_after).saturating_add(coalesce_interval(settings.stall_after))
}

/// When `agent` is gone if it is not heard from.
pub fn gone_due(_state: &PartitionState, agent: &Agent) -> Timestamp {
    let settings = &agent.settings;
    agent.last_seen.saturating_add(settings.orphan_after).saturating_add(coalesce_interval(settings.stall_after))
}

/// When a `pending` resource is given up on (`None` for any other state, or an agent unknown here).
pub fn create_due(state: &PartitionState, resource: &Resource) -> Option<Timestamp> {
    if resource.state != ResourceState::Pending {
        return None;
    }
    let agent = state.agent(&resource.agent)?;
    Some(resource.allocated_at.saturating_add(agent.settings.create_timeout))
}

/// When an active lease expires, or a waiting one stops waiting (`None`: it lasts until released).
pub fn lease_due(lease: &Lease) -> Option<Timestamp> {
    match lease.state {
        LeaseState::Active { expires_at, .. } => expires_at,
        LeaseState::Waiting { until } => until,
        _ => None,
    }
}

/// When a paused resource's pause ends by itself.
pub fn pause_due(resource: &Resource) -> Option<Timestamp> {
    match resource.state {
        ResourceState::Paused { until, .. } => until,
        _ => None,
    }
}
