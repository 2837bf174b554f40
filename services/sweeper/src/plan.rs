//! What the sweeper asks for, planned from the partitions' states: pure, so it is tested without a log.
//!
//! The plan is level-triggered, as a Kubernetes controller is: it compares what the states say with what they
//! should say and asks for the difference, whatever happened before (a lost command, a sweeper that restarted,
//! another sweeper that asked first). Every request is decided by the partition it goes to, against its own state:
//! one planned from a view that is behind is refused there (`not-yet-due`, `already-done`, a stale source), never
//! applied twice. Cross-partition work names its source (partition, position): the target ignores anything not newer
//! than what it last heard from there.

mod placement;

use std::collections::BTreeMap;

use leasehold_domain::PartitionState;
use leasehold_domain::due;
use leasehold_domain::state::{ClaimSlot, Holding, LeaseState, Liveness, PendingClock, Pool, Resource, ResourceState};
use leasehold_schemas::command::{
    Adopt, BindClaim, Cascade, Claim, Command, CreateTimeout, DrainRelease, ExpireLease, ExpirePause, Free,
    MAX_QUOTA_HOLDERS_NAMED, MarkGone, MarkStalled, Orphan, OverQuota, ParentState, RequestHealthCheck, TickPool,
    WaitTimeout,
};
use leasehold_schemas::ids::{Key, PoolName, Position, ResourceRef, Source, Timestamp};
use leasehold_schemas::outcome::FreeCause;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};

/// One command the sweeper wants decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Names the work (what, about what, from which cause): planned again, the same work has the same key, and
    /// the command id derives from it, so sweepers that plan the same work send the same command.
    pub key: String,
    /// The log time from which it can be decided (`None`: now). Asked for earlier, it is refused `not-yet-due`.
    pub due: Option<Timestamp>,
    pub command: Command,
}

impl Planned {
    fn now(key: String, command: impl Into<Command>) -> Self {
        Planned { key, due: None, command: command.into() }
    }

    fn at(key: String, due: Timestamp, command: impl Into<Command>) -> Self {
        Planned { key, due: Some(due), command: command.into() }
    }
}

/// The partitions' states, as far as this sweeper has folded them.
pub type States = BTreeMap<u32, PartitionState>;

/// Everything the states ask for now or later, in partition order. `answers` are the adoption answers seen go by
/// (a `child-adopted` is an event, not a state: see [`adoption_answer`]).
pub fn plan(states: &States, answers: &BTreeMap<ResourceRef, Cascade>) -> Vec<Planned> {
    let mut out = Vec::new();
    for state in states.values() {
        time_driven(state, &mut out);
        drains(state, &mut out);
        for pool in state.pools() {
            pool_work(states, state.partition(), pool, &mut out);
        }
        for resource in state.resources() {
            claims_wanted(states, state, resource, &mut out);
            parent_work(states, state, resource, answers, &mut out);
        }
    }
    placement::placement_work(states, &mut out);
    out
}

