//! The agent against a real log and real writers: the embedded log in a temporary directory, the worker deciding
//! every partition in-process, and the agent with the dir driver on another temporary directory. Every wait is
//! bounded and waits on the log or on the agent's status, never on a clock.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use leasehold_agent::{
    AgentConfig, AgentControl, DirDriver, Driver, DriverError, Error, FAILED_FILE, Health, Listed, Spec, run,
};
use leasehold_log::embedded::Embedded;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::{Allocate, Release, ReportFailureByOperator, RequestHealthCheck};
use leasehold_schemas::outcome::{Decision, Effect, GarbageCause, Outcome};
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_schemas::{AgentName, Command, CommandClass, CommandId, Envelope, Issuer, Position, ResourceId, codec};
use leasehold_worker::WorkerConfig;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// Fails the test if `what` does not happen within [`WAIT`].
async fn within<T>(what: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, work).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

struct System {
    tmp: tempfile::TempDir,
    log: Embedded,
    stop_worker: CancellationToken,
    worker: JoinHandle<leasehold_worker::Report>,
}

struct RunningAgent {
    name: AgentName,
    control: AgentControl,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), Error>>,
}

impl System {
    fn start() -> System {
        let tmp = tempfile::tempdir().unwrap();
        let log = Embedded::open(&tmp.path().join("log"), 4).unwrap();
        let stop_worker = CancellationToken::new();
        let worker = tokio::spawn(leasehold_worker::run(log.clone(), WorkerConfig::new("w"), stop_worker.clone()));
        System { tmp, log, stop_worker, worker }
    }

    fn resources_dir(&self) -> PathBuf {
        self.tmp.path().join("resources")
    }

    /// Starts an agent with passes only when asked (and one right after registering), and waits for its epoch.
    async fn agent<D: Driver>(&self, name: &str, driver: D) -> RunningAgent {
        self.agent_with(name, driver, |_| {}).await
    }

    /// [`System::agent`], with `edit` changing its configuration first.
    async fn agent_with<D: Driver>(&self, name: &str, driver: D, edit: impl FnOnce(&mut AgentConfig)) -> RunningAgent {
        let name = AgentName::new(name).unwrap();
        let mut config = AgentConfig::new(name.clone());
        config.sync_interval = Duration::from_secs(3600);
        config.call_timeout = Duration::from_secs(10);
        edit(&mut config);
        let control = config.control.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(self.log.clone(), driver, config, shutdown.clone()));
        within("the agent's registration", control.wait_for(|s| s.epoch.is_some())).await;
        RunningAgent { name, control, shutdown, task }
    }

    async fn publish(&self, issuer: &str, body: impl Into<Command>) -> CommandId {
        let id = CommandId::generate();
        let envelope = Envelope::new(id, Issuer::new(issuer).unwrap(), leasehold_schemas::Timestamp(now_ms()), body);
        let subject = ingress_subject_of(&envelope.body);
        let payload = codec::encode_command(&envelope).unwrap();
        self.log.publish_command(&subject, &id.to_string(), payload.into()).await.unwrap();
        id
    }

    async fn allocate(&self, agent: &AgentName) -> ResourceId {
        let resource = ResourceId::generate();
        let body = Allocate::new(agent.clone(), resource, "dir", 1);
        self.publish("producer", body).await;
        resource
    }

    async fn release(&self, agent: &AgentName, resource: ResourceId) {
        self.publish("producer", Release { agent: agent.clone(), resource, reason: None }).await;
    }

    /// Every outcome of the agent's subject so far.
    async fn outcomes(&self, agent: &AgentName) -> Vec<Outcome> {
        let batch = self.log.read_outcomes(&subject(&self.log, agent), 1, 100_000).await.unwrap();
        batch.iter().map(|o| codec::decode_outcome(&o.payload).unwrap()).collect()
    }

    /// Waits for the first effect on the agent's subject that `matches`, and returns its position.
    async fn effect(&self, agent: &AgentName, what: &str, matches: impl Fn(&Effect) -> bool) -> Position {
        let mut follow = self.log.follow(subject(&self.log, agent), 1);
        within(what, async {
            loop {
                let stored = follow.next().await.expect("follow ends only with an error").unwrap();
                let outcome = codec::decode_outcome(&stored.payload).unwrap();
                if let Some((position, _)) = outcome.positioned_effects().find(|(_, e)| matches(e)) {
                    return position;
                }
            }
        })
        .await
    }

    /// Waits for `id` to turn active on `agent`'s subject.
    async fn activated(&self, agent: &AgentName, id: ResourceId) -> Position {
        self.effect(agent, "activation", |e| matches!(e, Effect::ResourceActivated { resource, .. } if *resource == id))
            .await
    }

    /// Waits for `id` to be confirmed destroyed on `agent`'s subject.
    async fn destroyed(&self, agent: &AgentName, id: ResourceId) -> Position {
        self.effect(
            agent,
            "the destruction",
            |e| matches!(e, Effect::ResourceDestroyed { resource, .. } if *resource == id),
        )
        .await
    }

    async fn stop(self) {
        self.stop_worker.cancel();
        let report = self.worker.await.unwrap();
        assert!(report.stopped.is_empty(), "no partition stopped: {:?}", report.stopped);
    }
}

