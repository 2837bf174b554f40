//! Quotas across partitions, against the real decider and the real plan, without a log (issue 19, item 2): a quota
//! counts its principals' resources through one counting pool per kind, so however allocations from several
//! partitions race, and whatever a confused sweeper sends (stale views, twice, in any order, replayed), no more
//! resources of its principals are ever past their slot (create ordered, not yet ended) than the quota allows. An
//! allocation without a wait over the quota is released, naming the quota; one with a wait is served in order.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_domain::state::{ClaimSlot, ResourceState};
use leasehold_schemas::command::{Allocate, DefinePool, Release, SetQuota, UpdatePool, quota_pool};
use leasehold_schemas::ids::{Millis, QuotaName};
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::subjects::settings_key;
use leasehold_schemas::{AgentName, Issuer, PoolName, ResourceId};
use proptest::prelude::*;

mod support;

use support::{Confusion, PARTITIONS, World};

const PRINCIPALS: [&str; 2] = ["ci:team-a", "ci:team-a-nightly"];
const OUTSIDER: &str = "ci:team-b";

fn quota() -> QuotaName {
    QuotaName::new("team-a").unwrap()
}

fn slots() -> PoolName {
    quota_pool(&quota(), "container").unwrap()
}

impl World {
    /// The quota's pool holds `max` slots, and every partition records the quota (the order `quota set` keeps).
    fn set_quota(&mut self, max: u32, first: bool) {
        let kind = PoolKind::Slots { count: max };
        let pool = slots();
        if first {
            let body = DefinePool { pool, kind, cooldown: Some(Millis(0)), orphans: OrphanPolicy::Hold };
            self.send("op:alice", body).expect("defined");
        } else {
            self.send("op:alice", UpdatePool { pool, kind, cooldown: None, orphans: None });
        }
        for partition in 0..PARTITIONS {
            let body = SetQuota {
                key: settings_key(partition, PARTITIONS),
                partition,
                quota: quota(),
                max: BTreeMap::from([("container".to_owned(), max)]),
                principals: PRINCIPALS.iter().map(|p| Issuer::new(*p).unwrap()).collect(),
            };
            self.send("op:alice", body);
        }
    }

    fn allocate_as(&mut self, who: &str, agent: &AgentName, kind: &str, wait: bool) -> ResourceId {
        let id = ResourceId::generate();
        let mut body = Allocate::new(agent.clone(), id, kind, 1);
        body.wait = wait.then(|| Millis::from_mins(10));
        self.send(who, body);
        id
    }

    fn heartbeat_of(&mut self, agent: &AgentName) {
        let Some(record) = self.state_of(agent).agent(agent) else { return };
        let epoch = record.epoch;
        self.send(agent.as_str(), leasehold_schemas::command::Heartbeat { agent: agent.clone(), epoch });
    }

    /// Live resources charged to the quota: its slot bound, not ended.
    fn charged(&self) -> Vec<(AgentName, ResourceId)> {
        self.states
            .values()
            .flat_map(|s| s.resources())
            .filter(|r| !r.state.is_terminal())
            .filter(|r| matches!(r.claims.get(&slots()), Some(ClaimSlot::Bound { .. })))
            .map(|r| (r.agent.clone(), r.id))
            .collect()
    }
}

#[derive(Debug, Clone)]
enum Step {
    Allocate {
        agent: usize,
        who: usize,
        volume: bool,
        wait: bool,
    },
    Sweep {
        back: usize,
        order: u64,
        twice: bool,
    },
    Replay {
        pick: u64,
        n: usize,
    },
    /// A resource is released (any of them), and its agent confirms the destroy.
    Release {
        n: usize,
        confirm: bool,
    },
    Time {
        secs: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..3, 0usize..3, proptest::bool::weighted(0.15), any::<bool>())
            .prop_map(|(agent, who, volume, wait)| Step::Allocate { agent, who, volume, wait }),
        5 => (0usize..6, any::<u64>(), any::<bool>()).prop_map(|(back, order, twice)| Step::Sweep { back, order, twice }),
        2 => (any::<u64>(), 1usize..6).prop_map(|(pick, n)| Step::Replay { pick, n }),
        2 => (0usize..12, any::<bool>()).prop_map(|(n, confirm)| Step::Release { n, confirm }),
        1 => (1u64..5).prop_map(|secs| Step::Time { secs }),
    ]
}

