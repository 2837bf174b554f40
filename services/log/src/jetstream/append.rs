//! Appends and publishes: outcome records under the fence, ADR-50 atomic batches of outcomes and of commands, and
//! what the server's answers to them mean; dead letters as messages.

use std::sync::atomic::Ordering;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use tokio::time::Instant;

use super::{JetStream, header_value, is_token, unavailable};
use crate::{
    Appended, DeadLetter, Error, HEADER_BATCH_INDEX, HEADER_CMD_ID, HEADER_CMD_SEQ, HEADER_DLQ_PRODUCER_ID,
    HEADER_DLQ_REASON, HEADER_DLQ_SOURCE_SEQ, HEADER_DLQ_SOURCE_SUBJECT, HEADER_PART, HEADER_PREV_SEQ, LetterId,
    OutcomeRecord, Publish, Published, fence_headers, outcome_msg_id,
};

impl JetStream {
    pub(super) async fn publish(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> Result<async_nats::jetstream::publish::PublishAck, PublishError> {
        self.inner.js.send_publish(subject, message).await?.await
    }

    /// The headers of a command published on `subject` (its id as `Nats-Msg-Id`), or why it cannot be published.
    pub(super) fn command_headers(&self, subject: &str, msg_id: &str) -> Result<HeaderMap, Error> {
        let tokens: Vec<&str> = subject.split('.').collect();
        let ["lh", "in", class, key, id] = tokens.as_slice() else {
            return Err(Error::Refused(format!(
                "no stream takes subject {subject:?} (commands go to lh.in.<class>.<key>.<id>)"
            )));
        };
        if ![class, key, id].iter().all(|t| is_token(t)) {
            return Err(Error::Refused(format!("{subject:?} is not a valid subject to publish on")));
        }
        if msg_id.is_empty() {
            return Err(Error::Refused("a command needs an id".to_owned()));
        }
        if let Some(agent) = &self.inner.config.agent
            && (*class != "agent" || key != agent)
        {
            // Its credentials would not let it: say so rather than wait for an answer that never comes.
            return Err(Error::Refused(format!(
                "agent {agent} publishes only on lh.in.agent.{agent}.>, not {subject}"
            )));
        }
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, header_value("Nats-Msg-Id", msg_id)?);
        Ok(headers)
    }

    /// Publishes the commands at `chosen` (their indexes in `commands`, with their headers) each alone, all of them
    /// in flight at once (each deduplicated by its own id), and puts each answer at its index.
    async fn publish_one_by_one(
        &self,
        commands: &[Publish],
        chosen: &[(usize, HeaderMap)],
        answers: &mut [Option<Result<Published, Error>>],
    ) {
        let mut pending = Vec::with_capacity(chosen.len());
        for (i, headers) in chosen {
            let command = &commands[*i];
            let message = PublishMessage::build().payload(command.payload.clone()).headers(headers.clone());
            pending.push(self.inner.js.send_publish(command.subject.clone(), message).await);
        }
        for ((i, _), sent) in chosen.iter().zip(pending) {
            let subject = &commands[*i].subject;
            answers[*i] = Some(
                match sent {
                    Ok(ack) => ack.await.map_err(|e| publish_command_error(subject, e)),
                    Err(e) => Err(publish_command_error(subject, e)),
                }
                .map(|ack| Published { seq: ack.sequence, duplicate: ack.duplicate }),
            );
        }
    }

