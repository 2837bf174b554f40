//! Ownership of a partition: the writer consumer, its pin, and [`JetStreamOwner`], which pulls it by hand.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PriorityPolicy};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::{StatusCode, Subject};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use leasehold_schemas::Timestamp;
use leasehold_schemas::subjects::{command_filter, outcome_filter};
use tokio::time::Instant;

use super::read::{DIRECT_BATCH, command_record, header};
use super::{CMD_STREAM, EVT_STREAM, JetStream, WRITER_GROUP, unavailable, writer_consumer};
use crate::reading::{Delivery, Next, Reader, read_by_sequence};
use crate::{CommandRecord, Error, Log, Owner};

/// The most deliveries one pull of a writer consumer asks for.
const PULL_BATCH: usize = 512;
/// Pulls a writer keeps waiting at once: the next is sent when what the waiting ones may still bring falls below a
/// pull's batch, so deliveries keep coming while the writer decides and appends.
const PULLS_IN_FLIGHT: usize = 2;
/// Deliveries a writer consumer sends before it waits for an ack: a few rounds of the largest append.
const MAX_ACK_PENDING: i64 = 4 * crate::MAX_APPEND_RECORDS as i64;

pub(super) fn pinned_client(info: &consumer::Info) -> Option<&str> {
    info.priority_groups.iter().find(|g| g.group == WRITER_GROUP).and_then(|g| g.pinned_client_id.as_deref())
}

impl JetStream {
    /// Takes the hold on `partition` if nobody else has it ([`Log::own`]).
    pub(super) async fn own_partition(&self, partition: u32, worker: &str) -> Result<Option<JetStreamOwner>, Error> {
        if partition >= self.inner.config.partitions {
            return Err(Error::Refused(format!("there is no partition {partition}")));
        }
        let info = self.writer_consumer(partition).await?;
        // Pinned to another client with commands waiting: that client may be a dead worker whose pin has not expired
        // yet. The pull below then waits in the server's queue, and the server pins it the moment the old pin
        // expires, sooner than a second ask would learn of it.
        let pinned_elsewhere = pinned_client(&info).is_some();
        if pinned_elsewhere && info.num_pending == 0 {
            return Ok(None);
        }
        let client = &self.inner.client;
        let inbox = Subject::from(client.new_inbox());
        let deliveries = client.subscribe(inbox.clone()).await.map_err(|e| unavailable("cannot subscribe", e))?;
        let mut owner = JetStreamOwner {
            log: self.clone(),
            partition,
            worker: worker.to_owned(),
            consumer: writer_consumer(partition),
            inbox,
            deliveries,
            // The consumer's own timeout (its creator's), which may differ from this process's flag.
            pull_expires: (info.config.priority_timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(5)),
            pin: None,
            lost: false,
            pulls: VecDeque::new(),
            unacked: BTreeMap::new(),
            done: 0,
            reader: Reader::new(),
            // Before any delivery: what the consumer had not delivered to anyone when we asked (an earlier owner's
            // deliveries it did not ack are not sent again before their ack wait runs out).
            newest: (0, info.num_pending),
            checked: Instant::now(),
        };
        owner.keep_pulling().await?;
        if info.num_pending > 0 {
            // Commands wait: the server pins the first client that pulls (once the old pin, if any, is gone). Learn
            // whether that is us.
            let deadline = Instant::now() + owner.pull_expires.min(Duration::from_secs(1));
            while owner.pin.is_none() && !owner.lost && owner.take_next(deadline).await? {
                owner.keep_pulling().await?;
            }
        }
        if owner.lost {
            return Ok(None);
        }
        if owner.pin.is_none() && owner.pinned_elsewhere().await? {
            return Ok(None);
        }
        tracing::debug!(partition, worker, pinned = owner.pin.is_some(), "owning the partition");
        Ok(Some(owner))
    }
}

