//! `leasehold agent credentials NAME` and `leasehold credentials worker|producer|sweeper NAME`: a NATS user block
//! (nats-server config syntax, for `authorization { users = [...] }` or an account's `users`) that allows one
//! process exactly what it needs, with a fresh random password or, with `--nkey`, a fresh nkey (its seed printed
//! first, the public key in the block).
//!
//! The JetStream API subjects each role gets were probed against nats-server 2.15 (tests/tests/e2e/authz.rs runs
//! every role under them). An agent's permissions name its one consumer and its one filter subject, so it can
//! neither read another agent's outcomes nor touch the streams. That consumer's name is derived from the secret
//! generated here ([`agent_consumer`]): the readers' wildcard grants on `LH_EVT` consumers would allow it, but no
//! role may list consumer names or subscribe to the JetStream advisories that carry them, so no other user can
//! learn it.

use anyhow::Context;
use leasehold_log::jetstream::{CMD_STREAM, DLQ_STREAM, EVT_STREAM, SNAPSHOT_BUCKET, WORKERS_BUCKET, agent_consumer};
use leasehold_schemas::ids::{AgentName, Issuer};
use leasehold_schemas::subjects::partition_of_agent;

/// Who the user is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// One agent, whose events are in `partition`, read through its consumer `consumer` (see [`agent_consumer`]).
    Agent { name: AgentName, partition: u32, consumer: String },
    /// A `serve --roles worker,projector` process of a log of `partitions`: the writers and the read models.
    Worker { partitions: u32 },
    /// A producer (an operator's CLI with `--nats`, a service that sends `op` commands); bound to `principal` when
    /// given: it may publish only on `lh.in.op@<principal>.>`, and the writer takes from there only that principal's
    /// own requests (allocations, placements, leases, what it does to resources).
    Producer { principal: Option<Issuer> },
    /// The sweeper: time-driven `sys` commands.
    Sweeper,
}

/// One allowed subject and why it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) subject: String,
    pub(crate) why: &'static str,
}

fn grant(subject: impl Into<String>, why: &'static str) -> Grant {
    Grant { subject: subject.into(), why }
}

/// What one user may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Permissions {
    pub(crate) publish: Vec<Grant>,
    pub(crate) subscribe: Vec<Grant>,
}

/// The inbox prefix of a user: its replies come only there, and only it may subscribe to them.
pub(crate) fn inbox_prefix(user: &str) -> String {
    format!("_INBOX_{user}")
}

/// Reading outcomes and commands, as the producers' `--nats` path and the sweeper do: stream info (the client
/// checks the streams and learns the partition count), direct and leader gets, and ordered consumers on `LH_EVT`
/// (named by the client, any filter under `lh.evt.>`).
fn read_only() -> Vec<Grant> {
    let mut out = Vec::new();
    for stream in [CMD_STREAM, EVT_STREAM, DLQ_STREAM] {
        out.push(grant(format!("$JS.API.STREAM.INFO.{stream}"), "checks the stream on connect"));
    }
    for stream in [format!("OBJ_{SNAPSHOT_BUCKET}"), format!("KV_{WORKERS_BUCKET}")] {
        out.push(grant(format!("$JS.API.STREAM.INFO.{stream}"), "opens the bucket on connect"));
    }
    for stream in [CMD_STREAM, EVT_STREAM, DLQ_STREAM] {
        out.push(grant(format!("$JS.API.DIRECT.GET.{stream}"), "batched reads (the filter is in the request)"));
        out.push(grant(format!("$JS.API.STREAM.MSG.GET.{stream}"), "reads from the stream leader"));
    }
    out.push(grant(format!("$JS.API.CONSUMER.CREATE.{EVT_STREAM}"), "an ordered consumer following every outcome"));
    out.push(grant(format!("$JS.API.CONSUMER.CREATE.{EVT_STREAM}.>"), "ordered consumers following outcomes"));
    out.push(grant(format!("$JS.API.CONSUMER.MSG.NEXT.{EVT_STREAM}.*"), "pulls of those consumers"));
    out.push(grant(format!("$JS.API.CONSUMER.DELETE.{EVT_STREAM}.*"), "an ordered consumer replaces itself"));
    out.push(grant(format!("$JS.API.CONSUMER.INFO.{EVT_STREAM}.*"), "a pull consumer checks itself on reconnect"));
    out
}

