//! leasehold's projector: it folds outcomes into read models in redb — resources (by reference, by agent, by
//! state), leases (by id, by resource), agents, pools and who holds each identifier, every outcome by command id,
//! kept forever, and the timeline index (each resource's, lease's and pool identifier's steps, [`timeline`]) —
//! with the last applied sequence and each partition's chain position in the same write transaction, many outcomes
//! per transaction.
//!
//! It folds with the domain's own `apply` (one partition state per partition, in memory) and writes the records an
//! outcome touched, so a read model can never disagree with the writer's view. It checks every partition's
//! `Lh-Prev-Seq` chain and stops on a break; an outcome it cannot decode stops it with a clear error; it never skips
//! one. Dropped, it is rebuilt from sequence 1 to the same content ([`Projector::digests`] prints a digest per
//! table).
//!
//! Architecture invariant: only this crate owns the read-model tables.

#![forbid(unsafe_code)]

mod buffer;
pub mod timeline;
pub mod views;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use leasehold_domain::{DECIDER_VERSION, PartitionState, apply};
use leasehold_log::{CommandRecord, Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::codec;
use leasehold_schemas::ids::{Key, LeaseId, ResourceId};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{Outcome, ResourceRef};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::buffer::{AddOnly, Pending, Rows, Tab};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

pub use views::{
    AgentView, BreakerView, ClaimView, CoolingView, CordonView, DestroyBlockedView, DrainView, DriverView, HolderView,
    LeaseBrief, LeaseView, PlacementView, PolicyView, PoolView, QuarantineView, QueuePlace, QuotaView, ResourceView,
    WaitingOn, queue_places,
};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const CHAIN: TableDefinition<u32, u64> = TableDefinition::new("chain");
const RESOURCES: TableDefinition<&str, &str> = TableDefinition::new("resources");
const RESOURCES_BY_AGENT: TableDefinition<(&str, &str), ()> = TableDefinition::new("resources_by_agent");
const RESOURCES_BY_STATE: TableDefinition<(&str, &str), ()> = TableDefinition::new("resources_by_state");
const LEASES: TableDefinition<&str, &str> = TableDefinition::new("leases");
const LEASES_BY_RESOURCE: TableDefinition<(&str, &str), ()> = TableDefinition::new("leases_by_resource");
const AGENTS: TableDefinition<&str, &str> = TableDefinition::new("agents");
const POOLS: TableDefinition<&str, &str> = TableDefinition::new("pools");
const HOLDERS: TableDefinition<(&str, &str), &str> = TableDefinition::new("holders");
/// Placements by resource id, while their partition keeps them.
const PLACEMENTS: TableDefinition<&str, &str> = TableDefinition::new("placements");
/// partition -> its [`PolicyView`], once its settings were changed (a partition without a row follows the defaults).
const POLICIES: TableDefinition<u32, &str> = TableDefinition::new("policies");
/// (command id, command sequence, part) -> (outcome sequence, the outcome in JSON). The command sequence is in the
/// key: a command id a producer reused for another command in another partition (each partition remembers its own
/// ids) names two decisions, and neither may hide the other.
const OUTCOMES: TableDefinition<(&str, u64, u32), (u64, &str)> = TableDefinition::new("outcomes_by_command");
/// ("resources" | "leases", state) -> how many records are in that state (for metrics).
const COUNTS: TableDefinition<(&str, &str), u64> = TableDefinition::new("counts");
/// The timeline index: (thing key ([`timeline::Thing::key`]), outcome sequence) -> (command id, command sequence,
/// part: the outcome's key in [`OUTCOMES`]; whether the command told it, not the outcome; the indexes of the
/// outcome's effects about the thing). A thing's history reads its own rows, not the log.
const TIMELINE: TableDefinition<(&str, u64), TimelineRow> = TableDefinition::new("timeline");
/// A row of [`TIMELINE`]: (command id, command sequence, part, told by the command, effect indexes).
type TimelineRow = (&'static str, u64, u32, bool, Vec<u32>);

/// The layout of the read models. A projection of another layout (made by another build) is dropped when opened
/// and folded again from sequence 1: the log is the truth, the projection a cache of it. Layout 9 added the
/// timeline index ([`TIMELINE`]).
pub const PROJECTION_VERSION: u64 = 9;
/// The outcomes table of layout 1, keyed without the command sequence: dropped with the rest.
const OUTCOMES_V1: TableDefinition<(&str, u32), (u64, &str)> = TableDefinition::new("outcomes");

/// The file in the data directory.
pub const FILE_NAME: &str = "projection.redb";
/// The most outcomes written in one transaction.
pub const MAX_BATCH: usize = 1000;
/// The most commands read at once for the timeline (those of steps without effect).
const COMMAND_READS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Log(#[from] leasehold_log::Error),
    #[error(
        "partition {partition}: the outcome at {seq} says the one before it is at {prev_seq}, but the projection \
         last applied {expected}: the chain is broken; the projector stops"
    )]
    ChainBroken { partition: u32, seq: u64, prev_seq: u64, expected: u64 },
    #[error("the outcome at {seq} cannot be read: {detail}; the projector stops (it never skips an outcome)")]
    Undecodable { seq: u64, detail: String },
    #[error(
        "the outcome at {seq} was decided by decider version {version}, newer than this projector's {DECIDER_VERSION}"
    )]
    NewerDecider { seq: u64, version: u32 },
    #[error("the outcome at {seq} does not fold: {detail}")]
    Fold { seq: u64, detail: String },
    #[error("the projection's storage failed: {0}")]
    Storage(String),
    #[error("{0}")]
    Refused(String),
}

fn storage(e: impl std::fmt::Display) -> Error {
    Error::Storage(e.to_string())
}

/// Checks `stored` against its partition's chain (`expected_prev`, the partition's last outcome), then its decoded
/// body (`decoded`, from [`decode`]) against its headers: a broken chain is reported before a body that does not
/// read.
fn check(stored: &StoredOutcome, expected_prev: u64, decoded: Result<Outcome, Error>) -> Result<Outcome, Error> {
    if stored.prev_seq != expected_prev {
        return Err(Error::ChainBroken {
            partition: stored.partition,
            seq: stored.seq,
            prev_seq: stored.prev_seq,
            expected: expected_prev,
        });
    }
    let outcome = decoded?;
    if outcome.decider_version > DECIDER_VERSION {
        return Err(Error::NewerDecider { seq: stored.seq, version: outcome.decider_version });
    }
    if outcome.partition != stored.partition || outcome.cmd_seq != stored.cmd_seq || outcome.part != stored.part {
        return Err(Error::Undecodable { seq: stored.seq, detail: "its headers do not match its body".to_owned() });
    }
    Ok(outcome)
}

/// The partition states a fold goes on from, with each partition's last outcome (its chain) and the last outcome
/// folded: a projector's, or the share of one of a bulk rebuild's threads ([`Bulk`]).
struct FoldState<'a> {
    states: &'a mut BTreeMap<u32, PartitionState>,
    chain: &'a mut BTreeMap<u32, u64>,
    applied: &'a mut u64,
}

impl FoldState<'_> {
    /// Folds `outcomes` (in log order, with their decoded bodies) into the states and writes what each changes to
    /// `tables`, with each partition's chain position; an outcome at or before the last applied one is skipped.
    fn fold<'s>(
        &mut self,
        tables: &mut Tables<'_>,
        outcomes: impl IntoIterator<Item = (&'s StoredOutcome, Result<Outcome, Error>)>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        for (stored, decoded) in outcomes {
            if stored.seq <= *self.applied {
                continue;
            }
            let expected = self.chain.get(&stored.partition).copied().unwrap_or(0);
            let outcome = check(stored, expected, decoded)?;
            let state = self.states.get_mut(&stored.partition).ok_or_else(|| Error::Undecodable {
                seq: stored.seq,
                detail: format!("there is no partition {}", stored.partition),
            })?;
            // What the outcome touches, with the resources' states before it (to move them in the index by
            // state), from memory: the tables hold the same.
            let touched = Touched::of(state, &outcome);
            // The things it concerns, with the leases known before it: in memory while their partition keeps
            // them, then in the leases' records (a command may name a lease long gone).
            let said = match commands.get(&outcome.cmd_seq) {
                Some(command) if outcome.effects().is_empty() => {
                    Some(timeline::Said::of(&command.subject, &command.payload))
                }
                _ => None,
            };
            let concerns = timeline::concerns(&outcome, said.as_ref(), |lease| {
                state.lease(lease).map(|l| l.resource).or_else(|| tables.resource_of(&outcome.command.key, lease))
            });
            apply(state, &outcome).map_err(|e| Error::Fold { seq: stored.seq, detail: e.to_string() })?;
            let state = &*state;
            tables.write(state, &outcome, stored, &touched)?;
            tables.index(&outcome, stored.seq, &concerns)?;
            self.chain.insert(stored.partition, stored.seq);
            tables.chain.insert(stored.partition, stored.seq).map_err(storage)?;
            *self.applied = stored.seq;
        }
        Ok(())
    }
}

/// The projector: partition states in memory, read models in redb.
pub struct Projector {
    db: Arc<Database>,
    partitions: u32,
    states: BTreeMap<u32, PartitionState>,
    chain: BTreeMap<u32, u64>,
    applied: u64,
    /// The in-memory states are folded up to `applied` (after a restart, [`Projector::prepare`] does it).
    prepared: bool,
    /// Tells whoever waits for an outcome to be projected (the last applied sequence, after each commit).
    applied_tx: tokio::sync::watch::Sender<u64>,
    /// Set when a batch failed: the in-memory states may be ahead of the tables, so this projector refuses to go
    /// on (open it again: it resumes from what the tables hold).
    failed: Option<String>,
}

impl std::fmt::Debug for Projector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projector").field("applied", &self.applied).finish_non_exhaustive()
    }
}

