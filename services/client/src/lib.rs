//! leasehold's client: the gateway's HTTP API as typed calls, and what a producer needs around them: build a
//! command's envelope with ids it chooses (so that sending it again is safe), send it through the gateway or straight
//! to JetStream, wait for its outcome, and tell apart what became of it ([`Error`]).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold_client::{Gateway, Producer};
//! use leasehold_schemas::command::Allocate;
//!
//! let producer = Producer::new(Gateway::new("http://127.0.0.1:7420")?, "ci:build-7".parse()?);
//! let volume = Allocate::new("w1".parse()?, leasehold_schemas::ResourceId::generate(), "volume", 1);
//! let reference = producer.allocate(volume).await?;
//! println!("{reference}");
//! # Ok(())
//! # }
//! ```
//!
//! - [`gateway`]: [`Gateway`] (submit, submit in batches, read, follow outcomes), [`CommandStatus`], [`Follower`].
//! - [`produce`]: [`Producer`], [`Transport`] (the gateway, JetStream, or JetStream as a producer bound to a
//!   principal: [`Producer::bound`]), [`submit_to_log`], [`LeaseRecord`].
//! - [`error`]: [`Error`] and [`OutcomeUnknown`].
//!
//! Architecture invariant: this crate compiles no server. It names no gateway, projector, worker or domain crate, no
//! axum and no redb (leasehold-log comes without its embedded backend); the records it shares with the gateway live in
//! `leasehold_schemas::api`.

#![forbid(unsafe_code)]

pub mod error;
pub mod gateway;
pub mod produce;

pub use error::{BoxError, Error, ErrorKind, OutcomeUnknown};
pub use gateway::{
    BatchItem, BatchRefusal, CommandStatus, Cursor, DEFAULT_SERVER, DeadLetterInfo, Feed, Follower, Gateway,
    RejectionInfo, SeqOutcome, TOKEN_ENV, bearer_token,
};
pub use produce::{
    LeaseRecord, LeaseRef, PlacementRecord, Producer, Transport, publish_subject, submit_to_log, submit_to_log_as,
};
