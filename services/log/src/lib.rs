//! leasehold's log: what the services need of a durable, ordered, fenced log, and two backends that give it.
//!
//! ```text
//!   producers ──publish_command──▶  commands of partition p   (lh.cmd.<p>.<class>.<key>.<id>, log sequence, log time)
//!                                          │  read strictly in sequence after the writer's cursor
//!                                          ▼
//!   writer of p ──append(p, fence, [records])──▶ outcomes of p  (lh.evt.<p>.<key>)
//!                                                  │  read by partition, key or everything; followed in order
//!                                                  ▼
//!                                       projector, agents, replay
//! ```
//!
//! - [`Log`]: the trait. An append carries a *fence* (the sequence the writer expects as the partition's last
//!   outcome) and answers [`Appended`]: landed at a range, busy (not landed: retry), stale (not landed: someone
//!   else appended), or unknown. Only a clean [`Appended::Landed`] may be trusted.
//! - [`embedded`]: one redb file in a data directory, for one process (the default; feature `embedded`, on by
//!   default, with [`export`] and the raw benchmarks: a producer that only publishes to JetStream leaves it off).
//! - [`jetstream`]: NATS JetStream streams `LH_CMD`, `LH_EVT`, `LH_DLQ` (DESIGN section 9).
//! - [`conformance`]: the test functions every backend passes, run against both.
//! - [`export`]: the whole log as one portable, checksummed file (or HTTP body), and its import into a new embedded
//!   data directory.
//! - `fuzzing` (hidden): the bodies of the fuzz targets of these decoders, shared with the corpus replay test.
//!
//! Architecture invariant: only this crate names `async_nats` or the log's redb tables.

#![forbid(unsafe_code)]

pub mod conformance;
#[cfg(feature = "embedded")]
pub mod embedded;
#[cfg(feature = "embedded")]
pub mod export;
#[cfg(feature = "embedded")]
mod follow;
#[doc(hidden)]
pub mod fuzzing;
pub mod ingest;
pub mod intercept;
pub mod jetstream;
pub mod nats_server;
#[cfg(feature = "embedded")]
pub mod raw;
pub mod reading;
mod record;

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;

pub use record::{
    Appended, CommandRecord, DeadLetter, Error, LetterId, OutcomeFilter, OutcomeRecord, Publish, Published, Snapshot,
    StoredOutcome, fence_headers, fence_headers_on, outcome_msg_id,
};

/// The most partitions a log may have: far more than one cluster serves (each partition is a writer, a consumer
/// and a state in memory), and a bound a damaged file or a typo cannot make a reader allocate past.
pub const MAX_PARTITIONS: u32 = 4096;

/// The header that names the command an outcome answers (and a dead letter's, read from its payload).
pub const HEADER_CMD_ID: &str = "Lh-Cmd-Id";
/// The command's sequence in the command log: the log itself holds the writer's cursor.
pub const HEADER_CMD_SEQ: &str = "Lh-Cmd-Seq";
/// The part of the decision (0 for the first).
pub const HEADER_PART: &str = "Lh-Part";
/// The fence this outcome was appended under: the sequence of the partition's previous outcome (0 for the first).
/// Every fold checks the chain and stops on a break.
pub const HEADER_PREV_SEQ: &str = "Lh-Prev-Seq";
/// On the later records of an atomic batch, instead of [`HEADER_PREV_SEQ`]: the record's index in the batch (1 for
/// the second). A batch is stored contiguously, so the record's predecessor is the one stored just before it; only
/// the first record carries the fence (ADR-50 checks it against the stream as it was before the batch).
pub const HEADER_BATCH_INDEX: &str = "Lh-Batch-Index";
/// How long a command id is remembered for dedupe (`LH_CMD`'s `duplicate_window`, the embedded log's likewise).
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(600);
/// The most records one append takes: a JetStream atomic batch holds at most 1,000 messages.
pub const MAX_APPEND_RECORDS: usize = 1000;
/// Why a command was dead-lettered.
pub const HEADER_DLQ_REASON: &str = "Lh-Reason";
/// The command log sequence of a dead-lettered command.
pub const HEADER_DLQ_SOURCE_SEQ: &str = "Lh-Source-Seq";
/// The subject a dead-lettered command was stored on.
pub const HEADER_DLQ_SOURCE_SUBJECT: &str = "Lh-Source-Subject";
/// The `Nats-Msg-Id` a dead-lettered command was published under, when its payload names no command id: its
/// unverified id. A letter whose payload names one carries it as [`HEADER_CMD_ID`].
pub const HEADER_DLQ_PRODUCER_ID: &str = "Lh-Producer-Msg-Id";

