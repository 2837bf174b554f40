//! The bodies of the fuzz targets of this crate's decoders (the `fuzz/` crate beside the workspace), shared with the
//! test that replays the committed corpus (`tests/fuzz_corpus.rs`), so that CI runs every input the fuzzer kept
//! through the same code the fuzzer ran.
//!
//! Each function takes any bytes. A decoding error is an answer; a panic is a finding: the decoder panicked, or it
//! broke one of the promises checked here (an export a reader takes is one a writer writes again, and reads back
//! the same).

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use leasehold_schemas::Timestamp;

use crate::jetstream::{
    BatchAnswer, acked_sequence, batch_answer, batch_refusal, dead_letter_message, sequence_after, stored_dead_letter,
    stored_outcome,
};
use crate::{CommandRecord, DeadLetter};

/// A record as JetStream hands it over, written as text: the subject on the first line, then `Name: value` header
/// lines, an empty line, and the payload. Read the way the JetStream backend reads a stored outcome (its subject
/// and the `Lh-*` headers), a dead letter, a command it must dead-letter, an acknowledgement's reply subject and a
/// batch's answer. Answers what the record read as (for the test of the seeds; the fuzz target ignores it).
pub fn stored(bytes: &[u8]) -> Stored {
    let (head, payload) = match bytes.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&bytes[..at], Bytes::copy_from_slice(&bytes[at + 2..])),
        None => (bytes, Bytes::new()),
    };
    let Ok(head) = std::str::from_utf8(head) else { return Stored::default() };
    let mut lines = head.split('\n');
    let subject = lines.next().unwrap_or_default();
    let headers = headers_of(lines);
    let mut read = Stored::default();

    // Sequence 1 has no predecessor for a later record of a batch to name; the last sequence has one.
    for seq in [1, u64::MAX] {
        if let Ok(outcome) = stored_outcome(seq, subject, Some(&headers), payload.clone()) {
            assert_eq!(outcome.seq, seq, "an outcome keeps its sequence");
            read.outcome = true;
        }
    }
    let _ = stored_outcome(2, subject, None, payload.clone());
    if let Ok((seq, letter)) = stored_dead_letter(2, subject, &headers, payload.clone()) {
        assert_eq!(seq, 2, "a dead letter keeps its sequence");
        store_again(&letter);
        read.dead_letter = true;
    }
    // A command stored on this subject with this payload, refused by a writer: its letter can be stored.
    let command = CommandRecord { seq: 2, subject: subject.to_owned(), time: Timestamp(2), payload };
    let producer_id = headers.get_last("Nats-Msg-Id").map(HeaderValue::as_str);
    store_again(&DeadLetter::of(3, &command, format!("undecodable: {subject}")).with_producer_id(producer_id));

    read.acked = acked_sequence(subject);
    match batch_answer(&command.payload) {
        BatchAnswer::Refused { code, description } => {
            read.batch_refused = true;
            let _ = batch_refusal(code, &description, true);
            let _ = batch_refusal(code, &description, false);
        }
        BatchAnswer::Stored { .. } => read.batch_stored = true,
        BatchAnswer::Taken | BatchAnswer::Garbled(_) => {}
    }
    let _ = sequence_after(&String::from_utf8_lossy(&command.payload), "wrong last sequence: ");
    read
}

/// What [`stored`] read a record as.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// A stored outcome (its subject and `Lh-*` headers).
    pub outcome: bool,
    /// A dead letter (its subject and `Lh-Source-*` headers).
    pub dead_letter: bool,
    /// The stream sequence of an acknowledgement's reply subject.
    pub acked: Option<u64>,
    /// A batch's answer that it was stored, or refused.
    pub batch_stored: bool,
    pub batch_refused: bool,
}

