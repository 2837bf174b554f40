//! The operator's view (`/ui`) in a real browser: Debian's headless Chromium, driven through chromedriver by
//! WebDriver (fantoccini), against a real `serve` with data in it.
//!
//! - The pages: a log whose first outcomes are five minutes old (an agent `w2` registered, went down, and a volume
//!   was allocated on it) is restored into a data directory; `serve` runs on it with an agent `w1` of its own, and the
//!   command line adds a pool with a held address, and a volume allocated by an issuer `op:<script>...` whose lease's
//!   holder is `<script>...</script>`, U+202E and more text. The overview lists the stuck volume, saying what it waits
//!   on; the resources, resource, lease, command, agents, agent, pools and pool pages each show what they must (what a
//!   resource waits on, who holds an address); the holder and the issuer show as literal text, each in an isolated
//!   `<bdi>`, and run nothing.
//! - One resource's timeline lists its allocation and its lease's grant, oldest first, each linking to its command.
//! - The live feed (`/ui/feed`) shows a command decided after the page opened, its markup-like issuer as text.
//! - With `--tokens`, the view asks for a login: a wrong token is refused, the right one opens the overview.
//!
//! Each page is saved as a PNG screenshot under the target directory (`ui-screenshots/NAME.png`). Chromium runs
//! headless on 127.0.0.1 with its own temporary profile and is stopped by its pid (its process group), as is
//! chromedriver. Without chromium or chromedriver on `PATH` the tests say so and pass, except under `CI=true`, where
//! that is a failure.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fantoccini::{Client, ClientBuilder};
use leasehold_agent::{AgentConfig, AgentControl, DirDriver};
use leasehold_log::embedded::{Clock, Embedded};
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::Allocate;
use leasehold_schemas::subjects::ingress_subject_of;
use leasehold_schemas::{ResourceId, Timestamp, codec};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{agent_name, command};
use crate::support::{Proc, Ran, run_cli};

/// How long any one awaited condition may take before the test fails.
const STEP: Duration = Duration::from_secs(30);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(50);
/// How far in the past the seeded log's clock runs: well past the overview's threshold for `pending` (2 min).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// The partitions of the seeded log and of the `serve` that goes on with it.
const PARTITIONS: u32 = 4;
/// A holder that would run a script if a page put it in as HTML, with a right-to-left override after it that would
/// turn the text after it around if a page did not isolate it.
const HOLDER: &str = "<script>window.__xss=1</script><img src=x>\u{202E}gnp.exe";
/// An issuer (printable ASCII without spaces or quotes) that would run a script if a page put it in as HTML.
const ISSUER: &str = "op:<script>window.__xss=2</script><img/src=x>";
/// The token of `op:alice` in the login test's `--tokens` file.
const TOKEN: &str = "e2e-browser-alice-0123456789abcdef";
/// The browser window's size; screenshots are as tall as the page (from [`MIN_SHOT_HEIGHT`] to [`MAX_SHOT_HEIGHT`]).
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;
const MIN_SHOT_HEIGHT: u32 = 400;
const MAX_SHOT_HEIGHT: u32 = 4000;

// ---------------------------------------------------------------------------------------------------------------
// The browser.

/// Headless Chromium with its own temporary profile, listening for DevTools on 127.0.0.1 only, and a chromedriver
/// attached to it; both are stopped by their pids (each its own process group) when this is dropped.
struct Browser {
    client: Client,
    // chromedriver stops before Chromium (fields drop in order).
    _driver: Group,
    _chromium: Group,
    /// The profile, removed once the browser is stopped.
    _profile: tempfile::TempDir,
    /// Where the screenshots go.
    shots: PathBuf,
}

/// Where a program is on `PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join(program)).find(|p| p.is_file())
}

/// Starts `program ARGS` as the leader of a process group of its own (so that what it starts is stopped with it),
/// its stdout and stderr in `NAME.out` and `NAME.err` of `dir`.
fn spawn_group(dir: &Path, name: &str, program: &Path, args: &[String]) -> (Group, PathBuf) {
    let out = dir.join(format!("{name}.out"));
    let child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("a stdout file"))
        .stderr(File::create(dir.join(format!("{name}.err"))).expect("a stderr file"))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
    (Group(child), out)
}

