//! What a producer does around the gateway's API: build a command's envelope with ids it chooses (so that a retry of
//! the same command is idempotent), send it through the gateway or straight to JetStream, wait for its outcome, and
//! read what it made (the resource an allocation made, the lease an acquisition asked for).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::{Acquire, Allocate, Place};
use leasehold_schemas::{
    AgentName, Command, CommandId, Effect, Envelope, IdError, Issuer, Key, LeaseId, Position, ResourceId, ResourceRef,
    Timestamp,
};
use serde::Serialize;

use crate::error::{Error, OutcomeUnknown};
use crate::gateway::{CommandStatus, Follower, Gateway, RejectionInfo, SeqOutcome};

/// How long a [`Producer`] waits for an outcome unless told otherwise (the command line's `--timeout` default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A lease's address, `<agent>.<lease id>`: what `acquire` prints and every lease command takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub agent: AgentName,
    pub lease: LeaseId,
}

impl FromStr for LeaseRef {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let (agent, lease) = s.split_once('.').ok_or_else(|| IdError::BadRef { value: s.to_owned() })?;
        Ok(LeaseRef { agent: agent.parse()?, lease: lease.parse()? })
    }
}

impl fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.agent, self.lease)
    }
}

/// Milliseconds since the Unix epoch of `time` (0 before it).
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An envelope for `body` from `issuer` with id `id` (default: a new one), stamped with this machine's clock. Keep
/// the id (and the ids inside `body`) to send the same command again when its outcome is unknown.
pub fn envelope(issuer: &Issuer, id: Option<CommandId>, body: impl Into<Command>) -> Envelope {
    let id = id.unwrap_or_else(CommandId::generate);
    Envelope::new(id, issuer.clone(), Timestamp(unix_ms(SystemTime::now())), body)
}

/// Where commands go: the gateway, or JetStream itself, as any producer or as one bound to a principal.
#[derive(Debug)]
pub enum Transport {
    Gateway(Gateway),
    Nats(JetStream),
    /// JetStream, as a producer bound to `principal` (schema version 6; made with [`Transport::bound`]): each
    /// command is published on `lh.in.op@<principal>.<key>.<id>` ([`subjects::bound_ingress_subject`]), the only
    /// subjects a NATS user made with `leasehold credentials producer NAME --principal P` may publish on. The writer
    /// takes a command stored there only if its issuer is the principal and it is a producer's request
    /// ([`Command::is_producer_request`]); this transport refuses any other before it is sent ([`publish_subject`]).
    ///
    /// [`subjects::bound_ingress_subject`]: leasehold_schemas::subjects::bound_ingress_subject
    BoundNats {
        log: JetStream,
        principal: Issuer,
    },
}

impl From<Gateway> for Transport {
    fn from(gateway: Gateway) -> Self {
        Transport::Gateway(gateway)
    }
}

impl Transport {
    /// JetStream as `config` says; its partition count is learnt from the streams `serve` created.
    pub async fn nats(config: JetStreamConfig) -> Result<Self, Error> {
        let url = config.url.clone();
        let config = JetStreamConfig { partitions: 0, ..config };
        let log = JetStream::connect(config)
            .await
            .map_err(|e| Error::transport_because(format!("connecting to NATS at {url}"), e))?;
        Ok(Transport::Nats(log))
    }

    /// The same JetStream transport, publishing as a producer bound to `principal` ([`Transport::BoundNats`]): what
    /// a process whose NATS user may publish only on `lh.in.op@<principal>.>` must use. Invalid through a gateway
    /// (the gateway records its token's principal as the issuer: nothing to bind) and for a principal that cannot be
    /// a subject token (one with `.`, `*` or `>`).
    pub fn bound(self, principal: Issuer) -> Result<Self, Error> {
        if !leasehold_schemas::subjects::is_bindable(principal.as_str()) {
            return Err(Error::invalid(format!(
                "principal {principal} cannot be bound to a NATS producer: it must be one subject token (no `.`, `*` \
                 or `>`)"
            )));
        }
        match self {
            Transport::Gateway(_) => Err(Error::invalid(format!(
                "a producer is bound to principal {principal} only on NATS: through a gateway, the gateway records \
                 its token's principal as the issuer"
            ))),
            Transport::Nats(log) | Transport::BoundNats { log, .. } => Ok(Transport::BoundNats { log, principal }),
        }
    }

    /// The principal this transport publishes as, when it is bound to one.
    pub fn principal(&self) -> Option<&Issuer> {
        match self {
            Transport::BoundNats { principal, .. } => Some(principal),
            Transport::Gateway(_) | Transport::Nats(_) => None,
        }
    }

    /// The log, when commands go straight to JetStream (no gateway, and so no read model, to ask).
    pub fn log(&self) -> Option<&JetStream> {
        match self {
            Transport::Nats(log) | Transport::BoundNats { log, .. } => Some(log),
            Transport::Gateway(_) => None,
        }
    }

    /// Sends `envelope` and waits up to `timeout` for its outcome (`pending` when none came in time).
    pub async fn submit(&self, envelope: &Envelope, timeout: Duration) -> Result<CommandStatus, Error> {
        match self {
            Transport::Gateway(gateway) => gateway.submit(envelope, timeout).await,
            Transport::Nats(log) => submit_to_log(log, envelope, timeout).await,
            Transport::BoundNats { log, principal } => submit_to_log_as(log, envelope, Some(principal), timeout).await,
        }
    }

    /// Every outcome of `key` from sequence `from` on, as it lands.
    pub async fn follow(&self, key: &Key, from: u64) -> Result<BoxStream<'static, Result<SeqOutcome, Error>>, Error> {
        match self {
            Transport::Gateway(gateway) => {
                Ok(Follower::new(gateway.clone(), Some(key.token()), Some(from)).into_stream())
            }
            Transport::Nats(log) | Transport::BoundNats { log, .. } => {
                let filter = key_filter(log, key);
                Ok(log
                    .follow(filter, from)
                    .map(|stored| {
                        let stored = stored.map_err(|e| Error::transport_because("following the outcomes", e))?;
                        let outcome = decode(&stored)?;
                        Ok(SeqOutcome { seq: stored.seq, outcome })
                    })
                    .boxed())
            }
        }
    }
}

