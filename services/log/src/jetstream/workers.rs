//! Live workers on JetStream: the `LH_WORKERS` key-value bucket, one key per worker, and what this process has seen
//! of it.
//!
//! A worker says it is alive by putting its key a few times per time-to-live (the bucket's `max_age`, its
//! creator's). Who else is alive comes from a watch on the bucket, kept by one task per process: every put it
//! delivers marks its worker seen, on this machine's monotonic clock, and a worker not seen for a time-to-live is
//! gone. That is how a survivor learns of a death within a time-to-live of the dead worker's last put, with nothing
//! listed: a listing of the bucket is a consumer made and read through, which costs the server more than the puts.
//!
//! The watch is trusted only while it is seen to flow: it must deliver this process's own put back within half a
//! time-to-live. When it does not (the connection away, the watch's consumer being recreated), the bucket is listed
//! instead and the watch started again, so a stalled watch never makes live workers look gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::stream::StorageType;
use bytes::Bytes;
use futures::StreamExt;
use tokio::time::Instant;

use super::{JetStream, WORKERS_BUCKET, unavailable};
use crate::Error;

/// The key-value bucket of live workers: a worker's key expires `ttl` after it last said it is alive.
/// `ttl` `None`: a client that has no say in it (the bucket's own, or the default if it must be created).
pub(super) async fn workers_bucket(js: &Context, replicas: usize, ttl: Option<Duration>) -> Result<kv::Store, Error> {
    let told = ttl.is_some();
    let ttl = ttl.unwrap_or(super::DEFAULT_PRIORITY_TIMEOUT);
    match js.get_key_value(WORKERS_BUCKET).await {
        Ok(store) => {
            // Its creator's time-to-live holds for everyone: say so when this process was started with another.
            if told
                && let Ok(status) = store.status().await
                && status.info.config.max_age != ttl
            {
                tracing::warn!(
                    bucket = WORKERS_BUCKET,
                    theirs = ?status.info.config.max_age,
                    ours = ?ttl,
                    "live workers expire after the bucket's time-to-live, not this process's --priority-timeout"
                );
            }
            return Ok(store);
        }
        Err(e) if e.kind() == async_nats::jetstream::context::KeyValueErrorKind::GetBucket => {}
        Err(e) => return Err(unavailable("cannot open the workers bucket", e)),
    }
    let config = kv::Config {
        bucket: WORKERS_BUCKET.to_owned(),
        description: "leasehold: live workers (a key expires when its worker stops saying it is alive)".to_owned(),
        history: 1,
        max_age: ttl,
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        Err(_) => {
            js.get_key_value(WORKERS_BUCKET).await.map_err(|e| unavailable("cannot create the workers bucket", e))
        }
    }
}

/// What this process has seen of the workers bucket.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Each worker's last put the watch delivered, on this machine's clock, with its revision (a key the watch found
    /// already there counts as seen when it was delivered, unless a watch before delivered the same revision: a
    /// restarted watch replays the bucket, and a dead worker's last put must not look new again).
    last_put: HashMap<String, (Instant, u64)>,
    /// The highest revision of the bucket the watch delivered.
    revision: u64,
    /// When this process's own last put was acknowledged (puts are spaced by it).
    own_put: Option<Instant>,
    /// The oldest of this process's puts the watch has not delivered back yet (when acknowledged, and its
    /// revision): kept until the watch delivers it, so a watch that stalls while the puts go on is found out. Judging
    /// by the last put alone could not: it is never older than an eighth of a time-to-live.
    unconfirmed: Option<(Instant, u64)>,
    /// The watch task, while one runs, and when it was started.
    watch: Option<(tokio::task::AbortHandle, Instant)>,
}

impl Drop for Seen {
    fn drop(&mut self) {
        if let Some((watch, _)) = self.watch.take() {
            watch.abort();
        }
    }
}

impl Seen {
    /// Whether the watch is to be believed: it runs, and every put of this process it has not delivered back yet is
    /// younger than half a time-to-live.
    fn flowing(&self, ttl: Duration, now: Instant) -> bool {
        let running = self.watch.as_ref().is_some_and(|(w, _)| !w.is_finished());
        running && self.unconfirmed.is_none_or(|(at, rev)| self.revision >= rev || now.duration_since(at) < ttl / 2)
    }

    /// Records this process's put of `revision`, acknowledged `at`.
    fn put(&mut self, at: Instant, revision: u64) {
        self.own_put = Some(at);
        if self.unconfirmed.is_none_or(|(_, rev)| self.revision >= rev) {
            self.unconfirmed = Some((at, revision));
        }
    }

