//! Scenarios: the five seed discussions (DESIGN.md, `seeds/`) told as stories against the domain, one test each,
//! with the sweeper played by hand so every cross-partition message is visible.

mod support;

use std::net::Ipv4Addr;

use leasehold_domain::state::{ClaimSlot, LeaseState, Liveness};
use leasehold_schemas::Outcome;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Key, Millis, ResourceId, ResourceRef, Source};
use leasehold_schemas::outcome::{BreakReason, Effect};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::partition_of_key;
use support::*;

// --- the sweeper, by hand: it reads outcomes and turns pool effects into commands for the other side -------------

/// `claim` for every `claim-wanted` in an allocation's outcome.
fn claims_for(wanted: &Outcome) -> Vec<Claim> {
    let Key::Agent(agent) = &wanted.command.key else { panic!("claim-wanted comes from an agent's partition") };
    wanted
        .positioned_effects()
        .filter_map(|(position, effect)| match effect {
            Effect::ClaimWanted { resource, pool } => Some(Claim {
                pool: pool.clone(),
                holder: ResourceRef::new(agent.clone(), *resource),
                source: Source { partition: wanted.partition, position },
            }),
            _ => None,
        })
        .collect()
}

/// `bind-claim` for every `claim-granted` in a pool's outcome (the grant's position is the claim token).
fn binds_for(granted: &Outcome) -> Vec<BindClaim> {
    let Key::Pool(pool) = &granted.command.key else { panic!("claim-granted comes from a pool's partition") };
    granted
        .positioned_effects()
        .filter_map(|(position, effect)| match effect {
            Effect::ClaimGranted { holder, value, source: wanted } => Some(BindClaim {
                holder: holder.clone(),
                pool: pool.clone(),
                value: *value,
                token: position,
                source: Source { partition: granted.partition, position },
                wanted: *wanted,
                definition: None,
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            }),
            _ => None,
        })
        .collect()
}

/// `free` for every `claim-releasable` and `grant-returned` in an agent partition's outcome.
fn frees_for(releasable: &Outcome) -> Vec<Free> {
    let Key::Agent(agent) = &releasable.command.key else { panic!("claim-releasable comes from an agent's partition") };
    releasable
        .positioned_effects()
        .filter_map(|(position, effect)| match effect {
            Effect::ClaimReleasable { resource, pool, token, .. } => Some(Free {
                pool: pool.clone(),
                holder: ResourceRef::new(agent.clone(), *resource),
                token: *token,
                source: Source { partition: releasable.partition, position },
                cause: leasehold_schemas::outcome::FreeCause::Released {},
            }),
            Effect::GrantReturned { resource, pool, token, .. } => Some(Free {
                pool: pool.clone(),
                holder: ResourceRef::new(agent.clone(), *resource),
                token: Some(*token),
                source: Source { partition: releasable.partition, position },
                cause: leasehold_schemas::outcome::FreeCause::Released {},
            }),
            _ => None,
        })
        .collect()
}

#[track_caller]
fn only<T>(mut items: Vec<T>) -> T {
    assert_eq!(items.len(), 1, "expected exactly one");
    items.pop().unwrap()
}

// --- steps and checks ----------------------------------------------------------------------------------------------

/// Asserts the outcome was accepted with exactly these effects.
#[track_caller]
fn step(outcome: &Outcome, names: &[&str]) {
    accepted(outcome);
    assert_eq!(effect_names(outcome), names, "effects of {}", outcome.command.type_name);
}

/// Asserts the outcome was rejected with `kind` and changed nothing but bookkeeping.
#[track_caller]
fn refused(w: &mut World, kind: leasehold_schemas::RejectionKind, send: impl FnOnce(&mut World) -> Outcome) -> String {
    support::refused(w, send, kind, &[])
}

fn allocate(w: &mut World, pools: &[&str]) -> (ResourceId, Outcome) {
    let agent = w.a();
    let mut cmd = w.allocate_cmd(&agent);
    cmd.pools = pools.iter().map(|p| pool_name(p)).collect();
    let id = cmd.resource;
    w.last_resource = Some(id);
    (id, w.op(cmd))
}

/// Allocates a resource without pools and reports it created: active.
fn active_resource(w: &mut World) -> ResourceId {
    let (id, outcome) = allocate(w, &[]);
    step(&outcome, &["resource-allocated", "create-ordered"]);
    let agent = w.a();
    step(&w.report_created(&agent, id), &["observation-accepted", "resource-activated"]);
    id
}

fn claim_of(w: &World, id: ResourceId, pool: &str) -> ClaimSlot {
    w.state().resource(id).expect("resource in state").claims[&pool_name(pool)].clone()
}

fn holder_of(pools: &World, pool: &str, value: PoolValue) -> Option<ResourceRef> {
    pools.state().pool(&pool_name(pool)).expect("pool defined").held.get(&value).cloned()
}

fn waiting(pools: &World, pool: &str) -> Vec<ResourceRef> {
    pools.state().pool(&pool_name(pool)).expect("pool defined").waiters.values().cloned().collect()
}