    /// The subject and headers of an outcome record: the ids, and its place in the partition's chain.
    pub(super) fn outcome_headers(
        partition: u32,
        record: &OutcomeRecord,
        place: Place,
    ) -> Result<(String, HeaderMap), Error> {
        if !is_token(&record.key) {
            return Err(Error::Refused(format!("{:?} is not a subject token", record.key)));
        }
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_CMD_ID, header_value(HEADER_CMD_ID, &record.cmd_id)?);
        headers.insert(HEADER_CMD_SEQ, record.cmd_seq.to_string());
        headers.insert(HEADER_PART, record.part.to_string());
        match place {
            Place::First { fence } => {
                headers.insert(HEADER_PREV_SEQ, fence.to_string());
                for (name, value) in fence_headers(partition, fence) {
                    headers.insert(name, value);
                }
            }
            Place::Later { index } => headers.insert(HEADER_BATCH_INDEX, index.to_string()),
            Place::Unfenced { prev } => headers.insert(HEADER_PREV_SEQ, prev.to_string()),
        }
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            outcome_msg_id(partition, record.cmd_seq, record.part).as_str(),
        );
        Ok((format!("lh.evt.{partition}.{}", record.key), headers))
    }

    /// Publishes one outcome record under the fence.
    pub(super) async fn append_record(&self, partition: u32, fence: u64, record: &OutcomeRecord) -> Appended {
        let (subject, headers) = match Self::outcome_headers(partition, record, Place::First { fence }) {
            Ok(message) => message,
            Err(e) => return Appended::Unknown(e.to_string()),
        };
        let message = PublishMessage::build().payload(record.payload.clone()).headers(headers);
        match self.publish(subject, message).await {
            Ok(ack) if ack.duplicate => Appended::Unknown(format!(
                "duplicate outcome {}: stored at {}",
                outcome_msg_id(partition, record.cmd_seq, record.part),
                ack.sequence
            )),
            Ok(ack) => Appended::Landed { first: ack.sequence, last: ack.sequence },
            Err(e) => append_error(&e),
        }
    }

    /// Publishes `records` as one ADR-50 atomic batch: the fence on the first message only, `Lh-Batch-Index` on
    /// the rest. The server checks the fence against the stream as it was before the batch and stores all of it,
    /// contiguously, or nothing.
    pub(super) async fn append_batch(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        let mut messages = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let place = if index == 0 { Place::First { fence } } else { Place::Later { index } };
            match Self::outcome_headers(partition, record, place) {
                Ok((subject, headers)) => messages.push((subject, headers, record.payload.clone())),
                Err(e) => return Appended::Unknown(e.to_string()),
            }
        }
        match self.atomic_batch(messages).await {
            Ok(last) => Appended::Landed { first: last + 1 - records.len() as u64, last },
            Err(BatchFailed::Refused { code, description, first }) => batch_refusal(code, &description, first),
            Err(BatchFailed::TooLarge(why)) => Appended::TooLarge(why),
            Err(BatchFailed::Unknown(why)) => Appended::Unknown(why),
        }
    }

    /// Sends `messages` (subject, headers, payload) as one ADR-50 atomic batch and answers the sequence of its last
    /// message once stored: the batch is stored contiguously, so message `i` of `n` is at `last + 1 - n + i`.
    /// Only the first message and the commit ask for an answer, so the batch costs one round trip; a refused first
    /// message (too many open batches) never opened the batch, and the server drops the rest of it.
    async fn atomic_batch(&self, messages: Vec<(String, HeaderMap, Bytes)>) -> Result<u64, BatchFailed> {
        let client = &self.inner.client;
        let n = messages.len();
        // A message the server would refuse for its size must not go out half-way through a batch: the batch would
        // stay open until the server's timeout, holding one of the few open batches a stream allows.
        let max_payload = client.server_info().max_payload;
        for (i, (_, headers, payload)) in messages.iter().enumerate() {
            // As the client counts it: "NATS/1.0\r\n", "<name>: <value>\r\n" per value, "\r\n"; plus the batch headers.
            let header_bytes: usize = headers
                .iter()
                .map(|(name, values)| {
                    values.iter().map(|v| AsRef::<str>::as_ref(name).len() + v.as_str().len() + 4).sum::<usize>()
                })
                .sum();
            let size = payload.len() + header_bytes + 12 + BATCH_HEADER_BYTES;
            if max_payload > 0 && size > max_payload {
                return Err(BatchFailed::TooLarge(format!(
                    "message {} of the batch would be about {size} bytes with its headers, over the server's \
                     max_payload of {max_payload}",
                    i + 1
                )));
            }
        }
        let inbox = client.new_inbox();
        let batch = inbox.rsplit('.').next().unwrap_or("batch").to_owned();
        let mut replies = client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| BatchFailed::Unknown(format!("cannot take answers to a batch: {e}")))?;
        for (i, (subject, mut headers, payload)) in messages.into_iter().enumerate() {
            headers.insert(async_nats::header::NATS_BATCH_ID, batch.as_str());
            headers.insert(async_nats::header::NATS_BATCH_SEQUENCE, (i + 1).to_string());
            let sent = if i + 1 == n {
                headers.insert(async_nats::header::NATS_BATCH_COMMIT, async_nats::header::NATS_BATCH_COMMIT_FINAL);
                client.publish_with_reply_and_headers(subject, format!("{inbox}.commit"), headers, payload).await
            } else if i == 0 {
                client.publish_with_reply_and_headers(subject, format!("{inbox}.first"), headers, payload).await
            } else {
                client.publish_with_headers(subject, headers, payload).await
            };
            sent.map_err(|e| BatchFailed::Unknown(format!("batch {batch}: message {} not sent: {e}", i + 1)))?;
        }
        let deadline = Instant::now() + self.inner.config.request_timeout;
        loop {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    return Err(BatchFailed::Unknown(format!(
                        "the connection closed before batch {batch} was answered"
                    )));
                }
                Err(_) => {
                    return Err(BatchFailed::Unknown(format!(
                        "batch {batch} of {n} messages was not answered in {:?}",
                        self.inner.config.request_timeout
                    )));
                }
            };
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return Err(BatchFailed::Unknown(format!("no stream takes batch {batch}: nothing stored")));
            }
            let commit = reply.subject.ends_with(".commit");
            match batch_answer(&reply.payload) {
                // The first message was staged: wait for the commit.
                BatchAnswer::Taken if !commit => {}
                BatchAnswer::Stored { seq, count, id } if commit => {
                    if id.as_deref() != Some(batch.as_str()) || count != n as u64 || seq < count {
                        return Err(BatchFailed::Unknown(format!(
                            "batch {batch} of {n} messages was answered for batch {id:?} of {count} at {seq}"
                        )));
                    }
                    return Ok(seq);
                }
                BatchAnswer::Refused { code, description } => {
                    return Err(BatchFailed::Refused {
                        code,
                        description: format!("batch {batch}: {description}"),
                        first: !commit,
                    });
                }
                other => return Err(BatchFailed::Unknown(format!("batch {batch}: unexpected answer {other:?}"))),
            }
        }
    }

    /// Publishes commands as atomic batches of up to [`crate::MAX_APPEND_RECORDS`]: one fsync per batch under
    /// `sync_interval: always`, and every command's sequence from the one acknowledgement. A batch the server
    /// refuses whole (one id already stored, which is how a retry looks: 10201; too many open batches) or does
    /// not answer stores nothing or everything, so it is published again command by command, where each id's
    /// dedupe answers for itself (a duplicate names the first copy).
    pub(super) async fn publish_batched(&self, commands: &[Publish]) -> Vec<Result<Published, Error>> {
        let mut answers: Vec<Option<Result<Published, Error>>> = vec![None; commands.len()];
        let mut valid = Vec::new();
        for (i, command) in commands.iter().enumerate() {
            match self.command_headers(&command.subject, &command.msg_id) {
                Ok(headers) => valid.push((i, headers)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        // LH_CMD made before batched ingest and not upgraded yet: all of them one by one.
        let atomic = self.streams().is_ok_and(|s| s.cmd_atomic);
        let cap = if atomic { self.inner.ingest_cap.load(Ordering::Relaxed).max(1) } else { valid.len().max(1) };
        for chunk in valid.chunks(cap) {
            let stored = if atomic {
                let messages = chunk
                    .iter()
                    .map(|(i, headers)| (commands[*i].subject.clone(), headers.clone(), commands[*i].payload.clone()))
                    .collect();
                self.atomic_batch(messages).await
            } else {
                Err(BatchFailed::TooLarge("LH_CMD does not allow atomic batches".to_owned()))
            };
            match stored {
                Ok(last) => {
                    let first = last + 1 - chunk.len() as u64;
                    for (k, (i, _)) in chunk.iter().enumerate() {
                        answers[*i] = Some(Ok(Published { seq: first + k as u64, duplicate: false }));
                    }
                }
                Err(failed) => {
                    if matches!(&failed, BatchFailed::Refused { code, .. }
                        if ErrorCode(*code) == ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH)
                    {
                        self.inner.ingest_cap.store((chunk.len() / 2).max(1), Ordering::Relaxed);
                    }
                    // Refused whole, too large, or not answered: nothing of it is stored, or all of it. A command
                    // whose batch was stored but not answered comes back `duplicate` with the sequence the batch
                    // gave it: stored once, though this call stored it.
                    tracing::debug!(?failed, commands = chunk.len(), "a command batch did not land whole; one by one");
                    self.publish_one_by_one(commands, chunk, &mut answers).await;
                }
            }
        }
        answers.into_iter().map(|a| a.unwrap_or_else(|| Err(Error::Unavailable("not published".to_owned())))).collect()
    }
}

/// Why an atomic batch was not stored: refused by the server (nothing stored), not sent for a message too large,
/// or no clean answer.
#[derive(Debug)]
enum BatchFailed {
    Refused { code: u64, description: String, first: bool },
    TooLarge(String),
    Unknown(String),
}

/// Bytes the batch headers add to a message (`Nats-Batch-Id` of 22 characters, `Nats-Batch-Sequence` of up to four
/// digits, `Nats-Batch-Commit`), rounded up.
const BATCH_HEADER_BYTES: usize = 128;

/// Where an outcome record stands in its append.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    /// The first record: chained on the fence, which it carries.
    First { fence: u64 },
    /// A later record of an atomic batch: the record stored just before it is its predecessor.
    Later { index: usize },
    /// Chained on `prev` without a fence: the benchmark's loads, on a stream nothing else writes to (the benchmarks
    /// come with feature `embedded`).
    #[cfg_attr(not(feature = "embedded"), allow(dead_code))]
    Unfenced { prev: u64 },
}

/// What the server answered to a message of an atomic batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchAnswer {
    /// The first message was taken (an empty answer).
    Taken,
    /// The batch was stored: the commit's acknowledgement.
    Stored {
        seq: u64,
        count: u64,
        id: Option<String>,
    },
    Refused {
        code: u64,
        description: String,
    },
    Garbled(String),
}

