//! A command in the JSON form, as the gateway and `leasehold publish --file` take it.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| leasehold_schemas::fuzzing::command_json(bytes));
