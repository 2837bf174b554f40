//! Placement: an allocation that names no agent (DESIGN section 13), shaped like a pool's claim.
//!
//! The placement lives in the partition of its resource id (`~<id>`); capacity lives in each agent's partition.
//! 1. `op.place` records the request (`placement-wanted`).
//! 2. The sweeper picks an agent from its view and sends `sys.reserve` there; the agent's partition holds room
//!    (`capacity-reserved`, counted against its capacity) only if the agent is live, schedulable, carries the labels
//!    and has room, all decided at once, so two placements never put it past its capacity.
//! 3. The sweeper carries the reservation back (`sys.bind-placement`); the placement binds the first one it hears
//!    of and no other (`placement-bound`).
//! 4. The sweeper sends `sys.commit-placement` to the bound agent, which turns the reservation into the resource;
//!    any other reservation of the same placement is given back (`sys.cancel-reservation`).
//! 5. Once the bound reservation has ended on the agent, the sweeper closes the placement
//!    (`sys.close-placement`): only then is it forgotten, a horizon later. Until then a commit, however late, finds
//!    it, and no reservation it bound is ever given back.
//!
//! Only a commit makes the resource, and a commit exists only for the one binding, so a request makes at most one
//! resource whatever is retried, reordered or crashes. No agent fits: `sys.unplaceable` records what is missing,
//! and the placement waits (`--wait`) or is refused.

use leasehold_schemas::command::{
    BindPlacement, CancelPlacement, CancelReservation, ClosePlacement, CommitPlacement, Place, Reserve, Unplaceable,
};
use leasehold_schemas::ids::{Key, ResourceId, Source};
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};
use leasehold_schemas::{Rejection, RejectionKind};

use super::quotas::QuotaCharge;
use super::resources::check_request;
use super::{Decider, Verdict, check_text, echo, reject};
use crate::state::{IdTaken, Liveness, Placement, PlacementState};

/// At most this many labels in a placement's selector.
const MAX_SELECT: usize = 16;

/// "placed on w3 (12 of 50 container)", "waiting: all 4 full", "failed: ...": a placement's state in words.
pub(super) fn placement_text(placement: &Placement) -> String {
    match &placement.state {
        PlacementState::Seeking => "seeking an agent".to_owned(),
        PlacementState::Waiting { why, since } => format!("waiting for room since {since}: {why}"),
        PlacementState::Bound { agent, used, capacity, .. } => {
            format!("placed on {agent} ({used} of {capacity} {})", placement.request.kind)
        }
        PlacementState::Failed { why, .. } => format!("not placed: {why}"),
        PlacementState::Cancelled { by, .. } => format!("cancelled by {by}"),
    }
}

