//! Table tests: observations (DESIGN section 6): report-created, sync reports (watermark, observation numbers,
//! epochs, the destroyed and lost rules, in-flight handles, count and digest), the circuit breaker, full resync
//! chunks, failure reports, and decisions too big for one outcome (DESIGN section 9).

mod support;

use Then::{Effects, Rejected};
use leasehold_domain::state::Liveness;
use leasehold_domain::{PartitionState, WriterError};
use leasehold_schemas::RejectionKind::*;
use leasehold_schemas::codec::{MAX_OUTCOME_BYTES, encode_outcome};
use leasehold_schemas::command::*;
use leasehold_schemas::ids::{Millis, Position, ResourceId};
use leasehold_schemas::outcome::Effect;
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Outcome, Uuid};
use support::*;

// --- helpers --------------------------------------------------------------------------------------------------

const WINDOW: Millis = Millis::from_mins(10);

/// The resources of the current agent still in state, in id order.
fn ids(w: &World) -> Vec<ResourceId> {
    let state = w.state();
    let agent = state.agent(&w.a()).expect("registered");
    state.resources_of(agent).map(|r| r.id).collect()
}

/// The ids of the agent's resources in a given state, in id order.
fn ids_in(w: &World, state_name: &str) -> Vec<ResourceId> {
    let state = w.state();
    let agent = state.agent(&w.a()).expect("registered");
    state.resources_of(agent).filter(|r| r.state.name() == state_name).map(|r| r.id).collect()
}

fn create_ordered(w: &World, id: ResourceId) -> Position {
    w.state().resource(id).unwrap().create_ordered.expect("create ordered")
}

fn destruction_ordered(w: &World, id: ResourceId) -> Position {
    w.state().resource(id).unwrap().destruction_ordered.expect("destruction ordered")
}

fn before(p: Position) -> Position {
    Position(p.0 - 1)
}

/// An active resource `w.r()` with a bound claim, released: `releasing`, its claim still held.
fn releasing_with_claim(w: &mut World) {
    w.registered();
    w.claimed();
    w.created();
    accepted(&w.release());
}

fn pause(w: &mut World) {
    let (agent, resource) = (w.a(), w.r());
    accepted(&w.op(Pause { agent, resource, reason: None, until: None }));
}

fn suspect(w: &mut World) {
    let resource = w.rref();
    accepted(&w.operator_failure(&resource, "flaky"));
}

fn register(w: &mut World, wiped: bool) -> Outcome {
    let a = w.a();
    w.register_with(&a, AgentSettings::default(), wiped)
}

fn sync_with(w: &mut World, edit: impl FnOnce(&mut SyncReport)) -> Outcome {
    let a = w.a();
    w.sync(&a, edit)
}

fn missing(w: &mut World, ids: Vec<ResourceId>) -> Outcome {
    sync_with(w, |s| s.missing = ids)
}

fn report_failure(w: &mut World, failure: FailureKind, detail: &str) -> Outcome {
    let (agent, resource) = (w.a(), w.r());
    let epoch = w.epoch(&agent);
    let obs = w.next_obs(&agent);
    w.agent_says(ReportFailure { agent, epoch, obs, resource, failure, detail: detail.into() })
}

fn lost_n(n: usize) -> Vec<&'static str> {
    let mut names = vec!["observation-accepted"];
    names.extend(std::iter::repeat_n("resource-lost", n));
    names
}

// --- report-created ---------------------------------------------------------------------------------------------

#[test]
fn report_created() {
    check(vec![
        case(
            "a pending resource becomes active",
            |w| {
                w.registered().pending();
            },
            |w| w.report_created(&w.a(), w.r()),
            Effects(&["observation-accepted", "resource-activated"]),
        ),
        case(
            "its waiting lease is granted",
            |w| {
                w.registered().pending().leased(None);
            },
            |w| w.report_created(&w.a(), w.r()),
            Effects(&["observation-accepted", "resource-activated", "lease-granted"]),
        ),
        case(
            "an active resource: its presence is recorded (no older observation can make it lost)",
            |w| {
                w.active();
            },
            |w| w.report_created(&w.a(), w.r()),
            Effects(&["observation-accepted", "resource-seen"]),
        ),
        case(
            "an observation number equal to the last one",
            |w| {
                w.registered().pending();
                let (agent, resource) = (w.a(), w.r());
                let epoch = w.epoch(&agent);
                accepted(&w.agent_says(ReportCreated { agent, epoch, obs: 5, resource, native_id: None }));
                w.pending();
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                let epoch = w.epoch(&agent);
                w.agent_says(ReportCreated { agent, epoch, obs: 5, resource, native_id: None })
            },
            Rejected(StaleObservation, &["observation 5 of agent w1 is not newer than the last one decided (5)"]),
        ),
        case(
            "an observation number lower than the last one",
            |w| {
                w.registered().pending();
                let (agent, resource) = (w.a(), w.r());
                let epoch = w.epoch(&agent);
                accepted(&w.agent_says(ReportCreated { agent, epoch, obs: 5, resource, native_id: None }));
                w.pending();
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                let epoch = w.epoch(&agent);
                w.agent_says(ReportCreated { agent, epoch, obs: 4, resource, native_id: None })
            },
            Rejected(StaleObservation, &["observation 4 of agent w1"]),
        ),
        case(
            "an observation of an old epoch",
            |w| {
                w.registered().pending();
                accepted(&register(w, false));
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                w.agent_says(ReportCreated { agent, epoch: Position(1), obs: 1, resource, native_id: None })
            },
            Rejected(WrongEpoch, &["observation from epoch #1 of agent w1, whose current epoch is #4"]),
        ),
        case(
            "an unknown resource",
            |w| {
                w.registered();
            },
            |w| {
                let r = w.d.new_resource_id();
                w.report_created(&w.a(), r)
            },
            Rejected(Unknown, &["is not known"]),
        ),
        case(
            "a resource of another agent",
            |w| {
                w.agent = agent_name("w2");
                w.registered().pending();
                w.agent = agent_name("w1");
                w.registered();
            },
            |w| w.report_created(&w.a(), w.r()),
            Rejected(Unknown, &["is on agent w2, not on w1"]),
        ),
        case(
            "a gone agent",
            |w| {
                w.registered().pending();
                w.advance(Millis(Millis::from_hours(24).0 + 20_000));
                let agent = w.a();
                accepted(&w.sys(MarkGone { agent }));
            },
            |w| w.report_created(&w.a(), w.r()),
            Rejected(InvalidState, &["agent w1 is gone", "register a new incarnation"]),
        ),
        case(
            "a native id over the limit",
            |w| {
                w.registered().pending();
            },
            |w| {
                let (agent, resource) = (w.a(), w.r());
                let epoch = w.epoch(&agent);
                let native_id = Some("x".repeat(1025));
                w.agent_says(ReportCreated { agent, epoch, obs: 1, resource, native_id })
            },
            Rejected(Invalid, &["native id is 1025 bytes"]),
        ),
    ]);
}

