//! The running sweeper over a real (in-memory embedded) log with a writer: work announced by an outcome is asked
//! for as soon as the outcome is folded, whatever the sweep interval; work that falls due with time alone still
//! goes out at the tick.

use std::time::Duration;

use futures::StreamExt;
use leasehold_log::embedded::Embedded;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::{Acquire, DefinePool, Register, Release, ReportCreated, ReportDestroyed};
use leasehold_schemas::ids::{AgentName, LeaseId, Millis, PoolName, Position, ResourceId};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, CommandId, Envelope, Issuer, Outcome, Uuid, codec};
use leasehold_sweeper::{SweeperConfig, SweeperMetrics};
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 4;
/// How long anything here may take: far below any sweep interval these tests configure for the reactive path.
const PATIENCE: Duration = Duration::from_secs(15);

/// A writer and a sweeper over one in-memory log, and every outcome decided so far.
struct Cluster {
    log: Embedded,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    feed: futures::stream::BoxStream<'static, Result<leasehold_log::StoredOutcome, leasehold_log::Error>>,
    outcomes: Vec<Outcome>,
    obs: u64,
}

impl Cluster {
    fn start(sweep_interval: Duration) -> Cluster {
        let log = Embedded::in_memory(PARTITIONS, leasehold_log::embedded::system_clock()).unwrap();
        let shutdown = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let (worker_log, stop) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let report = leasehold_worker::run(worker_log, leasehold_worker::WorkerConfig::new("w"), stop).await;
            assert!(report.stopped.is_empty(), "{:?}", report.stopped);
        });
        let config =
            SweeperConfig { interval: sweep_interval, retry_after: Duration::from_secs(2), ..SweeperConfig::new("t") };
        let (sweeper_log, stop) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            leasehold_sweeper::run(sweeper_log, config, SweeperMetrics::default(), stop).await.unwrap();
        });
        let feed = log.follow(OutcomeFilter::All, 1).boxed();
        Cluster { log, shutdown, tasks, feed, outcomes: Vec::new(), obs: 0 }
    }

    async fn send(&self, issuer: &str, body: impl Into<Command>) {
        let envelope = Envelope::new(CommandId::generate(), Issuer::new(issuer).unwrap(), now(), body.into());
        let payload = codec::encode_command(&envelope).unwrap();
        let subject = ingress_subject_of(&envelope.body);
        self.log.publish_command(&subject, &envelope.command_id.to_string(), payload.into()).await.unwrap();
    }

    /// Reads outcomes until one holds an effect `pick` answers for; fails after `within`.
    async fn until<T>(&mut self, what: &str, within: Duration, pick: impl Fn(Position, &Effect) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let next = tokio::time::timeout_at(deadline, self.feed.next())
                .await
                .unwrap_or_else(|_| panic!("no {what} within {within:?}; outcomes: {:#?}", self.types()))
                .expect("the feed goes on")
                .unwrap();
            let outcome = codec::decode_outcome(&next.payload).unwrap();
            let found = outcome.positioned_effects().find_map(|(p, e)| pick(p, e));
            self.outcomes.push(outcome);
            if let Some(found) = found {
                return found;
            }
        }
    }

    fn types(&self) -> Vec<String> {
        self.outcomes.iter().map(|o| o.command.type_name.clone()).collect()
    }

    fn next_obs(&mut self) -> u64 {
        self.obs += 1;
        self.obs
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        while let Some(joined) = self.tasks.join_next().await {
            joined.unwrap();
        }
    }
}

fn now() -> leasehold_schemas::ids::Timestamp {
    leasehold_log::embedded::system_clock()()
}

/// Registers `agent`; answers its epoch.
async fn register(cluster: &mut Cluster, agent: &AgentName) -> Position {
    let body = Register::new(agent.clone(), Uuid::from_u128(1));
    cluster.send(agent.as_str(), body).await;
    cluster.until("registration", PATIENCE, |p, e| matches!(e, Effect::AgentRegistered { .. }).then_some(p)).await
}

