//! The conformance suite against JetStream, each test on a fresh `nats-server` (the streams have fixed names, so
//! tests cannot share a server), plus what only JetStream has: refusing streams made differently, pins that move,
//! and the fence on a three-node R3 cluster, where retries are answered differently (DESIGN section 9).
//!
//! Without `nats-server` on `PATH` these tests print a notice and pass, except in CI (`CI=true`), where they fail.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use leasehold_log::conformance::{self, own_within};
use leasehold_log::embedded::{Embedded, system_clock};
use leasehold_log::jetstream::{
    CMD_STREAM, Credentials, DLQ_STREAM, EVT_STREAM, JetStream, JetStreamConfig, agent_consumer, writer_consumer,
};
use leasehold_log::nats_server::{NatsCluster, NatsServer, PermissionProbe, ProbeAuth, ServerOptions, Try, Verdict};
use leasehold_log::{Appended, Error, Log, OutcomeFilter, Owner};
use tokio::time::Instant;

const PARTITIONS: u32 = 4;

/// Short takeover times, so tests of pins that move take seconds.
fn config(url: &str, partitions: u32) -> JetStreamConfig {
    JetStreamConfig {
        priority_timeout: Duration::from_secs(2),
        ack_wait: Duration::from_secs(2),
        ..JetStreamConfig::new(url, partitions)
    }
}

async fn fresh() -> Option<(NatsServer, JetStream)> {
    let server = NatsServer::start()?;
    let log = JetStream::connect(config(server.url(), PARTITIONS)).await.expect("connect to a fresh server");
    Some((server, log))
}

#[tokio::test]
async fn order_per_partition() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::order_per_partition(log).await;
}

#[tokio::test]
async fn dedupe() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::dedupe(log).await;
}

#[tokio::test]
async fn stale_fence_refused() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::stale_fence_refused(log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::concurrent_appenders(log).await;
}

#[tokio::test]
async fn follower_sees_everything_once_across_a_restart() {
    let Some((mut server, log)) = fresh().await else { return };
    let server = &mut server;
    conformance::follower_sees_everything_once(log, |log| async move {
        drop(log);
        server.restart();
        JetStream::connect(config(server.url(), PARTITIONS)).await.expect("reconnect after the restart")
    })
    .await;
}

#[tokio::test]
async fn old_deliveries_never_skip() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::old_deliveries_never_skip(log).await;
}

#[tokio::test]
async fn dead_letters() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::dead_letters(log).await;
}

/// A dead letter stored before letters carried their command id (no `Lh-Cmd-Id` or `Lh-Producer-Msg-Id` header) is
/// read with the id its payload's header names, as verified.
#[tokio::test]
async fn a_dead_letter_stored_before_ids_were_recorded_is_read_by_its_payload() {
    let Some((_server, log)) = fresh().await else { return };
    let id = "019b76da-abe8-7001-8000-000000000003";
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Lh-Reason", "oversized: command of 1048577 bytes");
    headers.insert("Lh-Source-Seq", "5");
    headers.insert("Lh-Source-Subject", "lh.cmd.1.op.w1._");
    let payload = format!(r#"{{"command_id":"{id}","body":{{"cut"#);
    let js = async_nats::jetstream::new(log.client().clone());
    js.publish_with_headers("lh.dlq.1.op.w1._", headers, payload.clone().into())
        .await
        .expect("publish an old letter")
        .await
        .expect("stored");
    let letters = log.read_dead_letters(1, 10).await.expect("read the dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0].1;
    assert_eq!((letter.source_seq, letter.payload.as_ref()), (5, payload.as_bytes()));
    assert_eq!(letter.command_id, Some(leasehold_log::LetterId { id: id.to_owned(), verified: true }));
}

#[tokio::test]
async fn snapshots() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::snapshots(log).await;
}

/// The server partitions as `schemas` and the embedded log do (DESIGN section 9's test vector).
#[tokio::test]
async fn both_backends_store_a_command_on_the_same_subject() {
    let Some(server) = NatsServer::start() else { return };
    let jetstream = JetStream::connect(config(server.url(), 8)).await.expect("connect");
    let embedded = Embedded::in_memory(8, system_clock()).expect("embedded log");
    let jetstream_subject = stored_subject(&jetstream).await;
    assert_eq!(jetstream_subject, "lh.cmd.7.op.res-a._");
    assert_eq!(stored_subject(&embedded).await, jetstream_subject);
}

async fn stored_subject<L: Log>(log: &L) -> String {
    let published = log.publish_command("lh.in.op.res-a._", "cmd-1", Bytes::from_static(b"x")).await.expect("publish");
    let stored = log.read_commands(7, 0, 10).await.expect("read");
    assert_eq!(stored.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![published.seq]);
    log.command_at(published.seq).await.expect("command at").expect("stored").subject
}

/// Streams made for another partition count, or with other settings, are refused with what differs.
#[tokio::test]
async fn streams_made_differently_are_refused() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(config(server.url(), PARTITIONS)).await.expect("connect");
    drop(log);
    let err = JetStream::connect(config(server.url(), 8)).await.expect_err("another partition count");
    assert!(matches!(&err, Error::Refused(m) if m.contains("LH_CMD was created for 4 partitions, not 8")), "{err}");
    let err = JetStream::connect(JetStreamConfig { replicas: 3, ..config(server.url(), PARTITIONS) })
        .await
        .expect_err("another replica count");
    assert!(matches!(&err, Error::Refused(m) if m.contains("num_replicas is 1, leasehold needs 3")), "{err}");
    let with_password = server.url().replace("nats://", "nats://lh:secret@");
    let err = JetStream::connect(config(&with_password, PARTITIONS)).await.expect_err("credentials in the URL");
    assert!(matches!(&err, Error::Refused(m) if m.contains("not in the URL")), "{err}");
    // The same settings are accepted again.
    let log = JetStream::connect(config(server.url(), PARTITIONS)).await.expect("reconnect");
    assert_eq!(log.partitions(), PARTITIONS);
}

