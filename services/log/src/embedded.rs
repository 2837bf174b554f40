//! The embedded log: one redb file in a data directory, for one process. The same observable semantics as the
//! JetStream log: one sequence for all commands and one for all outcomes, the command id dedupe window, the fence
//! (checked inside the one write transaction that appends, so two appenders with one fence never both land),
//! outcome message ids, dead letters once per source sequence, log time stamped at publish and never going back.
//!
//! Ownership is a lock per partition inside the process; [`Embedded::drop_owner`] lets a simulation drop it the
//! way a pin lapses, and the old owner learns it only when it next asks for commands.
//!
//! Writes wait for the disk: on a multi-threaded runtime they run under `block_in_place`, so the thread's other
//! tasks move on meanwhile; reads, and everything on a single-threaded runtime (the deterministic simulation, with
//! paused time, where a blocking pool would let time jump), run in place.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::BoxStream;
use leasehold_schemas::Timestamp;
use leasehold_schemas::subjects::partition_of;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::watch;

use crate::{
    Appended, CommandRecord, DeadLetter, Error, LetterId, Log, OutcomeFilter, OutcomeRecord, Owner, Publish, Published,
    Snapshot, StoredOutcome, outcome_msg_id,
};

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// The META key of the command sequence the log starts after when it was imported without its oldest commands
/// (aged out of the source's retention): the next command gets a later sequence than every one the outcomes answer.
pub(crate) const CMD_FLOOR: &str = "cmd_floor";
// The record tables are the crate's, not this module's: `export::import` fills them with the rows of an export.
/// seq -> (partition, subject, log time, payload)
pub(crate) const CMD: TableDefinition<u64, (u32, &str, u64, &[u8])> = TableDefinition::new("cmd");
pub(crate) const CMD_BY_PARTITION: TableDefinition<(u32, u64), ()> = TableDefinition::new("cmd_by_partition");
/// command id -> (seq, log time), inside the duplicate window
pub(crate) const CMD_IDS: TableDefinition<&str, (u64, u64)> = TableDefinition::new("cmd_ids");
pub(crate) const CMD_IDS_BY_TIME: TableDefinition<(u64, u64), &str> = TableDefinition::new("cmd_ids_by_time");
/// An outcome: (partition, key, cmd id, cmd seq, part, prev seq, payload).
type EvtRow = (u32, &'static str, &'static str, u64, u32, u64, &'static [u8]);
/// seq -> outcome
pub(crate) const EVT: TableDefinition<u64, EvtRow> = TableDefinition::new("evt");
pub(crate) const EVT_BY_PARTITION: TableDefinition<(u32, u64), ()> = TableDefinition::new("evt_by_partition");
pub(crate) const EVT_BY_KEY: TableDefinition<(u32, &str, u64), ()> = TableDefinition::new("evt_by_key");
pub(crate) const EVT_IDS: TableDefinition<&str, u64> = TableDefinition::new("evt_ids");
/// seq -> (partition, source seq, source subject, reason, payload)
pub(crate) const DLQ: TableDefinition<u64, (u32, u64, &str, &str, &[u8])> = TableDefinition::new("dlq");
pub(crate) const DLQ_BY_SOURCE: TableDefinition<u64, u64> = TableDefinition::new("dlq_by_source");
/// seq -> (command id, verified) of a dead letter that names one (see [`crate::LetterId`]). A table of its own, so
/// that logs made before it keep their `dlq` rows as they are: a letter without a row here is read by its payload.
pub(crate) const DLQ_IDS: TableDefinition<u64, (&str, bool)> = TableDefinition::new("dlq_ids");
/// partition -> (decider version, fence, last command id, state)
const SNAPSHOTS: TableDefinition<u32, (u32, u64, &str, &[u8])> = TableDefinition::new("snapshots");

const FORMAT: &[u8] = b"leasehold-log/1";
/// The file in the data directory.
pub const FILE_NAME: &str = "log.redb";
pub use crate::DUPLICATE_WINDOW;
/// The largest command payload the log stores (NATS's `max_payload` is 1 MiB by default; what is too large for the
/// codec is stored and dead-lettered by the worker, as a larger `max_payload` would let through).
pub const MAX_PAYLOAD: usize = 2 << 20;

/// Where log time comes from.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The system clock, in Unix milliseconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        let ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
    })
}

