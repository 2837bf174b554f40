//! `verify`: folds the whole log and checks it.
//!
//! - Every outcome decodes, its headers agree with its body, the `Lh-Prev-Seq` chain of each partition is unbroken,
//!   and each command has one decision whose parts follow each other ([`crate::fold`]).
//! - Re-deciding: every command whose outcome carries this tool's decider version is decided again against the
//!   state before it, and must give the recorded outcome; every command of the partition before it that got no
//!   outcome must still get none (a duplicate, a heartbeat that changes nothing, a dead letter). A command the log
//!   no longer holds (past `LH_CMD`'s retention) or an outcome of an older decider can only be folded: the report
//!   says which ranges.
//! - The domain's invariants at every step, on what the step touched: nothing leaves a terminal state, leases
//!   within capacity and none on a resource that left, an identifier is never handed out while held nor bound to
//!   two resources, nor handed out again before its pool's cool-down has passed since it was freed, a claim is
//!   freed only after its holder's partition let it go (with a terminal state, or as a returned grant); and every invariant of the domain over a whole partition every
//!   [`FULL_CHECK_EVERY`] outcomes of it and at the end.
//! - The projection's tables equal a fresh fold (a digest per table), when there is a projection to compare.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use futures::StreamExt;
use leasehold_domain::{Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, encode_part};
use leasehold_log::CommandRecord;
use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::mentions::Mentions;
use leasehold_schemas::outcome::{Decision, Effect};
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{LeaseId, Outcome, PoolName, Position, RejectionKind, ResourceId};
use serde::Serialize;

use leasehold_log::export::Entry;

use crate::fold::{self, Failure, PartitionFold, Step};
use crate::parallel::{Weighed, on_threads};

/// How often (in outcomes of one partition) every invariant of the domain is checked over the whole partition.
pub const FULL_CHECK_EVERY: u64 = 10_000;

/// A range of outcome sequences and how many outcomes in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Span {
    pub count: u64,
    pub first: u64,
    pub last: u64,
}

impl Span {
    fn add(&mut self, seq: u64) {
        if self.count == 0 {
            self.first = seq;
        }
        self.count += 1;
        self.last = seq;
    }
}

/// What `verify` found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub partitions: u32,
    pub outcomes: u64,
    pub commands: u64,
    pub dead_letters: u64,
    /// Commands decided again, with their outcome parts, which equal the recorded ones.
    pub redecided: Span,
    /// Commands the log shows no outcome for, decided again to none.
    pub without_outcome: u64,
    /// Outcomes that could only be folded: their command is past the command log's retention.
    pub folded_only_commands_gone: Span,
    /// Outcomes that could only be folded: their command is not held although older commands of the partition are
    /// (retention moved while a live log was read, or the log was altered).
    pub folded_only_commands_missing: Span,
    /// Outcomes that could only be folded: an older decider version made them.
    pub folded_only_older_decider: Span,
    /// Outcomes that could only be folded: their command is in a newer schema than this tool knows.
    pub folded_only_newer_schema: Span,
    /// Commands read but not decided yet (after their partition's last outcome).
    pub undecided: u64,
    /// Whole-partition invariant checks made.
    pub full_checks: u64,
    pub projection: Option<ProjectionCheck>,
    pub failure: Option<Failure>,
}

/// The projection compared with a fresh fold.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectionCheck {
    /// The outcome the projection was as of, where the fresh fold was compared.
    pub applied: u64,
    pub tables: usize,
    /// Tables whose digests differ.
    pub differing: Vec<String>,
}

/// A projection to compare with a fresh fold: its last applied outcome and its table digests.
#[derive(Debug, Clone)]
pub struct Projection {
    pub applied: u64,
    pub digests: std::collections::BTreeMap<String, String>,
}

/// The fresh fold a projection is compared with: a projection of its own in a temporary directory, built in bulk
/// ([`leasehold_projector::Bulk`]) up to the outcome the recorded one is as of, so that its memory is two chunks'
/// writes and redb's cache whatever the log's length.
struct Fresh {
    bulk: Option<leasehold_projector::Bulk>,
    recorded: Projection,
    batch: Vec<leasehold_log::StoredOutcome>,
    /// Removed when the verifier is dropped.
    _dir: tempfile::TempDir,
}

impl Fresh {
    fn new(partitions: u32, recorded: Projection) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let cache = leasehold_projector::BULK_CACHE_BYTES;
        let projector = leasehold_projector::Projector::open_with_cache(dir.path(), partitions, cache)?;
        Ok(Fresh { bulk: Some(projector.into_bulk()?), recorded, batch: Vec::new(), _dir: dir })
    }
}

/// The facts about claims that span partitions, kept across the whole fold.
#[derive(Debug, Default)]
struct Claims {
    /// (pool, value) -> the resource it is bound to (from `claim-bound` until the holder lets it go).
    bound: HashMap<(PoolName, PoolValue), ResourceId>,
    /// Grants a holder's partition let go (`claim-releasable` with a value, `grant-returned`): the pool may free
    /// them. (pool, resource, value, token).
    releasable: HashSet<(PoolName, ResourceId, PoolValue, Position)>,
    /// Grants made by pools and not freed yet: (pool, holder, value, token = the grant's position). A holder binds
    /// only what its pool granted it.
    granted: HashSet<(PoolName, ResourceId, PoolValue, Position)>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("report", &self.report).finish_non_exhaustive()
    }
}