/// `batch` decoded, with the commands of its steps without effect past `after` read from `log` (a rejection names
/// what it refused only in its command): what [`Projector::apply_batch_from`] and a bulk rebuild from a log apply.
pub async fn decode_with_commands<L: Log>(
    log: &L,
    batch: &[StoredOutcome],
    after: u64,
) -> Result<(Vec<Result<Outcome, Error>>, BTreeMap<u64, CommandRecord>), Error> {
    let decoded: Vec<Result<Outcome, Error>> = batch.iter().map(decode).collect();
    let wanted: BTreeSet<u64> = batch
        .iter()
        .zip(&decoded)
        .filter_map(|(stored, outcome)| match outcome {
            Ok(outcome) if stored.seq > after && outcome.effects().is_empty() => Some(outcome.cmd_seq),
            _ => None,
        })
        .collect();
    // A few reads at a time: on JetStream each is a round trip.
    let commands: Vec<_> =
        futures::stream::iter(wanted).map(|seq| log.command_at(seq)).buffered(COMMAND_READS).collect().await;
    let mut held = BTreeMap::new();
    for command in commands {
        if let Some(command) = command? {
            held.insert(command.seq, command);
        }
    }
    Ok((decoded, held))
}

impl Projector {
    /// Opens (or creates) the projection in `dir`.
    pub fn open(dir: &Path, partitions: u32) -> Result<Self, Error> {
        Self::open_with(dir, partitions, &redb::Builder::new())
    }

    /// [`Projector::open`], with redb's cache at most `bytes` (redb's default is 1 GiB, which a rebuild fills as the
    /// projection grows): what a bulk rebuild ([`Projector::into_bulk`]) opens, so that its memory does not grow with
    /// the log's length.
    pub fn open_with_cache(dir: &Path, partitions: u32, bytes: usize) -> Result<Self, Error> {
        Self::open_with(dir, partitions, redb::Builder::new().set_cache_size(bytes))
    }

    fn open_with(dir: &Path, partitions: u32, builder: &redb::Builder) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Storage(format!("cannot create {}: {e}", dir.display())))?;
        let db = builder.create(dir.join(FILE_NAME)).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                Error::Refused(format!("the projection in {} is in use by another process", dir.display()))
            }
            other => storage(other),
        })?;
        Self::with_database(db, partitions)
    }

    /// A projection in memory (tests, replay).
    pub fn in_memory(partitions: u32) -> Result<Self, Error> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(storage)?;
        Self::with_database(db, partitions)
    }

    fn with_database(db: Database, partitions: u32) -> Result<Self, Error> {
        let txn = db.begin_write().map_err(storage)?;
        let (applied, chain) = {
            let mut meta = txn.open_table(META).map_err(storage)?;
            let recorded = meta.get("partitions").map_err(storage)?.map(|v| v.value());
            match recorded {
                None => {
                    meta.insert("partitions", u64::from(partitions)).map_err(storage)?;
                }
                Some(recorded) if recorded != u64::from(partitions) => {
                    return Err(Error::Refused(format!(
                        "the projection was made for {recorded} partitions, not {partitions}"
                    )));
                }
                Some(_) => {}
            }
            let mut applied = meta.get("applied").map_err(storage)?.map_or(0, |v| v.value());
            let version = meta.get("version").map_err(storage)?.map(|v| v.value());
            if version != Some(PROJECTION_VERSION) {
                if applied > 0 || version.is_some() {
                    tracing::warn!(
                        found = ?version,
                        wanted = PROJECTION_VERSION,
                        "the projection was made by another build: dropping it, it is folded again from sequence 1"
                    );
                }
                drop(meta);
                drop_tables(&txn)?;
                meta = txn.open_table(META).map_err(storage)?;
                meta.insert("version", PROJECTION_VERSION).map_err(storage)?;
                applied = 0;
            }
            let chain_table = txn.open_table(CHAIN).map_err(storage)?;
            let chain = chain_table
                .iter()
                .map_err(storage)?
                .map(|e| e.map(|(k, v)| (k.value(), v.value())))
                .collect::<Result<BTreeMap<_, _>, _>>()
                .map_err(storage)?;
            (applied, chain)
        };
        create_tables(&txn)?;
        txn.commit().map_err(storage)?;
        let states = (0..partitions).map(|p| (p, PartitionState::new(p, partitions))).collect();
        let applied_tx = tokio::sync::watch::Sender::new(applied);
        let prepared = applied == 0;
        Ok(Projector { db: Arc::new(db), partitions, states, chain, applied, prepared, applied_tx, failed: None })
    }

    /// The last outcome sequence applied to the read models.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The last applied sequence, updated after each commit: wait on it for an outcome to be projected.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// A handle for queries, usable while the projector runs.
    pub fn reader(&self) -> Reader {
        Reader { db: self.db.clone() }
    }

    /// Folds the in-memory states up to what the read models already hold (after a restart): each partition from
    /// the latest writer snapshot at or before its last applied outcome, then its outcomes up to that one, with
    /// every check of a writer's load. So a restart costs what a takeover does, not a fold of the whole history.
    pub async fn prepare<L: Log>(&mut self, log: &L) -> Result<(), Error> {
        if self.prepared {
            return Ok(());
        }
        let config = leasehold_worker::WriterConfig::default();
        for partition in 0..self.partitions {
            let up_to = self.chain.get(&partition).copied().unwrap_or(0);
            if up_to == 0 {
                continue;
            }
            let folded = leasehold_worker::fold_partition_to(log, partition, up_to, &config).await.map_err(|e| {
                if e.is_transient() {
                    // The log is unreachable for now: a later try may fold it (serve reopens the projector).
                    Error::Log(leasehold_log::Error::Unavailable(format!(
                        "folding partition {partition} up to outcome {up_to}: {e}"
                    )))
                } else {
                    Error::Refused(format!(
                        "cannot fold partition {partition} up to outcome {up_to}, where the projection stopped: {e}; \
                         is this the projection of another log? Drop it and rebuild"
                    ))
                }
            })?;
            self.states.insert(partition, folded.state);
        }
        self.prepared = true;
        Ok(())
    }

    /// Applies `batch` (outcomes in log order, each after the last applied) in one write transaction, without the
    /// commands: a step without effect is indexed in no timeline ([`timeline`]). [`Projector::run`] and
    /// [`Projector::catch_up`] read those steps' commands from the log ([`Projector::apply_batch_from`]).
    pub fn apply_batch(&mut self, batch: &[StoredOutcome]) -> Result<(), Error> {
        self.apply_batch_commands(batch, &BTreeMap::new())
    }

    /// [`Projector::apply_batch`], with the commands its outcomes answer, by command sequence (as many as the
    /// caller holds: only those of steps without effect are read, [`timeline::Said`]).
    pub fn apply_batch_commands(
        &mut self,
        batch: &[StoredOutcome],
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        let decoded = batch.iter().map(decode).collect();
        self.apply_decoded(batch, decoded, commands)
    }

    /// [`Projector::apply_batch`], reading from `log` the commands of the steps without effect (a rejection names
    /// what it refused only in its command), while the log holds them.
    pub async fn apply_batch_from<L: Log>(&mut self, log: &L, batch: &[StoredOutcome]) -> Result<(), Error> {
        let (decoded, held) = decode_with_commands(log, batch, self.applied).await?;
        self.apply_decoded(batch, decoded, &held)
    }

    fn apply_decoded(
        &mut self,
        batch: &[StoredOutcome],
        decoded: Vec<Result<Outcome, Error>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        if let Some(why) = &self.failed {
            return Err(Error::Refused(format!("this projector failed earlier ({why}): open it again to resume")));
        }
        if !self.prepared {
            return Err(Error::Refused(format!(
                "the projection holds outcomes up to {}: prepare it (catch_up and run do) before applying more",
                self.applied
            )));
        }
        if batch.is_empty() {
            return Ok(());
        }
        let result = self.apply_batch_once(batch, decoded, commands);
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn apply_batch_once(
        &mut self,
        batch: &[StoredOutcome],
        decoded: Vec<Result<Outcome, Error>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        let txn = self.db.begin_write().map_err(storage)?;
        {
            let mut tables = Tables::open(&txn)?;
            self.fold_into(&mut tables, batch, decoded, commands)?;
        }
        txn.commit().map_err(storage)?;
        self.applied_tx.send_replace(self.applied);
        Ok(())
    }

    /// Folds `batch` into the states and writes what each outcome changes to `tables`, with the applied sequence.
    fn fold_into(
        &mut self,
        tables: &mut Tables<'_>,
        batch: &[StoredOutcome],
        decoded: Vec<Result<Outcome, Error>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        let mut folding = FoldState { states: &mut self.states, chain: &mut self.chain, applied: &mut self.applied };
        folding.fold(tables, batch.iter().zip(decoded), commands)?;
        tables.meta.insert("applied", self.applied).map_err(storage)?;
        Ok(())
    }

    /// Applies every outcome the log holds after the last applied one; returns the last applied sequence.
    pub async fn catch_up<L: Log>(&mut self, log: &L) -> Result<u64, Error> {
        self.prepare(log).await?;
        loop {
            let batch = log.read_outcomes(&OutcomeFilter::All, self.applied + 1, MAX_BATCH).await?;
            if batch.is_empty() {
                return Ok(self.applied);
            }
            self.apply_batch_from(log, &batch).await?;
        }
    }

    /// Follows the log and applies outcomes as they land, as many per transaction as are ready (up to
    /// [`MAX_BATCH`]), until `shutdown`.
    pub async fn run<L: Log>(&mut self, log: &L, shutdown: &CancellationToken) -> Result<(), Error> {
        self.prepare(log).await?;
        let mut follow = log.follow(OutcomeFilter::All, self.applied + 1);
        loop {
            let first = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                next = follow.next() => next,
            };
            let Some(first) = first else {
                return Err(Error::Log(leasehold_log::Error::Unavailable("the outcome feed ended".to_owned())));
            };
            let mut batch = vec![first?];
            while batch.len() < MAX_BATCH {
                match follow.next().now_or_never() {
                    Some(Some(next)) => batch.push(next?),
                    _ => break,
                }
            }
            self.apply_batch_from(log, &batch).await?;
        }
    }

    /// Drops every read model; the next catch-up or run folds the log again from sequence 1.
    pub fn drop_all(&mut self) -> Result<(), Error> {
        let txn = self.db.begin_write().map_err(storage)?;
        drop_tables(&txn)?;
        create_tables(&txn)?;
        txn.commit().map_err(storage)?;
        self.states = (0..self.partitions).map(|p| (p, PartitionState::new(p, self.partitions))).collect();
        self.chain.clear();
        self.applied = 0;
        self.prepared = true;
        self.failed = None;
        self.applied_tx.send_replace(0);
        Ok(())
    }

    /// A digest (SHA-256, hex) of each read-model table's content: a rebuild from sequence 1 gives the same ones.
    pub fn digests(&self) -> Result<BTreeMap<&'static str, String>, Error> {
        self.reader().digests()
    }

    /// The partition states as folded so far.
    pub fn states(&self) -> &BTreeMap<u32, PartitionState> {
        &self.states
    }
}

