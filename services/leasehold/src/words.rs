//! What a producer command changed, in words for people (`allocated w1.…: container, pending; waiting for an
//! identifier of pool net1`), and which rejections of `already-done` mean that the end state asked for already holds
//! (a second `release`: "already released"), so that the command line exits 0 for them. The effects themselves are
//! for `--output json`.

use crate::client::{RejectionInfo, SeqOutcome};
use leasehold_cli_common::timeline;
use leasehold_schemas::outcome::{BreakerClear, ReleaseCause};
use leasehold_schemas::{AgentName, Effect, Key, Outcome};

use crate::output::Clock;

/// At most this many changes are named one by one; the rest are counted (`--output json` lists them all).
const MAX_NAMED: usize = 6;

/// One line (without its end) saying what the outcomes of `what` (`release w1.…`) changed: raw text, to be escaped
/// where it is shown.
pub(crate) fn accepted(what: &str, outcomes: &[SeqOutcome], clock: &Clock) -> String {
    let mut said = Vec::new();
    for SeqOutcome { outcome, .. } in outcomes {
        for (position, effect) in outcome.positioned_effects() {
            if let Some(sentence) = sentence(outcome, position.0, effect, clock) {
                said.push(sentence);
            }
        }
    }
    if said.is_empty() {
        return format!("{what}: accepted; nothing changed");
    }
    let n_said = said.len();
    if n_said > MAX_NAMED {
        said.truncate(MAX_NAMED - 1);
        said.push(format!("and {} more changes (`--output json` lists them)", n_said - (MAX_NAMED - 1)));
    }
    said.join("; ")
}

/// The agent an outcome's command was keyed by (resources and leases are named `<agent>.<id>`), if any.
fn agent_of(outcome: &Outcome) -> Option<AgentName> {
    match &outcome.command.key {
        Key::Agent(agent) => Some(agent.clone()),
        _ => None,
    }
}

/// The pool an outcome's command was keyed by (`@net1`), if any.
fn pool_of(outcome: &Outcome) -> String {
    outcome.command.key.token().trim_start_matches('@').to_owned()
}

