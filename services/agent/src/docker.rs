//! The docker driver: a resource is a container or a volume named `lh-<id>` on one Docker daemon, labelled with the
//! agent that made it. The labels, not the names, say what is the agent's: a listing asks the daemon for the agent's
//! label only, and a destroy leaves alone anything of the right name that does not carry it.
//!
//! The daemon is reached over its unix socket (or a loopback TCP port: this build carries no TLS). Nothing is ever
//! pulled: an image that is not on the machine is a create that fails for good.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummaryStateEnum,
    EndpointIpamConfig, EndpointSettings, HealthStatusEnum, HostConfig, Ipam, IpamConfig, NetworkCreateRequest,
    NetworkingConfig, RestartPolicy, RestartPolicyNameEnum, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, InspectContainerOptions, ListContainersOptions, ListVolumesOptions,
    RemoveContainerOptions, RemoveVolumeOptions, StopContainerOptions,
};
use futures::StreamExt;
use leasehold_schemas::ids::AgentName;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::{PoolName, ResourceId};
use sha2::{Digest, Sha256};

use crate::driver::{Driver, DriverError, DriverSpecError, Health, Listed, Spec};

/// The agent that made an object: listing and destroying go by this label alone.
pub const LABEL_AGENT: &str = "io.leasehold.agent";
/// The resource an object is, as its id's text.
pub const LABEL_RESOURCE: &str = "io.leasehold.resource";
/// The resource's kind (`container`, `volume`).
pub const LABEL_KIND: &str = "io.leasehold.kind";
/// The epoch of the agent that made it (its registration's position, as text).
pub const LABEL_EPOCH: &str = "io.leasehold.epoch";
/// The log position of the create order it was made by.
pub const LABEL_ORDER: &str = "io.leasehold.order";
/// On networks the agent made for an IPv4 pool: the pool's name.
pub const LABEL_NETWORK_POOL: &str = "io.leasehold.pool";

/// The socket a daemon listens on unless told otherwise.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// How long one request to the daemon may take beyond the stop timeout: every request is under the client's timeout,
/// the stop timeout plus this (a stop holds its request open while the container stops).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The kinds this driver makes.
const KINDS: &str = "container, volume";
/// The attributes a container takes.
const CONTAINER_ATTRIBUTES: &str = "image (required), cmd, env.NAME, env-file, memory, cpus, network";

/// Where the daemon is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Unix(PathBuf),
    /// `HOST:PORT`, a loopback host.
    Tcp(String),
}

/// Containers and volumes on one Docker daemon, for one agent (named at [`Driver::open`]). Clones share the
/// connection and the lock.
#[derive(Debug, Clone)]
pub struct DockerDriver {
    /// As written after `docker:`.
    written: String,
    endpoint: Endpoint,
    extra_labels: BTreeMap<String, String>,
    stop_timeout: Duration,
    lock_dir: PathBuf,
    /// The directory `env-file` attributes name files under (canonical); without one, no env file is read.
    env_file_dir: Option<PathBuf>,
    /// The client, once the API version is agreed with the daemon.
    client: Arc<tokio::sync::OnceCell<Docker>>,
    opened: Arc<Mutex<Option<Opened>>>,
    /// Held while a network is looked for and made: two creates on one new network (the agent runs several at once)
    /// would otherwise both make it, and the daemon refuses the second for its subnet before the first has a name.
    making_network: Arc<tokio::sync::Mutex<()>>,
}

/// What `open` took: the agent's name and the lock that keeps a second process of it off this daemon.
#[derive(Debug)]
struct Opened {
    agent: AgentName,
    _lock: std::fs::File,
}

