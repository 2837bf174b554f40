//! The records of the gateway's HTTP API that both ends name: the gateway answers them, `leasehold-client` reads
//! them. They live here, not in the gateway, so that a producer can read them without compiling a server; they are
//! JSON only (never bincode), and the gateway's contract tests pin their form.

use serde::{Deserialize, Serialize};

/// The most commands one batch (`POST /v1/commands/batch`) takes: what one atomic batch on JetStream holds
/// (`leasehold_log::MAX_APPEND_RECORDS`, which the gateway checks this against), so that a batch is one publish.
pub const MAX_BATCH_COMMANDS: usize = 1000;

/// The most bytes a batch's body may take: 16 MiB. Not [`MAX_BATCH_COMMANDS`] × `MAX_COMMAND_BYTES` (1 GiB): the body
/// is read whole before anything is decoded, so this bounds what one request holds in memory, and a few requests of
/// 1 GiB would exhaust a gateway. A command is a few hundred bytes of JSON, so a thousand of them fit many times over,
/// and one command of the largest size (1 MiB) still fits; a client with large commands sends fewer per batch.
pub const MAX_BATCH_BYTES: usize = 16 << 20;

/// Why one command of a batch was refused; the others are not held back by it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BatchRefusal {
    /// Its place in the request, from 0.
    pub index: usize,
    /// Its command id, when the item has one that reads (a malformed item may not).
    pub command_id: Option<String>,
    /// What was wrong and what to do, as `POST /v1/commands` says it.
    pub error: String,
    /// What `POST /v1/commands` would have answered for it alone: 400 (bad input: nothing stored), 403 (not an `op`
    /// command), 409 (its id names another command), or 503 (the log could not say: it may have been stored, and
    /// sending it again is safe).
    pub status_code: u16,
}
