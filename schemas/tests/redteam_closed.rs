//! Red team: "every object is closed" and "a key written twice in one object is refused", systematically: for every
//! command fixture, every object in it (the envelope, the body, every nested object and the maps `attributes` and
//! `set`) gets an unknown key, and every key of every object is written twice. Each must be refused, and the
//! message must name the object's path.

use std::path::PathBuf;

use leasehold_schemas::codec::{self, CodecErrorKind};
use serde_json::Value;

fn command_fixtures() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            ["op.", "agent.", "sys."]
                .iter()
                .any(|c| name.starts_with(c))
                .then(|| (name, serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Writes `value` as JSON, with one change in the object at `target` (a dotted path, "" for the envelope): an
/// extra key, or one of its keys written twice.
enum Change<'a> {
    Extra(&'a str),
    Twice(&'a str),
}

fn write(value: &Value, path: &str, target: &str, change: &Change<'_>, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            let mut first = true;
            let mut field = |out: &mut String, key: &str, child: &Value| {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&serde_json::to_string(key).unwrap());
                out.push(':');
                let child_path = if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
                write(child, &child_path, target, change, out);
            };
            for (key, child) in map {
                field(out, key, child);
                if path == target
                    && let Change::Twice(twice) = change
                    && key == twice
                {
                    field(out, key, child);
                }
            }
            if path == target
                && let Change::Extra(extra) = change
            {
                field(out, extra, &Value::from(1));
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, &format!("{path}[{i}]"), target, change, out);
            }
            out.push(']');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

/// Every object in `value` with its path and keys. The object holding an enum's one variant (`kind`, `value`) is
/// included: a second key there is a second variant.
fn objects(value: &Value, path: &str, out: &mut Vec<(String, Vec<String>)>) {
    match value {
        Value::Object(map) => {
            out.push((path.to_owned(), map.keys().cloned().collect()));
            for (key, child) in map {
                objects(child, &if path.is_empty() { key.clone() } else { format!("{path}.{key}") }, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                objects(item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn check(name: &str, text: &str, what: &str, path: &str, problems: &mut Vec<String>) {
    match codec::decode_command(text.as_bytes()) {
        Ok(envelope) => problems.push(format!("{name}: {what} at {path:?} is accepted: {:?}", envelope.body)),
        Err(err) if err.kind() != CodecErrorKind::Malformed => {
            problems.push(format!("{name}: {what} at {path:?}: {:?} {err}", err.kind()))
        }
        Err(err) => {
            let message = err.to_string();
            if !path.is_empty() && !message.contains(&format!("{path}:")) && !message.contains(&format!("{path}.")) {
                problems.push(format!("{name}: {what} at {path:?} is refused without naming the path: {message}"));
            }
        }
    }
}

#[test]
fn every_object_refuses_an_unknown_key() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, value) in command_fixtures() {
        let mut found = Vec::new();
        objects(&value, "", &mut found);
        for (path, _) in found {
            // In the maps an unknown key is a new attribute: fine.
            if path.ends_with("attributes") || path.ends_with(".set") {
                continue;
            }
            let mut text = String::new();
            write(&value, "", &path, &Change::Extra("zz_unknown"), &mut text);
            check(&name, &text, "an unknown key", &path, &mut problems);
            checked += 1;
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    assert!(checked > 100, "{checked}");
}

#[test]
fn every_key_written_twice_is_refused() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, value) in command_fixtures() {
        let mut found = Vec::new();
        objects(&value, "", &mut found);
        for (path, keys) in found {
            for key in keys {
                let mut text = String::new();
                write(&value, "", &path, &Change::Twice(&key), &mut text);
                check(&name, &text, &format!("`{key}` twice"), &path, &mut problems);
                checked += 1;
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    assert!(checked > 400, "{checked}");
}
