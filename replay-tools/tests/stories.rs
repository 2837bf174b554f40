//! Whole stories told to the domain across two partitions (an agent's and a pool's, the sweeper played by hand) and
//! asked back through `history` and `why`: a thing's history holds every step about it with its effects, and `why`
//! says why an identifier was freed.

use bytes::Bytes;
use futures::StreamExt;
use leasehold_domain::driver::Driver;
use leasehold_log::export::Entry;
use leasehold_log::{CommandRecord, StoredOutcome};
use leasehold_replay::history::{self, Row, Target};
use leasehold_replay::why::{self, Query};
use leasehold_schemas::command::{
    Acquire, Allocate, BindClaim, Claim, DefinePool, ExpireLease, Free, FreeOrphan, GarbageReport, MarkGone,
    MarkStalled, Register, Release, ReleaseLease, ReportCreated, ReportDestroyed, SyncReport,
};
use leasehold_schemas::ids::{Key, Millis, Position, ResourceRef, Source, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{AgentName, Command, Envelope, LeaseId, Outcome, PoolName, ResourceId, codec};

const START: Timestamp = Timestamp(1_790_000_000_000);

/// Two partitions in one log: each decides its own commands, outcomes are numbered in the order they land.
struct Log {
    partitions: Vec<Driver>,
    entries: Vec<Entry>,
    seq: u64,
    prev: Vec<u64>,
}

impl Log {
    fn new() -> Self {
        Log {
            partitions: vec![Driver::new(0, 2, START), Driver::new(1, 2, START)],
            entries: vec![],
            seq: 0,
            prev: vec![0, 0],
        }
    }

    /// Decides `body` in the partition of its key; its outcome's parts, as appended.
    fn submit(&mut self, issuer: &str, body: impl Into<Command>) -> Vec<Outcome> {
        let body = body.into();
        let partition = partition_of_key(&body.key(), 2);
        for driver in &mut self.partitions {
            driver.advance(Millis(7));
        }
        let driver = &mut self.partitions[partition as usize];
        let envelope: Envelope = driver.envelope(issuer, body);
        let (seq, time) = (driver.next_seq(), driver.now());
        let before = driver.outcomes().len();
        driver.submit_envelope(&envelope);
        let subject = leasehold_schemas::subjects::command_subject(
            partition,
            envelope.body.class(),
            &envelope.body.key(),
            envelope.body.subject_id(),
        );
        let payload = Bytes::from(codec::encode_command(&envelope).expect("encodes"));
        self.entries.push(Entry::Command { partition, record: CommandRecord { seq, subject, time, payload } });
        let appended = driver.outcomes()[before..].to_vec();
        for outcome in &appended {
            self.seq += 1;
            self.entries.push(Entry::Outcome(StoredOutcome {
                seq: self.seq,
                partition,
                key: outcome.command.key.token(),
                cmd_id: outcome.command.id.to_string(),
                cmd_seq: outcome.cmd_seq,
                part: outcome.part,
                prev_seq: self.prev[partition as usize],
                payload: Bytes::from(codec::encode_outcome(outcome).expect("encodes")),
            }));
            self.prev[partition as usize] = self.seq;
        }
        assert!(
            appended.iter().all(|o| o.rejection().is_none()),
            "the story's commands are accepted: {:?}",
            appended.iter().map(|o| o.rejection()).collect::<Vec<_>>()
        );
        appended
    }

    fn advance(&mut self, by: Millis) {
        for driver in &mut self.partitions {
            driver.advance(by);
        }
    }

    fn agent_partition(&self, agent: &AgentName) -> &Driver {
        &self.partitions[partition_of_key(&Key::Agent(agent.clone()), 2) as usize]
    }

    fn entries(&self) -> futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>> {
        futures::stream::iter(self.entries.clone().into_iter().map(Ok)).boxed()
    }

    async fn history(&self, target: &str) -> Vec<Row> {
        let target: Target = target.parse().expect("a target");
        history::history(2, self.entries(), &target, |_| {}).await.expect("folds")
    }
}

/// The sweeper: the effect of `name` in `outcome`, with its position, as a source of a command to the other side.
fn effect_at<'o>(outcomes: &'o [Outcome], name: &str) -> (Source, &'o Effect) {
    outcomes
        .iter()
        .find_map(|o| {
            o.positioned_effects()
                .find(|(_, e)| e.name() == name)
                .map(|(position, e)| (Source { partition: o.partition, position }, e))
        })
        .unwrap_or_else(|| panic!("no {name} in {outcomes:?}"))
}

