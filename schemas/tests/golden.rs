//! Golden wire fixtures: one committed encoding of every command, effect, work item, rejection kind and outcome of
//! the current schema version, so that a change to the bytes (or to the JSON form) fails here, not in a log.
//!
//! Each sample below is a fixed value. Its bincode form is `tests/fixtures/v<SCHEMA_VERSION>/<name>.bin` and its
//! JSON form `<name>.json`. The test decodes every committed file and compares it with the sample, and encodes
//! every sample and compares it with the committed file. A missing file is written; `LH_BLESS=1` rewrites them all:
//!
//! ```text
//! LH_BLESS=1 cargo test -p leasehold-schemas --test golden
//! ```
//!
//! Names: `<type>` (one per command type, e.g. `op.allocate`), `<type>.<variant>` (more commands, to pin every
//! variant of the enums inside bodies), `effect.<name>`, `work.<name>`, `rejection.<kind>`, `outcome.<what>`.
//!
//! bincode is compared byte for byte. JSON is compared as a JSON value (field order and spaces are not part of the
//! JSON form: serde_json may order an object's fields differently depending on its features).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use leasehold_schemas::codec::{self, CodecErrorKind};
use leasehold_schemas::command::{
    Acquire, Adopt, Allocate, BindClaim, Cascade, Claim, Command, ConfirmLoss, CreateTimeout, DefinePool, DeletePool,
    ExpireLease, ExpirePause, FailureKind, Free, HandleDigest, HealthResult, Heartbeat, MarkGone, MarkStalled, Orphan,
    ParentState, Pause, Register, Release, ReleaseLease, Renew, ReportCreated, ReportFailure, ReportFailureByOperator,
    RequestHealthCheck, ResyncChunk, RetireAgent, SetPartitionSettings, SyncReport, TickPool, Unpause, Update,
    UpdatePool, WaitTimeout,
};
use leasehold_schemas::command::{
    BindPlacement, CancelPlacement, CancelReservation, ClosePlacement, CommitPlacement, DrainAgent, DrainRelease,
    Place, PlacementStrategy, Reserve, Unplaceable,
};
use leasehold_schemas::command::{
    CordonAgent, DriverStatus, GarbageReport, ReportDestroyed, UncordonAgent, UnretireAgent,
};
use leasehold_schemas::command::{FreeOrphan, OverQuota, SetQuota};
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, Key, LeaseId, Millis, ObsStamp, PoolName, Position, ResourceId, ResourceRef, Source,
    Timestamp,
};
use leasehold_schemas::outcome::FreeCause;
use leasehold_schemas::outcome::{
    BreakReason, BreakerClear, CommandSummary, Decision, Effect, GarbageCause, Outcome, Rejection, RejectionKind,
    ReleaseCause, ResyncReason, SuspectCause, UnpauseCause, Work,
};
use leasehold_schemas::pool::OrphanPolicy;
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::{AgentSettings, ClusterPolicy, GcMode, PartitionSettings};
use leasehold_schemas::subjects::{ingress_subject_of, partition_of, partition_of_key};
use leasehold_schemas::{CommandClass, Envelope, SCHEMA_VERSION, Uuid};

// ---------------------------------------------------------------------------------------------------------------
// Samples. Every value is fixed: no clock, no randomness.

/// 2026-01-01T00:00:00Z: the issuer time of the first sample command.
const T0: u64 = 1_767_225_600_000;
const OP_ISSUER: &str = "op:alice@example";
const SWEEPER: &str = "sweeper";

fn agent() -> AgentName {
    AgentName::new("w1").unwrap()
}

fn pool() -> PoolName {
    PoolName::new("ips").unwrap()
}

fn issuer(text: &str) -> Issuer {
    Issuer::new(text).unwrap()
}

/// The resource most samples are about.
fn quota() -> leasehold_schemas::ids::QuotaName {
    leasehold_schemas::ids::QuotaName::new("team-a").unwrap()
}

fn resource() -> ResourceId {
    ResourceId::from_parts(T0 - 5_000, [0x11; 10])
}

fn parent() -> ResourceId {
    ResourceId::from_parts(T0 - 3_600_000, [0x22; 10])
}

fn other_resource(n: u8) -> ResourceId {
    ResourceId::from_parts(T0 - 86_400_000 + u64::from(n), [0x40 + n; 10])
}

fn lease() -> LeaseId {
    LeaseId::from_parts(T0 - 4_000, [0x33; 10])
}

fn resource_ref() -> ResourceRef {
    ResourceRef::new(agent(), resource())
}

fn parent_ref() -> ResourceRef {
    ResourceRef::new(agent(), parent())
}

fn source() -> Source {
    Source { partition: 3, position: Position(55) }
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 20, 0, last)
}

/// Spelled out rather than `AgentSettings::default()`: a new default is not a wire change.
fn agent_settings() -> AgentSettings {
    AgentSettings {
        max_loss_min: 5,
        max_loss_percent: 50,
        loss_window: Millis::from_mins(10),
        create_timeout: Millis::from_mins(10),
        stall_after: Millis::from_secs(60),
        orphan_after: Millis::from_hours(24),
    }
}

fn partition_settings() -> PartitionSettings {
    PartitionSettings { outcome_horizon: Millis::from_hours(24), policy: None }
}

/// Settings with a recorded policy.
fn partition_settings_with_policy() -> PartitionSettings {
    PartitionSettings {
        outcome_horizon: Millis::from_hours(24),
        policy: Some(ClusterPolicy { agent: agent_settings(), claim_cooldown: Millis::from_secs(30) }),
    }
}

fn incarnation() -> Uuid {
    Uuid::from_u128(0x6f1c_2a52_9d4e_4b7a_8c3f_0123_4567_89ab)
}

fn correlation() -> Uuid {
    Uuid::from_u128(0x0194_0000_0000_7000_8000_0000_0000_c0de)
}

fn sync_report() -> SyncReport {
    SyncReport {
        agent: agent(),
        epoch: Position(3),
        obs: 42,
        watermark: Position(120),
        created: vec![resource()],
        missing: vec![other_resource(1)],
        destroyed: vec![other_resource(2)],
        in_flight: vec![other_resource(3)],
        count: 3,
        digest: HandleDigest::of([&resource(), &other_resource(3), &parent()]),
    }
}

fn resync_chunk() -> ResyncChunk {
    ResyncChunk {
        agent: agent(),
        epoch: Position(3),
        obs: 43,
        watermark: Position(120),
        lo: Uuid::nil(),
        hi: Some(ResourceId::from_parts(T0, [0x80; 10]).as_uuid()),
        held: vec![resource(), parent()],
        in_flight: vec![other_resource(3)],
    }
}

/// A command fixture: its name and its envelope. The envelope's id and time follow from `n`.
fn envelope(n: u8, issuer_text: &str, body: impl Into<Command>) -> Envelope {
    let n64 = u64::from(n);
    Envelope::new(
        CommandId::from_parts(T0 + n64 * 1_000, [0xc0, n, 0, 0, 0, 0, 0, 0, 0, n]),
        issuer(issuer_text),
        Timestamp(T0 + n64 * 1_000),
        body,
    )
}

fn correlated(mut envelope: Envelope) -> Envelope {
    envelope.correlation_id = Some(correlation());
    envelope
}

fn caused(mut envelope: Envelope, by: u8) -> Envelope {
    envelope.causation_id =
        Some(CommandId::from_parts(T0 + u64::from(by) * 1_000, [0xca, by, 0, 0, 0, 0, 0, 0, 0, by]).as_uuid());
    envelope
}

