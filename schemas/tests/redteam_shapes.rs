//! Red team: the JSON form must have one shape. "A command is one JSON object", "every object is closed", and "an
//! enum whose variants never carry data is a plain string" (README). serde_json also takes a struct written as a
//! positional array and a unit variant written as `{"variant": null}`: those are other spellings of the same command,
//! with no field names to check. Also: errors that do not name the value they refuse.
//!
//! Every input is a committed fixture (tests/fixtures/v1) edited as text, the way a producer's mistake looks.

use leasehold_schemas::codec::{self, CodecError, CodecErrorKind};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/v1/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `text` with `from` replaced by `to`; `from` must occur exactly once.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once in {text}");
    text.replacen(from, to, 1)
}

fn decode(text: &str) -> Result<leasehold_schemas::Envelope, CodecError> {
    codec::decode_command(text.as_bytes())
}

/// What is wrong with decoding `text`, if anything: it must be refused as Malformed, with a message that holds
/// every one of `parts`.
fn problem(what: &str, text: &str, parts: &[&str]) -> Option<String> {
    match decode(text) {
        Ok(envelope) => Some(format!("{what}: accepted as {:?}", envelope.body)),
        Err(err) if err.kind() != CodecErrorKind::Malformed => Some(format!("{what}: {:?} {err}", err.kind())),
        Err(err) => {
            let message = err.to_string();
            let missing: Vec<&&str> = parts.iter().filter(|part| !message.contains(**part)).collect();
            (!missing.is_empty()).then(|| format!("{what}: {missing:?} not in the message {message:?}"))
        }
    }
}

fn assert_refused(what: &str, text: &str, parts: &[&str]) {
    if let Some(problem) = problem(what, text, parts) {
        panic!("{problem}");
    }
}