impl RunningAgent {
    /// Asks for a sync pass and waits until it is done: its report published, or none needed (nothing new since
    /// the last one).
    async fn sync(&self) {
        let before = self.control.status();
        self.control.sync_now();
        within(
            "a sync pass",
            self.control.wait_for(|s| s.reports > before.reports || s.quiet_passes > before.quiet_passes),
        )
        .await;
    }

    async fn stop(self) {
        self.shutdown.cancel();
        within("the agent to stop", self.task).await.unwrap().unwrap();
    }
}

fn subject(log: &Embedded, agent: &AgentName) -> OutcomeFilter {
    OutcomeFilter::Key { partition: partition_of_agent(agent, log.partitions()), key: agent.as_str().to_owned() }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn dir_of(root: &Path, id: ResourceId) -> PathBuf {
    root.join(id.to_string())
}

/// What the agent's own commands got: no refusal, and the writer never found its count or digest wrong.
fn assert_honest(outcomes: &[Outcome], agent: &AgentName) {
    for outcome in outcomes {
        if outcome.command.class == CommandClass::Agent && outcome.command.issuer.as_str() == agent.as_str() {
            assert!(
                matches!(outcome.decision, Decision::Accepted { .. }),
                "{} was refused: {:?}",
                outcome.command.type_name,
                outcome.rejection()
            );
        }
        for effect in outcome.effects() {
            if matches!(effect, Effect::ResyncRequested { .. }) {
                let story: Vec<String> = outcomes
                    .iter()
                    .map(|o| {
                        let names: Vec<&str> = o.effects().iter().map(|e| e.name()).collect();
                        format!("{} {names:?} {:?}", o.command.type_name, o.rejection())
                    })
                    .collect();
                panic!("the writer asked for a resync: {effect:?}\n{}", story.join("\n"));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocate_release_and_a_directory_removed_by_hand() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();

    let kept = system.allocate(&w1).await;
    let released = system.allocate(&w1).await;
    for id in [kept, released] {
        system.activated(&w1, id).await;
        assert!(dir_of(&root, id).is_dir(), "the directory of {id} exists once it is active");
    }
    assert_eq!(agent.control.status().creates, 2);

    system.release(&w1, released).await;
    within("the destroy", agent.control.wait_for(|s| s.destroys >= 1)).await;
    assert!(!dir_of(&root, released).exists());
    agent.sync().await;
    system.destroyed(&w1, released).await;

    std::fs::remove_dir_all(dir_of(&root, kept)).unwrap();
    agent.sync().await;
    system.effect(&w1, "the loss", |e| matches!(e, Effect::ResourceLost { resource, .. } if *resource == kept)).await;
    within("the model to forget both", agent.control.wait_for(|s| s.n_resources == 0)).await;

    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

/// An idle agent does not grow the log (DESIGN section 3): a pass that finds nothing new since the last report
/// sends none; a change (a directory removed by hand) is reported at the next pass all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_agent_sends_no_report_that_says_nothing_new() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    let kept = system.allocate(&w1).await;
    system.activated(&w1, kept).await;
    // Passes until two quiet ones in a row: the first ones may still have something to say (the activation moved
    // the watermark), and a report is counted once published, a little after its pass...
    let mut quiet_in_a_row = 0;
    for _ in 0..20 {
        let before = agent.control.status().quiet_passes;
        agent.sync().await;
        quiet_in_a_row = if agent.control.status().quiet_passes > before { quiet_in_a_row + 1 } else { 0 };
        if quiet_in_a_row == 2 {
            break;
        }
    }
    assert_eq!(quiet_in_a_row, 2, "an idle agent settles into quiet passes");
    let quiet_before = agent.control.status().quiet_passes;
    let reports_before = agent.control.status().reports;
    // ...from then on, with nothing new, passes send nothing.
    for _ in 0..3 {
        agent.sync().await;
    }
    let status = agent.control.status();
    assert_eq!(status.reports, reports_before, "no report without anything new");
    assert_eq!(status.quiet_passes, quiet_before + 3);
    let syncs = |outcomes: &[leasehold_schemas::Outcome]| {
        outcomes.iter().filter(|o| o.command.type_name == "agent.sync").count()
    };
    let logged = syncs(&system.outcomes(&w1).await);

    std::fs::remove_dir_all(dir_of(&root, kept)).unwrap();
    agent.sync().await;
    system.effect(&w1, "the loss", |e| matches!(e, Effect::ResourceLost { resource, .. } if *resource == kept)).await;
    assert!(syncs(&system.outcomes(&w1).await) > logged, "the change was reported");
    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

/// Every destroy is on the record: a handle of no known resource is reported, the writer orders it destroyed (with
/// its cause), and only then does the agent destroy it and say so. Other files are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_is_destroyed_only_as_the_log_orders_and_other_files_are_left_alone() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent_with("w1", DirDriver::new(&root), |c| c.gc_grace = Duration::ZERO).await;
    let w1 = agent.name.clone();
    let known = system.allocate(&w1).await;
    system.activated(&w1, known).await;

    let stranger = ResourceId::generate();
    std::fs::create_dir_all(dir_of(&root, stranger).join("inside")).unwrap();
    std::fs::create_dir(root.join("scratch")).unwrap();
    std::fs::write(root.join("notes.txt"), "mine").unwrap();
    let file_with_an_id_name = ResourceId::generate();
    std::fs::write(dir_of(&root, file_with_an_id_name), "mine too").unwrap();

    agent.sync().await;
    let ordered = system
        .effect(&w1, "the garbage order", |e| {
            matches!(e, Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Unknown {} } if *handle == stranger)
        })
        .await;
    system
        .effect(
            &w1,
            "the garbage destroy, on record",
            |e| matches!(e, Effect::GarbageDestroyed { handle, .. } if *handle == stranger),
        )
        .await;
    assert!(!dir_of(&root, stranger).exists(), "a handle of no known resource is destroyed, as ordered");
    assert!(root.join("scratch").is_dir() && root.join("notes.txt").is_file(), "other files stay");
    assert!(dir_of(&root, file_with_an_id_name).is_file(), "a file is not a handle");
    assert!(dir_of(&root, known).is_dir(), "what the log knows stays");
    let outcomes = system.outcomes(&w1).await;
    let confirmed = outcomes
        .iter()
        .find(|o| o.command.type_name == "agent.report-destroyed")
        .expect("the destroy is reported at once");
    assert!(confirmed.positioned_effects().all(|(p, _)| p > ordered), "the destroy came after the order");
    // Garbage is never counted: the report after it agrees with the writer, and an unchanged set is not sent again.
    let reports = agent.control.status().garbage_reports;
    agent.sync().await;
    agent.sync().await;
    assert_eq!(agent.control.status().garbage_reports, reports, "nothing new to report");
    assert_eq!(agent.control.status().garbage, 1);
    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

/// A handle of no known resource is left alone for the creation grace (something may be making it); a handle of a
/// resource that left is reported at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_handles_wait_out_the_creation_grace_left_ones_do_not() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent_with("w1", DirDriver::new(&root), |c| c.gc_grace = Duration::from_secs(3600)).await;
    let w1 = agent.name.clone();
    let gone = system.allocate(&w1).await;
    system.activated(&w1, gone).await;
    system.release(&w1, gone).await;
    let destroyed_at = system.destroyed(&w1, gone).await;
    // The agent knows it destroyed (else the handle below would still be its own resource, releasing, not garbage).
    within("the agent to fold the destroy", agent.control.wait_for(|s| s.watermark >= destroyed_at)).await;
    // Its handle comes back (a slow create, a restore), and a stranger appears.
    std::fs::create_dir(dir_of(&root, gone)).unwrap();
    let stranger = ResourceId::generate();
    std::fs::create_dir(dir_of(&root, stranger)).unwrap();
    agent.sync().await;
    system
        .effect(&w1, "the order for the destroyed resource's handle", |e| {
            matches!(e, Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Destroyed {} } if *handle == gone)
        })
        .await;
    system
        .effect(&w1, "its destroy", |e| matches!(e, Effect::GarbageDestroyed { handle, .. } if *handle == gone))
        .await;
    agent.sync().await;
    let outcomes = system.outcomes(&w1).await;
    let named_stranger = outcomes.iter().flat_map(|o| o.effects()).any(|e| {
        matches!(e, Effect::GarbageDestroyOrdered { handle, .. } | Effect::GarbageDryRun { handle, .. } if *handle == stranger)
    });
    assert!(!named_stranger, "an unknown handle waits out the creation grace");
    assert!(dir_of(&root, stranger).is_dir());
    assert!(!dir_of(&root, gone).exists());
    agent.stop().await;
    system.stop().await;
}

/// A dry run records what would be destroyed and destroys nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_destroys_nothing() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system
        .agent_with("w1", DirDriver::new(&root), |c| {
            c.gc_grace = Duration::ZERO;
            c.gc_dry_run = true;
        })
        .await;
    let w1 = agent.name.clone();
    let stranger = ResourceId::generate();
    std::fs::create_dir_all(dir_of(&root, stranger).join("data")).unwrap();
    agent.sync().await;
    system
        .effect(
            &w1,
            "the dry run's record",
            |e| matches!(e, Effect::GarbageDryRun { handle, cause: GarbageCause::Unknown {} } if *handle == stranger),
        )
        .await;
    agent.sync().await;
    assert!(dir_of(&root, stranger).join("data").is_dir(), "a dry run destroys nothing");
    assert_eq!(agent.control.status().garbage, 0);
    let ordered = system
        .outcomes(&w1)
        .await
        .iter()
        .flat_map(|o| o.effects().to_vec())
        .any(|e| matches!(e, Effect::GarbageDestroyOrdered { .. }));
    assert!(!ordered, "nothing is ordered in a dry run");
    agent.stop().await;
    system.stop().await;
}

/// A lost volume that comes back keeps its data (a disk mounted late, a restored backup): its handle is
/// quarantined, never touched by the agent through any number of passes, and destroyed only when an operator
/// releases the lost resource, on record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_volume_that_comes_back_keeps_its_data() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent_with("w1", DirDriver::new(&root), |c| c.gc_grace = Duration::ZERO).await;
    let w1 = agent.name.clone();
    let volume = system.allocate(&w1).await;
    let active_at = system.activated(&w1, volume).await;
    within("the agent to learn the volume is active", agent.control.wait_for(|s| s.watermark >= active_at)).await;
    let away = system.tmp.path().join("away");
    std::fs::rename(dir_of(&root, volume), &away).unwrap();
    agent.sync().await;
    system.effect(&w1, "the loss", |e| matches!(e, Effect::ResourceLost { resource, .. } if *resource == volume)).await;
    // The disk comes back once the agent has learnt of the loss (the quarantine is what this test is about; a handle
    // back before that is in the model's tests).
    within("the agent to learn of the loss", agent.control.wait_for(|s| s.n_resources == 0)).await;

    std::fs::write(away.join("precious"), "the data").unwrap();
    std::fs::rename(&away, dir_of(&root, volume)).unwrap();
    agent.sync().await;
    system
        .effect(
            &w1,
            "the quarantine",
            |e| matches!(e, Effect::HandleReappeared { resource, .. } if *resource == volume),
        )
        .await;
    within("the agent to see the quarantine", agent.control.wait_for(|s| s.quarantined == 1)).await;
    for _ in 0..3 {
        agent.sync().await;
    }
    assert_eq!(std::fs::read_to_string(dir_of(&root, volume).join("precious")).unwrap(), "the data");
    assert_eq!(agent.control.status().garbage, 0, "a quarantined handle is never destroyed by a report");

    system
        .publish("op:alice", Release { agent: w1.clone(), resource: volume, reason: Some("not needed".into()) })
        .await;
    system
        .effect(&w1, "the order, by the operator", |e| {
            matches!(e, Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Released { by, .. } }
                if *handle == volume && by.as_str() == "op:alice")
        })
        .await;
    system
        .effect(
            &w1,
            "its destroy, on record",
            |e| matches!(e, Effect::GarbageDestroyed { handle, .. } if *handle == volume),
        )
        .await;
    assert!(!dir_of(&root, volume).exists());
    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

