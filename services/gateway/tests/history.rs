//! `GET /v1/.../history` gives the same answer as `leasehold-replay history`: a story told to a real worker on the
//! embedded log (an agent's partition and a pool's, the sweeper played by hand), projected by a real projector,
//! then each thing's history asked of the gateway (from the projection's timeline index) and of replay (a fold of
//! the whole log), row by row — every field but the state after each step, which only replay's fold gives.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use http_body_util::BodyExt;
use leasehold_gateway::GatewayConfig;
use leasehold_log::Log;
use leasehold_projector::timeline::Row;
use leasehold_replay::history::{self, Target};
use leasehold_schemas::command::{
    Acquire, Allocate, BindClaim, Claim, DefinePool, Free, Register, Release, ReleaseLease, Renew, ReportCreated,
    ReportDestroyed,
};
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, LeaseId, Millis, PoolName, ResourceId, ResourceRef, Source,
};
use leasehold_schemas::outcome::{Effect, FreeCause};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind, PoolValue};
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_key};
use leasehold_schemas::{Command, Envelope, Key, Outcome, Uuid, codec};
use serde_json::Value;
use support::{Gateway, PARTITIONS};
use tower::ServiceExt;

/// How long one command may take to be decided and projected.
const DECIDED_WITHIN: Duration = Duration::from_secs(20);

async fn get(gateway: &Gateway, uri: &str) -> (StatusCode, Option<String>, Value) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = gateway.app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let link = response.headers().get("link").map(|v| v.to_str().expect("ASCII").to_owned());
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, link, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{uri}: not JSON ({e})")))
}

