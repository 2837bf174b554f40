//! Which outcomes concern which thing: the one rule the projection's timeline index and `leasehold-replay history`
//! share, and the rows both answer with.
//!
//! A step (one outcome part) concerns a thing when one of its effects is about it:
//! - a **resource**: an effect names it, in its own partition or from another (a pool's grant to it, a placement of
//!   it, a child's adoption), or names one of its leases (a lease's end names only the lease);
//! - a **lease**: an effect names it;
//! - a **pool identifier** (a pool and one of its values): the pool hands it out or takes it back (`claim-granted`,
//!   `claim-freed`), or a holder binds it, sends it back or holds it for an orphan (`claim-bound`,
//!   `grant-returned`, `claim-held-for-orphan`, `claim-releasable` with a value).
//!
//! A step without effects (a rejection, or a decision that changed nothing) says nothing by itself: then its command,
//! while the log still holds it, tells what it was about — the last token of its subject (an acquire's lease, a
//! release's resource) and every id and pool identifier its body names. A step with effects is about what its
//! effects are about, whatever else its command lists (an agent's report names every resource still being created,
//! and is about none of them once nothing happens to them).
//!
//! Which leases are a resource's is learnt from the effects that make a lease (`lease-waiting`, `lease-queued`,
//! `lease-granted`, which name both): [`concerns`] asks its caller, which remembers them (replay folds the whole log;
//! the projector keeps the leases' records).

use std::collections::BTreeMap;

use leasehold_schemas::ids::{Key, LeaseId, PoolName, ResourceId};
use leasehold_schemas::mentions::Mentions;
use leasehold_schemas::outcome::{Decision, Effect};
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{Outcome, codec};
use serde::{Deserialize, Serialize};

/// A thing a timeline is kept for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Thing {
    Resource(ResourceId),
    Lease(LeaseId),
    /// One identifier of a pool.
    Value(PoolName, PoolValue),
}

impl Thing {
    /// The key of its rows in the index: `r:<resource id>`, `l:<lease id>`, `p:<pool>/<value>` (a pool's name is
    /// a token without `/`, so the key reads back unambiguously). A resource and a lease are keyed by id alone, as
    /// effects name them (a resource of another partition is named by its id, its agent aside) and as
    /// `leasehold-replay history` matches them.
    pub fn key(&self) -> String {
        match self {
            Thing::Resource(id) => format!("r:{id}"),
            Thing::Lease(id) => format!("l:{id}"),
            Thing::Value(pool, value) => format!("p:{pool}/{value}"),
        }
    }
}

impl std::fmt::Display for Thing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Thing::Resource(id) => write!(f, "resource {id}"),
            Thing::Lease(id) => write!(f, "lease {id}"),
            Thing::Value(pool, value) => write!(f, "{value} of pool {pool}"),
        }
    }
}

/// A pool identifier as text: as pools show it (`10.0.0.7`, `slot 3`, `port 8080`), or a bare number for a slot or
/// a port (`kind` says which, when known).
pub fn parse_value(text: &str, kind: Option<&leasehold_schemas::pool::PoolKind>) -> Result<PoolValue, String> {
    use leasehold_schemas::pool::PoolKind;
    let text = text.trim();
    let number = |digits: &str, what: &str| -> Result<u64, String> {
        digits.trim().parse::<u64>().map_err(|_| format!("{text:?} is not a {what}: a whole number follows"))
    };
    if let Some(slot) = text.strip_prefix("slot ") {
        return u32::try_from(number(slot, "slot")?).map(PoolValue::Slot).map_err(|_| format!("{text:?}: too big"));
    }
    if let Some(port) = text.strip_prefix("port ") {
        return u16::try_from(number(port, "port")?).map(PoolValue::Port).map_err(|_| format!("{text:?}: too big"));
    }
    if let Ok(address) = text.parse::<std::net::Ipv4Addr>() {
        return Ok(PoolValue::Ipv4(address));
    }
    match (kind, text.parse::<u64>()) {
        (Some(PoolKind::Slots { .. }), Ok(n)) => {
            u32::try_from(n).map(PoolValue::Slot).map_err(|_| format!("{text:?}: too big for a slot"))
        }
        (Some(PoolKind::Ports { .. }), Ok(n)) => {
            u16::try_from(n).map(PoolValue::Port).map_err(|_| format!("{text:?}: too big for a port"))
        }
        // Without the pool's kind (replay names a pool it has not read yet), a bare number could be either.
        (None, Ok(_)) => Err(format!("{text:?}: say which it is, `slot {text}` or `port {text}`")),
        _ => Err(format!(
            "{text:?} is not a pool identifier: an IPv4 address, `slot N` or `port N` (a bare N for a pool of slots \
             or ports)"
        )),
    }
}

