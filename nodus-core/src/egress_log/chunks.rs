//! How a run's egress log lies in the store: a head document (named after the run's uid)
//! holding the counts and the newest records, and full chunks of [`CHUNK_RECORDS`] records
//! each (named `UID.1`, `UID.2`, …) that are written once and never again. An append rewrites
//! the head alone, or, when the head fills a chunk, writes that chunk and then the head: it
//! costs what it appends plus at most one chunk, whether the log holds ten records or ten
//! thousand. What an append writes is decided by the pure [`appended`]; [`append`] carries it
//! out.
//!
//! A log written before chunks (every record in the head) reads the same, and its first
//! append moves its records into chunks.

use serde::{Deserialize, Serialize};

use super::{EgressLog, MAX_RECORDS_KEPT, egress_log_key};
use crate::egress::{EgressCounts, EgressRecord};
use crate::resource::Kind;
use crate::store::{self, ObjectKey, Store};

/// The records of one chunk document: an append rewrites at most this many besides its own.
pub const CHUNK_RECORDS: usize = 200;

// Every kept record lies in a full chunk once the log is full.
const _: () = assert!(MAX_RECORDS_KEPT.is_multiple_of(CHUNK_RECORDS));

/// How often an append that met another writer's append (a version conflict) starts again
/// before it fails.
const CONFLICTS: u32 = 8;

/// Where chunk `index` (from 1) of the egress log of run `run_uid` is kept.
pub fn chunk_key(run_uid: &str, index: u32) -> ObjectKey {
    ObjectKey::new(
        crate::ledger::SYSTEM_PROJECT,
        Kind::EgressLog,
        format!("{run_uid}.{index}"),
    )
}

/// The head document of a run's log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Head {
    /// Every connection, kept or not.
    #[serde(default)]
    pub counts: EgressCounts,
    /// The records after the last full chunk, oldest first (fewer than [`CHUNK_RECORDS`]
    /// once an append has written it).
    #[serde(default)]
    pub records: Vec<EgressRecord>,
    /// Connections counted whose records were not kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub records_dropped: u64,
    /// The full chunks written, `UID.1` to `UID.{chunks}`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunks: u32,
}

fn is_zero<N: Default + PartialEq>(n: &N) -> bool {
    *n == N::default()
}

/// A full chunk document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// [`CHUNK_RECORDS`] records, oldest first.
    pub records: Vec<EgressRecord>,
}

/// What appending a batch to a log writes: the chunks it fills (each by its index), then the
/// head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The chunks filled, in order.
    pub chunks: Vec<(u32, Chunk)>,
    /// The head afterwards.
    pub head: Head,
}

/// What appending `batch` to the log whose head is `head` writes: counts added, records kept
/// while the log holds fewer than [`MAX_RECORDS_KEPT`] (the rest counted as dropped), and
/// every full chunk's worth of the head's records moved into a chunk of its own.
pub fn appended(head: Head, batch: EgressLog) -> Appended {
    let mut open = EgressLog {
        counts: head.counts,
        records: head.records,
        records_dropped: head.records_dropped,
    };
    let in_chunks = head.chunks as usize * CHUNK_RECORDS;
    open.extend(batch, MAX_RECORDS_KEPT.saturating_sub(in_chunks));
    let full = open.records.len() / CHUNK_RECORDS;
    let rest = open.records.split_off(full * CHUNK_RECORDS);
    let mut filled = std::mem::replace(&mut open.records, rest).into_iter();
    let mut chunks = Vec::with_capacity(full);
    let mut index = head.chunks;
    for _ in 0..full {
        index += 1;
        let records = filled.by_ref().take(CHUNK_RECORDS).collect();
        chunks.push((index, Chunk { records }));
    }
    Appended {
        chunks,
        head: Head {
            counts: open.counts,
            records: open.records,
            records_dropped: open.records_dropped,
            chunks: index,
        },
    }
}

fn encode<T: Serialize>(value: &T) -> Result<serde_json::Value, store::Error> {
    serde_json::to_value(value).map_err(|e| store::Error::Invalid(format!("an egress log: {e}")))
}

fn decode<T: for<'de> Deserialize<'de>>(record: &store::Record) -> Result<T, store::Error> {
    serde_json::from_value(record.document.clone())
        .map_err(|e| store::Error::Corrupt(format!("{}: {e}", record.key)))
}

