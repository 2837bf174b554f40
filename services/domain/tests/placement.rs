//! Table tests: placement (DESIGN section 13), one rule per row, in a one-partition world where the placement and
//! the agents decide in the same partition (the multi-partition protocol, racing placers and a confused sweeper are
//! in the sweeper's `tests/placement.rs`).

mod support;

use Then::{Effects, Rejected};
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Millis, Position, Source};
use leasehold_schemas::outcome::Effect;
use support::*;

/// `w1` registered with `zone=a` and room for `n` containers.
fn declared(w: &mut World, n: u32) {
    let agent = w.a();
    w.obs.insert(agent.clone(), 0);
    accepted(&w.agent_says(Register {
        agent,
        incarnation: leasehold_schemas::Uuid::from_u128(7),
        wiped: false,
        settings: None,
        labels: [("zone".to_owned(), "a".to_owned())].into(),
        capacity: [("container".to_owned(), n)].into(),
    }));
}

fn request(w: &World, wait: Option<Millis>) -> Place {
    Place {
        resource: w.r(),
        kind: "container".to_owned(),
        capacity: 1,
        attributes: Default::default(),
        parent: None,
        pools: Vec::new(),
        wait,
        select: [("zone".to_owned(), "a".to_owned())].into(),
        strategy: PlacementStrategy::Spread,
    }
}

/// A fresh placement asked for; returns its `placement-wanted` as a source.
fn asked(w: &mut World, wait: Option<Millis>) -> Source {
    w.last_resource = Some(w.d.new_resource_id());
    let outcome = w.op(request(w, wait));
    accepted(&outcome);
    Source { partition: 0, position: first_position(&outcome) }
}

/// The last placement's `placement-wanted`, as a source.
fn wanted(w: &World) -> Source {
    Source { partition: 0, position: w.state().placement(w.r()).expect("the placement").wanted_at }
}

fn first_position(outcome: &leasehold_schemas::Outcome) -> Position {
    outcome.positioned_effects().next().expect("an effect").0
}

fn reserve(w: &World, source: Source) -> Reserve {
    Reserve {
        agent: w.a(),
        resource: w.r(),
        kind: "container".to_owned(),
        select: [("zone".to_owned(), "a".to_owned())].into(),
        source,
    }
}

/// Room reserved for the last placement; returns the reservation's token.
fn reserved(w: &mut World) -> Position {
    let source = asked(w, None);
    let outcome = w.sys(reserve(w, source));
    accepted(&outcome);
    first_position(&outcome)
}

fn bind(w: &World, token: Position) -> BindPlacement {
    BindPlacement {
        resource: w.r(),
        agent: w.a(),
        token,
        used: 1,
        capacity: 2,
        source: Source { partition: 0, position: token },
    }
}

fn commit(w: &World, token: Position) -> CommitPlacement {
    CommitPlacement {
        allocation: request(w, None).allocation_on(w.a()),
        token,
        source: Source { partition: 0, position: Position(1) },
        principal: None,
    }
}

/// The close of the last placement, bound to the reservation it holds or held, from a view at the log's end.
fn close(w: &World) -> ClosePlacement {
    let token = match &w.state().placement(w.r()).expect("the placement").state {
        leasehold_domain::state::PlacementState::Bound { token, .. } => *token,
        _ => w.state().agent(&w.a()).unwrap().reservations[&w.r()].token,
    };
    ClosePlacement {
        resource: w.r(),
        agent: w.a(),
        token,
        source: Source { partition: 0, position: w.state().last_position() },
    }
}

