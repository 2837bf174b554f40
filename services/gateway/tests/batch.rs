//! `POST /v1/commands/batch`: each command of a batch is checked and answered as `POST /v1/commands` would check and
//! answer it alone, in the order given, and one bad command does not keep the others from being published; what is
//! stored is exactly the good new commands, once each. A body that is not a batch is refused whole, with nothing
//! published.
//!
//! The API is built in-process over the embedded log (a worker and a projector run as tasks, tokens on) and called
//! with `tower::ServiceExt::oneshot`.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_gateway::{GatewayConfig, MAX_BATCH_COMMANDS, Tokens};
use leasehold_log::Log;
use leasehold_schemas::codec;
use leasehold_schemas::command::{Allocate, Heartbeat};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Position, ResourceId, Timestamp};
use leasehold_schemas::{Command, Envelope};
use serde_json::{Value, json};
use tower::ServiceExt;

use support::Gateway;

const ALICE: &str = "alice-token-0123456789";
const TOKEN_FILE: &str = "op:alice alice-token-0123456789\n";
const BATCH: &str = "/v1/commands/batch";

impl Gateway {
    async fn start_batch() -> Gateway {
        let config = GatewayConfig {
            tokens: Some(Arc::new(Tokens::parse(TOKEN_FILE).expect("a good token file"))),
            ..GatewayConfig::default()
        };
        Gateway::start_with(config, true).await
    }

    async fn last_seq(&self) -> u64 {
        self.log.last_command_seq().await.expect("read the command log's last sequence")
    }

    /// `method uri` with alice's token, `content_type` and `body`: the status and the body as JSON.
    async fn send(&self, method: Method, uri: &str, content_type: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {ALICE}"))
            .header(header::CONTENT_TYPE, content_type)
            .body(body.into())
            .expect("a request");
        let response = self.app.clone().oneshot(request).await.expect("the router answers");
        let status = response.status();
        let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, body)
    }

    async fn post(&self, uri: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        self.send(Method::POST, uri, "application/json", body).await
    }

    /// The commands stored after sequence `after`, by command id: how many times each, and the issuer of the last.
    async fn stored_after(&self, after: u64) -> BTreeMap<String, (usize, String)> {
        let mut stored = BTreeMap::new();
        for seq in after + 1..=self.last_seq().await {
            let record = self.log.command_at(seq).await.expect("read the command log").expect("a stored command");
            let envelope = codec::decode_command(&record.payload).expect("a stored command decodes");
            let entry = stored.entry(envelope.command_id.to_string()).or_insert((0, String::new()));
            entry.0 += 1;
            entry.1 = envelope.issuer.to_string();
        }
        stored
    }
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

fn envelope_with(id: CommandId, body: impl Into<Command>) -> Envelope {
    Envelope::new(id, Issuer::new("op:mallory").expect("an issuer"), Timestamp(now_ms()), body)
}

fn allocate() -> Envelope {
    allocate_under(CommandId::generate())
}

/// A fresh allocation on w1 (whose agent never registers: what the writer decides of it does not matter here).
fn allocate_under(id: CommandId) -> Envelope {
    let agent = AgentName::new("w1").expect("an agent name");
    envelope_with(id, Allocate::new(agent, ResourceId::generate(), "container", 1))
}

fn value(envelope: &Envelope) -> Value {
    serde_json::from_str(&codec::command_to_json(envelope).expect("encode")).expect("JSON")
}

/// The answer at `index` is a refusal of that index, with `status_code`, for `command_id`, saying each of `says`.
#[track_caller]
fn assert_refused(answers: &Value, index: usize, status_code: u16, command_id: Option<&str>, says: &[&str]) {
    let answer = &answers[index];
    assert_eq!(answer["index"], index, "answer {index}: {answer:#}");
    assert_eq!(answer["status_code"], status_code, "answer {index}: {answer:#}");
    assert_eq!(answer["command_id"].as_str(), command_id, "answer {index}: {answer:#}");
    assert!(answer.get("status").is_none(), "a refusal is not a status: {answer:#}");
    let error = answer["error"].as_str().unwrap_or_else(|| panic!("answer {index} has no error: {answer:#}"));
    for needle in says {
        assert!(error.contains(needle), "answer {index} does not say {needle:?}: {error}");
    }
}