/// A destroy is reported at once, not at the next sync pass: a freed identifier comes back in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destroy_is_reported_at_once() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    let id = system.allocate(&w1).await;
    system.activated(&w1, id).await;
    let passes = agent.control.status().sync_passes;
    system.release(&w1, id).await;
    system.destroyed(&w1, id).await;
    assert_eq!(agent.control.status().sync_passes, passes, "no sync pass was needed (the interval is an hour)");
    let outcomes = system.outcomes(&w1).await;
    let by =
        outcomes.iter().find(|o| o.effects().iter().any(|e| matches!(e, Effect::ResourceDestroyed { .. }))).unwrap();
    assert_eq!(by.command.type_name, "agent.report-destroyed");
    assert_honest(&outcomes, &w1);
    agent.stop().await;
    system.stop().await;
}

/// A driver that cannot list (its root's owner file removed) is recorded unavailable, and available again once it
/// lists; nothing is judged meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_driver_that_cannot_list_is_recorded() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    let kept = system.allocate(&w1).await;
    system.activated(&w1, kept).await;
    let owner = root.join(leasehold_agent::OWNER_FILE);
    std::fs::remove_file(&owner).unwrap();
    agent.control.sync_now();
    within("the driver seen unavailable", agent.control.wait_for(|s| s.driver_unavailable.is_some())).await;
    system
        .effect(
            &w1,
            "driver-unavailable on record",
            |e| matches!(e, Effect::AgentDriverUnavailable { detail } if detail.contains("not agent w1's any more")),
        )
        .await;
    std::fs::write(&owner, "w1\n").unwrap();
    agent.sync().await;
    system.effect(&w1, "driver-available on record", |e| matches!(e, Effect::AgentDriverAvailable {})).await;
    let outcomes = system.outcomes(&w1).await;
    let statuses = outcomes.iter().filter(|o| o.command.type_name == "agent.driver-status").count();
    assert_eq!(statuses, 2, "one record each time it changed");
    assert!(!outcomes.iter().flat_map(|o| o.effects()).any(|e| matches!(e, Effect::ResourceLost { .. })));
    assert_honest(&outcomes, &w1);
    agent.stop().await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_incarnation_finishes_what_the_last_one_left() {
    let system = System::start();
    let root = system.resources_dir();
    let first = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = first.name.clone();
    let first_epoch = first.control.status().epoch.unwrap();
    let doomed = system.allocate(&w1).await;
    system.activated(&w1, doomed).await;
    first.stop().await;

    // While no agent runs: a release of what exists, and an allocation that nobody makes.
    system.release(&w1, doomed).await;
    let fresh = system.allocate(&w1).await;
    system
        .effect(&w1, "the create order", |e| matches!(e, Effect::CreateOrdered { resource } if *resource == fresh))
        .await;
    assert!(dir_of(&root, doomed).is_dir() && !dir_of(&root, fresh).exists());

    let second = system.agent("w1", DirDriver::new(&root)).await;
    assert!(second.control.status().epoch.unwrap() > first_epoch, "a new incarnation has a new epoch");
    system.activated(&w1, fresh).await;
    assert!(dir_of(&root, fresh).is_dir());
    within("the destroy", second.control.wait_for(|s| s.destroys >= 1)).await;
    assert!(!dir_of(&root, doomed).exists());
    second.sync().await;
    system.destroyed(&w1, doomed).await;

    assert_honest(&system.outcomes(&w1).await, &w1);
    second.stop().await;
    system.stop().await;
}

