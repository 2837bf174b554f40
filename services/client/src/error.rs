//! The one error of the client: what became of a command, told apart the way a producer acts on it. Refused: nothing
//! was stored, fix it before sending again. Rejected or dead-lettered: decided, the answer is final. Outcome unknown:
//! sent, maybe stored; send it again with the same ids (decided at most once) or ask what became of it. Transport:
//! the gateway or NATS could not be reached or failed before anything was sent. Decode: an answer that is not what
//! the API says.

use std::fmt;

use leasehold_schemas::{Command, Envelope};

use crate::gateway::{CommandStatus, DeadLetterInfo, RejectionInfo};

/// The cause an error carries, when it has one worth its own line.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything the client's calls can fail with. Each message names the thing and what to do; [`Error::kind`] tells
/// the cases apart without matching on the fields.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Refused before anything was stored: the gateway said no (bad input, the token, a class it does not take, not
    /// ready within the time given), the log refused the publish, or the command id names another command. Sending
    /// it again as it is cannot help.
    #[error("{reason}")]
    Refused {
        reason: String,
        #[source]
        source: Option<BoxError>,
    },
    /// Decided: the writer rejected the command (a business rejection, recorded in the log). `what` names it
    /// (`allocate w1.…`).
    #[error("{}", rejected(what, status))]
    Rejected { what: String, status: Box<CommandStatus> },
    /// Not decided: the command went to the dead-letter stream (it could not be decoded).
    #[error("{}", dead_lettered(what, status))]
    DeadLettered { what: String, status: Box<CommandStatus> },
    /// Sent, and maybe stored, but what became of it is not known.
    #[error(transparent)]
    OutcomeUnknown(Box<OutcomeUnknown>),
    /// The gateway or NATS could not be reached, did not answer in time, or failed to answer a read.
    #[error("{message}")]
    Transport {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// A command that does not encode, or an answer (a status, an outcome, a record) that does not decode.
    #[error("{message}")]
    Decode {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
    /// A bad argument: a server that is not an http URL, a token an HTTP header cannot carry, a token file that
    /// cannot be read. Nothing was sent.
    #[error("{message}")]
    Invalid {
        message: String,
        #[source]
        source: Option<BoxError>,
    },
}

/// What kind of [`Error`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    Refused,
    Rejected,
    DeadLettered,
    OutcomeUnknown,
    Transport,
    Decode,
    Invalid,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Refused { .. } => ErrorKind::Refused,
            Error::Rejected { .. } => ErrorKind::Rejected,
            Error::DeadLettered { .. } => ErrorKind::DeadLettered,
            Error::OutcomeUnknown(_) => ErrorKind::OutcomeUnknown,
            Error::Transport { .. } => ErrorKind::Transport,
            Error::Decode { .. } => ErrorKind::Decode,
            Error::Invalid { .. } => ErrorKind::Invalid,
        }
    }

    /// What the gateway (or the log) said of the command, when the error comes with a status.
    pub fn status(&self) -> Option<&CommandStatus> {
        match self {
            Error::Rejected { status, .. } | Error::DeadLettered { status, .. } => Some(status),
            Error::OutcomeUnknown(unknown) => unknown.status.as_ref(),
            _ => None,
        }
    }

    /// Why the writer rejected the command.
    pub fn rejection(&self) -> Option<&RejectionInfo> {
        match self {
            Error::Rejected { status, .. } => status.rejection.as_ref(),
            _ => None,
        }
    }

    pub(crate) fn refused(reason: impl Into<String>) -> Self {
        Error::Refused { reason: reason.into(), source: None }
    }

    pub(crate) fn transport(message: impl Into<String>) -> Self {
        Error::Transport { message: message.into(), source: None }
    }

    pub(crate) fn transport_because(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Transport { message: message.into(), source: Some(source.into()) }
    }

    pub(crate) fn decode(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Decode { message: message.into(), source: Some(source.into()) }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid { message: message.into(), source: None }
    }
}

impl From<OutcomeUnknown> for Error {
    fn from(unknown: OutcomeUnknown) -> Self {
        Error::OutcomeUnknown(Box::new(unknown))
    }
}

fn rejected(what: &str, status: &CommandStatus) -> String {
    let id = &status.command_id;
    match &status.rejection {
        Some(rejection) => format!("{what} rejected ({}): {} [command {id}]", rejection.kind, rejection.message),
        None => format!("{what} rejected [command {id}]"),
    }
}

fn dead_lettered(what: &str, status: &CommandStatus) -> String {
    let id = &status.command_id;
    match &status.dead_letter {
        Some(DeadLetterInfo { reason, source_seq, subject, .. }) => format!(
            "{what} was dead-lettered, not decided: {reason} [command {id}, command seq {source_seq}, subject {subject}]"
        ),
        None => format!("{what} was dead-lettered, not decided [command {id}]"),
    }
}

/// A command was sent, and may have been stored, but what became of it is not known: the gateway went away, or
/// answered something other than an outcome or a refusal, or no outcome came in time. Sending it again with the same
/// ids is safe: the log keeps one copy of a command id, and the writer decides a command id at most once.
#[derive(Debug)]
pub struct OutcomeUnknown {
    pub command_id: String,
    /// What happened.
    pub why: String,
    /// What the gateway said of it, if it said anything.
    pub status: Option<CommandStatus>,
    /// The flags that give the command the same ids again, besides `--command-id`.
    pub resend: String,
}

impl OutcomeUnknown {
    pub fn new(envelope: &Envelope, why: String, status: Option<CommandStatus>) -> Self {
        let resend = match &envelope.body {
            Command::Allocate(allocate) => format!(" --id {}", allocate.resource),
            Command::Acquire(acquire) => format!(" --lease-id {}", acquire.lease),
            _ => String::new(),
        };
        OutcomeUnknown { command_id: envelope.command_id.to_string(), why, status, resend }
    }
}

impl fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = &self.command_id;
        write!(
            f,
            "the outcome of command {id} is unknown ({}): it may have been stored; check with `leasehold command \
             {id}`, or send it again with `--command-id {id}{}`: a command sent again with the same ids is decided \
             at most once",
            self.why, self.resend
        )
    }
}

impl std::error::Error for OutcomeUnknown {}