pub(crate) fn batch_answer(payload: &[u8]) -> BatchAnswer {
    if payload.is_empty() {
        return BatchAnswer::Taken;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return BatchAnswer::Garbled(String::from_utf8_lossy(payload).into_owned());
    };
    if let Some(error) = value.get("error") {
        return BatchAnswer::Refused {
            code: error.get("err_code").and_then(serde_json::Value::as_u64).unwrap_or(0),
            description: error.get("description").and_then(serde_json::Value::as_str).unwrap_or("").to_owned(),
        };
    }
    match (value.get("seq").and_then(serde_json::Value::as_u64), value.get("count").and_then(serde_json::Value::as_u64))
    {
        (Some(seq), Some(count)) => BatchAnswer::Stored {
            seq,
            count,
            id: value.get("batch").and_then(serde_json::Value::as_str).map(str::to_owned),
        },
        _ => BatchAnswer::Garbled(value.to_string()),
    }
}

/// What a refused atomic batch means: [`refused_append`] of its code, saying which message was refused (a refused
/// first message never opened the batch).
pub(crate) fn batch_refusal(code: u64, description: &str, first: bool) -> Appended {
    let which = if first { "first message" } else { "commit" };
    refused_append(ErrorCode(code), &format!("{which} refused ({code}): {description}"))
}

