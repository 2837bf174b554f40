//! A stop always stops (issue 16, item 12): with its nats-server killed, `serve` used to ignore SIGTERM and SIGINT
//! for minutes, each writer waiting on giving its partition back while the client reconnected. Now `serve` and
//! `agent run` exit within `--shutdown-grace` of the first signal whatever the log does, saying on stderr what they
//! could not finish, and a second signal exits at once.

use std::time::Duration;

use leasehold_log::nats_server::NatsServer;
use tokio::time::Instant;

use crate::api::{Api, POLL, STEP, wait_agent};
use crate::support::Proc;

/// What a process may take past its grace to exit (a debug build on a busy machine).
const MARGIN: Duration = Duration::from_secs(5);

/// `serve --nats` with all its roles, ready, on a server of its own, with `extra` arguments.
async fn serve_on(server: &NatsServer, dir: &std::path::Path, extra: &[&str]) -> Proc {
    let data = dir.join("data").display().to_string();
    let mut args =
        vec!["serve", "--nats", server.url(), "--partitions", "4", "--listen", "127.0.0.1:0", "--data", &data];
    args.extend(extra);
    let mut serve = Proc::spawn(dir, "serve", &args);
    serve.ready().await;
    serve
}

/// The nats-server is killed (-9, by its pid); SIGTERM: `serve` exits within its grace, status 1, saying which
/// partitions it had not given back and why that is safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stops_within_its_grace_when_its_nats_server_is_gone() {
    let Some(server) = NatsServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("lh-e2e-stop-").tempdir().expect("a temporary directory");
    let grace = Duration::from_secs(2);
    let mut serve = serve_on(&server, dir.path(), &["--shutdown-grace", "2s"]).await;
    drop(server);
    serve.signal_term();
    let (status, took) = serve.wait_exit(grace + MARGIN).await;
    assert!(
        took >= grace,
        "it gave up before its grace ({took:?}): the stop could not have finished\n{}",
        serve.tail()
    );
    assert_eq!(status.code(), Some(1), "a stop cut short exits 1\n{}", serve.tail());
    let log = serve.log();
    assert!(log.contains("the stop did not finish within --shutdown-grace 2s; exiting (status 1)"), "{log}");
    assert!(log.contains("worker: partition(s) 0-3 not given back"), "it names the partitions it holds: {log}");
    assert!(log.contains("This is safe: the fence refuses any append of a writer that is gone"), "{log}");
}

/// A second signal exits at once (status 130), whatever the first stop is waiting on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let Some(server) = NatsServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("lh-e2e-stop-twice-").tempdir().expect("a temporary directory");
    // The first stop could take a minute: the second signal does not wait for it.
    let mut serve = serve_on(&server, dir.path(), &["--shutdown-grace", "60s"]).await;
    drop(server);
    serve.signal_term();
    let deadline = Instant::now() + STEP;
    while !serve.log().contains("leasehold serve: stopping within 1m") {
        serve.assert_running();
        assert!(Instant::now() < deadline, "the first signal was not taken\n{}", serve.tail());
        tokio::time::sleep(POLL).await;
    }
    serve.signal_term();
    let (status, _) = serve.wait_exit(MARGIN).await;
    assert_eq!(status.code(), Some(130), "{}", serve.tail());
    let log = serve.log();
    assert!(log.contains("a second signal: exiting now (status 130) without finishing:"), "{log}");
    assert!(log.contains("worker: partition(s)"), "it says what it had not finished: {log}");
}

/// `agent run` whose nats-server is killed stops within its grace too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_run_stops_within_its_grace_when_its_nats_server_is_gone() {
    let Some(server) = NatsServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("lh-e2e-stop-agent-").tempdir().expect("a temporary directory");
    let mut serve = serve_on(&server, dir.path(), &[]).await;
    let api = Api::new(serve.address().await);
    let driver = format!("dir:{}", dir.path().join("w1").display());
    let args = [
        "agent",
        "run",
        "--name",
        "w1",
        "--driver",
        &driver,
        "--nats",
        server.url(),
        "--sync-interval",
        "300ms",
        "--shutdown-grace",
        "2s",
    ];
    let mut agent = Proc::spawn(dir.path(), "w1", &args);
    wait_agent(&api, "w1", |a| a.status == "live", &[&serve, &agent]).await;
    drop(server);
    serve.kill9();
    agent.signal_term();
    let (status, _) = agent.wait_exit(Duration::from_secs(2) + MARGIN).await;
    // Either it finished its stop (0) or it was cut short (1) and said what it had not finished.
    match status.code() {
        Some(0) => assert!(agent.stdout().contains("agent w1: stopped"), "{}", agent.tail()),
        Some(1) => assert!(agent.log().contains("without finishing:\n  - agent w1: "), "{}", agent.tail()),
        other => panic!("agent run exited with {other:?}\n{}", agent.tail()),
    }
}
