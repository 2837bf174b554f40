//! Test-only fault points in the writers, for the chaos harness (`leasehold-chaos`) and its self-test. Compiled in
//! only with the `fault-points` feature, which is off by default: a production build never has any of this. The
//! faults are chosen by environment variables that `leasehold serve` reads once, as it starts; a `LEASEHOLD_FAULT_*`
//! name it does not know, or a value that is not a whole number of at least 1, stops it there.
//!
//! - `LEASEHOLD_FAULT_SPLIT_BUDGET=BYTES`: decisions split into parts after `BYTES` of effects
//!   ([`WriterConfig::split_budget`]; the simulation uses 1), so that an ordinary workload makes decisions in parts.
//! - `LEASEHOLD_FAULT_CRASH_AFTER_PART=K`: the process aborts ([`std::process::abort`]: as `kill -9`, no clean
//!   shutdown, no partition given back) right after the K-th part of a decision landed in the log while more parts
//!   are still to come, the first time that happens in the process. The 1st part is the outcome of the command
//!   itself (`Lh-Part: 0`); the later ones are the rest of its decision (`continue_work`). The outcomes of earlier
//!   commands in the group in hand land with it; nothing is acked.
//! - `LEASEHOLD_FAULT_DOUBLE_OUTCOME=N`: the N-th command this process decides (counting from 1 every command given
//!   an outcome, over all its partitions) is decided twice in the log: its first part is followed, in the same
//!   group and on the same chain, by a copy of itself. The log refuses a second outcome under the same message id
//!   (`<partition>:<command seq>:<part>`), so the copy says command sequence 0, which no command has: two first
//!   parts name the command id (`Lh-Cmd-Id`), with the same decision. The writer applies the outcome once and goes
//!   on; any later fold of the partition (a reload, another worker taking it over, a projector) refuses the copy
//!   (out of order) and stops there, as it must on a log a buggy writer wrote.
//! - `LEASEHOLD_FAULT_SKIP_OUTCOME=N`: the N-th operator command (class `op`, what producers publish and a harness
//!   records as acknowledged; counting from 1 over all its partitions) this process decides gets no outcome at all,
//!   yet is acked as done: a lost decision. (Agents' reports and leasehold's own `sys` commands are not counted: a
//!   harness's check of acknowledged commands could not see one of them lost, only `verify` could.) Nothing is appended or applied; whenever this process decides that command again (its
//!   partition reloaded before a later outcome passed it), it is skipped again.
//!
//! `DOUBLE` and `SKIP` cannot be given the same number; should both still fall on one command, it is skipped and the
//! doubling does not fire. Each fault that fires prints one line on stderr, for a harness
//! to count:
//!
//! ```text
//! fault point: crash after part K of the decision of command <id> on partition <p>
//! fault point: doubled the outcome of command <id>
//! fault point: skipped the outcome of command <id>
//! ```

use std::ffi::OsString;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use leasehold_schemas::{CommandId, Outcome};

use crate::WriterConfig;

pub const SPLIT_BUDGET: &str = "LEASEHOLD_FAULT_SPLIT_BUDGET";
pub const CRASH_AFTER_PART: &str = "LEASEHOLD_FAULT_CRASH_AFTER_PART";
pub const DOUBLE_OUTCOME: &str = "LEASEHOLD_FAULT_DOUBLE_OUTCOME";
pub const SKIP_OUTCOME: &str = "LEASEHOLD_FAULT_SKIP_OUTCOME";
/// Every variable of this prefix must be one of the above: a misspelt fault is an error, not a run without it.
const PREFIX: &str = "LEASEHOLD_FAULT_";
const KNOWN: [&str; 4] = [SPLIT_BUDGET, CRASH_AFTER_PART, DOUBLE_OUTCOME, SKIP_OUTCOME];

/// Which faults a process injects (each `None`: not that one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub split_budget: Option<usize>,
    pub crash_after_part: Option<u32>,
    pub double_outcome: Option<u64>,
    pub skip_outcome: Option<u64>,
}

/// A fault variable that cannot be used: the process must not start without the fault it was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {problem}")]
pub struct FaultError {
    pub name: String,
    pub value: String,
    pub problem: String,
}

impl FaultPlan {
    /// The plan the process's environment names.
    pub fn from_env() -> Result<FaultPlan, FaultError> {
        Self::from_vars(std::env::vars_os())
    }

