//! The nine command sequences a review found that broke DESIGN's promises (issue 10), each a named regression test
//! of the mechanism that fixed it (each doc says what the decider did before):
//!
//! 1-2. a split decision whose later parts were decided after other commands (a newer observation applied first;
//!      the breaker blind to losses a continuation had yet to mark): a decision is now one outcome in parts and the
//!      core refuses anything between them;
//! 3.   outcomes over the cap from commands under the codec's limit;
//! 4.   a grant sent back, bound later by a re-sent bind;
//! 5.   a forget entry erasing a newer record of the same holder;
//! 6.   a cascade from before a child's birth flagging it;
//! 7.   idempotency and forgotten ids when the horizon grows;
//! 8.   future-stamped ids reused after they were forgotten;
//! 9.   a bind for a pool the resource never claimed, rejected instead of sent back (the pool kept it).

mod support;

use leasehold_domain::{MAX_MESSAGE_BYTES, WriterError};
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::codec::{self, MAX_COMMAND_BYTES, MAX_OUTCOME_BYTES};
use leasehold_schemas::command::*;
use leasehold_schemas::ids::*;
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::{Envelope, Outcome, Uuid};
use support::*;

// --- helpers --------------------------------------------------------------------------------------------------

/// `n` pending resources of capacity 64, each with 64 waiting leases (holders of 128 bytes): activating one is a
/// heavy unit of work.
fn heavy_pending(w: &mut World, n: usize) -> Vec<ResourceId> {
    let mut made = Vec::new();
    for _ in 0..n {
        w.pending_with(|c| c.capacity = 64);
        for _ in 0..64 {
            let lease = w.d.new_lease_id();
            let cmd = Acquire {
                agent: w.a(),
                resource: w.r(),
                lease,
                holder: "h".repeat(leasehold_domain::MAX_HOLDER_BYTES),
                ttl: None,
                wait_timeout: None,
                priority: 0,
            };
            assert_eq!(effect_names(&w.op(cmd)), ["lease-waiting"]);
        }
        made.push(w.r());
    }
    made
}

fn agent_envelope(w: &mut World, body: impl Into<leasehold_schemas::Command>) -> Envelope {
    let body = body.into();
    let Key::Agent(agent) = body.key() else { panic!("an agent's command") };
    w.d.envelope(agent.as_str(), body)
}

/// Appends the remaining parts of the pending decision, first offering `interloper` before each (the core must
/// refuse it: nothing comes between the parts of a decision). Returns the parts appended.
fn finish_refusing(w: &mut World, interloper: &Envelope) -> Vec<Outcome> {
    let mut parts = Vec::new();
    while let Some(pending) = w.state().pending().cloned() {
        let err = w.d.try_submit_envelope(interloper).expect_err("refused between parts");
        assert_eq!(err, WriterError::PartsPending { cmd_seq: pending.cmd_seq, next_part: pending.next_part() });
        parts.push(w.d.continue_pending().expect("pending"));
    }
    parts
}

fn losses_in(outcomes: &[Outcome]) -> usize {
    outcomes.iter().flat_map(|o| o.effects()).filter(|e| matches!(e, Effect::ResourceLost { .. })).count()
}

/// A pool `ips` of one slot in this partition, with no cool-down.
fn one_slot_pool(w: &mut World) -> PoolName {
    accepted(&w.define_slots("ips", 1, Millis(0)));
    pool_name("ips")
}

fn grant_of(outcome: &Outcome) -> (PoolValue, Position) {
    outcome
        .positioned_effects()
        .find_map(|(p, e)| match e {
            Effect::ClaimGranted { value, .. } => Some((*value, p)),
            _ => None,
        })
        .expect("a grant")
}

// --- 1 ---------------------------------------------------------------------------------------------------------

