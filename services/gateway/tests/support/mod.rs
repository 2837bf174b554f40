//! The gateway's API over an embedded log in a temporary directory, with a projector and (when asked) a worker
//! running as tasks, called in-process: what the gateway's integration tests share. Each test file adds its own
//! requests in an `impl Gateway` of its own.

#![allow(dead_code)]

use std::sync::Arc;

use axum::Router;
use leasehold_gateway::{Api, GatewayConfig, Health, router};
use leasehold_log::embedded::Embedded;
use leasehold_projector::Projector;
use leasehold_worker::WorkerConfig;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) const PARTITIONS: u32 = 4;

/// The API and the log under it. Dropping it stops the tasks.
pub(crate) struct Gateway {
    pub(crate) log: Embedded,
    pub(crate) app: Router,
    pub(crate) shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    _dirs: [tempfile::TempDir; 2],
}

impl Gateway {
    /// The API with `config`, a projector, and a worker when `with_worker`.
    pub(crate) async fn start_with(config: GatewayConfig, with_worker: bool) -> Gateway {
        let log_dir = tempfile::Builder::new().prefix("lh-gw-log-").tempdir().expect("a temporary directory");
        let projection_dir = tempfile::Builder::new().prefix("lh-gw-proj-").tempdir().expect("a temporary directory");
        let log = Embedded::open(log_dir.path(), PARTITIONS).expect("open the embedded log");
        let mut projector = Projector::open(projection_dir.path(), PARTITIONS).expect("open the projection");
        let shutdown = CancellationToken::new();
        let api = Api::new(log.clone(), &projector, config, shutdown.clone());
        let mut tasks = Vec::new();
        {
            let (log, shutdown) = (log.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                projector.run(&log, &shutdown).await.expect("the projector runs until shutdown");
            }));
        }
        if with_worker {
            let (log, shutdown) = (log.clone(), shutdown.clone());
            tasks.push(tokio::spawn(async move {
                let report = leasehold_worker::run(log, WorkerConfig::new("w"), shutdown).await;
                assert!(report.stopped.is_empty(), "partitions stopped: {:?}", report.stopped);
            }));
        }
        let health = Health {
            roles: vec!["gateway".to_owned()],
            registry: Arc::new(Registry::default()),
            projection: None,
            failures: Default::default(),
            workers: None,
            ready: Default::default(),
        };
        Gateway { log, app: router(api, health), shutdown, tasks, _dirs: [log_dir, projection_dir] }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}
