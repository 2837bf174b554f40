//! `leasehold-chaos --minutes M --seed S`: leasehold under faults, checked from outside.
//!
//! A run starts a real cluster: three nats-server nodes (R3 streams, `sync_interval: always`), each in its own
//! network namespace; three `serve --roles worker`; one `serve --roles projector,gateway,sweeper`; agents with real
//! drivers (two dir agents, and a docker agent when the daemon answers), each in its own namespace; and a producer
//! that records every command the log acknowledged. A nemesis then follows a schedule drawn from the seed (see
//! [`nemesis`]), and after it a settle period ends every fault, lets everything catch up, stops the projector and
//! checks ([`check`]). One summary line, then a JSON line: `seed`, `acked`, `faults` by kind, `violations`,
//! `liveness`. Exit 1 on a violation, 2 when the run could not be made.
//!
//! The seed fixes the schedule (which fault, on what, when, for how long) and the workload's choices; it does not
//! fix the interleaving of the processes, which the machine decides: two runs of one seed inject the same faults but
//! may decide commands in other orders.
//!
//! With `LEASEHOLD_CHAOS_EXEC=leasehold` (or `replay`) in its environment, this binary is `leasehold` (or
//! `leasehold-replay`) itself: the harness runs its servers and agents that way.

mod check;
mod nemesis;
mod net;
mod procs;
mod producer;
mod run;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// leasehold's chaos harness (needs root: it makes network namespaces).
#[derive(Debug, Parser)]
#[command(name = "leasehold-chaos", version)]
pub(crate) struct Options {
    /// How long the nemesis runs (fractions allowed: 0.5 is 30 s).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) minutes: f64,
    /// The seed of the fault schedule and the workload.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Where the run's files go (nats stores, data directories, every process's output); default: a new directory
    /// under the system's temporary directory, removed after a clean run and kept after a failed one.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
    /// How long, after the nemesis, every acknowledged command has to be decided (the liveness bound).
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub(crate) settle: Duration,
    /// Run the docker agent: `auto` when the daemon answers (required under CI=true), `on`, `off`.
    #[arg(long, default_value = "auto")]
    pub(crate) docker: String,
    /// The self-test: run with a writer built to break its promise (`double`: one command decided twice; `skip`: one
    /// command acknowledged and never decided), which the checks must report.
    #[arg(long, value_parser = ["double", "skip"])]
    pub(crate) self_test: Option<String>,
    /// Log partitions.
    #[arg(long, default_value_t = 8)]
    pub(crate) partitions: u32,
    /// The pause between two commands of the producer.
    #[arg(long, default_value = "25ms", value_parser = humantime::parse_duration)]
    pub(crate) pace: Duration,
    /// The workers' `--priority-timeout` (the log's creator sets it: how long a dead worker's partitions wait);
    /// default: serve's own.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) priority_timeout: Option<Duration>,
}

fn main() -> ExitCode {
    match std::env::var("LEASEHOLD_CHAOS_EXEC").as_deref() {
        Ok("leasehold") => return leasehold::main(),
        Ok("replay") => return leasehold_replay::main(),
        _ => {}
    }
    let options = Options::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("leasehold-chaos: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // Ctrl-C or SIGTERM drops the run: every process it started is killed and its namespaces and links removed (what
    // it made in Docker goes at the start of the next run).
    let interrupted = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => "SIGTERM",
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            report = run::run(options) => report,
            signal = interrupted => Err(anyhow::anyhow!("stopped by {signal}; everything the run started is stopped")),
        }
    });
    match outcome {
        Ok(report) => {
            println!("{}", report.summary());
            println!("{}", report.json());
            if report.violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(e) => {
            eprintln!("leasehold-chaos: the run could not be made: {e:#}");
            ExitCode::from(2)
        }
    }
}
