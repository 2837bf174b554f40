//! A gateway over a projection of `n` resources of one agent (every tenth with `shard=3`...), built from the
//! domain's own decisions without a log: for the list tests and the paging bench.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use leasehold_domain::driver::Driver;
use leasehold_gateway::{Api, GatewayConfig, Health, router};
use leasehold_log::StoredOutcome;
use leasehold_log::embedded::Embedded;
use leasehold_projector::Projector;
use leasehold_schemas::command::{Allocate, Register};
use leasehold_schemas::ids::{AgentName, Timestamp};
use leasehold_schemas::{Uuid, codec};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The gateway, the references it lists in key order, and what keeps it alive.
pub(crate) struct Listed {
    pub(crate) app: Router,
    pub(crate) refs: Vec<String>,
    pub(crate) shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _projector: Projector,
}

pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, Option<String>, Value) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let link = response.headers().get("link").map(|v| v.to_str().expect("ASCII").to_owned());
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, link, serde_json::from_slice(&body).expect("JSON"))
}

/// `n` resources of agent w1 (attribute `shard` = n mod 10), projected, behind a gateway.
pub(crate) fn listed(n: usize) -> Listed {
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let mut d = Driver::new(0, 1, Timestamp(u64::try_from(start.as_millis()).expect("fits")));
    let w1 = AgentName::new("w1").expect("a name");
    d.submit("w1", Register::new(w1.clone(), Uuid::now_v7()));
    let mut projector = Projector::in_memory(1).expect("a projection");
    let (mut fed, mut refs) = (0, Vec::with_capacity(n));
    for k in 0..n {
        let id = d.new_resource_id();
        refs.push(format!("w1.{id}"));
        let mut allocate = Allocate::new(w1.clone(), id, "dir", 1);
        allocate.attributes.insert("shard".to_owned(), (k % 10).to_string());
        d.submit("op:bulk", allocate);
        if d.outcomes().len() - fed >= 5_000 || k + 1 == n {
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
    refs.sort();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), 1).expect("the embedded log");
    let health = Health::of_roles(&["projector", "gateway"]);
    let shutdown = CancellationToken::new();
    let app = router(Api::new(log, &projector, GatewayConfig::default(), shutdown.clone()), health);
    Listed { app, refs, shutdown, _dir: dir, _projector: projector }
}
