//! `replay-bench`: how fast `verify` and `rebuild` go through a big log, as a ratio to how fast the same source can
//! merely be read, in the same run (issue 8). A benchmark, never a test: it prints a table and, as its last line,
//! one JSON object, and exits 1 if `verify` finds the log wrong (a benchmark on a log that does not verify measures
//! nothing).
//!
//! **The log.** [`generate`] decides real commands with the real `decide`, as a writer would: `--partitions P`
//! (default 8), `--agents-per-partition A` (default 16) agents each, every agent registered once and then running
//! `--resources-per-agent K` (default 4) resource life cycles at a time, interleaved at random (seeded): allocate,
//! acquire while pending (the lease waits), the agent reports it created (the lease is granted), release that lease
//! with its token, pause, unpause, update, acquire again, release the resource (the lease breaks), and the agent's
//! sync report names it destroyed (with the honest count and digest) — then a new resource. Every command gets an
//! accepted outcome of one part (the generator refuses to go on otherwise), no deadline matters (no lease or pause
//! has a time limit, no heartbeats), so nothing needs a sweeper. Commands and outcomes are dense from sequence 1,
//! each command right before its outcome, and the `Lh-Prev-Seq` chain of each partition is the writers'. The log
//! ends at `--outcomes N` (default 1,000,000); it holds about 1.5 effects per outcome (both counts are printed).
//! The log's clock moves 1 ms every 16 commands (about a minute for a million), far within the domain's 24-hour
//! outcome horizon, so the partitions keep every resource they ended and their states grow with the log. With
//! `--ms-per-command M --horizon-ms H` (the file only) the clock moves M ms a command and each partition's first
//! command sets its horizon to H: a log that spans several horizons, whose partitions forget what ended a horizon
//! before, as a long-lived log's do; its peak memory then shows what replay holds besides the live state.
//!
//! **From the export file** it writes to a temporary directory (read from the page cache, having just been
//! written):
//! - *raw read*: every frame read and its checksum checked ([`export::Reader::next_frame`]), nothing decoded: the
//!   floor of any reader of the file, and the denominator of the file's ratios;
//! - *read entries*, the *raw decode*: [`export::Reader::next`], every record decoded into an entry, nothing folded:
//!   the denominator of the `/decode` ratios (`verify_ratio_to_decode`, `rebuild_ratio_to_decode`);
//! - *verify*: [`Verifier`] over [`export::Reader::into_stream`], exactly what `leasehold-replay verify --file`
//!   runs (the fold with every check, every outcome decided again and compared, the invariants) — it must report
//!   every outcome re-decided equal;
//! - *rebuild*: a projection in a new directory ([`Projector::open`]) dropped and folded from sequence 1 in bulk
//!   ([`crate::rebuild_projection`], what `leasehold-replay rebuild` runs: [`leasehold_projector::Bulk`], one
//!   durable redb transaction per [`leasehold_projector::BULK_CHUNK`] outcomes, written while the next chunk is
//!   folded).
//!
//! **From JetStream** (`--nats URL`, a server with no leasehold log yet, whose leasehold streams are deleted at the
//! end; by default a `nats-server` of its own from `PATH` on a random port of 127.0.0.1, stopped by its pid at the
//! end; `--no-nats`, or no `nats-server` on `PATH`, skips it and says so): the same log, loaded into fresh streams. JetStream stamps its own time on each command and
//! decisions depend on the log time, so the file's outcomes cannot be copied: the commands are published to `LH_CMD`
//! pipelined, read back with their server times, decided again in that order with those times, and the outcomes
//! published pipelined to `lh.evt.<p>.<key>` with the headers a writer's append gives them (without the fence: the
//! stream is fresh, and every sequence the server answers is checked against the chain written). Positions do not
//! depend on time in this mix, so every token and epoch of the generated commands is still right: the loader fails
//! loudly if any decision comes out rejected or with another number of effects. Then, timed:
//! - *raw read*: [`export::entries`] over the log drained, nothing folded: the same reads (batched direct gets of
//!   outcomes, each partition's commands) and header decoding `verify` gets its entries from;
//! - *verify* as above, over [`export::entries`]; *rebuild* over the outcomes alone ([`crate::source::Source::outcomes`],
//!   as the CLI's `rebuild` reads them: a projection needs no command), so its ratio may pass 1.
//!
//! For each of `verify` and `rebuild` it prints the process's resident memory when the phase started and its peak
//! while it ran (`VmHWM`, reset at the start): what the phase holds must grow with the partitions (their states),
//! not with the log's length.
//!
//! **How to read it.** Each `ratio` is the raw read's time over the phase's time, so 0.25 means the phase goes at a
//! quarter of the speed the source can be read at: a figure that survives a noisy machine better than the rates. The
//! rates are outcomes (log records) and effects (events) per second.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_domain::{
    Ctx, DECIDER_VERSION, Decided, PartitionState, apply, continue_work, decide, encode_part, expected_listing,
};
use leasehold_log::export::{self, Entry, FrameKind, Header};
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{CommandRecord, Log, OutcomeRecord, StoredOutcome};
use leasehold_projector::Projector;
use leasehold_schemas::command::{
    Acquire, Allocate, Pause, Register, Release, ReleaseLease, ReportCreated, SetPartitionSettings, SyncReport,
    Unpause, Update,
};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Millis, Position, ResourceId, Timestamp};
use leasehold_schemas::subjects::{command_subject, partition_of_agent, settings_key};
use leasehold_schemas::{Command, Effect, Envelope, Outcome, Uuid, codec};
use serde::Serialize;

use crate::verify::{Report, Verifier};