/// A handle on the embedded log (cheap to clone).
#[derive(Clone)]
pub struct Embedded {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").field("partitions", &self.inner.partitions).finish_non_exhaustive()
    }
}

/// The redb file: open for writing (one process), or read-only (a reader such as the replay tool, which several
/// can hold at once, and none while a writer has it).
enum Db {
    Write(Database),
    Read(redb::ReadOnlyDatabase),
}

impl Db {
    fn begin_read(&self) -> Result<redb::ReadTransaction, redb::TransactionError> {
        match self {
            Db::Write(db) => db.begin_read(),
            Db::Read(db) => db.begin_read(),
        }
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, Error> {
        match self {
            Db::Write(db) => db.begin_write().map_err(storage),
            Db::Read(_) => Err(Error::Refused("this log was opened read-only: it takes no writes".to_owned())),
        }
    }
}

struct Inner {
    db: Db,
    partitions: u32,
    /// See [`CMD_FLOOR`] (0 for a log that was never imported).
    cmd_floor: u64,
    clock: Clock,
    /// The last log time given: log time never goes back.
    last_time: Mutex<u64>,
    commands: watch::Sender<u64>,
    outcomes: watch::Sender<u64>,
    /// partition -> (worker, hold number) of its owner in this process.
    owners: Mutex<BTreeMap<u32, (String, u64)>>,
    holds: Mutex<u64>,
    /// Workers of this process and when they last said they are alive.
    workers: Mutex<BTreeMap<String, tokio::time::Instant>>,
}

/// The log file of `dir`, which must exist.
fn existing_file(dir: &Path) -> Result<std::path::PathBuf, Error> {
    let path = dir.join(FILE_NAME);
    if !path.is_file() {
        return Err(Error::Refused(format!("there is no leasehold log in {} (no {FILE_NAME})", dir.display())));
    }
    Ok(path)
}

/// Why the log file `path` of `dir` does not open.
fn open_failed(dir: &Path, path: &Path, e: redb::DatabaseError) -> Error {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::Refused(format!(
            "the log in {} is in use by another process (the embedded log is one process's)",
            dir.display()
        )),
        redb::DatabaseError::RepairAborted => Error::Refused(format!(
            "{NOT_CLOSED_CLEANLY}: the log in {} needs a repair, which a read-only open may not make",
            dir.display()
        )),
        other => Error::Storage(format!("cannot open {}: {other}", path.display())),
    }
}

/// The partition count a log file recorded when it was created, if it is a leasehold log and the count is sane.
fn recorded_partitions(read: &redb::ReadTransaction, path: &Path) -> Result<u32, Error> {
    let meta = read.open_table(META).map_err(storage)?;
    let format = meta.get("format").map_err(storage)?.map(|v| v.value().to_vec());
    if format.as_deref() != Some(FORMAT) {
        return Err(Error::Refused(format!("{} is not a leasehold log", path.display())));
    }
    let partitions = meta
        .get("partitions")
        .map_err(storage)?
        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| Error::Refused(format!("{} records no partition count", path.display())))?;
    if partitions == 0 || partitions > crate::MAX_PARTITIONS {
        return Err(Error::Refused(format!("{} records {partitions} partitions: it is damaged", path.display())));
    }
    Ok(partitions)
}

/// The message id command `seq` was published under, while the duplicate window remembers it (the log keeps ids
/// for dedupe only, by the command's log time).
fn producer_msg_id(txn: &redb::WriteTransaction, seq: u64) -> Result<Option<String>, Error> {
    let cmd = txn.open_table(CMD).map_err(storage)?;
    let Some(time) = cmd.get(seq).map_err(storage)?.map(|row| row.value().2) else { return Ok(None) };
    let by_time = txn.open_table(CMD_IDS_BY_TIME).map_err(storage)?;
    Ok(by_time.get((time, seq)).map_err(storage)?.map(|id| id.value().to_owned()))
}

/// What a read-only open says of a log whose writer did not close it (it crashed): redb repairs such a file on
/// the next open for writing.
pub const NOT_CLOSED_CLEANLY: &str = "not closed cleanly";

/// How long a worker of the embedded log stays listed after it last said it is alive.
pub const WORKER_TTL: Duration = Duration::from_secs(3);

fn storage(e: impl std::fmt::Display) -> Error {
    Error::Storage(e.to_string())
}

