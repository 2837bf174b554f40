//! `why --ip ADDR | --slot POOL:N | --port POOL:N [--at TIME|SEQ]`: who held a pool's identifier, since when,
//! through which commands (who sent each, its id and correlation id), and when and why it was let go and freed.
//!
//! A holding is followed across partitions: the allocation that wanted the claim (the holder's partition), the
//! grant (the pool's), the binding (the holder's), the release and the end of the resource (the holder's), the
//! claim let go (the holder's) and the free (the pool's).

use std::collections::HashMap;
use std::ops::ControlFlow;

use leasehold_schemas::outcome::{Effect, FreeCause, ReleaseCause};
use leasehold_schemas::pool::PoolValue;
use leasehold_schemas::{AgentName, Key, PoolName, ResourceId, Timestamp};
use serde::Serialize;

use crate::fold::{Failure, Step, each_step};

/// The identifier asked about: a value, in one pool or in any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub pool: Option<PoolName>,
    pub value: PoolValue,
}

/// A moment of the log: an outcome sequence, or a log time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Seq(u64),
    Time(Timestamp),
}

impl std::str::FromStr for At {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(seq) = text.parse::<u64>() {
            return Ok(At::Seq(seq));
        }
        // humantime reads UTC (`Z`) and zone-less times; an offset (`+01:00`) is applied here.
        let (time, offset_s) = split_offset(text);
        humantime::parse_rfc3339_weak(time)
            .map(|t| {
                let ms = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
                At::Time(Timestamp((ms - offset_s * 1000).max(0) as u64))
            })
            .map_err(|e| {
                format!("{text:?} is neither an outcome sequence nor a time (2026-11-23T14:02:00Z, or +01:00): {e}")
            })
    }
}

/// A time and its UTC offset in seconds: `...T14:02:00+01:00` is `...T14:02:00` at +3600 s.
fn split_offset(text: &str) -> (&str, i64) {
    let Some(t) = text.find(['T', 't', ' ']) else { return (text, 0) };
    let clock = &text[t..];
    let Some(at) = clock.rfind(['+', '-']) else { return (text, 0) };
    let offset = &clock[at + 1..];
    let parts: Vec<&str> = offset.split(':').collect();
    let (Some(h), Some(m)) =
        (parts.first().and_then(|h| h.parse::<i64>().ok()), parts.get(1).and_then(|m| m.parse::<i64>().ok()))
    else {
        return (text, 0);
    };
    if parts.len() != 2 || h > 23 || m > 59 {
        return (text, 0);
    }
    let sign = if clock.as_bytes()[at] == b'-' { -1 } else { 1 };
    (&text[..t + at], sign * (h * 3600 + m * 60))
}

/// One step of a holding.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub seq: u64,
    /// The command's log time (RFC 3339).
    pub time: String,
    #[serde(skip)]
    pub time_ms: u64,
    pub command: String,
    pub command_id: String,
    pub issuer: String,
    pub correlation_id: Option<String>,
    /// What happened, in words.
    pub detail: String,
}

/// One holder's time with the identifier.
#[derive(Debug, Clone, Serialize)]
pub struct Holding {
    pub pool: String,
    pub value: String,
    /// The holding resource (`AGENT.ID`).
    pub holder: String,
    /// The allocation that wanted the claim.
    pub allocated: Option<Event>,
    pub granted: Event,
    pub bound: Option<Event>,
    /// The release of the holder: who or what asked for it, and why.
    pub releasing: Option<Event>,
    /// The holder's end: destroyed, lost, orphaned or failed.
    pub ended: Option<Event>,
    /// An orphan kept it (its pool holds an orphan's identifiers) until its agent confirmed the destroy or an
    /// operator freed it.
    pub held: Option<Event>,
    /// The holder's partition let the claim go (with a terminal state), or returned a grant it could not keep.
    pub let_go: Option<Event>,
    pub freed: Option<Event>,
    /// Why the identifier went back to its pool, once freed: the holder's end in words (destroyed after a release by
    /// whom, lost, failed, orphaned because its agent was declared gone and when, or a grant returned).
    pub freed_because: Option<String>,
    /// The reason, known from the holder's end until the free.
    #[serde(skip)]
    reason: Option<String>,
    /// The release that ordered the holder's destruction, in words.
    #[serde(skip)]
    release: Option<String>,
}

