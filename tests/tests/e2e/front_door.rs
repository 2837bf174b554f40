//! The front door, end to end: real `leasehold` processes (the `leasehold-e2e` binary) driven through the HTTP/JSON
//! API only, with dir-driver agents whose directories the test looks at (and tampers with) on disk.
//!
//! - Embedded, one process (`serve --agent w1=dir:...`, every role): a resource is allocated, its directory appears
//!   and it turns `active`; a lease is acquired (with a token), renewed, refused with a wrong token (the rejection
//!   names the reason), released; the resource is released, its directory goes and it turns `destroyed`; a resource
//!   whose directory is removed by hand turns `lost` at the next sync and its lease `broken`; a directory named by a
//!   resource id the log does not know is removed by the agent, while a plain file and a directory of another name
//!   are left alone. SIGTERM stops the process cleanly; a new process on the same data directory answers the same,
//!   its agent registers a new epoch and keeps working.
//! - NATS, separate processes (two worker processes, one projector+gateway process, two `agent run` processes): a
//!   mixed load (allocate, wait for `active`, acquire, release the lease, release some resources) goes through the
//!   gateway with `?wait=true` while the worker that serves one agent's partition is killed with SIGKILL. A wait that
//!   runs out (504) is retried with the same command (same id: idempotent). Everything settles: each resource ends
//!   `active` with its directory, or `destroyed` without it, and the outcome log holds exactly one outcome for every
//!   command the test sent, and no command with two.
//!
//! Without `nats-server` on `PATH` the NATS test prints a notice and passes, except in CI (`CI=true`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::subjects::partition_of_agent;
use leasehold_schemas::{Envelope, LeaseId, ResourceId, codec};
use serde_json::Value;
use tokio::time::Instant;

use crate::api::{
    Api, POLL, STEP, acquire, agent_name, allocate, release, release_lease, renew, wait_agent, wait_path, wait_resource,
};
use crate::support::{Proc, logs};

/// The agents' sync interval: losses, destructions and garbage are seen within about this long.
const SYNC: &str = "500ms";

