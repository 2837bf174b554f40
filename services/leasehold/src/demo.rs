//! `leasehold demo`: the real services on a temporary data directory — the embedded log, the writers, the
//! projector, the gateway on a free port of 127.0.0.1, and two agents (`w1`, `w2`) whose dir drivers make one
//! directory per resource — driven through the command line's own HTTP client, with the timeline of outcomes
//! printed as the gateway's event feed delivers them.
//!
//! The story: two agents register; a volume is allocated and its directory appears; a build's lease waits on a
//! container whose agent is down, and is granted once the agent is back and has made it; the web UI and the CLI
//! release the same volume at once (one release, one recorded no-op); a directory deleted behind leasehold's back
//! is found lost at the next report; a directory nobody allocated is destroyed by its agent; a driver that suddenly
//! lists nothing trips the circuit breaker instead of losing everything; a /30 pool hands out its two addresses, a
//! third container waits, and a released container's address comes back only after its agent destroyed it and
//! its cool-down passed. It ends by folding the whole log again
//! from scratch and checking the read models come out the same.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use leasehold_agent::{AgentConfig, AgentControl, AnyDriver, DirDriver};
use leasehold_log::Log;
use leasehold_log::embedded::Embedded;
use leasehold_projector::{AgentView, LeaseView, Projector, ResourceView};
use leasehold_schemas::command::{Acquire, Allocate, DefinePool, Release};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Millis, PoolName, ResourceId, Timestamp};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::pool::PoolKind;
use leasehold_schemas::{Command, Envelope};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client::{CommandStatus, Gateway, SeqOutcome};
use crate::timeline;

const PARTITIONS: u32 = 4;
/// How long the demo waits for anything before it gives up (a demo that hangs is worse than one that fails).
const PATIENCE: Duration = Duration::from_secs(20);
/// The pool's cool-down: short, so the demo shows an address cooling down without waiting long.
const POOL_COOLDOWN: Duration = Duration::from_secs(2);

/// Which driver the demo's agents run: directories (the default, needing nothing but cargo) or real containers on
/// the local Docker daemon (`--driver docker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum DemoDriver {
    #[default]
    Dir,
    Docker,
}

/// What the demo established, for its test and its last lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) n_outcomes: usize,
    pub(crate) n_rejected: usize,
    pub(crate) lease_waited_then_granted: bool,
    pub(crate) double_release_one_noop: bool,
    pub(crate) lost_detected: bool,
    pub(crate) garbage_destroyed: bool,
    pub(crate) breaker_tripped: bool,
    /// The third container got the released one's address, only after the destroy and the cool-down.
    pub(crate) address_reused_after_cooldown: bool,
    pub(crate) nothing_lost_by_breaker: bool,
    pub(crate) refold_matches: bool,
    /// Docker: `docker inspect` shows the addresses the pool granted.
    pub(crate) addresses_real: bool,
    /// Docker: a container whose program exited was found failed, checked unhealthy and released.
    pub(crate) exit_released: bool,
    /// Docker: an image not on the machine failed its resource, saying so.
    pub(crate) missing_image_failed: bool,
    /// Docker: nothing the demo made is left on the daemon.
    pub(crate) nothing_left: bool,
}

/// Whether the services stay up once the story is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Stop them and exit (the default).
    No,
    /// Keep them up, for the operator's view and the command line, until Ctrl-C (or SIGTERM).
    UntilInterrupted,
}

/// `story`, unless Ctrl-C (SIGINT) or SIGTERM comes first: then an error that says so, and the demo stops its
/// services and cleans up (the temporary directory; on docker, what it made on the daemon) as after any story that
/// failed, instead of dying with its signal and leaving them behind.
async fn unless_interrupted(story: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        told = story => told,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (Ctrl-C) during the story")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated (SIGTERM) during the story")),
    }
}

