//! Resources: allocation, release, pause, update, suspicion, timeouts, parent cascades and claim binding.

use std::collections::BTreeSet;

use leasehold_schemas::command::{
    Allocate, BindClaim, Cascade, CreateTimeout, ExpirePause, ParentState, Pause, Release, ReportFailureByOperator,
    RequestHealthCheck, Unpause, Update,
};
use leasehold_schemas::outcome::{BreakReason, Effect, ReleaseCause, SuspectCause, UnpauseCause};
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{Key, RejectionKind, Source};

use super::{
    Decider, MAX_ATTRIBUTE_KEY_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES, MAX_CAPACITY, MAX_POOLS_PER_RESOURCE,
    Verdict, check_text, reject,
};
use crate::state::{ClaimSlot, Liveness, Resource, ResourceState};

/// `[a-z0-9][a-z0-9_.-]{0,62}`.
fn is_kind(kind: &str) -> bool {
    let bytes = kind.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(b))
}

fn check_attributes<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> Verdict {
    for (name, value) in pairs {
        if name.is_empty() || name.len() > MAX_ATTRIBUTE_KEY_BYTES {
            return reject(
                RejectionKind::Invalid,
                format!("attribute name {name:?} must be 1 to {MAX_ATTRIBUTE_KEY_BYTES} bytes"),
            );
        }
        if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
            return reject(
                RejectionKind::Invalid,
                format!("attribute {name:?} is {} bytes; at most {MAX_ATTRIBUTE_VALUE_BYTES}", value.len()),
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
        let refusal = match (agent.liveness, agent.retired, agent.breaker.is_some()) {
            (Liveness::Gone, _, _) => Some("gone"),
            (_, true, _) => Some("retired"),
            (Liveness::Stalled, _, _) => Some("stalled (no recent heartbeat)"),
            (_, _, true) => Some("suspect (its circuit breaker tripped)"),
            (Liveness::Live, false, false) => None,
        };
        if let Some(why) = refusal {
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
        let horizon = self.state.settings.outcome_horizon;
        if leasehold_schemas::Timestamp(id.unix_ms()).saturating_add(horizon) < self.now {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "resource id {id} was made longer ago than the outcome horizon ({horizon}); \
                     choose a fresh UUIDv7"
                ),
            );
        }
        if !is_kind(&command.kind) {
            return reject(
                RejectionKind::Invalid,
                format!("kind {:?} must match [a-z0-9][a-z0-9_.-]{{0,62}}", command.kind),
            );
        }
        check_capacity(command.capacity)?;
        if command.attributes.len() > MAX_ATTRIBUTES {
            return reject(
                RejectionKind::Invalid,
                format!("{} attributes; at most {MAX_ATTRIBUTES}", command.attributes.len()),
            );
        }
        check_attributes(&command.attributes)?;
        if command.pools.len() > MAX_POOLS_PER_RESOURCE {
            return reject(
                RejectionKind::Invalid,
                format!("{} pools; a resource claims from at most {MAX_POOLS_PER_RESOURCE}", command.pools.len()),
            );
        }
        let distinct: BTreeSet<_> = command.pools.iter().collect();
        if distinct.len() != command.pools.len() {
            return reject(RejectionKind::Invalid, "a pool is named twice; a resource holds one claim per pool");
        }
        let mut suspect_parent = None;
        if let Some(parent) = &command.parent {
            if parent.resource == id {
                return reject(RejectionKind::Invalid, format!("resource {id} cannot be its own parent"));
            }
            let parent_key = Key::Agent(parent.agent.clone());
            if partition_of_key(&parent_key, self.state.partitions) == self.state.partition {
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
        for pool in &command.pools {
            self.out.push(Effect::ClaimWanted { resource: id, pool: pool.clone() });
        }
        if command.pools.is_empty() {
            self.out.push(Effect::CreateOrdered { resource: id });
        }
        Ok(())
    }

    pub(super) fn release(&mut self, command: &Release) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        if resource.state.has_left() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", resource.reference(), describe_state(resource)),
            );
        }
        let cause = ReleaseCause::Released { by: self.envelope.issuer.clone(), reason: command.reason.clone() };
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
                let cause = UnpauseCause::Operator { by: self.envelope.issuer.clone() };
                self.out.push(Effect::ResourceUnpaused { resource: resource.id, cause });
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
        match resource.state {
            ResourceState::Paused { until: Some(until), .. } if until <= self.now => {
                let cause = UnpauseCause::PauseExpired {};
                self.out.push(Effect::ResourceUnpaused { resource: resource.id, cause });
                Ok(())
            }
            ResourceState::Paused { until: Some(until), .. } => reject(
                RejectionKind::NotYetDue,
                format!("the pause of resource {} lasts until {until}", resource.reference()),
            ),
            ResourceState::Paused { until: None, .. } => reject(
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
        if command.set.is_empty() && command.remove.is_empty() && command.capacity.is_none() {
            return reject(RejectionKind::Invalid, "the update changes nothing");
        }
        check_attributes(&command.set)?;
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
            let n_live = resource.live_leases.len();
            if (capacity as usize) < n_live {
                return reject(
                    RejectionKind::InvalidState,
                    format!(
                        "capacity {capacity} is below the {n_live} live leases of resource {}; release leases first",
                        resource.reference()
                    ),
                );
            }
        }
        self.out.push(Effect::ResourceUpdated {
            resource: resource.id,
            set: command.set.clone(),
            remove: command.remove.clone(),
            capacity: command.capacity,
        });
        Ok(())
    }

    pub(super) fn report_failure_by_operator(&mut self, command: &ReportFailureByOperator) -> Verdict {
        let resource = self.resource(&command.agent, command.resource)?;
        check_text("detail", &command.detail)?;
        match resource.state {
            ResourceState::Active | ResourceState::Paused { .. } => {
                let cause = SuspectCause::Operator { by: self.envelope.issuer.clone(), detail: command.detail.clone() };
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
        let agent = self.agent(&command.agent)?;
        let resource = self.resource(&command.agent, command.resource)?;
        if resource.state != ResourceState::Pending {
            return reject(
                RejectionKind::NothingToDo,
                format!("resource {} is {}, not pending", resource.reference(), describe_state(resource)),
            );
        }
        let due = resource.allocated_at.saturating_add(agent.settings.create_timeout);
        if self.now < due {
            return reject(
                RejectionKind::NotYetDue,
                format!("resource {} may be created until {due}", resource.reference()),
            );
        }
        // Not `failed`: the create may still be running. The agent destroys it; an observation frees its claims.
        self.order_release(resource, ReleaseCause::CreateTimeout {}, BreakReason::ResourceLeft);
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
        if child.parent.as_ref() != Some(&command.parent) {
            return reject(
                RejectionKind::Invalid,
                format!("{} is not the parent of resource {}", command.parent, child.reference()),
            );
        }
        if child.parent_seen.is_some_and(|seen| command.source <= seen) {
            return reject(
                RejectionKind::StaleSource,
                format!(
                    "resource {} already heard from its parent at {}; {} is older",
                    child.reference(),
                    child.parent_seen.map(|s| s.to_string()).unwrap_or_default(),
                    command.source
                ),
            );
        }
        if child.state.has_left() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", child.reference(), describe_state(child)),
            );
        }
        match command.parent_state {
            ParentState::Left => {
                let cause = ReleaseCause::ParentLeft { parent: command.parent.clone() };
                self.order_release(child, cause, BreakReason::ResourceLeft);
            }
            ParentState::Suspect | ParentState::Healthy => {
                // Recorded even when the flag does not change, so that an older cascade arriving later is stale.
                let suspect = command.parent_state == ParentState::Suspect;
                self.out.push(Effect::UpstreamFlagged {
                    resource: child.id,
                    parent: command.parent.clone(),
                    suspect,
                    source: command.source,
                });
            }
        }
        Ok(())
    }

    pub(super) fn bind_claim(&mut self, command: &BindClaim) -> Verdict {
        let send_back = Effect::ClaimReleasable {
            resource: command.holder.resource,
            pool: command.pool.clone(),
            value: Some(command.value),
            token: Some(command.token),
        };
        let Some(resource) = self.state.resources.get(&command.holder.resource) else {
            // Unknown here (never allocated, or forgotten after the horizon): the claim goes straight back.
            self.out.push(send_back);
            return Ok(());
        };
        if resource.agent != command.holder.agent {
            return reject(
                RejectionKind::Unknown,
                format!("resource {} is on agent {}, not {}", resource.id, resource.agent, command.holder.agent),
            );
        }
        match resource.claims.get(&command.pool) {
            None => reject(
                RejectionKind::Invalid,
                format!("resource {} has no claim on pool {}", resource.reference(), command.pool),
            ),
            Some(ClaimSlot::Bound { token, value }) if *token == command.token => reject(
                RejectionKind::AlreadyDone,
                format!(
                    "the claim of resource {} on pool {} is already bound to {value}",
                    resource.reference(),
                    command.pool
                ),
            ),
            Some(ClaimSlot::Bound { token, value }) => reject(
                RejectionKind::TokenMismatch,
                format!(
                    "the claim of resource {} on pool {} is bound to {value} with token {token}, not {}",
                    resource.reference(),
                    command.pool,
                    command.token
                ),
            ),
            Some(ClaimSlot::Returned { token: Some(token) }) if *token == command.token => reject(
                RejectionKind::AlreadyDone,
                format!(
                    "the claim of resource {} on pool {} with token {token} was already sent back",
                    resource.reference(),
                    command.pool
                ),
            ),
            Some(ClaimSlot::Returned { .. }) => {
                // The holder went terminal before the grant arrived: the claim goes straight back.
                self.out.push(send_back);
                Ok(())
            }
            Some(ClaimSlot::Wanted { wanted_at })
                if command.wanted != Source { partition: self.state.partition, position: *wanted_at } =>
            {
                // A grant of some other claim (an earlier life of this id, a confused sweeper): not this
                // resource's to keep, so it goes straight back and the claim stays wanted.
                self.out.push(send_back);
                Ok(())
            }
            Some(ClaimSlot::Wanted { .. }) => {
                self.out.push(Effect::ClaimBound {
                    resource: resource.id,
                    pool: command.pool.clone(),
                    value: command.value,
                    token: command.token,
                });
                let others_bound = resource
                    .claims
                    .iter()
                    .all(|(pool, slot)| pool == &command.pool || matches!(slot, ClaimSlot::Bound { .. }));
                if others_bound && resource.state == ResourceState::Pending && resource.create_ordered.is_none() {
                    self.out.push(Effect::CreateOrdered { resource: resource.id });
                }
                Ok(())
            }
        }
    }
}