// --- sync: the rules --------------------------------------------------------------------------------------------

#[test]
fn sync_rules() {
    check(vec![
        case(
            "created: a pending resource becomes active",
            |w| {
                w.registered().pending();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| s.created = vec![r])
            },
            Effects(&["observation-accepted", "resource-activated"]),
        ),
        case(
            "created: its waiting leases are granted",
            |w| {
                w.registered().pending().leased(None).leased(None);
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| s.created = vec![r])
            },
            Effects(&["observation-accepted", "resource-activated", "lease-granted", "lease-granted"]),
        ),
        case(
            "destroyed on a releasing resource ordered at or before the watermark",
            releasing_with_claim,
            |w| {
                let r = w.r();
                sync_with(w, |s| s.destroyed = vec![r])
            },
            Effects(&["observation-accepted", "resource-destroyed", "claim-releasable"]),
        ),
        case(
            "destroyed with the watermark exactly at the destruction",
            |w| {
                releasing_with_claim(w);
                w.pending();
            },
            |w| {
                let r = ids(w)[0];
                let at = destruction_ordered(w, r);
                sync_with(w, |s| {
                    s.watermark = at;
                    s.destroyed = vec![r];
                })
            },
            Effects(&["observation-accepted", "resource-destroyed", "claim-releasable"]),
        ),
        case(
            "absent (named missing) on a releasing resource ordered before the watermark",
            releasing_with_claim,
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted", "resource-destroyed", "claim-releasable"]),
        ),
        case(
            "destroyed on a resource released before it was ever created",
            |w| {
                w.registered().pending();
                accepted(&w.release());
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| s.destroyed = vec![r])
            },
            Effects(&["observation-accepted", "resource-destroyed"]),
        ),
        case(
            "destroyed on a releasing resource ordered after the watermark: not judged",
            releasing_with_claim,
            |w| {
                let r = w.r();
                let at = destruction_ordered(w, r);
                sync_with(w, |s| {
                    s.watermark = before(at);
                    s.destroyed = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "missing on an active resource: lost, its leases break, its claims free",
            |w| {
                w.registered();
                w.claimed();
                w.created().leased(None);
            },
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted", "resource-lost", "lease-broken", "claim-releasable"]),
        ),
        case(
            "missing on a paused resource: lost",
            |w| {
                w.active();
                pause(w);
            },
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted", "resource-lost"]),
        ),
        case(
            "missing on a suspect resource: lost",
            |w| {
                w.active();
                suspect(w);
            },
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted", "resource-lost"]),
        ),
        case(
            "named destroyed on an active resource: absent, so lost",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| s.destroyed = vec![r])
            },
            Effects(&["observation-accepted", "resource-lost"]),
        ),
        case(
            "missing with the watermark exactly at the create order: lost",
            |w| {
                w.active();
                w.pending();
            },
            |w| {
                let r = ids(w)[0];
                let at = create_ordered(w, r);
                sync_with(w, |s| {
                    s.watermark = at;
                    s.missing = vec![r];
                })
            },
            Effects(&["observation-accepted", "resource-lost"]),
        ),
        case(
            "the Concourse race: missing, but its create was ordered after the watermark",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                let at = create_ordered(w, r);
                sync_with(w, |s| {
                    s.watermark = before(at);
                    s.missing = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "the Concourse race with a claim: allocated before the watermark, create ordered after it",
            |w| {
                w.registered();
                w.claimed();
                w.created();
            },
            |w| {
                let r = w.r();
                let at = create_ordered(w, r);
                assert!(w.state().resource(r).unwrap().allocated_pos < before(at));
                sync_with(w, |s| {
                    s.watermark = before(at);
                    s.missing = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "missing on a pending resource: nothing (the create timeout deals with it)",
            |w| {
                w.registered().pending();
            },
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "in flight and missing on an active resource: never judged",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.in_flight = vec![r];
                    s.missing = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "in flight and destroyed on a releasing resource: never judged",
            releasing_with_claim,
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.in_flight = vec![r];
                    s.destroyed = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "in flight and created on a pending resource: never judged",
            |w| {
                w.registered().pending();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.in_flight = vec![r];
                    s.created = vec![r];
                })
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "named both missing and destroyed: both absent, fine",
            releasing_with_claim,
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.missing = vec![r];
                    s.destroyed = vec![r];
                })
            },
            Effects(&["observation-accepted", "resource-destroyed", "claim-releasable"]),
        ),
        case(
            "named both created and missing",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.created = vec![r];
                    s.missing = vec![r];
                })
            },
            Rejected(Invalid, &["is named both present and absent in one report"]),
        ),
        case(
            "named both created and destroyed",
            |w| {
                w.registered().pending();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.created = vec![r];
                    s.destroyed = vec![r];
                })
            },
            Rejected(Invalid, &["is named both present and absent"]),
        ),
        case(
            "a watermark beyond the last position",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                sync_with(w, |s| {
                    s.watermark = Position(s.watermark.0 + 1);
                    s.missing = vec![r];
                })
            },
            Rejected(Invalid, &["watermark #6 is beyond the last position #5"]),
        ),
        case(
            "more than MAX_REPORT_HANDLES handles",
            |w| {
                w.active();
            },
            |w| {
                let many: Vec<ResourceId> =
                    (0..=MAX_REPORT_HANDLES as u64).map(|i| ResourceId::from_parts(i, [7; 10])).collect();
                sync_with(w, |s| s.missing = many)
            },
            Rejected(Invalid, &["the report names 8193 handles; at most 8192"]),
        ),
        case(
            "more than MAX_REPORT_HANDLES across the lists",
            |w| {
                w.active();
            },
            |w| {
                let many: Vec<ResourceId> =
                    (0..MAX_REPORT_HANDLES as u64).map(|i| ResourceId::from_parts(i, [7; 10])).collect();
                let r = w.r();
                sync_with(w, |s| {
                    s.destroyed = many;
                    s.in_flight = vec![r];
                })
            },
            Rejected(Invalid, &["the report names 8193 handles"]),
        ),
        case(
            "exactly MAX_REPORT_HANDLES handles, none known: only the observation",
            |w| {
                w.active();
            },
            |w| {
                let many: Vec<ResourceId> =
                    (0..MAX_REPORT_HANDLES as u64).map(|i| ResourceId::from_parts(i, [7; 10])).collect();
                sync_with(w, |s| s.missing = many)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "handles of another agent are not judged",
            |w| {
                w.agent = agent_name("w2");
                w.active();
                w.agent = agent_name("w1");
                w.registered();
            },
            |w| {
                let r = w.r();
                missing(w, vec![r])
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "an observation number equal to the last one",
            |w| {
                w.active();
            },
            |w| {
                let a = w.a();
                let mut report = w.sync_cmd(&a, |_| {});
                report.obs = 1;
                let (count, digest) = w.expected_listing(&a, &report);
                report.count = count;
                report.digest = digest;
                w.agent_says(report)
            },
            Rejected(StaleObservation, &["observation 1 of agent w1 is not newer than the last one decided (1)"]),
        ),
        case(
            "an observation number lower than the last one",
            |w| {
                w.active();
                accepted(&sync_with(w, |_| {}));
                accepted(&sync_with(w, |_| {}));
            },
            |w| {
                let a = w.a();
                let report = w.sync_cmd(&a, |s| s.obs = 2);
                w.agent_says(report)
            },
            Rejected(StaleObservation, &["observation 2 of agent w1", "(3)"]),
        ),
        case(
            "a report of an old epoch",
            |w| {
                w.active();
                accepted(&register(w, false));
            },
            |w| {
                let a = w.a();
                let report = w.sync_cmd(&a, |s| s.epoch = Position(1));
                w.agent_says(report)
            },
            Rejected(WrongEpoch, &["observation from epoch #1 of agent w1, whose current epoch is #6"]),
        ),
        case(
            "a gone agent",
            |w| {
                w.active();
                w.advance(Millis(Millis::from_hours(24).0 + 20_000));
                let agent = w.a();
                accepted(&w.sys(MarkGone { agent }));
            },
            |w| sync_with(w, |_| {}),
            Rejected(InvalidState, &["agent w1 is gone"]),
        ),
        case(
            "an unknown agent",
            |_| {},
            |w| {
                let agent = w.a();
                w.agent_says(SyncReport::new(agent, Position(1), 1, Position(0)))
            },
            Rejected(Unknown, &["agent w1 has never registered"]),
        ),
    ]);
}

