//! Table tests: agents (DESIGN sections 3, 4 and 5): registration and epochs, heartbeats, stalled and gone,
//! retirement, the breaker's confirm-loss, the checks every command passes (class and issuer, partition, staleness),
//! partition settings, idempotency and what the outcome horizon forgets.

mod support;

use Then::{Effects, Rejected};
use leasehold_domain::state::{Agent, Liveness};
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Key, Millis, Position, ResourceId, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{CommandClass, Outcome};
use support::*;

// --- helpers --------------------------------------------------------------------------------------------------

const DAY: Millis = Millis::from_hours(24);

fn ms(n: u64) -> Millis {
    Millis(n)
}

fn plus(a: Millis, b: Millis) -> Millis {
    Millis(a.0 + b.0)
}

fn minus(a: Millis, b: Millis) -> Millis {
    Millis(a.0 - b.0)
}

/// With the default settings: `stall_after` (60 s) plus a third of it.
fn stall_due() -> Millis {
    let s = AgentSettings::default();
    plus(s.stall_after, Millis(s.stall_after.0 / 3))
}

/// With the default settings: `orphan_after` (24 h) plus a third of `stall_after`.
fn gone_due() -> Millis {
    let s = AgentSettings::default();
    plus(s.orphan_after, Millis(s.stall_after.0 / 3))
}

fn agent(w: &World) -> &Agent {
    w.state().agent(&w.a()).expect("w1 registered")
}

fn allocate(w: &mut World) -> Outcome {
    let cmd = w.allocate_cmd(&w.a());
    w.op(cmd)
}

/// `n` new resources on `w1`, made active by one sync report.
fn active_n(w: &mut World, n: usize) -> Vec<ResourceId> {
    let made: Vec<ResourceId> = (0..n)
        .map(|_| {
            w.pending();
            w.r()
        })
        .collect();
    let a = w.a();
    let created = made.clone();
    accepted(&w.sync(&a, |r| r.created = created));
    made
}

/// `w1` with 8 active resources whose circuit breaker tripped on a report with 5 of them missing.
fn tripped(w: &mut World) -> Vec<ResourceId> {
    w.registered();
    let made = active_n(w, 8);
    let missing = made[..5].to_vec();
    let a = w.a();
    let outcome = w.sync(&a, |r| r.missing = missing);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "agent-suspect"]);
    made
}

fn mark_stalled(w: &mut World) -> Outcome {
    let agent = w.a();
    w.sys(MarkStalled { agent })
}

fn mark_gone(w: &mut World) -> Outcome {
    let agent = w.a();
    w.sys(MarkGone { agent })
}

fn stalled(w: &mut World) {
    w.advance(stall_due());
    accepted(&mark_stalled(w));
}

fn gone(w: &mut World) {
    w.advance(gone_due());
    accepted(&mark_gone(w));
}

fn retire(w: &mut World) -> Outcome {
    let agent = w.a();
    w.op(RetireAgent::new(agent))
}

fn confirm_loss(w: &mut World) -> Outcome {
    let agent = w.a();
    w.op(ConfirmLoss { agent })
}

fn register(w: &mut World, settings: AgentSettings, wiped: bool) -> Outcome {
    let a = w.a();
    w.register_with(&a, settings, wiped)
}

fn settings(edit: impl FnOnce(&mut AgentSettings)) -> AgentSettings {
    let mut s = AgentSettings::default();
    edit(&mut s);
    s
}

fn partition_settings(w: &mut World, partition: u32, horizon: Millis) -> Outcome {
    let key = Key::Agent(w.a());
    w.op(SetPartitionSettings {
        key,
        partition,
        outcome_horizon: Some(horizon),
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: None,
    })
}

/// An agent name that hashes to `partition` of `partitions`.
fn agent_in(partition: u32, partitions: u32) -> leasehold_schemas::AgentName {
    (0..1000)
        .map(|i| agent_name(&format!("w{i}")))
        .find(|name| partition_of_key(&Key::Agent(name.clone()), partitions) == partition)
        .expect("some name hashes there")
}

// --- registration -----------------------------------------------------------------------------------------------

#[test]
fn registration() {
    check(vec![
        case(
            "a new agent registers",
            |_| {},
            |w| register(w, AgentSettings::default(), false),
            Effects(&["agent-registered"]),
        ),
        case(
            "a live agent registers a new incarnation",
            |w| {
                w.registered();
            },
            |w| register(w, AgentSettings::default(), false),
            Effects(&["agent-registered"]),
        ),
        case(
            "orphan_after equal to stall_after",
            |_| {},
            |w| register(w, settings(|s| s.orphan_after = s.stall_after), false),
            Rejected(Invalid, &["agent w1", "orphan_after (1min) must be longer than stall_after (1min)"]),
        ),
        case(
            "orphan_after shorter than stall_after",
            |_| {},
            |w| register(w, settings(|s| s.orphan_after = secs(30)), false),
            Rejected(Invalid, &["orphan_after (30s) must be longer than stall_after"]),
        ),
        case(
            "max_loss_percent over 100",
            |_| {},
            |w| register(w, settings(|s| s.max_loss_percent = 101), false),
            Rejected(Invalid, &["max_loss_percent 101 is over 100"]),
        ),
        case(
            "max_loss_percent of exactly 100 is allowed",
            |_| {},
            |w| register(w, settings(|s| s.max_loss_percent = 100), false),
            Effects(&["agent-registered"]),
        ),
        case(
            "a zero stall_after",
            |_| {},
            |w| register(w, settings(|s| s.stall_after = ms(0)), false),
            Rejected(Invalid, &["stall_after must be longer than 0"]),
        ),
        case(
            "a zero loss window",
            |_| {},
            |w| register(w, settings(|s| s.loss_window = ms(0)), false),
            Rejected(Invalid, &["loss_window must be longer than 0"]),
        ),
        case(
            "invalid settings on a re-registration",
            |w| {
                w.registered();
            },
            |w| register(w, settings(|s| s.max_loss_percent = 200), true),
            Rejected(Invalid, &["max_loss_percent 200"]),
        ),
        case(
            "a retired agent with a resource still releasing registers to finish it, and stays retired",
            |w| {
                w.active();
                accepted(&retire(w));
            },
            |w| {
                let outcome = register(w, AgentSettings::default(), false);
                assert!(w.state().agent(&w.a()).unwrap().retired, "still retired: no new placements");
                outcome
            },
            Effects(&["agent-registered"]),
        ),
        case(
            "a retired agent whose resources are all destroyed registers again",
            |w| {
                w.active();
                accepted(&retire(w));
                let (a, r) = (w.a(), w.r());
                let o = w.sync(&a, |s| s.destroyed = vec![r]);
                assert_eq!(effect_names(&o), ["observation-accepted", "resource-destroyed"]);
            },
            |w| register(w, AgentSettings::default(), false),
            Effects(&["agent-registered"]),
        ),
        case(
            "a wiped registration clears a tripped breaker",
            |w| {
                tripped(w);
            },
            |w| register(w, AgentSettings::default(), true),
            Effects(&["agent-breaker-cleared", "agent-registered"]),
        ),
        case(
            "a plain registration leaves a tripped breaker alone",
            |w| {
                tripped(w);
            },
            |w| register(w, AgentSettings::default(), false),
            Effects(&["agent-registered"]),
        ),
        case(
            "a wiped registration without a breaker",
            |w| {
                w.active();
            },
            |w| register(w, AgentSettings::default(), true),
            Effects(&["agent-registered"]),
        ),
        case(
            "a gone agent registers again",
            |w| {
                w.registered();
                gone(w);
            },
            |w| register(w, AgentSettings::default(), false),
            Effects(&["agent-registered"]),
        ),
    ]);
}

