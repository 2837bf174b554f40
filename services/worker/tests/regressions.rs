//! Regressions red-team reviews found in the writers, each as it was triggered (some on a real nats-server).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::intercept::{Intercept, Intercepted};
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsServer, ServerOptions};
use leasehold_log::{CommandRecord, Error, Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::Uuid;
use leasehold_schemas::command::{Allocate, Register, RetireAgent};
use leasehold_schemas::ids::{AgentName, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_worker::{Report, WorkerConfig, WriterConfig};
use support::{Producer, START};
use tokio_util::sync::CancellationToken;

/// Makes `command_at` fail (unavailable) the next `n` times.
#[derive(Debug, Clone)]
struct FailCommandAt(Arc<AtomicU32>);

impl Intercept<Embedded> for FailCommandAt {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn command_at(&self, log: &Embedded, seq: u64) -> Result<Option<CommandRecord>, Error> {
        if fails_now(&self.0) {
            return Err(Error::Unavailable("request timed out (a leader election)".to_owned()));
        }
        log.command_at(seq).await
    }
}

impl<L: Log> Producer<L> {
    fn resource(&mut self) -> ResourceId {
        self.n += 1;
        ResourceId::from_parts(START + self.n, [7; 10])
    }
}

fn allocate(agent: &AgentName, resource: ResourceId) -> Allocate {
    Allocate::new(agent.clone(), resource, "volume", 1)
}

fn register(agent: &AgentName) -> Register {
    Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(7)) }
}

/// Whether the call a countdown of failures stands for fails: while any are left, taking one.
fn fails_now(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// Waits (bounded: 20 s) until the log holds `n` first parts of outcomes.
async fn first_parts<L: Log>(log: &L, n: usize) -> Vec<StoredOutcome> {
    first_parts_within(log, n, Duration::from_secs(20)).await
}

/// Waits up to `within` until the log holds `n` first parts of outcomes.
async fn first_parts_within<L: Log>(log: &L, n: usize, within: Duration) -> Vec<StoredOutcome> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap();
        if outcomes.iter().filter(|o| o.part == 0).count() >= n {
            return outcomes;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {} outcomes in {within:?}", outcomes.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stop(shutdown: CancellationToken, worker: tokio::task::JoinHandle<Report>) -> Report {
    shutdown.cancel();
    worker.await.unwrap()
}

/// A decision in parts followed by another command in the same batch: every part is appended before the next
/// command is decided (it used to be decided with the parts pending, which stopped the partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_in_parts_is_finished_before_the_next_command_of_its_batch() {
    let log = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    let mut producer = Producer::new(log.clone());
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    for _ in 0..3 {
        let resource = producer.resource();
        producer.publish("ci", allocate(&agent, resource)).await;
    }
    producer.publish("ops", RetireAgent::new(agent.clone())).await;
    let other = AgentName::new("w1").unwrap();
    producer.publish("w1", register(&other)).await;
    let config = WorkerConfig {
        writer: WriterConfig { split_budget: Some(1), ..WriterConfig::default() },
        ..WorkerConfig::new("worker")
    };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let outcomes = first_parts(&log, 6).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    let retirement: Vec<u32> = outcomes.iter().filter(|o| o.cmd_seq == 5).map(|o| o.part).collect();
    assert!(retirement.len() > 1, "the retirement is decided in parts: {retirement:?}");
    let last = outcomes.last().unwrap();
    assert_eq!((last.cmd_seq, last.part), (6, 0), "the next command comes after every part");
}

/// A transient failure while loading (a request that timed out during a leader election) does not stop the
/// partition: the load tries again, and if it still cannot, the worker asks for the partition again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_while_loading_does_not_stop_the_partition() {
    let inner = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    let mut producer = Producer::new(inner.clone());
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    let log = Intercepted { log: inner.clone(), hooks: FailCommandAt(Arc::new(AtomicU32::new(0))) };
    let config = WorkerConfig { retry_own: Duration::from_millis(50), ..WorkerConfig::new("worker") };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config.clone(), shutdown.clone()));
    first_parts(&inner, 1).await;
    assert!(stop(shutdown, worker).await.stopped.is_empty());

    // More failures than one load retries: the partition is asked for again, not stopped.
    for failures in [1, 15] {
        log.hooks.0.store(failures, Ordering::SeqCst);
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(leasehold_worker::run(log.clone(), config.clone(), shutdown.clone()));
        let resource = producer.resource();
        producer.publish("ci", allocate(&agent, resource)).await;
        let decided = inner.read_outcomes(&OutcomeFilter::All, 1, 100).await.unwrap().len();
        first_parts(&inner, decided + 1).await;
        let report = stop(shutdown, worker).await;
        assert!(report.stopped.is_empty(), "{failures} failures: {:?}", report.stopped);
        assert_eq!(log.hooks.0.load(Ordering::SeqCst), 0, "every failure was met");
    }
}

