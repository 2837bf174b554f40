//! Observations: `report-created`, sync reports, resync chunks, failure reports and health results (DESIGN
//! section 6).
//!
//! The rules, exactly:
//! - an observation whose (epoch, number) is not newer than the last one decided for the agent is stale;
//! - `created` (or held, in a chunk) on a `pending` resource: `active`;
//! - absent on a `releasing` resource whose destruction position is `<= watermark`: `destroyed`, claims freed;
//! - absent on an `active`/`paused`/`suspect` resource whose creation position is `<= watermark` and whose last
//!   observation of presence is older: `lost` (leases break, claims free), unless the circuit breaker holds;
//! - a resource created after the watermark is never judged (the agent could not have known of it);
//! - in-flight creates and destroys count as present: they are never judged;
//! - a count/digest that disagrees with the writer's view asks for a full resync;
//! - every chunk is decided on its own.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_schemas::command::{
    FailureKind, HandleDigest, HealthResult, MAX_REPORT_HANDLES, ReportCreated, ReportFailure, ResyncChunk, SyncReport,
};
use leasehold_schemas::ids::{AgentName, ObsStamp, Position, ResourceId};
use leasehold_schemas::outcome::{BreakReason, BreakerClear, Effect, ReleaseCause, ResyncReason, SuspectCause, Work};
use leasehold_schemas::{Rejection, RejectionKind, codec};

use super::{Decider, Verdict, check_text, reject};
use crate::state::{Agent, PartitionState, Resource, ResourceState};

/// What a report says of one handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Present,
    Absent,
    /// A create or destroy still running: counts as present, is never judged.
    InFlight,
}

type Judged<'s> = Vec<(&'s Resource, Seen)>;

/// Whether an absent handle would make its resource `lost`.
fn would_lose(resource: &Resource, seen: Seen, stamp: ObsStamp, watermark: Position) -> bool {
    seen == Seen::Absent
        && resource.state.is_held()
        && resource.creation_position() <= watermark
        && resource.last_present.is_none_or(|present| present < stamp)
}

/// Whether the writer counts a resource the report does not name in its view of the agent's listing as of
/// `watermark`: one the agent could know of (created at or before the watermark) that is held, or releasing and
/// seen present (not yet confirmed destroyed). A named handle counts by what the report says: absent ones do not,
/// present or in-flight ones do (DESIGN section 6: in-flight counts as present).
fn counted_in_view(resource: &Resource, watermark: Position) -> bool {
    resource.creation_position() <= watermark
        && (resource.state.is_held()
            || (matches!(resource.state, ResourceState::Releasing { .. }) && resource.last_present.is_some()))
}

/// Each handle named once, with what the report says of it; only this agent's known resources are judged (anything
/// else on the machine is garbage the agent destroys on its own).
fn report_verdicts<'s>(state: &'s PartitionState, agent: &Agent, report: &SyncReport) -> Result<Judged<'s>, Rejection> {
    let mut seen: BTreeMap<ResourceId, Seen> = BTreeMap::new();
    for id in &report.in_flight {
        seen.insert(*id, Seen::InFlight);
    }
    let lists = [(&report.created, Seen::Present), (&report.missing, Seen::Absent), (&report.destroyed, Seen::Absent)];
    for (ids, verdict) in lists {
        for id in ids {
            match seen.get(id) {
                Some(Seen::InFlight) => {}
                Some(other) if *other != verdict => {
                    return reject(
                        RejectionKind::Invalid,
                        format!("handle {id} is named both present and absent in one report"),
                    );
                }
                _ => {
                    seen.insert(*id, verdict);
                }
            }
        }
    }
    Ok(known(state, agent, seen))
}

fn known<'s>(state: &'s PartitionState, agent: &Agent, seen: BTreeMap<ResourceId, Seen>) -> Judged<'s> {
    seen.into_iter()
        .filter_map(|(id, verdict)| state.resources.get(&id).filter(|r| r.agent == agent.name).map(|r| (r, verdict)))
        .collect()
}

