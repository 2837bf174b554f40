//! The agent process: one task that folds the agent's outcome subject, runs driver calls and sync passes, and one
//! publisher task through which every command leaves, in order.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_log::{Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::command::{
    DriverStatus, FailureKind, GarbageReport, HealthResult, Heartbeat, MAX_REPORT_HANDLES, Register, ReportCreated,
    ReportDestroyed, ReportFailure, ResyncChunk, SyncReport,
};
use leasehold_schemas::outcome::{Decision, Outcome};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{
    AgentName, Command, CommandClass, CommandId, Envelope, Issuer, Position, ResourceId, Timestamp, Uuid, codec,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior, sleep_until, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::driver::{CreateOrder, Driver, DriverError, Health, Listed, Spec};
use crate::model::{Model, Op, Signal, View};

/// Handles per resync chunk: well under [`MAX_REPORT_HANDLES`], so a chunk is about 70 KiB.
const CHUNK_HANDLES: usize = 4096;
/// Details sent to the writer are cut to this many bytes (it keeps at most 1 KiB).
const MAX_DETAIL_BYTES: usize = 1000;
/// Commands waiting for the publisher.
const OUTGOING_CAPACITY: usize = 256;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The default creation grace for unknown handles, as Nomad's dangling-container reconciler uses.
pub const GC_GRACE: Duration = Duration::from_secs(300);
/// A garbage report the writer answered without an order (a dry run; a handle it took for a live resource) is sent
/// again, unchanged, at most this often: a policy switched from dry run to destroy reaches handles reported before.
const GARBAGE_RECHECK: Duration = Duration::from_secs(3600);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Settings of one agent process.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub name: AgentName,
    /// A sync report every this long, ± 20 %.
    pub sync_interval: Duration,
    /// At most this many driver calls at once (creates, destroys, checks).
    pub max_in_flight: usize,
    /// A driver call that takes longer is given up and tried again at a later pass.
    pub call_timeout: Duration,
    /// The longest wait between heartbeats. The agent beats faster when its effective `stall_after` asks for it:
    /// at most a quarter of it (see [`heartbeat_every`]).
    pub heartbeat_interval: Duration,
    /// "My disk was wiped": the first report may lose everything without tripping the breaker.
    pub wiped: bool,
    /// The agent's own settings; `None` (the default): it follows its partition's policy.
    pub settings: Option<AgentSettings>,
    /// On shutdown, driver calls still running and commands not yet published get this long.
    pub shutdown_grace: Duration,
    /// A handle on the machine of no resource the agent knows is reported as garbage only once it has been seen this
    /// long (something may be making it right now: a create racing the listing, another tool). Handles of resources
    /// that left are reported at once.
    pub gc_grace: Duration,
    /// `--gc dry-run`: garbage is reported as a dry run (recorded, never ordered destroyed).
    pub gc_dry_run: bool,
    /// Status and "sync now" for whoever started the agent (a clone of the config shares it).
    pub control: AgentControl,
    /// What placement may select it by (`zone=a`), declared at each registration.
    pub labels: BTreeMap<String, String>,
    /// How many resources of each kind it takes (`container=50`), declared at each registration.
    pub capacity: BTreeMap<String, u32>,
}

impl AgentConfig {
    /// The defaults: sync every 30 s, 5 calls at once, 60 s per call, a heartbeat every 10 s.
    pub fn new(name: AgentName) -> Self {
        AgentConfig {
            name,
            sync_interval: Duration::from_secs(30),
            max_in_flight: 5,
            call_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(10),
            wiped: false,
            settings: None,
            shutdown_grace: Duration::from_secs(5),
            gc_grace: GC_GRACE,
            gc_dry_run: false,
            control: AgentControl::default(),
            labels: BTreeMap::new(),
            capacity: BTreeMap::new(),
        }
    }
}

/// What the agent has done so far, for tests, the lead's `serve` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// This process's incarnation and the epoch its registration got (`None` until it is folded).
    pub incarnation: Option<Uuid>,
    pub epoch: Option<Position>,
    /// The highest position of its subject applied.
    pub watermark: Position,
    /// The log sequence of the last outcome folded.
    pub last_seq: u64,
    /// Non-terminal resources it knows of.
    pub n_resources: usize,
    /// Driver calls running.
    pub n_in_flight: usize,
    pub creates: u64,
    pub create_failures: u64,
    pub destroys: u64,
    /// Garbage handles it destroyed (each ordered by the log).
    pub garbage: u64,
    /// Garbage reports published (each chunk counts).
    pub garbage_reports: u64,
    /// Handles of lost resources quarantined on this machine: never touched.
    pub quarantined: usize,
    /// Destroys reported at once (`agent.report-destroyed`).
    pub destroys_reported: u64,
    /// `Some(why)` while the driver cannot list.
    pub driver_unavailable: Option<String>,
    /// Why the agent stopped, once it stopped on an error.
    pub stopped: Option<String>,
    pub health_checks: u64,
    /// Sync passes whose listing came back.
    pub sync_passes: u64,
    /// Sync passes that found nothing new since the last report (same watermark, same holdings, nothing to name):
    /// no report is sent for them.
    pub quiet_passes: u64,
    /// Sync reports published, and the observation number of the last one.
    pub reports: u64,
    pub last_report_obs: u64,
    /// Full resyncs sent (each in one or more chunks).
    pub resyncs: u64,
    /// The last observation number published (reports, chunks, created, failures, health results).
    pub last_obs: u64,
}

/// A cheap handle on a running agent: read its status, wait for it to change, ask for a sync pass now.
#[derive(Debug, Clone)]
pub struct AgentControl {
    inner: Arc<ControlInner>,
}

#[derive(Debug)]
struct ControlInner {
    status: watch::Sender<AgentStatus>,
    sync_now: Notify,
}

impl Default for AgentControl {
    fn default() -> Self {
        AgentControl {
            inner: Arc::new(ControlInner {
                status: watch::Sender::new(AgentStatus::default()),
                sync_now: Notify::new(),
            }),
        }
    }
}

impl AgentControl {
    pub fn new() -> Self {
        AgentControl::default()
    }

    /// Starts a sync pass as soon as possible (after the one running, if any): listing, report, garbage.
    pub fn sync_now(&self) {
        self.inner.sync_now.notify_one();
    }

