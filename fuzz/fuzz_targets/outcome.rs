//! An outcome, as every reader of the outcome log decodes it.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_schemas::fuzzing::outcome(bytes));