/// A client of an existing log (an agent, a producer) asks for partition count 0 and gets the log's; with no log on
/// the server it is refused, and nothing is created.
#[tokio::test]
async fn a_client_takes_the_partition_count_of_the_existing_log() {
    let Some(server) = NatsServer::start() else { return };
    let err = JetStream::connect(config(server.url(), 0)).await.expect_err("no log yet");
    assert!(matches!(&err, Error::Refused(m) if m.contains("no leasehold log on this NATS server yet")), "{err}");
    let creator = JetStream::connect(config(server.url(), 5)).await.expect("create the log");
    drop(creator);
    let client = JetStream::connect(config(server.url(), 0)).await.expect("attach to the log");
    assert_eq!(client.partitions(), 5);
}

/// A command over the server's `max_payload` is refused, not lost; a server started with a larger one stores it.
#[tokio::test]
async fn a_command_over_the_servers_max_payload_is_refused() {
    let big = Bytes::from(vec![b'x'; 3 << 19]);
    let Some((_server, log)) = fresh().await else { return };
    let err = log.publish_command("lh.in.op.w1._", "big", big.clone()).await.expect_err("over 1 MiB");
    assert!(matches!(&err, Error::Refused(m) if m.contains("too large")), "{err}");
    let Some(server) = NatsServer::start_with(ServerOptions { max_payload: Some(2 << 20), ..Default::default() })
    else {
        return;
    };
    let log = JetStream::connect(config(server.url(), PARTITIONS)).await.expect("connect");
    let published = log.publish_command("lh.in.op.w1._", "big", big.clone()).await.expect("under 2 MiB");
    assert_eq!(log.command_at(published.seq).await.expect("read").expect("stored").payload, big);
}

async fn publish(log: &JetStream, key: &str, n: u64) -> u64 {
    let subject = format!("lh.in.op.{key}.c{n}");
    log.publish_command(&subject, &format!("{key}-{n}"), Bytes::from(format!("{n}"))).await.expect("publish").seq
}

/// Calls `next_commands` until the owner hears it lost the partition, within `within`.
async fn until_lost<O: Owner>(owner: &mut O, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match owner.next_commands(0, 10, Duration::from_millis(100)).await {
            Err(Error::Lost(p)) => {
                assert_eq!(p, owner.partition());
                return;
            }
            Err(other) => panic!("expected Lost, got {other}"),
            Ok(_) => assert!(Instant::now() < deadline, "the owner did not learn it lost the partition in {within:?}"),
        }
    }
}

/// A writer takes its commands from the consumer's deliveries: past the first read from its cursor (a new owner
/// cannot vouch for what an earlier one was delivered), 40 commands come in order without a read for each batch.
#[tokio::test]
async fn an_owner_hands_out_deliveries_without_reading_each_batch_again() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(3, PARTITIONS, 1)[0];
    let mut owner = log.own(3, "worker-a").await.expect("own").expect("a free partition");
    let mut published = Vec::new();
    for n in 0..40 {
        published.push(publish(&log, key, n).await);
    }
    let (mut cursor, mut handed) = (0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while handed.len() < published.len() {
        assert!(Instant::now() < deadline, "only {} of {} commands came", handed.len(), published.len());
        let got = owner.next_commands(cursor, 10, Duration::from_millis(500)).await.expect("commands");
        if let Some(last) = got.last() {
            cursor = last.seq;
            owner.done_through(cursor).await.expect("done");
        }
        handed.extend(got.iter().map(|c| c.seq));
    }
    assert_eq!(handed, published, "in order, each once");
    let stats = owner.reading_stats();
    assert!(stats.delivered >= 40, "{stats:?}");
    assert!(stats.reads <= 3, "read by sequence for batch after batch: {stats:?}");
}

