//! Agents that go away or lose their disk, end to end: NATS, a `serve` with every role, and `agent run` processes
//! the test stops, kills and starts again.
//!
//! - A restarted agent whose directory was wiped (and that does not say so) reports everything missing: the circuit
//!   breaker trips, the agent turns `suspect` and nothing is marked lost, report after report, until an operator
//!   confirms the loss; then the next report marks them `lost`. An agent started with `--wiped` loses what it lost
//!   at once, without the breaker.
//! - An agent whose process dies for good turns `stalled` (no new placements), then `gone`; its resources turn
//!   `orphaned` and their claims come back to the pool.
//! - A cordoned agent takes no new allocations and keeps what it holds, until it is uncordoned.
//! - A drained agent's idle resource is released after the grace, its leased one at the deadline.

use std::path::Path;

use leasehold_log::OutcomeFilter;
use leasehold_log::jetstream::JetStream;
use leasehold_schemas::command::{ConfirmLoss, DefinePool};
use leasehold_schemas::ids::{Millis, PoolName};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::{LeaseId, ResourceId};

use crate::api::{Api, acquire, agent_name, allocate, allocate_in_pool, command, wait_agent, wait_pool, wait_resource};
use crate::nats::{FAST_SWEEPER, NatsRun, outcomes};
use crate::support::{Proc, run_cli, run_cli_on};

const PARTITIONS: u32 = 8;
/// More than the breaker lets go at once (at least 5, and more than half of the agent's resources).
const RESOURCES: usize = 6;

/// Allocates [`RESOURCES`] resources on a1 and waits until its agent has made them all.
async fn allocate_active(api: &Api, processes: &[&Proc]) -> Vec<ResourceId> {
    let a1 = agent_name("a1");
    let mut resources = Vec::new();
    for _ in 0..RESOURCES {
        let id = ResourceId::generate();
        api.accepted(&allocate(&a1, id), processes).await;
        resources.push(id);
    }
    for id in &resources {
        wait_resource(api, &format!("a1.{id}"), |r| r.state == "active", processes).await;
    }
    resources
}

