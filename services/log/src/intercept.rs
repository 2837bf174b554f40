//! A log with some of its calls intercepted, for tests and simulations: [`Intercepted`] delegates every call of the
//! [`Log`] trait to the log it wraps, except those its [`Intercept`] hooks take over (publishes, appends, reads of the
//! command at a sequence, snapshot stores and reads, outcome reads and follows, whether a partition is served,
//! ownership). A fault layer, a gate that holds an append, or a log whose reads fail for a while each write only
//! their hooks.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

use crate::{
    Appended, CommandRecord, DeadLetter, Error, Log, OutcomeFilter, OutcomeRecord, Owner, Publish, Published, Snapshot,
    StoredOutcome,
};

/// The calls an [`Intercepted`] log lets its hooks take over. Each default passes the call to the log.
pub trait Intercept<L: Log>: Clone + Send + Sync + 'static {
    /// The owner of a partition of the intercepted log (`L::Owner` for one that passes ownership through).
    type Owner: Owner;

    /// Asks `log` to serve `partition` (or stands for ownership some other way).
    fn own(
        &self,
        log: &L,
        partition: u32,
        worker: &str,
    ) -> impl Future<Output = Result<Option<Self::Owner>, Error>> + Send;

    fn publish_command(
        &self,
        log: &L,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> impl Future<Output = Result<Published, Error>> + Send {
        log.publish_command(subject, msg_id, payload)
    }

    fn publish_commands(
        &self,
        log: &L,
        commands: &[Publish],
    ) -> impl Future<Output = Vec<Result<Published, Error>>> + Send {
        log.publish_commands(commands)
    }

    fn follow(&self, log: &L, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        log.follow(filter, from)
    }

    fn append(
        &self,
        log: &L,
        partition: u32,
        fence: u64,
        records: &[OutcomeRecord],
    ) -> impl Future<Output = Appended> + Send {
        log.append(partition, fence, records)
    }

    fn command_at(&self, log: &L, seq: u64) -> impl Future<Output = Result<Option<CommandRecord>, Error>> + Send {
        log.command_at(seq)
    }

    fn latest_snapshot(&self, log: &L, partition: u32) -> impl Future<Output = Result<Option<Snapshot>, Error>> + Send {
        log.latest_snapshot(partition)
    }

    fn put_snapshot(&self, log: &L, snapshot: Snapshot) -> impl Future<Output = Result<(), Error>> + Send {
        log.put_snapshot(snapshot)
    }

    fn is_served(&self, log: &L, partition: u32) -> impl Future<Output = Result<bool, Error>> + Send {
        log.is_served(partition)
    }

    fn read_outcomes(
        &self,
        log: &L,
        filter: &OutcomeFilter,
        from: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<StoredOutcome>, Error>> + Send {
        log.read_outcomes(filter, from, max)
    }
}

/// `log` with the calls `hooks` take over.
#[derive(Debug, Clone)]
pub struct Intercepted<L, I> {
    pub log: L,
    pub hooks: I,
}

impl<L: Log, I: Intercept<L>> Log for Intercepted<L, I> {
    type Owner = I::Owner;

    fn partitions(&self) -> u32 {
        self.log.partitions()
    }

    async fn publish_command(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<Published, Error> {
        self.hooks.publish_command(&self.log, subject, msg_id, payload).await
    }

    async fn publish_commands(&self, commands: &[Publish]) -> Vec<Result<Published, Error>> {
        self.hooks.publish_commands(&self.log, commands).await
    }

    fn max_append_records(&self) -> usize {
        self.log.max_append_records()
    }

    async fn read_commands(&self, partition: u32, after: u64, max: usize) -> Result<Vec<CommandRecord>, Error> {
        self.log.read_commands(partition, after, max).await
    }

    async fn command_at(&self, seq: u64) -> Result<Option<CommandRecord>, Error> {
        self.hooks.command_at(&self.log, seq).await
    }

    async fn last_command_seq(&self) -> Result<u64, Error> {
        self.log.last_command_seq().await
    }

    async fn append(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        self.hooks.append(&self.log, partition, fence, records).await
    }

    async fn last_outcome_seq(&self, partition: u32) -> Result<u64, Error> {
        self.log.last_outcome_seq(partition).await
    }

    async fn read_outcomes(&self, filter: &OutcomeFilter, from: u64, max: usize) -> Result<Vec<StoredOutcome>, Error> {
        self.hooks.read_outcomes(&self.log, filter, from, max).await
    }

    fn follow(&self, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        self.hooks.follow(&self.log, filter, from)
    }

    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), Error> {
        self.log.dead_letter(letter).await
    }

    async fn read_dead_letters(&self, from: u64, max: usize) -> Result<Vec<(u64, DeadLetter)>, Error> {
        self.log.read_dead_letters(from, max).await
    }

    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), Error> {
        self.hooks.put_snapshot(&self.log, snapshot).await
    }

    async fn latest_snapshot(&self, partition: u32) -> Result<Option<Snapshot>, Error> {
        self.hooks.latest_snapshot(&self.log, partition).await
    }

    async fn workers(&self, worker: &str, alive: bool) -> Result<Vec<String>, Error> {
        self.log.workers(worker, alive).await
    }

    fn worker_ttl(&self) -> Duration {
        self.log.worker_ttl()
    }

    async fn is_served(&self, partition: u32) -> Result<bool, Error> {
        self.hooks.is_served(&self.log, partition).await
    }

    async fn own(&self, partition: u32, worker: &str) -> Result<Option<I::Owner>, Error> {
        self.hooks.own(&self.log, partition, worker).await
    }
}

/// Seeded randomness for fault layers and workloads (SplitMix64): small, and the same on every machine, so a failing
/// seed replays exactly.
#[derive(Debug, Clone)]
pub struct SeededRng(u64);

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        SeededRng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
