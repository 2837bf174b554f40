//! The producer: a seeded workload of operator commands published straight to JetStream, as any producer does
//! (`lh.in.op.<key>.<id>`), each with the publish-ack that says the log holds it. Every acknowledged command id is
//! recorded with where the log put it; an ack that never came is retried with the same id (the server's duplicate
//! window makes the retry harmless), and a command never acknowledged is not counted.
//!
//! The issuers' clocks are skewed: a tenth of the commands claim to be issued up to an hour early or late (decisions
//! use the log's clock only; the claimed time is kept for the audit trail).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use leasehold_client::produce::{publish_subject, unix_ms};
use leasehold_log::intercept::SeededRng;
use leasehold_log::jetstream::JetStream;
use leasehold_log::{Error, Log};
use leasehold_schemas::command::{
    Acquire, Allocate, CordonAgent, DefinePool, Pause, Release, ReleaseLease, UncordonAgent, Unpause, Update,
};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, LeaseId, Millis, ResourceId, Timestamp};
use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
use leasehold_schemas::subjects::partition_of_key;
use leasehold_schemas::{Command, Envelope, PoolName, codec};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The pool the workload allocates addresses from; its orphans' addresses are held (so an address is never bound
/// twice, orphan or not).
pub(crate) const POOL: &str = "net";
/// At most this many publishes wait for their ack at once.
const IN_FLIGHT: usize = 8;
/// The most resources the workload keeps asked for at once (across agents).
const MAX_RESOURCES: usize = 60;
/// How many times a command whose ack did not come is published again (same id).
const ATTEMPTS: u32 = 8;

/// An agent the workload allocates on, and the kind of resource it makes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) agent: AgentName,
    pub(crate) kind: String,
    /// Attributes every allocation on it carries (a container's image and command).
    pub(crate) attributes: BTreeMap<String, String>,
}

/// A command the log acknowledged.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Acked {
    pub(crate) id: String,
    /// Its sequence in `LH_CMD` (the first copy's, for a duplicate).
    pub(crate) seq: u64,
    pub(crate) partition: u32,
    pub(crate) type_name: String,
    /// When the ack came.
    #[serde(skip)]
    pub(crate) at: std::time::Instant,
}

/// What the producer did.
#[derive(Debug, Default)]
pub(crate) struct Produced {
    pub(crate) acked: Vec<Acked>,
    /// Commands given up after every attempt failed (never acknowledged: not checked).
    pub(crate) unacked: u64,
    /// Publishes that failed and were tried again.
    pub(crate) retries: u64,
    /// Commands that claimed a skewed issue time.
    pub(crate) skewed: u64,
    /// Why the log refused a command, the first time it did (a valid command refused: reported, never acked).
    pub(crate) refused: Option<String>,
}

/// The workload's memory of what it asked for (it does not read outcomes: an allocation may have been refused).
#[derive(Debug, Default)]
struct Known {
    resources: Vec<(AgentName, ResourceId)>,
    leases: Vec<(AgentName, LeaseId)>,
    cordoned: Vec<AgentName>,
}

pub(crate) struct Producer {
    log: JetStream,
    partitions: u32,
    targets: Vec<Target>,
    rng: SeededRng,
    issuer: Issuer,
    known: Known,
    produced: Arc<Mutex<Produced>>,
    /// The pause between two commands.
    pace: Duration,
}

impl Producer {
    pub(crate) fn new(log: JetStream, partitions: u32, targets: Vec<Target>, seed: u64, pace: Duration) -> Producer {
        Producer {
            log,
            partitions,
            targets,
            rng: SeededRng::new(seed ^ 0x5eed_0fc0_ffee),
            issuer: Issuer::new("chaos-producer").expect("a valid issuer"),
            known: Known::default(),
            produced: Arc::new(Mutex::new(Produced::default())),
            pace,
        }
    }

    /// Defines the pool (acknowledged like any other command), then publishes the workload until `stop`.
    pub(crate) async fn run(mut self, stop: CancellationToken) -> Produced {
        let define = DefinePool {
            pool: PoolName::new(POOL).expect("a pool name"),
            kind: PoolKind::Ipv4 { network: std::net::Ipv4Addr::new(10, 99, 0, 0), prefix_len: 28, exclude: vec![] },
            cooldown: Some(Millis(2_000)),
            orphans: OrphanPolicy::Hold,
        };
        let mut tasks = JoinSet::new();
        self.spawn_publish(&mut tasks, define.into(), &stop);
        while !stop.is_cancelled() {
            while tasks.len() >= IN_FLIGHT {
                tasks.join_next().await;
            }
            let command = self.next_command();
            self.spawn_publish(&mut tasks, command, &stop);
            tokio::time::sleep(self.pace).await;
        }
        while tasks.join_next().await.is_some() {}
        let mut produced = self.produced.lock().expect("the producer's record");
        std::mem::take(&mut *produced)
    }

