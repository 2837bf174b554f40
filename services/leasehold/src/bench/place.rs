//! `leasehold bench place`: how long a placement (an allocation that names no agent) takes, beside one command's
//! round trip on the same log in the same run. A benchmark, never a test: it prints a table and, as its last line,
//! one JSON object.
//!
//! It runs what `serve` runs, in this process, on the log it is pointed at (an empty one): the writers, the
//! projector, the sweeper (at `--sweep-interval`) and `--agents` agents with the dir driver, each declaring room for
//! every resource of the run, so that spread always has a choice and no round runs out of room. A round publishes
//! an `op.place` and times it until its `placement-bound` outcome and until the `sys.commit-placement` outcome that
//! allocates the resource. Between the two ends: the placement's `placement-wanted`, the sweeper's `sys.reserve` on
//! the agent it picks (`capacity-reserved` in the agent's partition), its `sys.bind-placement` in the placement's
//! partition, and its `sys.commit-placement` back on the agent.
//!
//! The sweeper is not woken by its tick here: it plans as soon as an outcome is folded, but at most once per plan
//! gap (20 ms, `SweeperConfig::plan_gap`) after its last plan. Its tick (`--sweep-interval`) is for deadlines that
//! pass with nothing appended and plays no part. Each of its three requests' outcomes lands a round trip (about a
//! millisecond) after the plan that sent it, so each hop waits out the rest of the gap: the plan gap, about 3 × 20
//! ms, is most of a placement, and the commands themselves a few milliseconds (`--plan-gap` shows it). The baseline,
//! in the same run and at the same concurrency, alternating with the placements: an `op.allocate` naming an agent,
//! from its publish to its outcome.
//!
//! A round ends once its resource is made (`resource-activated`), so that the agent's create and report do not
//! overlap the next round; `--concurrency` rounds are in flight at once. After the rounds, the outcomes on the log
//! about each placement are counted (commands per placement), and every partition is folded to check that each
//! placement made exactly one resource.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use leasehold_agent::{AgentConfig, AnyDriver, DirDriver};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::{Allocate, Place, PlacementStrategy};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Key, ResourceId};
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, CommandClass, Effect, Envelope, Outcome, codec};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The kind every round asks for, placed or allocated.
const KIND: &str = "volume";

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PlaceArgs {
    /// An empty data directory for the embedded log (default: a new temporary directory).
    #[arg(long, conflicts_with = "nats")]
    data: Option<PathBuf>,
    /// Measure on a NATS JetStream server instead (it must hold no leasehold streams yet; they are deleted after).
    #[arg(long)]
    nats: Option<String>,
    /// Stream replicas on NATS (3 on a cluster).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Placements timed (and as many allocations naming an agent, for the baseline).
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Agents a placement chooses among (each declares room for every resource of the run).
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Rounds in flight at once (placements and baseline allocations together).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// The sweeper's interval (`serve --sweep-interval`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
    /// The sweeper's shortest gap between two plans for arriving outcomes (`serve` always runs the default, 20 ms;
    /// another value here shows how much of the figure it is).
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    plan_gap: Duration,
}

impl PlaceArgs {
    /// A short run on the embedded log, for the smoke test.
    #[cfg(test)]
    fn smoke(rounds: usize) -> Self {
        PlaceArgs {
            data: None,
            nats: None,
            replicas: 1,
            partitions: 4,
            rounds,
            agents: 3,
            concurrency: 1,
            sweep_interval: Duration::from_secs(1),
            plan_gap: leasehold_sweeper::DEFAULT_PLAN_GAP,
        }
    }
}

#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct PlaceFigures {
    backend: String,
    rounds: usize,
    agents: usize,
    concurrency: usize,
    sweep_interval_s: f64,
    /// The sweeper's shortest gap between two plans for arriving outcomes.
    plan_gap_s: f64,
    /// `op.place` published to its own outcome (`placement-wanted`) seen: a command's round trip.
    place_wanted_p50_s: f64,
    /// `op.place` published to the `capacity-reserved` outcome of the sweeper's `sys.reserve`.
    place_reserved_p50_s: f64,
    /// `op.place` published to its `placement-bound` outcome seen.
    place_bound_p50_s: f64,
    place_bound_p99_s: f64,
    /// `op.place` published to the `sys.commit-placement` outcome that allocates its resource.
    place_allocated_p50_s: f64,
    place_allocated_p99_s: f64,
    place_allocated_max_s: f64,
    /// The baseline, in the same run: an `op.allocate` naming an agent, published to its outcome seen, p50.
    command_round_trip_p50_s: f64,
    command_round_trip_p99_s: f64,
    /// `place_allocated_p50_s / command_round_trip_p50_s`.
    placed_in_round_trips: f64,
    /// Outcomes on the log about a placement's resource id from the placement commands (place, reserve, bind,
    /// commit, and any cancel, unplaceable or refused copy), per placement.
    commands_per_placement: f64,
    /// The same, by command type.
    commands_by_type: BTreeMap<String, f64>,
    /// Placements that made exactly one resource (on one agent), from every partition folded after the run.
    placements_with_one_resource: usize,
    /// Where the placements went, from the same fold.
    placed_per_agent: BTreeMap<String, usize>,
}

