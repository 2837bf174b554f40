//! What the writers of this process tell Prometheus: commands decided and rejected by type, how long a decision
//! takes from the command in hand to its outcome landed, how far behind the log's clock each partition is, dead
//! letters and reloads. Registered in the process's registry by `serve`; a writer without metrics records nothing.

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
}
