//! Readiness: `/readyz` (is every role of the process ready, and if not what each waits on) and the gate that keeps
//! the gateway from taking commands before it is ready, so that no command overtakes what the process must store
//! first (the policy it seeds). `/healthz` stays liveness: a long catch-up never fails it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Health;

/// One role's answer to "are you ready?", asked at each `GET /readyz` (and, for the gateway, at each command until
/// it says yes): `None` when ready, else what it waits on, for a human.
#[derive(Clone)]
pub struct ReadyCheck(Arc<dyn Fn() -> Option<String> + Send + Sync>);

impl ReadyCheck {
    /// A role whose readiness `check` tells.
    pub fn new(check: impl Fn() -> Option<String> + Send + Sync + 'static) -> Self {
        ReadyCheck(Arc::new(check))
    }

    /// A role that is always ready.
    pub fn ready() -> Self {
        ReadyCheck::new(|| None)
    }

    /// `None` when ready, else what it waits on.
    pub fn waiting_on(&self) -> Option<String> {
        (self.0)()
    }
}

impl Default for ReadyCheck {
    fn default() -> Self {
        ReadyCheck::ready()
    }
}

impl std::fmt::Debug for ReadyCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.waiting_on().is_none() { "ReadyCheck(ready)" } else { "ReadyCheck(waiting)" })
    }
}

/// The roles of a process (and its in-process agents), each with its [`ReadyCheck`], in the order they were added.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    roles: Vec<(String, ReadyCheck)>,
}

impl Readiness {
    pub fn add(&mut self, role: impl Into<String>, check: ReadyCheck) {
        self.roles.push((role.into(), check));
    }

    /// What each role that is not ready waits on.
    pub fn waiting(&self) -> BTreeMap<String, String> {
        self.roles.iter().filter_map(|(role, check)| Some((role.clone(), check.waiting_on()?))).collect()
    }
}

/// How long a client refused for not being ready should wait before it asks again (`Retry-After`, seconds).
const RETRY_AFTER_SECONDS: u64 = 1;

/// `GET /readyz`: 200 when every role is ready and nothing stopped; else 503 with what each role waits on
/// (`waiting`) and what stopped (`failures`, as `/healthz` names them).
pub(crate) async fn readyz(State(health): State<Arc<Health>>) -> Response {
    let waiting = health.ready.waiting();
    let failures = crate::metrics::failures(&health);
    let status = if !failures.is_empty() {
        "failing"
    } else if !waiting.is_empty() {
        "waiting"
    } else {
        "ready"
    };
    let body = serde_json::json!({ "status": status, "roles": health.roles, "waiting": waiting, "failures": failures });
    let code = if status == "ready" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body)).into_response()
}

/// In front of the routes that take commands: a 503 with `Retry-After` and what the gateway waits on until it is
/// ready; nothing is read or published before.
pub(crate) async fn gate(State(ready): State<ReadyCheck>, request: Request, next: Next) -> Response {
    match ready.waiting_on() {
        None => next.run(request).await,
        Some(why) => {
            let message = format!(
                "the gateway does not take commands yet ({why}); nothing was stored: send it again in a moment \
                 (GET /readyz answers 200 once it takes them)"
            );
            let mut response = crate::error(StatusCode::SERVICE_UNAVAILABLE, message);
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(RETRY_AFTER_SECONDS));
            response
        }
    }
}
