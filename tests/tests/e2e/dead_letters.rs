//! Garbage, truncated, trailing-byte, oversized, subject-mismatched, unknown-version and empty payloads on command
//! subjects, through the real `leasehold serve` (DESIGN section 12): each lands in the dead letters (`LH_DLQ`) with
//! its source sequence, its source subject, its raw bytes and a reason naming what was wrong; the good commands
//! around them are decided; the process keeps serving and stops cleanly; nothing panics.
//!
//! - On JetStream (one `nats-server` whose `max_payload` is 2 MiB, so a command over the codec's 1 MiB limit can be
//!   published): the worker process runs while the test publishes, and a good command published after every bad
//!   one has been dead-lettered is decided.
//! - On the embedded log: the process holds the data directory's lock while it runs, so the test publishes first,
//!   then runs `serve --roles worker,projector` on the directory until its log says the last command (a bad one,
//!   after a last good one, all in one partition, so decided in that order) was dead-lettered, stops it with
//!   SIGTERM (it exits 0) and opens the directory to check.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use leasehold_log::embedded::Embedded;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsServer, ServerOptions};
use leasehold_log::{Log, OutcomeFilter, conformance};
use leasehold_schemas::command::{Allocate, Heartbeat, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Position, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of};
use leasehold_schemas::{Envelope, Key, Uuid, codec};
use tokio::time::Instant;

use crate::support::Proc;

const PARTITIONS: u32 = 4;
/// The agent whose subject the bad payloads are published on.
const TARGET: &str = "w1";
/// How long any one step may take before the test fails.
const STEP: Duration = Duration::from_secs(30);

/// One payload to publish on a command subject.
#[derive(Debug, Clone)]
enum Item {
    Good(Envelope),
    Bad(Bad),
}

#[derive(Debug, Clone)]
struct Bad {
    /// What the dead letter's reason must say (each of them).
    says: Vec<String>,
    /// The ingress subject it is published on.
    subject: String,
    payload: Vec<u8>,
}

impl Item {
    fn subject(&self) -> String {
        match self {
            Item::Good(envelope) => ingress_subject_of(&envelope.body),
            Item::Bad(bad) => bad.subject.clone(),
        }
    }
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("the clock is after 1970");
    u64::try_from(since.as_millis()).expect("milliseconds fit")
}

/// Agent names in the partition of `TARGET`: so every command of a test is decided in the order published.
fn names_beside_target(n: usize) -> Vec<String> {
    let home = partition_of(TARGET, PARTITIONS);
    (0..).map(|i| format!("dl{i}")).filter(|name| partition_of(name, PARTITIONS) == home).take(n).collect()
}

/// A registration of `agent`: a good command, accepted when decided.
fn register(agent: &str, n: u8) -> Envelope {
    let agent = AgentName::new(agent).expect("an agent name");
    let body = Register {
        settings: Some(AgentSettings::default()),
        ..Register::new(agent.clone(), Uuid::from_u128(0x0001_ea5e_0000 + u128::from(n)))
    };
    let at = now_ms();
    Envelope::new(
        CommandId::from_parts(at, [n; 10]),
        Issuer::new(agent.as_str()).expect("an issuer"),
        Timestamp(at),
        body,
    )
}

fn bad(says: &[&str], subject: &str, payload: Vec<u8>) -> Item {
    Item::Bad(Bad { says: says.iter().map(|s| (*s).to_owned()).collect(), subject: subject.to_owned(), payload })
}

