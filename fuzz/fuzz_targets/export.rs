//! An export file, read as `import` and `leasehold-replay` read it, then written again.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_log::fuzzing::export(bytes));
