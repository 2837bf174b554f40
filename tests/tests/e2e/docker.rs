//! The docker driver end to end: a real nats-server, a `serve` with every role, and `agent run --driver docker:` on
//! the real Docker daemon, each scenario with an agent name, a network and a subnet of its own.
//!
//! - Containers allocated in an IPv4 pool (`pool define --ipv4 ... --exclude GATEWAY`) run at the address leasehold
//!   granted them: `docker inspect` shows the address `get` shows the claim bound to.
//! - A container removed behind leasehold's back (`docker rm -f`) turns its resource `lost`; its address goes to the
//!   next container wanting the pool only after the pool's cool-down.
//! - A container with the agent's labels that the log never knew of is destroyed on record: `garbage-destroy-ordered`
//!   first, then `garbage-destroyed`.
//! - A released container's address is not granted again while the container exists: the agent is frozen
//!   (SIGSTOP) before it destroys it, and the pool has nothing to give until it is thawed, destroys it and says so,
//!   and the cool-down passes.
//! - An agent killed (SIGKILL) while it creates, then started again: one running container per resource, and none
//!   left once they are released.
//! - A missing image fails the resource for good, and `get` says why.
//!
//! The busybox image is imported (`docker import` of a static busybox), never pulled. Everything a scenario makes
//! carries its agent's label or its network's name, and is removed when the scenario ends (and, from runs that died,
//! when the next run starts). Without a daemon that answers, each scenario prints a notice and passes, except in CI
//! (`CI=true`), where it fails.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use leasehold_agent::docker::{LABEL_AGENT, LABEL_KIND, LABEL_RESOURCE, find_busybox, import_busybox_image};
use leasehold_log::OutcomeFilter;
use leasehold_projector::ResourceView;
use leasehold_schemas::ResourceId;
use leasehold_schemas::command::TickPool;
use leasehold_schemas::ids::PoolName;
use leasehold_schemas::outcome::{Effect, GarbageCause};
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{Api, POLL, STEP, agent_name, release, wait_agent, wait_pool, wait_resource};
use crate::nats::{FAST_SWEEPER, NatsRun, outcomes, publish};
use crate::support::{Proc, Ran, logs, run_cli};

const PARTITIONS: u32 = 4;
/// The pools' cool-down: a freed address rests this long before it is granted again.
const COOLDOWN: Duration = Duration::from_secs(2);
/// The containers' command: a sleep that ends at once on SIGTERM, so a destroy does not wait out the stop timeout
/// (busybox `sleep` as PID 1 ignores SIGTERM).
const CMD: &str = r#"["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]"#;
/// The prefix of every scenario's agent name and network name: `lhe2e-PID-N`, so a later run knows what a run that
/// died left behind.
const PREFIX: &str = "lhe2e";

#[path = "../../../services/agent/tests/support/docker_cli.rs"]
mod docker_cli;
use docker_cli::{daemon_answers, docker, must};

/// The pid in a name `lhe2e-PID-N`, if it is one of ours.
fn pid_of(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.strip_prefix('-')?.split('-').next()?.parse().ok()
}

/// Removes what earlier runs whose process is gone left behind: containers and volumes by their agent label,
/// networks by name. Once per process.
async fn remove_leftovers() {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        let dead = |name: &str| pid_of(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
        let filter = format!("label={LABEL_AGENT}");
        let format = format!("{{{{.Names}}}}\t{{{{.Label \"{LABEL_AGENT}\"}}}}");
        for line in must(&["ps", "-a", "--filter", &filter, "--format", &format]).await.lines() {
            if let Some((container, agent)) = line.split_once('\t')
                && dead(agent)
            {
                let _ = docker(&["rm", "-f", "-v", container]).await;
            }
        }
        for line in must(&["volume", "ls", "--filter", &filter, "--format", &format]).await.lines() {
            if let Some((volume, agent)) = line.split_once('\t')
                && dead(agent)
            {
                let _ = docker(&["volume", "rm", "-f", volume]).await;
            }
        }
        for network in must(&["network", "ls", "--format", "{{.Name}}"]).await.lines() {
            if network.strip_prefix("lh-test-").is_some_and(dead) {
                let _ = docker(&["network", "rm", network]).await;
            }
        }
    })
    .await;
}

/// One scenario: a nats-server, a `serve`, and what it makes on the daemon, removed on drop.
struct Scenario {
    run: NatsRun,
    serve: Proc,
    api: Api,
    /// `lhe2e-PID-N`: the agent's name.
    agent: String,
    /// `lh-test-lhe2e-PID-N`: the docker network its containers join.
    network: String,
    /// A /29 of its own: `10.213.<pid % 256>.<8 n>`.
    subnet: [u8; 4],
    image: String,
}

