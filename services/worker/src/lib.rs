//! leasehold's writers (DESIGN section 3): a worker serves partitions, one writer per partition, each deciding its
//! partition's commands strictly in log order and appending the outcomes under the fence.
//!
//! - [`writer`]: one partition's writer: load, decide, append, reload on any unclean answer.
//! - [`run`]: a worker: it asks the log to own partitions, runs a writer on each one it gets, takes partitions
//!   nobody serves, and gives its partitions up on shutdown.
//! - `faults` (feature `fault-points` only, for the chaos harness): test-only faults injected in the writers.
//!
//! Ownership is for liveness; the fence is for safety: two writers that both believe they own a partition cannot
//! both append, and the loser reloads from the log.

#![forbid(unsafe_code)]

#[cfg(feature = "fault-points")]
pub mod faults;
pub mod metrics;
pub mod writer;

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_domain::WriterError;
use leasehold_log::{Log, Owner};
use tokio_util::sync::CancellationToken;

pub use metrics::WorkerMetrics;
pub use writer::{Counts, Folded, Stop, Writer, WriterConfig, admit, fold_outcome, fold_partition, fold_partition_to};

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
    #[error(
        "partition {partition}: the command at {seq} is written in schema version {version}, which is rolling out \
         and newer than this worker's ({reason}); the partition waits for a worker that knows it"
    )]
    NewerSchema { partition: u32, seq: u64, version: u16, reason: String },
    #[error("partition {partition}: its writer panicked outside the decider ({detail}); the partition stops")]
    Panicked { partition: u32, detail: String },
}

impl Error {
    /// A failure a later try may not meet (the log unreachable for a while): the partition is released and asked
    /// for again, not stopped.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Log(leasehold_log::Error::Unavailable(_) | leasehold_log::Error::Lost(_)) | Error::Behind { .. }
        )
    }
}

/// Settings of a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's name, unique among live workers.
    pub name: String,
    /// Which partitions it may serve (all when `None`).
    pub partitions: Option<Vec<u32>>,
    /// How often the worker looks again at who is alive and which partitions it should serve, at most (a twentieth
    /// of the log's worker time-to-live when that is sooner), and how long a partition another worker holds waits,
    /// at most, before it is asked for again.
    pub retry_own: Duration,
    /// A partition nobody serves for this long is taken by this worker whatever its share (default: twice the
    /// log's worker time-to-live, which on JetStream is `priority_timeout`).
    pub takeover_after: Option<Duration>,
    pub writer: WriterConfig,
}