/// Reading the writers' partition snapshots (a load folds from the latest one): the worker's, and the sweeper's,
/// which folds every partition the same way.
fn snapshot_reads() -> Vec<Grant> {
    vec![
        grant(format!("$JS.API.STREAM.MSG.GET.OBJ_{SNAPSHOT_BUCKET}"), "reads a snapshot's description"),
        grant(format!("$JS.API.DIRECT.GET.OBJ_{SNAPSHOT_BUCKET}.>"), "reads a snapshot's description"),
        grant(format!("$JS.API.CONSUMER.CREATE.OBJ_{SNAPSHOT_BUCKET}.>"), "reads a snapshot's chunks"),
        grant(format!("$JS.API.CONSUMER.CREATE.OBJ_{SNAPSHOT_BUCKET}"), "reads a snapshot's chunks"),
        grant(format!("$JS.API.CONSUMER.DELETE.OBJ_{SNAPSHOT_BUCKET}.*"), "ends that read"),
        grant(format!("$JS.FC.OBJ_{SNAPSHOT_BUCKET}.>"), "flow control of that read"),
    ]
}

/// The permissions of `role` for a user whose inbox prefix is `inbox`.
pub(crate) fn permissions(role: &Role, inbox: &str) -> Permissions {
    let subscribe = vec![grant(format!("{inbox}.>"), "its own replies (its client uses this inbox prefix)")];
    let publish = match role {
        Role::Agent { name, partition, consumer } => {
            vec![
                grant(format!("lh.in.agent.{name}.>"), "its own observations: the subject is its identity"),
                grant(
                    format!("$JS.API.CONSUMER.CREATE.{EVT_STREAM}.{consumer}.lh.evt.{partition}.{name}"),
                    "creates its one consumer (named from its secret: no other user can name it), filtered on its one \
                     outcome subject",
                ),
                grant(
                    format!("$JS.API.CONSUMER.MSG.NEXT.{EVT_STREAM}.{consumer}"),
                    "pulls its outcomes from that consumer",
                ),
                grant(
                    format!("$JS.API.CONSUMER.DELETE.{EVT_STREAM}.{consumer}"),
                    "replaces that consumer when it follows again from another sequence",
                ),
                grant(
                    format!("$JS.API.CONSUMER.INFO.{EVT_STREAM}.{consumer}"),
                    "async-nats checks its pull consumer after a reconnect",
                ),
            ]
        }
        Role::Worker { partitions } => {
            let mut out = vec![
                grant("lh.evt.>", "appends outcomes (always under the fence)"),
                grant("lh.dlq.>", "dead-letters undecodable commands"),
                grant("$JS.API.INFO", "account limits, read when the workers bucket is created"),
            ];
            out.extend(read_only());
            for stream in [CMD_STREAM, EVT_STREAM, DLQ_STREAM]
                .map(str::to_owned)
                .into_iter()
                .chain([format!("OBJ_{SNAPSHOT_BUCKET}"), format!("KV_{WORKERS_BUCKET}")])
            {
                out.push(grant(format!("$JS.API.STREAM.CREATE.{stream}"), "the first serve creates the log"));
            }
            out.extend([
                grant(format!("$JS.API.DIRECT.GET.{CMD_STREAM}.>"), "reads by subject"),
                grant(format!("$JS.API.CONSUMER.CREATE.{CMD_STREAM}.>"), "creates the writer consumers"),
                grant(format!("$JS.API.CONSUMER.INFO.{CMD_STREAM}.*"), "who is pinned to a partition"),
                grant(format!("$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.*"), "pulls a partition's commands"),
                grant(format!("$JS.API.CONSUMER.UNPIN.{CMD_STREAM}.*"), "gives a partition up on shutdown"),
                grant(format!("$JS.ACK.{CMD_STREAM}.>"), "acks commands done with"),
                grant(format!("$JS.ACK.*.*.{CMD_STREAM}.>"), "acks commands done with (the v2 ack subject)"),
                grant(format!("$O.{SNAPSHOT_BUCKET}.>"), "stores partition snapshots"),
                grant(format!("$JS.API.STREAM.PURGE.OBJ_{SNAPSHOT_BUCKET}"), "drops a replaced snapshot's chunks"),
                grant(format!("$KV.{WORKERS_BUCKET}.>"), "says this worker is alive"),
                grant(format!("$JS.API.DIRECT.GET.KV_{WORKERS_BUCKET}.>"), "reads the live workers"),
                grant(format!("$JS.API.STREAM.MSG.GET.KV_{WORKERS_BUCKET}"), "reads the live workers"),
                grant(format!("$JS.API.CONSUMER.CREATE.KV_{WORKERS_BUCKET}.>"), "lists the live workers"),
                grant(format!("$JS.API.CONSUMER.CREATE.KV_{WORKERS_BUCKET}"), "lists the live workers"),
                grant(format!("$JS.API.CONSUMER.DELETE.KV_{WORKERS_BUCKET}.*"), "ends that listing"),
                grant(format!("$JS.FC.KV_{WORKERS_BUCKET}.>"), "flow control of that listing"),
            ]);
            out.extend(snapshot_reads());
            // `serve` seeds the cluster policy of a log that has none: one settings command per partition, on the
            // partition's settings key, and no other op command.
            for partition in 0..*partitions {
                let key = leasehold_schemas::subjects::settings_key(partition, *partitions);
                out.push(grant(
                    format!("lh.in.op.{}._", key.token()),
                    "seeds the cluster policy of a log that has none (serve's policy flags)",
                ));
            }
            out
        }
        Role::Producer { principal: None } => {
            let mut out = vec![grant("lh.in.op.>", "op commands (never agent or sys)")];
            out.extend(read_only());
            out
        }
        Role::Producer { principal: Some(principal) } => {
            let mut out = vec![grant(
                format!("lh.in.op@{principal}.>"),
                "its own requests as its principal: the subject is its identity (the writer holds the issuer to it)",
            )];
            out.extend(read_only());
            out
        }
        Role::Sweeper => {
            let mut out = vec![grant("lh.in.sys.>", "sys commands (only the sweeper sends them)")];
            out.extend(read_only());
            out.extend(snapshot_reads());
            out
        }
    };
    Permissions { publish, subscribe }
}