/// Asks `check` until it answers something, at most [`STEP`]; fails the test saying what was awaited and what the
/// last look found.
async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + STEP;
    loop {
        match check().await {
            Ok(found) => return found,
            Err(last) => assert!(Instant::now() < deadline, "waited {STEP:?} for {what}; last: {last}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A process started as the leader of its own process group: killed with the whole group, by the group's id (its
/// pid), when dropped, so that a test that fails half-way leaves nothing running.
struct Group(Child);

impl Group {
    /// How it exited, if it has.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().expect("ask whether the process runs")
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Not `exited`: a panic here, while a failing test unwinds, would abort the whole test binary.
        if matches!(self.0.try_wait(), Ok(None)) {
            let group = format!("-{}", self.0.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).stdin(Stdio::null()).status();
            let _ = self.0.wait();
        }
    }
}

impl Browser {
    /// Starts Chromium and chromedriver for a test in `dir`. `None`, after a warning, when either is not on `PATH`,
    /// except under `CI=true`, where that fails the test.
    async fn start(dir: &Path) -> Option<Browser> {
        let (Some(chromium), Some(chromedriver)) = (on_path("chromium"), on_path("chromedriver")) else {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "CI=true and chromium or chromedriver is not on PATH: the browser tests must run (apt-get install \
                 chromium chromium-driver; .ci/test does)"
            );
            eprintln!(
                "warning: skipped: chromium or chromedriver is not on PATH (apt-get install chromium chromium-driver)"
            );
            return None;
        };
        let profile = tempfile::Builder::new().prefix("lh-chromium-").tempdir().expect("a profile directory");
        let args = [
            "--headless",
            // Chromium's sandbox needs user namespaces, which a container run as root does not give.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-extensions",
            "--disable-sync",
            "--password-store=basic",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain([
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={WIDTH},{HEIGHT}"),
            "about:blank".to_owned(),
        ])
        .collect::<Vec<_>>();
        let (mut chromium, _) = spawn_group(dir, "chromium", &chromium, &args);
        // Chromium writes the port it listens on (its DevTools) into the profile once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let devtools = until("chromium's DevToolsActivePort", async || {
            if let Some(status) = chromium.exited() {
                panic!("chromium exited with {status}: {}", read(&dir.join("chromium.err")));
            }
            let text = std::fs::read_to_string(&port_file).map_err(|e| e.to_string())?;
            text.lines().next().and_then(|l| l.trim().parse::<u16>().ok()).ok_or(text)
        })
        .await;
        let (mut driver, driver_out) =
            spawn_group(dir, "chromedriver", &chromedriver, &["--port=0".to_owned(), "--log-level=WARNING".to_owned()]);
        let driver_port = until("chromedriver's port", async || {
            if let Some(status) = driver.exited() {
                panic!("chromedriver exited with {status}: {}", read(&dir.join("chromedriver.err")));
            }
            let text = read(&driver_out);
            text.split("started successfully on port ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|port| port.parse::<u16>().ok())
                .ok_or(text)
        })
        .await;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), json!({ "debuggerAddress": format!("127.0.0.1:{devtools}") }));
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
            .unwrap_or_else(|e| panic!("a WebDriver session on chromedriver: {e}"));
        let shots = screenshot_dir();
        std::fs::create_dir_all(&shots).unwrap_or_else(|e| panic!("create {}: {e}", shots.display()));
        Some(Browser { client, _driver: driver, _chromium: chromium, _profile: profile, shots })
    }

    /// Opens `url` and waits until the page's text holds each of `texts`; returns the text.
    async fn open(&self, url: &str, texts: &[&str]) -> String {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("open {url}: {e}"));
        self.expect(url, texts).await
    }

    /// Waits until the page's text holds each of `texts`; returns the text.
    async fn expect(&self, url: &str, texts: &[&str]) -> String {
        until(&format!("{url} to show {texts:?}"), async || {
            let text = self.text().await;
            if texts.iter().all(|t| text.contains(t)) { Ok(text) } else { Err(format!("the page says:\n{text}")) }
        })
        .await
    }

    /// The page's text as the browser renders it.
    async fn text(&self) -> String {
        self.script("return document.body ? document.body.innerText : ''").await.as_str().unwrap_or_default().to_owned()
    }

    /// Runs `script` in the page; what it returns.
    async fn script(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("run {script:?} in the page: {e}"))
    }

    /// The text of every `<bdi>` of the page.
    async fn isolated(&self) -> Vec<String> {
        let found = self.script("return Array.from(document.querySelectorAll('bdi'), b => b.textContent)").await;
        serde_json::from_value(found).expect("a list of texts")
    }

    /// Fails the test unless the page shows `text` (from outside: a holder, an issuer) as literal text in one
    /// `<bdi>`, and nothing of it ran: no `window.__xss`, no element it names, no script but the UI's own.
    async fn shows_as_text(&self, page: &str, text: &str) {
        let isolated = self.isolated().await;
        assert!(isolated.iter().any(|t| t == text), "{page}: {text:?} is not one <bdi> of literal text: {isolated:?}");
        let ran = self
            .script(
                "return { xss: typeof window.__xss, images: document.images.length, \
                 scripts: Array.from(document.scripts, s => s.getAttribute('src')) }",
            )
            .await;
        assert_eq!(ran["xss"], "undefined", "{page}: the script in {text:?} ran: {ran}");
        assert_eq!(ran["images"], 0, "{page}: the <img> in {text:?} became an element: {ran}");
        assert_eq!(ran["scripts"], json!(["/ui/assets/app.js"]), "{page}: scripts other than the UI's: {ran}");
    }

    /// Fails the test unless the page's title is `title` (an error page has its own).
    async fn titled(&self, title: &str) {
        let shown = self.client.title().await.expect("the page's title");
        assert_eq!(shown, format!("{title} · leasehold"), "the page's text:\n{}", self.text().await);
    }

    /// The text of the first element `css` selects whose text holds `holding`.
    async fn text_of(&self, css: &str, holding: &str) -> Option<String> {
        let found = self
            .client
            .execute(
                "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)\
                 .find(t => t.includes(arguments[1])) || null",
                vec![json!(css), json!(holding)],
            )
            .await
            .unwrap_or_else(|e| panic!("look for {css} holding {holding:?}: {e}"));
        found.as_str().map(str::to_owned)
    }

    /// Saves the page as `NAME.png` in the screenshots directory, the window's inside as tall as the page.
    async fn screenshot(&self, name: &str) {
        // The window's size counts its frame: what it adds is the outer height less the inner one.
        let sizes = self.script("return [document.body.scrollHeight, window.outerHeight - window.innerHeight]").await;
        let [content, frame] = [0, 1].map(|i| sizes[i].as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(0));
        let height = content.clamp(MIN_SHOT_HEIGHT, MAX_SHOT_HEIGHT) + frame;
        self.client.set_window_size(WIDTH, height).await.expect("resize the window");
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("a screenshot of {name}: {e}"));
        assert!(png.starts_with(b"\x89PNG"), "{name}: the screenshot is not a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.client.set_window_size(WIDTH, HEIGHT).await.expect("resize the window back");
    }

    /// Ends the WebDriver session, then stops chromedriver and Chromium.
    async fn stop(self) {
        let _ = self.client.clone().close().await;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `ui-screenshots` in the target directory: `CARGO_TARGET_DIR`, else the directory above the test binary's that
/// cargo marked as its own (`CACHEDIR.TAG`), else the one above its profile's (`TARGET/debug/deps/e2e-...`).
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let tagged = exe.ancestors().find(|dir| dir.join("CACHEDIR.TAG").is_file());
        tagged.or_else(|| exe.ancestors().nth(3)).map(Path::to_path_buf)
    });
    target.unwrap_or_else(std::env::temp_dir).join("ui-screenshots")
}

