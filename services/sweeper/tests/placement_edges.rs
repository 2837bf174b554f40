//! Placement at its edges, against the real decider and the real plan (DESIGN section 13): an id the agent's
//! partition will not take, a parent named by a child while its placement is bound but not yet made, an agent that
//! declares less after it reserved, and room held on an agent that stops taking work (cordoned past the deadline,
//! gone and back).

use std::collections::BTreeMap;

use leasehold_domain::state::PlacementState;
use leasehold_schemas::command::{Allocate, CordonAgent, Place, PlacementStrategy, Register, UncordonAgent};
use leasehold_schemas::ids::{Key, Millis, ResourceRef};
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{AgentName, Command, ResourceId, Uuid};
use leasehold_sweeper::plan::Planned;

mod support;

use support::{PARTITIONS, World};

fn place(id: ResourceId, select: &[(&str, &str)], wait: Option<Millis>) -> Place {
    Place {
        resource: id,
        kind: "container".to_owned(),
        capacity: 1,
        attributes: BTreeMap::new(),
        parent: None,
        pools: Vec::new(),
        wait,
        select: select.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        strategy: PlacementStrategy::Spread,
    }
}

fn placement(w: &World, id: ResourceId) -> &PlacementState {
    let home = partition_of_key(&Key::Placement(id), PARTITIONS);
    &w.states[&home].placement(id).expect("the placement is kept").state
}

fn bound_to(state: &PlacementState) -> Option<&AgentName> {
    match state {
        PlacementState::Bound { agent, .. } => Some(agent),
        _ => None,
    }
}

/// The agents that hold a resource of this id, from pending to any end.
fn holders(w: &World, id: ResourceId) -> Vec<AgentName> {
    w.states.values().filter_map(|s| s.resource(id)).map(|r| r.agent.clone()).collect()
}

/// The agent's resources of the kind that are not terminal.
fn live(w: &World, agent: &AgentName) -> usize {
    let state = w.state_of(agent);
    state.resources().filter(|r| r.agent == *agent && !r.state.is_terminal()).count()
}

fn reservations(w: &World, agent: &AgentName) -> usize {
    w.state_of(agent).agent(agent).unwrap().reservations.len()
}

/// Sends, once each, the requests due now that `pick` selects.
fn send_due(w: &mut World, pick: impl Fn(&Command) -> bool) -> usize {
    let due: Vec<Planned> = w.due().into_iter().filter(|p| pick(&p.command)).collect();
    let n = due.len();
    for item in due {
        w.send("sweeper:a", item.command);
    }
    n
}

/// Sends every request due now except the commits (an agent's partition slow to take them), until none other is due.
fn settle_without_commits(w: &mut World) {
    for _ in 0..100 {
        if send_due(w, |c| !matches!(c, Command::CommitPlacement(_))) == 0 {
            return;
        }
    }
    panic!("the plan never settles: {:#?}", w.plan());
}

/// A registration of `name` declaring `labels` and `capacity`, as a new incarnation of the process.
fn register_again(w: &mut World, name: &AgentName, labels: &[(&str, &str)], capacity: &[(&str, u32)]) {
    let mut body = Register::new(name.clone(), Uuid::from_u128(u128::from(w.cmd_seq) + 1000));
    body.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    body.capacity = capacity.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
    w.send(name.as_str(), body).expect("a registration is appended");
}

#[test]
fn names_used_here_fall_in_two_partitions() {
    // w1 and w5 share a partition; w2 lives in another.
    let p = |n: &str| partition_of_agent(&AgentName::new(n).unwrap(), PARTITIONS);
    assert_eq!(p("w1"), p("w5"));
    assert_ne!(p("w1"), p("w2"));
}

