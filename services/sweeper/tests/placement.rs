//! Placement across partitions, against the real decider and the real plan, without a log (DESIGN section 13):
//! where a request goes (labels, capacity, spread or pack, cordon), what it says when nothing fits, how it waits for
//! room, and — under racing placers and a confused sweeper that sends what stale views planned, twice, in any order
//! — that no agent ever holds more than its capacity and no request ever makes two resources.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_domain::state::PlacementState;
use leasehold_schemas::command::{
    CancelPlacement, CordonAgent, Place, PlacementStrategy, Release, SetPartitionSettings, UncordonAgent,
};
use leasehold_schemas::ids::{Key, Millis};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{AgentName, Command, ResourceId};
use leasehold_sweeper::plan::Planned;
use proptest::prelude::*;

mod support;

use support::{Confusion, PARTITIONS, World};

impl World {
    fn place(&mut self, select: &[(&str, &str)], strategy: PlacementStrategy, wait: Option<Millis>) -> ResourceId {
        let id = ResourceId::generate();
        self.send("producer", place(id, select, strategy, wait));
        id
    }

    fn placement(&self, id: ResourceId) -> &PlacementState {
        let home = partition_of_key(&Key::Placement(id), PARTITIONS);
        &self.states[&home].placement(id).expect("the placement is kept").state
    }

    /// The agents that hold a resource of this id, from pending to any end.
    fn holders(&self, id: ResourceId) -> Vec<AgentName> {
        self.states.values().filter_map(|s| s.resource(id)).map(|r| r.agent.clone()).collect()
    }

    fn release(&mut self, agent: &AgentName, resource: ResourceId) {
        self.send("producer", Release { agent: agent.clone(), resource, reason: None });
    }

    fn used(&self, agent: &AgentName, kind: &str) -> u32 {
        self.states[&partition_of_agent(agent, PARTITIONS)].agent(agent).unwrap().used(kind)
    }
}

fn place(id: ResourceId, select: &[(&str, &str)], strategy: PlacementStrategy, wait: Option<Millis>) -> Place {
    Place {
        resource: id,
        kind: "container".to_owned(),
        capacity: 1,
        attributes: BTreeMap::new(),
        parent: None,
        pools: Vec::new(),
        wait,
        select: select.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        strategy,
    }
}

fn bound_to(state: &PlacementState) -> Option<&AgentName> {
    match state {
        PlacementState::Bound { agent, .. } => Some(agent),
        _ => None,
    }
}

