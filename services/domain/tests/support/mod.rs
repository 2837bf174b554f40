//! Test support: a world with one partition, helpers that build commands, and the table `check()`.

#![allow(dead_code, unreachable_pub)]

use leasehold_domain::driver::Driver;
use leasehold_domain::state::PartitionState;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::*;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Command, Outcome, RejectionKind, Uuid};

/// Log time at the start of every test (2027-01-15).
pub const T0: Timestamp = Timestamp(1_800_000_000_000);
pub const OP: &str = "op:alice";
pub const SWEEPER: &str = "sweeper-1";

pub fn agent_name(name: &str) -> AgentName {
    AgentName::new(name).unwrap()
}

pub fn pool_name(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

pub fn secs(n: u64) -> Millis {
    Millis::from_secs(n)
}

/// The first agent name `<prefix><i>` whose key falls in `partition` of `partitions`.
pub fn agent_in(prefix: &str, partition: u32, partitions: u32) -> AgentName {
    (1..)
        .map(|i| agent_name(&format!("{prefix}{i}")))
        .find(|a| leasehold_schemas::subjects::partition_of_agent(a, partitions) == partition)
        .expect("some name falls in every partition")
}

/// One partition (P = 1 unless asked), an agent `w1` by default, and the last things made, so table cases can
/// name them: `w.a()`, `w.r()`, `w.l()`, `w.token()`.
pub struct World {
    pub d: Driver,
    pub obs: std::collections::BTreeMap<AgentName, u64>,
    pub last_resource: Option<ResourceId>,
    pub last_lease: Option<LeaseId>,
    pub last_token: Option<Position>,
    pub agent: AgentName,
}

impl World {
    pub fn new() -> Self {
        World::with_partitions(0, 1)
    }

    /// One partition whose long decisions split into parts after `bytes` of effects.
    pub fn with_split_budget(bytes: usize) -> Self {
        let state = PartitionState::new(0, 1).with_split_budget(bytes);
        World { d: Driver::with_state(state, T0), ..World::new() }
    }

    pub fn with_partitions(partition: u32, partitions: u32) -> Self {
        World {
            d: Driver::new(partition, partitions, T0),
            obs: Default::default(),
            last_resource: None,
            last_lease: None,
            last_token: None,
            agent: agent_name("w1"),
        }
    }

    pub fn state(&self) -> &PartitionState {
        self.d.state()
    }

    pub fn a(&self) -> AgentName {
        self.agent.clone()
    }

    pub fn r(&self) -> ResourceId {
        self.last_resource.expect("a resource was made in `given`")
    }

    pub fn rref(&self) -> ResourceRef {
        ResourceRef::new(self.a(), self.r())
    }

    pub fn l(&self) -> LeaseId {
        self.last_lease.expect("a lease was made in `given`")
    }

    pub fn token(&self) -> Position {
        self.last_token.expect("a lease was granted in `given`")
    }

    pub fn epoch(&self, agent: &AgentName) -> Position {
        self.state().agent(agent).expect("agent registered").epoch
    }

    pub fn next_obs(&mut self, agent: &AgentName) -> u64 {
        let n = self.obs.entry(agent.clone()).or_insert(0);
        *n += 1;
        *n
    }

    pub fn op(&mut self, body: impl Into<Command>) -> Outcome {
        self.d.submit(OP, body)
    }

    pub fn sys(&mut self, body: impl Into<Command>) -> Outcome {
        self.d.submit(SWEEPER, body)
    }

    /// A command from an agent, sent under its own name.
    pub fn agent_says(&mut self, body: impl Into<Command>) -> Outcome {
        let body = body.into();
        let Key::Agent(agent) = body.key() else { panic!("agent commands are keyed by agent") };
        self.d.submit(agent.as_str(), body)
    }

    pub fn advance(&mut self, by: Millis) {
        self.d.advance(by);
    }

    // --- agents ---------------------------------------------------------------------------------------------

    /// Registers `agent` with settings of its own (`Some`), or following the partition's policy (`None`).
    pub fn register_with(
        &mut self,
        agent: &AgentName,
        settings: impl Into<Option<AgentSettings>>,
        wiped: bool,
    ) -> Outcome {
        self.obs.insert(agent.clone(), 0);
        let incarnation = leasehold_schemas::Uuid::from_u128(self.d.outcomes().len() as u128 + 1);
        self.agent_says(Register {
            agent: agent.clone(),
            incarnation,
            wiped,
            settings: settings.into(),
            labels: Default::default(),
            capacity: Default::default(),
        })
    }

    /// Registers the default agent `w1`, following the partition's policy.
    pub fn registered(&mut self) -> &mut Self {
        let agent = self.a();
        accepted(&self.register_with(&agent, None, false));
        self
    }

    pub fn heartbeat(&mut self, agent: &AgentName) -> Outcome {
        let epoch = self.epoch(agent);
        self.agent_says(Heartbeat { agent: agent.clone(), epoch })
    }

    // --- resources ------------------------------------------------------------------------------------------

    /// An allocation of a fresh id on `agent` (see [`allocation`]).
    pub fn allocate_cmd(&mut self, agent: &AgentName) -> Allocate {
        allocation(agent, self.d.new_resource_id())
    }

    /// Allocates a resource (capacity 2) on `w1`; it becomes `w.r()`.
    pub fn pending(&mut self) -> &mut Self {
        self.pending_with(|_| {})
    }

    pub fn pending_with(&mut self, edit: impl FnOnce(&mut Allocate)) -> &mut Self {
        let agent = self.a();
        let mut cmd = self.allocate_cmd(&agent);
        edit(&mut cmd);
        self.last_resource = Some(cmd.resource);
        accepted(&self.op(cmd));
        self
    }

    pub fn report_created(&mut self, agent: &AgentName, resource: ResourceId) -> Outcome {
        let epoch = self.epoch(agent);
        let obs = self.next_obs(agent);
        self.agent_says(ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id: None })
    }

    /// A registered agent with an active resource `w.r()`.
    pub fn active(&mut self) -> &mut Self {
        self.active_with(|_| {})
    }

    /// A registered agent and `w.r()`, allocated with `edit` and reported created.
    pub fn active_with(&mut self, edit: impl FnOnce(&mut Allocate)) -> &mut Self {
        self.registered().pending_with(edit);
        let (agent, resource) = (self.a(), self.r());
        accepted(&self.report_created(&agent, resource));
        self
    }

    pub fn acquire_cmd(&mut self, ttl: Option<Millis>, wait_timeout: Option<Millis>) -> Acquire {
        let lease = self.d.new_lease_id();
        Acquire {
            agent: self.a(),
            resource: self.r(),
            lease,
            holder: "build-42".into(),
            ttl,
            wait_timeout,
            priority: 0,
        }
    }

    /// Acquires a lease on `w.r()`; it becomes `w.l()` (and `w.token()` if granted).
    pub fn leased(&mut self, ttl: Option<Millis>) -> &mut Self {
        let cmd = self.acquire_cmd(ttl, Some(secs(60)));
        self.last_lease = Some(cmd.lease);
        let outcome = self.op(cmd);
        accepted(&outcome);
        self.last_token = outcome
            .positioned_effects()
            .find_map(|(pos, e)| matches!(e, Effect::LeaseGranted { .. }).then_some(pos))
            .or(self.last_token);
        self
    }

    pub fn release(&mut self) -> Outcome {
        let resource = self.r();
        self.release_of(resource)
    }

    /// Releases `resource` on the current agent.
    pub fn release_of(&mut self, resource: ResourceId) -> Outcome {
        let agent = self.a();
        self.op(Release { agent, resource, reason: Some("done".into()) })
    }

    /// A sync report from `agent` at the current last position, with `edit` filling in the lists.
    pub fn sync_cmd(&mut self, agent: &AgentName, edit: impl FnOnce(&mut SyncReport)) -> SyncReport {
        let epoch = self.epoch(agent);
        let obs = self.next_obs(agent);
        let watermark = self.state().last_position();
        let mut report = SyncReport::new(agent.clone(), epoch, obs, watermark);
        edit(&mut report);
        report
    }

    /// A sync report whose count and digest match what the writer believes after its lists are applied.
    pub fn sync(&mut self, agent: &AgentName, edit: impl FnOnce(&mut SyncReport)) -> Outcome {
        let mut report = self.sync_cmd(agent, edit);
        let (count, digest) = self.expected_listing(agent, &report);
        report.count = count;
        report.digest = digest;
        self.agent_says(report)
    }

    /// What an honest agent would count: every handle of its assignment set as of the watermark that it holds,
    /// present or in flight — held resources and releasing ones seen present — minus the ones it reports missing or
    /// destroyed, plus the ones it reports created or in flight.
    pub fn expected_listing(&self, agent: &AgentName, report: &SyncReport) -> (u64, HandleDigest) {
        let state = self.state();
        let a = state.agent(agent).unwrap();
        let known = |r: &leasehold_domain::state::Resource| r.creation_position() <= report.watermark;
        let mut ids = std::collections::BTreeSet::new();
        for r in state.resources_of(a).filter(|r| known(r)) {
            let releasing_seen = r.state.name() == "releasing" && r.last_present.is_some();
            let named_present = report.created.contains(&r.id) || report.in_flight.contains(&r.id);
            let left_since = a.left_by_position.range(report.watermark.next()..).any(|(_, id)| *id == r.id);
            let there_at_watermark = !r.state.is_terminal() || left_since;
            if r.state.is_held() || releasing_seen || (named_present && there_at_watermark) {
                ids.insert(r.id);
            }
        }
        for id in report.missing.iter().chain(&report.destroyed) {
            if !report.in_flight.contains(id) {
                ids.remove(id);
            }
        }
        (ids.len() as u64, HandleDigest::of(ids.iter()))
    }

    /// The claim-wanted of `w.r()` on `pool`, which a grant must answer.
    pub fn wanted_by(&self, pool: &str) -> Source {
        match self.state().resource(self.r()).expect("allocated").claims.get(&pool_name(pool)) {
            Some(leasehold_domain::state::ClaimSlot::Wanted { wanted_at }) => {
                Source { partition: self.state().partition(), position: *wanted_at }
            }
            other => panic!("no wanted claim on {pool}: {other:?}"),
        }
    }

    /// A pending resource `w.r()` with a claim on pool `ips`, bound (without a real pool), so its create is ordered.
    pub fn claimed(&mut self) -> &mut Self {
        self.pending_with(|c| c.pools = vec![pool_name("ips")]);
        let bind = BindClaim {
            holder: self.rref(),
            pool: pool_name("ips"),
            value: leasehold_schemas::pool::PoolValue::Slot(3),
            token: Position(1),
            source: Source { partition: self.state().partition(), position: Position(1) },
            wanted: self.wanted_by("ips"),
            definition: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        };
        assert_eq!(effect_names(&self.sys(bind)), ["claim-bound", "create-ordered"]);
        self
    }

    /// `n` resources allocated and reported created by one sync report; the last is `w.r()`.
    pub fn active_n(&mut self, n: usize) -> Vec<ResourceId> {
        let made: Vec<ResourceId> = (0..n)
            .map(|_| {
                self.pending();
                self.r()
            })
            .collect();
        let a = self.a();
        let created = made.clone();
        accepted(&self.sync(&a, |r| r.created = created));
        made
    }

    /// The agent's health result for `w.r()`, answering the check asked for at `request`.
    pub fn health_result(&mut self, request: Position, healthy: bool) -> Outcome {
        let resource = self.r();
        self.health_answer(resource, request, healthy, "check")
    }

    fn health_answer(&mut self, resource: ResourceId, request: Position, healthy: bool, detail: &str) -> Outcome {
        let agent = self.a();
        let epoch = self.epoch(&agent);
        let obs = self.next_obs(&agent);
        self.agent_says(HealthResult { agent, epoch, obs, resource, request, healthy, detail: detail.into() })
    }

    /// The check `resource` (on the current agent) waits for, asked for now if none is.
    pub fn check_asked(&mut self, resource: ResourceId) -> Position {
        if let Some(leasehold_domain::state::ResourceState::Suspect { asked: Some(asked), .. }) =
            self.state().resource(resource).map(|r| &r.state)
        {
            return *asked;
        }
        let agent = self.a();
        let asked = self.sys(RequestHealthCheck { agent, resource });
        asked
            .positioned_effects()
            .find_map(|(p, e)| matches!(e, Effect::HealthCheckRequested { .. }).then_some(p))
            .unwrap_or(Position::ZERO)
    }

    /// The agent's health result for `resource`, answering the check it waits for (asked now if none is).
    pub fn health_of(&mut self, resource: ResourceId, healthy: bool, detail: &str) -> Outcome {
        let request = self.check_asked(resource);
        self.health_answer(resource, request, healthy, detail)
    }

    /// An operator reports `resource` failing (it turns suspect).
    pub fn operator_failure(&mut self, resource: &ResourceRef, detail: &str) -> Outcome {
        let agent = resource.agent.clone();
        self.op(ReportFailureByOperator { agent, resource: resource.resource, detail: detail.into() })
    }

    /// Makes `parent` (on the current agent, in this partition) `parent_state` for real, then sends `child` the
    /// cascade that tells it to look at its parent (a child of a parent in its own partition follows the parent as
    /// it is, whatever the cascade says).
    pub fn parent_becomes(
        &mut self,
        child: &ResourceRef,
        parent: &ResourceRef,
        parent_state: ParentState,
        source: Source,
    ) -> Outcome {
        let now = self.state().resource(parent.resource).map(|r| r.state.clone());
        let suspect = matches!(now, Some(leasehold_domain::state::ResourceState::Suspect { .. }));
        let left = now.as_ref().is_none_or(|s| s.has_left());
        match parent_state {
            ParentState::Left if !left => {
                let release = Release { agent: parent.agent.clone(), resource: parent.resource, reason: None };
                accepted(&self.op(release));
            }
            ParentState::Suspect if !suspect && !left => {
                accepted(&self.operator_failure(parent, "x"));
            }
            ParentState::Healthy if suspect => {
                accepted(&self.health_of(parent.resource, true, "ok"));
            }
            _ => {}
        }
        self.sys(Cascade { child: child.clone(), parent: parent.clone(), parent_state, source, answers: None })
    }

    /// A claim of `holder` on `pool` (in this partition) from `source`, granted: the bind the sweeper carries back.
    pub fn granted_claim(&mut self, pool: &PoolName, holder: &ResourceRef, source: Source) -> BindClaim {
        let granted = self.sys(Claim { pool: pool.clone(), holder: holder.clone(), source });
        let (value, token) = granted
            .positioned_effects()
            .find_map(|(p, e)| match e {
                Effect::ClaimGranted { value, .. } => Some((*value, p)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("a grant, not {:?}", effect_names(&granted)));
        let grant = Source { partition: self.state().partition(), position: token };
        // As the sweeper carries it: an IPv4 pool's definition goes with the grant.
        let definition = self
            .state()
            .pool(pool)
            .map(|p| p.kind.clone())
            .filter(|kind| matches!(kind, leasehold_schemas::pool::PoolKind::Ipv4 { .. }));
        BindClaim {
            holder: holder.clone(),
            pool: pool.clone(),
            value,
            token,
            source: grant,
            wanted: source,
            definition,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        }
    }

    /// `w.r()` observed present by a report-created.
    pub fn created(&mut self) -> &mut Self {
        let (agent, resource) = (self.a(), self.r());
        accepted(&self.report_created(&agent, resource));
        self
    }

    // --- pools ----------------------------------------------------------------------------------------------

    pub fn define_slots(&mut self, name: &str, count: u32, cooldown: Millis) -> Outcome {
        self.op(DefinePool {
            pool: pool_name(name),
            kind: leasehold_schemas::pool::PoolKind::Slots { count },
            cooldown: Some(cooldown),
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        })
    }

    /// The source of the first effect named `name` in `outcome`.
    pub fn source_of(&self, outcome: &Outcome, name: &str) -> Source {
        let position = outcome
            .positioned_effects()
            .find_map(|(p, e)| (e.name() == name).then_some(p))
            .unwrap_or_else(|| panic!("no {name} in {:?}", effect_names(outcome)));
        Source { partition: self.state().partition(), position }
    }
}

/// An allocation of `resource` on `agent`: a container of capacity 2, without attributes, parent or pools.
pub fn allocation(agent: &AgentName, resource: ResourceId) -> Allocate {
    Allocate {
        agent: agent.clone(),
        resource,
        kind: "container".into(),
        capacity: 2,
        attributes: Default::default(),
        parent: None,
        pools: vec![],
        wait: None,
    }
}

/// A resync chunk of the current agent over `[lo, hi)` at the current last position, with the next observation
/// number.
pub fn chunk(
    w: &mut World,
    lo: Uuid,
    hi: Option<Uuid>,
    held: Vec<ResourceId>,
    in_flight: Vec<ResourceId>,
) -> ResyncChunk {
    let agent = w.a();
    let epoch = w.epoch(&agent);
    let obs = w.next_obs(&agent);
    let watermark = w.state().last_position();
    ResyncChunk { agent, epoch, obs, watermark, lo, hi, held, in_flight }
}

/// The chunk bounds that cover exactly `id`.
pub fn just(id: ResourceId) -> (Uuid, Option<Uuid>) {
    (id.as_uuid(), Some(Uuid::from_u128(id.as_uuid().as_u128() + 1)))
}

/// The adoption of `child`, allocated at `born` in another partition, by `parent` in `parents`' partition: the
/// parent's answer (`child-adopted`), and the cascade that carries it back to the child.
pub fn adoption(parents: &mut World, parent: &ResourceRef, child: &ResourceRef, born: Source) -> (Outcome, Cascade) {
    let adopted = parents.sys(Adopt { parent: parent.clone(), child: child.clone(), source: born });
    let parent_state = adopted
        .effects()
        .iter()
        .find_map(|e| match e {
            Effect::ChildAdopted { parent_state, .. } => Some(*parent_state),
            _ => None,
        })
        .unwrap_or_else(|| panic!("an answer, not {:?}", effect_names(&adopted)));
    let source = parents.source_of(&adopted, "child-adopted");
    let answer = Cascade { child: child.clone(), parent: parent.clone(), parent_state, source, answers: Some(born) };
    (adopted, answer)
}

// --- assertions ---------------------------------------------------------------------------------------------------

pub fn effect_names(outcome: &Outcome) -> Vec<&'static str> {
    outcome.effects().iter().map(Effect::name).collect()
}

/// Asserts the outcome is accepted and returns its effects.
#[track_caller]
pub fn accepted(outcome: &Outcome) -> &[Effect] {
    if let Some(rejection) = outcome.rejection() {
        panic!("{} was rejected: {rejection}", outcome.command.type_name);
    }
    outcome.effects()
}

/// Asserts the outcome is rejected with `kind` and returns its message.
#[track_caller]
pub fn rejected(outcome: &Outcome, kind: RejectionKind) -> &str {
    match outcome.rejection() {
        Some(rejection) if rejection.kind == kind => &rejection.message,
        Some(rejection) => panic!("{} was rejected as {rejection}, expected {kind}", outcome.command.type_name),
        None => panic!(
            "{} was accepted with {:?}, expected a {kind} rejection",
            outcome.command.type_name,
            effect_names(outcome)
        ),
    }
}

/// What a table case expects.
pub enum Then {
    /// Accepted with exactly these effects, in order.
    Effects(&'static [&'static str]),
    /// Rejected with this kind and a message containing each fragment.
    Rejected(RejectionKind, &'static [&'static str]),
}