fn lease_state(w: &World, lease: leasehold_schemas::LeaseId) -> LeaseState {
    w.state().lease(lease).expect("lease in state").state.clone()
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

/// A grant's identifier.
fn granted_value(granted: &Outcome) -> PoolValue {
    only(binds_for(granted)).value
}

fn settings(edit: impl FnOnce(&mut AgentSettings)) -> AgentSettings {
    let mut settings = AgentSettings::default();
    edit(&mut settings);
    settings
}

/// The agent `worker-b` lives in partition 0 of 2 and the pool `overlay` in partition 1 of 2: the pool protocol
/// really crosses partitions.
fn two_partitions() -> (World, World) {
    let agent = agent_name("worker-b");
    let pool = pool_name("overlay");
    assert_eq!(partition_of_key(&Key::Agent(agent.clone()), 2), 0);
    assert_eq!(partition_of_key(&Key::Pool(pool), 2), 1);
    let mut agents = World::with_partitions(0, 2);
    agents.agent = agent;
    (agents, World::with_partitions(1, 2))
}

// --- (a) Concourse: the report-vs-create race ---------------------------------------------------------------------

/// Concourse issue 1959: a worker collects its listing, the ATC orders a create, the create finishes, and only then
/// does the sync from the old listing arrive. The watermark says the listing could not have held the new handle.
#[test]
fn concourse_report_vs_create_race() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let old = active_resource(&mut w);

    // 1. The worker collects its listing: it has applied everything up to here.
    let watermark = w.state().last_position();

    // 2. A create is ordered after that watermark.
    let (new, alloc) = allocate(&mut w, &[]);
    step(&alloc, &["resource-allocated", "create-ordered"]);
    assert!(w.state().resource(new).unwrap().create_ordered > Some(watermark));

    // 3. The create finishes and the worker says so.
    step(&w.report_created(&agent, new), &["observation-accepted", "resource-activated"]);

    // 4. The sync from step 1 arrives. Compared with what the worker now knows it should hold, its old listing lacks
    //    the new handle, so a naive diff names it missing. The watermark shows the listing predates the create:
    //    the new resource is not judged.
    let report = w.sync(&agent, |r| {
        r.watermark = watermark;
        r.missing = vec![new];
    });
    step(&report, &["observation-accepted"]);
    assert_eq!(state_name(&w, new), "active", "the new resource is not reaped");
    assert_eq!(state_name(&w, old), "active");

    // 5. A later report whose watermark covers the create and still lacks the handle does judge it: gone
    //    out-of-band, it is lost (one of two: under the breaker's minimum).
    let report = w.sync(&agent, |r| r.missing = vec![new]);
    step(&report, &["observation-accepted", "resource-lost"]);
    assert_eq!(state_name(&w, new), "lost");
    assert_eq!(state_name(&w, old), "active");

    settle(&w);
}

// --- (b) a stale report -------------------------------------------------------------------------------------------

/// A sync collected before a create finished reaches the writer after the agent's `report-created`: it is older
/// than an observation already decided, so it is rejected and changes nothing.
#[test]
fn stale_report_after_report_created() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let (id, alloc) = allocate(&mut w, &[]);
    step(&alloc, &["resource-allocated", "create-ordered"]);

    // The agent numbers a sync (observation 1) while the create is still running and sends it; it is delayed.
    let delayed = w.sync_cmd(&agent, |r| r.in_flight = vec![id]);
    // The create finishes; report-created (observation 2) overtakes the sync.
    step(&w.report_created(&agent, id), &["observation-accepted", "resource-activated"]);

    // The delayed sync arrives: stale.
    let message = refused(&mut w, StaleObservation, |w| w.agent_says(delayed.clone()));
    assert!(message.contains("observation 1 of agent w1 is not newer"), "{message}");
    assert_eq!(state_name(&w, id), "active");

    // Even one that would have been damaging (naming the resource missing) is refused the same way.
    let mut damaging = delayed.clone();
    damaging.in_flight.clear();
    damaging.missing = vec![id];
    refused(&mut w, StaleObservation, |w| w.agent_says(damaging));
    assert_eq!(state_name(&w, id), "active");

    // The agent's next report is newer and is accepted; a redelivery of it is stale.
    let mut fresh = w.sync_cmd(&agent, |_| {});
    (fresh.count, fresh.digest) = w.expected_listing(&agent, &fresh);
    step(&w.agent_says(fresh.clone()), &["observation-accepted"]);
    refused(&mut w, StaleObservation, |w| w.agent_says(fresh));

    settle(&w);
}

// --- (c) a release racing a slow create ---------------------------------------------------------------------------

