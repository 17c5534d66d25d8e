//! Working-directory snapshots: manifests by run and step, contents once by digest, and the
//! runs that name each content, written in one transaction on the writer connection.

use nodus_core::snapshot::{Blob, Stored};
use nodus_core::store::{Error, check_blobs, check_stored, missing_contents};
use rusqlite::{Connection, params};

use super::SqliteStore;
use super::db::map_err;
use super::reads;
use crate::sql;

pub(super) async fn put_snapshot(
    store: &SqliteStore,
    run_uid: &str,
    seq: u32,
    snapshot: &Stored,
    blobs: &[Blob],
) -> Result<(), Error> {
    check_blobs(blobs)?;
    check_stored(seq, snapshot)?;
    let text = sql::snapshot_text(snapshot)?;
    // A delta names only its changed entries' contents: its base named the rest for this
    // run already.
    let named = snapshot.named_blobs();
    let (run_uid, blobs) = (run_uid.to_string(), blobs.to_vec());
    store
        .inner
        .db
        .write(move |tx| {
            for blob in &blobs {
                tx.prepare_cached(
                    "INSERT INTO blobs (digest, size, content) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (digest) DO NOTHING",
                )
                .map_err(map_err)?
                .execute(params![
                    blob.digest,
                    sql::to_i64(blob.bytes.len() as u64).unwrap_or(i64::MAX),
                    blob.bytes
                ])
                .map_err(map_err)?;
            }
            let mut missing = Vec::new();
            for digest in &named {
                if !reads::has_blob(tx, digest)? {
                    missing.push(digest.clone());
                    continue;
                }
                tx.prepare_cached(
                    "INSERT INTO snapshot_blobs (run_uid, digest) VALUES (?1, ?2) \
                     ON CONFLICT DO NOTHING",
                )
                .map_err(map_err)?
                .execute(params![run_uid, digest])
                .map_err(map_err)?;
            }
            if !missing.is_empty() {
                // Answered as an error: rolled back.
                return Err(missing_contents(&run_uid, seq, &missing));
            }
            insert_snapshot(tx, &run_uid, seq, &text)
        })
        .await
}

/// Keep the record of a run's snapshot after step `seq` (replacing one kept for that step),
/// in `conn`'s transaction.
pub(super) fn insert_snapshot(
    conn: &Connection,
    run_uid: &str,
    seq: u32,
    text: &str,
) -> Result<(), Error> {
    conn.prepare_cached(
        "INSERT INTO snapshots (run_uid, seq, snapshot) VALUES (?1, ?2, ?3) \
         ON CONFLICT (run_uid, seq) DO UPDATE SET snapshot = excluded.snapshot",
    )
    .map_err(map_err)?
    .execute(params![run_uid, i64::from(seq), text])
    .map_err(map_err)?;
    Ok(())
}

/// Remove a run's snapshots and the contents no other run names, in `conn`'s transaction.
pub(super) fn drop_snapshots(conn: &Connection, run_uid: &str) -> Result<(), Error> {
    for statement in [
        "DELETE FROM snapshots WHERE run_uid = ?1",
        "DELETE FROM blobs WHERE digest IN \
         (SELECT digest FROM snapshot_blobs WHERE run_uid = ?1) \
         AND NOT EXISTS (SELECT 1 FROM snapshot_blobs o \
         WHERE o.digest = blobs.digest AND o.run_uid <> ?1)",
        "DELETE FROM snapshot_blobs WHERE run_uid = ?1",
    ] {
        conn.prepare_cached(statement)
            .map_err(map_err)?
            .execute(params![run_uid])
            .map_err(map_err)?;
    }
    Ok(())
}

pub(super) async fn delete_snapshots(store: &SqliteStore, run_uid: &str) -> Result<(), Error> {
    let run_uid = run_uid.to_string();
    store
        .inner
        .db
        .write(move |tx| drop_snapshots(tx, &run_uid))
        .await
}
