//! The agent's model of its own outcome subject, and what a sync pass reports from it.
//!
//! This is not the domain's state: the agent sees only its subject, and positions are partition-wide, so it keeps
//! what it needs to act and to report. Per resource: what to make (kind, attributes), whether and where its create
//! was ordered, whether it was ever seen present, whether and where it is releasing, and the health check asked of
//! it. A terminal resource leaves the assignment set; its id is kept (until a listing shows it absent) so that a
//! handle of it still on the machine is reported at once. Garbage is never destroyed on the agent's own judgement:
//! the model keeps the log's orders (`garbage-destroy-ordered`) and the quarantined handles of lost resources
//! (`handle-reappeared`), which nothing touches.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_schemas::command::{HandleDigest, SyncReport};
use leasehold_schemas::outcome::{Effect, Outcome};
use leasehold_schemas::{AgentName, Position, ResourceId, Uuid};

use crate::driver::Spec;

/// What the agent knows of one non-terminal resource, and what it has done about it.
#[derive(Debug, Clone)]
pub(crate) struct Tracked {
    pub(crate) spec: Spec,
    /// The position of `create-ordered`: from there on the agent must make it.
    pub(crate) create_ordered: Option<Position>,
    /// `resource-activated` or `resource-seen`: the writer knows it existed.
    pub(crate) seen_present: bool,
    /// The position of `resource-releasing`: the agent must destroy it.
    pub(crate) releasing: Option<Position>,
    /// The last `health-check-requested` not answered yet.
    pub(crate) health_request: Option<Position>,
    /// This process made it (or was told for good that it cannot be made): no create again.
    pub(crate) create_done: bool,
    /// This process destroyed it: no destroy again unless it shows up again.
    pub(crate) destroy_done: bool,
    /// This process reported it failed (`unhealthy`) since it was last found healthy: not again meanwhile.
    pub(crate) failure_reported: bool,
}

/// A driver call the agent makes for a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Create,
    Destroy,
    /// A health check answering the request at this position.
    Check(Position),
    /// A destroy of a garbage handle the log ordered destroyed at this position.
    Garbage(Position),
}

impl Tracked {
    /// The next call this resource needs, if any: destroy before create before check. A resource released before
    /// its create was ordered is destroyed too (nothing is there: the call only confirms it), so that its destroy is
    /// reported at once and its claims go back without waiting for a sync report.
    pub(crate) fn next_op(&self) -> Option<Op> {
        let ordered = self.create_ordered.is_some();
        match self.releasing {
            Some(_) if !self.destroy_done => Some(Op::Destroy),
            Some(_) => None,
            None if ordered && !self.seen_present && !self.create_done => Some(Op::Create),
            None => self.health_request.map(Op::Check),
        }
    }
}

/// Whether `effect` on an agent's subject says something the agent's next sync report answers: anything but the
/// writer's notes on the agent's own observations and heartbeats (`observation-accepted`, `resource-seen`,
/// `agent-seen`), lease effects, and what changes nothing in the assignment set a report counts (garbage, quarantine,
/// the driver's status, unretirement, a wait's deadline, a lease limit, priority caps). An agent whose subject got nothing material since its last
/// quiet report, and whose holdings are the same, sends none (the log does not grow with idle agents).
pub fn is_material(effect: &Effect) -> bool {
    !matches!(
        effect,
        Effect::ObservationAccepted { .. }
            | Effect::ResourceSeen { .. }
            | Effect::AgentSeen { .. }
            | Effect::GarbageDestroyOrdered { .. }
            | Effect::GarbageDryRun { .. }
            | Effect::GarbageDestroyed { .. }
            | Effect::HandleReappeared { .. }
            | Effect::AgentDriverUnavailable { .. }
            | Effect::AgentDriverAvailable {}
            | Effect::AgentUnretired { .. }
            | Effect::AgentCordoned { .. }
            | Effect::AgentUncordoned { .. }
            | Effect::AgentDeclared { .. }
            | Effect::AllocationWaitsUntil { .. }
            | Effect::DestroyBlocked { .. }
            | Effect::ClaimPoolDefinition { .. }
            | Effect::LeaseWaiting { .. }
            | Effect::LeaseGranted { .. }
            | Effect::LeaseRenewed { .. }
            | Effect::LeaseReleased { .. }
            | Effect::LeaseExpired { .. }
            | Effect::LeaseFailed { .. }
            | Effect::LeaseQueued { .. }
            | Effect::ResourceMaxLeaseChanged { .. }
            | Effect::PriorityCapsChanged { .. }
    )
}

