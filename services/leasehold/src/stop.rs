//! How `serve` and `agent run` stop. The first SIGINT or SIGTERM begins a clean stop (the HTTP server stops taking
//! requests, each writer finishes the command in hand and gives its partition back, agents finish their calls and
//! send what they have); whatever the log or a driver is doing, the process exits within `--shutdown-grace`, saying
//! on stderr what it could not finish (exit status 1); a second signal exits at once (status 130).
//!
//! Exiting with work unfinished is safe by design: a writer's appends carry the fence, so a writer that is gone can
//! append nothing; a partition's cursor is in the log, and the commands whose outcomes did not land are decided again
//! by the partition's next owner; the projector and the sweeper resume from the log; an agent observes again at its
//! next pass what it had not reported. The process exits rather than wait on anything: a call to a NATS server that
//! is gone retries for as long as its client reconnects, and a runtime waits for its blocking tasks; a watchdog thread
//! started at the first signal ends the process even if a runtime thread itself is stuck.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The exit status of a stop cut short by its grace.
pub(crate) const EXIT_CUT_SHORT: i32 = 1;
/// The exit status of a second signal (128 + SIGINT, as shells report an interrupted command).
pub(crate) const EXIT_SECOND_SIGNAL: i32 = 130;

/// The `--shutdown-grace` flag of `serve` and `agent run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct GraceArgs {
    /// After SIGINT or SIGTERM, how long the clean stop may take (writers give their partitions back, agents finish
    /// their calls); past it the process exits anyway, status 1, saying on stderr what it could not finish. A
    /// second signal exits at once (status 130).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) shutdown_grace: Duration,
}

/// How long past its grace a stop may take before the watchdog thread ends the process: for a runtime thread that
/// is stuck itself (a blocking call in a drop, a disk that hangs), where [`within_grace`] cannot run.
const WATCHDOG_AFTER_GRACE: Duration = Duration::from_secs(2);

/// Cancels `shutdown` at the first SIGINT or SIGTERM (and starts a watchdog thread that exits the process, status 1,
/// if it still runs [`WATCHDOG_AFTER_GRACE`] past the grace); exits the process at the second, saying on stderr what
/// it had not finished (`unfinished`).
pub(crate) async fn on_signals(
    shutdown: CancellationToken,
    program: &'static str,
    grace: Duration,
    unfinished: impl Fn() -> Vec<String> + Send + Sync + 'static,
) {
    let unfinished = Arc::new(unfinished);
    use tokio::signal::unix::{SignalKind, signal};
    let (mut interrupt, mut terminate) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(e), _) | (_, Err(e)) => {
            // Without our handlers the signals keep their default action: the process ends at once.
            eprintln!("{program}: cannot listen for SIGINT and SIGTERM ({e}): a signal ends the process at once");
            return;
        }
    };
    let mut signals = 0;
    loop {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        signals += 1;
        if signals == 1 {
            println!("leasehold: stopping");
            eprintln!(
                "{program}: stopping within {} (--shutdown-grace); a second signal exits at once",
                humantime::format_duration(grace)
            );
            shutdown.cancel();
            let unfinished = unfinished.clone();
            let watchdog = std::thread::Builder::new().name("shutdown-watchdog".to_owned()).spawn(move || {
                std::thread::sleep(grace + WATCHDOG_AFTER_GRACE);
                exit_cut_short(program, grace, &unfinished())
            });
            if let Err(e) = watchdog {
                eprintln!(
                    "{program}: cannot start the shutdown watchdog ({e}); the grace is kept by the runtime alone"
                );
            }
        } else {
            let what = format!("a second signal: exiting now (status {EXIT_SECOND_SIGNAL})");
            eprintln!("{}", unfinished_message(program, &what, &unfinished()));
            exit(EXIT_SECOND_SIGNAL);
        }
    }
}

/// Why what was not finished is safe, for the messages of a stop cut short.
const SAFE: &str = "the fence refuses any append of a writer that is gone, each partition's cursor is in the log \
                    and the commands whose outcomes did not land are decided again by its next owner, read models and \
                    sweepers resume from the log, and an agent observes again at its next pass what it had not \
                    reported";

/// The stop ran past its grace, leaving what [`within_grace`] was told was unfinished then.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct GraceRanOut(pub(crate) Vec<String>);

/// Runs `work` to its end, but once `shutdown` is cancelled, for at most `grace` more. When the grace runs out,
/// `unfinished` says what was not finished, before `work` is dropped (which ends its tasks).
pub(crate) async fn within_grace<T>(
    work: impl Future<Output = T>,
    shutdown: &CancellationToken,
    grace: Duration,
    unfinished: impl FnOnce() -> Vec<String>,
) -> Result<T, GraceRanOut> {
    tokio::pin!(work);
    tokio::select! {
        done = &mut work => return Ok(done),
        () = shutdown.cancelled() => {}
    }
    match tokio::time::timeout(grace, &mut work).await {
        Ok(done) => Ok(done),
        Err(_) => Err(GraceRanOut(unfinished())),
    }
}

