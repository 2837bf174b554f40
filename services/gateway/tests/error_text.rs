//! No terminal injection through the gateway's errors: a request whose bad part carries control or bidi characters
//! (a field name, a query key, a path that is not UTF-8) is refused with a JSON error whose message shows them
//! escaped — neither the body's bytes nor the decoded message (what `jq -r .error` prints) holds one — while the
//! answers that carry data (a resource, a lease) keep what producers wrote exactly.

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_gateway::GatewayConfig;
use leasehold_log::Log;
use leasehold_schemas::codec;
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::text::is_unsafe_for_display;
use leasehold_schemas::{Envelope, Uuid};
use serde_json::{Value, json};
use tower::ServiceExt;

use support::Gateway;

/// What a terminal would act on, in one name: ESC and a colour, a carriage return, a C1 CSI, a right-to-left
/// override.
const EVIL: &str = "x\u{1b}[31mRED\rFAKE\u{9b}2J\u{202e}";
/// [`EVIL`] as the gateway must show it.
const EVIL_SHOWN: &str = "x\\x1b[31mRED\\rFAKE\\u{9b}2J\\u{202e}";

impl Gateway {
    /// Sends `request`; answers its status, its `Content-Type` and its raw body.
    async fn answer(&self, request: Request<Body>) -> (StatusCode, Option<String>, Vec<u8>) {
        let response = self.app.clone().oneshot(request).await.expect("the router answers");
        let status = response.status();
        let kind = response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().expect("ASCII").to_owned());
        let bytes = response.into_body().collect().await.expect("read the body").to_bytes().to_vec();
        (status, kind, bytes)
    }
}

/// The body is a JSON error whose bytes and decoded message hold no control or bidi character; answers the message.
#[track_caller]
fn safe_error(what: &str, kind: Option<String>, body: &[u8]) -> String {
    assert_eq!(kind.as_deref(), Some("application/json"), "{what}: {}", String::from_utf8_lossy(body));
    let text = std::str::from_utf8(body).expect("a UTF-8 body");
    assert!(!text.contains(is_unsafe_for_display), "{what}: the body holds a raw control or bidi character: {text:?}");
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
    let message = value["error"].as_str().unwrap_or_else(|| panic!("{what}: no error: {value}")).to_owned();
    assert!(!message.contains(is_unsafe_for_display), "{what}: the message holds one once decoded: {message:?}");
    message
}

fn envelope(issuer: &str, body: impl Into<leasehold_schemas::Command>) -> Envelope {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    let now = Timestamp(u64::try_from(now).expect("a time in ms"));
    Envelope::new(CommandId::generate(), Issuer::new(issuer).expect("an issuer"), now, body)
}

fn allocate() -> Envelope {
    envelope(
        "op:test",
        Allocate {
            agent: AgentName::new("w1").expect("a name"),
            resource: ResourceId::generate(),
            kind: "container".to_owned(),
            capacity: 1,
            attributes: [("note".to_owned(), EVIL.to_owned())].into(),
            parent: None,
            pools: Vec::new(),
            wait: None,
        },
    )
}

fn post(uri: &str, body: Vec<u8>) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a request")
}

fn get(uri: &str) -> Request<Body> {
    Request::builder().uri(uri).body(Body::empty()).expect("a request")
}

#[tokio::test]
async fn errors_that_echo_the_request_show_its_control_characters_escaped() {
    let gw = Gateway::start_with(GatewayConfig::default(), false).await;
    let mut command: Value = serde_json::from_str(&codec::command_to_json(&allocate()).expect("JSON")).expect("JSON");
    command["body"][EVIL] = json!(1);

    // A field the command does not have: serde's message names it as it was written.
    let bytes = serde_json::to_vec(&command).expect("JSON");
    let (status, kind, body) = gw.answer(post("/v1/commands", bytes.clone())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    let message = safe_error("an unknown field", kind, &body);
    assert!(message.contains(EVIL_SHOWN), "{message}");

    // The same command as an item of a batch: its refusal in the 200 answer.
    let batch = format!("[{}]", String::from_utf8(bytes).expect("UTF-8"));
    let (status, _, body) = gw.answer(post("/v1/commands/batch", batch.into_bytes())).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answers: Value = serde_json::from_slice(&body).expect("JSON");
    let error = answers[0]["error"].as_str().unwrap_or_else(|| panic!("no refusal: {answers}"));
    assert!(error.contains(EVIL_SHOWN) && !error.contains(is_unsafe_for_display), "{error:?}");

    // A query key that is not one.
    let uri = "/v1/resources?x%1B%5B31mRED%0DFAKE%C2%9B2J%E2%80%AE=1";
    let (status, kind, body) = gw.answer(get(uri)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    let message = safe_error("an unknown query key", kind, &body);
    assert!(message.contains(EVIL_SHOWN), "{message}");

    // A path parameter that is not UTF-8 once percent-decoded: a JSON error too, not axum's plain text.
    for uri in ["/v1/resources/%FF%1B", "/v1/leases/%FF%1B", "/v1/pools/%FF%1B", "/v1/commands/%FF%1B"] {
        let (status, kind, body) = gw.answer(get(uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {}", String::from_utf8_lossy(&body));
        safe_error(uri, kind, &body);
    }

    // A path parameter that is UTF-8 but names nothing.
    let (status, kind, body) = gw.answer(get("/v1/pools/x%1B%5B31m%C2%9B%E2%80%AE")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
    safe_error("a pool name", kind, &body);
}

#[tokio::test]
async fn answers_that_carry_data_keep_it_exact() {
    let gw = Gateway::start_with(GatewayConfig::default(), true).await;
    // The agent registers first (an agent command: straight to the log, as an agent does on NATS); the allocation
    // after it in the same partition is decided after it.
    let register = envelope(
        "w1",
        Register {
            settings: Some(AgentSettings::default()),
            ..Register::new(AgentName::new("w1").expect("a name"), Uuid::now_v7())
        },
    );
    let json = codec::command_to_json(&register).expect("JSON");
    let id = register.command_id.to_string();
    gw.log.publish_command(&ingress_subject_of(&register.body), &id, json.into_bytes().into()).await.expect("sent");
    let envelope = allocate();
    let json = codec::command_to_json(&envelope).expect("JSON").into_bytes();
    let (status, _, body) = gw.answer(post("/v1/commands?wait=true", json)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let leasehold_schemas::Command::Allocate(allocate) = &envelope.body else { unreachable!() };
    let (status, _, body) = gw.answer(get(&format!("/v1/resources/w1.{}", allocate.resource))).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let resource: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(resource["attrs"]["note"], EVIL, "{resource}");
    // An id the gateway has never seen stays a plain 404 in JSON.
    let (status, kind, body) = gw.answer(get(&format!("/v1/commands/{}", Uuid::now_v7()))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    safe_error("an unknown command", kind, &body);
}