/// The benchmark's command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "replay-bench",
    about = "verify and rebuild rates on a generated log, beside the raw read rate of the same source (file and \
             JetStream)"
)]
pub struct BenchArgs {
    /// Outcomes in the generated log (one per command).
    #[arg(long, default_value_t = 1_000_000)]
    pub outcomes: u64,
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    #[arg(long, default_value_t = 16)]
    pub agents_per_partition: u32,
    /// Resource life cycles each agent runs at a time.
    #[arg(long, default_value_t = 4)]
    pub resources_per_agent: usize,
    /// The seed of the interleaving.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Milliseconds of log time between commands (default: 1 ms every 16 commands, a busy cluster's pace).
    #[arg(long, requires = "no_nats")]
    pub ms_per_command: Option<u64>,
    /// Each partition's outcome horizon, set by a first command of each partition (`set-partition-settings`;
    /// at least 60000): with `--ms-per-command`, a log that spans several horizons, whose ended resources each
    /// partition forgets a horizon later (default: the domain's 24 hours, which the default log never reaches).
    #[arg(long, requires = "no_nats")]
    pub horizon_ms: Option<u64>,
    /// A NATS server with no leasehold log yet; the log loaded into it is deleted at the end (default: start a
    /// nats-server of its own from PATH).
    #[arg(long, conflicts_with = "no_nats")]
    pub nats: Option<String>,
    /// Measure the export file only.
    #[arg(long)]
    pub no_nats: bool,
    /// Where the export file and the projections go (default: a new temporary directory, removed at the end).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The entry point of the binary.
pub fn main() -> ExitCode {
    let args = BenchArgs::parse();
    let runtime = match crate::start("replay-bench") {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("replay-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Deciding, as the writers do.

/// The writers of every partition of a log being made: each command decided against its partition's state at its
/// sequence and log time, every part of its outcome encoded, applied and given the next outcome sequence, chained on
/// the partition's previous outcome. The generator and the JetStream loader both decide through it.
#[derive(Debug)]
pub struct Writers {
    states: Vec<PartitionState>,
    /// The sequence of each partition's last outcome (its next one's `Lh-Prev-Seq`).
    chain: Vec<u64>,
    next_outcome: u64,
    /// Outcome parts made.
    pub outcomes: u64,
    /// Effects in them.
    pub effects: u64,
}

impl Writers {
    pub fn new(partitions: u32) -> Self {
        Writers {
            states: (0..partitions).map(|p| PartitionState::new(p, partitions)).collect(),
            chain: vec![0; partitions as usize],
            next_outcome: 1,
            outcomes: 0,
            effects: 0,
        }
    }

    pub fn state(&self, partition: u32) -> &PartitionState {
        &self.states[partition as usize]
    }

    /// Decides `envelope`, stored as `record` in `partition`: its outcome parts as the log stores them, with the
    /// outcomes themselves. A command that gets no outcome (a duplicate, an idle heartbeat) is an error here: the
    /// generated log has none.
    pub fn decide(
        &mut self,
        partition: u32,
        record: &CommandRecord,
        envelope: &Envelope,
    ) -> anyhow::Result<Vec<(StoredOutcome, Outcome)>> {
        let p = partition as usize;
        let ctx = Ctx { cmd_seq: record.seq, log_time: record.time };
        let mut outcome = match decide(&self.states[p], &ctx, envelope)? {
            Decided::Append(outcome) => outcome,
            other => bail!("command {} ({}) got no outcome: {other:?}", record.seq, envelope.type_name()),
        };
        let mut parts = Vec::new();
        loop {
            let (recorded, bytes) = encode_part(outcome).context("encoding an outcome")?;
            apply(&mut self.states[p], &recorded)
                .map_err(|e| anyhow::anyhow!("outcome of command {} does not fold: {e}", record.seq))?;
            let stored = StoredOutcome {
                seq: self.next_outcome,
                partition,
                key: recorded.command.key.token(),
                cmd_id: recorded.command.id.to_string(),
                cmd_seq: recorded.cmd_seq,
                part: recorded.part,
                prev_seq: self.chain[p],
                payload: Bytes::from(bytes),
            };
            self.chain[p] = stored.seq;
            self.next_outcome += 1;
            self.outcomes += 1;
            self.effects += recorded.effects().len() as u64;
            parts.push((stored, recorded));
            if self.states[p].pending().is_none() {
                return Ok(parts);
            }
            outcome = continue_work(&self.states[p])?;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The generator.

/// What log to make.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub outcomes: u64,
    pub partitions: u32,
    pub agents_per_partition: u32,
    pub resources_per_agent: usize,
    pub seed: u64,
    /// The log time of the first command; the log's clock moves 1 ms every [`COMMANDS_PER_MS`] commands.
    pub start: Timestamp,
    /// Instead, the log's clock moves this many milliseconds every command.
    pub ms_per_command: Option<u64>,
    /// Each partition's outcome horizon, set by its first command (none: the domain's default).
    pub horizon: Option<Millis>,
}

/// Commands per millisecond of the generated log's clock (about what a busy cluster takes).
pub const COMMANDS_PER_MS: u64 = 16;

const OPERATOR: &str = "op:bench";

/// A resource's life cycle, one command a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Allocate,
    AcquireWhilePending,
    ReportCreated,
    ReleaseLease,
    Pause,
    Unpause,
    Update,
    Acquire,
    Release,
    ReportDestroyed,
}

#[derive(Debug, Clone)]
struct Cycle {
    step: Step,
    resource: Option<ResourceId>,
    /// The lease acquired while pending, and its token once granted.
    lease: Option<(LeaseId, Option<Position>)>,
    rounds: u64,
}

#[derive(Debug)]
struct GenAgent {
    name: AgentName,
    partition: u32,
    /// The position of its registration, once registered.
    epoch: Option<Position>,
    obs: u64,
    cycles: Vec<Cycle>,
}

/// Which agent and cycle a command came from, to learn from its outcome.
#[derive(Debug, Clone, Copy)]
enum Origin {
    Settings,
    Register(usize),
    Cycle(usize, usize),
}

#[derive(Debug)]
struct Generator {
    agents: Vec<GenAgent>,
    random: u64,
    clock: Timestamp,
    n_ids: u64,
    n_commands: u64,
    ms_per_command: Option<u64>,
    /// The partitions whose horizon is still to be set, with the horizon.
    settings: Vec<(u32, u32, Millis)>,
}

/// splitmix64: a fixed, seeded interleaving with no dependency.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Generator {
    fn new(config: &GenConfig) -> anyhow::Result<Self> {
        ensure!(config.partitions > 0, "a log has at least one partition");
        ensure!(config.agents_per_partition > 0, "a partition needs at least one agent");
        ensure!(config.resources_per_agent > 0, "an agent needs at least one resource at a time");
        let mut per_partition = vec![0u32; config.partitions as usize];
        let mut agents = Vec::new();
        let wanted = u64::from(config.partitions) * u64::from(config.agents_per_partition);
        let mut i = 0u64;
        while (agents.len() as u64) < wanted {
            i += 1;
            let name = AgentName::new(format!("w{i}")).map_err(|e| anyhow::anyhow!("agent name w{i}: {e}"))?;
            let partition = partition_of_agent(&name, config.partitions);
            if per_partition[partition as usize] >= config.agents_per_partition {
                continue;
            }
            per_partition[partition as usize] += 1;
            let cycle = Cycle { step: Step::Allocate, resource: None, lease: None, rounds: 0 };
            agents.push(GenAgent {
                name,
                partition,
                epoch: None,
                obs: 0,
                cycles: vec![cycle; config.resources_per_agent],
            });
        }
        let settings = match config.horizon {
            Some(horizon) => (0..config.partitions).rev().map(|p| (p, config.partitions, horizon)).collect(),
            None => Vec::new(),
        };
        Ok(Generator {
            agents,
            random: config.seed,
            clock: config.start,
            n_ids: 0,
            n_commands: 0,
            ms_per_command: config.ms_per_command,
            settings,
        })
    }

    fn entropy(&mut self, tag: u8) -> [u8; 10] {
        self.n_ids += 1;
        let mut entropy = [0u8; 10];
        entropy[0] = tag;
        entropy[2..].copy_from_slice(&self.n_ids.to_be_bytes());
        entropy
    }

    /// The next command: from an agent picked at random, its registration first, then a step of one of its
    /// cycles picked at random. Returns its partition, the envelope, its log time and where it came from.
    fn next(&mut self, writers: &Writers) -> anyhow::Result<(u32, Envelope, Timestamp, Origin)> {
        match self.ms_per_command {
            Some(ms) if self.n_commands > 0 => {
                let Some(clock) = self.clock.0.checked_add(ms) else {
                    anyhow::bail!("the log's clock runs past the end of time at {ms} ms a command (--ms-per-command)");
                };
                self.clock = Timestamp(clock);
            }
            Some(_) => {}
            None if self.n_commands > 0 && self.n_commands.is_multiple_of(COMMANDS_PER_MS) => {
                self.clock = Timestamp(self.clock.0 + 1);
            }
            None => {}
        }
        self.n_commands += 1;
        if let Some((partition, partitions, horizon)) = self.settings.pop() {
            let now = self.clock;
            let body = SetPartitionSettings {
                key: settings_key(partition, partitions),
                partition,
                outcome_horizon: Some(horizon),
                policy: None,
                if_no_policy: false,
                gc: None,
                max_priority: None,
            };
            let envelope = Envelope::new(CommandId::from_parts(now.0, self.entropy(2)), issuer(OPERATOR)?, now, body);
            return Ok((partition, envelope, now, Origin::Settings));
        }
        let a = (next_random(&mut self.random) % self.agents.len() as u64) as usize;
        let k = (next_random(&mut self.random) % self.agents[a].cycles.len() as u64) as usize;
        let now = self.clock;
        let command_id = CommandId::from_parts(now.0, self.entropy(1));
        let partition = self.agents[a].partition;
        let agent = self.agents[a].name.clone();
        let Some(epoch) = self.agents[a].epoch else {
            let incarnation = Uuid::from_u128(u128::from(self.n_ids) + 1);
            let body = Register::new(agent.clone(), incarnation);
            let envelope = Envelope::new(command_id, issuer(agent.as_str())?, now, body);
            return Ok((partition, envelope, now, Origin::Register(a)));
        };
        let step = self.agents[a].cycles[k].step;
        let resource = self.agents[a].cycles[k].resource;
        let lease = self.agents[a].cycles[k].lease;
        let rounds = self.agents[a].cycles[k].rounds;
        let the_resource = || resource.ok_or_else(|| anyhow::anyhow!("a cycle past allocate has its resource"));
        let (issued_by, body): (String, Command) = match step {
            Step::Allocate => {
                let id = ResourceId::from_parts(now.0, self.entropy(2));
                self.agents[a].cycles[k].resource = Some(id);
                let mut attributes = BTreeMap::new();
                attributes.insert("team".to_owned(), "ci".to_owned());
                let body = Allocate {
                    agent,
                    resource: id,
                    kind: "container".to_owned(),
                    capacity: 2,
                    attributes,
                    parent: None,
                    pools: vec![],
                    wait: None,
                };
                (OPERATOR.to_owned(), body.into())
            }
            Step::AcquireWhilePending | Step::Acquire => {
                let id = LeaseId::from_parts(now.0, self.entropy(3));
                if step == Step::AcquireWhilePending {
                    self.agents[a].cycles[k].lease = Some((id, None));
                }
                let holder = format!("build-{}", self.n_ids);
                let body = Acquire {
                    agent,
                    resource: the_resource()?,
                    lease: id,
                    holder,
                    ttl: None,
                    wait_timeout: None,
                    priority: 0,
                };
                (OPERATOR.to_owned(), body.into())
            }
            Step::ReportCreated => {
                self.agents[a].obs += 1;
                let obs = self.agents[a].obs;
                let body =
                    ReportCreated { agent: agent.clone(), epoch, obs, resource: the_resource()?, native_id: None };
                (agent.as_str().to_owned(), body.into())
            }
            Step::ReleaseLease => {
                let Some((id, Some(token))) = lease else { bail!("the lease acquired while pending was not granted") };
                (OPERATOR.to_owned(), ReleaseLease { agent, lease: id, token: Some(token) }.into())
            }
            Step::Pause => {
                let body =
                    Pause { agent, resource: the_resource()?, reason: Some("maintenance".to_owned()), until: None };
                (OPERATOR.to_owned(), body.into())
            }
            Step::Unpause => (OPERATOR.to_owned(), Unpause { agent, resource: the_resource()? }.into()),
            Step::Update => {
                let mut set = BTreeMap::new();
                set.insert("round".to_owned(), rounds.to_string());
                let body =
                    Update { agent, resource: the_resource()?, set, remove: vec![], capacity: None, max_lease: None };
                (OPERATOR.to_owned(), body.into())
            }
            Step::Release => {
                let body = Release { agent, resource: the_resource()?, reason: Some("done".to_owned()) };
                (OPERATOR.to_owned(), body.into())
            }
            Step::ReportDestroyed => {
                self.agents[a].obs += 1;
                let obs = self.agents[a].obs;
                let state = writers.state(partition);
                let mut report = SyncReport::new(agent.clone(), epoch, obs, state.last_position());
                report.destroyed = vec![the_resource()?];
                let (count, digest) = expected_listing(state, &report)
                    .ok_or_else(|| anyhow::anyhow!("agent {agent} has no listing to report"))?;
                report.count = count;
                report.digest = digest;
                (agent.as_str().to_owned(), report.into())
            }
        };
        let envelope = Envelope::new(command_id, issuer(&issued_by)?, now, body);
        Ok((partition, envelope, now, Origin::Cycle(a, k)))
    }

    /// Learns what the next commands need from an accepted outcome (an epoch, a token) and moves the cycle on.
    fn learn(&mut self, from: Origin, outcome: &Outcome) -> anyhow::Result<()> {
        match from {
            Origin::Settings => {}
            Origin::Register(a) => {
                let epoch = outcome
                    .positioned_effects()
                    .find_map(|(position, e)| matches!(e, Effect::AgentRegistered { .. }).then_some(position))
                    .ok_or_else(|| anyhow::anyhow!("a registration without agent-registered"))?;
                self.agents[a].epoch = Some(epoch);
            }
            Origin::Cycle(a, k) => {
                let cycle = &mut self.agents[a].cycles[k];
                cycle.step = match cycle.step {
                    Step::Allocate => Step::AcquireWhilePending,
                    Step::AcquireWhilePending => Step::ReportCreated,
                    Step::ReportCreated => {
                        let Some((lease, token)) = &mut cycle.lease else { bail!("a cycle without its lease") };
                        let granted = outcome.positioned_effects().find_map(|(position, e)| match e {
                            Effect::LeaseGranted { lease: granted, .. } if granted == lease => Some(position),
                            _ => None,
                        });
                        *token = Some(granted.ok_or_else(|| anyhow::anyhow!("the waiting lease was not granted"))?);
                        Step::ReleaseLease
                    }
                    Step::ReleaseLease => Step::Pause,
                    Step::Pause => Step::Unpause,
                    Step::Unpause => Step::Update,
                    Step::Update => Step::Acquire,
                    Step::Acquire => Step::Release,
                    Step::Release => Step::ReportDestroyed,
                    Step::ReportDestroyed => {
                        *cycle = Cycle { step: Step::Allocate, resource: None, lease: None, rounds: cycle.rounds + 1 };
                        Step::Allocate
                    }
                };
            }
        }
        Ok(())
    }
}

fn issuer(name: &str) -> anyhow::Result<Issuer> {
    Issuer::new(name).map_err(|e| anyhow::anyhow!("issuer {name}: {e}"))
}

/// What [`generate`] made.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Generated {
    pub commands: u64,
    pub outcomes: u64,
    pub effects: u64,
    pub agents: u64,
    /// Commands of each type.
    pub types: BTreeMap<String, u64>,
    pub file_bytes: u64,
}

/// Generates a log as the module doc says and writes it to a new export file at `path`.
pub async fn generate(config: &GenConfig, path: &Path) -> anyhow::Result<Generated> {
    let file = tokio::fs::File::create(path).await.with_context(|| format!("creating {}", path.display()))?;
    let header = Header::new(DECIDER_VERSION, config.partitions, config.outcomes, "replay-bench generator");
    let mut out = export::Writer::new(file, &header).await?;
    let mut generator = Generator::new(config)?;
    let mut writers = Writers::new(config.partitions);
    let mut made = Generated { agents: generator.agents.len() as u64, ..Generated::default() };
    while writers.outcomes < config.outcomes {
        let (partition, envelope, time, from) = generator.next(&writers)?;
        let body = &envelope.body;
        let record = CommandRecord {
            seq: made.commands + 1,
            subject: command_subject(partition, body.class(), &body.key(), body.subject_id()),
            time,
            payload: Bytes::from(codec::encode_command(&envelope).context("encoding a generated command")?),
        };
        let parts = writers.decide(partition, &record, &envelope)?;
        let (_, first) = &parts[0];
        if let Some(rejection) = first.rejection() {
            bail!(
                "the generator's {} (command {}) was rejected: {} — the generator is wrong",
                envelope.type_name(),
                record.seq,
                rejection.message
            );
        }
        generator.learn(from, first)?;
        made.commands += 1;
        *made.types.entry(envelope.type_name().to_owned()).or_default() += 1;
        out.write(&Entry::Command { partition, record }).await?;
        for (stored, _) in parts {
            out.write(&Entry::Outcome(stored)).await?;
        }
    }
    out.finish().await?;
    made.outcomes = writers.outcomes;
    made.effects = writers.effects;
    made.file_bytes = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    Ok(made)
}

// ---------------------------------------------------------------------------------------------------------------
// Loading the log into JetStream.

/// How many commands or outcomes are loaded per call of a loader, and how many publishes each keeps in flight.
const LOAD_CHUNK: usize = 20_000;
const LOAD_IN_FLIGHT: usize = 256;

/// What the load did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Loaded {
    pub commands: u64,
    pub outcomes: u64,
    pub effects: u64,
    pub commands_s: f64,
    pub decide_and_outcomes_s: f64,
}

/// Loads the export file's commands into a fresh JetStream log, then decides them again at the times the server
/// stamped and loads the outcomes: see the module doc.
pub async fn load_jetstream(log: &JetStream, file: &Path, generated: &Generated) -> anyhow::Result<Loaded> {
    ensure!(
        log.last_command_seq().await? == 0,
        "the NATS server holds leasehold commands already: the benchmark loads a log of its own into a server that \
         has none"
    );
    let partitions = log.partitions();
    for partition in 0..partitions {
        ensure!(
            log.last_outcome_seq(partition).await? == 0,
            "the NATS server holds leasehold outcomes already: the benchmark needs a server that has none"
        );
    }
    let mut loaded = Loaded::default();

    let started = Instant::now();
    let (mut reader, _) = open_export(file).await?;
    let mut chunk = Vec::with_capacity(LOAD_CHUNK);
    let mut wanted = Vec::with_capacity(LOAD_CHUNK);
    loop {
        let entry = reader.next().await?;
        let done = entry.is_none();
        if let Some(Entry::Command { record, .. }) = entry {
            let msg_id = codec::peek_command_id(&record.payload)
                .ok_or_else(|| anyhow::anyhow!("command {} has no command id", record.seq))?
                .to_string();
            chunk.push((ingress_of(&record.subject)?, msg_id, record.payload));
            wanted.push(record.seq);
        }
        if chunk.len() >= LOAD_CHUNK || (done && !chunk.is_empty()) {
            let landed = log.bench_load_commands(&chunk, LOAD_IN_FLIGHT).await?;
            check_sequences("command", &wanted, &landed)?;
            loaded.commands += landed.len() as u64;
            chunk.clear();
            wanted.clear();
        }
        if done {
            break;
        }
    }
    loaded.commands_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut writers = Writers::new(partitions);
    let mut feeds: Vec<Feed> = (0..partitions).map(|_| Feed::default()).collect();
    let mut chunk: Vec<(u32, u64, OutcomeRecord)> = Vec::with_capacity(LOAD_CHUNK);
    let mut wanted = Vec::with_capacity(LOAD_CHUNK);
    loop {
        // The next command in the log's order: the lowest sequence at the head of a partition's feed.
        for (partition, feed) in feeds.iter_mut().enumerate() {
            if feed.ahead.is_empty() && !feed.read_all {
                let batch = log.read_commands(partition as u32, feed.after, 1024).await?;
                feed.read_all = batch.is_empty();
                if let Some(last) = batch.last() {
                    feed.after = last.seq;
                }
                feed.ahead.extend(batch);
            }
        }
        let next = feeds
            .iter()
            .enumerate()
            .filter_map(|(p, feed)| feed.ahead.front().map(|r| (r.seq, p)))
            .min()
            .map(|(_, p)| p);
        let done = next.is_none();
        if let Some(p) = next {
            let record = feeds[p].ahead.pop_front().expect("looked at its front");
            for stored in decide_again(&mut writers, p as u32, &record)? {
                wanted.push(stored.seq);
                let record = OutcomeRecord {
                    key: stored.key,
                    cmd_id: stored.cmd_id,
                    cmd_seq: stored.cmd_seq,
                    part: stored.part,
                    payload: stored.payload,
                };
                chunk.push((stored.partition, stored.prev_seq, record));
            }
        }
        if chunk.len() >= LOAD_CHUNK || (done && !chunk.is_empty()) {
            let landed = log.bench_load_outcomes(&chunk, LOAD_IN_FLIGHT).await?;
            check_sequences("outcome", &wanted, &landed)?;
            loaded.outcomes += landed.len() as u64;
            chunk.clear();
            wanted.clear();
        }
        if done {
            break;
        }
    }
    loaded.effects = writers.effects;
    loaded.decide_and_outcomes_s = started.elapsed().as_secs_f64();
    ensure!(
        (loaded.commands, loaded.outcomes, loaded.effects)
            == (generated.commands, generated.outcomes, generated.effects),
        "JetStream holds {} commands and {} outcomes of {} effects, the file {}, {} and {}: decided at the server's \
         times, the log came out another",
        loaded.commands,
        loaded.outcomes,
        loaded.effects,
        generated.commands,
        generated.outcomes,
        generated.effects
    );
    Ok(loaded)
}

/// Decides a command of the generated log again as a writer reads it from its partition (admitted as a writer
/// admits it), at the log time `record` carries: its outcome parts as the log stores them. The mix does not depend
/// on time, so any rejection is an error naming the command.
pub fn decide_again(
    writers: &mut Writers,
    partition: u32,
    record: &CommandRecord,
) -> anyhow::Result<Vec<StoredOutcome>> {
    let partitions = writers.states.len() as u32;
    let envelope = leasehold_worker::admit(partition, partitions, record)
        .map_err(|why| anyhow::anyhow!("command {}: a writer would dead-letter it: {why}", record.seq))?;
    let mut parts = Vec::new();
    for (stored, outcome) in writers.decide(partition, record, &envelope)? {
        if let Some(rejection) = outcome.rejection() {
            bail!(
                "command {} ({}) decided again at log time {} was rejected: {} — the generator's mix depends on time, \
                 which it must not",
                record.seq,
                envelope.type_name(),
                record.time,
                rejection.message
            );
        }
        parts.push(stored);
    }
    Ok(parts)
}

/// One partition's commands read back from JetStream, not decided yet.
#[derive(Debug, Default)]
struct Feed {
    ahead: VecDeque<CommandRecord>,
    after: u64,
    read_all: bool,
}

/// `lh.cmd.<p>.<class>.<key>.<id>` -> `lh.in.<class>.<key>.<id>`, where a producer publishes it.
fn ingress_of(stored: &str) -> anyhow::Result<String> {
    let rest = stored
        .strip_prefix("lh.cmd.")
        .and_then(|rest| rest.split_once('.'))
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("{stored:?} is not a stored command subject"))?;
    Ok(format!("lh.in.{rest}"))
}

/// The server stored each record where the log written to the file (and its `Lh-Prev-Seq` chain) has it.
fn check_sequences(what: &str, wanted: &[u64], landed: &[u64]) -> anyhow::Result<()> {
    ensure!(wanted.len() == landed.len(), "{} {what}s published, {} acknowledged", wanted.len(), landed.len());
    if let Some((want, got)) = wanted.iter().zip(landed).find(|(want, got)| want != got) {
        bail!(
            "a loaded {what} landed at sequence {got}, not {want}: something else writes to this server's leasehold \
             streams, and the chain written is broken; the benchmark needs a server of its own"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// The measurements.

async fn open_export(path: &Path) -> anyhow::Result<(export::Reader<tokio::fs::File>, Header)> {
    let file = tokio::fs::File::open(path).await.with_context(|| format!("opening {}", path.display()))?;
    export::Reader::open(file).await.with_context(|| format!("reading {}", path.display()))
}

/// The file's frames read and checked, nothing decoded: how long it took.
async fn read_frames(path: &Path, outcomes: u64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (mut reader, _) = open_export(path).await?;
    let mut n = 0;
    while let Some((kind, _)) = reader.next_frame().await? {
        n += u64::from(kind == FrameKind::Outcome);
    }
    let elapsed = started.elapsed();
    ensure!(n == outcomes, "the file holds {n} outcomes, not {outcomes}");
    Ok(elapsed)
}

/// Every entry of `entries` taken, nothing folded: how long it took.
async fn drain(
    entries: BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    outcomes: u64,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut entries = entries;
    let mut n = 0;
    while let Some(entry) = entries.next().await {
        n += u64::from(matches!(entry?, Entry::Outcome(_)));
    }
    let elapsed = started.elapsed();
    ensure!(n == outcomes, "the source gave {n} outcomes, not {outcomes}");
    Ok(elapsed)
}

/// Every outcome of `log` read in batches of [`leasehold_projector::MAX_BATCH`], no command: how long it took.
async fn read_outcomes(log: &JetStream, outcomes: u64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (mut n, mut from) = (0, 1);
    loop {
        let batch = log.read_outcomes(&leasehold_log::OutcomeFilter::All, from, leasehold_projector::MAX_BATCH).await?;
        let Some(last) = batch.last() else { break };
        from = last.seq + 1;
        n += batch.len() as u64;
    }
    let elapsed = started.elapsed();
    ensure!(n == outcomes, "the log gave {n} outcomes, not {outcomes}");
    Ok(elapsed)
}

/// `verify` over `entries`: its report and how long it took.
pub async fn verify_entries(
    partitions: u32,
    entries: BoxStream<'static, Result<Entry, leasehold_log::Error>>,
) -> anyhow::Result<(Report, Duration)> {
    let started = Instant::now();
    let report = Verifier::new(partitions, None)?.run(entries, |_| {}).await?;
    Ok((report, started.elapsed()))
}

/// `verify` found the log right, and decided every outcome again (none only folded).
fn verified(source: &str, report: &Report, outcomes: u64) -> Result<(), String> {
    if let Some(failure) = &report.failure {
        return Err(format!("verify of the {source} FAILED at {failure}"));
    }
    if report.outcomes != outcomes || report.redecided.count != outcomes {
        return Err(format!(
            "verify of the {source} folded {} outcomes and decided {} again, not all {outcomes}",
            report.outcomes, report.redecided.count
        ));
    }
    Ok(())
}

/// `rebuild` of a new projection in `dir` from `entries`: its table digests and how long it took.
pub async fn rebuild_entries(
    partitions: u32,
    dir: &Path,
    entries: BoxStream<'static, Result<Entry, leasehold_log::Error>>,
) -> anyhow::Result<(BTreeMap<&'static str, String>, u64, Duration)> {
    let projector = Projector::open_with_cache(dir, partitions, leasehold_projector::BULK_CACHE_BYTES)
        .with_context(|| format!("opening a projection in {}", dir.display()))?;
    let started = Instant::now();
    let projector = crate::rebuild_projection(projector, entries, |_| {}).await?;
    let elapsed = started.elapsed();
    Ok((projector.digests()?, projector.applied(), elapsed))
}

/// One source's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SourceFigures {
    /// What the raw read is.
    pub raw_read: &'static str,
    pub raw_read_s: f64,
    pub raw_read_outcomes_per_s: f64,
    pub raw_read_effects_per_s: f64,
    /// Another read of the same source, for reference (not a denominator).
    pub reference_read: Option<ReferenceRead>,
    pub verify_s: f64,
    pub verify_outcomes_per_s: f64,
    pub verify_effects_per_s: f64,
    /// Raw read time / verify time.
    pub verify_ratio: f64,
    pub rebuild_s: f64,
    pub rebuild_outcomes_per_s: f64,
    pub rebuild_effects_per_s: f64,
    /// Raw read time / rebuild time.
    pub rebuild_ratio: f64,
    /// What the raw decode is: every entry decoded, nothing folded (issue 22's denominator).
    pub raw_decode: &'static str,
    pub raw_decode_s: f64,
    pub raw_decode_outcomes_per_s: f64,
    /// Raw decode time / verify time.
    pub verify_ratio_to_decode: f64,
    /// Raw decode time / rebuild time.
    pub rebuild_ratio_to_decode: f64,
    /// The process's resident memory when verify started, and its peak while verify ran (MB).
    pub verify_rss_start_mb: f64,
    pub verify_peak_rss_mb: f64,
    /// The same for rebuild.
    pub rebuild_rss_start_mb: f64,
    pub rebuild_peak_rss_mb: f64,
}

impl SourceFigures {
    fn new(
        raw_read: &'static str,
        raw: Duration,
        (raw_decode, decode): (&'static str, Duration),
        verify: &Phase,
        rebuild: &Phase,
        made: &Generated,
    ) -> Self {
        let per_s = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
        let ratio = |d: Duration| raw.as_secs_f64() / d.as_secs_f64().max(1e-9);
        let to_decode = |d: Duration| decode.as_secs_f64() / d.as_secs_f64().max(1e-9);
        let (verify_memory, rebuild_memory) = (verify.memory, rebuild.memory);
        let (verify, rebuild) = (verify.elapsed, rebuild.elapsed);
        SourceFigures {
            raw_read,
            raw_read_s: raw.as_secs_f64(),
            raw_read_outcomes_per_s: per_s(made.outcomes, raw),
            raw_read_effects_per_s: per_s(made.effects, raw),
            reference_read: None,
            verify_s: verify.as_secs_f64(),
            verify_outcomes_per_s: per_s(made.outcomes, verify),
            verify_effects_per_s: per_s(made.effects, verify),
            verify_ratio: ratio(verify),
            rebuild_s: rebuild.as_secs_f64(),
            rebuild_outcomes_per_s: per_s(made.outcomes, rebuild),
            rebuild_effects_per_s: per_s(made.effects, rebuild),
            rebuild_ratio: ratio(rebuild),
            raw_decode,
            raw_decode_s: decode.as_secs_f64(),
            raw_decode_outcomes_per_s: per_s(made.outcomes, decode),
            verify_ratio_to_decode: to_decode(verify),
            rebuild_ratio_to_decode: to_decode(rebuild),
            verify_rss_start_mb: mb(verify_memory.start),
            verify_peak_rss_mb: mb(verify_memory.peak),
            rebuild_rss_start_mb: mb(rebuild_memory.start),
            rebuild_peak_rss_mb: mb(rebuild_memory.peak),
        }
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// A timed phase, with the process's resident memory when it started and at its peak while it ran.
#[derive(Debug, Clone, Copy)]
struct Phase {
    elapsed: Duration,
    memory: Memory,
}

/// Resident memory in bytes: when a phase started, and the peak while it ran.
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    start: u64,
    peak: u64,
}

/// Runs `phase`, measuring the process's peak resident memory while it runs: the peak (`VmHWM` of
/// `/proc/self/status`) is reset to the resident memory of now first (writing 5 to `/proc/self/clear_refs`, Linux
/// 4.0 on). Where that cannot be done (another system, no such file), the figures are 0.
async fn measured<T>(
    phase: impl std::future::Future<Output = anyhow::Result<(T, Duration)>>,
) -> anyhow::Result<(T, Phase)> {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let start = if reset { status_bytes("VmRSS:") } else { 0 };
    let (value, elapsed) = phase.await?;
    let peak = if reset { status_bytes("VmHWM:") } else { 0 };
    Ok((value, Phase { elapsed, memory: Memory { start, peak } }))
}

/// A `kB` line of `/proc/self/status`, in bytes (0 if it cannot be read).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A read of a source beside its raw read: the file's entries decoded, JetStream's outcomes alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReferenceRead {
    pub what: &'static str,
    pub s: f64,
    pub outcomes_per_s: f64,
    pub effects_per_s: f64,
    /// Raw read time / this read's time.
    pub ratio: f64,
}

impl ReferenceRead {
    fn new(what: &'static str, elapsed: Duration, raw: Duration, made: &Generated) -> Self {
        let s = elapsed.as_secs_f64().max(1e-9);
        ReferenceRead {
            what,
            s: elapsed.as_secs_f64(),
            outcomes_per_s: made.outcomes as f64 / s,
            effects_per_s: made.effects as f64 / s,
            ratio: raw.as_secs_f64() / s,
        }
    }
}

/// Everything the benchmark prints.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    pub partitions: u32,
    pub agents: u64,
    pub commands: u64,
    pub outcomes: u64,
    pub effects: u64,
    pub command_types: BTreeMap<String, u64>,
    pub export_bytes: u64,
    pub generate_s: f64,
    pub file: SourceFigures,
    pub nats: Option<SourceFigures>,
    pub nats_load: Option<Loaded>,
    /// Why JetStream was not measured.
    pub nats_skipped: Option<String>,
}

/// Runs the benchmark: see the module doc.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.outcomes > 0, "--outcomes must be at least 1");
    let temp;
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::Builder::new().prefix("replay-bench-").tempdir().context("a temporary directory")?;
            temp.path().to_owned()
        }
    };
    let file = dir.join("generated.lhexport");
    ensure!(!file.exists(), "{} exists: give --dir a directory without a generated log", file.display());

