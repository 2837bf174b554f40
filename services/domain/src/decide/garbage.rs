//! Every destroy on the record: garbage reports, confirmed destroys and the driver's availability.
//!
//! An agent never decides alone that a handle on its machine is garbage. It reports the handles it holds that are not
//! in its assignment set, and the writer decides each one here, on record:
//! - a handle of no resource this agent has (never allocated, or forgotten after the horizon), or of one that was
//!   `destroyed`, `orphaned` or `failed`: `garbage-destroy-ordered` (the agent destroys it only then, and reports it
//!   destroyed: `garbage-destroyed`);
//! - a handle of a resource recorded `lost`: `handle-reappeared`, and it is quarantined: the agent never touches it
//!   and its claims are never given back to it, until a `release` of the lost resource orders it destroyed;
//! - in a dry run (the agent's `--gc dry-run`, or the partition's policy): `garbage-dry-run` records what would have
//!   been ordered, and nothing is;
//! - a handle of a live resource is the agent's own business (its model lags the log): nothing.

use std::collections::BTreeSet;

use leasehold_schemas::command::{DriverStatus, GarbageReport, MAX_REPORT_HANDLES, ReportDestroyed};
use leasehold_schemas::ids::ResourceId;
use leasehold_schemas::outcome::{Effect, FreeCause, GarbageCause};
use leasehold_schemas::settings::GcMode;
use leasehold_schemas::{RejectionKind, codec};

use super::{Decider, Verdict, check_text, reject};
use crate::state::{Agent, ResourceState};

/// What the writer does with one handle a garbage report names.
enum GarbageVerdict {
    /// Not garbage, or already decided (quarantined, a destroy already ordered).
    Nothing,
    Quarantine,
    Destroy(GarbageCause),
}

impl<'s> Decider<'s> {
    fn judge_garbage(&self, agent: &Agent, handle: ResourceId) -> GarbageVerdict {
        if agent.quarantined.contains_key(&handle) || agent.garbage_order_of(handle).is_some() {
            return GarbageVerdict::Nothing;
        }
        if agent.lost_ids.contains(&handle) {
            return GarbageVerdict::Quarantine;
        }
        match self.state.resources.get(&handle) {
            Some(resource) if resource.agent == agent.name => match &resource.state {
                ResourceState::Lost { .. } => GarbageVerdict::Quarantine,
                ResourceState::Destroyed { .. } => GarbageVerdict::Destroy(GarbageCause::Destroyed {}),
                ResourceState::Orphaned { .. } => GarbageVerdict::Destroy(GarbageCause::Orphaned {}),
                ResourceState::Failed { .. } => GarbageVerdict::Destroy(GarbageCause::Failed {}),
                // Meant to exist or being destroyed already: the agent's own assignment set, not garbage.
                _ => GarbageVerdict::Nothing,
            },
            // Another agent's resource id, or none this partition knows (never allocated, or forgotten).
            _ => GarbageVerdict::Destroy(GarbageCause::Unknown {}),
        }
    }