/// How many entries are read before they are handed to the partitions' threads, a batch at a time: the threads
/// check the batches before while the next one is read. [`IN_FLIGHT`] batches and one more are held at most, so
/// memory does not grow with the log.
pub const BATCH_ENTRIES: usize = 2048;

/// Batches handed to the partitions' threads ahead of the merge: memory holds at most this many and one more.
const IN_FLIGHT: usize = 8;

/// The checks of a log, partition by partition on several threads, merged in the log's order.
///
/// Partitions are independent: every check of a step but the claims across partitions ([`Claims`]) reads its own
/// partition's state only. So each partition is checked on one of up to [`std::thread::available_parallelism`]
/// threads for the whole run (decoding, deciding again, folding, the invariants: partition `p` on thread
/// `p % threads`), fed a batch at a time ([`BATCH_ENTRIES`]) while the reading goes on, up to [`IN_FLIGHT`]
/// batches ahead; the oldest batch's results are taken in the log's order: the counts of
/// the report, the claims across partitions, the fresh projection, and the first failure, which ends the run. The
/// report is the one a fold of the whole log in order would give, failure included: a partition's failure stops
/// that partition, and whatever the other partitions checked after it in the log is not counted.
pub struct Verifier {
    partitions: u32,
    parts: Vec<PartitionCheck>,
    /// The last outcome read (for the order check across partitions).
    last_outcome: u64,
    /// The last outcome folded, taken in the log's order.
    last_taken: u64,
    report: Report,
    claims: Claims,
    fresh: Option<Fresh>,
    threads: usize,
    /// The partitions' threads of the run: partition `p` is checked by thread `p % workers`.
    workers: usize,
}

/// One partition's checks: its fold, and the outcomes since its last whole-partition check.
#[derive(Debug)]
struct PartitionCheck {
    partition: u32,
    fold: PartitionFold,
    since_full: u64,
    /// A check of the partition failed: its later entries are not checked (the merge stops at that failure, or at
    /// one before it in the log's order).
    failed: bool,
}

/// Where an entry of a batch is checked, in the log's order.
#[derive(Debug)]
enum Slot {
    /// By its partition's thread: the next result of that partition.
    Partition(u32),
    DeadLetter,
    /// Refused before any partition saw it (a partition the log has not, an outcome out of order).
    Failed(Failure),
}

/// What checking one entry in its partition found, for the merge in the log's order.
#[derive(Debug)]
enum Checked {
    Command,
    Step(Box<StepChecked>),
    Failed(Failure),
}

/// A step's checks in its partition: what they add to the report, and their failure, if any.
#[derive(Debug, Default)]
struct StepChecked {
    seq: u64,
    partition: u32,
    tally: Tally,
    /// Folded into the partition's state (counted in the report's outcomes).
    applied: bool,
    /// The first failure of the checks before the claims across partitions.
    failure: Option<Failure>,
    /// The effects the claims across partitions look at, with the pool whose outcome it is.
    claims: Option<ClaimFacts>,
    /// The whole-partition check made after the step, when it was due.
    full_check: Option<Result<(), Failure>>,
    /// The stored outcome, for the fresh projection.
    stored: Option<leasehold_log::StoredOutcome>,
}

/// What the checks of a step add to the report.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    without_outcome: u64,
    kind: Option<Kind>,
}

/// Which span of the report a step goes to.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Redecided,
    CommandsGone,
    CommandsMissing,
    OlderDecider,
    NewerSchema,
}

/// A step's effects about claims (in order, with their positions), and the pool it is the outcome of.
#[derive(Debug)]
struct ClaimFacts {
    pool: Option<PoolName>,
    effects: Vec<(Position, Effect)>,
}

/// A partition's checks at the end of the log.
#[derive(Debug)]
struct Finished {
    full_check: Result<(), Failure>,
    without_outcome: u64,
    undecided: u64,
}

impl Verifier {
    /// A verifier of a log of `partitions` partitions; `projection`: one to compare with a fresh fold.
    pub fn new(partitions: u32, projection: Option<Projection>) -> anyhow::Result<Self> {
        let fresh = match projection {
            Some(recorded) => Some(Fresh::new(partitions, recorded)?),
            None => None,
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Verifier {
            partitions,
            parts: (0..partitions)
                .map(|partition| PartitionCheck {
                    partition,
                    fold: PartitionFold::new(partition, partitions),
                    since_full: 0,
                    failed: false,
                })
                .collect(),
            last_outcome: 0,
            last_taken: 0,
            report: Report { partitions, ..Report::default() },
            claims: Claims::default(),
            fresh,
            threads,
            workers: 1,
        })
    }

    /// Re-decides as writers splitting long decisions after `bytes` of effects did (tests' small part size).
    pub fn with_split_budget(mut self, bytes: usize) -> Self {
        self.parts =
            self.parts.into_iter().map(|p| PartitionCheck { fold: p.fold.with_split_budget(bytes), ..p }).collect();
        self
    }

