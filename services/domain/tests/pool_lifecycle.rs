//! The pool life cycle: grow, change exclusions, delete. Tables for each rule, and a property test against a plain
//! set of identifiers: whatever sequence of claims, frees and updates, no identifier is handed out twice at once,
//! none that the current definition excludes, and none is lost (once everything is freed and cooled, exactly the
//! definition's usable identifiers can be claimed).

mod support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use leasehold_domain::state::Holding;
use leasehold_schemas::Outcome;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::{Claim, DefinePool, DeletePool, Free, UpdatePool};
use leasehold_schemas::ids::{Millis, Position, ResourceRef, Source};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use proptest::prelude::*;
use support::*;

const COOL: Millis = Millis::from_secs(30);

fn subnet(prefix_len: u8, exclude: Vec<Ipv4Addr>) -> PoolKind {
    PoolKind::Ipv4 { network: addr(0), prefix_len, exclude }
}

fn define(w: &mut World, kind: PoolKind) {
    accepted(&w.op(DefinePool {
        pool: pool_name("ips"),
        kind,
        cooldown: Some(COOL),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    }));
}

fn update(w: &mut World, kind: PoolKind) -> Outcome {
    w.op(UpdatePool { pool: pool_name("ips"), kind, cooldown: None, orphans: None })
}

fn claim(w: &mut World, n: u8) -> Outcome {
    w.sys(Claim { pool: pool_name("ips"), holder: holder(n), source: source(n) })
}

#[track_caller]
fn claimed(w: &mut World, n: u8) -> PoolValue {
    let outcome = claim(w, n);
    match accepted(&outcome) {
        [Effect::ClaimGranted { value, .. }] => *value,
        other => panic!("holder {n} got no grant: {other:?}"),
    }
}

/// Frees holder `n`'s claim (granted or waiting) with its token.
fn free(w: &mut World, n: u8) -> Outcome {
    let token = match w.state().pool(&pool_name("ips")).and_then(|p| p.holders.get(&holder(n))) {
        Some(Holding::Granted { token, .. }) => Some(*token),
        _ => None,
    };
    let source = Source { partition: 0, position: Position(2000 + u64::from(n)) };
    w.sys(Free {
        pool: pool_name("ips"),
        holder: holder(n),
        token,
        source,
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    })
}

fn granted_values(outcome: &Outcome) -> Vec<PoolValue> {
    outcome
        .effects()
        .iter()
        .filter_map(|e| match e {
            Effect::ClaimGranted { value, .. } => Some(*value),
            _ => None,
        })
        .collect()
}

#[test]
fn a_grown_slash_30_serves_its_waiter_at_once_with_its_old_broadcast_address() {
    let mut w = World::new();
    define(&mut w, subnet(30, vec![]));
    assert_eq!([claimed(&mut w, 1), claimed(&mut w, 2)], [ip(1), ip(2)]);
    assert_eq!(effect_names(&claim(&mut w, 3)), ["claim-queued"]);
    let grown = update(&mut w, subnet(29, vec![]));
    assert_eq!(effect_names(&grown), ["pool-updated", "claim-granted"]);
    assert_eq!(granted_values(&grown), [ip(3)], "the /30's broadcast address is usable in the /29");
    assert_eq!([claimed(&mut w, 4), claimed(&mut w, 5), claimed(&mut w, 6)], [ip(4), ip(5), ip(6)]);
    assert_eq!(effect_names(&claim(&mut w, 7)), ["claim-queued"], "10.0.0.7 is the /29's broadcast address");
    settle(&w);
}