/// Panics when a partition's snapshot is read (so its load panics), counting the tries.
#[derive(Debug, Clone, Default)]
struct PanicOnLoad(Arc<AtomicU32>);

impl Intercept<Embedded> for PanicOnLoad {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn latest_snapshot(&self, _log: &Embedded, partition: u32) -> Result<Option<leasehold_log::Snapshot>, Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("a bug while loading partition {partition}");
    }
}

/// A writer that panics outside the decider (here, while its partition loads) stops the partition, on record: it
/// is not loaded again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_loading_stops_the_partition_on_record() {
    let inner = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    let log = Intercepted { log: inner, hooks: PanicOnLoad::default() };
    let config = WorkerConfig { retry_own: Duration::from_millis(20), ..WorkerConfig::new("worker") };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while log.hooks.0.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the partition was never loaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let report = stop(shutdown, worker).await;
    assert!(
        matches!(report.stopped.get(&0), Some(leasehold_worker::Error::Panicked { partition: 0, .. })),
        "{:?}",
        report.stopped
    );
}

/// Makes `latest_snapshot` fail (unavailable, as in a leader election) the next `n` times.
#[derive(Debug, Clone)]
struct FailSnapshotReads(Arc<AtomicU32>);

impl Intercept<Embedded> for FailSnapshotReads {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn latest_snapshot(&self, log: &Embedded, partition: u32) -> Result<Option<leasehold_log::Snapshot>, Error> {
        if fails_now(&self.0) {
            return Err(Error::Unavailable("simulated: no stream leader".to_owned()));
        }
        log.latest_snapshot(partition).await
    }
}

/// A load whose snapshot read meets an unavailable log (a leader election) reads the snapshot again once the log
/// answers: it used to fold the partition from its first outcome instead, seconds more for a long partition, right
/// when the log had just come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_read_that_meets_an_unavailable_log_is_tried_again_not_folded_around() {
    let inner = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    backlog(&inner, 12).await;
    let writer = WriterConfig { snapshot_every: 5, snapshot_min: 5, ..WriterConfig::default() };
    let config = WorkerConfig { writer: writer.clone(), ..WorkerConfig::new("worker") };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(inner.clone(), config, shutdown.clone()));
    let outcomes = first_parts(&inner, 12).await;
    assert!(stop(shutdown, worker).await.stopped.is_empty());
    let snapshot = inner.latest_snapshot(0).await.unwrap().expect("a snapshot every 5 parts");
    let tail = outcomes.iter().filter(|o| o.seq > snapshot.fence).count() as u64;
    assert!(tail < outcomes.len() as u64, "the snapshot covers some outcomes: fence {}", snapshot.fence);

    let log = Intercepted { log: inner.clone(), hooks: FailSnapshotReads(Arc::new(AtomicU32::new(2))) };
    let folded = leasehold_worker::fold_partition(&log, 0, 0, &writer).await.unwrap();
    assert_eq!(log.hooks.0.load(Ordering::SeqCst), 0, "both failures were met");
    assert_eq!(folded.folded, tail, "the load started from the snapshot, not from the first outcome");
    assert_eq!(folded.fence, outcomes.last().unwrap().seq);
}

/// Once `hang` is set, `put_snapshot` never answers (a log that stops answering as the worker stops); counts the
/// stores it holds.
#[derive(Debug, Clone, Default)]
struct HangSnapshotStores {
    hang: Arc<AtomicBool>,
    held: Arc<AtomicU32>,
}

