//! The writer of one partition (DESIGN section 3): it folds the partition's outcomes into state, then decides the
//! partition's commands strictly in log order from its cursor and appends their outcomes under the fence.
//!
//! ```text
//!   load: fold lh.evt.<p>.> from 1 (checking the Lh-Prev-Seq chain) ─▶ state, fence, cursor
//!   finish the parts of an unfinished decision
//!   loop: every command waiting after the read position (up to max_batch)
//!           each: decode, check subject ─▶ decide ─▶ encode ─▶ apply ─▶ into the group
//!                 │ undecodable, mismatched: LH_DLQ     │ the group full (records, bytes): append it now
//!                 │ already decided / unchanged: nothing
//!         append(fence, group) ─▶ landed: fence moves on, commands acked through the last one
//!                                 busy: the same append again
//!                                 too large: the same records in smaller appends, from then on
//!                                 anything else: drop state and group, load, go on from the cursor
//! ```
//!
//! **Group commit.** The outcomes of every command that was waiting go out as one append: one atomic batch on
//! JetStream, one transaction on the embedded log. One append is in flight per partition, and the next group is
//! whatever arrived meanwhile, so a lone command still costs one round trip while a busy partition's groups grow up
//! to `max_append_records`. The state runs ahead of the log by the group in hand; any answer but a clean landing
//! drops both and reloads. A decision's parts may span groups but never interleave with another command's.
//!
//! `decide`, `continue_work` and `apply` run under `catch_unwind` before anything is appended: a command the
//! decider panics on gets a recorded internal-error outcome instead, and a part it panics on abandons the rest of
//! its decision, so a poisoned outcome never reaches the log and a partition never wedges on one command.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use bytes::Bytes;
use leasehold_domain::{
    Ctx, DECIDER_VERSION, Decided, PartitionState, WriterError, abandon_pending, apply, continue_work, decide,
    encode_part, internal_error_outcome,
};
use leasehold_log::{Appended, CommandRecord, DeadLetter, Log, OutcomeFilter, OutcomeRecord, Owner, Snapshot};
use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::subjects::{bound_principal, check_subject, partition_of_key};
use leasehold_schemas::{CommandId, Envelope, Outcome};
use tokio_util::sync::CancellationToken;

use crate::Error;

/// How a writer's service of a partition ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Asked to stop: the command in hand was finished.
    Shutdown,
    /// Another worker serves the partition now.
    Lost,
}

/// An append that did not land cleanly: the writer's memory of the partition is not to be trusted.
#[derive(Debug)]
struct Unclean {
    /// The log named this sequence as the partition's last: a reload reads at least up to it.
    at_least: u64,
    why: String,
}

enum Failure {
    Unclean(Unclean),
    Fatal(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Fatal(e)
    }
}

/// Counts of what a writer did, for tests, benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub decided: u64,
    pub parts: u64,
    pub answered_from_log: u64,
    pub unchanged: u64,
    pub dead_lettered: u64,
    pub reloads: u64,
    pub busy_retries: u64,
    pub internal_errors: u64,
    pub snapshots: u64,
    /// Appends that landed, and the records they held (their ratio is the mean group).
    pub appends: u64,
    pub appended: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, more: Counts) {
        self.decided += more.decided;
        self.parts += more.parts;
        self.answered_from_log += more.answered_from_log;
        self.unchanged += more.unchanged;
        self.dead_lettered += more.dead_lettered;
        self.reloads += more.reloads;
        self.busy_retries += more.busy_retries;
        self.internal_errors += more.internal_errors;
        self.snapshots += more.snapshots;
        self.appends += more.appends;
        self.appended += more.appended;
    }
}

/// Settings of a writer.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Commands asked for at once.
    pub max_batch: usize,
    /// The most outcome records one append carries (group commit); 1 appends each outcome on its own.
    pub max_append_records: usize,
    /// An append is sent once its records hold this many bytes, whatever their number.
    pub max_append_bytes: usize,
    /// How long to wait for commands before checking the hold and the shutdown again.
    pub poll: Duration,
    /// The first wait before retrying a busy append or an unavailable log; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// How long a reload waits for the log to show the sequence an error named (a lagging replica).
    pub reload_deadline: Duration,
    /// Splits long decisions after this many bytes of effects instead of the core's budget (tests and simulations:
    /// where a decision splits changes nothing in its effects).
    pub split_budget: Option<usize>,
    /// The newest schema version an operator declared as rolling out: a command of a schema newer than this
    /// worker's, up to it, stops the partition (a newer worker must decide it) instead of going to the dead letters.
    pub rolling_out_schema: Option<u16>,
    /// A snapshot of the state is stored after this many outcome parts since the last one at most (so a load folds
    /// at most this many after the snapshot); `0` never stores one.
    pub snapshot_every: u64,
    /// ... and sooner, once at least this many parts landed since the last one and their bytes outweigh that
    /// snapshot: a small state is snapshotted often, so a takeover never reads a tail longer than the snapshot
    /// (a partition of a hundred resources loads a few hundred outcomes, not ten thousand).
    pub snapshot_min: u64,
    /// A clean stop stores a snapshot when at least this many parts landed since the last one (or were folded at
    /// the load), so the next owner loads it rather than the tail; `0`: never. A handover is when an old owner
    /// stores a snapshot and the next one reads it: a read that finds its snapshot replaced reads the newer one at
    /// once (`Log::latest_snapshot` on JetStream).
    pub snapshot_on_stop: u64,
    /// How long a clean stop may spend deciding the commands the log already sent (see `Writer::stop_cleanly`).
    pub stop_grace: Duration,
    /// Where decisions, lag, dead letters and reloads are counted for `/metrics` (none: not counted).
    pub metrics: Option<crate::WorkerMetrics>,
    /// Test-only faults to inject (the chaos harness's; see [`crate::faults`]).
    #[cfg(feature = "fault-points")]
    pub faults: Option<std::sync::Arc<crate::faults::FaultPoints>>,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            max_batch: leasehold_log::MAX_APPEND_RECORDS,
            max_append_records: leasehold_log::MAX_APPEND_RECORDS,
            max_append_bytes: DEFAULT_APPEND_BYTES,
            poll: Duration::from_millis(500),
            backoff: Duration::from_millis(5),
            max_backoff: Duration::from_secs(1),
            reload_deadline: Duration::from_secs(30),
            split_budget: None,
            rolling_out_schema: None,
            snapshot_every: 10_000,
            snapshot_min: 1_000,
            snapshot_on_stop: 100,
            stop_grace: Duration::from_secs(2),
            metrics: None,
            #[cfg(feature = "fault-points")]
            faults: None,
        }
    }
}