/// A driver that cannot make kind `broken` and says every resource is unhealthy; otherwise the dir driver.
#[derive(Debug)]
struct Picky(DirDriver);

impl Driver for Picky {
    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        if spec.kind == "broken" {
            return Err(DriverError::CreateFailed(format!("no such kind: {}", spec.kind)));
        }
        self.0.create(id, spec).await
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        self.0.destroy(id).await
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        self.0.list().await
    }

    async fn check(&self, _id: ResourceId) -> Result<Health, DriverError> {
        Ok(Health { healthy: false, detail: "it smokes".into() })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_failures_and_health_checks_are_reported() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", Picky(DirDriver::new(&root))).await;
    let w1 = agent.name.clone();

    let broken = ResourceId::generate();
    let body = Allocate::new(w1.clone(), broken, "broken", 1);
    system.publish("producer", body).await;
    system
        .effect(&w1, "the failure", |e| matches!(e, Effect::ResourceFailed { resource, .. } if *resource == broken))
        .await;

    let sick = system.allocate(&w1).await;
    system.activated(&w1, sick).await;
    let failure = ReportFailureByOperator { agent: w1.clone(), resource: sick, detail: "slow".into() };
    system.publish("operator", failure).await;
    system.publish("sweeper", RequestHealthCheck { agent: w1.clone(), resource: sick }).await;
    // The failed check releases it; the agent destroys it.
    system
        .effect(
            &w1,
            "the release after the check",
            |e| matches!(e, Effect::ResourceReleasing { resource, .. } if *resource == sick),
        )
        .await;
    within("the destroy", agent.control.wait_for(|s| s.destroys >= 1 && s.health_checks >= 1)).await;
    assert!(!dir_of(&root, sick).exists());

    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_registration_stops_the_agent() {
    let system = System::start();
    let mut config = AgentConfig::new(AgentName::new("w1").unwrap());
    let settings = leasehold_schemas::settings::AgentSettings {
        stall_after: leasehold_schemas::Millis::from_secs(1),
        ..Default::default()
    };
    config.settings = Some(settings);
    let result = within(
        "the agent to stop",
        run(system.log.clone(), DirDriver::new(system.resources_dir()), config, CancellationToken::new()),
    )
    .await;
    let err = result.unwrap_err();
    assert!(matches!(err, Error::RegistrationRejected { .. }), "{err}");
    assert!(err.to_string().contains("stall_after"), "{err}");
    system.stop().await;
}

/// The dir driver, whose listing can be held: armed, the next `list` takes its listing, says so, and gives it only
/// once let go. What an inventory that takes long on a busy machine looks like to the rest of the agent.
#[derive(Debug, Clone)]
struct Held {
    dir: DirDriver,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    listed: std::sync::Arc<tokio::sync::Notify>,
    go: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Held {
    fn new(root: &Path) -> Self {
        Held {
            dir: DirDriver::new(root),
            armed: Default::default(),
            listed: Default::default(),
            go: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl Driver for Held {
    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        self.dir.create(id, spec).await
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        self.dir.destroy(id).await
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        let listing = self.dir.list().await;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.listed.notify_one();
            self.go.acquire().await.expect("the gate is never closed").forget();
        }
        listing
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        self.dir.check(id).await
    }
}

/// The Concourse race, live: an allocation decided (and created) while the agent is in the middle of taking its
/// inventory is not in that inventory, and the report made from it does not call it lost: the report's watermark is
/// older than the allocation, so the writer does not judge it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allocation_made_during_an_inventory_is_not_marked_lost() {
    let system = System::start();
    let root = system.resources_dir();
    let driver = Held::new(&root);
    let agent = system.agent("w1", driver.clone()).await;
    let w1 = agent.name.clone();
    let before = system.allocate(&w1).await;
    system
        .effect(
            &w1,
            "the first activation",
            |e| matches!(e, Effect::ResourceActivated { resource, .. } if *resource == before),
        )
        .await;

    // The inventory starts (it has news: `before` is active since the last report), and is taken before the
    // allocation below exists.
    driver.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let listed = driver.listed.notified();
    let reports_before = agent.control.status().reports;
    agent.control.sync_now();
    within("the inventory to be taken", listed).await;

    // Meanwhile: allocated, ordered created and created by the agent; the inventory does not hold it.
    let during = system.allocate(&w1).await;
    let ordered = system
        .effect(&w1, "the create order", |e| matches!(e, Effect::CreateOrdered { resource } if *resource == during))
        .await;
    system
        .effect(
            &w1,
            "the activation",
            |e| matches!(e, Effect::ResourceActivated { resource, .. } if *resource == during),
        )
        .await;
    assert!(dir_of(&root, during).exists(), "the agent made it while its inventory was held");

    // The inventory goes on: its report is decided, with a watermark older than the allocation, and loses nothing.
    driver.go.add_permits(1);
    within("the held report", agent.control.wait_for(|s| s.reports > reports_before)).await;
    agent.sync().await;
    let outcomes = system.outcomes(&w1).await;
    let watermarks: Vec<Position> = outcomes
        .iter()
        .filter(|o| o.command.type_name == "agent.sync")
        .flat_map(|o| o.effects())
        .filter_map(|e| match e {
            Effect::ObservationAccepted { watermark: Some(w), .. } => Some(*w),
            _ => None,
        })
        .collect();
    assert!(
        watermarks.iter().any(|w| *w < ordered),
        "a report made from the held inventory (watermark before {ordered}) was decided: {watermarks:?}"
    );
    let lost: Vec<&Effect> =
        outcomes.iter().flat_map(|o| o.effects()).filter(|e| matches!(e, Effect::ResourceLost { .. })).collect();
    assert!(lost.is_empty(), "nothing was lost: {lost:?}");
    assert_honest(&outcomes, &w1);
    agent.stop().await;
    system.stop().await;
}

/// The dir driver, whose destroys do not finish (a busy disk): an order stays pending.
#[derive(Debug)]
struct NoDestroy(DirDriver);

impl Driver for NoDestroy {
    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        self.0.create(id, spec).await
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        Err(DriverError::Transient(format!("{id}: device busy")))
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        self.0.list().await
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        self.0.check(id).await
    }
}

/// `--gc dry-run` destroys nothing, even a handle the log ordered destroyed before the agent ran dry: an operator who
/// sees an order they doubt (a pending `garbage_orders` in `agents`) and restarts the agent with `--gc dry-run` to stop
/// it must not see the agent carry it out the moment it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dry_run_agent_carries_out_no_garbage_order_given_before() {
    let system = System::start();
    let root = system.resources_dir();
    let first = system.agent_with("w1", NoDestroy(DirDriver::new(&root)), |c| c.gc_grace = Duration::ZERO).await;
    let w1 = first.name.clone();
    let stray = ResourceId::generate();
    std::fs::create_dir_all(dir_of(&root, stray).join("data")).unwrap();
    first.sync().await;
    system
        .effect(
            &w1,
            "the garbage order",
            |e| matches!(e, Effect::GarbageDestroyOrdered { handle, .. } if *handle == stray),
        )
        .await;
    first.stop().await;
    assert!(dir_of(&root, stray).join("data").is_dir(), "the first agent could not destroy it");

    let dry = system
        .agent_with("w1", DirDriver::new(&root), |c| {
            c.gc_grace = Duration::ZERO;
            c.gc_dry_run = true;
        })
        .await;
    dry.sync().await;
    dry.sync().await;
    let status = within("the calls to end", dry.control.wait_for(|s| s.n_in_flight == 0)).await;
    assert_eq!(status.garbage, 0, "a dry run destroys nothing");
    assert!(dir_of(&root, stray).join("data").is_dir(), "the handle is still there");
    dry.stop().await;
    system.stop().await;
}

