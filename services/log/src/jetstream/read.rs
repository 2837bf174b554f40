//! Reads: batched direct gets from any replica, completed from the stream leader; commands, outcomes and dead
//! letters as stored; snapshots; following the outcomes.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::object_store;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::{HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_schemas::Timestamp;
use tokio::time::Instant;

use super::streams::snapshot_object;
use super::{CMD_STREAM, EVT_STREAM, JetStream, unavailable};
use crate::{
    CommandRecord, DeadLetter, Error, HEADER_BATCH_INDEX, HEADER_CMD_ID, HEADER_CMD_SEQ, HEADER_DLQ_PRODUCER_ID,
    HEADER_DLQ_REASON, HEADER_DLQ_SOURCE_SEQ, HEADER_DLQ_SOURCE_SUBJECT, HEADER_PART, HEADER_PREV_SEQ, LetterId,
    OutcomeFilter, Snapshot, StoredOutcome,
};

/// The most messages one direct get asks for.
pub(super) const DIRECT_BATCH: usize = 1024;

impl JetStream {
    /// Up to `max` stored outcomes from sequence `from`, each as its sequence, subject and headers as the server
    /// keeps them (the batch headers included): for tests and audits that check what is on the wire.
    pub async fn stored_outcome_headers(
        &self,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, String, BTreeMap<String, String>)>, Error> {
        let messages = self.direct_batch(EVT_STREAM, "lh.evt.>", from, max).await?;
        Ok(messages
            .into_iter()
            .map(|message| {
                let headers = message
                    .headers
                    .iter()
                    .filter_map(|(name, values)| Some((name.to_string(), values.last()?.as_str().to_owned())))
                    .collect();
                (message.sequence, message.subject.to_string(), headers)
            })
            .collect())
    }

    /// Up to `max` messages of `stream` matching `filter` from sequence `from`, in order, from any replica (a
    /// batched direct get).
    pub(super) async fn direct_batch(
        &self,
        stream: &str,
        filter: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StreamMessage>, Error> {
        // An agent's user may not read the streams but through its own consumer.
        self.streams()?;
        let client = &self.inner.client;
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(inbox.clone()).await.map_err(|e| unavailable("cannot subscribe", e))?;
        let request = serde_json::json!({ "seq": from.max(1), "next_by_subj": filter, "batch": max.min(DIRECT_BATCH) });
        client
            .publish_with_reply(format!("$JS.API.DIRECT.GET.{stream}"), inbox, Bytes::from(request.to_string()))
            .await
            .map_err(|e| unavailable("cannot ask for messages", e))?;
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let mut out = Vec::new();
        loop {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Err(Error::Unavailable("the connection closed during a read".to_owned())),
                Err(_) => {
                    return Err(Error::Unavailable(format!("{stream} did not answer a read of {filter} in time")));
                }
            };
            match reply.status {
                None | Some(StatusCode::OK) => {
                    let message = StreamMessage::try_from(reply)
                        .map_err(|e| Error::Storage(format!("a message of {stream} could not be read: {e}")))?;
                    out.push(message);
                }
                // The end of the batch, or nothing to read.
                Some(status) if status == 204 || status == StatusCode::NOT_FOUND => return Ok(out),
                Some(StatusCode::NO_RESPONDERS) => {
                    return Err(Error::Unavailable(format!("no server answers direct reads of {stream}")));
                }
                Some(status) => {
                    return Err(Error::Unavailable(format!(
                        "a read of {filter} in {stream} failed: {status} {}",
                        reply.description.unwrap_or_default()
                    )));
                }
            }
        }
    }

    /// The sequence of the last message of `stream` matching `filter`, read from the stream leader. `whole`: the
    /// filter takes every subject of the stream (the stream's last sequence answers at once).
    pub(super) async fn leader_last(&self, stream: &str, filter: &str, whole: bool) -> Result<Option<u64>, Error> {
        if whole {
            let info =
                self.stream(stream)?.get_info().await.map_err(|e| unavailable("cannot read the stream state", e))?;
            return Ok((info.state.last_sequence > 0).then_some(info.state.last_sequence));
        }
        Ok(self.leader_last_message(stream, filter).await?.map(|message| message.sequence))
    }

