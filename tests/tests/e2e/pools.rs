//! Pools across partitions, end to end (SwarmKit's IP reuse): NATS, one `serve` with every role (the sweeper
//! carries claims, grants, frees and ticks between the pool's partition and the agent's), and a separate
//! `agent run` process the test freezes (SIGSTOP) as a hung machine.
//!
//! A /30 pool has two addresses; two containers take both; a third allocation waits. One container is released
//! while its agent is frozen: it stays `releasing`, its address stays held (the pool itself says it has nothing free
//! or cooling), and the third still waits. The agent comes back, destroys the container and reports it: only then is
//! the address freed, and only after its cool-down is it handed to the third container. The log's own order and
//! times are asserted, not what the test happened to see. The release stuck on the frozen agent past
//! `--release-timeout` raises an alert line and `leasehold_releasing_overdue`.

use std::time::Duration;

use leasehold_log::OutcomeFilter;
use leasehold_projector::ResourceView;
use leasehold_schemas::command::{DefinePool, TickPool};
use leasehold_schemas::ids::{Millis, PoolName};
use leasehold_schemas::outcome::{Effect, FreeCause};
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::{CommandId, ResourceId};
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{
    Api, POLL, STEP, agent_name, allocate_in_pool, command, release, wait_agent, wait_pool, wait_resource,
};
use crate::nats::{FAST_SWEEPER, NatsRun, outcomes, publish};
use crate::support::{Proc, logs, run_cli_on, run_replay};

const PARTITIONS: u32 = 8;
const COOLDOWN: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_comes_back_only_after_its_holder_is_destroyed_and_its_cool_down() {
    let Some(run) = NatsRun::start("pools", PARTITIONS) else { return };
    let mut extra = FAST_SWEEPER.to_vec();
    extra.extend(["--release-timeout", "300ms"]);
    let mut serve = run.serve("serve", &extra);
    let api = Api::new(serve.ready().await);
    let mut agent = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &agent]).await;
    let log = run.log().await;

    let pool = PoolName::new("net").expect("a pool name");
    let kind = PoolKind::Ipv4 { network: "10.9.0.0".parse().expect("an address"), prefix_len: 30, exclude: vec![] };
    let define = DefinePool {
        pool: pool.clone(),
        kind,
        cooldown: Some(Millis(COOLDOWN.as_millis() as u64)),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    api.accepted(&command(define), &[&serve]).await;

    // Two containers take both addresses.
    let a1 = agent_name("a1");
    let with_address = |id: ResourceId| allocate_in_pool(&a1, id, &pool);
    let (c1, c2, c3) = (ResourceId::generate(), ResourceId::generate(), ResourceId::generate());
    let mut addresses = Vec::new();
    for id in [c1, c2] {
        api.accepted(&with_address(id), &[&serve]).await;
        let view = wait_resource(&api, &format!("a1.{id}"), |r| r.state == "active", &[&serve, &agent]).await;
        addresses.push(bound_address(&view).expect("an active container holds its address"));
    }
    assert_ne!(addresses[0], addresses[1], "two containers, two addresses: {addresses:?}");

    // A third waits: the pool has nothing to give.
    api.accepted(&with_address(c3), &[&serve]).await;
    wait_pool(&api, "net", |p| p["waiting"] == 1 && p["held"] == 2, &[&serve, &agent]).await;

    // The agent hangs; c1 is released. It stays releasing and keeps its address.
    agent.freeze();
    api.accepted(&release(&a1, c1), &[&serve]).await;
    // A tick straight to the log, as a sweeper would send it: the pool's own answer says what it has free.
    let tick = publish(&log, "e2e-sweeper", TickPool { pool: pool.clone() }).await;
    let answer = wait_decided(&api, tick, &[&serve]).await;
    assert_eq!(answer["status"], "rejected", "{answer:#}");
    let message = answer["rejection"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no identifier free or cooling"),
        "the pool has nothing free while c1 is releasing: {message}"
    );
    let releasing = api.resource(&format!("a1.{c1}")).await.expect("c1");
    assert_eq!(releasing.state, "releasing", "{releasing:?}");
    assert_eq!(bound_address(&releasing).as_deref(), Some(addresses[0].as_str()), "c1 still holds its address");
    let waiting = api.resource(&format!("a1.{c3}")).await.expect("c3");
    assert_eq!(waiting.state, "pending", "{waiting:?}");

    // Releasing past the release timeout: an alert line and a metric an operator sees.
    let deadline = Instant::now() + STEP;
    while !serve.log().contains(&format!("ALERT: resource a1.{c1} has been releasing since")) {
        assert!(Instant::now() < deadline, "no alert for the release stuck on a frozen agent\n{}", serve.tail());
        tokio::time::sleep(POLL).await;
    }
    let metrics = api.text("/metrics").await.expect("/metrics");
    assert!(metrics.lines().any(|l| l == "leasehold_releasing_overdue 1"), "{metrics}");

    // The agent comes back: it destroys c1 and says so; the address is freed, cools down, and goes to c3.
    agent.resume();
    let view = wait_resource(&api, &format!("a1.{c3}"), |r| r.state == "active", &[&serve, &agent]).await;
    assert_eq!(bound_address(&view).as_deref(), Some(addresses[0].as_str()), "c3 got c1's address");

    // The log's order: c1 destroyed, then its address freed, then (a cool-down later) granted to c3.
    let mut destroyed = None;
    let mut freed = None;
    let mut granted = None;
    for (seq, outcome) in outcomes(&log, &OutcomeFilter::All).await {
        for effect in outcome.effects() {
            match effect {
                Effect::ResourceDestroyed { resource, .. } if *resource == c1 => {
                    destroyed = Some((seq, outcome.decided_at));
                }
                Effect::ClaimFreed { holder, value, .. } if holder.resource == c1 => {
                    assert_eq!(value.to_string(), addresses[0]);
                    freed = Some((seq, outcome.decided_at));
                }
                Effect::ClaimGranted { holder, value, .. } if holder.resource == c3 => {
                    assert_eq!(value.to_string(), addresses[0]);
                    granted = Some((seq, outcome.decided_at));
                }
                _ => {}
            }
        }
    }
    let (destroyed, freed, granted) = match (destroyed, freed, granted) {
        (Some(d), Some(f), Some(g)) => (d, f, g),
        other => panic!("destroyed, freed, granted: {other:?}\n{}", logs([&serve, &agent].into_iter())),
    };
    assert!(
        destroyed.0 < freed.0 && freed.0 < granted.0,
        "destroyed {destroyed:?}, freed {freed:?}, granted {granted:?}"
    );
    let cooled = granted.1.since(freed.1);
    assert!(cooled.0 >= COOLDOWN.as_millis() as u64, "granted {cooled:?} after it was freed, within the cool-down");

    serve.assert_no_panic();
    agent.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// The identifier (an address, a slot) a resource's claim is bound to.
fn bound_address(view: &ResourceView) -> Option<String> {
    view.claims.iter().find(|c| c.status == "bound").and_then(|c| c.id.clone())
}

/// Waits until the command is decided (the gateway shows its outcome); returns its status.
async fn wait_decided(api: &Api, id: CommandId, processes: &[&Proc]) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(status) = api.get(&format!("/v1/commands/{id}")).await
            && ["accepted", "rejected"].contains(&status["status"].as_str().unwrap_or_default())
        {
            return status;
        }
        assert!(Instant::now() < deadline, "command {id} not decided in {STEP:?}\n{}", logs(processes.iter().copied()));
        tokio::time::sleep(POLL).await;
    }
}

