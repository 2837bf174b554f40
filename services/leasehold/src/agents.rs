//! Agents: `leasehold agent run` (one agent process on its own machine, over NATS) and the agents `serve` runs in
//! its own process (`--agent NAME=DRIVER`, how agents run on one machine over the embedded log).

use std::time::Duration;

use anyhow::Context;
use leasehold_agent::{AgentConfig, AgentControl, AnyDriver};
use leasehold_log::Log;
use leasehold_schemas::ids::{AgentName, Millis};
use leasehold_schemas::settings::AgentSettings;
use tokio_util::sync::CancellationToken;

/// `NAME=DRIVER`, as `serve --agent` takes it.
pub(crate) fn parse_agent(spec: &str) -> anyhow::Result<(AgentName, AnyDriver)> {
    let (name, driver) = spec
        .split_once('=')
        .with_context(|| format!("--agent {spec:?}: an agent is given as NAME=DRIVER, e.g. w1=dir:/var/lib/w1"))?;
    let name = AgentName::new(name).with_context(|| format!("--agent {spec:?}"))?;
    let driver = leasehold_agent::parse_driver(driver).with_context(|| format!("--agent {spec:?}"))?;
    Ok((name, driver))
}

/// The agents `serve` was given, checked before anything starts: each spec, and each name once. `env_file_dir`
/// (`--env-file-dir`) goes to each docker agent; it is refused when none is one.
pub(crate) fn parse_all(
    specs: &[String],
    env_file_dir: Option<&std::path::Path>,
) -> anyhow::Result<Vec<(AgentName, AnyDriver)>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut agents = specs.iter().map(|spec| parse_agent(spec)).collect::<anyhow::Result<Vec<_>>>()?;
    for (name, _) in &agents {
        anyhow::ensure!(seen.insert(name.clone()), "--agent {name} is given twice: one process per agent");
    }
    if let Some(dir) = env_file_dir {
        anyhow::ensure!(
            agents.iter().any(|(_, driver)| matches!(driver, AnyDriver::Docker(_))),
            "--env-file-dir is for docker agents (--agent NAME=docker:), and this process runs none"
        );
        agents = agents
            .into_iter()
            .map(|(name, driver)| match driver {
                AnyDriver::Docker(_) => driver
                    .with_env_file_dir(dir)
                    .map(|driver| (name, driver))
                    .map_err(|why| anyhow::anyhow!("--env-file-dir: {why}")),
                other => Ok((name, other)),
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(agents)
}

/// How long an agent's own drain may take on shutdown (its calls running, then what it has to send): at most half
/// the process's `--shutdown-grace`, so the drain ends before the process gives up on it.
fn drain_grace(config: &AgentConfig, process_grace: Duration) -> Duration {
    config.shutdown_grace.min(process_grace / 2)
}

/// What an agent does with garbage (`--gc`, `--gc-grace`), for `agent run` and `serve`'s agents alike.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct GcArgs {
    /// What the agent does with handles on its machine that are no live resource: `destroy` reports them and
    /// destroys each once the log orders it (on record), `dry-run` reports them and destroys nothing (the log records
    /// what would have been ordered). The policy's `gc` (`leasehold policy set --gc`) can make every agent dry-run.
    #[arg(long, default_value = "destroy", value_name = "destroy|dry-run")]
    gc: leasehold_schemas::settings::GcMode,
    /// A handle of no resource the log knows is reported only once it has been on the machine this long (something
    /// may be making it right now); handles of resources that left are reported at once.
    #[arg(long, default_value = "5min", value_parser = humantime::parse_duration)]
    gc_grace: Duration,
}

impl GcArgs {
    fn apply(&self, config: &mut AgentConfig) {
        config.gc_dry_run = self.gc == leasehold_schemas::settings::GcMode::DryRun;
        config.gc_grace = self.gc_grace;
    }
}

/// The labels (`--agent-label NAME:K=V`) and capacity (`--agent-capacity NAME:KIND=N`) `serve`'s flags declare
/// for its agents, by agent name.
pub(crate) struct Declared<'a> {
    pub(crate) labels: &'a [(String, (String, String))],
    pub(crate) capacity: &'a [(String, Vec<(String, u32)>)],
}

