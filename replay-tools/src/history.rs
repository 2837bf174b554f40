//! `history REF|LEASE|AGENT|POOL`: every command and event touching one thing, in log order, with who sent the
//! command, what was decided, and the thing's state after each step.
//!
//! A thing's history is whole: a resource's holds the ends of its leases (whose effects name only the lease) and the
//! pool's side of its claims (decided in the pool's partition, interleaved by log sequence); an agent's holds the
//! pool's grants and frees of its resources. The fold learns which leases are a resource's, and which resources an
//! agent's, from the effects before (`lease-waiting`, `lease-granted`, `resource-allocated`).
//!
//! Which steps concern a resource, a lease or a pool identifier is decided by [`leasehold_projector::timeline`], the
//! rule the projection's timeline index follows too: `GET /v1/resources/{ref}/history` answers the same rows (all
//! but the state after each step, which takes a fold).

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use leasehold_domain::PartitionState;
use leasehold_domain::state::ClaimSlot;
use leasehold_projector::timeline::{self, Said, Thing};
use leasehold_schemas::mentions::Mentions;
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{AgentName, Key, LeaseId, PoolName, ResourceId, ResourceRef, codec};
use serde::Serialize;
use serde_json::json;

use crate::fold::{Failure, Fold, Step, each_step};

/// What `history` is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Resource(ResourceId),
    Lease(LeaseId),
    Agent(AgentName),
    Pool(PoolName),
    /// A bare name: an agent's or a pool's.
    Name(AgentName, Option<PoolName>),
    /// A bare id: a resource's or a lease's.
    Id(ResourceId, LeaseId),
    /// One identifier of a pool: `@POOL/VALUE` (`@net/10.0.0.7`, `@gpu/slot 3`, `@web/port 8080`).
    Value(PoolName, PoolValue),
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some((pool, value)) =
            text.strip_prefix('@').or_else(|| text.strip_prefix("pool:")).and_then(|p| p.split_once('/'))
        {
            let pool = PoolName::new(pool).map_err(|e| e.to_string())?;
            let value = timeline::parse_value(value, None)?;
            return Ok(Target::Value(pool, value));
        }
        if let Some(pool) = text.strip_prefix('@') {
            return PoolName::new(pool).map(Target::Pool).map_err(|e| e.to_string());
        }
        if let Some(pool) = text.strip_prefix("pool:") {
            return PoolName::new(pool).map(Target::Pool).map_err(|e| e.to_string());
        }
        if let Some(agent) = text.strip_prefix("agent:") {
            return AgentName::new(agent).map(Target::Agent).map_err(|e| e.to_string());
        }
        if let Some(lease) = text.strip_prefix("lease:") {
            return lease.parse::<LeaseId>().map(Target::Lease).map_err(|e| e.to_string());
        }
        if let Some(resource) = text.strip_prefix("resource:") {
            return resource.parse::<ResourceId>().map(Target::Resource).map_err(|e| e.to_string());
        }
        if text.contains('.') {
            // `AGENT.ID` names a resource, and a lease too (`leasehold acquire` prints a lease as `<agent>.<lease id>`):
            // an id is one thing's, so both are followed.
            let reference = text.parse::<ResourceRef>().map_err(|e| e.to_string())?;
            let lease = LeaseId::new(reference.resource.as_uuid()).map_err(|e| e.to_string())?;
            return Ok(Target::Id(reference.resource, lease));
        }
        if let (Ok(resource), Ok(lease)) = (text.parse::<ResourceId>(), text.parse::<LeaseId>()) {
            return Ok(Target::Id(resource, lease));
        }
        match AgentName::new(text) {
            Ok(agent) => Ok(Target::Name(agent, PoolName::new(text).ok())),
            Err(e) => Err(format!(
                "{text:?} is none of a resource (AGENT.ID or ID), a lease id, an agent, a pool (@NAME) or a pool's \
                 identifier (@NAME/VALUE): {e}"
            )),
        }
    }
}

/// One step of a thing's history: the row the projection's timeline answers too ([`timeline::Row`]), and the thing
/// after it.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub step: timeline::Row,
    /// The thing after this step.
    pub state: serde_json::Value,
}

impl std::ops::Deref for Row {
    type Target = timeline::Row;

    fn deref(&self) -> &timeline::Row {
        &self.step
    }
}