fn assert_no_problems(problems: Vec<Option<String>>) {
    let problems: Vec<String> = problems.into_iter().flatten().collect();
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Structs written as arrays.

/// `"body": ["w1", 3]` is a heartbeat without a single field name: serde's derived visitor has `visit_seq`, and
/// serde_json hands it a JSON array. The README says the body is an object.
#[test]
fn a_body_written_as_an_array_is_refused() {
    let text = fixture("agent.heartbeat");
    let bad = edit(&text, "{\n    \"agent\": \"w1\",\n    \"epoch\": 3\n  }", r#"["w1", 3]"#);
    assert_refused("heartbeat body as an array", &bad, &["body"]);
}

/// Positional fields are a trap, not just a second spelling: `ttl` and `wait_timeout` (both `Option<Millis>`)
/// written in the wrong order decode silently to the wrong lease.
#[test]
fn a_positional_body_swaps_fields_silently() {
    let text = fixture("op.acquire");
    let body_start = text.find("\"body\": {").unwrap() + "\"body\": ".len();
    let positional = r#"["w1", "019b76da-9478-7111-9111-111111111111", "019b76da-9860-7333-b333-333333333333", "build-1234", 60000, 300000]"#;
    let bad = format!("{}{}\n}}\n", &text[..body_start], positional);
    assert_refused("acquire body as an array (ttl and wait_timeout swapped)", &bad, &["body"]);
}

/// The same for every object inside a body: agent settings, a source, a pool kind's fields.
#[test]
fn nested_objects_written_as_arrays_are_refused() {
    let register = fixture("agent.register");
    let cases = [
        (
            "agent settings as an array",
            edit(
                &register,
                r#"{"max_loss_min": 5, "max_loss_percent": 50, "loss_window": 600000, "create_timeout": 600000, "stall_after": 60000, "orphan_after": 86400000}"#,
                "[5, 50, 600000, 600000, 60000, 86400000]",
            ),
            "body.settings",
        ),
        (
            "a source as an array",
            edit(&fixture("sys.claim"), r#"{"partition": 5, "position": 118}"#, "[5, 118]"),
            "body.source",
        ),
        (
            "partition settings as an array",
            edit(&fixture("op.set-partition-settings"), r#"{"outcome_horizon": 86400000}"#, "[86400000]"),
            "body.settings",
        ),
        (
            "an ipv4 pool kind's fields as an array",
            edit(
                &fixture("op.define-pool"),
                r#"{"network": "10.20.0.0", "prefix_len": 24, "exclude": ["10.20.0.1"]}"#,
                r#"["10.20.0.0", 24, ["10.20.0.1"]]"#,
            ),
            "body.kind",
        ),
    ];
    let mut accepted = Vec::new();
    for (what, text, path) in &cases {
        match decode(text) {
            Ok(envelope) => accepted.push(format!("{what}: accepted as {:?}", envelope.body)),
            Err(err) => assert!(err.to_string().contains(path), "{what}: {err}"),
        }
    }
    assert!(accepted.is_empty(), "objects written as arrays are accepted:\n{}", accepted.join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Unit variants written as objects.

/// "An enum whose variants never carry data is a plain string": serde_json also takes `{"<variant>": null}`.
#[test]
fn unit_enums_are_plain_strings_only() {
    let cases = [
        ("class", edit(&fixture("agent.heartbeat"), r#""class": "agent""#, r#""class": {"agent": null}"#)),
        (
            "failure",
            edit(
                &fixture("agent.report-failure"),
                r#""failure": "create-failed""#,
                r#""failure": {"create-failed": null}"#,
            ),
        ),
        (
            "parent_state",
            edit(&fixture("sys.cascade"), r#""parent_state": "left""#, r#""parent_state": {"left": null}"#),
        ),
    ];
    let mut accepted = Vec::new();
    for (field, text) in &cases {
        if let Ok(envelope) = decode(text) {
            accepted.push(format!("{field} as {{\"variant\": null}}: accepted as {:?}", envelope.body));
        }
    }
    assert!(accepted.is_empty(), "a second spelling of unit variants is accepted:\n{}", accepted.join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Errors that name the path but not the value (or not the problem).

/// An IPv4 address that does not parse: the message says "invalid IPv4 address syntax" without the value.
#[test]
fn a_bad_ipv4_address_is_named() {
    let define = fixture("op.define-pool");
    let bind = fixture("sys.bind-claim");
    let cases = [
        (
            edit(&define, r#""network": "10.20.0.0""#, r#""network": "010.20.0.0""#),
            "body.kind.ipv4.network",
            "010.20.0.0",
        ),
        (edit(&define, r#"["10.20.0.1"]"#, r#"["10.20.0.256"]"#), "body.kind.ipv4.exclude", "10.20.0.256"),
        (edit(&bind, r#"{"ipv4": "10.20.0.7"}"#, r#"{"ipv4": "10.20.7"}"#), "body.value", "10.20.7"),
    ];
    assert_no_problems(
        cases.iter().map(|(text, path, value)| problem(&format!("{path} = {value:?}"), text, &[path, value])).collect(),
    );
}

/// An integer above u64::MAX is reported as a "floating point" with a rounded value that is not what was written.
#[test]
fn an_integer_out_of_u64_range_is_shown_as_written() {
    let text = fixture("agent.heartbeat");
    let bad = edit(&text, r#""issued_at": 1767225615000"#, r#""issued_at": 18446744073709551616"#);
    let first = problem("issued_at = u64::MAX + 1", &bad, &["issued_at", "18446744073709551616"]);
    let bad = edit(&text, r#""epoch": 3"#, r#""epoch": 100000000000000000000"#);
    let second = problem("epoch = 10^20", &bad, &["body.epoch", "100000000000000000000"]);
    assert_no_problems(vec![first, second]);
}

/// A pool kind with two variant keys (a second key in the enum's object), the same variant twice (a duplicate key),
/// or none: the message is "expected value", which names neither the key nor what is wrong.
#[test]
fn a_pool_kind_with_two_variants_or_none_says_so() {
    let text = fixture("op.define-pool");
    let kind = r#"{"ipv4": {"network": "10.20.0.0", "prefix_len": 24, "exclude": ["10.20.0.1"]}}"#;
    let cases = [
        (
            "two variants",
            r#"{"slots": {"count": 4}, "ipv4": {"network": "10.20.0.0", "prefix_len": 24, "exclude": []}}"#,
            "ipv4",
        ),
        ("the same variant twice", r#"{"slots": {"count": 4}, "slots": {"count": 5}}"#, "duplicate"),
        ("no variant", "{}", "variant"),
    ];
    assert_no_problems(
        cases.iter().map(|(what, to, named)| problem(what, &edit(&text, kind, to), &["body.kind", named])).collect(),
    );
}

/// Held: `null` where a list or a map is expected is refused (the README lets them be left out, not be `null`), and
/// the message names the field.
#[test]
fn null_is_not_an_empty_list() {
    let cases = [
        (edit(&fixture("op.allocate"), r#""pools": ["ips"]"#, r#""pools": null"#), "body.pools"),
        (edit(&fixture("op.allocate"), r#"{"image": "alpine:3.20", "team": "ci"}"#, "null"), "body.attributes"),
        (edit(&fixture("op.update"), r#"{"team": "infra"}"#, "null"), "body.set"),
        (
            edit(
                &fixture("agent.sync"),
                r#""created": ["019b76da-9478-7111-9111-111111111111"]"#,
                r#""created": null"#,
            ),
            "body.created",
        ),
        (edit(&fixture("op.define-pool"), r#"["10.20.0.1"]"#, "null"), "body.kind.ipv4.exclude"),
    ];
    assert_no_problems(cases.iter().map(|(text, path)| problem(path, text, &[path, "null"])).collect());
}
