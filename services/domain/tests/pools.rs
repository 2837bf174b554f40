//! Table tests for pools (DESIGN section 7): definitions, claims keyed by holder, frees that must match holder and
//! token, cool-down, the order identifiers are handed out in, and `tick`.

mod support;

use std::net::Ipv4Addr;

use Then::{Effects, Rejected};
use leasehold_domain::state::Holding;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::{Claim, DefinePool, Free, TickPool};
use leasehold_schemas::ids::{Millis, Position, ResourceRef, Source};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::DEFAULT_POOL_COOLDOWN;
use leasehold_schemas::{Command, CommandClass, Outcome, RejectionKind};
use support::*;

/// The cool-down of the pools defined here.
const COOL: Millis = Millis::from_secs(30);
/// One millisecond short of `COOL`.
const ALMOST: Millis = Millis(COOL.0 - 1);

// --- helpers: holders are numbered, so `given` and `when` can name the same one ------------------------------------

fn slot(n: u32) -> PoolValue {
    PoolValue::Slot(n)
}

fn define(w: &mut World, name: &str, kind: PoolKind, cooldown: Option<Millis>) -> Outcome {
    w.op(DefinePool { pool: pool_name(name), kind, cooldown, orphans: leasehold_schemas::pool::OrphanPolicy::Release })
}

/// A slot pool `slots` of `count` slots with the cool-down `COOL`.
fn slots(w: &mut World, count: u32) {
    assert_eq!(effect_names(&w.define_slots("slots", count, COOL)), ["pool-defined"]);
}

fn subnet_29(exclude: Vec<Ipv4Addr>) -> PoolKind {
    PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 29, exclude }
}

fn claim(w: &mut World, pool: &str, n: u8) -> Outcome {
    w.sys(Claim { pool: pool_name(pool), holder: holder(n), source: source(n) })
}

/// A free of holder `n`'s claim, from its `claim-releasable` (later than its `claim-wanted`).
fn free(w: &mut World, pool: &str, n: u8, token: Option<Position>) -> Outcome {
    let source = Source { partition: 0, position: Position(2000 + u64::from(n)) };
    w.sys(Free {
        pool: pool_name(pool),
        holder: holder(n),
        token,
        source,
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    })
}

/// A command that arrives in another class than its own (published on the wrong ingress subject).
fn as_class(w: &mut World, issuer: &str, body: impl Into<Command>, class: CommandClass) -> Outcome {
    let mut envelope = w.d.envelope(issuer, body);
    envelope.class = class;
    w.d.submit_envelope(&envelope)
}

fn tick(w: &mut World, pool: &str) -> Outcome {
    w.sys(TickPool { pool: pool_name(pool) })
}

/// The grants in an outcome: (holder, identifier, claim token = the grant's position).
fn grants(outcome: &Outcome) -> Vec<(ResourceRef, PoolValue, Position)> {
    outcome
        .positioned_effects()
        .filter_map(|(position, effect)| match effect {
            Effect::ClaimGranted { holder, value, .. } => Some((holder.clone(), *value, position)),
            _ => None,
        })
        .collect()
}

/// Claims for holder `n` and asserts it is granted; returns the identifier.
#[track_caller]
fn claimed(w: &mut World, pool: &str, n: u8) -> PoolValue {
    let outcome = claim(w, pool, n);
    assert_eq!(effect_names(&outcome), ["claim-granted"], "claim of holder {n}");
    grants(&outcome)[0].1
}

/// Claims for holder `n` and asserts it waits.
#[track_caller]
fn queued(w: &mut World, pool: &str, n: u8) {
    assert_eq!(effect_names(&claim(w, pool, n)), ["claim-queued"], "claim of holder {n}");
}

/// The claim token holder `n` holds on `pool`.
#[track_caller]
fn token_of(w: &World, pool: &str, n: u8) -> Position {
    match w.state().pool(&pool_name(pool)).expect("pool defined").holders.get(&holder(n)) {
        Some(Holding::Granted { token, .. }) => *token,
        other => panic!("holder {n} holds no grant on {pool}: {other:?}"),
    }
}

/// Frees holder `n`'s claim with its own token.
#[track_caller]
fn freed(w: &mut World, pool: &str, n: u8) {
    let token = token_of(w, pool, n);
    assert_eq!(effect_names(&free(w, pool, n, Some(token))), ["claim-freed"], "free of holder {n}");
}