#[test]
fn placement_rows() {
    check(vec![
        case(
            "a placement is recorded, seeking an agent",
            |w| declared(w, 2),
            |w| {
                w.last_resource = Some(w.d.new_resource_id());
                w.op(request(w, None))
            },
            Effects(&["placement-wanted"]),
        ),
        case(
            "the same request sent again is answered with its state, not decided again",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| w.op(request(w, None)),
            Rejected(AlreadyDone, &["was already asked for: seeking an agent"]),
        ),
        case(
            "another request under the same id is refused",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| {
                let mut other = request(w, None);
                other.kind = "volume".to_owned();
                w.op(other)
            },
            Rejected(AlreadyExists, &["a different placement of resource"]),
        ),
        case(
            "an agent with the labels and room reserves it, counted against its capacity",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| w.sys(reserve(w, wanted(w))),
            Effects(&["capacity-reserved"]),
        ),
        case(
            "a full agent reserves nothing: reservations count as resources",
            |w| {
                declared(w, 1);
                reserved(w);
                asked(w, None);
            },
            |w| w.sys(reserve(w, wanted(w))),
            Rejected(InvalidState, &["agent w1 is full for container: 1 of 1"]),
        ),
        case(
            "an agent without the labels reserves nothing",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| {
                let mut body = reserve(w, wanted(w));
                body.select = [("zone".to_owned(), "b".to_owned())].into();
                w.sys(body)
            },
            Rejected(InvalidState, &["agent w1 does not carry \"zone\"=\"b\""]),
        ),
        case(
            "a cordoned agent reserves nothing",
            |w| {
                declared(w, 2);
                accepted(&w.op(CordonAgent { agent: w.a(), reason: Some("kernel".into()) }));
                asked(w, None);
            },
            |w| w.sys(reserve(w, wanted(w))),
            Rejected(InvalidState, &["agent w1 is cordoned (by", "no new placements on it"]),
        ),
        case(
            "a kind the agent did not declare is not placed there",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| {
                let mut body = reserve(w, wanted(w));
                body.kind = "volume".to_owned();
                w.sys(body)
            },
            Rejected(InvalidState, &["agent w1 takes no \"volume\" (it declared no capacity for it)"]),
        ),
        case(
            "an id recorded absent here (a child's adoption asked for it) is not placed here, saying so",
            |w| {
                declared(w, 2);
                asked(w, None);
                let child = leasehold_schemas::ids::ResourceRef::new(w.a(), w.d.new_resource_id());
                let parent = leasehold_schemas::ids::ResourceRef::new(w.a(), w.r());
                let source = Source { partition: 0, position: Position(1) };
                accepted(&w.sys(Adopt { parent, child, source }));
            },
            |w| w.sys(reserve(w, wanted(w))),
            Rejected(AlreadyExists, &["was recorded here as never allocated", "takes no placement of it"]),
        ),
        case(
            "a child's adoption of a parent whose placement holds room here waits until the room is committed",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| {
                let child = leasehold_schemas::ids::ResourceRef::new(w.a(), w.d.new_resource_id());
                let parent = leasehold_schemas::ids::ResourceRef::new(w.a(), w.r());
                w.sys(Adopt { parent, child, source: Source { partition: 0, position: Position(1) } })
            },
            Rejected(NotYetDue, &["is not made yet: agent w1 holds room for its placement"]),
        ),
        case(
            "a reservation from outside the placement's partition is refused",
            |w| declared(w, 2),
            |w| {
                w.last_resource = Some(w.d.new_resource_id());
                w.sys(reserve(w, Source { partition: 3, position: Position(9) }))
            },
            Rejected(Invalid, &["a reservation cannot come from"]),
        ),
        case(
            "the placement binds the first reservation it hears of",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(bind(w, token))
            },
            Effects(&["placement-bound"]),
        ),
        case(
            "and no other",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
            },
            |w| w.sys(bind(w, Position(999))),
            Rejected(InvalidState, &["placed on w1", "is not bound"]),
        ),
        case(
            "a commit of the bound reservation makes the resource, once",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(commit(w, token))
            },
            Effects(&["reservation-ended", "resource-allocated", "create-ordered"]),
        ),
        case(
            "a commit on an agent retired since it bound the room makes the resource and releases it at once",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
                accepted(&w.op(RetireAgent::new(w.a())));
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(commit(w, token))
            },
            Effects(&["reservation-ended", "resource-allocated", "resource-releasing"]),
        ),
        case(
            "once the commit is on record, the placement is closed: forgotten a horizon later, not before",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
                accepted(&w.sys(commit(w, token)));
            },
            |w| w.sys(close(w)),
            Effects(&["placement-closed"]),
        ),
        case(
            "closed twice: already done",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
                accepted(&w.sys(commit(w, token)));
                accepted(&w.sys(close(w)));
            },
            |w| w.sys(close(w)),
            Rejected(AlreadyDone, &["already closed"]),
        ),
        case(
            "a close from a view not past the reservation is refused",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
            },
            |w| {
                let mut body = close(w);
                body.source.position = body.token;
                w.sys(body)
            },
            Rejected(Invalid, &["is not past it"]),
        ),
        case(
            "a close of a reservation the placement did not bind is refused",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| {
                let mut body = close(w);
                body.source.position = Position(body.token.0 + 1);
                w.sys(body)
            },
            Rejected(InvalidState, &["seeking an agent", "is not the one it bound"]),
        ),
        case(
            "a commit with another token makes nothing",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| w.sys(commit(w, Position(999))),
            Rejected(TokenMismatch, &["holds room for"]),
        ),
        case(
            "a reservation the placement did not bind is given back",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                let source = Source { partition: 0, position: w.state().last_position() };
                w.sys(CancelReservation { agent: w.a(), resource: w.r(), token, source })
            },
            Effects(&["reservation-ended"]),
        ),
        case(
            "a capacity declared below what the agent holds is accepted, and nothing more lands until use is below",
            |w| {
                declared(w, 2);
                for _ in 0..2 {
                    let id = w.d.new_resource_id();
                    accepted(&w.op(allocation(&w.a(), id)));
                }
                declared(w, 1);
            },
            |w| {
                let id = w.d.new_resource_id();
                w.op(allocation(&w.a(), id))
            },
            Rejected(InvalidState, &["agent w1 is full for container: 2 of 1"]),
        ),
        case(
            "an allocation of an id held for a placement is refused",
            |w| {
                declared(w, 2);
                reserved(w);
            },
            |w| w.op(allocation(&w.a(), w.r())),
            Rejected(AlreadyExists, &["is reserved on agent w1 for its placement"]),
        ),
        case(
            "nothing fits and the request may not wait: it is refused, with why",
            |w| {
                declared(w, 2);
                asked(w, None);
            },
            |w| w.sys(Unplaceable { resource: w.r(), why: "zone=a: 1 agent full".into() }),
            Effects(&["placement-failed"]),
        ),
        case(
            "nothing fits and the request may wait: it waits, on record",
            |w| {
                declared(w, 2);
                asked(w, Some(Millis::from_mins(5)));
            },
            |w| w.sys(Unplaceable { resource: w.r(), why: "zone=a: 1 agent full".into() }),
            Effects(&["placement-waiting"]),
        ),
        case(
            "the same reason again changes nothing",
            |w| {
                declared(w, 2);
                asked(w, Some(Millis::from_mins(5)));
                accepted(&w.sys(Unplaceable { resource: w.r(), why: "zone=a: 1 agent full".into() }));
            },
            |w| w.sys(Unplaceable { resource: w.r(), why: "zone=a: 1 agent full".into() }),
            Rejected(NothingToDo, &["already waits"]),
        ),
        case(
            "past its wait it is refused, saying how long it waited",
            |w| {
                declared(w, 2);
                asked(w, Some(Millis::from_secs(30)));
                w.advance(Millis::from_secs(30));
            },
            |w| w.sys(Unplaceable { resource: w.r(), why: "zone=a: 1 agent full".into() }),
            Effects(&["placement-failed"]),
        ),
        case(
            "a waiting request is cancelled by its producer",
            |w| {
                declared(w, 2);
                asked(w, Some(Millis::from_mins(5)));
            },
            |w| w.op(CancelPlacement { resource: w.r(), reason: None }),
            Effects(&["placement-cancelled"]),
        ),
        case(
            "a placed one is not cancelled: its resource is released instead",
            |w| {
                declared(w, 2);
                let token = reserved(w);
                accepted(&w.sys(bind(w, token)));
            },
            |w| w.op(CancelPlacement { resource: w.r(), reason: None }),
            Rejected(InvalidState, &["already placed on w1", "release w1."]),
        ),
    ]);
}