/// Outcomes a bulk rebuild folds per chunk: its writes are held in memory and written, each table as one sorted run,
/// in one durable transaction per chunk, while the next chunk is folded. About 40 MB of buffers a chunk in the
/// replay benchmark's mix (two chunks are held: the one folded and the one written).
pub const BULK_CHUNK: usize = 50_000;
/// The redb cache a bulk rebuild opens its projection with ([`Projector::open_with_cache`]).
pub const BULK_CACHE_BYTES: usize = 64 << 20;

/// A rebuild of a projection from sequence 1 in bulk ([`Projector::into_bulk`]): the same fold and the same writes
/// as [`Projector::apply_batch_commands`], so the same tables (their digests equal), but each chunk of
/// [`BULK_CHUNK`] outcomes is written at once: a record written many times within a chunk is written once, each
/// table's rows go in sorted, and there is one durable commit per chunk instead of one per [`MAX_BATCH`]. A chunk is
/// written and committed on a thread of its own while the next one is folded; the fold reads its own writes, then
/// the chunk being written, then the tables as last committed (a read transaction). The memory it holds is two
/// chunks' writes, whatever the log's length.
///
/// The partitions are folded on several threads ([`Bulk::with_threads`]; one per core by default), partition `p` by
/// thread `p % threads`, each with buffers of its own: every record of the read models but two belongs to the
/// partition of the outcome that writes it (a resource, a lease, an agent, a pool and its holders, a placement, a
/// policy, an outcome, a timeline row: the domain changes only the aggregate of an outcome's key), so the threads
/// never write nor read one another's rows. The two shared records are the applied sequence, written once per
/// chunk, and the counts by state, which the threads keep as changes and which are added up at each chunk's end:
/// each partition's share of a count is its records in that state, never below zero, so their sum is the count an
/// incremental fold reaches, and the chunk writes it for every count its outcomes touched.
///
/// Each commit leaves a projection as of the last outcome of its chunk, which a projector opened later resumes
/// from; a bulk rebuild dropped before [`Bulk::finish`] loses the chunk it was folding (dropping it waits for the
/// chunk being written to be committed).
pub struct Bulk {
    /// The projector rebuilt: its partition states and chain positions are with the threads' shares until
    /// [`Bulk::finish`] gives them back.
    projector: Projector,
    shares: Vec<Share>,
    /// The chunk being written (each share's buffers), its writer, and the outcome it ends at (announced once it is
    /// committed).
    writing: Option<(Arc<Vec<Buffers>>, Writer, u64)>,
    /// How many records of each kind are in each state, as of the last chunk handed over.
    counts: Counts,
    in_chunk: usize,
    chunk: usize,
}

/// Records in a state, by kind (`resources`, `leases`) then state: the counts, or a chunk's changes to them.
type Counts<N = u64> = BTreeMap<&'static str, BTreeMap<String, N>>;

/// The partitions one thread of a bulk rebuild folds, with their chunk's writes.
struct Share {
    states: BTreeMap<u32, PartitionState>,
    chain: BTreeMap<u32, u64>,
    /// The last outcome this share folded.
    applied: u64,
    buffers: Box<Buffers>,
    /// The chunk's changes to the counts.
    counted: Counts<i64>,
    /// The tables as last committed, before the chunk being written.
    committed: Option<redb::ReadTransaction>,
}

impl Share {
    /// Folds `outcomes` (this share's, in log order; bodies not decoded yet are decoded here), reading `previous`
    /// (this share's writes in the chunk being written) and the tables as last committed.
    fn fold(
        &mut self,
        db: &Database,
        previous: Option<&Buffers>,
        outcomes: Vec<(&StoredOutcome, Option<Result<Outcome, Error>>)>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        if self.committed.is_none() {
            self.committed = Some(db.begin_read().map_err(storage)?);
        }
        let committed = self.committed.as_ref().expect("begun above");
        let mut tables = Tables::buffered(committed, previous, &mut self.buffers, &mut self.counted)?;
        let mut folding = FoldState { states: &mut self.states, chain: &mut self.chain, applied: &mut self.applied };
        let outcomes =
            outcomes.into_iter().map(|(stored, decoded)| (stored, decoded.unwrap_or_else(|| decode(stored))));
        folding.fold(&mut tables, outcomes, commands)
    }
}

/// The thread that writes and commits a chunk of a bulk rebuild. Dropped (the rebuild dropped before it
/// finished), it waits for the thread: the thread holds the database, which could not be opened again meanwhile.
struct Writer(Option<std::thread::JoinHandle<Result<(), Error>>>);

impl Writer {
    fn join(mut self) -> Result<(), Error> {
        let thread = self.0.take().expect("joined once");
        thread.join().map_err(|_| Error::Storage("the writer of a chunk panicked".to_owned()))?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Bulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulk")
            .field("projector", &self.projector)
            .field("threads", &self.shares.len())
            .field("in_chunk", &self.in_chunk)
            .finish()
    }
}

impl Projector {
    /// Drops every read model and starts a bulk rebuild from sequence 1 ([`Bulk`]).
    pub fn into_bulk(mut self) -> Result<Bulk, Error> {
        self.drop_all()?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut bulk = Bulk {
            projector: self,
            shares: Vec::new(),
            writing: None,
            counts: Counts::new(),
            in_chunk: 0,
            chunk: BULK_CHUNK,
        };
        bulk.share(threads);
        Ok(bulk)
    }
}

impl Bulk {
    /// Commits every `outcomes` outcomes (at least one) instead of every [`BULK_CHUNK`]: tests make chunks small to
    /// have many.
    pub fn with_chunk(mut self, outcomes: usize) -> Self {
        self.chunk = outcomes.max(1);
        self
    }

    /// Folds the partitions on `threads` threads (at least one, at most one per partition) instead of one per core.
    /// Before the first outcome only: a share's chunk is not split.
    pub fn with_threads(mut self, threads: usize) -> Self {
        if self.projector.applied == 0 {
            self.share(threads);
        }
        self
    }

    /// Deals the partitions out to `threads` shares, partition `p` to share `p % threads`.
    fn share(&mut self, threads: usize) {
        let threads = threads.clamp(1, self.projector.partitions.max(1) as usize);
        for share in self.shares.drain(..) {
            self.projector.states.extend(share.states);
            self.projector.chain.extend(share.chain);
        }
        self.shares = (0..threads)
            .map(|_| Share {
                states: BTreeMap::new(),
                chain: BTreeMap::new(),
                applied: self.projector.applied,
                buffers: Box::default(),
                counted: Counts::new(),
                committed: None,
            })
            .collect();
        for (partition, state) in std::mem::take(&mut self.projector.states) {
            self.shares[partition as usize % threads].states.insert(partition, state);
        }
        for (partition, at) in std::mem::take(&mut self.projector.chain) {
            self.shares[partition as usize % threads].chain.insert(partition, at);
        }
    }

    /// Folds `batch` (outcomes in log order, each after the last applied), with `decoded` its bodies ([`decode`],
    /// which callers may run on other threads) and the commands its outcomes answer, as
    /// [`Projector::apply_batch_commands`] does; hands the chunk to its writer when it is full.
    pub fn apply(
        &mut self,
        batch: &[StoredOutcome],
        decoded: Vec<Result<Outcome, Error>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        self.apply_some(batch, decoded.into_iter().map(Some).collect(), commands)
    }

    /// [`Bulk::apply`], each body decoded by the thread that folds its partition.
    pub fn apply_encoded(
        &mut self,
        batch: &[StoredOutcome],
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        self.apply_some(batch, batch.iter().map(|_| None).collect(), commands)
    }

    fn apply_some(
        &mut self,
        batch: &[StoredOutcome],
        decoded: Vec<Option<Result<Outcome, Error>>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        if let Some(why) = &self.projector.failed {
            return Err(Error::Refused(format!("this projector failed earlier ({why}): open it again to resume")));
        }
        let result = self.apply_once(batch, decoded, commands);
        if let Err(e) = &result {
            self.projector.failed = Some(e.to_string());
        }
        result
    }