/// A child on w2 names `w1.<id>` as its parent before the placement of `<id>` went anywhere (the producer guessed
/// where it would go). w1's partition answers the adoption "absent" and records the id so: it never takes that id
/// again. The placement must not ask w1 for room for ever.
#[test]
fn a_placement_whose_id_the_only_fitting_agent_recorded_absent_fails_instead_of_asking_it_for_ever() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let w2 = w.register("w2");
    let id = ResourceId::generate();
    let child = ResourceId::generate();
    w.send("producer", place(id, &[], None));
    w.send(
        "producer",
        Allocate { parent: Some(ResourceRef::new(w1.clone(), id)), ..Allocate::new(w2.clone(), child, "volume", 1) },
    )
    .expect("the child is allocated");
    // The adoption reaches w1's partition first: the parent was never known there.
    assert_eq!(send_due(&mut w, |c| matches!(c, Command::Adopt(_))), 1);
    assert!(w.state_of(&w1).is_absent(id));
    w.settle();
    assert!(
        matches!(placement(&w, id), PlacementState::Failed { .. }),
        "no agent can take resource id {id}: {:?}",
        placement(&w, id)
    );
    assert!(holders(&w, id).is_empty());
    assert_eq!(reservations(&w, &w1), 0);
}

/// The producer is told "placed on w1" and allocates a child of `w1.<id>` on w2; the child's adoption reaches w1's
/// partition before the placement's commit does. The parent is made a moment later: the child must not be released
/// as the child of a parent that "was never allocated", nor the id recorded absent where it lives.
#[test]
fn a_child_of_a_placed_parent_whose_commit_is_late_is_not_told_its_parent_is_absent() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let w2 = w.register("w2");
    let parent = ResourceId::generate();
    w.send("producer", place(parent, &[], None));
    settle_without_commits(&mut w);
    assert_eq!(bound_to(placement(&w, parent)), Some(&w1), "the producer reads: placed on w1");
    let child = ResourceId::generate();
    w.send(
        "producer",
        Allocate {
            parent: Some(ResourceRef::new(w1.clone(), parent)),
            ..Allocate::new(w2.clone(), child, "volume", 1)
        },
    )
    .expect("the child is allocated");
    // w1's partition is slow to take the commit; the sweeper carries on with everything else.
    settle_without_commits(&mut w);
    w.settle();
    assert_eq!(holders(&w, parent), std::slice::from_ref(&w1), "the parent is made where it was placed");
    let absent: Vec<&Effect> = w
        .effects()
        .filter(|e| {
            matches!(e, Effect::ResourceReleasing { resource, cause } if *resource == child
                && matches!(cause, ReleaseCause::ParentAbsent { .. }))
        })
        .collect();
    assert!(absent.is_empty(), "the child of a placed parent was released as its parent's absence: {absent:?}");
    assert!(!w.state_of(&w1).is_absent(parent), "{parent} lives on w1, and is recorded absent there");
    let state = w.state_of(&w2).resource(child).expect("the child").state.clone();
    assert!(!state.is_terminal() && state.name() != "releasing", "the child is {}", state.name());
}

/// Room reserved on w1, then w1 registers again declaring it takes no container any more (and another label): the
/// placement must not be bound to that room and made there.
#[test]
fn room_reserved_on_an_agent_that_since_declared_it_takes_no_such_kind_is_not_where_the_request_goes() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[("zone", "a")], &[("container", 2)]);
    let id = ResourceId::generate();
    w.send("producer", place(id, &[("zone", "a")], None));
    assert_eq!(send_due(&mut w, |c| matches!(c, Command::Reserve(_))), 1);
    assert_eq!(reservations(&w, &w1), 1);
    // The machine is rebuilt as a volume host in zone b.
    register_again(&mut w, &w1, &[("zone", "b")], &[("volume", 4)]);
    w.settle();
    assert!(
        holders(&w, id).is_empty(),
        "a container was made on {:?}, which declared it takes none and carries zone=b: {:?}",
        holders(&w, id),
        placement(&w, id)
    );
    assert!(matches!(placement(&w, id), PlacementState::Failed { .. }), "{:?}", placement(&w, id));
    assert_eq!(reservations(&w, &w1), 0, "the room is given back");
}

/// Two placements reserve the two containers w1 had room for; w1 then declares room for one. Only one of them may
/// be made there.
#[test]
fn room_reserved_on_an_agent_that_since_declared_less_puts_no_more_on_it_than_it_declared() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let first = ResourceId::generate();
    let second = ResourceId::generate();
    w.send("producer", place(first, &[], None));
    w.send("producer", place(second, &[], None));
    // One sweep reserves for both from the same view (spread: w1 has room for both).
    assert_eq!(send_due(&mut w, |c| matches!(c, Command::Reserve(_))), 2);
    assert_eq!(reservations(&w, &w1), 2);
    register_again(&mut w, &w1, &[], &[("container", 1)]);
    w.settle();
    assert!(live(&w, &w1) <= 1, "w1 declared room for 1 container and holds {} made by placements", live(&w, &w1));
    assert_eq!(reservations(&w, &w1), 0);
    let placed = [first, second].into_iter().filter(|id| bound_to(placement(&w, *id)).is_some()).count();
    assert_eq!(placed, 1, "the room w1 still has goes to one of them");
}

