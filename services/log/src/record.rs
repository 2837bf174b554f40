//! What goes in and comes out of the log.

use std::fmt;

use bytes::Bytes;
use leasehold_schemas::Timestamp;
use leasehold_schemas::subjects::outcome_filter;

/// A command as the log stored it.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// Its sequence in the command log.
    pub seq: u64,
    /// The stored subject: `lh.cmd.<p>.<class>.<key>.<id>`.
    pub subject: String,
    /// The time the log stamped on it: the only clock decisions use.
    pub time: Timestamp,
    pub payload: Bytes,
}

impl fmt::Debug for CommandRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandRecord")
            .field("seq", &self.seq)
            .field("subject", &self.subject)
            .field("time", &self.time)
            .field("bytes", &self.payload.len())
            .finish()
    }
}

/// One outcome part to append.
#[derive(Clone, PartialEq, Eq)]
pub struct OutcomeRecord {
    /// The subject token of the agent or pool the outcome is about (`lh.evt.<p>.<key>`).
    pub key: String,
    /// The command id it answers (header `Lh-Cmd-Id`).
    pub cmd_id: String,
    /// The command's sequence (header `Lh-Cmd-Seq`).
    pub cmd_seq: u64,
    /// The part of the decision (header `Lh-Part`).
    pub part: u32,
    /// The encoded outcome.
    pub payload: Bytes,
}

impl OutcomeRecord {
    /// The record of `outcome`, whose encoding is `payload`: its key, command and part as the headers carry them.
    pub fn of(outcome: &leasehold_schemas::Outcome, payload: Bytes) -> Self {
        OutcomeRecord {
            key: outcome.command.key.token(),
            cmd_id: outcome.command.id.to_string(),
            cmd_seq: outcome.cmd_seq,
            part: outcome.part,
            payload,
        }
    }
}

impl fmt::Debug for OutcomeRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeRecord")
            .field("key", &self.key)
            .field("cmd_seq", &self.cmd_seq)
            .field("part", &self.part)
            .field("bytes", &self.payload.len())
            .finish()
    }
}

/// An outcome as the log stored it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredOutcome {
    /// Its sequence in the outcome log.
    pub seq: u64,
    pub partition: u32,
    pub key: String,
    pub cmd_id: String,
    pub cmd_seq: u64,
    pub part: u32,
    /// The sequence of the partition's outcome before it (0 for the first): the chain every fold checks.
    pub prev_seq: u64,
    pub payload: Bytes,
}

impl fmt::Debug for StoredOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredOutcome")
            .field("seq", &self.seq)
            .field("partition", &self.partition)
            .field("key", &self.key)
            .field("cmd_seq", &self.cmd_seq)
            .field("part", &self.part)
            .field("prev_seq", &self.prev_seq)
            .field("bytes", &self.payload.len())
            .finish()
    }
}

/// Which outcomes to read or follow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OutcomeFilter {
    /// Every outcome (`lh.evt.>`).
    All,
    /// One partition's (`lh.evt.<p>.>`).
    Partition(u32),
    /// One agent's or pool's (`lh.evt.<p>.<key>`): what an agent reads.
    Key { partition: u32, key: String },
}

impl OutcomeFilter {
    /// The NATS subject filter.
    pub fn subject(&self) -> String {
        match self {
            OutcomeFilter::All => "lh.evt.>".to_owned(),
            OutcomeFilter::Partition(p) => outcome_filter(*p),
            OutcomeFilter::Key { partition, key } => format!("lh.evt.{partition}.{key}"),
        }
    }

    pub fn matches(&self, partition: u32, key: &str) -> bool {
        match self {
            OutcomeFilter::All => true,
            OutcomeFilter::Partition(p) => *p == partition,
            OutcomeFilter::Key { partition: p, key: k } => *p == partition && k == key,
        }
    }
}

/// A command that cannot be decided: its raw bytes, where it was, why, and which command it was when that can be
/// told.
#[derive(Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: u32,
    /// Its sequence in the command log.
    pub source_seq: u64,
    /// The subject it was stored on.
    pub source_subject: String,
    pub reason: String,
    pub payload: Bytes,
    /// The command id, read before the bytes may be dropped; `None` when neither the payload nor its producer
    /// named one. A letter stored before ids were recorded gets the one its payload's header names when read.
    pub command_id: Option<LetterId>,
}

