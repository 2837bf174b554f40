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

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PriorityPolicy};
use async_nats::jetstream::context::{
    ConsumerInfoErrorKind, Context, ContextBuilder, CreateStreamErrorKind, GetStreamErrorKind, ObjectStoreErrorKind,
    PublishError, PublishErrorKind,
};
use async_nats::jetstream::message::{PublishMessage, StreamMessage};
use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind, RetentionPolicy, StorageType, SubjectTransform};
use async_nats::{HeaderMap, HeaderValue, ServerAddr, StatusCode, Subject};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use leasehold_schemas::Timestamp;
use leasehold_schemas::subjects::{command_filter, outcome_filter, partition_transform};
use tokio::time::Instant;

#[cfg(feature = "embedded")]
mod bench;
mod workers;

use crate::reading::{Delivery, Next, Reader};
use crate::{
    Appended, CommandRecord, DeadLetter, Error, HEADER_BATCH_INDEX, HEADER_CMD_ID, HEADER_CMD_SEQ,
    HEADER_DLQ_PRODUCER_ID, HEADER_DLQ_REASON, HEADER_DLQ_SOURCE_SEQ, HEADER_DLQ_SOURCE_SUBJECT, HEADER_PART,
    HEADER_PREV_SEQ, LetterId, Log, OutcomeFilter, OutcomeRecord, Owner, Publish, Published, Snapshot, StoredOutcome,
    fence_headers, outcome_msg_id,
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

/// How long a serving process waits for the server to allow atomic batches on a stream made before group commit.
const UPGRADE_WAIT: Duration = Duration::from_secs(2);

/// The most messages one direct get asks for.
const DIRECT_BATCH: usize = 1024;
/// The most deliveries one pull of a writer consumer asks for.
const PULL_BATCH: usize = 512;
/// Pulls a writer keeps waiting at once: the next is sent when what the waiting ones may still bring falls below a
/// pull's batch, so deliveries keep coming while the writer decides and appends.
const PULLS_IN_FLIGHT: usize = 2;
/// Deliveries a writer consumer sends before it waits for an ack: a few rounds of the largest append.
const MAX_ACK_PENDING: i64 = 4 * crate::MAX_APPEND_RECORDS as i64;

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

    /// Up to `max` stored outcomes from sequence `from`, each as its sequence, subject and headers as the server
    /// keeps them (the batch headers included): for tests and audits that check what is on the wire.
    pub async fn stored_outcome_headers(
        &self,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, String, BTreeMap<String, String>)>, Error> {
        let messages = self.direct_batch(EVT_STREAM, "lh.evt.>", from, max).await?;
        Ok(messages
            .into_iter()
            .map(|message| {
                let headers = message
                    .headers
                    .iter()
                    .filter_map(|(name, values)| Some((name.to_string(), values.last()?.as_str().to_owned())))
                    .collect();
                (message.sequence, message.subject.to_string(), headers)
            })
            .collect())
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

    /// Up to `max` messages of `stream` matching `filter` from sequence `from`, in order, from any replica (a
    /// batched direct get).
    async fn direct_batch(
        &self,
        stream: &str,
        filter: &str,
        from: u64,
        max: usize,
    ) -> Result<Vec<StreamMessage>, Error> {
        // An agent's user may not read the streams but through its own consumer.
        self.streams()?;
        let client = &self.inner.client;
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(inbox.clone()).await.map_err(|e| unavailable("cannot subscribe", e))?;
        let request = serde_json::json!({ "seq": from.max(1), "next_by_subj": filter, "batch": max.min(DIRECT_BATCH) });
        client
            .publish_with_reply(format!("$JS.API.DIRECT.GET.{stream}"), inbox, Bytes::from(request.to_string()))
            .await
            .map_err(|e| unavailable("cannot ask for messages", e))?;
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let mut out = Vec::new();
        loop {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Err(Error::Unavailable("the connection closed during a read".to_owned())),
                Err(_) => {
                    return Err(Error::Unavailable(format!("{stream} did not answer a read of {filter} in time")));
                }
            };
            match reply.status {
                None | Some(StatusCode::OK) => {
                    let message = StreamMessage::try_from(reply)
                        .map_err(|e| Error::Storage(format!("a message of {stream} could not be read: {e}")))?;
                    out.push(message);
                }
                // The end of the batch, or nothing to read.
                Some(status) if status == 204 || status == StatusCode::NOT_FOUND => return Ok(out),
                Some(StatusCode::NO_RESPONDERS) => {
                    return Err(Error::Unavailable(format!("no server answers direct reads of {stream}")));
                }
                Some(status) => {
                    return Err(Error::Unavailable(format!(
                        "a read of {filter} in {stream} failed: {status} {}",
                        reply.description.unwrap_or_default()
                    )));
                }
            }
        }
    }

    /// The sequence of the last message of `stream` matching `filter`, read from the stream leader. `whole`: the
    /// filter takes every subject of the stream (the stream's last sequence answers at once).
    async fn leader_last(&self, stream: &str, filter: &str, whole: bool) -> Result<Option<u64>, Error> {
        let stream = self.stream(stream)?;
        if whole {
            let info = stream.get_info().await.map_err(|e| unavailable("cannot read the stream state", e))?;
            return Ok((info.state.last_sequence > 0).then_some(info.state.last_sequence));
        }
        match stream.get_last_raw_message_by_subject(filter).await {
            Ok(message) => Ok(Some(message.sequence)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read the last message of {filter}"), e)),
        }
    }

    /// The first message of `stream` matching `filter` at or after `seq`, read from the stream leader.
    async fn leader_next(&self, stream: &str, filter: &str, seq: u64) -> Result<Option<StreamMessage>, Error> {
        match self.stream(stream)?.get_first_raw_message_by_subject(filter, seq.max(1)).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read {filter} from {seq}"), e)),
        }
    }

    /// Up to `max` messages of `stream` matching `filter` from `from`, in order, at least up to the leader's last
    /// matching message when fewer than `max`: a replica's answer, completed from the leader if the replica lags.
    async fn read_through(
        &self,
        stream: &str,
        filter: &str,
        whole: bool,
        from: u64,
        max: usize,
    ) -> Result<Vec<StreamMessage>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut out = self.direct_batch(stream, filter, from, max).await?;
        if out.len() >= max.min(DIRECT_BATCH) {
            return Ok(out);
        }
        let Some(last) = self.leader_last(stream, filter, whole).await? else { return Ok(out) };
        let mut next = out.last().map_or(from.max(1), |m| m.sequence + 1);
        while next <= last && out.len() < max {
            let Some(message) = self.leader_next(stream, filter, next).await? else { break };
            next = message.sequence + 1;
            out.push(message);
        }
        Ok(out)
    }

    async fn publish(
        &self,
        subject: String,
        message: PublishMessage,
    ) -> Result<async_nats::jetstream::publish::PublishAck, PublishError> {
        self.inner.js.send_publish(subject, message).await?.await
    }

    /// The headers of a command published on `subject` (its id as `Nats-Msg-Id`), or why it cannot be published.
    fn command_headers(&self, subject: &str, msg_id: &str) -> Result<HeaderMap, Error> {
        let tokens: Vec<&str> = subject.split('.').collect();
        let ["lh", "in", class, key, id] = tokens.as_slice() else {
            return Err(Error::Refused(format!(
                "no stream takes subject {subject:?} (commands go to lh.in.<class>.<key>.<id>)"
            )));
        };
        if ![class, key, id].iter().all(|t| is_token(t)) {
            return Err(Error::Refused(format!("{subject:?} is not a valid subject to publish on")));
        }
        if msg_id.is_empty() {
            return Err(Error::Refused("a command needs an id".to_owned()));
        }
        if let Some(agent) = &self.inner.config.agent
            && (*class != "agent" || key != agent)
        {
            // Its credentials would not let it: say so rather than wait for an answer that never comes.
            return Err(Error::Refused(format!(
                "agent {agent} publishes only on lh.in.agent.{agent}.>, not {subject}"
            )));
        }
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, header_value("Nats-Msg-Id", msg_id)?);
        Ok(headers)
    }

    /// Publishes the commands at `chosen` (their indexes in `commands`, with their headers) each alone, all of them
    /// in flight at once (each deduplicated by its own id), and puts each answer at its index.
    async fn publish_one_by_one(
        &self,
        commands: &[Publish],
        chosen: &[(usize, HeaderMap)],
        answers: &mut [Option<Result<Published, Error>>],
    ) {
        let mut pending = Vec::with_capacity(chosen.len());
        for (i, headers) in chosen {
            let command = &commands[*i];
            let message = PublishMessage::build().payload(command.payload.clone()).headers(headers.clone());
            pending.push(self.inner.js.send_publish(command.subject.clone(), message).await);
        }
        for ((i, _), sent) in chosen.iter().zip(pending) {
            let subject = &commands[*i].subject;
            answers[*i] = Some(
                match sent {
                    Ok(ack) => ack.await.map_err(|e| publish_command_error(subject, e)),
                    Err(e) => Err(publish_command_error(subject, e)),
                }
                .map(|ack| Published { seq: ack.sequence, duplicate: ack.duplicate }),
            );
        }
    }

    /// The subject and headers of an outcome record: the ids, and its place in the partition's chain.
    fn outcome_headers(partition: u32, record: &OutcomeRecord, place: Place) -> Result<(String, HeaderMap), Error> {
        if !is_token(&record.key) {
            return Err(Error::Refused(format!("{:?} is not a subject token", record.key)));
        }
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_CMD_ID, header_value(HEADER_CMD_ID, &record.cmd_id)?);
        headers.insert(HEADER_CMD_SEQ, record.cmd_seq.to_string());
        headers.insert(HEADER_PART, record.part.to_string());
        match place {
            Place::First { fence } => {
                headers.insert(HEADER_PREV_SEQ, fence.to_string());
                for (name, value) in fence_headers(partition, fence) {
                    headers.insert(name, value);
                }
            }
            Place::Later { index } => headers.insert(HEADER_BATCH_INDEX, index.to_string()),
            Place::Unfenced { prev } => headers.insert(HEADER_PREV_SEQ, prev.to_string()),
        }
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            outcome_msg_id(partition, record.cmd_seq, record.part).as_str(),
        );
        Ok((format!("lh.evt.{partition}.{}", record.key), headers))
    }

    /// Publishes one outcome record under the fence.
    async fn append_record(&self, partition: u32, fence: u64, record: &OutcomeRecord) -> Appended {
        let (subject, headers) = match Self::outcome_headers(partition, record, Place::First { fence }) {
            Ok(message) => message,
            Err(e) => return Appended::Unknown(e.to_string()),
        };
        let message = PublishMessage::build().payload(record.payload.clone()).headers(headers);
        match self.publish(subject, message).await {
            Ok(ack) if ack.duplicate => Appended::Unknown(format!(
                "duplicate outcome {}: stored at {}",
                outcome_msg_id(partition, record.cmd_seq, record.part),
                ack.sequence
            )),
            Ok(ack) => Appended::Landed { first: ack.sequence, last: ack.sequence },
            Err(e) => append_error(&e),
        }
    }

    /// Publishes `records` as one ADR-50 atomic batch: the fence on the first message only, `Lh-Batch-Index` on
    /// the rest. The server checks the fence against the stream as it was before the batch and stores all of it,
    /// contiguously, or nothing.
    async fn append_batch(&self, partition: u32, fence: u64, records: &[OutcomeRecord]) -> Appended {
        let mut messages = Vec::with_capacity(records.len());
        for (index, record) in records.iter().enumerate() {
            let place = if index == 0 { Place::First { fence } } else { Place::Later { index } };
            match Self::outcome_headers(partition, record, place) {
                Ok((subject, headers)) => messages.push((subject, headers, record.payload.clone())),
                Err(e) => return Appended::Unknown(e.to_string()),
            }
        }
        match self.atomic_batch(messages).await {
            Ok(last) => Appended::Landed { first: last + 1 - records.len() as u64, last },
            Err(BatchFailed::Refused { code, description, first }) => batch_refusal(code, &description, first),
            Err(BatchFailed::TooLarge(why)) => Appended::TooLarge(why),
            Err(BatchFailed::Unknown(why)) => Appended::Unknown(why),
        }
    }

    /// Sends `messages` (subject, headers, payload) as one ADR-50 atomic batch and answers the sequence of its last
    /// message once stored: the batch is stored contiguously, so message `i` of `n` is at `last + 1 - n + i`.
    /// Only the first message and the commit ask for an answer, so the batch costs one round trip; a refused first
    /// message (too many open batches) never opened the batch, and the server drops the rest of it.
    async fn atomic_batch(&self, messages: Vec<(String, HeaderMap, Bytes)>) -> Result<u64, BatchFailed> {
        let client = &self.inner.client;
        let n = messages.len();
        // A message the server would refuse for its size must not go out half-way through a batch: the batch would
        // stay open until the server's timeout, holding one of the few open batches a stream allows.
        let max_payload = client.server_info().max_payload;
        for (i, (_, headers, payload)) in messages.iter().enumerate() {
            // As the client counts it: "NATS/1.0\r\n", "<name>: <value>\r\n" per value, "\r\n"; plus the batch headers.
            let header_bytes: usize = headers
                .iter()
                .map(|(name, values)| {
                    values.iter().map(|v| AsRef::<str>::as_ref(name).len() + v.as_str().len() + 4).sum::<usize>()
                })
                .sum();
            let size = payload.len() + header_bytes + 12 + BATCH_HEADER_BYTES;
            if max_payload > 0 && size > max_payload {
                return Err(BatchFailed::TooLarge(format!(
                    "message {} of the batch would be about {size} bytes with its headers, over the server's \
                     max_payload of {max_payload}",
                    i + 1
                )));
            }
        }
        let inbox = client.new_inbox();
        let batch = inbox.rsplit('.').next().unwrap_or("batch").to_owned();
        let mut replies = client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| BatchFailed::Unknown(format!("cannot take answers to a batch: {e}")))?;
        for (i, (subject, mut headers, payload)) in messages.into_iter().enumerate() {
            headers.insert(async_nats::header::NATS_BATCH_ID, batch.as_str());
            headers.insert(async_nats::header::NATS_BATCH_SEQUENCE, (i + 1).to_string());
            let sent = if i + 1 == n {
                headers.insert(async_nats::header::NATS_BATCH_COMMIT, async_nats::header::NATS_BATCH_COMMIT_FINAL);
                client.publish_with_reply_and_headers(subject, format!("{inbox}.commit"), headers, payload).await
            } else if i == 0 {
                client.publish_with_reply_and_headers(subject, format!("{inbox}.first"), headers, payload).await
            } else {
                client.publish_with_headers(subject, headers, payload).await
            };
            sent.map_err(|e| BatchFailed::Unknown(format!("batch {batch}: message {} not sent: {e}", i + 1)))?;
        }
        let deadline = Instant::now() + self.inner.config.request_timeout;
        loop {
            let reply = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => {
                    return Err(BatchFailed::Unknown(format!(
                        "the connection closed before batch {batch} was answered"
                    )));
                }
                Err(_) => {
                    return Err(BatchFailed::Unknown(format!(
                        "batch {batch} of {n} messages was not answered in {:?}",
                        self.inner.config.request_timeout
                    )));
                }
            };
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return Err(BatchFailed::Unknown(format!("no stream takes batch {batch}: nothing stored")));
            }
            let commit = reply.subject.ends_with(".commit");
            match batch_answer(&reply.payload) {
                // The first message was staged: wait for the commit.
                BatchAnswer::Taken if !commit => {}
                BatchAnswer::Stored { seq, count, id } if commit => {
                    if id.as_deref() != Some(batch.as_str()) || count != n as u64 || seq < count {
                        return Err(BatchFailed::Unknown(format!(
                            "batch {batch} of {n} messages was answered for batch {id:?} of {count} at {seq}"
                        )));
                    }
                    return Ok(seq);
                }
                BatchAnswer::Refused { code, description } => {
                    return Err(BatchFailed::Refused {
                        code,
                        description: format!("batch {batch}: {description}"),
                        first: !commit,
                    });
                }
                other => return Err(BatchFailed::Unknown(format!("batch {batch}: unexpected answer {other:?}"))),
            }
        }
    }

    /// Publishes commands as atomic batches of up to [`crate::MAX_APPEND_RECORDS`]: one fsync per batch under
    /// `sync_interval: always`, and every command's sequence from the one acknowledgement. A batch the server
    /// refuses whole (one id already stored, which is how a retry looks: 10201; too many open batches) or does
    /// not answer stores nothing or everything, so it is published again command by command, where each id's
    /// dedupe answers for itself (a duplicate names the first copy).
    async fn publish_batched(&self, commands: &[Publish]) -> Vec<Result<Published, Error>> {
        let mut answers: Vec<Option<Result<Published, Error>>> = vec![None; commands.len()];
        let mut valid = Vec::new();
        for (i, command) in commands.iter().enumerate() {
            match self.command_headers(&command.subject, &command.msg_id) {
                Ok(headers) => valid.push((i, headers)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        // LH_CMD made before batched ingest and not upgraded yet: all of them one by one.
        let atomic = self.streams().is_ok_and(|s| s.cmd_atomic);
        let cap = if atomic { self.inner.ingest_cap.load(Ordering::Relaxed).max(1) } else { valid.len().max(1) };
        for chunk in valid.chunks(cap) {
            let stored = if atomic {
                let messages = chunk
                    .iter()
                    .map(|(i, headers)| (commands[*i].subject.clone(), headers.clone(), commands[*i].payload.clone()))
                    .collect();
                self.atomic_batch(messages).await
            } else {
                Err(BatchFailed::TooLarge("LH_CMD does not allow atomic batches".to_owned()))
            };
            match stored {
                Ok(last) => {
                    let first = last + 1 - chunk.len() as u64;
                    for (k, (i, _)) in chunk.iter().enumerate() {
                        answers[*i] = Some(Ok(Published { seq: first + k as u64, duplicate: false }));
                    }
                }
                Err(failed) => {
                    if matches!(&failed, BatchFailed::Refused { code, .. }
                        if ErrorCode(*code) == ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH)
                    {
                        self.inner.ingest_cap.store((chunk.len() / 2).max(1), Ordering::Relaxed);
                    }
                    // Refused whole, too large, or not answered: nothing of it is stored, or all of it. A command
                    // whose batch was stored but not answered comes back `duplicate` with the sequence the batch
                    // gave it: stored once, though this call stored it.
                    tracing::debug!(?failed, commands = chunk.len(), "a command batch did not land whole; one by one");
                    self.publish_one_by_one(commands, chunk, &mut answers).await;
                }
            }
        }
        answers.into_iter().map(|a| a.unwrap_or_else(|| Err(Error::Unavailable("not published".to_owned())))).collect()
    }
}

/// Why an atomic batch was not stored: refused by the server (nothing stored), not sent for a message too large,
/// or no clean answer.
#[derive(Debug)]
enum BatchFailed {
    Refused { code: u64, description: String, first: bool },
    TooLarge(String),
    Unknown(String),
}

/// Bytes the batch headers add to a message (`Nats-Batch-Id` of 22 characters, `Nats-Batch-Sequence` of up to four
/// digits, `Nats-Batch-Commit`), rounded up.
const BATCH_HEADER_BYTES: usize = 128;

/// Where an outcome record stands in its append.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// The first record: chained on the fence, which it carries.
    First { fence: u64 },
    /// A later record of an atomic batch: the record stored just before it is its predecessor.
    Later { index: usize },
    /// Chained on `prev` without a fence: the benchmark's loads, on a stream nothing else writes to (the benchmarks
    /// come with feature `embedded`).
    #[cfg_attr(not(feature = "embedded"), allow(dead_code))]
    Unfenced { prev: u64 },
}

/// What the server answered to a message of an atomic batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchAnswer {
    /// The first message was taken (an empty answer).
    Taken,
    /// The batch was stored: the commit's acknowledgement.
    Stored {
        seq: u64,
        count: u64,
        id: Option<String>,
    },
    Refused {
        code: u64,
        description: String,
    },
    Garbled(String),
}

