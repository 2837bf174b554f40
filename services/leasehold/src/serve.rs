//! `leasehold serve`: runs the roles asked for over the embedded log in a data directory or over JetStream, prints
//! what it serves and where it listens, and stops cleanly on SIGINT or SIGTERM (each writer finishes the command in
//! hand and gives its partition up; the HTTP server stops taking requests; agents stop their loops), within
//! `--shutdown-grace` whatever the log does (`stop.rs`).
//!
//! Every `serve` process listens on `--listen`: the gateway role serves the whole API there; without it, the
//! process still serves `/healthz`, `/readyz` and `/metrics`, so separate worker processes are probed and scraped
//! too. With the worker role it stores the policy of its flags in every partition without one before its gateway
//! takes commands and its agents register (`ready.rs`).
//!
//! The gateway authenticates callers by the bearer tokens of `--tokens FILE` and records each command with its
//! caller's principal as the issuer. Without `--tokens` it authenticates nobody, which `serve` allows only on a
//! loopback `--listen` (development), or with `--insecure-no-auth` when something in front of it does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold_gateway::{Readiness, ReadyCheck};
use leasehold_log::Log;
use leasehold_log::embedded::Embedded;
use leasehold_log::jetstream::is_worker_name;
use leasehold_schemas::text::shown;
use leasehold_worker::WorkerConfig;
use tokio_util::sync::CancellationToken;

use crate::ready::{GatewayWaits, LogEnd, ProjectorWaits};
use crate::stop::Running;