/// Something the runtime must act on after an outcome is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signal {
    Registered {
        incarnation: Uuid,
        epoch: Position,
        retired: bool,
        /// The effective settings at the registration: heartbeats are paced by `stall_after`, and a listing with
        /// many failed handles at once is judged by the loss breaker's thresholds.
        settings: leasehold_schemas::settings::AgentSettings,
    },
    Gone,
    ResyncRequested {
        at: Position,
    },
    /// The resource may need a driver call now.
    Work(ResourceId),
    /// The resource reached a terminal state (`how`: its effect's name).
    Left {
        resource: ResourceId,
        how: &'static str,
    },
    /// The log ordered a garbage handle destroyed (at `at`): the agent destroys it if it is on the machine.
    GarbageOrdered {
        handle: ResourceId,
        at: Position,
    },
    /// A lost resource's handle is quarantined: never touched.
    Quarantined {
        handle: ResourceId,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Model {
    resources: BTreeMap<ResourceId, Tracked>,
    /// Resources that reached a terminal state (by their effect's name), until a listing shows them absent: a handle
    /// of one still on the machine is garbage known to the log, reported without waiting out the creation grace.
    left: BTreeMap<ResourceId, &'static str>,
    /// Handles of lost resources that reappeared, by the position that quarantined them: never touched.
    quarantined: BTreeMap<ResourceId, Position>,
    /// Garbage handles the log ordered destroyed, by handle, with the order's position; until reported destroyed.
    garbage_orders: BTreeMap<ResourceId, Position>,
    /// What the log records of the driver: `Some(why)` while it is recorded unavailable.
    driver_recorded: Option<String>,
    watermark: Position,
    /// The highest position of an effect that says something a report answers: anything but the writer's notes on
    /// the agent's own observations and heartbeats (`observation-accepted`, `resource-seen`, `agent-seen`) and
    /// lease effects. A `resource-seen` answers a report that named the handle (`created`): that report set no
    /// quiet mark, so the pass after it reports anyway; counted as material, it would make an idle agent send one
    /// more report whenever it lands after two quiet passes.
    material: Position,
}

impl Model {
    /// The highest position of the subject applied.
    pub(crate) fn watermark(&self) -> Position {
        self.watermark
    }

    pub(crate) fn len(&self) -> usize {
        self.resources.len()
    }

    /// How many resources the writer knows as created and are not being destroyed.
    pub(crate) fn n_live(&self) -> usize {
        self.resources.values().filter(|t| t.seen_present && t.releasing.is_none()).count()
    }

    pub(crate) fn get(&self, id: ResourceId) -> Option<&Tracked> {
        self.resources.get(&id)
    }

    pub(crate) fn get_mut(&mut self, id: ResourceId) -> Option<&mut Tracked> {
        self.resources.get_mut(&id)
    }

    pub(crate) fn contains(&self, id: ResourceId) -> bool {
        self.resources.contains_key(&id)
    }

    /// How the resource `id` left (its terminal effect), while the model keeps it.
    pub(crate) fn left(&self, id: ResourceId) -> Option<&'static str> {
        self.left.get(&id).copied()
    }

    /// Forgets the ids of resources that left and whose handles are not on the machine any more.
    pub(crate) fn forget_left_absent(&mut self, present: &BTreeSet<ResourceId>) {
        self.left.retain(|id, _| present.contains(id));
    }

    pub(crate) fn is_quarantined(&self, id: ResourceId) -> bool {
        self.quarantined.contains_key(&id)
    }

    pub(crate) fn n_quarantined(&self) -> usize {
        self.quarantined.len()
    }

    /// The position of the log's order to destroy garbage handle `id`, while it is not reported destroyed.
    pub(crate) fn garbage_order(&self, id: ResourceId) -> Option<Position> {
        self.garbage_orders.get(&id).copied()
    }

    pub(crate) fn garbage_orders(&self) -> impl Iterator<Item = (ResourceId, Position)> + '_ {
        self.garbage_orders.iter().map(|(id, at)| (*id, *at))
    }

    /// What the log records of the driver: `Some(why)` while unavailable.
    pub(crate) fn driver_recorded(&self) -> Option<&str> {
        self.driver_recorded.as_deref()
    }

    /// Applies one outcome part of the agent's subject.
    pub(crate) fn apply(&mut self, outcome: &Outcome, signals: &mut Vec<Signal>) {
        for (position, effect) in outcome.positioned_effects() {
            self.apply_effect(position, effect, signals);
            self.watermark = self.watermark.max(position);
            if is_material(effect) {
                self.material = self.material.max(position);
            }
        }
    }

    fn apply_effect(&mut self, position: Position, effect: &Effect, signals: &mut Vec<Signal>) {
        let mut touch = |id: ResourceId, change: &mut dyn FnMut(&mut Tracked)| {
            if let Some(tracked) = self.resources.get_mut(&id) {
                change(tracked);
                signals.push(Signal::Work(id));
            }
        };
        match effect {
            Effect::AgentRegistered { incarnation, retired, settings, .. } => {
                signals.push(Signal::Registered {
                    incarnation: *incarnation,
                    epoch: position,
                    retired: *retired,
                    settings: settings.clone(),
                });
            }
            Effect::AgentGone { .. } => signals.push(Signal::Gone),
            Effect::ResyncRequested { .. } => signals.push(Signal::ResyncRequested { at: position }),
            Effect::ResourceAllocated { resource, kind, attributes, .. } => {
                self.left.remove(resource);
                let spec = Spec { kind: kind.clone(), attributes: attributes.clone(), ..Spec::default() };
                self.resources.insert(
                    *resource,
                    Tracked {
                        spec,
                        create_ordered: None,
                        seen_present: false,
                        releasing: None,
                        health_request: None,
                        create_done: false,
                        destroy_done: false,
                        failure_reported: false,
                    },
                );
            }
            Effect::ResourceUpdated { resource, set, remove, .. } => touch(*resource, &mut |t| {
                t.spec.attributes.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                remove.iter().for_each(|key| {
                    t.spec.attributes.remove(key);
                });
            }),
            Effect::ClaimBound { resource, pool, value, .. } => touch(*resource, &mut |t| {
                t.spec.claims.insert(pool.clone(), crate::driver::Claimed { value: *value, pool: None });
            }),
            Effect::ClaimPoolDefinition { resource, pool, definition } => touch(*resource, &mut |t| {
                if let Some(claimed) = t.spec.claims.get_mut(pool) {
                    claimed.pool = Some(definition.clone());
                }
            }),
            Effect::CreateOrdered { resource } => touch(*resource, &mut |t| t.create_ordered = Some(position)),
            Effect::ResourceActivated { resource, .. } | Effect::ResourceSeen { resource, .. } => {
                touch(*resource, &mut |t| t.seen_present = true)
            }
            Effect::HealthCheckRequested { resource } => touch(*resource, &mut |t| t.health_request = Some(position)),
            Effect::ResourceHealthy { resource } => touch(*resource, &mut |t| {
                t.health_request = None;
                t.failure_reported = false;
            }),
            Effect::ResourceReleasing { resource, .. } => touch(*resource, &mut |t| {
                t.releasing = Some(position);
                t.health_request = None;
            }),
            Effect::ResourceDestroyed { resource, .. }
            | Effect::ResourceLost { resource, .. }
            | Effect::ResourceOrphaned { resource }
            | Effect::ResourceFailed { resource, .. } => {
                let forgotten = self.resources.remove(resource);
                if forgotten.is_some() {
                    self.left.insert(*resource, effect.name());
                    signals.push(Signal::Left { resource: *resource, how: effect.name() });
                }
            }
            Effect::HandleReappeared { resource, .. } => {
                self.quarantined.insert(*resource, position);
                signals.push(Signal::Quarantined { handle: *resource });
            }
            Effect::GarbageDestroyOrdered { handle, .. } => {
                self.quarantined.remove(handle);
                self.garbage_orders.insert(*handle, position);
                signals.push(Signal::GarbageOrdered { handle: *handle, at: position });
            }
            Effect::GarbageDestroyed { handle, .. } => {
                self.garbage_orders.remove(handle);
            }
            Effect::AgentDriverUnavailable { detail } => self.driver_recorded = Some(detail.clone()),
            Effect::AgentDriverAvailable {} => self.driver_recorded = None,
            _ => {}
        }
    }

    /// What a sync pass reports from, as of now: `running(id)` says whether a create or destroy of `id` is running.
    pub(crate) fn view(&self, running: impl Fn(ResourceId) -> bool) -> View {
        let entries = self
            .resources
            .iter()
            .map(|(id, t)| {
                let entry = Entry {
                    ordered: t.create_ordered.is_some(),
                    seen_present: t.seen_present,
                    made: t.create_done,
                    releasing: t.releasing.is_some(),
                };
                (*id, entry)
            })
            .collect::<Vec<_>>();
        let in_flight = entries.iter().filter(|(id, e)| e.ordered && running(*id)).map(|(id, _)| *id).collect();
        View { watermark: self.watermark, material: self.material, entries, in_flight }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    ordered: bool,
    seen_present: bool,
    /// This process made it (and reported it created): gone from the listing, it is missing even before the model
    /// has folded its activation, which the writer may have decided already.
    made: bool,
    releasing: bool,
}