impl Holding {
    /// A holding of `value` of `pool` by `holder`, granted by `granted`, with nothing after the grant yet.
    pub fn new(pool: String, value: String, holder: String, granted: Event) -> Self {
        Holding {
            pool,
            value,
            holder,
            allocated: None,
            granted,
            bound: None,
            releasing: None,
            ended: None,
            held: None,
            let_go: None,
            freed: None,
            freed_because: None,
            reason: None,
            release: None,
        }
    }

    fn covers(&self, at: At) -> bool {
        match at {
            At::Seq(seq) => self.granted.seq <= seq && self.freed.as_ref().is_none_or(|f| f.seq > seq),
            At::Time(t) => self.granted.time_ms <= t.0 && self.freed.as_ref().is_none_or(|f| f.time_ms > t.0),
        }
    }

    fn starts_after(&self, at: At) -> bool {
        match at {
            At::Seq(seq) => self.granted.seq > seq,
            At::Time(t) => self.granted.time_ms > t.0,
        }
    }
}

/// What `why` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub value: String,
    pub pool: Option<String>,
    /// The moment asked about, if any.
    pub at: Option<String>,
    /// Every holding (or, with a moment, the one that covers it, if any).
    pub holdings: Vec<Holding>,
    /// With a moment nobody held it at: the holding that ended last before it.
    pub before: Option<Holding>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_sequences_or_times_with_offsets() {
        assert_eq!("42".parse::<At>(), Ok(At::Seq(42)));
        let utc = "2026-11-23T12:57:09Z".parse::<At>().unwrap();
        assert_eq!("2026-11-23T13:57:09+01:00".parse::<At>().unwrap(), utc);
        assert_eq!("2026-11-23T07:57:09-05:00".parse::<At>().unwrap(), utc);
        assert_eq!("2026-11-23T12:57:09.500Z".parse::<At>(), Ok(At::Time(Timestamp(1_795_438_629_500))));
        assert!("yesterday".parse::<At>().is_err());
    }
}

#[derive(Default)]
struct Tracker {
    holdings: Vec<Holding>,
    /// When each agent was last declared gone, and when it was seen last before.
    gone: HashMap<AgentName, (Timestamp, Timestamp)>,
    /// Holdings not freed yet, by holder.
    open: HashMap<ResourceId, Vec<usize>>,
    /// The allocation of each resource that wanted a claim of a matching pool, until its holding opens.
    allocations: HashMap<ResourceId, Event>,
    /// The holding the last `claim-freed` closed, by holder: a `claim-freed-because` right after it says why.
    last_freed: Option<(ResourceId, usize)>,
}

fn event(step: &Step, detail: String) -> Event {
    let outcome = &step.outcome;
    let correlation_id = step.correlation_id();
    Event {
        seq: step.seq(),
        time: outcome.log_time.to_string(),
        time_ms: outcome.log_time.0,
        command: outcome.command.type_name.clone(),
        command_id: outcome.command.id.to_string(),
        issuer: outcome.command.issuer.to_string(),
        correlation_id,
        detail,
    }
}

