//! A portable export of the whole log: one self-contained file (or HTTP body) that another machine can audit without
//! the cluster, and that [`import`] restores into a new embedded data directory that `serve` can go on with.
//!
//! ```text
//!   LHEXPORT                                   8 bytes of magic
//!   frame H  header (JSON)                     format and its version, schema and decider versions, partitions, end
//!   frame C | O | L                            every command, outcome and dead letter, in reader order (entries)
//!   frame T  trailer (JSON)                    how many of each, the last outcome sequence
//!
//!   frame = kind u8 | payload length u32 LE | CRC-32 of kind, length and payload, u32 LE | payload
//! ```
//!
//! Records are bincode 2 of this module's own mirror structs: to the log a command or outcome is bytes, so this is
//! the log's container, not the wire of commands and outcomes that only `schemas` knows. The header and trailer are
//! JSON, so `head -c 300 FILE` says what a file is. A frame is at most [`MAX_FRAME`] bytes, so a damaged length
//! cannot make a reader allocate gigabytes; every frame is checked against its checksum and the trailer's counts
//! against what was read, so a damaged or cut file is refused, never half taken.
//!
//! Format version 2 writes a dead letter as `L`, with its command id; version 1 wrote `D`, without one, which a
//! reader still takes (the id is then read from the letter's payload, as the log reads its own older letters).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_schemas::Timestamp;
use redb::Database;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;

use crate::embedded::{
    CMD, CMD_BY_PARTITION, CMD_FLOOR, CMD_IDS, CMD_IDS_BY_TIME, DLQ, DLQ_BY_SOURCE, DLQ_IDS, DUPLICATE_WINDOW, EVT,
    EVT_BY_KEY, EVT_BY_PARTITION, EVT_IDS, Embedded, FILE_NAME, META,
};
use crate::{CommandRecord, DeadLetter, Error, LetterId, Log, OutcomeFilter, StoredOutcome, outcome_msg_id};

/// What the header names as the format.
pub const FORMAT: &str = "leasehold-export";
/// The format version this build writes; it reads every version up to this one. 2: dead letters carry their
/// command id (frame `L`).
pub const FORMAT_VERSION: u32 = 2;
/// The first 8 bytes of every export.
pub const MAGIC: [u8; 8] = *b"LHEXPORT";
/// The largest frame payload (a command is at most 2 MiB, an outcome part 512 KiB, a dead letter a command's bytes).
pub const MAX_FRAME: usize = 16 << 20;

/// Buffered IO both ways: a read of a million outcomes is a few thousand reads of the input, not millions.
const IO_BUFFER: usize = 256 << 10;
/// kind, length, checksum.
const FRAME_HEAD: usize = 9;
// Frame kinds are letters, so a hex dump shows what it is looking at.
const KIND_HEADER: u8 = b'H';
const KIND_COMMAND: u8 = b'C';
const KIND_OUTCOME: u8 = b'O';
/// A dead letter of format version 1, without its command id (read, no longer written).
const KIND_DEAD_LETTER_V1: u8 = b'D';
/// A dead letter with its command id.
const KIND_DEAD_LETTER: u8 = b'L';
const KIND_TRAILER: u8 = b'T';

/// How many outcomes, commands (of one partition) and dead letters a walk of the log asks for at once.
const OUTCOME_BATCH: usize = 1000;
const COMMAND_BATCH: usize = 1000;
const DEAD_LETTER_BATCH: usize = 256;
/// An import commits (and waits for the disk) every this many records or bytes, whichever comes first.
const IMPORT_BATCH: usize = 10_000;
const IMPORT_BATCH_BYTES: usize = 64 << 20;

/// What an export is: the first frame, readable as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the build that wrote it.
    pub format_version: u32,
    /// The schema version of the build that wrote it (`leasehold_schemas::SCHEMA_VERSION`).
    pub schema_version: u16,
    /// The decider version of the build that wrote it (the log crate does not know the domain: the caller says).
    pub decider_version: u32,
    pub partitions: u32,
    pub exported_at_ms: u64,
    /// The last outcome sequence the file holds (0 if none); `--to SEQ` makes it at most SEQ.
    pub to_seq: u64,
    /// Where it came from, for people (e.g. "embedded /path" or "nats://...").
    pub source: String,
}

impl Header {
    /// The header of an export written now by this build.
    pub fn new(decider_version: u32, partitions: u32, to_seq: u64, source: &str) -> Header {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        Header {
            format: FORMAT.to_owned(),
            format_version: FORMAT_VERSION,
            schema_version: leasehold_schemas::SCHEMA_VERSION,
            decider_version,
            partitions,
            exported_at_ms: u64::try_from(now).unwrap_or(u64::MAX),
            to_seq,
            source: source.to_owned(),
        }
    }
}

/// One record of the log, in the order a reader needs: every command comes before the first outcome that answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Command { partition: u32, record: CommandRecord },
    Outcome(StoredOutcome),
    DeadLetter { seq: u64, letter: DeadLetter },
}

/// The last frame: what the file holds, so that a reader knows it has read all of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    pub commands: u64,
    pub outcomes: u64,
    pub dead_letters: u64,
    pub last_outcome_seq: u64,
}

/// A record frame's kind, for a reader that takes frames without decoding them ([`Reader::next_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Command,
    Outcome,
    DeadLetter,
}

// ---------------------------------------------------------------------------------------------------------------
// Reading the log in reader order.

