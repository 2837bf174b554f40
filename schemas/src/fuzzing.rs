//! The bodies of the fuzz targets of this crate's decoders (the `fuzz/` crate beside the workspace), shared with the
//! test that replays the committed corpus (`tests/fuzz_corpus.rs`), so that CI runs every input the fuzzer kept
//! through the same code the fuzzer ran.
//!
//! Each function takes any bytes. A decoding error is an answer; a panic is a finding: the decoder panicked, or it
//! broke one of the promises checked here (what decodes encodes again and decodes to the same value, in either
//! form; the id read from a header alone is the one the whole command names; the subjects a producer is told to
//! publish on are ones a writer takes).

use crate::codec::{self, CodecErrorKind};
use crate::command::{Heartbeat, Release};
use crate::ids::{AgentName, Position, ResourceId};
use crate::{Command, Envelope, subjects};

/// A command as a writer reads it from the log: [`codec::decode_command`], which takes either form (the corpus is
/// mostly bincode), and [`codec::peek_command_id`], which reads the id of a dead letter.
pub fn command_bincode(bytes: &[u8]) {
    let peeked = codec::peek_command_id(bytes);
    let Ok(envelope) = codec::decode_command(bytes) else { return };
    assert_eq!(peeked, Some(envelope.command_id), "the id read from the header alone is the command's");
    let again = encode_again(&envelope, false);
    same_in_json(&envelope, &again);
}

/// A command in the JSON form, as the gateway and `leasehold publish --file` take it from producers
/// ([`codec::command_from_json`]).
pub fn command_json(bytes: &[u8]) {
    let peeked = codec::peek_command_id(bytes);
    let Ok(envelope) = codec::command_from_json(bytes) else { return };
    assert_eq!(peeked, Some(envelope.command_id), "the id read from the top level alone is the command's");
    let again = encode_again(&envelope, true);
    same_in_json(&envelope, &again);
}

/// An outcome, as every reader of the outcome log decodes it ([`codec::decode_outcome`]).
pub fn outcome(bytes: &[u8]) {
    let Ok(outcome) = codec::decode_outcome(bytes) else { return };
    // Encoded again it is canonical (no longer than what was read) and so within the limit what was read was in.
    let written = codec::encode_outcome(&outcome).unwrap_or_else(|e| panic!("a decoded outcome does not encode: {e}"));
    let again = codec::decode_outcome(&written).unwrap_or_else(|e| panic!("an encoded outcome does not decode: {e}"));
    assert_eq!(again, outcome, "an outcome encoded again decodes to itself");
}

