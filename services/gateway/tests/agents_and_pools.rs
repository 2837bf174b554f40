//! What the gateway reads of agents and pools beyond their records: `/metrics` gauges per agent (quarantined
//! handles, the driver up or not), `pool ls`'s cooling count as of the gateway's own clock, and a `/healthz` that
//! names an agent stopped for its machine's disk without failing.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use leasehold_domain::driver::Driver;
use leasehold_gateway::{Api, Failures, GatewayConfig, Health, ProjectionMetrics, metrics_only, router};
use leasehold_log::StoredOutcome;
use leasehold_log::embedded::Embedded;
use leasehold_projector::Projector;
use leasehold_schemas::command::{
    Allocate, Claim, DefinePool, DriverStatus, Free, GarbageReport, Register, ReportCreated, SyncReport,
};
use leasehold_schemas::ids::{AgentName, Millis, PoolName, Position, ResourceRef, Source, Timestamp};
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::{Outcome, Uuid, codec};
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Folds the driver's outcomes (partition 0 of 1) into `projector`, from the first not applied yet.
fn feed(projector: &mut Projector, outcomes: &[Outcome]) {
    let from = projector.applied() as usize;
    let batch: Vec<StoredOutcome> = outcomes
        .iter()
        .enumerate()
        .skip(from)
        .map(|(i, outcome)| StoredOutcome {
            seq: i as u64 + 1,
            partition: 0,
            key: outcome.command.key.token(),
            cmd_id: outcome.command.id.to_string(),
            cmd_seq: outcome.cmd_seq,
            part: outcome.part,
            prev_seq: i as u64,
            payload: Bytes::from(codec::encode_outcome(outcome).expect("encode")),
        })
        .collect();
    projector.apply_batch(&batch).expect("the projector applies the driver's outcomes");
}

fn accepted(outcome: Outcome) -> Outcome {
    assert!(outcome.rejection().is_none(), "{outcome:?}");
    outcome
}

fn position_of(outcome: &Outcome, name: &str) -> Position {
    outcome.positioned_effects().find(|(_, e)| e.name() == name).map(|(p, _)| p).unwrap_or_else(|| panic!("{name}"))
}

