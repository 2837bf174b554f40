//! `apply`: fold one outcome into partition state. No decisions here: every branch follows from an effect.

use std::fmt;

use leasehold_schemas::Outcome;
use leasehold_schemas::ids::{Position, ResourceId, ResourceRef, Timestamp};
use leasehold_schemas::outcome::{Decision, Effect, FreeCause, UnpauseCause};
use leasehold_schemas::subjects::partition_of_agent;

use crate::state::{
    Agent, Breaker, ClaimSlot, Cordon, Drain, Forget, Holding, Lease, LeaseState, Liveness, ParentLink, PartitionState,
    PauseInfo, PendingClock, PendingDecision, Placement, PlacementState, Pool, Quota, Reservation, Resource,
    ResourceState,
};

/// An outcome that does not follow the state it is folded into: a log out of order, with a gap, or of another
/// partition. Whoever folds must stop: skipping it would serve a state the log does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoldError {
    WrongPartition {
        state: u32,
        outcome: u32,
    },
    /// The outcome is not the next one: after `(cursor, part)`, with `pending` the part expected next if a decision
    /// is unfinished.
    OutOfOrder {
        cursor: (u64, u32),
        pending: Option<(u64, u32)>,
        got: (u64, u32),
    },
    /// Its first position is not the next position of the partition.
    PositionGap {
        expected: Position,
        got: Position,
    },
}

impl fmt::Display for FoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FoldError::WrongPartition { state, outcome } => {
                write!(f, "an outcome of partition {outcome} cannot be folded into partition {state}")
            }
            FoldError::OutOfOrder { cursor, pending: Some(next), got } => write!(
                f,
                "expected part {} of command {} next (last applied: command {} part {}), got command {} part {}",
                next.1, next.0, cursor.0, cursor.1, got.0, got.1
            ),
            FoldError::OutOfOrder { cursor, pending: None, got } => write!(
                f,
                "expected the first part of a command after {} (last applied part {}), got command {} part {}",
                cursor.0, cursor.1, got.0, got.1
            ),
            FoldError::PositionGap { expected, got } => {
                write!(f, "the outcome starts at position {got}, but the next position is {expected}")
            }
        }
    }
}

impl std::error::Error for FoldError {}

/// Folds the next outcome of the partition into `state`: the first part of a later command, or the next part of
/// the unfinished decision. Anything else is refused and changes nothing.
pub fn apply(state: &mut PartitionState, outcome: &Outcome) -> Result<(), FoldError> {
    if outcome.partition != state.partition {
        return Err(FoldError::WrongPartition { state: state.partition, outcome: outcome.partition });
    }
    let got = (outcome.cmd_seq, outcome.part);
    let in_order = match &state.pending {
        Some(pending) => got == (pending.cmd_seq, pending.next_part()),
        None => outcome.part == 0 && outcome.cmd_seq > state.cursor,
    };
    if !in_order {
        return Err(FoldError::OutOfOrder {
            cursor: (state.cursor, state.cursor_part),
            pending: state.pending.as_ref().map(|p| (p.cmd_seq, p.next_part())),
            got,
        });
    }
    if let Decision::Accepted { first_position, .. } = &outcome.decision
        && *first_position != state.next_position
    {
        return Err(FoldError::PositionGap { expected: state.next_position, got: *first_position });
    }
    state.pending = None;
    state.cursor = outcome.cmd_seq;
    state.cursor_part = outcome.part;
    state.now = state.now.max(outcome.decided_at);
    let now = state.now;
    let key = outcome.command.key.clone();
    let mut last = state.last_position();
    for (position, effect) in outcome.positioned_effects() {
        apply_effect(state, &key, &outcome.command.issuer, position, now, effect);
        last = position;
    }
    state.next_position = last.next();
    if outcome.command.type_name == "op.renew"
        && let Some(Effect::LeaseRenewed { lease, .. }) = outcome.effects().first()
        && let Some(lease) = state.leases.get_mut(lease)
    {
        lease.last_renew = Some((outcome.command.id, outcome.cmd_seq));
    }
    if let Some(Effect::DecisionContinues { work }) = outcome.effects().last() {
        state.pending = Some(PendingDecision {
            cmd_seq: outcome.cmd_seq,
            part: outcome.part,
            log_time: outcome.log_time,
            command: outcome.command.clone(),
            work: work.clone(),
        });
    }
    if outcome.part == 0 && crate::decide::remembered(outcome) {
        let id = outcome.command.id;
        state.recent.by_id.insert(id, outcome.cmd_seq);
        let since = now.max(outcome.command.issued_at).max(id.time());
        state.recent.order.insert((since, id));
    }
    forget_old(state);
    Ok(())
}

