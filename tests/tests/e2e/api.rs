//! What the end-to-end modules share to talk to a running `serve`: commands as JSON envelopes, the HTTP API with
//! `?wait=true`, and waits for a resource, an agent or a path to become what a test expects.

use std::path::Path;
use std::time::Duration;

use leasehold_projector::{AgentView, LeaseView, ResourceView};
use leasehold_schemas::command::{Acquire, Allocate, Release, ReleaseLease, Renew};
use leasehold_schemas::ids::PoolName;
use leasehold_schemas::{
    AgentName, Command as Body, CommandId, Envelope, Issuer, LeaseId, Position, ResourceId, Timestamp, codec,
};
use serde_json::Value;
use tokio::time::Instant;

use crate::support::{Proc, logs};

/// How long any one awaited condition may take before the test fails.
pub(crate) const STEP: Duration = Duration::from_secs(30);
/// How often a condition is looked at again.
pub(crate) const POLL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------------------------
// Commands.

pub(crate) fn agent_name(name: &str) -> AgentName {
    AgentName::new(name).expect("an agent name")
}

pub(crate) fn command(body: impl Into<Body>) -> Envelope {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    Envelope::new(CommandId::generate(), Issuer::new("e2e").expect("an issuer"), Timestamp(now as u64), body)
}

pub(crate) fn allocate(agent: &AgentName, resource: ResourceId) -> Envelope {
    allocate_with_capacity(agent, resource, 1)
}

/// An allocation that claims one identifier of `pool` before it is created.
pub(crate) fn allocate_in_pool(agent: &AgentName, resource: ResourceId, pool: &PoolName) -> Envelope {
    let mut body = Allocate::new(agent.clone(), resource, "container", 1);
    body.pools = vec![pool.clone()];
    command(body)
}

pub(crate) fn allocate_with_capacity(agent: &AgentName, resource: ResourceId, capacity: u32) -> Envelope {
    command(Allocate::new(agent.clone(), resource, "container", capacity))
}

pub(crate) fn acquire(agent: &AgentName, resource: ResourceId, lease: LeaseId) -> Envelope {
    command(Acquire {
        agent: agent.clone(),
        resource,
        lease,
        holder: "e2e-build".into(),
        ttl: None,
        wait_timeout: None,
        priority: 0,
    })
}

pub(crate) fn renew(agent: &AgentName, lease: LeaseId, token: u64) -> Envelope {
    command(Renew { agent: agent.clone(), lease, token: Position(token), ttl: None })
}

pub(crate) fn release_lease(agent: &AgentName, lease: LeaseId, token: Option<u64>) -> Envelope {
    command(ReleaseLease { agent: agent.clone(), lease, token: token.map(Position) })
}

pub(crate) fn release(agent: &AgentName, resource: ResourceId) -> Envelope {
    command(Release { agent: agent.clone(), resource, reason: Some("e2e".into()) })
}

// ---------------------------------------------------------------------------------------------------------------
// The HTTP API.