/// Runs the story, writing the timeline to `out`.
/// With `keep`, the data directory (the log and the projection) is copied there at the end, for an audit
/// (`leasehold-replay --data DIR ...`). With [`Hold::UntilInterrupted`], the services stay up after the story until
/// the process is interrupted, then stop as they do without it.
pub(crate) fn run(
    out: &mut (dyn Write + Send),
    keep: Option<&Path>,
    driver: DemoDriver,
    hold: Hold,
) -> anyhow::Result<Summary> {
    if let Some(keep) = keep
        && keep.exists()
    {
        bail!("--keep {}: it exists; name a new directory", keep.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let dir = tempfile::tempdir().context("making a temporary directory")?;
        let (summary, stage) = match driver {
            DemoDriver::Dir => {
                let agents = ["w1", "w2"].map(|name| {
                    let root = dir.path().join(name);
                    let make: DriverMaker = Box::new(move || AnyDriver::Dir(DirDriver::new(&root)));
                    (name.to_owned(), make)
                });
                let services = Services::start(dir.path(), agents).await?;
                let mut demo = Demo::new(&mut *out, services).await?;
                let script = unless_interrupted(demo.script()).await;
                let script = demo.hold(script, hold).await;
                (demo.finish(script).await, None)
            }
            DemoDriver::Docker => {
                let stage = crate::demo_docker::Stage::prepare(&mut *out).await?;
                let summary = async {
                    let services = Services::start(dir.path(), stage.agents()).await?;
                    let mut demo = Demo::new(&mut *out, services).await?;
                    let script = unless_interrupted(demo.docker_script(&stage)).await;
                    let script = demo.hold(script, hold).await;
                    demo.finish(script).await
                }
                .await;
                (summary, Some(stage))
            }
        };
        // What the demo made on the daemon goes, whatever happened.
        if let Some(stage) = stage {
            let cleaned = stage.clean_up(&mut *out).await;
            let summary = summary.map(|mut s| {
                s.nothing_left = cleaned.as_ref().is_ok_and(|left| *left == 0);
                s
            });
            cleaned?;
            return finish_run(out, keep, dir, summary);
        }
        finish_run(out, keep, dir, summary)
    })
}

/// The end of [`run`]: the data directory kept if asked for, then removed.
fn finish_run(
    out: &mut (dyn Write + Send),
    keep: Option<&Path>,
    dir: tempfile::TempDir,
    summary: anyhow::Result<Summary>,
) -> anyhow::Result<Summary> {
    // The log and the projection are closed with the services.
    if let Some(keep) = keep {
        keep_data(&dir.path().join("data"), keep)?;
        writeln!(
            out,
            "\nthe data directory is kept in {0}: audit it with `leasehold-replay --data {0} verify`",
            keep.display()
        )?;
    }
    drop(dir);
    summary
}

/// Copies the files of the demo's data directory to `to`.
fn keep_data(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))
                .with_context(|| format!("copying {} to {}", entry.path().display(), to.display()))?;
        }
    }
    Ok(())
}

/// The services of one `serve` process, in this process.
struct Services {
    log: Embedded,
    data: PathBuf,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<anyhow::Result<()>>,
    gateway: Gateway,
    /// The operator's view: `http://ADDRESS/ui`.
    ui: String,
    agents: Vec<AgentRun>,
    projector: tokio::task::JoinHandle<anyhow::Result<Projector>>,
}

/// Makes an agent's driver.
pub(crate) type DriverMaker = Box<dyn Fn() -> AnyDriver + Send>;

/// One in-process agent: stopped and started again by the story.
struct AgentRun {
    name: AgentName,
    /// Makes the driver of each start: a new incarnation opens (and locks) its machine anew, so it gets a driver
    /// of its own, never the stopped one's.
    driver: DriverMaker,
    /// The dir driver's root (unused with another driver).
    root: PathBuf,
    control: AgentControl,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), leasehold_agent::Error>>>,
}

impl AgentRun {
    fn start(&mut self, log: &Embedded, shutdown: &CancellationToken) {
        self.control = AgentControl::new();
        self.stop = shutdown.child_token();
        let config = AgentConfig {
            sync_interval: Duration::from_secs(1),
            // The story shows a stray directory reported and destroyed at once; a real agent waits 5 minutes.
            gc_grace: Duration::ZERO,
            control: self.control.clone(),
            ..AgentConfig::new(self.name.clone())
        };
        let driver = (self.driver)();
        self.task = Some(tokio::spawn(leasehold_agent::run(log.clone(), driver, config, self.stop.clone())));
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.context("the agent task")?.with_context(|| format!("agent {} stopped", self.name))?;
        }
        Ok(())
    }
}

