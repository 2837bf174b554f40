//! Group commit against a real nats-server at its limits (found by a red-team review): a server batch limit below
//! the group, and append answers that come too late.

use std::time::Duration;

use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsServer, ServerOptions};
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, Envelope, Uuid, codec};
use leasehold_worker::{Report, WorkerConfig};
use tokio_util::sync::CancellationToken;

const START: u64 = 1_800_000_000_000;

struct Producer {
    log: JetStream,
    n: u64,
}

impl Producer {
    async fn publish(&mut self, issuer: &str, body: impl Into<Command>) {
        self.n += 1;
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.n.to_be_bytes());
        let at = Timestamp(START + self.n);
        let envelope = Envelope::new(CommandId::from_parts(at.0, entropy), Issuer::new(issuer).unwrap(), at, body);
        let payload = codec::encode_command(&envelope).unwrap();
        self.log
            .publish_command(&ingress_subject_of(&envelope.body), &envelope.command_id.to_string(), payload.into())
            .await
            .unwrap();
    }

    fn resource(&mut self) -> ResourceId {
        self.n += 1;
        ResourceId::from_parts(START + self.n, [7; 10])
    }
}

fn register(agent: &AgentName) -> Register {
    Register {
        agent: agent.clone(),
        incarnation: Uuid::from_u128(7),
        wiped: false,
        settings: Some(AgentSettings::default()),
    }
}

async fn outcomes_within(log: &JetStream, n: usize, within: Duration) -> Vec<StoredOutcome> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap();
        if outcomes.iter().filter(|o| o.part == 0).count() >= n || tokio::time::Instant::now() >= deadline {
            return outcomes;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn stop(shutdown: CancellationToken, worker: tokio::task::JoinHandle<Report>) -> Report {
    shutdown.cancel();
    worker.await.unwrap()
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
    let mut producer = Producer { log: log.clone(), n: 0 };
    let agent = AgentName::new("w0").unwrap();
    producer.publish("w0", register(&agent)).await;
    for _ in 0..29 {
        let resource = producer.resource();
        producer.publish("ci", Allocate::new(agent.clone(), resource, "volume", 1)).await;
    }
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), WorkerConfig::new("worker"), shutdown.clone()));
    let outcomes = outcomes_within(&log, 30, Duration::from_secs(10)).await;
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
    let mut producer = Producer { log: log.clone(), n: 0 };
    let agents: Vec<AgentName> = (0..20).map(|i| AgentName::new(format!("w{i}")).unwrap()).collect();
    for agent in &agents {
        producer.publish(agent.as_str(), register(agent)).await;
    }
    for i in 0..980 {
        let resource = producer.resource();
        producer.publish("ci", Allocate::new(agents[i % 20].clone(), resource, "volume", 1)).await;
    }
    let slow = JetStream::connect(JetStreamConfig { request_timeout: Duration::from_millis(4), ..base })
        .await
        .expect("connect with a short timeout");
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(slow, WorkerConfig::new("worker"), shutdown.clone()));
    let outcomes = outcomes_within(&log, 1000, Duration::from_secs(60)).await;
    let report = stop(shutdown, worker).await;
    eprintln!("report: {:?} stopped {:?}", report.counts, report.stopped);
    let seqs: Vec<u64> = outcomes.iter().filter(|o| o.part == 0).map(|o| o.cmd_seq).collect();
    assert_eq!(seqs, (1..=1000).collect::<Vec<u64>>(), "one outcome per command, in order");
    let p0: Vec<_> = outcomes.iter().collect();
    assert!(p0.windows(2).all(|w| w[1].prev_seq == w[0].seq), "the chain is unbroken");
}
