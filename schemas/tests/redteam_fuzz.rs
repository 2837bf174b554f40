//! Red team: no input panics the decoders, and whatever any mutated input decodes to round-trips through both forms
//! and fits its own subject. Mutations of every committed fixture (bincode and JSON) with a fixed-seed generator,
//! lying lengths, and deeply nested JSON.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::subjects::{check_subject, ingress_subject_of};
use leasehold_schemas::{Envelope, Outcome};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

fn is_command(name: &str) -> bool {
    ["op.", "agent.", "sys."].iter().any(|c| name.starts_with(c))
}

/// Every fixture file with the given extension, as (name, bytes).
fn fixtures(extension: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

/// Mutants per fixture: 400 by default (a second or so); `RT_FUZZ=<n>` for a longer run, `RT_SEED=<n>` for others.
fn rounds() -> usize {
    std::env::var("RT_FUZZ").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
}

fn seed(default: u64) -> u64 {
    std::env::var("RT_SEED").ok().and_then(|v| v.parse().ok()).map_or(default, |s: u64| s ^ default)
}

/// xorshift64*: a fixed sequence, so a failure is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const SPECIAL_BYTES: [u8; 10] = [0x00, 0x01, 0x02, 0x10, 0x7f, 0xfa, 0xfb, 0xfc, 0xfd, 0xff];

fn mutate_bytes(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..1 + rng.below(3) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.below(bytes.len());
        match rng.below(7) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = SPECIAL_BYTES[rng.below(SPECIAL_BYTES.len())],
            2 => bytes[at] = rng.next() as u8,
            3 => {
                bytes.remove(at);
            }
            4 => {
                // a lying length or integer: a wide varint with a large value
                let marker = [0xfbu8, 0xfc, 0xfd][rng.below(3)];
                let width = match marker {
                    0xfb => 2,
                    0xfc => 4,
                    _ => 8,
                };
                let value = rng.next().to_le_bytes();
                let replacement: Vec<u8> = std::iter::once(marker).chain(value[..width].iter().copied()).collect();
                bytes.splice(at..at + 1, replacement);
            }
            5 => bytes.truncate(at.max(1)),
            _ => {
                let end = (at + 1 + rng.below(8)).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
        }
    }
    bytes
}

const JSON_PIECES: [&str; 24] = [
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "0",
    "-",
    "1e9",
    "null",
    "\\ud800",
    "\\u0000",
    "A",
    " ",
    "\u{feff}",
    "18446744073709551616",
    "-0",
    "2.0",
    "true",
    "{}",
    "[]",
    "\"x\":1,",
];

fn mutate_json(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..1 + rng.below(2) {
        let at = 1 + rng.below(bytes.len() - 1);
        let piece = JSON_PIECES[rng.below(JSON_PIECES.len())].as_bytes();
        match rng.below(3) {
            0 => {
                bytes.splice(at..at, piece.iter().copied());
            }
            1 => {
                let end = (at + 1 + rng.below(4)).min(bytes.len());
                bytes.splice(at..end, piece.iter().copied());
            }
            _ => {
                let end = (at + 1 + rng.below(40)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
    bytes
}

/// A decoded command must round-trip through both forms and fit its own ingress subject.
fn check_command(envelope: &Envelope, input: &[u8]) -> Result<(), String> {
    let bytes = codec::encode_command(envelope).map_err(|e| format!("encode: {e}"))?;
    let back = codec::decode_command(&bytes).map_err(|e| format!("bincode of it: {e}"))?;
    if back != *envelope {
        return Err(format!("bincode round trip: {back:?} != {envelope:?}"));
    }
    let json = codec::command_to_json(envelope).map_err(|e| format!("to JSON: {e}"))?;
    let back = codec::decode_command(json.as_bytes()).map_err(|e| format!("its JSON {json}: {e}"))?;
    if back != *envelope {
        return Err(format!("JSON round trip: {back:?} != {envelope:?}"));
    }
    check_subject(&ingress_subject_of(&envelope.body), &envelope.body).map_err(|e| e.to_string())?;
    let _ = input;
    Ok(())
}

fn run_command(input: &[u8]) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| codec::decode_command(input))) {
        Err(_) => Err("the decoder panicked".to_owned()),
        Ok(Err(_)) => Ok(()),
        Ok(Ok(envelope)) => check_command(&envelope, input),
    }
}

fn run_outcome(input: &[u8]) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| codec::decode_outcome(input))) {
        Err(_) => Err("the decoder panicked".to_owned()),
        Ok(Err(_)) => Ok(()),
        Ok(Ok(outcome)) => {
            let bytes = codec::encode_outcome(&outcome).map_err(|e| format!("encode: {e}"))?;
            let back: Outcome = codec::decode_outcome(&bytes).map_err(|e| format!("decode again: {e}"))?;
            if back != outcome {
                return Err("outcome round trip differs".to_owned());
            }
            Ok(())
        }
    }
}