/// One row of a table: given (steps on a fresh world) / when (the command) / then (the outcome).
pub struct Case {
    pub name: &'static str,
    pub given: Box<dyn Fn(&mut World)>,
    pub when: Box<dyn Fn(&mut World) -> Outcome>,
    pub then: Then,
}

pub fn case(
    name: &'static str,
    given: impl Fn(&mut World) + 'static,
    when: impl Fn(&mut World) -> Outcome + 'static,
    then: Then,
) -> Case {
    Case { name, given: Box::new(given), when: Box::new(when), then }
}

/// Runs every case on a fresh world. Besides each case's expectation, checks that a rejection changed nothing but
/// the cursor and remembered outcomes, that the invariants hold, and that folding the outcomes from scratch gives
/// the same state.
pub fn check(cases: Vec<Case>) {
    let checks =
        cases.into_iter().map(|case| (case.name, Box::new(move || run_case(&case)) as Box<dyn Fn()>)).collect();
    all_hold(checks);
}

fn run_case(case: &Case) {
    let mut world = World::new();
    (case.given)(&mut world);
    let before = world.state().clone();
    let outcome = (case.when)(&mut world);
    match case.then {
        Then::Effects(names) => {
            accepted(&outcome);
            assert_eq!(effect_names(&outcome), names, "effects");
        }
        Then::Rejected(kind, fragments) => {
            assert_refusal(&before, world.state(), &outcome, kind, fragments);
        }
    }
    settle(&world);
}

