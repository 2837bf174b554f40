//! Atomic batches against a real nats-server at its limits: a log made before group commit under restricted
//! credentials, the largest groups on R3, and commands too large to batch (found by a red-team review).

use std::time::Duration;

use bytes::Bytes;
use leasehold_log::jetstream::{Credentials, JetStream, JetStreamConfig};
use leasehold_log::nats_server::{NatsServer, ServerOptions};
use leasehold_log::{Log, Publish};

const PARTITIONS: u32 = 4;

fn as_user(url: &str, partitions: u32, user: &str) -> JetStreamConfig {
    JetStreamConfig {
        credentials: Credentials::UserPassword { user: user.to_owned(), password: user.to_owned() },
        inbox_prefix: Some(format!("_INBOX_{user}")),
        ..JetStreamConfig::new(url, partitions)
    }
}

/// A log made by the version before group commit (LH_CMD and LH_EVT without `allow_atomic_publish`), then the new
/// binary started under credentials that may not update a stream (as `leasehold credentials worker|producer|sweeper`
/// issues): every process connects, a worker's log appends one record at a time (`max_append_records` 1, a batch
/// answered "too large" before anything is sent), and commands are published one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_users_connect_to_a_log_made_before_group_commit_and_append_one_by_one() {
    let extra = r#"
accounts {
  LH {
    jetstream: enabled
    users = [
      { user: admin, password: admin }
      { user: w, password: w, permissions: {
          publish: { allow: [">"], deny: ["$JS.API.STREAM.UPDATE.>"] }
          subscribe: { allow: ["_INBOX_w.>"] }
      } }
    ]
  }
}
"#;
    let options = ServerOptions { extra: Some(extra.to_owned()), ..Default::default() };
    let Some(server) = NatsServer::start_with(options) else { return };
    // The previous version's log: the same streams, without atomic batches.
    let admin = JetStream::connect(as_user(server.url(), PARTITIONS, "admin")).await.expect("admin connects");
    let js = async_nats::jetstream::new(admin.client().clone());
    for name in ["LH_CMD", "LH_EVT"] {
        let stream = js.get_stream(name).await.expect("the stream");
        let mut config = stream.cached_info().config.clone();
        config.allow_atomic_publish = false;
        js.update_stream(config).await.expect("made as the previous version made it");
    }
    drop(admin);
    for (who, partitions) in [("a worker (serve)", PARTITIONS), ("a producer or the sweeper (client only)", 0)] {
        let mut config = as_user(server.url(), partitions, "w");
        config.request_timeout = Duration::from_secs(2);
        let log = JetStream::connect(config).await.unwrap_or_else(|e| panic!("{who} connects: {e}"));
        assert_eq!(log.max_append_records(), 1, "{who}: one record per append without atomic batches");
        let key = &leasehold_log::conformance::keys_in(1, PARTITIONS, 1)[0];
        let fence = log.last_outcome_seq(1).await.expect("the fence");
        let records: Vec<_> = (1..=2).map(|n| leasehold_log::conformance::record(key, fence + n, 0)).collect();
        let answer = log.append(1, fence, &records).await;
        assert!(matches!(answer, leasehold_log::Appended::TooLarge(_)), "{who}: {answer:?}");
        let landed = leasehold_log::conformance::append_one(&log, 1, fence, records[0].clone()).await;
        assert!(landed > fence);
        let commands: Vec<Publish> = (0..3)
            .map(|i| Publish {
                subject: format!("lh.in.op.k{i}._"),
                msg_id: format!("{who}-{i}"),
                payload: Bytes::from_static(b"c"),
            })
            .collect();
        let answers = log.publish_commands(&commands).await;
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|p| !p.duplicate)), "{who}: {answers:?}");
    }
}

