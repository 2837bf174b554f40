//! `GET /v1/resources` at scale: 100,000 resources of one agent, listed a page at a time by key. A page is read from
//! its key on (a range of the table), so a page deep in the list costs what the first one costs; a page holds the
//! references right after its key, and its `Link` names the page after it. (Building the projection takes most of the
//! test's time in a debug build.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use leasehold_domain::driver::Driver;
use leasehold_gateway::{Api, Failures, GatewayConfig, Health, router};
use leasehold_log::StoredOutcome;
use leasehold_log::embedded::Embedded;
use leasehold_projector::Projector;
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::ids::{AgentName, Timestamp};
use leasehold_schemas::{Uuid, codec};
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const N_RESOURCES: usize = 100_000;

async fn get(app: &Router, uri: &str) -> (StatusCode, Option<String>, Value) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let link = response.headers().get("link").map(|v| v.to_str().expect("ASCII").to_owned());
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, link, serde_json::from_slice(&body).expect("JSON"))
}

/// How long the fastest of three `GET uri` takes.
async fn fastest(app: &Router, uri: &str) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let (status, _, _) = get(app, uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        best = best.min(started.elapsed());
    }
    best
}

#[tokio::test]
async fn a_page_of_a_hundred_thousand_resources_is_read_from_its_key() {
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let mut d = Driver::new(0, 1, Timestamp(u64::try_from(start.as_millis()).expect("fits")));
    let w1 = AgentName::new("w1").expect("a name");
    let register = Register {
        agent: w1.clone(),
        incarnation: Uuid::now_v7(),
        wiped: false,
        settings: None,
        labels: Default::default(),
        capacity: Default::default(),
    };
    d.submit("w1", register);
    let mut projector = Projector::in_memory(1).expect("a projection");
    let (mut fed, mut ids) = (0, Vec::with_capacity(N_RESOURCES));
    for n in 0..N_RESOURCES {
        let id = d.new_resource_id();
        ids.push(id);
        let mut allocate = Allocate::new(w1.clone(), id, "dir", 1);
        allocate.attributes.insert("shard".to_owned(), (n % 10).to_string());
        d.submit("op:bulk", allocate);
        if d.outcomes().len() - fed >= 5_000 || n + 1 == N_RESOURCES {
            let batch: Vec<StoredOutcome> = d.outcomes()[fed..]
                .iter()
                .enumerate()
                .map(|(i, outcome)| StoredOutcome {
                    seq: (fed + i) as u64 + 1,
                    partition: 0,
                    key: outcome.command.key.token(),
                    cmd_id: outcome.command.id.to_string(),
                    cmd_seq: outcome.cmd_seq,
                    part: outcome.part,
                    prev_seq: (fed + i) as u64,
                    payload: Bytes::from(codec::encode_outcome(outcome).expect("encode")),
                })
                .collect();
            projector.apply_batch(&batch).expect("the projector applies the driver's outcomes");
            fed = d.outcomes().len();
        }
    }

    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), 1).expect("the embedded log");
    let health = Health {
        roles: vec!["projector".to_owned(), "gateway".to_owned()],
        registry: Arc::new(Registry::default()),
        projection: None,
        failures: Failures::default(),
        workers: None,
        ready: Default::default(),
    };
    let shutdown = CancellationToken::new();
    let app = router(Api::new(log, &projector, GatewayConfig::default(), shutdown.clone()), health);

    // A page from the middle on: the next 1,000 references after the key, in order; its `Link` names the page after.
    let mut every: Vec<String> = ids.iter().map(|id| format!("w1.{id}")).collect();
    every.sort();
    let middle = &every[N_RESOURCES / 2];
    let (status, link, page) = get(&app, &format!("/v1/resources?limit=1000&after={middle}")).await;
    assert_eq!(status, StatusCode::OK);
    let refs: Vec<&str> =
        page.as_array().expect("an array").iter().map(|r| r["ref"].as_str().expect("a ref")).collect();
    assert_eq!(refs, every[N_RESOURCES / 2 + 1..N_RESOURCES / 2 + 1001].to_vec());
    let link = link.expect("a full page names the next");
    let next = link.split_once('<').and_then(|(_, rest)| rest.split_once('>')).expect("<target>").0;
    assert_eq!(next, format!("/v1/resources?limit=1000&after={}", every[N_RESOURCES / 2 + 1000]));
    let (_, link, last) = get(&app, &format!("/v1/resources?limit=1000&after={}", every[N_RESOURCES - 2])).await;
    assert_eq!((last.as_array().map(Vec::len), link), (Some(1), None), "the last page names no next");

    // An attribute filter on the gateway: every tenth resource, a page of them.
    let (_, link, shard) = get(&app, "/v1/resources?attr=shard%3D3&limit=100").await;
    let shard = shard.as_array().expect("an array");
    assert!(shard.len() == 100 && shard.iter().all(|r| r["attrs"]["shard"] == "3"), "{shard:?}");
    assert!(link.is_some_and(|l| l.contains("attr=shard%3D3&limit=100&after=")), "the filter goes on to the next page");

    // A page deep in the list costs about what the first costs (a scan that skips what comes before its key would take
    // seconds here).
    let first = fastest(&app, "/v1/resources?limit=100").await;
    let deep = fastest(&app, &format!("/v1/resources?limit=100&after={}", every[N_RESOURCES - 1000])).await;
    assert!(
        deep < first * 20 + Duration::from_millis(100),
        "the first page of 100 took {first:?}, one deep in it {deep:?}"
    );
    shutdown.cancel();
}