#[track_caller]
fn assert_grants(outcome: &Outcome, expected: &[(u8, PoolValue)]) {
    let got: Vec<_> = grants(outcome).into_iter().map(|(h, v, _)| (h, v)).collect();
    let expected: Vec<_> = expected.iter().map(|(n, v)| (holder(*n), *v)).collect();
    assert_eq!(got, expected, "grants");
}

// --- define-pool ---------------------------------------------------------------------------------------------------

fn invalid(name: &'static str, kind: PoolKind, fragments: &'static [&'static str]) -> Case {
    case(name, |_| {}, move |w| define(w, "bad", kind.clone(), None), Rejected(Invalid, fragments))
}

#[test]
fn define_pool() {
    check(vec![
        case(
            "a slot pool",
            |_| {},
            |w| define(w, "slots", PoolKind::Slots { count: 4 }, Some(COOL)),
            Effects(&["pool-defined"]),
        ),
        case(
            "an IPv4 pool with an excluded gateway",
            |_| {},
            |w| define(w, "ips", subnet_29(vec![addr(1)]), Some(COOL)),
            Effects(&["pool-defined"]),
        ),
        case(
            "a port pool with an excluded port",
            |_| {},
            |w| define(w, "ports", PoolKind::Ports { first: 8000, last: 8009, exclude: vec![8005] }, Some(COOL)),
            Effects(&["pool-defined"]),
        ),
        case(
            "without a cool-down the pool gets the default",
            |_| {},
            |w| {
                let outcome = define(w, "slots", PoolKind::Slots { count: 1 }, None);
                assert_eq!(w.state().pool(&pool_name("slots")).unwrap().cooldown, DEFAULT_POOL_COOLDOWN);
                outcome
            },
            Effects(&["pool-defined"]),
        ),
        invalid("no slots", PoolKind::Slots { count: 0 }, &["pool bad", "at least one slot"]),
        invalid(
            "a network with host bits set",
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 5), prefix_len: 24, exclude: vec![] },
            &["did you mean 10.0.0.0/24"],
        ),
        invalid(
            "a prefix shorter than /8",
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 7, exclude: vec![] },
            &["/7 is not between /8 and /32"],
        ),
        invalid(
            "a prefix longer than /32",
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 33, exclude: vec![] },
            &["/33"],
        ),
        invalid(
            "an excluded address outside the subnet",
            subnet_29(vec![Ipv4Addr::new(10, 0, 1, 1)]),
            &["excluded address 10.0.1.1 is not in the subnet"],
        ),
        invalid(
            "every address excluded",
            PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![addr(1), addr(2)] },
            &["no identifier at all"],
        ),
        invalid(
            "an empty port range",
            PoolKind::Ports { first: 9000, last: 8000, exclude: vec![] },
            &["port range 9000..=8000 is empty"],
        ),
        invalid(
            "an excluded port outside the range",
            PoolKind::Ports { first: 8000, last: 8009, exclude: vec![7999] },
            &["excluded port 7999"],
        ),
        invalid(
            "every port excluded",
            PoolKind::Ports { first: 80, last: 80, exclude: vec![80] },
            &["no identifier at all"],
        ),
        case(
            "the same definition again",
            |w| slots(w, 4),
            |w| define(w, "slots", PoolKind::Slots { count: 4 }, Some(COOL)),
            Rejected(AlreadyDone, &["pool slots is already defined so"]),
        ),
        case(
            "the same definition again, the default cool-down now spelled out",
            |w| {
                accepted(&define(w, "slots", PoolKind::Slots { count: 4 }, None));
            },
            |w| define(w, "slots", PoolKind::Slots { count: 4 }, Some(DEFAULT_POOL_COOLDOWN)),
            Rejected(AlreadyDone, &["already defined so"]),
        ),
        case(
            "another size under the same name",
            |w| slots(w, 4),
            |w| define(w, "slots", PoolKind::Slots { count: 8 }, Some(COOL)),
            Rejected(AlreadyExists, &["pool slots is already defined differently"]),
        ),
        case(
            "another cool-down under the same name",
            |w| slots(w, 4),
            |w| define(w, "slots", PoolKind::Slots { count: 4 }, Some(Millis::from_secs(5))),
            Rejected(AlreadyExists, &["already defined differently"]),
        ),
        case(
            "another kind under the same name",
            |w| slots(w, 4),
            |w| define(w, "slots", subnet_29(vec![]), Some(COOL)),
            Rejected(AlreadyExists, &["already defined differently"]),
        ),
        case(
            "a pool definition sent as a sys command",
            |_| {},
            |w| {
                let body = DefinePool {
                    pool: pool_name("slots"),
                    kind: PoolKind::Slots { count: 1 },
                    cooldown: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                };
                as_class(w, SWEEPER, body, CommandClass::Sys)
            },
            Rejected(NotPermitted, &["op.define-pool is a op command", "class sys"]),
        ),
    ]);
}

