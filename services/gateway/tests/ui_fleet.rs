//! The operator's fleet pages, rendered on the server: `/ui/agents` (every agent, a health filter), one agent,
//! `/ui/pools` (with the quotas and what holds them), one pool (held, held for an orphan, cooling, waiting) and the
//! live feed `/ui/feed` (the latest outcomes, filters, and what the script follows from). Each page is read over a
//! fleet made by the domain's own decisions (the `Driver`, with the sweeper's own plan carrying what crosses from one
//! aggregate to another and what falls due with time), written to an embedded log and projected from it: agents in
//! every health, pools with held, cooling and orphan-held identifiers and a waiter, and a quota with a holder. Text
//! from outside (a label, a cordon reason, a driver's error, an issuer) holds `<script>` and U+202E: every page shows
//! it escaped and isolated in `<bdi>`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold_domain::driver::Driver;
use leasehold_gateway::{Api, GatewayConfig, Health, router};
use leasehold_log::embedded::Embedded;
use leasehold_log::{Appended, Log, OutcomeRecord};
use leasehold_projector::Projector;
use leasehold_schemas::command::{
    Acquire, Allocate, CordonAgent, DefinePool, DrainAgent, DriverStatus, Heartbeat, Register, Release, ReportCreated,
    ReportDestroyed, SetQuota, SyncReport,
};
use leasehold_schemas::ids::{AgentName, Issuer, Millis, PoolName, Position, QuotaName, ResourceId, Timestamp};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Command, Outcome, Uuid, codec};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Outside text: markup that would run, and a right-to-left override.
const EVIL: &str = "<script>alert(1)</script>\u{202e}";
/// How it must show: escaped, inside `<bdi>` (the text after it follows it in the same element).
const EVIL_SHOWN: &str = "<bdi>&lt;script&gt;alert(1)&lt;/script&gt;\u{202e}";
/// A producer whose name holds markup (an issuer may: printable ASCII without quotes).
const EVIL_ISSUER: &str = "op:<script>alert(1)</script>";
const OP: &str = "op:alice";

fn agent(name: &str) -> AgentName {
    AgentName::new(name).expect("an agent name")
}

fn pool(name: &str) -> PoolName {
    PoolName::new(name).expect("a pool name")
}

/// The first effect named `name` in `outcome`, by its position.
fn position_of(outcome: &Outcome, name: &str) -> Position {
    outcome
        .positioned_effects()
        .find_map(|(p, e)| (e.name() == name).then_some(p))
        .unwrap_or_else(|| panic!("no {name} in {outcome:?}"))
}

fn accepted(outcome: Outcome) -> Outcome {
    assert!(outcome.rejection().is_none(), "refused: {outcome:?}");
    outcome
}

/// One partition driven by the domain, and the sweeper's part played from its own plan.
struct Fleet {
    d: Driver,
    obs: BTreeMap<AgentName, u64>,
    /// Planned work sent, with the log time it was sent at: each is sent once per instant.
    sent: BTreeSet<(String, u64)>,
}

impl Fleet {
    fn new(start: Timestamp) -> Self {
        Fleet { d: Driver::new(0, 1, start), obs: BTreeMap::new(), sent: BTreeSet::new() }
    }

    /// A command from `issuer`, then whatever the sweeper plans that is due.
    fn send(&mut self, issuer: &str, body: impl Into<Command>) -> Outcome {
        let outcome = self.d.submit(issuer, body);
        self.sweep();
        outcome
    }

    /// An agent's command (sent under its own name).
    fn says(&mut self, name: &AgentName, body: impl Into<Command>) -> Outcome {
        self.send(name.as_str(), body)
    }

    fn epoch(&self, name: &AgentName) -> Position {
        self.d.state().agent(name).expect("registered").epoch
    }

    fn next_obs(&mut self, name: &AgentName) -> u64 {
        let n = self.obs.entry(name.clone()).or_insert(0);
        *n += 1;
        *n
    }

