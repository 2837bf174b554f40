//! Red team (issue 19 item 1): the queue of a busy resource under every command that touches it — acquire (with and
//! without a ttl), release, expiry, wait timeouts, pause and its expiry, unpause, operator failure and health
//! checks, capacity and max-lease updates, time jumps — checking after every step that the invariants hold, that no
//! grant passes a waiter that ranks above it (effective priority, then arrival), and that a refusal changes no lease.

mod support;

use leasehold_domain::state::{LeaseState, effective_priority};
use leasehold_schemas::Outcome;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Key, LeaseId, Millis, Position};
use leasehold_schemas::outcome::Effect;
use proptest::prelude::*;
use support::*;

const CAP: u8 = 4;

#[derive(Debug, Clone)]
enum Step {
    Ask {
        priority: u8,
        wait_min: Option<u8>,
        ttl_min: Option<u8>,
    },
    Release {
        nth: u8,
    },
    ReleaseWaiter {
        nth: u8,
    },
    Renew {
        nth: u8,
        ttl_min: u8,
    },
    Advance {
        secs: u16,
    },
    Sweep,
    Capacity {
        capacity: u8,
    },
    MaxLease {
        min: u8,
    },
    Pause {
        until_min: Option<u8>,
    },
    Unpause,
    Suspect,
    Health {
        healthy: bool,
    },
    /// The agent reports the pending resource created.
    Activate,
    /// An operator sets the caps (the issuer's `op:` cap).
    Caps {
        cap: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..=CAP + 1, prop::option::weighted(0.9, 1u8..30), prop::option::of(1u8..20))
            .prop_map(|(priority, wait_min, ttl_min)| Step::Ask { priority, wait_min, ttl_min }),
        4 => any::<u8>().prop_map(|nth| Step::Release { nth }),
        1 => any::<u8>().prop_map(|nth| Step::ReleaseWaiter { nth }),
        2 => (any::<u8>(), 1u8..60).prop_map(|(nth, ttl_min)| Step::Renew { nth, ttl_min }),
        4 => (0u16..900).prop_map(|secs| Step::Advance { secs }),
        2 => Just(Step::Sweep),
        1 => (0u8..5).prop_map(|capacity| Step::Capacity { capacity }),
        1 => (0u8..30).prop_map(|min| Step::MaxLease { min }),
        1 => prop::option::of(1u8..10).prop_map(|until_min| Step::Pause { until_min }),
        1 => Just(Step::Unpause),
        1 => Just(Step::Suspect),
        1 => (prop::bool::weighted(0.9)).prop_map(|healthy| Step::Health { healthy }),
        1 => Just(Step::Activate),
        1 => (0..=CAP).prop_map(|cap| Step::Caps { cap }),
    ]
}

fn leases_of(w: &World, active: bool) -> Vec<(LeaseId, Position)> {
    let Some(resource) = w.state().resource(w.r()) else { return vec![] };
    w.state()
        .live_leases_of(resource)
        .filter_map(|l| match l.state {
            LeaseState::Active { token, .. } if active => Some((l.id, token)),
            LeaseState::Waiting { .. } if !active => Some((l.id, Position::ZERO)),
            _ => None,
        })
        .collect()
}

/// Every grant in `outcome` of a lease that waited must rank at or above every lease still waiting after it
/// (and not past its wait), at the decision's time.
fn check_order(before: &leasehold_domain::state::PartitionState, w: &World, outcome: &Outcome) -> Result<(), String> {
    let now = w.d.now();
    let granted: Vec<LeaseId> = outcome
        .effects()
        .iter()
        .filter_map(|e| match e {
            Effect::LeaseGranted { lease, .. } => Some(*lease),
            _ => None,
        })
        .collect();
    let Some(resource) = w.state().resource(w.r()) else { return Ok(()) };
    let still: Vec<_> = w
        .state()
        .live_leases_of(resource)
        .filter(|l| matches!(l.state, LeaseState::Waiting { until } if until.is_none_or(|u| u > now)))
        .collect();
    for g in &granted {
        match before.lease(*g) {
            Some(lease) if matches!(lease.state, LeaseState::Waiting { .. }) => {
                let rank = (std::cmp::Reverse(effective_priority(lease, now)), lease.requested_pos);
                for s in &still {
                    let other = (std::cmp::Reverse(effective_priority(s, now)), s.requested_pos);
                    if other < rank {
                        return Err(format!("{g} (rank {rank:?}) granted before {} (rank {other:?})", s.id));
                    }
                }
            }
            Some(_) => return Err(format!("{g} granted but was not waiting")),
            None => {
                if !still.is_empty() {
                    return Err(format!("a new lease {g} was granted at once while {} wait", still.len()));
                }
            }
        }
    }
    Ok(())
}

