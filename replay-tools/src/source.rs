//! Where the log is read from: an embedded data directory, JetStream, a running server's gateway, or an export
//! file. Each gives the same entries in the same order (every command before the outcome that answers it), so every
//! command of the tool works on each.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::error::ErrorKind;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use leasehold_cli_common::nats_args::NatsArgs;
use leasehold_log::Log;
use leasehold_log::embedded::{Embedded, FILE_NAME, NOT_CLOSED_CLEANLY};
use leasehold_log::export::{self, Entry, Header};
use leasehold_log::jetstream::JetStream;

/// Which log to read: exactly one of these. Every flag goes before or after the subcommand ([`SourceArgs::globalise`]),
/// and [`SourceArgs::check`] says what is missing or too much.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// An embedded data directory (`leasehold serve --data DIR`). The log file is locked while `serve` runs on it:
    /// then ask the server instead, with --server.
    #[arg(long, global = true)]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    pub nats: NatsArgs,
    /// A running server's gateway (`http://127.0.0.1:8080`): its log, streamed as an export.
    #[arg(long, global = true)]
    pub server: Option<String>,
    /// The bearer token for --server, when its gateway has tokens: the first line of this file
    /// (or `$LEASEHOLD_TOKEN`).
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// An export file (`leasehold-replay export`).
    #[arg(long, global = true)]
    pub file: Option<PathBuf>,
}

/// The ids of the NATS flags (`leasehold`'s own [`NatsArgs`], flattened here).
const NATS_FLAGS: [&str; 7] = ["nats", "creds", "nkey_seed", "inbox_prefix", "user", "password", "replicas"];

impl SourceArgs {
    /// `command` with every source flag global, so it is taken before or after the subcommand alike. clap checks
    /// `requires` and `conflicts_with` within the part of the command line a flag was given in (a `--creds` after
    /// the subcommand would not see a `--nats` before it), and a required group before the subcommand only: those
    /// relations are dropped here and checked whole by [`SourceArgs::check`].
    pub fn globalise(command: clap::Command) -> clap::Command {
        command.mut_args(|arg| {
            let id = arg.get_id().as_str();
            if NATS_FLAGS.contains(&id) || ["data", "server", "token_file", "file"].contains(&id) {
                arg.global(true)
                    .requires(clap::builder::Resettable::Reset)
                    .conflicts_with(clap::builder::Resettable::Reset)
            } else {
                arg
            }
        })
    }