pub(crate) async fn run(args: PlaceArgs) -> anyhow::Result<()> {
    if args.rounds == 0 || args.agents == 0 || args.concurrency == 0 {
        bail!("--rounds, --agents and --concurrency must be at least 1");
    }
    let on = super::EmptyLog {
        name: "place",
        data: args.data.as_deref(),
        nats: args.nats.as_deref(),
        replicas: args.replicas,
        partitions: args.partitions,
    };
    let figures = on.run(&args).await?;
    print_table(&figures);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

impl super::OnLog for PlaceArgs {
    type Figures = PlaceFigures;
    async fn measure<L: Log>(&self, log: &L, backend: &str) -> anyhow::Result<PlaceFigures> {
        measure(log, self, backend).await
    }
}

/// The services of one `serve` process and `args.agents` agents, over `log`, and the rounds timed against them.
pub(crate) async fn measure<L: Log>(log: &L, args: &PlaceArgs, backend: &str) -> anyhow::Result<PlaceFigures> {
    let scratch = tempfile::tempdir().context("a temporary directory for the agents' roots")?;
    let shutdown = CancellationToken::new();
    let mut tasks: tokio::task::JoinSet<anyhow::Result<()>> = tokio::task::JoinSet::new();
    let agents: Vec<AgentName> =
        (0..args.agents).map(|i| AgentName::new(format!("bench-place-{i}")).expect("a valid name")).collect();
    let (seen, feed) = mpsc::unbounded_channel();
    {
        // Every outcome, stamped when this process saw it.
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let mut follow = log.follow(OutcomeFilter::All, 1);
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    next = follow.next() => next.context("the outcome feed ended")??,
                };
                let outcome = codec::decode_outcome(&next.payload)?;
                if seen.send((Instant::now(), outcome)).is_err() {
                    return Ok(());
                }
            }
        });
    }
    {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move {
            let report = leasehold_worker::run(log, leasehold_worker::WorkerConfig::new("bench-place"), shutdown).await;
            anyhow::ensure!(report.stopped.is_empty(), "partitions stopped: {:?}", report.stopped);
            Ok(())
        });
    }
    {
        let mut projector = leasehold_projector::Projector::in_memory(log.partitions())?;
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move { projector.run(&log, &shutdown).await.context("the projector") });
    }
    let sweeper = leasehold_sweeper::SweeperConfig {
        interval: args.sweep_interval,
        plan_gap: args.plan_gap,
        ..leasehold_sweeper::SweeperConfig::new("bench-place")
    };
    let plan_gap = sweeper.plan_gap;
    {
        let (log, shutdown) = (log.clone(), shutdown.clone());
        let metrics = leasehold_sweeper::SweeperMetrics::default();
        tasks
            .spawn(async move { leasehold_sweeper::run(log, sweeper, metrics, shutdown).await.context("the sweeper") });
    }
    // Room for every resource of the run on each agent (the baseline's allocations count too): never full.
    let room = u32::try_from(args.rounds * 2).context("--rounds is too large")?;
    for agent in &agents {
        let config =
            AgentConfig { capacity: BTreeMap::from([(KIND.to_owned(), room)]), ..AgentConfig::new(agent.clone()) };
        let driver = AnyDriver::Dir(DirDriver::new(scratch.path().join(agent.as_str())));
        let (log, shutdown) = (log.clone(), shutdown.clone());
        tasks.spawn(async move { leasehold_agent::run(log, driver, config, shutdown).await.context("an agent") });
    }
    let mut rounds = Rounds {
        log,
        agents,
        feed,
        // The sweeper sends a request again after 5 s: room for a few of those.
        patience: Duration::from_secs(30) + args.sweep_interval * 3,
        protocol: Vec::new(),
    };
    let timed = tokio::select! {
        timed = rounds.run(args) => timed,
        // A service that stops (on an error) ends the run with its error.
        Some(stopped) = tasks.join_next() => Err(match stopped {
            Ok(Err(e)) => e.context("a service stopped during the benchmark"),
            Ok(Ok(())) => anyhow::anyhow!("a service stopped during the benchmark"),
            Err(e) => anyhow::anyhow!("a service panicked: {e}"),
        }),
    };
    shutdown.cancel();
    while let Some(stopped) = tasks.join_next().await {
        stopped.context("a service panicked")??;
    }
    let mut timed = timed?;
    let placed: BTreeSet<ResourceId> = timed.placed.iter().copied().collect();
    let counted = count_commands(log, &rounds.protocol, &placed).await?;
    let (placements_with_one_resource, placed_per_agent) = resources_made(log, &placed).await?;
    let round_trip_p50 = super::quantile_s(&mut timed.round_trips, 0.50);
    let allocated_p50 = super::quantile_s(&mut timed.allocated, 0.50);
    let per_placement = |n: usize| n as f64 / placed.len().max(1) as f64;
    Ok(PlaceFigures {
        backend: backend.to_owned(),
        rounds: args.rounds,
        agents: args.agents,
        concurrency: args.concurrency,
        sweep_interval_s: args.sweep_interval.as_secs_f64(),
        plan_gap_s: plan_gap.as_secs_f64(),
        place_wanted_p50_s: super::quantile_s(&mut timed.wanted, 0.50),
        place_reserved_p50_s: super::quantile_s(&mut timed.reserved, 0.50),
        place_bound_p50_s: super::quantile_s(&mut timed.bound, 0.50),
        place_bound_p99_s: super::quantile_s(&mut timed.bound, 0.99),
        place_allocated_p50_s: allocated_p50,
        place_allocated_p99_s: super::quantile_s(&mut timed.allocated, 0.99),
        place_allocated_max_s: super::quantile_s(&mut timed.allocated, 1.0),
        command_round_trip_p50_s: round_trip_p50,
        command_round_trip_p99_s: super::quantile_s(&mut timed.round_trips, 0.99),
        placed_in_round_trips: allocated_p50 / round_trip_p50.max(1e-9),
        commands_per_placement: per_placement(counted.values().sum()),
        commands_by_type: counted.into_iter().map(|(type_name, n)| (type_name, per_placement(n))).collect(),
        placements_with_one_resource,
        placed_per_agent,
    })
}