    fn apply_once(
        &mut self,
        batch: &[StoredOutcome],
        decoded: Vec<Option<Result<Outcome, Error>>>,
        commands: &BTreeMap<u64, CommandRecord>,
    ) -> Result<(), Error> {
        let threads = self.shares.len();
        let mut outcomes: Vec<Vec<_>> = (0..threads).map(|_| Vec::with_capacity(batch.len() / threads + 1)).collect();
        for (stored, decoded) in batch.iter().zip(decoded) {
            outcomes[stored.partition as usize % threads].push((stored, decoded));
        }
        let db = self.projector.db.as_ref();
        let previous = self.writing.as_ref().map(|(chunk, _, _)| chunk.as_slice());
        let work: Vec<_> =
            self.shares.iter_mut().zip(outcomes).enumerate().filter(|(_, (_, o))| !o.is_empty()).collect();
        let fold = |(i, (share, outcomes)): (usize, (&mut Share, Vec<_>))| {
            share.fold(db, previous.map(|chunk| &chunk[i]), outcomes, commands)
        };
        // Every share but the first on a thread of its own, the first on this one; the first failure in share order.
        let results: Vec<Result<(), Error>> = std::thread::scope(|scope| {
            let mut work = work.into_iter();
            let here = work.next();
            let others: Vec<_> = work.map(|w| scope.spawn(move || fold(w))).collect();
            let mut results = vec![here.map_or(Ok(()), fold)];
            for other in others {
                results.push(other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            }
            results
        });
        results.into_iter().collect::<Result<(), Error>>()?;
        self.projector.applied = self.shares.iter().map(|share| share.applied).max().unwrap_or(0);
        self.in_chunk += batch.len();
        if self.in_chunk >= self.chunk {
            self.hand_over()?;
        }
        Ok(())
    }

    /// Waits for the chunk being written to be committed, and announces the outcome it ends at (not the one folded
    /// since: its tables do not hold that yet); answers its buffers, emptied, to hold a next chunk at the size they
    /// grew to.
    fn wait(&mut self) -> Result<Option<Vec<Buffers>>, Error> {
        let Some((chunk, writer, ends_at)) = self.writing.take() else { return Ok(None) };
        writer.join()?;
        self.projector.applied_tx.send_replace(ends_at);
        Ok(Arc::try_unwrap(chunk).ok().map(|mut chunk| {
            chunk.iter_mut().for_each(Buffers::clear);
            chunk
        }))
    }

    /// Ends the chunk folded: the counts its outcomes changed and the applied sequence go into its writes (the
    /// first share's buffers); answers its buffers, each share given `emptied` ones (or new ones) for the next.
    fn end_chunk(&mut self, emptied: Option<Vec<Buffers>>) -> Vec<Buffers> {
        let mut emptied = emptied.into_iter().flatten();
        let mut chunk: Vec<Buffers> = self
            .shares
            .iter_mut()
            .map(|share| {
                share.committed = None;
                let next = emptied.next().map(Box::new).unwrap_or_default();
                *std::mem::replace(&mut share.buffers, next)
            })
            .collect();
        let first = &mut chunk[0];
        for share in &mut self.shares {
            for (what, changes) in std::mem::take(&mut share.counted) {
                for (state, change) in changes {
                    let total = self.counts.entry(what).or_default().entry(state.clone()).or_default();
                    *total = total.saturating_add_signed(change);
                    buffer::put::<(&str, &str), u64>(&mut first.counts, (what, state.as_str()), *total);
                }
            }
        }
        buffer::put::<&str, u64>(&mut first.meta, "applied", self.projector.applied);
        chunk
    }

    /// Hands the chunk folded to a writer of its own (once the one before is committed) and starts the next.
    fn hand_over(&mut self) -> Result<(), Error> {
        let emptied = self.wait()?;
        // The next chunk reads what is committed now, and the chunk handed over until it is.
        let chunk = Arc::new(self.end_chunk(emptied));
        let (db, written) = (self.projector.db.clone(), chunk.clone());
        let writer = std::thread::Builder::new()
            .name("projection-writer".to_owned())
            .spawn(move || write_chunk(&db, &written))
            .map_err(storage)?;
        self.writing = Some((chunk, Writer(Some(writer)), self.projector.applied));
        self.in_chunk = 0;
        Ok(())
    }

    /// The last outcome sequence folded (written once its chunk is committed).
    pub fn applied(&self) -> u64 {
        self.projector.applied
    }

    /// Commits the last chunks; answers the projector, to follow the log from there.
    pub fn finish(mut self) -> Result<Projector, Error> {
        if let Some(why) = &self.projector.failed {
            return Err(Error::Refused(format!("this projector failed earlier ({why}): open it again to resume")));
        }
        self.wait()?;
        let chunk = self.end_chunk(None);
        write_chunk(&self.projector.db, &chunk)?;
        for share in self.shares.drain(..) {
            self.projector.states.extend(share.states);
            self.projector.chain.extend(share.chain);
        }
        self.projector.applied_tx.send_replace(self.projector.applied);
        Ok(self.projector)
    }
}

/// Writes a chunk's buffers (each share's), each table as one sorted run, in one durable transaction.
fn write_chunk(db: &Database, chunk: &[Buffers]) -> Result<(), Error> {
    let txn = db.begin_write().map_err(storage)?;
    Buffers::flush(chunk, &txn)?;
    txn.commit().map_err(storage)
}

/// Deletes every read model and sets the applied sequence to 0 (the partition count and the layout stay).
fn drop_tables(txn: &redb::WriteTransaction) -> Result<(), Error> {
    for table in [RESOURCES, LEASES, AGENTS, POOLS, PLACEMENTS] {
        txn.delete_table(table).map_err(storage)?;
    }
    for table in [RESOURCES_BY_AGENT, RESOURCES_BY_STATE, LEASES_BY_RESOURCE] {
        txn.delete_table(table).map_err(storage)?;
    }
    txn.delete_table(HOLDERS).map_err(storage)?;
    txn.delete_table(POLICIES).map_err(storage)?;
    txn.delete_table(OUTCOMES).map_err(storage)?;
    txn.delete_table(OUTCOMES_V1).map_err(storage)?;
    txn.delete_table(CHAIN).map_err(storage)?;
    txn.delete_table(COUNTS).map_err(storage)?;
    txn.delete_table(TIMELINE).map_err(storage)?;
    txn.open_table(META).map_err(storage)?.insert("applied", 0).map_err(storage)?;
    Ok(())
}

fn create_tables(txn: &redb::WriteTransaction) -> Result<(), Error> {
    txn.open_table(META).map_err(storage)?;
    txn.open_table(CHAIN).map_err(storage)?;
    txn.open_table(RESOURCES).map_err(storage)?;
    txn.open_table(RESOURCES_BY_AGENT).map_err(storage)?;
    txn.open_table(RESOURCES_BY_STATE).map_err(storage)?;
    txn.open_table(LEASES).map_err(storage)?;
    txn.open_table(LEASES_BY_RESOURCE).map_err(storage)?;
    txn.open_table(AGENTS).map_err(storage)?;
    txn.open_table(POOLS).map_err(storage)?;
    txn.open_table(PLACEMENTS).map_err(storage)?;
    txn.open_table(HOLDERS).map_err(storage)?;
    txn.open_table(POLICIES).map_err(storage)?;
    txn.open_table(OUTCOMES).map_err(storage)?;
    txn.open_table(COUNTS).map_err(storage)?;
    txn.open_table(TIMELINE).map_err(storage)?;
    Ok(())
}

struct Tables<'t> {
    meta: Tab<'t, &'static str, u64>,
    chain: Tab<'t, u32, u64>,
    resources: Tab<'t, &'static str, &'static str>,
    by_agent: Tab<'t, (&'static str, &'static str), ()>,
    by_state: Tab<'t, (&'static str, &'static str), ()>,
    leases: Tab<'t, &'static str, &'static str>,
    leases_by_resource: Tab<'t, (&'static str, &'static str), ()>,
    agents: Tab<'t, &'static str, &'static str>,
    pools: Tab<'t, &'static str, &'static str>,
    holders: Tab<'t, (&'static str, &'static str), &'static str>,
    placements: Tab<'t, &'static str, &'static str>,
    policies: Tab<'t, u32, &'static str>,
    outcomes: AddOnly<'t, (&'static str, u64, u32), (u64, &'static str)>,
    counts: Tab<'t, (&'static str, &'static str), u64>,
    timeline: AddOnly<'t, (&'static str, u64), TimelineRow>,
    /// A bulk rebuild's changes to the counts, kept apart from the table ([`Bulk`]); `None`: written to `counts`.
    counted: Option<&'t mut Counts<i64>>,
}

/// A bulk rebuild's writes of the chunk in hand (one thread's share of it): a buffer per table ([`buffer`]), rows in
/// the order added for the tables only ever added to.
#[derive(Default)]
struct Buffers {
    meta: Pending,
    chain: Pending,
    resources: Pending,
    by_agent: Pending,
    by_state: Pending,
    leases: Pending,
    leases_by_resource: Pending,
    agents: Pending,
    pools: Pending,
    holders: Pending,
    placements: Pending,
    policies: Pending,
    outcomes: Rows,
    counts: Pending,
    timeline: Rows,
}

impl Buffers {
    /// Empties every buffer, keeping its room.
    fn clear(&mut self) {
        for pending in [
            &mut self.meta,
            &mut self.chain,
            &mut self.resources,
            &mut self.by_agent,
            &mut self.by_state,
            &mut self.leases,
            &mut self.leases_by_resource,
            &mut self.agents,
            &mut self.pools,
            &mut self.holders,
            &mut self.placements,
            &mut self.policies,
            &mut self.counts,
        ] {
            pending.clear();
        }
        self.outcomes.clear();
        self.timeline.clear();
    }

    /// Writes the buffers of a chunk (each share's) into their tables of `txn`, each table as one sorted run.
    fn flush(chunk: &[Buffers], txn: &redb::WriteTransaction) -> Result<(), Error> {
        fn into<K: redb::Key + 'static, V: redb::Value + 'static>(
            txn: &redb::WriteTransaction,
            def: TableDefinition<K, V>,
            chunk: &[Buffers],
            pending: impl Fn(&Buffers) -> &Pending,
        ) -> Result<(), Error> {
            let mut table = txn.open_table(def).map_err(storage)?;
            buffer::flush(&mut table, chunk.iter().map(pending)).map_err(storage)
        }
        into(txn, META, chunk, |b| &b.meta)?;
        into(txn, CHAIN, chunk, |b| &b.chain)?;
        into(txn, RESOURCES, chunk, |b| &b.resources)?;
        into(txn, RESOURCES_BY_AGENT, chunk, |b| &b.by_agent)?;
        into(txn, RESOURCES_BY_STATE, chunk, |b| &b.by_state)?;
        into(txn, LEASES, chunk, |b| &b.leases)?;
        into(txn, LEASES_BY_RESOURCE, chunk, |b| &b.leases_by_resource)?;
        into(txn, AGENTS, chunk, |b| &b.agents)?;
        into(txn, POOLS, chunk, |b| &b.pools)?;
        into(txn, HOLDERS, chunk, |b| &b.holders)?;
        into(txn, PLACEMENTS, chunk, |b| &b.placements)?;
        into(txn, POLICIES, chunk, |b| &b.policies)?;
        let mut outcomes = txn.open_table(OUTCOMES).map_err(storage)?;
        buffer::flush_rows(&mut outcomes, chunk.iter().map(|b| &b.outcomes)).map_err(storage)?;
        into(txn, COUNTS, chunk, |b| &b.counts)?;
        let mut timeline = txn.open_table(TIMELINE).map_err(storage)?;
        buffer::flush_rows(&mut timeline, chunk.iter().map(|b| &b.timeline)).map_err(storage)?;
        Ok(())
    }
}