/// The IP of a resource whose create is slow and whose release comes in the meantime stays held until a report
/// whose watermark covers the release says the resource is gone; only then is it freed at the pool.
#[test]
fn release_racing_a_slow_create_keeps_the_ip_until_confirmed() {
    let (mut agents, mut pools) = two_partitions();
    let agent = agents.a();
    let subnet = PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![ip(1)] };
    step(
        &pools.op(DefinePool {
            pool: pool_name("overlay"),
            kind: subnet,
            cooldown: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        }),
        &["pool-defined"],
    );
    agents.registered();

    // Allocate with an IP; the sweeper claims it in the pool's partition and carries the grant back.
    let (id, alloc) = allocate(&mut agents, &["overlay"]);
    step(&alloc, &["resource-allocated", "claim-wanted"]);
    let message = refused(&mut agents, WrongPartition, |w| w.sys(only(claims_for(&alloc))));
    assert!(message.contains("pool overlay belongs to partition 1, not 0"), "{message}");
    let granted = pools.sys(only(claims_for(&alloc)));
    step(&granted, &["claim-granted"]);
    let address = granted_value(&granted);
    assert_eq!(address, PoolValue::Ipv4(ip(2)), "the gateway .1 is excluded");
    step(&agents.sys(only(binds_for(&granted))), &["claim-bound", "create-ordered"]);

    // The agent starts the create; it is slow. A release is ordered meanwhile.
    let before_release = agents.state().last_position();
    step(&agents.release(), &["resource-releasing"]);
    let held = || Some(ResourceRef::new(agent.clone(), id));

    // Reports whose watermark is before the release: the create is in flight, then the agent even says the handle
    // is absent (it has not got that far). Neither frees anything: the agent cannot know of the release yet.
    let report = agents.sync(&agent, |r| {
        r.watermark = before_release;
        r.in_flight = vec![id];
    });
    step(&report, &["observation-accepted"]);
    let report = agents.sync(&agent, |r| {
        r.watermark = before_release;
        r.destroyed = vec![id];
    });
    step(&report, &["observation-accepted"]);
    assert_eq!(state_name(&agents, id), "releasing");
    assert!(matches!(claim_of(&agents, id, "overlay"), ClaimSlot::Bound { .. }));
    assert_eq!(holder_of(&pools, "overlay", address), held());

    // The slow create finishes after all; the resource stays releasing, now known to be present.
    step(&agents.report_created(&agent, id), &["observation-accepted", "resource-seen"]);
    assert_eq!(state_name(&agents, id), "releasing");

    // The agent has seen the release and is destroying it: in flight, still nothing freed.
    let report = agents.sync(&agent, |r| r.in_flight = vec![id]);
    step(&report, &["observation-accepted"]);
    assert_eq!(holder_of(&pools, "overlay", address), held());

    // A report whose watermark covers the release says destroyed: destroyed, and the claim may go back.
    let report = agents.sync(&agent, |r| r.destroyed = vec![id]);
    step(&report, &["observation-accepted", "resource-destroyed", "claim-releasable"]);
    assert_eq!(state_name(&agents, id), "destroyed");

    // The sweeper frees it at the pool, with the holder's token.
    let free = only(frees_for(&report));
    assert_eq!(free.token, Some(only(binds_for(&granted)).token));
    step(&pools.sys(free), &["claim-freed"]);
    assert_eq!(holder_of(&pools, "overlay", address), None);

    settle(&agents);
    settle(&pools);
}

// --- (d) a flaky driver -------------------------------------------------------------------------------------------

/// A driver that lists nothing twice in a row: the circuit breaker trips on the first report, nothing is marked by
/// either, and the next good report clears the breaker.
#[test]
fn flaky_driver_reporting_empty_twice_trips_the_breaker() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    step(&w.define_slots("slots", 8, Millis::from_secs(60)), &["pool-defined"]);
    let (with_slot, alloc) = allocate(&mut w, &["slots"]);
    let granted = w.sys(only(claims_for(&alloc)));
    step(&w.sys(only(binds_for(&granted))), &["claim-bound", "create-ordered"]);
    step(&w.report_created(&agent, with_slot), &["observation-accepted", "resource-activated"]);
    w.leased(None);
    let lease = w.l();
    let mut all = vec![with_slot];
    all.extend((0..5).map(|_| active_resource(&mut w)));

    // The driver lists nothing: six of six missing. The breaker trips; nothing is marked.
    let report = w.sync(&agent, |r| r.missing = all.clone());
    step(&report, &["observation-accepted", "agent-suspect"]);
    assert_eq!(w.state().agent(&agent).unwrap().status(), "suspect");
    assert!(all.iter().all(|id| state_name(&w, *id) == "active"), "nothing lost");
    let message = refused(&mut w, InvalidState, |w| {
        let cmd = w.allocate_cmd(&agent);
        w.op(cmd)
    });
    assert!(message.contains("circuit breaker tripped"), "{message}");

    // Again: the breaker holds, still nothing marked.
    let report = w.sync(&agent, |r| r.missing = all.clone());
    step(&report, &["observation-accepted"]);
    assert!(all.iter().all(|id| state_name(&w, *id) == "active"), "nothing lost");
    assert!(matches!(lease_state(&w, lease), LeaseState::Active { .. }), "the lease holds");
    assert!(matches!(claim_of(&w, with_slot, "slots"), ClaimSlot::Bound { value: PoolValue::Slot(0), .. }));

    // The driver recovers: a report with the handles back clears the breaker.
    let report = w.sync(&agent, |_| {});
    step(&report, &["observation-accepted", "agent-breaker-cleared"]);
    assert_eq!(w.state().agent(&agent).unwrap().status(), "live");
    let cmd = w.allocate_cmd(&agent);
    step(&w.op(cmd), &["resource-allocated", "create-ordered"]);

    settle(&w);
}

// --- (e) a wiped worker -------------------------------------------------------------------------------------------

/// Builds an agent with five active resources, each holding a slot; returns them.
fn five_with_slots(w: &mut World) -> Vec<ResourceId> {
    let agent = w.a();
    step(&w.define_slots("slots", 8, Millis::from_secs(60)), &["pool-defined"]);
    (0..5)
        .map(|_| {
            let (id, alloc) = allocate(w, &["slots"]);
            let granted = w.sys(only(claims_for(&alloc)));
            step(&w.sys(only(binds_for(&granted))), &["claim-bound", "create-ordered"]);
            step(&w.report_created(&agent, id), &["observation-accepted", "resource-activated"]);
            id
        })
        .collect()
}

