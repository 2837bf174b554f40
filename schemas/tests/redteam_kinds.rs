//! Red team: error kinds. `TooLarge` is "more than 1 MiB" (README: a command that cannot be decoded "for any other
//! reason (... more than 1 MiB ...) goes to the dead-letter stream with the reason"), `NewerSchema` is "written by a
//! newer leasehold". A reason that names the wrong cause misleads whoever reads the dead-letter stream.

use leasehold_schemas::codec::{self, CodecErrorKind};

fn fixture_bin(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/v1/{name}.bin", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A 58-byte heartbeat whose issuer says it is 2 GiB long: bincode's decode limit reports `LimitExceeded`, which the
/// codec maps to `TooLarge` ("cannot decode ...: LimitExceeded"), though the payload is 58 bytes. It is truncated
/// or corrupt: `Malformed`.
#[test]
fn a_lying_length_in_a_small_payload_is_malformed_not_too_large() {
    let heartbeat = fixture_bin("agent.heartbeat");
    // 01 01 | 0f "agent.heartbeat" | 10 <16 id bytes> | 01 (class) | 02 "w1" (issuer) | ...
    assert_eq!(&heartbeat[35..39], &[0x01, 0x02, b'w', b'1']);
    let mut problems = Vec::new();
    for length in [[0xfc, 0, 0, 0, 0x80], [0xfc, 0x01, 0x00, 0x10, 0x00]] {
        let input = [&heartbeat[..36], &length[..], &heartbeat[37..]].concat();
        let err = codec::decode_command(&input).expect_err("lying length");
        if err.kind() != CodecErrorKind::Malformed {
            problems.push(format!(
                "{} bytes with an issuer length of {length:02x?}: {:?}: {err}",
                input.len(),
                err.kind()
            ));
        }
    }
    // The same in an outcome: a rejection message that says it is 1 MiB + 1 long.
    let rejected = fixture_bin("outcome.rejected");
    let message = rejected.windows(12).position(|w| w == b"resource w1.").expect("the rejection message") - 1;
    assert_eq!(usize::from(rejected[message]), rejected.len() - message - 1, "the message's length byte");
    let input = [&rejected[..message], &[0xfc, 0x01, 0x00, 0x10, 0x00], &rejected[message + 1..]].concat();
    let err = codec::decode_outcome(&input).expect_err("lying length");
    if err.kind() != CodecErrorKind::Malformed {
        problems.push(format!("an outcome of {} bytes: {:?}: {err}", input.len(), err.kind()));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Held: the version is read first in both forms; only a real 0 is refused as not existing.
#[test]
fn versions_are_told_apart() {
    let heartbeat = fixture_bin("agent.heartbeat");
    for (version, kind) in [
        (&[0x00][..], CodecErrorKind::Malformed),
        (&[0x02][..], CodecErrorKind::NewerSchema),
        (&[0xfa][..], CodecErrorKind::NewerSchema),
        (&[0xfb, 0xff, 0xff][..], CodecErrorKind::NewerSchema),
        (&[0xfc, 0x00, 0x00, 0x01, 0x00][..], CodecErrorKind::Malformed),
    ] {
        let input = [&[0x01][..], version, &heartbeat[2..]].concat();
        assert_eq!(codec::decode_command(&input).unwrap_err().kind(), kind, "{version:02x?}");
        let input = [&[0x01][..], version].concat();
        assert_eq!(codec::decode_command(&input).unwrap_err().kind(), kind, "{version:02x?} alone");
    }
    for (json, kind) in [
        (r#"{"schema_version":0}"#, CodecErrorKind::Malformed),
        (r#"{"schema_version":65536}"#, CodecErrorKind::Malformed),
        (r#"{"schema_version":"2"}"#, CodecErrorKind::Malformed),
        (r#"{"schema_version":2.0}"#, CodecErrorKind::Malformed),
        (r#"{"schema_version":1,"schema_version":2}"#, CodecErrorKind::Malformed),
        // Design note, not a failure: twenty bytes with no type, id or body are a newer schema, which stops the
        // partition (README: "the worker stops and waits for a newer leasehold"). Any publisher on lh.in.> can do it.
        (r#"{"schema_version":2}"#, CodecErrorKind::NewerSchema),
        (r#"{"schema_version":65535,"anything":[{"at":"all"}]}"#, CodecErrorKind::NewerSchema),
    ] {
        assert_eq!(codec::decode_command(json.as_bytes()).unwrap_err().kind(), kind, "{json}");
    }
    assert_eq!(codec::decode_command(&[0x01, 0x02]).unwrap_err().kind(), CodecErrorKind::NewerSchema);
}

/// Held: the 1 MiB limit is on the payload, in both forms and both entry points, exactly at the boundary.
#[test]
fn the_limit_is_exact() {
    let json = String::from_utf8(
        std::fs::read(format!("{}/tests/fixtures/v1/agent.heartbeat.json", env!("CARGO_MANIFEST_DIR"))).unwrap(),
    )
    .unwrap();
    let pad = codec::MAX_COMMAND_BYTES - json.len();
    let at_limit = format!("{json}{}", " ".repeat(pad));
    assert_eq!(at_limit.len(), codec::MAX_COMMAND_BYTES);
    assert!(codec::decode_command(at_limit.as_bytes()).is_ok());
    let over = format!("{at_limit} ");
    assert_eq!(codec::decode_command(over.as_bytes()).unwrap_err().kind(), CodecErrorKind::TooLarge);
    assert_eq!(codec::command_from_json(over.as_bytes()).unwrap_err().kind(), CodecErrorKind::TooLarge);
    let mut bin = fixture_bin("agent.heartbeat");
    bin.resize(codec::MAX_COMMAND_BYTES + 1, 0);
    assert_eq!(codec::decode_command(&bin).unwrap_err().kind(), CodecErrorKind::TooLarge);
    bin.truncate(codec::MAX_COMMAND_BYTES);
    assert_eq!(codec::decode_command(&bin).unwrap_err().kind(), CodecErrorKind::TrailingBytes);
}
