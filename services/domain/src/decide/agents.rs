//! Agents: registration and epochs, heartbeats, stalled and gone, retirement, the breaker's confirm-loss, and the
//! partition's own settings.

use leasehold_schemas::RejectionKind;
use leasehold_schemas::command::{
    ConfirmLoss, CordonAgent, Heartbeat, MarkGone, MarkStalled, Orphan, Register, RetireAgent, SetPartitionSettings,
    UncordonAgent, UnretireAgent,
};
use leasehold_schemas::ids::Millis;
use leasehold_schemas::outcome::{BreakReason, BreakerClear, Effect, ReleaseCause, ResyncReason};
use leasehold_schemas::settings::PartitionSettings;

use super::{Decider, Verdict, check_text, echo, reject};
use leasehold_schemas::command::{DrainAgent, DrainRelease};

/// At most this many labels, and kinds with a capacity, per agent.
const MAX_DECLARED: usize = 32;

/// An agent's labels and capacity: names and values as any producer text, a bounded count of each.
fn check_declaration(command: &Register) -> Verdict {
    if command.labels.len() > MAX_DECLARED || command.capacity.len() > MAX_DECLARED {
        return reject(
            RejectionKind::Invalid,
            format!(
                "agent {} declares {} labels and a capacity for {} kinds; at most {MAX_DECLARED} of each",
                command.agent,
                command.labels.len(),
                command.capacity.len()
            ),
        );
    }
    for (key, value) in &command.labels {
        check_text("label", key)?;
        check_text("label value", value)?;
        if key.is_empty() {
            return reject(RejectionKind::Invalid, format!("agent {}: a label needs a name", command.agent));
        }
    }
    for kind in command.capacity.keys() {
        check_text("capacity kind", kind)?;
        // A kind no allocation can name would limit nothing, silently.
        if !super::resources::is_kind(kind) {
            return reject(
                RejectionKind::Invalid,
                format!("agent {}: capacity kind {kind:?} must match [a-z0-9][a-z0-9_.-]{{0,62}}", command.agent),
            );
        }
    }
    Ok(())
}
use crate::due::{coalesce_interval, gone_due, stall_due};
use crate::state::{Agent, Liveness};

impl<'s> Decider<'s> {
    pub(super) fn register(&mut self, command: &Register) -> Verdict {
        if let Some(Err(problem)) = command.settings.as_ref().map(|s| s.check()) {
            return reject(RejectionKind::Invalid, format!("agent {}: {problem}", command.agent));
        }
        check_declaration(command)?;
        let mut stays_retired = false;
        let declared_before = self.state.agents.get(&command.agent).map(|a| (&a.labels, &a.capacity));
        let declares_anew = declared_before
            .map_or(!command.labels.is_empty() || !command.capacity.is_empty(), |(l, c)| {
                *l != command.labels || *c != command.capacity
            });
        if let Some(agent) = self.state.agents.get(&command.agent) {
            // A retired agent registers to finish releasing what it holds, and stays retired: only `unretire`, on
            // record, brings the name back into service.
            stays_retired = agent.retired;
            if command.wiped && agent.breaker.is_some() {
                self.out.push(Effect::AgentBreakerCleared { reason: BreakerClear::Wiped {} });
            }
        }
        self.out.push(Effect::AgentRegistered {
            incarnation: command.incarnation,
            wiped: command.wiped,
            // Effective now: the agent paces its heartbeats by them.
            settings: command.settings.clone().unwrap_or_else(|| self.state.policy().agent.clone()),
            own_settings: command.settings.is_some(),
            retired: stays_retired,
        });
        if declares_anew {
            self.out.push(Effect::AgentDeclared { labels: command.labels.clone(), capacity: command.capacity.clone() });
        }
        Ok(())
    }

    pub(super) fn heartbeat(&mut self, command: &Heartbeat) -> Verdict {
        let agent = self.incarnation(&command.agent, command.epoch, "heartbeat")?;
        if agent.liveness == Liveness::Stalled {
            self.out.push(Effect::AgentRecovered {});
            self.out.push(Effect::AgentSeen { at: self.now });
        } else if self.now.since(agent.last_seen) >= coalesce_interval(self.state.settings_of(agent).stall_after) {
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
        let due = stall_due(self.state, agent);
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
        let due = gone_due(self.state, agent);
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
        if command.only_if_unleased {
            self.check_unleased(agent)?;
        }
        self.out.push(Effect::AgentRetired { by: self.issuer.clone() });
        self.release_rest(agent);
        Ok(())
    }

    pub(super) fn unretire_agent(&mut self, command: &UnretireAgent) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if !agent.retired {
            return reject(RejectionKind::AlreadyDone, format!("agent {} is not retired", agent.name));
        }
        self.out.push(Effect::AgentUnretired { by: self.issuer.clone() });
        Ok(())
    }

