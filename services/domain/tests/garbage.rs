//! Every destroy on the record: what the writer decides for the handles an agent reports as garbage, a lost
//! resource's handle that comes back (quarantined, destroyed only by a release on record), destroys confirmed at once,
//! and an agent whose driver cannot list.

mod support;

use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Millis, Position, ResourceId};
use leasehold_schemas::outcome::{Effect, GarbageCause, ReleaseCause};
use leasehold_schemas::settings::GcMode;
use leasehold_schemas::{Key, Outcome};
use support::*;

fn garbage(w: &mut World, handles: Vec<ResourceId>, dry_run: bool) -> Outcome {
    let agent = w.a();
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    let watermark = w.state().last_position();
    w.agent_says(GarbageReport { agent, epoch, obs, watermark, handles, dry_run })
}

fn destroyed_report(w: &mut World, resource: ResourceId, ordered: Position) -> Outcome {
    let agent = w.a();
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    w.agent_says(ReportDestroyed { agent, epoch, obs, resource, ordered })
}

fn driver(w: &mut World, available: bool, detail: &str) -> Outcome {
    let agent = w.a();
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    w.agent_says(DriverStatus { agent, epoch, obs, available, detail: detail.to_owned() })
}

/// The position of the first effect named `name` in `outcome`.
fn position_of(outcome: &Outcome, name: &str) -> Position {
    outcome.positioned_effects().find(|(_, e)| e.name() == name).map(|(p, _)| p).expect(name)
}

/// `w.r()` active, then missing from a report: lost.
fn lost(w: &mut World) -> ResourceId {
    w.active_n(6);
    let (agent, id) = (w.a(), w.r());
    let outcome = w.sync(&agent, |r| r.missing = vec![id]);
    assert!(effect_names(&outcome).contains(&"resource-lost"), "{outcome:?}");
    id
}

fn orders(outcome: &Outcome) -> Vec<(ResourceId, GarbageCause)> {
    outcome
        .effects()
        .iter()
        .filter_map(|e| match e {
            Effect::GarbageDestroyOrdered { handle, cause } => Some((*handle, cause.clone())),
            _ => None,
        })
        .collect()
}

/// A handle of no resource the log knows, and handles of resources that were destroyed, orphaned or failed: each
/// is ordered destroyed, with its cause, on record; a live resource's handle is not garbage.
#[test]
fn garbage_is_ordered_destroyed_on_record_with_its_cause() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    // destroyed
    w.active();
    let destroyed = w.r();
    accepted(&w.release());
    accepted(&w.sync(&agent, |r| r.destroyed = vec![destroyed]));
    assert_eq!(state_name(&w, destroyed), "destroyed");
    // failed
    w.pending();
    let failed = w.r();
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    let failure = ReportFailure {
        agent: agent.clone(),
        epoch,
        obs,
        resource: failed,
        failure: FailureKind::CreateFailed,
        detail: "no space".into(),
    };
    accepted(&w.agent_says(failure));
    // live
    w.active();
    let live = w.r();
    let unknown = w.d.new_resource_id();

    let outcome = garbage(&mut w, vec![unknown, destroyed, failed, live], false);
    let mut expected = vec![
        (unknown, GarbageCause::Unknown {}),
        (destroyed, GarbageCause::Destroyed {}),
        (failed, GarbageCause::Failed {}),
    ];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(orders(&outcome), expected);
    assert_eq!(effect_names(&outcome)[0], "observation-accepted");
    let a = w.state().agent(&agent).unwrap();
    assert_eq!(a.garbage_orders.len(), 3);

    // Reported again before it is destroyed: nothing new (the order stands).
    let again = garbage(&mut w, vec![unknown], false);
    assert_eq!(effect_names(&again), ["observation-accepted"]);

    // The agent destroys it and says so at once: on record, and the order is done.
    let ordered = w.state().agent(&agent).unwrap().garbage_order_of(unknown).unwrap();
    refused(
        &mut w,
        |w| destroyed_report(w, unknown, Position(ordered.0 - 1)),
        StaleObservation,
        &["ordered destroyed"],
    );
    let confirmed = destroyed_report(&mut w, unknown, ordered);
    assert_eq!(effect_names(&confirmed), ["observation-accepted", "garbage-destroyed"]);
    assert!(w.state().agent(&agent).unwrap().garbage_order_of(unknown).is_none());
    settle(&w);
}

/// An orphaned resource's handle goes as soon as its agent is back: its address may have been granted again.
#[test]
fn an_orphaned_handle_is_ordered_destroyed_when_its_agent_returns() {
    let mut w = World::new();
    w.registered().active();
    let (agent, id) = (w.a(), w.r());
    w.advance(Millis::from_hours(25));
    accepted(&w.sys(MarkGone { agent: agent.clone() }));
    assert_eq!(state_name(&w, id), "orphaned");
    accepted(&w.register_with(&agent, None, false));
    let outcome = garbage(&mut w, vec![id], false);
    assert_eq!(orders(&outcome), [(id, GarbageCause::Orphaned {})]);
    settle(&w);
}

