//! The `leasehold` binary: the command line in the `leasehold` library.

fn main() -> std::process::ExitCode {
    leasehold::main()
}
