//! `leasehold demo`: a scripted scenario run through `decide`/`apply` in memory, printed as a timeline.
//!
//! Until the services exist, the demo plays every role by hand: operators and producers send `op` commands, the
//! agent `w1` sends its observations, and the sweeper's `sys` commands (claims, binds, frees, ticks) are sent
//! explicitly so the claim chain shows. Everything is deterministic: same output on every run.

use std::io::{self, Write};
use std::net::Ipv4Addr;

use leasehold_domain::driver::Driver;
use leasehold_domain::state::ClaimSlot;
use leasehold_schemas::command::{
    Acquire, Allocate, BindClaim, Claim, DefinePool, Free, Register, Release, ReportCreated, SyncReport, TickPool,
};
use leasehold_schemas::ids::{
    AgentName, LeaseId, Millis, ObsStamp, PoolName, Position, ResourceId, ResourceRef, Source, Timestamp,
};
use leasehold_schemas::outcome::{BreakerClear, Effect, ReleaseCause, ResyncReason, Work};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Command, Decision, Outcome, Uuid};

/// Log time at the start of the demo.
const START: Timestamp = Timestamp(1_800_000_000_000);
const SWEEPER: &str = "sweeper";

/// What the demo established, for tests and for its last lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) n_outcomes: usize,
    pub(crate) n_rejected: usize,
    /// The address the first container got, and the one the third container got after the cool-down.
    pub(crate) first_address: PoolValue,
    pub(crate) reused_address: PoolValue,
    /// Log time between the first container's address being freed and handed out again.
    pub(crate) reuse_after: Millis,
    pub(crate) breaker_tripped: bool,
    pub(crate) nothing_lost_by_breaker: bool,
    pub(crate) refold_matches: bool,
}

struct Demo<'w, W: Write> {
    driver: Driver,
    agent: AgentName,
    pool: PoolName,
    epoch: Position,
    obs: u64,
    out: &'w mut W,
}

/// Runs the scenario, writing the timeline to `out`.
pub(crate) fn run<W: Write>(out: &mut W) -> io::Result<Summary> {
    let mut demo = Demo {
        driver: Driver::new(0, 1, START),
        agent: AgentName::new("w1").expect("valid name"),
        pool: PoolName::new("ips").expect("valid name"),
        epoch: Position::ZERO,
        obs: 0,
        out,
    };
    demo.script()
}

