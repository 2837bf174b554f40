//! The committed fuzz corpus of the snapshot decoder (`fuzz/corpus/snapshot/`, minimised by `cargo fuzz cmin`),
//! replayed through the body the fuzz target runs (`leasehold_domain::fuzzing::snapshot`): every input the fuzzer
//! kept for its coverage stays a test, run in CI without libFuzzer (README, "Fuzzing").
//!
//! The corpus grew from snapshots of the states below. `LH_FUZZ_SEEDS=DIR` writes them under `DIR/snapshot/`:
//!
//! ```text
//! LH_FUZZ_SEEDS=$PWD/fuzz/seeds cargo test -p leasehold-domain --test fuzz_corpus
//! ```

mod support;

use std::path::Path;

use leasehold_domain::PartitionState;
use leasehold_domain::fuzzing;
use leasehold_schemas::command::MarkGone;
use leasehold_schemas::fuzzing::{replay_corpus, write_seeds};
use support::*;

/// Snapshots of states of the kinds a writer keeps: empty, an agent with a resource and a lease, a claim on a pool,
/// a pool, and many leases with a decision left unfinished between parts.
fn snapshot_seeds() -> Vec<(String, Vec<u8>)> {
    let mut states = vec![("empty", PartitionState::new(2, 8))];
    let mut w = World::new();
    w.active();
    states.push(("active", w.state().clone()));
    w.leased(Some(secs(30)));
    states.push(("leased", w.state().clone()));
    let mut w = World::new();
    w.registered();
    w.claimed();
    states.push(("claimed", w.state().clone()));
    let mut w = World::new();
    w.define_slots("ips", 4, secs(10));
    states.push(("pool", w.state().clone()));
    let mut w = World::with_split_budget(1);
    w.registered();
    for _ in 0..3 {
        w.pending_with(|c| c.capacity = 2);
        w.leased(None);
    }
    w.advance(leasehold_schemas::Millis::from_hours(25));
    w.d.finish_parts = false;
    let agent = w.a();
    assert!(w.sys(MarkGone { agent }).continues(), "the decision goes on in parts");
    states.push(("in-parts", w.state().clone()));
    states.into_iter().map(|(name, state)| (name.to_owned(), state.to_snapshot().expect("a state encodes"))).collect()
}

#[test]
fn the_seeds_are_real_snapshots() {
    let seeds = snapshot_seeds();
    for (name, bytes) in &seeds {
        assert!(PartitionState::from_snapshot(bytes).is_ok(), "{name} decodes");
        fuzzing::snapshot(bytes);
    }
    write_seeds("snapshot", &seeds);
}

#[test]
fn the_snapshot_corpus_replays() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/snapshot");
    assert!(replay_corpus(&corpus, fuzzing::snapshot) > 0);
}
