//! A snapshot of partition state, as a writer loads it.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_domain::fuzzing::snapshot(bytes));
