//! Working-directory snapshots: manifests by run and step, contents once by digest, and the
//! runs that name each content, written in one transaction on the writer connection.

use nodus_core::snapshot::{Blob, Stored};
use nodus_core::store::{Error, check_blobs, check_stored, missing_contents};
use sqlx::sqlite::SqliteConnection;

use super::Read;
use super::SqliteStore;
use crate::sql::{self, map_err};

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
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
    for blob in blobs {
        sqlx::query(
            "INSERT INTO blobs (digest, size, content) VALUES (?, ?, ?) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&blob.digest)
        .bind(sql::to_i64(blob.bytes.len() as u64).unwrap_or(i64::MAX))
        .bind(&blob.bytes)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    }
    let mut missing = Vec::new();
    for digest in &named {
        if !Read::has_blob(&mut *tx, digest).await? {
            missing.push(digest.clone());
            continue;
        }
        sqlx::query(
            "INSERT INTO snapshot_blobs (run_uid, digest) VALUES (?, ?) \
             ON CONFLICT DO NOTHING",
        )
        .bind(run_uid)
        .bind(digest)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    }
    if !missing.is_empty() {
        // Dropped without a commit: rolled back.
        return Err(missing_contents(run_uid, seq, &missing));
    }
    insert_snapshot(&mut tx, run_uid, seq, &text).await?;
    tx.commit().await
}

/// Keep the record of a run's snapshot after step `seq` (replacing one kept for that step),
/// in `conn`'s transaction.
pub(super) async fn insert_snapshot(
    conn: &mut SqliteConnection,
    run_uid: &str,
    seq: u32,
    text: &str,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO snapshots (run_uid, seq, snapshot) VALUES (?, ?, ?) \
         ON CONFLICT (run_uid, seq) DO UPDATE SET snapshot = excluded.snapshot",
    )
    .bind(run_uid)
    .bind(i64::from(seq))
    .bind(text)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(())
}

/// Remove a run's snapshots and the contents no other run names, in `conn`'s transaction.
pub(super) async fn drop_snapshots(
    conn: &mut SqliteConnection,
    run_uid: &str,
) -> Result<(), Error> {
    for statement in [
        "DELETE FROM snapshots WHERE run_uid = ?1",
        "DELETE FROM blobs WHERE digest IN \
         (SELECT digest FROM snapshot_blobs WHERE run_uid = ?1) \
         AND NOT EXISTS (SELECT 1 FROM snapshot_blobs o \
         WHERE o.digest = blobs.digest AND o.run_uid <> ?1)",
        "DELETE FROM snapshot_blobs WHERE run_uid = ?1",
    ] {
        sqlx::query(statement)
            .bind(run_uid)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

pub(super) async fn delete_snapshots(store: &SqliteStore, run_uid: &str) -> Result<(), Error> {
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
    drop_snapshots(&mut tx, run_uid).await?;
    tx.commit().await
}
