//! An idle system for a simulated day: the log grows only by what heartbeats and changed reports need.
//!
//! Four partitions are decided in memory with the real `decide`/`apply`, the real sweeper plan
//! (`leasehold_sweeper::plan::plan`) and the sweeper's own resend pace (`leasehold_sweeper::backoff`). Three agents on
//! at least two partitions heartbeat at their pace, `min(10 s, stall_after / 4)`, with `stall_after` 60 s (the
//! policy's), 90 s and 180 s of their own. They hold resources in every state: a pool holder (active) and a holder
//! waiting for the pool's one slot (pending), an active resource with a lease, a paused one, two suspect ones (one
//! whose health check answers healthy, one whose check never returns), one releasing whose destroy never finishes,
//! one destroyed, one lost and one failed, and a child whose parent, on an agent of another partition, was never
//! allocated.
//!
//! How the agents are modelled: an agent acts at once on what its subject orders (it reports a create, a destroy
//! with `agent.report-destroyed`, a health check's result), and every 30 s (its sync pass) sends a sync report only
//! when its subject got a material change since its last report: an effect other than `observation-accepted`,
//! `resource-seen`, `agent-seen`, lease, garbage and driver-status effects (the agent runtime's own rule: they change
//! nothing a report answers). The sweeper plans whenever an
//! outcome was appended (as the running sweeper does) and sends each request due, a request still wanted again
//! after its 5 s retry and then less and less often, as the running sweeper does. Time jumps from one event to the
//! next (a heartbeat, a sync pass, a deadline, a resend).
//!
//! **The bound.** Over a day `D` of log time after the setup, the outcomes appended are at most
//!
//! ```text
//!   sum over agents of (ceil(D / (stall_after / 3)) + 1)      heartbeats: an `agent-seen` at most every third of
//!                                                              stall_after, +1 for where the day's edges fall
//! + SETTLING = 15                                             the one-time work the idle system still owes
//! ```
//!
//! where `SETTLING` is, item by item: the two suspects' health checks asked (2) and the one answer that comes (1);
//! the child's adoption answered `absent` (1), the answer carried back, which releases the child (1), and its agent's
//! destroy report (1); and the sync reports those six outcomes call for: an agent reports at most once per material
//! change on its subject (fewer when several fall within one sync interval), so at most one for each of the six
//! outcomes, each of which lands on an agent's subject, plus one per agent (3) for what the setup changed last and
//! no report has answered yet. With D = 24 h: 4,321 + 2,881 + 1,441 + 15 = 8,658. Nothing else may append: no
//! request the sweeper asks again and again (an adoption answered `not-yet-due` until the parent's id ages out would
//! be asked about 290 times a day at the sweeper's pace), no report from an agent with nothing new.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use leasehold_domain::state::ResourceState;
use leasehold_domain::{Ctx, Decided, PartitionState, apply, continue_work, decide};
use leasehold_schemas::command::{
    Acquire, Allocate, Cascade, DefinePool, FailureKind, HealthResult, Heartbeat, Pause, Register, Release,
    ReportCreated, ReportDestroyed, ReportFailure, SyncReport,
};
use leasehold_schemas::ids::{Key, LeaseId, Millis, PoolName, Position, ResourceRef, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{AgentName, Command, CommandId, Envelope, Issuer, Outcome, ResourceId, Uuid};
use leasehold_sweeper::plan::{self, Planned, States};

const PARTITIONS: u32 = 4;
const T0: u64 = 1_800_000_000_000;
const DAY: Millis = Millis::from_hours(24);
/// The agents' sync pass (the default `--sync-interval`).
const SYNC_INTERVAL: Millis = Millis::from_secs(30);
/// The agents' longest wait between heartbeats (the runtime's default).
const HEARTBEAT_INTERVAL: Millis = Millis::from_secs(10);
/// The sweeper's `--sweep-retry` default.
const SWEEP_RETRY: Duration = Duration::from_secs(5);
/// The one-time work the day may still append (see the module's documentation): 2 + 1 health checks, 1 + 1 + 1 for
/// the child, 6 + 3 sync reports.
const SETTLING: u64 = 15;

/// What a simulated agent does on its machine.
#[derive(Debug, Default)]
struct Machine {
    /// Creates that fail for good (`report-failure create-failed`).
    fail_create: BTreeSet<ResourceId>,
    /// Destroys that never finish.
    hang_destroy: BTreeSet<ResourceId>,
    /// Health checks that never return.
    hang_check: BTreeSet<ResourceId>,
}

/// An agent: its heartbeat and sync pace, its observation counter, and what it has reported.
struct Agent {
    name: AgentName,
    stall_after: Millis,
    epoch: Position,
    obs: u64,
    next_heartbeat: Timestamp,
    next_sync: Timestamp,
    /// The highest position of a material effect on its subject, and the highest one its reports have answered.
    material: Position,
    reported: Position,
    machine: Machine,
}

impl Agent {
    fn heartbeat_every(&self) -> Millis {
        Millis(HEARTBEAT_INTERVAL.0.min(self.stall_after.0 / 4))
    }
}

/// What an agent does at once about an effect on its subject.
#[derive(Debug)]
enum Act {
    Created(ResourceId),
    CreateFailed(ResourceId),
    Destroyed { resource: ResourceId, ordered: Position },
    Healthy { resource: ResourceId, request: Position },
}

/// Every partition of the cluster, its agents and a sweeper, at one log time.
struct World {
    states: States,
    cmd_seq: u64,
    now: Timestamp,
    ids: u64,
    answers: BTreeMap<ResourceRef, Cascade>,
    agents: BTreeMap<AgentName, Agent>,
    acts: VecDeque<(AgentName, Act)>,
    /// The sweeper's plan, made again whenever an outcome was appended since.
    planned: Vec<Planned>,
    dirty: bool,
    /// When the sweeper last sent each planned request, and how many times it has.
    sent: HashMap<String, (Timestamp, u32)>,
    /// Outcome parts appended, by command type.
    appended: BTreeMap<String, u64>,
}

impl World {
    fn new() -> World {
        World {
            states: (0..PARTITIONS).map(|p| (p, PartitionState::new(p, PARTITIONS))).collect(),
            cmd_seq: 0,
            now: Timestamp(T0),
            ids: 0,
            answers: BTreeMap::new(),
            agents: BTreeMap::new(),
            acts: VecDeque::new(),
            planned: Vec::new(),
            dirty: true,
            sent: HashMap::new(),
            appended: BTreeMap::new(),
        }
    }

    /// An id part no other id of the run has.
    fn entropy(&mut self) -> [u8; 10] {
        self.ids += 1;
        let mut entropy = [0u8; 10];
        entropy[2..].copy_from_slice(&self.ids.to_be_bytes());
        entropy
    }

    fn resource_id(&mut self) -> ResourceId {
        let entropy = self.entropy();
        ResourceId::from_parts(self.now.0, entropy)
    }

    fn total(&self) -> u64 {
        self.appended.values().sum()
    }

    /// Decides `body` from `issuer` now, with every part of a long decision, and lets the agents and the sweeper's
    /// view see what was appended.
    fn send(&mut self, issuer: &str, body: impl Into<Command>) {
        let body = body.into();
        let partition = partition_of_key(&body.key(), PARTITIONS);
        let id = CommandId::from_parts(self.now.0, self.entropy());
        let envelope = Envelope::new(id, Issuer::new(issuer).unwrap(), self.now, body);
        self.cmd_seq += 1;
        let ctx = Ctx { cmd_seq: self.cmd_seq, log_time: self.now };
        let Decided::Append(first) = decide(&self.states[&partition], &ctx, &envelope).unwrap() else { return };
        let mut next = Some(first);
        while let Some(outcome) = next {
            let state = self.states.get_mut(&partition).unwrap();
            apply(state, &outcome).unwrap();
            next = state.pending().is_some().then(|| continue_work(state).unwrap());
            *self.appended.entry(outcome.command.type_name.clone()).or_default() += 1;
            self.dirty = true;
            self.note(partition, &outcome);
        }
    }

    /// What the sweeper keeps beside the states (adoption answers), and what the outcome's agent learns and does.
    fn note(&mut self, partition: u32, outcome: &Outcome) {
        let Key::Agent(name) = &outcome.command.key else { return };
        for (position, effect) in outcome.positioned_effects() {
            if let Effect::ChildAdopted { parent, child, child_source, parent_state } = effect {
                let parent = ResourceRef::new(name.clone(), *parent);
                let answer = plan::adoption_answer(partition, position, &parent, child, *child_source, *parent_state);
                self.answers.insert(child.clone(), answer);
            }
            let Some(agent) = self.agents.get_mut(name) else { continue };
            // The agent runtime's own rule.
            if leasehold_agent::is_material(effect) {
                agent.material = agent.material.max(position);
            }
            let act = match effect {
                Effect::AgentRegistered { .. } => {
                    agent.epoch = position;
                    None
                }
                Effect::CreateOrdered { resource } if agent.machine.fail_create.contains(resource) => {
                    Some(Act::CreateFailed(*resource))
                }
                Effect::CreateOrdered { resource } => Some(Act::Created(*resource)),
                Effect::ResourceReleasing { resource, .. } if !agent.machine.hang_destroy.contains(resource) => {
                    Some(Act::Destroyed { resource: *resource, ordered: position })
                }
                Effect::HealthCheckRequested { resource } if !agent.machine.hang_check.contains(resource) => {
                    Some(Act::Healthy { resource: *resource, request: position })
                }
                _ => None,
            };
            if let Some(act) = act {
                self.acts.push_back((name.clone(), act));
            }
        }
    }

    fn next_obs(&mut self, name: &AgentName) -> (Position, u64) {
        let agent = self.agents.get_mut(name).unwrap();
        agent.obs += 1;
        (agent.epoch, agent.obs)
    }

    /// The agents do what their subjects ordered, until nothing more is ordered.
    fn act(&mut self) {
        while let Some((name, act)) = self.acts.pop_front() {
            let (epoch, obs) = self.next_obs(&name);
            let agent = name.clone();
            match act {
                Act::Created(resource) => {
                    self.send(name.as_str(), ReportCreated { agent, epoch, obs, resource, native_id: None })
                }
                Act::CreateFailed(resource) => {
                    let failure = FailureKind::CreateFailed;
                    let detail = "image not found".to_owned();
                    self.send(name.as_str(), ReportFailure { agent, epoch, obs, resource, failure, detail })
                }
                Act::Destroyed { resource, ordered } => {
                    self.send(name.as_str(), ReportDestroyed { agent, epoch, obs, resource, ordered })
                }
                Act::Healthy { resource, request } => {
                    let detail = String::new();
                    let body = HealthResult { agent, epoch, obs, resource, request, healthy: true, detail };
                    self.send(name.as_str(), body)
                }
            }
        }
    }

    /// One pass of the sweeper: plans if anything was appended since its last plan, and sends every request due
    /// that it has not sent within its backoff. Answers how many it sent.
    fn sweep(&mut self) -> usize {
        if self.dirty {
            self.planned = plan::plan(&self.states, &self.answers);
            self.dirty = false;
            let keys: BTreeSet<&str> = self.planned.iter().map(|p| p.key.as_str()).collect();
            self.sent.retain(|key, _| keys.contains(key.as_str()));
        }
        let now = self.now;
        let due: Vec<Planned> = self
            .planned
            .iter()
            .filter(|p| p.due.is_none_or(|at| at <= now))
            .filter(|p| self.sent.get(&p.key).is_none_or(|(at, n)| resend_at(*at, *n) <= now))
            .cloned()
            .collect();
        for item in &due {
            self.send("sweeper:idle", item.command.clone());
            let sent = self.sent.entry(item.key.clone()).or_insert((now, 0));
            *sent = (now, sent.1 + 1);
            self.act();
        }
        due.len()
    }

    /// Everything that happens at this instant: heartbeats due, the agents' acts and the sweeper's passes until
    /// neither has anything more to do, then the sync passes due.
    fn step(&mut self) {
        let now = self.now;
        let beating: Vec<AgentName> =
            self.agents.values().filter(|a| a.next_heartbeat <= now).map(|a| a.name.clone()).collect();
        for name in beating {
            let agent = &self.agents[&name];
            let body = Heartbeat { agent: name.clone(), epoch: agent.epoch };
            let every = agent.heartbeat_every();
            self.send(name.as_str(), body);
            let agent = self.agents.get_mut(&name).unwrap();
            agent.next_heartbeat = agent.next_heartbeat.saturating_add(every);
        }
        loop {
            self.act();
            if self.sweep() == 0 {
                break;
            }
        }
        let syncing: Vec<AgentName> =
            self.agents.values().filter(|a| a.next_sync <= now).map(|a| a.name.clone()).collect();
        for name in syncing {
            let agent = self.agents.get_mut(&name).unwrap();
            agent.next_sync = agent.next_sync.saturating_add(SYNC_INTERVAL);
            if agent.material > agent.reported {
                self.sync(&name, vec![]);
            }
        }
    }

    /// A sync report of `name`: what it holds as the writer expects it, but for `missing`.
    fn sync(&mut self, name: &AgentName, missing: Vec<ResourceId>) {
        let (epoch, obs) = self.next_obs(name);
        let state = &self.states[&partition_of_agent(name, PARTITIONS)];
        let mut report = SyncReport::new(name.clone(), epoch, obs, state.last_position());
        report.missing = missing;
        let (count, digest) = leasehold_domain::expected_listing(state, &report).expect("an honest report");
        (report.count, report.digest) = (count, digest);
        let agent = self.agents.get_mut(name).unwrap();
        agent.reported = agent.material;
        self.send(name.as_str(), report);
        self.act();
    }

    /// When anything next happens: a heartbeat, a sync pass, a deadline, a request sent again.
    fn next_event(&mut self) -> Timestamp {
        if self.dirty {
            self.sweep();
        }
        let mut next = Timestamp(u64::MAX);
        for agent in self.agents.values() {
            next = next.min(agent.next_heartbeat).min(agent.next_sync);
        }
        for item in &self.planned {
            let at = match (item.due, self.sent.get(&item.key)) {
                (Some(due), _) if due > self.now => due,
                (_, Some((at, n))) => resend_at(*at, *n),
                (_, None) => self.now,
            };
            next = next.min(at);
        }
        assert!(next > self.now, "the sweeper left a request due now unsent: {:#?}", self.planned);
        next
    }

    fn run_until(&mut self, end: Timestamp) {
        while self.now < end {
            self.step();
            self.now = self.next_event().min(end);
        }
        self.step();
    }

    fn register(&mut self, name: &str, own_stall_after: Option<Millis>) -> AgentName {
        let name = AgentName::new(name).unwrap();
        let settings = own_stall_after.map(|stall_after| AgentSettings { stall_after, ..AgentSettings::DEFAULT });
        let stall_after = own_stall_after.unwrap_or(AgentSettings::DEFAULT.stall_after);
        let agent = Agent {
            name: name.clone(),
            stall_after,
            epoch: Position::ZERO,
            obs: 0,
            next_heartbeat: self.now,
            next_sync: self.now.saturating_add(SYNC_INTERVAL),
            material: Position::ZERO,
            reported: Position::ZERO,
            machine: Machine::default(),
        };
        let next_heartbeat = self.now.saturating_add(agent.heartbeat_every());
        self.agents.insert(name.clone(), Agent { next_heartbeat, ..agent });
        let body = Register {
            agent: name.clone(),
            incarnation: Uuid::from_u128(self.ids.into()),
            wiped: false,
            settings,
            labels: Default::default(),
            capacity: Default::default(),
        };
        self.send(name.as_str(), body);
        name
    }

    fn allocate(&mut self, agent: &AgentName, pools: &[&PoolName], parent: Option<ResourceRef>) -> ResourceId {
        let id = self.resource_id();
        let mut body = Allocate::new(agent.clone(), id, "container", 1);
        body.pools = pools.iter().map(|p| (*p).clone()).collect();
        body.parent = parent;
        self.send("op:ci", body);
        self.act();
        id
    }

    fn state_of(&self, agent: &AgentName, resource: ResourceId) -> &ResourceState {
        let state = &self.states[&partition_of_agent(agent, PARTITIONS)];
        &state.resource(resource).unwrap_or_else(|| panic!("{agent}.{resource} is known")).state
    }
}

/// When a request sent `n` times, last at `at`, is sent again by the sweeper.
fn resend_at(at: Timestamp, n: u32) -> Timestamp {
    at.saturating_add(Millis(leasehold_sweeper::backoff(SWEEP_RETRY, n).as_millis() as u64))
}

/// Agent names: `a` and `p` in two partitions, `b` in any, none in the pool's partition (not needed, but it keeps
/// the pool's outcomes apart from the agents').
fn names(pool: &PoolName) -> (String, String, String) {
    let home = |n: &str| partition_of_agent(&AgentName::new(n).unwrap(), PARTITIONS);
    let pool_home = partition_of_key(&Key::Pool(pool.clone()), PARTITIONS);
    let candidates: Vec<String> = (1..200).map(|n| format!("w{n}")).filter(|n| home(n) != pool_home).collect();
    let a = candidates[0].clone();
    let p = candidates.iter().find(|n| home(n) != home(&a)).unwrap().clone();
    let b = candidates.iter().find(|n| **n != a && **n != p).unwrap().clone();
    (a, b, p)
}

#[test]
fn an_idle_day_appends_no_more_than_heartbeats_and_changed_reports_need() {
    let mut world = World::new();
    let pool = PoolName::new("net").unwrap();
    let (a, b, p) = names(&pool);
    let a = world.register(&a, None);
    let b = world.register(&b, Some(Millis::from_secs(90)));
    let p = world.register(&p, Some(Millis::from_secs(180)));
    world.send(
        "op:netops",
        DefinePool {
            pool: pool.clone(),
            kind: PoolKind::Slots { count: 1 },
            cooldown: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        },
    );

    // The setup: every state, settled (claims carried, creates reported, reports sent) for two minutes.
    let holder = world.allocate(&a, &[&pool], None);
    world.step();
    let waiter = world.allocate(&a, &[&pool], None);
    let active = world.allocate(&a, &[], None);
    let lease = LeaseId::from_parts(world.now.0, world.entropy());
    let acquire = Acquire {
        agent: a.clone(),
        resource: active,
        lease,
        holder: "build-7".into(),
        ttl: None,
        wait_timeout: None,
        priority: 0,
    };
    world.send("op:ci", acquire);
    let paused = world.allocate(&a, &[], None);
    world.send("op:ops", Pause { agent: a.clone(), resource: paused, reason: Some("maintenance".into()), until: None });
    let destroyed = world.allocate(&a, &[], None);
    world.send("op:ci", Release { agent: a.clone(), resource: destroyed, reason: None });
    world.act();
    let failed = world.resource_id();
    world.agents.get_mut(&a).unwrap().machine.fail_create.insert(failed);
    world.send("op:ci", Allocate::new(a.clone(), failed, "vm", 1));
    world.act();
    let releasing = world.allocate(&b, &[], None);
    world.agents.get_mut(&b).unwrap().machine.hang_destroy.insert(releasing);
    world.send("op:ci", Release { agent: b.clone(), resource: releasing, reason: None });
    let lost = world.allocate(&b, &[], None);
    world.sync(&b, vec![lost]);
    let healthy_again = world.allocate(&a, &[], None);
    let hanging_check = world.allocate(&b, &[], None);
    world.agents.get_mut(&b).unwrap().machine.hang_check.insert(hanging_check);
    world.run_until(world.now.saturating_add(Millis::from_secs(120)));

    // The last of the setup: two resources turn suspect, and a child names a parent that was never allocated.
    for (agent, resource) in [(&a, healthy_again), (&b, hanging_check)] {
        let (epoch, obs) = world.next_obs(agent);
        let failure = FailureKind::Unhealthy;
        let detail = "probe failed".to_owned();
        world.send(agent.as_str(), ReportFailure { agent: agent.clone(), epoch, obs, resource, failure, detail });
    }
    let never = ResourceRef::new(p.clone(), world.resource_id());
    let child = world.allocate(&a, &[], Some(never));
    let expected_states = [
        (&a, holder, "active"),
        (&a, waiter, "pending"),
        (&a, active, "active"),
        (&a, paused, "paused"),
        (&a, destroyed, "destroyed"),
        (&a, failed, "failed"),
        (&b, releasing, "releasing"),
        (&b, lost, "lost"),
        (&a, healthy_again, "suspect"),
        (&b, hanging_check, "suspect"),
        (&a, child, "active"),
    ];
    for (agent, resource, state) in expected_states {
        assert_eq!(world.state_of(agent, resource).name(), state, "{agent}.{resource} after the setup");
    }

    // The day.
    let before = world.appended.clone();
    let start = world.now;
    world.run_until(start.saturating_add(DAY));
    let during: BTreeMap<&str, u64> = world
        .appended
        .iter()
        .map(|(kind, n)| (kind.as_str(), n - before.get(kind).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();

    let heartbeats: u64 = world.agents.values().map(|agent| DAY.0.div_ceil(agent.stall_after.0 / 3) + 1).sum();
    let appended: u64 = during.values().sum();
    let bound = heartbeats + SETTLING;
    println!("appended in a day: {appended} (bound {bound} = {heartbeats} heartbeats + {SETTLING}): {during:#?}");
    assert!(
        during.get("agent.heartbeat").copied().unwrap_or(0) <= heartbeats,
        "more heartbeat outcomes than an agent-seen every third of stall_after: {during:#?}"
    );
    assert!(appended <= bound, "an idle day appended {appended} outcomes, more than {bound}: {during:#?}");
    // The one-time work was done.
    assert_eq!(world.state_of(&a, child).name(), "destroyed", "the child of a parent never allocated is gone");
    assert_eq!(world.state_of(&a, healthy_again).name(), "active", "its health check passed");
    assert!(
        matches!(world.state_of(&b, hanging_check), ResourceState::Suspect { asked: Some(_), .. }),
        "the check that never returns was asked once and waits"
    );
    assert_eq!(world.state_of(&a, waiter).name(), "pending", "the waiter still waits for the pool's slot");

    assert_eq!(world.total(), before.values().sum::<u64>() + appended);
}