/// What the fold has learnt from the steps so far: which resource each lease is (every lease: a command may name
/// one long after it ended), and the resources of the agent asked about. Their effects concern the resource and the
/// agent too, though they do not name them.
#[derive(Debug, Default)]
struct Known {
    leases: HashMap<LeaseId, ResourceId>,
    resources: HashSet<ResourceId>,
}

impl Known {
    /// Learns from `step` (before its effects are selected: an acquire names its lease and its resource together).
    fn learn(&mut self, target: &Target, step: &Step) {
        self.leases.extend(timeline::leases_made(&step.outcome));
        let agent = match (target, &step.outcome.command.key) {
            (Target::Agent(agent) | Target::Name(agent, _), Key::Agent(key)) => agent == key,
            _ => false,
        };
        if agent {
            for effect in step.outcome.effects() {
                if let Effect::ResourceAllocated { resource, .. } = effect {
                    self.resources.insert(*resource);
                }
            }
        }
    }
}

impl Target {
    /// The indexes of `step`'s effects about this thing, and whether the step is about it at all.
    fn select(&self, step: &Step, known: &Known) -> Option<Vec<u32>> {
        let things = match self {
            Target::Resource(id) => vec![Thing::Resource(*id)],
            Target::Lease(id) => vec![Thing::Lease(*id)],
            Target::Id(resource, lease) => vec![Thing::Resource(*resource), Thing::Lease(*lease)],
            Target::Value(pool, value) => vec![Thing::Value(pool.clone(), *value)],
            Target::Agent(_) | Target::Pool(_) | Target::Name(..) => return self.select_whole(step, known),
        };
        // The rule the projection's timeline follows: the command is read only for a step without effect.
        let said = match &step.command {
            Some(command) if step.outcome.effects().is_empty() => Some(Said::of(&command.subject, &command.payload)),
            _ => None,
        };
        let concerns = timeline::concerns(&step.outcome, said.as_ref(), |lease| known.leases.get(&lease).copied());
        let mut about = concerns.iter().filter(|c| things.contains(&c.thing)).peekable();
        about.peek()?;
        let mut effects: Vec<u32> = about.flat_map(|c| c.effects.iter().copied()).collect();
        effects.sort_unstable();
        effects.dedup();
        Some(effects)
    }