#[test]
fn mutated_bincode_never_panics_and_what_decodes_round_trips() {
    let mut rng = Rng(seed(0x5eed_0001));
    let mut problems = Vec::new();
    let mut decoded = 0usize;
    for (name, bytes) in fixtures("bin") {
        for _ in 0..rounds() {
            let input = mutate_bytes(&mut rng, &bytes);
            let result = if is_command(&name) { run_command(&input) } else { run_outcome(&input) };
            if is_command(&name) && codec::decode_command(&input).is_ok() {
                decoded += 1;
            }
            if let Err(problem) = result {
                problems.push(format!("{name}.bin mutated to {input:02x?}: {problem}"));
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s), first: {}", problems.len(), problems.first().unwrap());
    assert!(decoded > 100, "the mutations should also reach valid commands: {decoded}");
}

#[test]
fn mutated_json_never_panics_and_what_decodes_round_trips() {
    let mut rng = Rng(seed(0x5eed_0002));
    let mut problems = Vec::new();
    let mut decoded = 0usize;
    for (name, bytes) in fixtures("json").into_iter().filter(|(name, _)| is_command(name)) {
        for _ in 0..rounds() {
            let input = mutate_json(&mut rng, &bytes);
            if codec::decode_command(&input).is_ok() {
                decoded += 1;
            }
            if let Err(problem) = run_command(&input) {
                problems.push(format!("{name}.json mutated to {}: {problem}", String::from_utf8_lossy(&input)));
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s), first: {}", problems.len(), problems.first().unwrap());
    assert!(decoded > 100, "the mutations should also reach valid commands: {decoded}");
}

/// Nesting as deep as 1 MiB allows, in every place of a command: an error, not a stack overflow (which would abort
/// this whole test binary).
#[test]
fn deep_nesting_is_an_error() {
    let heartbeat = String::from_utf8(std::fs::read(fixtures_dir().join("agent.heartbeat.json")).unwrap()).unwrap();
    let depth = 400_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let objects = format!("{}1{}", "{\"a\":".repeat(depth / 5), "}".repeat(depth / 5));
    for nest in [&arrays, &objects] {
        let places = [
            heartbeat.replacen("\"epoch\": 3", &format!("\"epoch\": {nest}"), 1),
            heartbeat.replacen("\"epoch\": 3", &format!("\"epoch\": 3, \"x\": {nest}"), 1),
            heartbeat.replacen("\"schema_version\": 1,", &format!("\"schema_version\": 1, \"x\": {nest},"), 1),
            heartbeat.replacen("\"body\": {", &format!("\"x\": {nest}, \"body\": {{"), 1),
            format!("{}\"body\": {nest}}}", &heartbeat[..heartbeat.find("\"body\"").unwrap()]),
            format!("{{\"schema_version\": 2, \"x\": {nest}}}"),
        ];
        for text in places {
            assert!(text.len() <= codec::MAX_COMMAND_BYTES, "{}", text.len());
            let err = codec::decode_command(text.as_bytes()).expect_err("nested");
            assert_ne!(err.kind(), CodecErrorKind::Encode, "{err}");
        }
    }
}

/// Lying lengths and counts in bincode: a list, a map or a string said to hold 2^32 or 2^63 items, with nothing
/// after it. No allocation of that size, no panic.
#[test]
fn lying_lengths_in_bincode_are_errors() {
    let heartbeat = std::fs::read(fixtures_dir().join("agent.heartbeat.bin")).unwrap();
    let sync = std::fs::read(fixtures_dir().join("agent.sync.bin")).unwrap();
    let allocate = std::fs::read(fixtures_dir().join("op.allocate.bin")).unwrap();
    let lies: [&[u8]; 4] = [
        &[0xfc, 0xff, 0xff, 0xff, 0xff],
        &[0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        &[0xfd, 0, 0, 0, 0, 1, 0, 0, 0],
        &[0xfc, 0, 0, 0x10, 0],
    ];
    for base in [&heartbeat, &sync, &allocate] {
        for at in 2..base.len() {
            for lie in lies {
                let input = [&base[..at], lie].concat();
                assert!(run_command(&input).is_ok(), "{input:02x?}");
                let input = [&base[..at], lie, &base[at..]].concat();
                assert!(run_command(&input).is_ok(), "{input:02x?}");
            }
        }
    }
}

/// "The whole payload is UTF-8": a byte that is not UTF-8, anywhere in the payload (inside a string, a key, a value
/// the first pass only skips), is refused; so is a lone surrogate escape in any string.
#[test]
fn every_string_is_checked_for_utf8() {
    let allocate = std::fs::read(fixtures_dir().join("op.allocate.json")).unwrap();
    let end = allocate.iter().rposition(|b| *b == b'}').unwrap();
    for at in 1..=end {
        for bad in [&[0xffu8][..], &[0xc0, 0x80], &[0xed, 0xa0, 0x80]] {
            let input = [&allocate[..at], bad, &allocate[at..]].concat();
            assert!(codec::decode_command(&input).is_err(), "{bad:02x?} at {at}: {}", String::from_utf8_lossy(&input));
        }
    }
    let text = String::from_utf8(allocate).unwrap();
    let quotes: Vec<usize> = text.match_indices('"').map(|(i, _)| i).collect();
    for pair in quotes.chunks(2) {
        for escape in ["\\ud800", "\\udc00", "\\ud800\\u0041"] {
            let input = format!("{}{escape}{}", &text[..pair[0] + 1], &text[pair[0] + 1..]);
            assert!(codec::decode_command(input.as_bytes()).is_err(), "{escape} at {}: {input}", pair[0]);
        }
    }
}
