//! What a writer relies on besides `decide`/`apply`: the recorded outcome for a command the decider failed on,
//! the follow-up commands an outcome asks for, and answers to retried commands.

mod support;

use leasehold_domain::{Ctx, apply, decide, follow_ups, internal_error_outcome};
use leasehold_schemas::command::{Command, MarkGone};
use leasehold_schemas::{RejectionKind, codec};
use support::*;

#[test]
fn a_command_the_decider_failed_on_is_recorded_and_changes_nothing_else() {
    let mut w = World::new();
    w.active();
    let agent = w.a();
    let envelope = w.d.envelope(SWEEPER, MarkGone { agent });
    let before = w.state().clone();
    let ctx = Ctx { cmd_seq: 1000, log_time: w.d.now() };
    let outcome = internal_error_outcome(w.state(), &ctx, &envelope, "index out of bounds");
    let rejection = outcome.rejection().expect("a rejection");
    assert_eq!(rejection.kind, RejectionKind::InternalError);
    assert!(rejection.message.contains("index out of bounds"), "{}", rejection.message);
    assert_eq!(outcome.cmd_seq, 1000);
    codec::encode_outcome(&outcome).expect("encodable");
    let mut after = before.clone();
    apply(&mut after, &outcome);
    assert_eq!(after.cursor(), 1000);
    assert_same_except_bookkeeping(&before, &after);
    assert_eq!(after.recent_outcome(envelope.command_id), Some(&outcome), "a retry gets this answer back");
}

#[test]
fn follow_ups_are_the_same_on_every_writer_and_name_their_origin() {
    let mut w = World::new();
    w.registered();
    // Enough resources with leases that orphaning them all overflows one outcome.
    for _ in 0..4000 {
        w.pending_with(|c| c.capacity = 8);
        for _ in 0..4 {
            w.leased(None);
        }
    }
    w.advance(leasehold_schemas::Millis::from_hours(25));
    let agent = w.a();
    let envelope = w.d.envelope(SWEEPER, MarkGone { agent });
    let ctx = Ctx { cmd_seq: 1_000_000, log_time: w.d.now() };
    let first = decide(w.state(), &ctx, &envelope);
    let again = decide(w.state(), &ctx, &envelope);
    assert_eq!(first, again, "deciding twice gives the same outcome");
    let ups = follow_ups(&first);
    assert_eq!(ups.len(), 1, "one continue-requested, one follow-up");
    assert_eq!(ups, follow_ups(&again), "a writer that re-decides after a failover sends the same follow-ups");
    let Command::Continue(body) = &ups[0].body else { panic!("a sys.continue") };
    let origin = first.positioned_effects().find(|(_, e)| e.name() == "continue-requested").unwrap().0;
    assert_eq!(body.origin, origin);
    assert_eq!(ups[0].causation_id, Some(envelope.command_id.as_uuid()));
    assert_eq!(ups[0].issuer.as_str(), leasehold_domain::WRITER_ISSUER);
    assert_ne!(ups[0].command_id, envelope.command_id);
}

#[test]
fn a_retried_command_gets_its_first_outcome_and_apply_ignores_it() {
    let mut w = World::new();
    w.active();
    let (agent, resource) = (w.a(), w.r());
    let envelope = w.d.envelope(OP, leasehold_schemas::command::Release { agent, resource, reason: None });
    let first = w.d.submit_envelope(&envelope);
    let state = w.state().clone();
    let ctx = Ctx { cmd_seq: state.cursor() + 7, log_time: w.d.now() };
    let retried = decide(&state, &ctx, &envelope);
    assert_eq!(retried, first, "the first outcome, with the first command's sequence");
    let mut after = state.clone();
    apply(&mut after, &retried);
    assert!(after == state, "applying the first outcome again changes nothing");
}
