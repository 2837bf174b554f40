//! The fold every command of this tool runs: the log's entries, in reader order, into one state per partition, with
//! the checks every fold of leasehold makes (the `Lh-Prev-Seq` chain, headers that agree with the body, a decider
//! no newer than this one) and the order of decisions (a command's parts in a row, commands in sequence).
//!
//! A command is kept from the moment it is read until the outcome that answers it (or a later one of its
//! partition, which shows it got none), so each step comes with the command it answers and the commands before it
//! that got no outcome.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};

use leasehold_domain::{DECIDER_VERSION, PartitionState, apply};
use leasehold_log::export::Entry;
use leasehold_log::{CommandRecord, StoredOutcome};
use leasehold_schemas::{Outcome, codec};

/// Folds `entries` to their end, or until `visit` breaks, calling it with each step once applied (and the fold, for
/// the states after it): what the questions that need no look before a step (`history`, `why`) share.
pub async fn each_step(
    partitions: u32,
    mut entries: futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    mut visit: impl FnMut(&Fold, &Step) -> std::ops::ControlFlow<()>,
) -> Result<Fold, Failure> {
    let mut fold = Fold::new(partitions);
    while let Some(entry) = futures::StreamExt::next(&mut entries).await {
        let entry = entry.map_err(|e| {
            let at = fold.last_outcome();
            Failure {
                what: "outcome",
                seq: at + 1,
                partition: None,
                detail: format!("reading the log after outcome {at}: {e}"),
            }
        })?;
        let Some(step) = fold.admit(entry)? else { continue };
        fold.apply(&step)?;
        if visit(&fold, &step).is_break() {
            break;
        }
    }
    Ok(fold)
}

/// The first thing found wrong, at an outcome's (or a command's) sequence.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, thiserror::Error)]
#[error("{what} {seq}{}: {detail}", partition.map(|p| format!(" (partition {p})")).unwrap_or_default())]
pub struct Failure {
    /// `outcome` or `command`: which log the sequence is in.
    pub what: &'static str,
    pub seq: u64,
    pub partition: Option<u32>,
    pub detail: String,
}

impl Failure {
    pub fn outcome(seq: u64, partition: u32, detail: impl Into<String>) -> Self {
        Failure { what: "outcome", seq, partition: Some(partition), detail: detail.into() }
    }

    pub fn command(seq: u64, partition: u32, detail: impl Into<String>) -> Self {
        Failure { what: "command", seq, partition: Some(partition), detail: detail.into() }
    }
}

/// One outcome part, checked and decoded, not applied yet.
#[derive(Debug)]
pub struct Step {
    pub stored: StoredOutcome,
    pub outcome: Outcome,
    /// The command it answers, if the source still holds it (commands age out after the command log's retention;
    /// outcomes never do). A later part of a decision carries its first part's command.
    pub command: Option<CommandRecord>,
    /// The partition's commands before it that got no outcome (duplicates, heartbeats that changed nothing,
    /// commands dead-lettered), in sequence.
    pub unanswered: Vec<CommandRecord>,
    /// The command it answers is not held although older commands of the partition were read (see
    /// [`Fold::admit`]).
    pub command_missing: bool,
}

impl Step {
    pub fn partition(&self) -> u32 {
        self.stored.partition
    }

    pub fn seq(&self) -> u64 {
        self.stored.seq
    }

    /// The correlation id of the command it answers, if it carries one and the source still holds it.
    pub fn correlation_id(&self) -> Option<String> {
        let command = self.command.as_ref()?;
        codec::decode_command(&command.payload).ok()?.correlation_id.map(|id| id.to_string())
    }
}

/// Where a partition's decisions stand.
#[derive(Debug, Clone, Copy, Default)]
struct Decisions {
    /// The command and part of the last outcome, and whether its decision goes on in a next part.
    last: Option<(u64, u32, bool)>,
}