impl Embedded {
    /// Opens (or creates) the log in `dir` with `partitions` partitions. A log created with another partition count
    /// is refused, and so is a directory another process has open.
    pub fn open(dir: &Path, partitions: u32) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Storage(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join(FILE_NAME);
        let db = Database::create(&path).map_err(|e| open_failed(dir, &path, e))?;
        Self::with_database(db, partitions, system_clock())
    }

    /// Opens the log in `dir` read-only, with the partition count it was created with: for readers such as the
    /// replay tool, which must neither create a log nor write to one. Several readers may hold it at once; none
    /// while a writer (`serve`) has it open. Refuses a directory with no log.
    pub fn open_read_only(dir: &Path) -> Result<Self, Error> {
        let path = existing_file(dir)?;
        let db = redb::ReadOnlyDatabase::open(&path).map_err(|e| open_failed(dir, &path, e))?;
        let partitions = recorded_partitions(&db.begin_read().map_err(storage)?, &path)?;
        Self::from_db(Db::Read(db), partitions, system_clock())
    }

    /// Opens the log in `dir` for writing, with the partition count it recorded (a log of unknown partition count:
    /// a copy being repaired, an import).
    pub fn open_existing(dir: &Path) -> Result<Self, Error> {
        let path = existing_file(dir)?;
        let db = Database::open(&path).map_err(|e| open_failed(dir, &path, e))?;
        let partitions = recorded_partitions(&db.begin_read().map_err(storage)?, &path)?;
        Self::with_database(db, partitions, system_clock())
    }