/// What the rounds timed.
#[derive(Debug, Default)]
struct Timed {
    /// Each placement's resource id.
    placed: Vec<ResourceId>,
    wanted: Vec<Duration>,
    reserved: Vec<Duration>,
    bound: Vec<Duration>,
    allocated: Vec<Duration>,
    /// The baseline: each allocation naming an agent, publish to outcome.
    round_trips: Vec<Duration>,
}

/// One round in flight.
#[derive(Debug)]
enum Probe {
    /// The baseline: an allocation naming an agent, waiting for the outcome of `command`.
    Allocate { command: CommandId, start: Instant, answered: bool },
    /// A placement, and when each step of it was seen (since `start`, its publish).
    Place { start: Instant, steps: Steps },
}

/// When each outcome of a placement was seen, since its publish.
#[derive(Debug, Default)]
struct Steps {
    wanted: Option<Duration>,
    reserved: Option<Duration>,
    bound: Option<Duration>,
    allocated: Option<Duration>,
}

/// The outcomes of a placement, in the order they come.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Its own outcome.
    Wanted,
    /// The agent's partition held room for it.
    Reserved,
    Bound,
    /// The commit made the resource.
    Allocated,
}

impl Step {
    /// The placement `effect` is a step of, and which step. `committed`: the effect's outcome is a commit's.
    fn of(effect: &Effect, committed: bool) -> Option<(ResourceId, Step)> {
        Some(match effect {
            Effect::PlacementWanted { request, .. } => (request.resource, Step::Wanted),
            Effect::CapacityReserved { resource, .. } => (*resource, Step::Reserved),
            Effect::PlacementBound { resource, .. } => (*resource, Step::Bound),
            Effect::ResourceAllocated { resource, .. } if committed => (*resource, Step::Allocated),
            _ => return None,
        })
    }
}

