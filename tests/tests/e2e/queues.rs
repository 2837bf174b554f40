//! Leases that queue on a busy resource, end to end: NATS, a `serve` with every role, an agent, and the command line.
//!
//! An operator caps priorities (`policy set --max-priority`); on a resource of capacity 1 that is held, a lease
//! without a wait timeout is refused naming the queue, a lease with one queues, and one of a higher priority queues
//! ahead of it (`leases` shows the queue); `acquire --block` waits through the queue and is granted when the holder
//! releases; a renew past the resource's max lease time is refused while another waits.

use leasehold_schemas::ResourceId;
use serde_json::Value;

use crate::api::{Api, agent_name, allocate, wait_agent, wait_resource};
use crate::nats::{FAST_SWEEPER, NatsRun};
use crate::support::{Ran, run_cli_on};

const PARTITIONS: u32 = 4;

fn json(ran: &Ran) -> Value {
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {ran:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_resource_queues_leases_by_priority_and_grants_them_as_holders_release() {
    let Some(run) = NatsRun::start("queues", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &[]);
    wait_agent(&api, "a1", |a| a.status == "live", &[&serve, &a1]).await;
    let id = ResourceId::generate();
    api.accepted(&allocate(&agent_name("a1"), id), &[&serve]).await;
    let reference = format!("a1.{id}");
    wait_resource(&api, &reference, |r| r.state == "active", &[&serve, &a1]).await;
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);

    let ran = cli(&["policy", "set", "--max-priority", "ci:=3"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains("max-priority") && ran.stdout.contains("ci:=3"), "{ran:?}");
    let ran = cli(&["--output", "json", "acquire", &reference, "--holder", "holder", "--issuer", "ci:a"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let held = json(&ran);
    assert_eq!(held["state"], "active", "{held}");

    // Busy: refused without a wait timeout (naming the queue), queued with one; a priority over the cap is refused.
    let ran = cli(&["acquire", &reference, "--holder", "impatient", "--issuer", "ci:b"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("at capacity (1 of 1 leases held, 0 waiting)"), "{ran:?}");
    let ran = cli(&["acquire", &reference, "--holder", "greedy", "--priority", "4", "--wait-timeout", "1min"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("priority 4 is above what") && ran.stderr.contains("no priority cap"), "{ran:?}");
    let low = ["--output", "json", "acquire", &reference, "--holder", "nightly", "--wait-timeout", "5min"];
    let ran = cli(&low).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let nightly = json(&ran);
    assert_eq!(nightly["state"], "waiting", "{nightly}");

    // A priority-2 lease from a capped issuer waits through the queue (--block) ahead of the earlier one.
    let urgent = [
        "--output",
        "json",
        "--issuer",
        "ci:release",
        "acquire",
        &reference,
        "--holder",
        "release",
        "--priority",
        "2",
        "--wait-timeout",
        "5min",
        "--block",
        "--timeout",
        "60s",
    ];
    let blocked = tokio::spawn(cli(&urgent));
    let deadline = std::time::Instant::now() + crate::api::STEP;
    let queue = loop {
        let ran = cli(&["leases", &reference]).await;
        assert_eq!(ran.code, Some(0), "{ran:?}");
        if ran.stdout.lines().filter(|l| l.contains(" waiting ")).count() == 2 {
            break ran.stdout;
        }
        assert!(!blocked.is_finished(), "acquire --block ended while the resource was held");
        assert!(std::time::Instant::now() < deadline, "the queue never held both: {}", ran.stdout);
        tokio::time::sleep(crate::api::POLL).await;
    };
    assert!(queue.lines().next().is_some_and(|h| h.contains("QUEUE") && h.contains("PRIORITY")), "{queue}");
    let row = |holder: &str| queue.lines().find(|l| l.contains(holder)).unwrap_or_else(|| panic!("{queue}")).to_owned();
    let column = |line: &str, n: usize| line.split_whitespace().nth(n).map(str::to_owned);
    // ID RESOURCE HOLDER STATE TOKEN EXPIRES QUEUE ...: the queue position is the 7th word.
    assert_eq!(column(&row("release"), 6).as_deref(), Some("1"), "{queue}");
    assert_eq!(column(&row("nightly"), 6).as_deref(), Some("2"), "{queue}");

    // The holder releases: the priority-2 lease is granted in that decision, and --block returns it.
    let (lease, token) = (held["id"].as_str().unwrap(), held["token"].as_u64().unwrap().to_string());
    let ran = cli(&["release-lease", lease, "--token", &token]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran = blocked.await.expect("the blocked acquire");
    assert_eq!(ran.code, Some(0), "granted through the queue: {ran:?}");
    assert!(ran.stderr.contains("is 1 of 2 in the queue of"), "its place was told: {ran:?}");
    let granted = json(&ran);
    assert_eq!(granted["state"], "active", "{granted}");

    // A max lease time: while nightly waits, a renew past it is refused.
    let ran = cli(&["update", &reference, "--max-lease", "1s"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let (lease, token) = (granted["id"].as_str().unwrap(), granted["token"].as_u64().unwrap().to_string());
    let ran = cli(&["renew", lease, "--token", &token, "--ttl", "10min"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("while others wait (1 waiting)"), "{ran:?}");
    // Released, the last waiter is granted.
    let ran = cli(&["release-lease", lease, "--token", &token]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let nightly_id = nightly["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + crate::api::STEP;
    let view = loop {
        let view = api.lease(&nightly_id).await.expect("the waiting lease is known");
        if view.state != "waiting" {
            break view;
        }
        assert!(std::time::Instant::now() < deadline, "{nightly_id} still waits: {view:?}");
        tokio::time::sleep(crate::api::POLL).await;
    };
    assert_eq!(view.state, "active", "{view:?}");
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    serve.stop_cleanly().await;
}