/// A heavy sync report (40 pending resources with 64 waiting leases each, created; one active resource V missing)
/// takes several parts. A newer observation (a resync chunk over V's range holding exactly V) offered between the
/// parts is refused by the core; it is decided after the last part, on the state the whole report left. Before,
/// the report continued in a `sys.continue` decided after the chunk, and marked V lost although a newer observation
/// had just seen it.
#[test]
fn seq1_a_newer_observation_cannot_come_between_the_parts_of_a_report() {
    for releasing in [false, true] {
        let mut w = World::new();
        w.registered();
        let heavy = heavy_pending(&mut w, 40);
        let v = w.active_n(1)[0];
        if releasing {
            accepted(&w.release());
            assert_eq!(state_name(&w, v), "releasing");
        }
        let agent = w.a();
        w.d.finish_parts = false;
        let first = w.sync(&agent, |r| {
            r.created = heavy.clone();
            if releasing { r.destroyed = vec![v] } else { r.missing = vec![v] }
        });
        assert!(first.continues(), "a report this heavy takes several parts");
        let (lo, hi) = just(v);
        let newer = chunk(&mut w, lo, hi, vec![v], vec![]);
        let newer = agent_envelope(&mut w, newer);
        let rest = finish_refusing(&mut w, &newer);
        assert!(!rest.is_empty());
        // V was judged by the report, as of the report (absent there), in the report's parts.
        let v_end = if releasing { "destroyed" } else { "lost" };
        assert_eq!(state_name(&w, v), v_end);
        // The newer chunk comes after: V is terminal, so it changes nothing about V.
        let after = w.d.submit_envelope(&newer);
        assert_eq!(effect_names(&after), ["observation-accepted"]);
        assert!(heavy.iter().all(|id| state_name(&w, *id) == "active"));
        settle(&w);
    }
}

/// The other order: the chunk that sees V present is decided first (its observation number is older); the
/// report's parts come after, and V, seen present by an observation older than the report, is lost by it.
/// Presence now moves forward for an active resource too, so the lost rule's "last observed present by an earlier
/// observation" compares real observations.
#[test]
fn seq1_presence_of_an_active_resource_is_recorded_by_every_observation() {
    let mut w = World::new();
    w.registered();
    let v = w.active_n(1)[0];
    let agent = w.a();
    let activated_at = w.state().resource(v).unwrap().last_present.expect("seen at activation");
    let (lo, hi) = just(v);
    let c = chunk(&mut w, lo, hi, vec![v], vec![]);
    let stamp = ObsStamp { epoch: c.epoch, obs: c.obs };
    assert_eq!(effect_names(&w.agent_says(c)), ["observation-accepted", "resource-seen"]);
    assert_eq!(w.state().resource(v).unwrap().last_present, Some(stamp));
    assert!(stamp > activated_at);
    // A report-created for an active resource (an agent whose watermark lags) records presence too.
    let o = w.report_created(&agent, v);
    assert_eq!(effect_names(&o), ["observation-accepted", "resource-seen"]);
    settle(&w);
}

// --- 2 ---------------------------------------------------------------------------------------------------------

/// 40 heavy pending resources, then two batches of 100 active. Chunk 1 covers the heavy ones and batch 1 and holds
/// only the heavy ones: 100 losses of 200 held, within the limit (more than half trips), and it takes several parts.
/// Chunk 2 covers batch 2 and holds nothing. Before, chunk 2 was decided before chunk 1's continuation had marked
/// anything, saw no loss in the window, and let its 100 through: 200 of 200 lost, the agent never suspect. Now
/// chunk 2 is refused until chunk 1's last part, then sees the 100 in the window and trips the breaker.
#[test]
fn seq2_the_breaker_counts_a_decision_s_losses_as_a_whole() {
    let mut w = World::new();
    w.registered();
    let heavy = heavy_pending(&mut w, 40);
    let batch1 = w.active_n(100);
    let batch2 = w.active_n(100);
    let split = batch2[0].as_uuid();
    w.d.finish_parts = false;
    let c1 = chunk(&mut w, Uuid::nil(), Some(split), heavy.clone(), vec![]);
    let first = w.agent_says(c1);
    assert!(first.continues(), "chunk 1 activates 40 heavy resources: several parts");
    assert!(!first.effects().iter().any(|e| matches!(e, Effect::AgentSuspect { .. })), "100 of 200: within the limit");
    let c2 = chunk(&mut w, split, None, vec![], vec![]);
    let c2 = agent_envelope(&mut w, c2);
    let mut parts = vec![first];
    parts.extend(finish_refusing(&mut w, &c2));
    assert_eq!(losses_in(&parts), 100, "chunk 1 marks its 100 losses, over its parts");
    let agent = w.state().agent(&w.a()).unwrap();
    assert_eq!(
        agent.losses_in_window(w.state().settings_of(agent).loss_window, w.state().now()),
        100,
        "all of them in the window before chunk 2"
    );

    let second = w.d.submit_envelope(&c2);
    assert_eq!(effect_names(&second), ["observation-accepted", "agent-suspect"]);
    assert!(w.state().agent(&w.a()).unwrap().is_suspect());
    assert!(batch2.iter().all(|id| state_name(&w, *id) == "active"), "nothing of chunk 2 marked");
    assert!(batch1.iter().all(|id| state_name(&w, *id) == "lost"));
    settle(&w);
}