/// Every kind of bad payload, each after a good command: garbage (two kinds), a truncated command, one with a
/// trailing byte, one over 1 MiB, one of an unknown schema version, one on another agent's subject, and an empty
/// one.
fn payloads() -> Vec<Item> {
    let names = names_beside_target(9);
    let target = format!("lh.in.agent.{TARGET}._");
    // A valid command of the target agent, and the bad ones made from it.
    let valid = codec::encode_command(&register(TARGET, 200)).expect("encode");
    assert_eq!(valid[1], 1, "the schema version is the second byte");
    let mut newer = valid.clone();
    newer[1] = 99;
    let mut trailing = valid.clone();
    trailing.push(0);
    let mut oversized = valid.clone();
    oversized.resize(codec::MAX_COMMAND_BYTES + 1, 0);
    let heartbeat = Envelope::new(
        CommandId::from_parts(now_ms(), [201; 10]),
        Issuer::new(TARGET).expect("an issuer"),
        Timestamp(now_ms()),
        Heartbeat { agent: AgentName::new(TARGET).expect("an agent name"), epoch: Position(1) },
    );
    let elsewhere = format!("lh.in.agent.{}._", names[8]);
    let bad_ones = vec![
        bad(&["undecodable"], &target, b"\x01\xff\xff\xff\xff\xff".to_vec()),
        bad(&["unknown format"], &target, b"garbage".to_vec()),
        bad(&["undecodable"], &target, valid[..valid.len() / 2].to_vec()),
        bad(&["trailing bytes"], &target, trailing),
        bad(&["oversized", &(codec::MAX_COMMAND_BYTES + 1).to_string()], &target, oversized),
        bad(&["newer leasehold", "schema version 99"], &target, newer),
        bad(&["does not fit", &target], &elsewhere, codec::encode_command(&heartbeat).expect("encode")),
        bad(&["empty"], &target, Vec::new()),
    ];
    let mut items = Vec::new();
    for (i, bad) in bad_ones.into_iter().enumerate() {
        items.push(Item::Good(register(&names[i], i as u8)));
        items.push(bad);
    }
    items
}

/// Publishes `items` in order; returns each with its command log sequence.
async fn publish_all<L: Log>(log: &L, items: Vec<Item>, published: &mut Vec<(u64, Item)>) {
    for item in items {
        let (msg_id, payload) = match &item {
            Item::Good(envelope) => {
                (envelope.command_id.to_string(), codec::encode_command(envelope).expect("encode a good command"))
            }
            Item::Bad(bad) => (format!("bad-{}", published.len()), bad.payload.clone()),
        };
        let answer =
            log.publish_command(&item.subject(), &msg_id, Bytes::from(payload)).await.expect("publish a payload");
        assert!(!answer.duplicate, "{item:?} is not a duplicate");
        published.push((answer.seq, item));
    }
}

/// Whether every good command has an outcome and every bad one a dead letter.
async fn all_handled<L: Log>(log: &L, published: &[(u64, Item)]) -> bool {
    let goods = published.iter().filter(|(_, i)| matches!(i, Item::Good(_))).count();
    let bads = published.len() - goods;
    let Ok(letters) = log.read_dead_letters(1, 1000).await else { return false };
    let outcomes = conformance::all_outcomes(log, &OutcomeFilter::All, 1).await;
    let outcomes = outcomes.iter().filter(|stored| !crate::support::seeded_by_serve(stored)).count();
    letters.len() >= bads && outcomes >= goods
}

/// Every bad payload is a dead letter with its source sequence, subject, raw bytes and a reason that names what
/// was wrong, once; every good command has exactly one outcome, accepted; nothing bad was decided.
async fn check<L: Log>(log: &L, published: &[(u64, Item)], backend: &str) {
    let letters = log.read_dead_letters(1, 1000).await.expect("read the dead letters");
    let mut by_source: BTreeMap<u64, _> = BTreeMap::new();
    for (seq, letter) in letters {
        let source = letter.source_seq;
        assert!(by_source.insert(source, (seq, letter)).is_none(), "{backend}: command {source} dead-lettered twice");
    }
    let outcomes = conformance::all_outcomes(log, &OutcomeFilter::All, 1).await;
    let mut decided: BTreeMap<String, Vec<leasehold_schemas::Outcome>> = BTreeMap::new();
    for stored in outcomes.iter().filter(|stored| !crate::support::seeded_by_serve(stored)) {
        let outcome = codec::decode_outcome(&stored.payload).expect("an outcome decodes");
        assert_eq!(stored.cmd_seq, outcome.cmd_seq);
        assert_ne!(
            outcome.command.key,
            Key::Agent(AgentName::new(TARGET).expect("an agent name")),
            "{backend}: a bad payload was decided: {outcome:?}"
        );
        decided.entry(stored.cmd_id.clone()).or_default().push(outcome);
    }
    for (seq, item) in published {
        let tail = item.subject().strip_prefix("lh.in.").expect("an ingress subject").to_owned();
        let partition = partition_of(tail.split('.').nth(1).expect("a key"), PARTITIONS);
        match item {
            Item::Good(envelope) => {
                let answers = decided.remove(&envelope.command_id.to_string()).unwrap_or_default();
                assert_eq!(answers.len(), 1, "{backend}: good command {seq} has {} outcomes", answers.len());
                let outcome = &answers[0];
                assert_eq!(outcome.cmd_seq, *seq);
                assert!(outcome.rejection().is_none(), "{backend}: good command {seq} was rejected: {outcome:?}");
                assert!(!by_source.contains_key(seq), "{backend}: good command {seq} was dead-lettered");
            }
            Item::Bad(bad) => {
                let (_, letter) = by_source
                    .remove(seq)
                    .unwrap_or_else(|| panic!("{backend}: bad payload {seq} ({:?}) is not a dead letter", bad.says));
                assert_eq!(letter.partition, partition, "{backend}: dead letter of {seq}");
                assert_eq!(letter.source_subject, format!("lh.cmd.{partition}.{tail}"), "{backend}: {seq}");
                assert_eq!(letter.subject(), format!("lh.dlq.{partition}.{tail}"), "{backend}: {seq}");
                assert!(
                    letter.payload.as_ref() == bad.payload.as_slice(),
                    "{backend}: the raw bytes of {seq} are kept"
                );
                for says in &bad.says {
                    assert!(
                        letter.reason.contains(says.as_str()),
                        "{backend}: the reason for {seq} does not say {says:?}: {}",
                        letter.reason
                    );
                }
            }
        }
    }
    assert!(by_source.is_empty(), "{backend}: dead letters of nothing published: {by_source:?}");
    assert!(decided.is_empty(), "{backend}: outcomes of nothing published: {:?}", decided.keys());
}