fn lease_token(outcomes: &[Outcome]) -> Position {
    effect_at(outcomes, "lease-granted").0.position
}

/// An agent in partition 0 with a resource holding an address of a pool in partition 1.
struct Story {
    log: Log,
    agent: AgentName,
    pool: PoolName,
    resource: ResourceId,
    epoch: Position,
    obs: u64,
    /// The grant's token.
    token: Position,
}

impl Story {
    fn begin() -> Story {
        Story::begin_with(leasehold_schemas::pool::OrphanPolicy::Release)
    }

    /// The story with a pool whose orphan policy is `orphans`.
    fn begin_with(orphans: leasehold_schemas::pool::OrphanPolicy) -> Story {
        let agent = AgentName::new("worker-b").expect("a name");
        let pool = PoolName::new("overlay").expect("a name");
        assert_eq!(partition_of_key(&Key::Agent(agent.clone()), 2), 0);
        assert_eq!(partition_of_key(&Key::Pool(pool.clone()), 2), 1);
        let mut log = Log::new();
        let subnet = PoolKind::Ipv4 {
            network: "10.0.0.0".parse().unwrap(),
            prefix_len: 29,
            exclude: vec!["10.0.0.1".parse().unwrap()],
        };
        log.submit("op:alice", DefinePool { pool: pool.clone(), kind: subnet, cooldown: None, orphans });
        let incarnation = leasehold_schemas::Uuid::from_u128(1);
        log.submit("worker-b", Register::new(agent.clone(), incarnation));
        let epoch = log.agent_partition(&agent).state().agent(&agent).expect("registered").epoch;
        let resource = log.partitions[0].new_resource_id();
        let mut allocate = Allocate::new(agent.clone(), resource, "container", 2);
        allocate.pools = vec![pool.clone()];
        let allocated = log.submit("op:alice", allocate);
        let (wanted, _) = effect_at(&allocated, "claim-wanted");
        let holder = ResourceRef::new(agent.clone(), resource);
        let granted = log.submit("sweeper-1", Claim { pool: pool.clone(), holder: holder.clone(), source: wanted });
        let (grant, effect) = effect_at(&granted, "claim-granted");
        let Effect::ClaimGranted { value, .. } = effect else { unreachable!("named claim-granted") };
        let bind = BindClaim {
            holder,
            pool: pool.clone(),
            value: *value,
            token: grant.position,
            source: grant,
            wanted,
            definition: None,
            orphans,
        };
        log.submit("sweeper-1", bind);
        let mut story = Story { log, agent, pool, resource, epoch, obs: 0, token: grant.position };
        let created =
            ReportCreated { agent: story.agent.clone(), epoch, obs: story.next_obs(), resource, native_id: None };
        story.log.submit("worker-b", created);
        story
    }

    fn next_obs(&mut self) -> u64 {
        self.obs += 1;
        self.obs
    }

    fn holder(&self) -> ResourceRef {
        ResourceRef::new(self.agent.clone(), self.resource)
    }

    fn acquire(&mut self, ttl: Option<Millis>) -> (LeaseId, Vec<Outcome>) {
        let lease = self.log.partitions[0].new_lease_id();
        let acquire = Acquire {
            agent: self.agent.clone(),
            resource: self.resource,
            lease,
            holder: "build-42".into(),
            ttl,
            wait_timeout: None,
            priority: 0,
        };
        (lease, self.log.submit("op:alice", acquire))
    }

    /// The sweeper frees the claim the holder's partition let go in `outcomes`, with the cause that partition
    /// recorded.
    fn free(&mut self, outcomes: &[Outcome]) {
        let (source, _) = effect_at(outcomes, "claim-releasable");
        let state = self.log.agent_partition(&self.agent).state();
        let slot = state.resource(self.resource).and_then(|r| r.claims.get(&self.pool)).cloned();
        let Some(leasehold_domain::state::ClaimSlot::Returned { cause, .. }) = slot else {
            panic!("the claim was let go: {slot:?}")
        };
        let free = Free { pool: self.pool.clone(), holder: self.holder(), token: Some(self.token), source, cause };
        let freed = self.log.submit("sweeper-1", free);
        effect_at(&freed, "claim-freed");
    }
}