// --- 3 ---------------------------------------------------------------------------------------------------------

/// Every command under the codec's 1 MiB limit gives an outcome that encodes under the 512 KiB cap: inputs a
/// rejection would echo are shortened, names to remove are checked, and exclusion lists are bounded.
#[test]
fn seq3_commands_under_the_limit_give_outcomes_under_the_cap() {
    let huge = "k".repeat(900_000);
    let mut w = World::new();
    w.active();
    let (agent, resource) = (w.a(), w.r());
    let new_id = w.d.new_resource_id();
    let allocate = Allocate { kind: huge.clone(), capacity: 1, ..allocation(&agent, new_id) };
    let set_name = Update {
        agent: agent.clone(),
        resource,
        set: [(huge.clone(), "v".to_owned())].into_iter().collect(),
        remove: vec![],
        capacity: None,
        max_lease: None,
    };
    let remove_name = Update {
        agent: agent.clone(),
        resource,
        set: Default::default(),
        remove: vec![huge.clone()],
        capacity: None,
        max_lease: None,
    };
    let exclude = (0..200_000u32).map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + 2 + i)).collect();
    let pool = DefinePool {
        pool: pool_name("big"),
        kind: PoolKind::Ipv4 { network: std::net::Ipv4Addr::new(10, 0, 0, 0), prefix_len: 8, exclude },
        cooldown: None,
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    let ports = DefinePool {
        pool: pool_name("ports"),
        kind: PoolKind::Ports { first: 1, last: 65535, exclude: (2..=65535).collect() },
        cooldown: None,
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    let cases: Vec<(&str, leasehold_schemas::Command, &str)> = vec![
        ("allocate with a 900 KB kind", allocate.into(), "bytes)"),
        ("update with a 900 KB attribute name", set_name.into(), "attribute name"),
        ("update removing a 900 KB attribute name", remove_name.into(), "attribute name"),
        ("a /8 with 200,000 exclusions", pool.into(), "excludes 200000 identifiers"),
        ("ports with 65,534 exclusions", ports.into(), "excludes 65534 identifiers"),
    ];
    for (what, body, fragment) in cases {
        let envelope = w.d.envelope(OP, body);
        let bytes = codec::encode_command(&envelope).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(bytes.len() <= MAX_COMMAND_BYTES, "{what}: the command itself is within the limit");
        let outcome = w.d.submit_envelope(&envelope);
        let message = rejected(&outcome, Invalid);
        assert!(message.contains(fragment), "{what}: {message}");
        assert!(message.len() <= MAX_MESSAGE_BYTES, "{what}: a message of {} bytes", message.len());
        let encoded = codec::encode_outcome(&outcome).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(encoded.len() <= MAX_OUTCOME_BYTES);
    }
    settle(&w);
}

// --- 4 ---------------------------------------------------------------------------------------------------------

/// claim(H) is granted with token t before H exists (a confused sweeper made the claim up, naming the position H's
/// claim-wanted will have); bind(H, t) goes straight back because H is unknown; H is allocated; the pool frees t and
/// hands the slot to another holder, who binds it; the sweeper re-sends bind(H, t). Before, H's wanted claim
/// matched and the bind was accepted: one slot, two live holders. Now a grant sent back is never bound here.
#[test]
fn seq4_a_grant_sent_back_is_never_bound_later() {
    let mut w = World::new();
    w.registered();
    let pool = one_slot_pool(&mut w);
    let agent = w.a();
    let h = w.d.new_resource_id();
    let holder = ResourceRef::new(agent.clone(), h);
    let first = w.state().next_position().0;
    // claim-granted at `first`, grant-returned at first+1, resource-allocated at first+2, claim-wanted at first+3.
    let future_wanted = Source { partition: 0, position: Position(first + 3) };
    let bind = w.granted_claim(&pool, &holder, future_wanted);
    let (value, token) = (bind.value, bind.token);
    assert_eq!(effect_names(&w.sys(bind.clone())), ["grant-returned"]);
    let alloc = w.op(Allocate { capacity: 1, pools: vec![pool.clone()], ..allocation(&agent, h) });
    assert_eq!(effect_names(&alloc), ["resource-allocated", "claim-wanted"]);
    assert_eq!(w.source_of(&alloc, "claim-wanted"), future_wanted, "the made-up claim named it exactly");
    let freed = w.sys(Free {
        pool: pool.clone(),
        holder: holder.clone(),
        token: Some(token),
        source: future_wanted,
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    });
    assert_eq!(effect_names(&freed), ["claim-freed"]);
    // Another holder gets the slot and binds it.
    w.pending_with(|c| c.pools = vec![pool_name("ips")]);
    let other = w.rref();
    let wanted = w.wanted_by("ips");
    let bind2 = w.granted_claim(&pool, &other, wanted);
    assert_eq!(bind2.value, value, "the one slot");
    assert_eq!(effect_names(&w.sys(bind2)), ["claim-bound", "create-ordered"]);
    // The sweeper sends bind(H, t) again.
    let message = refused(&mut w, |w| w.sys(bind), AlreadyDone, &["was already sent back"]);
    assert!(message.contains(&holder.to_string()), "{message}");
    assert!(matches!(
        w.state().resource(h).unwrap().claims.get(&pool),
        Some(leasehold_domain::state::ClaimSlot::Wanted { .. })
    ));
    settle(&w);
}

// --- 5 ---------------------------------------------------------------------------------------------------------

/// H's stray claim is freed at T, its own claim at T+20 h. At T+24 h the first entry of the forget queue used to
/// delete the pool's record of H (now the newer one), so a claim re-sent 4 h after it ended was granted instead of
/// refused as stale. Each entry now names the record it was made for.
#[test]
fn seq5_a_forget_entry_erases_only_its_own_record() {
    let mut w = World::new();
    w.registered();
    let pool = one_slot_pool(&mut w);
    let holder = ResourceRef::new(w.a(), w.d.new_resource_id());
    let stray = Source { partition: 0, position: Position(2) };
    let (_, t1) = grant_of(&w.sys(Claim { pool: pool.clone(), holder: holder.clone(), source: stray }));
    accepted(&w.sys(Free {
        pool: pool.clone(),
        holder: holder.clone(),
        token: Some(t1),
        source: stray,
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    }));
    w.advance(Millis::from_hours(20));
    let own = Source { partition: 0, position: Position(50) };
    let (_, t2) = grant_of(&w.sys(Claim { pool: pool.clone(), holder: holder.clone(), source: own }));
    accepted(&w.sys(Free {
        pool: pool.clone(),
        holder: holder.clone(),
        token: Some(t2),
        source: own,
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    }));
    w.advance(Millis(Millis::from_hours(4).0 + 1));
    accepted(&w.define_slots("other", 1, Millis(0)));
    let released = &w.state().pool(&pool).unwrap().released;
    assert_eq!(
        released.get(&holder).map(|(source, _)| source),
        Some(&own),
        "the newer record survives the older entry"
    );
    refused(
        &mut w,
        |w| w.sys(Claim { pool: pool.clone(), holder: holder.clone(), source: own }),
        StaleSource,
        &["already ended"],
    );
    // A horizon after the newer record, it goes too.
    w.advance(Millis::from_hours(20));
    accepted(&w.define_slots("third", 1, Millis(0)));
    assert!(!w.state().pool(&pool).unwrap().released.contains_key(&holder));
    settle(&w);
}

// --- 6 ---------------------------------------------------------------------------------------------------------

/// Two partitions: the parent's and the child's.
fn two_partitions() -> (World, World) {
    let mut parents = World::with_partitions(0, 2);
    parents.agent = agent_in("w", 0, 2);
    parents.registered();
    let mut children = World::with_partitions(1, 2);
    children.agent = agent_in("w", 1, 2);
    children.registered();
    (parents, children)
}

/// A parent in partition 0 turns suspect and recovers; a child is then allocated in partition 1. Before, a late
/// `cascade(suspect)` from before the recovery flagged the newborn child, and the healthy cascade that would clear
/// it had been sent before the child existed. Now a child of a remote parent takes only the answer to its own
/// adoption until it has one, and anything older than that answer after.
#[test]
fn seq6_a_cascade_from_before_a_child_was_born_does_not_flag_it() {
    let (mut parents, mut children) = two_partitions();
    parents.active();
    let parent = parents.rref();
    let suspect = parents.operator_failure(&parent, "flaky");
    let suspect_at = parents.source_of(&suspect, "resource-suspect");
    assert_eq!(effect_names(&parents.health_of(parents.r(), true, "ok")), ["observation-accepted", "resource-healthy"]);

    let alloc_parent = parent.clone();
    children.pending_with(|c| c.parent = Some(alloc_parent));
    let alloc = children.d.outcomes().last().unwrap().clone();
    let child = children.rref();
    let born = children.source_of(&alloc, "resource-allocated");
    let late = Cascade {
        child: child.clone(),
        parent: parent.clone(),
        parent_state: ParentState::Suspect,
        source: suspect_at,
        answers: None,
    };
    refused(&mut children, |w| w.sys(late.clone()), NotYetDue, &["answer to its adoption comes first"]);

    // The adoption: the parent's partition answers with the parent's state as of now.
    let (adopted, answer) = adoption(&mut parents, &parent, &child, born);
    assert_eq!(effect_names(&adopted), ["child-adopted"]);
    assert!(matches!(
        adopted.effects()[0],
        Effect::ChildAdopted { parent_state: ParentState::Healthy, child_source, .. } if child_source == born
    ));
    assert_eq!(effect_names(&children.sys(answer)), ["upstream-flagged"]);
    refused(&mut children, |w| w.sys(late.clone()), StaleSource, &["already heard from its parent"]);
    children.created();
    let acquire = children.acquire_cmd(None, None);
    accepted(&children.op(acquire));

    // A cascade from after the adoption still counts.
    let again = parents.operator_failure(&parent, "flaky again");
    let newer = Cascade { source: parents.source_of(&again, "resource-suspect"), ..late };
    assert_eq!(effect_names(&children.sys(newer)), ["upstream-flagged"]);
    assert!(children.state().resource(child.resource).unwrap().upstream_suspect().is_some());
    settle(&parents);
    settle(&children);
}

/// In one partition the child follows its parent as it is: a late cascade from before the recovery changes nothing.
#[test]
fn seq6_a_child_of_a_local_parent_follows_it_as_it_is() {
    let mut w = World::new();
    w.active();
    let parent = w.rref();
    let suspect = w.operator_failure(&parent, "x");
    let suspect_at = w.source_of(&suspect, "resource-suspect");
    assert_eq!(effect_names(&w.health_of(w.r(), true, "ok")), ["observation-accepted", "resource-healthy"]);
    let alloc_parent = parent.clone();
    w.pending_with(|c| c.parent = Some(alloc_parent));
    let child = w.rref();
    let late = Cascade { child, parent, parent_state: ParentState::Suspect, source: suspect_at, answers: None };
    refused(&mut w, |w| w.sys(late), AlreadyDone, &["already in step with its parent", "which is active"]);
    settle(&w);
}

/// A parent that left before its child was allocated in another partition used to leave the child alive for good
/// (the cascade that releases children was sent before the child existed). Its adoption is answered "left".
#[test]
fn seq6_a_child_of_a_parent_that_already_left_is_released_by_its_adoption() {
    let (mut parents, mut children) = two_partitions();
    parents.active();
    let parent = parents.rref();
    accepted(&parents.release());
    let alloc_parent = parent.clone();
    children.pending_with(|c| c.parent = Some(alloc_parent));
    let alloc = children.d.outcomes().last().unwrap().clone();
    let (child, born) = (children.rref(), children.source_of(&alloc, "resource-allocated"));
    let (adopted, answer) = adoption(&mut parents, &parent, &child, born);
    assert!(matches!(adopted.effects()[0], Effect::ChildAdopted { parent_state: ParentState::Left, .. }));
    assert_eq!(effect_names(&children.sys(answer)), ["resource-releasing"]);
    settle(&parents);
    settle(&children);
}

/// A parent id nobody allocated (stamped now, or ahead within the clock tolerance) used to be answered "not yet"
/// until its time plus the horizon: a question nobody could answer, asked again and again by the sweeper. It is
/// answered "absent" at once, the id is recorded so and never allocated after, and the child is released with the
/// reason.
#[test]
fn seq6_a_child_of_a_parent_nobody_allocated_is_released_at_once() {
    let (mut parents, mut children) = two_partitions();
    parents.registered();
    let nobody = ResourceRef::new(parents.a(), parents.d.new_resource_id());
    let alloc_parent = nobody.clone();
    children.pending_with(|c| c.parent = Some(alloc_parent));
    let alloc = children.d.outcomes().last().unwrap().clone();
    let (child, born) = (children.rref(), children.source_of(&alloc, "resource-allocated"));
    let (adopted, answer) = adoption(&mut parents, &nobody, &child, born);
    assert!(matches!(adopted.effects()[0], Effect::ChildAdopted { parent_state: ParentState::Absent, .. }));
    assert!(parents.state().is_absent(nobody.resource));
    let released = children.sys(answer);
    assert_eq!(effect_names(&released), ["resource-releasing"]);
    assert!(matches!(
        &released.effects()[0],
        Effect::ResourceReleasing { cause: ReleaseCause::ParentAbsent { parent }, .. } if *parent == nobody
    ));
    // The answer stays true: that id is never allocated in the parent's partition.
    let late = Allocate { capacity: 1, ..allocation(&nobody.agent, nobody.resource) };
    refused(&mut parents, |w| w.op(late), AlreadyExists, &["answered \"absent\""]);
    // Until it could not be allocated anyway: then the record goes.
    parents.advance(Millis::from_hours(25));
    let agent = parents.a();
    accepted(&parents.heartbeat(&agent));
    assert!(!parents.state().is_absent(nobody.resource), "forgotten past the horizon");
    settle(&parents);
    settle(&children);
}

/// A parent stamped further ahead than the clock tolerance is refused at allocation: it would never be answered.
#[test]
fn seq6_a_parent_id_stamped_far_ahead_is_refused() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let ahead = ResourceRef::new(agent.clone(), ResourceId::from_parts(T0.0 + Millis::from_hours(2).0, [7; 10]));
    let mut allocate = allocation(&agent, w.d.new_resource_id());
    allocate.parent = Some(ahead);
    refused(&mut w, |w| w.op(allocate), Invalid, &["parent id", "fix the issuer's clock"]);
    settle(&w);
}

