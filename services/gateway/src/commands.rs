//! `POST /v1/commands` and `GET /v1/commands/{id}`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use leasehold_domain::MAX_ID_AHEAD;
use leasehold_log::Log;
use leasehold_schemas::codec::{self, MAX_COMMAND_BYTES};
use leasehold_schemas::command::{Allocate, SubjectId};
use leasehold_schemas::ids::{CommandId, Timestamp};
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{Command, CommandClass, Envelope, Outcome, Rejection};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::{Api, error};

/// What the gateway knows of a command: `published` (no wait asked), `accepted` or `rejected` (decided: its
/// outcome, every part of it), `dead-lettered` (with the reason), or `pending` (a wait that ran out of time).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommandStatus {
    pub command_id: String,
    pub status: String,
    /// Its sequence in the command log, when the gateway published it or it was dead-lettered.
    pub command_seq: Option<u64>,
    /// The command id was published before (within the log's duplicate window): nothing was stored again.
    pub duplicate: bool,
    pub rejection: Option<Rejection>,
    /// The outcome, part by part, with each part's sequence in the outcome log.
    pub outcomes: Vec<PositionedOutcome>,
    pub dead_letter: Option<DeadLetterView>,
    /// Why the answer is incomplete, when it is (a wait that ran out, a gateway shutting down): the command is stored
    /// all the same, and `GET /v1/commands/{id}` answers later.
    pub detail: Option<String>,
}

/// One part of an outcome and its sequence in the outcome log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PositionedOutcome {
    pub seq: u64,
    pub outcome: Outcome,
}

/// Why a command was dead-lettered, and where it was stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeadLetterView {
    pub reason: String,
    pub source_seq: u64,
    pub subject: String,
    /// The dead letter's payload names the command id asked for. False: it names none, and the id is only the
    /// `Nats-Msg-Id` its producer published it under (the answer's `detail` says so).
    pub id_verified: bool,
}

impl CommandStatus {
    fn new(command_id: &str, status: &str, command_seq: Option<u64>) -> Self {
        CommandStatus {
            command_id: command_id.to_owned(),
            status: status.to_owned(),
            command_seq,
            duplicate: false,
            rejection: None,
            outcomes: Vec::new(),
            dead_letter: None,
            detail: None,
        }
    }

    /// A command published (or found stored) and not waited for.
    pub(crate) fn published(command_id: &str, published: leasehold_log::Published) -> Self {
        let mut status = CommandStatus::new(command_id, "published", Some(published.seq));
        status.duplicate = published.duplicate;
        status
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostQuery {
    wait: Option<bool>,
    /// How long to wait (`30s`, `2m`...).
    timeout: Option<String>,
}

/// Takes one `op` command in JSON, publishes it on its ingress subject, and answers its id (202), or with
/// `?wait=true` its outcome once decided and projected (200), or where it stands when the wait ran out (504).
pub(crate) async fn post<L: Log>(
    State(api): State<Arc<Api<L>>>,
    principal: Option<Extension<Principal>>,
    query: Result<Query<PostQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    let timeout = match wait_time(&api, query.timeout.as_deref()) {
        Ok(timeout) => timeout,
        Err(response) => return response,
    };
    if !json_content(&headers) {
        return error(StatusCode::BAD_REQUEST, "a command is sent as JSON, with Content-Type: application/json");
    }
    let bytes = match axum::body::to_bytes(body, MAX_COMMAND_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body could not be read within the {MAX_COMMAND_BYTES} bytes a command may take: {e}"),
            );
        }
    };
    let principal = principal.map(|Extension(principal)| principal);
    let Checked { envelope, id, publish } = match check(&bytes, principal.as_ref()) {
        Ok(checked) => checked,
        Err(refusal) => return refusal.into_response(),
    };
    let decided = match first_decision(&api, &id) {
        Ok(decided) => decided,
        Err(refusal) => return refusal.into_response(),
    };
    let published = match &decided {
        Some(first) => Ok(first_copy(first)),
        None => api.ingest.publish(publish).await,
    };
    let published = match landed(&api, &envelope, published, decided.as_ref()).await {
        Ok(published) => published,
        Err(refusal) => return refusal.into_response(),
    };
    tracing::debug!(command = %id, r#type = envelope.type_name(), seq = published.seq, "published");
    let Some(timeout) = query.wait.unwrap_or(false).then_some(timeout) else {
        return (StatusCode::ACCEPTED, Json(CommandStatus::published(&id, published))).into_response();
    };
    let (code, mut status) = wait_for(&api, &id, published.seq, timeout).await;
    status.duplicate = published.duplicate;
    (code, Json(status)).into_response()
}

/// Why the gateway refuses one command (alone, or as an item of a batch): the status `POST /v1/commands` answers
/// for it, and a message that says what to do.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal { status, message: message.into() }
    }

    /// A failure of the read models or the log (503: they may be back soon), logged.
    pub(crate) fn unavailable(what: &str, e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "{what}");
        Refusal::new(StatusCode::SERVICE_UNAVAILABLE, format!("{what}: {e}"))
    }

    pub(crate) fn into_response(self) -> Response {
        error(self.status, self.message)
    }
}

