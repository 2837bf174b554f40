//! The harness's checks can fail: a run whose first worker is built to break its promise (the test-only fault points
//! of `leasehold-worker`'s `fault-points` feature) must end with exit code 1 and name what broke. One command decided
//! twice is reported as `twice`; one command acknowledged and never decided while later ones were, as `skipped`.
//!
//! Each run is a whole cluster (three nats-server nodes in network namespaces, the servers, the agents) for a few
//! seconds of workload without a nemesis. It needs root (namespaces) and nats-server: without them it says so and
//! passes, except under CI=true, where it fails.

use std::process::Command;

fn can_run() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    let server = Command::new("nats-server").arg("--version").output().is_ok_and(|o| o.status.success());
    if root && server {
        return true;
    }
    let why =
        format!("the chaos self-test needs root (network namespaces) and nats-server (root: {root}, server: {server})");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}; under CI=true it must run");
    eprintln!("skipped: {why}");
    false
}

/// Runs the harness with `--self-test which` and returns its JSON line's violations' kinds.
fn self_test(which: &str) -> Vec<String> {
    // The run fails on purpose, so it would keep its files: they go with this directory.
    let dir = tempfile::tempdir().expect("a directory");
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold-chaos"))
        .args(["--self-test", which, "--minutes", "0.1", "--seed", "5", "--docker", "off", "--settle", "30s"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run leasehold-chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the self-test {which} must fail the run\n{stdout}\n{stderr}");
    let last = stdout.lines().last().expect("a JSON line");
    let report: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(report["self_test"], which, "{last}");
    let acked = report["acked"].as_u64().expect("acked");
    assert!(acked > 50, "the workload ran: {last}");
    report["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .map(|v| v["kind"].as_str().expect("a kind").to_owned())
        .collect()
}

/// Both in one test: two runs at once would each start a cluster and three servers on two cores.
#[test]
fn a_command_decided_twice_or_never_is_reported() {
    if !can_run() {
        return;
    }
    let kinds = self_test("double");
    assert!(kinds.iter().any(|k| k == "twice"), "double: {kinds:?}");
    let kinds = self_test("skip");
    assert!(kinds.iter().any(|k| k == "skipped"), "skip: {kinds:?}");
}