// --- 7 ---------------------------------------------------------------------------------------------------------

fn set_horizon(w: &mut World, horizon: Millis) {
    let key = Key::Agent(w.a());
    let body = SetPartitionSettings {
        key,
        partition: 0,
        outcome_horizon: Some(horizon),
        policy: None,
        if_no_policy: false,
        gc: None,
        max_priority: None,
    };
    accepted(&w.op(body));
}

/// Horizon 1 min; a pause with command id X; 2 min later an unpause (X is forgotten); the horizon back to 24 h; X
/// again. Before, X was decided a second time (`resource-paused` again). The partition now refuses any id stamped at
/// or before what it has forgotten.
#[test]
fn seq7_a_command_forgotten_under_a_short_horizon_is_not_decided_again_when_it_grows() {
    let mut w = World::new();
    w.active();
    set_horizon(&mut w, Millis::from_mins(1));
    let (agent, resource) = (w.a(), w.r());
    let pause = w.d.envelope(OP, Pause { agent: agent.clone(), resource, reason: None, until: None });
    assert_eq!(effect_names(&w.d.submit_envelope(&pause)), ["resource-paused"]);
    w.advance(Millis::from_mins(2));
    accepted(&w.op(Unpause { agent: agent.clone(), resource }));
    assert!(w.state().decided_at_seq(pause.command_id).is_none(), "forgotten under the 1 min horizon");
    set_horizon(&mut w, Millis::from_hours(24));
    refused(&mut w, |w| w.d.submit_envelope(&pause), StaleCommand, &["may have been decided before"]);
    assert_eq!(state_name(&w, resource), "active");
    settle(&w);
}