impl JetStream {
    fn writer_consumer_config(&self, partition: u32, deliver_policy: DeliverPolicy) -> consumer::pull::Config {
        let config = &self.inner.config;
        consumer::pull::Config {
            durable_name: Some(writer_consumer(partition)),
            description: Some(format!("leasehold: the writer of partition {partition}")),
            filter_subject: command_filter(partition),
            deliver_policy,
            // One ack covers every delivery up to it: a writer acks once per round, not once per command.
            ack_policy: AckPolicy::All,
            ack_wait: config.ack_wait,
            // Whole commands: the owner hands out what the deliveries prove complete (crate::reading), and reads by
            // sequence only what they cannot vouch for.
            headers_only: false,
            priority_policy: PriorityPolicy::PinnedClient,
            priority_groups: vec![WRITER_GROUP.to_owned()],
            priority_timeout: config.priority_timeout,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        }
    }

    /// The writer consumer of `partition` as it is now, created (or set back to leasehold's settings) first.
    pub(super) async fn writer_consumer(&self, partition: u32) -> Result<consumer::Info, Error> {
        let stream = self.stream(CMD_STREAM)?;
        let name = writer_consumer(partition);
        let existing = match stream.consumer_info(&name).await {
            Ok(info) => Some(info),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => None,
            Err(e) => return Err(unavailable(&format!("cannot read consumer {name}"), e)),
        };
        if let Some(info) = &existing
            && consumer_matches(&self.writer_consumer_config(partition, DeliverPolicy::All), &info.config)
        {
            return Ok(info.clone());
        }
        // A new consumer starts after the partition's cursor (the command of its last outcome), so a log made
        // before it does not deliver its whole retained history once; what it leaves out is decided already.
        let deliver_policy = match self.partition_cursor(partition).await? {
            0 => DeliverPolicy::All,
            cursor => DeliverPolicy::ByStartSequence { start_sequence: cursor + 1 },
        };
        let wanted = self.writer_consumer_config(partition, deliver_policy);
        if let Some(info) = existing {
            tracing::warn!(consumer = %name, have = ?info.config, "setting the writer consumer back to leasehold's settings");
        }
        let created = stream
            .create_consumer(wanted)
            .await
            .map_err(|e| unavailable(&format!("cannot create consumer {name}"), e))?;
        // A log made before these consumers has the old ones, which this version never pulls.
        let old = format!("lh-writer-{partition}");
        if stream.consumer_info(&old).await.is_ok() {
            tracing::warn!(
                partition,
                consumer = %old,
                "this log was made by an older leasehold: workers of that version may still serve it through their \
                 own consumers (safe, but both sides reload); once none runs, delete the old consumer \
                 (nats consumer rm {CMD_STREAM} {old}; README: moving a log made before the v2 consumers over)"
            );
        }
        Ok(created.cached_info().clone())
    }
}

impl JetStream {
    /// The command sequence of `partition`'s last outcome (0: none), read from the stream leader.
    async fn partition_cursor(&self, partition: u32) -> Result<u64, Error> {
        let last = self.leader_last_message(EVT_STREAM, &outcome_filter(partition)).await?;
        Ok(last.and_then(|message| header(Some(&message.headers), crate::HEADER_CMD_SEQ)?.parse().ok()).unwrap_or(0))
    }
}

/// Whether an existing writer consumer is leasehold's. Its timings (`ack_wait`, `priority_timeout`) are the
/// creator's: a worker started with other values uses them as they are, so two workers with different flags do not
/// rewrite the consumer back and forth (which would disturb the pin).
fn consumer_matches(wanted: &consumer::pull::Config, got: &consumer::Config) -> bool {
    got.durable_name == wanted.durable_name
        && got.filter_subject == wanted.filter_subject
        && got.ack_policy == wanted.ack_policy
        && got.headers_only == wanted.headers_only
        && got.priority_policy == wanted.priority_policy
        && got.priority_groups == wanted.priority_groups
}