/// The answer at `index` is `published` for `command_id` at `command_seq`.
#[track_caller]
fn assert_published(answers: &Value, index: usize, command_id: &str, command_seq: u64, duplicate: bool) {
    let answer = &answers[index];
    assert_eq!(answer["status"], "published", "answer {index}: {answer:#}");
    assert_eq!(answer["command_id"], command_id, "answer {index}: {answer:#}");
    assert_eq!(answer["command_seq"], command_seq, "answer {index}: {answer:#}");
    assert_eq!(answer["duplicate"], duplicate, "answer {index}: {answer:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_of_a_batch_is_answered_alone_and_only_the_good_new_ones_are_stored() {
    let gw = Gateway::start_batch().await;

    // A command decided before (the projection answers for it), and one only published (the log does).
    let decided = allocate();
    let (status, first) =
        gw.post("/v1/commands?wait=true&timeout=20s", codec::command_to_json(&decided).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{first:#}");
    assert!(["accepted", "rejected"].contains(&first["status"].as_str().unwrap_or_default()), "decided: {first:#}");
    let decided_seq = first["command_seq"].as_u64().expect("a command sequence");
    let published = allocate();
    let (status, answer) = gw.post("/v1/commands", codec::command_to_json(&published).unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer:#}");
    let published_seq = answer["command_seq"].as_u64().expect("a command sequence");

    let fresh_1 = allocate();
    let fresh_2 = allocate();
    // The same command sent again, rebuilt by its client (another clock): a retry.
    let mut retried = decided.clone();
    retried.issued_at = Timestamp(now_ms() + 1);
    let another = allocate_under(published.command_id);
    let agent = AgentName::new("w1").expect("an agent name");
    let heartbeat = envelope_with(CommandId::generate(), Heartbeat { agent, epoch: Position(1) });
    let mut malformed = value(&allocate());
    malformed["body"]["capacity"] = json!("2");
    let malformed_id = malformed["command_id"].as_str().expect("an id").to_owned();
    let batch = json!([
        value(&fresh_1),
        value(&retried),
        value(&another),
        value(&heartbeat),
        malformed,
        value(&fresh_2),
        value(&fresh_2),
        42,
    ]);

    let before = gw.last_seq().await;
    let (status, answers) = gw.post(BATCH, serde_json::to_vec(&batch).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{answers:#}");
    assert_eq!(answers.as_array().map(Vec::len), Some(8), "one answer per command: {answers:#}");

    // Stored in the order given: fresh_1, then fresh_2; fresh_2's second copy is a duplicate of its first.
    assert_published(&answers, 0, &fresh_1.command_id.to_string(), before + 1, false);
    assert_published(&answers, 1, &decided.command_id.to_string(), decided_seq, true);
    assert_refused(
        &answers,
        2,
        409,
        Some(&published.command_id.to_string()),
        &["names another command", "choose a new one"],
    );
    assert_refused(&answers, 3, 403, Some(&heartbeat.command_id.to_string()), &["op commands only", "agent.heartbeat"]);
    assert_refused(&answers, 4, 400, Some(&malformed_id), &["body.capacity", "\"2\""]);
    assert_published(&answers, 5, &fresh_2.command_id.to_string(), before + 2, false);
    assert_published(&answers, 6, &fresh_2.command_id.to_string(), before + 2, true);
    assert_refused(&answers, 7, 400, None, &["must start with '{'"]);

    // Exactly the two new commands were stored, once each, with the principal as their issuer.
    let stored = gw.stored_after(before).await;
    let expected: BTreeMap<String, (usize, String)> =
        [&fresh_1, &fresh_2].iter().map(|e| (e.command_id.to_string(), (1, "op:alice".to_owned()))).collect();
    assert_eq!(stored, expected);
    // The command under a used id left the one stored there alone.
    let record = gw.log.command_at(published_seq).await.unwrap().expect("still stored");
    assert_eq!(codec::decode_command(&record.payload).unwrap().body, published.body);

    // The same batch again stores nothing: every good command is a duplicate of its first copy.
    let again_before = gw.last_seq().await;
    let (status, again) = gw.post(BATCH, serde_json::to_vec(&batch).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{again:#}");
    assert_published(&again, 0, &fresh_1.command_id.to_string(), before + 1, true);
    assert_published(&again, 5, &fresh_2.command_id.to_string(), before + 2, true);
    assert_refused(&again, 2, 409, Some(&published.command_id.to_string()), &["names another command"]);
    assert_eq!(gw.last_seq().await, again_before, "a batch sent again stores nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_a_batch_is_refused_whole_and_nothing_is_published() {
    let gw = Gateway::start_batch().await;
    let one = codec::command_to_json(&allocate()).unwrap();
    let before = gw.last_seq().await;

    let refusals = [
        ("one command, not an array", "application/json", one.clone(), "a JSON array of commands"),
        ("truncated", "application/json", format!("[{one}"), "a JSON array of commands"),
        ("text/plain", "text/plain", format!("[{one}]"), "Content-Type: application/json"),
    ];
    for (what, content_type, body, says) in refusals {
        let (status, answer) = gw.send(Method::POST, BATCH, content_type, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {answer:#}");
        let error = answer["error"].as_str().unwrap_or_else(|| panic!("{what}: no error: {answer:#}"));
        assert!(error.contains(says), "{what}: the error does not say {says:?}: {error}");
    }
    let (status, answer) = gw.post(&format!("{BATCH}?wait=true"), format!("[{one}]")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer:#}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("no ?wait")), "{answer:#}");

    let too_many: Vec<Value> = (0..=MAX_BATCH_COMMANDS).map(|_| value(&allocate())).collect();
    let (status, answer) = gw.post(BATCH, serde_json::to_vec(&too_many).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer:#}");
    let error = answer["error"].as_str().expect("an error");
    assert!(error.contains(&format!("at most {MAX_BATCH_COMMANDS}")), "{error}");
    assert_eq!(gw.last_seq().await, before, "nothing was published");

    // `batch` is a route of its own, never a command id; an empty batch is answered with nothing.
    let (status, answer) = gw.send(Method::GET, BATCH, "application/json", Body::empty()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{answer:#}");
    let (status, answer) = gw.post(BATCH, "[]").await;
    assert_eq!((status, answer), (StatusCode::OK, json!([])));
    assert_eq!(gw.last_seq().await, before, "nothing was published");
}
