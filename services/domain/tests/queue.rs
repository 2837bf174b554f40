//! The queue of a busy resource (issue 19, item 1): table rows for each rule (queue or refuse, priority caps, who is
//! granted when room is made, what waiters do while the resource is paused, suspect, releasing or has its capacity
//! lowered, the longest hold while others wait), and a property test that no waiter is overtaken by a lease that
//! arrived more than `(cap - p) * AGING_STEP` after it, and that every waiter is granted or fails.
//!
//! One partition is enough: a resource's leases and its queue live in its agent's partition, and every rule is decided
//! there (no cross-partition protocol takes part).

mod support;

use std::collections::{BTreeMap, BTreeSet};

use Then::{Effects, Rejected};
use leasehold_domain::state::{AGING_STEP, LeaseState};
use leasehold_schemas::Outcome;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Key, LeaseId, Millis, Position, Timestamp};
use leasehold_schemas::outcome::Effect;
use proptest::prelude::*;
use support::*;

// --- helpers of this file -----------------------------------------------------------------------------------------

/// Sets the partition's priority caps.
fn caps(w: &mut World, caps: &[(&str, u8)]) -> Outcome {
    let agent = w.a();
    let max_priority = caps.iter().map(|(prefix, cap)| ((*prefix).to_owned(), *cap)).collect();
    w.op(SetPartitionSettings {
        key: Key::Agent(agent),
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: Some(max_priority),
    })
}

/// Asks for a lease on `w.r()` with `priority`, waiting up to `wait`; returns its id.
fn ask(w: &mut World, priority: u8, wait: Option<Millis>) -> (LeaseId, Outcome) {
    let mut cmd = w.acquire_cmd(None, wait);
    cmd.priority = priority;
    let lease = cmd.lease;
    (lease, w.op(cmd))
}

/// Queues a lease (priority 0, waiting up to ten minutes) and asserts it queued.
fn queued(w: &mut World) -> LeaseId {
    let (lease, outcome) = ask(w, 0, Some(Millis::from_mins(10)));
    assert_eq!(effect_names(&outcome), ["lease-queued"]);
    lease
}

/// An active resource `w.r()` of capacity 1 whose one lease is held, and one lease queued behind it.
fn busy_with_one_waiting(w: &mut World) {
    w.active_with(|c| c.capacity = 1);
    w.leased(None);
    queued(w);
}

/// The active leases of `w.r()`, by grant position (their token).
fn holders(w: &World) -> Vec<(LeaseId, Position)> {
    let resource = w.state().resource(w.r()).expect("resource in state");
    let mut active: Vec<(LeaseId, Position)> = w
        .state()
        .live_leases_of(resource)
        .filter_map(|l| match l.state {
            LeaseState::Active { token, .. } => Some((l.id, token)),
            _ => None,
        })
        .collect();
    active.sort_by_key(|(_, token)| *token);
    active
}

/// Releases the longest-held active lease of `w.r()`.
fn release_oldest(w: &mut World) -> Outcome {
    let (lease, token) = holders(w)[0];
    let agent = w.a();
    w.op(ReleaseLease { agent, lease, token: Some(token) })
}

/// The leases granted in `outcome`.
fn granted(outcome: &Outcome) -> Vec<LeaseId> {
    outcome
        .effects()
        .iter()
        .filter_map(|e| match e {
            Effect::LeaseGranted { lease, .. } => Some(*lease),
            _ => None,
        })
        .collect()
}

fn update(w: &mut World, capacity: Option<u32>, max_lease: Option<Millis>) -> Outcome {
    let (agent, resource) = (w.a(), w.r());
    w.op(Update { agent, resource, set: Default::default(), remove: vec![], capacity, max_lease })
}

fn renew_oldest(w: &mut World, ttl: Millis) -> Outcome {
    let (lease, token) = holders(w)[0];
    let agent = w.a();
    w.op(Renew { agent, lease, token, ttl: Some(ttl) })
}

// --- table --------------------------------------------------------------------------------------------------------

