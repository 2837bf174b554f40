//! `leasehold-replay`: the audit tool. It answers who, what, when and why from the log: a thing's history, who
//! held an identifier at a moment, the whole state as of a moment, whether the log holds together and today's
//! decider decides it the same way, and it exports the log to a self-contained file another machine can audit.
//!
//! - [`source`]: where the log is read from (an embedded data directory, JetStream, a server, an export file).
//! - [`fold`]: the checked fold every command runs.
//! - [`history`], [`why`], [`state_at`], [`verify`]: the questions.
//! - [`parallel`]: work spread over the cores (`verify`'s partitions, `rebuild`'s decoding).
//! - [`bench`]: the replay benchmark (`replay-bench`): a generated log, and the rates of `verify` and `rebuild`
//!   beside the raw read rate of the same source.
//!
//! Read-only, except `import` (a new data directory) and `rebuild` (the projection it names).

#![forbid(unsafe_code)]

pub mod bench;
pub mod fold;
pub mod history;
pub mod parallel;
pub mod source;
pub mod state_at;
pub mod verify;
pub mod why;

use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use leasehold_cli_common::output::{OutputFormat, json};
use leasehold_log::CommandRecord;
use leasehold_log::export::{self, Entry};
use leasehold_schemas::PoolName;
use leasehold_schemas::pool::PoolValue;

use crate::source::{Source, SourceArgs};
use crate::why::At;

#[derive(Debug, Parser)]
#[command(name = "leasehold-replay", version, about = "Answers who, what, when and why from leasehold's log")]
pub struct Cli {
    #[command(flatten)]
    pub source: SourceArgs,
    /// What to print on stdout: aligned text, or one JSON value.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Every command and event touching a resource or a lease (AGENT.ID, ID, resource:ID or lease:ID), an agent
    /// (NAME or agent:NAME), a pool (@NAME) or one of its identifiers (@NAME/VALUE: @net/10.0.0.7, @gpu/slot 3),
    /// in log order: sequence, time, issuer, command, outcome, the state after. A resource's history holds its
    /// leases' and its claims' steps too; the gateway's `GET /v1/resources/{ref}/history` answers the same steps.
    History { target: String },
    /// Who held a pool's identifier at a moment (or over all time), since when, through which commands, and when
    /// and why it was let go.
    Why {
        /// An address of an IPv4 pool (any pool).
        #[arg(long, group = "identifier")]
        ip: Option<std::net::Ipv4Addr>,
        /// A slot of a slot pool: POOL:N.
        #[arg(long, group = "identifier")]
        slot: Option<String>,
        /// A port of a port pool: POOL:N.
        #[arg(long, group = "identifier")]
        port: Option<String>,
        /// The moment: an outcome sequence, or a time (RFC 3339, e.g. 2026-11-23T14:02:00Z).
        #[arg(long)]
        at: Option<String>,
    },
    /// The whole state (or one agent's) as of a moment, folded from the log.
    State {
        /// An outcome sequence, or a time (RFC 3339).
        #[arg(long)]
        at: String,
        #[arg(long)]
        agent: Option<String>,
    },
    /// Folds the whole log and checks it (see the README); exits 1 at the first failure, naming its sequence.
    Verify {
        /// A projection directory to compare with a fresh fold (with --data, the data directory's own is compared).
        #[arg(long)]
        projection: Option<PathBuf>,
        /// Re-decide as writers that split long decisions after this many bytes of effects did: the test-only
        /// small part size of the chaos harness's writers (`leasehold-worker`'s `fault-points` feature). Where a
        /// decision splits changes nothing in its effects, but the recorded parts are compared one by one.
        #[arg(long, hide = true)]
        split_budget: Option<usize>,
    },
    /// Writes the log from its start (up to --to) to a self-contained, checksummed file.
    Export {
        /// The new file to write.
        #[arg(id = "export_file", value_name = "FILE")]
        file: PathBuf,
        /// The last outcome sequence to include.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Restores an export file into a new embedded data directory (--data DIR, which must not exist).
    Import {
        /// The export file to restore.
        #[arg(id = "import_file", value_name = "FILE")]
        file: PathBuf,
    },
    /// Drops a projection and folds it again from sequence 1 (with --data: the data directory's; else --projection).
    Rebuild {
        #[arg(long)]
        projection: Option<PathBuf>,
    },
}

impl Cli {
    /// Parses a command line as the binary does: the source flags and `--output` go before or after the
    /// subcommand; a bad command line is clap's error (exit 2), exactly one source included.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut command = SourceArgs::globalise(Cli::command());
        let matches = command.try_get_matches_from_mut(args)?;
        let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
        cli.source.check().map_err(|(kind, message)| command.error(kind, message))?;
        Ok(cli)
    }
}

