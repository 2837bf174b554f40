//! `leasehold bench throughput`: in one run, on the log it is pointed at, the log's raw append rates and
//! leasehold's own rates, so that the figures compare as ratios that survive a noisy machine. A benchmark, never a
//! test: it prints a table and, as its last line, one JSON object.
//!
//! It needs an empty log (a new data directory, or a NATS server with no leasehold streams yet) and refuses any
//! other: it publishes tens of thousands of commands.
//!
//! `leasehold bench regrant` (how soon a released pool identifier goes to the holder waiting for it) is in
//! `bench/regrant.rs`; `leasehold bench place` (how long a placement takes, in command round trips) in
//! `bench/place.rs`; `leasehold bench takeover` (how soon a killed worker's partitions are decided again) in
//! `bench/takeover.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use leasehold_domain::driver::Driver;
use leasehold_log::embedded::Embedded;
use leasehold_log::{Log, OutcomeFilter, OutcomeRecord, Snapshot};
use leasehold_schemas::command::{Allocate, Heartbeat, Register, ReportCreated};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Millis, Position, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Effect, Envelope, Uuid, codec};
use leasehold_worker::{WriterConfig, fold_partition};
use tokio_util::sync::CancellationToken;

mod place;
mod regrant;
mod takeover;

/// A benchmark that measures on one log, whichever it is (`bench regrant`, `bench place`).
pub(crate) trait OnLog {
    type Figures;
    /// `backend` names the log in the figures (`embedded`, `jetstream`, `jetstream-r3`).
    async fn measure<L: Log>(&self, log: &L, backend: &str) -> anyhow::Result<Self::Figures>;
}

/// The empty log a benchmark named `name` runs on: a NATS server's (`nats`, with `replicas`; its streams are deleted
/// after, however the rounds ended) or an embedded one in `data` (default: a new temporary directory).
pub(crate) struct EmptyLog<'a> {
    pub(crate) name: &'static str,
    pub(crate) data: Option<&'a Path>,
    pub(crate) nats: Option<&'a str>,
    pub(crate) replicas: usize,
    pub(crate) partitions: u32,
}

