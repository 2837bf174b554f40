//! The tables a batch writes to: each redb table as it is ([`Tab::Direct`], the projector following the log), or
//! behind a buffer in memory ([`Tab::Buffered`], a bulk rebuild) that keeps the chunk's last write of every key and
//! writes them all, in key order, when the chunk ends ([`flush`]). A bulk rebuild writes one chunk while it folds
//! the next: a read then sees the chunk's own writes, then the chunk's being written, then the tables as last
//! committed.
//!
//! Both give the same content for the same writes: the fold that writes goes through the same code either way, and
//! a read sees the buffer's write of a key before the table's. A bulk rebuild gains in that a record written many
//! times within a chunk (a resource's through its life, the counts, the chain) is written once, and each table's rows
//! go in as one sorted run.

use std::collections::HashMap;

use redb::{Key, ReadableTable, Value};

/// A chunk's writes to one table: key bytes -> the value's bytes, or `None` once removed.
pub(crate) type Pending = HashMap<Vec<u8>, Option<Vec<u8>>>;

/// A chunk's rows of a table whose rows are only ever added, each once (the outcomes by command, the timeline): no
/// key is looked up, so they are kept in the order written, and sorted when the chunk is written. Their bytes go
/// end to end in one buffer, which keeps its room from chunk to chunk: the bulk of a chunk's writes (every outcome
/// in JSON) costs no allocation of its own, and no memory handed back and taken again.
#[derive(Default)]
pub(crate) struct Rows {
    bytes: Vec<u8>,
    /// Each row's start in `bytes`, its key's length and its value's.
    rows: Vec<(usize, usize, usize)>,
}

impl Rows {
    fn push(&mut self, key: &[u8], value: &[u8]) {
        self.rows.push((self.bytes.len(), key.len(), value.len()));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
    }

    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.rows.iter().map(|&(start, key, value)| {
            let (key, rest) = self.bytes[start..].split_at(key);
            (key, &rest[..value])
        })
    }

    /// Empties the rows, keeping their room.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.rows.clear();
    }
}

/// A table only ever added to, of a write transaction, written directly or into a chunk's [`Rows`]. It has no
/// reads: a fold never reads what it adds there.
pub(crate) enum AddOnly<'t, K: Key + 'static, V: Value + 'static> {
    Direct(redb::Table<'t, K, V>),
    Buffered(&'t mut Rows),
}

impl<K: Key + 'static, V: Value + 'static> AddOnly<'_, K, V> {
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<(), redb::StorageError> {
        match self {
            AddOnly::Direct(table) => table.insert(key, value).map(drop),
            AddOnly::Buffered(rows) => {
                rows.push(K::as_bytes(key.borrow()).as_ref(), V::as_bytes(value.borrow()).as_ref());
                Ok(())
            }
        }
    }
}

/// A table of a write transaction, written directly or through a chunk's buffer.
pub(crate) enum Tab<'t, K: Key + 'static, V: Value + 'static> {
    Direct(redb::Table<'t, K, V>),
    Buffered { table: redb::ReadOnlyTable<K, V>, previous: Option<&'t Pending>, pending: &'t mut Pending },
}

/// A value read from a [`Tab`]: from the table, or from the buffer.
pub(crate) enum Got<'a, V: Value + 'static> {
    Stored(redb::AccessGuard<'a, V>),
    Pending(&'a [u8]),
}

impl<V: Value + 'static> Got<'_, V> {
    pub(crate) fn value(&self) -> V::SelfType<'_> {
        match self {
            Got::Stored(guard) => guard.value(),
            Got::Pending(bytes) => V::from_bytes(bytes),
        }
    }
}

impl<'t, K: Key + 'static, V: Value + 'static> Tab<'t, K, V> {
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<(), redb::StorageError> {
        match self {
            Tab::Direct(table) => table.insert(key, value).map(drop),
            Tab::Buffered { pending, .. } => {
                put::<K, V>(pending, key, value);
                Ok(())
            }
        }
    }

    pub(crate) fn remove<'k>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> Result<(), redb::StorageError> {
        match self {
            Tab::Direct(table) => table.remove(key).map(drop),
            Tab::Buffered { pending, .. } => {
                pending.insert(K::as_bytes(key.borrow()).as_ref().to_vec(), None);
                Ok(())
            }
        }
    }

    pub(crate) fn get<'k>(
        &self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> Result<Option<Got<'_, V>>, redb::StorageError> {
        match self {
            Tab::Direct(table) => Ok(table.get(key)?.map(Got::Stored)),
            Tab::Buffered { table, previous, pending } => {
                let bytes = K::as_bytes(key.borrow());
                let bytes = bytes.as_ref();
                match pending.get(bytes).or_else(|| previous.and_then(|previous| previous.get(bytes))) {
                    Some(Some(value)) => Ok(Some(Got::Pending(value))),
                    Some(None) => Ok(None),
                    None => Ok(table.get(key.borrow())?.map(Got::Stored)),
                }
            }
        }
    }
}

/// Writes `key` -> `value` of a table of keys `K` and values `V` into a chunk's buffer of it.
pub(crate) fn put<'k, 'v, K: Key + 'static, V: Value + 'static>(
    pending: &mut Pending,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    value: impl std::borrow::Borrow<V::SelfType<'v>>,
) {
    let key = K::as_bytes(key.borrow());
    let value = V::as_bytes(value.borrow());
    // A record written again within the chunk (a resource through its life, the counts, the chain) takes the place
    // of its last write, in the same allocation where it fits.
    match pending.get_mut(key.as_ref()) {
        Some(Some(held)) => {
            held.clear();
            held.extend_from_slice(value.as_ref());
        }
        Some(held) => *held = Some(value.as_ref().to_vec()),
        None => {
            pending.insert(key.as_ref().to_vec(), Some(value.as_ref().to_vec()));
        }
    }
}

/// Writes a chunk's buffers of one table (one per thread of the fold: their keys differ) into it, in the table's
/// key order (one sorted run).
pub(crate) fn flush<'p, K: Key + 'static, V: Value + 'static>(
    table: &mut redb::Table<'_, K, V>,
    buffers: impl Iterator<Item = &'p Pending>,
) -> Result<(), redb::StorageError> {
    let mut rows: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = buffers.flat_map(|pending| pending.iter()).collect();
    rows.sort_unstable_by(|(a, _), (b, _)| K::compare(a, b));
    for (key, value) in rows {
        match value {
            Some(value) => {
                table.insert(K::from_bytes(key), V::from_bytes(value))?;
            }
            None => {
                table.remove(K::from_bytes(key))?;
            }
        }
    }
    Ok(())
}

/// Writes a chunk's rows of a table only added to (one [`Rows`] per thread of the fold: their keys differ) into it,
/// in the table's key order (one sorted run). A key added twice keeps its last row, as a table written in turn would.
pub(crate) fn flush_rows<'r, K: Key + 'static, V: Value + 'static>(
    table: &mut redb::Table<'_, K, V>,
    buffers: impl Iterator<Item = &'r Rows>,
) -> Result<(), redb::StorageError> {
    let mut rows: Vec<(&[u8], &[u8])> = buffers.flat_map(Rows::iter).collect();
    // Stable: of a key added twice (by one thread, so in its order), the last row goes in last.
    rows.sort_by(|(a, _), (b, _)| K::compare(a, b));
    for (key, value) in rows {
        table.insert(K::from_bytes(key), V::from_bytes(value))?;
    }
    Ok(())
}