/// Says on stderr what a stop cut short by its grace left unfinished, and why that is safe, and exits the process
/// (status [`EXIT_CUT_SHORT`]) without waiting on anything more.
pub(crate) fn exit_cut_short(program: &str, grace: Duration, unfinished: &[String]) -> ! {
    let what = format!(
        "the stop did not finish within --shutdown-grace {}; exiting (status {EXIT_CUT_SHORT})",
        humantime::format_duration(grace)
    );
    eprintln!("{}", unfinished_message(program, &what, unfinished));
    exit(EXIT_CUT_SHORT)
}

/// `PROGRAM: WHAT without finishing:`, one line per unfinished task, and why that is safe.
fn unfinished_message(program: &str, what: &str, unfinished: &[String]) -> String {
    let mut message = format!("{program}: {what} without finishing:");
    if unfinished.is_empty() {
        message.push_str("\n  - closing the log and the process's last tasks");
    }
    for task in unfinished {
        message.push_str("\n  - ");
        message.push_str(task);
    }
    message.push_str("\nThis is safe: ");
    message.push_str(SAFE);
    message.push('.');
    message
}

/// Exits the process now, with what it printed flushed.
fn exit(status: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(status)
}

/// What a running task can say of what it has not finished (`None`: nothing worth naming).
pub(crate) type Detail = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The tasks of a process still running, by name (`worker`, `projector`, `agent w1`...), each with what it can say
/// of its unfinished work: what a stop cut short names.
#[derive(Clone, Default)]
pub(crate) struct Running(Arc<Mutex<BTreeMap<String, Option<Detail>>>>);

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Running").field(&self.lock().keys().collect::<Vec<_>>()).finish()
    }
}

impl Running {
    /// Spawns `task` on `tasks` under `name`, listed until it ends (or is dropped).
    pub(crate) fn spawn(
        &self,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
        name: impl Into<String>,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        self.spawn_with(tasks, name, None, task);
    }

    /// [`Running::spawn`], with what the task can say of its unfinished work.
    pub(crate) fn spawn_with(
        &self,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
        name: impl Into<String>,
        detail: Option<Detail>,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let name = name.into();
        self.lock().insert(name.clone(), detail);
        let listed = Listed { running: self.clone(), name };
        tasks.spawn(async move {
            let _listed = listed;
            task.await
        });
    }

    /// The tasks still running, sorted, each as `name` or `name: what it has not finished`.
    pub(crate) fn unfinished(&self) -> Vec<String> {
        let details: Vec<(String, Option<Detail>)> = self.lock().iter().map(|(n, d)| (n.clone(), d.clone())).collect();
        details
            .into_iter()
            .map(|(name, detail)| match detail.and_then(|detail| detail()) {
                Some(detail) => format!("{name}: {detail}"),
                None => name,
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<Detail>>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A task's entry in [`Running`], for as long as the task lives.
struct Listed {
    running: Running,
    name: String,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.running.lock().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_grace_runs_from_the_stop_and_cuts_a_hung_stop_short() {
        let shutdown = CancellationToken::new();
        // Work that ends on its own is not cut, however long it takes before the stop.
        let ends =
            within_grace(tokio::time::sleep(Duration::from_secs(3600)), &shutdown, Duration::from_secs(1), || {
                vec!["never asked".to_owned()]
            });
        assert_eq!(ends.await, Ok(()));
        // Work that never ends after the stop is cut at the grace, counted from the stop.
        let started = tokio::time::Instant::now();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.cancel();
        });
        let hung = within_grace(std::future::pending::<()>(), &shutdown, Duration::from_secs(10), || {
            vec!["worker".to_owned()]
        });
        assert_eq!(hung.await, Err(GraceRanOut(vec!["worker".to_owned()])));
        assert_eq!(started.elapsed(), Duration::from_secs(15));
    }

    #[tokio::test]
    async fn running_tasks_are_listed_until_they_end() {
        let running = Running::default();
        let mut tasks = tokio::task::JoinSet::new();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        running.spawn(&mut tasks, "worker", async move {
            let _ = released.await;
            Ok(())
        });
        let detail: Detail = Arc::new(|| Some("2 driver call(s) running".to_owned()));
        running.spawn_with(&mut tasks, "agent w1", Some(detail), std::future::pending());
        assert_eq!(running.unfinished(), ["agent w1: 2 driver call(s) running", "worker"]);
        release.send(()).expect("the worker waits");
        tasks.join_next().await.expect("a task").expect("joined").expect("ok");
        assert_eq!(running.unfinished(), ["agent w1: 2 driver call(s) running"]);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        assert!(running.unfinished().is_empty(), "an aborted task is not listed");
    }
}