fn row_of<'r>(rows: &'r [Row], command: &str) -> &'r Row {
    rows.iter().find(|r| r.command == command).unwrap_or_else(|| {
        panic!("no {command} in the history: {:?}", rows.iter().map(|r| &r.command).collect::<Vec<_>>())
    })
}

fn has_effect(row: &Row, name: &str) -> bool {
    row.effects.iter().any(|e| e.split_whitespace().nth(1) == Some(name))
}

#[track_caller]
fn assert_effects(row: &Row, names: &[&str]) {
    for name in names {
        assert!(has_effect(row, name), "{} at {} lists {name}: {:?}", row.command, row.seq, row.effects);
    }
}

#[track_caller]
fn assert_whole(rows: &[Row]) {
    assert!(
        rows.windows(2).all(|w| w[0].seq < w[1].seq),
        "in log order: {:?}",
        rows.iter().map(|r| r.seq).collect::<Vec<_>>()
    );
    for row in rows {
        assert!(
            row.outcome == "rejected" || !row.effects.is_empty(),
            "{} at {} is accepted with effects about it, but lists none",
            row.command,
            row.seq
        );
    }
}

#[tokio::test]
async fn a_resource_history_holds_its_leases_ends_and_the_pools_side_of_its_claim() {
    let mut story = Story::begin();
    let (released, granted) = story.acquire(None);
    let token = lease_token(&granted);
    let release_lease = ReleaseLease { agent: story.agent.clone(), lease: released, token: Some(token) };
    story.log.submit("op:alice", release_lease);
    let (expiring, _) = story.acquire(Some(Millis::from_secs(30)));
    story.log.advance(Millis::from_secs(31));
    story.log.submit("sweeper-1", ExpireLease { agent: story.agent.clone(), lease: expiring });
    let (broken, _) = story.acquire(None);
    let release = Release { agent: story.agent.clone(), resource: story.resource, reason: Some("done".into()) };
    let releasing = story.log.submit("op:alice", release);
    let watermark = story.log.partitions[0].state().last_position();
    let mut report = SyncReport::new(story.agent.clone(), story.epoch, story.next_obs(), watermark);
    report.destroyed = vec![story.resource];
    let destroyed = story.log.submit("worker-b", report);
    effect_at(&releasing, "lease-broken");
    effect_at(&destroyed, "resource-destroyed");
    story.free(&destroyed);

    let rows = story.log.history(&story.holder().to_string()).await;
    assert_whole(&rows);
    assert_effects(row_of(&rows, "op.allocate"), &["resource-allocated", "claim-wanted"]);
    assert_effects(row_of(&rows, "sys.claim"), &["claim-granted"]);
    assert_effects(row_of(&rows, "sys.bind-claim"), &["claim-bound"]);
    assert_effects(row_of(&rows, "op.release-lease"), &["lease-released"]);
    assert_effects(row_of(&rows, "sys.expire-lease"), &["lease-expired"]);
    assert_effects(row_of(&rows, "op.release"), &["resource-releasing", "lease-broken"]);
    assert_effects(row_of(&rows, "sys.free"), &["claim-freed"]);
    let acquires: Vec<&Row> = rows.iter().filter(|r| r.command == "op.acquire").collect();
    assert_eq!(acquires.len(), 3, "every acquire");
    assert!(acquires.iter().all(|r| has_effect(r, "lease-granted")));
    // The pool's steps, interleaved by log sequence with the resource's own partition.
    let partitions: Vec<u32> = rows.iter().map(|r| r.partition).collect();
    let claim = rows.iter().position(|r| r.command == "sys.claim").unwrap();
    assert_eq!(&partitions[claim - 1..=claim + 1], &[0, 1, 0], "allocate, claim (the pool's), bind: {partitions:?}");
    assert_eq!(rows.last().map(|r| (r.command.as_str(), r.partition)), Some(("sys.free", 1)));
    // After the pool's step, the resource's state in its own partition.
    assert_eq!(row_of(&rows, "sys.claim").state["state"], "pending");
    // The same through its bare id.
    let bare = story.log.history(&story.resource.to_string()).await;
    assert_eq!(bare.iter().map(|r| r.seq).collect::<Vec<_>>(), rows.iter().map(|r| r.seq).collect::<Vec<_>>());

    // A lease's own history, in the form `leasehold acquire` prints it (AGENT.LEASE), and as lease:ID.
    for target in [format!("{}.{released}", story.agent), format!("lease:{released}")] {
        let rows = story.log.history(&target).await;
        assert_whole(&rows);
        assert_eq!(rows.len(), 2, "{target}: acquired and released: {rows:?}");
        assert_effects(row_of(&rows, "op.acquire"), &["lease-granted"]);
        assert_effects(row_of(&rows, "op.release-lease"), &["lease-released"]);
        assert_eq!(rows[1].state["state"], "released", "{target}");
    }
    let rows = story.log.history(&format!("lease:{expiring}")).await;
    assert_whole(&rows);
    assert_effects(row_of(&rows, "sys.expire-lease"), &["lease-expired"]);
    let rows = story.log.history(&format!("lease:{broken}")).await;
    assert_whole(&rows);
    assert_effects(row_of(&rows, "op.release"), &["lease-broken"]);

    // The agent's history holds the pool's side of its resources' claims too; the pool's holds its own steps and
    // the claim's steps on the holder's side.
    let rows = story.log.history(&format!("agent:{}", story.agent)).await;
    assert_whole(&rows);
    assert_effects(row_of(&rows, "sys.claim"), &["claim-granted"]);
    assert_effects(row_of(&rows, "sys.free"), &["claim-freed"]);
    let rows = story.log.history(&format!("@{}", story.pool)).await;
    assert_whole(&rows);
    assert_effects(row_of(&rows, "sys.bind-claim"), &["claim-bound"]);
    assert_effects(row_of(&rows, "agent.sync"), &["claim-releasable"]);
    assert_effects(row_of(&rows, "sys.free"), &["claim-freed"]);
}

