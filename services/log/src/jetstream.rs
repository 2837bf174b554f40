//! The JetStream log: the streams `LH_CMD`, `LH_EVT` and `LH_DLQ` of DESIGN section 9, with the same observable
//! semantics as the embedded log.
//!
//! - **Streams.** [`JetStream::connect`] creates the three streams, or checks that existing ones are exactly what
//!   leasehold creates and refuses ([`Error::Refused`], naming what differs) otherwise. `LH_CMD` takes
//!   `lh.in.*.*.*` and stores each command on `lh.cmd.<p>.<class>.<key>.<id>` through a subject transform with the
//!   partition count in it, so a stream made for another partition count is refused.
//! - **Appends.** One record is published to `lh.evt.<p>.<key>` under the fence ([`crate::fence_headers`]); several
//!   are one ADR-50 atomic batch (group commit), the fence and `Lh-Prev-Seq` on the first message only and
//!   `Lh-Batch-Index` on the rest, stored contiguously or not at all. The answers map as DESIGN section 3 says: a
//!   clean ack lands, 10071 is stale (with the sequence the server names), 10164, 10163 and 10210 are busy (nothing
//!   stored), and everything else (a duplicate, a timeout) is unknown.
//! - **Publishing commands.** Several at once are one atomic batch on `LH_CMD` (one fsync; each command's sequence
//!   from the one acknowledgement), published again one by one when the server refuses the batch whole (an id stored
//!   before: 10201), so each id's dedupe answers for itself.
//! - **Reads.** History is read with batched direct gets (`$JS.API.DIRECT.GET`, ADR-31), which any replica may
//!   answer. A replica applies in order, so it may lag but never skips: a read gives a prefix of the truth. Where a
//!   lag would matter, the read checks with the stream leader: [`Log::last_outcome_seq`] and [`Log::command_at`]
//!   read the leader only, and [`Log::read_outcomes`] and [`Log::read_dead_letters`] read on from the leader when a
//!   replica's answer ends before the leader's last matching message. [`Log::follow`] is an ordered consumer.
//! - **Snapshots.** One object per partition (`partition-<p>`) in the object store bucket `LH_SNAPSHOTS`, which
//!   chunks a snapshot larger than a message; the fields beside the state are the object's metadata. A snapshot
//!   is a cache, so the bucket is created when missing and not checked.
//! - **Ownership and reading.** One durable pull consumer per partition on `LH_CMD` (`lh-writer-v2-<p>`, filter
//!   `lh.cmd.<p>.>`, `AckAll`, whole messages), with the `PinnedClient` priority policy and one group, `writer`.
//!   Its pin is the hold; its deliveries are the commands, handed out only as far as their delivery numbers prove
//!   that none is missing, and read by sequence from the cursor where they cannot ([`crate::reading`]), so no
//!   redelivery order can make a writer skip one. One ack per round acks everything before it. See
//!   [`JetStreamOwner`].
//!
//! Credentials go through the connect options (a creds file, or a user and password), never the URL: async-nats
//! ignores credentials in a URL, so one with them is refused.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use async_nats::jetstream::context::{Context, ContextBuilder, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::object_store::{ObjectMetadata, ObjectStore};
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use async_nats::{HeaderValue, ServerAddr};
use bytes::Bytes;
use futures::stream::BoxStream;
use leasehold_schemas::subjects::{command_filter, outcome_filter};

mod append;
#[cfg(feature = "embedded")]
mod bench;
mod owner;
mod read;
mod streams;
mod workers;

pub(crate) use append::{BatchAnswer, batch_answer, batch_refusal, dead_letter_message, sequence_after};
pub use owner::JetStreamOwner;
pub(crate) use owner::acked_sequence;
pub(crate) use read::{stored_dead_letter, stored_outcome};
pub use workers::is_worker_name;

use append::publish_command_error;
use owner::pinned_client;
use read::{SnapshotRead, command_record, follow, follow_as_agent, snapshot_deadline};
use streams::{
    cmd_stream_config, dlq_stream_config, ensure_stream, evt_stream_config, existing_log, snapshot_bucket,
    snapshot_object,
};

use crate::{
    Appended, CommandRecord, DeadLetter, Error, Log, OutcomeFilter, OutcomeRecord, Publish, Published, Snapshot,
    StoredOutcome,
};

