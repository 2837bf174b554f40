//! No terminal injection through `leasehold-replay`: a log whose commands carry control and bidi characters (a
//! holder, an attribute, a release reason) is shown escaped by `history`, `state` and `why` — nothing a terminal
//! would act on reaches stdout — while `--output json` keeps every value exact.

mod support;

use leasehold_domain::driver::Driver;
use leasehold_log::export::{self};
use leasehold_replay::why::{Answer, Event, Holding};
use leasehold_schemas::command::{Acquire, Allocate, Register, Release, SyncReport};
use leasehold_schemas::ids::Timestamp;
use leasehold_schemas::text::is_unsafe_for_display;
use leasehold_schemas::{AgentName, ResourceId};
use serde_json::Value;
use support::DriverLog;

/// ESC and a colour, a carriage return, a C1 CSI, a right-to-left override.
const EVIL: &str = "x\u{1b}[31mRED\rFAKE\u{9b}2J\u{202e}";
/// [`EVIL`] as text lines show it.
const EVIL_SHOWN: &str = "x\\x1b[31mRED\\rFAKE\\u{9b}2J\\u{202e}";
/// [`EVIL`] inside JSON shown to people: JSON escapes, the same value.
const EVIL_JSON: &str = r#""x\u001b[31mRED\rFAKE\u009b2J\u202e""#;

/// `leasehold-replay --file FILE ARGS...`: its stdout, once it succeeded.
fn replay(file: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-replay"))
        .args(["--file", file.to_str().expect("a UTF-8 path")])
        .args(args)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[track_caller]
fn shown_safely(what: &str, text: &str) {
    assert!(!text.replace('\n', "").contains(is_unsafe_for_display), "{what} prints a raw control: {text:?}");
}

#[tokio::test]
async fn history_and_state_show_what_producers_wrote_escaped() {
    let mut log = DriverLog { driver: Driver::new(0, 1, Timestamp(1_790_000_000_000)), entries: Vec::new(), prev: 0 };
    let agent = AgentName::new("w1").expect("a name");
    let incarnation = leasehold_schemas::Uuid::from_u128(1);
    log.submit("w1", Register::new(agent.clone(), incarnation));
    let epoch = log.driver.state().agent(&agent).expect("registered").epoch;
    let resource: ResourceId = log.driver.new_resource_id();
    let attributes = [("note".to_owned(), EVIL.to_owned())].into();
    let allocate = Allocate {
        agent: agent.clone(),
        resource,
        kind: "dir".into(),
        capacity: 2,
        attributes,
        parent: None,
        pools: vec![],
        wait: None,
    };
    log.submit("op:ci", allocate);
    let mut report = SyncReport::new(agent.clone(), epoch, 1, log.driver.state().last_position());
    report.created = vec![resource];
    log.submit("w1", report);
    let lease = log.driver.new_lease_id();
    log.submit(
        "op:ci",
        Acquire {
            agent: agent.clone(),
            resource,
            lease,
            holder: EVIL.into(),
            ttl: None,
            wait_timeout: None,
            priority: 0,
        },
    );
    let after_acquire = log.prev;
    log.submit("op:ci", Release { agent: agent.clone(), resource, reason: Some(EVIL.into()) });

    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("evil.lhx");
    let header = export::Header::new(leasehold_domain::DECIDER_VERSION, 1, log.prev, "test");
    let out = tokio::fs::File::create(&file).await.expect("a new file");
    let mut writer = export::Writer::new(tokio::io::BufWriter::new(out), &header).await.expect("a writer");
    for entry in &log.entries {
        writer.write(entry).await.expect("written");
    }
    writer.finish().await.expect("finished");

    let target = format!("w1.{resource}");
    let history = replay(&file, &["history", &target]);
    shown_safely("history", &history);
    assert!(history.contains(&format!(r#""holder":{EVIL_JSON}"#)), "the grant's effect: {history}");
    assert!(history.contains(&format!(r#""reason":{EVIL_JSON}"#)), "the release's effect: {history}");
    let rows: Value = serde_json::from_str(&replay(&file, &["--output", "json", "history", &target])).expect("JSON");
    let effects: Vec<&str> = rows
        .as_array()
        .expect("rows")
        .iter()
        .flat_map(|r| r["effects"].as_array().expect("effects"))
        .filter_map(Value::as_str)
        .collect();
    let exact = serde_json::to_string(EVIL).expect("JSON");
    assert!(effects.iter().any(|e| e.contains(&format!(r#""holder":{exact}"#))), "JSON keeps the effect: {effects:?}");

    let at = after_acquire.to_string();
    let state = replay(&file, &["state", "--at", &at]);
    shown_safely("state", &state);
    assert!(state.contains(EVIL_SHOWN), "the lease's holder: {state}");
    let state: Value = serde_json::from_str(&replay(&file, &["--output", "json", "state", "--at", &at])).expect("JSON");
    assert_eq!(state["leases"][0]["holder"], EVIL, "{state:#}");
}

#[test]
fn why_shows_holders_and_details_escaped() {
    let event = |seq: u64, detail: &str| Event {
        seq,
        time: "2026-09-21T11:06:40.007Z".into(),
        time_ms: 1_790_000_000_007,
        command: "op.release".into(),
        command_id: "019b76da-abe8-7001-8000-000000000001".into(),
        issuer: "op:ci".into(),
        correlation_id: None,
        detail: detail.into(),
    };
    let mut holding =
        Holding::new("ips".into(), "10.20.0.7".into(), format!("w1.{EVIL}"), event(3, "10.20.0.7 granted to w1.x"));
    holding.releasing = Some(event(9, &format!("releasing: released by op:ci: {EVIL}")));
    let answer =
        Answer { value: "10.20.0.7".into(), pool: Some("ips".into()), at: None, holdings: vec![holding], before: None };
    let text = leasehold_replay::why::render(&answer);
    shown_safely("why", &text);
    assert!(text.contains(&format!("held by w1.{EVIL_SHOWN} from outcome 3")), "{text}");
    assert!(text.contains(&format!("releasing: released by op:ci: {EVIL_SHOWN}\n")), "{text}");
}