/// What an outcome touches: resources and leases (with their states before it), and pool identifiers.
#[derive(Default)]
struct Touched {
    resources: BTreeMap<ResourceId, Option<&'static str>>,
    leases: BTreeMap<LeaseId, Option<&'static str>>,
    values: BTreeSet<PoolValue>,
}

impl Touched {
    /// Read from `state` before `outcome` is applied: a lease's effects touch its resource's record too.
    fn of(state: &PartitionState, outcome: &Outcome) -> Touched {
        let mut touched = Touched::default();
        let (mut resources, mut leases) = (BTreeSet::new(), BTreeSet::new());
        for effect in outcome.effects() {
            touched.effect(effect, &mut resources, &mut leases);
        }
        resources.extend(leases.iter().filter_map(|lease| state.lease(*lease)).map(|lease| lease.resource));
        touched.resources = resources.into_iter().map(|id| (id, state.resource(id).map(|r| r.state.name()))).collect();
        touched.leases = leases.into_iter().map(|id| (id, state.lease(id).map(|l| l.state.name()))).collect();
        touched
    }

    fn effect(&mut self, effect: &Effect, resources: &mut BTreeSet<ResourceId>, leases: &mut BTreeSet<LeaseId>) {
        // The resources and leases of this partition, and the identifiers of a pool's own grants and frees.
        let m = leasehold_schemas::mentions::Mentions::of(effect);
        resources.extend(m.resources);
        leases.extend(m.leases);
        self.values.extend(m.pool_values);
    }
}