/// A dry run (the agent's flag, or the partition's policy) records what would be destroyed and orders nothing.
#[test]
fn a_dry_run_records_and_orders_nothing() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let unknown = w.d.new_resource_id();
    let outcome = garbage(&mut w, vec![unknown], true);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "garbage-dry-run"]);
    assert!(w.state().agent(&agent).unwrap().garbage_orders.is_empty());

    let settings = SetPartitionSettings {
        key: Key::Agent(agent.clone()),
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: Some(GcMode::DryRun),
        max_priority: None,
    };
    assert_eq!(effect_names(&w.op(settings.clone())), ["gc-mode-changed"]);
    assert_eq!(w.state().gc_mode(), GcMode::DryRun);
    refused(&mut w, |w| w.op(settings), AlreadyDone, &["already has these settings"]);
    let outcome = garbage(&mut w, vec![unknown], false);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "garbage-dry-run"]);
    assert!(w.state().agent(&agent).unwrap().garbage_orders.is_empty());
    settle(&w);
}

/// A lost resource's handle that comes back keeps its data: quarantined (in a dry run too), never ordered destroyed
/// by a report, its claims not given back; only a release of the lost resource, on record and by whom, orders it.
#[test]
fn a_lost_resource_that_comes_back_is_quarantined_until_released() {
    let mut w = World::new();
    w.registered();
    let id = lost(&mut w);
    let agent = w.a();
    assert!(
        w.state()
            .resource(id)
            .unwrap()
            .claims
            .values()
            .all(|c| matches!(c, leasehold_domain::state::ClaimSlot::Returned { .. }))
    );
    refused(&mut w, |w| w.release_of(id), AlreadyDone, &["is lost and no handle of it is on its agent's machine"]);

    let outcome = garbage(&mut w, vec![id], true);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "handle-reappeared"]);
    assert!(w.state().agent(&agent).unwrap().quarantined.contains_key(&id));
    // Reported again, in earnest: still quarantined, nothing ordered.
    let outcome = garbage(&mut w, vec![id], false);
    assert_eq!(effect_names(&outcome), ["observation-accepted"]);
    assert_eq!(state_name(&w, id), "lost", "the resource stays lost: its claims may belong to someone else now");

    let release = w.op(Release { agent: agent.clone(), resource: id, reason: Some("restored by mistake".into()) });
    let [Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Released { by, reason } }] = release.effects()
    else {
        panic!("{release:?}");
    };
    assert_eq!((*handle, by.as_str(), reason.as_deref()), (id, OP, Some("restored by mistake")));
    let a = w.state().agent(&agent).unwrap();
    assert!(!a.quarantined.contains_key(&id));
    let ordered = a.garbage_order_of(id).unwrap();
    refused(&mut w, |w| w.release_of(id), AlreadyDone, &["is lost"]);
    assert_eq!(effect_names(&destroyed_report(&mut w, id, ordered)), ["observation-accepted", "garbage-destroyed"]);
    settle(&w);
}

/// Long after the horizon, when the lost resource's record is forgotten, its handle is still recognised: quarantined,
/// not taken for unknown garbage; and its id is never allocated again.
#[test]
fn a_lost_resource_is_recognised_after_its_record_is_forgotten() {
    let mut w = World::new();
    w.registered();
    let id = lost(&mut w);
    let agent = w.a();
    w.advance(Millis::from_hours(25));
    accepted(&w.heartbeat(&agent));
    assert!(w.state().resource(id).is_none(), "forgotten");
    assert!(w.state().agent(&agent).unwrap().lost_ids.contains(&id));
    let outcome = garbage(&mut w, vec![id], false);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "handle-reappeared"]);
    let release = w.op(Release { agent: agent.clone(), resource: id, reason: None });
    assert_eq!(effect_names(&release), ["garbage-destroy-ordered"]);
    settle(&w);
}

/// A destroy is confirmed at once (not at the next sync report): the resource is destroyed, its claims go back.
#[test]
fn a_destroy_is_confirmed_at_once() {
    let mut w = World::new();
    w.registered().claimed();
    let (agent, id) = (w.a(), w.r());
    accepted(&w.report_created(&agent, id));
    let release = w.release();
    let ordered = position_of(&release, "resource-releasing");
    refused(&mut w, |w| destroyed_report(w, id, Position(ordered.0 + 1)), StaleObservation, &["ordered destroyed at"]);
    let outcome = destroyed_report(&mut w, id, ordered);
    assert_eq!(effect_names(&outcome), ["observation-accepted", "resource-destroyed", "claim-releasable"]);
    let detail = &w.state().resource(id).unwrap().state;
    assert!(
        matches!(detail, leasehold_domain::state::ResourceState::Destroyed { cause: Some(c) }
            if matches!(**c, ReleaseCause::Released { .. })),
        "a destroyed resource keeps the release it answered: {detail:?}"
    );
    refused(&mut w, |w| destroyed_report(w, id, ordered), AlreadyDone, &["already destroyed"]);
    // An active resource was never ordered destroyed.
    w.active();
    let live = w.r();
    refused(&mut w, |w| destroyed_report(w, live, ordered), InvalidState, &["only a resource ordered destroyed"]);
    settle(&w);
}

