//! Dead letters as the gateway shows them: read from the log's dead-letter stream as it grows, indexed by the
//! command log sequence they came from and by command id (the one the letter records: read from its payload, or
//! only the message id its producer published it under, unverified), whether or not its bytes were kept.

use std::collections::HashMap;

use leasehold_log::Log;
use serde::Serialize;
use tokio::sync::Mutex;

/// A dead letter, in JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct DeadView {
    /// Its sequence in the dead-letter log.
    pub seq: u64,
    pub partition: u32,
    /// The command log sequence it was stored at.
    pub source_seq: u64,
    /// The subject it was stored on.
    pub subject: String,
    pub reason: String,
    /// The command id: the one its payload's header names, else the `Nats-Msg-Id` its producer published it under.
    pub command_id: Option<String>,
    /// The payload itself names `command_id`. False: it names none, and `command_id` (if any) is only its
    /// producer's word.
    pub id_verified: bool,
    /// Its size in bytes.
    pub bytes: usize,
}

/// The dead letters read so far (they are few: a dead letter is a bug or a bad producer).
#[derive(Debug, Default)]
pub(crate) struct DeadLetters {
    inner: Mutex<Index>,
}

#[derive(Debug, Default)]
struct Index {
    /// The next dead-letter sequence to read.
    next: u64,
    all: Vec<DeadView>,
    by_source: HashMap<u64, usize>,
    by_command: HashMap<String, usize>,
    /// When the log was last read: many requests waiting at once read it at most every [`FRESH`].
    read_at: Option<tokio::time::Instant>,
}

const FRESH: std::time::Duration = std::time::Duration::from_millis(100);

const BATCH: usize = 1000;

impl DeadLetters {
    /// Reads the dead letters that arrived since the last call.
    async fn refresh<L: Log>(&self, log: &L, index: &mut Index) -> Result<(), leasehold_log::Error> {
        if index.read_at.is_some_and(|at| at.elapsed() < FRESH) {
            return Ok(());
        }
        index.read_at = Some(tokio::time::Instant::now());
        loop {
            let batch = log.read_dead_letters(index.next.max(1), BATCH).await?;
            let Some((last, _)) = batch.last() else { return Ok(()) };
            index.next = last + 1;
            for (seq, letter) in batch {
                let view = DeadView {
                    seq,
                    partition: letter.partition,
                    source_seq: letter.source_seq,
                    subject: letter.source_subject.clone(),
                    reason: letter.reason.clone(),
                    command_id: letter.command_id.as_ref().map(|id| id.id.clone()),
                    id_verified: letter.command_id.as_ref().is_some_and(|id| id.verified),
                    bytes: letter.payload.len(),
                };
                let at = index.all.len();
                index.by_source.insert(view.source_seq, at);
                if let Some(id) = &view.command_id {
                    // The first letter of an id, unless a later one's payload names it and the first's does not.
                    let replaces = |earlier: usize| view.id_verified && !index.all[earlier].id_verified;
                    match index.by_command.get(id) {
                        Some(&earlier) if !replaces(earlier) => {}
                        _ => {
                            index.by_command.insert(id.clone(), at);
                        }
                    }
                }
                index.all.push(view);
            }
        }
    }

    /// Every dead letter from dead-letter sequence `from`, at most `max`.
    pub(crate) async fn list<L: Log>(
        &self,
        log: &L,
        from: u64,
        max: usize,
    ) -> Result<Vec<DeadView>, leasehold_log::Error> {
        let mut index = self.inner.lock().await;
        self.refresh(log, &mut index).await?;
        Ok(index.all.iter().filter(|d| d.seq >= from).take(max).cloned().collect())
    }

    /// How many dead letters there are, and the latest `max` of them, newest first.
    pub(crate) async fn latest<L: Log>(
        &self,
        log: &L,
        max: usize,
    ) -> Result<(usize, Vec<DeadView>), leasehold_log::Error> {
        let mut index = self.inner.lock().await;
        self.refresh(log, &mut index).await?;
        Ok((index.all.len(), index.all.iter().rev().take(max).cloned().collect()))
    }

    /// The dead letter of the command stored at `source_seq`, if it was dead-lettered.
    pub(crate) async fn by_source<L: Log>(
        &self,
        log: &L,
        source_seq: u64,
    ) -> Result<Option<DeadView>, leasehold_log::Error> {
        let mut index = self.inner.lock().await;
        self.refresh(log, &mut index).await?;
        Ok(index.by_source.get(&source_seq).map(|at| index.all[*at].clone()))
    }

    /// The dead letter of command `id`, if it was dead-lettered.
    pub(crate) async fn by_command<L: Log>(&self, log: &L, id: &str) -> Result<Option<DeadView>, leasehold_log::Error> {
        let mut index = self.inner.lock().await;
        self.refresh(log, &mut index).await?;
        Ok(index.by_command.get(id).map(|at| index.all[*at].clone()))
    }
}