#[test]
fn a_new_incarnation_gets_a_new_epoch_and_old_observations_are_refused() {
    let mut w = World::new();
    let first = register(&mut w, AgentSettings::default(), false);
    let (p1, _) = first.positioned_effects().next().unwrap();
    assert_eq!(w.epoch(&w.a()), p1, "the epoch is the position of agent-registered");
    w.pending();
    let (a, r) = (w.a(), w.r());

    let second = register(&mut w, AgentSettings::default(), false);
    let (p2, effect) = second.positioned_effects().next().unwrap();
    assert_eq!(effect.name(), "agent-registered");
    assert!(p2 > p1);
    assert_eq!(w.epoch(&a), p2);
    assert_eq!(agent(&w).liveness, Liveness::Live);

    let current = format!("current epoch is {p2}");
    let from_old = format!("observation from epoch {p1} of agent w1");
    let hb = Heartbeat { agent: a.clone(), epoch: p1 };
    refused(&mut w, |w| w.agent_says(hb), WrongEpoch, &[&format!("heartbeat from epoch {p1}"), &current]);
    let old = ReportCreated { agent: a.clone(), epoch: p1, obs: 99, resource: r, native_id: None };
    refused(&mut w, |w| w.agent_says(old), WrongEpoch, &[&from_old, &current]);
    let old = w.sync_cmd(&a, |s| {
        s.epoch = p1;
        s.created = vec![r];
    });
    refused(&mut w, |w| w.agent_says(old), WrongEpoch, &[&from_old]);

    // The new incarnation starts counting observations again.
    let o = w.agent_says(ReportCreated { agent: a.clone(), epoch: p2, obs: 1, resource: r, native_id: None });
    assert_eq!(effect_names(&o), ["observation-accepted", "resource-activated"]);
    settle(&w);
}

#[test]
fn registering_a_gone_agent_makes_it_placeable_again() {
    let mut w = World::new();
    w.registered();
    gone(&mut w);
    refused(&mut w, allocate, InvalidState, &["agent w1 is gone", "no new placements"]);
    accepted(&register(&mut w, AgentSettings::default(), false));
    assert_eq!(agent(&w).liveness, Liveness::Live);
    assert_eq!(effect_names(&allocate(&mut w)), ["resource-allocated", "create-ordered"]);
    settle(&w);
}

/// Retirement is sticky: an agent that holds nothing and registers again (its `serve --agent` restarted) stays
/// retired; only `unretire`, on record and by whom, brings it back.
#[test]
fn a_retired_agent_stays_retired_until_unretired() {
    let mut w = World::new();
    w.registered();
    accepted(&retire(&mut w));
    let o = register(&mut w, AgentSettings::default(), false);
    assert!(matches!(o.effects(), [Effect::AgentRegistered { retired: true, .. }]), "{o:?}");
    assert!(agent(&w).retired);
    refused(&mut w, allocate, InvalidState, &["agent w1 is retired", "no new placements"]);
    let a = w.a();
    let o = w.op(UnretireAgent { agent: a.clone() });
    assert!(matches!(o.effects(), [Effect::AgentUnretired { by }] if by.as_str() == OP), "{o:?}");
    assert!(!agent(&w).retired);
    assert_eq!(effect_names(&allocate(&mut w)), ["resource-allocated", "create-ordered"]);
    refused(&mut w, |w| w.op(UnretireAgent { agent: a.clone() }), AlreadyDone, &["agent w1 is not retired"]);
    // Registering again keeps it in service.
    accepted(&register(&mut w, AgentSettings::default(), false));
    assert!(!agent(&w).retired);
    settle(&w);
}

#[test]
fn a_plain_registration_keeps_the_agent_suspect_a_wiped_one_does_not() {
    let mut w = World::new();
    tripped(&mut w);
    accepted(&register(&mut w, AgentSettings::default(), false));
    assert!(agent(&w).is_suspect());
    refused(&mut w, allocate, InvalidState, &["suspect (its circuit breaker tripped)"]);
    let o = register(&mut w, AgentSettings::default(), true);
    assert_eq!(effect_names(&o), ["agent-breaker-cleared", "agent-registered"]);
    let (registered_at, _) = o.positioned_effects().nth(1).unwrap();
    assert_eq!(
        w.epoch(&w.a()),
        registered_at,
        "the epoch is the position of agent-registered, not of the first effect"
    );
    assert!(!agent(&w).is_suspect());
    assert_eq!(effect_names(&allocate(&mut w)), ["resource-allocated", "create-ordered"]);
    settle(&w);
}

// --- heartbeats -------------------------------------------------------------------------------------------------

#[test]
fn heartbeats() {
    check(vec![
        case(
            "right after registering there is nothing to record",
            |w| {
                w.registered();
            },
            |w| w.heartbeat(&w.a()),
            Effects(&[]),
        ),
        case(
            "just under a third of stall_after since the last one: nothing",
            |w| {
                w.registered();
                w.advance(ms(19_999));
            },
            |w| w.heartbeat(&w.a()),
            Effects(&[]),
        ),
        case(
            "a third of stall_after since the last one: recorded",
            |w| {
                w.registered();
                w.advance(secs(20));
            },
            |w| w.heartbeat(&w.a()),
            Effects(&["agent-seen"]),
        ),
        case(
            "a stalled agent recovers",
            |w| {
                w.registered();
                stalled(w);
            },
            |w| w.heartbeat(&w.a()),
            Effects(&["agent-recovered", "agent-seen"]),
        ),
        case(
            "a heartbeat from another epoch",
            |w| {
                w.registered();
            },
            |w| {
                let agent = w.a();
                w.agent_says(Heartbeat { agent, epoch: Position(7) })
            },
            Rejected(WrongEpoch, &["heartbeat from epoch #7 of agent w1", "current epoch is #1"]),
        ),
        case(
            "a gone agent's heartbeat",
            |w| {
                w.registered();
                gone(w);
            },
            |w| w.heartbeat(&w.a()),
            Rejected(InvalidState, &["agent w1 is gone", "register a new incarnation"]),
        ),
        case(
            "an unknown agent's heartbeat",
            |_| {},
            |w| {
                let agent = w.a();
                w.agent_says(Heartbeat { agent, epoch: Position(1) })
            },
            Rejected(Unknown, &["agent w1 has never registered"]),
        ),
    ]);
}

#[test]
fn heartbeats_are_coalesced_to_one_record_per_third_of_stall_after() {
    let mut w = World::new();
    w.registered();
    let a = w.a();
    let mut seen_at = Vec::new();
    for i in 1..=12u64 {
        w.advance(secs(5));
        let o = w.heartbeat(&a);
        match effect_names(&o).as_slice() {
            [] => {}
            ["agent-seen"] => seen_at.push(i * 5),
            other => panic!("unexpected effects {other:?}"),
        }
    }
    assert_eq!(seen_at, [20, 40, 60]);
    assert_eq!(agent(&w).last_seen, T0.saturating_add(secs(60)));
    assert_eq!(w.state().n_recent_commands(), 1, "heartbeats are not remembered (only the registration)");
    settle(&w);
}