// --- claim ---------------------------------------------------------------------------------------------------------

#[test]
fn claim_grants_fresh_identifiers_in_order_and_keys_claims_by_holder() {
    check(vec![
        case(
            "the first claim gets slot 0, a real slot",
            |w| slots(w, 3),
            |w| {
                let outcome = claim(w, "slots", 1);
                assert_grants(&outcome, &[(1, slot(0))]);
                let (_, _, position) = grants(&outcome)[0].clone();
                assert_eq!(token_of(w, "slots", 1), position, "the claim token is the grant's position");
                let pool = w.state().pool(&pool_name("slots")).unwrap();
                assert_eq!(pool.held.get(&slot(0)), Some(&holder(1)), "slot 0 is held, not 'no slot'");
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "the next claims get the next slots",
            |w| {
                slots(w, 3);
                assert_eq!(claimed(w, "slots", 1), slot(0));
                assert_eq!(claimed(w, "slots", 2), slot(1));
            },
            |w| {
                let outcome = claim(w, "slots", 3);
                assert_grants(&outcome, &[(3, slot(2))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "a port pool hands out ports in order, skipping excluded ones",
            |w| {
                accepted(&define(w, "ports", PoolKind::Ports { first: 8000, last: 8002, exclude: vec![8000] }, None));
                assert_eq!(claimed(w, "ports", 1), PoolValue::Port(8001));
            },
            |w| {
                let outcome = claim(w, "ports", 2);
                assert_grants(&outcome, &[(2, PoolValue::Port(8002))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "a claim waits when nothing is free",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
            },
            |w| {
                let outcome = claim(w, "slots", 2);
                let pool = w.state().pool(&pool_name("slots")).unwrap();
                assert_eq!(pool.waiters.values().collect::<Vec<_>>(), [&holder(2)], "holder 2 waits");
                outcome
            },
            Effects(&["claim-queued"]),
        ),
        case(
            "the same holder again while it holds its grant",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
            },
            |w| claim(w, "slots", 1),
            Rejected(AlreadyDone, &["already holds slot 0 of pool slots", "claim token"]),
        ),
        case(
            "the same holder again while it waits",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| claim(w, "slots", 2),
            Rejected(AlreadyDone, &["already waiting for pool slots", "place 1"]),
        ),
        case(
            "the second of two waiters is told its place",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
                queued(w, "slots", 3);
            },
            |w| claim(w, "slots", 3),
            Rejected(AlreadyDone, &["place 2"]),
        ),
        case(
            "a holder whose claim was freed claims again",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
                freed(w, "slots", 1);
            },
            |w| claim(w, "slots", 1),
            Rejected(StaleSource, &["already ended", "this claim is stale"]),
        ),
        case(
            "a holder whose wait was withdrawn claims again",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
                assert_eq!(effect_names(&free(w, "slots", 2, None)), ["claim-withdrawn"]);
            },
            |w| claim(w, "slots", 2),
            Rejected(StaleSource, &["already ended"]),
        ),
        case("a claim on an unknown pool", |_| {}, |w| claim(w, "nope", 1), Rejected(Unknown, &["pool nope"])),
        case(
            "a claim sent as an op command",
            |w| slots(w, 1),
            |w| {
                let body = Claim { pool: pool_name("slots"), holder: holder(1), source: source(1) };
                as_class(w, OP, body, CommandClass::Op)
            },
            Rejected(NotPermitted, &["sys.claim is a sys command, but it came as class op"]),
        ),
    ]);
}

#[test]
fn an_ipv4_pool_skips_network_broadcast_and_excluded_addresses() {
    check(vec![
        case(
            "a /29 without 10.0.0.2 hands out .1, .3, .4, .5, .6 and then makes the next claim wait",
            |w| {
                accepted(&define(w, "ips", subnet_29(vec![addr(2)]), Some(COOL)));
                let handed: Vec<_> = (1..=5).map(|n| claimed(w, "ips", n)).collect();
                assert_eq!(handed, [ip(1), ip(3), ip(4), ip(5), ip(6)]);
            },
            |w| claim(w, "ips", 6),
            Effects(&["claim-queued"]),
        ),
        case(
            "a /30 has two hosts",
            |w| {
                let kind = PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![] };
                accepted(&define(w, "ips", kind, Some(COOL)));
                assert_eq!(claimed(w, "ips", 1), ip(1));
                assert_eq!(claimed(w, "ips", 2), ip(2));
            },
            |w| claim(w, "ips", 3),
            Effects(&["claim-queued"]),
        ),
        case(
            "a freed address comes back, never the broadcast address",
            |w| {
                let kind = PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![] };
                accepted(&define(w, "ips", kind, Some(COOL)));
                claimed(w, "ips", 1);
                claimed(w, "ips", 2);
                freed(w, "ips", 1);
                queued(w, "ips", 3);
                w.advance(COOL);
            },
            |w| {
                let outcome = tick(w, "ips");
                assert_grants(&outcome, &[(3, ip(1))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
    ]);
}

// --- free ----------------------------------------------------------------------------------------------------------

#[test]
fn free_must_match_holder_and_token() {
    check(vec![
        case(
            "matching holder and token",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
            },
            |w| {
                let token = token_of(w, "slots", 1);
                let outcome = free(w, "slots", 1, Some(token));
                let pool = w.state().pool(&pool_name("slots")).unwrap();
                assert!(pool.held.is_empty(), "slot 0 is no longer held");
                assert_eq!(pool.cooling.values().collect::<Vec<_>>(), [&slot(0)], "slot 0 cools down");
                outcome
            },
            Effects(&["claim-freed"]),
        ),
        case(
            "a wrong token",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
            },
            |w| {
                let token = token_of(w, "slots", 1);
                free(w, "slots", 1, Some(Position(token.0 + 1)))
            },
            Rejected(TokenMismatch, &["holds its claim on pool slots with token"]),
        ),
        case(
            "the token of another holder",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
                claimed(w, "slots", 2);
            },
            |w| {
                let token = token_of(w, "slots", 2);
                free(w, "slots", 1, Some(token))
            },
            Rejected(TokenMismatch, &["with token"]),
        ),
        case(
            "no token for a granted claim",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
            },
            |w| free(w, "slots", 1, None),
            Rejected(TokenMismatch, &["not none"]),
        ),
        case(
            "a waiting holder withdraws without a token",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| {
                let outcome = free(w, "slots", 2, None);
                assert!(w.state().pool(&pool_name("slots")).unwrap().waiters.is_empty(), "nobody waits");
                outcome
            },
            Effects(&["claim-withdrawn"]),
        ),
        case(
            "a waiting holder presents a token it cannot have",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| free(w, "slots", 2, Some(Position(3))),
            Rejected(TokenMismatch, &["still waiting for pool slots"]),
        ),
        case(
            "a claim already freed",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                freed(w, "slots", 1);
            },
            |w| free(w, "slots", 1, Some(Position(2))),
            Rejected(AlreadyDone, &["was already freed"]),
        ),
        case(
            "a withdrawal older than the claim it would end (a made-up one)",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| {
                w.sys(Free {
                    pool: pool_name("slots"),
                    holder: holder(2),
                    token: None,
                    source: source(1),
                    cause: leasehold_schemas::outcome::FreeCause::Released {},
                })
            },
            Rejected(StaleSource, &["is older than the claim"]),
        ),
        case(
            "a wait already withdrawn",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
                accepted(&free(w, "slots", 2, None));
            },
            |w| free(w, "slots", 2, None),
            Rejected(AlreadyDone, &["already freed"]),
        ),
        case(
            "a holder the pool never heard of",
            |w| slots(w, 1),
            |w| free(w, "slots", 9, Some(Position(2))),
            Rejected(Unknown, &["holds no claim on pool slots"]),
        ),
        case("a free on an unknown pool", |_| {}, |w| free(w, "nope", 1, None), Rejected(Unknown, &["pool nope"])),
        case(
            "freeing does not hand the identifier to a waiter before its cool-down",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| {
                let token = token_of(w, "slots", 1);
                free(w, "slots", 1, Some(token))
            },
            Effects(&["claim-freed"]),
        ),
    ]);
}