/// A snapshot of the model for one sync pass, taken before the listing.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) watermark: Position,
    /// See [`Model`]'s `material`: two passes with the same one (and the same holdings) have nothing new to say.
    pub(crate) material: Position,
    entries: Vec<(ResourceId, Entry)>,
    in_flight: BTreeSet<ResourceId>,
}

/// The lists, count and digest of a sync report.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Lists {
    pub(crate) created: Vec<ResourceId>,
    pub(crate) missing: Vec<ResourceId>,
    pub(crate) destroyed: Vec<ResourceId>,
    pub(crate) in_flight: Vec<ResourceId>,
    pub(crate) count: u64,
    pub(crate) digest: HandleDigest,
}

impl Lists {
    pub(crate) fn n_named(&self) -> usize {
        self.created.len() + self.missing.len() + self.destroyed.len() + self.in_flight.len()
    }

    /// The report of `agent` in `epoch` that says these lists, as of `watermark`.
    pub(crate) fn into_report(self, agent: AgentName, epoch: Position, obs: u64, watermark: Position) -> SyncReport {
        SyncReport {
            created: self.created,
            missing: self.missing,
            destroyed: self.destroyed,
            in_flight: self.in_flight,
            count: self.count,
            digest: self.digest,
            ..SyncReport::new(agent, epoch, obs, watermark)
        }
    }
}

