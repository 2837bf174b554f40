//! Ready means ready (issue 16, item 5): a `serve` process takes commands only once the policy it seeds is stored in
//! every partition (each partition decides in log order, so a command stored after it is decided under it), and its
//! `/readyz` says when. Before, a pool defined as soon as `/healthz` answered often got the default one-minute
//! cool-down instead of `--claim-cooldown`: its command was stored before its partition's policy command.

use std::path::Path;

use leasehold_log::Log;
use leasehold_schemas::command::DefinePool;
use leasehold_schemas::ids::PoolName;
use leasehold_schemas::pool::PoolKind;
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{POLL, STEP, command};
use crate::nats::NatsRun;
use crate::support::{Proc, run_cli};

/// Fresh logs of the default 32 partitions: the policy of the pool's partition used to be stored after the pool's
/// command in about four tries in five, so a handful of tries fail on that code almost surely.
const EMBEDDED_TRIES: usize = 6;
const NATS_TRIES: usize = 2;

/// Defined as soon as `/readyz` answers, a pool without a cool-down of its own takes the policy's
/// (`--claim-cooldown 2s`), never the default minute: on fresh embedded logs, then on fresh NATS servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_defined_as_soon_as_serve_is_ready_takes_the_seeded_cooldown() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-ready-").tempdir().expect("a temporary directory");
    for attempt in 0..EMBEDDED_TRIES {
        let data = dir.path().join(format!("data-{attempt}")).display().to_string();
        let args = ["serve", "--claim-cooldown", "2s", "--listen", "127.0.0.1:0", "--data", &data];
        let mut serve = Proc::spawn(dir.path(), &format!("serve-{attempt}"), &args);
        let server = serve.ready().await;
        define_and_check_cooldown(dir.path(), &server, &format!("embedded-{attempt}"), &serve).await;
        serve.stop_cleanly().await;
    }
    for attempt in 0..NATS_TRIES {
        let Some(run) = NatsRun::start("ready", 32) else { return };
        let mut serve = run.serve("serve", &["--claim-cooldown", "2s"]);
        let server = serve.ready().await;
        define_and_check_cooldown(run.path(), &server, &format!("nats-{attempt}"), &serve).await;
        serve.stop_cleanly().await;
    }
}

/// `leasehold pool define POOL --slots 2` at once, and its cool-down is the policy's 2 s.
async fn define_and_check_cooldown(dir: &Path, server: &str, pool: &str, serve: &Proc) {
    let defined = run_cli(dir, &["--server", server, "pool", "define", pool, "--slots", "2"], &[]).await;
    assert_eq!(defined.code, Some(0), "pool define {pool}: {defined:?}\n{}", serve.tail());
    let listed = run_cli(dir, &["--server", server, "--output", "json", "pool", "ls"], &[]).await;
    let pools: Value = serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("{e}: {listed:?}"));
    let pool = pools.as_array().and_then(|all| all.iter().find(|p| p["name"] == pool)).expect("the pool is listed");
    assert_eq!(pool["cooldown_ms"], 2_000, "the policy's cool-down, not the default: {pool:#}\n{}", serve.tail());
}

/// A gateway that runs no worker role seeds no policy (its user may not publish on the settings subjects): on a new
/// log it is not ready, and refuses commands (503, `Retry-After`, nothing stored, while `/healthz` stays 200), until
/// a worker has recorded the policy; then a command is decided under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_takes_no_command_before_the_policy_is_stored() {
    let Some(run) = NatsRun::start("not-ready", 4) else { return };
    let mut gateway = run.serve("gateway", &["--roles", "projector,gateway"]);
    let base = gateway.address().await;
    let http = reqwest::Client::builder().timeout(STEP).build().expect("an HTTP client");

    // Not ready, and it says what it waits on.
    let deadline = Instant::now() + STEP;
    let waiting = loop {
        let response = http.get(format!("{base}/readyz")).send().await.expect("GET /readyz");
        assert_eq!(response.status().as_u16(), 503, "ready without any policy stored\n{}", gateway.tail());
        let answer: Value = response.json().await.expect("JSON");
        let waits = answer["waiting"]["gateway"].as_str().unwrap_or_default().to_owned();
        if waits.contains("a policy recorded in partition(s) 0-3") {
            break answer;
        }
        assert!(Instant::now() < deadline, "/readyz never named the policy: {answer}\n{}", gateway.tail());
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    let health = http.get(format!("{base}/healthz")).send().await.expect("GET /healthz");
    assert_eq!(health.status().as_u16(), 200, "liveness does not wait for readiness");

    // Commands are refused, one or a batch, and nothing is stored.
    let define = command(DefinePool {
        pool: PoolName::new("net").expect("a pool name"),
        kind: PoolKind::Slots { count: 2 },
        cooldown: None,
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    });
    let json = leasehold_schemas::codec::command_to_json(&define).expect("JSON");
    for (path, body) in [("/v1/commands?wait=true", json.clone()), ("/v1/commands/batch", format!("[{json}]"))] {
        let response = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status().as_u16(), 503, "{path}");
        assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"), "{path}");
        let answer: Value = response.json().await.expect("JSON");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains("does not take commands yet") && error.contains("nothing was stored"), "{error}");
    }
    // The command line asks again within its --timeout, then gives up: refused (exit 1), nothing stored.
    let cli =
        run_cli(run.path(), &["--server", &base, "pool", "define", "net", "--slots", "2", "--timeout", "2s"], &[])
            .await;
    assert_eq!(cli.code, Some(1), "{cli:?}");
    assert!(cli.stderr.contains("the gateway did not take command"), "{cli:?}");
    let log = run.log().await;
    assert_eq!(log.last_command_seq().await.expect("the command log"), 0, "nothing was stored");

    // A worker seeds the policy: the gateway is ready, and the pool is decided under the policy.
    let mut worker = run.serve("worker", &["--roles", "worker", "--claim-cooldown", "2s"]);
    let base = gateway.ready().await;
    define_and_check_cooldown(run.path(), &base, "net", &gateway).await;
    worker.stop_cleanly().await;
    gateway.stop_cleanly().await;
}