#[test]
fn spread_fills_the_emptiest_agent_with_the_labels_and_pack_the_fullest_under_capacity() {
    let mut w = World::new();
    let a = w.register_declaring("wa", &[("zone", "a")], &[("container", 3)]);
    let b = w.register_declaring("wb", &[("zone", "a")], &[("container", 3)]);
    let east = w.register_declaring("we", &[("zone", "east")], &[("container", 9)]);
    let mut on = Vec::new();
    for _ in 0..4 {
        let id = w.place(&[("zone", "a")], PlacementStrategy::Spread, None);
        w.settle();
        let agent = bound_to(w.placement(id)).expect("placed").clone();
        assert_eq!(w.holders(id), std::slice::from_ref(&agent), "the resource is made where the placement went, once");
        on.push(agent);
    }
    // Spread alternates (ties go to the name); the zone=east agent is never chosen.
    assert_eq!(on, [a.clone(), b.clone(), a.clone(), b.clone()]);
    assert_eq!((w.used(&a, "container"), w.used(&b, "container"), w.used(&east, "container")), (2, 2, 0));
    // Pack goes to the fullest that still has room: a (2 of 3), then a again is full, so b.
    let first = w.place(&[("zone", "a")], PlacementStrategy::Pack, None);
    w.settle();
    let second = w.place(&[("zone", "a")], PlacementStrategy::Pack, None);
    w.settle();
    assert_eq!(bound_to(w.placement(first)), Some(&a));
    assert_eq!(bound_to(w.placement(second)), Some(&b));
    // The outcome says where and why: the agent's use of the kind with it, of its capacity.
    let words = w
        .outcomes
        .iter()
        .flat_map(|o| o.effects())
        .filter_map(|e| match e {
            Effect::PlacementBound { resource, agent, used, capacity, .. } if *resource == second => {
                Some((agent.clone(), *used, *capacity))
            }
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(words, [(b.clone(), 3, 3)]);
    // All of zone=a is full now: a request without a wait is refused, naming what is missing.
    let refused = w.place(&[("zone", "a")], PlacementStrategy::Spread, None);
    w.settle();
    assert_eq!(
        w.placement(refused),
        &PlacementState::Failed {
            why: "zone=a: 2 agents full".to_owned(),
            at: match w.placement(refused) {
                PlacementState::Failed { at, .. } => *at,
                other => panic!("{other:?}"),
            }
        }
    );
    assert!(w.holders(refused).is_empty());
}

#[test]
fn nothing_fits_names_what_is_missing_and_a_cordoned_agent_takes_no_placement() {
    let mut w = World::new();
    let why = |w: &mut World, select: &[(&str, &str)]| {
        let id = w.place(select, PlacementStrategy::Spread, None);
        w.settle();
        match w.placement(id) {
            PlacementState::Failed { why, .. } => why.clone(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(why(&mut w, &[]), "any agent: no agent has registered");
    let w1 = w.register_declaring("w1", &[("zone", "a")], &[]);
    assert_eq!(why(&mut w, &[("zone", "b")]), "zone=b: no agent has these labels");
    assert_eq!(why(&mut w, &[("zone", "a")]), "zone=a: no agent takes container (none declared a capacity for it)");
    w.register_declaring("w1", &[("zone", "a")], &[("container", 5)]);
    w.send("op:alice", CordonAgent { agent: w1.clone(), reason: Some("kernel upgrade".to_owned()) });
    assert_eq!(why(&mut w, &[("zone", "a")]), "zone=a: 1 agent cordoned");
    w.send("op:alice", UncordonAgent { agent: w1.clone() });
    let id = w.place(&[("zone", "a")], PlacementStrategy::Spread, None);
    w.settle();
    assert_eq!(bound_to(w.placement(id)), Some(&w1));
}

#[test]
fn a_request_that_may_wait_waits_for_room_on_record_and_is_placed_when_a_resource_ends() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 1)]);
    let first = w.place(&[], PlacementStrategy::Spread, None);
    w.settle();
    assert_eq!(bound_to(w.placement(first)), Some(&w1));
    let waiting = w.place(&[], PlacementStrategy::Spread, Some(Millis::from_mins(5)));
    w.settle();
    assert!(
        matches!(w.placement(waiting), PlacementState::Waiting { why, .. } if why == "any agent: 1 agent full"),
        "{:?}",
        w.placement(waiting)
    );
    // The first resource leaves: released, then confirmed destroyed; the waiting one takes its place.
    w.release(&w1, first);
    w.settle();
    assert!(matches!(w.placement(waiting), PlacementState::Waiting { .. }), "releasing still counts");
    w.destroyed(&w1, first);
    w.settle();
    assert_eq!(bound_to(w.placement(waiting)), Some(&w1));
    assert_eq!(w.holders(waiting), std::slice::from_ref(&w1));
    // One that waits past its wait is refused, saying how long it waited and why.
    let late = w.place(&[], PlacementStrategy::Spread, Some(Millis::from_secs(30)));
    w.settle();
    w.advance(Millis::from_secs(31));
    w.settle();
    assert!(
        matches!(w.placement(late), PlacementState::Failed { why, .. } if why == "no room within 30s: any agent: 1 agent full"),
        "{:?}",
        w.placement(late)
    );
    // A waiting request can be cancelled; a placed one cannot (release its resource instead).
    let cancelled = w.place(&[], PlacementStrategy::Spread, Some(Millis::from_mins(5)));
    w.settle();
    w.send("op:alice", CancelPlacement { resource: cancelled, reason: None });
    w.settle();
    assert!(matches!(w.placement(cancelled), PlacementState::Cancelled { .. }));
    let refusal = w.send("op:alice", CancelPlacement { resource: waiting, reason: None }).unwrap();
    assert!(refusal.rejection().unwrap().message.contains("already placed on w1"), "{refusal:?}");
    assert_eq!(w.used(&w1, "container"), 1);
}

#[test]
fn a_request_sent_again_makes_nothing_more_and_says_where_it_went() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 4)]);
    let id = ResourceId::generate();
    let request = place(id, &[], PlacementStrategy::Spread, None);
    w.send("producer", request.clone());
    w.settle();
    // Under another command id (a retry after the dedupe window): answered, not decided again.
    let again = w.send("producer", request.clone()).unwrap();
    let rejection = again.rejection().expect("answered already-done");
    assert!(rejection.message.contains("placed on w1 (1 of 4 container)"), "{}", rejection.message);
    w.settle();
    assert_eq!(w.holders(id), std::slice::from_ref(&w1));
    assert_eq!(w.used(&w1, "container"), 1);
    // The same id with another request is refused.
    let other = w.send("producer", place(id, &[("zone", "b")], PlacementStrategy::Pack, None)).unwrap();
    assert!(other.rejection().unwrap().message.contains("a different placement"), "{other:?}");
}