fn wall_clock() -> Timestamp {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    Timestamp(u64::try_from(now.as_millis()).expect("fits"))
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// The API and `/metrics` over `projector` (the log under it is empty: these requests read the projection only).
fn app(dir: &tempfile::TempDir, projector: &Projector, shutdown: &CancellationToken) -> Router {
    let log = Embedded::open(dir.path(), 1).expect("the embedded log");
    let mut registry = Registry::default();
    let projection = ProjectionMetrics::register(&mut registry, projector.reader());
    let health = Health {
        roles: vec!["projector".to_owned(), "gateway".to_owned()],
        registry: Arc::new(registry),
        projection: Some(projection),
        failures: Failures::default(),
        workers: None,
        ready: Default::default(),
    };
    router(Api::new(log, projector, GatewayConfig::default(), shutdown.clone()), health)
}

/// An agent with a lost resource whose handle came back, and whose driver then could not list; another agent with
/// nothing to say: `/metrics` reads both from the agents' records.
#[tokio::test]
async fn metrics_show_quarantined_handles_and_whether_each_driver_is_up() {
    let mut d = Driver::new(0, 1, wall_clock());
    let (w1, w2) = (AgentName::new("w1").expect("a name"), AgentName::new("w2").expect("a name"));
    let mut epochs = Vec::new();
    for agent in [&w1, &w2] {
        let register = Register::new(agent.clone(), Uuid::now_v7());
        epochs.push(position_of(&accepted(d.submit(agent.as_str(), register)), "agent-registered"));
    }
    let w1_epoch = epochs[0];
    let id = d.new_resource_id();
    accepted(d.submit("op:alice", Allocate::new(w1.clone(), id, "volume", 1)));
    let created = ReportCreated { agent: w1.clone(), epoch: w1_epoch, obs: 1, resource: id, native_id: None };
    accepted(d.submit("w1", created));
    let mut report = SyncReport::new(w1.clone(), w1_epoch, 2, d.state().last_position());
    report.missing = vec![id];
    accepted(d.submit("w1", report));
    let watermark = d.state().last_position();
    let garbage =
        GarbageReport { agent: w1.clone(), epoch: w1_epoch, obs: 3, watermark, handles: vec![id], dry_run: false };
    position_of(&accepted(d.submit("w1", garbage)), "handle-reappeared");
    let detail = "the root /srv/w1 is not mounted".to_owned();
    accepted(d.submit("w1", DriverStatus { agent: w1.clone(), epoch: w1_epoch, obs: 4, available: false, detail }));

    let mut projector = Projector::in_memory(1).expect("a projection");
    feed(&mut projector, d.outcomes());
    let (dir, shutdown) = (tempfile::tempdir().expect("a temporary directory"), CancellationToken::new());
    let app = app(&dir, &projector, &shutdown);
    let (status, text) = get(&app, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    for line in [
        r#"leasehold_quarantined_handles{agent="w1"} 1"#,
        r#"leasehold_quarantined_handles{agent="w2"} 0"#,
        r#"leasehold_agent_driver_up{agent="w1"} 0"#,
        r#"leasehold_agent_driver_up{agent="w2"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "/metrics lacks {line:?}:\n{text}");
    }
    let (status, agents) = get(&app, "/v1/agents").await;
    assert_eq!(status, StatusCode::OK);
    let agents: Value = serde_json::from_str(&agents).expect("JSON");
    assert_eq!(agents[0]["driver"]["available"], false, "{agents:#}");
    assert_eq!(agents[0]["driver"]["detail"], "the root /srv/w1 is not mounted", "{agents:#}");
    let (_, resource) = get(&app, &format!("/v1/resources/w1.{id}")).await;
    let resource: Value = serde_json::from_str(&resource).expect("JSON");
    assert_eq!(resource["state"], "lost");
    assert!(resource["quarantined"]["destroy_ordered"].is_null(), "{resource:#}");
    shutdown.cancel();
}

/// A pool's record changes only with the pool's outcomes; the gateway answers its cooling count as of its own clock,
/// so an identifier whose cool-down ended since is not counted.
#[tokio::test]
async fn pools_count_as_cooling_what_has_not_cooled_down_by_the_gateways_clock() {
    let now = wall_clock();
    let mut d = Driver::new(0, 1, Timestamp(now.0 - Millis::from_mins(150).0));
    let pool = PoolName::new("ips").expect("a name");
    let define = DefinePool {
        pool: pool.clone(),
        kind: PoolKind::Slots { count: 4 },
        cooldown: Some(Millis::from_hours(2)),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    accepted(d.submit("op:alice", define));
    let agent = AgentName::new("w1").expect("a name");
    for n in 1..=2 {
        // Freed 2h30 ago (cooled down 30 minutes ago), then 1h ago (cooling for another hour).
        if n == 2 {
            d.set_clock(Timestamp(now.0 - Millis::from_hours(1).0));
        }
        let holder = ResourceRef::new(agent.clone(), d.new_resource_id());
        let source = Source { partition: 0, position: Position(n) };
        let granted = accepted(d.submit("sweeper-1", Claim { pool: pool.clone(), holder: holder.clone(), source }));
        let token = position_of(&granted, "claim-granted");
        accepted(d.submit(
            "sweeper-1",
            Free {
                pool: pool.clone(),
                holder,
                token: Some(token),
                source,
                cause: leasehold_schemas::outcome::FreeCause::Released {},
            },
        ));
    }
    let mut projector = Projector::in_memory(1).expect("a projection");
    feed(&mut projector, d.outcomes());
    assert_eq!(projector.reader().pools().expect("pools")[0].cooling, 2, "both cooling as of the last free");
    let (dir, shutdown) = (tempfile::tempdir().expect("a temporary directory"), CancellationToken::new());
    let (status, pools) = get(&app(&dir, &projector, &shutdown), "/v1/pools").await;
    assert_eq!(status, StatusCode::OK, "{pools}");
    let pools: Value = serde_json::from_str(&pools).expect("JSON");
    assert_eq!(pools[0]["cooling"], 1, "{pools:#}");
    assert_eq!(pools[0]["cooling_until"].as_array().map(Vec::len), Some(1), "{pools:#}");
    shutdown.cancel();
}

/// An in-process agent stopped because its driver cannot reach its machine's resources is named on `/healthz`, which
/// still answers 200: the process serves everything else. Anything that stopped otherwise still fails it.
#[tokio::test]
async fn healthz_names_an_agent_stopped_for_its_disk_without_failing() {
    let health = Health {
        roles: vec!["worker".to_owned()],
        registry: Arc::new(Registry::default()),
        projection: None,
        failures: Failures::default(),
        workers: None,
        ready: Default::default(),
    };
    let app = metrics_only(health.clone());
    health.failures.push_degraded("agent w9 stopped: its driver cannot take the machine's resources: no root");
    let (status, body) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["status"], "ok");
    assert!(body["degraded"][0].as_str().is_some_and(|d| d.contains("agent w9")), "{body:#}");

    health.failures.push("the projector stopped: the chain is broken");
    let (status, body) = get(&app, "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert!(body["failures"][0].as_str().is_some_and(|f| f.contains("projector")), "{body:#}");
    assert!(body["degraded"][0].as_str().is_some_and(|d| d.contains("agent w9")), "{body:#}");
}
