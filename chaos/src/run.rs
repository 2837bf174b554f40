//! One run: the cluster, the servers and agents, the producer and the nemesis, then the settle period and the
//! checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_schemas::ids::AgentName;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Options;
use crate::check::{self, Findings, Machine, Violation};
use crate::nemesis::{self, Fault, Planned};
use crate::net::{self, Net};
use crate::procs::{self, Proc, Spec};
use crate::producer::{Produced, Producer, Target};
use crate::watch::{self, Latency};

const NODES: u8 = 3;
/// A command decided later than this after its ack counts against liveness (reported, not a violation).
const LIVENESS_BOUND: Duration = Duration::from_secs(30);
const WORKERS: usize = 3;
/// How long a process may take to come up.
const START: Duration = Duration::from_secs(60);
/// The decisions split into parts after this many bytes of effects (the test-only small part size), so that most
/// decisions with more than one effect are split and a crash can fall between two parts.
pub(crate) const SPLIT_BUDGET: &str = "64";
/// The busybox image the docker agent's containers run (imported, never pulled).
const IMAGE_ATTR: &str = "image";
/// The containers' command: a sleep that ends at once on SIGTERM.
const CONTAINER_CMD: &str = r#"["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]"#;

/// What a run found.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) seed: u64,
    pub(crate) minutes: f64,
    pub(crate) produced: Produced,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) findings: Findings,
    pub(crate) self_test: Option<String>,
    pub(crate) dir: PathBuf,
    pub(crate) latency: Latency,
}

impl Report {
    pub(crate) fn summary(&self) -> String {
        let faults: u64 = self.faults.values().sum();
        let verdict = match (&self.self_test, self.violations.is_empty()) {
            (Some(test), false) => format!("self-test {test}: the checks caught it"),
            (Some(test), true) => format!("self-test {test}: NOT caught"),
            (None, true) => "no violation".to_owned(),
            (None, false) => format!("{} VIOLATION(S), files kept in {}", self.violations.len(), self.dir.display()),
        };
        format!(
            "leasehold-chaos seed {} over {:.1} min: {} commands acknowledged ({} not), {} outcomes, {faults} faults, \
             {} objects on the machines, {} undecided after the settle period, ack to decision p99 {:.2} s (max \
             {:.1} s, {} over {:.0} s): {verdict}",
            self.seed,
            self.minutes,
            self.produced.acked.len(),
            self.produced.unacked,
            self.findings.outcomes,
            self.findings.on_machines,
            self.findings.undecided.len(),
            self.latency.p99_s,
            self.latency.max_s,
            self.latency.over_bound,
            self.latency.bound_s,
        )
    }

    pub(crate) fn json(&self) -> String {
        json!({
            "seed": self.seed,
            "minutes": self.minutes,
            "acked": self.produced.acked.len(),
            "unacked": self.produced.unacked,
            "publish_retries": self.produced.retries,
            "skewed_issuer_clocks": self.produced.skewed,
            "outcomes": self.findings.outcomes,
            "faults": self.faults,
            "violations": self.violations,
            "liveness": {
                "undecided_after_settle": self.findings.undecided,
                "commands_undecided_in_log": self.findings.verify.as_ref().and_then(|v| v.pointer("/report/undecided")),
                "resources_releasing_after_settle": self.findings.releasing,
                "resources_pending_after_settle": self.findings.pending,
                "decision_latency": self.latency,
            },
            "objects_on_machines": self.findings.on_machines,
            "verify": self.findings.verify.as_ref().map(|v| json!({
                "ok": v.get("ok"),
                "outcomes": v.pointer("/report/outcomes"),
                "commands": v.pointer("/report/commands"),
                "redecided": v.pointer("/report/redecided/count"),
                "full_checks": v.pointer("/report/full_checks"),
                "projection": v.pointer("/report/projection"),
            })),
            "refused": self.produced.refused,
            "self_test": self.self_test,
        })
        .to_string()
    }
}

/// The run's processes.
struct Fleet {
    nodes: Vec<Proc>,
    workers: Vec<Proc>,
    projector: Proc,
    agents: Vec<Proc>,
}