/// One sample per command type, in the order of `Command::TYPE_NAMES`; then more, named `<type>.<variant>`, so that
/// every variant of an enum inside a body is pinned too.
fn command_samples() -> Vec<(String, Envelope)> {
    let a = agent;
    let r = resource;
    let main = vec![
        correlated(envelope(
            1,
            OP_ISSUER,
            Allocate {
                agent: a(),
                resource: r(),
                kind: "container".into(),
                capacity: 2,
                attributes: BTreeMap::from([
                    ("image".to_owned(), "alpine:3.20".to_owned()),
                    ("team".to_owned(), "ci".to_owned()),
                ]),
                parent: Some(parent_ref()),
                pools: vec![pool()],
                wait: None,
            },
        )),
        correlated(envelope(
            2,
            OP_ISSUER,
            Acquire {
                agent: a(),
                resource: r(),
                lease: lease(),
                holder: "build-1234".into(),
                ttl: Some(Millis::from_mins(5)),
                wait_timeout: Some(Millis::from_secs(60)),
                priority: 0,
            },
        )),
        envelope(3, OP_ISSUER, Renew { agent: a(), lease: lease(), token: Position(17), ttl: None }),
        envelope(4, OP_ISSUER, ReleaseLease { agent: a(), lease: lease(), token: Some(Position(17)) }),
        correlated(envelope(
            5,
            OP_ISSUER,
            Release { agent: a(), resource: r(), reason: Some("build finished".into()) },
        )),
        envelope(
            6,
            OP_ISSUER,
            Pause {
                agent: a(),
                resource: r(),
                reason: Some("disk check".into()),
                until: Some(Timestamp(T0 + 3_600_000)),
            },
        ),
        envelope(7, OP_ISSUER, Unpause { agent: a(), resource: r() }),
        envelope(
            8,
            OP_ISSUER,
            Update {
                agent: a(),
                resource: r(),
                set: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
                remove: vec!["image".into()],
                capacity: Some(4),
                max_lease: None,
            },
        ),
        envelope(
            9,
            OP_ISSUER,
            ReportFailureByOperator { agent: a(), resource: r(), detail: "container does not answer on :8080".into() },
        ),
        envelope(10, OP_ISSUER, RetireAgent::new(a())),
        envelope(11, OP_ISSUER, ConfirmLoss { agent: a() }),
        envelope(
            12,
            OP_ISSUER,
            DefinePool {
                pool: pool(),
                kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 24, exclude: vec![ip(1)] },
                cooldown: Some(Millis::from_mins(2)),
                orphans: leasehold_schemas::pool::OrphanPolicy::Release,
            },
        ),
        envelope(
            35,
            OP_ISSUER,
            UpdatePool {
                pool: pool(),
                kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 23, exclude: vec![ip(1), ip(2)] },
                cooldown: Some(Millis::from_secs(30)),
                orphans: None,
            },
        ),
        envelope(36, OP_ISSUER, DeletePool { pool: pool() }),
        envelope(
            13,
            OP_ISSUER,
            SetPartitionSettings {
                key: Key::Agent(a()),
                partition: partition_of_key(&Key::Agent(a()), 8),
                outcome_horizon: None,
                policy: partition_settings_with_policy().policy,
                if_no_policy: true,
                gc: None,
                max_priority: None,
            },
        ),
        envelope(14, "w1", Register { settings: Some(agent_settings()), ..Register::new(a(), incarnation()) }),
        envelope(15, "w1", Heartbeat { agent: a(), epoch: Position(3) }),
        envelope(
            16,
            "w1",
            ReportCreated {
                agent: a(),
                epoch: Position(3),
                obs: 41,
                resource: r(),
                native_id: Some("d41d8cd98f00".into()),
            },
        ),
        envelope(17, "w1", sync_report()),
        envelope(18, "w1", resync_chunk()),
        envelope(
            19,
            "w1",
            ReportFailure {
                agent: a(),
                epoch: Position(3),
                obs: 44,
                resource: r(),
                failure: FailureKind::CreateFailed,
                detail: "image pull failed: not found".into(),
            },
        ),
        envelope(
            20,
            "w1",
            HealthResult {
                agent: a(),
                epoch: Position(3),
                obs: 45,
                resource: r(),
                request: Position(130),
                healthy: false,
                detail: "probe timed out after 5s".into(),
            },
        ),
        envelope(21, SWEEPER, ExpireLease { agent: a(), lease: lease() }),
        envelope(22, SWEEPER, WaitTimeout { agent: a(), lease: lease() }),
        envelope(23, SWEEPER, CreateTimeout { agent: a(), resource: r() }),
        envelope(24, SWEEPER, ExpirePause { agent: a(), resource: r() }),
        envelope(25, SWEEPER, MarkStalled { agent: a() }),
        envelope(26, SWEEPER, MarkGone { agent: a() }),
        envelope(27, SWEEPER, Orphan { agent: a(), resource: r() }),
        envelope(28, SWEEPER, RequestHealthCheck { agent: a(), resource: r() }),
        caused(
            correlated(envelope(
                29,
                SWEEPER,
                Claim {
                    pool: pool(),
                    holder: resource_ref(),
                    source: Source { partition: 5, position: Position(118) },
                },
            )),
            1,
        ),
        caused(
            envelope(
                30,
                SWEEPER,
                BindClaim {
                    holder: resource_ref(),
                    pool: pool(),
                    value: PoolValue::Ipv4(ip(7)),
                    token: Position(55),
                    source: source(),
                    wanted: Source { partition: 5, position: Position(12) },
                    definition: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                },
            ),
            29,
        ),
        caused(
            envelope(
                31,
                SWEEPER,
                Free {
                    pool: pool(),
                    holder: resource_ref(),
                    token: Some(Position(55)),
                    source: source(),
                    cause: leasehold_schemas::outcome::FreeCause::Released {},
                },
            ),
            5,
        ),
        envelope(32, SWEEPER, TickPool { pool: pool() }),
        caused(
            envelope(
                33,
                SWEEPER,
                Cascade {
                    child: resource_ref(),
                    parent: parent_ref(),
                    parent_state: ParentState::Left,
                    source: Source { partition: 5, position: Position(90) },
                    answers: None,
                },
            ),
            5,
        ),
        caused(
            envelope(
                34,
                SWEEPER,
                Adopt {
                    parent: parent_ref(),
                    child: resource_ref(),
                    source: Source { partition: 3, position: Position(17) },
                },
            ),
            10,
        ),
        envelope(60, OP_ISSUER, UnretireAgent { agent: a() }),
        envelope(
            61,
            "w1",
            GarbageReport {
                agent: a(),
                epoch: Position(3),
                obs: 48,
                watermark: Position(120),
                handles: vec![other_resource(5), other_resource(6)],
                dry_run: false,
            },
        ),
        envelope(
            62,
            "w1",
            ReportDestroyed { agent: a(), epoch: Position(3), obs: 49, resource: r(), ordered: Position(130) },
        ),
        envelope(
            63,
            "w1",
            DriverStatus {
                agent: a(),
                epoch: Position(3),
                obs: 50,
                available: false,
                detail: "/var/lib/leasehold no longer names agent w1 in .leasehold-agent".into(),
            },
        ),
        envelope(71, OP_ISSUER, CordonAgent { agent: a(), reason: Some("kernel upgrade at 14:00".into()) }),
        envelope(72, OP_ISSUER, UncordonAgent { agent: a() }),
        envelope(74, OP_ISSUER, place_sample()),
        envelope(75, OP_ISSUER, CancelPlacement { resource: r(), reason: Some("not needed any more".into()) }),
        envelope(
            76,
            OP_ISSUER,
            DrainAgent {
                agent: a(),
                deadline: Some(Millis::from_hours(2)),
                grace: Some(Millis::from_mins(10)),
                reason: Some("kernel upgrade at 14:00".into()),
            },
        ),
        envelope(
            77,
            SWEEPER,
            Reserve {
                agent: a(),
                resource: r(),
                kind: "container".into(),
                select: [("zone".to_owned(), "a".to_owned())].into(),
                source: Source { partition: 6, position: Position(90) },
            },
        ),
        envelope(
            78,
            SWEEPER,
            BindPlacement {
                resource: r(),
                agent: a(),
                token: Position(120),
                used: 12,
                capacity: 50,
                source: Source { partition: 5, position: Position(120) },
            },
        ),
        envelope(
            79,
            SWEEPER,
            CommitPlacement {
                allocation: place_sample().allocation_on(a()),
                token: Position(120),
                source: Source { partition: 6, position: Position(90) },
                principal: None,
            },
        ),
        envelope(
            80,
            SWEEPER,
            CancelReservation {
                agent: a(),
                resource: r(),
                token: Position(121),
                source: Source { partition: 6, position: Position(95) },
            },
        ),
        envelope(81, SWEEPER, Unplaceable { resource: r(), why: "zone=a: 4 agents full".into() }),
        envelope(82, SWEEPER, DrainRelease { agent: a(), resource: r() }),
        envelope(
            85,
            SWEEPER,
            ClosePlacement {
                resource: r(),
                agent: a(),
                token: Position(120),
                source: Source { partition: 5, position: Position(126) },
            },
        ),
        envelope(
            86,
            OP_ISSUER,
            FreeOrphan {
                agent: a(),
                resource: r(),
                pool: Some(pool()),
                reason: "machine scrapped; its disks wiped".into(),
            },
        ),
        envelope(
            97,
            OP_ISSUER,
            SetQuota {
                key: leasehold_schemas::subjects::settings_key(2, 8),
                partition: 2,
                quota: quota(),
                max: BTreeMap::from([("container".to_owned(), 20), ("volume".to_owned(), 100)]),
                principals: vec![issuer("ci:team-a"), issuer("ci:team-a-nightly")],
            },
        ),
        envelope(
            98,
            SWEEPER,
            OverQuota {
                holder: resource_ref(),
                pool: PoolName::new("quota-team-a-container").unwrap(),
                source: Source { partition: 4, position: Position(140) },
                held: 20,
                holders: vec![ResourceRef::new(AgentName::new("w2").unwrap(), other_resource(5))],
            },
        ),
    ];
    let mut samples: Vec<(String, Envelope)> =
        main.into_iter().map(|envelope| (envelope.type_name().to_owned(), envelope)).collect();

    let variants = vec![
        (
            "principal",
            envelope(
                99,
                SWEEPER,
                CommitPlacement {
                    allocation: place_sample().allocation_on(a()),
                    token: Position(120),
                    source: Source { partition: 6, position: Position(90) },
                    principal: Some(issuer("ci:team-a")),
                },
            ),
        ),
        (
            "remove",
            envelope(
                100,
                OP_ISSUER,
                SetQuota {
                    key: leasehold_schemas::subjects::settings_key(2, 8),
                    partition: 2,
                    quota: quota(),
                    max: BTreeMap::new(),
                    principals: vec![],
                },
            ),
        ),
        (
            "pack",
            envelope(
                83,
                OP_ISSUER,
                Place {
                    resource: other_resource(8),
                    kind: "volume".into(),
                    capacity: 1,
                    attributes: BTreeMap::new(),
                    parent: None,
                    pools: vec![],
                    wait: None,
                    select: BTreeMap::new(),
                    strategy: PlacementStrategy::Pack,
                },
            ),
        ),
        ("unleased", envelope(84, OP_ISSUER, RetireAgent { agent: a(), only_if_unleased: true })),
        (
            "declared",
            envelope(
                73,
                "w1",
                Register {
                    agent: a(),
                    incarnation: incarnation(),
                    wiped: false,
                    settings: None,
                    labels: [("zone".to_owned(), "a".to_owned())].into(),
                    capacity: [("container".to_owned(), 50), ("volume".to_owned(), 200)].into(),
                },
            ),
        ),
        ("defaults", envelope(50, "w1", Register { wiped: true, ..Register::new(a(), incarnation()) })),
        (
            "minimal",
            envelope(
                41,
                OP_ISSUER,
                Allocate {
                    agent: a(),
                    resource: other_resource(4),
                    kind: "volume".into(),
                    capacity: 1,
                    attributes: BTreeMap::new(),
                    parent: None,
                    pools: vec![],
                    wait: None,
                },
            ),
        ),
        (
            "slots",
            envelope(
                42,
                OP_ISSUER,
                DefinePool {
                    pool: pool(),
                    kind: PoolKind::Slots { count: 16 },
                    cooldown: None,
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                },
            ),
        ),
        (
            "ports",
            envelope(
                43,
                OP_ISSUER,
                DefinePool {
                    pool: pool(),
                    kind: PoolKind::Ports { first: 30_000, last: 30_099, exclude: vec![30_080] },
                    cooldown: Some(Millis(0)),
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                },
            ),
        ),
        (
            "pool-key",
            envelope(
                44,
                OP_ISSUER,
                SetPartitionSettings {
                    key: Key::Pool(pool()),
                    partition: partition_of_key(&Key::Pool(pool()), 8),
                    outcome_horizon: Some(Millis::from_hours(24)),
                    policy: None,
                    if_no_policy: false,
                    gc: None,
                    max_priority: None,
                },
            ),
        ),
        (
            "unhealthy",
            envelope(
                45,
                "w1",
                ReportFailure {
                    agent: a(),
                    epoch: Position(3),
                    obs: 46,
                    resource: r(),
                    failure: FailureKind::Unhealthy,
                    detail: "out of memory".into(),
                },
            ),
        ),
        (
            "suspect",
            envelope(
                46,
                SWEEPER,
                Cascade {
                    child: resource_ref(),
                    parent: parent_ref(),
                    parent_state: ParentState::Suspect,
                    source: source(),
                    answers: None,
                },
            ),
        ),
        (
            "wait",
            envelope(
                64,
                OP_ISSUER,
                Allocate {
                    agent: a(),
                    resource: other_resource(7),
                    kind: "container".into(),
                    capacity: 1,
                    attributes: BTreeMap::new(),
                    parent: None,
                    pools: vec![pool()],
                    wait: Some(Millis::from_secs(30)),
                },
            ),
        ),
        (
            "gc",
            envelope(
                65,
                OP_ISSUER,
                SetPartitionSettings {
                    key: Key::Agent(a()),
                    partition: partition_of_key(&Key::Agent(a()), 8),
                    outcome_horizon: None,
                    policy: None,
                    if_no_policy: false,
                    gc: Some(GcMode::DryRun),
                    max_priority: None,
                },
            ),
        ),
        (
            "dry-run",
            envelope(
                66,
                "w1",
                GarbageReport {
                    agent: a(),
                    epoch: Position(3),
                    obs: 51,
                    watermark: Position(121),
                    handles: vec![],
                    dry_run: true,
                },
            ),
        ),
        (
            "available",
            envelope(
                67,
                "w1",
                DriverStatus { agent: a(), epoch: Position(3), obs: 52, available: true, detail: String::new() },
            ),
        ),
        (
            "absent",
            envelope(
                68,
                SWEEPER,
                Cascade {
                    child: resource_ref(),
                    parent: parent_ref(),
                    parent_state: ParentState::Absent,
                    source: source(),
                    answers: Some(Source { partition: 3, position: Position(17) }),
                },
            ),
        ),
        (
            "destroy-blocked",
            envelope(
                69,
                "w1",
                ReportFailure {
                    agent: a(),
                    epoch: Position(3),
                    obs: 53,
                    resource: r(),
                    failure: FailureKind::DestroyBlocked,
                    detail: "volume lh-x is in use by container ci-cache".into(),
                },
            ),
        ),
        (
            "ipv4",
            envelope(
                70,
                SWEEPER,
                BindClaim {
                    holder: resource_ref(),
                    pool: pool(),
                    value: PoolValue::Ipv4(ip(7)),
                    token: Position(55),
                    source: source(),
                    wanted: Source { partition: 5, position: Position(12) },
                    definition: Some(PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![ip(1)] }),
                    orphans: leasehold_schemas::pool::OrphanPolicy::Release,
                },
            ),
        ),
        (
            "hold",
            envelope(
                87,
                OP_ISSUER,
                DefinePool {
                    pool: pool(),
                    kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 24, exclude: vec![ip(1)] },
                    cooldown: None,
                    orphans: OrphanPolicy::Hold,
                },
            ),
        ),
        (
            "orphans",
            envelope(
                88,
                OP_ISSUER,
                UpdatePool {
                    pool: pool(),
                    kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 24, exclude: vec![ip(1)] },
                    cooldown: None,
                    orphans: Some(OrphanPolicy::Release),
                },
            ),
        ),
        (
            "hold",
            envelope(
                89,
                SWEEPER,
                BindClaim {
                    holder: resource_ref(),
                    pool: pool(),
                    value: PoolValue::Ipv4(ip(7)),
                    token: Position(55),
                    source: source(),
                    wanted: Source { partition: 5, position: Position(12) },
                    definition: Some(PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![ip(1)] }),
                    orphans: OrphanPolicy::Hold,
                },
            ),
        ),
        (
            "orphaned",
            envelope(
                90,
                SWEEPER,
                Free {
                    pool: pool(),
                    holder: resource_ref(),
                    token: Some(Position(55)),
                    source: source(),
                    cause: FreeCause::Orphaned {},
                },
            ),
        ),
        (
            "orphan-destroyed",
            envelope(
                91,
                SWEEPER,
                Free {
                    pool: pool(),
                    holder: resource_ref(),
                    token: Some(Position(55)),
                    source: source(),
                    cause: FreeCause::OrphanDestroyed { at: Timestamp(T0 + 86_400_000) },
                },
            ),
        ),
        (
            "orphan-freed",
            envelope(
                92,
                SWEEPER,
                Free {
                    pool: pool(),
                    holder: resource_ref(),
                    token: Some(Position(55)),
                    source: source(),
                    cause: FreeCause::OrphanFreed {
                        by: issuer(OP_ISSUER),
                        reason: "machine scrapped; its disks wiped".into(),
                    },
                },
            ),
        ),
        (
            "all-pools",
            envelope(
                93,
                OP_ISSUER,
                FreeOrphan { agent: a(), resource: r(), pool: None, reason: "rack 4 decommissioned".into() },
            ),
        ),
        (
            "healthy-answer",
            envelope(
                47,
                SWEEPER,
                Cascade {
                    child: resource_ref(),
                    parent: parent_ref(),
                    parent_state: ParentState::Healthy,
                    source: source(),
                    answers: Some(Source { partition: 3, position: Position(17) }),
                },
            ),
        ),
        // Schema version 5: leases that queue.
        (
            "priority",
            envelope(
                94,
                "ci:build-7",
                Acquire {
                    agent: a(),
                    resource: r(),
                    lease: LeaseId::from_parts(T0 - 3_000, [0x34; 10]),
                    holder: "release-build".into(),
                    ttl: Some(Millis::from_mins(10)),
                    wait_timeout: Some(Millis::from_mins(15)),
                    priority: 5,
                },
            ),
        ),
        (
            "max-lease",
            envelope(
                95,
                OP_ISSUER,
                Update {
                    agent: a(),
                    resource: r(),
                    set: BTreeMap::new(),
                    remove: vec![],
                    capacity: None,
                    max_lease: Some(Millis::from_hours(2)),
                },
            ),
        ),
        (
            "max-priority",
            envelope(
                96,
                OP_ISSUER,
                SetPartitionSettings {
                    key: Key::Agent(a()),
                    partition: partition_of_key(&Key::Agent(a()), 8),
                    outcome_horizon: None,
                    policy: None,
                    if_no_policy: false,
                    gc: None,
                    max_priority: Some(BTreeMap::from([("ci:".to_owned(), 5), ("op:".to_owned(), 9)])),
                },
            ),
        ),
    ];
    samples.extend(
        variants.into_iter().map(|(variant, envelope)| (format!("{}.{variant}", envelope.type_name()), envelope)),
    );
    samples
}