/// The count and digest the agent should have reported, after the report's own verdicts.
fn expected_view(
    state: &PartitionState,
    agent: &Agent,
    judged: &Judged<'_>,
    watermark: Position,
) -> (u64, HandleDigest) {
    let mut count = agent.n_held;
    let mut digest = agent.held_digest;
    for id in agent.held_by_creation.range(watermark.next()..).map(|(_, id)| id) {
        count -= 1;
        digest.remove(*id);
    }
    for id in agent.releasing.values() {
        if state.resources.get(id).is_some_and(|r| counted_in_view(r, watermark)) {
            count += 1;
            digest.add(*id);
        }
    }
    // Resources that left after the watermark and that the report does not name: in the report's view they were
    // still there, and an agent that had seen one present names it if it was gone (missing or destroyed), so one it
    // does not name it found present, and counted.
    let left_since: BTreeSet<ResourceId> =
        agent.left_by_position.range(watermark.next()..).map(|(_, id)| *id).collect();
    if !left_since.is_empty() {
        let named: BTreeSet<ResourceId> = judged.iter().map(|(r, _)| r.id).collect();
        for id in left_since.difference(&named) {
            if state.resources.get(id).is_some_and(|r| r.activated_pos.is_some_and(|at| at <= watermark)) {
                count += 1;
                digest.add(*id);
            }
        }
    }
    for (resource, seen) in judged {
        let counted = counted_in_view(resource, watermark);
        let named_present = matches!(seen, Seen::Present | Seen::InFlight);
        if counted && !named_present {
            count -= 1;
            digest.remove(resource.id);
        } else if !counted
            && named_present
            && resource.create_ordered.is_some_and(|at| at <= watermark)
            && (!resource.state.is_terminal() || left_since.contains(&resource.id))
        {
            count += 1;
            digest.add(resource.id);
        }
    }
    (count, digest)
}

/// The count and digest the writer expects in `report`, given what the report itself says: the handles of the
/// agent's assignment set as of the report's watermark that it holds (present or in flight) — held resources and
/// releasing ones seen present, minus those it names missing or destroyed, plus those it names created or in
/// flight. `None` if the agent is unknown or the report
/// contradicts itself. Agents in simulations and tests use it to send an honest report.
pub fn expected_listing(state: &PartitionState, report: &SyncReport) -> Option<(u64, HandleDigest)> {
    let agent = state.agents.get(&report.agent)?;
    let judged = report_verdicts(state, agent, report).ok()?;
    Some(expected_view(state, agent, &judged, report.watermark))
}

impl<'s> Decider<'s> {
    /// The observing agent, if the observation is from its current epoch and newer than the last one decided.
    pub(super) fn observer(
        &self,
        name: &AgentName,
        epoch: Position,
        obs: u64,
    ) -> Result<(&'s Agent, ObsStamp), Rejection> {
        let agent = self.incarnation(name, epoch, "observation")?;
        let stamp = ObsStamp { epoch, obs };
        if stamp <= agent.last_obs {
            return reject(
                RejectionKind::StaleObservation,
                format!(
                    "observation {obs} of agent {name} is not newer than the last one decided ({}); ignored",
                    agent.last_obs.obs
                ),
            );
        }
        Ok((agent, stamp))
    }

    /// Refuses a position an agent names (`what`: its report's watermark, the check it answers) that the log has
    /// not reached.
    pub(super) fn check_reached(&self, what: &str, position: Position) -> Verdict {
        if position > self.state.last_position() {
            return reject(
                RejectionKind::Invalid,
                format!("{what} {position} is beyond the last position {}", self.state.last_position()),
            );
        }
        Ok(())
    }

