//! Several sweepers at once, end to end: NATS, one `serve` with the writers, the projection and the gateway, two
//! `serve --roles sweeper` processes, and an agent. A thousand leases with a short time-to-live expire: each exactly
//! once, though both sweepers ask for every expiry (their requests carry the same command id within a retry window,
//! and whatever else gets through is refused by the partition: the lease is no longer active).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::Acquire;
use leasehold_schemas::ids::Millis;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::{CommandId, Envelope, Issuer, LeaseId, ResourceId, Timestamp, codec};
use tokio::time::Instant;

use crate::api::{Api, POLL, agent_name, allocate_with_capacity, wait_agent, wait_resource};
use crate::support::{Proc, logs};

const PARTITIONS: u32 = 8;
const LEASES: usize = 1000;
const RESOURCES: usize = 10;
/// The leases' time-to-live.
const TTL: Duration = Duration::from_secs(3);
/// How long all the leases may take to be granted and then to expire.
const LIMIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_expire_every_lease_exactly_once() {
    let Some(server) = NatsServer::start() else { return };
    let url = server.url().to_owned();
    let dir = tempfile::Builder::new().prefix("lh-e2e-sweepers-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data").display().to_string();
    let partitions = PARTITIONS.to_string();
    let serve_args = [
        "serve",
        "--roles",
        "worker,projector,gateway",
        "--nats",
        &url,
        "--partitions",
        &partitions,
        "--listen",
        "127.0.0.1:0",
        "--data",
        &data,
    ];
    let mut serve = Proc::spawn(dir.path(), "serve", &serve_args);
    let api = Api::new(serve.address().await);
    let sweeper = |name: &str| {
        let args = [
            "serve",
            "--roles",
            "sweeper",
            "--nats",
            &url,
            "--partitions",
            &partitions,
            "--listen",
            "127.0.0.1:0",
            "--name",
            name,
            "--sweep-interval",
            "100ms",
            "--sweep-retry",
            "2s",
        ];
        Proc::spawn(dir.path(), name, &args)
    };
    let mut sweepers = [sweeper("s1"), sweeper("s2")];
    let mut metrics = Vec::new();
    for process in &mut sweepers {
        metrics.push(Api::new(process.address().await));
    }
    let driver = format!("dir:{}", dir.path().join("a1").display());
    let agent_args = ["agent", "run", "--name", "a1", "--driver", &driver, "--nats", &url, "--sync-interval", "300ms"];
    let agent = Proc::spawn(dir.path(), "a1", &agent_args);
    let everyone = || [&serve, &agent, &sweepers[0], &sweepers[1]];
    wait_agent(&api, "a1", |a| a.status == "live", &everyone()).await;

    let a1 = agent_name("a1");
    let mut resources = Vec::new();
    for _ in 0..RESOURCES {
        let id = ResourceId::generate();
        api.accepted(&allocate_with_capacity(&a1, id, (LEASES / RESOURCES) as u32), &everyone()).await;
        resources.push(id);
    }
    for id in &resources {
        wait_resource(&api, &format!("a1.{id}"), |r| r.state == "active", &everyone()).await;
    }

    // A thousand leases, straight to the log.
    let log = JetStream::connect(JetStreamConfig::new(&url, 0)).await.expect("attach to the log");
    let leases: Vec<(LeaseId, ResourceId)> =
        (0..LEASES).map(|i| (LeaseId::generate(), resources[i % RESOURCES])).collect();
    let published = futures::stream::iter(leases.iter().map(|(lease, resource)| {
        let log = log.clone();
        let body = Acquire {
            agent: a1.clone(),
            resource: *resource,
            lease: *lease,
            holder: "e2e".into(),
            ttl: Some(Millis(TTL.as_millis() as u64)),
            wait_timeout: None,
        };
        async move {
            let id = CommandId::generate();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_millis();
            let envelope = Envelope::new(id, Issuer::new("e2e").expect("issuer"), Timestamp(now as u64), body);
            let subject = leasehold_schemas::subjects::ingress_subject_of(&envelope.body);
            let payload = codec::encode_command(&envelope).expect("encode");
            log.publish_command(&subject, &id.to_string(), payload.into()).await.map(|_| ())
        }
    }))
    .buffer_unordered(64)
    .collect::<Vec<_>>()
    .await;
    assert!(published.iter().all(Result::is_ok), "every acquire is stored");

    // Every lease is granted, then expires: exactly once each.
    let wanted: BTreeSet<LeaseId> = leases.iter().map(|(l, _)| *l).collect();
    let deadline = Instant::now() + LIMIT;
    let tally = loop {
        let tally = Tally::of(&log).await;
        let granted = wanted.iter().filter(|l| tally.granted.contains(l)).count();
        let expired = wanted.iter().filter(|l| tally.expired.contains_key(l)).count();
        if granted == LEASES && expired == LEASES {
            break tally;
        }
        for process in everyone() {
            assert!(process.log().find("panicked").is_none(), "{}", process.tail());
        }
        assert!(
            Instant::now() < deadline,
            "after {LIMIT:?}: {granted} of {LEASES} leases granted, {expired} expired\n{}",
            logs(everyone().into_iter())
        );
        tokio::time::sleep(POLL * 5).await;
    };
    let twice: Vec<_> = tally.expired.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "leases expired more than once: {twice:?}");
    assert_eq!(tally.expired.len(), LEASES, "only the test's leases expired");

    // Both sweepers asked.
    for (process, api) in sweepers.iter().zip(&metrics) {
        let text = api.text("/metrics").await.expect("/metrics");
        let sent = text
            .lines()
            .find(|l| l.starts_with("leasehold_sweeper_requests_total{type=\"sys.expire-lease\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(sent > 0, "sweeper asked for no expiry\n{}\n{text}", process.tail());
    }
    for mut process in sweepers {
        process.stop_cleanly().await;
    }
    let mut agent = agent;
    agent.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// What the outcome log says of the leases: granted ones, and how many times each expired.
#[derive(Debug, Default)]
struct Tally {
    granted: BTreeSet<LeaseId>,
    expired: BTreeMap<LeaseId, usize>,
}

impl Tally {
    async fn of(log: &JetStream) -> Tally {
        let mut tally = Tally::default();
        let mut from = 1;
        loop {
            let batch = log.read_outcomes(&OutcomeFilter::All, from, 2048).await.expect("read the outcomes");
            let Some(last) = batch.last() else { return tally };
            from = last.seq + 1;
            for stored in &batch {
                let outcome = codec::decode_outcome(&stored.payload).expect("an outcome");
                for effect in outcome.effects() {
                    match effect {
                        Effect::LeaseGranted { lease, .. } => {
                            tally.granted.insert(*lease);
                        }
                        Effect::LeaseExpired { lease } => *tally.expired.entry(*lease).or_default() += 1,
                        _ => {}
                    }
                }
            }
        }
    }
}
