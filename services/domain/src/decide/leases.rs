//! Leases: acquire (granted, waiting or queued), renew, release, expiry and wait timeouts. A grant's position is the
//! lease token; renew and release of an active lease must present it. A lease that ends makes room, and the queue of
//! its resource is served in the same decision (see `Decider::serve_queue`).

use leasehold_schemas::command::{Acquire, ExpireLease, ReleaseLease, Renew, WaitTimeout};
use leasehold_schemas::ids::{AgentName, LeaseId};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::{Rejection, RejectionKind};

use super::{Decider, MAX_HOLDER_BYTES, MAX_QUEUED, Verdict, reject};
use crate::state::{Lease, LeaseState, Liveness, Resource, ResourceState};

impl<'s> Decider<'s> {
    fn lease(&self, agent: &AgentName, id: LeaseId) -> Result<&'s Lease, Rejection> {
        match self.state.leases.get(&id) {
            Some(lease) if lease.agent == *agent => Ok(lease),
            Some(lease) => {
                reject(RejectionKind::Unknown, format!("lease {id} is on agent {}, not on {agent}", lease.agent))
            }
            None => reject(RejectionKind::Unknown, format!("lease {id} on agent {agent} is not known")),
        }
    }

    pub(super) fn acquire(&mut self, command: &Acquire) -> Verdict {
        let agent = self.agent(&command.agent)?;
        let resource = self.resource(&command.agent, command.resource)?;
        if let Some(existing) = self.state.leases.get(&command.lease) {
            return reject(
                RejectionKind::AlreadyExists,
                format!("lease {} already exists ({})", existing.id, existing.state.name()),
            );
        }
        self.check_fresh_id("lease id", &command.lease, command.lease.time(), RejectionKind::Invalid)?;
        if command.holder.is_empty() {
            return reject(RejectionKind::Invalid, "a lease needs a holder (who uses it)");
        }
        if command.holder.len() > MAX_HOLDER_BYTES {
            return reject(
                RejectionKind::Invalid,
                format!("holder is {} bytes; at most {MAX_HOLDER_BYTES}", command.holder.len()),
            );
        }
        if command.ttl.is_some_and(|ttl| ttl.0 == 0) || command.wait_timeout.is_some_and(|w| w.0 == 0) {
            return reject(RejectionKind::Invalid, "ttl and wait_timeout must be longer than 0 when given");
        }
        if agent.liveness == Liveness::Gone {
            return reject(RejectionKind::InvalidState, format!("agent {} is gone", agent.name));
        }
        let name = resource.reference();
        if let Some(parent) = resource.upstream_suspect() {
            return reject(
                RejectionKind::InvalidState,
                format!("resource {name} is suspect-upstream (parent {parent} is suspect); acquire refused"),
            );
        }
        self.check_priority(command.priority)?;
        let (n_active, n_waiting) = count_leases(self.state.live_leases_of(resource));
        let capacity = u64::from(resource.capacity);
        let n_live = n_active + n_waiting;
        match &resource.state {
            ResourceState::Pending if n_live < capacity && command.priority == 0 => {
                self.out.push(Effect::LeaseWaiting {
                    lease: command.lease,
                    resource: resource.id,
                    holder: command.holder.clone(),
                    ttl: command.ttl,
                    wait_until: command.wait_timeout.map(|w| self.now.saturating_add(w)),
                });
                Ok(())
            }
            // Only the leases beyond its capacity are its queue: those within it (`lease-waiting`, or queued by
            // priority) are all granted at its activation.
            ResourceState::Pending if n_live < capacity || command.wait_timeout.is_some() => {
                self.queue(command, resource, n_live.saturating_sub(capacity))
            }
            ResourceState::Pending => reject(
                RejectionKind::AtCapacity,
                format!(
                    "resource {name} is pending with {n_live} of {capacity} leases already waiting; give a wait \
                     timeout to queue"
                ),
            ),
            ResourceState::Active if n_active < capacity && n_waiting == 0 => {
                self.out.push(Effect::LeaseGranted {
                    lease: command.lease,
                    resource: resource.id,
                    holder: command.holder.clone(),
                    ttl: command.ttl,
                    expires_at: command.ttl.map(|ttl| self.now.saturating_add(ttl)),
                });
                Ok(())
            }
            ResourceState::Active if command.wait_timeout.is_some() => self.queue(command, resource, n_waiting),
            ResourceState::Active => reject(
                RejectionKind::AtCapacity,
                format!(
                    "resource {name} is at capacity ({n_active} of {capacity} leases held, {n_waiting} waiting); give \
                     a wait timeout to queue"
                ),
            ),
            state => {
                reject(RejectionKind::InvalidState, format!("resource {name} is {}; acquire refused", state.name()))
            }
        }
    }

    /// Refuses a priority above the cap the partition's policy gives the issuer.
    fn check_priority(&self, priority: u8) -> Verdict {
        let (cap, prefix) = self.state.priority_cap_of(self.issuer.as_str());
        if priority <= cap {
            return Ok(());
        }
        let named = match prefix {
            Some(prefix) => format!("{cap} (the cap of issuers starting with {prefix:?})"),
            None => "0 (no priority cap names it)".to_owned(),
        };
        reject(
            RejectionKind::NotPermitted,
            format!(
                "priority {priority} is above what {} may ask for: {named}; ask for less, or have an operator raise \
                 the cap (`leasehold policy set --max-priority`)",
                self.issuer
            ),
        )
    }

    /// Records the lease waiting behind the others (`lease-queued`), unless the queue (`n_beyond`: the leases
    /// waiting beyond the resource's capacity) is full.
    fn queue(&mut self, command: &Acquire, resource: &Resource, n_beyond: u64) -> Verdict {
        if n_beyond >= MAX_QUEUED as u64 {
            return reject(
                RejectionKind::AtCapacity,
                format!(
                    "resource {} has {n_beyond} leases waiting beyond its capacity, the most one resource queues; \
                     try again later",
                    resource.reference()
                ),
            );
        }
        self.out.push(Effect::LeaseQueued {
            lease: command.lease,
            resource: resource.id,
            holder: command.holder.clone(),
            ttl: command.ttl,
            wait_until: command.wait_timeout.map(|w| self.now.saturating_add(w)),
            priority: command.priority,
        });
        Ok(())
    }

    pub(super) fn renew(&mut self, command: &Renew) -> Verdict {
        let lease = self.lease(&command.agent, command.lease)?;
        // Renews of a lease are ordered by their ids: one stamped far ahead would make every later one look older.
        // Every command id stamped more than `MAX_ID_AHEAD` ahead of the log is refused before this.
        // First: a renew older than the last one may be a retry of a renew decided long ago (only the last one is
        // remembered), which must not be decided again, whatever the lease's state now.
        if let Some((last, _)) = lease.last_renew
            && self.command_id.is_some_and(|id| id <= last)
        {
            return reject(
                RejectionKind::StaleCommand,
                format!(
                    "lease {} was last renewed by command {last}; this renew's id is older (renews of one lease are \
                     decided in the order their holder made them)",
                    lease.id
                ),
            );
        }
        let LeaseState::Active { token, expires_at } = lease.state else {
            return reject(
                RejectionKind::InvalidState,
                format!("lease {} is {}; only an active lease can be renewed", lease.id, lease.state.name()),
            );
        };
        if token != command.token {
            return reject(
                RejectionKind::TokenMismatch,
                format!(
                    "token {} is not the token of lease {}: renew with the token its grant returned (it is not \
                     shown here, so that a stale holder cannot learn it)",
                    command.token, lease.id
                ),
            );
        }
        if let Some(expires_at) = expires_at
            && expires_at <= self.now
        {
            return reject(
                RejectionKind::InvalidState,
                format!("lease {} expired at {expires_at}; acquire a new one", lease.id),
            );
        }
        if command.ttl.is_some_and(|ttl| ttl.0 == 0) {
            return reject(RejectionKind::Invalid, "ttl must be longer than 0 when given");
        }
        let ttl = command.ttl.or(lease.ttl);
        self.check_max_lease(lease, ttl.map(|ttl| self.now.saturating_add(ttl)))?;
        self.out.push(Effect::LeaseRenewed {
            lease: lease.id,
            ttl,
            expires_at: ttl.map(|ttl| self.now.saturating_add(ttl)),
        });
        Ok(())
    }

    pub(super) fn release_lease(&mut self, command: &ReleaseLease) -> Verdict {
        let lease = self.lease(&command.agent, command.lease)?;
        match (&lease.state, command.token) {
            (LeaseState::Waiting { .. }, None) => {}
            (LeaseState::Waiting { .. }, Some(token)) => {
                return reject(
                    RejectionKind::TokenMismatch,
                    format!("lease {} is still waiting and has no token; {token} is not its token", lease.id),
                );
            }
            (LeaseState::Active { token, .. }, Some(given)) if *token == given => {}
            (LeaseState::Active { .. }, given) => {
                let given = given.map(|g| format!("token {g} is not its token")).unwrap_or_else(|| {
                    "the release gave no token, and an active lease is released only with its token".to_owned()
                });
                return reject(RejectionKind::TokenMismatch, format!("lease {} is active; {given}", lease.id));
            }
            (state, _) => {
                return reject(RejectionKind::AlreadyDone, format!("lease {} is already {}", lease.id, state.name()));
            }
        }
        self.out.push(Effect::LeaseReleased { lease: lease.id });
        self.serve_after(lease);
        Ok(())
    }

    /// Refuses a renew that would hold `lease` until `until` (`None`: until released) past its resource's
    /// `max_lease` from its grant, while other leases wait for the resource.
    fn check_max_lease(&self, lease: &Lease, until: Option<leasehold_schemas::Timestamp>) -> Verdict {
        let Some(resource) = self.state.resources.get(&lease.resource) else {
            return Ok(());
        };
        let (Some(max), Some(granted_at)) = (resource.max_lease, lease.granted_at) else {
            return Ok(());
        };
        let (_, n_waiting) = count_leases(self.state.live_leases_of(resource));
        let limit = granted_at.saturating_add(max);
        if n_waiting == 0 || until.is_some_and(|until| until <= limit) {
            return Ok(());
        }
        let until = until.map_or_else(|| "until released".to_owned(), |until| format!("until {until}"));
        reject(
            RejectionKind::InvalidState,
            format!(
                "lease {} would be held {until}, past {limit}: resource {} lets a lease be held at most {max} from \
                 its grant ({granted_at}) while others wait ({n_waiting} waiting); release it and acquire again",
                lease.id,
                resource.reference()
            ),
        )
    }

    /// After an active lease ends, the queue of its resource is served (its room is free).
    fn serve_after(&mut self, lease: &Lease) {
        if let LeaseState::Active { .. } = lease.state
            && let Some(resource) = self.state.resources.get(&lease.resource)
        {
            self.serve_if_active(resource, resource.capacity, Some(lease.id));
        }
    }

    pub(super) fn expire_lease(&mut self, command: &ExpireLease) -> Verdict {
        let lease = self.lease(&command.agent, command.lease)?;
        match (&lease.state, crate::due::lease_due(lease)) {
            (LeaseState::Active { .. }, Some(at)) if at <= self.now => {
                self.out.push(Effect::LeaseExpired { lease: lease.id });
                self.serve_after(lease);
                Ok(())
            }
            (LeaseState::Active { .. }, Some(at)) => {
                reject(RejectionKind::NotYetDue, format!("lease {} expires at {at}", lease.id))
            }
            (LeaseState::Active { .. }, None) => {
                reject(RejectionKind::NothingToDo, format!("lease {} has no ttl; it lasts until released", lease.id))
            }
            _ => {
                reject(RejectionKind::NothingToDo, format!("lease {} is {}, not active", lease.id, lease.state.name()))
            }
        }
    }

    pub(super) fn wait_timeout(&mut self, command: &WaitTimeout) -> Verdict {
        let lease = self.lease(&command.agent, command.lease)?;
        match (&lease.state, crate::due::lease_due(lease)) {
            (LeaseState::Waiting { .. }, Some(until)) if until <= self.now => {
                self.out.push(Effect::LeaseFailed { lease: lease.id });
                Ok(())
            }
            (LeaseState::Waiting { .. }, Some(until)) => {
                reject(RejectionKind::NotYetDue, format!("lease {} may wait until {until}", lease.id))
            }
            (LeaseState::Waiting { .. }, None) => {
                reject(RejectionKind::NothingToDo, format!("lease {} has no wait timeout", lease.id))
            }
            _ => {
                reject(RejectionKind::NothingToDo, format!("lease {} is {}, not waiting", lease.id, lease.state.name()))
            }
        }
    }
}

/// The active and the waiting leases among `live`.
fn count_leases<'a>(live: impl Iterator<Item = &'a Lease>) -> (u64, u64) {
    live.fold((0, 0), |(active, waiting), lease| match lease.state {
        LeaseState::Active { .. } => (active + 1, waiting),
        LeaseState::Waiting { .. } => (active, waiting + 1),
        _ => (active, waiting),
    })
}
