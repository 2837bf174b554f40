//! A deterministic simulation of the writers (the FoundationDB / TigerBeetle way): two real workers (`run`: the
//! share of partitions among live workers, taking what nobody serves, the writers) serve the partitions of an
//! in-memory embedded log on a single-threaded runtime with paused time, while a seeded fault layer between them
//! and the log loses acks, times appends out (landed or not), answers "busy", stalls a writer while its hold moves
//! to the other one (so it resumes with a buffered append under a stale fence), moves holds between the parts of a
//! decision, and delivers commands again and out of order. Writers group-commit (each seed its own group size, from
//! one record to a thousand), so the same faults hit batches: a batch abandoned half-way (nothing stored), a commit
//! answer lost after the batch landed, too many open batches, a batch over a server's limit (appended again in
//! smaller slices), a takeover between two batches of one decision's parts. A producer publishes a seeded workload
//! meanwhile: registrations, allocations, reports, heartbeats, leases (some with a ttl or a wait timeout, renewed with
//! the token their grant gave), the sweeper's requests that time makes due (a lease expired, a wait timed out, an
//! agent stalled; early ones are refused), releases, retirements decided in parts (one mid-workload, one at the
//! end), retried commands, garbage and commands on the wrong subject. Between commands the log's clock jumps forward
//! (minutes to hours) or back (seconds to minutes): the writers see log time that is not monotonic, as a JetStream
//! stream's is when its leader moves to a server whose clock is behind (the embedded log itself never stamps a time
//! below the last; the writers and the reference read the clock's own reading). Writers store snapshots every few
//! outcomes and load from them; the fault layer sometimes offers a snapshot no writer may use (another decider
//! version, past the log's end, garbage) instead.
//!
//! After each seed: the outcomes in the log are exactly those one fault-free writer makes from the same command log
//! (so every command has exactly one outcome, in command order, each part once), the chain is unbroken, the state
//! folded from the log equals that writer's, `invariants::check` holds, and exactly the bad commands are dead
//! letters. A failing seed prints itself; `LH_SIM_SEED=N` replays it exactly, `LH_SIM_SEEDS=N` runs more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use leasehold_domain::driver::Driver;
use leasehold_domain::{Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, invariants};
use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::intercept::{Intercept, Intercepted, SeededRng};
use leasehold_log::reading::{Delivery, ModelConsumer, Next, Reader, read_by_sequence};
use leasehold_log::{Appended, CommandRecord, Error, Log, OutcomeFilter, OutcomeRecord, Owner, Snapshot};
use leasehold_schemas::command::{
    Acquire, Allocate, ExpireLease, Heartbeat, MarkStalled, Register, Release, Renew, ReportCreated, RetireAgent,
    WaitTimeout,
};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Millis, Position, ResourceId, Timestamp};
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
    /// The consumer's side (the reading path, `leasehold_log::reading`): deliveries that went to another client,
    /// came out of order, came late (a slow route), came twice, pending ones delivered again when their ack wait
    /// ran out, and reads by sequence a lagging replica answered short.
    deliveries_elsewhere: u64,
    deliveries_reordered: u64,
    deliveries_late: u64,
    deliveries_doubled: u64,
    consumer_redeliveries: u64,
    reads_cut_short: u64,
    bad_snapshots: u64,
    snapshots_used: u64,
    /// The same faults, where the append was a batch of several records.
    batches_landed: u64,
    batches_abandoned: u64,
    batch_answers_lost: u64,
    batches_busy: u64,
    batches_too_large: u64,
    moves_between_batches_of_parts: u64,
    /// The log's clock jumped between two commands.
    time_jumps_forward: u64,
    time_jumps_back: u64,
    /// Not faults: what the jumps reached in the outcomes (a decision at a log time below an earlier one's; time
    /// ending leases, waits and agents' liveness), so that a workload the jumps do not touch fails the run.
    decided_back_in_time: u64,
    leases_expired: u64,
    leases_renewed: u64,
    waits_timed_out: u64,
    agents_stalled: u64,
    /// A worker asked to stop mid-run (a rolling restart), and the stops that decided commands it had been sent.
    clean_stops: u64,
    decided_at_a_stop: u64,
}