impl Services {
    async fn start(dir: &Path, agents: [(String, DriverMaker); 2]) -> anyhow::Result<Services> {
        let data = dir.join("data");
        let log = Embedded::open(&data, PARTITIONS).context("opening the embedded log")?;
        let shutdown = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let mut projector = Projector::open(&data, PARTITIONS).context("opening the projection")?;
        let api = leasehold_gateway::Api::new(
            log.clone(),
            &projector,
            leasehold_gateway::GatewayConfig::default(),
            shutdown.clone(),
        );
        let mut registry = prometheus_client::registry::Registry::default();
        let projection = leasehold_gateway::ProjectionMetrics::register(&mut registry, projector.reader());
        let health = leasehold_gateway::Health {
            roles: vec!["worker".into(), "projector".into(), "gateway".into(), "sweeper".into()],
            registry: Arc::new(registry),
            projection: Some(projection),
            failures: leasehold_gateway::Failures::default(),
            workers: None,
            ready: leasehold_gateway::Readiness::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("listening on 127.0.0.1")?;
        let address = listener.local_addr()?;
        let router = leasehold_gateway::router(api, health);
        let stop = shutdown.clone();
        tasks.spawn(async move { leasehold_gateway::serve(listener, router, stop).await.context("the gateway") });
        let (worker_log, stop) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let report =
                leasehold_worker::run(worker_log, leasehold_worker::WorkerConfig::new("demo-worker"), stop).await;
            anyhow::ensure!(report.stopped.is_empty(), "partitions stopped: {:?}", report.stopped);
            Ok(())
        });
        let (projector_log, stop) = (log.clone(), shutdown.clone());
        let projector = tokio::spawn(async move {
            projector.run(&projector_log, &stop).await.context("the projector")?;
            Ok(projector)
        });
        let (sweeper_log, stop) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let config = leasehold_sweeper::SweeperConfig {
                interval: Duration::from_millis(100),
                retry_after: Duration::from_secs(1),
                ..leasehold_sweeper::SweeperConfig::new("demo")
            };
            let metrics = leasehold_sweeper::SweeperMetrics::default();
            leasehold_sweeper::run(sweeper_log, config, metrics, stop).await.context("the sweeper")
        });
        let mut runs = Vec::new();
        for (name, driver) in agents {
            let mut agent = AgentRun {
                root: dir.join(&name),
                name: AgentName::new(&name).context("an agent name")?,
                driver,
                control: AgentControl::new(),
                stop: CancellationToken::new(),
                task: None,
            };
            agent.start(&log, &shutdown);
            runs.push(agent);
        }
        let gateway = Gateway::new(&format!("http://{address}"))?;
        let ui = format!("http://{address}/ui");
        Ok(Services { log, data, shutdown, tasks, gateway, ui, agents: runs, projector })
    }
}

pub(crate) struct Demo<'o> {
    pub(crate) out: &'o mut (dyn Write + Send),
    services: Services,
    /// Outcomes as the gateway's event feed delivers them.
    feed: mpsc::Receiver<anyhow::Result<SeqOutcome>>,
    printed_through: u64,
    start_ms: Option<u64>,
    pub(crate) summary: Summary,
}