impl DockerDriver {
    /// `endpoint`: "" (the default socket /var/run/docker.sock, or `DOCKER_HOST` if that is a `unix://` address;
    /// other `DOCKER_HOST`s are not used: name them here), `unix:///PATH`, or `tcp://HOST:PORT`, refused unless
    /// HOST is loopback (this build carries no TLS). Nothing is contacted until the first call.
    pub fn new(endpoint: &str) -> Result<DockerDriver, DriverSpecError> {
        let docker_host = std::env::var("DOCKER_HOST").ok();
        let parsed = parse_endpoint(endpoint, docker_host.as_deref())
            .map_err(|reason| DriverSpecError { spec: format!("docker:{endpoint}"), reason })?;
        let lock_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|dir| !dir.is_empty())
            .map_or_else(std::env::temp_dir, PathBuf::from);
        Ok(DockerDriver {
            written: endpoint.to_owned(),
            endpoint: parsed,
            extra_labels: BTreeMap::new(),
            stop_timeout: Duration::from_secs(10),
            lock_dir,
            env_file_dir: None,
            client: Arc::default(),
            opened: Arc::default(),
            making_network: Arc::default(),
        })
    }

    /// Labels put on every object it makes besides its own (a test run's, a demo's). Listing and destroying still go
    /// by the agent label only.
    pub fn with_labels(mut self, extra: BTreeMap<String, String>) -> Self {
        self.extra_labels = extra;
        self
    }

    /// How long a destroy lets a container stop before killing it (default 10 s).
    pub fn with_stop_timeout(mut self, stop: Duration) -> Self {
        self.stop_timeout = stop;
        self
    }

    /// Where lock files go (default: `$XDG_RUNTIME_DIR`, else the temporary directory).
    pub fn with_lock_dir(mut self, dir: PathBuf) -> Self {
        self.lock_dir = dir;
        self
    }

    /// The directory whose files `env-file` attributes may name (`agent run --env-file-dir`). An env file is read on
    /// the agent's machine, by the agent, for whoever allocated the container, so without this no env file is read
    /// at all, and with it only regular files under it (by a relative path; no `..`, and symlinks are followed
    /// before the check, so none leads out). The directory must exist.
    pub fn with_env_file_dir(mut self, dir: &Path) -> Result<Self, String> {
        let canonical = std::fs::canonicalize(dir)
            .map_err(|e| format!("env file directory {}: {e}: give an existing directory", dir.display()))?;
        if !canonical.is_dir() {
            return Err(format!("env file directory {} is not a directory", dir.display()));
        }
        self.env_file_dir = Some(canonical);
        Ok(self)
    }

    /// The variables of the env file an `env-file` attribute names, read from under the env file directory only.
    async fn read_env_file(&self, written: &str) -> Result<Vec<String>, DriverError> {
        let refused = |why: &str| DriverError::CreateFailed(format!("attribute env-file {written:?}: {why}"));
        let Some(dir) = &self.env_file_dir else {
            return Err(refused(
                "this agent reads no env files: it was started without --env-file-dir (only files under a \
                 directory the operator names are read); pass the variables as env.NAME attributes",
            ));
        };
        let relative = Path::new(written);
        let plain =
            !written.is_empty() && relative.components().all(|part| matches!(part, std::path::Component::Normal(_)));
        if !plain {
            return Err(refused(
                "an env file is named by a relative path under the agent's --env-file-dir, without ..",
            ));
        }
        let path = match tokio::fs::canonicalize(dir.join(relative)).await {
            Ok(path) => path,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(refused("no such file")),
            Err(e) => return Err(DriverError::Transient(format!("cannot read env-file {written:?}: {e}"))),
        };
        if !path.starts_with(dir) {
            return Err(refused("it leads out of the agent's --env-file-dir (a symlink): refused"));
        }
        let text = match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.is_file() => tokio::fs::read_to_string(&path).await,
            Ok(_) => return Err(refused("not a regular file")),
            Err(e) => Err(e),
        };
        let text = match text {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(refused("no such file")),
            Err(e) => return Err(DriverError::Transient(format!("cannot read env-file {written:?}: {e}"))),
        };
        parse_env_file(&text).map_err(|why| refused(&why))
    }

    /// The endpoint as written on the command line after `docker:`.
    pub fn endpoint(&self) -> String {
        self.written.clone()
    }

    /// The connected client: made, and its API version agreed with the daemon (which may be older than bollard's
    /// default), at the first call that gets through.
    async fn docker(&self) -> Result<Docker, DriverError> {
        let endpoint = self.endpoint.clone();
        let timeout = (self.stop_timeout + REQUEST_TIMEOUT).as_secs();
        let docker = self
            .client
            .get_or_try_init(|| async move {
                connect(&endpoint, timeout)?.negotiate_version().await.map_err(|e| down(&endpoint, "version", e))
            })
            .await?;
        Ok(docker.clone())
    }

    /// The agent this driver was opened for.
    fn agent(&self) -> Result<AgentName, DriverError> {
        match &*self.opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(opened) => Ok(opened.agent.clone()),
            None => Err(DriverError::Transient(format!(
                "the docker driver at {} was not opened for an agent: nothing is made, listed or destroyed",
                self.endpoint
            ))),
        }
    }

    /// A daemon that does not answer, as an error.
    fn down(&self, what: &str, e: BollardError) -> DriverError {
        down(&self.endpoint, what, e)
    }

    /// The labels of an object made for `id`: the extra labels, then this driver's own (which win).
    fn labels_for(&self, agent: &AgentName, id: ResourceId, spec: &Spec) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = self.extra_labels.clone().into_iter().collect();
        labels.insert(LABEL_AGENT.to_owned(), agent.to_string());
        labels.insert(LABEL_RESOURCE.to_owned(), id.to_string());
        labels.insert(LABEL_KIND.to_owned(), spec.kind.clone());
        if let Some(order) = spec.order {
            labels.insert(LABEL_EPOCH.to_owned(), order.epoch.to_string());
            labels.insert(LABEL_ORDER.to_owned(), order.position.to_string());
        }
        labels
    }

    async fn create_container(
        &self,
        docker: &Docker,
        agent: &AgentName,
        id: ResourceId,
        spec: &Spec,
    ) -> Result<Option<String>, DriverError> {
        let attrs = container_attributes(&spec.attributes).map_err(DriverError::CreateFailed)?;
        let fixed = match &attrs.network {
            Some(network) => fixed_address(&spec.claims, network).map_err(DriverError::CreateFailed)?,
            None => None,
        };
        let mut env = Vec::new();
        if let Some(written) = &attrs.env_file {
            env = self.read_env_file(written).await?;
        }
        env.extend(attrs.env.iter().map(|(name, value)| format!("{name}={value}")));
        match docker.inspect_image(&attrs.image).await {
            Ok(_) => {}
            Err(e) if status(&e) == Some(404) => {
                return Err(DriverError::CreateFailed(format!(
                    "image {} is not on this machine; leasehold never pulls: make it with docker build/import/load",
                    attrs.image
                )));
            }
            Err(e) => return Err(self.down(&format!("inspect image {}", attrs.image), e)),
        }
        let mut networking = None;
        if let Some(network) = &attrs.network {
            let mut endpoint = EndpointSettings::default();
            if let Some(fixed) = &fixed {
                self.ensure_network(docker, agent, id, network, fixed).await?;
                endpoint.ipam_config =
                    Some(EndpointIpamConfig { ipv4_address: Some(fixed.addr.to_string()), ..Default::default() });
            }
            networking =
                Some(NetworkingConfig { endpoints_config: Some(HashMap::from([(network.clone(), endpoint)])) });
        }
        let name = object_name(id);
        let body = ContainerCreateBody {
            image: Some(attrs.image.clone()),
            cmd: attrs.cmd.clone(),
            env: (!env.is_empty()).then_some(env),
            labels: Some(self.labels_for(agent, id, spec)),
            host_config: Some(HostConfig {
                memory: attrs.memory,
                nano_cpus: attrs.nano_cpus,
                network_mode: attrs.network.clone(),
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            networking_config: networking,
            ..Default::default()
        };
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        let native = match docker.create_container(Some(options), body).await {
            Ok(created) => created.id,
            Err(e) if status(&e) == Some(409) => {
                // Made by an earlier try of this create (its answer lost), or by someone else.
                let found = match docker.inspect_container(&name, None::<InspectContainerOptions>).await {
                    Ok(found) => found,
                    Err(e) => return Err(self.down(&format!("inspect container {name}"), e)),
                };
                let labels = found.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
                if !is_ours(&labels, agent, Some(id)) {
                    return Err(DriverError::CreateFailed(format!(
                        "a container named {name} exists that agent {agent} did not make (its {LABEL_AGENT} label is \
                         {:?}): remove or rename it",
                        labels.get(LABEL_AGENT).map_or("absent", String::as_str)
                    )));
                }
                let id = found.id.clone().unwrap_or_else(|| name.clone());
                if !never_started(&found) {
                    return Ok(Some(id));
                }
                id
            }
            Err(e) => return Err(create_error(&self.endpoint, &format!("create container {name}"), e)),
        };
        match docker.start_container(&name, None).await {
            Ok(()) => Ok(Some(native)),
            Err(e) => Err(create_error(&self.endpoint, &format!("start container {name}"), e)),
        }
    }

    /// Makes the network a fixed address goes on, or checks the one there can hold the pool.
    async fn ensure_network(
        &self,
        docker: &Docker,
        agent: &AgentName,
        id: ResourceId,
        network: &str,
        fixed: &FixedAddress,
    ) -> Result<(), DriverError> {
        let _making = self.making_network.lock().await;
        let found = match docker.inspect_network(network, None).await {
            Ok(found) => Some(found),
            Err(e) if status(&e) == Some(404) => None,
            Err(e) => return Err(self.down(&format!("inspect network {network}"), e)),
        };
        let found = match (found, &fixed.pool) {
            (Some(found), _) => found,
            (None, None) => {
                return Err(DriverError::CreateFailed(format!(
                    "docker network {network} does not exist, and the claim on pool {} carried no pool definition \
                     to make it from: create the network by hand",
                    fixed.pool_name
                )));
            }
            (None, Some(pool)) => {
                let plan = network_plan(&fixed.pool_name, pool, network).map_err(DriverError::CreateFailed)?;
                let mut labels: HashMap<String, String> = self.extra_labels.clone().into_iter().collect();
                labels.insert(LABEL_AGENT.to_owned(), agent.to_string());
                labels.insert(LABEL_NETWORK_POOL.to_owned(), fixed.pool_name.to_string());
                let request = NetworkCreateRequest {
                    name: network.to_owned(),
                    driver: Some("bridge".to_owned()),
                    ipam: Some(Ipam {
                        driver: Some("default".to_owned()),
                        config: Some(vec![IpamConfig {
                            subnet: Some(plan.subnet.clone()),
                            ip_range: Some(plan.ip_range.clone()),
                            gateway: Some(plan.gateway.to_string()),
                            auxiliary_addresses: None,
                        }]),
                        options: None,
                    }),
                    labels: Some(labels),
                    ..Default::default()
                };
                let refused = match docker.create_network(request).await {
                    Ok(_) => return Ok(()),
                    Err(e) if status(&e).is_some_and(|code| (400..500).contains(&code)) => e,
                    Err(e) => return Err(self.down(&format!("create network {network}"), e)),
                };
                // Another process made it meanwhile (a name conflict, or, on daemons that allow two networks of one
                // name, the subnet taken a moment before the name shows): the network there now is checked as any
                // network found. Looked for a few times, briefly: then the refusal stands.
                let mut tries = 0;
                loop {
                    match docker.inspect_network(network, None).await {
                        Ok(found) => break found,
                        Err(e) if status(&e) == Some(404) && tries < 5 => tries += 1,
                        Err(e) if status(&e) == Some(404) => {
                            return Err(create_error(&self.endpoint, &format!("create network {network}"), refused));
                        }
                        Err(e) => return Err(self.down(&format!("inspect network {network}"), e)),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let subnets: Vec<NetworkSubnet> = found
            .ipam
            .and_then(|ipam| ipam.config)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|config| NetworkSubnet::parse(config.subnet.as_deref()?, config.gateway.as_deref()))
            .collect();
        check_network(fixed, network, &subnets).map_err(DriverError::CreateFailed)?;
        // leasehold grants an address to one resource at a time, and only once the container that had it is gone:
        // another container that holds it was given it by hand. Docker would refuse the start (a 403 or a 500,
        // as it goes), after making the container; this says who holds it, and makes nothing.
        let own = object_name(id);
        let holder = found.containers.unwrap_or_default().into_iter().find_map(|(container, endpoint)| {
            let addr = endpoint.ipv4_address.as_deref()?.split('/').next()?.parse::<Ipv4Addr>().ok()?;
            let name = endpoint.name.unwrap_or(container);
            (addr == fixed.addr && name != own).then_some(name)
        });
        match holder {
            Some(holder) => Err(DriverError::CreateFailed(format!(
                "address {} of pool {} is already held on docker network {network} by container {holder:?}, which \
                 leasehold did not give it: remove that container, or exclude the address from the pool",
                fixed.addr, fixed.pool_name
            ))),
            None => Ok(()),
        }
    }

    async fn create_volume(
        &self,
        docker: &Docker,
        agent: &AgentName,
        id: ResourceId,
        spec: &Spec,
    ) -> Result<Option<String>, DriverError> {
        volume_attributes(&spec.attributes).map_err(DriverError::CreateFailed)?;
        let name = object_name(id);
        let request = VolumeCreateRequest {
            name: Some(name.clone()),
            labels: Some(self.labels_for(agent, id, spec)),
            ..Default::default()
        };
        // Docker answers a create of a volume that exists with that volume, whoever made it: its labels say whose.
        match docker.create_volume(request).await {
            Ok(volume) if is_ours(&volume.labels, agent, Some(id)) => Ok(Some(volume.name)),
            Ok(volume) => Err(DriverError::CreateFailed(format!(
                "a volume named {name} exists that agent {agent} did not make (its {LABEL_AGENT} label is {:?}): \
                 remove it",
                volume.labels.get(LABEL_AGENT).map_or("absent", String::as_str)
            ))),
            Err(e) => Err(create_error(&self.endpoint, &format!("create volume {name}"), e)),
        }
    }

    /// Why a container that is not running failed for good, if it did: it ran and stopped, or its start failed (a
    /// command that does not exist). One made and not started yet has not failed.
    fn failure_of(name: &str, found: &ContainerInspectResponse) -> Option<String> {
        let state = found.state.clone().unwrap_or_default();
        if state.running == Some(true) {
            return None;
        }
        if never_started(found) {
            return state
                .error
                .filter(|error| !error.is_empty())
                .map(|error| format!("container {name} could not start: {error}"));
        }
        Some(Self::exit_of(name, found))
    }

    /// The failure of a container that ran and stopped, from its state.
    fn exit_of(name: &str, found: &ContainerInspectResponse) -> String {
        let state = found.state.clone().unwrap_or_default();
        format!(
            "container {name} exited with code {} at {}",
            state.exit_code.map_or_else(|| "unknown".to_owned(), |code| code.to_string()),
            state.finished_at.as_deref().unwrap_or("an unknown time")
        )
    }
}

impl Driver for DockerDriver {
    async fn open(&self, agent: &AgentName) -> Result<(), DriverError> {
        let docker = self.docker().await?;
        docker.ping().await.map_err(|e| self.down("ping", e))?;
        let info = docker.info().await.map_err(|e| self.down("info", e))?;
        let Some(daemon) = info.id.filter(|id| !id.is_empty()) else {
            return Err(DriverError::Transient(format!("the docker daemon at {} did not say its ID", self.endpoint)));
        };
        let path = self.lock_dir.join(lock_file_name(&daemon, agent));
        let file = open_lock_file(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(DriverError::Refused(format!(
                    "another process of agent {agent} drives docker daemon {daemon} at {} (it holds {}): one \
                     process per agent and daemon",
                    self.endpoint,
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(DriverError::Transient(format!("cannot lock {}: {e}", path.display())));
            }
        }
        *self.opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Opened { agent: agent.clone(), _lock: file });
        Ok(())
    }

    async fn create(&self, id: ResourceId, spec: &Spec) -> Result<Option<String>, DriverError> {
        let agent = self.agent()?;
        let docker = self.docker().await?;
        match spec.kind.as_str() {
            "container" => self.create_container(&docker, &agent, id, spec).await,
            "volume" => self.create_volume(&docker, &agent, id, spec).await,
            other => {
                Err(DriverError::CreateFailed(format!("the docker driver makes no {other:?}: known kinds are {KINDS}")))
            }
        }
    }

    async fn destroy(&self, id: ResourceId) -> Result<(), DriverError> {
        let agent = self.agent()?;
        let docker = self.docker().await?;
        let name = object_name(id);
        match docker.inspect_container(&name, None::<InspectContainerOptions>).await {
            Ok(found) => {
                let labels = found.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
                if is_ours(&labels, &agent, None) {
                    let stop = StopContainerOptions {
                        t: Some(i32::try_from(self.stop_timeout.as_secs()).unwrap_or(i32::MAX)),
                        signal: None,
                    };
                    match docker.stop_container(&name, Some(stop)).await {
                        Ok(()) => {}
                        Err(e) if status(&e) == Some(404) => {}
                        Err(e) => return Err(self.down(&format!("stop container {name}"), e)),
                    }
                    let remove = RemoveContainerOptions { v: true, force: true, link: false };
                    match docker.remove_container(&name, Some(remove)).await {
                        Ok(()) => {}
                        Err(e) if status(&e) == Some(404) => {}
                        Err(e) => return Err(self.down(&format!("remove container {name}"), e)),
                    }
                } else {
                    tracing::warn!(container = %name, agent = %agent, "a container of a resource's name is not this agent's: left alone");
                }
            }
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(self.down(&format!("inspect container {name}"), e)),
        }
        match docker.inspect_volume(&name).await {
            Ok(found) if is_ours(&found.labels, &agent, None) => {}
            Ok(_) => {
                tracing::warn!(volume = %name, agent = %agent, "a volume of a resource's name is not this agent's: left alone");
                return Ok(());
            }
            Err(e) if status(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(self.down(&format!("inspect volume {name}"), e)),
        }
        match docker.remove_volume(&name, None::<RemoveVolumeOptions>).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) if status(&e) == Some(409) => {
                let users = ListContainersOptions {
                    all: true,
                    filters: Some(HashMap::from([("volume".to_owned(), vec![name.clone()])])),
                    ..Default::default()
                };
                let users = match docker.list_containers(Some(users)).await {
                    Ok(users) => users
                        .into_iter()
                        .map(|c| {
                            c.names
                                .and_then(|names| names.into_iter().next())
                                .map(|n| n.trim_start_matches('/').to_owned())
                                .or(c.id)
                                .unwrap_or_default()
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    Err(e) => return Err(self.down(&format!("list the containers using volume {name}"), e)),
                };
                let users = if users.is_empty() { "a container".to_owned() } else { format!("container {users}") };
                Err(DriverError::InUse(format!(
                    "volume {name} is in use by {users}: it is removed once that container is gone"
                )))
            }
            Err(e) => Err(self.down(&format!("remove volume {name}"), e)),
        }
    }

    async fn list(&self) -> Result<Vec<Listed>, DriverError> {
        let agent = self.agent()?;
        let docker = self.docker().await?;
        docker.ping().await.map_err(|e| self.down("ping", e))?;
        let filters = list_filters(&agent);
        let containers = ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() };
        let containers = docker.list_containers(Some(containers)).await.map_err(|e| self.down("list containers", e))?;
        let volumes = ListVolumesOptions { filters: Some(filters) };
        let volumes = docker.list_volumes(Some(volumes)).await.map_err(|e| self.down("list volumes", e))?;
        let mut found: BTreeMap<ResourceId, Listed> = BTreeMap::new();
        for container in containers {
            let Some(id) = resource_of(container.labels.as_ref()) else { continue };
            let failed = match container.state {
                // Stopped after it ran, or made and never started: which, and why, only an inspect says.
                Some(
                    ContainerSummaryStateEnum::EXITED
                    | ContainerSummaryStateEnum::DEAD
                    | ContainerSummaryStateEnum::CREATED,
                ) => {
                    let name = container.id.clone().unwrap_or_else(|| object_name(id));
                    match docker.inspect_container(&name, None::<InspectContainerOptions>).await {
                        Ok(inspected) => Self::failure_of(&object_name(id), &inspected),
                        // Removed between the listing and now: not there.
                        Err(e) if status(&e) == Some(404) => continue,
                        Err(e) => return Err(self.down(&format!("inspect container {name}"), e)),
                    }
                }
                _ => None,
            };
            let listed = found.entry(id).or_insert_with(|| Listed::present(id));
            if failed.is_some() {
                listed.failed = failed;
            }
        }
        for volume in volumes.volumes.unwrap_or_default() {
            if let Some(id) = resource_of(Some(&volume.labels)) {
                found.entry(id).or_insert_with(|| Listed::present(id));
            }
        }
        Ok(found.into_values().collect())
    }

    async fn check(&self, id: ResourceId) -> Result<Health, DriverError> {
        let agent = self.agent()?;
        let docker = self.docker().await?;
        let name = object_name(id);
        let unhealthy = |detail: String| Ok(Health { healthy: false, detail });
        match docker.inspect_container(&name, None::<InspectContainerOptions>).await {
            Ok(found)
                if is_ours(&found.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default(), &agent, None) =>
            {
                let state = found.state.clone().unwrap_or_default();
                if state.running != Some(true) {
                    return unhealthy(Self::failure_of(&name, &found).unwrap_or_else(|| {
                        format!(
                            "container {name} is {}",
                            state.status.map_or_else(|| "not running".to_owned(), |s| s.to_string())
                        )
                    }));
                }
                let checked = found
                    .config
                    .as_ref()
                    .and_then(|c| c.healthcheck.as_ref())
                    .and_then(|h| h.test.as_ref())
                    .is_some_and(|test| test.first().is_some_and(|t| t != "NONE"));
                if !checked {
                    return Ok(Health { healthy: true, detail: format!("container {name} is running") });
                }
                match state.health.and_then(|h| h.status) {
                    Some(HealthStatusEnum::HEALTHY) => {
                        Ok(Health { healthy: true, detail: format!("container {name} is running and healthy") })
                    }
                    Some(other) => unhealthy(format!("container {name} is running; its health check says {other}")),
                    None => unhealthy(format!("container {name} is running; its health check has no status yet")),
                }
            }
            Ok(_) => unhealthy(format!("absent: container {name} is not agent {agent}'s")),
            Err(e) if status(&e) == Some(404) => match docker.inspect_volume(&name).await {
                Ok(found) if is_ours(&found.labels, &agent, None) => {
                    Ok(Health { healthy: true, detail: format!("volume {name} exists") })
                }
                Ok(_) => unhealthy(format!("absent: volume {name} is not agent {agent}'s")),
                Err(e) if status(&e) == Some(404) => unhealthy("absent".to_owned()),
                Err(e) => Err(self.down(&format!("inspect volume {name}"), e)),
            },
            Err(e) => Err(self.down(&format!("inspect container {name}"), e)),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            Endpoint::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

/// The name of the container or volume of resource `id`.
fn object_name(id: ResourceId) -> String {
    format!("lh-{id}")
}

/// Opens (making it if need be) the lock file at `path` without following a symlink there: the default lock
/// directory is the temporary directory, where anyone may put a symlink of that name, and an agent running as root
/// would otherwise make (or open) the file it points at. A new file is made with `create_new` (which never follows
/// a symlink); an existing one is opened, then checked to be the regular file the name itself is.
fn open_lock_file(path: &Path) -> Result<std::fs::File, DriverError> {
    use std::os::unix::fs::MetadataExt;
    let cannot = |e: io::Error| DriverError::Transient(format!("cannot open the lock file {}: {e}", path.display()));
    let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => return Ok(file),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let named = std::fs::symlink_metadata(path).map_err(cannot)?;
            if !named.file_type().is_file() {
                return Err(not_a_lock_file(path));
            }
            let file = std::fs::OpenOptions::new().write(true).open(path).map_err(cannot)?;
            let opened = file.metadata().map_err(cannot)?;
            if (opened.dev(), opened.ino()) != (named.dev(), named.ino()) {
                return Err(not_a_lock_file(path));
            }
            file
        }
        Err(e) => return Err(cannot(e)),
    };
    Ok(file)
}

fn not_a_lock_file(path: &Path) -> DriverError {
    DriverError::Refused(format!(
        "the lock file {} is not a regular file (a symlink?): someone else put it there; remove it, or give the agent \
         a lock directory of its own ($XDG_RUNTIME_DIR)",
        path.display()
    ))
}

/// The lock file of one agent on one daemon (the daemon's ID is kept to characters safe in a file name).
fn lock_file_name(daemon: &str, agent: &AgentName) -> String {
    let daemon: String =
        daemon.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    format!("leasehold-docker-{daemon}-{agent}.lock")
}

/// True when `labels` say the object is `agent`'s (and resource `id`'s, when given).
fn is_ours(labels: &HashMap<String, String>, agent: &AgentName, id: Option<ResourceId>) -> bool {
    labels.get(LABEL_AGENT).is_some_and(|a| a == agent.as_str())
        && id.is_none_or(|id| labels.get(LABEL_RESOURCE).is_some_and(|r| *r == id.to_string()))
}

/// The resource an object's labels name, if they name one that parses.
fn resource_of(labels: Option<&HashMap<String, String>>) -> Option<ResourceId> {
    labels?.get(LABEL_RESOURCE)?.parse().ok()
}

/// A container made and never started: its start time is Go's zero time, and its status `created`.
fn never_started(found: &ContainerInspectResponse) -> bool {
    let state = found.state.clone().unwrap_or_default();
    state.status == Some(ContainerStateStatusEnum::CREATED)
        || state.started_at.as_deref().is_none_or(|at| at.starts_with("0001-01-01"))
}

/// The filters of every listing: the agent's label, and nothing else.
fn list_filters(agent: &AgentName) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![format!("{LABEL_AGENT}={agent}")])])
}

/// The HTTP status of a daemon's answer, if it answered.
fn status(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// A daemon that did not do what was asked for a reason that may pass: tried again later.
fn down(endpoint: &Endpoint, what: &str, e: BollardError) -> DriverError {
    DriverError::Transient(format!("docker daemon at {endpoint}: {what}: {e}"))
}

/// A create's error: a request the daemon refuses as such (4xx: a bad memory value, a network that does not exist)
/// fails for good; anything else (no answer, 5xx) is tried again.
fn create_error(endpoint: &Endpoint, what: &str, e: BollardError) -> DriverError {
    match status(&e) {
        Some(code) if (400..500).contains(&code) => {
            DriverError::CreateFailed(format!("docker daemon at {endpoint} refused to {what}: {e}"))
        }
        _ => down(endpoint, what, e),
    }
}

/// A client for `endpoint`, each request under `timeout_secs`.
fn connect(endpoint: &Endpoint, timeout_secs: u64) -> Result<Docker, DriverError> {
    let made = match endpoint {
        Endpoint::Unix(path) => {
            Docker::connect_with_unix(&path.to_string_lossy(), timeout_secs, bollard::API_DEFAULT_VERSION)
        }
        Endpoint::Tcp(addr) => {
            Docker::connect_with_http(&format!("tcp://{addr}"), timeout_secs, bollard::API_DEFAULT_VERSION)
        }
    };
    made.map_err(|e| down(endpoint, "connect", e))
}

/// Parses what follows `docker:`. `docker_host` is `DOCKER_HOST`, used for an empty endpoint when it is a unix
/// socket.
fn parse_endpoint(endpoint: &str, docker_host: Option<&str>) -> Result<Endpoint, &'static str> {
    if endpoint.is_empty() {
        return Ok(match docker_host.and_then(|host| host.strip_prefix("unix://")) {
            Some(path) if !path.is_empty() => Endpoint::Unix(PathBuf::from(path)),
            _ => Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)),
        });
    }
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err("a docker unix endpoint is unix:///ABSOLUTE/PATH");
        }
        return Ok(Endpoint::Unix(PathBuf::from(path)));
    }
    let Some(addr) = endpoint.strip_prefix("tcp://") else {
        return Err("a docker endpoint is empty (the local socket), unix:///PATH or tcp://HOST:PORT");
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("a docker tcp endpoint is tcp://HOST:PORT");
    };
    if port.parse::<u16>().is_err() {
        return Err("a docker tcp endpoint is tcp://HOST:PORT with a port number");
    }
    let loopback = host == "localhost"
        || host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err("docker over tcp is allowed to a loopback host only (127.0.0.1, ::1, localhost): this build \
                    carries no TLS, so a remote daemon would be driven in clear text without authentication; use its \
                    unix socket or a tunnel to a local port");
    }
    Ok(Endpoint::Tcp(addr.to_owned()))
}

