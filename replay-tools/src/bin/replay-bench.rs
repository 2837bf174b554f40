//! `replay-bench`: the replay benchmark of issue 8 (`verify` and `rebuild` rates beside the raw read rate of the
//! same source). Everything is in [`leasehold_replay::bench`], whose doc says what it measures and how to read it.

/// The allocator of `leasehold-replay` (its `main.rs`), so that the benchmark measures what the tool runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    leasehold_replay::bench::main()
}
