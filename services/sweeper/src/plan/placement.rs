//! Placements (DESIGN section 13): pick an agent, carry its reservation back, commit the one the placement bound,
//! close the placement once that commit is on record, give back any other reservation, and say why nothing fits.
//!
//! Level-triggered like the rest of the plan: from the states alone, whatever was sent before. The choice of agent
//! is this view's; the agent's partition decides whether it really has room, at once, so a view that is behind costs
//! a refused reservation, never an agent past its capacity.

use std::collections::BTreeMap;

use leasehold_domain::PartitionState;
use leasehold_domain::state::{Agent, Placement, PlacementState, Reservation};
use leasehold_schemas::command::{
    BindPlacement, CancelReservation, ClosePlacement, CommitPlacement, PlacementStrategy, Reserve, Unplaceable,
};
use leasehold_schemas::ids::{Key, ResourceId, Source};
use leasehold_schemas::subjects::{partition_of_agent, partition_of_key};

use super::{Planned, States};

/// The reservations every agent holds, by the resource id of their placement.
type Reservations<'a> = BTreeMap<ResourceId, Vec<(&'a Agent, &'a Reservation, u32)>>;

fn reservations(states: &States) -> Reservations<'_> {
    let mut by_id: Reservations<'_> = BTreeMap::new();
    for state in states.values() {
        for agent in state.agents() {
            for (id, reservation) in &agent.reservations {
                by_id.entry(*id).or_default().push((agent, reservation, state.partition()));
            }
        }
    }
    by_id
}

/// Everything placements ask for now or later.
pub(super) fn placement_work(states: &States, out: &mut Vec<Planned>) {
    let Some(partitions) = states.values().next().map(PartitionState::partitions) else { return };
    let reservations = reservations(states);
    for state in states.values() {
        for placement in state.placements().filter(|p| p.is_open()) {
            let held = reservations.get(&placement.id()).map(Vec::as_slice).unwrap_or_default();
            seek(states, state, placement, held, out);
        }
    }
    for state in states.values() {
        for placement in state.placements() {
            close(states, placement, &reservations, out);
        }
    }
    for (id, held) in &reservations {
        let home = partition_of_key(&Key::Placement(*id), partitions);
        let Some(placement_home) = states.get(&home) else { continue };
        for (agent, reservation, partition) in held {
            // The commit names its placement's issuer where quotas are in use (so it is written in schema version
            // 6 only then): the agent's partition charges the issuer's quota, if any.
            let quotas = states.get(partition).is_some_and(|s| !s.quotas().is_empty());
            settle(placement_home, *id, agent, reservation, (*partition, quotas), out);
        }
    }
}

/// An open placement: bind a reservation it has, or reserve room on the best agent, or say why none fits.
fn seek(
    states: &States,
    state: &PartitionState,
    placement: &Placement,
    held: &[(&Agent, &Reservation, u32)],
    out: &mut Vec<Planned>,
) {
    let id = placement.id();
    let own = Source { partition: state.partition(), position: placement.wanted_at };
    // Carried back by `settle`; nothing more to ask while one of this placement's reservations is held on an agent
    // that takes it. Room held on one that stopped taking work (cordoned, draining, retired, gone) or declared since
    // that it has no room for it (other labels, less capacity) is not bound while another agent may take the
    // request, and not given back either: a view that is behind cannot tell that it was not bound already (only an
    // ended placement, or one bound elsewhere, gives it back).
    if held.iter().any(|(agent, reservation, _)| reservation.source == own && takes(agent, reservation, placement)) {
        return;
    }
    let request = &placement.request;
    let fit = Fit::of(states, placement);
    // Why the request cannot be placed now, if it cannot; what its deadline says when it comes.
    let why = match fit.best(request.strategy) {
        Some(agent) => {
            out.push(Planned::now(
                format!("reserve {id} {} {}", agent.name, placement.wanted_at),
                Reserve {
                    agent: agent.name.clone(),
                    resource: id,
                    kind: request.kind.clone(),
                    select: request.select.clone(),
                    source: own,
                },
            ));
            "no agent took it in time".to_owned()
        }
        None => {
            let why = fit.why(placement);
            if !matches!(&placement.state, PlacementState::Waiting { why: w, .. } if *w == why) {
                out.push(Planned::now(
                    format!("unplaceable {id} {why}"),
                    Unplaceable { resource: id, why: why.clone() },
                ));
            }
            why
        }
    };
    if let Some(until) = placement.until {
        out.push(Planned::at(format!("unplaceable {id} at {until}"), until, Unplaceable { resource: id, why }));
    }
}

