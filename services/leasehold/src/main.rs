//! The `leasehold` binary: parses the command line and hands off to the library code of each role.

use clap::{Parser, Subcommand};

mod demo;

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "An event-sourced command queue for things that cost money and can leak"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a scripted scenario through the decider in memory and print its timeline.
    Demo,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Demo => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let summary = demo::run(&mut out)?;
            if !summary.refold_matches {
                anyhow::bail!("folding the demo's outcomes from scratch gave a different state");
            }
        }
    }
    Ok(())
}
