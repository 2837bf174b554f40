//! The JSON form is decoded strictly, and says where and why it refused a command: producers in other languages
//! write it by hand, so a typo, a repeated key or another spelling of an id must be an error that names the field.
//!
//! Every bad input is a valid command's JSON (from `codec::command_to_json`) edited as text, the way a producer's
//! mistake would look. `edit` insists that the text it replaces occurs exactly once, so no test passes on an edit
//! that did not happen.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use leasehold_schemas::codec::{self, CodecError, CodecErrorKind};
use leasehold_schemas::command::{
    Acquire, Adopt, Allocate, BindClaim, Cascade, Claim, Command, ConfirmLoss, CreateTimeout, DefinePool, ExpireLease,
    ExpirePause, FailureKind, Free, HandleDigest, HealthResult, Heartbeat, MarkGone, MarkStalled, Orphan, ParentState,
    Pause, Register, Release, ReleaseLease, Renew, ReportCreated, ReportFailure, ReportFailureByOperator,
    RequestHealthCheck, ResyncChunk, RetireAgent, SetPartitionSettings, SyncReport, TickPool, Unpause, Update,
    WaitTimeout,
};
use leasehold_schemas::command::{
    BindPlacement, CancelPlacement, CancelReservation, ClosePlacement, CommitPlacement, DrainAgent, DrainRelease,
    Place, PlacementStrategy, Reserve, Unplaceable,
};
use leasehold_schemas::command::{
    CordonAgent, DriverStatus, GarbageReport, ReportDestroyed, UncordonAgent, UnretireAgent,
};
use leasehold_schemas::ids::{
    AgentName, CommandId, Issuer, Key, LeaseId, Millis, PoolName, Position, ResourceId, ResourceRef, Source, Timestamp,
};
use leasehold_schemas::pool::{PoolKind, PoolValue};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::{Envelope, Uuid};

const T0: u64 = 1_767_225_600_000;

fn agent() -> AgentName {
    AgentName::new("w1").unwrap()
}

fn pool() -> PoolName {
    PoolName::new("ips").unwrap()
}

fn resource() -> ResourceId {
    ResourceId::from_parts(T0, [0x11; 10])
}

fn parent() -> ResourceRef {
    ResourceRef::new(AgentName::new("w2").unwrap(), ResourceId::from_parts(T0 - 1000, [0x22; 10]))
}

fn lease() -> LeaseId {
    LeaseId::from_parts(T0 + 1, [0x33; 10])
}

fn source() -> Source {
    Source { partition: 3, position: Position(40) }
}

/// Not a v7 id: `incarnation`, `correlation_id`, `causation_id`, `lo` and `hi` may be any UUID.
fn any_uuid(last: u8) -> Uuid {
    Uuid::from_u128(0x0190_a0b0_0000_4000_8000_0000_0000_0000 | u128::from(last))
}

fn some_if<T>(full: bool, value: T) -> Option<T> {
    full.then_some(value)
}

/// A placement, every optional field set (`full`) or none.
fn place(full: bool) -> Place {
    Place {
        resource: resource(),
        kind: "container".to_owned(),
        capacity: 2,
        attributes: if full { BTreeMap::from([("image".to_owned(), "alpine".to_owned())]) } else { BTreeMap::new() },
        parent: some_if(full, parent()),
        pools: if full { vec![pool()] } else { vec![] },
        wait: some_if(full, Millis::from_secs(30)),
        select: if full { BTreeMap::from([("zone".to_owned(), "a".to_owned())]) } else { BTreeMap::new() },
        strategy: if full { PlacementStrategy::Pack } else { PlacementStrategy::Spread },
    }
}

