//! Working-directory snapshots: manifests by run and step, contents once by digest, and the
//! runs that name each content. Writers of snapshots hold a shared advisory lock and removers
//! an exclusive one, so that no removal takes contents a snapshot being written names.

use nodus_core::snapshot::{Blob, Stored};
use nodus_core::store::{Error, check_blobs, check_stored, missing_contents};
use sqlx::postgres::PgConnection;

use super::PostgresStore;
use super::Read;
use crate::sql::{self, map_err};

pub(super) async fn put_snapshot(
    store: &PostgresStore,
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
    let mut tx = store.write().await?;
    lock_blobs(&mut tx, false).await?;
    for blob in blobs {
        sqlx::query(
            "INSERT INTO blobs (digest, size, content) VALUES ($1, $2, $3) \
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
            "INSERT INTO snapshot_blobs (run_uid, digest) VALUES ($1, $2) \
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
    sqlx::query(
        "INSERT INTO snapshots (run_uid, seq, snapshot) VALUES ($1, $2, $3) \
         ON CONFLICT (run_uid, seq) DO UPDATE SET snapshot = excluded.snapshot",
    )
    .bind(run_uid)
    .bind(i64::from(seq))
    .bind(text)
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    tx.commit().await
}

/// The advisory lock that keeps removals of contents apart from snapshots being written
/// (shared for writers, exclusive for removers), held until `conn`'s transaction ends.
async fn lock_blobs(conn: &mut PgConnection, exclusive: bool) -> Result<(), Error> {
    let statement = if exclusive {
        "SELECT pg_advisory_xact_lock($1)"
    } else {
        "SELECT pg_advisory_xact_lock_shared($1)"
    };
    sqlx::query(statement)
        .bind(BLOB_LOCK)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// The advisory lock's key ("NodusBlb").
const BLOB_LOCK: i64 = 0x4E6F_6475_7342_6C62;

/// Remove a run's snapshots and the contents no other run names, in `conn`'s transaction.
pub(super) async fn drop_snapshots(conn: &mut PgConnection, run_uid: &str) -> Result<(), Error> {
    lock_blobs(conn, true).await?;
    for statement in [
        "DELETE FROM snapshots WHERE run_uid = $1",
        "DELETE FROM blobs WHERE digest IN \
         (SELECT digest FROM snapshot_blobs WHERE run_uid = $1) \
         AND NOT EXISTS (SELECT 1 FROM snapshot_blobs o \
         WHERE o.digest = blobs.digest AND o.run_uid <> $1)",
        "DELETE FROM snapshot_blobs WHERE run_uid = $1",
    ] {
        sqlx::query(statement)
            .bind(run_uid)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

pub(super) async fn delete_snapshots(store: &PostgresStore, run_uid: &str) -> Result<(), Error> {
    let mut tx = store.write().await?;
    drop_snapshots(&mut tx, run_uid).await?;
    tx.commit().await
}
