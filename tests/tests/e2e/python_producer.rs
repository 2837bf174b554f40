//! A producer written in Python from the documentation alone (`tests/python/producer.py`, nats-py and the standard
//! library): it publishes JSON commands straight to JetStream and reads their outcomes from the gateway's
//! `/v1/events`, against a real `leasehold serve` over a real nats-server with an agent (`w1`, dir driver) in the
//! process. It allocates a resource, acquires a lease on it, learns the lease token from the grant, releases the
//! lease with it and releases the resource; the test then checks through the gateway that the resource it made
//! exists and is `releasing` or `destroyed`, and that the lease is `released`, with the token the producer learned.
//!
//! Without `python3` or its `nats` module (nats-py), the test says so and returns, unless `CI=true`, where that is a
//! failure (`.ci/test` installs nats-py).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::Effect;
use leasehold_schemas::codec;
use leasehold_schemas::ids::Position;
use serde_json::Value;
use tokio::time::Instant;

use crate::support::Proc;

const AGENT: &str = "w1";
/// How long any one wait may take before the test fails.
const STEP: Duration = Duration::from_secs(30);

/// `GET path` on `address` (HTTP/1.0: one request, the body up to the close); answers the status and the body as
/// JSON.
fn get(address: &str, path: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(address).unwrap_or_else(|e| panic!("connect to {address}: {e}"));
    stream.set_read_timeout(Some(STEP)).expect("a read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\nAccept: application/json\r\n\r\n").expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let answer = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("GET {path}: no header end: {answer}"));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {status} not JSON ({e}): {body}"));
    (status, body)
}

