//! `leasehold projection`: look at the read models in a data directory, or rebuild them from the log.

use anyhow::Context;
use leasehold_log::Log;
use leasehold_log::embedded::Embedded;
use leasehold_projector::Projector;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ProjectionCmd {
    /// Print a digest (SHA-256) of each read-model table and the last applied sequence: two projections of the same
    /// log print the same digests.
    Digests(ProjectionArgs),
    /// Drop the read models and fold the log again from sequence 1, then print the digests.
    Rebuild(ProjectionArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ProjectionArgs {
    #[command(flatten)]
    log: crate::nats_args::LogArgs,
}

pub(crate) fn run(cmd: ProjectionCmd) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(async move {
        match cmd {
            ProjectionCmd::Digests(args) => {
                let projector = open(&args)?;
                print(&projector)
            }
            ProjectionCmd::Rebuild(args) => {
                let mut projector = open(&args)?;
                projector.drop_all()?;
                match args.log.jetstream() {
                    None => {
                        let log = Embedded::open(&args.log.data, args.log.partitions)
                            .with_context(|| format!("opening the embedded log in {}", args.log.data.display()))?;
                        rebuild(&mut projector, &log).await?;
                    }
                    Some(config) => {
                        let url = config.url.clone();
                        let log = leasehold_log::jetstream::JetStream::connect(config)
                            .await
                            .with_context(|| format!("connecting to {url}"))?;
                        rebuild(&mut projector, &log).await?;
                    }
                }
                print(&projector)
            }
        }
    })
}

fn open(args: &ProjectionArgs) -> anyhow::Result<Projector> {
    Projector::open(&args.log.data, args.log.partitions).with_context(|| {
        format!("opening the projection in {} (is `leasehold serve` running on it?)", args.log.data.display())
    })
}

async fn rebuild<L: Log>(projector: &mut Projector, log: &L) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let applied = projector.catch_up(log).await?;
    eprintln!("rebuilt up to outcome {applied} in {:.2} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn print(projector: &Projector) -> anyhow::Result<()> {
    println!("applied {}", projector.applied());
    for (table, digest) in projector.digests()? {
        println!("{table:<20} {digest}");
    }
    Ok(())
}