/// Every entry of `log` in reader order, outcomes up to `to` (all when None), then (without `to`) the commands not
/// answered yet. Reads in batches.
///
/// Order: outcomes in sequence; before an outcome of partition `p` answering command `c`, every command of `p` up
/// to `c` not yielded yet (commands no outcome answers too: duplicates, heartbeats that changed nothing). Dead letters
/// come in their own sequence, each once the walk has passed the command it names, so always after that command;
/// one waiting for its partition's next outcome holds back the ones after it (they are rare, and their order is
/// kept). With `to`, a partition's commands stop at the last one its outcomes up to `to` answer, and so do its dead
/// letters: the export is what the log was when outcome `to` landed, as nearly as the log can say.
///
/// The end is fixed when the walk starts (the last outcome then, the last command then), so the walk of a live log
/// is one consistent cut: whatever lands meanwhile is left out.
pub fn entries<L: Log>(log: L, to: Option<u64>) -> BoxStream<'static, Result<Entry, Error>> {
    walk(log, to, None)
}

/// Where a walk of the log ends, fixed when it starts.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// The last outcome it holds.
    outcomes_to: u64,
    /// The last command it may hold: commands published after the walk started are left out (no outcome it holds
    /// answers them).
    commands_to: u64,
    /// Every command up to `commands_to` (no `to`), or only those the outcomes reach.
    all_commands: bool,
}

impl Bounds {
    async fn of<L: Log>(log: &L, to: Option<u64>) -> Result<Bounds, Error> {
        let mut last_outcome = 0;
        for partition in 0..log.partitions() {
            last_outcome = last_outcome.max(log.last_outcome_seq(partition).await?);
        }
        // Read after the outcomes' end: every command an outcome up to there answers was published before it.
        let commands_to = log.last_command_seq().await?;
        Ok(Bounds {
            outcomes_to: to.map_or(last_outcome, |to| to.min(last_outcome)),
            commands_to,
            all_commands: to.is_none(),
        })
    }
}

/// One partition's commands during a walk.
#[derive(Debug, Default)]
struct Commands {
    /// The walk has passed every command of the partition up to here (yielded it, or the log no longer holds it).
    passed: u64,
    /// Read from the log and not yielded yet.
    ahead: VecDeque<CommandRecord>,
    /// Where the next read starts after.
    read_after: u64,
    /// The log holds no more of the partition's commands within the bounds.
    read_all: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Outcomes,
    /// The commands no outcome answers yet, partition by partition (no `to` only).
    Rest {
        partition: u32,
    },
    Done,
}

struct Walk<L> {
    log: L,
    to: Option<u64>,
    bounds: Option<Bounds>,
    phase: Phase,
    next_outcome: u64,
    commands: Vec<Commands>,
    dead: VecDeque<(u64, DeadLetter)>,
    next_dead: u64,
    dead_read_all: bool,
    /// Entries found and not yielded yet.
    out: VecDeque<Entry>,
}

fn walk<L: Log>(log: L, to: Option<u64>, bounds: Option<Bounds>) -> BoxStream<'static, Result<Entry, Error>> {
    let commands = (0..log.partitions()).map(|_| Commands::default()).collect();
    let walk = Walk {
        log,
        to,
        bounds,
        phase: Phase::Outcomes,
        next_outcome: 1,
        commands,
        dead: VecDeque::new(),
        next_dead: 1,
        dead_read_all: false,
        out: VecDeque::new(),
    };
    futures::stream::unfold(Some(walk), |walk| async move {
        let mut walk = walk?;
        loop {
            if let Some(entry) = walk.out.pop_front() {
                return Some((Ok(entry), Some(walk)));
            }
            if walk.phase == Phase::Done {
                return None;
            }
            if let Err(e) = walk.step().await {
                return Some((Err(e), None));
            }
        }
    })
    .boxed()
}

impl<L: Log> Walk<L> {
    /// Finds the next few entries: one batch of outcomes with the commands they need, or one batch of commands no
    /// outcome answers yet.
    async fn step(&mut self) -> Result<(), Error> {
        let bounds = match self.bounds {
            Some(bounds) => bounds,
            None => *self.bounds.insert(Bounds::of(&self.log, self.to).await?),
        };
        match self.phase {
            Phase::Outcomes => {
                let batch = if self.next_outcome > bounds.outcomes_to {
                    Vec::new()
                } else {
                    self.log.read_outcomes(&OutcomeFilter::All, self.next_outcome, OUTCOME_BATCH).await?
                };
                let mut ended = batch.is_empty();
                for outcome in batch {
                    if outcome.seq > bounds.outcomes_to {
                        ended = true;
                        break;
                    }
                    self.next_outcome = outcome.seq + 1;
                    self.pass_commands(outcome.partition, outcome.cmd_seq, bounds, outcome.seq).await?;
                    self.dead_letters(false).await?;
                    self.out.push_back(Entry::Outcome(outcome));
                }
                if ended || self.next_outcome > bounds.outcomes_to {
                    if bounds.all_commands {
                        self.phase = Phase::Rest { partition: 0 };
                    } else {
                        self.dead_letters(true).await?;
                        self.phase = Phase::Done;
                    }
                }
            }
            Phase::Rest { partition } => {
                let Some(commands) = self.commands.get_mut(partition as usize) else {
                    // Every command up to the end has been passed, whether the log still holds it or not.
                    for commands in &mut self.commands {
                        commands.passed = commands.passed.max(bounds.commands_to);
                    }
                    self.dead_letters(true).await?;
                    self.phase = Phase::Done;
                    return Ok(());
                };
                if commands.ahead.is_empty() && !commands.read_all {
                    read_ahead(&self.log, commands, partition, bounds.commands_to).await?;
                }
                if commands.ahead.is_empty() {
                    commands.passed = commands.passed.max(bounds.commands_to);
                    self.phase = Phase::Rest { partition: partition + 1 };
                } else {
                    for record in commands.ahead.drain(..) {
                        commands.passed = record.seq;
                        self.out.push_back(Entry::Command { partition, record });
                    }
                }
                self.dead_letters(false).await?;
            }
            Phase::Done => {}
        }
        Ok(())
    }

