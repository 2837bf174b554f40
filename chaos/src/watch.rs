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
    /// The slowest decisions, slowest first: where to look in a kept run's logs (`--dir`).
    pub(crate) slowest: Vec<Slow>,
}

/// One slow decision: when its command was acknowledged (seconds since the producer started, the nemesis's clock
/// too), its partition and type, and how long its decision took to be seen.
#[derive(Debug, Serialize)]
pub(crate) struct Slow {
    pub(crate) acked_at_s: f64,
    pub(crate) partition: u32,
    #[serde(rename = "type")]
    pub(crate) type_name: String,
    pub(crate) latency_s: f64,
}

/// How many of the slowest decisions the summary names.
const SLOWEST: usize = 10;

pub(crate) fn latency(acked: &[Acked], seen: &Seen, bound: Duration, began: Instant) -> Latency {
    let seen = seen.0.lock().expect("the seen map");
    let mut decided: Vec<(f64, &Acked)> = Vec::new();
    let mut unseen = 0;
    for a in acked {
        match seen.get(&a.id) {
            Some(at) => decided.push((at.saturating_duration_since(a.at).as_secs_f64(), a)),
            None => unseen += 1,
        }
    }
    decided.sort_by(|a, b| b.0.total_cmp(&a.0));
    let slowest = decided
        .iter()
        .take(SLOWEST)
        .map(|(latency, a)| Slow {
            acked_at_s: a.at.saturating_duration_since(began).as_secs_f64(),
            partition: a.partition,
            type_name: a.type_name.clone(),
            latency_s: *latency,
        })
        .collect();
    let times: Vec<f64> = decided.iter().rev().map(|(latency, _)| *latency).collect();
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    Latency {
        bound_s: bound.as_secs_f64(),
        over_bound: times.iter().filter(|t| **t > bound.as_secs_f64()).count() as u64,
        unseen,
        p50_s: at(0.5),
        p99_s: at(0.99),
        max_s: times.last().copied().unwrap_or(0.0),
        slowest,
    }
}
