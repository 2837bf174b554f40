//! Why this exists: table tests check one decision at a time; the promises of DESIGN sections 3-7 (nothing held twice,
//! nothing freed early, terminal is final, state is a deterministic fold) must hold over any interleaving. So: random
//! command sequences from several issuers with skewed clocks, over a universe small enough that commands collide,
//! checked after every step against those promises and small reference models.
//!
//! A scenario is a list of abstract steps (time moves, an action with small selectors). The runner interprets each
//! step against the live state (which resource, which lease, which sweeper follow-up), builds one envelope, decides it
//! on two fresh drivers in lockstep and checks, after every outcome:
//!
//! 1. no pool identifier is bound to two live resources, and every live binding is what the pool holds;
//! 2. live leases stay within capacity (reference model folded from the outcomes, compared with state);
//! 3. terminal resources and leases never change while they stay in state;
//! 4. claims go back only with a terminal state reached by an observation or the orphan rule (or a bind-claim that
//!    arrives too late), and a pool frees only a claim its holder gave back with that token;
//! 5. folding every outcome from scratch gives the live state;
//! 6. deciding the same envelopes twice gives the same outcomes;
//! 7. `invariants::check` passes;
//! 8. pools agree with a reference model: grants go to the first waiter, never to a held identifier, never before
//!    the cool-down, in the promised order, and nobody waits while an identifier is free after a serving command.
//!
//! A second test feeds two agents an endless stream of heartbeats and reports and checks that state stays bounded.

mod support;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::Ipv4Addr;

use leasehold_domain::driver::Driver;
use leasehold_domain::state::{ClaimSlot, Holding, LeaseState, Liveness, PartitionState, ResourceState};
use leasehold_domain::{follow_ups, invariants};
use leasehold_schemas::command::*;
use leasehold_schemas::ids::*;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::{AgentSettings, PartitionSettings};
use leasehold_schemas::{Command, Envelope, Outcome, RejectionKind, Uuid};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use support::{T0, accepted, agent_name, pool_name, secs};

// =================================================================================================================
// The universe: few agents, few ids, few identifiers, so that commands collide.

/// Cases per run and the longest scenario: about 8 s in debug.
const CASES: u32 = 256;
const MAX_STEPS: usize = 150;
/// Who sends `op` and `sys` commands (agents send under their own names).
const OPS: &[&str] = &["op:alice", "op:bob", "op:ci-scheduler"];
const SWEEPERS: &[&str] = &["sweeper-1", "sweeper-2"];
/// A pool nobody defines: allocations naming it wait forever, claims to it are refused.
const GHOST_POOL: &str = "ghost";
/// The outcome horizons a scenario switches between, and the shortest of them.
const HORIZONS: [Millis; 3] = [Millis::from_hours(1), Millis::from_hours(6), Millis::from_hours(24)];
const MIN_HORIZON: Millis = Millis::from_hours(1);
/// The sweeper model keeps this many follow-ups on offer; older ones are dropped (a sweeper that forgot).
const FOLLOW_UP_QUEUE: usize = 64;
/// Ids are drawn from a fixed set per generation of log time, so that they stay younger than the outcome horizon
/// (allocate and acquire refuse older ids) while colliding within a generation.
const GENERATION: u64 = 30 * 60 * 1000;
const N_RESOURCE_IDS: u8 = 6;
const N_LEASE_IDS: u8 = 8;

fn generation_of(clock: Timestamp) -> u64 {
    clock.0.saturating_sub(T0.0) / GENERATION
}

/// One millisecond before the generation starts: always older than any log time of the generation.
fn generation_time(generation: u64) -> u64 {
    T0.0 + generation * GENERATION - 1
}

fn entropy(tag: u8, generation: u64, index: u8) -> [u8; 10] {
    let mut entropy = [0u8; 10];
    entropy[0] = tag;
    entropy[1..9].copy_from_slice(&generation.to_be_bytes());
    entropy[9] = index;
    entropy
}

fn agent_settings(choice: u8) -> AgentSettings {
    match choice % 4 {
        0 => AgentSettings {
            max_loss_min: 2,
            max_loss_percent: 50,
            loss_window: Millis::from_mins(10),
            create_timeout: Millis::from_mins(5),
            stall_after: secs(60),
            orphan_after: Millis::from_mins(20),
        },
        1 => AgentSettings {
            max_loss_min: 1,
            max_loss_percent: 0,
            loss_window: Millis::from_mins(5),
            create_timeout: Millis::from_mins(2),
            stall_after: secs(30),
            orphan_after: Millis::from_mins(5),
        },
        2 => AgentSettings::default(),
        // Invalid (orphan_after not after stall_after): rejected.
        _ => AgentSettings {
            stall_after: Millis::from_mins(10),
            orphan_after: Millis::from_mins(10),
            ..Default::default()
        },
    }
}

// =================================================================================================================
// What proptest generates: abstract steps, interpreted against the live state.

#[derive(Debug, Clone)]
struct Scenario {
    n_agents: usize,
    settings: Vec<u8>,
    pools: Vec<PoolSpec>,
    steps: Vec<Step>,
}

#[derive(Debug, Clone)]
struct PoolSpec {
    slots: bool,
    size: u32,
    cooldown_s: u64,
}

impl PoolSpec {
    fn kind(&self) -> PoolKind {
        match (self.slots, self.size) {
            (true, count) => PoolKind::Slots { count },
            (false, 1) => PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 2, 7), prefix_len: 32, exclude: vec![] },
            (false, 2) => PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![] },
            (false, _) => PoolKind::Ipv4 {
                network: Ipv4Addr::new(10, 0, 1, 0),
                prefix_len: 29,
                exclude: vec![Ipv4Addr::new(10, 0, 1, 4), Ipv4Addr::new(10, 0, 1, 5), Ipv4Addr::new(10, 0, 1, 6)],
            },
        }
    }
}

#[derive(Debug, Clone)]
struct Step {
    clock: Clock,
    /// Issuer time = log time + this many seconds.
    skew_s: i16,
    /// Picks the issuer among several of the class (and, rarely, a wrong one for an agent command).
    who: u8,
    act: Act,
}

#[derive(Debug, Clone)]
enum Clock {
    Same,
    /// Forward by this many ms.
    Forward(u32),
    /// Forward by this many seconds (minutes to hours).
    Long(u32),
    /// The log clock steps back by this many ms (a new stream leader).
    Back(u32),
}

#[derive(Debug, Clone, Copy)]
enum Tok {
    Right,
    Wrong,
    Nothing,
}

#[derive(Debug, Clone, Copy)]
enum Obs {
    Next,
    Same,
    Skip,
    OldEpoch,
}

#[derive(Debug, Clone, Copy)]
enum Wm {
    Last,
    Lag(u8),
    Zero,
    Beyond,
}

#[derive(Debug, Clone)]
enum Act {
    Register {
        agent: u8,
        wiped: bool,
        settings: u8,
    },
    Heartbeat {
        agent: u8,
        stale: bool,
    },
    Allocate {
        agent: u8,
        res: u8,
        pools: u8,
        parent: Option<u8>,
        capacity: u8,
    },
    Acquire {
        res: u8,
        lease: u8,
        agent: Option<u8>,
        ttl_s: Option<u16>,
        wait_s: Option<u16>,
    },
    Renew {
        lease: u8,
        tok: Tok,
        ttl_s: Option<u16>,
    },
    ReleaseLease {
        lease: u8,
        tok: Tok,
    },
    Release {
        res: u8,
    },
    Pause {
        res: u8,
        until_s: Option<u16>,
    },
    Unpause {
        res: u8,
    },
    Update {
        res: u8,
        capacity: Option<u8>,
        set: bool,
    },
    OpFailure {
        res: u8,
    },
    Retire {
        agent: u8,
    },
    ConfirmLoss {
        agent: u8,
    },
    DefinePool {
        which: u8,
    },
    Horizon {
        which: u8,
    },
    ReportCreated {
        res: u8,
        obs: Obs,
    },
    /// Each mark is (what the report says, which handle).
    Sync {
        agent: u8,
        marks: Vec<(u8, u8)>,
        wm: Wm,
        honest: bool,
        obs: Obs,
    },
    Chunk {
        agent: u8,
        lo: u8,
        hi: u8,
        marks: Vec<(u8, u8)>,
        wm: Wm,
        obs: Obs,
    },
    AgentFailure {
        res: u8,
        create_failed: bool,
        obs: Obs,
    },
    Health {
        res: u8,
        healthy: bool,
        obs: Obs,
    },
    /// The sweeper sends a follow-up it learnt from an outcome (claim, bind-claim, free, cascade).
    FollowUp {
        pick: u8,
        keep: bool,
    },
    /// The sweeper sends a time-driven command it read off the state (due or not).
    Timer {
        kind: u8,
        pick: u8,
    },
    /// A confused sweeper: claims and frees that no effect asked for, cascades with made-up sources.
    Junk {
        kind: u8,
        a: u8,
        b: u8,
    },
    /// An envelope sent before, sent again.
    Retry {
        pick: u8,
    },
}

fn obs() -> impl Strategy<Value = Obs> {
    prop_oneof![12 => Just(Obs::Next), 1 => Just(Obs::Same), 1 => Just(Obs::Skip), 1 => Just(Obs::OldEpoch)]
}