/// 100 commands on partition 1, of which a first owner decides the first ten and stops, its pull having run
/// ahead: answers them and its cursor.
async fn stopped_after_ten(log: &JetStream, key: &str) -> (Vec<u64>, u64) {
    let mut published = Vec::new();
    for n in 0..100 {
        published.push(publish(log, key, n).await);
    }
    let mut a = log.own(1, "worker-a").await.expect("own").expect("a free partition");
    let mut cursor = 0;
    while cursor < published[9] {
        let got = a.next_commands(cursor, 10, Duration::from_millis(500)).await.expect("commands");
        for command in got.iter().filter(|c| c.seq <= published[9]) {
            cursor = command.seq;
        }
        a.done_through(cursor).await.expect("done");
    }
    assert!(a.reading_stats().delivered > 10, "a's pull ran ahead: {:?}", a.reading_stats());
    a.release().await;
    (published, cursor)
}

/// A writer that stops leaves commands it was delivered and did not decide (its pulls ran ahead). The next owner
/// reads them by sequence up to the first command the consumer delivers to it, a few at first and twice as many
/// each time: not a whole batch of commands the consumer is delivering anyway.
#[tokio::test]
async fn the_next_owner_reads_only_the_gap_a_stopped_writer_left() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(1, PARTITIONS, 1)[0];
    let (mut published, mut cursor) = stopped_after_ten(&log, key).await;
    for n in 100..200 {
        published.push(publish(&log, key, n).await);
    }
    let mut b = own_within(&log, 1, "worker-b").await;
    let mut handed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while handed.len() < published.len() - 10 {
        assert!(Instant::now() < deadline, "only {} of {} commands came", handed.len(), published.len() - 10);
        let got = b.next_commands(cursor, 1000, Duration::from_millis(500)).await.expect("commands");
        if let Some(last) = got.last() {
            cursor = last.seq;
            b.done_through(cursor).await.expect("done");
        }
        handed.extend(got.iter().map(|c| c.seq));
    }
    assert_eq!(handed, published[10..], "in order, each once");
    let stats = b.reading_stats();
    // The gap is the 90 commands a did not decide: reads of 8, 16, 32 and 64 pass it. A read of a whole batch
    // brought all 190.
    assert!(stats.read_records >= 90 && stats.read_records <= 120, "{stats:?}");
}

/// Under a backlog the consumer delivers until 4,000 deliveries wait for an ack, then stops until one comes. A
/// writer that takes batches smaller than the consumer delivers (150 here, each appended) holds thousands
/// undecided and defers its acks; when what it holds runs short of a batch it waits for the deliveries the pulls
/// are to bring, and those must not be held back by the acks it has not sent: no call waits out its poll while the
/// backlog lasts. (Fails when that wait does not ack first: a stall of the whole poll every 8,000 commands.)
#[tokio::test]
async fn a_busy_writer_is_never_kept_waiting_by_the_acks_it_defers() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(1, PARTITIONS, 1)[0];
    let total = 40_000;
    for chunk in 0..total / 500 {
        let commands: Vec<leasehold_log::Publish> = (0..500)
            .map(|i| {
                let n = chunk * 500 + i;
                leasehold_log::Publish {
                    subject: format!("lh.in.op.{key}.c{n}"),
                    msg_id: format!("{key}-{n}"),
                    payload: Bytes::from(format!("{n}")),
                }
            })
            .collect();
        assert!(log.publish_commands(&commands).await.iter().all(Result::is_ok), "published");
    }
    let mut owner = log.own(1, "worker-a").await.expect("own").expect("a free partition");
    let poll = Duration::from_millis(500);
    let (mut cursor, mut handed) = (0, 0);
    let mut fence = log.last_outcome_seq(1).await.expect("the fence");
    let mut stalls = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handed < total {
        assert!(Instant::now() < deadline, "only {handed} of {total} commands came");
        let started = Instant::now();
        let got = owner.next_commands(cursor, 150, poll).await.expect("commands");
        let took = started.elapsed();
        handed += got.len();
        if took >= poll * 4 / 5 && handed < total {
            stalls.push((handed, took));
        }
        if let Some(last) = got.last() {
            // The writer's work: the batch's outcomes, appended in one.
            let records: Vec<_> = got.iter().map(|c| conformance::record(key, c.seq, 0)).collect();
            match log.append(1, fence, &records).await {
                Appended::Landed { last, .. } => fence = last,
                other => panic!("the append did not land: {other:?}"),
            }
            cursor = last.seq;
            owner.done_through(cursor).await.expect("done");
        }
    }
    assert!(stalls.is_empty(), "calls that waited out the poll with {total} commands in the log: {stalls:?}");
}