#[derive(Debug)]
pub struct Fold {
    states: Vec<PartitionState>,
    chain: Vec<u64>,
    decisions: Vec<Decisions>,
    waiting: Vec<VecDeque<CommandRecord>>,
    last_outcome: u64,
    last_command: Vec<u64>,
    /// The decider version of each partition's last outcome: a writer never goes back to an older one.
    versions: Vec<u32>,
    /// The command of each partition's decision in progress, for its later parts.
    deciding: Vec<Option<CommandRecord>>,
    /// Whether a command of the partition has been read: from then on, a command an outcome answers cannot be
    /// missing for retention's sake (retention drops the oldest commands only).
    commands_seen: Vec<bool>,
    /// Outcome parts folded.
    pub outcomes: u64,
    /// Commands read.
    pub commands: u64,
    /// Dead letters read.
    pub dead_letters: u64,
}

impl Fold {
    pub fn new(partitions: u32) -> Self {
        let n = partitions as usize;
        Fold {
            states: (0..partitions).map(|p| PartitionState::new(p, partitions)).collect(),
            chain: vec![0; n],
            decisions: vec![Decisions::default(); n],
            waiting: vec![VecDeque::new(); n],
            last_outcome: 0,
            last_command: vec![0; n],
            versions: vec![0; n],
            commands_seen: vec![false; n],
            deciding: vec![None; n],
            outcomes: 0,
            commands: 0,
            dead_letters: 0,
        }
    }