#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    pub(crate) fn new(base: String) -> Api {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("an HTTP client");
        Api { http, base }
    }

    /// Posts one command with `?wait=true`: the status code and the answer.
    pub(crate) async fn post(&self, envelope: &Envelope, timeout: &str) -> Result<(u16, Value), String> {
        let json = codec::command_to_json(envelope).expect("the command in JSON");
        let response = self
            .http
            .post(format!("{}/v1/commands?wait=true&timeout={timeout}", self.base))
            .header("content-type", "application/json")
            .body(json)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let code = response.status().as_u16();
        let answer = response.json::<Value>().await.map_err(|e| e.to_string())?;
        Ok((code, answer))
    }

    /// Posts a command that must be decided at once (one process, nothing killed): its answer.
    pub(crate) async fn decide(&self, envelope: &Envelope, processes: &[&Proc]) -> Value {
        match self.post(envelope, "20s").await {
            Ok((200, answer)) => answer,
            other => panic!("{} was not decided: {other:?}\n{}", envelope.type_name(), logs(processes.iter().copied())),
        }
    }

    /// Posts a command that must be accepted.
    pub(crate) async fn accepted(&self, envelope: &Envelope, processes: &[&Proc]) -> Value {
        let answer = self.decide(envelope, processes).await;
        assert_eq!(answer["status"], "accepted", "{} was not accepted: {answer:#}", envelope.type_name());
        answer
    }

    /// A GET: `None` on 404; any other failure fails the test.
    pub(crate) async fn get(&self, path: &str) -> Option<Value> {
        self.try_get(path).await.unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// A GET of a text page (`/metrics`).
    pub(crate) async fn text(&self, path: &str) -> Result<String, String> {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.map_err(|e| e.to_string())?;
        response.text().await.map_err(|e| e.to_string())
    }

    pub(crate) async fn try_get(&self, path: &str) -> Result<Option<Value>, String> {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            404 => Ok(None),
            200 => response.json().await.map(Some).map_err(|e| e.to_string()),
            code => Err(format!("{code}: {}", response.text().await.unwrap_or_default())),
        }
    }

    pub(crate) async fn lease(&self, reference: &str) -> Option<LeaseView> {
        let path = format!("/v1/leases/{reference}");
        self.get(&path).await.map(|v| serde_json::from_value(v).unwrap_or_else(|e| panic!("GET {path}: {e}")))
    }

    pub(crate) async fn resource(&self, reference: &str) -> Option<ResourceView> {
        let path = format!("/v1/resources/{reference}");
        self.get(&path).await.map(|v| serde_json::from_value(v).unwrap_or_else(|e| panic!("GET {path}: {e}")))
    }
}

/// Waits until `path` exists (`true`) or not (`false`).
pub(crate) async fn wait_path(path: &Path, present: bool, processes: &[&Proc]) {
    let deadline = Instant::now() + STEP;
    while path.exists() != present {
        assert!(
            Instant::now() < deadline,
            "{} is {} after {STEP:?}\n{}",
            path.display(),
            if present { "still absent" } else { "still there" },
            logs(processes.iter().copied())
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the resource is known and `done` holds for it; returns it.
pub(crate) async fn wait_resource(
    api: &Api,
    reference: &str,
    done: impl Fn(&ResourceView) -> bool,
    processes: &[&Proc],
) -> ResourceView {
    let path = format!("/v1/resources/{reference}");
    let deadline = Instant::now() + STEP;
    loop {
        let seen = match api.try_get(&path).await {
            Ok(Some(value)) => {
                let view: ResourceView = serde_json::from_value(value).expect("a resource view");
                if done(&view) {
                    return view;
                }
                format!("state {} ({view:?})", view.state)
            }
            Ok(None) => "not known".to_owned(),
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "resource {reference}: not as expected after {STEP:?}; last seen: {seen}\n{}",
            logs(processes.iter().copied())
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `/v1/agents` lists the agent and `done` holds for it; returns it.
pub(crate) async fn wait_agent(
    api: &Api,
    name: &str,
    done: impl Fn(&AgentView) -> bool,
    processes: &[&Proc],
) -> AgentView {
    let deadline = Instant::now() + STEP;
    loop {
        let agents: Vec<AgentView> = match api.try_get("/v1/agents").await {
            Ok(Some(value)) => serde_json::from_value(value).expect("agent views"),
            _ => Vec::new(),
        };
        let this = agents.into_iter().find(|a| a.name == name);
        if let Some(agent) = &this
            && done(agent)
        {
            return this.expect("found");
        }
        assert!(
            Instant::now() < deadline,
            "agent {name}: not as expected after {STEP:?}; last seen: {this:?}\n{}",
            logs(processes.iter().copied())
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the pool's view satisfies `done`.
pub(crate) async fn wait_pool(api: &Api, name: &str, done: impl Fn(&Value) -> bool, processes: &[&Proc]) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let pools = api.get("/v1/pools").await.unwrap_or(Value::Null);
        let this = pools.as_array().and_then(|all| all.iter().find(|p| p["name"] == name)).cloned();
        if let Some(pool) = &this
            && done(pool)
        {
            return pool.clone();
        }
        assert!(
            Instant::now() < deadline,
            "pool {name}: not as expected after {STEP:?}; last seen {this:?}\n{}",
            logs(processes.iter().copied())
        );
        tokio::time::sleep(POLL).await;
    }
}
