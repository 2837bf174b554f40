//! Suspect resources and health checks, end to end: NATS, a `serve` with the writers, the projection and the
//! gateway, a separate sweeper process the test can freeze, and two agents in different partitions: a parent on
//! one, its child on the other.
//!
//! A failure report quarantines the parent: it turns `suspect` and a new lease is refused, for as long as nobody has
//! checked it (the sweeper is frozen). The sweeper comes back: it asks the parent's agent for a health check and
//! carries the parent's state to the child (flagged `suspect-upstream`); the check passes, the parent is `active`
//! again, leases are granted and the child's flag is cleared. Then the parent's directory is made to fail its check
//! (its probe path is taken by a directory): a second failure report makes the check fail, the parent is released
//! and destroyed, and so is its child on the other agent.

use leasehold_log::OutcomeFilter;
use leasehold_log::jetstream::JetStream;
use leasehold_schemas::command::{Allocate, ReportFailureByOperator};
use leasehold_schemas::ids::ResourceRef;
use leasehold_schemas::outcome::{Effect, ReleaseCause};
use leasehold_schemas::subjects::partition_of_agent;
use leasehold_schemas::{AgentName, LeaseId, ResourceId};

use crate::api::{Api, acquire, agent_name, allocate, command, wait_agent, wait_path, wait_resource};
use crate::nats::{FAST_SWEEPER, NatsRun, outcomes};

const PARTITIONS: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_resource_is_quarantined_checked_and_restored_or_released_with_its_child() {
    let Some(run) = NatsRun::start("health", PARTITIONS) else { return };
    let mut serve = run.serve("serve", &["--roles", "worker,projector,gateway"]);
    let api = Api::new(serve.ready().await);
    let mut sweeper_args = vec!["--roles", "sweeper"];
    sweeper_args.extend(FAST_SWEEPER);
    let mut sweeper = run.serve("sweeper", &sweeper_args);
    sweeper.address().await;

    // Two agents in two partitions.
    let names = two_partitions();
    let mut agents = Vec::new();
    for name in &names {
        agents.push(run.agent(name.as_str(), &[]));
    }
    for name in &names {
        wait_agent(&api, name.as_str(), |a| a.status == "live", &[&serve, &sweeper, &agents[0], &agents[1]]).await;
    }
    let (parent_agent, child_agent) = (&names[0], &names[1]);
    let parent = ResourceId::generate();
    api.accepted(&allocate(parent_agent, parent), &[&serve]).await;
    let child = ResourceId::generate();
    let mut child_body = Allocate::new(child_agent.clone(), child, "container", 1);
    child_body.parent = Some(ResourceRef::new(parent_agent.clone(), parent));
    api.accepted(&command(child_body), &[&serve]).await;
    let parent_ref = format!("{parent_agent}.{parent}");
    let child_ref = format!("{child_agent}.{child}");
    let all = [&serve, &sweeper, &agents[0], &agents[1]];
    wait_resource(&api, &parent_ref, |r| r.state == "active", &all).await;
    wait_resource(&api, &child_ref, |r| r.state == "active", &all).await;

    // The child has heard from its parent (the answer to its adoption, carried by the sweeper) before the sweeper
    // is frozen: what it hears next is news.
    let log = run.log().await;
    let deadline = tokio::time::Instant::now() + crate::api::STEP;
    while upstream_flags(&log, &names[1], child).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child was never adopted\n{}",
            crate::support::logs(all.into_iter())
        );
        tokio::time::sleep(crate::api::POLL).await;
    }

    // Quarantined: suspect, and no new lease while nobody has checked it.
    sweeper.freeze();
    let failure = ReportFailureByOperator { agent: parent_agent.clone(), resource: parent, detail: "it smokes".into() };
    api.accepted(&command(failure.clone()), &[&serve]).await;
    let refused = api.decide(&acquire(parent_agent, parent, LeaseId::generate()), &[&serve]).await;
    assert_eq!(refused["status"], "rejected", "{refused:#}");
    let message = refused["rejection"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("suspect"), "the refusal says why: {message}");
    assert_eq!(api.resource(&parent_ref).await.expect("the parent").state, "suspect");

    // Checked: the check passes, the parent is active again and takes leases; the child's flag comes and goes.
    sweeper.resume();
    wait_resource(&api, &parent_ref, |r| r.state == "active", &all).await;
    api.accepted(&acquire(parent_agent, parent, LeaseId::generate()), &[&serve]).await;
    wait_resource(&api, &child_ref, |r| !r.upstream_suspect && r.state == "active", &all).await;
    // What the child heard, in order. The sweeper carries the parent's state as of each parent outcome it sees, so
    // the same state may come twice (suspect at the failure, and again at the health check's request, when the
    // sweeper plans between the two): a repeat says nothing new.
    let mut flags = upstream_flags(&log, &names[1], child).await;
    flags.dedup();
    assert_eq!(
        flags,
        vec![false, true, false],
        "the child heard its parent was healthy, then suspect while it was, then healthy again"
    );

    // A failing check: the parent is released, and its child on the other agent with it.
    let parent_dir = run.path().join(parent_agent.as_str()).join(parent.to_string());
    std::fs::create_dir(parent_dir.join(".leasehold-probe")).expect("take the probe's path");
    api.accepted(&command(failure), &[&serve]).await;
    wait_resource(&api, &parent_ref, |r| r.state == "destroyed", &all).await;
    wait_resource(&api, &child_ref, |r| r.state == "destroyed", &all).await;
    wait_path(&parent_dir, false, &all).await;
    let causes = release_causes(&log, &names[1], child).await;
    assert!(
        matches!(causes.as_slice(), [ReleaseCause::ParentLeft { parent: p }] if p.resource == parent),
        "the child was released once, because its parent left: {causes:?}"
    );

    for process in [&sweeper, &serve] {
        process.assert_no_panic();
    }
    for mut agent in agents {
        agent.stop_cleanly().await;
    }
    sweeper.stop_cleanly().await;
    serve.stop_cleanly().await;
}

/// Two agent names whose partitions differ.
fn two_partitions() -> [AgentName; 2] {
    let first = agent_name("h1");
    let home = partition_of_agent(&first, PARTITIONS);
    let second = (2..100)
        .map(|n| agent_name(&format!("h{n}")))
        .find(|a| partition_of_agent(a, PARTITIONS) != home)
        .expect("another partition");
    [first, second]
}

/// What `pick` takes from the effects on an agent's subject, in log order.
async fn effects_of<T>(log: &JetStream, agent: &AgentName, pick: impl Fn(&Effect) -> Option<T>) -> Vec<T> {
    let filter =
        OutcomeFilter::Key { partition: partition_of_agent(agent, PARTITIONS), key: agent.as_str().to_owned() };
    outcomes(log, &filter).await.iter().flat_map(|(_, o)| o.effects()).filter_map(pick).collect()
}

/// The `suspect-upstream` flags the child took, in log order.
async fn upstream_flags(log: &JetStream, agent: &AgentName, child: ResourceId) -> Vec<bool> {
    effects_of(log, agent, |e| match e {
        Effect::UpstreamFlagged { resource, suspect, .. } if *resource == child => Some(*suspect),
        _ => None,
    })
    .await
}

/// Why the child was ordered released, each time it was.
async fn release_causes(log: &JetStream, agent: &AgentName, child: ResourceId) -> Vec<ReleaseCause> {
    effects_of(log, agent, |e| match e {
        Effect::ResourceReleasing { resource, cause } if *resource == child => Some(cause.clone()),
        _ => None,
    })
    .await
}