/// The same hole let a forgotten resource id be allocated again.
#[test]
fn seq7_a_resource_id_forgotten_under_a_short_horizon_is_not_allocated_again_when_it_grows() {
    let mut w = World::new();
    w.active();
    let (agent, id) = (w.a(), w.r());
    set_horizon(&mut w, Millis::from_mins(1));
    accepted(&w.release());
    accepted(&w.sync(&agent, |r| r.destroyed = vec![id]));
    w.advance(Millis::from_mins(2));
    accepted(&w.sync(&agent, |_| {}));
    assert!(w.state().resource(id).is_none(), "forgotten");
    set_horizon(&mut w, Millis::from_hours(24));
    let again = Allocate { capacity: 1, ..allocation(&agent, id) };
    refused(&mut w, |w| w.op(again), Invalid, &["choose a fresh UUIDv7"]);
    settle(&w);
}

// --- 8 ---------------------------------------------------------------------------------------------------------

/// A UUIDv7 stamped ahead of the log (within the clock tolerance) is allocated and destroyed. Before, it was
/// forgotten a horizon after it was destroyed and could be allocated again: its id looked fresh. A terminal record is
/// kept until its id could no longer be allocated, and ids stamped further ahead than `MAX_ID_AHEAD` are refused.
#[test]
fn seq8_a_future_stamped_id_is_never_reused() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let ahead = ResourceId::from_parts(T0.0 + Millis::from_mins(4).0, [9; 10]);
    let allocate = Allocate { capacity: 1, ..allocation(&agent, ahead) };
    accepted(&w.op(allocate.clone()));
    accepted(&w.release_of(ahead));
    accepted(&w.sync(&agent, |r| r.destroyed = vec![ahead]));
    w.advance(Millis(Millis::from_hours(24).0 + Millis::from_mins(2).0));
    accepted(&w.sync(&agent, |_| {}));
    assert_eq!(state_name(&w, ahead), "destroyed", "kept while its id could be allocated");
    refused(&mut w, |w| w.op(allocate.clone()), AlreadyExists, &["already exists (destroyed)"]);
    w.advance(Millis::from_mins(3));
    accepted(&w.sync(&agent, |_| {}));
    assert!(w.state().resource(ahead).is_none(), "forgotten once its id is older than the horizon");
    refused(&mut w, |w| w.op(allocate.clone()), Invalid, &["longer ago than the outcome horizon"]);

    let too_far = ResourceId::from_parts(w.d.now().0 + leasehold_domain::MAX_ID_AHEAD.0 + 1, [8; 10]);
    let far = Allocate { resource: too_far, ..allocate };
    refused(&mut w, |w| w.op(far), Invalid, &["fix the issuer's clock"]);
    settle(&w);
}