/// A container's attributes, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct ContainerAttributes {
    image: String,
    cmd: Option<Vec<String>>,
    /// From `env.NAME` attributes, by name.
    env: Vec<(String, String)>,
    /// As written: a path relative to the agent's env file directory, checked when it is read.
    env_file: Option<String>,
    memory: Option<i64>,
    nano_cpus: Option<i64>,
    /// The Docker network it joins: with an IPv4 claim, at the claimed address (made for the pool if missing);
    /// without one, with whatever address Docker gives it (the network must then exist).
    network: Option<String>,
}

/// Checks a container's attributes; the error names the attribute and what is known.
fn container_attributes(attributes: &BTreeMap<String, String>) -> Result<ContainerAttributes, String> {
    let mut attrs = ContainerAttributes::default();
    let mut image = None;
    for (key, value) in attributes {
        match key.as_str() {
            "image" if value.trim().is_empty() => return Err("attribute image is empty".to_owned()),
            "image" => image = Some(image_reference(value.trim())?),
            "cmd" => attrs.cmd = Some(parse_cmd(value)?),
            "env-file" => attrs.env_file = Some(value.clone()),
            "memory" => attrs.memory = Some(parse_bytes(value)?),
            "cpus" => attrs.nano_cpus = Some(parse_cpus(value)?),
            "network" if value.trim().is_empty() => return Err("attribute network is empty".to_owned()),
            "network" => attrs.network = Some(network_name(value.trim())?),
            _ => match key.strip_prefix("env.") {
                Some(name) if is_env_name(name) => attrs.env.push((name.to_owned(), value.clone())),
                Some(name) => return Err(format!("attribute {key}: {name:?} is not an environment variable name")),
                None => {
                    return Err(format!(
                        "a container has no attribute {key:?}: known attributes are {CONTAINER_ATTRIBUTES}"
                    ));
                }
            },
        }
    }
    attrs.image = image
        .ok_or_else(|| format!("a container needs attribute image; known attributes are {CONTAINER_ATTRIBUTES}"))?;
    Ok(attrs)
}