impl std::ops::AddAssign for Faults {
    fn add_assign(&mut self, f: Faults) {
        self.busy += f.busy;
        self.clean_stops += f.clean_stops;
        self.decided_at_a_stop += f.decided_at_a_stop;
        self.timed_out += f.timed_out;
        self.acks_lost += f.acks_lost;
        self.stalls += f.stalls;
        self.moves_between_parts += f.moves_between_parts;
        self.holds_dropped += f.holds_dropped;
        self.redeliveries += f.redeliveries;
        self.deliveries_elsewhere += f.deliveries_elsewhere;
        self.deliveries_reordered += f.deliveries_reordered;
        self.deliveries_late += f.deliveries_late;
        self.deliveries_doubled += f.deliveries_doubled;
        self.consumer_redeliveries += f.consumer_redeliveries;
        self.reads_cut_short += f.reads_cut_short;
        self.bad_snapshots += f.bad_snapshots;
        self.snapshots_used += f.snapshots_used;
        self.batches_landed += f.batches_landed;
        self.batches_abandoned += f.batches_abandoned;
        self.batch_answers_lost += f.batch_answers_lost;
        self.batches_busy += f.batches_busy;
        self.batches_too_large += f.batches_too_large;
        self.moves_between_batches_of_parts += f.moves_between_batches_of_parts;
        self.time_jumps_forward += f.time_jumps_forward;
        self.time_jumps_back += f.time_jumps_back;
        self.decided_back_in_time += f.decided_back_in_time;
        self.leases_expired += f.leases_expired;
        self.leases_renewed += f.leases_renewed;
        self.waits_timed_out += f.waits_timed_out;
        self.agents_stalled += f.agents_stalled;
    }
}

/// Seeded faults between the embedded log and one worker.
#[derive(Clone)]
struct Faulty {
    rng: Arc<Mutex<Rng>>,
    faults: Arc<Mutex<Faults>>,
    clock: Arc<LogClock>,
    /// The server's writer consumers, one per partition, shared by the workers.
    consumers: Arc<Mutex<BTreeMap<u32, ModelConsumer>>>,
    /// This worker's stop, when the seed has it asked to stop mid-run (a rolling restart): an owner asks for it
    /// once, as it hands out a batch with more delivered behind it.
    stop: Option<CancellationToken>,
}

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

/// The embedded log as one worker of the simulation sees it.
type SimLog = Intercepted<Embedded, Faulty>;

/// The log's clock: simulated time since the start, moved by the jumps so far. The embedded log stamps a command
/// with the latest reading it has given (it never goes back); a JetStream stream stamps its leader's clock, which
/// does. What the writers (and the reference) read is the clock's own reading at the publish, as JetStream's.
#[derive(Debug)]
struct LogClock {
    base: tokio::time::Instant,
    /// Milliseconds added by the jumps so far (below zero after more back than forward).
    offset: AtomicI64,
    /// The reading the embedded log took last (at the latest publish).
    last_reading: AtomicU64,
    /// Command sequence -> the reading at its publish.
    stamped: Mutex<BTreeMap<u64, Timestamp>>,
}

impl LogClock {
    fn new() -> Self {
        LogClock {
            base: tokio::time::Instant::now(),
            offset: Default::default(),
            last_reading: Default::default(),
            stamped: Mutex::default(),
        }
    }

    /// Reads the clock (what the embedded log calls when it stamps a publish).
    fn read(&self) -> Timestamp {
        let elapsed = i64::try_from(self.base.elapsed().as_millis()).unwrap_or(i64::MAX);
        let offset = self.offset.load(Ordering::SeqCst);
        let reading = u64::try_from(START as i64 + elapsed + offset).expect("the clock stays after 1970");
        self.last_reading.store(reading, Ordering::SeqCst);
        Timestamp(reading)
    }

    /// The issuers' clock (what they stamp their ids and `issued_at` with): simulated time since the start, which
    /// no jump of the log's clock moves.
    fn issuers_now(&self) -> Timestamp {
        Timestamp(START + u64::try_from(self.base.elapsed().as_millis()).unwrap_or(0))
    }

    fn jump(&self, by_ms: i64) {
        self.offset.fetch_add(by_ms, Ordering::SeqCst);
    }

    fn offset(&self) -> i64 {
        self.offset.load(Ordering::SeqCst)
    }

