//! What the modules share: a spawned process of the `leasehold-e2e` binary (`serve`, `agent run`), its output in
//! files of the test's directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// How long a process may take to say where it listens, or to exit once asked to.
const STEP: Duration = Duration::from_secs(30);
/// How often a process is looked at again.
const POLL: Duration = Duration::from_millis(20);
/// The lines of its log a failing test's message shows (`tail`).
const TAIL: usize = 40;

/// A process of the `leasehold-e2e` binary, its stdout and stderr in the files `NAME.out` and `NAME.err` of the
/// test's directory (where it runs). Dropping it kills it if it still runs (its own pid only).
#[derive(Debug)]
pub(crate) struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Starts `leasehold-e2e ARGS` in `dir` (`RUST_LOG=info`, no colours).
    pub(crate) fn spawn(dir: &Path, name: &str, args: &[&str]) -> Proc {
        let (stdout, stderr) = (dir.join(format!("{name}.out")), dir.join(format!("{name}.err")));
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold-e2e"))
            .args(args)
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("a stdout file"))
            .stderr(File::create(&stderr).expect("a stderr file"))
            .spawn()
            .expect("start leasehold-e2e");
        Proc { name: name.to_owned(), child, stdout, stderr, exited: None }
    }

    /// How it exited, once the test saw it exit (killed, or stopped).
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        self.exited
    }

    /// All it printed so far.
    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// All it logged so far (stderr), without colours.
    pub(crate) fn log(&self) -> String {
        without_colours(&std::fs::read_to_string(&self.stderr).unwrap_or_default())
    }

    /// Its stdout and the last lines of its log, for a failing test's message.
    pub(crate) fn tail(&self) -> String {
        self.report(Some(TAIL))
    }

    /// Its stdout and its whole log, for a failing test's message.
    pub(crate) fn output(&self) -> String {
        self.report(None)
    }

    fn report(&self, last: Option<usize>) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let (from, what) = match last {
            Some(n) => (lines.len().saturating_sub(n), "log (last lines)"),
            None => (0, "log"),
        };
        format!(
            "--- {} ({:?}) stdout:\n{}--- {} {what}:\n{}\n",
            self.name,
            self.exited,
            self.stdout(),
            self.name,
            lines[from..].join("\n")
        )
    }

    /// Fails the test, with its stdout and the last lines of its log, unless it still runs.
    pub(crate) fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("ask whether the process runs") {
            self.exited = Some(status);
            panic!("{} exited with {status}\n{}", self.name, self.tail());
        }
    }

    /// Fails the test, saying what it was doing and with the whole output, unless it still runs.
    pub(crate) fn assert_running_while(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().expect("ask whether the process runs") {
            self.exited = Some(status);
            panic!("{what}: {} exited with {status}\n{}", self.name, self.output());
        }
    }

    /// The `http://...` address it printed it listens on (`listening on http://...`).
    pub(crate) async fn address(&mut self) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(address) = self
                .stdout()
                .lines()
                .filter(|l| l.contains("listening on http://"))
                .find_map(|l| l.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_owned))
            {
                return address;
            }
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "{} did not say where it listens in {STEP:?}\n{}",
                self.name,
                self.tail()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The `http://...` address it listens on, once its `/readyz` answers 200 (every role of the process is ready:
    /// a gateway takes commands), at most [`STEP`].
    pub(crate) async fn ready(&mut self) -> String {
        let address = self.address().await;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("an HTTP client");
        let deadline = Instant::now() + STEP;
        loop {
            let answer = match http.get(format!("{address}/readyz")).send().await {
                Ok(response) if response.status() == reqwest::StatusCode::OK => return address,
                Ok(response) => format!("{}: {}", response.status(), response.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            self.assert_running();
            assert!(Instant::now() < deadline, "{} was not ready in {STEP:?}: {answer}\n{}", self.name, self.tail());
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until it exits, at most `limit`: how it exited and how long that took.
    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("ask whether the process runs") {
                self.exited = Some(status);
                return (status, started.elapsed());
            }
            assert!(started.elapsed() < limit, "{} did not exit in {limit:?}\n{}", self.name, self.output());
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL (`Child::kill` signals exactly this process), then reaps it.
    pub(crate) fn kill9(&mut self) {
        self.assert_running();
        self.child.kill().expect("kill -9");
        self.exited = Some(self.child.wait().expect("reap the process"));
    }

    /// SIGSTOP, by its pid: it is frozen (a machine that hangs) until [`Proc::resume`].
    pub(crate) fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT, by its pid.
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGINT, by its pid: what Ctrl-C sends.
    pub(crate) fn interrupt(&self) {
        self.signal("-INT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args([signal, &pid]).stdin(Stdio::null()).status().expect("run kill");
        assert!(sent.success(), "kill {signal} {pid}: {sent}");
    }

    /// SIGTERM, by its pid.
    pub(crate) fn signal_term(&mut self) {
        self.assert_running();
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).stdin(Stdio::null()).status().expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}: {sent}");
    }

    /// Waits until it exits (it was asked to), at most [`STEP`]: exit 0, and its stdout has the line saying it
    /// stopped (`leasehold serve: stopped`, or `agent NAME: stopped` of an `agent run` named as the process).
    pub(crate) async fn wait_clean_exit(&mut self) {
        let deadline = Instant::now() + STEP;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("ask whether the process runs") {
                self.exited = Some(status);
                break status;
            }
            assert!(Instant::now() < deadline, "{} did not stop on SIGTERM in {STEP:?}\n{}", self.name, self.tail());
            tokio::time::sleep(POLL).await;
        };
        assert!(status.success(), "{} exited with {status} on SIGTERM\n{}", self.name, self.tail());
        let agent_stopped = format!("agent {}: stopped", self.name);
        assert!(
            self.stdout().lines().any(|l| l == "leasehold serve: stopped" || l == agent_stopped),
            "{} did not say it stopped\n{}",
            self.name,
            self.tail()
        );
    }

    /// SIGTERM, then a clean exit ([`Proc::wait_clean_exit`]).
    pub(crate) async fn stop_cleanly(&mut self) {
        self.signal_term();
        self.wait_clean_exit().await;
    }

    /// Fails the test if its log says something panicked.
    pub(crate) fn assert_no_panic(&self) {
        assert!(!self.log().contains("panicked"), "{}: something panicked\n{}", self.name, self.tail());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How a command-line run (`leasehold-e2e ARGS`) ended: its exit code, stdout and stderr.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `leasehold-e2e ARGS` in `dir` to its end (at most [`STEP`]) with `env` added to the environment and
/// `LEASEHOLD_TOKEN` removed from it unless `env` sets it.
pub(crate) async fn run_cli(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Ran {
    run_bin(env!("CARGO_BIN_EXE_leasehold-e2e"), dir, args, env, STEP).await
}

/// Runs `leasehold-e2e --server SERVER ARGS` in `dir` as [`run_cli`] does, as a future that owns what it needs (so it
/// may be spawned while the test goes on).
pub(crate) fn run_cli_on(dir: &Path, server: &str, args: &[&str]) -> impl Future<Output = Ran> + Send + use<> {
    let dir = dir.to_owned();
    let args: Vec<String> = ["--server", server].iter().chain(args).map(|a| (*a).to_owned()).collect();
    async move { run_cli(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await }
}

/// Runs `leasehold-replay-e2e ARGS` (the audit tool) in `dir` to its end, at most `limit`.
pub(crate) async fn run_replay(dir: &Path, args: &[&str], limit: Duration) -> Ran {
    run_bin(env!("CARGO_BIN_EXE_leasehold-replay-e2e"), dir, args, &[], limit).await
}

async fn run_bin(bin: &str, dir: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Ran {
    let mut command = tokio::process::Command::new(bin);
    command.args(args).current_dir(dir).env_remove("LEASEHOLD_TOKEN").env("NO_COLOR", "1").stdin(Stdio::null());
    command.envs(env.iter().copied()).kill_on_drop(true);
    let output = tokio::time::timeout(limit, command.output())
        .await
        .unwrap_or_else(|_| panic!("{bin} {args:?} did not end in {limit:?}"))
        .expect("run the command line");
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The processes' `tail`s, for a failing test's message.
pub(crate) fn logs<'a>(processes: impl Iterator<Item = &'a Proc>) -> String {
    processes.map(Proc::tail).collect::<Vec<_>>().join("\n")
}

/// Log lines without ANSI colour sequences (`ESC [ ... letter`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// True for an outcome of the policy a `serve` process seeds a log without one with (`op.set-partition-settings`
/// issued by `serve:<name>`, one per partition, at start): the log's, not the test's, so checks of "every outcome
/// answers a command the test published" leave them out.
pub(crate) fn seeded_by_serve(stored: &leasehold_log::StoredOutcome) -> bool {
    leasehold_schemas::codec::decode_outcome(&stored.payload).is_ok_and(|outcome| {
        outcome.command.type_name == "op.set-partition-settings"
            && outcome.command.issuer.as_str().starts_with("serve:")
    })
}