/// The command stream.
pub const CMD_STREAM: &str = "LH_CMD";
/// The outcome stream.
pub const EVT_STREAM: &str = "LH_EVT";
/// The dead-letter stream.
pub const DLQ_STREAM: &str = "LH_DLQ";
/// The object store bucket of partition snapshots (its stream is `OBJ_LH_SNAPSHOTS`).
pub const SNAPSHOT_BUCKET: &str = "LH_SNAPSHOTS";
/// The key-value bucket of live workers (its stream is `KV_LH_WORKERS`).
pub const WORKERS_BUCKET: &str = "LH_WORKERS";
/// How long a writer keeps its partition without pulling, and a worker stays listed after it last said it is alive,
/// on a log whose creator named no other (`--priority-timeout`). A survivor takes a dead worker's partitions within
/// about this long; a live worker keeps them through a pause of up to seven eighths of it (it pulls and says it is
/// alive every eighth).
pub const DEFAULT_PRIORITY_TIMEOUT: Duration = Duration::from_millis(2500);
/// The priority group of every writer consumer.
pub const WRITER_GROUP: &str = "writer";
/// How long `LH_CMD` keeps a command.
pub const COMMAND_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a command id is remembered for dedupe (`LH_CMD`'s `duplicate_window`).
pub const COMMAND_DUPLICATE_WINDOW: Duration = crate::DUPLICATE_WINDOW;
/// How long an outcome's message id is remembered (`LH_EVT`'s `duplicate_window`). The fence, not this window,
/// keeps an outcome from landing twice; a retry inside it is answered "duplicate" on a replicated stream.
pub const OUTCOME_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long a dead letter's source sequence is remembered (`LH_DLQ`'s `duplicate_window`): within it a command is
/// dead-lettered once.
/// A day: a dead-lettered command has no outcome, so a writer that reloads before the cursor passes it reads it
/// again and dead-letters it again; the window absorbs that.
pub const DEAD_LETTER_DUPLICATE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The name of the writer consumer of `partition`.
pub fn writer_consumer(partition: u32) -> String {
    format!("{WRITER_CONSUMER_PREFIX}{partition}")
}

/// The names of the writer consumers: `lh-writer-v2-<p>`. The `v2` consumers deliver whole commands and are acked
/// all at once (`AckAll`); a log made before them has `lh-writer-<p>` consumers (explicit acks, headers only), which
/// a worker of this version leaves alone (README, "Moving an old log over").
pub const WRITER_CONSUMER_PREFIX: &str = "lh-writer-v2-";

/// The partition a writer consumer's name names (`None`: not a writer consumer of this version).
pub fn writer_consumer_partition(name: &str) -> Option<u32> {
    name.strip_prefix(WRITER_CONSUMER_PREFIX)?.parse().ok()
}

/// How to prove who we are to the NATS server.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials.
    #[default]
    None,
    /// A `.creds` file (a user JWT and its nkey seed).
    CredsFile(PathBuf),
    /// A user and a password.
    UserPassword { user: String, password: String },
    /// A file holding an nkey user seed (`SU...`): the server knows the user by its public key.
    NkeySeedFile(PathBuf),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::None => f.write_str("None"),
            Credentials::CredsFile(path) => f.debug_tuple("CredsFile").field(path).finish(),
            Credentials::UserPassword { user, .. } => {
                f.debug_struct("UserPassword").field("user", user).field("password", &"<redacted>").finish()
            }
            Credentials::NkeySeedFile(path) => f.debug_tuple("NkeySeedFile").field(path).finish(),
        }
    }
}