    /// Sends every request the sweeper's plan has due now, until it plans nothing new.
    fn sweep(&mut self) {
        for _ in 0..100 {
            let states = BTreeMap::from([(0, self.d.state().clone())]);
            let now = self.d.now();
            let due: Vec<_> = leasehold_sweeper::plan::plan(&states, &BTreeMap::new())
                .into_iter()
                .filter(|p| p.due.is_none_or(|at| at <= now))
                .filter(|p| self.sent.insert((p.key.clone(), now.0)))
                .collect();
            if due.is_empty() {
                return;
            }
            for planned in due {
                self.d.submit("sweeper-1", planned.command);
            }
        }
        panic!("the sweeper's plan does not settle");
    }

    fn register(&mut self, name: &AgentName, edit: impl FnOnce(&mut Register)) {
        let mut register = Register::new(name.clone(), Uuid::from_u128(self.d.outcomes().len() as u128 + 1));
        edit(&mut register);
        self.obs.insert(name.clone(), 0);
        accepted(self.says(name, register));
    }

    /// An allocation on `on` by `issuer`, claiming from `pools`; answers its id.
    fn allocate(&mut self, issuer: &str, on: &AgentName, pools: &[&str]) -> ResourceId {
        let id = self.d.new_resource_id();
        let mut allocate = Allocate::new(on.clone(), id, "container", 1);
        allocate.pools = pools.iter().map(|p| pool(p)).collect();
        accepted(self.send(issuer, allocate));
        id
    }

    fn created(&mut self, on: &AgentName, resource: ResourceId) {
        let (epoch, obs) = (self.epoch(on), self.next_obs(on));
        accepted(self.says(on, ReportCreated { agent: on.clone(), epoch, obs, resource, native_id: None }));
    }

    /// An allocation reported created once its claims are bound.
    fn active(&mut self, issuer: &str, on: &AgentName, pools: &[&str]) -> ResourceId {
        let id = self.allocate(issuer, on, pools);
        self.created(on, id);
        assert_eq!(self.d.state().resource(id).map(|r| r.state.name()), Some("active"));
        id
    }

    fn heartbeat(&mut self, name: &AgentName) {
        let epoch = self.epoch(name);
        self.says(name, Heartbeat { agent: name.clone(), epoch });
    }
}

/// What the pages are read over: the gateway, and the names of what the fleet made.
struct Seeded {
    app: Router,
    live_held: String,
    live_cooled: ResourceId,
    quota_holder: String,
    orphan: String,
    waiter: String,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _projector: Projector,
}