    /// Yields every command of `partition` up to `upto` not yielded yet (for the outcome at `seq`).
    async fn pass_commands(&mut self, partition: u32, upto: u64, bounds: Bounds, seq: u64) -> Result<(), Error> {
        let partitions = self.commands.len();
        let Some(commands) = self.commands.get_mut(partition as usize) else {
            return Err(Error::Refused(format!(
                "the outcome at {seq} names partition {partition}, but the log has {partitions} partitions"
            )));
        };
        let upto = upto.min(bounds.commands_to);
        loop {
            while commands.ahead.front().is_some_and(|record| record.seq <= upto) {
                let record = commands.ahead.pop_front().expect("a command ahead");
                self.out.push_back(Entry::Command { partition, record });
            }
            if !commands.ahead.is_empty() || commands.read_all || commands.read_after >= upto {
                break;
            }
            read_ahead(&self.log, commands, partition, bounds.commands_to).await?;
        }
        commands.passed = commands.passed.max(upto);
        Ok(())
    }

    /// Yields the dead letters whose commands the walk has passed, in their sequence, up to the first that waits.
    /// At the end (`last`), one whose command the export does not reach is left out.
    async fn dead_letters(&mut self, last: bool) -> Result<(), Error> {
        loop {
            if self.dead.is_empty() {
                if self.dead_read_all {
                    return Ok(());
                }
                let batch = self.log.read_dead_letters(self.next_dead, DEAD_LETTER_BATCH).await?;
                let Some((seq, _)) = batch.last() else {
                    self.dead_read_all = true;
                    return Ok(());
                };
                self.next_dead = seq + 1;
                self.dead.extend(batch);
            }
            let (_, letter) = self.dead.front().expect("a dead letter");
            let passed = self.commands.get(letter.partition as usize).map_or(u64::MAX, |c| c.passed);
            if letter.source_seq <= passed {
                let (seq, letter) = self.dead.pop_front().expect("a dead letter");
                self.out.push_back(Entry::DeadLetter { seq, letter });
            } else if last {
                self.dead.pop_front();
            } else {
                return Ok(());
            }
        }
    }
}

/// Reads the partition's next batch of commands, up to `commands_to`.
async fn read_ahead<L: Log>(log: &L, commands: &mut Commands, partition: u32, commands_to: u64) -> Result<(), Error> {
    let batch = log.read_commands(partition, commands.read_after, COMMAND_BATCH).await?;
    if batch.is_empty() {
        commands.read_all = true;
    }
    for record in batch {
        if record.seq > commands_to {
            commands.read_all = true;
            break;
        }
        commands.read_after = record.seq;
        commands.ahead.push_back(record);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Frames.

/// Bytes as one bincode byte string (the length, then the bytes), written at once rather than `u8` by `u8`, and
/// read back borrowed from the frame.
#[derive(Clone, Copy)]
struct Raw<'a>(&'a [u8]);

impl Serialize for Raw<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'a [u8]>::deserialize(deserializer).map(Raw)
    }
}

#[derive(Serialize, Deserialize)]
struct CommandFrame<'a> {
    partition: u32,
    seq: u64,
    subject: &'a str,
    time: u64,
    #[serde(borrow)]
    payload: Raw<'a>,
}

#[derive(Serialize, Deserialize)]
struct OutcomeFrame<'a> {
    seq: u64,
    partition: u32,
    key: &'a str,
    cmd_id: &'a str,
    cmd_seq: u64,
    part: u32,
    prev_seq: u64,
    #[serde(borrow)]
    payload: Raw<'a>,
}

/// A dead letter as format version 1 wrote it.
#[derive(Serialize, Deserialize)]
struct DeadLetterFrameV1<'a> {
    seq: u64,
    partition: u32,
    source_seq: u64,
    source_subject: &'a str,
    reason: &'a str,
    #[serde(borrow)]
    payload: Raw<'a>,
}

#[derive(Serialize, Deserialize)]
struct DeadLetterFrame<'a> {
    seq: u64,
    partition: u32,
    source_seq: u64,
    source_subject: &'a str,
    reason: &'a str,
    /// The command id and whether the payload names it ([`crate::LetterId`]).
    command_id: Option<(&'a str, bool)>,
    #[serde(borrow)]
    payload: Raw<'a>,
}

/// The first fields of a header: enough to refuse a file of another format or a newer version before the rest,
/// which that version may have changed, is read.
#[derive(Deserialize)]
struct FormatProbe {
    format: String,
    format_version: u32,
}