/// A role `serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// The writers: decide each partition's commands in log order and append the outcomes.
    Worker,
    /// The read models: fold the outcomes into the projection in the data directory.
    Projector,
    /// The HTTP/JSON API on --listen (needs the projector in the same process: it serves its read models).
    Gateway,
    /// Time-driven and cross-partition work (expiries, timeouts, stalled agents, pool claims, cascades), asked for
    /// with `sys` commands. Several may run at once.
    Sweeper,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The roles to run, comma-separated (default: every role that exists).
    #[arg(long, value_delimiter = ',', default_value = "worker,projector,gateway,sweeper")]
    roles: Vec<Role>,
    /// Where to listen for HTTP: the API with the gateway role, else /healthz, /readyz and /metrics only. Port 0
    /// picks a free port (printed).
    #[arg(long, default_value = "127.0.0.1:7420")]
    listen: SocketAddr,
    /// The gateway's bearer tokens: a file of `PRINCIPAL TOKEN` lines (`#` comments), each token at least 16
    /// characters. Every /v1 request must then carry `Authorization: Bearer TOKEN` (401 otherwise; /healthz, /readyz
    /// and /metrics need none), and its commands are recorded with the token's principal as their issuer, whatever
    /// they claim. Without it nobody is authenticated, which is allowed on a loopback --listen only.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Serve the gateway without authentication on an address that is not loopback. Only for a gateway that
    /// something else guards: an authenticating reverse proxy or service mesh in front of it, or a container whose
    /// port is published on the host's loopback only. Commands then carry the issuer they claim.
    #[arg(long, conflicts_with = "tokens")]
    insecure_no_auth: bool,
    /// With --tokens: how long a session of the operator's view (/ui) lasts from its login, at most 400 days. The
    /// login page trades a token for a session; the session only reads.
    #[arg(long, default_value = "12h", value_parser = humantime::parse_duration)]
    ui_session_ttl: Duration,
    /// Browsers reach this gateway over TLS, through something in front of it that ends TLS (this build serves
    /// plain HTTP only): the operator's view's session cookies are then marked Secure, never sent without TLS.
    #[arg(long)]
    behind_tls: bool,
    /// The most streams of GET /v1/events (the command line's `watch`, the operator's view's live feed) open at
    /// once; one more is answered 503 with Retry-After.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    events_max_streams: u32,
    /// A stream of events whose client reads nothing for this long while events wait for it is ended and its
    /// connection closed (the client resumes from its last event id); counted in leasehold_event_streams_dropped.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    events_stall_timeout: Duration,
    /// Run an agent in this process: NAME=DRIVER, the driver being dir:PATH (one directory per resource under
    /// PATH) or docker:[ENDPOINT] (containers and volumes on a Docker daemon). Repeatable. On one machine this is how agents run, since the embedded log is one process's.
    #[arg(long = "agent", value_name = "NAME=DRIVER")]
    agents: Vec<String>,
    /// A label of one of this process's agents, for placement to select it by (`--agent-label w1:zone=a`;
    /// repeatable), as `agent run --label` declares it.
    #[arg(long = "agent-label", value_name = "NAME:LABEL=VALUE", value_parser = crate::agents::parse_agent_label)]
    agent_labels: Vec<(String, (String, String))>,
    /// How many resources of a kind one of this process's agents takes (`--agent-capacity w1:volume=10,container=4`;
    /// repeatable), as `agent run --capacity` declares it. A kind not named is not limited, and takes no placement.
    #[arg(long = "agent-capacity", value_name = "NAME:KIND=N[,KIND=N...]", value_parser = crate::agents::parse_agent_capacity)]
    agent_capacity: Vec<(String, Vec<(String, u32)>)>,
    /// For this process's docker agents: the directory whose files a container's `env-file` attribute may name (a
    /// path relative to it; nothing outside it is read). Without it they read no env files.
    #[arg(long, value_name = "DIR")]
    env_file_dir: Option<PathBuf>,
    /// How often each agent of this process reports what it holds (±20 % jitter).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    #[command(flatten)]
    gc: crate::agents::GcArgs,
    #[command(flatten)]
    log: crate::nats_args::LogArgs,
    /// How long a worker's hold on a partition outlives it (JetStream `priority_timeout`, and how long a worker stays
    /// listed as alive): a survivor decides a dead worker's partitions again within about this long, and a live
    /// worker keeps them through a pause (GC, slow disk) of up to seven eighths of it. The log's creator sets it for
    /// the log; a later process with another value is told so and uses the log's.
    #[arg(long, default_value = "2.5s", value_parser = humantime::parse_duration)]
    priority_timeout: Duration,
    /// How long a command delivered to a worker waits for its ack before it is delivered again.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ack_wait: Duration,
    /// The NATS server's HTTP monitoring URL (`http://host:8222`): `serve` reads `/varz` and warns when JetStream
    /// does not fsync every write (`sync_interval: always`).
    #[arg(long, requires = "nats")]
    nats_monitor: Option<String>,
    /// This worker's name, unique among live workers (default: the host's name and the --listen port, with the
    /// address when it is a specific one, which a restart on the same machine keeps; with port 0, or a host named
    /// `localhost` or nothing, the process id instead of the port).
    #[arg(long)]
    name: Option<String>,
    /// A newer schema version being rolled out: this worker stops a partition at a command of it (for a newer worker
    /// to decide) instead of dead-lettering it as from an unknown version.
    #[arg(long)]
    rolling_out_schema: Option<u16>,
    /// Group commit: the most outcome records a writer appends at once (every command waiting, up to this; 1
    /// appends each outcome alone). At most 1000, the most a JetStream atomic batch holds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..=1000))]
    max_append_records: u16,
    /// Batched ingest: the most commands of concurrent HTTP requests the gateway publishes at once (1: each alone).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u16).range(1..=1000))]
    ingest_batch: u16,
    /// How long after it ended a terminal record (a destroyed resource, a released lease...) is still listed by `ls`
    /// and `leases` (`GET /v1/resources`, `/v1/leases`) without `--all` (`all=true`).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    list_ended_for: Duration,
    /// How often the sweeper looks for work that falls due with time alone (deadlines); work that an outcome
    /// announces (a freed address, a grant to carry) is asked for as soon as the outcome arrives.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
    /// A sweeper request whose effect has not shown after this long is sent again.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sweep_retry: Duration,
    /// A resource releasing for longer than this raises an alert (a line on stderr and
    /// leasehold_releasing_overdue); its agent keeps retrying the destroy.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    release_timeout: Duration,
    /// The cluster policy this process seeds a log that has none with (flags not given: the defaults). A log with a
    /// policy keeps it: a flag that differs is warned about, never applied (`leasehold policy set` changes it).
    #[command(flatten)]
    policy: crate::policy::PolicyFlags,
    #[command(flatten)]
    stop: crate::stop::GraceArgs,
}

pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    // What can be refused is refused before anything is opened or created.
    let checked = check(&args)?;
    let grace = args.stop.shutdown_grace;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let running = Running::default();
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let listed = running.clone();
        let signals = tokio::spawn(crate::stop::on_signals(shutdown.clone(), "leasehold serve", grace, move || {
            listed.unfinished()
        }));
        let work = open_and_serve(&args, checked, &shutdown, &running);
        let result = crate::stop::within_grace(work, &shutdown, grace, || running.unfinished()).await;
        signals.abort();
        result
    });
    let result = match result {
        Ok(result) => result,
        Err(crate::stop::GraceRanOut(unfinished)) => crate::stop::exit_cut_short("leasehold serve", grace, &unfinished),
    };
    // Nothing the runtime still holds (a blocking task) keeps the process from ending.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Opens the log `args` name and serves the roles on it until `shutdown`.
async fn open_and_serve(
    args: &ServeArgs,
    checked: Checked,
    shutdown: &CancellationToken,
    running: &Running,
) -> anyhow::Result<()> {
    match args.log.jetstream() {
        None => {
            let log = Embedded::open(&args.log.data, args.log.partitions)
                .with_context(|| format!("opening the embedded log in {}", args.log.data.display()))?;
            println!(
                "leasehold serve: {} over the embedded log in {} ({} partitions)",
                roles(&args.roles),
                args.log.data.display(),
                log.partitions()
            );
            serve(log, args, checked, shutdown.clone(), running).await
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
            let varz = match &args.nats_monitor {
                None => None,
                Some(monitor) => Some(read_varz(monitor).await),
            };
            for warning in durability_warnings(log.replicas(), varz.as_ref()) {
                eprintln!("{warning}");
            }
            if let Some(warning) = payload_warning(log.client().server_info().max_payload) {
                eprintln!("{warning}");
            }
            serve(log, args, checked, shutdown.clone(), running).await
        }
    }
}

