//! The `leasehold` command line: parses it and hands off to the library code of each role. The binary
//! (`main.rs`) calls [`main`]; the end-to-end tests build their own binary on it, so what they spawn is what users run.

use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod nats_args;
mod projection;
mod serve;

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
    /// Run leasehold's roles over the embedded log (the default) or NATS JetStream.
    Serve(serve::ServeArgs),
    /// The read models: print their digests, or rebuild them from the log.
    #[command(subcommand)]
    Projection(projection::ProjectionCmd),
    /// Benchmarks of the log this build runs on (never tests: they print figures).
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

/// Runs the command line of this process.
pub fn main() -> anyhow::Result<()> {
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
        Cmd::Bench(cmd) => bench::run(cmd)?,
        Cmd::Projection(cmd) => projection::run(cmd)?,
        Cmd::Serve(args) => {
            init_tracing();
            serve::run(args)?;
        }
    }
    Ok(())
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: info).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