pub(crate) async fn run(options: Options) -> anyhow::Result<Report> {
    if !net::is_root() {
        bail!("the harness makes network namespaces and must run as root");
    }
    let nats_server = procs::nats_server_binary()?;
    let exe = std::env::current_exe().context("the harness's own path")?;
    let (dir, keep_dir) = match &options.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            (dir.clone(), true)
        }
        None => {
            let dir = std::env::temp_dir().join(format!("leasehold-chaos-{}-{}", options.seed, std::process::id()));
            std::fs::create_dir_all(&dir)?;
            (dir, false)
        }
    };
    let docker = match options.docker.as_str() {
        "off" => false,
        "on" => true,
        _ => {
            let answers = docker_answers().await;
            if !answers && std::env::var("CI").as_deref() == Ok("true") {
                bail!(
                    "the docker daemon does not answer (docker info failed); under CI=true the docker agent must run"
                );
            }
            answers
        }
    };
    let mut letters = vec!['a', 'b'];
    if docker {
        letters.push('c');
    }
    // From the seed alone: the agents' names carry it, and they say which partition each agent is in.
    let id = format!("{:04x}", (options.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) & 0xffff);
    // Making the network first removes what dead runs left (and stops their agents, so they make nothing more).
    let net = Net::create(&id, NODES, &letters)?;
    let image = if docker {
        remove_docker_objects(None).await;
        Some(import_image().await?)
    } else {
        None
    };
    eprintln!("leasehold-chaos: run {id} in {}", dir.display());

    let urls: Vec<String> = (1..=NODES).map(|i| format!("nats://{}:4222", net.node_addr(i))).collect();
    let nats = urls.join(",");
    let mut fleet = start_fleet(&options, &net, &dir, &exe, &nats_server, &nats, &letters, docker).await?;

    let mut config = JetStreamConfig::new(nats.clone(), options.partitions);
    config.replicas = 3;
    let log = JetStream::connect(config).await.context("the producer's connection")?;
    let mut targets: Vec<Target> = letters
        .iter()
        .filter(|k| **k != 'c')
        .map(|k| Target { agent: agent_name(&id, *k), kind: "dir".to_owned(), attributes: BTreeMap::new() })
        .collect();
    if let Some(image) = &image {
        let mut attributes = BTreeMap::new();
        attributes.insert(IMAGE_ATTR.to_owned(), image.clone());
        attributes.insert("cmd".to_owned(), CONTAINER_CMD.to_owned());
        targets.push(Target { agent: agent_name(&id, 'c'), kind: "container".to_owned(), attributes });
    }
    let stop = CancellationToken::new();
    let (seen, watching) = (watch::Seen::default(), CancellationToken::new());
    let watcher = tokio::spawn(watch::watch(log.clone(), seen.clone(), watching.clone()));
    let producer = Producer::new(log.clone(), options.partitions, targets, options.seed, options.pace);
    let began = std::time::Instant::now();
    let producing = tokio::spawn(producer.run(stop.clone()));

    let total = Duration::from_secs_f64(options.minutes * 60.0);
    let plan = if options.self_test.is_some() {
        Vec::new()
    } else {
        nemesis::schedule(options.seed, total, WORKERS, letters.len(), NODES)
    };
    let faults = nemesis(&plan, total, &mut fleet, &net).await;

    stop.cancel();
    let produced = producing.await.context("the producer")?;
    // Every fault ends: the network heals, everything frozen thaws, everything down starts again.
    net.heal()?;
    for proc in fleet.all() {
        proc.thaw()?;
        if !proc.running() {
            proc.start()?;
        }
    }

    let mut findings = Findings::default();
    let missing = check::settle(&log, &produced.acked, options.settle).await?;
    // The follower catches up with the decisions the log holds (at most 10 s more); what it has not seen then, it
    // never saw.
    seen.caught_up(produced.acked.iter().filter(|a| !missing.contains(&a.id)), Duration::from_secs(10)).await;
    watching.cancel();
    let _ = watcher.await;
    let latency = watch::latency(&produced.acked, &seen, LIVENESS_BOUND, began);
    eprintln!("leasehold-chaos: settled, {} acknowledged commands without an outcome", missing.len());
    // The agents have had every outcome; give them the time of a few syncs to make their machines agree.
    let machines: Vec<Machine> = letters
        .iter()
        .map(|k| match k {
            'c' => Machine::Docker { agent: agent_name(&id, *k).to_string() },
            _ => Machine::Dir { agent: agent_name(&id, *k).to_string(), root: dir.join(format!("machine-{k}")) },
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut probe = Findings::default();
        check::check_machines(&log, &machines, &mut probe).await?;
        // Only leftovers can go away by waiting (a log that does not fold stays so).
        if probe.violations.iter().all(|v| v.kind != "leftover") || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The projector catches up with the whole log (at most 30 s), stops cleanly, then everything else; the cluster
    // stays up for the reading.
    let end = check::read_all(&log).await?.last().map_or(0, |o| o.seq);
    projector_caught_up(&mut fleet.projector, end, Duration::from_secs(30)).await;
    let projection = dir.join("projector");
    fleet.projector.stop(Duration::from_secs(30)).await;
    for proc in fleet.workers.iter_mut().chain(fleet.agents.iter_mut()) {
        proc.stop(Duration::from_secs(30)).await;
    }
    let outcomes = check::read_all(&log).await?;
    check::check_commands(&log, &produced.acked, &mut findings).await?;
    check::check_outcomes(&outcomes, &produced.acked, &mut findings);
    check::check_machines(&log, &machines, &mut findings).await?;
    check::verify(&exe, &nats, &projection, &dir, &mut findings).await?;

    let mut faults = faults;
    let crashes: u64 =
        fleet.workers.iter().map(|w| w.stderr().matches("fault point: crash after part").count() as u64).sum();
    faults.insert("crashed_between_parts", crashes);
    for proc in fleet.nodes.iter_mut() {
        proc.stop(Duration::from_secs(10)).await;
    }
    drop(fleet);
    drop(net);
    if docker {
        remove_docker_objects(Some(&id)).await;
    }
    let violations = findings.violations.clone();
    if violations.is_empty() && !keep_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Report {
        seed: options.seed,
        minutes: options.minutes,
        produced,
        faults,
        violations,
        findings,
        self_test: options.self_test.clone(),
        dir,
        latency,
    })
}