/// A bound placement whose reservation has ended on its agent, as a view past the reservation's token sees: closed,
/// so its partition may forget it a horizon later.
fn close(states: &States, placement: &Placement, reservations: &Reservations<'_>, out: &mut Vec<Planned>) {
    let PlacementState::Bound { agent, token, closed: false, .. } = &placement.state else { return };
    let id = placement.id();
    let Some(agent_home) = states.values().next().map(|s| partition_of_agent(agent, s.partitions())) else { return };
    let Some(agent_state) = states.get(&agent_home) else { return };
    let held = reservations.get(&id).is_some_and(|held| {
        held.iter().any(|(holder, reservation, _)| holder.name == *agent && reservation.token == *token)
    });
    if held || agent_state.last_position() <= *token {
        return;
    }
    out.push(Planned::now(
        format!("close-placement {id} {agent} {token}"),
        ClosePlacement {
            resource: id,
            agent: agent.clone(),
            token: *token,
            source: Source { partition: agent_home, position: agent_state.last_position() },
        },
    ));
}

/// One reservation: carry it to its placement, commit it once bound, or give it back.
fn settle(
    placement_home: &PartitionState,
    id: ResourceId,
    agent: &Agent,
    reservation: &Reservation,
    (partition, quotas): (u32, bool),
    out: &mut Vec<Planned>,
) {
    let token = reservation.token;
    let as_far_as_seen = Source { partition: placement_home.partition(), position: placement_home.last_position() };
    let cancel = || {
        Planned::now(
            format!("cancel-reservation {id} {} {token}", agent.name),
            CancelReservation { agent: agent.name.clone(), resource: id, token, source: as_far_as_seen },
        )
    };
    let Some(placement) = placement_home.placement(id) else {
        // Forgotten after it ended, or not seen yet by this view: only a view past the reservation's source knows.
        if as_far_as_seen.position > reservation.source.position {
            out.push(cancel());
        }
        return;
    };
    if reservation.source != (Source { partition: placement_home.partition(), position: placement.wanted_at }) {
        out.push(cancel());
        return;
    }
    match &placement.state {
        // Room held on an agent that since stopped taking new work (cordoned, draining, retired, gone), or declared
        // it has no room for it any more: kept, and the placement looks elsewhere (`seek`); bound if the agent takes
        // it again first.
        PlacementState::Seeking | PlacementState::Waiting { .. } if !takes(agent, reservation, placement) => {}
        PlacementState::Seeking | PlacementState::Waiting { .. } => {
            out.push(Planned::now(
                format!("bind-placement {id} {} {token}", agent.name),
                BindPlacement {
                    resource: id,
                    agent: agent.name.clone(),
                    token,
                    used: reservation.used,
                    capacity: reservation.capacity,
                    source: Source { partition, position: token },
                },
            ));
        }
        PlacementState::Bound { agent: bound, token: bound_token, .. }
            if *bound == agent.name && *bound_token == token =>
        {
            out.push(Planned::now(
                format!("commit-placement {id} {} {token}", agent.name),
                CommitPlacement {
                    allocation: placement.request.allocation_on(agent.name.clone()),
                    token,
                    source: Source { partition: placement_home.partition(), position: placement.wanted_at },
                    principal: quotas.then(|| placement.issuer.clone()),
                },
            ));
        }
        PlacementState::Bound { .. } | PlacementState::Failed { .. } | PlacementState::Cancelled { .. } => {
            out.push(cancel());
        }
    }
}