/// Polls `GET path` until `done` holds for a 200 answer, for up to [`STEP`].
async fn wait_for(serve: &mut Proc, address: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let (status, body) = get(address, path);
        if status == 200 && done(&body) {
            return body;
        }
        serve.assert_running_while(path);
        assert!(Instant::now() < deadline, "GET {path}: still {status} {body} after {STEP:?}\n{}", serve.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `python3` with the `nats` module (nats-py) is here; outside CI a notice when not, under `CI=true` a
/// failure.
fn python_with_nats() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import nats, nats.js"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("python3 with nats-py is missing, and CI=true: install it (pip install nats-py, as .ci/test does)");
        }
        eprintln!("notice: python3 with the nats module (nats-py) is not here: the Python producer test is skipped");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_producer_publishes_json_to_jetstream_and_reads_its_outcomes_from_the_events() {
    if !python_with_nats() {
        return;
    }
    let Some(server) = NatsServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("lh-e2e-py-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let agent_dir = dir.path().join(AGENT);
    let agent = format!("{AGENT}=dir:{}", agent_dir.to_str().expect("a UTF-8 path"));
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--nats",
        server.url(),
        "--partitions",
        "4",
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--agent",
        &agent,
        "--sync-interval",
        "1s",
        "--name",
        "e2e-py",
    ];
    let mut serve = Proc::spawn(dir.path(), "serve", &args);
    let gateway = serve.ready().await;
    let address = gateway.strip_prefix("http://").expect("an http:// address").to_owned();
    // The agent runs already: the producer registers nothing.
    wait_for(&mut serve, &address, "/v1/agents", |agents| {
        agents.as_array().is_some_and(|all| all.iter().any(|a| a["name"] == AGENT && a["status"] == "live"))
    })
    .await;

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/producer.py");
    let started = Instant::now();
    let run = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["--nats", server.url(), "--gateway", &gateway, "--agent", AGENT, "--timeout", "60"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .unwrap_or_else(|_| panic!("producer.py did not end in 90 s\n{}", serve.output()))
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "producer.py exited {}\nstdout:\n{stdout}\nstderr:\n{stderr}\nleasehold serve:\n{}",
        output.status,
        serve.output()
    );
    let line = stdout.lines().rfind(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON line: {stdout}"));
    let learned: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    eprintln!("producer.py learned in {:.1} s: {learned}", started.elapsed().as_secs_f64());

    let resource = learned["resource"].as_str().expect("the resource it made");
    let lease = learned["lease"].as_str().expect("the lease it held");
    let token = learned["token"].as_u64().expect("the lease token");
    assert!(resource.starts_with(&format!("{AGENT}.")), "{resource}");
    assert!(lease.starts_with(&format!("{AGENT}.")), "{lease}");
    assert!(token > 0, "a token is a position: {token}");

    // Every command it published was decided as it said: the gateway knows each, accepted.
    for step in ["allocate", "acquire", "release_lease", "release"] {
        let id = learned[step]["command_id"].as_str().unwrap_or_else(|| panic!("{step}: no command id: {learned}"));
        let (status, answer) = get(&address, &format!("/v1/commands/{id}"));
        assert_eq!(status, 200, "{step}: {answer}");
        assert_eq!(answer["status"], "accepted", "{step}: {answer}");
        assert_eq!(answer["outcomes"][0]["seq"], learned[step]["outcome_seq"], "{step}: {answer}");
    }

    // The resource exists, made by the producer, and it is on its way out or gone.
    let (status, view) = get(&address, &format!("/v1/resources/{resource}"));
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["agent"], AGENT);
    assert_eq!(view["kind"], "container");
    assert_eq!(view["attrs"]["made-by"], "producer.py", "{view}");
    let state = view["state"].as_str().expect("a state");
    assert!(state == "releasing" || state == "destroyed", "the resource is {state}: {view}");
    assert_eq!(view["leases"], serde_json::json!([]), "no live lease: {view}");

    // The lease was granted with the token the producer learned, then released by it.
    let (status, held) = get(&address, &format!("/v1/leases/{lease}"));
    assert_eq!(status, 200, "{held}");
    assert_eq!(held["state"], "released", "{held}");
    assert_eq!(held["resource"], resource);
    assert_eq!(held["holder"], "py-producer");
    // The token is the position of the `lease-granted` effect in the outcome the producer read it from (the outcome
    // log itself, read here in Rust).
    let log = JetStream::connect(JetStreamConfig::new(server.url(), 4)).await.expect("connect to JetStream");
    let granted_seq = learned["granted_seq"].as_u64().expect("the outcome sequence of the grant");
    let stored = log.read_outcomes(&OutcomeFilter::All, granted_seq, 1).await.expect("read the outcome log");
    assert_eq!(stored.first().map(|s| s.seq), Some(granted_seq), "no outcome at {granted_seq}");
    let outcome = codec::decode_outcome(&stored[0].payload).expect("an outcome decodes");
    let lease_id = lease.split_once('.').expect("<agent>.<id>").1;
    let position = outcome
        .positioned_effects()
        .find_map(|(at, effect)| match effect {
            Effect::LeaseGranted { lease, .. } if lease.to_string() == lease_id => Some(at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no lease-granted of {lease} at {granted_seq}: {outcome:?}"));
    assert_eq!(position, Position(token), "the token is the position of the grant");
    if learned["waited"] == true {
        assert_ne!(
            outcome.command.id.to_string(),
            learned["acquire"]["command_id"],
            "a waiting lease is granted later"
        );
    }

    // A producer whose commands are rejected says so and exits non-zero: an agent that never registered.
    let refused = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["--nats", server.url(), "--gateway", &gateway, "--agent", "nobody", "--timeout", "30"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let refused = tokio::time::timeout(Duration::from_secs(60), refused)
        .await
        .unwrap_or_else(|_| panic!("producer.py did not end in 60 s\n{}", serve.output()))
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(refused.stdout.is_empty(), "nothing learned: {}", String::from_utf8_lossy(&refused.stdout));
    for says in ["op.allocate", "was rejected", "unknown", "agent nobody"] {
        assert!(stderr.contains(says), "producer.py's failure does not say {says:?}:\n{stderr}");
    }

    // The agent destroys it: the resource ends `destroyed`.
    let path = format!("/v1/resources/{resource}");
    let gone = wait_for(&mut serve, &address, &path, |view| view["state"] == "destroyed").await;
    assert!(gone["terminal_at"].is_u64(), "{gone}");
    serve.assert_running_while("at the end");
}