/// Bytes of outcome records after which a group is appended: 8 MiB, well inside what one atomic batch may stage,
/// and at least 16 of the largest parts (512 KiB).
pub const DEFAULT_APPEND_BYTES: usize = 8 << 20;

/// Outcomes decided and applied but not yet appended: the next append.
#[derive(Debug, Default)]
struct Group {
    records: Vec<OutcomeRecord>,
    bytes: usize,
    /// The command the last record answers.
    last_command: Option<CommandId>,
    /// Per decided command, for the metrics once it lands: type, rejected, when its decision started.
    decided: Vec<(&'static str, bool, std::time::Instant)>,
}

/// The writer of one partition: its state folded from the log, the fence, and how far it has read.
#[derive(Debug)]
pub struct Writer<L: Log> {
    log: L,
    config: WriterConfig,
    state: PartitionState,
    /// The sequence of the partition's last outcome: the fence of the next append.
    fence: u64,
    /// The last command handled (decided, answered, unchanged or dead-lettered); at least the cursor.
    read_pos: u64,
    counts: Counts,
    /// Outcome parts appended since the last snapshot (or the load).
    since_snapshot: u64,
    /// Their bytes (the parts appended since the load only), and the size of the last snapshot stored (0: none yet).
    since_snapshot_bytes: u64,
    last_snapshot_bytes: u64,
    /// The command the partition's last outcome answers (`None`: no outcome yet), for a snapshot.
    last_command: Option<CommandId>,
    /// What the state holds that the log does not yet: appended before anything is acked.
    group: Group,
    /// The most records one append carries: the configuration's and the log's limit, halved each time the log
    /// says an append was too large (a server's batch limit).
    append_cap: usize,
    /// The first part committed next is followed by a copy of itself (a fault point).
    #[cfg(feature = "fault-points")]
    double_next: bool,
}

impl<L: Log> Writer<L> {
    /// Folds `partition` from the log: every outcome from the first, reading at least up to `at_least` (a
    /// sequence an append error named), checking the `Lh-Prev-Seq` chain, the decider version and that the command
    /// log is the one the outcomes answer.
    pub async fn load(log: L, partition: u32, config: WriterConfig, at_least: u64) -> Result<Self, Error> {
        let Folded { state, fence, last_command, folded } = fold_partition(&log, partition, at_least, &config).await?;
        check_command_log(&log, &state, last_command).await?;
        let read_pos = state.cursor();
        let append_cap = config.max_append_records.clamp(1, log.max_append_records().max(1));
        Ok(Writer {
            log,
            append_cap,
            state,
            fence,
            read_pos,
            counts: Counts::default(),
            since_snapshot: folded,
            since_snapshot_bytes: 0,
            last_snapshot_bytes: 0,
            last_command,
            group: Group::default(),
            config,
            #[cfg(feature = "fault-points")]
            double_next: false,
        })
    }

    pub fn state(&self) -> &PartitionState {
        &self.state
    }