    pub fn status(&self) -> AgentStatus {
        self.inner.status.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<AgentStatus> {
        self.inner.status.subscribe()
    }

    /// Waits until `done` holds for the status, and returns that status. Wrap it in a timeout.
    pub async fn wait_for(&self, mut done: impl FnMut(&AgentStatus) -> bool) -> AgentStatus {
        let mut status = self.subscribe();
        let seen = status.wait_for(|s| done(s)).await.expect("the control holds the sender");
        seen.clone()
    }

    fn update(&self, change: impl FnOnce(&mut AgentStatus)) {
        self.inner.status.send_modify(change);
    }
}

/// Why an agent stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("agent {agent}: its registration was rejected: {message}")]
    RegistrationRejected { agent: AgentName, message: String },
    #[error(
        "agent {agent}: another incarnation ({incarnation}) registered at {epoch}; this process stops (two \
         processes must not run as one agent)"
    )]
    Superseded { agent: AgentName, incarnation: Uuid, epoch: Position },
    #[error("agent {agent}: the outcome at log sequence {seq} cannot be read: {detail}; the agent stops")]
    Undecodable { agent: AgentName, seq: u64, detail: String },
    #[error("agent {agent}: the log refused: {error}")]
    Log { agent: AgentName, error: leasehold_log::Error },
    /// The driver cannot reach the machine's resources (its root cannot be made, opened or read): the machine's
    /// trouble, not a misconfiguration of the process.
    #[error("agent {agent}: its driver cannot take the machine's resources: {detail}")]
    Driver { agent: AgentName, detail: String },
    /// The machine's resources are another agent's (or another process of this one holds them): two agents must
    /// never share them, since each destroys what the log orders for its own.
    #[error("agent {agent}: its driver refuses the machine's resources: {detail}")]
    Refused { agent: AgentName, detail: String },
}

/// Runs the agent until `shutdown`: registers an incarnation, follows its outcome subject from the start, makes
/// and destroys what it is told to, destroys garbage, reports every `sync_interval`, answers resync requests and
/// health checks, and heartbeats. Log errors are retried; it stops with an error only when it cannot go on as this
/// incarnation (its registration refused, another incarnation registered, an outcome it cannot read).
pub async fn run<L: Log, D: Driver>(
    log: L,
    driver: D,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    // Before anything is registered or destroyed: the driver's resources are this agent's alone.
    if let Err(e) = driver.open(&config.name).await {
        let error = match e {
            DriverError::Refused(detail) => Error::Refused { agent: config.name.clone(), detail },
            other => Error::Driver { agent: config.name.clone(), detail: other.to_string() },
        };
        error!(agent = %config.name, error = %error, "agent stopped");
        let stopped = error.to_string();
        config.control.update(|s| s.stopped = Some(stopped));
        return Err(error);
    }
    let (outgoing, queue) = mpsc::channel(OUTGOING_CAPACITY);
    let publisher = tokio::spawn(publish_all(log.clone(), config.clone(), queue));
    let mut agent = Agent {
        partition: partition_of_agent(&config.name, log.partitions()),
        log,
        driver: Arc::new(driver),
        config,
        shutdown,
        outgoing,
        drain_by: None,
        model: Model::default(),
        incarnation: Uuid::nil(),
        register_id: None,
        epoch: None,
        last_seq: 0,
        running: BTreeMap::new(),
        calls: JoinSet::new(),
        task_of: HashMap::new(),
        ready: BTreeSet::new(),
        blocked: BTreeSet::new(),
        garbage: BTreeMap::new(),
        garbage_seen: BTreeMap::new(),
        garbage_reported: None,
        destroy_reported: BTreeMap::new(),
        blocked_reported: BTreeMap::new(),
        recent_failures: Vec::new(),
        settings: leasehold_schemas::settings::AgentSettings::DEFAULT,
        driver_down: None,
        driver_status_sent: None,
        listing: false,
        started_while_listing: BTreeSet::new(),
        sync_again: false,
        resync_wanted: false,
        quiet: None,
    };
    let result = agent.run(publisher).await;
    if let Err(e) = &result {
        error!(agent = %agent.config.name, error = %e, "agent stopped");
        let stopped = e.to_string();
        agent.config.control.update(|s| s.stopped = Some(stopped));
    }
    result
}

/// What the main task asks the publisher to send. The publisher fills in the epoch and observation number, so
/// they reach the log in order.
#[derive(Debug)]
enum Outgoing {
    Register {
        command_id: CommandId,
        register: Register,
    },
    /// Observations from now on carry this epoch, numbered from 1; heartbeats go out every `heartbeat`.
    Epoch {
        epoch: Position,
        heartbeat: Duration,
    },
    Created {
        resource: ResourceId,
        native_id: Option<String>,
    },
    CreateFailed {
        resource: ResourceId,
        detail: String,
    },
    /// The listing found it failed (a container that exited).
    Unhealthy {
        resource: ResourceId,
        detail: String,
    },
    /// Its destroy cannot finish while something else uses it.
    DestroyBlocked {
        resource: ResourceId,
        detail: String,
    },
    Health {
        resource: ResourceId,
        request: Position,
        health: Health,
    },
    Sync(SyncReport),
    Chunk(ResyncChunk),
    Garbage(GarbageReport),
    Destroyed {
        resource: ResourceId,
        ordered: Position,
    },
    DriverStatus {
        available: bool,
        detail: String,
    },
}

/// Why a driver call did not succeed.
#[derive(Debug)]
enum CallError {
    Driver(DriverError),
    TimedOut(Duration),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Driver(e) => write!(f, "{e}"),
            CallError::TimedOut(limit) => write!(f, "no answer within {limit:?}"),
        }
    }
}

/// A finished driver call.
#[derive(Debug)]
enum Done {
    Created {
        id: ResourceId,
        result: Result<Option<String>, CallError>,
    },
    /// `garbage`: the position of the log's order, for a garbage handle.
    Destroyed {
        id: ResourceId,
        garbage: Option<Position>,
        result: Result<(), CallError>,
    },
    Checked {
        id: ResourceId,
        request: Position,
        result: Result<Health, CallError>,
    },
    Listed {
        view: View,
        resync: bool,
        result: Result<Vec<Listed>, CallError>,
    },
}

async fn call<T>(limit: Duration, work: impl Future<Output = Result<T, DriverError>>) -> Result<T, CallError> {
    match timeout(limit, work).await {
        Ok(result) => result.map_err(CallError::Driver),
        Err(_) => Err(CallError::TimedOut(limit)),
    }
}