    /// The last message of `stream` matching `filter`, read from the stream leader.
    pub(super) async fn leader_last_message(&self, stream: &str, filter: &str) -> Result<Option<StreamMessage>, Error> {
        match self.stream(stream)?.get_last_raw_message_by_subject(filter).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read the last message of {filter}"), e)),
        }
    }

    /// The first message of `stream` matching `filter` at or after `seq`, read from the stream leader.
    pub(super) async fn leader_next(
        &self,
        stream: &str,
        filter: &str,
        seq: u64,
    ) -> Result<Option<StreamMessage>, Error> {
        match self.stream(stream)?.get_first_raw_message_by_subject(filter, seq.max(1)).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read {filter} from {seq}"), e)),
        }
    }

    /// Up to `max` messages of `stream` matching `filter` from `from`, in order, at least up to the leader's last
    /// matching message when fewer than `max`: a replica's answer, completed from the leader if the replica lags.
    pub(super) async fn read_through(
        &self,
        stream: &str,
        filter: &str,
        whole: bool,
        from: u64,
        max: usize,
    ) -> Result<Vec<StreamMessage>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut out = self.direct_batch(stream, filter, from, max).await?;
        if out.len() >= max.min(DIRECT_BATCH) {
            return Ok(out);
        }
        let Some(last) = self.leader_last(stream, filter, whole).await? else { return Ok(out) };
        let mut next = out.last().map_or(from.max(1), |m| m.sequence + 1);
        while next <= last && out.len() < max {
            let Some(message) = self.leader_next(stream, filter, next).await? else { break };
            next = message.sequence + 1;
            out.push(message);
        }
        Ok(out)
    }
}

/// Log time: the stored message's timestamp in Unix milliseconds.
fn log_time(message: &StreamMessage) -> Timestamp {
    let ms = message.time.unix_timestamp_nanos() / 1_000_000;
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

pub(super) fn command_record(message: StreamMessage) -> CommandRecord {
    CommandRecord {
        seq: message.sequence,
        time: log_time(&message),
        subject: message.subject.to_string(),
        payload: message.payload,
    }
}

pub(super) fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get_last(name).map(HeaderValue::as_str)
}

/// An outcome as stored, or `Refused` naming its sequence and what is missing.
pub(crate) fn stored_outcome(
    seq: u64,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
) -> Result<StoredOutcome, Error> {
    let refused = |what: &str| Error::Refused(format!("outcome {seq} on {subject:?} is not leasehold's: {what}"));
    let (partition, key) = subject
        .strip_prefix("lh.evt.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(p, key)| Some((p.parse::<u32>().ok()?, key)))
        .ok_or_else(|| refused("its subject is not lh.evt.<p>.<key>"))?;
    let number = |name: &str| -> Result<u64, Error> {
        header(headers, name).and_then(|v| v.parse().ok()).ok_or_else(|| refused(&format!("no valid {name} header")))
    };
    Ok(StoredOutcome {
        seq,
        partition,
        key: key.to_owned(),
        cmd_id: header(headers, HEADER_CMD_ID)
            .ok_or_else(|| refused(&format!("no {HEADER_CMD_ID} header")))?
            .to_owned(),
        cmd_seq: number(HEADER_CMD_SEQ)?,
        part: u32::try_from(number(HEADER_PART)?).map_err(|_| refused(&format!("no valid {HEADER_PART} header")))?,
        // A later record of an atomic batch names its index instead: the batch is stored contiguously, so its
        // predecessor is the message just before it (which the folds check is the partition's previous outcome).
        prev_seq: match (header(headers, HEADER_PREV_SEQ), header(headers, HEADER_BATCH_INDEX)) {
            (None, Some(index)) if index.parse::<u64>().is_ok_and(|i| i > 0) && seq > 1 => seq - 1,
            _ => number(HEADER_PREV_SEQ)?,
        },
        payload,
    })
}

/// A dead letter as stored, or `Refused` naming its sequence and what is missing.
pub(crate) fn stored_dead_letter(
    seq: u64,
    subject: &str,
    headers: &HeaderMap,
    payload: Bytes,
) -> Result<(u64, DeadLetter), Error> {
    let refused = |what: &str| Error::Refused(format!("dead letter {seq} on {subject} is not leasehold's: {what}"));
    let headers = Some(headers);
    let partition = subject
        .split('.')
        .nth(2)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| refused("its subject is not lh.dlq.<p>...."))?;
    let letter = DeadLetter {
        partition,
        source_seq: header(headers, HEADER_DLQ_SOURCE_SEQ)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| refused(&format!("no valid {HEADER_DLQ_SOURCE_SEQ} header")))?,
        source_subject: header(headers, HEADER_DLQ_SOURCE_SUBJECT)
            .ok_or_else(|| refused(&format!("no {HEADER_DLQ_SOURCE_SUBJECT} header")))?
            .to_owned(),
        reason: header(headers, HEADER_DLQ_REASON).unwrap_or_default().to_owned(),
        // A letter stored before ids were recorded has neither header: its payload's header names it, if anything.
        command_id: match (header(headers, HEADER_CMD_ID), header(headers, HEADER_DLQ_PRODUCER_ID)) {
            (Some(id), _) => Some(LetterId { id: id.to_owned(), verified: true }),
            (None, Some(id)) => Some(LetterId { id: id.to_owned(), verified: false }),
            (None, None) => LetterId::read_from(&payload),
        },
        payload,
    };
    Ok((seq, letter))
}