    let start_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let config = GenConfig {
        outcomes: args.outcomes,
        partitions: args.partitions,
        agents_per_partition: args.agents_per_partition,
        resources_per_agent: args.resources_per_agent,
        seed: args.seed,
        start: Timestamp(u64::try_from(start_ms)?),
        ms_per_command: args.ms_per_command,
        horizon: args.horizon_ms.map(Millis),
    };
    eprintln!("generating {} outcomes over {} partitions into {}...", args.outcomes, args.partitions, file.display());
    let started = Instant::now();
    let made = generate(&config, &file).await?;
    let mut figures = Figures {
        partitions: args.partitions,
        agents: made.agents,
        commands: made.commands,
        outcomes: made.outcomes,
        effects: made.effects,
        command_types: made.types.clone(),
        export_bytes: made.file_bytes,
        generate_s: started.elapsed().as_secs_f64(),
        ..Figures::default()
    };
    let mut failures = Vec::new();

    eprintln!("file: raw read, raw decode, verify, rebuild...");
    let raw = read_frames(&file, made.outcomes).await?;
    let (reader, _) = open_export(&file).await?;
    let decode = drain(reader.into_stream(), made.outcomes).await?;
    let (reader, _) = open_export(&file).await?;
    let (report, verify) = measured(verify_entries(args.partitions, reader.into_stream())).await?;
    if let Err(failure) = verified("export file", &report, made.outcomes) {
        failures.push(failure);
    }
    let (reader, _) = open_export(&file).await?;
    let projection = dir.join("projection-file");
    let ((_, applied), rebuild) = measured(async {
        let (digests, applied, elapsed) = rebuild_entries(args.partitions, &projection, reader.into_stream()).await?;
        Ok(((digests, applied), elapsed))
    })
    .await?;
    ensure!(applied == made.outcomes, "the rebuild from the file applied up to {applied}, not {}", made.outcomes);
    let mut file_figures = SourceFigures::new(
        "frames read and checksummed, not decoded",
        raw,
        ("every entry decoded (export::Reader::next), nothing folded", decode),
        &verify,
        &rebuild,
        &made,
    );
    file_figures.reference_read = Some(ReferenceRead::new("read entries (decoded, not folded)", decode, raw, &made));
    figures.file = file_figures;

