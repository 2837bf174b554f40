//! A worker process dies in the middle of a stream of commands on JetStream, and another one takes over: real
//! `leasehold serve --roles worker` processes (the `leasehold-e2e` binary), real `nats-server` processes.
//!
//! Each test publishes registrations of a few agents (two in every partition), then allocations of new resources
//! spread over them (every one gets exactly one outcome; heartbeats, which may get none, are left out) from a
//! background task, starts worker A, stops it once a share of the outcomes has landed (SIGKILL, or SIGTERM for the
//! graceful stop) while commands are still being published, starts worker B and waits until every command has its
//! outcome. Then, with both workers gone and the log quiet:
//!
//! - every published command has exactly one outcome (by the outcome's `command.id`), and nothing else has one;
//! - per partition, outcomes are in command order (`Lh-Cmd-Seq` strictly increasing in log order), answer exactly the
//!   partition's commands (none skipped), and the `Lh-Prev-Seq` chain is unbroken (checked by hand and by
//!   `fold_partition`, whose state keeps the invariants);
//! - `LH_DLQ` is empty;
//! - the writers group-commit, and every batch stored is whole (contiguous, one partition, numbered from 1 up to
//!   its commit, the fence on its first record only), batches were appended before the stop, and a batch the killed
//!   worker left unfinished is nowhere (`check_batches`);
//! - a projector that followed the log from sequence 1 while the workers ran (as `serve --roles projector` does)
//!   equals the writers' fold of each partition, knows every outcome, and gives the same digests and states when
//!   dropped and rebuilt from sequence 1.
//!
//! The takeover time (from the stop of A to the first outcome B appends, B's start included, and to B's first
//! outcome in every partition) is printed: run with `--nocapture` to see it. The kill runs on one server and on a
//! three-node cluster with R3 streams.
//!
//! Without `nats-server` on `PATH` these tests print a notice and pass, except in CI (`CI=true`), where they fail.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use leasehold_domain::invariants;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsCluster, NatsServer};
use leasehold_log::{Error as LogError, Log, OutcomeFilter, StoredOutcome};
use leasehold_projector::Projector;
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{AgentName, Command as Body, CommandId, Envelope, Issuer, ResourceId, Uuid, codec};
use leasehold_worker::{WriterConfig, fold_partition};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::Proc;

const PARTITIONS: u32 = 4;
/// `priority_timeout` and `ack_wait` of the writer consumers: a dead worker's partitions free up in seconds.
const HOLD: Duration = Duration::from_secs(2);
/// Agents registered in each partition.
const AGENTS_PER_PARTITION: usize = 2;
/// How often the test reads the outcome log for new outcomes (the precision of the takeover time).
const POLL: Duration = Duration::from_millis(20);
/// The longest takeover the tests accept.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(30);

/// How worker A is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `kill -9`: no goodbye, its pins stay until `priority_timeout` has passed.
    Kill,
    /// `kill -TERM`: it finishes the command in hand, gives its partitions up and exits 0.
    Term,
}

/// One run of the scenario.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    replicas: usize,
    /// Commands published in all (registrations included).
    commands: usize,
    /// A is stopped once this many outcomes have landed.
    stop_after: usize,
    /// The publisher stays at most this many commands ahead of the outcomes, so A is stopped while commands are
    /// still being published, however fast either side is.
    window: usize,
    stop: Stop,
}

/// What a run measured.
#[derive(Debug)]
struct Measured {
    /// From the stop of A to the first outcome B appended.
    takeover: Duration,
    /// From the stop of A until B had appended an outcome in every partition.
    takeover_all: Duration,
    /// From the stop of A until B said it was serving (B's start and connect).
    b_started: Option<Duration>,
    /// Outcomes that had landed when A was stopped.
    outcomes_at_stop: usize,
    /// Commands published when A was stopped, and between the stop and B's first outcome.
    published_at_stop: usize,
    published_during_takeover: usize,
    /// From the first command published until every command had its outcome.
    total: Duration,
}