struct Agent<L, D> {
    log: L,
    driver: Arc<D>,
    config: AgentConfig,
    partition: u32,
    shutdown: CancellationToken,
    outgoing: mpsc::Sender<Outgoing>,
    /// Set once shutdown began: what is still sent must be queued by then.
    drain_by: Option<Instant>,
    model: Model,
    incarnation: Uuid,
    register_id: Option<CommandId>,
    epoch: Option<Position>,
    last_seq: u64,
    /// Driver calls running, one per resource at most.
    running: BTreeMap<ResourceId, Op>,
    calls: JoinSet<Done>,
    /// The resource of each call task (`None`: the listing).
    task_of: HashMap<tokio::task::Id, Option<ResourceId>>,
    /// Resources that may need a call.
    ready: BTreeSet<ResourceId>,
    /// Resources whose last call failed: tried again at the next pass.
    blocked: BTreeSet<ResourceId>,
    /// Garbage handles the log ordered destroyed and the last listing found, to destroy (with the order's position).
    garbage: BTreeMap<ResourceId, Position>,
    /// Handles of no resource the model knows, by when a listing first showed them (the creation grace).
    garbage_seen: BTreeMap<ResourceId, Instant>,
    /// The garbage handles last reported and when: the same set is not reported again (but after a long while).
    garbage_reported: Option<(BTreeSet<ResourceId>, Instant)>,
    /// Destroys reported at once, by handle and the order they answer, until the log records them.
    destroy_reported: BTreeMap<ResourceId, Position>,
    /// Why a destroy could not finish (something else uses the resource), as last reported: each reason once.
    blocked_reported: BTreeMap<ResourceId, String>,
    /// When each failure reported one by one within the breaker's window was found, and of what.
    recent_failures: Vec<(Instant, ResourceId)>,
    /// The agent's effective settings at its registration (the loss breaker's thresholds judge a mass failure).
    settings: leasehold_schemas::settings::AgentSettings,
    /// What this process saw of its driver at its last listing: `Some(why)` when it could not list.
    driver_down: Option<String>,
    /// The driver status last sent and not yet recorded (so it is not sent again meanwhile).
    driver_status_sent: Option<Option<String>>,
    listing: bool,
    /// Creates and destroys started while the listing runs, after its snapshot: the report names them in flight.
    /// Otherwise a create started and finished meanwhile (its `report-created` sent before the report) would be
    /// absent from both the snapshot's calls and the listing, and the report would count one handle fewer than
    /// the writer, which already saw it made.
    started_while_listing: BTreeSet<ResourceId>,
    sync_again: bool,
    resync_wanted: bool,
    /// The last report that named nothing: (epoch, last material position, count, digest). The same again says
    /// nothing new, so it is not sent (DESIGN section 3: the log does not grow with idle agents).
    quiet: Option<(Position, Position, u64, leasehold_schemas::command::HandleDigest)>,
}

