//! The operator's view (`/ui`) in a real browser: Debian's headless Chromium, driven through chromedriver by
//! WebDriver (fantoccini), against a real `serve` with data in it.
//!
//! - The pages: a log whose first outcomes are five minutes old (an agent `w2` registered, went down, and a volume
//!   was allocated on it) is restored into a data directory; `serve` runs on it with an agent `w1` of its own, and the
//!   command line adds a pool with a held address and a lease whose holder is `<script>...</script>`, U+202E and more
//!   text. The overview lists the volume as stuck, saying what it waits on; the resources, resource, lease, command,
//!   agents, agent, pools and pool pages each show what they must (what a resource waits on, who holds an address);
//!   the holder shows as literal text in an isolated `<bdi>` and runs nothing.
//! - The live feed (`/ui/feed`) shows a command decided after the page opened, with the same holder as text.
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
/// The browser window's width; screenshots are as tall as the page (up to [`MAX_SHOT_HEIGHT`]).
const WIDTH: u32 = 1280;
const MAX_SHOT_HEIGHT: u32 = 4000;

// ---------------------------------------------------------------------------------------------------------------
// The browser.

/// Headless Chromium with its own temporary profile, listening for DevTools on 127.0.0.1 only, and a chromedriver
/// attached to it; both are stopped by their pids (each its own process group) when this is dropped.
struct Browser {
    client: Client,
    chromium: Child,
    driver: Child,
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
fn spawn_group(dir: &Path, name: &str, program: &Path, args: &[String]) -> (Child, PathBuf) {
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
    (child, out)
}

/// Asks `check` until it answers something, at most [`STEP`]; fails the test saying what was awaited and what
/// `last` says of the last look.
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
            format!("--window-size={WIDTH},900"),
            "about:blank".to_owned(),
        ])
        .collect::<Vec<_>>();
        let (mut chromium, _) = spawn_group(dir, "chromium", &chromium, &args);
        // Chromium writes the port it listens on (its DevTools) into the profile once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let devtools = until("chromium's DevToolsActivePort", async || {
            if let Some(status) = chromium.try_wait().expect("ask whether chromium runs") {
                panic!("chromium exited with {status}: {}", read(&dir.join("chromium.err")));
            }
            let text = std::fs::read_to_string(&port_file).map_err(|e| e.to_string())?;
            text.lines().next().and_then(|l| l.trim().parse::<u16>().ok()).ok_or(text)
        })
        .await;
        let (mut driver, driver_out) =
            spawn_group(dir, "chromedriver", &chromedriver, &["--port=0".to_owned(), "--log-level=WARNING".to_owned()]);
        let driver_port = until("chromedriver's port", async || {
            if let Some(status) = driver.try_wait().expect("ask whether chromedriver runs") {
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
        Some(Browser { client, chromium, driver, _profile: profile, shots })
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

    /// Fails the test unless the page shows [`HOLDER`] as literal text in one `<bdi>`, and nothing of it ran: no
    /// `window.__xss`, no element the holder names, no script but the UI's own.
    async fn holder_is_text(&self, page: &str) {
        let isolated = self.isolated().await;
        assert!(
            isolated.iter().any(|t| t == HOLDER),
            "{page}: the holder is not one <bdi> of literal text: {isolated:?}"
        );
        let ran = self
            .script(
                "return { xss: typeof window.__xss, images: document.images.length, \
                 scripts: Array.from(document.scripts, s => s.getAttribute('src')) }",
            )
            .await;
        assert_eq!(ran["xss"], "undefined", "{page}: the holder's script ran: {ran}");
        assert_eq!(ran["images"], 0, "{page}: the holder's <img> became an element: {ran}");
        assert_eq!(ran["scripts"], json!(["/ui/assets/app.js"]), "{page}: scripts other than the UI's: {ran}");
    }

    /// Saves the page as `NAME.png` in the screenshots directory, the window as tall as the page.
    async fn screenshot(&self, name: &str) {
        let height = self.script("return document.documentElement.scrollHeight").await.as_u64().unwrap_or(900);
        let height = u32::try_from(height).unwrap_or(MAX_SHOT_HEIGHT).clamp(600, MAX_SHOT_HEIGHT);
        self.client.set_window_size(WIDTH, height).await.expect("resize the window");
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("a screenshot of {name}: {e}"));
        assert!(png.starts_with(b"\x89PNG"), "{name}: the screenshot is not a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.client.set_window_size(WIDTH, 900).await.expect("resize the window back");
    }

    /// Ends the WebDriver session, then stops chromedriver and Chromium.
    async fn stop(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        for child in [&mut self.driver, &mut self.chromium] {
            if matches!(child.try_wait(), Ok(None)) {
                // The group's id is the leader's pid: its helpers (Chromium's renderers) go with it.
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).stdin(Stdio::null()).status();
                let _ = child.wait();
            }
        }
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

/// A `serve` of the embedded log in `dir/data` on 127.0.0.1, with agent `w1` (a dir driver) in it.
struct Served {
    serve: Proc,
    server: String,
    dir: PathBuf,
}

impl Served {
    async fn start(dir: &Path, extra: &[&str]) -> Served {
        let data = dir.join("data").display().to_string();
        let agent = format!("w1=dir:{}", dir.join("w1").display());
        let partitions = PARTITIONS.to_string();
        let mut args =
            vec!["serve", "--data", &data, "--partitions", &partitions, "--listen", "127.0.0.1:0", "--agent", &agent];
        args.extend_from_slice(extra);
        let mut serve = Proc::spawn(dir, "serve", &args);
        let server = serve.ready().await;
        let served = Served { serve, server, dir: dir.to_owned() };
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

    /// `leasehold --server SERVER ARGS` (with `env`); fails the test unless it exits 0.
    async fn cli_with(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let mut argv = vec!["--server", self.server.as_str()];
        argv.extend_from_slice(args);
        let ran = run_cli(&self.dir, &argv, env).await;
        assert_eq!(ran.code, Some(0), "leasehold {args:?}: {ran:?}\n{}", self.serve.tail());
        ran
    }

    async fn cli(&self, args: &[&str]) -> Ran {
        self.cli_with(args, &[]).await
    }

    /// `leasehold --output json ARGS`, parsed.
    async fn json(&self, args: &[&str]) -> Value {
        let mut argv = vec!["--output", "json"];
        argv.extend_from_slice(args);
        let ran = self.cli(&argv).await;
        serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {ran:?}"))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
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

// ---------------------------------------------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_what_is_stuck_and_why_in_a_real_browser() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-browser-").tempdir().expect("a temporary directory");
    let Some(browser) = Browser::start(dir.path()).await else { return };
    let stuck = seed_stuck(&dir.path().join("data"), &dir.path().join("w2")).await;
    let served = Served::start(dir.path(), &[]).await;

    let text = browser.open(&served.url("/ui"), &["Stuck", &stuck, "waiting for w2 to create it"]).await;
    assert!(text.contains("w2 last heard from"), "the overview says when w2 was last heard from:\n{text}");
    let title = browser.client.title().await.expect("the page's title");
    assert!(title.contains("Overview"), "{title}");
    browser.screenshot("overview").await;
    browser.stop().await;
    drop(served);
}