/// Walks the outcomes in the order they were decided: a resource of a principal of the quota counts from its
/// `create-ordered` (its slot granted and bound) to its end; at no point do more count than the quota allows.
fn never_over(w: &World, max: u32) {
    let mut charged_ids: BTreeSet<ResourceId> = BTreeSet::new();
    let mut counting: BTreeSet<ResourceId> = BTreeSet::new();
    for outcome in &w.outcomes {
        let by_principal = PRINCIPALS.contains(&outcome.command.issuer.as_str());
        for effect in outcome.effects() {
            match effect {
                Effect::ResourceAllocated { resource, kind, .. } if by_principal && kind == "container" => {
                    charged_ids.insert(*resource);
                }
                Effect::CreateOrdered { resource } if charged_ids.contains(resource) => {
                    counting.insert(*resource);
                    assert!(
                        counting.len() as u32 <= max,
                        "{} resources of the quota's principals at once, over its {max}",
                        counting.len()
                    );
                }
                Effect::ResourceDestroyed { resource, .. }
                | Effect::ResourceLost { resource, .. }
                | Effect::ResourceFailed { resource, .. }
                | Effect::ResourceOrphaned { resource } => {
                    counting.remove(resource);
                }
                _ => {}
            }
        }
    }
    assert!(w.charged().len() as u32 <= max, "more slots bound than the quota allows");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_quota_is_exceeded_across_partitions(steps in proptest::collection::vec(step(), 1..80)) {
        const MAX: u32 = 3;
        let mut w = World::new();
        // Agents in several partitions (PARTITIONS = 4): allocations race for the same slots from each.
        let agents = [w.register("w1"), w.register("w2"), w.register("w7")];
        let partitions: BTreeSet<u32> =
            agents.iter().map(|a| leasehold_schemas::subjects::partition_of_agent(a, PARTITIONS)).collect();
        prop_assert!(partitions.len() >= 2, "the agents are spread over partitions");
        w.set_quota(MAX, true);
        let mut confused = Confusion::new(&w);
        let mut without_wait: Vec<ResourceId> = Vec::new();
        for step in steps {
            match step {
                Step::Allocate { agent, who, volume, wait } => {
                    let issuer = [PRINCIPALS[0], PRINCIPALS[1], OUTSIDER][who];
                    let kind = if volume { "volume" } else { "container" };
                    let id = w.allocate_as(issuer, &agents[agent], kind, wait);
                    if who < 2 && !volume && !wait {
                        without_wait.push(id);
                    }
                }
                Step::Sweep { back, order, twice } => confused.sweep(&mut w, back, order, twice),
                Step::Replay { pick, n } => confused.replay(&mut w, pick, n),
                Step::Release { n, confirm } => {
                    if let Some((agent, id)) = w.nth_resource(n, |r| !r.state.is_terminal()) {
                        w.send("producer", Release { agent: agent.clone(), resource: id, reason: None });
                        if confirm {
                            w.destroyed(&agent, id);
                        }
                    }
                }
                Step::Time { secs } => {
                    w.advance(Millis::from_secs(secs));
                    for agent in &agents {
                        w.heartbeat_of(agent);
                    }
                }
            }
            never_over(&w, MAX);
            confused.remember(&w);
        }
        // An honest sweeper: every allocation over the quota without a wait is released, naming the quota; none is
        // left waiting for a slot.
        w.settle();
        never_over(&w, MAX);
        let over_quota: BTreeSet<ResourceId> = w
            .effects()
            .filter_map(|e| match e {
                Effect::ResourceReleasing { resource, cause: ReleaseCause::OverQuota { quota: q, max, .. } } => {
                    assert_eq!((q, *max), (&quota(), MAX));
                    Some(*resource)
                }
                _ => None,
            })
            .collect();
        for id in &without_wait {
            let resource = w.states.values().find_map(|s| s.resource(*id));
            if let Some(r) = resource.filter(|r| r.state == ResourceState::Pending) {
                let waits = matches!(r.claims.get(&slots()), Some(ClaimSlot::Wanted { .. }));
                prop_assert!(!waits, "{id} gave no wait and still waits for the quota");
            }
        }
        // Only allocations of the quota's principals are ever refused over it.
        for id in &over_quota {
            let allocated_by = w.outcomes.iter().find_map(|o| {
                o.effects().iter().any(|e| matches!(e, Effect::ResourceAllocated { resource, .. } if resource == id))
                    .then(|| o.command.issuer.as_str().to_owned())
            });
            prop_assert!(allocated_by.is_some_and(|by| PRINCIPALS.contains(&by.as_str())), "{id}");
        }
        // Everything charged ends: the slots all come back, and whoever waits with a wait is served in turn.
        for (agent, id) in w.charged() {
            w.send("producer", Release { agent: agent.clone(), resource: id, reason: None });
            w.destroyed(&agent, id);
        }
        w.settle();
        never_over(&w, MAX);
        let pool = w.states.values().find_map(|s| s.pool(&slots())).expect("defined");
        prop_assert!(
            pool.waiters.is_empty() || pool.held.len() as u32 == MAX,
            "{} wait while {} of {MAX} slots are held",
            pool.waiters.len(),
            pool.held.len()
        );
    }
}