fn key_filter(log: &impl Log, key: &Key) -> OutcomeFilter {
    let partition = leasehold_schemas::subjects::partition_of_key(key, log.partitions());
    OutcomeFilter::Key { partition, key: key.token() }
}

/// How many outcomes one read of a key's history takes.
const HISTORY_BATCH: usize = 1000;

/// Publishes `envelope` to the log and waits for the outcome of its command id (every part), as the gateway does:
/// a command id names one command (another command under an id the log holds is refused), and a command decided
/// before is answered with its first decision (the writer decides an id once: it appends nothing for a copy sent
/// again, even after the log's duplicate window).
pub async fn submit_to_log<L: Log>(log: &L, envelope: &Envelope, timeout: Duration) -> Result<CommandStatus, Error> {
    submit_to_log_as(log, envelope, None, timeout).await
}

/// The subject `envelope` is published on: its ingress subject (`lh.in.op.<key>.<id>`), or, for a producer bound
/// to `principal`, the bound one (`lh.in.op@<principal>.<key>.<id>`). A bound producer's command is refused here,
/// before anything is sent, when the writer would dead-letter it: another issuer's, or one that is not a
/// producer's request (pools, policy, quotas and agents are the operator's).
pub fn publish_subject(envelope: &Envelope, bound: Option<&Issuer>) -> Result<String, Error> {
    let Some(principal) = bound else {
        return Ok(leasehold_schemas::subjects::ingress_subject_of(&envelope.body));
    };
    if envelope.issuer != *principal {
        return Err(Error::refused(format!(
            "command {} names issuer {}, but this producer is bound to principal {principal}: it sends as \
             {principal} only (the writer would dead-letter the command)",
            envelope.command_id, envelope.issuer
        )));
    }
    if !envelope.body.is_producer_request() {
        return Err(Error::refused(format!(
            "{} is the operator's: a producer bound to principal {principal} sends only allocations, placements, \
             leases and what it does to resources; send it as an operator, unbound",
            envelope.type_name()
        )));
    }
    leasehold_schemas::subjects::bound_ingress_subject(&envelope.body, principal).ok_or_else(|| {
        Error::invalid(format!(
            "principal {principal} cannot be bound to a NATS producer: it must be one subject token (no `.`, `*` or \
             `>`)"
        ))
    })
}

/// [`submit_to_log`], as a producer bound to `bound` when given: published on the subject [`publish_subject`]
/// gives (refused there, nothing sent, when a bound producer may not send it).
pub async fn submit_to_log_as<L: Log>(
    log: &L,
    envelope: &Envelope,
    bound: Option<&Issuer>,
    timeout: Duration,
) -> Result<CommandStatus, Error> {
    let subject = publish_subject(envelope, bound)?;
    let command_id = envelope.command_id.to_string();
    let key = envelope.body.key();
    let filter = key_filter(log, &key);
    // Read before publishing: an outcome after this is followed, one up to it is looked for in the key's history.
    let OutcomeFilter::Key { partition, .. } = filter else { unreachable!("a key filter") };
    let before = log
        .last_outcome_seq(partition)
        .await
        .map_err(|e| Error::transport_because("reading where the outcomes are", e))?;
    let payload =
        leasehold_schemas::codec::encode_command(envelope).map_err(|e| Error::decode("encoding the command", e))?;
    let published = match log.publish_command(&subject, &command_id, payload.into()).await {
        Ok(published) => published,
        // Refused: nothing was stored.
        Err(e @ leasehold_log::Error::Refused(_)) => {
            return Err(Error::Refused {
                reason: format!("publishing command {command_id} on {subject}"),
                source: Some(e.into()),
            });
        }
        // No acknowledgement: it may have been stored.
        Err(e) => {
            return Err(OutcomeUnknown::new(envelope, format!("publishing on {subject}: {e}"), None).into());
        }
    };
    let mut status = CommandStatus {
        command_id: command_id.clone(),
        status: "pending".to_owned(),
        command_seq: Some(published.seq),
        duplicate: published.duplicate,
        rejection: None,
        outcomes: Vec::new(),
        dead_letter: None,
    };
    let unknown = |why: String, status: &CommandStatus| -> Error {
        OutcomeUnknown::new(envelope, why, Some(status.clone())).into()
    };
    // A duplicate: what the log holds under this id must be this very command.
    if published.duplicate {
        same_command(log, envelope, published.seq, None).await.map_err(|e| e.into_error(&status, &unknown))?;
    }
    // The decision may be there already: the first copy's (a duplicate), or the same command's decided when it was
    // sent before the duplicate window (another command sequence: the writer appends nothing for this copy).
    let mut decided: Option<u64> = None;
    let mut from = 1;
    while from <= before {
        let batch = match log.read_outcomes(&filter, from, HISTORY_BATCH).await {
            Ok(batch) => batch,
            Err(e) => return Err(unknown(format!("reading the outcomes of {}: {e}", key.token()), &status)),
        };
        let Some(last) = batch.last() else { break };
        from = last.seq + 1;
        for stored in batch.into_iter().filter(|stored| stored.cmd_id == command_id && stored.seq <= before) {
            // The outcome of the copy just published wins over an earlier decision of the same id.
            if decided.is_some_and(|seq| seq != stored.cmd_seq) && stored.cmd_seq == published.seq {
                status.outcomes.clear();
                status.rejection = None;
                decided = None;
            }
            if decided.is_none_or(|seq| seq == stored.cmd_seq) {
                decided = Some(stored.cmd_seq);
                let outcome = decode(&stored)?;
                take(&mut status, stored.seq, outcome);
            }
        }
    }
    if let Some(seq) = decided {
        adopt(log, envelope, &mut status, seq, published.seq).await.map_err(|e| e.into_error(&status, &unknown))?;
        if status.outcomes.last().is_some_and(|last| !last.outcome.continues()) {
            return Ok(finish(status));
        }
    }
    let mut outcomes = log.follow(filter, before + 1);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let stored = match tokio::time::timeout_at(deadline, outcomes.next()).await {
            Err(_) => return Ok(status),
            Ok(None) => return Err(unknown("the outcome stream ended before it was decided".to_owned(), &status)),
            Ok(Some(Err(e))) => return Err(unknown(format!("following the outcomes: {e}"), &status)),
            Ok(Some(Ok(stored))) => stored,
        };
        if stored.cmd_id != command_id || decided.is_some_and(|seq| seq != stored.cmd_seq) {
            continue;
        }
        let outcome = decode(&stored)?;
        if decided.is_none() {
            decided = Some(stored.cmd_seq);
            adopt(log, envelope, &mut status, stored.cmd_seq, published.seq)
                .await
                .map_err(|e| e.into_error(&status, &unknown))?;
        }
        let continues = outcome.continues();
        take(&mut status, stored.seq, outcome);
        if !continues {
            return Ok(finish(status));
        }
    }
}

