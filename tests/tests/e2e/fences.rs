//! Two writers forced onto one partition (including a stalled one that resumes with a buffered append): only one
//! append per fence succeeds, and the final state is as if one writer had done it all (DESIGN section 3).
//!
//! The scenario is written once, generic over the log, and runs on the embedded log in a temporary directory, on
//! JetStream on one `nats-server` (R1: a retry under a stale fence is answered 10071, `Stale`) and on a three-node R3
//! cluster (the same retry is answered "duplicate", `Unknown`).
//!
//! - Two real [`Writer`]s serve the same partition at once, each through an [`Owner`] that ignores ownership
//!   ([`Believer`]: it reads the partition's commands from the log by sequence), so both believe they own it.
//! - Each writer talks to the log through a [`Racer`], which can hold the writer's next append at a gate: the writer
//!   has decided a command under the partition's current fence and stalls with the append in hand (the other
//!   writer's appends wait while the gate is armed, so the stall does not depend on winning a race), while the other
//!   writer decides and appends that command and more. Released, the buffered append must be refused by the fence
//!   (`Stale` or `Unknown`); the writer reloads and carries on.
//! - A producer publishes a few hundred commands meanwhile (registrations, allocations, reports of creation, a few
//!   heartbeats) and, last, a retirement decided in many parts.
//! - At the end: every command has exactly one outcome (heartbeats at most one: one that changes nothing has none),
//!   in command order, the chain folds, every gated append was refused, no outcome part landed twice, and the
//!   outcomes and the folded state are exactly those of one fault-free writer over the same command log.
//!
//! Each backend also gets a direct check: appenders racing under one fence with distinct records (distinct message
//! ids, which matter on R3, where identical ids are refused by dedupe before the fence is checked) and with the same
//! record (the conformance suite's `concurrent_appenders`): exactly one lands per fence. And a writer that reloads
//! while the other writer stores a snapshot of the partition gets an answer (a snapshot is a cache, never a wait
//! without end).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use leasehold_domain::{Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, invariants};
use leasehold_log::embedded::Embedded;
use leasehold_log::intercept::{Intercept, Intercepted, SeededRng};
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsCluster, NatsServer};
use leasehold_log::{Appended, CommandRecord, Error, Log, OutcomeFilter, OutcomeRecord, Owner, Snapshot, conformance};
use leasehold_schemas::command::{Allocate, Heartbeat, Register, ReportCreated, RetireAgent};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Position, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{Command, Effect, Envelope, Outcome, Uuid, codec};
use leasehold_worker::{Counts, Stop, Writer, WriterConfig, admit, fold_partition};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 4;
/// The partition both writers serve.
const P: u32 = 1;
/// The partition of the racing appenders with distinct records (the conformance suite's, with the same record,
/// race on partition 0).
const DISTINCT_RECORDS: u32 = 2;
/// Gate rounds: each holds one writer's append (the two writers take turns).
const ROUNDS: usize = 6;
/// Commands published before each round, with both writers racing freely.
const CHUNK: usize = 40;
/// Every decision that touches more than one resource is split into parts (the retirement at the end).
const SPLIT_BUDGET: usize = 1;
/// How long any one step may take before the test fails.
const STEP: Duration = Duration::from_secs(30);
/// How often the owner that ignores ownership asks the log for commands while none come.
const OWNER_POLL: Duration = Duration::from_millis(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_partition_embedded() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-fences-").tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), PARTITIONS).expect("open the embedded log");
    fences_hold(log, "embedded", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_partition_jetstream() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    fences_hold(log, "jetstream R1", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_partition_jetstream_r3() {
    let Some(cluster) = NatsCluster::start3().await else { return };
    let config = JetStreamConfig { replicas: 3, ..JetStreamConfig::new(cluster.url(), PARTITIONS) };
    let deadline = Instant::now() + STEP;
    let log = loop {
        match JetStream::connect(config.clone()).await {
            Ok(log) => break log,
            Err(Error::Unavailable(e)) if Instant::now() < deadline => {
                eprintln!("the cluster is not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connect to the cluster: {e}"),
        }
    };
    fences_hold(log, "jetstream R3", 3).await;
}

/// A writer that reloads while the other writer of its partition stores a snapshot (as two writers on one
/// partition do: the stalled one stores its snapshot as the other reloads after a refused append) must get an
/// answer: a whole snapshot, none, or an error (a snapshot is a cache: the writer then folds from the first
/// outcome). Never a wait without end, which would wedge the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_gets_an_answer_while_the_other_writer_stores_a_snapshot_embedded() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-fences-").tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), PARTITIONS).expect("open the embedded log");
    snapshot_reads_answer(log, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_gets_an_answer_while_the_other_writer_stores_a_snapshot_jetstream() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    snapshot_reads_answer(log, "jetstream R1").await;
}

async fn snapshot_reads_answer<L: Log>(log: L, backend: &str) {
    const STORES: u64 = 100;
    let storer = {
        let log = log.clone();
        tokio::spawn(async move {
            for fence in 1..=STORES {
                let state = Bytes::from(vec![fence as u8; 4096 + fence as usize]);
                let snapshot =
                    Snapshot { partition: P, decider_version: DECIDER_VERSION, fence, last_command: None, state };
                log.put_snapshot(snapshot).await.expect("store a snapshot");
            }
        })
    };
    let (mut reads, mut whole, mut errors) = (0, 0, 0);
    while reads == 0 || !storer.is_finished() {
        let read = tokio::time::timeout(Duration::from_secs(10), log.latest_snapshot(P)).await.unwrap_or_else(|_| {
            panic!(
                "{backend}: reading the snapshot of partition {P} while another writer stores one did not answer in \
                 10 s ({reads} reads answered before)"
            )
        });
        match read {
            Ok(Some(snapshot)) => {
                let fence = snapshot.fence;
                assert!(
                    snapshot.state.len() == 4096 + fence as usize && snapshot.state.iter().all(|b| *b == fence as u8),
                    "{backend}: the snapshot read says fence {fence} but holds another one's state"
                );
                whole += 1;
            }
            Ok(None) => {}
            Err(_) => errors += 1,
        }
        reads += 1;
    }
    storer.await.expect("the storer");
    let last = log.latest_snapshot(P).await.expect("the last snapshot").expect("a snapshot");
    assert_eq!(last.fence, STORES, "{backend}: the latest snapshot is the last stored");
    eprintln!("{backend}: {reads} snapshot reads while another writer stored {STORES}: {whole} whole, {errors} errors");
}

/// The direct checks, then the scenario, on one log.
async fn fences_hold<L: Log>(log: L, backend: &str, seed: u64) {
    let started = Instant::now();
    assert_eq!(log.partitions(), PARTITIONS);
    conformance::concurrent_appenders(log.clone()).await;
    let busy = conformance::distinct_appenders(&log, DISTINCT_RECORDS).await;
    eprintln!("{backend}: racing appends with distinct records: {busy} busy answers");
    let report = two_writers(log.clone(), backend, seed).await;
    assert_eq!(log.last_outcome_seq(3).await.expect("last outcome of partition 3"), 0, "{backend}: partition 3");
    eprintln!("{backend}: {report} ({:.1} s)", started.elapsed().as_secs_f64());
}

/// Where a writer's gated append is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    /// Appends go through.
    Open,
    /// The next append under the partition's current fence is held.
    Armed,
    /// An append is held, the writer stalled with it in hand.
    Held { cmd_seq: u64, part: u32, fence: u64 },
    /// The held append may go on (a busy answer is retried in place, so it may take several tries).
    Released { cmd_seq: u64, part: u32 },
    /// The log answered the held append.
    Answered { cmd_seq: u64, part: u32, answer: Appended },
}

/// What one writer's appends were answered.
#[derive(Debug, Default)]
struct Tally {
    /// `(cmd_seq, part)` of every record this writer landed, in order.
    landed: Vec<(u64, u32)>,
    /// Appends refused by the fence (`Stale` or `Unknown`).
    refused: u64,
    busy: u64,
}

/// Which writers landed each outcome part: one each, or a command got a second outcome.
type Landings = Arc<Mutex<BTreeMap<(u64, u32), Vec<&'static str>>>>;

/// One writer's hooks on the log: its appends counted and, when the gate is armed, held; ownership believed.
#[derive(Debug, Clone)]
struct Racer {
    name: &'static str,
    gate: Arc<watch::Sender<Gate>>,
    /// The other writer's gate: while it is armed, this writer's appends wait, so the other one can decide under
    /// the current fence (otherwise one writer may win every race for a long time).
    peer: Arc<watch::Sender<Gate>>,
    tally: Arc<Mutex<Tally>>,
    landings: Landings,
}

impl<L: Log> Intercept<L> for Racer {
    type Owner = Believer<L>;

    async fn own(&self, log: &L, partition: u32, _worker: &str) -> Result<Option<Believer<L>>, Error> {
        Ok(Some(Believer { log: log.clone(), partition }))
    }

    async fn append(&self, log: &L, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        let Some((cmd_seq, part)) = records.first().map(|r| (r.cmd_seq, r.part)) else {
            return log.append(partition, fence, records).await;
        };
        if matches!(*self.peer.borrow(), Gate::Armed) {
            // The other writer is to stall with an append that would land: let it get there first.
            let mut peer = self.peer.subscribe();
            let _ = peer.wait_for(|g| !matches!(g, Gate::Armed)).await;
        }
        let armed = matches!(*self.gate.borrow(), Gate::Armed);
        if armed && log.last_outcome_seq(partition).await == Ok(fence) {
            // Decided under the current fence: the append would land now. Stall with it in hand.
            let mut gate = self.gate.subscribe();
            self.gate.send_replace(Gate::Held { cmd_seq, part, fence });
            let _ = gate.wait_for(|g| matches!(g, Gate::Released { .. })).await;
        }
        let answer = log.append(partition, fence, records).await;
        match &answer {
            Appended::Landed { .. } => {
                self.tally.lock().expect("tally").landed.extend(records.iter().map(|r| (r.cmd_seq, r.part)));
                let mut landings = self.landings.lock().expect("landings");
                for record in records {
                    landings.entry((record.cmd_seq, record.part)).or_default().push(self.name);
                }
            }
            Appended::Busy(_) => self.tally.lock().expect("tally").busy += 1,
            Appended::Stale { .. } | Appended::Unknown(_) | Appended::TooLarge(_) => {
                self.tally.lock().expect("tally").refused += 1;
            }
        }
        let released = *self.gate.borrow() == Gate::Released { cmd_seq, part };
        if released && !matches!(answer, Appended::Busy(_)) {
            self.gate.send_replace(Gate::Answered { cmd_seq, part, answer: answer.clone() });
        }
        answer
    }
}

/// An owner that ignores ownership: it reads the partition's commands from the log by sequence and never hears it
/// lost the partition, so two writers both believe they own it.
#[derive(Debug)]
struct Believer<L> {
    log: L,
    partition: u32,
}

impl<L: Log> Owner for Believer<L> {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn next_commands(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        let until = Instant::now() + wait;
        loop {
            let batch = self.log.read_commands(self.partition, after, max).await?;
            if !batch.is_empty() || Instant::now() >= until {
                return Ok(batch);
            }
            tokio::time::sleep(OWNER_POLL).await;
        }
    }

    async fn done_through(&mut self, _seq: u64) -> Result<(), Error> {
        Ok(())
    }

    async fn release(self) {}
}

type Rng = SeededRng;

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("the clock is after 1970");
    u64::try_from(since.as_millis()).expect("milliseconds fit")
}

#[derive(Debug)]
struct Agent {
    name: AgentName,
    /// Its registration's position, once the log shows it decided.
    epoch: Option<Position>,
    obs: u64,
}

/// What the producer publishes: agents of partition `P`, their resources, and every command with its sequence.
#[derive(Debug)]
struct Workload {
    rng: Rng,
    names: Vec<AgentName>,
    agents: Vec<Agent>,
    resources: Vec<(usize, ResourceId)>,
    ids: u64,
    published: Vec<(u64, Envelope)>,
}

impl Workload {
    fn new(seed: u64) -> Self {
        let names = (0..)
            .map(|i| AgentName::new(format!("fence-w{i}")).expect("an agent name"))
            .filter(|agent| partition_of_agent(agent, PARTITIONS) == P)
            .take(5)
            .collect();
        Workload {
            rng: Rng::new(seed),
            names,
            agents: Vec::new(),
            resources: Vec::new(),
            ids: 0,
            published: Vec::new(),
        }
    }

    fn entropy(&mut self) -> [u8; 10] {
        self.ids += 1;
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.ids.to_be_bytes());
        entropy
    }

    fn envelope(&mut self, issuer: &str, body: impl Into<Command>) -> Envelope {
        let at = now_ms();
        let id = CommandId::from_parts(at, self.entropy());
        Envelope::new(id, Issuer::new(issuer).expect("an issuer"), Timestamp(at), body)
    }

    async fn publish<L: Log>(&mut self, log: &L, envelope: Envelope) {
        assert_eq!(partition_of_agent(&key_agent(&envelope), PARTITIONS), P, "every command is about partition P");
        let payload = codec::encode_command(&envelope).expect("encode a command");
        let published = log
            .publish_command(&ingress_subject_of(&envelope.body), &envelope.command_id.to_string(), payload.into())
            .await
            .expect("publish a command");
        assert!(!published.duplicate, "a fresh command id is not a duplicate");
        self.published.push((published.seq, envelope));
    }

    fn last_seq(&self) -> u64 {
        self.published.last().map_or(0, |(seq, _)| *seq)
    }

    async fn register<L: Log>(&mut self, log: &L) {
        let agent = self.names.remove(0);
        let body = Register {
            settings: Some(AgentSettings::default()),
            ..Register::new(agent.clone(), Uuid::from_u128(u128::from(self.rng.next_u64()) | 1 << 100))
        };
        let envelope = self.envelope(agent.as_str(), body);
        self.agents.push(Agent { name: agent, epoch: None, obs: 0 });
        self.publish(log, envelope).await;
    }

    /// An allocation on a registered agent: a command that always gets an outcome.
    async fn allocate<L: Log>(&mut self, log: &L) {
        if self.agents.is_empty() {
            return self.register(log).await;
        }
        let a = self.rng.below(self.agents.len() as u64) as usize;
        let resource = ResourceId::from_parts(now_ms(), self.entropy());
        self.resources.push((a, resource));
        let body = Allocate::new(self.agents[a].name.clone(), resource, "volume", 1);
        let envelope = self.envelope("ci", body);
        self.publish(log, envelope).await;
    }

    /// The epoch of agent `a`, read from its registration's outcome once the log holds it.
    async fn epoch<L: Log>(&mut self, log: &L, a: usize) -> Option<Position> {
        if self.agents[a].epoch.is_none() {
            let filter = OutcomeFilter::Key { partition: P, key: self.agents[a].name.as_str().to_owned() };
            let outcomes = log.read_outcomes(&filter, 1, 100).await.expect("read an agent's outcomes");
            self.agents[a].epoch = outcomes.iter().find_map(|stored| {
                let outcome = codec::decode_outcome(&stored.payload).expect("an outcome decodes");
                outcome
                    .positioned_effects()
                    .find_map(|(position, effect)| matches!(effect, Effect::AgentRegistered { .. }).then_some(position))
            });
        }
        self.agents[a].epoch
    }

    /// Registrations, allocations, reports of creation and a few heartbeats.
    async fn next<L: Log>(&mut self, log: &L) {
        let roll = self.rng.below(100);
        if self.agents.is_empty() || (roll < 5 && !self.names.is_empty()) {
            return self.register(log).await;
        }
        if roll < 45 || self.resources.is_empty() {
            return self.allocate(log).await;
        }
        let (a, resource) = self.resources[self.rng.below(self.resources.len() as u64) as usize];
        let Some(epoch) = self.epoch(log, a).await else { return self.allocate(log).await };
        let agent = self.agents[a].name.clone();
        let envelope = if roll < 90 {
            self.agents[a].obs += 1;
            let body =
                ReportCreated { agent: agent.clone(), epoch, obs: self.agents[a].obs, resource, native_id: None };
            self.envelope(agent.as_str(), body)
        } else {
            self.envelope(agent.as_str(), Heartbeat { agent: agent.clone(), epoch })
        };
        self.publish(log, envelope).await;
    }
}

fn key_agent(envelope: &Envelope) -> AgentName {
    match envelope.body.key() {
        leasehold_schemas::Key::Agent(agent) => agent,
        leasehold_schemas::Key::Pool(pool) => panic!("the workload has no pools, but {pool} came up"),
        leasehold_schemas::Key::Placement(id) => panic!("the workload places nothing, but {id} came up"),
    }
}

type WriterTask = tokio::task::JoinHandle<Result<(Stop, Counts), leasehold_worker::Error>>;

/// Fails with how a writer ended if one ended before the shutdown.
async fn still_serving(writers: &mut [WriterTask], what: &str) {
    for writer in writers.iter_mut() {
        if writer.is_finished() {
            let end = writer.await;
            panic!("{what}: a writer ended before the shutdown: {end:?}");
        }
    }
}

/// Polls `done` until it holds, failing with `what` after `within` or when a writer ends.
async fn wait_until(what: &str, within: Duration, writers: &mut [WriterTask], mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        still_serving(writers, what).await;
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Snapshots at the default interval (none in a run this short): a reload while the other writer stores a
/// snapshot is checked on its own (`a_reload_gets_an_answer_while_the_other_writer_stores_a_snapshot_*`).
fn writer_config() -> WriterConfig {
    WriterConfig {
        max_batch: 8,
        poll: Duration::from_millis(200),
        split_budget: Some(SPLIT_BUDGET),
        ..WriterConfig::default()
    }
}

/// Two writers race on partition `P` through the gate while a producer publishes; returns a summary.
async fn two_writers<L: Log>(log: L, backend: &str, seed: u64) -> String {
    let landings = Landings::default();
    let gates = [(); 2].map(|()| Arc::new(watch::Sender::new(Gate::Open)));
    let racers = [0, 1].map(|i| Intercepted {
        log: log.clone(),
        hooks: Racer {
            name: ["writer-a", "writer-b"][i],
            gate: gates[i].clone(),
            peer: gates[1 - i].clone(),
            tally: Arc::default(),
            landings: landings.clone(),
        },
    });
    let shutdown = CancellationToken::new();
    let mut writers: Vec<WriterTask> = racers
        .iter()
        .map(|racer| {
            let (racer, shutdown) = (racer.clone(), shutdown.clone());
            tokio::spawn(async move {
                let mut owner = racer.own(P, racer.hooks.name).await?.expect("a believer always owns");
                let mut writer = Writer::load(racer, P, writer_config(), 0).await?;
                let stop = writer.serve(&mut owner, &shutdown).await?;
                Ok::<(Stop, Counts), leasehold_worker::Error>((stop, writer.counts()))
            })
        })
        .collect();

    let mut work = Workload::new(seed);
    let mut gated = [0u64; 2];
    for round in 0..ROUNDS {
        for _ in 0..CHUNK {
            work.next(&log).await;
        }
        let (h, o) = (round % 2, 1 - round % 2);
        let (held, other) = (&racers[h], &racers[o]);
        let mut gate = held.hooks.gate.subscribe();
        held.hooks.gate.send_replace(Gate::Armed);
        // New commands, one at a time, until the armed writer decides one under the current fence and stalls.
        let deadline = Instant::now() + STEP;
        let (cmd_seq, part, fence) = loop {
            work.allocate(&log).await;
            let wait =
                tokio::time::timeout(Duration::from_millis(300), gate.wait_for(|g| matches!(g, Gate::Held { .. })));
            if let Ok(Ok(state)) = wait.await
                && let Gate::Held { cmd_seq, part, fence } = *state
            {
                break (cmd_seq, part, fence);
            }
            still_serving(&mut writers, backend).await;
            assert!(
                Instant::now() < deadline,
                "{backend} round {round}: {} never appended under a current fence",
                held.hooks.name
            );
        };
        // While it stalls, the other writer decides and appends that command, and the ones published after it.
        for _ in 0..3 {
            work.allocate(&log).await;
        }
        wait_until(
            &format!("{backend} round {round}: {} appends {cmd_seq}/{part} and more", other.hooks.name),
            STEP,
            &mut writers,
            || {
                let tally = other.hooks.tally.lock().expect("tally");
                tally.landed.contains(&(cmd_seq, part)) && tally.landed.iter().any(|(seq, _)| *seq > cmd_seq)
            },
        )
        .await;
        assert!(log.last_outcome_seq(P).await.expect("last outcome") > fence);
        // The stalled writer resumes with its buffered append: the fence refuses it.
        held.hooks.gate.send_replace(Gate::Released { cmd_seq, part });
        let answer = tokio::time::timeout(STEP, gate.wait_for(|g| matches!(g, Gate::Answered { .. })))
            .await
            .unwrap_or_else(|_| panic!("{backend} round {round}: the released append was not answered"))
            .expect("the gate is there")
            .clone();
        let Gate::Answered { answer, .. } = answer else { unreachable!("waited for an answer") };
        assert!(
            matches!(answer, Appended::Stale { .. } | Appended::Unknown(_)),
            "{backend} round {round}: {}'s append of {cmd_seq}/{part} under the stale fence {fence} was answered \
             {answer:?}",
            held.hooks.name
        );
        gated[h] += 1;
        held.hooks.gate.send_replace(Gate::Open);
    }
    // Last, a retirement: everything the first agent holds is released, in one part per resource.
    let agent = work.agents[0].name.clone();
    let retire = work.envelope("ops", RetireAgent::new(agent));
    work.publish(&log, retire).await;

    let (expected, expected_state) = reference(&log, work.last_seq()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logged = conformance::all_outcomes(&log, &OutcomeFilter::Partition(P), 1).await;
        if logged.len() >= expected.len() {
            break;
        }
        still_serving(&mut writers, backend).await;
        assert!(
            Instant::now() < deadline,
            "{backend}: the writers made {} of {} outcomes in 60 s",
            logged.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let mut counts = Vec::new();
    for (writer, racer) in writers.into_iter().zip(&racers) {
        let (stop, c) = writer
            .await
            .expect("a writer task")
            .unwrap_or_else(|e| panic!("{backend}: {} stopped the partition: {e}", racer.hooks.name));
        assert_eq!(stop, Stop::Shutdown);
        counts.push(c);
    }

    // Every command has exactly one outcome (a heartbeat at most one), in command order.
    let stored = conformance::all_outcomes(&log, &OutcomeFilter::Partition(P), 1).await;
    let logged: Vec<Outcome> =
        stored.iter().map(|s| codec::decode_outcome(&s.payload).expect("an outcome decodes")).collect();
    let mut first_parts: BTreeMap<String, usize> = BTreeMap::new();
    for outcome in logged.iter().filter(|o| o.part == 0) {
        *first_parts.entry(outcome.command.id.to_string()).or_default() += 1;
    }
    for (seq, envelope) in &work.published {
        let n = first_parts.remove(&envelope.command_id.to_string()).unwrap_or(0);
        if matches!(envelope.body, Command::Heartbeat(_)) {
            assert!(n <= 1, "{backend}: heartbeat {seq} has {n} outcomes");
        } else {
            assert_eq!(n, 1, "{backend}: command {seq} ({}) has {n} outcomes", envelope.type_name());
        }
    }
    assert!(first_parts.is_empty(), "{backend}: outcomes of commands nobody published: {first_parts:?}");
    for pair in stored.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let in_order = if a.cmd_seq == b.cmd_seq { b.part == a.part + 1 } else { a.cmd_seq < b.cmd_seq && b.part == 0 };
        assert!(in_order, "{backend}: outcomes out of command order: {a:?} then {b:?}");
    }
    // No part landed twice, whoever appended it.
    let landings = landings.lock().expect("landings").clone();
    for ((cmd_seq, part), by) in &landings {
        assert_eq!(by.len(), 1, "{backend}: outcome part {cmd_seq}/{part} landed more than once, by {by:?}");
    }
    assert_eq!(landings.len(), logged.len(), "{backend}: every logged part landed through a writer, once");

    // As if one writer had done it all: the same outcomes, the same state, an unbroken chain.
    assert_eq!(logged.len(), expected.len(), "{backend}: outcome count against one fault-free writer");
    for (i, (got, want)) in logged.iter().zip(&expected).enumerate() {
        assert_eq!(got, want, "{backend}: outcome {i} differs from one fault-free writer's");
    }
    let config = writer_config();
    let folded = fold_partition(&log, P, 0, &config).await.unwrap_or_else(|e| panic!("{backend}: the fold: {e}"));
    assert!(folded.state == expected_state, "{backend}: the folded state differs from one writer's");
    invariants::check(&folded.state).unwrap_or_else(|e| panic!("{backend}: {e}"));
    assert!(logged.iter().any(|o| o.part > 0), "{backend}: the retirement was decided in parts");

    // The gate caused refused appends, and each held writer reloaded and carried on.
    let tallies: Vec<_> = racers
        .iter()
        .map(|r| {
            let t = r.hooks.tally.lock().expect("tally");
            (t.landed.len(), t.refused, t.busy)
        })
        .collect();
    assert_eq!(gated.iter().sum::<u64>(), ROUNDS as u64);
    for ((racer, c), (landed, refused, _)) in racers.iter().zip(&counts).zip(&tallies) {
        let g = gated[usize::from(racer.hooks.name == "writer-b")];
        assert!(
            *refused >= g && c.reloads >= g,
            "{backend}: {}: {g} gated appends, {refused} refused, {c:?}",
            racer.hooks.name
        );
        assert!(*landed > 0, "{backend}: {} landed nothing after its gated appends", racer.hooks.name);
    }
    let refused: u64 = tallies.iter().map(|t| t.1).sum();
    assert!(refused > 0);
    format!(
        "{} commands, {} outcome parts; {} gated appends refused; refused by the fence in all {refused}; landed \
         (a, b) = ({}, {}); busy answers {}; reloads (a, b) = ({}, {})",
        work.published.len(),
        logged.len(),
        gated.iter().sum::<u64>(),
        tallies[0].0,
        tallies[1].0,
        tallies[0].2 + tallies[1].2,
        counts[0].reloads,
        counts[1].reloads
    )
}

/// What one fault-free writer makes of partition `P`'s command log, up to `last_seq`: its outcomes and its state.
async fn reference<L: Log>(log: &L, last_seq: u64) -> (Vec<Outcome>, PartitionState) {
    let mut state = PartitionState::new(P, PARTITIONS).with_split_budget(SPLIT_BUDGET);
    let mut outcomes = Vec::new();
    let mut after = 0;
    let deadline = Instant::now() + STEP;
    while after < last_seq {
        let batch = log.read_commands(P, after, 100).await.expect("read commands");
        let Some(last) = batch.last() else {
            // A replica behind the last publish: ask again.
            assert!(Instant::now() < deadline, "the command log shows up to {after} of {last_seq}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        after = last.seq;
        for command in batch {
            let envelope = admit(P, PARTITIONS, &command).expect("every command of the workload is admitted");
            let ctx = Ctx { cmd_seq: command.seq, log_time: command.time };
            if let Decided::Append(outcome) = decide(&state, &ctx, &envelope).expect("decide") {
                apply(&mut state, &outcome).expect("apply");
                outcomes.push(outcome);
                while state.pending().is_some() {
                    let part = continue_work(&state).expect("the next part");
                    apply(&mut state, &part).expect("apply a part");
                    outcomes.push(part);
                }
            }
        }
    }
    (outcomes, state)
}
