//! leasehold's agent (DESIGN section 6): the process on a machine that holds resources. It follows its own outcome
//! subject, makes and destroys what it is told to, and reports what really exists.
//!
//! The loop:
//! - It registers a new incarnation and folds its subject `lh.evt.<p>.<agent>` from the start into a small model of
//!   its own (per resource: what to make, create ordered, seen present, releasing). When it reads its own
//!   registration it has read everything decided before it: its epoch is that registration's position, and only
//!   then does it act.
//! - It creates what was ordered created and destroys what is releasing, at most `max_in_flight` driver calls at
//!   once, each under `call_timeout`; a call that fails or times out is tried again at the next pass. A definitive
//!   create failure is reported as such; a destroy is reported at once (`agent.report-destroyed`), as a create is,
//!   so a freed identifier goes back without waiting for the next report. A restarted agent creates and destroys
//!   again whatever is still pending or releasing: drivers take both as done when they already are.
//! - Every `sync_interval` (± 20 %) a sync pass takes a snapshot of the model (its watermark: the highest position
//!   of the subject applied) and of the calls running, then lists the machine, then reports. A listing that fails
//!   is recorded (`agent.driver-status`) when that changes, and nothing is judged from it.
//! - Every destroy is on the record. Handles that are not in the assignment set (garbage) are reported
//!   (`agent.report-garbage`: those of resources that left at once, others after the creation grace `gc_grace`, and
//!   only when that set changes); the writer orders each destroyed, or quarantines the handle of a `lost` resource,
//!   and the agent destroys only what the log ordered. A quarantined handle is never touched. `gc_dry_run` reports
//!   garbage as a dry run: recorded, never ordered.
//! - It answers health checks and full resync requests, and heartbeats every `heartbeat_interval`.
//!
//! The report rules, each handle named at most once:
//! - `in_flight`: a create or destroy running (it counts as present);
//! - `created`: ordered created, never seen present, and here (releasing or not);
//! - `missing`: seen present, not releasing, and gone;
//! - `destroyed`: releasing and gone;
//! - `count` and `digest`: the resources ordered created that are here or in flight, exactly the set the writer
//!   expects (garbage is not counted).
//!
//! A report naming more than `MAX_REPORT_HANDLES` handles is sent as a full resync instead, in id ranges.
//!
//! Every command leaves through one publisher task, in order, so observation numbers reach the log increasing.
//! Log errors are retried with backoff, and the follow resumes after the last outcome seen.
//!
//! Whoever starts the agent ([`run`]) keeps an [`AgentControl`] (in [`AgentConfig`]) to read its [`AgentStatus`],
//! wait for it to change, or ask for a sync pass now. Drivers implement [`Driver`]; [`parse_driver`] turns
//! `dir:PATH` or `docker:[ENDPOINT]` into one.

#![forbid(unsafe_code)]

mod dir;
pub mod docker;
mod driver;
mod model;
mod runtime;

pub use dir::{DirDriver, FAILED_FILE, OWNER_FILE};
pub use driver::{
    AnyDriver, Claimed, CreateOrder, Driver, DriverError, DriverSpecError, Health, Listed, Spec, parse_driver,
};
pub use model::is_material;
pub use runtime::{AgentConfig, AgentControl, AgentStatus, Error, GC_GRACE, run};