/// Sends every request due now except the commits (an agent's partition that is down, a sweeper that stops between
/// the bind and the commit), until none other is due.
fn settle_without_commits(w: &mut World) {
    for _ in 0..100 {
        let due: Vec<Planned> =
            w.due().into_iter().filter(|p| !matches!(p.command, Command::CommitPlacement(_))).collect();
        if due.is_empty() {
            return;
        }
        for item in due {
            w.send("sweeper:a", item.command);
        }
    }
    panic!("the plan never settles");
}

#[test]
fn a_commit_late_by_more_than_the_horizon_still_makes_the_resource_and_only_then_is_the_placement_forgotten() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let id = ResourceId::generate();
    let home = partition_of_key(&Key::Placement(id), PARTITIONS);
    let horizon = Millis::from_mins(1);
    let settings = |key: Key, partition: u32| SetPartitionSettings {
        key,
        partition,
        outcome_horizon: Some(horizon),
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: None,
    };
    w.send("op:alice", settings(Key::Placement(id), home)).expect("the horizon is set");
    w.send("producer", place(id, &[], PlacementStrategy::Spread, None));
    settle_without_commits(&mut w);
    assert_eq!(bound_to(w.placement(id)), Some(&w1));
    // Far past the horizon, and something decided in the placement's partition (which forgets what is old then).
    w.advance(Millis::from_mins(10));
    w.send("op:alice", settings(Key::Placement(id), home)).expect("decided in the placement's partition");
    assert!(
        matches!(w.placement(id), PlacementState::Bound { closed: false, .. }),
        "a bound placement is kept until its commit is on record: {:?}",
        w.placement(id)
    );
    w.settle();
    assert_eq!(w.holders(id), std::slice::from_ref(&w1), "the late commit made the resource");
    assert!(matches!(w.placement(id), PlacementState::Bound { closed: true, .. }), "{:?}", w.placement(id));
    assert_eq!(w.used(&w1, "container"), 1, "the room became the resource, counted once");
    // Closed: forgotten a horizon later, and nothing more is asked for it.
    w.advance(Millis::from_mins(2));
    w.send("op:alice", settings(Key::Placement(id), home)).expect("decided in the placement's partition");
    assert!(w.states[&home].placement(id).is_none(), "forgotten a horizon after it closed");
    assert!(w.due().iter().all(|p| !p.key.contains(&id.to_string())), "{:#?}", w.due());
}

