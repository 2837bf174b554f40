//! What the writers of this process tell Prometheus: commands decided and rejected by type, how long a decision
//! takes from the command in hand to its outcome landed, how far behind the log's clock each partition is, dead
//! letters and reloads. Registered in the process's registry by `serve`; a writer without metrics records nothing.
//! They also hold where each partition of the process stands (asked for, loading, serving): what `/readyz` waits on,
//! and what a stop cut short by its grace names as not given back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    /// The command's type name: `op.allocate`, `agent.sync`... (static: no allocation per decision)
    r#type: &'static str,
    /// `accepted` or `rejected`.
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabel {
    partition: u32,
}

/// The writers' metrics (cheap to share: every field is a handle on shared counters).
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    decided: Family<Decision, Counter>,
    decide_seconds: Histogram,
    lag_seconds: Family<PartitionLabel, Gauge<f64, AtomicU64>>,
    dead_letters: Counter,
    reloads: Counter,
    append_records: Histogram,
    stopped_gauge: Family<PartitionLabel, Gauge>,
    /// Partitions stopped on record (a broken chain, a newer decider...), with why: for `/healthz`.
    stopped: Arc<Mutex<BTreeMap<u32, String>>>,
    /// Where the partitions this process's writers were given stand: for `/readyz` and a stop cut short.
    phases: Arc<Mutex<Phases>>,
}

/// Where a partition given to this process's writers stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its writer asks the log for it (another worker may hold it).
    Asking,
    /// Held, and loading (snapshot and tail).
    Loading,
    /// Held and loaded: deciding.
    Serving,
}

#[derive(Debug, Default)]
pub(crate) struct Phases {
    /// The worker has looked at its share once (every partition of it was given a writer).
    looked: bool,
    of: BTreeMap<u32, Phase>,
}

/// A partition's entry in [`Phases`] for as long as its writer task lives: dropped with the task, whatever ends it.
#[derive(Debug)]
pub(crate) struct Tracked {
    phases: Option<Arc<Mutex<Phases>>>,
    partition: u32,
}

impl Tracked {
    pub(crate) fn set(&self, phase: Phase) {
        if let Some(phases) = &self.phases {
            lock(phases).of.insert(self.partition, phase);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(phases) = &self.phases {
            lock(phases).of.remove(&self.partition);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        // 100 µs to about 6.5 s, doubling.
        let buckets = prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 17);
        WorkerMetrics {
            decided: Family::default(),
            decide_seconds: Histogram::new(buckets),
            lag_seconds: Family::default(),
            dead_letters: Counter::default(),
            reloads: Counter::default(),
            // 1 to 1,024 records, doubling.
            append_records: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1.0, 2.0, 11)),
            stopped_gauge: Family::default(),
            stopped: Arc::default(),
            phases: Arc::default(),
        }
    }
}

