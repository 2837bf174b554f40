//! The gateway's HTTP API, typed: submit a command and wait for its outcome, submit many in batches, read the read
//! models, follow outcomes as server-sent events. Every failure names the gateway and what to do.

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
pub use leasehold_schemas::api::BatchRefusal;
use leasehold_schemas::api::{MAX_BATCH_BYTES, MAX_BATCH_COMMANDS};
use leasehold_schemas::{Envelope, Outcome};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, OutcomeUnknown};

/// Where the gateway listens unless `--server` says otherwise.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";

/// How long a read may take before the command line gives up on the gateway.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The `after` of a `Link: <...?...&after=KEY>; rel="next"` header, percent-decoded.
fn next_after(link: &str) -> Option<String> {
    for part in link.split(',') {
        let (target, params) = part.trim().split_once(';')?;
        if !params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next")) {
            continue;
        }
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        let (_, query) = target.split_once('?')?;
        let value = query.split('&').find_map(|pair| pair.strip_prefix("after="))?;
        let bytes = value.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut idx = 0;
        while idx < bytes.len() {
            match bytes[idx] {
                b'%' if idx + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[idx + 1..idx + 3]).ok()?;
                    decoded.push(u8::from_str_radix(hex, 16).ok()?);
                    idx += 3;
                }
                b'+' => {
                    decoded.push(b' ');
                    idx += 1;
                }
                byte => {
                    decoded.push(byte);
                    idx += 1;
                }
            }
        }
        return String::from_utf8(decoded).ok();
    }
    None
}

/// What the gateway (or, with `--nats`, the command line itself) knows of one command: `POST /v1/commands` and
/// `GET /v1/commands/{id}` answer this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub command_id: String,
    /// `published`, `accepted`, `rejected`, `dead-lettered` or `pending`.
    pub status: String,
    pub command_seq: Option<u64>,
    #[serde(default)]
    pub duplicate: bool,
    pub rejection: Option<RejectionInfo>,
    #[serde(default)]
    pub outcomes: Vec<SeqOutcome>,
    pub dead_letter: Option<DeadLetterInfo>,
}

/// An outcome with its sequence in the outcome log (also the `data` of an `outcome` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeqOutcome {
    pub seq: u64,
    pub outcome: Outcome,
}

/// Why a command was rejected. The kind is kept as text: the gateway may name kinds of its own besides the
/// writer's (`leasehold_schemas::RejectionKind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionInfo {
    pub kind: String,
    pub message: String,
}

impl From<&leasehold_schemas::Rejection> for RejectionInfo {
    fn from(rejection: &leasehold_schemas::Rejection) -> Self {
        RejectionInfo { kind: rejection.kind.to_string(), message: rejection.message.clone() }
    }
}

/// Why a command went to the dead-letter stream instead of being decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterInfo {
    pub reason: String,
    pub source_seq: u64,
    pub subject: String,
    /// Whether the letter's payload names the command id asked for; false: the id is only the `Nats-Msg-Id` it
    /// was published under. None from a gateway that does not say.
    #[serde(default)]
    pub id_verified: Option<bool>,
}

/// The longest one request may wait on the gateway (its `max_wait`): a longer `--timeout` waits in rounds.
pub const MAX_ROUND: Duration = Duration::from_secs(300);

/// A status that will not change any more: the command was decided (every part of its outcome is there) or
/// dead-lettered.
pub fn decided(status: &CommandStatus) -> bool {
    match status.status.as_str() {
        "accepted" | "rejected" => status.outcomes.last().is_none_or(|last| !last.outcome.continues()),
        "dead-lettered" => true,
        _ => false,
    }
}

/// How long one batch of commands may take at the gateway: a thousand commands are one publish, and a duplicate
/// among them one more read of the log each.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// What became of one command of a batch ([`Gateway::submit_many`], `leasehold publish`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BatchItem {
    /// Refused (400, 403, 409: nothing stored for it), or not known to be stored (503: send it again).
    Refused(BatchRefusal),
    /// Stored, or found stored before (`duplicate`): `published` and its command sequence.
    Published(CommandStatus),
}

/// Ranges of `texts` (in order, each at least one text) of at most `max_commands` texts whose JSON array (`[`, the
/// texts with commas between, `]`) takes at most `max_bytes` bytes; a text larger alone makes a batch of its own,
/// which the gateway refuses with its reason.
pub fn batches(texts: &[String], max_commands: usize, max_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 2);
    for (index, text) in texts.iter().enumerate() {
        let more = text.len() + usize::from(index > start);
        if index > start && (index - start == max_commands || bytes + more > max_bytes) {
            ranges.push(start..index);
            (start, bytes) = (index, 2);
            bytes += text.len();
        } else {
            bytes += more;
        }
    }
    if start < texts.len() {
        ranges.push(start..texts.len());
    }
    ranges
}

/// What one round of [`Gateway::submit`] can end in besides an answer.
#[derive(Debug)]
enum RoundError {
    /// The gateway does not take commands yet (503 with `Retry-After`: it is starting): nothing was stored.
    NotReady {
        why: String,
        retry_after: Duration,
    },
    Failed(Error),
}

impl From<Error> for RoundError {
    fn from(error: Error) -> Self {
        RoundError::Failed(error)
    }
}

/// The gateway's error body (`400`, `403`, `404`).
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
}

/// A handle on the gateway at one base URL.
#[derive(Debug, Clone)]
pub struct Gateway {
    base: Url,
    http: reqwest::Client,
    /// Whether requests carry a bearer token (for what a 401 says).
    authenticated: bool,
}

/// The environment variable that holds the gateway's bearer token.
pub const TOKEN_ENV: &str = "LEASEHOLD_TOKEN";

/// A gateway's bearer token: `inline`, else the first line of `file`, else `$LEASEHOLD_TOKEN` (unless empty), else
/// none. Shared by every command line that talks to a gateway (`leasehold`, `leasehold-replay --server`).
pub fn bearer_token(inline: Option<&str>, file: Option<&std::path::Path>) -> Result<Option<String>, Error> {
    if let Some(token) = inline {
        return Ok(Some(token.to_owned()));
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Invalid {
            message: format!("--token-file {}: cannot read it", path.display()),
            source: Some(e.into()),
        })?;
        let token = text.lines().next().unwrap_or_default().trim();
        if token.is_empty() {
            return Err(Error::invalid(format!(
                "--token-file {}: its first line is empty; it holds the token, alone",
                path.display()
            )));
        }
        return Ok(Some(token.to_owned()));
    }
    Ok(std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_owned()))
}