/// Room held on a cordoned agent while the placement waits and no other agent fits: at the deadline the placement
/// fails and the room is given back.
#[test]
fn room_held_on_a_cordoned_agent_is_given_back_when_the_wait_ends_with_no_other_agent() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 2)]);
    let id = ResourceId::generate();
    w.send("producer", place(id, &[], Some(Millis::from_secs(50))));
    assert_eq!(send_due(&mut w, |c| matches!(c, Command::Reserve(_))), 1);
    w.send("op:alice", CordonAgent { agent: w1.clone(), reason: None });
    w.settle();
    assert!(matches!(placement(&w, id), PlacementState::Waiting { .. }), "{:?}", placement(&w, id));
    assert_eq!(reservations(&w, &w1), 1);
    w.advance(Millis::from_secs(51));
    w.settle();
    assert!(
        matches!(placement(&w, id), PlacementState::Failed { why, .. } if why.contains("1 agent cordoned")),
        "{:?}",
        placement(&w, id)
    );
    assert_eq!(reservations(&w, &w1), 0, "the room is given back");
    w.send("op:alice", UncordonAgent { agent: w1.clone() });
    w.settle();
    assert!(holders(&w, id).is_empty());
}

/// Room reserved on w1, which then goes (no heartbeat for a day) and comes back as a new incarnation: the room is
/// still held, and a placement still waiting binds it and is made there.
#[test]
fn room_reserved_on_an_agent_that_went_and_registered_again_is_still_held_and_bound() {
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 1)]);
    let id = ResourceId::generate();
    w.send("producer", place(id, &[], Some(Millis::from_hours(48))));
    assert_eq!(send_due(&mut w, |c| matches!(c, Command::Reserve(_))), 1);
    // The sweeper marks w1 stalled, then gone, before it carries the reservation back.
    w.advance(Millis::from_hours(25));
    while send_due(&mut w, |c| matches!(c, Command::MarkStalled(_) | Command::MarkGone(_))) > 0 {}
    assert_eq!(w.state_of(&w1).agent(&w1).unwrap().status(), "gone");
    w.settle();
    assert!(matches!(placement(&w, id), PlacementState::Waiting { .. }), "{:?}", placement(&w, id));
    assert_eq!(reservations(&w, &w1), 1, "room on a gone agent is kept while the placement waits");
    register_again(&mut w, &w1, &[], &[("container", 1)]);
    w.settle();
    assert_eq!(bound_to(placement(&w, id)), Some(&w1));
    assert_eq!(holders(&w, id), std::slice::from_ref(&w1));
    assert_eq!(live(&w, &w1), 1);
    assert_eq!(reservations(&w, &w1), 0);
    // Nothing is asked for it any more once closed.
    assert!(matches!(placement(&w, id), PlacementState::Bound { closed: true, .. }));
}

// --- a wider confused world: retire, register again, the horizon passing, cancels, heartbeats ---------------------

mod wide {
    use std::collections::BTreeSet;

    use leasehold_domain::state::PlacementState;
    use leasehold_schemas::command::{
        CancelPlacement, CordonAgent, Heartbeat, PlacementStrategy, Release, RetireAgent, SetPartitionSettings,
        UncordonAgent, UnretireAgent,
    };
    use leasehold_schemas::ids::{Key, Millis, Position};
    use leasehold_schemas::outcome::Effect;
    use leasehold_schemas::subjects::partition_of_key;
    use leasehold_schemas::{AgentName, ResourceId};
    use proptest::prelude::*;

    use super::support::{Confusion, PARTITIONS, World};
    use super::{bound_to, holders, place, register_again};