    pub(super) fn report_created(&mut self, command: &ReportCreated) -> Verdict {
        let (_, stamp) = self.observer(&command.agent, command.epoch, command.obs)?;
        if let Some(native_id) = &command.native_id {
            check_text("native id", native_id)?;
        }
        let resource = self.resource(&command.agent, command.resource)?;
        if resource.create_ordered.is_none() {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "resource {} was never ordered created (its claims are not all bound); a handle the agent made \
                     of it is not the resource",
                    resource.reference()
                ),
            );
        }
        self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
        self.observed_present(resource, stamp, command.native_id.clone(), None);
        Ok(())
    }

    /// A handle seen on the machine: a pending resource turns active if its create was ordered (as of the report's
    /// watermark: an agent cannot have made what it did not know of); any other resource not terminal is recorded
    /// as present at this observation (`resource-seen`): a releasing one whose create finished after its release must
    /// now be seen destroyed (and its create can no longer fail), and no observation older than this one can make a
    /// held one `lost`.
    fn observed_present(
        &mut self,
        resource: &Resource,
        stamp: ObsStamp,
        native_id: Option<String>,
        watermark: Option<Position>,
    ) {
        let ordered = resource.create_ordered.is_some_and(|at| watermark.is_none_or(|w| at <= w));
        match resource.state {
            // What the agent was never ordered to create (or could not know of yet) is not the resource.
            _ if !ordered => {}
            ResourceState::Pending => self.activate(resource, stamp, native_id),
            _ if resource.state.is_terminal() => {}
            _ => {
                self.out.push(Effect::ResourceSeen { resource: resource.id, stamp, native_id });
            }
        }
    }

    pub(super) fn sync(&mut self, report: &SyncReport) -> Verdict {
        let (agent, stamp) = self.observer(&report.agent, report.epoch, report.obs)?;
        let n_named = report.created.len() + report.missing.len() + report.destroyed.len() + report.in_flight.len();
        if n_named > MAX_REPORT_HANDLES {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "the report names {n_named} handles; at most {MAX_REPORT_HANDLES}: send the rest in the next \
                     report or as a full resync in chunks"
                ),
            );
        }
        self.check_reached("watermark", report.watermark)?;
        let judged = report_verdicts(self.state, agent, report)?;
        self.out.reserve(codec::encoded_len(&(&report.created, &report.missing, &report.destroyed)));
        self.out.push(Effect::ObservationAccepted { stamp, watermark: Some(report.watermark) });
        let n_losses = judged.iter().filter(|(r, seen)| would_lose(r, *seen, stamp, report.watermark)).count();
        let mark_losses = self.breaker(agent, n_losses, Some(report.watermark));
        if agent.breaker_bypass {
            self.out.push(Effect::AgentBreakerRearmed {});
        }
        let (count, digest) = expected_view(self.state, agent, &judged, report.watermark);
        if count != report.count || digest != report.digest {
            self.out.push(Effect::ResyncRequested {
                reason: ResyncReason::DigestMismatch { expected_count: count, reported_count: report.count },
            });
        }
        self.judge_report(report, judged, stamp, mark_losses);
        Ok(())
    }

    /// The circuit breaker: whether losses may be marked. Trips when the window's losses would reach
    /// `max_loss_min` and exceed `max_loss_percent` of what the agent held at the start of the window. While it
    /// holds, nothing is marked. Only a sync report (`report`: its watermark), which names every difference, at or
    /// past the watermark of the report that tripped it, clears it; a chunk sees one range only.
    fn breaker(&mut self, agent: &Agent, n_losses: usize, report: Option<Position>) -> bool {
        if agent.breaker_bypass {
            return true;
        }
        let may_clear = agent.breaker.is_some_and(|b| report.is_some_and(|w| w >= b.watermark));
        if agent.breaker.is_some() && !may_clear {
            return false;
        }
        let settings = self.state.settings_of(agent);
        let in_window = u64::from(agent.losses_in_window(settings.loss_window, self.now));
        let total = in_window + n_losses as u64;
        let held_at_window_start = agent.n_held + in_window;
        let trips = n_losses > 0
            && total >= u64::from(settings.max_loss_min)
            && total * 100 > held_at_window_start * u64::from(settings.max_loss_percent);
        if trips {
            if agent.breaker.is_none() {
                self.out.push(Effect::AgentSuspect { would_lose: n_losses as u32, live: agent.n_held as u32 });
            }
            false
        } else {
            if agent.breaker.is_some() && may_clear {
                self.out.push(Effect::AgentBreakerCleared { reason: BreakerClear::HandlesBack {} });
            }
            true
        }
    }

    /// Applies the verdicts on one resource.
    fn judge(&mut self, resource: &Resource, seen: Seen, stamp: ObsStamp, watermark: Position, mark_losses: bool) {
        match seen {
            Seen::InFlight => {}
            Seen::Present => self.observed_present(resource, stamp, None, Some(watermark)),
            Seen::Absent => {
                if would_lose(resource, seen, stamp, watermark) {
                    if mark_losses {
                        self.leave_for_good(resource, Effect::ResourceLost { resource: resource.id, stamp });
                    }
                } else if matches!(resource.state, ResourceState::Releasing { .. })
                    && resource.destruction_ordered.is_some_and(|at| at <= watermark)
                {
                    self.leave_for_good(resource, Effect::ResourceDestroyed { resource: resource.id, stamp });
                }
            }
        }
    }

    /// Judges every handle, stopping before the budget runs out; the rest goes to `rest`.
    fn judge_all(
        &mut self,
        judged: Judged<'s>,
        stamp: ObsStamp,
        watermark: Position,
        mark_losses: bool,
        rest: impl FnOnce(&[(&Resource, Seen)]) -> Work,
    ) {
        for (idx, (resource, seen)) in judged.iter().enumerate() {
            if idx > 0 && self.out.over_budget() {
                self.continue_later(rest(&judged[idx..]));
                return;
            }
            self.judge(resource, *seen, stamp, watermark, mark_losses);
        }
    }

    fn judge_report(&mut self, report: &SyncReport, judged: Judged<'s>, stamp: ObsStamp, mark_losses: bool) {
        let rest = |left: &[(&Resource, Seen)]| {
            let pick = |want: Seen| left.iter().filter(|(_, s)| *s == want).map(|(r, _)| r.id).collect();
            Work::Report {
                report: SyncReport {
                    created: pick(Seen::Present),
                    missing: pick(Seen::Absent),
                    ..SyncReport::new(report.agent.clone(), report.epoch, report.obs, report.watermark)
                },
                mark_losses,
            }
        };
        self.judge_all(judged, stamp, report.watermark, mark_losses, rest);
    }

    pub(super) fn continue_report(&mut self, agent: &'s Agent, report: &SyncReport, mark_losses: bool) {
        let stamp = ObsStamp { epoch: report.epoch, obs: report.obs };
        self.out.reserve(codec::encoded_len(&(&report.created, &report.missing)));
        let seen = report
            .created
            .iter()
            .map(|id| (*id, Seen::Present))
            .chain(report.missing.iter().map(|id| (*id, Seen::Absent)))
            .collect();
        let judged = known(self.state, agent, seen);
        self.judge_report(report, judged, stamp, mark_losses);
    }

    pub(super) fn resync_chunk(&mut self, chunk: &ResyncChunk) -> Verdict {
        let (agent, stamp) = self.observer(&chunk.agent, chunk.epoch, chunk.obs)?;
        let n_named = chunk.held.len() + chunk.in_flight.len();
        if n_named > MAX_REPORT_HANDLES {
            return reject(
                RejectionKind::Invalid,
                format!("the chunk names {n_named} handles; at most {MAX_REPORT_HANDLES}: use narrower ranges"),
            );
        }
        if chunk.hi.is_some_and(|hi| hi <= chunk.lo) {
            return reject(RejectionKind::Invalid, format!("chunk range [{}, {:?}) is empty", chunk.lo, chunk.hi));
        }
        if let Some(outside) = chunk.held.iter().chain(&chunk.in_flight).find(|id| !chunk.covers(**id)) {
            return reject(RejectionKind::Invalid, format!("handle {outside} is outside the chunk's range"));
        }
        self.check_reached("watermark", chunk.watermark)?;
        let judged = self.chunk_verdicts(agent, chunk);
        self.out.reserve(codec::encoded_len(&(&chunk.held, &chunk.in_flight)));
        self.out.push(Effect::ObservationAccepted { stamp, watermark: Some(chunk.watermark) });
        let n_losses = judged.iter().filter(|(r, seen)| would_lose(r, *seen, stamp, chunk.watermark)).count();
        let mark_losses = self.breaker(agent, n_losses, None);
        self.judge_chunk(chunk, judged, stamp, mark_losses);
        Ok(())
    }

    /// Every resource of the agent in the chunk's range: held (or in flight) or absent.
    fn chunk_verdicts(&self, agent: &Agent, chunk: &ResyncChunk) -> Judged<'s> {
        let held: BTreeSet<ResourceId> = chunk.held.iter().copied().collect();
        let in_flight: BTreeSet<ResourceId> = chunk.in_flight.iter().copied().collect();
        agent
            .resources
            .iter()
            .skip_while(|id| id.as_uuid() < chunk.lo)
            .take_while(|id| chunk.covers(**id))
            .filter_map(|id| self.state.resources.get(id))
            .map(|r| {
                let seen = if in_flight.contains(&r.id) {
                    Seen::InFlight
                } else if held.contains(&r.id) {
                    Seen::Present
                } else {
                    Seen::Absent
                };
                (r, seen)
            })
            .collect()
    }

    fn judge_chunk(&mut self, chunk: &ResyncChunk, judged: Judged<'s>, stamp: ObsStamp, mark_losses: bool) {
        let rest = |left: &[(&Resource, Seen)]| {
            let lo = left[0].0.id.as_uuid();
            let narrow = |ids: &[ResourceId]| ids.iter().copied().filter(|id| id.as_uuid() >= lo).collect();
            Work::Chunk {
                chunk: ResyncChunk {
                    lo,
                    held: narrow(&chunk.held),
                    in_flight: narrow(&chunk.in_flight),
                    ..chunk.clone()
                },
                mark_losses,
            }
        };
        self.judge_all(judged, stamp, chunk.watermark, mark_losses, rest);
    }

    pub(super) fn continue_chunk(&mut self, agent: &'s Agent, chunk: &ResyncChunk, mark_losses: bool) {
        let stamp = ObsStamp { epoch: chunk.epoch, obs: chunk.obs };
        self.out.reserve(codec::encoded_len(&(&chunk.held, &chunk.in_flight)));
        let judged = self.chunk_verdicts(agent, chunk);
        self.judge_chunk(chunk, judged, stamp, mark_losses);
    }

    pub(super) fn report_failure(&mut self, command: &ReportFailure) -> Verdict {
        let (_, stamp) = self.observer(&command.agent, command.epoch, command.obs)?;
        check_text("detail", &command.detail)?;
        let resource = self.resource(&command.agent, command.resource)?;
        let name = resource.reference();
        match (command.failure, &resource.state) {
            (FailureKind::CreateFailed, ResourceState::Pending) => {}
            (FailureKind::CreateFailed, ResourceState::Releasing { .. }) if resource.last_present.is_none() => {}
            (FailureKind::CreateFailed, state) => {
                return reject(
                    RejectionKind::InvalidState,
                    format!("resource {name} is {}; a create failure does not apply to it", state.name()),
                );
            }
            (FailureKind::Unhealthy, ResourceState::Active | ResourceState::Paused { .. }) => {}
            (FailureKind::Unhealthy, ResourceState::Suspect { .. }) => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("resource {name} is already suspect; its health check is due"),
                );
            }
            (FailureKind::Unhealthy, state) => {
                return reject(
                    RejectionKind::InvalidState,
                    format!("resource {name} is {}; only a created resource can be unhealthy", state.name()),
                );
            }
            (FailureKind::DestroyBlocked, ResourceState::Releasing { .. }) => {}
            (FailureKind::DestroyBlocked, state) => {
                return reject(
                    RejectionKind::InvalidState,
                    format!("resource {name} is {}; only a releasing resource's destroy can be blocked", state.name()),
                );
            }
        }
        self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
        match command.failure {
            FailureKind::CreateFailed => {
                let failed = Effect::ResourceFailed { resource: resource.id, detail: command.detail.clone() };
                self.leave_for_good(resource, failed);
            }
            FailureKind::Unhealthy => {
                let cause = SuspectCause::Agent { detail: command.detail.clone() };
                self.out.push(Effect::ResourceSuspect { resource: resource.id, cause });
            }
            FailureKind::DestroyBlocked => {
                self.out.push(Effect::DestroyBlocked { resource: resource.id, detail: command.detail.clone() });
            }
        }
        Ok(())
    }

    pub(super) fn health_result(&mut self, command: &HealthResult) -> Verdict {
        let (_, stamp) = self.observer(&command.agent, command.epoch, command.obs)?;
        check_text("detail", &command.detail)?;
        let resource = self.resource(&command.agent, command.resource)?;
        let ResourceState::Suspect { asked, .. } = &resource.state else {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "resource {} is {}, not suspect; the health result is ignored",
                    resource.reference(),
                    resource.state.name()
                ),
            );
        };
        self.check_reached("the check asked for at", command.request)?;
        if *asked != Some(command.request) {
            let latest = asked.map(|a| a.to_string()).unwrap_or_else(|| "none".to_owned());
            return reject(
                RejectionKind::StaleObservation,
                format!(
                    "the health result answers a check asked for at {}, but the check resource {} waits for is {latest}",
                    command.request,
                    resource.reference()
                ),
            );
        }
        self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
        if command.healthy {
            self.out.push(Effect::ResourceHealthy { resource: resource.id });
            if matches!(&resource.state, ResourceState::Suspect { paused: None, .. }) {
                self.serve_if_clear(resource);
            }
        } else {
            let cause = ReleaseCause::HealthCheckFailed { detail: command.detail.clone() };
            self.order_release(resource, cause, BreakReason::HealthCheckFailed);
        }
        Ok(())
    }
}
