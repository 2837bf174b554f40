//! The `docker` command line for tests that look at the daemon from outside the driver (the agent's conformance suite
//! and the end-to-end docker scenarios include this file).

use std::process::Stdio;
use std::time::Duration;

/// How long one `docker` command may take.
const DOCKER_STEP: Duration = Duration::from_secs(30);

/// Runs `docker ARGS`: its stdout, or the failure with its stderr.
pub(crate) async fn docker(args: &[&str]) -> Result<String, String> {
    let run = tokio::process::Command::new("docker").args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    let output = tokio::time::timeout(DOCKER_STEP, run)
        .await
        .map_err(|_| format!("docker {args:?} did not end in {DOCKER_STEP:?}"))?
        .map_err(|e| format!("cannot run docker {args:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("docker {args:?}: {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// `docker ARGS`, which must succeed.
pub(crate) async fn must(args: &[&str]) -> String {
    docker(args).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Whether the daemon answers; under `CI=true` it must. `what` names what is skipped otherwise.
pub(crate) async fn daemon_answers(what: &str) -> bool {
    match docker(&["version", "--format", "{{.Server.Version}}"]).await {
        Ok(_) => true,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the docker daemon does not answer, and CI=true: start it ({e})")
        }
        Err(e) => {
            eprintln!("notice: the docker daemon does not answer ({e}); skipping {what}");
            false
        }
    }
}

/// Removes every container and volume `filter` (`label=...`) matches, with their volumes, blocking: for a `Drop`,
/// where nothing can be awaited. What fails is left for the next run's sweep of leftovers.
pub(crate) fn remove_matching(filter: &str) {
    let docker = |args: &[&str]| {
        std::process::Command::new("docker")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    };
    let containers: (&[&str], &[&str]) = (&["ps", "-aq", "--filter", filter], &["rm", "-f", "-v"]);
    let volumes: (&[&str], &[&str]) = (&["volume", "ls", "-q", "--filter", filter], &["volume", "rm", "-f"]);
    for (listing, remove) in [containers, volumes] {
        if let Ok(found) = docker(listing)
            && !found.is_empty()
        {
            let mut args = remove.to_vec();
            args.extend(found.iter().map(String::as_str));
            let _ = docker(&args);
        }
    }
}
