//! The command line as its help and the README read it, through the real binary: the source flags go before or
//! after the subcommand, and a command line without exactly one source exits 2 saying what to give.

use std::path::Path;
use std::process::{Command, Output};

use leasehold_replay::bench::{GenConfig, generate};
use leasehold_schemas::ids::Timestamp;

fn replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold-replay")).args(args).output().expect("leasehold-replay runs")
}

#[track_caller]
fn succeeded(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON value on stdout")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

#[tokio::test(flavor = "multi_thread")]
async fn source_flags_go_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("small.lhexport");
    let config = GenConfig {
        outcomes: 300,
        partitions: 2,
        agents_per_partition: 2,
        resources_per_agent: 2,
        seed: 3,
        start: Timestamp(1_800_000_000_000),
        ms_per_command: None,
        horizon: None,
    };
    generate(&config, &file).await.expect("a generated log");
    let (after, before) = (dir.path().join("after"), dir.path().join("before"));

    // `import FILE --data DIR`, the README's own form, and `--data DIR import FILE`.
    let imported = succeeded(&replay(&["import", path(&file), "--data", path(&after), "--output", "json"]));
    assert_eq!(imported["trailer"]["outcomes"], 300);
    succeeded(&replay(&["--data", path(&before), "--output", "json", "import", path(&file)]));

    for data in [&after, &before] {
        let verified = succeeded(&replay(&["verify", "--data", path(data), "--output", "json"]));
        assert_eq!(verified["ok"], true, "{verified}");
        assert_eq!(verified["report"]["outcomes"], 300);
        let verified = succeeded(&replay(&["--output", "json", "--data", path(data), "verify"]));
        assert_eq!(verified["ok"], true, "{verified}");
    }
    // --file after a subcommand that takes its own flags too.
    let state = succeeded(&replay(&["state", "--at", "10", "--file", path(&file), "--output", "json"]));
    assert!(state.is_object(), "{state}");
}

#[test]
fn a_command_line_without_exactly_one_source_exits_2_saying_what_to_give() {
    for args in [&["verify"][..], &["--output", "json", "verify"], &["history", "w1"]] {
        let out = replay(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("say which log to read: one of --data DIR, --nats URL"), "{args:?}: {stderr}");
    }
    let out = replay(&["--file", "a.lhexport", "verify", "--data", "b"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--data DIR, --file FILE name several logs"), "{stderr}");
    let out = replay(&["verify", "--data", "b", "--creds", "c.creds"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--creds is a NATS credential: it needs --nats URL"), "{stderr}");
}