#[tokio::test]
async fn why_says_an_address_was_freed_because_its_holders_agent_was_declared_gone() {
    let mut story = Story::begin();
    story.log.advance(Millis::from_hours(25));
    story.log.submit("sweeper-1", MarkStalled { agent: story.agent.clone() });
    let gone = story.log.submit("sweeper-1", MarkGone { agent: story.agent.clone() });
    effect_at(&gone, "resource-orphaned");
    let declared = gone[0].decided_at;
    story.free(&gone);

    let query = Query { pool: None, value: PoolValue::Ipv4("10.0.0.2".parse().unwrap()) };
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    let because = holding.freed_because.as_deref().expect("a reason");
    let expected = format!("its holder's agent worker-b was declared gone at {declared}");
    assert!(because.contains(&expected), "{because:?} says {expected:?}");
    let text = why::render(&answer);
    assert!(text.contains(&format!("freed because {expected}")), "{text}");
    let json = serde_json::to_value(&answer).expect("json");
    assert_eq!(json["holdings"][0]["freed_because"].as_str(), Some(because));
}

#[tokio::test]
async fn why_names_a_destruction_and_the_release_that_ordered_it() {
    let mut story = Story::begin();
    let release = Release { agent: story.agent.clone(), resource: story.resource, reason: Some("job done".into()) };
    story.log.submit("op:alice", release);
    let watermark = story.log.partitions[0].state().last_position();
    let mut report = SyncReport::new(story.agent.clone(), story.epoch, story.next_obs(), watermark);
    report.destroyed = vec![story.resource];
    let destroyed = story.log.submit("worker-b", report);
    story.free(&destroyed);

    let query = Query { pool: Some(story.pool.clone()), value: PoolValue::Ipv4("10.0.0.2".parse().unwrap()) };
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    let because = holding.freed_because.as_deref().expect("a reason");
    assert!(because.contains("destroyed, as its agent worker-b confirmed"), "{because}");
    assert!(because.contains("released by op:alice: job done"), "{because}");
}

#[tokio::test]
async fn why_names_a_holder_found_lost() {
    let mut story = Story::begin();
    let watermark = story.log.partitions[0].state().last_position();
    let mut report = SyncReport::new(story.agent.clone(), story.epoch, story.next_obs(), watermark);
    report.missing = vec![story.resource];
    let lost = story.log.submit("worker-b", report);
    effect_at(&lost, "resource-lost");
    story.free(&lost);

    let query = Query { pool: None, value: PoolValue::Ipv4("10.0.0.2".parse().unwrap()) };
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    let because = holding.freed_because.as_deref().expect("a reason");
    let expected = format!("its holder was lost: its agent worker-b found it missing at {}", lost[0].decided_at);
    assert_eq!(because, expected);
}

