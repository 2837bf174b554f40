//! The `leasehold` command line: parses it and hands off to the library code of each role. The binary
//! (`main.rs`) calls [`main`]; the end-to-end tests build their own binary on it, so what they spawn is what users run.

use clap::{Parser, Subcommand};
use leasehold_cli_common::{logs, nats_args, output, timeline};
use leasehold_client::ErrorKind;

mod agents;
mod bench;
mod bulk;
mod client;
mod credentials;
mod demo;
mod demo_docker;
#[cfg(test)]
mod golden;
mod policy;
mod produce;
mod projection;
mod query;
mod quota;
mod ready;
mod serve;
mod stop;
mod words;

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "An event-sourced command queue for things that cost money and can leak",
    after_help = EXIT_STATUS_HELP
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Cmd,
}

/// The exit statuses, as `--help` lists them.
const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  done (a producer command: accepted; acquire --block: granted)
  1  failed: refused, rejected or dead-lettered (the outcome is known), or an error before anything was sent
  2  bad command line (nothing was sent)
  3  outcome unknown: a producer command was sent and may have been stored (no outcome within --timeout, or the
     gateway went away). stdout has what is known (allocate: the resource reference; acquire: the lease; json: the
     status), stderr how to check (`leasehold command ID`) or send it again safely (--command-id ID, with --id for
     allocate, --lease-id for acquire): a command sent again with the same ids is decided at most once
  4  acquire --block: the lease is still waiting at --timeout (it goes on waiting)";

