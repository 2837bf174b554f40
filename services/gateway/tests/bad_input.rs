//! Bad input at the gateway (DESIGN section 12): every malformed, mistyped, oversized, forbidden or misaddressed
//! request is answered with its exact status and a `{"error": "..."}` that names what was wrong, and nothing is
//! appended to the command log. The good path beside it, for contrast: a valid command is published, decided and
//! projected, a retry of it is a duplicate with the same outcome, and a command on a subject that does not match its
//! body is dead-lettered by the writer and shown as such.
//!
//! The API is built in-process over the embedded log (a worker and a projector run as tasks) and called with
//! `tower::ServiceExt::oneshot`.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_gateway::GatewayConfig;
use leasehold_log::Log;
use leasehold_schemas::codec::{self, MAX_COMMAND_BYTES};
use leasehold_schemas::command::{Acquire, Allocate, ExpireLease, Heartbeat, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Position, ResourceId, ResourceRef, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, Envelope, Uuid};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower::ServiceExt;

use support::{Gateway, PARTITIONS};

/// How long a condition wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

impl Gateway {
    async fn start(with_worker: bool) -> Gateway {
        Gateway::start_with(GatewayConfig::default(), with_worker).await
    }

    async fn last_seq(&self) -> u64 {
        self.log.last_command_seq().await.expect("read the command log's last sequence")
    }