/// A placement with every field set.
fn place_sample() -> Place {
    Place {
        resource: resource(),
        kind: "container".into(),
        capacity: 2,
        attributes: BTreeMap::from([("image".to_owned(), "alpine:3.20".to_owned())]),
        parent: Some(parent_ref()),
        pools: vec![pool()],
        wait: Some(Millis::from_mins(5)),
        select: [("zone".to_owned(), "a".to_owned())].into(),
        strategy: PlacementStrategy::Spread,
    }
}

/// Every effect variant, in the order of `effect_index`.
fn effect_samples() -> Vec<Effect> {
    let r = resource;
    let stamp = ObsStamp { epoch: Position(3), obs: 41 };
    vec![
        Effect::AgentRegistered {
            incarnation: incarnation(),
            wiped: false,
            settings: agent_settings(),
            own_settings: true,
            retired: false,
        },
        Effect::AgentSeen { at: Timestamp(T0 + 1_000) },
        Effect::AgentStalled { last_seen: Timestamp(T0 - 60_000) },
        Effect::AgentRecovered {},
        Effect::AgentGone { last_seen: Timestamp(T0 - 86_400_000) },
        Effect::AgentRetired { by: issuer(OP_ISSUER) },
        Effect::AgentSuspect { would_lose: 12, live: 20 },
        Effect::AgentBreakerCleared { reason: BreakerClear::HandlesBack {} },
        Effect::ResyncRequested { reason: ResyncReason::DigestMismatch { expected_count: 20, reported_count: 19 } },
        Effect::ObservationAccepted { stamp, watermark: Some(Position(120)) },
        Effect::ResourceAllocated {
            resource: r(),
            kind: "container".into(),
            capacity: 2,
            attributes: BTreeMap::from([("image".to_owned(), "alpine:3.20".to_owned())]),
            parent: Some(parent_ref()),
        },
        Effect::ClaimWanted { resource: r(), pool: pool() },
        Effect::ClaimBound { resource: r(), pool: pool(), value: PoolValue::Ipv4(ip(7)), token: Position(55) },
        Effect::CreateOrdered { resource: r() },
        Effect::ResourceActivated { resource: r(), stamp, native_id: Some("d41d8cd98f00".into()) },
        Effect::ResourcePaused {
            resource: r(),
            reason: Some("disk check".into()),
            until: Some(Timestamp(T0 + 3_600_000)),
        },
        Effect::ResourceUnpaused { resource: r(), cause: UnpauseCause::Operator { by: issuer(OP_ISSUER) } },
        Effect::ResourceUpdated {
            resource: r(),
            set: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
            remove: vec!["image".into()],
            capacity: Some(4),
        },
        Effect::ResourceSuspect { resource: r(), cause: SuspectCause::Agent { detail: "out of memory".into() } },
        Effect::HealthCheckRequested { resource: r() },
        Effect::ResourceHealthy { resource: r() },
        Effect::UpstreamFlagged { resource: r(), parent: parent_ref(), suspect: true, source: source() },
        Effect::ResourceReleasing {
            resource: r(),
            cause: ReleaseCause::Released { by: issuer(OP_ISSUER), reason: Some("build finished".into()) },
        },
        Effect::ResourceDestroyed { resource: r(), stamp },
        Effect::ResourceLost { resource: r(), stamp },
        Effect::ResourceOrphaned { resource: r() },
        Effect::ResourceFailed { resource: r(), detail: "image pull failed: not found".into() },
        Effect::ClaimReleasable {
            resource: r(),
            pool: pool(),
            value: Some(PoolValue::Ipv4(ip(7))),
            token: Some(Position(55)),
        },
        Effect::LeaseWaiting {
            lease: lease(),
            resource: r(),
            holder: "build-1234".into(),
            ttl: Some(Millis::from_mins(5)),
            wait_until: Some(Timestamp(T0 + 62_000)),
        },
        Effect::LeaseGranted {
            lease: lease(),
            resource: r(),
            holder: "build-1234".into(),
            ttl: Some(Millis::from_mins(5)),
            expires_at: Some(Timestamp(T0 + 302_000)),
        },
        Effect::LeaseRenewed { lease: lease(), ttl: None, expires_at: Some(Timestamp(T0 + 603_000)) },
        Effect::LeaseReleased { lease: lease() },
        Effect::LeaseBroken { lease: lease(), reason: BreakReason::ResourceLeft },
        Effect::LeaseExpired { lease: lease() },
        Effect::LeaseFailed { lease: lease() },
        Effect::PoolDefined {
            kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 24, exclude: vec![ip(1)] },
            cooldown: Millis::from_mins(2),
        },
        Effect::ClaimGranted { holder: resource_ref(), value: PoolValue::Ipv4(ip(7)), source: source() },
        Effect::ClaimQueued { holder: resource_ref(), source: source() },
        Effect::ClaimFreed { holder: resource_ref(), value: PoolValue::Ipv4(ip(7)), token: Position(55) },
        Effect::ClaimWithdrawn { holder: resource_ref() },
        Effect::PartitionSettingsChanged { settings: partition_settings() },
        Effect::DecisionContinues { work: Work::OrphanResources {} },
        Effect::GrantReturned { resource: r(), pool: pool(), value: PoolValue::Ipv4(ip(9)), token: Position(61) },
        Effect::AgentBreakerRearmed {},
        Effect::ResourceSeen { resource: r(), stamp, native_id: Some("d41d8cd98f01".into()) },
        Effect::ChildAdopted {
            parent: parent(),
            child: ResourceRef::new(AgentName::new("w2").unwrap(), resource()),
            child_source: Source { partition: 3, position: Position(17) },
            parent_state: ParentState::Suspect,
        },
        Effect::PoolUpdated {
            kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![] },
            cooldown: Millis::from_secs(30),
            recovered: vec![PoolValue::Ipv4(ip(3))],
        },
        Effect::PoolDeleted {},
        Effect::GarbageDestroyOrdered { handle: other_resource(5), cause: GarbageCause::Unknown {} },
        Effect::GarbageDryRun { handle: other_resource(6), cause: GarbageCause::Orphaned {} },
        Effect::GarbageDestroyed { handle: other_resource(5), stamp },
        Effect::HandleReappeared { resource: r(), stamp },
        Effect::AgentDriverUnavailable { detail: "the root /var/lib/leasehold is not mounted".into() },
        Effect::AgentDriverAvailable {},
        Effect::AgentUnretired { by: issuer(OP_ISSUER) },
        Effect::GcModeChanged { mode: GcMode::DryRun },
        Effect::AllocationWaitsUntil { resource: r(), until: Timestamp(T0 + 30_000) },
        Effect::ClaimPoolDefinition {
            resource: r(),
            pool: pool(),
            definition: PoolKind::Ipv4 { network: ip(0), prefix_len: 29, exclude: vec![ip(1)] },
        },
        Effect::DestroyBlocked { resource: r(), detail: "volume lh-x is in use by container ci-cache".into() },
        Effect::AgentCordoned { by: issuer(OP_ISSUER), reason: Some("kernel upgrade at 14:00".into()) },
        Effect::AgentUncordoned { by: issuer(OP_ISSUER) },
        Effect::AgentDeclared {
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            capacity: [("container".to_owned(), 50), ("volume".to_owned(), 200)].into(),
        },
        Effect::PlacementWanted { request: place_sample(), until: Some(Timestamp(T0 + 300_000)) },
        Effect::PlacementWaiting { resource: r(), why: "zone=a: 4 agents full".into() },
        Effect::PlacementBound { resource: r(), agent: agent(), token: Position(120), used: 12, capacity: 50 },
        Effect::PlacementFailed { resource: r(), why: "zone=a: no agent has these labels".into() },
        Effect::PlacementCancelled { resource: r(), by: issuer(OP_ISSUER), reason: Some("not needed".into()) },
        Effect::CapacityReserved {
            resource: r(),
            kind: "container".into(),
            source: Source { partition: 6, position: Position(90) },
            used: 12,
            capacity: 50,
        },
        Effect::ReservationEnded { resource: r(), token: Position(120), committed: true },
        Effect::AgentDraining {
            by: issuer(OP_ISSUER),
            reason: Some("kernel upgrade at 14:00".into()),
            deadline: Some(Timestamp(T0 + 7_200_000)),
            grace: Millis::from_mins(10),
        },
        Effect::PlacementClosed { resource: r() },
        Effect::PoolOrphanPolicy { orphans: OrphanPolicy::Hold },
        Effect::ClaimOrphanPolicy { resource: r(), pool: pool(), orphans: OrphanPolicy::Hold },
        Effect::ClaimHeldForOrphan { resource: r(), pool: pool(), value: PoolValue::Ipv4(ip(7)), token: Position(55) },
        Effect::ClaimReleaseCause {
            resource: r(),
            pool: pool(),
            cause: FreeCause::OrphanDestroyed { at: Timestamp(T0 + 86_400_000) },
        },
        Effect::ClaimFreedBecause {
            holder: resource_ref(),
            cause: FreeCause::OrphanFreed { by: issuer(OP_ISSUER), reason: "machine scrapped".into() },
        },
        Effect::LeaseQueued {
            lease: lease(),
            resource: r(),
            holder: "release-build".into(),
            ttl: Some(Millis::from_mins(10)),
            wait_until: Some(Timestamp(T0 + 900_000)),
            priority: 5,
        },
        Effect::ResourceMaxLeaseChanged { resource: r(), max_lease: Some(Millis::from_hours(2)) },
        Effect::PriorityCapsChanged { max_priority: BTreeMap::from([("ci:".to_owned(), 5), ("op:".to_owned(), 9)]) },
        Effect::QuotaSet {
            quota: quota(),
            max: BTreeMap::from([("container".to_owned(), 20), ("volume".to_owned(), 100)]),
            principals: vec![issuer("ci:team-a"), issuer("ci:team-a-nightly")],
        },
        Effect::QuotaRemoved { quota: quota() },
    ]
}