    let server;
    let url = match (&args.nats, args.no_nats) {
        (_, true) => {
            figures.nats_skipped = Some("--no-nats".to_owned());
            None
        }
        (Some(url), false) => Some(url.clone()),
        (None, false) if !nats_server_on_path() => {
            figures.nats_skipped = Some("no nats-server on PATH (give --nats URL, or install it)".to_owned());
            None
        }
        (None, false) => {
            server = NatsServer::start().context("starting nats-server")?;
            Some(server.url().to_owned())
        }
    };
    if let Some(url) = url {
        let log = JetStream::connect(JetStreamConfig::new(url.clone(), args.partitions))
            .await
            .with_context(|| format!("connecting to {url}"))?;
        eprintln!("nats: loading the log into {url} (commands, then outcomes decided at the server's times)...");
        let loaded = load_jetstream(&log, &file, &made).await?;
        figures.nats_load = Some(loaded);
        eprintln!("nats: raw read, verify, rebuild...");
        let raw = drain(export::entries(log.clone(), None), made.outcomes).await?;
        let (report, verify) = measured(verify_entries(args.partitions, export::entries(log.clone(), None))).await?;
        if let Err(failure) = verified("JetStream log", &report, made.outcomes) {
            failures.push(failure);
        }
        // As `leasehold-replay --nats URL rebuild` does: the outcomes only (a projection needs no command).
        let source = crate::source::Source::Nats { log: log.clone(), url: url.clone() };
        let outcomes = source.outcomes(None).await?.entries;
        let projection = dir.join("projection-nats");
        let ((_, applied), rebuild) = measured(async {
            let (digests, applied, elapsed) = rebuild_entries(args.partitions, &projection, outcomes).await?;
            Ok(((digests, applied), elapsed))
        })
        .await?;
        ensure!(applied == made.outcomes, "the rebuild from JetStream applied up to {applied}, not {}", made.outcomes);
        let outcomes_only = read_outcomes(&log, made.outcomes).await?;
        // JetStream's raw read decodes every entry already (the headers into entries, as verify gets them): it is
        // the raw decode too.
        let mut nats_figures = SourceFigures::new(
            "export::entries drained (outcomes and commands read, headers decoded), not folded",
            raw,
            ("the raw read (export::entries decodes every entry)", raw),
            &verify,
            &rebuild,
            &made,
        );
        nats_figures.reference_read =
            Some(ReferenceRead::new("read outcomes only (read_outcomes, 1,000 a batch)", outcomes_only, raw, &made));
        figures.nats = Some(nats_figures);
        if args.nats.is_some() {
            // Checked empty before the load: what is there now is the benchmark's own.
            log.bench_reset().await?;
        }
    }
    if let Some(why) = &figures.nats_skipped {
        eprintln!("nats: skipped ({why})");
    }

    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    if failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for failure in failures {
            eprintln!("replay-bench: {failure}");
        }
        Ok(ExitCode::FAILURE)
    }
}