impl<'t> Tables<'t> {
    fn open(txn: &'t redb::WriteTransaction) -> Result<Self, Error> {
        fn tab<'t, K: redb::Key + 'static, V: redb::Value + 'static>(
            txn: &'t redb::WriteTransaction,
            def: TableDefinition<K, V>,
        ) -> Result<Tab<'t, K, V>, Error> {
            txn.open_table(def).map(Tab::Direct).map_err(storage)
        }
        Ok(Tables {
            meta: tab(txn, META)?,
            chain: tab(txn, CHAIN)?,
            resources: tab(txn, RESOURCES)?,
            by_agent: tab(txn, RESOURCES_BY_AGENT)?,
            by_state: tab(txn, RESOURCES_BY_STATE)?,
            leases: tab(txn, LEASES)?,
            leases_by_resource: tab(txn, LEASES_BY_RESOURCE)?,
            agents: tab(txn, AGENTS)?,
            pools: tab(txn, POOLS)?,
            holders: tab(txn, HOLDERS)?,
            placements: tab(txn, PLACEMENTS)?,
            policies: tab(txn, POLICIES)?,
            outcomes: AddOnly::Direct(txn.open_table(OUTCOMES).map_err(storage)?),
            counts: tab(txn, COUNTS)?,
            timeline: AddOnly::Direct(txn.open_table(TIMELINE).map_err(storage)?),
            counted: None,
        })
    }

    /// The tables behind `buffers`: writes go to the buffers; reads see them first, then `previous` (the chunk
    /// being written), then the tables as `committed` has them. The counts' changes go to `counted`.
    fn buffered(
        committed: &redb::ReadTransaction,
        previous: Option<&'t Buffers>,
        buffers: &'t mut Buffers,
        counted: &'t mut Counts<i64>,
    ) -> Result<Self, Error> {
        fn tab<'t, K: redb::Key + 'static, V: redb::Value + 'static>(
            committed: &redb::ReadTransaction,
            def: TableDefinition<K, V>,
            previous: Option<&'t Pending>,
            pending: &'t mut Pending,
        ) -> Result<Tab<'t, K, V>, Error> {
            Ok(Tab::Buffered { table: committed.open_table(def).map_err(storage)?, previous, pending })
        }
        let b = buffers;
        let p = previous;
        Ok(Tables {
            meta: tab(committed, META, p.map(|p| &p.meta), &mut b.meta)?,
            chain: tab(committed, CHAIN, p.map(|p| &p.chain), &mut b.chain)?,
            resources: tab(committed, RESOURCES, p.map(|p| &p.resources), &mut b.resources)?,
            by_agent: tab(committed, RESOURCES_BY_AGENT, p.map(|p| &p.by_agent), &mut b.by_agent)?,
            by_state: tab(committed, RESOURCES_BY_STATE, p.map(|p| &p.by_state), &mut b.by_state)?,
            leases: tab(committed, LEASES, p.map(|p| &p.leases), &mut b.leases)?,
            leases_by_resource: tab(
                committed,
                LEASES_BY_RESOURCE,
                p.map(|p| &p.leases_by_resource),
                &mut b.leases_by_resource,
            )?,
            agents: tab(committed, AGENTS, p.map(|p| &p.agents), &mut b.agents)?,
            pools: tab(committed, POOLS, p.map(|p| &p.pools), &mut b.pools)?,
            holders: tab(committed, HOLDERS, p.map(|p| &p.holders), &mut b.holders)?,
            placements: tab(committed, PLACEMENTS, p.map(|p| &p.placements), &mut b.placements)?,
            policies: tab(committed, POLICIES, p.map(|p| &p.policies), &mut b.policies)?,
            outcomes: AddOnly::Buffered(&mut b.outcomes),
            counts: tab(committed, COUNTS, p.map(|p| &p.counts), &mut b.counts)?,
            timeline: AddOnly::Buffered(&mut b.timeline),
            counted: Some(counted),
        })
    }

    fn write(
        &mut self,
        state: &PartitionState,
        outcome: &Outcome,
        stored: &StoredOutcome,
        touched: &Touched,
    ) -> Result<(), Error> {
        let seq = stored.seq;
        let json = serde_json::to_string(outcome).map_err(storage)?;
        let id = outcome.command.id.to_string();
        self.outcomes.insert((id.as_str(), outcome.cmd_seq, outcome.part), (seq, json.as_str())).map_err(storage)?;
        let settings_changed = |e: &Effect| matches!(e, Effect::PartitionSettingsChanged { .. });
        let policy_changed = |e: &Effect| {
            matches!(
                e,
                Effect::GcModeChanged { .. }
                    | Effect::PriorityCapsChanged { .. }
                    | Effect::QuotaSet { .. }
                    | Effect::QuotaRemoved { .. }
            )
        };
        if outcome.effects().iter().any(|e| policy_changed(e) || settings_changed(e)) {
            self.policies.insert(state.partition(), to_json(&PolicyView::of(state, seq))?.as_str()).map_err(storage)?;
        }
        if outcome.effects().iter().any(settings_changed) {
            // Agents that follow the policy follow it now: their records show the settings in force.
            for agent in state.agents().filter(|a| a.settings.is_none()) {
                let view = to_json(&AgentView::of(state, agent, seq))?;
                self.agents.insert(agent.name.as_str(), view.as_str()).map_err(storage)?;
            }
        }
        match &outcome.command.key {
            Key::Agent(name) => {
                if let Some(agent) = state.agent(name) {
                    let view = to_json(&AgentView::of(state, agent, seq))?;
                    self.agents.insert(agent.name.as_str(), view.as_str()).map_err(storage)?;
                }
                for (lease, before) in &touched.leases {
                    if let Some(lease) = state.lease(*lease) {
                        let view = LeaseView::of(lease, seq);
                        let id = view.id.as_str();
                        self.leases.insert(id, to_json(&view)?.as_str()).map_err(storage)?;
                        self.leases_by_resource.insert((view.resource.as_str(), id), ()).map_err(storage)?;
                        self.count("leases", *before, &view.state)?;
                    }
                }
                for (id, before) in &touched.resources {
                    // A resource no longer in state is one of the outcome's own agent (an outcome changes only the
                    // aggregate of its key).
                    let reference = match state.resource(*id) {
                        Some(resource) => resource.reference(),
                        None => ResourceRef::new(name.clone(), *id),
                    }
                    .to_string();
                    let old = match self.resources.get(reference.as_str()).map_err(storage)? {
                        Some(old) => Some(from_json::<ResourceView>(old.value())?),
                        None => None,
                    };
                    if let Some(resource) = state.resource(*id) {
                        let created_seq = old.as_ref().map_or(seq, |old| old.created_seq);
                        let mut view = ResourceView::of(state, resource, created_seq, seq, outcome.decided_at.0);
                        // The state's start: kept while the state is the same, this outcome's time when it changes.
                        view.state_since = match &old {
                            Some(old) if old.state == view.state => old.state_since,
                            _ => Some(outcome.decided_at.0),
                        };
                        let (quarantined, blocked) = old.map(|old| (old.quarantined, old.destroy_blocked)).unzip();
                        view.quarantined = QuarantineView::follow(quarantined.flatten(), outcome, *id);
                        view.destroy_blocked =
                            DestroyBlockedView::follow(blocked.flatten(), outcome, *id, &resource.state);
                        self.write_resource(&view, *before)?;
                    } else if let Some(mut old) = old {
                        // Forgotten from the state after the horizon (a lost resource's id stays known to its
                        // agent): its handle's quarantine still changes the stored record, and nothing else does.
                        let quarantined = QuarantineView::follow(old.quarantined.clone(), outcome, *id);
                        if quarantined != old.quarantined {
                            old.quarantined = quarantined;
                            old.as_of = seq;
                            old.updated_at = outcome.decided_at.0;
                            self.resources.insert(reference.as_str(), to_json(&old)?.as_str()).map_err(storage)?;
                        }
                    }
                }
            }
            Key::Placement(id) => match state.placement(*id) {
                Some(placement) => {
                    let view = to_json(&PlacementView::of(placement, seq))?;
                    self.placements.insert(id.to_string().as_str(), view.as_str()).map_err(storage)?;
                }
                None => {
                    self.placements.remove(id.to_string().as_str()).map_err(storage)?;
                }
            },
            Key::Pool(name) if state.pool(name).is_none() => {
                // Deleted (only ever empty: it has no holders to remove), or never defined.
                self.pools.remove(name.as_str()).map_err(storage)?;
            }
            Key::Pool(name) => {
                if let Some(pool) = state.pool(name) {
                    let view = PoolView::of(pool, seq, outcome.decided_at);
                    self.pools.insert(name.as_str(), to_json(&view)?.as_str()).map_err(storage)?;
                    for value in &touched.values {
                        let text = value.to_string();
                        match HolderView::of(pool, value, seq) {
                            Some(view) => {
                                self.holders
                                    .insert((name.as_str(), text.as_str()), to_json(&view)?.as_str())
                                    .map_err(storage)?;
                            }
                            None => {
                                self.holders.remove((name.as_str(), text.as_str())).map_err(storage)?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The resource of `lease`, from its record (`<agent>.<lease id>`): a lease of an agent's outcome is that
    /// agent's.
    fn resource_of(&self, key: &Key, lease: LeaseId) -> Option<ResourceId> {
        let Key::Agent(agent) = key else { return None };
        let record = self.leases.get(format!("{agent}.{lease}").as_str()).ok()??;
        let view: LeaseView = from_json(record.value()).ok()?;
        view.resource.parse::<ResourceRef>().ok().map(|r| r.resource)
    }

    /// Writes the timeline rows of the outcome at `seq`: one per thing it concerns.
    fn index(&mut self, outcome: &Outcome, seq: u64, concerns: &[timeline::Concern]) -> Result<(), Error> {
        let id = outcome.command.id.to_string();
        for concern in concerns {
            let key = concern.thing.key();
            let row = (id.as_str(), outcome.cmd_seq, outcome.part, concern.told_by_command, concern.effects.clone());
            self.timeline.insert((key.as_str(), seq), row).map_err(storage)?;
        }
        Ok(())
    }

    /// Writes a resource's record and its index entries; `before` is its state before the outcome (none if new).
    fn write_resource(&mut self, view: &ResourceView, before: Option<&'static str>) -> Result<(), Error> {
        let reference = view.reference.as_str();
        if let Some(before) = before.filter(|s| *s != view.state) {
            self.by_state.remove((before, reference)).map_err(storage)?;
        }
        self.count("resources", before, &view.state)?;
        self.resources.insert(reference, to_json(view)?.as_str()).map_err(storage)?;
        self.by_agent.insert((view.agent.as_str(), reference), ()).map_err(storage)?;
        self.by_state.insert((view.state.as_str(), reference), ()).map_err(storage)?;
        Ok(())
    }

    /// Moves one record of `what` from state `before` (none: a new record) to `after` in the counts.
    fn count(&mut self, what: &'static str, before: Option<&str>, after: &str) -> Result<(), Error> {
        if before == Some(after) {
            return Ok(());
        }
        if let Some(counted) = &mut self.counted {
            let counted = counted.entry(what).or_default();
            let mut change = |state: &str, by: i64| match counted.get_mut(state) {
                Some(n) => *n += by,
                None => {
                    counted.insert(state.to_owned(), by);
                }
            };
            if let Some(before) = before {
                change(before, -1);
            }
            change(after, 1);
            return Ok(());
        }
        if let Some(before) = before {
            let n = self.counts.get((what, before)).map_err(storage)?.map_or(0, |v| v.value());
            self.counts.insert((what, before), n.saturating_sub(1)).map_err(storage)?;
        }
        let n = self.counts.get((what, after)).map_err(storage)?.map_or(0, |v| v.value());
        self.counts.insert((what, after), n + 1).map_err(storage)?;
        Ok(())
    }
}

/// The body of a stored outcome (for [`Bulk::apply`]).
pub fn decode(stored: &StoredOutcome) -> Result<Outcome, Error> {
    codec::decode_outcome(&stored.payload).map_err(|e| Error::Undecodable { seq: stored.seq, detail: e.to_string() })
}

fn to_json(value: &impl serde::Serialize) -> Result<String, Error> {
    serde_json::to_string(value).map_err(storage)
}

/// How many records of a kind (`resources` or `leases`) are in one state: `((kind, state), n)`.
pub type StateCount = ((String, String), u64);

/// Queries on the read models (cheap to clone; usable while the projector writes).
#[derive(Clone)]
pub struct Reader {
    db: Arc<Database>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reader")
    }
}

/// Filters of [`Reader::resources`], and a page of them: records come in reference order, after `after`.
#[derive(Debug, Clone, Default)]
pub struct ResourceQuery {
    pub agent: Option<String>,
    pub state: Option<String>,
    pub kind: Option<String>,
    /// Every `(name, value)` must be one of its attributes.
    pub attrs: Vec<(String, String)>,
    /// Only resources with a live lease (waiting or active) of this holder.
    pub holder: Option<String>,
    /// Leave out records that ended (a terminal state) before this log time, unix ms.
    pub ended_before: Option<u64>,
    /// Only references after this one (keyset paging: the `next` of the page before).
    pub after: Option<String>,
    /// At most this many records.
    pub limit: Option<usize>,
}

/// Filters of [`Reader::leases_page`], and a page of them: leases in reference order, after `after`.
#[derive(Debug, Clone, Default)]
pub struct LeaseQuery {
    /// Only the leases of this resource, `<agent>.<id>`.
    pub resource: Option<String>,
    pub holder: Option<String>,
    /// Every `(name, value)` must be an attribute of the lease's resource.
    pub attrs: Vec<(String, String)>,
    /// Leave out leases that ended before this log time, unix ms.
    pub ended_before: Option<u64>,
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// One page of records, and the key to ask for the next one with (`after`): set when the page is full, so the page
/// after it may be empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub records: Vec<T>,
    pub next: Option<String>,
}

/// Where a page of a timeline starts ([`Reader::history`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The oldest steps.
    First,
    /// The steps after this outcome sequence (the `newer` of the page before).
    After(u64),
    /// The steps before this outcome sequence (the `older` of the page after), the nearest ones.
    Before(u64),
    /// The newest steps.
    Last,
}

/// One step of a thing's timeline: the outcome at `seq` and which of its effects are about the thing.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    pub seq: u64,
    pub outcome: Outcome,
    /// Indexes into the outcome's effects ([`timeline::Concern::effects`]).
    pub effects: Vec<u32>,
}

/// A page of a timeline, oldest first, and where the pages beside it start: `older` (ask [`At::Before`] it) when
/// steps come before this page, `newer` ([`At::After`]) when steps come after it.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    pub entries: Vec<TimelineEntry>,
    pub older: Option<u64>,
    pub newer: Option<u64>,
}

/// Whether a record that ended at `terminal_at` is left out for having ended before `ended_before`.
fn ended_long_ago(terminal_at: Option<u64>, ended_before: Option<u64>) -> bool {
    matches!((terminal_at, ended_before), (Some(at), Some(before)) if at < before)
}

fn has_attrs(attributes: &BTreeMap<String, String>, wanted: &[(String, String)]) -> bool {
    wanted.iter().all(|(name, value)| attributes.get(name) == Some(value))
}

/// Walks keys from `after` (exclusive) in order, keeps what `keep` takes, and stops at `limit` records.
/// The second parts of the keys `(value, _)` of `index`, in order, after `(value, after)` (from the first without
/// `after`).
fn keys_after<'a>(
    index: &'a redb::ReadOnlyTable<(&'static str, &'static str), ()>,
    value: &'a str,
    after: Option<&'a str>,
) -> Result<impl Iterator<Item = Result<String, Error>> + 'a, Error> {
    use std::ops::Bound;
    let start = match after {
        Some(after) => Bound::Excluded((value, after)),
        None => Bound::Included((value, "")),
    };
    let range = index.range::<(&str, &str)>((start, Bound::Unbounded)).map_err(storage)?;
    Ok(range.map_while(move |entry| match entry {
        Ok((key, _)) => {
            let (v, second) = key.value();
            (v == value).then(|| Ok(second.to_owned()))
        }
        Err(e) => Some(Err(storage(e))),
    }))
}

fn page_of<T>(
    items: impl Iterator<Item = Result<(String, Option<T>), Error>>,
    limit: Option<usize>,
) -> Result<Page<T>, Error> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut records = Vec::new();
    if limit == 0 {
        return Ok(Page { records, next: None });
    }
    for item in items {
        let (key, record) = item?;
        if let Some(record) = record {
            records.push(record);
            if records.len() == limit {
                return Ok(Page { records, next: Some(key) });
            }
        }
    }
    Ok(Page { records, next: None })
}