fn decode(stored: &leasehold_log::StoredOutcome) -> Result<leasehold_schemas::Outcome, Error> {
    leasehold_schemas::codec::decode_outcome(&stored.payload)
        .map_err(|e| Error::decode(format!("decoding the outcome at {}", stored.seq), e))
}

/// Adds one part of the decision to `status`.
fn take(status: &mut CommandStatus, seq: u64, outcome: leasehold_schemas::Outcome) {
    if let Some(rejection) = outcome.rejection() {
        status.rejection = Some(RejectionInfo::from(rejection));
    }
    status.outcomes.push(SeqOutcome { seq, outcome });
}

/// Every part of the decision is in `status`.
fn finish(mut status: CommandStatus) -> CommandStatus {
    status.status = if status.rejection.is_some() { "rejected" } else { "accepted" }.to_owned();
    status
}

/// The decision found answers the command stored at `cmd_seq`: when that is not the copy just published (at
/// `published`), it is an earlier decision of this command id, which must be this very command; the answer is then a
/// duplicate's.
async fn adopt<L: Log>(
    log: &L,
    envelope: &Envelope,
    status: &mut CommandStatus,
    cmd_seq: u64,
    published: u64,
) -> Result<(), NotSame> {
    if cmd_seq == published {
        return Ok(());
    }
    let decided = status.outcomes.first().map(|o| &o.outcome);
    same_command(log, envelope, cmd_seq, decided).await?;
    status.duplicate = true;
    status.command_seq = Some(cmd_seq);
    Ok(())
}

/// Why the command stored under an id could not be taken for `envelope`.
#[derive(Debug)]
enum NotSame {
    /// Another command: refused.
    Another(String),
    /// The command log could not be read: the outcome is unknown.
    Unreadable(String),
}

impl NotSame {
    fn into_error(self, status: &CommandStatus, unknown: &impl Fn(String, &CommandStatus) -> Error) -> Error {
        match self {
            NotSame::Another(message) => Error::refused(message),
            NotSame::Unreadable(why) => unknown(why, status),
        }
    }
}

/// Whether the command stored at `seq` (under `envelope`'s id) is `envelope`'s (a producer rebuilds its envelope to
/// send it again: its clock may differ).
async fn same_command<L: Log>(
    log: &L,
    envelope: &Envelope,
    seq: u64,
    decided: Option<&leasehold_schemas::Outcome>,
) -> Result<(), NotSame> {
    match leasehold_log::other_command_under_id(log, seq, envelope, decided).await {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(NotSame::Another(why)),
        Err(e) => Err(NotSame::Unreadable(format!("reading the command stored under its id at {seq}: {e}"))),
    }
}

/// The status of a sent command once it is decided (accepted, rejected) or dead-lettered. A status still `pending`
/// or `published` (no outcome within `timeout`) is an [`Error::OutcomeUnknown`], as is a failure after the command
/// may have been stored; other errors pass as they are.
pub fn settle(
    sent: Result<CommandStatus, Error>,
    envelope: &Envelope,
    timeout: Duration,
) -> Result<CommandStatus, Error> {
    let status = sent?;
    if !matches!(status.status.as_str(), "pending" | "published") {
        return Ok(status);
    }
    let seq = status.command_seq.map(|seq| format!(" at command seq {seq}")).unwrap_or_default();
    let why = format!(
        "it is stored{seq}, and no outcome came within {}; it will be decided when a worker serves its partition",
        humantime::format_duration(timeout)
    );
    Err(OutcomeUnknown::new(envelope, why, Some(status)).into())
}

/// The outcomes of an accepted command; a rejection, a dead letter or a command not decided yet is an error that
/// says why. `what` names the command in the message (`allocate w1.…`).
pub fn outcomes(status: CommandStatus, what: &str) -> Result<Vec<SeqOutcome>, Error> {
    let id = &status.command_id;
    match status.status.as_str() {
        "accepted" => Ok(status.outcomes),
        "rejected" => Err(Error::Rejected { what: what.to_owned(), status: Box::new(status) }),
        "dead-lettered" => Err(Error::DeadLettered { what: what.to_owned(), status: Box::new(status) }),
        "pending" | "published" => {
            let why = format!(
                "{what}: no outcome in time; command {id} is stored{} and will be decided when a worker serves its \
                 partition",
                status.command_seq.map(|seq| format!(" at command seq {seq}")).unwrap_or_default()
            );
            let command_id = id.clone();
            Err(OutcomeUnknown { command_id, why, status: Some(status), resend: String::new() }.into())
        }
        other => {
            Err(Error::Decode { message: format!("{what}: the gateway says {other:?} of command {id}"), source: None })
        }
    }
}

