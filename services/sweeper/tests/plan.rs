//! The sweeper's plan against the real decider, without a log: every partition's state is folded in memory, the
//! plan is "sent" by deciding each due request in its partition at a log time the test sets, twice over (as two
//! sweepers would), and the world is driven until nothing more is due. What must come out: pools carried across
//! partitions with first-in-first-out waiters and a cool-down, nothing done twice, and no state that grows with the
//! size of a pool.

use std::collections::BTreeMap;

use leasehold_domain::state::{ClaimSlot, Holding};
use leasehold_schemas::command::{Acquire, Allocate, DefinePool, DrainAgent, Release, ReportCreated};
use leasehold_schemas::ids::{Key, Millis, PoolName, ResourceRef, Timestamp};
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{AgentName, Command, LeaseId, ResourceId};
use leasehold_sweeper::plan::Planned;

mod support;

use support::{PARTITIONS, World};

const T0: u64 = 1_800_000_000_000;

impl World {
    fn allocate(&mut self, agent: &AgentName, pools: &[&PoolName]) -> ResourceId {
        let id = ResourceId::generate();
        let mut body = Allocate::new(agent.clone(), id, "container", 1);
        body.pools = pools.iter().map(|p| (*p).clone()).collect();
        self.send("producer", body);
        id
    }

    /// The agent made it: it reports it created.
    fn created(&mut self, agent: &AgentName, resource: ResourceId) {
        let epoch = self.state_of(agent).agent(agent).unwrap().epoch;
        let obs = self.next_obs(agent);
        let body = ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id: None };
        self.send(agent.as_str(), body);
    }

    fn claim_of(&self, agent: &AgentName, resource: ResourceId, pool: &PoolName) -> Option<ClaimSlot> {
        self.state_of(agent).resource(resource).and_then(|r| r.claims.get(pool).cloned())
    }
}

/// Two agent names in two partitions other than the pool's.
fn names(pool: &PoolName) -> (String, String) {
    let pool_home = partition_of_key(&Key::Pool(pool.clone()), PARTITIONS);
    let mut found = (1..200)
        .map(|n| format!("w{n}"))
        .filter(|n| partition_of_agent(&AgentName::new(n.as_str()).unwrap(), PARTITIONS) != pool_home);
    let first = found.next().unwrap();
    let first_home = partition_of_agent(&AgentName::new(first.as_str()).unwrap(), PARTITIONS);
    let second =
        found.find(|n| partition_of_agent(&AgentName::new(n.as_str()).unwrap(), PARTITIONS) != first_home).unwrap();
    (first, second)
}

fn bound(slot: Option<ClaimSlot>) -> Option<PoolValue> {
    match slot {
        Some(ClaimSlot::Bound { value, .. }) => Some(value),
        _ => None,
    }
}