    /// Exactly one source, and credentials that go with it; the error names the flags and what to give instead.
    pub fn check(&self) -> Result<(), (ErrorKind, String)> {
        let given: Vec<&str> = [
            ("--data DIR", self.data.is_some()),
            ("--nats URL", self.nats.nats.is_some()),
            ("--server URL", self.server.is_some()),
            ("--file FILE", self.file.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        match given.as_slice() {
            [] => {
                return Err((
                    ErrorKind::MissingRequiredArgument,
                    "say which log to read: one of --data DIR, --nats URL, --server URL or --file FILE (before or \
                     after the subcommand)"
                        .to_owned(),
                ));
            }
            [_] => {}
            several => {
                let message = format!("{} name several logs: give exactly one source", several.join(", "));
                return Err((ErrorKind::ArgumentConflict, message));
            }
        }
        let nats = &self.nats;
        let needs_nats = [
            ("--creds", nats.creds.is_some()),
            ("--nkey-seed", nats.nkey_seed.is_some()),
            ("--inbox-prefix", nats.inbox_prefix.is_some()),
            ("--user", nats.user.is_some()),
            ("--password", nats.password.is_some()),
        ];
        if nats.nats.is_none()
            && let Some((flag, _)) = needs_nats.iter().find(|(_, given)| *given)
        {
            return Err((
                ErrorKind::MissingRequiredArgument,
                format!("{flag} is a NATS credential: it needs --nats URL"),
            ));
        }
        let ways = [
            ("--creds", nats.creds.is_some()),
            ("--nkey-seed", nats.nkey_seed.is_some()),
            ("--user/--password", nats.user.is_some() || nats.password.is_some()),
        ];
        let chosen: Vec<&str> = ways.iter().filter_map(|(flag, given)| given.then_some(*flag)).collect();
        if chosen.len() > 1 {
            let message = format!("{} are two kinds of NATS credentials: give one", chosen.join(" and "));
            return Err((ErrorKind::ArgumentConflict, message));
        }
        if nats.user.is_some() != nats.password.is_some() {
            return Err((ErrorKind::MissingRequiredArgument, "--user and --password go together".to_owned()));
        }
        Ok(())
    }
}

/// An opened source.
pub enum Source {
    /// `_copy`: a repaired copy of a log whose writer crashed, read instead of it (removed when done).
    Embedded {
        log: Embedded,
        dir: PathBuf,
        _copy: Option<tempfile::TempDir>,
    },
    Nats {
        log: JetStream,
        url: String,
    },
    File {
        path: PathBuf,
    },
    Server {
        url: String,
        token: Option<String>,
    },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A source's entries, with what is known of them before reading.
pub struct Entries {
    pub partitions: u32,
    /// The last outcome sequence to expect (for progress; 0 when unknown).
    pub last_outcome: u64,
    pub entries: BoxStream<'static, Result<Entry, leasehold_log::Error>>,
    /// The export header, for a file or a server.
    pub header: Option<Header>,
}

impl std::fmt::Debug for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entries")
            .field("partitions", &self.partitions)
            .field("last_outcome", &self.last_outcome)
            .finish()
    }
}

impl Source {
    pub async fn open(args: &SourceArgs) -> anyhow::Result<Source> {
        if let Some(dir) = &args.data {
            let log = match Embedded::open_read_only(dir) {
                Ok(log) => log,
                Err(leasehold_log::Error::Refused(why)) if why.contains(NOT_CLOSED_CLEANLY) => {
                    // Its writer crashed: audit a repaired copy, never the original.
                    let copy = tempfile::tempdir().context("making a directory for a copy of the log")?;
                    std::fs::copy(dir.join(FILE_NAME), copy.path().join(FILE_NAME))
                        .with_context(|| format!("copying the log of {}", dir.display()))?;
                    let log = Embedded::open_existing(copy.path())
                        .with_context(|| format!("repairing a copy of the log of {}", dir.display()))?;
                    eprintln!(
                        "leasehold-replay: the log in {} was not closed cleanly (its writer stopped without closing \
                         it); reading a repaired copy, the original is left as it is",
                        dir.display()
                    );
                    return Ok(Source::Embedded { log, dir: dir.clone(), _copy: Some(copy) });
                }
                Err(leasehold_log::Error::Refused(why)) if why.contains("in use") => bail!(
                    "{why}: `leasehold serve` is running on it (redb locks the file). Ask the server instead: \
                     --server http://ADDRESS (its --listen address)"
                ),
                Err(other) => bail!("{}: {other}", dir.display()),
            };
            return Ok(Source::Embedded { log, dir: dir.clone(), _copy: None });
        }
        if let Some(config) = args.nats.config(0) {
            let url = config.url.clone();
            let log = JetStream::connect(config).await.with_context(|| format!("connecting to {url}"))?;
            return Ok(Source::Nats { log, url });
        }
        if let Some(path) = &args.file {
            if !path.is_file() {
                bail!("{}: no such file", path.display());
            }
            return Ok(Source::File { path: path.clone() });
        }
        if let Some(url) = &args.server {
            return Ok(Source::Server { url: url.trim_end_matches('/').to_owned(), token: token(args)? });
        }
        bail!("say which log to read: --data DIR, --nats URL, --server URL or --file FILE")
    }

    /// What to call it in messages and export headers.
    pub fn describe(&self) -> String {
        match self {
            Source::Embedded { dir, .. } => format!("embedded {}", dir.display()),
            Source::Nats { url, .. } => format!("nats {url}"),
            Source::File { path } => format!("file {}", path.display()),
            Source::Server { url, .. } => format!("server {url}"),
        }
    }

    /// The embedded log, when that is the source.
    pub fn embedded(&self) -> Option<(&Embedded, &PathBuf)> {
        match self {
            Source::Embedded { log, dir, .. } => Some((log, dir)),
            _ => None,
        }
    }