/// Every work variant, in the order of `work_index`.
fn work_samples() -> Vec<Work> {
    vec![
        Work::OrphanResources {},
        Work::ReleaseResources {},
        Work::Report { report: sync_report(), mark_losses: true },
        Work::Chunk { chunk: resync_chunk(), mark_losses: false },
    ]
}

/// Every rejection kind, in the order of `rejection_index`.
const REJECTION_KINDS: [RejectionKind; 16] = [
    RejectionKind::Unknown,
    RejectionKind::InvalidState,
    RejectionKind::AtCapacity,
    RejectionKind::NotYetDue,
    RejectionKind::StaleObservation,
    RejectionKind::WrongEpoch,
    RejectionKind::StaleCommand,
    RejectionKind::TokenMismatch,
    RejectionKind::NotPermitted,
    RejectionKind::AlreadyExists,
    RejectionKind::AlreadyDone,
    RejectionKind::Invalid,
    RejectionKind::WrongPartition,
    RejectionKind::InternalError,
    RejectionKind::StaleSource,
    RejectionKind::NothingToDo,
];

/// Effects about pools are decided in the pool's partition: their outcome's key is the pool.
fn is_placement_effect(effect: &Effect) -> bool {
    matches!(
        effect,
        Effect::PlacementWanted { .. }
            | Effect::PlacementWaiting { .. }
            | Effect::PlacementBound { .. }
            | Effect::PlacementFailed { .. }
            | Effect::PlacementCancelled { .. }
            | Effect::PlacementClosed { .. }
    )
}

fn is_pool_effect(effect: &Effect) -> bool {
    matches!(
        effect,
        Effect::PoolDefined { .. }
            | Effect::PoolUpdated { .. }
            | Effect::PoolDeleted {}
            | Effect::ClaimGranted { .. }
            | Effect::ClaimQueued { .. }
            | Effect::ClaimFreed { .. }
            | Effect::ClaimWithdrawn { .. }
            | Effect::PoolOrphanPolicy { .. }
            | Effect::ClaimFreedBecause { .. }
    )
}

fn outcome_of(n: u8, envelope: &Envelope, decision: Decision) -> Outcome {
    let n64 = u64::from(n);
    Outcome {
        decider_version: 1,
        partition: partition_of_key(&envelope.body.key(), 8),
        command: CommandSummary::of(envelope),
        cmd_seq: 1_000 + n64,
        part: 0,
        log_time: Timestamp(envelope.issued_at.0 + 7),
        decided_at: Timestamp(envelope.issued_at.0 + 7),
        decision,
    }
}

fn accepted(first_position: u64, effects: Vec<Effect>) -> Decision {
    Decision::Accepted { first_position: Position(first_position), effects }
}

/// The commands the outcome samples answer (their summaries are the commands' own).
fn command_sample(type_name: &str) -> Envelope {
    command_samples().into_iter().find(|(name, _)| name == type_name).unwrap().1
}