    /// Records that the command just published at `seq` was stamped with the clock's last reading.
    fn published(&self, seq: u64) {
        let reading = Timestamp(self.last_reading.load(Ordering::SeqCst));
        self.stamped.lock().unwrap().insert(seq, reading);
    }

    /// `command` with the time the clock read at its publish. Every command is recorded as it is published, before
    /// the producer yields (on this one thread, no writer reads a command in between).
    fn as_stamped(&self, mut command: CommandRecord) -> CommandRecord {
        command.time = *self
            .stamped
            .lock()
            .unwrap()
            .get(&command.seq)
            .unwrap_or_else(|| panic!("command {} was read before its publish was recorded", command.seq));
        command
    }
}

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
        Ok(owner.map(|inner| SimOwner {
            inner,
            log: log.clone(),
            faults: self.clone(),
            reader: Reader::new(),
            late: Vec::new(),
        }))
    }
}

/// A writer's hold as the JetStream backend has it: the embedded log's hold stands for the pin, a model of the
/// partition's consumer (shared by the workers) delivers the commands, and the reading state machine the JetStream
/// owner runs ([`Reader`]) decides what may be handed out.
#[derive(Debug)]
struct SimOwner {
    inner: EmbeddedOwner,
    log: Embedded,
    faults: Faulty,
    reader: Reader,
    /// Deliveries held back on the way (a slow route): they arrive at a later call.
    late: Vec<Delivery>,
}

impl SimOwner {
    /// The consumer's deliveries for one pull, through the faults, into the reader.
    async fn pull(&mut self) -> Result<(), Error> {
        let partition = self.inner.partition();
        let position = self.faults.consumers.lock().unwrap().get(&partition).map_or(0, ModelConsumer::position);
        let log: Vec<CommandRecord> = self
            .log
            .read_commands(partition, position, 64)
            .await?
            .into_iter()
            .map(|c| self.faults.clock.as_stamped(c))
            .collect();
        let max = 1 + self.faults.below(8) as usize;
        let redeliver = self.faults.roll(8);
        let mut batch = {
            let mut consumers = self.faults.consumers.lock().unwrap();
            let consumer = consumers.entry(partition).or_insert_with(|| ModelConsumer::starting_after(0));
            if redeliver && consumer.pending() > 0 {
                self.faults.count(|f| f.consumer_redeliveries += 1);
            }
            consumer.pull(&log, max, redeliver)
        };
        if !batch.is_empty() && self.faults.roll(8) {
            // Delivered to another client (the other worker, pulling with a pin that has not expired yet).
            self.faults.count(|f| f.deliveries_elsewhere += 1);
            batch.remove(self.faults.below(batch.len() as u64) as usize);
        }
        if batch.len() > 1 && self.faults.roll(8) {
            self.faults.count(|f| f.deliveries_reordered += 1);
            let at = self.faults.below(batch.len() as u64 - 1) as usize;
            batch.swap(at, at + 1);
        }
        if !batch.is_empty() && self.faults.roll(8) {
            self.faults.count(|f| f.deliveries_late += 1);
            self.late.push(batch.remove(0));
        }
        if !self.late.is_empty() && self.faults.roll(30) {
            batch.push(self.late.remove(0));
        }
        if !batch.is_empty() && self.faults.roll(5) {
            self.faults.count(|f| f.deliveries_doubled += 1);
            batch.push(batch[0].clone());
        }
        for delivery in batch {
            self.reader.delivered(delivery);
        }
        Ok(())
    }