/// A Kubernetes-hosted worker comes back with an empty disk and says so (`register --wiped`): its first report loses
/// everything without the breaker, and every claim goes back to its pool. Without `--wiped` the same report trips
/// the breaker.
#[test]
fn wiped_worker_reregistering_loses_everything_and_returns_its_claims() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let ids = five_with_slots(&mut w);
    w.last_resource = Some(ids[0]);
    w.leased(None);
    let lease = w.l();
    let old_epoch = w.epoch(&agent);
    assert_eq!(w.state().pool(&pool_name("slots")).unwrap().held.len(), 5);

    // The pod restarts on an empty disk and registers a wiped incarnation.
    step(&w.register_with(&agent, AgentSettings::default(), true), &["agent-registered"]);
    let new_epoch = w.epoch(&agent);
    assert!(new_epoch > old_epoch);

    // A report still in flight from the old process is from another epoch.
    let late =
        SyncReport { missing: ids.clone(), ..SyncReport::new(agent.clone(), old_epoch, 99, w.state().last_position()) };
    refused(&mut w, WrongEpoch, |w| w.agent_says(late));

    // Its first report: everything missing. All five are lost at once, no breaker; leases break; claims go back.
    let report = w.sync(&agent, |r| r.missing = ids.clone());
    let mut expected = vec!["observation-accepted", "agent-breaker-rearmed"];
    for id in &ids {
        expected.push("resource-lost");
        if *id == ids[0] {
            expected.push("lease-broken");
        }
        expected.push("claim-releasable");
    }
    step(&report, &expected);
    assert!(ids.iter().all(|id| state_name(&w, *id) == "lost"));
    assert!(matches!(lease_state(&w, lease), LeaseState::Broken { reason: BreakReason::ResourceLeft }));
    assert!(!w.state().agent(&agent).unwrap().is_suspect());

    // The sweeper returns the five slots.
    for free in frees_for(&report) {
        assert!(free.token.is_some(), "each claim was bound");
        step(&w.sys(free), &["claim-freed"]);
    }
    assert!(w.state().pool(&pool_name("slots")).unwrap().held.is_empty());
    settle(&w);

    // The same story without --wiped: the report trips the breaker and nothing is lost.
    let mut plain = World::new();
    plain.registered();
    let ids = five_with_slots(&mut plain);
    step(&plain.register_with(&agent, AgentSettings::default(), false), &["agent-registered"]);
    let report = plain.sync(&agent, |r| r.missing = ids.clone());
    step(&report, &["observation-accepted", "agent-suspect"]);
    assert!(ids.iter().all(|id| state_name(&plain, *id) == "active"));
    assert_eq!(plain.state().pool(&pool_name("slots")).unwrap().held.len(), 5);
    // The operator then restarts it with --wiped: the breaker clears and the next report loses everything.
    step(&plain.register_with(&agent, AgentSettings::default(), true), &["agent-breaker-cleared", "agent-registered"]);
    let report = plain.sync(&agent, |r| r.missing = ids.clone());
    assert_eq!(effect_names(&report).iter().filter(|n| **n == "resource-lost").count(), 5);
    assert_eq!(frees_for(&report).len(), 5);
    settle(&plain);
}

// --- (f) SwarmKit: IP reuse ---------------------------------------------------------------------------------------