#[test]
fn room_held_on_an_agent_cordoned_since_is_kept_while_another_agent_is_sought() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let id = ResourceId::generate();
    w.send("producer", place(id, &[], PlacementStrategy::Spread, Some(Millis::from_mins(5))));
    // The sweeper reserves on w1; before the reservation is carried back, w1 is cordoned.
    for item in w.due() {
        w.send("sweeper:a", item.command);
    }
    assert_eq!(w.state_of(&w1).agent(&w1).unwrap().reservations.len(), 1);
    w.send("op:alice", CordonAgent { agent: w1.clone(), reason: None });
    // Nothing binds it, nothing gives it back (a view behind could not tell it was not bound already): the
    // placement waits, saying why, and keeps the room.
    w.settle();
    assert!(
        matches!(w.placement(id), PlacementState::Waiting { why, .. } if why == "any agent: 1 agent cordoned"),
        "{:?}",
        w.placement(id)
    );
    assert_eq!(w.state_of(&w1).agent(&w1).unwrap().reservations.len(), 1);
    // Another agent comes: the placement goes there, and the room on w1 is given back.
    let w2 = w.register_declaring("w2", &[], &[("container", 2)]);
    w.settle();
    assert_eq!(bound_to(w.placement(id)), Some(&w2));
    assert_eq!(w.holders(id), std::slice::from_ref(&w2));
    assert!(w.state_of(&w1).agent(&w1).unwrap().reservations.is_empty(), "the room on w1 is given back");
    // With no other agent, uncordoning binds the room held.
    let other = ResourceId::generate();
    w.send("op:alice", CordonAgent { agent: w2.clone(), reason: None });
    w.send("op:alice", UncordonAgent { agent: w1.clone() });
    w.send("producer", place(other, &[], PlacementStrategy::Spread, Some(Millis::from_mins(5))));
    for item in w.due() {
        w.send("sweeper:a", item.command);
    }
    w.send("op:alice", CordonAgent { agent: w1.clone(), reason: None });
    w.settle();
    assert!(matches!(w.placement(other), PlacementState::Waiting { .. }), "{:?}", w.placement(other));
    w.send("op:alice", UncordonAgent { agent: w1.clone() });
    w.settle();
    assert_eq!(bound_to(w.placement(other)), Some(&w1));
    assert_eq!(w.holders(other), std::slice::from_ref(&w1));
}

// --- racing placers and a confused sweeper ----------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    /// A producer asks for a placement (with or without a wait).
    Place { pack: bool, wait: bool },
    /// The sweeper runs a plan from the view `back` steps ago and sends the due requests in a shuffled order,
    /// some of them twice.
    Sweep { back: usize, order: u64, twice: bool },
    /// An operator releases the `n`-th live resource, and its agent confirms the destroy.
    Release { n: usize, confirm: bool },
    /// An operator cordons or uncordons an agent.
    Cordon { agent: usize, on: bool },
    /// Log time passes.
    Tick { secs: u64 },
    /// The sweeper sends again requests some view planned long ago (a retry after the dedupe window, a sweeper
    /// restarted from an old state).
    Replay { pick: u64, n: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (any::<bool>(), any::<bool>()).prop_map(|(pack, wait)| Step::Place { pack, wait }),
        5 => (0usize..6, any::<u64>(), any::<bool>()).prop_map(|(back, order, twice)| Step::Sweep { back, order, twice }),
        2 => (0usize..8, any::<bool>()).prop_map(|(n, confirm)| Step::Release { n, confirm }),
        1 => (0usize..3, any::<bool>()).prop_map(|(agent, on)| Step::Cordon { agent, on }),
        1 => (1u64..40).prop_map(|secs| Step::Tick { secs }),
        2 => (any::<u64>(), 1usize..6).prop_map(|(pick, n)| Step::Replay { pick, n }),
    ]
}