/// Decodes a record frame of kind `kind` (its byte: a kind may have several layouts).
fn decode_entry(kind: u8, frame: &[u8]) -> Result<Entry, String> {
    fn decode<'a, T: Deserialize<'a>>(frame: &'a [u8], what: &str) -> Result<T, String> {
        let (value, used) = bincode::serde::borrow_decode_from_slice(frame, bincode::config::standard())
            .map_err(|e| format!("a {what} frame does not decode: {e}"))?;
        if used != frame.len() {
            return Err(format!("a {what} frame has {} bytes after its record", frame.len() - used));
        }
        Ok(value)
    }
    Ok(match kind {
        KIND_COMMAND => {
            let f: CommandFrame<'_> = decode(frame, "command")?;
            Entry::Command {
                partition: f.partition,
                record: CommandRecord {
                    seq: f.seq,
                    subject: f.subject.to_owned(),
                    time: Timestamp(f.time),
                    payload: Bytes::copy_from_slice(f.payload.0),
                },
            }
        }
        KIND_OUTCOME => {
            let f: OutcomeFrame<'_> = decode(frame, "outcome")?;
            Entry::Outcome(StoredOutcome {
                seq: f.seq,
                partition: f.partition,
                key: f.key.to_owned(),
                cmd_id: f.cmd_id.to_owned(),
                cmd_seq: f.cmd_seq,
                part: f.part,
                prev_seq: f.prev_seq,
                payload: Bytes::copy_from_slice(f.payload.0),
            })
        }
        KIND_DEAD_LETTER => {
            let f: DeadLetterFrame<'_> = decode(frame, "dead letter")?;
            Entry::DeadLetter {
                seq: f.seq,
                letter: DeadLetter {
                    partition: f.partition,
                    source_seq: f.source_seq,
                    source_subject: f.source_subject.to_owned(),
                    reason: f.reason.to_owned(),
                    payload: Bytes::copy_from_slice(f.payload.0),
                    command_id: f.command_id.map(|(id, verified)| LetterId { id: id.to_owned(), verified }),
                },
            }
        }
        KIND_DEAD_LETTER_V1 => {
            let f: DeadLetterFrameV1<'_> = decode(frame, "dead letter")?;
            Entry::DeadLetter {
                seq: f.seq,
                letter: DeadLetter {
                    partition: f.partition,
                    source_seq: f.source_seq,
                    source_subject: f.source_subject.to_owned(),
                    reason: f.reason.to_owned(),
                    payload: Bytes::copy_from_slice(f.payload.0),
                    command_id: LetterId::read_from(f.payload.0),
                },
            }
        }
        other => return Err(format!("a frame of unknown kind {other:#04x}")),
    })
}

/// What a stream of entries has held so far, and the rules each next one keeps: outcomes strictly in sequence and
/// within the header's end, each partition's commands strictly in sequence, dead letters strictly in sequence, only
/// partitions the header names. The writer keeps them too, so that a file it finishes is one a reader takes.
#[derive(Debug)]
struct Tally {
    partitions: u32,
    to_seq: u64,
    counts: Trailer,
    /// How many outcomes were decoded (and their sequences checked), not only counted.
    outcomes_checked: u64,
    last_command: HashMap<u32, u64>,
    last_dead_letter: u64,
}

impl Tally {
    fn new(header: &Header) -> Tally {
        Tally::of(header.partitions, header.to_seq)
    }

    fn of(partitions: u32, to_seq: u64) -> Tally {
        Tally {
            partitions,
            to_seq,
            counts: Trailer::default(),
            outcomes_checked: 0,
            last_command: HashMap::new(),
            last_dead_letter: 0,
        }
    }

    fn count(&mut self, kind: FrameKind) {
        match kind {
            FrameKind::Command => self.counts.commands += 1,
            FrameKind::Outcome => self.counts.outcomes += 1,
            FrameKind::DeadLetter => self.counts.dead_letters += 1,
        }
    }

    fn check(&mut self, entry: &Entry) -> Result<(), String> {
        let partitions = self.partitions;
        let known = |partition: u32, what: &str| {
            if partition < partitions {
                Ok(())
            } else {
                Err(format!("{what} is of partition {partition}, but the header names {partitions} partitions"))
            }
        };
        match entry {
            Entry::Command { partition, record } => {
                known(*partition, &format!("command {}", record.seq))?;
                let last = self.last_command.entry(*partition).or_default();
                if record.seq <= *last {
                    return Err(format!(
                        "command {} of partition {partition} comes after command {last}: a partition's commands are \
                         in sequence",
                        record.seq
                    ));
                }
                *last = record.seq;
            }
            Entry::Outcome(outcome) => {
                known(outcome.partition, &format!("outcome {}", outcome.seq))?;
                if outcome.seq <= self.counts.last_outcome_seq {
                    return Err(format!(
                        "outcome {} comes after outcome {}: outcomes are in sequence",
                        outcome.seq, self.counts.last_outcome_seq
                    ));
                }
                if outcome.seq > self.to_seq {
                    return Err(format!("outcome {} is past the header's end, {}", outcome.seq, self.to_seq));
                }
                self.counts.last_outcome_seq = outcome.seq;
                self.outcomes_checked += 1;
            }
            Entry::DeadLetter { seq, .. } => {
                if *seq <= self.last_dead_letter {
                    return Err(format!(
                        "dead letter {seq} comes after dead letter {}: dead letters are in sequence",
                        self.last_dead_letter
                    ));
                }
                self.last_dead_letter = *seq;
            }
        }
        Ok(())
    }

    /// The trailer says what was read. Its last outcome sequence is checked where the outcomes were decoded.
    fn check_trailer(&self, trailer: &Trailer) -> Result<(), String> {
        let read = self.counts;
        let same_last = self.outcomes_checked != read.outcomes || trailer.last_outcome_seq == read.last_outcome_seq;
        if (trailer.commands, trailer.outcomes, trailer.dead_letters)
            != (read.commands, read.outcomes, read.dead_letters)
            || !same_last
        {
            return Err(format!(
                "the trailer says {} commands, {} outcomes (the last at {}) and {} dead letters, but the file holds \
                 {} commands, {} outcomes (the last at {}) and {} dead letters",
                trailer.commands,
                trailer.outcomes,
                trailer.last_outcome_seq,
                trailer.dead_letters,
                read.commands,
                read.outcomes,
                read.last_outcome_seq,
                read.dead_letters
            ));
        }
        Ok(())
    }
}

/// Writes an export: magic and header at once, then one frame per entry, then the trailer.
///
/// To make the file durable, hand it `&mut file` and sync the file after [`Writer::finish`].
pub struct Writer<W> {
    out: BufWriter<W>,
    /// The frame being written, head first; reused from frame to frame.
    frame: Vec<u8>,
    tally: Tally,
}

impl<W> fmt::Debug for Writer<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer").field("written", &self.tally.counts).finish_non_exhaustive()
    }
}