async fn seeded() -> Seeded {
    // Half an hour ago: what the fleet does lands before now, by the pages' clock.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let start = Timestamp(u64::try_from(now.as_millis()).expect("fits") - 30 * 60_000);
    let mut f = Fleet::new(start);
    let (live, stalled, gone, tripped) = (agent("live1"), agent("stalled1"), agent("gone1"), agent("tripped1"));
    let (cordoned, draining, nodriver) = (agent("cordoned1"), agent("draining1"), agent("nodriver1"));

    // Pools: slots that cool for a day, a subnet that holds an orphan's address, one slot a second claim waits for,
    // and the pool that counts a quota.
    let define = |name: &str, kind: PoolKind, cooldown: Millis, orphans: OrphanPolicy| DefinePool {
        pool: pool(name),
        kind,
        cooldown: Some(cooldown),
        orphans,
    };
    accepted(f.send(OP, define("ips", PoolKind::Slots { count: 8 }, Millis::from_hours(24), OrphanPolicy::Release)));
    let subnet = PoolKind::Ipv4 { network: "10.1.0.0".parse().expect("an address"), prefix_len: 29, exclude: vec![] };
    accepted(f.send(OP, define("hold-ips", subnet, Millis::from_mins(1), OrphanPolicy::Hold)));
    accepted(f.send(OP, define("one", PoolKind::Slots { count: 1 }, Millis::from_secs(1), OrphanPolicy::Release)));
    let counting =
        define("quota-team-a-container", PoolKind::Slots { count: 3 }, Millis::from_secs(1), OrphanPolicy::Release);
    accepted(f.send(OP, counting));
    let quota = SetQuota {
        key: leasehold_schemas::subjects::settings_key(0, 1),
        partition: 0,
        quota: QuotaName::new("team-a").expect("a quota name"),
        max: BTreeMap::from([("container".to_owned(), 3)]),
        principals: vec![Issuer::new(EVIL_ISSUER).expect("an issuer")],
    };
    accepted(f.send(OP, quota));

    // A live agent with labels and a capacity: one resource holding a slot, one whose slot cools, one counted by
    // the quota, and two claims on the one-slot pool (the second waits).
    f.register(&live, |r| {
        r.labels.insert("team".to_owned(), format!("{EVIL}evil"));
        r.capacity.insert("container".to_owned(), 6);
    });
    let held = f.active(OP, &live, &["ips"]);
    let cooled = f.active(OP, &live, &["ips"]);
    let release = accepted(f.send(OP, Release { agent: live.clone(), resource: cooled, reason: None }));
    let ordered = position_of(&release, "resource-releasing");
    let (epoch, obs) = (f.epoch(&live), f.next_obs(&live));
    accepted(f.says(&live, ReportDestroyed { agent: live.clone(), epoch, obs, resource: cooled, ordered }));
    let counted = f.active(EVIL_ISSUER, &live, &[]);
    f.allocate(OP, &live, &["one"]);
    let waiter = f.allocate(OP, &live, &["one"]);

    // An agent that stops heartbeating (stalled after the policy's minute), with a pending resource it never makes.
    f.register(&stalled, |_| {});
    f.allocate(OP, &stalled, &[]);

    // An agent of its own settings that is declared gone after five minutes: its resource keeps its address.
    let quick = AgentSettings {
        stall_after: Millis::from_secs(30),
        orphan_after: Millis::from_mins(5),
        ..AgentSettings::DEFAULT
    };
    f.register(&gone, |r| r.settings = Some(quick));
    let orphan = f.active(OP, &gone, &["hold-ips"]);

    // An agent whose breaker trips: a report loses its only live resource.
    let touchy = AgentSettings { max_loss_min: 1, ..AgentSettings::DEFAULT };
    f.register(&tripped, |r| r.settings = Some(touchy));
    let lost = f.active(OP, &tripped, &[]);
    let (epoch, obs) = (f.epoch(&tripped), f.next_obs(&tripped));
    let mut report = SyncReport::new(tripped.clone(), epoch, obs, f.d.state().last_position());
    report.missing = vec![lost];
    let outcome = accepted(f.says(&tripped, report));
    assert!(outcome.effects().iter().any(|e| e.name() == "agent-suspect"), "{outcome:?}");

    // Cordoned by an operator with a reason from outside; draining with a lease that keeps its resource.
    f.register(&cordoned, |_| {});
    accepted(f.send(OP, CordonAgent { agent: cordoned.clone(), reason: Some(format!("{EVIL}cordon")) }));
    f.register(&draining, |_| {});
    let kept = f.active(OP, &draining, &[]);
    let lease = f.d.new_lease_id();
    let acquire = Acquire {
        agent: draining.clone(),
        resource: kept,
        lease,
        holder: format!("{EVIL}build"),
        ttl: None,
        wait_timeout: None,
        priority: 0,
    };
    accepted(f.send(OP, acquire));
    let drain = DrainAgent {
        agent: draining.clone(),
        deadline: Some(Millis::from_hours(2)),
        grace: None,
        reason: Some(format!("{EVIL}drain")),
    };
    accepted(f.send(OP, drain));

    // An agent whose driver cannot list its machine.
    f.register(&nodriver, |_| {});
    let (epoch, obs) = (f.epoch(&nodriver), f.next_obs(&nodriver));
    let status =
        DriverStatus { agent: nodriver.clone(), epoch, obs, available: false, detail: format!("{EVIL}unmounted") };
    accepted(f.says(&nodriver, status));

    // A refusal for the feed: a release of a resource nobody allocated.
    let unknown = f.d.new_resource_id();
    let refused = f.send(OP, Release { agent: live.clone(), resource: unknown, reason: None });
    assert!(refused.rejection().is_some(), "{refused:?}");

    // Seven minutes pass: the others heartbeat; the silent stall, and the quick one is declared gone.
    for _ in 0..21 {
        f.d.advance(Millis::from_secs(20));
        for name in [&live, &tripped, &cordoned, &draining, &nodriver] {
            f.heartbeat(name);
        }
        f.sweep();
    }
    let status_of = |name: &AgentName| f.d.state().agent(name).expect("registered").status();
    assert_eq!(
        [&live, &stalled, &gone, &tripped].map(status_of),
        ["live", "stalled", "gone", "suspect"],
        "the fleet is in every health"
    );

    // The log, as a writer would have appended the driver's outcomes, and the projection folded from it.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = Embedded::open(dir.path(), 1).expect("the embedded log");
    let records: Vec<OutcomeRecord> =
        f.d.outcomes()
            .iter()
            .map(|outcome| OutcomeRecord::of(outcome, codec::encode_outcome(outcome).expect("encode").into()))
            .collect();
    let mut fence = 0;
    for slice in records.chunks(500) {
        match log.append(0, fence, slice).await {
            Appended::Landed { last, .. } => fence = last,
            other => panic!("the log refused the fleet's outcomes: {other:?}"),
        }
    }
    let mut projector = Projector::in_memory(1).expect("a projection");
    projector.catch_up(&log).await.expect("the projection folds the log");
    let health = Health::of_roles(&["projector", "gateway"]);
    let shutdown = CancellationToken::new();
    let app = router(Api::new(log, &projector, GatewayConfig::default(), shutdown.clone()), health);
    Seeded {
        app,
        live_held: format!("live1.{held}"),
        live_cooled: cooled,
        quota_holder: format!("live1.{counted}"),
        orphan: format!("gone1.{orphan}"),
        waiter: format!("live1.{waiter}"),
        shutdown,
        _dir: dir,
        _projector: projector,
    }
}

