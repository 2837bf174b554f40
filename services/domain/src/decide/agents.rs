//! Agents: registration and epochs, heartbeats, stalled and gone, retirement, the breaker's confirm-loss, and the
//! partition's own settings.

use leasehold_schemas::RejectionKind;
use leasehold_schemas::command::{
    ConfirmLoss, Heartbeat, MarkGone, MarkStalled, Orphan, Register, RetireAgent, SetPartitionSettings,
};
use leasehold_schemas::ids::Millis;
use leasehold_schemas::outcome::{BreakerClear, Effect, ResyncReason};
use leasehold_schemas::settings::AgentSettings;

use super::{Decider, Verdict, reject};
use crate::state::Liveness;

fn check_settings(settings: &AgentSettings) -> Result<(), String> {
    if settings.max_loss_percent > 100 {
        return Err(format!("max_loss_percent {} is over 100", settings.max_loss_percent));
    }
    for (name, value) in [
        ("loss_window", settings.loss_window),
        ("create_timeout", settings.create_timeout),
        ("stall_after", settings.stall_after),
        ("orphan_after", settings.orphan_after),
    ] {
        if value.0 == 0 {
            return Err(format!("{name} must be longer than 0"));
        }
    }
    if settings.stall_after < Millis::from_secs(3) {
        return Err(format!(
            "stall_after ({}) must be at least 3s: heartbeats are recorded at most every third of it",
            settings.stall_after
        ));
    }
    if settings.orphan_after <= settings.stall_after {
        return Err(format!(
            "orphan_after ({}) must be longer than stall_after ({})",
            settings.orphan_after, settings.stall_after
        ));
    }
    Ok(())
}

impl<'s> Decider<'s> {
    pub(super) fn register(&mut self, command: &Register) -> Verdict {
        if let Err(problem) = check_settings(&command.settings) {
            return reject(RejectionKind::Invalid, format!("agent {}: {problem}", command.agent));
        }
        let mut stays_retired = false;
        if let Some(agent) = self.state.agents.get(&command.agent) {
            // A retired agent registers to finish releasing what it holds; once nothing is left, registering
            // brings the name back into service.
            stays_retired = agent.retired && self.state.resources_of(agent).any(|r| !r.state.is_terminal());
            if command.wiped && agent.breaker.is_some() {
                self.out.push(Effect::AgentBreakerCleared { reason: BreakerClear::Wiped {} });
            }
        }
        self.out.push(Effect::AgentRegistered {
            incarnation: command.incarnation,
            wiped: command.wiped,
            settings: command.settings.clone(),
            retired: stays_retired,
        });
        Ok(())
    }

    pub(super) fn heartbeat(&mut self, command: &Heartbeat) -> Verdict {
        let agent = self.incarnation(&command.agent, command.epoch, "heartbeat")?;
        if agent.liveness == Liveness::Stalled {
            self.out.push(Effect::AgentRecovered {});
            self.out.push(Effect::AgentSeen { at: self.now });
        } else if self.now.since(agent.last_seen) >= crate::due::coalesce_interval(agent.settings.stall_after) {
            self.out.push(Effect::AgentSeen { at: self.now });
        }
        Ok(())
    }

    pub(super) fn mark_stalled(&mut self, command: &MarkStalled) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if agent.liveness != Liveness::Live {
            let liveness = if agent.liveness == Liveness::Gone { "gone" } else { "stalled" };
            return reject(RejectionKind::AlreadyDone, format!("agent {} is already {liveness}", agent.name));
        }
        let due = crate::due::stall_due(self.state, agent);
        if self.now < due {
            return reject(
                RejectionKind::NotYetDue,
                format!("agent {} was seen at {}; it is not stalled before {due}", agent.name, agent.last_seen),
            );
        }
        self.out.push(Effect::AgentStalled { last_seen: agent.last_seen });
        Ok(())
    }

    pub(super) fn mark_gone(&mut self, command: &MarkGone) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if agent.liveness == Liveness::Gone {
            return reject(RejectionKind::AlreadyDone, format!("agent {} is already gone", agent.name));
        }
        let due = crate::due::gone_due(self.state, agent);
        if self.now < due {
            return reject(
                RejectionKind::NotYetDue,
                format!("agent {} was seen at {}; it is not gone before {due}", agent.name, agent.last_seen),
            );
        }
        self.out.push(Effect::AgentGone { last_seen: agent.last_seen });
        self.orphan_rest(agent);
        Ok(())
    }

    pub(super) fn orphan(&mut self, command: &Orphan) -> Verdict {
        let agent = self.agent(&command.agent)?;
        let resource = self.resource(&command.agent, command.resource)?;
        if agent.liveness != Liveness::Gone {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "agent {} is {}, not gone: only the resources of a gone agent are orphaned",
                    agent.name,
                    agent.status()
                ),
            );
        }
        if resource.state.is_terminal() {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {} is already {}", resource.reference(), resource.state.name()),
            );
        }
        self.orphan_unit(resource);
        Ok(())
    }

    pub(super) fn retire_agent(&mut self, command: &RetireAgent) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if agent.retired {
            return reject(RejectionKind::AlreadyDone, format!("agent {} is already retired", agent.name));
        }
        self.out.push(Effect::AgentRetired { by: self.issuer.clone() });
        self.release_rest(agent);
        Ok(())
    }

    pub(super) fn confirm_loss(&mut self, command: &ConfirmLoss) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if agent.breaker.is_none() {
            return reject(
                RejectionKind::InvalidState,
                format!("agent {}'s circuit breaker has not tripped; there is no loss to confirm", agent.name),
            );
        }
        // The losses are marked by the agent's full resync (asked for at once) and its next sync report, which the
        // breaker lets through; that report arms it again.
        self.out.push(Effect::AgentBreakerCleared { reason: BreakerClear::LossConfirmed { by: self.issuer.clone() } });
        self.out.push(Effect::ResyncRequested { reason: ResyncReason::LossConfirmed {} });
        Ok(())
    }

    pub(super) fn set_partition_settings(&mut self, command: &SetPartitionSettings) -> Verdict {
        if command.partition != self.state.partition {
            return reject(
                RejectionKind::WrongPartition,
                format!(
                    "settings for partition {} reached partition {}; route them with a key of that partition",
                    command.partition, self.state.partition
                ),
            );
        }
        if command.settings.outcome_horizon < Millis::from_mins(1) {
            return reject(
                RejectionKind::Invalid,
                format!("an outcome horizon of {} is too short; use at least 1min", command.settings.outcome_horizon),
            );
        }
        if command.settings == self.state.settings {
            return reject(RejectionKind::AlreadyDone, "the partition already has these settings");
        }
        self.out.push(Effect::PartitionSettingsChanged { settings: command.settings.clone() });
        Ok(())
    }
}