    pub(super) fn cordon_agent(&mut self, command: &CordonAgent) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        if let Some(cordon) = &agent.cordon {
            return reject(
                RejectionKind::AlreadyDone,
                format!("agent {} is already cordoned ({})", agent.name, cordon),
            );
        }
        self.out.push(Effect::AgentCordoned { by: self.issuer.clone(), reason: command.reason.clone() });
        Ok(())
    }

    pub(super) fn uncordon_agent(&mut self, command: &UncordonAgent) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if agent.cordon.is_none() {
            return reject(RejectionKind::AlreadyDone, format!("agent {} is not cordoned", agent.name));
        }
        self.out.push(Effect::AgentUncordoned { by: self.issuer.clone() });
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
        if let Some(horizon) = command.outcome_horizon
            && horizon < Millis::from_mins(1)
        {
            return reject(
                RejectionKind::Invalid,
                format!("an outcome horizon of {horizon} is too short; use at least 1min"),
            );
        }
        if command.if_no_policy
            && let Some(recorded) = &self.state.settings.policy
        {
            return reject(
                RejectionKind::AlreadyDone,
                format!(
                    "partition {} already has a policy ({}); it is changed only by `leasehold policy set`",
                    self.state.partition,
                    describe_policy(recorded)
                ),
            );
        }
        if let Some(Err(problem)) = command.policy.as_ref().map(|p| p.agent.check()) {
            return reject(RejectionKind::Invalid, format!("policy: {problem}"));
        }
        let settings = PartitionSettings {
            outcome_horizon: command.outcome_horizon.unwrap_or(self.state.settings.outcome_horizon),
            policy: command.policy.clone().or_else(|| self.state.settings.policy.clone()),
        };
        let gc = command.gc.filter(|mode| *mode != self.state.gc_mode);
        if let Some(caps) = &command.max_priority {
            check_priority_caps(caps)?;
        }
        let caps = command.max_priority.as_ref().filter(|caps| **caps != self.state.priority_caps);
        if settings == self.state.settings && gc.is_none() && caps.is_none() {
            return reject(RejectionKind::AlreadyDone, "the partition already has these settings");
        }
        if settings != self.state.settings {
            self.out.push(Effect::PartitionSettingsChanged { settings });
        }
        if let Some(mode) = gc {
            self.out.push(Effect::GcModeChanged { mode });
        }
        if let Some(caps) = caps {
            self.out.push(Effect::PriorityCapsChanged { max_priority: caps.clone() });
        }
        Ok(())
    }
}

/// The most issuer prefixes a partition keeps priority caps for.
pub const MAX_PRIORITY_CAPS: usize = 64;

/// Refuses priority caps with too many or malformed prefixes.
fn check_priority_caps(caps: &std::collections::BTreeMap<String, u8>) -> Verdict {
    if caps.len() > MAX_PRIORITY_CAPS {
        return reject(
            RejectionKind::Invalid,
            format!("{} priority caps; at most {MAX_PRIORITY_CAPS} issuer prefixes", caps.len()),
        );
    }
    for prefix in caps.keys() {
        // A prefix is spelled as an issuer is (a whole issuer is a prefix too).
        if leasehold_schemas::Issuer::new(prefix.as_str()).is_err() {
            return reject(
                RejectionKind::Invalid,
                format!(
                    "a priority cap's issuer prefix is 1 to 128 printable ASCII bytes without quotes, backslashes or \
                     spaces; {} is not",
                    super::echo(prefix)
                ),
            );
        }
    }
    Ok(())
}

/// A policy in one line, for messages.
fn describe_policy(policy: &leasehold_schemas::settings::ClusterPolicy) -> String {
    let a = &policy.agent;
    format!(
        "stall_after {}, orphan_after {}, create_timeout {}, claim_cooldown {}, max_loss {}/{}% in {}",
        a.stall_after,
        a.orphan_after,
        a.create_timeout,
        policy.claim_cooldown,
        a.max_loss_min,
        a.max_loss_percent,
        a.loss_window
    )
}

/// At most this many leased resources are named in a retirement refused for its leases.
const LEASED_NAMED: usize = 3;