fn write_failed(e: std::io::Error) -> Error {
    Error::Storage(format!("cannot write the export: {e}"))
}

impl<W: AsyncWrite + Unpin + Send> Writer<W> {
    /// Writes the magic and the header frame.
    pub async fn new(out: W, header: &Header) -> Result<Self, Error> {
        let mut writer =
            Writer { out: BufWriter::with_capacity(IO_BUFFER, out), frame: Vec::new(), tally: Tally::new(header) };
        writer.out.write_all(&MAGIC).await.map_err(write_failed)?;
        writer.begin_frame();
        serde_json::to_writer(&mut writer.frame, header).map_err(|e| Error::Refused(e.to_string()))?;
        writer.end_frame(KIND_HEADER).await?;
        Ok(writer)
    }

    /// Writes one entry. What a reader would refuse is refused here, so that the file stays one a reader takes: an
    /// outcome not after the one before or past the header's `to_seq`, a command not after its partition's one
    /// before, a dead letter not after the one before, a partition the header does not name.
    pub async fn write(&mut self, entry: &Entry) -> Result<(), Error> {
        self.tally.check(entry).map_err(|what| Error::Refused(format!("cannot export this entry: {what}")))?;
        self.begin_frame();
        let config = bincode::config::standard();
        let (kind, encoded) = match entry {
            Entry::Command { partition, record } => {
                let frame = CommandFrame {
                    partition: *partition,
                    seq: record.seq,
                    subject: &record.subject,
                    time: record.time.0,
                    payload: Raw(&record.payload),
                };
                (FrameKind::Command, bincode::serde::encode_into_std_write(frame, &mut self.frame, config))
            }
            Entry::Outcome(outcome) => {
                let frame = OutcomeFrame {
                    seq: outcome.seq,
                    partition: outcome.partition,
                    key: &outcome.key,
                    cmd_id: &outcome.cmd_id,
                    cmd_seq: outcome.cmd_seq,
                    part: outcome.part,
                    prev_seq: outcome.prev_seq,
                    payload: Raw(&outcome.payload),
                };
                (FrameKind::Outcome, bincode::serde::encode_into_std_write(frame, &mut self.frame, config))
            }
            Entry::DeadLetter { seq, letter } => {
                let frame = DeadLetterFrame {
                    seq: *seq,
                    partition: letter.partition,
                    source_seq: letter.source_seq,
                    source_subject: &letter.source_subject,
                    reason: &letter.reason,
                    command_id: letter.command_id.as_ref().map(|id| (id.id.as_str(), id.verified)),
                    payload: Raw(&letter.payload),
                };
                (FrameKind::DeadLetter, bincode::serde::encode_into_std_write(frame, &mut self.frame, config))
            }
        };
        encoded.map_err(|e| Error::Refused(format!("cannot encode {entry:?}: {e}")))?;
        self.end_frame(match kind {
            FrameKind::Command => KIND_COMMAND,
            FrameKind::Outcome => KIND_OUTCOME,
            FrameKind::DeadLetter => KIND_DEAD_LETTER,
        })
        .await?;
        self.tally.count(kind);
        Ok(())
    }

    /// Writes the trailer frame, flushes and shuts the output down. Answers what the file holds.
    pub async fn finish(mut self) -> Result<Trailer, Error> {
        let trailer = self.tally.counts;
        self.begin_frame();
        serde_json::to_writer(&mut self.frame, &trailer).map_err(|e| Error::Refused(e.to_string()))?;
        self.end_frame(KIND_TRAILER).await?;
        self.out.shutdown().await.map_err(write_failed)?;
        Ok(trailer)
    }

    fn begin_frame(&mut self) {
        self.frame.clear();
        self.frame.extend_from_slice(&[0; FRAME_HEAD]);
    }

    async fn end_frame(&mut self, kind: u8) -> Result<(), Error> {
        let len = self.frame.len() - FRAME_HEAD;
        if len > MAX_FRAME {
            return Err(Error::Refused(format!("a record of {len} bytes is over an export's limit of {MAX_FRAME}")));
        }
        self.frame[0] = kind;
        self.frame[1..5].copy_from_slice(&(len as u32).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&self.frame[..5]);
        crc.update(&self.frame[FRAME_HEAD..]);
        self.frame[5..9].copy_from_slice(&crc.finalize().to_le_bytes());
        self.out.write_all(&self.frame).await.map_err(write_failed)
    }
}

/// Reads an export, checking every frame's checksum, the order of the records and, at the end, the trailer's
/// counts: a damaged or cut file is an error naming the byte it is at, never a shorter log.
pub struct Reader<R> {
    input: BufReader<R>,
    /// The payload of the frame just read; reused from frame to frame.
    frame: Vec<u8>,
    /// The kind byte of the frame just read.
    kind: u8,
    offset: u64,
    tally: Tally,
    trailer: Option<Trailer>,
}

impl<R> fmt::Debug for Reader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").field("offset", &self.offset).field("read", &self.tally.counts).finish_non_exhaustive()
    }
}

fn damaged(offset: u64, what: impl fmt::Display) -> Error {
    Error::Refused(format!(
        "the export is damaged at byte {offset}: {what}; it cannot be used (copy or export it again)"
    ))
}

/// Reads until `buf` is full or the input ends; answers how much was read.
async fn read_full<R: AsyncRead + Unpin>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

