//! The projector against a real worker on the embedded log: the read models say what the log decided (and equal
//! the writer's own fold), resume after a restart, rebuild from sequence 1 to the same digests, and stop on a broken
//! chain or an undecodable outcome without applying it.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::intercept::{Intercept, Intercepted};
use leasehold_log::{Error as LogError, Log, OutcomeFilter, StoredOutcome};
use leasehold_projector::timeline::Thing;
use leasehold_projector::{At, Error, History, LeaseQuery, Projector, Reader, ResourceQuery, ResourceView};
use leasehold_schemas::command::{Acquire, Allocate, Claim, DefinePool, Register, Release, ReportCreated};
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, LeaseId, PoolName, Position, ResourceId, ResourceRef, Source, Timestamp,
};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{Command, Envelope, Outcome, Uuid, codec};
use leasehold_worker::{WorkerConfig, WriterConfig, fold_partition};
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 4;

struct Client {
    log: Embedded,
    reader: Reader,
    n: u64,
}

impl Client {
    fn now() -> Timestamp {
        leasehold_log::embedded::system_clock()()
    }

    fn id(&mut self) -> [u8; 10] {
        self.n += 1;
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.n.to_be_bytes());
        entropy
    }

    /// Publishes a command and waits until the projection holds its outcome.
    async fn submit(&mut self, issuer: &str, body: impl Into<Command>) -> Outcome {
        let now = Self::now();
        let envelope = Envelope::new(CommandId::from_parts(now.0, self.id()), Issuer::new(issuer).unwrap(), now, body);
        let id = envelope.command_id.to_string();
        self.log
            .publish_command(&ingress_subject_of(&envelope.body), &id, codec::encode_command(&envelope).unwrap().into())
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some((_, outcome)) = self.reader.outcome(&id).unwrap().into_iter().next() {
                return outcome;
            }
            assert!(tokio::time::Instant::now() < deadline, "no outcome for {id} in 20 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn position_of(outcome: &Outcome, want: impl Fn(&Effect) -> bool) -> Position {
    outcome.positioned_effects().find(|(_, e)| want(e)).map(|(p, _)| p).unwrap_or_else(|| panic!("{outcome:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_models_say_what_the_log_decided_and_rebuild_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let log = Embedded::open(&dir.path().join("log"), PARTITIONS).unwrap();
    let shutdown = CancellationToken::new();
    // Snapshots every few outcomes, so a restarted projector folds from them.
    let config = WorkerConfig {
        writer: WriterConfig { snapshot_every: 3, ..WriterConfig::default() },
        ..WorkerConfig::new("w")
    };
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let mut projector = Projector::open(&dir.path().join("projection"), PARTITIONS).unwrap();
    let reader = projector.reader();
    let projecting = {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tokio::spawn(async move {
            projector.run(&log, &shutdown).await.unwrap();
            projector
        })
    };
    let mut client = Client { log: log.clone(), reader: reader.clone(), n: 0 };

    let pool = PoolName::new("ips").unwrap();
    client
        .submit(
            "ops",
            DefinePool {
                pool: pool.clone(),
                kind: PoolKind::Slots { count: 4 },
                cooldown: None,
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            },
        )
        .await;
    let w1 = AgentName::new("w1").unwrap();
    let registered = client
        .submit(
            "w1",
            Register { settings: Some(AgentSettings::default()), ..Register::new(w1.clone(), Uuid::from_u128(1)) },
        )
        .await;
    let epoch = position_of(&registered, |e| matches!(e, Effect::AgentRegistered { .. }));
    let mut ids = Vec::new();
    for i in 0..4 {
        let resource = ResourceId::from_parts(Client::now().0, [7, i, 0, 0, 0, 0, 0, 0, 0, 1]);
        let pools = if i == 0 { vec![pool.clone()] } else { vec![] };
        let allocated = client
            .submit(
                "ci",
                Allocate {
                    agent: w1.clone(),
                    resource,
                    kind: "volume".into(),
                    capacity: 2,
                    attributes: BTreeMap::new(),
                    parent: None,
                    pools,
                    wait: None,
                },
            )
            .await;
        assert!(allocated.rejection().is_none(), "{allocated:?}");
        if i == 0 {
            let wanted = position_of(&allocated, |e| matches!(e, Effect::ClaimWanted { .. }));
            let source = Source { partition: partition_of_agent(&w1, PARTITIONS), position: wanted };
            let granted = client
                .submit("sweeper", Claim { pool: pool.clone(), holder: ResourceRef::new(w1.clone(), resource), source })
                .await;
            assert!(granted.rejection().is_none(), "{granted:?}");
        }
        ids.push(resource);
    }
    for (obs, resource) in ids[1..].iter().enumerate() {
        let created = client
            .submit(
                "w1",
                ReportCreated {
                    agent: w1.clone(),
                    epoch,
                    obs: obs as u64 + 1,
                    resource: *resource,
                    native_id: Some(format!("vol-{obs}")),
                },
            )
            .await;
        assert!(created.rejection().is_none(), "{created:?}");
    }
    let lease = LeaseId::from_parts(Client::now().0, [8; 10]);
    let acquired = client
        .submit(
            "ci",
            Acquire {
                agent: w1.clone(),
                resource: ids[1],
                lease,
                holder: "build-7".into(),
                ttl: None,
                wait_timeout: None,
                priority: 0,
            },
        )
        .await;
    let token = position_of(&acquired, |e| matches!(e, Effect::LeaseGranted { .. }));
    client.submit("ops", Release { agent: w1.clone(), resource: ids[3], reason: Some("done".into()) }).await;
    let unknown = ResourceId::from_parts(Client::now().0, [9; 10]);
    let rejected = client.submit("ops", Release { agent: w1.clone(), resource: unknown, reason: None }).await;
    assert!(rejected.rejection().is_some(), "a release of an unknown resource is a recorded rejection");

    // What the read models say.
    let r = |id: ResourceId| reader.resource(&ResourceRef::new(w1.clone(), id)).unwrap().expect("a resource record");
    assert_eq!(r(ids[0]).state, "pending");
    assert_eq!(r(ids[0]).claims[0].status, "wanted", "granted by the pool, not bound yet");
    assert_eq!(r(ids[1]).state, "active");
    assert_eq!(r(ids[1]).native_id.as_deref(), Some("vol-0"));
    let briefs = r(ids[1]).leases;
    assert_eq!(briefs.len(), 1);
    assert_eq!((briefs[0].id.clone(), briefs[0].state.as_str()), (format!("w1.{lease}"), "active"));
    assert_eq!(r(ids[3]).state, "releasing");
    let leases = reader.leases_of(&format!("w1.{}", ids[1])).unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!((leases[0].state.as_str(), leases[0].token), ("active", Some(token.0)));
    assert_eq!(reader.lease(&format!("w1.{lease}")).unwrap().unwrap().holder, "build-7");
    assert!(r(ids[0]).created_seq < r(ids[1]).created_seq, "allocated in that order");
    assert!(r(ids[1]).created_seq < r(ids[1]).as_of, "activated after its allocation");
    let counts = reader.counts().unwrap();
    let count =
        |what: &str, state: &str| counts.iter().find(|((w, s), _)| w == what && s == state).map_or(0, |(_, n)| *n);
    assert_eq!((count("resources", "active"), count("resources", "pending"), count("leases", "active")), (2, 1, 1));
    let active = reader.resources(&ResourceQuery { state: Some("active".into()), ..Default::default() }).unwrap();
    assert_eq!(active.iter().map(|v| v.id.clone()).collect::<Vec<_>>(), vec![ids[1].to_string(), ids[2].to_string()]);
    let of_agent = reader.resources(&ResourceQuery { agent: Some("w1".into()), ..Default::default() }).unwrap();
    assert_eq!(of_agent.len(), 4);
    assert!(reader.resources(&ResourceQuery { agent: Some("w2".into()), ..Default::default() }).unwrap().is_empty());
    // Pages come in reference order, each from the key after the last one, in the table and in an index.
    for agent in [None, Some("w1".to_owned())] {
        let every: Vec<String> = reader
            .resources(&ResourceQuery { agent: agent.clone(), ..Default::default() })
            .unwrap()
            .into_iter()
            .map(|v| v.reference)
            .collect();
        assert!(every.windows(2).all(|w| w[0] < w[1]), "{every:?}");
        let (mut paged, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let query =
                ResourceQuery { agent: agent.clone(), after: after.clone(), limit: Some(3), ..Default::default() };
            let page = reader.resources_page(&query).unwrap();
            assert!(page.records.len() <= 3);
            paged.extend(page.records.into_iter().map(|v| v.reference));
            pages += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(paged, every, "pages of 3 give every resource once, in order");
        assert_eq!(pages, every.len() / 3 + 1);
    }
    let held = reader.resources(&ResourceQuery { holder: Some("build-7".into()), ..Default::default() }).unwrap();
    assert_eq!(held.iter().map(|v| v.id.clone()).collect::<Vec<_>>(), vec![ids[1].to_string()]);
    assert!(
        reader.resources(&ResourceQuery { holder: Some("nobody".into()), ..Default::default() }).unwrap().is_empty()
    );
    let leases_of_holder =
        reader.leases_page(&LeaseQuery { holder: Some("build-7".into()), ..Default::default() }).unwrap();
    assert_eq!((leases_of_holder.records.len(), leases_of_holder.next), (1, None));
    let attrs = vec![("no-such".to_owned(), "attr".to_owned())];
    assert!(reader.resources(&ResourceQuery { attrs: attrs.clone(), ..Default::default() }).unwrap().is_empty());
    assert!(reader.leases_page(&LeaseQuery { attrs, ..Default::default() }).unwrap().records.is_empty());
    let agents = reader.agents().unwrap();
    assert_eq!((agents[0].name.as_str(), agents[0].status.as_str(), agents[0].held), ("w1", "live", 2));
    let pools = reader.pools().unwrap();
    assert_eq!((pools[0].name.as_str(), pools[0].held), ("ips", 1));
    let holders = reader.holders("ips").unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].holder, format!("w1.{}", ids[0]));

    // The timeline index: each thing's steps, read from its own rows.
    let timelines = [
        Thing::Resource(ids[0]),
        Thing::Resource(ids[1]),
        Thing::Resource(ids[3]),
        Thing::Resource(unknown),
        Thing::Lease(lease),
        Thing::Value(pool.clone(), PoolValue::Slot(0)),
    ];
    let histories = |reader: &Reader| -> Vec<History> {
        timelines.iter().map(|thing| reader.history(thing, At::First, 100).unwrap()).collect()
    };
    let commands_of = |history: &History| -> Vec<String> {
        history.entries.iter().map(|e| e.outcome.command.type_name.clone()).collect()
    };
    let before = histories(&reader);
    assert_eq!(commands_of(&before[0]), ["op.allocate", "sys.claim"], "the pool's grant is in the holder's timeline");
    assert_eq!(commands_of(&before[1]), ["op.allocate", "agent.report-created", "op.acquire"]);
    assert_eq!(commands_of(&before[2]), ["op.allocate", "agent.report-created", "op.release"]);
    assert_eq!(commands_of(&before[3]), ["op.release"], "a rejection is in the timeline of what its command names");
    assert!(before[3].entries[0].effects.is_empty() && before[3].entries[0].outcome.rejection().is_some());
    assert_eq!(commands_of(&before[4]), ["op.acquire"]);
    assert_eq!(commands_of(&before[5]), ["sys.claim"], "the slot's grant");
    // Pages of one, both ways, give the same steps.
    let every = &before[1].entries;
    let (mut forward, mut at) = (Vec::new(), At::First);
    loop {
        let page = reader.history(&timelines[1], at, 1).unwrap();
        forward.extend(page.entries.iter().map(|e| e.seq));
        match page.newer {
            Some(newer) => at = At::After(newer),
            None => break,
        }
    }
    let (mut backward, mut at) = (Vec::new(), At::Last);
    loop {
        let page = reader.history(&timelines[1], at, 1).unwrap();
        backward.splice(0..0, page.entries.iter().map(|e| e.seq));
        match page.older {
            Some(older) => at = At::Before(older),
            None => break,
        }
    }
    let seqs: Vec<u64> = every.iter().map(|e| e.seq).collect();
    assert_eq!((&forward, &backward), (&seqs, &seqs), "pages of one step, newer and older");

    shutdown.cancel();
    assert!(worker.await.unwrap().stopped.is_empty());
    let projector = projecting.await.unwrap();

    // Every resource record equals the writer's own fold of the log.
    for p in 0..PARTITIONS {
        let folded = fold_partition(&log, p, 0, &WriterConfig::default()).await.unwrap();
        assert!(folded.state == projector.states()[&p], "partition {p}: the projector folds as the writer does");
        for resource in folded.state.resources() {
            let mut view = reader.resource(&resource.reference()).unwrap().unwrap();
            view.as_of = 0;
            // Followed from the outcomes (when the state began) and worked out when read (what it waits on), not
            // part of the state's record.
            assert!(view.state_since.is_some(), "{view:?}");
            (view.state_since, view.waiting_on) = (None, None);
            assert_eq!(view, ResourceView::of(&folded.state, resource, view.created_seq, 0, view.updated_at));
        }
    }

    // A restart resumes where it stopped; a rebuild from sequence 1 gives the same tables.
    let digests = projector.digests().unwrap();
    let applied = projector.applied();
    assert_eq!(
        applied,
        log.read_outcomes(&leasehold_log::OutcomeFilter::All, 1, 10_000).await.unwrap().last().unwrap().seq
    );
    // Every handle on the file goes (a reader holds the database too).
    drop((projector, reader, client));
    let mut projector = Projector::open(&dir.path().join("projection"), PARTITIONS).unwrap();
    assert_eq!(projector.applied(), applied);
    // The restart folds each partition from the writers' latest snapshot: it reads fewer outcomes than the log holds.
    let counted = Intercepted { log: log.clone(), hooks: CountReads::default() };
    assert_eq!(projector.catch_up(&counted).await.unwrap(), applied);
    let read = counted.hooks.0.load(Ordering::SeqCst);
    let total = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap().len();
    assert!(read < total, "the restart read {read} of the log's {total} outcomes: it did not start from snapshots");
    assert_eq!(projector.digests().unwrap(), digests);
    let mut from_snapshots = 0;
    for p in 0..PARTITIONS {
        let folded = fold_partition(&log, p, 0, &WriterConfig::default()).await.unwrap();
        assert!(folded.state == projector.states()[&p], "partition {p}: the restarted projector folds as the writer");
        from_snapshots += u32::from(log.latest_snapshot(p).await.unwrap().is_some());
    }
    assert!(from_snapshots > 0, "the restart folded from a writer's snapshot");
    projector.drop_all().unwrap();
    assert_eq!(projector.applied(), 0);
    assert_ne!(projector.digests().unwrap(), digests);
    assert_eq!(projector.catch_up(&log).await.unwrap(), applied);
    assert_eq!(projector.digests().unwrap(), digests, "a rebuild from sequence 1 gives the same content");
    assert_eq!(histories(&projector.reader()), before, "the rebuilt timeline, with the rejection its command told");

    // Without the commands (a log whose commands aged out), the timeline digest is the same: it covers what the
    // outcomes say; the rejection, which only its command names, is then in no timeline.
    let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, 10_000).await.unwrap();
    projector.drop_all().unwrap();
    projector.apply_batch(&outcomes).unwrap();
    assert_eq!(projector.digests().unwrap()["timeline"], digests["timeline"]);
    let reader = projector.reader();
    assert!(reader.history(&Thing::Resource(unknown), At::First, 100).unwrap().entries.is_empty());
    assert_eq!(reader.history(&Thing::Resource(ids[1]), At::First, 100).unwrap(), before[1]);
}

/// Counts the outcomes read by partition.
#[derive(Debug, Clone, Default)]
struct CountReads(Arc<AtomicUsize>);

impl Intercept<Embedded> for CountReads {
    type Owner = EmbeddedOwner;

    async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, LogError> {
        log.own(partition, worker).await
    }

    async fn read_outcomes(
        &self,
        log: &Embedded,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredOutcome>, LogError> {
        let read = log.read_outcomes(filter, from, max).await?;
        if matches!(filter, OutcomeFilter::Partition(_)) {
            self.0.fetch_add(read.len(), Ordering::SeqCst);
        }
        Ok(read)
    }
}

fn stored(seq: u64, prev_seq: u64, payload: Bytes) -> StoredOutcome {
    StoredOutcome { seq, partition: 0, key: "w1".into(), cmd_id: "x".into(), cmd_seq: seq, part: 0, prev_seq, payload }
}

#[tokio::test]
async fn a_broken_chain_or_an_undecodable_outcome_stops_the_projector() {
    let mut driver = leasehold_domain::driver::Driver::new(0, 1, Timestamp(1_800_000_000_000));
    let w1 = AgentName::new("w1").unwrap();
    let outcome = driver
        .submit("w1", Register { settings: Some(AgentSettings::default()), ..Register::new(w1, Uuid::from_u128(1)) });
    let payload = Bytes::from(codec::encode_outcome(&outcome).unwrap());
    let mut projector = Projector::in_memory(1).unwrap();
    let broken = projector.apply_batch(&[stored(1, 5, payload.clone())]).unwrap_err();
    assert!(matches!(broken, Error::ChainBroken { seq: 1, prev_seq: 5, expected: 0, .. }), "{broken}");
    assert_eq!(projector.applied(), 0);
    assert!(projector.reader().agents().unwrap().is_empty(), "nothing applied");
    // A projector that failed goes no further: its memory may be ahead of its tables.
    let refused = projector.apply_batch(&[stored(1, 0, payload.clone())]).unwrap_err();
    assert!(refused.to_string().contains("open it again"), "{refused}");

    let mut projector = Projector::in_memory(1).unwrap();
    let garbage = projector.apply_batch(&[stored(1, 0, Bytes::from_static(b"\x01garbage"))]).unwrap_err();
    assert!(matches!(garbage, Error::Undecodable { seq: 1, .. }), "{garbage}");
    assert!(garbage.to_string().contains("never skips"), "{garbage}");
    assert_eq!(projector.applied(), 0, "nothing applied");

    let mut projector = Projector::in_memory(1).unwrap();
    projector.apply_batch(&[stored(1, 0, payload)]).unwrap();
    assert_eq!(projector.applied(), 1);
    assert_eq!(projector.reader().agents().unwrap()[0].name, "w1");
}

/// A projection made by another build (another layout of the read models) is dropped when opened, and folded again
/// from sequence 1; the partition count stays checked.
#[test]
fn a_projection_of_another_layout_is_dropped_and_folded_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = redb::Database::create(dir.path().join(leasehold_projector::FILE_NAME)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap();
            meta.insert("partitions", u64::from(PARTITIONS)).unwrap();
            meta.insert("applied", 42).unwrap();
            let mut old = txn.open_table(redb::TableDefinition::<(&str, u32), (u64, &str)>::new("outcomes")).unwrap();
            old.insert(("a-command", 0), (7, "{}")).unwrap();
        }
        txn.commit().unwrap();
    }
    let projector = Projector::open(dir.path(), PARTITIONS).unwrap();
    assert_eq!(projector.applied(), 0, "layout 1 (no version) is folded again from sequence 1");
    drop(projector);
    let projector = Projector::open(dir.path(), PARTITIONS).unwrap();
    assert_eq!(projector.applied(), 0);
    drop(projector);
    let err = Projector::open(dir.path(), PARTITIONS + 1).unwrap_err().to_string();
    assert!(err.contains("partitions"), "{err}");
}