#[test]
fn acquire_on_a_busy_resource() {
    check(vec![
        case(
            "with a wait timeout it queues",
            |w| {
                w.active_with(|c| c.capacity = 1);
                w.leased(None);
            },
            |w| ask(w, 0, Some(secs(60))).1,
            Effects(&["lease-queued"]),
        ),
        case(
            "without one it is refused, saying how many wait",
            busy_with_one_waiting,
            |w| ask(w, 0, None).1,
            Rejected(AtCapacity, &["is at capacity (1 of 1 leases held, 1 waiting)", "give a wait timeout to queue"]),
        ),
        case(
            "on a paused resource it is refused even with a wait timeout (no new leases while paused)",
            |w| {
                busy_with_one_waiting(w);
                let (agent, resource) = (w.a(), w.r());
                accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
            },
            |w| ask(w, 0, Some(secs(60))).1,
            Rejected(InvalidState, &["is paused; acquire refused"]),
        ),
        case(
            "a pending resource at capacity queues it with a wait timeout",
            |w| {
                w.registered().pending_with(|c| c.capacity = 1);
                let cmd = w.acquire_cmd(None, None);
                accepted(&w.op(cmd));
            },
            |w| ask(w, 0, Some(secs(60))).1,
            Effects(&["lease-queued"]),
        ),
        case(
            "a pending resource at capacity refuses it without one",
            |w| {
                w.registered().pending_with(|c| c.capacity = 1);
                let cmd = w.acquire_cmd(None, None);
                accepted(&w.op(cmd));
            },
            |w| ask(w, 0, None).1,
            Rejected(AtCapacity, &["pending with 1 of 1 leases already waiting", "give a wait timeout"]),
        ),
        case(
            "a priority on a pending resource with room queues (lease-waiting has no priority)",
            |w| {
                w.registered().pending();
                accepted(&caps(w, &[("op:", 3)]));
            },
            |w| ask(w, 2, None).1,
            Effects(&["lease-queued"]),
        ),
    ]);
}

#[test]
fn priority_caps() {
    check(vec![
        case(
            "an operator sets them",
            |w| {
                w.registered();
            },
            |w| caps(w, &[("ci:", 5)]),
            Effects(&["priority-caps-changed"]),
        ),
        case(
            "the same caps again change nothing",
            |w| {
                w.registered();
                accepted(&caps(w, &[("ci:", 5)]));
            },
            |w| caps(w, &[("ci:", 5)]),
            Rejected(AlreadyDone, &["already has these settings"]),
        ),
        case(
            "a prefix must be spelled as an issuer",
            |w| {
                w.registered();
            },
            |w| caps(w, &[("ci build", 5)]),
            Rejected(Invalid, &["issuer prefix", "\"ci build\""]),
        ),
        case(
            "a priority above 0 with no cap naming the issuer is refused",
            |w| {
                w.active();
                accepted(&caps(w, &[("ci:", 5)]));
            },
            |w| ask(w, 1, Some(secs(60))).1,
            Rejected(NotPermitted, &["priority 1 is above what op:alice may ask for: 0 (no priority cap names it)"]),
        ),
        case(
            "a priority above the cap of the longest matching prefix is refused, naming it",
            |w| {
                w.active();
                accepted(&caps(w, &[("op:", 9), ("op:al", 2)]));
            },
            |w| ask(w, 3, Some(secs(60))).1,
            Rejected(NotPermitted, &["2 (the cap of issuers starting with \"op:al\")", "policy set --max-priority"]),
        ),
        case(
            "a priority within the cap is granted at once on a resource with room",
            |w| {
                w.active();
                accepted(&caps(w, &[("op:", 2)]));
            },
            |w| ask(w, 2, None).1,
            Effects(&["lease-granted"]),
        ),
    ]);
}

