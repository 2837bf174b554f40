//! The export file and its import, on real embedded logs in temporary directories: a round trip gives every record
//! back at its sequence, `--to` cuts the log at an outcome, a writer goes on after an import, and a damaged, cut or
//! misplaced import is refused and leaves nothing behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use leasehold_log::conformance::{append_one, keys_in, record};
use leasehold_log::embedded::Embedded;
use leasehold_log::export::{self, Entry, FORMAT_VERSION, FrameKind, Header, Reader, Trailer, Writer};
use leasehold_log::jetstream::{JetStream, JetStreamConfig};
use leasehold_log::nats_server::NatsServer;
use leasehold_log::{Appended, CommandRecord, DeadLetter, Error, LetterId, Log, OutcomeFilter, StoredOutcome};
use leasehold_schemas::command::Heartbeat;
use leasehold_schemas::subjects::{ingress_subject_of, partition_of};
use leasehold_schemas::{AgentName, CommandId, Envelope, Issuer, Position, Timestamp, codec};

const PARTITIONS: u32 = 4;
const DECIDER_VERSION: u32 = 7;

/// A log with something of everything: raw commands on three keys of each partition and two real heartbeats,
/// a duplicate publish, decisions of one part, of two parts in one append and of two parts in two appends, commands
/// no outcome answers (in the middle of partitions and at their ends), and dead letters.
async fn source(dir: &Path) -> (Embedded, Vec<Envelope>) {
    let log = Embedded::open(dir, PARTITIONS).expect("open the source log");
    let heartbeats = fill(&log).await;
    (log, heartbeats)
}

async fn fill<L: Log>(log: &L) -> Vec<Envelope> {
    let keys: Vec<String> = (0..PARTITIONS).flat_map(|p| keys_in(p, PARTITIONS, 3)).collect();
    for n in 0..30u64 {
        let key = &keys[(n * 7 % keys.len() as u64) as usize];
        let published = log
            .publish_command(&format!("lh.in.op.{key}._"), &format!("id-{n}"), Bytes::from(format!("{key}:{n}")))
            .await
            .expect("publish");
        assert!(!published.duplicate);
    }
    assert!(log.publish_command("lh.in.op.k0._", "id-3", Bytes::from_static(b"again")).await.unwrap().duplicate);
    let mut heartbeats = Vec::new();
    for agent in ["w1", "w2"] {
        let envelope = Envelope::new(
            CommandId::generate(),
            Issuer::new(agent).unwrap(),
            Timestamp(1),
            Heartbeat { agent: AgentName::new(agent).unwrap(), epoch: Position(1) },
        );
        let payload = codec::encode_command(&envelope).unwrap();
        log.publish_command(&ingress_subject_of(&envelope.body), &envelope.command_id.to_string(), payload.into())
            .await
            .expect("publish a heartbeat");
        heartbeats.push(envelope);
    }

    // Decide in command order, as writers would, leaving some commands unanswered.
    let last = log.last_command_seq().await.unwrap();
    for seq in 1..=last - 3 {
        let command = log.command_at(seq).await.unwrap().expect("a command");
        let partition: u32 = command.subject.split('.').nth(2).unwrap().parse().unwrap();
        let key = command.subject.split('.').nth(4).unwrap().to_owned();
        let fence = log.last_outcome_seq(partition).await.unwrap();
        match seq % 6 {
            0 => {}
            1 => {
                // Garbage: the log adds the id it was published under (`id-N`), unverified.
                log.dead_letter(DeadLetter::of(partition, &command, format!("command {seq} is garbage")))
                    .await
                    .expect("dead letter");
            }
            2 => {
                let Appended::Landed { .. } =
                    log.append(partition, fence, &[record(&key, seq, 0), record(&key, seq, 1)]).await
                else {
                    panic!("two parts land")
                };
            }
            3 => {
                let first = append_one(log, partition, fence, record(&key, seq, 0)).await;
                append_one(log, partition, first, record(&key, seq, 1)).await;
            }
            _ => {
                append_one(log, partition, fence, record(&key, seq, 0)).await;
            }
        }
    }
    heartbeats
}