    /// Checks on `threads` threads at most (at least one), instead of one per core.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Checks every entry of `entries`; stops at the first failure. `progress` is told each outcome's sequence.
    pub async fn run(
        mut self,
        mut entries: futures::stream::BoxStream<'static, Result<leasehold_log::export::Entry, leasehold_log::Error>>,
        mut progress: impl FnMut(u64),
    ) -> anyhow::Result<Report> {
        let projected = self.fresh.as_ref().map(|fresh| fresh.recorded.applied);
        let workers = self.threads.min(self.partitions.max(1) as usize);
        self.workers = workers;
        let mut checkers = Checkers::start(std::mem::take(&mut self.parts), workers, projected)?;
        // The slots of the batches handed to the partitions' threads and not merged yet, oldest first.
        let mut pending: std::collections::VecDeque<Vec<Slot>> = std::collections::VecDeque::new();
        loop {
            let (slots, queues, end) = self.read_batch(&mut entries).await;
            if !slots.is_empty() {
                checkers.hand(queues).await?;
                pending.push_back(slots);
            }
            let done = end.is_some();
            // Merge the oldest batches once enough are ahead (all of them at the end): the threads check the next
            // ones meanwhile, each at its own pace.
            while pending.len() > IN_FLIGHT || (done && !pending.is_empty()) {
                let slots = pending.pop_front().expect("looked at its length");
                let results = checkers.results().await?;
                if self.merge(&slots, results, &mut progress) {
                    checkers.stop().await;
                    return Ok(self.finish_report());
                }
            }
            if let Some(end) = end {
                if let Err(e) = end {
                    checkers.stop().await;
                    // A source that cannot be read (a damaged file, a cut stream, the log unreachable) says nothing
                    // about the log: the tool could not do what was asked.
                    anyhow::bail!("reading the log after outcome {}: {e}", self.last_taken);
                }
                break;
            }
        }
        self.parts = checkers.finish().await?;
        if let Err(failure) = self.finish().await {
            self.fail(failure);
        }
        Ok(self.finish_report())
    }

    /// Reads up to [`BATCH_ENTRIES`] entries, each given to its partition's queue, with the checks across
    /// partitions made here (a partition the log has, outcomes in sequence). Answers, besides, whether nothing is
    /// to be read after them: `Some(Ok(()))` at the end of the entries and after an entry refused here (nothing after
    /// it is needed), `Some(Err(_))` at a read error.
    async fn read_batch(
        &mut self,
        entries: &mut futures::stream::BoxStream<'static, Result<leasehold_log::export::Entry, leasehold_log::Error>>,
    ) -> (Vec<Slot>, Vec<Vec<Entry>>, Option<Result<(), leasehold_log::Error>>) {
        let mut slots = Vec::with_capacity(BATCH_ENTRIES);
        let mut queues: Vec<Vec<Entry>> = (0..self.workers).map(|_| Vec::with_capacity(BATCH_ENTRIES)).collect();
        while slots.len() < BATCH_ENTRIES {
            let entry = match entries.next().await {
                None => return (slots, queues, Some(Ok(()))),
                Some(Err(e)) => return (slots, queues, Some(Err(e))),
                Some(Ok(entry)) => entry,
            };
            let checked = match &entry {
                Entry::Command { partition, record } => {
                    fold::check_partition("command", record.seq, *partition, self.partitions).map(|()| *partition)
                }
                Entry::Outcome(stored) => {
                    fold::check_outcome_order(stored, self.partitions, self.last_outcome).map(|()| {
                        self.last_outcome = stored.seq;
                        stored.partition
                    })
                }
                Entry::DeadLetter { .. } => {
                    slots.push(Slot::DeadLetter);
                    continue;
                }
            };
            match checked {
                Ok(partition) => {
                    queues[partition as usize % self.workers].push(entry);
                    slots.push(Slot::Partition(partition));
                }
                Err(failure) => {
                    slots.push(Slot::Failed(failure));
                    return (slots, queues, Some(Ok(())));
                }
            }
        }
        (slots, queues, None)
    }

    /// Takes a checked batch in the log's order (`results`: each thread's, in its order); answers whether the run
    /// ends (at a failure).
    fn merge(&mut self, slots: &[Slot], results: Vec<Vec<Checked>>, progress: &mut impl FnMut(u64)) -> bool {
        let mut results: Vec<std::vec::IntoIter<Checked>> = results.into_iter().map(Vec::into_iter).collect();
        for slot in slots {
            let checked = match slot {
                Slot::DeadLetter => {
                    self.report.dead_letters += 1;
                    continue;
                }
                Slot::Failed(failure) => {
                    self.fail(failure.clone());
                    return true;
                }
                Slot::Partition(p) => results[*p as usize % self.workers]
                    .next()
                    .expect("a partition's thread checks its entries up to its first failure, which ends the merge"),
            };
            match checked {
                Checked::Command => self.report.commands += 1,
                Checked::Failed(failure) => {
                    self.fail(failure);
                    return true;
                }
                Checked::Step(step) => {
                    let seq = step.seq;
                    if let Err(failure) = self.take_step(*step) {
                        self.fail(failure);
                        return true;
                    }
                    progress(seq);
                }
            }
        }
        false
    }

    /// A step checked in its partition, in the log's order: its counts, then what only the log's order can check.
    fn take_step(&mut self, step: StepChecked) -> Result<(), Failure> {
        let (seq, partition) = (step.seq, step.partition);
        self.report.without_outcome += step.tally.without_outcome;
        match step.tally.kind {
            Some(Kind::Redecided) => self.report.redecided.add(seq),
            Some(Kind::CommandsGone) => self.report.folded_only_commands_gone.add(seq),
            Some(Kind::CommandsMissing) => self.report.folded_only_commands_missing.add(seq),
            Some(Kind::OlderDecider) => self.report.folded_only_older_decider.add(seq),
            Some(Kind::NewerSchema) => self.report.folded_only_newer_schema.add(seq),
            None => {}
        }
        if step.applied {
            self.report.outcomes += 1;
            self.last_taken = seq;
        }
        if let Some(failure) = step.failure {
            return Err(failure);
        }
        if let Some(facts) = &step.claims {
            self.claims.check(facts).map_err(|detail| Failure::outcome(seq, partition, detail))?;
        }
        if let Some(full_check) = step.full_check {
            self.report.full_checks += 1;
            full_check?;
        }
        if let Some(stored) = step.stored {
            self.project(stored)?;
        }
        Ok(())
    }