impl Scenario {
    /// `None` (with a notice) when nats-server is missing or the daemon does not answer outside CI.
    async fn start(prefix: &str) -> Option<Scenario> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !daemon_answers("a docker scenario").await {
            return None;
        }
        let run = NatsRun::start(prefix, PARTITIONS)?;
        remove_leftovers().await;
        let busybox = find_busybox().unwrap_or_else(|e| panic!("the docker scenarios need a static busybox: {e}"));
        let image = import_busybox_image("", &busybox).await.unwrap_or_else(|e| panic!("import busybox: {e}"));
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let agent = format!("{PREFIX}-{pid}-{n}");
        let network = format!("lh-test-{agent}");
        let subnet = [10, 213, (pid % 256) as u8, (n % 32 * 8) as u8];
        let mut serve = run.serve("serve", &FAST_SWEEPER);
        let api = Api::new(serve.ready().await);
        Some(Scenario { run, serve, api, agent, network, subnet, image })
    }

    /// `agent run --driver docker:` under the scenario's agent name, reporting every 300 ms.
    fn agent(&self, extra: &[&str]) -> Proc {
        let mut args = vec!["agent", "run", "--name", &self.agent, "--driver", "docker:", "--nats", &self.run.url];
        args.extend(["--sync-interval", "300ms"]);
        args.extend(extra);
        Proc::spawn(self.run.path(), &self.agent, &args)
    }

    async fn wait_live(&self, agent: &Proc) {
        wait_agent(&self.api, &self.agent, |a| a.status == "live", &[&self.serve, agent]).await;
    }

    /// The `n`th address of the subnet.
    fn address(&self, n: u8) -> String {
        let [a, b, c, d] = self.subnet;
        format!("{a}.{b}.{c}.{}", d + n)
    }

    /// `leasehold ARGS` against the scenario's gateway.
    async fn cli(&self, args: &[&str]) -> Ran {
        let mut all = vec!["--server", self.api.base.as_str()];
        all.extend(args);
        run_cli(self.run.path(), &all, &[]).await
    }

    /// `pool define net1` over the /`prefix_len` subnet, its first host excluded (the network's gateway).
    async fn define_pool(&self, prefix_len: u8) {
        let cidr = format!("{}/{prefix_len}", self.address(0));
        let gateway = self.address(1);
        let cooldown = format!("{}ms", COOLDOWN.as_millis());
        let ran = self
            .cli(&["pool", "define", "net1", "--ipv4", &cidr, "--exclude", &gateway, "--cooldown", &cooldown])
            .await;
        assert_eq!(ran.code, Some(0), "pool define: {ran:?}");
    }

    /// Makes the scenario's network by hand, over the pool's subnet (/`prefix_len`) with the excluded first host as
    /// its gateway: the scenarios about what happens to an address do not depend on the agent making networks.
    async fn make_network(&self, prefix_len: u8) {
        let (subnet, gateway) = (format!("{}/{prefix_len}", self.address(0)), self.address(1));
        must(&["network", "create", "--subnet", &subnet, "--gateway", &gateway, &self.network]).await;
    }

    /// `leasehold allocate` of a container with `image`, in pool net1 on the scenario's network when `in_pool`.
    async fn allocate(&self, id: ResourceId, image: &str, in_pool: bool) -> String {
        let (id_arg, image_attr, cmd_attr) = (id.to_string(), format!("image={image}"), format!("cmd={CMD}"));
        let network_attr = format!("network={}", self.network);
        let mut args = vec!["allocate", "--agent", &self.agent, "--kind", "container", "--id", &id_arg];
        args.extend(["--attr", &image_attr, "--attr", &cmd_attr]);
        if in_pool {
            args.extend(["--pool", "net1", "--attr", &network_attr]);
        }
        let ran = self.cli(&args).await;
        assert_eq!(ran.code, Some(0), "allocate: {ran:?}");
        format!("{}.{id}", self.agent)
    }

    async fn wait_resource(&self, id: ResourceId, done: impl Fn(&ResourceView) -> bool, agent: &Proc) -> ResourceView {
        wait_resource(&self.api, &format!("{}.{id}", self.agent), done, &[&self.serve, agent]).await
    }

    /// The agent's containers: name and state (`running`, `created`, `exited`).
    async fn containers(&self) -> Vec<(String, String)> {
        let filter = format!("label={LABEL_AGENT}={}", self.agent);
        let listed = must(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}\t{{.State}}"]).await;
        let mut all: Vec<(String, String)> = listed
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, state)| (name.to_owned(), state.to_owned()))
            .collect();
        all.sort();
        all
    }

    /// The address container `lh-<id>` has on the scenario's network, as the daemon says.
    async fn address_on_network(&self, id: ResourceId) -> Option<String> {
        let networks =
            docker(&["inspect", "--format", "{{json .NetworkSettings.Networks}}", &format!("lh-{id}")]).await;
        let networks: Value = serde_json::from_str(networks.ok()?.trim()).ok()?;
        networks[&self.network]["IPAddress"].as_str().filter(|a| !a.is_empty()).map(str::to_owned)
    }

    async fn pool_tick_answer(&self) -> Value {
        let log = self.run.log().await;
        let tick = publish(&log, "e2e-sweeper", TickPool { pool: PoolName::new("net1").expect("a pool name") }).await;
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.api.get(&format!("/v1/commands/{tick}")).await
                && ["accepted", "rejected"].contains(&status["status"].as_str().unwrap_or_default())
            {
                return status;
            }
            assert!(Instant::now() < deadline, "tick {tick} not decided in {STEP:?}\n{}", self.serve.tail());
            tokio::time::sleep(POLL).await;
        }
    }

    /// The log's effects, with the sequence and log time (unix ms) of their outcome.
    /// The log says `c1` ended (`ended`, named `what`), then its address was freed, then granted to `c2` no sooner
    /// than the cool-down after the free.
    async fn handed_on(
        &self,
        c1: ResourceId,
        c2: ResourceId,
        what: &str,
        ended: impl Fn(&Effect) -> bool,
        agent: &Proc,
    ) {
        let effects = self.effects().await;
        let find = |matches: &dyn Fn(&Effect) -> bool| {
            effects.iter().find(|(_, _, e)| matches(e)).map(|(seq, at, _)| (*seq, *at))
        };
        let ended = find(&ended);
        let freed = find(&|e| matches!(e, Effect::ClaimFreed { holder, .. } if holder.resource == c1));
        let granted = find(&|e| matches!(e, Effect::ClaimGranted { holder, .. } if holder.resource == c2));
        let (Some(ended), Some(freed), Some(granted)) = (ended, freed, granted) else {
            panic!(
                "{what}, freed, granted: {ended:?} {freed:?} {granted:?}\n{}",
                logs([&self.serve, agent].into_iter())
            );
        };
        assert!(ended.0 <= freed.0 && freed.0 < granted.0, "{what} {ended:?}, freed {freed:?}, granted {granted:?}");
        assert!(
            granted.1 - freed.1 >= COOLDOWN.as_millis() as u64,
            "granted within the cool-down: {freed:?} {granted:?}"
        );
    }

    async fn effects(&self) -> Vec<(u64, u64, Effect)> {
        let log = self.run.log().await;
        outcomes(&log, &OutcomeFilter::All)
            .await
            .into_iter()
            .flat_map(|(seq, o)| {
                let at = o.decided_at.0;
                o.effects().to_vec().into_iter().map(move |e| (seq, at, e))
            })
            .collect()
    }
}

