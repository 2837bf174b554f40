//! The committed fuzz corpus of this crate's decoders (`fuzz/corpus/<target>/`, minimised by `cargo fuzz cmin`),
//! replayed through the bodies the fuzz targets run (`leasehold_schemas::fuzzing`): every input the fuzzer kept for
//! its coverage stays a test, run in CI without libFuzzer (README, "Fuzzing").
//!
//! The corpus grew from the golden fixtures of every schema version (`tests/fixtures/v*/`) and, for the subject
//! target, from their subjects. `LH_FUZZ_SEEDS=DIR` writes those seeds under `DIR/<target>/`:
//!
//! ```text
//! LH_FUZZ_SEEDS=$PWD/fuzz/seeds cargo test -p leasehold-schemas --test fuzz_corpus
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use leasehold_schemas::codec;
use leasehold_schemas::fuzzing::{self, replay_corpus, write_seeds};
use leasehold_schemas::subjects;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

/// Every golden fixture whose name starts with one of `prefixes` and ends with `extension`, of every schema
/// version, as `v<version>.<file name>` and its bytes.
fn fixtures(prefixes: &[&str], extension: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found = Vec::new();
    for version in fs::read_dir(&root).unwrap() {
        let version = version.unwrap();
        for file in fs::read_dir(version.path()).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if prefixes.iter().any(|p| name.starts_with(p)) && name.ends_with(extension) {
                found.push((format!("{}.{name}", version.file_name().to_string_lossy()), fs::read(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

const COMMANDS: &[&str] = &["op.", "agent.", "sys."];

/// The subject target's seeds: each current command's payload under its ingress subject, its stored subject and,
/// for an operator's command, the subject of a producer bound to its issuer; and bare subjects of every shape.
fn subject_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let current = format!("v{}.", leasehold_schemas::SCHEMA_VERSION);
    for (name, payload) in fixtures(COMMANDS, ".bin").into_iter().chain(fixtures(COMMANDS, ".json")) {
        if !name.starts_with(&current) {
            continue;
        }
        let envelope = codec::decode_command(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
        let command = &envelope.body;
        let stored = subjects::command_subject(
            subjects::partition_of_key(&command.key(), 8),
            command.class(),
            &command.key(),
            command.subject_id(),
        );
        let mut subjects = vec![("in", subjects::ingress_subject_of(command)), ("cmd", stored)];
        subjects.extend(subjects::bound_ingress_subject(command, &envelope.issuer).map(|bound| ("bound", bound)));
        for (how, subject) in subjects {
            let mut seed = subject.into_bytes();
            seed.push(b'\n');
            seed.extend_from_slice(&payload);
            seeds.push((format!("{how}.{name}"), seed));
        }
    }
    let bare = [
        "lh.in.agent.w1._",
        "lh.cmd.5.agent.w1._",
        "lh.in.op.w1.019b76da-9478-7111-9111-111111111111",
        "lh.cmd.3.op@ci:team-a.w1.019b76da-9478-7111-9111-111111111111",
        "lh.in.op.@ips._",
        "lh.in.op.~019b76da-9478-7111-9111-111111111111._",
        "lh.evt.5.w1",
        "lh.dlq.2.op.w1._",
    ];
    seeds.extend(bare.iter().enumerate().map(|(i, s)| (format!("bare.{i}"), s.as_bytes().to_vec())));
    seeds
}

#[test]
fn the_seeds_are_real_encodings() {
    let bincode = fixtures(COMMANDS, ".bin");
    let json = fixtures(COMMANDS, ".json");
    let outcomes = fixtures(&["outcome."], ".bin");
    for (name, bytes) in bincode.iter().chain(&json) {
        assert!(codec::decode_command(bytes).is_ok(), "{name} decodes");
    }
    for (name, bytes) in &outcomes {
        assert!(codec::decode_outcome(bytes).is_ok(), "{name} decodes");
    }
    let subjects = subject_seeds();
    assert!(bincode.len() > 100 && json.len() > 100 && outcomes.len() >= 4 && subjects.len() > 200);
    // Each body keeps its promises on a real encoding too.
    for (_, bytes) in &bincode {
        fuzzing::command_bincode(bytes);
    }
    for (_, bytes) in &json {
        fuzzing::command_json(bytes);
    }
    for (_, bytes) in &outcomes {
        fuzzing::outcome(bytes);
    }
    for (_, bytes) in &subjects {
        fuzzing::subject(bytes);
    }
    write_seeds("command_bincode", &bincode);
    write_seeds("command_json", &json);
    write_seeds("outcome", &outcomes);
    write_seeds("subject", &subjects);
}

#[test]
fn the_command_bincode_corpus_replays() {
    assert!(replay_corpus(&corpus("command_bincode"), fuzzing::command_bincode) > 0);
}

#[test]
fn the_command_json_corpus_replays() {
    assert!(replay_corpus(&corpus("command_json"), fuzzing::command_json) > 0);
}

#[test]
fn the_outcome_corpus_replays() {
    assert!(replay_corpus(&corpus("outcome"), fuzzing::outcome) > 0);
}

#[test]
fn the_subject_corpus_replays() {
    assert!(replay_corpus(&corpus("subject"), fuzzing::subject) > 0);
}
