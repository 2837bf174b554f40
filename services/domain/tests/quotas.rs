//! Table tests: quotas per principal (issue 19, item 2). A quota is recorded in each partition (`op.set-quota`); an
//! allocation by one of its principals, of a kind it limits, claims a slot of the quota's counting pool
//! (`quota-<name>-<kind>`) besides its own pools. Over the quota, one with a `wait` waits in the pool's queue, one
//! without is released on `sys.over-quota`; a maximum of 0 refuses at once. (The pool's side, one grant per slot, is
//! the pools' own protocol: see pools.rs, and services/sweeper/tests/quotas.rs for several partitions.)

mod support;

use Then::{Effects, Rejected};
use leasehold_domain::state::ClaimSlot;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Position, QuotaName, ResourceRef, Source};
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::subjects::settings_key;
use leasehold_schemas::{Issuer, Outcome};
use support::*;

const TEAM: &str = "ci:team-a";

fn quota() -> QuotaName {
    QuotaName::new("team-a").unwrap()
}

fn issuer(text: &str) -> Issuer {
    Issuer::new(text).unwrap()
}

fn set(max: &[(&str, u32)], principals: &[&str]) -> SetQuota {
    SetQuota {
        key: settings_key(0, 1),
        partition: 0,
        quota: quota(),
        max: max.iter().map(|(kind, n)| ((*kind).to_owned(), *n)).collect(),
        principals: principals.iter().map(|p| issuer(p)).collect(),
    }
}

fn team_quota(w: &mut World, containers: u32) {
    accepted(&w.op(set(&[("container", containers)], &[TEAM])));
}

/// An allocation of a container on `w1` sent by `who`; it becomes `w.r()`.
fn allocate_as(w: &mut World, who: &str, edit: impl FnOnce(&mut Allocate)) -> Outcome {
    let agent = w.a();
    let mut command = w.allocate_cmd(&agent);
    edit(&mut command);
    w.last_resource = Some(command.resource);
    w.d.submit(who, command)
}

fn slot_pool() -> leasehold_schemas::ids::PoolName {
    quota_pool(&quota(), "container").unwrap()
}

fn over_quota_of(w: &World) -> OverQuota {
    OverQuota {
        holder: w.rref(),
        pool: slot_pool(),
        source: Source { partition: 0, position: Position(7) },
        held: 2,
        holders: vec![ResourceRef::new(agent_name("w2"), w.r())],
    }
}

#[test]
fn setting_a_quota() {
    check(vec![
        case("a quota is recorded", |_| {}, |w| w.op(set(&[("container", 2)], &[TEAM])), Effects(&["quota-set"])),
        case(
            "the same again changes nothing",
            |w| team_quota(w, 2),
            |w| w.op(set(&[("container", 2)], &[TEAM])),
            Rejected(AlreadyDone, &["already set so"]),
        ),
        case(
            "changed: recorded again",
            |w| team_quota(w, 2),
            |w| w.op(set(&[("container", 3), ("volume", 9)], &[TEAM])),
            Effects(&["quota-set"]),
        ),
        case("both lists empty remove it", |w| team_quota(w, 2), |w| w.op(set(&[], &[])), Effects(&["quota-removed"])),
        case("removing one not recorded", |_| {}, |w| w.op(set(&[], &[])), Rejected(AlreadyDone, &["no quota team-a"])),
        case(
            "no principal",
            |_| {},
            |w| w.op(set(&[("container", 2)], &[])),
            Rejected(Invalid, &["names no principal"]),
        ),
        case("no kind", |_| {}, |w| w.op(set(&[], &[TEAM])), Rejected(Invalid, &["limits no kind"])),
        case(
            "a kind with a dot has no pool name",
            |_| {},
            |w| w.op(set(&[("vm.large", 2)], &[TEAM])),
            Rejected(Invalid, &["cannot count kind \"vm.large\"", "no dot"]),
        ),
        case(
            "a principal named twice",
            |_| {},
            |w| w.op(set(&[("container", 2)], &[TEAM, TEAM])),
            Rejected(Invalid, &["a principal twice"]),
        ),
        case(
            "a principal is under one quota",
            |w| team_quota(w, 2),
            |w| {
                let mut other = set(&[("container", 5)], &["ci:nightly", TEAM]);
                other.quota = QuotaName::new("other").unwrap();
                w.op(other)
            },
            Rejected(InvalidState, &["ci:team-a is already under quota team-a"]),
        ),
        case(
            "two quotas whose pool names collide",
            |w| {
                let mut first = set(&[("c", 1)], &["ci:x"]);
                first.quota = QuotaName::new("a-b").unwrap();
                accepted(&w.op(first));
            },
            |w| {
                let mut second = set(&[("b-c", 1)], &["ci:y"]);
                second.quota = QuotaName::new("a").unwrap();
                w.op(second)
            },
            Rejected(InvalidState, &["pool quota-a-b-c already counts kind c of quota a-b"]),
        ),
        case(
            "routed to another partition",
            |_| {},
            |w| {
                let mut wrong = set(&[("container", 2)], &[TEAM]);
                wrong.partition = 3;
                w.op(wrong)
            },
            Rejected(WrongPartition, &["reached partition 0"]),
        ),
    ]);
}

