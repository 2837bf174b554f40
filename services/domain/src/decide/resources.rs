//! Resources: allocation, release, pause, update, suspicion, timeouts, parent cascades, claim binding, and an
//! operator's free of what an orphan holds.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_schemas::command::{
    Adopt, Allocate, BindClaim, Cascade, CreateTimeout, ExpirePause, FreeOrphan, ParentState, Pause, Release,
    ReportFailureByOperator, RequestHealthCheck, Unpause, Update,
};
use leasehold_schemas::outcome::{
    BreakReason, Effect, FreeCause, GarbageCause, ReleaseCause, SuspectCause, UnpauseCause,
};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{Key, RejectionKind, ResourceRef, Source};

use super::quotas::QuotaCharge;
use super::{
    Decider, MAX_ATTRIBUTE_KEY_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES, MAX_CAPACITY, MAX_POOLS_PER_RESOURCE,
    Verdict, check_text, echo, reject,
};
use crate::state::{ClaimSlot, LeaseState, PendingClock, Resource, ResourceState, Unschedulable};

/// `[a-z0-9][a-z0-9_.-]{0,62}`.
pub(super) fn is_kind(kind: &str) -> bool {
    let bytes = kind.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(b))
}

fn check_attribute_name(name: &str) -> Verdict {
    if name.is_empty() || name.len() > MAX_ATTRIBUTE_KEY_BYTES {
        return reject(
            RejectionKind::Invalid,
            format!("attribute name {} must be 1 to {MAX_ATTRIBUTE_KEY_BYTES} bytes", echo(name)),
        );
    }
    Ok(())
}

fn check_attributes<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Verdict {
    for (name, value) in pairs {
        check_attribute_name(name)?;
        if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
            return reject(
                RejectionKind::Invalid,
                format!("attribute {} is {} bytes; at most {MAX_ATTRIBUTE_VALUE_BYTES}", echo(name), value.len()),
            );
        }
    }
    Ok(())
}

fn check_capacity(capacity: u32) -> Verdict {
    if capacity > MAX_CAPACITY {
        return reject(RejectionKind::Invalid, format!("capacity {capacity} is over the limit of {MAX_CAPACITY}"));
    }
    Ok(())
}

/// What an allocation or a placement asks for, checked on its own: the kind, capacity, attributes and pools.
pub(super) fn check_request(
    kind: &str,
    capacity: u32,
    attributes: &BTreeMap<String, String>,
    pools: &[leasehold_schemas::PoolName],
) -> Verdict {
    if !is_kind(kind) {
        return reject(RejectionKind::Invalid, format!("kind {} must match [a-z0-9][a-z0-9_.-]{{0,62}}", echo(kind)));
    }
    check_capacity(capacity)?;
    if attributes.len() > MAX_ATTRIBUTES {
        return reject(RejectionKind::Invalid, format!("{} attributes; at most {MAX_ATTRIBUTES}", attributes.len()));
    }
    check_attributes(attributes)?;
    if pools.len() > MAX_POOLS_PER_RESOURCE {
        return reject(
            RejectionKind::Invalid,
            format!("{} pools; a resource claims from at most {MAX_POOLS_PER_RESOURCE}", pools.len()),
        );
    }
    let distinct: BTreeSet<_> = pools.iter().collect();
    if distinct.len() != pools.len() {
        return reject(RejectionKind::Invalid, "a pool is named twice; a resource holds one claim per pool");
    }
    Ok(())
}

/// "pending", or "releasing (ordered at #12)".
fn describe_state(resource: &Resource) -> String {
    match (&resource.state, resource.destruction_ordered) {
        (ResourceState::Releasing { .. }, Some(at)) => {
            format!("releasing (destruction ordered at {at})")
        }
        (state, _) => state.name().to_owned(),
    }
}