fn outcome_samples() -> Vec<(String, Outcome)> {
    let mut samples = Vec::new();
    let for_agent = command_sample("agent.report-created");
    let for_pool = command_sample("sys.claim");
    let for_placement = command_sample("op.place");

    samples.push((
        "outcome.accepted".to_owned(),
        outcome_of(
            1,
            &for_agent,
            accepted(
                118,
                vec![
                    Effect::ObservationAccepted { stamp: ObsStamp { epoch: Position(3), obs: 41 }, watermark: None },
                    Effect::ResourceActivated {
                        resource: resource(),
                        stamp: ObsStamp { epoch: Position(3), obs: 41 },
                        native_id: Some("d41d8cd98f00".into()),
                    },
                    Effect::LeaseGranted {
                        lease: lease(),
                        resource: resource(),
                        holder: "build-1234".into(),
                        ttl: Some(Millis::from_mins(5)),
                        expires_at: Some(Timestamp(for_agent.issued_at.0 + 7 + 300_000)),
                    },
                ],
            ),
        ),
    ));
    samples.push((
        "outcome.rejected".to_owned(),
        outcome_of(
            2,
            &command_sample("op.acquire"),
            Decision::Rejected(Rejection::new(
                RejectionKind::AtCapacity,
                format!("resource {} has 2 of 2 leases; acquire refused", resource_ref()),
            )),
        ),
    ));
    // Not a decision the decider would make: one effect for every variant of every enum inside an effect.
    let stamp = ObsStamp { epoch: Position(3), obs: 47 };
    let released_by = || ReleaseCause::Released { by: issuer(OP_ISSUER), reason: None };
    let nested = vec![
        Effect::ResourceReleasing { resource: resource(), cause: released_by() },
        Effect::ResourceReleasing {
            resource: resource(),
            cause: ReleaseCause::HealthCheckFailed { detail: "probe timed out after 5s".into() },
        },
        Effect::ResourceReleasing { resource: resource(), cause: ReleaseCause::ParentLeft { parent: parent_ref() } },
        Effect::ResourceReleasing { resource: resource(), cause: ReleaseCause::CreateTimeout {} },
        Effect::ResourceReleasing { resource: resource(), cause: ReleaseCause::AgentRetired {} },
        Effect::ResourceReleasing { resource: resource(), cause: ReleaseCause::ParentAbsent { parent: parent_ref() } },
        Effect::ResourceReleasing {
            resource: resource(),
            cause: ReleaseCause::WaitTimeout { waited: Millis::from_secs(30) },
        },
        Effect::ResourceReleasing {
            resource: resource(),
            cause: ReleaseCause::Drained { by: issuer(OP_ISSUER), deadline: true },
        },
        Effect::ResourceReleasing {
            resource: resource(),
            cause: ReleaseCause::OverQuota {
                quota: quota(),
                kind: "container".into(),
                max: 20,
                held: 20,
                holders: vec![ResourceRef::new(AgentName::new("w2").unwrap(), other_resource(5))],
            },
        },
        Effect::GarbageDestroyOrdered { handle: other_resource(5), cause: GarbageCause::Destroyed {} },
        Effect::GarbageDestroyOrdered { handle: other_resource(5), cause: GarbageCause::Failed {} },
        Effect::GarbageDestroyOrdered {
            handle: resource(),
            cause: GarbageCause::Released { by: issuer(OP_ISSUER), reason: Some("restored from backup".into()) },
        },
        Effect::GcModeChanged { mode: GcMode::Destroy },
        Effect::ChildAdopted {
            parent: parent(),
            child: ResourceRef::new(AgentName::new("w2").unwrap(), resource()),
            child_source: Source { partition: 3, position: Position(17) },
            parent_state: ParentState::Absent,
        },
        Effect::ResourceSuspect {
            resource: resource(),
            cause: SuspectCause::Operator { by: issuer(OP_ISSUER), detail: "slow".into() },
        },
        Effect::ResourceSuspect { resource: resource(), cause: SuspectCause::Agent { detail: "slow".into() } },
        Effect::ResourceUnpaused { resource: resource(), cause: UnpauseCause::Operator { by: issuer(OP_ISSUER) } },
        Effect::ResourceUnpaused { resource: resource(), cause: UnpauseCause::PauseExpired {} },
        Effect::LeaseBroken { lease: lease(), reason: BreakReason::ResourceLeft },
        Effect::LeaseBroken { lease: lease(), reason: BreakReason::HealthCheckFailed },
        Effect::AgentBreakerCleared { reason: BreakerClear::HandlesBack {} },
        Effect::AgentBreakerCleared { reason: BreakerClear::LossConfirmed { by: issuer(OP_ISSUER) } },
        Effect::AgentBreakerCleared { reason: BreakerClear::Wiped {} },
        Effect::ResyncRequested { reason: ResyncReason::DigestMismatch { expected_count: 20, reported_count: 19 } },
        Effect::ResyncRequested { reason: ResyncReason::LossConfirmed {} },
        Effect::PoolDefined {
            kind: PoolKind::Ipv4 { network: ip(0), prefix_len: 24, exclude: vec![ip(1)] },
            cooldown: Millis(0),
        },
        Effect::PoolDefined { kind: PoolKind::Slots { count: 16 }, cooldown: Millis(0) },
        Effect::PoolDefined {
            kind: PoolKind::Ports { first: 30_000, last: 30_099, exclude: vec![30_080] },
            cooldown: Millis(0),
        },
        Effect::ClaimBound { resource: resource(), pool: pool(), value: PoolValue::Ipv4(ip(7)), token: Position(55) },
        Effect::ClaimBound { resource: resource(), pool: pool(), value: PoolValue::Slot(0), token: Position(56) },
        Effect::ClaimBound { resource: resource(), pool: pool(), value: PoolValue::Port(30_001), token: Position(57) },
        Effect::ClaimReleasable { resource: resource(), pool: pool(), value: None, token: None },
        Effect::ObservationAccepted { stamp, watermark: None },
        Effect::ResourceActivated { resource: resource(), stamp, native_id: None },
        Effect::ResourcePaused { resource: resource(), reason: None, until: None },
    ];
    samples.push(("outcome.nested-variants".to_owned(), outcome_of(3, &for_agent, accepted(300, nested))));

    for (i, effect) in effect_samples().into_iter().enumerate() {
        let name = format!("effect.{}", effect.name());
        let on = if is_pool_effect(&effect) {
            &for_pool
        } else if is_placement_effect(&effect) {
            &for_placement
        } else {
            &for_agent
        };
        samples.push((name, outcome_of(10 + i as u8, on, accepted(400 + i as u64, vec![effect]))));
    }
    for (i, work) in work_samples().into_iter().enumerate() {
        let name = format!("work.{}", work_name(&work));
        let effects = vec![Effect::DecisionContinues { work }];
        samples.push((name, outcome_of(60 + i as u8, &for_agent, accepted(500 + i as u64, effects))));
    }
    // The second and last part of a decision (`outcome.accepted` would be the first).
    let mut next_part = outcome_of(
        4,
        &command_sample("sys.mark-gone"),
        accepted(
            640,
            vec![
                Effect::ResourceOrphaned { resource: other_resource(1) },
                Effect::LeaseBroken { lease: lease(), reason: BreakReason::ResourceLeft },
            ],
        ),
    );
    next_part.part = 1;
    samples.push(("outcome.next-part".to_owned(), next_part));
    for (i, kind) in REJECTION_KINDS.into_iter().enumerate() {
        let rejection = Rejection::new(kind, format!("a sample {kind} rejection of {}", resource_ref()));
        samples
            .push((format!("rejection.{kind}"), outcome_of(70 + i as u8, &for_agent, Decision::Rejected(rejection))));
    }
    samples
}

// ---------------------------------------------------------------------------------------------------------------
// Exhaustive maps from each wire enum to an index: a variant added without a fixture fails to compile here, and a
// new arm without a sample fails `samples_cover_every_variant`.

const EFFECT_VARIANTS: usize = 81;

fn effect_index(effect: &Effect) -> usize {
    match effect {
        Effect::AgentRegistered { .. } => 0,
        Effect::AgentSeen { .. } => 1,
        Effect::AgentStalled { .. } => 2,
        Effect::AgentRecovered {} => 3,
        Effect::AgentGone { .. } => 4,
        Effect::AgentRetired { .. } => 5,
        Effect::AgentSuspect { .. } => 6,
        Effect::AgentBreakerCleared { .. } => 7,
        Effect::ResyncRequested { .. } => 8,
        Effect::ObservationAccepted { .. } => 9,
        Effect::ResourceAllocated { .. } => 10,
        Effect::ClaimWanted { .. } => 11,
        Effect::ClaimBound { .. } => 12,
        Effect::CreateOrdered { .. } => 13,
        Effect::ResourceActivated { .. } => 14,
        Effect::ResourcePaused { .. } => 15,
        Effect::ResourceUnpaused { .. } => 16,
        Effect::ResourceUpdated { .. } => 17,
        Effect::ResourceSuspect { .. } => 18,
        Effect::HealthCheckRequested { .. } => 19,
        Effect::ResourceHealthy { .. } => 20,
        Effect::UpstreamFlagged { .. } => 21,
        Effect::ResourceReleasing { .. } => 22,
        Effect::ResourceDestroyed { .. } => 23,
        Effect::ResourceLost { .. } => 24,
        Effect::ResourceOrphaned { .. } => 25,
        Effect::ResourceFailed { .. } => 26,
        Effect::ClaimReleasable { .. } => 27,
        Effect::LeaseWaiting { .. } => 28,
        Effect::LeaseGranted { .. } => 29,
        Effect::LeaseRenewed { .. } => 30,
        Effect::LeaseReleased { .. } => 31,
        Effect::LeaseBroken { .. } => 32,
        Effect::LeaseExpired { .. } => 33,
        Effect::LeaseFailed { .. } => 34,
        Effect::PoolDefined { .. } => 35,
        Effect::ClaimGranted { .. } => 36,
        Effect::ClaimQueued { .. } => 37,
        Effect::ClaimFreed { .. } => 38,
        Effect::ClaimWithdrawn { .. } => 39,
        Effect::PartitionSettingsChanged { .. } => 40,
        Effect::DecisionContinues { .. } => 41,
        Effect::GrantReturned { .. } => 42,
        Effect::AgentBreakerRearmed {} => 43,
        Effect::ResourceSeen { .. } => 44,
        Effect::ChildAdopted { .. } => 45,
        Effect::PoolUpdated { .. } => 46,
        Effect::PoolDeleted {} => 47,
        Effect::GarbageDestroyOrdered { .. } => 48,
        Effect::GarbageDryRun { .. } => 49,
        Effect::GarbageDestroyed { .. } => 50,
        Effect::HandleReappeared { .. } => 51,
        Effect::AgentDriverUnavailable { .. } => 52,
        Effect::AgentDriverAvailable {} => 53,
        Effect::AgentUnretired { .. } => 54,
        Effect::GcModeChanged { .. } => 55,
        Effect::AllocationWaitsUntil { .. } => 56,
        Effect::ClaimPoolDefinition { .. } => 57,
        Effect::DestroyBlocked { .. } => 58,
        Effect::AgentCordoned { .. } => 59,
        Effect::AgentUncordoned { .. } => 60,
        Effect::AgentDeclared { .. } => 61,
        Effect::PlacementWanted { .. } => 62,
        Effect::PlacementWaiting { .. } => 63,
        Effect::PlacementBound { .. } => 64,
        Effect::PlacementFailed { .. } => 65,
        Effect::PlacementCancelled { .. } => 66,
        Effect::CapacityReserved { .. } => 67,
        Effect::ReservationEnded { .. } => 68,
        Effect::AgentDraining { .. } => 69,
        Effect::PlacementClosed { .. } => 70,
        Effect::PoolOrphanPolicy { .. } => 71,
        Effect::ClaimOrphanPolicy { .. } => 72,
        Effect::ClaimHeldForOrphan { .. } => 73,
        Effect::ClaimReleaseCause { .. } => 74,
        Effect::ClaimFreedBecause { .. } => 75,
        Effect::LeaseQueued { .. } => 76,
        Effect::ResourceMaxLeaseChanged { .. } => 77,
        Effect::PriorityCapsChanged { .. } => 78,
        Effect::QuotaSet { .. } => 79,
        Effect::QuotaRemoved { .. } => 80,
    }
}

fn work_index(work: &Work) -> usize {
    match work {
        Work::OrphanResources {} => 0,
        Work::ReleaseResources {} => 1,
        Work::Report { .. } => 2,
        Work::Chunk { .. } => 3,
    }
}

fn work_name(work: &Work) -> &'static str {
    match work {
        Work::OrphanResources {} => "orphan-resources",
        Work::ReleaseResources {} => "release-resources",
        Work::Report { .. } => "report",
        Work::Chunk { .. } => "chunk",
    }
}

