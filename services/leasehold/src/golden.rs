//! The command line's outputs as golden files: the tables and JSON of `ls`, `leases`, `agents`, `pool ls` and `get`,
//! and a producer command's words, rendered from fixed records (the gateway's JSON) with a fixed clock (UTC, a fixed
//! now), compared with `services/leasehold/tests/golden/`. A change to what people read shows in review as a change
//! of those files. `LH_BLESS=1` writes them again:
//!
//! ```text
//! LH_BLESS=1 cargo test -p leasehold --lib golden
//! ```

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::client::SeqOutcome;
use crate::output::{self, Clock, Zone};
use crate::query::{agents_table, leases_table, pools_table, resource_fields, resources_table};

/// 2026-01-01T00:10:00Z: ten minutes after the records' first times.
const NOW: u64 = 1_767_226_200_000;
const R1: &str = "w1.019b76da-9478-7111-9111-111111111111";
const R2: &str = "w1.019b76da-9478-7111-9111-222222222222";
const R3: &str = "w2.019b76da-9478-7111-9111-333333333333";
const L1: &str = "w1.019b76da-9860-7333-b333-333333333333";

fn clock() -> Clock {
    Clock::fixed(NOW, Zone::utc())
}

fn resources() -> Vec<Value> {
    vec![
        json!({"ref": R1, "agent": "w1", "id": &R1[3..], "kind": "container", "state": "active", "capacity": 2,
            "attrs": {"image": "alpine", "team": "ci"}, "parent": null, "upstream_suspect": false, "detail": null,
            "allocated_at": 1_767_225_600_000u64, "native_id": "d41d8cd9",
            "claims": [{"pool": "net1", "id": "10.88.0.7", "status": "bound", "token": 55}],
            "leases": [{"id": L1, "holder": "build-42", "state": "active"}], "terminal_at": null, "quarantined": null,
            "destroy_blocked": null, "state_since": 1_767_225_660_000u64, "created_seq": 40,
            "updated_at": 1_767_225_660_000u64, "as_of": 44}),
        json!({"ref": R2, "agent": "w1", "id": &R2[3..], "kind": "volume", "state": "releasing", "capacity": 1,
            "attrs": {"team": "web"}, "parent": null, "upstream_suspect": false,
            "detail": {"released": {"by": "op:alice", "reason": "done"}}, "allocated_at": 1_767_225_600_000u64,
            "native_id": null, "claims": [], "leases": [], "terminal_at": null, "quarantined": null,
            "destroy_blocked": {"detail": "volume in use by container 4f2a", "at": 1_767_226_080_000u64},
            "state_since": 1_767_226_020_000u64, "created_seq": 41, "updated_at": 1_767_226_080_000u64, "as_of": 50}),
        json!({"ref": R3, "agent": "w2", "id": &R3[3..], "kind": "dir", "state": "lost", "capacity": 1,
            "attrs": {}, "parent": R1, "upstream_suspect": false,
            "detail": {"found_missing_by": "w2", "observation": {"epoch": 3, "obs": 7}},
            "allocated_at": 1_767_225_600_000u64, "native_id": null, "claims": [], "leases": [],
            "terminal_at": 1_767_225_900_000u64,
            "quarantined": {"position": 61, "found_at": 1_767_226_140_000u64, "destroy_ordered": null,
                "released_by": null, "reason": null, "destroyed_at": null},
            "destroy_blocked": null, "state_since": 1_767_225_900_000u64, "created_seq": 42,
            "updated_at": 1_767_226_140_000u64, "as_of": 61}),
    ]
}

fn leases() -> Vec<Value> {
    vec![
        json!({"id": L1, "resource": R1, "holder": "build-42", "state": "active", "token": 57,
            "expires_at": 1_767_226_500_000u64, "wait_until": null, "ttl_ms": 600_000, "detail": null,
            "terminal_at": null, "as_of": 44}),
        json!({"id": "w1.019b76da-9860-7333-b333-444444444444", "resource": R2, "holder": "漢字ビルド",
            "state": "released", "token": null, "expires_at": null, "wait_until": null, "ttl_ms": null,
            "detail": null, "terminal_at": 1_767_226_000_000u64, "as_of": 48}),
        // The queue behind L1: a priority-2 lease that asked a minute ago, and one of priority 0 that has waited
        // three minutes (it ranks 3 now, so it comes first).
        json!({"id": "w1.019b76da-9860-7333-b333-555555555555", "resource": R1, "holder": "release-7",
            "state": "waiting", "token": null, "expires_at": null, "wait_until": 1_767_226_800_000u64,
            "ttl_ms": null, "detail": null, "terminal_at": null, "priority": 2,
            "requested_at": 1_767_226_140_000u64, "requested_pos": 61, "granted_at": null, "as_of": 61}),
        json!({"id": "w1.019b76da-9860-7333-b333-666666666666", "resource": R1, "holder": "nightly",
            "state": "waiting", "token": null, "expires_at": null, "wait_until": 1_767_227_000_000u64,
            "ttl_ms": null, "detail": null, "terminal_at": null, "priority": 0,
            "requested_at": 1_767_226_020_000u64, "requested_pos": 58, "granted_at": null, "as_of": 58}),
    ]
}