impl Steps {
    fn mark(&mut self, step: Step) -> &mut Option<Duration> {
        match step {
            Step::Wanted => &mut self.wanted,
            Step::Reserved => &mut self.reserved,
            Step::Bound => &mut self.bound,
            Step::Allocated => &mut self.allocated,
        }
    }
}

/// An outcome of a command that may be about a placement, for counting after the rounds.
#[derive(Debug)]
struct Seen {
    cmd_seq: u64,
    key: Key,
    type_name: String,
}

/// The rounds, driven by commands published straight to the log and outcomes seen on the feed.
struct Rounds<'l, L: Log> {
    log: &'l L,
    agents: Vec<AgentName>,
    feed: mpsc::UnboundedReceiver<(Instant, Outcome)>,
    /// The longest wait for the next outcome that moves a round on.
    patience: Duration,
    /// Outcomes of placement-keyed commands and of agent-keyed `sys` ones (reserve, commit, cancel are among them).
    protocol: Vec<Seen>,
}

impl<L: Log> Rounds<'_, L> {
    /// Waits for every agent's registration, then runs `rounds` placements alternating with as many baseline
    /// allocations, `concurrency` of them in flight at a time.
    async fn run(&mut self, args: &PlaceArgs) -> anyhow::Result<Timed> {
        let mut unregistered: BTreeSet<AgentName> = self.agents.iter().cloned().collect();
        let deadline = tokio::time::Instant::now() + self.patience;
        while !unregistered.is_empty() {
            let (_, outcome) = self.next(deadline, "the agents' registrations").await?;
            if let Key::Agent(agent) = &outcome.command.key
                && outcome.effects().iter().any(|e| matches!(e, Effect::AgentRegistered { .. }))
            {
                unregistered.remove(agent);
            }
        }
        eprintln!(
            "{} placements on {} agents, each beside an allocation naming an agent, {} in flight...",
            args.rounds, args.agents, args.concurrency
        );
        let total = args.rounds * 2;
        let mut started = 0;
        let mut in_flight: HashMap<ResourceId, Probe> = HashMap::new();
        let mut timed = Timed::default();
        let mut deadline = tokio::time::Instant::now() + self.patience;
        while started < total || !in_flight.is_empty() {
            while started < total && in_flight.len() < args.concurrency {
                let resource = ResourceId::generate();
                let probe = if started % 2 == 0 {
                    let agent = self.agents[(started / 2) % self.agents.len()].clone();
                    let start = Instant::now();
                    let command = self.publish(Allocate::new(agent, resource, KIND, 1)).await?;
                    Probe::Allocate { command, start, answered: false }
                } else {
                    let start = Instant::now();
                    self.publish(place(resource)).await?;
                    timed.placed.push(resource);
                    Probe::Place { start, steps: Steps::default() }
                };
                in_flight.insert(resource, probe);
                started += 1;
            }
            let (at, outcome) = self.next(deadline, "the rounds' next outcome").await?;
            let mut moved = false;
            for probe in in_flight.values_mut() {
                if let Probe::Allocate { command, start, answered: answered @ false } = probe
                    && outcome.command.id == *command
                {
                    timed.round_trips.push(at.saturating_duration_since(*start));
                    *answered = true;
                    moved = true;
                }
            }
            // The allocation marks a placement's step only when a commit made it.
            let committed = matches!(outcome.command.key, Key::Agent(_)) && outcome.command.class == CommandClass::Sys;
            for effect in outcome.effects() {
                if let Some((resource, step)) = Step::of(effect, committed)
                    && let Some(Probe::Place { start, steps }) = in_flight.get_mut(&resource)
                    && steps.mark(step).is_none()
                {
                    *steps.mark(step) = Some(at.saturating_duration_since(*start));
                    moved = true;
                }
                match effect {
                    Effect::PlacementFailed { resource, why } if in_flight.contains_key(resource) => {
                        bail!("the placement of {resource} failed: {why}");
                    }
                    Effect::ResourceActivated { resource, .. } => {
                        if let Some(probe) = in_flight.remove(resource) {
                            moved = true;
                            if finish(resource, probe, &mut timed)? {
                                let done = timed.allocated.len();
                                if done % 10 == 0 {
                                    let last = timed.allocated[done - 1].as_secs_f64();
                                    eprintln!("  {done} placements, last {last:.4} s");
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            if moved {
                deadline = tokio::time::Instant::now() + self.patience;
            }
        }
        Ok(timed)
    }

    async fn publish(&self, body: impl Into<Command>) -> anyhow::Result<CommandId> {
        let envelope = Envelope::new(CommandId::generate(), Issuer::new("bench").expect("valid"), super::now(), body);
        let payload = codec::encode_command(&envelope)?;
        let subject = ingress_subject_of(&envelope.body);
        self.log.publish_command(&subject, &envelope.command_id.to_string(), payload.into()).await?;
        Ok(envelope.command_id)
    }

    /// The next outcome on the feed, by `deadline`; keeps aside those that may be about a placement, and refuses
    /// the run when one of its own commands is refused.
    async fn next(&mut self, deadline: tokio::time::Instant, what: &str) -> anyhow::Result<(Instant, Outcome)> {
        let (at, outcome) = tokio::time::timeout_at(deadline, self.feed.recv())
            .await
            .with_context(|| format!("no sign of {what} within {:?}", self.patience))?
            .context("the outcome feed stopped")?;
        if let Some(rejection) = outcome.rejection()
            && outcome.command.issuer.as_str() == "bench"
        {
            bail!("a command of the benchmark was refused ({}): {}", outcome.command.type_name, rejection.message);
        }
        let about_placement = match &outcome.command.key {
            Key::Placement(_) => true,
            Key::Agent(_) => outcome.command.class == CommandClass::Sys,
            Key::Pool(_) => false,
        };
        if about_placement {
            self.protocol.push(Seen {
                cmd_seq: outcome.cmd_seq,
                key: outcome.command.key.clone(),
                type_name: outcome.command.type_name.clone(),
            });
        }
        Ok((at, outcome))
    }
}

/// What a placement asks for: one of the kind, on any agent, spread, no waiting for room.
fn place(resource: ResourceId) -> Place {
    Place {
        resource,
        kind: KIND.to_owned(),
        capacity: 1,
        attributes: BTreeMap::new(),
        parent: None,
        pools: Vec::new(),
        wait: None,
        select: BTreeMap::new(),
        strategy: PlacementStrategy::Spread,
    }
}

/// A round whose resource was made: its figures, or why it has none. True for a placement.
fn finish(resource: &ResourceId, probe: Probe, timed: &mut Timed) -> anyhow::Result<bool> {
    match probe {
        Probe::Allocate { answered: true, .. } => Ok(false),
        Probe::Allocate { answered: false, .. } => {
            bail!("resource {resource} was made before its allocation's outcome")
        }
        Probe::Place {
            steps: Steps { wanted: Some(w), reserved: Some(r), bound: Some(b), allocated: Some(a) },
            ..
        } => {
            timed.wanted.push(w);
            timed.reserved.push(r);
            timed.bound.push(b);
            timed.allocated.push(a);
            Ok(true)
        }
        Probe::Place { steps, .. } => {
            bail!("placed resource {resource} was made before every step was seen: {steps:?}")
        }
    }
}

/// The outcomes about each placed resource id, by command type, summed over the placements. A placement-keyed
/// outcome names its id; an agent-keyed one (a reservation, a commit, a cancel, any of them refused) is matched by
/// its command, read back from the command log.
async fn count_commands<L: Log>(
    log: &L,
    protocol: &[Seen],
    placed: &BTreeSet<ResourceId>,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    for seen in protocol {
        let about = match &seen.key {
            Key::Placement(id) => Some(*id),
            _ => {
                let record = log
                    .command_at(seen.cmd_seq)
                    .await?
                    .with_context(|| format!("the command at {} is no longer on the log", seen.cmd_seq))?;
                let envelope = codec::decode_command(&record.payload)?;
                match &envelope.body {
                    Command::Reserve(c) => Some(c.resource),
                    Command::CommitPlacement(c) => Some(c.allocation.resource),
                    Command::CancelReservation(c) => Some(c.resource),
                    _ => None,
                }
            }
        };
        if about.is_some_and(|id| placed.contains(&id)) {
            *counted.entry(seen.type_name.clone()).or_default() += 1;
        }
    }
    Ok(counted)
}

/// Every partition folded: how many placements made exactly one resource, and on which agents they were made.
async fn resources_made<L: Log>(
    log: &L,
    placed: &BTreeSet<ResourceId>,
) -> anyhow::Result<(usize, BTreeMap<String, usize>)> {
    let config = leasehold_worker::WriterConfig::default();
    let mut made: BTreeMap<ResourceId, Vec<AgentName>> = BTreeMap::new();
    for partition in 0..log.partitions() {
        let folded = leasehold_worker::fold_partition(log, partition, 0, &config).await?;
        for resource in folded.state.resources().filter(|r| placed.contains(&r.id)) {
            made.entry(resource.id).or_default().push(resource.agent.clone());
        }
    }
    let mut per_agent: BTreeMap<String, usize> = BTreeMap::new();
    for agents in made.values() {
        for agent in agents {
            *per_agent.entry(agent.as_str().to_owned()).or_default() += 1;
        }
    }
    Ok((made.values().filter(|agents| agents.len() == 1).count(), per_agent))
}

fn print_table(f: &PlaceFigures) {
    println!(
        "leasehold bench place: {} log, {} placements on {} agents, {} in flight, sweep every {:.1} s (plans at most \
         every {:.0} ms as outcomes arrive)",
        f.backend,
        f.rounds,
        f.agents,
        f.concurrency,
        f.sweep_interval_s,
        f.plan_gap_s * 1000.0
    );
    println!("  op.place published to (p50 of each, and the step before it):");
    let steps = [
        ("its own outcome (placement-wanted)", 0.0, f.place_wanted_p50_s),
        ("sys.reserve's capacity-reserved", f.place_wanted_p50_s, f.place_reserved_p50_s),
        ("placement-bound", f.place_reserved_p50_s, f.place_bound_p50_s),
        ("the commit's resource-allocated", f.place_bound_p50_s, f.place_allocated_p50_s),
    ];
    for (what, before, at) in steps {
        println!("    {what:<36} {at:>8.4} s   (+{:.4} s)", at - before);
    }
    println!("    placement-bound                      p99 {:>8.4} s", f.place_bound_p99_s);
    println!(
        "    the resource allocated               p99 {:>8.4} s   max {:.4} s",
        f.place_allocated_p99_s, f.place_allocated_max_s
    );
    println!(
        "  baseline, the same run: op.allocate naming an agent, published to its outcome, p50 {:.4} s, p99 {:.4} s",
        f.command_round_trip_p50_s, f.command_round_trip_p99_s
    );
    println!("  placed (p50) in {:.1} such round trips", f.placed_in_round_trips);
    let by_type: Vec<String> = f.commands_by_type.iter().map(|(t, n)| format!("{t} {n:.2}")).collect();
    println!("  outcomes per placement: {:.2} ({})", f.commands_per_placement, by_type.join(", "));
    let spread: Vec<String> = f.placed_per_agent.iter().map(|(a, n)| format!("{a} {n}")).collect();
    println!(
        "  placements that made exactly one resource: {} of {}; where: {}",
        f.placements_with_one_resource,
        f.rounds,
        spread.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's code path, a few rounds on an in-memory log: every round times a real placement, each made
    /// exactly one resource, spread over the agents, in a handful of commands.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_few_rounds_of_the_placement_benchmark_run() {
        let log = leasehold_log::embedded::Embedded::in_memory(4, leasehold_log::embedded::system_clock())
            .expect("an in-memory log");
        let args = PlaceArgs::smoke(6);
        let figures = tokio::time::timeout(Duration::from_secs(60), measure(&log, &args, "embedded"))
            .await
            .expect("six rounds within a minute")
            .expect("the rounds ran");
        assert_eq!(figures.rounds, 6);
        assert_eq!(figures.placements_with_one_resource, 6, "{figures:?}");
        assert_eq!(figures.placed_per_agent.values().sum::<usize>(), 6, "{figures:?}");
        assert_eq!(figures.placed_per_agent.len(), 3, "spread uses every agent: {figures:?}");
        assert!(figures.place_bound_p50_s > 0.0, "{figures:?}");
        assert!(figures.place_allocated_p50_s > figures.place_bound_p50_s, "{figures:?}");
        assert!(figures.place_allocated_p99_s >= figures.place_allocated_p50_s, "{figures:?}");
        assert!(figures.command_round_trip_p50_s > 0.0 && figures.placed_in_round_trips > 1.0, "{figures:?}");
        // At least place, reserve, bind and commit, each once.
        assert!(figures.commands_per_placement >= 4.0, "{figures:?}");
        for type_name in ["op.place", "sys.reserve", "sys.bind-placement", "sys.commit-placement"] {
            assert!(figures.commands_by_type.get(type_name).is_some_and(|n| *n >= 1.0), "{type_name}: {figures:?}");
        }
    }
}
