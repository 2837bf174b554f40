//! The command line as people use it, end to end over a real nats-server: producer commands say what changed in
//! words, a command whose end state already holds (a second release, an unpause of what is not paused) exits 0 and
//! says so, `ls` and `leases` filter by attribute and holder on the gateway and page through it by key (the HTTP API's
//! `Link` header, the CLI's `--limit`/`--after`), a record that ended is hidden once `--list-ended-for` has passed
//! unless `--all`, `ls --watch` draws the list again as outcomes land; and a `publish` whose gateway goes away half-way prints one summary and the command that sends the
//! rest, which then stores each command once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_schemas::{Envelope, ResourceId, codec};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use crate::api::{Api, agent_name, allocate, wait_agent, wait_resource};
use crate::nats::NatsRun;
use crate::support::{Proc, Ran, run_cli};

/// `leasehold-e2e --server SERVER ARGS...` in `run`'s directory.
async fn lh(run: &NatsRun, server: &str, args: &[&str]) -> Ran {
    let mut argv = vec!["--server", server];
    argv.extend_from_slice(args);
    run_cli(run.path(), &argv, &[]).await
}

fn json(ran: &Ran) -> Value {
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {ran:?}"))
}

/// Whether `text` holds no run of 13 digits (a unix time in milliseconds, 2001 to 2286).
fn no_epoch_ms(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_digit()).all(|run| run.len() != 13)
}