/// The headers of the lines `Name: value`; a line that is not a header NATS could deliver is left out.
fn headers_of<'a>(lines: impl Iterator<Item = &'a str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (Ok(name), Ok(value)) = (HeaderName::from_str(name), HeaderValue::from_str(value.trim_start())) else {
            continue;
        };
        headers.append(name, value);
    }
    headers
}

/// What the log does with a dead letter: its subject, its reason as a header, its message (or a refusal, for a
/// value no header can hold), with its bytes and without.
fn store_again(letter: &DeadLetter) {
    let reason = letter.header_reason();
    assert!(reason.len() <= 512 && !reason.contains(char::is_control), "{reason:?} fits in a header");
    let subject = letter.subject();
    assert!(subject.starts_with(&format!("lh.dlq.{}.", letter.partition)), "{subject:?}");
    let _ = dead_letter_message(letter);
    let _ = dead_letter_message(&letter.without_bytes("too large for the dead-letter log"));
}

#[cfg(feature = "embedded")]
pub use self::export_file::export;

#[cfg(feature = "embedded")]
mod export_file {
    use crate::Error;
    use crate::export::{Entry, Header, MAGIC, Reader, Trailer, Writer};

    /// An export file: read as given (a frame whose checksum does not match is refused, which is where nearly every
    /// input stops), then with every frame's checksum made to match its bytes, so that the fuzzer gets past the
    /// checksums to the header, the records and the order the reader checks. What a reader takes, a writer writes
    /// again, and that reads back the same.
    pub fn export(bytes: &[u8]) {
        let _ = read_all(bytes);
        let mut fixed = bytes.to_vec();
        fix_checksums(&mut fixed);
        let counted = count_frames(&fixed);
        let Ok((header, entries, trailer)) = read_all(&fixed) else { return };
        assert_eq!(counted.as_ref(), Ok(&trailer), "a file whose records decode has frames a counting reader takes");
        let written = futures::executor::block_on(write_all(&header, &entries))
            .unwrap_or_else(|e| panic!("a writer refuses what a reader took: {e}"));
        let again = read_all(&written).unwrap_or_else(|e| panic!("a reader refuses what a writer wrote: {e}"));
        assert_eq!(again, (header, entries, trailer), "written again, an export reads back the same");
    }

    /// The header, every entry and the trailer, or the first error.
    fn read_all(bytes: &[u8]) -> Result<(Header, Vec<Entry>, Trailer), Error> {
        futures::executor::block_on(async {
            let (mut reader, header) = Reader::open(bytes).await?;
            let mut entries = Vec::new();
            while let Some(entry) = reader.next().await? {
                entries.push(entry);
            }
            let trailer = reader.trailer().expect("a reader that ended has read the trailer");
            Ok((header, entries, trailer))
        })
    }

    /// The trailer, read frame by frame without decoding the records ([`Reader::next_frame`]).
    fn count_frames(bytes: &[u8]) -> Result<Trailer, Error> {
        futures::executor::block_on(async {
            let (mut reader, _) = Reader::open(bytes).await?;
            while reader.next_frame().await?.is_some() {}
            Ok(reader.trailer().expect("a reader that ended has read the trailer"))
        })
    }

    async fn write_all(header: &Header, entries: &[Entry]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let mut writer = Writer::new(&mut out, header).await?;
        for entry in entries {
            writer.write(entry).await?;
        }
        writer.finish().await?;
        Ok(out)
    }

    /// Sets the checksum of every whole frame after the magic to the one of its kind, length and payload.
    fn fix_checksums(bytes: &mut [u8]) {
        let mut at = MAGIC.len();
        while let Some(head) = bytes.get(at..at + 9) {
            let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let Some(end) = (at + 9).checked_add(len).filter(|end| *end <= bytes.len()) else { return };
            let mut crc = crc32fast::Hasher::new();
            crc.update(&bytes[at..at + 5]);
            crc.update(&bytes[at + 9..end]);
            bytes[at + 5..at + 9].copy_from_slice(&crc.finalize().to_le_bytes());
            at = end;
        }
    }
}