// ---------------------------------------------------------------------------------------------------------------
// The data.

/// Makes the data directory `data` hold a log whose clock ran [`BACKDATE`] behind: agent `w2` (a dir driver in
/// `root`) registered and stopped, then a volume was allocated on it, which nobody has made since. Returns the
/// volume's reference.
async fn seed_stuck(data: &Path, root: &Path) -> String {
    let behind = BACKDATE.as_millis() as u64;
    let clock: Clock = Arc::new(move || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
        Timestamp(now.as_millis() as u64 - behind)
    });
    let log = Embedded::in_memory(PARTITIONS, clock).expect("an in-memory log");
    let stop = CancellationToken::new();
    let worker =
        tokio::spawn(leasehold_worker::run(log.clone(), leasehold_worker::WorkerConfig::new("seed"), stop.clone()));

    let w2 = agent_name("w2");
    let control = AgentControl::new();
    let config = AgentConfig { control: control.clone(), ..AgentConfig::new(w2.clone()) };
    let agent_stop = CancellationToken::new();
    let agent = tokio::spawn(leasehold_agent::run(log.clone(), DirDriver::new(root), config, agent_stop.clone()));
    tokio::time::timeout(STEP, control.wait_for(|s| s.epoch.is_some()))
        .await
        .unwrap_or_else(|_| panic!("w2 did not register in {STEP:?}: {:?}", control.status()));
    agent_stop.cancel();
    agent.await.expect("the agent task").expect("w2 stops cleanly");

    let volume = ResourceId::generate();
    let envelope = command(Allocate::new(w2, volume, "volume", 1));
    let payload = Bytes::from(codec::encode_command(&envelope).expect("a command encodes"));
    log.publish_command(&ingress_subject_of(&envelope.body), &envelope.command_id.to_string(), payload)
        .await
        .expect("publish the allocation");
    until("the allocation on w2 decided", async || {
        let outcomes = log.read_outcomes(&OutcomeFilter::All, 1, usize::MAX).await.map_err(|e| e.to_string())?;
        let decided = outcomes
            .iter()
            .filter_map(|o| codec::decode_outcome(&o.payload).ok())
            .find(|o| o.command.id == envelope.command_id);
        match decided {
            Some(outcome) if outcome.rejection().is_none() => Ok(()),
            Some(outcome) => panic!("the allocation on w2 was rejected: {:?}", outcome.rejection()),
            None => Err(format!("{} outcomes, none of it", outcomes.len())),
        }
    })
    .await;
    stop.cancel();
    worker.await.expect("the worker task");

    let mut file = Vec::new();
    leasehold_log::export::export(&log, None, leasehold_domain::DECIDER_VERSION, "browser tests", &mut file, |_| {})
        .await
        .expect("export the seeded log");
    leasehold_log::export::import(&file[..], data).await.expect("import it into the data directory");
    format!("w2.{volume}")
}