impl<L: Log, D: Driver> Agent<L, D> {
    async fn run(&mut self, publisher: Publisher) -> Result<(), Error> {
        let mut publisher = Some(publisher);
        self.register().await;
        let filter = OutcomeFilter::Key { partition: self.partition, key: self.config.name.as_str().to_owned() };
        let mut follow: Option<BoxStream<'static, Result<StoredOutcome, leasehold_log::Error>>> =
            Some(self.log.follow(filter.clone(), 1));
        let mut backoff = FIRST_BACKOFF;
        let mut resume_at = Instant::now();
        let next_pass = tokio::time::sleep(jittered(self.config.sync_interval));
        tokio::pin!(next_pass);
        let control = self.config.control.clone();
        let result = loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break Ok(()),
                stopped = join_publisher(&mut publisher) => {
                    publisher = None;
                    break stopped;
                }
                item = next_item(&mut follow), if follow.is_some() => match item {
                    Some(Ok(stored)) => {
                        backoff = FIRST_BACKOFF;
                        if let Err(e) = self.fold(stored).await {
                            break Err(e);
                        }
                    }
                    Some(Err(leasehold_log::Error::Refused(reason))) => {
                        let error = leasehold_log::Error::Refused(reason);
                        break Err(Error::Log { agent: self.config.name.clone(), error });
                    }
                    other => {
                        let why = other.map_or_else(|| "the stream ended".to_owned(), |e| format!("{:?}", e.err()));
                        warn!(agent = %self.config.name, after = self.last_seq, why, ?backoff, "following the log failed; following again");
                        follow = None;
                        resume_at = Instant::now() + backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                },
                _ = sleep_until(resume_at), if follow.is_none() => {
                    follow = Some(self.log.follow(filter.clone(), self.last_seq + 1));
                }
                Some(joined) = self.calls.join_next_with_id(), if !self.calls.is_empty() => self.joined(joined).await,
                _ = &mut next_pass => {
                    next_pass.as_mut().reset(Instant::now() + jittered(self.config.sync_interval));
                    self.start_pass();
                }
                _ = control.inner.sync_now.notified() => self.start_pass(),
            }
            self.pump();
        };
        self.drain(publisher).await;
        result
    }

    /// Registers a new incarnation; its epoch is learnt from the subject.
    async fn register(&mut self) {
        self.incarnation = Uuid::now_v7();
        self.epoch = None;
        let command_id = CommandId::generate();
        self.register_id = Some(command_id);
        let register = Register {
            agent: self.config.name.clone(),
            incarnation: self.incarnation,
            wiped: self.config.wiped,
            settings: self.config.settings.clone(),
            labels: self.config.labels.clone(),
            capacity: self.config.capacity.clone(),
        };
        info!(agent = %self.config.name, incarnation = %self.incarnation, wiped = self.config.wiped, "registering");
        let incarnation = self.incarnation;
        self.config.control.update(|s| {
            s.incarnation = Some(incarnation);
            s.epoch = None;
        });
        self.send(Outgoing::Register { command_id, register }).await;
    }

    /// Queues a command for the publisher; gives up when the agent stops before it is queued.
    async fn send(&self, message: Outgoing) {
        let queued = match self.drain_by {
            None => tokio::select! {
                sent = self.outgoing.send(message) => sent.is_ok(),
                _ = self.shutdown.cancelled() => false,
            },
            Some(deadline) => matches!(timeout_at(deadline, self.outgoing.send(message)).await, Ok(Ok(()))),
        };
        if !queued {
            debug!(agent = %self.config.name, "stopping: a command was not queued");
        }
    }

    async fn fold(&mut self, stored: StoredOutcome) -> Result<(), Error> {
        self.last_seq = stored.seq;
        let outcome = codec::decode_outcome(&stored.payload).map_err(|e| Error::Undecodable {
            agent: self.config.name.clone(),
            seq: stored.seq,
            detail: e.to_string(),
        })?;
        self.note_answer(&outcome)?;
        let ours = outcome.command.class == CommandClass::Agent
            && outcome.command.issuer.as_str() == self.config.name.as_str();
        if ours && outcome.command.type_name == "agent.driver-status" {
            // Recorded or refused: either way what the log holds is in the model now; send again if it differs.
            self.driver_status_sent = None;
        }
        let mut signals = Vec::new();
        self.model.apply(&outcome, &mut signals);
        for signal in signals {
            match signal {
                Signal::Work(id) => {
                    self.ready.insert(id);
                }
                Signal::Registered { incarnation, epoch, retired, settings } if incarnation == self.incarnation => {
                    let stall_after = settings.stall_after;
                    let heartbeat = heartbeat_every(stall_after, self.config.heartbeat_interval);
                    self.settings = settings;
                    info!(agent = %self.config.name, %epoch, retired, resources = self.model.len(), %stall_after, ?heartbeat, "registered and caught up");
                    self.epoch = Some(epoch);
                    self.config.control.update(|s| s.epoch = Some(epoch));
                    self.send(Outgoing::Epoch { epoch, heartbeat }).await;
                    self.send_driver_status().await;
                    self.start_pass();
                }
                Signal::Registered { incarnation, epoch, .. } => {
                    if self.epoch.is_some() {
                        return Err(Error::Superseded { agent: self.config.name.clone(), incarnation, epoch });
                    }
                }
                Signal::Gone => {
                    if self.epoch.is_some() {
                        warn!(agent = %self.config.name, "the agent was declared gone; registering a new incarnation");
                        self.register().await;
                    }
                }
                Signal::ResyncRequested { at } => {
                    if self.epoch.is_some_and(|epoch| at > epoch) {
                        info!(agent = %self.config.name, %at, "a full resync was asked for");
                        self.resync_wanted = true;
                        self.start_pass();
                    }
                }
                Signal::Left { resource, how } => {
                    self.blocked_reported.remove(&resource);
                    if how == "resource-lost" {
                        warn!(agent = %self.config.name, %resource, "resource lost");
                    } else {
                        info!(agent = %self.config.name, %resource, how, "resource left");
                    }
                }
                Signal::GarbageOrdered { handle, at } => {
                    if self.config.gc_dry_run {
                        warn!(
                            agent = %self.config.name,
                            %handle,
                            order = %at,
                            "the log ordered a garbage handle destroyed; this agent runs --gc dry-run and leaves it (the \
                             order waits for an agent run with --gc destroy)"
                        );
                    } else {
                        info!(agent = %self.config.name, %handle, order = %at, "the log ordered a garbage handle destroyed");
                    }
                    self.garbage.insert(handle, at);
                }
                Signal::Quarantined { handle } => {
                    warn!(
                        agent = %self.config.name,
                        %handle,
                        "the handle of a lost resource is back: quarantined (untouched until the resource is released)"
                    );
                    self.garbage.remove(&handle);
                }
            }
        }
        // A destroy reported at once is settled once the log has answered it (the resource left, the order is done).
        let model = &self.model;
        self.destroy_reported.retain(|id, at| {
            model.get(*id).is_some_and(|t| t.releasing == Some(*at)) || model.garbage_order(*id) == Some(*at)
        });
        let (watermark, n_resources, last_seq) = (self.model.watermark(), self.model.len(), self.last_seq);
        let quarantined = self.model.n_quarantined();
        self.config.control.update(|s| {
            s.watermark = watermark;
            s.n_resources = n_resources;
            s.last_seq = last_seq;
            s.quarantined = quarantined;
        });
        if ours && outcome.command.type_name == "agent.driver-status" {
            self.send_driver_status().await;
        }
        Ok(())
    }

    /// Says what this process sees of its driver when the log records something else (and it was not just said).
    async fn send_driver_status(&mut self) {
        if self.epoch.is_none() {
            return;
        }
        let seen = self.driver_down.clone();
        if seen.as_deref() == self.model.driver_recorded() || self.driver_status_sent.as_ref() == Some(&seen) {
            return;
        }
        match &seen {
            Some(why) => warn!(agent = %self.config.name, why, "the driver cannot list: recording it unavailable"),
            None => info!(agent = %self.config.name, "the driver lists again: recording it available"),
        }
        self.driver_status_sent = Some(seen.clone());
        let (available, detail) = match seen {
            Some(why) => (false, why),
            None => (true, String::new()),
        };
        self.send(Outgoing::DriverStatus { available, detail }).await;
    }

    /// Logs what became of this agent's own commands; a refused registration of this incarnation stops it.
    fn note_answer(&self, outcome: &Outcome) -> Result<(), Error> {
        let summary = &outcome.command;
        if summary.class != CommandClass::Agent || summary.issuer.as_str() != self.config.name.as_str() {
            return Ok(());
        }
        match &outcome.decision {
            Decision::Rejected(rejection) if Some(summary.id) == self.register_id => {
                Err(Error::RegistrationRejected { agent: self.config.name.clone(), message: rejection.to_string() })
            }
            // History of earlier incarnations, read while catching up.
            _ if self.epoch.is_none() => Ok(()),
            Decision::Rejected(rejection) => {
                warn!(agent = %self.config.name, command = summary.type_name, %rejection, "observation refused");
                Ok(())
            }
            Decision::Accepted { effects, .. } if summary.type_name == "agent.sync" && outcome.part == 0 => {
                let n = |name: &str| effects.iter().filter(|e| e.name() == name).count();
                info!(
                    agent = %self.config.name,
                    activated = n("resource-activated"),
                    destroyed = n("resource-destroyed"),
                    lost = n("resource-lost"),
                    suspect = n("agent-suspect") > 0,
                    resync = n("resync-requested") > 0,
                    continues = outcome.continues(),
                    "sync report decided"
                );
                Ok(())
            }
            Decision::Accepted { .. } => Ok(()),
        }
    }

    /// Starts as many calls as `max_in_flight` allows: the model's work first, then garbage.
    fn pump(&mut self) {
        if self.epoch.is_none() {
            // Not caught up yet: nothing is made or destroyed before the agent has read what it holds.
            return;
        }
        while self.running.len() < self.config.max_in_flight.max(1) {
            if let Some(id) = self.ready.pop_first() {
                if self.running.contains_key(&id) || self.blocked.contains(&id) {
                    continue;
                }
                let Some(tracked) = self.model.get(id) else { continue };
                if let Some(op) = tracked.next_op() {
                    let mut spec = tracked.spec.clone();
                    spec.order =
                        self.epoch.zip(tracked.create_ordered).map(|(epoch, position)| CreateOrder { epoch, position });
                    self.spawn_op(id, op, spec);
                }
            } else if let Some((id, at)) = self.garbage.pop_first() {
                // Only what the log ordered, as it still stands: never a live resource or a quarantined handle. A dry
                // run destroys nothing, not even what was ordered before it began: the order waits for an agent that
                // runs `--gc destroy`.
                let ordered = self.model.garbage_order(id) == Some(at);
                if self.config.gc_dry_run {
                    debug!(agent = %self.config.name, resource = %id, order = %at, "dry run: a garbage order is left pending");
                } else if ordered
                    && !self.model.contains(id)
                    && !self.model.is_quarantined(id)
                    && !self.running.contains_key(&id)
                    && self.destroy_reported.get(&id) != Some(&at)
                {
                    info!(agent = %self.config.name, resource = %id, order = %at, "destroying garbage, as the log ordered");
                    self.spawn_op(id, Op::Garbage(at), Spec::default());
                }
            } else {
                break;
            }
        }
        let n_in_flight = self.running.len();
        self.config.control.update(|s| s.n_in_flight = n_in_flight);
    }

    fn spawn_op(&mut self, id: ResourceId, op: Op, spec: Spec) {
        let driver = self.driver.clone();
        let limit = self.config.call_timeout;
        let task = match op {
            Op::Create => self.calls.spawn(async move {
                let result = call(limit, driver.create(id, &spec)).await;
                Done::Created { id, result }
            }),
            Op::Destroy | Op::Garbage(_) => self.calls.spawn(async move {
                let result = call(limit, driver.destroy(id)).await;
                let garbage = match op {
                    Op::Garbage(at) => Some(at),
                    _ => None,
                };
                Done::Destroyed { id, garbage, result }
            }),
            Op::Check(request) => self.calls.spawn(async move {
                let result = call(limit, driver.check(id)).await;
                Done::Checked { id, request, result }
            }),
        };
        self.task_of.insert(task.id(), Some(id));
        self.running.insert(id, op);
        if self.listing && matches!(op, Op::Create | Op::Destroy) {
            self.started_while_listing.insert(id);
        }
    }

    /// A sync pass: snapshot first (watermark, calls running, model), then the listing (in a task), then the
    /// report from both (in [`Agent::listed`]). A pass asked for while one runs starts when it ends.
    fn start_pass(&mut self) {
        if self.epoch.is_none() {
            return;
        }
        if self.listing {
            self.sync_again = true;
            return;
        }
        self.ready.append(&mut self.blocked);
        let resync = std::mem::take(&mut self.resync_wanted);
        let running = &self.running;
        let view = self.model.view(|id| matches!(running.get(&id), Some(Op::Create | Op::Destroy)));
        let driver = self.driver.clone();
        let limit = self.config.call_timeout;
        let task = self.calls.spawn(async move {
            let result = call(limit, driver.list()).await;
            Done::Listed { view, resync, result }
        });
        self.task_of.insert(task.id(), None);
        self.listing = true;
    }

    async fn joined(&mut self, joined: Result<(tokio::task::Id, Done), tokio::task::JoinError>) {
        match joined {
            Ok((task, done)) => {
                self.task_of.remove(&task);
                self.finished(done).await;
            }
            Err(e) => {
                error!(agent = %self.config.name, error = %e, "a driver call panicked; it is tried again at the next pass");
                match self.task_of.remove(&e.id()) {
                    Some(Some(id)) => {
                        self.running.remove(&id);
                        self.blocked.insert(id);
                    }
                    Some(None) => {
                        self.listing = false;
                        self.started_while_listing.clear();
                    }
                    None => {}
                }
            }
        }
    }

    async fn finished(&mut self, done: Done) {
        let agent = self.config.name.clone();
        let live = self.epoch.is_some();
        match done {
            Done::Created { id, result } => {
                self.running.remove(&id);
                self.ready.insert(id);
                match result {
                    Ok(native_id) => {
                        self.config.control.update(|s| s.creates += 1);
                        let Some(tracked) = self.model.get_mut(id) else {
                            info!(%agent, resource = %id, "created a resource that left meanwhile; it is garbage now");
                            return;
                        };
                        tracked.create_done = true;
                        info!(%agent, resource = %id, native_id = native_id.as_deref().unwrap_or("-"), "created");
                        if live {
                            self.send(Outgoing::Created { resource: id, native_id }).await;
                        }
                    }
                    Err(CallError::Driver(DriverError::CreateFailed(detail))) => {
                        self.config.control.update(|s| s.create_failures += 1);
                        warn!(%agent, resource = %id, detail, "create failed for good");
                        if let Some(tracked) = self.model.get_mut(id) {
                            tracked.create_done = true;
                            if live {
                                self.send(Outgoing::CreateFailed { resource: id, detail }).await;
                            }
                        }
                    }
                    Err(e) => {
                        warn!(%agent, resource = %id, error = %e, "create did not finish; tried again at the next pass");
                        self.blocked.insert(id);
                    }
                }
            }
            Done::Destroyed { id, garbage, result } => {
                self.running.remove(&id);
                self.ready.insert(id);
                match (result, garbage) {
                    (Ok(()), Some(ordered)) => {
                        self.config.control.update(|s| s.garbage += 1);
                        info!(%agent, resource = %id, order = %ordered, "destroyed garbage, as the log ordered");
                        self.report_destroyed(id, ordered).await;
                    }
                    (Ok(()), None) => {
                        self.config.control.update(|s| s.destroys += 1);
                        info!(%agent, resource = %id, "destroyed");
                        let ordered = self.model.get_mut(id).and_then(|tracked| {
                            tracked.destroy_done = true;
                            tracked.releasing
                        });
                        // At once, as a create is reported: its claims go back without waiting for a sync report.
                        if let Some(ordered) = ordered {
                            self.report_destroyed(id, ordered).await;
                        }
                    }
                    (Err(CallError::Driver(DriverError::InUse(detail))), None) => {
                        warn!(%agent, resource = %id, detail, "destroy blocked: something else uses it; tried again at the next pass");
                        self.blocked.insert(id);
                        let releasing = self.model.get(id).is_some_and(|t| t.releasing.is_some());
                        if live && releasing && self.blocked_reported.get(&id) != Some(&detail) {
                            self.blocked_reported.insert(id, detail.clone());
                            self.send(Outgoing::DestroyBlocked { resource: id, detail }).await;
                        }
                    }
                    (Err(e), garbage) => {
                        let garbage = garbage.is_some();
                        warn!(%agent, resource = %id, garbage, error = %e, "destroy did not finish; tried again at the next pass");
                        if !garbage {
                            self.blocked.insert(id);
                        }
                    }
                }
            }
            Done::Checked { id, request, result } => {
                self.running.remove(&id);
                self.ready.insert(id);
                match result {
                    Ok(health) => {
                        self.config.control.update(|s| s.health_checks += 1);
                        let Some(tracked) = self.model.get_mut(id).filter(|t| t.health_request == Some(request)) else {
                            return;
                        };
                        tracked.health_request = None;
                        info!(%agent, resource = %id, healthy = health.healthy, detail = health.detail, "health checked");
                        if live {
                            self.send(Outgoing::Health { resource: id, request, health }).await;
                        }
                    }
                    Err(e) => {
                        warn!(%agent, resource = %id, error = %e, "health check did not finish; tried again at the next pass");
                        self.blocked.insert(id);
                    }
                }
            }
            Done::Listed { view, resync, result } => {
                self.listing = false;
                let mut view = view;
                view.also_in_flight(std::mem::take(&mut self.started_while_listing));
                match result {
                    Ok(handles) => {
                        self.driver_down = None;
                        self.send_driver_status().await;
                        self.listed(view, resync, handles).await;
                    }
                    Err(e) => {
                        warn!(%agent, error = %e, "listing failed; no report this pass");
                        self.resync_wanted |= resync;
                        self.driver_down = Some(cut(e.to_string()));
                        self.send_driver_status().await;
                    }
                }
                let driver_unavailable = self.driver_down.clone();
                self.config.control.update(|s| s.driver_unavailable = driver_unavailable);
                if std::mem::take(&mut self.sync_again) {
                    self.start_pass();
                }
            }
        }
    }

    /// What a listing means for garbage. Handles the log ordered destroyed are destroyed if here, and reported
    /// destroyed if not (the order is settled either way). Handles of no resource the model holds, not quarantined
    /// and not ordered, are reported to the writer: those of resources that left at once, others once they have been
    /// here for the creation grace; the same set is not reported again (an idle agent does not grow the log), except
    /// after [`GARBAGE_RECHECK`]. Nothing is destroyed on the agent's own judgement.
    async fn garbage_pass(&mut self, view: &View, present: &BTreeSet<ResourceId>, epoch: Position) {
        let agent = self.config.name.clone();
        let orders: Vec<(ResourceId, Position)> = self.model.garbage_orders().collect();
        for (id, at) in orders {
            if present.contains(&id) {
                self.garbage.insert(id, at);
            } else if !self.running.contains_key(&id) {
                self.report_destroyed(id, at).await;
            }
        }
        let now = Instant::now();
        let candidates: BTreeSet<ResourceId> = present
            .iter()
            .copied()
            .filter(|id| {
                !self.model.contains(*id)
                    && !self.model.is_quarantined(*id)
                    && self.model.garbage_order(*id).is_none()
                    && !self.running.contains_key(id)
            })
            .collect();
        self.garbage_seen.retain(|id, _| candidates.contains(id));
        for id in &candidates {
            self.garbage_seen.entry(*id).or_insert(now);
        }
        self.model.forget_left_absent(present);
        let grace = self.config.gc_grace;
        let due: BTreeSet<ResourceId> = candidates
            .iter()
            .copied()
            .filter(|id| self.model.left(*id).is_some() || self.garbage_seen[id] + grace <= now)
            .collect();
        let unchanged = self
            .garbage_reported
            .as_ref()
            .is_some_and(|(set, at)| *set == due && now.duration_since(*at) < GARBAGE_RECHECK);
        if due.is_empty() || unchanged {
            if due.is_empty() {
                self.garbage_reported = None;
            }
            return;
        }
        let handles: Vec<ResourceId> = due.iter().copied().collect();
        info!(%agent, handles = handles.len(), dry_run = self.config.gc_dry_run, "reporting garbage for the log to decide");
        for chunk in handles.chunks(CHUNK_HANDLES) {
            self.config.control.update(|s| s.garbage_reports += 1);
            self.send(Outgoing::Garbage(GarbageReport {
                agent: agent.clone(),
                epoch,
                obs: 0,
                watermark: view.watermark,
                handles: chunk.to_vec(),
                dry_run: self.config.gc_dry_run,
            }))
            .await;
        }
        self.garbage_reported = Some((due, now));
    }

    /// Says at once that `id` was destroyed as the log ordered at `ordered` (a release, or a garbage order), once.
    async fn report_destroyed(&mut self, id: ResourceId, ordered: Position) {
        if self.epoch.is_none() || self.destroy_reported.get(&id) == Some(&ordered) {
            return;
        }
        self.destroy_reported.insert(id, ordered);
        self.config.control.update(|s| s.destroys_reported += 1);
        self.send(Outgoing::Destroyed { resource: id, ordered }).await;
    }

    /// The second half of a sync pass: the report (or the full resync) from the snapshot and the listing, and the
    /// handles to destroy.
    async fn listed(&mut self, view: View, resync: bool, handles: Vec<Listed>) {
        let agent = self.config.name.clone();
        let mut present: BTreeSet<ResourceId> = handles.iter().map(|listed| listed.id).collect();
        for id in &present {
            if self.running.contains_key(id) {
                continue;
            }
            // Destroyed once, and here again: destroy it again.
            if let Some(tracked) = self.model.get_mut(*id)
                && tracked.releasing.is_some()
                && tracked.destroy_done
            {
                tracked.destroy_done = false;
                self.ready.insert(*id);
            }
        }
        self.config.control.update(|s| s.sync_passes += 1);
        let Some(epoch) = self.epoch else { return };
        self.garbage_pass(&view, &present, epoch).await;
        let failures = self.failures(&handles, &mut present);
        let lists = view.report(&present);
        if resync || lists.n_named() > MAX_REPORT_HANDLES {
            self.quiet = None;
            let chunks = view.chunks(&present, CHUNK_HANDLES);
            info!(%agent, watermark = %view.watermark, chunks = chunks.len(), handles = lists.count, "sending a full resync");
            self.config.control.update(|s| s.resyncs += 1);
            for chunk in chunks {
                self.send(Outgoing::Chunk(ResyncChunk {
                    agent: agent.clone(),
                    epoch,
                    obs: 0,
                    watermark: view.watermark,
                    lo: chunk.lo,
                    hi: chunk.hi,
                    held: chunk.held,
                    in_flight: chunk.in_flight,
                }))
                .await;
            }
            self.report_failures(failures).await;
            return;
        }
        let key = (epoch, view.material, lists.count, lists.digest);
        if lists.n_named() == 0 && self.quiet == Some(key) {
            debug!(%agent, watermark = %view.watermark, count = lists.count, "nothing new since the last report");
            self.config.control.update(|s| s.quiet_passes += 1);
            self.report_failures(failures).await;
            return;
        }
        self.quiet = (lists.n_named() == 0).then_some(key);
        info!(
            %agent,
            watermark = %view.watermark,
            created = lists.created.len(),
            missing = lists.missing.len(),
            destroyed = lists.destroyed.len(),
            in_flight = lists.in_flight.len(),
            count = lists.count,
            "sync report"
        );
        let report = lists.into_report(agent, epoch, 0, view.watermark);
        self.send(Outgoing::Sync(report)).await;
        self.report_failures(failures).await;
    }

    /// The handles the listing found failed (a container that exited) that the writer knows as created and that are
    /// not being destroyed, each once until it is found healthy again. A few are reported unhealthy, one by one
    /// (each turns suspect, its health check finds it unhealthy, it is released). As many within the breaker's window
    /// as would trip the loss breaker (its thresholds, from the agent's registration) are a machine's trouble, not
    /// theirs — a dockerd restart stops every container — so every failed handle still live is left out of `present`
    /// and the report names them missing: the breaker holds them for an operator, instead of a mass failure
    /// releasing everything.
    fn failures(&mut self, handles: &[Listed], present: &mut BTreeSet<ResourceId>) -> Vec<(ResourceId, String)> {
        let failed: Vec<(ResourceId, String)> = handles
            .iter()
            .filter_map(|listed| Some((listed.id, listed.failed.clone()?)))
            .filter(|(id, _)| {
                !self.running.contains_key(id)
                    && self
                        .model
                        .get(*id)
                        .is_some_and(|t| t.seen_present && t.releasing.is_none() && !t.failure_reported)
            })
            .collect();
        if failed.is_empty() {
            return failed;
        }
        // Judged over the breaker's window, as the writer judges losses: a restart whose stops two passes see half
        // each is still one event.
        let now = Instant::now();
        let window = Duration::from_millis(self.settings.loss_window.0);
        self.recent_failures.retain(|(at, _)| now.duration_since(*at) < window);
        let earlier = self.recent_failures.len() as u64;
        let n = failed.len() as u64;
        let total = earlier + n;
        // What the agent held when the window began: what it holds live now, and those failed earlier that have left
        // since (the ones still suspect are live now, and counted there).
        let left = self
            .recent_failures
            .iter()
            .filter(|(_, id)| !self.model.get(*id).is_some_and(|t| t.seen_present && t.releasing.is_none()))
            .count() as u64;
        let live_at_start = self.model.n_live() as u64 + left;
        let settings = &self.settings;
        let mass = total >= u64::from(settings.max_loss_min)
            && total * 100 > live_at_start * u64::from(settings.max_loss_percent);
        let live = live_at_start - left;
        if !mass {
            self.recent_failures.extend(failed.iter().map(|(id, _)| (now, *id)));
            return failed;
        }
        warn!(
            agent = %self.config.name,
            failed = n,
            live,
            "{n} of {live} resources failed at once: reported missing, for the loss breaker to hold, not failed one by one"
        );
        // Every failed handle the writer still holds live goes, those failed one by one earlier in the window
        // included: the writer's breaker counts losses, and these are the same event's.
        for listed in handles.iter().filter(|listed| listed.failed.is_some()) {
            if self.model.get(listed.id).is_some_and(|t| t.seen_present && t.releasing.is_none()) {
                present.remove(&listed.id);
            }
        }
        Vec::new()
    }

    async fn report_failures(&mut self, failures: Vec<(ResourceId, String)>) {
        for (id, detail) in failures {
            let Some(tracked) = self.model.get_mut(id) else { continue };
            tracked.failure_reported = true;
            info!(agent = %self.config.name, resource = %id, detail, "found failed; reported unhealthy");
            self.send(Outgoing::Unhealthy { resource: id, detail }).await;
        }
    }

    /// Shutdown: calls running get the grace period to finish (and their results are still sent), then the
    /// publisher gets what is left of it to send what is queued.
    async fn drain(&mut self, publisher: Option<Publisher>) {
        let deadline = Instant::now() + self.config.shutdown_grace;
        self.drain_by = Some(deadline);
        info!(agent = %self.config.name, running = self.running.len(), "stopping");
        while !self.calls.is_empty() {
            match timeout_at(deadline, self.calls.join_next_with_id()).await {
                Ok(Some(joined)) => self.joined(joined).await,
                _ => break,
            }
        }
        self.calls.abort_all();
        // Closing the queue tells the publisher to finish.
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.outgoing, closed));
        if let Some(mut publisher) = publisher
            && timeout_at(deadline, &mut publisher).await.is_err()
        {
            publisher.abort();
        }
    }
}