/// One range of a full resync: in `[lo, hi)` the agent holds exactly `held`, and `in_flight` is running.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) lo: Uuid,
    pub(crate) hi: Option<Uuid>,
    pub(crate) held: Vec<ResourceId>,
    pub(crate) in_flight: Vec<ResourceId>,
}

impl View {
    /// Counts these calls as in flight too (started after the snapshot, during the listing): those of resources
    /// the snapshot knows ordered created; others are not the report's business.
    pub(crate) fn also_in_flight(&mut self, started: BTreeSet<ResourceId>) {
        let ordered: BTreeSet<ResourceId> = self.entries.iter().filter(|(_, e)| e.ordered).map(|(id, _)| *id).collect();
        self.in_flight.extend(started.into_iter().filter(|id| ordered.contains(id)));
    }

    /// The report of `present` (the listing) against the snapshot. A handle is named at most once: in flight
    /// (creates and destroys running: they count as present), else `created` (ordered, not yet seen present, here),
    /// `missing` (seen present, not releasing, gone) or `destroyed` (releasing, gone). `count`/`digest` cover the
    /// handles of resources ordered created that are here or in flight, as the writer counts them; garbage is not
    /// counted.
    pub(crate) fn report(&self, present: &BTreeSet<ResourceId>) -> Lists {
        let mut lists = Lists::default();
        let count = |lists: &mut Lists, id: ResourceId| {
            lists.count += 1;
            lists.digest.add(id);
        };
        for (id, entry) in &self.entries {
            let id = *id;
            let here = present.contains(&id);
            if !entry.ordered {
                // Never to be made: a release of it is confirmed by its absence.
                if entry.releasing && !here {
                    lists.destroyed.push(id);
                }
                continue;
            }
            if self.in_flight.contains(&id) {
                lists.in_flight.push(id);
                count(&mut lists, id);
                continue;
            }
            match (entry.releasing, entry.seen_present, here) {
                (_, false, true) => {
                    lists.created.push(id);
                    count(&mut lists, id);
                }
                (_, true, true) => count(&mut lists, id),
                (true, _, false) => lists.destroyed.push(id),
                (false, true, false) => lists.missing.push(id),
                (false, false, false) if entry.made => lists.missing.push(id),
                (false, false, false) => {}
            }
        }
        lists
    }