// ---------------------------------------------------------------------------------------------------------------
// 1. Embedded, one process.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_embedded_process_serves_the_api_and_its_agent_keeps_the_directories_honest() {
    let started = Instant::now();
    let dir = tempfile::Builder::new().prefix("lh-e2e-front-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let root = dir.path().join("w1");
    let agent_spec = format!("w1=dir:{}", root.display());
    let data_arg = data.display().to_string();
    let args =
        ["serve", "--data", &data_arg, "--listen", "127.0.0.1:0", "--agent", &agent_spec, "--sync-interval", SYNC];
    let mut serve = Proc::spawn(dir.path(), "serve-1", &args);
    let api = Api::new(serve.ready().await);
    let w1 = agent_name("w1");
    let first = wait_agent(&api, "w1", |a| a.status == "live", &[&serve]).await;

    // Allocate: the directory appears, the resource turns active.
    let r1 = ResourceId::generate();
    api.accepted(&allocate(&w1, r1), &[&serve]).await;
    wait_path(&root.join(r1.to_string()), true, &[&serve]).await;
    let view = wait_resource(&api, &format!("w1.{r1}"), |r| r.state == "active", &[&serve]).await;
    assert_eq!(view.agent, "w1");
    assert_eq!(view.kind, "container");

    // A lease: granted with a token, renewed with it, refused with another, released with it.
    let l1 = LeaseId::generate();
    let lease_ref = format!("w1.{l1}");
    api.accepted(&acquire(&w1, r1, l1), &[&serve]).await;
    let lease = api.lease(&lease_ref).await.expect("the lease is known");
    assert_eq!(lease.state, "active", "{lease:?}");
    let token = lease.token.unwrap_or_else(|| panic!("an active lease has a token: {lease:?}"));
    let held = api.resource(&format!("w1.{r1}")).await.expect("the resource");
    assert!(
        held.leases.iter().any(|l| l.id == lease_ref && l.state == "active"),
        "the resource lists its lease: {held:?}"
    );
    api.accepted(&renew(&w1, l1, token), &[&serve]).await;
    let wrong = api.decide(&renew(&w1, l1, token + 1000), &[&serve]).await;
    assert_eq!(wrong["status"], "rejected", "a renewal with a wrong token: {wrong:#}");
    assert_eq!(wrong["rejection"]["kind"], "token-mismatch", "{wrong:#}");
    let message = wrong["rejection"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&l1.to_string()), "the rejection names the lease: {message}");
    assert!(message.contains(&(token + 1000).to_string()), "the rejection names the wrong token: {message}");
    let lease = api.lease(&lease_ref).await.expect("the lease");
    assert_eq!((lease.state.as_str(), lease.token), ("active", Some(token)), "a refused renewal changes nothing");
    api.accepted(&release_lease(&w1, l1, Some(token)), &[&serve]).await;
    let lease = api.lease(&lease_ref).await.expect("the lease");
    assert_eq!(lease.state, "released", "{lease:?}");

    // Release: the agent removes the directory; the next sync makes it destroyed.
    api.accepted(&release(&w1, r1), &[&serve]).await;
    let releasing = api.resource(&format!("w1.{r1}")).await.expect("the resource");
    assert!(["releasing", "destroyed"].contains(&releasing.state.as_str()), "{releasing:?}");
    wait_path(&root.join(r1.to_string()), false, &[&serve]).await;
    wait_resource(&api, &format!("w1.{r1}"), |r| r.state == "destroyed", &[&serve]).await;

    // A directory removed by hand: lost at the next sync, and its lease broken.
    let r2 = ResourceId::generate();
    let l2 = LeaseId::generate();
    api.accepted(&allocate(&w1, r2), &[&serve]).await;
    wait_path(&root.join(r2.to_string()), true, &[&serve]).await;
    wait_resource(&api, &format!("w1.{r2}"), |r| r.state == "active", &[&serve]).await;
    api.accepted(&acquire(&w1, r2, l2), &[&serve]).await;
    std::fs::remove_dir(root.join(r2.to_string())).expect("remove the directory by hand");
    wait_resource(&api, &format!("w1.{r2}"), |r| r.state == "lost", &[&serve]).await;
    let broken = api.lease(&format!("w1.{l2}")).await.expect("the lease");
    assert_eq!(broken.state, "broken", "the lease of a lost resource: {broken:?}");
    assert!(!root.join(r2.to_string()).exists(), "a lost resource is not made again");

    // Garbage: a directory named by an id the log does not know goes; other things in the root stay.
    let garbage = ResourceId::generate();
    std::fs::create_dir(root.join(garbage.to_string())).expect("make a garbage directory");
    std::fs::write(root.join("notes.txt"), "not a resource").expect("write a plain file");
    std::fs::create_dir(root.join("scratch")).expect("make a directory of another name");
    wait_path(&root.join(garbage.to_string()), false, &[&serve]).await;
    assert!(root.join("notes.txt").is_file(), "a plain file in the root is left alone");
    assert!(root.join("scratch").is_dir(), "a directory whose name is no resource id is left alone");
    assert!(api.get(&format!("/v1/resources/w1.{garbage}")).await.is_none(), "garbage is never a resource");

    // One resource stays active across the restart.
    let r3 = ResourceId::generate();
    api.accepted(&allocate(&w1, r3), &[&serve]).await;
    wait_path(&root.join(r3.to_string()), true, &[&serve]).await;
    wait_resource(&api, &format!("w1.{r3}"), |r| r.state == "active", &[&serve]).await;

    let paths = [
        format!("/v1/resources/w1.{r1}"),
        format!("/v1/resources/w1.{r2}"),
        format!("/v1/resources/w1.{r3}"),
        format!("/v1/leases/w1.{l1}"),
        format!("/v1/leases/w1.{l2}"),
    ];
    let mut before = BTreeMap::new();
    for path in &paths {
        before.insert(path.clone(), api.get(path).await.unwrap_or_else(|| panic!("{path} answers")));
    }

    // SIGTERM: a clean stop.
    serve.stop_cleanly().await;
    serve.assert_no_panic();

    // Restart on the same data directory: the same answers, and the agent registers again.
    let mut serve = Proc::spawn(dir.path(), "serve-2", &args);
    let api = Api::new(serve.ready().await);
    for (path, was) in &before {
        let now = api.get(path).await.unwrap_or_else(|| panic!("{path} answers after the restart"));
        assert_eq!(&now, was, "{path} answers differently after the restart");
    }
    let again = wait_agent(&api, "w1", |a| a.status == "live" && a.epoch > first.epoch, &[&serve]).await;
    assert_ne!(again.incarnation, first.incarnation, "a new process is a new incarnation");
    eprintln!("embedded: w1 registered epoch {} then, after the restart, epoch {}", first.epoch, again.epoch);

    // The agent of the new process works: what it holds stays, what is released goes.
    let active = api.resource(&format!("w1.{r3}")).await.expect("the resource");
    assert_eq!(active.state, "active", "{active:?}");
    assert!(root.join(r3.to_string()).is_dir(), "the active resource's directory is kept");
    api.accepted(&release(&w1, r3), &[&serve]).await;
    wait_path(&root.join(r3.to_string()), false, &[&serve]).await;
    wait_resource(&api, &format!("w1.{r3}"), |r| r.state == "destroyed", &[&serve]).await;
    assert!(root.join("notes.txt").is_file() && root.join("scratch").is_dir(), "still left alone");
    for gone in [r1, r2] {
        assert!(!root.join(gone.to_string()).exists(), "{gone} is not made again after the restart");
    }

    serve.stop_cleanly().await;
    serve.assert_no_panic();
    eprintln!("embedded: done in {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------------------------
// 2. NATS, separate processes.

const PARTITIONS: u32 = 8;
/// `--priority-timeout` and `--ack-wait` of the workers: a killed worker's partitions free up in seconds.
const HOLD: &str = "2s";
/// Resources of the mixed load, and how many flows run at once.
const RESOURCES: usize = 40;
const CONCURRENCY: usize = 8;
/// The worker is killed once this many allocations are accepted.
const KILL_AFTER: usize = 12;
/// The longest the whole NATS run (load, kill, takeover, settling) may take.
const RUN_LIMIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_processes_over_nats_settle_after_a_worker_is_killed() {
    let Some(server) = NatsServer::start() else { return };
    let url = server.url().to_owned();
    let dir = tempfile::Builder::new().prefix("lh-e2e-front-nats-").tempdir().expect("a temporary directory");
    let partitions = PARTITIONS.to_string();

    // The workers first: the first process to connect creates the streams and the live-workers bucket (whose
    // time-to-live is its creator's --priority-timeout).
    let worker = |name: &str| {
        let data = dir.path().join(name).display().to_string();
        let args = [
            "serve",
            "--roles",
            "worker",
            "--nats",
            &url,
            "--partitions",
            &partitions,
            "--listen",
            "127.0.0.1:0",
            "--priority-timeout",
            HOLD,
            "--ack-wait",
            HOLD,
            "--name",
            name,
            "--data",
            &data,
        ];
        Proc::spawn(dir.path(), name, &args)
    };
    let mut workers = BTreeMap::new();
    let mut metrics = BTreeMap::new();
    for name in ["w1", "w2"] {
        let mut process = worker(name);
        metrics.insert(name.to_owned(), Api::new(process.address().await));
        workers.insert(name.to_owned(), process);
    }
    let gw_data = dir.path().join("gw").display().to_string();
    let gw_args = [
        "serve",
        "--roles",
        "projector,gateway",
        "--nats",
        &url,
        "--partitions",
        &partitions,
        "--listen",
        "127.0.0.1:0",
        "--data",
        &gw_data,
    ];
    let mut gateway = Proc::spawn(dir.path(), "gw", &gw_args);
    let api = Api::new(gateway.ready().await);
    let mut agents = BTreeMap::new();
    for name in ["a1", "a2"] {
        let driver = format!("dir:{}", dir.path().join(name).display());
        let args = ["agent", "run", "--name", name, "--driver", &driver, "--nats", &url, "--sync-interval", SYNC];
        agents.insert(name.to_owned(), Proc::spawn(dir.path(), name, &args));
    }
    for name in ["a1", "a2"] {
        let everyone: Vec<&Proc> = workers.values().chain(agents.values()).chain([&gateway]).collect();
        wait_agent(&api, name, |a| a.status == "live", &everyone).await;
    }

    // The victim: the worker whose share holds a1's partition (rendezvous hashing over the live workers).
    let live = vec!["w1".to_owned(), "w2".to_owned()];
    let placement: Vec<String> = ["a1", "a2"]
        .iter()
        .map(|a| {
            let p = partition_of_agent(&agent_name(a), PARTITIONS);
            format!("{a} in partition {p} (served by {})", leasehold_worker::preferred_worker(p, &live).unwrap_or("?"))
        })
        .collect();
    let victim = leasehold_worker::preferred_worker(partition_of_agent(&agent_name("a1"), PARTITIONS), &live)
        .expect("a live worker")
        .to_owned();
    // The victim serves that partition now: its writer there has decided a command (a registration, a heartbeat, a
    // report), so its lag gauge for the partition exists. Shares only move to the preferred worker while both live.
    let victim_partition = partition_of_agent(&agent_name("a1"), PARTITIONS);
    let gauge = format!("leasehold_partition_lag_seconds{{partition=\"{victim_partition}\"}}");
    let deadline = Instant::now() + STEP;
    loop {
        let scraped = metrics[&victim].text("/metrics").await.unwrap_or_default();
        if scraped.lines().any(|l| l.starts_with(&gauge)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nats: {victim} does not serve partition {victim_partition} after {STEP:?}; its metrics:\n{scraped}\n{}",
            logs(workers.values())
        );
        tokio::time::sleep(POLL).await;
    }
    eprintln!("nats: {}; killing {victim} after {KILL_AFTER} allocations", placement.join(", "));

    // The load, in the background.
    let run_started = Instant::now();
    let load = Arc::new(Load::default());
    let flows = {
        let (api, load) = (api.clone(), load.clone());
        tokio::spawn(async move {
            futures::stream::iter(0..RESOURCES)
                .map(|i| flow(api.clone(), load.clone(), i))
                .buffer_unordered(CONCURRENCY)
                .collect::<Vec<Flow>>()
                .await
        })
    };
    let mut killed_at = None;
    while !flows.is_finished() {
        assert!(
            run_started.elapsed() < RUN_LIMIT,
            "nats: the load did not finish in {RUN_LIMIT:?}; {} allocations accepted\n{}",
            load.allocated.load(Ordering::SeqCst),
            logs(workers.values().chain(agents.values()).chain([&gateway]))
        );
        if killed_at.is_none() && load.allocated.load(Ordering::SeqCst) >= KILL_AFTER {
            workers.get_mut(&victim).expect("the victim").kill9();
            killed_at = Some(run_started.elapsed());
            eprintln!("nats: killed {victim} (kill -9) at {:.1} s", run_started.elapsed().as_secs_f64());
        }
        for process in workers.values_mut().chain(agents.values_mut()).chain([&mut gateway]) {
            if process.exited().is_none() {
                process.assert_running();
            }
        }
        tokio::time::sleep(POLL).await;
    }
    let flows = match flows.await {
        Ok(flows) => flows,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    };
    assert!(killed_at.is_some(), "nats: the load finished before {KILL_AFTER} allocations: the kill was not mid-run");
    let loaded = run_started.elapsed();

    // Everything settles: what was kept is active with its directory, what was released is destroyed without it.
    let everyone: Vec<&Proc> = workers.values().chain(agents.values()).chain([&gateway]).collect();
    for flow in &flows {
        let reference = format!("{}.{}", flow.agent, flow.resource);
        let path = dir.path().join(&flow.agent).join(flow.resource.to_string());
        let state = if flow.released { "destroyed" } else { "active" };
        wait_resource(&api, &reference, |r| r.state == state, &everyone).await;
        wait_path(&path, !flow.released, &everyone).await;
    }
    let settled = run_started.elapsed();
    assert!(settled < RUN_LIMIT, "nats: the run took {settled:?}, more than {RUN_LIMIT:?}");

    // The log: exactly one outcome for every command sent, and no command with two.
    let config = JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(&url, PARTITIONS)
    };
    let log = JetStream::connect(config).await.expect("connect to the log");
    let mut first_parts: HashMap<String, Vec<u64>> = HashMap::new();
    let mut rejected: HashMap<String, String> = HashMap::new();
    let mut from = 1;
    loop {
        let batch = log.read_outcomes(&OutcomeFilter::All, from, 1000).await.expect("read the outcomes");
        let Some(last) = batch.last() else { break };
        from = last.seq + 1;
        for stored in batch {
            if stored.part != 0 {
                continue;
            }
            let outcome = codec::decode_outcome(&stored.payload)
                .unwrap_or_else(|e| panic!("the outcome at {} does not decode: {e}", stored.seq));
            if let Some(rejection) = outcome.rejection() {
                rejected.insert(stored.cmd_id.clone(), rejection.to_string());
            }
            first_parts.entry(stored.cmd_id).or_default().push(stored.seq);
        }
    }
    let sent = load.sent.lock().expect("the list of commands").clone();
    let doubled: Vec<_> = first_parts.iter().filter(|(_, seqs)| seqs.len() > 1).collect();
    assert!(doubled.is_empty(), "nats: commands with more than one outcome (id, outcome sequences): {doubled:?}");
    let missing: Vec<&String> = sent.iter().filter(|id| !first_parts.contains_key(*id)).collect();
    assert!(missing.is_empty(), "nats: {} commands sent have no outcome: {missing:?}", missing.len());
    let refused: Vec<(&String, &String)> = sent.iter().filter_map(|id| rejected.get(id).map(|r| (id, r))).collect();
    assert!(refused.is_empty(), "nats: commands of the load were rejected: {refused:?}");

    let retries = load.retries.load(Ordering::SeqCst);
    eprintln!(
        "nats: {} commands over {RESOURCES} resources, {retries} retried after a timeout or an error; {victim} \
         killed at {:.1} s, load done at {:.1} s, settled at {:.1} s; {} outcomes in the log",
        sent.len(),
        killed_at.unwrap_or_default().as_secs_f64(),
        loaded.as_secs_f64(),
        settled.as_secs_f64(),
        from - 1,
    );

    // The rest stop cleanly.
    let mut rest: Vec<&mut Proc> =
        workers.values_mut().filter(|w| w.exited().is_none()).chain(agents.values_mut()).collect();
    rest.push(&mut gateway);
    for process in &mut rest {
        process.signal_term();
    }
    for process in rest {
        process.wait_clean_exit().await;
        process.assert_no_panic();
    }
}

