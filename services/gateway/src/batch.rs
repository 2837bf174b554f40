//! `POST /v1/commands/batch`: many commands in one request, published together (one transaction and one fsync on the
//! embedded log, one atomic batch on JetStream), each checked and answered as `POST /v1/commands` would check and
//! answer it alone, so a bulk load costs one round trip per thousand commands instead of one per command.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use leasehold_log::Log;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::auth::Principal;
use crate::commands::{self, Checked, CommandStatus, Refusal};
use crate::{Api, error};

pub use leasehold_schemas::api::{BatchRefusal, MAX_BATCH_BYTES, MAX_BATCH_COMMANDS};

// A batch is one publish of the log: it holds no more than one append takes.
const _: () = assert!(MAX_BATCH_COMMANDS == leasehold_log::MAX_APPEND_RECORDS);

/// How many duplicates are compared with what the log holds under their id at once (each is a read of the log).
const CONCURRENT_LOOKUPS: usize = 16;

/// One command's answer in a batch: what `POST /v1/commands` answers without `?wait` (`published`, its command
/// sequence, whether it was a duplicate), or why it was refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum BatchAnswer {
    Refused(BatchRefusal),
    Published(CommandStatus),
}

/// Takes a JSON array of `op` commands, each exactly what `POST /v1/commands` takes, and publishes the good ones with
/// one publish of the log. Answers 200 with one answer per command, in the order given, whatever became of each (a
/// bad command does not stop the others: its answer is a [`BatchRefusal`] that names its index). A body that is not
/// a JSON array, too large, or with more than [`MAX_BATCH_COMMANDS`] commands is a plain 400 and nothing is
/// published; a projection that cannot be read is a 503 before anything is published.
///
/// There is no `?wait`: waiting on a thousand outcomes would hold the request for as long as the slowest of them.
/// Clients follow the commands with `GET /v1/commands/{id}`, or their outcomes with `GET /v1/events`.
pub(crate) async fn post<L: Log>(
    State(api): State<Arc<Api<L>>>,
    principal: Option<Extension<Principal>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(query) = uri.query() {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "bad query {query:?}: POST /v1/commands/batch takes none (no ?wait); it answers once the commands are \
                 published: follow each with GET /v1/commands/{{id}}, or their outcomes with GET /v1/events"
            ),
        );
    }
    if !commands::json_content(&headers) {
        return error(
            StatusCode::BAD_REQUEST,
            "a batch of commands is sent as a JSON array, with Content-Type: application/json",
        );
    }
    let bytes = match axum::body::to_bytes(body, MAX_BATCH_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "the body could not be read within the {MAX_BATCH_BYTES} bytes a batch may take (send fewer \
                     commands per batch): {e}"
                ),
            );
        }
    };
    // Each item is kept as its own text, so that it goes through the strict decoding of a command alone (a key
    // twice in a command is refused there, which a parsed `Value` would have hidden).
    let items: Vec<&RawValue> = match serde_json::from_slice(&bytes) {
        Ok(items) => items,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("a batch is a JSON array of commands, each what POST /v1/commands takes: {e}"),
            );
        }
    };
    if items.len() > MAX_BATCH_COMMANDS {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "a batch takes at most {MAX_BATCH_COMMANDS} commands, not {}: send them in several batches",
                items.len()
            ),
        );
    }
    let principal = principal.map(|Extension(principal)| principal);
    let mut answers: Vec<Option<BatchAnswer>> = vec![None; items.len()];
    // The commands that passed the checks, with their first decision when the projection has one.
    let mut taken: Vec<(usize, Checked, Option<leasehold_schemas::Outcome>)> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match commands::check(item.get().as_bytes(), principal.as_ref()) {
            Ok(checked) => match commands::first_decision(&api, &checked.id) {
                Ok(decided) => taken.push((index, checked, decided)),
                // Nothing is published yet: the whole batch can be sent again as it is.
                Err(refusal) => return refusal.into_response(),
            },
            Err(refusal) => answers[index] = Some(refused(index, id_in(item), refusal)),
        }
    }
    let new: Vec<leasehold_log::Publish> = taken
        .iter()
        .filter(|(_, _, decided)| decided.is_none())
        .map(|(_, checked, _)| checked.publish.clone())
        .collect();
    let mut published = api.log.publish_commands(&new).await.into_iter();
    let landed: Vec<_> = taken
        .into_iter()
        .map(|(index, checked, decided)| {
            let answer = match &decided {
                Some(first) => Ok(commands::first_copy(first)),
                None => published.next().unwrap_or_else(|| {
                    Err(leasehold_log::Error::Unavailable("the log answered fewer commands than it was given".into()))
                }),
            };
            (index, checked, decided, answer)
        })
        .collect();
    let settled: Vec<(usize, String, Result<leasehold_log::Published, Refusal>)> =
        futures::stream::iter(landed.into_iter().map(|(index, checked, decided, answer)| {
            let api = &api;
            async move {
                let landed = commands::landed(api, &checked.envelope, answer, decided.as_ref()).await;
                (index, checked.id, landed)
            }
        }))
        .buffered(CONCURRENT_LOOKUPS)
        .collect()
        .await;
    let n_published = settled.iter().filter(|(_, _, landed)| landed.as_ref().is_ok_and(|p| !p.duplicate)).count();
    for (index, id, landed) in settled {
        answers[index] = Some(match landed {
            Ok(published) => BatchAnswer::Published(CommandStatus::published(&id, published)),
            Err(refusal) => refused(index, Some(id), refusal),
        });
    }
    tracing::debug!(commands = answers.len(), published = n_published, "batch published");
    let answers: Vec<BatchAnswer> =
        answers.into_iter().map(|answer| answer.expect("each item is refused at its check or settled")).collect();
    (StatusCode::OK, Json(answers)).into_response()
}

fn refused(index: usize, command_id: Option<String>, refusal: Refusal) -> BatchAnswer {
    BatchAnswer::Refused(BatchRefusal {
        index,
        command_id,
        // Its message is shown to people, like every error of the gateway's (`crate::error`).
        error: leasehold_schemas::text::escape_for_display(&refusal.message).into_owned(),
        status_code: refusal.status.as_u16(),
    })
}

/// The `command_id` an item that did not decode says it has, if it says one: so a client can tell which of its
/// commands was refused.
fn id_in(item: &RawValue) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(item.get()).ok()?;
    value.get("command_id")?.as_str().map(str::to_owned)
}