/// Checks that the outcomes of an allocation made `reference`: a command id first sent with another resource id
/// answers with that one's outcome, which is refused here.
pub fn check_allocated(command_id: &str, reference: &ResourceRef, outcomes: &[SeqOutcome]) -> Result<(), Error> {
    let allocated: Vec<ResourceId> = outcomes
        .iter()
        .flat_map(|o| o.outcome.effects())
        .filter_map(|effect| match effect {
            Effect::ResourceAllocated { resource, .. } => Some(*resource),
            _ => None,
        })
        .collect();
    if !allocated.is_empty() && !allocated.contains(&reference.resource) {
        return Err(Error::refused(format!(
            "command {command_id} allocated {}, not {reference}: it was first sent with other ids (was --command-id \
             {command_id} given with another --id?)",
            allocated.iter().map(|id| format!("{}.{id}", reference.agent)).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

/// A lease as `acquire` prints it (the same fields as the gateway's lease records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseRecord {
    /// `<agent>.<lease id>`
    pub id: String,
    /// `<agent>.<resource id>`
    pub resource: String,
    pub holder: String,
    /// `waiting`, `active`, `released`, `broken`, `expired`, `failed`.
    pub state: String,
    pub token: Option<u64>,
    pub expires_at: Option<u64>,
    pub wait_until: Option<u64>,
}

impl LeaseRecord {
    /// The lease `acquire` asked for, as the outcomes of the acquisition (by command `command_id`) left it, and the
    /// sequence of the last of them (to follow from). Outcomes not about this lease are those of a command id first
    /// sent with another lease id: refused.
    pub fn acquired(acquire: &Acquire, command_id: &str, outcomes: &[SeqOutcome]) -> Result<(Self, u64), Error> {
        let lease_ref = LeaseRef { agent: acquire.agent.clone(), lease: acquire.lease };
        let mut record = LeaseRecord {
            id: lease_ref.to_string(),
            resource: ResourceRef::new(acquire.agent.clone(), acquire.resource).to_string(),
            holder: acquire.holder.clone(),
            state: "waiting".to_owned(),
            token: None,
            expires_at: None,
            wait_until: None,
        };
        let mut last_seq = 0;
        let mut about_this_lease = false;
        for SeqOutcome { seq, outcome } in outcomes {
            last_seq = last_seq.max(*seq);
            for (position, effect) in outcome.positioned_effects() {
                about_this_lease |= record.apply(acquire.lease, position, effect);
            }
        }
        if !about_this_lease {
            return Err(Error::refused(format!(
                "the outcome of command {command_id} is not about lease {lease_ref}: it was first sent with other ids \
                 (was --command-id {command_id} given with another --lease-id?)"
            )));
        }
        Ok((record, last_seq))
    }

    /// Applies an effect at `position` if it is about this lease; true if it changed the lease.
    pub fn apply(&mut self, lease: LeaseId, position: Position, effect: &Effect) -> bool {
        let mut set = |state: &str, token: Option<u64>, expires_at: Option<u64>, wait_until: Option<u64>| {
            self.state = state.to_owned();
            self.token = token;
            self.expires_at = expires_at;
            self.wait_until = wait_until;
        };
        match effect {
            Effect::LeaseWaiting { lease: id, wait_until, .. } | Effect::LeaseQueued { lease: id, wait_until, .. }
                if *id == lease =>
            {
                set("waiting", None, None, wait_until.map(|t| t.0))
            }
            Effect::LeaseGranted { lease: id, expires_at, .. } if *id == lease => {
                set("active", Some(position.0), expires_at.map(|t| t.0), None)
            }
            Effect::LeaseReleased { lease: id } if *id == lease => set("released", None, None, None),
            Effect::LeaseBroken { lease: id, .. } if *id == lease => set("broken", None, None, None),
            Effect::LeaseExpired { lease: id } if *id == lease => set("expired", None, None, None),
            Effect::LeaseFailed { lease: id } if *id == lease => set("failed", None, None, None),
            _ => return false,
        }
        true
    }

    /// Follows the outcomes of the lease's agent from sequence `from` until the waiting lease `lease` is granted or
    /// ends, or `deadline` passes: true if it stopped waiting, false if it still waits at the deadline (it goes on
    /// waiting in the log).
    pub async fn wait(
        &mut self,
        transport: &Transport,
        lease: &LeaseRef,
        from: u64,
        deadline: tokio::time::Instant,
    ) -> Result<bool, Error> {
        self.wait_with(transport, lease, from, deadline, || async {}).await
    }

    /// [`LeaseRecord::wait`], calling `between` after each outcome that leaves the lease waiting (`acquire --block`
    /// looks at the queue then).
    pub async fn wait_with<F, Fut>(
        &mut self,
        transport: &Transport,
        lease: &LeaseRef,
        from: u64,
        deadline: tokio::time::Instant,
        mut between: F,
    ) -> Result<bool, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        if self.state != "waiting" {
            return Ok(true);
        }
        let mut events = transport.follow(&Key::Agent(lease.agent.clone()), from).await?;
        loop {
            let event = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(event)) => event?,
                Ok(None) => {
                    return Err(Error::transport(format!("the outcome stream ended while lease {lease} was waiting")));
                }
                Err(_) => return Ok(false),
            };
            for (position, effect) in event.outcome.positioned_effects() {
                if self.apply(lease.lease, position, effect) && self.state != "waiting" {
                    return Ok(true);
                }
            }
            if tokio::time::timeout_at(deadline, between()).await.is_err() {
                return Ok(false);
            }
        }
    }
}

/// Where a placement (an allocation that named no agent) went, as its outcomes say: the same fields as the
/// gateway's placement records (`GET /v1/placements/<id>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementRecord {
    pub resource: String,
    /// `seeking`, `waiting`, `placed`, `failed`, `cancelled`.
    pub state: String,
    /// Where it was placed: the agent and the resource's reference there.
    pub agent: Option<String>,
    pub reference: Option<String>,
    /// The agent's use of the kind with this resource, and its capacity for the kind.
    pub used: Option<u32>,
    pub capacity: Option<u32>,
    /// What it waits on (`waiting`), or why it was not placed (`failed`).
    pub why: Option<String>,
}