    /// The plan `vars` (name, value) name: only the `LEASEHOLD_FAULT_*` ones are read, and each must be known and
    /// hold a whole number of at least 1.
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<FaultPlan, FaultError> {
        let mut plan = FaultPlan::default();
        for (name, value) in vars {
            let name = name.to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) {
                continue;
            }
            let value = value.into_string().map_err(|value| FaultError {
                name: name.clone(),
                value: value.to_string_lossy().into_owned(),
                problem: "not UTF-8".to_owned(),
            })?;
            let number = |what: &str| -> Result<u64, FaultError> {
                value.parse::<u64>().ok().filter(|n| *n >= 1 && value.bytes().all(|b| b.is_ascii_digit())).ok_or_else(
                    || FaultError {
                        name: name.clone(),
                        value: value.clone(),
                        problem: format!("not a whole number of at least 1 ({what})"),
                    },
                )
            };
            match name.as_str() {
                SPLIT_BUDGET => {
                    let bytes = number("the bytes of effects after which a decision splits")?;
                    plan.split_budget = Some(usize::try_from(bytes).unwrap_or(usize::MAX));
                }
                CRASH_AFTER_PART => {
                    let part = number("the part of a decision after which the process aborts")?;
                    plan.crash_after_part = Some(u32::try_from(part).map_err(|_| FaultError {
                        name: name.clone(),
                        value: value.clone(),
                        problem: format!("more parts than a decision has (at most {})", u32::MAX),
                    })?);
                }
                DOUBLE_OUTCOME => plan.double_outcome = Some(number("the decided command whose outcome is doubled")?),
                SKIP_OUTCOME => plan.skip_outcome = Some(number("the decided command whose outcome is skipped")?),
                _ => {
                    return Err(FaultError {
                        name,
                        value,
                        problem: format!("no such fault point; this build knows {}", KNOWN.join(", ")),
                    });
                }
            }
        }
        if let (Some(double), Some(skip)) = (plan.double_outcome, plan.skip_outcome)
            && double == skip
        {
            return Err(FaultError {
                name: SKIP_OUTCOME.to_owned(),
                value: skip.to_string(),
                problem: format!("{DOUBLE_OUTCOME} names the same command: one command cannot be both"),
            });
        }
        Ok(plan)
    }

    pub fn is_empty(&self) -> bool {
        *self == FaultPlan::default()
    }
}

impl fmt::Display for FaultPlan {
    /// The plan as the variables that set it (`NAME=value`, space-separated).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = [
            (SPLIT_BUDGET, self.split_budget.map(|n| n as u64)),
            (CRASH_AFTER_PART, self.crash_after_part.map(u64::from)),
            (DOUBLE_OUTCOME, self.double_outcome),
            (SKIP_OUTCOME, self.skip_outcome),
        ];
        let shown: Vec<String> =
            set.iter().filter_map(|(name, value)| value.map(|value| format!("{name}={value}"))).collect();
        f.write_str(&shown.join(" "))
    }
}

/// A fault that fired. Its `Display` is the line a harness counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// `part` counts from 1 (the first part of the decision is 1).
    CrashAfterPart {
        part: u32,
        command: CommandId,
        partition: u32,
    },
    Doubled {
        command: CommandId,
    },
    Skipped {
        command: CommandId,
    },
}

impl fmt::Display for Fired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fired::CrashAfterPart { part, command, partition } => write!(
                f,
                "fault point: crash after part {part} of the decision of command {command} on partition {partition}"
            ),
            Fired::Doubled { command } => write!(f, "fault point: doubled the outcome of command {command}"),
            Fired::Skipped { command } => write!(f, "fault point: skipped the outcome of command {command}"),
        }
    }
}

/// What a writer does with the outcome of a command it has just decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Record,
    Double,
    Skip,
}

/// What fires is told to this: in a process, a line on stderr, and for a crash the abort.
pub type OnFire = Arc<dyn Fn(&Fired) + Send + Sync>;

/// The fault points of one process, shared by all its writers (the counts are the process's).
pub struct FaultPoints {
    plan: FaultPlan,
    on_fire: OnFire,
    /// Commands decided so far.
    decided: AtomicU64,
    /// Operator commands decided (the skip counts these).
    operator_decided: AtomicU64,
    crashed: AtomicBool,
    doubled: OnceLock<CommandId>,
    skipped: OnceLock<CommandId>,
}

