//! A stored outcome's or dead letter's subject and headers, as the JetStream backend reads them.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    leasehold_log::fuzzing::stored(bytes);
});