impl<R: AsyncRead + Unpin + Send> Reader<R> {
    /// Reads the magic and the header. Refuses what is not an export, another format, and a format version newer
    /// than this build reads.
    pub async fn open(input: R) -> Result<(Self, Header), Error> {
        let mut input = BufReader::with_capacity(IO_BUFFER, input);
        let mut magic = [0; MAGIC.len()];
        let got = read_full(&mut input, &mut magic).await.map_err(|e| read_failed(0, e))?;
        if got < magic.len() || magic != MAGIC {
            return Err(Error::Refused("this is not a leasehold export: it does not start with LHEXPORT".to_owned()));
        }
        let mut reader = Reader {
            input,
            frame: Vec::new(),
            kind: 0,
            offset: MAGIC.len() as u64,
            tally: Tally::of(0, 0),
            trailer: None,
        };
        let start = reader.offset;
        if reader.read_frame().await? != KIND_HEADER {
            return Err(damaged(start, "the first frame is not the header"));
        }
        let probe: FormatProbe = serde_json::from_slice(&reader.frame)
            .map_err(|e| damaged(start, format!("the header is not JSON: {e}")))?;
        if probe.format != FORMAT {
            return Err(Error::Refused(format!(
                "this is not a leasehold export: its header names the format {:?}, not {FORMAT:?}",
                probe.format
            )));
        }
        if probe.format_version > FORMAT_VERSION {
            return Err(Error::Refused(format!(
                "this export is in format version {}, newer than the {FORMAT_VERSION} this build reads: read it with \
                 a newer leasehold",
                probe.format_version
            )));
        }
        let header: Header = serde_json::from_slice(&reader.frame)
            .map_err(|e| damaged(start, format!("the header does not decode: {e}")))?;
        if header.partitions == 0 || header.partitions > crate::MAX_PARTITIONS {
            return Err(damaged(
                start,
                format!("the header names {} partitions (a log has 1 to {})", header.partitions, crate::MAX_PARTITIONS),
            ));
        }
        reader.tally = Tally::new(&header);
        Ok((reader, header))
    }

    /// The next entry; Ok(None) once the trailer is read and its counts match what was read. EOF before the trailer,
    /// a bad checksum, a frame that does not decode, or counts that disagree: an Error naming the byte offset and
    /// what is wrong.
    pub async fn next(&mut self) -> Result<Option<Entry>, Error> {
        let start = self.offset;
        if self.next_kind().await?.is_none() {
            return Ok(None);
        }
        let entry = decode_entry(self.kind, &self.frame).map_err(|what| damaged(start, what))?;
        self.tally.check(&entry).map_err(|what| damaged(start, what))?;
        Ok(Some(entry))
    }

    /// The next record frame's kind and payload, checked against its checksum but not decoded; Ok(None) once the
    /// trailer is read and its counts match. For a benchmark of the raw read rate, and for a reader that only counts
    /// or copies: the order of the records, which needs them decoded, is not checked here.
    pub async fn next_frame(&mut self) -> Result<Option<(FrameKind, &[u8])>, Error> {
        Ok(self.next_kind().await?.map(|kind| (kind, self.frame.as_slice())))
    }