impl Drop for Scenario {
    /// Removes the agent's containers and volumes and the scenario's network.
    fn drop(&mut self) {
        docker_cli::remove_matching(&format!("label={LABEL_AGENT}={}", self.agent));
        let _ =
            std::process::Command::new("docker").args(["network", "rm", &self.network]).stdin(Stdio::null()).output();
    }
}

/// The address a resource's claim is bound to.
fn bound_address(view: &ResourceView) -> Option<String> {
    view.claims.iter().find(|c| c.status == "bound").and_then(|c| c.id.clone())
}

// ---------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_in_a_pool_run_at_the_addresses_leasehold_granted() {
    let Some(s) = Scenario::start("docker-addresses").await else { return };
    let mut agent = s.agent(&[]);
    s.wait_live(&agent).await;
    s.define_pool(29).await;
    let (c1, c2) = (ResourceId::generate(), ResourceId::generate());
    for id in [c1, c2] {
        s.allocate(id, &s.image, true).await;
    }
    let mut granted = Vec::new();
    for id in [c1, c2] {
        let view = s.wait_resource(id, |r| r.state == "active", &agent).await;
        let address = bound_address(&view).expect("an active container holds its address");
        assert_eq!(s.address_on_network(id).await.as_deref(), Some(address.as_str()), "docker agrees with the log");
        let ran = s.cli(&["get", &format!("{}.{id}", s.agent)]).await;
        assert!(ran.code == Some(0) && ran.stdout.contains(&address), "get shows the claim: {ran:?}");
        granted.push(address);
    }
    assert_ne!(granted[0], granted[1]);
    assert!(!granted.contains(&s.address(1)), "the gateway is never granted: {granted:?}");
    let network = must(&["network", "inspect", "--format", "{{json .IPAM.Config}}", &s.network]).await;
    assert!(network.contains(&format!("{}/29", s.address(0))), "the network is the pool's subnet: {network}");
    assert_eq!(s.containers().await.len(), 2);

    s.serve.assert_no_panic();
    agent.assert_no_panic();
    agent.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_removed_behind_leaseholds_back_is_lost_and_its_address_comes_back_after_the_cool_down() {
    let Some(s) = Scenario::start("docker-lost").await else { return };
    let mut agent = s.agent(&[]);
    s.wait_live(&agent).await;
    // A /30: one address besides the gateway, so the next container can only get the lost one's.
    s.make_network(30).await;
    s.define_pool(30).await;
    let (c1, c2) = (ResourceId::generate(), ResourceId::generate());
    s.allocate(c1, &s.image, true).await;
    let view = s.wait_resource(c1, |r| r.state == "active", &agent).await;
    let address = bound_address(&view).expect("c1 holds its address");
    assert_eq!(address, s.address(2));
    s.allocate(c2, &s.image, true).await;
    s.wait_resource(c2, |r| r.state == "pending" && r.claims.iter().all(|c| c.status == "wanted"), &agent).await;

    must(&["rm", "-f", &format!("lh-{c1}")]).await;
    s.wait_resource(c1, |r| r.state == "lost", &agent).await;
    let view = s.wait_resource(c2, |r| r.state == "active", &agent).await;
    assert_eq!(bound_address(&view).as_deref(), Some(address.as_str()), "c2 got the lost container's address");
    assert_eq!(s.address_on_network(c2).await.as_deref(), Some(address.as_str()));

    let ended = |e: &Effect| matches!(e, Effect::ResourceLost { resource, .. } if *resource == c1);
    s.handed_on(c1, c2, "lost", ended, &agent).await;

    s.serve.assert_no_panic();
    agent.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_the_log_never_knew_is_destroyed_on_record() {
    let Some(s) = Scenario::start("docker-garbage").await else { return };
    let mut agent = s.agent(&["--gc-grace", "0s"]);
    s.wait_live(&agent).await;
    let stray = ResourceId::generate();
    let labels =
        [format!("{LABEL_AGENT}={}", s.agent), format!("{LABEL_RESOURCE}={stray}"), format!("{LABEL_KIND}=container")];
    let name = format!("lh-{stray}");
    let mut args = vec!["run", "-d", "--name", &name];
    for label in &labels {
        args.extend(["--label", label]);
    }
    args.extend([s.image.as_str(), "sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]);
    must(&args).await;

    let deadline = Instant::now() + STEP;
    while docker(&["inspect", "--type", "container", &name]).await.is_ok() {
        assert!(Instant::now() < deadline, "the stray container is still there\n{}", agent.tail());
        tokio::time::sleep(POLL).await;
    }
    // On record: the log ordered it destroyed (the handle was unknown), and the agent said it did.
    let deadline = Instant::now() + STEP;
    loop {
        let effects = s.effects().await;
        let ordered = effects.iter().find(|(_, _, e)| {
            matches!(e, Effect::GarbageDestroyOrdered { handle, cause: GarbageCause::Unknown {} } if *handle == stray)
        });
        let destroyed =
            effects.iter().find(|(_, _, e)| matches!(e, Effect::GarbageDestroyed { handle, .. } if *handle == stray));
        if let (Some(ordered), Some(destroyed)) = (ordered, destroyed) {
            assert!(ordered.0 < destroyed.0, "ordered {ordered:?} before destroyed {destroyed:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not on record: {ordered:?} {destroyed:?}\n{}", agent.tail());
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(s.containers().await, vec![]);

    s.serve.assert_no_panic();
    agent.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_containers_address_is_not_granted_again_while_the_container_exists() {
    let Some(s) = Scenario::start("docker-release").await else { return };
    let mut agent = s.agent(&[]);
    s.wait_live(&agent).await;
    s.make_network(30).await;
    s.define_pool(30).await;
    let (c1, c2) = (ResourceId::generate(), ResourceId::generate());
    s.allocate(c1, &s.image, true).await;
    let view = s.wait_resource(c1, |r| r.state == "active", &agent).await;
    let address = bound_address(&view).expect("c1 holds its address");

    // The agent hangs before it can destroy c1; c1 is released, and c2 wants the pool.
    agent.freeze();
    s.api.accepted(&release(&agent_name(&s.agent), c1), &[&s.serve]).await;
    s.allocate(c2, &s.image, true).await;
    s.wait_resource(c1, |r| r.state == "releasing", &agent).await;
    // c2's claim queued at the pool (the sweeper carries it there): a tick before it would find nobody waiting.
    wait_pool(&s.api, "net1", |pool| pool["waiting"].as_u64() == Some(1), &[&s.serve]).await;
    let answer = s.pool_tick_answer().await;
    let message = answer["rejection"]["message"].as_str().unwrap_or_default();
    assert!(
        answer["status"] == "rejected" && message.contains("no identifier free or cooling"),
        "the pool has nothing to give while c1 exists: {answer:#}"
    );
    let waiting = s.api.resource(&format!("{}.{c2}", s.agent)).await.expect("c2");
    assert_eq!((waiting.state.as_str(), bound_address(&waiting)), ("pending", None), "{waiting:?}");
    assert_eq!(s.address_on_network(c1).await.as_deref(), Some(address.as_str()), "c1 still runs at its address");

    // Thawed: it destroys c1 and says so; only then is the address freed, and a cool-down later granted to c2.
    agent.resume();
    let view = s.wait_resource(c2, |r| r.state == "active", &agent).await;
    assert_eq!(bound_address(&view).as_deref(), Some(address.as_str()));
    assert_eq!(s.address_on_network(c2).await.as_deref(), Some(address.as_str()));
    assert_eq!(s.containers().await, vec![(format!("lh-{c2}"), "running".to_owned())], "c1 is gone");
    let ended = |e: &Effect| matches!(e, Effect::ResourceDestroyed { resource, .. } if *resource == c1);
    s.handed_on(c1, c2, "destroyed", ended, &agent).await;

    s.serve.assert_no_panic();
    agent.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_while_it_creates_leaks_nothing_and_makes_nothing_twice() {
    let Some(s) = Scenario::start("docker-kill").await else { return };
    let mut agent = s.agent(&[]);
    s.wait_live(&agent).await;
    let resources: Vec<ResourceId> = (0..4).map(|_| ResourceId::generate()).collect();
    for id in &resources {
        s.allocate(*id, &s.image, false).await;
    }
    // Killed as soon as the first container exists: some are made and not reported, some not made yet.
    let deadline = Instant::now() + STEP;
    while s.containers().await.is_empty() {
        assert!(Instant::now() < deadline, "no container made\n{}", agent.tail());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    agent.kill9();
    let at_kill = s.containers().await;

    let mut agent = s.agent(&[]);
    for id in &resources {
        s.wait_resource(*id, |r| r.state == "active", &agent).await;
    }
    let mut expected: Vec<(String, String)> =
        resources.iter().map(|id| (format!("lh-{id}"), "running".to_owned())).collect();
    expected.sort();
    assert_eq!(s.containers().await, expected, "one running container per resource (at the kill: {at_kill:?})");

    for id in &resources {
        s.api.accepted(&release(&agent_name(&s.agent), *id), &[&s.serve]).await;
    }
    for id in &resources {
        s.wait_resource(*id, |r| r.state == "destroyed", &agent).await;
    }
    assert_eq!(s.containers().await, vec![], "nothing left");

    s.serve.assert_no_panic();
    agent.stop_cleanly().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_fails_the_resource_and_get_says_why() {
    let Some(s) = Scenario::start("docker-image").await else { return };
    let mut agent = s.agent(&[]);
    s.wait_live(&agent).await;
    let id = ResourceId::generate();
    let missing = format!("leasehold-missing:{}", s.agent);
    let reference = s.allocate(id, &missing, false).await;
    let view = s.wait_resource(id, |r| r.state == "failed", &agent).await;
    let detail = view.detail.map(|d| d.to_string()).unwrap_or_default();
    assert!(detail.contains(&missing) && detail.contains("not on this machine"), "{detail}");
    let ran = s.cli(&["get", &reference]).await;
    assert!(
        ran.code == Some(0) && ran.stdout.contains("failed") && ran.stdout.contains(&missing),
        "get says it failed and why: {ran:?}"
    );
    assert_eq!(s.containers().await, vec![], "nothing made");

    s.serve.assert_no_panic();
    agent.stop_cleanly().await;
}
