//! leasehold's end-to-end tests live in `tests/e2e/`; this crate has no code of its own besides the binary they
//! spawn (`leasehold-e2e`, the `leasehold` command line).
