//! Agents: `leasehold agent run` (one agent process on its own machine, over NATS) and the agents `serve` runs in
//! its own process (`--agent NAME=DRIVER`, how agents run on one machine over the embedded log).

use std::time::Duration;

use anyhow::Context;
use leasehold_agent::{AgentConfig, AnyDriver};
use leasehold_log::Log;
use leasehold_schemas::ids::AgentName;
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

/// The agents `serve` was given, checked before anything starts: each spec, and each name once.
pub(crate) fn parse_all(specs: &[String]) -> anyhow::Result<Vec<(AgentName, AnyDriver)>> {
    let mut seen = std::collections::BTreeSet::new();
    let agents = specs.iter().map(|spec| parse_agent(spec)).collect::<anyhow::Result<Vec<_>>>()?;
    for (name, _) in &agents {
        anyhow::ensure!(seen.insert(name.clone()), "--agent {name} is given twice: one process per agent");
    }
    Ok(agents)
}

/// Starts `agents`, each until `shutdown`.
pub(crate) fn spawn_all<L: Log>(
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    log: &L,
    agents: Vec<(AgentName, AnyDriver)>,
    sync_interval: Duration,
    shutdown: &CancellationToken,
) {
    for (name, driver) in agents {
        println!("agent {name}: {driver}, reporting every {}", humantime::format_duration(sync_interval));
        let config = AgentConfig { sync_interval, ..AgentConfig::new(name.clone()) };
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            leasehold_agent::run(log, driver, config, shutdown).await.with_context(|| format!("agent {name} stopped"))
        });
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct AgentRunArgs {
    /// The agent's name: the machine it runs on (`[a-z0-9][a-z0-9_-]{0,62}`).
    #[arg(long)]
    name: String,
    /// What makes and destroys its resources: dir:PATH (one directory per resource under PATH).
    #[arg(long)]
    driver: String,
    #[command(flatten)]
    nats: crate::nats_args::NatsArgs,
    /// How often it reports what it holds (±20 % jitter).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    /// At most this many driver calls at once.
    #[arg(long, default_value_t = 5)]
    max_in_flight: usize,
    /// A driver call that takes longer is given up and tried again later.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    call_timeout: Duration,
    /// This machine's disk was wiped: losing everything it held is expected, not a fault for the breaker.
    #[arg(long)]
    wiped: bool,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum AgentCmd {
    /// Run the agent of this machine: follow its outcomes, make and destroy its resources, report what it holds.
    Run(AgentRunArgs),
    /// Take an agent out of service: nothing new is placed on it, and everything it holds is released.
    Retire(crate::produce::AgentNameArgs),
    /// Confirm that a suspect agent (its loss breaker tripped; see `leasehold agents`) really lost what it reported
    /// missing: the losses are marked after a full resync.
    ConfirmLoss(crate::produce::AgentNameArgs),
}

pub(crate) fn run(cmd: AgentCmd) -> anyhow::Result<()> {
    let AgentCmd::Run(args) = cmd else {
        anyhow::bail!("only `agent run` runs a process; retire and confirm-loss are sent as commands");
    };
    let name = AgentName::new(args.name.as_str()).context("--name")?;
    let driver = leasehold_agent::parse_driver(&args.driver)?;
    // An agent never creates the log: it takes the partition count of the one `serve` made.
    let config = args.nats.config(0).context(
        "an agent process needs --nats URL (on one machine, run agents inside serve with --agent NAME=dir:PATH)",
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = tokio::spawn(crate::serve::stop_on_signal(shutdown.clone()));
        let url = config.url.clone();
        let log = leasehold_log::jetstream::JetStream::connect(config)
            .await
            .with_context(|| format!("connecting to NATS at {url}"))?;
        println!(
            "agent {name}: {driver} over NATS JetStream at {url}, reporting every {}",
            humantime::format_duration(args.sync_interval)
        );
        let config = AgentConfig {
            sync_interval: args.sync_interval,
            max_in_flight: args.max_in_flight,
            call_timeout: args.call_timeout,
            wiped: args.wiped,
            ..AgentConfig::new(name.clone())
        };
        let result = leasehold_agent::run(log, driver, config, shutdown).await;
        signals.abort();
        result.with_context(|| format!("agent {name} stopped"))?;
        println!("agent {name}: stopped");
        Ok(())
    })
}