impl WorkerConfig {
    pub fn new(name: impl Into<String>) -> Self {
        WorkerConfig {
            name: name.into(),
            partitions: None,
            retry_own: Duration::from_millis(500),
            takeover_after: None,
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

/// The worker a partition belongs to among `live` workers: the highest score of a hash of (worker, partition)
/// (rendezvous hashing), so each worker gets about `1 / live` of the partitions, and a worker joining or leaving
/// moves only the partitions it gains or loses.
pub fn preferred_worker(partition: u32, live: &[String]) -> Option<&str> {
    live.iter().max_by_key(|worker| (score(worker, partition), worker.as_str())).map(String::as_str)
}

/// A well-mixed 64-bit score of (worker, partition): FNV-1a of the name, then SplitMix64's finaliser with the
/// partition folded in (FNV alone spreads names that differ in one byte badly).
fn score(worker: &str, partition: u32) -> u64 {
    let name = worker.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let mut z = name ^ u64::from(partition).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Why this worker serves a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Its share: given up when the share moves to another worker.
    Share,
    /// Nobody served it for `takeover_after`: kept until shutdown (its preferred worker is alive but not serving).
    Adopted,
}

type PartitionTask = tokio::task::JoinHandle<(Counts, Result<Served, Error>)>;

/// How one try at serving a partition ended, short of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// Another worker holds it: asked again soon, then less and less often.
    NotOwned,
    /// Served until the hold was lost, the share moved or the worker stopped.
    Ended,
}

/// Runs a worker until `shutdown`. It says it is alive to the log, serves its share of the partitions among the
/// live workers (about `ceil(P / live)`), gives a partition up when the share moves to another worker, and takes
/// any partition nobody has served for `takeover_after`, whatever its share: a survivor takes everything. On
/// shutdown each writer finishes the command in hand and gives its partition up, and the worker says it leaves.
pub async fn run<L: Log>(log: L, config: WorkerConfig, shutdown: CancellationToken) -> Report {
    let all: Vec<u32> = config.partitions.clone().unwrap_or_else(|| (0..log.partitions()).collect());
    let takeover_after = config.takeover_after.unwrap_or(log.worker_ttl() * 2);
    // How often this worker looks: its `retry_own`, or a twentieth of the time-to-live when that is sooner, so that a
    // dead worker's partitions are asked for soon after it is seen gone.
    let tick = config.retry_own.min(log.worker_ttl() / 20).max(Duration::from_millis(10));
    let check_unserved = (takeover_after / 4).max(config.retry_own);
    let mut report = Report::default();
    let mut running: BTreeMap<u32, (Held, CancellationToken, PartitionTask)> = BTreeMap::new();
    let mut unserved_since: BTreeMap<u32, tokio::time::Instant> = BTreeMap::new();
    let mut live = vec![config.name.clone()];
    let mut last_unserved_check: Option<tokio::time::Instant> = None;
    // A partition whose writer gave up for a transient reason is asked for again after a pause that doubles.
    let mut not_before: BTreeMap<u32, (tokio::time::Instant, Duration)> = BTreeMap::new();
    loop {
        // Partitions whose writer ended: lost (asked again below), or stopped for good.
        let finished: Vec<u32> =
            running.iter().filter(|(_, (_, _, task))| task.is_finished()).map(|(p, _)| *p).collect();
        for partition in finished {
            let (_, _, task) = running.remove(&partition).expect("listed above");
            match task.await {
                Ok((counts, result)) => {
                    report.counts += counts;
                    match result {
                        Ok(Served::Ended) => {
                            not_before.remove(&partition);
                        }
                        Ok(Served::NotOwned) => {
                            // Held elsewhere (a dead worker's pin not yet expired, or a share not yet given up).
                            let pause = not_before.get(&partition).map_or(tick, |(_, p)| *p * 2).min(config.retry_own);
                            not_before.insert(partition, (tokio::time::Instant::now() + pause, pause));
                        }
                        Err(e) if e.is_transient() => {
                            let pause = not_before.get(&partition).map_or(config.retry_own, |(_, p)| *p * 2);
                            let pause = pause.min(Duration::from_secs(30));
                            tracing::warn!(partition, error = %e, "the partition's writer gave up for now; asking again in {pause:?}");
                            not_before.insert(partition, (tokio::time::Instant::now() + pause, pause));
                        }
                        Err(e) => {
                            if let Some(metrics) = &config.writer.metrics {
                                metrics.partition_stopped(partition, &e.to_string());
                            }
                            report.stopped.insert(partition, e);
                        }
                    }
                }
                Err(join) => {
                    tracing::error!(partition, error = %join, "a partition's writer panicked");
                    let e = Error::Panicked { partition, detail: join.to_string() };
                    if let Some(metrics) = &config.writer.metrics {
                        metrics.partition_stopped(partition, &e.to_string());
                    }
                    report.stopped.insert(partition, e);
                }
            }
        }
        if shutdown.is_cancelled() {
            break;
        }
        // Say this worker is alive and learn who else is, on every pass: the log says it is alive only a few times per
        // time-to-live however often it is asked, and answers from what it has seen (on JetStream, a watch).
        match log.workers(&config.name, true).await {
            Ok(mut now_live) => {
                if !now_live.contains(&config.name) {
                    now_live.push(config.name.clone());
                    now_live.sort();
                }
                if now_live != live {
                    tracing::info!(worker = %config.name, live = ?now_live, "live workers changed");
                }
                live = now_live;
            }
            Err(e) => tracing::warn!(worker = %config.name, error = %e, "cannot list the live workers"),
        }
        let now = tokio::time::Instant::now();
        let check = last_unserved_check.is_none_or(|at| now.duration_since(at) >= check_unserved);
        if check {
            last_unserved_check = Some(now);
        }
        // Whether the partitions this worker neither serves nor is given are served by anyone: asked all at once,
        // each with a deadline, giving way to a shutdown, so a slow log neither holds the shutdown up nor lets this
        // worker's liveness key expire while it asks.
        let mut served: BTreeMap<u32, Result<bool, leasehold_log::Error>> = BTreeMap::new();
        if check {
            let candidates: Vec<u32> = all
                .iter()
                .copied()
                .filter(|p| !report.stopped.contains_key(p) && !running.contains_key(p))
                .filter(|p| preferred_worker(*p, &live) != Some(config.name.as_str()))
                .collect();
            let asks = candidates.iter().map(|&p| {
                let log = log.clone();
                async move {
                    // Bounded well within a time-to-live: this worker says it is alive on the same loop.
                    let bound = (config.retry_own * 4).min(log.worker_ttl() / 4);
                    let answer = tokio::time::timeout(bound, log.is_served(p)).await;
                    (
                        p,
                        answer
                            .unwrap_or_else(|_| Err(leasehold_log::Error::Unavailable("no answer in time".to_owned()))),
                    )
                }
            });
            tokio::select! {
                biased;
                () = shutdown.cancelled() => continue,
                answers = futures::future::join_all(asks) => served.extend(answers),
            }
        }
        for &partition in &all {
            if report.stopped.contains_key(&partition) {
                continue;
            }
            let mine = preferred_worker(partition, &live) == Some(config.name.as_str());
            if let Some((held, token, _)) = running.get_mut(&partition) {
                if *held == Held::Adopted && mine {
                    // Adopted, and now this worker's share anyway: given up like any share when it moves.
                    *held = Held::Share;
                }
                if *held == Held::Share && !mine && !token.is_cancelled() {
                    tracing::info!(partition, worker = %config.name, "the partition's share moved: giving it up");
                    token.cancel();
                }
                continue;
            }
            if not_before.get(&partition).is_some_and(|(at, _)| now < *at) {
                continue;
            }
            let held = if mine {
                Some(Held::Share)
            } else if let Some(served) = served.remove(&partition) {
                match served {
                    Ok(true) => {
                        unserved_since.remove(&partition);
                        None
                    }
                    Ok(false) => {
                        let since = *unserved_since.entry(partition).or_insert(now);
                        (now.duration_since(since) >= takeover_after).then_some(Held::Adopted)
                    }
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "cannot tell whether the partition is served");
                        None
                    }
                }
            } else {
                None
            };
            if let Some(held) = held {
                if held == Held::Adopted {
                    tracing::warn!(partition, worker = %config.name, "nobody served the partition for {takeover_after:?}: taking it");
                }
                unserved_since.remove(&partition);
                let token = shutdown.child_token();
                let (log, config, stop) = (log.clone(), config.clone(), token.clone());
                // Tracked from now (asking), so a first look that just ended counts it as not loaded yet.
                let tracked = WorkerMetrics::track(config.writer.metrics.as_ref(), partition);
                let task = tokio::spawn(async move { serve_once(log, partition, &config, &stop, &tracked).await });
                running.insert(partition, (held, token, task));
            }
        }
        if let Some(metrics) = &config.writer.metrics {
            metrics.looked();
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => {}
            () = tokio::time::sleep(tick) => {}
        }
    }
    for (partition, (_, token, task)) in running {
        token.cancel();
        match task.await {
            Ok((counts, result)) => {
                report.counts += counts;
                match result {
                    Err(e) if !e.is_transient() => {
                        report.stopped.insert(partition, e);
                    }
                    _ => {}
                }
            }
            Err(join) => {
                report.stopped.insert(partition, Error::Panicked { partition, detail: join.to_string() });
            }
        }
    }
    if let Err(e) = log.workers(&config.name, false).await {
        tracing::warn!(worker = %config.name, error = %e, "cannot say this worker leaves");
    }
    report
}