/// Publishes `body` from `issuer` on the log (as an agent, the sweeper or an operator would) and waits until the
/// projection holds its whole outcome; returns its parts.
async fn submit(gateway: &Gateway, issuer: &str, body: impl Into<Command>, correlation: Option<Uuid>) -> Vec<Outcome> {
    let now = leasehold_log::embedded::system_clock()();
    let mut envelope = Envelope::new(CommandId::generate(), Issuer::new(issuer).expect("an issuer"), now, body);
    envelope.correlation_id = correlation;
    let id = envelope.command_id.to_string();
    let payload = codec::encode_command(&envelope).expect("encodes");
    gateway.log.publish_command(&ingress_subject_of(&envelope.body), &id, payload.into()).await.expect("published");
    let deadline = tokio::time::Instant::now() + DECIDED_WITHIN;
    loop {
        let (status, _, answer) = get(gateway, &format!("/v1/commands/{id}")).await;
        let parts: Vec<Outcome> = answer["outcomes"]
            .as_array()
            .map(|parts| {
                parts.iter().map(|p| serde_json::from_value(p["outcome"].clone()).expect("an outcome")).collect()
            })
            .unwrap_or_default();
        if status == StatusCode::OK && parts.last().is_some_and(|o: &Outcome| !o.continues()) {
            return parts;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} was not decided and projected in time: {answer}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The effect named `name` among `outcomes`, with where it is.
fn effect<'o>(outcomes: &'o [Outcome], name: &str) -> (Source, &'o Effect) {
    outcomes
        .iter()
        .find_map(|o| {
            o.positioned_effects()
                .find(|(_, e)| e.name() == name)
                .map(|(position, e)| (Source { partition: o.partition, position }, e))
        })
        .unwrap_or_else(|| panic!("no {name} in {outcomes:?}"))
}

fn accepted(outcomes: &[Outcome]) -> &[Outcome] {
    assert!(outcomes.iter().all(|o| o.rejection().is_none()), "accepted: {outcomes:?}");
    outcomes
}

/// The gateway's rows of `path`, every page of `limit` followed through its `Link: rel="next"`.
async fn paged(gateway: &Gateway, path: &str, limit: usize) -> Vec<Row> {
    let (mut rows, mut uri, mut pages) = (Vec::new(), format!("{path}?limit={limit}"), 0);
    loop {
        let (status, link, page) = get(gateway, &uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {page}");
        let page: Vec<Row> = serde_json::from_value(page).expect("rows");
        assert!(page.len() <= limit, "{uri}: a page of at most {limit}");
        rows.extend(page);
        pages += 1;
        let next = link.as_deref().and_then(|link| {
            link.split(", ")
                .find(|l| l.ends_with("rel=\"next\""))
                .map(|l| l.trim_start_matches('<').split('>').next().expect("a target").to_owned())
        });
        match next {
            Some(next) => uri = next,
            None => break,
        }
        assert!(pages < 100, "{path}: the pages end");
    }
    rows
}

/// `leasehold-replay history` over the whole log, as `history` prints it in JSON, without the state.
async fn replayed(gateway: &Gateway, target: Target) -> Vec<Row> {
    let entries = leasehold_log::export::entries(gateway.log.clone(), None).boxed();
    let rows = history::history(PARTITIONS, entries, &target, |_| {}).await.expect("the log folds");
    rows.into_iter().map(|row| row.step).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_history_is_replays_without_the_state() {
    let gateway = Gateway::start_with(GatewayConfig::default(), true).await;
    let agent = AgentName::new("worker-b").expect("a name");
    let pool = PoolName::new("overlay").expect("a name");
    assert_ne!(
        partition_of_key(&Key::Agent(agent.clone()), PARTITIONS),
        partition_of_key(&Key::Pool(pool.clone()), PARTITIONS),
        "the pool decides in another partition than the agent"
    );
    let subnet = PoolKind::Ipv4 { network: "10.0.0.0".parse().unwrap(), prefix_len: 29, exclude: vec![] };
    let define = DefinePool { pool: pool.clone(), kind: subnet, cooldown: None, orphans: OrphanPolicy::Release };
    accepted(&submit(&gateway, "op:alice", define, None).await);
    let registered = submit(&gateway, "worker-b", Register::new(agent.clone(), Uuid::from_u128(7)), None).await;
    let (Source { position: epoch, .. }, _) = effect(accepted(&registered), "agent-registered");
    let now = leasehold_log::embedded::system_clock()().0;

    // R1: a claim on the pool, three leases (released, renewed, refused, broken), released and destroyed, its
    // address freed.
    let r1 = ResourceId::from_parts(now, [1; 10]);
    let mut allocate = Allocate::new(agent.clone(), r1, "container", 2);
    allocate.pools = vec![pool.clone()];
    let correlation = Uuid::now_v7();
    let allocated = submit(&gateway, "op:alice", allocate, Some(correlation)).await;
    let (wanted, _) = effect(accepted(&allocated), "claim-wanted");
    let holder = ResourceRef::new(agent.clone(), r1);
    let claim = Claim { pool: pool.clone(), holder: holder.clone(), source: wanted };
    let granted = submit(&gateway, "sweeper-1", claim, None).await;
    let (grant, found) = effect(accepted(&granted), "claim-granted");
    let Effect::ClaimGranted { value, .. } = found else { unreachable!("named claim-granted") };
    let value: PoolValue = *value;
    let bind = BindClaim {
        holder: holder.clone(),
        pool: pool.clone(),
        value,
        token: grant.position,
        source: grant,
        wanted,
        definition: None,
        orphans: OrphanPolicy::Release,
    };
    accepted(&submit(&gateway, "sweeper-1", bind, None).await);
    let created = ReportCreated { agent: agent.clone(), epoch, obs: 1, resource: r1, native_id: None };
    accepted(&submit(&gateway, "worker-b", created, None).await);
    let acquire = |lease: LeaseId, resource: ResourceId| Acquire {
        agent: agent.clone(),
        resource,
        lease,
        holder: "build-42".into(),
        ttl: Some(Millis::from_secs(600)),
        wait_timeout: None,
        priority: 0,
    };
    let l1 = LeaseId::from_parts(now, [2; 10]);
    let got = submit(&gateway, "op:alice", acquire(l1, r1), None).await;
    let (Source { position: token, .. }, _) = effect(accepted(&got), "lease-granted");
    for _ in 0..3 {
        let renew = Renew { agent: agent.clone(), lease: l1, token, ttl: None };
        accepted(&submit(&gateway, "op:alice", renew, None).await);
    }
    let release_lease = ReleaseLease { agent: agent.clone(), lease: l1, token: Some(token) };
    accepted(&submit(&gateway, "op:alice", release_lease, None).await);
    let late = submit(&gateway, "op:alice", Renew { agent: agent.clone(), lease: l1, token, ttl: None }, None).await;
    assert!(late[0].rejection().is_some(), "a released lease is not renewed: {late:?}");
    let l2 = LeaseId::from_parts(now, [3; 10]);
    accepted(&submit(&gateway, "op:alice", acquire(l2, r1), None).await);

    // R2: allocated, created and leased; nothing else.
    let r2 = ResourceId::from_parts(now, [4; 10]);
    accepted(&submit(&gateway, "op:bob", Allocate::new(agent.clone(), r2, "volume", 1), None).await);
    let created = ReportCreated { agent: agent.clone(), epoch, obs: 2, resource: r2, native_id: Some("v-2".into()) };
    accepted(&submit(&gateway, "worker-b", created, None).await);
    let l3 = LeaseId::from_parts(now, [5; 10]);
    accepted(&submit(&gateway, "op:bob", acquire(l3, r2), None).await);

    let release = Release { agent: agent.clone(), resource: r1, reason: Some("job done".into()) };
    let releasing = submit(&gateway, "op:alice", release, None).await;
    let (ordered, _) = effect(accepted(&releasing), "resource-releasing");
    effect(&releasing, "lease-broken");
    let destroyed = ReportDestroyed { agent: agent.clone(), epoch, obs: 3, resource: r1, ordered: ordered.position };
    let destroyed = submit(&gateway, "worker-b", destroyed, None).await;
    let (releasable, _) = effect(accepted(&destroyed), "claim-releasable");
    let free = Free {
        pool: pool.clone(),
        holder: holder.clone(),
        token: Some(grant.position),
        source: releasable,
        cause: FreeCause::Released {},
    };
    effect(accepted(&submit(&gateway, "sweeper-1", free, None).await), "claim-freed");
    let refused = submit(&gateway, "op:bob", acquire(LeaseId::from_parts(now, [6; 10]), r1), None).await;
    assert!(refused[0].rejection().is_some(), "a destroyed resource takes no lease: {refused:?}");

    // Each thing's history, from the gateway (in pages) and from replay: the same rows.
    let r1_ref = format!("{agent}.{r1}");
    let cases = [
        (format!("/v1/resources/{r1_ref}/history"), Target::Resource(r1), "R1"),
        (format!("/v1/resources/{agent}.{r2}/history"), Target::Resource(r2), "R2"),
        (format!("/v1/leases/{agent}.{l1}/history"), Target::Lease(l1), "L1"),
        (format!("/v1/leases/{agent}.{l2}/history"), Target::Lease(l2), "L2"),
        (format!("/v1/pools/{pool}/{value}/history"), Target::Value(pool.clone(), value), "the address"),
    ];
    let mut answers = Vec::new();
    for (path, target, what) in cases {
        let ours = paged(&gateway, &path, 3).await;
        let theirs = replayed(&gateway, target).await;
        assert!(!ours.is_empty(), "{what}: {path} has steps");
        assert_eq!(ours, theirs, "{what}: the gateway's history is replay's");
        answers.push(ours);
    }
    let commands = |rows: &[Row]| rows.iter().map(|r| r.command.clone()).collect::<Vec<_>>();
    let r1_rows = &answers[0];
    assert_eq!(
        commands(r1_rows),
        [
            "op.allocate",
            "sys.claim",
            "sys.bind-claim",
            "agent.report-created",
            "op.acquire",
            "op.renew",
            "op.renew",
            "op.renew",
            "op.release-lease",
            "op.renew",
            "op.acquire",
            "op.release",
            "agent.report-destroyed",
            "sys.free",
            "op.acquire",
        ],
        "R1's whole story, the pool's steps and its leases' among its own"
    );
    assert_eq!(r1_rows[0].correlation_id, Some(correlation.to_string()), "the allocate's correlation id");
    assert_eq!(r1_rows[9].outcome, "rejected", "the renew of a released lease: {:?}", r1_rows[9]);
    assert!(r1_rows[9].effects.is_empty() && r1_rows[9].rejection.is_some());
    assert_eq!((r1_rows[1].partition, r1_rows[13].partition), (grant.partition, grant.partition), "the pool's");
    assert_eq!(r1_rows[14].outcome, "rejected", "the acquire after the destroy names R1 in its body");
    assert_eq!(
        commands(&answers[2]),
        ["op.acquire", "op.renew", "op.renew", "op.renew", "op.release-lease", "op.renew"]
    );
    assert_eq!(commands(&answers[3]), ["op.acquire", "op.release"], "L2 granted, then broken by the release");
    assert_eq!(commands(&answers[4]), ["sys.claim", "sys.bind-claim", "agent.report-destroyed", "sys.free"]);

    // Older pages: from the newest, `before=` the first step of each page.
    let (status, link, page) =
        get(&gateway, &format!("/v1/resources/{r1_ref}/history?before=18446744073709551615&limit=4")).await;
    assert_eq!(status, StatusCode::OK);
    let page: Vec<Row> = serde_json::from_value(page).expect("rows");
    assert_eq!(page, r1_rows[r1_rows.len() - 4..], "the newest four");
    let link = link.expect("a link to the older steps");
    assert!(link.contains(&format!("before={}&limit=4>; rel=\"prev\"", page[0].seq)), "{link}");
    assert!(!link.contains("rel=\"next\""), "nothing newer: {link}");

    // Before the first sequence there is nothing, and nothing to link to (it once panicked the handler).
    let (status, link, rows) = get(&gateway, &format!("/v1/resources/{r1_ref}/history?before=0")).await;
    assert_eq!((status, link, rows), (StatusCode::OK, None, Value::Array(vec![])));

    // A thing nothing concerns has no step; a bad reference, identifier or query is a 400.
    let (status, _, rows) = get(&gateway, &format!("/v1/resources/{agent}.{}/history", ResourceId::generate())).await;
    assert_eq!((status, rows), (StatusCode::OK, Value::Array(vec![])));
    for bad in [
        "/v1/resources/not-a-ref/history".to_owned(),
        format!("/v1/leases/{agent}/history"),
        format!("/v1/pools/{pool}/not-an-ip/history"),
        format!("/v1/resources/{r1_ref}/history?after=1&before=9"),
        format!("/v1/resources/{r1_ref}/history?limit=0"),
        format!("/v1/resources/{r1_ref}/history?color=red"),
    ] {
        let (status, _, answer) = get(&gateway, &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "{bad}: {answer}");
    }
}