impl Reader {
    /// The last outcome sequence applied.
    pub fn applied(&self) -> Result<u64, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let meta = read.open_table(META).map_err(storage)?;
        Ok(meta.get("applied").map_err(storage)?.map_or(0, |v| v.value()))
    }

    /// The resource's record, with what it waits on (from its agent's record as it is now).
    pub fn resource(&self, reference: &ResourceRef) -> Result<Option<ResourceView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(RESOURCES).map_err(storage)?;
        let key = reference.to_string();
        let Some(mut view) =
            table.get(key.as_str()).map_err(storage)?.map(|v| from_json::<ResourceView>(v.value())).transpose()?
        else {
            return Ok(None);
        };
        let agents = read.open_table(AGENTS).map_err(storage)?;
        let agent =
            agents.get(view.agent.as_str()).map_err(storage)?.map(|v| from_json::<AgentView>(v.value())).transpose()?;
        view.waiting_on = WaitingOn::of(&view, agent.as_ref());
        Ok(Some(view))
    }

    /// The resources `query` asks for, every one of them (no limit: a page of `limit` with [`Reader::resources_page`]).
    pub fn resources(&self, query: &ResourceQuery) -> Result<Vec<ResourceView>, Error> {
        Ok(self.resources_page(query)?.records)
    }

    /// A page of the resources `query` asks for, in reference order after `query.after`. It reads from that key on in
    /// the table (or in the index of the agent or state asked for), so a page costs what it reads, not the table.
    pub fn resources_page(&self, query: &ResourceQuery) -> Result<Page<ResourceView>, Error> {
        use std::ops::Bound;
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(RESOURCES).map_err(storage)?;
        let after = query.after.as_deref();
        let keep = |view: &ResourceView| {
            query.state.as_ref().is_none_or(|s| *s == view.state)
                && query.kind.as_ref().is_none_or(|k| *k == view.kind)
                && query.agent.as_ref().is_none_or(|a| *a == view.agent)
                && has_attrs(&view.attributes, &query.attrs)
                && query.holder.as_ref().is_none_or(|h| view.leases.iter().any(|l| l.holder == *h))
                && !ended_long_ago(view.terminal_at, query.ended_before)
        };
        // A record, if the query keeps it.
        let kept = |json: &str| -> Result<Option<ResourceView>, Error> {
            let view: ResourceView = from_json(json)?;
            Ok(keep(&view).then_some(view))
        };
        let load = |reference: String| -> Result<(String, Option<ResourceView>), Error> {
            let record = match table.get(reference.as_str()).map_err(storage)? {
                Some(json) => kept(json.value())?,
                None => None,
            };
            Ok((reference, record))
        };
        // An index of (agent or state, reference), read from (value, after).
        let indexed = |def: TableDefinition<(&str, &str), ()>, value: &str| -> Result<Page<ResourceView>, Error> {
            let index = read.open_table(def).map_err(storage)?;
            page_of(keys_after(&index, value, after)?.map(|key| key.and_then(load)), query.limit)
        };
        match (&query.agent, &query.state) {
            (Some(agent), _) => indexed(RESOURCES_BY_AGENT, agent),
            (None, Some(state)) => indexed(RESOURCES_BY_STATE, state),
            (None, None) => {
                let start = after.map_or(Bound::Unbounded, Bound::Excluded);
                // Each record as the scan reads it, not looked up again by its key.
                let range = table.range::<&str>((start, Bound::Unbounded)).map_err(storage)?;
                let records = range.map(|e| {
                    let (key, json) = e.map_err(storage)?;
                    Ok((key.value().to_owned(), kept(json.value())?))
                });
                page_of(records, query.limit)
            }
        }
    }

    /// A lease by its reference, `<agent>.<lease id>`.
    pub fn lease(&self, id: &str) -> Result<Option<LeaseView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(LEASES).map_err(storage)?;
        table.get(id).map_err(storage)?.map(|v| from_json(v.value())).transpose()
    }

    /// Every lease of a resource (`<agent>.<id>`), live or ended.
    pub fn leases_of(&self, reference: &str) -> Result<Vec<LeaseView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let index = read.open_table(LEASES_BY_RESOURCE).map_err(storage)?;
        let table = read.open_table(LEASES).map_err(storage)?;
        let mut out = Vec::new();
        for entry in index.range((reference, "")..).map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            let (resource, lease) = key.value();
            if resource != reference {
                break;
            }
            if let Some(view) = table.get(lease).map_err(storage)? {
                out.push(from_json(view.value())?);
            }
        }
        Ok(out)
    }

    /// Every lease, live or ended, by reference.
    pub fn leases(&self) -> Result<Vec<LeaseView>, Error> {
        self.all(LEASES)
    }

    /// A page of the leases `query` asks for, in reference order after `query.after`, read from that key on (in
    /// the index of the resource asked for, or in the table).
    pub fn leases_page(&self, query: &LeaseQuery) -> Result<Page<LeaseView>, Error> {
        use std::ops::Bound;
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(LEASES).map_err(storage)?;
        let resources = read.open_table(RESOURCES).map_err(storage)?;
        let after = query.after.as_deref();
        // A record, if the query keeps it.
        let kept = |json: &str| -> Result<Option<LeaseView>, Error> {
            let view: LeaseView = from_json(json)?;
            let mut keep = query.holder.as_ref().is_none_or(|h| *h == view.holder)
                && query.resource.as_ref().is_none_or(|r| *r == view.resource)
                && !ended_long_ago(view.terminal_at, query.ended_before);
            if keep && !query.attrs.is_empty() {
                let resource = resources.get(view.resource.as_str()).map_err(storage)?;
                let resource = resource.map(|json| from_json::<ResourceView>(json.value())).transpose()?;
                keep = resource.is_some_and(|r| has_attrs(&r.attributes, &query.attrs));
            }
            Ok(keep.then_some(view))
        };
        let load = |id: String| -> Result<(String, Option<LeaseView>), Error> {
            let record = match table.get(id.as_str()).map_err(storage)? {
                Some(json) => kept(json.value())?,
                None => None,
            };
            Ok((id, record))
        };
        match &query.resource {
            Some(resource) => {
                let index = read.open_table(LEASES_BY_RESOURCE).map_err(storage)?;
                page_of(keys_after(&index, resource, after)?.map(|key| key.and_then(load)), query.limit)
            }
            None => {
                let start = after.map_or(Bound::Unbounded, Bound::Excluded);
                let range = table.range::<&str>((start, Bound::Unbounded)).map_err(storage)?;
                let records = range.map(|e| {
                    let (key, json) = e.map_err(storage)?;
                    Ok((key.value().to_owned(), kept(json.value())?))
                });
                page_of(records, query.limit)
            }
        }
    }

    pub fn agents(&self) -> Result<Vec<AgentView>, Error> {
        self.all(AGENTS)
    }

    /// The records of the agents named in `names` that have one, by name, read in one transaction: what a page of
    /// resources needs of their agents, without reading every agent.
    pub fn agents_named<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<BTreeMap<String, AgentView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(AGENTS).map_err(storage)?;
        let mut out = BTreeMap::new();
        for name in names {
            if out.contains_key(name) {
                continue;
            }
            if let Some(json) = table.get(name).map_err(storage)? {
                out.insert(name.to_owned(), from_json(json.value())?);
            }
        }
        Ok(out)
    }

    /// How many resource and lease records are in each state: `(("resources" | "leases", state), n)`.
    pub fn counts(&self) -> Result<Vec<StateCount>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(COUNTS).map_err(storage)?;
        table
            .iter()
            .map_err(storage)?
            .map(|e| {
                e.map_err(storage).map(|(k, v)| {
                    let (what, state) = k.value();
                    ((what.to_owned(), state.to_owned()), v.value())
                })
            })
            .collect()
    }

    pub fn pools(&self) -> Result<Vec<PoolView>, Error> {
        self.all(POOLS)
    }

    /// The placement of resource `id`, while its partition keeps it (until the horizon after it ends).
    pub fn placement(&self, id: &str) -> Result<Option<PlacementView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(PLACEMENTS).map_err(storage)?;
        table.get(id).map_err(storage)?.map(|v| from_json(v.value())).transpose()
    }

    /// Every placement kept, open or ended, in resource id order (the time they were asked for).
    pub fn placements(&self) -> Result<Vec<PlacementView>, Error> {
        self.all(PLACEMENTS)
    }

    /// The policy of every partition, in partition order: recorded ones as last changed, the others the defaults.
    pub fn policies(&self) -> Result<Vec<PolicyView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let meta = read.open_table(META).map_err(storage)?;
        let partitions = meta.get("partitions").map_err(storage)?.map_or(0, |v| v.value());
        let partitions = u32::try_from(partitions).unwrap_or(0);
        let table = read.open_table(POLICIES).map_err(storage)?;
        let mut out = Vec::new();
        for partition in 0..partitions {
            let view = match table.get(partition).map_err(storage)? {
                Some(json) => from_json(json.value())?,
                None => PolicyView::of(&PartitionState::new(partition, partitions), 0),
            };
            out.push(view);
        }
        Ok(out)
    }

    /// Who holds each identifier of `pool`, in identifier order.
    pub fn holders(&self, pool: &str) -> Result<Vec<HolderView>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(HOLDERS).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.range((pool, "")..).map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            if key.value().0 != pool {
                break;
            }
            out.push(from_json(value.value())?);
        }
        Ok(out)
    }

    /// Every part of the outcome of a command, with its sequence, in log order. A command id reused for another
    /// command (in another partition) names each decision: they come ordered by command sequence, each outcome's
    /// `cmd_seq` tells them apart.
    pub fn outcome(&self, command_id: &str) -> Result<Vec<(u64, Outcome)>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(OUTCOMES).map_err(storage)?;
        let mut out = Vec::new();
        for entry in table.range((command_id, 0, 0)..=(command_id, u64::MAX, u32::MAX)).map_err(storage)? {
            let (_, value) = entry.map_err(storage)?;
            let (seq, json) = value.value();
            out.push((seq, from_json(json)?));
        }
        Ok(out)
    }

    /// A page of `thing`'s timeline ([`timeline`]): at most `limit` of the steps that concern it, in log order,
    /// from where `at` says, each read back from the outcomes by command (the index holds no copy). It reads the
    /// thing's own rows only, however long the log.
    pub fn history(&self, thing: &timeline::Thing, at: At, limit: usize) -> Result<History, Error> {
        use std::ops::Bound;
        let read = self.db.begin_read().map_err(storage)?;
        let index = read.open_table(TIMELINE).map_err(storage)?;
        let outcomes = read.open_table(OUTCOMES).map_err(storage)?;
        let key = thing.key();
        let key = key.as_str();
        let (low, high) = match at {
            At::First | At::Last => (Bound::Included((key, 0)), Bound::Included((key, u64::MAX))),
            At::After(seq) => (Bound::Excluded((key, seq)), Bound::Included((key, u64::MAX))),
            At::Before(seq) => (Bound::Included((key, 0)), Bound::Excluded((key, seq))),
        };
        let range = index.range::<(&str, u64)>((low, high)).map_err(storage)?;
        let rows: Vec<_> = match at {
            At::First | At::After(_) => range.take(limit).collect(),
            At::Last | At::Before(_) => {
                let mut rows: Vec<_> = range.rev().take(limit).collect();
                rows.reverse();
                rows
            }
        };
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let (row_key, value) = row.map_err(storage)?;
            let seq = row_key.value().1;
            let (command_id, cmd_seq, part, _, effects) = value.value();
            let Some(found) = outcomes.get((command_id, cmd_seq, part)).map_err(storage)? else {
                return Err(Error::Storage(format!("the timeline names outcome {seq}, which the projection lacks")));
            };
            entries.push(TimelineEntry { seq, outcome: from_json(found.value().1)?, effects });
        }
        let exists = |low: Bound<(&str, u64)>, high: Bound<(&str, u64)>| -> Result<bool, Error> {
            Ok(index.range::<(&str, u64)>((low, high)).map_err(storage)?.next().is_some())
        };
        let (older, newer) = match (entries.first(), entries.last()) {
            (Some(first), Some(last)) => (
                exists(Bound::Included((key, 0)), Bound::Excluded((key, first.seq)))?.then_some(first.seq),
                exists(Bound::Excluded((key, last.seq)), Bound::Included((key, u64::MAX)))?.then_some(last.seq),
            ),
            // Nothing in the range asked for: the way back to what is on the other side of it.
            _ => match at {
                At::After(seq) => (
                    exists(Bound::Included((key, 0)), Bound::Included((key, seq)))?.then_some(seq.saturating_add(1)),
                    None,
                ),
                // Before 0 there is nothing, and no sequence to name the way back with (after 0 is the first).
                At::Before(0) => (None, None),
                At::Before(seq) => {
                    (None, exists(Bound::Included((key, seq)), Bound::Included((key, u64::MAX)))?.then_some(seq - 1))
                }
                At::First | At::Last => (None, None),
            },
        };
        Ok(History { entries, older, newer })
    }

    fn all<T: serde::de::DeserializeOwned>(&self, def: TableDefinition<&str, &str>) -> Result<Vec<T>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        let table = read.open_table(def).map_err(storage)?;
        table.iter().map_err(storage)?.map(|e| e.map_err(storage).and_then(|(_, v)| from_json(v.value()))).collect()
    }

    /// A digest (SHA-256, hex) of each table's keys and values, in key order.
    pub fn digests(&self) -> Result<BTreeMap<&'static str, String>, Error> {
        let read = self.db.begin_read().map_err(storage)?;
        digests_of(&read)
    }
}

