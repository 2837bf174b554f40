//! `leasehold bench takeover`: how soon a dead worker's partitions are decided again. A benchmark, never a test: it
//! prints a table and, as its last line, one JSON object.
//!
//! On a NATS server with no leasehold log yet (whose leasehold streams it deletes at the end), it starts `--workers`
//! `leasehold serve --roles worker` processes of its own binary, each with a stable name, and publishes commands on
//! every partition at `--rate` commands per second each: allocations up to `--live` resources per partition, then
//! its agent's registrations again, so what a survivor loads stays the same from the first round to the last. Then, `--kills` times: it waits until every worker is alive
//! and every partition is decided steadily, kills one worker with SIGKILL (in turn), and times, for each partition
//! that was the dead worker's share, the kill to the first outcome after the partition's writer consumer was pinned
//! to another client (the server's `consumer_group_pinned` advisory): the survivor's first decision. The dead
//! worker's outcomes still in flight when it died land before that pin, so they are never counted. The worker is
//! started again under the same name before the next round.
//!
//! **False takeovers** are pins that move when they should not: a survivor's partition pinned anew between a kill and
//! the restart, and, in `--pauses` rounds that stop a worker with SIGSTOP for `--pause` (default 2 s: a GC pause or a
//! slow disk) and let it go on with SIGCONT, the paused worker's partitions pinned anew from the pause until a
//! time-to-live after it. They are always safe (the fence refuses the old owner's appends) and must stay rare.
//!
//! With `--nats-monitor` (the server's HTTP monitoring URL), it also measures what the workers cost the server at
//! idle: the messages in and out per second (`/varz`) over `--idle` with no command published.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use leasehold_log::jetstream::{CMD_STREAM, JetStream, JetStreamConfig, writer_consumer_partition};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::codec;
use leasehold_schemas::ids::AgentName;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of_agent};
use leasehold_worker::preferred_worker;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TakeoverArgs {
    /// The NATS server (it must hold no leasehold streams yet; they are deleted after).
    #[arg(long)]
    nats: String,
    /// The server's HTTP monitoring URL (`http://127.0.0.1:8222`), to measure the workers' cost at idle.
    #[arg(long)]
    nats_monitor: Option<String>,
    /// Stream replicas (3 on a cluster).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Worker processes; one of them is killed each round.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Kills timed.
    #[arg(long, default_value_t = 100)]
    kills: usize,
    /// Rounds that pause a worker instead (SIGSTOP, then SIGCONT after --pause).
    #[arg(long, default_value_t = 20)]
    pauses: usize,
    /// How long a paused worker stays stopped.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// Commands per second on each partition, all along.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Resources allocated on each partition, at most: past them, its agent registers again (an outcome that adds
    /// nothing to the partition's state), so a partition's load stays the same over the run.
    #[arg(long, default_value_t = 100)]
    live: u32,
    /// The log's `--priority-timeout` (the bench creates the log, so its value is the log's).
    #[arg(long, default_value = "2.5s", value_parser = humantime::parse_duration)]
    priority_timeout: Duration,
    /// Keep the workers' logs (stderr) in this directory instead of a temporary one.
    #[arg(long, hide = true)]
    logs: Option<std::path::PathBuf>,
    /// How long the idle cost is measured (with --nats-monitor).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle: Duration,
}

#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct TakeoverFigures {
    backend: String,
    partitions: u32,
    workers: usize,
    rate_per_partition: u32,
    live_per_partition: u32,
    priority_timeout_s: f64,
    kills: usize,
    /// Partitions taken over (a kill takes about `partitions / workers`).
    takeovers: usize,
    takeover_p50_s: f64,
    takeover_p99_s: f64,
    takeover_max_s: f64,
    /// The kill to the survivor's pin alone (the rest is its load and first decision).
    pinned_p50_s: f64,
    pinned_p99_s: f64,
    /// Partitions of a dead worker not decided again within 30 s.
    takeovers_missed: usize,
    pauses: usize,
    pause_s: f64,
    false_takeovers: usize,
    false_takeovers_in_kills: usize,
    false_takeovers_in_pauses: usize,
    /// Messages in and out of the server per second with the workers idle (`--nats-monitor`), and per partition.
    idle_msgs_per_s: Option<f64>,
    idle_msgs_per_s_per_partition: Option<f64>,
}

/// What the bench sees of the log: outcome arrivals and pin moves per partition, on this machine's clock.
#[derive(Debug, Default)]
struct Seen {
    outcomes: BTreeMap<u32, Vec<Instant>>,
    pins: BTreeMap<u32, Vec<Instant>>,
}