/// The flags of the producer and query commands, accepted before or after the subcommand.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct GlobalArgs {
    /// The gateway to talk to (producer commands without --nats, and every query).
    #[arg(long, global = true, value_name = "URL", env = "LEASEHOLD_SERVER", default_value = client::DEFAULT_SERVER)]
    pub(crate) server: String,
    /// What to print on stdout: aligned columns, or one JSON value.
    #[arg(long, global = true, value_enum, default_value_t = output::OutputFormat::Table)]
    pub(crate) output: output::OutputFormat,
    /// Who sends the commands, for the audit trail (printable ASCII, no spaces); default `cli:$USER`, or `cli`. A
    /// gateway with tokens records your token's principal instead.
    #[arg(long, global = true)]
    pub(crate) issuer: Option<String>,
    /// With --nats: send as a producer bound to principal P, as the NATS user `leasehold credentials producer NAME
    /// --principal P` makes must (it may publish only on lh.in.op@P.>). The issuer is P, each command goes on
    /// lh.in.op@P.<key>.<id>, and the writer dead-letters anything stored there that is not P's own allocation,
    /// placement, lease or resource command. Refused without --nats: a gateway records its token's principal.
    #[arg(long, global = true, value_name = "P")]
    pub(crate) as_principal: Option<String>,
    /// The bearer token for a gateway with --tokens, on the first line of FILE. The environment variable
    /// LEASEHOLD_TOKEN is read when neither this nor --gateway-token is given.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "gateway_token")]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// The bearer token itself (not `--token`: that is a lease's token). Other users can see it in `ps`: prefer
    /// LEASEHOLD_TOKEN or --token-file.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub(crate) gateway_token: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the real services on a temporary directory, walk a scripted story through them, print its timeline.
    Demo {
        /// Keep the demo's data directory (its log and projection) here, for `leasehold-replay --data DIR`.
        #[arg(long, value_name = "DIR")]
        keep: Option<std::path::PathBuf>,
        /// `dir` (the default: directories, needing nothing but cargo) or `docker`: real containers and addresses on
        /// the local Docker daemon, with an image the demo makes itself (a static busybox; nothing is pulled) and
        /// removes at the end with everything else it made.
        #[arg(long, value_enum, default_value_t = demo::DemoDriver::Dir)]
        driver: demo::DemoDriver,
        /// Keep the services up after the story, for the operator's view (the /ui address it prints) and the
        /// command line, until Ctrl-C; then stop and clean up as without it.
        #[arg(long)]
        hold: bool,
    },
    /// Run leasehold's roles over the embedded log (the default) or NATS JetStream.
    Serve(serve::ServeArgs),
    /// Print a completion script for SHELL on stdout: `source <(leasehold completions bash)`, or save it where your
    /// shell looks (bash: ~/.local/share/bash-completion/completions/leasehold; zsh: a directory of $fpath as
    /// _leasehold; fish: ~/.config/fish/completions/leasehold.fish).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The agent of a machine (`agent run --name N --driver dir:PATH --nats URL`), and what operators do to agents.
    #[command(subcommand)]
    Agent(agents::AgentCmd),
    /// The read models: print their digests, or rebuild them from the log.
    #[command(subcommand)]
    Projection(projection::ProjectionCmd),
    /// Print the NATS user of a worker, producer or sweeper: only what that role needs (agents: `agent credentials`).
    Credentials(credentials::ServiceCredentialsArgs),
    /// Benchmarks of the log this build runs on (never tests: they print figures).
    #[command(subcommand)]
    Bench(bench::BenchCmd),

    /// Allocate a resource on an agent; prints its reference, `<agent>.<id>`.
    Allocate(produce::AllocateArgs),
    /// Ask for a lease on a resource; prints the lease (`<agent>.<lease id>`), its state and its token.
    Acquire(produce::AcquireArgs),
    /// Extend an active lease.
    Renew(produce::RenewArgs),
    /// Give a lease back.
    ReleaseLease(produce::ReleaseLeaseArgs),
    /// Order a resource destroyed (its leases break at once).
    Release(produce::ReleaseArgs),
    /// Stop new leases on a resource (maintenance); existing leases stay.
    Pause(produce::PauseArgs),
    /// End a pause.
    Unpause(produce::UnpauseArgs),
    /// Change a resource's capacity or attributes.
    Update(produce::UpdateArgs),
    /// Say that a resource is failing: it turns suspect and its agent is asked for a health check.
    ReportFailure(produce::ReportFailureArgs),
    /// Publish many commands at once from a file of one JSON command a line (`--file F`, `-` for stdin), in batches,
    /// through the gateway or straight to JetStream (--nats), without waiting for outcomes. Prints each command's id
    /// and command sequence (`duplicate` when it was stored before) or why it was refused. Sending the file again is
    /// safe: each command keeps its id. Exit 1 if any was refused, 3 if any may not have been stored.
    Publish(bulk::PublishArgs),
    /// Pools of identifiers (IPv4 addresses, slots, ports).
    #[command(subcommand)]
    Pool(PoolCmd),
    /// The cluster policy, recorded in the log: agent timeouts, the loss breaker, the default claim cool-down.
    #[command(subcommand)]
    Policy(policy::PolicyCmd),
    /// Quotas: the most resources of each kind some principals (issuers) may hold at once, across the cluster.
    #[command(subcommand)]
    Quota(quota::QuotaCmd),

    /// Show one resource: `<agent>.<id>`, or the id alone for one allocated without --agent (where its placement
    /// went, or what it waits on).
    Get {
        /// The resource, `<agent>.<id>`, or a placed resource's id.
        #[arg(value_name = "REF")]
        resource: query::GetTarget,
    },
    /// List resources.
    Ls(query::LsArgs),
    /// List leases: of one resource, or all of them.
    Leases(query::LeasesArgs),
    /// List the agents.
    Agents,
    /// Show what became of a command: its status and outcome.
    Command {
        /// The command id.
        #[arg(value_name = "CMD_ID")]
        id: leasehold_schemas::CommandId,
    },
    /// Follow outcomes as they are decided, one line each, until interrupted.
    Watch(query::WatchArgs),
    /// The dead-letter stream: commands that could not be decoded.
    #[command(subcommand)]
    Dlq(DlqCmd),
}

#[derive(Debug, Subcommand)]
enum PoolCmd {
    /// Define a pool: the addresses of a subnet (--ipv4), slots (--slots) or ports (--ports).
    Define(produce::PoolDefineArgs),
    /// Change a pool: give its whole new definition. Grow it (--ipv4 with the same network and a shorter prefix,
    /// more --slots, --ports with the same first port and a later last one), change its --exclude list (all of
    /// it: an address no longer given becomes usable; one newly given stays with its holder until freed, then is
    /// never handed out), or its --cooldown. A slot pool may get fewer slots (a slot above the new count stays with
    /// its holder until freed); an address or port pool only grows.
    Update(produce::PoolDefineArgs),
    /// Delete a pool nobody holds or waits for.
    Delete(produce::PoolDeleteArgs),
    /// Free what an orphan holds of pools defined with `--orphans hold`, on record with --reason: its agent was
    /// declared gone and will not come back to confirm the destroy (its machine is known to be gone).
    FreeOrphan(produce::PoolFreeOrphanArgs),
    /// List the pools.
    Ls,
}

