//! A deterministic simulation of the writers (the FoundationDB / TigerBeetle way): two real workers (`run`: the
//! share of partitions among live workers, taking what nobody serves, the writers) serve the partitions of an
//! in-memory embedded log on a single-threaded runtime with paused time, while a seeded fault layer between them
//! and the log loses acks, times appends out (landed or not), answers "busy", stalls a writer while its hold moves
//! to the other one (so it resumes with a buffered append under a stale fence), moves holds between the parts of a
//! decision, and delivers commands again and out of order. Writers group-commit (each seed its own group size, from
//! one record to a thousand), so the same faults hit batches: a batch abandoned half-way (nothing stored), a commit
//! answer lost after the batch landed, too many open batches, a batch over a server's limit (appended again in
//! smaller slices), a takeover between two batches of one decision's parts. A producer publishes a seeded workload
//! meanwhile: registrations, allocations, reports, heartbeats, leases, releases, retirements decided in parts (one
//! mid-workload, one at the end), retried commands, garbage and commands on the wrong subject. Writers store
//! snapshots every few outcomes and load from them; the fault layer sometimes offers a snapshot no writer may use
//! (another decider version, past the log's end, garbage) instead.
//!
//! After each seed: the outcomes in the log are exactly those one fault-free writer makes from the same command log
//! (so every command has exactly one outcome, in command order, each part once), the chain is unbroken, the state
//! folded from the log equals that writer's, `invariants::check` holds, and exactly the bad commands are dead
//! letters. A failing seed prints itself; `LH_SIM_SEED=N` replays it exactly, `LH_SIM_SEEDS=N` runs more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use leasehold_domain::driver::Driver;
use leasehold_domain::{Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, invariants};
use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::intercept::{Intercept, Intercepted, SeededRng};
use leasehold_log::{Appended, CommandRecord, Error, Log, OutcomeFilter, OutcomeRecord, Owner, Snapshot};
use leasehold_schemas::command::{Acquire, Allocate, Heartbeat, Register, Release, ReportCreated, RetireAgent};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Position, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{Command, Effect, Envelope, Outcome, Uuid, codec};
use leasehold_worker::{WorkerConfig, WriterConfig, admit, fold_partition};
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 2;
const START: u64 = 1_800_000_000_000;
const SPLIT_BUDGET: usize = 1;

type Rng = SeededRng;

#[derive(Debug, Default)]
struct Faults {
    busy: u64,
    timed_out: u64,
    acks_lost: u64,
    stalls: u64,
    moves_between_parts: u64,
    holds_dropped: u64,
    redeliveries: u64,
    bad_snapshots: u64,
    snapshots_used: u64,
    /// The same faults, where the append was a batch of several records.
    batches_landed: u64,
    batches_abandoned: u64,
    batch_answers_lost: u64,
    batches_busy: u64,
    batches_too_large: u64,
    moves_between_batches_of_parts: u64,
}

impl std::ops::AddAssign for Faults {
    fn add_assign(&mut self, f: Faults) {
        self.busy += f.busy;
        self.timed_out += f.timed_out;
        self.acks_lost += f.acks_lost;
        self.stalls += f.stalls;
        self.moves_between_parts += f.moves_between_parts;
        self.holds_dropped += f.holds_dropped;
        self.redeliveries += f.redeliveries;
        self.bad_snapshots += f.bad_snapshots;
        self.snapshots_used += f.snapshots_used;
        self.batches_landed += f.batches_landed;
        self.batches_abandoned += f.batches_abandoned;
        self.batch_answers_lost += f.batch_answers_lost;
        self.batches_busy += f.batches_busy;
        self.batches_too_large += f.batches_too_large;
        self.moves_between_batches_of_parts += f.moves_between_batches_of_parts;
    }
}

/// Seeded faults between the embedded log and one worker.
#[derive(Clone)]
struct Faulty {
    rng: Arc<Mutex<Rng>>,
    faults: Arc<Mutex<Faults>>,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

/// The embedded log as one worker of the simulation sees it.
type SimLog = Intercepted<Embedded, Faulty>;

impl Faulty {
    fn roll(&self, percent: u64) -> bool {
        self.rng.lock().unwrap().chance(percent)
    }

