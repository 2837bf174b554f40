//! The audit tool (`leasehold-replay`) on real logs: the demo's (kept with `leasehold demo --keep`), a running
//! server's through its gateway, JetStream's, and export files, two of them tampered with through the export
//! writer (the test-only path: nothing else writes an outcome outside a writer's fence).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use leasehold_log::export::{self, Entry};
use serde_json::Value;

use crate::api::{Api, acquire, agent_name, allocate, wait_agent};
use crate::nats::NatsRun;
use crate::support::{Proc, Ran, run_replay};

/// A whole fold of the demo's log, or a demo run, takes a few seconds; this is far more than enough.
const LONG: Duration = Duration::from_secs(180);

/// The demo's data directory, made once for the tests of this module (`leasehold demo --keep`).
fn demo_data() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = tempfile::tempdir().expect("a temporary directory").keep();
        let data = root.join("demo-data");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-e2e"))
            .args(["demo", "--keep"])
            .arg(&data)
            .env("NO_COLOR", "1")
            .output()
            .expect("run leasehold demo");
        assert!(
            out.status.success(),
            "the demo failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        data
    })
}

async fn replay(dir: &Path, args: &[&str]) -> Ran {
    run_replay(dir, args, LONG).await
}

/// Runs the tool with `--output json`; it must succeed, and print one JSON value.
async fn replay_json(dir: &Path, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["--output", "json"]);
    let ran = replay(dir, &args).await;
    assert_eq!(ran.code, Some(0), "leasehold-replay {args:?} failed: {ran:?}");
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {}", ran.stdout))
}

fn seq(v: &Value) -> u64 {
    v["seq"].as_u64().unwrap_or_else(|| panic!("no seq in {v}"))
}