impl JetStream {
    /// The `Nats-Msg-Id` command `seq` was published under, if the command log still holds it and it had one.
    pub(super) async fn producer_msg_id(&self, seq: u64) -> Result<Option<String>, Error> {
        match self.stream(CMD_STREAM)?.get_raw_message(seq).await {
            Ok(message) => Ok(header(Some(&message.headers), "Nats-Msg-Id").map(str::to_owned)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read command {seq} for the id it was published under"), e)),
        }
    }

    /// The latest snapshot of `partition`, read without a deadline (see [`Log::latest_snapshot`]), with its size.
    ///
    /// [`Log::latest_snapshot`]: crate::Log::latest_snapshot
    pub(super) async fn read_snapshot(
        &self,
        partition: u32,
        deadline: Duration,
    ) -> Result<Option<(Snapshot, usize)>, SnapshotRead> {
        let name = snapshot_object(partition);
        let snapshots = &self.streams().map_err(SnapshotRead::Failed)?.snapshots;
        match snapshots.get(&name).await {
            Ok(object) => self.snapshot_body(partition, object, deadline).await.map(Some),
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => Ok(None),
            Err(e) => {
                Err(SnapshotRead::Failed(unavailable(&format!("cannot read the snapshot of partition {partition}"), e)))
            }
        }
    }

    /// The snapshot `object` of `partition` holds, read while it is still the latest.
    ///
    /// Storing a snapshot stores its chunks, then its description, then removes the chunks of the one it replaces. A
    /// reader still on those chunks would wait for them forever, so a read that takes a while asks now and then
    /// whether its snapshot is still the one described: if not, it stops at once (`Replaced`), and the caller reads
    /// the newer one.
    pub(super) async fn snapshot_body(
        &self,
        partition: u32,
        mut object: object_store::Object,
        deadline: Duration,
    ) -> Result<(Snapshot, usize), SnapshotRead> {
        let size = object.info().size;
        if snapshot_deadline(size) > deadline {
            // Too large to read in this try's deadline: the caller gives the next one more time.
            return Err(SnapshotRead::TooSlowFor(size));
        }
        let metadata = object.info().metadata.clone();
        let field = |key: &str| -> Result<u64, Error> {
            metadata
                .get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::Refused(format!("the snapshot of partition {partition} has no valid {key}")))
        };
        let decider_version =
            u32::try_from(field("lh-decider-version").map_err(SnapshotRead::Failed)?).map_err(|_| {
                SnapshotRead::Failed(Error::Refused(format!(
                    "the snapshot of partition {partition} has no valid decider version"
                )))
            })?;
        let fence = field("lh-fence").map_err(SnapshotRead::Failed)?;
        let mut state = Vec::with_capacity(size);
        self.read_while_latest(partition, &mut object, &mut state).await?;
        let snapshot = Snapshot {
            partition,
            decider_version,
            fence,
            last_command: metadata.get("lh-last-command").cloned(),
            state: Bytes::from(state),
        };
        Ok((snapshot, size))
    }

    /// Reads `object`'s chunks into `state`, asking every [`STILL_LATEST_EVERY`] whether it is still the latest
    /// snapshot of `partition`: `Replaced` as soon as it is not (its chunks are going, or gone).
    async fn read_while_latest(
        &self,
        partition: u32,
        object: &mut object_store::Object,
        state: &mut Vec<u8>,
    ) -> Result<(), SnapshotRead> {
        use tokio::io::AsyncReadExt;
        let nuid = object.info().nuid.clone();
        let read = object.read_to_end(state);
        tokio::pin!(read);
        let mut ask = tokio::time::interval_at(Instant::now() + STILL_LATEST_EVERY, STILL_LATEST_EVERY);
        loop {
            tokio::select! {
                read = &mut read => {
                    return read.map(drop).map_err(|e| {
                        SnapshotRead::Failed(unavailable(&format!("cannot read the snapshot of partition {partition}"), e))
                    });
                }
                _ = ask.tick() => {
                    if !self.still_latest_snapshot(partition, &nuid).await {
                        return Err(SnapshotRead::Replaced);
                    }
                }
            }
        }
    }