/// Whether a request's body is JSON: no Content-Type, or exactly `application/json` (parameters such as
/// `; charset=utf-8` aside).
pub(crate) fn json_content(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_none_or(|kind| {
        kind.to_str()
            .is_ok_and(|k| k.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")))
    })
}

/// A command the gateway takes, checked and ready to publish.
pub(crate) struct Checked {
    /// The command as it is recorded (the principal its issuer).
    pub(crate) envelope: Envelope,
    pub(crate) id: String,
    /// It on its ingress subject, in the bincode form.
    pub(crate) publish: leasehold_log::Publish,
}

/// The checks every command goes through at the gateway, alone or in a batch: the strict decoding of `schemas` (400
/// naming the field), the authenticated principal as its issuer, `op` commands only (403), no id stamped more than
/// [`MAX_ID_AHEAD`] ahead of the gateway's clock (400), its bincode form within size (400).
pub(crate) fn check(json: &[u8], principal: Option<&Principal>) -> Result<Checked, Refusal> {
    let mut envelope =
        codec::command_from_json(json).map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    // An authenticated caller is the issuer: the body's `issuer` is a claim, replaced (not refused when it differs,
    // so a client need not know its principal's spelling). What is published, and what a retry is compared with
    // later, is the command as recorded, with the principal.
    if let Some(Principal(principal)) = principal {
        envelope.issuer = principal.clone();
    }
    if envelope.class != CommandClass::Op {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!(
                "the gateway takes op commands only; {} is {} {} command, sent by its {} on NATS with credentials \
                 that allow it",
                envelope.type_name(),
                if envelope.class == CommandClass::Agent { "an" } else { "a" },
                envelope.class,
                if envelope.class == CommandClass::Agent { "agent" } else { "sweeper" }
            ),
        ));
    }
    check_not_ahead(&envelope, gateway_now())?;
    let payload = codec::encode_command(&envelope).map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let id = envelope.command_id.to_string();
    let publish = leasehold_log::Publish {
        subject: ingress_subject_of(&envelope.body),
        msg_id: id.clone(),
        payload: payload.into(),
    };
    Ok(Checked { envelope, id, publish })
}

fn gateway_now() -> Timestamp {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The ids of a command that carry their issuer's clock (UUIDv7): the command's own, and the resource, lease and
/// parent it names, each with what to call it.
fn stamped_ids(envelope: &Envelope) -> Vec<(&'static str, String, Timestamp)> {
    let mut ids = vec![("command id", envelope.command_id.to_string(), envelope.command_id.time())];
    match envelope.body.subject_id() {
        SubjectId::Resource(id) => ids.push(("resource id", id.to_string(), id.time())),
        SubjectId::Lease(id) => ids.push(("lease id", id.to_string(), id.time())),
        SubjectId::None => {}
    }
    match &envelope.body {
        Command::Acquire(acquire) => ids.push(("resource id", acquire.resource.to_string(), acquire.resource.time())),
        Command::Allocate(Allocate { parent: Some(parent), .. }) => {
            ids.push(("parent id", parent.resource.to_string(), parent.resource.time()))
        }
        _ => {}
    }
    ids
}

/// Refuses (400) a command with an id stamped more than [`MAX_ID_AHEAD`] after `now`, the gateway's clock: the
/// partition would refuse it by the log's clock anyway, and an issuer whose clock runs ahead learns it before
/// anything is stored.
fn check_not_ahead(envelope: &Envelope, now: Timestamp) -> Result<(), Refusal> {
    let limit = now.saturating_add(MAX_ID_AHEAD);
    match stamped_ids(envelope).into_iter().find(|(_, _, stamped)| *stamped > limit) {
        None => Ok(()),
        Some((what, id, stamped)) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{what} {id} says it was made at {stamped}, more than {MAX_ID_AHEAD} after the gateway's clock \
                 ({now}); ids are UUIDv7 and carry their issuer's time: fix the issuer's clock"
            ),
        )),
    }
}