// --- 9 ---------------------------------------------------------------------------------------------------------

/// A bind for a pool the resource never claimed was rejected, and the pool kept the identifier for a live, known
/// holder: its reconciliation frees only terminal or unknown holders, so it leaked. It now goes straight back.
#[test]
fn seq9_a_bind_for_a_pool_never_claimed_goes_back_and_is_freed() {
    let mut w = World::new();
    w.active();
    let pool = one_slot_pool(&mut w);
    let holder = w.rref();
    let made_up = Source { partition: 0, position: Position(1) };
    let bind = w.granted_claim(&pool, &holder, made_up);
    let token = bind.token;
    let back = w.sys(bind);
    assert_eq!(effect_names(&back), ["grant-returned"]);
    let freed = w.sys(Free {
        pool: pool.clone(),
        holder,
        token: Some(token),
        source: w.source_of(&back, "grant-returned"),
        cause: leasehold_schemas::outcome::FreeCause::Released {},
    });
    assert_eq!(effect_names(&freed), ["claim-freed"]);
    assert!(w.state().pool(&pool).unwrap().held.is_empty(), "the identifier is free again");
    settle(&w);
}

// --- not-yet-due ------------------------------------------------------------------------------------------------

/// DESIGN 4: a `not-yet-due` rejection is not remembered, so the sweeper's same request, sent again when due, is
/// decided then.
#[test]
fn a_request_refused_as_not_yet_due_is_decided_when_sent_again_later() {
    let mut w = World::new();
    w.active().leased(Some(Millis::from_secs(60)));
    let (agent, lease) = (w.a(), w.l());
    let expire = w.d.envelope(SWEEPER, ExpireLease { agent, lease });
    rejected(&w.d.submit_envelope(&expire), NotYetDue);
    assert!(w.state().decided_at_seq(expire.command_id).is_none());
    w.advance(Millis::from_secs(61));
    assert_eq!(effect_names(&w.d.submit_envelope(&expire)), ["lease-expired"]);
    assert!(w.state().decided_at_seq(expire.command_id).is_some(), "decided: remembered now");
    settle(&w);
}