fn ms(v: &Value) -> u64 {
    let text = v["time"].as_str().unwrap_or_else(|| panic!("no time in {v}"));
    let at = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    at.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

/// The JSON fields of an effect as `history` prints it (`POSITION name {fields}`).
fn effect_fields(effect: &str) -> Value {
    let (_, rest) = effect.split_once(' ').expect("a position");
    let (_, fields) = rest.split_once(' ').unwrap_or((rest, "{}"));
    serde_json::from_str(fields).unwrap_or_else(|e| panic!("{effect}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_log_answers_who_held_what_when_and_why() {
    let data = demo_data();
    let dir = data.parent().expect("a parent").to_path_buf();
    let data_arg = data.to_str().expect("a UTF-8 path");

    // verify: the whole log holds together, every command is decided the same today, the projection is a fold.
    let verified = replay_json(&dir, &["--data", data_arg, "verify"]).await;
    assert_eq!(verified["ok"], true, "{verified:#}");
    let report = &verified["report"];
    let n_outcomes = report["outcomes"].as_u64().expect("a count");
    assert!(n_outcomes > 30, "the demo decides many commands: {report:#}");
    assert_eq!(report["redecided"]["count"].as_u64(), Some(n_outcomes), "every outcome re-decided: {report:#}");
    assert_eq!(report["folded_only_commands_gone"]["count"], 0);
    let projection = &report["projection"];
    assert_eq!(projection["differing"], Value::Array(vec![]), "{report:#}");
    assert!(projection["tables"].as_u64().unwrap_or(0) > 5, "{report:#}");
    assert_eq!(projection["applied"].as_u64(), Some(report["redecided"]["last"].as_u64().unwrap_or(0)));

    // why: the /30's two addresses; one was held by the released container, then by the third.
    let mut reused = None;
    for ip in ["10.0.0.1", "10.0.0.2"] {
        let answer = replay_json(&dir, &["--data", data_arg, "why", "--ip", ip]).await;
        let holdings = answer["holdings"].as_array().expect("holdings").clone();
        assert!(!holdings.is_empty(), "{ip} was handed out: {answer:#}");
        if holdings.len() == 2 {
            reused = Some((ip, holdings));
        }
    }
    let (ip, holdings) = reused.expect("one address was handed out twice");
    let (first, second) = (&holdings[0], &holdings[1]);
    assert_eq!(first["allocated"]["command"], "op.allocate", "{first:#}");
    assert_eq!(first["releasing"]["issuer"], "op:ci-scheduler", "who released it: {first:#}");
    assert!(first["releasing"]["detail"].as_str().unwrap_or("").contains("job done"), "why: {first:#}");
    assert!(first["ended"]["detail"].as_str().unwrap_or("").contains("destroyed"), "{first:#}");
    assert_eq!(first["freed"]["command"], "sys.free", "{first:#}");
    assert!(seq(&first["granted"]) < seq(&first["bound"]), "{first:#}");
    assert!(seq(&first["releasing"]) < seq(&first["ended"]), "{first:#}");
    assert!(seq(&first["ended"]) <= seq(&first["let_go"]), "let go only once destroyed: {first:#}");
    assert!(seq(&first["let_go"]) < seq(&first["freed"]), "{first:#}");
    assert!(seq(&first["freed"]) < seq(&second["granted"]), "handed out again only after the free: {holdings:#?}");
    assert!(ms(&second["granted"]) - ms(&first["freed"]) >= 2_000, "the 2 s cool-down passed: {holdings:#?}");
    assert!(second["freed"].is_null(), "the third container still holds it: {second:#}");
    assert_ne!(first["holder"], second["holder"]);

    // why --at: inside the first holding, the first holder; between the free and the next grant, nobody.
    let at = seq(&first["bound"]).to_string();
    let answer = replay_json(&dir, &["--data", data_arg, "why", "--ip", ip, "--at", &at]).await;
    let held = answer["holdings"].as_array().expect("holdings");
    assert_eq!(held.len(), 1, "{answer:#}");
    assert_eq!(held[0]["holder"], first["holder"]);
    let at = seq(&first["freed"]).to_string();
    let answer = replay_json(&dir, &["--data", data_arg, "why", "--ip", ip, "--at", &at]).await;
    assert_eq!(answer["holdings"], Value::Array(vec![]), "free at the moment it was freed: {answer:#}");
    assert_eq!(answer["before"]["holder"], first["holder"], "{answer:#}");

    // history: the volume the web UI and the CLI released at once.
    let rows = replay_json(&dir, &["--data", data_arg, "history", "agent:w1"]).await;
    let releases: Vec<&Value> = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["command"] == "op.release" && (r["issuer"] == "op:alice" || r["issuer"] == "op:bob"))
        .collect();
    assert_eq!(releases.len(), 2, "two releases on record: {releases:#?}");
    let is_releasing = |r: &Value| {
        r["effects"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e.as_str().unwrap_or("").contains("resource-releasing")))
    };
    assert_eq!(releases.iter().filter(|r| is_releasing(r)).count(), 1, "one release, one no-op: {releases:#?}");
    let releasing_row = releases.iter().find(|r| is_releasing(r)).expect("the release");
    let releasing_effect = releasing_row["effects"]
        .as_array()
        .and_then(|e| e.iter().filter_map(Value::as_str).find(|e| e.contains("resource-releasing")))
        .expect("the effect");
    let volume = effect_fields(releasing_effect)["resource"].as_str().expect("a resource id").to_owned();
    let reference = format!("w1.{volume}");
    let rows = replay_json(&dir, &["--data", data_arg, "history", &reference]).await;
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows[0]["command"], "op.allocate", "{rows:#?}");
    assert!(rows.windows(2).all(|w| seq(&w[0]) < seq(&w[1])), "in log order");
    let issuers: Vec<&str> =
        rows.iter().filter(|r| r["command"] == "op.release").filter_map(|r| r["issuer"].as_str()).collect();
    assert_eq!(issuers.len(), 2, "both releases are in the volume's history, the no-op too: {rows:#?}");
    assert_eq!(rows.last().expect("a row")["state"]["state"], "destroyed", "{rows:#?}");

    // state --at: active just before the release, releasing at it, destroyed at the end.
    let released_at = seq(releasing_row);
    let state_of = |state: &Value| -> String {
        let resources = state["resources"].as_array().expect("resources");
        let found = resources.iter().find(|r| r["id"] == volume.as_str());
        found.map(|r| r["state"].as_str().unwrap_or("").to_owned()).unwrap_or_default()
    };
    let before =
        replay_json(&dir, &["--data", data_arg, "state", "--at", &(released_at - 1).to_string(), "--agent", "w1"])
            .await;
    assert_eq!(state_of(&before), "active", "{before:#}");
    assert!(before["agents"].as_array().is_some_and(|a| a.len() == 1 && a[0]["name"] == "w1"), "{before:#}");
    let at = replay_json(&dir, &["--data", data_arg, "state", "--at", &released_at.to_string()]).await;
    assert_eq!(state_of(&at), "releasing", "{at:#}");
    let end = replay_json(&dir, &["--data", data_arg, "state", "--at", &n_outcomes.to_string()]).await;
    assert_eq!(state_of(&end), "destroyed", "{end:#}");

    // export, import, and the same audit on the copy; a file with one byte flipped is refused.
    let file = dir.join("demo.lhx");
    let file_arg = file.to_str().expect("UTF-8");
    let exported = replay_json(&dir, &["--data", data_arg, "export", file_arg]).await;
    assert_eq!(exported["trailer"]["outcomes"].as_u64(), Some(n_outcomes), "{exported:#}");
    let copy = dir.join("imported");
    replay_json(&dir, &["--data", copy.to_str().expect("UTF-8"), "import", file_arg]).await;
    // The copy has no projection yet: rebuild makes one, and verify compares it with a fresh fold.
    let rebuilt = replay_json(&dir, &["--data", copy.to_str().expect("UTF-8"), "rebuild"]).await;
    assert_eq!(rebuilt["applied"].as_u64(), Some(n_outcomes), "{rebuilt:#}");
    let again = replay_json(&dir, &["--data", copy.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(again["ok"], true, "{again:#}");
    assert_eq!(again["report"]["projection"]["applied"].as_u64(), Some(n_outcomes), "{again:#}");
    assert_eq!(again["report"]["projection"]["differing"], Value::Array(vec![]), "{again:#}");
    // Up to a sequence: the file holds that much, and verifies.
    let half = dir.join("half.lhx");
    let to = (n_outcomes / 2).to_string();
    let cut = replay_json(&dir, &["--data", data_arg, "export", half.to_str().expect("UTF-8"), "--to", &to]).await;
    assert_eq!(cut["trailer"]["last_outcome_seq"].as_u64(), Some(n_outcomes / 2), "{cut:#}");
    let half_verified = replay_json(&dir, &["--file", half.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(half_verified["report"]["outcomes"].as_u64(), Some(n_outcomes / 2), "{half_verified:#}");
    assert_eq!(again["report"]["outcomes"].as_u64(), Some(n_outcomes));
    assert_eq!(again["report"]["commands"], report["commands"]);
    let from_file = replay_json(&dir, &["--file", file_arg, "verify"]).await;
    assert_eq!(from_file["report"]["redecided"], report["redecided"], "{from_file:#}");

    let mut bytes = std::fs::read(&file).expect("the export");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    let flipped = dir.join("flipped.lhx");
    std::fs::write(&flipped, &bytes).expect("write");
    let refused_dir = dir.join("refused");
    let ran =
        replay(&dir, &["--data", refused_dir.to_str().expect("UTF-8"), "import", flipped.to_str().expect("UTF-8")])
            .await;
    assert_eq!(ran.code, Some(2), "a corrupt file is refused: {ran:?}");
    assert!(!refused_dir.exists(), "a refused import leaves nothing behind");
    let truncated = dir.join("truncated.lhx");
    std::fs::write(&truncated, &std::fs::read(&file).expect("the export")[..middle]).expect("write");
    let ran =
        replay(&dir, &["--data", refused_dir.to_str().expect("UTF-8"), "import", truncated.to_str().expect("UTF-8")])
            .await;
    assert_eq!(ran.code, Some(2), "a truncated file is refused: {ran:?}");
    assert!(!refused_dir.exists());
    let ran = replay(&dir, &["--data", copy.to_str().expect("UTF-8"), "import", file_arg]).await;
    assert_eq!(ran.code, Some(2), "an existing data directory is refused: {ran:?}");
}

/// Rewrites the export `from` into `to`, changing the outcome at `target` with `change`, and leaving out the
/// commands `drop_command` picks.
async fn rewrite(
    from: &Path,
    to: &Path,
    target: u64,
    change: impl Fn(&mut leasehold_log::StoredOutcome),
    drop_command: impl Fn(u64) -> bool,
) {
    let input = tokio::fs::File::open(from).await.expect("the export");
    let (reader, header) = export::Reader::open(tokio::io::BufReader::new(input)).await.expect("a readable export");
    let out = tokio::fs::File::create(to).await.expect("a new file");
    let mut writer = export::Writer::new(tokio::io::BufWriter::new(out), &header).await.expect("a writer");
    let mut entries = reader.into_stream();
    while let Some(entry) = entries.next().await {
        let mut entry = entry.expect("an entry");
        if let Entry::Command { record, .. } = &entry
            && drop_command(record.seq)
        {
            continue;
        }
        if let Entry::Outcome(stored) = &mut entry
            && stored.seq == target
        {
            change(stored);
        }
        writer.write(&entry).await.expect("written");
    }
    writer.finish().await.expect("finished");
}

/// Rewrites the export `from` into `to`, changing the outcome at `target` with `change`.
async fn tamper(from: &Path, to: &Path, target: u64, change: impl Fn(&mut leasehold_log::StoredOutcome)) {
    rewrite(from, to, target, change, |_| false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_or_divergent_outcome_fails_verify_at_its_sequence() {
    let data = demo_data();
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let file = dir.join("demo.lhx");
    replay_json(dir, &["--data", data.to_str().expect("UTF-8"), "export", file.to_str().expect("UTF-8")]).await;

    // The target: an accepted allocation in the middle of the log.
    let rows = replay_json(dir, &["--file", file.to_str().expect("UTF-8"), "history", "agent:w2"]).await;
    let target = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["command"] == "op.allocate" && r["outcome"] == "accepted")
        .map(seq)
        .nth(1)
        .expect("w2 allocates several containers");

    // Bytes that do not decode.
    let corrupt = dir.join("corrupt.lhx");
    tamper(&file, &corrupt, target, |stored| {
        let mut bytes = stored.payload.to_vec();
        let n = bytes.len();
        bytes.truncate(n / 2);
        stored.payload = bytes.into();
    })
    .await;
    let ran = replay(dir, &["--file", corrupt.to_str().expect("UTF-8"), "verify", "--output", "json"]).await;
    assert_eq!(ran.code, Some(1), "verify fails: {ran:?}");
    let v: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(v["report"]["failure"]["seq"].as_u64(), Some(target), "{v:#}");
    assert!(v["report"]["failure"]["detail"].as_str().unwrap_or("").contains("does not decode"), "{v:#}");

    // An outcome that decodes and folds, but is not what decide gives: its decision time moved by a second.
    let divergent = dir.join("divergent.lhx");
    tamper(&file, &divergent, target, |stored| {
        let mut outcome = leasehold_schemas::codec::decode_outcome(&stored.payload).expect("an outcome");
        outcome.decided_at = leasehold_schemas::Timestamp(outcome.decided_at.0 + 1_000);
        stored.payload = leasehold_schemas::codec::encode_outcome(&outcome).expect("encodes").into();
    })
    .await;
    let ran = replay(dir, &["--file", divergent.to_str().expect("UTF-8"), "verify", "--output", "json"]).await;
    assert_eq!(ran.code, Some(1), "verify fails: {ran:?}");
    let v: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(v["report"]["failure"]["seq"].as_u64(), Some(target), "{v:#}");
    let detail = v["report"]["failure"]["detail"].as_str().unwrap_or("");
    assert!(detail.contains("differs from what decide gives") && detail.contains("decided_at"), "{v:#}");
    assert_eq!(v["report"]["redecided"]["last"].as_u64().map(|l| l < target), Some(true), "{v:#}");
    // Commands past the command log's retention (left out of the file): their outcomes can only be folded, and
    // the report says which range.
    let aged = dir.join("aged.lhx");
    rewrite(&file, &aged, 0, |_| {}, |seq| seq <= 20).await;
    let v = replay_json(dir, &["--file", aged.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(v["ok"], true, "{v:#}");
    let gone = &v["report"]["folded_only_commands_gone"];
    assert!(gone["count"].as_u64().unwrap_or(0) > 0 && gone["first"] == 1, "{v:#}");
    assert!(v["report"]["redecided"]["first"].as_u64().unwrap_or(0) > 1, "{v:#}");
    // The table output names the sequence too.
    let ran = replay(dir, &["--file", divergent.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(ran.code, Some(1));
    assert!(ran.stdout.contains(&format!("FAILED at outcome {target}")), "{}", ran.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_is_read_through_its_gateway_and_jetstream_directly() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path();
    let agent = format!("w1=dir:{}", dir.join("w1").display());
    let args = ["serve", "--data", "data", "--listen", "127.0.0.1:0", "--partitions", "4", "--agent", &agent];
    let mut serve = Proc::spawn(dir, "serve", &args);
    let base = serve.ready().await;
    let api = Api::new(base.clone());
    wait_agent(&api, "w1", |a| a.status == "live", &[&serve]).await;
    let w1 = agent_name("w1");
    for _ in 0..3 {
        api.accepted(&allocate(&w1, leasehold_schemas::ResourceId::generate()), &[&serve]).await;
    }
    // The data directory is locked by `serve`: the tool says so and points at --server.
    let ran = replay(dir, &["--data", "data", "verify"]).await;
    assert_eq!(ran.code, Some(2), "{ran:?}");
    assert!(ran.stderr.contains("--server"), "{ran:?}");
    let verified = replay_json(dir, &["--server", &base, "verify"]).await;
    assert_eq!(verified["ok"], true, "{verified:#}");
    assert!(verified["report"]["redecided"]["count"].as_u64().unwrap_or(0) >= 3, "{verified:#}");
    let rows = replay_json(dir, &["--server", &base, "history", "agent:w1"]).await;
    assert_eq!(rows.as_array().map(|r| r.iter().filter(|r| r["command"] == "op.allocate").count()), Some(3));
    // A rejected acquire names the resource in its body only (its subject is the lease): it is in the resource's
    // history all the same.
    let unknown = leasehold_schemas::ResourceId::generate();
    let answer = api.decide(&acquire(&w1, unknown, leasehold_schemas::LeaseId::generate()), &[&serve]).await;
    assert_eq!(answer["status"], "rejected", "{answer:#}");
    let reference = format!("w1.{unknown}");
    let rows = replay_json(dir, &["--server", &base, "history", &reference]).await;
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!((rows[0]["command"].as_str(), rows[0]["outcome"].as_str()), (Some("op.acquire"), Some("rejected")));
    // export to a file from the server, and from that file to another: the same log.
    let from_server = dir.join("server.lhx");
    replay_json(dir, &["--server", &base, "export", from_server.to_str().expect("UTF-8")]).await;
    let copied = dir.join("copied.lhx");
    replay_json(dir, &["--file", from_server.to_str().expect("UTF-8"), "export", copied.to_str().expect("UTF-8")])
        .await;
    let a = replay_json(dir, &["--file", copied.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(a["ok"], true, "{a:#}");
    assert!(a["report"]["redecided"]["count"].as_u64().unwrap_or(0) >= 4, "{a:#}");
    // A server killed with its log open: the log is read all the same (a repaired copy when redb says the file
    // needs one), and the original is left as it was.
    serve.kill9();
    let before = std::fs::read(dir.join("data").join("log.redb")).expect("the log file");
    let verified = replay_json(dir, &["--data", "data", "verify"]).await;
    assert!(verified["report"]["redecided"]["count"].as_u64().unwrap_or(0) >= 4, "{verified:#}");
    assert!(verified["report"]["failure"].is_null(), "{verified:#}");
    assert_eq!(std::fs::read(dir.join("data").join("log.redb")).expect("the log file"), before, "read-only");

    let Some(nats) = NatsRun::start("replay", 4) else { return };
    let mut serve = nats.serve("serve", &[]);
    let base = serve.ready().await;
    let mut agent = nats.agent("w1", &[]);
    let api = Api::new(base);
    wait_agent(&api, "w1", |a| a.status == "live", &[&serve, &agent]).await;
    for _ in 0..3 {
        api.accepted(&allocate(&w1, leasehold_schemas::ResourceId::generate()), &[&serve]).await;
    }
    // The agent stops first: its reports would add outcomes between the verify and the export compared with it.
    agent.stop_cleanly().await;
    let url = nats.url.clone();
    let verified = replay_json(nats.path(), &["--nats", &url, "verify"]).await;
    assert_eq!(verified["ok"], true, "{verified:#}");
    assert!(verified["report"]["redecided"]["count"].as_u64().unwrap_or(0) >= 3, "{verified:#}");
    let file = nats.path().join("nats.lhx");
    replay_json(nats.path(), &["--nats", &url, "export", file.to_str().expect("UTF-8")]).await;
    let from_file = replay_json(nats.path(), &["--file", file.to_str().expect("UTF-8"), "verify"]).await;
    assert_eq!(from_file["report"]["outcomes"], verified["report"]["outcomes"]);
    serve.stop_cleanly().await;
}
