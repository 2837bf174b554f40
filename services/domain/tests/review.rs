//! What a red-team review of the hardened core found, each a named regression test of the fix: made-up sources that
//! wedged a child or a claim, observations taken that an agent could not have made, leases granted under a suspect
//! parent, stale health results, a chunk clearing the breaker, lease renewals filling memory, heartbeats that are
//! never coalesced, and an adoption answered "ask later" for a parent that can never exist.

mod support;

use leasehold_domain::driver::Answer;
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::Uuid;
use leasehold_schemas::command::*;
use leasehold_schemas::ids::*;
use leasehold_schemas::settings::AgentSettings;
use support::*;

const P: u32 = 3;

/// A parent active in partition 1; a child in partition 0, adopted (healthy) and created.
fn adopted_child() -> (World, World, ResourceRef, ResourceRef) {
    let mut parents = World::with_partitions(1, P);
    parents.agent = agent_in("pa", 1, P);
    parents.active();
    let parent = parents.rref();
    let mut children = World::with_partitions(0, P);
    children.agent = agent_in("ch", 0, P);
    children.advance(Millis(1));
    children.registered();
    let of = parent.clone();
    children.pending_with(|c| c.parent = Some(of));
    let born = children.source_of(&children.d.outcomes().last().unwrap().clone(), "resource-allocated");
    let child = children.rref();
    let (_, answer) = adoption(&mut parents, &parent, &child, born);
    assert_eq!(answer.parent_state, ParentState::Healthy);
    assert_eq!(effect_names(&children.sys(answer)), ["upstream-flagged"]);
    children.created();
    (parents, children, parent, child)
}

fn cascade(child: &ResourceRef, parent: &ResourceRef, state: ParentState, source: Source) -> Cascade {
    Cascade { child: child.clone(), parent: parent.clone(), parent_state: state, source, answers: None }
}

/// A cascade from a partition where the parent cannot live is refused; a made-up position far ahead in the right
/// partition can no longer keep a child alive when its parent leaves: `left` is final and always taken.
#[test]
fn a_made_up_cascade_source_cannot_keep_a_child_of_a_departed_parent_alive() {
    let (mut parents, mut children, parent, child) = adopted_child();
    let elsewhere = Source { partition: 2, position: Position(1) };
    refused(
        &mut children,
        |w| w.sys(cascade(&child, &parent, ParentState::Healthy, elsewhere)),
        Invalid,
        &["lives in partition 1"],
    );
    let far_ahead = Source { partition: 1, position: Position(1_000_000) };
    assert_eq!(
        effect_names(&children.sys(cascade(&child, &parent, ParentState::Healthy, far_ahead))),
        ["upstream-flagged"]
    );
    let released = parents.release();
    let left = cascade(&child, &parent, ParentState::Left, parents.source_of(&released, "resource-releasing"));
    assert_eq!(effect_names(&children.sys(left)), ["resource-releasing"]);
    settle(&children);
}

/// A claim whose source is not in the holder's partition is refused; a made-up claim from the right partition no
/// longer makes the holder's real claim stale (only the claim that ended, sent again, is).
#[test]
fn a_made_up_claim_cannot_make_the_real_claim_stale() {
    let mut w = World::with_partitions(0, 1);
    w.registered();
    accepted(&w.define_slots("ips", 4, secs(0)));
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let holder = w.rref();
    let real = w.wanted_by("ips");
    let made_up = Source { partition: 0, position: Position(real.position.0 + 1000) };
    let refused_elsewhere =
        w.sys(Claim { pool: pool_name("ips"), holder: holder.clone(), source: Source { partition: 5, ..real } });
    assert_eq!(
        rejected(&refused_elsewhere, Invalid),
        format!("{holder} lives in partition 0; a claim about it cannot come from partition 5 {}", real.position)
    );
    let grant = w.granted_claim(&pool_name("ips"), &holder, made_up);
    let token = grant.token;
    let back = w.sys(grant);
    assert_eq!(effect_names(&back), ["grant-returned"]);
    let free = Free {
        pool: pool_name("ips"),
        holder: holder.clone(),
        token: Some(token),
        source: w.source_of(&back, "grant-returned"),
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    };
    let elsewhere = Free { source: Source { partition: 5, ..free.source }, ..free.clone() };
    refused(&mut w, |w| w.sys(elsewhere), Invalid, &["a free about it cannot come from partition 5"]);
    assert_eq!(effect_names(&w.sys(free)), ["claim-freed"]);
    // The real claim is served; the made-up one, sent again, is stale.
    assert_eq!(
        effect_names(&w.sys(Claim { pool: pool_name("ips"), holder: holder.clone(), source: real })),
        ["claim-granted"]
    );
    settle(&w);
}

