//! Authentication at the gateway (`GatewayConfig::tokens`): without a valid bearer token every `/v1/...` request is
//! refused (401, a JSON error, `WWW-Authenticate: Bearer`) and nothing is published, decided or projected; with one,
//! the command is taken and its outcome's issuer is the token's principal, whatever the body claimed. `/healthz` and
//! `/metrics` need no token. Without tokens (development) the body's issuer stays.
//!
//! The API is built in-process over the embedded log (a worker and a projector run as tasks) and called with
//! `tower::ServiceExt::oneshot`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_gateway::{GatewayConfig, Tokens};
use leasehold_log::Log;
use leasehold_schemas::codec;
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, ResourceId, Timestamp};
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Envelope, Uuid};
use serde_json::Value;
use tokio::time::Instant;
use tower::ServiceExt;

use support::Gateway;

const ALICE: &str = "alice-token-0123456789";
const CI: &str = "ci-token-abcdefghijklmn";
const TOKEN_FILE: &str = "# principal token\nop:alice alice-token-0123456789\nop:ci ci-token-abcdefghijklmn\n";

impl Gateway {
    async fn start(tokens: Option<&str>) -> Gateway {
        let config = GatewayConfig {
            tokens: tokens.map(|text| Arc::new(Tokens::parse(text).expect("a good token file"))),
            ..GatewayConfig::default()
        };
        let gw = Gateway::start_with(config, true).await;
        gw.register_w1(tokens.map(|_| bearer(ALICE)).as_deref()).await;
        gw
    }

    /// Agent w1 registers (an agent command: published straight to the log, as the agent does on NATS), so that
    /// allocations on it are accepted; answers once the gateway lists it.
    async fn register_w1(&self, authorization: Option<&str>) {
        let body = Register::new(AgentName::new("w1").expect("an agent name"), Uuid::now_v7());
        let register = Envelope::new(CommandId::generate(), Issuer::new("w1").expect("an issuer"), now(), body);
        let json = codec::command_to_json(&register).expect("encode");
        let subject = ingress_subject_of(&register.body);
        let id = register.command_id.to_string();
        self.log.publish_command(&subject, &id, json.into_bytes().into()).await.expect("publish to the log");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, _, agents) = self.get("/v1/agents", authorization).await;
            assert_eq!(status, StatusCode::OK, "{agents}");
            if agents.as_array().is_some_and(|a| a.iter().any(|a| a["name"] == "w1")) {
                return;
            }
            assert!(Instant::now() < deadline, "agent w1 did not register: {agents}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn last_seq(&self) -> u64 {
        self.log.last_command_seq().await.expect("read the command log's last sequence")
    }