impl PlacementRecord {
    /// A placement just asked for.
    pub fn new(resource: ResourceId) -> Self {
        PlacementRecord {
            resource: resource.to_string(),
            state: "seeking".to_owned(),
            agent: None,
            reference: None,
            used: None,
            capacity: None,
            why: None,
        }
    }

    /// The placement as the answer to its request says, and the outcome sequence to follow it from. A request asked
    /// for before (answered `already-done`, a retry under another command id) is followed from the start of its
    /// history; any other answer goes through `accepted`, which gives its outcomes or the error.
    pub fn answered<E>(
        resource: ResourceId,
        status: CommandStatus,
        accepted: impl FnOnce(CommandStatus) -> Result<Vec<SeqOutcome>, E>,
    ) -> Result<(Self, u64), E> {
        let mut record = PlacementRecord::new(resource);
        if status.rejection.as_ref().is_some_and(|r| r.kind == "already-done") {
            return Ok((record, 0));
        }
        let outcomes = accepted(status)?;
        for effect in outcomes.iter().flat_map(|o| o.outcome.effects()) {
            record.apply(effect);
        }
        Ok((record, outcomes.iter().map(|o| o.seq).max().unwrap_or(0)))
    }

    /// True once it will not change any more: placed, refused or cancelled.
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "placed" | "failed" | "cancelled")
    }

    /// Applies an effect of the placement's outcomes; true if it changed the record.
    pub fn apply(&mut self, effect: &Effect) -> bool {
        let mine = |resource: &ResourceId| resource.to_string() == self.resource;
        match effect {
            Effect::PlacementWaiting { resource, why } if mine(resource) => {
                self.state = "waiting".to_owned();
                self.why = Some(why.clone());
            }
            Effect::PlacementBound { resource, agent, used, capacity, .. } if mine(resource) => {
                self.state = "placed".to_owned();
                self.reference = Some(format!("{agent}.{resource}"));
                self.agent = Some(agent.to_string());
                self.used = Some(*used);
                self.capacity = Some(*capacity);
                self.why = None;
            }
            Effect::PlacementFailed { resource, why } if mine(resource) => {
                self.state = "failed".to_owned();
                self.why = Some(why.clone());
            }
            Effect::PlacementCancelled { resource, by, reason } if mine(resource) => {
                self.state = "cancelled".to_owned();
                self.why = Some(match reason {
                    Some(reason) => format!("by {by}: {reason}"),
                    None => format!("by {by}"),
                });
            }
            _ => return false,
        }
        true
    }

    /// "placed on w3: 12 of 50 container; zone=a", "waiting for room: ...", "not placed: ...".
    pub fn describe(&self, request: &Place) -> String {
        let labels: Vec<String> = request.select.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("; {}", labels.join(",")) };
        match self.state.as_str() {
            "placed" => format!(
                "placed on {}: {} of {} {}{labels}",
                self.agent.as_deref().unwrap_or("?"),
                self.used.unwrap_or(0),
                self.capacity.unwrap_or(0),
                request.kind
            ),
            "waiting" => format!("waiting for room: {}", self.why.as_deref().unwrap_or("")),
            "failed" => format!("not placed: {}", self.why.as_deref().unwrap_or("")),
            "cancelled" => format!("cancelled {}", self.why.as_deref().unwrap_or("")),
            _ => "seeking an agent".to_owned(),
        }
    }

    /// Follows the placement's outcomes from sequence `from` until it ends, or `deadline` passes (then it is
    /// returned as it is: seeking or waiting, which it goes on doing in the log). `on_wait` is told each new reason
    /// it waits for.
    pub async fn follow(
        &mut self,
        transport: &Transport,
        resource: ResourceId,
        from: u64,
        deadline: tokio::time::Instant,
        mut on_wait: impl FnMut(&PlacementRecord),
    ) -> Result<(), Error> {
        if self.ended() {
            return Ok(());
        }
        let mut events = transport.follow(&Key::Placement(resource), from).await?;
        loop {
            let event = match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(event)) => event?,
                Ok(None) => {
                    return Err(Error::transport(format!(
                        "the outcome stream ended while the placement of {resource} was {}",
                        self.state
                    )));
                }
                Err(_) => return Ok(()),
            };
            for effect in event.outcome.effects() {
                if self.apply(effect) {
                    if self.ended() {
                        return Ok(());
                    }
                    on_wait(self);
                }
            }
        }
    }
}

/// A producer: who sends (its issuer), where its commands go, and how long it waits for an outcome. Each call sends
/// one command and waits until it is decided: the answer is the accepted outcome, or an [`Error`] that says what
/// became of it. A command whose outcome is unknown ([`Error::OutcomeUnknown`]) is sent again safely with
/// [`Producer::send`] and the same envelope.
#[derive(Debug)]
pub struct Producer {
    transport: Transport,
    issuer: Issuer,
    timeout: Duration,
}

impl Producer {
    /// Commands from `issuer` through `transport` (a [`Gateway`], or [`Transport::nats`]), waiting up to
    /// [`DEFAULT_TIMEOUT`] for each outcome.
    pub fn new(transport: impl Into<Transport>, issuer: Issuer) -> Self {
        Producer { transport: transport.into(), issuer, timeout: DEFAULT_TIMEOUT }
    }

