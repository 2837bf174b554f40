//! Pools that hold an orphan's identifiers, across partitions, against the real decider and the real plan, without a
//! log (issue 19, item 3): an orphan of a pool with `orphans: hold` keeps its identifier until its agent comes back
//! and confirms the destroy, or an operator frees it; the cause travels with the free to the pool's record. Under
//! agents that go silent and come back, and a confused sweeper that sends what stale views planned, twice, in any
//! order, no identifier an orphan holds is ever granted to anyone else.

use std::collections::BTreeMap;

use leasehold_domain::state::{ClaimSlot, Liveness, ResourceState};
use leasehold_schemas::command::{
    Allocate, DefinePool, FreeOrphan, GarbageReport, Heartbeat, Register, Release, ReportDestroyed,
};
use leasehold_schemas::ids::{Millis, Position};
use leasehold_schemas::outcome::{Effect, FreeCause, GarbageCause};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{AgentName, Command, PoolName, ResourceId, ResourceRef, Uuid};
use leasehold_sweeper::plan::Planned;
use proptest::prelude::*;

mod support;

use support::{Confusion, World};

/// Agents that are called stalled after 3 s of silence and gone after 6 s (and a third of 3 s).
fn quick() -> AgentSettings {
    AgentSettings { stall_after: Millis::from_secs(3), orphan_after: Millis::from_secs(6), ..AgentSettings::DEFAULT }
}

fn ips() -> PoolName {
    PoolName::new("ips").unwrap()
}

impl World {
    fn register_quick(&mut self, name: &str) -> AgentName {
        let agent = AgentName::new(name).unwrap();
        let mut body = Register::new(agent.clone(), Uuid::from_u128(u128::from(self.cmd_seq) + 1));
        body.settings = Some(quick());
        self.send(name, body).expect("a registration is appended");
        self.obs.insert(agent.clone(), 0);
        agent
    }

    fn define(&mut self, count: u32, orphans: OrphanPolicy) {
        let body = DefinePool { pool: ips(), kind: PoolKind::Slots { count }, cooldown: Some(Millis(0)), orphans };
        self.send("op:alice", body).expect("defined");
    }

    fn allocate(&mut self, agent: &AgentName) -> ResourceId {
        let id = ResourceId::generate();
        let mut body = Allocate::new(agent.clone(), id, "container", 1);
        body.pools = vec![ips()];
        self.send("producer", body);
        id
    }

    /// Fifteen seconds in steps of three, only `talking` heartbeating, an honest sweeper settling each step: long
    /// enough for a silent agent of [`quick`] settings to be declared gone.
    fn fifteen_seconds_hearing_only(&mut self, talking: &AgentName) {
        for _ in 0..5 {
            self.advance(Millis::from_secs(3));
            self.heartbeat(talking);
            self.settle();
        }
    }

    fn heartbeat(&mut self, agent: &AgentName) {
        let Some(record) = self.state_of(agent).agent(agent) else { return };
        if record.liveness == Liveness::Gone {
            return;
        }
        let epoch = record.epoch;
        self.send(agent.as_str(), Heartbeat { agent: agent.clone(), epoch });
    }

    fn is_gone(&self, agent: &AgentName) -> bool {
        self.state_of(agent).agent(agent).is_some_and(|a| a.liveness == Liveness::Gone)
    }