// --- stalled and gone -------------------------------------------------------------------------------------------

#[test]
fn mark_stalled_table() {
    check(vec![
        case(
            "one millisecond before last_seen + stall_after + stall_after/3",
            |w| {
                w.registered();
                w.advance(minus(stall_due(), ms(1)));
            },
            mark_stalled,
            Rejected(NotYetDue, &["agent w1 was seen at", "not stalled before 2027-01-15T08:01:20.000Z"]),
        ),
        case(
            "exactly at last_seen + stall_after + stall_after/3",
            |w| {
                w.registered();
                w.advance(stall_due());
            },
            mark_stalled,
            Effects(&["agent-stalled"]),
        ),
        case(
            "a recorded heartbeat moves the deadline",
            |w| {
                w.registered();
                w.advance(secs(20));
                accepted(&w.heartbeat(&w.a()));
                w.advance(minus(stall_due(), ms(1)));
            },
            mark_stalled,
            Rejected(NotYetDue, &["not stalled before 2027-01-15T08:01:40.000Z"]),
        ),
        case(
            "a recovered agent's deadline starts again from its recovery",
            |w| {
                w.registered();
                stalled(w);
                accepted(&w.heartbeat(&w.a()));
                w.advance(minus(stall_due(), ms(1)));
            },
            mark_stalled,
            Rejected(NotYetDue, &["not stalled before 2027-01-15T08:02:40.000Z"]),
        ),
        case(
            "a shorter stall_after is honoured: 30 s + 10 s",
            |w| {
                register(w, settings(|s| s.stall_after = secs(30)), false);
                w.advance(secs(40));
            },
            mark_stalled,
            Effects(&["agent-stalled"]),
        ),
        case(
            "a shorter stall_after, one millisecond early",
            |w| {
                register(w, settings(|s| s.stall_after = secs(30)), false);
                w.advance(ms(39_999));
            },
            mark_stalled,
            Rejected(NotYetDue, &["not stalled before 2027-01-15T08:00:40.000Z"]),
        ),
        case(
            "already stalled",
            |w| {
                w.registered();
                stalled(w);
            },
            mark_stalled,
            Rejected(AlreadyDone, &["agent w1 is already stalled"]),
        ),
        case(
            "a gone agent",
            |w| {
                w.registered();
                gone(w);
            },
            mark_stalled,
            Rejected(AlreadyDone, &["agent w1 is already gone"]),
        ),
        case("an unknown agent", |_| {}, mark_stalled, Rejected(Unknown, &["agent w1 has never registered"])),
    ]);
}

#[test]
fn mark_gone_table() {
    check(vec![
        case(
            "one millisecond before last_seen + orphan_after + stall_after/3",
            |w| {
                w.registered();
                w.advance(minus(gone_due(), ms(1)));
            },
            mark_gone,
            Rejected(NotYetDue, &["agent w1 was seen at", "not gone before 2027-01-16T08:00:20.000Z"]),
        ),
        case(
            "an agent with nothing",
            |w| {
                w.registered();
                w.advance(gone_due());
            },
            mark_gone,
            Effects(&["agent-gone"]),
        ),
        case(
            "a stalled agent",
            |w| {
                w.registered();
                stalled(w);
                w.advance(minus(gone_due(), stall_due()));
            },
            mark_gone,
            Effects(&["agent-gone"]),
        ),
        case(
            "every non-terminal resource is orphaned, its leases broken and claims returned",
            |w| {
                w.registered();
                // pending, with a waiting lease
                w.pending().leased(None);
                // active, with a bound claim and a granted lease
                w.claimed();
                w.created().leased(None);
                // releasing, with a bound claim
                w.claimed();
                accepted(&w.release());
                // destroyed: terminal, left alone
                w.pending();
                accepted(&w.release());
                let (a, r) = (w.a(), w.r());
                accepted(&w.sync(&a, |s| s.destroyed = vec![r]));
                w.advance(gone_due());
            },
            mark_gone,
            Effects(&[
                "agent-gone",
                "resource-orphaned",
                "lease-broken",
                "resource-orphaned",
                "lease-broken",
                "claim-releasable",
                "resource-orphaned",
                "claim-releasable",
            ]),
        ),
        case(
            "already gone",
            |w| {
                w.registered();
                gone(w);
            },
            mark_gone,
            Rejected(AlreadyDone, &["agent w1 is already gone"]),
        ),
        case("an unknown agent", |_| {}, mark_gone, Rejected(Unknown, &["agent w1 has never registered"])),
    ]);
}

#[test]
fn a_gone_agent_leaves_nothing_behind() {
    let mut w = World::new();
    w.registered();
    w.pending().leased(None);
    let (r1, l1) = (w.r(), w.l());
    w.claimed();
    w.created().leased(None);
    let (r2, l2) = (w.r(), w.l());
    gone(&mut w);
    assert_eq!(agent(&w).liveness, Liveness::Gone);
    for r in [r1, r2] {
        let resource = w.state().resource(r).unwrap();
        assert_eq!(resource.state.name(), "orphaned");
        assert!(resource.live_leases.is_empty());
        assert!(resource.claims.values().all(|c| matches!(c, leasehold_domain::state::ClaimSlot::Returned { .. })));
    }
    for l in [l1, l2] {
        assert_eq!(w.state().lease(l).unwrap().state.name(), "broken");
    }
    assert_eq!(agent(&w).n_held, 0);
    settle(&w);
}

#[test]
fn the_log_clock_stepping_back_does_not_undo_time() {
    let mut w = World::new();
    w.registered();
    w.agent = agent_name("w2");
    w.registered();
    w.agent = agent_name("w1");
    w.advance(stall_due());
    // Some other command moves partition time to T0 + 80 s...
    accepted(&w.heartbeat(&agent_name("w2")));
    // ...then a new stream leader stamps an earlier time: the deadline is still judged at T0 + 80 s.
    w.d.set_clock(T0.saturating_add(secs(10)));
    let o = mark_stalled(&mut w);
    assert_eq!(effect_names(&o), ["agent-stalled"]);
    assert_eq!(o.decided_at, T0.saturating_add(stall_due()));
    settle(&w);
}

#[test]
fn orphan() {
    check(vec![
        case(
            "a live agent's resource",
            |w| {
                w.active();
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                w.sys(Orphan { agent, resource })
            },
            Rejected(InvalidState, &["agent w1 is live, not gone", "only the resources of a gone agent"]),
        ),
        case(
            "a stalled agent's resource",
            |w| {
                w.active();
                stalled(w);
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                w.sys(Orphan { agent, resource })
            },
            Rejected(InvalidState, &["agent w1 is stalled, not gone"]),
        ),
        case(
            "a resource already orphaned with its agent",
            |w| {
                w.active();
                gone(w);
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                w.sys(Orphan { agent, resource })
            },
            Rejected(AlreadyDone, &["is already orphaned"]),
        ),
        case(
            "an unknown resource",
            |w| {
                w.registered();
                gone(w);
            },
            |w| {
                let agent = w.a();
                let resource = w.d.new_resource_id();
                w.sys(Orphan { agent, resource })
            },
            Rejected(Unknown, &["is not known"]),
        ),
        // The accepted case (a gone agent's resource the budget left for later) is in reports.rs,
        // `a_gone_agent_with_thousands_of_leased_resources_is_orphaned_in_bounded_outcomes`.
    ]);
}

