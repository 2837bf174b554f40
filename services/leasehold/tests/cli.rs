//! The command line against a real `leasehold serve` (embedded log, gateway on a free port, an agent in process):
//! what a user types, run as the built binary, with its JSON output checked field by field and its failures checked
//! for their exit status and message.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_schemas::ResourceId;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A `leasehold serve` child process, killed (by its pid) when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `serve` on `data` with a free port and `agents` (`NAME=dir:PATH`), and returns once `/readyz` answers
    /// 200 (every role ready: the gateway takes commands).
    fn start(data: &Path, agents: &[String]) -> Server {
        Server::start_on(data, None, agents)
    }

    /// [`Server::start`], over JetStream at `nats` if given.
    fn start_on(data: &Path, nats: Option<&str>, agents: &[String]) -> Server {
        Server::start_at(data, nats, "127.0.0.1:0", agents)
    }

    /// [`Server::start_on`], listening on `listen`.
    fn start_at(data: &Path, nats: Option<&str>, listen: &str, agents: &[String]) -> Server {
        Server::start_with(data, nats, listen, agents, &[])
    }

    /// [`Server::start_at`], with `extra` flags for `serve`.
    fn start_with(data: &Path, nats: Option<&str>, listen: &str, agents: &[String], extra: &[&str]) -> Server {
        Server::launch(Server::command(data, nats, listen, agents, extra), None)
    }

    /// `serve` as [`Server::start_with`] runs it.
    fn command(data: &Path, nats: Option<&str>, listen: &str, agents: &[String], extra: &[&str]) -> Command {
        std::fs::create_dir_all(data).expect("create the data directory");
        let mut command = Command::new(BIN);
        command.args(["serve", "--partitions", "4", "--listen", listen, "--data"]).arg(data).args(extra);
        if let Some(nats) = nats {
            command.args(["--nats", nats, "--priority-timeout", "2s", "--ack-wait", "2s"]);
        }
        for agent in agents {
            command.arg("--agent").arg(agent);
        }
        command
    }

    /// Starts `command` (a `serve`); its stderr goes to this test's, or line by line to `stderr` if given.
    fn launch(mut command: Command, stderr: Option<mpsc::Sender<String>>) -> Server {
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if stderr.is_some() { Stdio::piped() } else { Stdio::inherit() })
            .spawn()
            .expect("spawn leasehold serve");
        if let Some(lines) = stderr {
            let piped = child.stderr.take().expect("piped stderr");
            std::thread::spawn(move || {
                for line in BufReader::new(piped).lines().map_while(Result::ok) {
                    let _ = lines.send(line);
                }
            });
        }
        // `serve` prints where it listens; the rest of its output is drained so that it never blocks on a full pipe.
        let stdout = child.stdout.take().expect("piped stdout");
        let (address_tx, address_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, rest)) = line.split_once("listening on http://") {
                    let address = rest.split_whitespace().next().unwrap_or_default().to_owned();
                    let _ = address_tx.send(address);
                }
            }
        });
        let address = match address_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => address,
            Err(e) => {
                let _ = child.kill();
                panic!("leasehold serve did not say where it listens: {e}");
            }
        };
        let server = Server { child, url: format!("http://{address}") };
        server.wait_ready(&address);
        server
    }

    /// Bounded retries of `GET /readyz` until it answers 200.
    fn wait_ready(&self, address: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = TcpStream::connect(address).and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: leasehold\r\nConnection: close\r\n\r\n")?;
                let mut text = String::new();
                stream.read_to_string(&mut text)?;
                Ok(text)
            });
            match answer {
                Ok(text) if text.starts_with("HTTP/1.1 200") => return,
                other => {
                    assert!(Instant::now() < deadline, "/readyz at {address} never answered 200: {other:?}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// `leasehold --server URL ARGS...`
    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN).arg("--server").arg(&self.url).args(args).env("RUST_BACKTRACE", "0").output().expect("run")
    }

    /// Runs `args` (with `--output json` after them: the flags are global), expects success and one JSON value.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        let output = self.run(&args);
        assert!(output.status.success(), "leasehold {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("leasehold {args:?} printed no JSON ({e}): {}", text(&output.stdout)))
    }

    /// Runs `args`, expects failure, and returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(!output.status.success(), "leasehold {args:?} succeeded: {}", text(&output.stdout));
        text(&output.stderr)
    }

    /// Bounded retries of `args` (JSON) until `check` holds of its output.
    fn wait_for(&self, args: &[&str], what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.json(args);
            if check(&value) {
                return value;
            }
            assert!(Instant::now() < deadline, "never saw {what}: {value:#}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn str_of<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field].as_str().unwrap_or_else(|| panic!("{field} is not a string in {value:#}"))
}

/// Bounded retries until `agent` has registered.
fn wait_registered(server: &Server, agent: &str) {
    server.wait_for(&["agents"], &format!("{agent} registered"), |agents| {
        agents.as_array().is_some_and(|a| a.iter().any(|a| a["name"] == agent))
    });
}

/// Registers agent `w2` and stops its process: afterwards `w2` is known but nobody creates what it is given, so its
/// resources stay `pending` and leases on them wait.
fn register_absent_agent(data: &Path) {
    std::fs::create_dir_all(data.join("w2")).unwrap();
    let server = Server::start(&data.join("data"), &[format!("w2=dir:{}", data.join("w2").display())]);
    server.wait_for(&["agents"], "w2 registered", |agents| {
        agents.as_array().is_some_and(|a| a.iter().any(|agent| agent["name"] == "w2"))
    });
}

/// A served gateway under `dir` with agent `w1` running and `w2` known but away.
fn serve_w1_with_w2_absent(dir: &Path) -> Server {
    register_absent_agent(dir);
    std::fs::create_dir_all(dir.join("w1")).unwrap();
    let server = Server::start(&dir.join("data"), &[format!("w1=dir:{}", dir.join("w1").display())]);
    wait_registered(&server, "w1");
    server
}

#[test]
fn producer_and_query_commands_against_a_served_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_w2_absent(dir.path());

    // allocate: the resource record, as the gateway has it right after.
    let resource = server.json(&[
        "allocate",
        "--agent",
        "w1",
        "--kind",
        "dir",
        "--capacity",
        "2",
        "--attr",
        "team=ci",
        "--attr",
        "image=alpine:3.20",
    ]);
    let reference = str_of(&resource, "ref").to_owned();
    assert!(reference.starts_with("w1."), "{resource:#}");
    assert_eq!(resource["agent"], "w1");
    assert_eq!(reference, format!("w1.{}", str_of(&resource, "id")));
    assert_eq!(resource["kind"], "dir");
    assert_eq!(resource["capacity"], 2);
    assert_eq!(resource["attrs"]["team"], "ci");
    assert_eq!(resource["attrs"]["image"], "alpine:3.20");
    assert!(["pending", "active"].contains(&str_of(&resource, "state")), "{resource:#}");
    assert!(resource["claims"].as_array().unwrap().is_empty());
    assert!(resource["created_seq"].as_u64().unwrap() > 0);
    assert!(resource["updated_at"].as_u64().unwrap() > 1_700_000_000_000);
    assert!(resource["parent"].is_null());

    // In a table it prints the reference alone.
    let plain = server.run(&["allocate", "--agent", "w1", "--kind", "dir"]);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let other_reference = text(&plain.stdout).trim().to_owned();
    assert!(other_reference.starts_with("w1.") && !other_reference.contains(char::is_whitespace), "{other_reference}");

    // acquire --block on w1's resource: granted (at once, or once the agent has created it), with a token.
    let lease = server.json(&["acquire", &reference, "--holder", "build-1", "--ttl", "5min", "--block"]);
    let lease_id = str_of(&lease, "id").to_owned();
    assert!(lease_id.starts_with("w1.") && lease_id != reference, "{lease:#}");
    assert_eq!(lease["resource"], reference.as_str());
    assert_eq!(lease["holder"], "build-1");
    assert_eq!(lease["state"], "active");
    let token = lease["token"].as_u64().expect("an active lease has a token");
    assert!(lease["expires_at"].as_u64().is_some());

    // get, ls, leases see it.
    let got = server.json(&["get", &reference]);
    assert_eq!(got["state"], "active");
    assert_eq!(got["leases"][0]["id"], lease_id.as_str());
    assert_eq!(got["leases"][0]["holder"], "build-1");
    assert_eq!(got["leases"][0]["state"], "active");
    let listed = server.json(&["ls", "--agent", "w1"]);
    let refs: Vec<&str> = listed.as_array().unwrap().iter().map(|r| str_of(r, "ref")).collect();
    assert!(refs.contains(&reference.as_str()) && refs.contains(&other_reference.as_str()), "{refs:?}");
    assert!(server.json(&["ls", "--agent", "w1", "--kind", "volume"]).as_array().unwrap().is_empty());
    let leases = server.json(&["leases", &reference]);
    assert_eq!(leases.as_array().unwrap().len(), 1, "{leases:#}");
    assert_eq!(leases[0]["id"], lease_id.as_str());
    assert_eq!(leases[0]["token"], token);
    assert_eq!(leases[0]["resource"], reference.as_str());

    // renew with the wrong token: rejected, non-zero, and stderr says why; with the right one: accepted.
    let wrong = server.fails(&["renew", &lease_id, "--token", &(token + 1000).to_string()]);
    assert!(wrong.contains("rejected (token-mismatch)"), "{wrong}");
    let renewed = server.json(&["renew", &lease_id, "--token", &token.to_string(), "--ttl", "10min"]);
    assert_eq!(renewed["status"], "accepted");
    let command_id = str_of(&renewed, "command_id").to_owned();
    let effect = &renewed["outcomes"][0]["outcome"]["decision"]["accepted"]["effects"][0];
    assert!(effect.get("lease-renewed").is_some(), "{renewed:#}");
    let looked_up = server.json(&["command", &command_id]);
    assert_eq!(looked_up["status"], "accepted");
    assert_eq!(looked_up["command_id"], command_id.as_str());

    // A command about an unknown resource: rejected, with the kind and the message on stderr; in JSON mode the
    // status is on stdout too.
    let unknown = format!("w1.{}", ResourceId::generate());
    let stderr = server.fails(&["acquire", &unknown, "--holder", "x"]);
    assert!(stderr.contains("rejected (unknown)") && stderr.contains(&unknown), "{stderr}");
    let output = server.run(&["acquire", &unknown, "--holder", "x", "--output", "json"]);
    assert!(!output.status.success());
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["status"], "rejected");
    assert_eq!(status["rejection"]["kind"], "unknown");

    // A lease on w2's resource waits (w2 is not running): no token yet; it can be released without one.
    let pending = server.json(&["allocate", "--agent", "w2", "--kind", "dir"]);
    let pending_ref = str_of(&pending, "ref").to_owned();
    assert_eq!(pending["state"], "pending");
    let waiting = server.json(&["acquire", &pending_ref, "--holder", "build-2", "--wait-timeout", "10min"]);
    assert_eq!(waiting["state"], "waiting");
    assert!(waiting["token"].is_null(), "{waiting:#}");
    assert!(waiting["wait_until"].as_u64().is_some(), "{waiting:#}");
    let released = server.json(&["release-lease", str_of(&waiting, "id")]);
    assert_eq!(released["status"], "accepted");

    // acquire --block waits while the resource is pending, and ends (non-zero) when the release breaks the lease.
    let blocked = Command::new(BIN)
        .args(["--server", &server.url, "--output", "json", "acquire", &pending_ref, "--holder", "build-3", "--block"])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    server.wait_for(&["leases", &pending_ref], "build-3 waiting", |leases| {
        leases
            .as_array()
            .is_some_and(|l| l.iter().any(|lease| lease["holder"] == "build-3" && lease["state"] == "waiting"))
    });
    let release = server.json(&["release", &pending_ref, "--reason", "test over"]);
    assert_eq!(release["status"], "accepted");
    let blocked = blocked.wait_with_output().unwrap();
    assert!(!blocked.status.success(), "a broken lease is not a success");
    let broken: Value = serde_json::from_slice(&blocked.stdout).unwrap();
    assert_eq!(broken["holder"], "build-3");
    assert_eq!(broken["state"], "broken");
    assert!(text(&blocked.stderr).contains("was not granted: it is broken"), "{}", text(&blocked.stderr));

    // Pools, agents, dead letters.
    let defined = server.json(&["pool", "define", "ips", "--ipv4", "10.20.0.0/24", "--exclude", "10.20.0.1"]);
    assert_eq!(defined["status"], "accepted");
    let pools = server.json(&["pool", "ls"]);
    assert_eq!(pools[0]["name"], "ips");
    let refused = server.fails(&["pool", "define", "bad", "--ipv4", "10.20.0.5/24"]);
    assert!(refused.contains("did you mean 10.20.0.0/24"), "{refused}");
    let agents = server.json(&["agents"]);
    let names: Vec<&str> = agents.as_array().unwrap().iter().map(|a| str_of(a, "name")).collect();
    assert_eq!(names, ["w1", "w2"]);
    assert!(server.json(&["dlq", "ls"]).as_array().unwrap().is_empty());

    // watch: one JSON object per outcome, from the first.
    let mut watch = Command::new(BIN)
        .args(["--server", &server.url, "watch", "--from", "1", "--key", "w1", "--output", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(watch.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    let first: Value = serde_json::from_str(&first).unwrap();
    assert!(first["seq"].as_u64().is_some());
    assert_eq!(first["outcome"]["command"]["key"], "w1");

    // A table is a header and a row per record.
    let table = server.run(&["leases", &reference]);
    let table = text(&table.stdout);
    assert!(table.starts_with("ID ") && table.contains(&lease_id) && table.lines().count() == 2, "{table}");
}

/// With `--nats`, producer commands publish to JetStream and read their outcome from the log, without the gateway:
/// the same answers (the resource from its allocation's outcome, the lease and its token, rejections).
#[test]
fn producer_commands_straight_to_jetstream() {
    let Some(nats) = leasehold_log::nats_server::NatsServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        Some(nats.url()),
        &[format!("w1=dir:{}", dir.path().join("w1").display())],
    );
    server.wait_for(&["agents"], "w1 registered", |agents| {
        agents.as_array().is_some_and(|a| a.iter().any(|agent| agent["name"] == "w1"))
    });
    let direct = ["--nats", nats.url(), "--timeout", "20s"];
    let with = |args: &[&'static str]| -> Vec<String> {
        args.iter().map(|a| (*a).to_owned()).chain(direct.iter().map(|a| (*a).to_owned())).collect()
    };
    let json = |args: Vec<String>| server.json(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let resource = json(with(&["allocate", "--agent", "w1", "--kind", "dir", "--capacity", "1", "--attr", "a=b"]));
    let reference = str_of(&resource, "ref").to_owned();
    assert_eq!(resource["state"], "pending", "{resource:#}");
    assert_eq!(resource["attrs"]["a"], "b");
    assert!(resource["created_seq"].as_u64().is_some(), "{resource:#}");

    let mut acquire = vec!["acquire".to_owned(), reference.clone()];
    acquire.extend(with(&["--holder", "job-1", "--block"]));
    let lease = json(acquire);
    assert_eq!(lease["state"], "active", "{lease:#}");
    let token = lease["token"].as_u64().expect("a token");
    let lease_id = str_of(&lease, "id").to_owned();

    // At capacity: rejected, through the log as through the gateway.
    let mut second = vec!["acquire".to_owned(), reference.clone()];
    second.extend(with(&["--holder", "job-2"]));
    let stderr = server.fails(&second.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(stderr.contains("rejected (at-capacity)"), "{stderr}");

    let mut release = vec!["release-lease".to_owned(), lease_id.clone(), "--token".to_owned(), token.to_string()];
    release.extend(with(&[]));
    assert_eq!(json(release)["status"], "accepted");
    // The gateway's read model saw what the log decided.
    server.wait_for(&["leases", &reference], "the lease released", |leases| leases[0]["state"] == "released");
}

/// Through the log (`--nats`), as through the gateway: a command sent again with its ids gets its first decision
/// (at once, not at the timeout: its outcome landed before it was sent again), said to be a duplicate; another
/// command under the same id is refused (exit status 1), in JSON too.
#[test]
fn resending_straight_to_jetstream() {
    let Some(nats) = leasehold_log::nats_server::NatsServer::start() else {
        // Outside CI without nats-server only (in CI the helper panics): say so loudly in the test's output.
        eprintln!("SKIPPED resending_straight_to_jetstream: no nats-server on PATH");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let agents = [format!("w1=dir:{}", dir.path().join("w1").display())];
    let server = Server::start_with(
        &dir.path().join("data"),
        Some(nats.url()),
        "127.0.0.1:0",
        &agents,
        &["--sync-interval", "500ms"],
    );
    wait_registered(&server, "w1");

    let command_id = leasehold_schemas::CommandId::generate().to_string();
    let resource_id = ResourceId::generate().to_string();
    let allocate = [
        "allocate",
        "--agent",
        "w1",
        "--kind",
        "dir",
        "--command-id",
        &command_id,
        "--id",
        &resource_id,
        "--nats",
        nats.url(),
        "--timeout",
        "20s",
    ];
    let first = server.json(&allocate);
    assert_eq!(first["ref"], format!("w1.{resource_id}"), "{first:#}");
    // Sent again: decided once; the answer comes at once (well within the 20s it may wait).
    let started = Instant::now();
    let again = server.run(&[&allocate[..], &["--output", "json"]].concat());
    assert!(again.status.success(), "exit {:?}: {}", again.status, text(&again.stderr));
    assert!(started.elapsed() < Duration::from_secs(15), "it waited for a new outcome: {:?}", started.elapsed());
    let again_json: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again_json["ref"], first["ref"]);
    assert_eq!(again_json["created_seq"], first["created_seq"], "one allocation, decided once");
    let stderr = text(&again.stderr);
    assert!(stderr.contains(&format!("command {command_id} was stored before")), "{stderr}");
    // In a table too.
    let table = server.run(&allocate);
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert_eq!(text(&table.stdout), format!("w1.{resource_id}\n"));

    // Another command under the same id: refused, naming the command stored under it.
    let other_id = ResourceId::generate().to_string();
    let other = [
        "allocate",
        "--agent",
        "w1",
        "--kind",
        "dir",
        "--id",
        &other_id,
        "--command-id",
        &command_id,
        "--nats",
        nats.url(),
        "--timeout",
        "20s",
    ];
    let refused = server.run(&other);
    assert_eq!(code(&refused), 1, "{}", text(&refused.stderr));
    let stderr = text(&refused.stderr);
    assert!(stderr.contains(&format!("command id {command_id} names another command (op.allocate for w1")), "{stderr}");
    let refused = server.run(&[&other[..], &["--output", "json"]].concat());
    assert_eq!(code(&refused), 1, "{}", text(&refused.stderr));
    let error: Value = serde_json::from_slice(&refused.stdout).expect("one JSON value");
    assert!(str_of(&error, "error").contains("names another command"), "{error:#}");
    assert_eq!(error["command_id"], command_id.as_str());
    assert_eq!(error["ref"], format!("w1.{other_id}"));
    // Nothing was allocated under the other id.
    let listed = server.json(&["ls", "--agent", "w1"]);
    let refs: Vec<&str> = listed.as_array().unwrap().iter().map(|r| str_of(r, "ref")).collect();
    assert_eq!(refs, [format!("w1.{resource_id}").as_str()], "{listed:#}");
}

/// With `--output json`, a failure prints one JSON value on stdout as well: `{"error": ...}` and what is known.
#[test]
fn json_output_says_what_failed() {
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["--server", "http://127.0.0.1:1", "--output", "json"])
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    };
    let reference = format!("w1.{}", ResourceId::generate());
    let output = run(&["get", &reference]);
    assert_eq!(code(&output), 1);
    let error: Value = serde_json::from_slice(&output.stdout).expect("one JSON value on stdout");
    assert!(str_of(&error, "error").contains("cannot reach the gateway at http://127.0.0.1:1/"), "{error:#}");
    assert_eq!(error["ref"], reference.as_str());
    assert!(text(&output.stderr).contains("cannot reach the gateway"), "{}", text(&output.stderr));
    let output = run(&["ls"]);
    let error: Value = serde_json::from_slice(&output.stdout).expect("one JSON value on stdout");
    assert!(error["error"].is_string(), "{error:#}");
    // A producer command that could not send: the command id it chose.
    let command_id = leasehold_schemas::CommandId::generate().to_string();
    let output = run(&["release", &reference, "--command-id", &command_id]);
    assert_eq!(code(&output), 1, "{}", text(&output.stderr));
    let error: Value = serde_json::from_slice(&output.stdout).expect("one JSON value on stdout");
    assert!(error["error"].is_string(), "{error:#}");
    assert_eq!(error["command_id"], command_id.as_str());
    // A table stays a table: nothing on stdout.
    let table = Command::new(BIN).args(["--server", "http://127.0.0.1:1", "ls"]).output().unwrap();
    assert!(table.stdout.is_empty(), "{}", text(&table.stdout));
}

#[test]
fn an_unreachable_gateway_is_named() {
    // Port 1 on localhost: nothing listens there.
    let output =
        Command::new(BIN).args(["--server", "http://127.0.0.1:1", "ls"]).env("RUST_BACKTRACE", "0").output().unwrap();
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("cannot reach the gateway at http://127.0.0.1:1/: is `leasehold serve` running?"),
        "{stderr}"
    );
}

/// The exit status of an output (a signal is a failure of the test).
fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or_else(|| panic!("killed by a signal: {:?}", output.status))
}

