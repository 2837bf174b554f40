//! `leasehold serve`: runs the roles asked for over the embedded log in a data directory or over JetStream, prints
//! what it serves and where it listens, and stops cleanly on SIGINT or SIGTERM (each writer finishes the command in
//! hand and gives its partition up; the HTTP server stops taking requests; agents stop their loops).
//!
//! Every `serve` process listens on `--listen`: the gateway role serves the whole API there; without it, the
//! process still serves `/healthz` and `/metrics`, so separate worker processes are scraped too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold_log::Log;
use leasehold_log::embedded::Embedded;
use leasehold_worker::WorkerConfig;
use tokio_util::sync::CancellationToken;

/// A role `serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// The writers: decide each partition's commands in log order and append the outcomes.
    Worker,
    /// The read models: fold the outcomes into the projection in the data directory.
    Projector,
    /// The HTTP/JSON API on --listen (needs the projector in the same process: it serves its read models).
    Gateway,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The roles to run, comma-separated (default: every role that exists).
    #[arg(long, value_delimiter = ',', default_value = "worker,projector,gateway")]
    roles: Vec<Role>,
    /// Where to listen for HTTP: the API with the gateway role, else /healthz and /metrics only. Port 0 picks a
    /// free port (printed).
    #[arg(long, default_value = "127.0.0.1:7420")]
    listen: SocketAddr,
    /// Run an agent in this process: NAME=DRIVER, the driver being dir:PATH (one directory per resource under
    /// PATH). Repeatable. On one machine this is how agents run, since the embedded log is one process's.
    #[arg(long = "agent", value_name = "NAME=DRIVER")]
    agents: Vec<String>,
    /// How often each agent of this process reports what it holds (±20 % jitter).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    #[command(flatten)]
    log: crate::nats_args::LogArgs,
    /// How long a worker's hold on a partition outlives it (JetStream `priority_timeout`).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    priority_timeout: Duration,
    /// How long a command delivered to a worker waits for its ack before it is delivered again.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ack_wait: Duration,
    /// This worker's name (default: host and process id).
    #[arg(long)]
    name: Option<String>,
    /// A newer schema version being rolled out: this worker stops a partition at a command of it (for a newer worker
    /// to decide) instead of dead-lettering it as from an unknown version.
    #[arg(long)]
    rolling_out_schema: Option<u16>,
    /// The cluster policy this process seeds a log that has none with (flags not given: the defaults). A log with a
    /// policy keeps it: a flag that differs is warned about, never applied (`leasehold policy set` changes it).
    #[command(flatten)]
    policy: crate::policy::PolicyFlags,
}

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    // What can be refused is refused before anything is opened or created.
    check(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = tokio::spawn(stop_on_signal(shutdown.clone()));
        let result = match args.log.jetstream() {
            None => {
                let log = Embedded::open(&args.log.data, args.log.partitions)
                    .with_context(|| format!("opening the embedded log in {}", args.log.data.display()))?;
                println!(
                    "leasehold serve: {} over the embedded log in {} ({} partitions)",
                    roles(&args.roles),
                    args.log.data.display(),
                    log.partitions()
                );
                serve(log, &args, shutdown).await
            }
            Some(config) => {
                let url = config.url.clone();
                let config = leasehold_log::jetstream::JetStreamConfig {
                    priority_timeout: args.priority_timeout,
                    ack_wait: args.ack_wait,
                    ..config
                };
                let log = leasehold_log::jetstream::JetStream::connect(config)
                    .await
                    .with_context(|| format!("connecting to NATS at {url}"))?;
                println!(
                    "leasehold serve: {} over NATS JetStream at {url} ({} partitions)",
                    roles(&args.roles),
                    log.partitions()
                );
                serve(log, &args, shutdown).await
            }
        };
        signals.abort();
        result
    })
}

fn roles(roles: &[Role]) -> String {
    roles.iter().map(|r| role_name(*r)).collect::<Vec<_>>().join(",")
}

fn check(args: &ServeArgs) -> anyhow::Result<Vec<(leasehold_schemas::ids::AgentName, leasehold_agent::AnyDriver)>> {
    if args.roles.contains(&Role::Gateway) && !args.roles.contains(&Role::Projector) {
        anyhow::bail!(
            "the gateway serves the read models of the projector in the same process: run --roles gateway,projector"
        );
    }
    let policy = args.policy.apply_to(&leasehold_schemas::settings::ClusterPolicy::DEFAULT);
    if let Err(problem) = policy.agent.check() {
        return Err(crate::policy::BadCommandLine(format!("the policy flags make no sense: {problem}")).into());
    }
    crate::agents::parse_all(&args.agents)
}