/// What the server's refusal of an append (one record, or an atomic batch) means, as DESIGN section 3 says; `text`
/// is its message. Nothing was stored in any case:
/// - a stale fence (10071) names the partition's last sequence: reload;
/// - in flight on a replicated stream (10164), not ready after a leader change (10163), too many open batches
///   (10210): busy, the same append again;
/// - a batch over the server's `max_msgs` (10199), or atomic batches turned off on the stream since we connected
///   (10174): too large, smaller appends land, down to one record;
/// - anything else says something unexpected: unknown, reload.
fn refused_append(code: ErrorCode, text: &str) -> Appended {
    match code {
        ErrorCode::STREAM_WRONG_LAST_SEQUENCE => {
            Appended::Stale { last: sequence_after(text, "wrong last sequence: ") }
        }
        ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
        | ErrorCode::STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_NOT_READY
        | ErrorCode::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT => Appended::Busy(text.to_owned()),
        ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH | ErrorCode::ATOMIC_PUBLISH_DISABLED => {
            Appended::TooLarge(text.to_owned())
        }
        _ => Appended::Unknown(text.to_owned()),
    }
}

/// What a failed command publish means: refused (too large, or refused by the server) or unavailable.
pub(super) fn publish_command_error(subject: &str, e: PublishError) -> Error {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => Error::Refused(format!("the command is too large: {e}")),
        PublishErrorKind::StreamNotFound => Error::Unavailable(format!("no stream takes {subject}: {e}")),
        PublishErrorKind::Other => match std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
            .map(async_nats::jetstream::Error::error_code)
        {
            Some(code) if in_process_elsewhere(code) => {
                Error::Unavailable(format!("the command is being stored by an earlier publish of it: {e}"))
            }
            Some(_) => Error::Refused(format!("the log refused the command: {e}")),
            None => unavailable("the command was not acknowledged", e),
        },
        _ => unavailable("the command was not acknowledged", e),
    }
}