/// Everything a reader of a log can see, to compare two logs.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    last_command_seq: u64,
    last_outcome_seq: Vec<u64>,
    commands: Vec<Vec<CommandRecord>>,
    command_at: Vec<Option<CommandRecord>>,
    outcomes: Vec<StoredOutcome>,
    by_partition: Vec<Vec<StoredOutcome>>,
    by_key: BTreeMap<(u32, String), Vec<u64>>,
    dead_letters: Vec<(u64, DeadLetter)>,
}

async fn seen<L: Log>(log: &L) -> Seen {
    let last_command_seq = log.last_command_seq().await.unwrap();
    let mut last_outcome_seq = Vec::new();
    let mut commands = Vec::new();
    let mut by_partition = Vec::new();
    for p in 0..log.partitions() {
        last_outcome_seq.push(log.last_outcome_seq(p).await.unwrap());
        let mut got = Vec::new();
        loop {
            let batch = log.read_commands(p, got.last().map_or(0, |c: &CommandRecord| c.seq), 7).await.unwrap();
            if batch.is_empty() {
                break;
            }
            got.extend(batch);
        }
        commands.push(got);
        by_partition.push(leasehold_log::conformance::all_outcomes(log, &OutcomeFilter::Partition(p), 1).await);
    }
    let mut command_at = Vec::new();
    for seq in 0..=last_command_seq + 1 {
        command_at.push(log.command_at(seq).await.unwrap());
    }
    let outcomes = leasehold_log::conformance::all_outcomes(log, &OutcomeFilter::All, 1).await;
    let mut by_key = BTreeMap::new();
    for (partition, key) in outcomes.iter().map(|o| (o.partition, o.key.clone())).collect::<BTreeSet<_>>() {
        let filter = OutcomeFilter::Key { partition, key: key.clone() };
        let seqs = leasehold_log::conformance::all_outcomes(log, &filter, 1).await.iter().map(|o| o.seq).collect();
        by_key.insert((partition, key), seqs);
    }
    let dead_letters = log.read_dead_letters(1, 1000).await.unwrap();
    Seen { last_command_seq, last_outcome_seq, commands, command_at, outcomes, by_partition, by_key, dead_letters }
}

async fn export_all<L: Log>(log: &L, to: Option<u64>) -> (Vec<u8>, Trailer) {
    let mut file = Vec::new();
    let trailer = export::export(log, to, DECIDER_VERSION, "embedded test", &mut file, |_| {}).await.expect("export");
    (file, trailer)
}

async fn read_all(file: &[u8]) -> Result<(Header, Vec<Entry>), Error> {
    let (mut reader, header) = Reader::open(file).await?;
    let mut entries = Vec::new();
    while let Some(entry) = reader.next().await? {
        entries.push(entry);
    }
    Ok((header, entries))
}

/// Every command comes before the first outcome answering it and before its dead letter; each partition's commands
/// and all outcomes and dead letters are in sequence.
fn assert_reader_order(entries: &[Entry]) {
    let mut commands: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut last_outcome = 0;
    let mut last_dead = 0;
    for entry in entries {
        match entry {
            Entry::Command { partition, record } => {
                let mine = commands.entry(*partition).or_default();
                assert!(mine.last().is_none_or(|last| *last < record.seq), "{entry:?} after {mine:?}");
                mine.push(record.seq);
            }
            Entry::Outcome(outcome) => {
                assert!(outcome.seq > last_outcome);
                last_outcome = outcome.seq;
                assert!(
                    commands.get(&outcome.partition).is_some_and(|c| c.contains(&outcome.cmd_seq)),
                    "{outcome:?} before its command"
                );
            }
            Entry::DeadLetter { seq, letter } => {
                assert!(*seq > last_dead);
                last_dead = *seq;
                assert!(
                    commands.get(&letter.partition).is_some_and(|c| c.contains(&letter.source_seq)),
                    "{letter:?} before its command"
                );
            }
        }
    }
}