    /// A gone agent registers again and reports its orphans' handles as garbage; it destroys what is ordered and says
    /// so if `confirm`.
    fn come_back(&mut self, agent: &AgentName, confirm: bool) {
        self.register_quick(agent.as_str());
        let state = self.state_of(agent);
        let handles: Vec<ResourceId> = state
            .resources_of(state.agent(agent).unwrap())
            .filter(|r| matches!(r.state, ResourceState::Orphaned { .. }))
            .map(|r| r.id)
            .collect();
        let epoch = state.agent(agent).unwrap().epoch;
        let watermark = state.last_position();
        let obs = self.next_obs(agent);
        let report = GarbageReport { agent: agent.clone(), epoch, obs, watermark, handles, dry_run: false };
        let Some(outcome) = self.send(agent.as_str(), report) else { return };
        if !confirm {
            return;
        }
        let orders: Vec<(ResourceId, Position)> = outcome
            .positioned_effects()
            .filter_map(|(p, e)| match e {
                Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Orphaned {} } => Some((*handle, p)),
                _ => None,
            })
            .collect();
        for (resource, ordered) in orders {
            let obs = self.next_obs(agent);
            self.send(agent.as_str(), ReportDestroyed { agent: agent.clone(), epoch, obs, resource, ordered });
        }
    }

    /// Every orphan that holds an identifier, with it.
    fn held(&self) -> Vec<(ResourceRef, PoolValue)> {
        self.states
            .values()
            .flat_map(|s| s.resources())
            .filter_map(|r| match r.claims.get(&ips()) {
                Some(ClaimSlot::HeldForOrphan { value, .. }) => Some((r.reference(), *value)),
                _ => None,
            })
            .collect()
    }

    fn free_orphan(&mut self, holder: &ResourceRef, reason: &str) -> Option<leasehold_schemas::Outcome> {
        let body = FreeOrphan {
            agent: holder.agent.clone(),
            resource: holder.resource,
            pool: Some(ips()),
            reason: reason.to_owned(),
        };
        self.send("op:alice", body)
    }

    /// The causes the pool recorded with its frees, by holder.
    fn freed_because(&self) -> BTreeMap<ResourceId, Vec<FreeCause>> {
        let mut causes: BTreeMap<ResourceId, Vec<FreeCause>> = BTreeMap::new();
        for effect in self.effects() {
            if let Effect::ClaimFreedBecause { holder, cause } = effect {
                causes.entry(holder.resource).or_default().push(cause.clone());
            }
        }
        causes
    }

    fn granted_to(&self, resource: ResourceId) -> Option<PoolValue> {
        self.effects().find_map(|e| match e {
            Effect::ClaimGranted { holder, value, .. } if holder.resource == resource => Some(*value),
            _ => None,
        })
    }
}

/// What each policy does when a holder's agent is gone, and how a held identifier comes back: the agent confirms
/// the destroy (cause `orphan-destroyed`), or an operator frees it (`orphan-freed`, with who and why).
#[test]
fn a_held_identifier_waits_for_the_agent_or_an_operator_and_the_pool_records_why() {
    let mut w = World::new();
    let (w1, w2) = (w.register_quick("w1"), w.register_quick("w2"));
    w.define(1, OrphanPolicy::Hold);
    let first = w.allocate(&w1);
    w.settle();
    let value = w.granted_to(first).expect("granted");
    let waiter = w.allocate(&w2);
    w.settle();
    assert_eq!(w.granted_to(waiter), None, "one slot: the second waits");
    // w1 falls silent and is declared gone; w2 keeps talking.
    w.fifteen_seconds_hearing_only(&w2);
    assert!(w.is_gone(&w1));
    assert_eq!(w.held(), vec![(ResourceRef::new(w1.clone(), first), value)], "the orphan keeps it");
    assert_eq!(w.granted_to(waiter), None, "nobody else gets what an orphan holds");
    // w1 comes back and confirms the destroy: the slot goes back with that cause, and the waiter gets it.
    w.come_back(&w1, true);
    w.settle();
    assert!(w.held().is_empty());
    assert_eq!(w.granted_to(waiter), Some(value));
    match w.freed_because().get(&first).map(Vec::as_slice) {
        Some([FreeCause::OrphanDestroyed { .. }]) => {}
        other => panic!("the pool records the confirmed destroy: {other:?}"),
    }

    // The waiter's agent goes silent too; this time an operator frees the slot, on record.
    let third = w.allocate(&w1);
    w.fifteen_seconds_hearing_only(&w1);
    assert!(w.is_gone(&w2));
    assert_eq!(w.held(), vec![(ResourceRef::new(w2.clone(), waiter), value)]);
    assert_eq!(w.granted_to(third), None);
    let refusal = w.free_orphan(&ResourceRef::new(w2.clone(), waiter), "").expect("decided");
    assert!(refusal.rejection().is_some_and(|r| r.message.contains("needs a reason")), "{refusal:?}");
    w.free_orphan(&ResourceRef::new(w2.clone(), waiter), "w2's machine scrapped").expect("decided");
    w.settle();
    assert_eq!(w.granted_to(third), Some(value));
    match w.freed_because().get(&waiter).map(Vec::as_slice) {
        Some([FreeCause::OrphanFreed { by, reason }]) => {
            assert_eq!((by.as_str(), reason.as_str()), ("op:alice", "w2's machine scrapped"));
        }
        other => panic!("the pool records the operator's free: {other:?}"),
    }
}

