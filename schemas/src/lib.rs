//! leasehold's wire format: every message that crosses a process boundary is defined here, and only here.
//!
//! - [`api`]: the records of the gateway's HTTP API that its clients read too (a batch's refusals, its limits).
//! - [`ids`]: names and identifiers (agent and pool names, UUIDv7 ids, positions, log time).
//! - [`command`]: every command, in its class (`op`, `agent`, `sys`), and the [`command::Command`] enum.
//! - [`outcome`]: the one message a writer appends per command: effects or a rejection.
//! - [`envelope`]: the command envelope (schema version, type name, ids, class, issuer, issuer time).
//! - [`codec`]: the one bincode configuration and the JSON form for producers in other languages.
//! - [`subjects`]: NATS subject layout and the partition function (byte-for-byte NATS's `partition()`).
//! - [`text`]: how free text from commands is shown to people (control and bidi characters escaped).
//! - `fuzzing` (hidden): the bodies of the fuzz targets of these decoders, shared with the corpus replay test.
//!
//! Nothing here has behaviour beyond validation and encoding. bincode is not self-describing, so no type in this
//! crate uses `skip_serializing_if`, `flatten`, `untagged` or `tag`; golden fixtures under `tests/fixtures/`
//! are decoded by a test so that any change to the bytes is noticed.

#![forbid(unsafe_code)]

pub mod api;
pub mod codec;
pub mod command;
pub mod envelope;
#[doc(hidden)]
pub mod fuzzing;
pub mod ids;
pub mod mentions;
pub mod outcome;
pub mod pool;
pub mod settings;
pub mod subjects;
pub mod text;

pub use command::Command;
pub use envelope::{CommandClass, Envelope};
pub use ids::{
    AgentName, CommandId, IdError, Issuer, Key, LeaseId, Millis, ObsStamp, PoolName, Position, ResourceId, ResourceRef,
    Source, Timestamp,
};
pub use outcome::{Decision, Effect, Outcome, Rejection, RejectionKind};
/// The UUID type ids are built on, for crates that name it without depending on `uuid` themselves.
pub use uuid::Uuid;

/// The schema version this build writes. Readers accept every version up to this one.
pub const SCHEMA_VERSION: u16 = 6;
