//! `leasehold publish --file`, end to end: a real `serve` process on an embedded data directory with a dir-driver
//! agent, and the command line (`leasehold-e2e`) publishing a file of 50 allocations (with a comment, a blank line
//! and one line sent twice) through the gateway's batch endpoint. Every command is printed with its command
//! sequence, the line sent twice as a duplicate of the first; the resources appear and turn active. The same file
//! sent again stores nothing (all duplicates, in JSON). A file with a line that does not parse sends nothing, and a
//! command under a used id is refused (exit 1) while the others of its file are published. With `--nats`, the same
//! straight to JetStream.

use std::collections::BTreeMap;

use leasehold_schemas::{Envelope, ResourceId, codec};
use serde_json::Value;

use crate::api::{Api, agent_name, allocate, wait_agent, wait_resource};
use crate::support::{Proc, run_cli};

/// The allocations of the file.
const N_ALLOCATIONS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_commands_is_published_in_batches_each_once() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-publish-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data").display().to_string();
    let agent_spec = format!("w1=dir:{}", dir.path().join("w1").display());
    let args =
        ["serve", "--data", &data, "--listen", "127.0.0.1:0", "--agent", &agent_spec, "--sync-interval", "500ms"];
    let mut serve = Proc::spawn(dir.path(), "serve", &args);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    wait_agent(&api, "w1", |a| a.status == "live", &[&serve]).await;

    let w1 = agent_name("w1");
    let resources: Vec<ResourceId> = (0..N_ALLOCATIONS).map(|_| ResourceId::generate()).collect();
    let envelopes: Vec<Envelope> = resources.iter().map(|r| allocate(&w1, *r)).collect();
    let json = |e: &Envelope| codec::command_to_json(e).expect("the command in JSON");
    let mut file = String::from("# 50 allocations on w1; the first is sent twice\n\n");
    for envelope in &envelopes {
        file.push_str(&json(envelope));
        file.push('\n');
    }
    file.push_str(&json(&envelopes[0]));
    file.push('\n');
    let path = dir.path().join("allocations.ndjson");
    std::fs::write(&path, &file).expect("write the file");
    let path = path.display().to_string();

    let ran = run_cli(dir.path(), &["--server", &server, "publish", "--file", &path], &[]).await;
    assert_eq!(ran.code, Some(0), "publish failed: {ran:?}\n{}", serve.tail());
    let lines: Vec<Vec<&str>> = ran.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), N_ALLOCATIONS + 1, "one line per command: {}", ran.stdout);
    let mut seqs = BTreeMap::new();
    for (line, envelope) in lines.iter().zip(&envelopes) {
        let [id, seq] = line[..] else { panic!("`id seq` expected: {line:?}\n{}", ran.stdout) };
        assert_eq!(id, envelope.command_id.to_string());
        let seq: u64 = seq.parse().unwrap_or_else(|e| panic!("{seq:?} is not a sequence: {e}"));
        assert!(seqs.insert(seq, id).is_none(), "sequence {seq} given twice: {}", ran.stdout);
    }
    let first = &lines[0];
    assert_eq!(lines[N_ALLOCATIONS], vec![first[0], first[1], "duplicate"], "the line sent twice: {}", ran.stdout);
    assert!(ran.stderr.contains("51 command(s): 51 published (1 of them duplicates"), "{}", ran.stderr);

    // The resources appear and their agent makes them.
    for resource in &resources {
        wait_resource(&api, &format!("w1.{resource}"), |r| r.state == "active", &[&serve]).await;
    }
    let reference = format!("w1.{}", resources[7]);
    let got = run_cli(dir.path(), &["--server", &server, "--output", "json", "get", &reference], &[]).await;
    assert_eq!(got.code, Some(0), "{got:?}");
    let view: Value = serde_json::from_str(&got.stdout).expect("a resource in JSON");
    assert_eq!((view["ref"].as_str(), view["state"].as_str()), (Some(&reference[..]), Some("active")), "{view:#}");

    // The same file again: nothing stored twice, every command a duplicate at its first sequence.
    let ran = run_cli(dir.path(), &["--server", &server, "--output", "json", "publish", "--file", &path], &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let again: Vec<Value> = serde_json::from_str(&ran.stdout).expect("a JSON array");
    assert_eq!(again.len(), N_ALLOCATIONS + 1);
    for item in &again {
        assert_eq!((item["status"].as_str(), item["duplicate"].as_bool()), (Some("published"), Some(true)), "{item}");
        let seq = item["command_seq"].as_u64().expect("a sequence");
        assert_eq!(seqs.get(&seq).copied(), item["command_id"].as_str(), "{item}");
    }
    assert_eq!(again[0]["line"], 3, "lines are numbered in the file, comments and blanks counted");

    // A line that does not parse: nothing is sent, and the line is named.
    let fresh = allocate(&w1, ResourceId::generate());
    let bad_file = dir.path().join("bad.ndjson");
    std::fs::write(&bad_file, format!("{}\n{{\"type\": \"op.allocate\"}}\n", json(&fresh))).expect("write");
    let bad_path = bad_file.display().to_string();
    let ran = run_cli(dir.path(), &["--server", &server, "publish", "--file", &bad_path], &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("line 2: ") && ran.stderr.contains("nothing was sent"), "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);

    // Another command under a used id is refused (exit 1, its line named); the fresh command beside it is stored
    // now, for the first time: the bad file above sent nothing.
    let mut conflicting = allocate(&w1, ResourceId::generate());
    conflicting.command_id = envelopes[1].command_id;
    let mixed = dir.path().join("mixed.ndjson");
    std::fs::write(&mixed, format!("{}\n{}\n", json(&fresh), json(&conflicting))).expect("write");
    let mixed = mixed.display().to_string();
    let ran = run_cli(dir.path(), &["--server", &server, "publish", "--file", &mixed], &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    let fresh_line: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(fresh_line.len(), 2, "stored for the first time, not a duplicate: {}", lines[0]);
    assert_eq!(fresh_line[0], fresh.command_id.to_string());
    assert!(lines[1].contains("refused 409 (line 2)") && lines[1].contains("names another command"), "{}", lines[1]);
    assert!(ran.stderr.contains("refused, on line(s) 2"), "{}", ran.stderr);
    // The refused command made nothing: had it been stored, it would be decided after the fresh one (the same
    // agent's partition, in order), which the agent has made by now.
    wait_resource(&api, &format!("w1.{}", resource_of(&fresh)), |r| r.state == "active", &[&serve]).await;
    assert!(api.resource(&format!("w1.{}", resource_of(&conflicting))).await.is_none(), "the refused command made it");

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}

/// The resource of an allocation.
fn resource_of(envelope: &Envelope) -> ResourceId {
    match &envelope.body {
        leasehold_schemas::Command::Allocate(allocate) => allocate.resource,
        other => panic!("not an allocation: {other:?}"),
    }
}

/// `--nats`: the same file straight to JetStream (one atomic batch), no gateway between. Each command is stored once
/// (the line sent twice and the file sent again are duplicates at the first sequence), and another command under a
/// used id is refused. Without `nats-server` on `PATH` it prints a notice and passes, except in CI (`CI=true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_commands_goes_straight_to_jetstream_each_once() {
    let Some(run) = crate::nats::NatsRun::start("publish", 4) else { return };
    let mut serve = run.serve("serve", &[]);
    serve.ready().await;
    let w1 = agent_name("w1");
    let envelopes: Vec<Envelope> = (0..20).map(|_| allocate(&w1, ResourceId::generate())).collect();
    let json = |e: &Envelope| codec::command_to_json(e).expect("the command in JSON");
    let mut file: String = envelopes.iter().map(|e| json(e) + "\n").collect();
    file.push_str(&json(&envelopes[3]));
    let path = run.path().join("allocations.ndjson");
    std::fs::write(&path, &file).expect("write the file");
    let path = path.display().to_string();
    let publish = ["--output", "json", "publish", "--file", &path, "--nats", &run.url];

    let ran = run_cli(run.path(), &publish, &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}\n{}", serve.tail());
    let first: Vec<Value> = serde_json::from_str(&ran.stdout).expect("a JSON array");
    assert_eq!(first.len(), 21);
    for (item, envelope) in first.iter().zip(&envelopes) {
        assert_eq!(item["command_id"], envelope.command_id.to_string(), "{item}");
        assert_eq!((item["status"].as_str(), item["duplicate"].as_bool()), (Some("published"), Some(false)), "{item}");
    }
    assert_eq!(first[20]["duplicate"], true, "{}", first[20]);
    assert_eq!(first[20]["command_seq"], first[3]["command_seq"], "the repeat names the first copy");

    let ran = run_cli(run.path(), &publish, &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let again: Vec<Value> = serde_json::from_str(&ran.stdout).expect("a JSON array");
    for (item, was) in again.iter().zip(&first) {
        assert_eq!(
            (item["command_seq"].as_u64(), item["duplicate"].as_bool()),
            (was["command_seq"].as_u64(), Some(true))
        );
    }

    // Stored once each: the command log holds each id of the file at one sequence.
    let log = run.log().await;
    let mut stored: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for seq in 1..=leasehold_log::Log::last_command_seq(&log).await.expect("the last sequence") {
        let Some(record) = leasehold_log::Log::command_at(&log, seq).await.expect("read the command log") else {
            continue;
        };
        let envelope = codec::decode_command(&record.payload).expect("a command");
        stored.entry(envelope.command_id.to_string()).or_default().push(seq);
    }
    for (item, envelope) in first.iter().zip(&envelopes) {
        let seq = item["command_seq"].as_u64().expect("a sequence");
        assert_eq!(stored.get(&envelope.command_id.to_string()), Some(&vec![seq]), "{item}");
    }

    let mut conflicting = allocate(&w1, ResourceId::generate());
    conflicting.command_id = envelopes[5].command_id;
    let bad = run.path().join("conflicting.ndjson");
    std::fs::write(&bad, json(&conflicting) + "\n").expect("write");
    let bad = bad.display().to_string();
    let ran = run_cli(run.path(), &["publish", "--file", &bad, "--nats", &run.url], &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stdout.contains("refused 409 (line 1)") && ran.stdout.contains("names another command"), "{ran:?}");

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}