    /// Answers the reader's read by sequence, from a replica that may lag.
    async fn read(&mut self, after: u64, max: usize, through: u64, bounded: bool) -> Result<(), Error> {
        let partition = self.inner.partition();
        let (log, faults) = (&self.log, &self.faults);
        let replica = |after: u64, ask: usize| async move {
            let mut found: Vec<CommandRecord> = log
                .read_commands(partition, after, ask)
                .await?
                .into_iter()
                .map(|c| faults.clock.as_stamped(c))
                .collect();
            if !found.is_empty() && faults.roll(10) {
                // A replica that lags answers with a prefix.
                faults.count(|f| f.reads_cut_short += 1);
                found.truncate(faults.below(found.len() as u64) as usize);
            }
            Ok(found)
        };
        let leader = |next: u64| async move {
            Ok(log.read_commands(partition, next - 1, 1).await?.into_iter().next().map(|c| faults.clock.as_stamped(c)))
        };
        // The JetStream owner's read, over the faulty replicas and the embedded log as the leader.
        let (found, covered) = read_by_sequence(after, max.max(1), through, bounded, replica, leader).await?;
        self.reader.read(after, found, covered);
        Ok(())
    }
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
        self.inner.keep_alive().await?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut batch = Vec::new();
        'wait: for _ in 0..8 {
            self.pull().await?;
            for _ in 0..4 {
                match self.reader.next(after, max) {
                    Next::Ready(found) => {
                        batch = found;
                        break 'wait;
                    }
                    Next::Read { after: from, through, bounded } => self.read(from, max, through, bounded).await?,
                    Next::Wait => break,
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            // Wait for a command after what the reader knows (the embedded log wakes its owner on each).
            let from = self.reader.known().unwrap_or(after).max(after);
            if self.inner.next_commands(from, 1, deadline - now).await?.is_empty() {
                break;
            }
        }
        if after > 0 && self.faults.roll(10) {
            // The writer's own guard: commands already handled, handed out again before the new ones.
            self.faults.count(|f| f.redeliveries += 1);
            let from = after.saturating_sub(1 + self.faults.below(4));
            let mut old = self.log.read_commands(partition, from, 2).await?;
            old.retain(|c| c.seq <= after);
            let mut old: Vec<CommandRecord> = old.into_iter().map(|c| self.faults.clock.as_stamped(c)).collect();
            old.append(&mut batch);
            batch = old;
        }
        if !batch.is_empty() && self.faults.roll(5) {
            let again = batch[0].clone();
            batch.insert(1.min(batch.len()), again);
        }
        if let Some(stop) = &self.faults.stop
            && !stop.is_cancelled()
            && self.reader.highest() > batch.last().map_or(after, |c| c.seq)
            && self.faults.roll(20)
        {
            self.faults.count(|f| f.clean_stops += 1);
            stop.cancel();
        }
        Ok(batch)
    }

    async fn keep_alive(&mut self) -> Result<(), Error> {
        self.inner.keep_alive().await
    }

    async fn done_through(&mut self, seq: u64) -> Result<(), Error> {
        self.reader.done_through(seq);
        if let Some(consumer) = self.faults.consumers.lock().unwrap().get_mut(&self.inner.partition()) {
            consumer.ack(seq);
        }
        self.inner.done_through(seq).await
    }

    async fn in_hand(&mut self, after: u64, max: usize, _wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        self.done_through(after).await?;
        // What the pulls in flight still bring.
        self.pull().await?;
        match self.reader.next(after, max) {
            Next::Ready(found) => {
                if !found.is_empty() {
                    self.faults.count(|f| f.decided_at_a_stop += 1);
                }
                Ok(found)
            }
            Next::Read { .. } | Next::Wait => Ok(Vec::new()),
        }
    }

    async fn release(self) {
        self.inner.release().await
    }
}

/// What the producer publishes.
struct Workload {
    rng: Rng,
    /// Draws the jumps of the log's clock, apart from `rng`.
    clock_rng: Rng,
    clock: Arc<LogClock>,
    faults: Arc<Mutex<Faults>>,
    agents: Vec<(AgentName, Position)>,
    resources: Vec<(usize, ResourceId)>,
    /// Leases asked for, with the agent (index) of their resource.
    leases: Vec<(usize, LeaseId)>,
    obs: BTreeMap<usize, u64>,
    published: Vec<Envelope>,
    n_ids: u64,
    /// Command log sequences of what must be dead-lettered.
    bad: BTreeSet<u64>,
}

impl Workload {
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

    /// Sometimes moves the log's clock before the next command: forward by a minute to three hours, or back by a
    /// second to three minutes (never more than four minutes behind the issuers' clock in all, past which every id
    /// they make would be refused as stamped ahead of the log). True after a jump forward.
    fn maybe_jump(&mut self) -> bool {
        let roll = self.clock_rng.below(100);
        if roll < 4 {
            let by = 60_000 + self.clock_rng.below(3 * 3_600_000);
            self.clock.jump(i64::try_from(by).unwrap());
            self.faults.lock().unwrap().time_jumps_forward += 1;
            return true;
        }
        if roll < 10 {
            let by = i64::try_from(1_000 + self.clock_rng.below(180_000)).unwrap();
            if self.clock.offset() - by >= -240_000 {
                self.clock.jump(-by);
                self.faults.lock().unwrap().time_jumps_back += 1;
            }
        }
        false
    }