/// A writer's hold on one partition of the JetStream log.
///
/// The hold is the pin of the partition's writer consumer. The owner pulls the consumer by hand (a pull request
/// with the group and, once it has one, its pin id), so it sees what the server answers:
///
/// - A delivery carries `Nats-Pin-Id`: the first one tells the owner it is pinned. A delivery is a whole command;
///   the owner gives it to its [`Reader`], which hands out commands strictly in sequence after the cursor the
///   caller gives: from deliveries as far as their delivery numbers prove nothing is missing, by sequence from the
///   log beyond that (the first delivery after a takeover, a gap). The owner acks the highest delivery done with
///   in [`Owner::done_through`], which acks all before it (at once if it is already done with, as an old owner's
///   redeliveries are). It never naks.
/// - A 423 answers a pull whose pin id is no longer the pinned one: the pin moved, so the owner is
///   [`Error::Lost`] from then on. A delivery with another pin id means the same.
/// - Pulls are sent only while the owner is used ([`Owner::next_commands`], [`Owner::done_through`]), each
///   expiring after an eighth of `priority_timeout`, so a stuck worker loses the pin after `priority_timeout`.
///
/// The server pins a client only when it has a message to deliver. So an owner may hold a partition that nobody is
/// pinned to, because no command waits: there is nothing to decide, and two workers may both believe they own
/// it. The first delivery pins one of them; the other learns it is lost when it next checks the consumer (before
/// it returns commands while unpinned, and at most every pull expiry while it waits). The fence keeps two
/// believers from both appending (DESIGN section 3). Dropping the owner gives the pin up after
/// `priority_timeout`; [`Owner::release`] unpins at once.
pub struct JetStreamOwner {
    log: JetStream,
    partition: u32,
    worker: String,
    consumer: String,
    inbox: Subject,
    deliveries: async_nats::Subscriber,
    pull_expires: Duration,
    /// The pin id the server gave us, once it did.
    pin: Option<String>,
    lost: bool,
    /// The pulls waiting at the server, oldest first (the server serves them in that order): when each was sent,
    /// and how many deliveries it may still bring.
    pulls: VecDeque<(Instant, usize)>,
    /// Stream sequence -> ack subject of deliveries not yet acked (the consumer acks all up to the one acked).
    unacked: BTreeMap<u64, Subject>,
    /// Everything up to here is done with.
    done: u64,
    /// What was delivered and read, and what may be handed out ([`Reader`]).
    reader: Reader,
    /// The newest delivery's number, and how many commands of the partition the stream held beyond it then (not
    /// yet delivered to anyone).
    newest: (u64, u64),
    /// When the consumer was last asked who is pinned.
    checked: Instant,
}

impl fmt::Debug for JetStreamOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamOwner")
            .field("partition", &self.partition)
            .field("worker", &self.worker)
            .field("pinned", &self.pin.is_some())
            .field("lost", &self.lost)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// What a delivery's ack subject says (`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<time>.<pending>`,
/// or with a domain and an account hash first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckReply {
    /// How many times the message was delivered (1: the first time).
    pub(crate) delivered: u64,
    /// Its stream sequence.
    pub(crate) stream_seq: u64,
    /// The consumer's delivery sequence (one more for every delivery it makes).
    pub(crate) delivery_seq: u64,
    /// The stored message's time, in Unix nanoseconds.
    pub(crate) time_ns: u64,
    /// Messages of the consumer's filter after this one not delivered yet, when it was sent.
    pub(crate) pending: u64,
}

