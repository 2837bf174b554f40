//! A command's subject and payload, checked as a writer checks them before it decides.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_schemas::fuzzing::subject(bytes));