/// One change in words; `None` for bookkeeping that says nothing to a producer.
fn sentence(outcome: &Outcome, position: u64, effect: &Effect, clock: &Clock) -> Option<String> {
    let agent = agent_of(outcome);
    let name = |id: &dyn std::fmt::Display| match &agent {
        Some(agent) => format!("{agent}.{id}"),
        None => id.to_string(),
    };
    let on_agent = agent.as_ref().map_or_else(|| "its agent".to_owned(), ToString::to_string);
    let until = |at: Option<leasehold_schemas::Timestamp>, none: &str| match at {
        Some(at) => format!("until {}", clock.short(at.0)),
        None => none.to_owned(),
    };
    Some(match effect {
        Effect::ResourceAllocated { resource, kind, parent, .. } => format!(
            "allocated {}: {kind}, pending{}",
            name(resource),
            parent.as_ref().map(|p| format!(", child of {p}")).unwrap_or_default()
        ),
        Effect::ClaimWanted { pool, .. } => format!("waiting for an identifier of pool {pool}"),
        Effect::AllocationWaitsUntil { until, .. } => {
            format!("given up if none is granted by {}", clock.short(until.0))
        }
        Effect::CreateOrdered { .. } => format!("{on_agent} is asked to create it"),
        Effect::LeaseWaiting { lease, resource, holder, wait_until, .. } => format!(
            "lease {} for {holder} waits for pending {} {}",
            name(lease),
            name(resource),
            until(*wait_until, "as long as it is pending")
        ),
        Effect::LeaseQueued { lease, resource, holder, wait_until, priority, .. } => format!(
            "lease {} for {holder} queues on busy {} with priority {priority} {}",
            name(lease),
            name(resource),
            until(*wait_until, "with no wait timeout")
        ),
        Effect::ResourceMaxLeaseChanged { resource, max_lease } => match max_lease {
            Some(max) => format!("{}: a lease may be held at most {max} while others wait", name(resource)),
            None => format!("{}: no limit on how long a lease is held", name(resource)),
        },
        Effect::LeaseGranted { lease, resource, holder, expires_at, .. } => format!(
            "lease {} granted to {holder} on {} {} (token {position})",
            name(lease),
            name(resource),
            until(*expires_at, "with no expiry")
        ),
        Effect::LeaseRenewed { lease, expires_at, .. } => {
            format!("lease {} renewed {}", name(lease), until(*expires_at, "with no expiry"))
        }
        Effect::LeaseReleased { lease } => format!("lease {} released", name(lease)),
        Effect::LeaseBroken { lease, .. } => format!("lease {} broken (its holder is told)", name(lease)),
        Effect::ResourceReleasing { resource, cause } => {
            let why = match cause {
                ReleaseCause::Released { .. } => String::new(),
                other => format!(" ({})", timeline_cause(other)),
            };
            format!("{} releasing{why}: {on_agent} is asked to destroy it", name(resource))
        }
        Effect::ResourcePaused { resource, reason, until: end } => format!(
            "{} paused {}{}",
            name(resource),
            until(*end, "until unpaused"),
            reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        Effect::ResourceUnpaused { resource, .. } => format!("{} unpaused", name(resource)),
        Effect::ResourceUpdated { resource, set, remove, capacity } => {
            let mut changes: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
            changes.extend(remove.iter().map(|k| format!("{k} removed")));
            changes.extend(capacity.map(|c| format!("capacity {c}")));
            format!("{} updated: {}", name(resource), changes.join(", "))
        }
        Effect::ResourceSuspect { resource, .. } => {
            format!("{} suspect: {on_agent} is asked for a health check", name(resource))
        }
        Effect::HealthCheckRequested { .. } | Effect::DecisionContinues { .. } | Effect::ObservationAccepted { .. } => {
            return None;
        }
        Effect::GarbageDestroyOrdered { handle, .. } => {
            format!("the quarantined handle of {} is ordered destroyed", name(handle))
        }
        Effect::PoolDefined { kind, cooldown } => {
            format!("pool {} defined: {} identifiers, cool-down {cooldown}", pool_of(outcome), kind.n_usable())
        }
        Effect::PoolUpdated { kind, cooldown, recovered } => format!(
            "pool {} updated: {} identifiers, cool-down {cooldown}{}",
            pool_of(outcome),
            kind.n_usable(),
            if recovered.is_empty() { String::new() } else { format!(", {} recovered", recovered.len()) }
        ),
        Effect::PoolDeleted {} => format!("pool {} deleted", pool_of(outcome)),
        Effect::AgentRetired { .. } => format!("agent {on_agent} retired: what it holds is released"),
        Effect::AgentUnretired { .. } => format!("agent {on_agent} back in service"),
        Effect::AgentCordoned { reason, .. } => format!(
            "agent {on_agent} cordoned: no new allocations; what it holds goes on{}",
            reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        Effect::AgentUncordoned { .. } => format!("agent {on_agent} uncordoned: it takes new allocations again"),
        Effect::AgentDraining { deadline, grace, .. } => format!(
            "agent {on_agent} drains: each resource is released once idle for {grace}{}",
            deadline.map(|at| format!(", everything left at {}", clock.short(at.0))).unwrap_or_default()
        ),
        Effect::PlacementWanted { request, .. } => {
            format!("placement of {} asked for: seeking an agent", name(&request.resource))
        }
        Effect::AgentBreakerCleared { reason: BreakerClear::LossConfirmed { .. } } => {
            format!("agent {on_agent}'s loss confirmed: its breaker is cleared")
        }
        Effect::ResourceLost { resource, .. } => format!("{} recorded lost", name(resource)),
        other => timeline::describe(other),
    })
}

/// Why a resource is released, in a few words (raw text, to be escaped where it is shown).
pub(crate) fn release_cause(cause: &ReleaseCause) -> String {
    timeline_cause(cause)
}

/// A release cause other than a producer's own release, in a few words.
fn timeline_cause(cause: &ReleaseCause) -> String {
    match cause {
        ReleaseCause::Released { by, .. } => format!("released by {by}"),
        ReleaseCause::AgentRetired {} => "its agent retired".to_owned(),
        ReleaseCause::HealthCheckFailed { .. } => "its health check failed".to_owned(),
        ReleaseCause::ParentLeft { parent } => format!("its parent {parent} left"),
        ReleaseCause::ParentAbsent { parent } => format!("its parent {parent} does not exist"),
        ReleaseCause::CreateTimeout {} => "its create timed out".to_owned(),
        ReleaseCause::WaitTimeout { waited } => format!("it waited {waited} for its pools"),
        ReleaseCause::Drained { by, deadline: false } => format!("its agent drains (asked by {by}) and it was idle"),
        ReleaseCause::Drained { by, deadline: true } => {
            format!("its agent drains (asked by {by}) and the deadline came")
        }
        ReleaseCause::OverQuota { quota, kind, max, held, holders } => {
            leasehold_cli_common::timeline::over_quota(quota, kind, *max, *held, holders)
        }
    }
}

/// When a command of type `type_name` was rejected as `already-done` because the state it asks for already holds
/// (a second release, an unpause of what is not paused), what to say instead of an error: the command line then exits
/// 0. Any other rejection, and an `already-done` that is about something else, is `None`: it stays a rejection. So
/// do a `pause` of a paused resource and a `cordon` of a cordoned agent: those states carry who, why and until when,
/// and the one in force may not be the one asked for (the rejection names it).
pub(crate) fn end_state_holds(type_name: &str, rejection: &RejectionInfo) -> Option<String> {
    if rejection.kind != "already-done" {
        return None;
    }
    let says = |text: &str| rejection.message.contains(text);
    let words = match type_name {
        // Releasing, or ended (destroyed, lost, orphaned, failed): released either way; a lost resource with no
        // handle left has nothing to release.
        "op.release" if says(" is already ") || says(" is lost and no handle") => "already released",
        "op.release-lease" if says(" is already ") => "already ended",
        "op.unpause" if says(" is not paused") => "not paused",
        "op.report-failure" if says(" is already suspect") => "already suspect",
        "op.retire-agent" if says(" is already retired") => "already retired",
        "op.unretire-agent" if says(" is not retired") => "not retired",
        "op.uncordon-agent" if says(" is not cordoned") => "not cordoned",
        "op.define-pool" | "op.update-pool" if says(" is already defined so") => "already defined so",
        "op.free-orphan" if says(" holds no identifier") => "nothing held",
        _ => return None,
    };
    Some(format!("{words}: {}", rejection.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(kind: &str, message: &str) -> RejectionInfo {
        RejectionInfo { kind: kind.to_owned(), message: message.to_owned() }
    }

    #[test]
    fn only_an_already_done_that_names_the_state_asked_for_holds() {
        let holds = [
            ("op.release", "resource w1.x is already destroyed"),
            ("op.release", "resource w1.x is already releasing (destruction ordered at 40)"),
            ("op.release", "resource w1.x is lost and no handle of it is on its agent's machine"),
            ("op.release-lease", "lease l is already expired"),
            ("op.unpause", "resource w1.x is not paused"),
            ("op.retire-agent", "agent w1 is already retired"),
            ("op.unretire-agent", "agent w1 is not retired"),
            ("op.uncordon-agent", "agent w1 is not cordoned"),
            ("op.define-pool", "pool net1 is already defined so"),
            ("op.report-failure", "resource w1.x is already suspect; its health check is due"),
        ];
        for (type_name, message) in holds {
            let said = end_state_holds(type_name, &rejection("already-done", message));
            assert!(said.as_deref().is_some_and(|s| s.ends_with(message)), "{type_name}: {said:?}");
        }
        assert_eq!(
            end_state_holds("op.unpause", &rejection("already-done", "resource w1.x is not paused")).unwrap(),
            "not paused: resource w1.x is not paused"
        );
        let stays = [
            // Not already-done: the state is another one.
            ("op.unpause", rejection("invalid-state", "resource w1.x is releasing, not paused")),
            ("op.release", rejection("not-found", "no resource w1.x")),
            // Already-done, but not of what the command asks.
            ("op.unpause", rejection("already-done", "w1.x already holds 10.0.0.7 of pool net1 (claim token 5)")),
            // A state with who, why and until when: the one in force may not be the one asked for.
            ("op.pause", rejection("already-done", "resource w1.x is already paused")),
            ("op.cordon-agent", rejection("already-done", "agent w1 is already cordoned (by op:a since ...)")),
            ("op.acquire", rejection("already-done", "lease l is already active")),
            ("op.set-partition-settings", rejection("already-done", "the partition already has these settings")),
        ];
        for (type_name, rejection) in stays {
            assert_eq!(end_state_holds(type_name, &rejection), None, "{type_name}: {rejection:?}");
        }
    }

    fn outcome(key: &str, effects: serde_json::Value) -> SeqOutcome {
        let outcome: Outcome = serde_json::from_value(serde_json::json!({
            "decider_version": 1, "partition": 5,
            "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.x",
                        "issuer": "cli", "issued_at": 1767225601000u64, "key": key},
            "cmd_seq": 3, "part": 0, "log_time": 1767225601007u64, "decided_at": 1767225601007u64,
            "decision": {"accepted": {"first_position": 57, "effects": effects}}
        }))
        .unwrap();
        SeqOutcome { seq: 9, outcome }
    }

    const NOW: u64 = 1_767_225_600_000;

    #[test]
    fn changes_read_as_words() {
        let clock = Clock::fixed(NOW, crate::output::Zone::utc());
        let allocated = outcome(
            "w1",
            serde_json::json!([
                {"resource-allocated": {"resource": "019b76da-9478-7111-9111-111111111111", "kind": "container",
                    "capacity": 1, "attributes": {}, "parent": null}},
                {"claim-wanted": {"resource": "019b76da-9478-7111-9111-111111111111", "pool": "net1"}}
            ]),
        );
        assert_eq!(
            accepted("allocate", &[allocated], &clock),
            "allocated w1.019b76da-9478-7111-9111-111111111111: container, pending; waiting for an identifier of \
             pool net1"
        );
        let granted = outcome(
            "w1",
            serde_json::json!([{"lease-granted": {"lease": "019b76da-9860-7333-b333-333333333333",
                "resource": "019b76da-9478-7111-9111-111111111111", "holder": "build-42", "ttl": 300000,
                "expires_at": NOW + 300_000}}]),
        );
        assert_eq!(
            accepted("acquire", &[granted], &clock),
            "lease w1.019b76da-9860-7333-b333-333333333333 granted to build-42 on \
             w1.019b76da-9478-7111-9111-111111111111 until 00:05 (in 5 min) (token 57)"
        );
        assert_eq!(
            accepted("release w1.x", &[outcome("w1", serde_json::json!([]))], &clock),
            "release w1.x: accepted; nothing changed"
        );
        let many: Vec<serde_json::Value> = (0..9)
            .map(|n| {
                serde_json::json!({"resource-releasing": {"resource": format!("019b76da-9478-7111-9111-11111111111{n}"),
                "cause": {"agent-retired": {}}}})
            })
            .collect();
        let text = accepted("agent retire w1", &[outcome("w1", many.into())], &clock);
        assert!(text.ends_with("; and 4 more changes (`--output json` lists them)"), "{text}");
        assert!(text.starts_with("w1.019b76da-9478-7111-9111-111111111110 releasing (its agent retired): w1 is asked"));
    }
}