    /// The entries as a stream, which ends after the trailer, or with the first error.
    pub fn into_stream(self) -> BoxStream<'static, Result<Entry, Error>>
    where
        R: 'static,
    {
        futures::stream::unfold(Some(self), |reader| async move {
            let mut reader = reader?;
            match reader.next().await {
                Ok(Some(entry)) => Some((Ok(entry), Some(reader))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    /// How many bytes of the input have been read and checked (the magic and every whole frame so far).
    pub fn bytes_read(&self) -> u64 {
        self.offset
    }

    /// The trailer, once it has been read and checked.
    pub fn trailer(&self) -> Option<Trailer> {
        self.trailer
    }

    /// Reads the next frame into `self.frame` and counts it; at the trailer, checks the counts and that the input
    /// ends there.
    async fn next_kind(&mut self) -> Result<Option<FrameKind>, Error> {
        if self.trailer.is_some() {
            return Ok(None);
        }
        let start = self.offset;
        self.kind = self.read_frame().await?;
        let kind = match self.kind {
            KIND_COMMAND => FrameKind::Command,
            KIND_OUTCOME => FrameKind::Outcome,
            KIND_DEAD_LETTER | KIND_DEAD_LETTER_V1 => FrameKind::DeadLetter,
            KIND_TRAILER => {
                let trailer: Trailer = serde_json::from_slice(&self.frame)
                    .map_err(|e| damaged(start, format!("the trailer does not decode: {e}")))?;
                self.tally.check_trailer(&trailer).map_err(|what| damaged(start, what))?;
                let mut more = [0; 1];
                if read_full(&mut self.input, &mut more).await.map_err(|e| read_failed(self.offset, e))? != 0 {
                    return Err(damaged(self.offset, "there are bytes after the trailer"));
                }
                self.trailer = Some(trailer);
                return Ok(None);
            }
            KIND_HEADER => return Err(damaged(start, "a second header")),
            other => return Err(damaged(start, format!("a frame of unknown kind {other:#04x}"))),
        };
        self.tally.count(kind);
        Ok(Some(kind))
    }

    /// Reads one frame into `self.frame` and checks its checksum; answers its kind.
    async fn read_frame(&mut self) -> Result<u8, Error> {
        let start = self.offset;
        let mut head = [0; FRAME_HEAD];
        match read_full(&mut self.input, &mut head).await.map_err(|e| read_failed(start, e))? {
            FRAME_HEAD => {}
            0 => return Err(damaged(start, "the file ends before its trailer (it was cut short)")),
            _ => return Err(damaged(start, "the file ends inside a frame (it was cut short)")),
        }
        let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes"));
        if len > MAX_FRAME {
            return Err(damaged(start, format!("a frame of {len} bytes, over the limit of {MAX_FRAME}")));
        }
        self.frame.clear();
        self.frame.resize(len, 0);
        let got = read_full(&mut self.input, &mut self.frame).await.map_err(|e| read_failed(start, e))?;
        if got < len {
            return Err(damaged(start, format!("the file ends inside a frame of {len} bytes (it was cut short)")));
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head[..5]);
        hasher.update(&self.frame);
        if hasher.finalize() != crc {
            return Err(damaged(start, "a frame's checksum does not match its bytes"));
        }
        self.offset += (FRAME_HEAD + len) as u64;
        Ok(head[0])
    }
}

fn read_failed(offset: u64, e: std::io::Error) -> Error {
    Error::Storage(format!("cannot read the export at byte {offset}: {e}"))
}

/// Writes `log` to `out` (header made from `log.partitions()`, `decider_version`, `source`, now); `progress` is
/// called with each outcome seq written.
pub async fn export<L: Log, W>(
    log: &L,
    to: Option<u64>,
    decider_version: u32,
    source: &str,
    out: W,
    mut progress: impl FnMut(u64),
) -> Result<Trailer, Error>
where
    W: AsyncWrite + Unpin + Send,
{
    let bounds = Bounds::of(log, to).await?;
    let header = Header::new(decider_version, log.partitions(), bounds.outcomes_to, source);
    let mut writer = Writer::new(out, &header).await?;
    let mut entries = walk(log.clone(), to, Some(bounds));
    while let Some(entry) = entries.next().await {
        let entry = entry?;
        writer.write(&entry).await?;
        if let Entry::Outcome(outcome) = &entry {
            progress(outcome.seq);
        }
    }
    writer.finish().await
}

// ---------------------------------------------------------------------------------------------------------------
// Import.

/// Reads a whole export and restores it into a new embedded data directory `dir`: `Embedded::open(dir,
/// header.partitions)` then holds every command, outcome and dead letter at its original sequence, with its original
/// subject, log time, fields and payload, and a writer going on with it gets the next sequences. Returns the header
/// and trailer.
///
/// `dir` must not exist (an existing one, even empty, is refused); its parent must exist. The rows are written
/// into a temporary directory beside `dir`, which takes `dir`'s place only once the whole file has been read and
/// checked: a damaged or cut file, or any failure, leaves nothing behind.
///
/// The duplicate window is restored as publishing left it: the command ids (read from each command's envelope) of
/// the commands published within [`DUPLICATE_WINDOW`] of the last one, so that a producer retrying a command the
/// export holds is told it is a duplicate, as the source log would have told it. A command whose payload does not
/// decode has no id to remember (the writer dead-letters it anyway). Snapshots are not exported (a cache): a writer
/// on the imported log loads from the outcomes.
pub async fn import<R>(input: R, dir: &Path) -> Result<(Header, Trailer), Error>
where
    R: AsyncRead + Unpin + Send,
{
    let (parent, name) = new_data_dir(dir)?;
    let (mut reader, header) = Reader::open(input).await?;
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{}.import-", name.to_string_lossy()))
        .tempdir_in(&parent)
        .map_err(|e| Error::Storage(format!("cannot make a temporary directory in {}: {e}", parent.display())))?;
    // The embedded log makes its tables and records its format and partition count, as for any new log.
    drop(Embedded::open(staging.path(), header.partitions)?);
    let path = staging.path().join(FILE_NAME);
    let db = Database::open(&path).map_err(|e| Error::Storage(format!("cannot open {}: {e}", path.display())))?;

    // redb is synchronous: one thread owns the write transactions while this task reads and checks the file.
    let (batches, to_write) = mpsc::channel::<Vec<Entry>>(2);
    let rows = tokio::task::spawn_blocking(move || write_rows(db, to_write));
    let read = async {
        let mut batch = Vec::with_capacity(IMPORT_BATCH);
        let mut bytes = 0;
        while let Some(entry) = reader.next().await? {
            bytes += entry_bytes(&entry);
            batch.push(entry);
            if batch.len() >= IMPORT_BATCH || bytes >= IMPORT_BATCH_BYTES {
                bytes = 0;
                if batches.send(std::mem::take(&mut batch)).await.is_err() {
                    // The writer stopped: its error says why.
                    return Ok(None);
                }
            }
        }
        if !batch.is_empty() && batches.send(batch).await.is_err() {
            return Ok(None);
        }
        Ok::<_, Error>(reader.trailer())
    }
    .await;
    drop(batches);
    let written = rows.await.map_err(|e| Error::Storage(format!("the import's writer failed: {e}")))?;
    let trailer = read?;
    written?;
    let trailer = trailer.ok_or_else(|| Error::Storage("the import's writer stopped early".to_owned()))?;

    let staged = staging.keep();
    if let Err(e) = std::fs::rename(&staged, dir) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(Error::Storage(format!("cannot move the imported log to {}: {e}", dir.display())));
    }
    // The rename is durable once the parent directory is.
    if let Err(e) = std::fs::File::open(&parent).and_then(|d| d.sync_all()) {
        tracing::warn!(dir = %parent.display(), error = %e, "cannot sync the directory of the imported log");
    }
    Ok((header, trailer))
}

/// The parent and name of a new data directory, or why `dir` cannot be one.
fn new_data_dir(dir: &Path) -> Result<(PathBuf, std::ffi::OsString), Error> {
    if dir.symlink_metadata().is_ok() {
        return Err(Error::Refused(format!(
            "{} exists: an import makes a new data directory; name one that does not exist",
            dir.display()
        )));
    }
    let Some(name) = dir.file_name() else {
        return Err(Error::Refused(format!("{} cannot be a new data directory: it names no directory", dir.display())));
    };
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Error::Refused(format!(
            "{} does not exist: create it first (an import makes only the data directory itself)",
            parent.display()
        )));
    }
    Ok((parent, name.to_owned()))
}

fn entry_bytes(entry: &Entry) -> usize {
    match entry {
        Entry::Command { record, .. } => record.subject.len() + record.payload.len(),
        Entry::Outcome(outcome) => outcome.key.len() + outcome.cmd_id.len() + outcome.payload.len(),
        Entry::DeadLetter { letter, .. } => {
            letter.source_subject.len()
                + letter.reason.len()
                + letter.payload.len()
                + letter.command_id.as_ref().map_or(0, |id| id.id.len())
        }
    }
}

fn storage(e: impl fmt::Display) -> Error {
    Error::Storage(format!("cannot write the imported log: {e}"))
}

/// Writes the batches as raw rows, one durable transaction each, filling every table and index the embedded log
/// keeps as its publishes, appends and dead letters fill them; then the duplicate window.
fn write_rows(db: Database, mut batches: mpsc::Receiver<Vec<Entry>>) -> Result<(), Error> {
    let mut recent = RecentIds::default();
    // The newest command the file holds, and the newest one its outcomes and dead letters answer: when the oldest
    // commands aged out of the source (all of a quiet partition's), the second is larger, and the log must go on
    // after it (a writer refuses a command log that ends below its cursor).
    let (mut newest_command, mut newest_answered) = (0u64, 0u64);
    while let Some(batch) = batches.blocking_recv() {
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut cmd = txn.open_table(CMD).map_err(storage)?;
            let mut cmd_by_partition = txn.open_table(CMD_BY_PARTITION).map_err(storage)?;
            let mut evt = txn.open_table(EVT).map_err(storage)?;
            let mut evt_by_partition = txn.open_table(EVT_BY_PARTITION).map_err(storage)?;
            let mut evt_by_key = txn.open_table(EVT_BY_KEY).map_err(storage)?;
            let mut evt_ids = txn.open_table(EVT_IDS).map_err(storage)?;
            let mut dlq = txn.open_table(DLQ).map_err(storage)?;
            let mut dlq_by_source = txn.open_table(DLQ_BY_SOURCE).map_err(storage)?;
            let mut dlq_ids = txn.open_table(DLQ_IDS).map_err(storage)?;
            for entry in &batch {
                match entry {
                    Entry::Command { partition, record } => {
                        let row = (*partition, record.subject.as_str(), record.time.0, record.payload.as_ref());
                        if cmd.insert(record.seq, row).map_err(storage)?.is_some() {
                            // Each partition's are in sequence (the reader checks), but one sequence may not be in two.
                            return Err(Error::Refused(format!(
                                "the export holds command {} twice (in two partitions); it cannot be used",
                                record.seq
                            )));
                        }
                        cmd_by_partition.insert((*partition, record.seq), ()).map_err(storage)?;
                        recent.note(record);
                        newest_command = newest_command.max(record.seq);
                    }
                    Entry::Outcome(o) => {
                        let row = (
                            o.partition,
                            o.key.as_str(),
                            o.cmd_id.as_str(),
                            o.cmd_seq,
                            o.part,
                            o.prev_seq,
                            o.payload.as_ref(),
                        );
                        evt.insert(o.seq, row).map_err(storage)?;
                        newest_answered = newest_answered.max(o.cmd_seq);
                        evt_by_partition.insert((o.partition, o.seq), ()).map_err(storage)?;
                        evt_by_key.insert((o.partition, o.key.as_str(), o.seq), ()).map_err(storage)?;
                        evt_ids
                            .insert(outcome_msg_id(o.partition, o.cmd_seq, o.part).as_str(), o.seq)
                            .map_err(storage)?;
                    }
                    Entry::DeadLetter { seq, letter } => {
                        let row = (
                            letter.partition,
                            letter.source_seq,
                            letter.source_subject.as_str(),
                            letter.reason.as_str(),
                            letter.payload.as_ref(),
                        );
                        dlq.insert(*seq, row).map_err(storage)?;
                        newest_answered = newest_answered.max(letter.source_seq);
                        dlq_by_source.insert(letter.source_seq, *seq).map_err(storage)?;
                        if let Some(id) = &letter.command_id {
                            dlq_ids.insert(*seq, (id.id.as_str(), id.verified)).map_err(storage)?;
                        }
                    }
                }
            }
        }
        txn.commit().map_err(storage)?;
    }
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut ids = txn.open_table(CMD_IDS).map_err(storage)?;
        let mut by_time = txn.open_table(CMD_IDS_BY_TIME).map_err(storage)?;
        for ((time, seq), id) in &recent.by_time {
            ids.insert(id.as_str(), (*seq, *time)).map_err(storage)?;
            by_time.insert((*time, *seq), id.as_str()).map_err(storage)?;
        }
        if newest_answered > newest_command {
            let mut meta = txn.open_table(META).map_err(storage)?;
            meta.insert(CMD_FLOOR, newest_answered.to_le_bytes().as_slice()).map_err(storage)?;
        }
    }
    txn.commit().map_err(storage)
}

/// The command ids a publish would still find in the duplicate window after the newest command: those of the
/// commands published within the window of it. Older ones are dropped as the newest moves on, so this holds one
/// window's worth, as the embedded log's own table does.
#[derive(Debug, Default)]
struct RecentIds {
    newest: u64,
    /// (log time, sequence) -> command id
    by_time: BTreeMap<(u64, u64), String>,
}

impl RecentIds {
    fn note(&mut self, record: &CommandRecord) {
        let window = u64::try_from(DUPLICATE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let time = record.time.0;
        self.newest = self.newest.max(time);
        if time.saturating_add(window) <= self.newest {
            return;
        }
        // Producers publish a command under its command id (the gateway, agents, the sweeper, the CLI).
        let Ok(envelope) = leasehold_schemas::codec::decode_command(&record.payload) else { return };
        self.by_time.insert((time, record.seq), envelope.command_id.to_string());
        while let Some(oldest) = self.by_time.first_entry() {
            if oldest.key().0.saturating_add(window) > self.newest {
                break;
            }
            oldest.remove();
        }
    }
}
