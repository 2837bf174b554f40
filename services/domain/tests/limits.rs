//! The outcome size cap (DESIGN section 9) at its worst: the largest unit of work, and a report at the handle
//! limit whose resources carry full lease queues, must all encode under `codec::MAX_OUTCOME_BYTES`.

mod support;

use leasehold_domain::{MAX_CAPACITY, MAX_HOLDER_BYTES, MAX_UNIT_BYTES};
use leasehold_schemas::codec;
use leasehold_schemas::command::{Acquire, MAX_REPORT_HANDLES};
use leasehold_schemas::ids::Millis;
use leasehold_schemas::outcome::Effect;
use support::*;

fn fill_queue(w: &mut World, n: usize) {
    for _ in 0..n {
        let lease = w.d.new_lease_id();
        let holder = "h".repeat(MAX_HOLDER_BYTES);
        let cmd = Acquire {
            agent: w.a(),
            resource: w.r(),
            lease,
            holder,
            ttl: Some(Millis(u64::MAX / 2)),
            wait_timeout: Some(Millis(u64::MAX / 2)),
            priority: 0,
        };
        accepted(&w.op(cmd));
    }
}

#[test]
fn the_largest_unit_fits_its_bound() {
    let mut w = World::new();
    w.registered().pending_with(|c| c.capacity = MAX_CAPACITY);
    fill_queue(&mut w, MAX_CAPACITY as usize);
    let (agent, resource) = (w.a(), w.r());
    let outcome = w.report_created(&agent, resource);
    let granted = outcome.effects().iter().filter(|e| matches!(e, Effect::LeaseGranted { .. })).count();
    assert_eq!(granted, MAX_CAPACITY as usize);
    let effects_bytes: usize = outcome.effects().iter().map(codec::encoded_len).sum();
    assert!(effects_bytes <= MAX_UNIT_BYTES, "{effects_bytes} bytes of effects in one unit");
    codec::encode_outcome(&outcome).expect("fits the outcome cap");
}

#[test]
fn a_full_report_of_heavy_units_continues_and_every_outcome_fits() {
    let mut w = World::new();
    w.registered();
    // 40 pending resources with full queues of 64 leases, then enough light ones to reach the handle limit.
    let mut heavy = Vec::new();
    for _ in 0..40 {
        w.pending_with(|c| c.capacity = 64);
        fill_queue(&mut w, 64);
        heavy.push(w.r());
    }
    let mut light = Vec::new();
    while heavy.len() + light.len() < MAX_REPORT_HANDLES {
        w.pending();
        light.push(w.r());
    }
    let agent = w.a();
    let first = w.d.outcomes().len();
    let created: Vec<_> = heavy.iter().chain(&light).copied().collect();
    let outcome = w.sync(&agent, |r| r.created = created.clone());
    accepted(&outcome);
    let mut n_continued = 0;
    for o in &w.d.outcomes()[first..] {
        let bytes = codec::encode_outcome(o).expect("every outcome fits the cap").len();
        assert!(bytes <= codec::MAX_OUTCOME_BYTES, "{bytes}");
        n_continued += o.effects().iter().filter(|e| matches!(e, Effect::DecisionContinues { .. })).count();
    }
    assert!(n_continued >= 1, "a report this heavy must continue in further parts");
    let state = w.state();
    assert!(created.iter().all(|id| state.resource(*id).unwrap().state.name() == "active"));
    assert!(state.pending().is_none(), "every part was appended");
    leasehold_domain::invariants::check(state).unwrap();
    assert!(w.d.rebuild() == *w.state());
}

/// Red team (issue 19 item 1): a pending resource holds `MAX_CAPACITY` leases within its capacity and
/// `MAX_QUEUED` more queued beyond it; when the queued ones' waits are over, its activation grants the first and
/// fails the rest in one unit, which `MAX_QUEUED`'s doc says fits `MAX_UNIT_BYTES`.
#[test]
fn the_largest_unit_with_a_full_queue_fits_its_bound() {
    let mut w = World::new();
    w.registered().pending_with(|c| c.capacity = MAX_CAPACITY);
    fill_queue(&mut w, MAX_CAPACITY as usize);
    for _ in 0..leasehold_domain::MAX_QUEUED {
        let lease = w.d.new_lease_id();
        let cmd = Acquire {
            agent: w.a(),
            resource: w.r(),
            lease,
            holder: "h".repeat(MAX_HOLDER_BYTES),
            ttl: Some(Millis(u64::MAX / 2)),
            wait_timeout: Some(Millis::from_secs(1)),
            priority: 0,
        };
        let outcome = w.op(cmd);
        assert_eq!(effect_names(&outcome), ["lease-queued"], "{:?}", outcome.rejection());
    }
    w.advance(Millis::from_secs(2));
    let (agent, resource) = (w.a(), w.r());
    let outcome = w.report_created(&agent, resource);
    let granted = outcome.effects().iter().filter(|e| matches!(e, Effect::LeaseGranted { .. })).count();
    let failed = outcome.effects().iter().filter(|e| matches!(e, Effect::LeaseFailed { .. })).count();
    assert_eq!((granted, failed), (MAX_CAPACITY as usize, leasehold_domain::MAX_QUEUED));
    let effects_bytes: usize = outcome.effects().iter().map(codec::encoded_len).sum();
    assert!(effects_bytes <= MAX_UNIT_BYTES, "{effects_bytes} bytes of effects in one unit");
    codec::encode_outcome(&outcome).expect("fits the outcome cap");
}