/// Deadlines of one partition: leases, waits, creates, pauses, agents; health checks; orphans of gone agents.
fn time_driven(state: &PartitionState, out: &mut Vec<Planned>) {
    for lease in state.leases() {
        let Some(at) = due::lease_due(lease) else { continue };
        let (agent, id) = (lease.agent.clone(), lease.id);
        if matches!(lease.state, LeaseState::Waiting { .. }) {
            out.push(Planned::at(format!("wait-timeout {agent}.{id} {at}"), at, WaitTimeout { agent, lease: id }));
        } else {
            out.push(Planned::at(format!("expire-lease {agent}.{id} {at}"), at, ExpireLease { agent, lease: id }));
        }
    }
    for resource in state.resources() {
        let (agent, id) = (resource.agent.clone(), resource.id);
        if let Some(at) = due::create_due(state, resource) {
            out.push(Planned::at(
                format!("create-timeout {agent}.{id} {at}"),
                at,
                CreateTimeout { agent, resource: id },
            ));
        } else if let Some(at) = due::pause_due(resource) {
            out.push(Planned::at(format!("expire-pause {agent}.{id} {at}"), at, ExpirePause { agent, resource: id }));
        } else if let ResourceState::Suspect { asked: None, .. } = resource.state {
            // A check asked for and not answered is not asked again here: the agent runs it when it is back.
            out.push(Planned::now(
                format!("health-check {agent}.{id} {}", resource.allocated_pos),
                RequestHealthCheck { agent, resource: id },
            ));
        }
    }
    for agent in state.agents() {
        let name = agent.name.clone();
        match agent.liveness {
            Liveness::Live => {
                let at = due::stall_due(state, agent);
                out.push(Planned::at(format!("mark-stalled {name} {at}"), at, MarkStalled { agent: name.clone() }));
                let at = due::gone_due(state, agent);
                out.push(Planned::at(format!("mark-gone {name} {at}"), at, MarkGone { agent: name }));
            }
            Liveness::Stalled => {
                let at = due::gone_due(state, agent);
                out.push(Planned::at(format!("mark-gone {name} {at}"), at, MarkGone { agent: name }));
            }
            Liveness::Gone if state.pending().is_none() => {
                // Going `gone` orphans everything in the same decision; what is left (allocated on the way) is
                // orphaned one by one.
                for resource in state.resources_of(agent).filter(|r| !r.state.is_terminal()) {
                    let id = resource.id;
                    out.push(Planned::now(
                        format!("orphan {name}.{id} {}", agent.epoch),
                        Orphan { agent: name.clone(), resource: id },
                    ));
                }
            }
            Liveness::Gone => {}
        }
    }
}

/// Each live resource of a draining agent, at the time it falls due: once it has held no lease for the drain's grace,
/// or at the deadline. One that holds a lease is planned only for the deadline (a lease that ends changes its due
/// time, and the plan with it); the key names the time, so planning again asks for the same thing.
fn drains(state: &PartitionState, out: &mut Vec<Planned>) {
    for agent in state.agents().filter(|a| a.drain.is_some()) {
        for resource in state.resources_of(agent) {
            let Some(at) = due::drain_due(state, resource).and_then(|due| due.at()) else { continue };
            let (name, id) = (agent.name.clone(), resource.id);
            out.push(Planned::at(
                format!("drain-release {name}.{id} {at}"),
                at,
                DrainRelease { agent: name, resource: id },
            ));
        }
    }
}

fn pool_partition(states: &States, pool: &PoolName) -> Option<u32> {
    let partitions = states.values().next()?.partitions();
    Some(partition_of_key(&Key::Pool(pool.clone()), partitions))
}

fn holder_state<'a>(states: &'a States, holder: &ResourceRef) -> Option<&'a PartitionState> {
    let partitions = states.values().next()?.partitions();
    states.get(&partition_of_agent(&holder.agent, partitions))
}

/// The resource `reference` names, as its partition holds it.
fn resource_at<'a>(state: &'a PartitionState, reference: &ResourceRef) -> Option<&'a Resource> {
    state.resource(reference.resource).filter(|r| r.agent == reference.agent)
}