impl<'s> Decider<'s> {
    fn placement(&self, id: ResourceId) -> Result<&'s Placement, Rejection> {
        self.state
            .placements
            .get(&id)
            .ok_or_else(|| Rejection::new(RejectionKind::Unknown, format!("no placement of resource {id} is known")))
    }

    /// Refuses a `source` outside the partition of the placement of `id`: `what` (a reservation, a commit, a cancel)
    /// answers that placement, so it comes from there.
    fn check_from_placement(&self, id: ResourceId, source: Source, what: &str) -> Verdict {
        let home = partition_of_key(&Key::Placement(id), self.state.partitions);
        if source.partition != home {
            return reject(
                RejectionKind::Invalid,
                format!("the placement of {id} lives in partition {home}; {what} cannot come from {source}"),
            );
        }
        Ok(())
    }

    pub(super) fn place(&mut self, command: &Place) -> Verdict {
        let id = command.resource;
        if let Some(existing) = self.state.placements.get(&id) {
            if existing.request == *command {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("the placement of {id} was already asked for: {}", placement_text(existing)),
                );
            }
            return reject(
                RejectionKind::AlreadyExists,
                format!(
                    "a different placement of resource {id} exists ({}); choose a fresh UUIDv7",
                    placement_text(existing)
                ),
            );
        }
        self.check_fresh_id("resource id", &id, id.time(), RejectionKind::Invalid)?;
        if let Some(wait) = command.wait
            && wait.0 == 0
        {
            return reject(RejectionKind::Invalid, "a wait of 0 gives up at once; give a longer one, or none");
        }
        check_request(&command.kind, command.capacity, &command.attributes, &command.pools)?;
        self.check_no_quota_pool(&command.pools)?;
        if command.select.len() > MAX_SELECT {
            return reject(
                RejectionKind::Invalid,
                format!("{} labels selected; at most {MAX_SELECT}", command.select.len()),
            );
        }
        for (key, value) in &command.select {
            check_text("label", key)?;
            check_text("label value", value)?;
            if key.is_empty() {
                return reject(RejectionKind::Invalid, "a selected label needs a name (k=v)");
            }
        }
        if let Some(parent) = &command.parent {
            if parent.resource == id {
                return reject(RejectionKind::Invalid, format!("resource {id} cannot be its own parent"));
            }
            self.check_not_ahead("parent id", &parent.resource, parent.resource.time())?;
        }
        let until = command.wait.map(|wait| self.now.saturating_add(wait));
        self.out.push(Effect::PlacementWanted { request: command.clone(), until });
        Ok(())
    }

    pub(super) fn cancel_placement(&mut self, command: &CancelPlacement) -> Verdict {
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        let placement = self.placement(command.resource)?;
        match &placement.state {
            PlacementState::Seeking | PlacementState::Waiting { .. } => {
                self.out.push(Effect::PlacementCancelled {
                    resource: command.resource,
                    by: self.issuer.clone(),
                    reason: command.reason.clone(),
                });
                Ok(())
            }
            PlacementState::Bound { agent, .. } => reject(
                RejectionKind::InvalidState,
                format!(
                    "the placement of {} is already placed on {agent}; release {agent}.{} instead",
                    command.resource, command.resource
                ),
            ),
            PlacementState::Failed { .. } | PlacementState::Cancelled { .. } => reject(
                RejectionKind::AlreadyDone,
                format!("the placement of {} already ended: {}", command.resource, placement_text(placement)),
            ),
        }
    }

    pub(super) fn bind_placement(&mut self, command: &BindPlacement) -> Verdict {
        let home = partition_of_agent(&command.agent, self.state.partitions);
        if command.source != (Source { partition: home, position: command.token }) {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "a reservation of agent {} is its capacity-reserved in partition {home}, whose position is the \
                     token {}; not {}",
                    command.agent, command.token, command.source
                ),
            );
        }
        let placement = self.placement(command.resource)?;
        match &placement.state {
            PlacementState::Seeking | PlacementState::Waiting { .. } => {
                self.out.push(Effect::PlacementBound {
                    resource: command.resource,
                    agent: command.agent.clone(),
                    token: command.token,
                    used: command.used,
                    capacity: command.capacity,
                });
                Ok(())
            }
            PlacementState::Bound { agent, token, .. } if *agent == command.agent && *token == command.token => reject(
                RejectionKind::AlreadyDone,
                format!("the placement of {} is already bound to this reservation", command.resource),
            ),
            // Bound to another reservation, or ended: this one is given back (the sweeper cancels it).
            _ => reject(
                RejectionKind::InvalidState,
                format!(
                    "the placement of {} is {}; the reservation of {} at {} is not bound",
                    command.resource,
                    placement_text(placement),
                    command.agent,
                    command.token
                ),
            ),
        }
    }

    pub(super) fn unplaceable(&mut self, command: &Unplaceable) -> Verdict {
        check_text("why", &command.why)?;
        let placement = self.placement(command.resource)?;
        if !placement.is_open() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("the placement of {} already ended: {}", command.resource, placement_text(placement)),
            );
        }
        match placement.until {
            None => {
                self.out.push(Effect::PlacementFailed { resource: command.resource, why: command.why.clone() });
            }
            Some(until) if until <= self.now => {
                let waited = until.since(placement.at);
                let why = format!("no room within {waited}: {}", command.why);
                self.out.push(Effect::PlacementFailed { resource: command.resource, why });
            }
            Some(_) => {
                if matches!(&placement.state, PlacementState::Waiting { why, .. } if *why == command.why) {
                    return reject(
                        RejectionKind::NothingToDo,
                        format!("the placement of {} already waits: {}", command.resource, command.why),
                    );
                }
                self.out.push(Effect::PlacementWaiting { resource: command.resource, why: command.why.clone() });
            }
        }
        Ok(())
    }

    pub(super) fn reserve(&mut self, command: &Reserve) -> Verdict {
        let id = command.resource;
        self.check_from_placement(id, command.source, "a reservation")?;
        let agent = self.agent(&command.agent)?;
        if let Some(reservation) = agent.reservations.get(&id) {
            return reject(
                RejectionKind::AlreadyDone,
                format!("agent {} already holds room for {id} (at {})", agent.name, reservation.token),
            );
        }
        if let Some(taken) = self.state.id_taken(agent, id) {
            let why = match taken {
                IdTaken::Exists(existing) => {
                    format!("resource {} already exists ({})", existing.reference(), existing.state.name())
                }
                IdTaken::Absent => format!(
                    "resource id {id} was recorded here as never allocated (a child's adoption asked for it as its \
                     parent, and was answered \"absent\"); agent {} takes no placement of it",
                    agent.name
                ),
                IdTaken::UsedBefore => {
                    format!("resource id {id} was used on agent {} before; it takes no placement of it", agent.name)
                }
                IdTaken::MaybeForgotten => format!(
                    "resource id {id} was made at {}, no later than what this partition has forgotten (up to {}): it \
                     may have been used here before; agent {} takes no placement of it",
                    id.time(),
                    self.state.forgotten_up_to,
                    agent.name
                ),
            };
            return reject(RejectionKind::AlreadyExists, why);
        }
        if let Some(why) = agent.unschedulable() {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} is {why}; no new placements on it", &agent.name),
            );
        }
        if !agent.matches(&command.select) {
            let missing: Vec<String> = command
                .select
                .iter()
                .filter(|(k, v)| agent.labels.get(*k) != Some(*v))
                .map(|(k, v)| format!("{}={}", echo(k), echo(v)))
                .collect();
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} does not carry {}", agent.name, missing.join(", ")),
            );
        }
        let capacity = agent.capacity.get(command.kind.as_str()).copied().unwrap_or(0);
        if capacity == 0 {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} takes no {} (it declared no capacity for it)", agent.name, echo(&command.kind)),
            );
        }
        let used = agent.used(&command.kind);
        if used >= capacity {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {} is full for {}: {used} of {capacity}", agent.name, command.kind),
            );
        }
        self.out.push(Effect::CapacityReserved {
            resource: id,
            kind: command.kind.clone(),
            source: command.source,
            used: used + 1,
            capacity,
        });
        Ok(())
    }

    pub(super) fn commit_placement(&mut self, command: &CommitPlacement) -> Verdict {
        let allocation = &command.allocation;
        let id = allocation.resource;
        self.check_from_placement(id, command.source, "a commit")?;
        let agent = self.agent(&allocation.agent)?;
        match agent.reservations.get(&id) {
            Some(reservation) if reservation.token == command.token => {
                if *reservation.kind != *allocation.kind {
                    return reject(
                        RejectionKind::Invalid,
                        format!(
                            "the room held for {id} on agent {} is for {}, not {}",
                            agent.name,
                            reservation.kind,
                            echo(&allocation.kind)
                        ),
                    );
                }
            }
            Some(reservation) => {
                return reject(
                    RejectionKind::TokenMismatch,
                    format!(
                        "agent {} holds room for {id} with token {}, not {}",
                        agent.name, reservation.token, command.token
                    ),
                );
            }
            None => {
                if let Some(existing) = self.state.resources.get(&id).filter(|r| r.agent == agent.name) {
                    return reject(
                        RejectionKind::AlreadyDone,
                        format!(
                            "resource {} was already made by its placement ({})",
                            existing.reference(),
                            existing.state.name()
                        ),
                    );
                }
                return reject(
                    RejectionKind::Unknown,
                    format!("agent {} holds no room for {id} (token {})", agent.name, command.token),
                );
            }
        }
        if let Some(existing) = self.state.resources.get(&id) {
            return reject(
                RejectionKind::AlreadyExists,
                format!(
                    "resource id {id} is already {} here; no resource is made for this placement",
                    existing.reference()
                ),
            );
        }
        // A commit planned from a view that had not seen the quotas names no principal: refused, so the sweeper asks
        // again from a view that has, and no placement escapes a quota recorded here.
        if command.principal.is_none() && !self.state.quotas.is_empty() {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "quotas are recorded in this partition: a commit names its placement's issuer (principal) so its \
                     quota counts resource {id}"
                ),
            );
        }
        self.out.push(Effect::ReservationEnded { resource: id, token: command.token, committed: true });
        // The placement bound this room and said where: the resource is made here whatever happened since. One that
        // can no longer live here ends at once, for that reason: its agent went (orphaned), was retired (released),
        // or a parent here left (released, as a cascade would release it).
        let parent_left = allocation.parent.as_ref().filter(|parent| {
            partition_of_agent(&parent.agent, self.state.partitions) == self.state.partition
                && self
                    .state
                    .resources
                    .get(&parent.resource)
                    .is_none_or(|p| p.agent != parent.agent || p.state.has_left())
        });
        let charge = self.quota_charge(command.principal.as_ref(), &allocation.kind);
        let ends_at_birth = if agent.liveness == Liveness::Gone {
            Some(Effect::ResourceOrphaned { resource: id })
        } else if agent.retired {
            Some(Effect::ResourceReleasing { resource: id, cause: ReleaseCause::AgentRetired {} })
        } else if let QuotaCharge::Refused { quota, kind } = &charge {
            Some(Effect::ResourceReleasing { resource: id, cause: QuotaCharge::refused_cause(quota, kind) })
        } else {
            parent_left.map(|parent| Effect::ResourceReleasing {
                resource: id,
                cause: ReleaseCause::ParentLeft { parent: parent.clone() },
            })
        };
        if let Some(end) = ends_at_birth {
            self.out.push(Effect::ResourceAllocated {
                resource: id,
                kind: allocation.kind.clone(),
                capacity: allocation.capacity,
                attributes: allocation.attributes.clone(),
                parent: allocation.parent.clone(),
            });
            self.out.push(end);
            return Ok(());
        }
        self.allocation_effects(allocation, charge)
    }

    pub(super) fn close_placement(&mut self, command: &ClosePlacement) -> Verdict {
        let home = partition_of_agent(&command.agent, self.state.partitions);
        if command.source.partition != home || command.source.position <= command.token {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "the reservation {} of agent {} ends in partition {home}, after its token; {} is not past it",
                    command.token, command.agent, command.source
                ),
            );
        }
        let placement = self.placement(command.resource)?;
        match &placement.state {
            PlacementState::Bound { agent, token, closed, .. }
                if *agent == command.agent && *token == command.token =>
            {
                if *closed {
                    return reject(
                        RejectionKind::AlreadyDone,
                        format!("the placement of {} is already closed", command.resource),
                    );
                }
                self.out.push(Effect::PlacementClosed { resource: command.resource });
                Ok(())
            }
            _ => reject(
                RejectionKind::InvalidState,
                format!(
                    "the placement of {} is {}; the reservation of {} at {} is not the one it bound",
                    command.resource,
                    placement_text(placement),
                    command.agent,
                    command.token
                ),
            ),
        }
    }

    pub(super) fn cancel_reservation(&mut self, command: &CancelReservation) -> Verdict {
        let id = command.resource;
        self.check_from_placement(id, command.source, "a cancel")?;
        let agent = self.agent(&command.agent)?;
        match agent.reservations.get(&id) {
            Some(reservation) if reservation.token == command.token => {
                self.out.push(Effect::ReservationEnded { resource: id, token: command.token, committed: false });
                Ok(())
            }
            Some(reservation) => reject(
                RejectionKind::TokenMismatch,
                format!(
                    "agent {} holds room for {id} with token {}, not {}",
                    agent.name, reservation.token, command.token
                ),
            ),
            None => reject(
                RejectionKind::AlreadyDone,
                format!("agent {} holds no room for {id} (token {})", agent.name, command.token),
            ),
        }
    }
}