/// Two agents given one root would each destroy the other's directories as unknown: the second refuses to start
/// (the root is locked and names its agent), nothing of the first is touched, and `/healthz` (and `/readyz`) say the
/// process is failing, with why, while the other roles go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_root_are_refused_and_health_says_so() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-root-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data").display().to_string();
    let root = dir.path().join("shared");
    let (a1, a2) = (format!("a1=dir:{}", root.display()), format!("a2=dir:{}/", root.display()));
    let args =
        ["serve", "--data", &data, "--listen", "127.0.0.1:0", "--agent", &a1, "--agent", &a2, "--sync-interval", SYNC];
    let mut serve = Proc::spawn(dir.path(), "serve-shared", &args);
    // Never ready: one of its agents stopped.
    let api = Api::new(serve.address().await);
    let deadline = Instant::now() + STEP;
    let health = loop {
        let response = api.http.get(format!("{}/healthz", api.base)).send().await.expect("GET /healthz");
        if response.status().as_u16() == 503 {
            break response.json::<Value>().await.expect("JSON");
        }
        serve.assert_running();
        assert!(Instant::now() < deadline, "/healthz never said failing\n{}", serve.tail());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(health["status"], "failing", "{health}");
    let failures = health["failures"].to_string();
    assert!(failures.contains("in use by another agent process"), "{failures}");
    let ready = api.http.get(format!("{}/readyz", api.base)).send().await.expect("GET /readyz");
    assert_eq!(ready.status().as_u16(), 503, "a process with a role stopped is not ready");
    let ready: Value = ready.json().await.expect("JSON");
    assert_eq!(ready["status"], "failing", "{ready}");
    // The one that got the root works: its allocation is made.
    let owner = std::fs::read_to_string(root.join(leasehold_agent::OWNER_FILE)).expect("the owner file");
    let owner = agent_name(owner.trim());
    let live = wait_agent(&api, owner.as_str(), |a| a.status == "live", &[&serve]).await;
    assert_eq!(live.name, owner.as_str());
    let resource = ResourceId::generate();
    api.accepted(&allocate(&owner, resource), &[&serve]).await;
    wait_resource(&api, &format!("{owner}.{resource}"), |r| r.state == "active", &[&serve]).await;
    assert!(root.join(resource.to_string()).is_dir());
    serve.signal_term();
}