#[derive(Debug, Subcommand)]
enum DlqCmd {
    /// List the dead letters, oldest first.
    Ls(query::DlqLsArgs),
}

/// Runs the command line of this process and exits: 0, or the error and its causes on stderr (one line each, no
/// backtrace: a rejected command is an answer, not a crash) and the exit status of [`EXIT_STATUS_HELP`]. With
/// `--output json`, a producer or query command that failed before it printed anything prints `{"error": ...}` (and
/// what it knows: the command id, the reference) on stdout too.
pub fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            output::emit_error(&e);
            // Errors quote the gateway, the log and what producers wrote: each is shown escaped, but for those made
            // safe to show by their makers (the command `acquire --block` says to run again, to be pasted as it is).
            let made_safe = |error: &(dyn std::error::Error + 'static)| error.is::<produce::StillWaiting>();
            // The log's times in them (a rejection's "cordoned since ...Z") read in this machine's zone; the JSON
            // error keeps them as they are.
            let clock = output::Clock::system();
            let mut chain = e.chain();
            if let Some(error) = chain.next() {
                eprintln!("error: {}", clock.localize(&output::show_error(error, made_safe(error))));
            }
            for cause in chain {
                eprintln!("  caused by: {}", clock.localize(&output::show_error(cause, made_safe(cause))));
            }
            std::process::ExitCode::from(exit_status(&e))
        }
    }
}

/// The exit status of an error (see [`EXIT_STATUS_HELP`]).
fn exit_status(error: &anyhow::Error) -> u8 {
    let unknown = error.is::<client::OutcomeUnknown>()
        || error.downcast_ref::<leasehold_client::Error>().is_some_and(|e| e.kind() == ErrorKind::OutcomeUnknown);
    if unknown || error.is::<bulk::SomeUnknown>() {
        produce::EXIT_OUTCOME_UNKNOWN
    } else if error.is::<produce::StillWaiting>() {
        produce::EXIT_STILL_WAITING
    } else if error.is::<policy::BadCommandLine>() {
        2
    } else {
        1
    }
}

/// Prints clap's refusal of the command line and exits with its status (2; help and version: 0). An error echoes what
/// was given (`invalid value '...'`), which may hold escape sequences or bidi overrides: each line goes through the
/// one escaping every other message uses. Help and version are leasehold's own text, printed as they are.
fn parse_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let rendered = e.render().to_string();
    let escaped: Vec<String> =
        rendered.lines().map(|line| leasehold_schemas::text::escape_for_display(line).into_owned()).collect();
    eprintln!("{}", escaped.join("\n"));
    std::process::exit(e.exit_code());
}