/// One body per command type, every optional field set (`full`) or none (`!full`).
fn body(type_name: &str, full: bool) -> Command {
    let attributes = if full { BTreeMap::from([("image".to_owned(), "alpine".to_owned())]) } else { BTreeMap::new() };
    let ids = |n: u8| if full { vec![ResourceId::from_parts(T0 + u64::from(n), [n; 10])] } else { vec![] };
    let holder = ResourceRef::new(agent(), resource());
    match type_name {
        "op.allocate" => Allocate {
            agent: agent(),
            resource: resource(),
            kind: "container".to_owned(),
            capacity: 2,
            attributes,
            parent: some_if(full, parent()),
            pools: if full { vec![pool()] } else { vec![] },
            wait: some_if(full, Millis::from_secs(30)),
        }
        .into(),
        "op.acquire" => Acquire {
            agent: agent(),
            resource: resource(),
            lease: lease(),
            holder: "build-7".to_owned(),
            ttl: some_if(full, Millis::from_mins(5)),
            wait_timeout: some_if(full, Millis::from_secs(30)),
            priority: if full { 3 } else { 0 },
        }
        .into(),
        "op.renew" => {
            Renew { agent: agent(), lease: lease(), token: Position(9), ttl: some_if(full, Millis(1500)) }.into()
        }
        "op.release-lease" => ReleaseLease { agent: agent(), lease: lease(), token: some_if(full, Position(9)) }.into(),
        "op.release" => {
            Release { agent: agent(), resource: resource(), reason: some_if(full, "done".to_owned()) }.into()
        }
        "op.pause" => Pause {
            agent: agent(),
            resource: resource(),
            reason: some_if(full, "maintenance".to_owned()),
            until: some_if(full, Timestamp(T0 + 60_000)),
        }
        .into(),
        "op.unpause" => Unpause { agent: agent(), resource: resource() }.into(),
        "op.update" => Update {
            agent: agent(),
            resource: resource(),
            set: attributes,
            remove: if full { vec!["old".to_owned()] } else { vec![] },
            capacity: some_if(full, 4),
            max_lease: some_if(full, Millis::from_mins(30)),
        }
        .into(),
        "op.report-failure" => {
            ReportFailureByOperator { agent: agent(), resource: resource(), detail: "no answer".to_owned() }.into()
        }
        "op.retire-agent" => RetireAgent { agent: agent(), only_if_unleased: full }.into(),
        "op.confirm-loss" => ConfirmLoss { agent: agent() }.into(),
        "op.update-pool" => leasehold_schemas::command::UpdatePool {
            pool: pool(),
            kind: PoolKind::Slots { count: 32 },
            cooldown: some_if(full, Millis::from_secs(5)),
            orphans: some_if(full, leasehold_schemas::pool::OrphanPolicy::Hold),
        }
        .into(),
        "op.delete-pool" => leasehold_schemas::command::DeletePool { pool: pool() }.into(),
        "op.define-pool" => DefinePool {
            pool: pool(),
            kind: PoolKind::Ipv4 {
                network: Ipv4Addr::new(10, 20, 0, 0),
                prefix_len: 24,
                exclude: vec![Ipv4Addr::new(10, 20, 0, 1)],
            },
            cooldown: some_if(full, Millis::from_secs(60)),
            orphans: if full { leasehold_schemas::pool::OrphanPolicy::Hold } else { Default::default() },
        }
        .into(),
        "op.set-partition-settings" => SetPartitionSettings {
            key: Key::Pool(pool()),
            partition: 7,
            outcome_horizon: some_if(full, Millis::from_hours(12)),
            policy: full.then(leasehold_schemas::settings::ClusterPolicy::default),
            if_no_policy: full,
            gc: some_if(full, leasehold_schemas::settings::GcMode::DryRun),
            max_priority: full.then(|| BTreeMap::from([("ci:".to_owned(), 4)])),
        }
        .into(),
        "agent.register" => {
            Register { wiped: full, settings: full.then(AgentSettings::default), ..Register::new(agent(), any_uuid(1)) }
                .into()
        }
        "agent.heartbeat" => Heartbeat { agent: agent(), epoch: Position(4) }.into(),
        "agent.report-created" => ReportCreated {
            agent: agent(),
            epoch: Position(4),
            obs: 12,
            resource: resource(),
            native_id: some_if(full, "c0ffee".to_owned()),
        }
        .into(),
        "agent.sync" => {
            let mut report = SyncReport::new(agent(), Position(4), 13, Position(30));
            report.created = ids(1);
            report.missing = ids(2);
            report.destroyed = ids(3);
            report.in_flight = ids(4);
            report.count = 7;
            report.digest = HandleDigest(0x0123_4567_89ab_cdef);
            report.into()
        }
        "agent.resync-chunk" => ResyncChunk {
            agent: agent(),
            epoch: Position(4),
            obs: 14,
            watermark: Position(30),
            lo: any_uuid(0),
            hi: some_if(full, any_uuid(0xff)),
            held: ids(5),
            in_flight: ids(6),
        }
        .into(),
        "agent.report-failure" => ReportFailure {
            agent: agent(),
            epoch: Position(4),
            obs: 15,
            resource: resource(),
            failure: FailureKind::Unhealthy,
            detail: "oom".to_owned(),
        }
        .into(),
        "agent.health-result" => HealthResult {
            agent: agent(),
            epoch: Position(4),
            obs: 16,
            resource: resource(),
            request: Position(9),
            healthy: true,
            detail: "ok".to_owned(),
        }
        .into(),
        "sys.expire-lease" => ExpireLease { agent: agent(), lease: lease() }.into(),
        "sys.wait-timeout" => WaitTimeout { agent: agent(), lease: lease() }.into(),
        "sys.create-timeout" => CreateTimeout { agent: agent(), resource: resource() }.into(),
        "sys.expire-pause" => ExpirePause { agent: agent(), resource: resource() }.into(),
        "sys.mark-stalled" => MarkStalled { agent: agent() }.into(),
        "sys.mark-gone" => MarkGone { agent: agent() }.into(),
        "sys.orphan" => Orphan { agent: agent(), resource: resource() }.into(),
        "sys.request-health-check" => RequestHealthCheck { agent: agent(), resource: resource() }.into(),
        "sys.claim" => Claim { pool: pool(), holder, source: source() }.into(),
        "sys.bind-claim" => BindClaim {
            holder,
            pool: pool(),
            value: PoolValue::Ipv4(Ipv4Addr::new(10, 20, 0, 7)),
            token: Position(41),
            source: source(),
            wanted: Source { partition: 5, position: Position(2) },
            definition: None,
            orphans: if full { leasehold_schemas::pool::OrphanPolicy::Hold } else { Default::default() },
        }
        .into(),
        "sys.free" => Free {
            pool: pool(),
            holder,
            token: some_if(full, Position(41)),
            source: source(),
            cause: if full {
                leasehold_schemas::outcome::FreeCause::OrphanFreed {
                    by: Issuer::new("op:alice@example").unwrap(),
                    reason: "machine scrapped".to_owned(),
                }
            } else {
                Default::default()
            },
        }
        .into(),
        "sys.tick-pool" => TickPool { pool: pool() }.into(),
        "sys.cascade" => Cascade {
            child: holder,
            parent: parent(),
            parent_state: ParentState::Suspect,
            source: source(),
            answers: some_if(full, Source { partition: 5, position: Position(3) }),
        }
        .into(),
        "sys.adopt" => Adopt { parent: parent(), child: holder, source: source() }.into(),
        "op.unretire-agent" => UnretireAgent { agent: agent() }.into(),
        "op.cordon-agent" => CordonAgent { agent: agent(), reason: full.then(|| "kernel upgrade".to_owned()) }.into(),
        "op.uncordon-agent" => UncordonAgent { agent: agent() }.into(),
        "agent.report-garbage" => GarbageReport {
            agent: agent(),
            epoch: Position(3),
            obs: 9,
            watermark: Position(30),
            handles: ids(8),
            dry_run: full,
        }
        .into(),
        "agent.report-destroyed" => {
            ReportDestroyed { agent: agent(), epoch: Position(3), obs: 9, resource: resource(), ordered: Position(12) }
                .into()
        }
        "agent.driver-status" => DriverStatus {
            agent: agent(),
            epoch: Position(3),
            obs: 9,
            available: !full,
            detail: if full { "root not mounted".to_owned() } else { String::new() },
        }
        .into(),
        "op.place" => place(full).into(),
        "op.cancel-placement" => {
            CancelPlacement { resource: resource(), reason: full.then(|| "not needed".to_owned()) }.into()
        }
        "op.drain-agent" => DrainAgent {
            agent: agent(),
            deadline: some_if(full, Millis::from_hours(2)),
            grace: some_if(full, Millis::from_mins(10)),
            reason: full.then(|| "kernel upgrade".to_owned()),
        }
        .into(),
        "sys.reserve" => Reserve {
            agent: agent(),
            resource: resource(),
            kind: "container".to_owned(),
            select: if full { BTreeMap::from([("zone".to_owned(), "a".to_owned())]) } else { BTreeMap::new() },
            source: source(),
        }
        .into(),
        "sys.bind-placement" => BindPlacement {
            resource: resource(),
            agent: agent(),
            token: Position(12),
            used: 3,
            capacity: 50,
            source: source(),
        }
        .into(),
        "sys.commit-placement" => CommitPlacement {
            allocation: place(full).allocation_on(agent()),
            token: Position(12),
            source: source(),
            principal: some_if(full, Issuer::new("ci:team-a").unwrap()),
        }
        .into(),
        "sys.cancel-reservation" => {
            CancelReservation { agent: agent(), resource: resource(), token: Position(12), source: source() }.into()
        }
        "sys.unplaceable" => Unplaceable { resource: resource(), why: "zone=a: 4 agents full".to_owned() }.into(),
        "sys.drain-release" => DrainRelease { agent: agent(), resource: resource() }.into(),
        "sys.close-placement" => {
            ClosePlacement { resource: resource(), agent: agent(), token: Position(12), source: source() }.into()
        }
        "op.free-orphan" => leasehold_schemas::command::FreeOrphan {
            agent: agent(),
            resource: resource(),
            pool: some_if(full, pool()),
            reason: "machine scrapped".to_owned(),
        }
        .into(),
        "op.set-quota" => leasehold_schemas::command::SetQuota {
            key: leasehold_schemas::subjects::settings_key(0, 1),
            partition: 0,
            quota: leasehold_schemas::ids::QuotaName::new("team-a").unwrap(),
            max: if full { BTreeMap::from([("container".to_owned(), 2)]) } else { BTreeMap::new() },
            principals: if full { vec![Issuer::new("ci:team-a").unwrap()] } else { vec![] },
        }
        .into(),
        "sys.over-quota" => leasehold_schemas::command::OverQuota {
            holder: ResourceRef::new(agent(), resource()),
            pool: PoolName::new("quota-team-a-container").unwrap(),
            source: source(),
            held: 2,
            holders: if full { vec![ResourceRef::new(agent(), resource())] } else { vec![] },
        }
        .into(),
        other => panic!("no sample for {other}: add one here"),
    }
}

