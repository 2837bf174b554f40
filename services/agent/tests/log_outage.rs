//! The agent through a log outage: while its log is down, its follow and its publishes fail with `Unavailable`;
//! it retries both, resumes the follow after the last outcome it saw, and what it queued lands once the log is
//! back. The writers keep the real log; only the agent's view of it goes down.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_agent::{AgentConfig, DirDriver, run};
use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::intercept::{Intercept, Intercepted};
use leasehold_log::{Error, Log, OutcomeFilter, Published, StoredOutcome};
use leasehold_schemas::command::Allocate;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{AgentName, Command, CommandId, Envelope, Issuer, ResourceId, Timestamp, codec};
use leasehold_worker::WorkerConfig;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, work).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// What the agent did through the flaky log.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The `from` of every follow it started.
    follows: Vec<u64>,
    /// Type names of the commands that went through.
    published: Vec<&'static str>,
}

/// Hooks that make outcome reads, follows and command publishes fail while `down`.
#[derive(Debug, Clone)]
struct Flaky {
    down: Arc<watch::Sender<bool>>,
    seen: Arc<watch::Sender<Seen>>,
    /// Calls refused while down.
    refused: Arc<watch::Sender<u64>>,
}

impl Flaky {
    fn unavailable(&self) -> Result<(), Error> {
        if *self.down.borrow() {
            self.refused.send_modify(|n| *n += 1);
            return Err(Error::Unavailable("the test took the log down".into()));
        }
        Ok(())
    }
}

impl Intercept<Embedded> for Flaky {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        log.own(partition, worker).await
    }

    async fn publish_command(
        &self,
        log: &Embedded,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<Published, Error> {
        self.unavailable()?;
        let type_name = codec::decode_command(&payload).unwrap().type_name();
        self.seen.send_modify(|s| s.published.push(type_name));
        log.publish_command(subject, msg_id, payload).await
    }

    async fn read_outcomes(
        &self,
        log: &Embedded,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredOutcome>, Error> {
        self.unavailable()?;
        log.read_outcomes(filter, from, max).await
    }

    /// The real follow until the log goes down, then one `Unavailable` (a follow started while down fails at once).
    fn follow(
        &self,
        log: &Embedded,
        filter: OutcomeFilter,
        from: u64,
    ) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        self.seen.send_modify(|s| s.follows.push(from));
        if let Err(e) = self.unavailable() {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let mut down = self.down.subscribe();
        let goes_down = async move {
            let _ = down.wait_for(|down| *down).await;
        };
        let failure = futures::stream::once(async { Err(Error::Unavailable("the test took the log down".into())) });
        log.follow(filter, from).take_until(goes_down).chain(failure).boxed()
    }
}

async fn allocate(log: &Embedded, agent: &AgentName) -> ResourceId {
    let resource = ResourceId::generate();
    let body: Command = Allocate::new(agent.clone(), resource, "dir", 1).into();
    let id = CommandId::generate();
    let now = Timestamp(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64);
    let envelope = Envelope::new(id, Issuer::new("producer").unwrap(), now, body);
    let payload = codec::encode_command(&envelope).unwrap();
    log.publish_command(&ingress_subject_of(&envelope.body), &id.to_string(), payload.into()).await.unwrap();
    resource
}

async fn activated(log: &Embedded, agent: &AgentName, id: ResourceId) {
    let filter =
        OutcomeFilter::Key { partition: partition_of_agent(agent, log.partitions()), key: agent.as_str().to_owned() };
    let mut follow = log.follow(filter, 1);
    within("activation", async {
        loop {
            let outcome = codec::decode_outcome(&follow.next().await.unwrap().unwrap().payload).unwrap();
            if outcome
                .effects()
                .iter()
                .any(|e| matches!(e, Effect::ResourceActivated { resource, .. } if *resource == id))
            {
                return;
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agent_rides_out_a_log_outage() {
    let tmp = tempfile::tempdir().unwrap();
    let log = Embedded::open(&tmp.path().join("log"), 2).unwrap();
    let stop_worker = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), WorkerConfig::new("w"), stop_worker.clone()));
    let flaky = Flaky {
        down: Arc::new(watch::Sender::new(false)),
        seen: Arc::new(watch::Sender::new(Seen::default())),
        refused: Arc::new(watch::Sender::new(0)),
    };
    let root = tmp.path().join("resources");
    let w1 = AgentName::new("w1").unwrap();
    let mut config = AgentConfig::new(w1.clone());
    config.sync_interval = Duration::from_secs(3600);
    config.heartbeat_interval = Duration::from_millis(50);
    let control = config.control.clone();
    let shutdown = CancellationToken::new();
    let through = Intercepted { log: log.clone(), hooks: flaky.clone() };
    let agent = tokio::spawn(run(through, DirDriver::new(&root), config, shutdown.clone()));
    within("registration", control.wait_for(|s| s.epoch.is_some())).await;

    let before = allocate(&log, &w1).await;
    activated(&log, &w1, before).await;
    let mut seen = flaky.seen.subscribe();
    within("heartbeats", seen.wait_for(|s| s.published.iter().filter(|t| **t == "agent.heartbeat").count() >= 3))
        .await
        .unwrap();

    flaky.down.send_replace(true);
    let during = allocate(&log, &w1).await;
    within("the agent to try the follow again", seen.wait_for(|s| s.follows.len() >= 3)).await.unwrap();
    let reports_before = control.status().reports;
    control.sync_now();
    let refused = flaky.refused.borrow().to_owned();
    let mut refusals = flaky.refused.subscribe();
    within("publishes to fail", refusals.wait_for(|n| *n >= refused + 3)).await.unwrap();
    assert_eq!(control.status().reports, reports_before, "nothing was published while the log was down");
    let last_seq = control.status().last_seq;

    flaky.down.send_replace(false);
    activated(&log, &w1, during).await;
    assert!(root.join(during.to_string()).is_dir());
    within("the report queued during the outage", control.wait_for(|s| s.reports > reports_before)).await;
    let follows = flaky.seen.borrow().follows.clone();
    assert_eq!(follows[0], 1, "the first follow reads the subject from the start");
    assert!(
        follows[1..].iter().all(|from| *from == last_seq + 1),
        "every later follow resumes after {last_seq}: {follows:?}"
    );
    let creates = control.status().creates;
    assert_eq!(creates, 2, "each resource was made once");

    shutdown.cancel();
    within("the agent to stop", agent).await.unwrap().unwrap();
    stop_worker.cancel();
    assert!(worker.await.unwrap().stopped.is_empty());
}
