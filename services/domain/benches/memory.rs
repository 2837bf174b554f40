//! How much partition state costs per live resource: the issue-10 target is at most 1 KiB per resource for an agent
//! with 100,000 resources, each allocated and reported created within the outcome horizon (so both commands are
//! still remembered for idempotency). Heap bytes are counted by dhat's allocator; the log itself (outcomes) is not
//! kept, as a writer does not keep it. Prints the figures; `cargo bench -p leasehold-domain --bench memory`.

use leasehold_domain::{Ctx, Decided, PartitionState, apply, decide};
use leasehold_schemas::command::{Allocate, Register, ReportCreated};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Millis, Position, ResourceId, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Command, Envelope, Uuid};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const N: u64 = 100_000;
const TARGET_BYTES: f64 = 1024.0;
const T0: u64 = 1_800_000_000_000;

struct Writer {
    state: PartitionState,
    seq: u64,
    clock: u64,
}

impl Writer {
    fn submit(&mut self, issuer: &str, body: impl Into<Command>) {
        self.seq += 1;
        self.clock += 50;
        let id = CommandId::from_parts(self.clock, entropy(1, self.seq));
        let envelope = Envelope::new(id, Issuer::new(issuer).unwrap(), Timestamp(self.clock), body);
        let ctx = Ctx { cmd_seq: self.seq, log_time: Timestamp(self.clock) };
        match decide(&self.state, &ctx, &envelope).expect("nothing pending") {
            Decided::Append(outcome) => {
                assert!(outcome.rejection().is_none(), "{:?}", outcome.rejection());
                apply(&mut self.state, &outcome).expect("in order");
            }
            other => panic!("{other:?}"),
        }
    }
}

fn entropy(tag: u8, n: u64) -> [u8; 10] {
    let mut entropy = [0u8; 10];
    entropy[0] = tag;
    entropy[2..].copy_from_slice(&n.to_be_bytes());
    entropy
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let agent = AgentName::new("w1").unwrap();
    let mut w = Writer { state: PartitionState::new(0, 1), seq: 0, clock: T0 };
    let register =
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(1)) };
    w.submit("w1", register);
    let base = dhat::HeapStats::get().curr_bytes;
    let started = std::time::Instant::now();
    for i in 0..N {
        let resource = ResourceId::from_parts(w.clock, entropy(2, i));
        let allocate = Allocate {
            agent: agent.clone(),
            resource,
            kind: "container".into(),
            capacity: 4,
            attributes: Default::default(),
            parent: None,
            pools: vec![],
            wait: None,
        };
        w.submit("op:scheduler", allocate);
        let created = ReportCreated { agent: agent.clone(), epoch: Position(1), obs: i + 1, resource, native_id: None };
        w.submit("w1", created);
    }
    let elapsed = started.elapsed();
    let bytes = dhat::HeapStats::get().curr_bytes - base;
    let per_resource = bytes as f64 / N as f64;
    let span = Millis(w.clock - T0);
    assert!(span < w.state.settings().outcome_horizon, "every command is still within the horizon");
    assert_eq!(w.state.n_recent_commands() as u64, 2 * N + 1, "both commands of every resource (and the registration)");
    assert_eq!(w.state.resources().filter(|r| r.state.name() == "active").count() as u64, N);
    let resource_bytes = size_of::<leasehold_domain::state::Resource>();
    println!(
        "partition state for {N} active resources, allocated and reported created within {:.1} h:",
        span.0 as f64 / 3_600_000.0
    );
    println!("  heap: {bytes} bytes, {per_resource:.0} bytes per live resource (target: at most {TARGET_BYTES:.0})");
    println!("  remembered command ids: {} (a command sequence each)", w.state.n_recent_commands());
    println!("  one resource record: {resource_bytes} bytes, plus its map entry, indexes and remembered commands");
    println!(
        "  decide+apply: {:.0} commands/s (under dhat's counting allocator; not a throughput figure)",
        (2 * N) as f64 / elapsed.as_secs_f64()
    );
    println!("  ratio to target: {:.2}", per_resource / TARGET_BYTES);
    renewals(&mut w);
}

/// A lease on each of 1,000 of those resources, renewed every minute for an hour: a renew is remembered by its
/// lease, not among the recent commands, so an hour of renewals costs (almost) nothing more.
fn renewals(w: &mut Writer) {
    use leasehold_schemas::command::{Acquire, Renew};
    let agent = AgentName::new("w1").unwrap();
    let ids: Vec<ResourceId> = w.state.resources().take(1000).map(|r| r.id).collect();
    let mut leases = Vec::new();
    for (i, resource) in ids.iter().enumerate() {
        let lease = leasehold_schemas::ids::LeaseId::from_parts(w.clock, entropy(3, i as u64));
        let acquire = Acquire {
            agent: agent.clone(),
            resource: *resource,
            lease,
            holder: "build".into(),
            ttl: Some(Millis::from_mins(5)),
            wait_timeout: None,
            priority: 0,
        };
        w.submit("op:scheduler", acquire);
        let token = w.state.lease(lease).map(|l| match l.state {
            leasehold_domain::state::LeaseState::Active { token, .. } => token,
            _ => panic!("granted"),
        });
        leases.push((lease, token.expect("the lease exists")));
    }
    let base = dhat::HeapStats::get().curr_bytes;
    let n_recent = w.state.n_recent_commands();
    for _minute in 0..60 {
        for (lease, token) in &leases {
            w.submit("op:scheduler", Renew { agent: agent.clone(), lease: *lease, token: *token, ttl: None });
        }
        w.clock += 60_000 - 50 * leases.len() as u64;
    }
    let grown = dhat::HeapStats::get().curr_bytes.saturating_sub(base);
    println!(
        "  {} leases renewed every minute for an hour: {} renews, {grown} bytes more ({} recent command ids before and {} after)",
        leases.len(),
        60 * leases.len(),
        n_recent,
        w.state.n_recent_commands()
    );
}