    /// A log in memory, with log time from `clock` (for tests and simulations).
    pub fn in_memory(partitions: u32, clock: Clock) -> Result<Self, Error> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(storage)?;
        Self::with_database(db, partitions, clock)
    }

    fn with_database(db: Database, partitions: u32, clock: Clock) -> Result<Self, Error> {
        if partitions == 0 || partitions > crate::MAX_PARTITIONS {
            return Err(Error::Refused(format!(
                "a log has between 1 and {} partitions, not {partitions}",
                crate::MAX_PARTITIONS
            )));
        }
        let txn = db.begin_write().map_err(storage)?;
        {
            let mut meta = txn.open_table(META).map_err(storage)?;
            let format = meta.get("format").map_err(storage)?.map(|v| v.value().to_vec());
            match format {
                None => {
                    meta.insert("format", FORMAT).map_err(storage)?;
                    meta.insert("partitions", partitions.to_le_bytes().as_slice()).map_err(storage)?;
                }
                Some(format) if format != FORMAT => {
                    return Err(Error::Refused(format!(
                        "this file is not a leasehold log (format {:?})",
                        String::from_utf8_lossy(&format)
                    )));
                }
                Some(_) => {
                    let recorded = meta
                        .get("partitions")
                        .map_err(storage)?
                        .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
                        .map(u32::from_le_bytes);
                    if recorded != Some(partitions) {
                        return Err(Error::Refused(format!(
                            "the log was created with {} partitions, not {partitions}: the partition count is fixed \
                             when the log is created",
                            recorded.map_or("an unknown number of".to_owned(), |p| p.to_string())
                        )));
                    }
                }
            }
            // Every table exists from the start, so readers never meet a missing one.
            txn.open_table(CMD).map_err(storage)?;
            txn.open_table(CMD_BY_PARTITION).map_err(storage)?;
            txn.open_table(CMD_IDS).map_err(storage)?;
            txn.open_table(CMD_IDS_BY_TIME).map_err(storage)?;
            txn.open_table(EVT).map_err(storage)?;
            txn.open_table(EVT_BY_PARTITION).map_err(storage)?;
            txn.open_table(EVT_BY_KEY).map_err(storage)?;
            txn.open_table(EVT_IDS).map_err(storage)?;
            txn.open_table(DLQ).map_err(storage)?;
            txn.open_table(DLQ_BY_SOURCE).map_err(storage)?;
            txn.open_table(DLQ_IDS).map_err(storage)?;
            txn.open_table(SNAPSHOTS).map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Self::from_db(Db::Write(db), partitions, clock)
    }

    fn from_db(db: Db, partitions: u32, clock: Clock) -> Result<Self, Error> {
        let (last_cmd, last_evt, last_time, cmd_floor) = {
            let read = db.begin_read().map_err(storage)?;
            let meta = read.open_table(META).map_err(storage)?;
            let cmd_floor = meta
                .get(CMD_FLOOR)
                .map_err(storage)?
                .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
                .map_or(0, u64::from_le_bytes);
            let cmd = read.open_table(CMD).map_err(storage)?;
            let last_cmd = cmd.last().map_err(storage)?.map(|(k, v)| (k.value(), v.value().2));
            let evt = read.open_table(EVT).map_err(storage)?;
            let last_evt = evt.last().map_err(storage)?.map_or(0, |(k, _)| k.value());
            (last_cmd.map_or(0, |c| c.0).max(cmd_floor), last_evt, last_cmd.map_or(0, |c| c.1), cmd_floor)
        };
        Ok(Embedded {
            inner: Arc::new(Inner {
                db,
                partitions,
                cmd_floor,
                clock,
                last_time: Mutex::new(last_time),
                commands: watch::Sender::new(last_cmd),
                outcomes: watch::Sender::new(last_evt),
                owners: Mutex::new(BTreeMap::new()),
                holds: Mutex::new(0),
                workers: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// Drops whoever owns `partition`, as a pin lapses when its client stops pulling: the owner learns it when it
    /// next asks for commands, and another worker may own the partition at once. For simulations.
    pub fn drop_owner(&self, partition: u32) {
        self.inner.owners.lock().expect("owners lock").remove(&partition);
    }

    fn next_hold(&self) -> u64 {
        let mut holds = self.inner.holds.lock().expect("holds lock");
        *holds += 1;
        *holds
    }

    fn log_time(&self) -> Timestamp {
        let now = (self.inner.clock)().0;
        let mut last = self.inner.last_time.lock().expect("time lock");
        *last = (*last).max(now);
        Timestamp(*last)
    }

    /// Where a command published on `subject` is stored (`lh.cmd.<p>.<class>.<key>.<id>`), or why it cannot be.
    fn command_home(&self, subject: &str, payload: &[u8]) -> Result<(u32, String), Error> {
        let tokens: Vec<&str> = subject.split('.').collect();
        let ["lh", "in", class, key, id] = tokens.as_slice() else {
            return Err(Error::Refused(format!(
                "no stream takes subject {subject:?} (commands go to lh.in.<class>.<key>.<id>)"
            )));
        };
        if [class, key, id].iter().any(|t| t.is_empty() || t.contains(['*', '>', ' '])) {
            return Err(Error::Refused(format!("{subject:?} is not a valid subject to publish on")));
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(Error::Refused(format!(
                "a payload of {} bytes is over the log's limit of {MAX_PAYLOAD}",
                payload.len()
            )));
        }
        let partition = partition_of(key, self.inner.partitions);
        Ok((partition, format!("lh.cmd.{partition}.{class}.{key}.{id}")))
    }

    /// Stores `commands` in one transaction (one fsync), each deduplicated by its id as if published alone in
    /// order: a command refused for its subject or size is answered so and the others are stored all the same.
    fn publish_blocking(&self, commands: &[Publish]) -> Result<Vec<Result<Published, Error>>, Error> {
        let homes: Vec<_> = commands.iter().map(|c| self.command_home(&c.subject, &c.payload)).collect();
        if homes.iter().all(Result::is_err) {
            return Ok(homes.into_iter().filter_map(Result::err).map(Err).collect());
        }
        let txn = self.inner.db.begin_write()?;
        let time = self.log_time();
        let window = u64::try_from(DUPLICATE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let mut answers = Vec::with_capacity(commands.len());
        let mut last_new = None;
        {
            let mut ids = txn.open_table(CMD_IDS).map_err(storage)?;
            let mut by_time = txn.open_table(CMD_IDS_BY_TIME).map_err(storage)?;
            let mut cmd = txn.open_table(CMD).map_err(storage)?;
            let mut by_partition = txn.open_table(CMD_BY_PARTITION).map_err(storage)?;
            // Forget ids whose window has passed (a few per publish, so the table stays the window's size).
            let horizon = time.0.saturating_sub(window);
            let old: Vec<((u64, u64), String)> = by_time
                .range((0, 0)..(horizon, 0))
                .map_err(storage)?
                .take(16 * commands.len())
                .map(|e| e.map(|(k, v)| (k.value(), v.value().to_owned())))
                .collect::<Result<_, _>>()
                .map_err(storage)?;
            for (key, id) in old {
                by_time.remove(key).map_err(storage)?;
                let first = ids.get(id.as_str()).map_err(storage)?.map(|v| v.value());
                if first == Some((key.1, key.0)) {
                    ids.remove(id.as_str()).map_err(storage)?;
                }
            }
            let mut next = cmd.last().map_err(storage)?.map_or(0, |(k, _)| k.value()).max(self.inner.cmd_floor) + 1;
            for (command, home) in commands.iter().zip(homes) {
                let (partition, stored) = match home {
                    Ok(home) => home,
                    Err(e) => {
                        answers.push(Err(e));
                        continue;
                    }
                };
                let msg_id = command.msg_id.as_str();
                let earlier = ids.get(msg_id).map_err(storage)?.map(|v| v.value());
                let answer = match earlier {
                    Some((seq, at)) if at + window > time.0 => Published { seq, duplicate: true },
                    _ => {
                        let seq = next;
                        next += 1;
                        cmd.insert(seq, (partition, stored.as_str(), time.0, command.payload.as_ref()))
                            .map_err(storage)?;
                        by_partition.insert((partition, seq), ()).map_err(storage)?;
                        ids.insert(msg_id, (seq, time.0)).map_err(storage)?;
                        by_time.insert((time.0, seq), msg_id).map_err(storage)?;
                        last_new = Some(seq);
                        Published { seq, duplicate: false }
                    }
                };
                answers.push(Ok(answer));
            }
        }
        txn.commit().map_err(storage)?;
        if let Some(seq) = last_new {
            self.inner.commands.send_replace(seq);
        }
        Ok(answers)
    }

    fn read_commands_blocking(&self, partition: u32, after: u64, max: usize) -> Result<Vec<CommandRecord>, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let index = read.open_table(CMD_BY_PARTITION).map_err(storage)?;
        let cmd = read.open_table(CMD).map_err(storage)?;
        let mut out = Vec::new();
        for entry in index.range((partition, after.saturating_add(1))..=(partition, u64::MAX)).map_err(storage)? {
            if out.len() >= max {
                break;
            }
            let seq = entry.map_err(storage)?.0.value().1;
            if let Some(record) = cmd.get(seq).map_err(storage)? {
                let (_, subject, time, payload) = record.value();
                out.push(CommandRecord {
                    seq,
                    subject: subject.to_owned(),
                    time: Timestamp(time),
                    payload: Bytes::copy_from_slice(payload),
                });
            }
        }
        Ok(out)
    }

    fn append_blocking(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Result<Appended, Error> {
        if partition >= self.inner.partitions {
            return Err(Error::Refused(format!("there is no partition {partition}")));
        }
        let txn = self.inner.db.begin_write()?;
        let landed = {
            let mut by_partition = txn.open_table(EVT_BY_PARTITION).map_err(storage)?;
            let last = by_partition
                .range((partition, 0)..=(partition, u64::MAX))
                .map_err(storage)?
                .next_back()
                .transpose()
                .map_err(storage)?
                .map_or(0, |(k, _)| k.value().1);
            // As on a single-replica stream, the fence is checked first, then the message ids.
            if last != fence {
                return Ok(Appended::Stale { last: Some(last) });
            }
            let mut ids = txn.open_table(EVT_IDS).map_err(storage)?;
            for record in records {
                let id = outcome_msg_id(partition, record.cmd_seq, record.part);
                if let Some(seq) = ids.get(id.as_str()).map_err(storage)? {
                    return Ok(Appended::Unknown(format!("duplicate outcome {id}: stored at {}", seq.value())));
                }
            }
            let mut evt = txn.open_table(EVT).map_err(storage)?;
            let mut by_key = txn.open_table(EVT_BY_KEY).map_err(storage)?;
            let first = evt.last().map_err(storage)?.map_or(0, |(k, _)| k.value()) + 1;
            let mut prev = fence;
            for (i, record) in records.iter().enumerate() {
                let seq = first + i as u64;
                let value = (
                    partition,
                    record.key.as_str(),
                    record.cmd_id.as_str(),
                    record.cmd_seq,
                    record.part,
                    prev,
                    record.payload.as_ref(),
                );
                evt.insert(seq, value).map_err(storage)?;
                by_partition.insert((partition, seq), ()).map_err(storage)?;
                by_key.insert((partition, record.key.as_str(), seq), ()).map_err(storage)?;
                ids.insert(outcome_msg_id(partition, record.cmd_seq, record.part).as_str(), seq).map_err(storage)?;
                prev = seq;
            }
            (first, prev)
        };
        txn.commit().map_err(storage)?;
        self.inner.outcomes.send_replace(landed.1);
        Ok(Appended::Landed { first: landed.0, last: landed.1 })
    }

    fn read_outcomes_blocking(
        &self,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> Result<Vec<StoredOutcome>, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let evt = read.open_table(EVT).map_err(storage)?;
        let from = from.max(1);
        let seqs: Vec<u64> = match filter {
            OutcomeFilter::All => evt
                .range(from..)
                .map_err(storage)?
                .take(max)
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()
                .map_err(storage)?,
            OutcomeFilter::Partition(p) => read
                .open_table(EVT_BY_PARTITION)
                .map_err(storage)?
                .range((*p, from)..=(*p, u64::MAX))
                .map_err(storage)?
                .take(max)
                .map(|e| e.map(|(k, _)| k.value().1))
                .collect::<Result<_, _>>()
                .map_err(storage)?,
            OutcomeFilter::Key { partition, key } => read
                .open_table(EVT_BY_KEY)
                .map_err(storage)?
                .range((*partition, key.as_str(), from)..=(*partition, key.as_str(), u64::MAX))
                .map_err(storage)?
                .take(max)
                .map(|e| e.map(|(k, _)| k.value().2))
                .collect::<Result<_, _>>()
                .map_err(storage)?,
        };
        let mut out = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let Some(record) = evt.get(seq).map_err(storage)? else { continue };
            let (partition, key, cmd_id, cmd_seq, part, prev_seq, payload) = record.value();
            out.push(StoredOutcome {
                seq,
                partition,
                key: key.to_owned(),
                cmd_id: cmd_id.to_owned(),
                cmd_seq,
                part,
                prev_seq,
                payload: Bytes::copy_from_slice(payload),
            });
        }
        Ok(out)
    }

    fn last_outcome_blocking(&self, partition: u32) -> Result<u64, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let by_partition = read.open_table(EVT_BY_PARTITION).map_err(storage)?;
        let last = by_partition
            .range((partition, 0)..=(partition, u64::MAX))
            .map_err(storage)?
            .next_back()
            .transpose()
            .map_err(storage)?;
        Ok(last.map_or(0, |(k, _)| k.value().1))
    }

    fn dead_letter_blocking(&self, letter: &DeadLetter) -> Result<(), Error> {
        let txn = self.inner.db.begin_write()?;
        {
            let mut by_source = txn.open_table(DLQ_BY_SOURCE).map_err(storage)?;
            if by_source.get(letter.source_seq).map_err(storage)?.is_some() {
                return Ok(());
            }
            let letter = match letter.command_id {
                Some(_) => letter.clone(),
                None => letter.clone().with_producer_id(producer_msg_id(&txn, letter.source_seq)?.as_deref()),
            };
            let mut dlq = txn.open_table(DLQ).map_err(storage)?;
            let seq = dlq.last().map_err(storage)?.map_or(0, |(k, _)| k.value()) + 1;
            let reason = letter.header_reason();
            let value = (
                letter.partition,
                letter.source_seq,
                letter.source_subject.as_str(),
                reason.as_str(),
                letter.payload.as_ref(),
            );
            dlq.insert(seq, value).map_err(storage)?;
            by_source.insert(letter.source_seq, seq).map_err(storage)?;
            if let Some(id) = &letter.command_id {
                txn.open_table(DLQ_IDS)
                    .map_err(storage)?
                    .insert(seq, (id.id.as_str(), id.verified))
                    .map_err(storage)?;
            }
        }
        txn.commit().map_err(storage)
    }

    fn read_dead_letters_blocking(&self, from: u64, max: usize) -> Result<Vec<(u64, DeadLetter)>, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let dlq = read.open_table(DLQ).map_err(storage)?;
        // A log made before letters kept their ids, opened read-only, has no such table.
        let ids = match read.open_table(DLQ_IDS) {
            Ok(ids) => Some(ids),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(storage(e)),
        };
        let mut out = Vec::new();
        for entry in dlq.range(from.max(1)..).map_err(storage)?.take(max) {
            let (seq, value) = entry.map_err(storage)?;
            let (partition, source_seq, source_subject, reason, payload) = value.value();
            let recorded = match &ids {
                Some(ids) => ids.get(seq.value()).map_err(storage)?.map(|v| {
                    let (id, verified) = v.value();
                    LetterId { id: id.to_owned(), verified }
                }),
                None => None,
            };
            out.push((
                seq.value(),
                DeadLetter {
                    partition,
                    source_seq,
                    source_subject: source_subject.to_owned(),
                    reason: reason.to_owned(),
                    payload: Bytes::copy_from_slice(payload),
                    command_id: recorded.or_else(|| LetterId::read_from(payload)),
                },
            ));
        }
        Ok(out)
    }

    fn put_snapshot_blocking(&self, snapshot: &Snapshot) -> Result<(), Error> {
        let txn = self.inner.db.begin_write()?;
        {
            let mut table = txn.open_table(SNAPSHOTS).map_err(storage)?;
            let last = snapshot.last_command.as_deref().unwrap_or("");
            let value = (snapshot.decider_version, snapshot.fence, last, snapshot.state.as_ref());
            table.insert(snapshot.partition, value).map_err(storage)?;
        }
        txn.commit().map_err(storage)
    }

    fn latest_snapshot_blocking(&self, partition: u32) -> Result<Option<Snapshot>, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let table = read.open_table(SNAPSHOTS).map_err(storage)?;
        Ok(table.get(partition).map_err(storage)?.map(|value| {
            let (decider_version, fence, last, state) = value.value();
            Snapshot {
                partition,
                decider_version,
                fence,
                last_command: (!last.is_empty()).then(|| last.to_owned()),
                state: Bytes::copy_from_slice(state),
            }
        }))
    }

    fn command_at_blocking(&self, seq: u64) -> Result<Option<CommandRecord>, Error> {
        let read = self.inner.db.begin_read().map_err(storage)?;
        let cmd = read.open_table(CMD).map_err(storage)?;
        Ok(cmd.get(seq).map_err(storage)?.map(|record| {
            let (_, subject, time, payload) = record.value();
            CommandRecord {
                seq,
                subject: subject.to_owned(),
                time: Timestamp(time),
                payload: Bytes::copy_from_slice(payload),
            }
        }))
    }
}

/// Runs a write (a durable commit waits for the disk) or a read (many readers replaying a long history) where it
/// does not hold up other tasks: on a multi-threaded runtime the thread hands its other tasks over while it blocks;
/// on a single-threaded one (the simulation, with paused time) it runs in place.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread { tokio::task::block_in_place(work) } else { work() }
}

impl Log for Embedded {
    type Owner = EmbeddedOwner;

    fn partitions(&self) -> u32 {
        self.inner.partitions
    }

    async fn publish_command(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<Published, Error> {
        let command = Publish { subject: subject.to_owned(), msg_id: msg_id.to_owned(), payload };
        blocking(|| self.publish_blocking(std::slice::from_ref(&command)))?.pop().expect("one answer per command")
    }

    async fn publish_commands(&self, commands: &[Publish]) -> Vec<Result<Published, Error>> {
        if commands.is_empty() {
            return Vec::new();
        }
        match blocking(|| self.publish_blocking(commands)) {
            Ok(answers) => answers,
            Err(e) => commands.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    async fn read_commands(&self, partition: u32, after: u64, max: usize) -> Result<Vec<CommandRecord>, Error> {
        blocking(|| self.read_commands_blocking(partition, after, max))
    }

    async fn command_at(&self, seq: u64) -> Result<Option<CommandRecord>, Error> {
        blocking(|| self.command_at_blocking(seq))
    }

    async fn last_command_seq(&self) -> Result<u64, Error> {
        Ok(*self.inner.commands.borrow())
    }

    async fn append(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        if records.is_empty() {
            return Appended::Unknown("nothing to append".to_owned());
        }
        if records.len() > crate::MAX_APPEND_RECORDS {
            // As on JetStream, whose atomic batches hold at most this many.
            return Appended::TooLarge(format!(
                "an append holds at most {} records, not {}: nothing was stored",
                crate::MAX_APPEND_RECORDS,
                records.len()
            ));
        }
        blocking(|| self.append_blocking(partition, fence, records))
            .unwrap_or_else(|e| Appended::Unknown(e.to_string()))
    }

    async fn last_outcome_seq(&self, partition: u32) -> Result<u64, Error> {
        self.last_outcome_blocking(partition)
    }

    async fn read_outcomes(&self, filter: &OutcomeFilter, from: u64, max: usize) -> Result<Vec<StoredOutcome>, Error> {
        blocking(|| self.read_outcomes_blocking(filter, from, max))
    }

    fn follow(&self, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        let log = self.clone();
        let changes = self.inner.outcomes.subscribe();
        crate::follow::by_polling(filter, from, changes, move |filter, from| {
            let log = log.clone();
            async move { blocking(|| log.read_outcomes_blocking(&filter, from, 256)) }
        })
    }

    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), Error> {
        blocking(|| self.dead_letter_blocking(&letter))
    }

    async fn read_dead_letters(&self, from: u64, max: usize) -> Result<Vec<(u64, DeadLetter)>, Error> {
        blocking(|| self.read_dead_letters_blocking(from, max))
    }

    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), Error> {
        blocking(|| self.put_snapshot_blocking(&snapshot))
    }

    async fn latest_snapshot(&self, partition: u32) -> Result<Option<Snapshot>, Error> {
        blocking(|| self.latest_snapshot_blocking(partition))
    }

    async fn workers(&self, worker: &str, alive: bool) -> Result<Vec<String>, Error> {
        let now = tokio::time::Instant::now();
        let mut workers = self.inner.workers.lock().expect("workers lock");
        if alive {
            workers.insert(worker.to_owned(), now);
        } else {
            workers.remove(worker);
        }
        workers.retain(|_, seen| now.duration_since(*seen) < WORKER_TTL);
        Ok(workers.keys().cloned().collect())
    }

    fn worker_ttl(&self) -> Duration {
        WORKER_TTL
    }

    async fn is_served(&self, partition: u32) -> Result<bool, Error> {
        Ok(self.inner.owners.lock().expect("owners lock").contains_key(&partition))
    }

    async fn own(&self, partition: u32, worker: &str) -> Result<Option<EmbeddedOwner>, Error> {
        if partition >= self.inner.partitions {
            return Err(Error::Refused(format!("there is no partition {partition}")));
        }
        let hold = self.next_hold();
        let mut owners = self.inner.owners.lock().expect("owners lock");
        if owners.contains_key(&partition) {
            return Ok(None);
        }
        owners.insert(partition, (worker.to_owned(), hold));
        Ok(Some(EmbeddedOwner { log: self.clone(), partition, hold }))
    }
}

/// A hold on one partition of the embedded log. Dropping it gives the partition up, as a dead process's pin lapses.
#[derive(Debug)]
pub struct EmbeddedOwner {
    log: Embedded,
    partition: u32,
    hold: u64,
}

impl EmbeddedOwner {
    fn still_held(&self) -> Result<(), Error> {
        let owners = self.log.inner.owners.lock().expect("owners lock");
        match owners.get(&self.partition) {
            Some((_, hold)) if *hold == self.hold => Ok(()),
            _ => Err(Error::Lost(self.partition)),
        }
    }
}

impl Owner for EmbeddedOwner {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn next_commands(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        self.still_held()?;
        let mut changes = self.log.inner.commands.subscribe();
        let found = self.log.read_commands_blocking(self.partition, after, max)?;
        if !found.is_empty() {
            return Ok(found);
        }
        if tokio::time::timeout(wait, changes.changed()).await.is_err() {
            return Ok(Vec::new());
        }
        self.still_held()?;
        self.log.read_commands_blocking(self.partition, after, max)
    }

    async fn keep_alive(&mut self) -> Result<(), Error> {
        self.still_held()
    }

    async fn done_through(&mut self, _seq: u64) -> Result<(), Error> {
        // The embedded log keeps no consumer state: the cursor is in the outcomes.
        self.still_held()
    }

    async fn release(self) {
        // Drop does it.
    }
}

impl Drop for EmbeddedOwner {
    fn drop(&mut self) {
        let mut owners = self.log.inner.owners.lock().expect("owners lock");
        if owners.get(&self.partition).is_some_and(|(_, hold)| *hold == self.hold) {
            owners.remove(&self.partition);
        }
    }
}