/// How to reach the JetStream log and what it is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamConfig {
    /// The server URL (`nats://host:4222`), or several separated by commas. No credentials in it.
    pub url: String,
    pub credentials: Credentials,
    /// The partition count, fixed when the streams are created. `0`: take the existing log's partition and replica
    /// counts (agents and producers, which never create a log).
    pub partitions: u32,
    /// Replicas of every stream (1, or 3 in production).
    pub replicas: usize,
    /// How long a writer keeps its partition without pulling (the writer consumers' `priority_timeout`).
    pub priority_timeout: Duration,
    /// How long a delivery to a writer may go unacked before it is delivered again (`ack_wait`).
    pub ack_wait: Duration,
    /// How long to wait for the server to answer a request or a publish.
    pub request_timeout: Duration,
    /// The prefix of this client's reply subjects (`_INBOX` by default): a restricted user may subscribe only to
    /// its own prefix (`leasehold credentials` gives each user `_INBOX_<name>.>`), so nobody reads its replies.
    pub inbox_prefix: Option<String>,
    /// `Some(agent)`: connect as that agent's restricted user, which may only publish its own commands and read its
    /// own outcome subject (see [`JetStream::connect`]). Needs `partitions`.
    pub agent: Option<String>,
}

impl JetStreamConfig {
    /// A config for `url` with `partitions` partitions, one replica and the default timeouts.
    pub fn new(url: impl Into<String>, partitions: u32) -> Self {
        JetStreamConfig {
            url: url.into(),
            credentials: Credentials::None,
            partitions,
            replicas: 1,
            priority_timeout: DEFAULT_PRIORITY_TIMEOUT,
            ack_wait: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            inbox_prefix: None,
            agent: None,
        }
    }
}

/// The name of the one consumer an agent reads its outcomes through (its credentials name it).
///
/// With the `secret` the agent connects with (its password, or its nkey seed), the name carries a tag derived from
/// it, `lh-agent-<name>-<tag>`: 32 hex characters of SHA-256 over a fixed label, the name and the secret. Readers may
/// create, pull from and delete consumers on `LH_EVT` by any name (a NATS permission matches whole tokens only), but
/// no other user can compute this one, and none may list consumer names, so none can take the agent's outcomes from
/// it. Without a secret (a server without authentication, a `.creds` file whose permissions its operator writes),
/// the name is `lh-agent-<name>`.
pub fn agent_consumer(agent: &str, secret: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let Some(secret) = secret else { return format!("lh-agent-{agent}") };
    let digest = Sha256::new()
        .chain_update(b"leasehold agent consumer\0")
        .chain_update(agent.as_bytes())
        .chain_update(b"\0")
        .chain_update(secret.as_bytes())
        .finalize();
    let tag: String = digest[..16].iter().map(|byte| format!("{byte:02x}")).collect();
    format!("lh-agent-{agent}-{tag}")
}

/// The nkey user seed (`SU...`) in `path`: the first line that is one (a file may hold the whole output of
/// `leasehold credentials --nkey`).
fn read_nkey_seed(path: &std::path::Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Refused(format!("cannot read the nkey seed file {}: {e}", path.display())))?;
    text.lines()
        .map(str::trim)
        .find(|line| line.starts_with("SU"))
        .map(str::to_owned)
        .ok_or_else(|| Error::Refused(format!("{} holds no nkey user seed (SU...)", path.display())))
}

/// A handle on the JetStream log (cheap to clone).
#[derive(Clone)]
pub struct JetStream {
    inner: Arc<Inner>,
}

impl fmt::Debug for JetStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStream")
            .field("partitions", &self.inner.config.partitions)
            .field("replicas", &self.inner.config.replicas)
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: async_nats::Client,
    js: Context,
    config: JetStreamConfig,
    /// `None` on an agent's restricted connection, which may not read the streams' state.
    streams: Option<Streams>,
    /// On an agent's restricted connection, the one consumer it reads its outcomes through ([`agent_consumer`]).
    agent_consumer: Option<String>,
    /// The most commands one ingest batch carries: halved when the server refuses a batch as too large (an
    /// operator's `max_msgs`), so ingest does not stage and abandon doomed batches again and again.
    ingest_cap: AtomicUsize,
}

impl Inner {
    fn new(
        client: async_nats::Client,
        js: Context,
        config: JetStreamConfig,
        streams: Option<Streams>,
        agent_consumer: Option<String>,
    ) -> Arc<Inner> {
        let ingest_cap = AtomicUsize::new(crate::MAX_APPEND_RECORDS);
        Arc::new(Inner { client, js, config, streams, agent_consumer, ingest_cap })
    }
}