fn wm() -> impl Strategy<Value = Wm> {
    prop_oneof![10 => Just(Wm::Last), 4 => (1u8..20).prop_map(Wm::Lag), 1 => Just(Wm::Zero), 1 => Just(Wm::Beyond)]
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![6 => Just(Tok::Right), 1 => Just(Tok::Wrong), 1 => Just(Tok::Nothing)]
}

fn act() -> impl Strategy<Value = Act> {
    let agent = || 0u8..3;
    let sel = any::<u8>;
    let secs_opt = |p: f64| prop::option::weighted(p, 1u16..600);
    let marks = |kinds: u8| prop::collection::vec((0u8..kinds, any::<u8>()), 0..6);
    prop_oneof![
        4 => (agent(), prop::bool::weighted(0.3), 0u8..4)
            .prop_map(|(agent, wiped, settings)| Act::Register { agent, wiped, settings }),
        28 => (agent(), prop::bool::weighted(0.05)).prop_map(|(agent, stale)| Act::Heartbeat { agent, stale }),
        20 => (
            agent(),
            sel(),
            prop_oneof![5 => Just(0u8), 3 => Just(1), 2 => Just(2), 1 => Just(3), 1 => 4u8..8],
            prop::option::weighted(0.3, sel()),
            prop_oneof![1 => Just(0u8), 4 => 1u8..3, 1 => Just(3)],
        )
            .prop_map(|(agent, res, pools, parent, capacity)| Act::Allocate { agent, res, pools, parent, capacity }),
        18 => (sel(), sel(), prop::option::weighted(0.05, agent()), secs_opt(0.6), secs_opt(0.5))
            .prop_map(|(res, lease, agent, ttl_s, wait_s)| Act::Acquire { res, lease, agent, ttl_s, wait_s }),
        8 => (sel(), tok(), secs_opt(0.5)).prop_map(|(lease, tok, ttl_s)| Act::Renew { lease, tok, ttl_s }),
        8 => (sel(), tok()).prop_map(|(lease, tok)| Act::ReleaseLease { lease, tok }),
        6 => sel().prop_map(|res| Act::Release { res }),
        4 => (sel(), prop::option::weighted(0.6, 0u16..900)).prop_map(|(res, until_s)| Act::Pause { res, until_s }),
        3 => sel().prop_map(|res| Act::Unpause { res }),
        3 => (sel(), prop::option::weighted(0.5, 0u8..4), any::<bool>())
            .prop_map(|(res, capacity, set)| Act::Update { res, capacity, set }),
        4 => sel().prop_map(|res| Act::OpFailure { res }),
        1 => agent().prop_map(|agent| Act::Retire { agent }),
        2 => agent().prop_map(|agent| Act::ConfirmLoss { agent }),
        1 => (0u8..3).prop_map(|which| Act::DefinePool { which }),
        1 => (0u8..3).prop_map(|which| Act::Horizon { which }),
        14 => (sel(), obs()).prop_map(|(res, obs)| Act::ReportCreated { res, obs }),
        22 => (agent(), marks(32), wm(), prop::bool::weighted(0.85), obs())
            .prop_map(|(agent, marks, wm, honest, obs)| Act::Sync { agent, marks, wm, honest, obs }),
        5 => (agent(), sel(), sel(), marks(8), wm(), obs())
            .prop_map(|(agent, lo, hi, marks, wm, obs)| Act::Chunk { agent, lo, hi, marks, wm, obs }),
        6 => (sel(), prop::bool::weighted(0.5), obs())
            .prop_map(|(res, create_failed, obs)| Act::AgentFailure { res, create_failed, obs }),
        6 => (sel(), any::<bool>(), obs()).prop_map(|(res, healthy, obs)| Act::Health { res, healthy, obs }),
        48 => (sel(), prop::bool::weighted(0.3)).prop_map(|(pick, keep)| Act::FollowUp { pick, keep }),
        22 => (0u8..9, sel()).prop_map(|(kind, pick)| Act::Timer { kind, pick }),
        // Busy on purpose: made-up claims once hid a double holding (a bind of a grant that answered an earlier
        // claim of the same holder), which this keeps finding if it comes back.
        30 =>
            (0u8..4, sel(), sel()).prop_map(|(kind, a, b)| Act::Junk { kind, a, b }),
        4 => sel().prop_map(|pick| Act::Retry { pick }),
    ]
}