    /// Sends `request`; answers its status, its `Content-Type` and its body as JSON (`Value::Null` when empty).
    async fn send(&self, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
        let response = self.app.clone().oneshot(request).await.expect("the router answers");
        let status = response.status();
        let kind = response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().expect("ASCII").to_owned());
        let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("the answer is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
        };
        (status, kind, body)
    }

    async fn get(&self, uri: &str) -> (StatusCode, Value) {
        let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
        let (status, _, body) = self.send(request).await;
        (status, body)
    }

    /// `POST uri` with `body` as `application/json`.
    async fn post(&self, uri: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        self.post_as(uri, Some("application/json"), body).await
    }

    async fn post_as(&self, uri: &str, content_type: Option<&str>, body: impl Into<Body>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(Method::POST).uri(uri);
        if let Some(kind) = content_type {
            request = request.header(header::CONTENT_TYPE, kind);
        }
        let (status, _, body) = self.send(request.body(body.into()).expect("a request")).await;
        (status, body)
    }

    /// Posts `body` and checks the answer is `status` with an error that says each of `says`, and that nothing was
    /// appended to the command log.
    async fn refused(
        &self,
        what: &str,
        uri: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
        status: StatusCode,
        says: &[&str],
    ) {
        let before = self.last_seq().await;
        let (got, answer) = self.post_as(uri, content_type, body).await;
        assert_eq!(got, status, "{what}: {answer}");
        assert_error_says(what, &answer, says);
        assert_eq!(self.last_seq().await, before, "{what}: something was appended to the command log");
    }

    /// Publishes `envelope` straight to the log on `subject` (as a NATS user would), in its JSON form.
    async fn publish_raw(&self, subject: &str, envelope: &Envelope) -> u64 {
        let json = codec::command_to_json(envelope).expect("encode");
        let published = self
            .log
            .publish_command(subject, &envelope.command_id.to_string(), json.into_bytes().into())
            .await
            .expect("publish straight to the log");
        published.seq
    }

    /// Polls `GET /v1/commands/{id}` until `done` holds for its answer (bounded by [`DEADLINE`]).
    async fn wait_for_command(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (status, answer) = self.get(&format!("/v1/commands/{id}")).await;
            if status == StatusCode::OK && done(&answer) {
                return answer;
            }
            assert!(
                status == StatusCode::OK || status == StatusCode::NOT_FOUND,
                "GET /v1/commands/{id}: {status} {answer}"
            );
            assert!(Instant::now() < deadline, "command {id} did not get there in {DEADLINE:?}: {status} {answer}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The error answer says each of `says` (the field path, the value...).
#[track_caller]
fn assert_error_says(what: &str, answer: &Value, says: &[&str]) {
    let message = answer.get("error").and_then(Value::as_str).unwrap_or_else(|| panic!("{what}: no error: {answer}"));
    assert_eq!(answer.as_object().map(|o| o.len()), Some(1), "{what}: only `error` in {answer}");
    for needle in says {
        assert!(message.contains(needle), "{what}: the error does not say {needle:?}: {message}");
    }
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

fn agent(name: &str) -> AgentName {
    AgentName::new(name).expect("an agent name")
}

fn envelope(issuer: &str, body: impl Into<leasehold_schemas::Command>) -> Envelope {
    Envelope::new(CommandId::generate(), Issuer::new(issuer).expect("an issuer"), Timestamp(now_ms()), body)
}

/// A valid `op.allocate` of a fresh resource on `on`, with an `image` attribute.
fn allocate(on: &str) -> Envelope {
    envelope(
        "op:test",
        Allocate {
            agent: agent(on),
            resource: ResourceId::generate(),
            kind: "container".to_owned(),
            capacity: 2,
            attributes: [("image".to_owned(), "alpine:3.20".to_owned())].into(),
            parent: None,
            pools: Vec::new(),
            wait: None,
        },
    )
}

/// The JSON text a producer sends for `envelope`: the canonical producer path.
fn text(envelope: &Envelope) -> String {
    codec::command_to_json(envelope).expect("encode to JSON")
}

fn value(envelope: &Envelope) -> Value {
    serde_json::from_str(&text(envelope)).expect("JSON")
}

/// `text` with `from` replaced (once, and it must be there) by `to`: for what a `Value` cannot hold (a key twice).
fn replaced(text: &str, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(text.matches(from).count(), 1, "{from:?} is once in {text}");
    text.replacen(from, to, 1).into_bytes()
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("JSON")
}

/// The first effect of the first part of a `CommandStatus`'s outcome, as `{"name": {...}}`.
fn first_effect(status: &Value) -> &Value {
    &status["outcomes"][0]["outcome"]["decision"]["accepted"]["effects"][0]
}

const POST: &str = "/v1/commands";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_commands_are_refused_and_nothing_is_published() {
    let gw = Gateway::start(true).await;
    let good = text(&allocate("w1"));
    let json = Some("application/json");
    let bad = StatusCode::BAD_REQUEST;

    gw.refused("not JSON", POST, json, b"hello, leasehold".to_vec(), bad, &["must start with '{'", "0x68"]).await;
    let half = good.as_bytes()[..good.len() / 2].to_vec();
    gw.refused("truncated JSON", POST, json, half, bad, &["bad JSON", "EOF while parsing"]).await;
    gw.refused("empty body", POST, json, Vec::new(), bad, &["empty payload"]).await;
    gw.refused(
        "leading whitespace",
        POST,
        json,
        format!(" {good}").into_bytes(),
        bad,
        &["must start with '{'", "whitespace"],
    )
    .await;
    let mut bom = vec![0xef, 0xbb, 0xbf];
    bom.extend_from_slice(good.as_bytes());
    gw.refused("a byte-order mark", POST, json, bom, bad, &["byte-order mark"]).await;
    gw.refused("a JSON array", POST, json, format!("[{good}]").into_bytes(), bad, &["must start with '{'", "0x5b"])
        .await;
    gw.refused(
        "trailing garbage",
        POST,
        json,
        format!("{good} x").into_bytes(),
        bad,
        &["bad JSON", "trailing characters"],
    )
    .await;
    // Whitespace after the closing brace is allowed (schemas/README.md): the contrast.
    let before = gw.last_seq().await;
    let (status, answer) = gw.post(POST, format!("{good}\n")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["status"], "published");
    assert_eq!(gw.last_seq().await, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_decoding_names_the_field_path_and_the_value() {
    let gw = Gateway::start(true).await;
    let json = Some("application/json");
    let bad = StatusCode::BAD_REQUEST;
    let command = allocate("w1");
    let good = text(&command);
    let id = command.command_id.to_string();

    let mut wrong = value(&command);
    wrong["body"]["capacity"] = json!("2");
    gw.refused("a string capacity", POST, json, bytes(&wrong), bad, &["body.capacity", "\"2\"", "expected u32"]).await;

    let mut wrong = value(&command);
    wrong["body"]["capacity"] = json!(2.0);
    gw.refused("a fractional capacity", POST, json, bytes(&wrong), bad, &["body.capacity", "2.0"]).await;

    let mut wrong = value(&command);
    wrong["body"]["capacity"] = json!(-1);
    gw.refused("a negative capacity", POST, json, bytes(&wrong), bad, &["body.capacity", "-1"]).await;

    let mut wrong = value(&command);
    wrong["issued_at"] = json!("yesterday");
    gw.refused("a string time", POST, json, bytes(&wrong), bad, &["issued_at", "\"yesterday\""]).await;

    let mut wrong = value(&command);
    wrong["body"]["agent"] = json!("W1");
    gw.refused("a bad agent name", POST, json, bytes(&wrong), bad, &["body.agent", "W1"]).await;

    let mut wrong = value(&command);
    wrong["colour"] = json!("blue");
    gw.refused("an unknown envelope field", POST, json, bytes(&wrong), bad, &["unknown field", "colour"]).await;

    let mut wrong = value(&command);
    wrong["body"]["colour"] = json!("blue");
    gw.refused("an unknown body field", POST, json, bytes(&wrong), bad, &["body", "unknown field", "colour"]).await;

    let mut wrong = value(&command);
    wrong["body"].as_object_mut().expect("an object").remove("capacity");
    gw.refused("a missing body field", POST, json, bytes(&wrong), bad, &["body", "missing field", "capacity"]).await;

    let twice = replaced(&good, "\"issuer\":\"op:test\"", "\"issuer\":\"op:test\",\"issuer\":\"op:mallory\"");
    gw.refused("an envelope key twice", POST, json, twice, bad, &["duplicate field", "issuer"]).await;

    let twice = replaced(&good, "\"image\":\"alpine:3.20\"", "\"image\":\"alpine:3.20\",\"image\":\"evil:latest\"");
    gw.refused("an attribute twice", POST, json, twice, bad, &["body.attributes", "duplicate key", "\"image\""]).await;

    let twice = replaced(&good, "\"capacity\":2", "\"capacity\":2,\"capacity\":1000");
    gw.refused("a body key twice", POST, json, twice, bad, &["body", "duplicate field", "capacity"]).await;

    let upper = id.to_uppercase();
    let shouting = replaced(&good, &id, &upper);
    gw.refused("an upper-case command id", POST, json, shouting, bad, &["command_id", &upper, "canonical form"]).await;

    let resource = match &command.body {
        leasehold_schemas::Command::Allocate(allocate) => allocate.resource.to_string(),
        other => unreachable!("{other:?}"),
    };
    let upper = resource.to_uppercase();
    let shouting = replaced(&good, &resource, &upper);
    gw.refused("an upper-case resource id", POST, json, shouting, bad, &["body.resource", &upper]).await;

    let simple = resource.replace('-', "");
    let plain = replaced(&good, &resource, &simple);
    gw.refused("a resource id without hyphens", POST, json, plain, bad, &["body.resource", &simple]).await;

    let v4 = Uuid::from_u128(0x6f1c2a52_9d4e_4b7a_8c3f_0123456789ab).to_string();
    let random = replaced(&good, &id, &v4);
    gw.refused("a command id of version 4", POST, json, random, bad, &["command_id", &v4, "4"]).await;

    let mut wrong = value(&command);
    wrong["type"] = json!("op.teleport");
    gw.refused("an unknown type", POST, json, bytes(&wrong), bad, &["op.teleport"]).await;

    let mut wrong = value(&command);
    wrong["class"] = json!("sys");
    gw.refused("a class that is not the type's", POST, json, bytes(&wrong), bad, &["op.allocate", "sys"]).await;

    let mut wrong = value(&command);
    wrong["schema_version"] = json!(99);
    gw.refused("a newer schema version", POST, json, bytes(&wrong), bad, &["99"]).await;

    // Over the 1 MiB a command may take: an attribute that makes the body larger than MAX_COMMAND_BYTES.
    let mut huge = value(&command);
    huge["body"]["attributes"]["padding"] = json!("x".repeat(MAX_COMMAND_BYTES));
    let huge = bytes(&huge);
    assert!(huge.len() > MAX_COMMAND_BYTES);
    gw.refused("an oversized body", POST, json, huge, bad, &[&MAX_COMMAND_BYTES.to_string()]).await;

    // After all that, the same command as it should be is taken.
    let before = gw.last_seq().await;
    let (status, answer) = gw.post(POST, good).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["command_id"], id.as_str());
    assert_eq!(answer["command_seq"], before + 1);
    assert_eq!(gw.last_seq().await, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_types_classes_and_query_strings_are_checked_before_anything_is_published() {
    let gw = Gateway::start(true).await;
    let json = Some("application/json");
    let bad = StatusCode::BAD_REQUEST;
    let good = text(&allocate("w1")).into_bytes();

    gw.refused("text/plain", POST, Some("text/plain"), good.clone(), bad, &["Content-Type: application/json"]).await;
    gw.refused("a form", POST, Some("application/x-www-form-urlencoded"), good.clone(), bad, &["application/json"])
        .await;
    gw.refused("a look-alike media type", POST, Some("application/jsonx"), good.clone(), bad, &["application/json"])
        .await;

    let heartbeat = envelope("w1", Heartbeat { agent: agent("w1"), epoch: Position(1) });
    gw.refused(
        "an agent command",
        POST,
        json,
        text(&heartbeat).into_bytes(),
        StatusCode::FORBIDDEN,
        &["op commands only", "agent.heartbeat", "agent command"],
    )
    .await;
    let register = envelope(
        "w1",
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent("w1"), Uuid::from_u128(7)) },
    );
    gw.refused(
        "an agent registration",
        POST,
        json,
        text(&register).into_bytes(),
        StatusCode::FORBIDDEN,
        &["agent.register", "agent command"],
    )
    .await;
    let expire = envelope("sweeper", ExpireLease { agent: agent("w1"), lease: LeaseId::generate() });
    gw.refused(
        "a sys command",
        POST,
        json,
        text(&expire).into_bytes(),
        StatusCode::FORBIDDEN,
        &["op commands only", "sys.expire-lease", "sys command"],
    )
    .await;

    for (query, says) in [
        ("?wait=maybe", &["bad query", "wait"][..]),
        ("?timeout=forever", &["bad query", "timeout", "forever"]),
        ("?wait=true&timeout=10m", &["bad query", "timeout", "10m"]),
        ("?colour=blue", &["bad query", "colour"]),
        ("?wait=true&wait=false", &["bad query", "wait"]),
    ] {
        gw.refused(query, &format!("{POST}{query}"), json, good.clone(), bad, says).await;
    }

    // Without a Content-Type, and with parameters after it, a command is taken: the contrast.
    let before = gw.last_seq().await;
    let (status, answer) = gw.post_as(POST, None, text(&allocate("w1"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let (status, answer) = gw.post_as(POST, Some("application/json; charset=utf-8"), text(&allocate("w1"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(gw.last_seq().await, before + 2);
}

/// Ids carry their issuer's clock (UUIDv7): a command, resource, lease or parent id stamped more than
/// `MAX_ID_AHEAD` (5 minutes) after the gateway's clock is refused at the door, alone or in a batch, and nothing is
/// published; one a minute ahead (a clock a little fast) is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_stamped_far_ahead_of_the_gateways_clock_are_refused() {
    let gw = Gateway::start(false).await;
    let json = Some("application/json");
    let bad = StatusCode::BAD_REQUEST;
    let ahead = leasehold_domain::MAX_ID_AHEAD.0;
    // Ten seconds past the limit: the test's clock and the gateway's are the same clock, read a moment apart.
    let far = now_ms() + ahead + 10_000;
    let says = |what: &'static str| [what, "more than 5min after the gateway's clock", "fix the issuer's clock"];

    let mut command = allocate("w1");
    command.command_id = CommandId::from_parts(far, [1; 10]);
    gw.refused("a command id ahead", POST, json, text(&command).into_bytes(), bad, &says("command id")).await;

    let mut resource = allocate("w1");
    let Command::Allocate(body) = &mut resource.body else { unreachable!("an allocation") };
    body.resource = ResourceId::from_parts(far, [2; 10]);
    gw.refused("a resource id ahead", POST, json, text(&resource).into_bytes(), bad, &says("resource id")).await;

    let mut child = allocate("w1");
    let Command::Allocate(body) = &mut child.body else { unreachable!("an allocation") };
    body.parent = Some(ResourceRef::new(agent("w2"), ResourceId::from_parts(far, [3; 10])));
    gw.refused("a parent id ahead", POST, json, text(&child).into_bytes(), bad, &says("parent id")).await;

    let acquire = |lease: LeaseId, resource: ResourceId| {
        let holder = "build-1".to_owned();
        let body = Acquire { agent: agent("w1"), resource, lease, holder, ttl: None, wait_timeout: None, priority: 0 };
        envelope("op:test", body)
    };
    let lease_ahead = acquire(LeaseId::from_parts(far, [4; 10]), ResourceId::generate());
    gw.refused("a lease id ahead", POST, json, text(&lease_ahead).into_bytes(), bad, &says("lease id")).await;
    let resource_ahead = acquire(LeaseId::generate(), ResourceId::from_parts(far, [5; 10]));
    gw.refused("an acquired resource ahead", POST, json, text(&resource_ahead).into_bytes(), bad, &says("resource id"))
        .await;

    // In a batch, the item alone is refused; the others are published.
    let good = allocate("w1");
    let before = gw.last_seq().await;
    let batch = format!("[{},{}]", text(&good), text(&command));
    let (status, answers) = gw.post("/v1/commands/batch", batch).await;
    assert_eq!(status, StatusCode::OK, "{answers}");
    assert_eq!(answers[0]["status"], "published", "{answers:#}");
    assert_eq!(answers[1]["status_code"], 400, "{answers:#}");
    let message = answers[1]["error"].as_str().expect("an error");
    assert!(message.contains("command id") && message.contains("fix the issuer's clock"), "{message}");
    assert_eq!(gw.last_seq().await, before + 1, "only the good command is published");

    // A clock a minute fast is within the tolerance.
    let mut near = allocate("w1");
    near.command_id = CommandId::from_parts(now_ms() + 60_000, [6; 10]);
    let Command::Allocate(body) = &mut near.body else { unreachable!("an allocation") };
    body.resource = ResourceId::from_parts(now_ms() + 60_000, [7; 10]);
    let (status, answer) = gw.post(POST, text(&near)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_and_queries_of_the_read_side() {
    let gw = Gateway::start(true).await;
    let before = gw.last_seq().await;

    let (status, answer) = gw.get("/v1/resources/not-a-ref").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad resource reference", &answer, &["\"not-a-ref\"", "<agent>.<id>"]);

    let (status, answer) = gw.get("/v1/resources/w1.019B76DA-9478-7111-9111-111111111111").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("an upper-case resource id", &answer, &["019B76DA-9478-7111-9111-111111111111"]);

    let unknown = format!("w1.{}", ResourceId::generate());
    let (status, answer) = gw.get(&format!("/v1/resources/{unknown}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_error_says("an unknown resource", &answer, &[&unknown]);

    let (status, answer) = gw.get("/v1/resources?state=bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says(
        "a bad state",
        &answer,
        &[
            "\"bogus\"",
            "pending",
            "active",
            "paused",
            "suspect",
            "releasing",
            "destroyed",
            "lost",
            "orphaned",
            "failed",
        ],
    );
    let (status, answer) = gw.get("/v1/resources?agent=Not_An_Agent").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad agent", &answer, &["agent", "Not_An_Agent"]);
    let (status, answer) = gw.get("/v1/resources?colour=blue").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("an unknown filter", &answer, &["bad query", "colour"]);
    let (status, answer) = gw.get("/v1/resources?state=active").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer, json!([]));
    for (query, says) in [
        ("?attr=novalue", &["bad query", "attr", "novalue", "name=value"][..]),
        ("?limit=0", &["bad query", "limit"]),
        ("?limit=many", &["bad query", "limit", "many"]),
        ("?all=maybe", &["bad query", "all", "maybe"]),
        ("?holder=a&holder=b", &["bad query", "holder", "twice"]),
        ("?resource=w1.x", &["bad query", "resource"]),
    ] {
        let (status, answer) = gw.get(&format!("/v1/resources{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {answer}");
        assert_error_says(query, &answer, says);
    }
    let (status, answer) = gw.get("/v1/resources?attr=team=ci&attr=zone=a&holder=h&all=true&after=w1.x&limit=5").await;
    assert_eq!((status, answer), (StatusCode::OK, json!([])), "every filter together");
    let (status, answer) = gw.get("/v1/leases?state=active").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a filter leases do not take", &answer, &["bad query", "state"]);

    let (status, answer) = gw.get("/v1/commands/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad command id", &answer, &["\"not-a-uuid\"", "not a command id"]);
    let unknown = CommandId::generate().to_string();
    let (status, answer) = gw.get(&format!("/v1/commands/{unknown}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_error_says("an unknown command", &answer, &[&unknown]);

    let (status, answer) = gw.get("/v1/leases?resource=nope").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad lease filter", &answer, &["bad query", "\"nope\""]);
    let (status, answer) = gw.get("/v1/pools/No%20Pool").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad pool name", &answer, &["No Pool", "not a pool name"]);
    let (status, answer) = gw.get("/v1/pools/nosuchpool").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_error_says("an unknown pool", &answer, &["no pool nosuchpool"]);
    let (status, answer) = gw.get("/v1/dlq?from=first").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad dead-letter cursor", &answer, &["bad query", "from"]);
    let (status, answer) = gw.get("/v1/events?key=Not%20A%20Key").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad events key", &answer, &["bad query", "Not A Key"]);
    let (status, answer) = gw.get("/v1/events?from=-3").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("a bad events cursor", &answer, &["bad query", "from"]);

    for reference in
        ["garbage", "w1", "W1.019b76da-9860-7333-b333-333333333333", "w1.019B76DA-9860-7333-B333-333333333333"]
    {
        let (status, answer) = gw.get(&format!("/v1/leases/{reference}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reference}: {answer}");
        assert_error_says("a bad lease reference", &answer, &[&format!("{reference:?}"), "<agent>.<lease id>"]);
    }
    let unknown = format!("w1.{}", LeaseId::generate());
    let (status, answer) = gw.get(&format!("/v1/leases/{unknown}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_error_says("an unknown lease", &answer, &[&unknown]);

    // A known path with a method it does not take: 405, with the error in JSON like every other.
    for (method, uri) in [(Method::PUT, "/v1/commands"), (Method::DELETE, "/v1/resources"), (Method::POST, "/v1/dlq")] {
        let request = Request::builder().method(method.clone()).uri(uri).body(Body::empty()).expect("a request");
        let (status, kind, answer) = gw.send(request).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}: {answer}");
        assert_eq!(kind.as_deref(), Some("application/json"), "{method} {uri}");
        assert_error_says("a wrong method", &answer, &[uri, method.as_str()]);
    }

    for uri in ["/v1/nothing-here", "/v2/commands", "/"] {
        let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
        let (status, kind, answer) = gw.send(request).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {answer}");
        assert_eq!(kind.as_deref(), Some("application/json"), "{uri}");
        assert_error_says(uri, &answer, &["no such endpoint"]);
    }
    assert_eq!(gw.last_seq().await, before, "a query appended something");
}

/// `op.allocate` on an agent that never registered is decided and rejected (`unknown`, naming the agent); on a
/// registered one it is accepted. Either way `?wait=true` answers once it is projected, a retry is a duplicate
/// with the same outcome, and `GET /v1/commands/{id}` gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_command_is_decided_and_a_retry_gets_the_same_outcome() {
    let gw = Gateway::start(true).await;

    // The agent has never registered: the writer rejects the allocation, and says why.
    let ghost = allocate("ghost");
    let ghost_id = ghost.command_id.to_string();
    let before = gw.last_seq().await;
    let (status, answer) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&ghost)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["command_id"], ghost_id.as_str());
    assert_eq!(answer["status"], "rejected", "{answer}");
    assert_eq!(answer["command_seq"], before + 1);
    assert_eq!(answer["duplicate"], false);
    assert_eq!(answer["rejection"]["kind"], "unknown", "{answer}");
    let message = answer["rejection"]["message"].as_str().expect("a message");
    assert!(message.contains("agent ghost") && message.contains("never registered"), "{message}");
    assert_eq!(answer["outcomes"][0]["outcome"]["decision"]["rejected"], answer["rejection"]);
    assert_eq!(answer["outcomes"][0]["outcome"]["command"]["id"], ghost_id.as_str());

    // The agent registers (an agent command: published straight to the log, as the agent does on NATS).
    let register = envelope(
        "w1",
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent("w1"), Uuid::from_u128(0x5eed)) },
    );
    gw.publish_raw(&ingress_subject_of(&register.body), &register).await;
    let registered = gw.wait_for_command(&register.command_id.to_string(), |a| a["status"] == "accepted").await;
    assert!(first_effect(&registered).get("agent-registered").is_some(), "{registered}");

    let command = allocate("w1");
    let id = command.command_id.to_string();
    let resource = match &command.body {
        leasehold_schemas::Command::Allocate(allocate) => allocate.resource.to_string(),
        other => unreachable!("{other:?}"),
    };
    let before = gw.last_seq().await;
    let (status, first) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&command)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["command_id"], id.as_str());
    assert_eq!(first["status"], "accepted", "{first}");
    assert_eq!(first["command_seq"], before + 1);
    assert_eq!(first["duplicate"], false);
    assert_eq!(first["rejection"], Value::Null);
    assert_eq!(first["dead_letter"], Value::Null);
    let outcome = &first["outcomes"][0]["outcome"];
    assert_eq!(outcome["command"]["id"], id.as_str());
    assert_eq!(outcome["command"]["type_name"], "op.allocate");
    assert_eq!(outcome["cmd_seq"], before + 1);
    let allocated = &first_effect(&first)["resource-allocated"];
    assert_eq!(allocated["resource"], resource.as_str(), "{first}");
    assert_eq!(allocated["attributes"], json!({"image": "alpine:3.20"}));
    // Decided and projected: a query right after it sees the resource.
    let (status, view) = gw.get(&format!("/v1/resources/w1.{resource}")).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "pending");

    // The same command again: not stored again, and the same outcome.
    let (status, again) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&command)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["status"], "accepted");
    assert_eq!(again["command_seq"], first["command_seq"]);
    assert_eq!(again["outcomes"], first["outcomes"]);
    assert_eq!(gw.last_seq().await, before + 1, "a retry was stored again");
    // Without waiting, a retry says so too.
    let (status, published) = gw.post(POST, text(&command)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{published}");
    assert_eq!(published["duplicate"], true, "{published}");
    assert_eq!(published["command_seq"], first["command_seq"]);

    // And the query by id gives it.
    let (status, queried) = gw.get(&format!("/v1/commands/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{queried}");
    assert_eq!(queried["status"], "accepted");
    assert_eq!(queried["command_seq"], first["command_seq"]);
    assert_eq!(queried["outcomes"], first["outcomes"]);
    assert_eq!(queried["duplicate"], false);
    let (status, queried) = gw.get(&format!("/v1/commands/{ghost_id}")).await;
    assert_eq!(status, StatusCode::OK, "{queried}");
    assert_eq!(queried["status"], "rejected");
    assert_eq!(queried["rejection"]["kind"], "unknown");

    // An acquire on the pending resource: the lease waits (the resource is not created yet: no agent runs here).
    let lease = LeaseId::generate();
    let acquire = envelope(
        "op:test",
        Acquire {
            agent: agent("w1"),
            resource: resource.parse().expect("a resource id"),
            lease,
            holder: "build-1".to_owned(),
            ttl: None,
            wait_timeout: None,
            priority: 0,
        },
    );
    let (status, answer) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&acquire)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["status"], "accepted", "{answer}");
    assert_eq!(first_effect(&answer)["lease-waiting"]["lease"], lease.to_string(), "{answer}");
    let (status, view) = gw.get(&format!("/v1/leases/w1.{lease}")).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"], "waiting");
}

/// A command published straight to the log on an ingress subject that does not match its body (the body is about
/// agent `w1`, the subject names `w2`) is not decided but dead-lettered by the writer; the gateway shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_the_wrong_subject_is_dead_lettered_and_shown_so() {
    let gw = Gateway::start(true).await;
    let command = allocate("w1");
    let id = command.command_id.to_string();
    let resource = match &command.body {
        leasehold_schemas::Command::Allocate(allocate) => allocate.resource.to_string(),
        other => unreachable!("{other:?}"),
    };
    let wrong = format!("lh.in.op.w2.{resource}");
    let seq = gw.publish_raw(&wrong, &command).await;

    let answer = gw.wait_for_command(&id, |a| a["status"] == "dead-lettered").await;
    assert_eq!(answer["command_id"], id.as_str());
    assert_eq!(answer["command_seq"], seq);
    assert_eq!(answer["outcomes"], json!([]), "{answer}");
    let letter = &answer["dead_letter"];
    assert_eq!(letter["source_seq"], seq);
    let subject = letter["subject"].as_str().expect("a subject");
    assert!(subject.starts_with("lh.cmd.") && subject.ends_with(&format!(".op.w2.{resource}")), "{subject}");
    let reason = letter["reason"].as_str().expect("a reason");
    assert!(reason.contains("lh.in.op.w1"), "the reason names the subject the body fits: {reason}");

    let (status, list) = gw.get("/v1/dlq").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let listed = list.as_array().expect("a list");
    let entry = listed.iter().find(|d| d["command_id"] == id.as_str()).unwrap_or_else(|| panic!("not listed: {list}"));
    assert_eq!(entry["source_seq"], seq);
    assert_eq!(entry["reason"], letter["reason"]);
    assert_eq!(entry["subject"], subject);
    assert_eq!(entry["bytes"], text(&command).len());

    // Nothing was decided for it, and the resource does not exist.
    let (status, answer) = gw.get(&format!("/v1/resources/w1.{resource}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
}

/// With no worker, nobody decides: `?wait=true&timeout=1s` runs out and answers 504 `pending`; the command is
/// published all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_answers_504_pending() {
    let gw = Gateway::start(false).await;
    let command = allocate("w1");
    let id = command.command_id.to_string();
    let before = gw.last_seq().await;
    let started = Instant::now();
    let (status, answer) = gw.post(&format!("{POST}?wait=true&timeout=1s"), text(&command)).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert_eq!(answer["status"], "pending", "{answer}");
    assert_eq!(answer["command_id"], id.as_str());
    assert_eq!(answer["command_seq"], before + 1);
    assert_eq!(answer["outcomes"], json!([]));
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "the wait took {took:?}");
    assert_eq!(gw.last_seq().await, before + 1, "the command was published");
    let (status, answer) = gw.get(&format!("/v1/commands/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_error_says("undecided", &answer, &[&id, "not decided yet"]);
}

/// A command id names one command. Each partition remembers only its own ids, so the log alone would decide a
/// reused id again in another partition; the gateway refuses it (409) once the first is decided, and publishes
/// nothing. The same command sent again is answered with its first decision, without publishing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_id_reused_for_another_command_is_refused() {
    let gw = Gateway::start(true).await;
    for name in ["w1", "w2"] {
        let register = envelope(
            name,
            Register { settings: Some(AgentSettings::default()), ..Register::new(agent(name), Uuid::now_v7()) },
        );
        gw.publish_raw(&ingress_subject_of(&register.body), &register).await;
        gw.wait_for_command(&register.command_id.to_string(), |a| a["status"] == "accepted").await;
    }
    let first = allocate("w1");
    let id = first.command_id.to_string();
    let (status, decided) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&first)).await;
    assert_eq!((status, decided["status"].as_str()), (StatusCode::OK, Some("accepted")), "{decided}");
    assert_ne!(
        leasehold_schemas::subjects::partition_of_agent(&agent("w1"), PARTITIONS),
        leasehold_schemas::subjects::partition_of_agent(&agent("w2"), PARTITIONS),
        "the test needs two partitions"
    );

    let mut reused = allocate("w2");
    reused.command_id = first.command_id;
    gw.refused(
        "a reused command id",
        &format!("{POST}?wait=true"),
        Some("application/json"),
        text(&reused).into_bytes(),
        StatusCode::CONFLICT,
        &[&id, "op.allocate for w1", "choose a new one"],
    )
    .await;
    let (status, queried) = gw.get(&format!("/v1/commands/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{queried}");
    assert_eq!(queried["outcomes"], decided["outcomes"], "the first decision stands");

    // The same type for the same agent but another body (another resource) is another command too.
    let mut other_target = allocate("w1");
    other_target.command_id = first.command_id;
    gw.refused(
        "a reused command id for another resource of the same agent",
        &format!("{POST}?wait=true"),
        Some("application/json"),
        text(&other_target).into_bytes(),
        StatusCode::CONFLICT,
        &[&id, "op.allocate for w1", "choose a new one"],
    )
    .await;

    // Two different commands under one fresh id, posted at once: the log keeps one; the other is told so (409),
    // never answered with the first's decision.
    let (mut left, mut right) = (allocate("w1"), allocate("w2"));
    right.command_id = left.command_id;
    left.issued_at = right.issued_at;
    let uri = format!("{POST}?wait=true&timeout=20s");
    let ((a, a_answer), (b, b_answer)) = tokio::join!(gw.post(&uri, text(&left)), gw.post(&uri, text(&right)));
    let mut codes = [a, b];
    codes.sort();
    assert_eq!(codes, [StatusCode::OK, StatusCode::CONFLICT], "{a_answer} / {b_answer}");
    let (winner, won) = if a == StatusCode::OK { (&left, &a_answer) } else { (&right, &b_answer) };
    let allocated = &first_effect(won)["resource-allocated"]["resource"];
    let Command::Allocate(body) = &winner.body else { unreachable!("an allocation") };
    assert_eq!(allocated, &json!(body.resource.to_string()), "the winner got its own decision: {won}");

    // Past the gateway (a producer on NATS with its own message ids), the reused id is decided in the other partition
    // too: the query by id names both decisions, and each can be asked for.
    let mut past = allocate("w2");
    past.command_id = first.command_id;
    let stored = gw
        .log
        .publish_command(&ingress_subject_of(&past.body), "another-message-id", text(&past).into_bytes().into())
        .await
        .expect("publish past the gateway");
    let deadline = Instant::now() + DEADLINE;
    let both = loop {
        let (status, answer) = gw.get(&format!("/v1/commands/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        if answer["detail"].as_str().is_some_and(|d| d.contains("was used for 2 commands")) {
            break answer;
        }
        assert!(Instant::now() < deadline, "the second decision never showed: {answer}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(both["outcomes"], decided["outcomes"], "the first decision first: {both}");
    let (status, second) = gw.get(&format!("/v1/commands/{id}?seq={}", stored.seq)).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["command_seq"], stored.seq);
    assert_eq!(second["outcomes"][0]["outcome"]["command"]["key"], "w2", "{second}");

    // The same command with a later issuer time (a client that rebuilt its envelope) is a retry: answered, not stored.
    let mut again = first.clone();
    again.issued_at = Timestamp(first.issued_at.0 + 1000);
    let before = gw.last_seq().await;
    let (status, answer) = gw.post(&format!("{POST}?wait=true&timeout=20s"), text(&again)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!((answer["duplicate"].as_bool(), &answer["outcomes"]), (Some(true), &decided["outcomes"]));
    assert_eq!(gw.last_seq().await, before, "a retry of a decided command is not published again");
}

/// A gateway shutting down while a request waits answers 503 with what it knows (the command is stored: `pending`
/// and its command sequence), never a bare error a client could take for a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cut_by_shutdown_says_the_command_is_stored() {
    let gw = Gateway::start(false).await;
    let command = allocate("w1");
    let before = gw.last_seq().await;
    let app = gw.app.clone();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{POST}?wait=true&timeout=60s"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(text(&command)))
        .expect("a request");
    let waiting = tokio::spawn(async move { app.oneshot(request).await.expect("the router answers") });
    let deadline = Instant::now() + DEADLINE;
    while gw.last_seq().await == before {
        assert!(Instant::now() < deadline, "the command was never published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.shutdown.cancel();
    let response = tokio::time::timeout(DEADLINE, waiting).await.expect("answered at shutdown").expect("no panic");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.into_body().collect().await.expect("read the body").to_bytes();
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["status"], "pending", "{answer}");
    assert_eq!(answer["command_id"], command.command_id.to_string());
    assert_eq!(answer["command_seq"], before + 1);
    assert!(answer["detail"].as_str().is_some_and(|d| d.contains("shutting down")), "{answer}");
}

/// `Last-Event-ID` at the end of the number range is refused, not wrapped around to replay everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_past_every_sequence_is_refused() {
    let gw = Gateway::start(false).await;
    let request = Request::builder()
        .uri("/v1/events?key=w1")
        .header("last-event-id", u64::MAX.to_string())
        .body(Body::empty())
        .expect("a request");
    let (status, _, answer) = gw.send(request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_error_says("Last-Event-ID u64::MAX", &answer, &["Last-Event-ID", "18446744073709551615"]);
}

/// The event stream opens by saying where it starts (`event: open`, `id: from - 1`), so a client that reconnects
/// before any outcome came resumes from there with `Last-Event-ID`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_opens_with_where_it_starts() {
    let gw = Gateway::start(false).await;
    let request = Request::builder().uri("/v1/events?key=w1&from=5").body(Body::empty()).expect("a request");
    let response = gw.app.clone().oneshot(request).await.expect("the router answers");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let frame = tokio::time::timeout(DEADLINE, body.frame()).await.expect("a first frame").expect("data").expect("ok");
    let text = String::from_utf8(frame.into_data().expect("bytes").to_vec()).expect("UTF-8");
    assert!(text.contains("event: open") && text.contains("id: 4") && text.contains(r#"{"from":5}"#), "{text}");
}

/// A command over the codec's 1 MiB (the embedded log stores up to 2 MiB, as NATS does with `max_payload: 2MB`),
/// published straight to the log, is dead-lettered and found by its id: whole, and cut short in its body (the id is
/// read from the top of the payload, not from a document that must parse whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_over_1_mib_is_found_dead_lettered_by_its_id() {
    let gw = Gateway::start(true).await;
    let big = |command: &Envelope| -> Vec<u8> {
        replaced(&text(command), r#""image":"alpine:3.20""#, &format!(r#""image":"{}""#, "a".repeat(MAX_COMMAND_BYTES)))
    };
    let whole = allocate("w1");
    let cut = allocate("w1");
    let cut_bytes = {
        let bytes = big(&cut);
        bytes[..bytes.len() - 100].to_vec()
    };
    for (command, payload) in [(&whole, big(&whole)), (&cut, cut_bytes)] {
        let id = command.command_id.to_string();
        assert!(payload.len() > MAX_COMMAND_BYTES);
        let seq = gw
            .log
            .publish_command(&ingress_subject_of(&command.body), &id, payload.into())
            .await
            .expect("the log stores up to 2 MiB")
            .seq;
        let answer = gw.wait_for_command(&id, |a| a["status"] == "dead-lettered").await;
        assert_eq!(answer["command_seq"], seq, "{answer}");
        assert_eq!(answer["dead_letter"]["id_verified"], true, "{answer}");
        assert_eq!(answer["detail"], Value::Null, "{answer}");
        let reason = answer["dead_letter"]["reason"].as_str().expect("a reason");
        assert!(reason.starts_with("oversized") && reason.contains("over the limit of 1048576"), "{reason}");
    }
    let (status, list) = gw.get("/v1/dlq").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let ids: Vec<Value> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|d| json!({"command_id": d["command_id"], "id_verified": d["id_verified"]}))
        .collect();
    let expected: Vec<Value> =
        [&whole, &cut].iter().map(|c| json!({"command_id": c.command_id.to_string(), "id_verified": true})).collect();
    assert_eq!(ids, expected);
}

/// Garbage published under a `Nats-Msg-Id` that is a command id (a producer that meant a command and sent
/// something else) is found by that id, marked unverified: its payload names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_found_by_the_id_it_was_published_under_marked_unverified() {
    let gw = Gateway::start(true).await;
    let id = CommandId::generate().to_string();
    let seq = gw
        .log
        .publish_command("lh.in.op.w1._", &id, b"\x02not a command".to_vec().into())
        .await
        .expect("publish garbage")
        .seq;
    let answer = gw.wait_for_command(&id, |a| a["status"] == "dead-lettered").await;
    assert_eq!(answer["command_seq"], seq, "{answer}");
    assert_eq!(answer["dead_letter"]["id_verified"], false, "{answer}");
    assert!(answer["dead_letter"]["reason"].as_str().expect("a reason").starts_with("unknown format"), "{answer}");
    let detail = answer["detail"].as_str().expect("a note on the id");
    assert!(detail.starts_with("unverified id") && detail.contains("Nats-Msg-Id"), "{detail}");
    let (status, list) = gw.get("/v1/dlq").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let entry = &list[0];
    assert_eq!((&entry["command_id"], &entry["id_verified"]), (&json!(id), &json!(false)), "{list}");
}