/// Invariants hold and folding every outcome from scratch gives the same state.
#[track_caller]
pub fn settle(w: &World) {
    leasehold_domain::invariants::check(w.state()).expect("invariants");
    assert!(w.d.rebuild() == *w.state(), "folding the outcomes from scratch gives another state");
}

/// Runs `when`, asserts a rejection of `kind` whose message has every fragment and which changed nothing but
/// bookkeeping; returns the message.
#[track_caller]
pub fn refused(
    w: &mut World,
    when: impl FnOnce(&mut World) -> Outcome,
    kind: RejectionKind,
    fragments: &[&str],
) -> String {
    let before = w.state().clone();
    let outcome = when(w);
    assert_refusal(&before, w.state(), &outcome, kind, fragments)
}

#[track_caller]
fn assert_refusal(
    before: &PartitionState,
    after: &PartitionState,
    outcome: &Outcome,
    kind: RejectionKind,
    fragments: &[&str],
) -> String {
    let message = rejected(outcome, kind);
    for fragment in fragments {
        assert!(message.contains(fragment), "message {message:?} lacks {fragment:?}");
    }
    assert_same_except_bookkeeping(before, after);
    message.to_owned()
}

/// The name of a resource's state.
pub fn state_name(w: &World, id: ResourceId) -> &'static str {
    w.state().resource(id).expect("resource in state").state.name()
}

