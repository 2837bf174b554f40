//! `replay-bench`: the replay benchmark of issue 8 (`verify` and `rebuild` rates beside the raw read rate of the
//! same source). Everything is in [`leasehold_replay::bench`], whose doc says what it measures and how to read it.

fn main() -> std::process::ExitCode {
    leasehold_replay::bench::main()
}
