//! The committed fuzz corpus of this crate's decoders (`fuzz/corpus/<target>/`, minimised by `cargo fuzz cmin`),
//! replayed through the bodies the fuzz targets run (`leasehold_log::fuzzing`): every input the fuzzer kept for its
//! coverage stays a test, run in CI without libFuzzer (README, "Fuzzing").
//!
//! The corpus grew from the seeds below: export files (one written now, an empty one, the committed one of format
//! version 1) and stored records as text. `LH_FUZZ_SEEDS=DIR` writes them under `DIR/<target>/`:
//!
//! ```text
//! LH_FUZZ_SEEDS=$PWD/fuzz/seeds cargo test -p leasehold-log --test fuzz_corpus
//! ```

use std::path::{Path, PathBuf};

use bytes::Bytes;
use leasehold_log::export::{Entry, Header, Reader, Writer};
use leasehold_log::fuzzing;
use leasehold_log::{CommandRecord, DeadLetter, LetterId, StoredOutcome};
use leasehold_schemas::command::Heartbeat;
use leasehold_schemas::fuzzing::{replay_corpus, write_seeds};
use leasehold_schemas::outcome::{CommandSummary, Decision, Effect};
use leasehold_schemas::{AgentName, CommandClass, CommandId, Envelope, Issuer, Key, Outcome, Position, Timestamp};
use leasehold_schemas::{codec, subjects};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

/// A heartbeat of agent `w1`, the command of the seeds.
fn heartbeat() -> Envelope {
    Envelope::new(
        CommandId::from_parts(1_767_225_600_000, [0x21; 10]),
        Issuer::new("w1").unwrap(),
        Timestamp(1_767_225_600_000),
        Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(1) },
    )
}

/// The outcome of the heartbeat, decided in partition `partition` at `cmd_seq`.
fn outcome(partition: u32, cmd_seq: u64) -> Outcome {
    Outcome {
        decider_version: 7,
        partition,
        command: CommandSummary::of(&heartbeat()),
        cmd_seq,
        part: 0,
        log_time: Timestamp(1_767_225_600_100),
        decided_at: Timestamp(1_767_225_600_100),
        decision: Decision::Accepted {
            first_position: Position(1),
            effects: vec![Effect::AgentSeen { at: Timestamp(1_767_225_600_100) }],
        },
    }
}

/// Export files: one with a command, an outcome and a dead letter of each kind of id, one without records, and the
/// committed file of format version 1 (whose dead letters are frames `D`).
fn export_seeds() -> Vec<(String, Vec<u8>)> {
    let envelope = heartbeat();
    let payload = Bytes::from(codec::encode_command(&envelope).unwrap());
    let partition = subjects::partition_of_key(&envelope.body.key(), 4);
    let stored =
        subjects::command_subject(partition, CommandClass::Agent, &envelope.body.key(), envelope.body.subject_id());
    let command = CommandRecord { seq: 1, subject: stored.clone(), time: Timestamp(1_767_225_600_100), payload };
    let decided = outcome(partition, 1);
    let entries = vec![
        Entry::Command { partition, record: command.clone() },
        Entry::Outcome(StoredOutcome {
            seq: 1,
            partition,
            key: Key::Agent(AgentName::new("w1").unwrap()).token(),
            cmd_id: envelope.command_id.to_string(),
            cmd_seq: 1,
            part: 0,
            prev_seq: 0,
            payload: Bytes::from(codec::encode_outcome(&decided).unwrap()),
        }),
        Entry::DeadLetter { seq: 1, letter: DeadLetter::of(partition, &command, "a test's letter".to_owned()) },
        Entry::DeadLetter {
            seq: 2,
            letter: DeadLetter {
                partition,
                source_seq: 2,
                source_subject: stored,
                reason: "unknown format: garbage".to_owned(),
                payload: Bytes::from_static(b"\x07garbage"),
                command_id: Some(LetterId { id: "producer-7".to_owned(), verified: false }),
            },
        },
    ];
    let file = |entries: &[Entry]| {
        futures::executor::block_on(async {
            let header = Header::new(7, 4, 1, "a fuzz seed");
            let mut out = Vec::new();
            let mut writer = Writer::new(&mut out, &header).await.unwrap();
            for entry in entries {
                writer.write(entry).await.unwrap();
            }
            writer.finish().await.unwrap();
            out
        })
    };
    let v1 =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/export-v1-dead-letters.lhexport"))
            .unwrap();
    vec![("records".to_owned(), file(&entries)), ("empty".to_owned(), file(&[])), ("v1".to_owned(), v1)]
}