    pub fn fence(&self) -> u64 {
        self.fence
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Serves the partition through `owner` until asked to stop or the hold is lost. Returns `Err` only for what a
    /// retry cannot mend (a broken chain, a newer decider, a recreated command log): the partition must stop.
    pub async fn serve(&mut self, owner: &mut L::Owner, shutdown: &CancellationToken) -> Result<Stop, Error> {
        let mut backoff = self.config.backoff;
        loop {
            let finished = match self.finish_parts().await {
                Ok(()) => self.flush(true).await,
                Err(failure) => Err(failure),
            };
            match finished {
                Ok(()) => {}
                Err(Failure::Unclean(unclean)) => {
                    self.reload(unclean).await?;
                    continue;
                }
                Err(Failure::Fatal(e)) => return self.stop_on(e).await,
            }
            if shutdown.is_cancelled() {
                return self.stop_cleanly(owner).await;
            }
            let batch = tokio::select! {
                biased;
                () = shutdown.cancelled() => return self.stop_cleanly(owner).await,
                batch = owner.next_commands(self.read_pos, self.config.max_batch, self.config.poll) => batch,
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(leasehold_log::Error::Lost(_)) => return Ok(Stop::Lost),
                Err(leasehold_log::Error::Unavailable(why)) => {
                    tracing::warn!(partition = self.state.partition(), %why, "the log is unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            backoff = self.config.backoff;
            if batch.is_empty()
                && let Some(metrics) = &self.config.metrics
            {
                // Nothing waits: the partition is caught up with the log.
                metrics.lag(self.state.partition(), 0.0);
            }
            for command in batch {
                match self.take(&command).await {
                    Ok(()) => {}
                    Err(Failure::Unclean(unclean)) => {
                        self.reload(unclean).await?;
                        break;
                    }
                    Err(Failure::Fatal(e)) => return self.stop_on(e).await,
                }
                if shutdown.is_cancelled() {
                    break;
                }
            }
            // The group: every outcome of the commands in hand, in one append. Nothing is acked before it lands.
            match self.flush(true).await {
                Ok(()) => {}
                Err(Failure::Unclean(unclean)) => {
                    self.reload(unclean).await?;
                    continue;
                }
                Err(Failure::Fatal(e)) => return self.stop_on(e).await,
            }
            match owner.done_through(self.read_pos).await {
                Ok(()) => {}
                Err(leasehold_log::Error::Lost(_)) => return Ok(Stop::Lost),
                Err(e) => tracing::warn!(partition = self.state.partition(), error = %e, "could not ack commands"),
            }
        }
    }

    /// A clean stop, once every outcome of the commands handled landed: decides the commands the log already sent
    /// this owner (the next one would be sent them again), then stores a snapshot if the tail since the last one is
    /// long enough to be worth it, all in at most `stop_grace`, so the next owner loads a snapshot and nothing more
    /// (a rolling restart, a worker handing its partitions over). Whatever does not land cleanly ends it at once,
    /// with no snapshot: the state may hold what did not land.
    async fn stop_cleanly(&mut self, owner: &mut L::Owner) -> Result<Stop, Error> {
        let deadline = tokio::time::Instant::now() + self.config.stop_grace;
        loop {
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
            if wait.is_zero() {
                return Ok(Stop::Shutdown);
            }
            let batch = match owner.in_hand(self.read_pos, self.config.max_batch, wait).await {
                Ok(batch) => batch,
                Err(leasehold_log::Error::Lost(_)) => return Ok(Stop::Lost),
                Err(e) => {
                    tracing::debug!(partition = self.state.partition(), error = %e, "stopping without what is at hand");
                    return Ok(Stop::Shutdown);
                }
            };
            if batch.is_empty() {
                break;
            }
            match self.take_all(&batch).await {
                Ok(()) => {}
                Err(Failure::Unclean(unclean)) => {
                    tracing::info!(partition = self.state.partition(), why = %unclean.why, "stopping: not clean");
                    return Ok(Stop::Shutdown);
                }
                Err(Failure::Fatal(e)) => return self.stop_on(e).await,
            }
        }
        let enough = self.config.snapshot_on_stop;
        if enough > 0
            && self.since_snapshot >= enough
            // Within the stop's grace too: a log that does not answer keeps the snapshot, not the stop.
            && tokio::time::timeout_at(deadline, self.store_snapshot()).await.is_err()
        {
            tracing::info!(
                partition = self.state.partition(),
                "stopping without a snapshot: the log did not store it in time"
            );
        }
        Ok(Stop::Shutdown)
    }

    /// Takes every command of `batch`, then appends their outcomes in one group (no snapshot).
    async fn take_all(&mut self, batch: &[CommandRecord]) -> Result<(), Failure> {
        for command in batch {
            self.take(command).await?;
        }
        self.flush(false).await
    }

    /// Handles the next command of a batch, its parts finished before the next (a decision in parts is), and moves
    /// the cursor past it. One delivered again is skipped: it was handled (its outcome is in the log, or it needed
    /// none).
    async fn take(&mut self, command: &CommandRecord) -> Result<(), Failure> {
        if command.seq <= self.read_pos {
            return Ok(());
        }
        self.handle(command).await?;
        self.finish_parts().await?;
        self.read_pos = command.seq;
        Ok(())
    }

    /// Stops the partition on `e` (what a retry cannot mend), after appending the group in hand: the commands
    /// before the one that stopped it were decided cleanly, as a writer without group commit would have appended
    /// them. No snapshot: the state may hold what failed.
    async fn stop_on(&mut self, e: Error) -> Result<Stop, Error> {
        if let Err(Failure::Unclean(unclean)) = self.flush(false).await {
            tracing::warn!(partition = self.state.partition(), why = %unclean.why, "the last group did not land cleanly");
        }
        Err(e)
    }

    /// Drops the state and folds the partition again; goes on from the cursor the log holds.
    async fn reload(&mut self, unclean: Unclean) -> Result<(), Error> {
        tracing::info!(partition = self.state.partition(), why = %unclean.why, "append not clean: reloading");
        let partition = self.state.partition();
        let Folded { state, fence, folded, last_command } =
            fold_partition(&self.log, partition, unclean.at_least, &self.config).await?;
        self.state = state;
        self.last_command = last_command;
        self.fence = fence;
        self.read_pos = self.state.cursor();
        self.since_snapshot = folded;
        self.group = Group::default();
        self.counts.reloads += 1;
        if let Some(metrics) = &self.config.metrics {
            metrics.reloaded();
        }
        Ok(())
    }

    async fn handle(&mut self, command: &CommandRecord) -> Result<(), Failure> {
        let partition = self.state.partition();
        let envelope = match self.admit(command) {
            Ok(envelope) => envelope,
            Err(Refusal::Newer { version, reason }) => {
                return Err(Failure::Fatal(Error::NewerSchema { partition, seq: command.seq, version, reason }));
            }
            Err(Refusal::DeadLetter(reason)) => {
                // With the command id its payload names, read now: the log may have to keep the letter without
                // its bytes.
                let letter = DeadLetter::of(partition, command, reason);
                tracing::warn!(partition, seq = command.seq, reason = %letter.reason, "command dead-lettered");
                self.with_retries(|log| {
                    let letter = letter.clone();
                    async move { log.dead_letter(letter).await }
                })
                .await?;
                self.counts.dead_lettered += 1;
                if let Some(metrics) = &self.config.metrics {
                    metrics.dead_lettered();
                }
                return Ok(());
            }
        };
        let ctx = Ctx { cmd_seq: command.seq, log_time: command.time };
        let started = std::time::Instant::now();
        let decided = catch_unwind(AssertUnwindSafe(|| decide(&self.state, &ctx, &envelope)));
        let outcome = match decided {
            Ok(Ok(Decided::Append(outcome))) => outcome,
            Ok(Ok(Decided::AlreadyDecided { .. })) => {
                self.counts.answered_from_log += 1;
                return Ok(());
            }
            Ok(Ok(Decided::Unchanged)) => {
                self.counts.unchanged += 1;
                return Ok(());
            }
            Ok(Err(e)) => return Err(Failure::Fatal(Error::Writer { partition, error: e })),
            Err(panic) => {
                let detail = panic_message(&panic);
                tracing::error!(partition, seq = command.seq, %detail, "the decider panicked");
                self.counts.internal_errors += 1;
                internal_error_outcome(&self.state, &ctx, &envelope, &detail)
                    .map_err(|error| Failure::Fatal(Error::Writer { partition, error }))?
            }
        };
        self.counts.decided += 1;
        #[cfg(feature = "fault-points")]
        match self.config.faults.as_ref().map(|faults| {
            faults.on_decided(envelope.command_id, envelope.body.class() == leasehold_schemas::CommandClass::Op)
        }) {
            // A lost decision: nothing appended or applied, and the command acked with the others.
            Some(crate::faults::Action::Skip) => return Ok(()),
            Some(crate::faults::Action::Double) => self.double_next = true,
            Some(crate::faults::Action::Record) | None => {}
        }
        let rejected = outcome.rejection().is_some();
        self.commit(outcome, |state, detail| internal_error_outcome(state, &ctx, &envelope, detail)).await?;
        self.group.decided.push((envelope.type_name(), rejected, started));
        if let Some(metrics) = &self.config.metrics {
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            metrics.lag(partition, now - command.time.0 as f64 / 1000.0);
        }
        Ok(())
    }

    /// Makes and appends the next parts of an unfinished decision, before anything else.
    async fn finish_parts(&mut self) -> Result<(), Failure> {
        let partition = self.state.partition();
        while self.state.pending().is_some() {
            let part = match catch_unwind(AssertUnwindSafe(|| continue_work(&self.state))) {
                Ok(Ok(part)) => part,
                Ok(Err(error)) => return Err(Failure::Fatal(Error::Writer { partition, error })),
                Err(panic) => {
                    let detail = panic_message(&panic);
                    tracing::error!(partition, %detail, "the decider panicked on a part");
                    self.counts.internal_errors += 1;
                    abandon_pending(&self.state, &detail)
                        .map_err(|error| Failure::Fatal(Error::Writer { partition, error }))?
                }
            };
            self.commit(part, abandon_pending).await?;
        }
        Ok(())
    }

    /// Encodes `outcome`, applies it under `catch_unwind` and appends it under the fence. If applying fails, the
    /// state is folded again from the log (nothing was appended) and `fallback` makes the internal-error outcome
    /// recorded instead.
    async fn commit(
        &mut self,
        outcome: Outcome,
        fallback: impl Fn(&PartitionState, &str) -> Result<Outcome, WriterError>,
    ) -> Result<(), Failure> {
        let partition = self.state.partition();
        #[cfg(feature = "fault-points")]
        let double = outcome.part == 0 && std::mem::take(&mut self.double_next);
        let (outcome, bytes) = encode(outcome)?;
        let applied = catch_unwind(AssertUnwindSafe(|| apply(&mut self.state, &outcome)));
        let (outcome, bytes) = match applied {
            Ok(Ok(())) => (outcome, bytes),
            failed => {
                let detail = match failed {
                    Ok(Err(e)) => format!("its outcome does not fold: {e}"),
                    Err(panic) => panic_message(&panic),
                    Ok(Ok(())) => unreachable!("matched above"),
                };
                tracing::error!(partition, cmd_seq = outcome.cmd_seq, %detail, "applying an outcome failed");
                self.counts.internal_errors += 1;
                // The group in hand was applied cleanly before: append it (no snapshot of a state the failed
                // apply may have touched), then fold the state again from the log.
                self.flush(false).await?;
                let Folded { state, fence, .. } =
                    fold_partition(&self.log, partition, self.fence, &self.config).await?;
                self.state = state;
                self.fence = fence;
                // Another writer may have decided this command (or finished its parts) meanwhile: then there is
                // nothing to record here; go on from the log.
                let decided_elsewhere = match self.state.pending() {
                    Some(pending) => pending.cmd_seq != outcome.cmd_seq || pending.next_part() != outcome.part,
                    None => outcome.part > 0 || self.state.cursor() >= outcome.cmd_seq,
                };
                if decided_elsewhere {
                    return Err(Failure::Unclean(Unclean {
                        at_least: self.fence,
                        why: format!("command {} was decided elsewhere meanwhile", outcome.cmd_seq),
                    }));
                }
                let recorded = fallback(&self.state, &detail)
                    .map_err(|error| Failure::Fatal(Error::Writer { partition, error }))?;
                let (recorded, bytes) = encode(recorded)?;
                match catch_unwind(AssertUnwindSafe(|| apply(&mut self.state, &recorded))) {
                    Ok(Ok(())) => (recorded, bytes),
                    _ => return Err(Failure::Fatal(Error::Poisoned { partition, cmd_seq: recorded.cmd_seq, detail })),
                }
            }
        };
        if outcome.part > 0 {
            self.counts.parts += 1;
        }
        let record = OutcomeRecord::of(&outcome, Bytes::from(bytes));
        self.group.bytes += record.payload.len();
        self.group.records.push(record);
        self.group.last_command = Some(outcome.command.id);
        #[cfg(feature = "fault-points")]
        if double {
            // A buggy writer's second decision of the command, chained right after the first: applied never.
            let (copy, bytes) = encode(crate::faults::copy_of(&outcome))?;
            let record = OutcomeRecord::of(&copy, Bytes::from(bytes));
            self.group.bytes += record.payload.len();
            self.group.records.push(record);
        }
        if self.group.records.len() >= self.config.max_append_records.clamp(1, leasehold_log::MAX_APPEND_RECORDS)
            || self.group.bytes >= self.config.max_append_bytes
        {
            self.flush(true).await?;
        }
        #[cfg(feature = "fault-points")]
        if let Some(faults) = self.config.faults.clone()
            && faults.crash_due(&outcome)
        {
            // The part is in the log before the process dies; the rest of the decision is not.
            self.flush(true).await?;
            faults.crash(&outcome, partition);
        }
        Ok(())
    }

    /// Appends the group in hand under the fence, retrying while the log is busy, in slices of at most
    /// `append_cap` records (each fenced on the one before). When all of it lands the fence has moved on and (with
    /// `snapshot`) a snapshot may be stored; any other answer leaves the state untrusted.
    async fn flush(&mut self, snapshot: bool) -> Result<(), Failure> {
        let total = self.group.records.len();
        if total == 0 {
            return Ok(());
        }
        let partition = self.state.partition();
        let mut backoff = self.config.backoff;
        let mut start = 0;
        while start < total {
            let end = (start + self.append_cap).min(total);
            match self.log.append(partition, self.fence, &self.group.records[start..end]).await {
                Appended::Landed { last, .. } => {
                    self.fence = last;
                    self.counts.appends += 1;
                    self.counts.appended += (end - start) as u64;
                    if let Some(metrics) = &self.config.metrics {
                        metrics.appended(end - start);
                    }
                    start = end;
                    backoff = self.config.backoff;
                }
                Appended::Busy(why) => {
                    tracing::debug!(partition, %why, "the log is busy; appending again");
                    self.counts.busy_retries += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
                Appended::TooLarge(why) if end - start > 1 => {
                    // Nothing was stored: the same records go again in smaller appends, from now on.
                    self.append_cap = ((end - start) / 2).max(1);
                    tracing::warn!(partition, %why, cap = self.append_cap, "the log takes fewer records per append");
                }
                Appended::Stale { last } => {
                    return Err(Failure::Unclean(Unclean {
                        at_least: last.unwrap_or(0),
                        why: format!("the fence {} is stale (the partition's last outcome is {last:?})", self.fence),
                    }));
                }
                Appended::TooLarge(why) | Appended::Unknown(why) => {
                    return Err(Failure::Unclean(Unclean { at_least: 0, why }));
                }
            }
        }
        let group = std::mem::take(&mut self.group);
        self.since_snapshot += total as u64;
        self.since_snapshot_bytes += group.bytes as u64;
        if let Some(metrics) = &self.config.metrics {
            for (type_name, rejected, started) in group.decided {
                metrics.decided(type_name, rejected, started.elapsed());
            }
        }
        if group.last_command.is_some() {
            self.last_command = group.last_command;
            if snapshot {
                self.maybe_snapshot().await;
            }
        }
        Ok(())
    }

    /// Stores a snapshot when enough outcomes landed since the last one and no decision is unfinished. A snapshot is
    /// a cache: failing to store one is a warning, nothing more.
    async fn maybe_snapshot(&mut self) {
        let every = self.config.snapshot_every;
        let early = self.since_snapshot >= self.config.snapshot_min.min(every)
            && self.since_snapshot_bytes >= self.last_snapshot_bytes;
        if every == 0 || (self.since_snapshot < every && !early) {
            return;
        }
        self.store_snapshot().await;
    }

    /// Stores a snapshot of the state at its last outcome, unless it has none or a decision is unfinished.
    async fn store_snapshot(&mut self) {
        let Some(last_command) = self.last_command else { return };
        if self.state.pending().is_some() {
            return;
        }
        let partition = self.state.partition();
        let state = match self.state.to_snapshot() {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot encode a snapshot");
                return;
            }
        };
        let snapshot = Snapshot {
            partition,
            decider_version: DECIDER_VERSION,
            fence: self.fence,
            last_command: Some(last_command.to_string()),
            state: Bytes::from(state),
        };
        let size = snapshot.state.len() as u64;
        match self.log.put_snapshot(snapshot).await {
            Ok(()) => {
                self.since_snapshot = 0;
                self.since_snapshot_bytes = 0;
                self.last_snapshot_bytes = size;
                self.counts.snapshots += 1;
            }
            Err(e) => tracing::warn!(partition, error = %e, "cannot store a snapshot"),
        }
    }

    fn admit(&self, command: &CommandRecord) -> Result<Envelope, Refusal> {
        admit(self.state.partition(), self.state.partitions(), command).map_err(|reason| {
            // A command of a schema an operator declared as rolling out is not garbage: a newer worker must decide
            // it, so the partition waits for one rather than dead-letter it.
            let rolling_out = self.config.rolling_out_schema;
            let newer = codec::decode_command(&command.payload).err().and_then(|e| e.newer_version());
            match newer {
                Some(version) if rolling_out.is_some_and(|declared| version <= declared) => {
                    Refusal::Newer { version, reason }
                }
                _ => Refusal::DeadLetter(reason),
            }
        })
    }

    /// Runs `op` until the log answers, backing off while it is unavailable.
    async fn with_retries<T, F, Fut>(&self, op: F) -> Result<T, Failure>
    where
        F: Fn(L) -> Fut,
        Fut: std::future::Future<Output = Result<T, leasehold_log::Error>>,
    {
        let mut backoff = self.config.backoff;
        loop {
            match op(self.log.clone()).await {
                Ok(value) => return Ok(value),
                Err(leasehold_log::Error::Unavailable(why)) => {
                    tracing::warn!(partition = self.state.partition(), %why, "the log is unavailable; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
                Err(e) => return Err(Failure::Fatal(e.into())),
            }
        }
    }
}

enum Refusal {
    DeadLetter(String),
    /// Written in a schema being rolled out, newer than this worker's.
    Newer {
        version: u16,
        reason: String,
    },
}

/// Decodes a command read from `partition` and checks that it belongs there: its subject names its class, key and
/// id, and its key lives in this partition. What does not is dead-lettered with the reason returned.
pub fn admit(partition: u32, partitions: u32, command: &CommandRecord) -> Result<Envelope, String> {
    let envelope = codec::decode_command(&command.payload).map_err(|e| {
        let what = match e.kind() {
            CodecErrorKind::NewerSchema => "written by a newer leasehold",
            CodecErrorKind::TooLarge => "oversized",
            CodecErrorKind::TrailingBytes => "trailing bytes",
            CodecErrorKind::Empty => "empty",
            CodecErrorKind::UnknownFormat => "unknown format",
            CodecErrorKind::UnknownType => "unknown command type",
            CodecErrorKind::ClassMismatch => "class mismatch",
            CodecErrorKind::Malformed | CodecErrorKind::Encode => "undecodable",
        };
        format!("{what}: {e}")
    })?;
    check_subject(&command.subject, &envelope.body).map_err(|e| e.to_string())?;
    if let Some(principal) = bound_principal(&command.subject) {
        if envelope.issuer.as_str() != principal {
            return Err(format!(
                "published as principal {principal:?} (subject {}) but names issuer {:?}: a bound producer sends as \
                 its principal only",
                command.subject,
                envelope.issuer.as_str()
            ));
        }
        if !envelope.body.is_producer_request() {
            return Err(format!(
                "{} is the operator's; a producer bound to principal {principal:?} sends only allocations, \
                 placements, leases and what it does to resources",
                envelope.body.type_name()
            ));
        }
    }
    let home = partition_of_key(&envelope.body.key(), partitions);
    let stored_in = command.subject.split('.').nth(2).and_then(|p| p.parse::<u32>().ok());
    if home != partition || stored_in != Some(partition) {
        return Err(format!(
            "read from partition {partition} (stored in {stored_in:?}) but {} lives in partition {home} of {partitions}",
            envelope.body.key()
        ));
    }
    Ok(envelope)
}

fn encode(outcome: Outcome) -> Result<(Outcome, Vec<u8>), Failure> {
    let cmd_seq = outcome.cmd_seq;
    encode_part(outcome).map_err(|e| Failure::Fatal(Error::Encode { cmd_seq, detail: e.to_string() }))
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// A partition folded from the log.
#[derive(Debug)]
pub struct Folded {
    pub state: PartitionState,
    /// The sequence of the last outcome (0 if none): the fence of the next append.
    pub fence: u64,
    /// The command the last outcome answers.
    pub last_command: Option<CommandId>,
    /// How many outcome parts were folded after the snapshot the fold started from (all of them without one).
    pub folded: u64,
}

/// Folds every outcome of `partition` into a fresh state, reading at least up to `at_least` and the partition's
/// last outcome, checking the chain, the decider version and that headers and bodies agree.
pub async fn fold_partition<L: Log>(
    log: &L,
    partition: u32,
    at_least: u64,
    config: &WriterConfig,
) -> Result<Folded, Error> {
    fold(log, partition, at_least, false, config).await
}

/// Folds `partition` exactly through its outcome at `up_to` (from the latest usable snapshot at or before it), with
/// the same checks: what a reader that has applied the log up to `up_to` (the projector, after a restart) needs.
/// `up_to` must be an outcome of the partition (or 0).
pub async fn fold_partition_to<L: Log>(
    log: &L,
    partition: u32,
    up_to: u64,
    config: &WriterConfig,
) -> Result<Folded, Error> {
    fold(log, partition, up_to, true, config).await
}

async fn fold<L: Log>(
    log: &L,
    partition: u32,
    at_least: u64,
    exactly: bool,
    config: &WriterConfig,
) -> Result<Folded, Error> {
    let give_up = tokio::time::Instant::now() + config.reload_deadline;
    let target = if exactly {
        at_least
    } else {
        until_available(partition, give_up, || log.last_outcome_seq(partition)).await?.max(at_least)
    };
    // The snapshot may take half of what is left of the deadline, each read included (one on JetStream can take
    // seconds): a snapshot that stays unreadable must leave the fold from the first outcome time to ride out the
    // log as well, within the deadline.
    let now = tokio::time::Instant::now();
    let snapshot_give_up = now + give_up.saturating_duration_since(now) / 2;
    let snapshot = until_available(partition, snapshot_give_up, || usable_snapshot(log, partition, target));
    let start = match tokio::time::timeout_at(snapshot_give_up, snapshot).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::warn!(partition, error = %e, "cannot read the snapshot; folding from the first outcome");
            None
        }
        Err(_) => {
            tracing::warn!(partition, "the snapshot could not be read in time; folding from the first outcome");
            None
        }
    };
    let (mut state, mut prev, mut last_command) =
        start.unwrap_or_else(|| (PartitionState::new(partition, log.partitions()), 0, None));
    let budget = config.split_budget.unwrap_or(leasehold_domain::EFFECT_BUDGET_BYTES);
    state = state.with_split_budget(budget);
    let filter = OutcomeFilter::Partition(partition);
    let mut folded = 0u64;
    loop {
        let batch = until_available(partition, give_up, || log.read_outcomes(&filter, prev + 1, 512)).await?;
        if batch.is_empty() {
            if prev >= target {
                return Ok(Folded { state, fence: prev, last_command, folded });
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(Error::Behind { partition, reached: prev, wanted: target });
            }
            // A replica behind the write the log named: ask again.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        for stored in batch {
            if exactly && stored.seq > target {
                if prev == target {
                    return Ok(Folded { state, fence: prev, last_command, folded });
                }
                return Err(Error::Behind { partition, reached: prev, wanted: target });
            }
            if stored.prev_seq != prev {
                return Err(Error::ChainBroken {
                    partition,
                    seq: stored.seq,
                    prev_seq: stored.prev_seq,
                    expected: prev,
                });
            }
            let outcome = fold_outcome(&mut state, &stored)?;
            prev = stored.seq;
            last_command = Some(outcome.command.id);
            folded += 1;
        }
    }
}

/// Asks the log with `ask` until it answers something other than unavailable (a leader election), or `give_up`
/// passes: then that answer.
async fn until_available<T, F: Future<Output = Result<T, leasehold_log::Error>>>(
    partition: u32,
    give_up: tokio::time::Instant,
    mut ask: impl FnMut() -> F,
) -> Result<T, leasehold_log::Error> {
    loop {
        match ask().await {
            Err(leasehold_log::Error::Unavailable(why)) if tokio::time::Instant::now() < give_up => {
                tracing::warn!(partition, %why, "the log is unavailable; retrying the load");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => return answer,
        }
    }
}

/// Folds one stored outcome into `state` (its partition's, whose chain the caller has checked), with the checks
/// every fold makes: it decodes, its decider is no newer than this build's, its headers match its body, and `apply`
/// takes it (a panic in `apply` is an error, not a dead task). Returns the outcome applied. The writers' load and
/// the sweeper's fold both go through it.
pub fn fold_outcome(state: &mut PartitionState, stored: &leasehold_log::StoredOutcome) -> Result<Outcome, Error> {
    let (partition, seq) = (stored.partition, stored.seq);
    let outcome = codec::decode_outcome(&stored.payload).map_err(|e| Error::Undecodable {
        partition,
        seq,
        detail: e.to_string(),
    })?;
    if outcome.decider_version > DECIDER_VERSION {
        return Err(Error::NewerDecider { partition, seq, version: outcome.decider_version });
    }
    if outcome.partition != partition || outcome.cmd_seq != stored.cmd_seq || outcome.part != stored.part {
        return Err(Error::Undecodable {
            partition,
            seq,
            detail: format!(
                "its headers (command {}, part {}) do not match its body (partition {}, command {}, part {})",
                stored.cmd_seq, stored.part, outcome.partition, outcome.cmd_seq, outcome.part
            ),
        });
    }
    match catch_unwind(AssertUnwindSafe(|| apply(state, &outcome))) {
        Ok(Ok(())) => Ok(outcome),
        Ok(Err(e)) => Err(Error::Fold { partition, seq, detail: e.to_string() }),
        Err(panic) => Err(Error::Fold { partition, seq, detail: format!("apply panicked: {}", panic_message(&panic)) }),
    }
}

/// The latest snapshot of `partition`, if it can be used: made by this decider version, for this partition, at an
/// outcome the log holds (at or below `last`), and decodable. Anything else is ignored with a warning: a snapshot is
/// a cache, and the log is the truth. A log that is unavailable now is the one error: the caller tries again rather
/// than fold every outcome because of a leader election.
async fn usable_snapshot<L: Log>(
    log: &L,
    partition: u32,
    last: u64,
) -> Result<Option<(PartitionState, u64, Option<CommandId>)>, leasehold_log::Error> {
    let snapshot = match log.latest_snapshot(partition).await {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => return Ok(None),
        Err(e @ leasehold_log::Error::Unavailable(_)) => return Err(e),
        Err(e) => {
            tracing::warn!(partition, error = %e, "cannot read the snapshot; folding from the first outcome");
            return Ok(None);
        }
    };
    if snapshot.decider_version != DECIDER_VERSION || snapshot.partition != partition || snapshot.fence > last {
        tracing::warn!(
            partition,
            version = snapshot.decider_version,
            fence = snapshot.fence,
            "ignoring a snapshot of another decider version or beyond the log"
        );
        return Ok(None);
    }
    if snapshot.fence > 0 {
        // The outcome at the fence must be the one the snapshot was made after (a log recreated under a surviving
        // snapshot bucket has other outcomes there).
        let at_fence = log.read_outcomes(&OutcomeFilter::Partition(partition), snapshot.fence, 1).await;
        let matches = match at_fence {
            Ok(found) => found.first().is_some_and(|o| {
                o.seq == snapshot.fence && snapshot.last_command.as_ref().is_none_or(|id| *id == o.cmd_id)
            }),
            Err(e @ leasehold_log::Error::Unavailable(_)) => return Err(e),
            Err(_) => false,
        };
        if !matches {
            tracing::warn!(
                partition,
                fence = snapshot.fence,
                "ignoring a snapshot whose fence is not its outcome in the log"
            );
            return Ok(None);
        }
    }
    let state = match PartitionState::from_snapshot(&snapshot.state) {
        Ok(state) if state.partition() == partition && state.partitions() == log.partitions() => state,
        Ok(_) => {
            tracing::warn!(partition, "ignoring a snapshot of another partition");
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!(partition, error = %e, "ignoring a snapshot that does not decode");
            return Ok(None);
        }
    };
    let last_command = snapshot.last_command.as_deref().and_then(|id| id.parse::<CommandId>().ok());
    Ok(Some((state, snapshot.fence, last_command)))
}

/// The command log must be the one the outcomes answer: the command at the cursor (if the log still holds it) is
/// the one the last outcome names, and the log has not restarted below the cursor (a recreated or restored stream).
async fn check_command_log<L: Log>(log: &L, state: &PartitionState, answered: Option<CommandId>) -> Result<(), Error> {
    let cursor = state.cursor();
    if cursor == 0 {
        return Ok(());
    }
    let partition = state.partition();
    let mut tries = 0;
    let at_cursor = loop {
        match log.command_at(cursor).await {
            Err(leasehold_log::Error::Unavailable(why)) if tries < 10 => {
                tries += 1;
                tracing::warn!(partition, %why, "cannot read the command at the cursor; retrying");
                tokio::time::sleep(Duration::from_millis(50 * tries)).await;
            }
            other => break other?,
        }
    };
    match at_cursor {
        Some(command) => {
            let id = codec::decode_command(&command.payload).ok().map(|e| e.command_id);
            if answered.is_some() && id != answered {
                return Err(Error::CommandLogReplaced {
                    partition,
                    cursor,
                    detail: format!("the command at {cursor} is {id:?}, but the outcomes answer {answered:?} there"),
                });
            }
        }
        None => {
            let last = log.last_command_seq().await?;
            if last < cursor {
                return Err(Error::CommandLogReplaced {
                    partition,
                    cursor,
                    detail: format!("the command log ends at {last}, below the cursor"),
                });
            }
        }
    }
    Ok(())
}