fn rejection_index(kind: RejectionKind) -> usize {
    match kind {
        RejectionKind::Unknown => 0,
        RejectionKind::InvalidState => 1,
        RejectionKind::AtCapacity => 2,
        RejectionKind::NotYetDue => 3,
        RejectionKind::StaleObservation => 4,
        RejectionKind::WrongEpoch => 5,
        RejectionKind::StaleCommand => 6,
        RejectionKind::TokenMismatch => 7,
        RejectionKind::NotPermitted => 8,
        RejectionKind::AlreadyExists => 9,
        RejectionKind::AlreadyDone => 10,
        RejectionKind::Invalid => 11,
        RejectionKind::WrongPartition => 12,
        RejectionKind::InternalError => 13,
        RejectionKind::StaleSource => 14,
        RejectionKind::NothingToDo => 15,
    }
}

/// Which variants of which enum the samples hold.
#[derive(Default)]
struct Seen(BTreeMap<&'static str, BTreeSet<usize>>);

impl Seen {
    fn mark(&mut self, what: &'static str, index: usize) {
        self.0.entry(what).or_default().insert(index);
    }

    fn key(&mut self, key: &Key) {
        let index = match key {
            Key::Agent(_) => 0,
            Key::Pool(_) => 1,
            Key::Placement(_) => 2,
        };
        self.mark("Key", index);
    }

    fn class(&mut self, class: CommandClass) {
        let index = match class {
            CommandClass::Op => 0,
            CommandClass::Agent => 1,
            CommandClass::Sys => 2,
        };
        self.mark("CommandClass", index);
    }

    fn pool_kind(&mut self, kind: &PoolKind) {
        let index = match kind {
            PoolKind::Ipv4 { .. } => 0,
            PoolKind::Slots { .. } => 1,
            PoolKind::Ports { .. } => 2,
        };
        self.mark("PoolKind", index);
    }

    fn pool_value(&mut self, value: &PoolValue) {
        let index = match value {
            PoolValue::Ipv4(_) => 0,
            PoolValue::Slot(_) => 1,
            PoolValue::Port(_) => 2,
        };
        self.mark("PoolValue", index);
    }

    fn parent_state(&mut self, state: ParentState) {
        let index = match state {
            ParentState::Left => 0,
            ParentState::Suspect => 1,
            ParentState::Healthy => 2,
            ParentState::Absent => 3,
        };
        self.mark("ParentState", index);
    }

    fn strategy(&mut self, strategy: PlacementStrategy) {
        let index = match strategy {
            PlacementStrategy::Spread => 0,
            PlacementStrategy::Pack => 1,
        };
        self.mark("PlacementStrategy", index);
    }

    fn gc_mode(&mut self, mode: GcMode) {
        let index = match mode {
            GcMode::Destroy => 0,
            GcMode::DryRun => 1,
        };
        self.mark("GcMode", index);
    }

    fn orphans(&mut self, policy: OrphanPolicy) {
        let index = match policy {
            OrphanPolicy::Release => 0,
            OrphanPolicy::Hold => 1,
        };
        self.mark("OrphanPolicy", index);
    }

    fn free_cause(&mut self, cause: &FreeCause) {
        let index = match cause {
            FreeCause::Released {} => 0,
            FreeCause::Orphaned {} => 1,
            FreeCause::OrphanDestroyed { .. } => 2,
            FreeCause::OrphanFreed { .. } => 3,
        };
        self.mark("FreeCause", index);
    }

    fn option<T>(&mut self, what: &'static str, value: &Option<T>) {
        self.mark(what, usize::from(value.is_some()));
    }

    fn command(&mut self, envelope: &Envelope) {
        self.class(envelope.class);
        self.key(&envelope.body.key());
        self.option("Option (correlation id)", &envelope.correlation_id);
        self.option("Option (causation id)", &envelope.causation_id);
        match &envelope.body {
            Command::DefinePool(c) => {
                self.pool_kind(&c.kind);
                self.orphans(c.orphans);
            }
            Command::UpdatePool(c) => {
                self.pool_kind(&c.kind);
                self.option("Option (orphan policy)", &c.orphans);
            }
            Command::BindClaim(c) => {
                self.pool_value(&c.value);
                self.orphans(c.orphans);
            }
            Command::Free(c) => self.free_cause(&c.cause),
            Command::FreeOrphan(c) => self.option("Option (pool to free)", &c.pool),
            Command::CommitPlacement(c) => self.option("Option (placement principal)", &c.principal),
            Command::ReportFailure(c) => {
                let index = match c.failure {
                    FailureKind::CreateFailed => 0,
                    FailureKind::Unhealthy => 1,
                    FailureKind::DestroyBlocked => 2,
                };
                self.mark("FailureKind", index);
            }
            Command::Cascade(c) => {
                self.parent_state(c.parent_state);
                self.option("Option (cascade answers)", &c.answers);
            }
            Command::SetPartitionSettings(c) => {
                if let Some(mode) = c.gc {
                    self.gc_mode(mode);
                }
            }
            Command::Place(c) => self.strategy(c.strategy),
            _ => {}
        }
    }

    fn outcome(&mut self, outcome: &Outcome) {
        self.class(outcome.command.class);
        self.key(&outcome.command.key);
        match &outcome.decision {
            Decision::Accepted { effects, .. } => {
                self.mark("Decision", 0);
                for effect in effects {
                    self.effect(effect);
                }
            }
            Decision::Rejected(rejection) => {
                self.mark("Decision", 1);
                self.mark("RejectionKind", rejection_index(rejection.kind));
            }
        }
    }

    fn effect(&mut self, effect: &Effect) {
        self.mark("Effect", effect_index(effect));
        match effect {
            Effect::AgentBreakerCleared { reason } => {
                let index = match reason {
                    BreakerClear::HandlesBack {} => 0,
                    BreakerClear::LossConfirmed { .. } => 1,
                    BreakerClear::Wiped {} => 2,
                };
                self.mark("BreakerClear", index);
            }
            Effect::ResyncRequested { reason } => {
                let index = match reason {
                    ResyncReason::DigestMismatch { .. } => 0,
                    ResyncReason::LossConfirmed {} => 1,
                };
                self.mark("ResyncReason", index);
            }
            Effect::ResourceUnpaused { cause, .. } => {
                let index = match cause {
                    UnpauseCause::Operator { .. } => 0,
                    UnpauseCause::PauseExpired {} => 1,
                };
                self.mark("UnpauseCause", index);
            }
            Effect::ResourceSuspect { cause, .. } => {
                let index = match cause {
                    SuspectCause::Operator { .. } => 0,
                    SuspectCause::Agent { .. } => 1,
                };
                self.mark("SuspectCause", index);
            }
            Effect::ResourceReleasing { cause, .. } => {
                let index = match cause {
                    ReleaseCause::Released { .. } => 0,
                    ReleaseCause::HealthCheckFailed { .. } => 1,
                    ReleaseCause::ParentLeft { .. } => 2,
                    ReleaseCause::CreateTimeout {} => 3,
                    ReleaseCause::AgentRetired {} => 4,
                    ReleaseCause::ParentAbsent { .. } => 5,
                    ReleaseCause::WaitTimeout { .. } => 6,
                    ReleaseCause::Drained { .. } => 7,
                    ReleaseCause::OverQuota { .. } => 8,
                };
                self.mark("ReleaseCause", index);
            }
            Effect::LeaseBroken { reason, .. } => {
                let index = match reason {
                    BreakReason::ResourceLeft => 0,
                    BreakReason::HealthCheckFailed => 1,
                };
                self.mark("BreakReason", index);
            }
            Effect::PoolDefined { kind, .. } | Effect::PoolUpdated { kind, .. } => self.pool_kind(kind),
            Effect::ClaimBound { value, .. }
            | Effect::ClaimGranted { value, .. }
            | Effect::ClaimFreed { value, .. } => self.pool_value(value),
            Effect::ClaimReleasable { value, .. } => {
                self.option("Option (claim value)", value);
                if let Some(value) = value {
                    self.pool_value(value);
                }
            }
            Effect::DecisionContinues { work } => self.mark("Work", work_index(work)),
            Effect::GrantReturned { value, .. } => self.pool_value(value),
            Effect::ChildAdopted { parent_state, .. } => self.parent_state(*parent_state),
            Effect::GarbageDestroyOrdered { cause, .. } | Effect::GarbageDryRun { cause, .. } => {
                let index = match cause {
                    GarbageCause::Unknown {} => 0,
                    GarbageCause::Destroyed {} => 1,
                    GarbageCause::Orphaned {} => 2,
                    GarbageCause::Failed {} => 3,
                    GarbageCause::Released { .. } => 4,
                };
                self.mark("GarbageCause", index);
            }
            Effect::GcModeChanged { mode } => self.gc_mode(*mode),
            Effect::PoolOrphanPolicy { orphans } | Effect::ClaimOrphanPolicy { orphans, .. } => self.orphans(*orphans),
            Effect::ClaimHeldForOrphan { value, .. } => self.pool_value(value),
            Effect::ClaimReleaseCause { cause, .. } | Effect::ClaimFreedBecause { cause, .. } => self.free_cause(cause),
            _ => {}
        }
    }
}

/// How many variants each enum has (a `bool`-like `Option` has two).
const VARIANT_COUNTS: &[(&str, usize)] = &[
    ("BreakReason", 2),
    ("BreakerClear", 3),
    ("CommandClass", 3),
    ("Decision", 2),
    ("Effect", EFFECT_VARIANTS),
    ("FailureKind", 3),
    ("FreeCause", 4),
    ("GarbageCause", 5),
    ("GcMode", 2),
    ("Key", 3),
    ("Option (cascade answers)", 2),
    ("Option (causation id)", 2),
    ("Option (claim value)", 2),
    ("Option (correlation id)", 2),
    ("Option (orphan policy)", 2),
    ("Option (placement principal)", 2),
    ("Option (pool to free)", 2),
    ("OrphanPolicy", 2),
    ("ParentState", 4),
    ("PlacementStrategy", 2),
    ("PoolKind", 3),
    ("PoolValue", 3),
    ("RejectionKind", REJECTION_KINDS.len()),
    ("ReleaseCause", 9),
    ("ResyncReason", 2),
    ("SuspectCause", 2),
    ("UnpauseCause", 2),
    ("Work", 4),
];

// ---------------------------------------------------------------------------------------------------------------
// Fixtures: what a sample looks like in each form, on disk.

enum Sample {
    Command(Envelope),
    Outcome(Outcome),
}

struct Fixture {
    name: String,
    sample: Sample,
}

fn fixtures() -> Vec<Fixture> {
    let commands = command_samples().into_iter().map(|(name, e)| Fixture { name, sample: Sample::Command(e) });
    let outcomes = outcome_samples().into_iter().map(|(name, o)| Fixture { name, sample: Sample::Outcome(o) });
    commands.chain(outcomes).collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    Bincode,
    Json,
}

impl Form {
    fn extension(self) -> &'static str {
        match self {
            Form::Bincode => "bin",
            Form::Json => "json",
        }
    }
}

const FORMS: [Form; 2] = [Form::Bincode, Form::Json];