/// Why the command the log stored under an id at `seq` is not `envelope`'s (`None`: it is): another class or body
/// (the issuer and its clock may differ: a client that rebuilt its envelope to send it again). Where the log no
/// longer holds it (past its retention), the class, type and key of its decision (`decided`) say; with neither, it
/// is taken to be the same. A command id names one command; each partition remembers only its own, so the front
/// doors check this before they answer a command with what the log holds under its id.
pub async fn other_command_under_id<L: Log>(
    log: &L,
    seq: u64,
    envelope: &leasehold_schemas::Envelope,
    decided: Option<&leasehold_schemas::Outcome>,
) -> Result<Option<String>, Error> {
    let (same, what) = match (log.command_at(seq).await?, decided) {
        (Some(record), _) => match leasehold_schemas::codec::decode_command(&record.payload) {
            Ok(stored) => (
                stored.class == envelope.class && stored.body == envelope.body,
                format!("{} for {}", stored.type_name(), stored.body.key().token()),
            ),
            Err(_) => (false, "a payload that does not decode".to_owned()),
        },
        (None, Some(outcome)) => (
            outcome.command.class == envelope.class
                && outcome.command.type_name == envelope.type_name()
                && outcome.command.key == envelope.body.key(),
            format!("{} for {}", outcome.command.type_name, outcome.command.key.token()),
        ),
        (None, None) => return Ok(None),
    };
    Ok((!same).then(|| {
        format!(
            "command id {} names another command ({what}, stored at command sequence {seq}): a command id is chosen \
             once per command; choose a new one",
            envelope.command_id
        )
    }))
}

/// Why a command given to the log cannot be answered as stored ([`settle_publish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotStored {
    /// The log refused it: nothing was stored (a bad subject, too large).
    Refused(Error),
    /// Its id was used for another command, which the log holds under it (the why says which).
    OtherCommand(String),
    /// The publish was not answered: it may have been stored, and sending it again is safe.
    Unanswered(Error),
    /// A duplicate whose stored copy cannot be read to tell whether it is this command.
    Unchecked(Error),
}

/// Settles what the log answered to publishing `envelope` (or, for a command already decided, the first copy the
/// front door answers with, `decided` its decision): a refusal and an unanswered publish say so, and a duplicate
/// must be this very command, or a client sending another command under an id already used would get the other
/// command's decision for its own ([`other_command_under_id`]). What the gateway and the command line answer for
/// each command they publish.
pub async fn settle_publish<L: Log>(
    log: &L,
    published: Result<Published, Error>,
    envelope: &leasehold_schemas::Envelope,
    decided: Option<&leasehold_schemas::Outcome>,
) -> Result<Published, NotStored> {
    let published = match published {
        Ok(published) => published,
        Err(e @ Error::Refused(_)) => return Err(NotStored::Refused(e)),
        Err(e) => return Err(NotStored::Unanswered(e)),
    };
    if published.duplicate {
        match other_command_under_id(log, published.seq, envelope, decided).await {
            Ok(None) => {}
            Ok(Some(why)) => return Err(NotStored::OtherCommand(why)),
            Err(e) => return Err(NotStored::Unchecked(e)),
        }
    }
    Ok(published)
}