/// SwarmKit issue 2407: a task's IP was freed when the task was removed, while its container was still shutting
/// down, and handed to a new task. Here the only IP of the subnet goes to the new container only after the old one
/// is confirmed gone and the cool-down has passed.
#[test]
fn swarmkit_ip_is_not_reused_before_the_old_container_is_gone_and_cooled() {
    let (mut agents, mut pools) = two_partitions();
    let agent = agents.a();
    let cooldown = Millis::from_secs(60);
    // A /30 with the gateway excluded: exactly one address, 10.0.0.2.
    let subnet = PoolKind::Ipv4 { network: ip(0), prefix_len: 30, exclude: vec![ip(1)] };
    let define = DefinePool {
        pool: pool_name("overlay"),
        kind: subnet,
        cooldown: Some(cooldown),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    step(&pools.op(define), &["pool-defined"]);
    agents.registered();
    let address = PoolValue::Ipv4(ip(2));

    // Task A gets the address and runs.
    let (a, alloc_a) = allocate(&mut agents, &["overlay"]);
    let granted_a = pools.sys(only(claims_for(&alloc_a)));
    step(&granted_a, &["claim-granted"]);
    assert_eq!(granted_value(&granted_a), address);
    step(&agents.sys(only(binds_for(&granted_a))), &["claim-bound", "create-ordered"]);
    step(&agents.report_created(&agent, a), &["observation-accepted", "resource-activated"]);
    let holder_a = Some(ResourceRef::new(agent.clone(), a));

    // Scale down: A is removed (releasing). Its container is still shutting down; the address stays A's.
    let before_release = agents.state().last_position();
    step(&agents.release(), &["resource-releasing"]);
    assert_eq!(holder_of(&pools, "overlay", address), holder_a);

    // Task B wants an address: it waits; nothing is free or cooling.
    let (b, alloc_b) = allocate(&mut agents, &["overlay"]);
    step(&alloc_b, &["resource-allocated", "claim-wanted"]);
    step(&pools.sys(only(claims_for(&alloc_b))), &["claim-queued"]);
    let message = refused(&mut pools, NothingToDo, |p| p.sys(TickPool { pool: pool_name("overlay") }));
    assert!(message.contains("no identifier free or cooling"), "{message}");

    // A report from before the removal (A listed as missing) frees nothing; A is in flight after it.
    let report = agents.sync(&agent, |r| {
        r.watermark = before_release;
        r.missing = vec![a];
    });
    step(&report, &["observation-accepted"]);
    let report = agents.sync(&agent, |r| r.in_flight = vec![a]);
    step(&report, &["observation-accepted"]);
    assert_eq!(state_name(&agents, a), "releasing");
    assert_eq!(holder_of(&pools, "overlay", address), holder_a);

    // The shutdown finishes and the agent confirms it: destroyed, and the address may go back.
    let report = agents.sync(&agent, |r| r.destroyed = vec![a]);
    step(&report, &["observation-accepted", "resource-destroyed", "claim-releasable"]);
    step(&pools.sys(only(frees_for(&report))), &["claim-freed"]);
    assert_eq!(waiting(&pools, "overlay"), [ResourceRef::new(agent.clone(), b)], "B still waits: cool-down");

    // Ticks before the cool-down passed are early; right at its end B gets the address.
    refused(&mut pools, NotYetDue, |p| p.sys(TickPool { pool: pool_name("overlay") }));
    pools.advance(Millis(cooldown.0 - 1));
    refused(&mut pools, NotYetDue, |p| p.sys(TickPool { pool: pool_name("overlay") }));
    pools.advance(Millis(1));
    let granted_b = pools.sys(TickPool { pool: pool_name("overlay") });
    step(&granted_b, &["claim-granted"]);
    assert_eq!(granted_value(&granted_b), address);
    assert_eq!(holder_of(&pools, "overlay", address), Some(ResourceRef::new(agent.clone(), b)));

    // Carried back, B is created with it.
    step(&agents.sys(only(binds_for(&granted_b))), &["claim-bound", "create-ordered"]);
    assert!(matches!(claim_of(&agents, b, "overlay"), ClaimSlot::Bound { value, .. } if value == address));

    settle(&agents);
    settle(&pools);
}

// --- (g) Drydock --------------------------------------------------------------------------------------------------

/// Drydock "add a command queue": the web UI, the CLI and the garbage collector release the same resource at
/// once. Every release is a recorded command; exactly one of them orders the destruction.
#[test]
fn drydock_double_release_orders_one_destruction() {
    let mut w = World::new();
    w.active().leased(None);
    let (agent, id, lease) = (w.a(), w.r(), w.l());

    let release = |reason: &str| Release { agent: agent.clone(), resource: id, reason: Some(reason.into()) };
    let from_web = w.d.envelope("op:web-ui", release("clicked release"));
    let from_cli = w.d.envelope("op:cli", release("leasehold release"));

    step(&w.d.submit_envelope(&from_web), &["resource-releasing", "lease-broken"]);
    let message = refused(&mut w, AlreadyDone, |w| w.d.submit_envelope(&from_cli));
    assert!(message.contains("already releasing (destruction ordered at"), "{message}");

    // The web UI retries its own command (same id): the first outcome comes back and nothing is appended.
    let n_outcomes = w.d.outcomes().len();
    let retried = w.d.submit_envelope(&from_web);
    assert_eq!(effect_names(&retried), ["resource-releasing", "lease-broken"]);
    assert_eq!(w.d.outcomes().len(), n_outcomes);

    // The lease holder trying to release its broken lease is told it is broken; it never writes the lease.
    let token = w.token();
    let message =
        refused(&mut w, AlreadyDone, |w| w.op(ReleaseLease { agent: agent.clone(), lease, token: Some(token) }));
    assert!(message.contains("already broken"), "{message}");

    // Exactly one destruction is on record, and every release is on record with its issuer.
    let orders: Vec<_> =
        w.d.outcomes().iter().flat_map(|o| effect_names(o)).filter(|n| *n == "resource-releasing").collect();
    assert_eq!(orders.len(), 1);
    let issuers: Vec<_> =
        w.d.outcomes()
            .iter()
            .filter(|o| o.command.type_name == "op.release")
            .map(|o| o.command.issuer.as_str().to_owned())
            .collect();
    assert_eq!(issuers, ["op:web-ui", "op:cli"]);

    settle(&w);
}

/// Drydock "resources mangled outside Drydock's control": a spot instance vanishes. The next report says it is
/// missing: it is lost, its leases break (the holders see it), and new leases are refused instead of failing
/// against it forever.
#[test]
fn drydock_lease_on_a_vanished_spot_instance() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let other = active_resource(&mut w);
    let spot = active_resource(&mut w);
    w.leased(Some(Millis::from_mins(30)));
    let (lease, token) = (w.l(), w.token());

    let report = w.sync(&agent, |r| r.missing = vec![spot]);
    step(&report, &["observation-accepted", "resource-lost", "lease-broken"]);
    assert_eq!(state_name(&w, spot), "lost");
    assert_eq!(state_name(&w, other), "active");
    assert!(matches!(lease_state(&w, lease), LeaseState::Broken { reason: BreakReason::ResourceLeft }));

    // The holder renewing its lease learns it is broken.
    let message = refused(&mut w, InvalidState, |w| w.op(Renew { agent: agent.clone(), lease, token, ttl: None }));
    assert!(message.contains("broken"), "{message}");
    // A new acquire is refused with the reason.
    let message = refused(&mut w, InvalidState, |w| {
        let cmd = w.acquire_cmd(None, None);
        w.op(cmd)
    });
    assert!(message.contains("is lost; acquire refused"), "{message}");
    // A release of a lost resource has nothing to do.
    refused(&mut w, AlreadyDone, |w| w.release());

    settle(&w);
}