/// The first decision of command `id`, when the projection has one. A command id names one command: one already
/// decided is not published again. A retry gets its first decision back; another command under the same id is
/// refused (each partition remembers only its own ids, so the log alone would decide it again in another
/// partition).
pub(crate) fn first_decision<L: Log>(api: &Api<L>, id: &str) -> Result<Option<Outcome>, Refusal> {
    match api.reader.outcome(id) {
        Ok(outcomes) => Ok(outcomes.into_iter().next().map(|(_, outcome)| outcome)),
        Err(e) => Err(Refusal::unavailable("the projection cannot be read", e)),
    }
}

/// What a command already decided is answered with instead of being published again: its first copy.
pub(crate) fn first_copy(decided: &Outcome) -> leasehold_log::Published {
    leasehold_log::Published { seq: decided.cmd_seq, duplicate: true }
}

/// Where the log put a checked command, as its answer says it: `published` is what the log answered (or the
/// [`first_copy`] of `decided`). A publish the log refused is a 400 (nothing was stored), one it could not answer a
/// 503 (it may have been stored: sending it again is safe). What the log holds under a duplicate's id must be this
/// very command: a client sending another command under an id already used (at once, or later) would otherwise get
/// the other command's decision for its own (409).
pub(crate) async fn landed<L: Log>(
    api: &Api<L>,
    envelope: &Envelope,
    published: Result<leasehold_log::Published, leasehold_log::Error>,
    decided: Option<&Outcome>,
) -> Result<leasehold_log::Published, Refusal> {
    use leasehold_log::NotStored;
    leasehold_log::settle_publish(&api.log, published, envelope, decided).await.map_err(|not| match not {
        NotStored::Refused(e) => Refusal::new(StatusCode::BAD_REQUEST, e.to_string()),
        NotStored::OtherCommand(why) => Refusal::new(StatusCode::CONFLICT, why),
        NotStored::Unanswered(e) => Refusal::unavailable("the command could not be published", e),
        NotStored::Unchecked(e) => Refusal::unavailable("the command log cannot be read", e),
    })
}

fn wait_time<L: Log>(api: &Api<L>, asked: Option<&str>) -> Result<Duration, Response> {
    let Some(asked) = asked else { return Ok(api.config.default_wait) };
    let timeout = humantime::parse_duration(asked).map_err(|e| {
        error(StatusCode::BAD_REQUEST, format!("bad query: timeout {asked:?} is not a duration like 30s or 2m: {e}"))
    })?;
    if timeout > api.config.max_wait {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("bad query: timeout {asked} is longer than the {:?} a request may wait", api.config.max_wait),
        ));
    }
    Ok(timeout)
}

/// Waits until the command stored at `seq` is decided and projected, or dead-lettered, for up to `timeout`. Every
/// answer carries what is known: the command is stored whatever happens here, so a wait that runs out (504), a
/// projection that cannot be read or a gateway shutting down (503) answer `pending` with the command sequence, never
/// a bare error a client could take for a refusal.
async fn wait_for<L: Log>(api: &Api<L>, id: &str, seq: u64, timeout: Duration) -> (StatusCode, CommandStatus) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut applied = api.applied.clone();
    let mut projector_alive = true;
    // A detail is a message, escaped for display like the gateway's errors (`crate::error`): it may quote the log.
    let pending = |detail: String| {
        let mut status = CommandStatus::new(id, "pending", Some(seq));
        status.detail = Some(leasehold_schemas::text::escape_for_display(&detail).into_owned());
        status
    };
    loop {
        match status_of(api, id, Some(seq)).await {
            Ok(Some(status)) if status.outcomes.last().is_none_or(|last| !last.outcome.continues()) => {
                return (StatusCode::OK, status);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(command = id, error = %e, "cannot tell where a command stands");
                return (StatusCode::SERVICE_UNAVAILABLE, pending(format!("the command is stored; {e}")));
            }
        }
        // Outcomes arrive through the projector; dead letters do not, so they are looked for again now and then.
        tokio::select! {
            biased;
            () = api.shutdown.cancelled() => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    pending("the gateway is shutting down; the command is stored: ask for it again later".to_owned()),
                );
            }
            () = tokio::time::sleep_until(deadline) => {
                let detail = format!("not decided within {timeout:?}; the command is stored: ask for it again later");
                let status = match status_of(api, id, Some(seq)).await {
                    Ok(Some(mut status)) => {
                        // Some parts of a long decision, not all yet.
                        status.status = "pending".to_owned();
                        status.detail = Some(detail);
                        status
                    }
                    Ok(None) => pending(detail),
                    Err(e) => pending(format!("{detail} ({e})")),
                };
                return (StatusCode::GATEWAY_TIMEOUT, status);
            }
            changed = applied.changed(), if projector_alive => projector_alive = changed.is_ok(),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// The outcome of command `id` if the projection has it (the one of the command stored at `seq`, when given; the