#[test]
fn room_made_grants_the_head_of_the_queue() {
    check(vec![
        case("a release", busy_with_one_waiting, release_oldest, Effects(&["lease-released", "lease-granted"])),
        case(
            "an expiry",
            |w| {
                w.active_with(|c| c.capacity = 1);
                w.leased(Some(secs(30)));
                queued(w);
                w.advance(secs(31));
            },
            |w| {
                let (agent, lease) = (w.a(), holders(w)[0].0);
                w.sys(ExpireLease { agent, lease })
            },
            Effects(&["lease-expired", "lease-granted"]),
        ),
        case(
            "a waiter whose wait is over fails instead, and the next is granted",
            |w| {
                busy_with_one_waiting(w);
                w.advance(Millis::from_mins(9));
                queued(w);
                w.advance(Millis::from_mins(2));
            },
            release_oldest,
            Effects(&["lease-released", "lease-failed", "lease-granted"]),
        ),
        case(
            "the release of a waiter makes no room",
            |w| {
                busy_with_one_waiting(w);
            },
            |w| {
                let agent = w.a();
                let waiter = *w.state().queue_of(w.state().resource(w.r()).unwrap()).first().map(|l| &l.id).unwrap();
                w.op(ReleaseLease { agent, lease: waiter, token: None })
            },
            Effects(&["lease-released"]),
        ),
        case(
            "a higher capacity",
            |w| {
                busy_with_one_waiting(w);
                queued(w);
            },
            |w| update(w, Some(2), None),
            Effects(&["resource-updated", "lease-granted"]),
        ),
        case(
            "the sweeper's wait timeout ends a queued waiter",
            |w| {
                busy_with_one_waiting(w);
                w.advance(Millis::from_mins(10));
            },
            |w| {
                let agent = w.a();
                let lease = w.state().queue_of(w.state().resource(w.r()).unwrap())[0].id;
                w.sys(WaitTimeout { agent, lease })
            },
            Effects(&["lease-failed"]),
        ),
        case(
            "the sweeper's wait timeout before it is due",
            busy_with_one_waiting,
            |w| {
                let agent = w.a();
                let lease = w.state().queue_of(w.state().resource(w.r()).unwrap())[0].id;
                w.sys(WaitTimeout { agent, lease })
            },
            Rejected(NotYetDue, &["may wait until"]),
        ),
    ]);
}

#[test]
fn waiters_while_the_resource_is_not_serving() {
    fn pause(w: &mut World) {
        let (agent, resource) = (w.a(), w.r());
        accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
    }
    fn suspect(w: &mut World) {
        let reference = w.rref();
        accepted(&w.operator_failure(&reference, "slow disk"));
    }
    check(vec![
        case(
            "paused: a release grants nothing",
            |w| {
                busy_with_one_waiting(w);
                pause(w);
            },
            release_oldest,
            Effects(&["lease-released"]),
        ),
        case(
            "paused: the unpause grants the waiter",
            |w| {
                busy_with_one_waiting(w);
                pause(w);
                accepted(&release_oldest(w));
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                w.op(Unpause { agent, resource })
            },
            Effects(&["resource-unpaused", "lease-granted"]),
        ),
        case(
            "paused: a higher capacity grants nothing until the unpause",
            |w| {
                busy_with_one_waiting(w);
                pause(w);
            },
            |w| update(w, Some(2), None),
            Effects(&["resource-updated"]),
        ),
        case(
            "suspect: a release grants nothing",
            |w| {
                busy_with_one_waiting(w);
                suspect(w);
            },
            release_oldest,
            Effects(&["lease-released"]),
        ),
        case(
            "suspect: a passed health check grants the waiter",
            |w| {
                busy_with_one_waiting(w);
                suspect(w);
                accepted(&release_oldest(w));
            },
            |w| {
                let resource = w.r();
                w.health_of(resource, true, "fine")
            },
            Effects(&["observation-accepted", "resource-healthy", "lease-granted"]),
        ),
        case(
            "releasing: every waiter is broken with the holders, in the same decision",
            |w| {
                busy_with_one_waiting(w);
                queued(w);
            },
            |w| w.release(),
            Effects(&["resource-releasing", "lease-broken", "lease-broken", "lease-broken"]),
        ),
        case(
            "capacity lowered below the active leases is refused",
            |w| {
                w.active().leased(None).leased(None);
                queued(w);
            },
            |w| update(w, Some(1), None),
            Rejected(InvalidState, &["capacity 1 is below the 2 active leases"]),
        ),
        case(
            "capacity lowered while paused with room: the waiters keep waiting",
            paused_with_room,
            |w| update(w, Some(2), None),
            Effects(&["resource-updated"]),
        ),
    ]);
}

/// A paused resource of capacity 3 with one lease held and two waiting (room was made while it was paused).
fn paused_with_room(w: &mut World) {
    w.registered().pending_with(|c| c.capacity = 3);
    let (agent, resource) = (w.a(), w.r());
    accepted(&w.report_created(&agent, resource));
    w.leased(None).leased(None).leased(None);
    queued(w);
    queued(w);
    let (agent, resource) = (w.a(), w.r());
    accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
    assert_eq!(effect_names(&release_oldest(w)), ["lease-released"]);
    assert_eq!(effect_names(&release_oldest(w)), ["lease-released"]);
}