fn nats_server_on_path() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("nats-server").is_file()))
}

fn print_table(f: &Figures) {
    println!(
        "replay-bench: {} outcomes ({} effects) answering {} commands, {} partitions, {} agents; export {:.0} MB, \
         generated in {:.1} s",
        f.outcomes,
        f.effects,
        f.commands,
        f.partitions,
        f.agents,
        f.export_bytes as f64 / 1e6,
        f.generate_s
    );
    println!(
        "  {:<6} {:<46} {:>12} {:>12} {:>8} {:>9} {:>9} {:>16}",
        "source", "phase", "outcomes/s", "effects/s", "ratio", "/decode", "time", "RSS start/peak"
    );
    let row = |source: &str, phase: &str, outcomes_per_s: f64, effects_per_s: f64, ratio: f64, s: f64| {
        println!(
            "  {source:<6} {phase:<46} {outcomes_per_s:>12.0} {effects_per_s:>12.0} {ratio:>8.2} {:>9} {:>8.1}s",
            "", s
        );
    };
    let timed = |source: &str,
                 phase: &str,
                 (outcomes_per_s, effects_per_s): (f64, f64),
                 (ratio, to_decode): (f64, f64),
                 s: f64,
                 (start, peak): (f64, f64)| {
        println!(
            "  {source:<6} {phase:<46} {outcomes_per_s:>12.0} {effects_per_s:>12.0} {ratio:>8.2} {to_decode:>9.3} {s:>8.1}s {:>16}",
            format!("{start:.0}/{peak:.0} MB")
        );
    };
    let source = |name: &str, s: &SourceFigures, raw: &str| {
        row(name, raw, s.raw_read_outcomes_per_s, s.raw_read_effects_per_s, 1.0, s.raw_read_s);
        if let Some(r) = &s.reference_read {
            row(name, r.what, r.outcomes_per_s, r.effects_per_s, r.ratio, r.s);
        }
        timed(
            name,
            "verify",
            (s.verify_outcomes_per_s, s.verify_effects_per_s),
            (s.verify_ratio, s.verify_ratio_to_decode),
            s.verify_s,
            (s.verify_rss_start_mb, s.verify_peak_rss_mb),
        );
        timed(
            name,
            "rebuild",
            (s.rebuild_outcomes_per_s, s.rebuild_effects_per_s),
            (s.rebuild_ratio, s.rebuild_ratio_to_decode),
            s.rebuild_s,
            (s.rebuild_rss_start_mb, s.rebuild_peak_rss_mb),
        );
    };
    source("file", &f.file, "raw read (frames read and checksummed)");
    match (&f.nats, &f.nats_load, &f.nats_skipped) {
        (Some(s), Some(load), _) => {
            source("nats", s, "raw read (export::entries, not folded)");
            println!(
                "  (nats load, not timed as a phase: {} commands in {:.1} s, then decided again and {} outcomes in \
                 {:.1} s)",
                load.commands, load.commands_s, load.outcomes, load.decide_and_outcomes_s
            );
        }
        (_, _, Some(why)) => println!("  nats   skipped: {why}"),
        _ => {}
    }
    println!(
        "  ratio = raw read time / the phase's time; /decode = raw decode time / the phase's time (the file's raw \
         decode is its \"read entries\" row, JetStream's is its raw read); same source, same run"
    );
}
