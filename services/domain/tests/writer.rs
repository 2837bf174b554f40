//! What a writer relies on besides deciding: the answers `decide` gives besides an outcome (already decided,
//! unchanged), the parts of a long decision and the refusals that keep them together, the recorded outcome for a
//! command the decider failed on or a part over the size cap, and a fold that refuses an outcome out of order.

mod support;

use leasehold_domain::driver::Answer;
use leasehold_domain::{
    Ctx, Decided, FoldError, WriterError, abandon_pending, apply, continue_work, decide, encode_part,
    internal_error_outcome,
};
use leasehold_schemas::command::{MarkGone, Release};
use leasehold_schemas::outcome::Decision;
use leasehold_schemas::{Outcome, RejectionKind, codec};
use support::*;

/// A registered agent with enough leased resources that orphaning them all takes several parts (of 2 KiB).
fn heavy_world() -> World {
    let mut w = World::with_split_budget(2048);
    w.registered();
    for _ in 0..100 {
        w.pending_with(|c| c.capacity = 8);
        for _ in 0..4 {
            w.leased(None);
        }
    }
    w.advance(leasehold_schemas::Millis::from_hours(25));
    w
}

#[test]
fn a_command_the_decider_failed_on_is_recorded_and_changes_nothing_else() {
    let mut w = World::new();
    w.active();
    let agent = w.a();
    let envelope = w.d.envelope(SWEEPER, MarkGone { agent });
    let before = w.state().clone();
    let ctx = Ctx { cmd_seq: 1000, log_time: w.d.now() };
    // A panic message is free text: a multi-byte character at the cut must not panic in turn.
    let detail = format!("index out of bounds {}", "é".repeat(2000));
    let outcome = internal_error_outcome(w.state(), &ctx, &envelope, &detail).expect("nothing pending");
    let rejection = outcome.rejection().expect("a rejection");
    assert_eq!(rejection.kind, RejectionKind::InternalError);
    assert!(rejection.message.contains("index out of bounds"), "{}", rejection.message);
    assert!(rejection.message.len() <= leasehold_domain::MAX_MESSAGE_BYTES);
    assert_eq!((outcome.cmd_seq, outcome.part), (1000, 0));
    codec::encode_outcome(&outcome).expect("encodable");
    let mut after = before.clone();
    apply(&mut after, &outcome).expect("folds");
    assert_eq!(after.cursor(), 1000);
    assert_same_except_bookkeeping(&before, &after);
    assert_eq!(after.decided_at_seq(envelope.command_id), Some(1000), "a retry is answered: already decided");
}

#[test]
fn a_retried_command_is_already_decided_and_nothing_is_appended() {
    let mut w = World::new();
    w.active();
    let (agent, resource) = (w.a(), w.r());
    let envelope = w.d.envelope(OP, Release { agent, resource, reason: None });
    let first = w.d.submit_envelope(&envelope);
    let state = w.state().clone();
    let ctx = Ctx { cmd_seq: state.cursor() + 7, log_time: w.d.now() };
    assert_eq!(decide(&state, &ctx, &envelope), Ok(Decided::AlreadyDecided { cmd_seq: first.cmd_seq }));
    // A command at or below the cursor is a writer reading the log out of order.
    let behind = Ctx { cmd_seq: state.cursor(), log_time: w.d.now() };
    assert_eq!(
        decide(&state, &behind, &envelope),
        Err(WriterError::NotAfterCursor { cursor: state.cursor(), cmd_seq: state.cursor() })
    );
    let n = w.d.outcomes().len();
    assert_eq!(w.d.submit_envelope(&envelope), first, "the driver answers from the log, as the gateway will");
    assert_eq!(w.d.last_answer(), Answer::AlreadyDecided { cmd_seq: first.cmd_seq });
    assert_eq!(w.d.outcomes().len(), n);
    assert!(*w.state() == state);
}