impl Gateway {
    /// The gateway at `server`, without a token (a gateway without `--tokens`).
    pub fn new(server: &str) -> Result<Self, Error> {
        Self::with_token(server, None)
    }

    /// The gateway at `server`; every request carries `Authorization: Bearer <token>` when given.
    pub fn with_token(server: &str, token: Option<&str>) -> Result<Self, Error> {
        let base = Url::parse(server).map_err(|e| Error::Invalid {
            message: format!("--server {server:?} is not a URL"),
            source: Some(e.into()),
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(Error::invalid(format!("--server {server:?} is not an http:// URL")));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Error::invalid("the token has characters an HTTP header cannot carry"))?;
            // Kept out of the client's debug output.
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .default_headers(headers)
            .build()
            .map_err(|e| Error::Invalid { message: "building the HTTP client".to_owned(), source: Some(e.into()) })?;
        Ok(Gateway { base, http, authenticated: token.is_some() })
    }

    /// The error of a 401: nothing was stored; the token was refused, or the gateway wants one.
    fn unauthorized(&self, body: &str) -> Error {
        let what = if self.authenticated {
            "the gateway refused the token"
        } else {
            "the gateway refused the request without a token (give it in LEASEHOLD_TOKEN, --token-file or --gateway-token)"
        };
        Error::refused(format!("{what}: {}", error_text(body)))
    }

    /// The URL of `segments` (each percent-encoded) under the base, with `query`.
    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().expect("checked: the base is a base");
            path.pop_if_empty();
            path.extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// The error of a request that got no answer: its message says why (the cause is in it, not after it).
    fn unreachable(&self, error: reqwest::Error) -> Error {
        if error.is_connect() {
            Error::transport(format!(
                "cannot reach the gateway at {}: is `leasehold serve` running? ({error})",
                self.base
            ))
        } else if error.is_timeout() {
            Error::transport(format!("the gateway at {} did not answer in time ({error})", self.base))
        } else {
            Error::transport(format!("talking to the gateway at {}: {error}", self.base))
        }
    }

    /// Submits `envelope` and waits up to `wait` in all for its outcome to be decided and projected, in rounds of at
    /// most [`MAX_ROUND`] (the gateway's cap on one request): a round that runs out sends the same command again,
    /// which the gateway stores no second time (it answers it as a duplicate) and waits on. A `pending` status says
    /// the whole wait ran out. Refusals of the gateway itself (bad input, a class it does not take: nothing is
    /// stored) are plain errors; a failure after the command may have been stored is an [`OutcomeUnknown`].
    pub async fn submit(&self, envelope: &Envelope, wait: Duration) -> Result<CommandStatus, Error> {
        let body = leasehold_schemas::codec::command_to_json(envelope)
            .map_err(|e| Error::decode(format!("encoding command {}", envelope.command_id), e))?;
        let deadline = tokio::time::Instant::now() + wait;
        // Whether the first answer said "duplicate": later rounds are duplicates of the first by construction.
        let mut first_duplicate = None;
        loop {
            let asked_at = tokio::time::Instant::now();
            let round = deadline.saturating_duration_since(asked_at).min(MAX_ROUND);
            let sent_before = first_duplicate.is_some();
            let (code, mut status) = match self.submit_round(envelope, &body, round, sent_before).await {
                Ok(answer) => answer,
                Err(RoundError::NotReady { retry_after, .. }) if asked_at + retry_after < deadline => {
                    tokio::time::sleep(retry_after).await;
                    continue;
                }
                Err(RoundError::NotReady { why, .. }) => {
                    return Err(Error::refused(format!(
                        "the gateway did not take command {} within the time given: {why}",
                        envelope.command_id
                    )));
                }
                Err(RoundError::Failed(e)) => return Err(e),
            };
            status.duplicate = *first_duplicate.get_or_insert(status.duplicate);
            if decided(&status) {
                return Ok(status);
            }
            if code != StatusCode::GATEWAY_TIMEOUT || status.status != "pending" {
                let why = format!("the gateway answered {code} with status {:?}", status.status);
                return Err(OutcomeUnknown::new(envelope, why, Some(status)).into());
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(status);
            }
            // The gateway answers `pending` when the time asked is up; one that answers sooner is asked again no
            // more than once a second.
            tokio::time::sleep_until((asked_at + round.min(Duration::from_secs(1))).min(deadline)).await;
        }
    }

    /// One `POST` of a command waiting up to `round`. `sent_before`: an earlier round may have stored it.
    async fn submit_round(
        &self,
        envelope: &Envelope,
        body: &str,
        round: Duration,
        sent_before: bool,
    ) -> Result<(StatusCode, CommandStatus), RoundError> {
        let unknown = |why: String| -> RoundError { Error::from(OutcomeUnknown::new(envelope, why, None)).into() };
        let url = self.url(&["v1", "commands"], &[("wait", "true".to_owned()), ("timeout", duration_param(round))]);
        let response = match self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_owned())
            .timeout(round + Duration::from_secs(10))
            .send()
            .await
        {
            Ok(response) => response,
            // No connection: nothing was sent (this time).
            Err(e) if e.is_connect() && !sent_before => return Err(self.unreachable(e).into()),
            Err(e) => return Err(unknown(self.unreachable(e).to_string())),
        };
        let code = response.status();
        let retry_after =
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.parse().ok());
        let text = response.text().await.map_err(|e| unknown(self.unreachable(e).to_string()))?;
        if let Ok(status) = serde_json::from_str::<CommandStatus>(&text) {
            return Ok((code, status));
        }
        if let (StatusCode::SERVICE_UNAVAILABLE, Some(seconds), false) = (code, retry_after, sent_before) {
            // A gateway not ready yet stores nothing: asked again after the pause it names.
            return Err(RoundError::NotReady { why: error_text(&text), retry_after: Duration::from_secs(seconds) });
        }
        if code == StatusCode::UNAUTHORIZED && !sent_before {
            return Err(self.unauthorized(&text).into());
        }
        if code.is_client_error() && !sent_before {
            // The gateway stores nothing it refuses.
            let why = format!("the gateway refused command {} ({code}): {}", envelope.command_id, error_text(&text));
            return Err(Error::refused(why).into());
        }
        Err(unknown(format!("the gateway answered {code}: {}", error_text(&text))))
    }

    /// Submits `envelopes` through `POST /v1/commands/batch`, in batches of at most [`MAX_BATCH_COMMANDS`] commands
    /// and [`MAX_BATCH_BYTES`] bytes, without waiting for outcomes: one answer per envelope, in order, each the
    /// command's `published` status (its command sequence, whether it was a duplicate) or why it was refused, its
    /// `index` the envelope's. An error only when nothing was stored: a command that does not encode, a gateway that
    /// cannot be reached or refuses the token on the first batch. A later batch that fails whole answers each of its
    /// commands with the gateway's refusal, or, when it may have been stored (no answer, a 5xx), with status 503:
    /// sending those again is safe, their ids are kept.
    pub async fn submit_many(&self, envelopes: &[Envelope]) -> Result<Vec<BatchItem>, Error> {
        self.submit_in_batches(envelopes, MAX_BATCH_COMMANDS, MAX_BATCH_BYTES).await
    }

    /// [`Gateway::submit_many`] in batches of at most `max_commands` commands and `max_bytes` bytes.
    async fn submit_in_batches(
        &self,
        envelopes: &[Envelope],
        max_commands: usize,
        max_bytes: usize,
    ) -> Result<Vec<BatchItem>, Error> {
        let mut texts = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let text = leasehold_schemas::codec::command_to_json(envelope)
                .map_err(|e| Error::decode(format!("encoding command {}", envelope.command_id), e))?;
            texts.push(text);
        }
        let mut answers = Vec::with_capacity(envelopes.len());
        for range in batches(&texts, max_commands, max_bytes) {
            let first_batch = range.start == 0;
            let mut body = String::from("[");
            body.push_str(&texts[range.clone()].join(","));
            body.push(']');
            let ids = || envelopes[range.clone()].iter().map(|e| e.command_id.to_string());
            let whole = |status_code: u16, error: String| -> Vec<BatchItem> {
                ids()
                    .zip(range.clone())
                    .map(|(id, index)| {
                        BatchItem::Refused(BatchRefusal {
                            index,
                            command_id: Some(id),
                            error: error.clone(),
                            status_code,
                        })
                    })
                    .collect()
            };
            let response = match self
                .http
                .post(self.url(&["v1", "commands", "batch"], &[]))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .timeout(BATCH_TIMEOUT)
                .send()
                .await
            {
                Ok(response) => response,
                Err(e) if e.is_connect() && first_batch => return Err(self.unreachable(e)),
                // No connection: nothing of this batch was sent; otherwise it may have been stored.
                Err(e) if e.is_connect() => {
                    answers.extend(whole(503, format!("not sent: {}", self.unreachable(e))));
                    continue;
                }
                Err(e) => {
                    answers.extend(whole(503, format!("{}; it may have been stored", self.unreachable(e))));
                    continue;
                }
            };
            let code = response.status();
            let text = match response.text().await {
                Ok(text) => text,
                Err(e) => {
                    answers.extend(whole(503, format!("{}; it may have been stored", self.unreachable(e))));
                    continue;
                }
            };
            if code == StatusCode::UNAUTHORIZED && first_batch {
                return Err(self.unauthorized(&text));
            }
            if code != StatusCode::OK {
                // A refusal of the whole batch (4xx) stored nothing of it; anything else may have stored some.
                let status = if code.is_client_error() { code.as_u16() } else { 503 };
                answers.extend(whole(status, format!("the gateway answered {code}: {}", error_text(&text))));
                continue;
            }
            let items: Vec<BatchItem> = match serde_json::from_str(&text) {
                Ok(items) => items,
                Err(e) => {
                    let why = format!("the gateway's answer is unexpected ({e}); they may have been stored");
                    answers.extend(whole(503, why));
                    continue;
                }
            };
            if items.len() != range.len() {
                let why = format!(
                    "the gateway answered {} commands of the {} sent; they may have been stored",
                    items.len(),
                    range.len()
                );
                answers.extend(whole(503, why));
                continue;
            }
            answers.extend(items.into_iter().zip(range.clone()).map(|(item, index)| match item {
                // The gateway counts from the start of its batch; the caller from the start of `envelopes`.
                BatchItem::Refused(refusal) => BatchItem::Refused(BatchRefusal { index, ..refusal }),
                published => published,
            }));
        }
        Ok(answers)
    }

    /// `GET` of `segments` with `query`: `None` on 404.
    pub async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> Result<Option<T>, Error> {
        Ok(self.get_page(segments, query).await?.map(|(value, _)| value))
    }

    /// [`Gateway::get`] of a list the gateway answers in pages (`GET /v1/resources` and `/v1/leases` with `limit`):
    /// the page, and the key to ask for the next one with (`after`) when the answer's `Link: <...>; rel="next"`
    /// names one.
    pub async fn get_page<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> Result<Option<(T, Option<String>)>, Error> {
        let url = self.url(segments, query);
        let response =
            self.http.get(url.clone()).timeout(READ_TIMEOUT).send().await.map_err(|e| self.unreachable(e))?;
        let code = response.status();
        let next = response
            .headers()
            .get_all(reqwest::header::LINK)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(next_after);
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        match code {
            StatusCode::OK => serde_json::from_str(&text)
                .map_err(|e| Error::decode(format!("the gateway's answer to GET {url} is unexpected"), e))
                .map(|value| Some((value, next))),
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::UNAUTHORIZED => Err(self.unauthorized(&text)),
            code if code.is_client_error() => {
                Err(Error::refused(format!("GET {url} failed ({code}): {}", error_text(&text))))
            }
            code => Err(Error::transport(format!("GET {url} failed ({code}): {}", error_text(&text)))),
        }
    }

    /// Follows `/v1/events`: the outcomes of `key` (an agent, `@pool`; every key if `None`) from sequence `from`
    /// (from now on if `None`), each once, in order. The stream ends when the gateway closes it; [`Follower`]
    /// connects again.
    pub async fn events(
        &self,
        key: Option<&str>,
        from: Option<u64>,
    ) -> Result<BoxStream<'static, Result<SeqOutcome, Error>>, Error> {
        let feed = self.events_after(key, from, None).await?;
        Ok(feed
            .filter_map(|item| async move {
                match item {
                    Ok(Feed::Outcome(outcome)) => Some(Ok(outcome)),
                    Ok(Feed::Opened { .. }) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed())
    }

    /// [`Gateway::events`], or after `last_event_id` if given (it wins over `from`). A refusal (`4xx`) is an
    /// [`Error::Refused`].
    pub async fn events_after(
        &self,
        key: Option<&str>,
        from: Option<u64>,
        last_event_id: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Feed, Error>>, Error> {
        let mut query = Vec::new();
        if let Some(key) = key {
            query.push(("key", key.to_owned()));
        }
        if let Some(from) = from {
            query.push(("from", from.to_string()));
        }
        let url = self.url(&["v1", "events"], &query);
        let mut request = self.http.get(url.clone()).header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(last) = last_event_id {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let code = response.status();
        if code != StatusCode::OK {
            let text = response.text().await.unwrap_or_default();
            if code == StatusCode::UNAUTHORIZED {
                return Err(self.unauthorized(&text));
            }
            let message = format!("GET {url} failed ({code}): {}", error_text(&text));
            if code.is_client_error() {
                return Err(Error::refused(message));
            }
            return Err(Error::transport(message));
        }
        let base = self.base.clone();
        let mut parser = SseParser::default();
        let events = response
            .bytes_stream()
            .map(move |chunk| match chunk {
                Ok(bytes) => Ok(parser.push(&bytes)),
                Err(e) => Err(Error::transport(format!("the event stream from {base} broke: {e}"))),
            })
            .flat_map(|batch| {
                let items: Vec<Result<SseEvent, Error>> = match batch {
                    Ok(events) => events.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(items)
            })
            .filter_map(|event| async move {
                match event {
                    Ok(event) if event.event == "outcome" => {
                        Some(serde_json::from_str::<SeqOutcome>(&event.data).map(Feed::Outcome).map_err(|e| {
                            Error::decode(format!("an outcome event is not an outcome: {}", event.data), e)
                        }))
                    }
                    // Where the stream starts: the place to resume from before any outcome came.
                    Ok(event) if event.event == "open" => {
                        event.id.as_deref().and_then(|id| id.parse().ok()).map(|before| Ok(Feed::Opened { before }))
                    }
                    // The gateway ends the stream with one `error` event when it cannot go on.
                    Ok(event) if event.event == "error" => Some(Err(Error::transport(format!(
                        "the gateway's event stream failed: {}",
                        error_text(&event.data)
                    )))),
                    // Other event types carry no outcome.
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed();
        Ok(events)
    }
}

/// Where a follower of `/v1/events` stands: the last outcome it saw (it resumes after it), and how long it waits
/// before it connects again after a failure (200 ms, doubling up to 5 s; back to 200 ms once outcomes flow again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The sequence to start at before any outcome was seen (`None`: from now on).
    from: Option<u64>,
    last_seen: Option<u64>,
    delay: Duration,
}

impl Cursor {
    pub const FIRST_DELAY: Duration = Duration::from_millis(200);
    pub const MAX_DELAY: Duration = Duration::from_secs(5);

    pub fn new(from: Option<u64>) -> Self {
        Cursor { from, last_seen: None, delay: Self::FIRST_DELAY }
    }

    /// `from` and `Last-Event-ID` of the next request: resume after the last outcome seen, else start where asked.
    pub fn request(&self) -> (Option<u64>, Option<u64>) {
        match self.last_seen {
            Some(last) => (None, Some(last)),
            None => (self.from, None),
        }
    }

    /// The stream said where it starts: before any outcome, a reconnection resumes from there (not "from now on",
    /// which would miss what was decided while the gateway was away).
    pub fn opened(&mut self, before: u64) {
        if self.last_seen.is_none() {
            self.last_seen = Some(before);
        }
    }

    /// An outcome arrived: the next request resumes after it, and the stream is healthy again.
    pub fn seen(&mut self, seq: u64) {
        self.last_seen = Some(self.last_seen.map_or(seq, |last| last.max(seq)));
        self.delay = Self::FIRST_DELAY;
    }

    /// A connection failed or ended: how long to wait before the next one.
    pub fn failed(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (self.delay * 2).min(Self::MAX_DELAY);
        delay
    }

    /// Where the next connection starts, in words.
    pub fn describe(&self) -> String {
        match (self.last_seen, self.from) {
            (Some(last), _) => format!("after outcome {last}"),
            (None, Some(from)) => format!("at outcome {from}"),
            (None, None) => "from now on (no outcome seen yet)".to_owned(),
        }
    }
}

/// What `/v1/events` sends: where the stream starts (the sequence before its first outcome), then outcomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Feed {
    Opened { before: u64 },
    Outcome(SeqOutcome),
}

/// Follows `/v1/events` across restarts of the gateway: when the stream ends or breaks, or the gateway cannot be
/// reached, it says so on stderr and connects again after the cursor's delay, resuming after the last outcome seen.
/// Only a refusal (`4xx`) ends it.
pub struct Follower {
    gateway: Gateway,
    key: Option<String>,
    cursor: Cursor,
    stream: Option<BoxStream<'static, Result<Feed, Error>>>,
}

impl fmt::Debug for Follower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follower")
            .field("gateway", &self.gateway.base.as_str())
            .field("key", &self.key)
            .field("cursor", &self.cursor)
            .field("connected", &self.stream.is_some())
            .finish()
    }
}

impl Follower {
    pub fn new(gateway: Gateway, key: Option<String>, from: Option<u64>) -> Self {
        Follower { gateway, key, cursor: Cursor::new(from), stream: None }
    }

    /// Connects now, unless it is connected: what lands from then on comes from [`Follower::next`] even if the caller
    /// reads something else first (`ls --watch` draws its first table after this, so no outcome falls between the
    /// two). A gateway that cannot be reached is left to `next`, which says so and connects again; a refusal is an
    /// error.
    pub async fn open(&mut self) -> Result<(), Error> {
        if self.stream.is_none() {
            let (from, last) = self.cursor.request();
            match self.gateway.events_after(self.key.as_deref(), from, last).await {
                Ok(stream) => self.stream = Some(stream),
                Err(e @ Error::Refused { .. }) => return Err(e),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// The next outcome. Cancel-safe: dropped while waiting, it loses nothing.
    pub async fn next(&mut self) -> Result<SeqOutcome, Error> {
        loop {
            let trouble = match &mut self.stream {
                None => {
                    let (from, last) = self.cursor.request();
                    match self.gateway.events_after(self.key.as_deref(), from, last).await {
                        Ok(stream) => {
                            self.stream = Some(stream);
                            continue;
                        }
                        Err(e @ Error::Refused { .. }) => return Err(e),
                        Err(e) => e.to_string(),
                    }
                }
                Some(stream) => match stream.next().await {
                    Some(Ok(Feed::Outcome(outcome))) => {
                        self.cursor.seen(outcome.seq);
                        return Ok(outcome);
                    }
                    Some(Ok(Feed::Opened { before })) => {
                        self.cursor.opened(before);
                        continue;
                    }
                    Some(Err(e)) => e.to_string(),
                    None => "the gateway closed the event stream".to_owned(),
                },
            };
            self.stream = None;
            let delay = self.cursor.failed();
            eprintln!(
                "note: {}; connecting again in {delay:?}, {}",
                leasehold_schemas::text::shown(&trouble),
                self.cursor.describe()
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// The outcomes as a stream, ending after a refusal.
    pub fn into_stream(self) -> BoxStream<'static, Result<SeqOutcome, Error>> {
        futures::stream::unfold(Some(self), |follower| async move {
            let mut follower = follower?;
            match follower.next().await {
                Ok(outcome) => Some((Ok(outcome), Some(follower))),
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }
}

/// The text of an error body: its `error` field, or the body itself.
fn error_text(body: &str) -> String {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(parsed) => parsed.error,
        Err(_) if body.trim().is_empty() => "(no message)".to_owned(),
        Err(_) => body.trim().to_owned(),
    }
}

/// A duration as the gateway's `timeout` parameter: whole seconds when it is, else milliseconds.
pub fn duration_param(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `message` when the event names no type.
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Splits a `text/event-stream` body into events as its bytes arrive (the WHATWG rules: `field: value` lines, a
/// blank line ends an event, `:` starts a comment, lines end with LF, CRLF or CR).
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    /// The previous chunk ended with CR: an LF at the start of the next one belongs to it.
    after_cr: bool,
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// The events completed by `chunk`.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut chunk = chunk;
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        let mut start = 0;
        let mut idx = 0;
        while idx < chunk.len() {
            let byte = chunk[idx];
            if byte == b'\n' || byte == b'\r' {
                self.pending.extend_from_slice(&chunk[start..idx]);
                let line = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
                if let Some(event) = self.line(&line) {
                    events.push(event);
                }
                if byte == b'\r' {
                    if chunk.get(idx + 1) == Some(&b'\n') {
                        idx += 1;
                    } else if idx + 1 == chunk.len() {
                        self.after_cr = true;
                    }
                }
                start = idx + 1;
            }
            idx += 1;
        }
        self.pending.extend_from_slice(&chunk[start..]);
        events
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let event = self.event.take();
            let data = self.data.take()?;
            return Some(SseEvent { event: event.unwrap_or_else(|| "message".to_owned()), id: self.id.clone(), data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use leasehold_schemas::{Command, CommandId};

    use super::*;

    #[test]
    fn the_next_page_is_the_after_of_the_next_link() {
        let link =
            r#"</v1/resources?attr=team%3Dci&limit=2&after=w1.019b76da-9478-7111-9111-111111111111>; rel="next""#;
        assert_eq!(next_after(link).as_deref(), Some("w1.019b76da-9478-7111-9111-111111111111"));
        assert_eq!(next_after("</v1/leases?after=a%2Eb%20c>; rel=next").as_deref(), Some("a.b c"));
        assert_eq!(next_after(r#"</v1/leases?after=x>; rel="prev""#), None);
        assert_eq!(next_after("</v1/leases?limit=2>; rel=next"), None);
    }

    fn event(event: &str, id: Option<&str>, data: &str) -> SseEvent {
        SseEvent { event: event.to_owned(), id: id.map(str::to_owned), data: data.to_owned() }
    }

    #[test]
    fn sse_events_end_at_a_blank_line() {
        let mut parser = SseParser::default();
        let events = parser.push(b"event: outcome\nid: 40\ndata: {\"seq\":40}\n\n: keep-alive\n\ndata: a\ndata: b\n\n");
        assert_eq!(events, vec![event("outcome", Some("40"), "{\"seq\":40}"), event("message", Some("40"), "a\nb")]);
    }

    #[test]
    fn sse_events_split_anywhere_across_chunks() {
        let body = b"event: outcome\r\nid: 7\r\ndata: {\"x\": 1}\r\n\r\nevent: outcome\rid: 8\rdata:2\r\r";
        let whole = SseParser::default().push(body);
        assert_eq!(whole, vec![event("outcome", Some("7"), "{\"x\": 1}"), event("outcome", Some("8"), "2")]);
        for split in 0..body.len() {
            let mut parser = SseParser::default();
            let mut events = parser.push(&body[..split]);
            events.extend(parser.push(&body[split..]));
            assert_eq!(events, whole, "split at {split}");
        }
    }

    #[test]
    fn an_sse_event_without_data_is_not_dispatched() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"event: outcome\n\n").is_empty());
        assert_eq!(parser.push(b"data: x\n\n"), vec![event("message", None, "x")]);
    }

    #[test]
    fn urls_encode_their_segments_and_keep_the_base_path() {
        let gateway = Gateway::new("http://127.0.0.1:7420/lh/").unwrap();
        let url = gateway.url(&["v1", "resources", "w1.a b"], &[("agent", "w1".into()), ("key", "@ips".into())]);
        assert_eq!(url.as_str(), "http://127.0.0.1:7420/lh/v1/resources/w1.a%20b?agent=w1&key=%40ips");
        assert!(Gateway::new("127.0.0.1:7420").is_err());
    }

    #[test]
    fn timeouts_are_seconds_or_milliseconds() {
        assert_eq!(duration_param(Duration::from_secs(30)), "30s");
        assert_eq!(duration_param(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(error_text(r#"{"error":"body.capacity: invalid type"}"#), "body.capacity: invalid type");
        assert_eq!(error_text("plain words\n"), "plain words");
    }

    #[test]
    fn a_command_status_parses_from_the_contract() {
        let status: CommandStatus = serde_json::from_str(
            r#"{"command_id":"019b76da-abe8-7001-8000-000000000001","status":"rejected","command_seq":12,
                "duplicate":false,"rejection":{"kind":"unknown","message":"resource w1.x is not known"},
                "outcomes":[],"dead_letter":null}"#,
        )
        .unwrap();
        assert_eq!(status.status, "rejected");
        assert_eq!(status.rejection.unwrap().kind, "unknown");
    }

    /// A fake gateway on a free port: answers each connection with the next of `answers` (`None`: close the
    /// connection once the request is read, without answering), and hands over each request it read.
    fn fake_gateway(answers: Vec<Option<String>>) -> (Gateway, std::sync::mpsc::Receiver<String>) {
        fake_gateway_with(answers, None)
    }

    /// [`fake_gateway`], asked with `token` as the bearer.
    fn fake_gateway_with(
        answers: Vec<Option<String>>,
        token: Option<&str>,
    ) -> (Gateway, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead as _, BufReader, Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (requests_tx, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for answer in answers {
                let Ok((stream, _)) = listener.accept() else { return };
                let mut reader = BufReader::new(stream);
                let mut request = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    if let Some((name, value)) = line.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap();
                    }
                    request.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                request.push_str(&String::from_utf8_lossy(&body));
                let _ = requests_tx.send(request);
                let mut stream = reader.into_inner();
                if let Some(answer) = answer {
                    let _ = stream.write_all(answer.as_bytes());
                }
            }
        });
        (Gateway::with_token(&url, token).unwrap(), requests)
    }

    fn answer(code: &str, body: &str) -> Option<String> {
        Some(format!(
            "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    }

    fn status_body(id: &CommandId, status: &str, duplicate: bool) -> String {
        serde_json::json!({"command_id": id.to_string(), "status": status, "command_seq": 12, "duplicate": duplicate,
            "rejection": null, "outcomes": [], "dead_letter": null})
        .to_string()
    }

    fn allocate_envelope() -> Envelope {
        let body = leasehold_schemas::command::Allocate::new(
            "w1".parse().unwrap(),
            leasehold_schemas::ResourceId::generate(),
            "dir",
            1,
        );
        Envelope::new(CommandId::generate(), "cli".parse().unwrap(), leasehold_schemas::Timestamp(1), body)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    fn unknown(error: Error) -> OutcomeUnknown {
        match error {
            Error::OutcomeUnknown(unknown) => *unknown,
            other => panic!("not an unknown outcome: {other}"),
        }
    }

    #[test]
    fn batches_keep_to_the_count_and_the_bytes() {
        let texts: Vec<String> =
            ["aaaa", "bb", "cccccc", "d", "eeeeeeeeeeee"].iter().map(|t| (*t).to_owned()).collect();
        // `[aaaa,bb]` is 9 bytes, `[cccccc,d]` 10: a third text would pass 2 commands.
        assert_eq!(batches(&texts, 2, 100), vec![0..2, 2..4, 4..5]);
        // 10 bytes: `[aaaa,bb]` fits, `[aaaa,bb,cccccc]` does not; a text larger than the cap goes alone.
        assert_eq!(batches(&texts, 10, 10), vec![0..2, 2..4, 4..5]);
        assert_eq!(batches(&texts, 10, 1000), vec![0..5]);
        assert_eq!(batches(&[], 10, 1000), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn a_batch_answers_each_command_at_its_place_and_a_failed_batch_each_of_its_commands() {
        let envelopes: Vec<Envelope> = (0..5).map(|_| allocate_envelope()).collect();
        let id = |i: usize| envelopes[i].command_id.to_string();
        let published = |i: usize, seq: u64, duplicate: bool| {
            serde_json::json!({"command_id": id(i), "status": "published", "command_seq": seq,
                "duplicate": duplicate, "rejection": null, "outcomes": [], "dead_letter": null, "detail": null})
        };
        let first = serde_json::json!([published(0, 7, false), published(1, 3, true)]);
        let refusal = serde_json::json!({"index": 0, "command_id": id(2), "error": "names another command",
            "status_code": 409});
        let second = serde_json::json!([refusal, published(3, 8, false)]);
        let (gateway, requests) = fake_gateway(vec![
            answer("200 OK", &first.to_string()),
            answer("200 OK", &second.to_string()),
            answer("503 Service Unavailable", r#"{"error": "the log is unavailable"}"#),
        ]);
        let answers = runtime().block_on(gateway.submit_in_batches(&envelopes, 2, MAX_BATCH_BYTES)).unwrap();
        let statuses: Vec<(Option<u64>, bool)> = answers
            .iter()
            .filter_map(|a| match a {
                BatchItem::Published(status) => Some((status.command_seq, status.duplicate)),
                BatchItem::Refused(_) => None,
            })
            .collect();
        assert_eq!(statuses, vec![(Some(7), false), (Some(3), true), (Some(8), false)]);
        let refusals: Vec<&BatchRefusal> = answers
            .iter()
            .filter_map(|a| match a {
                BatchItem::Refused(refusal) => Some(refusal),
                BatchItem::Published(_) => None,
            })
            .collect();
        assert_eq!(refusals.len(), 2, "{answers:?}");
        // The gateway's index counts from its batch; the answer's from the first envelope.
        assert_eq!((refusals[0].index, refusals[0].status_code), (2, 409));
        assert_eq!(refusals[0].command_id, Some(id(2)));
        assert_eq!((refusals[1].index, refusals[1].status_code), (4, 503), "a batch that failed may have been stored");
        assert!(refusals[1].error.contains("the log is unavailable"), "{}", refusals[1].error);
        assert!(matches!(answers[2], BatchItem::Refused(_)) && matches!(answers[4], BatchItem::Refused(_)));
        let bodies: Vec<Vec<serde_json::Value>> = requests
            .try_iter()
            .map(|request| {
                assert!(request.starts_with("POST /v1/commands/batch HTTP/1.1"), "{request}");
                let body = request.split("\r\n\r\n").nth(1).expect("a body");
                serde_json::from_str(body).expect("a JSON array")
            })
            .collect();
        let sent: Vec<Vec<&str>> =
            bodies.iter().map(|b| b.iter().map(|c| c["command_id"].as_str().unwrap()).collect()).collect();
        let ids: Vec<String> = (0..5).map(id).collect();
        assert_eq!(sent, vec![vec![&ids[0][..], &ids[1]], vec![&ids[2][..], &ids[3]], vec![&ids[4][..]]]);
    }

    #[test]
    fn a_gateway_not_ready_yet_is_asked_again_within_the_time_given() {
        let envelope = allocate_envelope();
        let id = envelope.command_id;
        let not_ready = || {
            let body = r#"{"error":"the gateway does not take commands yet (the projector: catching up)"}"#;
            Some(format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ))
        };
        let (gateway, requests) =
            fake_gateway(vec![not_ready(), answer("200 OK", &status_body(&id, "accepted", false)), not_ready()]);
        let rt = runtime();
        let status = rt.block_on(gateway.submit(&envelope, Duration::from_secs(10))).expect("accepted once ready");
        assert_eq!(status.status, "accepted");
        assert_eq!(requests.try_iter().count(), 2, "asked again after the pause the gateway named");
        // Not ready for longer than the time given: refused (nothing was stored), not an unknown outcome.
        let refused = rt.block_on(gateway.submit(&envelope, Duration::from_millis(500))).unwrap_err();
        assert_eq!(refused.kind(), crate::ErrorKind::Refused, "{refused}");
        let text = refused.to_string();
        assert!(text.contains("did not take command") && text.contains("catching up"), "{text}");
    }

    #[test]
    fn a_503_after_publishing_is_an_unknown_outcome_not_a_refusal() {
        let envelope = allocate_envelope();
        let Command::Allocate(allocate) = &envelope.body else { unreachable!() };
        let id = envelope.command_id;
        let (gateway, _requests) = fake_gateway(vec![
            answer("503 Service Unavailable", &status_body(&id, "published", false)),
            answer("503 Service Unavailable", r#"{"error":"the gateway is shutting down"}"#),
            answer("500 Internal Server Error", "oops"),
            None,
        ]);
        let rt = runtime();
        let with_status = unknown(rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err());
        assert_eq!(with_status.status.as_ref().map(|s| s.status.as_str()), Some("published"));
        assert_eq!(with_status.status.as_ref().and_then(|s| s.command_seq), Some(12));
        let text = with_status.to_string();
        assert!(text.starts_with(&format!("the outcome of command {id} is unknown (")), "{text}");
        assert!(text.contains("it may have been stored; check with `leasehold command "), "{text}");
        assert!(text.contains(&format!("send it again with `--command-id {id} --id {}`", allocate.resource)), "{text}");
        assert!(text.ends_with("a command sent again with the same ids is decided at most once"), "{text}");
        let plain = unknown(rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err());
        assert!(plain.status.is_none());
        assert!(plain.why.contains("the gateway is shutting down"), "{}", plain.why);
        let internal = unknown(rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err());
        assert!(internal.why.contains("500"), "{}", internal.why);
        // The connection closes after the request was sent: it may have been stored.
        let closed = unknown(rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err());
        assert_eq!(closed.command_id, id.to_string());
    }

    #[test]
    fn a_refusal_or_no_connection_is_an_error_before_anything_was_stored() {
        let envelope = allocate_envelope();
        let (gateway, _requests) = fake_gateway(vec![answer("400 Bad Request", r#"{"error":"body.kind: too long"}"#)]);
        let rt = runtime();
        let refused = rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err();
        assert_eq!(refused.kind(), crate::ErrorKind::Refused, "{refused}");
        assert!(refused.to_string().contains("refused command") && refused.to_string().contains("too long"));
        let nobody = Gateway::new("http://127.0.0.1:1").unwrap();
        let unreachable = rt.block_on(nobody.submit(&envelope, Duration::from_secs(5))).unwrap_err();
        assert_eq!(unreachable.kind(), crate::ErrorKind::Transport, "{unreachable}");
        assert!(unreachable.to_string().contains("cannot reach the gateway"), "{unreachable}");
    }

    #[test]
    fn the_token_is_the_bearer_of_every_request_and_a_401_says_it_was_refused() {
        let envelope = allocate_envelope();
        let refusal = r#"{"error":"the bearer token is not one this gateway knows"}"#;
        let (gateway, requests) = fake_gateway_with(
            vec![answer("401 Unauthorized", refusal), answer("401 Unauthorized", refusal)],
            Some("sekrit-0123456789abcdef"),
        );
        let rt = runtime();
        let refused = rt.block_on(gateway.submit(&envelope, Duration::from_secs(5))).unwrap_err();
        assert_eq!(refused.kind(), crate::ErrorKind::Refused, "{refused}");
        assert_eq!(
            refused.to_string(),
            "the gateway refused the token: the bearer token is not one this gateway knows"
        );
        let request = requests.recv().unwrap().to_lowercase();
        assert!(request.contains("\r\nauthorization: bearer sekrit-0123456789abcdef\r\n"), "{request}");
        let read = rt.block_on(gateway.get::<serde_json::Value>(&["v1", "agents"], &[])).unwrap_err();
        assert!(read.to_string().starts_with("the gateway refused the token: "), "{read}");
        assert!(requests.recv().unwrap().to_lowercase().contains("authorization: bearer sekrit-"));

        let (anonymous, requests) = fake_gateway(vec![answer("401 Unauthorized", r#"{"error":"needs a token"}"#)]);
        let refused = rt.block_on(anonymous.submit(&envelope, Duration::from_secs(5))).unwrap_err();
        assert!(refused.to_string().contains("without a token (give it in LEASEHOLD_TOKEN"), "{refused}");
        assert!(!requests.recv().unwrap().to_lowercase().contains("authorization"));
        assert!(Gateway::with_token("http://127.0.0.1:1", Some("bad\ntoken-0123456789")).is_err());
    }

    #[test]
    fn a_wait_past_the_gateways_cap_goes_in_rounds_of_the_same_command() {
        let envelope = allocate_envelope();
        let id = envelope.command_id;
        let accepted = serde_json::json!({"command_id": id.to_string(), "status": "accepted", "command_seq": 12,
            "duplicate": true, "rejection": null, "outcomes": [], "dead_letter": null});
        let (gateway, requests) = fake_gateway(vec![
            answer("504 Gateway Timeout", &status_body(&id, "pending", false)),
            answer("504 Gateway Timeout", &status_body(&id, "pending", true)),
            answer("200 OK", &accepted.to_string()),
        ]);
        let status = runtime().block_on(gateway.submit(&envelope, Duration::from_secs(600))).unwrap();
        assert_eq!(status.status, "accepted");
        assert!(!status.duplicate, "the first answer says whether it was sent before");
        let requests: Vec<String> = requests.try_iter().collect();
        assert_eq!(requests.len(), 3);
        for request in &requests {
            let line = request.lines().next().unwrap();
            assert!(line.starts_with("POST /v1/commands?wait=true&timeout="), "{line}");
            let asked = line.split("timeout=").nth(1).unwrap().split_whitespace().next().unwrap();
            let asked = humantime::parse_duration(asked).unwrap();
            assert!(asked <= MAX_ROUND && asked > Duration::from_secs(200), "{line}");
            // The same command each time: the same id, the same bytes.
            assert_eq!(request.split("\r\n\r\n").nth(1), requests[0].split("\r\n\r\n").nth(1));
        }
    }

    #[test]
    fn a_producer_allocates_through_the_gateway_and_answers_what_it_made_or_why_not() {
        let resource = leasehold_schemas::ResourceId::generate();
        let decided = |status: &str, made: leasehold_schemas::ResourceId| {
            let outcome = serde_json::json!({
                "decider_version": 1, "partition": 0,
                "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.allocate",
                            "issuer": "ci:example", "issued_at": 1u64, "key": "w1"},
                "cmd_seq": 12, "part": 0, "log_time": 2u64, "decided_at": 2u64,
                "decision": {"accepted": {"first_position": 3, "effects": [
                    {"resource-allocated": {"resource": made.to_string(), "kind": "volume", "capacity": 1,
                        "attributes": {}, "parent": null}}
                ]}}
            });
            let rejection = (status == "rejected")
                .then(|| serde_json::json!({"kind": "unknown-agent", "message": "agent w1 is not known"}));
            let body = serde_json::json!({"command_id": "019b76da-abe8-7001-8000-000000000001", "status": status,
                "command_seq": 12, "duplicate": false, "rejection": rejection,
                "outcomes": if status == "accepted" { vec![serde_json::json!({"seq": 40, "outcome": outcome})] }
                            else { vec![] },
                "dead_letter": null});
            answer("200 OK", &body.to_string())
        };
        let (gateway, requests) = fake_gateway(vec![
            decided("accepted", resource),
            decided("rejected", resource),
            decided("accepted", leasehold_schemas::ResourceId::generate()),
        ]);
        let producer = crate::Producer::new(gateway, "ci:example".parse().unwrap());
        let volume = || leasehold_schemas::command::Allocate::new("w1".parse().unwrap(), resource, "volume", 1);
        let rt = runtime();
        let reference = rt.block_on(producer.allocate(volume())).unwrap();
        assert_eq!(reference.to_string(), format!("w1.{resource}"));
        let request = requests.recv().unwrap();
        assert!(request.starts_with("POST /v1/commands?wait=true&timeout="), "{request}");
        assert!(request.contains(r#""issuer":"ci:example""#), "{request}");
        let rejected = rt.block_on(producer.allocate(volume())).unwrap_err();
        assert_eq!(rejected.kind(), crate::ErrorKind::Rejected);
        assert_eq!(rejected.rejection().map(|r| r.kind.as_str()), Some("unknown-agent"));
        assert!(rejected.to_string().starts_with("op.allocate w1 rejected (unknown-agent): "), "{rejected}");
        let another = rt.block_on(producer.allocate(volume())).unwrap_err();
        assert_eq!(another.kind(), crate::ErrorKind::Refused);
        assert!(another.to_string().contains(&format!("not w1.{resource}")), "{another}");
    }

    #[test]
    fn a_wait_that_runs_out_is_pending() {
        let envelope = allocate_envelope();
        let id = envelope.command_id;
        let (gateway, requests) =
            fake_gateway(vec![answer("504 Gateway Timeout", &status_body(&id, "pending", false))]);
        let status = runtime().block_on(gateway.submit(&envelope, Duration::ZERO)).unwrap();
        assert_eq!((status.status.as_str(), status.command_seq), ("pending", Some(12)));
        let request = requests.recv().unwrap();
        assert!(request.starts_with("POST /v1/commands?wait=true&timeout=0s "), "{request}");
    }

    #[test]
    fn a_follower_resumes_after_the_last_outcome_seen_and_backs_off() {
        let mut cursor = Cursor::new(None);
        assert_eq!(cursor.request(), (None, None));
        assert_eq!(cursor.describe(), "from now on (no outcome seen yet)");
        let delays: Vec<Duration> = (0..7).map(|_| cursor.failed()).collect();
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(delays, [ms(200), ms(400), ms(800), ms(1600), ms(3200), ms(5000), ms(5000)]);
        cursor.seen(41);
        assert_eq!(cursor.request(), (None, Some(41)), "Last-Event-ID: the last outcome seen");
        assert_eq!(cursor.failed(), ms(200), "outcomes flowed again: the delay starts over");
        cursor.seen(40);
        assert_eq!(cursor.request(), (None, Some(41)), "never back");
        let mut from = Cursor::new(Some(5));
        assert_eq!(from.request(), (Some(5), None));
        assert_eq!(from.describe(), "at outcome 5");
        from.seen(9);
        assert_eq!((from.request(), from.describe()), ((None, Some(9)), "after outcome 9".to_owned()));
        // Before any outcome, the stream's opening says where it starts: a reconnection resumes from there, not
        // "from now on" (which would miss what was decided while the gateway was away).
        let mut opened = Cursor::new(None);
        opened.opened(12);
        assert_eq!(opened.request(), (None, Some(12)));
        opened.seen(15);
        opened.opened(3);
        assert_eq!(opened.request(), (None, Some(15)), "an opening never moves a cursor back");
    }

    #[test]
    fn a_follower_connects_again_after_the_stream_ends_and_stops_at_a_refusal() {
        let sse = |events: &str| {
            Some(format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n{events}"))
        };
        let outcome = |seq: u64| {
            let outcome = serde_json::json!({
                "decider_version": 1, "partition": 0,
                "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.pause",
                            "issuer": "cli", "issued_at": 1u64, "key": "w1"},
                "cmd_seq": seq, "part": 0, "log_time": 2u64, "decided_at": 2u64,
                "decision": {"accepted": {"first_position": seq, "effects": []}}
            });
            format!("event: outcome\nid: {seq}\ndata: {}\n\n", serde_json::json!({"seq": seq, "outcome": outcome}))
        };
        let (gateway, requests) = fake_gateway(vec![
            sse(&("event: open\nid: 2\ndata: {\"from\":3}\n\n".to_owned() + &outcome(7) + &outcome(8))),
            answer("503 Service Unavailable", r#"{"error":"starting"}"#),
            sse(&outcome(9)),
            answer("400 Bad Request", r#"{"error":"bad query: key"}"#),
        ]);
        let mut follower = Follower::new(gateway, Some("w1".into()), Some(3));
        let rt = runtime();
        let seqs: Vec<u64> = (0..3).map(|_| rt.block_on(follower.next()).unwrap().seq).collect();
        assert_eq!(seqs, [7, 8, 9]);
        let refused = rt.block_on(follower.next()).unwrap_err();
        assert!(refused.kind() == crate::ErrorKind::Refused && refused.to_string().contains("bad query"), "{refused}");
        let requests: Vec<String> = requests.try_iter().collect();
        assert!(requests[0].starts_with("GET /v1/events?key=w1&from=3 "), "{}", requests[0]);
        for resumed in &requests[1..3] {
            assert!(resumed.starts_with("GET /v1/events?key=w1 "), "{resumed}");
            assert!(resumed.to_ascii_lowercase().contains("last-event-id: 8\r\n"), "{resumed}");
        }
        assert!(requests[3].to_ascii_lowercase().contains("last-event-id: 9\r\n"), "{}", requests[3]);
    }
}