type Publisher = tokio::task::JoinHandle<Result<(), Error>>;

/// The publisher's end (it ends only on a refused registration before the agent stops).
async fn join_publisher(publisher: &mut Option<Publisher>) -> Result<(), Error> {
    match publisher {
        Some(task) => task.await.unwrap_or_else(|e| panic!("the publisher panicked: {e}")),
        None => std::future::pending().await,
    }
}

async fn next_item<T>(stream: &mut Option<BoxStream<'static, T>>) -> Option<T> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// `interval` ± 20 %, so agents started together do not report together.
fn jittered(interval: Duration) -> Duration {
    let interval = interval.max(Duration::from_millis(10));
    let random = RandomState::new().hash_one(Instant::now());
    let fraction = (random >> 11) as f64 / (1u64 << 53) as f64;
    interval.mul_f64(0.8 + 0.4 * fraction)
}

fn cut(mut detail: String) -> String {
    if detail.len() > MAX_DETAIL_BYTES {
        detail.truncate(detail.floor_char_boundary(MAX_DETAIL_BYTES));
    }
    detail
}

/// How often to heartbeat: at most `configured`, and at most a quarter of the effective `stall_after`. The writer
/// records a heartbeat at most every third of `stall_after` (coalesced) and calls the agent stalled after
/// `stall_after` plus that third, so a quarter leaves room for a lost or late heartbeat.
///
/// The pace is learnt from the agent's registration (`agent-registered` carries the effective settings). An agent
/// that follows the policy keeps this pace until its next registration when the policy changes later: a shorter
/// `stall_after` set meanwhile can call it stalled early, so lower `stall_after` together with restarting (or
/// re-registering) the agents, or keep it well above four times their `heartbeat_interval` (10 s by default).
fn heartbeat_every(stall_after: leasehold_schemas::Millis, configured: Duration) -> Duration {
    let quarter = Duration::from_millis(stall_after.0 / 4);
    configured.min(quarter).max(Duration::from_millis(1))
}

/// The one place commands leave the agent: in order, each published (retried while the log is unavailable) before
/// the next, so observation numbers reach the log increasing. Heartbeats go out from here too.
async fn publish_all<L: Log>(log: L, config: AgentConfig, mut queue: mpsc::Receiver<Outgoing>) -> Result<(), Error> {
    let agent = config.name.clone();
    let issuer = Issuer::from(&agent);
    let mut epoch: Option<Position> = None;
    let mut obs = 0u64;
    let mut heartbeat = tokio::time::interval(config.heartbeat_interval.max(Duration::from_millis(1)));
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let (command_id, body) = tokio::select! {
            message = queue.recv() => {
                let Some(message) = message else { return Ok(()) };
                let mut observe = || {
                    obs += 1;
                    obs
                };
                let body: Command = match (message, epoch) {
                    (Outgoing::Register { command_id, register }, _) => {
                        epoch = None;
                        let published = publish(&log, &issuer, command_id, register.into()).await;
                        if let Err(error) = published {
                            return Err(Error::Log { agent, error });
                        }
                        continue;
                    }
                    (Outgoing::Epoch { epoch: new, heartbeat: every }, _) => {
                        epoch = Some(new);
                        obs = 0;
                        if every != heartbeat.period() {
                            heartbeat = tokio::time::interval(every);
                            heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
                        }
                        continue;
                    }
                    (_, None) => {
                        debug!(%agent, "no epoch: an observation of an earlier incarnation is dropped");
                        continue;
                    }
                    (Outgoing::Created { resource, native_id }, Some(epoch)) => {
                        ReportCreated { agent: agent.clone(), epoch, obs: observe(), resource, native_id }.into()
                    }
                    (Outgoing::CreateFailed { resource, detail }, Some(epoch)) => ReportFailure {
                        agent: agent.clone(),
                        epoch,
                        obs: observe(),
                        resource,
                        failure: FailureKind::CreateFailed,
                        detail: cut(detail),
                    }
                    .into(),
                    (Outgoing::Unhealthy { resource, detail }, Some(epoch)) => ReportFailure {
                        agent: agent.clone(),
                        epoch,
                        obs: observe(),
                        resource,
                        failure: FailureKind::Unhealthy,
                        detail: cut(detail),
                    }
                    .into(),
                    (Outgoing::DestroyBlocked { resource, detail }, Some(epoch)) => ReportFailure {
                        agent: agent.clone(),
                        epoch,
                        obs: observe(),
                        resource,
                        failure: FailureKind::DestroyBlocked,
                        detail: cut(detail),
                    }
                    .into(),
                    (Outgoing::Health { resource, request, health }, Some(epoch)) => HealthResult {
                        agent: agent.clone(),
                        epoch,
                        obs: observe(),
                        resource,
                        request,
                        healthy: health.healthy,
                        detail: cut(health.detail),
                    }
                    .into(),
                    (Outgoing::Sync(report), Some(epoch)) => SyncReport { epoch, obs: observe(), ..report }.into(),
                    (Outgoing::Chunk(chunk), Some(epoch)) => ResyncChunk { epoch, obs: observe(), ..chunk }.into(),
                    (Outgoing::Garbage(report), Some(epoch)) => {
                        GarbageReport { epoch, obs: observe(), ..report }.into()
                    }
                    (Outgoing::Destroyed { resource, ordered }, Some(epoch)) => {
                        ReportDestroyed { agent: agent.clone(), epoch, obs: observe(), resource, ordered }.into()
                    }
                    (Outgoing::DriverStatus { available, detail }, Some(epoch)) => {
                        DriverStatus { agent: agent.clone(), epoch, obs: observe(), available, detail }.into()
                    }
                };
                (CommandId::generate(), body)
            }
            _ = heartbeat.tick(), if epoch.is_some() => {
                let epoch = epoch.expect("heartbeats only with an epoch");
                (CommandId::generate(), Heartbeat { agent: agent.clone(), epoch }.into())
            }
        };
        let type_name = body.type_name();
        let observation = match &body {
            Command::Sync(r) => Some((r.obs, true)),
            Command::ResyncChunk(c) => Some((c.obs, false)),
            Command::ReportCreated(c) => Some((c.obs, false)),
            Command::ReportFailure(c) => Some((c.obs, false)),
            Command::HealthResult(c) => Some((c.obs, false)),
            Command::GarbageReport(c) => Some((c.obs, false)),
            Command::ReportDestroyed(c) => Some((c.obs, false)),
            Command::DriverStatus(c) => Some((c.obs, false)),
            _ => None,
        };
        match publish(&log, &issuer, command_id, body).await {
            Ok(()) => {
                debug!(%agent, command = type_name, %command_id, "published");
                if let Some((obs, is_report)) = observation {
                    config.control.update(|s| {
                        s.last_obs = obs;
                        if is_report {
                            s.reports += 1;
                            s.last_report_obs = obs;
                        }
                    });
                }
            }
            Err(error) => error!(%agent, command = type_name, %error, "the log refused a command; it is dropped"),
        }
    }
}

