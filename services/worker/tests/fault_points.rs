//! The writers' test-only fault points (feature `fault-points`, for the chaos harness): each does what its
//! variable says to the log, and the writer goes on afterwards. The crash is told to a recorder here instead of
//! aborting the test process; the doubled and the lost outcome are also shown on a real nats-server, the log the
//! harness runs on.

#![cfg(feature = "fault-points")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_log::embedded::Embedded;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::command::{Allocate, Register, RetireAgent};
use leasehold_schemas::ids::{AgentName, CommandId, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Uuid, codec};
use leasehold_worker::faults::{FaultPlan, FaultPoints, Fired};
use leasehold_worker::{Error, Report, WorkerConfig, WriterConfig, fold_partition};
use support::{Producer, START};
use tokio_util::sync::CancellationToken;

impl<L: Log> Producer<L> {
    async fn allocate(&mut self, agent: &AgentName) -> CommandId {
        self.n += 1;
        let resource = ResourceId::from_parts(START + self.n, [7; 10]);
        self.publish("ci", Allocate::new(agent.clone(), resource, "volume", 1)).await
    }

    async fn register(&mut self, agent: &AgentName) -> CommandId {
        let body =
            Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(7)) };
        self.publish(agent.as_str(), body).await
    }
}

/// What fired, in order.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Fired>>>);

impl Recorder {
    fn points(&self, plan: FaultPlan) -> Arc<FaultPoints> {
        let fired = self.0.clone();
        FaultPoints::new(plan, Arc::new(move |f: &Fired| fired.lock().unwrap().push(f.clone())))
    }

    fn fired(&self) -> Vec<Fired> {
        self.0.lock().unwrap().clone()
    }
}

fn config(faults: &Arc<FaultPoints>) -> WorkerConfig {
    let mut config = WorkerConfig::new("worker");
    faults.install(&mut config.writer);
    config
}

