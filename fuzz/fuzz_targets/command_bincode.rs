//! A command as a writer reads it from the log (either form; the corpus is mostly bincode).
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_schemas::fuzzing::command_bincode(bytes));