fn command_id() -> CommandId {
    CommandId::from_parts(T0 + 5, [0xc0; 10])
}

fn envelope(type_name: &str, full: bool) -> Envelope {
    let mut envelope =
        Envelope::new(command_id(), Issuer::new("op:alice@example").unwrap(), Timestamp(T0), body(type_name, full));
    if full {
        envelope.correlation_id = Some(any_uuid(0xc1));
        envelope.causation_id = Some(any_uuid(0xc2));
    }
    envelope
}

fn json(type_name: &str) -> String {
    codec::command_to_json(&envelope(type_name, true)).unwrap()
}

/// `text` with `from` replaced by `to`; `from` must occur exactly once.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once in {text}");
    text.replacen(from, to, 1)
}

/// The error of decoding `text` (through `decode_command`, and `command_from_json` must agree).
fn refused(text: &str) -> CodecError {
    let err = codec::decode_command(text.as_bytes()).expect_err(text);
    assert_eq!(codec::command_from_json(text.as_bytes()).unwrap_err(), err, "{text}");
    err
}

/// Asserts the kind, and that the message holds every one of `parts`.
fn assert_refused(text: &str, kind: CodecErrorKind, parts: &[&str]) {
    let err = refused(text);
    assert_eq!(err.kind(), kind, "{err}");
    let message = err.to_string();
    for part in parts {
        assert!(message.contains(part), "{part:?} is not in the message {message:?}");
    }
}