/// The default policy frees an orphan's identifier at orphaning, as before, and says so.
#[test]
fn release_frees_at_orphaning_as_before() {
    let mut w = World::new();
    let (w1, w2) = (w.register_quick("w1"), w.register_quick("w2"));
    w.define(1, OrphanPolicy::Release);
    let first = w.allocate(&w1);
    w.settle();
    let waiter = w.allocate(&w2);
    w.fifteen_seconds_hearing_only(&w2);
    assert!(w.is_gone(&w1));
    assert!(w.held().is_empty());
    assert_eq!(w.granted_to(waiter), w.granted_to(first), "the orphan's slot went to the waiter");
    // Freed as before schema version 5 (a writer of version 4 reads it): the holder's end says it was orphaned.
    assert_eq!(w.freed_because().get(&first), None);
}

// --- agents that come and go, and a confused sweeper --------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Allocate {
        agent: usize,
    },
    /// The sweeper runs a plan from the view `back` steps ago and sends the due requests in a shuffled order,
    /// some of them twice.
    Sweep {
        back: usize,
        order: u64,
        twice: bool,
    },
    /// Old requests sent again (a retry after the dedupe window, a sweeper restarted from an old state).
    Replay {
        pick: u64,
        n: usize,
    },
    /// Agents heartbeat, except those `silent` names (a bit per agent).
    Time {
        secs: u64,
        silent: u8,
    },
    /// A gone agent registers again and reports its orphans' handles; it confirms the destroys if `confirm`.
    ComeBack {
        agent: usize,
        confirm: bool,
    },
    /// An operator frees the `n`-th held identifier.
    FreeOrphan {
        n: usize,
    },
    /// An operator releases the `n`-th live resource, and its agent confirms the destroy.
    Release {
        n: usize,
        confirm: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..3).prop_map(|agent| Step::Allocate { agent }),
        5 => (0usize..6, any::<u64>(), any::<bool>()).prop_map(|(back, order, twice)| Step::Sweep { back, order, twice }),
        2 => (any::<u64>(), 1usize..6).prop_map(|(pick, n)| Step::Replay { pick, n }),
        3 => (1u64..5, 0u8..8).prop_map(|(secs, silent)| Step::Time { secs, silent }),
        1 => (0usize..3, any::<bool>()).prop_map(|(agent, confirm)| Step::ComeBack { agent, confirm }),
        1 => (0usize..4).prop_map(|n| Step::FreeOrphan { n }),
        1 => (0usize..8, any::<bool>()).prop_map(|(n, confirm)| Step::Release { n, confirm }),
    ]
}