#[test]
fn an_allocation_under_a_quota() {
    check(vec![
        case(
            "by a principal: a slot of the quota's pool is claimed, nothing is created yet",
            |w| {
                w.registered();
                team_quota(w, 2);
            },
            |w| allocate_as(w, TEAM, |_| {}),
            Effects(&["resource-allocated", "claim-wanted"]),
        ),
        case(
            "with its own pools too, and a wait",
            |w| {
                w.registered();
                team_quota(w, 2);
            },
            |w| {
                allocate_as(w, TEAM, |c| {
                    c.pools = vec![pool_name("ips")];
                    c.wait = Some(secs(60));
                })
            },
            Effects(&["resource-allocated", "claim-wanted", "claim-wanted", "allocation-waits-until"]),
        ),
        case(
            "by another issuer: no slot",
            |w| {
                w.registered();
                team_quota(w, 2);
            },
            |w| allocate_as(w, "ci:team-b", |_| {}),
            Effects(&["resource-allocated", "create-ordered"]),
        ),
        case(
            "of a kind the quota does not limit: no slot",
            |w| {
                w.registered();
                team_quota(w, 2);
            },
            |w| allocate_as(w, TEAM, |c| c.kind = "volume".into()),
            Effects(&["resource-allocated", "create-ordered"]),
        ),
        case(
            "a maximum of 0 refuses at once",
            |w| {
                w.registered();
                team_quota(w, 0);
            },
            |w| allocate_as(w, TEAM, |_| {}),
            Rejected(InvalidState, &["quota team-a of ci:team-a allows no container"]),
        ),
        case(
            "after the quota is removed: no slot",
            |w| {
                w.registered();
                team_quota(w, 2);
                accepted(&w.op(set(&[], &[])));
            },
            |w| allocate_as(w, TEAM, |_| {}),
            Effects(&["resource-allocated", "create-ordered"]),
        ),
    ]);
}

#[test]
fn the_claimed_slot_is_of_the_quota_s_pool() {
    let mut w = World::new();
    w.registered();
    team_quota(&mut w, 2);
    accepted(&allocate_as(&mut w, TEAM, |_| {}));
    let claims = &w.state().resource(w.r()).unwrap().claims;
    assert!(matches!(claims.get(&slot_pool()), Some(ClaimSlot::Wanted { .. })), "{claims:?}");
    assert_eq!(slot_pool().as_str(), "quota-team-a-container");
    settle(&w);
}

#[test]
fn over_quota_is_refused_without_a_wait() {
    fn waiting(w: &mut World) {
        w.registered();
        team_quota(w, 2);
        accepted(&allocate_as(w, TEAM, |_| {}));
    }
    check(vec![
        case(
            "without a wait: released, naming the quota and what holds it",
            waiting,
            |w| {
                let command = over_quota_of(w);
                w.sys(command)
            },
            Effects(&["resource-releasing"]),
        ),
        case(
            "with a wait: it waits",
            |w| {
                w.registered();
                team_quota(w, 2);
                accepted(&allocate_as(w, TEAM, |c| c.wait = Some(secs(60))));
            },
            |w| {
                let command = over_quota_of(w);
                w.sys(command)
            },
            Rejected(NothingToDo, &["may wait for quota team-a until"]),
        ),
        case(
            "with a wait, but the quota now allows none of its kind: released, nothing will come",
            |w| {
                w.registered();
                team_quota(w, 2);
                accepted(&allocate_as(w, TEAM, |c| c.wait = Some(secs(60))));
                accepted(&w.op(set(&[("container", 0)], &[TEAM])));
            },
            |w| {
                let command = over_quota_of(w);
                w.sys(command)
            },
            Effects(&["resource-releasing"]),
        ),
        case(
            "from a partition that is not the pool's",
            waiting,
            |w| {
                let mut command = over_quota_of(w);
                command.source.partition = 1;
                w.sys(command)
            },
            Rejected(Invalid, &["its queue cannot be reported from"]),
        ),
        case(
            "a pool no quota here counts",
            waiting,
            |w| {
                let mut command = over_quota_of(w);
                command.pool = pool_name("ips");
                w.sys(command)
            },
            Rejected(NothingToDo, &["counts no quota recorded here"]),
        ),
        case(
            "granted meanwhile",
            |w| {
                waiting(w);
                let bind = BindClaim {
                    holder: w.rref(),
                    pool: slot_pool(),
                    value: leasehold_schemas::pool::PoolValue::Slot(0),
                    token: Position(2),
                    source: Source { partition: 0, position: Position(2) },
                    wanted: w.wanted_by(slot_pool().as_str()),
                    definition: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Hold,
                };
                accepted(&w.sys(bind));
            },
            |w| {
                let command = over_quota_of(w);
                w.sys(command)
            },
            Rejected(NothingToDo, &["does not wait for a slot of pool quota-team-a-container"]),
        ),
        case(
            "released already",
            |w| {
                waiting(w);
                accepted(&w.release());
            },
            |w| {
                let command = over_quota_of(w);
                w.sys(command)
            },
            Rejected(AlreadyDone, &["not waiting for quota team-a"]),
        ),
    ]);
}

