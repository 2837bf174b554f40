//! Bad payloads on command subjects: each lands in the dead letters with its reason and raw bytes, the partition
//! keeps moving (the good commands around them are decided), and nothing panics. On the embedded log; the same
//! worker runs on JetStream in the integration tests.

use std::time::Duration;

use bytes::Bytes;
use leasehold_log::embedded::Embedded;
use leasehold_log::{Log, OutcomeFilter};
use leasehold_schemas::command::{Heartbeat, Register};
use leasehold_schemas::ids::{AgentName, CommandId, Issuer, Position, Timestamp};
use leasehold_schemas::settings::AgentSettings;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of};
use leasehold_schemas::{Envelope, Uuid, codec};
use leasehold_worker::{WorkerConfig, run};
use tokio_util::sync::CancellationToken;

fn register(n: u8) -> Envelope {
    let agent = AgentName::new(format!("w{n}")).unwrap();
    let body =
        Register { settings: Some(AgentSettings::default()), ..Register::new(agent.clone(), Uuid::from_u128(7)) };
    Envelope::new(
        CommandId::from_parts(1_800_000_000_000, [n; 10]),
        Issuer::new(agent.as_str()).unwrap(),
        Timestamp(1_800_000_000_000),
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_payloads_are_dead_lettered_and_the_partition_moves_on() {
    let log = Embedded::in_memory(1, leasehold_log::embedded::system_clock()).unwrap();
    let good = register(1);
    let bytes = codec::encode_command(&good).unwrap();
    assert_eq!(bytes[1], 1, "the schema version is the second byte");
    let mut newer = bytes.clone();
    newer[1] = 99;
    let mut trailing = bytes.clone();
    trailing.push(0);
    let mut oversized = bytes.clone();
    oversized.resize(codec::MAX_COMMAND_BYTES + 1, 0);
    let heartbeat = Envelope::new(
        CommandId::from_parts(1_800_000_000_000, [3; 10]),
        Issuer::new("w1").unwrap(),
        Timestamp(1_800_000_000_000),
        Heartbeat { agent: AgentName::new("w1").unwrap(), epoch: Position(1) },
    );
    let bad: Vec<(&str, String, Vec<u8>)> = vec![
        ("undecodable", "lh.in.agent.w1._".to_owned(), b"\x01\xff\xff\xff\xff\xff".to_vec()),
        ("undecodable", "lh.in.agent.w1._".to_owned(), bytes[..bytes.len() / 2].to_vec()),
        ("trailing bytes", "lh.in.agent.w1._".to_owned(), trailing),
        ("oversized", "lh.in.agent.w1._".to_owned(), oversized),
        ("newer leasehold", "lh.in.agent.w1._".to_owned(), newer),
        ("does not fit", "lh.in.agent.w2._".to_owned(), codec::encode_command(&heartbeat).unwrap()),
        ("unknown format", "lh.in.agent.w1._".to_owned(), b"garbage".to_vec()),
        ("empty", "lh.in.agent.w1._".to_owned(), Vec::new()),
    ];
    let mut bad_seqs = Vec::new();
    for (i, (_, subject, payload)) in bad.iter().enumerate() {
        let published = log.publish_command(subject, &format!("bad-{i}"), Bytes::from(payload.clone())).await.unwrap();
        bad_seqs.push(published.seq);
        // A good command after each bad one.
        let good = register(10 + i as u8);
        log.publish_command(
            &ingress_subject_of(&good.body),
            &good.command_id.to_string(),
            codec::encode_command(&good).unwrap().into(),
        )
        .await
        .unwrap();
    }
    assert_eq!(partition_of("w1", 1), 0);
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(run(log.clone(), WorkerConfig::new("worker"), shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let outcomes = log.read_outcomes(&OutcomeFilter::Partition(0), 1, 100).await.unwrap();
        if outcomes.len() == bad.len() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {} outcomes in 30 s", outcomes.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = worker.await.unwrap();
    assert!(report.stopped.is_empty(), "{:?}", report.stopped);
    assert_eq!(report.counts.dead_lettered, bad.len() as u64);
    let letters = log.read_dead_letters(1, 100).await.unwrap();
    assert_eq!(letters.len(), bad.len());
    for ((_, letter), ((what, subject, payload), seq)) in letters.iter().zip(bad.iter().zip(&bad_seqs)) {
        assert_eq!(letter.source_seq, *seq);
        assert!(letter.reason.contains(what), "{what}: {}", letter.reason);
        assert_eq!(letter.source_subject, subject.replace("lh.in.", "lh.cmd.0."));
        assert_eq!(letter.payload.as_ref(), payload.as_slice(), "the raw bytes are kept");
        assert_eq!(letter.subject(), subject.replace("lh.in.", "lh.dlq.0."));
    }
}

/// A command of a schema an operator declared as rolling out is not dead-lettered: the partition stops at it, on
/// record, for a newer worker to decide it. Without the declaration the same command is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_a_schema_rolling_out_stops_the_partition_instead() {
    let next = leasehold_schemas::SCHEMA_VERSION + 1;
    for declared in [Some(next), None] {
        let log = Embedded::in_memory(1, leasehold_log::embedded::system_clock()).unwrap();
        let first = register(1);
        let mut newer = codec::encode_command(&register(2)).unwrap();
        newer[1] = u8::try_from(next).unwrap();
        for (envelope, payload) in [(&first, codec::encode_command(&first).unwrap()), (&register(2), newer)] {
            let subject = ingress_subject_of(&envelope.body);
            log.publish_command(&subject, &envelope.command_id.to_string(), Bytes::from(payload)).await.unwrap();
        }
        let mut config = WorkerConfig::new("worker");
        config.writer.rolling_out_schema = declared;
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(run(log.clone(), config, shutdown.clone()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let decided = log.read_outcomes(&OutcomeFilter::Partition(0), 1, 10).await.unwrap().len();
            let dead = log.read_dead_letters(1, 10).await.unwrap().len();
            // Declared: the writer reached the newer command and gave the partition up, stopped.
            let reached = match declared {
                Some(_) => decided == 1 && !log.is_served(0).await.unwrap(),
                None => decided == 1 && dead == 1,
            };
            if reached {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{declared:?}: {decided} outcomes, {dead} dead letters");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        let report = worker.await.unwrap();
        match declared {
            Some(_) => {
                let stopped = report.stopped.get(&0).map(ToString::to_string).unwrap_or_default();
                assert!(stopped.contains(&format!("schema version {next}, which is rolling out")), "{stopped:?}");
                assert!(log.read_dead_letters(1, 10).await.unwrap().is_empty());
            }
            None => assert!(report.stopped.is_empty(), "{:?}", report.stopped),
        }
    }
}

/// A producer bound to a principal publishes on `lh.in.op@<principal>...`, the only subjects its NATS user may use:
/// the writer takes what it stores there only as that principal's own request. Another issuer, or an operator's
/// command, is dead-lettered with the principal named; the same command on the plain `op` subject is taken.
#[test]
fn a_bound_producer_sends_only_as_its_principal_and_only_a_producer_s_requests() {
    use leasehold_log::CommandRecord;
    use leasehold_schemas::command::{Allocate, DefinePool};
    use leasehold_schemas::ids::{PoolName, ResourceId};
    use leasehold_schemas::pool::{OrphanPolicy, PoolKind};
    use leasehold_schemas::subjects::bound_ingress_subject;

    let team = Issuer::new("ci:team-a").unwrap();
    let at = Timestamp(1_800_000_000_000);
    let as_issuer = |issuer: &str, n: u8, body: leasehold_schemas::Command| {
        Envelope::new(CommandId::from_parts(at.0, [n; 10]), Issuer::new(issuer).unwrap(), at, body)
    };
    let stored = |subject: String, envelope: &Envelope| CommandRecord {
        seq: 1,
        subject: subject.replace("lh.in.", "lh.cmd.0."),
        time: at,
        payload: codec::encode_command(envelope).unwrap().into(),
    };
    let allocate: leasehold_schemas::Command =
        Allocate::new(AgentName::new("w1").unwrap(), ResourceId::from_parts(at.0, [1; 10]), "container", 1).into();
    let bound = bound_ingress_subject(&allocate, &team).unwrap();
    assert_eq!(bound, format!("lh.in.op@ci:team-a.w1.{}", allocate.subject_id()));

    let own = as_issuer("ci:team-a", 1, allocate.clone());
    assert_eq!(leasehold_worker::admit(0, 1, &stored(bound.clone(), &own)).unwrap(), own);

    let other = as_issuer("ci:team-b", 2, allocate.clone());
    let refused = leasehold_worker::admit(0, 1, &stored(bound.clone(), &other)).unwrap_err();
    assert!(refused.contains("published as principal \"ci:team-a\"") && refused.contains("\"ci:team-b\""), "{refused}");
    // Naming another issuer is what an unbound producer (an operator, the gateway) may do.
    assert_eq!(leasehold_worker::admit(0, 1, &stored(ingress_subject_of(&allocate), &other)).unwrap(), other);

    let define: leasehold_schemas::Command = DefinePool {
        pool: PoolName::new("quota-team-a-container").unwrap(),
        kind: PoolKind::Slots { count: 1000 },
        cooldown: None,
        orphans: OrphanPolicy::Release,
    }
    .into();
    let raise = as_issuer("ci:team-a", 3, define.clone());
    let refused = leasehold_worker::admit(0, 1, &stored(bound_ingress_subject(&define, &team).unwrap(), &raise));
    assert!(refused.unwrap_err().contains("op.define-pool is the operator's"));
}