    fn below(&self, n: u64) -> u64 {
        self.rng.lock().unwrap().below(n)
    }

    fn count(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap());
    }
}

impl Intercept<Embedded> for Faulty {
    type Owner = SimOwner;

    async fn append(&self, log: &Embedded, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        let batch = records.len() > 1;
        if self.roll(3) {
            self.count(|f| if batch { f.batches_busy += 1 } else { f.busy += 1 });
            return Appended::Busy("simulated: too many open batches".to_owned());
        }
        if batch && self.roll(2) {
            // A server batch limit below this batch (10199): nothing stored; the writer appends in smaller slices.
            self.count(|f| f.batches_too_large += 1);
            return Appended::TooLarge("simulated: atomic publish batch is too large".to_owned());
        }
        if self.roll(3) {
            // For a batch: abandoned half-way (some messages sent, never committed), which stores nothing.
            self.count(|f| if batch { f.batches_abandoned += 1 } else { f.timed_out += 1 });
            return Appended::Unknown("simulated: timed out, not landed".to_owned());
        }
        if self.roll(4) {
            // A writer stalls (a GC pause, a slow disk) and its hold lapses; it resumes with its buffered append.
            self.count(|f| f.stalls += 1);
            log.drop_owner(partition);
            tokio::time::sleep(Duration::from_millis(self.below(3000))).await;
        }
        let answer = log.append(partition, fence, records).await;
        if let Appended::Landed { .. } = answer {
            let continues =
                records.last().and_then(|r| codec::decode_outcome(&r.payload).ok()).is_some_and(|o| o.continues());
            if batch {
                self.count(|f| f.batches_landed += 1);
            }
            if continues && self.roll(30) {
                self.count(|f| if batch { f.moves_between_batches_of_parts += 1 } else { f.moves_between_parts += 1 });
                log.drop_owner(partition);
            }
            if self.roll(4) {
                self.count(|f| if batch { f.batch_answers_lost += 1 } else { f.acks_lost += 1 });
                return Appended::Unknown("simulated: landed, ack lost".to_owned());
            }
        }
        answer
    }

    async fn latest_snapshot(&self, log: &Embedded, partition: u32) -> Result<Option<Snapshot>, Error> {
        let real = log.latest_snapshot(partition).await?;
        if self.roll(15) {
            // A snapshot no writer should use: another decider version, past the log's end, or garbage.
            self.count(|f| f.bad_snapshots += 1);
            let last = log.last_outcome_seq(partition).await?;
            let bad = match self.below(3) {
                0 => Snapshot {
                    partition,
                    // An older decider's (or a newer one's, after a rollback): another version's state.
                    decider_version: if self.below(2) == 0 { DECIDER_VERSION - 1 } else { DECIDER_VERSION + 1 },
                    fence: 0,
                    last_command: None,
                    state: PartitionState::new(partition, PARTITIONS).to_snapshot().unwrap().into(),
                },
                1 => Snapshot {
                    partition,
                    decider_version: DECIDER_VERSION,
                    fence: last + 1000,
                    last_command: None,
                    state: PartitionState::new(partition, PARTITIONS).to_snapshot().unwrap().into(),
                },
                _ => Snapshot {
                    partition,
                    decider_version: DECIDER_VERSION,
                    fence: 1,
                    last_command: None,
                    state: Bytes::from_static(b"Sgarbage"),
                },
            };
            return Ok(Some(bad));
        }
        if real.is_some() {
            self.count(|f| f.snapshots_used += 1);
        }
        Ok(real)
    }

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<SimOwner>, Error> {
        let owner = log.own(partition, worker).await?;
        Ok(owner.map(|inner| SimOwner { inner, log: log.clone(), faults: self.clone() }))
    }
}

#[derive(Debug)]
struct SimOwner {
    inner: EmbeddedOwner,
    log: Embedded,
    faults: Faulty,
}

impl Owner for SimOwner {
    fn partition(&self) -> u32 {
        self.inner.partition()
    }

