//! Settings that change decisions. They live in partition state, put there by outcomes (agent registration,
//! partition settings, pool definition), never read from configuration by the decider.

use serde::{Deserialize, Serialize};

use crate::ids::Millis;

/// An agent's settings, carried by its registration.
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

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            max_loss_min: 5,
            max_loss_percent: 50,
            loss_window: Millis::from_mins(10),
            create_timeout: Millis::from_mins(10),
            stall_after: Millis::from_secs(60),
            orphan_after: Millis::from_hours(24),
        }
    }
}

/// Settings of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSettings {
    /// How long (log time) an outcome stays in partition state: a command retried within it gets its first outcome
    /// back; a command issued longer ago than this is rejected as stale.
    pub outcome_horizon: Millis,
}

impl Default for PartitionSettings {
    fn default() -> Self {
        PartitionSettings { outcome_horizon: Millis::from_hours(24) }
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
