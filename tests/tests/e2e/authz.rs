//! Credentials and identity: a nats-server whose only users are the ones `leasehold agent credentials` and
//! `leasehold credentials` print (agents a, b and c, c with an nkey; a worker; a producer, and one bound to a
//! principal; a sweeper). Each user's own work runs: real `agent run`s register and their syncs are decided by a
//! `serve --roles worker,projector` running as the worker user, a sweeper asks for an expiry, a producer allocates.
//! Then a table of what each user may and may not do is tried against the server, over one connection per user:
//! for every pair of agents (A, B), A sending B's commands, reading B's outcome subject and using B's consumer by
//! its real name is refused; for each service role, what lies outside its grants is refused and what lies inside is
//! allowed. A reader's wildcard grants on `LH_EVT` consumers would allow an agent's consumer by name: what the
//! table shows for readers is that they cannot learn the name (no listing, no advisories, no name in stream info).

use std::path::Path;
use std::time::Duration;

use leasehold_log::jetstream::agent_consumer;
use leasehold_log::nats_server::{NatsServer, PermissionProbe, ProbeAuth, ServerOptions, Try, Verdict, free_port};
use leasehold_schemas::ids::AgentName;
use leasehold_schemas::subjects::{partition_of_agent, settings_key};
use tokio::time::Instant;

use crate::support::Proc;