/// DESIGN 5 and 6: an agent creates a resource once its create is ordered, and cannot report what it did not know
/// of as of its report's watermark.
#[test]
fn nothing_turns_active_before_its_create_was_ordered() {
    let mut w = World::new();
    w.registered();
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let (agent, waiting) = (w.a(), w.r());
    refused(&mut w, |w| w.report_created(&agent, waiting), InvalidState, &["was never ordered created"]);
    let watermark = w.state().last_position();
    w.pending();
    let later = w.r();
    let report = w.sync(&agent, |r| {
        r.watermark = watermark;
        r.created = vec![waiting, later];
    });
    assert_eq!(effect_names(&report)[0], "observation-accepted");
    assert_eq!((state_name(&w, waiting), state_name(&w, later)), ("pending", "pending"));
    settle(&w);
}

/// A pending child whose parent turns suspect keeps its waiting leases waiting when it is created (no new leases
/// under a suspect parent); they are granted when the parent is healthy again.
#[test]
fn waiting_leases_wait_while_the_parent_is_suspect() {
    let mut w = World::new();
    w.active();
    let parent = w.rref();
    let of = parent.clone();
    w.pending_with(|c| c.parent = Some(of));
    let child = w.rref();
    w.leased(None);
    let suspect = w.operator_failure(&parent, "x");
    let flagged = cascade(&child, &parent, ParentState::Suspect, w.source_of(&suspect, "resource-suspect"));
    assert_eq!(effect_names(&w.sys(flagged)), ["upstream-flagged"]);
    assert_eq!(
        effect_names(&w.report_created(&child.agent, child.resource)),
        ["observation-accepted", "resource-activated"]
    );
    // The parent recovers; the cascade (in one partition: "look at your parent") clears the flag.
    assert_eq!(effect_names(&w.health_of(parent.resource, true, "ok")), ["observation-accepted", "resource-healthy"]);
    let healthy = Source { partition: 0, position: w.state().last_position() };
    let cleared = w.sys(cascade(&child, &parent, ParentState::Healthy, healthy));
    assert_eq!(effect_names(&cleared), ["upstream-flagged", "lease-granted"]);
    settle(&w);
}

/// A health check asked for before the resource turned suspect again says nothing of the new failure.
#[test]
fn a_health_result_for_a_check_asked_before_the_latest_failure_is_refused() {
    let mut w = World::new();
    w.active();
    let (agent, resource) = (w.a(), w.r());
    accepted(&w.operator_failure(&w.rref(), "first"));
    let first = w.sys(RequestHealthCheck { agent: agent.clone(), resource });
    let first_ask = w.source_of(&first, "health-check-requested").position;
    let second = w.sys(RequestHealthCheck { agent: agent.clone(), resource });
    let second_ask = w.source_of(&second, "health-check-requested").position;
    // A result must answer the check the resource waits for: the latest one asked, and one the log has reached.
    let beyond = Position(w.state().last_position().0 + 1);
    refused(
        &mut w,
        |w| w.health_result(beyond, true),
        Invalid,
        &["the check asked for at", "is beyond the last position"],
    );
    refused(&mut w, |w| w.health_result(first_ask, true), StaleObservation, &["waits for is #"]);
    assert_eq!(effect_names(&w.health_result(second_ask, true)), ["observation-accepted", "resource-healthy"]);
    accepted(&w.operator_failure(&w.rref(), "again"));
    refused(
        &mut w,
        |w| w.health_result(second_ask, true),
        StaleObservation,
        &["the check resource", "waits for is none"],
    );
    assert_eq!(state_name(&w, resource), "suspect");
    settle(&w);
}

/// Only a sync report, which names every difference, clears a tripped breaker; a chunk sees one range.
#[test]
fn a_chunk_never_clears_the_breaker() {
    let mut w = World::new();
    w.registered();
    let made = w.active_n(10);
    let agent = w.a();
    let missing = made[4..].to_vec();
    let tripped = w.sync(&agent, |r| r.missing = missing);
    assert!(effect_names(&tripped).contains(&"agent-suspect"));
    let chunk = chunk(&mut w, Uuid::nil(), Some(made[4].as_uuid()), made[..4].to_vec(), vec![]);
    let outcome = w.agent_says(chunk);
    assert!(!effect_names(&outcome).contains(&"agent-breaker-cleared"), "{:?}", effect_names(&outcome));
    assert!(w.state().agent(&agent).unwrap().is_suspect());
    settle(&w);
}

