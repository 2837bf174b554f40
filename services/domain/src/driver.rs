//! An in-memory partition: commands get log sequences and log times as a log would give them, are decided, and
//! their outcomes are applied and kept. The demo, the tests and simulations drive the domain through it; it does
//! what a writer does, minus the log.
//!
//! Everything is deterministic: ids come from a counter and the driver's clock, never from the system.

use leasehold_schemas::ids::{CommandId, Issuer, LeaseId, Millis, ResourceId, Timestamp};
use leasehold_schemas::{Command, Envelope, Outcome};

use crate::{Ctx, PartitionState, apply, decide, follow_ups};

#[derive(Debug, Clone)]
pub struct Driver {
    state: PartitionState,
    outcomes: Vec<Outcome>,
    clock: Timestamp,
    next_seq: u64,
    n_ids: u64,
    /// Send the writer's `sys.continue` follow-ups right after the outcome that asks for them.
    pub auto_continue: bool,
}

impl Driver {
    /// Partition `partition` of `partitions`, with log time starting at `start`.
    pub fn new(partition: u32, partitions: u32, start: Timestamp) -> Self {
        Driver {
            state: PartitionState::new(partition, partitions),
            outcomes: Vec::new(),
            clock: start,
            next_seq: 1,
            n_ids: 0,
            auto_continue: true,
        }
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// Every outcome so far, in log order.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// The log time the next command gets.
    pub fn now(&self) -> Timestamp {
        self.clock
    }

    pub fn advance(&mut self, by: Millis) {
        self.clock = self.clock.saturating_add(by);
    }

    /// Sets the log clock; a log's clock may step back (a new stream leader), which decisions must tolerate.
    pub fn set_clock(&mut self, at: Timestamp) {
        self.clock = at;
    }

    fn entropy(&mut self, tag: u8) -> [u8; 10] {
        self.n_ids += 1;
        let mut entropy = [0u8; 10];
        entropy[0] = tag;
        entropy[2..].copy_from_slice(&self.n_ids.to_be_bytes());
        entropy
    }

    pub fn new_command_id(&mut self) -> CommandId {
        let entropy = self.entropy(1);
        CommandId::from_parts(self.clock.0, entropy)
    }

    pub fn new_resource_id(&mut self) -> ResourceId {
        let entropy = self.entropy(2);
        ResourceId::from_parts(self.clock.0, entropy)
    }

    pub fn new_lease_id(&mut self) -> LeaseId {
        let entropy = self.entropy(3);
        LeaseId::from_parts(self.clock.0, entropy)
    }

    /// An envelope for `body` from `issuer`, issued now, with a fresh command id.
    pub fn envelope(&mut self, issuer: &str, body: impl Into<Command>) -> Envelope {
        let issuer = Issuer::new(issuer).expect("issuer names in drivers are valid");
        let id = self.new_command_id();
        Envelope::new(id, issuer, self.clock, body)
    }

    /// Decides and applies a command from `issuer`; returns its outcome.
    pub fn submit(&mut self, issuer: &str, body: impl Into<Command>) -> Outcome {
        let envelope = self.envelope(issuer, body);
        self.submit_envelope(&envelope)
    }

    /// Decides and applies an envelope as the next command in the log. A retried command id within the horizon
    /// gets its first outcome back and nothing is appended, as a writer does.
    pub fn submit_envelope(&mut self, envelope: &Envelope) -> Outcome {
        let ctx = Ctx { cmd_seq: self.next_seq, log_time: self.clock };
        self.next_seq += 1;
        let outcome = decide(&self.state, &ctx, envelope);
        if outcome.cmd_seq != ctx.cmd_seq {
            return outcome;
        }
        apply(&mut self.state, &outcome);
        self.outcomes.push(outcome.clone());
        if self.auto_continue {
            for follow_up in follow_ups(&outcome) {
                self.submit_envelope(&follow_up);
            }
        }
        outcome
    }

    /// Folds every outcome so far into a fresh state.
    pub fn rebuild(&self) -> PartitionState {
        let mut state = PartitionState::new(self.state.partition(), self.state.partitions());
        for outcome in &self.outcomes {
            apply(&mut state, outcome);
        }
        state
    }
}
