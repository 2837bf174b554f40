//! What the writer's test files share: a producer that publishes commands with ids and times that count up from
//! [`START`], so every run of a test makes the same log.

use leasehold_log::Log;
use leasehold_schemas::ids::{CommandId, Issuer, Timestamp};
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, Envelope, codec};

/// The time of the first command (2027-01-15).
pub(crate) const START: u64 = 1_800_000_000_000;

/// Publishes commands to `log`, the n-th stamped `START + n` by its issuer and with an id made of n.
pub(crate) struct Producer<L: Log> {
    pub(crate) log: L,
    pub(crate) n: u64,
}

impl<L: Log> Producer<L> {
    pub(crate) fn new(log: L) -> Self {
        Producer { log, n: 0 }
    }

    /// Publishes a command and returns its id.
    pub(crate) async fn publish(&mut self, issuer: &str, body: impl Into<Command>) -> CommandId {
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
        envelope.command_id
    }
}