#[test]
fn an_address_is_carried_across_partitions_waits_first_in_first_out_and_cools_down() {
    let mut world = World::new();
    let pool = PoolName::new("net").unwrap();
    let (a, b) = names(&pool);
    let (a, b) = (world.register(&a), world.register(&b));
    let kind = PoolKind::Ipv4 { network: "10.0.0.0".parse().unwrap(), prefix_len: 30, exclude: vec![] };
    world.send(
        "netops",
        DefinePool {
            pool: pool.clone(),
            kind,
            cooldown: Some(Millis::from_secs(60)),
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        },
    );

    // Two holders on two agents take both addresses; two more wait, in the order they asked.
    let first = world.allocate(&a, &[&pool]);
    world.settle();
    let second = world.allocate(&b, &[&pool]);
    world.settle();
    let third = world.allocate(&a, &[&pool]);
    world.settle();
    let fourth = world.allocate(&b, &[&pool]);
    world.settle();
    let given = [bound(world.claim_of(&a, first, &pool)), bound(world.claim_of(&b, second, &pool))];
    assert!(given.iter().all(Option::is_some) && given[0] != given[1], "{given:?}");
    let pool_state = world.states[&partition_of_key(&Key::Pool(pool.clone()), PARTITIONS)].pool(&pool).unwrap();
    let waiting: Vec<ResourceId> = pool_state.waiters.values().map(|h| h.resource).collect();
    assert_eq!(waiting, vec![third, fourth], "they wait first in, first out");

    // The first is released: its address stays held while it is releasing, whatever the sweepers do.
    world.created(&a, first);
    world.send("producer", Release { agent: a.clone(), resource: first, reason: None });
    world.settle();
    assert!(bound(world.claim_of(&a, third, &pool)).is_none(), "nothing is handed out while the holder is releasing");

    // Destroyed: the address is freed, but cools down before anyone gets it.
    world.destroyed(&a, first);
    world.settle();
    let freed = world.effects().filter(|e| matches!(e, Effect::ClaimFreed { .. })).count();
    assert_eq!(freed, 1, "freed once, though two sweepers asked");
    assert!(bound(world.claim_of(&a, third, &pool)).is_none(), "still cooling down");
    let tick = world.plan().into_iter().find(|p| p.command.type_name() == "sys.tick-pool").expect("a tick is planned");
    assert_eq!(tick.due, Some(world.now.saturating_add(Millis::from_secs(60))), "at the end of the cool-down");

    world.advance(Millis::from_secs(60));
    world.settle();
    assert_eq!(bound(world.claim_of(&a, third, &pool)), given[0], "the third gets the first one's address");
    assert!(bound(world.claim_of(&b, fourth, &pool)).is_none(), "the fourth still waits");
    let granted_twice = world
        .effects()
        .filter_map(|e| match e {
            Effect::ClaimGranted { holder, .. } => Some(holder.resource),
            _ => None,
        })
        .fold(BTreeMap::<ResourceId, usize>::new(), |mut n, r| {
            *n.entry(r).or_default() += 1;
            n
        });
    assert!(granted_twice.values().all(|n| *n == 1), "every holder granted once: {granted_twice:?}");
    assert!(world.plan().iter().all(|p| p.due.is_some()), "nothing more to do now: {:#?}", world.plan());
}

#[test]
fn a_holder_that_leaves_while_waiting_leaves_the_queue() {
    let mut world = World::new();
    let pool = PoolName::new("slots").unwrap();
    let (a, _) = names(&pool);
    let a = world.register(&a);
    world.send(
        "ops",
        DefinePool {
            pool: pool.clone(),
            kind: PoolKind::Slots { count: 1 },
            cooldown: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        },
    );
    let holder = world.allocate(&a, &[&pool]);
    world.settle();
    let waiter = world.allocate(&a, &[&pool]);
    world.settle();
    assert!(bound(world.claim_of(&a, holder, &pool)).is_some());
    world.send("producer", Release { agent: a.clone(), resource: waiter, reason: None });
    // Never created: the agent reports it gone, and the waiter's place in the queue goes with it.
    world.destroyed(&a, waiter);
    world.settle();
    let pool_state = world.states[&partition_of_key(&Key::Pool(pool.clone()), PARTITIONS)].pool(&pool).unwrap();
    assert!(pool_state.waiters.is_empty(), "{:?}", pool_state.waiters);
    assert!(world.effects().any(|e| matches!(e, Effect::ClaimWithdrawn { .. })));
}

