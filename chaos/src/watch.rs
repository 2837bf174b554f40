//! Liveness as a client sees it: a follower of every outcome notes when it first saw each command's decision, and
//! the time from a command's ack to that moment is its decision latency. A follower that loses its server follows
//! again from the last outcome it saw, so it may see a decision late: the figures are bounds from above.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_log::jetstream::JetStream;
use leasehold_log::{Log, OutcomeFilter};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::producer::Acked;

/// When each command's first outcome was seen.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen(Arc<Mutex<HashMap<String, Instant>>>);

impl Seen {
    /// Waits until every command of `decided` has been seen, at most `limit`.
    pub(crate) async fn caught_up<'a>(&self, decided: impl Iterator<Item = &'a Acked>, limit: Duration) {
        let ids: Vec<&str> = decided.map(|a| a.id.as_str()).collect();
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            let all = {
                let seen = self.0.lock().expect("the seen map");
                ids.iter().all(|id| seen.contains_key(*id))
            };
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Follows every outcome from the log's start until `stop`.
pub(crate) async fn watch(log: JetStream, seen: Seen, stop: CancellationToken) {
    let mut from = 1;
    while !stop.is_cancelled() {
        let mut outcomes = log.follow(OutcomeFilter::All, from);
        loop {
            let next = tokio::select! {
                next = outcomes.next() => next,
                () = stop.cancelled() => return,
            };
            match next {
                Some(Ok(outcome)) => {
                    from = outcome.seq + 1;
                    seen.0.lock().expect("the seen map").entry(outcome.cmd_id).or_insert_with(Instant::now);
                }
                Some(Err(_)) | None => break,
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// The decision latencies of the acknowledged commands.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) bound_s: f64,
    /// Acknowledged commands whose decision was seen later than the bound after their ack.
    pub(crate) over_bound: u64,
    /// Acknowledged commands whose decision the follower never saw.
    pub(crate) unseen: u64,
    pub(crate) p50_s: f64,
    pub(crate) p99_s: f64,
    pub(crate) max_s: f64,
}

pub(crate) fn latency(acked: &[Acked], seen: &Seen, bound: Duration) -> Latency {
    let seen = seen.0.lock().expect("the seen map");
    let mut times: Vec<f64> = Vec::new();
    let mut unseen = 0;
    for a in acked {
        match seen.get(&a.id) {
            Some(at) => times.push(at.saturating_duration_since(a.at).as_secs_f64()),
            None => unseen += 1,
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    Latency {
        bound_s: bound.as_secs_f64(),
        over_bound: times.iter().filter(|t| **t > bound.as_secs_f64()).count() as u64,
        unseen,
        p50_s: at(0.5),
        p99_s: at(0.99),
        max_s: times.last().copied().unwrap_or(0.0),
    }
}
