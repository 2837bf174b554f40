//! The conformance suite: what every [`Log`] backend must do, as test functions that take a fresh log. The same
//! functions run against the embedded log (`tests/embedded.rs`) and JetStream (`tests/jetstream.rs`); a behaviour
//! that differs between the two is a bug (DESIGN section 11).
//!
//! Every function panics with what it saw when the backend does not conform.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use leasehold_schemas::subjects::partition_of;

use crate::{Appended, DeadLetter, Log, OutcomeFilter, OutcomeRecord, Owner, StoredOutcome};

/// An outcome record for `key` answering command `cmd_seq`, with a payload that names it.
pub fn record(key: &str, cmd_seq: u64, part: u32) -> OutcomeRecord {
    OutcomeRecord {
        key: key.to_owned(),
        cmd_id: format!("cmd-{cmd_seq}"),
        cmd_seq,
        part,
        payload: Bytes::from(format!("{key}/{cmd_seq}/{part}")),
    }
}

/// Appends one record and insists it lands; returns its sequence.
pub async fn append_one<L: Log>(log: &L, partition: u32, fence: u64, record: OutcomeRecord) -> u64 {
    match log.append(partition, fence, std::slice::from_ref(&record)).await {
        Appended::Landed { first, last } if first == last => first,
        other => panic!("append of {record:?} under fence {fence} to partition {partition}: {other:?}"),
    }
}

/// Names of `n` agent keys that fall in `partition` of `partitions`.
pub fn keys_in(partition: u32, partitions: u32, n: usize) -> Vec<String> {
    (0..).map(|i| format!("k{i}")).filter(|k| partition_of(k, partitions) == partition).take(n).collect()
}

async fn publish<L: Log>(log: &L, key: &str, n: u64) -> u64 {
    let published = log
        .publish_command(&format!("lh.in.op.{key}._"), &format!("id-{key}-{n}"), Bytes::from(format!("{key}:{n}")))
        .await
        .expect("publish");
    assert!(!published.duplicate, "a fresh id is not a duplicate");
    published.seq
}

/// Reads every outcome matching `filter` from `from`.
pub async fn all_outcomes<L: Log>(log: &L, filter: &OutcomeFilter, from: u64) -> Vec<StoredOutcome> {
    let mut out: Vec<StoredOutcome> = Vec::new();
    let mut next = from;
    loop {
        let batch = log.read_outcomes(filter, next, 100).await.expect("read outcomes");
        let Some(last) = batch.last() else { return out };
        next = last.seq + 1;
        out.extend(batch);
    }
}