// ---------------------------------------------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_over_and_nothing_is_lost_or_doubled() {
    let Some(server) = NatsServer::start() else { return };
    let scenario = Scenario {
        name: "kill -9, one server",
        replicas: 1,
        commands: 10_000,
        stop_after: 3_000,
        window: 2_000,
        stop: Stop::Kill,
    };
    let measured = run(scenario, server.url()).await;
    assert_takeover_bounded(&scenario, &measured);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_over_on_an_r3_cluster() {
    let Some(cluster) = NatsCluster::start3().await else { return };
    let scenario = Scenario {
        name: "kill -9, three nodes, R3",
        replicas: 3,
        commands: 2_000,
        stop_after: 600,
        window: 600,
        stop: Stop::Kill,
    };
    let measured = run(scenario, &cluster.url()).await;
    assert_takeover_bounded(&scenario, &measured);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_exits_cleanly_and_another_finishes() {
    let Some(server) = NatsServer::start() else { return };
    let scenario = Scenario {
        name: "SIGTERM, one server",
        replicas: 1,
        commands: 3_000,
        stop_after: 1_000,
        window: 800,
        stop: Stop::Term,
    };
    let measured = run(scenario, server.url()).await;
    // A gave its partitions up: B needs no `priority_timeout` to pass.
    assert_takeover_bounded(&scenario, &measured);
}

fn assert_takeover_bounded(scenario: &Scenario, measured: &Measured) {
    assert!(
        measured.takeover_all < TAKEOVER_LIMIT,
        "{}: the takeover took {:?} ({:?} until b's first outcome)",
        scenario.name,
        measured.takeover_all,
        measured.takeover
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The scenario.

async fn run(scenario: Scenario, url: &str) -> Measured {
    let dir = tempfile::Builder::new().prefix("lh-crash-").tempdir().expect("a temporary directory");
    let log = connect(url, scenario.replicas).await;
    let commands = Arc::new(commands(scenario.commands));
    let ids: Vec<String> = commands.iter().map(|c| c.id.clone()).collect();

    // A projector follows the log from sequence 1 while the workers run, as `serve --roles projector` does.
    let stop_projecting = CancellationToken::new();
    let projecting = {
        let (log, stop) = (log.clone(), stop_projecting.clone());
        let mut projector = Projector::in_memory(PARTITIONS).expect("a projector");
        tokio::spawn(async move {
            let result = projector.run(&log, &stop).await;
            (projector, result)
        })
    };

    // The publisher, in the background, never more than `window` ahead of the outcomes.
    let (outcomes_tx, outcomes_rx) = watch::channel(0usize);
    let published = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut publisher = Publisher::Running(tokio::spawn(publish(
        log.clone(),
        commands.clone(),
        scenario.window,
        outcomes_rx,
        published.clone(),
    )));

    let mut a = spawn_worker(dir.path(), "a", url, scenario.replicas);
    let mut watcher = Watcher::new(log.clone(), outcomes_tx);
    let deadline = Instant::now() + Duration::from_secs(60);
    while watcher.decided() < scenario.stop_after {
        a.assert_running();
        publisher.check().await;
        assert!(
            Instant::now() < deadline,
            "{}: only {} outcomes in 60 s from worker a; its log:\n{}",
            scenario.name,
            watcher.decided(),
            a.tail()
        );
        tokio::time::sleep(POLL).await;
        watcher.poll().await;
    }

    // Stop A in the middle of the stream.
    let stopped_at = Instant::now();
    let published_at_stop = published.load(Ordering::SeqCst);
    match scenario.stop {
        Stop::Kill => a.kill9(),
        Stop::Term => a.stop_cleanly().await,
    }
    assert!(
        published_at_stop < scenario.commands,
        "{}: every command was published before a was stopped: the stop is not mid-stream",
        scenario.name
    );
    // Everything a appended is in the log now (it is gone): what lands from here on is b's.
    watcher.catch_up().await;
    let outcomes_at_stop = watcher.decided();
    let last_of_a = watcher.last_seq();
    assert!(
        outcomes_at_stop < scenario.commands,
        "{}: every command was decided before a was stopped: the stop is not mid-stream",
        scenario.name
    );

    let mut b = spawn_worker(dir.path(), "b", url, scenario.replicas);
    let mut b_started = None;
    let mut first_of_b: Option<(Instant, usize)> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while watcher.decided() < scenario.commands {
        b.assert_running();
        publisher.check().await;
        assert!(
            Instant::now() < deadline,
            "{}: {} of {} commands have an outcome 120 s after worker b started ({} published); b's log:\n{}",
            scenario.name,
            watcher.decided(),
            scenario.commands,
            published.load(Ordering::SeqCst),
            b.tail()
        );
        tokio::time::sleep(POLL).await;
        watcher.poll().await;
        if b_started.is_none() && b.stdout().contains("leasehold serve:") {
            b_started = Some(stopped_at.elapsed());
        }
        if first_of_b.is_none()
            && let Some(seen) = watcher.first_seen_after(last_of_a)
        {
            first_of_b = Some((seen, published.load(Ordering::SeqCst)));
        }
    }
    let total = started.elapsed();
    publisher.finish().await;
    let (first_of_b, published_then) = first_of_b.expect("b appended the outcomes after the stop");
    let takeover = first_of_b - stopped_at;
    let per_partition = watcher.first_seen_after_per_partition(last_of_a);
    assert_eq!(
        per_partition.keys().copied().collect::<Vec<u32>>(),
        (0..PARTITIONS).collect::<Vec<u32>>(),
        "{}: b decided commands in every partition",
        scenario.name
    );
    let takeover_all = per_partition.values().max().map_or(takeover, |last| *last - stopped_at);

    let measured = Measured {
        takeover,
        takeover_all,
        b_started,
        outcomes_at_stop,
        published_at_stop,
        published_during_takeover: published_then.saturating_sub(published_at_stop),
        total,
    };
    eprintln!(
        "{}: takeover took {:.2} s (b's first outcome in every partition after {:.2} s; b connected after {}; a \
         stopped at {} outcomes with {} of {} commands published, {} more published before b's first outcome; all \
         {} decided in {:.1} s)",
        scenario.name,
        measured.takeover.as_secs_f64(),
        measured.takeover_all.as_secs_f64(),
        measured.b_started.map_or_else(|| "?".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
        measured.outcomes_at_stop,
        measured.published_at_stop,
        scenario.commands,
        measured.published_during_takeover,
        scenario.commands,
        measured.total.as_secs_f64(),
    );

    // B stops cleanly too; then nothing appends any more.
    b.stop_cleanly().await;
    let checking = Instant::now();
    stop_projecting.cancel();
    let projector = match projecting.await {
        Ok((projector, Ok(()))) => projector,
        Ok((_, Err(e))) => panic!("{}: the projector stopped while following the log: {e}", scenario.name),
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    };
    check_log(&log, &ids, projector).await;
    let batches = check_batches(&log, last_of_a).await;
    eprintln!("{}: {batches}", scenario.name);
    eprintln!("{}: the checks took {:.1} s", scenario.name, checking.elapsed().as_secs_f64());
    measured
}

/// Connects the test's own handle on the log, creating the streams as the workers will find them. A fresh cluster
/// may not answer JetStream requests at once.
async fn connect(url: &str, replicas: usize) -> JetStream {
    let config =
        JetStreamConfig { replicas, priority_timeout: HOLD, ack_wait: HOLD, ..JetStreamConfig::new(url, PARTITIONS) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match JetStream::connect(config.clone()).await {
            Ok(log) => return log,
            Err(LogError::Unavailable(e)) if Instant::now() < deadline => {
                eprintln!("the log is not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connect to {url}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The commands.

/// A command ready to publish.
#[derive(Debug)]
struct Prepared {
    id: String,
    subject: String,
    payload: Bytes,
}

fn prepare(envelope: &Envelope) -> Prepared {
    Prepared {
        id: envelope.command_id.to_string(),
        subject: ingress_subject_of(&envelope.body),
        payload: Bytes::from(codec::encode_command(envelope).expect("a command encodes")),
    }
}

/// `AGENTS_PER_PARTITION` agents in every partition.
fn agents() -> Vec<AgentName> {
    let mut per_partition: BTreeMap<u32, Vec<AgentName>> = BTreeMap::new();
    for n in 0.. {
        let agent = AgentName::new(format!("crash-{n}")).expect("an agent name");
        let those = per_partition.entry(partition_of_agent(&agent, PARTITIONS)).or_default();
        if those.len() < AGENTS_PER_PARTITION {
            those.push(agent);
        }
        if per_partition.len() == PARTITIONS as usize
            && per_partition.values().all(|those| those.len() == AGENTS_PER_PARTITION)
        {
            break;
        }
    }
    per_partition.into_values().flatten().collect()
}

/// The registrations of the agents, then allocations of new resources spread over them: `count` in all.
fn commands(count: usize) -> Vec<Prepared> {
    let now = leasehold_log::embedded::system_clock()();
    let entropy = |tag: u8, n: usize| {
        let mut entropy = [tag; 10];
        entropy[2..].copy_from_slice(&(n as u64).to_be_bytes());
        entropy
    };
    let envelope = |n: usize, issuer: &str, body: Body| {
        Envelope::new(CommandId::from_parts(now.0, entropy(1, n)), Issuer::new(issuer).expect("an issuer"), now, body)
    };
    let agents = agents();
    assert!(count > agents.len(), "the scenario registers {} agents first", agents.len());
    let mut out = Vec::with_capacity(count);
    for (n, agent) in agents.iter().enumerate() {
        let body = Register {
            settings: Some(AgentSettings::default()),
            ..Register::new(agent.clone(), Uuid::from_u128(n as u128 + 1))
        };
        out.push(prepare(&envelope(n, agent.as_str(), body.into())));
    }
    for n in agents.len()..count {
        let body = Allocate {
            agent: agents[n % agents.len()].clone(),
            resource: ResourceId::from_parts(now.0, entropy(2, n)),
            kind: "container".into(),
            capacity: 1,
            attributes: BTreeMap::new(),
            parent: None,
            pools: Vec::new(),
            wait: None,
        };
        out.push(prepare(&envelope(n, "ci", body.into())));
    }
    out
}

/// The background publisher: a failure in it fails the test at once, not at a deadline.
#[derive(Debug)]
enum Publisher {
    Running(tokio::task::JoinHandle<()>),
    Done,
}

impl Publisher {
    /// Fails the test if the publisher failed.
    async fn check(&mut self) {
        if matches!(self, Publisher::Running(task) if task.is_finished()) {
            self.finish().await;
        }
    }

    /// Waits until every command is published.
    async fn finish(&mut self) {
        if let Publisher::Running(task) = std::mem::replace(self, Publisher::Done)
            && let Err(failed) = task.await
        {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}

/// Publishes every command, the registrations one by one first, then the allocations in concurrent rounds, never
/// more than `window` ahead of the outcomes that have landed.
async fn publish(
    log: JetStream,
    commands: Arc<Vec<Prepared>>,
    window: usize,
    mut outcomes: watch::Receiver<usize>,
    published: Arc<AtomicUsize>,
) {
    const ROUND: usize = 50;
    let registrations = agents().len();
    let one = |command: &Prepared| {
        let log = log.clone();
        let (subject, id, payload) = (command.subject.clone(), command.id.clone(), command.payload.clone());
        async move {
            let answer = log.publish_command(&subject, &id, payload).await;
            let answer = answer.unwrap_or_else(|e| panic!("publish {id}: {e}"));
            assert!(!answer.duplicate, "command {id} was published once only, but the log calls it a duplicate");
        }
    };
    for command in &commands[..registrations] {
        one(command).await;
        published.fetch_add(1, Ordering::SeqCst);
    }
    for round in commands[registrations..].chunks(ROUND) {
        let sent = published.load(Ordering::SeqCst);
        outcomes.wait_for(|landed| sent < landed + window).await.expect("the test watches the outcomes");
        futures::future::join_all(round.iter().map(one)).await;
        published.fetch_add(round.len(), Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Watching the outcome log.

/// The most outcomes the watcher reads at once: small, so that A is stopped soon after `stop_after` outcomes.
const PAGE: usize = 256;

/// Reads the outcome log as it grows and remembers when each outcome was first seen.
struct Watcher {
    log: JetStream,
    landed: watch::Sender<usize>,
    /// Part-0 outcomes seen per command id.
    decided: HashMap<String, usize>,
    /// (outcome sequence, when the test first saw it), in log order.
    seen: Vec<(u64, u32, Instant)>,
    next: u64,
}

impl Watcher {
    fn new(log: JetStream, landed: watch::Sender<usize>) -> Self {
        Watcher { log, landed, decided: HashMap::new(), seen: Vec::new(), next: 1 }
    }

    /// Commands with at least one outcome.
    fn decided(&self) -> usize {
        self.decided.len()
    }

    fn last_seq(&self) -> u64 {
        self.next - 1
    }

    /// Reads what landed since the last call, one page at most. Returns how many outcomes it read.
    async fn poll(&mut self) -> usize {
        let batch = match self.log.read_outcomes(&OutcomeFilter::All, self.next, PAGE).await {
            Ok(batch) => batch,
            Err(LogError::Unavailable(why)) => {
                eprintln!("reading the outcomes failed (will retry): {why}");
                return 0;
            }
            Err(e) => panic!("read the outcomes: {e}"),
        };
        let now = Instant::now();
        for outcome in &batch {
            if outcome.part == 0 && !crate::support::seeded_by_serve(outcome) {
                *self.decided.entry(outcome.cmd_id.clone()).or_default() += 1;
            }
            self.seen.push((outcome.seq, outcome.partition, now));
            self.next = outcome.seq + 1;
        }
        self.landed.send_replace(self.decided.len());
        batch.len()
    }

    /// Reads up to the end of the log as it is now.
    async fn catch_up(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let last = loop {
            let mut last = 0;
            let mut failed = None;
            for p in 0..PARTITIONS {
                match self.log.last_outcome_seq(p).await {
                    Ok(seq) => last = last.max(seq),
                    Err(e) => failed = Some(e),
                }
            }
            match failed {
                None => break last,
                Some(e) => {
                    assert!(Instant::now() < deadline, "cannot read the end of the outcome log: {e}");
                    tokio::time::sleep(POLL).await;
                }
            }
        };
        while self.last_seq() < last {
            assert!(Instant::now() < deadline, "the outcome log shows {} of {last} outcomes", self.last_seq());
            if self.poll().await == 0 {
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// When the first outcome after `seq` was seen.
    fn first_seen_after(&self, seq: u64) -> Option<Instant> {
        self.seen.get(self.seen.partition_point(|(s, _, _)| *s <= seq)).map(|(_, _, at)| *at)
    }

    /// When the first outcome after `seq` was seen, per partition that has one.
    fn first_seen_after_per_partition(&self, seq: u64) -> BTreeMap<u32, Instant> {
        let mut out = BTreeMap::new();
        for (_, partition, at) in &self.seen[self.seen.partition_point(|(s, _, _)| *s <= seq)..] {
            out.entry(*partition).or_insert(*at);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The checks, once every command has its outcome and no worker runs.

/// Checks the log once every command has its outcome and no worker runs. `projector` has followed the log from
/// sequence 1 while the workers ran.
async fn check_log(log: &JetStream, ids: &[String], mut projector: Projector) {
    // The projection knows every outcome; a rebuild from sequence 1 runs while the log is checked.
    let applied = projector.catch_up(log).await.expect("the projector catches up");
    let reader = projector.reader();
    for id in ids {
        let found = reader.outcome(id).expect("the projection answers");
        assert!(found.first().is_some_and(|(_, o)| o.command.id.to_string() == *id), "no projected outcome of {id}");
    }
    drop(reader);
    let projected = projector.states().clone();
    let digests = projector.digests().expect("digests");
    let rebuild = {
        let log = log.clone();
        tokio::spawn(async move {
            projector.drop_all().expect("drop the read models");
            assert_eq!(projector.applied(), 0, "nothing is applied after drop_all");
            let rebuilt = projector.catch_up(&log).await.expect("the projector rebuilds");
            (rebuilt, projector.digests().expect("digests"), projector.states().clone())
        })
    };

    let outcomes = read_all_outcomes(log).await;
    assert_eq!(applied, outcomes.last().map_or(0, |o| o.seq), "the projector applied every outcome");

    // Every command has exactly one outcome, and nothing else has one.
    let mut first_parts: HashMap<String, Vec<u64>> = HashMap::new();
    let mut rejected = Vec::new();
    for stored in outcomes.iter().filter(|stored| !crate::support::seeded_by_serve(stored)) {
        let outcome = codec::decode_outcome(&stored.payload)
            .unwrap_or_else(|e| panic!("the outcome at {} does not decode: {e}", stored.seq));
        let id = outcome.command.id.to_string();
        assert_eq!(id, stored.cmd_id, "the outcome at {}: its header names another command", stored.seq);
        assert_eq!(
            (outcome.partition, outcome.cmd_seq, outcome.part),
            (stored.partition, stored.cmd_seq, stored.part),
            "the outcome at {}: its headers and body disagree",
            stored.seq
        );
        if let Some(rejection) = outcome.rejection() {
            rejected.push(format!("{id} at {}: {rejection:?}", stored.seq));
        }
        if stored.part == 0 {
            first_parts.entry(id).or_default().push(stored.seq);
        }
    }
    // Registrations are in the log before any allocation: every command is accepted.
    assert!(rejected.is_empty(), "{} commands were rejected, e.g. {}", rejected.len(), rejected[0]);
    let published: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let strangers: Vec<&String> = first_parts.keys().filter(|id| !published.contains(id.as_str())).collect();
    assert!(strangers.is_empty(), "outcomes of commands nobody published: {strangers:?}");
    let missing: Vec<&String> = ids.iter().filter(|id| !first_parts.contains_key(id.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} commands have no outcome, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let doubled: Vec<(&String, &Vec<u64>)> = first_parts.iter().filter(|(_, seqs)| seqs.len() > 1).collect();
    assert!(doubled.is_empty(), "{} commands have more than one outcome, e.g. {:?}", doubled.len(), &doubled[..1]);
    assert_eq!(first_parts.len(), ids.len());

    // Per partition: in command order, each of the partition's commands answered, the chain unbroken, and the
    // writers' fold is the projector's.
    for p in 0..PARTITIONS {
        let mine: Vec<&StoredOutcome> = outcomes.iter().filter(|o| o.partition == p).collect();
        let mut prev_seq = 0;
        let mut last: Option<(u64, u32)> = None;
        for stored in &mine {
            assert_eq!(
                stored.prev_seq, prev_seq,
                "partition {p}: the outcome at {} says the one before it is at {}, but it is at {prev_seq}",
                stored.seq, stored.prev_seq
            );
            match last {
                Some((cmd_seq, part)) if stored.part > 0 => assert!(
                    stored.cmd_seq == cmd_seq && stored.part == part + 1,
                    "partition {p}: part {} of command {} at {} does not follow part {part} of command {cmd_seq}",
                    stored.part,
                    stored.cmd_seq,
                    stored.seq
                ),
                Some((cmd_seq, _)) => assert!(
                    stored.cmd_seq > cmd_seq,
                    "partition {p}: the outcome at {} answers command {}, not after command {cmd_seq}: out of order",
                    stored.seq,
                    stored.cmd_seq
                ),
                None => assert_eq!(stored.part, 0, "partition {p}: the first outcome is a later part"),
            }
            last = Some((stored.cmd_seq, stored.part));
            prev_seq = stored.seq;
        }
        let answered: BTreeSet<u64> = mine.iter().map(|o| o.cmd_seq).collect();
        let commands = read_all_commands(log, p).await;
        assert_eq!(answered, commands, "partition {p}: the outcomes answer other commands than the partition's");

        let folded = fold_partition(log, p, 0, &WriterConfig::default())
            .await
            .unwrap_or_else(|e| panic!("partition {p} does not fold: {e}"));
        assert_eq!(folded.fence, prev_seq, "partition {p}: the fold ends at another outcome");
        assert_eq!(folded.state.cursor(), commands.last().copied().unwrap_or(0), "partition {p}: the cursor");
        if let Err(broken) = invariants::check(&folded.state) {
            panic!("partition {p}: an invariant is broken: {broken}");
        }
        assert!(folded.state == projected[&p], "partition {p}: the projector folds as the writer does");
    }

    let letters = log.read_dead_letters(1, 10).await.expect("read the dead letters");
    assert!(letters.is_empty(), "LH_DLQ holds {letters:?}");

    let (rebuilt, rebuilt_digests, rebuilt_states) = match rebuild.await {
        Ok(rebuilt) => rebuilt,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    };
    assert_eq!(rebuilt, applied, "the rebuild applied every outcome");
    assert_eq!(rebuilt_digests, digests, "a rebuild from sequence 1 gives the same content");
    assert!(rebuilt_states == projected, "a rebuild from sequence 1 folds the same states");
}

/// The writers group-commit: each append of several outcomes is one atomic batch. Reads every stored outcome's
/// headers and checks that each batch in the log is whole: its messages are contiguous, of one partition, numbered
/// from 1 (`Nats-Batch-Sequence`, kept by the server), the first carrying the fence and `Lh-Prev-Seq`, each later
/// one `Lh-Batch-Index` one more than the message before, and the last the commit. A batch worker A left half-sent
/// when it was killed is nowhere: what a follower can read is only whole batches. Also insists the traffic before
/// the kill was batched (else the test would prove nothing about batches). Returns a summary.
async fn check_batches(log: &JetStream, last_of_a: u64) -> String {
    let mut last = 0;
    for p in 0..PARTITIONS {
        last = last.max(log.last_outcome_seq(p).await.expect("the last outcome"));
    }
    // (batch id, partition subject prefix, next batch sequence expected, first seq)
    let mut open: Option<(String, String, u64, u64)> = None;
    let (mut batches, mut largest, mut in_batches, mut batched_before_kill) = (0u64, 0u64, 0u64, 0u64);
    let mut stored = Vec::new();
    while stored.last().map_or(0, |(seq, _, _)| *seq) < last {
        let from = stored.last().map_or(1, |(seq, _, _)| seq + 1);
        let more = log.stored_outcome_headers(from, 1024).await.expect("the stored outcomes");
        assert!(!more.is_empty(), "the outcomes end before {last}");
        stored.extend(more);
    }
    for (seq, subject, headers) in stored {
        let header = |name: &str| headers.get(name).cloned();
        let partition = subject.split('.').take(3).collect::<Vec<_>>().join(".");
        let Some(id) = header("Nats-Batch-Id") else {
            assert!(open.is_none(), "outcome {seq} is not part of the batch still open before it: {open:?}");
            assert!(header("Lh-Prev-Seq").is_some(), "a lone outcome {seq} carries its chain");
            continue;
        };
        let position: u64 = header("Nats-Batch-Sequence").and_then(|v| v.parse().ok()).expect("a batch sequence");
        match &mut open {
            None => {
                assert_eq!(position, 1, "outcome {seq} starts batch {id} in the middle");
                assert!(header("Lh-Prev-Seq").is_some() && header("Nats-Expected-Last-Subject-Sequence").is_some());
                open = Some((id.clone(), partition.clone(), 2, seq));
            }
            Some((open_id, open_partition, next, _)) => {
                assert_eq!((&id, &partition), (&*open_id, &*open_partition), "batch {open_id} is cut at {seq}");
                assert_eq!(position, *next, "batch {id} skips a message at {seq}");
                assert_eq!(header("Lh-Batch-Index"), Some((position - 1).to_string()), "outcome {seq}");
                assert_eq!(header("Nats-Expected-Last-Subject-Sequence"), None, "a later record carries no fence");
                *next += 1;
            }
        }
        if header("Nats-Batch-Commit").is_some() {
            let (_, _, _, first) = open.take().expect("open");
            let size = seq + 1 - first;
            batches += 1;
            in_batches += size;
            largest = largest.max(size);
            if seq <= last_of_a {
                batched_before_kill += 1;
            }
        }
    }
    assert!(open.is_none(), "the log ends inside a batch: {open:?}");
    assert!(batched_before_kill > 0, "worker a appended no batch of several outcomes: nothing was group-committed");
    format!(
        "{batches} batches of several outcomes ({batched_before_kill} before the stop), {in_batches} of {last} outcomes in batches, the largest {largest}"
    )
}

async fn read_all_outcomes(log: &JetStream) -> Vec<StoredOutcome> {
    let mut out: Vec<StoredOutcome> = Vec::new();
    loop {
        let from = out.last().map_or(1, |o| o.seq + 1);
        let batch = log.read_outcomes(&OutcomeFilter::All, from, 1024).await.expect("read the outcomes");
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

async fn read_all_commands(log: &JetStream, partition: u32) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    loop {
        let after = out.last().copied().unwrap_or(0);
        let batch = log.read_commands(partition, after, 1024).await.expect("read the commands");
        if batch.is_empty() {
            return out;
        }
        out.extend(batch.iter().map(|c| c.seq));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Worker processes.

/// A `leasehold serve --roles worker` process on the log at `url`, its data directory `NAME-data` of `dir`.
fn spawn_worker(dir: &Path, name: &str, url: &str, replicas: usize) -> Proc {
    let data = dir.join(format!("{name}-data"));
    std::fs::create_dir_all(&data).expect("a data directory");
    let (partitions, replicas) = (PARTITIONS.to_string(), replicas.to_string());
    let hold = format!("{}s", HOLD.as_secs());
    let args = [
        "serve",
        "--roles",
        "worker",
        "--nats",
        url,
        "--listen",
        "127.0.0.1:0",
        "--partitions",
        &partitions,
        "--replicas",
        &replicas,
        "--priority-timeout",
        &hold,
        "--ack-wait",
        &hold,
        "--name",
        name,
        "--data",
        data.to_str().expect("a UTF-8 path"),
    ];
    Proc::spawn(dir, name, &args)
}