/// What the flows share: every command id sent, accepted allocations, and retried posts.
#[derive(Debug, Default)]
struct Load {
    sent: Mutex<Vec<String>>,
    allocated: AtomicUsize,
    retries: AtomicUsize,
}

/// What one flow did to its resource.
#[derive(Debug)]
struct Flow {
    agent: String,
    resource: ResourceId,
    released: bool,
}

/// One resource's life: allocate, wait until active, acquire a lease, release it with its token, and for every
/// fourth resource release the resource.
async fn flow(api: Api, load: Arc<Load>, i: usize) -> Flow {
    let agent = agent_name(if i.is_multiple_of(2) { "a1" } else { "a2" });
    let resource = ResourceId::generate();
    let reference = format!("{agent}.{resource}");
    load.post(&api, &allocate(&agent, resource)).await;
    load.allocated.fetch_add(1, Ordering::SeqCst);
    wait_resource(&api, &reference, |r| r.state == "active", &[]).await;
    let lease = LeaseId::generate();
    load.post(&api, &acquire(&agent, resource, lease)).await;
    let view = api.lease(&format!("{agent}.{lease}")).await.expect("the lease");
    let token = view.token.unwrap_or_else(|| panic!("an acquired lease on an active resource has a token: {view:?}"));
    load.post(&api, &release_lease(&agent, lease, Some(token))).await;
    let released = i.is_multiple_of(4);
    if released {
        load.post(&api, &release(&agent, resource)).await;
    }
    Flow { agent: agent.to_string(), resource, released }
}