/// Drops what the horizon no longer needs: remembered command ids, terminal records, released pool holders, returned
/// grants of unknown resources. Remembers the latest time it dropped anything from.
fn forget_old(state: &mut PartitionState) {
    let horizon = state.settings.outcome_horizon;
    let now = state.now;
    // Strictly older than the horizon, as staleness is judged: at exactly the horizon a retry is still answered.
    let expired = |t: Timestamp| t.saturating_add(horizon) < now;
    while let Some((t, id)) = state.recent.order.first().copied() {
        if !expired(t) {
            break;
        }
        state.recent.order.pop_first();
        state.recent.by_id.remove(&id);
        state.forgotten_up_to = state.forgotten_up_to.max(t);
    }
    while let Some((t, _)) = state.forget.first() {
        if !expired(*t) {
            break;
        }
        let Some((t, item)) = state.forget.pop_first() else {
            break;
        };
        state.forgotten_up_to = state.forgotten_up_to.max(t);
        match item {
            // A resource or lease id names one record for ever (ids are never allocated twice), and its entry is made
            // when the record ends.
            // An orphan that holds a pool's identifier is kept until it lets go of it (then its entry is made
            // again): forgotten, its grant would look unknown here and be sent back, freeing what it holds.
            Forget::Resource(id, _) if state.resources.get(&id).is_some_and(|r| r.holds_for_orphan()) => {}
            Forget::Resource(id, left_at) => {
                if let Some(resource) = state.resources.remove(&id) {
                    let reference = resource.reference();
                    if let Some(agent) = state.agents.get_mut(&resource.agent) {
                        agent.resources.remove(&id);
                        agent.left_by_position.remove(&left_at);
                        // A lost resource's handle may come back long after: it is still recognised and quarantined.
                        if matches!(resource.state, ResourceState::Lost { .. }) {
                            agent.lost_ids.insert(id);
                        }
                    }
                    state.returned_grants.retain(|(holder, _, _)| *holder != reference);
                }
            }
            Forget::Lease(id) => {
                state.leases.remove(&id);
            }
            Forget::PoolHolder(pool, holder, ended) => {
                if let Some(pool) = state.pools.get_mut(&pool)
                    && pool.released.get(&holder).is_some_and(|(_, at)| *at == ended)
                {
                    pool.released.remove(&holder);
                }
            }
            Forget::ReturnedGrant(holder, pool, token) => {
                if !resource_is(state, &holder) {
                    state.returned_grants.remove(&(holder, pool, token));
                }
            }
            Forget::Absent(id) => {
                state.absent.remove(&id);
            }
            Forget::Placement(id) => {
                state.placements.remove(&id);
            }
        }
    }
}

fn resource_is(state: &PartitionState, reference: &ResourceRef) -> bool {
    state.resources.get(&reference.resource).is_some_and(|r| r.agent == reference.agent)
}

fn agent_of<'a>(state: &'a mut PartitionState, key: &leasehold_schemas::Key) -> Option<&'a mut Agent> {
    match key {
        leasehold_schemas::Key::Agent(name) => state.agents.get_mut(name),
        leasehold_schemas::Key::Pool(_) | leasehold_schemas::Key::Placement(_) => None,
    }
}

fn pool_of<'a>(state: &'a mut PartitionState, key: &leasehold_schemas::Key) -> Option<&'a mut Pool> {
    match key {
        leasehold_schemas::Key::Pool(name) => state.pools.get_mut(name),
        leasehold_schemas::Key::Agent(_) | leasehold_schemas::Key::Placement(_) => None,
    }
}

/// Moves a resource to `next`, keeping the agent's held view and the forget queue in step.
fn set_resource_state(
    state: &mut PartitionState,
    id: ResourceId,
    next: ResourceState,
    position: Position,
    now: Timestamp,
) {
    let Some(resource) = state.resources.get_mut(&id) else {
        return;
    };
    let was_held = resource.state.is_held();
    let was_terminal = resource.state.is_terminal();
    let was_releasing = matches!(resource.state, ResourceState::Releasing { .. });
    let is_held = next.is_held();
    let is_releasing = matches!(next, ResourceState::Releasing { .. });
    let is_terminal = next.is_terminal();
    resource.state = next;
    if is_releasing {
        resource.destruction_ordered = Some(position);
    }
    if is_terminal {
        resource.terminal_at = Some(now);
    }
    let destruction = resource.destruction_ordered;
    let creation = resource.creation_position();
    let agent_name = resource.agent.clone();
    // Only the transition that ends the resource touches its kind's count (no copy of the kind on the others).
    let ended_kind = (is_terminal && !was_terminal).then(|| resource.kind.clone());
    if let Some(agent) = state.agents.get_mut(&agent_name) {
        if let Some(kind) = ended_kind {
            // What the capacity counts ends with the resource; a kind that counts nothing is not kept.
            if let Some(n) = agent.by_kind.get_mut(&kind) {
                *n -= 1;
                if *n == 0 {
                    agent.by_kind.remove(&kind);
                }
            }
        }
        if was_held && !is_held {
            agent.n_held -= 1;
            agent.held_digest.remove(id);
            agent.held_by_creation.remove(&creation);
        }
        if !was_held && is_held {
            agent.n_held += 1;
            agent.held_digest.add(id);
            agent.held_by_creation.insert(creation, id);
        }
        if is_releasing && !was_releasing {
            agent.releasing.insert(position, id);
        }
        if was_releasing
            && !is_releasing
            && let Some(pos) = destruction
        {
            agent.releasing.remove(&pos);
        }
        if is_terminal {
            agent.left_by_position.insert(position, id);
        }
    }
    if is_terminal {
        // Kept until its id could no longer be allocated, even if it was stamped in the future.
        state.forget.insert((now.max(id.time()), Forget::Resource(id, position)));
    }
}