impl<'s> Decider<'s> {
    /// Cordons the agent (unless it is already) and records the drain: the sweeper then asks for each resource's
    /// release as it falls due (`sys.drain-release`). A drain asked for again with other settings replaces them and
    /// keeps its start; with the same ones (a deadline counts from each decision) it is already done.
    pub(super) fn drain_agent(&mut self, command: &DrainAgent) -> Verdict {
        let agent = self.agent(&command.agent)?;
        if let Some(reason) = &command.reason {
            check_text("reason", reason)?;
        }
        if agent.liveness == Liveness::Gone {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "agent {} is gone: what it held is orphaned, so there is nothing to drain (`agent cordon` keeps \
                     new allocations off it)",
                    agent.name
                ),
            );
        }
        if agent.retired {
            return reject(
                RejectionKind::InvalidState,
                format!(
                    "agent {} is retired: everything it holds is released already; there is nothing to drain",
                    agent.name
                ),
            );
        }
        let grace = command.grace.unwrap_or(super::DEFAULT_DRAIN_GRACE);
        let deadline = command.deadline.map(|d| self.now.saturating_add(d));
        // A drain asked for again without a reason keeps the reason it had.
        let reason = command.reason.clone().or_else(|| agent.drain.as_ref().and_then(|d| d.reason.clone()));
        if let Some(drain) = &agent.drain
            && drain.grace == grace
            && drain.deadline == deadline
            && drain.reason == reason
        {
            return reject(RejectionKind::AlreadyDone, format!("agent {} is already draining ({})", agent.name, drain));
        }
        if agent.cordon.is_none() {
            self.out.push(Effect::AgentCordoned { by: self.issuer.clone(), reason: reason.clone() });
        }
        self.out.push(Effect::AgentDraining { by: self.issuer.clone(), reason, deadline, grace });
        Ok(())
    }

    /// Releases one resource of a draining agent once it is due: idle past the drain's grace, or the deadline came.
    pub(super) fn drain_release(&mut self, command: &DrainRelease) -> Verdict {
        let agent = self.agent(&command.agent)?;
        let resource = self.resource(&command.agent, command.resource)?;
        let Some(drain) = &agent.drain else {
            return reject(RejectionKind::NothingToDo, format!("agent {} is not draining", agent.name));
        };
        let reference = resource.reference();
        let Some(due) = crate::due::drain_due(self.state, resource) else {
            return reject(
                RejectionKind::AlreadyDone,
                format!("resource {reference} is already {}", resource.state.name()),
            );
        };
        if let Some(deadline) = due.by_deadline(self.now) {
            let cause = ReleaseCause::Drained { by: drain.by.clone(), deadline };
            self.order_release(resource, cause, BreakReason::ResourceLeft);
            return Ok(());
        }
        let at_deadline = match drain.deadline {
            Some(at) => format!("at the drain's deadline {at}"),
            None => "never by itself (the drain has no deadline)".to_owned(),
        };
        let why = match (due.idle, self.state.live_leases_of(resource).next()) {
            (Some(idle), _) => format!(
                "has held no lease since {}; it is released at {idle} (the drain's grace is {}), or {at_deadline}",
                drain.since.max(resource.idle_since),
                drain.grace
            ),
            (None, Some(lease)) => format!(
                "holds lease {}.{} (holder {}); it is released once it has held none for {}, or {at_deadline}",
                lease.agent,
                lease.id,
                echo(&lease.holder),
                drain.grace
            ),
            (None, None) => format!("holds a lease; it is released {at_deadline}"),
        };
        reject(RejectionKind::NotYetDue, format!("resource {reference} {why}"))
    }

    /// For a retirement that must not break leases: refused, naming a few resources that hold one.
    pub(super) fn check_unleased(&self, agent: &'s Agent) -> Verdict {
        let mut leased = self
            .state
            .resources_of(agent)
            .filter(|r| !r.state.has_left())
            .filter_map(|r| self.state.live_leases_of(r).next().map(|lease| (r, lease)));
        let named: Vec<String> = leased
            .by_ref()
            .take(LEASED_NAMED)
            .map(|(resource, lease)| {
                format!(
                    "{} holds lease {}.{} (holder {}, {})",
                    resource.reference(),
                    lease.agent,
                    lease.id,
                    echo(&lease.holder),
                    lease.state.name()
                )
            })
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        let more = leased.count();
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        reject(
            RejectionKind::InvalidState,
            format!(
                "agent {} not retired: {}{more}; retire with --yes to release them anyway (their leases are broken)",
                agent.name,
                named.join(", ")
            ),
        )
    }
}