/// Waits (up to 20 s) until the log holds `n` outcomes, and returns them all.
async fn outcomes<L: Log>(log: &L, n: usize) -> Vec<StoredOutcome> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap();
        if outcomes.len() >= n {
            return outcomes;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {} of {n} outcomes in 20 s", outcomes.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 20 s) until the decision of `command` is complete in the log (its last part does not continue),
/// and returns every outcome.
async fn decided<L: Log>(log: &L, command: CommandId) -> Vec<StoredOutcome> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap();
        let last = outcomes.iter().rfind(|o| o.cmd_id == command.to_string());
        if last.is_some_and(|o| !codec::decode_outcome(&o.payload).unwrap().continues()) {
            return outcomes;
        }
        assert!(tokio::time::Instant::now() < deadline, "command {command} not decided in 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stop(shutdown: CancellationToken, worker: tokio::task::JoinHandle<Report>) -> Report {
    shutdown.cancel();
    worker.await.unwrap()
}

fn chained(outcomes: &[StoredOutcome]) -> bool {
    outcomes.first().is_some_and(|o| o.prev_seq == 0) && outcomes.windows(2).all(|w| w[1].prev_seq == w[0].seq)
}

/// `CRASH_AFTER_PART=K` with `SPLIT_BUDGET=1`: the crash comes once the K-th part of a decision in parts is in the
/// log and before the next part is, the first time only (a second decision in parts goes through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_comes_between_two_parts_of_a_decision_and_only_once() {
    for k in [1u32, 2] {
        let log = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
        let mut producer = Producer::new(log.clone());
        let (w0, w1) = (AgentName::new("w0").unwrap(), AgentName::new("w1").unwrap());
        producer.register(&w0).await;
        producer.register(&w1).await;
        for _ in 0..3 {
            producer.allocate(&w0).await;
            producer.allocate(&w1).await;
        }
        let first = producer.publish("ops", RetireAgent::new(w0.clone())).await;
        let second = producer.publish("ops", RetireAgent::new(w1.clone())).await;

        // The recorder reads the log when the crash comes: what a restarted process would find.
        // The parts of the first retirement in the log at each crash.
        let at_crash: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let (seen, reader) = (at_crash.clone(), log.clone());
        let recorder = Recorder::default();
        let fired = recorder.0.clone();
        let plan = FaultPlan { split_budget: Some(1), crash_after_part: Some(k), ..FaultPlan::default() };
        let faults = FaultPoints::new(
            plan,
            Arc::new(move |f: &Fired| {
                let stored = futures::executor::block_on(reader.read_outcomes(&OutcomeFilter::All, 1, 1000)).unwrap();
                let parts = stored.iter().filter(|o| o.cmd_id == first.to_string()).map(|o| o.part).collect();
                seen.lock().unwrap().push(parts);
                fired.lock().unwrap().push(f.clone());
            }),
        );
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(leasehold_worker::run(log.clone(), config(&faults), shutdown.clone()));
        let stored = decided(&log, second).await;
        let report = stop(shutdown, worker).await;
        assert!(report.stopped.is_empty(), "{:?}", report.stopped);
        assert_eq!(recorder.fired(), [Fired::CrashAfterPart { part: k, command: first, partition: 0 }]);
        assert_eq!(
            recorder.fired()[0].to_string(),
            format!("fault point: crash after part {k} of the decision of command {first} on partition 0")
        );
        let before_next_part: Vec<u32> = (0..k).collect();
        assert_eq!(*at_crash.lock().unwrap(), [before_next_part], "parts 1..={k} in the log, not part {}", k + 1);
        // Left running (a recorder instead of the abort), the writer finishes both decisions as if nothing fired.
        for id in [first, second] {
            let parts: Vec<u32> = stored.iter().filter(|o| o.cmd_id == id.to_string()).map(|o| o.part).collect();
            assert!(parts.len() > 2, "the retirement of {id} is decided in several parts: {parts:?}");
            assert_eq!(parts, (0..parts.len() as u32).collect::<Vec<u32>>(), "the parts of {id}");
        }
        assert_eq!(stored.iter().filter(|o| o.part == 0).count(), 10, "one outcome for each of the 10 commands");
        assert!(chained(&stored));
    }
}

/// Without a split budget nothing is decided in parts, so a crash after a part never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_crash_without_a_decision_in_parts() {
    let log = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    let mut producer = Producer::new(log.clone());
    let w0 = AgentName::new("w0").unwrap();
    producer.register(&w0).await;
    producer.allocate(&w0).await;
    producer.publish("ops", RetireAgent::new(w0)).await;
    let recorder = Recorder::default();
    let faults = recorder.points(FaultPlan { crash_after_part: Some(1), ..FaultPlan::default() });
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config(&faults), shutdown.clone()));
    let stored = outcomes(&log, 3).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(stored.iter().map(|o| o.part).collect::<Vec<_>>(), [0, 0, 0], "one part each");
    assert_eq!(recorder.fired(), []);
}