fn refs(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|r| r["ref"].as_str().or(r["id"].as_str()).expect("a reference").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_commands_say_what_changed_and_lists_filter_and_page_on_the_gateway() {
    let Some(run) = NatsRun::start("cli", 4) else { return };
    let mut serve = run.serve("serve", &["--list-ended-for", "2s"]);
    let server = serve.ready().await;
    let agent = run.agent("w1", &[]);
    let api = Api::new(server.clone());
    wait_agent(&api, "w1", |a| a.status == "live", &[&serve, &agent]).await;

    // Allocations print the reference on stdout and what changed, in words, on stderr.
    let mut made = Vec::new();
    for team in ["ci", "ci", "web"] {
        let attr = format!("team={team}");
        let ran = lh(&run, &server, &["allocate", "--agent", "w1", "--kind", "dir", "--attr", &attr]).await;
        assert_eq!(ran.code, Some(0), "{ran:?}");
        let reference = ran.stdout.trim().to_owned();
        let said = format!("allocated {reference}: dir, pending; w1 is asked to create it\n");
        assert_eq!(ran.stderr, said, "{ran:?}");
        made.push(reference);
    }
    for reference in &made {
        wait_resource(&api, reference, |r| r.state == "active", &[&serve, &agent]).await;
    }
    let [r1, r2, r3] = [&made[0], &made[1], &made[2]];

    let ran = lh(&run, &server, &["acquire", r1, "--holder", "build-1", "--ttl", "10min"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stderr.contains(&format!("granted to build-1 on {r1} until ")), "{ran:?}");
    assert!(ran.stderr.ends_with(")\n") && ran.stderr.lines().count() == 1, "one line of words: {ran:?}");
    assert!(ran.stderr.contains("(in 10 min)") || ran.stderr.contains("(in 9 min)"), "{ran:?}");
    assert!(no_epoch_ms(&ran.stdout) && ran.stdout.contains("(in "), "times in words: {ran:?}");

    // Words, not effects; the end state already holding is not a failure.
    let ran = lh(&run, &server, &["pause", r2, "--reason", "disk"]).await;
    assert_eq!((ran.code, ran.stdout.trim()), (Some(0), &*format!("{r2} paused until unpaused (disk)")), "{ran:?}");
    // A pause carries why and until when: the one in force may not be the one asked for, so it stays a refusal.
    let ran = lh(&run, &server, &["pause", r2]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains(&format!("rejected (already-done): resource {r2} is already paused")), "{ran:?}");
    let ran = lh(&run, &server, &["unpause", r3]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.contains(": not paused: "), "{ran:?}");
    let ran = lh(&run, &server, &["release", r3]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert_eq!(ran.stdout.trim(), format!("{r3} releasing: w1 is asked to destroy it"), "{ran:?}");
    let ran = lh(&run, &server, &["release", r3]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stdout.starts_with(&format!("release {r3}: already released: resource {r3} is already ")), "{ran:?}");
    let ran = lh(&run, &server, &["--output", "json", "release", r3]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let status = json(&ran);
    assert_eq!(
        (status["status"].as_str(), status["rejection"]["kind"].as_str()),
        (Some("rejected"), Some("already-done"))
    );
    // Not the state asked for: a rejection as before.
    let ran = lh(&run, &server, &["unpause", r3]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("rejected (invalid-state)"), "{ran:?}");
    wait_resource(&api, r3, |r| r.state == "destroyed", &[&serve, &agent]).await;

    // Filters on the gateway: attributes (all of them), holders.
    let ran = lh(&run, &server, &["--output", "json", "ls", "--attr", "team=ci"]).await;
    assert_eq!(refs(&json(&ran)), vec![r1.clone(), r2.clone()], "{ran:?}");
    let ran = lh(&run, &server, &["--output", "json", "ls", "--attr", "team=ci", "--attr", "team=web"]).await;
    assert_eq!(refs(&json(&ran)), Vec::<String>::new(), "{ran:?}");
    let ran = lh(&run, &server, &["--output", "json", "ls", "--holder", "build-1"]).await;
    assert_eq!(refs(&json(&ran)), vec![r1.clone()], "{ran:?}");
    let ran = lh(&run, &server, &["--output", "json", "leases", "--holder", "build-1", "--attr", "team=ci"]).await;
    let leases = json(&ran);
    assert_eq!((leases.as_array().map(Vec::len), leases[0]["resource"].as_str()), (Some(1), Some(&r1[..])), "{leases}");
    let ran = lh(&run, &server, &["--output", "json", "leases", "--holder", "build-2"]).await;
    assert_eq!(json(&ran), serde_json::json!([]), "{ran:?}");
    let ran = lh(&run, &server, &["ls", "--holder", "build-1"]).await;
    assert!(ran.stdout.lines().nth(1).is_some_and(|row| row.ends_with(" ago") || row.ends_with("just now")), "{ran:?}");
    let ran = lh(&run, &server, &["get", r1]).await;
    assert!(no_epoch_ms(&ran.stdout) && (ran.stdout.contains(" ago)") || ran.stdout.contains("(just now)")), "{ran:?}");

    // Keyset pages over the HTTP API: in reference order, each after the last, the next named by `Link`.
    let mut sorted = made.clone();
    sorted.sort();
    let http = reqwest::Client::new();
    let (mut paged, mut url) = (Vec::new(), format!("{server}/v1/resources?limit=1&all=true"));
    loop {
        let response = http.get(&url).send().await.expect("GET a page");
        assert_eq!(response.status(), 200, "{url}");
        let link = response.headers().get("link").map(|v| v.to_str().expect("ASCII").to_owned());
        let page: Value = response.json().await.expect("a JSON page");
        assert!(page.as_array().is_some_and(|p| p.len() <= 1), "{page}");
        paged.extend(refs(&page));
        let Some(link) = link else { break };
        let target = link.split_once('<').and_then(|(_, rest)| rest.split_once('>')).expect("<target>").0;
        assert!(target.starts_with("/v1/resources?") && link.ends_with("rel=\"next\""), "{link}");
        url = format!("{server}{target}");
        assert!(paged.len() <= made.len(), "pages go on past the records: {paged:?}");
    }
    assert_eq!(paged, sorted, "every resource once, in reference order");
    let ran = lh(&run, &server, &["ls", "--all", "--limit", "2"]).await;
    assert_eq!((ran.code, ran.stdout.lines().count()), (Some(0), 3), "a header and two rows: {ran:?}");
    let next = ran.stderr.split("--after ").nth(1).map(str::trim).unwrap_or_else(|| panic!("no next: {ran:?}"));
    assert_eq!(next, sorted[1]);
    let ran = lh(&run, &server, &["--output", "json", "ls", "--all", "--limit", "2", "--after", next]).await;
    assert_eq!(refs(&json(&ran)), vec![sorted[2].clone()], "{ran:?}");

    // A resource that ended is listed until --list-ended-for (2 s here) has passed, then only with --all.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ran = lh(&run, &server, &["--output", "json", "ls"]).await;
        if !refs(&json(&ran)).contains(r3) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{r3} still listed: {ran:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ran = lh(&run, &server, &["--output", "json", "ls", "--all", "--state", "destroyed"]).await;
    assert_eq!(refs(&json(&ran)), vec![r3.clone()], "{ran:?}");
    let ran = lh(&run, &server, &["--output", "json", "ls"]).await;
    assert_eq!(refs(&json(&ran)), vec![r1.clone(), r2.clone()], "{ran:?}");

    // `ls --watch`: the list again whenever the event feed reports an outcome (json: one array a line).
    let argv = ["--server", &server, "--output", "json", "ls", "--watch", "--attr", "team=ops"];
    let mut watch = Proc::spawn(run.path(), "watch", &argv);
    let drawn = |watch: &Proc, wanted: &dyn Fn(&Value) -> bool| {
        watch.stdout().lines().any(|line| serde_json::from_str::<Value>(line).is_ok_and(|list| wanted(&list)))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !drawn(&watch, &|list| list == &serde_json::json!([])) {
        assert!(tokio::time::Instant::now() < deadline, "no first drawing: {}", watch.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran = lh(&run, &server, &["allocate", "--agent", "w1", "--kind", "dir", "--attr", "team=ops"]).await;
    let r4 = ran.stdout.trim().to_owned();
    while !drawn(&watch, &|list| refs(list) == vec![r4.clone()] && list[0]["state"] == "active") {
        assert!(tokio::time::Instant::now() < deadline, "{r4} not drawn active: {}", watch.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.kill9();

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}

/// What the proxy counts: the start of a batch request.
const BATCH_REQUEST: &[u8] = b"POST /v1/commands/batch ";

/// A TCP proxy to `target` that passes the first batch request (and its answer) through and, at the start of the
/// second, either cuts everything (`stall` false: every connection closed before that request reaches the gateway,
/// and the proxy stops listening: the gateway "goes away" half-way through a publish) or holds it (`stall` true: the
/// request never arrives and no answer comes, as from a gateway that hangs). `second` is cancelled then.
async fn cutting_proxy(target: String, stall: bool) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let address = listener.local_addr().expect("its address").to_string();
    let (cut, seen) = (CancellationToken::new(), Arc::new(AtomicUsize::new(0)));
    let second = cut.clone();
    tokio::spawn(async move {
        loop {
            let (client, _) = tokio::select! {
                () = cut.cancelled(), if !stall => break,
                accepted = listener.accept() => accepted.expect("accept"),
            };
            let server = tokio::net::TcpStream::connect(&target).await.expect("connect to the gateway");
            tokio::spawn(pipe(client, server, seen.clone(), cut.clone(), stall));
        }
    });
    (address, second)
}

async fn pipe(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    seen: Arc<AtomicUsize>,
    cut: CancellationToken,
    stall: bool,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let up = async {
        let (mut buf, mut tail) = (vec![0u8; 64 * 1024], Vec::new());
        loop {
            let n = from_client.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            let mut window = std::mem::take(&mut tail);
            let old = window.len();
            window.extend_from_slice(&buf[..n]);
            // Starts of batch requests that end in the new bytes (one split across two reads is found once).
            let found = window
                .windows(BATCH_REQUEST.len())
                .enumerate()
                .filter(|(at, w)| *w == BATCH_REQUEST && at + BATCH_REQUEST.len() > old);
            let found = found.count();
            if found > 0 && seen.fetch_add(found, Ordering::SeqCst) + found >= 2 {
                cut.cancel();
                if stall {
                    // Hold the connection open, forwarding nothing, until the client goes.
                    while from_client.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                }
                return;
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                return;
            }
            tail = window[window.len().saturating_sub(BATCH_REQUEST.len() - 1)..].to_vec();
        }
    };
    let down = tokio::io::copy(&mut from_server, &mut to_client);
    tokio::select! {
        () = up => {}
        _ = down => {}
        () = cut.cancelled(), if !stall => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_cut_short_prints_one_summary_and_the_command_that_sends_the_rest() {
    let Some(run) = NatsRun::start("publish-cut", 4) else { return };
    let mut serve = run.serve("serve", &[]);
    let server = serve.ready().await;
    let (proxy, _) = cutting_proxy(server.trim_start_matches("http://").to_owned(), false).await;

    // 2,500 commands: three batches (1,000, 1,000, 500); the second starts at line 1,002 of the file.
    let w1 = agent_name("w1");
    let envelopes: Vec<Envelope> = (0..2500).map(|_| allocate(&w1, ResourceId::generate())).collect();
    let mut file = String::from("# 2,500 allocations\n");
    for envelope in &envelopes {
        file.push_str(&codec::command_to_json(envelope).expect("JSON"));
        file.push('\n');
    }
    let path = run.path().join("allocations.ndjson");
    std::fs::write(&path, &file).expect("write the file");
    let path = path.display().to_string();

    let ran = run_cli(run.path(), &["--server", &format!("http://{proxy}"), "publish", "--file", &path], &[]).await;
    assert_eq!(ran.code, Some(3), "{ran:?}\n{}", serve.tail());
    assert!(ran.stdout.is_empty(), "one summary, no line per command: {}", ran.stdout);
    assert!(ran.stderr.lines().count() < 6, "one summary: {}", ran.stderr);
    assert!(ran.stderr.contains("publish stopped, ") && ran.stderr.contains("of 2500 command(s)"), "{}", ran.stderr);
    assert!(ran.stderr.contains(": 1000 stored (0 of them duplicates"), "{}", ran.stderr);
    assert!(ran.stderr.contains(" not sent"), "{}", ran.stderr);
    let resend = format!("publish --file {path} --from-line 1002");
    assert!(ran.stderr.contains(&resend), "{}", ran.stderr);

    // The rest, as the summary says (straight to the gateway now): each command of the file is stored once.
    let ran = run_cli(
        run.path(),
        &["--server", &server, "--output", "json", "publish", "--file", &path, "--from-line", "1002"],
        &[],
    )
    .await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let rest = json(&ran);
    assert_eq!(rest.as_array().map(Vec::len), Some(1500));
    assert_eq!(rest[0]["line"], 1002, "{}", rest[0]);
    let log = run.log().await;
    let mut stored: BTreeMap<String, usize> = BTreeMap::new();
    for seq in 1..=leasehold_log::Log::last_command_seq(&log).await.expect("the last sequence") {
        if let Some(record) = leasehold_log::Log::command_at(&log, seq).await.expect("read the command log") {
            let envelope = codec::decode_command(&record.payload).expect("a command");
            *stored.entry(envelope.command_id.to_string()).or_default() += 1;
        }
    }
    for envelope in &envelopes {
        assert_eq!(stored.get(&envelope.command_id.to_string()), Some(&1), "{}", envelope.command_id);
    }

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}

/// Ctrl-C while a batch is on its way (the gateway, behind a proxy that holds the request, never answers): one
/// summary that counts that batch as maybe stored, and the command that sends the rest from its first line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_interrupted_by_ctrl_c_counts_the_batch_in_flight_and_says_how_to_go_on() {
    let Some(run) = NatsRun::start("publish-int", 4) else { return };
    let mut serve = run.serve("serve", &[]);
    let server = serve.ready().await;
    let (proxy, second) = cutting_proxy(server.trim_start_matches("http://").to_owned(), true).await;
    let w1 = agent_name("w1");
    let file: String = (0..1500)
        .map(|_| codec::command_to_json(&allocate(&w1, ResourceId::generate())).expect("JSON") + "\n")
        .collect();
    let path = run.path().join("allocations.ndjson");
    std::fs::write(&path, &file).expect("write the file");
    let path = path.display().to_string();

    let proxy_url = format!("http://{proxy}");
    let mut publish = Proc::spawn(run.path(), "publish", &["--server", &proxy_url, "publish", "--file", &path]);
    tokio::time::timeout(Duration::from_secs(20), second.cancelled())
        .await
        .unwrap_or_else(|_| panic!("the second batch was not sent: {}", publish.output()));
    publish.interrupt();
    let (status, _) = publish.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(3), "{}", publish.output());
    assert!(publish.stdout().is_empty(), "one summary, no line per command: {}", publish.output());
    let said = publish.log();
    assert!(
        said.contains("publish stopped, interrupted (Ctrl-C): of 1500 command(s), 1500 sent: 1000 stored"),
        "{said}"
    );
    assert!(said.contains("500 may not have been stored (the batch being sent when it stopped); 0 not sent"), "{said}");
    assert!(said.contains(&format!("--server {proxy_url} publish --file {path} --from-line 1001")), "{said}");

    serve.stop_cleanly().await;
    serve.assert_no_panic();
}
