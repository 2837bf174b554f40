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
    /// Starts `serve` on `data` with a free port and `agents` (`NAME=dir:PATH`), and returns once `/healthz` answers.
    fn start(data: &Path, agents: &[String]) -> Server {
        Server::start_on(data, None, agents)
    }

    /// [`Server::start`], over JetStream at `nats` if given.
    fn start_on(data: &Path, nats: Option<&str>, agents: &[String]) -> Server {
        std::fs::create_dir_all(data).expect("create the data directory");
        let mut command = Command::new(BIN);
        command.args(["serve", "--partitions", "4", "--listen", "127.0.0.1:0", "--data"]).arg(data);
        if let Some(nats) = nats {
            command.args(["--nats", nats, "--priority-timeout", "2s", "--ack-wait", "2s"]);
        }
        for agent in agents {
            command.arg("--agent").arg(agent);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn leasehold serve");
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
        server.wait_healthy(&address);
        server
    }

    /// Bounded retries of `GET /healthz` until it answers 200.
    fn wait_healthy(&self, address: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = TcpStream::connect(address).and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: leasehold\r\nConnection: close\r\n\r\n")?;
                let mut text = String::new();
                stream.read_to_string(&mut text)?;
                Ok(text)
            });
            match answer {
                Ok(text) if text.starts_with("HTTP/1.1 200") => return,
                other => {
                    assert!(Instant::now() < deadline, "/healthz at {address} never answered 200: {other:?}");
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

/// Registers agent `w2` and stops its process: afterwards `w2` is known but nobody creates what it is given, so its
/// resources stay `pending` and leases on them wait.
fn register_absent_agent(data: &Path) {
    std::fs::create_dir_all(data.join("w2")).unwrap();
    let server = Server::start(&data.join("data"), &[format!("w2=dir:{}", data.join("w2").display())]);
    server.wait_for(&["agents"], "w2 registered", |agents| {
        agents.as_array().is_some_and(|a| a.iter().any(|agent| agent["name"] == "w2"))
    });
}

#[test]
fn producer_and_query_commands_against_a_served_gateway() {
    let dir = tempfile::tempdir().unwrap();
    register_absent_agent(dir.path());
    std::fs::create_dir_all(dir.path().join("w1")).unwrap();
    let server = Server::start(&dir.path().join("data"), &[format!("w1=dir:{}", dir.path().join("w1").display())]);

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