#[tokio::test]
async fn round_trip_restores_every_record_at_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(&dir.path().join("source")).await;
    let before = seen(&log).await;
    assert!(before.dead_letters.len() >= 3 && before.outcomes.len() >= 30, "{before:?}");

    let mut progress = Vec::new();
    let mut file = Vec::new();
    let trailer = export::export(&log, None, DECIDER_VERSION, "embedded test", &mut file, |seq| progress.push(seq))
        .await
        .unwrap();
    assert_eq!(progress, before.outcomes.iter().map(|o| o.seq).collect::<Vec<_>>());
    assert_eq!(
        trailer,
        Trailer {
            commands: before.last_command_seq,
            outcomes: before.outcomes.len() as u64,
            dead_letters: before.dead_letters.len() as u64,
            last_outcome_seq: before.outcomes.last().unwrap().seq,
        }
    );
    assert!(file.starts_with(b"LHEXPORT"));
    let header_text = String::from_utf8_lossy(&file[17..200]).into_owned();
    assert!(header_text.starts_with("{\"format\":\"leasehold-export\""), "{header_text}");

    // The file holds what the walk of the log yields, in reader order.
    let (header, entries) = read_all(&file).await.unwrap();
    assert_eq!(header.format_version, FORMAT_VERSION);
    assert_eq!(header.schema_version, leasehold_schemas::SCHEMA_VERSION);
    assert_eq!(header.decider_version, DECIDER_VERSION);
    assert_eq!(header.partitions, PARTITIONS);
    assert_eq!(header.to_seq, trailer.last_outcome_seq);
    assert_eq!(header.source, "embedded test");
    let walked: Vec<Entry> = export::entries(log.clone(), None).map(Result::unwrap).collect().await;
    assert_eq!(entries, walked);
    let streamed: Vec<Entry> = Reader::open(std::io::Cursor::new(file.clone()))
        .await
        .unwrap()
        .0
        .into_stream()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(entries, streamed);
    assert_reader_order(&entries);
    // Unanswered commands at the ends of partitions are there too, after the last outcome.
    let last_outcome_at = entries.iter().rposition(|e| matches!(e, Entry::Outcome(_))).unwrap();
    assert!(entries[last_outcome_at..].iter().any(|e| matches!(e, Entry::Command { .. })));
    // Dead letters come along the way, not all at the end.
    let first_dead_at = entries.iter().position(|e| matches!(e, Entry::DeadLetter { .. })).unwrap();
    assert!(first_dead_at < last_outcome_at, "the first dead letter at {first_dead_at}");

    let target = dir.path().join("imported");
    let (imported_header, imported_trailer) = export::import(&file[..], &target).await.expect("import");
    assert_eq!((imported_header, imported_trailer), (header, trailer));
    drop(log);
    let imported = Embedded::open(&target, PARTITIONS).expect("open the imported log");
    assert_eq!(seen(&imported).await, before);
    assert!(Embedded::open(&target, PARTITIONS + 1).is_err(), "the partition count is recorded");
    // Only the data directory is left beside the source: the staging directory is gone.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["imported", "source"]);
}

#[tokio::test]
async fn raw_frames_count_what_the_trailer_says() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(dir.path()).await;
    let (file, trailer) = export_all(&log, None).await;
    let (mut reader, _) = Reader::open(&file[..]).await.unwrap();
    let mut counts = Trailer { last_outcome_seq: trailer.last_outcome_seq, ..Trailer::default() };
    while let Some((kind, frame)) = reader.next_frame().await.unwrap() {
        assert!(!frame.is_empty());
        match kind {
            FrameKind::Command => counts.commands += 1,
            FrameKind::Outcome => counts.outcomes += 1,
            FrameKind::DeadLetter => counts.dead_letters += 1,
        }
    }
    assert_eq!(counts, trailer);
    assert_eq!(reader.trailer(), Some(trailer));
    assert_eq!(reader.bytes_read(), file.len() as u64);
}