impl<'o> Demo<'o> {
    async fn new(out: &'o mut (dyn Write + Send), services: Services) -> anyhow::Result<Self> {
        let mut events = services.gateway.events(None, Some(1)).await?;
        let (tx, feed) = mpsc::channel(1024);
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if tx.send(event.map_err(anyhow::Error::from)).await.is_err() {
                    return;
                }
            }
        });
        writeln!(out, "leasehold demo: the operator's view is at {} while the demo runs", services.ui)?;
        Ok(Demo { out, services, feed, printed_through: 0, start_ms: None, summary: Summary::default() })
    }

    /// After a story told without a failure, with [`Hold::UntilInterrupted`]: says the services stay up and where,
    /// then waits for Ctrl-C (SIGINT) or SIGTERM. Returns how the story ended, for [`Demo::finish`].
    async fn hold(&mut self, script: anyhow::Result<()>, hold: Hold) -> anyhow::Result<()> {
        if script.is_err() || hold == Hold::No {
            return script;
        }
        writeln!(
            self.out,
            "\n== the story is told; the services stay up until Ctrl-C\n   the operator's view: {}\n   the command \
             line: LEASEHOLD_SERVER={} leasehold ls",
            self.services.ui,
            self.services.ui.trim_end_matches("/ui"),
        )?;
        self.out.flush()?;
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::select! {
            interrupted = tokio::signal::ctrl_c() => interrupted.context("listening for Ctrl-C")?,
            _ = terminate.recv() => {}
        }
        writeln!(self.out, "\n== interrupted: the services stop")?;
        Ok(())
    }

    async fn script(&mut self) -> anyhow::Result<()> {
        writeln!(
            self.out,
            "leasehold demo: the real services on a temporary directory — the embedded log, the writers, the \
             projector, the gateway, and two agents (w1, w2) whose driver makes one directory per resource"
        )?;
        writeln!(self.out, "every line is an outcome: the command, who sent it, and its effects at their positions")?;

        self.chapter("two agents start and register: the position of each registration is its epoch")?;
        for name in ["w1", "w2"] {
            let gateway = self.services.gateway.clone();
            until("agent live", || {
                let gateway = gateway.clone();
                async move { Ok(agent_view(&gateway, name).await?.filter(|a| a.status == "live").map(|_| ())) }
            })
            .await?;
        }
        self.print_through(self.latest().await?).await?;

        self.chapter("a volume is allocated on w1; w1's agent makes its directory and reports it: active")?;
        let volume = self.allocate("w1", "volume").await?;
        self.until_state("w1", volume, "active").await?;
        self.print_through(self.latest().await?).await?;
        self.show_dir("w1", volume)?;

        self.chapter("w2's agent is down; a container is allocated on w2 and a build asks for a lease: it waits")?;
        self.services.agents[1].stop().await?;
        let container = self.allocate("w2", "container").await?;
        let lease = LeaseId::generate();
        let acquired = self
            .submit(
                "op:build-42",
                Acquire {
                    agent: name("w2"),
                    resource: container,
                    lease,
                    holder: "build-42".to_owned(),
                    ttl: Some(Millis::from_mins(30)),
                    wait_timeout: None,
                    priority: 0,
                },
            )
            .await?;
        let waited = acquired.outcomes.iter().any(|o| {
            o.outcome.effects().iter().any(|e| matches!(e, Effect::LeaseWaiting { lease: l, .. } if *l == lease))
        });
        self.print_through(self.latest().await?).await?;

        self.chapter("w2's agent starts again (a new incarnation): it makes the container, the lease is granted")?;
        let (log, shutdown) = (self.services.log.clone(), self.services.shutdown.clone());
        self.services.agents[1].start(&log, &shutdown);
        let lease_ref = format!("w2.{lease}");
        let gateway = self.services.gateway.clone();
        let granted = until("the lease granted", || {
            let (lease_ref, gateway) = (lease_ref.clone(), gateway.clone());
            async move {
                let lease: Option<LeaseView> = gateway.get(&["v1", "leases", &lease_ref], &[]).await?;
                Ok(lease.filter(|l| l.state == "active"))
            }
        })
        .await?;
        self.summary.lease_waited_then_granted = waited && granted.token.is_some();
        self.print_through(self.latest().await?).await?;
        writeln!(self.out, "   lease {} is active, token {}", granted.id, granted.token.unwrap_or_default())?;

        self.chapter("the web UI and the CLI release the volume at once: one release, one no-op on record")?;
        let release = |issuer: &'static str, from: &'static str| {
            self.submit(issuer, Release { agent: name("w1"), resource: volume, reason: Some(format!("from {from}")) })
        };
        let (first, second) = tokio::join!(release("op:alice", "the web UI"), release("op:bob", "the CLI"));
        let (first, second) = (first?, second?);
        let releasing = |s: &CommandStatus| {
            s.outcomes.iter().any(|o| o.outcome.effects().iter().any(|e| matches!(e, Effect::ResourceReleasing { .. })))
        };
        self.summary.double_release_one_noop = releasing(&first) != releasing(&second);
        self.print_through(self.latest().await?).await?;

        self.chapter("w1's agent removes the directory and its next report says so: destroyed")?;
        self.services.agents[0].control.sync_now();
        self.until_state("w1", volume, "destroyed").await?;
        self.print_through(self.latest().await?).await?;

        self.chapter("someone deletes a volume's directory behind leasehold's back: lost at the next report")?;
        let doomed = self.allocate("w1", "volume").await?;
        self.until_state("w1", doomed, "active").await?;
        std::fs::remove_dir_all(self.dir_of("w1", doomed)).context("deleting a directory")?;
        writeln!(self.out, "   (rm -r {})", self.dir_of("w1", doomed).display())?;
        self.services.agents[0].control.sync_now();
        self.until_state("w1", doomed, "lost").await?;
        self.summary.lost_detected = true;
        self.print_through(self.latest().await?).await?;

        self.chapter("a directory nobody allocated appears on w1: its agent reports it, the log orders it destroyed")?;
        let stray = ResourceId::generate();
        std::fs::create_dir_all(self.dir_of("w1", stray)).context("making a stray directory")?;
        writeln!(self.out, "   (mkdir {})", self.dir_of("w1", stray).display())?;
        self.services.agents[0].control.sync_now();
        let stray_dir = self.dir_of("w1", stray);
        until("the stray directory removed", || {
            let stray_dir = stray_dir.clone();
            async move { Ok((!stray_dir.exists()).then_some(())) }
        })
        .await?;
        self.summary.garbage_destroyed = true;
        self.print_through(self.latest().await?).await?;
        writeln!(self.out, "   the agent removed {}, as ordered, and said so", timeline::short(stray))?;

        self.pools().await?;

        self.chapter("six more volumes on w1; then its driver suddenly lists nothing (a flaky driver)")?;
        let mut volumes = Vec::new();
        for _ in 0..6 {
            volumes.push(self.allocate("w1", "volume").await?);
        }
        for id in &volumes {
            self.until_state("w1", *id, "active").await?;
        }
        self.print_through(self.latest().await?).await?;
        let root = self.services.agents[0].root.clone();
        let away = root.with_extension("hidden");
        let hidden = move_handles(&root, &away).context("moving w1's directories away")?;
        writeln!(self.out, "   (mv {}/<{hidden} resource directories> {}/)", root.display(), away.display())?;
        self.services.agents[0].control.sync_now();
        self.until_agent("w1", "suspect").await?;
        self.summary.breaker_tripped = true;
        let mut still_active = true;
        for id in &volumes {
            still_active &= self.resource("w1", *id).await?.is_some_and(|r| r.state == "active");
        }
        self.summary.nothing_lost_by_breaker = still_active;
        self.print_through(self.latest().await?).await?;

        self.chapter("the driver sees them again: the next report shows the handles, the breaker clears")?;
        move_handles(&away, &root).context("moving w1's directories back")?;
        writeln!(self.out, "   (mv {}/* {}/)", away.display(), root.display())?;
        self.services.agents[0].control.sync_now();
        self.until_agent("w1", "live").await?;
        self.print_through(self.latest().await?).await?;
        Ok(())
    }

    /// The pool chapter: a /30 (two addresses), two containers holding both, a third waiting; one released, its
    /// address held until the agent confirms the destroy, then cooling down, then handed to the third.
    async fn pools(&mut self) -> anyhow::Result<()> {
        self.chapter(&format!(
            "a pool of IP addresses, 10.0.0.0/30: two usable; a freed address cools down {} before reuse",
            humantime::format_duration(POOL_COOLDOWN)
        ))?;
        let pool = PoolName::new("net").expect("a valid pool name");
        let kind = PoolKind::Ipv4 { network: std::net::Ipv4Addr::new(10, 0, 0, 0), prefix_len: 30, exclude: vec![] };
        let cooldown = Some(Millis(POOL_COOLDOWN.as_millis() as u64));
        self.submit(
            "op:netops",
            DefinePool { pool: pool.clone(), kind, cooldown, orphans: leasehold_schemas::pool::OrphanPolicy::Release },
        )
        .await?;
        self.print_through(self.latest().await?).await?;

        self.chapter("two containers on w2 take both addresses; a third waits for one")?;
        let mut held = Vec::new();
        for _ in 0..2 {
            let id = self.allocate_with("w2", "container", vec![pool.clone()]).await?;
            let view = self.until_state("w2", id, "active").await?;
            held.push((id, bound(&view).context("an active container holds its address")?));
        }
        let third = self.allocate_with("w2", "container", vec![pool.clone()]).await?;
        let gateway = self.services.gateway.clone();
        until("the third container queued", || {
            let gateway = gateway.clone();
            async move {
                let pools: Vec<leasehold_projector::PoolView> =
                    gateway.get(&["v1", "pools"], &[]).await?.unwrap_or_default();
                Ok(pools.into_iter().find(|p| p.name == "net" && p.waiting == 1).map(|_| ()))
            }
        })
        .await?;
        self.print_through(self.latest().await?).await?;

        self.chapter("the first is released: its address stays held until w2's agent has destroyed it")?;
        let (first, address) = held[0].clone();
        self.submit("op:ci-scheduler", Release { agent: name("w2"), resource: first, reason: Some("job done".into()) })
            .await?;
        self.services.agents[1].control.sync_now();
        let view = self.until_state("w2", third, "active").await?;
        let reused = bound(&view).context("the third container holds an address")?;
        self.print_through(self.latest().await?).await?;
        writeln!(self.out, "   the third container has {reused}, the address the first one had ({address})")?;
        self.summary.address_reused_after_cooldown =
            reused == address && self.cooled_before_reuse(first, third).await?;
        Ok(())
    }

    /// True when, in the log, `released`'s address was freed only after it was destroyed, and granted to `next`
    /// only a cool-down after it was freed.
    async fn cooled_before_reuse(&self, released: ResourceId, next: ResourceId) -> anyhow::Result<bool> {
        let outcomes = self.services.log.read_outcomes(&leasehold_log::OutcomeFilter::All, 1, usize::MAX).await?;
        let (mut destroyed, mut freed, mut granted) = (None, None, None);
        for stored in &outcomes {
            let outcome = leasehold_schemas::codec::decode_outcome(&stored.payload)?;
            for effect in outcome.effects() {
                match effect {
                    Effect::ResourceDestroyed { resource, .. } if *resource == released => {
                        destroyed = Some((stored.seq, outcome.decided_at));
                    }
                    Effect::ClaimFreed { holder, .. } if holder.resource == released => {
                        freed = Some((stored.seq, outcome.decided_at));
                    }
                    Effect::ClaimGranted { holder, .. } if holder.resource == next => {
                        granted = Some((stored.seq, outcome.decided_at));
                    }
                    _ => {}
                }
            }
        }
        Ok(match (destroyed, freed, granted) {
            (Some(d), Some(f), Some(g)) => {
                d.0 < f.0 && f.0 < g.0 && g.1.since(f.1).0 >= POOL_COOLDOWN.as_millis() as u64
            }
            _ => false,
        })
    }

    /// Stops everything, folds the log again from scratch and compares the read models; prints the end.
    pub(crate) async fn finish(&mut self, script: anyhow::Result<()>) -> anyhow::Result<Summary> {
        for agent in &mut self.services.agents {
            agent.stop.cancel();
        }
        self.services.shutdown.cancel();
        let mut failures = Vec::new();
        for agent in &mut self.services.agents {
            if let Err(e) = agent.stop().await {
                failures.push(format!("{e:#}"));
            }
        }
        while let Some(joined) = self.services.tasks.join_next().await {
            if let Err(e) = joined.context("a service task").and_then(|r| r) {
                failures.push(format!("{e:#}"));
            }
        }
        let mut projector = (&mut self.services.projector).await.context("the projector task")??;
        // The agents' last reports may have landed as the projector stopped: it applies the rest of the log first.
        projector.catch_up(&self.services.log).await?;
        script?;
        if !failures.is_empty() {
            bail!("the services failed: {}", failures.join("; "));
        }
        let outcomes = self.services.log.read_outcomes(&leasehold_log::OutcomeFilter::All, 1, usize::MAX).await?;
        self.summary.n_outcomes = outcomes.len();
        self.summary.n_rejected = outcomes
            .iter()
            .filter(|o| leasehold_schemas::codec::decode_outcome(&o.payload).is_ok_and(|o| o.rejection().is_some()))
            .count();
        let mut fresh = Projector::in_memory(PARTITIONS)?;
        fresh.catch_up(&self.services.log).await?;
        self.summary.refold_matches = fresh.digests()? == projector.digests()?;
        self.chapter("the end")?;
        writeln!(
            self.out,
            "   {} outcomes ({} rejected, each on record with its reason); folding them from scratch gives the same \
             read models: {}",
            self.summary.n_outcomes,
            self.summary.n_rejected,
            if self.summary.refold_matches { "yes" } else { "NO" }
        )?;
        writeln!(
            self.out,
            "   the data directory was {} (removed at exit; `--keep DIR` keeps a copy to audit); `leasehold serve` keeps one running",
            self.services.data.display()
        )?;
        Ok(self.summary.clone())
    }

    // --- through the command line's client ---------------------------------------------------------------------

    pub(crate) async fn submit(&self, issuer: &str, body: impl Into<Command>) -> anyhow::Result<CommandStatus> {
        let envelope = Envelope::new(CommandId::generate(), Issuer::new(issuer)?, now(), body);
        let status = self.services.gateway.submit(&envelope, PATIENCE).await?;
        match status.status.as_str() {
            "accepted" | "rejected" => Ok(status),
            other => bail!("command {} ({}) is {other}", envelope.command_id, envelope.type_name()),
        }
    }

    async fn allocate(&self, agent: &str, kind: &str) -> anyhow::Result<ResourceId> {
        self.allocate_with(agent, kind, Vec::new()).await
    }

    async fn allocate_with(&self, agent: &str, kind: &str, pools: Vec<PoolName>) -> anyhow::Result<ResourceId> {
        let resource = ResourceId::generate();
        let status = self
            .submit(
                "op:ci-scheduler",
                Allocate {
                    agent: name(agent),
                    resource,
                    kind: kind.to_owned(),
                    capacity: 1,
                    attributes: [("team".to_owned(), "infra".to_owned())].into(),
                    parent: None,
                    pools,
                    wait: None,
                },
            )
            .await?;
        if let Some(rejection) = status.rejection {
            bail!("the allocation on {agent} was rejected: {}: {}", rejection.kind, rejection.message);
        }
        Ok(resource)
    }

    pub(crate) async fn resource(&self, agent: &str, id: ResourceId) -> anyhow::Result<Option<ResourceView>> {
        Ok(self.services.gateway.get(&["v1", "resources", &format!("{agent}.{id}")], &[]).await?)
    }

    pub(crate) async fn until_agent(&self, name: &str, status: &str) -> anyhow::Result<AgentView> {
        let gateway = self.services.gateway.clone();
        until(&format!("{name} {status}"), || {
            let gateway = gateway.clone();
            async move { Ok(agent_view(&gateway, name).await?.filter(|a| a.status == status)) }
        })
        .await
    }

    pub(crate) async fn until_state(&self, agent: &str, id: ResourceId, state: &str) -> anyhow::Result<ResourceView> {
        let gateway = self.services.gateway.clone();
        until(&format!("{} {state}", timeline::short(id)), || {
            let gateway = gateway.clone();
            async move {
                let found: Option<ResourceView> =
                    gateway.get(&["v1", "resources", &format!("{agent}.{id}")], &[]).await?;
                Ok(found.filter(|r| r.state == state))
            }
        })
        .await
    }

    /// The projection's last applied sequence: everything up to it can be printed.
    pub(crate) async fn latest(&self) -> anyhow::Result<u64> {
        #[derive(serde::Deserialize)]
        struct Healthz {
            applied: Option<u64>,
        }
        let health: Option<Healthz> = self.services.gateway.get(&["healthz"], &[]).await?;
        Ok(health.and_then(|h| h.applied).unwrap_or(0))
    }

    /// Asks the `n`th agent for a sync pass now.
    pub(crate) fn sync(&self, n: usize) {
        self.services.agents[n].control.sync_now();
    }

    /// The command line's client of the demo's gateway.
    pub(crate) fn gateway(&self) -> Gateway {
        self.services.gateway.clone()
    }

    // --- printing -----------------------------------------------------------------------------------------------

    pub(crate) fn chapter(&mut self, title: &str) -> anyhow::Result<()> {
        writeln!(self.out, "\n== {title}")?;
        Ok(())
    }

    /// Prints the outcomes of the feed up to sequence `seq`, leaving out the routine ones (heartbeats, reports that
    /// change nothing).
    pub(crate) async fn print_through(&mut self, seq: u64) -> anyhow::Result<()> {
        while self.printed_through < seq {
            let next = tokio::time::timeout(PATIENCE, self.feed.recv())
                .await
                .context("waiting for the event feed")?
                .context("the event feed ended")??;
            self.printed_through = next.seq;
            let outcome = &next.outcome;
            if routine(outcome) {
                continue;
            }
            let start = *self.start_ms.get_or_insert(outcome.log_time.0);
            let at = outcome.log_time.0.saturating_sub(start) as f64 / 1000.0;
            for line in timeline::lines(outcome, at) {
                writeln!(self.out, "{line}")?;
            }
        }
        Ok(())
    }

    fn dir_of(&self, agent: &str, id: ResourceId) -> PathBuf {
        let root = &self.services.agents.iter().find(|a| a.name.as_str() == agent).expect("a demo agent").root;
        root.join(id.to_string())
    }

    fn show_dir(&mut self, agent: &str, id: ResourceId) -> anyhow::Result<()> {
        let dir = self.dir_of(agent, id);
        writeln!(self.out, "   ({} {})", dir.display(), if dir.is_dir() { "exists" } else { "is MISSING" })?;
        Ok(())
    }
}