/// Publishes one command, retrying with backoff while the log is unavailable (the log drops a retry of the same
/// command id as a duplicate). Only a refusal is returned.
async fn publish<L: Log>(
    log: &L,
    issuer: &Issuer,
    command_id: CommandId,
    body: Command,
) -> Result<(), leasehold_log::Error> {
    let now = Timestamp(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64,
    );
    let envelope = Envelope::new(command_id, issuer.clone(), now, body);
    let payload = codec::encode_command(&envelope)
        .map_err(|e| leasehold_log::Error::Refused(format!("command {command_id} does not encode: {e}")))?;
    let subject = ingress_subject_of(&envelope.body);
    let msg_id = command_id.to_string();
    let mut backoff = FIRST_BACKOFF;
    loop {
        match log.publish_command(&subject, &msg_id, payload.clone().into()).await {
            Ok(_) => return Ok(()),
            Err(e @ leasehold_log::Error::Refused(_)) => return Err(e),
            Err(e) => {
                warn!(command = %command_id, error = %e, ?backoff, "publishing failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_come_well_within_a_third_of_stall_after() {
        let configured = Duration::from_secs(10);
        assert_eq!(heartbeat_every(leasehold_schemas::Millis::from_secs(60), configured), configured);
        assert_eq!(heartbeat_every(leasehold_schemas::Millis::from_secs(20), configured), Duration::from_secs(5));
        assert_eq!(heartbeat_every(leasehold_schemas::Millis::from_secs(3), configured), Duration::from_millis(750));
    }
}