async fn serve<L: Log>(log: L, args: &ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let name = args.name.clone().unwrap_or_else(default_name);
    let agents = check(args)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let failures = leasehold_gateway::Failures::default();
    let mut tasks = tokio::task::JoinSet::new();
    // The projection opens first: a data directory in use stops `serve` before any partition is taken.
    let projector = if args.roles.contains(&Role::Projector) {
        let projector = leasehold_projector::Projector::open(&args.log.data, log.partitions())
            .with_context(|| format!("opening the projection in {}", args.log.data.display()))?;
        println!("projector: read models in {} (applied up to {})", args.log.data.display(), projector.applied());
        Some(projector)
    } else {
        None
    };
    let projection_metrics =
        projector.as_ref().map(|p| leasehold_gateway::ProjectionMetrics::register(&mut registry, p.reader()));
    let worker_metrics =
        args.roles.contains(&Role::Worker).then(|| leasehold_worker::WorkerMetrics::register(&mut registry));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr().context("reading the address listened on")?;
    let health = leasehold_gateway::Health {
        roles: args.roles.iter().map(|r| role_name(*r)).collect(),
        registry: Arc::new(registry),
        projection: projection_metrics,
        failures: failures.clone(),
        workers: worker_metrics.clone(),
    };
    let router = match &projector {
        Some(projector) if args.roles.contains(&Role::Gateway) => {
            let config = leasehold_gateway::GatewayConfig::default();
            let api = leasehold_gateway::Api::new(log.clone(), projector, config, shutdown.clone());
            println!("gateway: listening on http://{address} (the API, /healthz, /metrics)");
            leasehold_gateway::router(api, health)
        }
        _ => {
            println!("listening on http://{address} (/healthz, /metrics)");
            leasehold_gateway::metrics_only(health)
        }
    };
    {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            leasehold_gateway::serve(listener, router, shutdown).await.context("the HTTP server stopped")
        });
    }
    if let Some(metrics) = worker_metrics {
        let mut config = WorkerConfig::new(name.clone());
        config.writer.rolling_out_schema = args.rolling_out_schema;
        config.writer.metrics = Some(metrics);
        println!("worker {name}: serving its share of partitions 0..{}", log.partitions());
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let report = leasehold_worker::run(log, config, shutdown).await;
            if report.stopped.is_empty() {
                Ok(())
            } else {
                for (partition, error) in &report.stopped {
                    eprintln!("partition {partition} stopped: {error}");
                }
                Err(anyhow::anyhow!("{} partition(s) stopped", report.stopped.len()))
            }
        });
    }
    if let Some(projector) = projector {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move { project(projector, log, shutdown).await });
    }
    if args.roles.contains(&Role::Worker) {
        let (log, flags, shutdown) = (log.clone(), args.policy.clone(), shutdown.clone());
        let issuer = leasehold_schemas::Issuer::new(format!("serve:{name}"))
            .unwrap_or_else(|_| leasehold_schemas::Issuer::new("serve").expect("a valid issuer"));
        tasks.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                recorded = crate::policy::record_from_flags(&log, &flags, &issuer, POLICY_TIMEOUT) => {
                    if let Err(e) = recorded {
                        eprintln!("WARNING: policy: the flags' policy could not be checked against the log: {e:#}");
                    }
                }
            }
            Ok(())
        });
    }
    crate::agents::spawn_all(&mut tasks, &log, agents, args.sync_interval, &shutdown);
    // A role or an agent that stops on an error leaves the others running (a projector stopped on a broken chain
    // must not take the writers down), but the process says so: on stderr, and on /healthz, which answers 503.
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.context("a role panicked").and_then(|outcome| outcome);
        if let Err(e) = outcome {
            eprintln!("leasehold serve: {e:#}");
            failures.push(format!("{e:#}"));
            if result.is_ok() {
                result = Err(e);
            }
        }
    }
    println!("leasehold serve: stopped");
    result
}

/// How long `serve` waits for the writers to decide the policy it seeds the log with.
const POLICY_TIMEOUT: Duration = Duration::from_secs(60);

fn role_name(role: Role) -> String {
    format!("{role:?}").to_lowercase()
}

/// Runs the projector until shutdown. A failure the log may get over (unreachable for a while) resumes from what
/// the projection holds; any other (a broken chain, an outcome it cannot read) stops the projector, loudly: it never
/// skips an outcome.
async fn project<L: Log>(
    mut projector: leasehold_projector::Projector,
    log: L,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        match projector.run(&log, &shutdown).await {
            Ok(()) => return Ok(()),
            Err(leasehold_projector::Error::Log(e @ leasehold_log::Error::Unavailable(_))) => {
                tracing::warn!(error = %e, "the projector lost the log for now; resuming");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            Err(e) => {
                eprintln!("projector stopped: {e}");
                return Err(anyhow::Error::new(e).context("the projector stopped"));
            }
        }
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let host = if host.is_empty() { "worker".to_owned() } else { host };
    format!("{host}-{}", std::process::id())
}

pub(crate) async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    println!("leasehold: stopping");
    shutdown.cancel();
}