/// A destroy confirmed at once while the agent takes its inventory: the inventory (or the destroy in flight) still
/// holds the handle, and the writer decides `report-destroyed` first. The writer counts the handle as the report's
/// view had it (it left after the report's watermark), so the report agrees with it (a disagreement asks for a full
/// resync: chunks over everything the agent holds, each time a release lands during a listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destroy_confirmed_during_an_inventory_does_not_put_the_report_out_of_step() {
    let system = System::start();
    let root = system.resources_dir();
    let driver = Held::new(&root);
    let agent = system.agent("w1", driver.clone()).await;
    let w1 = agent.name.clone();
    let kept = system.allocate(&w1).await;
    let doomed = system.allocate(&w1).await;
    for id in [kept, doomed] {
        system
            .effect(&w1, "activation", |e| matches!(e, Effect::ResourceActivated { resource, .. } if *resource == id))
            .await;
    }

    // The inventory is taken with both handles in it, and held.
    driver.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let listed = driver.listed.notified();
    let reports_before = agent.control.status().reports;
    agent.control.sync_now();
    within("the inventory to be taken", listed).await;

    // Meanwhile one is released, destroyed and confirmed destroyed at once.
    system.release(&w1, doomed).await;
    system
        .effect(
            &w1,
            "the confirmed destroy",
            |e| matches!(e, Effect::ResourceDestroyed { resource, .. } if *resource == doomed),
        )
        .await;
    assert!(!dir_of(&root, doomed).exists());

    // The inventory goes on; its report is decided.
    driver.go.add_permits(1);
    let status = within("the held report", agent.control.wait_for(|s| s.reports > reports_before)).await;
    let obs = status.last_report_obs;
    system
        .effect(
            &w1,
            "the held report's decision",
            |e| matches!(e, Effect::ObservationAccepted { stamp, watermark: Some(_) } if stamp.obs == obs),
        )
        .await;
    assert!(dir_of(&root, kept).is_dir());
    assert_honest(&system.outcomes(&w1).await, &w1);
    agent.stop().await;
    system.stop().await;
}