/// Serves `partition` once: owns it if nobody else does, loads it, decides until `stop`, a lost hold or an error
/// that stops the partition.
async fn serve_once<L: Log>(
    log: L,
    partition: u32,
    config: &WorkerConfig,
    stop: &CancellationToken,
    tracked: &metrics::Tracked,
) -> (Counts, Result<Served, Error>) {
    let mut owner = match log.own(partition, &config.name).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return (Counts::default(), Ok(Served::NotOwned)),
        Err(e @ leasehold_log::Error::Unavailable(_)) => {
            tracing::warn!(partition, error = %e, "cannot ask for the partition now");
            return (Counts::default(), Ok(Served::NotOwned));
        }
        Err(e) => return (Counts::default(), Err(e.into())),
    };
    tracing::debug!(partition, worker = %config.name, "serving partition");
    tracked.set(metrics::Phase::Loading);
    let loading = tokio::time::Instant::now();
    // The hold is kept alive while the partition loads.
    let load = Writer::load(log.clone(), partition, config.writer.clone(), 0);
    tokio::pin!(load);
    let loaded = loop {
        tokio::select! {
            biased;
            loaded = &mut load => break loaded,
            () = tokio::time::sleep(config.writer.poll / 2) => {
                if let Err(e) = owner.keep_alive().await {
                    tracing::info!(partition, error = %e, "the hold was lost while loading");
                    return (Counts::default(), Ok(Served::Ended));
                }
            }
        }
    };
    let mut writer = match loaded {
        Ok(writer) => writer,
        Err(e) => {
            owner.release().await;
            return (Counts::default(), Err(e));
        }
    };
    tracing::info!(
        partition,
        worker = %config.name,
        fence = writer.fence(),
        elapsed_ms = loading.elapsed().as_millis() as u64,
        "partition loaded"
    );
    tracked.set(metrics::Phase::Serving);
    let result = writer.serve(&mut owner, stop).await;
    let counts = writer.counts();
    match result {
        Ok(Stop::Shutdown) => {
            owner.release().await;
            (counts, Ok(Served::Ended))
        }
        Ok(Stop::Lost) => {
            tracing::info!(partition, worker = %config.name, "another worker serves the partition now");
            (counts, Ok(Served::Ended))
        }
        Err(e) => {
            tracing::error!(partition, error = %e, "partition stopped");
            owner.release().await;
            (counts, Err(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("worker-{i}")).collect()
    }

    #[test]
    fn workers_spread_partitions_and_a_leaver_moves_only_its_own() {
        let live = names(4);
        let mut shares: BTreeMap<&str, u32> = BTreeMap::new();
        for p in 0..256 {
            *shares.entry(preferred_worker(p, &live).unwrap()).or_default() += 1;
        }
        assert_eq!(shares.len(), 4, "every worker gets a share: {shares:?}");
        assert!(shares.values().all(|n| (40..=90).contains(n)), "about a quarter each: {shares:?}");
        let fewer: Vec<String> = live.iter().filter(|w| *w != "worker-2").cloned().collect();
        for p in 0..256 {
            let before = preferred_worker(p, &live).unwrap();
            let after = preferred_worker(p, &fewer).unwrap();
            if before != "worker-2" {
                assert_eq!(before, after, "partition {p} moved though its worker stayed");
            }
        }
        assert_eq!(preferred_worker(3, &names(1)), Some("worker-0"), "a survivor takes everything");
        assert_eq!(preferred_worker(3, &[]), None);
    }
}