const PARTITIONS: u32 = 8;
const AGENTS: [&str; 3] = ["a", "b", "c"];
/// The principal the bound producer `prb` publishes as.
const PRINCIPAL: &str = "ci:team-a";
/// A consumer name nobody uses: a reader's wildcard grants allow it, and trying it changes nothing.
const NOBODY: &str = "lh-permission-probe";

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

    /// What `name` connects with: its password or its nkey seed.
    fn secret(&self, name: &str) -> String {
        match self.auth(name) {
            ProbeAuth::Password { password, .. } => password,
            ProbeAuth::NkeySeed(seed) => seed,
        }
    }

    /// Agent `agent`'s consumer, as derived from its secret; its credentials name the same.
    fn consumer(&self, agent: &str) -> String {
        let name = agent_consumer(agent, Some(&self.secret(agent)));
        let granted = format!("\"$JS.API.CONSUMER.MSG.NEXT.LH_EVT.{name}\"");
        assert!(self.get(agent).contains(&granted), "{agent}'s credentials do not name {name}:\n{}", self.get(agent));
        name
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
    outputs.push(("prb".to_owned(), generate(&["credentials", "producer", "prb", "--principal", PRINCIPAL])));
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

    // The table: every pair of agents, and every role outside and inside its grants, over one connection per user.
    let mut expected: Vec<Expect> = AGENTS.iter().map(|me| agent_expects(&users, me)).collect();
    expected.extend(service_expects());
    let mut failures = Vec::new();
    for expect in &expected {
        failures.extend(expect.failures(&url, &users).await);
    }
    assert!(failures.is_empty(), "{} checks went otherwise:\n{}", failures.len(), failures.join("\n"));

    // The names are the real ones: each agent's consumer answers under the name derived from its secret, and a
    // reader's stream info, which counts the consumers, names none of them.
    for me in AGENTS {
        let info = own_consumer_info(&url, &users, me).await;
        let filter = format!("lh.evt.{}.{me}", partition(me));
        assert_eq!(info["config"]["filter_subject"], filter, "{me}'s consumer: {info}");
    }
    let names: Vec<String> = AGENTS.iter().map(|agent| users.consumer(agent)).collect();
    for reader in ["pr", "prb", "sw", "w"] {
        let probe = PermissionProbe::connect(&url, users.auth(reader), &inbox(reader)).await.expect("connect");
        let answer = probe.client().request("$JS.API.STREAM.INFO.LH_EVT", "".into()).await.expect("stream info");
        let text = String::from_utf8_lossy(&answer.payload).into_owned();
        let info: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert!(info["state"]["consumer_count"].as_u64().is_some_and(|n| n >= 3), "{reader}: {text}");
        for name in names.iter().map(String::as_str).chain(["lh-agent-"]) {
            assert!(!text.contains(name), "{reader} learns consumer name {name} from stream info: {text}");
        }
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

/// The inbox prefix of user `name` (what `leasehold credentials` lets it subscribe to).
fn inbox(name: &str) -> String {
    format!("_INBOX_{name}")
}

fn publish(subject: impl Into<String>) -> Try {
    Try::Publish(subject.into())
}

fn subscribe(subject: impl Into<String>) -> Try {
    Try::Subscribe(subject.into())
}

/// What one user must be refused and what it must be allowed.
struct Expect {
    user: String,
    refused: Vec<Try>,
    allowed: Vec<Try>,
}

impl Expect {
    /// Tries everything over one connection of the user: one line for each try the server treated otherwise.
    async fn failures(&self, url: &str, users: &Users) -> Vec<String> {
        let user = &self.user;
        let mut probe = PermissionProbe::connect(url, users.auth(user), &inbox(user)).await.expect("connect");
        let tries: Vec<Try> = self.refused.iter().chain(&self.allowed).cloned().collect();
        let verdicts = probe.verdicts(&tries).await.unwrap_or_else(|e| panic!("{user}: {e}"));
        let mut out = Vec::new();
        for (n, (attempt, verdict)) in tries.iter().zip(verdicts).enumerate() {
            match (n < self.refused.len(), verdict) {
                (true, Verdict::Allowed) => out.push(format!("{user} may {attempt}: the server allowed it")),
                (false, Verdict::Refused(why)) => out.push(format!("{user} may not {attempt}: the server said {why}")),
                _ => {}
            }
        }
        out
    }
}

/// Agent `me`: what it may not do to each other agent, what else it may not do, and its own work.
fn agent_expects(users: &Users, me: &str) -> Expect {
    let (p, mine) = (partition(me), users.consumer(me));
    let mut refused = Vec::new();
    for other in AGENTS.into_iter().filter(|o| *o != me) {
        let (outcomes, theirs) = (format!("lh.evt.{}.{other}", partition(other)), users.consumer(other));
        refused.extend([
            // Its commands: the subject is its identity.
            publish(format!("lh.in.agent.{other}.probe-id")),
            // Its outcome subject, by subscription, direct get, and consumers of either name filtered on it.
            subscribe(outcomes.clone()),
            publish(format!("$JS.API.DIRECT.GET.LH_EVT.{outcomes}")),
            publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{mine}.{outcomes}")),
            publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{theirs}.{outcomes}")),
            // Its consumer by its real name, every verb.
            publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{theirs}")),
            publish(format!("$JS.API.CONSUMER.DURABLE.CREATE.LH_EVT.{theirs}")),
            publish(format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.{theirs}")),
            publish(format!("$JS.API.CONSUMER.DELETE.LH_EVT.{theirs}")),
            publish(format!("$JS.API.CONSUMER.INFO.LH_EVT.{theirs}")),
            // The name it would have without a secret.
            publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.lh-agent-{other}.{outcomes}")),
            publish(format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.lh-agent-{other}")),
            // Its replies, where its consumer delivers.
            subscribe(format!("{}.>", inbox(other))),
        ]);
    }
    refused.extend([
        publish(format!("lh.evt.{p}.{me}")),
        publish("lh.dlq.0.agent.x._"),
        publish(format!("lh.in.op.{me}.probe-id")),
        publish(format!("lh.in.op@{PRINCIPAL}.{me}.probe-id")),
        publish(format!("lh.in.sys.{me}.probe-id")),
        publish("$JS.API.INFO"),
        publish("$JS.API.STREAM.INFO.LH_CMD"),
        publish("$JS.API.STREAM.INFO.LH_EVT"),
        publish("$JS.API.DIRECT.GET.LH_EVT"),
        publish("$JS.API.STREAM.MSG.GET.LH_EVT"),
        publish("$JS.API.STREAM.UPDATE.LH_EVT"),
        publish("$JS.API.STREAM.DELETE.LH_EVT"),
        publish("$JS.API.STREAM.PURGE.LH_EVT"),
        publish("$JS.API.STREAM.DELETE.LH_CMD"),
        publish("$JS.API.CONSUMER.CREATE.LH_CMD.x.lh.cmd.0.>"),
        publish("$JS.API.CONSUMER.NAMES.LH_EVT"),
        publish("$JS.API.CONSUMER.LIST.LH_EVT"),
        publish("$JS.API.CONSUMER.CREATE.LH_EVT"),
        // Its own consumer on every outcome, and another consumer on its own outcomes.
        publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{mine}.lh.evt.>")),
        publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{NOBODY}.lh.evt.{p}.{me}")),
        publish(format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.{NOBODY}")),
        subscribe("lh.evt.>"),
        subscribe("$JS.EVENT.>"),
        subscribe("_INBOX.>"),
    ]);
    // Its pulls and the delete before a new follow are the running agent's own: the server log shows below that
    // no leasehold process was refused anything.
    let allowed = vec![
        publish(format!("lh.in.agent.{me}.probe-id")),
        publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{mine}.lh.evt.{p}.{me}")),
        publish(format!("$JS.API.CONSUMER.INFO.LH_EVT.{mine}")),
        subscribe(format!("{}.probe", inbox(me))),
    ];
    Expect { user: me.to_owned(), refused, allowed }
}

/// What no reader (producers, the sweeper, workers) may do: learn a consumer's name, change a stream, speak as an
/// agent, or read an agent's replies.
fn refused_to_readers() -> Vec<Try> {
    let mut out = vec![
        publish("$JS.API.CONSUMER.NAMES.LH_EVT"),
        publish("$JS.API.CONSUMER.LIST.LH_EVT"),
        publish("$JS.API.CONSUMER.NAMES.LH_CMD"),
        publish("$JS.API.CONSUMER.LIST.LH_CMD"),
        subscribe("$JS.EVENT.>"),
        subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.LH_EVT.>"),
        subscribe("$JS.API.>"),
        publish("$JS.API.CONSUMER.DURABLE.CREATE.LH_EVT.x"),
        publish("$JS.API.STREAM.MSG.DELETE.LH_EVT"),
        publish("lh.in.agent.a.probe-id"),
        subscribe("lh.evt.>"),
        subscribe("lh.in.>"),
        subscribe(format!("{}.>", inbox("a"))),
    ];
    for stream in ["LH_CMD", "LH_EVT", "LH_DLQ"] {
        for verb in ["UPDATE", "DELETE", "PURGE"] {
            out.push(publish(format!("$JS.API.STREAM.{verb}.{stream}")));
        }
    }
    out
}

/// What every reader does: stream info, gets, and ordered consumers on `LH_EVT` of any name it makes up.
fn allowed_to_readers(me: &str) -> Vec<Try> {
    let mut out = Vec::new();
    for stream in ["LH_CMD", "LH_EVT", "LH_DLQ", "OBJ_LH_SNAPSHOTS", "KV_LH_WORKERS"] {
        out.push(publish(format!("$JS.API.STREAM.INFO.{stream}")));
    }
    for stream in ["LH_CMD", "LH_EVT", "LH_DLQ"] {
        out.push(publish(format!("$JS.API.DIRECT.GET.{stream}")));
        out.push(publish(format!("$JS.API.STREAM.MSG.GET.{stream}")));
    }
    out.extend([
        publish("$JS.API.CONSUMER.CREATE.LH_EVT"),
        publish(format!("$JS.API.CONSUMER.CREATE.LH_EVT.{NOBODY}.lh.evt.>")),
        publish(format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.{NOBODY}")),
        publish(format!("$JS.API.CONSUMER.DELETE.LH_EVT.{NOBODY}")),
        publish(format!("$JS.API.CONSUMER.INFO.LH_EVT.{NOBODY}")),
        subscribe(format!("{}.probe", inbox(me))),
    ]);
    out
}

/// The partition snapshots, which the sweeper and the workers read.
fn snapshot_reads() -> Vec<Try> {
    vec![
        publish("$JS.API.STREAM.MSG.GET.OBJ_LH_SNAPSHOTS"),
        publish("$JS.API.DIRECT.GET.OBJ_LH_SNAPSHOTS.$O.LH_SNAPSHOTS.M.x"),
        publish("$JS.API.CONSUMER.CREATE.OBJ_LH_SNAPSHOTS"),
        publish(format!("$JS.API.CONSUMER.CREATE.OBJ_LH_SNAPSHOTS.{NOBODY}.$O.LH_SNAPSHOTS.C.x")),
        publish(format!("$JS.API.CONSUMER.DELETE.OBJ_LH_SNAPSHOTS.{NOBODY}")),
        publish("$JS.FC.OBJ_LH_SNAPSHOTS.x"),
    ]
}

/// What only a worker does: append outcomes and dead letters, run the writer consumers, keep the buckets.
fn writers_only() -> Vec<Try> {
    let mut out = vec![
        publish("lh.evt.0.probe-key"),
        publish("lh.dlq.0.probe.x"),
        publish("$JS.API.INFO"),
        publish("$JS.API.DIRECT.GET.LH_CMD.lh.cmd.0.x"),
        publish(format!("$JS.API.CONSUMER.CREATE.LH_CMD.{NOBODY}.lh.cmd.0.>")),
        publish("$JS.API.CONSUMER.INFO.LH_CMD.lh-writer-0"),
        publish(format!("$JS.API.CONSUMER.MSG.NEXT.LH_CMD.{NOBODY}")),
        publish(format!("$JS.API.CONSUMER.UNPIN.LH_CMD.{NOBODY}")),
        publish(format!("$JS.ACK.LH_CMD.{NOBODY}.1.1.1.1.0")),
        publish(format!("$JS.ACK._.x.LH_CMD.{NOBODY}.1.1.1.1.0")),
        publish("$O.LH_SNAPSHOTS.C.probe"),
        Try::PublishWith(
            "$JS.API.STREAM.PURGE.OBJ_LH_SNAPSHOTS".to_owned(),
            br#"{"filter":"$O.LH_SNAPSHOTS.C.lh-permission-probe"}"#,
        ),
        publish("$KV.LH_WORKERS.probe"),
        publish("$JS.API.DIRECT.GET.KV_LH_WORKERS.$KV.LH_WORKERS.x"),
        publish("$JS.API.STREAM.MSG.GET.KV_LH_WORKERS"),
        publish("$JS.API.CONSUMER.CREATE.KV_LH_WORKERS"),
        publish(format!("$JS.API.CONSUMER.CREATE.KV_LH_WORKERS.{NOBODY}.$KV.LH_WORKERS.>")),
        publish(format!("$JS.API.CONSUMER.DELETE.KV_LH_WORKERS.{NOBODY}")),
        publish("$JS.FC.KV_LH_WORKERS.x"),
    ];
    for stream in ["LH_CMD", "LH_EVT", "LH_DLQ", "OBJ_LH_SNAPSHOTS", "KV_LH_WORKERS"] {
        out.push(publish(format!("$JS.API.STREAM.CREATE.{stream}")));
    }
    out
}

/// The producers, the sweeper and the worker: each role's ingress subject is its own, and the rest is above.
fn service_expects() -> Vec<Expect> {
    let (op, bound, sys) = ("lh.in.op.a.probe-id", format!("lh.in.op@{PRINCIPAL}.a.probe-id"), "lh.in.sys.a.probe-id");
    // The one op subject a worker publishes on: where `serve` seeds a partition's settings.
    let settings = || publish(format!("lh.in.op.{}._", settings_key(0, PARTITIONS).token()));
    let expect = |user: &str, refused: Vec<Vec<Try>>, allowed: Vec<Vec<Try>>| Expect {
        user: user.to_owned(),
        refused: refused.into_iter().flatten().collect(),
        allowed: allowed.into_iter().flatten().collect(),
    };
    vec![
        expect(
            "pr",
            vec![
                refused_to_readers(),
                writers_only(),
                snapshot_reads(),
                vec![publish(&bound), publish(sys), subscribe("_INBOX_prb.>")],
            ],
            vec![allowed_to_readers("pr"), vec![publish(op), settings()]],
        ),
        expect(
            "prb",
            vec![
                refused_to_readers(),
                writers_only(),
                snapshot_reads(),
                vec![
                    publish(op),
                    settings(),
                    publish("lh.in.op@ci:team-b.a.probe-id"),
                    publish(sys),
                    subscribe("_INBOX_pr.>"),
                ],
            ],
            vec![allowed_to_readers("prb"), vec![publish(&bound)]],
        ),
        expect(
            "sw",
            vec![
                refused_to_readers(),
                writers_only(),
                vec![publish(op), settings(), publish(&bound), subscribe("_INBOX_w.>")],
            ],
            vec![allowed_to_readers("sw"), snapshot_reads(), vec![publish(sys)]],
        ),
        expect(
            "w",
            vec![
                refused_to_readers(),
                vec![
                    publish(op),
                    publish(&bound),
                    publish(sys),
                    publish("$JS.API.CONSUMER.DELETE.LH_CMD.lh-writer-0"),
                    publish("$JS.API.STREAM.DELETE.OBJ_LH_SNAPSHOTS"),
                    publish("$JS.API.STREAM.UPDATE.KV_LH_WORKERS"),
                    subscribe("_INBOX_sw.>"),
                ],
            ],
            vec![allowed_to_readers("w"), snapshot_reads(), writers_only(), vec![settings()]],
        ),
    ]
}

/// Agent `me`'s consumer, asked by its real name on its own connection (polled: the agent replaces it when it
/// follows again).
async fn own_consumer_info(url: &str, users: &Users, me: &str) -> serde_json::Value {
    let name = users.consumer(me);
    let probe = PermissionProbe::connect(url, users.auth(me), &inbox(me)).await.expect("connect");
    let subject = format!("$JS.API.CONSUMER.INFO.LH_EVT.{name}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = probe.client().request(subject.clone(), "".into()).await.expect("consumer info");
        let info: serde_json::Value = serde_json::from_slice(&answer.payload).expect("JSON");
        if info["name"] == name.as_str() {
            return info;
        }
        assert!(Instant::now() < deadline, "{me}'s consumer {name} is not there: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