    async fn next_commands(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        let partition = self.inner.partition();
        if self.faults.roll(2) {
            self.faults.count(|f| f.holds_dropped += 1);
            self.log.drop_owner(partition);
        }
        let mut batch = self.inner.next_commands(after, max, wait).await?;
        if after > 0 && self.faults.roll(10) {
            // Deliveries of commands already handled come back before the new ones.
            self.faults.count(|f| f.redeliveries += 1);
            let from = after.saturating_sub(1 + self.faults.below(4));
            let mut old = self.log.read_commands(partition, from, 2).await?;
            old.retain(|c| c.seq <= after);
            old.append(&mut batch);
            batch = old;
        }
        if !batch.is_empty() && self.faults.roll(5) {
            let again = batch[0].clone();
            batch.insert(1.min(batch.len()), again);
        }
        Ok(batch)
    }

    async fn keep_alive(&mut self) -> Result<(), Error> {
        self.inner.keep_alive().await
    }

    async fn done_through(&mut self, seq: u64) -> Result<(), Error> {
        self.inner.done_through(seq).await
    }

    async fn release(self) {
        self.inner.release().await
    }
}

/// What the producer publishes.
struct Workload {
    rng: Rng,
    agents: Vec<(AgentName, Position)>,
    resources: Vec<(usize, ResourceId)>,
    obs: BTreeMap<usize, u64>,
    published: Vec<Envelope>,
    n_ids: u64,
    /// Command log sequences of what must be dead-lettered.
    bad: BTreeSet<u64>,
}

impl Workload {
    fn now() -> Timestamp {
        Timestamp(START + u64::try_from(tokio::time::Instant::now().elapsed().as_millis()).unwrap_or(0))
    }

    fn entropy(&mut self) -> [u8; 10] {
        self.n_ids += 1;
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.n_ids.to_be_bytes());
        entropy
    }

    fn envelope(&mut self, issuer: &str, body: impl Into<Command>, at: Timestamp) -> Envelope {
        let id = CommandId::from_parts(at.0, self.entropy());
        Envelope::new(id, Issuer::new(issuer).unwrap(), at, body)
    }

    fn next_command(&mut self, at: Timestamp) -> Envelope {
        let a = self.rng.below(self.agents.len() as u64) as usize;
        let (agent, epoch) = self.agents[a].clone();
        let pick = self.rng.below(100);
        let resource =
            (!self.resources.is_empty()).then(|| self.resources[self.rng.below(self.resources.len() as u64) as usize]);
        match (pick, resource) {
            (0..30, _) | (_, None) => {
                let resource = ResourceId::from_parts(at.0, self.entropy());
                self.resources.push((a, resource));
                let body = Allocate {
                    agent,
                    resource,
                    kind: "volume".to_owned(),
                    capacity: 2,
                    attributes: BTreeMap::new(),
                    parent: None,
                    pools: vec![],
                    wait: None,
                };
                self.envelope("ci", body, at)
            }
            (30..55, Some((owner, resource))) => {
                let (agent, epoch) = self.agents[owner].clone();
                let obs = self.obs.entry(owner).or_insert(0);
                *obs += 1;
                let body = ReportCreated { agent: agent.clone(), epoch, obs: *obs, resource, native_id: None };
                self.envelope(agent.as_str(), body, at)
            }
            (55..70, _) => self.envelope(agent.clone().as_str(), Heartbeat { agent, epoch }, at),
            (70..85, Some((owner, resource))) => {
                let agent = self.agents[owner].0.clone();
                let lease = LeaseId::from_parts(at.0, self.entropy());
                let body = Acquire {
                    agent,
                    resource,
                    lease,
                    holder: "job".to_owned(),
                    ttl: None,
                    wait_timeout: None,
                    priority: 0,
                };
                self.envelope("ci", body, at)
            }
            (_, Some((owner, resource))) => {
                let agent = self.agents[owner].0.clone();
                self.envelope("ops", Release { agent, resource, reason: None }, at)
            }
        }
    }
}

async fn publish(log: &Embedded, envelope: &Envelope, msg_id: &str) -> u64 {
    let payload = codec::encode_command(envelope).unwrap();
    log.publish_command(&ingress_subject_of(&envelope.body), msg_id, payload.into()).await.unwrap().seq
}

