//! What the NATS scenarios start from: a nats-server on loopback, a test directory, `serve` and `agent run`
//! processes over the server's log, and a client of that log that publishes commands as a sweeper or a producer
//! would and reads the outcomes back.

use std::path::Path;

use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::{Command, CommandId, Envelope, Issuer, Outcome, Timestamp, codec};

use crate::support::Proc;

/// A sweeper that looks every 100 ms and asks again after a second: scenarios settle in well under a second.
pub(crate) const FAST_SWEEPER: [&str; 4] = ["--sweep-interval", "100ms", "--sweep-retry", "1s"];

/// A nats-server and the directory the processes of one scenario run in.
pub(crate) struct NatsRun {
    _server: NatsServer,
    pub(crate) url: String,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) partitions: u32,
}

impl NatsRun {
    /// A server and a directory named `lh-e2e-PREFIX-...`; `None` without nats-server (see `NatsServer::start`).
    pub(crate) fn start(prefix: &str, partitions: u32) -> Option<NatsRun> {
        let server = NatsServer::start()?;
        let url = server.url().to_owned();
        let dir =
            tempfile::Builder::new().prefix(&format!("lh-e2e-{prefix}-")).tempdir().expect("a temporary directory");
        Some(NatsRun { _server: server, url, dir, partitions })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `serve` over the log, listening on a free port, its projection (if any) in `NAME/`, with `extra` arguments
    /// (`--roles ...`, policy flags, sweeper flags).
    pub(crate) fn serve(&self, name: &str, extra: &[&str]) -> Proc {
        let data = self.path().join(name).display().to_string();
        let partitions = self.partitions.to_string();
        let mut args = vec!["serve", "--nats", &self.url, "--partitions", &partitions, "--listen", "127.0.0.1:0"];
        args.extend(["--data", &data]);
        args.extend(extra);
        Proc::spawn(self.path(), name, &args)
    }

    /// `agent run --name NAME` with a dir driver on `NAME/` of the directory, reporting every 300 ms.
    pub(crate) fn agent(&self, name: &str, extra: &[&str]) -> Proc {
        let driver = format!("dir:{}", self.path().join(name).display());
        let mut args = vec!["agent", "run", "--name", name, "--driver", &driver, "--nats", &self.url];
        args.extend(["--sync-interval", "300ms"]);
        args.extend(extra);
        Proc::spawn(self.path(), name, &args)
    }

    /// A client of the log `serve` made.
    pub(crate) async fn log(&self) -> JetStream {
        JetStream::connect(JetStreamConfig::new(&self.url, 0)).await.expect("attach to the log")
    }
}

/// Publishes `body` from `issuer` straight to the log (no gateway: a sweeper's `sys` command, a producer on NATS).
pub(crate) async fn publish(log: &impl Log, issuer: &str, body: impl Into<Command>) -> CommandId {
    let id = CommandId::generate();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    let envelope = Envelope::new(id, Issuer::new(issuer).expect("an issuer"), Timestamp(now as u64), body);
    let payload = codec::encode_command(&envelope).expect("encode");
    let subject = leasehold_schemas::subjects::ingress_subject_of(&envelope.body);
    log.publish_command(&subject, &id.to_string(), payload.into()).await.expect("publish");
    id
}

/// Every outcome `filter` matches, decoded, with its sequence, in log order.
pub(crate) async fn outcomes(log: &impl Log, filter: &OutcomeFilter) -> Vec<(u64, Outcome)> {
    let mut all = Vec::new();
    loop {
        let from = all.last().map_or(1, |(seq, _)| seq + 1);
        let batch = log.read_outcomes(filter, from, 2048).await.expect("read the outcomes");
        if batch.is_empty() {
            return all;
        }
        all.extend(batch.iter().map(|s| (s.seq, codec::decode_outcome(&s.payload).expect("an outcome"))));
    }
}