/// A `serve` of the embedded log in `dir/data` on 127.0.0.1, with agent `w1` (a dir driver) in it; the command
/// line talks to it with `token` when it has one.
struct Served {
    serve: Proc,
    server: String,
    dir: PathBuf,
    token: Option<&'static str>,
}

impl Served {
    async fn start(dir: &Path, extra: &[&str], token: Option<&'static str>) -> Served {
        let data = dir.join("data").display().to_string();
        let agent = format!("w1=dir:{}", dir.join("w1").display());
        let partitions = PARTITIONS.to_string();
        let mut args =
            vec!["serve", "--data", &data, "--partitions", &partitions, "--listen", "127.0.0.1:0", "--agent", &agent];
        args.extend_from_slice(extra);
        let mut serve = Proc::spawn(dir, "serve", &args);
        let server = serve.ready().await;
        let served = Served { serve, server, dir: dir.to_owned(), token };
        until("w1 live", async || {
            let agents = served.json(&["agents"]).await;
            let w1 = agents.as_array().and_then(|a| a.iter().find(|a| a["name"] == "w1").cloned());
            match w1 {
                Some(w1) if w1["status"] == "live" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        served
    }

    /// `leasehold --server SERVER ARGS`; fails the test unless it exits 0.
    async fn cli(&self, args: &[&str]) -> Ran {
        let mut argv = vec!["--server", self.server.as_str()];
        argv.extend_from_slice(args);
        let env: Vec<(&str, &str)> = self.token.iter().map(|t| ("LEASEHOLD_TOKEN", *t)).collect();
        let ran = run_cli(&self.dir, &argv, &env).await;
        assert_eq!(ran.code, Some(0), "leasehold {args:?}: {ran:?}\n{}", self.serve.tail());
        ran
    }

    /// `leasehold --output json ARGS`, parsed.
    async fn json(&self, args: &[&str]) -> Value {
        let mut argv = vec!["--output", "json"];
        argv.extend_from_slice(args);
        let ran = self.cli(&argv).await;
        serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {ran:?}"))
    }

    /// Allocates a `kind` on w1 (with `extra` flags) and waits until it is active; its record.
    async fn active(&self, kind: &str, extra: &[&str]) -> Value {
        let mut args = vec!["allocate", "--agent", "w1", "--kind", kind];
        args.extend_from_slice(extra);
        let reference = self.cli(&args).await.stdout.trim().to_owned();
        until(&format!("{reference} active"), async || {
            let record = self.json(&["get", &reference]).await;
            if record["state"] == "active" { Ok(record) } else { Err(record.to_string()) }
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }
}

/// What the pages are tested on: the seeded log (a volume stuck pending on the stalled `w2`) with a `serve` going on
/// with it, a pool `net` (10.9.0.0/30) one address of which a container on w1 holds, and a volume on w1 allocated by
/// [`ISSUER`] whose lease [`HOLDER`] holds.
struct World {
    served: Served,
    /// The volume stuck pending on w2.
    stuck: String,
    /// The container holding an address of `net`, and the address.
    pooled: String,
    address: String,
    /// The leased volume, its allocation's command id, and the lease.
    volume: String,
    allocation: String,
    lease: String,
}

impl World {
    async fn start(dir: &Path) -> World {
        let stuck = seed_stuck(&dir.join("data"), &dir.join("w2")).await;
        let served = Served::start(dir, &[], None).await;
        served.cli(&["pool", "define", "net", "--ipv4", "10.9.0.0/30"]).await;
        let container = served.active("container", &["--pool", "net"]).await;
        let pooled = container["ref"].as_str().expect("a reference").to_owned();
        let address = container["claims"][0]["id"].as_str().unwrap_or_else(|| panic!("an address: {container}"));
        let address = address.to_owned();
        let allocation = leasehold_schemas::CommandId::generate().to_string();
        let volume = served.active("volume", &["--command-id", &allocation, "--issuer", ISSUER]).await;
        let volume = volume["ref"].as_str().expect("a reference").to_owned();
        let lease = served.json(&["acquire", &volume, "--holder", HOLDER, "--ttl", "1h"]).await;
        let lease = lease["id"].as_str().unwrap_or_else(|| panic!("a lease id: {lease}")).to_owned();
        World { served, stuck, pooled, address, volume, allocation, lease }
    }

    fn url(&self, path: &str) -> String {
        self.served.url(path)
    }
}

/// The percent-encoding of a path segment or query value, as the pages' links carry it: everything but
/// `A-Z a-z 0-9 - . _ ~` as `%XX`.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn temporary_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("lh-e2e-browser-").tempdir().expect("a temporary directory")
}

// ---------------------------------------------------------------------------------------------------------------
// The tests.

/// The overview, agents and pools pages: what is stuck and what it waits on, each agent's health, who holds an
/// address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_agents_and_pools_pages_show_what_is_stuck_and_who_holds_what() {
    let dir = temporary_dir();
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let world = World::start(dir.path()).await;
    let stuck = world.stuck.as_str();

    let text =
        browser.open(&world.url("/ui"), &["Stuck", stuck, "waiting for w2 to create it", "w2 last heard from"]).await;
    browser.titled("Overview").await;
    let row = browser.text_of("tr", stuck).await.unwrap_or_else(|| panic!("no row of {stuck}:\n{text}"));
    assert!(row.contains("waiting for w2 to create it") && row.contains("stalled"), "the stuck row: {row}");
    let pools = browser.text_of("tr", "net").await.unwrap_or_else(|| panic!("no row of pool net:\n{text}"));
    assert!(pools.contains('1'), "net holds one address: {pools}");
    browser.screenshot("overview").await;

    browser.open(&world.url("/ui/agents"), &["w1", "w2"]).await;
    browser.titled("Agents").await;
    let w2 = browser.text_of("tr", "w2").await.expect("a row of w2");
    assert!(w2.contains("stalled"), "{w2}");
    let w1 = browser.text_of("tr", "w1").await.expect("a row of w1");
    assert!(w1.contains("live"), "{w1}");
    browser.screenshot("agents").await;

    browser.open(&world.url("/ui/agents/w2"), &["Health", "stalled", stuck]).await;
    browser.titled("Agent w2").await;
    browser.screenshot("agent").await;

    browser.open(&world.url("/ui/pools"), &["net", "10.9.0.0/30"]).await;
    browser.titled("Pools").await;
    browser.screenshot("pools").await;

    browser.open(&world.url("/ui/pools/net"), &["Held", &world.address, &world.pooled]).await;
    browser.titled("Pool net").await;
    let held = browser.text_of("tr", &world.address).await.expect("a row of the address");
    assert!(held.contains(&world.pooled), "the address's holder: {held}");
    browser.screenshot("pool").await;
    browser.stop().await;
}

/// The resources, resource, lease and command pages: what a resource waits on; a holder and an issuer that look like
/// markup show as text and run nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resource_pages_show_what_waits_and_outside_text_as_text() {
    let dir = temporary_dir();
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let world = World::start(dir.path()).await;
    let (stuck, volume, lease) = (world.stuck.as_str(), world.volume.as_str(), world.lease.as_str());

    browser.open(&world.url("/ui/resources"), &[stuck, volume, &world.pooled]).await;
    browser.titled("Resources").await;
    let row = browser.text_of("tr", stuck).await.expect("a row of the stuck volume");
    assert!(row.contains("waiting for w2 to create it"), "{row}");
    browser.shows_as_text("/ui/resources", HOLDER).await;
    browser.screenshot("resources").await;

    // Filtered by the holder: the query value comes back in the form as a value, not as markup.
    browser.open(&world.url(&format!("/ui/resources?holder={}", encode(HOLDER))), &[volume]).await;
    let text = browser.text().await;
    assert!(!text.contains(stuck), "only what the holder holds:\n{text}");
    let field = browser.script("return document.querySelector('input[name=holder]').value").await;
    assert_eq!(field, HOLDER, "the filter's field holds the holder as given");
    browser.shows_as_text("/ui/resources?holder=", HOLDER).await;

    browser
        .open(&world.url(&format!("/ui/resources/{}", encode(stuck))), &["waiting for w2 to create it", "pending"])
        .await;
    browser.titled(&format!("Resource {stuck}")).await;
    browser.screenshot("resource").await;

    browser.open(&world.url(&format!("/ui/resources/{}", encode(volume))), &["Leases", lease, "active"]).await;
    browser.shows_as_text("a resource's page", HOLDER).await;
    browser.screenshot("resource-leased").await;

    browser.open(&world.url(&format!("/ui/leases/{}", encode(lease))), &["Holder", volume, "active"]).await;
    browser.shows_as_text("a lease's page", HOLDER).await;
    browser.screenshot("lease").await;

    browser.open(&world.url(&format!("/ui/commands/{}", world.allocation)), &["Issuer", "accepted", volume]).await;
    browser.titled(&format!("Command {}", world.allocation)).await;
    browser.shows_as_text("a command's page", ISSUER).await;
    browser.screenshot("command").await;
    browser.stop().await;
}

/// The live feed adds a command decided after the page opened, its issuer (markup-like) as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_feed_shows_a_command_decided_after_the_page_opened() {
    let dir = temporary_dir();
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let served = Served::start(dir.path(), &[], None).await;
    let volume = served.active("volume", &[]).await;
    let volume = volume["ref"].as_str().expect("a reference").to_owned();

    browser.open(&served.url("/ui/feed"), &["Following:", &volume]).await;
    browser.titled("Live feed").await;
    let before = browser.script("return document.querySelectorAll('#feed li').length").await;
    assert!(browser.text_of("#feed li", ISSUER).await.is_none(), "nothing of the issuer before the command");

    let lease = served.json(&["--issuer", ISSUER, "acquire", &volume, "--holder", HOLDER, "--ttl", "1h"]).await;
    let lease = lease["id"].as_str().unwrap_or_else(|| panic!("a lease id: {lease}")).to_owned();
    let line = until("the acquisition in the feed", async || {
        let line = browser.text_of("#feed li.new", &lease).await;
        line.ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert!(line.contains("op.acquire") && line.contains(ISSUER) && line.contains("accepted"), "{line}");
    let after = browser.script("return document.querySelectorAll('#feed li').length").await;
    assert!(after.as_u64() > before.as_u64(), "{before} lines before, {after} after");
    browser.shows_as_text("the live feed", ISSUER).await;
    browser.screenshot("feed").await;
    browser.stop().await;
}

/// With `--tokens`, the view sends a browser to its login page; a wrong token is refused there (no cookie, still
/// not let in), the right one opens the overview with a session cookie the page's script cannot read, and logging
/// out ends it. The token never shows in an address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_takes_the_right_token_at_its_login_and_refuses_a_wrong_one() {
    let dir = temporary_dir();
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("op:alice {TOKEN}\n")).expect("write the token file");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod 600");
    let tokens = tokens.display().to_string();
    let served = Served::start(dir.path(), &["--tokens", &tokens], Some(TOKEN)).await;
    let at = async || browser.client.current_url().await.expect("the address");

    browser.open(&served.url("/ui"), &["Token"]).await;
    browser.titled("Log in").await;
    let url = at().await;
    assert_eq!((url.path(), url.query()), ("/ui/login", Some("next=%2Fui")), "{url}");
    browser.screenshot("login").await;

    let log_in = async |token: &str| {
        let field = browser.client.find(fantoccini::Locator::Css("#token")).await.expect("the token field");
        field.send_keys(token).await.expect("type the token");
        let button = browser.client.find(fantoccini::Locator::Css("form.login button[type=submit]")).await;
        button.expect("the login button").click().await.expect("press it");
    };
    log_in("e2e-browser-alice-0123456789abcdeF").await;
    browser.expect("the login page", &["That token is not one this gateway knows"]).await;
    browser.titled("Log in").await;
    let url = at().await;
    assert_eq!(url.path(), "/ui/login", "{url}");
    assert!(!url.as_str().contains("0123456789"), "a token in the address: {url}");
    let cookies = browser.client.get_all_cookies().await.expect("the cookies");
    assert!(cookies.is_empty(), "a refused login sets no cookie: {cookies:?}");
    browser.open(&served.url("/ui/agents"), &["Token"]).await;
    assert_eq!(at().await.path(), "/ui/login", "still not let in");

    log_in(TOKEN).await;
    browser.expect("the agents page after the login", &["w1", "Log out"]).await;
    browser.titled("Agents").await;
    let url = at().await;
    assert_eq!(url.path(), "/ui/agents", "back where it was going: {url}");
    assert!(!url.as_str().contains(TOKEN), "the token in the address: {url}");
    let cookies = browser.client.get_all_cookies().await.expect("the cookies");
    assert!(cookies.len() == 1 && cookies[0].http_only() == Some(true), "one HttpOnly session cookie: {cookies:?}");
    assert!(!cookies[0].value().contains(TOKEN), "the cookie is a session, not the token: {cookies:?}");
    let seen = browser.script("return document.cookie").await;
    assert_eq!(seen, "", "the page's script cannot read the session");
    browser.open(&served.url("/ui"), &["Overview", "op:alice"]).await;
    browser.screenshot("logged-in").await;

    let button = browser.client.find(fantoccini::Locator::XPath("//button[normalize-space()='Log out']")).await;
    button.expect("the logout button").click().await.expect("press it");
    browser.expect("the login page after logging out", &["Token"]).await;
    browser.open(&served.url("/ui"), &["Token"]).await;
    assert_eq!(at().await.path(), "/ui/login", "logged out: {}", at().await);
    browser.stop().await;
}

/// One resource's timeline: the leased volume's page lists its allocation (by its markup-like issuer, shown as text)
/// and the lease's grant, oldest first, each linking to its command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_page_shows_its_timeline() {
    let dir = temporary_dir();
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let world = World::start(dir.path()).await;
    let page = format!("/ui/resources/{}", encode(&world.volume));

