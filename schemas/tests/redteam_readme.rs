//! Red team: the README's statements against the code, beyond what `golden.rs` checks: the quoted error messages,
//! the byte-by-byte heartbeat, the field order of the examples ("the JSON examples above list their fields in that
//! same order"), the list of optional fields, the ranges of numbers, and which ids must be UUIDv7.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::outcome::{Effect, Outcome};
use serde_json::Value;

fn readme() -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

/// The fenced blocks of the README with the given info string.
fn blocks(info: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in readme().lines() {
        match &mut current {
            None if line.trim_start() == format!("```{info}") => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => out.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    out
}

fn readme_command(type_name: &str) -> String {
    blocks("json").into_iter().find(|b| b.contains(&format!("\"type\": \"{type_name}\""))).unwrap()
}

/// The command fixtures (name, parsed JSON), the variants (`op.define-pool.ports`...) included.
fn command_fixtures() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(fixtures_dir())
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

/// The backticked words of `text`.
fn ticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

// ---------------------------------------------------------------------------------------------------------------

/// Held: the three error messages quoted under "The JSON form" are what the codec says, to the column.
#[test]
fn the_quoted_errors_are_the_codecs() {
    let text = blocks("text").into_iter().find(|b| b.starts_with("bad JSON:")).expect("the quoted errors");
    let quoted: Vec<&str> = text.lines().collect();
    let block = readme_command("op.allocate");
    let edits = [
        (r#""capacity": 2"#, r#""capacity": "2""#),
        (r#""image": "alpine:3.20""#, r#""image": "alpine:3.20", "image": "alpine:3.20""#),
        ("019b76da-abe8-7001-8000-000000000001", "019B76DA-ABE8-7001-8000-000000000001"),
    ];
    assert_eq!(quoted.len(), edits.len());
    for ((from, to), quoted) in edits.iter().zip(quoted) {
        assert_eq!(block.matches(from).count(), 1);
        let err = codec::decode_command(block.replacen(from, to, 1).as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), quoted);
    }
}

/// Held: "`agent.heartbeat` from the fixtures, byte by byte (54 bytes)".
#[test]
fn the_heartbeat_bytes_are_the_fixtures() {
    let text = readme();
    let start = text.find("`agent.heartbeat` from the fixtures, byte by byte (54 bytes):").expect("the dump");
    let block = &text[start..];
    let block = &block[block.find("```text\n").unwrap() + 8..];
    let block = &block[..block.find("```").unwrap()];
    let mut bytes = Vec::new();
    for line in block.lines() {
        for token in line.split(' ').take_while(|t| t.len() == 2 && t.chars().all(|c| c.is_ascii_hexdigit())) {
            bytes.push(u8::from_str_radix(token, 16).unwrap());
        }
    }
    assert_eq!(bytes.len(), 54);
    assert_eq!(bytes, std::fs::read(fixtures_dir().join("agent.heartbeat.bin")).unwrap());
}

/// The keys of a JSON text in the order they are written.
fn keys_in_order(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            let start = i + 1;
            i += 1;
            while bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let string = &text[start..i];
            i += 1;
            let mut j = i;
            while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == b':' {
                keys.push(string.to_owned());
            }
        } else {
            i += 1;
        }
    }
    keys
}

/// Held: "The JSON examples above list their fields in that same order [as in src/]": each example's keys, in the
/// order written, are the keys serde writes for the value it decodes to (declaration order).
#[test]
fn the_examples_list_fields_in_declaration_order() {
    let mut problems = Vec::new();
    for block in blocks("json") {
        let value: Value = serde_json::from_str(&block).unwrap();
        let ours = if value.get("type").is_some() {
            codec::command_to_json(&codec::decode_command(block.as_bytes()).unwrap()).unwrap()
        } else if value.get("decision").is_some() {
            serde_json::to_string(&serde_json::from_value::<Outcome>(value).unwrap()).unwrap()
        } else {
            serde_json::to_string(&serde_json::from_value::<Vec<Effect>>(value).unwrap()).unwrap()
        };
        let (written, declared) = (keys_in_order(&block), keys_in_order(&ours));
        if written != declared {
            let at =
                written.iter().zip(&declared).position(|(a, b)| a != b).unwrap_or(written.len().min(declared.len()));
            problems.push(format!(
                "block starting {:?}: key {at} is {:?} in the README, {:?} in declaration order",
                &block[..60.min(block.len())],
                written.get(at),
                declared.get(at)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Optional fields.

/// The README's per-message list of optional fields: "the envelope" and each type name, to the field names.
fn readme_optional_fields() -> BTreeMap<String, BTreeSet<String>> {
    let text = readme();
    let start = text.find("- **Optional fields**").unwrap();
    let end = start + text[start..].find("every other command: none").unwrap();
    let mut out = BTreeMap::new();
    for line in text[start..end].lines().skip(1) {
        let Some(item) = line.trim_start().strip_prefix("- ") else { continue };
        let Some((head, rest)) = item.split_once(':') else { continue };
        let head = if head == "the envelope" { head.to_owned() } else { ticked(head).remove(0) };
        out.insert(head, ticked(rest).into_iter().collect());
    }
    out
}

/// The paths of `value` (objects only, not inside the maps `attributes` and `set`).
fn object_paths(value: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(map) = value {
        for (key, child) in map {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            out.push(path.clone());
            if key != "attributes" && key != "set" {
                object_paths(child, &path, out);
            }
        }
    }
}

fn remove_path(value: &mut Value, path: &str) {
    let (parent, last) = path.rsplit_once('.').map_or(("", path), |(p, l)| (p, l));
    let mut target = value;
    for key in parent.split('.').filter(|k| !k.is_empty()) {
        target = target.get_mut(key).unwrap();
    }
    target.as_object_mut().unwrap().remove(last);
}

/// "Every other field is required": the fields a command decodes without are exactly the README's list.
#[test]
fn the_optional_fields_are_the_readmes() {
    let listed = readme_optional_fields();
    let envelope_listed = &listed["the envelope"];
    let mut problems = Vec::new();
    for (name, value) in command_fixtures() {
        let type_name = value["type"].as_str().unwrap().to_owned();
        let mut paths = Vec::new();
        object_paths(&value, "", &mut paths);
        let mut removable = BTreeSet::new();
        for path in paths {
            let mut without = value.clone();
            remove_path(&mut without, &path);
            if codec::decode_command(serde_json::to_string(&without).unwrap().as_bytes()).is_ok() {
                removable.insert(path);
            }
        }
        let mut expected: BTreeSet<String> = envelope_listed.clone();
        expected.extend(listed.get(&type_name).into_iter().flatten().map(|f| format!("body.{f}")));
        if name == "op.allocate" {
            assert!(removable.contains("body.pools") && removable.contains("correlation_id"), "{removable:?}");
        }
        if removable != expected {
            problems.push(format!(
                "{name}: may be left out in the code but not in the README: {:?}; in the README but required: {:?}",
                removable.difference(&expected).collect::<Vec<_>>(),
                expected.difference(&removable).collect::<Vec<_>>()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Ranges of numbers.

/// The README's "Numbers are JSON integers" bullets: field name to largest value. `count` is in two bullets (a
/// slots pool's, u32; `agent.sync`'s, u64): the key is `<type>:count` for the latter.
fn readme_ranges() -> BTreeMap<String, u128> {
    let text = readme();
    let start = text.find("- **Numbers are JSON integers**").unwrap();
    let end = start + text[start..].find("The writer also refuses").unwrap();
    let mut out = BTreeMap::new();
    let mut current = None;
    for line in text[start..end].lines().skip(1) {
        if let Some(item) = line.trim_start().strip_prefix("- 0 to ") {
            let (max, rest) = item.split_once(' ').unwrap();
            current = Some(max.parse::<u128>().unwrap());
            for field in ticked(rest) {
                let key = if field == "count" && rest.contains("`count` of `agent.sync`") && max.len() > 10 {
                    "agent.sync:count".to_owned()
                } else {
                    field
                };
                out.entry(key).or_insert(current.unwrap());
            }
        } else if let Some(max) = current {
            for field in ticked(line) {
                let key = if field == "count" && line.contains("`count` of `agent.sync`") {
                    "agent.sync:count".to_owned()
                } else {
                    field
                };
                out.entry(key).or_insert(max);
            }
        }
    }
    out
}

/// Each numeric leaf of `value`: its path (as indices) and the name of the field it is in.
fn numeric_leaves(value: &Value, path: &mut Vec<Step>, name: &str, out: &mut Vec<(Vec<Step>, String)>) {
    match value {
        Value::Number(_) => out.push((path.clone(), name.to_owned())),
        Value::Object(map) => {
            for (key, child) in map {
                path.push(Step::Key(key.clone()));
                numeric_leaves(child, path, key, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(Step::Index(i));
                numeric_leaves(child, path, name, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// `value` with the leaf at `path` written as `number` (any size: spliced into the text).
fn with_number(value: &Value, path: &[Step], number: impl std::fmt::Display) -> String {
    let mut value = value.clone();
    let mut target = &mut value;
    for step in path {
        target = match step {
            Step::Key(key) => target.get_mut(key).unwrap(),
            Step::Index(i) => target.get_mut(*i).unwrap(),
        };
    }
    *target = Value::String("__redteam__".to_owned());
    serde_json::to_string(&value).unwrap().replacen("\"__redteam__\"", &number.to_string(), 1)
}

#[test]
fn the_ranges_are_the_readmes() {
    let ranges = readme_ranges();
    let mut samples = command_fixtures();
    // The pool values of a slots and a ports pool in `sys.bind-claim`.
    let bind = samples.iter().find(|(n, _)| n == "sys.bind-claim").unwrap().1.clone();
    for value in [serde_json::json!({"slot": 0}), serde_json::json!({"port": 30001})] {
        let mut sample = bind.clone();
        sample["body"]["value"] = value;
        samples.push(("sys.bind-claim (edited)".to_owned(), sample));
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for (name, value) in &samples {
        let type_name = value["type"].as_str().unwrap();
        let mut leaves = Vec::new();
        numeric_leaves(value, &mut Vec::new(), "", &mut leaves);
        for (path, field) in leaves {
            let key = if field == "count" && type_name == "agent.sync" {
                "agent.sync:count".to_owned()
            } else {
                field.clone()
            };
            checked += 1;
            let Some(&max) = ranges.get(&key) else {
                problems.push(format!("{name}: the README gives no range for `{field}`"));
                continue;
            };
            match codec::decode_command(with_number(value, &path, max).as_bytes()) {
                Ok(_) => {}
                Err(e) if e.kind() == CodecErrorKind::NewerSchema => {}
                Err(e) => problems.push(format!("{name}: `{field}` = {max} (the README's largest) is refused: {e}")),
            }
            // Over the range; and "no quotes, no sign, no fraction, no exponent".
            for written in [
                (max + 1).to_string(),
                "-1".to_owned(),
                "1.0".to_owned(),
                "1e0".to_owned(),
                "\"1\"".to_owned(),
                "-0".to_owned(),
            ] {
                match codec::decode_command(with_number(value, &path, &written).as_bytes()) {
                    Ok(_) => problems.push(format!("{name}: `{field}` = {written} decodes")),
                    Err(e) if e.to_string().contains(&field) => {}
                    Err(e) => problems.push(format!("{name}: `{field}` = {written} is refused without naming it: {e}")),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    assert!(checked > 150 && ranges.len() > 25, "{checked} numbers checked against {ranges:?}");
}

// ---------------------------------------------------------------------------------------------------------------
// UUID versions.

/// Each canonical UUID in a string leaf (alone or after `<agent>.`), as (path, field name, byte offset of the
/// version digit in the string).
fn uuid_leaves(value: &Value, path: &mut Vec<Step>, name: &str, out: &mut Vec<(Vec<Step>, String, usize)>) {
    match value {
        Value::String(text) => {
            let offset = text.find('.').map_or(0, |dot| dot + 1);
            if text.len() == offset + 36 && text[offset..].parse::<uuid::Uuid>().is_ok() {
                out.push((path.clone(), name.to_owned(), offset + 14));
            }
        }
        Value::Object(map) => {
            for (key, child) in map {
                path.push(Step::Key(key.clone()));
                uuid_leaves(child, path, key, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(Step::Index(i));
                uuid_leaves(child, path, name, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Held: "Resource, lease and command ids are UUIDv7; `correlation_id`, `causation_id`, `incarnation` and a resync
/// chunk's `lo` and `hi` may be of any version."
#[test]
fn which_ids_must_be_v7_is_the_readmes() {
    let any_version = ["correlation_id", "causation_id", "incarnation", "lo", "hi"];
    let mut problems = Vec::new();
    let mut checked = BTreeSet::new();
    for (name, value) in command_fixtures() {
        let mut leaves = Vec::new();
        uuid_leaves(&value, &mut Vec::new(), "", &mut leaves);
        for (path, field, at) in leaves {
            checked.insert(field.clone());
            for version in ['1', '4', '8'] {
                let mut edited = value.clone();
                let mut target = &mut edited;
                for step in &path {
                    target = match step {
                        Step::Key(key) => target.get_mut(key).unwrap(),
                        Step::Index(i) => target.get_mut(*i).unwrap(),
                    };
                }
                let mut text = target.as_str().unwrap().to_owned();
                text.replace_range(at..at + 1, &version.to_string());
                *target = Value::String(text);
                let result = codec::decode_command(serde_json::to_string(&edited).unwrap().as_bytes());
                let allowed = any_version.contains(&field.as_str());
                match (allowed, result) {
                    (true, Err(e)) => problems.push(format!("{name}: `{field}` of version {version} is refused: {e}")),
                    (false, Ok(_)) => problems.push(format!("{name}: `{field}` of version {version} is accepted")),
                    (false, Err(e)) if !e.to_string().contains("UUIDv7") => {
                        problems.push(format!("{name}: `{field}` of version {version}: {e}"))
                    }
                    _ => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
    assert!(checked.len() >= 15, "{checked:?}");
}
