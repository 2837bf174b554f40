//! The nemesis's schedule: drawn from the seed alone before the run starts, so a seed always injects the same faults
//! at the same moments for the same lengths.
//!
//! The faults: kill -9 of a worker, of the projector or of an agent (each started again when the fault ends); SIGTERM
//! of a worker (a rolling restart: its clean stop decides what it was sent, snapshots and gives its partitions back;
//! started again when the fault ends, killed first if it has not exited by then);
//! SIGSTOP of a nats-server node or of an agent (SIGCONT at the end); a node cut off from the other nodes (its
//! clients still reach it) or from everyone; an agent cut off from every server; and a crash between two parts of a
//! split decision (a worker started again with the test-only fault point that aborts it right after the first part
//! of the next decision that has more parts to come; started normally at the end).
//!
//! At most one nats-server node is under a fault at a time (two of three would stop the cluster, which is not a
//! fault leasehold can do anything about), at least one worker is always left alone, and a target is never under two
//! faults at once.

use std::collections::HashMap;
use std::time::Duration;

use leasehold_log::intercept::SeededRng;

/// One fault and its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    KillWorker(usize),
    StopWorker(usize),
    KillProjector,
    KillAgent(usize),
    FreezeNode(u8),
    FreezeAgent(usize),
    PartitionNode(u8),
    IsolateNode(u8),
    PartitionAgent(usize),
    CrashBetweenParts(usize),
}

impl Fault {
    /// The kind, as the report counts it.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Fault::KillWorker(_) => "kill_worker",
            Fault::StopWorker(_) => "stop_worker",
            Fault::KillProjector => "kill_projector",
            Fault::KillAgent(_) => "kill_agent",
            Fault::FreezeNode(_) => "freeze_node",
            Fault::FreezeAgent(_) => "freeze_agent",
            Fault::PartitionNode(_) => "partition_node",
            Fault::IsolateNode(_) => "isolate_node",
            Fault::PartitionAgent(_) => "partition_agent",
            Fault::CrashBetweenParts(_) => "crash_between_parts",
        }
    }

    /// What it is done to, one name per thing that must not be under two faults at once.
    fn target(self) -> String {
        match self {
            Fault::KillWorker(w) | Fault::StopWorker(w) | Fault::CrashBetweenParts(w) => format!("worker{w}"),
            Fault::KillProjector => "projector".to_owned(),
            Fault::KillAgent(k) | Fault::FreezeAgent(k) | Fault::PartitionAgent(k) => format!("agent{k}"),
            Fault::FreezeNode(_) | Fault::PartitionNode(_) | Fault::IsolateNode(_) => "nats".to_owned(),
        }
    }
}

/// A fault, when it starts (from the nemesis's start) and how long it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) at: Duration,
    pub(crate) fault: Fault,
    pub(crate) length: Duration,
}

/// The schedule of a nemesis of `total` over `workers` workers, `agents` agents and `nodes` nodes.
pub(crate) fn schedule(seed: u64, total: Duration, workers: usize, agents: usize, nodes: u8) -> Vec<Planned> {
    let mut rng = SeededRng::new(seed);
    let mut busy_until: HashMap<String, Duration> = HashMap::new();
    let mut planned = Vec::new();
    let ms = |from: u64, to: u64, rng: &mut SeededRng| Duration::from_millis(from + rng.below(to - from));
    let mut at = Duration::from_secs(3);
    while at < total {
        let pick = |rng: &mut SeededRng, n: usize| rng.below(n as u64) as usize;
        let fault = match rng.below(100) {
            0..=13 => Fault::KillWorker(pick(&mut rng, workers)),
            14..=19 => Fault::StopWorker(pick(&mut rng, workers)),
            20..=27 => Fault::KillProjector,
            28..=39 => Fault::KillAgent(pick(&mut rng, agents)),
            40..=51 => Fault::FreezeNode(1 + pick(&mut rng, usize::from(nodes)) as u8),
            52..=59 => Fault::FreezeAgent(pick(&mut rng, agents)),
            60..=71 => Fault::PartitionNode(1 + pick(&mut rng, usize::from(nodes)) as u8),
            72..=77 => Fault::IsolateNode(1 + pick(&mut rng, usize::from(nodes)) as u8),
            78..=89 => Fault::PartitionAgent(pick(&mut rng, agents)),
            _ => Fault::CrashBetweenParts(pick(&mut rng, workers)),
        };
        let length = match fault {
            Fault::KillWorker(_) | Fault::KillAgent(_) | Fault::KillProjector => ms(500, 5_000, &mut rng),
            Fault::CrashBetweenParts(_) => ms(8_000, 20_000, &mut rng),
            // Long enough for the clean stop (at most a fifth of its 10 s grace for the writers) most times.
            Fault::StopWorker(_) => ms(2_500, 8_000, &mut rng),
            _ => ms(1_000, 9_000, &mut rng),
        };
        let target = fault.target();
        let free = busy_until.get(&target).is_none_or(|until| *until <= at);
        let workers_busy =
            (0..workers).filter(|w| busy_until.get(&format!("worker{w}")).is_some_and(|until| *until > at)).count();
        let leaves_a_worker = !target.starts_with("worker") || workers_busy + 1 < workers;
        if free && leaves_a_worker {
            // A little room after each fault before the same target is hit again.
            busy_until.insert(target, at + length + Duration::from_secs(1));
            planned.push(Planned { at, fault, length });
        }
        at += ms(800, 3_000, &mut rng);
    }
    planned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_keeps_its_rules() {
        let total = Duration::from_secs(600);
        let one = schedule(7, total, 3, 3, 3);
        assert_eq!(one, schedule(7, total, 3, 3, 3));
        assert_ne!(one, schedule(8, total, 3, 3, 3));
        let kinds: std::collections::BTreeSet<&str> = one.iter().map(|p| p.fault.kind()).collect();
        assert_eq!(kinds.len(), 10, "every kind of fault in ten minutes: {kinds:?}");
        for (i, a) in one.iter().enumerate() {
            for b in &one[i + 1..] {
                let overlap = b.at < a.at + a.length;
                assert!(!(overlap && a.fault.target() == b.fault.target()), "{a:?} and {b:?} overlap");
            }
            let workers_down = one
                .iter()
                .filter(|p| p.fault.target().starts_with("worker") && p.at <= a.at && a.at < p.at + p.length)
                .count();
            assert!(workers_down < 3, "every worker down at {:?}", a.at);
        }
    }
}