    pub(super) fn garbage_report(&mut self, report: &GarbageReport) -> Verdict {
        let (agent, stamp) = self.observer(&report.agent, report.epoch, report.obs)?;
        if report.handles.len() > MAX_REPORT_HANDLES {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "the garbage report names {} handles; at most {MAX_REPORT_HANDLES}: send the rest in another",
                    report.handles.len()
                ),
            );
        }
        self.check_reached("watermark", report.watermark)?;
        let handles: BTreeSet<ResourceId> = report.handles.iter().copied().collect();
        if handles.len() != report.handles.len() {
            return reject(RejectionKind::Invalid, "a handle is named twice in one garbage report");
        }
        self.out.reserve(codec::encoded_len(&report.handles));
        self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
        let dry_run = report.dry_run || self.state.gc_mode == GcMode::DryRun;
        for handle in handles {
            match self.judge_garbage(agent, handle) {
                GarbageVerdict::Nothing => {}
                // Quarantine is an observation, not a destroy: a dry run records it too.
                GarbageVerdict::Quarantine => {
                    self.out.push(Effect::HandleReappeared { resource: handle, stamp });
                }
                GarbageVerdict::Destroy(cause) if dry_run => {
                    self.out.push(Effect::GarbageDryRun { handle, cause });
                }
                GarbageVerdict::Destroy(cause) => {
                    self.out.push(Effect::GarbageDestroyOrdered { handle, cause });
                }
            }
        }
        Ok(())
    }

    pub(super) fn report_destroyed(&mut self, command: &ReportDestroyed) -> Verdict {
        let (agent, stamp) = self.observer(&command.agent, command.epoch, command.obs)?;
        let handle = command.resource;
        if let Some(ordered) = agent.garbage_order_of(handle) {
            if ordered != command.ordered {
                return reject(
                    RejectionKind::StaleObservation,
                    format!(
                        "garbage handle {}.{handle} was ordered destroyed at {ordered}, not at {}",
                        agent.name, command.ordered
                    ),
                );
            }
            self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
            self.out.push(Effect::GarbageDestroyed { handle, stamp });
            // The orphan's agent is back and destroyed its handle: what the orphan held of pools that hold an
            // orphan's identifiers goes back now, saying so.
            if let Some(orphan) = self.state.resources.get(&handle).filter(|r| r.agent == agent.name) {
                self.free_held(orphan, None, &FreeCause::OrphanDestroyed { at: self.now });
            }
            return Ok(());
        }
        let resource = self.resource(&command.agent, handle)?;
        match &resource.state {
            ResourceState::Releasing { .. } if resource.destruction_ordered == Some(command.ordered) => {
                self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
                self.leave_for_good(resource, Effect::ResourceDestroyed { resource: handle, stamp });
                Ok(())
            }
            ResourceState::Releasing { .. } => reject(
                RejectionKind::StaleObservation,
                format!(
                    "resource {} was ordered destroyed at {}, not at {}",
                    resource.reference(),
                    resource.destruction_ordered.map(|p| p.to_string()).unwrap_or_else(|| "-".to_owned()),
                    command.ordered
                ),
            ),
            // Ordered destroyed, then orphaned before its agent said so (it destroyed the handle while cut off, so it
            // never reports it as garbage): its agent is back and confirms the destroy it was ordered. What the orphan
            // holds of pools that hold an orphan's identifiers goes back now, saying so.
            ResourceState::Orphaned { .. }
                if resource.destruction_ordered == Some(command.ordered) && resource.holds_for_orphan() =>
            {
                self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
                self.free_held(resource, None, &FreeCause::OrphanDestroyed { at: self.now });
                Ok(())
            }
            state if state.is_terminal() => reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", resource.reference(), state.name()),
            ),
            state => reject(
                RejectionKind::InvalidState,
                format!(
                    "resource {} is {}; only a resource ordered destroyed can be reported destroyed",
                    resource.reference(),
                    state.name()
                ),
            ),
        }
    }

    pub(super) fn driver_status(&mut self, command: &DriverStatus) -> Verdict {
        let (agent, stamp) = self.observer(&command.agent, command.epoch, command.obs)?;
        check_text("detail", &command.detail)?;
        let effect = match (command.available, &agent.driver_unavailable) {
            (true, None) => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("agent {}'s driver is already recorded available", agent.name),
                );
            }
            (false, Some(recorded)) if *recorded == command.detail => {
                return reject(
                    RejectionKind::AlreadyDone,
                    format!("agent {}'s driver is already recorded unavailable for the same reason", agent.name),
                );
            }
            (true, Some(_)) => Effect::AgentDriverAvailable {},
            (false, _) => Effect::AgentDriverUnavailable { detail: command.detail.clone() },
        };
        self.out.push(Effect::ObservationAccepted { stamp, watermark: None });
        self.out.push(effect);
        Ok(())
    }
}