pub(crate) fn batch_answer(payload: &[u8]) -> BatchAnswer {
    if payload.is_empty() {
        return BatchAnswer::Taken;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return BatchAnswer::Garbled(String::from_utf8_lossy(payload).into_owned());
    };
    if let Some(error) = value.get("error") {
        return BatchAnswer::Refused {
            code: error.get("err_code").and_then(serde_json::Value::as_u64).unwrap_or(0),
            description: error.get("description").and_then(serde_json::Value::as_str).unwrap_or("").to_owned(),
        };
    }
    match (value.get("seq").and_then(serde_json::Value::as_u64), value.get("count").and_then(serde_json::Value::as_u64))
    {
        (Some(seq), Some(count)) => BatchAnswer::Stored {
            seq,
            count,
            id: value.get("batch").and_then(serde_json::Value::as_str).map(str::to_owned),
        },
        _ => BatchAnswer::Garbled(value.to_string()),
    }
}

/// What a refused atomic batch means: [`refused_append`] of its code, saying which message was refused (a refused
/// first message never opened the batch).
pub(crate) fn batch_refusal(code: u64, description: &str, first: bool) -> Appended {
    let which = if first { "first message" } else { "commit" };
    refused_append(ErrorCode(code), &format!("{which} refused ({code}): {description}"))
}

