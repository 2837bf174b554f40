//! Red team: the two forms must agree. Whatever decodes from bincode must re-encode to JSON that decodes back to the
//! same value (and `command_to_json` output must always decode); the bincode form has the one layout the README
//! gives (minimal varints, map keys sorted), so that a decoded message re-encodes to the bytes it came from.

use std::collections::BTreeMap;

use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::command::{Allocate, ReportFailureByOperator, SyncReport};
use leasehold_schemas::outcome::{CommandSummary, Decision, Effect, Outcome};
use leasehold_schemas::{AgentName, CommandClass, CommandId, Envelope, Issuer, Key, Position, ResourceId, Timestamp};

const T0: u64 = 1_767_225_600_000;

fn agent() -> AgentName {
    AgentName::new("w1").unwrap()
}

fn envelope(body: impl Into<leasehold_schemas::Command>) -> Envelope {
    Envelope::new(CommandId::from_parts(T0, [1; 10]), Issuer::new("w1").unwrap(), Timestamp(T0), body)
}

fn fixture_bin(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/v1/{name}.bin", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `bytes` with the only occurrence of `from` replaced by `to`.
fn splice(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at: Vec<usize> = (0..=bytes.len() - from.len()).filter(|i| &bytes[*i..*i + from.len()] == from).collect();
    assert_eq!(at.len(), 1, "{from:02x?} must occur once in {bytes:02x?}");
    [&bytes[..at[0]], to, &bytes[at[0] + from.len()..]].concat()
}

/// The bincode form is always smaller than the JSON form of the same command, so a command can decode from bincode
/// (at most 1 MiB) and its JSON form, the one `command_to_json` writes, is over the limit and refused.
#[test]
fn what_decodes_from_bincode_decodes_from_its_json() {
    // 40,000 ids in one report: 17 bytes each in bincode (680 KB), 39 in JSON (1.5 MB). The writer refuses more than
    // 8192 as `invalid`, but only after decoding: the codec itself takes them.
    let mut report = SyncReport::new(agent(), Position(3), 42, Position(120));
    report.missing = (0..40_000u32).map(|i| ResourceId::from_parts(T0 + u64::from(i), [7; 10])).collect();
    // Free text escapes in JSON: one control character is one byte in bincode and six (`\u0001`) in JSON.
    let failure = ReportFailureByOperator {
        agent: agent(),
        resource: ResourceId::from_parts(T0, [2; 10]),
        detail: "\u{1}".repeat(200_000),
    };
    let mut problems = Vec::new();
    for envelope in [envelope(report), envelope(failure)] {
        let bytes = codec::encode_command(&envelope).expect("the bincode form is under 1 MiB");
        let decoded = codec::decode_command(&bytes).expect("and decodes");
        assert_eq!(decoded, envelope);
        let json = codec::command_to_json(&decoded).expect("command_to_json does not check the size");
        match codec::decode_command(json.as_bytes()) {
            Ok(again) => assert_eq!(again, envelope),
            Err(err) => problems.push(format!(
                "{}: {} bytes of bincode decode, but command_to_json writes {} bytes that do not: {:?} {err}",
                envelope.type_name(),
                bytes.len(),
                json.len(),
                err.kind()
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// README: "a value below 251 is one byte" and "a map's keys in sorted order". The decoder also takes a varint
/// with a wider marker than needed and a map in any order, so one command has many byte strings, and a decoded
/// command does not re-encode to the bytes it was read from.
#[test]
fn the_bincode_form_has_one_layout() {
    let heartbeat = fixture_bin("agent.heartbeat");
    let allocate = fixture_bin("op.allocate");
    let image = [&[5u8][..], b"image", &[11], b"alpine:3.20"].concat();
    let team = [&[4u8][..], b"team", &[2], b"ci"].concat();
    let cases = [
        ("the schema version as 0xfb 01 00", [&[0x01u8, 0xfb, 0x01, 0x00][..], &heartbeat[2..]].concat()),
        (
            "the issuer's length as 0xfb 02 00",
            splice(&heartbeat, &[0x01, 0x02, b'w', b'1', 0xfd], &[0x01, 0xfb, 0x02, 0x00, b'w', b'1', 0xfd]),
        ),
        (
            "the epoch as 0xfd and 8 bytes",
            [&heartbeat[..heartbeat.len() - 1], &[0xfd, 3, 0, 0, 0, 0, 0, 0, 0]].concat(),
        ),
        (
            "attributes out of order",
            splice(&allocate, &[image.clone(), team.clone()].concat(), &[team, image].concat()),
        ),
    ];
    let mut problems = Vec::new();
    for (what, bytes) in cases {
        if let Ok(envelope) = codec::decode_command(&bytes) {
            let again = codec::encode_command(&envelope).unwrap();
            if again != bytes {
                problems.push(format!("{what}: decodes to {:?}, which re-encodes to other bytes", envelope.body));
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// `decode_outcome` takes up to 1 MiB, `encode_outcome` refuses more than `MAX_OUTCOME_BYTES` (512 KiB): an outcome
/// a reader decodes cannot be written again, and a reader cannot tell that no writer could have written it.
#[test]
fn an_outcome_that_decodes_re_encodes() {
    let effects = (0..600u32)
        .map(|i| Effect::ResourceFailed {
            resource: ResourceId::from_parts(T0 + u64::from(i), [3; 10]),
            detail: "x".repeat(1000),
        })
        .collect();
    let outcome = Outcome {
        decider_version: 1,
        partition: 5,
        command: CommandSummary {
            id: CommandId::from_parts(T0, [1; 10]),
            class: CommandClass::Agent,
            type_name: "agent.sync".to_owned(),
            issuer: Issuer::new("w1").unwrap(),
            issued_at: Timestamp(T0),
            key: Key::Agent(agent()),
        },
        cmd_seq: 1,
        part: 0,
        log_time: Timestamp(T0),
        decided_at: Timestamp(T0),
        decision: Decision::Accepted { first_position: Position(1), effects },
    };
    let body = bincode::serde::encode_to_vec(&outcome, bincode::config::standard()).unwrap();
    let bytes = [&[codec::FORMAT_BINCODE_V1, 1][..], &body].concat();
    assert!(bytes.len() > codec::MAX_OUTCOME_BYTES && bytes.len() < codec::MAX_COMMAND_BYTES, "{}", bytes.len());
    let decoded = codec::decode_outcome(&bytes).expect("decodes");
    assert_eq!(decoded, outcome);
    let again = codec::encode_outcome(&decoded);
    assert!(
        again.is_ok(),
        "an outcome of {} bytes decodes but does not encode: {:?}",
        bytes.len(),
        again.map(|b| b.len()).map_err(|e| (e.kind(), e.to_string()))
    );
}

/// Held: JSON -> bincode -> value for commands with maps, the one place where the two forms are built differently
/// (`unique_keys` on the way in, the default map on the way out).
#[test]
fn maps_round_trip_both_ways() {
    let attributes: BTreeMap<String, String> =
        (0..64).map(|i| (format!("k{i:02}\u{e9}\u{1f600}"), format!("v\"\\\u{0}\u{7f}{i}"))).collect();
    let allocate = Allocate {
        agent: agent(),
        resource: ResourceId::from_parts(T0, [4; 10]),
        kind: "container".to_owned(),
        capacity: 1,
        attributes,
        parent: None,
        pools: vec![],
    };
    let envelope = envelope(allocate);
    let json = codec::command_to_json(&envelope).unwrap();
    let from_json = codec::decode_command(json.as_bytes()).unwrap();
    assert_eq!(from_json, envelope);
    let bytes = codec::encode_command(&from_json).unwrap();
    assert_eq!(codec::decode_command(&bytes).unwrap(), envelope);
    assert_eq!(codec::decode_command(&bytes).map_err(|e| e.kind()).map(|_| ()), Ok::<(), CodecErrorKind>(()));
}