impl Intercept<Embedded> for HangSnapshotStores {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn put_snapshot(&self, log: &Embedded, snapshot: leasehold_log::Snapshot) -> Result<(), Error> {
        if self.hang.load(Ordering::SeqCst) {
            self.held.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        log.put_snapshot(snapshot).await
    }
}

/// The snapshot at a clean stop is stored within the stop's grace: a log that does not answer keeps the snapshot,
/// not the stop (it used to wait for the store as long as the log took).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_whose_snapshot_is_not_stored_still_ends_within_its_grace() {
    let inner = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    backlog(&inner, 121).await;
    let log = Intercepted { log: inner.clone(), hooks: HangSnapshotStores::default() };
    // No snapshot while serving; one at the stop (121 parts since none).
    let writer = WriterConfig {
        snapshot_every: 10_000,
        snapshot_min: 10_000,
        snapshot_on_stop: 100,
        stop_grace: Duration::from_secs(1),
        ..WriterConfig::default()
    };
    let config = WorkerConfig { writer, ..WorkerConfig::new("worker") };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    first_parts(&inner, 121).await;
    log.hooks.hang.store(true, Ordering::SeqCst);
    // The bound only keeps a broken build from hanging the test run.
    let report = tokio::time::timeout(Duration::from_secs(60), stop(shutdown, worker))
        .await
        .expect("the stop ends though its snapshot is never stored");
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(log.hooks.held.load(Ordering::SeqCst), 1, "the stop tried to store its snapshot");
    assert!(inner.latest_snapshot(0).await.unwrap().is_none(), "no snapshot was stored");
}

/// Whether a partition is served takes 30 s to answer; counts the questions.
#[derive(Debug, Clone, Default)]
struct SlowIsServed(Arc<AtomicU32>);

impl Intercept<Embedded> for SlowIsServed {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn is_served(&self, _log: &Embedded, _partition: u32) -> Result<bool, Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(false)
    }
}

/// A slow log does not hold a worker's shutdown up: the questions about partitions it does not serve have a
/// deadline and give way to the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_log_does_not_hold_the_shutdown_up() {
    let inner = Embedded::in_memory(8, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    // Another worker is alive, so some partitions are not this one's share and get asked about.
    inner.workers("other-worker", true).await.unwrap();
    let asked = Arc::new(AtomicU32::new(0));
    let log = Intercepted { log: inner, hooks: SlowIsServed(asked.clone()) };
    let config = WorkerConfig {
        retry_own: Duration::from_millis(50),
        takeover_after: Some(Duration::from_millis(100)),
        ..WorkerConfig::new("worker")
    };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log, config, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while asked.load(Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no partition was asked about");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), worker)
        .await
        .expect("the worker stops within 5 s although the log takes 30 s to answer")
        .unwrap();
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
}

/// Answers the first `n` appends of several records "busy" (too many open batches), and records every append's size.
#[derive(Debug, Clone, Default)]
struct BusyBatches {
    busy_left: Arc<AtomicU32>,
    sizes: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Intercept<Embedded> for BusyBatches {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn append(
        &self,
        log: &Embedded,
        partition: u32,
        fence: u64,
        records: &[leasehold_log::OutcomeRecord],
    ) -> leasehold_log::Appended {
        self.sizes.lock().unwrap().push(records.len());
        if records.len() > 1 && fails_now(&self.busy_left) {
            return leasehold_log::Appended::Busy("too many open batches (10210)".to_owned());
        }
        log.append(partition, fence, records).await
    }
}

/// Group commit: the commands waiting when the writer starts go out as one append; a "busy" answer (10210) is
/// retried as it is, with no reload; every command has its one outcome, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_commands_go_out_as_one_append_and_busy_is_retried_without_a_reload() {
    let inner = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    let mut producer = Producer::new(inner.clone());
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    for _ in 0..40 {
        let resource = producer.resource();
        producer.publish("ci", allocate(&agent, resource)).await;
    }
    let hooks = BusyBatches { busy_left: Arc::new(AtomicU32::new(2)), ..BusyBatches::default() };
    let log = Intercepted { log: inner.clone(), hooks: hooks.clone() };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log, WorkerConfig::new("worker"), shutdown.clone()));
    let outcomes = first_parts(&inner, 41).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(report.counts.reloads, 0, "a busy answer is not a reason to reload");
    assert_eq!(report.counts.busy_retries, 2);
    assert_eq!(hooks.sizes.lock().unwrap()[..3], [41, 41, 41], "one group of all 41, sent three times");
    assert_eq!((report.counts.appends, report.counts.appended), (1, 41));
    assert_eq!(outcomes.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), (1..=41).collect::<Vec<u64>>());
    assert!(outcomes.windows(2).all(|w| w[1].prev_seq == w[0].seq), "the chain is unbroken");
}