/// A refusal that only says another publish of the same command id is being stored right now (a retry sent while
/// the first attempt's answer is late): sending it again later gets the first copy's answer, a duplicate.
fn in_process_elsewhere(code: ErrorCode) -> bool {
    code == ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT
}

/// What a refused or failed outcome publish means: a server's refusal as [`refused_append`] says, anything else
/// (a timeout, a lost connection) unknown.
fn append_error(e: &PublishError) -> Appended {
    let server = std::error::Error::source(e).and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>());
    let text = server.map_or_else(|| e.to_string(), ToString::to_string);
    match (e.kind(), server) {
        (PublishErrorKind::WrongLastSequence, _) => refused_append(ErrorCode::STREAM_WRONG_LAST_SEQUENCE, &text),
        (_, Some(server)) => refused_append(server.error_code(), &text),
        _ => Appended::Unknown(e.to_string()),
    }
}

/// The number after the last `marker` in `text`.
pub(crate) fn sequence_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.rfind(marker)? + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// A dead letter as a message on its subject, stored once per source sequence (`dlq:<seq>`).
pub(crate) fn dead_letter_message(letter: &DeadLetter) -> Result<(String, PublishMessage), Error> {
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_DLQ_REASON, header_value(HEADER_DLQ_REASON, &letter.header_reason())?);
    headers.insert(HEADER_DLQ_SOURCE_SEQ, letter.source_seq.to_string());
    headers.insert(HEADER_DLQ_SOURCE_SUBJECT, header_value(HEADER_DLQ_SOURCE_SUBJECT, &letter.source_subject)?);
    match &letter.command_id {
        Some(LetterId { id, verified: true }) => headers.insert(HEADER_CMD_ID, header_value(HEADER_CMD_ID, id)?),
        Some(LetterId { id, verified: false }) => {
            headers.insert(HEADER_DLQ_PRODUCER_ID, header_value(HEADER_DLQ_PRODUCER_ID, id)?);
        }
        None => {}
    }
    let message = PublishMessage::build()
        .payload(letter.payload.clone())
        .headers(headers)
        .message_id(format!("dlq:{}", letter.source_seq));
    Ok((letter.subject(), message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_answers_map_as_section_3_says() {
        assert_eq!(batch_answer(b""), BatchAnswer::Taken);
        assert_eq!(
            batch_answer(br#"{"stream":"LH_EVT","seq":12,"batch":"b1","count":3}"#),
            BatchAnswer::Stored { seq: 12, count: 3, id: Some("b1".to_owned()) }
        );
        let refused = batch_answer(
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 59"},"stream":"LH_EVT","seq":0}"#,
        );
        let BatchAnswer::Refused { code, description } = refused else { panic!("{refused:?}") };
        assert_eq!(batch_refusal(code, &description, false), Appended::Stale { last: Some(59) });
        assert!(matches!(batch_refusal(10210, "atomic publish too many inflight", true), Appended::Busy(_)));
        assert!(matches!(batch_refusal(10164, "not ready", false), Appended::Busy(_)));
        assert!(matches!(batch_refusal(10199, "atomic publish batch is too large", false), Appended::TooLarge(_)));
        assert!(matches!(batch_refusal(10174, "atomic publish is disabled", false), Appended::TooLarge(_)));
        assert!(matches!(batch_refusal(10201, "duplicate message id", false), Appended::Unknown(_)));
        assert!(matches!(batch_answer(b"garbage"), BatchAnswer::Garbled(_)));
    }

    #[test]
    fn a_retry_while_the_first_copy_is_stored_is_tried_again_not_refused() {
        assert!(in_process_elsewhere(ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT));
        assert!(!in_process_elsewhere(ErrorCode::STREAM_WRONG_LAST_SEQUENCE));
    }
}