impl Fixture {
    fn file_name(&self, form: Form) -> String {
        format!("{}.{}", self.name, form.extension())
    }

    /// What this build writes.
    fn encode(&self, form: Form) -> Vec<u8> {
        let text = match (&self.sample, form) {
            (Sample::Command(e), Form::Bincode) => return codec::encode_command(e).unwrap(),
            (Sample::Outcome(o), Form::Bincode) => return codec::encode_outcome(o).unwrap(),
            (Sample::Command(e), Form::Json) => layout_json(&codec::command_to_json(e).unwrap(), 2),
            (Sample::Outcome(o), Form::Json) => layout_json(&serde_json::to_string(o).unwrap(), 4),
        };
        format!("{text}\n").into_bytes()
    }

    /// Decodes committed bytes and checks they give the sample back.
    fn check_decodes(&self, form: Form, bytes: &[u8]) -> Result<(), String> {
        let found = match (&self.sample, form) {
            (Sample::Command(expected), Form::Bincode | Form::Json) => match codec::decode_command(bytes) {
                Ok(found) if found == *expected => return Ok(()),
                Ok(found) => format!("{found:?}\n  expected {expected:?}"),
                Err(e) => format!("an error: {e} ({:?})", e.kind()),
            },
            (Sample::Outcome(expected), Form::Bincode) => match codec::decode_outcome(bytes) {
                Ok(found) if found == *expected => return Ok(()),
                Ok(found) => format!("{found:?}\n  expected {expected:?}"),
                Err(e) => format!("an error: {e} ({:?})", e.kind()),
            },
            (Sample::Outcome(expected), Form::Json) => match serde_json::from_slice::<Outcome>(bytes) {
                Ok(found) if found == *expected => return Ok(()),
                Ok(found) => format!("{found:?}\n  expected {expected:?}"),
                Err(e) => format!("an error: {e}"),
            },
        };
        Err(format!("{} decodes to {found}", self.file_name(form)))
    }
}

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

fn current_dir() -> PathBuf {
    fixtures_root().join(format!("v{SCHEMA_VERSION}"))
}

fn bless() -> bool {
    std::env::var("LH_BLESS").is_ok_and(|v| v == "1")
}

/// Writes through a temporary file, so that a test reading fixtures at the same time never sees half a file.
fn write_atomically(path: &Path, bytes: &[u8]) {
    let dir = path.parent().unwrap();
    fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().unwrap().to_string_lossy(), std::process::id()));
    fs::write(&tmp, bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename {} to {}: {e}", tmp.display(), path.display()));
}

/// The committed bytes of a fixture, or what this build writes if the fixture is not there yet (the golden test
/// writes it; the tests that only need some valid bytes do not wait for that).
fn committed_or_encoded(fixture: &Fixture, form: Form) -> Vec<u8> {
    fs::read(current_dir().join(fixture.file_name(form))).unwrap_or_else(|_| fixture.encode(form))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn wire_change_advice(path: &str) -> String {
    format!(
        "{path} changed: this is a wire change. Logs already hold schema version {SCHEMA_VERSION} messages, so a change \
         to their bytes needs a new schema version: bump leasehold_schemas::SCHEMA_VERSION, keep reading version \
         {SCHEMA_VERSION} (these fixtures must still decode), and commit fixtures for the new version. Only if no \
         message with the old bytes was ever written, regenerate with `LH_BLESS=1 cargo test -p leasehold-schemas \
         --test golden` and commit the result."
    )
}

/// Compares committed bytes with this build's; `Err` says what differs.
fn compare(form: Form, path: &str, committed: &[u8], now: &[u8]) -> Result<(), String> {
    match form {
        Form::Bincode => {
            if committed == now {
                return Ok(());
            }
            let first_difference =
                committed.iter().zip(now).position(|(a, b)| a != b).unwrap_or(committed.len().min(now.len()));
            Err(format!(
                "{}\n  committed ({} bytes): {}\n  this build ({} bytes): {}\n  first difference at byte {first_difference}",
                wire_change_advice(path),
                committed.len(),
                hex(committed),
                now.len(),
                hex(now)
            ))
        }
        Form::Json => {
            let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes);
            match (parse(committed), parse(now)) {
                (Ok(a), Ok(b)) if a == b => Ok(()),
                (Ok(a), Ok(b)) => Err(format!("{}\n  committed:  {a}\n  this build: {b}", wire_change_advice(path))),
                (Err(e), _) => Err(format!("{path} is not JSON: {e}")),
                (_, Err(e)) => Err(format!("this build writes {path} as something that is not JSON: {e}")),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// JSON layout: the compact text serde_json writes, indented to a given depth and compact below it. It keeps the
// order the encoder chose (a `serde_json::Value` would sort the envelope's fields).

fn layout_json(compact: &str, expand_depth: usize) -> String {
    let mut out = String::new();
    let mut rest = compact.trim();
    layout_value(&mut rest, 0, expand_depth, &mut out);
    assert!(rest.trim().is_empty(), "trailing text after JSON: {rest:?}");
    out
}

fn layout_value(rest: &mut &str, depth: usize, expand_depth: usize, out: &mut String) {
    *rest = rest.trim_start();
    let first = rest.chars().next().expect("a JSON value");
    match first {
        '{' | '[' => {
            let close = if first == '{' { '}' } else { ']' };
            *rest = rest[1..].trim_start();
            if let Some(after) = rest.strip_prefix(close) {
                *rest = after;
                out.push(first);
                out.push(close);
                return;
            }
            let expand = depth < expand_depth;
            out.push(first);
            loop {
                if expand {
                    out.push('\n');
                    out.push_str(&"  ".repeat(depth + 1));
                }
                if first == '{' {
                    layout_string(rest, out);
                    *rest = rest.trim_start().strip_prefix(':').expect("':' after a key");
                    out.push_str(": ");
                }
                layout_value(rest, depth + 1, expand_depth, out);
                *rest = rest.trim_start();
                if let Some(after) = rest.strip_prefix(',') {
                    *rest = after;
                    out.push(',');
                    if !expand {
                        out.push(' ');
                    }
                } else {
                    *rest = rest.strip_prefix(close).expect("the end of an object or array");
                    break;
                }
            }
            if expand {
                out.push('\n');
                out.push_str(&"  ".repeat(depth));
            }
            out.push(close);
        }
        '"' => layout_string(rest, out),
        _ => {
            let end = rest.find([',', '}', ']']).unwrap_or(rest.len());
            out.push_str(rest[..end].trim_end());
            *rest = &rest[end..];
        }
    }
}

fn layout_string(rest: &mut &str, out: &mut String) {
    *rest = rest.trim_start();
    let bytes = rest.as_bytes();
    assert_eq!(bytes.first(), Some(&b'"'), "a JSON string");
    let mut i = 1;
    while bytes[i] != b'"' {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    out.push_str(&rest[..=i]);
    *rest = &rest[i + 1..];
}

// ---------------------------------------------------------------------------------------------------------------
// The tests.

#[test]
fn fixtures_match_the_samples() {
    let dir = current_dir();
    let bless = bless();
    let fixtures = fixtures();
    let mut failures = Vec::new();
    let mut written = Vec::new();

    for fixture in &fixtures {
        for form in FORMS {
            let file_name = fixture.file_name(form);
            let path = dir.join(&file_name);
            let shown = format!("schemas/tests/fixtures/v{SCHEMA_VERSION}/{file_name}");
            let now = fixture.encode(form);
            let stale = fs::read(&path).ok().as_deref() != Some(now.as_slice());
            if (bless || !path.exists()) && stale {
                write_atomically(&path, &now);
                written.push(shown.clone());
            }
            let committed = fs::read(&path).unwrap_or_else(|e| panic!("cannot read {shown}: {e}"));
            if let Err(problem) = compare(form, &shown, &committed, &now) {
                failures.push(problem);
            }
            if let Err(problem) = fixture.check_decodes(form, &committed) {
                failures.push(format!("{shown} no longer decodes to its sample: {problem}"));
            }
        }
    }

    // The directory holds exactly the fixtures above: a removed command type or effect leaves a file nobody reads.
    let expected: BTreeSet<String> = fixtures.iter().flat_map(|f| FORMS.map(|form| f.file_name(form))).collect();
    for entry in fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !expected.contains(&name) && !name.starts_with('.') {
            failures.push(format!(
                "schemas/tests/fixtures/v{SCHEMA_VERSION}/{name} is not the fixture of any sample in \
                 schemas/tests/golden.rs. If a type or variant was removed or renamed, that is a wire change and needs a new \
                 schema version; delete the file only if no message of that shape was ever written"
            ));
        }
    }

    // The command fixtures on disk are exactly one per type name.
    let command_files: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| name.strip_suffix(".bin").map(str::to_owned))
        .filter(|stem| stem.matches('.').count() == 1 && ["op.", "agent.", "sys."].iter().any(|c| stem.starts_with(c)))
        .collect();
    let type_names: BTreeSet<String> = Command::TYPE_NAMES.iter().map(|s| (*s).to_owned()).collect();
    if command_files != type_names {
        failures.push(format!(
            "command fixtures and Command::TYPE_NAMES differ:\n  without fixture: {:?}\n  fixture without type: {:?}",
            type_names.difference(&command_files).collect::<Vec<_>>(),
            command_files.difference(&type_names).collect::<Vec<_>>()
        ));
    }

    if !written.is_empty() {
        eprintln!("wrote {} fixture(s); commit them:\n  {}", written.len(), written.join("\n  "));
    }
    assert!(failures.is_empty(), "{} golden fixture problem(s):\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn samples_cover_every_variant() {
    let mut seen = Seen::default();
    let commands = command_samples();
    for (_, envelope) in &commands {
        seen.command(envelope);
    }
    for (_, outcome) in outcome_samples() {
        seen.outcome(&outcome);
    }
    for (what, count) in VARIANT_COUNTS {
        let found = seen.0.remove(what).unwrap_or_default();
        let all: BTreeSet<usize> = (0..*count).collect();
        assert_eq!(found, all, "{what}: the samples hold these variants (by index); every one of 0..{count} needs one");
    }
    assert!(seen.0.is_empty(), "enums without an entry in VARIANT_COUNTS: {:?}", seen.0.keys());

    // One fixture per effect variant, in index order, each named by the effect.
    let effects = effect_samples();
    assert_eq!(effects.len(), EFFECT_VARIANTS);
    for (i, effect) in effects.iter().enumerate() {
        assert_eq!(effect_index(effect), i, "effect_samples()[{i}] is {}", effect.name());
    }
    for (i, work) in work_samples().iter().enumerate() {
        assert_eq!(work_index(work), i);
    }
    for (i, kind) in REJECTION_KINDS.iter().enumerate() {
        assert_eq!(rejection_index(*kind), i);
    }

    // Fixture names are unique, and the first samples are the command types in declaration order.
    let names: Vec<String> = fixtures().into_iter().map(|f| f.name).collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "two samples share a fixture name");
    let first: Vec<&str> = commands.iter().take(Command::TYPE_NAMES.len()).map(|(name, _)| name.as_str()).collect();
    assert_eq!(first, Command::TYPE_NAMES);
    for (name, envelope) in &commands {
        assert!(name.starts_with(envelope.type_name()), "{name} holds a {}", envelope.type_name());
    }
}

#[test]
fn a_newer_schema_version_is_reported_as_newer_not_as_garbage() {
    let future = u8::try_from(SCHEMA_VERSION + 1).expect("the version is a one-byte varint");
    for fixture in fixtures() {
        let bytes = committed_or_encoded(&fixture, Form::Bincode);
        assert_eq!(bytes[0], codec::FORMAT_BINCODE_V1, "{}: the format tag", fixture.name);
        // Each is written in the oldest version that expresses it (so older readers read what they can).
        let written_in = match &fixture.sample {
            Sample::Command(envelope) => envelope.schema_version,
            Sample::Outcome(outcome) => outcome.oldest_schema_version(),
        };
        assert!(written_in <= SCHEMA_VERSION, "{}", fixture.name);
        assert_eq!(u16::from(bytes[1]), written_in, "{}: the schema version is the second byte", fixture.name);
        // One more than this build, and the largest u16 (varint 0xfb then two little-endian bytes).
        let bumped = [bytes[..1].to_vec(), vec![future], bytes[2..].to_vec()].concat();
        let largest = [bytes[..1].to_vec(), vec![0xfb, 0xff, 0xff], bytes[2..].to_vec()].concat();
        for newer in [bumped, largest] {
            let kind = match &fixture.sample {
                Sample::Command(_) => codec::decode_command(&newer).unwrap_err().kind(),
                Sample::Outcome(_) => codec::decode_outcome(&newer).unwrap_err().kind(),
            };
            assert_eq!(kind, CodecErrorKind::NewerSchema, "{} with version bytes {:02x?}", fixture.name, &newer[1..4]);
        }
        if let Sample::Command(_) = fixture.sample {
            let json = committed_or_encoded(&fixture, Form::Json);
            let mut value: serde_json::Value = serde_json::from_slice(&json).unwrap();
            value["schema_version"] = serde_json::json!(SCHEMA_VERSION + 1);
            let err = codec::decode_command(value.to_string().as_bytes()).unwrap_err();
            assert_eq!(err.kind(), CodecErrorKind::NewerSchema, "{}.json: {err}", fixture.name);
        }
    }
}

#[test]
fn truncated_fixtures_are_errors_not_panics() {
    for fixture in fixtures() {
        let bytes = committed_or_encoded(&fixture, Form::Bincode);
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            let result = std::panic::catch_unwind(|| match &fixture.sample {
                Sample::Command(_) => codec::decode_command(prefix).map(|_| ()),
                Sample::Outcome(_) => codec::decode_outcome(prefix).map(|_| ()),
            });
            match result {
                Ok(Err(_)) => {}
                Ok(Ok(())) => panic!("{}.bin cut to {cut} of {} bytes decodes", fixture.name, bytes.len()),
                Err(_) => panic!("{}.bin cut to {cut} of {} bytes panics the decoder", fixture.name, bytes.len()),
            }
        }
        if let Sample::Command(_) = fixture.sample {
            let json = committed_or_encoded(&fixture, Form::Json);
            let end = json.iter().rposition(|b| *b == b'}').unwrap();
            for cut in 0..end {
                let prefix = &json[..cut];
                let result = std::panic::catch_unwind(|| codec::decode_command(prefix).map(|_| ()));
                assert!(matches!(result, Ok(Err(_))), "{}.json cut to {cut} bytes: {result:?}", fixture.name);
            }
        }
    }
}

#[test]
fn older_schema_versions_still_decode() {
    for entry in fs::read_dir(fixtures_root()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let version: u16 = name
            .strip_prefix('v')
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("tests/fixtures/{name}: fixture directories are named v<schema version>"));
        assert!(version <= SCHEMA_VERSION, "tests/fixtures/{name} is newer than SCHEMA_VERSION {SCHEMA_VERSION}");
        if version == SCHEMA_VERSION {
            continue; // compared value for value by `fixtures_match_the_samples`
        }
        for file in fs::read_dir(entry.path()).unwrap() {
            let path = file.unwrap().path();
            let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = fs::read(&path).unwrap();
            let is_command = ["op.", "agent.", "sys."].iter().any(|c| file_name.starts_with(c));
            let result = match (is_command, path.extension().and_then(|e| e.to_str())) {
                (true, _) => codec::decode_command(&bytes).map(|_| ()).map_err(|e| e.to_string()),
                (false, Some("bin")) => codec::decode_outcome(&bytes).map(|_| ()).map_err(|e| e.to_string()),
                (false, _) => serde_json::from_slice::<Outcome>(&bytes).map(|_| ()).map_err(|e| e.to_string()),
            };
            if let Err(e) = result {
                panic!(
                    "tests/fixtures/{name}/{file_name}, written by schema version {version}, no longer decodes: {e}"
                );
            }
        }
    }
}

fn readme_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The ```json blocks of schemas/README.md, with the line each starts on.
fn readme_json_blocks() -> Vec<(usize, String)> {
    let text = readme_text();
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut current {
            None if line.trim_start().starts_with("```json") => current = Some((i + 1, String::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.push(current.take().unwrap()),
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "README.md: a ```json block is not closed");
    blocks
}

