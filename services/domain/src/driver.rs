//! An in-memory partition: commands get log sequences and log times as a log would give them, are decided, and
//! their outcomes are applied and kept. The demo, the tests and simulations drive the domain through it; it does
//! what a writer does, minus the log: it appends every part of a decision before the next command, and answers a
//! retried command from the outcome the log holds.
//!
//! Everything is deterministic: ids come from a counter and the driver's clock, never from the system.

use std::collections::BTreeMap;

use leasehold_schemas::ids::{CommandId, Issuer, LeaseId, Millis, ResourceId, Timestamp};
use leasehold_schemas::{Command, Envelope, Outcome, Position};

use crate::{Ctx, Decided, PartitionState, WriterError, apply, continue_work, decide};

/// What the driver did with the last command it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Its outcome was appended, in this many parts so far.
    Appended { parts: usize },
    /// Decided before, at this command sequence: nothing appended.
    AlreadyDecided { cmd_seq: u64 },
    /// A heartbeat that changed nothing: nothing appended.
    Unchanged,
}

#[derive(Debug, Clone)]
pub struct Driver {
    state: PartitionState,
    outcomes: Vec<Outcome>,
    /// Index in `outcomes` of the first part of each command's outcome.
    first_parts: BTreeMap<u64, usize>,
    clock: Timestamp,
    next_seq: u64,
    n_ids: u64,
    last_answer: Answer,
    /// Append every part of a decision before returning, as a writer does. When false, `submit` appends the first
    /// part only and [`Driver::continue_pending`] and [`Driver::reload`] let a test play a writer that stops
    /// between parts.
    pub finish_parts: bool,
}

impl Driver {
    /// Partition `partition` of `partitions`, with log time starting at `start`.
    pub fn new(partition: u32, partitions: u32, start: Timestamp) -> Self {
        Driver::with_state(PartitionState::new(partition, partitions), start)
    }

    /// A driver over an empty state made by the caller (for instance with a small split budget).
    pub fn with_state(state: PartitionState, start: Timestamp) -> Self {
        assert!(state.cursor() == 0 && state.next_position() == Position(1), "the state must be empty");
        Driver {
            state,
            outcomes: Vec::new(),
            first_parts: BTreeMap::new(),
            clock: start,
            next_seq: 1,
            n_ids: 0,
            last_answer: Answer::Unchanged,
            finish_parts: true,
        }
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// Every outcome part so far, in log order.
    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// Every part of the outcome of the command at `cmd_seq`.
    pub fn parts_of(&self, cmd_seq: u64) -> &[Outcome] {
        let Some(first) = self.first_parts.get(&cmd_seq) else {
            return &[];
        };
        let n = self.outcomes[*first..].iter().take_while(|o| o.cmd_seq == cmd_seq).count();
        &self.outcomes[*first..*first + n]
    }

    /// What the driver did with the last command.
    pub fn last_answer(&self) -> Answer {
        self.last_answer
    }

    /// The log time the next command gets.
    pub fn now(&self) -> Timestamp {
        self.clock
    }

    /// The command sequence the next command gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
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

    /// Decides and applies a command from `issuer`; returns its outcome (its first part).
    pub fn submit(&mut self, issuer: &str, body: impl Into<Command>) -> Outcome {
        let envelope = self.envelope(issuer, body);
        self.submit_envelope(&envelope)
    }

    /// Decides and applies an envelope as the next command in the log, and returns its outcome's first part. A
    /// command id decided within the horizon gets the outcome the log holds for it and nothing is appended; a
    /// heartbeat that changes nothing gets an empty accepted outcome that is not appended. Panics if a decision is
    /// unfinished (see [`Driver::try_submit_envelope`]).
    pub fn submit_envelope(&mut self, envelope: &Envelope) -> Outcome {
        self.try_submit_envelope(envelope).unwrap_or_else(|e| panic!("driver misused: {e}"))
    }

    /// As [`Driver::submit_envelope`], but a command offered while a decision is unfinished is the core's
    /// [`WriterError`], and the command is not consumed (it gets the same sequence when offered again).
    pub fn try_submit_envelope(&mut self, envelope: &Envelope) -> Result<Outcome, WriterError> {
        let ctx = Ctx { cmd_seq: self.next_seq, log_time: self.clock };
        let decided = decide(&self.state, &ctx, envelope)?;
        self.next_seq += 1;
        match decided {
            Decided::AlreadyDecided { cmd_seq } => {
                self.last_answer = Answer::AlreadyDecided { cmd_seq };
                let first = self.first_parts.get(&cmd_seq).expect("the log holds every decided command's outcome");
                Ok(self.outcomes[*first].clone())
            }
            Decided::Unchanged => {
                self.last_answer = Answer::Unchanged;
                Ok(crate::decide::unchanged_outcome(&self.state, &ctx, envelope))
            }
            Decided::Append(outcome) => {
                self.first_parts.insert(outcome.cmd_seq, self.outcomes.len());
                self.append(outcome.clone());
                self.last_answer = Answer::Appended { parts: 1 };
                if self.finish_parts {
                    while self.state.pending().is_some() {
                        self.continue_pending()?;
                    }
                }
                Ok(outcome)
            }
        }
    }

    /// Makes, applies and appends the next part of the unfinished decision.
    pub fn continue_pending(&mut self) -> Result<Outcome, WriterError> {
        let part = continue_work(&self.state)?;
        self.append(part.clone());
        if let Answer::Appended { parts } = &mut self.last_answer {
            *parts += 1;
        }
        Ok(part)
    }

    fn append(&mut self, outcome: Outcome) {
        apply(&mut self.state, &outcome).unwrap_or_else(|e| panic!("the driver's own outcome does not fold: {e}"));
        self.outcomes.push(outcome);
    }

    /// A writer that crashed and took over again: its state is thrown away and folded from the log.
    pub fn reload(&mut self) {
        self.state = self.rebuild();
    }

    /// Folds every outcome so far into a fresh state (with the same split budget).
    pub fn rebuild(&self) -> PartitionState {
        let fresh = PartitionState::new(self.state.partition(), self.state.partitions());
        let mut state = fresh.with_split_budget(self.state.split_budget());
        for outcome in &self.outcomes {
            apply(&mut state, outcome).unwrap_or_else(|e| panic!("the log does not fold: {e}"));
        }
        state
    }
}