    /// Whether the latest snapshot of `partition` is still the one whose chunks are `nuid`. When the server cannot
    /// say, it is taken to be: the read's deadline still bounds the wait.
    async fn still_latest_snapshot(&self, partition: u32, nuid: &str) -> bool {
        let Ok(streams) = self.streams() else { return true };
        match streams.snapshots.info(snapshot_object(partition)).await {
            Ok(info) => info.nuid == nuid && !info.deleted,
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => false,
            Err(_) => true,
        }
    }
}

/// How often a snapshot read still going asks whether its snapshot was replaced.
const STILL_LATEST_EVERY: Duration = Duration::from_millis(100);

/// How long reading a snapshot of `size` bytes may take: 2 s, plus 10 MB/s.
pub(super) fn snapshot_deadline(size: usize) -> Duration {
    Duration::from_secs(2) + Duration::from_millis(u64::try_from(size / 10_000).unwrap_or(u64::MAX))
}

/// Why a snapshot read gave nothing.
pub(super) enum SnapshotRead {
    Failed(Error),
    /// A newer snapshot replaced it while it was read: read that one.
    Replaced,
    /// The snapshot is this large: read it with a longer deadline.
    TooSlowFor(usize),
}

/// Every outcome matching `filter` from `from` on, through an ordered consumer (ADR-17): in order, each once,
/// recreated by the client from the last sequence seen when it falls behind or its server goes.
pub(super) fn follow(
    log: JetStream,
    filter: OutcomeFilter,
    from: u64,
) -> BoxStream<'static, Result<StoredOutcome, Error>> {
    enum State {
        Start(JetStream, OutcomeFilter, u64),
        Following(async_nats::jetstream::consumer::pull::Ordered),
        Done,
    }
    futures::stream::unfold(State::Start(log, filter, from), |state| async move {
        let mut messages = match state {
            State::Done => return None,
            State::Following(messages) => messages,
            State::Start(log, filter, from) => {
                let config = consumer::pull::OrderedConfig {
                    filter_subject: filter.subject(),
                    deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
                    ..Default::default()
                };
                let started = match log.stream(EVT_STREAM) {
                    Err(e) => Err(e),
                    Ok(stream) => match stream.create_consumer(config).await {
                        Ok(consumer) => {
                            consumer.messages().await.map_err(|e| unavailable("cannot follow the outcomes", e))
                        }
                        Err(e) => Err(unavailable("cannot follow the outcomes", e)),
                    },
                };
                match started {
                    Ok(messages) => messages,
                    Err(e) => return Some((Err(e), State::Done)),
                }
            }
        };
        match followed(messages.next().await, None) {
            Ok(outcome) => Some((Ok(outcome), State::Following(messages))),
            Err(e) => Some((Err(e), State::Done)),
        }
    })
    .boxed()
}

/// The outcome a follower's next message holds. With `expected`, the consumer sequence it must carry: a gap (an
/// outcome taken from the consumer by someone else) ends the follow, to be started again from the last sequence.
fn followed<E: fmt::Display>(
    next: Option<Result<async_nats::jetstream::Message, E>>,
    expected: Option<u64>,
) -> Result<StoredOutcome, Error> {
    let message = match next {
        None => return Err(Error::Unavailable("the outcome follower ended".to_owned())),
        Some(Err(e)) => return Err(unavailable("the outcome follower failed", e)),
        Some(Ok(message)) => message,
    };
    let info = message.info().map_err(|e| Error::Storage(format!("a followed outcome has no stream sequence: {e}")))?;
    if let Some(expected) = expected
        && info.consumer_sequence != expected
    {
        return Err(Error::Unavailable(format!(
            "the outcome follower skipped from delivery {expected} to {}",
            info.consumer_sequence
        )));
    }
    let seq = info.stream_sequence;
    let message = message.message;
    stored_outcome(seq, &message.subject, message.headers.as_ref(), message.payload)
}