/// The whole round in one partition: the resource made counts once (its reservation ends as it is made), and ends
/// as any resource does, giving its place back.
#[test]
fn a_committed_reservation_becomes_the_resource_and_its_place_is_counted_once() {
    let mut w = World::new();
    declared(&mut w, 1);
    let token = reserved(&mut w);
    assert_eq!(w.state().agent(&w.a()).unwrap().used("container"), 1);
    accepted(&w.sys(bind(&w, token)));
    let made = w.sys(commit(&w, token));
    assert!(accepted(&made).iter().any(|e| matches!(e, Effect::ResourceAllocated { .. })));
    let agent = w.state().agent(&w.a()).unwrap();
    assert!(agent.reservations.is_empty());
    assert_eq!(agent.used("container"), 1, "the resource replaced its reservation");
    refused(&mut w, |w| w.sys(commit(w, token)), AlreadyDone, &["was already made by its placement"]);
    settle(&w);
}

/// A placement asked for by `ci:team-a` under a quota of `containers`, reserved and bound; returns the token.
fn bound_for_team(w: &mut World, containers: u32) -> Position {
    declared(w, 2);
    let team = leasehold_schemas::Issuer::new("ci:team-a").unwrap();
    accepted(&w.op(SetQuota {
        key: leasehold_schemas::subjects::settings_key(0, 1),
        partition: 0,
        quota: leasehold_schemas::ids::QuotaName::new("team-a").unwrap(),
        max: [("container".to_owned(), containers)].into(),
        principals: vec![team.clone()],
    }));
    w.last_resource = Some(w.d.new_resource_id());
    let outcome = w.d.submit(team.as_str(), request(w, None));
    assert_eq!(w.state().placement(w.r()).expect("the placement").issuer, team, "the placement keeps who asked");
    let source = Source { partition: 0, position: first_position(&outcome) };
    let outcome = w.sys(reserve(w, source));
    let token = first_position(&outcome);
    accepted(&w.sys(bind(w, token)));
    token
}

#[test]
fn a_commit_charges_the_placement_s_principal_to_its_quota() {
    fn team() -> Option<leasehold_schemas::Issuer> {
        Some(leasehold_schemas::Issuer::new("ci:team-a").unwrap())
    }
    check(vec![
        case(
            "naming its principal: a slot of the quota is claimed before the create",
            |w| {
                bound_for_team(w, 2);
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(CommitPlacement { principal: team(), ..commit(w, token) })
            },
            Effects(&["reservation-ended", "resource-allocated", "claim-wanted"]),
        ),
        case(
            "a quota of 0: made, as the placement said, and released at once over quota",
            |w| {
                bound_for_team(w, 0);
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(CommitPlacement { principal: team(), ..commit(w, token) })
            },
            Effects(&["reservation-ended", "resource-allocated", "resource-releasing"]),
        ),
        case(
            "naming no principal where quotas are recorded (planned from a view before them): refused, asked again",
            |w| {
                bound_for_team(w, 2);
            },
            |w| {
                let token = w.state().agent(&w.a()).unwrap().reservations[&w.r()].token;
                w.sys(commit(w, token))
            },
            Rejected(InvalidState, &["a commit names its placement's issuer"]),
        ),
    ]);
}
