//! The gateway's HTTP API as the command line uses it: submit a command and wait for its outcome, read the read
//! models, follow outcomes as server-sent events. Every failure names the gateway and what to do.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use futures::stream::BoxStream;
use leasehold_schemas::{Envelope, Outcome};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Where the gateway listens unless `--server` says otherwise.
pub(crate) const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";

/// How long a read may take before the command line gives up on the gateway.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the gateway (or, with `--nats`, the command line itself) knows of one command: `POST /v1/commands` and
/// `GET /v1/commands/{id}` answer this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CommandStatus {
    pub(crate) command_id: String,
    /// `published`, `accepted`, `rejected`, `dead-lettered` or `pending`.
    pub(crate) status: String,
    pub(crate) command_seq: Option<u64>,
    #[serde(default)]
    pub(crate) duplicate: bool,
    pub(crate) rejection: Option<RejectionInfo>,
    #[serde(default)]
    pub(crate) outcomes: Vec<SeqOutcome>,
    pub(crate) dead_letter: Option<DeadLetterInfo>,
}

/// An outcome with its sequence in the outcome log (also the `data` of an `outcome` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SeqOutcome {
    pub(crate) seq: u64,
    pub(crate) outcome: Outcome,
}

/// Why a command was rejected. The kind is kept as text: the gateway may name kinds of its own besides the
/// writer's (`leasehold_schemas::RejectionKind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RejectionInfo {
    pub(crate) kind: String,
    pub(crate) message: String,
}

impl From<&leasehold_schemas::Rejection> for RejectionInfo {
    fn from(rejection: &leasehold_schemas::Rejection) -> Self {
        RejectionInfo { kind: rejection.kind.to_string(), message: rejection.message.clone() }
    }
}

/// Why a command went to the dead-letter stream instead of being decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeadLetterInfo {
    pub(crate) reason: String,
    pub(crate) source_seq: u64,
    pub(crate) subject: String,
}

/// The gateway's error body (`400`, `403`, `404`).
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
}

/// A handle on the gateway at one base URL.
#[derive(Debug, Clone)]
pub(crate) struct Gateway {
    base: Url,
    http: reqwest::Client,
}

impl Gateway {
    pub(crate) fn new(server: &str) -> anyhow::Result<Self> {
        let base = Url::parse(server).with_context(|| format!("--server {server:?} is not a URL"))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            bail!("--server {server:?} is not an http:// URL");
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?;
        Ok(Gateway { base, http })
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

    fn unreachable(&self, error: reqwest::Error) -> anyhow::Error {
        if error.is_connect() {
            anyhow!("cannot reach the gateway at {}: is `leasehold serve` running? ({error})", self.base)
        } else if error.is_timeout() {
            anyhow!("the gateway at {} did not answer in time ({error})", self.base)
        } else {
            anyhow!("talking to the gateway at {}: {error}", self.base)
        }
    }

    /// Submits `envelope` and waits up to `wait` for its outcome to be decided and projected. A `pending` status
    /// says the wait ran out; refusals of the gateway itself (bad input, a class it does not take) are errors.
    pub(crate) async fn submit(&self, envelope: &Envelope, wait: Duration) -> anyhow::Result<CommandStatus> {
        let body = leasehold_schemas::codec::command_to_json(envelope)
            .with_context(|| format!("encoding command {}", envelope.command_id))?;
        let url = self.url(&["v1", "commands"], &[("wait", "true".to_owned()), ("timeout", duration_param(wait))]);
        let response = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .timeout(wait + Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let code = response.status();
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        match code {
            StatusCode::OK | StatusCode::ACCEPTED | StatusCode::GATEWAY_TIMEOUT => serde_json::from_str(&text)
                .with_context(|| {
                    format!("the gateway's answer to command {} is not a command status: {text}", envelope.command_id)
                }),
            code => bail!("the gateway refused command {} ({code}): {}", envelope.command_id, error_text(&text)),
        }
    }

    /// `GET` of `segments` with `query`: `None` on 404.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> anyhow::Result<Option<T>> {
        let url = self.url(segments, query);
        let response =
            self.http.get(url.clone()).timeout(READ_TIMEOUT).send().await.map_err(|e| self.unreachable(e))?;
        let code = response.status();
        let text = response.text().await.map_err(|e| self.unreachable(e))?;
        match code {
            StatusCode::OK => serde_json::from_str(&text)
                .with_context(|| format!("the gateway's answer to GET {url} is unexpected"))
                .map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            code => bail!("GET {url} failed ({code}): {}", error_text(&text)),
        }
    }

    /// Follows `/v1/events`: the outcomes of `key` (an agent, `@pool`; every key if `None`) from sequence `from`
    /// (from now on if `None`), each once, in order. The stream ends when the gateway closes it.
    pub(crate) async fn events(
        &self,
        key: Option<&str>,
        from: Option<u64>,
    ) -> anyhow::Result<BoxStream<'static, anyhow::Result<SeqOutcome>>> {
        let mut query = Vec::new();
        if let Some(key) = key {
            query.push(("key", key.to_owned()));
        }
        if let Some(from) = from {
            query.push(("from", from.to_string()));
        }
        let url = self.url(&["v1", "events"], &query);
        let response = self
            .http
            .get(url.clone())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let code = response.status();
        if code != StatusCode::OK {
            let text = response.text().await.unwrap_or_default();
            bail!("GET {url} failed ({code}): {}", error_text(&text));
        }
        let base = self.base.clone();
        let mut parser = SseParser::default();
        let events = response
            .bytes_stream()
            .map(move |chunk| match chunk {
                Ok(bytes) => Ok(parser.push(&bytes)),
                Err(e) => Err(anyhow!("the event stream from {base} broke: {e}")),
            })
            .flat_map(|batch| {
                let items: Vec<anyhow::Result<SseEvent>> = match batch {
                    Ok(events) => events.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(items)
            })
            .filter_map(|event| async move {
                match event {
                    Ok(event) if event.event == "outcome" => Some(
                        serde_json::from_str::<SeqOutcome>(&event.data)
                            .with_context(|| format!("an outcome event is not an outcome: {}", event.data)),
                    ),
                    // The gateway ends the stream with one `error` event when it cannot go on.
                    Ok(event) if event.event == "error" => {
                        Some(Err(anyhow!("the gateway's event stream failed: {}", error_text(&event.data))))
                    }
                    // Other event types carry no outcome.
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed();
        Ok(events)
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
pub(crate) fn duration_param(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// `message` when the event names no type.
    pub(crate) event: String,
    pub(crate) id: Option<String>,
    pub(crate) data: String,
}

/// Splits a `text/event-stream` body into events as its bytes arrive (the WHATWG rules: `field: value` lines, a
/// blank line ends an event, `:` starts a comment, lines end with LF, CRLF or CR).
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    pending: Vec<u8>,
    /// The previous chunk ended with CR: an LF at the start of the next one belongs to it.
    after_cr: bool,
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// The events completed by `chunk`.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
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
    use super::*;

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
}