// --- retirement and placement -----------------------------------------------------------------------------------

#[test]
fn retire_agent() {
    check(vec![
        case(
            "its pending and held resources are released, their leases broken",
            |w| {
                w.registered();
                // pending
                w.pending();
                // active with a lease
                w.pending();
                w.created().leased(None);
                // paused
                w.pending();
                w.created();
                let (agent, resource) = (w.a(), w.r());
                accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
                // suspect
                w.pending();
                w.created();
                let (agent, resource) = (w.a(), w.r());
                accepted(&w.op(ReportFailureByOperator { agent, resource, detail: "flaky".into() }));
                // already releasing: left alone
                w.pending();
                accepted(&w.release());
            },
            retire,
            Effects(&[
                "agent-retired",
                "resource-releasing",
                "resource-releasing",
                "lease-broken",
                "resource-releasing",
                "resource-releasing",
            ]),
        ),
        case(
            "an agent with nothing",
            |w| {
                w.registered();
            },
            retire,
            Effects(&["agent-retired"]),
        ),
        case(
            "again",
            |w| {
                w.active();
                accepted(&retire(w));
            },
            retire,
            Rejected(AlreadyDone, &["agent w1 is already retired"]),
        ),
        case("an unknown agent", |_| {}, retire, Rejected(Unknown, &["agent w1 has never registered"])),
    ]);
}

#[test]
fn retirement_releases_everything_and_the_agent_reports_it_destroyed() {
    let mut w = World::new();
    w.registered();
    let made = active_n(&mut w, 3);
    let o = retire(&mut w);
    assert_eq!(effect_names(&o), ["agent-retired", "resource-releasing", "resource-releasing", "resource-releasing"]);
    assert!(agent(&w).retired);
    for r in &made {
        assert_eq!(state_name(&w, *r), "releasing");
    }
    let a = w.a();
    let destroyed = made.clone();
    let o = w.sync(&a, |s| s.destroyed = destroyed);
    assert_eq!(
        effect_names(&o),
        ["observation-accepted", "resource-destroyed", "resource-destroyed", "resource-destroyed"]
    );
    settle(&w);
}

#[test]
fn allocation_refused() {
    check(vec![
        case(
            "on a stalled agent",
            |w| {
                w.registered();
                stalled(w);
            },
            allocate,
            Rejected(InvalidState, &["agent w1 is stalled (no recent heartbeat)", "no new placements"]),
        ),
        case(
            "on a gone agent",
            |w| {
                w.registered();
                gone(w);
            },
            allocate,
            Rejected(InvalidState, &["agent w1 is gone", "no new placements"]),
        ),
        case(
            "on a retired agent",
            |w| {
                w.registered();
                accepted(&retire(w));
            },
            allocate,
            Rejected(InvalidState, &["agent w1 is retired", "no new placements"]),
        ),
        case(
            "on a suspect agent (breaker tripped)",
            |w| {
                tripped(w);
            },
            allocate,
            Rejected(InvalidState, &["agent w1 is suspect (its circuit breaker tripped)", "no new placements"]),
        ),
        case(
            "on a recovered agent it is allowed again",
            |w| {
                w.registered();
                stalled(w);
                accepted(&w.heartbeat(&w.a()));
            },
            allocate,
            Effects(&["resource-allocated", "create-ordered"]),
        ),
    ]);
}

// --- the breaker's confirm-loss ---------------------------------------------------------------------------------

#[test]
fn confirm_loss_table() {
    check(vec![
        case(
            "no breaker has tripped",
            |w| {
                w.active();
            },
            confirm_loss,
            Rejected(InvalidState, &["agent w1's circuit breaker has not tripped"]),
        ),
        case(
            "a tripped breaker",
            |w| {
                tripped(w);
            },
            confirm_loss,
            Effects(&["agent-breaker-cleared", "resync-requested"]),
        ),
        case(
            "twice",
            |w| {
                tripped(w);
                accepted(&confirm_loss(w));
            },
            confirm_loss,
            Rejected(InvalidState, &["has not tripped"]),
        ),
        case("an unknown agent", |_| {}, confirm_loss, Rejected(Unknown, &["agent w1 has never registered"])),
    ]);
}

#[test]
fn after_confirm_loss_the_next_report_marks_the_losses() {
    let mut w = World::new();
    let made = tripped(&mut w);
    for r in &made {
        assert_eq!(state_name(&w, *r), "active", "a tripped breaker marks nothing");
    }
    let o = confirm_loss(&mut w);
    assert_eq!(effect_names(&o), ["agent-breaker-cleared", "resync-requested"]);
    assert!(!agent(&w).is_suspect());
    let a = w.a();
    let missing = made[..5].to_vec();
    let o = w.sync(&a, |s| s.missing = missing);
    assert_eq!(
        effect_names(&o),
        [
            "observation-accepted",
            "agent-breaker-rearmed",
            "resource-lost",
            "resource-lost",
            "resource-lost",
            "resource-lost",
            "resource-lost"
        ]
    );
    for r in &made[..5] {
        assert_eq!(state_name(&w, *r), "lost");
    }
    assert_eq!(state_name(&w, made[5]), "active");
    assert!(!agent(&w).is_suspect());
    settle(&w);
}

// --- checks every command passes --------------------------------------------------------------------------------

#[test]
fn issuers_and_classes() {
    check(vec![
        case(
            "a heartbeat about w1 sent by w2",
            |w| {
                w.registered();
            },
            |w| {
                let (agent, epoch) = (w.a(), w.epoch(&w.a()));
                w.d.submit("w2", Heartbeat { agent, epoch })
            },
            Rejected(NotPermitted, &["agent.heartbeat about agent w1 was sent by w2", "only about themselves"]),
        ),
        case(
            "a sync report about w1 sent by an operator",
            |w| {
                w.active();
            },
            |w| {
                let a = w.a();
                let report = w.sync_cmd(&a, |s| s.missing = vec![]);
                w.d.submit(OP, report)
            },
            Rejected(NotPermitted, &["agent.sync about agent w1 was sent by op:alice"]),
        ),
        case(
            "a report-created sent by the sweeper",
            |w| {
                w.registered().pending();
            },
            |w| {
                let (agent, resource, epoch) = (w.a(), w.r(), w.epoch(&w.a()));
                w.d.submit(SWEEPER, ReportCreated { agent, epoch, obs: 1, resource, native_id: None })
            },
            Rejected(NotPermitted, &["agent.report-created about agent w1 was sent by sweeper-1"]),
        ),
        case(
            "a registration of w1 sent by w2",
            |_| {},
            |w| {
                let agent = w.a();
                let incarnation = leasehold_schemas::Uuid::from_u128(9);
                w.d.submit(
                    "w2",
                    Register {
                        agent,
                        incarnation,
                        wiped: false,
                        settings: None,
                        labels: Default::default(),
                        capacity: Default::default(),
                    },
                )
            },
            Rejected(NotPermitted, &["agent.register about agent w1 was sent by w2"]),
        ),
        case(
            "an op command sent as class agent",
            |w| {
                w.registered();
            },
            |w| {
                let agent = w.a();
                let mut e = w.d.envelope("w1", RetireAgent::new(agent));
                e.class = CommandClass::Agent;
                w.d.submit_envelope(&e)
            },
            Rejected(NotPermitted, &["op.retire-agent is a op command, but it came as class agent"]),
        ),
        case(
            "an agent command sent as class op",
            |w| {
                w.registered();
            },
            |w| {
                let (agent, epoch) = (w.a(), w.epoch(&w.a()));
                let mut e = w.d.envelope("w1", Heartbeat { agent, epoch });
                e.class = CommandClass::Op;
                w.d.submit_envelope(&e)
            },
            Rejected(NotPermitted, &["agent.heartbeat is a agent command, but it came as class op"]),
        ),
        case(
            "a sys command sent as class op",
            |w| {
                w.registered();
                w.advance(stall_due());
            },
            |w| {
                let agent = w.a();
                let mut e = w.d.envelope(OP, MarkStalled { agent });
                e.class = CommandClass::Op;
                w.d.submit_envelope(&e)
            },
            Rejected(NotPermitted, &["sys.mark-stalled is a sys command, but it came as class op"]),
        ),
    ]);
}