#[test]
fn a_lowered_capacity_grants_only_under_the_new_one() {
    let mut w = World::new();
    paused_with_room(&mut w);
    let first = w.state().queue_of(w.state().resource(w.r()).unwrap())[0].id;
    assert_eq!(effect_names(&update(&mut w, Some(2), None)), ["resource-updated"]);
    let (agent, resource) = (w.a(), w.r());
    let outcome = w.op(Unpause { agent, resource });
    assert_eq!(granted(&outcome), [first], "one held, capacity 2: room for one");
    settle(&w);
}

#[test]
fn max_lease_time() {
    check(vec![
        case(
            "an operator sets it",
            |w| {
                w.active();
            },
            |w| update(w, None, Some(Millis::from_mins(30))),
            Effects(&["resource-max-lease-changed"]),
        ),
        case(
            "with capacity and attributes in one update",
            |w| {
                w.active();
            },
            |w| update(w, Some(3), Some(Millis::from_mins(30))),
            Effects(&["resource-updated", "resource-max-lease-changed"]),
        ),
        case(
            "the same limit again changes nothing",
            |w| {
                w.active();
                accepted(&update(w, None, Some(Millis::from_mins(30))));
            },
            |w| update(w, None, Some(Millis::from_mins(30))),
            Rejected(AlreadyDone, &["already has this max lease time (30min)"]),
        ),
        case(
            "0 removes it",
            |w| {
                w.active();
                accepted(&update(w, None, Some(Millis::from_mins(30))));
            },
            |w| update(w, None, Some(Millis(0))),
            Effects(&["resource-max-lease-changed"]),
        ),
        case(
            "a renew past it is refused while others wait",
            |w| {
                busy_with_one_waiting(w);
                accepted(&update(w, None, Some(Millis::from_mins(30))));
                w.advance(Millis::from_mins(20));
            },
            |w| renew_oldest(w, Millis::from_mins(15)),
            Rejected(InvalidState, &["at most 30min from its grant", "1 waiting", "release it and acquire again"]),
        ),
        case(
            "a renew within it is accepted while others wait",
            |w| {
                busy_with_one_waiting(w);
                accepted(&update(w, None, Some(Millis::from_mins(30))));
                w.advance(Millis::from_mins(20));
            },
            |w| renew_oldest(w, Millis::from_mins(10)),
            Effects(&["lease-renewed"]),
        ),
        case(
            "a renew past it is accepted when nobody waits",
            |w| {
                w.active_with(|c| c.capacity = 1);
                w.leased(Some(Millis::from_mins(10)));
                accepted(&update(w, None, Some(Millis::from_mins(30))));
                w.advance(Millis::from_mins(9));
            },
            |w| renew_oldest(w, Millis::from_hours(1)),
            Effects(&["lease-renewed"]),
        ),
    ]);
}

#[test]
fn the_queue_is_bounded() {
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    w.leased(None);
    for _ in 0..leasehold_domain::MAX_QUEUED {
        queued(&mut w);
    }
    let (_, outcome) = ask(&mut w, 0, Some(secs(60)));
    let message = rejected(&outcome, AtCapacity);
    assert!(message.contains("256 leases waiting beyond its capacity, the most one resource queues"), "{message}");
    settle(&w);
}

// --- order ----------------------------------------------------------------------------------------------------------

#[test]
fn a_higher_priority_is_granted_first_then_the_earliest() {
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    accepted(&caps(&mut w, &[("op:", 5)]));
    w.leased(None);
    let (first_low, _) = ask(&mut w, 0, Some(Millis::from_mins(30)));
    let (high, _) = ask(&mut w, 3, Some(Millis::from_mins(30)));
    let (second_low, _) = ask(&mut w, 0, Some(Millis::from_mins(30)));
    let order: Vec<LeaseId> = w.state().queue_of(w.state().resource(w.r()).unwrap()).iter().map(|l| l.id).collect();
    assert_eq!(order, [high, first_low, second_low], "the queue as `leases` shows it");
    assert_eq!(granted(&release_oldest(&mut w)), [high]);
    assert_eq!(granted(&release_oldest(&mut w)), [first_low]);
    assert_eq!(granted(&release_oldest(&mut w)), [second_low]);
    settle(&w);
}

