//! What `leasehold bench throughput` measures of a JetStream server besides leasehold itself: the raw append rate
//! (no fence), the fenced rate one append in flight per partition, the fence's cost as a partition's subjects grow,
//! all on a scratch stream `LH_BENCH` that is removed afterwards; and a pipelined fill of a partition's outcomes for
//! the takeover measurement; and pipelined loaders of a whole generated log (commands, then outcomes) for the
//! replay benchmark (`replay-bench`).

use std::collections::VecDeque;
use std::time::Instant;

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, StorageType};
use bytes::Bytes;

use super::{EVT_STREAM, JetStream, unavailable};
use crate::raw::RawRun;
use crate::{Error, OutcomeRecord};

/// The scratch stream of the raw measurements.
const BENCH_STREAM: &str = "LH_BENCH";

impl JetStream {
    async fn scratch(&self) -> Result<(), Error> {
        let js = &self.inner.js;
        let _ = js.delete_stream(BENCH_STREAM).await;
        js.create_stream(stream::Config {
            name: BENCH_STREAM.to_owned(),
            subjects: vec!["lh.bench.>".to_owned()],
            storage: StorageType::File,
            num_replicas: self.inner.config.replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable("cannot create the scratch stream LH_BENCH", e))?;
        Ok(())
    }

    /// Deletes every stream and bucket of leasehold on this server: for the benchmark, which runs only on a server
    /// that had none (it checks) and leaves none behind.
    pub async fn bench_reset(&self) -> Result<(), Error> {
        let js = &self.inner.js;
        for name in [super::CMD_STREAM, super::EVT_STREAM, super::DLQ_STREAM, BENCH_STREAM] {
            let _ = js.delete_stream(name).await;
        }
        let _ = js.delete_object_store(super::SNAPSHOT_BUCKET).await;
        let _ = js.delete_key_value(super::WORKERS_BUCKET).await;
        Ok(())
    }

    async fn drop_scratch(&self) {
        let _ = self.inner.js.delete_stream(BENCH_STREAM).await;
    }

    /// `n` appends of `payload_len` bytes round-robin over `subjects` subjects, up to `in_flight` unacknowledged,
    /// no fence: the log's ceiling.
    pub async fn bench_raw_append(
        &self,
        n: u64,
        subjects: u32,
        payload_len: usize,
        in_flight: usize,
    ) -> Result<RawRun, Error> {
        self.scratch().await?;
        let payload = Bytes::from(vec![0x5a; payload_len]);
        let js = &self.inner.js;
        let start = Instant::now();
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        for i in 0..n {
            if pending.len() >= in_flight {
                let ack = pending.pop_front().expect("not empty");
                ack.await.map_err(|e| unavailable("a raw append failed", e))?;
            }
            let subject = format!("lh.bench.raw.{}", i % u64::from(subjects.max(1)));
            let ack = js.publish(subject, payload.clone()).await.map_err(|e| unavailable("a raw append failed", e))?;
            pending.push_back(ack);
        }
        for ack in pending {
            ack.await.map_err(|e| unavailable("a raw append failed", e))?;
        }
        let elapsed = start.elapsed();
        self.drop_scratch().await;
        Ok(RawRun { appends: n, elapsed })
    }

    /// `n` appends spread over `partitions` lanes, each lane one append in flight, fenced on the last sequence of its
    /// lane's subjects as leasehold fences a partition: the most the fence allows one by one.
    pub async fn bench_raw_fenced(&self, n: u64, partitions: u32, payload_len: usize) -> Result<RawRun, Error> {
        self.scratch().await?;
        let per = n / u64::from(partitions.max(1));
        let start = Instant::now();
        let mut lanes = tokio::task::JoinSet::new();
        for p in 0..partitions {
            let log = self.clone();
            lanes.spawn(async move { log.fenced_lane(&format!("lh.bench.f{p}"), 16, per, payload_len).await });
        }
        while let Some(lane) = lanes.join_next().await {
            lane.map_err(|e| Error::Unavailable(format!("a lane failed: {e}")))??;
        }
        let elapsed = start.elapsed();
        self.drop_scratch().await;
        Ok(RawRun { appends: per * u64::from(partitions), elapsed })
    }

    /// One message on each of `agents` subjects of one lane, then `n` fenced appends cycling over them: the
    /// fence's cost when every agent of a partition matches its filter. Returns the timed appends.
    pub async fn bench_fenced_fanout(&self, agents: u64, n: u64, payload_len: usize) -> Result<RawRun, Error> {
        self.scratch().await?;
        let js = &self.inner.js;
        let payload = Bytes::from(vec![0x5a; payload_len]);
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        for i in 0..agents {
            if pending.len() >= 256 {
                let ack = pending.pop_front().expect("not empty");
                ack.await.map_err(|e| unavailable("filling the lane", e))?;
            }
            let ack = js
                .publish(format!("lh.bench.fan.a{i}"), payload.clone())
                .await
                .map_err(|e| unavailable("filling the lane", e))?;
            pending.push_back(ack);
        }
        let mut last = 0;
        for ack in pending {
            last = ack.await.map_err(|e| unavailable("filling the lane", e))?.sequence;
        }
        let start = Instant::now();
        for i in 0..n {
            let headers = fenced_on("lh.bench.fan.>", last);
            let message = PublishMessage::build().payload(payload.clone()).headers(headers);
            let subject = format!("lh.bench.fan.a{}", i % agents.max(1));
            last = js
                .send_publish(subject, message)
                .await
                .map_err(|e| unavailable("a fenced append failed", e))?
                .await
                .map_err(|e| unavailable("a fenced append failed", e))?
                .sequence;
        }
        let elapsed = start.elapsed();
        self.drop_scratch().await;
        Ok(RawRun { appends: n, elapsed })
    }

    async fn fenced_lane(&self, lane: &str, subjects: u64, n: u64, payload_len: usize) -> Result<(), Error> {
        let js = &self.inner.js;
        let payload = Bytes::from(vec![0x5a; payload_len]);
        let filter = format!("{lane}.>");
        let mut last = 0;
        for i in 0..n {
            let message = PublishMessage::build().payload(payload.clone()).headers(fenced_on(&filter, last));
            last = js
                .send_publish(format!("{lane}.s{}", i % subjects), message)
                .await
                .map_err(|e| unavailable("a fenced append failed", e))?
                .await
                .map_err(|e| unavailable("a fenced append failed", e))?
                .sequence;
        }
        Ok(())
    }

    /// Appends `records` to `partition` pipelined (up to 256 in flight) instead of one fenced append after
    /// another, predicting each record's sequence so the `Lh-Prev-Seq` chain is the one fenced appends make. For
    /// filling a partition before a takeover measurement, on a log nothing else writes to: any other append
    /// meanwhile breaks the prediction, which is checked on every acknowledgement. Returns the last sequence.
    pub async fn bench_fill(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Result<u64, Error> {
        let js = &self.inner.js;
        let mut evt = js.get_stream(EVT_STREAM).await.map_err(|e| unavailable("cannot read LH_EVT", e))?;
        let stream_last = evt.info().await.map_err(|e| unavailable("cannot read LH_EVT", e))?.state.last_sequence;
        let mut pending: VecDeque<(u64, PublishAckFuture)> = VecDeque::new();
        for (i, record) in records.iter().enumerate() {
            // Nothing else appends: the i-th record lands right after the stream's last message.
            let next = stream_last + 1 + i as u64;
            let prev = if i == 0 { fence } else { next - 1 };
            if pending.len() >= 256 {
                let (want, ack) = pending.pop_front().expect("not empty");
                check_fill(want, ack.await.map_err(|e| unavailable("a fill append failed", e))?.sequence)?;
            }
            let (subject, message) = JetStream::unfenced_message(partition, prev, record)?;
            let ack = js.send_publish(subject, message).await.map_err(|e| unavailable("a fill append failed", e))?;
            pending.push_back((next, ack));
        }
        for (want, ack) in pending {
            check_fill(want, ack.await.map_err(|e| unavailable("a fill append failed", e))?.sequence)?;
        }
        Ok(if records.is_empty() { fence } else { stream_last + records.len() as u64 })
    }

    /// An outcome record chained on `prev` without a fence.
    fn unfenced_message(partition: u32, prev: u64, record: &OutcomeRecord) -> Result<(String, PublishMessage), Error> {
        let (subject, headers) =
            JetStream::outcome_headers(partition, record, super::append::Place::Unfenced { prev })?;
        Ok((subject, PublishMessage::build().payload(record.payload.clone()).headers(headers)))
    }

    /// Publishes `commands` (ingress subject, command id, payload) in order, up to `in_flight` unacknowledged, and
    /// answers the sequence each was stored at, in order. For loading a generated log into a fresh `LH_CMD` (the
    /// replay benchmark): one connection publishes in order, so the server stores them in order. A command the
    /// server takes for a duplicate (its id published before, within the window) is refused: a generated log has
    /// none, so one means the stream was not fresh.
    pub async fn bench_load_commands(
        &self,
        commands: &[(String, String, Bytes)],
        in_flight: usize,
    ) -> Result<Vec<u64>, Error> {
        let messages = commands.iter().map(|(subject, msg_id, payload)| {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, super::header_value("Nats-Msg-Id", msg_id)?);
            Ok((subject.clone(), PublishMessage::build().payload(payload.clone()).headers(headers)))
        });
        self.load_pipelined("command", "LH_CMD", in_flight, messages).await
    }

    /// Publishes outcome records of any partitions in order, each as `(partition, prev, record)` with exactly the
    /// subject and headers an append gives it (`Lh-Cmd-Id`, `Lh-Cmd-Seq`, `Lh-Part`, `Lh-Prev-Seq` = `prev`,
    /// `Nats-Msg-Id`) but no fence, up to `in_flight` unacknowledged; answers the sequence each landed at, in order.
    /// For loading a generated log into a fresh `LH_EVT` (the replay benchmark), where the caller knows every
    /// sequence in advance and checks the answer: any other append meanwhile breaks the chain it predicted.
    pub async fn bench_load_outcomes(
        &self,
        records: &[(u32, u64, OutcomeRecord)],
        in_flight: usize,
    ) -> Result<Vec<u64>, Error> {
        let messages =
            records.iter().map(|(partition, prev, record)| JetStream::unfenced_message(*partition, *prev, record));
        self.load_pipelined("outcome", "LH_EVT", in_flight, messages).await
    }

    /// Publishes `messages` in order with up to `in_flight` unacknowledged, and answers the sequence each landed at;
    /// a duplicate means `stream` was not fresh.
    async fn load_pipelined(
        &self,
        what: &str,
        stream: &str,
        in_flight: usize,
        messages: impl Iterator<Item = Result<(String, PublishMessage), Error>>,
    ) -> Result<Vec<u64>, Error> {
        let js = &self.inner.js;
        let mut sequences = Vec::new();
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        let failed = format!("a loaded {what} failed");
        let landed = |ack: Result<async_nats::jetstream::publish::PublishAck, _>| {
            let ack = ack.map_err(|e| unavailable(&failed, e))?;
            if ack.duplicate {
                return Err(Error::Refused(format!(
                    "a loaded {what} was taken for a duplicate of the one at {}: the load needs a fresh {stream}",
                    ack.sequence
                )));
            }
            Ok(ack.sequence)
        };
        for message in messages {
            if pending.len() >= in_flight.max(1) {
                let ack = pending.pop_front().expect("not empty");
                sequences.push(landed(ack.await)?);
            }
            let (subject, message) = message?;
            pending.push_back(js.send_publish(subject, message).await.map_err(|e| unavailable(&failed, e))?);
        }
        for ack in pending {
            sequences.push(landed(ack.await)?);
        }
        Ok(sequences)
    }
}

fn check_fill(want: u64, got: u64) -> Result<(), Error> {
    if want == got {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "a fill append landed at {got}, not {want}: something else appends to LH_EVT; the fill needs a log of its own"
        )))
    }
}

fn fenced_on(filter: &str, last: u64) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    for (name, value) in crate::fence_headers_on(filter, last) {
        headers.insert(name, value);
    }
    headers
}