/// The address (or slot) a resource's first bound claim holds.
pub(crate) fn bound(view: &ResourceView) -> Option<String> {
    view.claims.iter().find(|c| c.status == "bound").and_then(|c| c.id.clone())
}

/// Moves the resource directories (named by resource ids) of `from` into `to`; how many.
fn move_handles(from: &Path, to: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(to)?;
    let mut moved = 0;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_name().to_str().is_some_and(|name| name.parse::<ResourceId>().is_ok()) {
            std::fs::rename(entry.path(), to.join(entry.file_name()))?;
            moved += 1;
        }
    }
    Ok(moved)
}

pub(crate) async fn agent_view(gateway: &Gateway, name: &str) -> anyhow::Result<Option<AgentView>> {
    let agents: Vec<AgentView> = gateway.get(&["v1", "agents"], &[]).await?.unwrap_or_default();
    Ok(agents.into_iter().find(|a| a.name == name))
}

/// Asks `check` until it answers something, for at most [`PATIENCE`] (the services work on their own: the demo
/// looks at what they did).
pub(crate) async fn until<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("waited {PATIENCE:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Heartbeats and reports that only say "seen": every agent sends them all the time.
fn routine(outcome: &leasehold_schemas::Outcome) -> bool {
    let quiet = |e: &Effect| matches!(e, Effect::AgentSeen { .. } | Effect::ObservationAccepted { .. });
    matches!(outcome.command.type_name.as_str(), "agent.heartbeat" | "agent.sync")
        && outcome.rejection().is_none()
        && outcome.effects().iter().all(quiet)
}

pub(crate) fn name(agent: &str) -> AgentName {
    AgentName::new(agent).expect("the demo's agent names are valid")
}

fn now() -> Timestamp {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same services on real containers: addresses `docker inspect` shows, a loss, garbage, an exit, a missing
    /// image, and nothing left on the daemon. Needs the Docker daemon: under `CI=true` one that does not answer
    /// fails the test; elsewhere it is skipped, saying so.
    #[test]
    fn the_docker_demo_tells_the_story_on_real_containers_and_leaves_nothing() {
        let daemon = std::process::Command::new("docker").arg("info").output().is_ok_and(|o| o.status.success());
        if !daemon {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI=true and the docker daemon does not answer");
            eprintln!("skipped: the docker daemon does not answer (docker info failed)");
            return;
        }
        let mut out = Vec::new();
        let summary = run(&mut out, None, DemoDriver::Docker, Hold::No);
        let text = String::from_utf8(out).unwrap();
        let summary = summary.unwrap_or_else(|e| panic!("{e:#}\n{text}"));
        assert!(summary.addresses_real, "{text}");
        assert!(summary.lost_detected && summary.garbage_destroyed, "{text}");
        assert!(summary.exit_released && summary.missing_image_failed, "{text}");
        assert!(summary.nothing_left && summary.refold_matches, "{text}");
        for line in ["leasehold granted", "docker rm -f", "leasehold never pulls", "on the daemon: nothing left"] {
            assert!(text.contains(line), "the timeline lacks {line:?}:\n{text}");
        }
    }

    #[test]
    fn the_demo_runs_the_real_services_and_tells_the_whole_story() {
        let mut out = Vec::new();
        let summary = run(&mut out, None, DemoDriver::Dir, Hold::No).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(summary.lease_waited_then_granted, "{text}");
        assert!(summary.double_release_one_noop, "{text}");
        assert!(summary.lost_detected && summary.garbage_destroyed, "{text}");
        assert!(summary.breaker_tripped && summary.nothing_lost_by_breaker, "{text}");
        assert!(summary.address_reused_after_cooldown, "{text}");
        assert!(summary.refold_matches, "{text}");
        for line in [
            "leasehold demo: the operator's view is at http://127.0.0.1:",
            "/ui while the demo runs",
            "agent registered: this position is its epoch",
            "waits on pending",
            "rejected: already-done: resource w1.",
            "LOST (missing in",
            "the agent removed",
            "CIRCUIT BREAKER",
            "queued: nothing free right now",
            "freed: cooling down before reuse",
            "the third container has 10.0.0.1, the address the first one had (10.0.0.1)",
            "breaker cleared: the handles are back",
            "folding them from scratch gives the same read models: yes",
        ] {
            assert!(text.contains(line), "the timeline lacks {line:?}:\n{text}");
        }
        // The agents report honestly: a full resync can be asked for when a report crosses a change in flight (the
        // writer judges a report against its state when it decides it), never over and over.
        assert!(text.matches("full resync").count() <= 1, "resyncs over and over:\n{text}");
    }
}
