//! The conformance suite against the embedded log, on a file in a temporary directory.

use leasehold_log::conformance;
use leasehold_log::embedded::Embedded;
use leasehold_log::{DeadLetter, Error, LetterId, Log};

fn open(dir: &tempfile::TempDir) -> Embedded {
    Embedded::open(dir.path(), 4).expect("open the embedded log")
}

#[tokio::test]
async fn order_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    conformance::order_per_partition(open(&dir)).await;
}

#[tokio::test]
async fn dedupe() {
    let dir = tempfile::tempdir().unwrap();
    conformance::dedupe(open(&dir)).await;
}

#[tokio::test]
async fn stale_fence_refused() {
    let dir = tempfile::tempdir().unwrap();
    conformance::stale_fence_refused(open(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders() {
    let dir = tempfile::tempdir().unwrap();
    conformance::concurrent_appenders(open(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_appenders() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(conformance::distinct_appenders(&open(&dir), 3).await, 0, "the embedded log is never busy");
}

#[tokio::test]
async fn follower_sees_everything_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    conformance::follower_sees_everything_once(open(&dir), |log| async move {
        drop(log);
        Embedded::open(&path, 4).expect("reopen")
    })
    .await;
}

#[tokio::test]
async fn old_deliveries_never_skip() {
    let dir = tempfile::tempdir().unwrap();
    conformance::old_deliveries_never_skip(open(&dir)).await;
}

#[tokio::test]
async fn dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    conformance::dead_letters(open(&dir)).await;
}

/// A log made before dead letters kept their command ids has no `dlq_ids` table: its letters are read with the id
/// their payload's header names (verified), read-only and after an open for writing alike.
#[tokio::test]
async fn dead_letters_stored_before_ids_were_recorded_are_read_by_their_payload() {
    let dir = tempfile::tempdir().unwrap();
    let id = "019b76da-abe8-7001-8000-000000000004";
    let payload = format!(r#"{{"command_id":"{id}","body":{{"cut"#);
    {
        let log = open(&dir);
        for (seq, payload) in [(5, payload.clone().into_bytes()), (6, b"\x02garbage".to_vec())] {
            let letter = DeadLetter {
                partition: 1,
                source_seq: seq,
                source_subject: "lh.cmd.1.op.w1._".to_owned(),
                reason: "unknown format".to_owned(),
                payload: payload.into(),
                command_id: None,
            };
            log.dead_letter(letter).await.unwrap();
        }
    }
    // The table an older build did not have, dropped as if it never was.
    let db = redb::Database::open(dir.path().join(leasehold_log::embedded::FILE_NAME)).unwrap();
    let txn = db.begin_write().unwrap();
    assert!(txn.delete_table(redb::TableDefinition::<u64, (&str, bool)>::new("dlq_ids")).unwrap());
    txn.commit().unwrap();
    drop(db);

    let expected = vec![Some(LetterId { id: id.to_owned(), verified: true }), None];
    let ids = |letters: Vec<(u64, DeadLetter)>| letters.into_iter().map(|(_, l)| l.command_id).collect::<Vec<_>>();
    let read_only = Embedded::open_read_only(dir.path()).unwrap();
    assert_eq!(ids(read_only.read_dead_letters(1, 10).await.unwrap()), expected, "read-only");
    drop(read_only);
    assert_eq!(ids(open(&dir).read_dead_letters(1, 10).await.unwrap()), expected, "opened for writing");
}

#[tokio::test]
async fn the_partition_count_is_fixed_and_the_file_is_one_processs() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(&dir);
    assert_eq!(log.partitions(), 4);
    let err = Embedded::open(dir.path(), 4).unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.contains("in use by another process")), "{err}");
    drop(log);
    let err = Embedded::open(dir.path(), 8).unwrap_err();
    assert!(matches!(&err, Error::Refused(m) if m.contains("created with 4 partitions, not 8")), "{err}");
    assert_eq!(Embedded::open(dir.path(), 4).unwrap().partitions(), 4);
}

#[tokio::test]
async fn snapshots() {
    let dir = tempfile::tempdir().unwrap();
    conformance::snapshots(open(&dir)).await;
}

#[tokio::test]
async fn batches_land_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    conformance::batches_land_whole_or_not_at_all(open(&dir)).await;
}

#[tokio::test]
async fn publish_commands_answers_each() {
    let dir = tempfile::tempdir().unwrap();
    conformance::publish_commands_answers_each(open(&dir)).await;
}