/// Commands land on their partition's subject, each partition's strictly in order, with log times that never go
/// back; outcomes of a partition come back in order with an unbroken `prev_seq` chain.
pub async fn order_per_partition<L: Log>(log: L) {
    let partitions = log.partitions();
    assert!(partitions >= 2, "the suite needs two partitions at least");
    let mut expected: BTreeMap<u32, Vec<(u64, String)>> = BTreeMap::new();
    for n in 0..30u64 {
        let key = format!("agent{}", n % 7);
        let seq = publish(&log, &key, n).await;
        expected.entry(partition_of(&key, partitions)).or_default().push((seq, key));
    }
    assert_eq!(log.last_command_seq().await.unwrap(), expected.values().map(Vec::len).sum::<usize>() as u64);
    for partition in 0..partitions {
        let mut got = Vec::new();
        let mut after = 0;
        loop {
            // Small reads, to check that reading on from a cursor neither skips nor repeats.
            let batch = log.read_commands(partition, after, 3).await.unwrap();
            let Some(last) = batch.last() else { break };
            after = last.seq;
            got.extend(batch);
        }
        let want = expected.remove(&partition).unwrap_or_default();
        assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), want.iter().map(|w| w.0).collect::<Vec<_>>());
        for (command, (_, key)) in got.iter().zip(&want) {
            assert_eq!(command.subject, format!("lh.cmd.{partition}.op.{key}._"));
            assert!(command.payload.starts_with(format!("{key}:").as_bytes()));
        }
        assert!(got.windows(2).all(|w| w[0].time <= w[1].time), "log time went back: {got:?}");
        let at = match got.first() {
            Some(first) => log.command_at(first.seq).await.unwrap(),
            None => None,
        };
        assert_eq!(at.as_ref(), got.first());
    }

    let p = 1;
    let keys = keys_in(p, partitions, 3);
    let mut fence = log.last_outcome_seq(p).await.unwrap();
    assert_eq!(fence, 0, "a new partition has no outcomes");
    for cmd_seq in 1..=9u64 {
        let key = &keys[(cmd_seq % 3) as usize];
        // Another partition's appends interleave and do not move this partition's fence.
        append_one(&log, 0, log.last_outcome_seq(0).await.unwrap(), record("other", cmd_seq, 0)).await;
        fence = append_one(&log, p, fence, record(key, cmd_seq, 0)).await;
        assert_eq!(log.last_outcome_seq(p).await.unwrap(), fence);
    }
    let outcomes = all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await;
    assert_eq!(outcomes.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), (1..=9).collect::<Vec<_>>());
    let mut prev = 0;
    for outcome in &outcomes {
        assert_eq!(outcome.prev_seq, prev, "the chain is unbroken: {outcome:?}");
        assert_eq!(outcome.partition, p);
        assert_eq!(outcome.payload, Bytes::from(format!("{}/{}/0", outcome.key, outcome.cmd_seq)));
        prev = outcome.seq;
    }
    let one_key = all_outcomes(&log, &OutcomeFilter::Key { partition: p, key: keys[0].clone() }, 1).await;
    assert_eq!(one_key.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), vec![3, 6, 9]);
    // Several records in one append land in order, each chained to the one before.
    let Appended::Landed { first, last } =
        log.append(p, fence, &[record(&keys[0], 10, 0), record(&keys[0], 10, 1), record(&keys[1], 11, 0)]).await
    else {
        panic!("a three-record append under the right fence lands")
    };
    assert_eq!(last - first, 2);
    let tail = all_outcomes(&log, &OutcomeFilter::Partition(p), first).await;
    assert_eq!(
        tail.iter().map(|o| (o.cmd_seq, o.part, o.prev_seq)).collect::<Vec<_>>(),
        vec![(10, 0, fence), (10, 1, first), (11, 0, first + 1)]
    );
}

/// A command id published twice within the window is stored once; the second answer names the first copy.
pub async fn dedupe<L: Log>(log: L) {
    let first = log.publish_command("lh.in.op.w1.x", "same-id", Bytes::from_static(b"one")).await.unwrap();
    let again = log.publish_command("lh.in.op.w1.x", "same-id", Bytes::from_static(b"two")).await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.seq, first.seq);
    let other = log.publish_command("lh.in.op.w1.x", "other-id", Bytes::from_static(b"three")).await.unwrap();
    assert!(!other.duplicate);
    let p = partition_of("w1", log.partitions());
    let stored = log.read_commands(p, 0, 10).await.unwrap();
    assert_eq!(
        stored.iter().map(|c| c.payload.clone()).collect::<Vec<_>>(),
        vec![Bytes::from_static(b"one"), Bytes::from_static(b"three")]
    );
    // A subject that no stream takes is an error, not a silent loss.
    assert!(log.publish_command("lh.cmd.0.op.w1.x", "x", Bytes::from_static(b"x")).await.is_err());
}

/// An append under a stale fence stores nothing and names the partition's last sequence; the same outcome part
/// is never stored twice.
pub async fn stale_fence_refused<L: Log>(log: L) {
    let p = 0;
    let key = &keys_in(p, log.partitions(), 1)[0];
    let first = append_one(&log, p, 0, record(key, 1, 0)).await;
    match log.append(p, 0, &[record(key, 2, 0)]).await {
        Appended::Stale { last } => assert!(last.is_none() || last == Some(first), "{last:?}"),
        other => panic!("an append under fence 0 after one landed: {other:?}"),
    }
    // The writer that retries its own landed append under the old fence is not told "landed".
    let retry = log.append(p, 0, &[record(key, 1, 0)]).await;
    assert!(matches!(retry, Appended::Stale { .. } | Appended::Unknown(_)), "{retry:?}");
    let second = append_one(&log, p, first, record(key, 2, 0)).await;
    assert!(second > first);
    let all = all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await;
    assert_eq!(all.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), vec![1, 2]);
}