/// Which command a dead letter was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterId {
    pub id: String,
    /// Read from the payload itself (its header names it: the body's id is the truth). False: the payload names
    /// none, and this is only the `Nats-Msg-Id` its producer published it under, the producer's word.
    pub verified: bool,
}

impl LetterId {
    /// The id a payload's header names (verified), if it has a readable one: how a letter stored before ids were
    /// recorded is read.
    pub fn read_from(payload: &[u8]) -> Option<LetterId> {
        leasehold_schemas::codec::peek_command_id(payload).map(|id| LetterId { id: id.to_string(), verified: true })
    }
}

/// The longest producer's message id a letter keeps (a longer one is no command id anyway).
const MAX_PRODUCER_ID: usize = 256;

impl fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetter")
            .field("partition", &self.partition)
            .field("source_seq", &self.source_seq)
            .field("source_subject", &self.source_subject)
            .field("reason", &self.reason)
            .field("bytes", &self.payload.len())
            .field("command_id", &self.command_id)
            .finish()
    }
}

impl DeadLetter {
    /// The letter of `command`, read from `partition` and refused for `reason`, with the command id its payload's
    /// header names (read now, before the log may have to drop the bytes: a payload over the codec's limit or too
    /// large for the dead-letter log). The log adds its producer's message id when the payload names none.
    pub fn of(partition: u32, command: &CommandRecord, reason: String) -> DeadLetter {
        DeadLetter {
            partition,
            source_seq: command.seq,
            source_subject: command.subject.clone(),
            reason,
            payload: command.payload.clone(),
            command_id: LetterId::read_from(&command.payload),
        }
    }

    /// The letter with `msg_id`, the id its producer published it under, as its unverified command id, when the
    /// payload names none and `msg_id` can be one (not empty, one line, at most 256 bytes).
    pub fn with_producer_id(mut self, msg_id: Option<&str>) -> DeadLetter {
        if self.command_id.is_none()
            && let Some(msg_id) =
                msg_id.filter(|id| !id.is_empty() && id.len() <= MAX_PRODUCER_ID && !id.chars().any(|c| c.is_control()))
        {
            self.command_id = Some(LetterId { id: msg_id.to_owned(), verified: false });
        }
        self
    }

    /// `lh.dlq.<p>.<class>.<key>.<id>`, mirroring the command subject (or `lh.dlq.<p>._._._` for one that does not
    /// have that shape).
    pub fn subject(&self) -> String {
        let tokens: Vec<&str> = self.source_subject.split('.').collect();
        match tokens.as_slice() {
            ["lh", "cmd", _, class, key, id] => {
                leasehold_schemas::subjects::dead_letter_subject(self.partition, class, key, id)
            }
            _ => leasehold_schemas::subjects::dead_letter_subject(self.partition, "_", "_", "_"),
        }
    }

    /// The letter without its bytes, for a dead-letter log they do not fit in (a payload the command log took, plus
    /// the letter's headers): the reason says where the bytes are. Its note comes first, since a reason is cut at
    /// 512 bytes where it is stored.
    pub fn without_bytes(&self, why: &str) -> DeadLetter {
        DeadLetter {
            reason: format!(
                "its {} bytes are not kept here (they are at sequence {} of the command log: {why}); {}",
                self.payload.len(),
                self.source_seq,
                self.reason
            ),
            payload: Bytes::new(),
            ..self.clone()
        }
    }

    /// A reason fits in a header: one line, at most 512 bytes.
    pub fn header_reason(&self) -> String {
        let one_line: String = self.reason.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        one_line[..one_line.floor_char_boundary(512)].to_owned()
    }
}

/// A partition's state folded up to an outcome: where a writer's load starts, so that takeover does not grow with
/// history. Valid only for the decider version that made it.
#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub partition: u32,
    pub decider_version: u32,
    /// The sequence of the last outcome folded into it: the tail is read from the next one on.
    pub fence: u64,
    /// The command id the last outcome answers (to check the command log is the one the outcomes answer).
    pub last_command: Option<String>,
    /// The encoded state.
    pub state: Bytes,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("partition", &self.partition)
            .field("decider_version", &self.decider_version)
            .field("fence", &self.fence)
            .field("bytes", &self.state.len())
            .finish()
    }
}