/// Drydock's check-after-failure: a failure makes the resource suspect (no new leases, existing ones stay), a health
/// check is requested, and an unhealthy result releases it and breaks its leases.
#[test]
fn drydock_suspect_health_check_unhealthy_releasing() {
    let mut w = World::new();
    w.active().leased(None);
    let (agent, id, lease, token) = (w.a(), w.r(), w.l(), w.token());
    let epoch = w.epoch(&agent);

    // The agent sees the resource misbehave.
    let obs = w.next_obs(&agent);
    let failure = ReportFailure {
        agent: agent.clone(),
        epoch,
        obs,
        resource: id,
        failure: FailureKind::Unhealthy,
        detail: "ssh: connection refused".into(),
    };
    step(&w.agent_says(failure), &["observation-accepted", "resource-suspect"]);
    assert_eq!(state_name(&w, id), "suspect");

    // No new leases on a suspect resource; the existing one stays and can be renewed.
    let message = refused(&mut w, InvalidState, |w| {
        let cmd = w.acquire_cmd(None, None);
        w.op(cmd)
    });
    assert!(message.contains("is suspect; acquire refused"), "{message}");
    step(&w.op(Renew { agent: agent.clone(), lease, token, ttl: None }), &["lease-renewed"]);

    // The sweeper asks for a health check; the agent runs it: unhealthy.
    step(&w.sys(RequestHealthCheck { agent: agent.clone(), resource: id }), &["health-check-requested"]);
    let obs = w.next_obs(&agent);
    let result = HealthResult {
        agent: agent.clone(),
        epoch,
        obs,
        resource: id,
        request: w.state().last_position(),
        healthy: false,
        detail: "disk gone".into(),
    };
    step(&w.agent_says(result), &["observation-accepted", "resource-releasing", "lease-broken"]);
    assert!(matches!(lease_state(&w, lease), LeaseState::Broken { reason: BreakReason::HealthCheckFailed }));

    // A late health check request finds nothing to do; the agent destroys it and says so.
    refused(&mut w, NothingToDo, |w| w.sys(RequestHealthCheck { agent: agent.clone(), resource: id }));
    let report = w.sync(&agent, |r| r.destroyed = vec![id]);
    step(&report, &["observation-accepted", "resource-destroyed"]);

    settle(&w);
}

// --- (h) Arvados: slot 0 and stale slots --------------------------------------------------------------------------

/// Arvados bug 12073: `slot_number == 0` was taken for "no slot", and stale node records kept their slots after the
/// node was gone. Here slot 0 is a slot like any other; a silent agent is stalled, then gone, its resources
/// orphaned, and only then is its slot returned; a stale claim or free from before is ignored.
#[test]
fn arvados_slot_zero_and_stale_slot() {
    let mut w = World::new();
    let cooldown = Millis::from_secs(60);
    step(&w.define_slots("slots", 2, cooldown), &["pool-defined"]);
    let quick = settings(|s| {
        s.stall_after = Millis::from_secs(30);
        s.orphan_after = Millis::from_mins(10);
    });
    let node = w.a();
    step(&w.register_with(&node, quick, false), &["agent-registered"]);
    let other = agent_name("w2");
    step(&w.register_with(&other, AgentSettings::default(), false), &["agent-registered"]);

    // Slot 0 is granted and bound like any other slot, and the resource is created with it.
    let (job, alloc) = allocate(&mut w, &["slots"]);
    let claim = only(claims_for(&alloc));
    let granted = w.sys(claim.clone());
    step(&granted, &["claim-granted"]);
    assert_eq!(granted_value(&granted), PoolValue::Slot(0));
    let bind = only(binds_for(&granted));
    step(&w.sys(bind.clone()), &["claim-bound", "create-ordered"]);
    assert_eq!(
        claim_of(&w, job, "slots"),
        ClaimSlot::Bound {
            value: PoolValue::Slot(0),
            token: bind.token,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        }
    );
    step(&w.report_created(&node, job), &["observation-accepted", "resource-activated"]);
    let job_ref = ResourceRef::new(node.clone(), job);

    // The node goes silent. Not stalled before stall_after (plus the heartbeat coalescing slack)...
    w.advance(Millis::from_secs(30));
    refused(&mut w, NotYetDue, |w| w.sys(MarkStalled { agent: node.clone() }));
    w.advance(Millis::from_secs(10));
    step(&w.sys(MarkStalled { agent: node.clone() }), &["agent-stalled"]);
    let message = refused(&mut w, InvalidState, |w| {
        let cmd = w.allocate_cmd(&node);
        w.op(cmd)
    });
    assert!(message.contains("stalled"), "{message}");

    // ...and a stalled node keeps its slot: another job gets slot 1, a third waits.
    w.agent = other.clone();
    let (_, alloc_2) = allocate(&mut w, &["slots"]);
    let granted_2 = w.sys(only(claims_for(&alloc_2)));
    assert_eq!(granted_value(&granted_2), PoolValue::Slot(1));
    let (third, alloc_3) = allocate(&mut w, &["slots"]);
    step(&w.sys(only(claims_for(&alloc_3))), &["claim-queued"]);
    assert_eq!(holder_of(&w, "slots", PoolValue::Slot(0)), Some(job_ref.clone()));

    // Gone after orphan_after: its resource is orphaned, and only now the slot may go back.
    refused(&mut w, NotYetDue, |w| w.sys(MarkGone { agent: node.clone() }));
    w.advance(Millis::from_mins(10));
    let gone = w.sys(MarkGone { agent: node.clone() });
    step(&gone, &["agent-gone", "resource-orphaned", "claim-releasable"]);
    assert_eq!(w.state().agent(&node).unwrap().liveness, Liveness::Gone);
    let free = only(frees_for(&gone));
    assert_eq!(free.token, Some(bind.token));
    step(&w.sys(free.clone()), &["claim-freed"]);
    assert_eq!(holder_of(&w, "slots", PoolValue::Slot(0)), None);

    // Stale messages from before: a second sweeper re-sends the old claim and the old free.
    let message = refused(&mut w, StaleSource, |w| w.sys(claim.clone()));
    assert!(message.contains("already ended"), "{message}");
    refused(&mut w, AlreadyDone, |w| w.sys(free.clone()));
    // A late report from the gone node is refused.
    let late = SyncReport {
        created: vec![job],
        count: 1,
        digest: HandleDigest::of([&job]),
        ..SyncReport::new(node.clone(), w.epoch(&node), 50, w.state().last_position())
    };
    refused(&mut w, InvalidState, |w| w.agent_says(late));

    // After the cool-down the waiting job gets slot 0: a cleaned record's slot is reused, and only that one.
    w.advance(cooldown);
    let granted_3 = w.sys(TickPool { pool: pool_name("slots") });
    step(&granted_3, &["claim-granted"]);
    assert_eq!(granted_value(&granted_3), PoolValue::Slot(0));
    step(&w.sys(only(binds_for(&granted_3))), &["claim-bound", "create-ordered"]);
    assert!(matches!(claim_of(&w, third, "slots"), ClaimSlot::Bound { value: PoolValue::Slot(0), .. }));

    settle(&w);
}