#[test]
fn a_heartbeat_that_changes_nothing_gets_no_outcome() {
    let mut w = World::new();
    w.registered();
    let agent = w.a();
    let epoch = w.epoch(&agent);
    let issuer = agent.as_str().to_owned();
    let envelope = w.d.envelope(&issuer, leasehold_schemas::command::Heartbeat { agent, epoch });
    let ctx = Ctx { cmd_seq: 99, log_time: w.d.now() };
    assert_eq!(decide(w.state(), &ctx, &envelope), Ok(Decided::Unchanged));
    // One that is due records the agent as seen.
    w.advance(secs(30));
    let ctx = Ctx { cmd_seq: 99, log_time: w.d.now() };
    assert!(matches!(decide(w.state(), &ctx, &envelope), Ok(Decided::Append(_))));
}

#[test]
fn the_parts_of_a_decision_come_before_anything_else() {
    let mut w = heavy_world();
    w.d.finish_parts = false;
    let agent = w.a();
    let first = w.sys(MarkGone { agent: agent.clone() });
    assert!(first.continues());
    let pending = w.state().pending().expect("unfinished").clone();
    assert_eq!((pending.cmd_seq, pending.next_part()), (first.cmd_seq, 1));

    // The core refuses anything else: decide, and the internal-error record of another command.
    let other = w.d.envelope(OP, Release { agent: agent.clone(), resource: w.r(), reason: None });
    let ctx = Ctx { cmd_seq: w.d.next_seq(), log_time: w.d.now() };
    let bug = WriterError::PartsPending { cmd_seq: first.cmd_seq, next_part: 1 };
    assert_eq!(decide(w.state(), &ctx, &other), Err(bug.clone()));
    assert_eq!(internal_error_outcome(w.state(), &ctx, &other, "boom"), Err(bug.clone()));
    assert!(bug.to_string().contains("before deciding anything else"), "{bug}");

    // The next part: same command, next part index, positions going on.
    let second = continue_work(w.state()).expect("a part is pending");
    assert_eq!((second.cmd_seq, second.part, &second.command), (first.cmd_seq, 1, &first.command));
    let Decision::Accepted { first_position, .. } = &second.decision else { panic!("accepted") };
    assert_eq!(*first_position, w.state().next_position());
    assert_eq!(second, continue_work(w.state()).unwrap(), "deciding a part twice gives the same part");

    // The fold refuses parts out of order: the same part twice, a skipped part, a new command between.
    let mut state = w.state().clone();
    apply(&mut state, &second).expect("the next part folds");
    assert!(matches!(apply(&mut state, &second), Err(FoldError::OutOfOrder { .. })));
    let mut skipped = continue_work(&state).unwrap();
    skipped.part += 1;
    let err = apply(&mut state.clone(), &skipped).unwrap_err();
    assert!(err.to_string().contains("expected part 2 of command"), "{err}");
    let mut interleaved = first.clone();
    interleaved.cmd_seq = state.cursor() + 1;
    assert!(matches!(apply(&mut state.clone(), &interleaved), Err(FoldError::OutOfOrder { .. })));
    let mut gap = continue_work(&state).unwrap();
    if let Decision::Accepted { first_position, .. } = &mut gap.decision {
        first_position.0 += 1;
    }
    assert!(matches!(apply(&mut state.clone(), &gap), Err(FoldError::PositionGap { .. })));

    // Finished: nothing pending, and continue_work says so.
    while w.state().pending().is_some() {
        w.d.continue_pending().unwrap();
    }
    assert_eq!(continue_work(w.state()), Err(WriterError::NothingPending));
    assert_eq!(abandon_pending(w.state(), "x"), Err(WriterError::NothingPending));
    settle(&w);
}

#[test]
fn a_part_the_decider_failed_on_abandons_the_rest_on_record() {
    let mut w = heavy_world();
    w.d.finish_parts = false;
    let first = w.sys(MarkGone { agent: w.a() });
    let last = abandon_pending(w.state(), "index out of bounds").expect("a part is pending");
    assert_eq!((last.cmd_seq, last.part), (first.cmd_seq, 1));
    assert_eq!(last.rejection().map(|r| r.kind), Some(RejectionKind::InternalError));
    let mut state = w.state().clone();
    apply(&mut state, &last).expect("folds");
    assert!(state.pending().is_none(), "the partition moves on");
    assert_eq!(state.next_position(), w.state().next_position(), "the abandoned part takes no position");
}