// --- cool-down and order -------------------------------------------------------------------------------------------

#[test]
fn cool_down_and_the_order_identifiers_come_back_in() {
    check(vec![
        case(
            "a freed identifier is not handed out before its cool-down",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                freed(w, "slots", 1);
                w.advance(ALMOST);
            },
            |w| claim(w, "slots", 2),
            Effects(&["claim-queued"]),
        ),
        case(
            "a tick before the cool-down passed",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                freed(w, "slots", 1);
                queued(w, "slots", 2);
                w.advance(ALMOST);
            },
            |w| tick(w, "slots"),
            Rejected(NotYetDue, &["pool slots", "finishes its cool-down at"]),
        ),
        case(
            "a tick once the cool-down passed serves the waiter",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                freed(w, "slots", 1);
                queued(w, "slots", 2);
                w.advance(COOL);
            },
            |w| {
                let outcome = tick(w, "slots");
                assert_grants(&outcome, &[(2, slot(0))]);
                assert!(w.state().pool(&pool_name("slots")).unwrap().waiters.is_empty());
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "waiters are served first in, first out, least recently freed first",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1); // slot 0
                claimed(w, "slots", 2); // slot 1
                queued(w, "slots", 3);
                queued(w, "slots", 4);
                queued(w, "slots", 5);
                freed(w, "slots", 2); // slot 1 first
                w.advance(Millis::from_secs(1));
                freed(w, "slots", 1); // slot 0 a second later
                w.advance(COOL);
            },
            |w| {
                let outcome = tick(w, "slots");
                assert_grants(&outcome, &[(3, slot(1)), (4, slot(0))]);
                let pool = w.state().pool(&pool_name("slots")).unwrap();
                assert_eq!(pool.waiters.values().collect::<Vec<_>>(), [&holder(5)], "holder 5 still waits");
                outcome
            },
            Effects(&["claim-granted", "claim-granted"]),
        ),
        case(
            "a tick serves only the identifiers whose cool-down passed",
            |w| {
                slots(w, 2);
                claimed(w, "slots", 1);
                claimed(w, "slots", 2);
                queued(w, "slots", 3);
                queued(w, "slots", 4);
                freed(w, "slots", 1);
                w.advance(Millis::from_secs(10));
                freed(w, "slots", 2);
                w.advance(Millis(COOL.0 - 10_000));
            },
            |w| {
                let outcome = tick(w, "slots");
                assert_grants(&outcome, &[(3, slot(0))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "a new claim does not jump the queue: the waiter gets the cooled identifier",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
                freed(w, "slots", 1);
                w.advance(COOL);
            },
            |w| {
                let outcome = claim(w, "slots", 3);
                assert_grants(&outcome, &[(2, slot(0))]);
                outcome
            },
            Effects(&["claim-granted", "claim-queued"]),
        ),
        case(
            "least recently freed first among cooled identifiers",
            |w| {
                slots(w, 3);
                claimed(w, "slots", 1); // slot 0
                claimed(w, "slots", 2); // slot 1
                claimed(w, "slots", 3); // slot 2
                freed(w, "slots", 3); // slot 2 first
                w.advance(Millis::from_secs(1));
                freed(w, "slots", 1); // then slot 0
                w.advance(Millis::from_secs(1));
                freed(w, "slots", 2); // then slot 1
                w.advance(COOL);
                assert_eq!(claimed(w, "slots", 4), slot(2));
                assert_eq!(claimed(w, "slots", 5), slot(0));
            },
            |w| {
                let outcome = claim(w, "slots", 6);
                assert_grants(&outcome, &[(6, slot(1))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "never-used identifiers come before freed ones, even cooled ones",
            |w| {
                slots(w, 3);
                assert_eq!(claimed(w, "slots", 1), slot(0));
                freed(w, "slots", 1);
                w.advance(Millis::from_hours(1));
                assert_eq!(claimed(w, "slots", 2), slot(1));
                assert_eq!(claimed(w, "slots", 3), slot(2));
            },
            |w| {
                let outcome = claim(w, "slots", 4);
                assert_grants(&outcome, &[(4, slot(0))]);
                outcome
            },
            Effects(&["claim-granted"]),
        ),
        case(
            "a tick with nobody waiting",
            |w| slots(w, 1),
            |w| tick(w, "slots"),
            Rejected(NothingToDo, &["nobody waits"]),
        ),
        case(
            "a tick with waiters but nothing free or cooling",
            |w| {
                slots(w, 1);
                claimed(w, "slots", 1);
                queued(w, "slots", 2);
            },
            |w| tick(w, "slots"),
            Rejected(NothingToDo, &["no identifier free or cooling", "1 holders wait"]),
        ),
        case("a tick on an unknown pool", |_| {}, |w| tick(w, "nope"), Rejected(Unknown, &["pool nope"])),
    ]);
}

/// A retried claim (the same command id) gets its first outcome back and appends nothing: a sweeper that lost the
/// answer may ask again.
#[test]
fn a_retried_claim_gets_its_first_outcome_back() {
    let mut w = World::new();
    slots(&mut w, 2);
    let envelope = w.d.envelope(SWEEPER, Claim { pool: pool_name("slots"), holder: holder(1), source: source(1) });
    let first = w.d.submit_envelope(&envelope);
    assert_grants(&first, &[(1, slot(0))]);
    let n_outcomes = w.d.outcomes().len();
    let again = w.d.submit_envelope(&envelope);
    assert_eq!(again, first);
    assert_eq!(w.d.outcomes().len(), n_outcomes, "nothing appended");
    assert_eq!(claimed(&mut w, "slots", 2), slot(1), "slot 0 was not handed out twice");
    leasehold_domain::invariants::check(w.state()).expect("invariants");
    assert!(w.d.rebuild() == *w.state());
}

// --- regressions: behaviour once found wrong in review, now fixed ----------------------------------------------------

/// Behaviour that once contradicted DESIGN.md or would have surprised an operator, and was fixed. Each check says
/// what is expected.
#[test]
fn regressions_found_in_review() {
    let mut failures: Vec<String> = Vec::new();
    let mut expect = |what: &str, outcome: &Outcome, kind: RejectionKind| {
        let got = match outcome.rejection() {
            Some(rejection) => rejection.to_string(),
            None => format!("accepted {:?}", effect_names(outcome)),
        };
        if outcome.rejection().is_none_or(|r| r.kind != kind) {
            failures.push(format!("{what}: expected {kind}, got {got}"));
        }
    };

    // Re-running `define-pool` with the same exclusions listed in another order is the same definition: an
    // operator re-applying their config must get already-done, not "defined differently".
    let mut w = World::new();
    accepted(&define(&mut w, "ips", subnet_29(vec![addr(1), addr(2)]), Some(COOL)));
    let again = define(&mut w, "ips", subnet_29(vec![addr(2), addr(1)]), Some(COOL));
    expect("the same exclusions in another order", &again, AlreadyDone);

    assert!(failures.is_empty(), "{} regressions:\n{}", failures.len(), failures.join("\n"));
}

/// An IPv4 pool's grant carries the pool's definition to the holder, which records it next to the bound address
/// (`claim-pool-definition`): the agent puts the address on a network of that subnet. A slot pool's carries none.
#[test]
fn an_ipv4_grant_carries_its_pools_network_to_the_holder() {
    let mut w = World::new();
    w.registered();
    let kind = subnet_29(vec![Ipv4Addr::new(10, 0, 0, 1)]);
    accepted(&define(&mut w, "ips", kind.clone(), Some(COOL)));
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let (holder, wanted) = (w.rref(), w.wanted_by("ips"));
    let bind = w.granted_claim(&pool_name("ips"), &holder, wanted);
    assert_eq!(bind.definition, Some(kind.clone()));
    let bound = w.sys(bind);
    assert_eq!(effect_names(&bound), ["claim-bound", "claim-pool-definition", "create-ordered"]);
    assert!(bound.effects().iter().any(|e| matches!(
        e,
        Effect::ClaimPoolDefinition { resource, definition, .. } if *resource == holder.resource && *definition == kind
    )));
    assert_eq!(bound.oldest_schema_version(), 3, "the new effect needs schema version 3");

    slots(&mut w, 2);
    w.pending_with(|c| c.pools = vec![pool_name("slots")]);
    let (holder, wanted) = (w.rref(), w.wanted_by("slots"));
    let bind = w.granted_claim(&pool_name("slots"), &holder, wanted);
    assert_eq!(bind.definition, None);
    assert_eq!(effect_names(&w.sys(bind)), ["claim-bound", "create-ordered"]);
}
