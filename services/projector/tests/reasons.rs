//! What the read models say of issue 16's new facts: every terminal state keeps its reason, a lost resource's
//! handle that comes back is followed through its quarantine (even once the resource's record left the partition
//! state), agents show their driver, quarantine, garbage orders and sticky retirement, the policy shows its gc
//! mode, and a pool counts as cooling only what has not cooled down. Decided by the domain's own driver, folded by
//! the projector, and folded again from sequence 1 to the same digests.

use bytes::Bytes;
use leasehold_domain::driver::Driver;
use leasehold_log::StoredOutcome;
use leasehold_projector::{Projector, ResourceView};
use leasehold_schemas::command::{
    Allocate, Claim, DefinePool, DriverStatus, Free, GarbageReport, MarkGone, Register, Release, ReportCreated,
    ReportDestroyed, RetireAgent, SetPartitionSettings, SyncReport, UnretireAgent,
};
use leasehold_schemas::ids::{AgentName, Millis, PoolName, Position, ResourceId, ResourceRef, Source, Timestamp};
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::settings::GcMode;
use leasehold_schemas::{Outcome, Uuid, codec};

const T0: Timestamp = Timestamp(1_800_000_000_000);

/// Folds the driver's outcomes (partition 0 of 1) into `projector`, from the first not applied yet.
fn feed(projector: &mut Projector, outcomes: &[Outcome]) {
    let from = projector.applied() as usize;
    let batch: Vec<StoredOutcome> = outcomes
        .iter()
        .enumerate()
        .skip(from)
        .map(|(i, outcome)| StoredOutcome {
            seq: i as u64 + 1,
            partition: 0,
            key: outcome.command.key.token(),
            cmd_id: outcome.command.id.to_string(),
            cmd_seq: outcome.cmd_seq,
            part: outcome.part,
            prev_seq: i as u64,
            payload: Bytes::from(codec::encode_outcome(outcome).expect("encode")),
        })
        .collect();
    projector.apply_batch(&batch).expect("the projector applies the driver's outcomes");
}

fn accepted(outcome: Outcome) -> Outcome {
    assert!(outcome.rejection().is_none(), "{outcome:?}");
    outcome
}

/// The position of the first effect named `name`.
fn position_of(outcome: &Outcome, name: &str) -> Position {
    outcome.positioned_effects().find(|(_, e)| e.name() == name).map(|(p, _)| p).unwrap_or_else(|| panic!("{name}"))
}

/// One agent's observations, numbered as its incarnation would.
struct AgentSide {
    name: AgentName,
    epoch: Position,
    obs: u64,
}

impl AgentSide {
    fn register(d: &mut Driver, name: &str, incarnation: u128) -> AgentSide {
        let name = AgentName::new(name).expect("a name");
        let register = Register::new(name.clone(), Uuid::from_u128(incarnation));
        let outcome = accepted(d.submit(name.as_str(), register));
        AgentSide { name, epoch: position_of(&outcome, "agent-registered"), obs: 0 }
    }

    fn next(&mut self) -> u64 {
        self.obs += 1;
        self.obs
    }

    fn allocate_created(&mut self, d: &mut Driver) -> ResourceId {
        let id = d.new_resource_id();
        accepted(d.submit("op:alice", Allocate::new(self.name.clone(), id, "volume", 1)));
        let created = ReportCreated {
            agent: self.name.clone(),
            epoch: self.epoch,
            obs: self.next(),
            resource: id,
            native_id: None,
        };
        accepted(d.submit(self.name.as_str(), created));
        id
    }

    fn says(&mut self, d: &mut Driver, body: impl Into<leasehold_schemas::Command>) -> Outcome {
        accepted(d.submit(self.name.as_str(), body))
    }

    fn garbage(&mut self, d: &mut Driver, handles: Vec<ResourceId>) -> Outcome {
        let watermark = d.state().last_position();
        let report = GarbageReport {
            agent: self.name.clone(),
            epoch: self.epoch,
            obs: self.next(),
            watermark,
            handles,
            dry_run: false,
        };
        self.says(d, report)
    }

    fn destroyed(&mut self, d: &mut Driver, resource: ResourceId, ordered: Position) -> Outcome {
        let report =
            ReportDestroyed { agent: self.name.clone(), epoch: self.epoch, obs: self.next(), resource, ordered };
        self.says(d, report)
    }
}

fn record(projector: &Projector, agent: &AgentName, id: ResourceId) -> ResourceView {
    projector.reader().resource(&ResourceRef::new(agent.clone(), id)).expect("readable").expect("a resource record")
}