#[test]
fn a_lifted_exclusion_below_the_fresh_ones_is_recovered_not_lost() {
    let mut w = World::new();
    define(&mut w, subnet(29, vec![addr(1)]));
    assert_eq!([claimed(&mut w, 1), claimed(&mut w, 2)], [ip(2), ip(3)]);
    let lifted = update(&mut w, subnet(29, vec![]));
    assert_eq!(
        lifted.effects(),
        [Effect::PoolUpdated { kind: subnet(29, vec![]), cooldown: COOL, recovered: vec![ip(1)] }]
    );
    let next: Vec<_> = (3..=6).map(|n| claimed(&mut w, n)).collect();
    assert_eq!(next, [ip(4), ip(5), ip(6), ip(1)], "fresh ones first, then the recovered one");
    assert_eq!(effect_names(&claim(&mut w, 7)), ["claim-queued"]);
    settle(&w);
}

#[test]
fn an_excluded_identifier_stays_held_until_freed_and_is_never_handed_out_again() {
    let mut w = World::new();
    define(&mut w, subnet(29, vec![]));
    assert_eq!([claimed(&mut w, 1), claimed(&mut w, 2)], [ip(1), ip(2)]);
    assert_eq!(effect_names(&free(&mut w, 2)), ["claim-freed"]);
    assert_eq!(effect_names(&update(&mut w, subnet(29, vec![addr(1), addr(2)]))), ["pool-updated"]);
    let pool = w.state().pool(&pool_name("ips")).unwrap();
    assert_eq!(pool.held.get(&ip(1)), Some(&holder(1)), "still held by its holder");
    assert!(pool.cooling.is_empty(), "10.0.0.2 was cooling: excluded, it leaves the cool-down queue");
    assert_eq!(effect_names(&free(&mut w, 1)), ["claim-freed"]);
    assert!(w.state().pool(&pool_name("ips")).unwrap().cooling.is_empty(), "10.0.0.1 is not put back");
    w.advance(COOL);
    let rest: Vec<_> = (3..=6).map(|n| claimed(&mut w, n)).collect();
    assert_eq!(rest, [ip(3), ip(4), ip(5), ip(6)]);
    assert_eq!(effect_names(&claim(&mut w, 7)), ["claim-queued"], "neither 10.0.0.1 nor 10.0.0.2 comes back");
    settle(&w);
}

#[test]
fn fewer_slots_keep_their_holders_hand_out_nothing_above_the_count_and_come_back_when_it_grows() {
    let mut w = World::new();
    define(&mut w, PoolKind::Slots { count: 3 });
    let slot = PoolValue::Slot;
    assert_eq!([claimed(&mut w, 1), claimed(&mut w, 2), claimed(&mut w, 3)], [slot(0), slot(1), slot(2)]);
    // Lowered to 1 (a quota lowered): holders keep slots 1 and 2; nothing is handed out until fewer than 1 is held.
    assert_eq!(effect_names(&update(&mut w, PoolKind::Slots { count: 1 })), ["pool-updated"]);
    assert_eq!(w.state().pool(&pool_name("ips")).unwrap().held.len(), 3);
    assert_eq!(effect_names(&claim(&mut w, 4)), ["claim-queued"]);
    assert_eq!(effect_names(&free(&mut w, 3)), ["claim-freed"], "slot 2 is freed and not handed out");
    assert_eq!(effect_names(&free(&mut w, 2)), ["claim-freed"], "slot 1 neither");
    w.advance(COOL);
    let tick = w.sys(leasehold_schemas::command::TickPool { pool: pool_name("ips") });
    assert!(tick.rejection().is_some(), "slot 0 is still held: nothing to serve the waiter with: {tick:?}");
    assert_eq!(effect_names(&free(&mut w, 1)), ["claim-freed"]);
    w.advance(COOL);
    let served = w.sys(leasehold_schemas::command::TickPool { pool: pool_name("ips") });
    assert_eq!(granted_values(&served), [slot(0)], "the waiter gets the one slot left");
    // Grown back to 3: slots 1 and 2, handed out before and freed while above the count, are recovered.
    let grown = update(&mut w, PoolKind::Slots { count: 3 });
    assert_eq!(
        grown.effects(),
        [Effect::PoolUpdated { kind: PoolKind::Slots { count: 3 }, cooldown: COOL, recovered: vec![slot(1), slot(2)] }]
    );
    assert_eq!([claimed(&mut w, 5), claimed(&mut w, 6)], [slot(1), slot(2)]);
    assert_eq!(effect_names(&claim(&mut w, 7)), ["claim-queued"]);
    settle(&w);
}