/// A handle the listing finds failed (a container that exited; here a directory holding `.leasehold-failed`) is
/// reported unhealthy once: the resource turns suspect with the driver's reason, its health check finds it
/// unhealthy, and it is released and destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handle_found_failed_is_reported_unhealthy_once_then_released() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    let kept = system.allocate(&w1).await;
    let sick = system.allocate(&w1).await;
    system.activated(&w1, kept).await;
    system.activated(&w1, sick).await;

    std::fs::write(dir_of(&root, sick).join(FAILED_FILE), "exited with code 3").unwrap();
    // A pass reports a failure only of what the agent has folded as active: pass until one does.
    let suspected = |outcomes: &[Outcome]| {
        outcomes.iter().flat_map(|o| o.effects()).any(|e| {
            matches!(e, Effect::ResourceSuspect { resource, cause } if *resource == sick
                && format!("{cause:?}").contains("exited with code 3"))
        })
    };
    within("the suspicion", async {
        while !suspected(&system.outcomes(&w1).await) {
            agent.sync().await;
        }
    })
    .await;
    agent.sync().await;
    agent.sync().await;
    system.publish("sweeper", RequestHealthCheck { agent: w1.clone(), resource: sick }).await;
    system.destroyed(&w1, sick).await;

    let outcomes = system.outcomes(&w1).await;
    let suspicions = outcomes
        .iter()
        .flat_map(|o| o.effects())
        .filter(|e| matches!(e, Effect::ResourceSuspect { resource, .. } if *resource == sick))
        .count();
    assert_eq!(suspicions, 1);
    assert!(
        !outcomes
            .iter()
            .any(|o| o.command.type_name == "agent.report-failure" && matches!(o.decision, Decision::Rejected(_))),
        "the failure is reported once, never again while it is suspect"
    );
    assert!(
        !outcomes
            .iter()
            .flat_map(|o| o.effects())
            .any(|e| matches!(e, Effect::ResourceSuspect { resource, .. } if *resource == kept)),
        "the healthy one is left alone"
    );
    assert_honest(&outcomes, &w1);
    agent.stop().await;
    system.stop().await;
}