/// The agents `serve` runs, configured: their status can be asked (for `/readyz`) before they start; each declares
/// what `declared` gives it.
pub(crate) fn configure(
    agents: Vec<(AgentName, AnyDriver)>,
    sync_interval: Duration,
    gc: &GcArgs,
    process_grace: Duration,
    declared: &Declared<'_>,
) -> Vec<(AnyDriver, AgentConfig)> {
    agents
        .into_iter()
        .map(|(name, driver)| {
            let mine = |agent: &String| agent == name.as_str();
            let labels = declared.labels.iter().filter(|(n, _)| mine(n)).map(|(_, label)| label.clone()).collect();
            let capacity =
                declared.capacity.iter().filter(|(n, _)| mine(n)).flat_map(|(_, c)| c.iter().cloned()).collect();
            let mut config = AgentConfig { sync_interval, labels, capacity, ..AgentConfig::new(name) };
            gc.apply(&mut config);
            config.shutdown_grace = drain_grace(&config, process_grace);
            (driver, config)
        })
        .collect()
}

/// What an agent has not finished, when a stop is cut short.
fn unfinished(control: &AgentControl) -> String {
    let calls = control.status().n_in_flight;
    format!("{calls} driver call(s) running; what it had not reported it observes again at its next pass")
}

/// Starts `agents` once `start` holds true (the policy this process seeds is stored: an agent registered before it
/// would pace its heartbeats by the defaults), each until `shutdown`.
pub(crate) fn spawn_all<L: Log>(
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    running: &crate::stop::Running,
    log: &L,
    agents: Vec<(AnyDriver, AgentConfig)>,
    start: &tokio::sync::watch::Receiver<bool>,
    shutdown: &CancellationToken,
) {
    for (driver, config) in agents {
        let name = config.name.clone();
        println!("agent {name}: {driver}, reporting every {}", humantime::format_duration(config.sync_interval));
        let (log, shutdown, mut start) = (log.clone(), shutdown.clone(), start.clone());
        let control = config.control.clone();
        let detail: crate::stop::Detail = std::sync::Arc::new(move || Some(unfinished(&control)));
        running.spawn_with(tasks, format!("agent {name}"), Some(detail), async move {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                started = start.wait_for(|go| *go) => if started.is_err() { return Ok(()) },
            }
            leasehold_agent::run(log, driver, config, shutdown).await.with_context(|| format!("agent {name} stopped"))
        });
    }
}

/// `w1:zone=a`: a label of one of `serve`'s agents.
pub(crate) fn parse_agent_label(text: &str) -> Result<(String, (String, String)), String> {
    let (name, label) = text.split_once(':').ok_or_else(|| format!("{text:?} is not NAME:LABEL=VALUE"))?;
    Ok((name.to_owned(), crate::produce::parse_attr(label)?))
}

/// `w1:volume=10,container=4`: the capacity of one of `serve`'s agents.
pub(crate) fn parse_agent_capacity(text: &str) -> Result<(String, Vec<(String, u32)>), String> {
    let (name, capacity) = text.split_once(':').ok_or_else(|| format!("{text:?} is not NAME:KIND=N[,KIND=N...]"))?;
    Ok((name.to_owned(), parse_capacity(capacity)?))
}

/// Refuses a `--agent-label` or `--agent-capacity` of an agent this process does not run.
pub(crate) fn check_declared(
    agents: &[(AgentName, AnyDriver)],
    labels: &[(String, (String, String))],
    capacity: &[(String, Vec<(String, u32)>)],
) -> anyhow::Result<()> {
    let named =
        labels.iter().map(|(n, _)| ("--agent-label", n)).chain(capacity.iter().map(|(n, _)| ("--agent-capacity", n)));
    for (flag, name) in named {
        anyhow::ensure!(
            agents.iter().any(|(agent, _)| agent.as_str() == name),
            "{flag} {name}:...: this process runs no agent {name:?} (give it with --agent {name}=DRIVER)"
        );
    }
    Ok(())
}

/// `container=50,volume=200`: a capacity per kind.
fn parse_capacity(text: &str) -> Result<Vec<(String, u32)>, String> {
    text.split(',')
        .map(|part| match part.split_once('=') {
            Some((kind, n)) if !kind.is_empty() => {
                n.trim().parse::<u32>().map(|n| (kind.trim().to_owned(), n)).map_err(|e| format!("{part:?}: {e}"))
            }
            _ => Err(format!("{part:?} is not KIND=N")),
        })
        .collect()
}

/// True when `error` is an in-process agent that stopped because its driver cannot reach its machine's resources
/// (its root cannot be made, opened or locked): one machine's disk, not the process, so `/healthz` names it without
/// failing.
pub(crate) fn stopped_for_its_machine(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<leasehold_agent::Error>(), Some(leasehold_agent::Error::Driver { .. }))
}

