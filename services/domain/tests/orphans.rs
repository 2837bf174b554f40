//! Table tests: pools that hold an orphan's identifiers (issue 19, item 3). The policy is the pool's
//! (`op.define-pool`/`op.update-pool` `orphans`), carried to the holder with its grant (`sys.bind-claim` `orphans`);
//! the holder's partition keeps an orphan's claim (`claim-held-for-orphan`) until its agent comes back and confirms
//! the destroy of its handle, or an operator frees it (`op.free-orphan`); the cause travels with the free.

mod support;

use Then::{Effects, Rejected};
use leasehold_domain::state::ClaimSlot;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Millis, Position, ResourceRef, Source};
use leasehold_schemas::outcome::{Effect, FreeCause, GarbageCause};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind, PoolValue};
use leasehold_schemas::{Issuer, Outcome};
use support::*;

/// Past `orphan_after` (24 h) and a third of `stall_after`: a silent agent may be declared gone.
const GONE_AFTER: Millis = Millis::from_hours(25);
const REASON: &str = "machine scrapped";

fn define(w: &mut World, orphans: OrphanPolicy) -> Outcome {
    w.op(DefinePool { pool: pool_name("ips"), kind: PoolKind::Slots { count: 4 }, cooldown: Some(secs(30)), orphans })
}

fn update(w: &mut World, orphans: Option<OrphanPolicy>) -> Outcome {
    w.op(UpdatePool { pool: pool_name("ips"), kind: PoolKind::Slots { count: 4 }, cooldown: None, orphans })
}

/// The grant of `w.r()`'s claim on `ips`, carried with the pool's policy as the sweeper carries it.
fn grant(w: &mut World) -> BindClaim {
    let (holder, wanted) = (w.rref(), w.wanted_by("ips"));
    let mut bind = w.granted_claim(&pool_name("ips"), &holder, wanted);
    bind.orphans = w.state().pool(&pool_name("ips")).expect("defined").orphans;
    bind
}

/// A registered agent, the pool `ips` with `orphans`, and `w.r()` active holding one of its slots.
fn holding(w: &mut World, orphans: OrphanPolicy) {
    w.registered();
    accepted(&define(w, orphans));
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let bind = grant(w);
    accepted(&w.sys(bind));
    w.created();
}

fn mark_gone(w: &mut World) -> Outcome {
    let agent = w.a();
    w.sys(MarkGone { agent })
}

/// `holding`, then its agent declared gone: `w.r()` orphaned.
fn orphaned(w: &mut World, orphans: OrphanPolicy) {
    holding(w, orphans);
    w.advance(GONE_AFTER);
    accepted(&mark_gone(w));
    assert_eq!(state_name(w, w.r()), "orphaned");
}

fn free_orphan(w: &mut World, pool: Option<&str>, reason: &str) -> Outcome {
    let (agent, resource) = (w.a(), w.r());
    w.op(FreeOrphan { agent, resource, pool: pool.map(pool_name), reason: reason.to_owned() })
}

/// The agent registers again and reports the orphan's handle as garbage: the destroy is ordered (its position).
fn back_with_garbage(w: &mut World) -> Position {
    let (agent, id) = (w.a(), w.r());
    accepted(&w.register_with(&agent, None, false));
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    let watermark = w.state().last_position();
    let outcome = w.agent_says(GarbageReport { agent, epoch, obs, watermark, handles: vec![id], dry_run: false });
    outcome
        .positioned_effects()
        .find_map(|(p, e)| {
            matches!(e, Effect::GarbageDestroyOrdered { cause: GarbageCause::Orphaned {}, .. }).then_some(p)
        })
        .expect("the orphan's handle ordered destroyed")
}

fn destroyed(w: &mut World, ordered: Position) -> Outcome {
    let (agent, resource) = (w.a(), w.r());
    let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
    w.agent_says(ReportDestroyed { agent, epoch, obs, resource, ordered })
}

fn slot(w: &World) -> ClaimSlot {
    w.state().resource(w.r()).expect("kept").claims.get(&pool_name("ips")).expect("claimed").clone()
}

/// The pool's side: a free of `holder`'s claim with `token`, carrying `cause`.
fn pool_free(w: &mut World, holder: ResourceRef, token: Position, cause: FreeCause) -> Outcome {
    let source = Source { partition: 0, position: w.state().last_position() };
    w.sys(Free { pool: pool_name("ips"), holder, token: Some(token), source, cause })
}

