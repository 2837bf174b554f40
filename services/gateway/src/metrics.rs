//! `/healthz` (liveness: did a role, an agent or a partition of the process stop?) and `/metrics`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use leasehold_projector::Reader;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::{Health, unavailable};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabel {
    agent: String,
}

/// Gauges of the read models, read from the projection at each scrape: resources and leases by state, the last
/// outcome sequence applied, and per agent its quarantined handles and whether its driver can list.
#[derive(Debug, Clone)]
pub struct ProjectionMetrics {
    reader: Reader,
    resources: Family<StateLabel, Gauge>,
    leases: Family<StateLabel, Gauge>,
    applied: Gauge,
    quarantined: Family<AgentLabel, Gauge>,
    driver_up: Family<AgentLabel, Gauge>,
}

impl ProjectionMetrics {
    /// The gauges of the projection `reader` reads, registered in `registry`.
    pub fn register(registry: &mut Registry, reader: Reader) -> Self {
        let metrics = ProjectionMetrics {
            reader,
            resources: Family::default(),
            leases: Family::default(),
            applied: Gauge::default(),
            quarantined: Family::default(),
            driver_up: Family::default(),
        };
        registry.register("leasehold_resources", "Resource records by state", metrics.resources.clone());
        registry.register("leasehold_leases", "Lease records by state", metrics.leases.clone());
        registry.register(
            "leasehold_projection_applied_seq",
            "The last outcome sequence the projection applied",
            metrics.applied.clone(),
        );
        registry.register(
            "leasehold_quarantined_handles",
            "Handles of lost resources on an agent's machine, quarantined until a release orders them destroyed",
            metrics.quarantined.clone(),
        );
        registry.register(
            "leasehold_agent_driver_up",
            "1 while an agent's driver can list its machine's resources, 0 while it recorded it cannot",
            metrics.driver_up.clone(),
        );
        metrics
    }

    fn refresh(&self) -> Result<(), leasehold_projector::Error> {
        for ((what, state), n) in self.reader.counts()? {
            let family = if what == "leases" { &self.leases } else { &self.resources };
            family.get_or_create(&StateLabel { state }).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.applied.set(i64::try_from(self.reader.applied()?).unwrap_or(i64::MAX));
        for agent in self.reader.agents()? {
            let label = AgentLabel { agent: agent.name };
            self.quarantined.get_or_create(&label).set(i64::try_from(agent.quarantined).unwrap_or(i64::MAX));
            self.driver_up.get_or_create(&label).set(i64::from(agent.driver.available));
        }
        Ok(())
    }
}

pub(crate) async fn healthz(State(health): State<Arc<Health>>) -> Response {
    let applied = match &health.projection {
        Some(projection) => match projection.reader.applied() {
            Ok(applied) => Some(applied),
            Err(e) => return unavailable("the projection cannot be read", e),
        },
        None => None,
    };
    let failures = failures(&health);
    let degraded = health.failures.degraded();
    let (status, mut body) = if failures.is_empty() {
        (StatusCode::OK, serde_json::json!({ "status": "ok", "roles": health.roles, "applied": applied }))
    } else {
        let body =
            serde_json::json!({ "status": "failing", "roles": health.roles, "applied": applied, "failures": failures });
        (StatusCode::SERVICE_UNAVAILABLE, body)
    };
    if !degraded.is_empty() {
        body["degraded"] = degraded.into();
    }
    (status, Json(body)).into_response()
}

/// What stopped in the process: its roles and agents (said by whoever runs them) and the partitions its writers
/// stopped on record.
pub(crate) fn failures(health: &Health) -> Vec<String> {
    let mut failures = health.failures.list();
    if let Some(workers) = &health.workers {
        failures.extend(workers.stopped().into_iter().map(|(p, why)| format!("partition {p} stopped: {why}")));
    }
    failures
}

pub(crate) async fn metrics(State(health): State<Arc<Health>>) -> Response {
    if let Some(projection) = &health.projection
        && let Err(e) = projection.refresh()
    {
        return unavailable("the projection cannot be read", e);
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &health.registry) {
        return unavailable("the metrics could not be written", e);
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}