struct Streams {
    /// Handles on the three streams.
    cmd: stream::Stream,
    evt: stream::Stream,
    dlq: stream::Stream,
    snapshots: ObjectStore,
    /// Live workers: one key per worker, expiring after `priority_timeout`.
    workers: async_nats::jetstream::kv::Store,
    /// What this process has seen of `workers` ([`workers`]).
    workers_seen: Arc<std::sync::Mutex<workers::Seen>>,
    /// How long a key of `workers` lives: the bucket's own setting (its creator's).
    worker_ttl: Duration,
    /// Whether `LH_EVT` and `LH_CMD` allow atomic batches (a log made before group commit does not, until a user
    /// allowed to update streams connects, or an operator turns it on).
    evt_atomic: bool,
    cmd_atomic: bool,
}

fn unavailable(what: &str, e: impl fmt::Display) -> Error {
    Error::Unavailable(format!("{what}: {e}"))
}

/// A header value, refused when it cannot be one (a line break in it).
fn header_value(name: &str, value: &str) -> Result<HeaderValue, Error> {
    HeaderValue::from_str(value).map_err(|_| Error::Refused(format!("{value:?} cannot be the value of header {name}")))
}

/// Whether `token` can be one token of a subject: not empty, no separator, wildcard or white space.
fn is_token(token: &str) -> bool {
    !token.is_empty() && !token.contains(['.', '*', '>']) && !token.contains(char::is_whitespace)
}

impl JetStream {
    /// Connects, then creates the streams or checks that the existing ones are leasehold's with this partition
    /// count and replica count.
    pub async fn connect(config: JetStreamConfig) -> Result<Self, Error> {
        if !(1..=5).contains(&config.replicas) {
            return Err(Error::Refused(format!("a stream has 1 to 5 replicas, not {}", config.replicas)));
        }
        let mut addrs = Vec::new();
        for url in config.url.split(',').map(str::trim) {
            let addr = ServerAddr::from_str(url).map_err(|e| Error::Refused(format!("bad NATS URL {url:?}: {e}")))?;
            if addr.has_user_pass() {
                return Err(Error::Refused(
                    "the NATS URL carries credentials, which the client would ignore: give them as credentials, \
                     not in the URL"
                        .to_owned(),
                ));
            }
            addrs.push(addr);
        }
        let mut options = async_nats::ConnectOptions::new()
            .name("leasehold")
            .connection_timeout(config.request_timeout)
            .request_timeout(Some(config.request_timeout));
        // What an agent's consumer name is derived from: the secret it proves itself with.
        let mut secret = None;
        match &config.credentials {
            Credentials::None => {}
            Credentials::CredsFile(path) => {
                options = options
                    .credentials_file(path)
                    .await
                    .map_err(|e| Error::Refused(format!("cannot read the credentials file {}: {e}", path.display())))?;
            }
            Credentials::UserPassword { user, password } => {
                options = options.user_and_password(user.clone(), password.clone());
                secret = Some(password.clone());
            }
            Credentials::NkeySeedFile(path) => {
                let seed = read_nkey_seed(path)?;
                options = options.nkey(seed.clone());
                secret = Some(seed);
            }
        }
        if let Some(prefix) = &config.inbox_prefix {
            if !is_token(prefix) {
                return Err(Error::Refused(format!("{prefix:?} cannot be an inbox prefix (one subject token)")));
            }
            options = options.custom_inbox_prefix(prefix);
        }
        if config.agent.is_some() && config.partitions == 0 {
            return Err(Error::Refused(
                "an agent's restricted connection cannot read the log's partition count: give it".to_owned(),
            ));
        }
        let client = options.connect(addrs).await.map_err(|e| match e.kind() {
            async_nats::ConnectErrorKind::Authentication | async_nats::ConnectErrorKind::AuthorizationViolation => {
                Error::Refused(format!("the NATS server refused our credentials: {e}"))
            }
            _ => unavailable("cannot connect to NATS", e),
        })?;
        let js = ContextBuilder::new().timeout(config.request_timeout).build(client.clone());
        if let Some(agent) = &config.agent {
            // An agent's user may publish its commands and read its one outcome subject, nothing else: no stream
            // state, no buckets. Whether the log exists shows when its first command is stored.
            if !is_token(agent) {
                return Err(Error::Refused(format!("{agent:?} is not an agent name")));
            }
            // Its name is never logged: a reader who learned it could pull the agent's outcomes from it.
            let consumer = agent_consumer(agent, secret.as_deref());
            return Ok(JetStream { inner: Inner::new(client, js, config, None, Some(consumer)) });
        }
        let mut config = config;
        // A client of an existing log (an agent, a producer) takes it as its creator made it, and has no say in how
        // long live workers are kept.
        let client_only = config.partitions == 0;
        if client_only {
            // A client of an existing log (an agent, a producer): it takes the log as its creator made it.
            (config.partitions, config.replicas) = existing_log(&js).await?;
        }
        let (partitions, replicas) = (config.partitions, config.replicas);
        if partitions > crate::MAX_PARTITIONS {
            return Err(Error::Refused(format!(
                "a log has between 1 and {} partitions, not {partitions}",
                crate::MAX_PARTITIONS
            )));
        }
        // Only a process that serves the log (it names the partition count) upgrades its streams; a client of an
        // existing log takes them as they are.
        let cmd = ensure_stream(&js, cmd_stream_config(partitions, replicas), !client_only).await?;
        let evt = ensure_stream(&js, evt_stream_config(replicas), !client_only).await?;
        let dlq = ensure_stream(&js, dlq_stream_config(replicas), !client_only).await?;
        let (cmd_atomic, evt_atomic) =
            (cmd.cached_info().config.allow_atomic_publish, evt.cached_info().config.allow_atomic_publish);
        if !evt_atomic {
            tracing::warn!(
                "LH_EVT does not allow atomic batches (a log made before group commit): writers append one outcome \
                 at a time, at a fraction of the durable throughput. A user allowed to update streams turns it on \
                 by starting `leasehold serve` once, or an operator sets `allow_atomic` on LH_EVT and LH_CMD"
            );
        }
        let snapshots = snapshot_bucket(&js, replicas).await?;
        let workers = workers::workers_bucket(&js, replicas, (!client_only).then_some(config.priority_timeout)).await?;
        let worker_ttl = match workers.status().await {
            Ok(status) if !status.info.config.max_age.is_zero() => status.info.config.max_age,
            _ => config.priority_timeout,
        };
        let workers_seen = Arc::default();
        let streams = Streams { cmd, evt, dlq, snapshots, workers, workers_seen, worker_ttl, evt_atomic, cmd_atomic };
        Ok(JetStream { inner: Inner::new(client, js, config, Some(streams), None) })
    }

