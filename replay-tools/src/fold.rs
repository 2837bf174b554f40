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
use leasehold_schemas::subjects::spells;
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

/// The fold of a whole log: one [`PartitionFold`] per partition, and the checks across partitions (a partition the
/// log has, outcomes in sequence).
#[derive(Debug)]
pub struct Fold {
    parts: Vec<PartitionFold>,
    last_outcome: u64,
    /// Outcome parts folded.
    pub outcomes: u64,
    /// Commands read.
    pub commands: u64,
    /// Dead letters read.
    pub dead_letters: u64,
}

/// One partition's part of the fold: its state, its `Lh-Prev-Seq` chain, where its decisions stand, and its
/// commands not answered yet. Partitions fold independently of each other, so `verify` folds them on several
/// threads ([`crate::verify`]); [`Fold`] holds them all for the questions that fold in log order.
#[derive(Debug)]
pub struct PartitionFold {
    state: PartitionState,
    chain: u64,
    decisions: Decisions,
    waiting: VecDeque<CommandRecord>,
    last_command: u64,
    /// The decider version of the partition's last outcome: a writer never goes back to an older one.
    version: u32,
    /// The command of the partition's decision in progress, for its later parts.
    deciding: Option<CommandRecord>,
    /// Whether a command of the partition has been read: from then on, a command an outcome answers cannot be
    /// missing for retention's sake (retention drops the oldest commands only).
    commands_seen: bool,
}

impl Fold {
    pub fn new(partitions: u32) -> Self {
        Fold {
            parts: (0..partitions).map(|p| PartitionFold::new(p, partitions)).collect(),
            last_outcome: 0,
            outcomes: 0,
            commands: 0,
            dead_letters: 0,
        }
    }

    /// Folds as writers splitting long decisions after `bytes` of effects (not the core's budget) did, so that
    /// re-deciding gives the parts they recorded.
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.parts = self.parts.into_iter().map(|p| p.with_split_budget(bytes)).collect();
        self
    }

    pub fn partitions(&self) -> u32 {
        self.parts.len() as u32
    }

    pub fn state(&self, partition: u32) -> &PartitionState {
        &self.parts[partition as usize].state
    }

    pub fn states(&self) -> impl Iterator<Item = &PartitionState> {
        self.parts.iter().map(|p| &p.state)
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
                check_partition("command", record.seq, partition, self.partitions())?;
                self.parts[partition as usize].admit_command(partition, record)?;
                self.commands += 1;
                Ok(None)
            }
            Entry::DeadLetter { .. } => {
                self.dead_letters += 1;
                Ok(None)
            }
            Entry::Outcome(stored) => {
                check_outcome_order(&stored, self.partitions(), self.last_outcome)?;
                self.parts[stored.partition as usize].check(stored).map(Some)
            }
        }
    }

    /// Folds a step into its partition's state.
    pub fn apply(&mut self, step: &Step) -> Result<(), Failure> {
        self.parts[step.partition() as usize].apply(step)?;
        self.last_outcome = step.seq();
        self.outcomes += 1;
        Ok(())
    }

    /// The commands read that no outcome has answered (nor shown unanswered): those not decided yet.
    pub fn undecided(&self) -> impl Iterator<Item = (u32, &CommandRecord)> {
        self.parts.iter().enumerate().flat_map(|(p, part)| part.undecided().map(move |r| (p as u32, r)))
    }
}

/// An entry of a partition the log does not have.
pub fn check_partition(what: &'static str, seq: u64, partition: u32, partitions: u32) -> Result<(), Failure> {
    if partition >= partitions {
        return Err(Failure {
            what,
            seq,
            partition: Some(partition),
            detail: "there is no such partition in this log".to_owned(),
        });
    }
    Ok(())
}

/// The checks of an outcome across partitions, before its partition's own: a partition the log has, and a sequence
/// after the last outcome's (`last_outcome`).
pub fn check_outcome_order(stored: &StoredOutcome, partitions: u32, last_outcome: u64) -> Result<(), Failure> {
    let (seq, partition) = (stored.seq, stored.partition);
    check_partition("outcome", seq, partition, partitions)?;
    if seq <= last_outcome {
        return Err(Failure::outcome(
            seq,
            partition,
            format!("it comes after outcome {last_outcome}: the outcome log is out of order"),
        ));
    }
    Ok(())
}

impl PartitionFold {
    pub fn new(partition: u32, partitions: u32) -> Self {
        PartitionFold {
            state: PartitionState::new(partition, partitions),
            chain: 0,
            decisions: Decisions::default(),
            waiting: VecDeque::new(),
            last_command: 0,
            version: 0,
            deciding: None,
            commands_seen: false,
        }
    }

    /// See [`Fold::with_split_budget`].
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.state = self.state.with_split_budget(bytes);
        self
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    /// Keeps a command of this partition (`partition`) until an outcome shows what became of it; commands come in
    /// sequence.
    pub fn admit_command(&mut self, partition: u32, record: CommandRecord) -> Result<(), Failure> {
        if record.seq <= self.last_command {
            return Err(Failure::command(
                record.seq,
                partition,
                format!("it comes after command {} of its partition: commands are out of order", self.last_command),
            ));
        }
        self.last_command = record.seq;
        self.commands_seen = true;
        self.waiting.push_back(record);
        Ok(())
    }