/// A rejection moves the cursor and partition time and may be remembered; nothing else changes.
#[track_caller]
pub fn assert_same_except_bookkeeping(before: &PartitionState, after: &PartitionState) {
    assert_eq!(before.next_position(), after.next_position(), "a rejection took a position");
    assert!(
        before.agents().eq(after.agents())
            && before.resources().eq(after.resources())
            && before.leases().eq(after.leases())
            && before.pools().eq(after.pools()),
        "a rejection changed state"
    );
}

/// A named check that may panic.
pub type NamedCheck = (&'static str, Box<dyn Fn()>);

/// Runs each named check and reports every failure together, each under its name.
pub fn all_hold(checks: Vec<NamedCheck>) {
    let mut failures = Vec::new();
    for (name, check) in checks {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{name}: {text}"));
        }
    }
    assert!(failures.is_empty(), "{} checks failed:\n{}", failures.len(), failures.join("\n"));
}

// --- pools: holders are numbered, so `given` and `when` can name the same one ---------------------------------------

/// Holder `n`: a resource on agent `w1` (the pool does not need to know it).
pub fn holder(n: u8) -> ResourceRef {
    ResourceRef::new(agent_name("w1"), ResourceId::from_parts(T0.0, [n; 10]))
}

/// Where holder `n`'s claim comes from: its `claim-wanted` effect, as the sweeper saw it.
pub fn source(n: u8) -> Source {
    Source { partition: 0, position: Position(1000 + u64::from(n)) }
}

pub fn addr(last: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 0, 0, last)
}

pub fn ip(last: u8) -> leasehold_schemas::pool::PoolValue {
    leasehold_schemas::pool::PoolValue::Ipv4(addr(last))
}