/// The largest groups a writer makes by default (up to 1000 records or 8 MiB) land whole on a three-node R3
/// cluster, as on one server: any refusal there would wedge the partition (the writer reloads and sends the same
/// group again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_default_groups_land_on_an_r3_cluster() {
    use leasehold_log::nats_server::NatsCluster;
    use leasehold_log::{Appended, OutcomeRecord};
    let Some(cluster) = NatsCluster::start3().await else { return };
    let config = JetStreamConfig { replicas: 3, ..JetStreamConfig::new(cluster.url(), PARTITIONS) };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let log = loop {
        match JetStream::connect(config.clone()).await {
            Ok(log) => break log,
            Err(leasehold_log::Error::Unavailable(e)) if tokio::time::Instant::now() < deadline => {
                eprintln!("the cluster is not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connect to the cluster: {e}"),
        }
    };
    let p = 1;
    let key = &leasehold_log::conformance::keys_in(p, PARTITIONS, 1)[0];
    let mut fence = 0;
    let mut cmd_seq = 0;
    let mut results = Vec::new();
    for (count, size) in [(1000usize, 8000usize), (16, 512 * 1024), (1000, 8 * 1024 * 1024 / 1000 - 200)] {
        let records: Vec<OutcomeRecord> = (0..count)
            .map(|_| {
                cmd_seq += 1;
                OutcomeRecord {
                    key: key.clone(),
                    cmd_id: format!("cmd-{cmd_seq}"),
                    cmd_seq,
                    part: 0,
                    payload: bytes::Bytes::from(vec![b'o'; size]),
                }
            })
            .collect();
        let started = std::time::Instant::now();
        let answer = log.append(p, fence, &records).await;
        results.push(format!("{count} x {size} B: {answer:?} in {:?}", started.elapsed()));
        if let Appended::Landed { last, .. } = answer {
            fence = last;
        } else {
            fence = log.last_outcome_seq(p).await.unwrap();
        }
    }
    eprintln!("{}", results.join("\n"));
    assert!(results.iter().all(|r| r.contains("Landed")), "{}", results.join("\n"));
}

/// A command that fits the server's `max_payload` alone but not with the batch headers (a 1 MiB command is
/// allowed: `MAX_COMMAND_BYTES`) used to fail client-side in the middle of its atomic batch, leaving the batch open
/// on the server for its timeout; 50 of them and every later batch was refused "too many inflight". The sizes are
/// checked before anything is sent now: such a batch goes out one by one, and batching goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_too_large_to_batch_leaves_no_batch_open() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    let small = |id: String| Publish { subject: "lh.in.op.k1._".to_owned(), msg_id: id, payload: Bytes::from("s") };
    let js = async_nats::jetstream::new(log.client().clone());
    let cmd = js.get_stream("LH_CMD").await.expect("LH_CMD");
    let batched = async |answers: &[Result<leasehold_log::Published, leasehold_log::Error>]| {
        let mut batched = 0;
        for answer in answers {
            let seq = answer.as_ref().expect("stored").seq;
            let message = cmd.get_raw_message(seq).await.expect("the stored command");
            if message.headers.get("Nats-Batch-Id").is_some() {
                batched += 1;
            }
        }
        batched
    };
    let before: Vec<Publish> = (0..10).map(|i| small(format!("before-{i}"))).collect();
    assert_eq!(batched(&log.publish_commands(&before).await).await, 10, "batched before the large commands");
    for round in 0..51 {
        let big = Publish {
            subject: "lh.in.op.k2._".to_owned(),
            msg_id: format!("big-{round}"),
            payload: Bytes::from(vec![b'b'; 1024 * 1024 - 60]),
        };
        let answers = log.publish_commands(&[small(format!("a-{round}")), big, small(format!("c-{round}"))]).await;
        assert!(answers.iter().all(Result::is_ok), "each command is stored: {answers:?}");
    }
    let fresh: Vec<Publish> = (0..10).map(|i| small(format!("fresh-{i}"))).collect();
    assert_eq!(
        batched(&log.publish_commands(&fresh).await).await,
        10,
        "the fresh commands went out as one atomic batch"
    );
}