/// A stored or ingress subject, a line break, then a command payload in either form: what a writer checks before
/// it decides a command (`leasehold_worker::writer::admit`: [`subjects::check_subject`] and
/// [`subjects::bound_principal`]). A payload that does not decode is checked against two fixed commands instead, so
/// that the subject alone is fuzzed too.
pub fn subject(bytes: &[u8]) {
    let (subject, payload) = match bytes.iter().position(|&b| b == b'\n') {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let Ok(subject) = std::str::from_utf8(subject) else { return };
    let bound = subjects::bound_principal(subject);
    let decoded = codec::decode_command(payload).ok();
    let commands = match &decoded {
        Some(envelope) => vec![envelope.body.clone()],
        None => fixed_commands(),
    };
    for command in &commands {
        if subjects::check_subject(subject, command).is_ok() {
            assert!(subject.starts_with("lh.in.") || subject.starts_with("lh.cmd."), "{subject:?} taken");
            if let Some(principal) = bound {
                assert!(command.class() == crate::CommandClass::Op, "{subject:?} binds a {} command", command.class());
                assert!(subjects::is_bindable(principal), "{subject:?} binds {principal:?}");
            }
        }
        subjects_producers_use_are_taken(command);
    }
    if let Some(envelope) = decoded
        && let Some(ingress) = subjects::bound_ingress_subject(&envelope.body, &envelope.issuer)
    {
        assert!(subjects::check_subject(&ingress, &envelope.body).is_ok(), "{ingress:?} refused");
        assert_eq!(subjects::bound_principal(&ingress), Some(envelope.issuer.as_str()), "{ingress:?}");
    }
}

/// Encodes `envelope` in the bincode form and decodes it back: the same command, in the oldest schema version that
/// expresses it. Read from JSON, a command may be over the limit in bincode (a JSON object may leave out fields
/// that bincode spells); read from bincode it is not (it is written back canonically, in no more bytes).
fn encode_again(envelope: &Envelope, from_json: bool) -> Envelope {
    let written = match codec::encode_command(envelope) {
        Ok(written) => written,
        Err(e) if from_json && e.kind() == CodecErrorKind::TooLarge => return envelope.clone(),
        Err(e) => panic!("a decoded {} does not encode: {e}", envelope.type_name()),
    };
    let again = codec::decode_command(&written)
        .unwrap_or_else(|e| panic!("a {} encoded again does not decode: {e}", envelope.type_name()));
    assert_eq!(again, Envelope { schema_version: again.schema_version, ..envelope.clone() }, "encoded again");
    assert!(again.schema_version <= envelope.schema_version, "written in a version no newer than it was read in");
    again
}

/// The JSON form of `envelope` reads back as `again` (the command in its oldest version), unless it is over the
/// limit in JSON, which is larger than bincode.
fn same_in_json(envelope: &Envelope, again: &Envelope) {
    match codec::command_to_json(envelope) {
        Ok(json) => {
            let from_json = codec::command_from_json(json.as_bytes())
                .unwrap_or_else(|e| panic!("the JSON form of a decoded {} does not decode: {e}", envelope.type_name()));
            assert_eq!(&from_json, again, "the JSON form reads back as the command");
        }
        Err(e) => assert_eq!(e.kind(), CodecErrorKind::TooLarge, "a decoded command has a JSON form: {e}"),
    }
}

/// The subject a producer publishes `command` on, and the one the stream stores it under, are taken by a writer,
/// and are subjects NATS routes: five or six tokens, none empty, no wildcard or white space.
fn subjects_producers_use_are_taken(command: &Command) {
    let ingress = subjects::ingress_subject_of(command);
    assert!(subjects::check_subject(&ingress, command).is_ok(), "{ingress:?} refused");
    assert_eq!(subjects::bound_principal(&ingress), None, "{ingress:?} binds no principal");
    let tokens: Vec<&str> = ingress.split('.').collect();
    assert_eq!(tokens.len(), 5, "{ingress:?} is lh.in.<class>.<key>.<id>");
    assert!(
        tokens.iter().all(|t| !t.is_empty() && !t.contains(['*', '>']) && !t.contains(char::is_whitespace)),
        "{ingress:?} is a subject NATS routes"
    );
    let partitions = 7;
    let partition = subjects::partition_of_key(&command.key(), partitions);
    let stored = subjects::command_subject(partition, command.class(), &command.key(), command.subject_id());
    assert!(subjects::check_subject(&stored, command).is_ok(), "{stored:?} refused");
    assert_eq!(stored.split('.').nth(2), Some(partition.to_string().as_str()), "{stored:?} names its partition");
}

/// An agent's command and an operator's, for subjects fuzzed without a payload that decodes.
fn fixed_commands() -> Vec<Command> {
    let agent = AgentName::new("w1").expect("a valid name");
    let resource = ResourceId::from_parts(1_767_225_600_000, [0x11; 10]);
    vec![
        Heartbeat { agent: agent.clone(), epoch: Position(1) }.into(),
        Release { agent, resource, reason: None }.into(),
    ]
}

/// Runs `body` on every file of the corpus directory `dir` (`fuzz/corpus/<target>`), for the tests that replay it;
/// answers how many files it ran. A missing or empty directory is a failure: the corpus is what the test is for. A
/// file that panics is named, with the panic, after every file has run.
pub fn replay_corpus(dir: &std::path::Path, body: fn(&[u8])) -> usize {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("the fuzz corpus {} is missing: {e}", dir.display()));
    let mut files: Vec<_> = entries.map(|entry| entry.expect("a directory entry").path()).collect();
    files.sort();
    assert!(!files.is_empty(), "the fuzz corpus {} is empty", dir.display());
    let failed: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
            std::panic::catch_unwind(|| body(&bytes)).err().map(|panic| {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                format!("{}: {message}", file.display())
            })
        })
        .collect();
    assert!(failed.is_empty(), "{} of {} corpus files fail:\n{}", failed.len(), files.len(), failed.join("\n"));
    files.len()
}

/// With `LH_FUZZ_SEEDS=DIR` set, writes `seeds` (name and bytes) under `DIR/<target>/`, for a fuzzing run to start
/// from (`cargo fuzz run TARGET corpus/TARGET DIR/TARGET`); without it, does nothing.
pub fn write_seeds(target: &str, seeds: &[(String, Vec<u8>)]) {
    let Some(root) = std::env::var_os("LH_FUZZ_SEEDS") else { return };
    let dir = std::path::Path::new(&root).join(target);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    for (name, bytes) in seeds {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
    }
}