// --- sync: count and digest -------------------------------------------------------------------------------------

#[test]
fn count_and_digest() {
    check(vec![
        case(
            "they agree: no resync",
            |w| {
                w.registered();
                w.active_n(3);
            },
            |w| sync_with(w, |_| {}),
            Effects(&["observation-accepted"]),
        ),
        case(
            "the count disagrees",
            |w| {
                w.registered();
                w.active_n(3);
            },
            |w| {
                let a = w.a();
                let mut report = w.sync_cmd(&a, |_| {});
                let (count, digest) = w.expected_listing(&a, &report);
                assert_eq!(count, 3);
                report.count = 2;
                report.digest = digest;
                w.agent_says(report)
            },
            Effects(&["observation-accepted", "resync-requested"]),
        ),
        case(
            "the count agrees but the digest does not",
            |w| {
                w.registered();
                w.active_n(3);
            },
            |w| {
                let a = w.a();
                let mut report = w.sync_cmd(&a, |_| {});
                let (count, _) = w.expected_listing(&a, &report);
                report.count = count;
                report.digest = HandleDigest::of([&ResourceId::from_parts(1, [1; 10])]);
                w.agent_says(report)
            },
            Effects(&["observation-accepted", "resync-requested"]),
        ),
        case(
            "a mismatch is still decided: the report's verdicts apply",
            |w| {
                w.registered();
                w.active_n(3);
                w.pending();
            },
            |w| {
                let (a, r) = (w.a(), w.r());
                let report = w.sync_cmd(&a, |s| s.created = vec![r]);
                w.agent_says(report)
            },
            Effects(&["observation-accepted", "resync-requested", "resource-activated"]),
        ),
        case(
            "the view after the report's own verdicts: created counts, missing does not",
            |w| {
                w.registered();
                w.active_n(3);
                w.pending();
            },
            |w| {
                let (r_new, r_gone) = (w.r(), ids(w)[0]);
                sync_with(w, |s| {
                    s.created = vec![r_new];
                    s.missing = vec![r_gone];
                })
            },
            Effects(&["observation-accepted", "resource-lost", "resource-activated"]),
        ),
        case(
            "a release the agent cannot know of yet still counts as held",
            |w| {
                w.registered();
                w.active_n(2);
                accepted(&w.release());
            },
            |w| {
                let a = w.a();
                let r = w.r();
                let at = destruction_ordered(w, r);
                let mut report = w.sync_cmd(&a, |s| s.watermark = before(at));
                report.count = 2;
                report.digest = HandleDigest::of(&ids(w));
                w.agent_says(report)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "created as of a watermark before its release: seen present, counted, no resync",
            |w| {
                w.registered();
                w.active_n(1);
                w.pending();
            },
            |w| {
                let (a, r) = (w.a(), w.r());
                let watermark = w.state().last_position();
                accepted(&w.release());
                let mut report = w.sync_cmd(&a, |s| {
                    s.watermark = watermark;
                    s.created = vec![r];
                });
                // The agent holds both: the one it had and the one it just created.
                report.count = 2;
                report.digest = HandleDigest::of(&ids(w));
                w.agent_says(report)
            },
            Effects(&["observation-accepted", "resource-seen"]),
        ),
        case(
            "a released handle still on the machine counts until it is reported destroyed",
            |w| {
                w.registered();
                w.active_n(2);
                accepted(&w.release());
            },
            |w| {
                let a = w.a();
                let mut report = w.sync_cmd(&a, |_| {});
                report.count = 2;
                report.digest = HandleDigest::of(&ids(w));
                w.agent_says(report)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "a released handle reported destroyed no longer counts",
            |w| {
                w.registered();
                w.active_n(2);
                accepted(&w.release());
            },
            |w| {
                let (a, released) = (w.a(), w.r());
                let mut report = w.sync_cmd(&a, |r| r.destroyed = vec![released]);
                let kept: Vec<_> = ids(w).into_iter().filter(|id| *id != released).collect();
                report.count = 1;
                report.digest = HandleDigest::of(&kept);
                w.agent_says(report)
            },
            Effects(&["observation-accepted", "resource-destroyed"]),
        ),
    ]);
}

// --- the circuit breaker ----------------------------------------------------------------------------------------

#[test]
fn circuit_breaker() {
    check(vec![
        case(
            "5 of 8 missing trips it: the agent is suspect, nothing is lost",
            |w| {
                w.registered();
                w.active_n(8);
            },
            |w| {
                let m = ids(w)[..5].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-suspect"]),
        ),
        case(
            "4 of 5 missing: under max_loss_min, lost",
            |w| {
                w.registered();
                w.active_n(5);
            },
            |w| {
                let m = ids(w)[..4].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "resource-lost", "resource-lost", "resource-lost", "resource-lost"]),
        ),
        case(
            "5 of 10 missing: exactly half is not more than half, lost",
            |w| {
                w.registered();
                w.active_n(10);
            },
            |w| {
                let m = ids(w)[..5].to_vec();
                missing(w, m)
            },
            Effects(&[
                "observation-accepted",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
            ]),
        ),
        case(
            "6 of 10 missing trips it",
            |w| {
                w.registered();
                w.active_n(10);
            },
            |w| {
                let m = ids(w)[..6].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-suspect"]),
        ),
        case(
            "losses accumulate within the window: 3 of 10, then 3 more",
            |w| {
                w.registered();
                w.active_n(10);
                let m = ids(w)[..3].to_vec();
                assert_eq!(effect_names(&missing(w, m)), lost_n(3));
                w.advance(Millis(WINDOW.0 - 1));
            },
            |w| {
                let m = ids_in(w, "active")[..3].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-suspect"]),
        ),
        case(
            "losses older than the window do not count",
            |w| {
                w.registered();
                w.active_n(10);
                let m = ids(w)[..3].to_vec();
                assert_eq!(effect_names(&missing(w, m)), lost_n(3));
                w.advance(WINDOW);
            },
            |w| {
                let m = ids_in(w, "active")[..3].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "resource-lost", "resource-lost", "resource-lost"]),
        ),
        case(
            "the same losses again while tripped: nothing new",
            |w| {
                w.registered();
                w.active_n(8);
                let m = ids(w)[..5].to_vec();
                accepted(&missing(w, m));
            },
            |w| {
                let m = ids(w)[..5].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "a later report with nothing missing clears it",
            |w| {
                w.registered();
                w.active_n(8);
                let m = ids(w)[..5].to_vec();
                accepted(&missing(w, m));
            },
            |w| sync_with(w, |_| {}),
            Effects(&["observation-accepted", "agent-breaker-cleared"]),
        ),
        case(
            "a later report with losses within the limit clears it and marks them",
            |w| {
                w.registered();
                w.active_n(8);
                let m = ids(w)[..5].to_vec();
                accepted(&missing(w, m));
            },
            |w| {
                let m = ids(w)[..2].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-breaker-cleared", "resource-lost", "resource-lost"]),
        ),
        case(
            "a tripping report still destroys and activates",
            |w| {
                w.registered();
                w.active_n(8);
                w.pending();
                accepted(&w.release());
                w.pending();
            },
            |w| {
                let all = ids(w);
                let (m, destroyed, created) = (all[..5].to_vec(), all[8], all[9]);
                sync_with(w, |s| {
                    s.missing = m;
                    s.destroyed = vec![destroyed];
                    s.created = vec![created];
                })
            },
            Effects(&["observation-accepted", "agent-suspect", "resource-destroyed", "resource-activated"]),
        ),
        case(
            "a wiped registration bypasses it",
            |w| {
                w.registered();
                w.active_n(8);
                accepted(&register(w, true));
            },
            |w| {
                let m = ids(w);
                missing(w, m)
            },
            Effects(&[
                "observation-accepted",
                "agent-breaker-rearmed",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
            ]),
        ),
        case(
            "a wiped registration bypasses only the first report after it",
            |w| {
                w.registered();
                w.active_n(8);
                accepted(&register(w, true));
                assert_eq!(effect_names(&sync_with(w, |_| {})), ["observation-accepted", "agent-breaker-rearmed"]);
            },
            |w| {
                let m = ids(w)[..5].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-suspect"]),
        ),
        case(
            "a plain re-registration does not bypass it",
            |w| {
                w.registered();
                w.active_n(8);
                accepted(&register(w, false));
            },
            |w| {
                let m = ids(w)[..5].to_vec();
                missing(w, m)
            },
            Effects(&["observation-accepted", "agent-suspect"]),
        ),
        case(
            "confirm-loss bypasses it",
            |w| {
                w.registered();
                w.active_n(8);
                let m = ids(w)[..5].to_vec();
                accepted(&missing(w, m));
                let agent = w.a();
                accepted(&w.op(ConfirmLoss { agent }));
            },
            |w| {
                let m = ids(w)[..6].to_vec();
                missing(w, m)
            },
            Effects(&[
                "observation-accepted",
                "agent-breaker-rearmed",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
                "resource-lost",
            ]),
        ),
    ]);
}

#[test]
fn a_tripped_breaker_holds_until_the_handles_come_back() {
    let mut w = World::new();
    w.registered();
    let made = w.active_n(8);
    let o = missing(&mut w, made[..5].to_vec());
    assert_eq!(effect_names(&o), ["observation-accepted", "agent-suspect"]);
    let Effect::AgentSuspect { would_lose, live } = o.effects()[1] else { unreachable!() };
    assert_eq!((would_lose, live), (5, 8));
    let agent = w.state().agent(&w.a()).unwrap();
    assert!(agent.is_suspect());
    assert_eq!(agent.status(), "suspect");
    assert!(made.iter().all(|r| state_name(&w, *r) == "active"), "nothing was marked");

    w.advance(Millis::from_mins(30));
    let o = missing(&mut w, made[..5].to_vec());
    assert_eq!(effect_names(&o), ["observation-accepted"], "still tripped, even after the window");
    let o = sync_with(&mut w, |_| {});
    assert_eq!(effect_names(&o), ["observation-accepted", "agent-breaker-cleared"]);
    assert!(!w.state().agent(&w.a()).unwrap().is_suspect());
    settle(&w);
}

// --- resync chunks ----------------------------------------------------------------------------------------------

#[test]
fn resync_chunks() {
    check(vec![
        case(
            "held in range: a pending resource becomes active",
            |w| {
                w.registered().pending();
            },
            |w| {
                let r = w.r();
                let (lo, hi) = just(r);
                let c = chunk(w, lo, hi, vec![r], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-activated"]),
        ),
        case(
            "held in range: an active resource is seen present",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                let c = chunk(w, Uuid::nil(), None, vec![r], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-seen"]),
        ),
        case(
            "absent in range: an active resource is lost",
            |w| {
                w.active().leased(None);
            },
            |w| {
                let r = w.r();
                let (lo, hi) = just(r);
                let c = chunk(w, lo, hi, vec![], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-lost", "lease-broken"]),
        ),
        case(
            "absent in range: a releasing resource ordered before the watermark is destroyed",
            releasing_with_claim,
            |w| {
                let c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-destroyed", "claim-releasable"]),
        ),
        case(
            "absent in range: a releasing resource ordered after the watermark is not judged",
            releasing_with_claim,
            |w| {
                let r = w.r();
                let at = destruction_ordered(w, r);
                let mut c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                c.watermark = before(at);
                w.agent_says(c)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "absent in range: an active resource created after the watermark is not judged",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                let at = create_ordered(w, r);
                let mut c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                c.watermark = before(at);
                w.agent_says(c)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "absent in range: a pending resource, nothing",
            |w| {
                w.registered().pending();
            },
            |w| {
                let c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "in flight in range: never judged",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                let c = chunk(w, Uuid::nil(), None, vec![], vec![r]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted"]),
        ),
        case(
            "resources outside the range are not judged",
            |w| {
                w.registered();
                w.active_n(3);
            },
            |w| {
                let middle = ids(w)[1];
                let (lo, hi) = just(middle);
                let c = chunk(w, lo, hi, vec![], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-lost"]),
        ),
        case(
            "held handles unknown to the writer are ignored",
            |w| {
                w.active();
            },
            |w| {
                let r = w.r();
                let stranger = w.d.new_resource_id();
                let c = chunk(w, Uuid::nil(), None, vec![r, stranger], vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "resource-seen"]),
        ),
        case(
            "a handle outside the range",
            |w| {
                w.registered();
                w.active_n(2);
            },
            |w| {
                let all = ids(w);
                let (lo, hi) = just(all[0]);
                let c = chunk(w, lo, hi, vec![all[0], all[1]], vec![]);
                w.agent_says(c)
            },
            Rejected(Invalid, &["is outside the chunk's range"]),
        ),
        case(
            "an in-flight handle outside the range",
            |w| {
                w.registered();
                w.active_n(2);
            },
            |w| {
                let all = ids(w);
                let (lo, hi) = just(all[1]);
                let c = chunk(w, lo, hi, vec![], vec![all[0]]);
                w.agent_says(c)
            },
            Rejected(Invalid, &["is outside the chunk's range"]),
        ),
        case(
            "an empty range",
            |w| {
                w.active();
            },
            |w| {
                let lo = w.r().as_uuid();
                let c = chunk(w, lo, Some(lo), vec![], vec![]);
                w.agent_says(c)
            },
            Rejected(Invalid, &["is empty"]),
        ),
        case(
            "a reversed range",
            |w| {
                w.active();
            },
            |w| {
                let lo = w.r().as_uuid();
                let c = chunk(w, lo, Some(Uuid::nil()), vec![], vec![]);
                w.agent_says(c)
            },
            Rejected(Invalid, &["is empty"]),
        ),
        case(
            "a watermark beyond the last position",
            |w| {
                w.active();
            },
            |w| {
                let mut c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                c.watermark = Position(c.watermark.0 + 1);
                w.agent_says(c)
            },
            Rejected(Invalid, &["watermark #6 is beyond the last position #5"]),
        ),
        case(
            "more than MAX_REPORT_HANDLES handles",
            |w| {
                w.active();
            },
            |w| {
                let many: Vec<ResourceId> =
                    (0..=MAX_REPORT_HANDLES as u64).map(|i| ResourceId::from_parts(i, [7; 10])).collect();
                let c = chunk(w, Uuid::nil(), None, many, vec![]);
                w.agent_says(c)
            },
            Rejected(Invalid, &["the chunk names 8193 handles; at most 8192"]),
        ),
        case(
            "a stale observation number",
            |w| {
                w.active();
            },
            |w| {
                let mut c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                c.obs = 1;
                w.agent_says(c)
            },
            Rejected(StaleObservation, &["observation 1 of agent w1 is not newer"]),
        ),
        case(
            "an old epoch",
            |w| {
                w.active();
                accepted(&register(w, false));
            },
            |w| {
                let mut c = chunk(w, Uuid::nil(), None, vec![], vec![]);
                c.epoch = Position(1);
                w.agent_says(c)
            },
            Rejected(WrongEpoch, &["observation from epoch #1"]),
        ),
        case(
            "the breaker holds for chunks too (what is held is still seen present)",
            |w| {
                w.registered();
                w.active_n(8);
            },
            |w| {
                let keep = ids(w)[5..].to_vec();
                let c = chunk(w, Uuid::nil(), None, keep, vec![]);
                w.agent_says(c)
            },
            Effects(&["observation-accepted", "agent-suspect", "resource-seen", "resource-seen", "resource-seen"]),
        ),
    ]);
}

#[test]
fn each_chunk_is_decided_on_its_own() {
    let mut w = World::new();
    w.registered();
    let made = w.active_n(4);
    let mid = made[2].as_uuid();
    // [nil, mid): made[0] held, made[1] gone.
    let c1 = chunk(&mut w, Uuid::nil(), Some(mid), vec![made[0]], vec![]);
    assert_eq!(effect_names(&w.agent_says(c1.clone())), ["observation-accepted", "resource-seen", "resource-lost"]);
    assert_eq!(state_name(&w, made[1]), "lost");
    assert_eq!(state_name(&w, made[2]), "active", "outside the first chunk");
    assert_eq!(state_name(&w, made[3]), "active", "outside the first chunk");
    // [mid, end): both held.
    let c2 = chunk(&mut w, mid, None, vec![made[2], made[3]], vec![]);
    assert_eq!(effect_names(&w.agent_says(c2)), ["observation-accepted", "resource-seen", "resource-seen"]);
    // The first chunk again (lost in a failover, sent again with a new number): nothing more happens but the
    // presence of what it holds.
    let mut again = c1;
    again.obs = w.next_obs(&w.a());
    assert_eq!(effect_names(&w.agent_says(again)), ["observation-accepted", "resource-seen"]);
    // The same chunk with its old number is stale.
    let mut stale = chunk(&mut w, Uuid::nil(), Some(mid), vec![made[0]], vec![]);
    stale.obs = 1;
    refused(&mut w, |w| w.agent_says(stale), StaleObservation, &["not newer"]);
    settle(&w);
}

// --- failure reports --------------------------------------------------------------------------------------------

#[test]
fn report_failure_table() {
    check(vec![
        case(
            "create-failed on a pending resource: failed, its waiting leases broken, its claims returned",
            |w| {
                w.registered();
                w.claimed().leased(None);
            },
            |w| report_failure(w, FailureKind::CreateFailed, "image not found"),
            Effects(&["observation-accepted", "resource-failed", "lease-broken", "claim-releasable"]),
        ),
        case(
            "create-failed on a pending resource still waiting for its claim",
            |w| {
                w.registered().pending_with(|c| c.pools = vec![pool_name("ips")]);
            },
            |w| report_failure(w, FailureKind::CreateFailed, "quota"),
            Effects(&["observation-accepted", "resource-failed", "claim-releasable"]),
        ),
        case(
            "create-failed on a resource released before it was created",
            |w| {
                w.registered().pending();
                accepted(&w.release());
            },
            |w| report_failure(w, FailureKind::CreateFailed, "quota"),
            Effects(&["observation-accepted", "resource-failed"]),
        ),
        case(
            "create-failed on an active resource",
            |w| {
                w.active();
            },
            |w| report_failure(w, FailureKind::CreateFailed, "quota"),
            Rejected(InvalidState, &["is active; a create failure does not apply to it"]),
        ),
        case(
            "create-failed on a releasing resource that was created",
            |w| {
                w.active();
                accepted(&w.release());
            },
            |w| report_failure(w, FailureKind::CreateFailed, "quota"),
            Rejected(InvalidState, &["is releasing; a create failure does not apply to it"]),
        ),
        case(
            "unhealthy on an active resource",
            |w| {
                w.active().leased(None);
            },
            |w| report_failure(w, FailureKind::Unhealthy, "disk errors"),
            Effects(&["observation-accepted", "resource-suspect"]),
        ),
        case(
            "unhealthy on a paused resource",
            |w| {
                w.active();
                pause(w);
            },
            |w| report_failure(w, FailureKind::Unhealthy, "disk errors"),
            Effects(&["observation-accepted", "resource-suspect"]),
        ),
        case(
            "unhealthy on a suspect resource",
            |w| {
                w.active();
                accepted(&report_failure(w, FailureKind::Unhealthy, "disk errors"));
            },
            |w| report_failure(w, FailureKind::Unhealthy, "still disk errors"),
            Rejected(AlreadyDone, &["is already suspect; its health check is due"]),
        ),
        case(
            "unhealthy on a pending resource",
            |w| {
                w.registered().pending();
            },
            |w| report_failure(w, FailureKind::Unhealthy, "?"),
            Rejected(InvalidState, &["is pending; only a created resource can be unhealthy"]),
        ),
        case(
            "destroy-blocked on a releasing resource: recorded, and it stays releasing",
            |w| {
                w.active();
                accepted(&w.release());
            },
            |w| report_failure(w, FailureKind::DestroyBlocked, "volume lh-x is in use by container ci-cache"),
            Effects(&["observation-accepted", "destroy-blocked"]),
        ),
        case(
            "destroy-blocked on an active resource",
            |w| {
                w.active();
            },
            |w| report_failure(w, FailureKind::DestroyBlocked, "in use"),
            Rejected(InvalidState, &["is active; only a releasing resource's destroy can be blocked"]),
        ),
        case(
            "a detail over the limit",
            |w| {
                w.active();
            },
            |w| {
                let detail = "x".repeat(1025);
                report_failure(w, FailureKind::Unhealthy, &detail)
            },
            Rejected(Invalid, &["detail is 1025 bytes"]),
        ),
        case(
            "an unknown resource",
            |w| {
                w.registered();
                w.last_resource = Some(w.d.new_resource_id());
            },
            |w| report_failure(w, FailureKind::CreateFailed, "quota"),
            Rejected(Unknown, &["is not known"]),
        ),
        case(
            "a stale observation number",
            |w| {
                w.active();
                w.obs.insert(w.a(), 0);
            },
            |w| report_failure(w, FailureKind::Unhealthy, "disk"),
            Rejected(StaleObservation, &["observation 1 of agent w1"]),
        ),
    ]);
}

// --- decisions too big for one outcome --------------------------------------------------------------------------

/// Registers the current agent with `n` active resources, each holding `k` granted leases.
fn leased_resources(w: &mut World, n: usize, k: u32) -> Vec<ResourceId> {
    w.registered();
    let agent = w.a();
    let mut made = Vec::with_capacity(n);
    for _ in 0..n {
        let mut cmd = w.allocate_cmd(&agent);
        cmd.capacity = k;
        made.push(cmd.resource);
        accepted(&w.op(cmd));
    }
    for part in made.chunks(MAX_REPORT_HANDLES) {
        let mut report = w.sync_cmd(&agent, |s| s.created = part.to_vec());
        // Everything active so far plus this part: computed directly (the support helper is quadratic here).
        let state = w.state();
        let held: Vec<ResourceId> = state
            .resources_of(state.agent(&agent).unwrap())
            .filter(|r| r.state.is_held())
            .map(|r| r.id)
            .chain(part.iter().copied())
            .collect();
        report.count = held.len() as u64;
        report.digest = HandleDigest::of(&held);
        assert_eq!(effect_names(&w.agent_says(report))[..1], ["observation-accepted"]);
    }
    for id in &made {
        for _ in 0..k {
            let lease = w.d.new_lease_id();
            let acquire = Acquire {
                agent: agent.clone(),
                resource: *id,
                lease,
                holder: "b".into(),
                ttl: None,
                wait_timeout: None,
                priority: 0,
            };
            assert_eq!(effect_names(&w.op(acquire)), ["lease-granted"]);
        }
    }
    made
}

/// Every part encodes within the cap, and the parts are one outcome: same command, parts 0, 1, 2..., every part
/// but the last ends with `decision-continues`. Returns how many parts there are.
#[track_caller]
fn check_parts(parts: &[Outcome]) -> usize {
    for (i, part) in parts.iter().enumerate() {
        let bytes = encode_outcome(part).unwrap_or_else(|e| panic!("{} does not encode: {e}", part.command.type_name));
        assert!(bytes.len() <= MAX_OUTCOME_BYTES);
        assert_eq!(part.part, i as u32, "parts count up");
        assert_eq!((part.cmd_seq, &part.command), (parts[0].cmd_seq, &parts[0].command), "one command's outcome");
        let continues = effect_names(part).iter().filter(|n| **n == "decision-continues").count();
        let last = i + 1 == parts.len();
        assert_eq!(continues, usize::from(!last), "part {i}: only the last part does not continue");
        assert_eq!(part.continues(), !last);
    }
    parts.len()
}

fn count_effects(outcomes: &[Outcome], name: &str) -> usize {
    outcomes.iter().map(|o| effect_names(o).iter().filter(|n| **n == name).count()).sum()
}

fn second_world(w: &World) -> World {
    World {
        d: w.d.clone(),
        obs: w.obs.clone(),
        last_resource: w.last_resource,
        last_lease: w.last_lease,
        last_token: w.last_token,
        agent: w.a(),
    }
}

fn orphaned_everywhere(state: &PartitionState, made: &[ResourceId]) {
    for r in made {
        let resource = state.resource(*r).expect("kept");
        assert_eq!(resource.state.name(), "orphaned");
        assert!(resource.live_leases.is_empty());
    }
    assert!(state.leases().all(|l| l.state.name() == "broken"));
    assert!(state.pending().is_none(), "no work left behind");
}

/// Plays a writer that appends the first part and then crashes after every part: each new writer folds the log
/// (finding the decision unfinished), is offered `interloper` first (refused by the core: a writer bug, never an
/// interleave), and appends the next part. Returns the parts.
fn crash_between_parts(w: &mut World, first: Outcome, interloper: &leasehold_schemas::Envelope) -> Vec<Outcome> {
    let mut parts = vec![first];
    loop {
        w.d.reload();
        let Some(pending) = w.state().pending() else { break };
        assert_eq!(pending.cmd_seq, parts[0].cmd_seq);
        assert_eq!(pending.next_part(), parts.len() as u32, "the log says which part comes next");
        let seq = w.d.next_seq();
        let err = w.d.try_submit_envelope(interloper).expect_err("nothing comes between two parts");
        assert_eq!(err, WriterError::PartsPending { cmd_seq: parts[0].cmd_seq, next_part: parts.len() as u32 });
        assert_eq!(w.d.next_seq(), seq, "the refused command is not consumed");
        parts.push(w.d.continue_pending().expect("a part is pending"));
    }
    assert_eq!(w.d.continue_pending(), Err(WriterError::NothingPending), "no part after the last");
    parts
}

#[test]
fn a_gone_agent_with_thousands_of_leased_resources_is_orphaned_in_bounded_parts() {
    const N: usize = 5200;
    const K: u32 = 6;
    let mut w = World::new();
    let made = leased_resources(&mut w, N, K);
    w.advance(Millis(Millis::from_hours(24).0 + 20_000));
    let mut crashing = second_world(&w);

    // The driver appends every part before the next command, as a writer does.
    let start = w.d.outcomes().len();
    let first = w.sys(MarkGone { agent: w.a() });
    let names = effect_names(&first);
    assert_eq!(names[0], "agent-gone");
    assert_eq!(names.last(), Some(&"decision-continues"));
    let parts = w.d.parts_of(first.cmd_seq).to_vec();
    assert_eq!(parts.len(), w.d.outcomes().len() - start, "nothing else was appended");
    assert!(check_parts(&parts) >= 3, "one part could not hold it all, nor two: {} parts", parts.len());
    assert_eq!(count_effects(&parts, "resource-orphaned"), N);
    assert_eq!(count_effects(&parts, "lease-broken"), N * K as usize);
    assert_eq!(w.state().agent(&w.a()).unwrap().liveness, Liveness::Gone);
    orphaned_everywhere(w.state(), &made);
    settle(&w);

    // A writer that crashes after every part: the next one finds the decision unfinished in the log, refuses to
    // decide anything else first (the sweeper's orphan of one of the resources waits), and finishes it. The log is
    // the same as the uninterrupted writer's.
    crashing.d.finish_parts = false;
    let first = crashing.sys(MarkGone { agent: crashing.a() });
    let waiting = ids_in(&crashing, "active");
    let one = *waiting.last().expect("resources past the first part wait");
    let orphan_one = crashing.d.envelope(SWEEPER, Orphan { agent: crashing.a(), resource: one });
    let crash_parts = crash_between_parts(&mut crashing, first, &orphan_one);
    assert_eq!(crash_parts, parts, "the same parts as the writer that never crashed");
    orphaned_everywhere(crashing.state(), &made);
    // The orphan is decided after the decision, on what it left.
    refused(&mut crashing, |w| w.d.submit_envelope(&orphan_one), AlreadyDone, &["already orphaned"]);
    settle(&crashing);
}

#[test]
fn a_wiped_agent_reporting_thousands_of_handles_missing_loses_them_in_bounded_parts() {
    const N: usize = MAX_REPORT_HANDLES;
    const K: u32 = 3;
    let mut w = World::new();
    let made = leased_resources(&mut w, N, K);
    let o = register(&mut w, true);
    assert_eq!(effect_names(&o), ["agent-registered"]);
    let mut crashing = second_world(&w);

    let report = {
        let a = w.a();
        let all = made.clone();
        w.sync_cmd(&a, |s| s.missing = all)
    };
    assert_eq!(report.count, 0, "a wiped agent holds nothing");
    let first = w.agent_says(report.clone());
    let names = effect_names(&first);
    assert_eq!(names[..3], ["observation-accepted", "agent-breaker-rearmed", "resource-lost"], "no breaker, no resync");
    assert_eq!(names.last(), Some(&"decision-continues"));
    let parts = w.d.parts_of(first.cmd_seq).to_vec();
    assert!(check_parts(&parts) >= 3, "{} parts", parts.len());
    assert_eq!(count_effects(&parts, "resource-lost"), N);
    assert_eq!(count_effects(&parts, "lease-broken"), N * K as usize);
    assert_eq!(count_effects(&parts, "agent-suspect"), 0);
    for r in &made {
        assert_eq!(state_name(&w, *r), "lost");
    }
    let agent = w.state().agent(&w.a()).unwrap();
    assert_eq!(agent.n_held, 0);
    assert!(!agent.is_suspect());
    assert!(w.state().pending().is_none());
    settle(&w);

    // A new incarnation registering between two parts is refused by the core until the report is finished: the
    // report is judged as a whole against the epoch it was sent in.
    crashing.d.finish_parts = false;
    let first = crashing.agent_says(report);
    assert!(count_effects(std::slice::from_ref(&first), "resource-lost") < N);
    let a = crashing.a();
    let register_again = crashing.d.envelope(
        a.as_str(),
        Register { settings: Some(AgentSettings::default()), ..Register::new(a.clone(), Uuid::from_u128(77)) },
    );
    let crash_parts = crash_between_parts(&mut crashing, first, &register_again);
    assert_eq!(crash_parts, parts);
    assert_eq!(ids_in(&crashing, "lost").len(), N);
    accepted(&crashing.d.submit_envelope(&register_again));
    settle(&crashing);
}

// --- regressions: behaviour once found wrong in review, now fixed ----------------------------------------------------

/// Behaviour that once contradicted DESIGN.md (or the schema's own documentation) and was fixed. Each check states
/// the correct behaviour.
#[test]
fn regressions_found_in_review() {
    all_hold(vec![
        (
            "an honest agent with a create in flight is asked for a full resync",
            Box::new(|| {
                // DESIGN 6 and `SyncReport::count`: in-flight creates and destroys count as present; `count` and
                // `digest` cover the handles the agent holds, present or in flight. The writer leaves a pending
                // resource named in flight out of its view, so every report sent while a create runs (a VM
                // takes minutes; reports go every 30 s) asks for a full resync.
                let mut w = World::new();
                w.registered();
                let held = w.active_n(1);
                w.pending();
                let creating = w.r();
                let a = w.a();
                let mut report = w.sync_cmd(&a, |s| s.in_flight = vec![creating]);
                report.count = 2;
                report.digest = HandleDigest::of([&held[0], &creating]);
                let o = w.agent_says(report);
                assert_eq!(effect_names(&o), ["observation-accepted"]);
            }),
        ),
        (
            "an honest agent with a destroy in flight is asked for a full resync",
            Box::new(|| {
                // The same rule for a destroy still running on a releasing resource the agent knows of.
                let mut w = World::new();
                w.registered();
                let made = w.active_n(2);
                accepted(&w.release());
                let a = w.a();
                let mut report = w.sync_cmd(&a, |s| s.in_flight = vec![made[1]]);
                report.count = 2;
                report.digest = HandleDigest::of(&made);
                let o = w.agent_says(report);
                assert_eq!(effect_names(&o), ["observation-accepted"]);
            }),
        ),
        (
            "losses marked under a wiped registration's bypass trip the breaker after it",
            Box::new(|| {
                // DESIGN 5/6: a wiped incarnation's first reports may lose everything without the breaker. Those
                // expected losses stay in the loss window, so once the bypass ends a single ordinary loss trips
                // the breaker (agent suspect, no placements) although 1 of 10 held resources is far under the
                // limit.
                let mut w = World::new();
                w.registered();
                w.active_n(10);
                accepted(&register(&mut w, true));
                w.advance(Millis::from_mins(5));
                let all = ids(&w);
                assert_eq!(count_effects(&[missing(&mut w, all)], "resource-lost"), 10, "the wiped report loses all");
                let fresh = w.active_n(10);
                w.advance(Millis::from_mins(5));
                let o = missing(&mut w, vec![fresh[0]]);
                assert_eq!(effect_names(&o), lost_n(1));
            }),
        ),
        (
            "losses marked after confirm-loss trip the breaker again after the bypass",
            Box::new(|| {
                // The same after an operator's confirm-loss: the confirmed losses, marked by the next report,
                // count against the breaker once the bypass window ends.
                let mut w = World::new();
                w.registered();
                w.active_n(16);
                let m = ids(&w)[..9].to_vec();
                assert_eq!(effect_names(&missing(&mut w, m.clone())), ["observation-accepted", "agent-suspect"]);
                let agent = w.a();
                accepted(&w.op(ConfirmLoss { agent }));
                w.advance(Millis::from_mins(5));
                assert_eq!(count_effects(&[missing(&mut w, m)], "resource-lost"), 9, "the confirmed losses");
                w.advance(Millis::from_mins(5));
                let one = ids_in(&w, "active")[0];
                let o = missing(&mut w, vec![one]);
                assert_eq!(effect_names(&o), lost_n(1));
            }),
        ),
    ]);
}
