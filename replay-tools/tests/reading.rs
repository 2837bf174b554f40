//! What reading a real log must survive, each found by a red team that tried to break the tool:
//!
//! 1. a decision in several parts (a sync that activates many resources full of leases, with the default split
//!    budget): `verify` re-decides every part, and `state --at` its first part, through the command line, reads to
//!    its end: no reader sees a state between the parts;
//! 2. a live JetStream log whose command retention moves on while the walk reads it (a partition's commands are read
//!    1,000 at a time, and `max_age` goes on meanwhile): outcomes whose commands vanished between two reads are
//!    reported as only folded, never as a broken log;
//! 3. `history @POOL` lists only commands that name the pool as a pool, not any string that spells its name.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_domain::driver::Driver;
use leasehold_log::embedded::{Embedded, EmbeddedOwner};
use leasehold_log::export::{self, Entry};
use leasehold_log::{
    Appended, CommandRecord, DeadLetter, Error, Log, OutcomeFilter, OutcomeRecord, Published, Snapshot, StoredOutcome,
};
use leasehold_replay::bench::{GenConfig, generate};
use leasehold_replay::verify::Verifier;
use leasehold_schemas::command::{Acquire, Allocate, Register, SyncReport};
use leasehold_schemas::ids::Timestamp;
use leasehold_schemas::{AgentName, codec};
use support::DriverLog;

// ---------------------------------------------------------------------------------------------------------------
// 1. state --at a continuing part, through the CLI.

fn active_count(json: &serde_json::Value) -> usize {
    json["resources"].as_array().expect("resources").iter().filter(|r| r["state"] == "active").count()
}

#[tokio::test]
async fn a_decision_in_parts_is_re_decided_and_state_at_its_first_part_reads_to_its_end() {
    let mut log = DriverLog { driver: Driver::new(0, 1, Timestamp(1_790_000_000_000)), entries: Vec::new(), prev: 0 };
    let agent = AgentName::new("w1").expect("a name");
    let incarnation = leasehold_schemas::Uuid::from_u128(1);
    log.submit("w1", Register::new(agent.clone(), incarnation));
    let epoch = log.driver.state().agent(&agent).expect("registered").epoch;
    let mut made = Vec::new();
    for _ in 0..40 {
        let resource = log.driver.new_resource_id();
        let allocate = Allocate {
            agent: agent.clone(),
            resource,
            kind: "container".into(),
            capacity: 64,
            attributes: Default::default(),
            parent: None,
            pools: vec![],
            wait: None,
        };
        log.submit("op:ci", allocate);
        for _ in 0..64 {
            let lease = log.driver.new_lease_id();
            let acquire = Acquire {
                agent: agent.clone(),
                resource,
                lease,
                holder: "h".repeat(128),
                ttl: None,
                wait_timeout: None,
                priority: 0,
            };
            log.submit("op:ci", acquire);
        }
        made.push(resource);
    }
    let mut report = SyncReport::new(agent.clone(), epoch, 1, log.driver.state().last_position());
    report.created = made.clone();
    log.submit("w1", report);
    let sync_cmd = log.driver.next_seq() - 1;
    let parts: Vec<(u64, bool)> = log
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Outcome(o) if o.cmd_seq == sync_cmd => {
                Some((o.seq, codec::decode_outcome(&o.payload).expect("decodes").continues()))
            }
            _ => None,
        })
        .collect();
    assert!(parts.len() >= 2 && parts[0].1, "the sync is decided in parts: {parts:?}");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("parts.lhx");
    let header = export::Header::new(leasehold_domain::DECIDER_VERSION, 1, log.prev, "test");
    let out = tokio::fs::File::create(&file).await.expect("a new file");
    let mut writer = export::Writer::new(tokio::io::BufWriter::new(out), &header).await.expect("a writer");
    for entry in &log.entries {
        writer.write(entry).await.expect("written");
    }
    writer.finish().await.expect("finished");

    let state = |at: u64| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-replay"))
            .args(["--file", file.to_str().unwrap(), "--output", "json", "state", "--at", &at.to_string()])
            .output()
            .expect("runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let input = tokio::io::BufReader::new(tokio::fs::File::open(&file).await.expect("the export"));
    let (reader, _) = export::Reader::open(input).await.expect("a readable export");
    let report = Verifier::new(1, None).expect("a verifier").run(reader.into_stream(), |_| {}).await.expect("read");
    assert!(report.failure.is_none(), "{report:?}");
    assert_eq!(report.redecided.count, log.prev, "every part re-decided: {report:?}");

    let at_first = state(parts[0].0);
    let at_last = state(parts.last().unwrap().0);
    assert_eq!(active_count(&at_last), made.len());
    assert_eq!(active_count(&state(parts[0].0 - 1)), 0, "before the sync, nothing is active");
    // What the README and state_at promise: a moment inside a decision reads as its end.
    assert_eq!(at_first["seq"], at_last["seq"], "state --at the first part should read to the decision's end");
}

// ---------------------------------------------------------------------------------------------------------------
// 2. A log whose command retention moves on while verify walks it.

/// An embedded log seen as a JetStream `LH_CMD` with `max_age` retention: commands at or below `floor` have aged
/// out. Each read of a partition's next batch of commands comes `advance` commands of retention later (the walk
/// spent that long folding the batch before).
#[derive(Clone)]
struct Expiring {
    inner: Embedded,
    floor: Arc<AtomicU64>,
    advance: u64,
}

impl Log for Expiring {
    type Owner = EmbeddedOwner;