fn run(steps: &[Step], pending: bool, capacity: u32) -> Result<(), TestCaseError> {
    let mut w = World::new();
    w.registered().pending_with(|c| c.capacity = capacity);
    let (agent, resource) = (w.a(), w.r());
    if !pending {
        accepted(&w.report_created(&agent, resource));
    }
    let key = Key::Agent(agent.clone());
    accepted(&w.op(SetPartitionSettings {
        key,
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: Some([("op:".to_owned(), CAP)].into_iter().collect()),
    }));
    for step in steps {
        let (agent, resource) = (w.a(), w.r());
        let mut outcomes: Vec<(leasehold_domain::state::PartitionState, Outcome)> = vec![];
        let before = w.state().clone();
        match step {
            Step::Ask { priority, wait_min, ttl_min } => {
                let mut cmd = w.acquire_cmd(
                    ttl_min.map(|m| Millis::from_mins(u64::from(m))),
                    wait_min.map(|m| Millis::from_mins(u64::from(m))),
                );
                cmd.priority = *priority;
                let cap = w.state().priority_cap_of(OP).0;
                let o = w.op(cmd);
                if *priority > cap {
                    prop_assert!(o.rejection().is_some(), "priority over the cap accepted");
                }
                outcomes.push((before, o));
            }
            Step::Release { nth } | Step::ReleaseWaiter { nth } => {
                let active = matches!(step, Step::Release { .. });
                let list = leases_of(&w, active);
                if list.is_empty() {
                    continue;
                }
                let (lease, token) = list[usize::from(*nth) % list.len()];
                let token = active.then_some(token);
                outcomes.push((before, w.op(ReleaseLease { agent, lease, token })));
            }
            Step::Renew { nth, ttl_min } => {
                let list = leases_of(&w, true);
                if list.is_empty() {
                    continue;
                }
                let (lease, token) = list[usize::from(*nth) % list.len()];
                let ttl = Some(Millis::from_mins(u64::from(*ttl_min)));
                outcomes.push((before, w.op(Renew { agent, lease, token, ttl })));
            }
            Step::Advance { secs: s } => {
                w.advance(secs(u64::from(*s)));
                continue;
            }
            Step::Sweep => {
                let now = w.d.now();
                let res = w.state().resource(resource).unwrap().clone();
                let due: Vec<(LeaseId, bool)> = w
                    .state()
                    .live_leases_of(&res)
                    .filter_map(|l| match l.state {
                        LeaseState::Waiting { until: Some(u) } if u <= now => Some((l.id, false)),
                        LeaseState::Active { expires_at: Some(e), .. } if e <= now => Some((l.id, true)),
                        _ => None,
                    })
                    .collect();
                for (lease, expire) in due {
                    let before = w.state().clone();
                    let o = if expire {
                        w.sys(ExpireLease { agent: agent.clone(), lease })
                    } else {
                        w.sys(WaitTimeout { agent: agent.clone(), lease })
                    };
                    outcomes.push((before, o));
                }
                if leasehold_domain::due::pause_due(&res).is_some_and(|u| u <= now) {
                    let before = w.state().clone();
                    let o = w.sys(ExpirePause { agent: agent.clone(), resource });
                    outcomes.push((before, o));
                }
            }
            Step::Capacity { capacity } => {
                let cmd = Update {
                    agent,
                    resource,
                    set: Default::default(),
                    remove: vec![],
                    capacity: Some(u32::from(*capacity)),
                    max_lease: None,
                };
                outcomes.push((before, w.op(cmd)));
            }
            Step::MaxLease { min } => {
                let cmd = Update {
                    agent,
                    resource,
                    set: Default::default(),
                    remove: vec![],
                    capacity: None,
                    max_lease: Some(Millis::from_mins(u64::from(*min))),
                };
                outcomes.push((before, w.op(cmd)));
            }
            Step::Pause { until_min } => {
                let until = until_min.map(|m| w.d.now().saturating_add(Millis::from_mins(u64::from(m))));
                outcomes.push((before, w.op(Pause { agent, resource, reason: None, until })));
            }
            Step::Unpause => outcomes.push((before, w.op(Unpause { agent, resource }))),
            Step::Activate => {
                if w.state().resource(resource).is_some_and(|r| r.state.name() == "pending") {
                    outcomes.push((before, w.report_created(&agent, resource)));
                }
            }
            Step::Caps { cap } => {
                let o = w.op(SetPartitionSettings {
                    key: Key::Agent(agent),
                    partition: 0,
                    outcome_horizon: None,
                    policy: None,
                    if_no_policy: false,
                    gc: None,
                    max_priority: Some([("op:".to_owned(), *cap)].into_iter().collect()),
                });
                outcomes.push((before, o));
            }
            Step::Suspect => {
                let r = w.rref();
                outcomes.push((before, w.operator_failure(&r, "slow")));
            }
            Step::Health { healthy } => {
                if !matches!(
                    w.state().resource(resource).map(|r| &r.state),
                    Some(leasehold_domain::state::ResourceState::Suspect { .. })
                ) {
                    continue;
                }
                let before = w.state().clone();
                let o = w.health_of(resource, *healthy, "check");
                outcomes.push((before, o));
            }
        }
        for (before, outcome) in &outcomes {
            if outcome.rejection().is_some() {
                prop_assert!(before.leases().eq(w.state().leases()) || outcomes.len() > 1, "a refusal changed leases");
            }
            check_order(before, &w, outcome).map_err(TestCaseError::fail)?;
        }
        leasehold_domain::invariants::check(w.state()).map_err(TestCaseError::fail)?;
        if w.state().resource(resource).is_some_and(|r| r.state.has_left()) {
            break;
        }
    }
    settle(&w);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_queue_keeps_its_promises_under_every_command(
        steps in prop::collection::vec(step(), 1..150),
        pending in any::<bool>(),
        capacity in 1u32..4,
    ) {
        run(&steps, pending, capacity)?;
    }
}