    /// The replica count of the streams (as found, for a client of an existing log).
    pub fn replicas(&self) -> usize {
        self.inner.config.replicas
    }

    /// The NATS client underneath (for tests and probes; the services use the [`Log`] trait).
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// The streams, unless this is an agent's restricted connection.
    fn streams(&self) -> Result<&Streams, Error> {
        self.inner.streams.as_ref().ok_or_else(|| {
            Error::Refused(
                "an agent's connection only publishes its own commands and follows its own outcomes".to_owned(),
            )
        })
    }

    fn stream(&self, name: &str) -> Result<&stream::Stream, Error> {
        let streams = self.streams()?;
        Ok(match name {
            CMD_STREAM => &streams.cmd,
            EVT_STREAM => &streams.evt,
            DLQ_STREAM => &streams.dlq,
            other => unreachable!("leasehold has no stream {other}"),
        })
    }
}

impl Log for JetStream {
    type Owner = JetStreamOwner;

    fn partitions(&self) -> u32 {
        self.inner.config.partitions
    }

    async fn publish_command(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<Published, Error> {
        let headers = self.command_headers(subject, msg_id)?;
        let message = PublishMessage::build().payload(payload).headers(headers);
        match self.publish(subject.to_owned(), message).await {
            Ok(ack) => Ok(Published { seq: ack.sequence, duplicate: ack.duplicate }),
            Err(e) => Err(publish_command_error(subject, e)),
        }
    }

    async fn publish_commands(&self, commands: &[Publish]) -> Vec<Result<Published, Error>> {
        match commands {
            [] => Vec::new(),
            [command] => vec![self.publish_command(&command.subject, &command.msg_id, command.payload.clone()).await],
            _ => self.publish_batched(commands).await,
        }
    }

    async fn read_commands(&self, partition: u32, after: u64, max: usize) -> Result<Vec<CommandRecord>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let messages = self.direct_batch(CMD_STREAM, &command_filter(partition), after.saturating_add(1), max).await?;
        Ok(messages.into_iter().map(command_record).collect())
    }

