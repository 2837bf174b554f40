//! The flags that say which log a command runs on, shared by every command that reads or serves one.

use std::path::PathBuf;

use leasehold_log::jetstream::{Credentials, JetStreamConfig};

/// The embedded log in a data directory, or JetStream.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// The data directory: the embedded log (unless --nats is given) and the projection.
    #[arg(long, default_value = "./leasehold-data")]
    pub data: PathBuf,
    /// Partitions of the log: recorded when the log is first created, and checked after.
    #[arg(long, default_value_t = 32)]
    pub partitions: u32,
    #[command(flatten)]
    pub nats: NatsArgs,
}

impl LogArgs {
    /// The JetStream settings, if --nats was given.
    pub fn jetstream(&self) -> Option<JetStreamConfig> {
        self.nats.config(self.partitions)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// Use NATS JetStream at this URL (comma-separated for several servers) instead of the embedded log.
    /// Credentials go in --creds or --user/--password, never in the URL.
    #[arg(long)]
    pub nats: Option<String>,
    /// A NATS credentials file.
    #[arg(long, requires = "nats", conflicts_with_all = ["user", "password", "nkey_seed"])]
    pub creds: Option<PathBuf>,
    /// A file holding an nkey user seed (`SU...`, as `leasehold credentials --nkey` prints it).
    #[arg(long, requires = "nats", conflicts_with_all = ["user", "password"])]
    pub nkey_seed: Option<PathBuf>,
    /// The prefix of this client's reply subjects: the one its user may subscribe to (`leasehold credentials`
    /// gives user NAME `_INBOX_NAME`; an agent defaults to `_INBOX_<its name>`).
    #[arg(long, requires = "nats")]
    pub inbox_prefix: Option<String>,
    #[arg(long, requires_all = ["nats", "password"])]
    pub user: Option<String>,
    #[arg(long, requires_all = ["nats", "user"])]
    pub password: Option<String>,
    /// Stream replicas when the JetStream streams are created, and checked after (3 in production).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
}

impl NatsArgs {
    /// The JetStream settings for `partitions` partitions, if --nats was given.
    pub fn config(&self, partitions: u32) -> Option<JetStreamConfig> {
        let url = self.nats.as_ref()?;
        let credentials = match (&self.creds, &self.user, &self.password) {
            (Some(file), _, _) => Credentials::CredsFile(file.clone()),
            (None, _, _) if self.nkey_seed.is_some() => {
                Credentials::NkeySeedFile(self.nkey_seed.clone().unwrap_or_default())
            }
            (None, Some(user), Some(password)) => {
                Credentials::UserPassword { user: user.clone(), password: password.clone() }
            }
            _ => Credentials::None,
        };
        Some(JetStreamConfig {
            credentials,
            replicas: self.replicas,
            inbox_prefix: self.inbox_prefix.clone(),
            ..JetStreamConfig::new(url, partitions)
        })
    }
}