/// A command sent again with `--command-id` (and `--id`) is stored and decided once: the same resource, said to be a
/// duplicate; the same command id with another resource id is caught. `acquire --block` gives up at `--timeout` on a
/// lease that stays waiting (on a resource waiting for a pool whose one slot is held), with exit status 4.
#[test]
fn resending_a_command_and_giving_up_on_a_waiting_lease() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let server = Server::start(&dir.path().join("data"), &[format!("w1=dir:{}", dir.path().join("w1").display())]);
    wait_registered(&server, "w1");

    let command_id = leasehold_schemas::CommandId::generate().to_string();
    let resource_id = ResourceId::generate().to_string();
    let allocate = ["allocate", "--agent", "w1", "--kind", "dir", "--command-id", &command_id, "--id", &resource_id];
    let first = server.json(&allocate);
    assert_eq!(first["ref"], format!("w1.{resource_id}"));
    let again = server.run(&[&allocate[..], &["--output", "json"]].concat());
    assert!(again.status.success(), "{}", text(&again.stderr));
    let again_json: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again_json["ref"], first["ref"]);
    assert_eq!(again_json["created_seq"], first["created_seq"], "one resource, created once");
    assert!(
        text(&again.stderr).contains(&format!("command {command_id} was stored before")),
        "{}",
        text(&again.stderr)
    );
    let listed = server.json(&["ls", "--agent", "w1"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    let status = server.json(&["command", &command_id]);
    assert_eq!(status["status"], "accepted");
    let other_id = ResourceId::generate().to_string();
    let mismatch =
        server.fails(&["allocate", "--agent", "w1", "--kind", "dir", "--command-id", &command_id, "--id", &other_id]);
    assert!(mismatch.contains(&format!("command id {command_id} names another command")), "{mismatch}");
    let bad =
        server.run(&["allocate", "--agent", "w1", "--kind", "dir", "--id", "6fa459ea-ee8a-3ca4-894e-db77e160355e"]);
    assert_eq!(code(&bad), 2, "a bad id is a bad command line: {}", text(&bad.stderr));

    // A simple command sent again: its status says duplicate.
    let pause_id = leasehold_schemas::CommandId::generate().to_string();
    let reference = str_of(&first, "ref").to_owned();
    let paused = server.json(&["pause", &reference, "--command-id", &pause_id]);
    assert_eq!((paused["status"].as_str(), paused["duplicate"].as_bool()), (Some("accepted"), Some(false)));
    let paused_again = server.json(&["pause", &reference, "--command-id", &pause_id]);
    assert_eq!((paused_again["status"].as_str(), paused_again["duplicate"].as_bool()), (Some("accepted"), Some(true)));
    assert_eq!(paused_again["outcomes"], paused["outcomes"]);

    // A resource waiting on a pool claim stays pending; a lease on it waits. The pool's one slot is taken first.
    assert_eq!(server.json(&["pool", "define", "p", "--slots", "1"])["status"], "accepted");
    let first = server.json(&["allocate", "--agent", "w1", "--kind", "dir", "--pool", "p"]);
    let first_ref = str_of(&first, "ref").to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.json(&["get", &first_ref])["claims"][0]["status"] != "bound" {
        assert!(Instant::now() < deadline, "the first allocation never got the pool's slot");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pooled = server.json(&["allocate", "--agent", "w1", "--kind", "dir", "--capacity", "3", "--pool", "p"]);
    assert_eq!(pooled["state"], "pending");
    let pooled_ref = str_of(&pooled, "ref").to_owned();
    let started = Instant::now();
    let table = server.run(&["acquire", &pooled_ref, "--holder", "build-9", "--block", "--timeout", "2s"]);
    let elapsed = started.elapsed();
    assert_eq!(code(&table), 4, "{}", text(&table.stderr));
    assert!(elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(20), "{elapsed:?}");
    let stdout = text(&table.stdout);
    assert!(stdout.contains("state       waiting"), "the waiting lease is printed first: {stdout}");
    let stderr = text(&table.stderr);
    assert!(stderr.contains("still waiting after 2s: lease w1."), "{stderr}");
    assert!(stderr.contains("it has no wait timeout"), "{stderr}");
    // The command that waits on: the same command id and lease id, so that it is taken for the same acquisition.
    let again = stderr.split("`leasehold ").nth(2).and_then(|rest| rest.split('`').next()).expect("a command");
    assert!(again.contains("--command-id ") && again.contains(" --lease-id ") && again.contains(" --block"), "{again}");
    // As printed (it names the gateway and the 2s timeout).
    let waited = Command::new(BIN).args(again.split_whitespace()).env("RUST_BACKTRACE", "0").output().unwrap();
    assert_eq!(code(&waited), 4, "waiting on: {}", text(&waited.stderr));
    assert!(text(&waited.stderr).contains("was stored before"), "{}", text(&waited.stderr));
    assert!(text(&waited.stdout).contains("state       waiting"), "{}", text(&waited.stdout));
    let json = server.run(&[
        "acquire",
        &pooled_ref,
        "--holder",
        "build-10",
        "--wait-timeout",
        "1h",
        "--block",
        "--timeout",
        "1s",
        "--output",
        "json",
    ]);
    assert_eq!(code(&json), 4, "{}", text(&json.stderr));
    let lease: Value = serde_json::from_slice(&json.stdout).expect("one JSON value, at the end");
    assert_eq!(lease["state"], "waiting");
    assert!(lease["command_id"].as_str().is_some_and(|id| text(&json.stderr).contains(id)), "{lease:#}");
    assert!(text(&json.stderr).contains("its wait ends by itself at 20"), "{}", text(&json.stderr));

    // A lease id given with the command id: the same lease when sent again.
    let lease_id = leasehold_schemas::LeaseId::generate().to_string();
    let acquire_id = leasehold_schemas::CommandId::generate().to_string();
    let acquire = ["acquire", &pooled_ref, "--holder", "h", "--lease-id", &lease_id, "--command-id", &acquire_id];
    let once = server.json(&acquire);
    let twice = server.json(&acquire);
    assert_eq!(once["id"], format!("w1.{lease_id}"));
    assert_eq!(once, twice);
}

/// A fake gateway: answers each connection with the next of `answers` once it has read the request.
fn fake_gateway(answers: Vec<String>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((stream, _)) = listener.accept() else { return };
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let _ = reader.into_inner().write_all(answer.as_bytes());
        }
    });
    url
}