/// A pending resource of capacity `capacity` with `n` leases waiting within it (priority 0, no wait timeout).
fn pending_with_waiters(w: &mut World, capacity: u32, n: usize) {
    w.registered().pending_with(|c| c.capacity = capacity);
    for _ in 0..n {
        let cmd = w.acquire_cmd(None, None);
        assert_eq!(effect_names(&w.op(cmd)), ["lease-waiting"]);
    }
}

/// README: "A pending resource at capacity queues one with a wait timeout too", and the queue holds at most
/// `MAX_QUEUED` leases beyond the capacity. Before the fix, a pending resource of a capacity of `MAX_QUEUED` or more
/// counted the leases within its capacity as its queue, and refused as "full" with no lease queued at all.
#[test]
fn a_pending_resource_of_a_large_capacity_at_capacity_still_queues() {
    let mut w = World::new();
    pending_with_waiters(&mut w, 300, 300);
    let cmd = w.acquire_cmd(None, Some(Millis::from_mins(10)));
    let outcome = w.op(cmd);
    assert_eq!(effect_names(&outcome), ["lease-queued"], "{:?}", outcome.rejection());
    settle(&w);
}

/// A priority within the issuer's cap on a pending resource with room queues (lease-waiting has no priority), as a
/// priority-0 acquire there waits. Before the fix it was refused "has 256 leases waiting, the most one resource
/// queues" while the resource had room for 44 more and took a priority-0 acquire at once.
#[test]
fn a_priority_on_a_pending_resource_with_room_is_not_refused_as_a_full_queue() {
    let mut w = World::new();
    pending_with_waiters(&mut w, 300, leasehold_domain::MAX_QUEUED);
    let agent = w.a();
    accepted(&w.op(SetPartitionSettings {
        key: Key::Agent(agent),
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: Some([("op:".to_owned(), 1)].into_iter().collect()),
    }));
    let mut cmd = w.acquire_cmd(None, None);
    cmd.priority = 1;
    let outcome = w.op(cmd);
    assert_eq!(effect_names(&outcome), ["lease-queued"], "{:?}", outcome.rejection());
    let cmd = w.acquire_cmd(None, None);
    assert_eq!(effect_names(&w.op(cmd)), ["lease-waiting"]);
    settle(&w);
}

/// README (leases that queue): a resource that leaves breaks its waiters with the holders' reason: a failed health
/// check breaks them with `health-check-failed`, so a waiter learns why the resource it waited for went.
#[test]
fn a_failed_health_check_breaks_the_waiters_with_the_holders_reason() {
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    w.leased(None);
    let waiter = w.acquire_cmd(None, Some(Millis::from_mins(10)));
    let waiter_id = waiter.lease;
    assert_eq!(effect_names(&w.op(waiter)), ["lease-queued"]);
    let reference = w.rref();
    accepted(&w.operator_failure(&reference, "slow disk"));
    let outcome = w.health_of(w.r(), false, "probe failed");
    let reason = outcome.effects().iter().find_map(|e| match e {
        Effect::LeaseBroken { lease, reason } if *lease == waiter_id => Some(*reason),
        _ => None,
    });
    assert_eq!(reason, Some(leasehold_schemas::outcome::BreakReason::HealthCheckFailed), "the waiter's break");
    settle(&w);
}