/// `leasehold serve --listen 127.0.0.1:0 ARGS`, run in `dir`.
fn spawn_serve(dir: &Path, args: &[&str]) -> Proc {
    let args: Vec<&str> = ["serve", "--listen", "127.0.0.1:0"].iter().chain(args).copied().collect();
    Proc::spawn(dir, "serve", &args)
}

/// SIGTERM; it stops cleanly: exit 0, its last word, no panic, no partition stopped.
async fn stop_cleanly(serve: &mut Proc, backend: &str) {
    serve.stop_cleanly().await;
    let output = serve.output();
    assert!(!output.contains("panicked"), "{backend}: something panicked\n{output}");
    assert!(!output.contains(" stopped: "), "{backend}: a partition or role stopped\n{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_payloads_are_dead_lettered_by_a_running_worker_on_jetstream() {
    let started = Instant::now();
    let Some(server) =
        NatsServer::start_with(ServerOptions { max_payload: Some(2 * 1024 * 1024), ..Default::default() })
    else {
        return;
    };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    let dir = tempfile::Builder::new().prefix("lh-e2e-dlq-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let partitions = PARTITIONS.to_string();
    let args = [
        "--roles",
        "worker",
        "--nats",
        server.url(),
        "--partitions",
        &partitions,
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--name",
        "e2e-dlq",
    ];
    let mut serve = spawn_serve(dir.path(), &args);

    // Bad payloads, each after a good command, while the worker runs.
    let mut published = Vec::new();
    publish_all(&log, payloads(), &mut published).await;
    let deadline = Instant::now() + STEP;
    while !all_handled(&log, &published).await {
        serve.assert_running_while("jetstream");
        assert!(Instant::now() < deadline, "jetstream: not every payload was handled in {STEP:?}\n{}", serve.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // After all the bad ones, the worker still serves: a good command is decided.
    let names = names_beside_target(10);
    publish_all(&log, vec![Item::Good(register(&names[9], 100))], &mut published).await;
    let deadline = Instant::now() + STEP;
    while !all_handled(&log, &published).await {
        serve.assert_running_while("jetstream");
        assert!(Instant::now() < deadline, "jetstream: the last good command was not decided\n{}", serve.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve.assert_running_while("jetstream");
    check(&log, &published, "jetstream").await;
    stop_cleanly(&mut serve, "jetstream").await;
    eprintln!("jetstream: {} payloads handled in {:.1} s", published.len(), started.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_payloads_are_dead_lettered_by_a_running_worker_on_the_embedded_log() {
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("lh-e2e-dlq-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    // The process holds the log's lock while it runs: publish everything first. The last good command comes after
    // every bad payload but the marker, a last bad one; all are in one partition, so decided in this order.
    let names = names_beside_target(10);
    let mut items = payloads();
    items.push(Item::Good(register(&names[9], 100)));
    items.push(bad(&["unknown format"], &format!("lh.in.agent.{TARGET}._"), b"\x02marker".to_vec()));
    let mut published = Vec::new();
    {
        let log = Embedded::open(&data, PARTITIONS).expect("create the embedded log");
        publish_all(&log, items, &mut published).await;
    }
    let marker = published.last().expect("published").0;

    let partitions = PARTITIONS.to_string();
    let args = [
        "--roles",
        "worker,projector",
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--partitions",
        &partitions,
        "--name",
        "e2e-dlq",
    ];
    let mut serve = spawn_serve(dir.path(), &args);
    let deadline = Instant::now() + STEP;
    let marker_line = format!("seq={marker} ");
    while !serve.log().lines().any(|line| line.contains("command dead-lettered") && line.contains(&marker_line)) {
        serve.assert_running_while("embedded");
        assert!(
            Instant::now() < deadline,
            "embedded: the marker {marker} was not dead-lettered in {STEP:?}\n{}",
            serve.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serve.assert_running_while("embedded");
    stop_cleanly(&mut serve, "embedded").await;

    let log = Embedded::open(&data, PARTITIONS).expect("open the embedded log after the process stopped");
    assert!(all_handled(&log, &published).await, "embedded: not every payload was handled\n{}", serve.output());
    check(&log, &published, "embedded").await;
    eprintln!("embedded: {} payloads handled in {:.1} s", published.len(), started.elapsed().as_secs_f64());
}

/// A garbage command just under the server's `max_payload` fits in `LH_CMD`, but its dead letter (the same bytes
/// plus the reason and source headers) does not fit in `LH_DLQ`: the worker stores the letter without the bytes (the
/// reason says where they are) instead of stopping the partition, and the next command is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_too_large_for_the_dead_letters_is_kept_without_its_bytes() {
    let Some(server) = NatsServer::start() else { return };
    let config = JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(server.url(), 1)
    };
    let log = JetStream::connect(config).await.expect("connect");
    let max = log.client().server_info().max_payload;
    let garbage = log.publish_command("lh.in.op.w1._", "junk", Bytes::from(vec![0xff; max - 48])).await.expect("fits");
    let good = register("w1", 1);
    log.publish_command(
        &ingress_subject_of(&good.body),
        &good.command_id.to_string(),
        codec::encode_command(&good).expect("encodes").into(),
    )
    .await
    .expect("publish");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let config = leasehold_worker::WorkerConfig::new("worker");
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.read_outcomes(&OutcomeFilter::All, 1, 10).await.expect("read").is_empty() {
        assert!(Instant::now() < deadline, "the command after the garbage was not decided in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = worker.await.expect("worker");
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    let letters = log.read_dead_letters(1, 10).await.expect("read");
    assert_eq!(letters.len(), 1);
    let letter = &letters[0].1;
    assert_eq!(letter.source_seq, garbage.seq);
    assert!(letter.payload.is_empty(), "kept without its bytes");
    assert!(letter.reason.contains(&format!("its {} bytes are not kept here", max - 48)), "{}", letter.reason);
    assert!(letter.reason.contains(&format!("sequence {} of the command log", garbage.seq)), "{}", letter.reason);
}

/// A valid allocation, in JSON, whose one attribute makes it `size` bytes long: over the codec's 1 MiB when `size`
/// is, as a producer in another language may send it to a server whose `max_payload` is larger.
fn allocation_of_size(size: usize) -> (Envelope, Vec<u8>) {
    let at = now_ms();
    let body = Allocate::new(
        AgentName::new(TARGET).expect("an agent name"),
        ResourceId::from_parts(at, [7; 10]),
        "container",
        1,
    );
    let envelope = Envelope::new(
        CommandId::from_parts(at, [77; 10]),
        Issuer::new("op:big").expect("an issuer"),
        Timestamp(at),
        body,
    );
    let small = codec::command_to_json(&envelope).expect("encode");
    let empty = r#""attributes":{}"#;
    assert_eq!(small.matches(empty).count(), 1, "{small}");
    let blob = "x".repeat(size - small.len() + empty.len() - r#""attributes":{"blob":""}"#.len());
    let json = small.replace(empty, &format!(r#""attributes":{{"blob":"{blob}"}}"#));
    assert_eq!(json.len(), size);
    (envelope, json.into_bytes())
}

/// `leasehold command ID` (with `--output json` first when `json`) until it answers `dead-lettered`, bounded.
async fn command_until_dead_lettered(dir: &Path, server: &str, id: &str, json: bool, serve: &mut Proc) -> String {
    let deadline = Instant::now() + STEP;
    loop {
        let mut args = vec!["--server", server];
        if json {
            args.extend(["--output", "json"]);
        }
        args.extend(["command", id]);
        let ran = crate::support::run_cli(dir, &args, &[]).await;
        if ran.code == Some(0) && ran.stdout.contains("dead-lettered") {
            return ran.stdout;
        }
        // Until the worker has dead-lettered it, the gateway knows nothing of it (exit 1, "no command ... is known").
        assert!(ran.stderr.contains("is known"), "leasehold command {id}: {ran:?}");
        serve.assert_running_while("jetstream");
        assert!(
            Instant::now() < deadline,
            "command {id} was not dead-lettered in {STEP:?}: {ran:?}\n{}",
            serve.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With `max_payload: 2MB`, as the README advises, a valid command over 1 MiB and just under the server's limit
/// fits in `LH_CMD` but its dead letter does not fit in `LH_DLQ`: the worker keeps the letter without its bytes,
/// and `leasehold command ID` finds it all the same, dead-lettered with its reason (the id was read from the payload
/// before the bytes were dropped). Garbage published under a command id as its `Nats-Msg-Id` is found by that id,
/// marked unverified. `dlq ls` shows both ids, the second marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_found_by_command_id_even_without_their_bytes_on_jetstream() {
    let Some(server) =
        NatsServer::start_with(ServerOptions { max_payload: Some(2 * 1024 * 1024), ..Default::default() })
    else {
        return;
    };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    let max = log.client().server_info().max_payload;
    // Its own `Nats-Msg-Id` header fits beside it; the letter's reason and source headers do not.
    let (big, payload) = allocation_of_size(max - 200);
    let big_id = big.command_id.to_string();
    let stored = log.publish_command(&ingress_subject_of(&big.body), &big_id, payload.into()).await.expect("fits");
    let garbage_id = CommandId::generate().to_string();
    let garbage = log
        .publish_command(&format!("lh.in.op.{TARGET}._"), &garbage_id, Bytes::from_static(b"\x02not a command"))
        .await
        .expect("publish garbage");

    let dir = tempfile::Builder::new().prefix("lh-e2e-dlq-ids-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let partitions = PARTITIONS.to_string();
    let args = [
        "--roles",
        "worker,projector,gateway",
        "--nats",
        server.url(),
        "--partitions",
        &partitions,
        "--data",
        data.to_str().expect("a UTF-8 path"),
        "--name",
        "e2e-dlq-ids",
    ];
    let mut serve = spawn_serve(dir.path(), &args);
    let address = serve.address().await;

    let text = command_until_dead_lettered(dir.path(), &address, &big_id, false, &mut serve).await;
    assert!(text.contains("oversized") && text.contains("are not kept here"), "{text}");
    assert!(text.contains(&format!("command seq {}", stored.seq)) && !text.contains("unverified"), "{text}");
    let json = command_until_dead_lettered(dir.path(), &address, &big_id, true, &mut serve).await;
    let answer: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(answer["dead_letter"]["id_verified"], true, "{answer}");
    let letters = log.read_dead_letters(1, 10).await.expect("read the dead letters");
    let (_, letter) = letters.iter().find(|(_, l)| l.source_seq == stored.seq).expect("the big command's letter");
    assert!(letter.payload.is_empty(), "kept without its bytes: {letter:?}");

    let text = command_until_dead_lettered(dir.path(), &address, &garbage_id, false, &mut serve).await;
    assert!(text.contains("unknown format") && text.contains(&format!("command seq {}", garbage.seq)), "{text}");
    assert!(text.contains("unverified"), "{text}");

    let ran = crate::support::run_cli(dir.path(), &["--server", &address, "dlq", "ls"], &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains(&format!(" {big_id} ")), "{}", ran.stdout);
    assert!(ran.stdout.contains(&format!(" {garbage_id} (unverified) ")), "{}", ran.stdout);
    stop_cleanly(&mut serve, "jetstream").await;
}
