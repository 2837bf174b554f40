//! Red team: a body that decodes matches its subject "token for token and spelled as above" (README), in the ingress
//! form `lh.in.<class>.<key>.<id>` and the stored form `lh.cmd.<partition>.<class>.<key>.<id>`.

use leasehold_schemas::codec;
use leasehold_schemas::subjects::{check_subject, command_subject, ingress_subject_of, partition_of_key};
use leasehold_schemas::{Command, Envelope};

fn commands() -> Vec<(String, Envelope)> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    let mut out: Vec<(String, Envelope)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            ["op.", "agent.", "sys."]
                .iter()
                .any(|c| name.starts_with(c))
                .then(|| (name, codec::decode_command(&std::fs::read(&p).unwrap()).unwrap()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn tail(command: &Command) -> String {
    ingress_subject_of(command).strip_prefix("lh.in.").unwrap().to_owned()
}

/// `check_subject` takes any run of digits as the partition token of the stored form, the empty one included: an
/// empty token is not even a NATS subject, and `05` is not how `command_subject` spells partition 5.
#[test]
fn the_stored_form_spells_its_partition_one_way() {
    let mut accepted = Vec::new();
    for (name, envelope) in commands() {
        let tail = tail(&envelope.body);
        let partition = partition_of_key(&envelope.body.key(), 8);
        let good = command_subject(partition, envelope.class, &envelope.body.key(), envelope.body.subject_id());
        assert!(check_subject(&good, &envelope.body).is_ok(), "{good}");
        for bad in [
            format!("lh.cmd..{tail}"),
            format!("lh.cmd.0{partition}.{tail}"),
            format!("lh.cmd.{}.{tail}", "9".repeat(30)),
        ] {
            if check_subject(&bad, &envelope.body).is_ok() {
                accepted.push(format!("{name}: {bad}"));
            }
        }
    }
    assert!(accepted.is_empty(), "{} subjects accepted, e.g.:\n{}", accepted.len(), accepted[..3].join("\n"));
}

/// Held: every other spelling of each token of a fixture's subject is refused: the class, the key, the id (upper
/// case, braces, no hyphens, `urn:uuid:`), a pool key without its `@`, extra or missing tokens, wildcards.
#[test]
fn every_token_has_one_spelling() {
    for (name, envelope) in commands() {
        let subject = ingress_subject_of(&envelope.body);
        assert!(check_subject(&subject, &envelope.body).is_ok(), "{name}: {subject}");
        let tokens: Vec<&str> = subject.split('.').collect();
        assert_eq!(tokens.len(), 5, "{subject}");
        let id = tokens[4];
        let mut variants: Vec<String> = vec![
            format!("lh.in.{}.{}.{}", tokens[2].to_uppercase(), tokens[3], id),
            format!("lh.in.{}.{}.{}", tokens[2], tokens[3].to_uppercase(), id),
            format!("lh.in.{}.@{}.{}", tokens[2], tokens[3], id),
            format!("lh.in.{}.{}.*", tokens[2], tokens[3]),
            format!("lh.in.{}.{}.>", tokens[2], tokens[3]),
            format!("lh.in.{}.{}", tokens[2], tokens[3]),
            format!("{subject}.x"),
            format!("{subject} "),
            format!("lh.in..{}.{}.{}", tokens[2], tokens[3], id),
            format!("lh.cmd.{}", tokens[2..].join(".")),
            format!("lh.cmd.-1.{}", tokens[2..].join(".")),
            format!("lh.cmd.+1.{}", tokens[2..].join(".")),
        ];
        if let Some(pool) = tokens[3].strip_prefix('@') {
            variants.push(format!("lh.in.{}.{pool}.{id}", tokens[2]));
        }
        for class in ["op", "agent", "sys"].iter().filter(|c| **c != tokens[2]) {
            variants.push(format!("lh.in.{class}.{}.{}", tokens[3], id));
        }
        if id != "_" {
            variants.extend([
                format!("lh.in.{}.{}.{}", tokens[2], tokens[3], id.to_uppercase()),
                format!("lh.in.{}.{}.{}", tokens[2], tokens[3], id.replace('-', "")),
                format!("lh.in.{}.{}.{{{id}}}", tokens[2], tokens[3]),
                format!("lh.in.{}.{}._", tokens[2], tokens[3]),
            ]);
        } else {
            variants.push(format!("lh.in.{}.{}.", tokens[2], tokens[3]));
        }
        for bad in variants {
            assert!(check_subject(&bad, &envelope.body).is_err(), "{name}: {bad} is accepted");
        }
    }
}