#[derive(Debug, clap::Args)]
pub(crate) struct AgentRunArgs {
    /// The agent's name: the machine it runs on (`[a-z0-9][a-z0-9_-]{0,62}`).
    #[arg(long)]
    name: String,
    /// What makes and destroys its resources: dir:PATH (one directory per resource under PATH), or
    /// docker:[unix:///SOCKET|tcp://127.0.0.1:PORT] (containers and volumes on a Docker daemon; `docker:` alone is
    /// the local socket).
    #[arg(long)]
    driver: String,
    /// docker: only. The directory whose files a container's `env-file` attribute may name, by a path relative to
    /// it (symlinks and `..` cannot lead out). Without it no env file is read: the attribute is a producer's, and
    /// the agent would read any file of its machine (its own NATS credentials) into a container the producer runs.
    #[arg(long, value_name = "DIR")]
    env_file_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    nats: crate::nats_args::NatsArgs,
    /// The log's partition count. With it, the agent connects as its restricted user would (its own commands,
    /// its own outcome subject, nothing else: what `leasehold agent credentials` allows); without it, it reads the
    /// count from the streams, which its restricted user may not.
    #[arg(long)]
    partitions: Option<u32>,
    /// How often it reports what it holds (±20 % jitter).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    /// At most this many driver calls at once.
    #[arg(long, default_value_t = 5)]
    max_in_flight: usize,
    /// A driver call that takes longer is given up and tried again later. The default, 60 s, outlasts the docker
    /// driver's slowest call, a destroy: a stop that lets the container stop for 10 s before killing it, then the
    /// removal, each request under a client timeout of its own (30 s beyond the stop timeout).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    call_timeout: Duration,
    /// This machine's disk was wiped: losing everything it held is expected, not a fault for the breaker.
    #[arg(long)]
    wiped: bool,
    /// A label placement may select this agent by (`--label zone=a`; repeatable), declared at each registration.
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = crate::produce::parse_attr)]
    labels: Vec<(String, String)>,
    /// How many resources of a kind it takes, from pending to releasing (`--capacity container=50,volume=200`;
    /// repeatable): an allocation of that kind past it is refused. A kind not named is not limited.
    #[arg(long, value_name = "KIND=N[,KIND=N...]", value_parser = parse_capacity)]
    capacity: Vec<Vec<(String, u32)>>,
    #[command(flatten)]
    gc: GcArgs,
    #[command(flatten)]
    settings: AgentSettingsFlags,
    #[command(flatten)]
    stop: crate::stop::GraceArgs,
}

/// Settings of this agent alone. Without any, it follows the cluster policy (`leasehold policy show`), as that
/// changes; with any, it registers settings of its own: the ones given, the defaults for the others (not the
/// policy's: its settings no longer follow the policy at all).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub(crate) struct AgentSettingsFlags {
    /// This agent's own: no heartbeat for this long and it is stalled.
    #[arg(long, value_name = "DURATION", value_parser = crate::produce::parse_millis)]
    stall_after: Option<Millis>,
    /// This agent's own: no heartbeat for this long and it is gone (its resources orphaned).
    #[arg(long, value_name = "DURATION", value_parser = crate::produce::parse_millis)]
    orphan_after: Option<Millis>,
    /// This agent's own: a pending resource not created within this long is released.
    #[arg(long, value_name = "DURATION", value_parser = crate::produce::parse_millis)]
    create_timeout: Option<Millis>,
    /// This agent's own loss breaker: at least N losses and more than PCT % of its live resources.
    #[arg(long, value_name = "N/PCT", value_parser = crate::policy::parse_max_loss)]
    max_loss: Option<(u32, u8)>,
    /// This agent's own loss breaker window.
    #[arg(long, value_name = "DURATION", value_parser = crate::produce::parse_millis)]
    loss_window: Option<Millis>,
}