async fn produce(log: Embedded, mut work: Workload, n: usize) -> Workload {
    for i in 0..n {
        if i == n / 2 {
            // Mid-workload, an agent retires: the release of what it holds is decided in parts, and the commands
            // after it wait for every part.
            let at = Workload::now();
            let agent = work.agents[2].0.clone();
            let envelope = work.envelope("ops", RetireAgent::new(agent), at);
            publish(&log, &envelope, &envelope.command_id.to_string()).await;
        }
        tokio::time::sleep(Duration::from_millis(work.rng.below(400))).await;
        let at = Workload::now();
        let roll = work.rng.below(100);
        if roll < 4 && !work.published.is_empty() {
            // A producer retries a command after the dedupe window: the writer answers it from the log.
            let earlier = work.published[work.rng.below(work.published.len() as u64) as usize].clone();
            publish(&log, &earlier, &format!("{}-retry-{}", earlier.command_id, work.n_ids)).await;
            work.n_ids += 1;
        } else if roll < 7 {
            let subject = format!("lh.in.op.{}._", work.agents[0].0);
            let garbage =
                [b"\x01\xff\xfe".as_slice(), b"{\"schema_version\":1", b"", b"\x07zz"][work.rng.below(4) as usize];
            let seq = log.publish_command(&subject, &format!("junk-{}", work.n_ids), Bytes::from_static(garbage)).await;
            work.n_ids += 1;
            work.bad.insert(seq.unwrap().seq);
        } else if roll < 9 {
            // A command about one agent published on another agent's subject.
            let envelope = work.next_command(at);
            let other = work.agents.iter().find(|(a, _)| Some(a) != Some(&key_agent(&envelope))).cloned();
            if let Some((other, _)) = other {
                let subject = ingress_subject_of(&envelope.body)
                    .replace(&format!(".{}.", key_agent(&envelope)), &format!(".{other}."));
                let payload = codec::encode_command(&envelope).unwrap();
                let seq =
                    log.publish_command(&subject, &envelope.command_id.to_string(), payload.into()).await.unwrap();
                work.bad.insert(seq.seq);
            }
        } else {
            let envelope = work.next_command(at);
            publish(&log, &envelope, &envelope.command_id.to_string()).await;
            work.published.push(envelope);
        }
    }
    // The last act: one agent retires, and the release of everything it holds is decided in parts.
    let at = Workload::now();
    let agent = work.agents[0].0.clone();
    let envelope = work.envelope("ops", RetireAgent::new(agent), at);
    publish(&log, &envelope, &envelope.command_id.to_string()).await;
    work
}

fn key_agent(envelope: &Envelope) -> AgentName {
    match envelope.body.key() {
        leasehold_schemas::Key::Agent(agent) => agent,
        leasehold_schemas::Key::Pool(_) => unreachable!("the workload has no pools"),
        leasehold_schemas::Key::Placement(_) => unreachable!("the workload places nothing"),
    }
}

/// What one fault-free writer makes of partition `p`'s command log: its outcomes and its state.
async fn reference(log: &Embedded, p: u32) -> (Vec<Outcome>, PartitionState, BTreeSet<u64>) {
    let mut state = PartitionState::new(p, PARTITIONS).with_split_budget(SPLIT_BUDGET);
    let mut outcomes = Vec::new();
    let mut dead = BTreeSet::new();
    let mut after = 0;
    loop {
        let batch = log.read_commands(p, after, 100).await.unwrap();
        let Some(last) = batch.last() else { break };
        after = last.seq;
        for command in batch {
            let Ok(envelope) = admit(p, PARTITIONS, &command) else {
                dead.insert(command.seq);
                continue;
            };
            let ctx = Ctx { cmd_seq: command.seq, log_time: command.time };
            if let Decided::Append(outcome) = decide(&state, &ctx, &envelope).unwrap() {
                apply(&mut state, &outcome).unwrap();
                outcomes.push(outcome);
                while state.pending().is_some() {
                    let part = continue_work(&state).unwrap();
                    apply(&mut state, &part).unwrap();
                    outcomes.push(part);
                }
            }
        }
    }
    (outcomes, state, dead)
}

async fn logged(log: &Embedded, p: u32) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let batch = log.read_outcomes(&OutcomeFilter::Partition(p), from, 200).await.unwrap();
        let Some(last) = batch.last() else { return out };
        from = last.seq + 1;
        out.extend(batch.iter().map(|s| codec::decode_outcome(&s.payload).unwrap()));
    }
}