impl<W: Write> Demo<'_, W> {
    fn script(&mut self) -> io::Result<Summary> {
        writeln!(self.out, "leasehold demo: one partition, one agent (w1), one pool of IPv4 addresses (ips)")?;
        writeln!(self.out, "every line is an outcome: the command, who sent it, and its effects at their positions")?;

        self.chapter("an agent registers")?;
        let registered = self.agent_says(Register {
            agent: self.agent.clone(),
            incarnation: Uuid::from_u128(0x5eed),
            wiped: false,
            settings: AgentSettings::default(),
        })?;
        self.epoch = first_position(&registered);

        self.chapter("an operator defines a pool: 10.0.0.0/30 has two addresses; freed ones cool down for 60s")?;
        self.send(
            "op:alice",
            DefinePool {
                pool: self.pool.clone(),
                kind: PoolKind::Ipv4 { network: Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![] },
                cooldown: Some(Millis::from_secs(60)),
            },
        )?;

        self.chapter("a volume, then a container on it with an IP: the claim chain")?;
        let volume = self.allocate("volume", None, false)?;
        let container = self.allocate("container", Some(volume), true)?;
        let first_address = self.claim_and_bind(container)?;

        self.chapter("a build asks for a lease on the pending container: it waits, blocking nobody")?;
        let lease = self.driver.new_lease_id();
        self.acquire(container, lease)?;

        self.chapter("the agent creates both; the waiting lease is granted (its token is its position)")?;
        self.created(volume)?;
        self.created(container)?;

        self.chapter("a second container takes the other address")?;
        let container2 = self.allocate("container", Some(volume), true)?;
        self.claim_and_bind(container2)?;
        self.created(container2)?;
        let lease2 = self.driver.new_lease_id();
        self.acquire(container2, lease2)?;

        self.chapter("the web UI and the CLI release the first container at once: one release, one no-op")?;
        self.release(container, "op:alice")?;
        self.release(container, "op:bob")?;

        self.chapter("the agent is slow to destroy it: its report still holds the container, the IP stays held")?;
        let watermark_before_release = Position(self.driver.state().last_position().0 - 2);
        self.report(watermark_before_release, |_| {})?;

        self.chapter("the agent destroys it and says so: destroyed, and only now the IP may go back")?;
        let watermark = self.driver.state().last_position();
        let destroyed = self.report(watermark, |r| r.destroyed = vec![container])?;
        let freed_at = self.driver.now();
        self.free_releasable(&destroyed)?;

        self.chapter("a report finds the second container gone out-of-band: lost, its lease broken, its IP released")?;
        self.driver.advance(Millis::from_secs(5));
        let watermark = self.driver.state().last_position();
        let lost = self.report(watermark, |r| r.missing = vec![container2])?;
        self.free_releasable(&lost)?;

        self.chapter("a third container wants an IP: both are cooling down, so it waits in the pool's queue")?;
        let container3 = self.allocate("container", Some(volume), true)?;
        let claim_source = self.claim_wanted_source(container3);
        let queued =
            self.sweeper(Claim { pool: self.pool.clone(), holder: self.reference(container3), source: claim_source })?;
        assert_effects(&queued, &["claim-queued"]);
        self.driver.advance(Millis::from_secs(30));
        self.sweeper(TickPool { pool: self.pool.clone() })?;

        self.chapter("after the cool-down, the sweeper's tick hands out the least recently freed address")?;
        self.driver.advance(Millis::from_secs(30));
        let ticked = self.sweeper(TickPool { pool: self.pool.clone() })?;
        let grant = granted(&ticked);
        let reused_address = grant.value;
        let reuse_after = self.driver.now().since(freed_at);
        self.bind(container3, grant)?;
        self.created(container3)?;

        self.chapter("five more volumes, reported created together in the agent's periodic report")?;
        let mut volumes = Vec::new();
        for _ in 0..5 {
            volumes.push(self.allocate("volume", None, false)?);
        }
        let watermark = self.driver.state().last_position();
        self.report(watermark, |r| r.created = volumes.clone())?;

        self.chapter("then a flaky driver lists nothing: every handle missing")?;
        self.driver.advance(Millis::from_secs(30));
        let watermark = self.driver.state().last_position();
        let mut everything = volumes.clone();
        everything.extend([volume, container3]);
        let empty = self.report(watermark, |r| r.missing = everything.clone())?;
        let breaker_tripped = empty.effects().iter().any(|e| matches!(e, Effect::AgentSuspect { .. }));
        let nothing_lost_by_breaker = !empty.effects().iter().any(|e| matches!(e, Effect::ResourceLost { .. }));

        self.chapter("the next report shows the handles again: the breaker clears, nothing was lost")?;
        self.driver.advance(Millis::from_secs(30));
        let watermark = self.driver.state().last_position();
        self.report(watermark, |_| {})?;

        let refold_matches = self.driver.rebuild() == *self.driver.state();
        let n_outcomes = self.driver.outcomes().len();
        let n_rejected = self.driver.outcomes().iter().filter(|o| o.rejection().is_some()).count();
        self.chapter("the end")?;
        let state = self.driver.state();
        for id in [volume, container, container2, container3] {
            let resource = state.resource(id).expect("known");
            let claim = resource.claims.get(&self.pool).map(|slot| match slot {
                ClaimSlot::Bound { value, .. } => format!(" holding {value}"),
                ClaimSlot::Wanted { .. } => " waiting for an address".to_owned(),
                ClaimSlot::Returned { .. } => " (address returned)".to_owned(),
            });
            let line = format!(
                "  {} {:<9} {:<10}{}",
                short(id),
                resource.kind,
                resource.state.name(),
                claim.unwrap_or_default()
            );
            writeln!(self.out, "{}", line.trim_end())?;
        }
        writeln!(
            self.out,
            "  {n_outcomes} outcomes ({n_rejected} rejected, each on record with its reason); \
             folding them from scratch gives the same state: {}",
            if refold_matches { "yes" } else { "NO" }
        )?;
        Ok(Summary {
            n_outcomes,
            n_rejected,
            first_address,
            reused_address,
            reuse_after,
            breaker_tripped,
            nothing_lost_by_breaker,
            refold_matches,
        })
    }

    // --- the roles ----------------------------------------------------------------------------------------------

    fn send(&mut self, issuer: &str, body: impl Into<Command>) -> io::Result<Outcome> {
        let first = self.driver.outcomes().len();
        let outcome = self.driver.submit(issuer, body);
        // Print every part of this outcome (a large decision takes several).
        let new: Vec<Outcome> = self.driver.outcomes()[first..].to_vec();
        if new.is_empty() {
            self.print(&outcome)?;
        }
        for o in &new {
            self.print(o)?;
        }
        Ok(outcome)
    }

    fn agent_says(&mut self, body: impl Into<Command>) -> io::Result<Outcome> {
        let issuer = self.agent.to_string();
        self.send(&issuer, body)
    }

    fn sweeper(&mut self, body: impl Into<Command>) -> io::Result<Outcome> {
        self.send(SWEEPER, body)
    }

    fn reference(&self, id: ResourceId) -> ResourceRef {
        ResourceRef::new(self.agent.clone(), id)
    }

    fn allocate(&mut self, kind: &str, parent: Option<ResourceId>, with_ip: bool) -> io::Result<ResourceId> {
        self.driver.advance(Millis::from_secs(1));
        let resource = self.driver.new_resource_id();
        self.send(
            "op:ci-scheduler",
            Allocate {
                agent: self.agent.clone(),
                resource,
                kind: kind.to_owned(),
                capacity: 1,
                attributes: [("team".to_owned(), "infra".to_owned())].into(),
                parent: parent.map(|p| self.reference(p)),
                pools: if with_ip { vec![self.pool.clone()] } else { vec![] },
            },
        )?;
        Ok(resource)
    }

    fn claim_wanted_source(&self, id: ResourceId) -> Source {
        let position = self
            .driver
            .outcomes()
            .iter()
            .flat_map(Outcome::positioned_effects)
            .find_map(|(p, e)| matches!(e, Effect::ClaimWanted { resource, .. } if *resource == id).then_some(p))
            .expect("the allocation wanted a claim");
        Source { partition: self.driver.state().partition(), position }
    }

    /// The sweeper's two steps: claim at the pool, carry the grant back to the resource.
    fn claim_and_bind(&mut self, id: ResourceId) -> io::Result<PoolValue> {
        let source = self.claim_wanted_source(id);
        let outcome = self.sweeper(Claim { pool: self.pool.clone(), holder: self.reference(id), source })?;
        let grant = granted(&outcome);
        let value = grant.value;
        self.bind(id, grant)?;
        Ok(value)
    }

    fn bind(&mut self, id: ResourceId, grant: Grant) -> io::Result<Outcome> {
        let Grant { value, token, source, wanted } = grant;
        self.sweeper(BindClaim { holder: self.reference(id), pool: self.pool.clone(), value, token, source, wanted })
    }

    /// The sweeper frees every claim an outcome made releasable.
    fn free_releasable(&mut self, outcome: &Outcome) -> io::Result<()> {
        let releasable: Vec<_> = outcome
            .positioned_effects()
            .filter_map(|(position, e)| match e {
                Effect::ClaimReleasable { resource, pool, token, .. } => {
                    Some((*resource, pool.clone(), *token, position))
                }
                _ => None,
            })
            .collect();
        for (resource, pool, token, position) in releasable {
            let source = Source { partition: outcome.partition, position };
            self.sweeper(Free { pool, holder: self.reference(resource), token, source })?;
        }
        Ok(())
    }

    fn acquire(&mut self, resource: ResourceId, lease: LeaseId) -> io::Result<Outcome> {
        self.send(
            "op:build-42",
            Acquire {
                agent: self.agent.clone(),
                resource,
                lease,
                holder: "build-42".to_owned(),
                ttl: Some(Millis::from_mins(30)),
                wait_timeout: Some(Millis::from_mins(5)),
            },
        )
    }

    fn release(&mut self, resource: ResourceId, issuer: &str) -> io::Result<Outcome> {
        let reason =
            Some(format!("released from {}", if issuer.ends_with("alice") { "the web UI" } else { "the CLI" }));
        self.send(issuer, Release { agent: self.agent.clone(), resource, reason })
    }

    fn created(&mut self, resource: ResourceId) -> io::Result<Outcome> {
        self.driver.advance(Millis::from_secs(2));
        self.obs += 1;
        let native_id = Some(format!("drv-{}", &resource.to_string()[28..]));
        self.agent_says(ReportCreated {
            agent: self.agent.clone(),
            epoch: self.epoch,
            obs: self.obs,
            resource,
            native_id,
        })
    }

    /// A sync report with the right count and digest for what it says.
    fn report(&mut self, watermark: Position, lists: impl FnOnce(&mut SyncReport)) -> io::Result<Outcome> {
        self.driver.advance(Millis::from_secs(1));
        self.obs += 1;
        let mut report = SyncReport::new(self.agent.clone(), self.epoch, self.obs, watermark);
        lists(&mut report);
        (report.count, report.digest) =
            leasehold_domain::expected_listing(self.driver.state(), &report).expect("an honest report");
        self.agent_says(report)
    }

    // --- printing -----------------------------------------------------------------------------------------------

    fn chapter(&mut self, title: &str) -> io::Result<()> {
        writeln!(self.out, "\n== {title}")
    }

    fn print(&mut self, outcome: &Outcome) -> io::Result<()> {
        let at = outcome.decided_at.since(START);
        writeln!(
            self.out,
            "t+{:>4}s  {:<24} from {}",
            at.0 / 1000,
            outcome.command.type_name,
            outcome.command.issuer.as_str()
        )?;
        match &outcome.decision {
            Decision::Rejected(rejection) => writeln!(self.out, "           rejected: {rejection}"),
            Decision::Accepted { effects, .. } if effects.is_empty() => {
                writeln!(self.out, "           accepted, nothing changes")
            }
            Decision::Accepted { .. } => {
                for (position, effect) in outcome.positioned_effects() {
                    writeln!(self.out, "           {:<5} {}", position.to_string(), describe(effect))?;
                }
                Ok(())
            }
        }
    }
}