fn held_token(w: &World) -> Position {
    match slot(w) {
        ClaimSlot::HeldForOrphan { token, .. } | ClaimSlot::Bound { token, .. } => token,
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn the_policy_is_the_pools() {
    check(vec![
        case(
            "hold is recorded",
            |_| {},
            |w| define(w, OrphanPolicy::Hold),
            Effects(&["pool-defined", "pool-orphan-policy"]),
        ),
        case(
            "release, the default, says nothing more",
            |_| {},
            |w| define(w, OrphanPolicy::Release),
            Effects(&["pool-defined"]),
        ),
        case(
            "the same definition again",
            |w| {
                accepted(&define(w, OrphanPolicy::Hold));
            },
            |w| define(w, OrphanPolicy::Hold),
            Rejected(AlreadyDone, &["pool ips is already defined so"]),
        ),
        case(
            "another policy is another definition",
            |w| {
                accepted(&define(w, OrphanPolicy::Hold));
            },
            |w| define(w, OrphanPolicy::Release),
            Rejected(AlreadyExists, &["already defined differently", "pool update"]),
        ),
        case(
            "an update changes the policy alone",
            |w| {
                accepted(&define(w, OrphanPolicy::Release));
            },
            |w| update(w, Some(OrphanPolicy::Hold)),
            Effects(&["pool-orphan-policy"]),
        ),
        case(
            "an update that keeps the policy (null) and the rest",
            |w| {
                accepted(&define(w, OrphanPolicy::Hold));
            },
            |w| update(w, None),
            Rejected(AlreadyDone, &["already defined so"]),
        ),
        case(
            "an update to the policy it has",
            |w| {
                accepted(&define(w, OrphanPolicy::Hold));
            },
            |w| update(w, Some(OrphanPolicy::Hold)),
            Rejected(AlreadyDone, &["already defined so"]),
        ),
    ]);
}

#[test]
fn the_grant_carries_the_policy_to_the_holder() {
    check(vec![
        case(
            "a grant of a holding pool",
            |w| {
                w.registered();
                accepted(&define(w, OrphanPolicy::Hold));
                w.pending_with(|c| c.pools = vec![pool_name("ips")]);
            },
            |w| {
                let bind = grant(w);
                w.sys(bind)
            },
            Effects(&["claim-bound", "claim-orphan-policy", "create-ordered"]),
        ),
        case(
            "a grant of a releasing pool",
            |w| {
                w.registered();
                accepted(&define(w, OrphanPolicy::Release));
                w.pending_with(|c| c.pools = vec![pool_name("ips")]);
            },
            |w| {
                let bind = grant(w);
                w.sys(bind)
            },
            Effects(&["claim-bound", "create-ordered"]),
        ),
    ]);
}

#[test]
fn orphaning_keeps_what_a_holding_pool_granted() {
    check(vec![
        case(
            "hold: the claim stays with the orphan",
            |w| {
                holding(w, OrphanPolicy::Hold);
                w.advance(GONE_AFTER);
            },
            mark_gone,
            Effects(&["agent-gone", "resource-orphaned", "claim-held-for-orphan"]),
        ),
        case(
            "release (the default): the claim goes back, as before",
            |w| {
                holding(w, OrphanPolicy::Release);
                w.advance(GONE_AFTER);
            },
            mark_gone,
            Effects(&["agent-gone", "resource-orphaned", "claim-releasable"]),
        ),
        case(
            "hold, but never bound: nothing to keep, the wait is withdrawn",
            |w| {
                w.registered();
                accepted(&define(w, OrphanPolicy::Hold));
                w.pending_with(|c| c.pools = vec![pool_name("ips")]);
                w.advance(GONE_AFTER);
            },
            mark_gone,
            Effects(&["agent-gone", "resource-orphaned", "claim-releasable"]),
        ),
        case(
            "the held grant carried again is not sent back",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| {
                let token = held_token(w);
                let bind = BindClaim {
                    holder: w.rref(),
                    pool: pool_name("ips"),
                    value: PoolValue::Slot(0),
                    token,
                    source: Source { partition: 0, position: token },
                    wanted: Source { partition: 0, position: Position(1) },
                    definition: None,
                    orphans: OrphanPolicy::Hold,
                };
                w.sys(bind)
            },
            Rejected(AlreadyDone, &["holds slot 0 of pool ips", "until its agent confirms the destroy"]),
        ),
    ]);
}

#[test]
fn a_held_claim_goes_back_when_the_agent_confirms_or_an_operator_frees_it() {
    check(vec![
        case(
            "the agent is back and destroyed the orphan's handle",
            |w| {
                orphaned(w, OrphanPolicy::Hold);
                let ordered = back_with_garbage(w);
                w.last_token = Some(ordered);
            },
            |w| {
                let ordered = w.token();
                destroyed(w, ordered)
            },
            Effects(&["observation-accepted", "garbage-destroyed", "claim-releasable", "claim-release-cause"]),
        ),
        case(
            "a destroy ordered is not yet a destroy: the claim is still held",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| {
                let (agent, id) = (w.a(), w.r());
                accepted(&w.register_with(&agent, None, false));
                let (epoch, obs) = (w.epoch(&agent), w.next_obs(&agent));
                let watermark = w.state().last_position();
                w.agent_says(GarbageReport { agent, epoch, obs, watermark, handles: vec![id], dry_run: false })
            },
            Effects(&["observation-accepted", "garbage-destroy-ordered"]),
        ),
        case(
            "an operator frees it, on record",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| free_orphan(w, Some("ips"), REASON),
            Effects(&["claim-releasable", "claim-release-cause"]),
        ),
        case(
            "an operator frees every pool's",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| free_orphan(w, None, REASON),
            Effects(&["claim-releasable", "claim-release-cause"]),
        ),
        case(
            "without a reason",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| free_orphan(w, None, "  "),
            Rejected(Invalid, &["needs a reason"]),
        ),
        case(
            "twice",
            |w| {
                orphaned(w, OrphanPolicy::Hold);
                accepted(&free_orphan(w, None, REASON));
            },
            |w| free_orphan(w, None, REASON),
            Rejected(AlreadyDone, &["holds no identifier", "went back already"]),
        ),
        case(
            "an orphan of a releasing pool holds nothing",
            |w| orphaned(w, OrphanPolicy::Release),
            |w| free_orphan(w, Some("ips"), REASON),
            Rejected(AlreadyDone, &["holds no identifier of pool ips"]),
        ),
        case(
            "a pool it never claimed from",
            |w| orphaned(w, OrphanPolicy::Hold),
            |w| free_orphan(w, Some("ports"), REASON),
            Rejected(Unknown, &["never claimed from pool ports"]),
        ),
        case(
            "a live resource is released, not freed so",
            |w| holding(w, OrphanPolicy::Hold),
            |w| free_orphan(w, None, REASON),
            Rejected(InvalidState, &["is active, not orphaned", "release"]),
        ),
    ]);
}

#[test]
fn the_cause_travels_to_the_pools_record() {
    let issuer = || Issuer::new("op:alice").unwrap();
    let cases: Vec<(&'static str, FreeCause, &'static [&'static str])> = vec![
        ("released: as before", FreeCause::Released {}, &["claim-freed"]),
        ("orphaned", FreeCause::Orphaned {}, &["claim-freed", "claim-freed-because"]),
        (
            "orphan destroyed",
            FreeCause::OrphanDestroyed { at: leasehold_schemas::Timestamp(5) },
            &["claim-freed", "claim-freed-because"],
        ),
        (
            "orphan freed",
            FreeCause::OrphanFreed { by: issuer(), reason: REASON.into() },
            &["claim-freed", "claim-freed-because"],
        ),
    ];
    let rows = cases
        .into_iter()
        .map(|(name, cause, effects)| {
            case(
                name,
                |w| holding(w, OrphanPolicy::Hold),
                move |w| {
                    let (holder, token) = (w.rref(), held_token(w));
                    let outcome = pool_free(w, holder, token, cause.clone());
                    if let Some(Effect::ClaimFreedBecause { cause: recorded, .. }) = outcome.effects().get(1) {
                        assert_eq!(*recorded, cause);
                    }
                    outcome
                },
                Effects(effects),
            )
        })
        .collect();
    check(rows);
}

/// The holder's record says why: a free carries the cause its partition recorded.
#[test]
fn the_holders_slot_records_the_cause() {
    let mut w = World::new();
    orphaned(&mut w, OrphanPolicy::Release);
    assert!(matches!(slot(&w), ClaimSlot::Returned { cause: FreeCause::Orphaned {}, .. }));

    let mut w = World::new();
    orphaned(&mut w, OrphanPolicy::Hold);
    assert!(matches!(slot(&w), ClaimSlot::HeldForOrphan { value: PoolValue::Slot(0), .. }));
    accepted(&free_orphan(&mut w, Some("ips"), REASON));
    match slot(&w) {
        ClaimSlot::Returned { cause: FreeCause::OrphanFreed { by, reason }, token: Some(_) } => {
            assert_eq!((by.as_str(), reason.as_str()), (OP, REASON));
        }
        other => panic!("{other:?}"),
    }

    let mut w = World::new();
    orphaned(&mut w, OrphanPolicy::Hold);
    let ordered = back_with_garbage(&mut w);
    let outcome = destroyed(&mut w, ordered);
    accepted(&outcome);
    match slot(&w) {
        ClaimSlot::Returned { cause: FreeCause::OrphanDestroyed { at }, .. } => assert_eq!(at, outcome.decided_at),
        other => panic!("{other:?}"),
    }
    settle(&w);
}

/// An orphan that holds is kept past the outcome horizon (forgotten, its grant would look unknown and be sent back,
/// freeing what it holds); once it lets go, it is forgotten a horizon later.
#[test]
fn a_holding_orphan_outlives_the_horizon_until_it_lets_go() {
    let mut w = World::new();
    orphaned(&mut w, OrphanPolicy::Hold);
    let id = w.r();
    for day in 0..3 {
        w.advance(Millis::from_hours(24));
        accepted(&w.define_slots(&format!("day{day}"), 1, secs(1)));
    }
    assert!(w.state().resource(id).is_some(), "a holding orphan is kept");
    settle(&w);
    accepted(&free_orphan(&mut w, None, REASON));
    w.advance(Millis::from_hours(25));
    accepted(&w.define_slots("last", 1, secs(1)));
    assert!(w.state().resource(id).is_none(), "forgotten a horizon after it let go");
    settle(&w);
}

// --- red team (issue 19 item 3) -----------------------------------------------------------------------------------

/// An orphan let go just before the horizon that counts from its orphaning: it must still be kept a horizon after it
/// let go (the README: "forgotten a horizon after it lets go"), so the sweeper can carry the free with its cause.
/// Forgotten right away, its returned grant looks unknown: the grant is sent back and freed as `released`, and the
/// pool records no cause.
#[test]
fn an_orphan_let_go_near_the_horizon_is_kept_a_horizon_after_it_let_go() {
    let mut w = World::new();
    orphaned(&mut w, OrphanPolicy::Hold);
    let id = w.r();
    w.advance(Millis(Millis::from_hours(24).0 - 1_000));
    accepted(&free_orphan(&mut w, None, REASON));
    w.advance(secs(2));
    accepted(&w.define_slots("later", 1, secs(1)));
    assert!(w.state().resource(id).is_some(), "forgotten two seconds after it let go, not a horizon after");
    match slot(&w) {
        ClaimSlot::Returned { cause: FreeCause::OrphanFreed { by, reason }, .. } => {
            assert_eq!((by.as_str(), reason.as_str()), ("op:alice", REASON));
        }
        other => panic!("the cause is kept for the sweeper to carry: {other:?}"),
    }
    settle(&w);
    w.advance(Millis::from_hours(25));
    accepted(&w.define_slots("last", 1, secs(1)));
    assert!(w.state().resource(id).is_none(), "forgotten a horizon after it let go");
    settle(&w);
}

/// A resource released (destroy ordered) whose agent is declared gone before it confirms the destroy: the orphan
/// holds its identifier. The agent comes back and confirms the destroy it was ordered (it destroyed the handle while
/// cut off, so it will never report the handle as garbage): that is its agent confirming the destroy, and what the
/// orphan held goes back with that cause. Refused as "already orphaned", the identifier stays held until an
/// operator frees it.
#[test]
fn a_releasing_orphans_confirmed_destroy_lets_go_of_what_it_holds() {
    let mut w = World::new();
    holding(&mut w, OrphanPolicy::Hold);
    let released = w.release();
    let ordered = released
        .positioned_effects()
        .find_map(|(p, e)| matches!(e, Effect::ResourceReleasing { .. }).then_some(p))
        .expect("destroy ordered");
    w.advance(GONE_AFTER);
    accepted(&mark_gone(&mut w));
    assert_eq!(state_name(&w, w.r()), "orphaned");
    assert!(matches!(slot(&w), ClaimSlot::HeldForOrphan { .. }), "{:?}", slot(&w));
    let agent = w.a();
    accepted(&w.register_with(&agent, None, false));
    let confirmed = destroyed(&mut w, ordered);
    accepted(&confirmed);
    match slot(&w) {
        ClaimSlot::Returned { cause: FreeCause::OrphanDestroyed { .. }, .. } => {}
        other => panic!("the agent confirmed the destroy: the identifier goes back, saying so: {other:?}"),
    }
    settle(&w);
}