    #[derive(Debug, Clone)]
    enum Step {
        /// A producer asks for a placement (with or without a wait of 90 s).
        Place {
            pack: bool,
            wait: bool,
        },
        /// An operator cancels the `n`-th request (refused once placed).
        Cancel {
            n: usize,
        },
        /// A sweeper plans from the view `back` steps ago and sends what is due, shuffled, some twice.
        Sweep {
            back: usize,
            order: u64,
            twice: bool,
        },
        /// Requests some view planned long ago are sent again.
        Replay {
            pick: u64,
            n: usize,
        },
        /// An operator releases the `n`-th live resource, and its agent may confirm the destroy.
        Release {
            n: usize,
            confirm: bool,
        },
        Cordon {
            agent: usize,
            on: bool,
        },
        Retire {
            agent: usize,
            on: bool,
        },
        /// The agent registers again (a new incarnation, the same declaration).
        Register {
            agent: usize,
        },
        /// Every agent heartbeats (or registers again if it was declared gone).
        Heartbeat,
        /// Log time passes, up to more than twice the one-minute horizon.
        Tick {
            secs: u64,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (any::<bool>(), any::<bool>()).prop_map(|(pack, wait)| Step::Place { pack, wait }),
            1 => (0usize..8).prop_map(|n| Step::Cancel { n }),
            6 => (0usize..6, any::<u64>(), any::<bool>())
                .prop_map(|(back, order, twice)| Step::Sweep { back, order, twice }),
            2 => (any::<u64>(), 1usize..6).prop_map(|(pick, n)| Step::Replay { pick, n }),
            2 => (0usize..8, any::<bool>()).prop_map(|(n, confirm)| Step::Release { n, confirm }),
            1 => (0usize..4, any::<bool>()).prop_map(|(agent, on)| Step::Cordon { agent, on }),
            1 => (0usize..4, any::<bool>()).prop_map(|(agent, on)| Step::Retire { agent, on }),
            1 => (0usize..4).prop_map(|agent| Step::Register { agent }),
            2 => Just(Step::Heartbeat),
            2 => (1u64..150).prop_map(|secs| Step::Tick { secs }),
        ]
    }

    const CAPACITY: [u32; 4] = [2, 1, 2, 1];

    fn heartbeat_all(w: &mut World, agents: &[AgentName]) {
        for agent in agents {
            let record = w.state_of(agent).agent(agent).unwrap();
            if record.status() == "gone" {
                register_again(w, agent, &[("zone", "a")], &[("container", capacity_of(agents, agent))]);
            } else {
                let epoch = record.epoch;
                w.send(agent.as_str(), Heartbeat { agent: agent.clone(), epoch });
            }
        }
    }

    fn capacity_of(agents: &[AgentName], agent: &AgentName) -> u32 {
        CAPACITY[agents.iter().position(|a| a == agent).unwrap()]
    }

    /// Notes the reservations given back (ended without a commit) by the outcomes from `seen` on; returns where
    /// the outcomes end.
    fn note_given_back(w: &World, seen: usize, given_back: &mut BTreeSet<(AgentName, Position)>) -> usize {
        for outcome in &w.outcomes[seen..] {
            let Key::Agent(agent) = &outcome.command.key else { continue };
            for effect in outcome.effects() {
                if let Effect::ReservationEnded { token, committed: false, .. } = effect {
                    given_back.insert((agent.clone(), *token));
                }
            }
        }
        w.outcomes.len()
    }