fn run() -> anyhow::Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => parse_error(e),
    };
    match cli.command {
        Cmd::Demo { keep, driver, hold } => {
            let hold = if hold { demo::Hold::UntilInterrupted } else { demo::Hold::No };
            let summary = demo::run(&mut std::io::stdout(), keep.as_deref(), driver, hold)?;
            if !summary.refold_matches {
                anyhow::bail!("folding the demo's outcomes from scratch gave different read models");
            }
        }
        Cmd::Bench(cmd) => bench::run(cmd)?,
        Cmd::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "leasehold", &mut script);
            output::emit(&String::from_utf8_lossy(&script));
        }
        Cmd::Credentials(args) => credentials::service(args)?,
        Cmd::Projection(cmd) => projection::run(cmd)?,
        Cmd::Agent(agents::AgentCmd::Retire(args)) => produce_cmd(produce::ProduceCmd::AgentRetire(args), &cli.global)?,
        Cmd::Agent(agents::AgentCmd::ConfirmLoss(args)) => {
            produce_cmd(produce::ProduceCmd::AgentConfirmLoss(args), &cli.global)?
        }
        Cmd::Agent(agents::AgentCmd::Unretire(args)) => {
            produce_cmd(produce::ProduceCmd::AgentUnretire(args), &cli.global)?
        }
        Cmd::Agent(agents::AgentCmd::Cordon(args)) => produce_cmd(produce::ProduceCmd::AgentCordon(args), &cli.global)?,
        Cmd::Agent(agents::AgentCmd::Drain(args)) => produce_cmd(produce::ProduceCmd::AgentDrain(args), &cli.global)?,
        Cmd::Agent(agents::AgentCmd::Uncordon(args)) => {
            produce_cmd(produce::ProduceCmd::AgentUncordon(args), &cli.global)?
        }
        Cmd::Agent(cmd) => {
            logs::init("info");
            agents::run(cmd)?;
        }
        Cmd::Serve(args) => {
            logs::init("info");
            serve::run(args)?;
        }
        Cmd::Allocate(args) => produce_cmd(produce::ProduceCmd::Allocate(args), &cli.global)?,
        Cmd::Acquire(args) => produce_cmd(produce::ProduceCmd::Acquire(args), &cli.global)?,
        Cmd::Renew(args) => produce_cmd(produce::ProduceCmd::Renew(args), &cli.global)?,
        Cmd::ReleaseLease(args) => produce_cmd(produce::ProduceCmd::ReleaseLease(args), &cli.global)?,
        Cmd::Release(args) => produce_cmd(produce::ProduceCmd::Release(args), &cli.global)?,
        Cmd::Pause(args) => produce_cmd(produce::ProduceCmd::Pause(args), &cli.global)?,
        Cmd::Unpause(args) => produce_cmd(produce::ProduceCmd::Unpause(args), &cli.global)?,
        Cmd::Update(args) => produce_cmd(produce::ProduceCmd::Update(args), &cli.global)?,
        Cmd::ReportFailure(args) => produce_cmd(produce::ProduceCmd::ReportFailure(args), &cli.global)?,
        Cmd::Publish(args) => {
            output::errors_as(cli.global.output);
            client_runtime()?.block_on(bulk::run(args, &cli.global))?
        }
        Cmd::Pool(PoolCmd::Define(args)) => produce_cmd(produce::ProduceCmd::PoolDefine(args), &cli.global)?,
        Cmd::Pool(PoolCmd::Update(args)) => produce_cmd(produce::ProduceCmd::PoolUpdate(args), &cli.global)?,
        Cmd::Pool(PoolCmd::Delete(args)) => produce_cmd(produce::ProduceCmd::PoolDelete(args), &cli.global)?,
        Cmd::Pool(PoolCmd::FreeOrphan(args)) => produce_cmd(produce::ProduceCmd::PoolFreeOrphan(args), &cli.global)?,
        Cmd::Pool(PoolCmd::Ls) => query_cmd(query::QueryCmd::Pools, &cli.global)?,
        Cmd::Policy(cmd) => {
            output::errors_as(cli.global.output);
            client_runtime()?.block_on(policy::run(cmd, &cli.global))?
        }
        Cmd::Quota(cmd) => {
            output::errors_as(cli.global.output);
            client_runtime()?.block_on(quota::run(cmd, &cli.global))?
        }
        Cmd::Get { resource: query::GetTarget::Resource(resource) } => {
            query_cmd(query::QueryCmd::Get(resource), &cli.global)?
        }
        Cmd::Get { resource: query::GetTarget::Placement(id) } => {
            query_cmd(query::QueryCmd::Placement(id), &cli.global)?
        }
        Cmd::Ls(args) => query_cmd(query::QueryCmd::Ls(args), &cli.global)?,
        Cmd::Leases(args) => query_cmd(query::QueryCmd::Leases(args), &cli.global)?,
        Cmd::Agents => query_cmd(query::QueryCmd::Agents, &cli.global)?,
        Cmd::Command { id } => query_cmd(query::QueryCmd::Command(id), &cli.global)?,
        Cmd::Watch(args) => query_cmd(query::QueryCmd::Watch(args), &cli.global)?,
        Cmd::Dlq(DlqCmd::Ls(args)) => query_cmd(query::QueryCmd::DeadLetters(args), &cli.global)?,
    }
    Ok(())
}

/// A producer command, on a runtime of its own.
fn produce_cmd(command: produce::ProduceCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    output::errors_as(global.output);
    client_runtime()?.block_on(produce::run(command, global))
}

/// A query command, on a runtime of its own.
fn query_cmd(command: query::QueryCmd, global: &GlobalArgs) -> anyhow::Result<()> {
    output::errors_as(global.output);
    client_runtime()?.block_on(query::run(command, global))
}

/// One thread is plenty for a command that waits on one request at a time.
fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    /// The completion scripts name every command, the agent's subcommands included, for each shell.
    #[test]
    fn completions_name_the_commands_in_every_shell() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
            let script = String::from_utf8(script).unwrap();
            for word in ["allocate", "acquire", "cordon", "uncordon", "completions", "server"] {
                assert!(script.contains(word), "{shell}: the script lacks {word}");
            }
        }
    }

    /// The command line's definition holds together (clap's own checks: no two flags alike, defaults parse).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
