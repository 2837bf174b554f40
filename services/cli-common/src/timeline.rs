//! Outcomes in plain words, one line per effect: the timeline `leasehold demo` prints.

use leasehold_schemas::ids::ObsStamp;
use leasehold_schemas::outcome::{BreakerClear, Effect, FreeCause, GarbageCause, ReleaseCause, ResyncReason, Work};
use leasehold_schemas::text::escape_for_display;
use leasehold_schemas::{Decision, Outcome};

/// The lines of one outcome: the command, who sent it, and each effect at its position (or the rejection); each
/// line escaped for display (holders, kinds, details and rejections are what producers wrote).
pub fn lines(outcome: &Outcome, at_secs: f64) -> Vec<String> {
    let mut out =
        vec![format!("t+{at_secs:>5.1}s  {:<24} from {}", outcome.command.type_name, outcome.command.issuer.as_str())];
    match &outcome.decision {
        Decision::Rejected(rejection) => out.push(format!("           rejected: {rejection}")),
        Decision::Accepted { effects, .. } if effects.is_empty() => {
            out.push("           accepted, nothing changes".to_owned());
        }
        Decision::Accepted { .. } => {
            for (position, effect) in outcome.positioned_effects() {
                out.push(format!("           {:<5} {}", position.to_string(), describe(effect)));
            }
        }
    }
    out.into_iter().map(|line| escape_for_display(&line).into_owned()).collect()
}

/// The last eight hex digits of an id: enough to tell the demo's resources apart.
pub fn short(id: impl ToString) -> String {
    let text = id.to_string();
    format!("…{}", &text[text.len() - 8..])
}

/// Why a holder let its pool identifier go, in plain words; `agent` is the holder's agent, when known.
pub fn free_cause(cause: &FreeCause, agent: Option<&str>) -> String {
    let agent = agent.map(|a| format!(" {a}")).unwrap_or_default();
    match cause {
        FreeCause::Released {} => "its holder ended".to_owned(),
        FreeCause::Orphaned {} => format!("orphan of gone agent{agent}, released at orphaning (the pool's policy)"),
        FreeCause::OrphanDestroyed { at } => {
            format!("orphan of gone agent{agent}, destroy confirmed by{agent} at {at}")
        }
        FreeCause::OrphanFreed { by, reason } => format!("orphan of gone agent{agent}, freed by {by}: {reason}"),
    }
}

/// Why a garbage handle goes, in plain words.
pub fn garbage(cause: &GarbageCause) -> String {
    match cause {
        GarbageCause::Unknown {} => "of no resource the log knows".to_owned(),
        GarbageCause::Destroyed {} => "its resource was destroyed".to_owned(),
        GarbageCause::Orphaned {} => "its resource was orphaned while its agent was gone".to_owned(),
        GarbageCause::Failed {} => "its resource failed to be created".to_owned(),
        GarbageCause::Released { by, .. } => format!("a quarantined handle of a lost resource, released by {by}"),
    }
}

/// An IPv4 pool's subnet (what an agent puts its addresses on).
fn network(definition: &leasehold_schemas::pool::PoolKind) -> String {
    match definition {
        leasehold_schemas::pool::PoolKind::Ipv4 { network, prefix_len, .. } => format!("{network}/{prefix_len}"),
        other => format!("{other:?}"),
    }
}

fn stamp(stamp: &ObsStamp) -> String {
    format!("observation {} of epoch {}", stamp.obs, stamp.epoch)
}

/// Why a resource was refused over its quota: the limit and what holds it.
pub fn over_quota(
    quota: &leasehold_schemas::ids::QuotaName,
    kind: &str,
    max: u32,
    held: u32,
    holders: &[leasehold_schemas::ids::ResourceRef],
) -> String {
    if max == 0 {
        return format!("quota {quota} allows no {kind}");
    }
    let named: Vec<String> = holders.iter().map(ToString::to_string).collect();
    let more = (held as usize).saturating_sub(named.len());
    let held_by = match (named.is_empty(), more) {
        (true, _) => String::new(),
        (false, 0) => format!(": {}", named.join(", ")),
        (false, more) => format!(": {} and {more} more", named.join(", ")),
    };
    format!("quota {quota} is full for {kind}, {held} of {max} held{held_by}; it gave no wait")
}