/// What a command names: read from its subject and its body, for a step whose effects say nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Said {
    /// Every id it names (the last token of its subject, every id of its body): a resource's or a lease's.
    pub ids: Vec<ResourceId>,
    /// Every pool identifier its body names: a `value` with the `pool` beside it (or the pool the command is for).
    pub values: Vec<(PoolName, PoolValue)>,
}

impl Said {
    /// What the command with `subject` and `payload` (as the log holds them) names. A payload that does not decode
    /// names nothing but its subject's token.
    pub fn of(subject: &str, payload: &[u8]) -> Said {
        let mut said = Said::default();
        if let Some(id) = subject.rsplit('.').next().and_then(|token| token.parse::<ResourceId>().ok()) {
            said.ids.push(id);
        }
        let Ok(envelope) = codec::decode_command(payload) else { return said };
        let key_pool = match envelope.body.key() {
            Key::Pool(pool) => Some(pool),
            _ => None,
        };
        let Ok(json) = codec::command_to_json(&envelope) else { return said };
        let Ok(mut whole) = serde_json::from_str::<serde_json::Value>(&json) else { return said };
        said.walk(&whole["body"].take(), key_pool.as_ref());
        said.ids.sort();
        said.ids.dedup();
        said.values.sort();
        said.values.dedup();
        said
    }

    fn walk(&mut self, value: &serde_json::Value, key_pool: Option<&PoolName>) {
        match value {
            serde_json::Value::String(text) => {
                if let Ok(id) = text.parse::<ResourceId>() {
                    self.ids.push(id);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| self.walk(item, key_pool)),
            serde_json::Value::Object(map) => {
                if let Some(found) = map.get("value").and_then(|v| serde_json::from_value::<PoolValue>(v.clone()).ok())
                {
                    let pool = map.get("pool").and_then(|p| p.as_str()).and_then(|p| PoolName::new(p).ok());
                    if let Some(pool) = pool.or_else(|| key_pool.cloned()) {
                        self.values.push((pool, found));
                    }
                }
                map.values().for_each(|v| self.walk(v, key_pool));
            }
            _ => {}
        }
    }
}

/// One thing a step concerns, and which of its effects are about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concern {
    pub thing: Thing,
    /// Indexes into the outcome's effects, in order.
    pub effects: Vec<u32>,
    /// Known from the command, not the outcome (the step has no effect): a rebuild finds it again only while the
    /// log holds the command.
    pub told_by_command: bool,
}

/// The leases an outcome makes, with their resources: what [`concerns`]' callers learn from it.
pub fn leases_made(outcome: &Outcome) -> impl Iterator<Item = (LeaseId, ResourceId)> + '_ {
    outcome.effects().iter().filter_map(|effect| match effect {
        Effect::LeaseWaiting { lease, resource, .. }
        | Effect::LeaseQueued { lease, resource, .. }
        | Effect::LeaseGranted { lease, resource, .. } => Some((*lease, *resource)),
        _ => None,
    })
}

/// The pool identifier an effect is about, if any: `key` is the outcome's (a pool's own grants and frees name their
/// pool by it).
fn value_of<'e>(effect: &'e Effect, key: &'e Key) -> Option<(&'e PoolName, PoolValue)> {
    match (effect, key) {
        (Effect::ClaimGranted { value, .. } | Effect::ClaimFreed { value, .. }, Key::Pool(pool)) => {
            Some((pool, *value))
        }
        (
            Effect::ClaimBound { pool, value, .. }
            | Effect::GrantReturned { pool, value, .. }
            | Effect::ClaimHeldForOrphan { pool, value, .. }
            | Effect::ClaimReleasable { pool, value: Some(value), .. },
            _,
        ) => Some((pool, *value)),
        _ => None,
    }
}

/// Every thing `outcome` (one part of a decision) concerns, in key order. `said`: what its command names, if the
/// caller has it (it is read only when the outcome has no effect). `lease_of`: the resource of a lease made before
/// this outcome (those it makes itself are learnt here).
pub fn concerns(
    outcome: &Outcome,
    said: Option<&Said>,
    mut lease_of: impl FnMut(LeaseId) -> Option<ResourceId>,
) -> Vec<Concern> {
    let made: Vec<(LeaseId, ResourceId)> = leases_made(outcome).collect();
    let mut owner = |lease: LeaseId| {
        made.iter().find(|(l, _)| *l == lease).map(|(_, resource)| *resource).or_else(|| lease_of(lease))
    };
    let mut found: BTreeMap<Thing, Concern> = BTreeMap::new();
    let mut add = |thing: Thing, effect: Option<u32>| {
        let concern = found.entry(thing.clone()).or_insert_with(|| Concern {
            thing,
            effects: Vec::new(),
            told_by_command: effect.is_none(),
        });
        if let Some(i) = effect
            && concern.effects.last() != Some(&i)
        {
            concern.effects.push(i);
        }
    };
    let key = &outcome.command.key;
    for (i, effect) in outcome.effects().iter().enumerate() {
        let i = u32::try_from(i).unwrap_or(u32::MAX);
        let m = Mentions::of(effect);
        for resource in m.resources.iter().chain(&m.elsewhere) {
            add(Thing::Resource(*resource), Some(i));
        }
        for lease in &m.leases {
            add(Thing::Lease(*lease), Some(i));
            if let Some(resource) = owner(*lease) {
                add(Thing::Resource(resource), Some(i));
            }
        }
        if let Some((pool, value)) = value_of(effect, key) {
            add(Thing::Value(pool.clone(), value), Some(i));
        }
    }
    if outcome.effects().is_empty()
        && let Some(said) = said
    {
        for id in &said.ids {
            add(Thing::Resource(*id), None);
            if let Ok(lease) = LeaseId::new(id.as_uuid()) {
                add(Thing::Lease(lease), None);
                if let Some(resource) = owner(lease) {
                    add(Thing::Resource(resource), None);
                }
            }
        }
        for (pool, value) in &said.values {
            add(Thing::Value(pool.clone(), *value), None);
        }
    }
    found.into_values().collect()
}