impl Fleet {
    fn all(&mut self) -> impl Iterator<Item = &mut Proc> {
        self.nodes
            .iter_mut()
            .chain(self.workers.iter_mut())
            .chain(std::iter::once(&mut self.projector))
            .chain(self.agents.iter_mut())
    }
}

/// Agent `k` of run `id`: `chaos-<id>-<k>`, so that what a run leaves in Docker names the run.
fn agent_name(id: &str, k: char) -> AgentName {
    AgentName::new(format!("chaos-{id}-{k}")).expect("a valid agent name")
}

/// Removes the containers and volumes of the docker agents of runs whose harness is gone (`only`: of that run).
async fn remove_docker_objects(only: Option<&str>) {
    let label = "{{.Label \"io.leasehold.agent\"}}";
    let (containers, volumes) = (format!("{{{{.Names}}}}\t{label}"), format!("{{{{.Name}}}}\t{label}"));
    for (list, format, remove) in
        [(["ps", "-a"], &containers, ["rm", "-f", "-v"]), (["volume", "ls"], &volumes, ["volume", "rm", "-f"])]
    {
        let Ok(listed) = tokio::process::Command::new("docker")
            .args(list)
            .args(["--filter", "label=io.leasehold.agent", "--format", format.as_str()])
            .output()
            .await
        else {
            return;
        };
        for line in String::from_utf8_lossy(&listed.stdout).lines() {
            let Some((name, agent)) = line.split_once('\t') else { continue };
            let Some(run) = agent.strip_prefix("chaos-").and_then(|rest| rest.split('-').next()) else { continue };
            let ours = match only {
                Some(id) => run == id,
                None => !net::run_alive(run),
            };
            if ours {
                let _ = tokio::process::Command::new("docker")
                    .args(remove)
                    .arg(name.trim_start_matches('/'))
                    .output()
                    .await;
            }
        }
    }
}

fn leasehold(exe: &Path, name: &str, args: Vec<String>, netns: Option<String>) -> Spec {
    Spec {
        name: name.to_owned(),
        program: exe.to_owned(),
        args,
        env: vec![
            ("LEASEHOLD_CHAOS_EXEC".to_owned(), "leasehold".to_owned()),
            ("RUST_LOG".to_owned(), "info".to_owned()),
            ("NO_COLOR".to_owned(), "1".to_owned()),
            ("LEASEHOLD_FAULT_SPLIT_BUDGET".to_owned(), SPLIT_BUDGET.to_owned()),
        ],
        netns,
    }
}