#[test]
fn terminal_states_keep_their_reason_and_a_quarantine_is_followed_after_the_record_left_the_state() {
    let mut d = Driver::new(0, 1, T0);
    let mut projector = Projector::in_memory(1).expect("a projection");
    let mut w1 = AgentSide::register(&mut d, "w1", 1);
    let (lost_early, destroyed, lost_in_state) =
        (w1.allocate_created(&mut d), w1.allocate_created(&mut d), w1.allocate_created(&mut d));
    accepted(
        d.submit("op:alice", Release { agent: w1.name.clone(), resource: destroyed, reason: Some("done".into()) }),
    );
    let mut report = SyncReport::new(w1.name.clone(), w1.epoch, w1.next(), d.state().last_position());
    let missing_obs = report.obs;
    report.destroyed = vec![destroyed];
    report.missing = vec![lost_early, lost_in_state];
    let synced = w1.says(&mut d, report);
    assert_eq!(synced.effects().iter().filter(|e| e.name() == "resource-lost").count(), 2, "{synced:?}");
    feed(&mut projector, d.outcomes());

    // destroyed: the release it answered, by whom and why, and that its agent confirmed it.
    let view = record(&projector, &w1.name, destroyed);
    assert_eq!(view.state, "destroyed");
    let detail = view.detail.expect("a destroyed resource says why");
    assert_eq!(detail["release"]["released"]["by"], "op:alice", "{detail}");
    assert_eq!(detail["release"]["released"]["reason"], "done", "{detail}");
    assert_eq!(detail["confirmed_by"], "w1", "{detail}");
    // lost: the observation that found it missing.
    let view = record(&projector, &w1.name, lost_in_state);
    assert_eq!(view.state, "lost");
    let detail = view.detail.expect("a lost resource says why");
    assert_eq!(
        (detail["found_missing_by"].as_str(), detail["observation"]["obs"].as_u64()),
        (Some("w1"), Some(missing_obs))
    );
    assert_eq!(detail["observation"]["epoch"].as_u64(), Some(w1.epoch.0), "{detail}");
    assert!(view.quarantined.is_none());

    // Its handle comes back: quarantined, on the resource's record and counted on its agent's.
    let reappeared = w1.garbage(&mut d, vec![lost_in_state]);
    let found_at = position_of(&reappeared, "handle-reappeared");
    feed(&mut projector, d.outcomes());
    let quarantine = record(&projector, &w1.name, lost_in_state).quarantined.expect("quarantined");
    assert_eq!(
        (quarantine.position, quarantine.found_at, quarantine.destroy_ordered),
        (found_at.0, reappeared.decided_at.0, None)
    );
    assert!(quarantine.is_pending());
    let agent = &projector.reader().agents().expect("agents")[0];
    assert_eq!((agent.quarantined, agent.garbage_orders), (1, 0));
    // Released on record: the state forgets the quarantine, the record keeps it with who ordered the destroy.
    let release =
        Release { agent: w1.name.clone(), resource: lost_in_state, reason: Some("restored by mistake".into()) };
    let ordered = position_of(&accepted(d.submit("op:bob", release)), "garbage-destroy-ordered");
    feed(&mut projector, d.outcomes());
    let quarantine = record(&projector, &w1.name, lost_in_state).quarantined.expect("still followed");
    assert_eq!((quarantine.position, quarantine.destroy_ordered), (found_at.0, Some(ordered.0)));
    assert_eq!(
        (quarantine.released_by.as_deref(), quarantine.reason.as_deref()),
        (Some("op:bob"), Some("restored by mistake"))
    );
    assert!(!quarantine.is_pending());
    let agent = &projector.reader().agents().expect("agents")[0];
    assert_eq!((agent.quarantined, agent.garbage_orders), (0, 1));
    let gone = w1.destroyed(&mut d, lost_in_state, ordered);
    feed(&mut projector, d.outcomes());
    let view = record(&projector, &w1.name, lost_in_state);
    assert_eq!(view.quarantined.expect("followed").destroyed_at, Some(gone.decided_at.0));
    assert_eq!(view.state, "lost", "the resource stays lost: its claims went elsewhere");
    assert_eq!(projector.reader().agents().expect("agents")[0].garbage_orders, 0);

    // The driver cannot list, then the agent is retired, registers again (still retired) and is unretired.
    let unavailable = DriverStatus {
        agent: w1.name.clone(),
        epoch: w1.epoch,
        obs: w1.next(),
        available: false,
        detail: "the root /srv/w1 no longer names agent w1".into(),
    };
    w1.says(&mut d, unavailable);
    feed(&mut projector, d.outcomes());
    let agent = &projector.reader().agents().expect("agents")[0];
    assert!(!agent.driver.available);
    assert_eq!(agent.driver.detail.as_deref(), Some("the root /srv/w1 no longer names agent w1"));
    accepted(d.submit("op:alice", RetireAgent::new(w1.name.clone())));
    let mut w1 = AgentSide::register(&mut d, "w1", 2);
    feed(&mut projector, d.outcomes());
    let agent = &projector.reader().agents().expect("agents")[0];
    assert_eq!(
        (agent.status.as_str(), agent.retired, agent.epoch),
        ("retired", true, w1.epoch.0),
        "retirement is sticky"
    );
    accepted(d.submit("op:alice", UnretireAgent { agent: w1.name.clone() }));
    feed(&mut projector, d.outcomes());
    let agent = &projector.reader().agents().expect("agents")[0];
    assert_eq!((agent.status.as_str(), agent.retired), ("live", false));

    // The policy's gc mode.
    assert_eq!(projector.reader().policies().expect("policies")[0].gc, GcMode::Destroy);
    let settings = SetPartitionSettings {
        key: leasehold_schemas::subjects::settings_key(0, 1),
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: Some(GcMode::DryRun),
        max_priority: None,
    };
    accepted(d.submit("op:alice", settings));
    feed(&mut projector, d.outcomes());
    assert_eq!(projector.reader().policies().expect("policies")[0].gc, GcMode::DryRun);
    let settings = SetPartitionSettings {
        key: leasehold_schemas::subjects::settings_key(0, 1),
        partition: 0,
        outcome_horizon: None,
        policy: None,
        if_no_policy: false,
        gc: Some(GcMode::Destroy),
        max_priority: None,
    };
    accepted(d.submit("op:alice", settings));

    // orphaned: its agent declared gone, and when.
    let mut w2 = AgentSide::register(&mut d, "w2", 3);
    let orphan = w2.allocate_created(&mut d);
    d.advance(Millis::from_hours(25));
    let marked = accepted(d.submit("sweeper-1", MarkGone { agent: w2.name.clone() }));
    feed(&mut projector, d.outcomes());
    let view = record(&projector, &w2.name, orphan);
    assert_eq!(view.state, "orphaned");
    let detail = view.detail.expect("an orphaned resource says why");
    assert_eq!(detail["agent_gone_at"].as_u64(), Some(marked.decided_at.0), "{detail}");
    assert_eq!(
        detail["freed_because"],
        format!("its holder's agent w2 was declared gone at {}", marked.decided_at),
        "{detail}"
    );
    let w2_view = projector.reader().agents().expect("agents").into_iter().find(|a| a.name == "w2").expect("w2");
    assert_eq!(w2_view.gone_at, Some(marked.decided_at.0));

    // A handle of a lost resource whose record left the state after the horizon: its record still follows the
    // quarantine, the order and the destroy, and stays in its state and counts.
    assert!(d.state().resource(lost_early).is_none(), "forgotten after the horizon");
    let lost_before = lost_count(&projector);
    let before = record(&projector, &w1.name, lost_early);
    let reappeared = w1.garbage(&mut d, vec![lost_early]);
    let found_at = position_of(&reappeared, "handle-reappeared");
    feed(&mut projector, d.outcomes());
    let view = record(&projector, &w1.name, lost_early);
    assert_eq!(view.quarantined.as_ref().map(|q| q.position), Some(found_at.0), "{view:?}");
    assert_eq!(view.as_of, projector.applied());
    assert_eq!((view.state.as_str(), &view.detail, view.created_seq), ("lost", &before.detail, before.created_seq));
    let release = Release { agent: w1.name.clone(), resource: lost_early, reason: None };
    let ordered = position_of(&accepted(d.submit("op:carol", release)), "garbage-destroy-ordered");
    let gone = w1.destroyed(&mut d, lost_early, ordered);
    feed(&mut projector, d.outcomes());
    let quarantine = record(&projector, &w1.name, lost_early).quarantined.expect("followed");
    assert_eq!(quarantine.destroy_ordered, Some(ordered.0));
    assert_eq!(quarantine.released_by.as_deref(), Some("op:carol"));
    assert_eq!(quarantine.destroyed_at, Some(gone.decided_at.0));
    assert_eq!(lost_count(&projector), lost_before);

    // Folded again from sequence 1: the same tables.
    let digests = projector.digests().expect("digests");
    projector.drop_all().expect("drop");
    feed(&mut projector, d.outcomes());
    assert_eq!(projector.digests().expect("digests"), digests);
}