/// The server's `/varz`, or why it could not be read.
async fn read_varz(monitor: &str) -> Result<serde_json::Value, String> {
    let url = format!("{}/varz", monitor.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().map_err(|e| e.to_string())?;
    let response = client.get(&url).send().await.map_err(|e| format!("{url}: {e}"))?;
    response.json().await.map_err(|e| format!("{url}: {e}"))
}

/// What is weaker than the production setup of DESIGN section 9 (R3, `sync_interval: always`), one line each.
/// `varz`: the server's `/varz` (nats-server 2.15 reports `jetstream.config.sync_always: true` under `always`, and
/// only `sync_interval` in nanoseconds otherwise), if `--nats-monitor` was given.
fn durability_warnings(replicas: usize, varz: Option<&Result<serde_json::Value, String>>) -> Vec<String> {
    let mut out = Vec::new();
    if replicas < 3 {
        out.push(format!(
            "WARNING: the leasehold streams have {replicas} replica(s): one lost disk or node loses acknowledged \
             outcomes; production runs 3 nodes with R3 streams (--replicas 3, docs/production.md)"
        ));
    }
    match varz {
        None => {}
        Some(Err(why)) => out.push(format!(
            "WARNING: cannot read the NATS server's settings from --nats-monitor ({why}): its fsync setting is unknown"
        )),
        Some(Ok(varz)) => {
            let config = &varz["jetstream"]["config"];
            if config["sync_always"].as_bool() != Some(true) {
                let every = config["sync_interval"].as_u64().map_or_else(
                    || "an unknown interval".to_owned(),
                    |ns| humantime::format_duration(Duration::from_nanos(ns)).to_string(),
                );
                out.push(format!(
                    "WARNING: the NATS server fsyncs JetStream every {every}, not on every write: a power loss can \
                     lose acknowledged outcomes; set jetstream {{ sync_interval: always }} (docs/nats-server.conf)"
                ));
            }
        }
    }
    out
}

/// A server whose `max_payload` is below the largest outcome part (512 KiB) plus its headers cannot store every
/// outcome a writer may append: such an append never lands, and its partition retries it forever.
fn payload_warning(max_payload: usize) -> Option<String> {
    let needed = leasehold_schemas::codec::MAX_OUTCOME_BYTES + 64 * 1024;
    (max_payload < needed).then(|| {
        format!(
            "WARNING: the NATS server's max_payload is {max_payload} bytes: an outcome part may take up to {} bytes \
             with its headers, and one the server refuses stops its partition's progress; keep max_payload at its \
             default (1 MiB) or more",
            needed
        )
    })
}

fn roles(roles: &[Role]) -> String {
    roles.iter().map(|r| role_name(*r)).collect::<Vec<_>>().join(",")
}

/// What `serve` read from its command line before opening anything.
struct Checked {
    agents: Vec<(leasehold_schemas::ids::AgentName, leasehold_agent::AnyDriver)>,
    tokens: Option<Arc<leasehold_gateway::Tokens>>,
    /// The writers' test-only faults the environment names (`LEASEHOLD_FAULT_*`; the chaos harness's).
    #[cfg(feature = "fault-points")]
    faults: Option<Arc<leasehold_worker::faults::FaultPoints>>,
}

fn check(args: &ServeArgs) -> anyhow::Result<Checked> {
    // Before anything is opened or made: a name that cannot be a key would leave the worker alone and unseen.
    if let Some(name) = &args.name {
        check_worker_name(name)?;
    }
    let gateway = args.roles.contains(&Role::Gateway);
    if gateway && !args.roles.contains(&Role::Projector) {
        anyhow::bail!(
            "the gateway serves the read models of the projector in the same process: run --roles gateway,projector"
        );
    }
    if args.ui_session_ttl.is_zero() || args.ui_session_ttl > leasehold_gateway::MAX_SESSION_TTL {
        return Err(crate::policy::BadCommandLine(
            "--ui-session-ttl must be longer than 0 and at most 400 days (browsers keep a cookie no longer)".into(),
        )
        .into());
    }
    if args.events_stall_timeout.is_zero() {
        return Err(crate::policy::BadCommandLine("--events-stall-timeout must be longer than 0".into()).into());
    }
    if args.sweep_interval.is_zero() || args.sweep_retry.is_zero() {
        return Err(
            crate::policy::BadCommandLine("--sweep-interval and --sweep-retry must be longer than 0".into()).into()
        );
    }
    let policy = args.policy.apply_to(&leasehold_schemas::settings::ClusterPolicy::DEFAULT);
    if let Err(problem) = policy.agent.check() {
        return Err(crate::policy::BadCommandLine(format!("the policy flags make no sense: {problem}")).into());
    }
    let tokens = match &args.tokens {
        Some(_) if !gateway => {
            anyhow::bail!("--tokens is for the gateway role, which this process does not run (--roles)")
        }
        Some(path) => Some(Arc::new(load_tokens(path)?)),
        None if gateway && !args.listen.ip().is_loopback() && !args.insecure_no_auth => anyhow::bail!(
            "the gateway would serve {} to anyone who can reach it without asking who they are: give --tokens FILE \
             (`PRINCIPAL TOKEN` lines), listen on a loopback address, or, if something in front of it \
             authenticates callers, --insecure-no-auth",
            args.listen
        ),
        None => None,
    };
    let agents = crate::agents::parse_all(&args.agents, args.env_file_dir.as_deref())?;
    crate::agents::check_declared(&agents, &args.agent_labels, &args.agent_capacity)?;
    #[cfg(feature = "fault-points")]
    let faults = leasehold_worker::faults::FaultPoints::from_env()
        .map_err(|e| crate::policy::BadCommandLine(format!("test-only fault point {e}")))?;
    #[cfg(feature = "fault-points")]
    if let Some(faults) = &faults {
        eprintln!("leasehold serve: test-only fault points armed: {}", faults.plan());
    }
    Ok(Checked {
        agents,
        tokens,
        #[cfg(feature = "fault-points")]
        faults,
    })
}

/// The token file, refused (naming the line) when malformed; a file others can read is taken with a warning, since
/// its directory may be what guards it (a mounted secret) and `serve` cannot judge that.
fn load_tokens(path: &std::path::Path) -> anyhow::Result<leasehold_gateway::Tokens> {
    let (tokens, warning) =
        leasehold_gateway::Tokens::load(path).map_err(|e| anyhow::anyhow!("--tokens {}: {e}", path.display()))?;
    if let Some(warning) = warning {
        eprintln!("warning: --tokens {warning}");
    }
    Ok(tokens)
}

async fn serve<L: Log>(
    log: L,
    args: &ServeArgs,
    checked: Checked,
    shutdown: CancellationToken,
    running: &Running,
) -> anyhow::Result<()> {
    let name = args.name.clone().unwrap_or_else(|| default_name(args.listen));
    #[cfg(feature = "fault-points")]
    let faults = checked.faults.clone();
    let Checked { agents, tokens, .. } = checked;
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
    let events_metrics =
        args.roles.contains(&Role::Gateway).then(|| leasehold_gateway::EventsMetrics::register(&mut registry));
    let worker_metrics =
        args.roles.contains(&Role::Worker).then(|| leasehold_worker::WorkerMetrics::register(&mut registry));
    let sweeper_metrics =
        args.roles.contains(&Role::Sweeper).then(|| leasehold_sweeper::SweeperMetrics::register(&mut registry));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr().context("reading the address listened on")?;

    // What each role waits on before it is ready (`/readyz`); the gateway takes no command before it is.
    let seeds = args.roles.contains(&Role::Worker);
    let log_end: LogEnd = Arc::default();
    let projector_waits = projector.as_ref().map(|p| ProjectorWaits { end: log_end.clone(), applied: p.subscribe() });
    let gateway_waits = match (&projector, &projector_waits) {
        (Some(projector), Some(waits)) if args.roles.contains(&Role::Gateway) => {
            Some(GatewayWaits::new(log.partitions(), seeds, waits.clone(), projector.reader()))
        }
        _ => None,
    };
    let declared = crate::agents::Declared { labels: &args.agent_labels, capacity: &args.agent_capacity };
    let agents = crate::agents::configure(agents, args.sync_interval, &args.gc, args.stop.shutdown_grace, &declared);
    let mut readiness = Readiness::default();
    if let Some(metrics) = worker_metrics.clone() {
        readiness.add("worker", ReadyCheck::new(move || metrics.waiting_on()));
    }
    if let Some(waits) = projector_waits.clone() {
        readiness.add("projector", ReadyCheck::new(move || waits.waiting_on()));
    }
    if let Some(waits) = gateway_waits.clone() {
        readiness.add("gateway", ReadyCheck::new(move || waits.waiting_on()));
    }
    for (_, config) in &agents {
        let control = config.control.clone();
        readiness
            .add(format!("agent {}", config.name), ReadyCheck::new(move || crate::ready::agent_waiting_on(&control)));
    }
    let health = leasehold_gateway::Health {
        roles: args.roles.iter().map(|r| role_name(*r)).collect(),
        registry: Arc::new(registry),
        projection: projection_metrics,
        failures: failures.clone(),
        workers: worker_metrics.clone(),
        ready: readiness,
    };
    let router = match (&projector, &gateway_waits) {
        (Some(projector), Some(waits)) => {
            match &tokens {
                Some(tokens) => {
                    let principals = tokens.principals().iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ");
                    println!("gateway: bearer tokens of {principals}; each command's issuer is its caller's principal");
                    println!(
                        "gateway: the operator's view (/ui) logs in with a token for a read-only session of {}{}",
                        humantime::format_duration(args.ui_session_ttl),
                        if args.behind_tls { " (Secure cookies: behind TLS)" } else { "" }
                    );
                }
                None => println!("gateway: no authentication (no --tokens): each command's issuer is what it says"),
            }
            let waits = waits.clone();
            let config = leasehold_gateway::GatewayConfig {
                tokens,
                ingest_batch: usize::from(args.ingest_batch),
                ready: ReadyCheck::new(move || waits.waiting_on()),
                list_ended_for: args.list_ended_for,
                ui_session_ttl: args.ui_session_ttl,
                behind_tls: args.behind_tls,
                events_max_streams: usize::try_from(args.events_max_streams).unwrap_or(usize::MAX),
                events_stall_timeout: args.events_stall_timeout,
                events_metrics: events_metrics.clone().unwrap_or_default(),
                ..Default::default()
            };
            let api = leasehold_gateway::Api::new(log.clone(), projector, config, shutdown.clone());
            println!("gateway: listening on http://{address} (the API, /healthz, /readyz, /metrics)");
            leasehold_gateway::router(api, health)
        }
        _ => {
            println!("listening on http://{address} (/healthz, /readyz, /metrics)");
            leasehold_gateway::metrics_only(health)
        }
    };
    {
        let shutdown = shutdown.clone();
        running.spawn(&mut tasks, "the HTTP server (requests in flight)", async move {
            leasehold_gateway::serve(listener, router, shutdown).await.context("the HTTP server stopped")
        });
    }
    if projector_waits.is_some() {
        let (log, end, shutdown) = (log.clone(), log_end.clone(), shutdown.clone());
        running.spawn(&mut tasks, "reading where the outcome log ends", async move {
            crate::ready::read_log_end(&log, &end, &shutdown).await;
            Ok(())
        });
    }
    // The policy this process seeds is stored before the gateway takes commands and before its agents register; its
    // decisions are looked at afterwards.
    let (policy_stored, policy_stored_rx) = tokio::sync::watch::channel(!seeds);
    if seeds {
        let (log, flags, shutdown, waits) = (log.clone(), args.policy.clone(), shutdown.clone(), gateway_waits.clone());
        let issuer = leasehold_schemas::Issuer::new(format!("serve:{name}"))
            .unwrap_or_else(|_| leasehold_schemas::Issuer::new("serve").expect("a valid issuer"));
        running.spawn(&mut tasks, "the policy seeding", async move {
            let stored = move |partition: u32| {
                if let Some(waits) = &waits {
                    waits.stored(partition);
                }
            };
            let Some(seeded) = crate::policy::seed_from_flags(&log, &flags, &issuer, &stored, &shutdown).await else {
                return Ok(());
            };
            policy_stored.send_replace(true);
            tokio::select! {
                _ = shutdown.cancelled() => {}
                checked = crate::policy::check_seeded(&log, &flags, seeded, POLICY_TIMEOUT) => {
                    if let Err(e) = checked {
                        eprintln!("WARNING: policy: the flags' policy could not be checked against the log: {:#}", shown(&e));
                    }
                }
            }
            Ok(())
        });
    }
    if let Some(metrics) = worker_metrics {
        let mut config = WorkerConfig::new(name.clone());
        config.writer.rolling_out_schema = args.rolling_out_schema;
        config.writer.max_append_records = usize::from(args.max_append_records);
        config.writer.metrics = Some(metrics.clone());
        // Deciding what the log already sent takes at most a fifth of the grace, so the partitions are still
        // given back within it.
        config.writer.stop_grace = config.writer.stop_grace.min(args.stop.shutdown_grace / 5);
        #[cfg(feature = "fault-points")]
        if let Some(faults) = &faults {
            faults.install(&mut config.writer);
        }
        println!("worker {name}: serving its share of partitions 0..{}", log.partitions());
        let (log, shutdown) = (log.clone(), shutdown.clone());
        let held: crate::stop::Detail = Arc::new(move || {
            let held = metrics.held();
            (!held.is_empty()).then(|| {
                format!(
                    "partition(s) {} not given back (another worker takes each once this one's hold expires, after \
                     --priority-timeout; on the embedded log the next `serve` does)",
                    leasehold_worker::metrics::ranges(&held)
                )
            })
        });
        running.spawn_with(&mut tasks, "worker", Some(held), async move {
            let report = leasehold_worker::run(log, config, shutdown).await;
            if report.stopped.is_empty() {
                Ok(())
            } else {
                for (partition, error) in &report.stopped {
                    eprintln!("partition {partition} stopped: {}", shown(error));
                }
                Err(anyhow::anyhow!("{} partition(s) stopped", report.stopped.len()))
            }
        });
    }
    if let Some(projector) = projector {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        running.spawn(&mut tasks, "projector", async move { project(projector, log, shutdown).await });
    }
    if let Some(metrics) = sweeper_metrics {
        let mut config = leasehold_sweeper::SweeperConfig::new(name.clone());
        config.interval = args.sweep_interval;
        config.retry_after = args.sweep_retry;
        config.release_timeout = args.release_timeout;
        println!("sweeper {name}: looking for due work every {}", humantime::format_duration(args.sweep_interval));
        let (log, shutdown) = (log.clone(), shutdown.clone());
        running.spawn(&mut tasks, "sweeper", async move { sweep(log, config, metrics, shutdown).await });
    }
    crate::agents::spawn_all(&mut tasks, running, &log, agents, &policy_stored_rx, &shutdown);
    // A role or an agent that stops on an error leaves the others running (a projector stopped on a broken chain
    // must not take the writers down), but the process says so: on stderr, and on /healthz, which answers 503.
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.context("a role panicked").and_then(|outcome| outcome);
        if let Err(e) = outcome {
            eprintln!("leasehold serve: {:#}", shown(&e));
            if crate::agents::stopped_for_its_machine(&e) {
                failures.push_degraded(format!("{e:#}"));
            } else {
                failures.push(format!("{e:#}"));
            }
            if result.is_ok() {
                result = Err(e);
            }
        }
    }
    println!("leasehold serve: stopped");
    result
}