fn first_position(outcome: &Outcome) -> Position {
    outcome.positioned_effects().next().map(|(p, _)| p).expect("accepted with an effect")
}

/// What the sweeper carries back from a grant to its holder.
struct Grant {
    value: PoolValue,
    token: Position,
    /// The grant itself.
    source: Source,
    /// The claim it answers.
    wanted: Source,
}

fn granted(outcome: &Outcome) -> Grant {
    outcome
        .positioned_effects()
        .find_map(|(position, e)| match e {
            Effect::ClaimGranted { value, source, .. } => Some(Grant {
                value: *value,
                token: position,
                source: Source { partition: outcome.partition, position },
                wanted: *source,
            }),
            _ => None,
        })
        .expect("the pool granted a claim")
}

fn assert_effects(outcome: &Outcome, names: &[&str]) {
    let got: Vec<&str> = outcome.effects().iter().map(Effect::name).collect();
    assert_eq!(got, names, "the demo's script expects these effects");
}

/// The last eight hex digits of an id: enough to tell the demo's resources apart.
fn short(id: impl ToString) -> String {
    let text = id.to_string();
    format!("…{}", &text[text.len() - 8..])
}

fn stamp(stamp: &ObsStamp) -> String {
    format!("observation {} of epoch {}", stamp.obs, stamp.epoch)
}

/// One line of plain words for an effect.
fn describe(effect: &Effect) -> String {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_tells_the_whole_story() {
        let mut out = Vec::new();
        let summary = run(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(summary.refold_matches);
        assert!(summary.breaker_tripped && summary.nothing_lost_by_breaker);
        assert_eq!(summary.first_address, PoolValue::Ipv4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(summary.reused_address, summary.first_address, "least recently freed first");
        assert!(summary.reuse_after >= Millis::from_secs(60), "not before the cool-down: {}", summary.reuse_after);
        for line in [
            "lease ",
            "waits on pending",
            "rejected: already-done: resource w1.",
            "rejected: not-yet-due: pool ips",
            "LOST (missing in",
            "CIRCUIT BREAKER",
            "breaker cleared: the handles are back",
            "folding them from scratch gives the same state: yes",
        ] {
            assert!(text.contains(line), "the timeline lacks {line:?}:\n{text}");
        }
        assert!(!text.contains("full resync"), "the demo's agent reports honestly:\n{text}");
        let again = {
            let mut out = Vec::new();
            run(&mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text, again, "the demo is deterministic");
    }
}