/// An operator's unpin moves the partition: the next owner is pinned by the next delivery, and the old one hears
/// it is lost, whatever it asks for.
#[tokio::test]
async fn an_unpinned_owner_learns_it_lost_the_partition() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(0, PARTITIONS, 1)[0];
    let first = publish(&log, key, 0).await;
    let mut a = log.own(0, "worker-a").await.expect("own").expect("a free partition");
    let got = a.next_commands(0, 10, Duration::from_millis(500)).await.expect("commands");
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![first]);
    assert!(log.own(0, "worker-b").await.expect("own").is_none(), "a is pinned");

    let js = async_nats::jetstream::new(log.client().clone());
    js.get_stream(CMD_STREAM)
        .await
        .expect("stream")
        .unpin_consumer(&writer_consumer(0), "writer")
        .await
        .expect("unpin");
    publish(&log, key, 1).await;
    let mut b = own_within(&log, 0, "worker-b").await;
    until_lost(&mut a, Duration::from_secs(10)).await;
    let got = b.next_commands(0, 10, Duration::from_millis(500)).await.expect("b serves the partition");
    assert_eq!(got.len(), 2);
}

/// An owner that stops pulling loses its pin after `priority_timeout`; another worker then takes the partition.
#[tokio::test]
async fn a_stuck_owner_loses_the_partition_after_the_priority_timeout() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(1, PARTITIONS, 1)[0];
    publish(&log, key, 0).await;
    let mut a = log.own(1, "worker-a").await.expect("own").expect("a free partition");
    assert_eq!(a.next_commands(0, 10, Duration::from_millis(500)).await.expect("commands").len(), 1);
    assert!(log.own(1, "worker-b").await.expect("own").is_none(), "a is pinned");
    // a is stuck (it asks for nothing); a new command waits, and b takes over once a's pin lapses.
    let started = Instant::now();
    publish(&log, key, 1).await;
    let mut b = own_within(&log, 1, "worker-b").await;
    assert!(started.elapsed() >= Duration::from_millis(1500), "b owned the partition before a's pin could lapse");
    assert_eq!(b.next_commands(0, 10, Duration::from_millis(500)).await.expect("b's commands").len(), 2);
    until_lost(&mut a, Duration::from_secs(10)).await;
}

/// With no command to deliver the server pins nobody, so two workers may both hold an idle partition; the first
/// delivery pins one of them, and the other hears it is lost before it works on anything.
#[tokio::test]
async fn the_first_command_settles_who_owns_an_idle_partition() {
    let Some((_server, log)) = fresh().await else { return };
    let mut a = log.own(2, "worker-a").await.expect("own").expect("an idle partition");
    let mut b = log.own(2, "worker-b").await.expect("own").expect("an idle partition is held by nobody pinned");
    let key = &conformance::keys_in(2, PARTITIONS, 1)[0];
    let seq = publish(&log, key, 0).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut a_lost, mut b_lost) = (false, false);
    while !(a_lost || b_lost) {
        assert!(Instant::now() < deadline, "neither owner heard it lost the partition");
        for (owner, lost) in [(&mut a, &mut a_lost), (&mut b, &mut b_lost)] {
            match owner.next_commands(0, 10, Duration::from_millis(100)).await {
                Ok(got) => assert!(got.iter().all(|c| c.seq == seq), "{got:?}"),
                Err(Error::Lost(_)) => *lost = true,
                Err(other) => panic!("{other}"),
            }
        }
    }
    assert!(a_lost != b_lost, "exactly one owner keeps the partition");
    let keeper = if a_lost { &mut b } else { &mut a };
    let got = keeper.next_commands(0, 10, Duration::from_millis(500)).await.expect("the keeper serves on");
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![seq]);
}

/// `done_through` acks the consumer's deliveries up to the sequence, and no further: while more is at hand, once a
/// pull's expiry has passed since the last ack (a busy writer acks many rounds at once).
#[tokio::test]
async fn done_through_acks_the_deliveries_it_covers() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(3, PARTITIONS, 1)[0];
    let mut seqs = Vec::new();
    for n in 0..3 {
        seqs.push(publish(&log, key, n).await);
    }
    let mut owner = log.own(3, "worker-a").await.expect("own").expect("a free partition");
    assert_eq!(owner.next_commands(0, 10, Duration::from_millis(500)).await.expect("commands").len(), 3);
    let js = async_nats::jetstream::new(log.client().clone());
    let stream = js.get_stream(CMD_STREAM).await.expect("stream");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        owner.done_through(seqs[1]).await.expect("done");
        let info = stream.consumer_info(writer_consumer(3)).await.expect("consumer info");
        if info.ack_floor.stream_sequence == seqs[1] && info.num_ack_pending == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the first two deliveries were not acked: {info:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    owner.release().await;
}

