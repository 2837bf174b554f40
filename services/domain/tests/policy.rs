//! The cluster policy recorded in the log: agents without settings of their own follow it as it changes, `serve`'s
//! "only if none yet" never flips it, pools defined without a cool-down take it, and `leasehold_domain::due` gives
//! exactly the deadlines `decide` checks.

mod support;

use leasehold_domain::due;
use leasehold_schemas::Key;
use leasehold_schemas::Outcome;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::command::{CreateTimeout, DefinePool, MarkGone, MarkStalled, SetPartitionSettings};
use leasehold_schemas::ids::{Millis, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::settings::{AgentSettings, ClusterPolicy};
use support::*;

fn policy(stall_after: Millis, orphan_after: Millis) -> ClusterPolicy {
    ClusterPolicy {
        agent: AgentSettings { stall_after, orphan_after, ..AgentSettings::DEFAULT },
        claim_cooldown: secs(5),
    }
}

fn set_policy(w: &mut World, policy: Option<ClusterPolicy>, if_no_policy: bool) -> Outcome {
    w.op(SetPartitionSettings {
        key: Key::Agent(w.a()),
        partition: 0,
        outcome_horizon: None,
        policy,
        if_no_policy,
        gc: None,
        max_priority: None,
    })
}

fn mark_stalled(w: &mut World) -> Outcome {
    let agent = w.a();
    w.sys(MarkStalled { agent })
}

/// Advances the log clock to `at`.
fn advance_to(w: &mut World, at: Timestamp) {
    let by = at.since(w.d.now());
    w.advance(by);
}

#[test]
fn an_agent_without_settings_follows_the_policy_as_it_changes() {
    let mut w = World::new();
    w.registered();
    let registered = w.d.outcomes().last().unwrap().clone();
    assert_eq!(
        registered.effects()[0],
        Effect::AgentRegistered {
            incarnation: leasehold_schemas::Uuid::from_u128(1),
            wiped: false,
            settings: AgentSettings::DEFAULT,
            own_settings: false,
            retired: false,
        },
        "the registration says which settings are in force, and that they are the policy's"
    );
    accepted(&set_policy(&mut w, Some(policy(secs(9), secs(60))), false));
    let agent = w.state().agent(&w.a()).unwrap();
    assert_eq!(w.state().settings_of(agent).stall_after, secs(9));
    let due = due::stall_due(w.state(), agent);
    assert_eq!(due, agent.last_seen.saturating_add(secs(9 + 3)), "stall_after plus a third of it");
    advance_to(&mut w, Timestamp(due.0 - 1));
    refused(&mut w, mark_stalled, NotYetDue, &["it is not stalled before"]);
    w.advance(Millis(1));
    assert_eq!(effect_names(&mark_stalled(&mut w)), ["agent-stalled"]);
    let agent = w.state().agent(&w.a()).unwrap();
    assert_eq!(due::gone_due(w.state(), agent), agent.last_seen.saturating_add(secs(60 + 3)));
    settle(&w);
}

#[test]
fn an_agent_with_its_own_settings_keeps_them() {
    let mut w = World::new();
    let a = w.a();
    let own = AgentSettings { stall_after: secs(30), ..AgentSettings::DEFAULT };
    let registered = w.register_with(&a, own.clone(), false);
    assert!(
        matches!(&registered.effects()[0], Effect::AgentRegistered { own_settings: true, settings, .. } if *settings == own)
    );
    accepted(&set_policy(&mut w, Some(policy(secs(9), secs(60))), false));
    let agent = w.state().agent(&a).unwrap();
    assert_eq!(w.state().settings_of(agent), &own);
    assert_eq!(due::stall_due(w.state(), agent), agent.last_seen.saturating_add(secs(40)));
    settle(&w);
}

#[test]
fn a_policy_set_only_if_none_is_never_flipped_by_a_second_server() {
    let mut w = World::new();
    assert_eq!(w.state().settings().policy, None, "no policy recorded yet");
    let first = policy(secs(9), secs(60));
    assert_eq!(effect_names(&set_policy(&mut w, Some(first.clone()), true)), ["partition-settings-changed"]);
    let second = policy(secs(12), secs(90));
    refused(
        &mut w,
        |w| set_policy(w, Some(second.clone()), true),
        AlreadyDone,
        &["partition 0 already has a policy (stall_after 9s", "changed only by `leasehold policy set`"],
    );
    assert_eq!(w.state().policy(), &first);
    // The operator changes it on purpose.
    accepted(&set_policy(&mut w, Some(second.clone()), false));
    assert_eq!(w.state().policy(), &second);
    settle(&w);
}

#[test]
fn a_policy_that_makes_no_sense_is_refused_and_a_horizon_change_keeps_the_policy() {
    let mut w = World::new();
    refused(
        &mut w,
        |w| set_policy(w, Some(policy(secs(60), secs(60))), false),
        Invalid,
        &["policy: orphan_after (1min) must be longer than stall_after (1min)"],
    );
    accepted(&set_policy(&mut w, Some(policy(secs(9), secs(60))), false));
    refused(&mut w, |w| set_policy(w, None, false), AlreadyDone, &["the partition already has these settings"]);
    let horizon = SetPartitionSettings {
        key: Key::Agent(w.a()),
        partition: 0,
        outcome_horizon: Some(Millis::from_hours(48)),
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: None,
    };
    accepted(&w.op(horizon));
    assert_eq!(w.state().settings().outcome_horizon, Millis::from_hours(48));
    assert_eq!(w.state().policy(), &policy(secs(9), secs(60)), "a field not given is kept");
    settle(&w);
}

#[test]
fn a_pool_defined_without_a_cooldown_takes_the_policys() {
    let mut w = World::new();
    accepted(&set_policy(&mut w, Some(policy(secs(9), secs(60))), false));
    let defined = w.op(DefinePool {
        pool: pool_name("ips"),
        kind: PoolKind::Slots { count: 4 },
        cooldown: None,
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    });
    assert_eq!(accepted(&defined), [Effect::PoolDefined { kind: PoolKind::Slots { count: 4 }, cooldown: secs(5) }]);
}

#[test]
fn the_create_deadline_is_the_one_decide_checks_and_follows_the_policy() {
    let mut w = World::new();
    w.registered().pending();
    let mut short = policy(secs(9), secs(60));
    short.agent.create_timeout = secs(20);
    accepted(&set_policy(&mut w, Some(short), false));
    let resource = w.state().resource(w.r()).unwrap();
    let due = due::create_due(w.state(), resource).expect("pending");
    assert_eq!(due, resource.allocated_at.saturating_add(secs(20)));
    let timeout = |w: &mut World| {
        let (agent, resource) = (w.a(), w.r());
        w.sys(CreateTimeout { agent, resource })
    };
    // Keep the agent alive meanwhile.
    advance_to(&mut w, Timestamp(due.0 - 1));
    refused(&mut w, timeout, NotYetDue, &["may be created until"]);
    w.advance(Millis(1));
    assert_eq!(effect_names(&timeout(&mut w)), ["resource-releasing"]);
    assert_eq!(due::create_due(w.state(), w.state().resource(w.r()).unwrap()), None, "no longer pending");
    let agent = w.a();
    refused(&mut w, |w| w.sys(MarkGone { agent: agent.clone() }), NotYetDue, &["not gone before"]);
}