fn http_answer(code: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A gateway that goes away after it stored the command answers 503: the outcome is unknown, not refused. Exit
/// status 3, what is known on stdout (the resource reference, the lease), and how to check or resend on stderr.
#[test]
fn an_unknown_outcome_is_not_a_refusal() {
    let command_id = "019b76da-abe8-7001-8000-000000000001";
    let resource_id = ResourceId::generate().to_string();
    let published = serde_json::json!({"command_id": command_id, "status": "published", "command_seq": 12,
        "duplicate": false, "rejection": null, "outcomes": [], "dead_letter": null})
    .to_string();
    let url = fake_gateway(vec![
        http_answer("503 Service Unavailable", &published),
        http_answer("503 Service Unavailable", r#"{"error":"the gateway is shutting down"}"#),
        http_answer("503 Service Unavailable", &published),
    ]);
    let run = |args: &[&str]| {
        Command::new(BIN).arg("--server").arg(&url).args(args).env("RUST_BACKTRACE", "0").output().unwrap()
    };
    let allocate =
        run(&["allocate", "--agent", "w1", "--kind", "dir", "--command-id", command_id, "--id", &resource_id]);
    assert_eq!(code(&allocate), 3, "{}", text(&allocate.stderr));
    assert_eq!(text(&allocate.stdout), format!("w1.{resource_id}\n"));
    let stderr = text(&allocate.stderr);
    assert!(stderr.contains(&format!("the outcome of command {command_id} is unknown")), "{stderr}");
    assert!(!stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains(&format!("`--command-id {command_id} --id {resource_id}`")), "{stderr}");

    let json = run(&["allocate", "--agent", "w1", "--kind", "dir", "--command-id", command_id, "--output", "json"]);
    assert_eq!(code(&json), 3, "{}", text(&json.stderr));
    let status: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(status["status"], "unknown", "the gateway said no status: {status:#}");
    assert!(str_of(&status, "ref").starts_with("w1."), "{status:#}");

    let lease = "w1.019b76da-9860-7333-b333-333333333333";
    let acquire =
        run(&["acquire", "w1.019b76da-9478-7111-9111-111111111111", "--holder", "h", "--lease-id", &lease[3..]]);
    assert_eq!(code(&acquire), 3, "{}", text(&acquire.stderr));
    assert_eq!(text(&acquire.stdout), format!("{lease}\n"));
    assert!(text(&acquire.stderr).contains(&format!("--lease-id {}`", &lease[3..])), "{}", text(&acquire.stderr));
}

/// `watch` outlives a restart of the gateway: it says so on stderr, connects again, and resumes after the last
/// outcome it printed (each outcome once, in order).
#[test]
fn watch_resumes_after_the_gateway_restarts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let agents = [format!("w1=dir:{}", dir.path().join("w1").display())];
    // A port that was free a moment ago, kept across the restart.
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let server = Server::start_at(&dir.path().join("data"), None, &address, &agents);
    wait_registered(&server, "w1");
    let first = server.json(&["allocate", "--agent", "w1", "--kind", "dir"]);
    let first_seq = first["created_seq"].as_u64().unwrap();

    let mut watch = Command::new(BIN)
        .args(["--server", &server.url, "watch", "--from", "1", "--key", "w1", "--output", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel::<Value>();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(serde_json::from_str(&line).expect("a JSON line"));
        }
    });
    let mut seqs = Vec::new();
    let mut read_until = |what: &str, done: &dyn Fn(&Value) -> bool| loop {
        let line = lines.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("no {what}: {e}"));
        seqs.push(line["seq"].as_u64().unwrap());
        if done(&line) {
            break;
        }
    };
    read_until("first allocation", &|line| line["seq"].as_u64() >= Some(first_seq));

    drop(server);
    let server = Server::start_at(&dir.path().join("data"), None, &address, &agents);
    let command_id = leasehold_schemas::CommandId::generate().to_string();
    server.json(&["allocate", "--agent", "w1", "--kind", "dir", "--command-id", &command_id]);
    read_until("allocation after the restart", &|line| line["outcome"]["command"]["id"] == command_id.as_str());
    let _ = watch.kill();
    let output = watch.wait_with_output().unwrap();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "each outcome once, in order: {seqs:?}");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("connecting again in") && stderr.contains("after outcome"), "{stderr}");
}