#[test]
fn a_waiter_ages_past_later_arrivals_of_higher_priority() {
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    accepted(&caps(&mut w, &[("op:", 3)]));
    w.leased(None);
    let (old, _) = ask(&mut w, 0, Some(Millis::from_hours(1)));
    // After (cap - 0) aging steps the old waiter ranks with any newcomer, and arrived first.
    w.advance(Millis(AGING_STEP.0 * 3));
    let (new, _) = ask(&mut w, 3, Some(Millis::from_hours(1)));
    assert_eq!(granted(&release_oldest(&mut w)), [old]);
    assert_eq!(granted(&release_oldest(&mut w)), [new]);
    // One step less, and the newcomer of the cap's priority would have come first.
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    accepted(&caps(&mut w, &[("op:", 3)]));
    w.leased(None);
    let (old, _) = ask(&mut w, 0, Some(Millis::from_hours(1)));
    w.advance(Millis(AGING_STEP.0 * 3 - 1));
    let (new, _) = ask(&mut w, 3, Some(Millis::from_hours(1)));
    assert_eq!(granted(&release_oldest(&mut w)), [new]);
    assert_eq!(granted(&release_oldest(&mut w)), [old]);
    settle(&w);
}

#[test]
fn activation_grants_the_queue_in_order_up_to_capacity() {
    let mut w = World::new();
    w.registered().pending_with(|c| c.capacity = 2);
    accepted(&caps(&mut w, &[("op:", 5)]));
    let (a, _) = ask(&mut w, 0, None);
    let (b, _) = ask(&mut w, 0, None);
    let (c, outcome) = ask(&mut w, 4, Some(Millis::from_mins(10)));
    assert_eq!(effect_names(&outcome), ["lease-queued"]);
    let (agent, resource) = (w.a(), w.r());
    let outcome = w.report_created(&agent, resource);
    let mut chosen = granted(&outcome);
    chosen.sort();
    let mut want = vec![c, a];
    want.sort();
    assert_eq!(chosen, want, "the priority-4 lease and the first of the others; {b} waits");
    settle(&w);
}

// --- the starvation bound, by property --------------------------------------------------------------------------

/// The highest priority the property's issuer may ask for.
const CAP: u8 = 4;

#[derive(Debug, Clone)]
enum Step {
    /// Ask for a lease with this priority and wait timeout (minutes).
    Ask { priority: u8, wait_min: u8 },
    /// Release the n-th active lease (mod their number).
    Release { nth: u8 },
    /// Log time moves on by this many seconds.
    Advance { secs: u16 },
    /// The sweeper ends every waiter whose wait is over.
    Sweep,
    /// An operator changes the capacity (never below the active leases: that is refused and changes nothing).
    Capacity { capacity: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..=CAP, 1u8..30).prop_map(|(priority, wait_min)| Step::Ask { priority, wait_min }),
        5 => any::<u8>().prop_map(|nth| Step::Release { nth }),
        4 => (0u16..400).prop_map(|secs| Step::Advance { secs }),
        1 => Just(Step::Sweep),
        1 => (1u8..4).prop_map(|capacity| Step::Capacity { capacity }),
    ]
}

/// What the property knows of a waiter: the leases that may still be granted before it.
struct Waiter {
    may_pass: BTreeSet<LeaseId>,
    priority: u8,
    queued_at: Timestamp,
}

