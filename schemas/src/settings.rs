//! Settings that change decisions. They live in partition state, put there by outcomes (agent registration,
//! partition settings, pool definition), never read from configuration by the decider.

use serde::{Deserialize, Serialize};

use crate::ids::Millis;

/// An agent's settings: the cluster policy's (`ClusterPolicy::agent`), or an agent's own when it registered with
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// The circuit breaker trips when the losses of the last `loss_window` reach `max_loss_min` and exceed
    /// `max_loss_percent` of the agent's live resources.
    pub max_loss_min: u32,
    pub max_loss_percent: u8,
    pub loss_window: Millis,
    /// A `pending` resource older than this goes to `releasing` (the create may still be running).
    pub create_timeout: Millis,
    /// No heartbeat for this long: `stalled`, no new placements.
    pub stall_after: Millis,
    /// No heartbeat for this long: `gone`, and its resources become `orphaned`.
    pub orphan_after: Millis,
}

impl AgentSettings {
    /// What agents follow while no policy is recorded (DESIGN sections 5 and 6).
    pub const DEFAULT: AgentSettings = AgentSettings {
        max_loss_min: 5,
        max_loss_percent: 50,
        loss_window: Millis::from_mins(10),
        create_timeout: Millis::from_mins(10),
        stall_after: Millis::from_secs(60),
        orphan_after: Millis::from_hours(24),
    };

    /// Checks that the settings make sense together; the error names the setting and what to change. `decide`
    /// refuses settings that fail it, and the CLI refuses them before it sends anything.
    pub fn check(&self) -> Result<(), String> {
        if self.max_loss_percent > 100 {
            return Err(format!("max_loss_percent {} is over 100", self.max_loss_percent));
        }
        for (name, value) in [
            ("loss_window", self.loss_window),
            ("create_timeout", self.create_timeout),
            ("stall_after", self.stall_after),
            ("orphan_after", self.orphan_after),
        ] {
            if value.0 == 0 {
                return Err(format!("{name} must be longer than 0"));
            }
        }
        if self.stall_after < Millis::from_secs(3) {
            return Err(format!(
                "stall_after ({}) must be at least 3s: heartbeats are recorded at most every third of it",
                self.stall_after
            ));
        }
        if self.orphan_after <= self.stall_after {
            return Err(format!(
                "orphan_after ({}) must be longer than stall_after ({})",
                self.orphan_after, self.stall_after
            ));
        }
        Ok(())
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings::DEFAULT
    }
}

/// The operator's policy for a partition, as Nomad's servers or Kubernetes' controller manager own theirs: what
/// every agent that registered without settings of its own follows (changing it changes them at once), and the
/// cool-down of pools defined without one (taken when the pool is defined).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterPolicy {
    pub agent: AgentSettings,
    pub claim_cooldown: Millis,
}

impl ClusterPolicy {
    /// What a partition follows while no policy is recorded.
    pub const DEFAULT: ClusterPolicy =
        ClusterPolicy { agent: AgentSettings::DEFAULT, claim_cooldown: DEFAULT_POOL_COOLDOWN };
}

impl Default for ClusterPolicy {
    fn default() -> Self {
        ClusterPolicy::DEFAULT
    }
}

/// Settings of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSettings {
    /// How long (log time) an outcome stays in partition state: a command retried within it gets its first outcome
    /// back; a command issued longer ago than this is rejected as stale.
    pub outcome_horizon: Millis,
    /// The cluster policy recorded for this partition; `None`: none was ever recorded (the partition follows
    /// [`ClusterPolicy::DEFAULT`], and `serve` records its flags as the policy). A recorded policy is never removed.
    pub policy: Option<ClusterPolicy>,
}

impl PartitionSettings {
    /// The policy the partition follows: the recorded one, or the default.
    pub fn policy(&self) -> &ClusterPolicy {
        self.policy.as_ref().unwrap_or(&ClusterPolicy::DEFAULT)
    }
}

impl Default for PartitionSettings {
    fn default() -> Self {
        PartitionSettings { outcome_horizon: Millis::from_hours(24), policy: None }
    }
}

/// A pool's cool-down when its definition names none.
pub const DEFAULT_POOL_COOLDOWN: Millis = Millis::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_unknown_fields() {
        let agent = serde_json::to_string(&AgentSettings::default()).unwrap();
        assert_eq!(serde_json::from_str::<AgentSettings>(&agent).unwrap(), AgentSettings::default());
        let agent_extra = agent.replacen('{', r#"{"max_loss":3,"#, 1);
        let err = serde_json::from_str::<AgentSettings>(&agent_extra).unwrap_err().to_string();
        assert!(err.contains("unknown field `max_loss`"), "{err}");

        let partition = serde_json::to_string(&PartitionSettings::default()).unwrap();
        assert_eq!(serde_json::from_str::<PartitionSettings>(&partition).unwrap(), PartitionSettings::default());
        let partition_extra = partition.replacen('{', r#"{"horizon":1,"#, 1);
        let err = serde_json::from_str::<PartitionSettings>(&partition_extra).unwrap_err().to_string();
        assert!(err.contains("unknown field `horizon`"), "{err}");
    }
}

/// What the agents of a partition do with garbage: handles on their machines of no live resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GcMode {
    /// Each handle is ordered destroyed on record (`garbage-destroy-ordered`), and only then destroyed.
    #[default]
    Destroy,
    /// Each handle is recorded (`garbage-dry-run`) with what would have been done; nothing is ordered or destroyed.
    DryRun,
}

impl GcMode {
    pub fn name(self) -> &'static str {
        match self {
            GcMode::Destroy => "destroy",
            GcMode::DryRun => "dry-run",
        }
    }
}

impl std::fmt::Display for GcMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GcMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "destroy" => Ok(GcMode::Destroy),
            "dry-run" => Ok(GcMode::DryRun),
            other => Err(format!("gc mode {other:?} is neither `destroy` nor `dry-run`")),
        }
    }
}
