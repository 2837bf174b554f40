//! The `leasehold-replay` command line, built beside the end-to-end tests so they spawn exactly what users run.

fn main() -> std::process::ExitCode {
    leasehold_replay::main()
}