/// Applies the promise to one outcome: a grant of a lease that may not pass a waiter is a violation; a lease queued
/// within `(CAP - p) * AGING_STEP` of a waiter of priority `p` may pass it.
fn follow(waiters: &mut BTreeMap<LeaseId, Waiter>, outcome: &Outcome, now: Timestamp) -> Result<(), String> {
    for effect in outcome.effects() {
        match effect {
            Effect::LeaseQueued { lease, priority, .. } => {
                // Every lease waiting now arrived before it and may pass it; it may pass every waiter whose window
                // is still open.
                for waiter in waiters.values_mut() {
                    let window = AGING_STEP.0 * u64::from(CAP - waiter.priority);
                    if now.since(waiter.queued_at).0 < window {
                        waiter.may_pass.insert(*lease);
                    }
                }
                let may_pass = waiters.keys().copied().collect();
                waiters.insert(*lease, Waiter { may_pass, priority: *priority, queued_at: now });
            }
            Effect::LeaseGranted { lease, .. } => {
                waiters.remove(lease);
                for (id, waiter) in waiters.iter() {
                    if !waiter.may_pass.contains(lease) {
                        return Err(format!(
                            "{lease} was granted before {id} (priority {}, queued at {}), though it arrived more than \
                             (cap - p) * AGING_STEP after it",
                            waiter.priority, waiter.queued_at
                        ));
                    }
                }
            }
            Effect::LeaseFailed { lease } | Effect::LeaseReleased { lease } | Effect::LeaseBroken { lease, .. } => {
                waiters.remove(lease);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Follows one outcome (see [`follow`]) and checks the invariants.
fn submit(w: &World, outcome: &Outcome, waiters: &mut BTreeMap<LeaseId, Waiter>) -> Result<(), TestCaseError> {
    follow(waiters, outcome, w.d.now()).map_err(TestCaseError::fail)?;
    leasehold_domain::invariants::check(w.state()).map_err(TestCaseError::fail)
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut w = World::new();
    w.active_with(|c| c.capacity = 1);
    accepted(&caps(&mut w, &[("op:", CAP)]));
    let mut waiters: BTreeMap<LeaseId, Waiter> = BTreeMap::new();
    for step in steps {
        let outcome = match step {
            Step::Ask { priority, wait_min } => ask(&mut w, *priority, Some(Millis::from_mins(u64::from(*wait_min)))).1,
            Step::Release { nth } => {
                let active = holders(&w);
                if active.is_empty() {
                    continue;
                }
                let (lease, token) = active[usize::from(*nth) % active.len()];
                let agent = w.a();
                w.op(ReleaseLease { agent, lease, token: Some(token) })
            }
            Step::Advance { secs: s } => {
                w.advance(secs(u64::from(*s)));
                continue;
            }
            Step::Sweep => {
                sweep(&mut w, &mut waiters)?;
                continue;
            }
            Step::Capacity { capacity } => update(&mut w, Some(u32::from(*capacity)), None),
        };
        submit(&w, &outcome, &mut waiters)?;
    }
    // Liveness: with every holder giving its lease back and time passing, every waiter is granted or fails.
    for _ in 0..(2 * leasehold_domain::MAX_QUEUED) {
        if holders(&w).is_empty() && waiters.is_empty() {
            break;
        }
        if holders(&w).is_empty() {
            w.advance(Millis::from_mins(31));
            sweep(&mut w, &mut waiters)?;
        } else {
            let outcome = release_oldest(&mut w);
            submit(&w, &outcome, &mut waiters)?;
        }
    }
    prop_assert!(waiters.is_empty(), "waiters left: {:?}", waiters.keys().collect::<Vec<_>>());
    let resource = w.state().resource(w.r()).unwrap();
    prop_assert!(w.state().queue_of(resource).is_empty());
    settle(&w);
    Ok(())
}

/// The sweeper's wait timeouts for every waiter that is due.
fn sweep(w: &mut World, waiters: &mut BTreeMap<LeaseId, Waiter>) -> Result<(), TestCaseError> {
    let now = w.d.now();
    let resource = w.state().resource(w.r()).unwrap();
    let due: Vec<LeaseId> = w
        .state()
        .queue_of(resource)
        .into_iter()
        .filter(|l| matches!(l.state, LeaseState::Waiting { until: Some(until) } if until <= now))
        .map(|l| l.id)
        .collect();
    for lease in due {
        let agent = w.a();
        let outcome = w.sys(WaitTimeout { agent, lease });
        submit(w, &outcome, waiters)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// No waiter is overtaken by a lease that arrived more than `(cap - p) * AGING_STEP` after it (so a waiter is
    /// granted no later than the grants of the leases that were waiting when it arrived and of those that arrived
    /// within that window), and every waiter is granted or fails.
    #[test]
    fn no_waiter_starves(steps in prop::collection::vec(step(), 1..120)) {
        run(&steps)?;
    }
}