    /// Folds as writers splitting long decisions after `bytes` of effects (not the core's budget) did, so that
    /// re-deciding gives the parts they recorded.
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.states = self.states.into_iter().map(|s| s.with_split_budget(bytes)).collect();
        self
    }

    pub fn partitions(&self) -> u32 {
        self.states.len() as u32
    }

    pub fn state(&self, partition: u32) -> &PartitionState {
        &self.states[partition as usize]
    }

    pub fn states(&self) -> &[PartitionState] {
        &self.states
    }

    /// The sequence of the last outcome folded (0 before the first).
    pub fn last_outcome(&self) -> u64 {
        self.last_outcome
    }

    /// Takes the next entry: a command is kept until an outcome of its partition shows what became of it; an
    /// outcome is checked and returned as a step, to apply with [`Fold::apply`] once the caller has looked at the
    /// state before it.
    pub fn admit(&mut self, entry: Entry) -> Result<Option<Step>, Failure> {
        match entry {
            Entry::Command { partition, record } => {
                if partition >= self.partitions() {
                    return Err(Failure::command(record.seq, partition, "there is no such partition in this log"));
                }
                let p = partition as usize;
                if record.seq <= self.last_command[p] {
                    return Err(Failure::command(
                        record.seq,
                        partition,
                        format!(
                            "it comes after command {} of its partition: commands are out of order",
                            self.last_command[p]
                        ),
                    ));
                }
                self.last_command[p] = record.seq;
                self.commands_seen[p] = true;
                self.commands += 1;
                self.waiting[p].push_back(record);
                Ok(None)
            }
            Entry::DeadLetter { .. } => {
                self.dead_letters += 1;
                Ok(None)
            }
            Entry::Outcome(stored) => self.check(stored).map(Some),
        }
    }

    fn check(&mut self, stored: StoredOutcome) -> Result<Step, Failure> {
        let (seq, partition) = (stored.seq, stored.partition);
        if partition >= self.partitions() {
            return Err(Failure::outcome(seq, partition, "there is no such partition in this log"));
        }
        if seq <= self.last_outcome {
            return Err(Failure::outcome(
                seq,
                partition,
                format!("it comes after outcome {}: the outcome log is out of order", self.last_outcome),
            ));
        }
        let p = partition as usize;
        if stored.prev_seq != self.chain[p] {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "its Lh-Prev-Seq says the partition's outcome before it is at {}, but it is at {}: the chain is \
                     broken (an outcome missing, or appended outside the fence)",
                    stored.prev_seq, self.chain[p]
                ),
            ));
        }
        let outcome = codec::decode_outcome(&stored.payload)
            .map_err(|e| Failure::outcome(seq, partition, format!("it does not decode: {e}")))?;
        if outcome.decider_version > DECIDER_VERSION {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "it was decided by decider version {}, newer than this tool's {DECIDER_VERSION}: use a newer \
                     leasehold-replay",
                    outcome.decider_version
                ),
            ));
        }
        if outcome.partition != partition || outcome.cmd_seq != stored.cmd_seq || outcome.part != stored.part {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "its headers (command {}, part {}) do not match its body (partition {}, command {}, part {})",
                    stored.cmd_seq, stored.part, outcome.partition, outcome.cmd_seq, outcome.part
                ),
            ));
        }
        // The subject and the command id too: an agent reads only its own subject.
        let key = outcome.command.key.token();
        if stored.key != key || stored.cmd_id != outcome.command.id.to_string() {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "it is stored under key {:?} and command id {}, but its body is about {key:?} and command {}",
                    stored.key, stored.cmd_id, outcome.command.id
                ),
            ));
        }
        if outcome.decider_version < self.versions[p] {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "it says decider version {}, older than the partition's outcomes before it ({}): writers never go \
                     back to an older decider",
                    outcome.decider_version, self.versions[p]
                ),
            ));
        }
        let last = self.decisions[p].last;
        match (outcome.part, last) {
            (0, Some((cmd, part, true))) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!(
                        "the decision of command {cmd} goes on after its part {part}, but this outcome starts another"
                    ),
                ));
            }
            (0, Some((cmd, _, false))) if outcome.cmd_seq <= cmd => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!(
                        "it answers command {}, but command {cmd} was decided already: a command has one decision, \
                         and commands are decided in sequence",
                        outcome.cmd_seq
                    ),
                ));
            }
            (0, _) => {}
            (part, Some((cmd, last_part, true))) if cmd == outcome.cmd_seq && part == last_part + 1 => {}
            (part, _) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!("it is part {part} of command {}'s decision, which does not go on there", outcome.cmd_seq),
                ));
            }
        }
        let mut unanswered = Vec::new();
        let mut command = None;
        if outcome.part == 0 {
            while let Some(front) = self.waiting[p].front() {
                if front.seq > outcome.cmd_seq {
                    break;
                }
                let record = self.waiting[p].pop_front().expect("looked at the front");
                if record.seq == outcome.cmd_seq {
                    command = Some(record);
                } else {
                    unanswered.push(record);
                }
            }
        }
        // A command missing after older ones of its partition were read: retention moved while a live log was read
        // (the walk reads each partition's commands in batches, and `max_age` goes on meanwhile), or the log was
        // altered. Not a failure (a healthy live log can show it), but not to be mistaken for plain retention.
        let command_missing = outcome.part == 0 && command.is_none() && self.commands_seen[p];
        let command = if outcome.part == 0 {
            self.deciding[p] = if outcome.continues() { command.clone() } else { None };
            command
        } else {
            let command = self.deciding[p].clone();
            if !outcome.continues() {
                self.deciding[p] = None;
            }
            command
        };
        Ok(Step { stored, outcome, command, unanswered, command_missing })
    }

    /// Folds a step into its partition's state.
    pub fn apply(&mut self, step: &Step) -> Result<(), Failure> {
        let (seq, partition) = (step.seq(), step.partition());
        let p = partition as usize;
        match catch_unwind(AssertUnwindSafe(|| apply(&mut self.states[p], &step.outcome))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("it does not fold: {e}"))),
            Err(_) => return Err(Failure::outcome(seq, partition, "folding it panicked")),
        }
        self.chain[p] = seq;
        self.versions[p] = step.outcome.decider_version;
        self.last_outcome = seq;
        self.decisions[p].last = Some((step.outcome.cmd_seq, step.outcome.part, step.outcome.continues()));
        self.outcomes += 1;
        Ok(())
    }

    /// The commands read that no outcome has answered (nor shown unanswered): those not decided yet.
    pub fn undecided(&self) -> impl Iterator<Item = (u32, &CommandRecord)> {
        self.waiting.iter().enumerate().flat_map(|(p, queue)| queue.iter().map(move |r| (p as u32, r)))
    }
}