impl fmt::Debug for FaultPoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultPoints")
            .field("plan", &self.plan)
            .field("decided", &self.decided)
            .field("crashed", &self.crashed)
            .field("doubled", &self.doubled)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl FaultPoints {
    /// Fault points that tell `on_fire` what fires instead of printing and aborting (a test).
    pub fn new(plan: FaultPlan, on_fire: OnFire) -> Arc<FaultPoints> {
        Arc::new(FaultPoints {
            plan,
            on_fire,
            decided: AtomicU64::new(0),
            operator_decided: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            doubled: OnceLock::new(),
            skipped: OnceLock::new(),
        })
    }

    /// The fault points the environment names, for a process: each that fires prints its line on stderr, and the
    /// crash then aborts. `None` when no fault variable is set.
    pub fn from_env() -> Result<Option<Arc<FaultPoints>>, FaultError> {
        let plan = FaultPlan::from_env()?;
        Ok((!plan.is_empty()).then(|| FaultPoints::new(plan, Arc::new(in_process))))
    }

    pub fn plan(&self) -> FaultPlan {
        self.plan
    }

    /// Makes the writers of `config` inject these faults.
    pub fn install(self: &Arc<Self>, config: &mut WriterConfig) {
        if let Some(budget) = self.plan.split_budget {
            config.split_budget = Some(budget);
        }
        config.faults = Some(self.clone());
    }

    /// Counts a command decided (given an outcome to append) and says what becomes of its outcome. A command this
    /// process doubled or skipped before (its group did not land, or its partition reloaded) is doubled or skipped
    /// again, without counting or telling again.
    /// `operator`: the command is of class `op` (only those count for the skip).
    pub(crate) fn on_decided(&self, command: CommandId, operator: bool) -> Action {
        if self.skipped.get() == Some(&command) {
            return Action::Skip;
        }
        if self.doubled.get() == Some(&command) {
            return Action::Double;
        }
        let n = self.decided.fetch_add(1, Ordering::SeqCst) + 1;
        let operator_n = if operator { self.operator_decided.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
        if operator && self.plan.skip_outcome == Some(operator_n) && self.skipped.set(command).is_ok() {
            (self.on_fire)(&Fired::Skipped { command });
            return Action::Skip;
        }
        if self.plan.double_outcome == Some(n) && self.doubled.set(command).is_ok() {
            (self.on_fire)(&Fired::Doubled { command });
            return Action::Double;
        }
        Action::Record
    }

    /// Whether the process is to crash once `outcome` (a part just decided) has landed: it is the K-th part, more
    /// parts follow, and the crash has not fired yet.
    pub(crate) fn crash_due(&self, outcome: &Outcome) -> bool {
        self.plan.crash_after_part == Some(outcome.part.saturating_add(1))
            && outcome.continues()
            && !self.crashed.load(Ordering::SeqCst)
    }

    /// Crashes after `outcome` landed (once per process: a second writer at the same point goes on).
    pub(crate) fn crash(&self, outcome: &Outcome, partition: u32) {
        if !self.crashed.swap(true, Ordering::SeqCst) {
            let part = outcome.part.saturating_add(1);
            (self.on_fire)(&Fired::CrashAfterPart { part, command: outcome.command.id, partition });
        }
    }
}

/// The copy of `outcome` (a first part) that a doubled command gets: the same decision under command sequence 0,
/// which no command has, so that its message id is new to the log.
pub(crate) fn copy_of(outcome: &Outcome) -> Outcome {
    Outcome { cmd_seq: 0, ..outcome.clone() }
}

/// What a process does when a fault fires: the line on stderr, then for a crash the abort (as `kill -9`).
fn in_process(fired: &Fired) {
    eprintln!("{fired}");
    if let Fired::CrashAfterPart { .. } = fired {
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(n, v)| (OsString::from(n), OsString::from(v))).collect()
    }

    #[test]
    fn the_plan_is_read_strictly() {
        let plan = FaultPlan::from_vars(vars(&[
            ("PATH", "/bin"),
            (SPLIT_BUDGET, "1"),
            (CRASH_AFTER_PART, "2"),
            (DOUBLE_OUTCOME, "3"),
            (SKIP_OUTCOME, "4"),
        ]))
        .unwrap();
        assert_eq!(
            plan,
            FaultPlan {
                split_budget: Some(1),
                crash_after_part: Some(2),
                double_outcome: Some(3),
                skip_outcome: Some(4)
            }
        );
        assert_eq!(
            plan.to_string(),
            "LEASEHOLD_FAULT_SPLIT_BUDGET=1 LEASEHOLD_FAULT_CRASH_AFTER_PART=2 LEASEHOLD_FAULT_DOUBLE_OUTCOME=3 \
             LEASEHOLD_FAULT_SKIP_OUTCOME=4"
        );
        assert!(FaultPlan::from_vars(vars(&[("HOME", "/root")])).unwrap().is_empty());
        for (name, value, says) in [
            (CRASH_AFTER_PART, "0", "at least 1"),
            (CRASH_AFTER_PART, "", "at least 1"),
            (CRASH_AFTER_PART, "two", "at least 1"),
            (CRASH_AFTER_PART, "+2", "at least 1"),
            (CRASH_AFTER_PART, " 2", "at least 1"),
            (CRASH_AFTER_PART, "4294967296", "more parts than"),
            (SPLIT_BUDGET, "-1", "at least 1"),
            (DOUBLE_OUTCOME, "1.5", "at least 1"),
            ("LEASEHOLD_FAULT_CRASH_AFTER", "1", "no such fault point"),
        ] {
            let e = FaultPlan::from_vars(vars(&[(name, value)])).unwrap_err();
            assert_eq!((e.name.as_str(), e.value.as_str()), (name, value));
            assert!(e.to_string().contains(says), "{name}={value}: {e}");
        }
        let e = FaultPlan::from_vars(vars(&[(DOUBLE_OUTCOME, "2"), (SKIP_OUTCOME, "2")])).unwrap_err();
        assert!(e.to_string().contains("cannot be both"), "{e}");
    }
}