    fn fail(&mut self, failure: Failure) {
        self.report.failure.get_or_insert(failure);
    }

    fn finish_report(self) -> Report {
        self.report
    }

    /// Feeds the fresh projection, and compares it with the recorded one once it has reached the outcome the
    /// recorded one is as of (the partitions' threads hand over only the outcomes up to it).
    fn project(&mut self, stored: leasehold_log::StoredOutcome) -> Result<(), Failure> {
        let Some(fresh) = &mut self.fresh else { return Ok(()) };
        let (seq, partition) = (stored.seq, stored.partition);
        fresh.batch.push(stored);
        if fresh.batch.len() >= leasehold_projector::MAX_BATCH || seq == fresh.recorded.applied {
            let decoded = fresh.batch.iter().map(leasehold_projector::decode).collect();
            let bulk = fresh.bulk.as_mut().expect("the fresh projection is compared once, at its end");
            bulk.apply(&fresh.batch, decoded, &std::collections::BTreeMap::new())
                .map_err(|e| Failure::outcome(seq, partition, format!("the fresh projection: {e}")))?;
            fresh.batch.clear();
        }
        if seq == fresh.recorded.applied {
            self.compare_projection(seq, partition)?;
        }
        Ok(())
    }

    fn compare_projection(&mut self, seq: u64, partition: u32) -> Result<(), Failure> {
        let Some(fresh) = self.fresh.take() else { return Ok(()) };
        let recorded = &fresh.recorded;
        let digests = |e: leasehold_projector::Error| {
            Failure::outcome(seq, partition, format!("the fresh projection's digests: {e}"))
        };
        let projector =
            fresh.bulk.expect("the fresh projection is compared once, at its end").finish().map_err(digests)?;
        let fresh_digests = projector.digests().map_err(digests)?;
        let fresh = &fresh_digests;
        let mut differing: Vec<String> = fresh
            .iter()
            .filter(|(table, digest)| recorded.digests.get(**table) != Some(*digest))
            .map(|(table, _)| (*table).to_owned())
            .collect();
        differing.extend(recorded.digests.keys().filter(|t| !fresh.contains_key(t.as_str())).cloned());
        let check = ProjectionCheck { applied: recorded.applied, tables: fresh.len(), differing: differing.clone() };
        self.report.projection = Some(check);
        if !differing.is_empty() {
            return Err(Failure {
                what: "outcome",
                seq,
                partition: None,
                detail: format!(
                    "the projection as of this outcome differs from a fresh fold of the log in table(s) {}: rebuild \
                     it (`leasehold-replay rebuild`)",
                    differing.join(", ")
                ),
            });
        }
        Ok(())
    }

    async fn finish(&mut self) -> Result<(), Failure> {
        let last_outcome = self.last_taken;
        if let Some(Fresh { recorded, .. }) = &self.fresh {
            if recorded.applied > last_outcome {
                return Err(Failure {
                    what: "outcome",
                    seq: recorded.applied,
                    partition: None,
                    detail: format!(
                        "the projection says it applied outcomes up to {}, but the log ends at {last_outcome}",
                        recorded.applied,
                    ),
                });
            }
            if recorded.applied == 0 {
                self.compare_projection(0, 0)?;
            }
        }
        // Each partition's last whole check and its commands after its last outcome, on the partitions' threads
        // (the states are dropped there too); then taken in partition order.
        let parts = std::mem::take(&mut self.parts);
        let threads = self.threads;
        let finished = tokio::task::spawn_blocking(move || {
            on_threads(parts, threads, |part| finish_partition(part, last_outcome))
        })
        .await
        .map_err(|e| Failure {
            what: "outcome",
            seq: last_outcome,
            partition: None,
            detail: format!("the last checks of the partitions stopped: {e}"),
        })?;
        for part in &finished {
            self.report.full_checks += 1;
            part.full_check.clone()?;
        }
        for part in finished {
            self.report.without_outcome += part.without_outcome;
            self.report.undecided += part.undecided;
        }
        Ok(())
    }
}