/// The story's agent declared gone: the orphan keeps the address its holding pool granted.
fn orphaned_holding(story: &mut Story) {
    story.log.advance(Millis::from_hours(25));
    story.log.submit("sweeper-1", MarkStalled { agent: story.agent.clone() });
    let gone = story.log.submit("sweeper-1", MarkGone { agent: story.agent.clone() });
    effect_at(&gone, "claim-held-for-orphan");
}

#[tokio::test]
async fn why_says_an_orphans_address_was_held_until_an_operator_freed_it() {
    let mut story = Story::begin_with(leasehold_schemas::pool::OrphanPolicy::Hold);
    orphaned_holding(&mut story);
    let query = Query { pool: None, value: PoolValue::Ipv4("10.0.0.2".parse().unwrap()) };
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    assert!(holding.held.is_some() && holding.freed.is_none(), "held, not freed: {holding:?}");
    assert!(why::render(&answer).contains("still held"), "{}", why::render(&answer));

    let body = FreeOrphan {
        agent: story.agent.clone(),
        resource: story.resource,
        pool: None,
        reason: "machine scrapped".into(),
    };
    let freed = story.log.submit("op:alice", body);
    story.free(&freed);
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    assert_eq!(
        holding.freed_because.as_deref(),
        Some("orphan of gone agent worker-b, freed by op:alice: machine scrapped")
    );
    let text = why::render(&answer);
    assert!(text.contains("  held "), "the held step is shown: {text}");
    assert!(
        text.contains("freed because orphan of gone agent worker-b, freed by op:alice: machine scrapped"),
        "{text}"
    );
}

#[tokio::test]
async fn why_says_an_orphans_address_was_freed_once_its_agent_confirmed_the_destroy() {
    let mut story = Story::begin_with(leasehold_schemas::pool::OrphanPolicy::Hold);
    orphaned_holding(&mut story);
    // The agent comes back, reports the orphan's handle, is ordered to destroy it and says it did.
    story.log.submit("worker-b", Register::new(story.agent.clone(), leasehold_schemas::Uuid::from_u128(2)));
    let epoch = story.log.agent_partition(&story.agent).state().agent(&story.agent).expect("registered").epoch;
    story.epoch = epoch;
    story.obs = 0;
    let watermark = story.log.partitions[0].state().last_position();
    let garbage = GarbageReport {
        agent: story.agent.clone(),
        epoch,
        obs: story.next_obs(),
        watermark,
        handles: vec![story.resource],
        dry_run: false,
    };
    let ordered = story.log.submit("worker-b", garbage);
    let (order, _) = effect_at(&ordered, "garbage-destroy-ordered");
    let destroyed = ReportDestroyed {
        agent: story.agent.clone(),
        epoch,
        obs: story.next_obs(),
        resource: story.resource,
        ordered: order.position,
    };
    let confirmed = story.log.submit("worker-b", destroyed);
    story.free(&confirmed);

    let query = Query { pool: None, value: PoolValue::Ipv4("10.0.0.2".parse().unwrap()) };
    let answer = why::why(2, story.log.entries(), &query, None, |_| {}).await.expect("folds");
    let [holding] = answer.holdings.as_slice() else { panic!("one holding: {answer:?}") };
    let expected =
        format!("orphan of gone agent worker-b, destroy confirmed by worker-b at {}", confirmed[0].decided_at);
    assert_eq!(holding.freed_because.as_deref(), Some(expected.as_str()));
}

/// A lease that queues on a busy resource takes no capacity: `verify` passes a log where one is granted and another
/// waits behind it (it once counted the waiting one against the capacity and failed the log at the queue).
#[tokio::test]
async fn verify_passes_a_log_where_a_lease_queues_behind_another() {
    let mut story = Story::begin();
    let state = story.log.agent_partition(&story.agent).state();
    let capacity = state.resource(story.resource).expect("the story's resource").capacity;
    for _ in 0..capacity {
        story.acquire(None);
    }
    let queued = Acquire {
        agent: story.agent.clone(),
        resource: story.resource,
        lease: story.log.partitions[0].new_lease_id(),
        holder: "build-43".into(),
        ttl: None,
        wait_timeout: Some(Millis::from_secs(60)),
        priority: 0,
    };
    let outcomes = story.log.submit("op:alice", queued);
    effect_at(&outcomes, "lease-queued");
    let verifier = leasehold_replay::verify::Verifier::new(2, None).expect("a verifier");
    let report = verifier.run(story.log.entries(), |_| {}).await.expect("the log reads");
    assert!(report.failure.is_none(), "{:?}", report.failure);
}