/// What the server's refusal of an append (one record, or an atomic batch) means, as DESIGN section 3 says; `text`
/// is its message. Nothing was stored in any case:
/// - a stale fence (10071) names the partition's last sequence: reload;
/// - in flight on a replicated stream (10164), not ready after a leader change (10163), too many open batches
///   (10210): busy, the same append again;
/// - a batch over the server's `max_msgs` (10199), or atomic batches turned off on the stream since we connected
///   (10174): too large, smaller appends land, down to one record;
/// - anything else says something unexpected: unknown, reload.
fn refused_append(code: ErrorCode, text: &str) -> Appended {
    match code {
        ErrorCode::STREAM_WRONG_LAST_SEQUENCE => {
            Appended::Stale { last: sequence_after(text, "wrong last sequence: ") }
        }
        ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
        | ErrorCode::STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_NOT_READY
        | ErrorCode::ATOMIC_PUBLISH_TOO_MANY_INFLIGHT => Appended::Busy(text.to_owned()),
        ErrorCode::ATOMIC_PUBLISH_TOO_LARGE_BATCH | ErrorCode::ATOMIC_PUBLISH_DISABLED => {
            Appended::TooLarge(text.to_owned())
        }
        _ => Appended::Unknown(text.to_owned()),
    }
}

/// Creates the stream `wanted`, or checks the one there.
async fn ensure_stream(js: &Context, wanted: stream::Config, upgrade: bool) -> Result<stream::Stream, Error> {
    let name = wanted.name.clone();
    for _ in 0..2 {
        match js.get_stream(&name).await {
            Ok(stream) => {
                let got = &stream.cached_info().config;
                check_stream(&wanted, got)?;
                if upgrade && wanted.allow_atomic_publish && !got.allow_atomic_publish {
                    return allow_atomic_batches(js, stream).await;
                }
                return Ok(stream);
            }
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                _ => return Err(unavailable(&format!("cannot read stream {name}"), e)),
            },
        }
        match js.create_stream(wanted.clone()).await {
            Ok(stream) => {
                tracing::info!(stream = %name, "created the stream");
                return Ok(stream);
            }
            // Another process created it meanwhile: check theirs.
            Err(e)
                if matches!(e.kind(), CreateStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NAME_EXIST) => {}
            Err(e) => {
                return Err(match e.kind() {
                    CreateStreamErrorKind::JetStream(js) if js.error_code() != ErrorCode::CLUSTER_NOT_AVAILABLE => {
                        Error::Refused(format!("cannot create stream {name}: {e}"))
                    }
                    _ => unavailable(&format!("cannot create stream {name}"), e),
                });
            }
        }
    }
    Err(Error::Unavailable(format!("stream {name} was created and deleted while we looked")))
}

/// Allows atomic batches on `stream`, made before group commit: an addition the server allows on a live stream,
/// and nothing else changes. A user not allowed to update streams (a worker's credentials) gets no answer at all (a
/// permission violation), so the wait is short: it goes on with the stream as it is, and the log appends one record
/// at a time (connect warns).
async fn allow_atomic_batches(js: &Context, stream: stream::Stream) -> Result<stream::Stream, Error> {
    let name = stream.cached_info().config.name.clone();
    let config = stream::Config { allow_atomic_publish: true, ..stream.cached_info().config.clone() };
    match tokio::time::timeout(UPGRADE_WAIT, js.update_stream(config)).await {
        Ok(Ok(_)) => {
            tracing::info!(stream = %name, "allowed atomic batches on the stream");
            js.get_stream(&name).await.map_err(|e| unavailable(&format!("cannot read stream {name}"), e))
        }
        Ok(Err(e)) => {
            tracing::warn!(stream = %name, error = %e, "cannot allow atomic batches on the stream");
            Ok(stream)
        }
        Err(_) => {
            tracing::warn!(stream = %name, "no answer in {UPGRADE_WAIT:?} to allowing atomic batches (no permission?)");
            Ok(stream)
        }
    }
}

/// The partition and replica counts of the log on this server, read from `LH_CMD`'s transform; refused when there
/// is no log yet (only `serve` creates one, with the partition count it is told).
async fn existing_log(js: &Context) -> Result<(u32, usize), Error> {
    let stream = match js.get_stream(CMD_STREAM).await {
        Ok(stream) => stream,
        Err(e) => {
            return Err(match e.kind() {
                GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => Error::Refused(
                    "there is no leasehold log on this NATS server yet: `leasehold serve --nats URL` creates it"
                        .to_owned(),
                ),
                _ => unavailable(&format!("cannot read stream {CMD_STREAM}"), e),
            });
        }
    };
    let config = &stream.cached_info().config;
    let partitions = config
        .subject_transform
        .as_ref()
        .and_then(|t| t.destination.split_once("partition(")?.1.split_once(',')?.0.parse::<u32>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            Error::Refused(format!("stream {CMD_STREAM} has no partition transform: it is not leasehold's"))
        })?;
    Ok((partitions, config.num_replicas.max(1)))
}