/// An agent's outcomes, read as its restricted user may: through its one consumer on `LH_EVT` (`consumer`, named
/// by [`agent_consumer`]) with the one filter subject `lh.evt.<p>.<name>`, created with the filtered create subject
/// (`$JS.API.CONSUMER.CREATE.LH_EVT.<consumer>.lh.evt.<p>.<name>`, server 2.10+) so a permission can name both. A
/// consumer left from before is deleted first (a consumer's start cannot be changed). Unlike the ordered consumer
/// of [`follow`], which renames its consumer on every recreate, the name stays the agent's; on a gap or a failure
/// the stream ends with an error and the agent follows again from its last sequence.
///
/// [`agent_consumer`]: super::agent_consumer
pub(super) fn follow_as_agent(
    log: JetStream,
    agent: String,
    consumer: String,
    filter: OutcomeFilter,
    from: u64,
) -> BoxStream<'static, Result<StoredOutcome, Error>> {
    let OutcomeFilter::Key { key, .. } = &filter else {
        let refused = Error::Refused(format!("agent {agent} reads only its own outcomes"));
        return futures::stream::once(async move { Err(refused) }).boxed();
    };
    if *key != agent {
        let refused = Error::Refused(format!("agent {agent} reads only its own outcomes, not {key}'s"));
        return futures::stream::once(async move { Err(refused) }).boxed();
    }
    enum State {
        Start {
            log: JetStream,
            agent: String,
            consumer: String,
            subject: String,
            from: u64,
        },
        /// The messages, and the consumer sequence the next one must carry.
        Following(consumer::pull::Stream, u64),
        Done,
    }
    let subject = filter.subject();
    futures::stream::unfold(State::Start { log, agent, consumer, subject, from }, |state| async move {
        let (mut messages, expected) = match state {
            State::Done => return None,
            State::Following(messages, expected) => (messages, expected),
            State::Start { log, agent, consumer, subject, from } => {
                match agent_messages(&log, &agent, &consumer, subject, from).await {
                    Ok(messages) => (messages, 1),
                    Err(e) => return Some((Err(e), State::Done)),
                }
            }
        };
        match followed(messages.next().await, Some(expected)) {
            Ok(outcome) => Some((Ok(outcome), State::Following(messages, expected + 1))),
            Err(e) => Some((Err(e), State::Done)),
        }
    })
    .boxed()
}

/// The agent's consumer `name` on `subject` from `from`, made anew, and its messages.
async fn agent_messages(
    log: &JetStream,
    agent: &str,
    name: &str,
    subject: String,
    from: u64,
) -> Result<consumer::pull::Stream, Error> {
    let js = &log.inner.js;
    // Not there is fine; any other failure shows again when it is created.
    let _ = js.delete_consumer_from_stream(name, EVT_STREAM).await;
    let config = consumer::pull::Config {
        name: Some(name.to_owned()),
        description: Some(format!("leasehold: the outcomes of agent {agent}")),
        filter_subject: subject,
        deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
        ack_policy: AckPolicy::None,
        inactive_threshold: Duration::from_secs(60),
        num_replicas: 1,
        memory_storage: true,
        ..Default::default()
    };
    let consumer = js
        .create_consumer_on_stream(config, EVT_STREAM)
        .await
        .map_err(|e| unavailable(&format!("cannot create the consumer of agent {agent} on {EVT_STREAM}"), e))?;
    consumer.messages().await.map_err(|e| unavailable("cannot follow the outcomes", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Log;
    use crate::jetstream::JetStreamConfig;
    use crate::nats_server::NatsServer;

    fn snapshot(fence: u64, byte: u8) -> Snapshot {
        Snapshot {
            partition: 1,
            decider_version: 1,
            fence,
            last_command: Some(format!("cmd-{fence}")),
            // Several chunks (the object store's are 128 KiB).
            state: Bytes::from(vec![byte; 300_000]),
        }
    }

    #[tokio::test]
    async fn a_snapshot_replaced_while_it_is_read_is_noticed_and_the_newer_one_read() {
        let Some(server) = NatsServer::start() else { return };
        let log = JetStream::connect(JetStreamConfig::new(server.url(), 2)).await.expect("connect");
        log.put_snapshot(snapshot(10, 1)).await.expect("the first snapshot");
        // A reader has the first snapshot's description; a writer replaces it before its chunks are read.
        let opened = log.streams().unwrap().snapshots.get(snapshot_object(1)).await.expect("open the first");
        log.put_snapshot(snapshot(20, 2)).await.expect("the second snapshot");
        // Without the check the read waits for the removed chunks forever; the minute only bounds a broken build.
        let read = tokio::time::timeout(Duration::from_secs(60), log.snapshot_body(1, opened, Duration::from_secs(60)))
            .await
            .expect("the read notices the replacement instead of waiting for the removed chunks");
        assert!(matches!(read, Err(SnapshotRead::Replaced)), "the old snapshot's read ends as replaced");
        let latest = log.latest_snapshot(1).await.expect("read").expect("a snapshot");
        assert_eq!((latest.fence, latest.state.len(), latest.state[0]), (20, 300_000, 2), "the newer snapshot, whole");
    }
}