#[test]
fn commands_for_another_partition_are_refused() {
    let mine = agent_in(0, 2);
    let theirs = agent_in(1, 2);
    let mut w = World::with_partitions(0, 2);
    w.agent = mine.clone();
    w.registered();
    settle(&w);

    w.agent = theirs.clone();
    let message = format!("agent {theirs} belongs to partition 1, not 0");
    refused(&mut w, |w| register(w, AgentSettings::default(), false), WrongPartition, &[&message]);
    refused(&mut w, |w| w.op(RetireAgent::new(theirs.clone())), WrongPartition, &[&message]);
    refused(&mut w, |w| w.sys(MarkStalled { agent: theirs.clone() }), WrongPartition, &[&message]);
    let pool = (0..1000)
        .map(|i| pool_name(&format!("p{i}")))
        .find(|p| partition_of_key(&Key::Pool(p.clone()), 2) == 1)
        .unwrap();
    refused(
        &mut w,
        |w| {
            w.op(DefinePool {
                pool: pool.clone(),
                kind: leasehold_schemas::pool::PoolKind::Slots { count: 4 },
                cooldown: None,
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            })
        },
        WrongPartition,
        &[&format!("pool {pool} belongs to partition 1, not 0")],
    );
    settle(&w);
}

#[test]
fn commands_issued_longer_ago_than_the_horizon_are_stale() {
    let mut w = World::new();
    w.registered();
    let name = w.a();

    // Issued exactly a horizon ago: still decided.
    let e = w.d.envelope(OP, ConfirmLoss { agent: name.clone() });
    w.advance(DAY);
    let o = w.d.submit_envelope(&e);
    rejected(&o, InvalidState);

    // Issued a horizon and a millisecond ago: stale, whatever it asks.
    let e = w.d.envelope(OP, RetireAgent::new(name.clone()));
    w.advance(plus(DAY, ms(1)));
    refused(
        &mut w,
        |w| w.d.submit_envelope(&e),
        StaleCommand,
        &["longer ago than the outcome horizon (24h)", "issue a new command"],
    );
    assert!(!agent(&w).retired);

    let epoch = w.epoch(&name);
    let e = w.d.envelope("w1", Heartbeat { agent: name.clone(), epoch });
    w.advance(plus(DAY, ms(1)));
    refused(&mut w, |w| w.d.submit_envelope(&e), StaleCommand, &["longer ago than the outcome horizon"]);
    settle(&w);
}

// --- partition settings -----------------------------------------------------------------------------------------

#[test]
fn set_partition_settings() {
    check(vec![
        case(
            "a longer horizon",
            |_| {},
            |w| partition_settings(w, 0, Millis::from_hours(48)),
            Effects(&["partition-settings-changed"]),
        ),
        case(
            "exactly one minute is allowed",
            |_| {},
            |w| partition_settings(w, 0, Millis::from_mins(1)),
            Effects(&["partition-settings-changed"]),
        ),
        case(
            "the same settings again",
            |_| {},
            |w| partition_settings(w, 0, DAY),
            Rejected(AlreadyDone, &["the partition already has these settings"]),
        ),
        case(
            "a horizon under a minute",
            |_| {},
            |w| partition_settings(w, 0, ms(59_999)),
            Rejected(Invalid, &["an outcome horizon of 59999ms is too short", "at least 1min"]),
        ),
        case(
            "settings naming another partition",
            |_| {},
            |w| partition_settings(w, 1, Millis::from_hours(48)),
            Rejected(WrongPartition, &["settings for partition 1 reached partition 0"]),
        ),
    ]);
}

#[test]
fn a_shorter_horizon_makes_commands_stale_sooner_and_outcomes_forgotten_sooner() {
    let mut w = World::new();
    w.registered();
    let o = partition_settings(&mut w, 0, Millis::from_hours(1));
    assert_eq!(effect_names(&o), ["partition-settings-changed"]);
    assert_eq!(w.state().settings().outcome_horizon, Millis::from_hours(1));
    let agent = w.a();
    let e = w.d.envelope(OP, RetireAgent::new(agent));
    w.advance(plus(Millis::from_hours(1), ms(1)));
    refused(&mut w, |w| w.d.submit_envelope(&e), StaleCommand, &["outcome horizon (1h)"]);
    assert_eq!(w.state().n_recent_commands(), 1, "only the stale command's own outcome is left");
    settle(&w);
}

// --- idempotency and the horizon --------------------------------------------------------------------------------

#[test]
fn a_retried_command_gets_its_first_outcome_back() {
    let mut w = World::new();
    w.active().leased(None);
    let (agent, resource) = (w.a(), w.r());
    let e = w.d.envelope(OP, Release { agent: agent.clone(), resource, reason: None });
    let first = w.d.submit_envelope(&e);
    assert_eq!(effect_names(&first), ["resource-releasing", "lease-broken"]);
    let n = w.d.outcomes().len();
    let before = w.state().clone();

    let again = w.d.submit_envelope(&e);
    assert_eq!(again, first, "the first outcome, unchanged");
    assert_eq!(w.d.outcomes().len(), n, "nothing appended");
    assert!(*w.state() == before, "nothing changed");

    // Still the first outcome after the world moved on (the resource is destroyed now).
    accepted(&w.sync(&agent, |s| s.destroyed = vec![resource]));
    w.advance(Millis::from_hours(23));
    let again = w.d.submit_envelope(&e);
    assert_eq!(again, first);

    // A rejection is remembered too.
    let e = w.d.envelope(OP, ConfirmLoss { agent: agent.clone() });
    let first = w.d.submit_envelope(&e);
    rejected(&first, InvalidState);
    let n = w.d.outcomes().len();
    assert_eq!(w.d.submit_envelope(&e), first);
    assert_eq!(w.d.outcomes().len(), n);
    settle(&w);
}

#[test]
fn a_double_release_with_two_command_ids_is_already_done() {
    // Drydock: two holders both decide to release the same resource.
    check(vec![case(
        "the second release",
        |w| {
            w.active().leased(None);
            assert_eq!(effect_names(&w.release()), ["resource-releasing", "lease-broken"]);
        },
        |w| w.release(),
        Rejected(AlreadyDone, &["is already releasing (destruction ordered at #"]),
    )]);
}