impl AgentSettingsFlags {
    /// The settings to register with: `None` (follow the policy) when no flag is given. Nonsense is refused.
    fn settings(&self) -> anyhow::Result<Option<AgentSettings>> {
        if *self == AgentSettingsFlags::default() {
            return Ok(None);
        }
        let defaults = AgentSettings::DEFAULT;
        let (max_loss_min, max_loss_percent) =
            self.max_loss.unwrap_or((defaults.max_loss_min, defaults.max_loss_percent));
        let settings = AgentSettings {
            max_loss_min,
            max_loss_percent,
            loss_window: self.loss_window.unwrap_or(defaults.loss_window),
            create_timeout: self.create_timeout.unwrap_or(defaults.create_timeout),
            stall_after: self.stall_after.unwrap_or(defaults.stall_after),
            orphan_after: self.orphan_after.unwrap_or(defaults.orphan_after),
        };
        settings
            .check()
            .map_err(|problem| crate::policy::BadCommandLine(format!("the agent's settings: {problem}")))?;
        Ok(Some(settings))
    }
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum AgentCmd {
    /// Run the agent of this machine: follow its outcomes, make and destroy its resources, report what it holds.
    Run(AgentRunArgs),
    /// Print the NATS user of an agent: it may publish only its own commands and read only its own outcomes.
    Credentials(crate::credentials::CredentialsArgs),
    /// Take an agent out of service: nothing new is placed on it, and everything it holds is released (refused
    /// while a resource holds a lease, unless --yes; --dry-run shows what it would release).
    Retire(crate::produce::RetireArgs),
    /// Cordon an agent and release what it holds as it falls idle: each resource once it has held no lease for the
    /// grace, and whatever is left at the deadline (`agent uncordon` ends the drain).
    Drain(crate::produce::DrainArgs),
    /// Confirm that a suspect agent (its loss breaker tripped; see `leasehold agents`) really lost what it reported
    /// missing: the losses are marked after a full resync.
    ConfirmLoss(crate::produce::AgentNameArgs),
    /// Bring a retired agent back into service, on record (retirement is sticky: registering again does not end it).
    Unretire(crate::produce::AgentNameArgs),
    /// Stop new allocations on an agent, on record: what it holds, and its leases, go on (sticky until uncordon).
    Cordon(crate::produce::CordonArgs),
    /// Let a cordoned agent take new allocations again, on record.
    Uncordon(crate::produce::AgentNameArgs),
}

pub(crate) fn run(cmd: AgentCmd) -> anyhow::Result<()> {
    let args = match cmd {
        AgentCmd::Run(args) => args,
        AgentCmd::Credentials(args) => return crate::credentials::agent(args),
        AgentCmd::Retire(_)
        | AgentCmd::Drain(_)
        | AgentCmd::ConfirmLoss(_)
        | AgentCmd::Unretire(_)
        | AgentCmd::Cordon(_)
        | AgentCmd::Uncordon(_) => {
            anyhow::bail!(
                "only `agent run` runs a process; retire, unretire, cordon, drain, uncordon and confirm-loss are sent \
                 as commands"
            )
        }
    };
    let name = AgentName::new(args.name.as_str()).context("--name")?;
    let settings = args.settings.settings()?;
    let mut driver = leasehold_agent::parse_driver(&args.driver)?;
    if let Some(dir) = &args.env_file_dir {
        driver = driver.with_env_file_dir(dir).map_err(|why| anyhow::anyhow!("--env-file-dir: {why}"))?;
    }
    // An agent never creates the log. Given the partition count, it connects as its restricted user may; else it
    // reads the count of the log `serve` made.
    let config = args.nats.config(args.partitions.unwrap_or(0)).context(
        "an agent process needs --nats URL (on one machine, run agents inside serve with --agent NAME=dir:PATH)",
    )?;
    if args.partitions == Some(0) {
        anyhow::bail!("--partitions: a log has at least one partition");
    }
    let config = leasehold_log::jetstream::JetStreamConfig {
        agent: args.partitions.map(|_| name.as_str().to_owned()),
        inbox_prefix: config.inbox_prefix.clone().or_else(|| Some(crate::credentials::inbox_prefix(name.as_str()))),
        ..config
    };
    let grace = args.stop.shutdown_grace;
    let mut config_for_agent = AgentConfig {
        sync_interval: args.sync_interval,
        max_in_flight: args.max_in_flight,
        call_timeout: args.call_timeout,
        wiped: args.wiped,
        settings,
        labels: args.labels.iter().cloned().collect(),
        capacity: args.capacity.iter().flatten().cloned().collect(),
        ..AgentConfig::new(name.clone())
    };
    config_for_agent.shutdown_grace = drain_grace(&config_for_agent, grace);
    args.gc.apply(&mut config_for_agent);
    let control = config_for_agent.control.clone();
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let url = config.url.clone();
    let unfinished = {
        let (name, url, connected) = (name.clone(), url.clone(), connected.clone());
        move || {
            vec![if connected.load(std::sync::atomic::Ordering::Acquire) {
                format!("agent {name}: {}", unfinished(&control))
            } else {
                format!("connecting to NATS at {url}")
            }]
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = crate::stop::on_signals(shutdown.clone(), "leasehold agent run", grace, unfinished.clone());
        let signals = tokio::spawn(signals);
        let work = async {
            let log = leasehold_log::jetstream::JetStream::connect(config)
                .await
                .with_context(|| format!("connecting to NATS at {url}"))?;
            connected.store(true, std::sync::atomic::Ordering::Release);
            println!(
                "agent {name}: {driver} over NATS JetStream at {url}, reporting every {}",
                humantime::format_duration(args.sync_interval)
            );
            leasehold_agent::run(log, driver, config_for_agent, shutdown.clone())
                .await
                .with_context(|| format!("agent {name} stopped"))?;
            println!("agent {name}: stopped");
            anyhow::Ok(())
        };
        let result = crate::stop::within_grace(work, &shutdown, grace, unfinished).await;
        signals.abort();
        result
    });
    let result = match result {
        Ok(result) => result,
        Err(crate::stop::GraceRanOut(unfinished)) => {
            crate::stop::exit_cut_short("leasehold agent run", grace, &unfinished)
        }
    };
    // Nothing the runtime still holds (a blocking call of the driver) keeps the process from ending.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_agents_take_labels_and_capacity_by_name() {
        let agents = parse_all(&["a1=dir:/tmp/lh-a1".to_owned(), "b1=dir:/tmp/lh-b1".to_owned()], None).unwrap();
        let labels = vec![parse_agent_label("a1:zone=a").unwrap(), parse_agent_label("b1:zone=b").unwrap()];
        let capacity = vec![parse_agent_capacity("a1:volume=2,container=1").unwrap()];
        check_declared(&agents, &labels, &capacity).unwrap();
        let configured = configure(
            agents.clone(),
            Duration::from_secs(5),
            &GcArgs { gc: leasehold_schemas::settings::GcMode::Destroy, gc_grace: Duration::from_secs(300) },
            Duration::from_secs(10),
            &Declared { labels: &labels, capacity: &capacity },
        );
        let a1 = &configured[0].1;
        assert_eq!(a1.labels, [("zone".to_owned(), "a".to_owned())].into());
        assert_eq!(a1.capacity, [("volume".to_owned(), 2), ("container".to_owned(), 1)].into());
        assert!(configured[1].1.capacity.is_empty(), "b1 declared no capacity");
        let err = check_declared(&agents, &[parse_agent_label("c1:zone=c").unwrap()], &[]).unwrap_err().to_string();
        assert!(err.contains("--agent-label c1:...: this process runs no agent \"c1\""), "{err}");
        assert!(parse_agent_capacity("a1:volume").unwrap_err().contains("is not KIND=N"));
        assert!(parse_agent_label("zone=a").unwrap_err().contains("is not NAME:LABEL=VALUE"));
    }

