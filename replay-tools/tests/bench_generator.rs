//! The replay benchmark measures nothing unless its generated log is a real one: these tests keep the generator from
//! rotting as the domain changes. A small log (2,000 outcomes) must verify with every outcome decided again equal,
//! its rebuilt projection must equal a fresh fold in memory, and decided again at other log times (as the JetStream
//! load does with the server's) it must come out with the same decisions.

use leasehold_log::export::{Entry, Reader};
use leasehold_log::{CommandRecord, StoredOutcome};
use leasehold_projector::Projector;
use leasehold_replay::bench::{GenConfig, Generated, Writers, decide_again, generate, rebuild_entries, verify_entries};
use leasehold_schemas::Timestamp;

const PARTITIONS: u32 = 4;
const OUTCOMES: u64 = 2_000;

async fn generated(dir: &std::path::Path) -> (std::path::PathBuf, Generated) {
    let file = dir.join("generated.lhexport");
    let config = GenConfig {
        outcomes: OUTCOMES,
        partitions: PARTITIONS,
        agents_per_partition: 3,
        resources_per_agent: 3,
        seed: 7,
        start: Timestamp(1_800_000_000_000),
        ms_per_command: None,
        horizon: None,
    };
    let made = generate(&config, &file).await.expect("the generator makes its log");
    (file, made)
}

async fn reader(file: &std::path::Path) -> Reader<tokio::fs::File> {
    let (reader, header) = Reader::open(tokio::fs::File::open(file).await.unwrap()).await.unwrap();
    assert_eq!((header.partitions, header.to_seq), (PARTITIONS, OUTCOMES));
    reader
}

async fn entries(file: &std::path::Path) -> Vec<Entry> {
    let mut reader = reader(file).await;
    let mut entries = Vec::new();
    while let Some(entry) = reader.next().await.unwrap() {
        entries.push(entry);
    }
    entries
}

#[tokio::test]
async fn the_generated_log_verifies_with_every_outcome_decided_again() {
    let dir = tempfile::tempdir().unwrap();
    let (file, made) = generated(dir.path()).await;
    assert_eq!((made.commands, made.outcomes), (OUTCOMES, OUTCOMES), "one outcome per command");
    assert!(made.effects > made.outcomes, "every outcome holds an effect, some more: {made:?}");
    for step in [
        "agent.register",
        "op.allocate",
        "op.acquire",
        "agent.report-created",
        "op.release-lease",
        "op.pause",
        "op.unpause",
        "op.update",
        "op.release",
        "agent.sync",
    ] {
        assert!(made.types.get(step).is_some_and(|n| *n > 0), "no {step} in {:?}", made.types);
    }

    let (report, _) = verify_entries(PARTITIONS, reader(&file).await.into_stream()).await.unwrap();
    assert_eq!(report.failure, None, "{report:?}");
    assert_eq!((report.outcomes, report.commands), (OUTCOMES, OUTCOMES));
    assert_eq!(report.redecided.count, OUTCOMES, "every outcome decided again and equal: {report:?}");
    assert_eq!((report.without_outcome, report.undecided, report.dead_letters), (0, 0, 0));
}

#[tokio::test]
async fn its_rebuilt_projection_equals_a_fresh_fold() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = generated(dir.path()).await;
    let (rebuilt, applied, _) =
        rebuild_entries(PARTITIONS, &dir.path().join("projection"), reader(&file).await.into_stream()).await.unwrap();
    assert_eq!(applied, OUTCOMES);

    let outcomes = outcomes_of(&file).await;
    let mut fresh = Projector::in_memory(PARTITIONS).unwrap();
    fresh.apply_batch(&outcomes).unwrap();
    assert_eq!(rebuilt, fresh.digests().unwrap());
    let empty = Projector::in_memory(PARTITIONS).unwrap().digests().unwrap();
    assert_ne!(rebuilt.get("resources"), empty.get("resources"), "the projection holds the generated resources");
}

/// What the JetStream load relies on: the server stamps other times, and the decisions stay the same (the tokens
/// and epochs the generated commands carry are still right).
#[tokio::test]
async fn decided_again_at_other_log_times_it_is_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let (file, made) = generated(dir.path()).await;
    let mut writers = Writers::new(PARTITIONS);
    let mut n = 0;
    for entry in entries(&file).await {
        let Entry::Command { partition, record } = entry else { continue };
        // Later, and uneven: a server's clock an hour on, with gaps.
        let time = Timestamp(record.time.0 + 3_600_000 + (record.seq % 7) * 250 + record.seq * 3);
        let record = CommandRecord { time, ..record };
        let parts = decide_again(&mut writers, partition, &record).expect("the same decisions at other times");
        n += parts.len() as u64;
    }
    assert_eq!((n, writers.effects), (made.outcomes, made.effects));
}