impl Load {
    /// Posts a command until it is decided (a 504 or an unavailable gateway is retried with the same command),
    /// and checks it was accepted.
    async fn post(&self, api: &Api, envelope: &Envelope) {
        self.sent.lock().expect("the list of commands").push(envelope.command_id.to_string());
        let deadline = Instant::now() + RUN_LIMIT;
        let mut posted_before = false;
        loop {
            match api.post(envelope, "2s").await {
                Ok((200, answer)) => {
                    assert_eq!(answer["status"], "accepted", "{} was not accepted: {answer:#}", envelope.type_name());
                    if posted_before {
                        // Stored once: the log knew the id from the first post.
                        assert_eq!(answer["duplicate"], true, "a command posted again is a duplicate: {answer:#}");
                    }
                    return;
                }
                Ok((code, answer)) if code >= 500 => {
                    eprintln!("nats: {} answered {code} ({}); posting it again", envelope.command_id, answer["status"]);
                    // A 504 means it was published; a 503 may mean it was not.
                    posted_before |= code == 504;
                }
                Ok((code, answer)) => panic!("{} answered {code}: {answer:#}", envelope.type_name()),
                Err(e) => eprintln!("nats: posting {} failed ({e}); posting it again", envelope.command_id),
            }
            self.retries.fetch_add(1, Ordering::SeqCst);
            assert!(Instant::now() < deadline, "{} was not decided in {RUN_LIMIT:?}", envelope.command_id);
            tokio::time::sleep(POLL).await;
        }
    }
}