/// Appenders racing with one fence: exactly one lands per round.
pub async fn concurrent_appenders<L: Log>(log: L) {
    let p = 0;
    let key = keys_in(p, log.partitions(), 1).remove(0);
    let mut fence = 0;
    for round in 1..=10u64 {
        let attempts: Vec<_> = (0..4u32)
            .map(|writer| {
                let log = log.clone();
                let record = OutcomeRecord { cmd_id: format!("w{writer}"), ..record(&key, round, 0) };
                tokio::spawn(async move { log.append(p, fence, &[record]).await })
            })
            .collect();
        let mut landed = Vec::new();
        for attempt in attempts {
            let answer = attempt.await.expect("append task");
            if let Appended::Landed { first, .. } = answer {
                landed.push(first);
            }
        }
        assert_eq!(landed.len(), 1, "round {round}: exactly one append lands under one fence, got {landed:?}");
        fence = landed[0];
        assert_eq!(log.last_outcome_seq(p).await.unwrap(), fence);
    }
    assert_eq!(all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await.len(), 10);
}

/// Appenders racing under one fence with distinct records (so distinct message ids: on a replicated stream the
/// same id would be refused by dedupe before the fence is checked), each retrying a busy answer as a writer does:
/// exactly one lands per round, and the others are told the fence is stale. Returns how many busy answers there
/// were (10164, only on a replicated stream).
pub async fn distinct_appenders<L: Log>(log: &L, partition: u32) -> u64 {
    let key = keys_in(partition, log.partitions(), 1).remove(0);
    let mut fence = log.last_outcome_seq(partition).await.expect("last outcome");
    let mut busy = 0;
    for round in 0..10u64 {
        let attempts: Vec<_> = (0..4u64)
            .map(|writer| {
                let log = log.clone();
                let record = record(&key, 1000 + round * 10 + writer, 0);
                tokio::spawn(async move {
                    let mut busy = 0;
                    loop {
                        match log.append(partition, fence, std::slice::from_ref(&record)).await {
                            Appended::Busy(_) => {
                                busy += 1;
                                // Backoff before the same append again, as a writer does.
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            answer => return (answer, busy),
                        }
                    }
                })
            })
            .collect();
        let mut landed = Vec::new();
        for attempt in attempts {
            let (answer, b) = attempt.await.expect("append task");
            busy += b;
            match answer {
                Appended::Landed { first, last } => {
                    assert_eq!(first, last);
                    landed.push(first);
                }
                Appended::Stale { last } => assert!(last.is_none_or(|last| last > fence), "round {round}: {last:?}"),
                other => panic!("round {round}: a racing append that stored nothing was answered {other:?}"),
            }
        }
        assert_eq!(landed.len(), 1, "round {round}: exactly one append lands under one fence, got {landed:?}");
        fence = landed[0];
        assert_eq!(log.last_outcome_seq(partition).await.expect("last outcome"), fence);
    }
    let all = all_outcomes(log, &OutcomeFilter::Partition(partition), 1).await;
    assert_eq!(all.len(), 10, "one outcome per round: {all:?}");
    busy
}

/// A follower sees every outcome of its filter exactly once and in order, including those that land while it
/// waits; after a restart (of the log, or of the follower) it follows on from where it stopped.
pub async fn follower_sees_everything_once<L, F, Fut>(log: L, restart: F)
where
    L: Log,
    F: FnOnce(L) -> Fut,
    Fut: Future<Output = L>,
{
    let partitions = log.partitions();
    let p = 1 % partitions;
    let keys = keys_in(p, partitions, 2);
    let mine = OutcomeFilter::Key { partition: p, key: keys[0].clone() };
    let mut fence = 0;
    for cmd_seq in 1..=6 {
        fence = append_one(&log, p, fence, record(&keys[(cmd_seq % 2) as usize], cmd_seq, 0)).await;
    }
    let mut follower = log.follow(mine.clone(), 1);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(next_within(&mut follower).await);
    }
    // Outcomes that land while the follower waits.
    let writer = {
        let log = log.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            let mut fence = fence;
            for cmd_seq in 7..=12 {
                fence = append_one(&log, p, fence, record(&keys[(cmd_seq % 2) as usize], cmd_seq, 0)).await;
            }
            fence
        })
    };
    for _ in 0..3 {
        seen.push(next_within(&mut follower).await);
    }
    let fence = writer.await.expect("writer");
    drop(follower);
    let last_seen = seen.last().expect("seen").seq;

    let log = restart(log).await;
    append_one(&log, p, fence, record(&keys[0], 14, 0)).await;
    let mut follower = log.follow(mine, last_seen + 1);
    seen.push(next_within(&mut follower).await);
    assert_eq!(seen.iter().map(|o| o.cmd_seq).collect::<Vec<_>>(), vec![2, 4, 6, 8, 10, 12, 14]);
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(seen.iter().all(|o| o.key == keys[0]));
    // Nothing more: the follower waits rather than repeating.
    assert!(tokio::time::timeout(Duration::from_millis(200), follower.next()).await.is_err());
}