/// The first of `times` (in the order they were seen, so sorted) later than `after`.
fn first_after(times: Option<&Vec<Instant>>, after: Instant) -> Option<Instant> {
    let times = times?;
    times.get(times.partition_point(|at| *at <= after)).copied()
}

impl Seen {
    fn first_outcome_after(&self, partition: u32, after: Instant) -> Option<Instant> {
        first_after(self.outcomes.get(&partition), after)
    }

    fn first_pin_after(&self, partition: u32, after: Instant) -> Option<Instant> {
        first_after(self.pins.get(&partition), after)
    }

    /// How many of `partitions` were pinned anew after `from`, up to `to`.
    fn pinned_between(&self, partitions: &[u32], from: Instant, to: Instant) -> usize {
        partitions.iter().filter(|p| first_after(self.pins.get(p), from).is_some_and(|at| at <= to)).count()
    }

    /// Every partition decided within `window`, and none pinned anew within it.
    fn steady(&self, partitions: u32, window: Duration, now: Instant) -> bool {
        (0..partitions).all(|p| {
            let recent = |times: Option<&Vec<Instant>>| {
                times.and_then(|t| t.last()).is_some_and(|at| now.duration_since(*at) < window)
            };
            recent(self.outcomes.get(&p)) && !recent(self.pins.get(&p))
        })
    }
}

