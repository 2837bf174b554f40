//! The `leasehold` binary: the command line in the `leasehold` library.

fn main() -> anyhow::Result<()> {
    leasehold::main()
}