/// The writer retrying its own landed append under the old fence: a single replica checks the fence first
/// (10071, stale at the landed sequence), a replicated stream the message id first (a duplicate: unknown). Either
/// way it is not told "landed".
async fn retry_of_a_landed_append(log: &JetStream) -> Appended {
    let p = 2;
    let key = &conformance::keys_in(p, PARTITIONS, 1)[0];
    let fence = log.last_outcome_seq(p).await.expect("last outcome");
    let record = conformance::record(key, 77, 0);
    let landed = conformance::append_one(log, p, fence, record.clone()).await;
    let retry = log.append(p, fence, &[record]).await;
    if let Appended::Stale { last } = &retry {
        assert_eq!(*last, Some(landed), "the server names the landed sequence");
    }
    retry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_and_retried_appends_on_one_replica() {
    let Some((_server, log)) = fresh().await else { return };
    assert_eq!(
        conformance::distinct_appenders(&log, 3).await,
        0,
        "a single replica has no write in flight to be busy with"
    );
    let retry = retry_of_a_landed_append(&log).await;
    assert!(matches!(retry, Appended::Stale { .. }), "{retry:?}");
}

/// `release` unpins: another worker owns the partition at once, without waiting for the pin to lapse.
#[tokio::test]
async fn release_hands_the_partition_over_at_once() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(1, PARTITIONS, 1)[0];
    let first = publish(&log, key, 0).await;
    let mut a = log.own(1, "worker-a").await.expect("own").expect("a free partition");
    assert_eq!(a.next_commands(0, 10, Duration::from_millis(500)).await.expect("commands").len(), 1);
    assert!(log.own(1, "worker-b").await.expect("own").is_none(), "a is pinned");
    a.done_through(first).await.expect("done");
    a.release().await;
    let mut b = log.own(1, "worker-b").await.expect("own").expect("released at once");
    let second = publish(&log, key, 1).await;
    let got = b.next_commands(first, 10, Duration::from_secs(2)).await.expect("b's commands");
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![second]);
}