fn clock() -> impl Strategy<Value = Clock> {
    prop_oneof![
        6 => Just(Clock::Same),
        28 => (0u32..=30_000).prop_map(Clock::Forward),
        8 => (30_000u32..=300_000).prop_map(Clock::Forward),
        1 => (600u32..=3 * 3600).prop_map(Clock::Long),
        2 => (0u32..=120_000).prop_map(Clock::Back),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (clock(), prop_oneof![2 => Just(0i16), 3 => -600i16..=600], any::<u8>(), act())
        .prop_map(|(clock, skew_s, who, act)| Step { clock, skew_s, who, act })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let pool = (
        any::<bool>(),
        prop_oneof![1 => Just(1u32), 3 => 2u32..=3],
        prop_oneof![Just(0u64), Just(5), Just(30), Just(60)],
    )
        .prop_map(|(slots, size, cooldown_s)| PoolSpec { slots, size, cooldown_s });
    (
        2usize..=3,
        prop::collection::vec(0u8..3, 3),
        prop::collection::vec(pool, 1..=2),
        prop::collection::vec(step(), 1..MAX_STEPS),
    )
        .prop_map(|(n_agents, settings, pools, steps)| Scenario { n_agents, settings, pools, steps })
}

// =================================================================================================================
// The reference models and the checks.

const PROPERTY_NAMES: [&str; 9] = [
    "",
    "1 (no identifier held by two live holders)",
    "2 (live leases within capacity)",
    "3 (terminal states never change)",
    "4 (claims freed only on terminal observations)",
    "5 (rebuild equals the live state)",
    "6 (deciding twice gives the same outcomes)",
    "7 (structural invariants)",
    "8 (pool reference model)",
];

type Violation = (usize, String);

fn violation<T>(property: usize, message: impl Into<String>) -> Result<T, Violation> {
    Err((property, message.into()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Pending,
    Active,
    Paused,
    /// Remembers whether it was paused: a healthy result goes back to that.
    Suspect {
        was_paused: bool,
    },
    Releasing,
    Terminal,
}

#[derive(Debug)]
struct ResourceModel {
    capacity: u32,
    life: Life,
    live: BTreeSet<LeaseId>,
}

#[derive(Debug)]
struct PoolModel {
    values: Vec<PoolValue>,
    cooldown: Millis,
    used: BTreeSet<PoolValue>,
    held: BTreeMap<PoolValue, (ResourceRef, Position)>,
    /// `Some((value, token))` when granted, `None` while waiting.
    holders: BTreeMap<ResourceRef, Option<(PoolValue, Position)>>,
    queue: VecDeque<ResourceRef>,
    cooling: BTreeMap<(Timestamp, Position), PoolValue>,
    /// The claim (its source) each holder made, while it holds or waits.
    claimed_from: BTreeMap<ResourceRef, Source>,
    /// Holders whose claim ended: when, and the source of that claim.
    released: BTreeMap<ResourceRef, (Timestamp, Source)>,
}

impl PoolModel {
    fn new(kind: &PoolKind, cooldown: Millis) -> Self {
        PoolModel {
            values: (0..kind.size()).filter_map(|idx| kind.value_at(idx)).collect(),
            cooldown,
            used: BTreeSet::new(),
            held: BTreeMap::new(),
            holders: BTreeMap::new(),
            queue: VecDeque::new(),
            cooling: BTreeMap::new(),
            claimed_from: BTreeMap::new(),
            released: BTreeMap::new(),
        }
    }

    /// What the pool must hand out next at `now`: never-used identifiers first (in order), then the least recently
    /// freed one whose cool-down has passed (with no cool-down, one freed by the decision being checked too).
    fn next_available(&self, now: Timestamp) -> Option<PoolValue> {
        if let Some(fresh) = self.values.iter().find(|v| !self.used.contains(v)) {
            return Some(*fresh);
        }
        let ((freed_at, _), value) = self.cooling.iter().next()?;
        (freed_at.saturating_add(self.cooldown) <= now).then_some(*value)
    }

    fn freed_at(&self, value: &PoolValue) -> Option<Timestamp> {
        self.cooling.iter().find(|(_, v)| *v == value).map(|((t, _), _)| *t)
    }
}

/// What the pool model expects of a pool command's outcome.
#[derive(Debug)]
enum Expect {
    Anything,
    Rejected(Option<RejectionKind>),
    /// Accepted, with a grant to or a queueing of this holder.
    Served(ResourceRef),
    Freed(ResourceRef, PoolValue, Position),
    Withdrawn(ResourceRef),
    Accepted,
}

#[derive(Debug, Default)]
struct Checker {
    resources: BTreeMap<ResourceId, ResourceModel>,
    leases: BTreeMap<LeaseId, ResourceId>,
    terminal_resources: BTreeMap<ResourceId, ResourceState>,
    terminal_leases: BTreeMap<LeaseId, LeaseState>,
    /// Claims given back: (pool, holder, token) -> value.
    releasable: BTreeMap<(PoolName, ResourceRef, Position), Option<PoolValue>>,
    pools: BTreeMap<PoolName, PoolModel>,
}

fn is_terminal_effect(effect: &Effect) -> Option<ResourceId> {
    match effect {
        Effect::ResourceDestroyed { resource, .. }
        | Effect::ResourceLost { resource, .. }
        | Effect::ResourceOrphaned { resource }
        | Effect::ResourceFailed { resource, .. } => Some(*resource),
        _ => None,
    }
}

impl Checker {
    /// Checks one outcome against the state before it, and folds it into the models.
    fn outcome(&mut self, pre: &PartitionState, envelope: &Envelope, o: &Outcome) -> Result<(), Violation> {
        self.claims_returned(pre, o)?;
        self.leases_within_capacity(o)?;
        self.pool_model(pre, envelope, o)
    }

    /// Property 4.
    fn claims_returned(&mut self, pre: &PartitionState, o: &Outcome) -> Result<(), Violation> {
        let ty = o.command.type_name.as_str();
        let terminal_here: BTreeSet<ResourceId> = o.effects().iter().filter_map(is_terminal_effect).collect();
        for (position, effect) in o.positioned_effects() {
            match effect {
                Effect::ResourceDestroyed { resource, .. } | Effect::ResourceLost { resource, .. }
                    if !matches!(ty, "agent.sync" | "agent.resync-chunk" | "sys.continue") =>
                {
                    return violation(
                        4,
                        format!("{} of {resource} decided by {ty}, not an observation", effect.name()),
                    );
                }
                Effect::ResourceFailed { resource, .. } if !matches!(ty, "agent.report-failure" | "sys.continue") => {
                    return violation(4, format!("resource-failed of {resource} decided by {ty}, not an observation"));
                }
                Effect::ResourceOrphaned { resource }
                    if !matches!(ty, "sys.mark-gone" | "sys.orphan" | "sys.continue") =>
                {
                    return violation(
                        4,
                        format!("resource-orphaned of {resource} decided by {ty}, not the orphan rule"),
                    );
                }
                Effect::ClaimReleasable { resource, pool, value, token } => {
                    let Key::Agent(agent) = &o.command.key else {
                        return violation(4, format!("claim-releasable at {position} in an outcome about a pool"));
                    };
                    let before = pre.resource(*resource).filter(|r| r.agent == *agent);
                    // A bind may also send back a grant that is not the live resource's own (an earlier life's,
                    // a confused sweeper's): that returns nothing the resource holds.
                    let holds_it = |r: &leasehold_domain::state::Resource| matches!(r.claims.get(pool), Some(ClaimSlot::Bound { token: t, .. }) if Some(*t) == *token);
                    let allowed = match before {
                        Some(r) => {
                            terminal_here.contains(resource)
                                || (ty == "sys.bind-claim" && (r.state.is_terminal() || !holds_it(r)))
                        }
                        None => ty == "sys.bind-claim",
                    };
                    if !allowed {
                        let was = before.map(|r| r.state.name()).unwrap_or("unknown");
                        return violation(
                            4,
                            format!(
                                "claim-releasable for {agent}.{resource} on {pool} at {position} by {ty}, while it \
                                 was {was} and no terminal effect for it is in the outcome"
                            ),
                        );
                    }
                    if let Some(token) = token {
                        let holder = ResourceRef::new(agent.clone(), *resource);
                        self.releasable.insert((pool.clone(), holder, *token), *value);
                    }
                }
                Effect::ClaimFreed { holder, value, token } => {
                    let Key::Pool(pool) = &o.command.key else {
                        return violation(4, format!("claim-freed at {position} in an outcome about an agent"));
                    };
                    match self.releasable.get(&(pool.clone(), holder.clone(), *token)) {
                        Some(given) if given.is_none_or(|v| v == *value) => {}
                        other => {
                            return violation(
                                4,
                                format!(
                                    "pool {pool} freed {value} of {holder} with token {token}, but the holder gave \
                                     back {other:?} with that token"
                                ),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Property 2, against a model of resources and live leases folded from the outcomes.
    fn leases_within_capacity(&mut self, o: &Outcome) -> Result<(), Violation> {
        for (position, effect) in o.positioned_effects() {
            let mut touched = None;
            match effect {
                Effect::ResourceAllocated { resource, capacity, .. } => {
                    let model = ResourceModel { capacity: *capacity, life: Life::Pending, live: BTreeSet::new() };
                    self.resources.insert(*resource, model);
                }
                Effect::ResourceUpdated { resource, capacity: Some(capacity), .. } => {
                    if let Some(model) = self.resources.get_mut(resource) {
                        model.capacity = *capacity;
                        touched = Some(*resource);
                    }
                }
                Effect::ResourceActivated { resource, .. } | Effect::ResourceUnpaused { resource, .. } => {
                    self.set_life(*resource, Life::Active)
                }
                Effect::ResourceHealthy { resource } => {
                    let was_paused =
                        self.resources.get(resource).map(|m| m.life) == Some(Life::Suspect { was_paused: true });
                    self.set_life(*resource, if was_paused { Life::Paused } else { Life::Active });
                }
                Effect::ResourcePaused { resource, .. } => self.set_life(*resource, Life::Paused),
                Effect::ResourceSuspect { resource, .. } => {
                    let was_paused = self.resources.get(resource).map(|m| m.life) == Some(Life::Paused);
                    self.set_life(*resource, Life::Suspect { was_paused });
                }
                Effect::ResourceReleasing { resource, .. } => self.set_life(*resource, Life::Releasing),
                Effect::LeaseWaiting { lease, resource, .. } | Effect::LeaseGranted { lease, resource, .. } => {
                    let waiting = matches!(effect, Effect::LeaseWaiting { .. });
                    let Some(model) = self.resources.get_mut(resource) else {
                        return violation(2, format!("{} at {position} on unknown resource {resource}", effect.name()));
                    };
                    let want = if waiting { Life::Pending } else { Life::Active };
                    if model.life != want {
                        return violation(
                            2,
                            format!(
                                "{} of {lease} at {position} on {resource}, which is {:?}",
                                effect.name(),
                                model.life
                            ),
                        );
                    }
                    model.live.insert(*lease);
                    self.leases.insert(*lease, *resource);
                    touched = Some(*resource);
                }
                Effect::LeaseReleased { lease }
                | Effect::LeaseBroken { lease, .. }
                | Effect::LeaseExpired { lease }
                | Effect::LeaseFailed { lease } => {
                    if let Some(resource) = self.leases.get(lease)
                        && let Some(model) = self.resources.get_mut(resource)
                    {
                        model.live.remove(lease);
                    }
                }
                _ => {
                    if let Some(resource) = is_terminal_effect(effect) {
                        self.set_life(resource, Life::Terminal);
                    }
                }
            }
            if let Some(resource) = touched {
                let model = &self.resources[&resource];
                if model.live.len() as u64 > u64::from(model.capacity) {
                    return violation(
                        2,
                        format!(
                            "after {} at {position}, resource {resource} has {} live leases over capacity {}",
                            effect.name(),
                            model.live.len(),
                            model.capacity
                        ),
                    );
                }
            }
        }
        for (id, model) in &self.resources {
            if matches!(model.life, Life::Releasing | Life::Terminal) && !model.live.is_empty() {
                return violation(2, format!("resource {id} is {:?} with live leases {:?}", model.life, model.live));
            }
        }
        Ok(())
    }

    fn set_life(&mut self, resource: ResourceId, life: Life) {
        if let Some(model) = self.resources.get_mut(&resource) {
            model.life = life;
        }
    }

    /// Property 8: pool commands against the pool reference model.
    fn pool_model(&mut self, pre: &PartitionState, envelope: &Envelope, o: &Outcome) -> Result<(), Violation> {
        let Key::Pool(name) = &o.command.key else {
            return Ok(());
        };
        if let Some(r) = o.rejection()
            && r.kind == RejectionKind::StaleCommand
        {
            // A retry issued longer ago than the horizon: refused before any pool rule applies.
            let horizon = pre.settings().outcome_horizon;
            if envelope.issued_at.saturating_add(horizon) >= o.decided_at {
                return violation(
                    8,
                    format!("pool {name}: {} refused as stale within the horizon", o.command.type_name),
                );
            }
            return Ok(());
        }
        for effect in o.effects() {
            if let Effect::PoolDefined { kind, cooldown } = effect {
                self.pools.insert(name.clone(), PoolModel::new(kind, *cooldown));
            }
        }
        let Some(model) = self.pools.get_mut(name) else {
            return Ok(());
        };
        let now = o.decided_at;
        let expect = match &envelope.body {
            Command::Claim(c) => {
                if model.holders.contains_key(&c.holder) {
                    Expect::Rejected(Some(RejectionKind::AlreadyDone))
                } else if let Some((at, _)) = model.released.get(&c.holder).filter(|(_, ended)| c.source <= *ended) {
                    // Not newer than the claim that ended: stale while the pool remembers it.
                    if now < at.saturating_add(MIN_HORIZON) {
                        Expect::Rejected(Some(RejectionKind::StaleSource))
                    } else {
                        Expect::Anything
                    }
                } else {
                    Expect::Served(c.holder.clone())
                }
            }
            Command::Free(c) => match (model.holders.get(&c.holder), c.token) {
                (Some(Some((value, token))), Some(given)) if *token == given => {
                    Expect::Freed(c.holder.clone(), *value, given)
                }
                (Some(Some(_)), _) | (Some(None), Some(_)) => Expect::Rejected(Some(RejectionKind::TokenMismatch)),
                (Some(None), None) => Expect::Withdrawn(c.holder.clone()),
                (None, _) => Expect::Rejected(None),
            },
            Command::TickPool(_) => {
                if model.queue.is_empty() {
                    Expect::Rejected(Some(RejectionKind::NothingToDo))
                } else if model.next_available(now).is_some() {
                    Expect::Accepted
                } else {
                    Expect::Rejected(None)
                }
            }
            _ => Expect::Anything,
        };
        let effects = o.effects();
        let met = match (&expect, o.rejection()) {
            (Expect::Anything, _) => true,
            (Expect::Rejected(kind), Some(r)) => kind.is_none_or(|k| k == r.kind),
            (Expect::Rejected(_), None) => false,
            (_, Some(_)) => false,
            (Expect::Served(holder), None) => effects.iter().any(|e| {
                matches!(e, Effect::ClaimGranted { holder: h, .. } | Effect::ClaimQueued { holder: h, .. } if h == holder)
            }),
            (Expect::Freed(holder, value, token), None) => effects.iter().any(|e| {
                matches!(e, Effect::ClaimFreed { holder: h, value: v, token: t } if h == holder && v == value && t == token)
            }),
            (Expect::Withdrawn(holder), None) => {
                effects.iter().any(|e| matches!(e, Effect::ClaimWithdrawn { holder: h } if h == holder))
            }
            (Expect::Accepted, None) => true,
        };
        if !met {
            let got = match o.rejection() {
                Some(r) => format!("rejected {r}"),
                None => format!("{:?}", effects.iter().map(Effect::name).collect::<Vec<_>>()),
            };
            return violation(8, format!("pool {name}: the model expected {expect:?}, the domain answered {got}"));
        }
        let claimant = match &envelope.body {
            Command::Claim(c) => Some(&c.holder),
            _ => None,
        };
        for (position, effect) in o.positioned_effects() {
            match effect {
                Effect::ClaimGranted { holder, value, source } => {
                    if let Some((other, _)) = model.held.get(value) {
                        return violation(8, format!("pool {name} granted {value} to {holder} while {other} holds it"));
                    }
                    if let Some(freed_at) = model.freed_at(value)
                        && now < freed_at.saturating_add(model.cooldown)
                    {
                        return violation(
                            8,
                            format!(
                                "pool {name} granted {value} to {holder} at {now}, freed at {freed_at}: before its \
                                 cool-down of {}",
                                model.cooldown
                            ),
                        );
                    }
                    let expected = model.next_available(now);
                    if expected != Some(*value) {
                        return violation(
                            8,
                            format!("pool {name} granted {value} to {holder}; the model hands out {expected:?} next"),
                        );
                    }
                    match model.queue.front() {
                        Some(first) if first == holder => {
                            model.queue.pop_front();
                        }
                        Some(first) => {
                            return violation(
                                8,
                                format!("pool {name} granted {value} to {holder}, but {first} waits first"),
                            );
                        }
                        None if claimant == Some(holder) && !model.holders.contains_key(holder) => {}
                        None => {
                            return violation(
                                8,
                                format!(
                                    "pool {name} granted {value} to {holder} at {position}, which neither waits nor \
                                     claims now (model: {:?})",
                                    model.holders.get(holder)
                                ),
                            );
                        }
                    }
                    model.used.insert(*value);
                    model.cooling.retain(|_, v| v != value);
                    model.held.insert(*value, (holder.clone(), position));
                    model.holders.insert(holder.clone(), Some((*value, position)));
                    model.claimed_from.insert(holder.clone(), *source);
                }
                Effect::ClaimQueued { holder, source } => {
                    model.claimed_from.insert(holder.clone(), *source);
                    if claimant != Some(holder) || model.holders.contains_key(holder) {
                        return violation(8, format!("pool {name} queued {holder}, which does not claim now"));
                    }
                    if let Some(value) = model.next_available(now) {
                        return violation(8, format!("pool {name} queued {holder} while {value} is available"));
                    }
                    model.queue.push_back(holder.clone());
                    model.holders.insert(holder.clone(), None);
                }
                Effect::ClaimFreed { holder, value, token } => {
                    if model.holders.get(holder) != Some(&Some((*value, *token))) {
                        return violation(
                            8,
                            format!(
                                "pool {name} freed {value} (token {token}) of {holder}, which the model has as {:?}",
                                model.holders.get(holder)
                            ),
                        );
                    }
                    model.holders.remove(holder);
                    model.held.remove(value);
                    model.cooling.insert((now, position), *value);
                    let from = model.claimed_from.remove(holder).expect("a granted holder claimed");
                    model.released.insert(holder.clone(), (now, from));
                }
                Effect::ClaimWithdrawn { holder } => {
                    if model.holders.get(holder) != Some(&None) {
                        return violation(
                            8,
                            format!(
                                "pool {name} withdrew {holder}, which the model has as {:?}",
                                model.holders.get(holder)
                            ),
                        );
                    }
                    model.holders.remove(holder);
                    model.queue.retain(|h| h != holder);
                    let from = model.claimed_from.remove(holder).expect("a waiting holder claimed");
                    model.released.insert(holder.clone(), (now, from));
                }
                _ => {}
            }
        }
        let served = match envelope.body {
            Command::Claim(_) | Command::Free(_) => o.rejection().is_none(),
            Command::TickPool(_) => true,
            _ => false,
        };
        if served
            && let Some(first) = model.queue.front()
            && let Some(value) = model.next_available(now)
        {
            return violation(
                8,
                format!("after {}, {first} still waits for pool {name} while {value} is free", o.command.type_name),
            );
        }
        Ok(())
    }

    /// Properties 1, 2 (against state), 3, 7 and the pool model against state, on the state after an outcome.
    fn state(&mut self, state: &PartitionState) -> Result<(), Violation> {
        // 1: one live holder per identifier, and the pool holds what a live resource has bound.
        let mut bound: BTreeMap<(PoolName, PoolValue), ResourceRef> = BTreeMap::new();
        for resource in state.resources().filter(|r| !r.state.is_terminal()) {
            for (pool, slot) in &resource.claims {
                let ClaimSlot::Bound { value, token } = slot else { continue };
                if let Some(other) = bound.insert((pool.clone(), *value), resource.reference()) {
                    return violation(
                        1,
                        format!("{value} of pool {pool} is bound to both {other} and {}", resource.reference()),
                    );
                }
                if let Some(p) = state.pool(pool) {
                    match p.holders.get(&resource.reference()) {
                        Some(Holding::Granted { value: v, token: t, .. }) if v == value && t == token => {}
                        other => {
                            return violation(
                                1,
                                format!(
                                    "{} ({}) has {value} of pool {pool} bound with token {token}, but the pool has \
                                     {other:?} for it",
                                    resource.reference(),
                                    resource.state.name()
                                ),
                            );
                        }
                    }
                }
            }
        }
        // 2: the lease model against state.
        let mut forgotten = Vec::new();
        for (id, model) in &self.resources {
            match state.resource(*id) {
                Some(r) => {
                    let live: BTreeSet<LeaseId> = r.live_leases.values().copied().collect();
                    if live != model.live || r.capacity != model.capacity {
                        return violation(
                            2,
                            format!(
                                "resource {id}: state has live leases {live:?} and capacity {}, the model {:?} and {}",
                                r.capacity, model.live, model.capacity
                            ),
                        );
                    }
                }
                None if model.life == Life::Terminal => forgotten.push(*id),
                None => return violation(2, format!("resource {id} left state while {:?}", model.life)),
            }
        }
        for id in forgotten {
            self.resources.remove(&id);
        }
        if let Some(r) = state.resources().find(|r| !self.resources.contains_key(&r.id)) {
            return violation(2, format!("resource {} is in state but no outcome allocated it", r.id));
        }
        // 3: terminal states never change while in state.
        self.terminal_resources.retain(|id, _| state.resource(*id).is_some());
        for r in state.resources() {
            match self.terminal_resources.get(&r.id) {
                Some(was) if *was != r.state => {
                    return violation(3, format!("resource {} was {was:?} and is now {:?}", r.reference(), r.state));
                }
                Some(_) => {}
                None if r.state.is_terminal() => {
                    self.terminal_resources.insert(r.id, r.state.clone());
                }
                None => {}
            }
        }
        self.terminal_leases.retain(|id, _| state.lease(*id).is_some());
        for l in state.leases() {
            match self.terminal_leases.get(&l.id) {
                Some(was) if *was != l.state => {
                    return violation(3, format!("lease {} was {was:?} and is now {:?}", l.id, l.state));
                }
                Some(_) => {}
                None if !l.state.is_live() => {
                    self.terminal_leases.insert(l.id, l.state.clone());
                }
                None => {}
            }
        }
        // 7.
        invariants::check(state).map_err(|e| (7, e))?;
        // 8: the pool model against state.
        for (name, model) in &self.pools {
            let Some(pool) = state.pool(name) else {
                return violation(8, format!("pool {name} is in the model but not in state"));
            };
            let held: BTreeMap<PoolValue, ResourceRef> = model.held.iter().map(|(v, (h, _))| (*v, h.clone())).collect();
            if held != pool.held {
                return violation(8, format!("pool {name} holds {:?}, the model {held:?}", pool.held));
            }
            if !pool.waiters.values().eq(model.queue.iter()) {
                return violation(8, format!("pool {name} queue is {:?}, the model's {:?}", pool.waiters, model.queue));
            }
        }
        Ok(())
    }
}

// =================================================================================================================
// The runner: interprets steps, decides them on two drivers, checks.

struct Sim {
    d: Driver,
    twin: Driver,
    agents: Vec<AgentName>,
    pools: Vec<PoolName>,
    obs: BTreeMap<AgentName, u64>,
    epochs: BTreeMap<AgentName, Vec<Position>>,
    n_incarnations: u128,
    follow_ups: VecDeque<Command>,
    sent: Vec<Envelope>,
    trace: Vec<String>,
    names: BTreeMap<String, String>,
    checker: Checker,
    step: usize,
}

impl Sim {
    fn new(n_agents: usize) -> Self {
        let mut d = Driver::new(0, 1, T0);
        d.auto_continue = false;
        let twin = d.clone();
        let agents = (1..=n_agents).map(|i| agent_name(&format!("w{i}"))).collect();
        Sim {
            d,
            twin,
            agents,
            pools: Vec::new(),
            obs: BTreeMap::new(),
            epochs: BTreeMap::new(),
            n_incarnations: 0,
            follow_ups: VecDeque::new(),
            sent: Vec::new(),
            trace: Vec::new(),
            names: BTreeMap::new(),
            checker: Checker::default(),
            step: 0,
        }
    }

    fn run(scenario: &Scenario) -> Result<(), String> {
        let mut sim = Sim::new(scenario.n_agents);
        for (i, spec) in scenario.pools.iter().enumerate() {
            let pool = pool_name(&format!("p{i}"));
            sim.pools.push(pool.clone());
            let body = DefinePool { pool, kind: spec.kind(), cooldown: Some(secs(spec.cooldown_s)) };
            let envelope = sim.envelope(OPS[0], 0, body.into());
            sim.submit(envelope)?;
        }
        for (i, agent) in sim.agents.clone().into_iter().enumerate() {
            sim.n_incarnations += 1;
            let body = Register {
                agent: agent.clone(),
                incarnation: Uuid::from_u128(sim.n_incarnations),
                wiped: false,
                settings: agent_settings(scenario.settings[i]),
            };
            let envelope = sim.envelope(agent.as_str(), 0, body.into());
            sim.submit(envelope)?;
        }
        for (i, step) in scenario.steps.iter().enumerate() {
            sim.step = i + 1;
            match step.clock {
                Clock::Same => {}
                Clock::Forward(ms) => sim.advance(Millis(u64::from(ms))),
                Clock::Long(s) => sim.advance(secs(u64::from(s))),
                Clock::Back(ms) => {
                    let at = Timestamp(sim.d.now().0.saturating_sub(u64::from(ms)));
                    sim.d.set_clock(at);
                    sim.twin.set_clock(at);
                }
            }
            if let Some(envelope) = sim.interpret(step) {
                sim.submit(envelope)?;
            }
        }
        // Property 6 over the whole run, on top of the per-step comparison.
        if sim.d.outcomes() != sim.twin.outcomes() {
            return Err(sim.report(6, "the two drivers' logs differ".into()));
        }
        Ok(())
    }

    fn advance(&mut self, by: Millis) {
        self.d.advance(by);
        self.twin.advance(by);
    }

    fn state(&self) -> &PartitionState {
        self.d.state()
    }

    fn envelope(&mut self, issuer: &str, skew_s: i16, body: Command) -> Envelope {
        let id = self.d.new_command_id();
        let now = self.d.now().0;
        let skew = u64::from(skew_s.unsigned_abs()) * 1000;
        let at = if skew_s < 0 { now.saturating_sub(skew) } else { now + skew };
        Envelope::new(id, Issuer::new(issuer).expect("valid issuer"), Timestamp(at), body)
    }

    /// Decides an envelope (and the writer's own follow-ups) on both drivers and checks every property.
    fn submit(&mut self, envelope: Envelope) -> Result<(), String> {
        let mut queue = VecDeque::from([envelope]);
        while let Some(envelope) = queue.pop_front() {
            let pre = self.d.state().clone();
            let n_before = self.d.outcomes().len();
            let outcome = self.d.submit_envelope(&envelope);
            let twin = self.twin.submit_envelope(&envelope);
            let appended = self.d.outcomes().len() > n_before;
            self.record(&envelope, &outcome, appended);
            self.sent.push(envelope.clone());
            if outcome != twin {
                return Err(self.report(6, format!("the twin decided {twin:?}\nthe first decided {outcome:?}")));
            }
            if appended {
                if let Err((p, message)) = self.checker.outcome(&pre, &envelope, &outcome) {
                    return Err(self.report(p, message));
                }
                self.learn(&outcome);
                queue.extend(follow_ups(&outcome));
            } else if *self.d.state() != pre {
                return Err(self.report(5, "a retried command changed state without appending an outcome".into()));
            }
            if let Err((p, message)) = self.checker.state(self.d.state()) {
                return Err(self.report(p, message));
            }
            if self.d.rebuild() != *self.d.state() {
                return Err(self.report(5, "folding every outcome from scratch gives another state".into()));
            }
        }
        Ok(())
    }

    /// The sweeper's view: follow-ups that effects ask for; and the agents' epochs and observation numbers.
    fn learn(&mut self, o: &Outcome) {
        let source = |position| Source { partition: 0, position };
        for (position, effect) in o.positioned_effects() {
            let agent = match &o.command.key {
                Key::Agent(a) => Some(a.clone()),
                Key::Pool(_) => None,
            };
            let mut push = |c: Command| self.follow_ups.push_back(c);
            match (effect, &o.command.key) {
                (Effect::AgentRegistered { .. }, Key::Agent(a)) => {
                    self.obs.insert(a.clone(), 0);
                    self.epochs.entry(a.clone()).or_default().push(position);
                }
                (Effect::ClaimWanted { resource, pool }, Key::Agent(a)) => push(
                    Claim {
                        pool: pool.clone(),
                        holder: ResourceRef::new(a.clone(), *resource),
                        source: source(position),
                    }
                    .into(),
                ),
                (Effect::ClaimGranted { holder, value, source: wanted }, Key::Pool(pool)) => push(
                    BindClaim {
                        holder: holder.clone(),
                        pool: pool.clone(),
                        value: *value,
                        token: position,
                        source: source(position),
                        wanted: *wanted,
                    }
                    .into(),
                ),
                (Effect::ClaimReleasable { resource, pool, token, .. }, Key::Agent(a)) => push(
                    Free {
                        pool: pool.clone(),
                        holder: ResourceRef::new(a.clone(), *resource),
                        token: *token,
                        source: source(position),
                    }
                    .into(),
                ),
                _ => {}
            }
            let parent_state = match effect {
                Effect::ResourceReleasing { resource, .. } => Some((*resource, ParentState::Left)),
                Effect::ResourceSuspect { resource, .. } => Some((*resource, ParentState::Suspect)),
                Effect::ResourceHealthy { resource } => Some((*resource, ParentState::Healthy)),
                other => is_terminal_effect(other).map(|r| (r, ParentState::Left)),
            };
            if let (Some((resource, parent_state)), Some(agent)) = (parent_state, agent) {
                let parent = ResourceRef::new(agent, resource);
                let children: Vec<ResourceRef> = self
                    .d
                    .state()
                    .resources()
                    .filter(|r| r.parent.as_ref() == Some(&parent))
                    .map(|r| r.reference())
                    .collect();
                for child in children {
                    let cascade = Cascade { child, parent: parent.clone(), parent_state, source: source(position) };
                    self.follow_ups.push_back(cascade.into());
                }
            }
        }
        while self.follow_ups.len() > FOLLOW_UP_QUEUE {
            self.follow_ups.pop_front();
        }
    }

    // --- picking things ---------------------------------------------------------------------------------------

    fn resource_id(&mut self, generation: u64, index: u8) -> ResourceId {
        let id = ResourceId::from_parts(generation_time(generation), entropy(0x52, generation, index));
        self.names.entry(id.to_string()).or_insert_with(|| format!("r{generation}.{index}"));
        id
    }

    fn lease_id(&mut self, generation: u64, index: u8) -> LeaseId {
        let id = LeaseId::from_parts(generation_time(generation), entropy(0x4c, generation, index));
        self.names.entry(id.to_string()).or_insert_with(|| format!("l{generation}.{index}"));
        id
    }

    /// This generation's ids and every resource in state, in id order.
    fn resource_universe(&mut self) -> Vec<ResourceId> {
        let generation = generation_of(self.d.now());
        let mut ids: BTreeSet<ResourceId> = (0..N_RESOURCE_IDS).map(|i| self.resource_id(generation, i)).collect();
        ids.extend(self.state().resources().map(|r| r.id));
        ids.into_iter().collect()
    }

    fn agent(&self, sel: u8) -> AgentName {
        self.agents[sel as usize % self.agents.len()].clone()
    }

    /// A resource and the agent it is on (or some agent, for an id not in state). Mostly a live resource, sometimes
    /// any one in state, sometimes any id of the universe.
    fn pick_resource(&mut self, sel: u8) -> (AgentName, ResourceId) {
        let universe = self.resource_universe();
        let state = self.state();
        let any: Vec<ResourceId> = state.resources().map(|r| r.id).collect();
        let live: Vec<ResourceId> = state.resources().filter(|r| !r.state.is_terminal()).map(|r| r.id).collect();
        let from = match sel % 4 {
            0 => &universe,
            1 if !any.is_empty() => &any,
            _ if !live.is_empty() => &live,
            _ if !any.is_empty() => &any,
            _ => &universe,
        };
        let id = from[(sel / 4) as usize % from.len()];
        let agent = state.resource(id).map(|r| r.agent.clone()).unwrap_or_else(|| self.agent(sel / 7));
        (agent, id)
    }

    /// A lease and its agent: mostly a live one, sometimes any in state, sometimes any id of the universe.
    fn pick_lease(&mut self, sel: u8) -> (AgentName, LeaseId) {
        let generation = generation_of(self.d.now());
        let mut universe: BTreeSet<LeaseId> = (0..N_LEASE_IDS).map(|i| self.lease_id(generation, i)).collect();
        universe.extend(self.state().leases().map(|l| l.id));
        let universe: Vec<LeaseId> = universe.into_iter().collect();
        let state = self.state();
        let any: Vec<LeaseId> = state.leases().map(|l| l.id).collect();
        let live: Vec<LeaseId> = state.leases().filter(|l| l.state.is_live()).map(|l| l.id).collect();
        let from = match sel % 4 {
            0 => &universe,
            1 if !any.is_empty() => &any,
            _ if !live.is_empty() => &live,
            _ if !any.is_empty() => &any,
            _ => &universe,
        };
        let id = from[(sel / 4) as usize % from.len()];
        let agent = state.lease(id).map(|l| l.agent.clone()).unwrap_or_else(|| self.agent(sel / 7));
        (agent, id)
    }

    fn epoch(&self, agent: &AgentName) -> Position {
        self.state().agent(agent).map(|a| a.epoch).unwrap_or(Position(1))
    }

    /// The epoch and observation number an agent puts on its next observation.
    fn stamp(&mut self, agent: &AgentName, pick: Obs) -> (Position, u64) {
        let epoch = self.epoch(agent);
        let n = self.obs.entry(agent.clone()).or_insert(0);
        match pick {
            Obs::Next => {
                *n += 1;
                (epoch, *n)
            }
            Obs::Same => (epoch, *n),
            Obs::Skip => {
                *n += 3;
                (epoch, *n)
            }
            Obs::OldEpoch => {
                *n += 1;
                let n = *n;
                let old = self.epochs.get(agent).and_then(|e| e.iter().rev().nth(1).copied()).unwrap_or(Position(0));
                (old, n)
            }
        }
    }

    fn watermark(&self, pick: Wm) -> Position {
        let last = self.state().last_position();
        match pick {
            Wm::Last => last,
            Wm::Lag(k) => Position(last.0.saturating_sub(u64::from(k))),
            Wm::Zero => Position(0),
            Wm::Beyond => last.next(),
        }
    }

    /// What reports name: the agent's resources in state, and every id of the universe.
    fn report_candidates(&mut self, agent: &AgentName) -> (Vec<ResourceId>, Vec<ResourceId>) {
        let universe = self.resource_universe();
        let state = self.state();
        let own: Vec<ResourceId> =
            state.agent(agent).map(|a| state.resources_of(a).map(|r| r.id).collect()).unwrap_or_default();
        (own, universe)
    }

    fn agent_issuer(&self, agent: &AgentName, who: u8) -> String {
        if who % 16 == 15 {
            let other = self.agents.iter().find(|a| *a != agent).unwrap_or(agent);
            other.as_str().to_owned()
        } else {
            agent.as_str().to_owned()
        }
    }

    // --- interpreting a step ----------------------------------------------------------------------------------

    fn interpret(&mut self, step: &Step) -> Option<Envelope> {
        let op = OPS[step.who as usize % OPS.len()];
        let sys = SWEEPERS[step.who as usize % SWEEPERS.len()];
        let (issuer, body): (String, Command) = match &step.act {
            Act::Register { agent, wiped, settings } => {
                let agent = self.agent(*agent);
                self.n_incarnations += 1;
                let body = Register {
                    agent: agent.clone(),
                    incarnation: Uuid::from_u128(self.n_incarnations),
                    wiped: *wiped,
                    settings: agent_settings(*settings),
                };
                (self.agent_issuer(&agent, step.who), body.into())
            }
            Act::Heartbeat { agent, stale } => {
                let agent = self.agent(*agent);
                let epoch = if *stale {
                    self.epochs.get(&agent).and_then(|e| e.iter().rev().nth(1).copied()).unwrap_or(Position(0))
                } else {
                    self.epoch(&agent)
                };
                (self.agent_issuer(&agent, step.who), Heartbeat { agent, epoch }.into())
            }
            Act::Allocate { agent, res, pools, parent, capacity } => {
                let agent = self.agent(*agent);
                let generation = generation_of(self.d.now());
                let resource = self.resource_id(generation, res % N_RESOURCE_IDS);
                let mut names = Vec::new();
                if pools & 1 != 0 {
                    names.push(self.pools[0].clone());
                }
                if pools & 2 != 0 {
                    names.push(self.pools.get(1).cloned().unwrap_or_else(|| pool_name(GHOST_POOL)));
                }
                if pools & 4 != 0 {
                    names.push(pool_name(GHOST_POOL));
                }
                let parent = parent.map(|p| {
                    let (agent, id) = self.pick_resource(p);
                    ResourceRef::new(agent, id)
                });
                let body = Allocate {
                    agent,
                    resource,
                    kind: "container".into(),
                    capacity: u32::from(*capacity),
                    attributes: Default::default(),
                    parent,
                    pools: names,
                };
                (op.to_owned(), body.into())
            }
            Act::Acquire { res, lease, agent, ttl_s, wait_s } => {
                let (owner, resource) = self.pick_resource(*res);
                let generation = generation_of(self.d.now());
                let lease = self.lease_id(generation, lease % N_LEASE_IDS);
                let agent = agent.map(|a| self.agent(a)).unwrap_or(owner);
                let body = Acquire {
                    agent,
                    resource,
                    lease,
                    holder: format!("job-{}", step.who % 4),
                    ttl: ttl_s.map(|s| secs(u64::from(s))),
                    wait_timeout: wait_s.map(|s| secs(u64::from(s))),
                };
                (op.to_owned(), body.into())
            }
            Act::Renew { lease, tok, ttl_s } => {
                let (agent, lease) = self.pick_lease(*lease);
                let token = match (tok, self.state().lease(lease).map(|l| &l.state)) {
                    (Tok::Right, Some(LeaseState::Active { token, .. })) => *token,
                    _ => Position(999_999),
                };
                let body = Renew { agent, lease, token, ttl: ttl_s.map(|s| secs(u64::from(s))) };
                (op.to_owned(), body.into())
            }
            Act::ReleaseLease { lease, tok } => {
                let (agent, lease) = self.pick_lease(*lease);
                let token = match (tok, self.state().lease(lease).map(|l| &l.state)) {
                    (Tok::Right, Some(LeaseState::Active { token, .. })) => Some(*token),
                    (Tok::Right, _) | (Tok::Nothing, _) => None,
                    (Tok::Wrong, _) => Some(Position(999_999)),
                };
                (op.to_owned(), ReleaseLease { agent, lease, token }.into())
            }
            Act::Release { res } => {
                let (agent, resource) = self.pick_resource(*res);
                (op.to_owned(), Release { agent, resource, reason: Some("done".into()) }.into())
            }
            Act::Pause { res, until_s } => {
                let (agent, resource) = self.pick_resource(*res);
                let until = until_s.map(|s| self.d.now().saturating_add(secs(u64::from(s))));
                (op.to_owned(), Pause { agent, resource, reason: Some("maintenance".into()), until }.into())
            }
            Act::Unpause { res } => {
                let (agent, resource) = self.pick_resource(*res);
                (op.to_owned(), Unpause { agent, resource }.into())
            }
            Act::Update { res, capacity, set } => {
                let (agent, resource) = self.pick_resource(*res);
                let (set, remove) = if *set {
                    ([("tier".to_owned(), "gold".to_owned())].into_iter().collect(), vec![])
                } else {
                    (BTreeMap::new(), vec!["tier".to_owned()])
                };
                let body = Update { agent, resource, set, remove, capacity: capacity.map(u32::from) };
                (op.to_owned(), body.into())
            }
            Act::OpFailure { res } => {
                let (agent, resource) = self.pick_resource(*res);
                (op.to_owned(), ReportFailureByOperator { agent, resource, detail: "flaky".into() }.into())
            }
            Act::Retire { agent } => (op.to_owned(), RetireAgent { agent: self.agent(*agent) }.into()),
            Act::ConfirmLoss { agent } => (op.to_owned(), ConfirmLoss { agent: self.agent(*agent) }.into()),
            Act::DefinePool { which } => {
                let body = match which {
                    0 => DefinePool {
                        pool: self.pools[0].clone(),
                        kind: self.state().pool(&self.pools[0]).map(|p| p.kind.clone())?,
                        cooldown: self.state().pool(&self.pools[0]).map(|p| Some(p.cooldown))?,
                    },
                    1 => DefinePool { pool: self.pools[0].clone(), kind: PoolKind::Slots { count: 7 }, cooldown: None },
                    _ => DefinePool {
                        pool: pool_name(GHOST_POOL),
                        kind: PoolKind::Slots { count: 2 },
                        cooldown: Some(secs(10)),
                    },
                };
                (op.to_owned(), body.into())
            }
            Act::Horizon { which } => {
                let settings = PartitionSettings { outcome_horizon: HORIZONS[*which as usize % HORIZONS.len()] };
                let body = SetPartitionSettings { key: Key::Agent(self.agent(0)), partition: 0, settings };
                (op.to_owned(), body.into())
            }
            Act::ReportCreated { res, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let native_id = Some(format!("native-{}", step.who));
                let body = ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id };
                (self.agent_issuer(&agent, step.who), body.into())
            }
            Act::Sync { agent, marks, wm, honest, obs } => {
                let agent = self.agent(*agent);
                let (own, universe) = self.report_candidates(&agent);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let watermark = self.watermark(*wm);
                let mut report = SyncReport::new(agent.clone(), epoch, obs, watermark);
                let mut named = BTreeSet::new();
                for (kind, which) in marks {
                    let from = if which % 4 == 0 || own.is_empty() { &universe } else { &own };
                    let id = from[(which / 4) as usize % from.len()];
                    if !named.insert(id) && *kind != 31 {
                        continue;
                    }
                    match kind {
                        0..=9 => report.created.push(id),
                        10..=19 => report.missing.push(id),
                        20..=25 => report.destroyed.push(id),
                        26..=29 => report.in_flight.push(id),
                        30 => {
                            report.destroyed.push(id);
                            report.in_flight.push(id);
                        }
                        _ => {
                            // Named both present and absent: refused.
                            report.created.push(id);
                            report.missing.push(id);
                        }
                    }
                }
                let (count, digest) = honest_listing(self.state(), &report);
                report.count = if *honest { count } else { count + 1 };
                report.digest = digest;
                (self.agent_issuer(&agent, step.who), report.into())
            }
            Act::Chunk { agent, lo, hi, marks, wm, obs } => {
                let agent = self.agent(*agent);
                let (own, universe) = self.report_candidates(&agent);
                // Mostly a proper range: from the start or an id, to the end or a later id.
                let (mut lo_idx, mut hi_idx) =
                    ((*lo / 3) as usize % universe.len(), (*hi / 3) as usize % universe.len());
                if lo_idx > hi_idx && lo % 8 != 7 {
                    std::mem::swap(&mut lo_idx, &mut hi_idx);
                }
                let lo = if lo % 3 == 0 { Uuid::nil() } else { universe[lo_idx].as_uuid() };
                let hi = if hi % 3 == 0 { None } else { Some(universe[hi_idx].as_uuid()) };
                let (epoch, obs) = self.stamp(&agent, *obs);
                let watermark = self.watermark(*wm);
                let mut chunk = ResyncChunk {
                    agent: agent.clone(),
                    epoch,
                    obs,
                    watermark,
                    lo,
                    hi,
                    held: vec![],
                    in_flight: vec![],
                };
                let in_range: Vec<ResourceId> = own.iter().copied().filter(|id| chunk.covers(*id)).collect();
                for (kind, which) in marks {
                    let from = if *kind == 7 { &universe } else { &in_range };
                    if from.is_empty() {
                        continue;
                    }
                    let id = from[*which as usize % from.len()];
                    match kind {
                        0..=4 | 7 => chunk.held.push(id),
                        _ => chunk.in_flight.push(id),
                    }
                }
                (self.agent_issuer(&agent, step.who), chunk.into())
            }
            Act::AgentFailure { res, create_failed, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let failure = if *create_failed { FailureKind::CreateFailed } else { FailureKind::Unhealthy };
                let body = ReportFailure { agent: agent.clone(), epoch, obs, resource, failure, detail: "boom".into() };
                (self.agent_issuer(&agent, step.who), body.into())
            }
            Act::Health { res, healthy, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let body = HealthResult {
                    agent: agent.clone(),
                    epoch,
                    obs,
                    resource,
                    healthy: *healthy,
                    detail: "check".into(),
                };
                (self.agent_issuer(&agent, step.who), body.into())
            }
            Act::FollowUp { pick, keep } => {
                let len = self.follow_ups.len();
                if len == 0 {
                    return None;
                }
                let k = (*pick >> 1) as usize % len;
                let idx = if pick & 1 == 1 { len - 1 - k } else { k };
                let body = if *keep {
                    self.follow_ups[idx].clone()
                } else {
                    self.follow_ups.remove(idx).expect("index within the queue")
                };
                (sys.to_owned(), body)
            }
            Act::Timer { kind, pick } => (sys.to_owned(), self.timer(*kind, *pick)?),
            Act::Junk { kind, a, b } => (sys.to_owned(), self.junk(*kind, *a, *b)?),
            Act::Retry { pick } => {
                if self.sent.is_empty() {
                    return None;
                }
                return Some(self.sent[*pick as usize % self.sent.len()].clone());
            }
        };
        Some(self.envelope(&issuer, step.skew_s, body))
    }

    /// A time-driven sweeper command read off the state: what is (or may soon be) due.
    fn timer(&mut self, kind: u8, pick: u8) -> Option<Command> {
        let state = self.d.state();
        let all_resources = || state.resources();
        let mut candidates: Vec<Command> = match kind {
            0 => state
                .leases()
                .filter(|l| matches!(l.state, LeaseState::Active { .. }))
                .map(|l| ExpireLease { agent: l.agent.clone(), lease: l.id }.into())
                .collect(),
            1 => state
                .leases()
                .filter(|l| matches!(l.state, LeaseState::Waiting { .. }))
                .map(|l| WaitTimeout { agent: l.agent.clone(), lease: l.id }.into())
                .collect(),
            2 => all_resources()
                .filter(|r| r.state == ResourceState::Pending)
                .map(|r| CreateTimeout { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            3 => all_resources()
                .filter(|r| matches!(r.state, ResourceState::Paused { .. }))
                .map(|r| ExpirePause { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            4 => state.agents().map(|a| MarkStalled { agent: a.name.clone() }.into()).collect(),
            5 => state.agents().map(|a| MarkGone { agent: a.name.clone() }.into()).collect(),
            6 => all_resources()
                .filter(|r| {
                    !r.state.is_terminal() && state.agent(&r.agent).is_some_and(|a| a.liveness == Liveness::Gone)
                })
                .map(|r| Orphan { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            7 => all_resources()
                .filter(|r| matches!(r.state, ResourceState::Suspect { .. }))
                .map(|r| RequestHealthCheck { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            _ => state
                .pools()
                .filter(|p| !p.waiters.is_empty())
                .map(|p| TickPool { pool: p.name.clone() }.into())
                .collect(),
        };
        if candidates.is_empty() {
            // Nothing due of that kind: the sweeper may still be wrong about it (its projection lags).
            candidates = match kind {
                0 | 1 => state
                    .leases()
                    .map(|l| {
                        if kind == 0 {
                            ExpireLease { agent: l.agent.clone(), lease: l.id }.into()
                        } else {
                            WaitTimeout { agent: l.agent.clone(), lease: l.id }.into()
                        }
                    })
                    .collect(),
                2 | 3 | 6 | 7 => all_resources()
                    .map(|r| match kind {
                        2 => CreateTimeout { agent: r.agent.clone(), resource: r.id }.into(),
                        3 => ExpirePause { agent: r.agent.clone(), resource: r.id }.into(),
                        6 => Orphan { agent: r.agent.clone(), resource: r.id }.into(),
                        _ => RequestHealthCheck { agent: r.agent.clone(), resource: r.id }.into(),
                    })
                    .collect(),
                _ => state.pools().map(|p| TickPool { pool: p.name.clone() }.into()).collect(),
            };
        }
        if candidates.is_empty() {
            return None;
        }
        let idx = pick as usize % candidates.len();
        Some(candidates.swap_remove(idx))
    }

    /// Pool and cascade commands no effect asked for. Frees carry tokens no grant ever had; bind-claims are never
    /// made up (the sweeper carries real grants only).
    fn junk(&mut self, kind: u8, a: u8, b: u8) -> Option<Command> {
        let pool = self.pools[b as usize % self.pools.len()].clone();
        let source = Source { partition: 0, position: Position(u64::from(b)) };
        match kind {
            0 => {
                let (agent, id) = self.pick_resource(a);
                let holder = ResourceRef::new(agent, id);
                Some(Claim { pool, holder, source }.into())
            }
            1 => {
                let (agent, id) = self.pick_resource(a);
                let token = Some(Position(u64::MAX - u64::from(a)));
                Some(Free { pool, holder: ResourceRef::new(agent, id), token, source }.into())
            }
            2 => {
                let children: Vec<(ResourceRef, ResourceRef)> =
                    self.state().resources().filter_map(|r| r.parent.clone().map(|p| (r.reference(), p))).collect();
                if children.is_empty() {
                    return None;
                }
                let (child, parent) = children[a as usize % children.len()].clone();
                let parent_state = [ParentState::Left, ParentState::Suspect, ParentState::Healthy][b as usize % 3];
                let source = Source { partition: 0, position: Position(u64::from(a) * 3) };
                Some(Cascade { child, parent, parent_state, source }.into())
            }
            _ => Some(TickPool { pool }.into()),
        }
    }

    // --- reporting --------------------------------------------------------------------------------------------

    fn record(&mut self, envelope: &Envelope, outcome: &Outcome, appended: bool) {
        let result = match outcome.rejection() {
            Some(r) => format!("REJECTED {r}"),
            None => format!("{:?}", outcome.effects().iter().map(Effect::name).collect::<Vec<_>>()),
        };
        let retried = if appended { "" } else { " (retry: first outcome returned)" };
        let line = format!(
            "step {:>3} log t+{:.1}s issuer {} (issued t{:+.1}s) {}{retried} {:?}\n      -> {result}",
            self.step,
            self.d.now().0.saturating_sub(T0.0) as f64 / 1000.0,
            envelope.issuer,
            (envelope.issued_at.0 as f64 - self.d.now().0 as f64) / 1000.0,
            envelope.type_name(),
            envelope.body,
        );
        self.trace.push(line);
    }

    fn report(&self, property: usize, message: String) -> String {
        let shorten = |text: &str| {
            let mut text = text.to_owned();
            for (long, short) in &self.names {
                text = text.replace(long, short);
            }
            text
        };
        let mut out = format!(
            "\n=== property {} broke at step {} ===\n{}\n--- commands (oldest first) ---\n",
            PROPERTY_NAMES[property],
            self.step,
            shorten(&message)
        );
        for line in &self.trace {
            out.push_str(&shorten(line));
            out.push('\n');
        }
        if let Some(last) = self.d.outcomes().last() {
            out.push_str(&format!("--- last outcome ---\n{}\n", shorten(&format!("{last:?}"))));
        }
        out
    }
}

/// What an honest agent would count after its report: what the writer believes it holds, plus the pending ones it
/// reports created, minus what it reports missing, destroyed or in flight; releasing resources it cannot know of yet
/// count as held.
fn honest_listing(state: &PartitionState, report: &SyncReport) -> (u64, HandleDigest) {
    let Some(agent) = state.agent(&report.agent) else {
        return (0, HandleDigest::default());
    };
    let mut ids = BTreeSet::new();
    for r in state.resources_of(agent) {
        let held_view = r.state.is_held()
            || (matches!(r.state, ResourceState::Releasing { .. })
                && r.destruction_ordered.is_some_and(|p| p > report.watermark)
                && r.last_present.is_some());
        if held_view || (r.state == ResourceState::Pending && report.created.contains(&r.id)) {
            ids.insert(r.id);
        }
    }
    for id in report.missing.iter().chain(&report.destroyed).chain(&report.in_flight) {
        ids.remove(id);
    }
    (ids.len() as u64, HandleDigest::of(ids.iter()))
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES=n runs a longer soak.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(CASES),
        // The default, minus the warning that an integration test has no lib.rs next to it.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_command_sequences_keep_the_promises(scenario in scenario()) {
        if let Err(report) = Sim::run(&scenario) {
            return Err(TestCaseError::fail(report));
        }
    }
}

// =================================================================================================================
// Bounded state under an endless stream of heartbeats and reports.

#[test]
fn state_stays_bounded_under_endless_heartbeats_and_reports() {
    const STEPS: usize = 20_000;
    const STEP: Millis = Millis::from_secs(10);
    const HOURLY: usize = 360;
    let settings = AgentSettings::default();
    let mut w = support::World::new();
    let agents = [agent_name("w1"), agent_name("w2")];
    for agent in &agents {
        accepted(&w.register_with(agent, settings.clone(), false));
    }
    let mut held: BTreeMap<AgentName, VecDeque<ResourceId>> = BTreeMap::new();
    let mut lease: Option<(AgentName, LeaseId, Position)> = None;
    let create = |w: &mut support::World, agent: &AgentName| {
        let cmd = w.allocate_cmd(agent);
        let id = cmd.resource;
        accepted(&w.op(cmd));
        id
    };
    for agent in &agents {
        for _ in 0..3 {
            let id = create(&mut w, agent);
            accepted(&w.report_created(agent, id));
            held.entry(agent.clone()).or_default().push_back(id);
        }
    }
    let (mut max_recent, mut max_resources, mut max_leases, mut max_losses) = (0, 0, 0, 0);
    for step in 0..STEPS {
        w.advance(STEP);
        for agent in &agents {
            accepted(&w.heartbeat(agent));
        }
        let mut lose: Option<(AgentName, ResourceId)> = None;
        if step % HOURLY == HOURLY / 2 {
            // Churn: a new resource on one agent, the oldest one released, a lease moved to the newest one, and every
            // six hours one resource lost.
            let agent = agents[(step / HOURLY) % agents.len()].clone();
            let id = create(&mut w, &agent);
            let queue = held.entry(agent.clone()).or_default();
            queue.push_back(id);
            let oldest = queue.pop_front().expect("the agent holds resources");
            accepted(&w.op(Release { agent: agent.clone(), resource: oldest, reason: None }));
            if let Some((agent, lease, token)) = lease.take() {
                w.op(ReleaseLease { agent, lease, token: Some(token) });
            }
            let newest_held = held[&agent][held[&agent].len() - 2];
            let acquire = Acquire {
                agent: agent.clone(),
                resource: newest_held,
                lease: w.d.new_lease_id(),
                holder: "build".into(),
                ttl: Some(Millis::from_mins(90)),
                wait_timeout: None,
            };
            let lease_id = acquire.lease;
            let outcome = w.op(acquire);
            let token = outcome
                .positioned_effects()
                .find_map(|(p, e)| matches!(e, Effect::LeaseGranted { .. }).then_some(p))
                .expect("the lease is granted");
            lease = Some((agent.clone(), lease_id, token));
            if step % (6 * HOURLY) == HOURLY / 2 {
                let replacement = create(&mut w, &agent);
                let queue = held.get_mut(&agent).expect("the agent holds resources");
                let victim = queue.pop_front().expect("the agent holds resources");
                queue.push_back(replacement);
                lose = Some((agent, victim));
            }
        }
        if step % 3 == 0 {
            for agent in &agents {
                let state = w.state();
                let a = state.agent(agent).expect("registered");
                let created: Vec<ResourceId> =
                    state.resources_of(a).filter(|r| r.state == ResourceState::Pending).map(|r| r.id).collect();
                let destroyed: Vec<ResourceId> = state
                    .resources_of(a)
                    .filter(|r| matches!(r.state, ResourceState::Releasing { .. }))
                    .map(|r| r.id)
                    .collect();
                let missing: Vec<ResourceId> =
                    lose.iter().filter(|(owner, _)| owner == agent).map(|(_, id)| *id).collect();
                let outcome = w.sync(agent, |r| {
                    r.created = created;
                    r.destroyed = destroyed;
                    r.missing = missing;
                });
                let effects = accepted(&outcome);
                assert!(
                    !effects.iter().any(|e| matches!(e, Effect::ResyncRequested { .. } | Effect::AgentSuspect { .. })),
                    "step {step}: an honest report of {agent} got {:?}",
                    support::effect_names(&outcome)
                );
            }
            lose = None;
        }
        assert!(lose.is_none(), "step {step}: a loss was not reported");
        let state = w.state();
        max_recent = max_recent.max(state.n_recent_outcomes());
        max_resources = max_resources.max(state.resources().count());
        max_leases = max_leases.max(state.leases().count());
        max_losses = max_losses.max(state.agents().map(|a| a.recent_losses.len()).max().unwrap_or(0));
        if step % 1000 == 0 {
            invariants::check(state).unwrap_or_else(|e| panic!("step {step}: {e}"));
        }
    }
    let state = w.state();
    invariants::check(state).expect("invariants at the end");
    assert!(state.now().since(T0) >= Millis::from_hours(48), "the stream covers two days of log time");
    // Remembered outcomes: the hourly churn's ~5 op/agent commands over the 24 h horizon, never heartbeats or reports.
    assert!(max_recent <= 200, "{max_recent} outcomes remembered at once");
    // Six live resources, plus the terminal ones of the last 24 h (about 28).
    assert!(max_resources <= 45, "{max_resources} resources in state at once");
    assert!(max_leases <= 30, "{max_leases} leases in state at once");
    assert!(max_losses <= 2, "{max_losses} recent losses kept for one agent");
    assert_eq!(state.continuations().count(), 0, "no work left over");
    // Heartbeats are coalesced: per agent, agent-seen at most once per stall_after / 3.
    let third = Millis(settings.stall_after.0 / 3);
    let mut seen: BTreeMap<Key, Vec<Timestamp>> = BTreeMap::new();
    for outcome in w.d.outcomes() {
        if outcome.effects().iter().any(|e| matches!(e, Effect::AgentSeen { .. })) {
            seen.entry(outcome.command.key.clone()).or_default().push(outcome.decided_at);
        }
    }
    let duration = state.now().since(T0).0;
    for (key, times) in &seen {
        for pair in times.windows(2) {
            assert!(pair[1].since(pair[0]) >= third, "{key}: agent-seen at {} and again at {}", pair[0], pair[1]);
        }
        assert!(times.len() as u64 <= duration / third.0 + 1, "{key}: {} agent-seen outcomes", times.len());
    }
    let mut per_window: BTreeMap<u64, usize> = BTreeMap::new();
    for times in seen.values() {
        for t in times {
            *per_window.entry(t.0 / third.0).or_default() += 1;
        }
    }
    let busiest = per_window.values().max().copied().unwrap_or(0);
    assert!(busiest <= agents.len(), "{busiest} agent-seen outcomes within one stall_after/3");
    let n_heartbeats = w.d.outcomes().iter().filter(|o| o.command.type_name == "agent.heartbeat").count();
    let n_seen: usize = seen.values().map(Vec::len).sum();
    assert!(n_seen * 3 <= n_heartbeats * 2, "{n_seen} of {n_heartbeats} heartbeats carry agent-seen");
}