    /// [`Target::select`] for an agent or a whole pool: every step of its own partition's key, and the steps of
    /// others about it (a pool's grants to the agent's resources, a holder's claims on the pool).
    fn select_whole(&self, step: &Step, known: &Known) -> Option<Vec<u32>> {
        let outcome = &step.outcome;
        let key = &outcome.command.key;
        let whole_subject = match self {
            Target::Agent(agent) => matches!(key, Key::Agent(a) if a == agent),
            Target::Pool(pool) => matches!(key, Key::Pool(p) if p == pool),
            Target::Name(agent, pool) => {
                matches!(key, Key::Agent(a) if a == agent) || matches!((key, pool), (Key::Pool(p), Some(q)) if p == q)
            }
            _ => false,
        };
        let its_resource =
            |m: &Mentions<'_>| m.resources.iter().chain(&m.elsewhere).any(|r| known.resources.contains(r));
        let effect_matches = |m: &Mentions<'_>| match self {
            Target::Pool(pool) => m.pools.contains(&pool),
            Target::Name(_, Some(pool)) => m.pools.contains(&pool) || its_resource(m),
            Target::Agent(_) | Target::Name(_, None) => its_resource(m),
            Target::Resource(_) | Target::Lease(_) | Target::Id(..) | Target::Value(..) => false,
        };
        let effects: Vec<u32> = (0u32..)
            .zip(outcome.effects())
            .filter(|(_, e)| whole_subject || effect_matches(&Mentions::of(e)))
            .map(|(i, _)| i)
            .collect();
        if whole_subject || !effects.is_empty() {
            return Some(effects);
        }
        // No effect names it (a rejection, a no-op): the command itself may name the pool.
        step.command.as_ref().is_some_and(|c| self.named_in(&c.payload)).then_some(effects)
    }

    /// Whether a command's payload names this pool in its body.
    fn named_in(&self, payload: &[u8]) -> bool {
        let texts = match self {
            Target::Pool(pool) | Target::Name(_, Some(pool)) => vec![pool.to_string()],
            _ => return false,
        };
        // A cheap look at the bytes first, then the decoded body.
        let contains = |needle: &[u8]| !needle.is_empty() && payload.windows(needle.len()).any(|w| w == needle);
        if !texts.iter().any(|t| contains(t.as_bytes())) {
            return false;
        }
        let Ok(envelope) = codec::decode_command(payload) else { return false };
        let Ok(json) = codec::command_to_json(&envelope) else { return false };
        let Ok(body) = serde_json::from_str::<serde_json::Value>(&json) else { return false };
        names_pool(&body["body"], &texts)
    }

    /// The thing after `step`. A resource, a lease or an agent is in its agent's partition, which is not the step's
    /// when a pool decided the step (a grant, a free): then its state there, which the step left as it was.
    fn state_in(&self, fold: &Fold, step: &Step) -> serde_json::Value {
        let here = fold.state(step.partition());
        let home = |holds: &dyn Fn(&PartitionState) -> bool| {
            if holds(here) { here } else { fold.states().find(|s| holds(s)).unwrap_or(here) }
        };
        match self {
            Target::Resource(id) => resource_state(home(&|s| s.resource(*id).is_some()), *id),
            Target::Lease(id) => lease_state(home(&|s| s.lease(*id).is_some()), *id),
            Target::Id(resource, lease) => {
                let state = home(&|s| s.resource(*resource).is_some() || s.lease(*lease).is_some());
                match state.resource(*resource) {
                    Some(_) => resource_state(state, *resource),
                    None => lease_state(state, *lease),
                }
            }
            Target::Agent(agent) | Target::Name(agent, None) => agent_state(home(&|s| s.agent(agent).is_some()), agent),
            Target::Pool(pool) => pool_state(here, pool, step),
            Target::Name(agent, Some(pool)) => match &step.outcome.command.key {
                Key::Pool(key) if key == pool => pool_state(here, pool, step),
                _ => agent_state(home(&|s| s.agent(agent).is_some()), agent),
            },
            Target::Value(pool, value) => value_state(home(&|s| s.pool(pool).is_some()), pool, value),
        }
    }
}

/// A pool identifier in its pool: who holds it, or since when it cools down.
fn value_state(state: &PartitionState, pool: &PoolName, value: &PoolValue) -> serde_json::Value {
    let Some(found) = state.pool(pool) else { return json!(null) };
    if let Some(holder) = found.held.get(value) {
        return json!({ "held_by": holder.to_string() });
    }
    match found.cooling.iter().find(|(_, v)| *v == value) {
        Some(((freed_at, _), _)) => json!({ "cooling_since": freed_at.to_string() }),
        None => json!({ "free": true }),
    }
}

/// Whether a JSON value names one of `texts` as a pool: the value of a `pool` field or an item of a `pools` list
/// (a resource kind, a holder or an attribute that happens to spell a pool's name is not the pool).
fn names_pool(value: &serde_json::Value, texts: &[String]) -> bool {
    let is = |v: &serde_json::Value| v.as_str().is_some_and(|s| texts.iter().any(|t| t == s));
    match value {
        serde_json::Value::Object(map) => map.iter().any(|(key, v)| match (key.as_str(), v) {
            ("pool", v) if is(v) => true,
            ("pools", serde_json::Value::Array(items)) if items.iter().any(is) => true,
            _ => names_pool(v, texts),
        }),
        serde_json::Value::Array(items) => items.iter().any(|v| names_pool(v, texts)),
        _ => false,
    }
}

fn resource_state(state: &PartitionState, id: ResourceId) -> serde_json::Value {
    let Some(resource) = state.resource(id) else { return json!(null) };
    let claims: serde_json::Map<String, serde_json::Value> = resource
        .claims
        .iter()
        .map(|(pool, slot)| {
            let text = match slot {
                ClaimSlot::Wanted { .. } => "wanted".to_owned(),
                ClaimSlot::Bound { value, .. } => format!("bound {value}"),
                ClaimSlot::HeldForOrphan { value, .. } => format!("held for the orphan {value}"),
                ClaimSlot::Returned { .. } => "returned".to_owned(),
            };
            (pool.to_string(), json!(text))
        })
        .collect();
    json!({
        "ref": resource.reference().to_string(),
        "state": resource.state.name(),
        "live_leases": resource.live_leases.len(),
        "capacity": resource.capacity,
        "claims": claims,
    })
}