// --- (i) a holder that goes terminal before the bind --------------------------------------------------------------

/// The pool grants an identifier, but before the sweeper carries the grant back the holder's wait for it runs out,
/// it is released and is confirmed destroyed. The bind that finally arrives sends the claim straight back and the
/// pool frees it.
#[test]
fn claim_of_a_holder_gone_terminal_before_the_bind_goes_straight_back() {
    let (mut agents, mut pools) = two_partitions();
    let agent = agents.a();
    let subnet = PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![] };
    let define = DefinePool {
        pool: pool_name("overlay"),
        kind: subnet,
        cooldown: None,
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    step(&pools.op(define), &["pool-defined"]);
    step(&agents.register_with(&agent, settings(|_| {}), false), &["agent-registered"]);

    let mut cmd = agents.allocate_cmd(&agent);
    cmd.pools = vec![pool_name("overlay")];
    cmd.wait = Some(Millis::from_mins(1));
    let id = cmd.resource;
    agents.last_resource = Some(id);
    let alloc = agents.op(cmd);
    step(&alloc, &["resource-allocated", "claim-wanted", "allocation-waits-until"]);
    let granted = pools.sys(only(claims_for(&alloc)));
    step(&granted, &["claim-granted"]);
    let bind = only(binds_for(&granted));
    let holder = ResourceRef::new(agent.clone(), id);

    // The bind is slow. The wait runs out: releasing, not failed (as a create timeout is).
    refused(&mut agents, NotYetDue, |w| w.sys(CreateTimeout { agent: agent.clone(), resource: id }));
    agents.advance(Millis::from_mins(1));
    step(&agents.sys(CreateTimeout { agent: agent.clone(), resource: id }), &["resource-releasing"]);

    // The agent confirms it absent: destroyed. Its claim was never bound, so it goes back without a token.
    let report = agents.sync(&agent, |r| r.destroyed = vec![id]);
    step(&report, &["observation-accepted", "resource-destroyed", "claim-releasable"]);
    let early_free = only(frees_for(&report));
    assert_eq!(early_free.token, None);
    // At the pool the holder was already granted, so a free without the token cannot take it back.
    let message = refused(&mut pools, TokenMismatch, |p| p.sys(early_free));
    assert!(message.contains("not none"), "{message}");
    assert_eq!(holder_of(&pools, "overlay", bind.value), Some(holder.clone()));

    // The bind arrives: the holder is terminal, so the claim goes straight back, with its token.
    let sent_back = agents.sys(bind.clone());
    step(&sent_back, &["grant-returned"]);
    let free = only(frees_for(&sent_back));
    assert_eq!(free.token, Some(bind.token));
    step(&pools.sys(free), &["claim-freed"]);
    assert_eq!(holder_of(&pools, "overlay", bind.value), None);
    assert!(!pools.state().pool(&pool_name("overlay")).unwrap().holders.contains_key(&holder));

    settle(&agents);
    settle(&pools);
}

// --- regressions: behaviour once found wrong in review, now fixed ----------------------------------------------------

