//! `state --at TIME|SEQ [--agent A]`: the whole state (or one agent's) as of a moment, folded from the log into a
//! fresh in-memory projection, so it reads as the server's queries do.
//!
//! "As of a time" means: each partition's outcomes whose command the log stamped at or before that time (a
//! partition stops at its first outcome past it, so its chain is never cut in the middle).

use futures::StreamExt;
use leasehold_log::StoredOutcome;
use leasehold_log::export::Entry;
use leasehold_projector::views::{AgentView, LeaseView, PoolView, ResourceView};
use leasehold_projector::{Projector, ResourceQuery};
use leasehold_schemas::codec;
use serde::Serialize;

use crate::why::At;

/// The state as of a moment.
#[derive(Debug, Serialize)]
pub struct StateAt {
    /// The last outcome folded.
    pub seq: u64,
    /// Its log time (RFC 3339), if any outcome was folded.
    pub time: Option<String>,
    pub agents: Vec<AgentView>,
    pub resources: Vec<ResourceView>,
    pub leases: Vec<LeaseView>,
    pub pools: Vec<PoolView>,
}

pub async fn state_at(
    partitions: u32,
    mut entries: futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    at: At,
    agent: Option<&str>,
    mut progress: impl FnMut(u64),
) -> anyhow::Result<StateAt> {
    let mut projector = Projector::in_memory(partitions)?;
    let mut batch: Vec<StoredOutcome> = Vec::new();
    let mut stopped = vec![false; partitions as usize];
    let (mut seq, mut time) = (0, None);
    // Whether each partition's last outcome taken goes on in a next part: a decision's parts are taken whole, so a
    // moment inside one (`--at` the sequence of a part that continues) reads as the decision's end.
    let mut continues = vec![false; partitions as usize];
    while let Some(entry) = entries.next().await {
        let Entry::Outcome(stored) = entry? else { continue };
        let p = stored.partition as usize;
        if p >= stopped.len() {
            anyhow::bail!("outcome {} is of partition {p}, which this log does not have", stored.seq);
        }
        let outcome = codec::decode_outcome(&stored.payload)
            .map_err(|e| anyhow::anyhow!("outcome {} does not decode: {e}", stored.seq))?;
        let past = match at {
            At::Seq(limit) => stored.seq > limit,
            At::Time(limit) => stopped[p] || outcome.log_time > limit,
        };
        if past && !continues[p] {
            stopped[p] = true;
            if stopped.iter().zip(&continues).all(|(s, c)| *s || !*c) && matches!(at, At::Seq(_)) {
                break;
            }
            if stopped.iter().all(|s| *s) {
                break;
            }
            continue;
        }
        continues[p] = outcome.continues();
        if !past {
            time = Some(outcome.log_time);
        }
        seq = stored.seq;
        progress(seq);
        batch.push(stored);
        if batch.len() >= leasehold_projector::MAX_BATCH {
            projector.apply_batch(&batch)?;
            batch.clear();
        }
    }
    projector.apply_batch(&batch)?;
    let reader = projector.reader();
    let query = ResourceQuery { agent: agent.map(str::to_owned), ..ResourceQuery::default() };
    let resources = reader.resources(&query)?;
    let mut agents = reader.agents()?;
    let mut leases = reader.leases()?;
    if let Some(agent) = agent {
        agents.retain(|a| a.name == agent);
        leases.retain(|l| resources.iter().any(|r| r.reference == l.resource));
    }
    let pools = if agent.is_some() { Vec::new() } else { reader.pools()? };
    Ok(StateAt { seq, time: time.map(|t| t.to_string()), agents, resources, leases, pools })
}

/// The state as text: a table per kind of thing.
pub fn render(state: &StateAt) -> String {
    use leasehold_cli_common::output::Table;
    let mut out = format!(
        "as of outcome {}{}\n\n",
        state.seq,
        state.time.as_ref().map(|t| format!(" ({t})")).unwrap_or_default()
    );
    let mut agents = Table::new(&["AGENT", "STATUS", "EPOCH", "RESOURCES", "HELD"]);
    for a in &state.agents {
        agents.row(vec![
            a.name.clone(),
            a.status.clone(),
            a.epoch.to_string(),
            a.resources.to_string(),
            a.held.to_string(),
        ]);
    }
    out.push_str(&agents.render());
    out.push('\n');
    let mut resources = Table::new(&["RESOURCE", "STATE", "KIND", "LEASES", "CLAIMS"]);
    for r in &state.resources {
        let claims: Vec<String> = r
            .claims
            .iter()
            .map(|c| format!("{}:{}{}", c.pool, c.status, c.id.as_ref().map(|v| format!(" {v}")).unwrap_or_default()))
            .collect();
        resources.row(vec![
            r.reference.clone(),
            r.state.clone(),
            r.kind.clone(),
            format!("{}/{}", r.leases.len(), r.capacity),
            if claims.is_empty() { "-".to_owned() } else { claims.join(" ") },
        ]);
    }
    out.push_str(&resources.render());
    out.push('\n');
    let mut leases = Table::new(&["LEASE", "RESOURCE", "HOLDER", "STATE"]);
    for l in &state.leases {
        leases.row(vec![l.id.clone(), l.resource.clone(), l.holder.clone(), l.state.clone()]);
    }
    out.push_str(&leases.render());
    if !state.pools.is_empty() {
        out.push('\n');
        let mut pools = Table::new(&["POOL", "HELD", "WAITING", "COOLING"]);
        for p in &state.pools {
            pools.row(vec![p.name.clone(), p.held.to_string(), p.waiting.to_string(), p.cooling.to_string()]);
        }
        out.push_str(&pools.render());
    }
    out
}