    fn partitions(&self) -> u32 {
        self.inner.partitions()
    }
    async fn publish_command(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<Published, Error> {
        self.inner.publish_command(subject, msg_id, payload).await
    }
    async fn publish_commands(&self, commands: &[leasehold_log::Publish]) -> Vec<Result<Published, Error>> {
        self.inner.publish_commands(commands).await
    }
    async fn read_commands(&self, partition: u32, after: u64, max: usize) -> Result<Vec<CommandRecord>, Error> {
        if after > 0 {
            // Time has passed since the last batch: retention moved on.
            self.floor.fetch_add(self.advance, Ordering::SeqCst);
        }
        let floor = self.floor.load(Ordering::SeqCst);
        self.inner.read_commands(partition, after.max(floor), max).await
    }
    async fn command_at(&self, seq: u64) -> Result<Option<CommandRecord>, Error> {
        if seq <= self.floor.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.inner.command_at(seq).await
    }
    async fn last_command_seq(&self) -> Result<u64, Error> {
        self.inner.last_command_seq().await
    }
    async fn append(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        self.inner.append(partition, fence, records).await
    }
    async fn last_outcome_seq(&self, partition: u32) -> Result<u64, Error> {
        self.inner.last_outcome_seq(partition).await
    }
    async fn read_outcomes(&self, filter: &OutcomeFilter, from: u64, max: usize) -> Result<Vec<StoredOutcome>, Error> {
        self.inner.read_outcomes(filter, from, max).await
    }
    fn follow(&self, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        self.inner.follow(filter, from)
    }
    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), Error> {
        self.inner.dead_letter(letter).await
    }
    async fn read_dead_letters(&self, from: u64, max: usize) -> Result<Vec<(u64, DeadLetter)>, Error> {
        self.inner.read_dead_letters(from, max).await
    }
    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), Error> {
        self.inner.put_snapshot(snapshot).await
    }
    async fn latest_snapshot(&self, partition: u32) -> Result<Option<Snapshot>, Error> {
        self.inner.latest_snapshot(partition).await
    }
    async fn workers(&self, worker: &str, alive: bool) -> Result<Vec<String>, Error> {
        self.inner.workers(worker, alive).await
    }
    fn worker_ttl(&self) -> Duration {
        self.inner.worker_ttl()
    }
    async fn is_served(&self, partition: u32) -> Result<bool, Error> {
        self.inner.is_served(partition).await
    }
    async fn own(&self, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        self.inner.own(partition, worker).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_moving_during_the_walk_is_reported_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("generated.lhexport");
    let config = GenConfig {
        outcomes: 4_000,
        partitions: 1,
        agents_per_partition: 3,
        resources_per_agent: 3,
        seed: 7,
        start: Timestamp(1_800_000_000_000),
        ms_per_command: None,
        horizon: None,
    };
    generate(&config, &file).await.expect("a generated log");
    let data = dir.path().join("data");
    let input = tokio::io::BufReader::new(tokio::fs::File::open(&file).await.unwrap());
    export::import(input, &data).await.expect("imported");
    let embedded = Embedded::open_read_only(&data).expect("opened");

    // Control: retention where it was when the walk started (commands 1..=1000 gone), not moving: verifies.
    let still = Expiring { inner: embedded.clone(), floor: Arc::new(AtomicU64::new(1000)), advance: 0 };
    let report = Verifier::new(1, None).unwrap().run(export::entries(still, None), |_| {}).await.unwrap();
    assert!(report.failure.is_none(), "{report:?}");
    assert!(report.folded_only_commands_gone.count > 0);

    // The same log, while retention moves on by 1,500 commands between two batch reads of the walk (the walk spent
    // that long folding the outcomes before, e.g. months of outcomes whose commands aged out long ago, while the
    // cluster took new commands): a healthy log, reported as broken.
    let moving = Expiring { inner: embedded, floor: Arc::new(AtomicU64::new(1000)), advance: 1500 };
    let report = Verifier::new(1, None).unwrap().run(export::entries(moving, None), |_| {}).await.unwrap();
    assert!(report.failure.is_none(), "a false positive: {:?}", report.failure);
    assert!(report.folded_only_commands_missing.count > 0, "reported: {report:?}");
}

// ---------------------------------------------------------------------------------------------------------------
// 3. history @POOL: only commands that name the pool as a pool.

#[tokio::test]
async fn history_of_a_pool_lists_only_commands_that_name_it_as_a_pool() {
    let mut log = DriverLog { driver: Driver::new(0, 1, Timestamp(1_790_000_000_000)), entries: Vec::new(), prev: 0 };
    let agent = AgentName::new("w1").expect("a name");
    let incarnation = leasehold_schemas::Uuid::from_u128(1);
    log.submit("w1", Register::new(agent.clone(), incarnation));
    let resource = log.driver.new_resource_id();
    // No pool at all: a resource of kind "gpu", claiming nothing.
    let allocate = Allocate {
        agent: agent.clone(),
        resource,
        kind: "gpu".into(),
        capacity: 1,
        attributes: Default::default(),
        parent: None,
        pools: vec![],
        wait: None,
    };
    log.submit("op:ci", allocate);
    let entries: Vec<Result<Entry, Error>> = log.entries.into_iter().map(Ok).collect();
    let target: leasehold_replay::history::Target = "@gpu".parse().expect("a pool");
    let rows = leasehold_replay::history::history(1, futures::stream::iter(entries).boxed(), &target, |_| {})
        .await
        .expect("folds");
    assert!(rows.is_empty(), "pool gpu's history lists commands about no pool: {} row(s)", rows.len());
}