#[test]
fn a_slash_16_pool_is_never_materialised() {
    let mut world = World::new();
    let pool = PoolName::new("big").unwrap();
    let (a, _) = names(&pool);
    let a = world.register(&a);
    let kind = PoolKind::Ipv4 { network: "10.1.0.0".parse().unwrap(), prefix_len: 16, exclude: vec![] };
    world.send(
        "netops",
        DefinePool {
            pool: pool.clone(),
            kind,
            cooldown: None,
            orphans: leasehold_schemas::pool::OrphanPolicy::Release,
        },
    );
    let holders: Vec<ResourceId> = (0..3).map(|_| world.allocate(&a, &[&pool])).collect();
    world.settle();
    for id in &holders {
        assert!(bound(world.claim_of(&a, *id, &pool)).is_some());
    }
    let pool_state = world.states[&partition_of_key(&Key::Pool(pool.clone()), PARTITIONS)].pool(&pool).unwrap();
    assert_eq!((pool_state.held.len(), pool_state.holders.len(), pool_state.cooling.len()), (3, 3, 0));
    assert_eq!(pool_state.next_fresh, 4, "indices 1..=3 handed out (0 is the network address)");
    assert!(matches!(pool_state.holders.values().next(), Some(Holding::Granted { .. })));
    // The plan is about holders and waiters, never about the 65,534 free addresses.
    assert!(world.plan().len() < 20, "{}", world.plan().len());
}

#[test]
fn request_ids_are_shared_within_a_window_and_new_after_it() {
    let window = leasehold_sweeper::ID_WINDOW;
    let width = window.as_millis() as u64;
    let start = Timestamp(T0 / width * width);
    let at = Timestamp(start.0 + 1);
    let same = leasehold_sweeper::request_id("expire-lease w1.x 123", at, window);
    assert_eq!(same, leasehold_sweeper::request_id("expire-lease w1.x 123", Timestamp(start.0 + width - 1), window));
    assert_ne!(same, leasehold_sweeper::request_id("expire-lease w1.x 123", Timestamp(start.0 + width), window));
    assert_ne!(same, leasehold_sweeper::request_id("expire-lease w1.y 123", at, window));
    assert_eq!(same.unix_ms(), start.0, "stamped with the window's start");
    // A long retry does not widen the window: the id is never much older than its send.
    let long = leasehold_sweeper::request_id("expire-lease w1.x 123", at, std::time::Duration::from_secs(300));
    assert_eq!(long, same);
}

/// A drain is planned resource by resource: an idle one at the end of the grace, a leased one only at the deadline;
/// planned again, the same requests; two sweepers release each once.
#[test]
fn a_drain_is_planned_as_each_resource_falls_due() {
    let mut world = World::new();
    let a = world.register("w1");
    let (idle, leased) = (world.allocate(&a, &[]), world.allocate(&a, &[]));
    world.created(&a, idle);
    world.created(&a, leased);
    // A child of the idle one on another agent, in another partition: it follows its parent out.
    let other = (2..200)
        .map(|n| format!("w{n}"))
        .find(|n| {
            partition_of_agent(&AgentName::new(n.as_str()).unwrap(), PARTITIONS) != partition_of_agent(&a, PARTITIONS)
        })
        .unwrap();
    let b = world.register(&other);
    let child = ResourceId::generate();
    let mut body = Allocate::new(b.clone(), child, "container", 1);
    body.parent = Some(ResourceRef::new(a.clone(), idle));
    world.send("producer", body);
    world.settle();
    world.created(&b, child);
    let lease = Acquire {
        agent: a.clone(),
        resource: leased,
        lease: LeaseId::generate(),
        holder: "build-7".into(),
        ttl: None,
        wait_timeout: None,
        priority: 0,
    };
    world.send("producer", lease);
    world.settle();
    let (grace, deadline) = (Millis::from_secs(60), Millis::from_secs(600));
    let drain = DrainAgent { agent: a.clone(), deadline: Some(deadline), grace: Some(grace), reason: None };
    world.send("op:alice", drain);
    let drains = |world: &World| -> Vec<Planned> {
        world.plan().into_iter().filter(|p| p.command.type_name() == "sys.drain-release").collect()
    };
    let planned = drains(&world);
    let started = world.now;
    let release = |resource| Command::from(leasehold_schemas::command::DrainRelease { agent: a.clone(), resource });
    let mut expected = vec![
        (release(idle), Some(started.saturating_add(grace))),
        (release(leased), Some(started.saturating_add(deadline))),
    ];
    expected.sort_by_key(|(command, _)| format!("{command:?}"));
    let mut got: Vec<_> = planned.iter().map(|p| (p.command.clone(), p.due)).collect();
    got.sort_by_key(|(command, _)| format!("{command:?}"));
    assert_eq!(got, expected, "the idle one at the end of the grace, the leased one at the deadline");
    assert_eq!(drains(&world), planned, "planned again, the same requests");

    world.settle();
    let releasing = |world: &World, id| world.state_of(&a).resource(id).unwrap().state.name();
    assert_eq!((releasing(&world, idle), releasing(&world, leased)), ("active", "active"), "nothing is due yet");
    world.advance(grace);
    world.settle();
    assert_eq!((releasing(&world, idle), releasing(&world, leased)), ("releasing", "active"));
    assert_eq!(world.state_of(&b).resource(child).unwrap().state.name(), "releasing", "the child followed its parent");
    world.advance(Millis(deadline.0 - grace.0));
    world.settle();
    assert_eq!(releasing(&world, leased), "releasing");
    let drained: Vec<bool> = world
        .effects()
        .filter_map(|e| match e {
            Effect::ResourceReleasing { cause: ReleaseCause::Drained { deadline, .. }, .. } => Some(*deadline),
            _ => None,
        })
        .collect();
    assert_eq!(drained, [false, true], "each released once, though two sweepers asked");
    assert!(drains(&world).is_empty(), "{:#?}", drains(&world));
}