/// A fresh user: how it proves who it is, and the secret it connects with (its password, or its nkey seed).
struct Fresh {
    auth: Auth,
    secret: String,
}

impl Fresh {
    /// A fresh nkey (with `nkey`) or a fresh random password for user `name`.
    fn new(name: &str, nkey: bool) -> Fresh {
        if nkey {
            let pair = nkeys::KeyPair::new_user();
            // `seed()` fails only for a key pair made from a public key.
            let seed = pair.seed().unwrap_or_default();
            Fresh { auth: Auth::Nkey { public: pair.public_key() }, secret: seed }
        } else {
            let password = random_password();
            Fresh { auth: Auth::Password { user: name.to_owned(), password: password.clone() }, secret: password }
        }
    }
}

/// How the user proves who it is.
#[derive(Debug, Clone)]
pub(crate) enum Auth {
    Password {
        user: String,
        password: String,
    },
    /// The public key (`U...`); the seed is the user's.
    Nkey {
        public: String,
    },
}

/// The user block, in nats-server config syntax.
pub(crate) fn user_block(auth: &Auth, permissions: &Permissions) -> String {
    let mut out = String::from("{\n");
    match auth {
        Auth::Password { user, password } => {
            out.push_str(&format!("  user: {}\n  password: {}\n", quoted(user), quoted(password)));
        }
        Auth::Nkey { public } => out.push_str(&format!("  nkey: {}\n", quoted(public))),
    }
    out.push_str("  permissions: {\n");
    for (verb, grants) in [("publish", &permissions.publish), ("subscribe", &permissions.subscribe)] {
        out.push_str(&format!("    {verb}: {{\n      allow: [\n"));
        for g in grants {
            out.push_str(&format!("        {}  # {}\n", quoted(&g.subject), g.why));
        }
        out.push_str("      ]\n    }\n");
    }
    out.push_str("  }\n}\n");
    out
}

fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A fresh random password: 256 random bits (an ed25519 key's randomness), in base32.
fn random_password() -> String {
    nkeys::KeyPair::new_user().public_key()[1..].to_owned()
}

#[derive(Debug, clap::Args)]
pub(crate) struct CredentialsArgs {
    /// The user's name (an agent's is the agent name). Its inbox prefix is `_INBOX_<NAME>`.
    name: String,
    /// Generate an nkey (printed: its seed first, for the seed file, then the block with its public key) instead
    /// of a user and a random password.
    #[arg(long)]
    nkey: bool,
    /// The log's partition count (agents: it places the agent's outcome subject). Without it, it is read from the
    /// server given with --nats (with credentials that may read stream info).
    #[arg(long)]
    partitions: Option<u32>,
    #[command(flatten)]
    nats: crate::nats_args::NatsArgs,
}

impl CredentialsArgs {
    /// The log's partition count: `--partitions`, else read from the server of `--nats`.
    fn partitions(&self) -> anyhow::Result<u32> {
        match self.partitions {
            Some(p) if p > 0 => Ok(p),
            Some(_) => anyhow::bail!("--partitions: a log has at least one partition"),
            None => partitions_from_server(&self.nats),
        }
    }
}

/// The non-agent roles `leasehold credentials` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ServiceRole {
    Worker,
    Producer,
    Sweeper,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServiceCredentialsArgs {
    /// Which role: worker (serve --roles worker,projector), producer, sweeper.
    #[arg(value_enum)]
    role: ServiceRole,
    /// A producer only: bind it to principal P. Its user may publish only on lh.in.op@P.> (run it with
    /// `--as-principal P`), and the writer takes from there only P's own allocations, placements, leases and
    /// resource commands, with issuer P: it can neither speak as another issuer (a quota counts P's resources) nor
    /// send an operator's command.
    #[arg(long, value_name = "P")]
    principal: Option<String>,
    #[command(flatten)]
    args: CredentialsArgs,
}

/// `leasehold agent credentials NAME`.
pub(crate) fn agent(args: CredentialsArgs) -> anyhow::Result<()> {
    let name = AgentName::new(args.name.as_str()).context("NAME")?;
    let partitions = args.partitions()?;
    let partition = partition_of_agent(&name, partitions);
    let fresh = Fresh::new(name.as_str(), args.nkey);
    // The agent derives the same name from the secret it connects with.
    let consumer = agent_consumer(name.as_str(), Some(&fresh.secret));
    let role = Role::Agent { name: name.clone(), partition, consumer };
    let hint = format!(
        "leasehold agent run --name {name} --partitions {partitions} --driver DRIVER --nats URL{}",
        if args.nkey { " --nkey-seed SEED_FILE" } else { " --user USER --password PASSWORD" }
    );
    print(&role, name.as_str(), fresh, &format!("agent {name} (partition {partition} of {partitions})"), &hint);
    Ok(())
}

/// `leasehold credentials worker|producer|sweeper NAME`.
pub(crate) fn service(args: ServiceCredentialsArgs) -> anyhow::Result<()> {
    let ServiceCredentialsArgs { role, principal, args } = args;
    anyhow::ensure!(
        !args.name.is_empty() && args.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "NAME: letters, digits, - and _ only (it is also the user's inbox prefix)"
    );
    let (role, what) = match role {
        ServiceRole::Worker => {
            (Role::Worker { partitions: args.partitions()? }, "worker (serve --roles worker,projector)")
        }
        ServiceRole::Producer => {
            let principal = principal.as_deref().map(crate::produce::bound_principal).transpose()?;
            (Role::Producer { principal }, "producer")
        }
        ServiceRole::Sweeper => (Role::Sweeper, "sweeper"),
    };
    if let (Some(given), Role::Worker { .. } | Role::Sweeper) = (&principal, &role) {
        return Err(crate::policy::BadCommandLine(format!(
            "--principal {}: only a producer is bound to a principal",
            leasehold_schemas::text::shown(given)
        ))
        .into());
    }
    let (bound, what) = match &role {
        Role::Producer { principal: Some(principal) } => {
            (format!(" --as-principal {principal}"), format!("{what} {} (as principal {principal})", args.name))
        }
        _ => (String::new(), format!("{what} {}", args.name)),
    };
    let hint = format!(
        "leasehold ... --nats URL --inbox-prefix {}{}{bound}",
        inbox_prefix(&args.name),
        if args.nkey { " --nkey-seed SEED_FILE" } else { " --user USER --password PASSWORD" }
    );
    print(&role, &args.name, Fresh::new(&args.name, args.nkey), &what, &hint);
    Ok(())
}

fn print(role: &Role, name: &str, fresh: Fresh, what: &str, hint: &str) {
    let permissions = permissions(role, &inbox_prefix(name));
    if let Auth::Nkey { .. } = fresh.auth {
        println!("# the nkey seed of {what}: keep it secret, give it to the process with --nkey-seed FILE");
        println!("-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n", fresh.secret);
    }
    println!("# leasehold: the NATS user of {what}; paste into the users list of the account that holds the log");
    println!("# run it as: {hint}");
    print!("{}", user_block(&fresh.auth, &permissions));
}

fn partitions_from_server(nats: &crate::nats_args::NatsArgs) -> anyhow::Result<u32> {
    let config = nats
        .config(0)
        .context("give --partitions P (the log's partition count), or --nats URL to read it from the server")?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        let url = config.url.clone();
        let log = leasehold_log::jetstream::JetStream::connect(config)
            .await
            .with_context(|| format!("reading the partition count from NATS at {url}"))?;
        Ok(leasehold_log::Log::partitions(&log))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_may_read_only_its_own_subject_through_its_own_consumer() {
        let name = AgentName::new("res-a").unwrap();
        let consumer = agent_consumer("res-a", Some("pw"));
        let role = Role::Agent { name, partition: 7, consumer };
        let p = permissions(&role, "_INBOX_res-a");
        let publish: Vec<&str> = p.publish.iter().map(|g| g.subject.as_str()).collect();
        let tagged = "lh-agent-res-a-082917c2630fa3e619743c5de36cdb0a";
        assert_eq!(
            publish,
            [
                "lh.in.agent.res-a.>".to_owned(),
                format!("$JS.API.CONSUMER.CREATE.LH_EVT.{tagged}.lh.evt.7.res-a"),
                format!("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.{tagged}"),
                format!("$JS.API.CONSUMER.DELETE.LH_EVT.{tagged}"),
                format!("$JS.API.CONSUMER.INFO.LH_EVT.{tagged}"),
            ]
        );
        assert_eq!(p.subscribe.iter().map(|g| g.subject.as_str()).collect::<Vec<_>>(), ["_INBOX_res-a.>"]);
    }

    #[test]
    fn only_writers_publish_outcomes() {
        let bound = Role::Producer { principal: Some(Issuer::new("ci:team-a").unwrap()) };
        for role in [Role::Producer { principal: None }, bound, Role::Sweeper] {
            let p = permissions(&role, "_INBOX_x");
            assert!(!p.publish.iter().any(|g| g.subject.starts_with("lh.evt") || g.subject.starts_with("lh.dlq")));
            assert!(!p.publish.iter().any(|g| g.subject.contains("STREAM.CREATE")
                || g.subject.contains("STREAM.UPDATE")
                || g.subject.contains("STREAM.DELETE")
                || g.subject.contains("STREAM.PURGE")));
        }
        let worker = permissions(&Role::Worker { partitions: 4 }, "_INBOX_w");
        assert!(worker.publish.iter().any(|g| g.subject == "lh.evt.>"));
        let ingress: Vec<&str> =
            worker.publish.iter().map(|g| g.subject.as_str()).filter(|s| s.starts_with("lh.in.")).collect();
        assert_eq!(ingress.len(), 4, "one settings subject per partition, nothing else: {ingress:?}");
        assert!(ingress.iter().all(|s| s.starts_with("lh.in.op.@lh-settings-") && s.ends_with("._")), "{ingress:?}");
        assert!(!worker.publish.iter().any(|g| g.subject.contains(&format!("PURGE.{EVT_STREAM}"))
            || g.subject.contains("STREAM.DELETE")
            || g.subject.contains("STREAM.UPDATE")));
    }

    #[test]
    fn a_bound_producer_publishes_only_as_its_principal() {
        let principal = Issuer::new("ci:team-a").unwrap();
        let bound = permissions(&Role::Producer { principal: Some(principal) }, "_INBOX_team-a");
        let ingress: Vec<&str> =
            bound.publish.iter().map(|g| g.subject.as_str()).filter(|s| s.starts_with("lh.")).collect();
        assert_eq!(ingress, ["lh.in.op@ci:team-a.>"], "only its own subjects: never lh.in.op.>");
        // Everything else is what any producer reads with.
        let free = permissions(&Role::Producer { principal: None }, "_INBOX_team-a");
        assert_eq!(free.publish[0].subject, "lh.in.op.>");
        assert_eq!(bound.publish[1..], free.publish[1..]);
        assert_eq!(bound.subscribe, free.subscribe);
        let block = user_block(&Auth::Password { user: "team-a".into(), password: "p".into() }, &bound);
        assert!(block.contains("\"lh.in.op@ci:team-a.>\"  # its own requests as its principal"), "{block}");
        // A principal that is not one subject token cannot be bound.
        for bad in ["ci.team", "ci*", "a>", "has space", ""] {
            assert!(crate::produce::bound_principal(bad).is_err(), "{bad:?}");
        }
        assert!(crate::produce::bound_principal("ci:team-a").is_ok());
    }

    /// Whether NATS subject pattern `pattern` (with `*` and `>`) matches `subject`.
    fn matches(pattern: &str, subject: &str) -> bool {
        let (mut pattern, mut subject) = (pattern.split('.'), subject.split('.'));
        loop {
            match (pattern.next(), subject.next()) {
                (Some(">"), Some(_)) => return true,
                (Some(p), Some(s)) if p == "*" || p == s => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn no_role_may_learn_the_name_of_an_agents_consumer() {
        assert!(matches("$JS.API.CONSUMER.MSG.NEXT.LH_EVT.*", "$JS.API.CONSUMER.MSG.NEXT.LH_EVT.x"));
        assert!(matches("$JS.>", "$JS.EVENT.ADVISORY.CONSUMER.CREATED.LH_EVT.x"));
        assert!(!matches("$JS.API.CONSUMER.CREATE.LH_EVT.>", "$JS.API.CONSUMER.CREATE.LH_EVT"));
        let agent =
            Role::Agent { name: AgentName::new("a").unwrap(), partition: 0, consumer: agent_consumer("a", Some("pw")) };
        let roles = [
            agent,
            Role::Worker { partitions: 4 },
            Role::Producer { principal: None },
            Role::Producer { principal: Some(Issuer::new("ci:team-a").unwrap()) },
            Role::Sweeper,
        ];
        let listings = ["$JS.API.CONSUMER.NAMES.LH_EVT", "$JS.API.CONSUMER.LIST.LH_EVT"];
        let advisories = ["$JS.EVENT.ADVISORY.CONSUMER.CREATED.LH_EVT.x", "$JS.EVENT.METRIC.CONSUMER.ACK.LH_EVT.x"];
        for role in &roles {
            let p = permissions(role, "_INBOX_x");
            for subject in listings.iter().chain(&advisories) {
                let granted: Vec<&str> =
                    p.publish.iter().map(|g| g.subject.as_str()).filter(|g| matches(g, subject)).collect();
                assert!(granted.is_empty(), "{role:?} may publish {subject} through {granted:?}");
            }
            for subject in &advisories {
                let granted: Vec<&str> =
                    p.subscribe.iter().map(|g| g.subject.as_str()).filter(|g| matches(g, subject)).collect();
                assert!(granted.is_empty(), "{role:?} may read {subject} through {granted:?}");
            }
        }
    }

    #[test]
    fn the_block_quotes_every_subject() {
        let p = permissions(&Role::Sweeper, "_INBOX_s");
        let block = user_block(&Auth::Password { user: "s".to_owned(), password: "p\"w".to_owned() }, &p);
        assert!(block.contains("  password: \"p\\\"w\"\n"), "{block}");
        assert!(block.contains("\"$JS.API.STREAM.INFO.LH_CMD\""), "{block}");
        assert!(block.contains("\"lh.in.sys.>\""), "{block}");
    }
}