/// Walks the outcomes decided so far, in the order they were decided: from an orphan's `claim-held-for-orphan` to
/// its `claim-releasable` of that identifier, the pool grants it to nobody. And in every partition's state, an
/// identifier an orphan holds is the pool's record of that orphan, and bound to no one else.
fn check(w: &World) {
    let mut held: BTreeMap<PoolValue, ResourceRef> = BTreeMap::new();
    for outcome in &w.outcomes {
        let agent = match &outcome.command.key {
            leasehold_schemas::Key::Agent(agent) => Some(agent),
            _ => None,
        };
        for effect in outcome.effects() {
            match effect {
                Effect::ClaimHeldForOrphan { resource, value, .. } => {
                    let holder = ResourceRef::new(agent.expect("in the holder's partition").clone(), *resource);
                    assert!(held.insert(*value, holder).is_none(), "{value} held for two orphans");
                }
                Effect::ClaimReleasable { resource, value: Some(value), .. }
                    if held.get(value).is_some_and(|h| h.resource == *resource) =>
                {
                    held.remove(value);
                }
                Effect::ClaimGranted { holder, value, .. } => {
                    assert!(
                        !held.contains_key(value),
                        "{value} granted to {holder} while orphan {} holds it",
                        held[value]
                    );
                }
                _ => {}
            }
        }
    }
    let pool_home = w.states.values().find_map(|s| s.pool(&ips()));
    let Some(pool) = pool_home else { return };
    for (holder, value) in w.held() {
        assert_eq!(pool.held.get(&value), Some(&holder), "the pool's record of {value} is not orphan {holder}");
        for state in w.states.values() {
            for r in state.resources().filter(|r| r.reference() != holder) {
                let bound = matches!(r.claims.get(&ips()), Some(ClaimSlot::Bound { value: v, .. }) if *v == value);
                assert!(!bound, "{value} is bound to {} while orphan {holder} holds it", r.reference());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_identifier_an_orphan_holds_is_granted_to_anyone_else(steps in proptest::collection::vec(step(), 1..80)) {
        let mut w = World::new();
        // Spread over the partitions: each agent, and the pool, may be decided in a partition of its own.
        let agents = [w.register_quick("w1"), w.register_quick("w2"), w.register_quick("w3")];
        w.define(3, OrphanPolicy::Hold);
        let mut confused = Confusion::new(&w);
        for step in steps {
            match step {
                Step::Allocate { agent } => {
                    w.allocate(&agents[agent]);
                }
                Step::Sweep { back, order, twice } => confused.sweep(&mut w, back, order, twice),
                Step::Replay { pick, n } => confused.replay(&mut w, pick, n),
                Step::Time { secs, silent } => {
                    w.advance(Millis::from_secs(secs));
                    for (i, agent) in agents.iter().enumerate() {
                        if silent & (1 << i) == 0 {
                            w.heartbeat(agent);
                        }
                    }
                }
                Step::ComeBack { agent, confirm } => {
                    if w.is_gone(&agents[agent]) {
                        w.come_back(&agents[agent], confirm);
                    }
                }
                Step::FreeOrphan { n } => {
                    let held = w.held();
                    if let Some((holder, _)) = held.get(n % held.len().max(1)).cloned() {
                        w.free_orphan(&holder, "machine scrapped");
                    }
                }
                Step::Release { n, confirm } => {
                    if let Some((agent, id)) = w.nth_resource(n, |r| !r.state.has_left()) {
                        w.send("producer", Release { agent: agent.clone(), resource: id, reason: None });
                        if confirm && !w.is_gone(&agent) {
                            w.destroyed(&agent, id);
                        }
                    }
                }
            }
            check(&w);
            confused.remember(&w);
        }
        // An honest sweeper, and an operator who frees what orphans still hold: every identifier whose holder ended
        // is back in the pool, and the pool recorded why for each orphan's.
        w.settle();
        for (holder, _) in w.held() {
            w.free_orphan(&holder, "end of the test");
        }
        w.settle();
        check(&w);
        prop_assert!(w.held().is_empty());
        let pool = w.states.values().find_map(|s| s.pool(&ips())).expect("defined");
        for (value, holder) in &pool.held {
            let state = w.state_of(&holder.agent);
            let ended = state.resource(holder.resource).is_none_or(|r| r.state.is_terminal());
            prop_assert!(!ended, "{value} is still held by {holder}, which ended");
        }
        let orphan_frees: usize = w
            .freed_because()
            .values()
            .flatten()
            .filter(|c| matches!(c, FreeCause::OrphanDestroyed { .. } | FreeCause::OrphanFreed { .. }))
            .count();
        let orphans_let_go = w.effects().filter(|e| matches!(e, Effect::ClaimReleaseCause { .. })).count();
        prop_assert_eq!(orphan_frees, orphans_let_go, "every orphan's identifier let go is freed with its cause");
    }
}

// --- red team (issue 19 item 3) -----------------------------------------------------------------------------------

/// Granted while the pool holds an orphan's identifiers; the pool is updated to `release` before the sweeper carries
/// the grant. "A new policy reaches holders granted after it (a holder keeps the policy of its grant)": this holder was
/// granted before, so its orphan holds. The bind carried the pool's policy as the sweeper saw it when it planned,
/// not as it was when the pool granted: the orphan's slot went to the waiter at orphaning.
#[test]
fn a_holder_keeps_the_policy_of_its_grant_when_the_pool_changes_before_the_bind() {
    let mut w = World::new();
    let (w1, w2) = (w.register_quick("w1"), w.register_quick("w2"));
    w.define(1, OrphanPolicy::Hold);
    let first = w.allocate(&w1);
    // The sweeper sends everything but the bind: the pool grants.
    for _ in 0..10 {
        let due: Vec<Planned> = w.due().into_iter().filter(|p| !matches!(p.command, Command::BindClaim(_))).collect();
        if due.is_empty() {
            break;
        }
        for item in due {
            w.send("sweeper:a", item.command);
        }
    }
    let value = w.granted_to(first).expect("granted under hold");
    let update = leasehold_schemas::command::UpdatePool {
        pool: ips(),
        kind: PoolKind::Slots { count: 1 },
        cooldown: None,
        orphans: Some(OrphanPolicy::Release),
    };
    w.send("op:alice", update).expect("updated");
    w.settle();
    let waiter = w.allocate(&w2);
    w.fifteen_seconds_hearing_only(&w2);
    assert!(w.is_gone(&w1));
    assert_eq!(w.held(), vec![(ResourceRef::new(w1.clone(), first), value)], "granted under hold: the orphan keeps it");
    assert_eq!(w.granted_to(waiter), None, "nobody else gets what an orphan granted under hold holds");
}

/// Pools with the default policy work as before across an upgrade: the README's order upgrades sweepers before the
/// workers, and a worker of schema version 4 dead-letters a command written in version 5. The free of a default
/// pool's orphan carried no cause before this feature (version 1); now it carries `orphaned`, which needs version 5,
/// so until every writer is upgraded an orphan's identifier of a default pool is never freed (and each sweep sends
/// one more dead letter).
#[test]
fn a_default_pools_orphan_free_is_read_by_a_writer_of_version_4() {
    let mut w = World::new();
    let (w1, w2) = (w.register_quick("w1"), w.register_quick("w2"));
    w.define(1, OrphanPolicy::Release);
    let first = w.allocate(&w1);
    w.settle();
    let mut versions = Vec::new();
    for _ in 0..5 {
        w.advance(Millis::from_secs(3));
        w.heartbeat(&w2);
        for _ in 0..10 {
            let due = w.due();
            if due.is_empty() {
                break;
            }
            for item in due {
                if let Command::Free(free) = &item.command
                    && free.holder.resource == first
                {
                    let envelope = leasehold_schemas::Envelope::new(
                        leasehold_schemas::CommandId::from_parts(w.now.0, [1; 10]),
                        leasehold_schemas::Issuer::new("sweeper:a").unwrap(),
                        w.now,
                        item.command.clone(),
                    );
                    versions.push(envelope.schema_version);
                }
                w.send("sweeper:a", item.command);
            }
        }
    }
    assert!(w.is_gone(&w1));
    assert!(!versions.is_empty(), "the orphan's slot is freed");
    assert!(versions.iter().all(|v| *v <= 4), "written in schema versions {versions:?}: an older writer refuses it");
}