/// `image`: a reference as Docker writes one (`name`, `name:tag`, `host/path/name:tag`, `name@sha256:...`). Anything
/// else is refused here: the value goes into the path of a request to the daemon as it is, and into messages that
/// reach logs and terminals, so a `?`, a `..`, a space or a control character must never get that far.
fn image_reference(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "/:@._-".contains(c);
    if value.len() > 255
        || !value.chars().all(allowed)
        || !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || value.contains("..")
        || value.contains("//")
    {
        return Err(format!(
            "attribute image {value:?} is not an image reference (name, name:tag, name@sha256:digest; letters, digits \
             and / : @ . _ -)"
        ));
    }
    Ok(value.to_owned())
}

/// `network`: the name of a Docker network to join. Only a name: `host` (the machine's own network namespace, with
/// every service that listens on its loopback, the daemon's TCP port among them) and `container:<id>` (another
/// container's namespace, another tenant's perhaps) are network modes, not networks, and hand the container to
/// whoever asked for far more than a network; they are refused, as is anything that is not a network name.
fn network_name(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
    if value.eq_ignore_ascii_case("host") {
        return Err("attribute network \"host\" is refused: a container of the agent's never shares the machine's \
                    network namespace; name a Docker network"
            .to_owned());
    }
    if value.len() > 128 || !value.chars().all(allowed) || !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "attribute network {value:?} is not a Docker network name (letters, digits and _ . -; network modes such as \
             container:<id> are refused)"
        ));
    }
    Ok(value.to_owned())
}