impl EmptyLog<'_> {
    /// Runs `bench` on this log, refusing one that holds leasehold data (or, on NATS, has live workers).
    pub(crate) async fn run<B: OnLog>(&self, bench: &B) -> anyhow::Result<B::Figures> {
        let name = self.name;
        match self.nats {
            Some(url) => {
                use leasehold_log::jetstream::{JetStream, JetStreamConfig};
                let config = JetStreamConfig { replicas: self.replicas, ..JetStreamConfig::new(url, self.partitions) };
                let log = JetStream::connect(config).await.with_context(|| format!("connecting to {url}"))?;
                let live = log.workers("leasehold-bench", false).await?;
                anyhow::ensure!(
                    live.is_empty() && log.last_command_seq().await? == 0,
                    "bench {name} needs a NATS server without leasehold data or workers ({} live): it deletes its \
                     streams when it is done",
                    live.len()
                );
                let backend =
                    if self.replicas > 1 { format!("jetstream-r{}", self.replicas) } else { "jetstream".into() };
                let measured = bench.measure(&log, &backend).await;
                log.bench_reset().await?;
                measured
            }
            None => {
                let temp;
                let dir = match self.data {
                    Some(dir) => dir.to_owned(),
                    None => {
                        temp = tempfile::tempdir().context("a temporary directory")?;
                        temp.path().to_owned()
                    }
                };
                let log = Embedded::open(&dir.join("log"), self.partitions)
                    .with_context(|| format!("opening the embedded log in {}", dir.display()))?;
                anyhow::ensure!(
                    log.last_command_seq().await? == 0,
                    "bench {name} needs an empty log: point --data at a new directory"
                );
                bench.measure(&log, "embedded").await
            }
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum BenchCmd {
    /// Raw log rates beside leasehold's end-to-end rate, latency, fence fan-out cost and takeover time.
    Throughput(ThroughputArgs),
    /// How soon a pool identifier freed by a release is bound to the holder waiting for it (p50/p99 of many rounds,
    /// cool-down subtracted), with the services of `serve` and one agent in this process.
    Regrant(regrant::RegrantArgs),
    /// How long a placement takes (op.place to placement-bound, and to its resource allocated; p50/p99 of many
    /// rounds) beside one command's round trip, with the services of `serve` and a few agents in this process.
    Place(place::PlaceArgs),
    /// How soon a killed worker's partitions are decided again by a survivor (p50/p99 over many kills of worker
    /// processes under load), and how often a pin moves when it should not (kills and pauses): NATS only.
    Takeover(takeover::TakeoverArgs),
    /// (Used by `throughput`.) Folds partition 0 of a one-partition log in a fresh process and prints the memory
    /// the fold took, per live resource, as JSON.
    #[command(hide = true)]
    Memory(MemoryArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct MemoryArgs {
    #[arg(long, conflicts_with = "nats")]
    data: Option<PathBuf>,
    #[arg(long)]
    nats: Option<String>,
    #[arg(long, default_value_t = 1)]
    replicas: usize,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ThroughputArgs {
    /// An empty data directory for the embedded log (default: a new temporary directory).
    #[arg(long, conflicts_with = "nats")]
    data: Option<PathBuf>,
    /// Measure a NATS JetStream server instead (it must hold no leasehold streams yet).
    #[arg(long)]
    nats: Option<String>,
    /// Commands per end-to-end phase.
    #[arg(long, default_value_t = 20_000)]
    commands: u64,
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Workers sharing the partitions.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Outcomes in the partition whose takeover is timed.
    #[arg(long, default_value_t = 1_000_000)]
    takeover_outcomes: u64,
    /// Commands timed one at a time, from publish to projection.
    #[arg(long, default_value_t = 300)]
    latency_samples: usize,
    /// Stream replicas on NATS (3 on a cluster).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// The NATS server's HTTP monitoring URL (`http://127.0.0.1:8222`; on a cluster, the node the bench connects
    /// to): counts the server's operations per command (`server_ops_per_command`) from its own counters.
    #[arg(long, requires = "nats")]
    nats_monitor: Option<String>,
}

/// Bytes of an outcome of the usual kind (an allocation with a few attributes), for the raw runs.
const OUTCOME_BYTES: usize = 300;

#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct Figures {
    backend: String,
    partitions: u32,
    workers: usize,
    commands: u64,
    raw_append_per_s: f64,
    raw_fenced_per_s: f64,
    raw_batch_100_per_s: f64,
    raw_batch_1000_per_s: f64,
    publish_per_s: f64,
    publish_batched_per_s: f64,
    e2e_unbatched_per_s: f64,
    e2e_commands_per_s: f64,
    e2e_batched_per_s: f64,
    e2e_concurrent_per_s: f64,
    mean_batch: f64,
    ratio: f64,
    ratio_ceiling: f64,
    ratio_durable: f64,
    p50_ms: f64,
    p99_ms: f64,
    p50_unbatched_ms: f64,
    p99_unbatched_ms: f64,
    p50_loaded_ms: f64,
    p99_loaded_ms: f64,
    fenced_append_100_agents_per_s: f64,
    fenced_append_10000_agents_per_s: f64,
    takeover_outcomes: u64,
    takeover_s: f64,
    takeover_without_snapshot_s: f64,
    live_resources: u64,
    bytes_per_live_resource: f64,
    /// Server operations per message of the raw append phase (`--nats-monitor`): about 1, the calibration.
    raw_append_server_ops: Option<f64>,
    /// Server operations per command decided in the group-commit phase (delivery, acks, reads, the outcome's
    /// store, the follower's delivery; the commands were stored before it).
    decide_server_ops_per_command: Option<f64>,
    /// A command's whole path: its publish (as a raw append) and its decision.
    server_ops_per_command: Option<f64>,
}

/// The server's own message counters (`/varz`), to count its operations between two readings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerCounters {
    pub(crate) in_msgs: f64,
    pub(crate) out_msgs: f64,
}

impl ServerCounters {
    pub(crate) async fn read(monitor: &str) -> anyhow::Result<ServerCounters> {
        let base = monitor.trim_end_matches('/');
        let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        let get = |path: &'static str| {
            let client = client.clone();
            let url = format!("{base}/{path}");
            async move {
                let value: serde_json::Value =
                    client.get(&url).send().await?.error_for_status()?.json().await.context("a JSON answer")?;
                anyhow::Ok(value)
            }
        };
        let varz = get("varz").await.with_context(|| format!("reading {base}/varz"))?;
        let number = |field: &str| varz[field].as_f64().unwrap_or(0.0);
        Ok(ServerCounters { in_msgs: number("in_msgs"), out_msgs: number("out_msgs") })
    }

    /// Server operations per `n` between `self` and `later`, `stored` messages stored between them: every message
    /// the server took in or sent, a stored message and its answer counting once (so a raw append is one). (`/jsz`
    /// counts stored messages too, but refreshes them every few seconds: the caller knows them exactly.)
    pub(crate) fn ops_until(&self, later: &ServerCounters, stored: u64, n: u64) -> f64 {
        let messages = (later.in_msgs - self.in_msgs) + (later.out_msgs - self.out_msgs);
        (messages - stored as f64) / n.max(1) as f64
    }
}

pub(crate) fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    match cmd {
        BenchCmd::Throughput(args) => runtime.block_on(throughput(args)),
        BenchCmd::Memory(args) => runtime.block_on(memory(args)),
        BenchCmd::Regrant(args) => runtime.block_on(regrant::run(args)),
        BenchCmd::Place(args) => runtime.block_on(place::run(args)),
        BenchCmd::Takeover(args) => runtime.block_on(takeover::run(args)),
    }
}

async fn throughput(args: ThroughputArgs) -> anyhow::Result<()> {
    if args.commands < u64::from(args.partitions) * 8 {
        bail!("--commands must be at least 8 per partition");
    }
    let mut figures =
        Figures { partitions: args.partitions, workers: args.workers, commands: args.commands, ..Figures::default() };
    match &args.nats {
        Some(url) => nats(url, &args, &mut figures).await?,
        None => {
            let temp;
            let dir = match &args.data {
                Some(dir) => dir.clone(),
                None => {
                    temp = tempfile::tempdir().context("a temporary directory")?;
                    temp.path().to_owned()
                }
            };
            embedded(&dir, &args, &mut figures).await?;
        }
    }
    figures.ratio = figures.e2e_commands_per_s / figures.raw_fenced_per_s.max(1e-9);
    figures.ratio_ceiling = figures.e2e_commands_per_s / figures.raw_append_per_s.max(1e-9);
    // On a `sync_interval: always` server the raw per-message append is the per-message durable rate.
    figures.ratio_durable = figures.e2e_batched_per_s / figures.raw_append_per_s.max(1e-9);
    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

async fn embedded(dir: &Path, args: &ThroughputArgs, figures: &mut Figures) -> anyhow::Result<()> {
    figures.backend = "embedded".to_owned();
    let scratch = dir.join("bench-scratch");
    std::fs::create_dir_all(&scratch)?;
    eprintln!("raw appends (one durable redb transaction each)...");
    let raw =
        leasehold_log::raw::embedded_raw_append(&scratch, args.commands.min(20_000), args.partitions, OUTCOME_BYTES)?;
    figures.raw_append_per_s = raw.per_second();
    eprintln!("raw fenced appends (the embedded log's own append, one in flight per partition)...");
    let fenced_log = Embedded::open(&scratch.join("fenced"), args.partitions)?;
    figures.raw_fenced_per_s = batched_appends(&fenced_log, args.commands.min(20_000), 1).await?;
    drop(fenced_log);
    raw_batches(args, figures, |name| Embedded::open(&scratch.join(name), args.partitions)).await?;
    for agents in [100u64, 10_000] {
        eprintln!("fenced appends with {agents} agents in one partition...");
        let log = Embedded::open(&scratch.join(format!("fanout-{agents}")), 1)?;
        let rate = fanout(&log, agents, 2_000).await?;
        if agents == 100 {
            figures.fenced_append_100_agents_per_s = rate;
        } else {
            figures.fenced_append_10000_agents_per_s = rate;
        }
    }
    let log = Embedded::open(&dir.join("log"), args.partitions)?;
    end_to_end(&log, &log, args, figures).await?;
    drop(log);
    eprintln!("takeover of a partition holding {} outcomes...", args.takeover_outcomes);
    let takeover_dir = scratch.join("takeover");
    let log = Embedded::open(&takeover_dir, 1)?;
    let filler = log.clone();
    takeover(&log, args.takeover_outcomes, figures, move |fence, records| {
        let log = filler.clone();
        async move {
            match log.append(0, fence, &records).await {
                leasehold_log::Appended::Landed { last, .. } => Ok(last),
                other => bail!("filling the takeover partition: {other:?}"),
            }
        }
    })
    .await?;
    drop(log);
    figures.bytes_per_live_resource = memory_in_child(&["--data", &takeover_dir.display().to_string()])?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

async fn nats(url: &str, args: &ThroughputArgs, figures: &mut Figures) -> anyhow::Result<()> {
    use leasehold_log::jetstream::{JetStream, JetStreamConfig};
    figures.backend = if args.replicas > 1 { format!("jetstream-r{}", args.replicas) } else { "jetstream".to_owned() };
    let config = JetStreamConfig { replicas: args.replicas, ..JetStreamConfig::new(url, args.partitions) };
    let log = JetStream::connect(config).await.with_context(|| format!("connecting to {url}"))?;
    // A server with leasehold's data or live workers is refused: the benchmark publishes tens of thousands of
    // commands and deletes the streams it used when it is done.
    let live = log.workers("leasehold-bench", false).await?;
    anyhow::ensure!(
        log.last_command_seq().await? == 0
            && last_outcome(&log).await? == 0
            && log.read_dead_letters(1, 1).await?.is_empty()
            && live.is_empty(),
        "bench throughput needs a NATS server without leasehold data or workers ({} live): it publishes tens of \
         thousands of commands and deletes its streams when it is done",
        live.len()
    );
    let measured = nats_phases(&log, url, args, figures).await;
    // The streams are removed however the phases ended.
    log.bench_reset().await?;
    measured
}

async fn nats_phases(
    log: &leasehold_log::jetstream::JetStream,
    url: &str,
    args: &ThroughputArgs,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    use leasehold_log::jetstream::{JetStream, JetStreamConfig};
    let n = args.commands;
    eprintln!("raw appends (up to 256 in flight, no fence)...");
    let before = match &args.nats_monitor {
        Some(monitor) => Some(ServerCounters::read(monitor).await?),
        None => None,
    };
    figures.raw_append_per_s = log.bench_raw_append(n, args.partitions, OUTCOME_BYTES, 256).await?.per_second();
    if let (Some(monitor), Some(before)) = (&args.nats_monitor, before) {
        figures.raw_append_server_ops = Some(before.ops_until(&ServerCounters::read(monitor).await?, n, n));
    }
    eprintln!("raw fenced appends (one in flight per partition)...");
    figures.raw_fenced_per_s = log.bench_raw_fenced(n, args.partitions, OUTCOME_BYTES).await?.per_second();
    for size in [100usize, 1000] {
        eprintln!("raw atomic batches of {size} (the log's append, one batch in flight per partition)...");
        let rate = batched_appends(log, n.max(size as u64 * u64::from(args.partitions)), size).await?;
        if size == 100 {
            figures.raw_batch_100_per_s = rate;
        } else {
            figures.raw_batch_1000_per_s = rate;
        }
    }
    // The raw phases' outcomes are not leasehold's: the end-to-end phases need the streams empty.
    log.bench_reset().await?;
    let log =
        &JetStream::connect(JetStreamConfig { replicas: args.replicas, ..JetStreamConfig::new(url, args.partitions) })
            .await?;
    for agents in [100u64, 10_000] {
        eprintln!("fenced appends with {agents} agents in one partition...");
        let rate = log.bench_fenced_fanout(agents, 2_000, OUTCOME_BYTES).await?.per_second();
        if agents == 100 {
            figures.fenced_append_100_agents_per_s = rate;
        } else {
            figures.fenced_append_10000_agents_per_s = rate;
        }
    }
    let writer_log =
        &JetStream::connect(JetStreamConfig { replicas: args.replicas, ..JetStreamConfig::new(url, args.partitions) })
            .await?;
    end_to_end(log, writer_log, args, figures).await?;
    eprintln!("takeover of a partition holding {} outcomes (on a fresh one-partition log)...", args.takeover_outcomes);
    log.bench_reset().await?;
    let config = JetStreamConfig { replicas: args.replicas, ..JetStreamConfig::new(url, 1) };
    let one = JetStream::connect(config).await?;
    let filler = one.clone();
    takeover(&one, args.takeover_outcomes, figures, move |fence, records| {
        let log = filler.clone();
        async move { Ok(log.bench_fill(0, fence, &records).await?) }
    })
    .await?;
    let replicas = args.replicas.to_string();
    figures.bytes_per_live_resource = memory_in_child(&["--nats", url, "--replicas", &replicas])?;
    Ok(())
}

/// Runs `leasehold bench memory` in a fresh process (so the allocator's heap holds the fold and little else) and
/// reads its answer: bytes of resident memory per live resource.
fn memory_in_child(args: &[&str]) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("this program's path")?;
    let output = std::process::Command::new(exe)
        .args(["bench", "memory"])
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running bench memory")?;
    anyhow::ensure!(output.status.success(), "bench memory failed");
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().context("bench memory printed nothing")?;
    let value: serde_json::Value = serde_json::from_str(line)?;
    value["bytes_per_live_resource"].as_f64().context("no bytes_per_live_resource")
}

async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    let config = WriterConfig::default();
    let before = rss_bytes();
    let folded = match (&args.data, &args.nats) {
        (Some(dir), _) => fold_partition(&Embedded::open(dir, 1)?, 0, 0, &config).await?,
        (None, Some(url)) => {
            use leasehold_log::jetstream::{JetStream, JetStreamConfig};
            let js = JetStreamConfig { replicas: args.replicas, ..JetStreamConfig::new(url.as_str(), 1) };
            let log = JetStream::connect(js).await?;
            fold_partition(&log, 0, 0, &config).await?
        }
        (None, None) => bail!("give --data or --nats"),
    };
    let after = rss_bytes();
    let live = folded.state.resources().filter(|r| r.state.is_held()).count() as u64;
    let per = after.saturating_sub(before) as f64 / live.max(1) as f64;
    println!("{}", serde_json::json!({ "live_resources": live, "bytes_per_live_resource": per }));
    Ok(())
}

fn raw_record(key: &str, cmd_seq: u64) -> OutcomeRecord {
    OutcomeRecord {
        key: key.to_owned(),
        cmd_id: format!("raw-{cmd_seq}"),
        cmd_seq,
        part: 0,
        payload: Bytes::from(vec![0x5a; OUTCOME_BYTES]),
    }
}

/// The raw batch rates on the embedded log, each on a fresh file made by `open`.
async fn raw_batches<F>(args: &ThroughputArgs, figures: &mut Figures, open: F) -> anyhow::Result<()>
where
    F: Fn(&str) -> Result<Embedded, leasehold_log::Error>,
{
    for size in [100usize, 1000] {
        eprintln!("raw batches of {size} (one transaction each, one in flight per partition)...");
        let log = open(&format!("batch-{size}"))?;
        let rate = batched_appends(&log, args.commands.max(size as u64 * u64::from(args.partitions)), size).await?;
        if size == 100 {
            figures.raw_batch_100_per_s = rate;
        } else {
            figures.raw_batch_1000_per_s = rate;
        }
    }
    Ok(())
}

/// `n` records appended as fenced appends of `size` (a batch: an atomic batch on JetStream, a transaction on the
/// embedded log), one append in flight per partition: the log's own fenced ceiling (`size` 1) and group-commit
/// ceiling. Records/s.
pub(crate) async fn batched_appends<L: Log>(log: &L, n: u64, size: usize) -> anyhow::Result<f64> {
    let partitions = log.partitions();
    let rounds = (n / u64::from(partitions)).div_ceil(size as u64).max(1);
    let start = Instant::now();
    let mut lanes = tokio::task::JoinSet::new();
    for p in 0..partitions {
        let log = log.clone();
        lanes.spawn(async move {
            let mut fence = log.last_outcome_seq(p).await?;
            // Command sequences after the partition's last outcome: an outcome's message id names its command, and
            // an atomic batch holding an id stored before is refused whole.
            let base = fence;
            for round in 0..rounds {
                let records: Vec<_> = (0..size as u64)
                    .map(|i| raw_record(&format!("raw{}", i % 16), base + round * size as u64 + i + 1))
                    .collect();
                match log.append(p, fence, &records).await {
                    leasehold_log::Appended::Landed { last, .. } => fence = last,
                    other => bail!("a raw batch did not land: {other:?}"),
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane??;
    }
    Ok((rounds * size as u64 * u64::from(partitions)) as f64 / start.elapsed().as_secs_f64())
}

/// One record for each of `agents` keys in partition 0, then `n` fenced appends cycling over them: what the fence
/// costs when every agent of the partition matches its filter. Returns appends/s of the timed part.
pub(crate) async fn fanout<L: Log>(log: &L, agents: u64, n: u64) -> anyhow::Result<f64> {
    let mut fence = log.last_outcome_seq(0).await?;
    let keys: Vec<String> = (0..agents).map(|i| format!("agent{i}")).collect();
    for (i, chunk) in keys.chunks(1000).enumerate() {
        let records: Vec<OutcomeRecord> =
            chunk.iter().enumerate().map(|(j, k)| raw_record(k, (i * 1000 + j) as u64 + 1)).collect();
        match log.append(0, fence, &records).await {
            leasehold_log::Appended::Landed { last, .. } => fence = last,
            other => bail!("setting up {agents} agents: {other:?}"),
        }
    }
    let start = Instant::now();
    for i in 0..n {
        let record = raw_record(&keys[(i % agents) as usize], agents + i + 1);
        match log.append(0, fence, &[record]).await {
            leasehold_log::Appended::Landed { last, .. } => fence = last,
            other => bail!("a fenced append with {agents} agents: {other:?}"),
        }
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub(crate) struct Ids(pub(crate) u64);

impl Ids {
    fn next(&mut self) -> [u8; 10] {
        self.0 += 1;
        let mut entropy = [0u8; 10];
        entropy[0] = 0xbe;
        entropy[2..].copy_from_slice(&self.0.to_be_bytes());
        entropy
    }
}

fn now() -> Timestamp {
    leasehold_log::embedded::system_clock()()
}

fn agents(partitions: u32) -> Vec<AgentName> {
    (0..partitions * 4).map(|i| AgentName::new(format!("bench-{i}")).expect("a valid name")).collect()
}

pub(crate) fn registration(agent: &AgentName, ids: &mut Ids) -> Envelope {
    let at = now();
    let body =
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(7)) };
    Envelope::new(CommandId::from_parts(at.0, ids.next()), Issuer::new(agent.as_str()).expect("valid"), at, body)
}

pub(crate) fn allocation(agent: &AgentName, ids: &mut Ids) -> Envelope {
    let at = now();
    let resource = ResourceId::from_parts(at.0, ids.next());
    let mut attributes = BTreeMap::new();
    attributes.insert("image".to_owned(), "ci-runner:2026.11".to_owned());
    attributes.insert("size".to_owned(), "20G".to_owned());
    let body = Allocate {
        agent: agent.clone(),
        resource,
        kind: "volume".to_owned(),
        capacity: 4,
        attributes,
        parent: None,
        pools: vec![],
        wait: None,
    };
    Envelope::new(CommandId::from_parts(at.0, ids.next()), Issuer::new("bench").expect("valid"), at, body)
}

/// How commands are published in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publishing {
    /// One publish per command, 64 in flight (one fsync each under `sync_interval: always`).
    Alone,
    /// 256 concurrent callers through `leasehold_log::ingest::Ingest`, as the gateway publishes: whatever is waiting
    /// goes out as one batch (one atomic batch on JetStream, one transaction on the embedded log).
    Batched,
}

/// Publishes `envelopes`; returns how long it took and, per command id, when its publish started.
async fn publish_all<L: Log>(
    log: &L,
    envelopes: Vec<Envelope>,
    how: Publishing,
) -> anyhow::Result<(Duration, Vec<(String, Instant)>)> {
    let start = Instant::now();
    let batcher = (how == Publishing::Batched)
        .then(|| leasehold_log::ingest::Ingest::start(log.clone(), leasehold_log::MAX_APPEND_RECORDS));
    let in_flight = if how == Publishing::Batched { 256 } else { 64 };
    let results: Vec<anyhow::Result<(String, Instant)>> = futures::stream::iter(envelopes)
        .map(|envelope| {
            let (log, batcher) = (log.clone(), batcher.clone());
            async move {
                let sent = Instant::now();
                let command = leasehold_log::Publish {
                    subject: ingress_subject_of(&envelope.body),
                    msg_id: envelope.command_id.to_string(),
                    payload: codec::encode_command(&envelope)?.into(),
                };
                let published = match batcher {
                    Some(batcher) => batcher.publish(command).await?,
                    None => log.publish_command(&command.subject, &command.msg_id, command.payload).await?,
                };
                anyhow::ensure!(!published.duplicate, "a bench command was a duplicate");
                Ok((envelope.command_id.to_string(), sent))
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let sent = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((start.elapsed(), sent))
}

/// Writers serving the log in this process, with at most `max_append_records` records per append.
struct Writers {
    running: tokio::task::JoinSet<leasehold_worker::Report>,
    shutdown: CancellationToken,
}

impl Writers {
    fn start<L: Log>(log: &L, workers: usize, max_append_records: usize) -> Writers {
        let shutdown = CancellationToken::new();
        let mut running = tokio::task::JoinSet::new();
        for w in 0..workers {
            let mut config = leasehold_worker::WorkerConfig::new(format!("bench-worker-{w}"));
            config.writer.max_append_records = max_append_records;
            running.spawn(leasehold_worker::run(log.clone(), config, shutdown.clone()));
        }
        Writers { running, shutdown }
    }

    /// Stops them; answers their counts (for the mean group size).
    async fn stop(mut self) -> anyhow::Result<leasehold_worker::Counts> {
        self.shutdown.cancel();
        let mut counts = leasehold_worker::Counts::default();
        while let Some(report) = self.running.join_next().await {
            let report = report?;
            anyhow::ensure!(report.stopped.is_empty(), "partitions stopped: {:?}", report.stopped);
            counts += report.counts;
        }
        Ok(counts)
    }
}

/// Waits until `target` outcomes have landed after sequence `from`; returns when the last one did, and when each
/// command's outcome was seen.
async fn outcomes_landed<L: Log>(
    log: &L,
    from: u64,
    target: u64,
) -> anyhow::Result<(Instant, std::collections::HashMap<String, Instant>)> {
    let mut follow = log.follow(OutcomeFilter::All, from + 1);
    let mut seen = std::collections::HashMap::new();
    while (seen.len() as u64) < target {
        let next = tokio::time::timeout(Duration::from_secs(120), follow.next())
            .await
            .context("no outcome for two minutes: a partition stopped?")?
            .context("the outcome feed ended")??;
        if next.part == 0 {
            seen.insert(next.cmd_id, Instant::now());
        }
    }
    Ok((Instant::now(), seen))
}

/// The `q` quantile of `latencies` (sorted here), in milliseconds.
/// [`quantile_ms`], in seconds.
pub(crate) fn quantile_s(durations: &mut [Duration], q: f64) -> f64 {
    quantile_ms(durations, q) / 1000.0
}

fn quantile_ms(latencies: &mut [Duration], q: f64) -> f64 {
    latencies.sort();
    if latencies.is_empty() {
        return 0.0;
    }
    latencies[((latencies.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
}

async fn last_outcome<L: Log>(log: &L) -> anyhow::Result<u64> {
    let mut last = 0;
    for p in 0..log.partitions() {
        last = last.max(log.last_outcome_seq(p).await?);
    }
    Ok(last)
}

/// The end-to-end phases. The writers run on `writer_log` (on NATS, a connection of their own, as a worker process
/// has), the producer and the followers on `log`.
pub(crate) async fn end_to_end<L: Log>(
    log: &L,
    writer_log: &L,
    args: &ThroughputArgs,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        log.last_command_seq().await? == 0 && last_outcome(log).await? == 0,
        "bench throughput needs an empty log: point it at a new --data directory or a NATS server without \
         leasehold streams"
    );
    let agents = agents(log.partitions());
    let mut ids = Ids(0);
    let mut envelopes: Vec<Envelope> = agents.iter().map(|a| registration(a, &mut ids)).collect();
    for i in 0..args.commands - agents.len() as u64 {
        envelopes.push(allocation(&agents[i as usize % agents.len()], &mut ids));
    }
    let (alone, batched) = envelopes.split_at(envelopes.len() / 2);
    eprintln!("publishing {} commands one by one (64 in flight)...", alone.len());
    let (took, _) = publish_all(log, alone.to_vec(), Publishing::Alone).await?;
    figures.publish_per_s = alone.len() as f64 / took.as_secs_f64();

    // Each end-to-end phase decides the commands published for it, stored before its writers start: the first
    // without group commit, the second with it.
    eprintln!("end to end without group commit (one record per append): {} workers decide...", args.workers);
    let half = alone.len() as u64;
    let start = Instant::now();
    let writers = Writers::start(writer_log, args.workers, 1);
    let (done, _) = outcomes_landed(log, 0, half).await?;
    figures.e2e_unbatched_per_s = half as f64 / (done - start).as_secs_f64();
    writers.stop().await?;
    eprintln!("publishing {} commands with batched ingest (256 callers)...", batched.len());
    let (took, _) = publish_all(log, batched.to_vec(), Publishing::Batched).await?;
    figures.publish_batched_per_s = batched.len() as f64 / took.as_secs_f64();
    let from = last_outcome(log).await?;
    let decided_before = count_decided(log).await?;
    eprintln!("end to end with group commit: {} workers decide them...", args.workers);
    let monitor = args.nats_monitor.as_deref();
    let before = match monitor {
        Some(monitor) => Some(ServerCounters::read(monitor).await?),
        None => None,
    };
    let start = Instant::now();
    let writers = Writers::start(writer_log, args.workers, leasehold_log::MAX_APPEND_RECORDS);
    let rest = args.commands - decided_before;
    let (done, _) = outcomes_landed(log, from, rest).await?;
    figures.e2e_commands_per_s = rest as f64 / (done - start).as_secs_f64();
    figures.e2e_batched_per_s = figures.e2e_commands_per_s;
    if let (Some(monitor), Some(before)) = (monitor, before) {
        let after = ServerCounters::read(monitor).await?;
        // What the phase stored: its outcomes (the commands were stored before it), read after the counters.
        let stored = last_outcome(log).await?.saturating_sub(from);
        let decide = before.ops_until(&after, stored, rest);
        figures.decide_server_ops_per_command = Some(decide);
        figures.server_ops_per_command = figures.raw_append_server_ops.map(|publish| publish + decide);
    }

    eprintln!("end to end with batched publishing at the same time (latency under load)...");
    let from = last_outcome(log).await?;
    let more: Vec<Envelope> =
        (0..args.commands).map(|i| allocation(&agents[i as usize % agents.len()], &mut ids)).collect();
    let start = Instant::now();
    let landed = {
        let log = log.clone();
        let target = args.commands;
        tokio::spawn(async move { outcomes_landed(&log, from, target).await })
    };
    let (_, sent) = publish_all(log, more, Publishing::Batched).await?;
    let (done, seen) = landed.await??;
    figures.e2e_concurrent_per_s = args.commands as f64 / (done - start).as_secs_f64();
    let mut loaded: Vec<Duration> =
        sent.iter().filter_map(|(id, at)| Some(seen.get(id)?.saturating_duration_since(*at))).collect();
    figures.p50_loaded_ms = quantile_ms(&mut loaded, 0.50);
    figures.p99_loaded_ms = quantile_ms(&mut loaded, 0.99);

    eprintln!("latency from publish to projection, {} commands one at a time...", args.latency_samples);
    let (p50, p99) = low_load_latency(log, args.latency_samples, &agents, &mut ids).await?;
    (figures.p50_ms, figures.p99_ms) = (p50, p99);
    let counts = writers.stop().await?;
    figures.mean_batch = counts.appended as f64 / counts.appends.max(1) as f64;
    eprintln!("the same without group commit...");
    let writers = Writers::start(writer_log, args.workers, 1);
    let (p50, p99) = low_load_latency(log, args.latency_samples, &agents, &mut ids).await?;
    (figures.p50_unbatched_ms, figures.p99_unbatched_ms) = (p50, p99);
    writers.stop().await?;
    Ok(())
}

/// Outcomes in the log that are the first part of a decision: commands decided.
async fn count_decided<L: Log>(log: &L) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut next = 1;
    loop {
        let batch = log.read_outcomes(&OutcomeFilter::All, next, 1000).await?;
        let Some(last) = batch.last() else { return Ok(n) };
        next = last.seq + 1;
        n += batch.iter().filter(|o| o.part == 0).count() as u64;
    }
}

/// Publishes `samples` commands one at a time, each when the one before is projected, with the writers running;
/// answers p50 and p99 from publish to projection, in milliseconds.
async fn low_load_latency<L: Log>(
    log: &L,
    samples: usize,
    agents: &[AgentName],
    ids: &mut Ids,
) -> anyhow::Result<(f64, f64)> {
    let shutdown = CancellationToken::new();
    let mut projector = leasehold_projector::Projector::in_memory(log.partitions())?;
    projector.catch_up(log).await?;
    let reader = projector.reader();
    let mut applied = projector.subscribe();
    let projecting = {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tokio::spawn(async move { projector.run(&log, &shutdown).await })
    };
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let envelope = allocation(&agents[i % agents.len()], ids);
        let id = envelope.command_id.to_string();
        let start = Instant::now();
        publish_all(log, vec![envelope], Publishing::Alone).await?;
        loop {
            applied.borrow_and_update();
            if !reader.outcome(&id)?.is_empty() {
                break;
            }
            let changed = tokio::time::timeout(Duration::from_secs(30), applied.changed())
                .await
                .context("no projection for 30 s")?;
            if changed.is_err() {
                projecting.await??;
                bail!("the projector stopped");
            }
        }
        latencies.push(start.elapsed());
    }
    shutdown.cancel();
    projecting.await??;
    Ok((quantile_ms(&mut latencies, 0.50), quantile_ms(&mut latencies, 0.99)))
}

/// Fills partition 0 of an empty one-partition log with `n` real outcomes (100,000 resources allocated and
/// reported created, then heartbeats spaced so each is recorded), with a snapshot where a writer would have stored
/// its last one, and times a writer's load from it and from the first outcome.
pub(crate) async fn takeover<L, F, Fut>(log: &L, n: u64, figures: &mut Figures, fill: F) -> anyhow::Result<()>
where
    L: Log,
    F: Fn(u64, Vec<OutcomeRecord>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    anyhow::ensure!(log.partitions() == 1, "the takeover log has one partition");
    let live = (n / 10).min(100_000);
    let every = WriterConfig::default().snapshot_every;
    let mut driver = Driver::new(0, 1, now());
    let agent = AgentName::new("takeover").expect("valid");
    let registered = driver.submit(
        "takeover",
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(9)) },
    );
    let epoch = registered
        .positioned_effects()
        .find_map(|(p, e)| matches!(e, Effect::AgentRegistered { .. }).then_some(p))
        .unwrap_or(Position(1));
    let push = |outcome: &leasehold_schemas::Outcome, batch: &mut Vec<OutcomeRecord>| -> anyhow::Result<()> {
        batch.push(OutcomeRecord {
            key: outcome.command.key.token(),
            cmd_id: outcome.command.id.to_string(),
            cmd_seq: outcome.cmd_seq,
            part: outcome.part,
            payload: codec::encode_outcome(outcome)?.into(),
        });
        Ok(())
    };
    let mut fence = 0;
    let mut batch: Vec<OutcomeRecord> = Vec::new();
    let mut snapshot: Option<Snapshot> = None;
    let (mut count, mut made, mut obs, mut since_snapshot) = (0u64, 0u64, 0u64, 0u64);
    push(&registered, &mut batch)?;
    count += 1;
    while count < n {
        if made < live {
            let resource = driver.new_resource_id();
            let body = Allocate::new(agent.clone(), resource, "volume", 4);
            push(&driver.submit("bench", body), &mut batch)?;
            obs += 1;
            let created = ReportCreated { agent: agent.clone(), epoch, obs, resource, native_id: None };
            push(&driver.submit("takeover", created), &mut batch)?;
            count += 2;
            made += 1;
        } else {
            // Spaced past a third of the stall timeout, so each heartbeat is recorded.
            driver.advance(Millis::from_secs(21));
            push(&driver.submit("takeover", Heartbeat { agent: agent.clone(), epoch }), &mut batch)?;
            count += 1;
        }
        // An iteration adds up to two records: flush before an append could hold more than the log takes.
        if batch.len() + 2 > leasehold_log::MAX_APPEND_RECORDS || count >= n {
            since_snapshot += batch.len() as u64;
            fence = fill(fence, std::mem::take(&mut batch)).await?;
            if since_snapshot >= every {
                // Where a writer storing a snapshot every `every` outcomes would have stored its last one.
                since_snapshot = 0;
                snapshot = Some(Snapshot {
                    partition: 0,
                    decider_version: leasehold_domain::DECIDER_VERSION,
                    fence,
                    last_command: None,
                    state: driver.state().to_snapshot()?.into(),
                });
            }
            if count % 100_000 < 1000 {
                eprintln!("  {count} outcomes...");
            }
        }
    }
    figures.takeover_outcomes = count;
    figures.live_resources = live;

    // A takeover is the writer's load: the fold of the partition (the check of the command log after it is one
    // read, and this partition has no command log).
    let config = WriterConfig::default();
    drop(driver);
    let start = Instant::now();
    let without = fold_partition(log, 0, 0, &config).await?;
    figures.takeover_without_snapshot_s = start.elapsed().as_secs_f64();
    let resources = without.state.resources().filter(|r| r.state.is_held()).count() as u64;
    anyhow::ensure!(resources == live, "{resources} live resources after the load, not {live}");
    let expected = without.state;
    if let Some(snapshot) = snapshot {
        log.put_snapshot(snapshot).await?;
    }
    let start = Instant::now();
    let with = fold_partition(log, 0, 0, &config).await?;
    figures.takeover_s = start.elapsed().as_secs_f64();
    anyhow::ensure!(with.state == expected, "the load from the snapshot gave another state than the fold");
    Ok(())
}

/// This process's resident memory, from /proc (0 where there is none).
fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0);
    pages * 4096
}

fn print_table(f: &Figures) {
    println!(
        "leasehold bench throughput: {} log, {} partitions, {} worker(s), {} commands per phase",
        f.backend, f.partitions, f.workers, f.commands
    );
    let rows: [(&str, String); 26] = [
        ("raw append (no fence, the log's per-message ceiling)", format!("{:>12.0} /s", f.raw_append_per_s)),
        ("raw fenced append (one in flight per partition)", format!("{:>12.0} /s", f.raw_fenced_per_s)),
        ("raw atomic batches of 100 (fenced)", format!("{:>12.0} /s", f.raw_batch_100_per_s)),
        ("raw atomic batches of 1000 (fenced)", format!("{:>12.0} /s", f.raw_batch_1000_per_s)),
        ("publish commands one by one (64 in flight)", format!("{:>12.0} /s", f.publish_per_s)),
        ("publish commands, batched ingest (256 callers)", format!("{:>12.0} /s", f.publish_batched_per_s)),
        ("end to end without group commit", format!("{:>12.0} /s", f.e2e_unbatched_per_s)),
        ("end to end with group commit", format!("{:>12.0} /s", f.e2e_batched_per_s)),
        ("end to end while publishing (batched)", format!("{:>12.0} /s", f.e2e_concurrent_per_s)),
        ("mean records per append (group commit)", format!("{:>12.1}", f.mean_batch)),
        ("ratio e2e / raw fenced", format!("{:>12.2}", f.ratio)),
        ("ratio e2e / raw append", format!("{:>12.2}", f.ratio_ceiling)),
        ("ratio_durable (e2e batched / raw append)", format!("{:>12.2}", f.ratio_durable)),
        ("low load, publish to projection p50", format!("{:>12.2} ms", f.p50_ms)),
        ("low load, publish to projection p99", format!("{:>12.2} ms", f.p99_ms)),
        ("  the same without group commit, p50", format!("{:>12.2} ms", f.p50_unbatched_ms)),
        ("  the same without group commit, p99", format!("{:>12.2} ms", f.p99_unbatched_ms)),
        ("high load, publish to outcome p50", format!("{:>12.2} ms", f.p50_loaded_ms)),
        ("high load, publish to outcome p99", format!("{:>12.2} ms", f.p99_loaded_ms)),
        ("fenced append, 100 agents in the partition", format!("{:>12.0} /s", f.fenced_append_100_agents_per_s)),
        ("fenced append, 10,000 agents in the partition", format!("{:>12.0} /s", f.fenced_append_10000_agents_per_s)),
        ("takeover (snapshot + tail)", format!("{:>12.3} s  ({} outcomes)", f.takeover_s, f.takeover_outcomes)),
        ("takeover without a snapshot", format!("{:>12.3} s", f.takeover_without_snapshot_s)),
        ("live resources in the takeover partition", format!("{:>12}", f.live_resources)),
        ("worker memory per live resource (RSS)", format!("{:>12.0} B", f.bytes_per_live_resource)),
        (
            "server operations per command (publish + decision)",
            match (f.server_ops_per_command, f.raw_append_server_ops, f.decide_server_ops_per_command) {
                (Some(all), Some(publish), Some(decide)) => {
                    format!("{all:>12.2}    ({publish:.2} + {decide:.2}; --nats-monitor)")
                }
                _ => format!("{:>12}", "-  (with --nats-monitor)"),
            },
        ),
    ];
    for (name, value) in rows {
        println!("  {name:<52} {value}");
    }
}