#[tokio::test]
async fn to_cuts_the_log_at_an_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(&dir.path().join("source")).await;
    let before = seen(&log).await;
    let to = before.outcomes[before.outcomes.len() / 2].seq;
    let (file, trailer) = export_all(&log, Some(to)).await;
    let (header, entries) = read_all(&file).await.unwrap();
    assert_eq!((header.to_seq, trailer.last_outcome_seq), (to, to));
    assert_reader_order(&entries);

    let target = dir.path().join("cut");
    export::import(&file[..], &target).await.expect("import");
    let cut = seen(&Embedded::open(&target, PARTITIONS).unwrap()).await;
    let outcomes: Vec<StoredOutcome> = before.outcomes.iter().filter(|o| o.seq <= to).cloned().collect();
    assert_eq!(cut.outcomes, outcomes);
    // Each partition's commands up to the last its outcomes answer, and the dead letters of those.
    let mut answered = vec![0; PARTITIONS as usize];
    for outcome in &outcomes {
        answered[outcome.partition as usize] = outcome.cmd_seq;
    }
    for (p, answered) in answered.iter().enumerate() {
        let want: Vec<CommandRecord> = before.commands[p].iter().filter(|c| c.seq <= *answered).cloned().collect();
        assert_eq!(cut.commands[p], want, "partition {p}");
        let last = outcomes.iter().rfind(|o| o.partition as usize == p).map_or(0, |o| o.seq);
        assert_eq!(cut.last_outcome_seq[p], last, "partition {p}");
    }
    let dead: Vec<(u64, DeadLetter)> =
        before.dead_letters.iter().filter(|(_, l)| l.source_seq <= answered[l.partition as usize]).cloned().collect();
    assert!(!dead.is_empty() && dead.len() < before.dead_letters.len(), "{dead:?}");
    assert_eq!(cut.dead_letters, dead);

    // A cut past the end is the whole log, less the commands no outcome answers.
    let (file, trailer) = export_all(&log, Some(u64::MAX)).await;
    assert_eq!(trailer.last_outcome_seq, before.outcomes.last().unwrap().seq);
    assert_eq!(read_all(&file).await.unwrap().0.to_seq, trailer.last_outcome_seq);
}

#[tokio::test]
async fn a_writer_goes_on_after_an_import() {
    let dir = tempfile::tempdir().unwrap();
    let (log, heartbeats) = source(&dir.path().join("source")).await;
    let (file, _) = export_all(&log, None).await;
    let before = seen(&log).await;
    let dead_before = before.dead_letters.last().unwrap().0;
    drop(log);
    let target = dir.path().join("imported");
    export::import(&file[..], &target).await.unwrap();
    let log = Embedded::open(&target, PARTITIONS).unwrap();

    // A producer retrying a command the export holds is told it is a duplicate, as the source would have said.
    let heartbeat = &heartbeats[1];
    let again = log
        .publish_command(
            &ingress_subject_of(&heartbeat.body),
            &heartbeat.command_id.to_string(),
            codec::encode_command(heartbeat).unwrap().into(),
        )
        .await
        .unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(log.command_at(again.seq).await.unwrap().unwrap().payload, codec::encode_command(heartbeat).unwrap());

    let published = log.publish_command("lh.in.op.k0._", "after-import", Bytes::from_static(b"new")).await.unwrap();
    assert_eq!(published, leasehold_log::Published { seq: before.last_command_seq + 1, duplicate: false });
    let new_time = log.command_at(published.seq).await.unwrap().unwrap().time;
    assert!(before.commands.iter().flatten().all(|c| c.time <= new_time), "log time never goes back");
    let p = partition_of("k0", PARTITIONS);
    let fence = log.last_outcome_seq(p).await.unwrap();
    assert_eq!(fence, before.last_outcome_seq[p as usize]);
    let seq = append_one(&log, p, fence, record("k0", published.seq, 0)).await;
    assert_eq!(seq, before.outcomes.last().unwrap().seq + 1);
    assert_eq!(log.read_outcomes(&OutcomeFilter::All, seq, 1).await.unwrap()[0].prev_seq, fence);
    // An outcome id the export holds is still known.
    let (cmd_seq, part) = (before.by_partition[0][0].cmd_seq, before.by_partition[0][0].part);
    let fence0 = log.last_outcome_seq(0).await.unwrap();
    assert!(matches!(log.append(0, fence0, &[record("x", cmd_seq, part)]).await, Appended::Unknown(_)));
    log.dead_letter(DeadLetter {
        partition: p,
        source_seq: published.seq,
        source_subject: "lh.cmd.x".to_owned(),
        reason: "test".to_owned(),
        payload: Bytes::new(),
        command_id: None,
    })
    .await
    .unwrap();
    assert_eq!(log.read_dead_letters(dead_before + 1, 10).await.unwrap().len(), 1);
    // A dead letter's source is still known: once per source sequence.
    let (_, first) = &before.dead_letters[0];
    log.dead_letter(first.clone()).await.unwrap();
    assert_eq!(log.read_dead_letters(1, 1000).await.unwrap().len(), before.dead_letters.len() + 1);
}

