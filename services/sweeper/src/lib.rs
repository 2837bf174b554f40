//! The sweeper: time-driven and cross-partition work, asked for with `sys` commands.
//!
//! It folds every partition's outcomes into the same state the writers decide against (loading from their
//! snapshots, then following the log), plans from it what is due (see [`plan`]), and publishes those requests.
//! It never writes state and never decides: a request is decided by the partition it goes to, by the log's clock.
//! One that arrives early is refused `not-yet-due` (not remembered), and asked again after `retry_after`.
//!
//! It plans as soon as new outcomes are folded (a burst of them once, at most every `plan_gap`), so a claim
//! releasable, a grant or an adoption answer is carried on within milliseconds; the tick (`interval`) is for what
//! falls due with time alone: a deadline that passes while nothing is appended.
//!
//! Several sweepers may run at once. A request's command id derives from the work it asks for and the second it is
//! sent in, so sweepers that plan the same work at the same time send the same command (the log keeps one copy);
//! otherwise two copies may be decided, and the second is refused (the lease has already expired, the claim is
//! already bound). Nothing is ever done twice.

#![forbid(unsafe_code)]

pub mod plan;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use leasehold_domain::PartitionState;
use leasehold_domain::state::ResourceState;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::codec;
use leasehold_schemas::command::Cascade;
use leasehold_schemas::envelope::Envelope;
use leasehold_schemas::ids::{CommandId, Issuer, ResourceRef, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::subjects::ingress_subject_of;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::plan::Planned;

/// How a sweeper runs.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Who the requests are from (their issuer): `sweeper` and this name.
    pub name: String,
    /// How often the sweeper looks for work that falls due with time alone (a deadline that passes with no new
    /// outcome). Outcomes are planned for as they arrive, not at this pace.
    pub interval: Duration,
    /// The shortest gap between two plans made for arriving outcomes: a burst of outcomes is planned once.
    pub plan_gap: Duration,
    /// A request whose effect has not shown after this long is sent again (as a new command).
    pub retry_after: Duration,
    /// A resource `releasing` for longer than this is reported: a metric and an alert line.
    pub release_timeout: Duration,
    /// Requests published at once.
    pub in_flight: usize,
}