/// The cluster policy lives in the log: the first server seeds it from its flags, a second one with other flags
/// warns about each difference and changes nothing, `policy set` changes only what it names (and refuses nonsense
/// with exit status 2, sending nothing), and pools grow and go through the same command line.
#[test]
fn the_policy_is_seeded_once_and_changed_only_on_purpose() {
    let Some(nats) = leasehold_log::nats_server::NatsServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let first = Server::start_with(
        &dir.path().join("a"),
        Some(nats.url()),
        "127.0.0.1:0",
        &[],
        &["--stall-after", "30s", "--claim-cooldown", "5s"],
    );
    let recorded = |policy: &Value| {
        policy.as_array().is_some_and(|all| {
            all.len() == 4 && all.iter().all(|p| p["recorded"] == true && p["policy"]["agent"]["stall_after"] == 30_000)
        })
    };
    let policy = first.wait_for(&["policy", "show"], "the first server's policy recorded", recorded);
    assert_eq!(policy[0]["policy"]["claim_cooldown"], 5_000, "{policy:#}");
    assert_eq!(policy[0]["policy"]["agent"]["orphan_after"], 86_400_000, "a flag not given: the default");

    // A second server with other flags: a loud warning per partition, and the policy stays.
    let second = second_server(&dir.path().join("b"), nats.url(), &["--stall-after", "45s"]);
    let key = str_of(&first.json(&["policy", "show"])[0], "key").to_owned();
    assert!(key.starts_with("@lh-settings-"), "{key}");
    for warning in &second {
        assert!(warning.contains("--stall-after 45s (recorded: 30s)"), "{warning}");
    }
    assert!(recorded(&first.json(&["policy", "show"])), "the second server's flags changed nothing");

    // Nonsense is refused before anything is sent.
    let output = first.run(&["policy", "set", "--orphan-after", "10s"]);
    assert_eq!(code(&output), 2, "{}", text_of(&output));
    assert!(text(&output.stderr).contains("must be longer than stall_after"), "{}", text_of(&output));
    assert!(recorded(&first.json(&["policy", "show"])));

    // On purpose: only the field named changes, in every partition.
    let set = first.run(&["policy", "set", "--orphan-after", "2h"]);
    assert!(set.status.success(), "{}", text_of(&set));
    assert!(text(&set.stdout).starts_with("policy set: accepted in partitions 0..4 (4)\n"), "{}", text(&set.stdout));
    assert!(text(&set.stdout).contains("2h"), "the policy now in force follows: {}", text(&set.stdout));
    let changed = first.wait_for(&["policy", "show"], "orphan_after 2h everywhere", |all| {
        all.as_array().is_some_and(|all| all.iter().all(|p| p["policy"]["agent"]["orphan_after"] == 7_200_000))
    });
    assert_eq!(changed[3]["policy"]["agent"]["stall_after"], 30_000, "{changed:#}");
    let shown = first.run(&["policy", "show"]);
    assert!(text(&shown.stdout).starts_with("the policy of all 4 partitions\n"), "{}", text(&shown.stdout));

    // A pool defined without a cool-down takes the policy's; it grows, and goes once empty.
    assert!(first.run(&["pool", "define", "ips", "--slots", "2"]).status.success());
    first.wait_for(&["pool", "ls"], "pool ips", |pools| pools[0]["cooldown_ms"] == 5_000);
    // Slots may be fewer (a quota is lowered so); an address pool only grows.
    assert!(first.run(&["pool", "update", "ips", "--slots", "1"]).status.success());
    first.wait_for(&["pool", "ls"], "pool ips lowered", |pools| pools[0]["kind"]["slots"]["count"] == 1);
    assert!(first.run(&["pool", "update", "ips", "--slots", "4"]).status.success());
    first.wait_for(&["pool", "ls"], "pool ips grown", |pools| pools[0]["kind"]["slots"]["count"] == 4);
    assert!(first.run(&["pool", "delete", "ips"]).status.success());
    first.wait_for(&["pool", "ls"], "pool ips deleted", |pools| pools.as_array().is_some_and(Vec::is_empty));
}

fn text_of(output: &Output) -> String {
    format!("stdout: {}\nstderr: {}", text(&output.stdout), text(&output.stderr))
}

/// Starts a second `serve` on the same JetStream with `flags`, and returns the policy warnings it prints on stderr
/// (one per partition; bounded wait), then stops it.
fn second_server(data: &Path, nats: &str, flags: &[&str]) -> Vec<String> {
    std::fs::create_dir_all(data).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--partitions", "4", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(["--nats", nats, "--priority-timeout", "2s", "--ack-wait", "2s"])
        .args(flags)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the second leasehold serve");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("WARNING: policy:") {
                let _ = tx.send(line);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut warnings = Vec::new();
    while warnings.len() < 4 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => warnings.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("the second server warned {} times, not 4 ({e}): {warnings:#?}", warnings.len());
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    warnings
}

/// What a terminal would act on, in a holder: ESC and a colour, a carriage return that would let `FAKE` overwrite
/// the row, a right-to-left override.
const EVIL: &str = "x\u{1b}[31mRED\rFAKE\u{202e}";
/// [`EVIL`] as the command line shows it.
const EVIL_SHOWN: &str = "x\\x1b[31mRED\\rFAKE\\u{202e}";

/// `text` holds no control or bidi character but its line breaks.
#[track_caller]
fn shown_safely(what: &str, text: &str) {
    let raw = text.replace('\n', "");
    assert!(!raw.contains(leasehold_schemas::text::is_unsafe_for_display), "{what} prints a raw control: {text:?}");
}

/// The display column at which `needle` starts on the first line of `table` that holds it.
fn column_of(table: &str, needle: &str) -> usize {
    let line = table.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no {needle:?} in\n{table}"));
    leasehold_cli_common::output::display_width(&line[..line.find(needle).unwrap()])
}