pub(crate) fn ack_reply(reply: &str) -> Option<AckReply> {
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
    let first = match tokens.len() {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    Some(AckReply {
        delivered: tokens[first].parse().ok()?,
        stream_seq: tokens[first + 1].parse().ok()?,
        delivery_seq: tokens[first + 2].parse().ok()?,
        time_ns: tokens[first + 3].parse().ok()?,
        pending: tokens[first + 4].parse().ok()?,
    })
}

/// The stream sequence in a delivery's ack subject.
pub(crate) fn acked_sequence(reply: &str) -> Option<u64> {
    ack_reply(reply).map(|ack| ack.stream_seq)
}

impl JetStreamOwner {
    /// What its reader saw: deliveries taken in, reads by sequence asked for, renumberings.
    pub fn reading_stats(&self) -> crate::reading::ReaderStats {
        self.reader.stats
    }

    /// Takes in one message from the consumer: a delivery, or the status that ends a pull.
    fn handle(&mut self, message: async_nats::Message) -> Result<(), Error> {
        match message.status {
            None | Some(StatusCode::OK) => {
                let Some(reply) = message.reply else { return Ok(()) };
                if let Some(id) = header(message.headers.as_ref(), "Nats-Pin-Id") {
                    match &self.pin {
                        None => self.pin = Some(id.to_owned()),
                        Some(mine) if mine != id => self.lost = true,
                        Some(_) => {}
                    }
                }
                if let Some((_, remaining)) = self.pulls.front_mut() {
                    *remaining = remaining.saturating_sub(1);
                    if *remaining == 0 {
                        self.pulls.pop_front();
                    }
                }
                let Some(ack) = ack_reply(&reply) else {
                    tracing::warn!(partition = self.partition, %reply, "a delivery with an ack subject that does not parse");
                    return Ok(());
                };
                let record = CommandRecord {
                    seq: ack.stream_seq,
                    subject: message.subject.to_string(),
                    time: Timestamp(ack.time_ns / 1_000_000),
                    payload: message.payload,
                };
                if ack.delivery_seq >= self.newest.0 {
                    self.newest = (ack.delivery_seq, ack.pending);
                }
                self.reader.delivered(Delivery { dseq: ack.delivery_seq, first: ack.delivered == 1, record });
                self.unacked.insert(ack.stream_seq, reply);
                Ok(())
            }
            Some(StatusCode::PIN_ID_MISMATCH) => {
                self.lost = true;
                self.pulls.clear();
                Ok(())
            }
            Some(StatusCode::IDLE_HEARTBEAT) => Ok(()),
            Some(StatusCode::NO_RESPONDERS) => {
                self.pulls.clear();
                Err(Error::Unavailable(format!("no server answers pulls of {}", self.consumer)))
            }
            Some(status) => {
                // 408 (the pull expired), 409 (the server ended it); "Consumer Deleted" ends the hold too. Pulls
                // expire in the order they were sent.
                self.pulls.pop_front();
                if message.description.as_deref().is_some_and(|d| d.contains("Consumer Deleted")) {
                    self.lost = true;
                }
                tracing::trace!(partition = self.partition, %status, description = ?message.description, "pull ended");
                Ok(())
            }
        }
    }

    /// Waits until `deadline` for the next message from the consumer and takes it in: `false` when none came.
    async fn take_next(&mut self, deadline: Instant) -> Result<bool, Error> {
        match tokio::time::timeout_at(deadline, self.deliveries.next()).await {
            Ok(Some(message)) => self.handle(message).map(|()| true),
            Ok(None) => Err(Error::Unavailable("the connection closed".to_owned())),
            Err(_) => Ok(false),
        }
    }

    /// Takes in whatever the consumer has sent, without waiting.
    fn drain(&mut self) -> Result<(), Error> {
        while let Some(next) = self.deliveries.next().now_or_never() {
            let message = next.ok_or_else(|| Error::Unavailable("the connection closed".to_owned()))?;
            self.handle(message)?;
        }
        Ok(())
    }

    /// How many commands a batch of `ready` should wait for, at most `max`: those ready and those the waiting
    /// pulls will bring of what the stream held beyond the newest delivery.
    fn coming(&self, ready: usize, max: usize) -> usize {
        let room: usize = self.pulls.iter().map(|(_, remaining)| remaining).sum();
        let beyond = usize::try_from(self.newest.1).unwrap_or(usize::MAX);
        ready.saturating_add(beyond.min(room)).min(max)
    }

    /// How many more deliveries the consumer sends before it waits for an ack: its limit, less those of ours it
    /// waits for (an old owner's unacked deliveries count too, so this may be more than the server will send).
    fn ack_room(&self) -> usize {
        usize::try_from(MAX_ACK_PENDING).unwrap_or(usize::MAX).saturating_sub(self.unacked.len())
    }

    /// Sends a pull (with our pin id once we have one) when none waits, or a second one when the waiting one has
    /// brought half its batch. Each pull that reaches the server with our pin id keeps the pin.
    async fn keep_pulling(&mut self) -> Result<(), Error> {
        // A pull whose end never came (a reconnect drops waiting pulls and their 408) is forgotten, and sent again,
        // well within the pin's timeout, not a request timeout later: with a timeout of seconds, that would cost
        // the pin.
        let grace = self.log.inner.config.request_timeout.min(self.pull_expires * 2);
        while self.pulls.front().is_some_and(|(sent, _)| sent.elapsed() >= self.pull_expires + grace) {
            self.pulls.pop_front();
        }
        let outstanding: usize = self.pulls.iter().map(|(_, remaining)| remaining).sum();
        if !self.pulls.is_empty() && (self.pulls.len() >= PULLS_IN_FLIGHT || outstanding > PULL_BATCH / 2) {
            return Ok(());
        }
        let mut request = serde_json::json!({
            "batch": PULL_BATCH,
            "expires": u64::try_from(self.pull_expires.as_nanos()).unwrap_or(u64::MAX),
            "group": WRITER_GROUP,
        });
        if let Some(pin) = &self.pin {
            request["id"] = serde_json::Value::from(pin.as_str());
        }
        self.log
            .inner
            .client
            .publish_with_reply(
                format!("$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.{}", self.consumer),
                self.inbox.clone(),
                Bytes::from(request.to_string()),
            )
            .await
            .map_err(|e| unavailable("cannot pull", e))?;
        self.pulls.push_back((Instant::now(), PULL_BATCH));
        Ok(())
    }

    /// Whether another client is pinned now (asked of the consumer). Marks the owner lost if so.
    async fn pinned_elsewhere(&mut self) -> Result<bool, Error> {
        self.checked = Instant::now();
        let info = self
            .log
            .stream(CMD_STREAM)?
            .consumer_info(&self.consumer)
            .await
            .map_err(|e| unavailable(&format!("cannot read consumer {}", self.consumer), e))?;
        // Deliveries that came meanwhile may have pinned us.
        self.drain()?;
        if pinned_client(&info).is_some() && self.pin.is_none() {
            // The pin may be ours: the server pins a pull as it delivers to it, and its answer to the info can come
            // before that delivery. A pull of ours that is waiting either delivers (with the pin id) or ends.
            let deadline = Instant::now() + self.pull_expires * 2;
            while self.pin.is_none() && !self.pulls.is_empty() && !self.lost && self.take_next(deadline).await? {}
        }
        let elsewhere = match (pinned_client(&info), &self.pin) {
            (None, _) => false,
            (Some(pinned), Some(mine)) => pinned != mine,
            (Some(_), None) => true,
        };
        self.lost |= elsewhere;
        Ok(elsewhere)
    }

    fn check_held(&self) -> Result<(), Error> {
        if self.lost { Err(Error::Lost(self.partition)) } else { Ok(()) }
    }

    /// Commands after `after`, read by sequence (see [`read_by_sequence`]): from any replica, and from the leader
    /// one at a time where a replica lags.
    async fn read(
        &self,
        after: u64,
        max: usize,
        through: u64,
        bounded: bool,
    ) -> Result<(Vec<CommandRecord>, u64), Error> {
        let (log, partition) = (&self.log, self.partition);
        let filter = &command_filter(partition);
        read_by_sequence(
            after,
            max,
            through,
            bounded,
            |after, ask| log.read_commands(partition, after, ask),
            |next| async move { Ok(log.leader_next(CMD_STREAM, filter, next).await?.map(command_record)) },
        )
        .await
    }

    /// Everything up to `seq` is done with (acked, dropped by the reader): takes in what came meanwhile, acks, and
    /// says whether we still hold the partition.
    async fn settle(&mut self, seq: u64) -> Result<(), Error> {
        self.done = self.done.max(seq);
        self.reader.done_through(seq);
        self.drain()?;
        self.ack_done().await?;
        self.check_held()
    }

    /// Reads by sequence as the reader asks, and takes the answer in.
    async fn read_into_reader(&mut self, after: u64, max: usize, through: u64, bounded: bool) -> Result<(), Error> {
        let (found, covered) = self.read(after, max.clamp(1, DIRECT_BATCH), through, bounded).await?;
        self.reader.read(after, found, covered);
        Ok(())
    }

    /// Returns `found` if we may work on it: an unpinned owner first checks that nobody else is pinned.
    async fn hand_out(&mut self, found: Vec<CommandRecord>) -> Result<Vec<CommandRecord>, Error> {
        if self.pin.is_none() && !found.is_empty() && self.pinned_elsewhere().await? {
            return Err(Error::Lost(self.partition));
        }
        self.check_held()?;
        Ok(found)
    }

    /// Acks every delivery up to `done`, with one ack: the consumer acks all (`AckAll`) up to the highest. An ack
    /// is fire and forget: a lost one means redeliveries, which are acked again.
    async fn ack_done(&mut self) -> Result<(), Error> {
        let later = self.unacked.split_off(&(self.done + 1));
        let done = std::mem::replace(&mut self.unacked, later);
        if let Some((_, reply)) = done.into_iter().next_back() {
            self.log
                .inner
                .client
                .publish(reply, Bytes::from_static(b"+ACK"))
                .await
                .map_err(|e| unavailable("cannot ack", e))?;
        }
        Ok(())
    }
}

impl Owner for JetStreamOwner {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn next_commands(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        // Commands at hand are handed out without a round trip: let the connection deliver what came meanwhile (a
        // 423 saying the pin moved) before looking, even on a single-threaded runtime.
        tokio::task::yield_now().await;
        self.drain()?;
        self.check_held()?;
        self.ack_done().await?;
        self.keep_pulling().await?;
        let deadline = Instant::now() + wait;
        // Reads by sequence this call: a replica that lags may answer short of what was delivered; the leader
        // completes the read, and a third read waits for the next call.
        let mut reads = 0;
        let mut waited = false;
        loop {
            match self.reader.next(after, max) {
                Next::Ready(found) => {
                    // Under a backlog the batch takes what the waiting pulls are bringing (the stream holds more,
                    // and they have room for it), not only what came first: batches adapt to the backlog, without
                    // a timer. Counted by deliveries, so the batch is gathered once.
                    let want = self.coming(found.len(), max);
                    if waited || found.is_empty() || found.len() >= want {
                        return self.hand_out(found).await;
                    }
                    waited = true;
                    let until = self.reader.stats.delivered + (want - found.len()) as u64;
                    drop(found);
                    while self.reader.stats.delivered < until && self.take_next(deadline).await? {
                        self.check_held()?;
                    }
                    self.drain()?;
                    self.keep_pulling().await?;
                    continue;
                }
                // With nothing at hand to read up to, a waiting pull's deliveries come first: reading a batch by
                // sequence now would fetch what they are bringing (a new owner's first call), and the read after
                // the wait covers a consumer that delivers nothing. Unless the consumer had nothing left to send:
                // what an earlier owner was delivered comes again only after its ack wait, so it is read now.
                Next::Read { after: from, through, bounded }
                    if reads < 2 && (through > from || self.pulls.is_empty() || self.newest.1 == 0) =>
                {
                    reads += 1;
                    self.read_into_reader(from, max, through, bounded).await?;
                    continue;
                }
                Next::Read { .. } | Next::Wait => {}
            }
            if !self.take_next(deadline).await? {
                break;
            }
            self.drain()?;
            self.check_held()?;
            self.ack_done().await?;
            self.keep_pulling().await?;
        }
        if self.pin.is_none() && self.checked.elapsed() >= self.pull_expires && self.pinned_elsewhere().await? {
            return Err(Error::Lost(self.partition));
        }
        // A command may have come without a delivery (the consumer at its ack limit): read once more, after what
        // the reader knows.
        let (from, through, bounded) = match self.reader.next(after, max) {
            Next::Ready(found) => return self.hand_out(found).await,
            Next::Read { after: from, through, bounded } => (from, through, bounded),
            Next::Wait => (self.reader.known().unwrap_or(after), self.reader.highest(), false),
        };
        self.read_into_reader(from, max, through, bounded).await?;
        match self.reader.next(after, max) {
            Next::Ready(found) => self.hand_out(found).await,
            Next::Read { .. } | Next::Wait => self.hand_out(Vec::new()).await,
        }
    }

    async fn keep_alive(&mut self) -> Result<(), Error> {
        self.drain()?;
        self.check_held()?;
        self.keep_pulling().await
    }

    async fn done_through(&mut self, seq: u64) -> Result<(), Error> {
        self.settle(seq).await?;
        self.keep_pulling().await
    }

    async fn in_hand(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        // Acked first, as before any wait: a consumer at its ack limit sends nothing more until it is.
        self.settle(after).await?;
        // What the waiting pulls still bring of what the stream held beyond the newest delivery: the server sends
        // it whether or not we stop, so it is decided here rather than sent to the next owner again. No more than
        // the consumer's ack limit leaves room for: at the limit it sends nothing, and waiting for it would spend
        // the whole stop on deliveries that never come.
        let deadline = Instant::now() + wait;
        while self.coming(0, self.ack_room()) > 0 && self.take_next(deadline).await? {
            self.drain()?;
            self.check_held()?;
        }
        match self.reader.next(after, max) {
            Next::Ready(found) => self.hand_out(found).await,
            // Past a gap the deliveries cannot vouch for: a read by sequence is the next owner's to make.
            Next::Read { .. } | Next::Wait => Ok(Vec::new()),
        }
    }

    async fn release(mut self) {
        if self.drain().is_ok() {
            let _ = self.ack_done().await;
        }
        if self.lost || self.pin.is_none() {
            return;
        }
        // Unpin only while the pin is still ours: never unpin the owner that came after us.
        match self.pinned_elsewhere().await {
            Ok(false) if self.pin.is_some() => {
                let unpinned = match self.log.stream(CMD_STREAM) {
                    Ok(stream) => stream.unpin_consumer(&self.consumer, WRITER_GROUP).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = unpinned {
                    tracing::warn!(partition = self.partition, error = %e, "could not unpin the partition");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(partition = self.partition, error = %e, "could not release the partition"),
        }
        // A flush waits for the connection: on a server that is gone, for as long as the client reconnects.
        let flushed = tokio::time::timeout(self.log.inner.config.request_timeout, self.log.inner.client.flush()).await;
        if flushed.is_err() {
            tracing::warn!(
                partition = self.partition,
                "the acks of the partition were not flushed: the server is away"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_subjects_name_the_stream_sequence() {
        assert_eq!(acked_sequence("$JS.ACK.LH_CMD.lh-writer-7.1.3.2.1795409385075890669.2"), Some(3));
        assert_eq!(acked_sequence("$JS.ACK._.szMpdrwD.LH_CMD.lh-writer-7.2.50.9.1795409385075890669.0"), Some(50));
        assert_eq!(acked_sequence("$JS.ACK.LH_CMD.lh-writer-7.1.3"), None);
        assert_eq!(acked_sequence("_INBOX.x"), None);
    }
}