#[test]
fn outcomes_are_forgotten_after_the_horizon() {
    let mut w = World::new();
    w.active().leased(None);
    let remembered = w.state().n_recent_commands();
    assert_eq!(remembered, 4, "register, allocate, report-created, acquire");

    w.advance(DAY);
    accepted(&retire(&mut w));
    assert_eq!(w.state().n_recent_commands(), remembered + 1, "nothing forgotten at exactly the horizon");

    w.advance(ms(1));
    let agent = w.a();
    rejected(&w.op(ConfirmLoss { agent }), InvalidState);
    assert_eq!(w.state().n_recent_commands(), 2, "everything decided a horizon ago is forgotten");
    settle(&w);
}

#[test]
fn a_retry_after_the_horizon_is_stale_not_decided_again() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let e = w.d.envelope(OP, RetireAgent::new(agent));
    accepted(&w.d.submit_envelope(&e));
    w.advance(plus(DAY, ms(1)));
    accepted(&w.heartbeat(&w.a()));
    assert!(w.state().decided_at_seq(e.command_id).is_none());
    refused(&mut w, |w| w.d.submit_envelope(&e), StaleCommand, &["longer ago than the outcome horizon"]);
    settle(&w);
}

#[test]
fn terminal_resources_and_their_leases_are_forgotten_after_the_horizon() {
    let mut w = World::new();
    w.active().leased(None);
    let (a, r, l) = (w.a(), w.r(), w.l());
    w.pending();
    let live = w.r();
    assert_eq!(
        effect_names(&w.op(Release { agent: a.clone(), resource: r, reason: None })),
        ["resource-releasing", "lease-broken"]
    );
    let o = w.sync(&a, |s| s.destroyed = vec![r]);
    assert_eq!(effect_names(&o), ["observation-accepted", "resource-destroyed"]);

    w.advance(DAY);
    accepted(&w.heartbeat(&a));
    assert!(w.state().resource(r).is_some(), "kept until the horizon has passed");
    assert!(w.state().lease(l).is_some());

    w.advance(ms(1));
    // A heartbeat that changes nothing appends nothing (so forgets nothing); the next outcome does.
    accepted(&w.heartbeat(&a));
    assert_eq!(w.d.last_answer(), leasehold_domain::driver::Answer::Unchanged);
    assert!(w.state().resource(r).is_some());
    accepted(&w.sync(&a, |_| {}));
    assert!(w.state().resource(r).is_none(), "forgotten a horizon after it became terminal");
    assert!(w.state().lease(l).is_none(), "its broken lease too");
    assert!(!agent(&w).resources.contains(&r));
    assert!(w.state().resource(live).is_some(), "a live resource is never forgotten");

    // Late news about a forgotten resource is refused or ignored, never an error.
    refused(&mut w, |w| w.op(Release { agent: a.clone(), resource: r, reason: None }), Unknown, &["is not known"]);
    let o = w.sync(&a, |s| s.destroyed = vec![r]);
    assert_eq!(effect_names(&o), ["observation-accepted"]);
    settle(&w);
}

// --- regressions: behaviour once found wrong in review, now fixed ----------------------------------------------------

/// Behaviour that once contradicted DESIGN.md or would have surprised a user, and was fixed. Each check states the
/// correct behaviour.
#[test]
fn regressions_found_in_review() {
    all_hold(vec![
        (
            "a command whose issuer clock runs ahead of the log is decided twice",
            Box::new(|| {
                // DESIGN 3: one command, one outcome; a retried command inside the horizon gets its first outcome
                // back; one older than the horizon is stale. The outcome is forgotten a horizon after its *log*
                // time, but staleness is judged from the *issuer* time: with an issuer clock one hour ahead there is
                // an hour in which a retry is neither answered from memory nor stale, and it is decided again.
                let mut w = World::new();
                w.registered();
                let a = w.a();
                let incarnation = leasehold_schemas::Uuid::from_u128(77);
                let mut e = w.d.envelope("w1", Register::new(a.clone(), incarnation));
                e.issued_at = Timestamp(e.issued_at.0 + Millis::from_hours(1).0);
                let first = w.d.submit_envelope(&e);
                accepted(&first);
                let epoch = w.epoch(&a);
                w.advance(plus(DAY, Millis::from_mins(30)));
                accepted(&w.heartbeat(&a));
                let n = w.d.outcomes().len();
                let again = w.d.submit_envelope(&e);
                assert!(
                    again == first || again.rejection().is_some_and(|r| r.kind == StaleCommand),
                    "the retry was decided again: {:?}",
                    effect_names(&again)
                );
                assert_eq!(w.d.outcomes().len(), n, "the retry appended an outcome");
                assert_eq!(w.epoch(&a), epoch, "the retry moved the running agent to a new epoch");
            }),
        ),
        (
            "mark-stalled on a stalled agent whose breaker tripped gives the wrong reason",
            Box::new(|| {
                // DESIGN 12: a rejection names the thing and the reason. The agent is refused because it is already
                // stalled; the message says it is "already suspect" (its status, not its liveness).
                let mut w = World::new();
                tripped(&mut w);
                stalled(&mut w);
                let o = mark_stalled(&mut w);
                let message = rejected(&o, AlreadyDone);
                assert!(message.contains("already stalled"), "message {message:?}");
            }),
        ),
    ]);
}

/// A cordon stops new allocations on an agent, on record and by whom; what it holds goes on (a lease is granted on a
/// resource it already has). It is sticky across registrations, and only `uncordon` ends it.
#[test]
fn a_cordoned_agent_takes_no_new_allocations_but_keeps_what_it_holds() {
    let mut w = World::new();
    w.active();
    let a = w.a();
    let cordon = |w: &mut World| w.op(CordonAgent { agent: a.clone(), reason: Some("kernel upgrade".into()) });
    let o = cordon(&mut w);
    assert!(
        matches!(o.effects(), [Effect::AgentCordoned { by, reason: Some(r) }] if by.as_str() == OP && r == "kernel upgrade"),
        "{o:?}"
    );
    let held = agent(&w).cordon.clone().expect("cordoned");
    assert_eq!((held.by.as_str(), held.reason.as_deref()), (OP, Some("kernel upgrade")));
    refused(
        &mut w,
        allocate,
        InvalidState,
        &["agent w1 is cordoned (by op:", ": kernel upgrade)", "no new allocations"],
    );
    refused(&mut w, cordon, AlreadyDone, &["agent w1 is already cordoned (by op:", "kernel upgrade"]);
    // What it holds goes on: a lease on its active resource is granted.
    let lease = w.acquire_cmd(None, None);
    assert!(effect_names(&w.op(lease)).contains(&"lease-granted"));
    // Registering again keeps the cordon.
    accepted(&register(&mut w, AgentSettings::default(), false));
    assert!(agent(&w).cordon.is_some());
    refused(&mut w, allocate, InvalidState, &["is cordoned"]);
    let o = w.op(UncordonAgent { agent: a.clone() });
    assert!(matches!(o.effects(), [Effect::AgentUncordoned { by }] if by.as_str() == OP), "{o:?}");
    assert!(agent(&w).cordon.is_none());
    assert_eq!(effect_names(&allocate(&mut w)), ["resource-allocated", "create-ordered"]);
    refused(&mut w, |w| w.op(UncordonAgent { agent: a.clone() }), AlreadyDone, &["agent w1 is not cordoned"]);
    let unknown = leasehold_schemas::AgentName::new("nobody").unwrap();
    refused(&mut w, |w| w.op(CordonAgent { agent: unknown.clone(), reason: None }), Unknown, &["nobody"]);
    settle(&w);
}