/// Checks a volume's attributes: it takes none.
fn volume_attributes(attributes: &BTreeMap<String, String>) -> Result<(), String> {
    match attributes.keys().next() {
        Some(key) => Err(format!("a volume has no attribute {key:?}: it takes none")),
        None => Ok(()),
    }
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains(char::is_whitespace)
}

/// `cmd`: a JSON array of strings when it starts with `[`, else words split on whitespace.
fn parse_cmd(value: &str) -> Result<Vec<String>, String> {
    let cmd: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| format!("attribute cmd is not a JSON array of strings: {e}"))?
    } else {
        value.split_whitespace().map(str::to_owned).collect()
    };
    if cmd.is_empty() {
        return Err("attribute cmd is empty".to_owned());
    }
    Ok(cmd)
}

/// `memory`: bytes, with an optional k, m or g suffix (powers of 1024).
fn parse_bytes(value: &str) -> Result<i64, String> {
    let value = value.trim();
    let (digits, unit) = match value.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&value[..at], c.to_ascii_lowercase()),
        _ => (value, 'b'),
    };
    let shift = match unit {
        'b' => 0,
        'k' => 10,
        'm' => 20,
        'g' => 30,
        _ => return Err(format!("attribute memory {value:?}: the suffix is k, m or g")),
    };
    let n: i64 =
        digits.parse().map_err(|_| format!("attribute memory {value:?} is not a number of bytes (512m, 2g)"))?;
    match n.checked_mul(1 << shift) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(format!("attribute memory {value:?} is not a positive number of bytes")),
    }
}

/// `cpus`: a decimal number of CPUs, as Docker's nano-CPUs.
fn parse_cpus(value: &str) -> Result<i64, String> {
    match value.trim().parse::<f64>() {
        Ok(cpus) if cpus.is_finite() && cpus > 0.0 && cpus < 1e6 => Ok((cpus * 1e9).round() as i64),
        _ => Err(format!("attribute cpus {value:?} is not a positive number of CPUs (0.5, 2)")),
    }
}

/// An env file: lines `NAME=VALUE`; blank lines and lines starting with `#` are skipped.
fn parse_env_file(text: &str) -> Result<Vec<String>, String> {
    let mut env = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.trim().is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.split_once('=') {
            Some((name, _)) if is_env_name(name) => env.push(trimmed.to_owned()),
            _ => return Err(format!("line {} is not NAME=VALUE", n + 1)),
        }
    }
    Ok(env)
}

/// The address a container gets on its network, from its IPv4 claim.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FixedAddress {
    pool_name: PoolName,
    addr: Ipv4Addr,
    /// The pool's definition, if the grant carried it (without it, a missing network cannot be made).
    pool: Option<PoolKind>,
}

/// The one IPv4 claim of a container that joins `network`, if it has one. A claim on an IPv4 pool of a container
/// without a `network` attribute puts no address anywhere.
fn fixed_address(
    claims: &BTreeMap<PoolName, crate::driver::Claimed>,
    network: &str,
) -> Result<Option<FixedAddress>, String> {
    let mut found: Vec<FixedAddress> = claims
        .iter()
        .filter_map(|(pool_name, claimed)| match (claimed.value, &claimed.pool) {
            (PoolValue::Ipv4(addr), None | Some(PoolKind::Ipv4 { .. })) => {
                Some(FixedAddress { pool_name: pool_name.clone(), addr, pool: claimed.pool.clone() })
            }
            _ => None,
        })
        .collect();
    if found.len() > 1 {
        let named: Vec<String> = found.iter().map(|f| format!("{} ({})", f.addr, f.pool_name)).collect();
        return Err(format!(
            "the container joins one docker network ({network}) but holds {} IPv4 addresses: {}; claim one",
            found.len(),
            named.join(", ")
        ));
    }
    Ok(found.pop())
}

/// What a network made for an IPv4 pool looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NetworkPlan {
    subnet: String,
    gateway: Ipv4Addr,
    /// Only the gateway: Docker hands out nothing of its own from the pool's addresses.
    ip_range: String,
}

/// The network to make for pool `pool_name`: its subnet is the pool's, its gateway the lowest address the pool
/// excludes.
fn network_plan(pool_name: &PoolName, pool: &PoolKind, network: &str) -> Result<NetworkPlan, String> {
    let PoolKind::Ipv4 { network: base, prefix_len, exclude } = pool else {
        return Err(format!("pool {pool_name} is not an IPv4 pool"));
    };
    let cidr = Cidr { base: *base, prefix_len: *prefix_len };
    // A bridge keeps its network and broadcast addresses and its gateway for itself: in a /31 or /32 Docker cannot
    // even place the gateway, and answers a 500 that would be taken for a daemon's passing trouble.
    if *prefix_len > 30 {
        return Err(format!(
            "pool {pool_name} is {cidr}: docker network {network} cannot be made from it, since a bridge network needs \
             a /30 or larger (its network, broadcast and gateway addresses besides those handed out); define the pool \
             with a shorter prefix, or create the network by hand with a subnet that holds the pool"
        ));
    }
    let gateway = exclude
        .iter()
        .copied()
        .filter(|addr| cidr.contains(*addr) && *addr != cidr.base && *addr != cidr.broadcast())
        .min()
        .ok_or_else(|| {
            format!(
                "pool {pool_name} excludes no address to serve as network {network}'s gateway: define the pool with \
                 --exclude <first host>"
            )
        })?;
    Ok(NetworkPlan { subnet: cidr.to_string(), gateway, ip_range: format!("{gateway}/32") })
}