/// A pool's side: grants to carry to their holders, claims to free, waiters to serve after a cool-down.
fn pool_work(states: &States, partition: u32, pool: &Pool, out: &mut Vec<Planned>) {
    let name = &pool.name;
    // The holders an over-quota refusal names: sorted once per pool, however many wait.
    let mut named_holders: Option<Vec<ResourceRef>> = None;
    for (holder, holding) in &pool.holders {
        let Some(home) = holder_state(states, holder) else { continue };
        let here = resource_at(home, holder);
        // Anything newer than the claim: the holder's partition as far as this sweeper has seen it.
        let from_home = Source { partition: home.partition(), position: home.last_position() };
        match holding {
            Holding::Granted { value, token, source, orphans } => {
                let slot = here.and_then(|r| r.claims.get(name));
                let free = |cause: FreeCause| Free {
                    pool: name.clone(),
                    holder: holder.clone(),
                    token: Some(*token),
                    source: from_home,
                    cause,
                };
                match slot {
                    Some(ClaimSlot::Bound { token: bound, .. }) if bound == token => {}
                    // An orphan keeps it (its pool holds an orphan's identifiers): nothing to carry until it lets go.
                    Some(ClaimSlot::HeldForOrphan { token: held, .. }) if held == token => {}
                    // Why an orphan's held identifier was let go travels with the free, for the pool's record. Any
                    // other free says `released`: a default pool's orphan is freed as before schema version 5 (the
                    // holder's end, `resource-orphaned`, already says why), so a writer of version 4 still reads it
                    // during an upgrade; only a pool that holds orphans, which needs version 5 anyway, gets a cause.
                    Some(ClaimSlot::Returned { token: Some(returned), cause }) if returned == token => {
                        let cause = match cause {
                            FreeCause::Orphaned {} => FreeCause::Released {},
                            other => other.clone(),
                        };
                        out.push(Planned::now(format!("free {name} {holder} {token}"), free(cause)));
                    }
                    _ if home.grant_returned(holder, name, *token) => {
                        out.push(Planned::now(format!("free {name} {holder} {token}"), free(FreeCause::Released {})));
                    }
                    // Wanted by this very claim, or anything else: the holder's partition binds it or sends it
                    // back (a grant it cannot keep), by its own state, not this view of it.
                    _ => out.push(Planned::now(
                        format!("bind-claim {name} {holder} {token}"),
                        BindClaim {
                            holder: holder.clone(),
                            pool: name.clone(),
                            value: *value,
                            token: *token,
                            source: Source { partition, position: *token },
                            wanted: *source,
                            // An address is of a network: the agent needs the subnet to put it on one.
                            definition: matches!(pool.kind, PoolKind::Ipv4 { .. }).then(|| pool.kind.clone()),
                            // What the holder's partition does with it if the holder is orphaned: the pool's
                            // policy when it granted (a later `update-pool` reaches holders granted after it).
                            orphans: *orphans,
                        },
                    )),
                }
            }
            Holding::Waiting { source, queued_at } => {
                // Queued on a quota's pool by an allocation that gave no wait, or whose quota now allows none of its
                // kind (lowered to 0): refused rather than left waiting.
                let none_allowed = home.quota_counted_by(name).map(|(_, _, max)| max == 0);
                let refused = here.is_some_and(|r| {
                    r.state == ResourceState::Pending
                        && matches!(r.claims.get(name), Some(ClaimSlot::Wanted { wanted_at }) if *wanted_at == source.position)
                        && (!matches!(r.pending_clock, Some(PendingClock::WaitsUntil(_))) || none_allowed == Some(true))
                });
                if refused && none_allowed.is_some() {
                    let holders = named_holders.get_or_insert_with(|| {
                        let mut holders: Vec<ResourceRef> = pool.held.values().cloned().collect();
                        holders.sort();
                        holders.truncate(MAX_QUOTA_HOLDERS_NAMED);
                        holders
                    });
                    out.push(Planned::now(
                        format!("over-quota {name} {holder} {}", queued_at),
                        OverQuota {
                            holder: holder.clone(),
                            pool: name.clone(),
                            source: Source { partition, position: *queued_at },
                            held: u32::try_from(pool.held.len()).unwrap_or(u32::MAX),
                            holders: holders.clone(),
                        },
                    ));
                }
                let gave_up = match here {
                    Some(resource) => {
                        matches!(resource.claims.get(name), Some(ClaimSlot::Returned { token: None, .. }))
                    }
                    // Unknown to the holder's partition as far as this view goes: withdraw it with a source as new
                    // as the view. If the view is behind the claim, the pool refuses it as stale.
                    None => true,
                };
                if gave_up && from_home.position > source.position {
                    out.push(Planned::now(
                        format!("withdraw {name} {holder} {}", source.position),
                        Free {
                            pool: name.clone(),
                            holder: holder.clone(),
                            token: None,
                            source: from_home,
                            cause: FreeCause::Released {},
                        },
                    ));
                }
            }
        }
    }
    // A slot pool lowered below what it holds serves nobody until a holder lets go: a free serves its waiters then.
    if !pool.waiters.is_empty()
        && pool.room_as(&pool.kind, 0) > 0
        && let Some(at) = pool.next_cooled_at()
    {
        out.push(Planned::at(format!("tick {name} {at}"), at, TickPool { pool: name.clone() }));
    }
}

