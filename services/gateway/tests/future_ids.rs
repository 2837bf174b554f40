//! Ids stamped in the future at the front door: the README says a command whose ids (command, resource, lease,
//! parent) are stamped more than 5 minutes ahead of the log's time is refused "in `decide` and at the gateway". At
//! the gateway it is refused before anything is stored: a 400 that says to fix the issuer's clock.

mod support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasehold_log::Log;
use leasehold_schemas::Envelope;
use leasehold_schemas::codec;
use leasehold_schemas::command::Allocate;
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, ResourceId, Timestamp};
use serde_json::Value;
use tower::ServiceExt;

use support::Gateway;

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

/// An allocation on `w1` whose command id and resource id are stamped at `command_at` and `resource_at` (unix ms).
fn allocation(command_at: u64, resource_at: u64) -> Envelope {
    let body = Allocate::new(AgentName::new("w1").unwrap(), ResourceId::from_parts(resource_at, [7; 10]), "vm", 1);
    let id = CommandId::from_parts(command_at, [8; 10]);
    Envelope::new(id, Issuer::new("op:test").unwrap(), Timestamp(now_ms()), body)
}

async fn post(gw: &Gateway, envelope: &Envelope) -> (StatusCode, Value) {
    let json = codec::command_to_json(envelope).expect("encode");
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/commands")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json))
        .expect("a request");
    let response = gw.app.clone().oneshot(request).await.expect("the router answers");
    let status = response.status();
    let bytes = response.into_body().collect().await.expect("read the body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_stamped_far_in_the_future_are_refused_at_the_gateway() {
    let gw = Gateway::start_with(leasehold_gateway::GatewayConfig::default(), false).await;
    let hour_ahead = now_ms() + 3_600_000;
    for (what, envelope) in [
        ("a command id an hour ahead", allocation(hour_ahead, now_ms())),
        ("a resource id an hour ahead", allocation(now_ms(), hour_ahead)),
    ] {
        let before = gw.log.last_command_seq().await.expect("the command log's end");
        let (status, answer) = post(&gw, &envelope).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(message.contains("clock"), "{what}: {answer}");
        assert_eq!(gw.log.last_command_seq().await.expect("the end"), before, "{what}: nothing is stored");
    }
}