    /// What a sweeper asks for once time has passed: the expiry or the wait timeout of the latest leases, and an
    /// agent's stall (each refused if it is not due after all).
    fn sweep(&mut self, at: Timestamp) -> Vec<Envelope> {
        let latest: Vec<(usize, LeaseId)> = self.leases.iter().rev().take(4).copied().collect();
        let mut asks = Vec::new();
        for (owner, lease) in latest {
            let agent = self.agents[owner].0.clone();
            let ask: Command = if self.rng.chance(70) {
                ExpireLease { agent, lease }.into()
            } else {
                WaitTimeout { agent, lease }.into()
            };
            asks.push(self.envelope("sweeper", ask, at));
        }
        let agent = self.agents[self.rng.below(self.agents.len() as u64) as usize].0.clone();
        asks.push(self.envelope("sweeper", MarkStalled { agent }, at));
        asks
    }

    /// A ttl or a wait of a second to two minutes (`percent` of the time), or none: short enough that the jumps of
    /// the log's clock, and often the workload's own time, see it end.
    fn maybe_millis(&mut self, percent: u64) -> Option<Millis> {
        self.rng.chance(percent).then(|| Millis(1_000 + self.rng.below(120_000)))
    }

    async fn next_command(&mut self, log: &Embedded, at: Timestamp) -> Envelope {
        let a = self.rng.below(self.agents.len() as u64) as usize;
        let (agent, epoch) = self.agents[a].clone();
        let pick = self.rng.below(100);
        let resource =
            (!self.resources.is_empty()).then(|| self.resources[self.rng.below(self.resources.len() as u64) as usize]);
        let lease = (!self.leases.is_empty()).then(|| self.leases[self.rng.below(self.leases.len() as u64) as usize]);
        match (pick, resource, lease) {
            (0..25, _, _) | (_, None, _) => {
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
            (25..45, Some((owner, resource)), _) => {
                let (agent, epoch) = self.agents[owner].clone();
                let obs = self.obs.entry(owner).or_insert(0);
                *obs += 1;
                let body = ReportCreated { agent: agent.clone(), epoch, obs: *obs, resource, native_id: None };
                self.envelope(agent.as_str(), body, at)
            }
            (45..57, _, _) => self.envelope(agent.clone().as_str(), Heartbeat { agent, epoch }, at),
            (57..71, Some((owner, resource)), _) | (71..89, Some((owner, resource)), None) => {
                let agent = self.agents[owner].0.clone();
                let lease = LeaseId::from_parts(at.0, self.entropy());
                self.leases.push((owner, lease));
                let (ttl, wait_timeout) = (self.maybe_millis(60), self.maybe_millis(30));
                let body = Acquire { agent, resource, lease, holder: "job".to_owned(), ttl, wait_timeout, priority: 0 };
                self.envelope("ci", body, at)
            }
            (71..77, _, Some((owner, lease))) => {
                // Renewed with the token of its grant, once granted; before, with a wrong one.
                let agent = self.agents[owner].0.clone();
                let token = token_of(log, &self.clock, &agent, lease).await.unwrap_or(Position(1));
                let ttl = self.maybe_millis(50);
                self.envelope("ci", Renew { agent, lease, token, ttl }, at)
            }
            (77..83, _, Some((owner, lease))) => {
                let agent = self.agents[owner].0.clone();
                self.envelope("sweeper", ExpireLease { agent, lease }, at)
            }
            (83..86, _, Some((owner, lease))) => {
                let agent = self.agents[owner].0.clone();
                self.envelope("sweeper", WaitTimeout { agent, lease }, at)
            }
            (86..89, _, _) => self.envelope("sweeper", MarkStalled { agent }, at),
            (_, Some((owner, resource)), _) => {
                let agent = self.agents[owner].0.clone();
                self.envelope("ops", Release { agent, resource, reason: None }, at)
            }
        }
    }
}

/// The token of `lease`: the position of its grant, if one fault-free writer deciding the commands published so
/// far grants it (so the workload is the seed's alone, whatever the writers have decided yet).
async fn token_of(log: &Embedded, clock: &LogClock, agent: &AgentName, lease: LeaseId) -> Option<Position> {
    let (outcomes, _, _) = reference(log, clock, partition_of_agent(agent, PARTITIONS)).await;
    outcomes.iter().find_map(|o| {
        o.positioned_effects().find_map(|(position, effect)| {
            matches!(effect, Effect::LeaseGranted { lease: granted, .. } if *granted == lease).then_some(position)
        })
    })
}

/// Publishes `envelope` and records the log clock's reading for it; returns its sequence.
async fn publish(log: &Embedded, clock: &LogClock, envelope: &Envelope, msg_id: &str) -> u64 {
    let payload = codec::encode_command(envelope).unwrap();
    publish_bytes(log, clock, &ingress_subject_of(&envelope.body), msg_id, payload.into()).await
}

async fn publish_bytes(log: &Embedded, clock: &LogClock, subject: &str, msg_id: &str, payload: Bytes) -> u64 {
    let published = log.publish_command(subject, msg_id, payload).await.unwrap();
    assert!(!published.duplicate, "every publish of the simulation has a message id of its own");
    clock.published(published.seq);
    published.seq
}

async fn produce(log: Embedded, mut work: Workload, n: usize) -> Workload {
    let clock = work.clock.clone();
    for i in 0..n {
        if i == n / 2 {
            // Mid-workload, an agent retires: the release of what it holds is decided in parts, and the commands
            // after it wait for every part.
            let at = clock.issuers_now();
            let agent = work.agents[2].0.clone();
            let envelope = work.envelope("ops", RetireAgent::new(agent), at);
            publish(&log, &clock, &envelope, &envelope.command_id.to_string()).await;
        }
        tokio::time::sleep(Duration::from_millis(work.rng.below(400))).await;
        let at = clock.issuers_now();
        if work.maybe_jump() {
            for ask in work.sweep(at) {
                publish(&log, &clock, &ask, &ask.command_id.to_string()).await;
            }
        }
        let roll = work.rng.below(100);
        if roll < 4 && !work.published.is_empty() {
            // A producer retries a command after the dedupe window: the writer answers it from the log.
            let earlier = work.published[work.rng.below(work.published.len() as u64) as usize].clone();
            publish(&log, &clock, &earlier, &format!("{}-retry-{}", earlier.command_id, work.n_ids)).await;
            work.n_ids += 1;
        } else if roll < 7 {
            let subject = format!("lh.in.op.{}._", work.agents[0].0);
            let garbage =
                [b"\x01\xff\xfe".as_slice(), b"{\"schema_version\":1", b"", b"\x07zz"][work.rng.below(4) as usize];
            let msg_id = format!("junk-{}", work.n_ids);
            let seq = publish_bytes(&log, &clock, &subject, &msg_id, Bytes::from_static(garbage)).await;
            work.n_ids += 1;
            work.bad.insert(seq);
        } else if roll < 9 {
            // A command about one agent published on another agent's subject.
            let envelope = work.next_command(&log, at).await;
            let other = work.agents.iter().find(|(a, _)| Some(a) != Some(&key_agent(&envelope))).cloned();
            if let Some((other, _)) = other {
                let subject = ingress_subject_of(&envelope.body)
                    .replace(&format!(".{}.", key_agent(&envelope)), &format!(".{other}."));
                let payload = codec::encode_command(&envelope).unwrap();
                let seq = publish_bytes(&log, &clock, &subject, &envelope.command_id.to_string(), payload.into()).await;
                work.bad.insert(seq);
            }
        } else {
            let envelope = work.next_command(&log, at).await;
            publish(&log, &clock, &envelope, &envelope.command_id.to_string()).await;
            work.published.push(envelope);
        }
    }
    // The last act: one agent retires, and the release of everything it holds is decided in parts.
    let at = clock.issuers_now();
    let agent = work.agents[0].0.clone();
    let envelope = work.envelope("ops", RetireAgent::new(agent), at);
    publish(&log, &clock, &envelope, &envelope.command_id.to_string()).await;
    work
}

fn key_agent(envelope: &Envelope) -> AgentName {
    match envelope.body.key() {
        leasehold_schemas::Key::Agent(agent) => agent,
        leasehold_schemas::Key::Pool(_) => unreachable!("the workload has no pools"),
        leasehold_schemas::Key::Placement(_) => unreachable!("the workload places nothing"),
    }
}

/// What one fault-free writer makes of partition `p`'s command log (read as the writers read it, with the log
/// clock's readings): its outcomes and its state.
async fn reference(log: &Embedded, clock: &LogClock, p: u32) -> (Vec<Outcome>, PartitionState, BTreeSet<u64>) {
    let mut state = PartitionState::new(p, PARTITIONS).with_split_budget(SPLIT_BUDGET);
    let mut outcomes = Vec::new();
    let mut dead = BTreeSet::new();
    let mut after = 0;
    loop {
        let batch = log.read_commands(p, after, 100).await.unwrap();
        let Some(last) = batch.last() else { break };
        after = last.seq;
        for command in batch {
            let command = clock.as_stamped(command);
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
async fn register(log: &Embedded, clock: &LogClock, rng: &mut Rng) -> Vec<(AgentName, Position)> {
    let names: Vec<AgentName> = ["w0", "w1", "w2"].iter().map(|n| AgentName::new(*n).unwrap()).collect();
    let mut drivers: BTreeMap<u32, Driver> = BTreeMap::new();
    let mut agents = Vec::new();
    for (i, agent) in names.into_iter().enumerate() {
        let p = partition_of_agent(&agent, PARTITIONS);
        let at = clock.issuers_now();
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
        publish(log, clock, &envelope, &envelope.command_id.to_string()).await;
        agents.push((agent, epoch));
    }
    agents
}

async fn run_seed(seed: u64) -> Faults {
    let clock = Arc::new(LogClock::new());
    let reads = clock.clone();
    let log = Embedded::in_memory(PARTITIONS, Arc::new(move || reads.read())).unwrap();
    let mut rng = Rng::new(seed);
    let agents = register(&log, &clock, &mut rng).await;
    let faults = Arc::new(Mutex::new(Faults::default()));
    let consumers = Arc::new(Mutex::new(BTreeMap::new()));
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for (w, name) in ["worker-a", "worker-b"].into_iter().enumerate() {
        // On even seeds the first worker is asked to stop mid-run: it decides what it was sent, snapshots and gives
        // its partitions up; the other takes them over.
        let stop = shutdown.child_token();
        let sim: SimLog = Intercepted {
            log: log.clone(),
            hooks: Faulty {
                rng: Arc::new(Mutex::new(Rng::new(seed ^ (0xa5a5 + w as u64)))),
                faults: faults.clone(),
                clock: clock.clone(),
                consumers: consumers.clone(),
                stop: (w == 0 && seed.is_multiple_of(2)).then(|| stop.clone()),
            },
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
        workers.push(tokio::spawn(leasehold_worker::run(sim, config, stop)));
    }
    let work = Workload {
        rng: Rng::new(seed.wrapping_mul(31)),
        clock_rng: Rng::new(seed ^ 0x71c0_c10c),
        clock: clock.clone(),
        faults: faults.clone(),
        agents,
        resources: Vec::new(),
        leases: Vec::new(),
        obs: BTreeMap::new(),
        published: Vec::new(),
        n_ids: 0,
        bad: BTreeSet::new(),
    };
    let n = 20 + (seed % 40) as usize;
    let work = produce(log.clone(), work, n).await;
    let bad = work.bad.clone();
    drop(work);

    let mut expected = BTreeMap::new();
    let mut expected_dead = BTreeSet::new();
    for p in 0..PARTITIONS {
        let (outcomes, state, dead) = reference(&log, &clock, p).await;
        expected_dead.extend(dead);
        check_times(seed, p, &outcomes, &mut faults.lock().unwrap());
        expected.insert(p, (outcomes, state));
    }
    assert_eq!(expected_dead, bad, "seed {seed}: the bad commands are exactly what one writer dead-letters");
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
    // Taken, not unwrapped: a task the runtime has not dropped yet may still hold a clone.
    std::mem::take(&mut *faults.lock().unwrap())
}

/// Checks what the domain promises whatever the log's clock does (the writers see it go back) in one partition's
/// outcomes, and counts what the jumps reached: no decision is made at a time before an earlier one, nor before its
/// own log time; a ttl or a wait runs from the decision that starts it; no lease expires and no wait times out
/// before its time.
fn check_times(seed: u64, p: u32, outcomes: &[Outcome], f: &mut Faults) {
    let mut latest_log_time = Timestamp(0);
    let mut last_decided = Timestamp(0);
    // Lease -> when it expires (active) or stops waiting (waiting or queued).
    let mut deadlines: BTreeMap<LeaseId, Timestamp> = BTreeMap::new();
    for o in outcomes {
        let at = format!("seed {seed}, partition {p}, command {} part {}", o.cmd_seq, o.part);
        assert!(
            o.decided_at >= last_decided,
            "{at}: decided at {}, before an earlier decision ({last_decided})",
            o.decided_at
        );
        last_decided = o.decided_at;
        if o.part == 0 {
            assert!(
                o.decided_at >= o.log_time,
                "{at}: decided at {}, before its log time {}",
                o.decided_at,
                o.log_time
            );
            if o.log_time < latest_log_time {
                f.decided_back_in_time += 1;
            }
            latest_log_time = latest_log_time.max(o.log_time);
        }
        for effect in o.effects() {
            match effect {
                Effect::LeaseGranted { lease, ttl, expires_at, .. }
                | Effect::LeaseRenewed { lease, ttl, expires_at } => {
                    assert_eq!(
                        *expires_at,
                        ttl.map(|ttl| o.decided_at.saturating_add(ttl)),
                        "{at}: the ttl of lease {lease} runs from this decision"
                    );
                    if matches!(effect, Effect::LeaseRenewed { .. }) {
                        f.leases_renewed += 1;
                    }
                    match expires_at {
                        Some(expires_at) => deadlines.insert(*lease, *expires_at),
                        None => deadlines.remove(lease),
                    };
                }
                Effect::LeaseWaiting { lease, wait_until: Some(until), .. }
                | Effect::LeaseQueued { lease, wait_until: Some(until), .. } => {
                    assert!(*until > o.decided_at, "{at}: lease {lease} waits until {until}, not after this decision");
                    deadlines.insert(*lease, *until);
                }
                Effect::LeaseExpired { lease } => {
                    let due =
                        deadlines.get(lease).unwrap_or_else(|| panic!("{at}: lease {lease} expired without a ttl"));
                    assert!(
                        *due <= o.decided_at,
                        "{at}: lease {lease} expired at {} before its time {due}",
                        o.decided_at
                    );
                    f.leases_expired += 1;
                }
                Effect::LeaseFailed { lease } if o.command.type_name == "sys.wait-timeout" => {
                    let due =
                        deadlines.get(lease).unwrap_or_else(|| panic!("{at}: lease {lease} timed out without a wait"));
                    assert!(
                        *due <= o.decided_at,
                        "{at}: the wait of lease {lease} timed out at {} before {due}",
                        o.decided_at
                    );
                    f.waits_timed_out += 1;
                }
                Effect::AgentStalled { .. } => f.agents_stalled += 1,
                _ => {}
            }
        }
    }
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
    let next = AtomicU64::new(0);
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
        ("deliveries to another client", total.deliveries_elsewhere),
        ("deliveries out of order", total.deliveries_reordered),
        ("late deliveries", total.deliveries_late),
        ("deliveries twice", total.deliveries_doubled),
        ("redeliveries after the ack wait", total.consumer_redeliveries),
        ("reads cut short by a lagging replica", total.reads_cut_short),
        ("bad snapshots", total.bad_snapshots),
        ("snapshots used", total.snapshots_used),
        ("batches landed", total.batches_landed),
        ("batches abandoned half-way", total.batches_abandoned),
        ("batch answers lost after landing", total.batch_answers_lost),
        ("too many open batches", total.batches_busy),
        ("batches over a server limit", total.batches_too_large),
        ("takeovers between batches of one decision's parts", total.moves_between_batches_of_parts),
        ("jumps of the log's clock forward", total.time_jumps_forward),
        ("jumps of the log's clock back", total.time_jumps_back),
        ("decisions at a log time below an earlier one's", total.decided_back_in_time),
        ("leases expired", total.leases_expired),
        ("workers stopped cleanly mid-run", total.clean_stops),
        ("clean stops that decided what they had been sent", total.decided_at_a_stop),
        ("leases renewed", total.leases_renewed),
        ("waits timed out", total.waits_timed_out),
        ("agents stalled", total.agents_stalled),
    ] {
        assert!(n > 0 || seeds < 50, "no {name} fault in {seeds} seeds");
    }
}