/// A lease renewed every minute kept a day of command ids in memory. The lease now remembers its last renew: a
/// retry of it is "already decided", an older renew is stale, and renews never fill the recent-command memory.
#[test]
fn renews_are_remembered_by_their_lease() {
    let mut w = World::new();
    w.active().leased(Some(Millis::from_mins(5)));
    let (agent, lease, token) = (w.a(), w.l(), w.token());
    let before = w.state().n_recent_commands();
    let mut renews = Vec::new();
    for _ in 0..60 {
        w.advance(Millis::from_mins(1));
        let renew = w.d.envelope(OP, Renew { agent: agent.clone(), lease, token, ttl: None });
        assert_eq!(effect_names(&w.d.submit_envelope(&renew)), ["lease-renewed"]);
        renews.push(renew);
    }
    assert_eq!(w.state().n_recent_commands(), before, "renews are not kept among recent commands");
    let last = renews.last().unwrap();
    let decided = w.d.parts_of(w.state().cursor())[0].cmd_seq;
    w.d.submit_envelope(last);
    assert_eq!(w.d.last_answer(), Answer::AlreadyDecided { cmd_seq: decided });
    refused(&mut w, |w| w.d.submit_envelope(&renews[10]), StaleCommand, &["this renew's id is older"]);
    // Once the lease has ended, an old renew retried is still stale, not "the lease is released" (a second
    // decision of the same command, found by the soak).
    accepted(&w.op(ReleaseLease { agent, lease, token: Some(token) }));
    refused(&mut w, |w| w.d.submit_envelope(&renews[20]), StaleCommand, &["this renew's id is older"]);
    w.d.submit_envelope(last);
    assert_eq!(w.d.last_answer(), Answer::AlreadyDecided { cmd_seq: decided });
    settle(&w);
}

/// Heartbeats are recorded at most every third of `stall_after`: a `stall_after` too short to coalesce them is
/// refused.
#[test]
fn a_stall_after_too_short_to_coalesce_heartbeats_is_refused() {
    let mut w = World::new();
    let agent = w.a();
    let settings = AgentSettings { stall_after: Millis(2), ..AgentSettings::default() };
    refused(&mut w, |w| w.register_with(&agent, settings, false), Invalid, &["stall_after (2ms) must be at least 3s"]);
}

/// An adoption of a parent whose id is another agent's resource in that partition: that parent can never exist, so
/// it has left (not "ask again later" for a whole horizon).
#[test]
fn an_adoption_of_another_agents_resource_id_is_left() {
    let mut parents = World::with_partitions(1, P);
    parents.agent = agent_in("pa", 1, P);
    parents.active();
    let someone_elses = ResourceRef::new(agent_in("qa", 1, P), parents.r());
    let child = ResourceRef::new(agent_in("ch", 0, P), ResourceId::from_parts(T0.0, [4; 10]));
    let source = Source { partition: 0, position: Position(7) };
    let from_elsewhere =
        Adopt { parent: someone_elses.clone(), child: child.clone(), source: Source { partition: 2, ..source } };
    refused(
        &mut parents,
        |w| w.sys(from_elsewhere),
        Invalid,
        &["lives in partition 0; its allocation cannot come from"],
    );
    let adopted = parents.sys(Adopt { parent: someone_elses, child, source });
    assert!(matches!(
        adopted.effects()[0],
        leasehold_schemas::outcome::Effect::ChildAdopted { parent_state: ParentState::Left, .. }
    ));
}

// --- a second round -------------------------------------------------------------------------------------------

/// A bind of the identifier a resource already holds, with a made-up token, used to bind it; the real grant then
/// went back and was freed at the pool while the resource used it: two live holders. Now the grant's source must be
/// its position in the pool's partition, and a grant of the identifier a resource holds is never sent back.
#[test]
fn a_grant_of_the_identifier_in_use_is_never_sent_back() {
    let mut w = World::new();
    w.registered();
    accepted(&w.define_slots("ips", 1, secs(0)));
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let holder = w.rref();
    let wanted = w.wanted_by("ips");
    let real = w.granted_claim(&pool_name("ips"), &holder, wanted);
    let made_up = BindClaim { token: Position(real.token.0 + 1000), ..real.clone() };
    refused(&mut w, |w| w.sys(made_up.clone()), Invalid, &["whose position is the token"]);
    let consistent = BindClaim { source: Source { partition: 0, position: made_up.token }, ..made_up };
    assert_eq!(effect_names(&w.sys(consistent)), ["claim-bound", "create-ordered"]);
    refused(&mut w, |w| w.sys(real), AlreadyDone, &["is not sent back while it is in use"]);
    assert!(w.state().pool(&pool_name("ips")).unwrap().held.contains_key(&leasehold_schemas::pool::PoolValue::Slot(0)));
    settle(&w);
}