#[test]
fn producer_text_is_shown_escaped_and_json_keeps_it_exact() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_w2_absent(dir.path());

    let resource = server.json(&[
        "allocate",
        "--agent",
        "w1",
        "--kind",
        "dir",
        "--capacity",
        "3",
        "--attr",
        &format!("note={EVIL}"),
    ]);
    let reference = str_of(&resource, "ref").to_owned();
    assert_eq!(resource["attrs"]["note"], EVIL, "JSON keeps the attribute exact: {resource:#}");
    server.wait_for(&["get", &reference], "the resource active", |r| r["state"] == "active");

    // acquire in JSON: the holder exact; in a table: escaped.
    let command_id = leasehold_schemas::CommandId::generate().to_string();
    let lease = server.json(&["acquire", &reference, "--holder", EVIL, "--command-id", &command_id]);
    assert_eq!(lease["holder"], EVIL, "{lease:#}");
    let wide = "漢字ビルド\u{202e}";
    let acquired = server.run(&["acquire", &reference, "--holder", wide]);
    assert!(acquired.status.success(), "{}", text(&acquired.stderr));
    let acquired = text(&acquired.stdout);
    shown_safely("acquire", &acquired);
    assert!(acquired.contains("holder      漢字ビルド\\u{202e}\n"), "{acquired}");

    // leases, get, ls, command: escaped, and the columns line up on a terminal.
    let leases = text(&server.run(&["leases", &reference]).stdout);
    shown_safely("leases", &leases);
    assert!(leases.contains(EVIL_SHOWN) && leases.lines().count() == 3, "one row per lease: {leases}");
    let state_column = column_of(&leases, "STATE");
    assert_eq!(column_of(&leases, &format!("{EVIL_SHOWN}  ")) + EVIL_SHOWN.len() + 2, state_column, "{leases}");
    assert!(leases.lines().skip(1).all(|row| column_of(row, "active") == state_column), "{leases}");
    let got = text(&server.run(&["get", &reference]).stdout);
    shown_safely("get", &got);
    assert!(got.contains(&format!("attrs        note={EVIL_SHOWN}\n")), "{got}");
    assert!(got.contains(&format!("active, {EVIL_SHOWN})")), "{got}");
    let listed = text(&server.run(&["ls", "--agent", "w1"]).stdout);
    shown_safely("ls", &listed);
    assert!(listed.contains(&reference), "{listed}");
    let status = text(&server.run(&["command", &command_id]).stdout);
    shown_safely("command", &status);
    assert!(status.contains(r#""holder":"x\u001b[31mRED\rFAKE\u202e""#), "{status}");

    // JSON stays exact.
    let leases = server.json(&["leases", &reference]);
    let holders: Vec<&str> = leases.as_array().unwrap().iter().map(|l| str_of(l, "holder")).collect();
    assert!(holders.contains(&EVIL) && holders.contains(&wide), "{holders:?}");
    assert_eq!(server.json(&["get", &reference])["attrs"]["note"], EVIL);

    // A producer command's words in a table: safe to show; the effects (with the reason, exact) in JSON.
    let failed = server.run(&["report-failure", &reference, "--reason", EVIL]);
    assert!(failed.status.success(), "{}", text(&failed.stderr));
    shown_safely("report-failure", &text(&failed.stdout));
    assert!(text(&failed.stdout).contains("suspect: w1 is asked for a health check"), "{}", text(&failed.stdout));

    // acquire --block gives up on a lease that waits (w2 is away): the command to run again is safe to show and
    // says the same holder, in ANSI-C quotes.
    let pending = server.json(&["allocate", "--agent", "w2", "--kind", "dir"]);
    let blocked = server.run(&["acquire", str_of(&pending, "ref"), "--holder", EVIL, "--block", "--timeout", "1s"]);
    assert_eq!(code(&blocked), 4, "{}", text_of(&blocked));
    shown_safely("acquire --block", &text(&blocked.stderr));
    assert!(text(&blocked.stderr).contains(r"--holder $'x\x1b[31mRED\rFAKE\u202e'"), "{}", text(&blocked.stderr));

    // An error on stderr that quotes a command's text: a line of `publish --file` that does not decode.
    let file = dir.path().join("commands.ndjson");
    let allocate = leasehold_schemas::command::Allocate {
        agent: leasehold_schemas::AgentName::new("w1").unwrap(),
        resource: ResourceId::generate(),
        kind: "dir".to_owned(),
        capacity: 1,
        attributes: Default::default(),
        parent: None,
        pools: Vec::new(),
        wait: None,
    };
    let issuer = leasehold_schemas::Issuer::new("cli").unwrap();
    let envelope = leasehold_schemas::Envelope::new(
        leasehold_schemas::CommandId::generate(),
        issuer,
        leasehold_schemas::Timestamp(1_790_000_000_000),
        allocate,
    );
    let mut line: Value = serde_json::from_str(&leasehold_schemas::codec::command_to_json(&envelope).unwrap()).unwrap();
    line["body"][EVIL] = serde_json::json!(1);
    std::fs::write(&file, format!("{line}\n{line}\n")).unwrap();
    let published = server.run(&["publish", "--file", file.to_str().unwrap()]);
    assert!(!published.status.success());
    let stderr = text(&published.stderr);
    shown_safely("publish", &stderr);
    assert!(stderr.contains("  line 2: bad JSON") && stderr.contains(EVIL_SHOWN), "one line each: {stderr}");
}

/// `agent retire` is sticky: what the agent held is released and destroyed (and `get` says why), and the agent
/// registering again when its `serve` restarts stays retired, though it holds nothing; `agent unretire` brings it
/// back, on record with who asked. `policy set --gc dry-run` shows in `policy show`.
#[test]
fn retirement_is_sticky_until_unretired_on_record_and_gc_is_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("w1");
    std::fs::create_dir_all(&root).unwrap();
    let agents = [format!("w1=dir:{}", root.display())];
    let data = dir.path().join("data");
    let fast = ["--sync-interval", "200ms"];
    let first_epoch = {
        let server = Server::start_with(&data, None, "127.0.0.1:0", &agents, &fast);
        wait_registered(&server, "w1");
        let allocated = server.json(&["allocate", "--agent", "w1", "--kind", "dir"]);
        let reference = str_of(&allocated, "ref").to_owned();
        server.wait_for(&["get", &reference], "the resource created", |r| r["state"] == "active");
        // A lease on it: the dry run marks it, and a retirement without --yes is refused on record, changing nothing.
        let lease = server.json(&["acquire", &reference, "--holder", "build-9"]);
        let lease = str_of(&lease, "id").to_owned();
        let dry = server.run(&["agent", "retire", "w1", "--dry-run"]);
        assert!(dry.status.success(), "{}", text_of(&dry));
        let table = text(&dry.stdout);
        assert!(table.starts_with("REF ") && table.contains(&reference), "{table}");
        assert!(table.contains(&format!("LEASED: {lease} (holder build-9, active)")), "{table}");
        assert!(
            table.ends_with(
                "agent retire w1 would release 1 resource, 1 holding a lease; nothing sent. `leasehold agent retire \
                 w1` is refused while one holds a lease: add --yes to release them anyway (their leases are broken)\n"
            ),
            "{table}"
        );
        let dry = server.json(&["agent", "retire", "w1", "--dry-run"]);
        assert_eq!(
            (dry["would_release"][0]["ref"].as_str(), dry["leased"][0].as_str()),
            (Some(&*reference), Some(&*reference))
        );
        assert_eq!(dry["would_release"].as_array().map(Vec::len), Some(1), "{dry:#}");
        let refused = server.fails(&["agent", "retire", "w1"]);
        assert!(
            refused.contains("rejected (invalid-state)")
                && refused.contains(&format!("{reference} holds lease {lease} (holder \"build-9\", active)"))
                && refused.contains("retire with --yes"),
            "{refused}"
        );
        assert_eq!(server.json(&["agents"])[0]["retired"], false, "nothing changed");
        assert_eq!(server.json(&["get", &reference])["state"], "active", "nothing changed");
        let retired = server.json(&["agent", "retire", "w1", "--yes", "--issuer", "op:carol"]);
        assert_eq!(retired["status"], "accepted", "{retired:#}");
        let got = server.wait_for(&["get", &reference], "the resource destroyed", |r| r["state"] == "destroyed");
        assert_eq!(got["detail"]["release"], serde_json::json!({"agent-retired": {}}), "{got:#}");
        assert_eq!(got["detail"]["confirmed_by"], "w1", "{got:#}");
        let table = text(&server.run(&["get", &reference]).stdout);
        assert!(table.contains("destroyed, as its agent w1 confirmed, after its agent was retired"), "{table}");
        let agents = server.json(&["agents"]);
        assert_eq!((agents[0]["status"].as_str(), agents[0]["retired"].as_bool()), (Some("retired"), Some(true)));
        agents[0]["epoch"].as_u64().expect("an epoch")
    };

    // The same agent registers again (its process restarted): still retired, though nothing is left to destroy.
    let server = Server::start_with(&data, None, "127.0.0.1:0", &agents, &fast);
    let agents = server.wait_for(&["agents"], "w1 registered again", |a| {
        a[0]["epoch"].as_u64().is_some_and(|epoch| epoch > first_epoch)
    });
    assert_eq!((agents[0]["status"].as_str(), agents[0]["retired"].as_bool()), (Some("retired"), Some(true)));
    assert_eq!(agents[0]["resources"].as_u64().map(|n| n <= 1), Some(true), "{agents:#}");
    let table = text(&server.run(&["agents"]).stdout);
    assert!(table.starts_with("NAME ") && table.contains(" retired ") && table.contains(" DRIVER "), "{table}");

    // Unretired on record, by whom.
    let unretired = server.json(&["agent", "unretire", "w1", "--issuer", "op:carol"]);
    assert_eq!(unretired["status"], "accepted", "{unretired:#}");
    let effect = &unretired["outcomes"][0]["outcome"]["decision"]["accepted"]["effects"][0];
    assert_eq!(effect["agent-unretired"]["by"], "op:carol", "{unretired:#}");
    let agents = server.wait_for(&["agents"], "w1 back in service", |a| a[0]["status"] == "live");
    assert_eq!(agents[0]["retired"], false);
    // Unretiring what is not retired: the state asked for holds, so it says so and exits 0.
    let again = server.run(&["agent", "unretire", "w1"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let said = format!("{}{}", text(&again.stdout), text(&again.stderr));
    assert!(said.contains("not retired") && said.contains("is not retired"), "{said}");

    // The gc mode is part of the policy.
    let set = server.run(&["policy", "set", "--gc", "dry-run"]);
    assert!(set.status.success(), "{}", text_of(&set));
    assert_eq!(
        text(&set.stdout).lines().next(),
        Some("policy set: accepted in partitions 0..4 (4)"),
        "{}",
        text_of(&set)
    );
    server.wait_for(&["policy", "show"], "gc dry-run everywhere", |all| {
        all.as_array().is_some_and(|all| all.iter().all(|p| p["gc"] == "dry-run" && p["recorded"] == true))
    });
    let shown = text(&server.run(&["policy", "show"]).stdout);
    assert!(shown.contains("\ngc              dry-run\n"), "{shown}");
    let unchanged = server.run(&["policy", "set", "--gc", "dry-run"]);
    assert!(
        text(&unchanged.stdout)
            .starts_with("policy set: unchanged in partitions 0..4 (4) (they have this policy already)"),
        "{}",
        text_of(&unchanged)
    );
    let bad = server.run(&["policy", "set", "--gc", "sometimes"]);
    assert_eq!(code(&bad), 2, "{}", text_of(&bad));
}

/// An in-process agent whose driver cannot open its root (here a plain file) stops, and says so, but `/healthz`
/// stays 200: one machine's disk is not the process's health.
#[test]
fn an_agent_whose_root_cannot_be_opened_does_not_fail_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("not-a-directory");
    std::fs::write(&root, "a file where the root should be").unwrap();
    let server = Server::start(&dir.path().join("data"), &[format!("w9=dir:{}", root.display())]);
    let address = server.url.trim_start_matches("http://").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = http_get(&address, "/healthz");
        assert!(answer.starts_with("HTTP/1.1 200"), "/healthz failed for one agent's disk: {answer}");
        // Named on /healthz once stopped (or, an agent that keeps running, recorded in its record).
        let recorded = server
            .json(&["agents"])
            .as_array()
            .is_some_and(|agents| agents.iter().any(|a| a["name"] == "w9" && a["driver"]["available"] == false));
        if answer.contains("agent w9") || recorded {
            break;
        }
        assert!(Instant::now() < deadline, "agent w9 never said its root cannot be opened: {answer}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET path` on `address`, the whole answer (status line, headers, body).
fn http_get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: leasehold\r\nConnection: close\r\n\r\n").expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
}

/// A quota across the 4 partitions: `quota set` defines its pool and records it everywhere (a bad one is refused
/// with exit 2 before anything is sent, a principal already under another quota with exit 1); allocations by its
/// principal up to the maximum are made, the next one without `--wait` is released at once (`allocate` exits 1 naming
/// the quota and its holders, `get` says so too), one with `--wait` waits for a slot and is made when a holder is
/// released. `quota ls` shows held/max and the holders, and which partitions lack a quota; `quota rm` removes it.
#[test]
fn a_quota_caps_what_its_principals_hold_across_partitions() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let agents = [format!("w1=dir:{}", dir.path().join("w1").display())];
    // Room declared for `dir`: an allocation that names no agent (a placement) can be placed.
    let server =
        Server::start_with(&dir.path().join("data"), None, "127.0.0.1:0", &agents, &["--agent-capacity", "w1:dir=10"]);
    wait_registered(&server, "w1");
    let team_a = ["--issuer", "ci:team-a"];

    // Nonsense is refused before anything is sent.
    let bad = server.run(&["quota", "set", "team-a", "--max", "a.b=2", "--principal", "ci:team-a"]);
    assert_eq!(code(&bad), 2, "{}", text_of(&bad));
    assert!(
        text(&bad.stderr).contains("no dot") && text(&bad.stderr).contains("nothing was sent"),
        "{}",
        text_of(&bad)
    );
    assert_eq!(code(&server.run(&["quota", "set", "team-a", "--max", "dir=2"])), 2, "a principal is required");
    assert_eq!(server.json(&["pool", "ls"]), serde_json::json!([]), "nothing was sent");

    // Set: the pool first (slots as the maximum, orphans held, no cool-down), then every partition.
    let set = server.run(&["quota", "set", "team-a", "--max", "dir=2", "--max", "gpu=0", "--principal", "ci:team-a"]);
    assert_eq!(code(&set), 0, "{}", text_of(&set));
    let said = text(&set.stdout);
    assert!(said.starts_with("quota set team-a: accepted in partitions 0..4 (4)\n"), "{said}");
    assert!(said.contains("quota-team-a-dir defined with 2 slots") && said.contains("gpu=0 (none at all)"), "{said}");
    let pools = server.json(&["pool", "ls"]);
    assert_eq!(pools.as_array().map(Vec::len), Some(1), "no pool for a maximum of 0: {pools:#}");
    assert_eq!(pools[0]["name"], "quota-team-a-dir");
    assert_eq!(pools[0]["kind"]["slots"]["count"], 2);
    assert_eq!((pools[0]["orphans"].as_str(), pools[0]["cooldown_ms"].as_u64()), (Some("hold"), Some(0)));
    let again = server.run(&["quota", "set", "team-a", "--max", "dir=2", "--max", "gpu=0", "--principal", "ci:team-a"]);
    let said = text(&again.stdout);
    assert!(said.starts_with("quota set team-a: unchanged in partitions 0..4 (4)"), "{}", text_of(&again));
    assert!(said.contains("quota-team-a-dir has 2 slots already"), "{said}");

    // A principal is under one quota: refused with exit 1, nothing sent (no pool for team-b).
    let other = server.run(&["quota", "set", "team-b", "--max", "dir=1", "--principal", "ci:team-a"]);
    assert_eq!(code(&other), 1, "{}", text_of(&other));
    assert!(text(&other.stderr).contains("principal ci:team-a is already under quota team-a"), "{}", text_of(&other));
    assert_eq!(server.json(&["pool", "ls"]).as_array().map(Vec::len), Some(1));
    // Nor may a quota name its own sender (under it, the sender could not change it again): nothing sent.
    let own = server.run(&["quota", "set", "own", "--max", "dir=1", "--principal", "op:own", "--issuer", "op:own"]);
    assert_eq!(code(&own), 1, "{}", text_of(&own));
    assert!(text(&own.stderr).contains("names its own sender op:own"), "{}", text_of(&own));
    assert_eq!(server.json(&["pool", "ls"]).as_array().map(Vec::len), Some(1));

    // Two allocations fit; each holds a slot once made.
    let mut held = Vec::new();
    for _ in 0..2 {
        let made = server.json(&[&["allocate", "--agent", "w1", "--kind", "dir"][..], &team_a].concat());
        held.push(str_of(&made, "ref").to_owned());
    }
    for reference in &held {
        server.wait_for(&["get", reference], "made with its quota's slot", |r| {
            r["state"] == "active"
                && r["claims"][0]["pool"] == "quota-team-a-dir"
                && r["claims"][0]["status"] == "bound"
        });
    }
    // The third, with no wait: accepted, then released at once; allocate says why and exits 1.
    let id = ResourceId::generate().to_string();
    let over = server.run(&[&["allocate", "--agent", "w1", "--kind", "dir", "--id", &id][..], &team_a].concat());
    assert_eq!(code(&over), 1, "{}", text_of(&over));
    let stderr = text(&over.stderr);
    let mut sorted = held.clone();
    sorted.sort();
    assert!(
        stderr.contains(&format!(
            "allocate w1.{id}: accepted, then released: quota team-a is full for dir, 2 of 2 held: {}, {}; it gave no \
             wait; give --wait DURATION to queue for a slot",
            sorted[0], sorted[1]
        )),
        "{stderr}"
    );
    let over_ref = format!("w1.{id}");
    let shown = server.run(&["get", &over_ref]);
    assert!(text(&shown.stdout).contains("quota team-a is full for dir, 2 of 2 held"), "{}", text_of(&shown));
    // A placement (no --agent) is charged at its commit: placed, then released over quota; allocate says so.
    let placed = server.run(&[&["allocate", "--kind", "dir"][..], &team_a].concat());
    assert_eq!(code(&placed), 1, "{}", text_of(&placed));
    assert!(
        text(&placed.stderr).contains("placed on w1, then released: quota team-a is full for dir, 2 of 2 held"),
        "{}",
        text_of(&placed)
    );
    // A maximum of 0 refuses outright; another issuer is not counted.
    let none = server.run(&[&["allocate", "--agent", "w1", "--kind", "gpu"][..], &team_a].concat());
    assert_eq!(code(&none), 1, "{}", text_of(&none));
    assert!(text(&none.stderr).contains("quota team-a of ci:team-a allows no gpu"), "{}", text_of(&none));
    let free = server.json(&["allocate", "--agent", "w1", "--kind", "dir", "--issuer", "ci:team-b"]);
    assert_eq!(free["claims"], serde_json::json!([]), "{free:#}");

    // With --wait it queues for a slot.
    let waiting =
        server.json(&[&["allocate", "--agent", "w1", "--kind", "dir", "--wait", "5min"][..], &team_a].concat());
    let waiting_ref = str_of(&waiting, "ref").to_owned();
    assert_eq!(waiting["state"], "pending", "{waiting:#}");
    assert_eq!(waiting["claims"][0]["status"], "wanted", "{waiting:#}");
    let quotas = server.wait_for(&["quota", "ls"], "2 held and 1 waiting", |q| q[0]["kinds"][0]["waiting"] == 1);
    let dir_use = &quotas[0]["kinds"][0];
    assert_eq!(quotas[0]["name"], "team-a");
    assert_eq!(quotas[0]["principals"], serde_json::json!(["ci:team-a"]));
    assert_eq!(
        (dir_use["kind"].as_str(), dir_use["held"].as_u64(), dir_use["max"].as_u64()),
        (Some("dir"), Some(2), Some(2))
    );
    let holders: Vec<&str> =
        dir_use["holders"].as_array().unwrap().iter().map(|h| h["holder"].as_str().unwrap()).collect();
    assert_eq!(holders, sorted.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(quotas[0]["missing_in"], serde_json::json!([]));
    let table = text(&server.run(&["quota", "ls"]).stdout);
    let row = table.lines().find(|l| l.contains(" dir ")).unwrap_or_else(|| panic!("no dir row: {table}"));
    assert!(row.starts_with("team-a  ci:team-a") && row.contains("2/2") && row.contains(&sorted[0]), "{table}");
    assert!(table.lines().any(|l| l.contains(" gpu ") && l.contains("none allowed")), "{table}");

    // A holder released: the waiting one gets its slot and is made.
    assert_eq!(code(&server.run(&["release", &held[0]])), 0);
    server.wait_for(&["get", &waiting_ref], "the waiting allocation made", |r| r["state"] == "active");
    let quotas = server.wait_for(&["quota", "ls"], "the new holder", |q| {
        q[0]["kinds"][0]["holders"].as_array().is_some_and(|h| h.iter().any(|h| h["holder"] == waiting_ref.as_str()))
    });
    assert_eq!((quotas[0]["kinds"][0]["held"].as_u64(), quotas[0]["kinds"][0]["waiting"].as_u64()), (Some(2), Some(0)));

    // A quota only one partition has (sent there alone): `quota ls` says the others lack it.
    let key = str_of(&server.json(&["policy", "show"])[0], "key").to_owned();
    let body = leasehold_schemas::command::SetQuota {
        key: key.parse().unwrap(),
        partition: 0,
        quota: "half".parse().unwrap(),
        max: [("vm".to_owned(), 1)].into(),
        principals: vec![leasehold_schemas::Issuer::new("ci:half").unwrap()],
    };
    let now = leasehold_schemas::Timestamp(
        u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap(),
    );
    let envelope = leasehold_schemas::Envelope::new(
        leasehold_schemas::CommandId::generate(),
        leasehold_schemas::Issuer::new("op:test").unwrap(),
        now,
        body,
    );
    let file = dir.path().join("half.ndjson");
    std::fs::write(&file, format!("{}\n", leasehold_schemas::codec::command_to_json(&envelope).unwrap())).unwrap();
    assert_eq!(code(&server.run(&["publish", "--file", file.to_str().unwrap()])), 0);
    let quotas = server.wait_for(&["quota", "ls"], "quota half in partition 0", |q| q[0]["name"] == "half");
    assert_eq!(quotas[0]["partitions"], serde_json::json!([0]));
    assert_eq!(quotas[0]["missing_in"], serde_json::json!([1, 2, 3]));
    let table = text(&server.run(&["quota", "ls"]).stdout);
    assert!(table.contains("0/1 (pool quota-half-vm missing)"), "{table}");
    assert!(
        table.contains("quota half: the partitions disagree: shown as 1 of 4 have it; not set in partitions 1..4 (3)"),
        "{table}"
    );

    // Removed everywhere; its pool is left, and its principal's allocations claim no slot any more.
    let rm = server.run(&["quota", "rm", "team-a"]);
    assert_eq!(code(&rm), 0, "{}", text_of(&rm));
    let said = text(&rm.stdout);
    assert!(said.starts_with("quota rm team-a: removed from partitions 0..4 (4)\n"), "{said}");
    assert!(said.contains("keeps its slot until each resource ends"), "{said}");
    assert!(
        said.contains("its pools are left: quota-team-a-dir; delete each with `leasehold pool delete NAME`"),
        "{said}"
    );
    server.wait_for(&["quota", "ls"], "team-a gone", |q| {
        q.as_array().is_some_and(|q| q.iter().all(|q| q["name"] != "team-a"))
    });
    let unlimited = server.json(&[&["allocate", "--agent", "w1", "--kind", "dir"][..], &team_a].concat());
    assert_eq!(unlimited["claims"], serde_json::json!([]), "{unlimited:#}");
    let twice = server.run(&["quota", "rm", "team-a"]);
    assert_eq!(code(&twice), 0);
    assert!(text(&twice.stdout).contains("no partition has quota team-a: nothing to remove"), "{}", text_of(&twice));
}

/// A served gateway with agent `w1` (room for 10 `dir`) under `dir`, with `extra` flags for `serve`.
fn serve_w1_with_room(dir: &Path, extra: &[&str]) -> Server {
    std::fs::create_dir_all(dir.join("w1")).unwrap();
    let agents = [format!("w1=dir:{}", dir.join("w1").display())];
    let flags = [&["--agent-capacity", "w1:dir=10"][..], extra].concat();
    let server = Server::start_with(&dir.join("data"), None, "127.0.0.1:0", &agents, &flags);
    wait_registered(&server, "w1");
    server
}

/// A quota lowered to 0 for a kind ("none at all") while one of its principals holds one and another allocation
/// waits for a slot: `quota ls` must still show what is held and waits (it showed `none allowed`, 0 held, no
/// holder), and when the holder is released the waiter must not be made (the quota's pool kept its old count, so the
/// waiter got the freed slot and the principal held a `dir` under a maximum of 0).
#[test]
fn a_quota_lowered_to_zero_hands_no_freed_slot_to_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_room(dir.path(), &[]);
    let team_a = ["--issuer", "ci:team-a"];
    assert_eq!(code(&server.run(&["quota", "set", "team-a", "--max", "dir=1", "--principal", "ci:team-a"])), 0);
    let holder = server.json(&[&["allocate", "--agent", "w1", "--kind", "dir"][..], &team_a].concat());
    let holder = str_of(&holder, "ref").to_owned();
    server.wait_for(&["get", &holder], "the holder made", |r| r["state"] == "active");
    let waiter =
        server.json(&[&["allocate", "--agent", "w1", "--kind", "dir", "--wait", "5min"][..], &team_a].concat());
    let waiter = str_of(&waiter, "ref").to_owned();
    server.wait_for(&["quota", "ls"], "1 held, 1 waiting", |q| q[0]["kinds"][0]["waiting"] == 1);

    let zero = server.run(&["quota", "set", "team-a", "--max", "dir=0", "--principal", "ci:team-a"]);
    assert_eq!(code(&zero), 0, "{}", text_of(&zero));
    let mut wrong = Vec::new();
    let quotas = server.json(&["quota", "ls"]);
    let dir_use = &quotas[0]["kinds"][0];
    if dir_use["held"] != 1 || dir_use["pool_slots"] != 0 {
        wrong.push(format!("quota ls after lowering to 0 hides what is held, or the pool is not closed: {dir_use:#}"));
    }
    // Nothing will come for the waiter: it is released over quota at once, wait or not.
    let released = server.wait_for(&["get", &waiter], "the waiter released", |r| r["state"] != "pending");
    let said = released.to_string();
    if !said.contains("\"over-quota\"") {
        wrong.push(format!("the waiter's release does not name the quota: {released:#}"));
    }

    assert_eq!(code(&server.run(&["release", &holder])), 0);
    server.wait_for(&["get", &holder], "the holder destroyed", |r| r["state"] == "destroyed");
    let decided = server.wait_for(&["get", &waiter], "the waiter decided", |r| {
        r["state"] != "pending" || r["claims"][0]["status"] != "wanted"
    });
    if decided["state"] == "active" || decided["claims"][0]["status"] == "bound" {
        wrong.push(format!("a waiter got a slot of a quota whose maximum is 0: {decided:#}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A placement with `--wait` by a principal whose quota allows none of the kind is made and released in the same
/// commit; `allocate` must not print its reference and exit 0 as if it were placed (it skipped following the commit
/// whenever a wait was given).
#[test]
fn a_placement_with_a_wait_released_at_its_commit_is_not_reported_placed() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_room(dir.path(), &[]);
    assert_eq!(code(&server.run(&["quota", "set", "team-a", "--max", "dir=0", "--principal", "ci:team-a"])), 0);
    let placed = server.run(&["allocate", "--kind", "dir", "--wait", "30s", "--issuer", "ci:team-a"]);
    assert_eq!(code(&placed), 1, "{}", text_of(&placed));
    assert!(text(&placed.stderr).contains("quota team-a allows no dir"), "{}", text_of(&placed));
}

/// `quota rm` while an allocation waits for a slot of the quota's pool: the principal's new allocations claim no
/// slot at once, so the one that waited must not go on waiting for a quota that no longer exists (it stayed
/// `pending` until a holder freed a slot or its wait ran out, behind allocations made after it).
#[test]
fn a_removed_quota_leaves_no_allocation_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_room(dir.path(), &[]);
    let team_a = ["--issuer", "ci:team-a"];
    assert_eq!(code(&server.run(&["quota", "set", "team-a", "--max", "dir=1", "--principal", "ci:team-a"])), 0);
    let holder = server.json(&[&["allocate", "--agent", "w1", "--kind", "dir"][..], &team_a].concat());
    server.wait_for(&["get", str_of(&holder, "ref")], "the holder made", |r| r["state"] == "active");
    let waiter =
        server.json(&[&["allocate", "--agent", "w1", "--kind", "dir", "--wait", "5min"][..], &team_a].concat());
    let waiter = str_of(&waiter, "ref").to_owned();
    server.wait_for(&["quota", "ls"], "1 waiting", |q| q[0]["kinds"][0]["waiting"] == 1);

    assert_eq!(code(&server.run(&["quota", "rm", "team-a"])), 0);
    let later = server.json(&[&["allocate", "--agent", "w1", "--kind", "dir"][..], &team_a].concat());
    server.wait_for(&["get", str_of(&later, "ref")], "a later allocation made", |r| r["state"] == "active");
    server.wait_for(&["get", &waiter], "the earlier waiter no longer waiting for the removed quota", |r| {
        r["state"] != "pending"
    });
}

/// `policy show` and `policy set` against a gateway with `--tokens`, given a token: they sent none (the gateway
/// refused them: "refused the request without a token"), so an operator of such a gateway could not see or change
/// the policy from the command line.
#[test]
fn policy_commands_send_the_gateway_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "op:admin admintoken-0123456789abcdef\n").unwrap();
    // No agent: only the policy matters here (and `wait_registered` asks without a token).
    let server =
        Server::start_with(&dir.path().join("data"), None, "127.0.0.1:0", &[], &["--tokens", tokens.to_str().unwrap()]);
    let token = ["--gateway-token", "admintoken-0123456789abcdef"];
    let quotas = server.run(&[&["quota", "ls"][..], &token].concat());
    assert_eq!(code(&quotas), 0, "quota ls sends the token: {}", text_of(&quotas));
    let show = server.run(&[&["policy", "show"][..], &token].concat());
    assert_eq!(code(&show), 0, "{}", text_of(&show));
    let set = server.run(&[&["policy", "set", "--claim-cooldown", "1s"][..], &token].concat());
    assert_eq!(code(&set), 0, "{}", text_of(&set));
}

/// A principal or kind that the command line refuses is named in its error escaped: a bidi override (U+202E) or an
/// escape sequence in `--principal` must not reach the terminal (clap's own `invalid value '...'` echoed it raw).
#[test]
fn a_refused_principal_is_echoed_escaped() {
    let output = Command::new(BIN)
        .args(["quota", "set", "t", "--max", "dir=1", "--principal", "ci:\u{1b}]0;owned\u{7}x\u{202e}lave"])
        .output()
        .expect("run");
    assert_eq!(code(&output), 2, "{}", text_of(&output));
    let stderr = text(&output.stderr);
    assert!(!stderr.contains(['\u{1b}', '\u{7}', '\u{202e}']), "raw control characters on stderr: {stderr:?}");
}

/// Quota `a` limiting kind `b-c` counts with the pool `quota-a-b-c`, which is already quota `a-b`'s pool for kind
/// `c`. The partitions refuse the second quota, but `quota set` changed the pool first: quota `a-b` then allowed 100
/// `c` instead of 1, through a command that was refused. A refused `quota set` must leave the other quota's pool as
/// it was (checked before any pool is touched).
#[test]
fn a_refused_quota_set_does_not_change_another_quota_s_pool() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_w1_with_room(dir.path(), &[]);
    assert_eq!(code(&server.run(&["quota", "set", "a-b", "--max", "c=1", "--principal", "ci:ab"])), 0);
    let clash = server.run(&["quota", "set", "a", "--max", "b-c=100", "--principal", "ci:a"]);
    assert_ne!(code(&clash), 0, "{}", text_of(&clash));
    let pools = server.json(&["pool", "ls"]);
    let pool = pools.as_array().unwrap().iter().find(|p| p["name"] == "quota-a-b-c").expect("quota a-b's pool");
    assert_eq!(pool["kind"]["slots"]["count"], 1, "quota a-b's pool was changed by a refused quota set: {pool:#}");
}

