//! Red team: "nothing panics on any input" beyond the decoder itself. The crate's own methods on a value that
//! decoded (a pool kind not yet validated, an outcome read from a log) must not panic either: they are what every
//! reader calls next. Debug builds (what `cargo test` runs) check arithmetic overflow.

use std::panic::{AssertUnwindSafe, catch_unwind};

use leasehold_schemas::Command;
use leasehold_schemas::codec;
use leasehold_schemas::pool::{PoolKind, PoolValue};

fn fixture(name: &str, extension: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/v1/{name}.{extension}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once in {text}");
    text.replacen(from, to, 1)
}

/// The pool kind of an `op.define-pool` fixture edited as text: the decoder takes any `prefix_len` (u8) and any
/// `first`/`last`; only `validate` refuses them.
fn decoded_kind(name: &str, from: &str, to: &str) -> PoolKind {
    let text = String::from_utf8(fixture(name, "json")).unwrap();
    let envelope = codec::decode_command(edit(&text, from, to).as_bytes()).expect("the codec takes it");
    let Command::DefinePool(define) = envelope.body else { unreachable!() };
    define.kind
}

type Call<'a> = (&'static str, Box<dyn Fn() + 'a>);

#[test]
fn pool_kind_methods_do_not_panic_on_a_decoded_kind() {
    let ipv4 = |from: &str, to: &str| decoded_kind("op.define-pool", from, to);
    let kinds = [
        ("prefix_len 40", ipv4(r#""prefix_len": 24"#, r#""prefix_len": 40"#)),
        ("prefix_len 255", ipv4(r#""prefix_len": 24"#, r#""prefix_len": 255"#)),
        (
            "network 255.255.255.0/8",
            ipv4(r#""network": "10.20.0.0", "prefix_len": 24"#, r#""network": "255.255.255.0", "prefix_len": 8"#),
        ),
        (
            "ports 30099..=30000",
            decoded_kind(
                "op.define-pool.ports",
                r#""first": 30000, "last": 30099"#,
                r#""first": 30099, "last": 30000"#,
            ),
        ),
    ];
    let mut panics = Vec::new();
    for (what, kind) in &kinds {
        let calls: [Call<'_>; 6] = [
            ("validate", Box::new(|| drop(kind.validate()))),
            ("canonical", Box::new(|| drop(kind.canonical()))),
            ("size", Box::new(|| _ = kind.size())),
            ("n_usable", Box::new(|| _ = kind.n_usable())),
            ("value_at(size - 2)", Box::new(|| _ = kind.value_at(kind.size().saturating_sub(2)))),
            ("contains", Box::new(|| _ = kind.contains(&PoolValue::Port(30050)))),
        ];
        for (name, call) in calls {
            if catch_unwind(AssertUnwindSafe(call)).is_err() {
                panics.push(format!("{what}: PoolKind::{name} panics on {kind:?}"));
            }
        }
    }
    assert!(panics.is_empty(), "{} panic(s):\n{}", panics.len(), panics.join("\n"));
}

/// An accepted outcome whose `first_position` is near `u64::MAX` (any u64 decodes): `positioned_effects` adds the
/// index without checking, which every outcome reader (the domain's `apply`) calls on what it read.
#[test]
fn positioned_effects_do_not_overflow() {
    let bytes = fixture("outcome.accepted", "bin");
    let mut outcome = codec::decode_outcome(&bytes).expect("the fixture decodes");
    let leasehold_schemas::Decision::Accepted { first_position, effects } = &mut outcome.decision else {
        panic!("outcome.accepted is accepted")
    };
    assert!(effects.len() >= 2, "{}", effects.len());
    first_position.0 = u64::MAX;
    let bytes = codec::encode_outcome(&outcome).expect("encodes");
    let read = codec::decode_outcome(&bytes).expect("and decodes: the codec takes any position");
    let result = catch_unwind(AssertUnwindSafe(|| read.positioned_effects().count()));
    assert!(result.is_ok(), "positioned_effects panics on a decoded outcome with first_position u64::MAX");
}

/// Held: the Display forms of decoded values at their extremes.
#[test]
fn extreme_values_display() {
    use leasehold_schemas::{Millis, Position, Timestamp};
    for value in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        let _ = Timestamp(value).to_string();
        let _ = Millis(value).to_string();
        let _ = Position(value).to_string();
        let _ = Timestamp(value).saturating_add(Millis(u64::MAX));
        let _ = Timestamp(value).since(Timestamp(u64::MAX));
    }
}