    /// The full listing in ranges of at most `per_chunk` handles: every handle of the model here or in flight.
    pub(crate) fn chunks(&self, present: &BTreeSet<ResourceId>, per_chunk: usize) -> Vec<Chunk> {
        let held: Vec<(ResourceId, bool)> = self
            .entries
            .iter()
            .filter_map(|(id, _)| {
                let in_flight = self.in_flight.contains(id);
                (in_flight || present.contains(id)).then_some((*id, in_flight))
            })
            .collect();
        let groups: Vec<&[(ResourceId, bool)]> = held.chunks(per_chunk.max(1)).collect();
        if groups.is_empty() {
            return vec![Chunk { lo: Uuid::nil(), hi: None, held: Vec::new(), in_flight: Vec::new() }];
        }
        groups
            .iter()
            .enumerate()
            .map(|(idx, group)| Chunk {
                lo: if idx == 0 { Uuid::nil() } else { group[0].0.as_uuid() },
                hi: groups.get(idx + 1).map(|next| next[0].0.as_uuid()),
                held: group.iter().filter(|(_, f)| !f).map(|(id, _)| *id).collect(),
                in_flight: group.iter().filter(|(_, f)| *f).map(|(id, _)| *id).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ResourceId {
        ResourceId::from_parts(1_800_000_000_000, [n; 10])
    }

    fn entry(ordered: bool, seen_present: bool, releasing: bool) -> Entry {
        Entry { ordered, seen_present, made: false, releasing }
    }

    /// What the writer bound reaches the driver: each claim's identifier, and an IPv4 pool's definition (the network
    /// the agent puts the address on).
    #[test]
    fn a_bound_claim_and_its_pools_network_reach_the_spec() {
        use leasehold_schemas::PoolName;
        use leasehold_schemas::pool::{PoolKind, PoolValue};
        use std::net::Ipv4Addr;
        let mut model = Model::default();
        let mut signals = Vec::new();
        let (r, pool) = (id(1), PoolName::new("net1").unwrap());
        let definition = PoolKind::Ipv4 {
            network: Ipv4Addr::new(10, 9, 0, 0),
            prefix_len: 29,
            exclude: vec![Ipv4Addr::new(10, 9, 0, 1)],
        };
        let effects = [
            Effect::ResourceAllocated {
                resource: r,
                kind: "container".into(),
                capacity: 1,
                attributes: BTreeMap::from([("network".to_owned(), "lhnet".to_owned())]),
                parent: None,
            },
            Effect::ClaimWanted { resource: r, pool: pool.clone() },
            Effect::ClaimBound {
                resource: r,
                pool: pool.clone(),
                value: PoolValue::Ipv4(Ipv4Addr::new(10, 9, 0, 2)),
                token: Position(7),
            },
            Effect::ClaimPoolDefinition { resource: r, pool: pool.clone(), definition: definition.clone() },
            Effect::CreateOrdered { resource: r },
        ];
        for (n, effect) in effects.iter().enumerate() {
            model.apply_effect(Position(10 + n as u64), effect, &mut signals);
        }
        let tracked = model.get(r).unwrap();
        assert_eq!(tracked.create_ordered, Some(Position(14)));
        let claimed = &tracked.spec.claims[&pool];
        assert_eq!(claimed.value, PoolValue::Ipv4(Ipv4Addr::new(10, 9, 0, 2)));
        assert_eq!(claimed.pool, Some(definition));
        assert_eq!(tracked.spec.attributes["network"], "lhnet");
    }

    #[test]
    fn each_handle_is_named_once_by_the_report_rules() {
        // (entry, in flight, present) -> where it goes, and whether it counts.
        let table = [
            (entry(true, false, false), false, true, "created", true),
            (entry(true, false, false), false, false, "-", false),
            (entry(true, true, false), false, true, "-", true),
            (entry(true, true, false), false, false, "missing", false),
            (entry(true, false, true), false, true, "created", true),
            (entry(true, true, true), false, true, "-", true),
            (entry(true, true, true), false, false, "destroyed", false),
            (entry(true, false, true), false, false, "destroyed", false),
            (entry(true, false, false), true, false, "in_flight", true),
            (entry(true, true, true), true, true, "in_flight", true),
            (entry(false, false, true), false, false, "destroyed", false),
            (entry(false, false, false), false, false, "-", false),
        ];
        for (n, (e, in_flight, here, list, counted)) in table.into_iter().enumerate() {
            let handle = id(n as u8);
            let view = View {
                material: Position::ZERO,
                watermark: Position(9),
                entries: vec![(handle, e)],
                in_flight: if in_flight { BTreeSet::from([handle]) } else { BTreeSet::new() },
            };
            let present = if here { BTreeSet::from([handle]) } else { BTreeSet::new() };
            let lists = view.report(&present);
            let named = [
                ("created", &lists.created),
                ("missing", &lists.missing),
                ("destroyed", &lists.destroyed),
                ("in_flight", &lists.in_flight),
            ];
            let found: Vec<&str> = named.iter().filter(|(_, l)| l.contains(&handle)).map(|(name, _)| *name).collect();
            let expected: Vec<&str> = if list == "-" { vec![] } else { vec![list] };
            assert_eq!(found, expected, "row {n}: {e:?} in flight {in_flight} present {here}");
            assert_eq!(lists.count, u64::from(counted), "row {n}");
        }
    }

    /// A create started after the snapshot and finished before the report: the listing may have missed it, and
    /// the writer saw it made (its `report-created` went first). Named in flight, it counts as the writer counts.
    #[test]
    fn a_call_started_during_the_listing_is_named_in_flight() {
        let (made, unknown) = (id(1), id(2));
        let mut view = View {
            material: Position::ZERO,
            watermark: Position(9),
            entries: vec![(made, entry(true, false, false))],
            in_flight: BTreeSet::new(),
        };
        assert_eq!(view.report(&BTreeSet::new()).count, 0, "without it, the handle is not counted");
        view.also_in_flight(BTreeSet::from([made, unknown]));
        let lists = view.report(&BTreeSet::new());
        assert_eq!(lists.in_flight, vec![made], "a resource the snapshot does not know stays out of the report");
        assert_eq!(lists.count, 1);
    }

    #[test]
    fn chunks_cover_the_id_space_without_gaps() {
        let entries: Vec<_> = (1..=5).map(|n| (id(n), entry(true, true, false))).collect();
        let view = View { watermark: Position(9), material: Position(9), entries, in_flight: BTreeSet::from([id(3)]) };
        let present = BTreeSet::from([id(1), id(2), id(4), id(5), id(9)]);
        let chunks = view.chunks(&present, 2);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].lo, Uuid::nil());
        assert_eq!(chunks[0].hi, Some(id(3).as_uuid()));
        assert_eq!(chunks[1].in_flight, vec![id(3)]);
        assert_eq!(chunks[1].held, vec![id(4)]);
        assert_eq!(chunks[2].hi, None);
        assert!(chunks.iter().all(|c| !c.held.contains(&id(9))), "garbage is not listed");
        assert_eq!(view.chunks(&BTreeSet::new(), 2).len(), 1, "an empty listing is one chunk over everything");
    }

    /// The agent's reports, computed from its own model, agree with the count and digest the writer expects
    /// (`expected_listing`), including when the model lags the writer; and the writer asks for no resync.
    #[test]
    fn reports_match_what_the_writer_expects() {
        use leasehold_domain::driver::Driver as Partition;
        use leasehold_schemas::command::{Allocate, Register, Release, ReportCreated};
        use leasehold_schemas::settings::AgentSettings;
        use leasehold_schemas::{AgentName, Timestamp};

        let w1 = AgentName::new("w1").unwrap();
        let mut partition = Partition::new(0, 1, Timestamp(1_800_000_000_000));
        let mut model = Model::default();
        let mut folded = 0;
        let mut fold = |partition: &Partition, model: &mut Model| {
            for outcome in &partition.outcomes()[folded..] {
                model.apply(outcome, &mut Vec::new());
            }
            folded = partition.outcomes().len();
        };
        let register =
            Register { settings: Some(AgentSettings::default()), ..Register::new(w1.clone(), Uuid::from_u128(1)) };
        let epoch = partition.submit("w1", register).positioned_effects().next().unwrap().0;
        let ids: Vec<ResourceId> = (0..5).map(|_| partition.new_resource_id()).collect();
        for id in &ids[..4] {
            let allocate = Allocate::new(w1.clone(), *id, "dir", 1);
            assert!(partition.submit("op", allocate).rejection().is_none());
        }
        let mut obs = 0;
        let report = |partition: &mut Partition, obs: &mut u64, view: &View, present: &[ResourceId]| {
            *obs += 1;
            let obs = *obs;
            let lists = view.report(&present.iter().copied().collect());
            let report = lists.into_report(w1.clone(), epoch, obs, view.watermark);
            let expected = leasehold_domain::expected_listing(partition.state(), &report).unwrap();
            assert_eq!(expected, (report.count, report.digest), "report {obs}: {report:?}");
            let outcome = partition.submit("w1", report);
            assert!(outcome.rejection().is_none(), "{outcome:?}");
            let names: Vec<&str> = outcome.effects().iter().map(|e| e.name()).collect();
            assert!(!names.contains(&"resync-requested"), "report {obs}: {names:?}");
            names.iter().map(|n| n.to_string()).collect::<Vec<_>>()
        };

        // Two made, one being made, one not started; a garbage handle is on the machine too.
        fold(&partition, &mut model);
        let garbage = ResourceId::from_parts(1_700_000_000_000, [9; 10]);
        let view = model.view(|id| id == ids[2]);
        let names = report(&mut partition, &mut obs, &view, &[ids[0], ids[1], garbage]);
        assert_eq!(names.iter().filter(|n| *n == "resource-activated").count(), 2);

        // The third is reported made on its own; the first is released and destroyed; the fourth is here now.
        obs += 1;
        let created = ReportCreated { agent: w1.clone(), epoch, obs, resource: ids[2], native_id: None };
        assert!(partition.submit("w1", created).rejection().is_none());
        let release = Release { agent: w1.clone(), resource: ids[0], reason: None };
        assert!(partition.submit("op", release).rejection().is_none());
        fold(&partition, &mut model);
        let view = model.view(|_| false);
        let names = report(&mut partition, &mut obs, &view, &[ids[1], ids[2], ids[3], garbage]);
        assert!(names.contains(&"resource-destroyed".to_owned()), "{names:?}");

        // A report from a snapshot that lags the writer: the second is released and a fifth allocated after it.
        fold(&partition, &mut model);
        let view = model.view(|_| false);
        let release = Release { agent: w1.clone(), resource: ids[1], reason: None };
        assert!(partition.submit("op", release).rejection().is_none());
        let allocate = Allocate::new(w1.clone(), ids[4], "dir", 1);
        assert!(partition.submit("op", allocate).rejection().is_none());
        report(&mut partition, &mut obs, &view, &[ids[1], ids[2], ids[3], ids[4]]);

        // The third vanished: missing, then lost; the second is destroyed.
        fold(&partition, &mut model);
        let view = model.view(|_| false);
        let names = report(&mut partition, &mut obs, &view, &[ids[3], ids[4]]);
        assert!(names.contains(&"resource-lost".to_owned()), "{names:?}");
        assert!(names.contains(&"resource-destroyed".to_owned()), "{names:?}");
        fold(&partition, &mut model);
        assert_eq!(model.len(), 2, "two resources are left");
    }

    /// A sync report made from the model as it is, while the partition has decided more than the model folded.
    struct Lagging {
        w1: leasehold_schemas::AgentName,
        partition: leasehold_domain::driver::Driver,
        model: Model,
        folded: usize,
        epoch: Position,
        obs: u64,
    }

    impl Lagging {
        fn new() -> Self {
            use leasehold_schemas::command::Register;
            let w1 = leasehold_schemas::AgentName::new("w1").unwrap();
            let mut partition =
                leasehold_domain::driver::Driver::new(0, 1, leasehold_schemas::Timestamp(1_800_000_000_000));
            let register = Register::new(w1.clone(), Uuid::from_u128(1));
            let epoch = partition.submit("w1", register).positioned_effects().next().unwrap().0;
            Lagging { w1, partition, model: Model::default(), folded: 0, epoch, obs: 0 }
        }

        fn fold(&mut self) {
            for outcome in &self.partition.outcomes()[self.folded..] {
                self.model.apply(outcome, &mut Vec::new());
            }
            self.folded = self.partition.outcomes().len();
        }

        /// Allocated, made by this agent and reported created (decided), not folded yet.
        fn made(&mut self) -> ResourceId {
            use leasehold_schemas::command::{Allocate, ReportCreated};
            let id = self.partition.new_resource_id();
            assert!(self.partition.submit("op", Allocate::new(self.w1.clone(), id, "dir", 1)).rejection().is_none());
            self.fold();
            self.model.get_mut(id).unwrap().create_done = true;
            self.obs += 1;
            let (agent, epoch, obs) = (self.w1.clone(), self.epoch, self.obs);
            let created = ReportCreated { agent, epoch, obs, resource: id, native_id: None };
            assert!(self.partition.submit("w1", created).rejection().is_none());
            id
        }

        /// Reports `present` from the model as folded so far: the count and digest the writer expects, and what it
        /// decided.
        fn report(&mut self, present: &[ResourceId]) -> Vec<&'static str> {
            self.obs += 1;
            let view = self.model.view(|_| false);
            let lists = view.report(&present.iter().copied().collect());
            let report = lists.into_report(self.w1.clone(), self.epoch, self.obs, view.watermark);
            let expected = leasehold_domain::expected_listing(self.partition.state(), &report).unwrap();
            let outcome = self.partition.submit("w1", report.clone());
            let names: Vec<&'static str> = outcome.effects().iter().map(|e| e.name()).collect();
            assert_eq!(expected, (report.count, report.digest), "{report:?} ({names:?})");
            assert!(!names.contains(&"resync-requested"), "{names:?}");
            names
        }
    }

    /// The model lags the log by a few outcomes (it folds its subject as it comes). A handle this agent made (its
    /// `report-created` decided: active) and gone by the listing, before the model folded its activation, is missing:
    /// the report agrees with the writer (no resync) and the loss is found at once.
    #[test]
    fn a_handle_made_and_gone_before_its_activation_is_folded_is_missing() {
        let mut lag = Lagging::new();
        let made = lag.made();
        let names = lag.report(&[]);
        assert!(names.contains(&"resource-lost"), "{names:?}");
        assert!(lag.partition.state().resource(made).unwrap().state.is_terminal());
    }

    /// A handle back on the machine just after the writer marked its resource lost, before the model folded the
    /// loss: the report made then agrees with the writer (no resync).
    #[test]
    fn a_handle_back_before_its_loss_is_folded_agrees_with_the_writer() {
        let mut lag = Lagging::new();
        let back = lag.made();
        lag.fold();
        let names = lag.report(&[]);
        assert!(names.contains(&"resource-lost"), "{names:?}");
        lag.report(&[back]);
    }
}