/// `demo --help` offers `--hold`; `demo --hold` tells the story, says where the operator's view is and that the
/// services stay up, serves `/ui` there until interrupted (SIGINT, by its pid, as Ctrl-C sends), then stops them and
/// exits 0 with the story's end (the read models folded again match).
#[test]
fn the_demo_prints_the_operators_view_and_holds_the_services_until_interrupted() {
    let help = Command::new(BIN).args(["demo", "--help"]).output().expect("run leasehold demo --help");
    assert!(help.status.success(), "{}", text(&help.stderr));
    let help = text(&help.stdout);
    assert!(help.contains("--hold") && help.contains("until Ctrl-C"), "{help}");

    let mut child = Command::new(BIN)
        .args(["demo", "--hold"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn leasehold demo --hold");
    let guard = Killed(child.id());
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let next_line = |what: &str, seen: &mut Vec<String>| -> String {
        let line = lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}; so far:\n{}", seen.join("\n")));
        seen.push(line.clone());
        line
    };
    // The address comes first, while the story runs.
    let first = next_line("the operator's view", &mut seen);
    let ui = first
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:") && w.ends_with("/ui"))
        .unwrap_or_else(|| panic!("the first line names no /ui address: {first}"))
        .to_owned();
    while !next_line("the story's end", &mut seen).contains("the services stay up until Ctrl-C") {}
    let again = next_line("the address again", &mut seen);
    assert!(again.contains(&ui), "{again} (said first: {ui})");

    let address = ui.trim_start_matches("http://").trim_end_matches("/ui");
    let answer = http_get(address, "/ui");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("Overview") && answer.contains("w1") && answer.contains("w2"), "{answer}");

    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("run kill");
    assert!(sent.success(), "kill -INT: {sent}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("ask whether the demo runs") {
            break status;
        }
        assert!(Instant::now() < deadline, "the demo did not stop within 60s of SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::mem::forget(guard);
    reader.join().expect("the reader thread");
    seen.extend(lines.try_iter());
    let all = seen.join("\n");
    assert!(status.success(), "{status}\n{all}");
    assert!(all.contains("interrupted: the services stop"), "{all}");
    assert!(all.contains("folding them from scratch gives the same read models: yes"), "{all}");
}

/// Kills the process of this pid when dropped (a test that fails half-way leaves nothing running).
struct Killed(u32);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

/// The chaos harness's fault points (feature `fault-points`, on in this crate's tests through its dev-dependency on
/// itself): `serve` reads the `LEASEHOLD_FAULT_*` variables before it opens anything, refuses a bad one, and with
/// `SPLIT_BUDGET=1` and `CRASH_AFTER_PART=1` aborts between the parts of an agent's retirement, saying so on stderr.
#[test]
fn serve_reads_the_fault_points_and_crashes_between_two_parts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let refused = Command::new(BIN)
        .args(["serve", "--partitions", "1", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env("LEASEHOLD_FAULT_CRASH_AFTER_PART", "0")
        .output()
        .expect("run serve");
    assert_eq!(code(&refused), 2, "{}", text_of(&refused));
    assert!(
        text(&refused.stderr).contains("LEASEHOLD_FAULT_CRASH_AFTER_PART=\"0\": not a whole number of at least 1"),
        "{}",
        text_of(&refused)
    );
    assert!(!data.join("log.redb").exists(), "nothing was opened");

    let root = dir.path().join("w1");
    std::fs::create_dir_all(&root).unwrap();
    let agents = [format!("w1=dir:{}", root.display())];
    let mut command = Server::command(&data, None, "127.0.0.1:0", &agents, &[]);
    command.env("LEASEHOLD_FAULT_SPLIT_BUDGET", "1").env("LEASEHOLD_FAULT_CRASH_AFTER_PART", "1");
    let (lines_tx, lines) = mpsc::channel();
    let mut server = Server::launch(command, Some(lines_tx));
    wait_registered(&server, "w1");
    for _ in 0..2 {
        let made = server.json(&["allocate", "--agent", "w1", "--kind", "dir"]);
        let reference = str_of(&made, "ref").to_owned();
        server.wait_for(&["get", &reference], "the resource created", |r| r["state"] == "active");
    }
    // Its answer may never come: the process dies under it.
    let _ = server.run(&["agent", "retire", "w1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait for serve") {
            break status;
        }
        assert!(Instant::now() < deadline, "serve did not crash within 30 s of the retirement");
        std::thread::sleep(Duration::from_millis(50));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(6), "aborted (SIGABRT), as kill -9 would end it: {status:?}");
    // Every line, up to the end of its stderr (the reader stops there).
    let mut said = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        said.push(line);
    }
    assert!(
        said.iter().any(|l| l
            == "leasehold serve: test-only fault points armed: LEASEHOLD_FAULT_SPLIT_BUDGET=1 \
                LEASEHOLD_FAULT_CRASH_AFTER_PART=1"),
        "{said:#?}"
    );
    let crashes: Vec<&String> = said.iter().filter(|l| l.starts_with("fault point: ")).collect();
    assert_eq!(crashes.len(), 1, "{said:#?}");
    assert!(
        crashes[0].starts_with("fault point: crash after part 1 of the decision of command ")
            && crashes[0].rsplit_once(" on partition ").is_some_and(|(_, p)| p.parse::<u32>().is_ok_and(|p| p < 4)),
        "{}",
        crashes[0]
    );
}

/// `bench takeover` runs end to end on a real server: its worker processes are killed and paused, and every partition
/// of each dead worker's share is found taken over (its figures are a benchmark's, never asserted here).
#[test]
fn bench_takeover_kills_its_workers_and_finds_every_partition_taken_over() {
    let Some(nats) = leasehold_log::nats_server::NatsServer::start() else { return };
    let output = Command::new(BIN)
        .args(["bench", "takeover", "--nats", nats.url(), "--partitions", "4", "--kills", "2", "--pauses", "1"])
        .args(["--pause", "200ms", "--rate", "10", "--live", "5"])
        .output()
        .expect("run bench takeover");
    let text = text_of(&output);
    assert!(output.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let figures: Value = serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("JSON");
    // Two kills, one of each worker: between them, every partition was some dead worker's share once.
    assert_eq!(figures["takeovers"], 4, "{figures}");
    assert_eq!(figures["takeovers_missed"], 0, "{figures}");
    assert_eq!(figures["kills"], 2, "{figures}");
    assert!(figures["takeover_p99_s"].as_f64().is_some_and(|s| s > 0.0), "{figures}");
}