#[test]
fn shrinking_an_address_or_port_pool_moving_or_changing_the_kind_is_refused() {
    let cases = [
        (subnet(29, vec![]), subnet(30, vec![]), "would shrink it"),
        (
            subnet(29, vec![]),
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 1, 0), prefix_len: 29, exclude: vec![] },
            "keeps its network address",
        ),
        (
            PoolKind::Ports { first: 100, last: 110, exclude: vec![] },
            PoolKind::Ports { first: 100, last: 105, exclude: vec![] },
            "would shrink it",
        ),
        (
            PoolKind::Ports { first: 100, last: 110, exclude: vec![] },
            PoolKind::Ports { first: 99, last: 110, exclude: vec![] },
            "keeps its first port",
        ),
        (PoolKind::Slots { count: 8 }, PoolKind::Ports { first: 1, last: 8, exclude: vec![] }, "keeps its kind"),
    ];
    for (old, new, says) in cases {
        let mut w = World::new();
        define(&mut w, old);
        let message = refused(&mut w, |w| update(w, new.clone()), Invalid, &[says]);
        assert!(message.starts_with("pool ips: "), "{message}");
    }
    let mut w = World::new();
    define(&mut w, PoolKind::Slots { count: 8 });
    refused(&mut w, |w| update(w, PoolKind::Slots { count: 8 }), AlreadyDone, &["already defined so"]);
    let other =
        UpdatePool { pool: pool_name("other"), kind: PoolKind::Slots { count: 9 }, cooldown: None, orphans: None };
    refused(&mut w, |w| w.op(other.clone()), Unknown, &["pool other is not defined"]);
}

#[test]
fn a_pool_is_deleted_only_when_nobody_holds_or_waits() {
    let mut w = World::new();
    define(&mut w, PoolKind::Slots { count: 1 });
    claimed(&mut w, 1);
    assert_eq!(effect_names(&claim(&mut w, 2)), ["claim-queued"]);
    let delete = |w: &mut World| w.op(DeletePool { pool: pool_name("ips") });
    let in_use = ["pool ips is in use: 1 identifiers held by w1.", "(slot 0), 1 holders waiting"];
    refused(&mut w, delete, InvalidState, &in_use);
    assert_eq!(effect_names(&free(&mut w, 2)), ["claim-withdrawn"]);
    assert_eq!(effect_names(&free(&mut w, 1)), ["claim-freed"]);
    assert_eq!(effect_names(&delete(&mut w)), ["pool-deleted"]);
    assert!(w.state().pool(&pool_name("ips")).is_none());
    refused(&mut w, |w| claim(w, 3), Unknown, &["pool ips is not defined"]);
    settle(&w);
}

#[test]
fn a_slash_16_grows_to_a_slash_15_without_materialising_it() {
    let mut w = World::new();
    let big = |prefix_len| PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len, exclude: vec![] };
    define(&mut w, big(16));
    assert_eq!(claimed(&mut w, 1), PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 1)));
    let grown = update(&mut w, big(15));
    assert_eq!(grown.effects(), [Effect::PoolUpdated { kind: big(15), cooldown: COOL, recovered: vec![] }]);
    let pool = w.state().pool(&pool_name("ips")).unwrap();
    assert_eq!((pool.next_fresh, pool.recovered.len(), pool.cooling.len()), (2, 0, 0));
    settle(&w);
}

// --- the property --------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Claim,
    /// Frees (or withdraws) the `n`-th holder still known to the pool.
    Free(usize),
    /// Grows the port range by `grow` and excludes the ports of `mask` (bit i: port `FIRST + i`).
    Update {
        grow: u16,
        mask: u16,
    },
    Advance(u64),
}

const FIRST: u16 = 100;