impl WorkerMetrics {
    /// New metrics, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = WorkerMetrics::default();
        registry.register(
            "leasehold_commands_decided",
            "Commands decided by the writers of this process, by type and result",
            metrics.decided.clone(),
        );
        registry.register(
            "leasehold_decide_seconds",
            "From a command in hand to its outcome landed in the log (decide, apply, append)",
            metrics.decide_seconds.clone(),
        );
        registry.register(
            "leasehold_partition_lag_seconds",
            "How far behind the log's clock a partition's writer is: now minus the log time of the command it last \
             decided",
            metrics.lag_seconds.clone(),
        );
        registry.register(
            "leasehold_dead_letters",
            "Commands this process's writers sent to the dead letters",
            metrics.dead_letters.clone(),
        );
        registry.register(
            "leasehold_writer_reloads",
            "Partition reloads after an unclean append",
            metrics.reloads.clone(),
        );
        registry.register(
            "leasehold_writer_append_records",
            "Outcome records per append (group commit: every command waiting goes out in one append)",
            metrics.append_records.clone(),
        );
        registry.register(
            "leasehold_partition_stopped",
            "1 for a partition this process's writers stopped on record (it needs an operator)",
            metrics.stopped_gauge.clone(),
        );
        metrics
    }

    pub(crate) fn decided(&self, type_name: &'static str, rejected: bool, took: Duration) {
        let result = if rejected { "rejected" } else { "accepted" };
        self.decided.get_or_create(&Decision { r#type: type_name, result }).inc();
        self.decide_seconds.observe(took.as_secs_f64());
    }

    pub(crate) fn lag(&self, partition: u32, seconds: f64) {
        self.lag_seconds.get_or_create(&PartitionLabel { partition }).set(seconds.max(0.0));
    }

    /// The last lag (seconds) the writers of this process measured on `partition`: how long the last command they
    /// decided there had waited since its log time (0 once they are idle); `None` where they never served it.
    pub fn lag_seconds(&self, partition: u32) -> Option<f64> {
        self.lag_seconds.get(&PartitionLabel { partition }).map(|gauge| gauge.get())
    }

    pub(crate) fn appended(&self, records: usize) {
        self.append_records.observe(records as f64);
    }

    pub(crate) fn dead_lettered(&self) {
        self.dead_letters.inc();
    }

    pub(crate) fn reloaded(&self) {
        self.reloads.inc();
    }

    pub(crate) fn partition_stopped(&self, partition: u32, why: &str) {
        self.stopped_gauge.get_or_create(&PartitionLabel { partition }).set(1);
        self.stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(partition, why.to_owned());
    }

    /// The partitions stopped on record, with why.
    pub fn stopped(&self) -> Vec<(u32, String)> {
        let stopped = self.stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        stopped.iter().map(|(p, why)| (*p, why.clone())).collect()
    }

    /// What keeps the writers from being ready, or `None` once they have looked at their share and every partition
    /// they asked for is either loaded or another worker's. A partition taken over later (a worker left) makes
    /// them wait again while it loads.
    pub fn waiting_on(&self) -> Option<String> {
        let phases = lock(&self.phases);
        if !phases.looked {
            return Some("looking for its share of the partitions".to_owned());
        }
        let pending = |wanted: Phase| phases.of.iter().filter(|(_, p)| **p == wanted).map(|(p, _)| *p).collect();
        let (asking, loading): (Vec<u32>, Vec<u32>) = (pending(Phase::Asking), pending(Phase::Loading));
        let mut waits = Vec::new();
        if !loading.is_empty() {
            waits.push(format!("loading partition(s) {}", ranges(&loading)));
        }
        if !asking.is_empty() {
            waits.push(format!("asking the log for partition(s) {}", ranges(&asking)));
        }
        (!waits.is_empty()).then(|| waits.join("; "))
    }

    /// The partitions the writers hold now (loading or serving): those not given back if the process ended now.
    pub fn held(&self) -> Vec<u32> {
        lock(&self.phases).of.iter().filter(|(_, p)| **p != Phase::Asking).map(|(p, _)| *p).collect()
    }

    /// A partition's entry, [`Phase::Asking`] until its writer says more, removed when the returned value drops.
    pub(crate) fn track(metrics: Option<&WorkerMetrics>, partition: u32) -> Tracked {
        let phases = metrics.map(|m| m.phases.clone());
        let tracked = Tracked { phases, partition };
        tracked.set(Phase::Asking);
        tracked
    }

    /// The worker has given every partition of its first share a writer.
    pub(crate) fn looked(&self) {
        lock(&self.phases).looked = true;
    }
}

/// Partitions as ranges: `0-3, 7, 9-10`.
pub fn ranges(partitions: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = partitions.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        out.push(if end == start { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writers_are_ready_once_their_share_is_loaded() {
        let metrics = WorkerMetrics::default();
        assert_eq!(metrics.waiting_on().as_deref(), Some("looking for its share of the partitions"));
        let (zero, one, two) = (
            WorkerMetrics::track(Some(&metrics), 0),
            WorkerMetrics::track(Some(&metrics), 1),
            WorkerMetrics::track(Some(&metrics), 2),
        );
        metrics.looked();
        zero.set(Phase::Loading);
        one.set(Phase::Loading);
        assert_eq!(
            metrics.waiting_on().as_deref(),
            Some("loading partition(s) 0-1; asking the log for partition(s) 2")
        );
        assert_eq!(metrics.held(), [0, 1]);
        zero.set(Phase::Serving);
        drop(one);
        drop(two);
        assert_eq!(metrics.waiting_on(), None, "another worker's partitions are not waited for");
        assert_eq!(metrics.held(), [0]);
        drop(zero);
        assert!(metrics.held().is_empty(), "a partition given back is not held");
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
    }
}