/// One worker process of the bench.
struct Worker {
    name: String,
    child: Child,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn run(args: TakeoverArgs) -> anyhow::Result<()> {
    ensure!(args.workers >= 2, "--workers must be at least 2: one dies, another takes over");
    ensure!(args.rate >= 1, "--rate must be at least 1");
    let config = JetStreamConfig {
        replicas: args.replicas,
        priority_timeout: args.priority_timeout,
        ..JetStreamConfig::new(&args.nats, args.partitions)
    };
    let log = JetStream::connect(config).await.with_context(|| format!("connecting to {}", args.nats))?;
    let live = log.workers("leasehold-bench", false).await?;
    ensure!(
        live.is_empty() && log.last_command_seq().await? == 0,
        "bench takeover needs a NATS server without leasehold data or workers ({} live): it deletes its streams when \
         it is done",
        live.len()
    );
    let measured = measure(&log, &args).await;
    log.bench_reset().await?;
    let figures = measured?;
    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

async fn measure(log: &JetStream, args: &TakeoverArgs) -> anyhow::Result<TakeoverFigures> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = tokio::task::JoinSet::new();
    // The pins, from the server's advisories (subscribed before any worker starts).
    let mut advisories = log
        .client()
        .subscribe(format!("$JS.EVENT.ADVISORY.CONSUMER.PINNED.{CMD_STREAM}.*"))
        .await
        .context("subscribing to the pinned advisories")?;
    let pins = seen.clone();
    tasks.spawn(async move {
        while let Some(message) = advisories.next().await {
            let consumer = message.subject.as_str().rsplit('.').next().unwrap_or_default().to_owned();
            if let Some(partition) = writer_consumer_partition(&consumer) {
                pins.lock().expect("seen lock").pins.entry(partition).or_default().push(Instant::now());
            }
        }
    });
    let outcomes = seen.clone();
    let mut feed = log.follow(OutcomeFilter::All, 1);
    tasks.spawn(async move {
        while let Some(Ok(outcome)) = feed.next().await {
            outcomes.lock().expect("seen lock").outcomes.entry(outcome.partition).or_default().push(Instant::now());
        }
    });

    // Every writer consumer made now, before the workers ask for them all at once: on a fresh R3 log that many
    // creations can outlast a request, and a partition its worker could not ask for in time is adopted by another,
    // which keeps it (so the shares would not be what the rounds assume).
    for partition in 0..args.partitions {
        log.is_served(partition)
            .await
            .with_context(|| format!("making the writer consumer of partition {partition}"))?;
    }
    let scratch = tempfile::tempdir().context("a temporary directory for the workers' logs")?;
    let logs = args.logs.clone().unwrap_or_else(|| scratch.path().to_owned());
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let exe = std::env::current_exe().context("the path of this binary")?;
    let names: Vec<String> = (0..args.workers).map(|i| format!("bench-takeover-w{i}")).collect();
    let start = |name: &str| -> anyhow::Result<Worker> {
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(logs.join(format!("{name}.log")))?;
        let child = Command::new(&exe)
            .args(["serve", "--roles", "worker", "--listen", "127.0.0.1:0", "--name", name])
            .args(["--nats", &args.nats, "--partitions", &args.partitions.to_string()])
            .args(["--replicas", &args.replicas.to_string()])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting worker {name}"))?;
        Ok(Worker { name: name.to_owned(), child })
    };
    let mut workers: Vec<Worker> = names.iter().map(|n| start(n)).collect::<anyhow::Result<_>>()?;

    // One agent per partition, registered, then allocations on every partition at the rate asked.
    let agents = agents_per_partition(args.partitions);
    let mut ids = super::Ids(0);
    for agent in &agents {
        publish(log, &super::registration(agent, &mut ids)).await?;
    }
    let producer_log = log.clone();
    let (rate, live, producer_agents) = (args.rate, args.live, agents.clone());
    tasks.spawn(async move {
        let mut ids = super::Ids(1 << 40);
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
        let mut allocated = 0;
        loop {
            tick.tick().await;
            allocated += 1;
            for agent in &producer_agents {
                let envelope = if allocated <= live {
                    super::allocation(agent, &mut ids)
                } else {
                    super::registration(agent, &mut ids)
                };
                if let Err(e) = publish(&producer_log, &envelope).await {
                    eprintln!("the producer stopped: {e:#}");
                    return;
                }
            }
        }
    });

    let ttl = log.worker_ttl();
    let mut figures = TakeoverFigures {
        backend: if args.replicas > 1 { format!("jetstream-r{}", args.replicas) } else { "jetstream".into() },
        partitions: args.partitions,
        workers: args.workers,
        rate_per_partition: args.rate,
        live_per_partition: args.live,
        priority_timeout_s: ttl.as_secs_f64(),
        kills: args.kills,
        pauses: args.pauses,
        pause_s: args.pause.as_secs_f64(),
        ..TakeoverFigures::default()
    };
    let (mut takeovers, mut pins) = (Vec::new(), Vec::new());
    let rounds = args.kills + args.pauses;
    for round in 0..rounds {
        steady(log, &seen, &names, args.partitions, ttl).await?;
        let victim = round % args.workers;
        let name = names[victim].clone();
        let share: Vec<u32> =
            (0..args.partitions).filter(|p| preferred_worker(*p, &names) == Some(name.as_str())).collect();
        let others: Vec<u32> = (0..args.partitions).filter(|p| !share.contains(p)).collect();
        if round < args.kills {
            let killed = Instant::now();
            workers[victim].child.kill().context("killing a worker")?;
            workers[victim].child.wait().context("reaping a worker")?;
            let deadline = killed + Duration::from_secs(30);
            let mut pending = share.clone();
            while !pending.is_empty() && Instant::now() < deadline {
                {
                    let now_seen = seen.lock().expect("seen lock");
                    pending.retain(|p| {
                        let pinned = now_seen.first_pin_after(*p, killed);
                        let decided = pinned.and_then(|pinned| now_seen.first_outcome_after(*p, pinned));
                        if let (Some(pinned), Some(at)) = (pinned, decided) {
                            pins.push(pinned.duration_since(killed));
                            takeovers.push(at.duration_since(killed));
                        }
                        decided.is_none()
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            figures.takeovers_missed += pending.len();
            let wrong = seen.lock().expect("seen lock").pinned_between(&others, killed, Instant::now());
            figures.false_takeovers_in_kills += wrong;
            workers[victim] = start(&name)?;
            eprintln!(
                "kill {}/{}: {} partitions taken over{}",
                round + 1,
                args.kills,
                share.len() - pending.len(),
                if wrong > 0 { format!(", {wrong} other pins moved") } else { String::new() }
            );
        } else {
            let paused = Instant::now();
            signal(&workers[victim], "-STOP")?;
            tokio::time::sleep(args.pause).await;
            signal(&workers[victim], "-CONT")?;
            // A pin lost to the pause moves within a time-to-live of it.
            tokio::time::sleep(ttl).await;
            let wrong = seen.lock().expect("seen lock").pinned_between(&share, paused, Instant::now());
            figures.false_takeovers_in_pauses += wrong;
            eprintln!(
                "pause {}/{} of {:.1} s: {}",
                round + 1 - args.kills,
                args.pauses,
                args.pause.as_secs_f64(),
                if wrong > 0 { format!("{wrong} pins moved") } else { "no pin moved".to_owned() }
            );
        }
    }
    figures.false_takeovers = figures.false_takeovers_in_kills + figures.false_takeovers_in_pauses;
    figures.takeovers = takeovers.len();
    figures.takeover_p50_s = super::quantile_s(&mut takeovers, 0.50);
    figures.takeover_p99_s = super::quantile_s(&mut takeovers, 0.99);
    figures.takeover_max_s = takeovers.iter().max().map_or(0.0, Duration::as_secs_f64);
    figures.pinned_p50_s = super::quantile_s(&mut pins, 0.50);
    figures.pinned_p99_s = super::quantile_s(&mut pins, 0.99);
    steady(log, &seen, &names, args.partitions, ttl).await?;
    tasks.abort_all();
    if let Some(monitor) = &args.nats_monitor {
        // The producer stopped: once its last commands are decided, what remains is the workers' pulls, their
        // liveness puts and their watches.
        tokio::time::sleep(ttl).await;
        let idle = idle_cost(monitor, args.idle).await?;
        figures.idle_msgs_per_s = Some(idle);
        figures.idle_msgs_per_s_per_partition = Some(idle / f64::from(args.partitions));
    }
    drop(workers);
    Ok(figures)
}

/// Waits until every worker is listed alive and every partition is decided steadily (an outcome and no pin move in
/// the last time-to-live), for at most a minute.
async fn steady(
    log: &JetStream,
    seen: &Mutex<Seen>,
    names: &[String],
    partitions: u32,
    ttl: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live = log.workers("leasehold-bench", false).await?;
        let all_live = names.iter().all(|n| live.contains(n));
        if all_live && seen.lock().expect("seen lock").steady(partitions, ttl, Instant::now()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the workers did not settle in a minute (live: {live:?})");
        }
        // Each look is a purge of the bench's own key, seen by every worker's watch: not too often.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn signal(worker: &Worker, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").arg(signal).arg(worker.child.id().to_string()).status()?;
    ensure!(status.success(), "kill {signal} {} failed", worker.name);
    Ok(())
}

/// For each partition, the first of the bench's agent names that falls in it.
fn agents_per_partition(partitions: u32) -> Vec<AgentName> {
    let mut chosen: BTreeMap<u32, AgentName> = BTreeMap::new();
    for i in 0.. {
        let agent = AgentName::new(format!("bench-takeover-{i}")).expect("a valid name");
        chosen.entry(partition_of_agent(&agent, partitions)).or_insert(agent);
        if chosen.len() == partitions as usize {
            break;
        }
    }
    chosen.into_values().collect()
}

async fn publish(log: &JetStream, envelope: &leasehold_schemas::Envelope) -> anyhow::Result<()> {
    let payload = codec::encode_command(envelope)?;
    log.publish_command(&ingress_subject_of(&envelope.body), &envelope.command_id.to_string(), payload.into()).await?;
    Ok(())
}

/// Messages in plus out of the server per second over `window` (`/varz`).
async fn idle_cost(monitor: &str, window: Duration) -> anyhow::Result<f64> {
    let before = super::ServerCounters::read(monitor).await?;
    let from = Instant::now();
    tokio::time::sleep(window).await;
    let after = super::ServerCounters::read(monitor).await?;
    let messages = (after.in_msgs - before.in_msgs) + (after.out_msgs - before.out_msgs);
    Ok(messages / from.elapsed().as_secs_f64())
}

fn print_table(f: &TakeoverFigures) {
    println!(
        "leasehold bench takeover: {} log, {} partitions, {} workers, {} commands/s and {} resources per partition, \
         priority timeout {:.1} s",
        f.backend, f.partitions, f.workers, f.rate_per_partition, f.live_per_partition, f.priority_timeout_s
    );
    println!("  kill -9 to the survivor's first outcome, {} partitions over {} kills:", f.takeovers, f.kills);
    println!("    p50 {:>7.3} s", f.takeover_p50_s);
    println!("    p99 {:>7.3} s", f.takeover_p99_s);
    println!("    max {:>7.3} s   ({} not decided again within 30 s)", f.takeover_max_s, f.takeovers_missed);
    println!("    of which the kill to the survivor's pin: p50 {:.3} s, p99 {:.3} s", f.pinned_p50_s, f.pinned_p99_s);
    println!(
        "  false takeovers: {} ({} in kill rounds, {} in {} pauses of {:.1} s)",
        f.false_takeovers, f.false_takeovers_in_kills, f.false_takeovers_in_pauses, f.pauses, f.pause_s
    );
    if let (Some(total), Some(per)) = (f.idle_msgs_per_s, f.idle_msgs_per_s_per_partition) {
        println!("  idle cost: {total:.1} server messages/s ({per:.1} per partition)");
    }
}