fn end_lease(state: &mut PartitionState, lease_id: leasehold_schemas::LeaseId, next: LeaseState, now: Timestamp) {
    let Some(lease) = state.leases.get_mut(&lease_id) else {
        return;
    };
    lease.state = next;
    lease.terminal_at = Some(now);
    let resource_id = lease.resource;
    if let Some(resource) = state.resources.get_mut(&resource_id) {
        resource.live_leases.retain(|_, id| *id != lease_id);
        if resource.live_leases.is_empty() {
            resource.idle_since = now;
        }
    }
    // Kept until neither its id nor its last renew's id could be decided again.
    let renewed = lease.last_renew.map(|(id, _)| id.time()).unwrap_or_default();
    state.forget.insert((now.max(lease_id.time()).max(renewed), Forget::Lease(lease_id)));
}

fn apply_effect(
    state: &mut PartitionState,
    key: &leasehold_schemas::Key,
    issuer: &leasehold_schemas::ids::Issuer,
    position: Position,
    now: Timestamp,
    effect: &Effect,
) {
    match effect {
        Effect::AgentRegistered { incarnation, wiped, settings, own_settings, retired } => {
            // Without settings of its own, the agent follows the policy as it changes, not a copy of it.
            let settings = own_settings.then(|| settings.clone());
            let leasehold_schemas::Key::Agent(name) = key else {
                return;
            };
            let agent = state.agents.entry(name.clone()).or_insert_with(|| Agent {
                name: name.clone(),
                liveness: Liveness::Live,
                retired: false,
                breaker: None,
                epoch: position,
                incarnation: *incarnation,
                wiped: *wiped,
                settings: settings.clone(),
                last_seen: now,
                last_obs: Default::default(),
                last_watermark: Position::ZERO,
                breaker_bypass: false,
                bypass_spent_on: None,
                recent_losses: Default::default(),
                resources: Default::default(),
                releasing: Default::default(),
                n_held: 0,
                held_digest: Default::default(),
                held_by_creation: Default::default(),
                driver_unavailable: None,
                gone_at: None,
                quarantined: Default::default(),
                lost_ids: Default::default(),
                garbage_orders: Default::default(),
                left_by_position: Default::default(),
                cordon: None,
                drain: None,
                labels: Default::default(),
                capacity: Default::default(),
                by_kind: Default::default(),
                reservations: Default::default(),
            });
            agent.liveness = Liveness::Live;
            agent.gone_at = None;
            agent.retired = *retired;
            agent.epoch = position;
            agent.incarnation = *incarnation;
            agent.wiped = *wiped;
            agent.settings = settings;
            agent.last_seen = now;
            agent.last_obs = leasehold_schemas::ObsStamp { epoch: position, obs: 0 };
            agent.breaker_bypass = *wiped;
            if *wiped {
                agent.breaker = None;
            }
        }
        Effect::AgentSeen { at } => {
            if let Some(agent) = agent_of(state, key) {
                agent.last_seen = agent.last_seen.max(*at);
            }
        }
        Effect::AgentStalled { .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.liveness = Liveness::Stalled;
            }
        }
        Effect::AgentRecovered {} => {
            if let Some(agent) = agent_of(state, key) {
                agent.liveness = Liveness::Live;
            }
        }
        Effect::AgentGone { .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.liveness = Liveness::Gone;
                agent.gone_at = Some(now);
            }
        }
        Effect::AgentRetired { .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.retired = true;
            }
        }
        Effect::AgentSuspect { would_lose, live } => {
            if let Some(agent) = agent_of(state, key) {
                let watermark = agent.last_watermark;
                agent.breaker = Some(Breaker { tripped_at: now, would_lose: *would_lose, live: *live, watermark });
            }
        }
        Effect::AgentBreakerCleared { reason } => {
            if let Some(agent) = agent_of(state, key) {
                agent.breaker = None;
                if matches!(reason, leasehold_schemas::outcome::BreakerClear::LossConfirmed { .. }) {
                    agent.breaker_bypass = true;
                    agent.recent_losses.clear();
                }
            }
        }
        Effect::AgentBreakerRearmed {} => {
            if let Some(agent) = agent_of(state, key) {
                agent.breaker_bypass = false;
                agent.bypass_spent_on = Some(agent.last_obs);
            }
        }
        Effect::ResyncRequested { .. } => {}
        Effect::ObservationAccepted { stamp, watermark } => {
            if let Some(agent) = agent_of(state, key) {
                agent.last_obs = agent.last_obs.max(*stamp);
                if let Some(watermark) = watermark {
                    agent.last_watermark = *watermark;
                }
            }
        }
        Effect::ResourceAllocated { resource, kind, capacity, attributes, parent } => {
            let leasehold_schemas::Key::Agent(agent_name) = key else {
                return;
            };
            // A parent in this partition is known as of the allocation: a cascade older than that is stale. A parent
            // elsewhere is learnt by the answer to the child's adoption.
            let parent = parent.as_ref().map(|reference| {
                let local = partition_of_agent(&reference.agent, state.partitions) == state.partition;
                let before =
                    leasehold_schemas::Source { partition: state.partition, position: Position(position.0 - 1) };
                Box::new(ParentLink { reference: reference.clone(), seen: local.then_some(before), suspect: false })
            });
            state.resources.insert(
                *resource,
                Resource {
                    id: *resource,
                    agent: agent_name.clone(),
                    kind: kind.as_str().into(),
                    capacity: *capacity,
                    attributes: attributes.clone(),
                    parent,
                    state: ResourceState::Pending,
                    allocated_at: now,
                    allocated_pos: position,
                    create_ordered: None,
                    activated_pos: None,
                    pending_clock: None,
                    destruction_ordered: None,
                    last_present: None,
                    native_id: None,
                    claims: Default::default(),
                    live_leases: Default::default(),
                    max_lease: None,
                    idle_since: now,
                    terminal_at: None,
                },
            );
            if let Some(agent) = state.agents.get_mut(agent_name) {
                agent.resources.insert(*resource);
                *agent.by_kind.entry(kind.as_str().into()).or_default() += 1;
            }
        }
        Effect::ClaimWanted { resource, pool } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.claims.insert(pool.clone(), ClaimSlot::Wanted { wanted_at: position });
            }
        }
        Effect::ClaimBound { resource, pool, value, token } => {
            if let Some(r) = state.resources.get_mut(resource) {
                let orphans = leasehold_schemas::pool::OrphanPolicy::Release;
                r.claims.insert(pool.clone(), ClaimSlot::Bound { value: *value, token: *token, orphans });
            }
        }
        Effect::CreateOrdered { resource } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.create_ordered = Some(position);
                r.pending_clock = Some(PendingClock::OrderedAt(now));
            }
        }
        Effect::AllocationWaitsUntil { resource, until } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.pending_clock = Some(PendingClock::WaitsUntil(*until));
            }
        }
        Effect::ResourceSeen { resource, stamp, native_id } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.last_present = r.last_present.max(Some(*stamp));
                if let Some(native_id) = native_id {
                    r.native_id = Some(native_id.as_str().into());
                }
            }
        }
        Effect::ResourceActivated { resource, stamp, native_id } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.last_present = Some(*stamp);
                r.activated_pos = Some(position);
                if let Some(native_id) = native_id {
                    r.native_id = Some(native_id.as_str().into());
                }
            }
            set_resource_state(state, *resource, ResourceState::Active, position, now);
        }
        Effect::ResourcePaused { resource, reason, until } => {
            let next = ResourceState::Paused { reason: reason.clone(), until: *until };
            set_resource_state(state, *resource, next, position, now);
        }
        Effect::ResourceUnpaused { resource, cause: UnpauseCause::Operator { .. } | UnpauseCause::PauseExpired {} } => {
            set_resource_state(state, *resource, ResourceState::Active, position, now);
        }
        Effect::ResourceUpdated { resource, set, remove, capacity } => {
            if let Some(r) = state.resources.get_mut(resource) {
                for name in remove {
                    r.attributes.remove(name);
                }
                r.attributes.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                if let Some(capacity) = capacity {
                    r.capacity = *capacity;
                }
            }
        }
        Effect::ResourceSuspect { resource, cause } => {
            let paused = state.resources.get(resource).and_then(|r| match &r.state {
                ResourceState::Paused { reason, until } => Some(PauseInfo { reason: reason.clone(), until: *until }),
                _ => None,
            });
            set_resource_state(
                state,
                *resource,
                ResourceState::Suspect { cause: Box::new(cause.clone()), paused: paused.map(Box::new), asked: None },
                position,
                now,
            );
        }
        Effect::HealthCheckRequested { resource } => {
            if let Some(ResourceState::Suspect { asked, .. }) = state.resources.get_mut(resource).map(|r| &mut r.state)
            {
                *asked = Some(position);
            }
        }
        Effect::ResourceHealthy { resource } => {
            let next = match state.resources.get(resource).map(|r| &r.state) {
                Some(ResourceState::Suspect { paused: Some(pause), .. }) => {
                    ResourceState::Paused { reason: pause.reason.clone(), until: pause.until }
                }
                _ => ResourceState::Active,
            };
            set_resource_state(state, *resource, next, position, now);
        }
        Effect::UpstreamFlagged { resource, suspect, source, .. } => {
            if let Some(link) = state.resources.get_mut(resource).and_then(|r| r.parent.as_mut()) {
                link.suspect = *suspect;
                link.seen = Some(*source);
            }
        }
        Effect::ResourceReleasing { resource, cause } => {
            let releasing = ResourceState::Releasing { cause: Box::new(cause.clone()) };
            set_resource_state(state, *resource, releasing, position, now);
        }
        Effect::ResourceDestroyed { resource, .. } => {
            let cause = match state.resources.get(resource).map(|r| &r.state) {
                Some(ResourceState::Releasing { cause }) => Some(cause.clone()),
                _ => None,
            };
            set_resource_state(state, *resource, ResourceState::Destroyed { cause }, position, now);
        }
        Effect::ResourceLost { resource, stamp } => {
            set_resource_state(state, *resource, ResourceState::Lost { stamp: *stamp }, position, now);
            let policy_window = state.policy().agent.loss_window;
            if let Some(agent) = agent_of(state, key)
                && !agent.breaker_bypass
                && agent.bypass_spent_on != Some(*stamp)
            {
                // `settings_of`, with the policy read before the agent is borrowed.
                let loss_window = agent.settings.as_ref().map_or(policy_window, |s| s.loss_window);
                let window_start = now.saturating_sub(loss_window);
                while agent.recent_losses.front().is_some_and(|t| *t <= window_start) {
                    agent.recent_losses.pop_front();
                }
                agent.recent_losses.push_back(now);
            }
        }
        Effect::ResourceOrphaned { resource } => {
            let gone_at = agent_of(state, key).and_then(|agent| agent.gone_at);
            set_resource_state(state, *resource, ResourceState::Orphaned { gone_at }, position, now);
        }
        Effect::ResourceFailed { resource, detail } => {
            set_resource_state(state, *resource, ResourceState::Failed { detail: detail.clone() }, position, now);
        }
        Effect::ClaimReleasable { resource, pool, token, .. } => {
            let mut last_held_of = None;
            if let Some(r) = state.resources.get_mut(resource)
                && let Some(slot) = r.claims.get_mut(pool)
            {
                let was_held = matches!(slot, ClaimSlot::HeldForOrphan { .. });
                // The plain cause is what the terminal state says; `claim-release-cause` right after says otherwise.
                let cause = match r.state {
                    ResourceState::Orphaned { .. } => FreeCause::Orphaned {},
                    _ => FreeCause::Released {},
                };
                *slot = ClaimSlot::Returned { token: *token, cause };
                if was_held && !r.holds_for_orphan() {
                    last_held_of = Some((r.agent.clone(), r.terminal_at));
                }
            }
            // Kept past the horizon while it held (see `forget_old`): forgotten a horizon from now, not by the entry
            // its end made (a let-go just before that entry's horizon would be forgotten at once, and its returned
            // grant, looking unknown, sent back and freed without its cause).
            let left_at = last_held_of.as_ref().and_then(|(agent, ended)| {
                let agent = state.agents.get(agent)?;
                let at = agent.left_by_position.iter().find(|(_, left)| **left == *resource).map(|(at, _)| *at)?;
                Some((at, *ended))
            });
            if let Some((left_at, ended)) = left_at {
                if let Some(ended) = ended {
                    state.forget.remove(&(ended.max(resource.time()), Forget::Resource(*resource, left_at)));
                }
                state.forget.insert((now.max(resource.time()), Forget::Resource(*resource, left_at)));
            }
        }
        Effect::ClaimReleaseCause { resource, pool, cause } => {
            if let Some(r) = state.resources.get_mut(resource)
                && let Some(ClaimSlot::Returned { cause: recorded, .. }) = r.claims.get_mut(pool)
            {
                *recorded = cause.clone();
            }
        }
        Effect::ClaimOrphanPolicy { resource, pool, orphans: policy } => {
            if let Some(r) = state.resources.get_mut(resource)
                && let Some(ClaimSlot::Bound { orphans, .. }) = r.claims.get_mut(pool)
            {
                *orphans = *policy;
            }
        }
        Effect::ClaimHeldForOrphan { resource, pool, value, token } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.claims.insert(pool.clone(), ClaimSlot::HeldForOrphan { value: *value, token: *token });
            }
        }
        Effect::PoolOrphanPolicy { orphans } => {
            if let Some(pool) = pool_of(state, key) {
                pool.orphans = *orphans;
            }
        }
        // The pool's record of why: for audit (`why --ip`); the pool's state is the same whatever the cause.
        Effect::ClaimFreedBecause { .. } => {}
        Effect::GrantReturned { resource, pool, token, .. } => {
            let leasehold_schemas::Key::Agent(agent) = key else {
                return;
            };
            let holder = ResourceRef::new(agent.clone(), *resource);
            if !resource_is(state, &holder) {
                let until = now.max(resource.time());
                state.forget.insert((until, Forget::ReturnedGrant(holder.clone(), pool.clone(), *token)));
            }
            state.returned_grants.insert((holder, pool.clone(), *token));
        }
        Effect::ChildAdopted { parent, parent_state: leasehold_schemas::command::ParentState::Absent, .. } => {
            // Never allocated here from now on: the answer "absent" stays true.
            state.absent.insert(*parent);
            state.forget.insert((now.max(parent.time()), Forget::Absent(*parent)));
        }
        Effect::ChildAdopted { .. } => {}
        Effect::LeaseWaiting { lease, resource, holder, ttl, wait_until } => {
            let new = NewLease { lease: *lease, resource: *resource, holder, ttl: *ttl, priority: 0 };
            insert_lease(state, key, new, LeaseState::Waiting { until: *wait_until }, position, now);
        }
        Effect::LeaseQueued { lease, resource, holder, ttl, wait_until, priority } => {
            let new = NewLease { lease: *lease, resource: *resource, holder, ttl: *ttl, priority: *priority };
            insert_lease(state, key, new, LeaseState::Waiting { until: *wait_until }, position, now);
        }
        Effect::LeaseGranted { lease, resource, holder, ttl, expires_at } => {
            let granted = LeaseState::Active { token: position, expires_at: *expires_at };
            match state.leases.get_mut(lease) {
                Some(existing) => {
                    existing.state = granted;
                    existing.granted_at = Some(now);
                }
                None => {
                    let new = NewLease { lease: *lease, resource: *resource, holder, ttl: *ttl, priority: 0 };
                    insert_lease(state, key, new, granted, position, now);
                }
            }
        }
        Effect::LeaseRenewed { lease, ttl, expires_at } => {
            if let Some(l) = state.leases.get_mut(lease) {
                l.ttl = *ttl;
                if let LeaseState::Active { expires_at: e, .. } = &mut l.state {
                    *e = *expires_at;
                }
            }
        }
        Effect::LeaseReleased { lease } => end_lease(state, *lease, LeaseState::Released, now),
        Effect::LeaseBroken { lease, reason } => end_lease(state, *lease, LeaseState::Broken { reason: *reason }, now),
        Effect::LeaseExpired { lease } => end_lease(state, *lease, LeaseState::Expired, now),
        Effect::LeaseFailed { lease } => end_lease(state, *lease, LeaseState::Failed, now),
        Effect::PoolDefined { kind, cooldown } => {
            let leasehold_schemas::Key::Pool(name) = key else {
                return;
            };
            state.pools.insert(
                name.clone(),
                Pool {
                    name: name.clone(),
                    kind: kind.clone(),
                    cooldown: *cooldown,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                    next_fresh: 0,
                    recovered: Default::default(),
                    cooling: Default::default(),
                    held: Default::default(),
                    holders: Default::default(),
                    waiters: Default::default(),
                    released: Default::default(),
                },
            );
        }
        Effect::PoolUpdated { kind, cooldown, recovered } => {
            let Some(pool) = pool_of(state, key) else {
                return;
            };
            pool.kind = kind.clone();
            pool.cooldown = *cooldown;
            // Excluded now: never handed out again (one still held is dropped when it is freed).
            pool.cooling.retain(|_, value| kind.contains(value));
            pool.recovered.retain(|value| kind.contains(value));
            pool.recovered.extend(recovered.iter().copied());
        }
        Effect::PoolDeleted {} => {
            if let leasehold_schemas::Key::Pool(name) = key {
                state.pools.remove(name);
            }
        }
        Effect::ClaimGranted { holder, value, source } => {
            let Some(pool) = pool_of(state, key) else {
                return;
            };
            match pool.kind.index_of(value) {
                Some(idx) if idx >= pool.next_fresh => pool.next_fresh = idx + 1,
                _ => {
                    pool.cooling.retain(|_, v| v != value);
                    pool.recovered.remove(value);
                }
            }
            if let Some(Holding::Waiting { queued_at, .. }) = pool.holders.get(holder) {
                pool.waiters.remove(queued_at);
            }
            pool.held.insert(*value, holder.clone());
            // The policy as the pool grants: what the grant carries to its holder, whatever the pool says later.
            let orphans = pool.orphans;
            pool.holders
                .insert(holder.clone(), Holding::Granted { value: *value, token: position, source: *source, orphans });
        }
        Effect::ClaimQueued { holder, source } => {
            let Some(pool) = pool_of(state, key) else {
                return;
            };
            pool.waiters.insert(position, holder.clone());
            pool.holders.insert(holder.clone(), Holding::Waiting { queued_at: position, source: *source });
        }
        Effect::ClaimFreed { holder, value, .. } => {
            let Some(pool) = pool_of(state, key) else {
                return;
            };
            pool.held.remove(value);
            // An identifier excluded while it was held is not put back.
            if pool.kind.contains(value) {
                pool.cooling.insert((now, position), *value);
            }
            if let Some(forget) = end_claim(pool, holder, position) {
                state.forget.insert((now, forget));
            }
        }
        Effect::ClaimWithdrawn { holder } => {
            let Some(pool) = pool_of(state, key) else {
                return;
            };
            if let Some(forget) = end_claim(pool, holder, position) {
                state.forget.insert((now, forget));
            }
        }
        Effect::PartitionSettingsChanged { settings } => {
            state.settings = settings.clone();
        }
        // The pending decision is recorded by `apply` from the outcome as a whole.
        Effect::DecisionContinues { .. } => {}
        Effect::GarbageDestroyOrdered { handle, .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.quarantined.remove(handle);
                agent.garbage_orders.insert(*handle, position);
            }
        }
        Effect::GarbageDryRun { .. } => {}
        Effect::GarbageDestroyed { handle, .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.garbage_orders.remove(handle);
            }
        }
        Effect::HandleReappeared { resource, .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.quarantined.insert(*resource, position);
            }
        }
        Effect::AgentDriverUnavailable { detail } => {
            if let Some(agent) = agent_of(state, key) {
                agent.driver_unavailable = Some(detail.clone());
            }
        }
        Effect::AgentDriverAvailable {} => {
            if let Some(agent) = agent_of(state, key) {
                agent.driver_unavailable = None;
            }
        }
        Effect::AgentUnretired { .. } => {
            if let Some(agent) = agent_of(state, key) {
                agent.retired = false;
            }
        }
        Effect::AgentCordoned { by, reason } => {
            if let Some(agent) = agent_of(state, key) {
                agent.cordon = Some(Cordon { by: by.clone(), reason: reason.clone(), since: now });
            }
        }
        Effect::AgentUncordoned { .. } => {
            // Uncordon ends a drain too: what it released stays released.
            if let Some(agent) = agent_of(state, key) {
                agent.cordon = None;
                agent.drain = None;
            }
        }
        Effect::AgentDeclared { labels, capacity } => {
            if let Some(agent) = agent_of(state, key) {
                agent.labels = labels.clone();
                agent.capacity = capacity.clone();
            }
        }
        Effect::GcModeChanged { mode } => {
            state.gc_mode = *mode;
        }
        // For the agent (the network of an address) and for people (why a destroy waits): no state of the writer.
        Effect::ClaimPoolDefinition { .. } | Effect::DestroyBlocked { .. } => {}
        Effect::PlacementWanted { request, until } => {
            let placement = Placement {
                request: request.clone(),
                issuer: issuer.clone(),
                wanted_at: position,
                at: now,
                until: *until,
                state: PlacementState::Seeking,
            };
            state.placements.insert(request.resource, placement);
        }
        Effect::PlacementWaiting { resource, why } => {
            if let Some(placement) = state.placements.get_mut(resource) {
                let since = match &placement.state {
                    PlacementState::Waiting { since, .. } => *since,
                    _ => now,
                };
                placement.state = PlacementState::Waiting { why: why.clone(), since };
            }
        }
        Effect::PlacementBound { resource, agent, token, used, capacity } => {
            let next = PlacementState::Bound {
                agent: agent.clone(),
                token: *token,
                used: *used,
                capacity: *capacity,
                at: now,
                closed: false,
            };
            // Not forgotten yet: the placement is kept until its commit is on record (`placement-closed`).
            if let Some(placement) = state.placements.get_mut(resource) {
                placement.state = next;
            }
        }
        Effect::ResourceMaxLeaseChanged { resource, max_lease } => {
            if let Some(r) = state.resources.get_mut(resource) {
                r.max_lease = *max_lease;
            }
        }
        Effect::PriorityCapsChanged { max_priority } => {
            state.priority_caps = max_priority.clone();
        }
        Effect::QuotaSet { quota, max, principals } => {
            state.quotas.insert(quota.clone(), Quota { max: max.clone(), principals: principals.clone() });
        }
        Effect::QuotaRemoved { quota } => {
            state.quotas.remove(quota);
        }
        Effect::PlacementClosed { resource } => {
            if let Some(placement) = state.placements.get_mut(resource)
                && let PlacementState::Bound { closed, .. } = &mut placement.state
            {
                *closed = true;
                state.forget.insert((now.max(resource.time()), Forget::Placement(*resource)));
            }
        }
        Effect::PlacementFailed { resource, why } => {
            end_placement(state, *resource, PlacementState::Failed { why: why.clone(), at: now }, now);
        }
        Effect::PlacementCancelled { resource, by, reason } => {
            let next = PlacementState::Cancelled { by: by.clone(), reason: reason.clone(), at: now };
            end_placement(state, *resource, next, now);
        }
        Effect::CapacityReserved { resource, kind, source, used, capacity } => {
            if let Some(agent) = agent_of(state, key) {
                let reservation = Reservation {
                    kind: kind.as_str().into(),
                    token: position,
                    source: *source,
                    used: *used,
                    capacity: *capacity,
                };
                agent.reservations.insert(*resource, reservation);
            }
        }
        Effect::ReservationEnded { resource, token, .. } => {
            if let Some(agent) = agent_of(state, key)
                && agent.reservations.get(resource).is_some_and(|r| r.token == *token)
            {
                agent.reservations.remove(resource);
            }
        }
        Effect::AgentDraining { by, reason, deadline, grace } => {
            if let Some(agent) = agent_of(state, key) {
                // A drain asked for again with other settings keeps its start: what was idle stays idle as long.
                let since = agent.drain.as_ref().map_or(now, |d| d.since);
                agent.drain =
                    Some(Drain { by: by.clone(), reason: reason.clone(), since, deadline: *deadline, grace: *grace });
            }
        }
    }
}