/// The entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    leasehold_cli_common::output::errors_as(cli.output);
    let runtime = match start("leasehold-replay") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("leasehold-replay: {:#}", leasehold_schemas::text::shown(&e));
            leasehold_cli_common::output::emit_error(&e);
            ExitCode::from(2)
        }
    }
}

/// What a binary of this crate starts with: logs on stderr (`RUST_LOG`, warnings by default, every field escaped
/// for display as `leasehold`'s are) and a runtime; exit 2 (said on stderr as `name: ...`) if the runtime cannot
/// start.
pub(crate) fn start(name: &str) -> Result<tokio::runtime::Runtime, ExitCode> {
    leasehold_cli_common::logs::init("warn");
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
        eprintln!("{name}: cannot start the runtime: {e}");
        ExitCode::from(2)
    })
}

/// Runs one command: `Ok(SUCCESS)`, `Ok(1)` when `verify` found the log wrong, `Err` when the command could not do
/// what was asked (bad input, a source it cannot read).
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let (output, args) = (cli.output, &cli.source);
    // Every command but `import` reads a source, opened in its arm (`import` writes the data directory --data names).
    match cli.command {
        Cmd::History { target } => {
            let source = Source::open(args).await?;
            let target: history::Target = target.parse().map_err(anyhow::Error::msg)?;
            let entries = source.entries(None).await?;
            let mut progress = Progress::new(entries.last_outcome, "history");
            let rows = history::history(entries.partitions, entries.entries, &target, |s| progress.at(s)).await;
            progress.done();
            let rows = rows.map_err(|f| anyhow::anyhow!("the log cannot be folded: {f}"))?;
            print(output, &rows, || history::render(&rows))?;
        }
        Cmd::Why { ip, slot, port, at } => {
            let source = Source::open(args).await?;
            let query = match (ip, slot, port) {
                (Some(ip), _, _) => why::Query { pool: None, value: PoolValue::Ipv4(ip) },
                (_, Some(slot), _) => {
                    let (pool, n) = pool_and_number(&slot, "--slot")?;
                    why::Query { pool: Some(pool), value: PoolValue::Slot(n) }
                }
                (_, _, Some(port)) => {
                    let (pool, n) = pool_and_number(&port, "--port")?;
                    let n = u16::try_from(n).map_err(|_| anyhow::anyhow!("--port {port}: {n} is not a port"))?;
                    why::Query { pool: Some(pool), value: PoolValue::Port(n) }
                }
                _ => bail!("say which identifier: --ip ADDR, --slot POOL:N or --port POOL:N"),
            };
            let at: Option<At> = at.map(|a| a.parse()).transpose().map_err(anyhow::Error::msg)?;
            let entries = source.entries(None).await?;
            let mut progress = Progress::new(entries.last_outcome, "why");
            let answer = why::why(entries.partitions, entries.entries, &query, at, |s| progress.at(s)).await;
            progress.done();
            let answer = answer.map_err(|f| anyhow::anyhow!("the log cannot be folded: {f}"))?;
            print(output, &answer, || why::render(&answer))?;
        }
        Cmd::State { at, agent } => {
            let source = Source::open(args).await?;
            let at: At = at.parse().map_err(anyhow::Error::msg)?;
            // Not cut at the sequence: a decision's parts after it are read too (`state_at` stops once none is
            // unfinished).
            let entries = source.outcomes(None).await?;
            let mut progress = Progress::new(entries.last_outcome, "state");
            let state =
                state_at::state_at(entries.partitions, entries.entries, at, agent.as_deref(), |s| progress.at(s)).await;
            progress.done();
            let state = state?;
            print(output, &state, || state_at::render(&state))?;
        }
        Cmd::Verify { projection, split_budget } => {
            return verify(&Source::open(args).await?, projection, split_budget, output).await;
        }
        Cmd::Export { file, to } => export_to(&Source::open(args).await?, &file, to, output).await?,
        Cmd::Rebuild { projection } => rebuild(&Source::open(args).await?, projection, args, output).await?,
        Cmd::Import { file } => {
            let Some(dir) = &args.data else { bail!("import needs --data DIR: the new data directory") };
            let input = tokio::fs::File::open(&file).await.with_context(|| format!("opening {}", file.display()))?;
            let input = tokio::io::BufReader::with_capacity(256 * 1024, input);
            let (header, trailer) =
                export::import(input, dir).await.with_context(|| format!("importing {}", file.display()))?;
            print(
                output,
                &serde_json::json!({"imported": file, "data": dir, "header": header, "trailer": trailer}),
                || {
                    format!(
                        "imported {} outcome(s), {} command(s) and {} dead letter(s) of {} partition(s) into {}\n",
                        trailer.outcomes,
                        trailer.commands,
                        trailer.dead_letters,
                        header.partitions,
                        dir.display()
                    )
                },
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn pool_and_number(text: &str, flag: &str) -> anyhow::Result<(PoolName, u32)> {
    let (pool, n) = text.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("{flag} {text}: say POOL:N"))?;
    let pool = PoolName::new(pool.trim_start_matches('@')).map_err(|e| anyhow::anyhow!("{flag} {text}: {e}"))?;
    let n = n.parse::<u32>().map_err(|e| anyhow::anyhow!("{flag} {text}: {n:?} is not a number: {e}"))?;
    Ok((pool, n))
}

async fn verify(
    source: &Source,
    projection: Option<PathBuf>,
    split_budget: Option<usize>,
    output: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let projection_dir = projection.or_else(|| source.embedded().map(|(_, dir)| dir.clone()));
    let mut note = None;
    let recorded = match &projection_dir {
        None => {
            note = Some("no projection to compare (give --projection DIR)".to_owned());
            None
        }
        Some(dir) => match leasehold_projector::recorded(dir) {
            Err(e) => {
                note = Some(format!("cannot read the projection in {}: {e}; not compared", dir.display()));
                None
            }
            Ok(None) => {
                note = Some(format!("no projection in {}", dir.display()));
                None
            }
            Ok(Some(r)) if r.version != Some(leasehold_projector::PROJECTION_VERSION) => {
                note = Some(format!(
                    "the projection in {} was made by another build (version {:?}); not compared",
                    dir.display(),
                    r.version
                ));
                None
            }
            Ok(Some(r)) => Some(verify::Projection {
                applied: r.applied,
                digests: r.digests.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            }),
        },
    };
    let entries = source.entries(None).await?;
    let started = Instant::now();
    let mut progress = Progress::new(entries.last_outcome, "verify");
    let mut verifier = verify::Verifier::new(entries.partitions, recorded)?;
    if let Some(bytes) = split_budget {
        verifier = verifier.with_split_budget(bytes);
    }
    let report = verifier.run(entries.entries, |s| progress.at(s)).await;
    progress.done();
    let report = report?;
    let elapsed = started.elapsed();
    let rate = report.outcomes as f64 / elapsed.as_secs_f64().max(1e-9);
    let failed = report.failure.is_some();
    let value = serde_json::json!({
        "ok": !failed,
        "report": report,
        "projection_note": note,
        "elapsed_s": elapsed.as_secs_f64(),
        "outcomes_per_s": rate,
    });
    print(output, &value, || render_verify(&report, note.as_deref(), elapsed, rate))?;
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn span(s: &verify::Span) -> String {
    if s.count == 0 { "none".to_owned() } else { format!("{} (outcomes {}..={})", s.count, s.first, s.last) }
}

fn render_verify(report: &verify::Report, note: Option<&str>, elapsed: Duration, rate: f64) -> String {
    let mut lines = vec![
        format!(
            "outcomes          {} in {} partition(s): chains unbroken, one decision per command",
            report.outcomes, report.partitions
        ),
        format!(
            "commands          {} read: {} without an outcome (decided again: none), {} not decided yet; {} dead letter(s)",
            report.commands, report.without_outcome, report.undecided, report.dead_letters
        ),
        format!("re-decided        {} equal to the record", span(&report.redecided)),
        format!("only folded       commands past retention: {}", span(&report.folded_only_commands_gone)),
        format!(
            "                  commands missing after older ones (retention moved during the read, or altered): {}",
            span(&report.folded_only_commands_missing)
        ),
        format!("                  older decider: {}", span(&report.folded_only_older_decider)),
        format!("                  newer schema: {}", span(&report.folded_only_newer_schema)),
        format!(
            "invariants        on every step's changes; the whole partition {} time(s) (every {} outcomes and at the end)",
            report.full_checks,
            verify::FULL_CHECK_EVERY
        ),
    ];
    match (&report.projection, note) {
        (Some(p), _) if p.differing.is_empty() => {
            lines.push(format!("projection        {} tables equal a fresh fold at outcome {}", p.tables, p.applied));
        }
        (Some(p), _) => lines.push(format!("projection        differs in {}", p.differing.join(", "))),
        (None, Some(note)) => lines.push(format!("projection        {note}")),
        (None, None) => lines.push("projection        not reached".to_owned()),
    }
    lines.push(format!("took              {:.2} s ({rate:.0} outcomes/s)", elapsed.as_secs_f64()));
    match &report.failure {
        Some(f) => lines.push(format!("FAILED at {f}")),
        None => lines.push("OK".to_owned()),
    }
    // A failure quotes the log (rejections, effects) and a note the projection's errors: each line is shown escaped.
    lines.iter().map(|line| leasehold_schemas::text::escape_for_display(line)).collect::<Vec<_>>().join("\n") + "\n"
}

async fn export_to(source: &Source, file: &PathBuf, to: Option<u64>, output: OutputFormat) -> anyhow::Result<()> {
    if file.exists() {
        bail!("{} exists: export writes a new file", file.display());
    }
    let entries = source.entries(to).await?;
    let header = export::Header::new(
        leasehold_domain::DECIDER_VERSION,
        entries.partitions,
        entries.last_outcome,
        &source.describe(),
    );
    let partial = file.with_extension("partial");
    let written = async {
        let out = tokio::fs::File::create(&partial).await.with_context(|| format!("creating {}", partial.display()))?;
        let out = tokio::io::BufWriter::with_capacity(256 * 1024, out);
        let mut writer = export::Writer::new(out, &header).await?;
        let mut progress = Progress::new(entries.last_outcome, "export");
        let mut stream = entries.entries;
        while let Some(entry) = stream.next().await {
            let entry = entry?;
            if let Entry::Outcome(o) = &entry {
                progress.at(o.seq);
            }
            writer.write(&entry).await?;
        }
        progress.done();
        let trailer = writer.finish().await?;
        anyhow::Ok(trailer)
    }
    .await;
    let trailer = match written {
        Ok(trailer) => trailer,
        Err(e) => {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e);
        }
    };
    tokio::fs::rename(&partial, file)
        .await
        .with_context(|| format!("renaming {} to {}", partial.display(), file.display()))?;
    print(output, &serde_json::json!({"file": file, "header": header, "trailer": trailer}), || {
        format!(
            "exported {} outcome(s) (up to {}), {} command(s) and {} dead letter(s) to {}\n",
            trailer.outcomes,
            trailer.last_outcome_seq,
            trailer.commands,
            trailer.dead_letters,
            file.display()
        )
    })
}

async fn rebuild(
    source: &Source,
    projection: Option<PathBuf>,
    args: &SourceArgs,
    output: OutputFormat,
) -> anyhow::Result<()> {
    let dir = projection
        .or_else(|| args.data.clone())
        .ok_or_else(|| anyhow::anyhow!("say which projection to rebuild: --projection DIR (with --data, its own)"))?;
    // From a log, its outcomes, and the commands of the steps without effect only (read by the projector, as
    // `serve`'s does); from a file or a server, every entry (the commands come in the stream anyway).
    let entries = match source {
        Source::Embedded { .. } | Source::Nats { .. } => source.outcomes(None).await?,
        Source::File { .. } | Source::Server { .. } => source.entries(None).await?,
    };
    let cache = leasehold_projector::BULK_CACHE_BYTES;
    let projector =
        leasehold_projector::Projector::open_with_cache(&dir, entries.partitions, cache).with_context(|| {
            format!("opening the projection in {} (is `leasehold serve` running on it?)", dir.display())
        })?;
    let started = Instant::now();
    let mut progress = Progress::new(entries.last_outcome, "rebuild");
    let rebuilt = match source {
        Source::Embedded { log, .. } => rebuild_from_log(projector, log, entries.entries, |seq| progress.at(seq)).await,
        Source::Nats { log, .. } => rebuild_from_log(projector, log, entries.entries, |seq| progress.at(seq)).await,
        Source::File { .. } | Source::Server { .. } => {
            rebuild_projection(projector, entries.entries, |seq| progress.at(seq)).await
        }
    };
    progress.done();
    let projector = rebuilt?;
    let elapsed = started.elapsed();
    let applied = projector.applied();
    let digests = projector.digests()?;
    let rate = progress_rate(applied, elapsed);
    print(
        output,
        &serde_json::json!({"projection": dir, "applied": applied, "elapsed_s": elapsed.as_secs_f64(), "outcomes_per_s": rate, "digests": digests}),
        || {
            let mut text = format!(
                "rebuilt {} up to outcome {applied} in {:.2} s ({rate:.0} outcomes/s)\n",
                dir.display(),
                elapsed.as_secs_f64()
            );
            for (table, digest) in &digests {
                text.push_str(&format!("{table:<20} {digest}\n"));
            }
            text
        },
    )
}

/// How many outcomes `rebuild` reads before it folds them: the next batch is read while one is decoded and folded.
pub const REBUILD_BATCH: usize = 4096;

/// Drops every read model of `projector` and folds `entries`' outcomes into it again from sequence 1, in bulk
/// ([`leasehold_projector::Bulk`]: the same tables as an incremental fold, written a chunk at a time); `progress` is
/// told each outcome's sequence. Answers the projector. What `rebuild` does, and what the replay benchmark times.
/// The commands among `entries`, if any, go with the outcomes that answer them: a step without effect is in the
/// timeline of what its command names.
///
/// Two things go on at once: reading a batch of [`REBUILD_BATCH`] outcomes, and decoding and folding the one before
/// into the projection, its partitions on every core ([`leasehold_projector::Bulk`]), while the chunk before is
/// written.
pub async fn rebuild_projection(
    projector: leasehold_projector::Projector,
    mut entries: futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    mut progress: impl FnMut(u64),
) -> anyhow::Result<leasehold_projector::Projector> {
    type Folding = tokio::task::JoinHandle<Result<leasehold_projector::Bulk, leasehold_projector::Error>>;
    let mut bulk = Some(projector.into_bulk()?);
    let mut folding: Option<Folding> = None;
    // Each partition's commands not yet answered, in sequence.
    let mut waiting: BTreeMap<u32, VecDeque<CommandRecord>> = BTreeMap::new();
    let mut ended = false;
    while !ended {
        let mut batch = Vec::with_capacity(REBUILD_BATCH);
        // The commands the batch's outcomes answer.
        let mut answered = BTreeMap::new();
        while batch.len() < REBUILD_BATCH {
            let Some(entry) = entries.next().await else {
                ended = true;
                break;
            };
            match entry? {
                Entry::Command { partition, record } => waiting.entry(partition).or_default().push_back(record),
                Entry::Outcome(o) => {
                    progress(o.seq);
                    if let Some(queue) = waiting.get_mut(&o.partition) {
                        // Commands before the one answered got no outcome (a duplicate, a heartbeat that changed
                        // nothing); the one answered stays for the next parts of its decision.
                        while queue.front().is_some_and(|c| c.seq < o.cmd_seq) {
                            queue.pop_front();
                        }
                        if let Some(command) = queue.front().filter(|c| c.seq == o.cmd_seq) {
                            answered.insert(command.seq, command.clone());
                        }
                    }
                    batch.push(o);
                }
                Entry::DeadLetter { .. } => {}
            }
        }
        if let Some(previous) = folding.take() {
            bulk = Some(previous.await??);
        }
        let mut folder = bulk.take().expect("the bulk rebuild is back from its last batch");
        folding = Some(tokio::task::spawn_blocking(move || {
            folder.apply_encoded(&batch, &answered)?;
            Ok(folder)
        }));
    }
    if let Some(previous) = folding.take() {
        bulk = Some(previous.await??);
    }
    Ok(bulk.expect("the bulk rebuild is back from its last batch").finish()?)
}

/// [`rebuild_projection`] from `log`'s outcomes (`outcomes`, no command), in bulk as well, reading from `log` the
/// commands of the steps without effect (a rejection names what it refused only in its command), as
/// [`leasehold_projector::Projector::apply_batch_from`] does: the same tables.
async fn rebuild_from_log<L: leasehold_log::Log>(
    projector: leasehold_projector::Projector,
    log: &L,
    mut outcomes: futures::stream::BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    mut progress: impl FnMut(u64),
) -> anyhow::Result<leasehold_projector::Projector> {
    let mut bulk = projector.into_bulk()?;
    let mut batch = Vec::with_capacity(REBUILD_BATCH);
    loop {
        let next = outcomes.next().await;
        let ended = next.is_none();
        if let Some(entry) = next
            && let Entry::Outcome(o) = entry?
        {
            progress(o.seq);
            batch.push(o);
        }
        if batch.len() >= REBUILD_BATCH || (ended && !batch.is_empty()) {
            let (decoded, held) = leasehold_projector::decode_with_commands(log, &batch, 0).await?;
            bulk.apply(&batch, decoded, &held)?;
            batch.clear();
        }
        if ended {
            return Ok(bulk.finish()?);
        }
    }
}

fn progress_rate(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Prints `value` as JSON, or the text `text` makes.
/// Prints `value` as JSON, or its text for people with the log's times (UTC, exact, as the JSON keeps them) shown in
/// this machine's zone.
fn print(output: OutputFormat, value: &impl serde::Serialize, text: impl FnOnce() -> String) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => leasehold_cli_common::output::emit(&json(value)?),
        OutputFormat::Table => {
            let clock = leasehold_cli_common::output::Clock::system();
            leasehold_cli_common::output::emit(&clock.localize(&text()));
        }
    }
    Ok(())
}

/// A JSON value on one line.
pub(crate) fn compact(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A progress bar on stderr with a rate, shown only when stderr is a terminal.
struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(last: u64, what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(last), ProgressDrawTarget::stderr_with_hz(4));
        let style = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} outcome {pos}/{len} ({per_sec}, {eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(what.to_owned());
        Progress { bar: Some(bar) }
    }

    fn at(&mut self, seq: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(seq);
        }
    }

    fn done(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