async fn next_within(
    follower: &mut futures::stream::BoxStream<'static, Result<StoredOutcome, crate::Error>>,
) -> StoredOutcome {
    tokio::time::timeout(Duration::from_secs(10), follower.next())
        .await
        .expect("an outcome within 10 s")
        .expect("the follower goes on")
        .expect("a readable outcome")
}

/// Commands come to a partition's owner strictly in sequence from the cursor it asks from, whatever the log
/// delivered to an earlier owner and did not hear done: a new owner that asks from the cursor gets the commands
/// the old one took but never finished, before any newer ones. One owner at a time per partition.
pub async fn old_deliveries_never_skip<L: Log>(log: L) {
    let partitions = log.partitions();
    let p = 0;
    let key = keys_in(p, partitions, 1).remove(0);
    let mut seqs = Vec::new();
    for n in 0..6 {
        seqs.push(publish(&log, &key, n).await);
    }
    let mut a = log.own(p, "worker-a").await.unwrap().expect("a free partition is owned");
    assert!(log.own(p, "worker-b").await.unwrap().is_none(), "one owner at a time");
    let taken = take(&mut a, 0, 6).await;
    assert_eq!(taken, seqs);
    // A finished only the first two, then went away.
    a.done_through(seqs[1]).await.unwrap();
    a.release().await;
    for n in 6..9 {
        seqs.push(publish(&log, &key, n).await);
    }
    let mut b = own_within(&log, p, "worker-b").await;
    let got = take(&mut b, seqs[1], 7).await;
    assert_eq!(got, seqs[2..].to_vec(), "the new owner reads on from the cursor, in sequence");
    b.done_through(*seqs.last().unwrap()).await.unwrap();
    // Asking again from the cursor gives the same commands again: the cursor is the owner's, not the log's.
    let again = take(&mut b, seqs[4], 4).await;
    assert_eq!(again, seqs[5..].to_vec());
    b.release().await;
}

/// Owns `partition` as `worker`, waiting up to 30 s for the log to give it up (a pin moves after a timeout).
pub async fn own_within<L: Log>(log: &L, partition: u32, worker: &str) -> L::Owner {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(owner) = log.own(partition, worker).await.expect("own") {
            return owner;
        }
        assert!(tokio::time::Instant::now() < deadline, "{worker} could not own partition {partition} in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn take<O: Owner>(owner: &mut O, after: u64, n: usize) -> Vec<u64> {
    let mut got = Vec::new();
    let mut cursor = after;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        assert!(tokio::time::Instant::now() < deadline, "only {got:?} of {n} commands after {after} in 30 s");
        let batch = owner.next_commands(cursor, n - got.len(), Duration::from_millis(500)).await.expect("commands");
        for command in batch {
            assert!(command.seq > cursor, "commands come strictly in sequence: {} after {cursor}", command.seq);
            cursor = command.seq;
            got.push(command.seq);
        }
    }
    got
}

