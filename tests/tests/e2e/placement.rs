//! Placement end to end (an allocation that names no agent): NATS, a `serve` with every role, agents that declare
//! labels and capacity, and the command line through the gateway and straight to JetStream.
//!
//! - `allocate --kind volume --select zone=a` goes to the agent with the label and room, says where and why, and
//!   the agent makes it.
//! - With no room, it is refused naming what is missing; with `--wait`, it waits for room on record (`get <id>` says
//!   so) and is placed when a resource ends.
//! - `--nats` places as the gateway does.

use std::time::{Duration, Instant};

use leasehold_schemas::ResourceId;
use serde_json::Value;

use crate::api::{Api, wait_agent, wait_resource};
use crate::nats::{FAST_SWEEPER, NatsRun};
use crate::support::{Proc, Ran, run_cli, run_cli_on};

const PARTITIONS: u32 = 8;
const STEP: Duration = Duration::from_secs(30);

/// Waits until the placement of `id` is in `state`; returns its record.
async fn wait_placement(api: &Api, id: &str, state: &str, processes: &[&Proc]) -> Value {
    let deadline = Instant::now() + STEP;
    loop {
        let seen = api.try_get(&format!("/v1/placements/{id}")).await;
        if let Ok(Some(view)) = &seen
            && view["state"] == state
        {
            return view.clone();
        }
        assert!(
            Instant::now() < deadline,
            "placement {id}: not {state} after {STEP:?}; last seen {seen:?}\n{}",
            crate::support::logs(processes.iter().copied())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_without_an_agent_is_placed_once_where_labels_and_room_fit() {
    let Some(run) = NatsRun::start("placement", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &FAST_SWEEPER);
    let server = serve.ready().await;
    let api = Api::new(server.clone());
    let mut a1 = run.agent("a1", &["--capacity", "volume=1", "--label", "zone=a"]);
    let mut b1 = run.agent("b1", &["--capacity", "volume=1", "--label", "zone=b"]);
    wait_agent(&api, "a1", |a| a.status == "live" && a.capacity.get("volume") == Some(&1), &[&serve, &a1]).await;
    wait_agent(&api, "b1", |a| a.status == "live" && a.capacity.get("volume") == Some(&1), &[&serve, &b1]).await;
    let cli = |args: &[&str]| run_cli_on(run.path(), &server, args);

    // Placed where the label and the room are; the outcome says where and why.
    let ran = cli(&["allocate", "--kind", "volume", "--select", "zone=a"]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let first = ran.stdout.trim().to_owned();
    assert!(first.starts_with("a1."), "{ran:?}");
    assert!(ran.stderr.contains("placed on a1: 1 of 1 volume; zone=a"), "{ran:?}");
    wait_resource(&api, &first, |r| r.state == "active", &[&serve, &a1]).await;

    // No room with the label: refused, naming what is missing; nothing is made.
    let ran = cli(&["allocate", "--kind", "volume", "--select", "zone=a"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("not placed: zone=a: 1 agent full"), "{ran:?}");
    let ran = cli(&["allocate", "--kind", "volume", "--select", "zone=c"]).await;
    assert_eq!(ran.code, Some(1), "{ran:?}");
    assert!(ran.stderr.contains("zone=c: no agent has these labels"), "{ran:?}");

    // With --wait: on record as waiting (and `get <id>` says on what), placed once the first volume is destroyed.
    let id = ResourceId::generate().to_string();
    let waiting =
        tokio::spawn(cli(&["allocate", "--kind", "volume", "--select", "zone=a", "--wait", "60s", "--id", &id]));
    wait_placement(&api, &id, "waiting", &[&serve]).await;
    let shown = cli(&["get", &id]).await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    assert!(
        shown
            .stdout
            .lines()
            .any(|l| l.starts_with("waiting_on") && l.contains("placement waiting for room (zone=a: 1 agent full)")),
        "{shown:?}"
    );
    let ran = cli(&["release", &first]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    let ran: Ran = waiting.await.expect("the waiting allocation ends");
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(ran.stderr.contains("waiting for room: zone=a: 1 agent full"), "{ran:?}");
    assert_eq!(ran.stdout.trim(), format!("a1.{id}"), "{ran:?}");
    let view = wait_placement(&api, &id, "placed", &[&serve]).await;
    assert_eq!(view["agent"], "a1");
    wait_resource(&api, &format!("a1.{id}"), |r| r.state == "active", &[&serve, &a1]).await;
    // `get <id>` of a placed resource shows the resource.
    let shown = cli(&["get", &id]).await;
    assert!(shown.stdout.contains(&format!("a1.{id}")) && shown.stdout.contains("active"), "{shown:?}");

    // Straight to JetStream, the same: placed on b1, the only agent with zone=b.
    let ran =
        run_cli(run.path(), &["allocate", "--nats", &run.url, "--kind", "volume", "--select", "zone=b"], &[]).await;
    assert_eq!(ran.code, Some(0), "{ran:?}");
    assert!(
        ran.stdout.trim().starts_with("b1.") && ran.stderr.contains("placed on b1: 1 of 1 volume; zone=b"),
        "{ran:?}"
    );
    wait_resource(&api, ran.stdout.trim(), |r| r.state == "active", &[&serve, &b1]).await;

    // Each request made one resource: a1 holds the waiting one's, b1 the last; nothing else was made.
    let all = api.get("/v1/resources").await.expect("resources");
    let live: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] != "destroyed")
        .map(|r| r["ref"].as_str().unwrap())
        .collect();
    assert_eq!(live.len(), 2, "{live:?}");
    serve.assert_no_panic();
    a1.stop_cleanly().await;
    b1.stop_cleanly().await;
    serve.stop_cleanly().await;
}