/// `part` with its effects repeated until it is over the size cap, as a bug in the budgets would make it.
fn oversized(mut part: Outcome) -> Outcome {
    let Decision::Accepted { effects, .. } = &mut part.decision else { panic!("an accepted part") };
    let n = codec::MAX_OUTCOME_BYTES / effects.iter().map(codec::encoded_len).sum::<usize>() + 1;
    *effects = (0..n).flat_map(|_| effects.iter().cloned()).collect();
    part
}

#[test]
fn a_part_over_the_cap_is_recorded_as_an_internal_error_where_it_is_encoded() {
    let mut w = heavy_world();
    w.d.finish_parts = false;
    let envelope = w.d.envelope(SWEEPER, MarkGone { agent: w.a() });
    let ctx = Ctx { cmd_seq: w.d.next_seq(), log_time: w.d.now() };
    let Ok(Decided::Append(first)) = decide(w.state(), &ctx, &envelope) else { panic!("a first part") };

    // Under the cap: the part as it is, and the bytes the codec gives it.
    let (same, bytes) = encode_part(first.clone()).expect("encodes");
    assert_eq!(same, first);
    assert_eq!(bytes, codec::encode_outcome(&first).unwrap());

    // A first part over the cap becomes a rejection on record: it folds, and changes nothing else.
    let (recorded, bytes) = encode_part(oversized(first.clone())).expect("the record encodes");
    assert!(bytes.len() <= codec::MAX_OUTCOME_BYTES);
    assert_eq!(codec::decode_outcome(&bytes).unwrap(), recorded);
    assert_eq!((recorded.cmd_seq, recorded.part), (first.cmd_seq, 0));
    let rejection = recorded.rejection().expect("a rejection");
    assert_eq!(rejection.kind, RejectionKind::InternalError);
    assert!(rejection.message.contains("does not encode: outcome of"), "{}", rejection.message);
    assert!(rejection.message.contains("over the limit of 524288 bytes"), "{}", rejection.message);
    let mut state = w.state().clone();
    apply(&mut state, &recorded).expect("folds");
    assert_same_except_bookkeeping(w.state(), &state);

    // A later part over the cap abandons the rest of the decision, on record.
    w.d.submit_envelope(&envelope);
    let second = continue_work(w.state()).expect("a part is pending");
    let (recorded, _) = encode_part(oversized(second.clone())).expect("the record encodes");
    assert_eq!((recorded.cmd_seq, recorded.part), (second.cmd_seq, 1));
    assert_eq!(recorded.rejection().map(|r| r.kind), Some(RejectionKind::InternalError));
    let mut state = w.state().clone();
    apply(&mut state, &recorded).expect("folds");
    assert!(state.pending().is_none(), "the partition moves on");
}

#[test]
fn an_outcome_of_another_partition_does_not_fold() {
    let mut w = World::new();
    w.registered();
    let outcome = w.d.outcomes()[0].clone();
    let mut other = leasehold_domain::PartitionState::new(1, 2);
    assert_eq!(apply(&mut other, &outcome), Err(FoldError::WrongPartition { state: 1, outcome: 0 }));
}

#[test]
fn a_snapshot_restores_the_same_state_and_the_same_decisions() {
    // A state with a decision left unfinished between parts, claims, leases and forgotten ids.
    let mut w = heavy_world();
    w.claimed();
    w.d.finish_parts = false;
    let agent = w.a();
    let first = w.sys(MarkGone { agent });
    assert!(first.continues(), "the decision goes on in parts");
    let state = w.state().clone();
    let bytes = state.to_snapshot().expect("a state encodes");
    let restored = leasehold_domain::PartitionState::from_snapshot(&bytes).expect("and decodes");
    assert_eq!(restored, state);
    assert_eq!(continue_work(&restored), continue_work(&state), "the next part is the same");
    let mut cut = bytes.clone();
    cut.pop();
    assert!(leasehold_domain::PartitionState::from_snapshot(&cut).is_err(), "a cut snapshot is refused");
    cut = bytes.clone();
    cut.push(0);
    assert!(leasehold_domain::PartitionState::from_snapshot(&cut).is_err(), "trailing bytes are refused");
    assert!(leasehold_domain::PartitionState::from_snapshot(b"").is_err());
}