/// first otherwise), else its dead letter (by the command log sequence it was stored at, when known, else by the id
/// in its header), else nothing.
async fn status_of<L: Log>(api: &Api<L>, id: &str, seq: Option<u64>) -> Result<Option<CommandStatus>, String> {
    let outcomes = api.reader.outcome(id).map_err(|e| format!("the projection cannot be read: {e}"))?;
    let first_seq = outcomes.first().map(|(_, o)| o.cmd_seq);
    let mut decisions: Vec<u64> = outcomes.iter().map(|(_, o)| o.cmd_seq).collect();
    decisions.dedup();
    let ours: Vec<_> = outcomes.into_iter().filter(|(_, o)| Some(o.cmd_seq) == seq.or(first_seq)).collect();
    if let Some((_, first)) = ours.first() {
        let rejection = first.rejection().cloned();
        let status = if rejection.is_some() { "rejected" } else { "accepted" };
        let mut answer = CommandStatus::new(id, status, Some(first.cmd_seq));
        answer.rejection = rejection;
        if decisions.len() > 1 {
            // Only a producer that reused an id on NATS, past the gateway, gets here: say so, never hide one.
            answer.detail = Some(format!(
                "command id {id} was used for {} commands, decided at command sequences {decisions:?}: this is the \
                 one at {}; ask GET /v1/commands/{id}?seq=N for another",
                decisions.len(),
                first.cmd_seq
            ));
        }
        answer.outcomes = ours.into_iter().map(|(seq, outcome)| PositionedOutcome { seq, outcome }).collect();
        return Ok(Some(answer));
    }
    let dead = match seq {
        Some(seq) => api.dead.by_source(&api.log, seq).await,
        None => api.dead.by_command(&api.log, id).await,
    }
    .map_err(|e| format!("the dead letters cannot be read: {e}"))?;
    Ok(dead.map(|dead| {
        let mut answer = CommandStatus::new(id, "dead-lettered", Some(dead.source_seq));
        let id_verified = dead.id_verified && dead.command_id.as_deref() == Some(id);
        if !id_verified {
            let at = dead.source_seq;
            answer.detail = Some(match &dead.command_id {
                Some(named) if named != id => {
                    format!("the dead letter at command sequence {at} is of command {named}, not {id}")
                }
                Some(_) => format!(
                    "unverified id: the dead letter at command sequence {at} names no command id that can be read; \
                     {id} is only the Nats-Msg-Id its producer published it under"
                ),
                None => format!("the dead letter at command sequence {at} names no command id"),
            });
        }
        answer.dead_letter = Some(DeadLetterView {
            reason: dead.reason,
            source_seq: dead.source_seq,
            subject: dead.subject,
            id_verified,
        });
        answer
    }))
}

/// The outcome of a command, or its dead letter.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GetQuery {
    /// The command sequence of the decision wanted, for an id used for several commands.
    seq: Option<u64>,
}

pub(crate) async fn get<L: Log>(
    State(api): State<Arc<Api<L>>>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<GetQuery>, QueryRejection>,
) -> Response {
    let id = match crate::path_param(id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", e.body_text())),
    };
    match lookup(&api, &id, query.seq).await {
        Ok(status) => Json(status).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// Where command `id` stands, as `GET /v1/commands/{id}[?seq=N]` answers it: its outcome, or its dead letter. A
/// text that is not a command id is a 400, a command with neither a 404, a projection or log that cannot be read
/// a 503.
pub(crate) async fn lookup<L: Log>(api: &Api<L>, id: &str, seq: Option<u64>) -> Result<CommandStatus, Refusal> {
    if let Err(e) = id.parse::<CommandId>() {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, format!("{id:?} is not a command id: {e}")));
    }
    match status_of(api, id, seq).await {
        Ok(Some(status)) => Ok(status),
        Ok(None) => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("no outcome and no dead letter for command {id}: it was not published, or is not decided yet"),
        )),
        Err(e) => Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e)),
    }
}