/// A resource's side of its claims: a claim the pool has not heard of yet.
fn claims_wanted(states: &States, state: &PartitionState, resource: &Resource, out: &mut Vec<Planned>) {
    for (name, slot) in &resource.claims {
        let ClaimSlot::Wanted { wanted_at } = slot else { continue };
        let Some(pool) = pool_partition(states, name).and_then(|p| states.get(&p)).and_then(|s| s.pool(name)) else {
            // Not defined (as far as this view goes): the resource waits; once the pool is defined, it is claimed.
            continue;
        };
        let holder = resource.reference();
        let source = Source { partition: state.partition(), position: *wanted_at };
        let known =
            pool.holders.contains_key(&holder) || pool.released.get(&holder).is_some_and(|(ended, _)| *ended == source);
        if !known {
            out.push(Planned::now(
                format!("claim {name} {holder} {wanted_at}"),
                Claim { pool: name.clone(), holder, source },
            ));
        }
    }
}

/// What a parent's state means for a child, as its partition holds it now.
fn parent_state_of(parent_home: &PartitionState, parent: &ResourceRef) -> ParentState {
    resource_at(parent_home, parent).map_or(ParentState::Left, Resource::as_parent)
}

/// A child's side of its parent: adoption, the answer to it, and the parent's changes since.
fn parent_work(
    states: &States,
    state: &PartitionState,
    child: &Resource,
    answers: &BTreeMap<ResourceRef, Cascade>,
    out: &mut Vec<Planned>,
) {
    let Some(parent) = child.parent() else { return };
    if child.state.has_left() {
        return;
    }
    let partitions = state.partitions();
    let home = partition_of_agent(&parent.agent, partitions);
    let Some(parent_home) = states.get(&home) else { return };
    let reference = child.reference();
    let own_life = Source { partition: state.partition(), position: child.allocated_pos };
    if home != state.partition() && child.parent_seen().is_none() {
        // A parent whose placement holds room in its partition may be made there yet: asked now, it would be
        // refused `not-yet-due`; asked once the room is committed (or given back), it is answered for good.
        let reserved =
            parent_home.resource(parent.resource).is_none() && parent_home.reserved(parent.resource).is_some();
        if reserved {
            return;
        }
        match answers.get(&reference).filter(|answer| answer.answers == Some(own_life)) {
            Some(answer) => {
                out.push(Planned::now(format!("adopted {reference} {}", answer.source.position), answer.clone()))
            }
            None => out.push(Planned::now(
                format!("adopt {parent} {reference} {}", child.allocated_pos),
                Adopt { parent: parent.clone(), child: reference, source: own_life },
            )),
        }
        return;
    }
    // A parent in the child's own partition only when it may not exist any more (`None`) is `Left`: one not found in a
    // view of another partition may just not be there yet, and its adoption answer says so.
    if home != state.partition() && resource_at(parent_home, parent).is_none() {
        return;
    }
    let wanted = parent_state_of(parent_home, parent);
    let in_step = match wanted {
        ParentState::Left | ParentState::Absent => false,
        ParentState::Suspect => child.upstream_suspect().is_some(),
        ParentState::Healthy => child.upstream_suspect().is_none(),
    };
    let as_of = Source { partition: home, position: parent_home.last_position() };
    let heard_newer = child.parent_seen().is_some_and(|seen| seen >= as_of) && home != state.partition();
    if in_step || heard_newer {
        return;
    }
    out.push(Planned::now(
        format!("cascade {parent} {reference} {wanted:?} {}", as_of.position),
        Cascade { child: reference, parent: parent.clone(), parent_state: wanted, source: as_of, answers: None },
    ));
}

/// The cascade that carries a `child-adopted` (at `position` in `partition`) back to the child that asked.
pub fn adoption_answer(
    partition: u32,
    position: Position,
    parent: &ResourceRef,
    child: &ResourceRef,
    child_source: Source,
    parent_state: ParentState,
) -> Cascade {
    Cascade {
        child: child.clone(),
        parent: parent.clone(),
        parent_state,
        source: Source { partition, position },
        answers: Some(child_source),
    }
}