/// A dead letter is stored once per source sequence, with its raw bytes, its reason and its command id: the one its
/// payload names (verified), else the message id its command was published under (unverified), kept when its
/// bytes are not.
pub async fn dead_letters<L: Log>(log: L) {
    let letter = DeadLetter {
        partition: 0,
        source_seq: 7,
        source_subject: "lh.cmd.0.op.w1._".to_owned(),
        reason: "malformed: bad JSON".to_owned(),
        payload: Bytes::from_static(b"\x00garbage"),
        command_id: None,
    };
    log.dead_letter(letter.clone()).await.unwrap();
    log.dead_letter(letter.clone()).await.unwrap();
    let other = DeadLetter { source_seq: 9, reason: "trailing bytes".to_owned(), ..letter.clone() };
    log.dead_letter(other.clone()).await.unwrap();
    let stored = log.read_dead_letters(1, 10).await.unwrap();
    assert_eq!(stored.into_iter().map(|(_, l)| l).collect::<Vec<_>>(), vec![letter, other]);

    // Commands as a producer stores them: garbage under the command id it meant; a payload whose header names its
    // id, under another message id (the payload is the truth), whole and without its bytes; garbage under a
    // message id that cannot be an id; garbage without a message id anyone would read as one.
    const ID: &str = "019b76da-abe8-7001-8000-000000000001";
    const NAMED: &str = "019b76da-abe8-7001-8000-000000000002";
    let named = format!(r#"{{"schema_version":1,"command_id":"{NAMED}","body":{{"cut"#);
    let publish = |msg_id: String, payload: Vec<u8>| {
        let log = log.clone();
        async move {
            let seq = log.publish_command("lh.in.op.w1._", &msg_id, payload.into()).await.unwrap().seq;
            log.command_at(seq).await.unwrap().expect("the command just published")
        }
    };
    let records = [
        publish(ID.to_owned(), b"\x02not a command".to_vec()).await,
        publish("producer-1".to_owned(), named.clone().into_bytes()).await,
        publish("producer-2".to_owned(), named.into_bytes()).await,
        publish("x".repeat(300), b"\x02junk".to_vec()).await,
    ];
    let partition = records[0].subject.split('.').nth(2).unwrap().parse().unwrap();
    let letters: Vec<DeadLetter> =
        records.iter().map(|record| DeadLetter::of(partition, record, "unknown format".to_owned())).collect();
    assert_eq!(letters[0].command_id, None, "garbage names no id: the log adds the producer's");
    log.dead_letter(letters[0].clone()).await.unwrap();
    log.dead_letter(letters[1].clone()).await.unwrap();
    log.dead_letter(letters[2].without_bytes("too large for the dead letters")).await.unwrap();
    log.dead_letter(letters[3].clone()).await.unwrap();
    let stored: Vec<DeadLetter> = log.read_dead_letters(3, 10).await.unwrap().into_iter().map(|(_, l)| l).collect();
    let ids: Vec<Option<crate::LetterId>> = stored.iter().map(|l| l.command_id.clone()).collect();
    let id = |id: &str, verified| Some(crate::LetterId { id: id.to_owned(), verified });
    assert_eq!(ids, vec![id(ID, false), id(NAMED, true), id(NAMED, true), None], "{stored:?}");
    assert_eq!(stored[0].payload, records[0].payload, "the bytes are kept");
    assert!(stored[2].payload.is_empty() && stored[2].reason.contains("are not kept here"), "{:?}", stored[2]);
}

/// The latest snapshot of a partition replaces the one before; partitions keep their own.
pub async fn snapshots<L: Log>(log: L) {
    assert_eq!(log.latest_snapshot(0).await.unwrap(), None);
    let first = crate::Snapshot {
        partition: 0,
        decider_version: 1,
        fence: 10,
        last_command: Some("cmd-a".to_owned()),
        state: Bytes::from(vec![7u8; 3 << 20]),
    };
    log.put_snapshot(first.clone()).await.unwrap();
    assert_eq!(log.latest_snapshot(0).await.unwrap().as_ref(), Some(&first), "a snapshot larger than a message");
    let second = crate::Snapshot { fence: 20, last_command: None, state: Bytes::from_static(b"state"), ..first };
    log.put_snapshot(second.clone()).await.unwrap();
    assert_eq!(log.latest_snapshot(0).await.unwrap(), Some(second));
    assert_eq!(log.latest_snapshot(1).await.unwrap(), None);
}

/// Checks that `outcomes` (one partition's, in order) form an unbroken chain from `fence`; returns the last sequence.
fn check_chain(outcomes: &[StoredOutcome], fence: u64) -> u64 {
    let mut prev = fence;
    for outcome in outcomes {
        assert_eq!(outcome.prev_seq, prev, "the chain is unbroken: {outcome:?}");
        prev = outcome.seq;
    }
    prev
}

/// An append of several records (a group commit) lands whole, contiguously, with the chain unbroken, or not at all:
/// under a stale fence, with one record already stored, or with more records than an append takes, nothing of it
/// is stored. Batches of one partition stay contiguous while another partition appends at the same time.
pub async fn batches_land_whole_or_not_at_all<L: Log>(log: L) {
    let (p, q) = (0, 1);
    let keys = keys_in(p, log.partitions(), 3);
    let batch = |from: u64, n: u64| -> Vec<OutcomeRecord> {
        // A decision in parts (cmd `from` in three parts), then one part per command, across three keys.
        (0..n)
            .map(|i| {
                let (cmd_seq, part) = if i < 3 { (from, i as u32) } else { (from + i - 2, 0) };
                record(&keys[(i % 3) as usize], cmd_seq, part)
            })
            .collect()
    };
    let first_batch = batch(1, 5);
    let Appended::Landed { first, last } = log.append(p, 0, &first_batch).await else {
        panic!("a batch under the right fence lands");
    };
    assert_eq!(last - first, 4, "a batch lands contiguously");
    let stored = all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await;
    assert_eq!(
        stored.iter().map(|o| (o.key.clone(), o.cmd_seq, o.part)).collect::<Vec<_>>(),
        first_batch.iter().map(|r| (r.key.clone(), r.cmd_seq, r.part)).collect::<Vec<_>>()
    );
    assert_eq!(
        stored.iter().map(|o| o.payload.clone()).collect::<Vec<_>>(),
        first_batch.iter().map(|r| r.payload.clone()).collect::<Vec<_>>()
    );
    assert_eq!(check_chain(&stored, 0), last);

    // A stale fence stores nothing, and says where the partition is.
    match log.append(p, 0, &batch(10, 4)).await {
        Appended::Stale { last: named } => assert!(named.is_none() || named == Some(last), "{named:?}"),
        other => panic!("a batch under a stale fence: {other:?}"),
    }
    // One record already stored (a batch retried after a lost answer): nothing of it is stored.
    let mut overlapping = batch(10, 3);
    overlapping.push(first_batch[4].clone());
    let answer = log.append(p, last, &overlapping).await;
    assert!(!matches!(answer, Appended::Landed { .. }), "a batch with a stored record must not land: {answer:?}");
    // More records than an append takes: nothing is sent.
    let too_many: Vec<_> = (0..=crate::MAX_APPEND_RECORDS as u64).map(|i| record(&keys[0], 100 + i, 0)).collect();
    let answer = log.append(p, last, &too_many).await;
    assert!(!matches!(answer, Appended::Landed { .. }), "{answer:?}");
    assert_eq!(all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await.len(), 5, "refused batches store nothing");
    assert_eq!(log.last_outcome_seq(p).await.unwrap(), last);

    // Batches of p and single appends of q at the same time: each partition's chain stays unbroken.
    let other = log.clone();
    let q_key = keys_in(q, log.partitions(), 1).remove(0);
    let singles = tokio::spawn(async move {
        let mut fence = 0;
        for n in 1..=60 {
            fence = append_one(&other, q, fence, record(&q_key, n, 0)).await;
        }
    });
    let mut fence = last;
    for round in 0..6u64 {
        let records = batch(1000 + round * 200, 150);
        match log.append(p, fence, &records).await {
            Appended::Landed { first, last } => {
                assert_eq!(last - first, 149, "round {round}: a batch lands contiguously");
                fence = last;
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    singles.await.expect("the single appends");
    let full: Vec<_> = (0..crate::MAX_APPEND_RECORDS as u64).map(|i| record(&keys[1], 5000 + i, 0)).collect();
    let Appended::Landed { first, last } = log.append(p, fence, &full).await else { panic!("a full batch lands") };
    assert_eq!(last + 1 - first, crate::MAX_APPEND_RECORDS as u64);
    let stored = all_outcomes(&log, &OutcomeFilter::Partition(p), 1).await;
    assert_eq!(stored.len(), 5 + 6 * 150 + crate::MAX_APPEND_RECORDS);
    assert_eq!(check_chain(&stored, 0), last);
    let stored_q = all_outcomes(&log, &OutcomeFilter::Partition(q), 1).await;
    assert_eq!(stored_q.len(), 60);
    check_chain(&stored_q, 0);
    // A follower of everything sees each partition's chain unbroken too, in one order.
    let everything = all_outcomes(&log, &OutcomeFilter::All, 1).await;
    let of = |partition: u32| everything.iter().filter(|o| o.partition == partition).cloned().collect::<Vec<_>>();
    assert_eq!(of(p), stored);
    assert_eq!(of(q), stored_q);
    // A follower (an agent follows its key, the projector everything) sees batched outcomes one by one, in order,
    // exactly as they read back.
    for filter in [OutcomeFilter::Key { partition: p, key: keys[1].clone() }, OutcomeFilter::All] {
        let expected: Vec<StoredOutcome> =
            everything.iter().filter(|o| filter.matches(o.partition, &o.key)).cloned().collect();
        let mut follow = log.follow(filter.clone(), 1);
        let mut seen = Vec::new();
        while seen.len() < expected.len() {
            let next = tokio::time::timeout(Duration::from_secs(10), follow.next())
                .await
                .unwrap_or_else(|_| {
                    panic!("{filter:?}: {} of {} outcomes followed in 10 s", seen.len(), expected.len())
                })
                .expect("the follow goes on")
                .expect("an outcome");
            seen.push(next);
        }
        assert_eq!(seen, expected, "{filter:?}");
    }
}

/// Commands published together are each answered as if published alone, in order: stored in the order given, a
/// duplicate (of an earlier command, or of one earlier in the same batch) names the first copy and does not keep
/// the others from being stored, a bad subject is refused alone.
pub async fn publish_commands_answers_each<L: Log>(log: L) {
    let key = &keys_in(1, log.partitions(), 1)[0];
    let first = publish(&log, key, 0).await;
    let command = |subject: String, id: &str| crate::Publish {
        subject,
        msg_id: id.to_owned(),
        payload: Bytes::from(format!("{id}@{key}")),
    };
    let subject = format!("lh.in.op.{key}._");
    let batch = vec![
        command(subject.clone(), "b-1"),
        command(subject.clone(), &format!("id-{key}-0")),
        command("lh.in.op".to_owned(), "b-bad"),
        command(subject.clone(), "b-2"),
        command(subject.clone(), "b-1"),
    ];
    let answers = log.publish_commands(&batch).await;
    assert_eq!(answers.len(), 5, "{answers:?}");
    let seq = |i: usize| match &answers[i] {
        Ok(published) => *published,
        Err(e) => panic!("command {i}: {e}"),
    };
    assert!(!seq(0).duplicate && seq(0).seq > first);
    assert_eq!(seq(1), crate::Published { seq: first, duplicate: true }, "a duplicate names the first copy");
    assert!(matches!(answers[2], Err(crate::Error::Refused(_))), "{:?}", answers[2]);
    assert!(!seq(3).duplicate && seq(3).seq > seq(0).seq, "stored in the order given");
    assert_eq!(seq(4), crate::Published { seq: seq(0).seq, duplicate: true }, "a duplicate within the batch");
    let stored = log.read_commands(1, first, 10).await.expect("read commands");
    assert_eq!(
        stored.iter().map(|c| (c.seq, c.payload.clone())).collect::<Vec<_>>(),
        vec![(seq(0).seq, batch[0].payload.clone()), (seq(3).seq, batch[3].payload.clone())]
    );
    assert!(log.publish_commands(&[]).await.is_empty());

    // A batch of fresh commands over every partition: each answer names where its own command is (on JetStream the
    // sequences come from one batch's acknowledgement; `tests/batch_limits.rs` checks the batch itself).
    let fresh: Vec<_> = (0..300).map(|i| command(format!("lh.in.op.k{}._", i % 11), &format!("fresh-{i}"))).collect();
    let answers = log.publish_commands(&fresh).await;
    let mut seqs = Vec::new();
    for (command, answer) in fresh.iter().zip(&answers) {
        let published = answer.as_ref().expect("a fresh command is stored");
        assert!(!published.duplicate);
        let stored = log.command_at(published.seq).await.expect("read").expect("stored");
        assert_eq!(stored.payload, command.payload, "the answer names the command's own sequence");
        seqs.push(published.seq);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "stored in the order given");
}
