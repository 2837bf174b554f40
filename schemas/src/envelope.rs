//! The command envelope: who asked for what, when, and with which id.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::command::Command;
use crate::ids::{CommandId, Issuer, Timestamp};

/// Who may send a command: producers and operators (`op`), an agent about its own machine (`agent`), the sweeper
/// and the writer (`sys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandClass {
    Op,
    Agent,
    Sys,
}

impl CommandClass {
    /// The subject token: `op`, `agent` or `sys`.
    pub fn token(self) -> &'static str {
        match self {
            CommandClass::Op => "op",
            CommandClass::Agent => "agent",
            CommandClass::Sys => "sys",
        }
    }
}

impl fmt::Display for CommandClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.token())
    }
}

/// A command with its metadata. On the wire: the format tag, the schema version, the header (type name, ids, class,
/// issuer, issuer time) and then the body (see `codec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<C = Command> {
    /// The schema version the command was written in.
    pub schema_version: u16,
    pub command_id: CommandId,
    /// Must agree with the body's class; for `agent`, the issuer is the agent itself.
    pub class: CommandClass,
    pub issuer: Issuer,
    /// The issuer's own clock: kept for people, never an input to a decision except the staleness horizon.
    pub issued_at: Timestamp,
    /// The request this command belongs to (a user action, a build).
    pub correlation_id: Option<Uuid>,
    /// The command or effect that caused this one.
    pub causation_id: Option<Uuid>,
    pub body: C,
}

impl Envelope<Command> {
    /// An envelope in the oldest schema version that expresses its body (the version it is written in: see
    /// `codec::encode_command`), its class taken from the body.
    pub fn new(command_id: CommandId, issuer: Issuer, issued_at: Timestamp, body: impl Into<Command>) -> Self {
        let body = body.into();
        Envelope {
            schema_version: crate::command::legacy::oldest_version(&body),
            command_id,
            class: body.class(),
            issuer,
            issued_at,
            correlation_id: None,
            causation_id: None,
            body,
        }
    }

    pub fn type_name(&self) -> &'static str {
        self.body.type_name()
    }
}