/// No agent past its capacity, counting reservations; no request with resources on two agents, or on an agent
/// other than the one its placement bound.
fn check(w: &World, agents: &[AgentName], ids: &BTreeSet<ResourceId>) {
    for agent in agents {
        let state = &w.states[&partition_of_agent(agent, PARTITIONS)];
        let record = state.agent(agent).unwrap();
        let capacity = record.capacity.get("container").copied().unwrap_or(0);
        assert!(record.used("container") <= capacity, "{agent} holds {} of {capacity}", record.used("container"));
        let live = state.resources().filter(|r| r.agent == *agent && !r.state.is_terminal()).count() as u32;
        assert!(live <= capacity, "{agent} has {live} live resources, over {capacity}");
    }
    for id in ids {
        let holders = w.holders(*id);
        assert!(holders.len() <= 1, "request {id} made resources on {holders:?}");
        let home = partition_of_key(&Key::Placement(*id), PARTITIONS);
        if let (Some(holder), Some(placement)) = (holders.first(), w.states[&home].placement(*id)) {
            assert_eq!(bound_to(&placement.state), Some(holder), "{id} was made where its placement did not bind");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn racing_placers_and_a_confused_sweeper_never_exceed_capacity_nor_make_two_resources(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        let mut w = World::new();
        let agents = vec![
            w.register_declaring("w1", &[("zone", "a")], &[("container", 2)]),
            w.register_declaring("w2", &[("zone", "a")], &[("container", 1)]),
            w.register_declaring("w3", &[("zone", "a")], &[("container", 2)]),
        ];
        let mut confused = Confusion::new(&w);
        let mut ids = BTreeSet::new();
        for step in steps {
            match step {
                Step::Place { pack, wait } => {
                    let strategy = if pack { PlacementStrategy::Pack } else { PlacementStrategy::Spread };
                    let wait = wait.then_some(Millis::from_secs(60));
                    ids.insert(w.place(&[("zone", "a")], strategy, wait));
                }
                Step::Sweep { back, order, twice } => confused.sweep(&mut w, back, order, twice),
                Step::Release { n, confirm } => {
                    if let Some((agent, id)) = w.nth_resource(n, |r| !r.state.is_terminal()) {
                        w.release(&agent, id);
                        if confirm {
                            w.destroyed(&agent, id);
                        }
                    }
                }
                Step::Cordon { agent, on } => {
                    let name = agents[agent].clone();
                    if on {
                        w.send("op:alice", CordonAgent { agent: name, reason: None });
                    } else {
                        w.send("op:alice", UncordonAgent { agent: name });
                    }
                }
                Step::Tick { secs } => w.advance(Millis::from_secs(secs)),
                Step::Replay { pick, n } => confused.replay(&mut w, pick, n),
            }
            check(&w, &agents, &ids);
            confused.remember(&w);
        }
        // An honest sweeper finishes the work: every request ends placed, refused or waiting, and still nothing
        // is over capacity or made twice; no reservation is left but those of requests still seeking.
        for agent in &agents {
            w.send("op:alice", UncordonAgent { agent: agent.clone() });
        }
        w.advance(Millis::from_secs(120));
        w.settle();
        check(&w, &agents, &ids);
        for id in &ids {
            let state = w.placement(*id);
            prop_assert!(
                !matches!(state, PlacementState::Seeking | PlacementState::Waiting { .. }),
                "{id} still {state:?} after its wait"
            );
        }
        for agent in &agents {
            let record = w.states[&partition_of_agent(agent, PARTITIONS)].agent(agent).unwrap();
            prop_assert!(record.reservations.is_empty(), "{agent} still holds room: {:?}", record.reservations);
        }
        // Placed means made: every bound placement is closed, its resource made on the agent it bound.
        for id in &ids {
            if let PlacementState::Bound { agent, closed, .. } = w.placement(*id) {
                prop_assert!(*closed, "{id} bound to {agent} but not closed");
                prop_assert_eq!(w.holders(*id), vec![agent.clone()], "{} bound to {} but made elsewhere or not", id, agent);
            }
        }
    }
}
