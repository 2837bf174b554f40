//! Authentication end to end: `serve --tokens FILE` (embedded, one process, an agent in it), driven by the command
//! line as users run it. Without `LEASEHOLD_TOKEN`, or with a wrong one, a command exits 1 saying the gateway
//! refused it, and nothing is recorded; with the right one it is accepted and the recorded issuer is the token's
//! principal, not the `--issuer` the command line claimed. `serve` on a non-loopback address without `--tokens`
//! refuses to start.

use std::time::Duration;

use leasehold_schemas::{CommandId, ResourceId};
use serde_json::Value;
use tokio::time::Instant;

use crate::support::{Proc, run_cli};

const STEP: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
const TOKEN: &str = "e2e-alice-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_refuses_without_a_valid_token_and_records_the_principal_as_issuer() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-auth-").tempdir().expect("a temporary directory");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# principal token\nop:alice {TOKEN}\n")).expect("write the token file");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod 600");
    let (data, root) = (dir.path().join("data").display().to_string(), dir.path().join("w1"));
    let (tokens_arg, agent) = (tokens.display().to_string(), format!("w1=dir:{}", root.display()));
    let args = ["serve", "--data", &data, "--listen", "127.0.0.1:0", "--tokens", &tokens_arg, "--agent", &agent];
    let mut serve = Proc::spawn(dir.path(), "serve", &args);
    let server = serve.ready().await;
    assert!(serve.stdout().contains("gateway: bearer tokens of op:alice"), "{}", serve.tail());
    wait_agent_live(&server, &mut serve).await;

    let cli = |args: &[&str]| {
        let mut all = vec!["--server", server.as_str()];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let (refused_id, refused_resource) = (CommandId::generate().to_string(), ResourceId::generate().to_string());
    let allocate_refused =
        cli(&["allocate", "--agent", "w1", "--kind", "volume", "--command-id", &refused_id, "--id", &refused_resource]);
    let allocate_refused = cli_refs(&allocate_refused);

    // No token: refused, exit 1, and the message says what to give.
    let ran = run_cli(dir.path(), &allocate_refused, &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("the gateway refused the request without a token"), "{ran:?}");
    assert!(ran.stderr.contains("LEASEHOLD_TOKEN"), "{ran:?}");
    // A wrong token: refused, exit 1.
    let ran = run_cli(dir.path(), &allocate_refused, &[("LEASEHOLD_TOKEN", "e2e-alice-0123456789abcdeF")]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("the gateway refused the token: "), "{ran:?}");
    // Reads too.
    let ran = run_cli(dir.path(), &cli_refs(&cli(&["ls"])), &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("refused the request without a token"), "{ran:?}");

    // The right token, in the environment: accepted, and the issuer recorded is op:alice, not the claimed one.
    let good_id = CommandId::generate().to_string();
    let allocate = cli(&["--issuer", "op:mallory", "allocate", "--agent", "w1", "--kind", "volume"]);
    let mut allocate = cli_refs(&allocate);
    allocate.extend(["--command-id", good_id.as_str()]);
    let alice = [("LEASEHOLD_TOKEN", TOKEN)];
    let ran = run_cli(dir.path(), &allocate, &alice).await;
    assert_eq!(ran.code, Some(0), "{ran:?}\n{}", serve.tail());
    let reference = ran.stdout.trim().to_owned();
    assert!(reference.starts_with("w1."), "{ran:?}");

    let ran = run_cli(dir.path(), &cli_refs(&cli(&["--output", "json", "command", &good_id])), &alice).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let status: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(status["status"], "accepted", "{status:#}");
    assert_eq!(status["outcomes"][0]["outcome"]["command"]["issuer"], "op:alice", "{status:#}");

    // Nothing of the refused command was recorded: the good one came after it on the same agent (so the same
    // partition, decided in order) and is decided; the refused id has no outcome, its resource does not exist.
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write the token");
    let token_file = token_file.display().to_string();
    let ran = run_cli(dir.path(), &cli_refs(&cli(&["--token-file", &token_file, "command", &refused_id])), &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains(&format!("no command {refused_id} is known")), "{ran:?}");
    let ran = run_cli(dir.path(), &cli_refs(&cli(&["--output", "json", "ls"])), &alice).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let resources: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    let refs: Vec<&str> = resources.as_array().expect("a list").iter().filter_map(|r| r["ref"].as_str()).collect();
    assert_eq!(refs, [reference.as_str()], "only the accepted allocation: {resources:#}");
    assert!(!refs.iter().any(|r| r.ends_with(&refused_resource)));

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_non_loopback_address_without_tokens_refuses_to_start() {
    let dir = tempfile::Builder::new().prefix("lh-e2e-auth-").tempdir().expect("a temporary directory");
    let data = dir.path().join("data").display().to_string();
    let ran = run_cli(dir.path(), &["serve", "--data", &data, "--listen", "0.0.0.0:0"], &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("give --tokens FILE"), "{ran:?}");
    assert!(!dir.path().join("data").exists(), "nothing is created before the refusal");

    let bad = dir.path().join("tokens");
    std::fs::write(&bad, "op:alice short\n").expect("write");
    let bad = bad.display().to_string();
    let ran = run_cli(dir.path(), &["serve", "--data", &data, "--listen", "0.0.0.0:0", "--tokens", &bad], &[]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("line 1: the token of op:alice has 5 characters"), "{ran:?}");
}

fn cli_refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Waits until the gateway lists agent w1 as live (asked with the token).
async fn wait_agent_live(server: &str, serve: &mut Proc) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + STEP;
    loop {
        let answer = http.get(format!("{server}/v1/agents")).bearer_auth(TOKEN).send().await;
        if let Ok(answer) = answer
            && let Ok(agents) = answer.json::<Value>().await
            && agents.as_array().is_some_and(|a| a.iter().any(|a| a["name"] == "w1" && a["status"] == "live"))
        {
            return;
        }
        serve.assert_running_while("waiting for agent w1");
        assert!(Instant::now() < deadline, "agent w1 did not turn live in {STEP:?}\n{}", serve.tail());
        tokio::time::sleep(POLL).await;
    }
}