    browser.open(&world.url(&page), &["Timeline", "op.allocate", "op.acquire"]).await;
    let allocated = browser.text_of("#timeline li", "op.allocate").await.expect("the allocation's step");
    assert!(allocated.contains(ISSUER) && allocated.contains("accepted"), "{allocated}");
    let acquired = browser.text_of("#timeline li", "op.acquire").await.expect("the acquisition's step");
    assert!(acquired.contains("accepted"), "{acquired}");
    let order = browser
        .script(
            "const steps = Array.from(document.querySelectorAll('#timeline li'), li => li.innerText); \
             return [steps.findIndex(t => t.includes('op.allocate')), steps.findIndex(t => t.includes('op.acquire'))]",
        )
        .await;
    assert!(order[0].as_i64() < order[1].as_i64(), "oldest first: {order}");
    let link = format!("/ui/commands/{}", world.allocation);
    let links = browser
        .script("return Array.from(document.querySelectorAll('#timeline a'), a => a.getAttribute('href'))")
        .await;
    assert!(links.as_array().is_some_and(|l| l.iter().any(|h| h == &Value::from(link.as_str()))), "{links}");
    browser.shows_as_text("a resource's timeline", ISSUER).await;
    browser.screenshot("resource-timeline").await;
    browser.stop().await;
}