/// A registration that declares labels or a capacity records them (`agent-declared`) when they differ from the last
/// declaration; an allocation of a kind at its capacity is refused, counting resources from pending to releasing, and
/// a resource that ends gives its place back. A kind without a capacity is not limited.
#[test]
fn a_declared_capacity_bounds_allocations_of_its_kind() {
    let mut w = World::new();
    let a = w.a();
    let declare = |w: &mut World, capacity: &[(&str, u32)]| {
        w.obs.insert(a.clone(), 0);
        let incarnation = leasehold_schemas::Uuid::from_u128(w.d.outcomes().len() as u128 + 1);
        w.agent_says(Register {
            agent: a.clone(),
            incarnation,
            wiped: false,
            settings: None,
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            capacity: capacity.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect(),
        })
    };
    let o = declare(&mut w, &[("container", 2)]);
    assert_eq!(effect_names(&o), ["agent-registered", "agent-declared"]);
    assert_eq!(agent(&w).capacity.get("container"), Some(&2));
    assert_eq!(agent(&w).labels.get("zone").map(String::as_str), Some("a"));
    // The same declaration again records nothing new.
    assert_eq!(effect_names(&declare(&mut w, &[("container", 2)])), ["agent-registered"]);

    let first = allocate(&mut w);
    accepted(&first);
    let second = w.allocate_cmd(&a);
    accepted(&w.op(second.clone()));
    refused(&mut w, allocate, InvalidState, &["agent w1 is full for container: 2 of 2 (pending to releasing)"]);
    // The same allocation sent again under another command id is answered for its id, not for the capacity.
    let resend = second;
    refused(&mut w, |w| w.op(resend.clone()), AlreadyExists, &["already exists"]);
    // Another kind is not limited.
    let mut volume = w.allocate_cmd(&a);
    volume.kind = "volume".into();
    accepted(&w.op(volume));
    assert_eq!(agent(&w).by_kind.get("container"), Some(&2));
    // A resource that fails for good gives its place back.
    let failed = first
        .effects()
        .iter()
        .find_map(|e| match e {
            Effect::ResourceAllocated { resource, .. } => Some(*resource),
            _ => None,
        })
        .unwrap();
    w.last_resource = Some(failed);
    let epoch = w.epoch(&a);
    let obs = w.next_obs(&a);
    accepted(&w.agent_says(ReportFailure {
        agent: a.clone(),
        epoch,
        obs,
        resource: failed,
        failure: FailureKind::CreateFailed,
        detail: "no image".into(),
    }));
    assert_eq!(agent(&w).by_kind.get("container"), Some(&1));
    accepted(&allocate(&mut w));
    // A kind no allocation can name is refused (it would limit nothing); a capacity of 0 takes none, and says so.
    let bad = w.agent_says(Register {
        agent: a.clone(),
        incarnation: leasehold_schemas::Uuid::from_u128(999),
        wiped: false,
        settings: None,
        labels: Default::default(),
        capacity: [("Web App".to_owned(), 5)].into(),
    });
    assert!(bad.rejection().is_some_and(|r| r.message.contains("must match")), "{bad:?}");
    accepted(&declare(&mut w, &[("container", 0)]));
    refused(&mut w, allocate, InvalidState, &["agent w1 takes no container (its capacity for it is 0)"]);
    // A registration that declares nothing clears the declaration, on record.
    let o = register(&mut w, AgentSettings::default(), false);
    assert!(effect_names(&o).contains(&"agent-declared"));
    assert!(agent(&w).capacity.is_empty());
    accepted(&allocate(&mut w));
    settle(&w);
}

// --- drain --------------------------------------------------------------------------------------------------------

const GRACE: Millis = Millis::from_secs(60);

fn drain_cmd(w: &World, deadline: Option<Millis>, grace: Option<Millis>) -> DrainAgent {
    DrainAgent { agent: w.a(), deadline, grace, reason: Some("kernel upgrade".into()) }
}

fn drain(w: &mut World, deadline: Option<Millis>) -> Outcome {
    let cmd = drain_cmd(w, deadline, Some(GRACE));
    w.op(cmd)
}

fn drain_release(w: &mut World) -> Outcome {
    let (agent, resource) = (w.a(), w.r());
    w.sys(DrainRelease { agent, resource })
}

/// The release cause of `resource`, while it is releasing.
fn release_cause(w: &World, resource: ResourceId) -> leasehold_schemas::outcome::ReleaseCause {
    match &w.state().resource(resource).expect("in state").state {
        leasehold_domain::state::ResourceState::Releasing { cause } => (**cause).clone(),
        other => panic!("{resource} is {}, not releasing", other.name()),
    }
}

/// `op.drain-agent` cordons the agent first (unless it is cordoned already), then records the drain; the same drain
/// again is already done, other settings replace it; an agent that is unknown, gone or retired is not drained.
#[test]
fn drain_agent_table() {
    check(vec![
        case(
            "a drain cordons the agent, then drains it",
            |w| {
                w.active();
            },
            |w| drain(w, Some(Millis::from_hours(2))),
            Effects(&["agent-cordoned", "agent-draining"]),
        ),
        case(
            "a cordoned agent is only drained",
            |w| {
                w.active();
                let agent = w.a();
                accepted(&w.op(CordonAgent { agent, reason: None }));
            },
            |w| drain(w, None),
            Effects(&["agent-draining"]),
        ),
        case(
            "the same drain again is already done",
            |w| {
                w.active();
                accepted(&drain(w, None));
                w.advance(secs(5));
            },
            |w| drain(w, None),
            Rejected(AlreadyDone, &["agent w1 is already draining (by op:alice since", "grace 1min: kernel upgrade"]),
        ),
        case(
            "a drain with another grace replaces the first",
            |w| {
                w.active();
                accepted(&drain(w, None));
            },
            |w| {
                let cmd = drain_cmd(w, None, Some(secs(1)));
                w.op(cmd)
            },
            Effects(&["agent-draining"]),
        ),
        case("an unknown agent", |_| {}, |w| drain(w, None), Rejected(Unknown, &["agent w1 has never registered"])),
        case(
            "a gone agent has nothing to drain",
            |w| {
                w.active();
                gone(w);
            },
            |w| drain(w, None),
            Rejected(InvalidState, &["agent w1 is gone", "agent cordon"]),
        ),
        case(
            "a retired agent has nothing to drain",
            |w| {
                w.active();
                accepted(&retire(w));
            },
            |w| drain(w, None),
            Rejected(InvalidState, &["agent w1 is retired"]),
        ),
    ]);
}

