//! What the agent needs of the thing that makes resources on its machine, and how a driver is named on the command
//! line (`dir:PATH`, `docker:[ENDPOINT]`).
//!
//! A driver knows handles only: a resource's handle is its id. Every call may be retried (create of something that
//! exists and destroy of something absent both succeed), because the agent retries whatever it cannot confirm.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;

use leasehold_schemas::ids::AgentName;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::{PoolName, Position, ResourceId};

use crate::dir::DirDriver;
use crate::docker::DockerDriver;

/// What to make: the resource's kind and attributes, as allocated (and updated since), the identifiers it holds, and
/// where its create was ordered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spec {
    pub kind: String,
    pub attributes: BTreeMap<String, String>,
    /// The identifiers bound to it, by pool: all of them are bound before its create is ordered.
    pub claims: BTreeMap<PoolName, Claimed>,
    /// The create order this call carries out (`None` for a call that makes nothing, such as a garbage destroy).
    pub order: Option<CreateOrder>,
}

/// An identifier bound to a resource, with the definition of its pool as the grant carried it (IPv4 pools: a
/// driver puts the address on a network of that subnet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub value: PoolValue,
    pub pool: Option<PoolKind>,
}

/// Which incarnation of the agent makes a resource, and the log position of the order it makes it by: drivers that
/// label what they make (docker) record both on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOrder {
    /// The agent's epoch: the position of its registration.
    pub epoch: Position,
    /// The position of `create-ordered`.
    pub position: Position,
}

/// A handle on the machine, as a listing finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub id: ResourceId,
    /// `Some(why)`: it is there but stopped working for good (a container that exited, with its exit code). The
    /// agent reports it unhealthy; the health check the writer then asks for finds it so, and it is released.
    pub failed: Option<String>,
}

impl Listed {
    /// A handle that is there and has not failed.
    pub fn present(id: ResourceId) -> Self {
        Listed { id, failed: None }
    }
}

/// The answer of a health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    pub detail: String,
}

/// Why a driver call did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The resource cannot be made and never will be (a bad spec, an image that does not exist): the agent reports
    /// it failed, and the writer frees what it held.
    #[error("create failed for good: {0}")]
    CreateFailed(String),
    /// Anything else (a daemon down, a disk busy): the agent tries again at a later pass.
    #[error("{0}")]
    Transient(String),
    /// A destroy that cannot finish while something else uses the resource (a volume mounted by a container the
    /// agent did not make): tried again at a later pass, as a transient error is, and the reason is recorded once on
    /// the resource (`destroy-blocked`), so `get` says why it is still releasing.
    #[error("{0}")]
    InUse(String),
    /// From `open`: the machine's resources are not this agent's to take (another agent's root, another process of
    /// this agent holding it): the agent must not run, as two agents on one machine's resources would each destroy
    /// what the log orders for the other's.
    #[error("{0}")]
    Refused(String),
}

/// The thing that makes, destroys, lists and checks resources on one machine. Each call stands alone: the agent
/// runs several at once (up to `max_in_flight`), each under a timeout after which its future is dropped.
pub trait Driver: Send + Sync + 'static {
    /// Takes the machine's resources for agent `agent`, before anything else: a driver whose resources another
    /// agent (or another process of this one) holds refuses, since each agent destroys what it does not know of.
    /// Held until the driver is dropped.
    fn open(&self, agent: &AgentName) -> impl Future<Output = Result<(), DriverError>> + Send {
        let _ = agent;
        async { Ok(()) }
    }

    /// Makes the resource `id` (succeeds if it exists already); returns the driver's own id for it, if it has one.
    fn create(&self, id: ResourceId, spec: &Spec) -> impl Future<Output = Result<Option<String>, DriverError>> + Send;

    /// Destroys the resource `id` (succeeds if it is absent).
    fn destroy(&self, id: ResourceId) -> impl Future<Output = Result<(), DriverError>> + Send;

    /// The handles present on the machine. Anything the driver does not recognise as a handle is left out (and so
    /// left alone).
    fn list(&self) -> impl Future<Output = Result<Vec<Listed>, DriverError>> + Send;

    /// Whether the resource `id` works.
    fn check(&self, id: ResourceId) -> impl Future<Output = Result<Health, DriverError>> + Send;
}

/// A driver named on the command line. A new kind of driver is a new variant here and a new prefix in
/// [`parse_driver`]; nothing else in the agent changes.
#[derive(Debug, Clone)]
pub enum AnyDriver {
    Dir(DirDriver),
    Docker(DockerDriver),
}

