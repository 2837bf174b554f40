//! The body of the fuzz target of the snapshot decoder (the `fuzz/` crate beside the workspace), shared with the
//! test that replays the committed corpus (`tests/fuzz_corpus.rs`), so that CI runs every input the fuzzer kept
//! through the same code the fuzzer ran.

use crate::PartitionState;

/// A snapshot of partition state, decoded the way a writer loads one from the snapshot store before it checks
/// the partition it names ([`PartitionState::from_snapshot`]). A decoding error is an answer; a panic is a
/// finding: the decoder panicked, or a state it decoded does not encode again to itself.
pub fn snapshot(bytes: &[u8]) {
    let Ok(state) = PartitionState::from_snapshot(bytes) else { return };
    let written = state.to_snapshot().unwrap_or_else(|e| panic!("a decoded snapshot does not encode: {e}"));
    let again =
        PartitionState::from_snapshot(&written).unwrap_or_else(|e| panic!("an encoded snapshot does not decode: {e}"));
    assert_eq!(again, state, "a snapshot encoded again decodes to itself");
}