impl<'s> Decider<'s> {
    pub(super) fn allocate(&mut self, command: &Allocate) -> Verdict {
        let agent = self.agent(&command.agent)?;
        // A drain or a cordon is named after the id's checks, so that an allocation sent again is answered for its id.
        let (held_back, refused) = match agent.unschedulable() {
            Some(why @ (Unschedulable::Draining(_) | Unschedulable::Cordoned(_))) => (Some(why), None),
            why => (None, why),
        };
        if let Some(why) = refused {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} is {why}; no new placements on it", agent.name),
            );
        }
        let id = command.resource;
        if let Some(existing) = self.state.resources.get(&id) {
            return reject(
                RejectionKind::AlreadyExists,
                format!("resource {} already exists ({})", existing.reference(), existing.state.name()),
            );
        }
        if self.state.absent.contains(&id) || agent.lost_ids.contains(&id) {
            return reject(
                RejectionKind::AlreadyExists,
                format!(
                    "resource id {id} was recorded here as never allocated (a child's adoption asked for it as its \
                     parent, and was answered \"absent\"), or as lost; choose a fresh UUIDv7"
                ),
            );
        }
        if let Some(ordered) = agent.garbage_order_of(id) {
            return reject(
                RejectionKind::AlreadyExists,
                format!(
                    "a handle {id} is on agent {}'s machine, ordered destroyed as garbage at {ordered} and not yet \
                     destroyed; choose a fresh UUIDv7",
                    agent.name
                ),
            );
        }
        self.check_fresh_id("resource id", &id, id.time(), RejectionKind::Invalid)?;
        // After the id's checks: an allocation sent again under another command id is answered "already exists",
        // not "full" (it is the one that fills the place).
        // Held for a placement on any agent of this partition: its commit would make a resource of that id.
        if let Some((holder, reservation)) = self.state.reserved(id) {
            return reject(
                RejectionKind::AlreadyExists,
                format!(
                    "resource id {id} is reserved on agent {holder} for its placement (at {}); choose a fresh UUIDv7",
                    reservation.token
                ),
            );
        }
        if let Some(limit) = agent.capacity.get(command.kind.as_str()) {
            let used = agent.used(command.kind.as_str());
            if *limit == 0 {
                return reject(
                    RejectionKind::InvalidState,
                    format!("agent {} takes no {} (its capacity for it is 0)", agent.name, command.kind),
                );
            }
            if used >= *limit {
                return reject(
                    RejectionKind::InvalidState,
                    format!(
                        "agent {} is full for {}: {used} of {limit} (pending to releasing); no new allocations of it",
                        agent.name, command.kind
                    ),
                );
            }
        }
        if let Some(why) = held_back {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} is {why}; no new allocations on it", agent.name),
            );
        }
        if let Some(wait) = command.wait
            && wait.0 == 0
        {
            return reject(RejectionKind::Invalid, "a wait of 0 gives up at once; give a longer one, or none");
        }
        check_request(&command.kind, command.capacity, &command.attributes, &command.pools)?;
        self.check_no_quota_pool(&command.pools)?;
        let charge = self.quota_charge(Some(self.issuer), &command.kind);
        if let QuotaCharge::Refused { quota, kind } = &charge {
            return Err(super::quotas::refusal(quota, kind, self.issuer));
        }
        self.allocation_effects(command, charge)
    }

    /// The effects of an allocation that passed its checks: the resource, its claims (with a slot of its
    /// principal's quota, `charge`), its create order. Refused only for its parent (unknown here, or gone).
    pub(super) fn allocation_effects(&mut self, command: &Allocate, charge: QuotaCharge) -> Verdict {
        let id = command.resource;
        let mut suspect_parent = None;
        if let Some(parent) = &command.parent {
            if parent.resource == id {
                return reject(RejectionKind::Invalid, format!("resource {id} cannot be its own parent"));
            }
            self.check_not_ahead("parent id", &parent.resource, parent.resource.time())?;
            if partition_of_agent(&parent.agent, self.state.partitions) == self.state.partition {
                let parent_resource = self.resource(&parent.agent, parent.resource).map_err(|mut r| {
                    r.message = format!("parent {parent} is not known");
                    r
                })?;
                if parent_resource.state.has_left() {
                    return reject(
                        RejectionKind::InvalidState,
                        format!("parent {parent} is {}; it cannot take children", describe_state(parent_resource)),
                    );
                }
                if matches!(parent_resource.state, ResourceState::Suspect { .. }) {
                    // Flagged from birth, as of everything this partition has decided about the parent so far.
                    let source = Source { partition: self.state.partition, position: self.state.last_position() };
                    suspect_parent = Some((parent.clone(), source));
                }
            }
        }
        self.out.push(Effect::ResourceAllocated {
            resource: id,
            kind: command.kind.clone(),
            capacity: command.capacity,
            attributes: command.attributes.clone(),
            parent: command.parent.clone(),
        });
        if let Some((parent, source)) = suspect_parent {
            self.out.push(Effect::UpstreamFlagged { resource: id, parent, suspect: true, source });
        }
        let quota_pool = match charge {
            QuotaCharge::Claim(pool) if !command.pools.contains(&pool) => Some(pool),
            _ => None,
        };
        for pool in command.pools.iter().chain(&quota_pool) {
            self.out.push(Effect::ClaimWanted { resource: id, pool: pool.clone() });
        }
        let claims = !command.pools.is_empty() || quota_pool.is_some();
        if let Some(wait) = command.wait.filter(|_| claims) {
            self.out.push(Effect::AllocationWaitsUntil { resource: id, until: self.now.saturating_add(wait) });
        }
        if !claims {
            self.out.push(Effect::CreateOrdered { resource: id });
        }
        Ok(())
    }

    pub(super) fn release(&mut self, command: &Release) -> Verdict {
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        // A lost resource whose handle came back is released by destroying that handle, on record.
        if let Some(agent) = self.state.agents.get(&command.agent)
            && agent.lost_id_known(self.state, command.resource)
        {
            let reference = format!("{}.{}", command.agent, command.resource);
            if !agent.quarantined.contains_key(&command.resource) {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!(
                        "resource {reference} is lost and no handle of it is on its agent's machine (one that \
                         reappears is quarantined until released)"
                    ),
                );
            }
            let cause = GarbageCause::Released { by: self.issuer.clone(), reason: command.reason.clone() };
            self.out.push(Effect::GarbageDestroyOrdered { handle: command.resource, cause });
            return Ok(());
        }
        let resource = self.resource(&command.agent, command.resource)?;
        if resource.state.has_left() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", resource.reference(), describe_state(resource)),
            );
        }
        let cause = ReleaseCause::Released { by: self.issuer.clone(), reason: command.reason.clone() };
        self.order_release(resource, cause, BreakReason::ResourceLeft);
        Ok(())
    }

    pub(super) fn pause(&mut self, command: &Pause) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        match resource.state {
            ResourceState::Active => {}
            ResourceState::Paused { .. } => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("resource {} is already paused", resource.reference()),
                );
            }
            _ => {
                return reject(
                    RejectionKind::InvalidState,
                    format!(
                        "resource {} is {}; only an active resource can be paused",
                        resource.reference(),
                        describe_state(resource)
                    ),
                );
            }
        }
        if let Some(until) = command.until
            && until <= self.now
        {
            return reject(RejectionKind::Invalid, format!("pause until {until} is not after now ({})", self.now));
        }
        self.out.push(Effect::ResourcePaused {
            resource: resource.id,
            reason: command.reason.clone(),
            until: command.until,
        });
        Ok(())
    }

    pub(super) fn unpause(&mut self, command: &Unpause) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        match resource.state {
            ResourceState::Paused { .. } => {
                let cause = UnpauseCause::Operator { by: self.issuer.clone() };
                self.out.push(Effect::ResourceUnpaused { resource: resource.id, cause });
                self.serve_if_clear(resource);
                Ok(())
            }
            ResourceState::Active => {
                reject(RejectionKind::AlreadyDone, format!("resource {} is not paused", resource.reference()))
            }
            _ => reject(
                RejectionKind::InvalidState,
                format!("resource {} is {}, not paused", resource.reference(), describe_state(resource)),
            ),
        }
    }

    pub(super) fn expire_pause(&mut self, command: &ExpirePause) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        match (&resource.state, crate::due::pause_due(resource)) {
            (_, Some(until)) if until <= self.now => {
                let cause = UnpauseCause::PauseExpired {};
                self.out.push(Effect::ResourceUnpaused { resource: resource.id, cause });
                self.serve_if_clear(resource);
                Ok(())
            }
            (_, Some(until)) => reject(
                RejectionKind::NotYetDue,
                format!("the pause of resource {} lasts until {until}", resource.reference()),
            ),
            (ResourceState::Paused { .. }, None) => reject(
                RejectionKind::NothingToDo,
                format!("the pause of resource {} has no end; unpause it", resource.reference()),
            ),
            _ => reject(
                RejectionKind::NothingToDo,
                format!("resource {} is {}, not paused", resource.reference(), describe_state(resource)),
            ),
        }
    }

    pub(super) fn update(&mut self, command: &Update) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        if !matches!(resource.state, ResourceState::Active | ResourceState::Paused { .. }) {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "resource {} is {}; only an active or paused resource can be updated",
                    resource.reference(),
                    describe_state(resource)
                ),
            );
        }
        let changes_attributes = !command.set.is_empty() || !command.remove.is_empty() || command.capacity.is_some();
        if !changes_attributes && command.max_lease.is_none() {
            return reject(RejectionKind::Invalid, "the update changes nothing");
        }
        check_attributes(&command.set)?;
        if command.remove.len() > MAX_ATTRIBUTES {
            return reject(
                RejectionKind::Invalid,
                format!("{} attribute names to remove; at most {MAX_ATTRIBUTES}", command.remove.len()),
            );
        }
        for name in &command.remove {
            check_attribute_name(name)?;
        }
        let mut names: BTreeSet<&String> = resource.attributes.keys().collect();
        for name in &command.remove {
            names.remove(name);
        }
        names.extend(command.set.keys());
        if names.len() > MAX_ATTRIBUTES {
            return reject(RejectionKind::Invalid, format!("{} attributes; at most {MAX_ATTRIBUTES}", names.len()));
        }
        if let Some(capacity) = command.capacity {
            check_capacity(capacity)?;
            // Waiters do not count: they wait for room under the new capacity.
            let n_active =
                self.state.live_leases_of(resource).filter(|l| matches!(l.state, LeaseState::Active { .. })).count();
            if (capacity as usize) < n_active {
                return reject(
                    RejectionKind::InvalidState,
                    format!(
                        "capacity {capacity} is below the {n_active} active leases of resource {}; release leases \
                         first",
                        resource.reference()
                    ),
                );
            }
        }
        // `Some(0)` removes the limit; the same limit again changes nothing.
        let new_max_lease =
            command.max_lease.map(|max| (max.0 > 0).then_some(max)).filter(|max| *max != resource.max_lease);
        if !changes_attributes && new_max_lease.is_none() {
            let limit = resource.max_lease.map_or_else(|| "no limit".to_owned(), |max| max.to_string());
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} already has this max lease time ({limit})", resource.reference()),
            );
        }
        if changes_attributes {
            self.out.push(Effect::ResourceUpdated {
                resource: resource.id,
                set: command.set.clone(),
                remove: command.remove.clone(),
                capacity: command.capacity,
            });
        }
        if let Some(max_lease) = new_max_lease {
            self.out.push(Effect::ResourceMaxLeaseChanged { resource: resource.id, max_lease });
        }
        if let Some(capacity) = command.capacity.filter(|capacity| *capacity > resource.capacity) {
            self.serve_if_active(resource, capacity, None);
        }
        Ok(())
    }

    pub(super) fn report_failure_by_operator(&mut self, command: &ReportFailureByOperator) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        check_text("detail", &command.detail)?;
        match resource.state {
            ResourceState::Active | ResourceState::Paused { .. } => {
                let cause = SuspectCause::Operator { by: self.issuer.clone(), detail: command.detail.clone() };
                self.out.push(Effect::ResourceSuspect { resource: resource.id, cause });
                Ok(())
            }
            ResourceState::Suspect { .. } => reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already suspect; its health check is due", resource.reference()),
            ),
            ResourceState::Pending => reject(
                RejectionKind::InvalidState,
                format!("resource {} is pending (not created yet); release it instead", resource.reference()),
            ),
            _ => reject(
                RejectionKind::InvalidState,
                format!("resource {} is {}", resource.reference(), describe_state(resource)),
            ),
        }
    }

    pub(super) fn create_timeout(&mut self, command: &CreateTimeout) -> Verdict {
        self.agent(&command.agent)?;
        let resource = self.resource(&command.agent, command.resource)?;
        let Some(due) = crate::due::create_due(self.state, resource) else {
            let why = if resource.state == ResourceState::Pending {
                "waits for its pools' identifiers with no wait given".to_owned()
            } else {
                format!("is {}, not pending", describe_state(resource))
            };
            return reject(RejectionKind::NothingToDo, format!("resource {} {why}", resource.reference()));
        };
        if self.now < due {
            let what = if resource.create_ordered.is_some() { "may be created" } else { "may wait for its pools" };
            return reject(RejectionKind::NotYetDue, format!("resource {} {what} until {due}", resource.reference()));
        }
        // Not `failed`: the create may still be running. The agent destroys it; an observation frees its claims.
        let cause = match resource.pending_clock {
            Some(PendingClock::WaitsUntil(_)) => ReleaseCause::WaitTimeout { waited: due.since(resource.allocated_at) },
            _ => ReleaseCause::CreateTimeout {},
        };
        self.order_release(resource, cause, BreakReason::ResourceLeft);
        Ok(())
    }

    pub(super) fn request_health_check(&mut self, command: &RequestHealthCheck) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        if !matches!(resource.state, ResourceState::Suspect { .. }) {
            return reject(
                RejectionKind::NothingToDo,
                format!("resource {} is {}, not suspect", resource.reference(), describe_state(resource)),
            );
        }
        self.out.push(Effect::HealthCheckRequested { resource: resource.id });
        Ok(())
    }

    pub(super) fn cascade(&mut self, command: &Cascade) -> Verdict {
        let child = self.resource(&command.child.agent, command.child.resource)?;
        if child.parent() != Some(&command.parent) {
            return reject(
                RejectionKind::Invalid,
                format!("{} is not the parent of resource {}", command.parent, child.reference()),
            );
        }
        let about = format_args!("parent {}", command.parent);
        let parent_home = self.check_from_home(&about, &command.parent.agent, command.source, "what it says")?;
        if child.state.has_left() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", child.reference(), describe_state(child)),
            );
        }
        // A parent in this partition is seen as it is now: the cascade only says "look at your parent", so no
        // message, late or made up, can put the child out of step with it.
        if parent_home == self.state.partition {
            return self.follow_local_parent(child, &command.parent);
        }
        // A parent that left never comes back (ids are never reused), and one recorded absent is never allocated:
        // either is taken whatever the child heard before, so no message, however out of order, can keep a child of
        // a departed or missing parent alive.
        if matches!(command.parent_state, ParentState::Left | ParentState::Absent) {
            let cause = match command.parent_state {
                ParentState::Absent => ReleaseCause::ParentAbsent { parent: command.parent.clone() },
                _ => ReleaseCause::ParentLeft { parent: command.parent.clone() },
            };
            self.order_release(child, cause, BreakReason::ResourceLeft);
            return Ok(());
        }
        // The answer to the child's own adoption is the parent's state as of the parent's partition when it answered:
        // it is taken whatever the child heard before, and resets what it heard, so a source a confused sender made
        // up is undone by asking again. Anything else must be newer than what the child heard, and the child must
        // have been adopted (a cascade sent before it existed could be older than the parent's real state).
        let own_life = Source { partition: self.state.partition, position: child.allocated_pos };
        if command.answers != Some(own_life) {
            if child.parent_seen().is_none() {
                return reject(
                    RejectionKind::NotYetDue,
                    format!(
                        "resource {} has not learnt its parent's state since it was allocated (at {own_life}); the \
                         answer to its adoption comes first",
                        child.reference()
                    ),
                );
            }
            if child.parent_seen().is_some_and(|seen| command.source <= seen) {
                return reject(
                    RejectionKind::StaleSource,
                    format!(
                        "resource {} already heard from its parent at {}; {} is older",
                        child.reference(),
                        child.parent_seen().map(|s| s.to_string()).unwrap_or_default(),
                        command.source
                    ),
                );
            }
        }
        // Recorded even when the flag does not change, so that an older cascade arriving later is stale.
        self.flag_upstream(child, command.parent_state == ParentState::Suspect, command.source);
        Ok(())
    }

    /// Flags (or clears) a child suspect-upstream as of `source`; a cleared flag serves the leases that waited on it.
    fn flag_upstream(&mut self, child: &Resource, suspect: bool, source: Source) {
        let parent = child.parent().expect("a child has a parent").clone();
        self.out.push(Effect::UpstreamFlagged { resource: child.id, parent, suspect, source });
        if !suspect && child.upstream_suspect().is_some() && child.state == ResourceState::Active {
            self.serve_waiting(child);
        }
    }

    /// A child of a parent in this partition takes the parent's state as it is now (a parent no longer in state left
    /// for good: allocation refused an unknown local parent).
    fn follow_local_parent(&mut self, child: &Resource, parent: &ResourceRef) -> Verdict {
        let now = self.state.resources.get(&parent.resource).filter(|r| r.agent == parent.agent);
        match now {
            None => {}
            Some(p) if p.state.has_left() => {}
            Some(p) => {
                let suspect = matches!(p.state, ResourceState::Suspect { .. });
                if child.upstream_suspect().is_some() == suspect {
                    return reject(
                        RejectionKind::AlreadyDone,
                        format!(
                            "resource {} is already in step with its parent {parent}, which is {}",
                            child.reference(),
                            p.state.name()
                        ),
                    );
                }
                let source = Source { partition: self.state.partition, position: self.state.last_position() };
                self.flag_upstream(child, suspect, source);
                return Ok(());
            }
        }
        let cause = ReleaseCause::ParentLeft { parent: parent.clone() };
        self.order_release(child, cause, BreakReason::ResourceLeft);
        Ok(())
    }

    /// The parent's side of an adoption: its state as of now, for a child allocated in another partition. A parent
    /// this partition never knew is answered `absent` at once, and recorded so: its id is never allocated here after
    /// that, so the answer stays true (a producer allocates a parent before its children).
    pub(super) fn adopt(&mut self, command: &Adopt) -> Verdict {
        let about = format_args!("child {}", command.child);
        self.check_from_home(&about, &command.child.agent, command.source, "its allocation")?;
        let known = self.state.resources.get(&command.parent.resource);
        // Room held here for a placement of that id: its commit may make it yet, after the producer was told where
        // it was placed. "Absent" now would release the child and record an id this partition is about to allocate.
        if known.is_none()
            && let Some((holder, reservation)) = self.state.reserved(command.parent.resource)
        {
            return reject(
                RejectionKind::NotYetDue,
                format!(
                    "parent {} is not made yet: agent {holder} holds room for its placement (at {}); the adoption \
                     is answered once that room is committed or given back",
                    command.parent, reservation.token
                ),
            );
        }
        let parent = known.filter(|r| r.agent == command.parent.agent);
        let parent_state = match parent {
            Some(parent) => parent.as_parent(),
            // The id is another agent's resource here: this parent can never exist (ids are unique per partition).
            None if known.is_some() => ParentState::Left,
            // Forgotten after the horizon (it left long ago), or never allocated: the child cannot keep it.
            None if command.parent.resource.time() <= self.state.forgotten_up_to => ParentState::Left,
            None => ParentState::Absent,
        };
        self.out.push(Effect::ChildAdopted {
            parent: command.parent.resource,
            child: command.child.clone(),
            child_source: command.source,
            parent_state,
        });
        Ok(())
    }

    pub(super) fn bind_claim(&mut self, command: &BindClaim) -> Verdict {
        let holder = &command.holder;
        // A grant is the pool's `claim-granted`: its source is that effect, and its position is the token.
        let pool_home = partition_of_key(&Key::Pool(command.pool.clone()), self.state.partitions);
        if command.source != (Source { partition: pool_home, position: command.token }) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "a grant of pool {} is its claim-granted in partition {pool_home}, whose position is the token {}; \
                     this one names {}",
                    command.pool, command.token, command.source
                ),
            );
        }
        if self.state.grant_returned(holder, &command.pool, command.token) {
            return reject(
                RejectionKind::AlreadyDone,
                format!(
                    "the grant of {} (claim token {}) of pool {} to {holder} was already sent back",
                    command.value, command.token, command.pool
                ),
            );
        }
        let send_back = Effect::GrantReturned {
            resource: holder.resource,
            pool: command.pool.clone(),
            value: command.value,
            token: command.token,
        };
        let resource = self.state.resources.get(&holder.resource).filter(|r| r.agent == holder.agent);
        let Some(resource) = resource else {
            // Unknown here (never allocated, forgotten after the horizon, or an id of another agent): the grant
            // goes straight back, and is never bound here later.
            self.out.push(send_back);
            return Ok(());
        };
        match resource.claims.get(&command.pool) {
            Some(ClaimSlot::Bound { token, value, .. }) if *token == command.token => reject(
                RejectionKind::AlreadyDone,
                format!(
                    "the claim of resource {} on pool {} is already bound to {value}",
                    resource.reference(),
                    command.pool
                ),
            ),
            // The same identifier with another token: the resource uses it, so it is not sent back (which would free
            // it at the pool); the grant the pool really holds is carried again when the resource leaves, and goes
            // back then.
            Some(ClaimSlot::Bound { token, value, .. }) if *value == command.value => reject(
                RejectionKind::AlreadyDone,
                format!(
                    "resource {} holds {value} of pool {} with token {token}; a grant of the same identifier with \
                     token {} is not sent back while it is in use",
                    resource.reference(),
                    command.pool,
                    command.token
                ),
            ),
            // An orphan keeps what its pool holds for it: the same grant, or the same identifier, is not sent back.
            Some(ClaimSlot::HeldForOrphan { token, value }) if *token == command.token || *value == command.value => {
                reject(
                    RejectionKind::AlreadyDone,
                    format!(
                        "orphan {} holds {value} of pool {} (claim token {token}) until its agent confirms the \
                         destroy or an operator frees it",
                        resource.reference(),
                        command.pool
                    ),
                )
            }
            Some(ClaimSlot::Returned { token: Some(token), .. }) if *token == command.token => reject(
                RejectionKind::AlreadyDone,
                format!(
                    "the claim of resource {} on pool {} with token {token} was already given back",
                    resource.reference(),
                    command.pool
                ),
            ),
            Some(ClaimSlot::Wanted { wanted_at })
                if command.wanted == Source { partition: self.state.partition, position: *wanted_at } =>
            {
                self.out.push(Effect::ClaimBound {
                    resource: resource.id,
                    pool: command.pool.clone(),
                    value: command.value,
                    token: command.token,
                });
                if let Some(definition @ PoolKind::Ipv4 { .. }) = &command.definition {
                    self.out.push(Effect::ClaimPoolDefinition {
                        resource: resource.id,
                        pool: command.pool.clone(),
                        definition: definition.clone(),
                    });
                }
                if command.orphans != OrphanPolicy::Release {
                    self.out.push(Effect::ClaimOrphanPolicy {
                        resource: resource.id,
                        pool: command.pool.clone(),
                        orphans: command.orphans,
                    });
                }
                let others_bound = resource
                    .claims
                    .iter()
                    .all(|(pool, slot)| pool == &command.pool || matches!(slot, ClaimSlot::Bound { .. }));
                if others_bound && resource.state == ResourceState::Pending && resource.create_ordered.is_none() {
                    self.out.push(Effect::CreateOrdered { resource: resource.id });
                }
                Ok(())
            }
            // Not this resource's to keep: it never claimed from this pool, it holds another grant, it went
            // terminal before the grant arrived, or the grant answers some other claim (an earlier life of the id, a
            // confused sweeper). The claim, if any, stays as it is; the grant goes straight back.
            None
            | Some(
                ClaimSlot::Bound { .. }
                | ClaimSlot::Returned { .. }
                | ClaimSlot::Wanted { .. }
                | ClaimSlot::HeldForOrphan { .. },
            ) => {
                self.out.push(send_back);
                Ok(())
            }
        }
    }

    /// An operator frees what an orphan holds of pools that hold an orphan's identifiers, on record: the identifiers
    /// go back to their pools with the operator's name and reason.
    pub(super) fn free_orphan(&mut self, command: &FreeOrphan) -> Verdict {
        check_text("reason", &command.reason)?;
        if command.reason.trim().is_empty() {
            return reject(
                RejectionKind::Invalid,
                "freeing an orphan's identifiers needs a reason (it is on record, and `why` shows it)",
            );
        }
        let resource = self.resource(&command.agent, command.resource)?;
        let reference = resource.reference();
        if !matches!(resource.state, ResourceState::Orphaned { .. }) {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "resource {reference} is {}, not orphaned: only an orphan's held identifiers are freed so (release \
                     a live resource instead)",
                    resource.state.name()
                ),
            );
        }
        if let Some(pool) = &command.pool
            && !resource.claims.contains_key(pool)
        {
            return reject(RejectionKind::Unknown, format!("orphan {reference} never claimed from pool {pool}"));
        }
        let held = resource.claims.iter().any(|(name, slot)| {
            matches!(slot, ClaimSlot::HeldForOrphan { .. }) && command.pool.as_ref().is_none_or(|p| p == name)
        });
        if !held {
            let of = command.pool.as_ref().map(|p| format!(" of pool {p}")).unwrap_or_default();
            return reject(
                RejectionKind::AlreadyDone,
                format!("orphan {reference} holds no identifier{of}: what it held went back already"),
            );
        }
        let cause = FreeCause::OrphanFreed { by: self.issuer.clone(), reason: command.reason.clone() };
        self.free_held(resource, command.pool.as_ref(), &cause);
        Ok(())
    }
}