#[test]
fn the_release_over_quota_says_which_quota_how_full_and_who_holds_it() {
    let mut w = World::new();
    w.registered();
    team_quota(&mut w, 2);
    accepted(&allocate_as(&mut w, TEAM, |_| {}));
    let command = over_quota_of(&w);
    let outcome = w.sys(command);
    let cause = accepted(&outcome).iter().find_map(|e| match e {
        Effect::ResourceReleasing { cause, .. } => Some(cause.clone()),
        _ => None,
    });
    assert_eq!(
        cause,
        Some(ReleaseCause::OverQuota {
            quota: quota(),
            kind: "container".into(),
            max: 2,
            held: 2,
            holders: vec![ResourceRef::new(agent_name("w2"), w.r())],
        })
    );
    settle(&w);
}

// --- red team ---------------------------------------------------------------------------------------------------

/// Red team: a principal under a quota sends, under its own name, what changes what counts it: its quota's pool
/// raised, or the quota itself rewritten. The gateway forwards any `op` command of any token's principal, and a NATS
/// producer with `lh.in.op.>` names any issuer, so only the decider sees both who asks and what counts them. Each must
/// be refused (the operator's, not the principal's), or the quota binds nobody who can reach the gateway.
#[test]
fn a_principal_cannot_raise_or_remove_its_own_quota() {
    fn counted(w: &mut World) {
        w.registered();
        accepted(&w.op(DefinePool {
            pool: slot_pool(),
            kind: leasehold_schemas::pool::PoolKind::Slots { count: 2 },
            cooldown: Some(secs(0)),
            orphans: leasehold_schemas::pool::OrphanPolicy::Hold,
        }));
        team_quota(w, 2);
    }
    let raise = |w: &mut World| {
        w.d.submit(
            TEAM,
            UpdatePool {
                pool: slot_pool(),
                kind: leasehold_schemas::pool::PoolKind::Slots { count: 1000 },
                cooldown: None,
                orphans: None,
            },
        )
    };
    let rewrite = |w: &mut World| w.d.submit(TEAM, set(&[("container", 1000)], &[TEAM]));
    let remove = |w: &mut World| w.d.submit(TEAM, set(&[], &[]));
    let mut accepted_escapes = Vec::new();
    for (what, when) in [
        ("its quota's pool raised", &raise as &dyn Fn(&mut World) -> Outcome),
        ("its quota raised", &rewrite),
        ("its quota removed", &remove),
    ] {
        let mut w = World::new();
        counted(&mut w);
        let outcome = when(&mut w);
        if outcome.rejection().is_none() {
            accepted_escapes.push(format!("{what}: {:?}", outcome.effects()));
        }
    }
    assert!(accepted_escapes.is_empty(), "accepted from {TEAM} itself: {accepted_escapes:#?}");
}

/// Red team: an allocation by someone under no quota (or under another) that names a quota's counting pool in its
/// own `pools` takes one of that quota's slots: any producer can fill another team's quota and hold it, so its
/// principals are refused over quota while they hold nothing. A quota's pool counts its principals only.
#[test]
fn an_outsider_cannot_take_a_slot_of_another_s_quota() {
    let mut w = World::new();
    w.registered();
    team_quota(&mut w, 2);
    let outcome = allocate_as(&mut w, "ci:team-b", |c| c.pools = vec![slot_pool()]);
    let claims_it =
        outcome.effects().iter().any(|e| matches!(e, Effect::ClaimWanted { pool, .. } if *pool == slot_pool()));
    assert!(
        !claims_it,
        "ci:team-b, under no quota, claimed a slot of quota team-a's pool {}: {:?}",
        slot_pool(),
        outcome.effects()
    );
}

/// Red team: an operator that names itself among a quota's principals becomes a tenant by its own hand: from then on
/// every operator command of its (`quota rm`, `quota set`, pools, policy, agents) is refused as a tenant's, so the
/// quota can no longer be undone by it; behind a gateway with one operator token nobody can undo it short of
/// editing the tokens file. A quota that would put its own sender under it is refused, naming why.
#[test]
fn an_operator_cannot_put_itself_under_a_quota() {
    let mut w = World::new();
    let outcome = w.op(set(&[("container", 2)], &[TEAM, OP]));
    assert!(
        outcome.rejection().is_some(),
        "{OP} put itself under quota team-a and can no longer remove it: {:?}",
        outcome.effects()
    );
    let mut w = World::new();
    accepted(&w.op(set(&[("container", 2)], &[TEAM])));
    let removed = w.op(set(&[], &[]));
    assert!(removed.rejection().is_none(), "the operator removes what it set: {removed:?}");
}