fn cause(cause: &ReleaseCause) -> String {
    match cause {
        ReleaseCause::Released { by, reason } => {
            format!("released by {by}{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())
        }
        ReleaseCause::HealthCheckFailed { detail } => format!("a health check failed: {detail}"),
        ReleaseCause::ParentLeft { parent } => format!("its parent {parent} left"),
        ReleaseCause::CreateTimeout {} => "its create did not finish in time".to_owned(),
        ReleaseCause::AgentRetired {} => "its agent was retired".to_owned(),
        ReleaseCause::ParentAbsent { parent } => format!("its parent {parent} does not exist"),
        ReleaseCause::WaitTimeout { waited } => format!("it waited {waited} for its pools' identifiers"),
        ReleaseCause::Drained { by, deadline: false } => {
            format!("its agent was draining (asked by {by}) and it was idle past the grace period")
        }
        ReleaseCause::Drained { by, deadline: true } => {
            format!("its agent was draining (asked by {by}) and the deadline came")
        }
        ReleaseCause::OverQuota { quota, kind, max, held, holders } => {
            leasehold_cli_common::timeline::over_quota(quota, kind, *max, *held, holders)
        }
    }
}

/// A release's cause, to follow "after it was": "released by X: reason", or "released because <the cause>".
fn released(why: &ReleaseCause) -> String {
    match why {
        ReleaseCause::Released { .. } => cause(why),
        other => format!("released because {}", cause(other)),
    }
}

impl Tracker {
    fn step(&mut self, query: &Query, step: &Step) {
        let pool_key = match &step.outcome.command.key {
            Key::Pool(pool) => Some(pool),
            Key::Agent(_) | Key::Placement(_) => None,
        };
        let pool_matches = |pool: &PoolName| query.pool.as_ref().is_none_or(|q| q == pool);
        let at = step.outcome.decided_at;
        // A `claim-freed-because` follows its `claim-freed` in the same outcome.
        self.last_freed = None;
        for effect in step.outcome.effects() {
            match effect {
                Effect::AgentGone { last_seen } => {
                    if let Key::Agent(agent) = &step.outcome.command.key {
                        self.gone.insert(agent.clone(), (at, *last_seen));
                    }
                }
                Effect::ClaimWanted { resource, pool } if pool_matches(pool) => {
                    let detail = format!("allocated, wanting an identifier of pool {pool}");
                    self.allocations.insert(*resource, event(step, detail));
                }
                Effect::ClaimGranted { holder, value, .. } if *value == query.value => {
                    let Some(pool) = pool_key.filter(|p| pool_matches(p)) else { continue };
                    let holding = Holding {
                        pool: pool.to_string(),
                        value: value.to_string(),
                        holder: holder.to_string(),
                        allocated: self.allocations.remove(&holder.resource),
                        granted: event(step, format!("{value} granted to {holder}")),
                        bound: None,
                        releasing: None,
                        ended: None,
                        held: None,
                        let_go: None,
                        freed: None,
                        freed_because: None,
                        reason: None,
                        release: None,
                    };
                    self.open.entry(holder.resource).or_default().push(self.holdings.len());
                    self.holdings.push(holding);
                }
                Effect::ClaimBound { resource, pool, value, .. } if *value == query.value && pool_matches(pool) => {
                    self.each_open(*resource, Some(pool), |h| {
                        h.bound.get_or_insert_with(|| event(step, format!("{value} bound to the resource")));
                    });
                }
                Effect::ResourceReleasing { resource, cause: why } => {
                    self.each_open(*resource, None, |h| {
                        h.releasing.get_or_insert_with(|| event(step, format!("releasing: {}", cause(why))));
                        h.release.get_or_insert_with(|| released(why));
                    });
                }
                Effect::ResourceDestroyed { resource, .. }
                | Effect::ResourceLost { resource, .. }
                | Effect::ResourceOrphaned { resource }
                | Effect::ResourceFailed { resource, .. } => {
                    let detail = leasehold_cli_common::timeline::describe(effect);
                    let reason = self.end_reason(effect, step);
                    let destroyed = matches!(effect, Effect::ResourceDestroyed { .. });
                    self.each_open(*resource, None, |h| {
                        h.ended.get_or_insert_with(|| event(step, detail.clone()));
                        let reason = match &h.release {
                            Some(release) if destroyed => format!("{reason}, after it was {release}"),
                            _ => reason.clone(),
                        };
                        h.reason.get_or_insert(reason);
                    });
                    self.allocations.remove(resource);
                }
                Effect::ClaimReleasable { resource, pool, value: Some(value), .. }
                    if *value == query.value && pool_matches(pool) =>
                {
                    self.each_open(*resource, Some(pool), |h| {
                        h.let_go.get_or_insert_with(|| event(step, "the claim may go back to its pool".to_owned()));
                    });
                }
                Effect::ClaimHeldForOrphan { resource, pool, value, .. }
                    if *value == query.value && pool_matches(pool) =>
                {
                    self.each_open(*resource, Some(pool), |h| {
                        h.held.get_or_insert_with(|| {
                            let detail = "held for the orphan: its pool holds an orphan's identifiers until its agent \
                                          confirms the destroy or an operator frees it";
                            event(step, detail.to_owned())
                        });
                    });
                }
                Effect::ClaimReleaseCause { resource, pool, cause } if pool_matches(pool) => {
                    let agent = match &step.outcome.command.key {
                        Key::Agent(agent) => Some(agent.as_str()),
                        Key::Pool(_) | Key::Placement(_) => None,
                    };
                    let words = leasehold_cli_common::timeline::free_cause(cause, agent);
                    self.each_open(*resource, Some(pool), |h| h.reason = Some(words.clone()));
                }
                Effect::ClaimFreedBecause { holder, cause } => {
                    if let Some((resource, idx)) = self.last_freed.take()
                        && resource == holder.resource
                    {
                        // An orphan released at orphaning: the holder's end says more (when its agent was
                        // declared gone, last seen when). The others say who let it go, as the pool recorded it.
                        let holding = &mut self.holdings[idx];
                        if !(matches!(cause, FreeCause::Orphaned {}) && holding.freed_because.is_some()) {
                            let agent = Some(holder.agent.as_str());
                            holding.freed_because = Some(leasehold_cli_common::timeline::free_cause(cause, agent));
                        }
                    }
                }
                Effect::GrantReturned { resource, pool, value, .. } if *value == query.value && pool_matches(pool) => {
                    self.each_open(*resource, Some(pool), |h| {
                        h.let_go.get_or_insert_with(|| {
                            event(step, "the grant was returned: not the resource's to keep".to_owned())
                        });
                        h.reason.get_or_insert_with(|| {
                            format!("the grant was not its holder's to keep: its partition returned it at {at}")
                        });
                    });
                }
                Effect::ClaimFreed { holder, value, .. } if *value == query.value => {
                    let Some(pool) = pool_key.filter(|p| pool_matches(p)) else { continue };
                    let pool_text = pool.to_string();
                    if let Some(open) = self.open.get_mut(&holder.resource) {
                        if let Some(at) = open.iter().position(|i| self.holdings[*i].pool == pool_text) {
                            let idx = open.remove(at);
                            let holding = &mut self.holdings[idx];
                            holding.freed = Some(event(step, format!("{value} freed")));
                            holding.freed_because = holding.reason.clone();
                            self.last_freed = Some((holder.resource, idx));
                        }
                        if open.is_empty() {
                            self.open.remove(&holder.resource);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Why a holder's end lets its claim go, in words (a destruction is followed by the release that ordered it,
    /// which the holding knows).
    fn end_reason(&self, effect: &Effect, step: &Step) -> String {
        let at = step.outcome.decided_at;
        let agent = match &step.outcome.command.key {
            Key::Agent(agent) => Some(agent),
            Key::Pool(_) | Key::Placement(_) => None,
        };
        let its_agent = agent.map(|a| format!("its agent {a}")).unwrap_or_else(|| "its agent".to_owned());
        match effect {
            Effect::ResourceDestroyed { .. } => format!("its holder was destroyed, as {its_agent} confirmed at {at}"),
            Effect::ResourceLost { .. } => format!("its holder was lost: {its_agent} found it missing at {at}"),
            Effect::ResourceFailed { detail, .. } => {
                format!("its holder failed: {its_agent} could not create it ({detail}), at {at}")
            }
            _ => match agent.and_then(|a| self.gone.get(a).map(|gone| (a, gone))) {
                Some((agent, (declared, last_seen))) => format!(
                    "its holder's agent {agent} was declared gone at {declared} (not seen since {last_seen}): the \
                     holder was orphaned, and may still run if its machine was cut off rather than dead"
                ),
                None => format!("its holder was orphaned at {at}: {its_agent} was gone"),
            },
        }
    }

    fn each_open(&mut self, resource: ResourceId, pool: Option<&PoolName>, mut change: impl FnMut(&mut Holding)) {
        let Some(open) = self.open.get(&resource) else { return };
        for idx in open {
            let holding = &mut self.holdings[*idx];
            if pool.is_none_or(|p| holding.pool == p.as_str()) {
                change(holding);
            }
        }
    }
}

/// Folds `entries` to their end and answers `query` (at `at`, or over all time).
pub async fn why(
    partitions: u32,
    entries: futures::stream::BoxStream<'static, Result<leasehold_log::export::Entry, leasehold_log::Error>>,
    query: &Query,
    at: Option<At>,
    mut progress: impl FnMut(u64),
) -> Result<Answer, Failure> {
    let mut tracker = Tracker::default();
    each_step(partitions, entries, |_, step| {
        progress(step.seq());
        if let Some(At::Seq(seq)) = at
            && step.seq() > seq
            && tracker.open.is_empty()
        {
            // Nothing held at the moment asked about can end later than here: the rest is not needed.
            return ControlFlow::Break(());
        }
        tracker.step(query, step);
        ControlFlow::Continue(())
    })
    .await?;
    let mut answer = Answer {
        value: query.value.to_string(),
        pool: query.pool.as_ref().map(ToString::to_string),
        at: at.map(|at| match at {
            At::Seq(seq) => format!("outcome {seq}"),
            At::Time(t) => t.to_string(),
        }),
        holdings: Vec::new(),
        before: None,
    };
    match at {
        None => answer.holdings = tracker.holdings,
        Some(at) => {
            answer.before = tracker.holdings.iter().rfind(|h| !h.covers(at) && !h.starts_after(at)).cloned();
            answer.holdings = tracker.holdings.into_iter().filter(|h| h.covers(at)).collect();
        }
    }
    Ok(answer)
}

/// The answer as text, escaped for display (`leasehold_schemas::text`): holders and details are what producers
/// wrote.
pub fn render(answer: &Answer) -> String {
    let mut out = String::new();
    let what = match &answer.pool {
        Some(pool) => format!("{} of pool {pool}", answer.value),
        None => answer.value.clone(),
    };
    match (&answer.at, answer.holdings.is_empty()) {
        (Some(at), true) => {
            out.push_str(&shown_line(format!("nobody held {what} at {at}")));
            if let Some(before) = &answer.before {
                out.push_str("the holding before it:\n");
                holding(&mut out, before);
            }
            return out;
        }
        (None, true) => {
            out.push_str(&shown_line(format!("nobody ever held {what}")));
            return out;
        }
        (Some(at), false) => out.push_str(&shown_line(format!("{what} at {at}:"))),
        (None, false) => out.push_str(&shown_line(format!("{what}: {} holding(s)", answer.holdings.len()))),
    }
    for h in &answer.holdings {
        holding(&mut out, h);
    }
    out
}

/// A line of raw text, escaped for display, with its newline.
fn shown_line(text: String) -> String {
    format!("{}\n", leasehold_schemas::text::escape_for_display(&text))
}

fn holding(out: &mut String, h: &Holding) {
    let until = match &h.freed {
        Some(freed) => format!("until outcome {} ({})", freed.seq, freed.time),
        None => "still held".to_owned(),
    };
    out.push_str(&shown_line(format!(
        "{} of pool {}: held by {} from outcome {} ({}), {until}",
        h.value, h.pool, h.holder, h.granted.seq, h.granted.time
    )));
    let steps = [
        ("allocated", &h.allocated),
        ("granted", &Some(h.granted.clone())),
        ("bound", &h.bound),
        ("releasing", &h.releasing),
        ("ended", &h.ended),
        ("held", &h.held),
        ("let go", &h.let_go),
        ("freed", &h.freed),
    ];
    let mut table =
        leasehold_cli_common::output::Table::new(&["  STEP", "SEQ", "TIME", "COMMAND", "BY", "COMMAND ID", "WHAT"]);
    for (name, step) in steps {
        if let Some(e) = step {
            let id = match &e.correlation_id {
                Some(c) => format!("{} (correlation {c})", e.command_id),
                None => e.command_id.clone(),
            };
            table.row(vec![
                format!("  {name}"),
                e.seq.to_string(),
                e.time.clone(),
                e.command.clone(),
                e.issuer.clone(),
                id,
                e.detail.clone(),
            ]);
        }
    }
    out.push_str(&table.render());
    if let Some(because) = &h.freed_because {
        out.push_str(&format!("  freed because {because}\n"));
    }
}