/// Registers the agents first and learns their epochs from a driver that decides the same registrations.
async fn register(log: &Embedded, rng: &mut Rng) -> Vec<(AgentName, Position)> {
    let names: Vec<AgentName> = ["w0", "w1", "w2"].iter().map(|n| AgentName::new(*n).unwrap()).collect();
    let mut drivers: BTreeMap<u32, Driver> = BTreeMap::new();
    let mut agents = Vec::new();
    for (i, agent) in names.into_iter().enumerate() {
        let p = partition_of_agent(&agent, PARTITIONS);
        let at = Workload::now();
        let body = Register {
            settings: Some(AgentSettings::default()),
            ..Register::new(agent.clone(), Uuid::from_u128(u128::from(rng.next_u64()) | 1 << 100))
        };
        let envelope = Envelope::new(
            CommandId::from_parts(at.0, [9, i as u8, 0, 0, 0, 0, 0, 0, 0, 0]),
            Issuer::new(agent.as_str()).unwrap(),
            at,
            body,
        );
        let driver = drivers.entry(p).or_insert_with(|| Driver::new(p, PARTITIONS, at));
        let outcome = driver.submit_envelope(&envelope);
        let epoch = outcome
            .positioned_effects()
            .find_map(|(position, effect)| matches!(effect, Effect::AgentRegistered { .. }).then_some(position))
            .expect("a first registration is accepted");
        publish(log, &envelope, &envelope.command_id.to_string()).await;
        agents.push((agent, epoch));
    }
    agents
}

async fn run_seed(seed: u64) -> Faults {
    let base = tokio::time::Instant::now();
    let clock: leasehold_log::embedded::Clock =
        Arc::new(move || Timestamp(START + u64::try_from(base.elapsed().as_millis()).unwrap_or(0)));
    let log = Embedded::in_memory(PARTITIONS, clock).unwrap();
    let mut rng = Rng::new(seed);
    let agents = register(&log, &mut rng).await;
    let faults = Arc::new(Mutex::new(Faults::default()));
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for (w, name) in ["worker-a", "worker-b"].into_iter().enumerate() {
        let sim: SimLog = Intercepted {
            log: log.clone(),
            hooks: Faulty { rng: Arc::new(Mutex::new(Rng::new(seed ^ (0xa5a5 + w as u64)))), faults: faults.clone() },
        };
        let config = WorkerConfig {
            name: name.to_owned(),
            partitions: None,
            retry_own: Duration::from_millis(300),
            takeover_after: None,
            writer: WriterConfig {
                max_batch: 1 + (seed % 7) as usize,
                // One record per append (no group commit) to a thousand; the small groups split long decisions
                // into several batches.
                max_append_records: [1, 2, 3, 5, 1000][(seed % 5) as usize],
                poll: Duration::from_millis(500),
                split_budget: Some(SPLIT_BUDGET),
                snapshot_every: 1 + seed % 5,
                ..WriterConfig::default()
            },
        };
        workers.push(tokio::spawn(leasehold_worker::run(sim, config, shutdown.clone())));
    }
    let work = Workload {
        rng: Rng::new(seed.wrapping_mul(31)),
        agents,
        resources: Vec::new(),
        obs: BTreeMap::new(),
        published: Vec::new(),
        n_ids: 0,
        bad: BTreeSet::new(),
    };
    let n = 20 + (seed % 40) as usize;
    let work = produce(log.clone(), work, n).await;

    let mut expected = BTreeMap::new();
    let mut expected_dead = BTreeSet::new();
    for p in 0..PARTITIONS {
        let (outcomes, state, dead) = reference(&log, p).await;
        expected_dead.extend(dead);
        expected.insert(p, (outcomes, state));
    }
    assert_eq!(expected_dead, work.bad, "seed {seed}: the bad commands are exactly what one writer dead-letters");
    // Wait (in simulated time) until the workers have caught up.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(3600);
    loop {
        let mut done = true;
        for (p, (outcomes, _)) in &expected {
            done &= logged(&log, *p).await.len() >= outcomes.len();
        }
        let dead = log.read_dead_letters(1, 10_000).await.unwrap();
        done &= dead.len() >= expected_dead.len();
        if done {
            break;
        }
        assert!(tokio::time::Instant::now() < give_up, "seed {seed}: the workers did not catch up in an hour");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    shutdown.cancel();
    for worker in workers {
        let report = worker.await.unwrap();
        assert!(report.stopped.is_empty(), "seed {seed}: partitions stopped: {:?}", report.stopped);
    }

    for (p, (outcomes, state)) in expected {
        let actual = logged(&log, p).await;
        assert_eq!(actual.len(), outcomes.len(), "seed {seed}, partition {p}: outcome count");
        for (i, (got, want)) in actual.iter().zip(&outcomes).enumerate() {
            assert_eq!(got, want, "seed {seed}, partition {p}: outcome {i} differs from one fault-free writer's");
        }
        let folded =
            fold_partition(&log, p, 0, &WriterConfig { split_budget: Some(SPLIT_BUDGET), ..WriterConfig::default() })
                .await
                .unwrap_or_else(|e| panic!("seed {seed}, partition {p}: {e}"));
        assert!(folded.state == state, "seed {seed}, partition {p}: the folded state differs from one writer's");
        invariants::check(&folded.state).unwrap_or_else(|e| panic!("seed {seed}, partition {p}: {e}"));
    }
    let dead: BTreeSet<u64> =
        log.read_dead_letters(1, 10_000).await.unwrap().into_iter().map(|(_, l)| l.source_seq).collect();
    assert_eq!(dead, expected_dead, "seed {seed}: dead letters");
    Arc::try_unwrap(faults).map(|m| m.into_inner().unwrap()).unwrap_or_default()
}

fn simulate(seed: u64) -> Faults {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("runtime");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(run_seed(seed))));
    match result {
        Ok(faults) => faults,
        Err(panic) => {
            eprintln!("simulation seed {seed} failed; replay it with LH_SIM_SEED={seed}");
            std::panic::resume_unwind(panic)
        }
    }
}