    /// The workers seen within `ttl`, sorted.
    fn live(&self, ttl: Duration, now: Instant) -> Vec<String> {
        let mut live: Vec<String> = self
            .last_put
            .iter()
            .filter(|(_, (at, _))| now.duration_since(*at) < ttl)
            .map(|(name, _)| name.clone())
            .collect();
        live.sort();
        live
    }
}

/// Applies the watch's entries to `seen` until the watch ends (its task is then found finished and started again).
async fn watch(store: kv::Store, seen: Arc<Mutex<Seen>>) {
    let mut entries = match store.watch_with_history(">").await {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(error = %e, "cannot watch the live workers");
            return;
        }
    };
    while let Some(entry) = entries.next().await {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::debug!(error = %e, "the watch of the live workers ended");
                return;
            }
        };
        let now = Instant::now();
        let mut seen = seen.lock().expect("workers seen lock");
        seen.revision = seen.revision.max(entry.revision);
        match entry.operation {
            Operation::Put => {
                let known = seen.last_put.get(&entry.key).is_some_and(|(_, revision)| *revision == entry.revision);
                if !known {
                    seen.last_put.insert(entry.key, (now, entry.revision));
                }
            }
            Operation::Delete | Operation::Purge => {
                seen.last_put.remove(&entry.key);
            }
        }
    }
}

impl JetStream {
    /// [`crate::Log::workers`] on JetStream: puts `worker`'s key when `alive` (at most every eighth of a
    /// time-to-live: callers may ask often) or purges it, then answers from the watch, or from a listing while the
    /// watch is not seen to flow.
    pub(super) async fn live_workers(&self, worker: &str, alive: bool) -> Result<Vec<String>, Error> {
        let streams = self.streams()?;
        let (store, ttl) = (&streams.workers, streams.worker_ttl);
        let seen = &streams.workers_seen;
        let now = Instant::now();
        if alive {
            let due = seen.lock().expect("workers seen lock").own_put.is_none_or(|at| at + ttl / 8 <= now);
            if due {
                let revision = store
                    .put(worker, Bytes::from_static(b"alive"))
                    .await
                    .map_err(|e| unavailable("cannot say this worker is alive", e))?;
                seen.lock().expect("workers seen lock").put(Instant::now(), revision);
            }
        } else {
            store.purge(worker).await.map_err(|e| unavailable("cannot say this worker is leaving", e))?;
            let mut seen = seen.lock().expect("workers seen lock");
            seen.own_put = None;
            seen.unconfirmed = None;
            seen.last_put.remove(worker);
        }
        let now = Instant::now();
        {
            let mut seen = seen.lock().expect("workers seen lock");
            // Workers long gone are forgotten (the bucket expired their keys long ago, so no watch replays them).
            seen.last_put.retain(|_, (at, _)| now.duration_since(*at) < ttl * 4);
            if seen.flowing(ttl, now) {
                let mut live = seen.live(ttl, now);
                if alive && !live.iter().any(|w| w == worker) {
                    live.push(worker.to_owned());
                    live.sort();
                }
                return Ok(live);
            }
            // Not flowing: list this time, and start the watch again unless it ran for less than half a time-to-live
            // (a watch just started has had no time to deliver: restarting it on every look would never let one
            // catch up on a slow server).
            let young = seen
                .watch
                .as_ref()
                .is_some_and(|(w, started)| !w.is_finished() && now.duration_since(*started) < ttl / 2);
            if !young {
                if let Some((old, _)) = seen.watch.take() {
                    old.abort();
                }
                let task = tokio::spawn(watch(store.clone(), streams.workers_seen.clone()));
                seen.watch = Some((task.abort_handle(), now));
            }
        }
        let keys = store.keys().await.map_err(|e| unavailable("cannot list the workers", e))?;
        let mut workers: Vec<String> = keys
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| unavailable("cannot list the workers", e))?;
        workers.sort();
        Ok(workers)
    }
}

/// Whether `name` can name a worker: a key of the `LH_WORKERS` bucket (letters, digits, `-`, `_`, `=`, `/`, `.`,
/// not starting or ending with a dot). A name that is not would make every liveness put fail, and the worker would
/// act as if alone.
pub fn is_worker_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_=/.".contains(c);
    !name.is_empty() && name.chars().all(allowed) && !name.starts_with('.') && !name.ends_with('.')
}