#[allow(clippy::too_many_arguments)]
async fn start_fleet(
    options: &Options,
    net: &Net,
    dir: &Path,
    exe: &Path,
    nats_server: &Path,
    nats: &str,
    letters: &[char],
    docker: bool,
) -> anyhow::Result<Fleet> {
    // The nodes.
    let mut nodes = Vec::new();
    for i in 1..=NODES {
        let node_dir = dir.join(format!("n{i}"));
        std::fs::create_dir_all(&node_dir)?;
        let addr = net.node_addr(i);
        let routes: Vec<String> =
            (1..=NODES).filter(|j| *j != i).map(|j| format!("nats-route://{}:6222", net.node_addr(j))).collect();
        let config = format!(
            "server_name: n{i}\nlisten: \"{addr}:4222\"\nhttp: \"{addr}:8222\"\n\
             jetstream {{\n  store_dir: {:?}\n  sync_interval: always\n}}\n\
             cluster {{\n  name: lhc\n  listen: \"{addr}:6222\"\n  routes: [{}]\n}}\n",
            node_dir.join("store").display().to_string(),
            routes.join(", ")
        );
        let config_path = node_dir.join("server.conf");
        std::fs::write(&config_path, config)?;
        let spec = Spec {
            name: format!("nats-n{i}"),
            program: nats_server.to_owned(),
            args: vec!["-c".to_owned(), config_path.display().to_string()],
            env: Vec::new(),
            netns: Some(net.node_ns(i)),
        };
        let mut node = Proc::new(spec, dir).registered(net.pids_file());
        node.start()?;
        nodes.push(node);
    }
    wait_for_cluster(&format!("nats://{}:4222", net.node_addr(1))).await?;

    let partitions = options.partitions.to_string();
    let common = |data: PathBuf| {
        vec![
            "--nats".to_owned(),
            nats.to_owned(),
            "--replicas".to_owned(),
            "3".to_owned(),
            "--partitions".to_owned(),
            partitions.clone(),
            "--data".to_owned(),
            data.display().to_string(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
        ]
    };
    // The self-test runs its one faulty worker alone: a partition handed to another worker is read again from its
    // last outcome, which decides a skipped command after all (the log is the cursor).
    let count = if options.self_test.is_some() { 1 } else { WORKERS };
    let mut workers = Vec::new();
    for w in 0..count {
        let mut args = vec!["serve".to_owned(), "--roles".to_owned(), "worker".to_owned()];
        args.extend(common(dir.join(format!("worker{w}"))));
        args.extend(["--name".to_owned(), format!("chaos-w{w}")]);
        if let Some(timeout) = options.priority_timeout {
            args.extend(["--priority-timeout".to_owned(), format!("{}ms", timeout.as_millis())]);
        }
        let mut spec = leasehold(exe, &format!("worker{w}"), args, None);
        if w == 0 {
            match options.self_test.as_deref() {
                Some("double") => spec.env.push(("LEASEHOLD_FAULT_DOUBLE_OUTCOME".to_owned(), "20".to_owned())),
                Some("skip") => spec.env.push(("LEASEHOLD_FAULT_SKIP_OUTCOME".to_owned(), "20".to_owned())),
                _ => {}
            }
        }
        let mut worker = Proc::new(spec, dir).registered(net.pids_file());
        worker.start()?;
        // The first one creates the streams; the others find them.
        worker.wait_for("listening on http://", START).await?;
        workers.push(worker);
    }
    let mut args = vec!["serve".to_owned(), "--roles".to_owned(), "projector,gateway,sweeper".to_owned()];
    args.extend(common(dir.join("projector")));
    let mut projector = Proc::new(leasehold(exe, "projector", args, None), dir).registered(net.pids_file());
    projector.start()?;
    projector.wait_for("listening on http://", START).await?;

    let mut agents = Vec::new();
    for k in letters {
        let driver = match k {
            'c' if docker => "docker:".to_owned(),
            _ => format!("dir:{}", dir.join(format!("machine-{k}")).display()),
        };
        let args = vec![
            "agent".to_owned(),
            "run".to_owned(),
            "--name".to_owned(),
            agent_name(net.id(), *k).to_string(),
            "--driver".to_owned(),
            driver,
            "--nats".to_owned(),
            nats.to_owned(),
            "--partitions".to_owned(),
            partitions.clone(),
            "--sync-interval".to_owned(),
            "1s".to_owned(),
        ];
        let mut agent = Proc::new(leasehold(exe, &format!("agent-{k}"), args, Some(net.agent_ns(*k))), dir)
            .registered(net.pids_file());
        agent.start()?;
        agents.push(agent);
    }
    for agent in &mut agents {
        agent.wait_for("registered and caught up", START).await?;
    }
    Ok(Fleet { nodes, workers, projector, agents })
}

/// Waits until the cluster has a JetStream meta leader (streams can be made).
async fn wait_for_cluster(node: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + START;
    loop {
        match leasehold_log::nats_server::meta_leader_ready(node).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => bail!("the cluster had no JetStream meta leader in {START:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs the schedule: each fault starts and ends at its planned moment. The counts of faults made, by kind.
async fn nemesis(plan: &[Planned], total: Duration, fleet: &mut Fleet, net: &Net) -> BTreeMap<&'static str, u64> {
    enum Event {
        Start(Fault),
        End(Fault),
    }
    let mut events: Vec<(Duration, usize, Event)> = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        events.push((p.at, 2 * i + 1, Event::Start(p.fault)));
        events.push((p.at + p.length, 2 * i, Event::End(p.fault)));
    }
    events.sort_by_key(|(at, order, _)| (*at, *order));
    let started = Instant::now();
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (at, _, event) in events {
        tokio::time::sleep_until(started + at).await;
        let result = match event {
            Event::Start(fault) => {
                *counts.entry(fault.kind()).or_default() += 1;
                eprintln!("leasehold-chaos: {:>6.1}s start {fault:?}", at.as_secs_f64());
                begin(fault, fleet, net)
            }
            Event::End(fault) => end(fault, fleet, net),
        };
        if let Err(e) = result {
            eprintln!("leasehold-chaos: {fault_time:.1}s: {e:#}", fault_time = at.as_secs_f64());
        }
    }
    tokio::time::sleep_until(started + total).await;
    counts
}

fn begin(fault: Fault, fleet: &mut Fleet, net: &Net) -> anyhow::Result<()> {
    match fault {
        Fault::KillWorker(w) => fleet.workers[w].kill9(),
        Fault::StopWorker(w) => fleet.workers[w].terminate()?,
        Fault::KillProjector => fleet.projector.kill9(),
        Fault::KillAgent(k) => fleet.agents[k].kill9(),
        Fault::FreezeNode(i) => fleet.nodes[usize::from(i) - 1].freeze()?,
        Fault::FreezeAgent(k) => fleet.agents[k].freeze()?,
        Fault::PartitionNode(i) => net.isolate_node_from_peers(i)?,
        Fault::IsolateNode(i) => net.isolate_node(i)?,
        Fault::PartitionAgent(k) => net.cut_agent(agent_letter(k))?,
        Fault::CrashBetweenParts(w) => {
            let worker = &mut fleet.workers[w];
            worker.kill9();
            worker.start_with(&[("LEASEHOLD_FAULT_CRASH_AFTER_PART".to_owned(), "1".to_owned())])?;
        }
    }
    Ok(())
}

fn end(fault: Fault, fleet: &mut Fleet, net: &Net) -> anyhow::Result<()> {
    match fault {
        Fault::KillWorker(w) => fleet.workers[w].start(),
        Fault::StopWorker(w) => {
            // Stopped cleanly by now, most times; a stop that has not ended is cut short, as an operator's would be.
            let worker = &mut fleet.workers[w];
            if worker.running() {
                worker.kill9();
            }
            worker.start()
        }
        Fault::KillProjector => fleet.projector.start(),
        Fault::KillAgent(k) => fleet.agents[k].start(),
        Fault::FreezeNode(i) => fleet.nodes[usize::from(i) - 1].thaw(),
        Fault::FreezeAgent(k) => fleet.agents[k].thaw(),
        Fault::PartitionNode(i) | Fault::IsolateNode(i) => net.heal_ns(&net.node_ns(i)),
        Fault::PartitionAgent(k) => net.heal_ns(&net.agent_ns(agent_letter(k))),
        Fault::CrashBetweenParts(w) => {
            // Crashed at the fault point, or never reached one: started again as it normally runs.
            let worker = &mut fleet.workers[w];
            worker.kill9();
            worker.start()
        }
    }
}

fn agent_letter(k: usize) -> char {
    (b'a' + k as u8) as char
}

async fn docker_answers() -> bool {
    tokio::process::Command::new("docker")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// The busybox image, imported from the machine's static busybox as the docker tests do (nothing is pulled).
async fn import_image() -> anyhow::Result<String> {
    let busybox = leasehold_agent::docker::find_busybox().map_err(|e| anyhow::anyhow!(e))?;
    leasehold_agent::docker::import_busybox_image("", &busybox)
        .await
        .map_err(|e| anyhow::anyhow!("importing the busybox image: {e}"))
}

/// Waits until the projector says (`leasehold_projection_applied_seq` on its /metrics) it applied outcome `end`, at
/// most `limit`; `verify` then compares the whole log with its tables (a projector that is behind is compared as of
/// what it applied).
async fn projector_caught_up(projector: &mut Proc, end: u64, limit: Duration) {
    let address = projector
        .stdout()
        .lines()
        .rev()
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_owned));
    let Some(address) = address else { return };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let applied = async {
            let text = http.get(format!("{address}/metrics")).send().await.ok()?.text().await.ok()?;
            let line = text.lines().find(|l| l.starts_with("leasehold_projection_applied_seq"))?;
            line.split_whitespace().last()?.parse::<f64>().ok()
        };
        if applied.await.is_some_and(|seq| seq >= end as f64) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("leasehold-chaos: the projector had not applied outcome {end} after {limit:?}");
}