fn agents() -> Vec<Value> {
    vec![
        json!({"name": "w1", "status": "live", "epoch": 3, "last_seen": 1_767_226_190_000u64, "resources": 2,
            "held": 1, "retired": false, "quarantined": 0, "driver": {"available": true, "detail": null},
            "capacity": {"container": 50, "volume": 200}, "used": {"container": 1, "volume": 1},
            "cordon": {"by": "op:alice", "reason": "kernel upgrade", "since": 1_767_225_900_000u64}}),
        json!({"name": "w2", "status": "suspect", "epoch": 1, "last_seen": 1_767_225_000_000u64, "resources": 1,
            "held": 0, "retired": false, "quarantined": 1,
            "driver": {"available": false, "detail": "the root /srv/w2 is not mounted"},
            "breaker": {"would_lose": 12, "live": 20, "tripped_at": 1_767_225_960_000u64}}),
    ]
}

fn pools() -> Vec<Value> {
    vec![
        json!({"name": "net1", "kind": {"ipv4": {"network": "10.88.0.0", "prefix_len": 24, "exclude": ["10.88.0.1"]}},
            "cooldown_ms": 2000, "orphans": "hold", "held": 1, "waiting": 0, "cooling": 1}),
        json!({"name": "gpus", "kind": {"slots": {"count": 4}}, "cooldown_ms": 0, "orphans": "release", "held": 0, "waiting": 2,
            "cooling": 0}),
    ]
}

/// The one resource `get` shows, with what it waits on (as `GET /v1/resources/{ref}` answers).
fn got() -> Value {
    let mut record = resources().swap_remove(1);
    record["waiting_on"] = json!({"on": "waiting for w1 to confirm the destroy; w1 last heard from \
        2026-01-01T00:09:50Z", "since": 1_767_226_020_000u64});
    record
}

/// A producer command's outcomes: an allocation that waits for a pool, and a lease granted.
fn produced() -> Vec<SeqOutcome> {
    let outcome = |key: &str, first: u64, effects: Value| -> SeqOutcome {
        SeqOutcome {
            seq: first,
            outcome: serde_json::from_value(json!({
                "decider_version": 1, "partition": 5,
                "command": {"id": "019b76da-abe8-7001-8000-000000000001", "class": "op", "type_name": "op.allocate",
                            "issuer": "cli", "issued_at": NOW, "key": key},
                "cmd_seq": 3, "part": 0, "log_time": NOW, "decided_at": NOW,
                "decision": {"accepted": {"first_position": first, "effects": effects}}
            }))
            .expect("an outcome"),
        }
    };
    vec![
        outcome(
            "w1",
            70,
            json!([
                {"resource-allocated": {"resource": &R2[3..], "kind": "container", "capacity": 1,
                    "attributes": {"image": "alpine"}, "parent": null}},
                {"claim-wanted": {"resource": &R2[3..], "pool": "net1"}},
                {"allocation-waits-until": {"resource": &R2[3..], "until": NOW + 300_000}}
            ]),
        ),
        outcome(
            "w1",
            71,
            json!([{"lease-granted": {"lease": &L1[3..], "resource": &R1[3..], "holder": "build-42",
                "ttl": 300_000, "expires_at": NOW + 300_000}}]),
        ),
    ]
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden")
}

/// Compares `rendered` with the golden file `name` (or writes it, with `LH_BLESS=1`); every difference is named.
fn check(name: &str, rendered: &str, differ: &mut Vec<String>) {
    let path = golden_dir().join(name);
    if std::env::var("LH_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).expect("the golden directory");
        std::fs::write(&path, rendered).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    match std::fs::read_to_string(&path) {
        Ok(committed) if committed == rendered => {}
        Ok(committed) => differ.push(format!("{name} differs:\n--- committed\n{committed}--- rendered\n{rendered}")),
        Err(e) => differ.push(format!("{name}: {e} (LH_BLESS=1 writes it)\n--- rendered\n{rendered}")),
    }
}

#[test]
fn the_outputs_people_and_programs_read_are_the_golden_files() {
    let clock = clock();
    let mut differ = Vec::new();
    check("ls.txt", &resources_table(&resources(), &clock), &mut differ);
    check("ls.json", &json(&resources()), &mut differ);
    check("leases.txt", &leases_table(&leases(), &clock), &mut differ);
    check("leases.json", &json(&leases()), &mut differ);
    check("agents.txt", &agents_table(&agents(), &clock), &mut differ);
    check("agents.json", &json(&agents()), &mut differ);
    check("pools.txt", &pools_table(&pools()), &mut differ);
    check("pools.json", &json(&pools()), &mut differ);
    check("get.txt", &resource_fields(&got(), &clock), &mut differ);
    check("get.json", &json(&got()), &mut differ);
    let words = format!("{}\n", crate::words::accepted("allocate", &produced(), &clock));
    check("allocate-and-acquire.txt", &words, &mut differ);
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// Pretty JSON, as `--output json` prints it.
fn json(value: &impl serde::Serialize) -> String {
    output::json(value).expect("JSON")
}