/// A projection as recorded in a directory, read without changing it (for audits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub applied: u64,
    /// The projection version that wrote it; only this build's can be compared with a fresh fold.
    pub version: Option<u64>,
    pub digests: BTreeMap<&'static str, String>,
}

/// Reads the projection in `dir` without writing to it: `None` if there is none. Refused while a process has it
/// open for writing (`serve`).
pub fn recorded(dir: &Path) -> Result<Option<Recorded>, Error> {
    let path = dir.join(FILE_NAME);
    if !path.is_file() {
        return Ok(None);
    }
    let db = redb::ReadOnlyDatabase::open(&path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => {
            Error::Refused(format!("the projection in {} is in use by another process", dir.display()))
        }
        other => storage(other),
    })?;
    let read = redb::ReadableDatabase::begin_read(&db).map_err(storage)?;
    let (applied, version) = {
        let meta = match read.open_table(META) {
            Ok(meta) => meta,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(storage(e)),
        };
        let applied = meta.get("applied").map_err(storage)?.map_or(0, |v| v.value());
        let version = meta.get("version").map_err(storage)?.map(|v| v.value());
        (applied, version)
    };
    let digests = if version == Some(PROJECTION_VERSION) { digests_of(&read)? } else { BTreeMap::new() };
    Ok(Some(Recorded { applied, version, digests }))
}

/// A digest of each read-model table in `read`.
fn digests_of(read: &redb::ReadTransaction) -> Result<BTreeMap<&'static str, String>, Error> {
    let mut out = BTreeMap::new();
    out.insert("agents", digest(read, AGENTS)?);
    out.insert("holders", digest(read, HOLDERS)?);
    out.insert("leases", digest(read, LEASES)?);
    out.insert("leases_by_resource", digest(read, LEASES_BY_RESOURCE)?);
    out.insert("outcomes", digest(read, OUTCOMES)?);
    out.insert("placements", digest(read, PLACEMENTS)?);
    out.insert("pools", digest(read, POOLS)?);
    out.insert("policies", digest(read, POLICIES)?);
    out.insert("resources", digest(read, RESOURCES)?);
    out.insert("resources_by_agent", digest(read, RESOURCES_BY_AGENT)?);
    out.insert("resources_by_state", digest(read, RESOURCES_BY_STATE)?);
    out.insert("chain", digest(read, CHAIN)?);
    out.insert("counts", digest(read, COUNTS)?);
    out.insert("timeline", timeline_digest(read)?);
    Ok(out)
}

/// The digest of the timeline rows the outcomes give. The rows a command told (a step without effect is about what
/// its command names) are left out: a rebuild finds them again only while the log holds their commands, and the
/// command log forgets (30 days on JetStream) while outcomes stay.
fn timeline_digest(read: &redb::ReadTransaction) -> Result<String, Error> {
    let table = read.open_table(TIMELINE).map_err(storage)?;
    let mut hash = Sha256::new();
    for entry in table.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (key, value) = (key.value(), value.value());
        if value.3 {
            continue;
        }
        let key: Vec<u8> = <(&str, u64) as redb::Value>::as_bytes(&key);
        let value: Vec<u8> = <TimelineRow as redb::Value>::as_bytes(&value);
        hash.update((key.len() as u64).to_le_bytes());
        hash.update(&key);
        hash.update((value.len() as u64).to_le_bytes());
        hash.update(&value);
    }
    Ok(hex(&hash.finalize()))
}

fn digest<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<String, Error> {
    let table = read.open_table(def).map_err(storage)?;
    let mut hash = Sha256::new();
    for entry in table.iter().map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let key = key.value();
        let value = value.value();
        let key = K::as_bytes(&key);
        let value = V::as_bytes(&value);
        hash.update((key.as_ref().len() as u64).to_le_bytes());
        hash.update(key.as_ref());
        hash.update((value.as_ref().len() as u64).to_le_bytes());
        hash.update(value.as_ref());
    }
    Ok(hex(&hash.finalize()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| Error::Storage(format!("a read-model record does not decode: {e}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use leasehold_schemas::Uuid;
    use leasehold_schemas::command::Register;
    use leasehold_schemas::ids::{AgentName, Timestamp};

    use super::*;

    /// `n` outcomes of partition 0 of 1, each registering an agent of its own, chained from sequence 1.
    fn registrations(n: u64) -> Vec<StoredOutcome> {
        let mut driver = leasehold_domain::driver::Driver::new(0, 1, Timestamp(1_800_000_000_000));
        (1..=n)
            .map(|seq| {
                let name = format!("w{seq}");
                let agent = AgentName::new(&name).unwrap();
                let outcome = driver.submit(&name, Register::new(agent, Uuid::from_u128(u128::from(seq))));
                StoredOutcome {
                    seq,
                    partition: 0,
                    key: outcome.command.key.token(),
                    cmd_id: format!("c{seq}"),
                    cmd_seq: seq,
                    part: 0,
                    prev_seq: seq - 1,
                    payload: Bytes::from(codec::encode_outcome(&outcome).unwrap()),
                }
            })
            .collect()
    }

    fn committed_applied(db: &Database) -> u64 {
        let txn = db.begin_read().unwrap();
        txn.open_table(META).unwrap().get("applied").unwrap().map_or(0, |v| v.value())
    }

    /// The applied sequence a projector announces ([`Projector::subscribe`]) is one its tables hold: "wait on it for
    /// an outcome to be projected". A bulk rebuild that has committed one chunk, and folded part of the next, may
    /// announce the first chunk only, when the writer of that chunk is done (what handing the next chunk over and
    /// finishing do first).
    #[test]
    fn a_bulk_rebuild_announces_only_what_it_has_committed() {
        let dir = tempfile::tempdir().unwrap();
        let projector = Projector::open(dir.path(), 1).unwrap();
        let announced = projector.subscribe();
        let outcomes = registrations(6);
        let mut bulk = projector.into_bulk().unwrap().with_chunk(4);
        let decode_all = |batch: &[StoredOutcome]| batch.iter().map(decode).collect::<Vec<_>>();
        bulk.apply(&outcomes[..4], decode_all(&outcomes[..4]), &BTreeMap::new()).unwrap();
        bulk.apply(&outcomes[4..], decode_all(&outcomes[4..]), &BTreeMap::new()).unwrap();
        assert_eq!(bulk.applied(), 6);
        // The first chunk's writer is done: what is committed is the first chunk, the rest is in memory.
        let _ = bulk.wait().unwrap();
        let committed = committed_applied(&bulk.projector.db);
        assert_eq!(committed, 4, "the first chunk is committed");
        assert!(
            *announced.borrow() <= committed,
            "announced {} as projected while the tables hold outcomes up to {committed}",
            *announced.borrow()
        );
        let projector = bulk.finish().unwrap();
        assert_eq!((*announced.borrow(), committed_applied(&projector.db)), (6, 6));
    }

    /// A bulk rebuild dropped before it finishes (its caller failed) leaves the projection to be opened again at
    /// once, to resume from what it committed: the writer of its last chunk does not keep the database open behind
    /// it.
    #[test]
    fn a_bulk_rebuild_dropped_midway_can_be_opened_again_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let outcomes = registrations(3000);
        let mut bulk = Projector::open(dir.path(), 1).unwrap().into_bulk().unwrap().with_chunk(3000);
        let decoded = outcomes.iter().map(decode).collect();
        // A whole chunk: it goes to its writer.
        bulk.apply(&outcomes, decoded, &BTreeMap::new()).unwrap();
        drop(bulk);
        let reopened = Projector::open(dir.path(), 1).expect("the projection opens again");
        assert_eq!(reopened.applied(), 3000, "the chunk handed over was committed");
    }
}