/// Stored records as text (subject, header lines, an empty line, payload): an outcome fenced and one later in an
/// atomic batch, a dead letter with each kind of id and one stored before ids were, an acknowledgement's reply
/// subject, and a batch's answers.
fn stored_seeds() -> Vec<(String, Vec<u8>)> {
    let command = codec::encode_command(&heartbeat()).unwrap();
    let id = heartbeat().command_id;
    let decided = codec::encode_outcome(&outcome(5, 12)).unwrap();
    let seed = |head: String, payload: &[u8]| {
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(b"\n\n");
        bytes.extend_from_slice(payload);
        bytes
    };
    let seeds = [
        ("outcome", seed(format!("lh.evt.5.w1\nLh-Cmd-Id: {id}\nLh-Cmd-Seq: 12\nLh-Part: 0\nLh-Prev-Seq: 40"), &decided)),
        ("outcome-in-batch", seed(format!("lh.evt.5.@ips\nLh-Cmd-Id: {id}\nLh-Cmd-Seq: 12\nLh-Part: 1\nLh-Batch-Index: 1"), &decided)),
        (
            "dead-letter",
            seed(
                format!("lh.dlq.5.agent.w1._\nLh-Reason: undecodable: cut\nLh-Source-Seq: 9\nLh-Source-Subject: lh.cmd.5.agent.w1._\nLh-Cmd-Id: {id}"),
                &command[..command.len() - 1],
            ),
        ),
        (
            "dead-letter-producer-id",
            seed(
                "lh.dlq.5.op.w1._\nLh-Reason: unknown format\nLh-Source-Seq: 10\nLh-Source-Subject: lh.cmd.5.op.w1._\nLh-Producer-Msg-Id: p-1\nNats-Msg-Id: p-1".to_owned(),
                b"\x07garbage",
            ),
        ),
        ("dead-letter-old", seed("lh.dlq.5.agent.w1._\nLh-Source-Seq: 11\nLh-Source-Subject: lh.cmd.5.agent.w1._".to_owned(), &command)),
        ("ack", seed("$JS.ACK.LH_CMD.lh-writer-7.1.3.2.1795409385075890669.2".to_owned(), b"")),
        ("ack-domain", seed("$JS.ACK._.szMpdrwD.LH_CMD.lh-writer-7.2.50.9.1795409385075890669.0".to_owned(), b"")),
        ("batch-stored", seed("_INBOX.x".to_owned(), br#"{"stream":"LH_EVT","seq":12,"batch":"b1","count":3}"#)),
        (
            "batch-refused",
            seed(
                "_INBOX.x".to_owned(),
                br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 41"}}"#,
            ),
        ),
    ];
    seeds.into_iter().map(|(name, bytes)| (name.to_owned(), bytes)).collect()
}

#[test]
fn the_seeds_are_real_records() {
    let exports = export_seeds();
    for (name, bytes) in &exports {
        let read = futures::executor::block_on(async {
            let (mut reader, _) = Reader::open(&bytes[..]).await?;
            let mut n = 0;
            while reader.next().await?.is_some() {
                n += 1;
            }
            Ok::<_, leasehold_log::Error>(n)
        });
        assert!(read.is_ok(), "{name}: {read:?}");
        fuzzing::export(bytes);
    }
    let stored = stored_seeds();
    for (name, bytes) in &stored {
        let read = fuzzing::stored(bytes);
        let expected = match name.as_str() {
            "outcome" | "outcome-in-batch" => read.outcome,
            "dead-letter" | "dead-letter-producer-id" | "dead-letter-old" => read.dead_letter,
            "ack" => read.acked == Some(3),
            "ack-domain" => read.acked == Some(50),
            "batch-stored" => read.batch_stored,
            "batch-refused" => read.batch_refused,
            other => panic!("a seed {other} without an expectation"),
        };
        assert!(expected, "{name} reads as {read:?}");
    }
    write_seeds("export", &exports);
    write_seeds("stored", &stored);
}

#[test]
fn the_export_corpus_replays() {
    assert!(replay_corpus(&corpus("export"), fuzzing::export) > 0);
}

#[test]
fn the_stored_corpus_replays() {
    assert!(
        replay_corpus(&corpus("stored"), |bytes| {
            fuzzing::stored(bytes);
        }) > 0
    );
}