/// Folds `outcomes` (the whole history of partition 0 of 1) into `projector`, from the first not applied yet.
fn feed(projector: &mut Projector, outcomes: &[Outcome]) {
    let from = projector.applied();
    let batch: Vec<StoredOutcome> = outcomes
        .iter()
        .enumerate()
        .skip(from as usize)
        .map(|(i, outcome)| {
            let mut stored = stored(i as u64 + 1, i as u64, Bytes::from(codec::encode_outcome(outcome).unwrap()));
            stored.key = outcome.command.key.token();
            stored
        })
        .collect();
    projector.apply_batch(&batch).unwrap();
}

/// `GET /v1/policy` reads the policy of every partition (the defaults until one is recorded); an agent that follows
/// the policy shows the settings in force once it changes, though that outcome is about the settings' key; a pool
/// defined without a cool-down shows the policy's, and a deleted pool leaves the list.
#[test]
fn the_policy_and_what_follows_it_are_read_as_recorded() {
    use leasehold_schemas::command::{DeletePool, SetPartitionSettings};
    use leasehold_schemas::settings::ClusterPolicy;

    let mut driver = leasehold_domain::driver::Driver::new(0, 1, Timestamp(1_800_000_000_000));
    let w1 = AgentName::new("w1").unwrap();
    driver.submit("w1", Register::new(w1, Uuid::from_u128(1)));
    let mut projector = Projector::in_memory(1).unwrap();
    feed(&mut projector, driver.outcomes());
    let reader = projector.reader();
    let policies = reader.policies().unwrap();
    assert_eq!(policies.len(), 1);
    assert!(!policies[0].recorded, "{policies:?}");
    assert_eq!(policies[0].policy, ClusterPolicy::DEFAULT);
    assert_eq!(policies[0].key, "@lh-settings-0");
    let agent = &reader.agents().unwrap()[0];
    assert_eq!((agent.settings["stall_after"].as_u64(), agent.own_settings), (Some(60_000), false));

    let mut policy = ClusterPolicy::DEFAULT;
    policy.agent.stall_after = leasehold_schemas::Millis::from_secs(20);
    policy.claim_cooldown = leasehold_schemas::Millis::from_secs(7);
    let key = leasehold_schemas::subjects::settings_key(0, 1);
    let body = SetPartitionSettings {
        key,
        partition: 0,
        outcome_horizon: None,
        policy: Some(policy.clone()),
        if_no_policy: false,
        gc: None,
        max_priority: None,
    };
    assert!(driver.submit("ops", body).rejection().is_none());
    driver.submit(
        "ops",
        DefinePool {
            pool: PoolName::new("ips").unwrap(),
            kind: PoolKind::Slots { count: 2 },
            cooldown: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        },
    );
    feed(&mut projector, driver.outcomes());
    let policies = reader.policies().unwrap();
    assert!(policies[0].recorded);
    assert_eq!(policies[0].policy, policy);
    assert_eq!(reader.agents().unwrap()[0].settings["stall_after"].as_u64(), Some(20_000), "it follows the policy");
    assert_eq!(reader.pools().unwrap()[0].cooldown_ms, 7_000);

    driver.submit("ops", DeletePool { pool: PoolName::new("ips").unwrap() });
    feed(&mut projector, driver.outcomes());
    assert!(reader.pools().unwrap().is_empty(), "a deleted pool leaves the list");
}
