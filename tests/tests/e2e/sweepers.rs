//! Several sweepers at once, end to end: NATS, one `serve` with the writers, the projection and the gateway, two
//! `serve --roles sweeper` processes, and an agent. A thousand leases with a short time-to-live expire: each exactly
//! once, though both sweepers ask for every expiry (their requests carry the same command id within a retry window,
//! and whatever else gets through is refused by the partition: the lease is no longer active).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use leasehold_log::OutcomeFilter;
use leasehold_log::jetstream::JetStream;
use leasehold_schemas::command::Acquire;
use leasehold_schemas::ids::Millis;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::{LeaseId, ResourceId};
use tokio::time::Instant;

use crate::api::{Api, POLL, agent_name, allocate_with_capacity, wait_agent, wait_resource};
use crate::nats::{NatsRun, outcomes, publish};
use crate::support::logs;

const PARTITIONS: u32 = 8;
const LEASES: usize = 1000;
const RESOURCES: usize = 10;
/// The leases' time-to-live.
const TTL: Duration = Duration::from_secs(3);
/// How long all the leases may take to be granted and then to expire.
const LIMIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_expire_every_lease_exactly_once() {
    let Some(run) = NatsRun::start("sweepers", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &["--roles", "worker,projector,gateway"]);
    let api = Api::new(serve.ready().await);
    let sweeper = |name: &str| {
        run.serve(name, &["--roles", "sweeper", "--name", name, "--sweep-interval", "100ms", "--sweep-retry", "2s"])
    };
    let mut sweepers = [sweeper("s1"), sweeper("s2")];
    let mut metrics = Vec::new();
    for process in &mut sweepers {
        metrics.push(Api::new(process.address().await));
    }
    let agent = run.agent("a1", &[]);
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
    let log = run.log().await;
    let leases: Vec<(LeaseId, ResourceId)> =
        (0..LEASES).map(|i| (LeaseId::generate(), resources[i % RESOURCES])).collect();
    futures::stream::iter(leases.iter().map(|(lease, resource)| {
        let body = Acquire {
            agent: a1.clone(),
            resource: *resource,
            lease: *lease,
            holder: "e2e".into(),
            ttl: Some(Millis(TTL.as_millis() as u64)),
            wait_timeout: None,
            priority: 0,
        };
        publish(&log, "e2e", body)
    }))
    .buffer_unordered(64)
    .collect::<Vec<_>>()
    .await;

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
        for (_, outcome) in outcomes(log, &OutcomeFilter::All).await {
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
        tally
    }
}
