//! The streams and the snapshot bucket: created when missing, checked (and upgraded to allow atomic batches) when
//! there.

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{Context, CreateStreamErrorKind, GetStreamErrorKind, ObjectStoreErrorKind};
use async_nats::jetstream::object_store::{self, ObjectStore};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType, SubjectTransform};

use leasehold_schemas::subjects::partition_transform;

use super::{
    CMD_STREAM, COMMAND_DUPLICATE_WINDOW, COMMAND_RETENTION, DEAD_LETTER_DUPLICATE_WINDOW, DLQ_STREAM, EVT_STREAM,
    OUTCOME_DUPLICATE_WINDOW, SNAPSHOT_BUCKET, unavailable,
};
use crate::Error;

/// How long a serving process waits for the server to allow atomic batches on a stream made before group commit.
const UPGRADE_WAIT: Duration = Duration::from_secs(2);

/// Creates the stream `wanted`, or checks the one there.
pub(super) async fn ensure_stream(
    js: &Context,
    wanted: stream::Config,
    upgrade: bool,
) -> Result<stream::Stream, Error> {
    let name = wanted.name.clone();
    for _ in 0..2 {
        match js.get_stream(&name).await {
            Ok(stream) => {
                let got = &stream.cached_info().config;
                check_stream(&wanted, got)?;
                if upgrade && wanted.allow_atomic_publish && !got.allow_atomic_publish {
                    return allow_atomic_batches(js, stream).await;
                }
                return Ok(stream);
            }
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                _ => return Err(unavailable(&format!("cannot read stream {name}"), e)),
            },
        }
        match js.create_stream(wanted.clone()).await {
            Ok(stream) => {
                tracing::info!(stream = %name, "created the stream");
                return Ok(stream);
            }
            // Another process created it meanwhile: check theirs.
            Err(e)
                if matches!(e.kind(), CreateStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NAME_EXIST) => {}
            Err(e) => {
                return Err(match e.kind() {
                    CreateStreamErrorKind::JetStream(js) if js.error_code() != ErrorCode::CLUSTER_NOT_AVAILABLE => {
                        Error::Refused(format!("cannot create stream {name}: {e}"))
                    }
                    _ => unavailable(&format!("cannot create stream {name}"), e),
                });
            }
        }
    }
    Err(Error::Unavailable(format!("stream {name} was created and deleted while we looked")))
}

/// Allows atomic batches on `stream`, made before group commit: an addition the server allows on a live stream,
/// and nothing else changes. A user not allowed to update streams (a worker's credentials) gets no answer at all (a
/// permission violation), so the wait is short: it goes on with the stream as it is, and the log appends one record
/// at a time (connect warns).
async fn allow_atomic_batches(js: &Context, stream: stream::Stream) -> Result<stream::Stream, Error> {
    let name = stream.cached_info().config.name.clone();
    let config = stream::Config { allow_atomic_publish: true, ..stream.cached_info().config.clone() };
    match tokio::time::timeout(UPGRADE_WAIT, js.update_stream(config)).await {
        Ok(Ok(_)) => {
            tracing::info!(stream = %name, "allowed atomic batches on the stream");
            js.get_stream(&name).await.map_err(|e| unavailable(&format!("cannot read stream {name}"), e))
        }
        Ok(Err(e)) => {
            tracing::warn!(stream = %name, error = %e, "cannot allow atomic batches on the stream");
            Ok(stream)
        }
        Err(_) => {
            tracing::warn!(stream = %name, "no answer in {UPGRADE_WAIT:?} to allowing atomic batches (no permission?)");
            Ok(stream)
        }
    }
}

/// The partition and replica counts of the log on this server, read from `LH_CMD`'s transform; refused when there
/// is no log yet (only `serve` creates one, with the partition count it is told).
pub(super) async fn existing_log(js: &Context) -> Result<(u32, usize), Error> {
    let stream = match js.get_stream(CMD_STREAM).await {
        Ok(stream) => stream,
        Err(e) => {
            return Err(match e.kind() {
                GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => Error::Refused(
                    "there is no leasehold log on this NATS server yet: `leasehold serve --nats URL` creates it"
                        .to_owned(),
                ),
                _ => unavailable(&format!("cannot read stream {CMD_STREAM}"), e),
            });
        }
    };
    let config = &stream.cached_info().config;
    let partitions = config
        .subject_transform
        .as_ref()
        .and_then(|t| t.destination.split_once("partition(")?.1.split_once(',')?.0.parse::<u32>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            Error::Refused(format!("stream {CMD_STREAM} has no partition transform: it is not leasehold's"))
        })?;
    Ok((partitions, config.num_replicas.max(1)))
}