/// The partitions' threads: partition `p` is checked by thread `p % threads`, which holds its state for the whole
/// run. Each batch gives every thread its entries (in the log's order) and takes back their results, so a thread
/// goes on with the next batch while another finishes this one: no thread waits for the others but at the end.
struct Checkers {
    inputs: Vec<tokio::sync::mpsc::Sender<Vec<Entry>>>,
    outputs: Vec<tokio::sync::mpsc::UnboundedReceiver<Vec<Checked>>>,
    threads: Vec<std::thread::JoinHandle<Vec<PartitionCheck>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Checkers {
    fn start(parts: Vec<PartitionCheck>, workers: usize, projected: Option<u64>) -> anyhow::Result<Self> {
        let mut groups: Vec<Vec<PartitionCheck>> = (0..workers).map(|_| Vec::new()).collect();
        for part in parts {
            groups[part.partition as usize % workers].push(part);
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut checkers = Checkers { inputs: Vec::new(), outputs: Vec::new(), threads: Vec::new(), stop };
        for group in groups {
            let (input, mut batches) = tokio::sync::mpsc::channel::<Vec<Entry>>(IN_FLIGHT + 2);
            let (results, output) = tokio::sync::mpsc::unbounded_channel();
            let stop = checkers.stop.clone();
            let thread = std::thread::Builder::new().name("verify-partitions".to_owned()).spawn(move || {
                let mut group = group;
                while let Some(batch) = batches.blocking_recv() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    if results.send(check_entries(&mut group, workers, batch, projected)).is_err() {
                        break;
                    }
                }
                group
            })?;
            checkers.inputs.push(input);
            checkers.outputs.push(output);
            checkers.threads.push(thread);
        }
        Ok(checkers)
    }

    /// Gives each thread its entries of the next batch.
    async fn hand(&mut self, queues: Vec<Vec<Entry>>) -> anyhow::Result<()> {
        for (input, queue) in self.inputs.iter().zip(queues) {
            if input.send(queue).await.is_err() {
                anyhow::bail!("the checks of the partitions stopped (a thread of them ended)");
            }
        }
        Ok(())
    }

    /// Each thread's results of the oldest batch not taken yet.
    async fn results(&mut self) -> anyhow::Result<Vec<Vec<Checked>>> {
        let mut results = Vec::with_capacity(self.outputs.len());
        for output in &mut self.outputs {
            match output.recv().await {
                Some(checked) => results.push(checked),
                None => anyhow::bail!("the checks of the partitions stopped (a thread of them ended)"),
            }
        }
        Ok(results)
    }

    /// Ends the threads: what they have not checked yet is not needed.
    async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.finish().await;
    }

    /// Ends the threads once they have checked everything handed to them; answers the partitions in order.
    async fn finish(self) -> anyhow::Result<Vec<PartitionCheck>> {
        let Checkers { inputs, outputs, threads, .. } = self;
        drop(inputs);
        drop(outputs);
        let groups = tokio::task::spawn_blocking(move || {
            threads.into_iter().map(std::thread::JoinHandle::join).collect::<Vec<_>>()
        })
        .await?;
        let mut parts = Vec::new();
        for group in groups {
            match group {
                Ok(group) => parts.extend(group),
                Err(_) => anyhow::bail!("the checks of the partitions stopped (a thread of them panicked)"),
            }
        }
        parts.sort_by_key(|part| part.partition);
        Ok(parts)
    }
}

/// Checks one thread's entries of a batch (`group`: its partitions, partition `p` at `p / workers`), each partition
/// up to its first failure.
fn check_entries(
    group: &mut [PartitionCheck],
    workers: usize,
    batch: Vec<Entry>,
    projected: Option<u64>,
) -> Vec<Checked> {
    let mut results = Vec::with_capacity(batch.len());
    for entry in batch {
        let partition = match &entry {
            Entry::Command { partition, .. } => *partition,
            Entry::Outcome(stored) => stored.partition,
            // Dead letters are counted in the log's order, never given to a partition.
            Entry::DeadLetter { .. } => continue,
        };
        let part = &mut group[partition as usize / workers];
        if part.failed {
            continue;
        }
        let checked = part.check_entry(entry, projected);
        part.failed = match &checked {
            Checked::Failed(_) => true,
            Checked::Step(step) => step.failure.is_some() || step.full_check.as_ref().is_some_and(Result::is_err),
            Checked::Command => false,
        };
        results.push(checked);
    }
    results
}

impl Weighed for PartitionCheck {
    fn weight(&self) -> usize {
        self.fold.undecided().count()
    }
}

impl PartitionCheck {
    /// Checks an entry of this partition (not a dead letter).
    fn check_entry(&mut self, entry: Entry, projected: Option<u64>) -> Checked {
        match entry {
            Entry::Command { partition, record } => match self.fold.admit_command(partition, record) {
                Ok(()) => Checked::Command,
                Err(failure) => Checked::Failed(failure),
            },
            Entry::Outcome(stored) => match self.fold.check(stored) {
                Ok(step) => Checked::Step(Box::new(self.step(step, projected))),
                Err(failure) => Checked::Failed(failure),
            },
            Entry::DeadLetter { .. } => Checked::Command,
        }
    }

    /// Every check of a step that reads its partition only, in the order a fold of the whole log makes them.
    fn step(&mut self, step: Step, projected: Option<u64>) -> StepChecked {
        let mut checked = StepChecked { seq: step.seq(), partition: self.partition, ..StepChecked::default() };
        if let Err(failure) = self.checks(&step, &mut checked) {
            checked.failure = Some(failure);
            return checked;
        }
        checked.claims = claim_facts(&step.outcome);
        self.since_full += 1;
        if self.since_full >= FULL_CHECK_EVERY {
            self.since_full = 0;
            checked.full_check = Some(full_check(self.fold.state(), step.seq()));
        }
        if projected.is_some_and(|applied| step.seq() <= applied) {
            checked.stored = Some(step.stored);
        }
        checked
    }