/// The snapshot bucket, created when missing.
async fn snapshot_bucket(js: &Context, replicas: usize) -> Result<ObjectStore, Error> {
    match js.get_object_store(SNAPSHOT_BUCKET).await {
        Ok(store) => return Ok(store),
        Err(e) if e.kind() == ObjectStoreErrorKind::GetStore => {}
        Err(e) => return Err(unavailable("cannot open the snapshot bucket", e)),
    }
    let config = object_store::Config {
        bucket: SNAPSHOT_BUCKET.to_owned(),
        description: Some("leasehold: the latest snapshot of each partition".to_owned()),
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    match js.create_object_store(config).await {
        Ok(store) => Ok(store),
        // Another process created it meanwhile.
        Err(_) => {
            js.get_object_store(SNAPSHOT_BUCKET).await.map_err(|e| unavailable("cannot create the snapshot bucket", e))
        }
    }
}

fn snapshot_object(partition: u32) -> String {
    format!("partition-{partition}")
}

/// What a failed command publish means: refused (too large, or refused by the server) or unavailable.
fn publish_command_error(subject: &str, e: PublishError) -> Error {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => Error::Refused(format!("the command is too large: {e}")),
        PublishErrorKind::StreamNotFound => Error::Unavailable(format!("no stream takes {subject}: {e}")),
        PublishErrorKind::Other => match std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
            .map(async_nats::jetstream::Error::error_code)
        {
            Some(code) if in_process_elsewhere(code) => {
                Error::Unavailable(format!("the command is being stored by an earlier publish of it: {e}"))
            }
            Some(_) => Error::Refused(format!("the log refused the command: {e}")),
            None => unavailable("the command was not acknowledged", e),
        },
        _ => unavailable("the command was not acknowledged", e),
    }
}

/// A refusal that only says another publish of the same command id is being stored right now (a retry sent while
/// the first attempt's answer is late): sending it again later gets the first copy's answer, a duplicate.
fn in_process_elsewhere(code: ErrorCode) -> bool {
    code == ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT
}

/// What a refused or failed outcome publish means: a server's refusal as [`refused_append`] says, anything else
/// (a timeout, a lost connection) unknown.
fn append_error(e: &PublishError) -> Appended {
    let server = std::error::Error::source(e).and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>());
    let text = server.map_or_else(|| e.to_string(), ToString::to_string);
    match (e.kind(), server) {
        (PublishErrorKind::WrongLastSequence, _) => refused_append(ErrorCode::STREAM_WRONG_LAST_SEQUENCE, &text),
        (_, Some(server)) => refused_append(server.error_code(), &text),
        _ => Appended::Unknown(e.to_string()),
    }
}

/// The number after the last `marker` in `text`.
pub(crate) fn sequence_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.rfind(marker)? + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// What the three streams share: limits retention on file, direct gets, the replica count.
fn stream_config(name: &str, subjects: &str, duplicate_window: Duration, replicas: usize) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects.to_owned()],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        duplicate_window,
        allow_direct: true,
        num_replicas: replicas,
        ..Default::default()
    }
}

fn cmd_stream_config(partitions: u32, replicas: usize) -> stream::Config {
    let (source, destination) = partition_transform(partitions);
    stream::Config {
        // Batched ingest: commands published together are one atomic batch (one fsync, every sequence known).
        allow_atomic_publish: true,
        subject_transform: Some(SubjectTransform { source: source.clone(), destination }),
        max_age: COMMAND_RETENTION,
        deny_delete: true,
        deny_purge: true,
        ..stream_config(CMD_STREAM, &source, COMMAND_DUPLICATE_WINDOW, replicas)
    }
}

fn evt_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        deny_delete: true,
        deny_purge: true,
        // Group commit: a writer's appends of several records are ADR-50 atomic batches.
        allow_atomic_publish: true,
        ..stream_config(EVT_STREAM, "lh.evt.>", OUTCOME_DUPLICATE_WINDOW, replicas)
    }
}

fn dlq_stream_config(replicas: usize) -> stream::Config {
    stream_config(DLQ_STREAM, "lh.dlq.>", DEAD_LETTER_DUPLICATE_WINDOW, replicas)
}

/// Refuses a stream that differs from what leasehold creates in anything leasehold set.
fn check_stream(wanted: &stream::Config, got: &stream::Config) -> Result<(), Error> {
    let name = &wanted.name;
    if wanted.subject_transform != got.subject_transform {
        let count = |t: &Option<SubjectTransform>| {
            t.as_ref().and_then(|t| t.destination.split_once("partition(")?.1.split_once(',')?.0.parse::<u32>().ok())
        };
        if let (Some(theirs), Some(ours)) = (count(&got.subject_transform), count(&wanted.subject_transform)) {
            return Err(Error::Refused(format!(
                "stream {name} was created for {theirs} partitions, not {ours}: the partition count is fixed when \
                 the log is created"
            )));
        }
    }
    let mut differences = Vec::new();
    let mut differ = |field: &str, theirs: String, ours: String| {
        if theirs != ours {
            differences.push(format!("{field} is {theirs}, leasehold needs {ours}"));
        }
    };
    differ("subjects", format!("{:?}", got.subjects), format!("{:?}", wanted.subjects));
    differ(
        "subject_transform",
        format!("{:?}", got.subject_transform.as_ref().map(|t| (&t.source, &t.destination))),
        format!("{:?}", wanted.subject_transform.as_ref().map(|t| (&t.source, &t.destination))),
    );
    differ("retention", format!("{:?}", got.retention), format!("{:?}", wanted.retention));
    differ("storage", format!("{:?}", got.storage), format!("{:?}", wanted.storage));
    differ("max_age", format!("{:?}", got.max_age), format!("{:?}", wanted.max_age));
    differ("deny_delete", got.deny_delete.to_string(), wanted.deny_delete.to_string());
    differ("deny_purge", got.deny_purge.to_string(), wanted.deny_purge.to_string());
    differ("duplicate_window", format!("{:?}", got.duplicate_window), format!("{:?}", wanted.duplicate_window));
    differ("allow_direct", got.allow_direct.to_string(), wanted.allow_direct.to_string());
    differ("num_replicas", got.num_replicas.to_string(), wanted.num_replicas.to_string());
    if differences.is_empty() {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "stream {name} is not as leasehold creates it: {}; change it back or remove it",
            differences.join("; ")
        )))
    }
}

/// Log time: the stored message's timestamp in Unix milliseconds.
fn log_time(message: &StreamMessage) -> Timestamp {
    let ms = message.time.unix_timestamp_nanos() / 1_000_000;
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

fn command_record(message: StreamMessage) -> CommandRecord {
    CommandRecord {
        seq: message.sequence,
        time: log_time(&message),
        subject: message.subject.to_string(),
        payload: message.payload,
    }
}

fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers?.get_last(name).map(HeaderValue::as_str)
}

/// An outcome as stored, or `Refused` naming its sequence and what is missing.
pub(crate) fn stored_outcome(
    seq: u64,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
) -> Result<StoredOutcome, Error> {
    let refused = |what: &str| Error::Refused(format!("outcome {seq} on {subject:?} is not leasehold's: {what}"));
    let (partition, key) = subject
        .strip_prefix("lh.evt.")
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(p, key)| Some((p.parse::<u32>().ok()?, key)))
        .ok_or_else(|| refused("its subject is not lh.evt.<p>.<key>"))?;
    let number = |name: &str| -> Result<u64, Error> {
        header(headers, name).and_then(|v| v.parse().ok()).ok_or_else(|| refused(&format!("no valid {name} header")))
    };
    Ok(StoredOutcome {
        seq,
        partition,
        key: key.to_owned(),
        cmd_id: header(headers, HEADER_CMD_ID)
            .ok_or_else(|| refused(&format!("no {HEADER_CMD_ID} header")))?
            .to_owned(),
        cmd_seq: number(HEADER_CMD_SEQ)?,
        part: u32::try_from(number(HEADER_PART)?).map_err(|_| refused(&format!("no valid {HEADER_PART} header")))?,
        // A later record of an atomic batch names its index instead: the batch is stored contiguously, so its
        // predecessor is the message just before it (which the folds check is the partition's previous outcome).
        prev_seq: match (header(headers, HEADER_PREV_SEQ), header(headers, HEADER_BATCH_INDEX)) {
            (None, Some(index)) if index.parse::<u64>().is_ok_and(|i| i > 0) && seq > 1 => seq - 1,
            _ => number(HEADER_PREV_SEQ)?,
        },
        payload,
    })
}