    /// Bound reservations never given back; one holder per request, the one bound; no agent past its capacity.
    fn check(w: &World, agents: &[AgentName], ids: &BTreeSet<ResourceId>, cancelled: &BTreeSet<(AgentName, Position)>) {
        for agent in agents {
            let record = w.state_of(agent).agent(agent).unwrap();
            let capacity = capacity_of(agents, agent);
            assert!(record.used("container") <= capacity, "{agent} holds {} of {capacity}", record.used("container"));
            let live = super::live(w, agent) as u32;
            assert!(live <= capacity, "{agent} has {live} live resources, over {capacity}");
        }
        for id in ids {
            let made = holders(w, *id);
            assert!(made.len() <= 1, "request {id} made resources on {made:?}");
            let home = partition_of_key(&Key::Placement(*id), PARTITIONS);
            if let Some(placement) = w.states[&home].placement(*id) {
                if let Some(holder) = made.first() {
                    assert_eq!(bound_to(&placement.state), Some(holder), "{id} made where it did not bind");
                }
                if let PlacementState::Bound { agent, token, .. } = &placement.state {
                    assert!(
                        !cancelled.contains(&(agent.clone(), *token)),
                        "{id} bound to {agent} at {token}, whose room was given back"
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Four agents (two share a partition), a one-minute horizon everywhere, and everything above in any order;
        /// then an honest sweeper with the agents back: no request made twice or where it did not bind, no agent
        /// past its capacity, no bound room given back, nothing left seeking past its wait, no room left held, and
        /// every binding committed.
        #[test]
        fn a_wider_confused_world_keeps_placement_exactly_once(steps in proptest::collection::vec(step(), 1..100)) {
            let mut w = World::new();
            let agents = vec![
                w.register_declaring("w1", &[("zone", "a")], &[("container", CAPACITY[0])]),
                w.register_declaring("w5", &[("zone", "a")], &[("container", CAPACITY[1])]),
                w.register_declaring("w2", &[("zone", "a")], &[("container", CAPACITY[2])]),
                w.register_declaring("w3", &[("zone", "a")], &[("container", CAPACITY[3])]),
            ];
            for name in ["w2", "w1", "w4", "w3"] {
                let key = Key::Agent(AgentName::new(name).unwrap());
                let partition = partition_of_key(&key, PARTITIONS);
                w.send("op:alice", SetPartitionSettings {
                    key, partition, outcome_horizon: Some(Millis::from_mins(1)), policy: None,
                    if_no_policy: false, gc: None, max_priority: None,
                }).expect("the horizon is set");
            }
            let mut confused = Confusion::new(&w);
            let mut ids = BTreeSet::new();
            let mut order_of_ids = Vec::new();
            let mut seen = 0;
            let mut cancelled = BTreeSet::new();
            for step in steps {
                match step {
                    Step::Place { pack, wait } => {
                        let id = ResourceId::from_parts(w.now.0, {
                            let mut e = [0u8; 10];
                            e[2..].copy_from_slice(&(w.cmd_seq + 7_000_000).to_be_bytes());
                            e
                        });
                        let mut request = place(id, &[("zone", "a")], wait.then_some(Millis::from_secs(90)));
                        if pack {
                            request.strategy = PlacementStrategy::Pack;
                        }
                        w.send("producer", request);
                        ids.insert(id);
                        order_of_ids.push(id);
                    }
                    Step::Cancel { n } => {
                        if let Some(id) = order_of_ids.get(n % order_of_ids.len().max(1)) {
                            w.send("producer", CancelPlacement { resource: *id, reason: None });
                        }
                    }
                    Step::Sweep { back, order, twice } => confused.sweep(&mut w, back, order, twice),
                    Step::Replay { pick, n } => confused.replay(&mut w, pick, n),
                    Step::Release { n, confirm } => {
                        if let Some((agent, id)) = w.nth_resource(n, |r| !r.state.is_terminal()) {
                            w.send("producer", Release { agent: agent.clone(), resource: id, reason: None });
                            if confirm && w.state_of(&agent).agent(&agent).unwrap().status() != "gone" {
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
                    Step::Retire { agent, on } => {
                        let name = agents[agent].clone();
                        if on {
                            w.send("op:alice", RetireAgent::new(name));
                        } else {
                            w.send("op:alice", UnretireAgent { agent: name });
                        }
                    }
                    Step::Register { agent } => {
                        let name = agents[agent].clone();
                        register_again(&mut w, &name, &[("zone", "a")], &[("container", CAPACITY[agent])]);
                    }
                    Step::Heartbeat => heartbeat_all(&mut w, &agents),
                    Step::Tick { secs } => w.advance(Millis::from_secs(secs)),
                }
                seen = note_given_back(&w, seen, &mut cancelled);
                check(&w, &agents, &ids, &cancelled);
                confused.remember(&w);
            }
            // An honest sweeper, agents back and taking work, time past every wait.
            for agent in &agents {
                w.send("op:alice", UncordonAgent { agent: agent.clone() });
                w.send("op:alice", UnretireAgent { agent: agent.clone() });
            }
            heartbeat_all(&mut w, &agents);
            w.settle();
            for _ in 0..3 {
                w.advance(Millis::from_secs(50));
                heartbeat_all(&mut w, &agents);
                w.settle();
            }
            check(&w, &agents, &ids, &cancelled);
            for id in &ids {
                let home = partition_of_key(&Key::Placement(*id), PARTITIONS);
                let Some(placement) = w.states[&home].placement(*id) else { continue };
                prop_assert!(!placement.is_open(), "{id} still {:?} after its wait", placement.state);
                if let PlacementState::Bound { agent, closed, .. } = &placement.state {
                    prop_assert!(*closed, "{id} bound to {agent} and never closed");
                }
            }
            note_given_back(&w, seen, &mut cancelled);
            check(&w, &agents, &ids, &cancelled);
            for agent in &agents {
                let record = w.state_of(agent).agent(agent).unwrap();
                prop_assert!(record.reservations.is_empty(), "{agent} still holds room: {:?}", record.reservations);
            }
            // Placed means made, on the agent bound: the commit is on record (the resource may have ended since).
            let committed: BTreeSet<(AgentName, Position)> = w
                .outcomes
                .iter()
                .filter_map(|o| match &o.command.key { Key::Agent(a) => Some((a, o)), _ => None })
                .flat_map(|(a, o)| o.effects().iter().filter_map(move |e| match e {
                    Effect::ReservationEnded { token, committed: true, .. } => Some((a.clone(), *token)),
                    _ => None,
                }))
                .collect();
            for outcome in &w.outcomes {
                for effect in outcome.effects() {
                    if let Effect::PlacementBound { resource, agent, token, .. } = effect {
                        prop_assert!(
                            committed.contains(&(agent.clone(), *token)),
                            "{resource} was bound to {agent} at {token} and never committed"
                        );
                    }
                }
            }
        }
    }
}

/// An id whose record an agent's partition has forgotten (its horizon is shorter than the placement's) is not made a
/// second time there: the reservation is refused like an allocation of it, and the planner does not ask for it.
#[test]
fn an_id_forgotten_by_the_agents_partition_is_not_placed_there_a_second_time() {
    use leasehold_schemas::command::{Release, SetPartitionSettings};
    let mut w = World::new();
    let w1 = w.register_declaring("w1", &[], &[("container", 4)]);
    let home = partition_of_agent(&w1, PARTITIONS);
    let short = |w: &mut World| {
        let body = SetPartitionSettings {
            key: Key::Agent(w1.clone()),
            partition: home,
            outcome_horizon: Some(Millis::from_mins(1)),
            policy: None,
            if_no_policy: false,
            gc: None,
            max_priority: None,
        };
        w.send("op:alice", body).expect("decided in w1's partition");
    };
    short(&mut w);
    // X lives on w1 and ends; w1's partition forgets it a minute later. Its placement is decided in another
    // partition, which keeps a day (in w1's, the placement itself would be refused as too old).
    let id = std::iter::repeat_with(ResourceId::generate)
        .find(|id| partition_of_key(&Key::Placement(*id), PARTITIONS) != home)
        .expect("an id placed outside w1's partition");
    w.send("producer", Allocate::new(w1.clone(), id, "container", 1));
    w.send("producer", Release { agent: w1.clone(), resource: id, reason: None });
    w.destroyed(&w1, id);
    w.advance(Millis::from_mins(3));
    short(&mut w);
    assert!(w.state_of(&w1).resource(id).is_none(), "w1's partition forgot {id}");
    // A placement of the same id (its own partition keeps a day) is accepted, and refused by w1: nothing is made.
    w.send("producer", place(id, &[], None));
    w.settle();
    match placement(&w, id) {
        PlacementState::Failed { why, .. } => assert!(why.contains("cannot take resource id"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(holders(&w, id).is_empty(), "no second life of w1.{id}");
    let refused = w.send(
        "sweeper:confused",
        leasehold_schemas::command::Reserve {
            agent: w1.clone(),
            resource: id,
            kind: "container".to_owned(),
            select: BTreeMap::new(),
            source: leasehold_schemas::Source {
                partition: partition_of_key(&Key::Placement(id), PARTITIONS),
                position: leasehold_schemas::Position(1),
            },
        },
    );
    let message = refused.and_then(|o| o.rejection().map(|r| r.message.clone())).unwrap_or_default();
    assert!(message.contains("no later than what this partition has forgotten"), "{message}");
}