/// The head of run `run_uid`'s log and its version (none: the run has no log yet).
async fn head(store: &dyn Store, run_uid: &str) -> Result<Option<(Head, u64)>, store::Error> {
    match store.get(&egress_log_key(run_uid)).await {
        Ok(record) => Ok(Some((decode(&record)?, record.version))),
        Err(store::Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `document` at `key`, whatever is there: a chunk left by an append that failed
/// before its head was written is overwritten by the next.
async fn put(
    store: &dyn Store,
    key: &ObjectKey,
    document: serde_json::Value,
) -> Result<(), store::Error> {
    match store.create(key, document.clone()).await {
        Err(store::Error::AlreadyExists(_)) => {
            let stored = store.get(key).await?;
            store
                .update(key, stored.version, document)
                .await
                .map(|_| ())
        }
        other => other.map(|_| ()),
    }
}

/// Appends `batch` to the log of run `run_uid` (made by the first batch). One writer appends
/// to a run's log at a time (the journal's one writer task per run); an append that meets
/// another one's head write starts again on it, a few times.
pub async fn append(
    store: &dyn Store,
    run_uid: &str,
    batch: &EgressLog,
) -> Result<(), store::Error> {
    let key = egress_log_key(run_uid);
    let mut conflicts = 0;
    loop {
        let (stored, version) = match head(store, run_uid).await? {
            Some((head, version)) => (head, Some(version)),
            None => (Head::default(), None),
        };
        let Appended { chunks, head } = appended(stored, batch.clone());
        for (index, chunk) in &chunks {
            put(store, &chunk_key(run_uid, *index), encode(chunk)?).await?;
        }
        let document = encode(&head)?;
        let written = match version {
            Some(version) => store.update(&key, version, document).await,
            None => store.create(&key, document).await,
        };
        match written {
            Ok(_) => return Ok(()),
            Err(store::Error::Conflict { .. } | store::Error::AlreadyExists(_))
                if conflicts < CONFLICTS =>
            {
                conflicts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The egress log of run `run_uid` as stored (an empty one when the run has none).
pub async fn read(store: &dyn Store, run_uid: &str) -> Result<EgressLog, store::Error> {
    let Some((head, _)) = head(store, run_uid).await? else {
        return Ok(EgressLog::default());
    };
    let mut records = Vec::with_capacity(head.chunks as usize * CHUNK_RECORDS + head.records.len());
    for index in 1..=head.chunks {
        let key = chunk_key(run_uid, index);
        let chunk: Chunk = match store.get(&key).await {
            Ok(record) => decode(&record)?,
            Err(store::Error::NotFound(_)) => {
                return Err(store::Error::Corrupt(format!(
                    "{key}: chunk {index} of {} of the egress log of run {run_uid} is missing",
                    head.chunks
                )));
            }
            Err(e) => return Err(e),
        };
        records.extend(chunk.records);
    }
    records.extend(head.records);
    Ok(EgressLog {
        counts: head.counts,
        records,
        records_dropped: head.records_dropped,
    })
}

/// The documents that hold run `run_uid`'s log, its chunks first and its head last (none
/// when it has no log): what deleting the run, or sweeping its payloads, deletes.
pub async fn stored_keys(store: &dyn Store, run_uid: &str) -> Result<Vec<ObjectKey>, store::Error> {
    let Some((head, _)) = head(store, run_uid).await? else {
        return Ok(Vec::new());
    };
    let mut keys: Vec<ObjectKey> = (1..=head.chunks)
        .map(|index| chunk_key(run_uid, index))
        .collect();
    keys.push(egress_log_key(run_uid));
    Ok(keys)
}

/// Deletes run `run_uid`'s log, its chunks first: should it stop halfway, the head is still
/// there to delete the rest by.
pub async fn delete(store: &dyn Store, run_uid: &str) -> Result<(), store::Error> {
    for key in stored_keys(store, run_uid).await? {
        match store.delete(&key).await {
            Ok(()) | Err(store::Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn record(n: usize) -> EgressRecord {
        EgressRecord {
            time: "2026-12-01T00:00:00Z".into(),
            host: format!("h{n}.test"),
            port: 443,
            address: None,
            verdict: if n.is_multiple_of(3) {
                "refused"
            } else {
                "allowed"
            }
            .into(),
            rule: "r".into(),
            bytes_out: n as u64,
            bytes_in: 1,
            duration_ms: 1,
        }
    }

    fn batch(from: usize, count: usize) -> EgressLog {
        let mut batch = EgressLog::default();
        for n in from..from + count {
            batch.push(record(n), MAX_RECORDS_KEPT);
        }
        batch
    }

    #[test]
    fn an_append_fills_chunks_and_keeps_the_rest_in_the_head() {
        let c = CHUNK_RECORDS;
        let full = MAX_RECORDS_KEPT / c;
        // (chunks and head records before, batch size): chunks written (their indexes),
        // chunks and head records after, records dropped.
        type Case = ((u32, usize, usize), (Vec<u32>, u32, usize, u64));
        let cases: Vec<Case> = vec![
            ((0, 0, 1), (vec![], 0, 1, 0)),
            ((0, c - 1, 1), (vec![1], 1, 0, 0)),
            ((3, c - 1, 2), (vec![4], 4, 1, 0)),
            ((0, 0, 2 * c + 5), (vec![1, 2], 2, 5, 0)),
            // A log from before chunks: its records move into chunks at its first append.
            ((0, 3 * c + 1, 1), (vec![1, 2, 3], 3, 2, 0)),
            // A full log keeps no more records, and writes only its head.
            (
                (full as u32 - 1, c - 1, 3),
                (vec![full as u32], full as u32, 0, 2),
            ),
            ((full as u32, 0, 7), (vec![], full as u32, 0, 7)),
        ];
        for ((chunks, in_head, size), (written, chunks_after, head_after, dropped)) in cases {
            let head = Head {
                records: (0..in_head).map(record).collect(),
                chunks,
                ..Head::default()
            };
            let appended = appended(head, batch(in_head, size));
            let case = (chunks, in_head, size);
            let indexes: Vec<u32> = appended.chunks.iter().map(|(i, _)| *i).collect();
            assert_eq!(indexes, written, "{case:?}");
            assert!(
                appended
                    .chunks
                    .iter()
                    .all(|(_, chunk)| chunk.records.len() == c),
                "{case:?}: every chunk written is full"
            );
            assert_eq!(appended.head.chunks, chunks_after, "{case:?}");
            assert_eq!(appended.head.records.len(), head_after, "{case:?}");
            assert_eq!(appended.head.records_dropped, dropped, "{case:?}");
            // Every connection of the batch is counted, kept or not.
            assert_eq!(
                appended.head.counts.allowed + appended.head.counts.refused,
                size as u64,
                "{case:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_log_appended_one_record_at_a_time_reads_back_whole_and_deletes_whole() {
        let store = MemoryStore::new();
        let total = 3 * CHUNK_RECORDS + 17;
        let mut expected = EgressLog::default();
        for n in 0..total {
            append(&store, "uid-1", &batch(n, 1)).await.expect("append");
            expected.push(record(n), MAX_RECORDS_KEPT);
        }
        append(&store, "uid-2", &batch(0, 1))
            .await
            .expect("another run");
        assert_eq!(read(&store, "uid-1").await, Ok(expected));
        // The head holds fewer records than a chunk; each chunk exactly one chunk's worth.
        let head = store.get(&egress_log_key("uid-1")).await.expect("head");
        assert_eq!(head.document["chunks"], 3);
        assert_eq!(head.document["records"].as_array().map(Vec::len), Some(17));
        let keys = stored_keys(&store, "uid-1").await.expect("keys");
        assert_eq!(
            keys,
            [
                chunk_key("uid-1", 1),
                chunk_key("uid-1", 2),
                chunk_key("uid-1", 3),
                egress_log_key("uid-1")
            ]
        );
        delete(&store, "uid-1").await.expect("delete");
        for key in keys {
            assert!(
                matches!(store.get(&key).await, Err(store::Error::NotFound(_))),
                "{key}"
            );
        }
        assert_eq!(read(&store, "uid-1").await, Ok(EgressLog::default()));
        assert_eq!(
            read(&store, "uid-2").await.map(|log| log.records.len()),
            Ok(1)
        );
    }

    #[tokio::test]
    async fn a_log_written_whole_before_chunks_reads_the_same_and_goes_on() {
        let store = MemoryStore::new();
        let old = batch(0, 2 * CHUNK_RECORDS + 3);
        let document = serde_json::to_value(&old).expect("json");
        store
            .create(&egress_log_key("uid"), document)
            .await
            .expect("an old log");
        assert_eq!(read(&store, "uid").await, Ok(old.clone()));
        append(&store, "uid", &batch(old.records.len(), 1))
            .await
            .expect("append");
        let log = read(&store, "uid").await.expect("read");
        assert_eq!(log.records.len(), 2 * CHUNK_RECORDS + 4);
        assert_eq!(log.records[..old.records.len()], old.records[..]);
        assert_eq!(stored_keys(&store, "uid").await.map(|k| k.len()), Ok(3));
    }

    #[tokio::test]
    async fn a_chunk_left_by_a_failed_append_is_written_over() {
        let store = MemoryStore::new();
        // An append that wrote chunk 1 and died before its head.
        let stray = Chunk {
            records: (100..100 + CHUNK_RECORDS).map(record).collect(),
        };
        store
            .create(
                &chunk_key("uid", 1),
                serde_json::to_value(&stray).expect("json"),
            )
            .await
            .expect("a stray chunk");
        append(&store, "uid", &batch(0, CHUNK_RECORDS))
            .await
            .expect("append");
        let log = read(&store, "uid").await.expect("read");
        assert_eq!(log.records, batch(0, CHUNK_RECORDS).records);
    }

    #[tokio::test]
    async fn a_missing_chunk_is_an_error_that_names_it() {
        let store = MemoryStore::new();
        append(&store, "uid", &batch(0, 2 * CHUNK_RECORDS))
            .await
            .expect("append");
        store.delete(&chunk_key("uid", 2)).await.expect("delete");
        match read(&store, "uid").await {
            Err(store::Error::Corrupt(message)) => {
                assert!(message.contains("chunk 2 of 2"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