/// Whether `agent` takes the placement's room it holds now: it takes new work, carries the labels selected, and its
/// resources of the kind with its reservations of the kind up to this one (the older ones first) are within the
/// capacity it declares. An agent that registered again declaring other labels, or less room than it had reserved,
/// does not take what it no longer has room for: the placement looks elsewhere, as from a cordoned agent.
fn takes(agent: &Agent, reservation: &Reservation, placement: &Placement) -> bool {
    if agent.unschedulable().is_some() || !agent.matches(&placement.request.select) {
        return false;
    }
    let kind = &*reservation.kind;
    let capacity = agent.capacity.get(kind).copied().unwrap_or(0);
    let made = agent.by_kind.get(kind).copied().unwrap_or(0);
    let before = agent.reservations.values().filter(|r| &*r.kind == kind && r.token <= reservation.token).count();
    u64::from(made) + before as u64 <= u64::from(capacity)
}

/// The agents a placement could go to, and what keeps the others out.
struct Fit<'a> {
    /// Agents with the labels, that take the kind, are schedulable and have room: (agent, used, capacity).
    candidates: Vec<(&'a Agent, u32, u32)>,
    labelled: usize,
    taking: usize,
    full: usize,
    unschedulable: BTreeMap<&'static str, usize>,
}

impl<'a> Fit<'a> {
    fn of(states: &'a States, placement: &Placement) -> Self {
        let request = &placement.request;
        let mut fit = Fit { candidates: Vec::new(), labelled: 0, taking: 0, full: 0, unschedulable: BTreeMap::new() };
        for state in states.values() {
            for agent in state.agents().filter(|a| a.matches(&request.select)) {
                fit.labelled += 1;
                let capacity = agent.capacity.get(request.kind.as_str()).copied().unwrap_or(0);
                if capacity == 0 {
                    continue;
                }
                fit.taking += 1;
                if let Some(why) = agent.unschedulable() {
                    *fit.unschedulable.entry(why.word()).or_default() += 1;
                    continue;
                }
                let used = agent.used(&request.kind);
                if used >= capacity {
                    fit.full += 1;
                    continue;
                }
                // The id taken in this agent's partition (see `PartitionState::id_taken`): its reservation would be
                // refused, so it is no candidate (asked again and again, it would keep the request seeking).
                if state.id_taken(agent, request.resource).is_some() {
                    continue;
                }
                fit.candidates.push((agent, used, capacity));
            }
        }
        fit
    }

    /// Spread: the fewest of the kind; pack: the most, under capacity. Ties go to the name.
    fn best(&self, strategy: PlacementStrategy) -> Option<&'a Agent> {
        let by_name = |a: &&(&Agent, u32, u32)| a.0.name.clone();
        let chosen = match strategy {
            PlacementStrategy::Spread => self.candidates.iter().min_by_key(|c| (c.1, by_name(c))),
            PlacementStrategy::Pack => self.candidates.iter().min_by_key(|c| (std::cmp::Reverse(c.1), by_name(c))),
        };
        chosen.map(|c| c.0)
    }

    /// What is missing, in a few words: "zone=a: no agent has these labels", "zone=a: 3 agents full".
    fn why(&self, placement: &Placement) -> String {
        let request = &placement.request;
        let labels: Vec<String> = request.select.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let scope = if labels.is_empty() { "any agent".to_owned() } else { labels.join(",") };
        let plural = |n: usize, what: &str| if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") };
        if self.labelled == 0 {
            let none = if labels.is_empty() { "no agent has registered" } else { "no agent has these labels" };
            return format!("{scope}: {none}");
        }
        if self.taking == 0 {
            return format!("{scope}: no agent takes {} (none declared a capacity for it)", request.kind);
        }
        let mut parts = Vec::new();
        if self.full > 0 {
            parts.push(format!("{} full", plural(self.full, "agent")));
        }
        for (word, n) in &self.unschedulable {
            parts.push(format!("{} {word}", plural(*n, "agent")));
        }
        if parts.is_empty() {
            return format!(
                "{scope}: the only agents that fit cannot take resource id {} (it is, or was, used in their partitions)",
                request.resource
            );
        }
        format!("{scope}: {}", parts.join(", "))
    }
}