/// A dead letter as stored, or `Refused` naming its sequence and what is missing.
pub(crate) fn stored_dead_letter(
    seq: u64,
    subject: &str,
    headers: &HeaderMap,
    payload: Bytes,
) -> Result<(u64, DeadLetter), Error> {
    let refused = |what: &str| Error::Refused(format!("dead letter {seq} on {subject} is not leasehold's: {what}"));
    let headers = Some(headers);
    let partition = subject
        .split('.')
        .nth(2)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| refused("its subject is not lh.dlq.<p>...."))?;
    let letter = DeadLetter {
        partition,
        source_seq: header(headers, HEADER_DLQ_SOURCE_SEQ)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| refused(&format!("no valid {HEADER_DLQ_SOURCE_SEQ} header")))?,
        source_subject: header(headers, HEADER_DLQ_SOURCE_SUBJECT)
            .ok_or_else(|| refused(&format!("no {HEADER_DLQ_SOURCE_SUBJECT} header")))?
            .to_owned(),
        reason: header(headers, HEADER_DLQ_REASON).unwrap_or_default().to_owned(),
        // A letter stored before ids were recorded has neither header: its payload's header names it, if anything.
        command_id: match (header(headers, HEADER_CMD_ID), header(headers, HEADER_DLQ_PRODUCER_ID)) {
            (Some(id), _) => Some(LetterId { id: id.to_owned(), verified: true }),
            (None, Some(id)) => Some(LetterId { id: id.to_owned(), verified: false }),
            (None, None) => LetterId::read_from(&payload),
        },
        payload,
    };
    Ok((seq, letter))
}

impl JetStream {
    /// The `Nats-Msg-Id` command `seq` was published under, if the command log still holds it and it had one.
    async fn producer_msg_id(&self, seq: u64) -> Result<Option<String>, Error> {
        match self.stream(CMD_STREAM)?.get_raw_message(seq).await {
            Ok(message) => Ok(header(Some(&message.headers), "Nats-Msg-Id").map(str::to_owned)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(&format!("cannot read command {seq} for the id it was published under"), e)),
        }
    }

    /// The latest snapshot of `partition`, read without a deadline (see [`Log::latest_snapshot`]), with its size.
    async fn read_snapshot(
        &self,
        partition: u32,
        deadline: Duration,
    ) -> Result<Option<(Snapshot, usize)>, SnapshotRead> {
        use tokio::io::AsyncReadExt;
        let name = snapshot_object(partition);
        let snapshots = &self.streams().map_err(SnapshotRead::Failed)?.snapshots;
        let mut object = match snapshots.get(&name).await {
            Ok(object) => object,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(SnapshotRead::Failed(unavailable(
                    &format!("cannot read the snapshot of partition {partition}"),
                    e,
                )));
            }
        };
        let size = object.info().size;
        if snapshot_deadline(size) > deadline {
            // Too large to read in this try's deadline: the caller gives the next one more time.
            return Err(SnapshotRead::TooSlowFor(size));
        }
        let metadata = object.info().metadata.clone();
        let field = |key: &str| -> Result<u64, Error> {
            metadata
                .get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::Refused(format!("the snapshot of partition {partition} has no valid {key}")))
        };
        let decider_version =
            u32::try_from(field("lh-decider-version").map_err(SnapshotRead::Failed)?).map_err(|_| {
                SnapshotRead::Failed(Error::Refused(format!(
                    "the snapshot of partition {partition} has no valid decider version"
                )))
            })?;
        let fence = field("lh-fence").map_err(SnapshotRead::Failed)?;
        let mut state = Vec::with_capacity(size);
        object.read_to_end(&mut state).await.map_err(|e| {
            SnapshotRead::Failed(unavailable(&format!("cannot read the snapshot of partition {partition}"), e))
        })?;
        let snapshot = Snapshot {
            partition,
            decider_version,
            fence,
            last_command: metadata.get("lh-last-command").cloned(),
            state: Bytes::from(state),
        };
        Ok(Some((snapshot, size)))
    }
}

/// A dead letter as a message on its subject, stored once per source sequence (`dlq:<seq>`).
pub(crate) fn dead_letter_message(letter: &DeadLetter) -> Result<(String, PublishMessage), Error> {
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_DLQ_REASON, header_value(HEADER_DLQ_REASON, &letter.header_reason())?);
    headers.insert(HEADER_DLQ_SOURCE_SEQ, letter.source_seq.to_string());
    headers.insert(HEADER_DLQ_SOURCE_SUBJECT, header_value(HEADER_DLQ_SOURCE_SUBJECT, &letter.source_subject)?);
    match &letter.command_id {
        Some(LetterId { id, verified: true }) => headers.insert(HEADER_CMD_ID, header_value(HEADER_CMD_ID, id)?),
        Some(LetterId { id, verified: false }) => {
            headers.insert(HEADER_DLQ_PRODUCER_ID, header_value(HEADER_DLQ_PRODUCER_ID, id)?);
        }
        None => {}
    }
    let message = PublishMessage::build()
        .payload(letter.payload.clone())
        .headers(headers)
        .message_id(format!("dlq:{}", letter.source_seq));
    Ok((letter.subject(), message))
}

/// How long reading a snapshot of `size` bytes may take: 2 s, plus 10 MB/s.
fn snapshot_deadline(size: usize) -> Duration {
    Duration::from_secs(2) + Duration::from_millis(u64::try_from(size / 10_000).unwrap_or(u64::MAX))
}