/// The identifier an orphan keeps (a pool defined with `--orphans hold`).
fn held_for_orphan(view: &ResourceView) -> Option<String> {
    view.claims.iter().find(|c| c.status == "held-for-orphan").and_then(|c| c.id.clone())
}

/// Pools that hold an orphan's identifiers (issue 19, item 3), over a real nats-server with two agent processes and
/// the command line: `pool define --orphans hold`; a1's process dies for good and a1 is declared gone (a short
/// policy); its two containers are orphaned and keep their slots while a2's allocations wait (the pool's own answer
/// to a tick says it has nothing free). An operator frees one with `pool free-orphan ... --reason`, on record: it goes
/// to a waiter. a1's process comes back on the same machine, reports the other orphan's handle, destroys it as
/// ordered and says so: that slot goes to the other waiter. The pool's record says why each was freed, and
/// `leasehold-replay why --slot` says it in words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphans_slot_stays_held_until_an_operator_frees_it_or_its_agent_confirms_the_destroy() {
    let Some(run) = NatsRun::start("orphans", PARTITIONS) else { return };
    let mut extra = vec!["--stall-after", "3s", "--orphan-after", "5s"];
    extra.extend(FAST_SWEEPER);
    let mut serve = run.serve("serve", &extra);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &[]);
    let mut a2 = run.agent("a2", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    wait_agent(&api, "a2", |a| a.status == "live", &[&serve, &a2]).await;
    let log = run.log().await;
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);

    let ran = cli(&["pool", "define", "net", "--slots", "2", "--cooldown", "0s", "--orphans", "hold"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran = cli(&["pool", "ls"]).await;
    assert!(ran.stdout.lines().any(|l| l.starts_with("net ") && l.contains(" hold ")), "{}", ran.stdout);
    let pool = PoolName::new("net").expect("a pool name");
    let (a1_name, a2_name) = (agent_name("a1"), agent_name("a2"));
    let (freed_by_operator, confirmed) = (ResourceId::generate(), ResourceId::generate());
    for id in [freed_by_operator, confirmed] {
        api.accepted(&allocate_in_pool(&a1_name, id, &pool), &[&serve]).await;
        wait_resource(&api, &format!("a1.{id}"), |r| r.state == "active", &[&serve, &a1]).await;
    }
    let (first_waiter, second_waiter) = (ResourceId::generate(), ResourceId::generate());
    api.accepted(&allocate_in_pool(&a2_name, first_waiter, &pool), &[&serve]).await;
    wait_pool(&api, "net", |p| p["waiting"] == 1 && p["held"] == 2, &[&serve]).await;

    // a1's machine dies: gone, its containers orphaned, their slots kept.
    a1.kill9();
    wait_agent(&api, "a1", |a| a.status == "gone", &[&serve]).await;
    let mut slots = Vec::new();
    for id in [freed_by_operator, confirmed] {
        let view = wait_resource(&api, &format!("a1.{id}"), |r| r.state == "orphaned", &[&serve]).await;
        let slot = held_for_orphan(&view).unwrap_or_else(|| panic!("the orphan keeps its slot: {view:?}"));
        let detail = view.detail.as_ref().map(|d| d["freed_because"].to_string()).unwrap_or_default();
        assert!(detail.contains("not freed yet: held for the orphan"), "{detail}");
        slots.push(slot);
    }
    // The pool's own answer: nothing free or cooling while the orphans hold both.
    let tick = publish(&log, "e2e-sweeper", TickPool { pool: pool.clone() }).await;
    let answer = wait_decided(&api, tick, &[&serve]).await;
    let message = answer["rejection"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no identifier free or cooling"), "the orphans hold both slots: {answer:#}");
    let waiting = api.resource(&format!("a2.{first_waiter}")).await.expect("the waiter");
    assert_eq!(waiting.state, "pending", "{waiting:?}");

    // An operator frees one, on record: it goes to the waiter.
    let orphan = format!("a1.{freed_by_operator}");
    let ran = cli(&["pool", "free-orphan", &orphan]).await;
    assert_ne!(ran.code, Some(0), "a reason is required: {ran:?}");
    let ran = cli(&["pool", "free-orphan", &orphan, "--reason", "a1 scrapped"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let view = wait_resource(&api, &format!("a2.{first_waiter}"), |r| r.state == "active", &[&serve, &a2]).await;
    assert_eq!(bound_address(&view), Some(slots[0].clone()), "the waiter got the freed orphan's slot");
    let ran = cli(&["pool", "free-orphan", &orphan, "--reason", "again"]).await;
    assert_eq!(ran.code, Some(0), "freeing what went back already holds: {ran:?}");

    // a1's process comes back on the same machine: it reports the other orphan's handle, destroys it as ordered
    // and says so; only then does that slot go to the next waiter.
    api.accepted(&allocate_in_pool(&a2_name, second_waiter, &pool), &[&serve]).await;
    wait_pool(&api, "net", |p| p["waiting"] == 1, &[&serve]).await;
    let mut a1 = run.agent("a1", &[]);
    let view = wait_resource(&api, &format!("a2.{second_waiter}"), |r| r.state == "active", &[&serve, &a1, &a2]).await;
    assert_eq!(bound_address(&view), Some(slots[1].clone()), "the second waiter got the confirmed orphan's slot");

    // The pool's record says why each was freed, after the holder's partition let it go.
    let mut causes = Vec::new();
    for (_, outcome) in outcomes(&log, &OutcomeFilter::All).await {
        for effect in outcome.effects() {
            if let Effect::ClaimFreedBecause { holder, cause } = effect {
                causes.push((holder.resource, cause.clone()));
            }
        }
    }
    match causes.as_slice() {
        [(a, FreeCause::OrphanFreed { by, reason }), (b, FreeCause::OrphanDestroyed { .. })] => {
            assert_eq!((*a, *b), (freed_by_operator, confirmed));
            assert_eq!(reason, "a1 scrapped");
            assert!(by.as_str().starts_with("cli"), "the operator's name: {by}");
        }
        other => panic!("the frees' causes: {other:?}\n{}", logs([&serve, &a1].into_iter())),
    }
    // And in words, from the log.
    let slot = format!("net:{}", slots[1].trim_start_matches("slot "));
    let ran = run_replay(run.path(), &["--server", &server, "why", "--slot", &slot], STEP).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("freed because orphan of gone agent a1, destroy confirmed by a1 at"), "{}", ran.stdout);

    serve.assert_no_panic();
    a1.stop_cleanly().await;
    a2.stop_cleanly().await;
    serve.stop_cleanly().await;
}