/// `rebuild`'s bulk path, committed in many small chunks (reads of records written chunks before, records
/// removed from an index in a later chunk), gives every table the digest an incremental projection of the same
/// log gives, the timeline index and the counts by state included: folded on one thread, and with the partitions
/// dealt out to several (three, unevenly: each keeps its own buffers, and the counts are added up at each chunk's
/// end).
#[tokio::test]
async fn a_bulk_rebuild_in_chunks_equals_an_incremental_projection() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = generated(dir.path()).await;
    let outcomes = outcomes_of(&file).await;

    let mut incremental = Projector::open(&dir.path().join("incremental"), PARTITIONS).unwrap();
    for batch in outcomes.chunks(leasehold_projector::MAX_BATCH) {
        incremental.apply_batch(batch).unwrap();
    }
    let want = incremental.digests().unwrap();
    assert!(want.contains_key("timeline") && want.contains_key("counts"), "{want:?}");
    for threads in [1, 3] {
        let path = dir.path().join(format!("bulk-{threads}"));
        let mut bulk =
            Projector::open(&path, PARTITIONS).unwrap().into_bulk().unwrap().with_chunk(150).with_threads(threads);
        for (i, batch) in outcomes.chunks(64).enumerate() {
            // Bodies decoded by the caller, and by the threads that fold them.
            if i % 2 == 0 {
                let decoded = batch.iter().map(leasehold_projector::decode).collect();
                bulk.apply(batch, decoded, &std::collections::BTreeMap::new()).unwrap();
            } else {
                bulk.apply_encoded(batch, &std::collections::BTreeMap::new()).unwrap();
            }
        }
        let bulk = bulk.finish().unwrap();

        let got = bulk.digests().unwrap();
        assert_eq!(got, want, "every table's digest, folded on {threads} thread(s)");
        assert_eq!((bulk.applied(), incremental.applied()), (OUTCOMES, OUTCOMES));
        // The partitions' states come back from the threads: the projector follows the log from there.
        assert!(bulk.states() == incremental.states(), "the partition states, folded on {threads} thread(s)");
        // What the bulk path committed is what a projector opened on it reads.
        drop(bulk);
        let reopened = leasehold_projector::recorded(&path).unwrap().expect("a projection");
        assert_eq!((reopened.applied, &reopened.digests), (OUTCOMES, &want));
    }
}

/// The outcomes of the export file at `file`, in order.
async fn outcomes_of(file: &std::path::Path) -> Vec<StoredOutcome> {
    entries(file)
        .await
        .into_iter()
        .filter_map(|e| match e {
            Entry::Outcome(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// A horizon the domain refuses (under a minute), or a pace of the clock that runs it past the end of time, ends the
/// generator with an error, not a panic (nor, built for release, a clock that wraps round).
#[tokio::test]
async fn the_generator_refuses_a_horizon_or_a_pace_the_log_cannot_have() {
    let dir = tempfile::tempdir().unwrap();
    let config = GenConfig {
        outcomes: 50,
        partitions: PARTITIONS,
        agents_per_partition: 1,
        resources_per_agent: 1,
        seed: 7,
        start: Timestamp(1_800_000_000_000),
        ms_per_command: Some(1_000),
        horizon: Some(leasehold_schemas::ids::Millis(59_999)),
    };
    let short = generate(&config, &dir.path().join("short.lhexport")).await.expect_err("a horizon under a minute");
    assert!(short.to_string().contains("horizon"), "{short}");
    let far = GenConfig { ms_per_command: Some(u64::MAX), horizon: None, ..config };
    let far = generate(&far, &dir.path().join("far.lhexport")).await.expect_err("a clock past the end of time");
    assert!(far.to_string().contains("--ms-per-command"), "{far}");
    // At the limits, a log is made.
    let fine =
        GenConfig { ms_per_command: Some(60_000), horizon: Some(leasehold_schemas::ids::Millis(60_000)), ..config };
    generate(&fine, &dir.path().join("fine.lhexport")).await.expect("a log over several horizons");
}