    /// The same producer, waiting up to `timeout` for each outcome.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Producer { timeout, ..self }
    }

    /// The same producer, bound to its issuer as principal ([`Transport::bound`]): on NATS, its commands go on
    /// `lh.in.op@<issuer>.>`, the only subjects a user made with `leasehold credentials producer NAME --principal
    /// <issuer>` may publish on, and the writer holds it to that issuer. Invalid through a gateway, whose token
    /// fixes the issuer.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold_client::{Producer, Transport};
    /// use leasehold_log::jetstream::JetStreamConfig;
    ///
    /// let transport = Transport::nats(JetStreamConfig::new("nats://127.0.0.1:4222", 0)).await?;
    /// let producer = Producer::new(transport, "ci:team-a".parse()?).bound()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn bound(self) -> Result<Self, Error> {
        let transport = self.transport.bound(self.issuer.clone())?;
        Ok(Producer { transport, ..self })
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    pub fn issuer(&self) -> &Issuer {
        &self.issuer
    }

    /// An envelope for `body` with a new command id, from this producer's issuer.
    pub fn envelope(&self, body: impl Into<Command>) -> Envelope {
        envelope(&self.issuer, None, body)
    }

    /// Sends `envelope` and waits for its outcome: the accepted status, or why not.
    pub async fn send(&self, envelope: &Envelope) -> Result<CommandStatus, Error> {
        let sent = self.transport.submit(envelope, self.timeout).await;
        let status = settle(sent, envelope, self.timeout)?;
        let what = format!("{} {}", envelope.type_name(), envelope.body.key().token());
        let outcomes = outcomes(status.clone(), &what)?;
        Ok(CommandStatus { outcomes, ..status })
    }

    /// Sends one command (`Renew`, `Release`, `Pause`, `DefinePool`, `RetireAgent`...) with a new command id and
    /// waits for its outcome.
    pub async fn command(&self, body: impl Into<Command>) -> Result<CommandStatus, Error> {
        self.send(&self.envelope(body)).await
    }

    /// Allocates a resource and waits until the allocation is decided: its reference, `<agent>.<id>` (the resource
    /// itself is created by its agent after this; follow it with [`Gateway::get`] of `v1/resources/<ref>`).
    pub async fn allocate(&self, body: Allocate) -> Result<ResourceRef, Error> {
        let reference = ResourceRef::new(body.agent.clone(), body.resource);
        let status = self.command(body).await?;
        check_allocated(&status.command_id, &reference, &status.outcomes)?;
        Ok(reference)
    }

    /// Places a resource on whichever agent fits (an allocation that names no agent) and waits until the placement
    /// ends or `wait` (beyond this producer's timeout) passes: placed (the record holds its reference), refused, or
    /// still waiting. A request sent again is answered with where it went.
    pub async fn place(&self, body: Place) -> Result<PlacementRecord, Error> {
        let envelope = self.envelope(body.clone());
        let sent = self.transport.submit(&envelope, self.timeout).await;
        let status = settle(sent, &envelope, self.timeout)?;
        let what = format!("place {}", body.resource);
        let (mut record, from) = PlacementRecord::answered(body.resource, status, |s| outcomes(s, &what))?;
        let wait = body.wait.map(|w| Duration::from_millis(w.0)).unwrap_or_default();
        let deadline = tokio::time::Instant::now() + self.timeout + wait;
        record.follow(&self.transport, body.resource, from, deadline, |_| {}).await?;
        if record.state == "failed" {
            return Err(Error::refused(record.describe(&body)));
        }
        Ok(record)
    }

    /// Asks for a lease and waits until the acquisition is decided: the lease, `active` (granted, with its token) or
    /// `waiting` (on a pending resource: [`LeaseRecord::wait`] follows it).
    pub async fn acquire(&self, body: Acquire) -> Result<LeaseRecord, Error> {
        let status = self.command(body.clone()).await?;
        LeaseRecord::acquired(&body, &status.command_id, &status.outcomes).map(|(record, _)| record)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    use leasehold_schemas::{Millis, Outcome};

    use super::*;

    const REF: &str = "w1.019b76da-9478-7111-9111-111111111111";

    fn allocate_envelope() -> Envelope {
        let body = Allocate::new("w1".parse().unwrap(), REF[3..].parse().unwrap(), "dir", 1);
        envelope(&Issuer::new("cli").unwrap(), Some("019b76da-abe8-7001-8000-000000000001".parse().unwrap()), body)
    }

    fn status(status: &str) -> CommandStatus {
        CommandStatus {
            command_id: "019b76da-abe8-7001-8000-000000000001".into(),
            status: status.into(),
            command_seq: Some(12),
            duplicate: false,
            rejection: (status == "rejected")
                .then(|| RejectionInfo { kind: "at-capacity".into(), message: "has 2 of 2 leases".into() }),
            outcomes: Vec::new(),
            dead_letter: None,
        }
    }

    #[test]
    fn what_became_of_a_command_is_an_outcome_or_an_error_of_its_kind() {
        assert!(outcomes(status("accepted"), "acquire").is_ok());
        let rejected = outcomes(status("rejected"), "acquire w1.x").unwrap_err();
        assert_eq!(rejected.kind(), crate::ErrorKind::Rejected);
        assert_eq!(rejected.rejection().map(|r| r.kind.as_str()), Some("at-capacity"));
        assert_eq!(
            rejected.to_string(),
            "acquire w1.x rejected (at-capacity): has 2 of 2 leases [command 019b76da-abe8-7001-8000-000000000001]"
        );
        let dead = outcomes(status("dead-lettered"), "pause w1.x").unwrap_err();
        assert_eq!(dead.kind(), crate::ErrorKind::DeadLettered);
        assert!(dead.to_string().starts_with("pause w1.x was dead-lettered, not decided"), "{dead}");
        let pending = outcomes(status("pending"), "acquire").unwrap_err();
        assert_eq!(pending.kind(), crate::ErrorKind::OutcomeUnknown);
        assert!(pending.to_string().contains("leasehold command 019b76da-abe8-7001-8000-000000000001"), "{pending}");
        assert_eq!(pending.status().and_then(|s| s.command_seq), Some(12));
    }

    #[test]
    fn a_status_still_pending_at_the_timeout_is_an_unknown_outcome() {
        let envelope = allocate_envelope();
        let unknown = settle(Ok(status("pending")), &envelope, Duration::from_secs(30)).unwrap_err();
        assert_eq!(unknown.kind(), crate::ErrorKind::OutcomeUnknown);
        let text = unknown.to_string();
        assert!(text.contains("it is stored at command seq 12, and no outcome came within 30s"), "{text}");
        assert!(text.contains("--command-id 019b76da-abe8-7001-8000-000000000001 --id 019b76da-9478"), "{text}");
        assert!(settle(Ok(status("rejected")), &envelope, Duration::ZERO).is_ok(), "decided: the caller reads it");
        let refused = settle(Err(Error::refused("no")), &envelope, Duration::ZERO).unwrap_err();
        assert_eq!(refused.kind(), crate::ErrorKind::Refused);
    }

    #[test]
    fn an_acquisition_answered_for_another_lease_is_refused() {
        let lease: LeaseId = "019b76da-9860-7333-b333-333333333333".parse().unwrap();
        let body = Acquire {
            agent: "w1".parse().unwrap(),
            resource: REF[3..].parse().unwrap(),
            lease,
            holder: "build-1".into(),
            ttl: None,
            wait_timeout: None,
            priority: 0,
        };
        let granted = |lease: LeaseId| -> SeqOutcome {
            let outcome: Outcome = serde_json::from_value(serde_json::json!({
                "decider_version": 1, "partition": 0,
                "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.acquire",
                            "issuer": "cli", "issued_at": 1u64, "key": "w1"},
                "cmd_seq": 3, "part": 0, "log_time": 2u64, "decided_at": 2u64,
                "decision": {"accepted": {"first_position": 7, "effects": [
                    {"lease-granted": {"lease": lease.to_string(), "resource": &REF[3..], "holder": "build-1",
                        "ttl": null, "expires_at": null}}
                ]}}
            }))
            .unwrap();
            SeqOutcome { seq: 40, outcome }
        };
        let (record, last) = LeaseRecord::acquired(&body, "c1", &[granted(lease)]).unwrap();
        assert_eq!((record.state.as_str(), record.token, last), ("active", Some(7), 40));
        assert_eq!((record.id, record.resource), (format!("w1.{lease}"), REF.to_owned()));
        let other = LeaseRecord::acquired(&body, "c1", &[granted(LeaseId::generate())]).unwrap_err();
        assert_eq!(other.kind(), crate::ErrorKind::Refused);
        assert!(other.to_string().contains("given with another --lease-id?"), "{other}");
    }

    #[test]
    fn lease_refs_round_trip() {
        let text = "w1.019b76da-9860-7333-b333-333333333333";
        let lease: LeaseRef = text.parse().unwrap();
        assert_eq!(lease.agent.as_str(), "w1");
        assert_eq!(lease.to_string(), text);
        assert!("019b76da-9860-7333-b333-333333333333".parse::<LeaseRef>().is_err());
        assert!("W1.019b76da-9860-7333-b333-333333333333".parse::<LeaseRef>().is_err());
    }

    #[test]
    fn a_lease_follows_its_own_effects_only() {
        let lease = LeaseId::generate();
        let other = LeaseId::generate();
        let resource = ResourceId::generate();
        let mut record = LeaseRecord {
            id: format!("w1.{lease}"),
            resource: format!("w1.{resource}"),
            holder: "build-1".into(),
            state: "waiting".into(),
            token: None,
            expires_at: None,
            wait_until: None,
        };
        let waiting = Effect::LeaseWaiting {
            lease,
            resource,
            holder: "build-1".into(),
            ttl: None,
            wait_until: Some(Timestamp(5_000)),
        };
        assert!(record.apply(lease, Position(3), &waiting));
        assert_eq!(record.wait_until, Some(5_000));
        assert!(!record.apply(lease, Position(4), &Effect::LeaseFailed { lease: other }));
        let granted = Effect::LeaseGranted {
            lease,
            resource,
            holder: "build-1".into(),
            ttl: Some(Millis(60_000)),
            expires_at: Some(Timestamp(70_000)),
        };
        assert!(record.apply(lease, Position(9), &granted));
        assert_eq!((record.state.as_str(), record.token, record.expires_at), ("active", Some(9), Some(70_000)));
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["id"], format!("w1.{lease}"));
        assert_eq!(json["token"], 9);
        assert_eq!(json["wait_until"], serde_json::Value::Null);
    }

    /// An embedded log whose clock the test moves, with an allocation `envelope` published and decided once.
    async fn decided_once(envelope: &Envelope) -> (leasehold_log::embedded::Embedded, Arc<AtomicU64>, u64) {
        let now = Arc::new(AtomicU64::new(1_767_225_600_000));
        let clock = Arc::clone(&now);
        let log =
            leasehold_log::embedded::Embedded::in_memory(4, Arc::new(move || Timestamp(clock.load(SeqCst)))).unwrap();
        let id = envelope.command_id.to_string();
        let payload = leasehold_schemas::codec::encode_command(envelope).unwrap();
        let subject = leasehold_schemas::subjects::ingress_subject_of(&envelope.body);
        let first = log.publish_command(&subject, &id, payload.into()).await.unwrap();
        assert!(!first.duplicate);
        let outcome: Outcome = serde_json::from_value(serde_json::json!({
            "decider_version": 1, "partition": 0,
            "command": {"id": id, "class": "op", "type_name": "op.allocate", "issuer": "cli",
                        "issued_at": 1767225600000u64, "key": "w1"},
            "cmd_seq": first.seq, "part": 0, "log_time": 1767225600000u64, "decided_at": 1767225600000u64,
            "decision": {"accepted": {"first_position": 1, "effects": [
                {"resource-allocated": {"resource": &REF[3..], "kind": "dir", "capacity": 1, "attributes": {},
                    "parent": null}}
            ]}}
        }))
        .unwrap();
        let OutcomeFilter::Key { partition, key } = key_filter(&log, &envelope.body.key()) else { unreachable!() };
        let fence = log.last_outcome_seq(partition).await.unwrap();
        let record = leasehold_log::OutcomeRecord {
            key,
            cmd_id: id,
            cmd_seq: first.seq,
            part: 0,
            payload: leasehold_schemas::codec::encode_outcome(&outcome).unwrap().into(),
        };
        assert!(matches!(log.append(partition, fence, &[record]).await, leasehold_log::Appended::Landed { .. }));
        (log, now, first.seq)
    }

    #[tokio::test]
    async fn a_command_sent_again_through_the_log_gets_its_first_decision() {
        let envelope = allocate_envelope();
        let (log, now, first) = decided_once(&envelope).await;
        // Within the duplicate window: the log answers duplicate, and the decision is already there.
        let status = submit_to_log(&log, &envelope, Duration::from_secs(5)).await.unwrap();
        assert_eq!((status.status.as_str(), status.duplicate, status.command_seq), ("accepted", true, Some(first)));
        assert_eq!(status.outcomes.len(), 1);
        // After the window: stored again, at a new sequence, but decided once: the earlier decision, as a duplicate.
        now.fetch_add(11 * 60 * 1000, SeqCst);
        let status = submit_to_log(&log, &envelope, Duration::from_secs(5)).await.unwrap();
        assert_eq!((status.status.as_str(), status.duplicate, status.command_seq), ("accepted", true, Some(first)));
        assert_eq!(log.last_command_seq().await.unwrap(), first + 1, "stored again (past the window)");
    }

    #[tokio::test]
    async fn a_bound_producer_publishes_on_its_principal_s_subject_and_nothing_it_may_not_send() {
        let log = leasehold_log::embedded::Embedded::in_memory(4, Arc::new(|| Timestamp(1_767_225_600_000))).unwrap();
        let principal = Issuer::new("ci:team-a").unwrap();
        let body = Allocate::new("w1".parse().unwrap(), REF[3..].parse().unwrap(), "dir", 1);
        let mine = envelope(&principal, None, body.clone());
        assert_eq!(publish_subject(&mine, None).unwrap(), format!("lh.in.op.w1.{}", &REF[3..]));
        assert_eq!(publish_subject(&mine, Some(&principal)).unwrap(), format!("lh.in.op@ci:team-a.w1.{}", &REF[3..]));
        // Stored on the bound subject (nobody decides it here: pending at the timeout).
        let status = submit_to_log_as(&log, &mine, Some(&principal), Duration::from_millis(100)).await.unwrap();
        assert_eq!(status.status, "pending");
        let stored = log.command_at(status.command_seq.unwrap()).await.unwrap().expect("stored");
        assert_eq!(leasehold_schemas::subjects::bound_principal(&stored.subject), Some("ci:team-a"), "{stored:?}");
        // What the writer would dead-letter is refused before anything is sent.
        let before = log.last_command_seq().await.unwrap();
        let other = envelope(&Issuer::new("ci:team-b").unwrap(), None, body);
        let error = submit_to_log_as(&log, &other, Some(&principal), Duration::ZERO).await.unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Refused);
        assert!(error.to_string().contains("bound to principal ci:team-a: it sends as ci:team-a only"), "{error}");
        let pool = leasehold_schemas::command::DeletePool { pool: "ips".parse().unwrap() };
        let operator = envelope(&principal, None, pool);
        let error = submit_to_log_as(&log, &operator, Some(&principal), Duration::ZERO).await.unwrap_err();
        assert!(error.to_string().starts_with("op.delete-pool is the operator's"), "{error}");
        assert_eq!(log.last_command_seq().await.unwrap(), before, "nothing was published");
        // Only NATS binds, and only a principal that is one subject token.
        let gateway = Transport::Gateway(Gateway::new("http://127.0.0.1:7420").unwrap());
        assert_eq!(gateway.bound(principal).unwrap_err().kind(), crate::ErrorKind::Invalid);
        let dotted = Issuer::new("ci.team").unwrap();
        assert!(
            publish_subject(
                &envelope(&dotted, None, Allocate::new("w1".parse().unwrap(), ResourceId::generate(), "dir", 1)),
                Some(&dotted)
            )
            .is_err()
        );
    }

    #[tokio::test]
    async fn another_command_under_a_used_id_is_refused_on_the_log() {
        let envelope = allocate_envelope();
        let (log, now, first) = decided_once(&envelope).await;
        let mut other = envelope.clone();
        let Command::Allocate(body) = &mut other.body else { unreachable!() };
        body.resource = ResourceId::generate();
        let expected = format!(
            "command id {} names another command (op.allocate for w1, stored at command sequence {first})",
            envelope.command_id
        );
        // A duplicate of the log: refused (the command line's exit status 1).
        let error = submit_to_log(&log, &other, Duration::from_secs(5)).await.unwrap_err();
        assert!(error.to_string().starts_with(&expected), "{error}");
        assert_eq!(error.kind(), crate::ErrorKind::Refused);
        // Past the window: the earlier decision of the id is another command's.
        now.fetch_add(11 * 60 * 1000, SeqCst);
        let error = submit_to_log(&log, &other, Duration::from_secs(5)).await.unwrap_err();
        assert!(error.to_string().starts_with(&expected), "{error}");
        // A new command that nobody decides: pending at the timeout, not a duplicate.
        let fresh = Envelope { command_id: CommandId::generate(), ..envelope };
        let status = submit_to_log(&log, &fresh, Duration::from_millis(200)).await.unwrap();
        assert_eq!((status.status.as_str(), status.duplicate), ("pending", false));
    }
}
