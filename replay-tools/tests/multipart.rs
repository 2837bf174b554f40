//! A decision in several parts (a sync report that activates many resources full of leases, decided with the
//! default split budget): `verify` re-decides every part, and `state --at` a part that continues reads to the
//! decision's end, as no reader ever sees a state between the parts.

use bytes::Bytes;
use leasehold_domain::driver::Driver;
use leasehold_log::export::{self, Entry};
use leasehold_log::{CommandRecord, StoredOutcome};
use leasehold_replay::verify::Verifier;
use leasehold_replay::why::At;
use leasehold_schemas::command::{Acquire, Allocate, Register, SyncReport};
use leasehold_schemas::ids::{Millis, Timestamp};
use leasehold_schemas::{AgentName, Command, Envelope, codec};

/// A one-partition log made by the domain's driver, as export entries.
struct Log {
    driver: Driver,
    entries: Vec<Entry>,
    prev: u64,
}

impl Log {
    fn submit(&mut self, issuer: &str, body: impl Into<Command>) {
        self.driver.advance(Millis(7));
        let envelope: Envelope = self.driver.envelope(issuer, body);
        let (seq, time) = (self.driver.next_seq(), self.driver.now());
        let before = self.driver.outcomes().len();
        self.driver.submit_envelope(&envelope);
        let subject = leasehold_schemas::subjects::command_subject(
            0,
            envelope.body.class(),
            &envelope.body.key(),
            envelope.body.subject_id(),
        );
        let payload = Bytes::from(codec::encode_command(&envelope).expect("encodes"));
        self.entries.push(Entry::Command { partition: 0, record: CommandRecord { seq, subject, time, payload } });
        for outcome in self.driver.outcomes()[before..].iter() {
            let seq = self.prev + 1;
            self.entries.push(Entry::Outcome(StoredOutcome {
                seq,
                partition: 0,
                key: outcome.command.key.token(),
                cmd_id: outcome.command.id.to_string(),
                cmd_seq: outcome.cmd_seq,
                part: outcome.part,
                prev_seq: self.prev,
                payload: Bytes::from(codec::encode_outcome(outcome).expect("encodes")),
            }));
            self.prev = seq;
        }
    }
}

async fn entries_of(
    file: &std::path::Path,
) -> futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>> {
    let input = tokio::fs::File::open(file).await.expect("the export");
    let (reader, _) = export::Reader::open(tokio::io::BufReader::new(input)).await.expect("a readable export");
    reader.into_stream()
}

#[tokio::test]
async fn a_decision_in_parts_is_re_decided_and_read_whole() {
    let mut log = Log { driver: Driver::new(0, 1, Timestamp(1_790_000_000_000)), entries: Vec::new(), prev: 0 };
    let agent = AgentName::new("w1").expect("a name");
    let incarnation = leasehold_schemas::Uuid::from_u128(1);
    log.submit("w1", Register { agent: agent.clone(), incarnation, wiped: false, settings: None });
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
        };
        log.submit("op:ci", allocate);
        for _ in 0..64 {
            let lease = log.driver.new_lease_id();
            let holder = "h".repeat(128);
            let acquire = Acquire { agent: agent.clone(), resource, lease, holder, ttl: None, wait_timeout: None };
            log.submit("op:ci", acquire);
        }
        made.push(resource);
    }
    let mut report = SyncReport::new(agent.clone(), epoch, 1, log.driver.state().last_position());
    report.created = made.clone();
    log.submit("w1", report);

    // The sync's parts: at least two, the first continuing.
    let parts: Vec<(u64, bool)> = log
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Outcome(o) if o.cmd_seq == log.driver.next_seq() - 1 => {
                Some((o.seq, codec::decode_outcome(&o.payload).expect("decodes").continues()))
            }
            _ => None,
        })
        .collect();
    assert!(parts.len() >= 2 && parts[0].1, "the sync is decided in parts: {parts:?}");
    let last = log.prev;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("parts.lhx");
    let header = export::Header::new(leasehold_domain::DECIDER_VERSION, 1, last, "test");
    let out = tokio::fs::File::create(&file).await.expect("a new file");
    let mut writer = export::Writer::new(tokio::io::BufWriter::new(out), &header).await.expect("a writer");
    for entry in &log.entries {
        writer.write(entry).await.expect("written");
    }
    writer.finish().await.expect("finished");

    let report = Verifier::new(1, None).expect("a verifier").run(entries_of(&file).await, |_| {}).await.expect("read");
    assert!(report.failure.is_none(), "{report:?}");
    assert_eq!(report.redecided.count, last, "every part re-decided: {report:?}");

    // `--at` the first part: read to the decision's end, every resource active.
    let active =
        |state: &leasehold_replay::state_at::StateAt| state.resources.iter().filter(|r| r.state == "active").count();
    let at_first =
        leasehold_replay::state_at::state_at(1, entries_of(&file).await, At::Seq(parts[0].0), None, |_| {}).await;
    let at_first = at_first.expect("a state");
    assert_eq!(at_first.seq, parts.last().expect("parts").0, "read to the last part");
    assert_eq!(active(&at_first), made.len());
    let before =
        leasehold_replay::state_at::state_at(1, entries_of(&file).await, At::Seq(parts[0].0 - 1), None, |_| {})
            .await
            .expect("a state");
    assert_eq!(active(&before), 0, "before the sync, nothing is active");
}