/// Many handles failed at once (every container stopped by a dockerd restart) are the machine's trouble: the report
/// names them missing, the loss breaker holds them for an operator, and none is failed one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_handles_failed_at_once_trip_the_loss_breaker_not_a_mass_failure() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(system.allocate(&w1).await);
    }
    let mut last = Position(0);
    for id in &ids {
        last = last.max(system.activated(&w1, *id).await);
    }
    // Every activation folded, so the agent knows all six as live when it finds them failed.
    within("the agent to fold the activations", agent.control.wait_for(|s| s.watermark >= last)).await;
    for id in &ids {
        std::fs::write(dir_of(&root, *id).join(FAILED_FILE), "exited with code 255").unwrap();
    }
    agent.sync().await;
    system.effect(&w1, "the breaker", |e| matches!(e, Effect::AgentSuspect { would_lose: 6, .. })).await;
    let outcomes = system.outcomes(&w1).await;
    let effects: Vec<&Effect> = outcomes.iter().flat_map(|o| o.effects()).collect();
    assert!(!effects.iter().any(|e| matches!(e, Effect::ResourceSuspect { .. } | Effect::ResourceLost { .. })));
    assert!(!outcomes.iter().any(|o| o.command.type_name == "agent.report-failure"), "no failure reported one by one");
    agent.stop().await;
    system.stop().await;
}