/// A server whose operator limits atomic batches to 10 messages (`jetstream { limits { batch { max_msgs: 10 } } }`,
/// a documented server limit): the writer's group of 30 is refused whole (10199, "too large"); the writer appends
/// it again in smaller slices (it used to reload and send the same group again, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_batch_limit_below_the_group_is_met_with_smaller_appends() {
    let options =
        ServerOptions { jetstream: Some("limits { batch { max_msgs: 10 } }".to_owned()), ..Default::default() };
    let Some(server) = NatsServer::start_with(options) else { return };
    let config = JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(server.url(), 1)
    };
    let log = JetStream::connect(config).await.expect("connect");
    let mut producer = Producer::new(log.clone());
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    for _ in 0..29 {
        let resource = producer.resource();
        producer.publish("ci", allocate(&agent, resource)).await;
    }
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), WorkerConfig::new("worker"), shutdown.clone()));
    let outcomes = first_parts_within(&log, 30, Duration::from_secs(10)).await;
    let report = stop(shutdown, worker).await;
    eprintln!("report: {:?}", report.counts);
    assert_eq!(
        outcomes.len(),
        30,
        "every command decided within 10 s; the log holds {} outcomes after {} reloads",
        outcomes.len(),
        report.counts.reloads
    );
}

/// Appends whose answers come after `request_timeout` (a slow disk: `sync_interval: always`, a 4 ms timeout): the
/// writer reloads while its batch is still being stored and decides the same commands again; the fence must refuse
/// the second copy, so every command still has exactly one outcome, in order, on an unbroken chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_append_answers_never_double_an_outcome() {
    let options = ServerOptions { jetstream: Some("sync_interval: always".to_owned()), ..Default::default() };
    let Some(server) = NatsServer::start_with(options) else { return };
    let base = JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(server.url(), 1)
    };
    let log = JetStream::connect(base.clone()).await.expect("connect");
    let mut producer = Producer::new(log.clone());
    let agents: Vec<AgentName> = (0..20).map(|i| AgentName::new(format!("w{i}")).unwrap()).collect();
    for agent in &agents {
        producer.publish(agent.as_str(), register(agent)).await;
    }
    for i in 0..980 {
        let resource = producer.resource();
        producer.publish("ci", allocate(&agents[i % 20], resource)).await;
    }
    let slow = JetStream::connect(JetStreamConfig { request_timeout: Duration::from_millis(4), ..base })
        .await
        .expect("connect with a short timeout");
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(slow, WorkerConfig::new("worker"), shutdown.clone()));
    let outcomes = first_parts_within(&log, 1000, Duration::from_secs(60)).await;
    let report = stop(shutdown, worker).await;
    eprintln!("report: {:?} stopped {:?}", report.counts, report.stopped);
    let seqs: Vec<u64> = outcomes.iter().filter(|o| o.part == 0).map(|o| o.cmd_seq).collect();
    assert_eq!(seqs, (1..=1000).collect::<Vec<u64>>(), "one outcome per command, in order");
    let p0: Vec<_> = outcomes.iter().collect();
    assert!(p0.windows(2).all(|w| w[1].prev_seq == w[0].seq), "the chain is unbroken");
}