fn lost_count(projector: &Projector) -> u64 {
    let counts = projector.reader().counts().expect("counts");
    counts.iter().find(|((what, state), _)| what == "resources" && state == "lost").map_or(0, |(_, n)| *n)
}

/// A pool keeps a freed identifier in its cooling queue until it hands it out again: the record counts only those
/// whose cool-down has not ended as of its outcome, and [`leasehold_projector::PoolView::at`] as of a later time.
#[test]
fn a_pool_counts_as_cooling_only_what_has_not_cooled_down() {
    let mut d = Driver::new(0, 1, T0);
    let mut projector = Projector::in_memory(1).expect("a projection");
    let pool = PoolName::new("ips").expect("a name");
    let define = DefinePool {
        pool: pool.clone(),
        kind: PoolKind::Slots { count: 4 },
        cooldown: Some(Millis::from_hours(2)),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    accepted(d.submit("op:alice", define));
    let agent = AgentName::new("w1").expect("a name");
    let mut n = 0;
    let mut hold_and_free = |d: &mut Driver| {
        n += 1;
        let holder = ResourceRef::new(agent.clone(), d.new_resource_id());
        let source = Source { partition: 0, position: Position(n) };
        let granted = accepted(d.submit("sweeper-1", Claim { pool: pool.clone(), holder: holder.clone(), source }));
        let token = position_of(&granted, "claim-granted");
        accepted(d.submit(
            "sweeper-1",
            Free {
                pool: pool.clone(),
                holder,
                token: Some(token),
                source,
                cause: leasehold_schemas::outcome::FreeCause::Released {},
            },
        ))
    };
    hold_and_free(&mut d);
    d.advance(Millis::from_mins(90));
    let second = hold_and_free(&mut d);
    feed(&mut projector, d.outcomes());
    let view = projector.reader().pools().expect("pools").remove(0);
    let first_until = T0.0 + Millis::from_hours(2).0;
    let second_until = second.decided_at.0 + Millis::from_hours(2).0;
    assert_eq!((view.cooling, view.cooling_until.clone()), (2, vec![first_until, second_until]));
    assert_eq!(view.updated_at, second.decided_at.0);
    // With their identifiers (fresh ones are handed out first: slots 0 then 1), earliest end first.
    let cooling = |view: &leasehold_projector::PoolView| -> Vec<(String, u64)> {
        view.cooling_values.iter().map(|c| (c.value.clone(), c.until)).collect()
    };
    assert_eq!(cooling(&view), [("slot 0".to_owned(), first_until), ("slot 1".to_owned(), second_until)]);
    assert_eq!(cooling(&view.clone().at(first_until)), [("slot 1".to_owned(), second_until)]);
    assert_eq!(view.clone().at(first_until).cooling, 1, "the first cooled down at its end");
    assert_eq!(view.clone().at(T0.0).cooling, 2, "never counted as of before the record's own time");
    assert_eq!(view.at(second_until + 1).cooling, 0);

    // Hours later both have cooled down, though the pool still queues them (it handed out a fresh one).
    d.advance(Millis::from_hours(3));
    hold_and_free(&mut d);
    assert_eq!(d.state().pool(&pool).expect("the pool").cooling.len(), 3, "cooled identifiers stay queued");
    feed(&mut projector, d.outcomes());
    let view = projector.reader().pools().expect("pools").remove(0);
    assert_eq!(view.cooling, 1, "only the one freed just now cools: {view:?}");
    assert_eq!(view.cooling_values.len(), 1, "{view:?}");
}

/// A pool's record names the holders that wait for an identifier, first come first, while they wait.
#[test]
fn a_full_pool_lists_who_waits_for_it() {
    let mut d = Driver::new(0, 1, T0);
    let mut projector = Projector::in_memory(1).expect("a projection");
    let pool = PoolName::new("one").expect("a name");
    let define = DefinePool {
        pool: pool.clone(),
        kind: PoolKind::Slots { count: 1 },
        cooldown: Some(Millis::from_secs(1)),
        orphans: leasehold_schemas::pool::OrphanPolicy::Release,
    };
    accepted(d.submit("op:alice", define));
    let agent = AgentName::new("w1").expect("a name");
    let holders: Vec<ResourceRef> = (0..3).map(|_| ResourceRef::new(agent.clone(), d.new_resource_id())).collect();
    for (n, holder) in holders.iter().enumerate() {
        let source = Source { partition: 0, position: Position(n as u64 + 1) };
        accepted(d.submit("sweeper-1", Claim { pool: pool.clone(), holder: holder.clone(), source }));
    }
    feed(&mut projector, d.outcomes());
    let view = projector.reader().pools().expect("pools").remove(0);
    let waiting: Vec<String> = holders[1..].iter().map(ToString::to_string).collect();
    assert_eq!((view.held, view.waiting, view.waiters.clone()), (1, 2, waiting), "{view:?}");
}
