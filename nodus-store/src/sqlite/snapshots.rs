//! Working-directory snapshots: manifests by run and step, contents once by digest, and the
//! runs that name each content, written in one transaction on the writer connection.

use nodus_core::snapshot::{Blob, Snapshot, Stored};
use nodus_core::store::{Error, check_blobs, check_stored, missing_contents};
use sqlx::sqlite::SqliteConnection;

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
        let present: Option<i64> = sqlx::query_scalar("SELECT 1 FROM blobs WHERE digest = ?")
            .bind(digest)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
        if present.is_none() {
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
    sqlx::query(
        "INSERT INTO snapshots (run_uid, seq, snapshot) VALUES (?, ?, ?) \
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

pub(super) async fn missing_blobs(
    store: &SqliteStore,
    digests: &[String],
) -> Result<Vec<String>, Error> {
    let mut missing = Vec::new();
    for digest in digests {
        let present: Option<i64> = sqlx::query_scalar("SELECT 1 FROM blobs WHERE digest = ?")
            .bind(digest)
            .fetch_optional(&store.inner.readers)
            .await
            .map_err(map_err)?;
        if present.is_none() {
            missing.push(digest.clone());
        }
    }
    Ok(missing)
}

pub(super) async fn snapshots(
    store: &SqliteStore,
    run_uid: &str,
) -> Result<Vec<(u32, Snapshot)>, Error> {
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, snapshot FROM snapshots WHERE run_uid = ? ORDER BY seq")
            .bind(run_uid)
            .fetch_all(&store.inner.readers)
            .await
            .map_err(map_err)?;
    let stored = rows
        .into_iter()
        .map(|(seq, text)| sql::read_snapshot(run_uid, seq, &text))
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(nodus_core::snapshot::resolve(stored))
}

pub(super) async fn blob(store: &SqliteStore, digest: &str) -> Result<Option<Vec<u8>>, Error> {
    sqlx::query_scalar("SELECT content FROM blobs WHERE digest = ?")
        .bind(digest)
        .fetch_optional(&store.inner.readers)
        .await
        .map_err(map_err)
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

pub(super) async fn blob_bytes(store: &SqliteStore) -> Result<u64, Error> {
    let total: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(size), 0) FROM blobs")
        .fetch_one(&store.inner.readers)
        .await
        .map_err(map_err)?;
    sql::to_u64(total, "the blobs' size")
}