/// What the services need of the log. Implementations are cheap to clone (a handle on shared state).
///
/// Sequences are the log's own: one counter for all commands, one for all outcomes (as a JetStream stream's), so a
/// partition's sequences are increasing but not dense. `0` means "nothing": the fence of an empty partition, the
/// cursor before the first command.
pub trait Log: Clone + Send + Sync + 'static {
    /// The owner of one partition's commands (see [`Log::own`]).
    type Owner: Owner;

    /// How many partitions the log was created with.
    fn partitions(&self) -> u32;

    /// Publishes a command on its ingress subject (`lh.in.<class>.<key>.<id>`); the log stores it on the command
    /// subject of its partition and stamps its log time. A command whose `msg_id` (its command id) was published
    /// within the duplicate window is not stored again: the answer names the first copy's sequence.
    fn publish_command(
        &self,
        subject: &str,
        msg_id: &str,
        payload: bytes::Bytes,
    ) -> impl Future<Output = Result<Published, Error>> + Send;

    /// Publishes `commands` together (batched ingest: one fsync for all of them where the log can), each answered
    /// as [`Log::publish_command`] would answer it alone, in order: deduplicated by its own id (a duplicate names
    /// the first copy, and does not keep the others from being stored), refused alone for a bad subject or size.
    /// Commands are stored in the order given. An error that touches them all (the log unavailable) answers each.
    fn publish_commands(&self, commands: &[Publish]) -> impl Future<Output = Vec<Result<Published, Error>>> + Send;

    /// Up to `max` commands of `partition` with sequences after `after`, strictly in sequence, without waiting.
    fn read_commands(
        &self,
        partition: u32,
        after: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<CommandRecord>, Error>> + Send;

    /// The command stored at `seq`, if the log still holds it (commands age out after the retention).
    fn command_at(&self, seq: u64) -> impl Future<Output = Result<Option<CommandRecord>, Error>> + Send;

    /// The last sequence the command log has given (0 if it is empty).
    fn last_command_seq(&self) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Appends `records`, in order, as the next outcomes of `partition`, if the partition's last outcome is at
    /// `fence` (0: the partition has none). The first record carries `fence` as its previous sequence, every next
    /// one the sequence of the record before it. Two appenders with the same fence never both land.
    fn append(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> impl Future<Output = Appended> + Send;

    /// The most records one append of this log takes ([`MAX_APPEND_RECORDS`]; 1 on a JetStream log whose
    /// `LH_EVT` does not allow atomic batches: made before group commit, and not upgraded by an operator yet).
    fn max_append_records(&self) -> usize {
        MAX_APPEND_RECORDS
    }

    /// The sequence of the last outcome of `partition` (0 if none): the fence its next append must carry. Reads
    /// the latest write (never a lagging replica).
    fn last_outcome_seq(&self, partition: u32) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Outcomes matching `filter` with sequences from `from`, in order, at most `max` of them (the caller reads
    /// on from the last one's sequence + 1 until it has reached the sequence it needs).
    fn read_outcomes(
        &self,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<StoredOutcome>, Error>> + Send;

    /// Every outcome matching `filter` from sequence `from` on, in order, each exactly once, then every new one
    /// as it lands. The stream ends only with an error.
    fn follow(&self, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>>;

    /// Stores an undecodable or refused command in the dead-letter log, once per source sequence. A letter whose
    /// payload names no command id gets the message id the command was published under (`Nats-Msg-Id`), marked
    /// unverified: JetStream keeps it with the command; the embedded log knows it while the duplicate window does.
    fn dead_letter(&self, letter: DeadLetter) -> impl Future<Output = Result<(), Error>> + Send;

    /// Dead letters with sequences from `from`, in order, at most `max`, each with its command id when it has one
    /// (a letter stored before ids were recorded: the one its payload's header names).
    fn read_dead_letters(
        &self,
        from: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<(u64, DeadLetter)>, Error>> + Send;

    /// Stores `snapshot` as the latest of its partition (a cache: losing it costs a longer load, nothing else).
    fn put_snapshot(&self, snapshot: Snapshot) -> impl Future<Output = Result<(), Error>> + Send;

    /// The latest snapshot of `partition`, if any.
    fn latest_snapshot(&self, partition: u32) -> impl Future<Output = Result<Option<Snapshot>, Error>> + Send;

    /// Says that `worker` is alive (`alive`, repeated well within [`Log::worker_ttl`]) or leaving, and lists the
    /// workers alive now, sorted. Workers spread the partitions among those listed.
    fn workers(&self, worker: &str, alive: bool) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// How long a worker stays listed after it last said it is alive.
    fn worker_ttl(&self) -> Duration;

    /// Whether some writer serves `partition` now, as far as the log can tell (on JetStream: a client is pinned, or
    /// no command waits). A partition nobody serves for long is taken by any worker, whatever its share.
    fn is_served(&self, partition: u32) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Asks to serve `partition` as `worker`. `Ok(None)`: another worker serves it now. Ownership is for liveness
    /// only: two owners may briefly both believe they own a partition; the fence keeps them from both appending.
    fn own(&self, partition: u32, worker: &str) -> impl Future<Output = Result<Option<Self::Owner>, Error>> + Send;
}

/// A worker's hold on one partition: the commands come through it, and it keeps the hold alive while used.
pub trait Owner: Send + 'static {
    fn partition(&self) -> u32;

    /// Waits up to `wait` for commands after `after`, and gives up to `max` of them, strictly in sequence (an
    /// empty list when none came in time). `Err(Error::Lost)` when another worker serves the partition now.
    fn next_commands(
        &mut self,
        after: u64,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<CommandRecord>, Error>> + Send;

    /// Keeps the hold alive without taking commands (while the partition loads, which may take a while).
    /// `Err(Error::Lost)` when another worker serves the partition now.
    fn keep_alive(&mut self) -> impl Future<Output = Result<(), Error>> + Send {
        async { Ok(()) }
    }

    /// Tells the log that every command up to `seq` is done with (its outcome landed, or it needed none).
    fn done_through(&mut self, seq: u64) -> impl Future<Output = Result<(), Error>> + Send;

    /// For a clean stop: everything up to `after` is done with; gives, strictly in sequence after it and up to
    /// `max`, the commands this owner was already sent (and those on their way: what its waiting pulls have room
    /// for of what the log held, waited for up to `wait`), asking the log for nothing more. A writer decides them
    /// before it releases the partition, so the next owner is not sent them again. An empty list when none are at
    /// hand (a log that sends nothing ahead never has any). `Err(Error::Lost)` when another worker serves the
    /// partition now.
    fn in_hand(
        &mut self,
        after: u64,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<CommandRecord>, Error>> + Send {
        let _ = (after, max, wait);
        async { Ok(Vec::new()) }
    }

    /// Gives the partition up so another worker takes it at once.
    fn release(self) -> impl Future<Output = ()> + Send;
}
