//! leasehold's pure core: `decide` and `apply`.
//!
//! A partition's state is a fold of outcomes. [`decide`] takes the state, the command's log context and the
//! command, and returns the one outcome for it: effects at positions it assigns, or a rejection that names the
//! thing and the reason. [`apply`] folds an outcome into state. Neither does I/O, reads a clock, draws a random
//! number or reads configuration: every setting that changes a decision is in state, put there by an outcome.
//! That is what makes replay, simulation and audit possible.
//!
//! Architecture invariant: this crate depends on `leasehold-schemas` only. No async, no I/O, no `Serialize` on
//! state (the log is the durable form).

#![forbid(unsafe_code)]

mod apply;
mod decide;
pub mod driver;
pub mod due;
#[doc(hidden)]
pub mod fuzzing;
pub mod invariants;
pub mod state;

pub use apply::{FoldError, apply};
pub use decide::{
    Ctx, DECIDER_VERSION, DEFAULT_DRAIN_GRACE, Decided, EFFECT_BUDGET_BYTES, MAX_ATTRIBUTE_KEY_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES, MAX_CAPACITY, MAX_HOLDER_BYTES, MAX_ID_AHEAD, MAX_MESSAGE_BYTES,
    MAX_POOL_EXCLUSIONS, MAX_POOLS_PER_RESOURCE, MAX_PRIORITY_CAPS, MAX_QUEUED, MAX_QUOTA_KINDS, MAX_QUOTA_PRINCIPALS,
    MAX_TEXT_BYTES, MAX_UNIT_BYTES, WriterError, abandon_pending, continue_work, decide, encode_part, expected_listing,
    internal_error_outcome,
};
pub use state::PartitionState;