/// An export of format version 1 (a fixture written by a build of that version: its dead letters are `D` frames
/// without command ids) is read with each letter's id read from its payload, imported, and exported again in this
/// build's format with the ids.
#[tokio::test]
async fn an_export_of_format_version_1_is_read_with_the_ids_its_letters_name() {
    let file = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/export-v1-dead-letters.lhexport"))
        .expect("the fixture");
    let (header, entries) = read_all(&file).await.expect("a version 1 export is read");
    assert_eq!(header.format_version, 1);
    let letters = |entries: &[Entry]| -> Vec<(u64, u64, Option<LetterId>)> {
        entries
            .iter()
            .filter_map(|e| match e {
                Entry::DeadLetter { seq, letter } => Some((*seq, letter.source_seq, letter.command_id.clone())),
                _ => None,
            })
            .collect()
    };
    let named = Some(LetterId { id: "019b76da-abe8-7001-8000-000000000005".to_owned(), verified: true });
    assert_eq!(letters(&entries), vec![(1, 5, named), (2, 6, None)]);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("imported");
    export::import(file.as_slice(), &data).await.expect("import a version 1 export");
    let log = Embedded::open_existing(&data).unwrap();
    let stored: Vec<(u64, u64, Option<LetterId>)> = log
        .read_dead_letters(1, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|(seq, letter)| (seq, letter.source_seq, letter.command_id))
        .collect();
    assert_eq!(stored, letters(&entries));
    let (again, _) = export_all(&log, None).await;
    let (header, reexported) = read_all(&again).await.unwrap();
    assert_eq!(header.format_version, FORMAT_VERSION);
    assert_eq!(letters(&reexported), letters(&entries));
}

/// Imports `file` into a new directory of `dir` and insists it is refused and leaves nothing there.
async fn assert_refused(dir: &Path, file: &[u8], what: &str) -> String {
    let target = dir.join("target");
    let err = export::import(file, &target).await.expect_err(what);
    assert!(matches!(err, Error::Refused(_)), "{what}: {err:?}");
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "{what}: something was left behind");
    err.to_string()
}