/// Why a snapshot read gave nothing.
enum SnapshotRead {
    Failed(Error),
    /// The snapshot is this large: read it with a longer deadline.
    TooSlowFor(usize),
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
        // A snapshot replaced while it is read loses its chunks under the reader, which then waits forever: each
        // read gets a deadline (2 s plus 10 MB/s of its size), a read that misses it is tried again (it finds the
        // newer snapshot), and after three misses the writer folds from the first outcome instead.
        let mut deadline = Duration::from_secs(2);
        for _ in 0..3 {
            match tokio::time::timeout(deadline, self.read_snapshot(partition, deadline)).await {
                Ok(Ok(read)) => return Ok(read.map(|(snapshot, _)| snapshot)),
                Ok(Err(SnapshotRead::Failed(e))) => return Err(e),
                Ok(Err(SnapshotRead::TooSlowFor(size))) => deadline = snapshot_deadline(size),
                Err(_) => tracing::warn!(partition, "a snapshot read stalled (replaced while read?): trying again"),
            }
        }
        Err(Error::Unavailable(format!(
            "the snapshot of partition {partition} could not be read (replaced while read?)"
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
        if partition >= self.inner.config.partitions {
            return Err(Error::Refused(format!("there is no partition {partition}")));
        }
        let info = self.writer_consumer(partition).await?;
        // Pinned to another client with commands waiting: that client may be a dead worker whose pin has not expired
        // yet. The pull below then waits in the server's queue, and the server pins it the moment the old pin
        // expires, sooner than a second ask would learn of it.
        let pinned_elsewhere = pinned_client(&info).is_some();
        if pinned_elsewhere && info.num_pending == 0 {
            return Ok(None);
        }
        let client = &self.inner.client;
        let inbox = Subject::from(client.new_inbox());
        let deliveries = client.subscribe(inbox.clone()).await.map_err(|e| unavailable("cannot subscribe", e))?;
        let mut owner = JetStreamOwner {
            log: self.clone(),
            partition,
            worker: worker.to_owned(),
            consumer: writer_consumer(partition),
            inbox,
            deliveries,
            // The consumer's own timeout (its creator's), which may differ from this process's flag.
            pull_expires: (info.config.priority_timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(5)),
            pin: None,
            lost: false,
            pulls: VecDeque::new(),
            unacked: BTreeMap::new(),
            done: 0,
            reader: Reader::new(),
            checked: Instant::now(),
        };
        owner.keep_pulling().await?;
        if info.num_pending > 0 {
            // Commands wait: the server pins the first client that pulls (once the old pin, if any, is gone). Learn
            // whether that is us.
            let deadline = Instant::now() + owner.pull_expires.min(Duration::from_secs(1));
            while owner.pin.is_none() && !owner.lost {
                match tokio::time::timeout_at(deadline, owner.deliveries.next()).await {
                    Ok(Some(message)) => {
                        owner.handle(message)?;
                        owner.keep_pulling().await?;
                    }
                    Ok(None) => return Err(Error::Unavailable("the connection closed".to_owned())),
                    Err(_) => break,
                }
            }
        }
        if owner.lost {
            return Ok(None);
        }
        if owner.pin.is_none() && owner.pinned_elsewhere().await? {
            return Ok(None);
        }
        tracing::debug!(partition, worker, pinned = owner.pin.is_some(), "owning the partition");
        Ok(Some(owner))
    }
}

fn pinned_client(info: &consumer::Info) -> Option<&str> {
    info.priority_groups.iter().find(|g| g.group == WRITER_GROUP).and_then(|g| g.pinned_client_id.as_deref())
}

impl JetStream {
    fn writer_consumer_config(&self, partition: u32, deliver_policy: DeliverPolicy) -> consumer::pull::Config {
        let config = &self.inner.config;
        consumer::pull::Config {
            durable_name: Some(writer_consumer(partition)),
            description: Some(format!("leasehold: the writer of partition {partition}")),
            filter_subject: command_filter(partition),
            deliver_policy,
            // One ack covers every delivery up to it: a writer acks once per round, not once per command.
            ack_policy: AckPolicy::All,
            ack_wait: config.ack_wait,
            // Whole commands: the owner hands out what the deliveries prove complete (crate::reading), and reads by
            // sequence only what they cannot vouch for.
            headers_only: false,
            priority_policy: PriorityPolicy::PinnedClient,
            priority_groups: vec![WRITER_GROUP.to_owned()],
            priority_timeout: config.priority_timeout,
            max_ack_pending: MAX_ACK_PENDING,
            ..Default::default()
        }
    }

    /// The writer consumer of `partition` as it is now, created (or set back to leasehold's settings) first.
    async fn writer_consumer(&self, partition: u32) -> Result<consumer::Info, Error> {
        let stream = self.stream(CMD_STREAM)?;
        let name = writer_consumer(partition);
        let existing = match stream.consumer_info(&name).await {
            Ok(info) => Some(info),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => None,
            Err(e) => return Err(unavailable(&format!("cannot read consumer {name}"), e)),
        };
        if let Some(info) = &existing
            && consumer_matches(&self.writer_consumer_config(partition, DeliverPolicy::All), &info.config)
        {
            return Ok(info.clone());
        }
        // A new consumer starts after the partition's cursor (the command of its last outcome), so a log made
        // before it does not deliver its whole retained history once; what it leaves out is decided already.
        let deliver_policy = match self.partition_cursor(partition).await? {
            0 => DeliverPolicy::All,
            cursor => DeliverPolicy::ByStartSequence { start_sequence: cursor + 1 },
        };
        let wanted = self.writer_consumer_config(partition, deliver_policy);
        if let Some(info) = existing {
            tracing::warn!(consumer = %name, have = ?info.config, "setting the writer consumer back to leasehold's settings");
        }
        let created = stream
            .create_consumer(wanted)
            .await
            .map_err(|e| unavailable(&format!("cannot create consumer {name}"), e))?;
        Ok(created.cached_info().clone())
    }
}

impl JetStream {
    /// The command sequence of `partition`'s last outcome (0: none), read from the stream leader.
    async fn partition_cursor(&self, partition: u32) -> Result<u64, Error> {
        let filter = outcome_filter(partition);
        match self.stream(EVT_STREAM)?.get_last_raw_message_by_subject(&filter).await {
            Ok(message) => {
                Ok(header(Some(&message.headers), crate::HEADER_CMD_SEQ).and_then(|seq| seq.parse().ok()).unwrap_or(0))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(unavailable(&format!("cannot read the last message of {filter}"), e)),
        }
    }
}

/// Whether an existing writer consumer is leasehold's. Its timings (`ack_wait`, `priority_timeout`) are the
/// creator's: a worker started with other values uses them as they are, so two workers with different flags do not
/// rewrite the consumer back and forth (which would disturb the pin).
fn consumer_matches(wanted: &consumer::pull::Config, got: &consumer::Config) -> bool {
    got.durable_name == wanted.durable_name
        && got.filter_subject == wanted.filter_subject
        && got.ack_policy == wanted.ack_policy
        && got.headers_only == wanted.headers_only
        && got.priority_policy == wanted.priority_policy
        && got.priority_groups == wanted.priority_groups
}

/// A writer's hold on one partition of the JetStream log.
///
/// The hold is the pin of the partition's writer consumer. The owner pulls the consumer by hand (a pull request
/// with the group and, once it has one, its pin id), so it sees what the server answers:
///
/// - A delivery carries `Nats-Pin-Id`: the first one tells the owner it is pinned. A delivery is a whole command;
///   the owner gives it to its [`Reader`], which hands out commands strictly in sequence after the cursor the
///   caller gives: from deliveries as far as their delivery numbers prove nothing is missing, by sequence from the
///   log beyond that (the first delivery after a takeover, a gap). The owner acks the highest delivery done with
///   in [`Owner::done_through`], which acks all before it (at once if it is already done with, as an old owner's
///   redeliveries are). It never naks.
/// - A 423 answers a pull whose pin id is no longer the pinned one: the pin moved, so the owner is
///   [`Error::Lost`] from then on. A delivery with another pin id means the same.
/// - Pulls are sent only while the owner is used ([`Owner::next_commands`], [`Owner::done_through`]), each
///   expiring after an eighth of `priority_timeout`, so a stuck worker loses the pin after `priority_timeout`.
///
/// The server pins a client only when it has a message to deliver. So an owner may hold a partition that nobody is
/// pinned to, because no command waits: there is nothing to decide, and two workers may both believe they own
/// it. The first delivery pins one of them; the other learns it is lost when it next checks the consumer (before
/// it returns commands while unpinned, and at most every pull expiry while it waits). The fence keeps two
/// believers from both appending (DESIGN section 3). Dropping the owner gives the pin up after
/// `priority_timeout`; [`Owner::release`] unpins at once.
pub struct JetStreamOwner {
    log: JetStream,
    partition: u32,
    worker: String,
    consumer: String,
    inbox: Subject,
    deliveries: async_nats::Subscriber,
    pull_expires: Duration,
    /// The pin id the server gave us, once it did.
    pin: Option<String>,
    lost: bool,
    /// The pulls waiting at the server, oldest first (the server serves them in that order): when each was sent,
    /// and how many deliveries it may still bring.
    pulls: VecDeque<(Instant, usize)>,
    /// Stream sequence -> ack subject of deliveries not yet acked (the consumer acks all up to the one acked).
    unacked: BTreeMap<u64, Subject>,
    /// Everything up to here is done with.
    done: u64,
    /// What was delivered and read, and what may be handed out ([`Reader`]).
    reader: Reader,
    /// When the consumer was last asked who is pinned.
    checked: Instant,
}

impl fmt::Debug for JetStreamOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamOwner")
            .field("partition", &self.partition)
            .field("worker", &self.worker)
            .field("pinned", &self.pin.is_some())
            .field("lost", &self.lost)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// What a delivery's ack subject says (`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<time>.<pending>`,
/// or with a domain and an account hash first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckReply {
    /// How many times the message was delivered (1: the first time).
    pub(crate) delivered: u64,
    /// Its stream sequence.
    pub(crate) stream_seq: u64,
    /// The consumer's delivery sequence (one more for every delivery it makes).
    pub(crate) delivery_seq: u64,
    /// The stored message's time, in Unix nanoseconds.
    pub(crate) time_ns: u64,
}

pub(crate) fn ack_reply(reply: &str) -> Option<AckReply> {
    let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
    let first = match tokens.len() {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    Some(AckReply {
        delivered: tokens[first].parse().ok()?,
        stream_seq: tokens[first + 1].parse().ok()?,
        delivery_seq: tokens[first + 2].parse().ok()?,
        time_ns: tokens[first + 3].parse().ok()?,
    })
}

/// The stream sequence in a delivery's ack subject.
pub(crate) fn acked_sequence(reply: &str) -> Option<u64> {
    ack_reply(reply).map(|ack| ack.stream_seq)
}

impl JetStreamOwner {
    /// Takes in one message from the consumer: a delivery, or the status that ends a pull.
    fn handle(&mut self, message: async_nats::Message) -> Result<(), Error> {
        match message.status {
            None | Some(StatusCode::OK) => {
                let Some(reply) = message.reply else { return Ok(()) };
                if let Some(id) = header(message.headers.as_ref(), "Nats-Pin-Id") {
                    match &self.pin {
                        None => self.pin = Some(id.to_owned()),
                        Some(mine) if mine != id => self.lost = true,
                        Some(_) => {}
                    }
                }
                if let Some((_, remaining)) = self.pulls.front_mut() {
                    *remaining = remaining.saturating_sub(1);
                    if *remaining == 0 {
                        self.pulls.pop_front();
                    }
                }
                let Some(ack) = ack_reply(&reply) else {
                    tracing::warn!(partition = self.partition, %reply, "a delivery with an ack subject that does not parse");
                    return Ok(());
                };
                let record = CommandRecord {
                    seq: ack.stream_seq,
                    subject: message.subject.to_string(),
                    time: Timestamp(ack.time_ns / 1_000_000),
                    payload: message.payload,
                };
                self.reader.delivered(Delivery { dseq: ack.delivery_seq, first: ack.delivered == 1, record });
                self.unacked.insert(ack.stream_seq, reply);
                Ok(())
            }
            Some(StatusCode::PIN_ID_MISMATCH) => {
                self.lost = true;
                self.pulls.clear();
                Ok(())
            }
            Some(StatusCode::IDLE_HEARTBEAT) => Ok(()),
            Some(StatusCode::NO_RESPONDERS) => {
                self.pulls.clear();
                Err(Error::Unavailable(format!("no server answers pulls of {}", self.consumer)))
            }
            Some(status) => {
                // 408 (the pull expired), 409 (the server ended it); "Consumer Deleted" ends the hold too. Pulls
                // expire in the order they were sent.
                self.pulls.pop_front();
                if message.description.as_deref().is_some_and(|d| d.contains("Consumer Deleted")) {
                    self.lost = true;
                }
                tracing::trace!(partition = self.partition, %status, description = ?message.description, "pull ended");
                Ok(())
            }
        }
    }

    /// Takes in whatever the consumer has sent, without waiting.
    fn drain(&mut self) -> Result<(), Error> {
        while let Some(next) = self.deliveries.next().now_or_never() {
            let message = next.ok_or_else(|| Error::Unavailable("the connection closed".to_owned()))?;
            self.handle(message)?;
        }
        Ok(())
    }

    /// Sends a pull (with our pin id once we have one) when none waits, or a second one when the waiting one has
    /// brought half its batch. Each pull that reaches the server with our pin id keeps the pin.
    async fn keep_pulling(&mut self) -> Result<(), Error> {
        // A pull whose end never came (a reconnect drops waiting pulls and their 408) is forgotten, and sent again,
        // well within the pin's timeout, not a request timeout later: with a timeout of seconds, that would cost
        // the pin.
        let grace = self.log.inner.config.request_timeout.min(self.pull_expires * 2);
        while self.pulls.front().is_some_and(|(sent, _)| sent.elapsed() >= self.pull_expires + grace) {
            self.pulls.pop_front();
        }
        let outstanding: usize = self.pulls.iter().map(|(_, remaining)| remaining).sum();
        if !self.pulls.is_empty() && (self.pulls.len() >= PULLS_IN_FLIGHT || outstanding > PULL_BATCH / 2) {
            return Ok(());
        }
        let mut request = serde_json::json!({
            "batch": PULL_BATCH,
            "expires": u64::try_from(self.pull_expires.as_nanos()).unwrap_or(u64::MAX),
            "group": WRITER_GROUP,
        });
        if let Some(pin) = &self.pin {
            request["id"] = serde_json::Value::from(pin.as_str());
        }
        self.log
            .inner
            .client
            .publish_with_reply(
                format!("$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.{}", self.consumer),
                self.inbox.clone(),
                Bytes::from(request.to_string()),
            )
            .await
            .map_err(|e| unavailable("cannot pull", e))?;
        self.pulls.push_back((Instant::now(), PULL_BATCH));
        Ok(())
    }

    /// Whether another client is pinned now (asked of the consumer). Marks the owner lost if so.
    async fn pinned_elsewhere(&mut self) -> Result<bool, Error> {
        self.checked = Instant::now();
        let info = self
            .log
            .stream(CMD_STREAM)?
            .consumer_info(&self.consumer)
            .await
            .map_err(|e| unavailable(&format!("cannot read consumer {}", self.consumer), e))?;
        // Deliveries that came meanwhile may have pinned us.
        self.drain()?;
        let elsewhere = match (pinned_client(&info), &self.pin) {
            (None, _) => false,
            (Some(pinned), Some(mine)) => pinned != mine,
            (Some(_), None) => true,
        };
        self.lost |= elsewhere;
        Ok(elsewhere)
    }

    fn check_held(&self) -> Result<(), Error> {
        if self.lost { Err(Error::Lost(self.partition)) } else { Ok(()) }
    }

    /// Commands after `after`, read by sequence: from any replica, and from the leader up to `through` (the
    /// highest delivered) if the replica has not caught up with it. Returns them and the sequence up to which no
    /// other command lies.
    async fn read(&self, after: u64, max: usize, through: u64) -> Result<(Vec<CommandRecord>, u64), Error> {
        let mut found = self.log.read_commands(self.partition, after, max).await?;
        let filter = command_filter(self.partition);
        let mut next = found.last().map_or(after, |c| c.seq) + 1;
        let mut covered = 0;
        while found.len() < max && next <= through {
            let Some(message) = self.log.leader_next(CMD_STREAM, &filter, next).await? else {
                // The leader holds nothing more: the delivery above was a command no longer held (aged out).
                covered = through;
                break;
            };
            next = message.sequence + 1;
            found.push(command_record(message));
        }
        Ok((found, covered))
    }

    /// Reads by sequence as the reader asks, and takes the answer in.
    async fn read_into_reader(&mut self, after: u64, max: usize, through: u64) -> Result<(), Error> {
        let (found, covered) = self.read(after, max.clamp(1, DIRECT_BATCH), through).await?;
        self.reader.read(after, found, covered);
        Ok(())
    }

    /// Returns `found` if we may work on it: an unpinned owner first checks that nobody else is pinned.
    async fn hand_out(&mut self, found: Vec<CommandRecord>) -> Result<Vec<CommandRecord>, Error> {
        if self.pin.is_none() && !found.is_empty() && self.pinned_elsewhere().await? {
            return Err(Error::Lost(self.partition));
        }
        self.check_held()?;
        Ok(found)
    }

    /// Acks every delivery up to `done`, with one ack: the consumer acks all (`AckAll`) up to the highest. An ack
    /// is fire and forget: a lost one means redeliveries, which are acked again.
    async fn ack_done(&mut self) -> Result<(), Error> {
        let later = self.unacked.split_off(&(self.done + 1));
        let done = std::mem::replace(&mut self.unacked, later);
        if let Some((_, reply)) = done.into_iter().next_back() {
            self.log
                .inner
                .client
                .publish(reply, Bytes::from_static(b"+ACK"))
                .await
                .map_err(|e| unavailable("cannot ack", e))?;
        }
        Ok(())
    }
}

impl Owner for JetStreamOwner {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn next_commands(&mut self, after: u64, max: usize, wait: Duration) -> Result<Vec<CommandRecord>, Error> {
        // Commands at hand are handed out without a round trip: let the connection deliver what came meanwhile (a
        // 423 saying the pin moved) before looking, even on a single-threaded runtime.
        tokio::task::yield_now().await;
        self.drain()?;
        self.check_held()?;
        self.ack_done().await?;
        self.keep_pulling().await?;
        let deadline = Instant::now() + wait;
        // Reads by sequence this call: a replica that lags may answer short of what was delivered; the leader
        // completes the read, and a third read waits for the next call.
        let mut reads = 0;
        loop {
            match self.reader.next(after, max) {
                Next::Ready(found) => return self.hand_out(found).await,
                Next::Read { after: from, through } if reads < 2 => {
                    reads += 1;
                    self.read_into_reader(from, max, through).await?;
                    continue;
                }
                Next::Read { .. } | Next::Wait => {}
            }
            match tokio::time::timeout_at(deadline, self.deliveries.next()).await {
                Ok(Some(message)) => {
                    self.handle(message)?;
                    self.drain()?;
                    self.check_held()?;
                    self.ack_done().await?;
                    self.keep_pulling().await?;
                }
                Ok(None) => return Err(Error::Unavailable("the connection closed".to_owned())),
                Err(_) => break,
            }
        }
        if self.pin.is_none() && self.checked.elapsed() >= self.pull_expires && self.pinned_elsewhere().await? {
            return Err(Error::Lost(self.partition));
        }
        // A command may have come without a delivery (the consumer at its ack limit): read once more, after what
        // the reader knows.
        let from = match self.reader.next(after, max) {
            Next::Ready(found) => return self.hand_out(found).await,
            Next::Read { after: from, .. } => from,
            Next::Wait => self.reader.known().unwrap_or(after),
        };
        self.read_into_reader(from, max, self.reader.highest()).await?;
        match self.reader.next(after, max) {
            Next::Ready(found) => self.hand_out(found).await,
            Next::Read { .. } | Next::Wait => self.hand_out(Vec::new()).await,
        }
    }

    async fn keep_alive(&mut self) -> Result<(), Error> {
        self.drain()?;
        self.check_held()?;
        self.keep_pulling().await
    }

    async fn done_through(&mut self, seq: u64) -> Result<(), Error> {
        self.done = self.done.max(seq);
        self.reader.done_through(seq);
        self.drain()?;
        self.ack_done().await?;
        self.check_held()?;
        self.keep_pulling().await
    }

    async fn release(mut self) {
        if self.drain().is_ok() {
            let _ = self.ack_done().await;
        }
        if self.lost || self.pin.is_none() {
            return;
        }
        // Unpin only while the pin is still ours: never unpin the owner that came after us.
        match self.pinned_elsewhere().await {
            Ok(false) if self.pin.is_some() => {
                let unpinned = match self.log.stream(CMD_STREAM) {
                    Ok(stream) => stream.unpin_consumer(&self.consumer, WRITER_GROUP).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = unpinned {
                    tracing::warn!(partition = self.partition, error = %e, "could not unpin the partition");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(partition = self.partition, error = %e, "could not release the partition"),
        }
        // A flush waits for the connection: on a server that is gone, for as long as the client reconnects.
        let flushed = tokio::time::timeout(self.log.inner.config.request_timeout, self.log.inner.client.flush()).await;
        if flushed.is_err() {
            tracing::warn!(
                partition = self.partition,
                "the acks of the partition were not flushed: the server is away"
            );
        }
    }
}

/// Every outcome matching `filter` from `from` on, through an ordered consumer (ADR-17): in order, each once,
/// recreated by the client from the last sequence seen when it falls behind or its server goes.
fn follow(log: JetStream, filter: OutcomeFilter, from: u64) -> BoxStream<'static, Result<StoredOutcome, Error>> {
    enum State {
        Start(JetStream, OutcomeFilter, u64),
        Following(async_nats::jetstream::consumer::pull::Ordered),
        Done,
    }
    futures::stream::unfold(State::Start(log, filter, from), |state| async move {
        let mut messages = match state {
            State::Done => return None,
            State::Following(messages) => messages,
            State::Start(log, filter, from) => {
                let config = consumer::pull::OrderedConfig {
                    filter_subject: filter.subject(),
                    deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
                    ..Default::default()
                };
                let started = match log.stream(EVT_STREAM) {
                    Err(e) => Err(e),
                    Ok(stream) => match stream.create_consumer(config).await {
                        Ok(consumer) => {
                            consumer.messages().await.map_err(|e| unavailable("cannot follow the outcomes", e))
                        }
                        Err(e) => Err(unavailable("cannot follow the outcomes", e)),
                    },
                };
                match started {
                    Ok(messages) => messages,
                    Err(e) => return Some((Err(e), State::Done)),
                }
            }
        };
        match followed(messages.next().await, None) {
            Ok(outcome) => Some((Ok(outcome), State::Following(messages))),
            Err(e) => Some((Err(e), State::Done)),
        }
    })
    .boxed()
}

/// The outcome a follower's next message holds. With `expected`, the consumer sequence it must carry: a gap (an
/// outcome taken from the consumer by someone else) ends the follow, to be started again from the last sequence.
fn followed<E: fmt::Display>(
    next: Option<Result<async_nats::jetstream::Message, E>>,
    expected: Option<u64>,
) -> Result<StoredOutcome, Error> {
    let message = match next {
        None => return Err(Error::Unavailable("the outcome follower ended".to_owned())),
        Some(Err(e)) => return Err(unavailable("the outcome follower failed", e)),
        Some(Ok(message)) => message,
    };
    let info = message.info().map_err(|e| Error::Storage(format!("a followed outcome has no stream sequence: {e}")))?;
    if let Some(expected) = expected
        && info.consumer_sequence != expected
    {
        return Err(Error::Unavailable(format!(
            "the outcome follower skipped from delivery {expected} to {}",
            info.consumer_sequence
        )));
    }
    let seq = info.stream_sequence;
    let message = message.message;
    stored_outcome(seq, &message.subject, message.headers.as_ref(), message.payload)
}

/// An agent's outcomes, read as its restricted user may: through its one consumer on `LH_EVT` (`consumer`, named
/// by [`agent_consumer`]) with the one filter subject `lh.evt.<p>.<name>`, created with the filtered create subject
/// (`$JS.API.CONSUMER.CREATE.LH_EVT.<consumer>.lh.evt.<p>.<name>`, server 2.10+) so a permission can name both. A
/// consumer left from before is deleted first (a consumer's start cannot be changed). Unlike the ordered consumer
/// of [`follow`], which renames its consumer on every recreate, the name stays the agent's; on a gap or a failure
/// the stream ends with an error and the agent follows again from its last sequence.
fn follow_as_agent(
    log: JetStream,
    agent: String,
    consumer: String,
    filter: OutcomeFilter,
    from: u64,
) -> BoxStream<'static, Result<StoredOutcome, Error>> {
    let OutcomeFilter::Key { key, .. } = &filter else {
        let refused = Error::Refused(format!("agent {agent} reads only its own outcomes"));
        return futures::stream::once(async move { Err(refused) }).boxed();
    };
    if *key != agent {
        let refused = Error::Refused(format!("agent {agent} reads only its own outcomes, not {key}'s"));
        return futures::stream::once(async move { Err(refused) }).boxed();
    }
    enum State {
        Start {
            log: JetStream,
            agent: String,
            consumer: String,
            subject: String,
            from: u64,
        },
        /// The messages, and the consumer sequence the next one must carry.
        Following(consumer::pull::Stream, u64),
        Done,
    }
    let subject = filter.subject();
    futures::stream::unfold(State::Start { log, agent, consumer, subject, from }, |state| async move {
        let (mut messages, expected) = match state {
            State::Done => return None,
            State::Following(messages, expected) => (messages, expected),
            State::Start { log, agent, consumer, subject, from } => {
                match agent_messages(&log, &agent, &consumer, subject, from).await {
                    Ok(messages) => (messages, 1),
                    Err(e) => return Some((Err(e), State::Done)),
                }
            }
        };
        match followed(messages.next().await, Some(expected)) {
            Ok(outcome) => Some((Ok(outcome), State::Following(messages, expected + 1))),
            Err(e) => Some((Err(e), State::Done)),
        }
    })
    .boxed()
}

/// The agent's consumer `name` on `subject` from `from`, made anew, and its messages.
async fn agent_messages(
    log: &JetStream,
    agent: &str,
    name: &str,
    subject: String,
    from: u64,
) -> Result<consumer::pull::Stream, Error> {
    let js = &log.inner.js;
    // Not there is fine; any other failure shows again when it is created.
    let _ = js.delete_consumer_from_stream(name, EVT_STREAM).await;
    let config = consumer::pull::Config {
        name: Some(name.to_owned()),
        description: Some(format!("leasehold: the outcomes of agent {agent}")),
        filter_subject: subject,
        deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
        ack_policy: AckPolicy::None,
        inactive_threshold: Duration::from_secs(60),
        num_replicas: 1,
        memory_storage: true,
        ..Default::default()
    };
    let consumer = js
        .create_consumer_on_stream(config, EVT_STREAM)
        .await
        .map_err(|e| unavailable(&format!("cannot create the consumer of agent {agent} on {EVT_STREAM}"), e))?;
    consumer.messages().await.map_err(|e| unavailable("cannot follow the outcomes", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_answers_map_as_section_3_says() {
        assert_eq!(batch_answer(b""), BatchAnswer::Taken);
        assert_eq!(
            batch_answer(br#"{"stream":"LH_EVT","seq":12,"batch":"b1","count":3}"#),
            BatchAnswer::Stored { seq: 12, count: 3, id: Some("b1".to_owned()) }
        );
        let refused = batch_answer(
            br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 59"},"stream":"LH_EVT","seq":0}"#,
        );
        let BatchAnswer::Refused { code, description } = refused else { panic!("{refused:?}") };
        assert_eq!(batch_refusal(code, &description, false), Appended::Stale { last: Some(59) });
        assert!(matches!(batch_refusal(10210, "atomic publish too many inflight", true), Appended::Busy(_)));
        assert!(matches!(batch_refusal(10164, "not ready", false), Appended::Busy(_)));
        assert!(matches!(batch_refusal(10199, "atomic publish batch is too large", false), Appended::TooLarge(_)));
        assert!(matches!(batch_refusal(10174, "atomic publish is disabled", false), Appended::TooLarge(_)));
        assert!(matches!(batch_refusal(10201, "duplicate message id", false), Appended::Unknown(_)));
        assert!(matches!(batch_answer(b"garbage"), BatchAnswer::Garbled(_)));
    }

    #[test]
    fn a_retry_while_the_first_copy_is_stored_is_tried_again_not_refused() {
        assert!(in_process_elsewhere(ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT));
        assert!(!in_process_elsewhere(ErrorCode::STREAM_WRONG_LAST_SEQUENCE));
    }

    #[test]
    fn ack_subjects_name_the_stream_sequence() {
        assert_eq!(acked_sequence("$JS.ACK.LH_CMD.lh-writer-7.1.3.2.1795409385075890669.2"), Some(3));
        assert_eq!(acked_sequence("$JS.ACK._.szMpdrwD.LH_CMD.lh-writer-7.2.50.9.1795409385075890669.0"), Some(50));
        assert_eq!(acked_sequence("$JS.ACK.LH_CMD.lh-writer-7.1.3"), None);
        assert_eq!(acked_sequence("_INBOX.x"), None);
    }

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

    #[test]
    fn another_partition_count_is_named() {
        let err = check_stream(&cmd_stream_config(8, 1), &cmd_stream_config(4, 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stream LH_CMD was created for 4 partitions, not 8: the partition count is fixed when the log is created"
        );
        let err = check_stream(&evt_stream_config(3), &evt_stream_config(1)).unwrap_err();
        assert!(err.to_string().contains("num_replicas is 1, leasehold needs 3"), "{err}");
        check_stream(&dlq_stream_config(1), &dlq_stream_config(1)).unwrap();
    }
}