/// One line of plain words for an effect: raw text, to be escaped where it is shown.
pub fn describe(effect: &Effect) -> String {
    match effect {
        Effect::AgentRegistered { wiped, .. } => {
            format!("agent registered: this position is its epoch{}", if *wiped { " (wiped)" } else { "" })
        }
        Effect::AgentSeen { .. } => "agent seen".to_owned(),
        Effect::AgentStalled { .. } => "agent stalled: no new placements".to_owned(),
        Effect::AgentRecovered {} => "agent recovered".to_owned(),
        Effect::AgentGone { .. } => "agent gone: its resources are orphaned".to_owned(),
        Effect::AgentRetired { by } => format!("agent retired by {by}"),
        Effect::AgentSuspect { would_lose, live } => format!(
            "CIRCUIT BREAKER: the report would lose {would_lose} of {live} resources; nothing is marked, agent is suspect"
        ),
        Effect::AgentBreakerRearmed {} => "breaker armed again after the report it let through".to_owned(),
        Effect::AgentBreakerCleared { reason } => match reason {
            BreakerClear::HandlesBack {} => "breaker cleared: the handles are back".to_owned(),
            BreakerClear::LossConfirmed { by } => format!("breaker cleared: {by} confirmed the loss"),
            BreakerClear::Wiped {} => "breaker cleared: the agent registered wiped".to_owned(),
        },
        Effect::ResyncRequested { reason } => match reason {
            ResyncReason::DigestMismatch { expected_count, reported_count } => {
                format!("full resync requested: expected {expected_count} handles, the agent counted {reported_count}")
            }
            ResyncReason::LossConfirmed {} => "full resync requested after a confirmed loss".to_owned(),
        },
        Effect::ObservationAccepted { stamp: s, watermark } => match watermark {
            Some(w) => format!("{} accepted (watermark {w})", stamp(s)),
            None => format!("{} accepted", stamp(s)),
        },
        Effect::ResourceAllocated { resource, kind, parent, .. } => format!(
            "{kind} {} allocated (pending){}",
            short(resource),
            parent.as_ref().map(|p| format!(" on {}", short(p.resource))).unwrap_or_default()
        ),
        Effect::ClaimWanted { resource, pool } => format!("{} wants an identifier from pool {pool}", short(resource)),
        Effect::ClaimBound { resource, pool, value, token } => {
            format!("{} bound {value} from pool {pool} (claim token {token})", short(resource))
        }
        Effect::CreateOrdered { resource } => {
            format!("{}: all claims bound, the agent must create it", short(resource))
        }
        Effect::ResourceActivated { resource, stamp: s, native_id } => format!(
            "{} active (seen in {}{})",
            short(resource),
            stamp(s),
            native_id.as_ref().map(|n| format!(", driver id {n}")).unwrap_or_default()
        ),
        Effect::ResourceSeen { resource, stamp: s, .. } => {
            format!("{} seen present in {} although it is being destroyed", short(resource), stamp(s))
        }
        Effect::ResourcePaused { resource, .. } => format!("{} paused", short(resource)),
        Effect::ResourceUnpaused { resource, .. } => format!("{} unpaused", short(resource)),
        Effect::ResourceUpdated { resource, .. } => format!("{} updated", short(resource)),
        Effect::ResourceSuspect { resource, .. } => format!("{} suspect: a health check is due", short(resource)),
        Effect::HealthCheckRequested { resource } => format!("health check requested for {}", short(resource)),
        Effect::ResourceHealthy { resource } => format!("{} healthy again", short(resource)),
        Effect::UpstreamFlagged { resource, suspect, .. } => {
            format!(
                "{} {}",
                short(resource),
                if *suspect { "flagged suspect-upstream" } else { "cleared of suspect-upstream" }
            )
        }
        Effect::ResourceReleasing { resource, cause } => {
            let why = match cause {
                ReleaseCause::Released { by, .. } => format!("released by {by}"),
                ReleaseCause::HealthCheckFailed { .. } => "failed its health check".to_owned(),
                ReleaseCause::ParentLeft { parent } => format!("its parent {} left", short(parent.resource)),
                ReleaseCause::CreateTimeout {} => "its create timed out".to_owned(),
                ReleaseCause::AgentRetired {} => "its agent retired".to_owned(),
                ReleaseCause::ParentAbsent { parent } => {
                    format!("its parent {} does not exist", short(parent.resource))
                }
                ReleaseCause::WaitTimeout { waited } => format!("it waited {waited} for its pools' identifiers"),
                ReleaseCause::Drained { by, deadline: false } => {
                    format!("its agent drains (asked by {by}) and it was idle past the grace period")
                }
                ReleaseCause::Drained { by, deadline: true } => {
                    format!("its agent drains (asked by {by}) and the drain's deadline came")
                }
                ReleaseCause::OverQuota { quota, kind, max, held, holders } => {
                    over_quota(quota, kind, *max, *held, holders)
                }
            };
            format!("{} releasing ({why}); the agent must destroy it; its claims stay held", short(resource))
        }
        Effect::ResourceDestroyed { resource, stamp: s } => {
            format!("{} destroyed (confirmed by {})", short(resource), stamp(s))
        }
        Effect::ResourceLost { resource, stamp: s } => format!("{} LOST (missing in {})", short(resource), stamp(s)),
        Effect::ResourceOrphaned { resource } => format!("{} orphaned", short(resource)),
        Effect::ResourceFailed { resource, detail } => format!("{} failed: {detail}", short(resource)),
        Effect::ClaimReleasable { resource, pool, value, .. } => match value {
            Some(value) => format!("{value} of pool {pool} may go back ({} is gone)", short(resource)),
            None => format!("{}'s wait for pool {pool} is withdrawn", short(resource)),
        },
        Effect::LeaseWaiting { lease, resource, holder, .. } => {
            format!("lease {} for {holder} waits on pending {}", short(lease), short(resource))
        }
        Effect::LeaseGranted { lease, resource, holder, .. } => {
            format!("lease {} granted to {holder} on {} (this position is its token)", short(lease), short(resource))
        }
        Effect::LeaseRenewed { lease, .. } => format!("lease {} renewed", short(lease)),
        Effect::LeaseReleased { lease } => format!("lease {} released", short(lease)),
        Effect::LeaseBroken { lease, .. } => format!("lease {} broken: its holder is told", short(lease)),
        Effect::LeaseExpired { lease } => format!("lease {} expired", short(lease)),
        Effect::LeaseFailed { lease } => format!("lease {} failed: waited too long", short(lease)),
        Effect::PoolDefined { kind, cooldown } => {
            format!("pool defined: {} identifiers, cool-down {cooldown}", kind.n_usable())
        }
        Effect::PoolUpdated { kind, cooldown, recovered } => format!(
            "pool updated: {} identifiers, cool-down {cooldown}{}",
            kind.n_usable(),
            if recovered.is_empty() { String::new() } else { format!(", {} recovered", recovered.len()) }
        ),
        Effect::PoolDeleted {} => "pool deleted".to_owned(),
        Effect::ClaimGranted { holder, value, .. } => {
            format!("{value} granted to {} (this position is the claim token)", short(holder.resource))
        }
        Effect::ClaimQueued { holder, .. } => format!("{} queued: nothing free right now", short(holder.resource)),
        Effect::ClaimFreed { value, .. } => format!("{value} freed: cooling down before reuse"),
        Effect::ClaimWithdrawn { holder } => format!("{} left the queue", short(holder.resource)),
        Effect::PartitionSettingsChanged { .. } => "partition settings changed".to_owned(),
        Effect::DecisionContinues { work } => {
            let what = match work {
                Work::OrphanResources {} => "orphaning",
                Work::ReleaseResources {} => "releasing",
                Work::Report { .. } | Work::Chunk { .. } => "the report",
            };
            format!("part full: {what} continues in the next part of this outcome")
        }
        Effect::GrantReturned { resource, pool, value, .. } => {
            format!("{value} of pool {pool} is not {}'s to keep: sent straight back", short(resource))
        }
        Effect::ChildAdopted { parent, child, parent_state, .. } => {
            format!("{} answers its child {}: {parent_state:?}", short(parent), short(child.resource))
        }
        Effect::GarbageDestroyOrdered { handle, cause } => {
            format!("handle {} is garbage ({}): the agent must destroy it", short(handle), garbage(cause))
        }
        Effect::GarbageDryRun { handle, cause } => {
            format!("handle {} is garbage ({}); a dry run: nothing is ordered", short(handle), garbage(cause))
        }
        Effect::GarbageDestroyed { handle, stamp: s } => {
            format!("garbage handle {} destroyed (confirmed by {})", short(handle), stamp(s))
        }
        Effect::HandleReappeared { resource, stamp: s } => format!(
            "the handle of lost {} is back (seen in {}): quarantined, untouched until it is released",
            short(resource),
            stamp(s)
        ),
        Effect::AgentDriverUnavailable { detail } => format!("the agent's driver is UNAVAILABLE: {detail}"),
        Effect::AgentDriverAvailable {} => "the agent's driver is available again".to_owned(),
        Effect::AgentUnretired { by } => format!("agent back in service (unretired by {by})"),
        Effect::AgentCordoned { by, reason } => format!(
            "agent cordoned by {by}: no new allocations; what it holds goes on{}",
            reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        Effect::AgentUncordoned { by } => format!("agent uncordoned by {by}: it takes new allocations again"),
        Effect::AgentDeclared { labels, capacity } => {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let capacity: Vec<String> = capacity.iter().map(|(k, n)| format!("{k}={n}")).collect();
            let list = |items: Vec<String>| if items.is_empty() { "none".to_owned() } else { items.join(", ") };
            format!("agent declares labels {} and capacity {}", list(labels), list(capacity))
        }
        Effect::GcModeChanged { mode } => format!("garbage collection mode: {mode}"),
        Effect::PlacementWanted { request, until } => {
            let select: Vec<String> = request.select.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let on =
                if select.is_empty() { "any agent".to_owned() } else { format!("an agent with {}", select.join(", ")) };
            let wait = until.map(|t| format!("; it may wait for room until {t}")).unwrap_or_default();
            format!("placement of {} ({}) asked for: seeking {on}{wait}", short(request.resource), request.kind)
        }
        Effect::PlacementWaiting { resource, why } => format!("placement of {} waits for room: {why}", short(resource)),
        Effect::PlacementBound { resource, agent, used, capacity, .. } => {
            format!("placement of {} bound to {agent}: {used} of {capacity} of its kind there", short(resource))
        }
        Effect::PlacementFailed { resource, why } => format!("placement of {} refused: {why}", short(resource)),
        Effect::PlacementCancelled { resource, by, reason } => format!(
            "placement of {} cancelled by {by}{}",
            short(resource),
            reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        Effect::PlacementClosed { resource } => {
            format!("placement of {} done: its agent made the resource", short(resource))
        }
        Effect::LeaseQueued { lease, resource, holder, priority, .. } => {
            format!("lease {} for {holder} queues on busy {} (priority {priority})", short(lease), short(resource))
        }
        Effect::ResourceMaxLeaseChanged { resource, max_lease: Some(max) } => {
            format!("{}: a lease may be held at most {max} while others wait", short(resource))
        }
        Effect::ResourceMaxLeaseChanged { resource, max_lease: None } => {
            format!("{}: no limit on how long a lease is held", short(resource))
        }
        Effect::QuotaSet { quota, max, principals } => {
            let max: Vec<String> = max.iter().map(|(kind, n)| format!("{kind}={n}")).collect();
            let principals: Vec<&str> = principals.iter().map(|p| p.as_str()).collect();
            format!("quota {quota} set: at most {} for {}", max.join(", "), principals.join(", "))
        }
        Effect::QuotaRemoved { quota } => format!("quota {quota} removed"),
        Effect::PriorityCapsChanged { max_priority } => {
            let caps: Vec<String> = max_priority.iter().map(|(prefix, cap)| format!("{prefix}*={cap}")).collect();
            let caps = if caps.is_empty() { "none (every issuer: 0)".to_owned() } else { caps.join(", ") };
            format!("lease priority caps: {caps}")
        }
        Effect::CapacityReserved { resource, kind, used, capacity, .. } => {
            format!("room held for the placement of {} ({used} of {capacity} {kind})", short(resource))
        }
        Effect::ReservationEnded { resource, committed: true, .. } => {
            format!("room held for {} becomes the resource", short(resource))
        }
        Effect::ReservationEnded { resource, committed: false, .. } => {
            format!("room held for {} given back (its placement went elsewhere or ended)", short(resource))
        }
        Effect::AgentDraining { by, reason, deadline, grace } => format!(
            "agent drains (asked by {by}{}): idle resources are released after {grace}{}",
            reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default(),
            deadline.map(|d| format!(", everything left at {d}")).unwrap_or_default()
        ),
        Effect::AllocationWaitsUntil { resource, until } => {
            format!("{} waits for its pools' identifiers until {until} at the latest", short(resource))
        }
        Effect::ClaimPoolDefinition { resource, pool, definition } => {
            format!("{}'s address from pool {pool} is of the network {}", short(resource), network(definition))
        }
        Effect::DestroyBlocked { resource, detail } => {
            format!("the destroy of {} cannot finish yet: {detail}; the agent tries again", short(resource))
        }
        Effect::PoolOrphanPolicy { orphans } => match orphans {
            leasehold_schemas::pool::OrphanPolicy::Release => {
                "an orphan's identifiers are released at orphaning".to_owned()
            }
            leasehold_schemas::pool::OrphanPolicy::Hold => {
                "an orphan's identifiers are held until its agent confirms the destroy or an operator frees them"
                    .to_owned()
            }
        },
        Effect::ClaimOrphanPolicy { resource, pool, orphans } => {
            format!("{}'s claim on pool {pool} follows the orphan policy `{orphans}`", short(resource))
        }
        Effect::ClaimHeldForOrphan { resource, pool, value, .. } => format!(
            "{value} of pool {pool} stays HELD for orphan {}: until its agent confirms the destroy or an operator \
             frees it",
            short(resource)
        ),
        Effect::ClaimReleaseCause { resource, pool, cause } => {
            format!("{}'s claim on pool {pool} goes back because: {}", short(resource), free_cause(cause, None))
        }
        Effect::ClaimFreedBecause { holder, cause } => {
            format!("freed because: {}", free_cause(cause, Some(holder.agent.as_str())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(decision: serde_json::Value) -> Outcome {
        serde_json::from_value(serde_json::json!({
            "decider_version": 1, "partition": 5,
            "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.acquire",
                        "issuer": "cli", "issued_at": 1767225601000u64, "key": "w1"},
            "cmd_seq": 3, "part": 0, "log_time": 1767225601007u64, "decided_at": 1767225601007u64,
            "decision": decision
        }))
        .unwrap()
    }

    #[test]
    fn lines_show_what_producers_wrote_escaped() {
        let granted = outcome(serde_json::json!({"accepted": {"first_position": 10, "effects": [
            {"lease-granted": {"lease": "019b76da-9860-7333-b333-333333333333",
                "resource": "019b76da-9478-7111-9111-111111111111", "holder": "x\u{1b}[31mRED\rFAKE\u{202e}",
                "ttl": null, "expires_at": null}}
        ]}}));
        assert_eq!(
            lines(&granted, 1.0)[1],
            "           #10   lease …33333333 granted to x\\x1b[31mRED\\rFAKE\\u{202e} on …11111111 (this position is \
             its token)"
        );
        let rejected = outcome(serde_json::json!({"rejected": {"kind": "invalid-state", "message": "no\nFAKE\u{9b}"}}));
        assert_eq!(lines(&rejected, 1.0)[1], "           rejected: invalid-state: no\\nFAKE\\u{9b}");
    }
}