/// Removes the resource directories under `root` (what a wiped disk looks like), keeping the agent's own files.
fn wipe(root: &Path, resources: &[ResourceId]) {
    for id in resources {
        std::fs::remove_dir_all(root.join(id.to_string())).expect("wipe a resource directory");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_agent_trips_the_breaker_until_the_loss_is_confirmed() {
    let Some(run) = NatsRun::start("agents", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &[]);
    let api = Api::new(serve.ready().await);
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let name = agent_name("a1");
    let resources = allocate_active(&api, &[&serve, &a1]).await;

    // The agent stops; its disk is wiped; it starts again without saying so.
    a1.stop_cleanly().await;
    wipe(&run.path().join("a1"), &resources);
    let mut a1 = run.agent("a1", &[]);
    let suspect = wait_agent(&api, "a1", |a| a.status == "suspect", &[&serve, &a1]).await;
    let epoch = suspect.epoch;
    // Report after report, nothing is lost while the breaker holds.
    let log = run.log().await;
    let reports_while_suspect = wait_reports(&log, epoch, 3, &[&serve, &a1]).await;
    assert!(reports_while_suspect >= 3);
    for id in &resources {
        let view = api.resource(&format!("a1.{id}")).await.expect("the resource");
        assert_eq!(view.state, "active", "nothing is marked lost while the breaker holds: {view:?}");
    }

    // An operator confirms: the next report marks them lost.
    let confirmed = api.accepted(&command(ConfirmLoss { agent: name.clone() }), &[&serve]).await;
    let confirmed_at = confirmed["outcomes"][0]["seq"].as_u64().expect("the confirmation's sequence");
    for id in &resources {
        wait_resource(&api, &format!("a1.{id}"), |r| r.state == "lost", &[&serve, &a1]).await;
    }
    let first_loss = first_seq(&log, |e| matches!(e, Effect::ResourceLost { .. })).await.expect("losses");
    assert!(first_loss > confirmed_at, "nothing was lost before the confirmation ({first_loss} <= {confirmed_at})");
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;

    // A wiped incarnation that says so loses what it lost at once.
    let more = allocate_active(&api, &[&serve, &a1]).await;
    a1.stop_cleanly().await;
    wipe(&run.path().join("a1"), &more);
    let trips_before = count(&log, |e| matches!(e, Effect::AgentSuspect { .. })).await;
    let mut a1 = run.agent("a1", &["--wiped"]);
    for id in &more {
        wait_resource(&api, &format!("a1.{id}"), |r| r.state == "lost", &[&serve, &a1]).await;
    }
    assert_eq!(count(&log, |e| matches!(e, Effect::AgentSuspect { .. })).await, trips_before, "no trip when wiped");

    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// The sequence of the first outcome with an effect that `matches`.
async fn first_seq(log: &JetStream, matches: impl Fn(&Effect) -> bool) -> Option<u64> {
    outcomes(log, &OutcomeFilter::All)
        .await
        .into_iter()
        .find(|(_, o)| o.effects().iter().any(&matches))
        .map(|(seq, _)| seq)
}

/// How many effects `match`.
async fn count(log: &JetStream, matches: impl Fn(&Effect) -> bool) -> usize {
    outcomes(log, &OutcomeFilter::All)
        .await
        .iter()
        .map(|(_, o)| o.effects().iter().filter(|e| matches(e)).count())
        .sum()
}

/// Waits until `n` sync reports of the incarnation at `epoch` were decided; returns how many there are.
async fn wait_reports(log: &JetStream, epoch: u64, n: usize, processes: &[&Proc]) -> usize {
    let deadline = tokio::time::Instant::now() + crate::api::STEP;
    loop {
        let reports = outcomes(log, &OutcomeFilter::All)
            .await
            .iter()
            .filter(|(_, o)| o.command.type_name == "agent.sync")
            .flat_map(|(_, o)| o.effects())
            .filter(|e| matches!(e, Effect::ObservationAccepted { stamp, .. } if stamp.epoch.0 == epoch))
            .count();
        if reports >= n {
            return reports;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{reports} of {n} reports\n{}",
            crate::support::logs(processes.iter().copied())
        );
        tokio::time::sleep(crate::api::POLL).await;
    }
}

/// A stale agent: its process is killed for good. With a short policy (`serve --stall-after 3s --orphan-after 5s`),
/// it turns `stalled` (no new placements), then `gone`; its resources are `orphaned` and their claims freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_dies_turns_stalled_then_gone_and_its_claims_come_back() {
    let Some(run) = NatsRun::start("stale", PARTITIONS) else { return };
    let mut extra = vec!["--stall-after", "3s", "--orphan-after", "5s"];
    extra.extend(FAST_SWEEPER);
    let mut serve = run.serve("serve", &extra);
    let api = Api::new(serve.ready().await);
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let name = agent_name("a1");
    let pool = PoolName::new("slots").expect("a pool name");
    let define = DefinePool {
        pool: pool.clone(),
        kind: PoolKind::Slots { count: 4 },
        cooldown: Some(Millis(0)),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    api.accepted(&command(define), &[&serve]).await;
    let mut resources = Vec::new();
    for _ in 0..2 {
        let id = ResourceId::generate();
        api.accepted(&allocate_in_pool(&name, id, &pool), &[&serve]).await;
        resources.push(id);
    }
    for id in &resources {
        wait_resource(&api, &format!("a1.{id}"), |r| r.state == "active", &[&serve, &a1]).await;
    }

    // The machine dies.
    a1.kill9();
    wait_agent(&api, "a1", |a| a.status == "stalled", &[&serve]).await;
    let refused = api.decide(&allocate(&name, ResourceId::generate()), &[&serve]).await;
    assert_eq!(refused["status"], "rejected", "no new placement on a stalled agent: {refused:#}");
    wait_agent(&api, "a1", |a| a.status == "gone", &[&serve]).await;
    for id in &resources {
        let view = wait_resource(&api, &format!("a1.{id}"), |r| r.state == "orphaned", &[&serve]).await;
        assert!(view.claims.iter().all(|c| c.status != "bound"), "an orphan holds no slot: {view:?}");
    }
    wait_pool(&api, "slots", |p| p["held"] == 0, &[&serve]).await;
    serve.assert_no_panic();
    serve.stop_cleanly().await;
}

/// `agent cordon` through the command line and the gateway, over a real nats-server: new allocations on the agent are
/// refused naming the cordon, what it holds goes on (a lease is granted), `agents` shows who, since when and why, and
/// `agent uncordon` lets allocations through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_agent_keeps_what_it_holds_and_takes_nothing_new_until_uncordoned() {
    let Some(run) = NatsRun::start("cordon", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let held = allocate_active(&api, &[&serve, &a1]).await;
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);

    let ran = cli(&["agent", "cordon", "a1", "--reason", "kernel upgrade"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran = cli(&["allocate", "--agent", "a1", "--kind", "volume"]).await;
    assert_eq!(ran.code, Some(1), "an allocation on a cordoned agent is refused: {ran:?}");
    assert!(ran.stderr.contains("is cordoned (by") && ran.stderr.contains("kernel upgrade"), "{ran:?}");
    let lease = acquire(&agent_name("a1"), held[0], LeaseId::generate());
    api.accepted(&lease, &[&serve]).await;
    // LEASEHOLD_SERVER names the gateway as --server does.
    let ran = run_cli(run.path(), &["agents"], &[("LEASEHOLD_SERVER", server.as_str())]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("live, cordoned") && ran.stdout.contains(": kernel upgrade"), "{}", ran.stdout);
    let ran = cli(&["agent", "cordon", "a1"]).await;
    assert_eq!(ran.code, Some(1), "a second cordon is refused, naming the first: {ran:?}");
    assert!(ran.stderr.contains("already cordoned"), "{ran:?}");

    let ran = cli(&["agent", "uncordon", "a1"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran = cli(&["allocate", "--agent", "a1", "--kind", "volume"]).await;
    assert_eq!(ran.code, Some(0), "allocations go through again: {ran:?}");
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// What a resource waits on, end to end: a frozen agent leaves a released resource `releasing`, and `get` (and the
/// gateway's record) says it waits for that agent to confirm the destroy, since when, and when the agent was last
/// heard from; once the agent has destroyed it, nothing is waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_says_what_a_releasing_resource_waits_on() {
    let Some(run) = NatsRun::start("waiting", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let id = ResourceId::generate();
    api.accepted(&allocate(&agent_name("a1"), id), &[&serve]).await;
    let reference = format!("a1.{id}");
    wait_resource(&api, &reference, |r| r.state == "active", &[&serve, &a1]).await;

    a1.freeze();
    let ran = run_cli(run.path(), &["--server", &server, "release", &reference], &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let view = wait_resource(&api, &reference, |r| r.state == "releasing", &[&serve]).await;
    let waiting = view.waiting_on.expect("a releasing resource waits on something");
    assert!(waiting.on.starts_with("waiting for a1 to confirm the destroy; a1 last heard from "), "{waiting:?}");
    assert!(waiting.since.is_some(), "{waiting:?}");
    let ran = run_cli(run.path(), &["--server", &server, "get", &reference], &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let line = ran.stdout.lines().find(|l| l.starts_with("waiting_on")).unwrap_or_else(|| panic!("{}", ran.stdout));
    assert!(line.contains("waiting for a1 to confirm the destroy") && line.contains(" ago)"), "{line}");

    a1.resume();
    let view = wait_resource(&api, &reference, |r| r.state == "destroyed", &[&serve, &a1]).await;
    assert_eq!(view.waiting_on, None, "a destroyed resource waits on nothing");
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// `agent run --capacity volume=1 --label zone=a`, over a real nats-server: the declaration is on record and in
/// `agents`; a second volume is refused while the first is there (naming the capacity), and allowed once the first
/// is destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_capacity_refuses_allocations_past_it_until_a_place_frees() {
    let Some(run) = NatsRun::start("capacity", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &["--capacity", "volume=1", "--label", "zone=a"]);
    let agent =
        wait_agent(&api, "a1", |a| a.status == "live" && a.capacity.get("volume") == Some(&1), &[&serve, &a1]).await;
    assert_eq!(agent.labels.get("zone").map(String::as_str), Some("a"));
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);
    let ran = cli(&["allocate", "--agent", "a1", "--kind", "volume"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let first = ran.stdout.trim().to_owned();
    wait_resource(&api, &first, |r| r.state == "active", &[&serve, &a1]).await;
    let ran = cli(&["allocate", "--agent", "a1", "--kind", "volume"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("is full for volume: 1 of 1"), "{ran:?}");
    let ran = cli(&["agents"]).await;
    assert!(ran.stdout.contains("volume 1/1"), "{}", ran.stdout);

    let ran = cli(&["release", &first]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    wait_resource(&api, &first, |r| r.state == "destroyed", &[&serve, &a1]).await;
    let ran = cli(&["allocate", "--agent", "a1", "--kind", "volume"]).await;
    assert_eq!(ran.code, Some(0), "a place freed: {ran:?}");
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// `agent drain` through the command line, over a real nats-server: of an agent's two resources, the idle one is
/// released once the grace has passed (cause `drained`, not at the deadline) and the leased one, which says in
/// `waiting_on` when it goes, at the deadline with its lease broken; `agents` shows the drain, then `drained`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_agent_releases_idle_resources_after_the_grace_and_the_rest_at_the_deadline() {
    let Some(run) = NatsRun::start("drain", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let a1_name = agent_name("a1");
    let (idle, leased) = (ResourceId::generate(), ResourceId::generate());
    for id in [idle, leased] {
        api.accepted(&allocate(&a1_name, id), &[&serve]).await;
    }
    let (idle, leased) = (format!("a1.{idle}"), format!("a1.{leased}"));
    for reference in [&idle, &leased] {
        wait_resource(&api, reference, |r| r.state == "active", &[&serve, &a1]).await;
    }
    let lease = LeaseId::generate();
    api.accepted(&acquire(&a1_name, leased.split_once('.').unwrap().1.parse().unwrap(), lease), &[&serve]).await;
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);

    let drain = ["agent", "drain", "a1", "--deadline", "6s", "--grace", "1s", "--reason", "kernel upgrade"];
    let ran = cli(&drain).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("agent a1 cordoned") && ran.stdout.contains("agent a1 drains"), "{}", ran.stdout);
    let view = wait_resource(&api, &leased, |r| r.waiting_on.is_some(), &[&serve]).await;
    let waiting = view.waiting_on.expect("a leased resource of a draining agent says when it goes").on;
    assert!(
        waiting.starts_with(
            "its agent a1 drains: released once its leases end and it has held none for 1s, or at \
             the drain's deadline "
        ),
        "{waiting}"
    );
    let ran = cli(&["agents"]).await;
    assert!(ran.stdout.contains("live, draining") && ran.stdout.contains(" left; deadline "), "{}", ran.stdout);
    assert!(ran.stdout.contains("grace 1s) by ") && ran.stdout.contains(": kernel upgrade"), "{}", ran.stdout);

    let cause =
        |view: &leasehold_projector::ResourceView| view.detail.as_ref().map(|d| d["release"]["drained"].clone());
    let view = wait_resource(&api, &idle, |r| r.state == "destroyed", &[&serve, &a1]).await;
    assert_eq!(
        cause(&view).map(|c| c["deadline"].clone()),
        Some(serde_json::json!(false)),
        "idle past the grace: {view:?}"
    );
    let view = wait_resource(&api, &leased, |r| r.state == "destroyed", &[&serve, &a1]).await;
    assert_eq!(cause(&view).map(|c| c["deadline"].clone()), Some(serde_json::json!(true)), "at the deadline: {view:?}");
    let lease = api.get(&format!("/v1/leases/a1.{lease}")).await.expect("the lease");
    assert_eq!(lease["state"], "broken", "{lease:#}");
    let agent = wait_agent(&api, "a1", |a| a.drain.as_ref().is_some_and(|d| d.left == 0), &[&serve, &a1]).await;
    assert_eq!(agent.drain.map(|d| d.reason), Some(Some("kernel upgrade".to_owned())));
    let ran = cli(&["agents"]).await;
    assert!(ran.stdout.contains("live, drained") && ran.stdout.contains("drained by "), "{}", ran.stdout);
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}