/// `DOUBLE_OUTCOME=2`: the second command decided has two first parts in the log, both accepted on one unbroken
/// chain; the writer goes on deciding; a later fold of the partition refuses the copy.
async fn a_doubled_outcome_is_stored_and_the_writer_goes_on<L: Log>(log: L) {
    let mut producer = Producer::new(log.clone());
    let w0 = AgentName::new("w0").unwrap();
    let register = producer.register(&w0).await;
    let doubled = producer.allocate(&w0).await;
    let after = producer.allocate(&w0).await;
    let recorder = Recorder::default();
    let faults = recorder.points(FaultPlan { double_outcome: Some(2), ..FaultPlan::default() });
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config(&faults), shutdown.clone()));
    let stored = outcomes(&log, 4).await;
    // One more command after the double: the writer still decides.
    let last = producer.allocate(&w0).await;
    let stored_then = outcomes(&log, 5).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(recorder.fired(), [Fired::Doubled { command: doubled }]);
    assert_eq!(recorder.fired()[0].to_string(), format!("fault point: doubled the outcome of command {doubled}"));

    let answered: Vec<(String, u64, u32)> = stored_then.iter().map(|o| (o.cmd_id.clone(), o.cmd_seq, o.part)).collect();
    let expected = [(register, 1, 0), (doubled, 2, 0), (doubled, 0, 0), (after, 3, 0), (last, 4, 0)];
    assert_eq!(answered, expected.map(|(id, seq, part)| (id.to_string(), seq, part)));
    assert!(chained(&stored_then), "both copies are on the chain: {stored_then:?}");
    let first = codec::decode_outcome(&stored[1].payload).unwrap();
    let copy = codec::decode_outcome(&stored[2].payload).unwrap();
    assert_eq!(
        (copy.cmd_seq, &copy.command, &copy.decision),
        (0, &first.command, &first.decision),
        "the same decision"
    );

    let folded = fold_partition(&log, 0, 0, &WriterConfig::default()).await;
    assert!(matches!(folded, Err(Error::Fold { partition: 0, seq, .. }) if seq == stored[2].seq), "{folded:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubled_outcome_is_stored_and_the_writer_goes_on_embedded() {
    let log = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    a_doubled_outcome_is_stored_and_the_writer_goes_on(log).await;
}

/// On JetStream the copy and the first part go out in one atomic batch, which the server takes: their message ids
/// differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubled_outcome_is_stored_and_the_writer_goes_on_jetstream() {
    let Some(server) = NatsServer::start() else { return };
    a_doubled_outcome_is_stored_and_the_writer_goes_on(jetstream(&server).await).await;
}

/// `SKIP_OUTCOME=1`: the first operator command decided (after an agent's registration) gets no outcome, yet the writer passes it and decides the next;
/// a worker that loads the partition afterwards (another process) does not decide it either: it is lost.
async fn a_skipped_outcome_is_lost_for_good<L: Log>(log: L) {
    let mut producer = Producer::new(log.clone());
    let w0 = AgentName::new("w0").unwrap();
    let register = producer.register(&w0).await;
    let skipped = producer.allocate(&w0).await;
    let after = producer.allocate(&w0).await;
    let recorder = Recorder::default();
    let faults = recorder.points(FaultPlan { skip_outcome: Some(1), ..FaultPlan::default() });
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config(&faults), shutdown.clone()));
    outcomes(&log, 2).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(recorder.fired(), [Fired::Skipped { command: skipped }]);
    assert_eq!(recorder.fired()[0].to_string(), format!("fault point: skipped the outcome of command {skipped}"));

    // Another process, without faults, serves the partition next and decides one more command.
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), WorkerConfig::new("next"), shutdown.clone()));
    let last = producer.allocate(&w0).await;
    let stored = outcomes(&log, 3).await;
    let report = stop(shutdown, worker).await;
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    let answered: Vec<(String, u64)> = stored.iter().map(|o| (o.cmd_id.clone(), o.cmd_seq)).collect();
    let expected = [(register, 1), (after, 3), (last, 4)];
    assert_eq!(answered, expected.map(|(id, seq)| (id.to_string(), seq)), "command 2 has no outcome");
    assert!(chained(&stored));
    let folded = fold_partition(&log, 0, 0, &WriterConfig::default()).await.expect("a lost decision folds");
    assert_eq!(folded.state.cursor(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_outcome_is_lost_for_good_embedded() {
    let log = Embedded::in_memory(1, Arc::new(|| Timestamp(START + 60_000))).unwrap();
    a_skipped_outcome_is_lost_for_good(log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_outcome_is_lost_for_good_jetstream() {
    let Some(server) = NatsServer::start() else { return };
    a_skipped_outcome_is_lost_for_good(jetstream(&server).await).await;
}

async fn jetstream(server: &NatsServer) -> JetStream {
    let config = JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(server.url(), 1)
    };
    JetStream::connect(config).await.expect("connect")
}