    /// Every entry, outcomes up to `to` (all when `None`).
    pub async fn entries(&self, to: Option<u64>) -> anyhow::Result<Entries> {
        match self {
            Source::Embedded { log, .. } => from_log(log, to).await,
            Source::Nats { log, .. } => from_log(log, to).await,
            Source::File { path } => {
                let file = tokio::fs::File::open(path).await.with_context(|| format!("opening {}", path.display()))?;
                let input = tokio::io::BufReader::with_capacity(256 * 1024, file);
                let (reader, header) =
                    export::Reader::open(input).await.with_context(|| format!("reading {}", path.display()))?;
                Ok(from_reader(reader, header, to))
            }
            Source::Server { url, token } => {
                let address = match to {
                    Some(to) => format!("{url}/v1/export?to={to}"),
                    None => format!("{url}/v1/export"),
                };
                let mut request = reqwest::Client::new().get(address);
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await.with_context(|| format!("asking {url} for its log"))?;
                let status = response.status();
                if !status.is_success() {
                    let body = response.text().await.unwrap_or_default();
                    bail!("{url} answered {status}: {}", body.trim());
                }
                let body = response.bytes_stream().map(|chunk| chunk.map_err(std::io::Error::other));
                let input = tokio_util::io::StreamReader::new(body);
                let (reader, header) =
                    export::Reader::open(input).await.with_context(|| format!("reading the log of {url}"))?;
                Ok(from_reader(reader, header, to))
            }
        }
    }
}

impl Source {
    /// Every outcome (up to `to`), without the commands: for what folds outcomes only (`state`, `rebuild`). From a
    /// log, the commands are not even read (on JetStream they cost most of a full read); from a file or a server,
    /// they are read and skipped.
    pub async fn outcomes(&self, to: Option<u64>) -> anyhow::Result<Entries> {
        match self {
            Source::Embedded { log, .. } => outcomes_of(log, to).await,
            Source::Nats { log, .. } => outcomes_of(log, to).await,
            Source::File { .. } | Source::Server { .. } => {
                let mut entries = self.entries(to).await?;
                entries.entries = entries
                    .entries
                    .filter(|e| std::future::ready(!matches!(e, Ok(Entry::Command { .. } | Entry::DeadLetter { .. }))))
                    .boxed();
                Ok(entries)
            }
        }
    }
}

/// A log's outcomes from the first up to `to` (or the last there is now), read in batches.
async fn outcomes_of<L: Log>(log: &L, to: Option<u64>) -> anyhow::Result<Entries> {
    let mut last = 0;
    for partition in 0..log.partitions() {
        last = last.max(log.last_outcome_seq(partition).await.context("reading the log's last outcome")?);
    }
    let end = to.map_or(last, |to| to.min(last));
    let partitions = log.partitions();
    let log = log.clone();
    let batches = futures::stream::try_unfold(1u64, move |next| {
        let log = log.clone();
        async move {
            if next > end {
                return Ok(None);
            }
            let batch = log.read_outcomes(&leasehold_log::OutcomeFilter::All, next, 1000).await?;
            let batch: Vec<_> = batch.into_iter().filter(|o| o.seq <= end).collect();
            match batch.last() {
                None => Ok(None),
                Some(last) => {
                    let after = last.seq + 1;
                    Ok(Some((futures::stream::iter(batch.into_iter().map(|o| Ok(Entry::Outcome(o)))), after)))
                }
            }
        }
    });
    Ok(Entries { partitions, last_outcome: end, entries: batches.try_flatten().boxed(), header: None })
}

async fn from_log<L: Log>(log: &L, to: Option<u64>) -> anyhow::Result<Entries> {
    let mut last = 0;
    for partition in 0..log.partitions() {
        last = last.max(log.last_outcome_seq(partition).await.context("reading the log's last outcome")?);
    }
    Ok(Entries {
        partitions: log.partitions(),
        last_outcome: to.map_or(last, |to| to.min(last)),
        entries: export::entries(log.clone(), to),
        header: None,
    })
}

fn from_reader<R>(reader: export::Reader<R>, header: Header, to: Option<u64>) -> Entries
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let last = to.map_or(header.to_seq, |to| to.min(header.to_seq));
    let entries = reader.into_stream();
    let entries = match to {
        // The file holds more: stop at the first outcome past `to` (what comes after it is not wanted).
        Some(to) => {
            entries.take_while(move |e| std::future::ready(!matches!(e, Ok(Entry::Outcome(o)) if o.seq > to))).boxed()
        }
        None => entries,
    };
    Entries { partitions: header.partitions, last_outcome: last, entries, header: Some(header) }
}

fn token(args: &SourceArgs) -> anyhow::Result<Option<String>> {
    Ok(leasehold_client::bearer_token(None, args.token_file.as_deref())?)
}

#[cfg(test)]
mod tests {
    use crate::Cli;

    #[test]
    fn nats_flags_and_their_credentials_go_on_either_side_of_the_subcommand() {
        for args in [
            &["lr", "--nats", "nats://127.0.0.1:4222", "--creds", "x.creds", "verify"][..],
            &["lr", "verify", "--nats", "nats://127.0.0.1:4222", "--creds", "x.creds"],
            &["lr", "--nats", "nats://127.0.0.1:4222", "verify", "--creds", "x.creds"],
            &["lr", "--creds", "x.creds", "history", "w1", "--nats", "nats://127.0.0.1:4222"],
        ] {
            let cli = Cli::try_parse_args(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(cli.source.nats.nats.as_deref(), Some("nats://127.0.0.1:4222"), "{args:?}");
            assert_eq!(cli.source.nats.creds.as_deref(), Some(std::path::Path::new("x.creds")), "{args:?}");
        }
        let cli = Cli::try_parse_args(["lr", "why", "--ip", "10.0.0.1", "--server", "http://h:1", "--token-file", "t"])
            .expect("parses");
        assert_eq!(cli.source.server.as_deref(), Some("http://h:1"));
        assert!(cli.source.token_file.is_some());
        for (args, says) in [
            (&["lr", "--nats", "n", "verify", "--creds", "c", "--user", "u", "--password", "p"][..], "two kinds"),
            (&["lr", "verify", "--nats", "n", "--user", "u"], "--user and --password go together"),
            (&["lr", "verify", "--server", "s", "--nats", "n"], "name several logs"),
        ] {
            let error = Cli::try_parse_args(args).expect_err("refused").to_string();
            assert!(error.contains(says), "{args:?}: {error}");
        }
    }
}
