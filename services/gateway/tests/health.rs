//! `/healthz` says when something in the process stopped: a role or agent (pushed by `serve`), or a partition its
//! writers stopped on record, here one that met a command of a schema being rolled out (a newer worker must
//! decide it).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold_gateway::{Failures, Health, metrics_only};
use leasehold_log::Log;
use leasehold_log::embedded::Embedded;
use leasehold_schemas::codec;
use leasehold_schemas::command::Heartbeat;
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Position, Timestamp};
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Envelope, SCHEMA_VERSION};
use leasehold_worker::{WorkerConfig, WorkerMetrics};
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

async fn healthz(health: &Health) -> (StatusCode, Value) {
    let request = Request::builder().uri("/healthz").body(Body::empty()).expect("a request");
    let response = metrics_only(health.clone()).oneshot(request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, serde_json::from_slice(&body).expect("JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_names_a_stopped_role_and_a_stopped_partition() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), 2).expect("the embedded log");
    let mut registry = Registry::default();
    let metrics = WorkerMetrics::register(&mut registry);
    let health = Health {
        roles: vec!["worker".to_owned()],
        registry: Arc::new(registry),
        projection: None,
        failures: Failures::default(),
        workers: Some(metrics.clone()),
    };
    let (status, answer) = healthz(&health).await;
    assert_eq!((status, answer["status"].as_str()), (StatusCode::OK, Some("ok")), "{answer}");

    // A command of the schema being rolled out stops its partition, on record.
    let mut config = WorkerConfig::new("w");
    config.writer.rolling_out_schema = Some(SCHEMA_VERSION + 1);
    config.writer.metrics = Some(metrics.clone());
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let heartbeat = Envelope::new(
        CommandId::generate(),
        Issuer::new("w1").expect("an issuer"),
        Timestamp(1),
        Heartbeat { agent: AgentName::new("w1").expect("a name"), epoch: Position(1) },
    );
    let newer = codec::command_to_json(&heartbeat).expect("JSON").replacen(
        &format!("\"schema_version\":{SCHEMA_VERSION}"),
        &format!("\"schema_version\":{}", SCHEMA_VERSION + 1),
        1,
    );
    assert!(newer.contains(&format!("\"schema_version\":{}", SCHEMA_VERSION + 1)), "{newer}");
    let subject = ingress_subject_of(&heartbeat.body);
    log.publish_command(&subject, &heartbeat.command_id.to_string(), newer.into_bytes().into()).await.expect("publish");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metrics.stopped().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the partition never stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    health.failures.push("agent w9 stopped: its driver cannot take the machine's resources");
    let (status, answer) = healthz(&health).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["status"], "failing");
    let failures = answer["failures"].to_string();
    assert!(
        failures.contains("agent w9 stopped") && failures.contains("stopped") && failures.contains("partition"),
        "{failures}"
    );
    assert!(failures.contains("newer") || failures.contains("schema"), "the reason is named: {failures}");

    shutdown.cancel();
    let report = worker.await.expect("the worker ends");
    assert_eq!(report.stopped.len(), 1, "{:?}", report.stopped);
}