/// One step of a thing's history: who sent what, when, what was decided, and its effects about the thing. What
/// `GET /v1/.../history` answers and `leasehold-replay history` prints (which adds the thing's state after it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub seq: u64,
    pub partition: u32,
    /// The log time of the command (RFC 3339).
    pub time: String,
    pub command: String,
    pub command_id: String,
    pub issuer: String,
    /// The command's correlation id, when it carries one and the log still holds it.
    pub correlation_id: Option<String>,
    pub part: u32,
    /// `accepted` or `rejected`.
    pub outcome: String,
    pub rejection: Option<String>,
    /// The effects about the thing, each as `<position> <name> {fields}`.
    pub effects: Vec<String>,
}

impl Row {
    /// The row of the outcome at `seq`, showing its effects at `effects` (indexes, as [`Concern::effects`]).
    pub fn new(seq: u64, outcome: &Outcome, effects: &[u32], correlation_id: Option<String>) -> Row {
        let (verdict, rejection) = match &outcome.decision {
            Decision::Accepted { .. } => ("accepted", None),
            Decision::Rejected(r) => ("rejected", Some(r.to_string())),
        };
        let effects = outcome
            .positioned_effects()
            .enumerate()
            .filter(|(i, _)| u32::try_from(*i).is_ok_and(|i| effects.contains(&i)))
            .map(|(_, (position, effect))| format!("{} {}", position.0, effect.as_text()))
            .collect();
        Row {
            seq,
            partition: outcome.partition,
            time: outcome.log_time.to_string(),
            command: outcome.command.type_name.clone(),
            command_id: outcome.command.id.to_string(),
            issuer: outcome.command.issuer.to_string(),
            correlation_id,
            part: outcome.part,
            outcome: verdict.to_owned(),
            rejection,
            effects,
        }
    }
}

/// Whether a step is routine for the thing: accepted, and about it only as a confirmation that changes nothing
/// worth reading alone (a lease renewed, a health check passed, an agent's report or heartbeat). Pages fold runs of
/// them into one line.
pub fn routine(outcome: &Outcome, effects: &[u32]) -> bool {
    if outcome.rejection().is_some() {
        return false;
    }
    let all = outcome.effects();
    let about: Vec<&Effect> = effects.iter().filter_map(|i| all.get(*i as usize)).collect();
    if about.is_empty() {
        return matches!(
            outcome.command.type_name.as_str(),
            "agent.heartbeat" | "agent.sync" | "agent.resync-chunk" | "agent.health-result"
        );
    }
    about.iter().all(|effect| {
        matches!(
            effect,
            Effect::LeaseRenewed { .. }
                | Effect::ResourceHealthy { .. }
                | Effect::HealthCheckRequested { .. }
                | Effect::AgentSeen { .. }
                | Effect::ObservationAccepted { .. }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_read_back() {
        let pool = PoolName::new("net").unwrap();
        let value = PoolValue::Ipv4(std::net::Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(Thing::Value(pool, value).key(), "p:net/10.0.0.7");
        assert_eq!(parse_value("10.0.0.7", None), Ok(value));
        assert_eq!(parse_value("slot 3", None), Ok(PoolValue::Slot(3)));
        assert_eq!(parse_value("port 8080", None), Ok(PoolValue::Port(8080)));
        let slots = leasehold_schemas::pool::PoolKind::Slots { count: 4 };
        assert_eq!(parse_value("3", Some(&slots)), Ok(PoolValue::Slot(3)));
        let bare = parse_value("3", None).expect_err("a bare number needs the pool's kind");
        assert!(bare.contains("`slot 3` or `port 3`"), "{bare}");
        assert!(parse_value("slot x", None).is_err());
    }
}