    #[test]
    fn an_env_file_directory_goes_to_docker_agents_only() {
        let dir = tempfile::tempdir().unwrap();
        let specs = ["w1=docker:".to_owned(), "w2=dir:/tmp/lh-w2".to_owned()];
        let agents = parse_all(&specs, Some(dir.path())).unwrap();
        assert_eq!(agents.len(), 2);
        let dirs_only = ["w2=dir:/tmp/lh-w2".to_owned()];
        let err = parse_all(&dirs_only, Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("--env-file-dir is for docker agents"), "{err}");
        let err = parse_all(&specs, Some(&dir.path().join("missing"))).unwrap_err().to_string();
        assert!(err.contains("--env-file-dir") && err.contains("missing"), "{err}");
        assert!(parse_all(&specs, None).is_ok());
    }

    #[test]
    fn an_agent_without_flags_follows_the_policy_and_one_with_flags_has_its_own() {
        assert_eq!(AgentSettingsFlags::default().settings().unwrap(), None);
        let flags = AgentSettingsFlags { stall_after: Some(Millis::from_secs(20)), ..Default::default() };
        let own = flags.settings().unwrap().expect("settings of its own");
        assert_eq!(own, AgentSettings { stall_after: Millis::from_secs(20), ..AgentSettings::DEFAULT });
        let nonsense = AgentSettingsFlags { orphan_after: Some(Millis::from_secs(30)), ..Default::default() };
        let err = nonsense.settings().unwrap_err();
        assert!(err.is::<crate::policy::BadCommandLine>(), "exit status 2");
        assert!(err.to_string().contains("must be longer than stall_after"), "{err}");
    }
}