/// A subnet of a Docker network with its gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NetworkSubnet {
    cidr: Cidr,
    gateway: Ipv4Addr,
}

impl NetworkSubnet {
    /// From a network's IPAM config; without a gateway, Docker's default: the first host. IPv6 subnets are `None`.
    fn parse(subnet: &str, gateway: Option<&str>) -> Option<NetworkSubnet> {
        let (base, prefix_len) = subnet.split_once('/')?;
        let (base, prefix_len): (Ipv4Addr, u8) = (base.parse().ok()?, prefix_len.parse().ok()?);
        if prefix_len > 32 {
            return None;
        }
        let cidr = Cidr { base: Ipv4Addr::from(u32::from(base) & mask(prefix_len)), prefix_len };
        let gateway = match gateway.filter(|g| !g.is_empty()) {
            Some(gateway) => gateway.parse().ok()?,
            None => Ipv4Addr::from(u32::from(cidr.base).wrapping_add(1)),
        };
        Some(NetworkSubnet { cidr, gateway })
    }
}

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    base: Ipv4Addr,
    prefix_len: u8,
}

impl Cidr {
    fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & mask(self.prefix_len) == u32::from(self.base)
    }

    fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) | !mask(self.prefix_len))
    }

    /// True when `inner` lies wholly inside this network.
    fn covers(&self, inner: &Cidr) -> bool {
        self.prefix_len <= inner.prefix_len && self.contains(inner.base)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix_len)
    }
}

fn mask(prefix_len: u8) -> u32 {
    if prefix_len == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix_len.min(32))) }
}

/// Checks that `network` (with these IPv4 subnets) can carry the fixed address: a subnet holds the pool's whole
/// CIDR (or, without the pool's definition, the address), and the pool hands out none of the subnet's gateway,
/// network or broadcast address (which Docker keeps for itself).
fn check_network(fixed: &FixedAddress, network: &str, subnets: &[NetworkSubnet]) -> Result<(), String> {
    let pool_name = &fixed.pool_name;
    match &fixed.pool {
        Some(pool @ PoolKind::Ipv4 { network: base, prefix_len, .. }) => {
            let cidr = Cidr { base: *base, prefix_len: *prefix_len };
            let Some(subnet) = subnets.iter().find(|s| s.cidr.covers(&cidr)) else {
                let has: Vec<String> = subnets.iter().map(|s| s.cidr.to_string()).collect();
                return Err(format!(
                    "pool {pool_name} is {cidr}, which no subnet of docker network {network} holds (it has {}): \
                     use a network of a subnet holding the pool",
                    if has.is_empty() { "no IPv4 subnet".to_owned() } else { has.join(", ") }
                ));
            };
            for (addr, what) in [
                (subnet.gateway, "the gateway"),
                (subnet.cidr.base, "the network address"),
                (subnet.cidr.broadcast(), "the broadcast address"),
            ] {
                if pool.contains(&PoolValue::Ipv4(addr)) {
                    return Err(format!(
                        "pool {pool_name} includes {addr}, {what} of docker network {network}: exclude it"
                    ));
                }
            }
            Ok(())
        }
        Some(_) => Err(format!("pool {pool_name} is not an IPv4 pool")),
        None => {
            let addr = fixed.addr;
            let Some(subnet) = subnets.iter().find(|s| s.cidr.contains(addr)) else {
                return Err(format!("address {addr} of pool {pool_name} is in no subnet of docker network {network}"));
            };
            if addr == subnet.gateway || addr == subnet.cidr.base || addr == subnet.cidr.broadcast() {
                return Err(format!(
                    "address {addr} of pool {pool_name} is the gateway, network or broadcast address of docker \
                     network {network}: exclude it from the pool"
                ));
            }
            Ok(())
        }
    }
}

/// The applets the busybox image links to `/bin/busybox`.
const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "sleep", "true", "false", "echo", "cat", "ls", "mkdir", "rm", "touch", "env", "id", "hostname", "ip", "ps",
    "kill", "wget", "nc", "test", "[", "grep", "sed", "head", "tail", "wc", "date", "printf",
];

/// Makes (or finds) a local image holding a static busybox at `/bin/busybox` with applet links (`sh`, `sleep`,
/// `true`, `false`, `echo`, `cat`, ...), by importing a tar built in memory (`docker import`), tagged
/// `leasehold-busybox:<first 12 hex digits of the tar's sha256>`. Its default command sleeps for a day. It never
/// pulls. Returns the tag.
pub async fn import_busybox_image(endpoint: &str, busybox: &Path) -> Result<String, DriverError> {
    let driver = DockerDriver::new(endpoint).map_err(|e| DriverError::CreateFailed(e.to_string()))?;
    let binary = tokio::fs::read(busybox)
        .await
        .map_err(|e| DriverError::CreateFailed(format!("cannot read busybox at {}: {e}", busybox.display())))?;
    let tar =
        busybox_tar(&binary).map_err(|e| DriverError::CreateFailed(format!("cannot build the image tar: {e}")))?;
    let digest = Sha256::digest(&tar);
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let tag = format!("leasehold-busybox:{hex}");
    let docker = driver.docker().await?;
    match docker.inspect_image(&tag).await {
        Ok(_) => return Ok(tag),
        Err(e) if status(&e) == Some(404) => {}
        Err(e) => return Err(driver.down(&format!("inspect image {tag}"), e)),
    }
    let options = CreateImageOptions {
        from_src: Some("-".to_owned()),
        repo: Some("leasehold-busybox".to_owned()),
        tag: Some(hex),
        changes: vec![r#"CMD ["sleep", "86400"]"#.to_owned()],
        ..Default::default()
    };
    let mut progress = docker.create_image(Some(options), Some(bollard::body_full(tar.into())), None);
    while let Some(step) = progress.next().await {
        step.map_err(|e| driver.down(&format!("import image {tag}"), e))?;
    }
    docker.inspect_image(&tag).await.map_err(|e| driver.down(&format!("inspect image {tag} after its import"), e))?;
    Ok(tag)
}

/// The image's file system: `/bin/busybox`, its applet links, and the directories a program expects.
fn busybox_tar(binary: &[u8]) -> io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    // Fixed times and owners: the same busybox gives the same bytes, so the same tag.
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header
    };
    for (dir, mode) in [("bin/", 0o755), ("etc/", 0o755), ("tmp/", 0o1777), ("root/", 0o700)] {
        let mut dir_header = header(tar::EntryType::Directory, mode, 0);
        tar.append_data(&mut dir_header, dir, io::empty())?;
    }
    let mut file = header(tar::EntryType::Regular, 0o755, binary.len() as u64);
    tar.append_data(&mut file, "bin/busybox", binary)?;
    for applet in BUSYBOX_APPLETS {
        let mut link = header(tar::EntryType::Symlink, 0o777, 0);
        tar.append_link(&mut link, format!("bin/{applet}"), "busybox")?;
    }
    tar.into_inner()
}

/// The path of a static busybox on this machine: `LEASEHOLD_BUSYBOX`, else `/bin/busybox` (Debian's
/// busybox-static), checked to be a statically linked executable.
pub fn find_busybox() -> Result<PathBuf, String> {
    let path = std::env::var_os("LEASEHOLD_BUSYBOX")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/bin/busybox"), PathBuf::from);
    let bytes = std::fs::read(&path).map_err(|e| {
        format!("no busybox at {} ({e}): install busybox-static or set LEASEHOLD_BUSYBOX", path.display())
    })?;
    is_static_elf(&bytes).map_err(|why| {
        format!("{} is not a static busybox ({why}): install busybox-static or set LEASEHOLD_BUSYBOX", path.display())
    })?;
    Ok(path)
}