/// A suspect cascade from a position the parent's partition may never reach flagged a child for good. The answer to
/// a fresh adoption is taken whatever the child heard, so the sweeper can always undo it.
#[test]
fn a_made_up_source_far_ahead_is_undone_by_asking_again() {
    let (mut parents, mut children, parent, child) = adopted_child();
    let far_ahead = Source { partition: 1, position: Position(1_000_000) };
    assert_eq!(
        effect_names(&children.sys(cascade(&child, &parent, ParentState::Suspect, far_ahead))),
        ["upstream-flagged"]
    );
    let born = Source { partition: 0, position: children.state().resource(child.resource).unwrap().allocated_pos };
    let (_, answer) = adoption(&mut parents, &parent, &child, born);
    assert_eq!(answer.parent_state, ParentState::Healthy);
    assert_eq!(effect_names(&children.sys(answer)), ["upstream-flagged"]);
    assert!(children.state().resource(child.resource).unwrap().upstream_suspect().is_none());
    settle(&children);
}

/// While the breaker holds nothing is marked (a chunk marked losses); and a sync report that knows less than the
/// report that tripped it (an older watermark) does not clear it.
#[test]
fn while_the_breaker_holds_nothing_is_marked_and_only_a_report_that_knows_enough_clears_it() {
    let mut w = World::new();
    w.registered();
    let made = w.active_n(10);
    let agent = w.a();
    let before = w.state().last_position();
    let missing = made[4..].to_vec();
    assert!(effect_names(&w.sync(&agent, |r| r.missing = missing.clone())).contains(&"agent-suspect"));
    let chunk = chunk(&mut w, Uuid::nil(), Some(made[4].as_uuid()), made[..2].to_vec(), vec![]);
    let outcome = w.agent_says(chunk);
    assert!(!effect_names(&outcome).contains(&"resource-lost"), "{:?}", effect_names(&outcome));
    let old = w.sync(&agent, |r| {
        r.watermark = before;
        r.missing = missing;
    });
    assert!(!effect_names(&old).contains(&"agent-breaker-cleared"), "{:?}", effect_names(&old));
    assert!(w.state().agent(&agent).unwrap().is_suspect());
    settle(&w);
}

/// A renew's id stamped far ahead would make every later renew look older: refused.
#[test]
fn a_renew_stamped_far_ahead_is_refused() {
    let mut w = World::new();
    w.active().leased(Some(Millis::from_mins(5)));
    let (agent, lease, token) = (w.a(), w.l(), w.token());
    let mut ahead = w.d.envelope(OP, Renew { agent, lease, token, ttl: None });
    ahead.command_id = CommandId::from_parts(w.d.now().0 + Millis::from_hours(1).0, [7; 10]);
    refused(
        &mut w,
        |w| w.d.submit_envelope(&ahead),
        Invalid,
        &["more than 5min after the log's time", "fix the issuer's clock"],
    );
    settle(&w);
}

/// What an agent was never ordered to create is not the resource, in any state, and does not count in its digest.
#[test]
fn a_never_ordered_resource_is_never_seen() {
    let mut w = World::new();
    w.registered();
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let (agent, never) = (w.a(), w.r());
    accepted(&w.release());
    refused(&mut w, |w| w.report_created(&agent, never), InvalidState, &["was never ordered created"]);
    let report = w.sync_cmd(&agent, |r| r.created = vec![never]);
    assert_eq!(leasehold_domain::expected_listing(w.state(), &report).map(|(count, _)| count), Some(0));
    settle(&w);
}

/// Found by the soak: a holder's claim ended twice with the same source (a made-up claim, then the same source
/// again a day later); the older forget entry, which named its record by source, erased the newer record. Records
/// are named by the position of the effect that ended them.
#[test]
fn a_claim_ended_twice_with_the_same_source_keeps_its_newer_record() {
    let mut w = World::new();
    w.registered();
    accepted(&w.define_slots("ips", 1, secs(0)));
    let pool = pool_name("ips");
    let holder = ResourceRef::new(w.a(), w.d.new_resource_id());
    let (first, second) =
        (Source { partition: 0, position: Position(7) }, Source { partition: 0, position: Position(9) });
    let free = |w: &mut World, token: Position| {
        let source = Source { partition: 0, position: Position(100) };
        accepted(&w.sys(Free {
            pool: pool_name("ips"),
            holder: holder.clone(),
            token: Some(token),
            source,
            cause: leasehold_schemas::outcome::FreeCause::Released {},
        }));
    };
    let grant = w.granted_claim(&pool, &holder, first);
    free(&mut w, grant.token);
    let grant = w.granted_claim(&pool, &holder, second);
    free(&mut w, grant.token);
    w.advance(Millis::from_hours(20));
    let grant = w.granted_claim(&pool, &holder, first);
    free(&mut w, grant.token);
    w.advance(Millis(Millis::from_hours(4).0 + 1));
    accepted(&w.define_slots("other", 1, secs(0)));
    refused(
        &mut w,
        |w| w.sys(Claim { pool: pool.clone(), holder: holder.clone(), source: first }),
        StaleSource,
        &["already ended"],
    );
    settle(&w);
}
