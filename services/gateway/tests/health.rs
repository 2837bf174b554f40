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
        ready: Default::default(),
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
        &format!("\"schema_version\":{}", heartbeat.schema_version),
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

async fn get_text(app: &axum::Router, uri: &str) -> (StatusCode, String) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// `/metrics` counts what the writers and the projection of the process did: decisions by type and result, the
/// decide latency, dead letters, resources by state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_decisions_dead_letters_and_resources_by_state() {
    use leasehold_gateway::{Api, GatewayConfig, ProjectionMetrics, router};
    use leasehold_projector::Projector;
    use leasehold_schemas::command::{Allocate, Register};
    use leasehold_schemas::ids::ResourceId;
    use leasehold_schemas::settings::AgentSettings;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(&dir.path().join("log"), 2).expect("the embedded log");
    let mut projector = Projector::open(&dir.path().join("projection"), 2).expect("the projection");
    let mut registry = Registry::default();
    let workers = WorkerMetrics::register(&mut registry);
    let projection = ProjectionMetrics::register(&mut registry, projector.reader());
    let shutdown = CancellationToken::new();
    let api = Api::new(log.clone(), &projector, GatewayConfig::default(), shutdown.clone());
    let health = Health {
        roles: vec!["worker".to_owned(), "projector".to_owned(), "gateway".to_owned()],
        registry: Arc::new(registry),
        projection: Some(projection),
        failures: Failures::default(),
        workers: Some(workers.clone()),
        ready: Default::default(),
    };
    let app = router(api, health);
    let mut config = WorkerConfig::new("w");
    config.writer.metrics = Some(workers);
    let worker = tokio::spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
    let projecting = {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tokio::spawn(async move { projector.run(&log, &shutdown).await })
    };

    let w1 = AgentName::new("w1").expect("a name");
    let envelope = |issuer: &str, body: leasehold_schemas::Command| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
        let now = Timestamp(u64::try_from(now.as_millis()).expect("fits"));
        Envelope::new(CommandId::generate(), Issuer::new(issuer).expect("an issuer"), now, body)
    };
    let register = Register {
        settings: Some(AgentSettings::default()),
        ..Register::new(w1.clone(), leasehold_schemas::Uuid::now_v7())
    };
    let register = envelope("w1", register.into());
    let payload = codec::encode_command(&register).expect("encode");
    log.publish_command(&ingress_subject_of(&register.body), &register.command_id.to_string(), payload.into())
        .await
        .expect("publish");
    // Through the gateway: one allocation accepted, one rejected (an agent that never registered).
    let mut accepted = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !accepted {
        assert!(tokio::time::Instant::now() < deadline, "w1 never registered");
        let allocate = envelope("op", Allocate::new(w1.clone(), ResourceId::generate(), "volume", 1).into());
        let request = Request::builder()
            .method("POST")
            .uri("/v1/commands?wait=true&timeout=20s")
            .header("content-type", "application/json")
            .body(Body::from(codec::command_to_json(&allocate).expect("JSON")))
            .expect("a request");
        let response = app.clone().oneshot(request).await.expect("an answer");
        let body = response.into_body().collect().await.expect("the body").to_bytes();
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        accepted = answer["status"] == "accepted";
    }
    let ghost = AgentName::new("ghost").expect("a name");
    let rejected = envelope("op", Allocate::new(ghost, ResourceId::generate(), "volume", 1).into());
    let request = Request::builder()
        .method("POST")
        .uri("/v1/commands?wait=true&timeout=20s")
        .header("content-type", "application/json")
        .body(Body::from(codec::command_to_json(&rejected).expect("JSON")))
        .expect("a request");
    app.clone().oneshot(request).await.expect("an answer");
    // A payload that is no command goes to the dead letters.
    log.publish_command("lh.in.op.w1._", "garbage", bytes::Bytes::from_static(b"\x07garbage")).await.expect("publish");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (status, text) = get_text(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        if text.contains("leasehold_dead_letters_total 1") {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "the dead letter was never counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let accepted_allocations = text
        .lines()
        .find(|l| l.starts_with(r#"leasehold_commands_decided_total{type="op.allocate",result="accepted"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no accepted allocations counted:\n{text}"));
    assert!(accepted_allocations >= 1, "{text}");
    for line in [
        r#"leasehold_commands_decided_total{type="agent.register",result="accepted"} 1"#,
        r#"leasehold_commands_decided_total{type="op.allocate",result="rejected"}"#,
        r#"leasehold_resources{state="pending"}"#,
        "leasehold_decide_seconds_count",
        "leasehold_projection_applied_seq",
    ] {
        assert!(text.contains(line), "/metrics lacks {line:?}:\n{text}");
    }
    let pending = text
        .lines()
        .find(|l| l.starts_with(r#"leasehold_resources{state="pending"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(pending, Some(accepted_allocations), "every accepted allocation is pending (no agent runs):\n{text}");

    shutdown.cancel();
    assert!(worker.await.expect("the worker ends").stopped.is_empty());
    projecting.await.expect("the projector ends").expect("the projector stops cleanly");
}

/// Until the gateway is ready, a command is refused with 503 and `Retry-After`, and nothing is published (it could
/// overtake what the process stores first); `/readyz` says what each role waits on, while `/healthz` (liveness) stays
/// 200. Once ready, commands go through and `/readyz` answers 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_for_readiness_and_readyz_says_what_each_role_waits_on() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use leasehold_gateway::{Api, GatewayConfig, Readiness, ReadyCheck, router};
    use leasehold_projector::Projector;
    use leasehold_schemas::command::Allocate;
    use leasehold_schemas::ids::ResourceId;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(&dir.path().join("log"), 2).expect("the embedded log");
    let projector = Projector::open(&dir.path().join("projection"), 2).expect("the projection");
    let ready = Arc::new(AtomicBool::new(false));
    let gateway = {
        let ready = ready.clone();
        ReadyCheck::new(move || (!ready.load(Ordering::SeqCst)).then(|| "storing the policy commands".to_owned()))
    };
    let mut readiness = Readiness::default();
    readiness.add("worker", ReadyCheck::ready());
    readiness.add("gateway", gateway.clone());
    let config = GatewayConfig { ready: gateway, ..GatewayConfig::default() };
    let api = Api::new(log.clone(), &projector, config, CancellationToken::new());
    let health = Health {
        roles: vec!["worker".to_owned(), "projector".to_owned(), "gateway".to_owned()],
        registry: Arc::new(Registry::default()),
        projection: None,
        failures: Failures::default(),
        workers: None,
        ready: readiness,
    };
    let app = router(api, health);
    let allocate = Envelope::new(
        CommandId::generate(),
        Issuer::new("op").expect("an issuer"),
        Timestamp(1),
        Allocate::new(AgentName::new("w1").expect("a name"), ResourceId::generate(), "volume", 1),
    );
    let post = |path: &str, body: String| {
        Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("a request")
    };
    let one = codec::command_to_json(&allocate).expect("JSON");
    let batch = format!("[{one}]");

    for (path, body) in [("/v1/commands", one.clone()), ("/v1/commands/batch", batch.clone())] {
        let response = app.clone().oneshot(post(path, body)).await.expect("an answer");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(response.headers().get("retry-after").map(|v| v.as_bytes()), Some(&b"1"[..]), "{path}");
        let body = response.into_body().collect().await.expect("the body").to_bytes();
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains("does not take commands yet (storing the policy commands)"), "{error}");
        assert!(error.contains("nothing was stored"), "{error}");
    }
    assert_eq!(log.last_command_seq().await.expect("the log"), 0, "nothing was published");
    let (status, readyz) = get_text(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{readyz}");
    let readyz: Value = serde_json::from_str(&readyz).expect("JSON");
    assert_eq!(readyz["status"], "waiting");
    assert_eq!(readyz["waiting"], serde_json::json!({"gateway": "storing the policy commands"}), "{readyz}");
    let (status, healthz) = get_text(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "liveness does not wait for readiness: {healthz}");

    ready.store(true, Ordering::SeqCst);
    let (status, readyz) = get_text(&app, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{readyz}");
    assert!(readyz.contains(r#""status":"ready""#), "{readyz}");
    let response = app.clone().oneshot(post("/v1/commands", one)).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let response = app.clone().oneshot(post("/v1/commands/batch", batch)).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(log.last_command_seq().await.expect("the log"), 1, "stored once (the batch sent it again)");
}