    /// The partition's commands that no outcome has answered (nor shown unanswered).
    pub fn undecided(&self) -> impl Iterator<Item = &CommandRecord> {
        self.waiting.iter()
    }

    /// Checks an outcome of this partition (the checks across partitions made: [`check_outcome_order`]) and
    /// decodes it: a step, to apply with [`PartitionFold::apply`] once the caller has looked at the state before it.
    pub fn check(&mut self, stored: StoredOutcome) -> Result<Step, Failure> {
        let (seq, partition) = (stored.seq, stored.partition);
        if stored.prev_seq != self.chain {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "its Lh-Prev-Seq says the partition's outcome before it is at {}, but it is at {}: the chain is \
                     broken (an outcome missing, or appended outside the fence)",
                    stored.prev_seq, self.chain
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
        let (key, id) = (&outcome.command.key, &outcome.command.id);
        if !spells(&stored.key, format_args!("{}", key.token_display()))
            || !spells(&stored.cmd_id, format_args!("{id}"))
        {
            let key = key.token();
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "it is stored under key {:?} and command id {}, but its body is about {key:?} and command {}",
                    stored.key, stored.cmd_id, outcome.command.id
                ),
            ));
        }
        if outcome.decider_version < self.version {
            return Err(Failure::outcome(
                seq,
                partition,
                format!(
                    "it says decider version {}, older than the partition's outcomes before it ({}): writers never go \
                     back to an older decider",
                    outcome.decider_version, self.version
                ),
            ));
        }
        let last = self.decisions.last;
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
            while let Some(front) = self.waiting.front() {
                if front.seq > outcome.cmd_seq {
                    break;
                }
                let record = self.waiting.pop_front().expect("looked at the front");
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
        let command_missing = outcome.part == 0 && command.is_none() && self.commands_seen;
        let command = if outcome.part == 0 {
            self.deciding = if outcome.continues() { command.clone() } else { None };
            command
        } else {
            let command = self.deciding.clone();
            if !outcome.continues() {
                self.deciding = None;
            }
            command
        };
        Ok(Step { stored, outcome, command, unanswered, command_missing })
    }

    /// Folds a step of this partition into its state.
    pub fn apply(&mut self, step: &Step) -> Result<(), Failure> {
        let (seq, partition) = (step.seq(), step.partition());
        match catch_unwind(AssertUnwindSafe(|| apply(&mut self.state, &step.outcome))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("it does not fold: {e}"))),
            Err(_) => return Err(Failure::outcome(seq, partition, "folding it panicked")),
        }
        self.chain = seq;
        self.version = step.outcome.decider_version;
        self.decisions.last = Some((step.outcome.cmd_seq, step.outcome.part, step.outcome.continues()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use leasehold_domain::driver::Driver;
    use leasehold_schemas::Uuid;
    use leasehold_schemas::command::Register;
    use leasehold_schemas::ids::{AgentName, Timestamp};

    use super::*;

    /// A registration's outcome at sequence 1 of partition 0 of 1, stored under its own key and command id.
    fn registration() -> StoredOutcome {
        let mut driver = Driver::new(0, 1, Timestamp(1_800_000_000_000));
        let outcome = driver.submit("w1", Register::new(AgentName::new("w1").unwrap(), Uuid::from_u128(1)));
        StoredOutcome {
            seq: 1,
            partition: 0,
            key: outcome.command.key.token(),
            cmd_id: outcome.command.id.to_string(),
            cmd_seq: outcome.cmd_seq,
            part: 0,
            prev_seq: 0,
            payload: Bytes::from(codec::encode_outcome(&outcome).unwrap()),
        }
    }

    /// An outcome stored under another key or another command id than its body's (an agent would read it on the
    /// wrong subject) fails its check; under its own, it passes. The key and the id are compared with no copy of
    /// them made, so a longer or shorter text must fail as well as a different one.
    #[test]
    fn an_outcome_stored_under_another_key_or_command_id_fails() {
        let stored = registration();
        assert!(PartitionFold::new(0, 1).check(stored.clone()).is_ok());
        let id = stored.cmd_id.clone();
        let wrong = [
            StoredOutcome { key: "w2".to_owned(), ..stored.clone() },
            StoredOutcome { key: "w1x".to_owned(), ..stored.clone() },
            StoredOutcome { key: "w".to_owned(), ..stored.clone() },
            StoredOutcome { cmd_id: format!("{id}0"), ..stored.clone() },
            StoredOutcome { cmd_id: id[..id.len() - 1].to_owned(), ..stored.clone() },
        ];
        for stored in wrong {
            let (key, id) = (stored.key.clone(), stored.cmd_id.clone());
            let failure = PartitionFold::new(0, 1).check(stored).expect_err("another key or command id");
            assert!(failure.detail.contains("is stored under key"), "{key} {id}: {failure}");
        }
    }
}