/// `sys.drain-release` releases a draining agent's resource once it has held no lease for the grace (counted from
/// the drain's start or the end of its last lease, whichever is later), and at the deadline whatever it holds;
/// asked early it is refused `not-yet-due` and says when.
#[test]
fn drain_release_table() {
    check(vec![
        case(
            "an idle resource before the grace is not yet due",
            |w| {
                w.active();
                accepted(&drain(w, None));
                w.advance(secs(59));
            },
            drain_release,
            Rejected(NotYetDue, &["has held no lease since", "is released at", "grace is 1min", "never by itself"]),
        ),
        case(
            "an idle resource past the grace is released",
            |w| {
                w.active();
                accepted(&drain(w, None));
                w.advance(GRACE);
            },
            drain_release,
            Effects(&["resource-releasing"]),
        ),
        case(
            "a pending resource is idle too",
            |w| {
                w.registered().pending();
                accepted(&drain(w, None));
                w.advance(GRACE);
            },
            drain_release,
            Effects(&["resource-releasing"]),
        ),
        case(
            "a leased resource waits for the deadline",
            |w| {
                w.active().leased(None);
                accepted(&drain(w, Some(secs(600))));
                w.advance(secs(599));
            },
            drain_release,
            Rejected(NotYetDue, &["holds lease w1.", "(holder \"build-42\")", "at the drain's deadline"]),
        ),
        case(
            "at the deadline a leased resource is released and its lease broken",
            |w| {
                w.active().leased(None);
                accepted(&drain(w, Some(secs(600))));
                w.advance(secs(600));
            },
            drain_release,
            Effects(&["resource-releasing", "lease-broken"]),
        ),
        case(
            "a resource already releasing",
            |w| {
                w.active();
                accepted(&drain(w, None));
                accepted(&w.release());
                w.advance(GRACE);
            },
            drain_release,
            Rejected(AlreadyDone, &["is already releasing"]),
        ),
        case(
            "an agent that does not drain",
            |w| {
                w.active();
                w.advance(GRACE);
            },
            drain_release,
            Rejected(NothingToDo, &["agent w1 is not draining"]),
        ),
    ]);
}

/// The grace counts from the end of a resource's last lease; the release names who asked for the drain and whether
/// the deadline came; uncordon ends the drain (what it released stays released) and a new drain starts again.
#[test]
fn a_drain_releases_idle_resources_after_the_grace_and_the_rest_at_the_deadline() {
    let mut w = World::new();
    w.active();
    let idle = w.r();
    w.pending();
    let a = w.a();
    accepted(&w.report_created(&a, w.r()));
    w.leased(None);
    let leased = w.r();
    let lease = w.l();
    let token = w.token();
    accepted(&drain(&mut w, Some(secs(600))));
    let held = agent(&w).drain.clone().expect("draining");
    assert_eq!(
        (held.grace, held.deadline, held.since),
        (GRACE, Some(held.since.saturating_add(secs(600))), w.state().now())
    );
    assert!(agent(&w).cordon.is_some());
    assert!(agent(&w).unschedulable().is_some_and(|why| why.to_string().starts_with("draining (by op:alice since")));
    refused(&mut w, allocate, InvalidState, &["agent w1 is draining"]);
    // The idle one goes after the grace; the leased one's lease ends half-way through, and its grace counts from then.
    w.advance(secs(30));
    accepted(&w.op(ReleaseLease { agent: a.clone(), lease, token: Some(token) }));
    assert_eq!(w.state().resource(leased).unwrap().idle_since, w.state().now());
    w.advance(secs(30));
    let release = |w: &mut World, resource| w.sys(DrainRelease { agent: a.clone(), resource });
    assert_eq!(effect_names(&release(&mut w, idle)), ["resource-releasing"]);
    assert_eq!(
        release_cause(&w, idle),
        leasehold_schemas::outcome::ReleaseCause::Drained {
            by: leasehold_schemas::Issuer::new(OP).unwrap(),
            deadline: false
        }
    );
    refused(&mut w, |w| release(w, leased), NotYetDue, &["has held no lease since"]);
    // Leased again: it waits for the deadline, and then goes whatever it holds.
    w.last_resource = Some(leased);
    w.leased(None);
    w.advance(secs(540));
    assert_eq!(effect_names(&release(&mut w, leased)), ["resource-releasing", "lease-broken"]);
    assert!(matches!(
        release_cause(&w, leased),
        leasehold_schemas::outcome::ReleaseCause::Drained { deadline: true, .. }
    ));
    settle(&w);

    // Uncordon ends the drain: a later resource is not released; what was released stays released.
    let o = w.op(UncordonAgent { agent: a.clone() });
    assert_eq!(effect_names(&o), ["agent-uncordoned"]);
    assert!(agent(&w).drain.is_none() && agent(&w).cordon.is_none());
    assert_eq!(state_name(&w, idle), "releasing");
    w.pending();
    let later = w.r();
    w.advance(GRACE);
    refused(&mut w, |w| release(w, later), NothingToDo, &["not draining"]);
    // A drain again starts from now: the grace counts from it, not from the resource's allocation.
    w.advance(GRACE);
    accepted(&drain(&mut w, None));
    w.advance(secs(59));
    refused(&mut w, |w| release(w, later), NotYetDue, &["is released at"]);
    w.advance(secs(1));
    assert_eq!(effect_names(&release(&mut w, later)), ["resource-releasing"]);
    settle(&w);
}

/// A drain asked for again with a shorter grace keeps its start: a resource idle since then goes at once. Without a
/// grace, the default one (5 min) is recorded.
#[test]
fn a_drain_asked_again_keeps_its_start() {
    let mut w = World::new();
    w.active();
    let a = w.a();
    let o = w.op(DrainAgent { agent: a.clone(), deadline: None, grace: None, reason: None });
    assert!(
        matches!(o.effects()[1], Effect::AgentDraining { grace, deadline: None, .. } if grace == leasehold_domain::DEFAULT_DRAIN_GRACE)
    );
    let since = agent(&w).drain.as_ref().unwrap().since;
    w.advance(secs(120));
    refused(&mut w, drain_release, NotYetDue, &["grace is 5min"]);
    accepted(&w.op(DrainAgent { agent: a.clone(), deadline: None, grace: Some(secs(60)), reason: None }));
    assert_eq!(agent(&w).drain.as_ref().unwrap().since, since);
    assert_eq!(effect_names(&drain_release(&mut w)), ["resource-releasing"]);
    settle(&w);
}

/// `op.retire-agent` with `only_if_unleased` (the command line without `--yes`) is refused, changing nothing, while a
/// resource of the agent holds a live lease, naming a few; without one it retires as ever.
#[test]
fn a_retirement_that_must_not_break_leases() {
    let only_if_unleased = |w: &mut World| {
        let agent = w.a();
        w.op(RetireAgent { agent, only_if_unleased: true })
    };
    check(vec![
        case(
            "refused while a resource holds a lease",
            |w| {
                w.active().leased(None);
            },
            only_if_unleased,
            Rejected(
                InvalidState,
                &["agent w1 not retired: w1.", "holds lease w1.", "(holder \"build-42\", active)", "retire with --yes"],
            ),
        ),
        case(
            "a few are named, and how many more",
            |w| {
                w.registered();
                for _ in 0..5 {
                    w.pending();
                    let (a, r) = (w.a(), w.r());
                    accepted(&w.report_created(&a, r));
                    w.leased(None);
                }
            },
            only_if_unleased,
            Rejected(InvalidState, &["and 2 more; retire with --yes"]),
        ),
        case(
            "accepted without leases",
            |w| {
                w.active();
            },
            only_if_unleased,
            Effects(&["agent-retired", "resource-releasing"]),
        ),
    ]);
}