/// With a sweep interval of an hour, a pool's claim, grant and bind, and the free of a destroyed holder's address,
/// all go out as their outcomes arrive. (The sweeper used to plan only at its tick: nothing after its first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_holders_address_is_freed_without_waiting_for_the_tick() {
    let mut cluster = Cluster::start(Duration::from_secs(3600));
    let agent = AgentName::new("w1").unwrap();
    let pool = PoolName::new("net").unwrap();
    let epoch = register(&mut cluster, &agent).await;
    let kind = PoolKind::Slots { count: 1 };
    cluster
        .send(
            "ops",
            DefinePool {
                pool: pool.clone(),
                kind,
                cooldown: Some(Millis::from_secs(1)),
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            },
        )
        .await;
    let resource = ResourceId::generate();
    let mut allocate = leasehold_schemas::command::Allocate::new(agent.clone(), resource, "container", 1);
    allocate.pools = vec![pool.clone()];
    cluster.send("ci", allocate).await;
    // The grant is bound and the create ordered in one outcome.
    cluster.until("the create order", PATIENCE, |_, e| matches!(e, Effect::CreateOrdered { .. }).then_some(())).await;
    let obs = cluster.next_obs();
    cluster.send("w1", ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id: None }).await;
    cluster.send("ci", Release { agent: agent.clone(), resource, reason: None }).await;
    let ordered =
        cluster.until("the release", PATIENCE, |p, e| matches!(e, Effect::ResourceReleasing { .. }).then_some(p)).await;

    let obs = cluster.next_obs();
    let destroyed = tokio::time::Instant::now();
    cluster.send("w1", ReportDestroyed { agent: agent.clone(), epoch, obs, resource, ordered }).await;
    cluster
        .until("the claim releasable", PATIENCE, |_, e| matches!(e, Effect::ClaimReleasable { .. }).then_some(()))
        .await;
    let freed = cluster
        .until("the address freed", PATIENCE, |_, e| match e {
            Effect::ClaimFreed { holder, .. } => Some(holder.resource),
            _ => None,
        })
        .await;
    assert_eq!(freed, resource);
    let took = destroyed.elapsed();
    assert!(took < Duration::from_secs(5), "the free took {took:?} from the destroy report");
    let frees = cluster.outcomes.iter().filter(|o| o.command.type_name == "sys.free").count();
    assert_eq!(frees, 1, "one free asked for: {:#?}", cluster.types());
    cluster.stop().await;
}

/// A deadline that passes with no outcome to announce it (a lease's time to live) is asked for at the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passes_in_silence_is_asked_for_at_the_tick() {
    let mut cluster = Cluster::start(Duration::from_millis(100));
    let agent = AgentName::new("w1").unwrap();
    let epoch = register(&mut cluster, &agent).await;
    let resource = ResourceId::generate();
    cluster.send("ci", leasehold_schemas::command::Allocate::new(agent.clone(), resource, "volume", 1)).await;
    cluster.until("the create order", PATIENCE, |_, e| matches!(e, Effect::CreateOrdered { .. }).then_some(())).await;
    let obs = cluster.next_obs();
    cluster.send("w1", ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id: None }).await;
    let lease = LeaseId::generate();
    let acquire = Acquire {
        agent: agent.clone(),
        resource,
        lease,
        holder: "build".to_owned(),
        ttl: Some(Millis::from_secs(1)),
        wait_timeout: None,
        priority: 0,
    };
    cluster.send("ci", acquire).await;
    cluster.until("the grant", PATIENCE, |_, e| matches!(e, Effect::LeaseGranted { .. }).then_some(())).await;
    let expired = cluster
        .until("the lease expired", PATIENCE, |_, e| match e {
            Effect::LeaseExpired { lease } => Some(*lease),
            _ => None,
        })
        .await;
    assert_eq!(expired, lease);
    cluster.stop().await;
}
