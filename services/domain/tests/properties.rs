//! Why this exists: table tests check one decision at a time; the promises of DESIGN sections 3-7 (nothing held twice,
//! nothing freed early, terminal is final, observations applied in order, one command one outcome, state a
//! deterministic fold) must hold over any interleaving, across partitions, with the writer crashing between the
//! parts of a decision. So: random command sequences from several issuers with skewed clocks, over a universe small
//! enough that commands collide, on 1 to 3 partitions whose cross-partition messages a sweeper model carries late,
//! twice, out of order, or makes up; checked after every part of every outcome against those promises and small
//! reference models.
//!
//! A scenario is a list of abstract steps (time moves, an action with small selectors, what happens between the
//! parts of a long decision). The runner interprets each step against the live states, builds one envelope, routes it
//! to its partition, decides it on that partition's driver and on a twin, and then plays the writer: while the
//! decision is unfinished it offers other commands (the core must refuse them and leave them unconsumed), sometimes
//! crashes and reloads from the log (the state must be the same), and appends the next part. The twin never crashes:
//! both logs must be identical. After every part:
//!
//! 1. no pool identifier is bound to two live resources, and every live binding is what its pool (in whatever
//!    partition) holds;
//! 2. granted leases stay within capacity, and leases wait only on pending or active resources (a reference model
//!    folded from the outcomes, compared with state; the fairness of the queue is `queue.rs`'s);
//! 3. terminal resources and leases never change while they stay in state;
//! 4. a resource's own claim goes back only with its terminal state, a grant goes straight back only from a bind and
//!    never one the resource holds, and a pool frees only a claim given back with that token;
//! 5. folding every outcome from scratch gives the live state, and a reload between parts changes nothing;
//! 6. the twin (same commands, no crashes) gives the same parts;
//! 7. `invariants::check` passes;
//! 8. pools agree with a reference model: grants go to the first waiter, never to a held identifier, never before
//!    the cool-down, in the promised order, and nobody waits while an identifier is free after a serving command;
//! 9. observations, against a model of each resource: `lost` and `destroyed` only by an observation that named the
//!    handle absent, with the watermark covering its creation (or destruction) and presence last seen by an older
//!    observation; observations strictly ordered per agent; `orphaned` and `failed` only by their commands;
//! 10. the breaker: a report marks exactly the losses the model counts, unless the model's count of the window's
//!     losses (with the ones it would add) trips it, and then it marks none;
//! 11. a command id decided once is never decided again (answered "already decided", or refused as stale), and a
//!     resource or lease id is never allocated twice in a partition, even long after it was forgotten;
//! 12. every part encodes under the outcome cap; every command sent encodes under the command limit;
//! 13. the parts of a decision are contiguous in the log and nothing is decided between them;
//! 14. at the end, once the sweeper has delivered what it still had and reconciled every pool against its holders,
//!     no pool holds an identifier for a holder that does not hold it: nothing leaks.
//!
//! The light run uses small split budgets, so ordinary decisions take several parts; the heavy run uses the real
//! budget with resources carrying hundreds of leases and reports naming hundreds of handles. A third test feeds two
//! agents an endless stream of heartbeats, lease renewals and reports and checks that state stays bounded.

mod support;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Mutex;

use leasehold_domain::driver::{Answer, Driver};
use leasehold_domain::state::{ClaimSlot, Holding, LeaseState, Liveness, PartitionState, ResourceState};
use leasehold_domain::{EFFECT_BUDGET_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, WriterError, invariants};
use leasehold_schemas::codec::{self, MAX_COMMAND_BYTES, MAX_OUTCOME_BYTES};
use leasehold_schemas::command::*;
use leasehold_schemas::ids::*;
use leasehold_schemas::outcome::{BreakerClear, Effect};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{Command, Envelope, Outcome, RejectionKind, Uuid};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::{T0, accepted, agent_name, pool_name, secs};

// =================================================================================================================
// The universe: few agents, few ids, few identifiers, so that commands collide.

/// Cases per run unless `LH_PROPERTY_CASES` / `LH_HEAVY_CASES` say otherwise (soaks run many more in release).
const LIGHT_CASES: u32 = 192;
const HEAVY_CASES: u32 = 3;
const MAX_STEPS: usize = 150;
/// Who sends `op` and `sys` commands (agents send under their own names).
const OPS: &[&str] = &["op:alice", "op:bob", "op:ci-scheduler"];
const SWEEPERS: &[&str] = &["sweeper-1", "sweeper-2"];
/// A pool nobody defines: allocations naming it wait forever, claims to it are refused.
const GHOST_POOL: &str = "ghost";
/// The outcome horizons a scenario switches between.
const HORIZONS: [Millis; 4] =
    [Millis::from_mins(1), Millis::from_hours(1), Millis::from_hours(6), Millis::from_hours(24)];
/// The sweeper model keeps this many messages on offer; older ones are dropped (a sweeper that forgot).
const BAG: usize = 96;
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

/// An agent's own settings, or `None` (it follows the partition's policy, the default one here: these tests
/// change only the horizon, so the model may take the effective settings of the registration).
fn agent_settings(choice: u8) -> Option<AgentSettings> {
    Some(match choice % 4 {
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
        2 => return None,
        // Invalid (orphan_after not after stall_after): rejected.
        _ => AgentSettings {
            stall_after: Millis::from_mins(10),
            orphan_after: Millis::from_mins(10),
            ..Default::default()
        },
    })
}

/// The first name `<prefix><i>` whose key falls in `partition` of `partitions`.
fn name_in(prefix: &str, partition: u32, partitions: u32, taken: &BTreeSet<String>, pool: bool) -> String {
    (1..)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| {
            let key = if pool { Key::Pool(pool_name(name)) } else { Key::Agent(agent_name(name)) };
            !taken.contains(name) && partition_of_key(&key, partitions) == partition
        })
        .expect("some name falls in every partition")
}

// =================================================================================================================
// What proptest generates: abstract steps, interpreted against the live states.

#[derive(Debug, Clone)]
struct Scenario {
    partitions: u32,
    split_budget: usize,
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
    skew_s: i32,
    /// Picks the issuer among several of the class (and, rarely, a wrong one for an agent command).
    who: u8,
    act: Act,
    /// What the writer does between the parts of this step's decision, if it has several.
    between: Between,
}