    async fn command_at(&self, seq: u64) -> Result<Option<CommandRecord>, Error> {
        if seq == 0 {
            return Ok(None);
        }
        match self.stream(CMD_STREAM)?.get_raw_message(seq).await {
            Ok(message) => Ok(Some(command_record(message))),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read command {seq}"), e)),
        }
    }

    async fn last_command_seq(&self) -> Result<u64, Error> {
        Ok(self.leader_last(CMD_STREAM, "lh.cmd.>", true).await?.unwrap_or(0))
    }

    async fn append(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        if records.is_empty() {
            return Appended::Unknown("nothing to append".to_owned());
        }
        if let Err(e) = self.streams() {
            return Appended::Unknown(e.to_string());
        }
        if partition >= self.inner.config.partitions {
            return Appended::Unknown(format!("there is no partition {partition}"));
        }
        if records.len() > crate::MAX_APPEND_RECORDS {
            return Appended::TooLarge(format!(
                "an append holds at most {} records, not {}: nothing was sent",
                crate::MAX_APPEND_RECORDS,
                records.len()
            ));
        }
        match records {
            [record] => self.append_record(partition, fence, record).await,
            _ if !self.streams().is_ok_and(|s| s.evt_atomic) => Appended::TooLarge(
                "LH_EVT does not allow atomic batches (a log made before group commit): one record per append"
                    .to_owned(),
            ),
            _ => self.append_batch(partition, fence, records).await,
        }
    }

    fn max_append_records(&self) -> usize {
        if self.streams().is_ok_and(|s| s.evt_atomic) { crate::MAX_APPEND_RECORDS } else { 1 }
    }

    async fn last_outcome_seq(&self, partition: u32) -> Result<u64, Error> {
        Ok(self.leader_last(EVT_STREAM, &outcome_filter(partition), false).await?.unwrap_or(0))
    }

    async fn read_outcomes(&self, filter: &OutcomeFilter, from: u64, max: usize) -> Result<Vec<StoredOutcome>, Error> {
        let whole = *filter == OutcomeFilter::All;
        let messages = self.read_through(EVT_STREAM, &filter.subject(), whole, from, max).await?;
        messages.into_iter().map(|m| stored_outcome(m.sequence, &m.subject, Some(&m.headers), m.payload)).collect()
    }

    fn follow(&self, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
        match (&self.inner.config.agent, &self.inner.agent_consumer) {
            (Some(agent), Some(consumer)) => {
                follow_as_agent(self.clone(), agent.clone(), consumer.clone(), filter, from)
            }
            _ => follow(self.clone(), filter, from),
        }
    }

