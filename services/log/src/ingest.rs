//! Batched ingest: commands published one by one by concurrent callers (the gateway's requests) go to the log
//! together, through [`Log::publish_commands`].
//!
//! One batch is in flight at a time and the next one is whatever arrived meanwhile, as with a writer's group
//! commit: a lone command costs one publish round trip, and under load the batches grow (up to `max`) so the log
//! pays one fsync per batch instead of one per command. Each command keeps its own id, dedupe and answer.

use tokio::sync::{mpsc, oneshot};

use crate::{Error, Log, Publish, Published};

type Waiting = (Publish, oneshot::Sender<Result<Published, Error>>);

/// A handle on the task that publishes in batches. Cheap to clone; the task ends when the last handle is dropped,
/// after publishing what was queued.
#[derive(Debug, Clone)]
pub struct Ingest {
    queue: mpsc::Sender<Waiting>,
}

impl Ingest {
    /// Starts the batching task on the current runtime: at most `max` commands per batch (1 publishes each alone).
    pub fn start<L: Log>(log: L, max: usize) -> Ingest {
        let max = max.max(1);
        let (queue, mut waiting) = mpsc::channel::<Waiting>(max * 4);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(max);
            while waiting.recv_many(&mut batch, max).await > 0 {
                let (commands, answers): (Vec<Publish>, Vec<_>) = batch.drain(..).unzip();
                let published = log.publish_commands(&commands).await;
                for (answer, to) in published.into_iter().zip(answers) {
                    // A caller that went away (a dropped request) needs no answer: its command is published all
                    // the same, as it would be had it been sent alone.
                    let _ = to.send(answer);
                }
            }
        });
        Ingest { queue }
    }

    /// Publishes one command with whatever others are waiting; answers as [`Log::publish_command`] does.
    pub async fn publish(&self, command: Publish) -> Result<Published, Error> {
        let (to, answer) = oneshot::channel();
        self.queue
            .send((command, to))
            .await
            .map_err(|_| Error::Unavailable("the ingest task has stopped".to_owned()))?;
        answer.await.map_err(|_| Error::Unavailable("the ingest task stopped before answering".to_owned()))?
    }
}

#[cfg(all(test, feature = "embedded"))]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::embedded::{Embedded, system_clock};

    /// Counts the batches published.
    #[derive(Debug, Clone, Default)]
    struct Batches(std::sync::Arc<std::sync::Mutex<Vec<usize>>>);

    impl crate::intercept::Intercept<Embedded> for Batches {
        type Owner = crate::embedded::EmbeddedOwner;

        async fn own(&self, log: &Embedded, partition: u32, worker: &str) -> Result<Option<Self::Owner>, Error> {
            log.own(partition, worker).await
        }

        async fn publish_commands(&self, log: &Embedded, commands: &[Publish]) -> Vec<Result<Published, Error>> {
            self.0.lock().unwrap().push(commands.len());
            log.publish_commands(commands).await
        }
    }

    /// Concurrent callers are answered each with their own command's sequence, and gathered into fewer publishes.
    #[tokio::test]
    async fn concurrent_publishes_are_answered_each() {
        let log = Embedded::in_memory(2, system_clock()).unwrap();
        let batches = Batches::default();
        let ingest = Ingest::start(crate::intercept::Intercepted { log: log.clone(), hooks: batches.clone() }, 64);
        let calls: Vec<_> = (0..200)
            .map(|i| {
                let ingest = ingest.clone();
                tokio::spawn(async move {
                    let command = Publish {
                        subject: format!("lh.in.op.k{}._", i % 7),
                        msg_id: format!("id-{}", i % 150),
                        payload: Bytes::from(format!("{i}")),
                    };
                    (i, ingest.publish(command).await.expect("published"))
                })
            })
            .collect();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        let fresh: Vec<_> = answers.iter().filter(|(_, p)| !p.duplicate).collect();
        assert_eq!(fresh.len(), 150, "each id stored once");
        for (i, published) in &answers {
            let stored = log.command_at(published.seq).await.unwrap().expect("stored");
            // The first copy of each id holds its payload; a duplicate names it.
            let first: u64 = String::from_utf8_lossy(&stored.payload).parse().unwrap();
            assert_eq!(first % 150, (*i as u64) % 150);
        }
        let sizes = batches.0.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 200);
        assert!(sizes.len() < 200 && sizes.iter().all(|n| *n <= 64), "gathered into batches of at most 64: {sizes:?}");
    }
}