/// A destroy confirmed at once can be decided before a sync report taken while that destroy ran (it names the
/// resource in flight, and counts it): the writer counts it too, as the report's view had it, and asks no resync.
#[test]
fn a_report_from_before_a_confirmed_destroy_agrees_with_the_writer() {
    let mut w = World::new();
    w.registered();
    w.active_n(2);
    let (agent, id) = (w.a(), w.r());
    let release = w.release();
    let ordered = position_of(&release, "resource-releasing");
    // The agent's pass: its view is as of now, with the destroy running.
    let mut report = w.sync_cmd(&agent, |r| r.in_flight = vec![id]);
    let (count, digest) = w.expected_listing(&agent, &report);
    assert_eq!(count, 2, "the running destroy counts as present");
    // The destroy finishes and is reported at once, and decided before the report.
    assert_eq!(effect_names(&destroyed_report(&mut w, id, ordered)), ["observation-accepted", "resource-destroyed"]);
    report.obs = w.next_obs(&agent);
    (report.count, report.digest) = (count, digest);
    let outcome = w.agent_says(report);
    assert_eq!(effect_names(&outcome), ["observation-accepted"], "no resync: {outcome:?}");
    settle(&w);
}

/// An agent whose driver cannot list says so when that changes: on record, and nothing is placed on it meanwhile.
#[test]
fn a_driver_that_cannot_list_is_on_record() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    refused(&mut w, |w| driver(w, true, ""), AlreadyDone, &["already recorded available"]);
    let outcome = driver(&mut w, false, "root /srv/lh is not mounted");
    assert_eq!(effect_names(&outcome), ["observation-accepted", "agent-driver-unavailable"]);
    assert_eq!(w.state().agent(&agent).unwrap().driver_unavailable.as_deref(), Some("root /srv/lh is not mounted"));
    refused(&mut w, |w| driver(w, false, "root /srv/lh is not mounted"), AlreadyDone, &["same reason"]);
    let refusal = refused(
        &mut w,
        |w| {
            let allocate = w.allocate_cmd(&agent);
            w.op(allocate)
        },
        InvalidState,
        &["driver is unavailable"],
    );
    assert!(refusal.contains("root /srv/lh is not mounted"), "{refusal}");
    assert_eq!(effect_names(&driver(&mut w, true, "")), ["observation-accepted", "agent-driver-available"]);
    let allocate = w.allocate_cmd(&agent);
    accepted(&w.op(allocate));
    settle(&w);
}

/// Every terminal state carries its reason: what a `destroyed` resource's release was, where a `lost` one was
/// missed, when an `orphaned` one's agent was declared gone.
#[test]
fn terminal_states_carry_their_reason() {
    use leasehold_domain::state::ResourceState;
    let mut w = World::new();
    w.registered();
    let id = lost(&mut w);
    assert!(matches!(w.state().resource(id).unwrap().state, ResourceState::Lost { .. }));

    let mut w = World::new();
    w.registered().active();
    let (agent, id) = (w.a(), w.r());
    w.advance(Millis::from_hours(25));
    let gone = w.sys(MarkGone { agent });
    let ResourceState::Orphaned { gone_at: Some(at) } = w.state().resource(id).unwrap().state else {
        panic!("{:?}", w.state().resource(id));
    };
    assert_eq!(at, gone.decided_at);
    settle(&w);
}

/// A handle the log ordered destroyed as garbage of no resource is never allocated while that order stands: the
/// agent would hold an order to destroy the directory of a live resource (and the invariant "no garbage order names a
/// live resource" would break, which `leasehold-replay verify` reports as a wrong log). A producer choosing its ids
/// (`allocate --id`) can name any handle on the machine.
#[test]
fn a_handle_ordered_destroyed_is_not_allocated_while_the_order_stands() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let stray = w.d.new_resource_id();
    let outcome = garbage(&mut w, vec![stray], false);
    assert_eq!(orders(&outcome), [(stray, GarbageCause::Unknown {})]);
    let ordered = w.state().agent(&agent).unwrap().garbage_order_of(stray).unwrap();
    refused(&mut w, |w| w.op(allocation(&agent, stray)), AlreadyExists, &["ordered destroyed"]);
    settle(&w);
    // Once the agent confirmed the destroy, nothing on the machine is left to confuse: the id is free again.
    accepted(&destroyed_report(&mut w, stray, ordered));
    accepted(&w.op(allocation(&agent, stray)));
    settle(&w);
}
