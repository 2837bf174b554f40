//! The flags that say which log a command runs on, shared by every command that reads or serves one.

use std::path::PathBuf;

use leasehold_log::jetstream::{Credentials, JetStreamConfig};

/// The embedded log in a data directory, or JetStream.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LogArgs {
    /// The data directory: the embedded log (unless --nats is given) and the projection.
    #[arg(long, default_value = "./leasehold-data")]
    pub(crate) data: PathBuf,
    /// Partitions of the log: recorded when the log is first created, and checked after.
    #[arg(long, default_value_t = 32)]
    pub(crate) partitions: u32,
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
}

impl LogArgs {
    /// The JetStream settings, if --nats was given.
    pub(crate) fn jetstream(&self) -> Option<JetStreamConfig> {
        self.nats.config(self.partitions)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct NatsArgs {
    /// Use NATS JetStream at this URL (comma-separated for several servers) instead of the embedded log.
    /// Credentials go in --creds or --user/--password, never in the URL.
    #[arg(long)]
    pub(crate) nats: Option<String>,
    /// A NATS credentials file.
    #[arg(long, requires = "nats", conflicts_with_all = ["user", "password"])]
    pub(crate) creds: Option<PathBuf>,
    #[arg(long, requires_all = ["nats", "password"])]
    pub(crate) user: Option<String>,
    #[arg(long, requires_all = ["nats", "user"])]
    pub(crate) password: Option<String>,
    /// Stream replicas when the JetStream streams are created, and checked after (3 in production).
    #[arg(long, default_value_t = 1)]
    pub(crate) replicas: usize,
}

impl NatsArgs {
    /// The JetStream settings for `partitions` partitions, if --nats was given.
    pub(crate) fn config(&self, partitions: u32) -> Option<JetStreamConfig> {
        let url = self.nats.as_ref()?;
        let credentials = match (&self.creds, &self.user, &self.password) {
            (Some(file), _, _) => Credentials::CredsFile(file.clone()),
            (None, Some(user), Some(password)) => {
                Credentials::UserPassword { user: user.clone(), password: password.clone() }
            }
            _ => Credentials::None,
        };
        Some(JetStreamConfig { credentials, replicas: self.replicas, ..JetStreamConfig::new(url, partitions) })
    }
}
