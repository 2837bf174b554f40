//! leasehold's writers (DESIGN section 3): a worker serves partitions, one writer per partition, each deciding its
//! partition's commands strictly in log order and appending the outcomes under the fence.
//!
//! - [`writer`]: one partition's writer: load, decide, append, reload on any unclean answer.
//! - [`run`]: a worker: it asks the log to own partitions, runs a writer on each one it gets, takes partitions
//!   nobody serves, and gives its partitions up on shutdown.
//!
//! Ownership is for liveness; the fence is for safety: two writers that both believe they own a partition cannot
//! both append, and the loser reloads from the log.

#![forbid(unsafe_code)]

pub mod writer;

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_domain::WriterError;
use leasehold_log::{Log, Owner};
use tokio_util::sync::CancellationToken;

pub use writer::{Counts, Folded, Stop, Writer, WriterConfig, admit, fold_partition};

/// What stops a partition: a retry cannot mend it, an operator must look.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Log(#[from] leasehold_log::Error),
    #[error(
        "partition {partition}: the outcome at {seq} says the one before it is at {prev_seq}, but it is at \
         {expected}: the chain of outcomes is broken (an append outside the fence?); the partition stops"
    )]
    ChainBroken { partition: u32, seq: u64, prev_seq: u64, expected: u64 },
    #[error("partition {partition}: the outcome at {seq} cannot be read: {detail}; the partition stops")]
    Undecodable { partition: u32, seq: u64, detail: String },
    #[error(
        "partition {partition}: the outcome at {seq} was decided by decider version {version}, newer than this \
         worker's {}; upgrade this worker",
        leasehold_domain::DECIDER_VERSION
    )]
    NewerDecider { partition: u32, seq: u64, version: u32 },
    #[error("partition {partition}: the outcome at {seq} does not fold: {detail}; the partition stops")]
    Fold { partition: u32, seq: u64, detail: String },
    #[error(
        "partition {partition}: the command log is not the one the outcomes answer (cursor {cursor}): {detail}; \
         was LH_CMD recreated or restored? The partition stops"
    )]
    CommandLogReplaced { partition: u32, cursor: u64, detail: String },
    #[error("partition {partition}: the log shows outcomes up to {reached} only, but {wanted} was named; giving up")]
    Behind { partition: u32, reached: u64, wanted: u64 },
    #[error("partition {partition}: the writer asked the decider out of order: {error}")]
    Writer { partition: u32, error: WriterError },
    #[error("outcome of command {cmd_seq} does not encode: {detail}")]
    Encode { cmd_seq: u64, detail: String },
    #[error("partition {partition}: command {cmd_seq} cannot even get an internal-error outcome: {detail}")]
    Poisoned { partition: u32, cmd_seq: u64, detail: String },
}

/// Settings of a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's name, unique among live workers.
    pub name: String,
    /// Which partitions it may serve (all when `None`).
    pub partitions: Option<Vec<u32>>,
    /// How often a partition it does not hold is asked for again.
    pub retry_own: Duration,
    pub writer: WriterConfig,
}

impl WorkerConfig {
    pub fn new(name: impl Into<String>) -> Self {
        WorkerConfig {
            name: name.into(),
            partitions: None,
            retry_own: Duration::from_millis(500),
            writer: WriterConfig::default(),
        }
    }
}

/// How a worker's partitions ended.
#[derive(Debug, Default)]
pub struct Report {
    /// Partitions stopped by an error a retry cannot mend, with the error.
    pub stopped: BTreeMap<u32, Error>,
    /// What the writers did, summed.
    pub counts: Counts,
}

/// Runs a worker until `shutdown`: every partition it may serve is asked for, served while held, and asked for
/// again when lost. On shutdown each writer finishes the command in hand and gives its partition up.
pub async fn run<L: Log>(log: L, config: WorkerConfig, shutdown: CancellationToken) -> Report {
    let partitions: Vec<u32> = config.partitions.clone().unwrap_or_else(|| (0..log.partitions()).collect());
    let mut tasks = tokio::task::JoinSet::new();
    for partition in partitions {
        let (log, config, shutdown) = (log.clone(), config.clone(), shutdown.clone());
        tasks.spawn(async move { (partition, serve_partition(log, partition, &config, &shutdown).await) });
    }
    let mut report = Report::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((partition, (counts, result))) => {
                add_counts(&mut report.counts, counts);
                if let Err(e) = result {
                    report.stopped.insert(partition, e);
                }
            }
            Err(join) => tracing::error!(error = %join, "a partition task failed"),
        }
    }
    report
}

fn add_counts(sum: &mut Counts, more: Counts) {
    sum.decided += more.decided;
    sum.parts += more.parts;
    sum.answered_from_log += more.answered_from_log;
    sum.unchanged += more.unchanged;
    sum.dead_lettered += more.dead_lettered;
    sum.reloads += more.reloads;
    sum.busy_retries += more.busy_retries;
    sum.internal_errors += more.internal_errors;
    sum.snapshots += more.snapshots;
}

/// Serves one partition whenever this worker holds it, until shutdown or an error that stops the partition.
pub async fn serve_partition<L: Log>(
    log: L,
    partition: u32,
    config: &WorkerConfig,
    shutdown: &CancellationToken,
) -> (Counts, Result<(), Error>) {
    let mut counts = Counts::default();
    loop {
        if shutdown.is_cancelled() {
            return (counts, Ok(()));
        }
        let owner = match log.own(partition, &config.name).await {
            Ok(Some(owner)) => owner,
            Ok(None) => {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return (counts, Ok(())),
                    () = tokio::time::sleep(config.retry_own) => continue,
                }
            }
            Err(leasehold_log::Error::Unavailable(why)) => {
                tracing::warn!(partition, %why, "cannot ask for the partition now");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return (counts, Ok(())),
                    () = tokio::time::sleep(config.retry_own) => continue,
                }
            }
            Err(e) => return (counts, Err(e.into())),
        };
        let mut owner = owner;
        tracing::info!(partition, worker = %config.name, "serving partition");
        // The hold is kept while the partition loads.
        let mut writer = match Writer::load(log.clone(), partition, config.writer.clone(), 0).await {
            Ok(writer) => writer,
            Err(e) => {
                owner.release().await;
                return (counts, Err(e));
            }
        };
        let result = writer.serve(&mut owner, shutdown).await;
        add_counts(&mut counts, writer.counts());
        match result {
            Ok(Stop::Shutdown) => {
                owner.release().await;
                return (counts, Ok(()));
            }
            Ok(Stop::Lost) => {
                tracing::info!(partition, worker = %config.name, "another worker serves the partition now");
            }
            Err(e) => {
                tracing::error!(partition, error = %e, "partition stopped");
                owner.release().await;
                return (counts, Err(e));
            }
        }
    }
}