/// A driver whose destroys are blocked (something else uses the resource) until told otherwise.
struct Busy {
    dir: DirDriver,
    busy: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Driver for Busy {
    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        self.dir.create(id, spec).await
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        if self.busy.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(DriverError::InUse(format!("volume lh-{id} is in use by container ci-cache")));
        }
        self.dir.destroy(id).await
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        self.dir.list().await
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        self.dir.check(id).await
    }
}

/// A destroy blocked by another user of the resource is retried, and its reason is on record once (`get` shows it);
/// the resource stays releasing until the destroy goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_destroy_is_on_record_once_and_retried() {
    let system = System::start();
    let root = system.resources_dir();
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let agent = system.agent("w1", Busy { dir: DirDriver::new(&root), busy: busy.clone() }).await;
    let w1 = agent.name.clone();
    let id = system.allocate(&w1).await;
    system.activated(&w1, id).await;
    system.release(&w1, id).await;
    system
        .effect(&w1, "the blocked destroy", |e| {
            matches!(e, Effect::DestroyBlocked { resource, detail } if *resource == id && detail.contains("ci-cache"))
        })
        .await;
    agent.sync().await;
    agent.sync().await;
    assert!(dir_of(&root, id).is_dir(), "nothing is destroyed while it is in use");
    busy.store(false, std::sync::atomic::Ordering::SeqCst);
    agent.sync().await;
    system.destroyed(&w1, id).await;
    let outcomes = system.outcomes(&w1).await;
    let blocked =
        outcomes.iter().flat_map(|o| o.effects()).filter(|e| matches!(e, Effect::DestroyBlocked { .. })).count();
    assert_eq!(blocked, 1, "the same reason is recorded once");
    assert_honest(&outcomes, &w1);
    agent.stop().await;
    system.stop().await;
}

/// Failures are judged over the breaker's window, as losses are: a restart whose stops two passes see in halves is
/// one event. The first few are failed one by one; once the window holds as many as would trip the breaker, the
/// rest are reported missing and the breaker holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_split_over_two_passes_still_meet_the_loss_breaker() {
    let system = System::start();
    let root = system.resources_dir();
    let agent = system.agent("w1", DirDriver::new(&root)).await;
    let w1 = agent.name.clone();
    // Ten live, four failed in one pass, three in the next (defaults: at least 5, and more than 50 %): the window
    // holds 7 of the 10 held when it began. The four still suspect are live, and counted once, not twice.
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(system.allocate(&w1).await);
    }
    let mut last = Position(0);
    for id in &ids {
        last = last.max(system.activated(&w1, *id).await);
    }
    within("the agent to fold the activations", agent.control.wait_for(|s| s.watermark >= last)).await;
    let fail = |id: &ResourceId| std::fs::write(dir_of(&root, *id).join(FAILED_FILE), "exited with code 255").unwrap();
    let suspects = |outcomes: &[Outcome]| {
        outcomes.iter().flat_map(|o| o.effects()).filter(|e| matches!(e, Effect::ResourceSuspect { .. })).count()
    };
    ids[..4].iter().for_each(fail);
    within("four failed one by one", async {
        while suspects(&system.outcomes(&w1).await) < 4 {
            agent.sync().await;
        }
    })
    .await;
    ids[4..7].iter().for_each(fail);
    agent.sync().await;
    // All seven: the four failed one by one are still live (suspect), and the same event's.
    system.effect(&w1, "the breaker", |e| matches!(e, Effect::AgentSuspect { would_lose: 7, .. })).await;
    assert_eq!(suspects(&system.outcomes(&w1).await), 4, "the rest is held by the breaker, not failed");
    agent.stop().await;
    system.stop().await;
}