    fn spawn_publish(&mut self, tasks: &mut JoinSet<()>, body: Command, stop: &CancellationToken) {
        let now = unix_ms(std::time::SystemTime::now());
        let skewed = self.rng.chance(10);
        let issued = if skewed {
            let skew = 1 + self.rng.below(3_600_000);
            if self.rng.chance(50) { now + skew } else { now.saturating_sub(skew) }
        } else {
            now
        };
        let envelope = Envelope::new(CommandId::generate(), self.issuer.clone(), Timestamp(issued), body);
        let (log, produced, partitions, stop) =
            (self.log.clone(), self.produced.clone(), self.partitions, stop.clone());
        if skewed {
            produced.lock().expect("the producer's record").skewed += 1;
        }
        tasks.spawn(async move { publish(&log, &envelope, partitions, &produced, &stop).await });
    }

    /// The next command of the workload.
    fn next_command(&mut self) -> Command {
        let mut roll = self.rng.below(100);
        let known = &mut self.known;
        // The live set stays bounded: past it an allocation becomes a release, so a long run is as busy at its end as
        // at its start (agents' reports and the fold grow with what is held, not with how long the run is).
        if roll < 30 && known.resources.len() >= MAX_RESOURCES {
            roll = 70;
        }
        if roll < 30 || known.resources.is_empty() {
            let target = &self.targets[self.rng.below(self.targets.len() as u64) as usize];
            let resource = ResourceId::generate();
            let pools = if self.rng.chance(40) { vec![PoolName::new(POOL).expect("a pool name")] } else { vec![] };
            known.resources.push((target.agent.clone(), resource));
            return Allocate {
                agent: target.agent.clone(),
                resource,
                kind: target.kind.clone(),
                capacity: 2,
                attributes: target.attributes.clone(),
                parent: None,
                pools,
                wait: None,
            }
            .into();
        }
        let pick = self.rng.below(known.resources.len() as u64) as usize;
        let (agent, resource) = known.resources[pick].clone();
        match roll {
            30..=57 => {
                let lease = LeaseId::generate();
                known.leases.push((agent.clone(), lease));
                let ttl = Some(Millis(2_000 + self.rng.below(20_000)));
                let wait_timeout = self.rng.chance(30).then(|| Millis(1_000 + self.rng.below(8_000)));
                Acquire {
                    agent,
                    resource,
                    lease,
                    holder: format!("chaos-{}", self.rng.below(50)),
                    ttl,
                    wait_timeout,
                    priority: 0,
                }
                .into()
            }
            58..=69 if !known.leases.is_empty() => {
                let (agent, lease) = known.leases.swap_remove(self.rng.below(known.leases.len() as u64) as usize);
                ReleaseLease { agent, lease, token: None }.into()
            }
            58..=84 => {
                known.resources.swap_remove(pick);
                Release { agent, resource, reason: Some("chaos workload".to_owned()) }.into()
            }
            85..=89 => Pause { agent, resource, reason: Some("chaos".to_owned()), until: None }.into(),
            90..=93 => Unpause { agent, resource }.into(),
            94..=97 => {
                let mut set = BTreeMap::new();
                set.insert("round".to_owned(), self.rng.below(1_000).to_string());
                Update { agent, resource, set, remove: vec![], capacity: None, max_lease: None }.into()
            }
            _ => match known.cordoned.pop() {
                Some(agent) => UncordonAgent { agent }.into(),
                None => {
                    known.cordoned.push(agent.clone());
                    CordonAgent { agent, reason: Some("chaos".to_owned()) }.into()
                }
            },
        }
    }
}

/// Publishes `envelope` until the log acknowledges it (same id each time) or the attempts run out.
async fn publish(
    log: &JetStream,
    envelope: &Envelope,
    partitions: u32,
    produced: &Mutex<Produced>,
    stop: &CancellationToken,
) {
    let subject = match publish_subject(envelope, None) {
        Ok(subject) => subject,
        Err(e) => panic!("the workload made a command without a subject: {e}"),
    };
    let payload = Bytes::from(codec::encode_command(envelope).expect("the workload's commands encode"));
    let id = envelope.command_id.to_string();
    let partition = partition_of_key(&envelope.body.key(), partitions);
    for attempt in 1..=ATTEMPTS {
        match log.publish_command(&subject, &id, payload.clone()).await {
            Ok(published) => {
                let acked = Acked {
                    id,
                    seq: published.seq,
                    partition,
                    type_name: envelope.body.type_name().to_owned(),
                    at: std::time::Instant::now(),
                };
                produced.lock().expect("the producer's record").acked.push(acked);
                return;
            }
            Err(Error::Refused(why)) => {
                let mut produced = produced.lock().expect("the producer's record");
                produced.refused.get_or_insert(why);
                break;
            }
            Err(_) if attempt < ATTEMPTS && !stop.is_cancelled() => {
                produced.lock().expect("the producer's record").retries += 1;
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
            Err(_) => break,
        }
    }
    produced.lock().expect("the producer's record").unacked += 1;
}
