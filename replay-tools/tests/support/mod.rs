//! What the replay tool's tests share: a log made by the domain's in-memory driver, as an export file holds it.

use bytes::Bytes;
use leasehold_domain::driver::Driver;
use leasehold_log::export::Entry;
use leasehold_log::{CommandRecord, StoredOutcome};
use leasehold_schemas::ids::Millis;
use leasehold_schemas::{Command, Envelope, codec};

/// A one-partition log made by the domain's driver, as an export holds it.
pub(crate) struct DriverLog {
    pub driver: Driver,
    pub entries: Vec<Entry>,
    pub prev: u64,
}

impl DriverLog {
    pub(crate) fn submit(&mut self, issuer: &str, body: impl Into<Command>) {
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