    fn checks(&mut self, step: &Step, checked: &mut StepChecked) -> Result<(), Failure> {
        let partition = step.partition();
        let before = self.fold.state();
        for record in &step.unanswered {
            without_outcome(&mut checked.tally, before, record)?;
        }
        redecide(&mut checked.tally, before, step)?;
        let touched = Touched::before(before, &step.outcome);
        check_grants(before, step)?;
        self.fold.apply(step)?;
        checked.applied = true;
        let after = self.fold.state();
        touched.check_after(after).map_err(|detail| Failure::outcome(step.seq(), partition, detail))
    }
}

/// Every invariant of the domain over one partition, after the outcome at `seq`.
fn full_check(state: &PartitionState, seq: u64) -> Result<(), Failure> {
    leasehold_domain::invariants::check(state).map_err(|e| {
        Failure::outcome(seq, state.partition(), format!("after it, an invariant of the domain fails: {e}"))
    })
}

/// A partition at the end of the log: the whole check, and its commands after its last outcome, decided to none (a
/// duplicate, an idle heartbeat) or not decided yet (the writer is behind, or stopped).
fn finish_partition(part: PartitionCheck, last_outcome: u64) -> Finished {
    let state = part.fold.state();
    let mut finished = Finished { full_check: full_check(state, last_outcome), without_outcome: 0, undecided: 0 };
    for record in part.fold.undecided() {
        let decided_to_none = match leasehold_worker::admit(state.partition(), state.partitions(), record) {
            // Dead-lettered.
            Err(_) => true,
            Ok(envelope) => {
                let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
                matches!(
                    catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))),
                    Ok(Ok(Decided::AlreadyDecided { .. } | Decided::Unchanged))
                )
            }
        };
        if decided_to_none {
            finished.without_outcome += 1;
        } else {
            finished.undecided += 1;
        }
    }
    finished
}

/// The effects of `outcome` the claims across partitions look at, if any.
fn claim_facts(outcome: &Outcome) -> Option<ClaimFacts> {
    let effects: Vec<(Position, Effect)> = outcome
        .positioned_effects()
        .filter(|(_, effect)| {
            matches!(
                effect,
                Effect::ClaimGranted { .. }
                    | Effect::ClaimBound { .. }
                    | Effect::ClaimReleasable { value: Some(_), token: Some(_), .. }
                    | Effect::GrantReturned { .. }
                    | Effect::ClaimFreed { .. }
            )
        })
        .map(|(position, effect)| (position, effect.clone()))
        .collect();
    if effects.is_empty() {
        return None;
    }
    let pool = match &outcome.command.key {
        leasehold_schemas::Key::Pool(name) => Some(name.clone()),
        leasehold_schemas::Key::Agent(_) | leasehold_schemas::Key::Placement(_) => None,
    };
    Some(ClaimFacts { pool, effects })
}

/// A command the log shows no outcome for must get none when decided again.
fn without_outcome(tally: &mut Tally, state: &PartitionState, record: &CommandRecord) -> Result<(), Failure> {
    let partition = state.partition();
    let envelope = match leasehold_worker::admit(partition, state.partitions(), record) {
        Ok(envelope) => envelope,
        // A dead letter (or a command of a newer schema, which a writer of this version leaves alone).
        Err(_) => return Ok(()),
    };
    let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
    match catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))) {
        Ok(Ok(Decided::AlreadyDecided { .. } | Decided::Unchanged)) => {
            tally.without_outcome += 1;
            Ok(())
        }
        Ok(Ok(Decided::Append(outcome))) => Err(Failure::command(
            record.seq,
            partition,
            format!(
                "the log has no outcome for this {} ({}), but deciding it again gives one: {}",
                envelope.type_name(),
                envelope.command_id,
                summary(&outcome)
            ),
        )),
        Ok(Err(e)) => Err(Failure::command(record.seq, partition, format!("deciding it again: {e}"))),
        Err(_) => Err(Failure::command(
            record.seq,
            partition,
            "the log has no outcome for it, and deciding it again panics".to_owned(),
        )),
    }
}

/// Decides `step`'s command (or makes its part) again against the state before it: it must give the recorded outcome.
fn redecide(tally: &mut Tally, state: &PartitionState, step: &Step) -> Result<(), Failure> {
    let (seq, partition, recorded) = (step.seq(), step.partition(), &step.outcome);
    if recorded.decider_version != DECIDER_VERSION {
        tally.kind = Some(Kind::OlderDecider);
        return Ok(());
    }
    let redecided = if recorded.part == 0 {
        let Some(record) = &step.command else {
            if step.command_missing {
                tally.kind = Some(Kind::CommandsMissing);
            } else {
                tally.kind = Some(Kind::CommandsGone);
            }
            return Ok(());
        };
        let envelope = match leasehold_worker::admit(partition, state.partitions(), record) {
            Ok(envelope) => envelope,
            // A newer schema than this tool's (decoded again only on this rare path): it can only be folded.
            Err(_)
                if codec::decode_command(&record.payload).is_err_and(|e| e.kind() == CodecErrorKind::NewerSchema) =>
            {
                tally.kind = Some(Kind::NewerSchema);
                return Ok(());
            }
            Err(why) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!("it answers command {}, which a writer must dead-letter ({why})", record.seq),
                ));
            }
        };
        let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
        match catch_unwind(AssertUnwindSafe(|| decide(state, &ctx, &envelope))) {
            Ok(Ok(Decided::Append(outcome))) => Some(outcome),
            Ok(Ok(Decided::AlreadyDecided { cmd_seq })) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    format!(
                        "deciding command {} again says it was decided already (at command {cmd_seq}), but the \
                             log has this outcome for it",
                        record.seq
                    ),
                ));
            }
            Ok(Ok(Decided::Unchanged)) => {
                return Err(Failure::outcome(
                    seq,
                    partition,
                    "deciding its command again changes nothing (no outcome), but the log has this one",
                ));
            }
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("deciding its command again: {e}"))),
            Err(_) => None,
        }
    } else {
        match catch_unwind(AssertUnwindSafe(|| continue_work(state))) {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(e)) => return Err(Failure::outcome(seq, partition, format!("making this part again: {e}"))),
            Err(_) => None,
        }
    };
    if same_decision(state, recorded, redecided.as_ref()) {
        tally.kind = Some(Kind::Redecided);
        return Ok(());
    }
    let detail = match &redecided {
        Some(outcome) => difference(recorded, outcome),
        None => format!("deciding it again panics, but the log has {}", summary(recorded)),
    };
    Err(Failure::outcome(
        seq,
        partition,
        format!("the recorded outcome differs from what decide gives today: {detail}"),
    ))
}