/// A command to publish: its ingress subject (`lh.in.<class>.<key>.<id>`), its id (the dedupe key) and its bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Publish {
    pub subject: String,
    pub msg_id: String,
    pub payload: Bytes,
}

impl fmt::Debug for Publish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publish")
            .field("subject", &self.subject)
            .field("msg_id", &self.msg_id)
            .field("bytes", &self.payload.len())
            .finish()
    }
}

/// The answer to publishing a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Where the command is (the first copy's sequence for a duplicate).
    pub seq: u64,
    /// The command id was published before within the duplicate window: nothing was stored.
    pub duplicate: bool,
}

/// The answer to an append. Only [`Appended::Landed`] is clean; a writer that gets any other answer must not trust
/// its memory of the partition (DESIGN section 3), except [`Appended::Busy`], which is retried as it is, and
/// [`Appended::TooLarge`], which is retried in smaller appends (nothing was stored either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Every record landed, at `first..=last`, in order.
    Landed { first: u64, last: u64 },
    /// Not landed, and nothing else happened: the log is busy with another write of the partition (NATS 10164 on
    /// a replicated stream, too many open batches). Retry the same append.
    Busy(String),
    /// Not landed, and nothing else happened: the log takes fewer records (or bytes) in one append than these (a
    /// server's batch limit, a record too large to batch). Append them in smaller slices.
    TooLarge(String),
    /// Not landed: the partition's last outcome is not at the fence (another writer appended, or this writer's
    /// earlier append did). `last` is the partition's last sequence when the log said it. Reload from the log.
    Stale { last: Option<u64> },
    /// The log did not say (a timeout, a lost connection, a duplicate): some of it may have landed. Reload.
    Unknown(String),
}

/// What can go wrong talking to the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The log cannot be reached now, or did not answer in time: try again later.
    #[error("the log is unavailable: {0}")]
    Unavailable(String),
    /// Another worker serves this partition now.
    #[error("partition {0} is served by another worker now")]
    Lost(u32),
    /// The log is not what leasehold expects (a stream created differently, another partition count, a record
    /// that is not leasehold's): refused, with what differs.
    #[error("{0}")]
    Refused(String),
    /// The storage failed.
    #[error("storage failed: {0}")]
    Storage(String),
}

/// `Nats-Msg-Id` of an outcome part: `<p>:<cmd_seq>:<part>`.
pub fn outcome_msg_id(partition: u32, cmd_seq: u64, part: u32) -> String {
    format!("{partition}:{cmd_seq}:{part}")
}

/// The fence of an append to `partition`, as the two headers every writer sends, spelled byte for byte the same
/// everywhere: on a replicated stream the leader matches in-flight proposals by this exact string.
pub fn fence_headers(partition: u32, fence: u64) -> [(&'static str, String); 2] {
    fence_headers_on(&outcome_filter(partition), fence)
}

/// The fence on any subject filter (the benchmark fences a scratch stream's lanes the same way).
pub fn fence_headers_on(filter: &str, fence: u64) -> [(&'static str, String); 2] {
    [
        ("Nats-Expected-Last-Subject-Sequence", fence.to_string()),
        ("Nats-Expected-Last-Subject-Sequence-Subject", filter.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_is_spelled_one_way() {
        let [(seq_name, seq), (subject_name, subject)] = fence_headers(7, 1234);
        assert_eq!(seq_name, "Nats-Expected-Last-Subject-Sequence");
        assert_eq!(seq, "1234");
        assert_eq!(subject_name, "Nats-Expected-Last-Subject-Sequence-Subject");
        assert_eq!(subject, "lh.evt.7.>");
        assert_eq!(fence_headers(0, 0)[0].1, "0");
        assert_eq!(outcome_msg_id(3, 42, 1), "3:42:1");
    }

    #[test]
    fn a_dead_letter_mirrors_its_subject() {
        let letter = |subject: &str| DeadLetter {
            partition: 2,
            source_seq: 9,
            source_subject: subject.to_owned(),
            reason: "bad\nthing".to_owned(),
            payload: Bytes::new(),
            command_id: None,
        };
        assert_eq!(letter("lh.cmd.2.op.w1._").subject(), "lh.dlq.2.op.w1._");
        assert_eq!(letter("lh.cmd.2.op").subject(), "lh.dlq.2._._._");
        assert_eq!(letter("x").header_reason(), "bad thing");
    }
}
