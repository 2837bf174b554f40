//! A gateway over an embedded log and its projection, holding a resource in every state, made by the domain's own
//! decisions (the `Driver`) and appended to the log as a writer would: for the tests of the `/ui` pages.
//!
//! Text from outside — a lease's holder, an attribute value, a pause's and a release's reason, a driver's error, a
//! dead letter's reason — is [`EVIL`]: markup and a right-to-left override, which the pages must show as text.

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use leasehold_domain::driver::Driver;
use leasehold_gateway::{Api, GatewayConfig, Health, router};
use leasehold_log::embedded::Embedded;
use leasehold_log::{Appended, DeadLetter, LetterId, Log, OutcomeRecord};
use leasehold_projector::Projector;
use leasehold_schemas::command::{
    Acquire, Allocate, DefinePool, FailureKind, HandleDigest, MarkGone, Pause, Register, Release, ReportCreated,
    ReportDestroyed, ReportFailure, ReportFailureByOperator, SyncReport,
};
use leasehold_schemas::ids::{AgentName, LeaseId, Millis, PoolName, Position, ResourceId, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Command, Outcome, Uuid, codec};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Markup and a right-to-left override: what a producer may write, and no page may act on.
pub(crate) const EVIL: &str = "<script>alert(1)</script>\u{202e}evil";

/// [`EVIL`] as escaped text.
pub(crate) const EVIL_ESCAPED: &str = "&lt;script&gt;alert(1)&lt;/script&gt;\u{202e}evil";

/// What the seeded gateway holds, by name.
pub(crate) struct Seeded {
    pub(crate) app: Router,
    /// A resource in each state (`pending`, `active`, ... `failed`), by state.
    pub(crate) by_state: BTreeMap<&'static str, String>,
    /// A pending resource waiting for an identifier of pool `ips`.
    pub(crate) pending_on_pool: String,
    /// Destroyed three hours ago: left out of lists without `all`.
    pub(crate) ended_long_ago: String,
    /// The active resource's leases: held (by [`EVIL`]) and queued behind it.
    pub(crate) held_lease: String,
    pub(crate) queued_lease: String,
    /// A lease broken when the releasing resource was released.
    pub(crate) broken_lease: String,
    /// The commands that allocated the active resource and acquired its held lease; one rejected; one
    /// dead-lettered (for [`EVIL`]).
    pub(crate) allocate_command: String,
    pub(crate) acquire_command: String,
    pub(crate) rejected_command: String,
    pub(crate) dead_command: String,
    pub(crate) shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _projector: Projector,
}

/// An answer's status, headers and body as text.
pub(crate) async fn get(app: &Router, uri: &str) -> (StatusCode, HeaderMap, String) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let (status, headers) = (response.status(), response.headers().clone());
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// The page at `uri`, which must answer 200.
pub(crate) async fn page(app: &Router, uri: &str) -> String {
    let (status, _, body) = get(app, uri).await;
    assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    body
}

fn now_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    u64::try_from(now.as_millis()).expect("fits")
}

fn name(text: &str) -> AgentName {
    AgentName::new(text).expect("an agent name")
}

/// The domain's partition 0 of 1, and what the agents have said so far (their observation numbers).
struct World {
    d: Driver,
    obs: BTreeMap<AgentName, u64>,
}

impl World {
    fn submit(&mut self, issuer: &str, body: impl Into<Command>) -> Outcome {
        let outcome = self.d.submit(issuer, body);
        assert!(outcome.rejection().is_none(), "{issuer}: {:?}", outcome.rejection());
        outcome
    }

    fn op(&mut self, body: impl Into<Command>) -> Outcome {
        self.submit("op:alice", body)
    }

    fn epoch(&self, agent: &AgentName) -> Position {
        self.d.state().agent(agent).expect("registered").epoch
    }

    fn next_obs(&mut self, agent: &AgentName) -> u64 {
        let n = self.obs.entry(agent.clone()).or_insert(0);
        *n += 1;
        *n
    }

    fn register(&mut self, agent: &AgentName, settings: Option<AgentSettings>) {
        let mut register = Register::new(agent.clone(), Uuid::now_v7());
        register.settings = settings;
        self.submit(agent.as_str(), register);
    }

