//! The log's raw speed, for `leasehold bench throughput`: appends with nothing of leasehold's in the way (no fence,
//! no decision), measured in the same run as leasehold's own rates so that the figures compare as ratios.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{Database, TableDefinition};

use crate::Error;

/// What a raw run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRun {
    pub appends: u64,
    pub elapsed: Duration,
}

impl RawRun {
    pub fn per_second(&self) -> f64 {
        self.appends as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

const RAW: TableDefinition<u64, (u32, &[u8])> = TableDefinition::new("raw");

/// `n` appends of `payload_len` bytes over `subjects` subjects to a scratch redb file in `dir` (removed after), one
/// durable write transaction each, as the embedded log commits an append: redb has no pipelining, a commit is the
/// unit of durability.
pub fn embedded_raw_append(dir: &Path, n: u64, subjects: u32, payload_len: usize) -> Result<RawRun, Error> {
    let path = dir.join("raw-bench.redb");
    let _ = std::fs::remove_file(&path);
    let db = Database::create(&path).map_err(|e| Error::Storage(e.to_string()))?;
    let payload = vec![0x5a_u8; payload_len];
    let start = Instant::now();
    for seq in 1..=n {
        let txn = db.begin_write().map_err(|e| Error::Storage(e.to_string()))?;
        {
            let mut table = txn.open_table(RAW).map_err(|e| Error::Storage(e.to_string()))?;
            let subject = (seq % u64::from(subjects.max(1))) as u32;
            table.insert(seq, (subject, payload.as_slice())).map_err(|e| Error::Storage(e.to_string()))?;
        }
        txn.commit().map_err(|e| Error::Storage(e.to_string()))?;
    }
    let elapsed = start.elapsed();
    drop(db);
    let _ = std::fs::remove_file(&path);
    Ok(RawRun { appends: n, elapsed })
}