/// Whether `recorded` is what a writer of today records for `redecided` (`None`: the decider panicked). A writer
/// records an internal error instead of a decision that panics, does not encode, or does not fold.
fn same_decision(state: &PartitionState, recorded: &Outcome, redecided: Option<&Outcome>) -> bool {
    let internal = matches!(&recorded.decision, Decision::Rejected(r) if r.kind == RejectionKind::InternalError);
    match redecided {
        Some(outcome) if outcome == recorded => true,
        None => internal,
        Some(_) if !internal => false,
        Some(outcome) => {
            if encode_part(outcome.clone()).is_ok_and(|(encoded, _)| encoded == *recorded) {
                return true;
            }
            let mut scratch = state.clone();
            !matches!(catch_unwind(AssertUnwindSafe(|| apply(&mut scratch, outcome))), Ok(Ok(())))
        }
    }
}

/// An outcome in a few words.
fn summary(outcome: &Outcome) -> String {
    match &outcome.decision {
        Decision::Rejected(r) => format!("a rejection ({r})"),
        Decision::Accepted { effects, .. } => format!(
            "{} accepted with {} effect(s){}",
            outcome.command.type_name,
            effects.len(),
            effects.first().map(|e| format!(", first {}", e.name())).unwrap_or_default()
        ),
    }
}

/// The first difference between the recorded outcome and the one decided again.
fn difference(recorded: &Outcome, redecided: &Outcome) -> String {
    match (&recorded.decision, &redecided.decision) {
        (
            Decision::Accepted { first_position: a, effects: ea },
            Decision::Accepted { first_position: b, effects: eb },
        ) => {
            if a != b {
                return format!("recorded effects start at position {a}, decide's at {b}");
            }
            for (i, (x, y)) in ea.iter().zip(eb).enumerate() {
                if x != y {
                    return format!(
                        "effect {i} (position {}): recorded {}; decide gives {}",
                        a.0 + i as u64,
                        leasehold_cli_common::output::effect(x),
                        leasehold_cli_common::output::effect(y)
                    );
                }
            }
            if ea.len() != eb.len() {
                return format!("recorded {} effect(s); decide gives {}", ea.len(), eb.len());
            }
            let mut fields = Vec::new();
            if recorded.decided_at != redecided.decided_at {
                fields.push(format!("decided_at {} vs {}", recorded.decided_at, redecided.decided_at));
            }
            if recorded.log_time != redecided.log_time {
                fields.push(format!("log_time {} vs {}", recorded.log_time, redecided.log_time));
            }
            if recorded.command != redecided.command {
                fields.push("the command summary".to_owned());
            }
            format!(
                "same effects, but {}",
                if fields.is_empty() { "other fields".to_owned() } else { fields.join(", ") }
            )
        }
        _ => format!("recorded {}; decide gives {}", summary(recorded), summary(redecided)),
    }
}