#[test]
fn every_command_round_trips_in_both_forms() {
    for type_name in Command::TYPE_NAMES {
        for full in [true, false] {
            let envelope = envelope(type_name, full);
            assert_eq!(envelope.type_name(), *type_name);
            let bytes = codec::encode_command(&envelope).unwrap();
            assert_eq!(codec::decode_command(&bytes).unwrap(), envelope, "{type_name} (bincode)");
            let text = codec::command_to_json(&envelope).unwrap();
            assert_eq!(codec::decode_command(text.as_bytes()).unwrap(), envelope, "{type_name} (JSON)");
            // A trailing newline is whitespace after the object, which JSON allows.
            let with_newline = format!("{text}\n");
            assert_eq!(codec::decode_command(with_newline.as_bytes()).unwrap(), envelope, "{type_name}");
        }
    }
}

/// What the README promises: a field of `Option` type may be `null` or left out, and the lists and maps that have
/// a default may be left out, in the envelope and in every body.
#[test]
fn optional_fields_may_be_left_out() {
    for type_name in Command::TYPE_NAMES {
        let envelope = envelope(type_name, false);
        let mut value: serde_json::Value = serde_json::from_str(&codec::command_to_json(&envelope).unwrap()).unwrap();
        let is_empty = |v: &serde_json::Value| {
            v.is_null() || v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty())
        };
        let object = value.as_object_mut().unwrap();
        object.retain(|_, v| !v.is_null());
        object["body"].as_object_mut().unwrap().retain(|_, v| !is_empty(v));
        // A `serde_json::Value` sorts keys, so `body` now comes before `type`: the order must not matter either.
        let text = serde_json::to_string(&value).unwrap();
        assert!(text.find(r#""body""#).unwrap() < text.find(r#""type""#).unwrap(), "{text}");
        assert_eq!(codec::decode_command(text.as_bytes()).unwrap(), envelope, "{text}");
    }
}

#[test]
fn a_wrong_type_names_the_field_and_the_value() {
    let text = edit(&json("op.allocate"), r#""capacity":2"#, r#""capacity":"2""#);
    assert_refused(&text, CodecErrorKind::Malformed, &[r#"body.capacity: invalid type: string "2", expected u32"#]);
    // Numbers are integers: no sign, no fraction, no exponent (the README says so).
    for (written, shown) in [("-2", "-2"), ("2.0", "2.0"), ("2e0", "2.0"), ("4294967296", "4294967296")] {
        let text = edit(&json("op.allocate"), r#""capacity":2"#, &format!(r#""capacity":{written}"#));
        assert_refused(&text, CodecErrorKind::Malformed, &["body.capacity:", shown]);
    }
    let text = edit(&json("op.allocate"), &format!(r#""issued_at":{T0}"#), r#""issued_at":"now""#);
    assert_refused(&text, CodecErrorKind::Malformed, &[r#"issued_at: invalid type: string "now""#]);
    let text = edit(&json("op.define-pool"), r#""prefix_len":24"#, r#""prefix_len":300"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.kind.ipv4.prefix_len:", "300"]);
}

#[test]
fn a_missing_field_is_named() {
    let text = edit(&json("op.allocate"), r#""capacity":2,"#, "");
    assert_refused(&text, CodecErrorKind::Malformed, &["body: missing field `capacity`"]);
    let text = edit(&json("op.allocate"), r#""issuer":"op:alice@example","#, "");
    assert_refused(&text, CodecErrorKind::Malformed, &["missing field `issuer`"]);
}

#[test]
fn unknown_fields_are_refused_everywhere() {
    let text = edit(&json("op.allocate"), r#""capacity":2"#, r#""capacity":2,"colour":"red""#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.colour: unknown field `colour`"]);
    let text = edit(&json("agent.register"), r#""max_loss_min":5"#, r#""max_loss_min":5,"max_loss":9"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.settings.max_loss: unknown field `max_loss`"]);
    let text = edit(&json("op.set-partition-settings"), r#""outcome_horizon":"#, r#""horizon":1,"outcome_horizon":"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.horizon: unknown field `horizon`"]);
    let text = edit(&json("op.set-partition-settings"), r#""claim_cooldown":"#, r#""cooldown":1,"claim_cooldown":"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.policy.cooldown: unknown field `cooldown`"]);
    let text = edit(&json("op.define-pool"), r#""prefix_len":24"#, r#""prefix_len":24,"gateway":"10.20.0.1""#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.kind.ipv4.gateway: unknown field `gateway`"]);
    let text = edit(&json("sys.claim"), r#""partition":3"#, r#""partition":3,"stream":"x""#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.source.stream: unknown field `stream`"]);
    let text = edit(&json("op.allocate"), r#""schema_version":2"#, r#""schema_version":2,"priority":2"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["priority: unknown field `priority`"]);
}

#[test]
fn a_duplicate_key_is_refused() {
    let text = edit(&json("op.allocate"), r#""capacity":2"#, r#""capacity":2,"capacity":3"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body: duplicate field `capacity`"]);
    let text = edit(&json("op.allocate"), r#""issuer":"op:alice@example""#, r#""issuer":"a","issuer":"b""#);
    assert_refused(&text, CodecErrorKind::Malformed, &["duplicate field `issuer`"]);
    let text = edit(&json("op.allocate"), r#""body":{"#, r#""body":{},"body":{"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["duplicate field `body`"]);
    let text = edit(&json("op.allocate"), r#""image":"alpine""#, r#""image":"alpine","image":"busybox""#);
    assert_refused(&text, CodecErrorKind::Malformed, &[r#"body.attributes: duplicate key "image""#]);
    let text = edit(&json("op.update"), r#""image":"alpine""#, r#""image":"alpine","image":"busybox""#);
    assert_refused(&text, CodecErrorKind::Malformed, &[r#"body.set: duplicate key "image""#]);
    let text = edit(&json("agent.register"), r#""max_loss_min":5"#, r#""max_loss_min":5,"max_loss_min":6"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.settings: duplicate field `max_loss_min`"]);
}

/// The spellings of `canonical` that the `uuid` crate accepts and leasehold does not.
fn other_spellings(canonical: &str) -> [String; 4] {
    [canonical.to_uppercase(), format!("{{{canonical}}}"), format!("urn:uuid:{canonical}"), canonical.replace('-', "")]
}

/// Each non-canonical spelling of `canonical` in place of it in `text` is refused at `path`, with the fix.
fn assert_one_spelling(text: &str, canonical: &str, quoted_prefix: &str, path: &str) {
    for other in other_spellings(canonical) {
        let bad = edit(text, &format!("\"{quoted_prefix}{canonical}\""), &format!("\"{quoted_prefix}{other}\""));
        let expected = format!(
            "{path}: {{what}} \"{other}\" is not in canonical form: write it lower-case and hyphenated, like {canonical}"
        );
        let err = refused(&bad);
        assert_eq!(err.kind(), CodecErrorKind::Malformed, "{err}");
        let message = err.to_string();
        let (before, after) = expected.split_once("{what}").unwrap();
        assert!(message.contains(before) && message.contains(after), "expected {expected:?} in {message:?}");
    }
}

#[test]
fn ids_have_one_spelling() {
    let resource = resource().to_string();
    let parent = parent().resource.to_string();
    assert_one_spelling(&json("op.allocate"), &resource, "", "body.resource");
    assert_one_spelling(&json("op.allocate"), &parent, "w2.", "body.parent");
    assert_one_spelling(&json("op.acquire"), &lease().to_string(), "", "body.lease");
    assert_one_spelling(&json("op.allocate"), &command_id().to_string(), "", "command_id");
    assert_one_spelling(&json("op.allocate"), &any_uuid(0xc1).to_string(), "", "correlation_id");
    assert_one_spelling(&json("op.allocate"), &any_uuid(0xc2).to_string(), "", "causation_id");
    assert_one_spelling(&json("agent.register"), &any_uuid(1).to_string(), "", "body.incarnation");
    assert_one_spelling(&json("agent.resync-chunk"), &any_uuid(0).to_string(), "", "body.lo");
    assert_one_spelling(&json("agent.resync-chunk"), &any_uuid(0xff).to_string(), "", "body.hi");
    let held = ResourceId::from_parts(T0 + 5, [5; 10]).to_string();
    assert_one_spelling(&json("agent.resync-chunk"), &held, "", "body.held[0]");

    // The message says which id it was.
    let text = edit(&json("op.allocate"), &resource, &resource.to_uppercase());
    let upper = resource.to_uppercase();
    assert_refused(&text, CodecErrorKind::Malformed, &[&format!(r#"body.resource: resource id "{upper}""#)]);
    let text = edit(&json("op.allocate"), &command_id().to_string(), &command_id().to_string().to_uppercase());
    assert_refused(&text, CodecErrorKind::Malformed, &["command_id: command id"]);
}

#[test]
fn json_starts_with_a_brace() {
    let text = json("agent.heartbeat");
    let bom = [&[0xef, 0xbb, 0xbf][..], text.as_bytes()].concat();
    let mut bad: Vec<Vec<u8>> = [" ", "\n", "\t", "\r\n"].iter().map(|ws| format!("{ws}{text}").into_bytes()).collect();
    bad.push(bom);
    for bytes in bad {
        for result in [codec::decode_command(&bytes), codec::command_from_json(&bytes)] {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), CodecErrorKind::UnknownFormat, "{err}");
            let message = err.to_string();
            assert!(
                message.contains("a JSON command must start with '{': no leading whitespace or byte-order mark"),
                "{message}"
            );
        }
    }
    let bincode = codec::encode_command(&envelope("agent.heartbeat", true)).unwrap();
    let err = codec::command_from_json(&bincode).unwrap_err();
    assert_eq!(err.kind(), CodecErrorKind::UnknownFormat);
    assert_eq!(err.to_string(), "a JSON command must start with '{', not with the byte 0x01");
}

#[test]
fn a_syntax_error_keeps_its_position() {
    let text = edit(&json("agent.heartbeat"), r#""epoch":4"#, r#""epoch":4,"#);
    let err = refused(&text);
    assert_eq!(err.kind(), CodecErrorKind::Malformed);
    assert!(err.to_string().contains("at line 1 column"), "{err}");
}

#[test]
fn objects_are_never_read_from_arrays() {
    // serde would read a struct from an array of its fields in order, which no field name checks: an `op.acquire`
    // body as an array with `ttl` and `wait_timeout` swapped would be another lease. Refused everywhere.
    let heartbeat = json("agent.heartbeat");
    let text = edit(&heartbeat, r#""body":{"agent":"w1","epoch":4}"#, r#""body":["w1",4]"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body: an array where an object"]);
    let text = edit(&json("sys.claim"), r#""source":{"partition":3,"position":40}"#, r#""source":[3,40]"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.source: an array where an object"]);
    let register = json("agent.register");
    let settings = register.split(r#""settings":"#).nth(1).unwrap().split('}').next().unwrap().to_owned() + "}";
    let text = edit(&register, &settings, "[5,50,600000,600000,60000,86400000]");
    assert_refused(&text, CodecErrorKind::Malformed, &["body.settings: an array"]);
    let text = edit(
        &json("op.define-pool"),
        r#""ipv4":{"network":"10.20.0.0","prefix_len":24,"exclude":["10.20.0.1"]}"#,
        r#""ipv4":["10.20.0.0",24,["10.20.0.1"]]"#,
    );
    assert_refused(&text, CodecErrorKind::Malformed, &["body.kind.ipv4: an array"]);
    // Lists hold plain values.
    let text = edit(&json("op.allocate"), r#""pools":["ips"]"#, r#""pools":[["ips"]]"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.pools[0]: a list of pools holds plain values"]);
}

#[test]
fn enums_without_data_are_plain_strings() {
    let text = edit(&json("sys.cascade"), r#""parent_state":"suspect""#, r#""parent_state":{"suspect":null}"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.parent_state:"]);
    let text = edit(&json("agent.report-failure"), r#""failure":"unhealthy""#, r#""failure":{"unhealthy":null}"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.failure:"]);
    let text = edit(&json("op.allocate"), r#""class":"op""#, r#""class":{"op":null}"#);
    assert_refused(&text, CodecErrorKind::Malformed, &["class:"]);
    let text = edit(&json("sys.cascade"), r#""parent_state":"suspect""#, r#""parent_state":"sick""#);
    assert_refused(&text, CodecErrorKind::Malformed, &["body.parent_state:", "sick"]);
}

#[test]
fn a_json_form_over_the_limit_is_refused_when_written() {
    // JSON is larger than bincode: 200,000 control characters are 200 KB in bincode, 1.2 MB as JSON escapes.
    let detail: String = std::iter::repeat_n('\u{1}', 200_000).collect();
    let envelope = Envelope::new(
        command_id(),
        Issuer::new("op:alice@example").unwrap(),
        Timestamp(T0),
        ReportFailureByOperator { agent: agent(), resource: resource(), detail },
    );
    assert!(codec::encode_command(&envelope).is_ok());
    assert_eq!(codec::command_to_json(&envelope).unwrap_err().kind(), CodecErrorKind::TooLarge);
}

#[test]
fn the_bincode_form_has_one_layout() {
    let envelope = envelope("agent.heartbeat", false);
    let bytes = codec::encode_command(&envelope).unwrap();
    assert_eq!(codec::decode_command(&bytes).unwrap(), envelope);
    // The schema version (1) written as a three-byte varint: the same value, another layout.
    let mut longer = vec![bytes[0], 0xfb, 0x01, 0x00];
    longer.extend_from_slice(&bytes[2..]);
    let err = codec::decode_command(&longer).unwrap_err();
    assert_eq!(err.kind(), CodecErrorKind::Malformed, "{err}");
    assert!(err.to_string().contains("canonical bincode form"), "{err}");
    // A length that lies (larger than the message) is a corrupt message, not a large one.
    let mut lying = bytes.clone();
    let at = lying.iter().position(|b| *b == b"agent.heartbeat".len() as u8).unwrap();
    lying.splice(at..at + 1, [0xfc, 0x00, 0x00, 0x00, 0x80]);
    let err = codec::decode_command(&lying).unwrap_err();
    assert_eq!(err.kind(), CodecErrorKind::Malformed, "{err}");
}

/// A command stamped with a schema version older than the one that expresses it (a type, a field or a variant added
/// later) is refused in both forms alike: an older leasehold reading it would refuse it as garbage, not as newer, and
/// its producer said a version it does not speak. Those that need nothing newer read the same whatever their stamp.
#[test]
fn a_command_stamped_older_than_what_it_uses_is_refused_in_both_forms() {
    let mut needs_newer = 0;
    for type_name in Command::TYPE_NAMES {
        let envelope = envelope(type_name, true);
        let text = codec::command_to_json(&envelope).unwrap();
        let written_in = envelope.schema_version;
        let stamped_one = text.replacen(&format!(r#""schema_version":{written_in}"#), r#""schema_version":1"#, 1);
        let mut bytes = codec::encode_command(&envelope).unwrap();
        bytes[1] = 1;
        if written_in == 1 {
            assert_eq!(codec::decode_command(stamped_one.as_bytes()).unwrap(), envelope, "{type_name} (JSON)");
            assert_eq!(codec::decode_command(&bytes).unwrap(), envelope, "{type_name} (bincode)");
            continue;
        }
        needs_newer += 1;
        // In bincode a version 1 layout reads short of a field added since (trailing bytes) or names a type or
        // variant it does not have: refused either way.
        assert!(codec::decode_command(&bytes).is_err(), "{type_name} (bincode) stamped version 1 decodes");
        let err = codec::decode_command(stamped_one.as_bytes()).expect_err(&stamped_one);
        assert_eq!(err.kind(), CodecErrorKind::Malformed, "{type_name} (JSON): {err}");
        let needs = format!("needs schema version {written_in}");
        assert!(err.to_string().contains(&needs), "{type_name} (JSON): {err}");
    }
    assert!(needs_newer >= 6, "the commands added in versions 2 and 3 are among the samples");
}