    fn allocate(&mut self, agent: &AgentName, edit: impl FnOnce(&mut Allocate)) -> (ResourceId, Outcome) {
        let id = self.d.new_resource_id();
        let mut allocate = Allocate::new(agent.clone(), id, "container", 1);
        edit(&mut allocate);
        (id, self.op(allocate))
    }

    fn created(&mut self, agent: &AgentName, resource: ResourceId) {
        let (epoch, obs) = (self.epoch(agent), self.next_obs(agent));
        let native_id = Some(format!("native-{resource}"));
        self.submit(agent.as_str(), ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id });
    }

    fn active(&mut self, agent: &AgentName) -> ResourceId {
        let (id, _) = self.allocate(agent, |_| {});
        self.created(agent, id);
        id
    }

    fn acquire(&mut self, agent: &AgentName, resource: ResourceId, holder: &str) -> (LeaseId, Outcome) {
        let lease = self.d.new_lease_id();
        let acquire = Acquire {
            agent: agent.clone(),
            resource,
            lease,
            holder: holder.to_owned(),
            ttl: Some(Millis::from_mins(30)),
            wait_timeout: Some(Millis::from_mins(30)),
            priority: 0,
        };
        (lease, self.op(acquire))
    }

    /// Releases `resource` (for [`EVIL`]'s reason): the position of its `resource-releasing`.
    fn release(&mut self, agent: &AgentName, resource: ResourceId) -> Position {
        let outcome = self.op(Release { agent: agent.clone(), resource, reason: Some(EVIL.to_owned()) });
        outcome
            .positioned_effects()
            .find_map(|(position, e)| matches!(e, Effect::ResourceReleasing { .. }).then_some(position))
            .expect("a release orders the destroy")
    }

    fn destroyed(&mut self, agent: &AgentName, resource: ResourceId) {
        let ordered = self.release(agent, resource);
        let (epoch, obs) = (self.epoch(agent), self.next_obs(agent));
        self.submit(agent.as_str(), ReportDestroyed { agent: agent.clone(), epoch, obs, resource, ordered });
    }
}

