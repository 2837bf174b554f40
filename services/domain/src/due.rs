//! When time-driven work falls due: the deadlines a sweeper waits for, and the very functions `decide` checks them
//! with, so the two can never disagree (a sweeper that asks early is refused `not-yet-due`; one that asks late only
//! loses time).
//!
//! Every deadline is a log time: a command is due once `max(partition time, log time) >= due`.

use leasehold_schemas::ids::{Millis, Timestamp};

use crate::state::{Agent, Lease, LeaseState, PartitionState, PendingClock, Resource, ResourceState};

/// Heartbeats are recorded at most every third of `stall_after` (coalesced), so a recorded one may lag the real last
/// one by up to that much: silence is judged from the recorded one plus that third, and an agent is never called
/// stalled or gone early. The agent paces its heartbeats well within it.
pub(crate) fn coalesce_interval(stall_after: Millis) -> Millis {
    Millis(stall_after.0 / 3)
}

/// When `agent` is `stalled` if no heartbeat is recorded before: its last one plus its effective `stall_after`
/// (and the coalescing slack).
pub fn stall_due(state: &PartitionState, agent: &Agent) -> Timestamp {
    let settings = state.settings_of(agent);
    agent.last_seen.saturating_add(settings.stall_after).saturating_add(coalesce_interval(settings.stall_after))
}

/// When `agent` is `gone` (and its resources orphaned) if no heartbeat is recorded before.
pub fn gone_due(state: &PartitionState, agent: &Agent) -> Timestamp {
    let settings = state.settings_of(agent);
    agent.last_seen.saturating_add(settings.orphan_after).saturating_add(coalesce_interval(settings.stall_after))
}

/// When a `pending` resource is given up; `None` for a resource in any other state, or one that may wait for ever.
/// Once its create was ordered: the order's log time plus its agent's effective `create_timeout` (it is then
/// released: the create may still be running). Before that (its pools' identifiers not all bound yet): its
/// allocation's `wait`, if it gave one; waiting for an address is bounded by nothing else.
pub fn create_due(state: &PartitionState, resource: &Resource) -> Option<Timestamp> {
    if resource.state != ResourceState::Pending {
        return None;
    }
    let ordered_at = match resource.pending_clock? {
        PendingClock::WaitsUntil(until) => return Some(until),
        PendingClock::OrderedAt(at) => at,
    };
    let create_timeout = match state.agent(&resource.agent) {
        Some(agent) => state.settings_of(agent).create_timeout,
        None => state.policy().agent.create_timeout,
    };
    Some(ordered_at.saturating_add(create_timeout))
}

/// An active lease with a ttl: when it expires. A waiting lease with a wait timeout: when it fails. `None`
/// otherwise (no deadline, or the lease ended).
pub fn lease_due(lease: &Lease) -> Option<Timestamp> {
    match lease.state {
        LeaseState::Active { expires_at, .. } => expires_at,
        LeaseState::Waiting { until } => until,
        _ => None,
    }
}

/// When a paused resource's pause ends by itself; `None` for a pause without end or a resource not paused.
pub fn pause_due(resource: &Resource) -> Option<Timestamp> {
    match resource.state {
        ResourceState::Paused { until, .. } => until,
        _ => None,
    }
}

/// When a resource of a draining agent is released: once it has held no lease for the drain's grace, counted from
/// the later of the drain's start and the end of its last lease (`idle`; `None` while it holds a live lease, waiting
/// or active), and in any case at the drain's deadline, if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainDue {
    pub idle: Option<Timestamp>,
    pub deadline: Option<Timestamp>,
}

impl DrainDue {
    /// The earliest time it is released; `None` while it holds a lease and the drain has no deadline.
    pub fn at(&self) -> Option<Timestamp> {
        match (self.idle, self.deadline) {
            (Some(idle), Some(deadline)) => Some(idle.min(deadline)),
            (idle, deadline) => idle.or(deadline),
        }
    }

    /// At `now`: released as idle past the grace (`Some(false)`), at the deadline (`Some(true)`), or not yet
    /// (`None`). Idle past the grace is said first when both hold.
    pub fn by_deadline(&self, now: Timestamp) -> Option<bool> {
        if self.idle.is_some_and(|at| at <= now) {
            Some(false)
        } else if self.deadline.is_some_and(|at| at <= now) {
            Some(true)
        } else {
            None
        }
    }
}

/// When `resource` is released by its agent's drain; `None` when the agent does not drain or the resource has left
/// (releasing or terminal). A pending resource holding no lease is idle too.
pub fn drain_due(state: &PartitionState, resource: &Resource) -> Option<DrainDue> {
    let drain = state.agent(&resource.agent)?.drain.as_ref()?;
    if resource.state.has_left() {
        return None;
    }
    let idle =
        resource.live_leases.is_empty().then(|| drain.since.max(resource.idle_since).saturating_add(drain.grace));
    Some(DrainDue { idle, deadline: drain.deadline })
}
