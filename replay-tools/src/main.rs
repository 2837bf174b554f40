fn main() -> std::process::ExitCode {
    leasehold_replay::main()
}