#[derive(Debug, Clone)]
struct Between {
    /// How many other commands are offered before each next part (the core must refuse them all).
    offers: u8,
    /// Crash after part k (bit k of the mask, for the first 8 parts) and fold the log again.
    crashes: u8,
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
    /// `ahead_min`: the id is stamped this many minutes ahead of the log (some beyond the horizon).
    Allocate {
        agent: u8,
        res: u8,
        pools: u8,
        parent: Option<u8>,
        capacity: u8,
        ahead_min: Option<u16>,
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
    Drain {
        agent: u8,
        deadline_s: Option<u16>,
        grace_s: Option<u16>,
    },
    Uncordon {
        agent: u8,
    },
    ConfirmLoss {
        agent: u8,
    },
    DefinePool {
        which: u8,
    },
    Horizon {
        partition: u8,
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
    /// A report about every resource of the agent in one state: created (pending), missing (held) or destroyed
    /// (releasing). Heavy on purpose.
    SyncAll {
        agent: u8,
        what: u8,
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
    /// Many allocations on one agent at once (each its own command).
    Mass {
        agent: u8,
        n: u16,
        capacity: u16,
    },
    /// Many leases asked for on one resource at once (each its own command).
    Flood {
        res: u8,
        n: u16,
    },
    /// A command with one field as large or as odd as the codec lets through.
    Big {
        what: u8,
        size: u8,
        multibyte: bool,
        res: u8,
    },
    /// The sweeper sends a message it learnt from an outcome (claim, bind-claim, free, adopt, cascade).
    FollowUp {
        pick: u8,
        keep: bool,
    },
    /// The sweeper sends a time-driven command it read off the states (due or not).
    Timer {
        kind: u8,
        pick: u8,
    },
    /// A confused sweeper: claims, frees, cascades and adoptions that no effect asked for; real grants re-sent
    /// late to their holder, sometimes with the wrong claim named.
    Junk {
        kind: u8,
        a: u8,
        b: u8,
    },
    /// An envelope sent before, sent again.
    Retry {
        pick: u8,
    },
    /// An envelope sent before, sent again with the same command id but a fresh issuer time (a producer that
    /// stamps each attempt): only the id tells it is a retry.
    Replay {
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

fn act(heavy: bool) -> impl Strategy<Value = Act> {
    let agent = || 0u8..3;
    let sel = any::<u8>;
    let secs_opt = |p: f64| prop::option::weighted(p, 1u16..600);
    let marks = |kinds: u8| prop::collection::vec((0u8..kinds, any::<u8>()), 0..6);
    let (mass, flood, sync_all) = if heavy { (10, 30, 20) } else { (6, 3, 14) };
    let mass_n = if heavy { 5u16..120 } else { 2u16..12 };
    let flood_n = if heavy { 16u16..300 } else { 2u16..8 };
    let mass_capacity =
        if heavy { prop_oneof![1 => Just(1u16), 2 => 2u16..64, 3 => Just(1024)].boxed() } else { (1u16..4).boxed() };
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
            prop::option::weighted(0.08, 0u16..1800),
        )
            .prop_map(|(agent, res, pools, parent, capacity, ahead_min)| Act::Allocate {
                agent,
                res,
                pools,
                parent,
                capacity,
                ahead_min
            }),
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
        1 => (agent(), secs_opt(0.5), secs_opt(0.7))
            .prop_map(|(agent, deadline_s, grace_s)| Act::Drain { agent, deadline_s, grace_s }),
        1 => agent().prop_map(|agent| Act::Uncordon { agent }),
        2 => agent().prop_map(|agent| Act::ConfirmLoss { agent }),
        1 => (0u8..3).prop_map(|which| Act::DefinePool { which }),
        3 => (sel(), 0u8..4).prop_map(|(partition, which)| Act::Horizon { partition, which }),
        14 => (sel(), obs()).prop_map(|(res, obs)| Act::ReportCreated { res, obs }),
        22 => (agent(), marks(32), wm(), prop::bool::weighted(0.85), obs())
            .prop_map(|(agent, marks, wm, honest, obs)| Act::Sync { agent, marks, wm, honest, obs }),
        sync_all => (agent(), 0u8..3, obs()).prop_map(|(agent, what, obs)| Act::SyncAll { agent, what, obs }),
        5 => (agent(), sel(), sel(), marks(8), wm(), obs())
            .prop_map(|(agent, lo, hi, marks, wm, obs)| Act::Chunk { agent, lo, hi, marks, wm, obs }),
        6 => (sel(), prop::bool::weighted(0.5), obs())
            .prop_map(|(res, create_failed, obs)| Act::AgentFailure { res, create_failed, obs }),
        6 => (sel(), any::<bool>(), obs()).prop_map(|(res, healthy, obs)| Act::Health { res, healthy, obs }),
        mass => (agent(), mass_n, mass_capacity).prop_map(|(agent, n, capacity)| Act::Mass { agent, n, capacity }),
        flood => (sel(), flood_n).prop_map(|(res, n)| Act::Flood { res, n }),
        3 => (0u8..13, any::<u8>(), prop::bool::weighted(0.3), sel())
            .prop_map(|(what, size, multibyte, res)| Act::Big { what, size, multibyte, res }),
        48 => (sel(), prop::bool::weighted(0.3)).prop_map(|(pick, keep)| Act::FollowUp { pick, keep }),
        22 => (0u8..10, sel()).prop_map(|(kind, pick)| Act::Timer { kind, pick }),
        // Busy on purpose: made-up claims once hid a double holding (a bind of a grant that answered an earlier
        // claim of the same holder), and a grant sent back once came back bound.
        30 => (0u8..6, sel(), sel()).prop_map(|(kind, a, b)| Act::Junk { kind, a, b }),
        4 => sel().prop_map(|pick| Act::Retry { pick }),
        4 => sel().prop_map(|pick| Act::Replay { pick }),
    ]
}

fn clock() -> impl Strategy<Value = Clock> {
    prop_oneof![
        6 => Just(Clock::Same),
        28 => (0u32..=30_000).prop_map(Clock::Forward),
        8 => (30_000u32..=300_000).prop_map(Clock::Forward),
        1 => (600u32..=3 * 3600).prop_map(Clock::Long),
        1 => (20 * 3600u32..=30 * 3600).prop_map(Clock::Long),
        2 => (0u32..=120_000).prop_map(Clock::Back),
    ]
}

fn between() -> impl Strategy<Value = Between> {
    (prop_oneof![2 => Just(0u8), 2 => 1u8..3], prop_oneof![1 => Just(0u8), 2 => any::<u8>()])
        .prop_map(|(offers, crashes)| Between { offers, crashes })
}

fn step(heavy: bool) -> impl Strategy<Value = Step> {
    let skew = prop_oneof![8 => Just(0i32), 12 => -600i32..=600, 1 => -30 * 3600i32..=30 * 3600];
    (clock(), skew, any::<u8>(), act(heavy), between()).prop_map(|(clock, skew_s, who, act, between)| Step {
        clock,
        skew_s,
        who,
        act,
        between,
    })
}

fn scenario(heavy: bool) -> impl Strategy<Value = Scenario> {
    let pool = (
        any::<bool>(),
        prop_oneof![1 => Just(1u32), 3 => 2u32..=3],
        prop_oneof![Just(0u64), Just(5), Just(30), Just(60)],
    )
        .prop_map(|(slots, size, cooldown_s)| PoolSpec { slots, size, cooldown_s });
    let budget = if heavy {
        Just(EFFECT_BUDGET_BYTES).boxed()
    } else {
        prop_oneof![1 => Just(EFFECT_BUDGET_BYTES), 2 => Just(2048usize), 2 => Just(512usize), 4 => Just(96usize)]
            .boxed()
    };
    let steps = if heavy { 20..60 } else { 1..MAX_STEPS };
    let prefix = if heavy { heavy_prefix().boxed() } else { Just(vec![]).boxed() };
    (
        prop_oneof![1 => Just(1u32), 3 => Just(2u32), 2 => Just(3u32)],
        budget,
        2usize..=3,
        prop::collection::vec(0u8..3, 3),
        prop::collection::vec(pool, 1..=2),
        prop::collection::vec(step(heavy), steps),
        prefix,
    )
        .prop_map(|(partitions, split_budget, n_agents, settings, pools, steps, prefix)| Scenario {
            partitions,
            split_budget,
            n_agents,
            settings,
            pools,
            steps: prefix.into_iter().chain(steps).collect(),
        })
}

/// The heavy run starts by building what makes a decision heavy: an agent with tens of pending resources of
/// capacity 1024, thousands of waiting leases with long holders, and then one report that creates them all (every
/// waiting lease granted in one decision), before the random steps.
fn heavy_prefix() -> impl Strategy<Value = Vec<Step>> {
    let calm = || Between { offers: 0, crashes: 0 };
    let at = |act: Act, between: Between| Step { clock: Clock::Forward(1000), skew_s: 0, who: 0, act, between };
    (20u16..80, prop::collection::vec((any::<u8>(), 250u16..300), 9..14), between()).prop_map(
        move |(n, floods, between)| {
            let mut steps = vec![at(Act::Mass { agent: 0, n, capacity: 1024 }, calm())];
            for (res, n) in floods {
                steps.push(at(Act::Flood { res: res | 1, n }, calm()));
            }
            steps.push(at(Act::SyncAll { agent: 0, what: 0, obs: Obs::Next }, between));
            steps
        },
    )
}

// =================================================================================================================
// The reference models and the checks.

const PROPERTY_NAMES: [&str; 15] = [
    "",
    "1 (no identifier held by two live holders)",
    "2 (live leases within capacity)",
    "3 (terminal states never change)",
    "4 (claims go back only from terminal resources or as grants sent back)",
    "5 (rebuild and reload equal the live state)",
    "6 (the twin decides the same parts)",
    "7 (structural invariants)",
    "8 (pool reference model)",
    "9 (observation rules)",
    "10 (the breaker against a model of the window)",
    "11 (a command id is decided once, a resource or lease id allocated once)",
    "12 (sizes: outcome cap, command limit)",
    "13 (nothing between the parts of a decision)",
    "14 (nothing leaks once the sweeper has caught up)",
];

/// The shortest outcome horizon a scenario uses: records kept at least this long.
const MIN_HORIZON: Millis = HORIZONS[0];

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

impl Life {
    fn held(self) -> bool {
        matches!(self, Life::Active | Life::Paused | Life::Suspect { .. })
    }
}

#[derive(Debug)]
struct ResourceModel {
    partition: u32,
    /// When it turned terminal: it stays in state at least a horizon after this (and after its id's time).
    terminal_at: Option<Timestamp>,
    capacity: u32,
    life: Life,
    /// Granted leases (at most `capacity`).
    live: BTreeSet<LeaseId>,
    /// Waiting leases: on a pending resource within capacity (`lease-waiting`), or queued (`lease-queued`).
    waiting: BTreeSet<LeaseId>,
    /// Creation position: `create-ordered`, or the allocation until then.
    creation: Position,
    /// Whether its create was ordered (only then can an observation make it active).
    create_ordered: bool,
    /// The position of its last `resource-suspect`.
    suspect_since: Option<Position>,
    /// Flagged suspect-upstream: no lease is granted.
    flagged: bool,
    destruction: Option<Position>,
    last_present: Option<ObsStamp>,
}

#[derive(Debug)]
struct AgentModel {
    settings: AgentSettings,
    last_obs: ObsStamp,
    /// Log times of the losses the breaker counts.
    losses: Vec<Timestamp>,
    bypass: bool,
    spent: Option<ObsStamp>,
    /// While the breaker holds: the watermark of the report that tripped it.
    tripped: Option<Position>,
    /// The watermark of the last report or chunk accepted.
    last_watermark: Position,
}

#[derive(Debug)]
struct PoolModel {
    /// Its identifiers, in order (computed as needed: a /8 has millions).
    kind: PoolKind,
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
            kind: kind.clone(),
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
    /// freed one whose cool-down has passed.
    fn next_available(&self, now: Timestamp) -> Option<PoolValue> {
        let mut fresh = (0..self.kind.size()).filter_map(|idx| self.kind.value_at(idx));
        if let Some(fresh) = fresh.find(|v| !self.used.contains(v)) {
            return Some(fresh);
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

/// The breaker's verdict the model expects of a report, made at its first part.
#[derive(Debug)]
struct OpenDecision {
    what: String,
    expected_losses: usize,
    marked: usize,
}

#[derive(Debug, Default)]
struct Checker {
    resources: BTreeMap<ResourceRef, ResourceModel>,
    leases: BTreeMap<(u32, LeaseId), ResourceRef>,
    agents: BTreeMap<AgentName, AgentModel>,
    terminal_resources: BTreeMap<ResourceRef, ResourceState>,
    terminal_leases: BTreeMap<(u32, LeaseId), LeaseState>,
    /// Claims given back (own claims of terminal resources, and grants sent back): (pool, holder, token) -> value.
    releasable: BTreeMap<(PoolName, ResourceRef, Position), Option<PoolValue>>,
    pools: BTreeMap<PoolName, PoolModel>,
    open: Option<OpenDecision>,
    /// Every resource and lease id ever allocated, by partition.
    allocated: BTreeSet<(u32, ResourceId)>,
    leased: BTreeSet<(u32, LeaseId)>,
    /// When each lease that ended in state ended.
    lease_ended: BTreeMap<(u32, LeaseId), Timestamp>,
}

fn terminal_of(effect: &Effect) -> Option<ResourceId> {
    match effect {
        Effect::ResourceDestroyed { resource, .. }
        | Effect::ResourceLost { resource, .. }
        | Effect::ResourceOrphaned { resource }
        | Effect::ResourceFailed { resource, .. } => Some(*resource),
        _ => None,
    }
}

/// What an observation says of a handle: named present (or held), absent, in flight, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Present,
    Absent,
    InFlight,
}

/// What the observation `body` says of `id`, as DESIGN section 6 reads it (`None`: not judged).
fn said_of(body: &Command, id: ResourceId) -> Option<Said> {
    match body {
        Command::Sync(r) => {
            if r.in_flight.contains(&id) {
                Some(Said::InFlight)
            } else if r.missing.contains(&id) || r.destroyed.contains(&id) {
                Some(Said::Absent)
            } else if r.created.contains(&id) {
                Some(Said::Present)
            } else {
                None
            }
        }
        Command::ResyncChunk(c) if c.covers(id) => {
            if c.in_flight.contains(&id) {
                Some(Said::InFlight)
            } else if c.held.contains(&id) {
                Some(Said::Present)
            } else {
                Some(Said::Absent)
            }
        }
        _ => None,
    }
}

fn observation_of(body: &Command) -> Option<(&AgentName, ObsStamp, Position)> {
    match body {
        Command::Sync(r) => Some((&r.agent, ObsStamp { epoch: r.epoch, obs: r.obs }, r.watermark)),
        Command::ResyncChunk(c) => Some((&c.agent, ObsStamp { epoch: c.epoch, obs: c.obs }, c.watermark)),
        _ => None,
    }
}

impl Checker {
    fn reference(o: &Outcome, id: ResourceId) -> Option<ResourceRef> {
        match &o.command.key {
            Key::Agent(agent) => Some(ResourceRef::new(agent.clone(), id)),
            Key::Pool(_) | Key::Placement(_) => None,
        }
    }

    /// At the first part of a report: what the breaker must do, by the model.
    fn begin(&mut self, envelope: &Envelope, first: &Outcome) -> Result<(), Violation> {
        self.open = None;
        if first.rejection().is_some() {
            return Ok(());
        }
        let Some((agent_name, stamp, watermark)) = observation_of(&envelope.body) else {
            return Ok(());
        };
        let Some(agent) = self.agents.get(agent_name) else {
            return violation(10, format!("a report of {agent_name} was accepted, but the model has no such agent"));
        };
        let now = first.decided_at;
        let mut n_would = 0;
        let mut n_held = 0;
        for (reference, model) in self.resources.iter().filter(|(r, _)| r.agent == *agent_name) {
            if model.life.held() {
                n_held += 1;
            }
            let absent = said_of(&envelope.body, reference.resource) == Some(Said::Absent);
            if absent
                && model.life.held()
                && model.creation <= watermark
                && model.last_present.is_none_or(|seen| seen < stamp)
            {
                n_would += 1;
            }
        }
        let settings = &agent.settings;
        let since = now.saturating_sub(settings.loss_window);
        let in_window = agent.losses.iter().filter(|t| **t > since).count() as u64;
        let total = in_window + n_would as u64;
        let trips = n_would > 0
            && total >= u64::from(settings.max_loss_min)
            && total * 100 > (n_held + in_window) * u64::from(settings.max_loss_percent);
        // While the breaker holds, nothing is marked until a sync report at or past the tripping watermark.
        let held =
            agent.tripped.is_some_and(|tripped| !matches!(envelope.body, Command::Sync(_)) || watermark < tripped);
        let expected_losses = if agent.bypass {
            n_would
        } else if held || trips {
            0
        } else {
            n_would
        };
        let what = format!(
            "{} of {agent_name} ({stamp:?}): {n_would} would be lost, {in_window} lost in the window, {n_held} held, \
             bypass {}, trips {trips}",
            envelope.type_name(),
            agent.bypass
        );
        self.open = Some(OpenDecision { what, expected_losses, marked: 0 });
        Ok(())
    }

    /// At the last part of a decision: the breaker marked what the model expects.
    fn end(&mut self) -> Result<(), Violation> {
        if let Some(open) = self.open.take()
            && open.marked != open.expected_losses
        {
            return violation(
                10,
                format!(
                    "{}; the model expects {} losses marked, the decision marked {}",
                    open.what, open.expected_losses, open.marked
                ),
            );
        }
        Ok(())
    }

    /// Checks one part of an outcome against the state before it and the models, and folds it into the models.
    fn part(
        &mut self,
        partition: u32,
        pre: &PartitionState,
        envelope: &Envelope,
        o: &Outcome,
    ) -> Result<(), Violation> {
        self.claims_returned(pre, o)?;
        self.effects(partition, envelope, o)?;
        self.pool_model(envelope, o)
    }

    /// Property 4.
    fn claims_returned(&mut self, pre: &PartitionState, o: &Outcome) -> Result<(), Violation> {
        let ty = o.command.type_name.as_str();
        let terminal_here: BTreeSet<ResourceId> = o.effects().iter().filter_map(terminal_of).collect();
        for (position, effect) in o.positioned_effects() {
            match effect {
                Effect::ClaimReleasable { resource, pool, value, token } => {
                    let Some(holder) = Self::reference(o, *resource) else {
                        return violation(4, format!("claim-releasable at {position} in an outcome about a pool"));
                    };
                    if !terminal_here.contains(resource) {
                        return violation(
                            4,
                            format!(
                                "claim-releasable for {holder} on {pool} at {position} by {ty} without its terminal state"
                            ),
                        );
                    }
                    if let Some(token) = token {
                        self.releasable.insert((pool.clone(), holder, *token), *value);
                    }
                }
                Effect::GrantReturned { resource, pool, value, token } => {
                    let Some(holder) = Self::reference(o, *resource) else {
                        return violation(4, format!("grant-returned at {position} in an outcome about a pool"));
                    };
                    if ty != "sys.bind-claim" {
                        return violation(4, format!("grant-returned for {holder} decided by {ty}, not a bind"));
                    }
                    let slot =
                        pre.resource(*resource).filter(|r| r.agent == holder.agent).and_then(|r| r.claims.get(pool));
                    if matches!(slot, Some(ClaimSlot::Bound { token: t, .. }) if t == token) {
                        return violation(4, format!("grant-returned for {holder} of {value} that it holds bound"));
                    }
                    self.releasable.insert((pool.clone(), holder, *token), Some(*value));
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

    fn set_life(&mut self, reference: &ResourceRef, life: Life) {
        if let Some(model) = self.resources.get_mut(reference) {
            model.life = life;
        }
    }

    /// A health result acts only on a check asked for since the resource last turned suspect.
    fn health_answers(&self, reference: &ResourceRef, envelope: &Envelope) -> Result<(), Violation> {
        let Command::HealthResult(result) = &envelope.body else {
            return violation(9, format!("{reference}'s health decided by {}", envelope.type_name()));
        };
        let since = self.resources.get(reference).and_then(|m| m.suspect_since);
        if since.is_none_or(|since| result.request < since) {
            return violation(
                9,
                format!(
                    "a health result for a check asked at {} acted on {reference}, suspect since {since:?}",
                    result.request
                ),
            );
        }
        Ok(())
    }

    fn terminal(&mut self, reference: &ResourceRef, at: Timestamp) {
        self.set_life(reference, Life::Terminal);
        if let Some(model) = self.resources.get_mut(reference) {
            model.terminal_at = Some(at);
        }
    }

    /// Property 11's other half: what a partition forgets (terminal resources and leases, released pool holders)
    /// it forgets no earlier than a horizon after its time and its id's time, and a pool forgets only its own record.
    fn forgetting(&mut self, partition: u32, state: &PartitionState) -> Result<(), Violation> {
        let horizon = state.settings().outcome_horizon;
        let now = state.now();
        let early = |since: Timestamp| since.saturating_add(horizon) >= now;
        let mut gone = Vec::new();
        for (reference, model) in self.resources.iter().filter(|(_, m)| m.partition == partition) {
            if state.resource(reference.resource).is_some_and(|r| r.agent == reference.agent) {
                continue;
            }
            let Some(ended) = model.terminal_at else {
                return violation(2, format!("resource {reference} left state while {:?}", model.life));
            };
            let since = ended.max(reference.resource.time());
            if early(since) {
                return violation(11, format!("resource {reference} forgotten at {now}, before {since} + {horizon}"));
            }
            gone.push(reference.clone());
        }
        for reference in gone {
            self.resources.remove(&reference);
        }
        let ended: Vec<((u32, LeaseId), Timestamp)> =
            self.lease_ended.iter().filter(|((p, _), _)| *p == partition).map(|(k, t)| (*k, *t)).collect();
        for ((p, lease), at) in ended {
            if state.lease(lease).is_some() {
                continue;
            }
            let since = at.max(lease.time());
            if early(since) {
                return violation(11, format!("lease {lease} forgotten at {now}, before {since} + {horizon}"));
            }
            self.lease_ended.remove(&(p, lease));
        }
        for pool in state.pools() {
            let Some(model) = self.pools.get_mut(&pool.name) else { continue };
            let mut gone = Vec::new();
            for (holder, (ended, source)) in &model.released {
                match pool.released.get(holder) {
                    Some((kept, _)) if kept == source => {}
                    Some((kept, _)) => {
                        return violation(
                            8,
                            format!("pool {}: {holder}'s record is {kept}, the model's {source}", pool.name),
                        );
                    }
                    None if early(*ended) => {
                        return violation(
                            11,
                            format!("pool {} forgot {holder} at {now}, before {ended} + {horizon}", pool.name),
                        );
                    }
                    None => gone.push(holder.clone()),
                }
            }
            for holder in gone {
                model.released.remove(&holder);
            }
        }
        Ok(())
    }

    /// Properties 2 and 9, and the resource and agent models.
    fn effects(&mut self, partition: u32, envelope: &Envelope, o: &Outcome) -> Result<(), Violation> {
        let ty = o.command.type_name.as_str();
        let now = o.decided_at;
        let agent_key = match &o.command.key {
            Key::Agent(agent) => Some(agent.clone()),
            Key::Pool(_) | Key::Placement(_) => None,
        };
        for (position, effect) in o.positioned_effects() {
            let at = |id: &ResourceId| agent_key.as_ref().map(|a| ResourceRef::new(a.clone(), *id));
            let mut touched = None;
            match effect {
                Effect::AgentRegistered { settings, wiped, .. } => {
                    let Some(agent) = &agent_key else { continue };
                    let model = self.agents.entry(agent.clone()).or_insert_with(|| AgentModel {
                        settings: settings.clone(),
                        last_obs: ObsStamp::default(),
                        losses: Vec::new(),
                        bypass: false,
                        spent: None,
                        tripped: None,
                        last_watermark: Position::ZERO,
                    });
                    model.settings = settings.clone();
                    model.last_obs = ObsStamp { epoch: position, obs: 0 };
                    model.bypass = *wiped;
                    if *wiped {
                        model.tripped = None;
                    }
                }
                Effect::AgentSuspect { .. } => {
                    if let Some(model) = agent_key.as_ref().and_then(|a| self.agents.get_mut(a)) {
                        model.tripped = Some(model.last_watermark);
                    }
                }
                Effect::ObservationAccepted { stamp, watermark } => {
                    let Some(model) = agent_key.as_ref().and_then(|a| self.agents.get_mut(a)) else { continue };
                    if let Some(watermark) = watermark {
                        model.last_watermark = *watermark;
                    }
                    if *stamp <= model.last_obs {
                        return violation(
                            9,
                            format!("observation {stamp:?} accepted after {:?} of the same agent", model.last_obs),
                        );
                    }
                    model.last_obs = *stamp;
                }
                Effect::AgentBreakerCleared { reason } => {
                    let Some(model) = agent_key.as_ref().and_then(|a| self.agents.get_mut(a)) else { continue };
                    if matches!(reason, BreakerClear::HandlesBack {}) {
                        let knows_enough = observation_of(&envelope.body)
                            .is_some_and(|(_, _, w)| model.tripped.is_none_or(|tripped| w >= tripped));
                        if ty != "agent.sync" || !knows_enough {
                            return violation(
                                10,
                                format!(
                                    "the breaker (tripped at watermark {:?}) was cleared by {ty}: only a sync report at \
                                     or past that watermark names every handle",
                                    model.tripped
                                ),
                            );
                        }
                    }
                    if matches!(reason, BreakerClear::LossConfirmed { .. }) {
                        model.bypass = true;
                        model.losses.clear();
                    }
                    model.tripped = None;
                }
                Effect::AgentBreakerRearmed {} => {
                    if let Some(model) = agent_key.as_ref().and_then(|a| self.agents.get_mut(a)) {
                        model.bypass = false;
                        model.spent = Some(model.last_obs);
                    }
                }
                Effect::ResourceAllocated { resource, capacity, .. } => {
                    let Some(reference) = at(resource) else { continue };
                    if !self.allocated.insert((partition, *resource)) {
                        return violation(11, format!("resource id {resource} allocated a second time ({reference})"));
                    }
                    let model = ResourceModel {
                        partition,
                        terminal_at: None,
                        capacity: *capacity,
                        life: Life::Pending,
                        live: BTreeSet::new(),
                        waiting: BTreeSet::new(),
                        creation: position,
                        create_ordered: false,
                        suspect_since: None,
                        flagged: false,
                        destruction: None,
                        last_present: None,
                    };
                    self.resources.insert(reference, model);
                }
                Effect::CreateOrdered { resource } => {
                    if let Some(model) = at(resource).and_then(|r| self.resources.get_mut(&r)) {
                        model.creation = position;
                        model.create_ordered = true;
                    }
                }
                Effect::UpstreamFlagged { resource, suspect, .. } => {
                    if let Some(model) = at(resource).and_then(|r| self.resources.get_mut(&r)) {
                        model.flagged = *suspect;
                    }
                }
                Effect::ResourceUpdated { resource, capacity: Some(capacity), .. } => {
                    if let Some(reference) = at(resource)
                        && let Some(model) = self.resources.get_mut(&reference)
                    {
                        model.capacity = *capacity;
                        touched = Some(reference);
                    }
                }
                Effect::ResourceActivated { resource, stamp, .. } => {
                    let Some(reference) = at(resource) else { continue };
                    if let Some(model) = self.resources.get_mut(&reference) {
                        // An agent creates only what it was ordered to, and knew of as of its report's watermark.
                        let known = observation_of(&envelope.body).is_none_or(|(_, _, w)| model.creation <= w);
                        if !model.create_ordered || !known {
                            return violation(
                                9,
                                format!(
                                    "{reference} activated by {ty}: create ordered {} at {}, the report's watermark {:?}",
                                    model.create_ordered,
                                    model.creation,
                                    observation_of(&envelope.body).map(|(_, _, w)| w)
                                ),
                            );
                        }
                        model.last_present = model.last_present.max(Some(*stamp));
                    }
                    self.set_life(&reference, Life::Active);
                }
                Effect::ResourceSeen { resource, stamp, .. } => {
                    if let Some(model) = at(resource).and_then(|r| self.resources.get_mut(&r)) {
                        model.last_present = model.last_present.max(Some(*stamp));
                    }
                }
                Effect::ResourceUnpaused { resource, .. } => {
                    if let Some(reference) = at(resource) {
                        self.set_life(&reference, Life::Active);
                    }
                }
                Effect::ResourceHealthy { resource } => {
                    let Some(reference) = at(resource) else { continue };
                    self.health_answers(&reference, envelope)?;
                    let was_paused =
                        self.resources.get(&reference).map(|m| m.life) == Some(Life::Suspect { was_paused: true });
                    self.set_life(&reference, if was_paused { Life::Paused } else { Life::Active });
                }
                Effect::ResourcePaused { resource, .. } => {
                    if let Some(reference) = at(resource) {
                        self.set_life(&reference, Life::Paused);
                    }
                }
                Effect::ResourceSuspect { resource, .. } => {
                    let Some(reference) = at(resource) else { continue };
                    if let Some(model) = self.resources.get_mut(&reference) {
                        model.suspect_since = Some(position);
                    }
                    let was_paused = self.resources.get(&reference).map(|m| m.life) == Some(Life::Paused);
                    self.set_life(&reference, Life::Suspect { was_paused });
                }
                Effect::ResourceReleasing { resource, cause } => {
                    let Some(reference) = at(resource) else { continue };
                    if matches!(cause, leasehold_schemas::outcome::ReleaseCause::HealthCheckFailed { .. }) {
                        self.health_answers(&reference, envelope)?;
                    }
                    if let Some(model) = self.resources.get_mut(&reference) {
                        model.destruction = Some(position);
                    }
                    self.set_life(&reference, Life::Releasing);
                }
                Effect::ResourceLost { resource, stamp } | Effect::ResourceDestroyed { resource, stamp } => {
                    let lost = matches!(effect, Effect::ResourceLost { .. });
                    let Some(reference) = at(resource) else { continue };
                    let Some((agent, said_stamp, watermark)) = observation_of(&envelope.body) else {
                        return violation(9, format!("{} of {reference} decided by {ty}, not a report", effect.name()));
                    };
                    let Some(model) = self.resources.get(&reference) else {
                        return violation(
                            9,
                            format!("{} of {reference}, which the model does not know", effect.name()),
                        );
                    };
                    let said = said_of(&envelope.body, *resource);
                    let mut problems = Vec::new();
                    if reference.agent != *agent || *stamp != said_stamp {
                        problems.push(format!("the report is {agent}'s {said_stamp:?}, the effect says {stamp:?}"));
                    }
                    if said != Some(Said::Absent) {
                        problems.push(format!("the report says {said:?} of it, not absent"));
                    }
                    if lost {
                        if !model.life.held() {
                            problems.push(format!("it was {:?}, not held", model.life));
                        }
                        if model.creation > watermark {
                            problems.push(format!("created at {} after the watermark {watermark}", model.creation));
                        }
                        if model.last_present.is_some_and(|seen| seen >= *stamp) {
                            problems.push(format!("seen present by {:?}, not older", model.last_present));
                        }
                    } else {
                        if model.life != Life::Releasing {
                            problems.push(format!("it was {:?}, not releasing", model.life));
                        }
                        if model.destruction.is_none_or(|d| d > watermark) {
                            problems.push(format!(
                                "its destruction {:?} is after the watermark {watermark}",
                                model.destruction
                            ));
                        }
                    }
                    if !problems.is_empty() {
                        return violation(
                            9,
                            format!("{} of {reference} by {ty}: {}", effect.name(), problems.join("; ")),
                        );
                    }
                    if lost {
                        if let Some(open) = &mut self.open {
                            open.marked += 1;
                        }
                        if let Some(agent) = self.agents.get_mut(&reference.agent)
                            && !agent.bypass
                            && agent.spent != Some(*stamp)
                        {
                            agent.losses.push(now);
                        }
                    }
                    self.terminal(&reference, now);
                }
                Effect::ResourceOrphaned { resource } | Effect::ResourceFailed { resource, .. } => {
                    let allowed: &[&str] = if matches!(effect, Effect::ResourceOrphaned { .. }) {
                        &["sys.mark-gone", "sys.orphan"]
                    } else {
                        &["agent.report-failure"]
                    };
                    if !allowed.contains(&ty) {
                        return violation(9, format!("{} of {resource} decided by {ty}", effect.name()));
                    }
                    if let Some(reference) = at(resource) {
                        self.terminal(&reference, now);
                    }
                }
                Effect::LeaseWaiting { lease, resource, .. }
                | Effect::LeaseQueued { lease, resource, .. }
                | Effect::LeaseGranted { lease, resource, .. } => {
                    let granted = matches!(effect, Effect::LeaseGranted { .. });
                    let Some(reference) = at(resource) else { continue };
                    let Some(model) = self.resources.get_mut(&reference) else {
                        return violation(
                            2,
                            format!("{} at {position} on unknown resource {reference}", effect.name()),
                        );
                    };
                    let grant_of_waiting = granted && model.waiting.remove(lease);
                    if !grant_of_waiting && !self.leased.insert((partition, *lease)) {
                        return violation(11, format!("lease id {lease} used a second time ({})", effect.name()));
                    }
                    if granted && model.flagged {
                        return violation(2, format!("{lease} granted on {reference}, flagged suspect-upstream"));
                    }
                    // A lease waits on a pending resource (`lease-waiting` within its capacity), queues on a pending
                    // or an active one, and is granted on an active one.
                    let fits = match effect {
                        Effect::LeaseWaiting { .. } => model.life == Life::Pending,
                        Effect::LeaseQueued { .. } => matches!(model.life, Life::Pending | Life::Active),
                        _ => model.life == Life::Active,
                    };
                    if !fits {
                        return violation(
                            2,
                            format!(
                                "{} of {lease} at {position} on {reference}, which is {:?}",
                                effect.name(),
                                model.life
                            ),
                        );
                    }
                    let waiting_over = matches!(effect, Effect::LeaseWaiting { .. })
                        && model.live.len() + model.waiting.len() >= model.capacity as usize;
                    if waiting_over {
                        return violation(
                            2,
                            format!("{lease} waits (lease-waiting) on {reference} beyond its capacity"),
                        );
                    }
                    if granted {
                        model.live.insert(*lease);
                    } else {
                        model.waiting.insert(*lease);
                    }
                    self.leases.insert((partition, *lease), reference.clone());
                    touched = Some(reference);
                }
                Effect::LeaseReleased { lease }
                | Effect::LeaseBroken { lease, .. }
                | Effect::LeaseExpired { lease }
                | Effect::LeaseFailed { lease } => {
                    if let Some(reference) = self.leases.get(&(partition, *lease))
                        && let Some(model) = self.resources.get_mut(reference)
                    {
                        model.live.remove(lease);
                        model.waiting.remove(lease);
                    }
                    self.lease_ended.insert((partition, *lease), now);
                }
                _ => {}
            }
            if let Some(reference) = touched {
                let model = &self.resources[&reference];
                if model.live.len() as u64 > u64::from(model.capacity) {
                    return violation(
                        2,
                        format!(
                            "after {} at {position}, resource {reference} has {} live leases over capacity {}",
                            effect.name(),
                            model.live.len(),
                            model.capacity
                        ),
                    );
                }
            }
        }
        for (reference, model) in &self.resources {
            if matches!(model.life, Life::Releasing | Life::Terminal)
                && !(model.live.is_empty() && model.waiting.is_empty())
            {
                return violation(
                    2,
                    format!(
                        "resource {reference} is {:?} with live leases {:?} and waiting {:?}",
                        model.life, model.live, model.waiting
                    ),
                );
            }
        }
        Ok(())
    }

    /// Property 8: pool commands against the pool reference model.
    fn pool_model(&mut self, envelope: &Envelope, o: &Outcome) -> Result<(), Violation> {
        let Key::Pool(name) = &o.command.key else {
            return Ok(());
        };
        if let Some(r) = o.rejection()
            && matches!(r.kind, RejectionKind::StaleCommand | RejectionKind::Invalid | RejectionKind::NotPermitted)
        {
            // Refused before any pool rule applies (stale or future-stamped ids, an issuer's clock).
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
                } else if let Some((at, _)) = model.released.get(&c.holder).filter(|(_, ended)| c.source == *ended) {
                    // The claim that ended, again: stale while the pool remembers it.
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
                // A withdrawal comes from the holder's `claim-releasable`, after its claim: an older one is made up.
                (Some(None), None) if model.claimed_from.get(&c.holder).is_some_and(|from| c.source <= *from) => {
                    Expect::Rejected(Some(RejectionKind::StaleSource))
                }
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
                                    "pool {name} granted {value} to {holder} at {position}, which neither waits nor claims now"
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

    /// Properties 1, 2 (against state), 3, 7 and the pool model against state, on every partition's state.
    fn states(&mut self, states: &[&PartitionState]) -> Result<(), Violation> {
        let partitions = states.len() as u32;
        let home = |key: &Key| states[partition_of_key(key, partitions) as usize];
        // 1: one live holder per identifier, and the pool (in its own partition) holds what a live resource has bound.
        let mut bound: BTreeMap<(PoolName, PoolValue), ResourceRef> = BTreeMap::new();
        for state in states {
            for resource in state.resources().filter(|r| !r.state.is_terminal()) {
                for (pool, slot) in &resource.claims {
                    let ClaimSlot::Bound { value, token, .. } = slot else { continue };
                    if let Some(other) = bound.insert((pool.clone(), *value), resource.reference()) {
                        return violation(
                            1,
                            format!("{value} of pool {pool} is bound to both {other} and {}", resource.reference()),
                        );
                    }
                    if let Some(p) = home(&Key::Pool(pool.clone())).pool(pool) {
                        match p.holders.get(&resource.reference()) {
                            Some(Holding::Granted { value: v, token: t, .. }) if v == value && t == token => {}
                            other => {
                                return violation(
                                    1,
                                    format!(
                                        "{} ({}) has {value} of pool {pool} bound with token {token}, but the pool \
                                         has {other:?} for it",
                                        resource.reference(),
                                        resource.state.name()
                                    ),
                                );
                            }
                        }
                    }
                }
            }
        }
        // 2: the lease model against state.
        let mut forgotten = Vec::new();
        for (reference, model) in &self.resources {
            let state = home(&Key::Agent(reference.agent.clone()));
            match state.resource(reference.resource).filter(|r| r.agent == reference.agent) {
                Some(r) => {
                    let (live, waiting): (BTreeSet<LeaseId>, BTreeSet<LeaseId>) =
                        r.live_leases.values().copied().partition(|id| {
                            state.lease(*id).is_some_and(|l| matches!(l.state, LeaseState::Active { .. }))
                        });
                    if live != model.live || waiting != model.waiting || r.capacity != model.capacity {
                        return violation(
                            2,
                            format!(
                                "resource {reference}: state has active leases {live:?}, waiting {waiting:?} and \
                                 capacity {}, the model {:?}, {:?} and {}",
                                r.capacity, model.live, model.waiting, model.capacity
                            ),
                        );
                    }
                }
                None if model.life == Life::Terminal => forgotten.push(reference.clone()),
                None => return violation(2, format!("resource {reference} left state while {:?}", model.life)),
            }
        }
        for reference in forgotten {
            self.resources.remove(&reference);
        }
        for state in states {
            if let Some(r) = state.resources().find(|r| !self.resources.contains_key(&r.reference())) {
                return violation(2, format!("resource {} is in state but no outcome allocated it", r.reference()));
            }
        }
        // 3: terminal states never change while in state.
        self.terminal_resources
            .retain(|reference, _| home(&Key::Agent(reference.agent.clone())).resource(reference.resource).is_some());
        self.terminal_leases.retain(|(p, id), _| states[*p as usize].lease(*id).is_some());
        for (p, state) in states.iter().enumerate() {
            for r in state.resources() {
                match self.terminal_resources.get(&r.reference()) {
                    Some(was) if *was != r.state => {
                        return violation(
                            3,
                            format!("resource {} was {was:?} and is now {:?}", r.reference(), r.state),
                        );
                    }
                    Some(_) => {}
                    None if r.state.is_terminal() => {
                        self.terminal_resources.insert(r.reference(), r.state.clone());
                    }
                    None => {}
                }
            }
            for l in state.leases() {
                match self.terminal_leases.get(&(p as u32, l.id)) {
                    Some(was) if *was != l.state => {
                        return violation(3, format!("lease {} was {was:?} and is now {:?}", l.id, l.state));
                    }
                    Some(_) => {}
                    None if !l.state.is_live() => {
                        self.terminal_leases.insert((p as u32, l.id), l.state.clone());
                    }
                    None => {}
                }
            }
            // 7.
            invariants::check(state).map_err(|e| (7, format!("partition {p}: {e}")))?;
        }
        // 8: the pool model against state.
        for (name, model) in &self.pools {
            let Some(pool) = home(&Key::Pool(name.clone())).pool(name) else {
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
// The runner: interprets steps, decides them on the partitions and their twins, plays the writer, checks.

/// What the runs exercised: a run that never split a decision or crashed between parts cannot pass unnoticed.
#[derive(Debug, Default, Clone)]
struct Stats {
    cases: u64,
    commands: u64,
    outcome_parts: u64,
    multi_part_decisions: u64,
    most_parts: u64,
    crashes_between_parts: u64,
    refused_between_parts: u64,
    already_decided: u64,
    cross_partition_commands: u64,
    adoptions: u64,
    grants_returned: u64,
    losses: u64,
    breaker_trips: u64,
    big_commands: u64,
    largest_outcome_bytes: usize,
    largest_command_bytes: usize,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.cases += other.cases;
        self.commands += other.commands;
        self.outcome_parts += other.outcome_parts;
        self.multi_part_decisions += other.multi_part_decisions;
        self.most_parts = self.most_parts.max(other.most_parts);
        self.crashes_between_parts += other.crashes_between_parts;
        self.refused_between_parts += other.refused_between_parts;
        self.already_decided += other.already_decided;
        self.cross_partition_commands += other.cross_partition_commands;
        self.adoptions += other.adoptions;
        self.grants_returned += other.grants_returned;
        self.losses += other.losses;
        self.breaker_trips += other.breaker_trips;
        self.big_commands += other.big_commands;
        self.largest_outcome_bytes = self.largest_outcome_bytes.max(other.largest_outcome_bytes);
        self.largest_command_bytes = self.largest_command_bytes.max(other.largest_command_bytes);
    }
}

/// Whether the partition remembers a decided command id among its recent commands (DESIGN 3, 4): not heartbeats
/// and reports (ordered by observation number), not `not-yet-due` answers (decided again when due), not accepted
/// renews (their lease remembers its last one).
fn remembered(o: &Outcome) -> bool {
    let ty = o.command.type_name.as_str();
    let accepted_renew = ty == "op.renew" && o.rejection().is_none();
    !matches!(ty, "agent.heartbeat" | "agent.sync" | "agent.resync-chunk")
        && !accepted_renew
        && o.rejection().is_none_or(|r| r.kind != RejectionKind::NotYetDue)
}

/// The command ids one partition remembers, by the time the horizon counts from.
#[derive(Debug, Default)]
struct Memory {
    by_since: BTreeSet<(Timestamp, CommandId)>,
    seq: BTreeMap<CommandId, u64>,
}

struct Sim {
    partitions: u32,
    heavy: bool,
    drivers: Vec<Driver>,
    twins: Vec<Driver>,
    clock: Timestamp,
    n_ids: u64,
    agents: Vec<AgentName>,
    pools: Vec<PoolName>,
    /// A key of each partition, to route its settings.
    keys: Vec<Key>,
    obs: BTreeMap<AgentName, u64>,
    epochs: BTreeMap<AgentName, Vec<Position>>,
    n_incarnations: u128,
    /// What the sweeper model may send: learnt from outcomes, sent late, twice, in any order, or never.
    bag: VecDeque<Command>,
    /// Every real grant seen, for a confused sweeper to carry again.
    grants: Vec<BindClaim>,
    /// The last health check asked for each resource (the agent answers it).
    checks_asked: BTreeMap<ResourceRef, Position>,
    sent: Vec<Envelope>,
    /// Per partition, the command ids the model says it remembers.
    memory: Vec<Memory>,
    /// Command ids decided once and forgotten since, and accepted renews: their partition and command sequence.
    /// Never decided again.
    forgotten_ids: BTreeMap<CommandId, (usize, u64)>,
    trace: Vec<String>,
    names: BTreeMap<String, String>,
    checker: Checker,
    step: usize,
    parts_since_rebuild: usize,
    stats: Stats,
}

impl Sim {
    fn new(scenario: &Scenario, heavy: bool) -> Self {
        let partitions = scenario.partitions;
        let mut taken = BTreeSet::new();
        let mut pick = |prefix: &str, partition: u32, pool: bool| {
            let name = name_in(prefix, partition % partitions, partitions, &taken, pool);
            taken.insert(name.clone());
            name
        };
        let agents: Vec<AgentName> = (0..scenario.n_agents as u32).map(|i| agent_name(&pick("w", i, false))).collect();
        let pools: Vec<PoolName> =
            (0..scenario.pools.len() as u32).map(|j| pool_name(&pick("p", j + 1, true))).collect();
        let keys = (0..partitions).map(|p| Key::Agent(agent_name(&pick("k", p, false)))).collect();
        let driver = |p: u32| {
            let state = PartitionState::new(p, partitions).with_split_budget(scenario.split_budget);
            let mut driver = Driver::with_state(state, T0);
            driver.finish_parts = false;
            driver
        };
        let drivers: Vec<Driver> = (0..partitions).map(driver).collect();
        Sim {
            partitions,
            heavy,
            twins: drivers.clone(),
            drivers,
            clock: T0,
            n_ids: 0,
            agents,
            pools,
            keys,
            obs: BTreeMap::new(),
            epochs: BTreeMap::new(),
            n_incarnations: 0,
            bag: VecDeque::new(),
            grants: Vec::new(),
            checks_asked: BTreeMap::new(),
            sent: Vec::new(),
            memory: (0..partitions).map(|_| Memory::default()).collect(),
            forgotten_ids: BTreeMap::new(),
            trace: Vec::new(),
            names: BTreeMap::new(),
            checker: Checker::default(),
            step: 0,
            parts_since_rebuild: 0,
            stats: Stats { cases: 1, ..Stats::default() },
        }
    }

    fn run(&mut self, scenario: &Scenario) -> Result<(), String> {
        let calm = Between { offers: 0, crashes: 0 };
        for (i, spec) in scenario.pools.iter().enumerate() {
            let body = DefinePool {
                pool: self.pools[i].clone(),
                kind: spec.kind(),
                cooldown: Some(secs(spec.cooldown_s)),
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            };
            let envelope = self.envelope(OPS[0], 0, body.into());
            self.submit(envelope, &calm)?;
        }
        for (i, agent) in self.agents.clone().into_iter().enumerate() {
            self.n_incarnations += 1;
            let body = Register {
                settings: agent_settings(scenario.settings[i]),
                ..Register::new(agent.clone(), Uuid::from_u128(self.n_incarnations))
            };
            let envelope = self.envelope(agent.as_str(), 0, body.into());
            self.submit(envelope, &calm)?;
        }
        for (i, step) in scenario.steps.iter().enumerate() {
            self.step = i + 1;
            match step.clock {
                Clock::Same => {}
                Clock::Forward(ms) => self.clock = self.clock.saturating_add(Millis(u64::from(ms))),
                Clock::Long(s) => self.clock = self.clock.saturating_add(secs(u64::from(s))),
                Clock::Back(ms) => self.clock = Timestamp(self.clock.0.saturating_sub(u64::from(ms))),
            }
            for envelope in self.interpret(step) {
                self.submit(envelope, &step.between)?;
            }
        }
        self.catch_up()?;
        for p in 0..self.drivers.len() {
            if self.drivers[p].outcomes() != self.twins[p].outcomes() {
                return Err(self.report(6, format!("partition {p}: the two logs differ")));
            }
            if self.drivers[p].rebuild() != *self.drivers[p].state() {
                return Err(self.report(5, format!("partition {p}: folding the log gives another state")));
            }
        }
        Ok(())
    }

    /// The sweeper catches up (property 14): it delivers everything it still has, then reconciles every pool
    /// against its holders as DESIGN section 7 says (a grant whose holder is terminal or unknown is freed; a grant
    /// whose holder lives but does not hold it is carried to it again, and goes back if it is not the holder's), and
    /// delivers what that asks for. Then no pool may hold an identifier for a holder that does not hold it: nothing
    /// leaks.
    fn catch_up(&mut self) -> Result<(), String> {
        let calm = Between { offers: 0, crashes: 0 };
        self.step += 1;
        // The sweeper's clock is sane: no earlier than any partition's time.
        let latest = self.drivers.iter().map(|d| d.state().now()).max().unwrap_or(self.clock);
        self.clock = self.clock.max(latest).saturating_add(Millis(1));
        for round in 0..3 {
            let mut delivered = 0;
            while let Some(body) = self.bag.pop_front() {
                delivered += 1;
                if delivered > 4000 {
                    return Err(self.report(14, "the sweeper's messages never run out".into()));
                }
                let envelope = self.envelope(SWEEPERS[0], 0, body);
                self.submit(envelope, &calm)?;
            }
            let mut messages: Vec<Command> = Vec::new();
            for state in self.drivers.iter().map(Driver::state) {
                for pool in state.pools() {
                    for (holder, holding) in &pool.holders {
                        let home = self.drivers[self.partition_of(&Key::Agent(holder.agent.clone()))].state();
                        let resource = home.resource(holder.resource).filter(|r| r.agent == holder.agent);
                        let live = resource.filter(|r| !r.state.is_terminal());
                        // A free comes from the holder's partition.
                        let holder_p = partition_of_key(&Key::Agent(holder.agent.clone()), self.partitions);
                        let source = Source { partition: holder_p, position: home.last_position() };
                        match holding {
                            Holding::Granted { value, token, source: wanted, .. } => {
                                let holds = live.is_some_and(|r| {
                                    matches!(r.claims.get(&pool.name), Some(ClaimSlot::Bound { token: t, .. }) if t == token)
                                });
                                if holds {
                                    continue;
                                }
                                let free = Free {
                                    pool: pool.name.clone(),
                                    holder: holder.clone(),
                                    token: Some(*token),
                                    source,
                                    cause: leasehold_schemas::outcome::FreeCause::Released {},
                                };
                                // Given back already (its own claim of a terminal resource, or a grant sent back): the
                                // free was lost, send it. Anything else goes to the holder's partition again, which
                                // binds it or sends it back (and remembers that): a pool never frees a grant on its own
                                // view that the holder does not exist, which may be a holder not allocated yet.
                                let given_back = resource.is_some_and(|r| {
                                    matches!(r.claims.get(&pool.name), Some(ClaimSlot::Returned { token: Some(t), .. }) if t == token)
                                });
                                if given_back || home.grant_returned(holder, &pool.name, *token) {
                                    messages.push(free.into());
                                } else {
                                    let source = Source { partition: state.partition(), position: *token };
                                    let bind = BindClaim {
                                        holder: holder.clone(),
                                        pool: pool.name.clone(),
                                        value: *value,
                                        token: *token,
                                        source,
                                        wanted: *wanted,
                                        definition: matches!(pool.kind, PoolKind::Ipv4 { .. })
                                            .then(|| pool.kind.clone()),
                                        orphans: pool.orphans,
                                    };
                                    messages.push(bind.into());
                                }
                            }
                            Holding::Waiting { .. } if live.is_none() => {
                                messages.push(
                                    Free {
                                        pool: pool.name.clone(),
                                        holder: holder.clone(),
                                        token: None,
                                        source,
                                        cause: leasehold_schemas::outcome::FreeCause::Released {},
                                    }
                                    .into(),
                                );
                            }
                            Holding::Waiting { .. } => {}
                        }
                    }
                }
            }
            // A child whose parent has left is told so (DESIGN 5: a parent that leaves for good releases its children).
            for state in self.drivers.iter().map(Driver::state) {
                for child in state.resources().filter(|r| !r.state.has_left()) {
                    let Some(parent) = child.parent() else { continue };
                    let parent_p = partition_of_key(&Key::Agent(parent.agent.clone()), self.partitions);
                    let home = self.drivers[parent_p as usize].state();
                    if home.resource(parent.resource).is_some_and(|r| r.agent == parent.agent && r.state.has_left()) {
                        let source = Source { partition: parent_p, position: home.last_position() };
                        let left = ParentState::Left;
                        let cascade = Cascade {
                            child: child.reference(),
                            parent: parent.clone(),
                            parent_state: left,
                            source,
                            answers: None,
                        };
                        messages.push(cascade.into());
                    }
                }
            }
            if messages.is_empty() && round > 0 {
                break;
            }
            self.bag.extend(messages);
        }
        for state in self.drivers.iter().map(Driver::state) {
            for child in state.resources().filter(|r| !r.state.has_left()) {
                let Some(parent) = child.parent() else { continue };
                let home = self.drivers[self.partition_of(&Key::Agent(parent.agent.clone()))].state();
                if let Some(gone) =
                    home.resource(parent.resource).filter(|r| r.agent == parent.agent && r.state.has_left())
                {
                    let message = format!(
                        "after the sweeper caught up, {} is {} while its parent {parent} is {}",
                        child.reference(),
                        child.state.name(),
                        gone.state.name()
                    );
                    return Err(self.report(14, message));
                }
            }
        }
        for state in self.drivers.iter().map(Driver::state) {
            for pool in state.pools() {
                for (holder, holding) in &pool.holders {
                    let Holding::Granted { value, token, .. } = holding else { continue };
                    let home = self.drivers[self.partition_of(&Key::Agent(holder.agent.clone()))].state();
                    let slot = home
                        .resource(holder.resource)
                        .filter(|r| r.agent == holder.agent)
                        .map(|r| (r.state.name(), r.claims.get(&pool.name)));
                    let holds = matches!(slot, Some((name, Some(ClaimSlot::Bound { token: t, .. }))) if t == token && !matches!(name, "destroyed" | "lost" | "orphaned" | "failed"));
                    if !holds {
                        let message = format!(
                            "after the sweeper caught up, pool {} still holds {value} (token {token}) for {holder}, which has {slot:?}",
                            pool.name
                        );
                        return Err(self.report(14, message));
                    }
                }
            }
        }
        Ok(())
    }

    fn state(&self, p: usize) -> &PartitionState {
        self.drivers[p].state()
    }

    fn partition_of(&self, key: &Key) -> usize {
        partition_of_key(key, self.partitions) as usize
    }

    /// The entropy of the next id made from the counter, tagged with what it is for.
    fn counted_entropy(&mut self, tag: u8) -> [u8; 10] {
        self.n_ids += 1;
        let mut entropy = [0u8; 10];
        entropy[0] = tag;
        entropy[2..].copy_from_slice(&self.n_ids.to_be_bytes());
        entropy
    }

    fn new_command_id(&mut self) -> CommandId {
        let entropy = self.counted_entropy(0xc0);
        CommandId::from_parts(self.clock.0, entropy)
    }

    fn envelope(&mut self, issuer: &str, skew_s: i32, body: Command) -> Envelope {
        let id = self.new_command_id();
        let skew = u64::from(skew_s.unsigned_abs()) * 1000;
        let at = if skew_s < 0 { self.clock.0.saturating_sub(skew) } else { self.clock.0 + skew };
        Envelope::new(id, Issuer::new(issuer).expect("valid issuer"), Timestamp(at), body)
    }

    /// Decides an envelope on its partition and its twin, plays the writer through every part, and checks every
    /// property.
    fn submit(&mut self, envelope: Envelope, between: &Between) -> Result<(), String> {
        let bytes = match codec::encode_command(&envelope) {
            Ok(bytes) => bytes.len(),
            Err(e) => return Err(self.report(12, format!("the runner made a command the codec refuses: {e}"))),
        };
        if bytes > MAX_COMMAND_BYTES {
            return Err(self.report(12, format!("a command of {bytes} bytes")));
        }
        self.stats.largest_command_bytes = self.stats.largest_command_bytes.max(bytes);
        self.stats.commands += 1;
        if Self::crosses(&envelope.body, self.partitions) {
            self.stats.cross_partition_commands += 1;
        }
        let p = self.partition_of(&envelope.body.key());
        for driver in self.drivers.iter_mut().chain(self.twins.iter_mut()) {
            driver.set_clock(self.clock);
        }
        let pre = self.state(p).clone();
        let n_before = self.drivers[p].outcomes().len();
        let first = self.drivers[p].try_submit_envelope(&envelope);
        let twin = self.twins[p].try_submit_envelope(&envelope);
        let (first, twin) = match (first, twin) {
            (Ok(first), Ok(twin)) => (first, twin),
            (first, twin) => {
                return Err(self.report(13, format!("refused with nothing pending: {first:?} / {twin:?}")));
            }
        };
        let answer = self.drivers[p].last_answer();
        self.record(p, &envelope, &first, answer);
        self.sent.push(envelope.clone());
        if answer != self.twins[p].last_answer() || first != twin {
            return Err(self.report(6, format!("the twin decided {twin:?}\nthe first decided {first:?}")));
        }
        // 11: decided once.
        let earlier = self.memory[p].seq.get(&envelope.command_id).map(|seq| (p, *seq));
        if let Some((at, seq)) = earlier.or_else(|| self.forgotten_ids.get(&envelope.command_id).copied())
            && at == p
        {
            let stale = first.rejection().is_some_and(|r| r.kind == RejectionKind::StaleCommand);
            match answer {
                Answer::AlreadyDecided { cmd_seq } if cmd_seq == seq => {}
                Answer::Appended { .. } if stale => {}
                other => {
                    return Err(self.report(
                        11,
                        format!(
                            "command {} was decided at {seq}; deciding it again answered {other:?}",
                            envelope.command_id
                        ),
                    ));
                }
            }
        }
        if !matches!(answer, Answer::Appended { .. }) {
            if matches!(answer, Answer::AlreadyDecided { .. }) {
                self.stats.already_decided += 1;
            }
            if *self.state(p) != pre || self.drivers[p].outcomes().len() != n_before {
                return Err(self.report(5, format!("{answer:?} changed state or appended an outcome")));
            }
            return self.check_states();
        }
        if first.command.type_name == "op.renew" && first.rejection().is_none() {
            self.forgotten_ids.insert(envelope.command_id, (p, first.cmd_seq));
        }
        if remembered(&first) {
            let id_time = envelope.command_id.time();
            let since = first.decided_at.max(envelope.issued_at).max(id_time);
            self.memory[p].by_since.insert((since, envelope.command_id));
            self.memory[p].seq.insert(envelope.command_id, first.cmd_seq);
        }
        self.checker.begin(&envelope, &first).map_err(|(n, m)| self.report(n, m))?;
        self.check_part(p, &pre, &envelope, &first)?;
        let mut k: u32 = 0;
        while let Some(pending) = self.state(p).pending().cloned() {
            if (pending.cmd_seq, pending.next_part()) != (first.cmd_seq, k + 1) {
                return Err(self.report(13, format!("pending {pending:?} after part {k} of command {}", first.cmd_seq)));
            }
            for i in 0..between.offers {
                let offer = self.offer(i);
                let seq = self.drivers[p].next_seq();
                let before = self.state(p).clone();
                let got = self.drivers[p].try_submit_envelope(&offer);
                let expected = WriterError::PartsPending { cmd_seq: first.cmd_seq, next_part: k + 1 };
                if got.as_ref().err() != Some(&expected)
                    || self.drivers[p].next_seq() != seq
                    || *self.state(p) != before
                {
                    return Err(self.report(13, format!("{} offered between parts: {got:?}", offer.type_name())));
                }
                self.stats.refused_between_parts += 1;
            }
            if k < 8 && between.crashes & (1 << k) != 0 {
                let before = self.state(p).clone();
                self.drivers[p].reload();
                if *self.state(p) != before {
                    return Err(self.report(5, format!("a writer reloaded after part {k} has another state")));
                }
                self.stats.crashes_between_parts += 1;
            }
            let pre = self.state(p).clone();
            let part = self.drivers[p].continue_pending();
            let twin = self.twins[p].continue_pending();
            let (part, twin) = match (part, twin) {
                (Ok(part), Ok(twin)) => (part, twin),
                (part, twin) => return Err(self.report(13, format!("the next part failed: {part:?} / {twin:?}"))),
            };
            k += 1;
            self.record_part(&part);
            if part != twin {
                return Err(self.report(6, format!("the twin made part {k} {twin:?}\nthe first made {part:?}")));
            }
            if (part.cmd_seq, part.part, &part.command) != (first.cmd_seq, k, &first.command) {
                return Err(self.report(13, format!("part {k} is not the next part of command {}", first.cmd_seq)));
            }
            self.check_part(p, &pre, &envelope, &part)?;
        }
        // 13: the decision's parts are contiguous and nothing else was appended.
        let appended = &self.drivers[p].outcomes()[n_before..];
        if appended.len() != k as usize + 1
            || appended.iter().enumerate().any(|(i, o)| (o.cmd_seq, o.part) != (first.cmd_seq, i as u32))
        {
            return Err(self.report(13, "the log between the parts holds something else".to_owned()));
        }
        if k > 0 {
            self.stats.multi_part_decisions += 1;
            self.stats.most_parts = self.stats.most_parts.max(u64::from(k) + 1);
        }
        self.checker.end().map_err(|(n, m)| self.report(n, m))
    }

    /// A command offered to a writer in the middle of a decision: the one just decided, an earlier one, or a fresh
    /// heartbeat.
    fn offer(&mut self, i: u8) -> Envelope {
        match (i as usize + self.sent.len()) % 3 {
            0 => self.sent[self.sent.len() - 1].clone(),
            1 => self.sent[(self.step * 7 + i as usize) % self.sent.len()].clone(),
            _ => {
                let agent = self.agents[0].clone();
                let epoch = self.epoch(&agent);
                let body = Heartbeat { agent: agent.clone(), epoch };
                self.envelope(agent.as_str(), 0, body.into())
            }
        }
    }

    /// True for a command between partitions: its source (or parent, or holder) lives in another partition.
    fn crosses(body: &Command, partitions: u32) -> bool {
        let home = partition_of_key(&body.key(), partitions);
        let agent_p = |r: &ResourceRef| partition_of_key(&Key::Agent(r.agent.clone()), partitions);
        match body {
            Command::Claim(c) => c.source.partition != home,
            Command::BindClaim(c) => c.source.partition != home,
            Command::Free(c) => agent_p(&c.holder) != home,
            Command::Cascade(c) => agent_p(&c.parent) != home,
            Command::Adopt(c) => agent_p(&c.child) != home,
            _ => false,
        }
    }

    fn check_part(&mut self, p: usize, pre: &PartitionState, envelope: &Envelope, o: &Outcome) -> Result<(), String> {
        self.stats.outcome_parts += 1;
        let bytes = match codec::encode_outcome(o) {
            Ok(bytes) => bytes.len(),
            Err(e) => return Err(self.report(12, format!("part {} does not encode: {e}", o.part))),
        };
        if bytes > MAX_OUTCOME_BYTES {
            return Err(self.report(12, format!("part {} is {bytes} bytes", o.part)));
        }
        self.stats.largest_outcome_bytes = self.stats.largest_outcome_bytes.max(bytes);
        // An internal error is a decider that panicked, or a part `encode_part` found over the cap: a correct decider
        // makes neither.
        if let Some(r) = o.rejection()
            && r.kind == RejectionKind::InternalError
        {
            return Err(self.report(12, format!("part {} is an internal error: {}", o.part, r.message)));
        }
        for effect in o.effects() {
            match effect {
                Effect::ChildAdopted { .. } => self.stats.adoptions += 1,
                Effect::GrantReturned { .. } => self.stats.grants_returned += 1,
                Effect::ResourceLost { .. } => self.stats.losses += 1,
                Effect::AgentSuspect { .. } => self.stats.breaker_trips += 1,
                _ => {}
            }
        }
        self.checker.part(p as u32, pre, envelope, o).map_err(|(n, m)| self.report(n, m))?;
        let forgetting = self.checker.forgetting(p as u32, self.drivers[p].state());
        forgetting.map_err(|(n, m)| self.report(n, m))?;
        self.remembered_ids(p)?;
        self.learn(p, o);
        self.parts_since_rebuild += 1;
        // The heavy run's states and logs are large: it checks them every so often, and after every part of a
        // decision in several parts.
        let (check_every, fold_every) = if self.heavy { (16, 1000) } else { (1, 1) };
        let in_parts = o.part > 0 || o.continues();
        if in_parts || self.parts_since_rebuild.is_multiple_of(check_every) {
            self.check_states()?;
        }
        if in_parts || self.parts_since_rebuild >= fold_every {
            self.parts_since_rebuild = 0;
            if self.drivers[p].rebuild() != *self.state(p) {
                return Err(self.report(5, "folding every outcome from scratch gives another state".into()));
            }
        }
        Ok(())
    }

    /// Property 11: a decided command id is remembered until a horizon after its time (the latest of its decision,
    /// its issuer time and its id's time), and not longer: the partition remembers exactly what the model does.
    fn remembered_ids(&mut self, p: usize) -> Result<(), String> {
        let state = self.drivers[p].state();
        let (horizon, now) = (state.settings().outcome_horizon, state.now());
        let memory = &mut self.memory[p];
        while let Some((since, id)) = memory.by_since.first().copied() {
            if since.saturating_add(horizon) >= now {
                break;
            }
            memory.by_since.pop_first();
            let seq = memory.seq.remove(&id).expect("indexed both ways");
            self.forgotten_ids.insert(id, (p, seq));
        }
        let (kept, expected) = (state.n_recent_commands(), memory.seq.len());
        if kept != expected {
            let message = format!("partition {p} remembers {kept} command ids at {now}; the model {expected}");
            return Err(self.report(11, message));
        }
        Ok(())
    }

    fn check_states(&mut self) -> Result<(), String> {
        let states: Vec<&PartitionState> = self.drivers.iter().map(Driver::state).collect();
        let result = self.checker.states(&states);
        result.map_err(|(n, m)| self.report(n, m))
    }

    /// The sweeper's view: the messages effects ask for; and the agents' epochs and observation numbers.
    fn learn(&mut self, p: usize, o: &Outcome) {
        let source = |position| Source { partition: p as u32, position };
        for (position, effect) in o.positioned_effects() {
            let agent = match &o.command.key {
                Key::Agent(a) => Some(a.clone()),
                Key::Pool(_) | Key::Placement(_) => None,
            };
            match (effect, &o.command.key) {
                (Effect::AgentRegistered { .. }, Key::Agent(a)) => {
                    self.obs.insert(a.clone(), 0);
                    self.epochs.entry(a.clone()).or_default().push(position);
                }
                (Effect::ResourceAllocated { resource, parent: Some(parent), .. }, Key::Agent(a))
                    if self.partition_of(&Key::Agent(parent.agent.clone())) != p =>
                {
                    let child = ResourceRef::new(a.clone(), *resource);
                    self.bag.push_back(Adopt { parent: parent.clone(), child, source: source(position) }.into());
                }
                (Effect::HealthCheckRequested { resource }, Key::Agent(a)) => {
                    self.checks_asked.insert(ResourceRef::new(a.clone(), *resource), position);
                }
                (Effect::ClaimWanted { resource, pool }, Key::Agent(a)) => self.bag.push_back(
                    Claim {
                        pool: pool.clone(),
                        holder: ResourceRef::new(a.clone(), *resource),
                        source: source(position),
                    }
                    .into(),
                ),
                (Effect::ClaimGranted { holder, value, source: wanted }, Key::Pool(pool)) => {
                    let bind = BindClaim {
                        holder: holder.clone(),
                        pool: pool.clone(),
                        value: *value,
                        token: position,
                        source: source(position),
                        wanted: *wanted,
                        definition: None,
                        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                    };
                    self.grants.push(bind.clone());
                    self.bag.push_back(bind.into());
                }
                (Effect::ClaimReleasable { resource, pool, token, .. }, Key::Agent(a)) => self.bag.push_back(
                    Free {
                        pool: pool.clone(),
                        holder: ResourceRef::new(a.clone(), *resource),
                        token: *token,
                        source: source(position),
                        cause: leasehold_schemas::outcome::FreeCause::Released {},
                    }
                    .into(),
                ),
                (Effect::GrantReturned { resource, pool, token, .. }, Key::Agent(a)) => self.bag.push_back(
                    Free {
                        pool: pool.clone(),
                        holder: ResourceRef::new(a.clone(), *resource),
                        token: Some(*token),
                        source: source(position),
                        cause: leasehold_schemas::outcome::FreeCause::Released {},
                    }
                    .into(),
                ),
                (Effect::ChildAdopted { parent, child, child_source, parent_state }, Key::Agent(a)) => {
                    self.bag.push_back(
                        Cascade {
                            child: child.clone(),
                            parent: ResourceRef::new(a.clone(), *parent),
                            parent_state: *parent_state,
                            source: source(position),
                            answers: Some(*child_source),
                        }
                        .into(),
                    )
                }
                _ => {}
            }
            let parent_state = match effect {
                Effect::ResourceReleasing { resource, .. } => Some((*resource, ParentState::Left)),
                Effect::ResourceSuspect { resource, .. } => Some((*resource, ParentState::Suspect)),
                Effect::ResourceHealthy { resource } => Some((*resource, ParentState::Healthy)),
                other => terminal_of(other).map(|r| (r, ParentState::Left)),
            };
            if let (Some((resource, parent_state)), Some(agent)) = (parent_state, agent) {
                let parent = ResourceRef::new(agent, resource);
                let children: Vec<ResourceRef> = self
                    .drivers
                    .iter()
                    .flat_map(|d| d.state().resources())
                    .filter(|r| r.parent() == Some(&parent))
                    .map(|r| r.reference())
                    .collect();
                for child in children {
                    let cascade = Cascade {
                        child,
                        parent: parent.clone(),
                        parent_state,
                        source: source(position),
                        answers: None,
                    };
                    self.bag.push_back(cascade.into());
                }
            }
        }
        while self.bag.len() > BAG {
            self.bag.pop_front();
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

    fn all_resources(&self) -> impl Iterator<Item = &leasehold_domain::state::Resource> {
        self.drivers.iter().flat_map(|d| d.state().resources())
    }

    /// This generation's ids and every resource in state, in id order.
    fn resource_universe(&mut self) -> Vec<ResourceId> {
        let generation = generation_of(self.clock);
        let mut ids: BTreeSet<ResourceId> = (0..N_RESOURCE_IDS).map(|i| self.resource_id(generation, i)).collect();
        ids.extend(self.all_resources().map(|r| r.id));
        ids.into_iter().collect()
    }

    fn agent(&self, sel: u8) -> AgentName {
        self.agents[sel as usize % self.agents.len()].clone()
    }

    /// A resource and the agent it is on (or some agent, for an id not in state). Mostly a live resource, sometimes
    /// any one in state, sometimes any id of the universe.
    fn pick_resource(&mut self, sel: u8) -> (AgentName, ResourceId) {
        let universe = self.resource_universe();
        let any: Vec<ResourceRef> = self.all_resources().map(|r| r.reference()).collect();
        let live: Vec<ResourceRef> =
            self.all_resources().filter(|r| !r.state.is_terminal()).map(|r| r.reference()).collect();
        let from = match sel % 4 {
            1 if !any.is_empty() => &any,
            2 | 3 if !live.is_empty() => &live,
            1..=3 if !any.is_empty() => &any,
            _ => {
                let id = universe[(sel / 4) as usize % universe.len()];
                let owner = self.all_resources().find(|r| r.id == id).map(|r| r.agent.clone());
                return (owner.unwrap_or_else(|| self.agent(sel / 7)), id);
            }
        };
        let chosen = from[(sel / 4) as usize % from.len()].clone();
        (chosen.agent, chosen.resource)
    }

    /// A lease and its agent: mostly a live one, sometimes any in state, sometimes any id of the universe.
    fn pick_lease(&mut self, sel: u8) -> (AgentName, LeaseId) {
        let generation = generation_of(self.clock);
        let universe: Vec<LeaseId> = (0..N_LEASE_IDS).map(|i| self.lease_id(generation, i)).collect();
        let leases = || self.drivers.iter().flat_map(|d| d.state().leases());
        let any: Vec<(AgentName, LeaseId)> = leases().map(|l| (l.agent.clone(), l.id)).collect();
        let live: Vec<(AgentName, LeaseId)> =
            leases().filter(|l| l.state.is_live()).map(|l| (l.agent.clone(), l.id)).collect();
        let from = match sel % 4 {
            1 if !any.is_empty() => &any,
            2 | 3 if !live.is_empty() => &live,
            1..=3 if !any.is_empty() => &any,
            _ => return (self.agent(sel / 7), universe[(sel / 4) as usize % universe.len()]),
        };
        from[(sel / 4) as usize % from.len()].clone()
    }

    fn lease_state(&self, agent: &AgentName, lease: LeaseId) -> Option<&LeaseState> {
        let p = self.partition_of(&Key::Agent(agent.clone()));
        self.state(p).lease(lease).filter(|l| l.agent == *agent).map(|l| &l.state)
    }

    fn epoch(&self, agent: &AgentName) -> Position {
        let p = self.partition_of(&Key::Agent(agent.clone()));
        self.state(p).agent(agent).map(|a| a.epoch).unwrap_or(Position(1))
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

    fn watermark(&self, agent: &AgentName, pick: Wm) -> Position {
        let last = self.state(self.partition_of(&Key::Agent(agent.clone()))).last_position();
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
        let state = self.state(self.partition_of(&Key::Agent(agent.clone())));
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

    fn interpret(&mut self, step: &Step) -> Vec<Envelope> {
        let op = OPS[step.who as usize % OPS.len()];
        let sys = SWEEPERS[step.who as usize % SWEEPERS.len()];
        let one = |sim: &mut Sim, issuer: &str, body: Command| vec![sim.envelope(issuer, step.skew_s, body)];
        match &step.act {
            Act::Register { agent, wiped, settings } => {
                let agent = self.agent(*agent);
                self.n_incarnations += 1;
                let body = Register {
                    wiped: *wiped,
                    settings: agent_settings(*settings),
                    ..Register::new(agent.clone(), Uuid::from_u128(self.n_incarnations))
                };
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, body.into())
            }
            Act::Heartbeat { agent, stale } => {
                let agent = self.agent(*agent);
                let epoch = if *stale {
                    self.epochs.get(&agent).and_then(|e| e.iter().rev().nth(1).copied()).unwrap_or(Position(0))
                } else {
                    self.epoch(&agent)
                };
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, Heartbeat { agent, epoch }.into())
            }
            Act::Allocate { agent, res, pools, parent, capacity, ahead_min } => {
                let agent = self.agent(*agent);
                let generation = generation_of(self.clock);
                let resource = match ahead_min {
                    None => self.resource_id(generation, res % N_RESOURCE_IDS),
                    Some(minutes) => {
                        let at = self.clock.0 + u64::from(*minutes) * 60_000;
                        ResourceId::from_parts(at, entropy(0x46, generation, *res))
                    }
                };
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
                    wait: None,
                };
                one(self, op, body.into())
            }
            Act::Acquire { res, lease, agent, ttl_s, wait_s } => {
                let (owner, resource) = self.pick_resource(*res);
                let generation = generation_of(self.clock);
                let lease = self.lease_id(generation, lease % N_LEASE_IDS);
                let agent = agent.map(|a| self.agent(a)).unwrap_or(owner);
                let body = Acquire {
                    agent,
                    resource,
                    lease,
                    holder: format!("job-{}", step.who % 4),
                    ttl: ttl_s.map(|s| secs(u64::from(s))),
                    wait_timeout: wait_s.map(|s| secs(u64::from(s))),
                    priority: 0,
                };
                one(self, op, body.into())
            }
            Act::Renew { lease, tok, ttl_s } => {
                let (agent, lease) = self.pick_lease(*lease);
                let token = match (tok, self.lease_state(&agent, lease)) {
                    (Tok::Right, Some(LeaseState::Active { token, .. })) => *token,
                    _ => Position(999_999),
                };
                let body = Renew { agent, lease, token, ttl: ttl_s.map(|s| secs(u64::from(s))) };
                one(self, op, body.into())
            }
            Act::ReleaseLease { lease, tok } => {
                let (agent, lease) = self.pick_lease(*lease);
                let token = match (tok, self.lease_state(&agent, lease)) {
                    (Tok::Right, Some(LeaseState::Active { token, .. })) => Some(*token),
                    (Tok::Right, _) | (Tok::Nothing, _) => None,
                    (Tok::Wrong, _) => Some(Position(999_999)),
                };
                one(self, op, ReleaseLease { agent, lease, token }.into())
            }
            Act::Release { res } => {
                let (agent, resource) = self.pick_resource(*res);
                one(self, op, Release { agent, resource, reason: Some("done".into()) }.into())
            }
            Act::Pause { res, until_s } => {
                let (agent, resource) = self.pick_resource(*res);
                let until = until_s.map(|s| self.clock.saturating_add(secs(u64::from(s))));
                one(self, op, Pause { agent, resource, reason: Some("maintenance".into()), until }.into())
            }
            Act::Unpause { res } => {
                let (agent, resource) = self.pick_resource(*res);
                one(self, op, Unpause { agent, resource }.into())
            }
            Act::Update { res, capacity, set } => {
                let (agent, resource) = self.pick_resource(*res);
                let (set, remove) = if *set {
                    ([("tier".to_owned(), "gold".to_owned())].into_iter().collect(), vec![])
                } else {
                    (BTreeMap::new(), vec!["tier".to_owned()])
                };
                let body = Update { agent, resource, set, remove, capacity: capacity.map(u32::from), max_lease: None };
                one(self, op, body.into())
            }
            Act::OpFailure { res } => {
                let (agent, resource) = self.pick_resource(*res);
                one(self, op, ReportFailureByOperator { agent, resource, detail: "flaky".into() }.into())
            }
            Act::Retire { agent } => {
                let agent = self.agent(*agent);
                let only_if_unleased = self.clock.0.is_multiple_of(2);
                one(self, op, RetireAgent { agent, only_if_unleased }.into())
            }
            Act::Drain { agent, deadline_s, grace_s } => {
                let agent = self.agent(*agent);
                let (deadline, grace) = (deadline_s.map(|s| secs(u64::from(s))), grace_s.map(|s| secs(u64::from(s))));
                one(self, op, DrainAgent { agent, deadline, grace, reason: Some("upgrade".into()) }.into())
            }
            Act::Uncordon { agent } => {
                let agent = self.agent(*agent);
                one(self, op, UncordonAgent { agent }.into())
            }
            Act::ConfirmLoss { agent } => {
                let agent = self.agent(*agent);
                one(self, op, ConfirmLoss { agent }.into())
            }
            Act::DefinePool { which } => {
                let first = self.pools[0].clone();
                let home = self.state(self.partition_of(&Key::Pool(first.clone())));
                let body = match which {
                    0 => {
                        let Some(existing) = home.pool(&first) else { return vec![] };
                        DefinePool {
                            pool: first,
                            kind: existing.kind.clone(),
                            cooldown: Some(existing.cooldown),
                            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                        }
                    }
                    1 => DefinePool {
                        pool: first,
                        kind: PoolKind::Slots { count: 7 },
                        cooldown: None,
                        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                    },
                    _ => DefinePool {
                        pool: pool_name(GHOST_POOL),
                        kind: PoolKind::Slots { count: 2 },
                        cooldown: Some(secs(10)),
                        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                    },
                };
                one(self, op, body.into())
            }
            Act::Horizon { partition, which } => {
                let p = u32::from(*partition) % self.partitions;
                let outcome_horizon = HORIZONS[*which as usize % HORIZONS.len()];
                let body = SetPartitionSettings {
                    key: self.keys[p as usize].clone(),
                    partition: p,
                    outcome_horizon: Some(outcome_horizon),
                    policy: None,
                    if_no_policy: false,
                    gc: None,
                    max_priority: None,
                };
                one(self, op, body.into())
            }
            Act::ReportCreated { res, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let native_id = Some(format!("native-{}", step.who));
                let body = ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id };
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, body.into())
            }
            Act::Sync { agent, marks, wm, honest, obs } => {
                let agent = self.agent(*agent);
                let (own, universe) = self.report_candidates(&agent);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let watermark = self.watermark(&agent, *wm);
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
                self.honest(&mut report, *honest);
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, report.into())
            }
            Act::SyncAll { agent, what, obs } => {
                let agent = self.agent(*agent);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let watermark = self.watermark(&agent, Wm::Last);
                let state = self.state(self.partition_of(&Key::Agent(agent.clone())));
                let Some(a) = state.agent(&agent) else { return vec![] };
                let pick = |f: &dyn Fn(&ResourceState) -> bool| -> Vec<ResourceId> {
                    state.resources_of(a).filter(|r| f(&r.state)).map(|r| r.id).take(MAX_REPORT_HANDLES).collect()
                };
                let mut report = SyncReport::new(agent.clone(), epoch, obs, watermark);
                match what {
                    0 => report.created = pick(&|s| *s == ResourceState::Pending),
                    1 => report.missing = pick(&|s| s.is_held()),
                    _ => report.destroyed = pick(&|s| matches!(s, ResourceState::Releasing { .. })),
                }
                self.honest(&mut report, true);
                let issuer = agent.as_str().to_owned();
                one(self, &issuer, report.into())
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
                let watermark = self.watermark(&agent, *wm);
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
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, chunk.into())
            }
            Act::AgentFailure { res, create_failed, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                let failure = if *create_failed { FailureKind::CreateFailed } else { FailureKind::Unhealthy };
                let body = ReportFailure { agent: agent.clone(), epoch, obs, resource, failure, detail: "boom".into() };
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, body.into())
            }
            Act::Health { res, healthy, obs } => {
                let (agent, resource) = self.pick_resource(*res);
                let (epoch, obs) = self.stamp(&agent, *obs);
                // Mostly the check the sweeper asked for last; sometimes one asked for long ago, or none at all.
                let latest = self.state(self.partition_of(&Key::Agent(agent.clone()))).last_position();
                let asked = self.checks_asked.get(&ResourceRef::new(agent.clone(), resource)).copied();
                let request = match step.who % 5 {
                    0 => Position(1),
                    1 => latest,
                    _ => asked.unwrap_or(latest),
                };
                let body = HealthResult {
                    agent: agent.clone(),
                    epoch,
                    obs,
                    resource,
                    request,
                    healthy: *healthy,
                    detail: "check".into(),
                };
                let issuer = self.agent_issuer(&agent, step.who);
                one(self, &issuer, body.into())
            }
            Act::Mass { agent, n, capacity } => {
                let agent = self.agent(*agent);
                (0..*n)
                    .map(|i| {
                        let resource = ResourceId::from_parts(self.clock.0 - 1, self.counted_entropy(0x4d));
                        let body = Allocate {
                            agent: agent.clone(),
                            resource,
                            kind: "volume".into(),
                            capacity: u32::from(*capacity),
                            attributes: Default::default(),
                            parent: None,
                            pools: if i % 16 == 0 { vec![self.pools[0].clone()] } else { vec![] },
                            wait: None,
                        };
                        self.envelope(op, 0, body.into())
                    })
                    .collect()
            }
            Act::Flood { res, n } => {
                // Mostly a pending resource with room: its waiting leases are granted together when it turns active.
                let roomy: Vec<ResourceRef> = self
                    .all_resources()
                    .filter(|r| r.state == ResourceState::Pending && (r.live_leases.len() as u32) < r.capacity)
                    .map(|r| r.reference())
                    .collect();
                let (agent, resource) = match roomy.get(*res as usize % roomy.len().max(1)) {
                    Some(r) if res % 4 != 0 => (r.agent.clone(), r.resource),
                    _ => self.pick_resource(*res),
                };
                (0..*n)
                    .map(|i| {
                        let lease = LeaseId::from_parts(self.clock.0 - 1, self.counted_entropy(0x46));
                        let body = Acquire {
                            agent: agent.clone(),
                            resource,
                            lease,
                            holder: format!("{}-{i}", "h".repeat(100)),
                            ttl: (i % 3 == 0).then_some(secs(600)),
                            wait_timeout: (i % 5 == 0).then_some(secs(300)),
                            priority: 0,
                        };
                        self.envelope(op, 0, body.into())
                    })
                    .collect()
            }
            Act::Big { what, size, multibyte, res } => {
                self.stats.big_commands += 1;
                let body = self.big(*what, *size, *multibyte, *res);
                let issuer = match &body.key() {
                    Key::Agent(a) if body.class() == leasehold_schemas::CommandClass::Agent => a.as_str().to_owned(),
                    _ => op.to_owned(),
                };
                one(self, &issuer, body)
            }
            Act::FollowUp { pick, keep } => {
                let len = self.bag.len();
                if len == 0 {
                    return vec![];
                }
                let k = (*pick >> 1) as usize % len;
                let idx = if pick & 1 == 1 { len - 1 - k } else { k };
                let body =
                    if *keep { self.bag[idx].clone() } else { self.bag.remove(idx).expect("index within the bag") };
                one(self, sys, body)
            }
            Act::Timer { kind, pick } => match self.timer(*kind, *pick) {
                Some(body) => one(self, sys, body),
                None => vec![],
            },
            Act::Junk { kind, a, b } => match self.junk(*kind, *a, *b) {
                Some(body) => one(self, sys, body),
                None => vec![],
            },
            Act::Retry { pick } => {
                if self.sent.is_empty() {
                    return vec![];
                }
                vec![self.sent[*pick as usize % self.sent.len()].clone()]
            }
            Act::Replay { pick } => {
                if self.sent.is_empty() {
                    return vec![];
                }
                let mut again = self.sent[*pick as usize % self.sent.len()].clone();
                again.issued_at = self.clock;
                vec![again]
            }
        }
    }

    /// Count and digest as an honest agent reports them (or one off, to ask for a resync).
    fn honest(&self, report: &mut SyncReport, honest: bool) {
        let state = self.state(self.partition_of(&Key::Agent(report.agent.clone())));
        let (count, digest) = honest_listing(state, report);
        report.count = if honest { count } else { count + 1 };
        report.digest = digest;
    }

    /// A command with one field as large (or odd) as the codec lets through: up to about 1 MB of text, long lists.
    fn big(&mut self, what: u8, size: u8, multibyte: bool, res: u8) -> Command {
        const SIZES: [usize; 14] = [0, 1, 63, 64, 65, 128, 129, 1024, 1025, 4096, 65_536, 300_000, 900_000, 1_000_000];
        let bytes = SIZES[size as usize % SIZES.len()];
        let text = if multibyte { "é".repeat(bytes / 2) + &"x".repeat(bytes % 2) } else { "x".repeat(bytes) };
        let (agent, resource) = self.pick_resource(res);
        let new_id = self.resource_id(generation_of(self.clock), res % N_RESOURCE_IDS);
        match what {
            0 => Allocate {
                agent,
                resource: new_id,
                kind: text,
                capacity: 1,
                attributes: Default::default(),
                parent: None,
                pools: vec![],
                wait: None,
            }
            .into(),
            1 => {
                // As many attributes of the largest allowed size as fit (64 of 64 + 1024 bytes is allowed), or a
                // few of the chosen size.
                let n = if bytes <= MAX_ATTRIBUTE_VALUE_BYTES + 1 { 64 + usize::from(size % 2) } else { 3 };
                let value = cut(&text, 300_000).to_owned();
                let attributes = (0..n).map(|i| (format!("{i:0>64}"), value.clone())).collect();
                Allocate {
                    agent,
                    resource: new_id,
                    kind: "vm".into(),
                    capacity: 1,
                    attributes,
                    parent: None,
                    pools: vec![],
                    wait: None,
                }
                .into()
            }
            2 => Update {
                agent,
                resource,
                set: [(text, "v".to_owned())].into(),
                remove: vec![],
                capacity: None,
                max_lease: None,
            }
            .into(),
            3 => Update {
                agent,
                resource,
                set: [("k".to_owned(), text)].into(),
                remove: vec![],
                capacity: None,
                max_lease: None,
            }
            .into(),
            4 => {
                let remove =
                    if bytes > 4096 { vec![text] } else { (0..bytes.max(1)).map(|i| format!("name-{i}")).collect() };
                Update { agent, resource, set: Default::default(), remove, capacity: None, max_lease: None }.into()
            }
            5 => Pause { agent, resource, reason: Some(text), until: None }.into(),
            6 => Release { agent, resource, reason: Some(text) }.into(),
            7 => {
                let lease = self.lease_id(generation_of(self.clock), res % N_LEASE_IDS);
                Acquire { agent, resource, lease, holder: text, ttl: None, wait_timeout: None, priority: 0 }.into()
            }
            8 => {
                let (epoch, obs) = self.stamp(&agent, Obs::Next);
                ReportCreated { agent, epoch, obs, resource, native_id: Some(text) }.into()
            }
            9 => {
                let (epoch, obs) = self.stamp(&agent, Obs::Next);
                ReportFailure { agent, epoch, obs, resource, failure: FailureKind::Unhealthy, detail: text }.into()
            }
            10 => ReportFailureByOperator { agent, resource, detail: text }.into(),
            11 => {
                let n = (bytes / 4).min(240_000);
                let exclude = (0..n as u32).map(|i| Ipv4Addr::from(0x0a00_0001 + i)).collect();
                let kind = PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 8, exclude };
                DefinePool {
                    pool: pool_name("wide"),
                    kind,
                    cooldown: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                }
                .into()
            }
            _ => {
                let n = bytes.min(65_534);
                let exclude = (0..n as u32).map(|i| (i + 1) as u16).collect();
                DefinePool {
                    pool: pool_name("ports"),
                    kind: PoolKind::Ports { first: 1, last: 65535, exclude },
                    cooldown: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                }
                .into()
            }
        }
    }

    /// A time-driven sweeper command read off the states: what is (or may soon be) due.
    fn timer(&mut self, kind: u8, pick: u8) -> Option<Command> {
        let resources: Vec<&leasehold_domain::state::Resource> = self.all_resources().collect();
        let leases: Vec<&leasehold_domain::state::Lease> =
            self.drivers.iter().flat_map(|d| d.state().leases()).collect();
        let agents: Vec<&leasehold_domain::state::Agent> =
            self.drivers.iter().flat_map(|d| d.state().agents()).collect();
        let pools: Vec<&leasehold_domain::state::Pool> = self.drivers.iter().flat_map(|d| d.state().pools()).collect();
        let gone = |agent: &AgentName| agents.iter().any(|a| a.name == *agent && a.liveness == Liveness::Gone);
        let mut candidates: Vec<Command> = match kind {
            0 => leases
                .iter()
                .filter(|l| matches!(l.state, LeaseState::Active { .. }))
                .map(|l| ExpireLease { agent: l.agent.clone(), lease: l.id }.into())
                .collect(),
            1 => leases
                .iter()
                .filter(|l| matches!(l.state, LeaseState::Waiting { .. }))
                .map(|l| WaitTimeout { agent: l.agent.clone(), lease: l.id }.into())
                .collect(),
            2 => resources
                .iter()
                .filter(|r| r.state == ResourceState::Pending)
                .map(|r| CreateTimeout { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            3 => resources
                .iter()
                .filter(|r| matches!(r.state, ResourceState::Paused { .. }))
                .map(|r| ExpirePause { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            4 => agents.iter().map(|a| MarkStalled { agent: a.name.clone() }.into()).collect(),
            5 => agents.iter().map(|a| MarkGone { agent: a.name.clone() }.into()).collect(),
            6 => resources
                .iter()
                .filter(|r| !r.state.is_terminal() && gone(&r.agent))
                .map(|r| Orphan { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            7 => resources
                .iter()
                .filter(|r| matches!(r.state, ResourceState::Suspect { .. }))
                .map(|r| RequestHealthCheck { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
            8 => pools
                .iter()
                .filter(|p| !p.waiters.is_empty())
                .map(|p| TickPool { pool: p.name.clone() }.into())
                .collect(),
            _ => resources
                .iter()
                .filter(|r| !r.state.has_left() && agents.iter().any(|a| a.name == r.agent && a.drain.is_some()))
                .map(|r| DrainRelease { agent: r.agent.clone(), resource: r.id }.into())
                .collect(),
        };
        if candidates.is_empty() {
            // Nothing due of that kind: the sweeper may still be wrong about it (its projection lags).
            candidates = match kind {
                0 | 1 => leases
                    .iter()
                    .map(|l| {
                        if kind == 0 {
                            ExpireLease { agent: l.agent.clone(), lease: l.id }.into()
                        } else {
                            WaitTimeout { agent: l.agent.clone(), lease: l.id }.into()
                        }
                    })
                    .collect(),
                2 | 3 | 6 | 7 | 9 => resources
                    .iter()
                    .map(|r| match kind {
                        2 => CreateTimeout { agent: r.agent.clone(), resource: r.id }.into(),
                        3 => ExpirePause { agent: r.agent.clone(), resource: r.id }.into(),
                        6 => Orphan { agent: r.agent.clone(), resource: r.id }.into(),
                        9 => DrainRelease { agent: r.agent.clone(), resource: r.id }.into(),
                        _ => RequestHealthCheck { agent: r.agent.clone(), resource: r.id }.into(),
                    })
                    .collect(),
                _ => pools.iter().map(|p| TickPool { pool: p.name.clone() }.into()).collect(),
            };
        }
        if candidates.is_empty() {
            return None;
        }
        let idx = pick as usize % candidates.len();
        Some(candidates.swap_remove(idx))
    }

    /// What a confused sweeper sends: claims and adoptions no effect asked for, frees with tokens no grant ever had,
    /// cascades with made-up sources (even made-up adoption answers), and real grants carried again long after,
    /// sometimes naming the wrong claim. It never makes up a grant (a value and token no pool gave that holder): a
    /// resource cannot tell a made-up grant from a real one, so grants come only from pools' outcomes, carried by a
    /// sweeper the log trusts (agents cannot publish `sys` commands, DESIGN 12).
    fn junk(&mut self, kind: u8, a: u8, b: u8) -> Option<Command> {
        let pool = self.pools[b as usize % self.pools.len()].clone();
        let source = Source { partition: u32::from(a) % self.partitions, position: Position(u64::from(b)) };
        match kind {
            0 => {
                let (agent, id) = self.pick_resource(a);
                Some(Claim { pool, holder: ResourceRef::new(agent, id), source }.into())
            }
            1 => {
                let (agent, id) = self.pick_resource(a);
                let token = Some(Position(u64::MAX - u64::from(a)));
                Some(
                    Free {
                        pool,
                        holder: ResourceRef::new(agent, id),
                        token,
                        source,
                        cause: leasehold_schemas::outcome::FreeCause::Released {},
                    }
                    .into(),
                )
            }
            2 => {
                let children: Vec<(ResourceRef, ResourceRef, Position)> = self
                    .all_resources()
                    .filter_map(|r| r.parent().cloned().map(|p| (r.reference(), p, r.allocated_pos)))
                    .collect();
                if children.is_empty() {
                    return None;
                }
                let (child, parent, born) = children[a as usize % children.len()].clone();
                let child_p = self.partition_of(&Key::Agent(child.agent.clone())) as u32;
                let parent_state = [ParentState::Left, ParentState::Suspect, ParentState::Healthy][b as usize % 3];
                // Mostly from the parent's own partition (a position it may never reach), sometimes from anywhere.
                let parent_p = partition_of_key(&Key::Agent(parent.agent.clone()), self.partitions);
                let source = if a.is_multiple_of(3) {
                    source
                } else {
                    Source { partition: parent_p, position: Position(u64::from(a) * 1000) }
                };
                let answers = match b % 4 {
                    0 => Some(Source { partition: child_p, position: born }),
                    1 => Some(source),
                    _ => None,
                };
                Some(Cascade { child, parent, parent_state, source, answers }.into())
            }
            3 => Some(TickPool { pool }.into()),
            4 => {
                if self.grants.is_empty() {
                    return None;
                }
                let mut bind = self.grants[a as usize % self.grants.len()].clone();
                if b.is_multiple_of(3) {
                    bind.wanted = source;
                }
                Some(bind.into())
            }
            _ => {
                let (parent_agent, parent) = self.pick_resource(a);
                let (child_agent, child) = self.pick_resource(b);
                let child = ResourceRef::new(child_agent, child);
                Some(Adopt { parent: ResourceRef::new(parent_agent, parent), child, source }.into())
            }
        }
    }

    // --- reporting --------------------------------------------------------------------------------------------

    fn record(&mut self, p: usize, envelope: &Envelope, outcome: &Outcome, answer: Answer) {
        let result = match (answer, outcome.rejection()) {
            (Answer::AlreadyDecided { cmd_seq }, _) => format!("ALREADY DECIDED at {cmd_seq}"),
            (Answer::Unchanged, _) => "unchanged (no outcome)".to_owned(),
            (_, Some(r)) => format!("REJECTED {r}"),
            (_, None) => format!("{:?}", outcome.effects().iter().map(Effect::name).collect::<Vec<_>>()),
        };
        let mut body = format!("{:?}", envelope.body);
        if body.len() > 600 {
            body = format!("{}... ({} bytes)", cut(&body, 600), body.len());
        }
        let line = format!(
            "step {:>3} p{p} seq {} log t+{:.1}s issuer {} (issued t{:+.1}s) {} {body}\n      -> {result}",
            self.step,
            outcome.cmd_seq,
            self.clock.0.saturating_sub(T0.0) as f64 / 1000.0,
            envelope.issuer,
            (envelope.issued_at.0 as f64 - self.clock.0 as f64) / 1000.0,
            envelope.type_name(),
        );
        self.trace.push(line);
    }

    fn record_part(&mut self, part: &Outcome) {
        let names: Vec<&str> = part.effects().iter().map(Effect::name).collect();
        self.trace.push(format!("      part {} -> {names:?}", part.part));
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
            "\n=== property {} broke at step {} ({} partitions) ===\n{}\n--- commands (oldest first) ---\n",
            PROPERTY_NAMES[property],
            self.step,
            self.partitions,
            shorten(&message)
        );
        for line in &self.trace {
            out.push_str(&shorten(line));
            out.push('\n');
        }
        out
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
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

/// Runs `cases` scenarios (or `$env` of them) and returns what they exercised.
fn run_property(name: &str, heavy: bool, env: &str, default_cases: u32) -> (u32, Stats) {
    let cases = std::env::var(env).ok().and_then(|n| n.parse().ok()).unwrap_or(default_cases);
    let config = Config {
        cases,
        source_file: Some(file!()),
        // A failure prints its minimal scenario and seed; seeds are not kept in the tree (the generator changes).
        failure_persistence: None,
        ..Config::default()
    };
    let totals = Mutex::new(Stats::default());
    let started = std::time::Instant::now();
    let result = TestRunner::new(config).run(&scenario(heavy), |scenario| {
        let mut sim = Sim::new(&scenario, heavy);
        let verdict = sim.run(&scenario);
        if verdict.is_ok() {
            totals.lock().expect("not poisoned").add(&sim.stats);
        }
        verdict.map_err(TestCaseError::fail)
    });
    let stats = totals.into_inner().expect("not poisoned");
    eprintln!("{name}: {cases} cases in {:.1?}: {stats:?}", started.elapsed());
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    (cases, stats)
}

#[test]
fn random_command_sequences_keep_the_promises() {
    let (cases, stats) = run_property("light", false, "LH_PROPERTY_CASES", LIGHT_CASES);
    if cases >= 64 {
        // A run that never exercised what it is about proves nothing.
        let exercised = [
            ("decisions in several parts", stats.multi_part_decisions),
            ("crashes between parts", stats.crashes_between_parts),
            ("commands refused between parts", stats.refused_between_parts),
            ("retries answered as already decided", stats.already_decided),
            ("commands between partitions", stats.cross_partition_commands),
            ("adoptions", stats.adoptions),
            ("grants sent back", stats.grants_returned),
            ("losses", stats.losses),
            ("breaker trips", stats.breaker_trips),
            ("large commands", stats.big_commands),
        ];
        for (what, n) in exercised {
            assert!(n > 0, "{cases} cases exercised no {what}: {stats:?}");
        }
    }
}

#[test]
fn heavy_decisions_keep_the_promises() {
    let (cases, stats) = run_property("heavy", true, "LH_HEAVY_CASES", HEAVY_CASES);
    if cases >= 4 {
        assert!(stats.multi_part_decisions > 0, "{cases} heavy cases split no decision: {stats:?}");
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
        // The lease's holder renews it every step: renews must not pile up in memory either.
        if let Some((agent, lease, token)) = &lease {
            let renew = Renew { agent: agent.clone(), lease: *lease, token: *token, ttl: None };
            accepted(&w.op(renew));
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
                priority: 0,
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
        max_recent = max_recent.max(state.n_recent_commands());
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
    // Remembered command ids: the hourly churn's ~5 op/agent commands over the 24 h horizon, never heartbeats or reports.
    assert!(max_recent <= 200, "{max_recent} command ids remembered at once");
    // Six live resources, plus the terminal ones of the last 24 h (about 28).
    assert!(max_resources <= 45, "{max_resources} resources in state at once");
    assert!(max_leases <= 30, "{max_leases} leases in state at once");
    assert!(max_losses <= 2, "{max_losses} recent losses kept for one agent");
    assert!(state.pending().is_none(), "no work left over");
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
    // Heartbeats that change nothing append nothing: the log holds only the ones that record the agent as seen.
    let n_heartbeats = STEPS * agents.len();
    let n_seen: usize = seen.values().map(Vec::len).sum();
    let logged = w.d.outcomes().iter().filter(|o| o.command.type_name == "agent.heartbeat").count();
    assert!(logged <= n_seen, "{logged} heartbeat outcomes, {n_seen} of them record the agent as seen");
    assert!(n_seen * 3 <= n_heartbeats * 2, "{n_seen} of {n_heartbeats} heartbeats carry agent-seen");
}
