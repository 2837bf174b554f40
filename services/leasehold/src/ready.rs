//! What the roles of a `serve` process wait on before they are ready (`/readyz`), and above all what the gateway
//! waits on before it takes commands: the policy stored in every partition (each partition decides in log order, so
//! a command stored after it is decided under it) and the projector caught up to the end the outcome log had when the
//! process started (the read models it answers from are then as of the start, not older).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold_log::Log;
use leasehold_worker::metrics::ranges;
use tokio_util::sync::CancellationToken;

/// The end of the outcome log when the process started (the last outcome of any partition), once read.
pub(crate) type LogEnd = Arc<OnceLock<u64>>;

/// Reads where the outcome log ends into `end`, trying again (every second) while the log does not answer, until
/// `shutdown`.
pub(crate) async fn read_log_end<L: Log>(log: &L, end: &LogEnd, shutdown: &CancellationToken) {
    loop {
        let mut last = Ok(0);
        for partition in 0..log.partitions() {
            last = match (last, log.last_outcome_seq(partition).await) {
                (Ok(max), Ok(seq)) => Ok(max.max(seq)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        match last {
            Ok(seq) => {
                let _ = end.set(seq);
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot read where the outcome log ends; asking again"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The projector is ready once it has applied the outcomes the log held when the process started.
#[derive(Debug, Clone)]
pub(crate) struct ProjectorWaits {
    pub(crate) end: LogEnd,
    pub(crate) applied: tokio::sync::watch::Receiver<u64>,
}

impl ProjectorWaits {
    pub(crate) fn waiting_on(&self) -> Option<String> {
        let Some(&end) = self.end.get() else { return Some("reading where the outcome log ends".to_owned()) };
        let applied = *self.applied.borrow();
        (applied < end).then(|| {
            format!("catching up: outcome {applied} applied of {end}, where the log ended when this process started")
        })
    }
}

/// What the gateway waits on before it takes commands. Once ready, it stays ready (the policy stays stored, the
/// projector only moves on).
#[derive(Debug, Clone)]
pub(crate) struct GatewayWaits(Arc<GatewayInner>);

#[derive(Debug)]
struct GatewayInner {
    partitions: u32,
    /// Whether this process seeds the policy (it runs the worker role, whose user may publish on the settings
    /// subjects).
    seeds: bool,
    /// Partitions whose policy this process found recorded or stored its policy command in.
    stored: Mutex<BTreeSet<u32>>,
    projector: ProjectorWaits,
    reader: leasehold_projector::Reader,
    ready: AtomicBool,
}

impl GatewayWaits {
    pub(crate) fn new(
        partitions: u32,
        seeds: bool,
        projector: ProjectorWaits,
        reader: leasehold_projector::Reader,
    ) -> Self {
        GatewayWaits(Arc::new(GatewayInner {
            partitions,
            seeds,
            stored: Mutex::default(),
            projector,
            reader,
            ready: AtomicBool::new(false),
        }))
    }

    /// This process found a policy recorded in `partition`, or stored its policy command there.
    pub(crate) fn stored(&self, partition: u32) {
        self.0.stored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(partition);
    }

    pub(crate) fn waiting_on(&self) -> Option<String> {
        let inner = &self.0;
        if inner.ready.load(Ordering::Acquire) {
            return None;
        }
        let mut waits = Vec::new();
        let missing = self.policy_missing();
        if !missing.is_empty() {
            waits.push(if inner.seeds {
                format!("storing the policy commands of partition(s) {} (this process seeds them)", ranges(&missing))
            } else {
                format!(
                    "a policy recorded in partition(s) {}: this process runs no worker role, so it seeds none; a \
                     worker's `serve` seeds it",
                    ranges(&missing)
                )
            });
        }
        if let Some(projector) = inner.projector.waiting_on() {
            waits.push(format!("the projector: {projector}"));
        }
        if waits.is_empty() {
            inner.ready.store(true, Ordering::Release);
            return None;
        }
        Some(waits.join("; "))
    }

    /// The partitions whose policy is neither stored by this process nor recorded in the projection (by any
    /// process, at any time: `serve` seeds once per log, `policy set` changes it).
    fn policy_missing(&self) -> Vec<u32> {
        let inner = &self.0;
        let stored = inner.stored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let missing: Vec<u32> = (0..inner.partitions).filter(|p| !stored.contains(p)).collect();
        if missing.is_empty() {
            return missing;
        }
        match inner.reader.policies() {
            Ok(views) => {
                let recorded: BTreeSet<u32> = views.iter().filter(|v| v.recorded).map(|v| v.partition).collect();
                missing.into_iter().filter(|p| !recorded.contains(p)).collect()
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the recorded policies from the projection");
                missing
            }
        }
    }
}

/// An in-process agent is ready once its registration is decided.
pub(crate) fn agent_waiting_on(control: &leasehold_agent::AgentControl) -> Option<String> {
    control.status().epoch.is_none().then(|| "registering".to_owned())
}