#[tokio::test]
async fn a_damaged_file_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(dir.path()).await;
    let (file, _) = export_all(&log, None).await;
    // Every byte flipped, anywhere: the reader refuses the file.
    for at in 0..file.len() {
        let mut damaged = file.clone();
        damaged[at] ^= 0x20;
        assert!(read_all(&damaged).await.is_err(), "a flipped byte at {at} of {} went unseen", file.len());
    }
    let empty = tempfile::tempdir().unwrap();
    // The header's length and JSON, the first record's kind and length, a record's payload, the trailer's JSON, the
    // last byte.
    let first_record = 8 + 9 + u32::from_le_bytes(file[9..13].try_into().unwrap()) as usize;
    for at in [9, 25, first_record, first_record + 2, file.len() / 2, file.len() - 20, file.len() - 1] {
        let mut damaged = file.clone();
        damaged[at] ^= 0x01;
        let message = assert_refused(empty.path(), &damaged, &format!("a flipped byte at {at}")).await;
        assert!(message.contains("damaged at byte"), "{message}");
    }
    let mut damaged = file.clone();
    damaged[3] = b'x';
    assert!(assert_refused(empty.path(), &damaged, "the magic").await.contains("not a leasehold export"));
    let mut longer = file.clone();
    longer.push(0);
    assert!(assert_refused(empty.path(), &longer, "a byte after the trailer").await.contains("after the trailer"));
}

#[tokio::test]
async fn a_cut_file_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(dir.path()).await;
    let (file, _) = export_all(&log, None).await;
    for len in 0..file.len() {
        assert!(read_all(&file[..len]).await.is_err(), "a file cut at {len} of {} was taken", file.len());
    }
    let empty = tempfile::tempdir().unwrap();
    for len in [0, 4, 8, 20, file.len() / 3, file.len() / 2, file.len() - 25, file.len() - 1] {
        assert_refused(empty.path(), &file[..len], &format!("a file cut at {len}")).await;
    }
}

#[tokio::test]
async fn an_existing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(&dir.path().join("source")).await;
    let (file, _) = export_all(&log, None).await;
    let err = export::import(&file[..], &dir.path().join("source")).await.expect_err("a data directory");
    assert!(err.to_string().contains("exists"), "{err}");
    assert!(dir.path().join("source").join("log.redb").exists(), "left as it was");
    let file_there = dir.path().join("a-file");
    std::fs::write(&file_there, b"x").unwrap();
    assert!(export::import(&file[..], &file_there).await.is_err());
    assert_eq!(std::fs::read(&file_there).unwrap(), b"x");
    let err = export::import(&file[..], &dir.path().join("no-such-parent").join("data")).await.expect_err("no parent");
    assert!(err.to_string().contains("create it first"), "{err}");
    // An empty directory is refused too: an import makes its directory, so a mistyped path never lands in one that
    // something else was about to use.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = export::import(&file[..], &empty).await.expect_err("an existing directory");
    assert!(err.to_string().contains("exists"), "{err}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "left as it was");
    let fresh = dir.path().join("fresh");
    export::import(&file[..], &fresh).await.expect("a new directory");
    assert_eq!(seen(&Embedded::open(&fresh, PARTITIONS).unwrap()).await, seen(&log).await);
}

#[tokio::test]
async fn another_format_or_a_newer_version_is_refused() {
    let mut header = Header::new(DECIDER_VERSION, PARTITIONS, 0, "test");
    header.format_version = FORMAT_VERSION + 1;
    let mut file = Vec::new();
    Writer::new(&mut file, &header).await.unwrap().finish().await.unwrap();
    let err = Reader::open(&file[..]).await.expect_err("a newer version");
    assert!(err.to_string().contains("newer"), "{err}");

    header = Header::new(DECIDER_VERSION, PARTITIONS, 0, "test");
    header.format = "something-else".to_owned();
    let mut file = Vec::new();
    Writer::new(&mut file, &header).await.unwrap().finish().await.unwrap();
    assert!(Reader::open(&file[..]).await.expect_err("another format").to_string().contains("something-else"));

    // An empty log exports and imports as an empty log.
    let dir = tempfile::tempdir().unwrap();
    let log = Embedded::open(&dir.path().join("source"), PARTITIONS).unwrap();
    let (file, trailer) = export_all(&log, None).await;
    assert_eq!(trailer, Trailer::default());
    export::import(&file[..], &dir.path().join("copy")).await.unwrap();
    assert_eq!(seen(&Embedded::open(&dir.path().join("copy"), PARTITIONS).unwrap()).await, seen(&log).await);
}