/// Ends a placement (failed or cancelled): forgotten after the horizon, and until then its resource id
/// answers a retry of the request.
fn end_placement(state: &mut PartitionState, id: ResourceId, next: PlacementState, now: Timestamp) {
    if let Some(placement) = state.placements.get_mut(&id) {
        placement.state = next;
        state.forget.insert((now.max(id.time()), Forget::Placement(id)));
    }
}

/// Ends a holder's claim on a pool at `position` (freed or withdrawn): the pool remembers it as released, and the
/// entry that forgets that record after the horizon is returned.
fn end_claim(pool: &mut Pool, holder: &ResourceRef, position: Position) -> Option<Forget> {
    let source = match pool.holders.remove(holder)? {
        Holding::Waiting { queued_at, source } => {
            pool.waiters.remove(&queued_at);
            source
        }
        Holding::Granted { source, .. } => source,
    };
    pool.released.insert(holder.clone(), (source, position));
    Some(Forget::PoolHolder(pool.name.clone(), holder.clone(), position))
}

/// What the effect that makes a lease says of it.
struct NewLease<'e> {
    lease: leasehold_schemas::LeaseId,
    resource: ResourceId,
    holder: &'e str,
    ttl: Option<leasehold_schemas::Millis>,
    priority: u8,
}

fn insert_lease(
    state: &mut PartitionState,
    key: &leasehold_schemas::Key,
    new: NewLease<'_>,
    lease_state: LeaseState,
    position: Position,
    now: Timestamp,
) {
    let leasehold_schemas::Key::Agent(agent) = key else {
        return;
    };
    let granted_at = matches!(lease_state, LeaseState::Active { .. }).then_some(now);
    state.leases.insert(
        new.lease,
        Lease {
            id: new.lease,
            resource: new.resource,
            agent: agent.clone(),
            holder: new.holder.to_owned(),
            ttl: new.ttl,
            state: lease_state,
            requested_pos: position,
            priority: new.priority,
            requested_at: now,
            granted_at,
            terminal_at: None,
            last_renew: None,
        },
    );
    if let Some(r) = state.resources.get_mut(&new.resource) {
        r.live_leases.insert(position, new.lease);
    }
}