/// Every outcome in the log, read in pages (a read answers at most one batch).
async fn all_outcomes<L: Log>(log: &L) -> Vec<StoredOutcome> {
    let mut all: Vec<StoredOutcome> = Vec::new();
    loop {
        let from = all.last().map_or(1, |o| o.seq + 1);
        let page = log.read_outcomes(&OutcomeFilter::All, from, 10_000).await.unwrap();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// A log on one partition holding `total` commands: an agent's registration, then allocations on it.
async fn backlog<L: Log>(log: &L, total: usize) {
    let mut producer = Producer::new(log.clone());
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    for _ in 1..total {
        let resource = producer.resource();
        producer.publish("ci", allocate(&agent, resource)).await;
    }
}

/// A clean stop in the middle of a backlog (a rolling restart): the writer decides the commands the consumer had
/// already sent it before it gives the partition up, so none is sent to the next owner again (the server holds no
/// delivery unacked), and it stores a snapshot, so the next owner loads no tail. The next owner decides the rest:
/// every command once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_decides_what_it_was_sent_and_leaves_a_snapshot() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), 1)).await.expect("connect");
    let total = 1_500;
    backlog(&log, total).await;
    let config = |name: &str| WorkerConfig {
        writer: WriterConfig { max_batch: 50, snapshot_on_stop: 100, ..WriterConfig::default() },
        ..WorkerConfig::new(name)
    };
    let hooks = HoldAppendAt { at: 2, ..HoldAppendAt::default() };
    let held = Intercepted { log: log.clone(), hooks: hooks.clone() };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(held, config("first"), shutdown.clone()));
    tokio::time::timeout(Duration::from_secs(20), hooks.held.notified()).await.expect("a third append");
    // Asked to stop with two groups landed, the third in flight, and the consumer's pulls delivering.
    shutdown.cancel();
    hooks.go.notify_one();
    let report = tokio::time::timeout(Duration::from_secs(20), worker).await.expect("the stop ends").unwrap();
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    let decided = all_outcomes(&log).await.iter().filter(|o| o.part == 0).count();
    assert!(decided > 150, "the stop decided what was at hand, not only the group in flight: {decided}");
    assert!(decided < total, "the test needs a backlog the first owner was not sent whole: {decided}");

    let js = async_nats::jetstream::new(log.client().clone());
    let stream = js.get_stream(leasehold_log::jetstream::CMD_STREAM).await.expect("stream");
    // The release's ack is a message of its own: the server may answer a question asked after it first.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = stream.consumer_info(leasehold_log::jetstream::writer_consumer(0)).await.expect("consumer info");
        if info.num_ack_pending == 0 && info.num_redelivered == 0 {
            break;
        }
        let late = tokio::time::Instant::now() >= deadline;
        assert!(!late, "what the first owner was sent waits to be sent again: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = log.last_outcome_seq(0).await.unwrap();
    let snapshot = log.latest_snapshot(0).await.unwrap().expect("a snapshot stored at the stop");
    assert_eq!(snapshot.fence, last, "the snapshot is of the state at the last outcome");
    let folded = leasehold_worker::fold_partition(&log, 0, 0, &WriterConfig::default()).await.unwrap();
    assert_eq!(folded.folded, 0, "the next owner loads the snapshot and no tail");

    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config("second"), shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let seqs = loop {
        let seqs: Vec<u64> = all_outcomes(&log).await.iter().filter(|o| o.part == 0).map(|o| o.cmd_seq).collect();
        if seqs.len() >= total || tokio::time::Instant::now() >= deadline {
            break seqs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(seqs, (1..=total as u64).collect::<Vec<u64>>(), "one outcome per command, in order");
}

/// Holds the append numbered `at` (from 0) until the test lets it go, and says when it holds it.
#[derive(Debug, Clone, Default)]
struct HoldAppendAt {
    at: u32,
    appends: Arc<AtomicU32>,
    held: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
}

impl Intercept<JetStream> for HoldAppendAt {
    type Owner = leasehold_log::jetstream::JetStreamOwner;

    async fn own(&self, log: &JetStream, partition: u32, worker: &str) -> Result<Option<Self::Owner>, Error> {
        log.own(partition, worker).await
    }

    async fn append(
        &self,
        log: &JetStream,
        partition: u32,
        fence: u64,
        records: &[leasehold_log::OutcomeRecord],
    ) -> leasehold_log::Appended {
        if self.appends.fetch_add(1, Ordering::SeqCst) == self.at {
            self.held.notify_one();
            self.go.notified().await;
        }
        log.append(partition, fence, records).await
    }
}

/// A clean stop under a deep backlog, with the writer's consumer at its ack limit (it delivers ahead of the
/// decisions until as many deliveries as it allows wait for an ack): the consumer sends nothing more until it is
/// acked, so waiting for what the pulls "still bring" waits for nothing. The stop must decide what it holds within
/// its grace, not spend the grace waiting, and leave its snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_at_the_consumers_ack_limit_does_not_wait_for_deliveries_that_never_come() {
    let Some(server) = NatsServer::start() else { return };
    let mut js_config = JetStreamConfig::new(server.url(), 1);
    // Pulls expire long after the stop's grace: only an answer from the server, never an expiry, ends a wait.
    js_config.priority_timeout = Duration::from_secs(40);
    let log = JetStream::connect(js_config).await.expect("connect");
    let total = 10_000;
    backlog(&log, total).await;
    let config = WorkerConfig {
        writer: WriterConfig {
            max_batch: 100,
            stop_grace: Duration::from_secs(3),
            snapshot_on_stop: 100,
            ..WriterConfig::default()
        },
        ..WorkerConfig::new("first")
    };
    let hooks = HoldAppendAt { at: 30, ..HoldAppendAt::default() };
    let held = Intercepted { log: log.clone(), hooks: hooks.clone() };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(held, config, shutdown.clone()));
    tokio::time::timeout(Duration::from_secs(30), hooks.held.notified()).await.expect("a thirty-first append");
    let js = async_nats::jetstream::new(log.client().clone());
    let stream = js.get_stream(leasehold_log::jetstream::CMD_STREAM).await.expect("stream");
    let consumer = leasehold_log::jetstream::writer_consumer(0);
    let info = stream.consumer_info(&consumer).await.expect("consumer info");
    let limit = info.config.max_ack_pending;
    assert!(
        i64::try_from(info.num_ack_pending).unwrap() >= limit,
        "the test needs the consumer at its ack limit ({limit}): {info:?}"
    );
    shutdown.cancel();
    hooks.go.notify_one();
    let report = tokio::time::timeout(Duration::from_secs(30), worker).await.expect("the stop ends").unwrap();
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    let decided = all_outcomes(&log).await.iter().filter(|o| o.part == 0).count();
    assert!(decided < total, "the test needs a backlog the first owner was not sent whole: {decided}");
    let last = log.last_outcome_seq(0).await.unwrap();
    let snapshot = log.latest_snapshot(0).await.unwrap().expect("a snapshot");
    assert_eq!(
        snapshot.fence, last,
        "the stop decided what it held within its grace and left a snapshot of it ({decided} decided)"
    );
}

/// Makes `read_outcomes` fail (unavailable, as in a leader election) the next `n` times.
#[derive(Debug, Clone)]
struct FailOutcomeReads(Arc<AtomicU32>);

impl Intercept<JetStream> for FailOutcomeReads {
    type Owner = leasehold_log::jetstream::JetStreamOwner;

    async fn own(&self, log: &JetStream, partition: u32, worker: &str) -> Result<Option<Self::Owner>, Error> {
        log.own(partition, worker).await
    }

    async fn read_outcomes(
        &self,
        log: &JetStream,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredOutcome>, Error> {
        if fails_now(&self.0) {
            return Err(Error::Unavailable("simulated: no stream leader".to_owned()));
        }
        log.read_outcomes(filter, from, max).await
    }
}

/// A snapshot no read can finish (its chunks are gone from the bucket: each read stalls, and the log gives up on
/// it after three, 6 s) is unavailable every time it is asked for. Retrying it for the whole load's deadline left the
/// fold from the first outcome none: the load ran past its deadline, and the first failed read of that fold (a
/// leader election) failed the load, so every takeover of the partition waited out the deadline and failed. The
/// snapshot may take half of what is left; the fold from the first outcome has the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_be_read_leaves_the_fold_from_the_first_outcome_its_share_of_the_deadline() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), 1)).await.expect("connect");
    backlog(&log, 20).await;
    let writer = WriterConfig { snapshot_every: 5, snapshot_min: 5, ..WriterConfig::default() };
    let config = WorkerConfig { writer: writer.clone(), ..WorkerConfig::new("worker") };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let outcomes = first_parts(&log, 20).await;
    assert!(stop(shutdown, worker).await.stopped.is_empty());

    let js = async_nats::jetstream::new(log.client().clone());
    let bucket = js.get_object_store(leasehold_log::jetstream::SNAPSHOT_BUCKET).await.expect("the bucket");
    let info = bucket.info("partition-0").await.expect("a snapshot every 5 parts");
    let stream = js.get_stream(format!("OBJ_{}", leasehold_log::jetstream::SNAPSHOT_BUCKET)).await.expect("stream");
    let chunks = format!("$O.{}.C.{}", leasehold_log::jetstream::SNAPSHOT_BUCKET, info.nuid);
    stream.purge().filter(chunks).await.expect("purge the snapshot's chunks");

    let writer = WriterConfig { reload_deadline: Duration::from_secs(8), ..writer };
    let log = Intercepted { log: log.clone(), hooks: FailOutcomeReads(Arc::new(AtomicU32::new(1))) };
    let started = std::time::Instant::now();
    let folded = leasehold_worker::fold_partition(&log, 0, 0, &writer).await;
    let took = started.elapsed();
    let folded = folded.expect("the fold from the first outcome rides out a failed read");
    assert_eq!(log.hooks.0.load(Ordering::SeqCst), 0, "the failure was met");
    assert_eq!(folded.folded, outcomes.len() as u64, "folded from the first outcome");
    assert!(took <= writer.reload_deadline, "the load took {took:?}, past its deadline");
}
