//! The `leasehold` command line, built beside the end-to-end tests so they spawn exactly what users run.

fn main() -> anyhow::Result<()> {
    leasehold::main()
}