/// How long `serve` waits for the writers to decide the policy it seeded the log with, once it is stored.
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
                eprintln!("projector stopped: {}", shown(&e));
                return Err(anyhow::Error::new(e).context("the projector stopped"));
            }
        }
    }
}

/// Runs the sweeper until shutdown, resuming (from a fresh load) when the log was unreachable for a while; any other
/// failure stops it, loudly.
async fn sweep<L: Log>(
    log: L,
    config: leasehold_sweeper::SweeperConfig,
    metrics: leasehold_sweeper::SweeperMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        match leasehold_sweeper::run(log.clone(), config.clone(), metrics.clone(), shutdown.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "the sweeper lost the log for now; resuming");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            Err(e) => {
                eprintln!("sweeper stopped: {}", shown(&e));
                return Err(anyhow::Error::new(e).context("the sweeper stopped"));
            }
        }
    }
}

/// A worker's name when none is given: the host's and the --listen port's (with the address before it when it is
/// a specific one, not a wildcard or loopback), stable across restarts on one machine, so a restarted worker keeps
/// its share of the partitions instead of moving them twice, and unique there, since two processes cannot listen on
/// one address. A host without a name of its own (none, or `localhost`), or port 0, gives no stable name: the process
/// id stands in for the port.
fn default_name(listen: SocketAddr) -> String {
    let read = |path: &str| std::fs::read_to_string(path).map(|h| h.trim().to_owned()).unwrap_or_default();
    let mut host = read("/proc/sys/kernel/hostname");
    if host.is_empty() {
        host = read("/etc/hostname");
    }
    let anonymous = host.is_empty() || host == "localhost";
    let host = if host.is_empty() { "worker".to_owned() } else { host };
    let host = match listen.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => format!("{host}-{ip}"),
        _ => host,
    };
    let host: String =
        host.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    if anonymous || listen.port() == 0 {
        format!("{host}-pid{}", std::process::id())
    } else {
        format!("{host}-{}", listen.port())
    }
}

