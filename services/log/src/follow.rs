//! Following outcomes by reading batches and waiting for the log to say something new landed.

use std::collections::VecDeque;
use std::future::Future;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::{Error, OutcomeFilter, StoredOutcome};

struct Follower<F> {
    filter: OutcomeFilter,
    next: u64,
    buffered: VecDeque<StoredOutcome>,
    changes: watch::Receiver<u64>,
    read: F,
    failed: bool,
}

/// A stream of the outcomes matching `filter` from `from` on: reads what is there with `read(filter, from)` (a
/// batch in order, empty when nothing more), then waits on `changes` (the last sequence landed) and reads again.
pub(crate) fn by_polling<F, Fut>(
    filter: OutcomeFilter,
    from: u64,
    changes: watch::Receiver<u64>,
    read: F,
) -> BoxStream<'static, Result<StoredOutcome, Error>>
where
    F: Fn(OutcomeFilter, u64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Vec<StoredOutcome>, Error>> + Send,
{
    let follower = Follower { filter, next: from.max(1), buffered: VecDeque::new(), changes, read, failed: false };
    futures::stream::unfold(follower, |mut f| async move {
        if f.failed {
            return None;
        }
        loop {
            if let Some(outcome) = f.buffered.pop_front() {
                return Some((Ok(outcome), f));
            }
            // Mark what we have seen before reading, so a landing during the read wakes the next wait.
            f.changes.borrow_and_update();
            match (f.read)(f.filter.clone(), f.next).await {
                Err(e) => {
                    f.failed = true;
                    return Some((Err(e), f));
                }
                Ok(batch) if !batch.is_empty() => {
                    f.next = batch.last().map_or(f.next, |o| o.seq + 1);
                    f.buffered.extend(batch);
                }
                Ok(_) => {
                    if f.changes.changed().await.is_err() {
                        f.failed = true;
                        return Some((Err(Error::Unavailable("the log was closed".to_owned())), f));
                    }
                }
            }
        }
    })
    .boxed()
}