async fn page(app: &Router, uri: &str) -> (StatusCode, String) {
    let request = Request::builder().uri(uri).body(Body::empty()).expect("a request");
    let response = app.clone().oneshot(request).await.expect("an answer");
    let status = response.status();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (status, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// The page at `uri`, which must answer 200 and hold no outside markup unescaped.
async fn ok(app: &Router, uri: &str) -> String {
    let (status, body) = page(app, uri).await;
    assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    assert!(!body.contains("<script>alert"), "{uri} carries outside markup unescaped");
    body
}

/// The row of the table whose first link goes to `href`.
fn row<'b>(body: &'b str, href: &str) -> &'b str {
    let at = body.find(&format!("<td><a href=\"{href}\"")).unwrap_or_else(|| panic!("no row for {href} in {body}"));
    let start = body[..at].rfind("<tr>").expect("a row");
    let end = at + body[at..].find("</tr>").expect("the row's end");
    &body[start..end]
}

#[tokio::test]
async fn the_agents_page_shows_every_health_and_filters_by_one() {
    let s = seeded().await;
    let body = ok(&s.app, "/ui/agents").await;
    for (name, health, class) in [
        ("live1", "live", "good"),
        ("stalled1", "stalled", "warn"),
        ("gone1", "gone", "bad"),
        ("tripped1", "breaker tripped", "bad"),
        ("cordoned1", "cordoned", "warn"),
        ("draining1", "draining", "warn"),
        ("nodriver1", "driver unavailable", "bad"),
    ] {
        let row = row(&body, &format!("/ui/agents/{name}"));
        assert!(row.contains(&format!("<span class=\"badge {class}\">{health}</span>")), "{name}: {row}");
        assert!(row.contains("<time datetime=\""), "{name}: last heard at a time: {row}");
    }
    let live = row(&body, "/ui/agents/live1");
    assert!(live.contains("<bdi>container</bdi> 4 / 6"), "capacity used of declared: {live}");
    assert!(live.contains(&format!("<bdi>team</bdi>={EVIL_SHOWN}evil</bdi>")), "the label, escaped: {live}");
    let tripped = row(&body, "/ui/agents/tripped1");
    assert!(tripped.contains("would have lost 1 of its 1 live resources"), "{tripped}");
    let cordoned = row(&body, "/ui/agents/cordoned1");
    assert!(cordoned.contains(&format!("by <bdi>{OP}</bdi>: {EVIL_SHOWN}cordon</bdi>")), "{cordoned}");
    let draining = row(&body, "/ui/agents/draining1");
    assert!(draining.contains("1 left, deadline <time"), "{draining}");
    let nodriver = row(&body, "/ui/agents/nodriver1");
    assert!(nodriver.contains(&format!("unavailable</span> {EVIL_SHOWN}unmounted</bdi>")), "{nodriver}");

    // One health at a time, as the overview links each.
    let overview = ok(&s.app, "/ui").await;
    assert!(overview.contains("href=\"/ui/agents?health=breaker%20tripped\""), "the overview links each health");
    let tripped_only = ok(&s.app, "/ui/agents?health=breaker%20tripped").await;
    assert!(tripped_only.contains("href=\"/ui/agents/tripped1\""));
    assert!(!tripped_only.contains("href=\"/ui/agents/live1\""), "only the agents in that health");
    let gone_only = ok(&s.app, "/ui/agents?health=gone").await;
    assert!(gone_only.contains("href=\"/ui/agents/gone1\"") && !gone_only.contains("href=\"/ui/agents/stalled1\""));
    let (status, body) = page(&s.app, "/ui/agents?health=%3Cscript%3Ealert(1)%3C%2Fscript%3E").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("<bdi>&lt;script&gt;alert(1)&lt;/script&gt;</bdi>") && body.contains("breaker tripped"));
    let (status, _) = page(&s.app, "/ui/agents?colour=red").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    s.shutdown.cancel();
}