/// The snapshot bucket, created when missing.
pub(super) async fn snapshot_bucket(js: &Context, replicas: usize) -> Result<ObjectStore, Error> {
    match js.get_object_store(SNAPSHOT_BUCKET).await {
        Ok(store) => return Ok(store),
        Err(e) if e.kind() == ObjectStoreErrorKind::GetStore => {}
        Err(e) => return Err(unavailable("cannot open the snapshot bucket", e)),
    }
    let config = object_store::Config {
        bucket: SNAPSHOT_BUCKET.to_owned(),
        description: Some("leasehold: the latest snapshot of each partition".to_owned()),
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    match js.create_object_store(config).await {
        Ok(store) => Ok(store),
        // Another process created it meanwhile.
        Err(_) => {
            js.get_object_store(SNAPSHOT_BUCKET).await.map_err(|e| unavailable("cannot create the snapshot bucket", e))
        }
    }
}

pub(super) fn snapshot_object(partition: u32) -> String {
    format!("partition-{partition}")
}

/// What the three streams share: limits retention on file, direct gets, the replica count.
fn stream_config(name: &str, subjects: &str, duplicate_window: Duration, replicas: usize) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![subjects.to_owned()],
        retention: RetentionPolicy::Limits,
        storage: StorageType::File,
        duplicate_window,
        allow_direct: true,
        num_replicas: replicas,
        ..Default::default()
    }
}

pub(super) fn cmd_stream_config(partitions: u32, replicas: usize) -> stream::Config {
    let (source, destination) = partition_transform(partitions);
    stream::Config {
        // Batched ingest: commands published together are one atomic batch (one fsync, every sequence known).
        allow_atomic_publish: true,
        subject_transform: Some(SubjectTransform { source: source.clone(), destination }),
        max_age: COMMAND_RETENTION,
        deny_delete: true,
        deny_purge: true,
        ..stream_config(CMD_STREAM, &source, COMMAND_DUPLICATE_WINDOW, replicas)
    }
}

pub(super) fn evt_stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        deny_delete: true,
        deny_purge: true,
        // Group commit: a writer's appends of several records are ADR-50 atomic batches.
        allow_atomic_publish: true,
        ..stream_config(EVT_STREAM, "lh.evt.>", OUTCOME_DUPLICATE_WINDOW, replicas)
    }
}

pub(super) fn dlq_stream_config(replicas: usize) -> stream::Config {
    stream_config(DLQ_STREAM, "lh.dlq.>", DEAD_LETTER_DUPLICATE_WINDOW, replicas)
}

/// Refuses a stream that differs from what leasehold creates in anything leasehold set.
fn check_stream(wanted: &stream::Config, got: &stream::Config) -> Result<(), Error> {
    let name = &wanted.name;
    if wanted.subject_transform != got.subject_transform {
        let count = |t: &Option<SubjectTransform>| {
            t.as_ref().and_then(|t| t.destination.split_once("partition(")?.1.split_once(',')?.0.parse::<u32>().ok())
        };
        if let (Some(theirs), Some(ours)) = (count(&got.subject_transform), count(&wanted.subject_transform)) {
            return Err(Error::Refused(format!(
                "stream {name} was created for {theirs} partitions, not {ours}: the partition count is fixed when \
                 the log is created"
            )));
        }
    }
    let mut differences = Vec::new();
    let mut differ = |field: &str, theirs: String, ours: String| {
        if theirs != ours {
            differences.push(format!("{field} is {theirs}, leasehold needs {ours}"));
        }
    };
    differ("subjects", format!("{:?}", got.subjects), format!("{:?}", wanted.subjects));
    differ(
        "subject_transform",
        format!("{:?}", got.subject_transform.as_ref().map(|t| (&t.source, &t.destination))),
        format!("{:?}", wanted.subject_transform.as_ref().map(|t| (&t.source, &t.destination))),
    );
    differ("retention", format!("{:?}", got.retention), format!("{:?}", wanted.retention));
    differ("storage", format!("{:?}", got.storage), format!("{:?}", wanted.storage));
    differ("max_age", format!("{:?}", got.max_age), format!("{:?}", wanted.max_age));
    differ("deny_delete", got.deny_delete.to_string(), wanted.deny_delete.to_string());
    differ("deny_purge", got.deny_purge.to_string(), wanted.deny_purge.to_string());
    differ("duplicate_window", format!("{:?}", got.duplicate_window), format!("{:?}", wanted.duplicate_window));
    differ("allow_direct", got.allow_direct.to_string(), wanted.allow_direct.to_string());
    differ("num_replicas", got.num_replicas.to_string(), wanted.num_replicas.to_string());
    if differences.is_empty() {
        Ok(())
    } else {
        Err(Error::Refused(format!(
            "stream {name} is not as leasehold creates it: {}; change it back or remove it",
            differences.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_partition_count_is_named() {
        let err = check_stream(&cmd_stream_config(8, 1), &cmd_stream_config(4, 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stream LH_CMD was created for 4 partitions, not 8: the partition count is fixed when the log is created"
        );
        let err = check_stream(&evt_stream_config(3), &evt_stream_config(1)).unwrap_err();
        assert!(err.to_string().contains("num_replicas is 1, leasehold needs 3"), "{err}");
        check_stream(&dlq_stream_config(1), &dlq_stream_config(1)).unwrap();
    }
}
