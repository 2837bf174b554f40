//! Credentials and identity: a nats-server whose only users are the ones `leasehold agent credentials` and
//! `leasehold credentials` print (agents a, b and c, c with an nkey; a worker; a producer). Each agent's own work
//! runs (a real `agent run` registers and its syncs are decided by a `serve --roles worker,projector` running as
//! the worker user); everything else it tries is refused, as the server's permission errors show.

use std::path::Path;
use std::time::Duration;

use leasehold_log::nats_server::{NatsServer, PermissionProbe, ProbeAuth, ServerOptions, free_port};
use leasehold_schemas::ids::AgentName;
use leasehold_schemas::subjects::partition_of_agent;
use tokio::time::Instant;

use crate::support::Proc;

const PARTITIONS: u32 = 8;
const AGENTS: [&str; 3] = ["a", "b", "c"];

/// What `leasehold-e2e ARGS` printed (it must succeed).
pub(crate) fn generate(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-e2e")).args(args).output().expect("run");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The user block of a credentials output.
pub(crate) fn block(text: &str) -> String {
    let start = text.find("\n{\n").expect("a block") + 1;
    text[start..].to_owned()
}

pub(crate) fn password(text: &str) -> String {
    let line = text.lines().find(|l| l.trim_start().starts_with("password:")).expect("a password");
    line.split('"').nth(1).expect("quoted").to_owned()
}

fn seed(text: &str) -> String {
    text.lines().find(|l| l.starts_with("SU")).expect("a seed").to_owned()
}

fn partition(agent: &str) -> u32 {
    partition_of_agent(&AgentName::new(agent).expect("a name"), PARTITIONS)
}

/// Waits until `proc`'s log says `what` (a guard of 60 s, never the detector).
async fn wait_for_log(proc: &mut Proc, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !proc.log().contains(what) {
        proc.assert_running();
        assert!(Instant::now() < deadline, "no {what:?} in 60 s\n{}", proc.tail());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Users {
    outputs: Vec<(String, String)>,
}

impl Users {
    fn get(&self, name: &str) -> &str {
        &self.outputs.iter().find(|(n, _)| n == name).expect("a user").1
    }

    fn auth(&self, name: &str) -> ProbeAuth {
        let text = self.get(name);
        if text.contains("nkey:") {
            ProbeAuth::NkeySeed(seed(text))
        } else {
            ProbeAuth::Password { user: name.to_owned(), password: password(text) }
        }
    }

    fn flags(&self, name: &str, dir: &Path) -> Vec<String> {
        match self.auth(name) {
            ProbeAuth::NkeySeed(_) => {
                let file = dir.join(format!("{name}.seed"));
                std::fs::write(&file, self.get(name)).expect("the seed file");
                vec!["--nkey-seed".to_owned(), file.display().to_string()]
            }
            ProbeAuth::Password { user, password } => {
                vec!["--user".to_owned(), user, "--password".to_owned(), password]
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_may_do_its_own_work_and_nothing_else() {
    let partitions = PARTITIONS.to_string();
    let mut outputs = Vec::new();
    for agent in AGENTS {
        let mut args = vec!["agent", "credentials", agent, "--partitions", &partitions];
        if agent == "c" {
            args.push("--nkey");
        }
        outputs.push((agent.to_owned(), generate(&args)));
    }
    outputs.push(("w".to_owned(), generate(&["credentials", "worker", "w", "--partitions", &partitions])));
    outputs.push(("pr".to_owned(), generate(&["credentials", "producer", "pr"])));
    outputs.push(("sw".to_owned(), generate(&["credentials", "sweeper", "sw"])));
    let users = Users { outputs };
    let blocks: Vec<String> = users.outputs.iter().map(|(_, text)| block(text)).collect();
    let monitor = free_port();
    let options = ServerOptions {
        extra: Some(format!(
            "accounts {{\n  LH {{\n    jetstream: enabled\n    users = [\n{}    ]\n  }}\n}}",
            blocks.join("")
        )),
        monitor_port: Some(monitor),
        ..Default::default()
    };
    let Some(server) = NatsServer::start_with(options) else { return };
    let url = server.url().to_owned();
    let dir = tempfile::tempdir().expect("a directory");

    // The worker, as the worker user, on a server with the default fsync and R1 streams: both warnings.
    let mut serve_args: Vec<String> =
        ["serve", "--roles", "worker,projector", "--listen", "127.0.0.1:0", "--data"].map(str::to_owned).to_vec();
    serve_args.extend([dir.path().join("data").display().to_string(), "--partitions".to_owned(), partitions.clone()]);
    serve_args.extend(["--nats".to_owned(), url.clone(), "--inbox-prefix".to_owned(), "_INBOX_w".to_owned()]);
    serve_args.extend(["--nats-monitor".to_owned(), format!("http://127.0.0.1:{monitor}")]);
    serve_args.extend(users.flags("w", dir.path()));
    let mut serve = Proc::spawn(dir.path(), "serve", &serve_args.iter().map(String::as_str).collect::<Vec<_>>());
    serve.address().await;
    let log = serve.log();
    assert!(log.contains("WARNING: the leasehold streams have 1 replica(s)"), "{log}");
    assert!(log.contains("WARNING: the NATS server fsyncs JetStream every 2m"), "{log}");

    // Each agent as its own user: it registers, and its sync is decided.
    let mut agents = Vec::new();
    for agent in AGENTS {
        let driver = format!("dir:{}", dir.path().join(format!("machine-{agent}")).display());
        let mut args: Vec<String> = ["agent", "run", "--name", agent, "--partitions", &partitions, "--driver", &driver]
            .map(str::to_owned)
            .to_vec();
        args.extend(["--nats".to_owned(), url.clone(), "--sync-interval".to_owned(), "1s".to_owned()]);
        args.extend(users.flags(agent, dir.path()));
        agents.push(Proc::spawn(dir.path(), agent, &args.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    for agent in &mut agents {
        wait_for_log(agent, "registered and caught up").await;
        wait_for_log(agent, "sync report decided").await;
    }

    // The sweeper as its user: it folds every partition (snapshots included) and follows the log.
    let mut sweeper_args: Vec<String> =
        ["serve", "--roles", "sweeper", "--listen", "127.0.0.1:0", "--partitions", &partitions, "--nats", &url]
            .map(str::to_owned)
            .to_vec();
    sweeper_args.extend([
        "--inbox-prefix".to_owned(),
        "_INBOX_sw".to_owned(),
        "--sweep-interval".to_owned(),
        "100ms".to_owned(),
    ]);
    sweeper_args.extend(users.flags("sw", dir.path()));
    let mut sweeper = Proc::spawn(dir.path(), "sweeper", &sweeper_args.iter().map(String::as_str).collect::<Vec<_>>());
    sweeper.address().await;
    wait_for_log(&mut sweeper, "sweeper loaded the partitions").await;

    // A producer as its user: an allocation on a is accepted, and agent a makes it.
    let mut alloc: Vec<String> =
        ["allocate", "--agent", "a", "--kind", "dir", "--nats", &url, "--inbox-prefix", "_INBOX_pr"]
            .map(str::to_owned)
            .to_vec();
    alloc.extend(users.flags("pr", dir.path()));
    let reference = generate(&alloc.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(reference.trim().starts_with("a."), "{reference}");
    wait_for_log(&mut agents[0], "created").await;

    // A lease that expires: the sweeper asks for its expiry, on the subject its user may publish on.
    let mut acquire: Vec<String> =
        ["acquire", reference.trim(), "--holder", "t", "--ttl", "1s", "--nats", &url].map(str::to_owned).to_vec();
    acquire.extend(["--inbox-prefix".to_owned(), "_INBOX_pr".to_owned()]);
    acquire.extend(users.flags("pr", dir.path()));
    generate(&acquire.iter().map(String::as_str).collect::<Vec<_>>());
    let metrics = format!("{}/metrics", sweeper.address().await);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = reqwest::get(&metrics).await.expect("GET /metrics").text().await.expect("the metrics");
        if text.lines().any(|l| l.starts_with("leasehold_sweeper_requests_total{type=\"sys.expire-lease\"}")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the sweeper never asked for the expiry\n{}", sweeper.tail());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // What each agent may not do.
    let mut first_request = None;
    for me in AGENTS {
        let mut probe = PermissionProbe::connect(&url, users.auth(me), &format!("_INBOX_{me}")).await.expect("connect");
        for other in AGENTS.into_iter().filter(|o| *o != me) {
            let p = partition(other);
            for subject in [
                format!("lh.in.agent.{other}._"),
                format!("$JS.API.CONSUMER.CREATE.LH_EVT.lh-agent-{me}.lh.evt.{p}.{other}"),
                format!("$JS.API.CONSUMER.CREATE.LH_EVT.lh-agent-{other}.lh.evt.{p}.{other}"),
                format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.lh-agent-{other}"),
                format!("$JS.API.CONSUMER.DELETE.LH_EVT.lh-agent-{other}"),
                format!("$JS.API.DIRECT.GET.LH_EVT.lh.evt.{p}.{other}"),
            ] {
                let refused = probe.publish_refused(&subject).await;
                assert!(refused.is_ok(), "{me} -> {subject}: {refused:?}");
            }
            let refused = probe.subscribe_refused(&format!("_INBOX_{other}.>")).await;
            assert!(refused.is_ok(), "{me} reads {other}'s replies: {refused:?}");
        }
        let mine = partition(me);
        for subject in [
            format!("lh.evt.{mine}.{me}"),
            "lh.dlq.0.agent.x._".to_owned(),
            format!("lh.in.op.{me}._"),
            format!("lh.in.sys.{me}._"),
            "$JS.API.DIRECT.GET.LH_EVT".to_owned(),
            "$JS.API.STREAM.INFO.LH_CMD".to_owned(),
            "$JS.API.STREAM.UPDATE.LH_EVT".to_owned(),
            "$JS.API.STREAM.DELETE.LH_EVT".to_owned(),
            "$JS.API.STREAM.PURGE.LH_EVT".to_owned(),
            "$JS.API.STREAM.DELETE.LH_CMD".to_owned(),
            "$JS.API.CONSUMER.CREATE.LH_CMD.x.lh.cmd.0.>".to_owned(),
        ] {
            let refused = probe.publish_refused(&subject).await;
            assert!(refused.is_ok(), "{me} -> {subject}: {refused:?}");
        }
        if first_request.is_none() {
            let (violation, answered) = probe.request_refused("$JS.API.STREAM.PURGE.LH_EVT").await.expect("refused");
            eprintln!("a refused API request: the server said {violation:?}; async-nats answered {answered}");
            first_request = Some(answered);
        }
    }

    // The producer and the worker may not speak as an agent, and the producer may not append outcomes.
    let mut producer = PermissionProbe::connect(&url, users.auth("pr"), "_INBOX_pr").await.expect("connect");
    for subject in ["lh.in.agent.a._", "lh.in.sys.a._", "lh.evt.0.a", "lh.dlq.0.x", "$JS.API.STREAM.DELETE.LH_EVT"] {
        let refused = producer.publish_refused(subject).await;
        assert!(refused.is_ok(), "producer -> {subject}: {refused:?}");
    }
    let mut worker = PermissionProbe::connect(&url, users.auth("w"), "_INBOX_w").await.expect("connect");
    for subject in ["lh.in.agent.a._", "lh.in.op.a._", "$JS.API.STREAM.PURGE.LH_EVT", "$JS.API.STREAM.UPDATE.LH_CMD"] {
        let refused = worker.publish_refused(subject).await;
        assert!(refused.is_ok(), "worker -> {subject}: {refused:?}");
    }

    // Everything still runs: nothing the agents or the worker needed was refused.
    let server_log = server.log();
    for line in server_log.lines().filter(|l| l.contains("Violation")) {
        let by_process = line.contains("rust:leasehold\"");
        assert!(!by_process, "a leasehold process was refused something it needs: {line}");
    }
    serve.assert_running();
    for agent in &mut agents {
        agent.assert_running();
    }
}