#[tokio::test]
async fn the_writer_refuses_what_a_reader_would() {
    let header = Header::new(DECIDER_VERSION, PARTITIONS, 10, "test");
    let mut file = Vec::new();
    let mut writer = Writer::new(&mut file, &header).await.unwrap();
    let outcome = |seq: u64, partition: u32| {
        Entry::Outcome(StoredOutcome {
            seq,
            partition,
            key: "k".to_owned(),
            cmd_id: "c".to_owned(),
            cmd_seq: 1,
            part: 0,
            prev_seq: 0,
            payload: Bytes::new(),
        })
    };
    writer.write(&outcome(5, 0)).await.unwrap();
    assert!(writer.write(&outcome(5, 1)).await.is_err(), "not in sequence");
    assert!(writer.write(&outcome(11, 1)).await.is_err(), "past the header's end");
    assert!(writer.write(&outcome(6, PARTITIONS)).await.is_err(), "no such partition");
    writer.write(&outcome(6, 1)).await.unwrap();
    let trailer = writer.finish().await.unwrap();
    assert_eq!(trailer, Trailer { commands: 0, outcomes: 2, dead_letters: 0, last_outcome_seq: 6 });
    assert_eq!(read_all(&file).await.unwrap().1.len(), 2);
}

#[tokio::test]
async fn a_jetstream_log_imports_as_an_embedded_one() {
    let Some(server) = NatsServer::start() else { return };
    let log = JetStream::connect(JetStreamConfig::new(server.url(), PARTITIONS)).await.expect("connect");
    fill(&log).await;
    let before = seen(&log).await;
    let mut file = Vec::new();
    let trailer = export::export(&log, None, DECIDER_VERSION, server.url(), &mut file, |_| {}).await.unwrap();
    assert_eq!(trailer.outcomes, before.outcomes.len() as u64);
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("from-jetstream");
    let (header, _) = export::import(&file[..], &target).await.unwrap();
    assert_eq!(header.source, server.url());
    assert_eq!(seen(&Embedded::open(&target, PARTITIONS).unwrap()).await, before);
}

/// A log whose commands aged out of the source (a quiet JetStream log past `LH_CMD`'s retention) imports with the
/// outcomes only; the log then goes on after the newest command they answer, so a writer's cursor is never above
/// the command log's end (a writer refuses such a log as replaced).
#[tokio::test]
async fn a_log_without_its_aged_out_commands_goes_on_after_what_its_outcomes_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = source(&dir.path().join("source")).await;
    let (file, _) = export_all(&log, None).await;
    let before = seen(&log).await;
    drop(log);
    let (header, entries) = read_all(&file).await.unwrap();
    let answered = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Outcome(o) => Some(o.cmd_seq),
            Entry::DeadLetter { letter, .. } => Some(letter.source_seq),
            Entry::Command { .. } => None,
        })
        .max()
        .unwrap();
    let mut aged = Vec::new();
    let mut writer = Writer::new(&mut aged, &header).await.unwrap();
    for entry in entries.iter().filter(|e| !matches!(e, Entry::Command { .. })) {
        writer.write(entry).await.unwrap();
    }
    writer.finish().await.unwrap();

    let target = dir.path().join("imported");
    export::import(&aged[..], &target).await.unwrap();
    let log = Embedded::open(&target, PARTITIONS).unwrap();
    assert_eq!(log.last_command_seq().await.unwrap(), answered);
    assert!(answered <= before.last_command_seq);
    let published = log.publish_command("lh.in.op.k0._", "after-import", Bytes::from_static(b"new")).await.unwrap();
    assert_eq!(published.seq, answered + 1, "the next command comes after every one the outcomes answer");
    drop(log);
    // And so after a reopen.
    let log = Embedded::open(&target, PARTITIONS).unwrap();
    assert_eq!(log.last_command_seq().await.unwrap(), answered + 1);
}