fn ports(last: u16, mask: u16) -> PoolKind {
    let exclude = (0..16).filter(|i| mask & (1 << i) != 0).map(|i| FIRST + i).filter(|p| *p <= last).collect();
    PoolKind::Ports { first: FIRST, last, exclude }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Claim),
        3 => (0usize..8).prop_map(Step::Free),
        2 => (0u16..3, any::<u16>()).prop_map(|(grow, mask)| Step::Update { grow, mask }),
        1 => (0u64..40).prop_map(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn nothing_is_handed_out_twice_excluded_or_lost(steps in prop::collection::vec(step(), 1..40)) {
        let mut w = World::new();
        let mut kind = ports(FIRST + 3, 0);
        accepted(&w.op(DefinePool { pool: pool_name("ips"), kind: kind.clone(), cooldown: Some(COOL), orphans: leasehold_schemas::pool::OrphanPolicy::Release }));
        let mut n_holders = 0u8;
        for step in &steps {
            match step {
                Step::Claim => {
                    n_holders += 1;
                    let outcome = claim(&mut w, n_holders);
                    for value in granted_values(&outcome) {
                        prop_assert!(kind.contains(&value), "{value} granted while the pool is {kind:?}");
                    }
                }
                Step::Free(n) => {
                    let known: Vec<ResourceRef> = w.state().pool(&pool_name("ips")).unwrap().holders.keys().cloned().collect();
                    if let Some(h) = known.get(n % known.len().max(1)) {
                        let n = (1..=n_holders).find(|i| holder(*i) == *h).unwrap();
                        accepted(&free(&mut w, n));
                    }
                }
                Step::Update { grow, mask } => {
                    let PoolKind::Ports { last, .. } = kind else { unreachable!() };
                    let next = ports(last + grow, *mask);
                    if next.validate().is_ok() && next.canonical() != kind.canonical() {
                        let outcome = update(&mut w, next.clone());
                        accepted(&outcome);
                        for value in granted_values(&outcome) {
                            prop_assert!(next.contains(&value), "{value} granted by the update to {next:?}");
                        }
                        kind = next;
                    }
                }
                Step::Advance(secs) => w.advance(Millis::from_secs(*secs)),
            }
            leasehold_domain::invariants::check(w.state()).map_err(TestCaseError::fail)?;
        }
        // Give everything back, let it cool, and claim until the pool runs dry: exactly the usable identifiers.
        let known: Vec<ResourceRef> = w.state().pool(&pool_name("ips")).unwrap().holders.keys().cloned().collect();
        for h in known {
            let n = (1..=n_holders).find(|i| holder(*i) == h).unwrap();
            accepted(&free(&mut w, n));
        }
        w.advance(COOL);
        let mut got = BTreeSet::new();
        loop {
            n_holders += 1;
            let outcome = claim(&mut w, n_holders);
            match granted_values(&outcome)[..] {
                [value] => prop_assert!(got.insert(value), "{value} handed out twice"),
                _ => break,
            }
        }
        let usable: BTreeSet<_> = (0..kind.size()).filter_map(|idx| kind.value_at(idx)).collect();
        prop_assert_eq!(got, usable);
        settle(&w);
    }
}

/// Red team (quotas): a slot pool lowered below a slot it has handed out is a state the decider means to reach (the
/// holder keeps its slot until freed), so the invariants must hold there too, not only once the slot is freed.
#[test]
fn a_slot_pool_lowered_below_a_held_slot_keeps_its_invariants() {
    let mut w = World::new();
    define(&mut w, PoolKind::Slots { count: 3 });
    let slot = PoolValue::Slot;
    assert_eq!([claimed(&mut w, 1), claimed(&mut w, 2), claimed(&mut w, 3)], [slot(0), slot(1), slot(2)]);
    assert_eq!(effect_names(&update(&mut w, PoolKind::Slots { count: 1 })), ["pool-updated"]);
    // Slots 1 and 2 are held above the count: legal, and the invariants must say so.
    settle(&w);
}