    async fn dead_letter(&self, letter: DeadLetter) -> Result<(), Error> {
        self.streams()?;
        let letter = match letter.command_id {
            Some(_) => letter,
            None => {
                let msg_id = self.producer_msg_id(letter.source_seq).await?;
                letter.with_producer_id(msg_id.as_deref())
            }
        };
        let (subject, message) = dead_letter_message(&letter)?;
        // A duplicate is the letter stored before: done either way.
        match self.publish(subject, message).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                // A command just under `max_payload` plus the letter's headers: keep the letter without its bytes
                // rather than block the partition.
                tracing::warn!(seq = letter.source_seq, error = %e, "dead letter too large; storing it without its bytes");
                let (subject, message) = dead_letter_message(&letter.without_bytes(&e.to_string()))?;
                self.publish(subject, message)
                    .await
                    .map(|_| ())
                    .map_err(|e| unavailable("the dead letter was not acknowledged", e))
            }
            Err(e) => Err(unavailable("the dead letter was not acknowledged", e)),
        }
    }

    async fn read_dead_letters(&self, from: u64, max: usize) -> Result<Vec<(u64, DeadLetter)>, Error> {
        let messages = self.read_through(DLQ_STREAM, "lh.dlq.>", true, from, max).await?;
        messages.into_iter().map(|m| stored_dead_letter(m.sequence, &m.subject, &m.headers, m.payload)).collect()
    }

    async fn put_snapshot(&self, snapshot: Snapshot) -> Result<(), Error> {
        let mut metadata = std::collections::HashMap::new();
        metadata.insert("lh-decider-version".to_owned(), snapshot.decider_version.to_string());
        metadata.insert("lh-fence".to_owned(), snapshot.fence.to_string());
        if let Some(last) = &snapshot.last_command {
            metadata.insert("lh-last-command".to_owned(), last.clone());
        }
        let object = ObjectMetadata { name: snapshot_object(snapshot.partition), metadata, ..Default::default() };
        self.streams()?
            .snapshots
            .put(object, &mut snapshot.state.as_ref())
            .await
            .map(|_| ())
            .map_err(|e| unavailable(&format!("cannot store the snapshot of partition {}", snapshot.partition), e))
    }

    async fn latest_snapshot(&self, partition: u32) -> Result<Option<Snapshot>, Error> {
        // A snapshot replaced while it is read loses its chunks under the reader: the read notices within 100 ms
        // (`snapshot_body`) and the next try reads the newer one. Each read also gets a deadline (2 s plus 10 MB/s
        // of its size) for what it cannot notice. Three tries that stalled or were too short for the size, or ten
        // replaced under the read, and the log is unavailable for it now (the writer's load decides what next).
        let mut deadline = Duration::from_secs(2);
        let (mut missed, mut replaced) = (0, 0);
        while missed < 3 && replaced < 10 {
            match tokio::time::timeout(deadline, self.read_snapshot(partition, deadline)).await {
                Ok(Ok(read)) => return Ok(read.map(|(snapshot, _)| snapshot)),
                Ok(Err(SnapshotRead::Failed(e))) => return Err(e),
                Ok(Err(SnapshotRead::TooSlowFor(size))) => {
                    missed += 1;
                    deadline = snapshot_deadline(size);
                }
                Ok(Err(SnapshotRead::Replaced)) => {
                    replaced += 1;
                    tracing::debug!(partition, "the snapshot was replaced while read: reading the newer one");
                }
                Err(_) => {
                    missed += 1;
                    tracing::warn!(partition, "a snapshot read stalled: trying again");
                }
            }
        }
        Err(Error::Unavailable(format!(
            "the snapshot of partition {partition} could not be read (replaced while read, or stalled)"
        )))
    }

    async fn workers(&self, worker: &str, alive: bool) -> Result<Vec<String>, Error> {
        self.live_workers(worker, alive).await
    }

    fn worker_ttl(&self) -> Duration {
        self.inner.streams.as_ref().map_or(self.inner.config.priority_timeout, |s| s.worker_ttl)
    }

    async fn is_served(&self, partition: u32) -> Result<bool, Error> {
        let info = self.writer_consumer(partition).await?;
        Ok(pinned_client(&info).is_some() || (info.num_pending == 0 && info.num_ack_pending == 0))
    }

    async fn own(&self, partition: u32, worker: &str) -> Result<Option<JetStreamOwner>, Error> {
        self.own_partition(partition, worker).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_consumer_is_named_by_its_secret() {
        // SHA-256("leasehold agent consumer\0res-a\0pw"), computed apart from this code (Python's hashlib).
        assert_eq!(agent_consumer("res-a", Some("pw")), "lh-agent-res-a-082917c2630fa3e619743c5de36cdb0a");
        assert_eq!(agent_consumer("res-a", None), "lh-agent-res-a");
        // Another secret, or the same secret of another agent, is another name.
        assert_ne!(agent_consumer("res-a", Some("pw2")), agent_consumer("res-a", Some("pw")));
        assert_ne!(agent_consumer("res-b", Some("pw")).replace("res-b", "res-a"), agent_consumer("res-a", Some("pw")));
        // The longest agent name (63 characters) gives 105, well under the server's 255.
        let longest = "a".repeat(63);
        assert_eq!(agent_consumer(&longest, Some("pw")).len(), 105);
        assert!(is_token(&agent_consumer(&longest, Some("pw"))));
    }

    #[test]
    fn credentials_do_not_print() {
        let credentials = Credentials::UserPassword { user: "lh".to_owned(), password: "secret".to_owned() };
        assert!(!format!("{credentials:?}").contains("secret"));
    }
}