/// Behaviour that once contradicted DESIGN.md or would have surprised an operator, written as the behaviour
/// expected; each failure names its case.
#[test]
fn regressions_found_in_review() {
    let mut failures: Vec<String> = Vec::new();
    let mut expect = |case: &str, outcome: &Outcome, names: &[&str]| {
        let got = match outcome.rejection() {
            Some(rejection) => vec![rejection.kind.to_string()],
            None => effect_names(outcome).iter().map(|n| n.to_string()).collect(),
        };
        if got != names {
            failures.push(format!("{case}: expected {names:?}, got {got:?}"));
        }
    };

    // 1. The Concourse race with an honest difference report. The agent's listing at the watermark lacks the
    //    resource created after it, and the agent does not name that resource (it did not know of it). Its count and
    //    digest are those of its listing. The writer's view "as the agent saw the log at the watermark" should not
    //    include a resource created after the watermark, so no full resync is due.
    {
        let mut w = World::new();
        w.registered();
        let agent = w.a();
        let old = active_resource(&mut w);
        let watermark = w.state().last_position();
        let new = active_resource(&mut w);
        let mut report = w.sync_cmd(&agent, |r| r.watermark = watermark);
        report.count = 1;
        report.digest = HandleDigest::of([&old]);
        let outcome = w.agent_says(report);
        expect("honest report from before a create asks for no resync", &outcome, &["observation-accepted"]);
        assert_eq!(state_name(&w, new), "active");
    }

    // 2. A duplicate bind (a second sweeper, the same grant, the same source) after the holder's claim was bound and
    //    already sent back: the resource has heard from that source already, so DESIGN section 7 says it is ignored.
    //    Sending the claim back a second time puts a second claim-releasable (and a second free) on record.
    {
        let mut w = World::new();
        w.registered();
        let agent = w.a();
        step(&w.define_slots("slots", 1, Millis::from_secs(60)), &["pool-defined"]);
        let (id, alloc) = allocate(&mut w, &["slots"]);
        let granted = w.sys(only(claims_for(&alloc)));
        let bind = only(binds_for(&granted));
        step(&w.sys(bind.clone()), &["claim-bound", "create-ordered"]);
        step(&w.report_created(&agent, id), &["observation-accepted", "resource-activated"]);
        accepted(&w.release());
        let report = w.sync(&agent, |r| r.destroyed = vec![id]);
        step(&report, &["observation-accepted", "resource-destroyed", "claim-releasable"]);
        let outcome = w.sys(bind);
        expect("a duplicate bind after the claim went back is ignored", &outcome, &["already-done"]);
    }

    // 3. A slow create that finishes after its release was ordered: the agent says created, the writer accepts the
    //    observation but records no presence. An honest report from before the release then counts the handle
    //    (it is in the agent's assignment set and present), and the writer, not counting it, asks for a full
    //    resync. And a definitive "create failed" after the create was confirmed is accepted and frees the claims
    //    (DESIGN: `failed` = the driver reported a definitive creation error; here the creation was observed).
    {
        let mut w = World::new();
        w.registered();
        let agent = w.a();
        let (id, alloc) = allocate(&mut w, &[]);
        step(&alloc, &["resource-allocated", "create-ordered"]);
        let before_release = w.state().last_position();
        step(&w.release(), &["resource-releasing"]);
        step(&w.report_created(&agent, id), &["observation-accepted", "resource-seen"]);
        let mut report = w.sync_cmd(&agent, |r| r.watermark = before_release);
        report.count = 1;
        report.digest = HandleDigest::of([&id]);
        let outcome = w.agent_says(report);
        expect(
            "an honest report after a create confirmed during release asks for no resync",
            &outcome,
            &["observation-accepted"],
        );
        let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
        let failure = ReportFailure {
            agent: agent.clone(),
            epoch,
            obs,
            resource: id,
            failure: FailureKind::CreateFailed,
            detail: "create timed out on the client side".into(),
        };
        let outcome = w.agent_says(failure);
        expect("a create failure after the create was confirmed", &outcome, &["invalid-state"]);
    }

    // 4. `register --wiped`: DESIGN says the new incarnation's *first report* may lose everything without the
    //    breaker. The domain instead bypasses the breaker for a time window (loss_window after registration): every
    //    report in it is unprotected, and a first report that comes later is not.
    {
        // (a) After the wiped first report, the agent builds six new resources; a flaky empty report two minutes
        //     later loses all six without the breaker (their claims would be freed while the containers exist).
        let mut w = World::new();
        w.registered();
        let agent = w.a();
        let old: Vec<_> = (0..6).map(|_| active_resource(&mut w)).collect();
        step(&w.register_with(&agent, AgentSettings::default(), true), &["agent-registered"]);
        let first = w.sync(&agent, |r| r.missing = old.clone());
        assert_eq!(effect_names(&first).iter().filter(|n| **n == "resource-lost").count(), 6);
        let new: Vec<_> = (0..6).map(|_| active_resource(&mut w)).collect();
        w.advance(Millis::from_mins(2));
        let flaky = w.sync(&agent, |r| r.missing = new.clone());
        expect(
            "a flaky second report of a wiped incarnation trips the breaker",
            &flaky,
            &["observation-accepted", "agent-suspect"],
        );

        // (b) A wiped incarnation whose first report comes after 11 minutes (a slow start) is not exempt.
        let mut w = World::new();
        w.registered();
        let old: Vec<_> = (0..6).map(|_| active_resource(&mut w)).collect();
        step(&w.register_with(&agent, AgentSettings::default(), true), &["agent-registered"]);
        w.advance(Millis::from_mins(11));
        let first = w.sync(&agent, |r| r.missing = old.clone());
        let mut all_lost = vec!["observation-accepted", "agent-breaker-rearmed"];
        all_lost.extend(["resource-lost"; 6]);
        expect("the slow first report of a wiped incarnation loses everything", &first, &all_lost);
    }

    assert!(failures.is_empty(), "{} regressions:\n{}", failures.len(), failures.join("\n"));
}