#[tokio::test]
async fn an_agents_page_shows_it_in_full_with_its_settings_and_resources() {
    let s = seeded().await;
    let body = ok(&s.app, "/ui/agents/live1").await;
    assert!(body.contains("<dl class=\"fields\">"), "its fields");
    assert!(body.contains(&format!("{EVIL_SHOWN}evil</bdi>")), "its label, escaped");
    assert!(body.contains("Its partition's policy"), "the settings it follows");
    assert!(body.contains("<dd>1min without a heartbeat</dd>"), "the policy's stall_after");
    assert!(body.contains("href=\"/ui/resources?agent=live1\""), "a link to all its resources");
    assert!(body.contains(&format!("href=\"/ui/resources/{}\"", s.live_held)), "its resources listed");
    assert!(body.contains(&format!("href=\"/ui/resources/{}\"", s.quota_holder)));
    assert!(body.contains("class=\"state-active\""), "with their states");
    assert!(body.contains(&format!("live1.{}", s.live_cooled)), "a resource that ended lately is still listed");

    let gone = ok(&s.app, "/ui/agents/gone1").await;
    assert!(gone.contains("Its own: it registered with them."), "its own settings");
    assert!(gone.contains("<dd>5min without a heartbeat (its resources are orphaned)</dd>"), "{gone}");
    assert!(gone.contains("Declared gone"), "when it was declared gone");
    assert!(gone.contains(&format!("href=\"/ui/resources/{}\"", s.orphan)));

    let stalled = ok(&s.app, "/ui/agents/stalled1").await;
    assert!(stalled.contains("<span class=\"badge stuck\">stuck for "), "its pending resource is stuck: {stalled}");

    let draining = ok(&s.app, "/ui/agents/draining1").await;
    assert!(draining.contains(&format!("{EVIL_SHOWN}drain</bdi>")), "the drain's reason, escaped");
    let nodriver = ok(&s.app, "/ui/agents/nodriver1").await;
    assert!(nodriver.contains(&format!("{EVIL_SHOWN}unmounted</bdi>")));

    let (status, body) = page(&s.app, "/ui/agents/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("<bdi>nobody</bdi>"));
    let (status, body) = page(&s.app, "/ui/agents/Not%20A%20Name%E2%80%AE").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("<bdi>Not A Name\u{202e}</bdi>"), "the bad name isolated: {body}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn the_pools_page_shows_sizes_fills_and_the_quotas_holders() {
    let s = seeded().await;
    let body = ok(&s.app, "/ui/pools").await;
    let ips = row(&body, "/ui/pools/ips");
    assert!(ips.contains("8 slots"), "{ips}");
    assert!(ips.contains("1 / 8 (12%)"), "held of its size: {ips}");
    assert!(
        ips.contains("<td class=\"num\">1</td><td>release</td><td>24h</td>"),
        "cooling now, orphans, cool-down: {ips}"
    );
    let subnet = row(&body, "/ui/pools/hold-ips");
    assert!(subnet.contains("IPv4 <code>10.1.0.0/29</code>"), "{subnet}");
    assert!(subnet.contains("1 / 6 (16%)"), "a /29 hands out 6 addresses: {subnet}");
    assert!(subnet.contains("<td>hold</td>"), "{subnet}");
    let one = row(&body, "/ui/pools/one");
    assert!(
        one.contains("<span class=\"badge bad\">1 / 1 (100%)</span></td><td class=\"num\">1</td>"),
        "full, one waits: {one}"
    );

    let quotas = &body[body.find("id=\"quotas\"").expect("a quotas section")..];
    assert!(quotas.contains("<bdi>team-a</bdi>"), "{quotas}");
    assert!(quotas.contains("<bdi>op:&lt;script&gt;alert(1)&lt;/script&gt;</bdi>"), "its principal, escaped: {quotas}");
    assert!(quotas.contains("<td class=\"num\">1 / 3</td>"), "held of its max: {quotas}");
    assert!(quotas.contains("href=\"/ui/pools/quota-team-a-container\""), "its counting pool");
    assert!(quotas.contains(&format!("href=\"/ui/resources/{}\"", s.quota_holder)), "what holds it: {quotas}");
    s.shutdown.cancel();
}

#[tokio::test]
async fn a_pools_page_lists_held_orphan_held_cooling_and_waiting() {
    let s = seeded().await;
    let ips = ok(&s.app, "/ui/pools/ips").await;
    let held = &ips[ips.find("id=\"held\"").expect("held")..ips.find("id=\"cooling\"").expect("cooling")];
    assert!(held.contains("<td class=\"mono\">slot 0</td>"), "{held}");
    assert!(held.contains(&format!("href=\"/ui/resources/{}\"", s.live_held)), "its holder: {held}");
    assert!(!held.contains("held for an orphan"));
    let cooling = &ips[ips.find("id=\"cooling\"").expect("cooling")..];
    assert!(
        cooling.contains("<td class=\"mono\">slot 1</td><td><time datetime=\""),
        "cooling, with its end: {cooling}"
    );

    let subnet = ok(&s.app, "/ui/pools/hold-ips").await;
    let held = row(&subnet, &format!("/ui/resources/{}", s.orphan));
    assert!(held.contains("10.1.0.1") && held.contains("held for an orphan"), "{held}");
    assert!(subnet.contains("1 of them for orphans"), "{subnet}");

    let one = ok(&s.app, "/ui/pools/one").await;
    let waiting = &one[one.find("id=\"waiting\"").expect("waiting")..];
    assert!(waiting.contains(&format!("href=\"/ui/resources/{}\"", s.waiter)), "who waits: {waiting}");

    let (status, _) = page(&s.app, "/ui/pools/nosuch").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = page(&s.app, "/ui/pools/%3Cscript%3E").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("<bdi>&lt;script&gt;</bdi>"), "{body}");

    // The JSON API lists the same cooling identifiers and waiters.
    let (status, pools) = page(&s.app, "/v1/pools").await;
    assert_eq!(status, StatusCode::OK);
    let pools: serde_json::Value = serde_json::from_str(&pools).expect("JSON");
    let ips = pools.as_array().and_then(|p| p.iter().find(|p| p["name"] == "ips")).expect("ips");
    assert_eq!(ips["cooling_values"][0]["value"], "slot 1", "{ips:#}");
    let one = pools.as_array().and_then(|p| p.iter().find(|p| p["name"] == "one")).expect("one");
    assert_eq!(one["waiters"], serde_json::json!([s.waiter]), "{one:#}");
    s.shutdown.cancel();
}