/// Whether `name` can be a worker's name (the log's rule for its keys, [`is_worker_name`]).
fn check_worker_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        is_worker_name(name),
        "--name {name:?}: a worker's name is letters, digits, '-', '_', '=', '/' and '.' (not first or last)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_worker_name_is_stable_and_a_name_must_be_a_key() {
        let name = default_name("127.0.0.1:7420".parse().unwrap());
        assert_eq!(name, default_name("127.0.0.1:7420".parse().unwrap()), "the same for a restart");
        assert!(name.ends_with("-7420") || name.contains("-pid"), "{name}");
        assert!(default_name("127.0.0.1:0".parse().unwrap()).ends_with(&format!("-pid{}", std::process::id())));
        let specific = default_name("10.1.2.3:7420".parse().unwrap());
        assert!(specific.contains("-10.1.2.3-"), "a specific address is part of it: {specific}");
        for name in [&name, &specific] {
            check_worker_name(name).unwrap();
        }
        for bad in ["", "my worker", "a*", ".lead", "trail.", "ünï"] {
            assert!(check_worker_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn weak_durability_is_named() {
        let default_sync = serde_json::json!({"jetstream": {"config": {"sync_interval": 120_000_000_000_u64}}});
        let warnings = durability_warnings(1, Some(&Ok(default_sync)));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("1 replica(s)"), "{warnings:?}");
        assert!(warnings[1].contains("every 2m"), "{warnings:?}");
        let always =
            serde_json::json!({"jetstream": {"config": {"sync_interval": 120_000_000_000_u64, "sync_always": true}}});
        assert!(durability_warnings(3, Some(&Ok(always))).is_empty());
        assert!(durability_warnings(3, None).is_empty());
        assert_eq!(durability_warnings(3, Some(&Err("refused".to_owned()))).len(), 1);
        assert!(payload_warning(1024 * 1024).is_none(), "the default max_payload holds every outcome part");
        assert!(payload_warning(512 * 1024).is_some_and(|w| w.contains("max_payload is 524288 bytes")));
    }

    fn checked(argv: &[&str]) -> anyhow::Result<Checked> {
        use clap::Parser as _;
        let cli = crate::Cli::try_parse_from(["leasehold", "serve"].iter().chain(argv).copied())?;
        let crate::Cmd::Serve(args) = cli.command else { unreachable!("serve parses to Serve") };
        check(&args)
    }

    #[test]
    fn without_tokens_the_gateway_listens_on_loopback_only_unless_told_it_is_guarded() {
        // The operator's view (/ui) is served by the same router on the same --listen: the rule covers it too.
        for listen in ["127.0.0.1:0", "[::1]:7420"] {
            let ok = checked(&["--listen", listen]).unwrap_or_else(|e| panic!("{listen}: {e:#}"));
            assert!(ok.tokens.is_none());
        }
        let refused = checked(&["--listen", "0.0.0.0:7420"]).err().expect("no tokens on 0.0.0.0");
        assert!(refused.to_string().contains("give --tokens FILE"), "{refused}");
        assert!(checked(&["--listen", "10.1.2.3:7420", "--insecure-no-auth"]).is_ok());
        // A process without the gateway serves /healthz and /metrics only: nothing to guard.
        assert!(checked(&["--roles", "worker", "--listen", "0.0.0.0:7421"]).is_ok());
    }

    #[test]
    fn the_view_s_sessions_and_the_event_streams_take_sane_bounds() {
        for ttl in ["0s", "401days"] {
            let refused = checked(&["--ui-session-ttl", ttl]).err().unwrap_or_else(|| panic!("{ttl} is refused"));
            assert!(refused.to_string().contains("--ui-session-ttl must be longer than 0"), "{refused}");
        }
        for ttl in ["1s", "12h", "400days"] {
            assert!(checked(&["--ui-session-ttl", ttl, "--behind-tls"]).is_ok(), "{ttl}");
        }
        let refused = checked(&["--events-stall-timeout", "0s"]).err().expect("zero is refused");
        assert!(refused.to_string().contains("--events-stall-timeout must be longer than 0"), "{refused}");
        assert!(checked(&["--events-max-streams", "0"]).is_err(), "no stream at all is no feed");
        assert!(checked(&["--events-max-streams", "1", "--events-stall-timeout", "250ms"]).is_ok());
    }

    #[test]
    fn a_sweeper_that_never_waits_is_refused() {
        for flag in ["--sweep-interval", "--sweep-retry"] {
            let refused = checked(&[flag, "0s"]).err().expect("zero is refused");
            assert!(refused.to_string().contains("must be longer than 0"), "{refused}");
        }
        assert!(checked(&["--sweep-interval", "100ms", "--sweep-retry", "1s"]).is_ok());
    }

    #[test]
    fn tokens_are_read_at_start_and_a_bad_file_stops_serve() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (good, bad) = (dir.path().join("good"), dir.path().join("bad"));
        std::fs::write(&good, "op:alice 0123456789abcdef\n").expect("write");
        std::fs::write(&bad, "op:alice 0123456789abcdef\nop:bob 0123456789abcdef\n").expect("write");
        let (good, bad) = (good.display().to_string(), bad.display().to_string());
        let ok = checked(&["--listen", "0.0.0.0:7420", "--tokens", &good]).expect("tokens on 0.0.0.0");
        let tokens = ok.tokens.expect("tokens");
        assert_eq!(tokens.principal_of("0123456789abcdef").map(|p| p.as_str()), Some("op:alice"));
        let refused = checked(&["--tokens", &bad]).err().expect("a token twice");
        assert!(refused.to_string().contains(&format!("--tokens {bad}: line 2: ")), "{refused}");
        let refused = checked(&["--roles", "worker", "--tokens", &good]).err().expect("tokens without a gateway");
        assert!(refused.to_string().contains("for the gateway role"), "{refused}");
        assert!(checked(&["--tokens", &good, "--insecure-no-auth"]).is_err(), "the two flags exclude each other");
    }
}