/// A lease queued behind the holder of a busy resource has its wait timeout planned as a pending resource's waiter
/// does: at its `until`, and two sweepers fail it once; a second waiter whose wait is longer is granted when the
/// holder gives its lease back.
#[test]
fn a_queued_waiter_times_out_by_the_sweeper() {
    let mut world = World::new();
    let a = world.register("w1");
    let resource = world.allocate(&a, &[]);
    world.created(&a, resource);
    let acquire = |wait: Option<Millis>| Acquire {
        agent: a.clone(),
        resource,
        lease: LeaseId::generate(),
        holder: "build-7".into(),
        ttl: None,
        wait_timeout: wait,
        priority: 0,
    };
    let holder = acquire(None);
    let (short, long) = (acquire(Some(Millis::from_secs(30))), acquire(Some(Millis::from_mins(10))));
    for body in [&holder, &short, &long] {
        world.send("producer", body.clone());
    }
    world.settle();
    let queued_at = world.now;
    let timeouts = |world: &World| -> Vec<Planned> {
        world.plan().into_iter().filter(|p| p.command.type_name() == "sys.wait-timeout").collect()
    };
    let due: Vec<_> = timeouts(&world).iter().map(|p| p.due).collect();
    assert_eq!(
        due,
        [Some(queued_at.saturating_add(Millis::from_secs(30))), Some(queued_at.saturating_add(Millis::from_mins(10)))]
    );
    world.advance(Millis::from_secs(31));
    world.settle();
    let state_of = |world: &World, lease: LeaseId| world.state_of(&a).lease(lease).unwrap().state.name();
    assert_eq!((state_of(&world, short.lease), state_of(&world, long.lease)), ("failed", "waiting"));
    let failed = world.effects().filter(|e| matches!(e, Effect::LeaseFailed { .. })).count();
    assert_eq!(failed, 1, "failed once, though two sweepers asked");
    let token = match world.state_of(&a).lease(holder.lease).unwrap().state {
        leasehold_domain::state::LeaseState::Active { token, .. } => token,
        ref other => panic!("the holder's lease is {other:?}"),
    };
    let release =
        leasehold_schemas::command::ReleaseLease { agent: a.clone(), lease: holder.lease, token: Some(token) };
    world.send("producer", release);
    world.settle();
    assert_eq!(state_of(&world, long.lease), "active", "granted in the outcome of the release");
    assert!(timeouts(&world).is_empty());
}