/// The `data-seq` of every line of the feed, in page order.
fn seqs(body: &str) -> Vec<u64> {
    body.split("data-seq=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').expect("quoted")].parse().expect("a number"))
        .collect()
}

#[tokio::test]
async fn the_feed_shows_the_latest_outcomes_filtered_and_says_what_it_follows() {
    let s = seeded().await;
    let body = ok(&s.app, "/ui/feed").await;
    assert!(body.contains("Not following: without JavaScript"), "it says what it shows without the script");
    let shown = seqs(&body);
    assert_eq!(shown.len(), 50, "the latest 50");
    assert!(shown.windows(2).all(|w| w[0] > w[1]), "newest first: {shown:?}");
    let end = shown[0];
    assert!(body.contains(&format!("data-events=\"/v1/events?from={}\"", end + 1)), "the script follows after them");
    assert!(body.contains("href=\"/ui/commands/"), "each line links its command");
    assert_eq!(body.matches("<script").count(), 1, "only the page's own script tag");

    // By key: only that agent's outcomes, followed on its key.
    let live = ok(&s.app, "/ui/feed?key=live1").await;
    assert!(live.contains("data-events=\"/v1/events?from=") && live.contains("&amp;key=live1\""), "{live}");
    assert!(live.contains("data-key=\"live1\""));
    let lines = seqs(&live).len();
    assert!(lines > 0 && live.matches(" on <a href=\"/ui/agents/live1\">").count() == lines, "{live}");

    // By type: an allocation by the producer with markup in its name, with links to what it is about.
    let allocations = ok(&s.app, "/ui/feed?type=op.allocate").await;
    assert!(
        allocations.contains(" by <bdi>op:&lt;script&gt;alert(1)&lt;/script&gt;</bdi>"),
        "the issuer, escaped: {allocations}"
    );
    assert!(allocations.contains(&format!("resource <a href=\"/ui/resources/{}\"", s.quota_holder)), "{allocations}");
    assert!(allocations.contains("pool <a href=\"/ui/pools/quota-team-a-container\""), "the pools it claims");
    assert_eq!(seqs(&allocations).len(), allocations.matches("<code>op.allocate</code>").count());

    // A pool's own outcomes: a grant names its holder, elsewhere, by reference.
    let pool = ok(&s.app, "/ui/feed?key=%40ips").await;
    assert!(pool.contains(" on @<a href=\"/ui/pools/ips\">"), "{pool}");
    assert!(pool.contains(&format!("resource <a href=\"/ui/resources/{}\"", s.live_held)), "{pool}");

    // Rejected only: the refused release, and why.
    let rejected = ok(&s.app, "/ui/feed?rejected=1").await;
    let n = seqs(&rejected).len();
    assert!(n >= 1 && rejected.matches("<span class=\"badge bad\">rejected</span>").count() == n, "{rejected}");
    assert!(rejected.contains("<code>op.release</code>") && rejected.contains("data-rejected=\"1\""), "{rejected}");
    let cordon = ok(&s.app, "/ui/feed?type=op.cordon-agent&key=cordoned1").await;
    assert_eq!(seqs(&cordon).len(), 1, "{cordon}");

    for bad in [
        "/ui/feed?key=%3Cscript%3E",
        "/ui/feed?type=op.nothing",
        "/ui/feed?colour=red",
        "/ui/feed?rejected=1&rejected=0",
        "/ui/feed?key=w1&key=w2",
    ] {
        let (status, body) = page(&s.app, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(!body.contains("<script>"), "{bad}");
    }
    s.shutdown.cancel();
}

/// The events the script follows carry what each outcome is about, as the page's lines link it.
#[tokio::test]
async fn an_event_names_what_its_outcome_is_about() {
    let s = seeded().await;
    let request = Request::builder().uri("/v1/events?key=%40ips&from=1").body(Body::empty()).expect("a request");
    let response = s.app.clone().oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The data of the stream's events, read until one is the grant of the first slot.
    let read = async {
        let mut text = String::new();
        loop {
            let frame = body.frame().await.expect("the stream goes on").expect("a frame");
            if let Ok(data) = frame.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
            let events: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str(data).ok())
                .collect();
            if let Some(grant) =
                events.into_iter().find(|e| e["about"]["resources"].as_array().is_some_and(|r| !r.is_empty()))
            {
                return grant;
            }
        }
    };
    let grant = tokio::time::timeout(Duration::from_secs(10), read).await.expect("a grant's event names its holder");
    assert_eq!(grant["about"]["resources"], serde_json::json!([s.live_held]), "{grant:#}");
    assert_eq!(grant["about"]["pools"], serde_json::json!(["ips"]), "its key's pool: {grant:#}");
    assert_eq!(grant["about"]["agents"], serde_json::json!([]), "{grant:#}");
    assert!(grant["outcome"]["command"]["type_name"] == "sys.claim", "{grant:#}");
    s.shutdown.cancel();
}