/// A quota lowered below what is held: nothing more is charged until fewer than the new maximum are held, and the
/// slots above it are not handed out again.
#[test]
fn a_lowered_quota_charges_nothing_more_until_fewer_are_held() {
    let mut w = World::new();
    let agents = [w.register("w1"), w.register("w2")];
    w.set_quota(3, true);
    let first: Vec<ResourceId> =
        (0..3).map(|i| w.allocate_as(PRINCIPALS[0], &agents[i % 2], "container", true)).collect();
    w.settle();
    assert_eq!(w.charged().len(), 3);
    w.set_quota(1, false);
    let late = w.allocate_as(PRINCIPALS[1], &agents[0], "container", true);
    w.settle();
    assert_eq!(w.charged().len(), 3, "held slots stay with their holders");
    for id in &first[..2] {
        let agent = w.states.values().find_map(|s| s.resource(*id)).unwrap().agent.clone();
        w.send("producer", Release { agent: agent.clone(), resource: *id, reason: None });
        w.destroyed(&agent, *id);
    }
    w.settle();
    assert_eq!(w.charged().len(), 1, "two ended; the late one still waits: one is held of a maximum of 1");
    let waits = |w: &World| {
        let r = w.states.values().find_map(|s| s.resource(late)).unwrap();
        matches!(r.claims.get(&slots()), Some(ClaimSlot::Wanted { .. }))
    };
    assert!(waits(&w));
    let agent = w.states.values().find_map(|s| s.resource(first[2])).unwrap().agent.clone();
    w.send("producer", Release { agent: agent.clone(), resource: first[2], reason: None });
    w.destroyed(&agent, first[2]);
    w.settle();
    assert!(!waits(&w), "served once fewer than the new maximum are held");
    assert_eq!(w.charged().len(), 1);
}

/// Red team (fixed): a placement's commit names its principal only if the sweeper's view of the agent's partition records a
/// quota. A view taken before `op.set-quota` reached that partition plans a commit with no principal; decided after,
/// in a partition that does record the quota, it makes the placement's resource with no slot, and the principal's
/// next allocation takes the one slot there is: two of its resources at once under a maximum of 1.
#[test]
fn a_commit_planned_before_the_quota_reached_the_agent_s_partition_still_charges_the_principal() {
    use leasehold_domain::state::PlacementState;
    use leasehold_schemas::command::Place;
    let mut w = World::new();
    let agent = w.register_declaring("w1", &[], &[("container", 5)]);
    let placed = ResourceId::generate();
    w.send(PRINCIPALS[0], Place::new(placed, "container", 1)).expect("the placement is recorded");
    let bound = |w: &World| {
        w.states
            .values()
            .find_map(|s| s.placement(placed))
            .is_some_and(|p| matches!(p.state, PlacementState::Bound { .. }))
    };
    // Reserve, then bind, from fresh views: stop once bound, before any commit is planned.
    for _ in 0..4 {
        if bound(&w) {
            break;
        }
        let view = w.states.clone();
        w.sweep_confused(&view, 1, false);
    }
    assert!(bound(&w), "the placement is bound");
    assert!(w.states.values().all(|s| s.resource(placed).is_none()), "not committed yet");
    let before_quota = w.states.clone();
    w.set_quota(1, true);
    // The sweeper's view is behind: it plans the commit as if no quota were in use. Refused: the partition records a
    // quota, so the commit must name its principal; a sweeper with a fresh view asks again.
    w.sweep_confused(&before_quota, 1, false);
    assert!(w.states.values().all(|s| s.resource(placed).is_none()), "a commit naming no principal makes nothing");
    let direct = w.allocate_as(PRINCIPALS[1], &agent, "container", true);
    w.settle();
    let created: Vec<ResourceId> = w
        .effects()
        .filter_map(|e| match e {
            Effect::CreateOrdered { resource } if [placed, direct].contains(resource) => Some(*resource),
            _ => None,
        })
        .collect();
    assert!(
        created.len() <= 1,
        "both the placement {placed} and the allocation {direct} of the quota's principals were ordered created \
         under a maximum of 1 ({} slots bound)",
        w.charged().len()
    );
}