/// What a step touched, with the states before it: to check what changed and nothing else.
struct Touched {
    resources: Vec<(ResourceId, Option<&'static str>, bool)>,
    leases: Vec<(LeaseId, Option<&'static str>, bool)>,
    /// Resources an effect said may let their claims go: they must be terminal after.
    releasable: Vec<ResourceId>,
}

impl Touched {
    fn before(state: &PartitionState, outcome: &Outcome) -> Touched {
        let mut touched = Touched { resources: Vec::new(), leases: Vec::new(), releasable: Vec::new() };
        for effect in outcome.effects() {
            let m = Mentions::of(effect);
            for id in m.resources {
                let before = state.resource(id).map(|r| (r.state.name(), r.state.is_terminal()));
                touched.resources.push((id, before.map(|b| b.0), before.is_some_and(|b| b.1)));
            }
            for id in m.leases {
                let before = state.lease(id).map(|l| (l.state.name(), !l.state.is_live()));
                touched.leases.push((id, before.map(|b| b.0), before.is_some_and(|b| b.1)));
            }
            if let Effect::ClaimReleasable { resource, .. } = effect {
                touched.releasable.push(*resource);
            }
        }
        touched
    }

    fn check_after(&self, state: &PartitionState) -> Result<(), String> {
        for (id, before, was_terminal) in &self.resources {
            let Some(resource) = state.resource(*id) else { continue };
            if *was_terminal && Some(resource.state.name()) != *before {
                return Err(format!(
                    "resource {id} left its terminal state {} for {}",
                    before.unwrap_or("-"),
                    resource.state.name()
                ));
            }
            // Only granted leases take capacity: waiting ones (queued on a busy resource, or waiting for it to be
            // made) hold none.
            let active = state
                .live_leases_of(resource)
                .filter(|lease| matches!(lease.state, leasehold_domain::state::LeaseState::Active { .. }))
                .count() as u64;
            if active > u64::from(resource.capacity) {
                return Err(format!(
                    "resource {id} has {active} active leases over its capacity {}",
                    resource.capacity
                ));
            }
            let live = state.live_leases_of(resource).count() as u64;
            if resource.state.has_left() && live > 0 {
                return Err(format!("resource {id} is {} with {live} live lease(s)", resource.state.name()));
            }
        }
        for (id, before, was_terminal) in &self.leases {
            let Some(lease) = state.lease(*id) else { continue };
            if *was_terminal && Some(lease.state.name()) != *before {
                return Err(format!(
                    "lease {id} left its terminal state {} for {}",
                    before.unwrap_or("-"),
                    lease.state.name()
                ));
            }
        }
        for id in &self.releasable {
            if state.resource(*id).is_some_and(|r| !r.state.is_terminal()) {
                return Err(format!("resource {id} let a claim go while it is not in a terminal state"));
            }
        }
        Ok(())
    }
}

/// An identifier is handed out only when nobody holds it: the grants of a step, in order, against the pool's held
/// identifiers before it (an identifier freed earlier in the same step may be granted again).
fn check_grants(state: &PartitionState, step: &Step) -> Result<(), Failure> {
    let leasehold_schemas::Key::Pool(name) = &step.outcome.command.key else { return Ok(()) };
    let Some(pool) = state.pool(name) else { return Ok(()) };
    let mut freed: Vec<PoolValue> = Vec::new();
    let mut granted: Vec<PoolValue> = Vec::new();
    for effect in step.outcome.effects() {
        match effect {
            Effect::ClaimFreed { value, .. } => freed.push(*value),
            Effect::ClaimGranted { holder, value, .. } => {
                let held_by = pool.held.get(value).filter(|_| !freed.contains(value));
                if let Some(other) = held_by {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!("{value} of pool {name} is granted to {holder} while {other} holds it"),
                    ));
                }
                if granted.contains(value) {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!("{value} of pool {name} is granted twice in one decision"),
                    ));
                }
                // A freed identifier rests its pool's cool-down before it is handed out again.
                let now = step.outcome.decided_at;
                let resting = pool.cooling.iter().find(|(_, v)| *v == value).map(|((freed, _), _)| *freed);
                if let Some(freed) = resting.filter(|freed| freed.0.saturating_add(pool.cooldown.0) > now.0) {
                    return Err(Failure::outcome(
                        step.seq(),
                        step.partition(),
                        format!(
                            "{value} of pool {name} is granted to {holder} {} ms before its cool-down ends (freed at \
                             {}, cool-down {} ms)",
                            freed.0 + pool.cooldown.0 - now.0,
                            freed.0,
                            pool.cooldown.0
                        ),
                    ));
                }
                granted.push(*value);
            }
            _ => {}
        }
    }
    Ok(())
}

impl Claims {
    /// Bindings across partitions: one resource per identifier; frees only of what a holder let go.
    fn check(&mut self, facts: &ClaimFacts) -> Result<(), String> {
        let pool_key = facts.pool.as_ref();
        for (position, effect) in &facts.effects {
            let position = *position;
            match effect {
                Effect::ClaimGranted { holder, value, .. } => {
                    if let Some(pool) = pool_key {
                        self.granted.insert((pool.clone(), holder.resource, *value, position));
                    }
                }
                Effect::ClaimBound { resource, pool, value, token } => {
                    if !self.granted.contains(&(pool.clone(), *resource, *value, *token)) {
                        return Err(format!(
                            "{value} of pool {pool} is bound to {resource} under token {token}, which its pool never \
                             granted it (or freed already)"
                        ));
                    }
                    if let Some(other) = self.bound.insert((pool.clone(), *value), *resource)
                        && other != *resource
                    {
                        return Err(format!("{value} of pool {pool} is bound to {resource} while {other} holds it"));
                    }
                }
                Effect::ClaimReleasable { resource, pool, value: Some(value), token: Some(token) } => {
                    self.release_binding(pool, *value, *resource);
                    self.releasable.insert((pool.clone(), *resource, *value, *token));
                }
                Effect::GrantReturned { resource, pool, value, token } => {
                    self.releasable.insert((pool.clone(), *resource, *value, *token));
                }
                Effect::ClaimFreed { holder, value, token } => {
                    let Some(pool) = pool_key else { continue };
                    if !self.releasable.remove(&(pool.clone(), holder.resource, *value, *token)) {
                        return Err(format!(
                            "{value} of pool {pool} was freed from {holder} before its partition let the claim go \
                             (no claim-releasable or grant-returned for token {token})"
                        ));
                    }
                    self.release_binding(pool, *value, holder.resource);
                    self.granted.remove(&(pool.clone(), holder.resource, *value, *token));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn release_binding(&mut self, pool: &PoolName, value: PoolValue, resource: ResourceId) {
        let key = (pool.clone(), value);
        if self.bound.get(&key) == Some(&resource) {
            self.bound.remove(&key);
        }
    }
}
