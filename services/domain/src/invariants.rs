//! Invariants every reachable partition state keeps. Tests check them after every step; a violation names the
//! thing and what is wrong.

use std::collections::BTreeMap;

use leasehold_schemas::ResourceId;
use leasehold_schemas::command::HandleDigest;
use leasehold_schemas::pool::PoolValue;

use crate::state::{ClaimSlot, Holding, PartitionState};

/// Checks the structural invariants of `state`.
pub fn check(state: &PartitionState) -> Result<(), String> {
    for resource in state.resources() {
        let name = resource.reference();
        let live: Vec<_> = state.live_leases_of(resource).collect();
        if live.len() != resource.live_leases.len() {
            return Err(format!("resource {name} lists a live lease that is not in state"));
        }
        let n_active = live.iter().filter(|l| matches!(l.state, crate::state::LeaseState::Active { .. })).count();
        let n_waiting = live.len() - n_active;
        if n_active as u64 > u64::from(resource.capacity) {
            return Err(format!("resource {name} has {n_active} active leases over capacity {}", resource.capacity));
        }
        if n_waiting > crate::MAX_QUEUED + resource.capacity as usize {
            return Err(format!("resource {name} has {n_waiting} waiting leases, over the queue's bound"));
        }
        // The queue is served whenever room is made: an active resource that may grant has no room while any wait.
        let serves = resource.state == crate::state::ResourceState::Active && resource.upstream_suspect().is_none();
        if serves && n_waiting > 0 && (n_active as u64) < u64::from(resource.capacity) {
            return Err(format!(
                "resource {name} is active with {n_active} of {} leases held while {n_waiting} wait",
                resource.capacity
            ));
        }
        if resource.state.has_left() && !live.is_empty() {
            return Err(format!("resource {name} is {} with live leases", resource.state.name()));
        }
        if resource.state.is_terminal()
            && resource.claims.values().any(|slot| match slot {
                ClaimSlot::Returned { .. } => false,
                // Only an orphan keeps a claim, of a pool that holds an orphan's identifiers.
                ClaimSlot::HeldForOrphan { .. } => {
                    !matches!(resource.state, crate::state::ResourceState::Orphaned { .. })
                }
                ClaimSlot::Wanted { .. } | ClaimSlot::Bound { .. } => true,
            })
        {
            return Err(format!("resource {name} is {} and still holds a claim", resource.state.name()));
        }
        if !resource.state.is_terminal()
            && resource.claims.values().any(|slot| matches!(slot, ClaimSlot::HeldForOrphan { .. }))
        {
            return Err(format!("resource {name} is {} and holds a claim as an orphan", resource.state.name()));
        }
        if live.iter().any(|lease| lease.resource != resource.id || !lease.state.is_live()) {
            return Err(format!("resource {name} lists a lease that is not its own live lease"));
        }
        if resource.state == crate::state::ResourceState::Pending && n_active > 0 {
            return Err(format!("pending resource {name} has an active lease"));
        }
    }
    let mut bound: BTreeMap<(&leasehold_schemas::PoolName, PoolValue), ResourceId> = BTreeMap::new();
    for resource in state.resources() {
        for (pool, slot) in &resource.claims {
            let value = match slot {
                ClaimSlot::Bound { value, .. } if !resource.state.is_terminal() => value,
                ClaimSlot::HeldForOrphan { value, .. } => value,
                _ => continue,
            };
            if let Some(other) = bound.insert((pool, *value), resource.id) {
                return Err(format!("{value} of pool {pool} is bound to both {other} and {}", resource.id));
            }
        }
    }
    for lease in state.leases() {
        if lease.state.is_live() && state.resource(lease.resource).is_none() {
            return Err(format!("live lease {} is on unknown resource {}", lease.id, lease.resource));
        }
    }
    for agent in state.agents() {
        let held: Vec<_> = state.resources_of(agent).filter(|r| r.state.is_held()).collect();
        let by_creation: BTreeMap<_, _> = held.iter().map(|r| (r.creation_position(), r.id)).collect();
        if held.len() as u64 != agent.n_held
            || HandleDigest::of(held.iter().map(|r| &r.id)) != agent.held_digest
            || by_creation != agent.held_by_creation
        {
            return Err(format!("agent {}'s held view does not match its resources", agent.name));
        }
        if agent.drain.is_some() && agent.cordon.is_none() {
            return Err(format!("agent {} drains without being cordoned", agent.name));
        }
        for id in agent.quarantined.keys() {
            if !agent.lost_id_known(state, *id) {
                return Err(format!("agent {} quarantines {id}, which is not a lost resource of it", agent.name));
            }
        }
        for (id, position) in &agent.garbage_orders {
            if state.resource(*id).is_some_and(|r| r.agent == agent.name && !r.state.is_terminal()) {
                return Err(format!("agent {}'s garbage order at {position} names its live resource {id}", agent.name));
            }
        }
        for (position, id) in &agent.releasing {
            let ok = state.resource(*id).is_some_and(|r| {
                matches!(r.state, crate::state::ResourceState::Releasing { .. })
                    && r.destruction_ordered == Some(*position)
            });
            if !ok {
                return Err(format!("agent {}'s releasing index is stale at {position}", agent.name));
            }
        }
    }
    for pool in state.pools() {
        let mut granted: BTreeMap<PoolValue, _> = BTreeMap::new();
        for (holder, holding) in &pool.holders {
            match holding {
                Holding::Granted { value, .. } => {
                    if granted.insert(*value, holder).is_some() {
                        return Err(format!("pool {}: {value} is granted to two holders", pool.name));
                    }
                    if pool.held.get(value) != Some(holder) {
                        return Err(format!("pool {}: {value} granted to {holder} is not in the held map", pool.name));
                    }
                    // Excluded since it was granted is allowed: it stays held until freed; so is a slot above a count
                    // lowered since (handed out before, below the fresh index).
                    if !in_range(&pool.kind, value, pool.next_fresh) {
                        return Err(format!("pool {}: {value} is not an identifier of the pool", pool.name));
                    }
                }
                Holding::Waiting { queued_at, .. } => {
                    if pool.waiters.get(queued_at) != Some(holder) {
                        return Err(format!("pool {}: waiting holder {holder} is not queued", pool.name));
                    }
                }
            }
        }
        if granted.len() != pool.held.len() {
            return Err(format!("pool {}: the held map has values nobody was granted", pool.name));
        }
        if pool.cooling.values().any(|v| pool.held.contains_key(v)) {
            return Err(format!("pool {}: an identifier is both held and cooling", pool.name));
        }
        if let Some(value) = pool.cooling.values().find(|v| !pool.kind.contains(v)) {
            return Err(format!("pool {}: {value} is cooling but the pool no longer hands it out", pool.name));
        }
        for value in &pool.recovered {
            if pool.held.contains_key(value) || pool.cooling.values().any(|v| v == value) {
                return Err(format!("pool {}: recovered {value} is also held or cooling", pool.name));
            }
            if pool.kind.index_of(value).is_none_or(|idx| idx >= pool.next_fresh) {
                return Err(format!(
                    "pool {}: recovered {value} is not a usable identifier below the fresh ones",
                    pool.name
                ));
            }
        }
        // Nothing is lost: every identifier handed out (below the fresh index) is held, cooling or recovered. Checked
        // on small pools only (a /16 is never materialised, not even here).
        if pool.next_fresh <= 4096 {
            let cooling: std::collections::BTreeSet<_> = pool.cooling.values().collect();
            for value in (0..pool.next_fresh).filter_map(|idx| pool.kind.value_at(idx)) {
                if !pool.held.contains_key(&value) && !cooling.contains(&value) && !pool.recovered.contains(&value) {
                    return Err(format!(
                        "pool {}: {value} is neither held, cooling nor recovered: it is lost",
                        pool.name
                    ));
                }
            }
        }
        if pool.waiters.len() != pool.holders.values().filter(|h| matches!(h, Holding::Waiting { .. })).count() {
            return Err(format!("pool {}: the queue and the waiting holders disagree", pool.name));
        }
    }
    Ok(())
}

/// True when `value` is within the range of `kind` (its exclusions and reserved addresses included).
fn in_range(kind: &leasehold_schemas::pool::PoolKind, value: &PoolValue, next_fresh: u64) -> bool {
    use leasehold_schemas::pool::PoolKind;
    let idx = match (kind, value) {
        (PoolKind::Ipv4 { network, .. }, PoolValue::Ipv4(addr)) => {
            u64::from(u32::from(*addr).wrapping_sub(u32::from(*network)))
        }
        (PoolKind::Slots { .. }, PoolValue::Slot(slot)) => return u64::from(*slot) < kind.size().max(next_fresh),
        (PoolKind::Ports { first, .. }, PoolValue::Port(port)) => u64::from(port.wrapping_sub(*first)),
        _ => return false,
    };
    idx < kind.size()
}