impl SweeperConfig {
    pub fn new(name: impl Into<String>) -> Self {
        SweeperConfig {
            name: name.into(),
            interval: Duration::from_secs(1),
            plan_gap: DEFAULT_PLAN_GAP,
            retry_after: Duration::from_secs(5),
            release_timeout: Duration::from_secs(600),
            in_flight: 64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Log(#[from] leasehold_log::Error),
    #[error("loading the partitions: {0}")]
    Load(#[from] leasehold_worker::Error),
    #[error(
        "partition {partition}: the outcome at {seq} says the one before it is at {prev_seq}, but it is at \
         {expected}: the chain of outcomes is broken; the sweeper stops"
    )]
    ChainBroken { partition: u32, seq: u64, prev_seq: u64, expected: u64 },
    #[error("the outcome at {seq} cannot be folded: {detail}; the sweeper stops")]
    Fold { seq: u64, detail: String },
    #[error("the outcome feed ended")]
    FeedEnded,
    #[error("the sweeper's name makes no issuer: {0}")]
    Name(String),
}

impl Error {
    /// True when the log was unreachable for a while: running again later may get over it.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Log(leasehold_log::Error::Unavailable(_)) | Error::FeedEnded => true,
            Error::Load(e) => e.is_transient(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

/// What the sweeper tells Prometheus.
#[derive(Debug, Clone, Default)]
pub struct SweeperMetrics {
    requests: Family<TypeLabel, Counter>,
    releasing_overdue: Gauge,
    applied: Gauge,
}

impl SweeperMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = SweeperMetrics::default();
        registry.register(
            "leasehold_sweeper_requests",
            "Requests this process's sweeper published, by command type",
            metrics.requests.clone(),
        );
        registry.register(
            "leasehold_releasing_overdue",
            "Resources releasing for longer than the release timeout: their agent has not confirmed the destroy",
            metrics.releasing_overdue.clone(),
        );
        registry.register(
            "leasehold_sweeper_applied_seq",
            "The last outcome sequence the sweeper has folded",
            metrics.applied.clone(),
        );
        metrics
    }
}

/// The default [`SweeperConfig::plan_gap`]: short beside any interval a user waits on (a freed address waits for one
/// plan), long enough that a busy log, whose outcomes are ready one after another, is not planned for each of them.
pub const DEFAULT_PLAN_GAP: Duration = Duration::from_millis(20);

/// After this many sends of the same request, the sweeper says so.
const ATTEMPTS_BEFORE_WARNING: u32 = 5;
/// The longest wait between two sends of the same request.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long the sweeper waits before sending a request again after `attempts` sends: `retry_after`, then doubling,
/// up to 5 minutes (never below `retry_after`). Public for simulations of the sweeper's load on the log.
pub fn backoff(retry_after: Duration, attempts: u32) -> Duration {
    retry_after.saturating_mul(1 << attempts.saturating_sub(1).min(16)).min(MAX_BACKOFF.max(retry_after))
}

fn wall_now() -> Timestamp {
    Timestamp(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64)
}

/// How wide the window of a request id is: sweepers that send the same request within one window send the same
/// command. Narrow, so that the id's time (the window's start) is never far behind the send: a partition refuses
/// an id made longer ago than its outcome horizon, which an operator may set as short as a minute.
pub const ID_WINDOW: Duration = Duration::from_secs(1);

/// The command id of the request planned as `key`, sent in the window that `now` falls in: [`ID_WINDOW`], or
/// `retry_after` when shorter (a request sent again must be a new command, or the log would drop it as a
/// duplicate). The same for every sweeper that sends it in that window.
pub fn request_id(key: &str, now: Timestamp, retry_after: Duration) -> CommandId {
    let width = (retry_after.min(ID_WINDOW).as_millis() as u64).max(1);
    let window = now.0 / width * width;
    let a = fnv1a64(key.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let b = fnv1a64(key.as_bytes(), 0x8422_2325_cbf2_9ce4 ^ window);
    let mut entropy = [0u8; 10];
    entropy[..8].copy_from_slice(&a.to_be_bytes());
    entropy[8..].copy_from_slice(&b.to_be_bytes()[..2]);
    CommandId::from_parts(window, entropy)
}

fn fnv1a64(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The sweeper's view of the log: every partition's state and the last outcome folded into it.
struct View {
    states: BTreeMap<u32, PartitionState>,
    chain: BTreeMap<u32, u64>,
    applied: u64,
    /// Adoption answers seen go by, until the child has taken one.
    answers: BTreeMap<ResourceRef, Cascade>,
    /// When each resource was seen turn `releasing` (log time; the load time for those already releasing then).
    releasing_since: HashMap<ResourceRef, Timestamp>,
}

impl View {
    async fn load<L: Log>(log: &L) -> Result<View, Error> {
        let config = leasehold_worker::WriterConfig::default();
        let mut view = View {
            states: BTreeMap::new(),
            chain: BTreeMap::new(),
            applied: 0,
            answers: BTreeMap::new(),
            releasing_since: HashMap::new(),
        };
        let loaded_at = wall_now();
        // Every outcome up to the last one now is folded below; a partition that has none yet gets its first after it.
        let mut last_now = 0;
        for partition in 0..log.partitions() {
            last_now = last_now.max(log.last_outcome_seq(partition).await?);
        }
        for partition in 0..log.partitions() {
            let folded = leasehold_worker::fold_partition(log, partition, 0, &config).await?;
            for resource in folded.state.resources() {
                if matches!(resource.state, ResourceState::Releasing { .. }) {
                    view.releasing_since.insert(resource.reference(), loaded_at);
                }
            }
            view.chain.insert(partition, folded.fence);
            view.states.insert(partition, folded.state);
        }
        // Following starts after the oldest outcome every partition has folded: an empty partition has folded
        // everything up to `last_now`.
        view.applied =
            view.chain.values().map(|fence| if *fence == 0 { last_now } else { *fence }).min().unwrap_or(last_now);
        Ok(view)
    }

    fn apply(&mut self, stored: &StoredOutcome) -> Result<(), Error> {
        let Some(&expected) = self.chain.get(&stored.partition) else {
            return Err(Error::Fold { seq: stored.seq, detail: format!("there is no partition {}", stored.partition) });
        };
        self.applied = self.applied.max(stored.seq);
        if stored.seq <= expected {
            return Ok(());
        }
        if stored.prev_seq != expected {
            return Err(Error::ChainBroken {
                partition: stored.partition,
                seq: stored.seq,
                prev_seq: stored.prev_seq,
                expected,
            });
        }
        let state = self.states.get_mut(&stored.partition).expect("checked above");
        let outcome = leasehold_worker::fold_outcome(state, stored)
            .map_err(|e| Error::Fold { seq: stored.seq, detail: e.to_string() })?;
        self.chain.insert(stored.partition, stored.seq);
        let agent = match &outcome.command.key {
            leasehold_schemas::ids::Key::Agent(agent) => Some(agent.clone()),
            leasehold_schemas::ids::Key::Pool(_) | leasehold_schemas::ids::Key::Placement(_) => None,
        };
        for (position, effect) in outcome.positioned_effects() {
            match effect {
                Effect::ChildAdopted { parent, child, child_source, parent_state } => {
                    let Some(agent) = &agent else { continue };
                    let parent = ResourceRef::new(agent.clone(), *parent);
                    let answer =
                        plan::adoption_answer(stored.partition, position, &parent, child, *child_source, *parent_state);
                    self.answers.insert(child.clone(), answer);
                }
                Effect::ResourceReleasing { resource, .. } => {
                    if let Some(agent) = &agent {
                        self.releasing_since.insert(ResourceRef::new(agent.clone(), *resource), outcome.log_time);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Forgets what no longer matters: answers taken (or whose child left), releases finished.
    fn prune(&mut self) {
        let states = &self.states;
        let partitions = states.values().next().map(PartitionState::partitions).unwrap_or(1);
        let find = |reference: &ResourceRef| {
            let home = leasehold_schemas::subjects::partition_of_agent(&reference.agent, partitions);
            states.get(&home).and_then(|s| s.resource(reference.resource)).filter(|r| r.agent == reference.agent)
        };
        self.answers.retain(|child, _| find(child).is_some_and(|r| r.parent_seen().is_none() && !r.state.has_left()));
        self.releasing_since
            .retain(|reference, _| find(reference).is_some_and(|r| matches!(r.state, ResourceState::Releasing { .. })));
    }
}

/// Runs a sweeper over `log` until `shutdown`. It returns an error only for what needs an operator (a broken
/// chain, an outcome it cannot fold); an unavailable log is waited out.
pub async fn run<L: Log>(
    log: L,
    config: SweeperConfig,
    metrics: SweeperMetrics,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let issuer = Issuer::new(format!("sweeper:{}", config.name)).map_err(|e| Error::Name(e.to_string()))?;
    let mut view = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        view = View::load(&log) => view?,
    };
    info!(sweeper = %config.name, applied = view.applied, "sweeper loaded the partitions");
    let mut follow = log.follow(OutcomeFilter::All, view.applied + 1);
    // `serve` refuses a zero interval; a library caller gets the shortest one instead of a panic.
    let mut ticker = tokio::time::interval(config.interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = Sweep {
        sender: Sender { log: &log, issuer, config: &config, metrics: &metrics, sent: HashMap::new() },
        planned: Vec::new(),
        dirty: true,
        overdue_reported: BTreeSet::new(),
        last_plan: None,
    };
    // When the outcomes folded since the last plan are planned for: right after they are folded, unless the last
    // plan was less than `plan_gap` ago.
    let mut plan_at: Option<tokio::time::Instant> = None;
    loop {
        // Planning comes before the feed: a feed that is always ready (a busy log) must not starve it.
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            // Time alone: deadlines that pass with no outcome to announce them.
            _ = ticker.tick() => {
                if !sweep.run(&mut view, &shutdown).await {
                    return Ok(());
                }
                plan_at = None;
            }
            () = sleep_until(plan_at), if plan_at.is_some() => {
                if !sweep.run(&mut view, &shutdown).await {
                    return Ok(());
                }
                plan_at = None;
            }
            next = follow.next() => {
                let Some(first) = next else { return Err(Error::FeedEnded) };
                view.apply(&first?)?;
                // Whatever else is ready now is folded before planning: a burst is one plan.
                while let Some(Some(next)) = follow.next().now_or_never() {
                    view.apply(&next?)?;
                }
                metrics.applied.set(view.applied as i64);
                sweep.dirty = true;
                if plan_at.is_none() {
                    plan_at = Some(sweep.next_plan_at(config.plan_gap));
                }
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The earliest a plan for arriving outcomes may start: `gap` after the last plan ended, or as long as that plan took
/// when longer, so that planning takes at most about half of the sweeper's time however busy the log.
fn next_plan_at(
    last_plan: Option<(tokio::time::Instant, Duration)>,
    gap: Duration,
    now: tokio::time::Instant,
) -> tokio::time::Instant {
    last_plan.map_or(now, |(ended, took)| (ended + gap.max(took)).max(now))
}

/// The sweeper's planning and sending, between two outcomes folded.
struct Sweep<'a, L: Log> {
    sender: Sender<'a, L>,
    planned: Vec<Planned>,
    /// Outcomes were folded since the last plan.
    dirty: bool,
    overdue_reported: BTreeSet<ResourceRef>,
    /// When the last plan ended, and how long it took.
    last_plan: Option<(tokio::time::Instant, Duration)>,
}

impl<L: Log> Sweep<'_, L> {
    fn next_plan_at(&self, gap: Duration) -> tokio::time::Instant {
        next_plan_at(self.last_plan, gap, tokio::time::Instant::now())
    }

    /// Plans again if anything was folded since the last plan, then sends what is due. False when `shutdown` came
    /// while sending.
    async fn run(&mut self, view: &mut View, shutdown: &CancellationToken) -> bool {
        if self.dirty {
            let started = tokio::time::Instant::now();
            view.prune();
            self.planned = plan::plan(&view.states, &view.answers);
            self.dirty = false;
            self.last_plan = Some((tokio::time::Instant::now(), started.elapsed()));
        }
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return false,
            () = self.sender.send_due(&self.planned) => {}
        }
        report_overdue(view, self.sender.config, self.sender.metrics, &mut self.overdue_reported);
        true
    }
}

/// Counts the resources releasing past the release timeout, and says so once for each.
fn report_overdue(view: &View, config: &SweeperConfig, metrics: &SweeperMetrics, reported: &mut BTreeSet<ResourceRef>) {
    let limit = leasehold_schemas::ids::Millis(config.release_timeout.as_millis() as u64);
    let now = wall_now();
    let overdue: BTreeSet<&ResourceRef> = view
        .releasing_since
        .iter()
        .filter(|(_, since)| since.saturating_add(limit) <= now)
        .map(|(reference, _)| reference)
        .collect();
    metrics.releasing_overdue.set(overdue.len() as i64);
    for reference in &overdue {
        if reported.insert((*reference).clone()) {
            let since = view.releasing_since[*reference];
            warn!(
                target: "leasehold::alert",
                resource = %reference,
                %since,
                "ALERT: resource {reference} has been releasing since {since}, longer than the release timeout \
                 ({:?}); its agent has not confirmed the destroy (it keeps retrying). Check the agent and the machine",
                config.release_timeout
            );
        }
    }
    reported.retain(|reference| overdue.contains(reference));
}

struct Sender<'a, L: Log> {
    log: &'a L,
    issuer: Issuer,
    config: &'a SweeperConfig,
    metrics: &'a SweeperMetrics,
    /// When each planned item was last sent, and how many times it has been.
    sent: HashMap<String, (Instant, u32)>,
}

impl<L: Log> Sender<'_, L> {
    /// Publishes every planned request that is due by this process's clock and was not sent within
    /// `retry_after`. The clock only says when to ask: the partition decides by the log's.
    async fn send_due(&mut self, planned: &[Planned]) {
        let now = wall_now();
        let retry_after = self.config.retry_after;
        let keys: std::collections::HashSet<&str> = planned.iter().map(|p| p.key.as_str()).collect();
        self.sent.retain(|key, _| keys.contains(key.as_str()));
        let due: Vec<&Planned> = planned
            .iter()
            .filter(|p| p.due.is_none_or(|at| at <= now))
            .filter(|p| self.sent.get(&p.key).is_none_or(|(at, n)| at.elapsed() >= backoff(retry_after, *n)))
            .collect();
        if due.is_empty() {
            return;
        }
        debug!(n = due.len(), "sweeper: publishing due requests");
        let sends: Vec<_> = due
            .iter()
            .map(|item| publish(self.log.clone(), self.issuer.clone(), (*item).clone(), now, retry_after))
            .collect();
        let results: Vec<bool> = futures::stream::iter(sends).buffer_unordered(self.config.in_flight).collect().await;
        let at = Instant::now();
        for (item, published) in due.iter().zip(results) {
            // Sent or not, it is tried again only after `retry_after`, and then less and less often: an
            // unavailable log is not hammered, and a request refused for good does not fill the log.
            let sent = self.sent.entry(item.key.clone()).or_insert((at, 0));
            *sent = (at, sent.1.saturating_add(1));
            if sent.1 == ATTEMPTS_BEFORE_WARNING {
                warn!(
                    request = %item.key,
                    attempts = sent.1,
                    "a sweeper request is still wanted after {} attempts; it is asked again less often",
                    sent.1
                );
            }
            if published {
                self.metrics.requests.get_or_create(&TypeLabel { r#type: item.command.type_name() }).inc();
            }
        }
    }
}

/// Publishes one request, its command id derived from its key and the window `now` falls in.
async fn publish<L: Log>(log: L, issuer: Issuer, item: Planned, now: Timestamp, retry_after: Duration) -> bool {
    let id = request_id(&item.key, now, retry_after);
    let envelope = Envelope::new(id, issuer, now, item.command);
    let payload = match codec::encode_command(&envelope) {
        Ok(payload) => payload,
        Err(e) => {
            warn!(request = %item.key, error = %e, "a sweeper request does not encode");
            return false;
        }
    };
    let subject = ingress_subject_of(&envelope.body);
    match log.publish_command(&subject, &id.to_string(), payload.into()).await {
        Ok(_) => true,
        Err(e) => {
            warn!(request = %item.key, error = %e, "publishing a sweeper request failed; it is tried again later");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_asked_again_and_again_is_asked_less_often() {
        let retry = Duration::from_secs(5);
        assert_eq!(backoff(retry, 1), retry);
        assert_eq!(backoff(retry, 2), retry * 2);
        assert_eq!(backoff(retry, 4), retry * 8);
        assert_eq!(backoff(retry, 40), MAX_BACKOFF);
        assert_eq!(backoff(Duration::from_secs(900), 3), Duration::from_secs(900), "never below retry_after");
    }

    #[test]
    fn outcomes_are_planned_for_at_once_unless_a_plan_just_ran() {
        let now = tokio::time::Instant::now();
        let gap = Duration::from_millis(20);
        let ms = Duration::from_millis;
        assert_eq!(next_plan_at(None, gap, now), now, "the first plan at once");
        assert_eq!(next_plan_at(Some((now - ms(50), ms(1))), gap, now), now, "the last plan is older than the gap");
        assert_eq!(next_plan_at(Some((now - ms(5), ms(1))), gap, now), now + ms(15), "the gap after the last plan");
        assert_eq!(next_plan_at(Some((now - ms(5), ms(300))), gap, now), now + ms(295), "a slow plan spaces them");
    }
}