/// True for an executable ELF file with no program interpreter (so no dynamic loader: it runs in an empty image).
fn is_static_elf(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err("not an ELF file".to_owned());
    }
    let little = bytes[5] == 1;
    let read = |at: usize, width: usize| -> Option<u64> {
        let slice = bytes.get(at..at + width)?;
        let mut value = 0u64;
        for (i, b) in slice.iter().enumerate() {
            let shift = if little { i } else { width - 1 - i } * 8;
            value |= u64::from(*b) << shift;
        }
        Some(value)
    };
    let (phoff, phentsize, phnum) = match bytes[4] {
        1 => (read(28, 4), read(42, 2), read(44, 2)),
        2 => (read(32, 8), read(54, 2), read(56, 2)),
        _ => return Err("an unknown ELF class".to_owned()),
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Err("a truncated ELF header".to_owned());
    };
    for n in 0..phnum {
        let at = usize::try_from(phoff + n * phentsize).map_err(|_| "a bad program header offset".to_owned())?;
        // PT_INTERP (3): the file asks for a dynamic loader.
        match read(at, 4) {
            Some(3) => return Err("it is dynamically linked".to_owned()),
            Some(_) => {}
            None => return Err("a truncated program header table".to_owned()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Claimed;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn pool(name: &str) -> PoolName {
        name.parse().unwrap()
    }

    fn ipv4_pool(cidr: &str, exclude: &[&str]) -> PoolKind {
        let (base, prefix_len) = cidr.split_once('/').unwrap();
        PoolKind::Ipv4 {
            network: base.parse().unwrap(),
            prefix_len: prefix_len.parse().unwrap(),
            exclude: exclude.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn container_attributes_are_checked_by_name() {
        let ok = container_attributes(&attrs(&[
            ("image", "leasehold-busybox:abc"),
            ("cmd", "sleep 600"),
            ("env.GREETING", "hello world"),
            ("env-file", "app.env"),
            ("memory", "64m"),
            ("cpus", "1.5"),
            ("network", "lhnet"),
        ]))
        .unwrap();
        assert_eq!(ok.image, "leasehold-busybox:abc");
        assert_eq!(ok.cmd, Some(vec!["sleep".to_owned(), "600".to_owned()]));
        assert_eq!(ok.env, vec![("GREETING".to_owned(), "hello world".to_owned())]);
        assert_eq!(ok.env_file.as_deref(), Some("app.env"));
        assert_eq!(ok.memory, Some(64 << 20));
        assert_eq!(ok.nano_cpus, Some(1_500_000_000));
        assert_eq!(ok.network.as_deref(), Some("lhnet"));
        let json = container_attributes(&attrs(&[("image", "i"), ("cmd", r#"["sh", "-c", "echo a b"]"#)])).unwrap();
        assert_eq!(json.cmd, Some(vec!["sh".to_owned(), "-c".to_owned(), "echo a b".to_owned()]));
        for (bad, says) in [
            (attrs(&[("cmd", "true")]), "needs attribute image"),
            (attrs(&[("image", "i"), ("ports", "80")]), "no attribute \"ports\": known attributes are image"),
            (attrs(&[("image", "i"), ("cmd", "[1, 2]")]), "not a JSON array of strings"),
            (attrs(&[("image", "i"), ("cmd", "  ")]), "cmd is empty"),
            (attrs(&[("image", "i"), ("memory", "lots")]), "memory \"lots\""),
            (attrs(&[("image", "i"), ("memory", "2t")]), "suffix is k, m or g"),
            (attrs(&[("image", "i"), ("cpus", "-1")]), "cpus \"-1\""),
            (attrs(&[("image", "i"), ("env.", "x")]), "not an environment variable name"),
            (attrs(&[("image", "")]), "image is empty"),
            // Network modes that are not networks: the machine's namespace, another container's.
            (attrs(&[("image", "i"), ("network", "host")]), "network \"host\" is refused"),
            (attrs(&[("image", "i"), ("network", "HOST")]), "network \"host\" is refused"),
            (attrs(&[("image", "i"), ("network", "container:lh-0abc")]), "not a Docker network name"),
            (attrs(&[("image", "i"), ("network", "../containers/x")]), "not a Docker network name"),
            (attrs(&[("image", "i"), ("network", "net\u{1b}[2J")]), "not a Docker network name"),
            // An image is a reference, nothing that could turn the daemon's request path or a terminal.
            (attrs(&[("image", "../containers/lh-x")]), "not an image reference"),
            (attrs(&[("image", "busybox?all=1")]), "not an image reference"),
            (attrs(&[("image", "evil\u{1b}]0;owned\u{7}")]), "not an image reference"),
            (attrs(&[("image", "a b")]), "not an image reference"),
        ] {
            let err = container_attributes(&bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        for image in ["busybox", "leasehold-busybox:3f9cbed384b7", "registry.example:5000/team/app:1.2", "a@sha256:0f"]
        {
            assert_eq!(container_attributes(&attrs(&[("image", image)])).unwrap().image, image);
        }
        for network in ["bridge", "lh-test_net.1", "none"] {
            let ok = container_attributes(&attrs(&[("image", "i"), ("network", network)])).unwrap();
            assert_eq!(ok.network.as_deref(), Some(network));
        }
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("8k").unwrap(), 8192);
        assert!(parse_bytes("0").is_err());
        assert!(volume_attributes(&attrs(&[])).is_ok());
        assert!(volume_attributes(&attrs(&[("driver", "local")])).unwrap_err().contains("takes none"));
    }

    #[test]
    fn env_files_are_name_value_lines() {
        let env = parse_env_file("# a comment\n\nA=1\n  B=two words\nC=\n").unwrap();
        assert_eq!(env, vec!["A=1", "B=two words", "C="]);
        assert_eq!(parse_env_file("A=1\njust text\n").unwrap_err(), "line 2 is not NAME=VALUE");
        assert_eq!(parse_env_file("=x\n").unwrap_err(), "line 1 is not NAME=VALUE");
    }

    #[test]
    fn a_listing_asks_for_the_agent_label_and_nothing_else() {
        let agent = AgentName::new("w1").unwrap();
        let filters = list_filters(&agent);
        assert_eq!(filters, HashMap::from([("label".to_owned(), vec!["io.leasehold.agent=w1".to_owned()])]));
    }

    #[test]
    fn ownership_goes_by_the_agent_label() {
        let (w1, w2) = (AgentName::new("w1").unwrap(), AgentName::new("w2").unwrap());
        let id = ResourceId::from_parts(1_800_000_000_000, [1; 10]);
        let labels =
            HashMap::from([(LABEL_AGENT.to_owned(), "w1".to_owned()), (LABEL_RESOURCE.to_owned(), id.to_string())]);
        assert!(is_ours(&labels, &w1, None) && is_ours(&labels, &w1, Some(id)));
        assert!(!is_ours(&labels, &w2, None));
        assert!(!is_ours(&labels, &w1, Some(ResourceId::from_parts(1_800_000_000_000, [2; 10]))));
        assert!(!is_ours(&HashMap::new(), &w1, None));
        assert_eq!(resource_of(Some(&labels)), Some(id));
        let odd = HashMap::from([(LABEL_RESOURCE.to_owned(), "not-an-id".to_owned())]);
        assert_eq!(resource_of(Some(&odd)), None);
    }

    #[test]
    fn endpoints_are_the_local_socket_a_unix_path_or_a_loopback_port() {
        assert_eq!(parse_endpoint("", None), Ok(Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET))));
        assert_eq!(parse_endpoint("", Some("unix:///run/d.sock")), Ok(Endpoint::Unix(PathBuf::from("/run/d.sock"))));
        assert_eq!(parse_endpoint("", Some("tcp://10.0.0.1:2375")), Ok(Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET))));
        assert_eq!(parse_endpoint("unix:///run/x.sock", None), Ok(Endpoint::Unix(PathBuf::from("/run/x.sock"))));
        assert_eq!(parse_endpoint("tcp://127.0.0.1:2375", None), Ok(Endpoint::Tcp("127.0.0.1:2375".to_owned())));
        assert_eq!(parse_endpoint("tcp://[::1]:2375", None), Ok(Endpoint::Tcp("[::1]:2375".to_owned())));
        assert_eq!(parse_endpoint("tcp://localhost:2375", None), Ok(Endpoint::Tcp("localhost:2375".to_owned())));
        assert!(parse_endpoint("tcp://10.1.2.3:2376", None).unwrap_err().contains("no TLS"));
        assert!(parse_endpoint("tcp://127.0.0.1", None).is_err());
        assert!(parse_endpoint("tcp://127.0.0.1:http", None).is_err());
        assert!(parse_endpoint("unix://relative.sock", None).is_err());
        assert!(parse_endpoint("local", None).is_err());
        assert_eq!(Endpoint::Tcp("127.0.0.1:2375".to_owned()).to_string(), "tcp://127.0.0.1:2375");
    }

    #[test]
    fn a_container_on_a_network_takes_its_one_ipv4_claim() {
        let claimed = |value, pool| Claimed { value, pool };
        let net1 = ipv4_pool("10.9.0.0/29", &["10.9.0.1"]);
        let mut claims = BTreeMap::from([
            (pool("net1"), claimed(PoolValue::Ipv4("10.9.0.3".parse().unwrap()), Some(net1.clone()))),
            (pool("slots"), claimed(PoolValue::Slot(2), Some(PoolKind::Slots { count: 4 }))),
        ]);
        let fixed = fixed_address(&claims, "lhnet").unwrap().unwrap();
        assert_eq!((fixed.pool_name, fixed.addr, fixed.pool), (pool("net1"), "10.9.0.3".parse().unwrap(), Some(net1)));
        claims.insert(pool("net2"), claimed(PoolValue::Ipv4("10.8.0.2".parse().unwrap()), None));
        let err = fixed_address(&claims, "lhnet").unwrap_err();
        assert!(err.contains("holds 2 IPv4 addresses: 10.9.0.3 (net1), 10.8.0.2 (net2)"), "{err}");
        assert_eq!(fixed_address(&BTreeMap::new(), "lhnet"), Ok(None));
    }

    #[test]
    fn a_network_made_for_a_pool_has_its_gateway_at_the_lowest_excluded_address() {
        let plan = network_plan(&pool("net1"), &ipv4_pool("10.9.0.0/29", &["10.9.0.6", "10.9.0.1"]), "lhnet");
        assert_eq!(
            plan,
            Ok(NetworkPlan {
                subnet: "10.9.0.0/29".to_owned(),
                gateway: "10.9.0.1".parse().unwrap(),
                ip_range: "10.9.0.1/32".to_owned()
            })
        );
        // The network address cannot be the gateway, excluded or not.
        let plan = network_plan(&pool("net1"), &ipv4_pool("10.9.0.0/29", &["10.9.0.0", "10.9.0.2"]), "lhnet");
        assert_eq!(plan.unwrap().gateway, "10.9.0.2".parse::<Ipv4Addr>().unwrap());
        let err = network_plan(&pool("net1"), &ipv4_pool("10.9.0.0/29", &[]), "lhnet").unwrap_err();
        assert_eq!(
            err,
            "pool net1 excludes no address to serve as network lhnet's gateway: define the pool with --exclude <first \
             host>"
        );
        // A /31 or /32 has no room for a bridge's gateway besides its addresses: Docker answers 500 ("failed to
        // allocate gateway"), which would be retried for ever. Refused for good, before the daemon is asked.
        for (cidr, exclude) in [("10.9.0.0/31", ["10.9.0.0"]), ("10.9.0.5/32", ["10.9.0.5"])] {
            let err = network_plan(&pool("net1"), &ipv4_pool(cidr, &exclude), "lhnet").unwrap_err();
            assert!(err.contains(&format!("pool net1 is {cidr}")) && err.contains("/30 or larger"), "{err}");
        }
        let plan = network_plan(&pool("net1"), &ipv4_pool("10.9.0.8/30", &["10.9.0.9"]), "lhnet").unwrap();
        assert_eq!((plan.subnet.as_str(), plan.gateway), ("10.9.0.8/30", "10.9.0.9".parse().unwrap()));
    }

    #[test]
    fn an_existing_network_must_hold_the_pool_and_keep_its_own_addresses_out_of_it() {
        let fixed = |cidr: &str, exclude: &[&str]| FixedAddress {
            pool_name: pool("net1"),
            addr: "10.0.0.3".parse().unwrap(),
            pool: Some(ipv4_pool(cidr, exclude)),
        };
        let subnet = |s: &str, g: Option<&str>| NetworkSubnet::parse(s, g).unwrap();
        let lhnet = [subnet("10.0.0.0/24", Some("10.0.0.1"))];
        assert_eq!(check_network(&fixed("10.0.0.0/29", &["10.0.0.1"]), "lhnet", &lhnet), Ok(()));
        assert_eq!(
            check_network(&fixed("10.0.0.0/29", &[]), "lhnet", &lhnet).unwrap_err(),
            "pool net1 includes 10.0.0.1, the gateway of docker network lhnet: exclude it"
        );
        // A /29 at the top of the subnet holds its broadcast address.
        let top = FixedAddress { addr: "10.0.0.250".parse().unwrap(), ..fixed("10.0.0.248/29", &[]) };
        assert_eq!(check_network(&top, "lhnet", &lhnet), Ok(()), "a /29's own broadcast is not handed out");
        let top31 = FixedAddress { addr: "10.0.0.254".parse().unwrap(), ..fixed("10.0.0.254/31", &[]) };
        assert_eq!(
            check_network(&top31, "lhnet", &lhnet).unwrap_err(),
            "pool net1 includes 10.0.0.255, the broadcast address of docker network lhnet: exclude it"
        );
        let bottom = FixedAddress { addr: "10.0.0.0".parse().unwrap(), ..fixed("10.0.0.0/32", &[]) };
        assert!(check_network(&bottom, "lhnet", &lhnet).unwrap_err().contains("the network address"));
        let err = check_network(&fixed("10.1.0.0/29", &["10.1.0.1"]), "lhnet", &lhnet).unwrap_err();
        assert!(
            err.contains(
                "pool net1 is 10.1.0.0/29, which no subnet of docker network lhnet holds (it has 10.0.0.0/24)"
            ),
            "{err}"
        );
        let err = check_network(&fixed("10.0.0.0/23", &["10.0.0.1"]), "lhnet", &lhnet).unwrap_err();
        assert!(err.contains("no subnet"), "{err}");
        // Without a gateway in its IPAM config, Docker's default (the first host) is the gateway.
        assert_eq!(subnet("10.0.0.0/24", None).gateway, "10.0.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(NetworkSubnet::parse("fd00::/64", None), None);
        // Without the pool's definition, the address alone is checked.
        let bare = FixedAddress { pool: None, ..fixed("10.0.0.0/29", &[]) };
        assert_eq!(check_network(&bare, "lhnet", &lhnet), Ok(()));
        let on_gateway = FixedAddress { addr: "10.0.0.1".parse().unwrap(), ..bare.clone() };
        assert!(check_network(&on_gateway, "lhnet", &lhnet).unwrap_err().contains("gateway"));
        let outside = FixedAddress { addr: "10.5.0.1".parse().unwrap(), ..bare };
        assert!(check_network(&outside, "lhnet", &lhnet).unwrap_err().contains("in no subnet"));
    }

    #[test]
    fn the_busybox_tar_is_the_same_bytes_for_the_same_binary() {
        let one = busybox_tar(b"not really busybox").unwrap();
        assert_eq!(one, busybox_tar(b"not really busybox").unwrap());
        assert_ne!(one, busybox_tar(b"another binary").unwrap());
        let mut archive = tar::Archive::new(one.as_slice());
        let names: Vec<String> =
            archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        for wanted in ["bin/busybox", "bin/sh", "bin/sleep", "bin/false", "tmp/"] {
            assert!(
                names.iter().any(|n| n.trim_end_matches('/') == wanted.trim_end_matches('/')),
                "{wanted}: {names:?}"
            );
        }
    }

    #[test]
    fn only_a_static_elf_passes_for_busybox() {
        assert!(is_static_elf(b"#!/bin/sh\necho hi\n").unwrap_err().contains("not an ELF"));
        // A 64-bit little-endian header with one program header of type PT_INTERP, then one of PT_LOAD.
        let elf = |first_type: u8| {
            let mut bytes = vec![0u8; 64 + 2 * 56];
            bytes[..4].copy_from_slice(b"\x7fELF");
            bytes[4] = 2;
            bytes[5] = 1;
            bytes[32] = 64; // e_phoff
            bytes[54] = 56; // e_phentsize
            bytes[56] = 2; // e_phnum
            bytes[64] = first_type;
            bytes[64 + 56] = 1;
            bytes
        };
        assert_eq!(is_static_elf(&elf(1)), Ok(()));
        assert!(is_static_elf(&elf(3)).unwrap_err().contains("dynamically linked"));
        if Path::new("/bin/busybox").exists() && std::env::var_os("LEASEHOLD_BUSYBOX").is_none() {
            // Whatever is installed there is what `.ci/test` put there: Debian's static build.
            assert_eq!(find_busybox(), Ok(PathBuf::from("/bin/busybox")));
        }
        assert!(is_static_elf(&std::fs::read("/bin/ls").unwrap_or_default()).is_err(), "ls is dynamic, or absent");
    }
}