/// A driver spec that names no driver this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "driver {spec:?}: {reason}; known drivers: dir:PATH (one directory per resource under PATH), \
     docker:[unix:///SOCKET|tcp://LOOPBACK:PORT] (containers and volumes on a Docker daemon; docker: alone is the \
     local socket)"
)]
pub struct DriverSpecError {
    pub spec: String,
    pub reason: &'static str,
}

/// Parses `dir:PATH` or `docker:[ENDPOINT]` (and whatever other drivers come) into a driver.
pub fn parse_driver(spec: &str) -> Result<AnyDriver, DriverSpecError> {
    let fail = |reason| Err(DriverSpecError { spec: spec.to_owned(), reason });
    match spec.split_once(':') {
        Some(("dir", "")) => fail("the dir driver needs a path"),
        Some(("dir", path)) => Ok(AnyDriver::Dir(DirDriver::new(path))),
        Some(("docker", endpoint)) => DockerDriver::new(endpoint)
            .map(AnyDriver::Docker)
            .map_err(|e| DriverSpecError { spec: spec.to_owned(), reason: e.reason }),
        Some(_) => fail("unknown driver"),
        None => fail("a driver is named as KIND:ARGUMENT"),
    }
}

impl FromStr for AnyDriver {
    type Err = DriverSpecError;

    fn from_str(spec: &str) -> Result<Self, DriverSpecError> {
        parse_driver(spec)
    }
}

impl AnyDriver {
    /// The directory whose files a docker driver's `env-file` attributes may name (see
    /// [`DockerDriver::with_env_file_dir`]); other drivers read no env files and refuse it.
    pub fn with_env_file_dir(self, dir: &std::path::Path) -> Result<AnyDriver, String> {
        match self {
            AnyDriver::Docker(docker) => docker.with_env_file_dir(dir).map(AnyDriver::Docker),
            other => {
                Err(format!("the {other} driver reads no env files: an env file directory is for docker: drivers"))
            }
        }
    }
}

impl fmt::Display for AnyDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyDriver::Dir(dir) => write!(f, "dir:{}", dir.root().display()),
            AnyDriver::Docker(docker) => write!(f, "docker:{}", docker.endpoint()),
        }
    }
}

impl Driver for AnyDriver {
    async fn open(&self, agent: &AgentName) -> Result<(), DriverError> {
        match self {
            AnyDriver::Dir(dir) => dir.open(agent).await,
            AnyDriver::Docker(docker) => docker.open(agent).await,
        }
    }

    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        match self {
            AnyDriver::Dir(dir) => dir.create(id, spec).await,
            AnyDriver::Docker(docker) => docker.create(id, spec).await,
        }
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        match self {
            AnyDriver::Dir(dir) => dir.destroy(id).await,
            AnyDriver::Docker(docker) => docker.destroy(id).await,
        }
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        match self {
            AnyDriver::Dir(dir) => dir.list().await,
            AnyDriver::Docker(docker) => docker.list().await,
        }
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        match self {
            AnyDriver::Dir(dir) => dir.check(id).await,
            AnyDriver::Docker(docker) => docker.check(id).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_specs_parse_or_say_what_is_known() {
        let Ok(AnyDriver::Dir(dir)) = parse_driver("dir:/var/lib/leasehold/res") else { panic!("a dir driver") };
        assert_eq!(dir.root(), std::path::Path::new("/var/lib/leasehold/res"));
        for spec in ["dir:/tmp/x", "docker:", "docker:unix:///run/x.sock", "docker:tcp://127.0.0.1:2375"] {
            assert_eq!(spec.parse::<AnyDriver>().unwrap().to_string(), spec);
        }
        let Ok(AnyDriver::Docker(docker)) = parse_driver("docker:unix:///run/x.sock") else {
            panic!("a docker driver")
        };
        assert_eq!(docker.endpoint(), "unix:///run/x.sock");
        for bad in ["dir:", "docker:local", "/tmp/x", "oci:x"] {
            let err = parse_driver(bad).unwrap_err().to_string();
            assert!(err.contains("known drivers: dir:PATH") && err.contains("docker:[unix:///SOCKET"), "{err}");
        }
        let err = parse_driver("docker:tcp://10.1.2.3:2376").unwrap_err();
        assert_eq!(err.spec, "docker:tcp://10.1.2.3:2376");
        assert!(err.to_string().contains("loopback host only") && err.to_string().contains("no TLS"), "{err}");
    }
}