/// Every JSON example in the README is checked: a command envelope (it has a "type") must decode with the codec to
/// one of the samples above, an outcome (it has a "decision") likewise, and the array of effects must list every
/// effect variant as its sample. So the README cannot drift from the code.
#[test]
fn readme_json_examples_decode_to_the_fixtures() {
    let commands = command_samples();
    let outcomes = outcome_samples();
    let effects = effect_samples();
    let mut types_shown = BTreeSet::new();
    let mut outcomes_shown = BTreeSet::new();
    let mut effects_shown = BTreeSet::new();
    for (line, block) in readme_json_blocks() {
        let value: serde_json::Value =
            serde_json::from_str(&block).unwrap_or_else(|e| panic!("README.md line {line}: not JSON: {e}"));
        if value.get("type").is_some() {
            let envelope = codec::decode_command(block.as_bytes())
                .unwrap_or_else(|e| panic!("README.md line {line}: the codec refuses this command: {e}"));
            let Some((name, _)) = commands.iter().find(|(_, sample)| *sample == envelope) else {
                panic!(
                    "README.md line {line}: {envelope:#?} is not one of the fixtures in golden.rs: copy the fixture"
                );
            };
            if name == envelope.type_name() {
                types_shown.insert(name.clone());
            }
        } else if value.get("decision").is_some() {
            let outcome: Outcome =
                serde_json::from_value(value).unwrap_or_else(|e| panic!("README.md line {line}: not an outcome: {e}"));
            let Some((name, _)) = outcomes.iter().find(|(_, sample)| *sample == outcome) else {
                panic!("README.md line {line}: this outcome is not one of the fixtures in golden.rs: copy the fixture");
            };
            outcomes_shown.insert(name.clone());
        } else if value.is_array() {
            let listed: Vec<Effect> = serde_json::from_value(value)
                .unwrap_or_else(|e| panic!("README.md line {line}: not a list of effects: {e}"));
            for effect in listed {
                let index = effect_index(&effect);
                assert_eq!(effect, effects[index], "README.md line {line}: {} differs from its fixture", effect.name());
                effects_shown.insert(index);
            }
        } else {
            panic!(
                "README.md line {line}: a ```json block that is neither a command, an outcome nor the list of effects; \
                 mark it ```text if it is not meant to be checked"
            );
        }
    }
    let all_types: BTreeSet<String> = Command::TYPE_NAMES.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(types_shown, all_types, "README.md must show every command type as its fixture");
    for needed in ["outcome.accepted", "outcome.rejected"] {
        assert!(outcomes_shown.contains(needed), "README.md must show {needed}");
    }
    let all_effects: BTreeSet<usize> = (0..EFFECT_VARIANTS).collect();
    let missing: Vec<&str> = all_effects.difference(&effects_shown).map(|i| effects[*i].name()).collect();
    assert!(missing.is_empty(), "README.md's list of effects lacks {missing:?}");
}

/// The README's prose quotes subjects, names and test vectors: they are checked here.
#[test]
fn readme_prose_matches_the_code() {
    let readme = readme_text();
    for (name, envelope) in command_samples().iter().take(Command::TYPE_NAMES.len()) {
        let subject = ingress_subject_of(&envelope.body);
        assert!(readme.contains(&format!("`{subject}`")), "README.md must give the subject of {name}: `{subject}`");
    }
    for kind in REJECTION_KINDS {
        let json = serde_json::to_value(kind).unwrap();
        let json = json.as_str().unwrap();
        assert!(readme.contains(&format!("| `{json}` |")), "README.md's table of rejections lacks `{json}`");
    }
    for effect in effect_samples() {
        let json = serde_json::to_value(&effect).unwrap();
        let json = match &json {
            serde_json::Value::String(name) => name.clone(),
            serde_json::Value::Object(fields) => fields.keys().next().unwrap().clone(),
            other => panic!("{} is {other} in JSON", effect.name()),
        };
        assert!(readme.contains(&format!("| `{json}` |")), "README.md's table of effects lacks `{json}`");
    }

    // Test vectors.
    let vectors = [("res-a", 7), ("w1", 5), ("@ips", 7)];
    for (token, partition) in vectors {
        assert_eq!(partition_of(token, 8), partition, "partition of {token:?} among 8");
    }
    let listed = vectors.map(|(token, partition)| format!("`{token}` -> {partition}")).join(", ");
    assert!(readme.contains(&format!("Test vectors with P = 8: {listed}.")), "README.md must list: {listed}");
    let ids = [
        "019b76da-9478-7111-9111-111111111111",
        "019b71b4-4c03-7343-8343-434343434343",
        "019b76a3-b980-7222-a222-222222222222",
    ];
    let parsed: Vec<ResourceId> = ids.iter().map(|id| id.parse().unwrap()).collect();
    let digest = HandleDigest::of(&parsed).to_string();
    assert_eq!(digest, "91d2303b93c2f9d3");
    let sentence = format!("`{}`, `{}`,\n`{}` have the digest `{digest}`", ids[0], ids[1], ids[2]);
    assert!(readme.contains(&sentence), "README.md must give the digest test vector: {sentence}");
}