fn lease_state(state: &PartitionState, id: LeaseId) -> serde_json::Value {
    match state.lease(id) {
        Some(lease) => json!({
            "state": lease.state.name(),
            "holder": lease.holder,
            "resource": ResourceRef::new(lease.agent.clone(), lease.resource).to_string(),
        }),
        None => json!(null),
    }
}

fn agent_state(state: &PartitionState, agent: &AgentName) -> serde_json::Value {
    match state.agent(agent) {
        Some(agent) => json!({
            "status": agent.status(),
            "resources": agent.resources.len(),
            "held": agent.n_held,
            "epoch": agent.epoch.0,
        }),
        None => json!(null),
    }
}

fn pool_state(state: &PartitionState, pool: &PoolName, step: &Step) -> serde_json::Value {
    if let Some(found) = state.pool(pool) {
        return json!({
            "held": found.held.len(),
            "waiting": found.waiters.len(),
            "cooling": found.cooling.len(),
        });
    }
    // An outcome of a holder's partition: the claims of the resources it names on that pool.
    let mut claims = serde_json::Map::new();
    for effect in step.outcome.effects() {
        for id in Mentions::of(effect).resources {
            if let Some(resource) = state.resource(id)
                && let Some(slot) = resource.claims.get(pool)
            {
                let text = match slot {
                    ClaimSlot::Wanted { .. } => "wanted".to_owned(),
                    ClaimSlot::Bound { value, .. } => format!("bound {value}"),
                    ClaimSlot::HeldForOrphan { value, .. } => format!("held for the orphan {value}"),
                    ClaimSlot::Returned { .. } => "returned".to_owned(),
                };
                claims.insert(resource.reference().to_string(), json!(text));
            }
        }
    }
    if claims.is_empty() { json!(null) } else { json!({ "claims": claims }) }
}

/// The rows of `target`'s history, folding `entries` to their end.
pub async fn history(
    partitions: u32,
    entries: futures::stream::BoxStream<'static, Result<leasehold_log::export::Entry, leasehold_log::Error>>,
    target: &Target,
    mut progress: impl FnMut(u64),
) -> Result<Vec<Row>, Failure> {
    let mut rows = Vec::new();
    let mut known = Known::default();
    each_step(partitions, entries, |fold, step| {
        progress(step.seq());
        known.learn(target, step);
        if let Some(effects) = target.select(step, &known) {
            rows.push(row(fold, step, target, &effects));
        }
        ControlFlow::Continue(())
    })
    .await?;
    Ok(rows)
}

fn row(fold: &Fold, step: &Step, target: &Target, effects: &[u32]) -> Row {
    Row {
        step: timeline::Row::new(step.seq(), &step.outcome, effects, step.correlation_id()),
        state: target.state_in(fold, step),
    }
}

/// The rows as text: a line per step, its effects indented under it, then the state after. What the log holds is
/// shown escaped (`leasehold_schemas::text`): the texts of the step, and the JSON of effects and state with their
/// control and bidi characters as JSON escapes.
pub fn render(rows: &[Row]) -> String {
    use leasehold_schemas::text::{json_for_display, shown};
    let mut out = String::new();
    for row in rows {
        let part = if row.part > 0 { format!(" part {}", row.part) } else { String::new() };
        out.push_str(&format!(
            "{:>8}  {}  {}{part}  by {}  (command {}{})  {}\n",
            row.seq,
            shown(&row.time),
            shown(&row.command),
            shown(&row.issuer),
            shown(&row.command_id),
            row.correlation_id.as_ref().map(|c| format!(", correlation {}", shown(c))).unwrap_or_default(),
            match &row.rejection {
                Some(r) => format!("rejected: {}", shown(r)),
                None => row.outcome.clone(),
            },
        ));
        for effect in &row.effects {
            out.push_str(&format!("          {}\n", json_for_display(effect)));
        }
        if !row.state.is_null() {
            out.push_str(&format!("          after: {}\n", json_for_display(&crate::compact(&row.state))));
        }
    }
    if rows.is_empty() {
        out.push_str("nothing in the log touches it\n");
    }
    out
}