/// The seeded gateway (see the module's documentation).
pub(crate) async fn seeded() -> Seeded {
    let now = now_ms();
    let mut w = World { d: Driver::new(0, 1, Timestamp(now - 3 * 3_600_000)), obs: BTreeMap::new() };
    let (w1, lost_agent, gone_agent) = (name("w1"), name("w-lost"), name("w-gone"));
    w.register(&w1, None);

    // Three hours ago: a resource made and destroyed, long enough ago to be left out of lists without `all`.
    let old = w.active(&w1);
    w.destroyed(&w1, old);

    // Half an hour ago: an agent that goes silent for longer than its own orphan_after, and is declared gone.
    w.d.set_clock(Timestamp(now - 30 * 60_000));
    let orphan_after = Millis::from_mins(2);
    w.register(&gone_agent, Some(AgentSettings { orphan_after, ..AgentSettings::DEFAULT }));
    let orphaned = w.active(&gone_agent);
    w.d.advance(Millis::from_mins(3));
    w.submit("sweeper-1", MarkGone { agent: gone_agent.clone() });

    // Ten minutes ago: the rest, long enough ago for the waiting ones to be stuck.
    w.d.set_clock(Timestamp(now - 10 * 60_000));
    let (pending, _) = w.allocate(&w1, |a| {
        a.attributes.insert("note".to_owned(), EVIL.to_owned());
    });
    let pool = PoolName::new("ips").expect("a pool name");
    w.op(DefinePool {
        pool: pool.clone(),
        kind: PoolKind::Slots { count: 4 },
        cooldown: None,
        orphans: OrphanPolicy::Release,
    });
    let (pending_on_pool, _) = w.allocate(&w1, |a| a.pools = vec![pool]);

    let (active, allocated) = w.allocate(&w1, |a| {
        a.attributes.insert("team".to_owned(), "ci".to_owned());
        a.attributes.insert("note".to_owned(), EVIL.to_owned());
    });
    w.created(&w1, active);
    let (held, acquired) = w.acquire(&w1, active, EVIL);
    let (queued, _) = w.acquire(&w1, active, "second in line");

    let paused = w.active(&w1);
    w.op(Pause { agent: w1.clone(), resource: paused, reason: Some(EVIL.to_owned()), until: None });

    let suspect = w.active(&w1);
    w.op(ReportFailureByOperator { agent: w1.clone(), resource: suspect, detail: EVIL.to_owned() });

    let releasing = w.active(&w1);
    let (broken, _) = w.acquire(&w1, releasing, "a build that was cut short");
    w.release(&w1, releasing);

    let destroyed = w.active(&w1);
    w.destroyed(&w1, destroyed);

    let (failed, _) = w.allocate(&w1, |_| {});
    let (epoch, obs) = (w.epoch(&w1), w.next_obs(&w1));
    let failure = FailureKind::CreateFailed;
    let report = ReportFailure { agent: w1.clone(), epoch, obs, resource: failed, failure, detail: EVIL.to_owned() };
    w.submit(w1.as_str(), report);

    // An agent whose sync report finds one of its two resources missing: that one is lost.
    w.register(&lost_agent, None);
    let (lost, kept) = (w.active(&lost_agent), w.active(&lost_agent));
    let (epoch, obs) = (w.epoch(&lost_agent), w.next_obs(&lost_agent));
    let mut report = SyncReport::new(lost_agent.clone(), epoch, obs, w.d.state().last_position());
    report.missing = vec![lost];
    report.count = 1;
    report.digest = HandleDigest::of([&kept]);
    w.submit(lost_agent.as_str(), report);

    // A lease asked of a destroyed resource: rejected.
    let lease = w.d.new_lease_id();
    let late = Acquire {
        agent: w1.clone(),
        resource: destroyed,
        lease,
        holder: "late".to_owned(),
        ttl: None,
        wait_timeout: None,
        priority: 0,
    };
    let rejected = w.d.submit("op:alice", late);
    assert!(rejected.rejection().is_some(), "an acquire of a destroyed resource is refused");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), 1).expect("the embedded log");
    append(&log, w.d.outcomes()).await;
    let dead_command = w.d.new_command_id().to_string();
    let letter = DeadLetter {
        partition: 0,
        source_seq: 1,
        source_subject: format!("lh.cmd.0.w1.{dead_command}"),
        reason: EVIL.to_owned(),
        payload: Bytes::from_static(b"not a command"),
        command_id: Some(LetterId { id: dead_command.clone(), verified: true }),
    };
    log.dead_letter(letter).await.expect("a dead letter is stored");
    let mut projector = Projector::in_memory(1).expect("a projection");
    projector.catch_up(&log).await.expect("the projector applies the log");

    let health = Health::of_roles(&["projector", "gateway"]);
    let shutdown = CancellationToken::new();
    let app = router(Api::new(log, &projector, GatewayConfig::default(), shutdown.clone()), health);
    let reference = |agent: &AgentName, id: ResourceId| format!("{agent}.{id}");
    let by_state = BTreeMap::from([
        ("pending", reference(&w1, pending)),
        ("active", reference(&w1, active)),
        ("paused", reference(&w1, paused)),
        ("suspect", reference(&w1, suspect)),
        ("releasing", reference(&w1, releasing)),
        ("destroyed", reference(&w1, destroyed)),
        ("lost", reference(&lost_agent, lost)),
        ("orphaned", reference(&gone_agent, orphaned)),
        ("failed", reference(&w1, failed)),
    ]);
    Seeded {
        app,
        by_state,
        pending_on_pool: reference(&w1, pending_on_pool),
        ended_long_ago: reference(&w1, old),
        held_lease: format!("{w1}.{held}"),
        queued_lease: format!("{w1}.{queued}"),
        broken_lease: format!("{w1}.{broken}"),
        allocate_command: allocated.command.id.to_string(),
        acquire_command: acquired.command.id.to_string(),
        rejected_command: rejected.command.id.to_string(),
        dead_command,
        shutdown,
        _dir: dir,
        _projector: projector,
    }
}

/// Appends `outcomes` to partition 0 of `log`, in order, as its writer would.
async fn append(log: &Embedded, outcomes: &[Outcome]) {
    let mut fence = 0;
    for chunk in outcomes.chunks(log.max_append_records()) {
        let records: Vec<OutcomeRecord> = chunk
            .iter()
            .map(|outcome| OutcomeRecord::of(outcome, Bytes::from(codec::encode_outcome(outcome).expect("encode"))))
            .collect();
        match log.append(0, fence, &records).await {
            Appended::Landed { last, .. } => fence = last,
            other => panic!("the log did not take the outcomes: {other:?}"),
        }
    }
}