    /// Sends `method uri` with `authorization` (the whole header value) and `body`: the status, the
    /// `WWW-Authenticate` header and the body as JSON (`Value::Null` when it is not JSON: `/metrics`).
    async fn send(
        &self,
        method: Method,
        uri: &str,
        authorization: Option<&str>,
        body: Option<String>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let body = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(body)
            }
            None => Body::empty(),
        };
        let response = self.app.clone().oneshot(request.body(body).expect("a request")).await.expect("an answer");
        let status = response.status();
        let challenge = response.headers().get(header::WWW_AUTHENTICATE).map(|v| v.to_str().expect("ASCII").to_owned());
        let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
        (status, challenge, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// `POST /v1/commands?wait=true` of `envelope` with `authorization`.
    async fn post(&self, envelope: &Envelope, authorization: Option<&str>) -> (StatusCode, Option<String>, Value) {
        let text = codec::command_to_json(envelope).expect("encode to JSON");
        self.send(Method::POST, "/v1/commands?wait=true&timeout=20s", authorization, Some(text)).await
    }

    /// `GET uri` with `authorization`.
    async fn get(&self, uri: &str, authorization: Option<&str>) -> (StatusCode, Option<String>, Value) {
        self.send(Method::GET, uri, authorization, None).await
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// An `op.allocate` on `w1` claiming to come from `issuer`.
fn allocate(issuer: &str) -> Envelope {
    let body = Allocate {
        agent: AgentName::new("w1").expect("an agent name"),
        resource: ResourceId::generate(),
        kind: "volume".to_owned(),
        capacity: 1,
        attributes: Default::default(),
        parent: None,
        pools: Vec::new(),
        wait: None,
    };
    Envelope::new(CommandId::generate(), Issuer::new(issuer).expect("an issuer"), now(), body)
}

fn now() -> Timestamp {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    Timestamp(u64::try_from(since.as_millis()).expect("fits"))
}

#[track_caller]
fn assert_unauthorized(what: &str, answer: &(StatusCode, Option<String>, Value), says: &str) {
    let (status, challenge, body) = answer;
    assert_eq!(*status, StatusCode::UNAUTHORIZED, "{what}: {body}");
    let challenge = challenge.as_deref().unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"));
    assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
    let message = body["error"].as_str().unwrap_or_else(|| panic!("{what}: no JSON error: {body}"));
    assert!(message.contains(says), "{what}: {message:?} does not say {says:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_valid_token_the_gateway_refuses_and_records_nothing() {
    let gw = Gateway::start(Some(TOKEN_FILE)).await;
    let refused = allocate("op:mallory");
    let id = refused.command_id.to_string();
    let before = gw.last_seq().await;

    let attempts: [(&str, Option<String>, &str); 6] = [
        ("no Authorization", None, "needs `Authorization: Bearer <token>`"),
        ("a wrong token", Some(bearer("alice-token-0123456788")), "not one this gateway knows"),
        ("a token's prefix", Some(bearer("alice-token-012345678")), "not one this gateway knows"),
        ("an empty bearer", Some("Bearer ".to_owned()), "not `Bearer <token>`"),
        ("another scheme", Some(format!("Basic {ALICE}")), "not `Bearer <token>`"),
        ("the token alone", Some(ALICE.to_owned()), "not `Bearer <token>`"),
    ];
    for (what, authorization, says) in &attempts {
        let answer = gw.post(&refused, authorization.as_deref()).await;
        assert_unauthorized(what, &answer, says);
        if authorization.is_some() {
            assert!(answer.1.as_deref().is_some_and(|c| c.contains("invalid_token")), "{what}: {:?}", answer.1);
        }
        assert_eq!(gw.last_seq().await, before, "{what}: something was published");
    }

    // Reads need a token too: names and holders are not public.
    for uri in ["/v1/resources", "/v1/agents", "/v1/leases", "/v1/pools", "/v1/dlq", "/v1/events"] {
        assert_unauthorized(uri, &gw.get(uri, None).await, "needs `Authorization: Bearer <token>`");
        assert_unauthorized(uri, &gw.get(uri, Some(&bearer("nope-nope-nope-nope"))).await, "not one");
    }
    assert_unauthorized("the outcome", &gw.get(&format!("/v1/commands/{id}"), None).await, "Bearer");

    // Probes and scrapers hold no token.
    let (status, _, health) = gw.get("/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(gw.get("/metrics", None).await.0, StatusCode::OK);

    // A good command after them, on the same agent (so the same partition, decided in log order): once it is decided
    // and projected, the refused command would be too, had it been published. It was not.
    let (status, _, good) = gw.post(&allocate("op:test"), Some(&bearer(ALICE))).await;
    assert_eq!(status, StatusCode::OK, "{good}");
    assert_eq!(good["status"], "accepted", "{good}");
    assert_eq!(gw.last_seq().await, before + 1, "only the good command was published");
    let (status, _, answer) = gw.get(&format!("/v1/commands/{id}"), Some(&bearer(ALICE))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the refused command has no outcome: {answer}");
    let (status, _, resources) = gw.get("/v1/resources", Some(&bearer(CI))).await;
    assert_eq!(status, StatusCode::OK, "{resources}");
    assert_eq!(resources.as_array().map(Vec::len), Some(1), "one resource, the good one: {resources}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_outcome_s_issuer_is_its_principal() {
    let gw = Gateway::start(Some(TOKEN_FILE)).await;

    // The body claims someone else: the gateway records the principal of the token.
    let command = allocate("op:mallory");
    let id = command.command_id.to_string();
    let (status, _, answer) = gw.post(&command, Some(&bearer(ALICE))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["status"], "accepted", "{answer}");
    assert_eq!(answer["outcomes"][0]["outcome"]["command"]["issuer"], "op:alice", "{answer}");
    let (status, _, stored) = gw.get(&format!("/v1/commands/{id}"), Some(&bearer(CI))).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(stored["outcomes"][0]["outcome"]["command"]["issuer"], "op:alice", "{stored}");
    let seq = stored["command_seq"].as_u64().expect("a command sequence");
    let record = gw.log.command_at(seq).await.expect("read the log").expect("the command is stored");
    let in_log = codec::decode_command(&record.payload).expect("decode");
    assert_eq!(in_log.issuer.as_str(), "op:alice", "the log holds the principal as the issuer");

    // A retry (same command, same id) is the stored one: a duplicate with its first decision, whoever sends it,
    // and the issuer stays the first principal's (nothing new is recorded).
    let before = gw.last_seq().await;
    let (status, _, again) = gw.post(&command, Some(&bearer(CI))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["outcomes"][0]["outcome"]["command"]["issuer"], "op:alice", "{again}");
    assert_eq!(gw.last_seq().await, before);

    // Another principal's command carries its own principal.
    let (status, _, other) = gw.post(&allocate("op:alice"), Some(&bearer(CI))).await;
    assert_eq!(status, StatusCode::OK, "{other}");
    assert_eq!(other["outcomes"][0]["outcome"]["command"]["issuer"], "op:ci", "{other}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_body_s_issuer_stays() {
    let gw = Gateway::start(None).await;
    let (status, _, answer) = gw.post(&allocate("op:dev"), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcomes"][0]["outcome"]["command"]["issuer"], "op:dev", "{answer}");
    // A token sent to a gateway without tokens is not looked at.
    let (status, _, answer) = gw.get("/v1/resources", Some(&bearer("whatever-it-is-here"))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}