#[test]
fn writers_under_seeded_faults_decide_as_one_writer_would() {
    if let Some(seed) = std::env::var("LH_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        let faults = simulate(seed);
        eprintln!("seed {seed}: {faults:?}");
        return;
    }
    let seeds: u64 = std::env::var("LH_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    // Seeds are independent (each its own runtime and log), so they run on every core: a thread takes the next seed
    // not taken yet. Which thread runs a seed changes nothing in it.
    let next = std::sync::atomic::AtomicU64::new(0);
    // A failed seed stops the other threads at their next seed (its own panic fails the test).
    let failed = std::sync::atomic::AtomicBool::new(false);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total = std::thread::scope(|scope| {
        let runners: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut faults = Faults::default();
                    loop {
                        let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if seed >= seeds || failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return faults;
                        }
                        match std::panic::catch_unwind(|| simulate(seed)) {
                            Ok(found) => faults += found,
                            Err(panic) => {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                std::panic::resume_unwind(panic)
                            }
                        }
                    }
                })
            })
            .collect();
        let mut total = Faults::default();
        for runner in runners {
            match runner.join() {
                Ok(faults) => total += faults,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        total
    });
    eprintln!("{seeds} seeds: {total:?}");
    // Every kind of fault happened (a fault layer that never fires tests nothing).
    for (name, n) in [
        ("busy", total.busy),
        ("timed out", total.timed_out),
        ("acks lost", total.acks_lost),
        ("stalls", total.stalls),
        ("moves between parts", total.moves_between_parts),
        ("holds dropped", total.holds_dropped),
        ("redeliveries", total.redeliveries),
        ("bad snapshots", total.bad_snapshots),
        ("snapshots used", total.snapshots_used),
        ("batches landed", total.batches_landed),
        ("batches abandoned half-way", total.batches_abandoned),
        ("batch answers lost after landing", total.batch_answers_lost),
        ("too many open batches", total.batches_busy),
        ("batches over a server limit", total.batches_too_large),
        ("takeovers between batches of one decision's parts", total.moves_between_batches_of_parts),
    ] {
        assert!(n > 0 || seeds < 50, "no {name} fault in {seeds} seeds");
    }
}