/// On three nodes with R3 streams: a retry of a landed append is answered "duplicate", not 10071, and racing
/// appenders are answered 10164 while one is in flight. Neither may land. One cluster serves both checks (a
/// cluster takes seconds to elect its meta leader); the streams are removed between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_holds_on_an_r3_cluster() {
    let Some(cluster) = NatsCluster::start3().await else { return };
    let connect = || async {
        let config = JetStreamConfig { replicas: 3, ..config(&cluster.url(), PARTITIONS) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match JetStream::connect(config.clone()).await {
                Ok(log) => return log,
                Err(Error::Unavailable(e)) if Instant::now() < deadline => {
                    eprintln!("the cluster is not ready yet: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("connect to the cluster: {e}"),
            }
        }
    };
    let log = connect().await;
    conformance::stale_fence_refused(log.clone()).await;
    let js = async_nats::jetstream::new(log.client().clone());
    for stream in ["LH_CMD", "LH_EVT", DLQ_STREAM] {
        js.delete_stream(stream).await.expect("remove the stream");
    }
    let log = connect().await;
    conformance::concurrent_appenders(log.clone()).await;
    conformance::distinct_appenders(&log, 3).await;
    let retry = retry_of_a_landed_append(&log).await;
    assert!(matches!(&retry, Appended::Unknown(reason) if reason.contains("duplicate")), "{retry:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_land_whole_or_not_at_all() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::batches_land_whole_or_not_at_all(log.clone()).await;
    // As stored: the first record of a batch carries the fence and Lh-Prev-Seq, the later ones only their index.
    let p = 2;
    let keys = conformance::keys_in(p, PARTITIONS, 2);
    let records: Vec<_> = (0..4).map(|i| conformance::record(&keys[i % 2], 1 + i as u64, 0)).collect();
    let Appended::Landed { first, last } = log.append(p, 0, &records).await else { panic!("the batch lands") };
    let js = async_nats::jetstream::new(log.client().clone());
    let evt = js.get_stream("LH_EVT").await.expect("LH_EVT");
    assert!(evt.cached_info().config.allow_atomic_publish, "LH_EVT allows atomic batches");
    for seq in first..=last {
        let message = evt.get_raw_message(seq).await.expect("the stored record");
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        if seq == first {
            assert_eq!(header("Lh-Prev-Seq").as_deref(), Some("0"));
            assert_eq!(header("Nats-Expected-Last-Subject-Sequence").as_deref(), Some("0"));
            assert_eq!(header("Lh-Batch-Index"), None);
        } else {
            assert_eq!(header("Lh-Prev-Seq"), None, "a later record carries no chain header");
            assert_eq!(header("Nats-Expected-Last-Subject-Sequence"), None, "a later record never carries the fence");
            assert_eq!(header("Lh-Batch-Index"), Some((seq - first).to_string()));
        }
    }
}

/// Too many open batches (10210) is "busy": nothing stored, and the same append lands once a slot is free, with no
/// reload. The server here allows one open batch per stream; a batch opened by hand and never committed holds it
/// until the server's batch timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_open_batches_is_busy_and_retried_as_it_is() {
    let options = ServerOptions {
        jetstream: Some("limits { batch { max_inflight_per_stream: 1, timeout: \"1s\" } }".to_owned()),
        ..Default::default()
    };
    let Some(server) = NatsServer::start_with(options) else { return };
    let log = JetStream::connect(config(server.url(), PARTITIONS)).await.expect("connect");
    let p = 1;
    let key = &conformance::keys_in(p, PARTITIONS, 1)[0];
    // A batch opened and abandoned half-way: its first message only.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Batch-Id", "abandoned");
    headers.insert("Nats-Batch-Sequence", "1");
    let opened = log
        .client()
        .request_with_headers(format!("lh.evt.{p}.{key}"), headers, Bytes::from_static(b"half"))
        .await
        .expect("the abandoned batch's first message");
    assert!(opened.payload.is_empty(), "the batch was opened: {opened:?}");
    let records: Vec<_> = (1..=3).map(|n| conformance::record(key, n, 0)).collect();
    let busy = log.append(p, 0, &records).await;
    assert!(matches!(&busy, Appended::Busy(why) if why.contains("10210")), "{busy:?}");
    assert_eq!(log.last_outcome_seq(p).await.unwrap(), 0, "nothing stored, the abandoned batch included");
    // Retried as it is (what a writer does with a busy answer), under the same fence.
    let deadline = Instant::now() + Duration::from_secs(15);
    let landed = loop {
        match log.append(p, 0, &records).await {
            Appended::Busy(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            answer => break answer,
        }
    };
    let Appended::Landed { first, last } = landed else { panic!("the retried batch: {landed:?}") };
    assert_eq!(last - first, 2);
    let stored = conformance::all_outcomes(&log, &leasehold_log::OutcomeFilter::Partition(p), 1).await;
    assert_eq!(stored.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), vec![1, 2, 3], "the abandoned batch left nothing");
}

#[tokio::test]
async fn publish_commands_answers_each() {
    let Some((_server, log)) = fresh().await else { return };
    conformance::publish_commands_answers_each(log).await;
}

/// An agent with the longest name (63 characters) and a secret follows its outcomes through the consumer named
/// from them (105 characters: nats-server 2.15 takes it), and that is the consumer the server holds.
#[tokio::test]
async fn an_agent_follows_through_the_consumer_its_secret_names() {
    let Some((server, log)) = fresh().await else { return };
    let agent = "a".repeat(63);
    let partition = leasehold_schemas::subjects::partition_of(&agent, PARTITIONS);
    let landed = conformance::append_one(&log, partition, 0, conformance::record(&agent, 1, 0)).await;
    // A server without authentication takes any user and password: enough to name the consumer.
    let config = JetStreamConfig {
        credentials: Credentials::UserPassword { user: agent.clone(), password: "its secret".to_owned() },
        agent: Some(agent.clone()),
        ..config(server.url(), PARTITIONS)
    };
    let restricted = JetStream::connect(config).await.expect("connect as the agent");
    let mut follower = restricted.follow(OutcomeFilter::Key { partition, key: agent.clone() }, 1);
    let first = tokio::time::timeout(Duration::from_secs(10), follower.next())
        .await
        .expect("an outcome within 10 s")
        .expect("the follower goes on")
        .expect("a readable outcome");
    assert_eq!((first.seq, first.key.as_str()), (landed, agent.as_str()));
    let name = agent_consumer(&agent, Some("its secret"));
    assert_eq!(name.len(), 105);
    let js = async_nats::jetstream::new(log.client().clone());
    let info = js.get_stream(EVT_STREAM).await.expect("stream").consumer_info(&name).await.expect("its consumer");
    assert_eq!(info.config.filter_subject, format!("lh.evt.{partition}.{agent}"));
}

/// What a permission probe tells apart, on a server with one restricted user: a refused publish or subscription
/// comes back as refused, an allowed one as allowed within one round trip, and an allowed probe of a stream's
/// subject or of an API request that reads its payload as a request stores and changes nothing.
#[tokio::test]
async fn a_permission_probe_tells_allowed_from_refused_and_changes_nothing() {
    let options = ServerOptions {
        extra: Some(
            "authorization {\n  users = [\n    { user: admin, password: admin }\n    { user: probe, password: probe, \
             permissions: { publish: { allow: [\"lh.>\", \"$JS.API.>\"] }, subscribe: { allow: [\"_INBOX_probe.>\"] } } }\n  ]\n}"
                .to_owned(),
        ),
        ..Default::default()
    };
    let Some(server) = NatsServer::start_with(options) else { return };
    let admin = Credentials::UserPassword { user: "admin".to_owned(), password: "admin".to_owned() };
    let log = JetStream::connect(JetStreamConfig { credentials: admin, ..config(server.url(), PARTITIONS) })
        .await
        .expect("connect as the admin");
    let key = &conformance::keys_in(0, PARTITIONS, 1)[0];
    conformance::append_one(&log, 0, 0, conformance::record(key, 1, 0)).await;
    publish(&log, key, 0).await;
    let js = async_nats::jetstream::new(log.client().clone());
    js.publish("lh.dlq.0.x", Bytes::from_static(b"a letter")).await.expect("publish").await.expect("stored");
    let state = |name: &'static str| {
        let js = js.clone();
        async move {
            let info = js.get_stream(name).await.expect("stream").info().await.expect("info").clone();
            (info.state.messages, info.state.last_sequence, info.state.consumer_count)
        }
    };
    let before = [state(CMD_STREAM).await, state(EVT_STREAM).await, state(DLQ_STREAM).await];

    let auth = ProbeAuth::Password { user: "probe".to_owned(), password: "probe".to_owned() };
    let mut probe = PermissionProbe::connect(server.url(), auth, "_INBOX_probe").await.expect("connect");
    let tries = [
        Try::Publish(format!("lh.evt.0.{key}")),
        Try::Publish(format!("lh.in.op.{key}._")),
        Try::Publish("lh.dlq.0.y".to_owned()),
        // A purge reads a payload that is not a request as "everything": the probe says what to purge.
        Try::PublishWith("$JS.API.STREAM.PURGE.LH_DLQ".to_owned(), br#"{"filter":"lh.dlq.none"}"#),
        Try::Publish("$JS.API.STREAM.CREATE.LH_EVT".to_owned()),
        Try::Publish("$JS.API.CONSUMER.CREATE.LH_EVT.probe.lh.evt.>".to_owned()),
        Try::Subscribe("_INBOX_probe.x".to_owned()),
        Try::Publish("lh-other.x".to_owned()),
        Try::Subscribe("lh.evt.>".to_owned()),
    ];
    let verdicts = probe.verdicts(&tries).await.expect("verdicts");
    let refused: Vec<String> = tries
        .iter()
        .zip(&verdicts)
        .filter(|(_, verdict)| matches!(verdict, Verdict::Refused(_)))
        .map(|(attempt, _)| attempt.to_string())
        .collect();
    assert_eq!(refused, ["publish lh-other.x", "subscribe lh.evt.>"]);
    probe.publish_allowed("lh.x").await.expect("allowed");
    probe.subscribe_allowed("_INBOX_probe.y").await.expect("allowed");
    assert!(probe.publish_allowed("lh-other.y").await.is_err());
    assert!(probe.subscribe_allowed("lh.y").await.is_err());
    // Nothing the allowed probes reached changed: a round trip on the admin's connection follows them.
    log.client().flush().await.expect("flush");
    let after = [state(CMD_STREAM).await, state(EVT_STREAM).await, state(DLQ_STREAM).await];
    assert_eq!(after, before, "(messages, last sequence, consumers) of LH_CMD, LH_EVT, LH_DLQ");
}

/// An operator's consumer reset (`$JS.API.CONSUMER.RESET`, `nats consumer reset`) numbers the writer consumer's
/// deliveries from 1 again and leaves the pin where it is, so the owner's reader lives through two numberings.
/// Here the consumer was first moved on to command 4, an old owner took deliveries 1 and 2 (commands 4 and 5) and
/// went away without deciding them, and the new owner, at cursor 3, saw deliveries 3 and 4 (commands 6 and 7) and
/// read 4 by sequence. Then the consumer is reset to command 1: its new delivery 2 (command 2) lands just below the
/// old delivery 3, which the reader takes as proof that nothing lies between 2 and 6. Command 5 must still come
/// before 6. (The consumer is made beforehand as leasehold would, with an ack limit of 4 so the new numbering stops
/// after its delivery 4: what the owner holds is then the same whenever it looks.)
#[tokio::test]
async fn a_consumer_reset_under_an_owner_never_skips_a_command() {
    use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PriorityPolicy};

    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig {
        priority_timeout: Duration::from_secs(10),
        ack_wait: Duration::from_secs(30),
        ..JetStreamConfig::new(server.url(), PARTITIONS)
    })
    .await
    .expect("connect");
    let key = &conformance::keys_in(0, PARTITIONS, 1)[0];
    let mut seqs = Vec::new();
    for n in 0..10 {
        seqs.push(publish(&log, key, n).await);
    }
    let name = writer_consumer(0);
    let client = log.client().clone();
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream(CMD_STREAM).await.expect("stream");
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: "lh.cmd.0.>".to_owned(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::All,
            ack_wait: Duration::from_secs(30),
            priority_policy: PriorityPolicy::PinnedClient,
            priority_groups: vec!["writer".to_owned()],
            priority_timeout: Duration::from_secs(10),
            max_ack_pending: 4,
            ..Default::default()
        })
        .await
        .expect("the writer consumer, as leasehold makes it");
    let reset = |seq: u64| {
        let client = client.clone();
        let subject = format!("$JS.API.CONSUMER.RESET.{CMD_STREAM}.{name}");
        async move {
            let answer = client
                .request(subject, Bytes::from(format!("{{\"seq\":{seq}}}")))
                .await
                .expect("the reset is answered");
            let answer: serde_json::Value = serde_json::from_slice(&answer.payload).expect("json");
            assert!(answer.get("error").is_none(), "reset refused: {answer}");
        }
    };
    let delivered = |consumer_seq: u64, stream_seq: u64| {
        let stream = stream.clone();
        let name = name.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let info = stream.consumer_info(&name).await.expect("consumer info");
                if info.delivered.consumer_sequence == consumer_seq
                    && info.delivered.stream_sequence == stream_seq
                    && info.num_ack_pending == 4
                {
                    return;
                }
                assert!(Instant::now() < deadline, "not delivered as expected: {info:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // Moved on to the fourth command; the old owner takes deliveries 1 and 2 and leaves.
    reset(seqs[3]).await;
    let inbox = client.new_inbox();
    let mut old_owner = client.subscribe(inbox.clone()).await.expect("subscribe");
    client
        .publish_with_reply(
            format!("$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.{name}"),
            inbox,
            Bytes::from(r#"{"batch":2,"expires":2000000000,"group":"writer"}"#),
        )
        .await
        .expect("pull");
    for expected in &seqs[3..5] {
        let message = tokio::time::timeout(Duration::from_secs(5), old_owner.next()).await.expect("a delivery");
        let reply = message.expect("a delivery").reply.expect("an ack subject").to_string();
        assert_eq!(reply.split('.').nth(5).unwrap(), expected.to_string(), "{reply}");
    }
    drop(old_owner);
    stream.unpin_consumer(&name, "writer").await.expect("unpin");

    // The new owner at cursor 3: deliveries 3 and 4 (commands 6 and 7) come, command 4 is read by sequence.
    let mut owner = own_within(&log, 0, "worker-b").await;
    let got = owner.next_commands(seqs[2], 1, Duration::from_millis(500)).await.expect("commands");
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![seqs[3]]);
    delivered(4, seqs[6]).await;

    // The reset back to the first command: deliveries 1 to 4 are commands 1 to 4 again, then the ack limit. (The
    // consumer's info may go on naming the old stream sequence after a reset: its delivery number and time tell.)
    let before = stream.consumer_info(&name).await.expect("consumer info").delivered.last_active;
    reset(seqs[0]).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        owner.keep_alive().await.expect("the reset leaves the pin");
        let info = stream.consumer_info(&name).await.expect("consumer info");
        if info.delivered.consumer_sequence == 4 && info.delivered.last_active > before && info.num_ack_pending == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the reset consumer did not deliver again: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    owner.keep_alive().await.expect("the reset leaves the pin");

    let got = owner.next_commands(seqs[3], 10, Duration::from_millis(500)).await.expect("commands");
    let got: Vec<u64> = got.iter().map(|c| c.seq).collect();
    assert_eq!(got.first(), Some(&seqs[4]), "after {} came {got:?}: command {} was passed over", seqs[3], seqs[4]);
}

/// A writer that stops (or dies) leaves commands it was delivered and did not decide, and no new command comes:
/// the consumer sends those again only once their ack wait runs out (30 s), and nothing else. The next owner's
/// first call must read them by sequence, not wait out its poll for deliveries the consumer will not make.
#[tokio::test]
async fn the_next_owner_does_not_wait_its_poll_for_what_the_last_one_was_delivered() {
    let Some((_server, log)) = fresh().await else { return };
    let key = &conformance::keys_in(1, PARTITIONS, 1)[0];
    let (published, cursor) = stopped_after_ten(&log, key).await;
    let mut b = own_within(&log, 1, "worker-b").await;
    let poll = Duration::from_secs(4);
    let started = Instant::now();
    let got = b.next_commands(cursor, 1000, poll).await.expect("commands");
    let took = started.elapsed();
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), published[10..], "in order, each once");
    assert!(took < poll / 2, "the first call waited {took:?} of its {poll:?} poll for deliveries that never came");
}
