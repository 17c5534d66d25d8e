//! Run inboxes: a message is stored only while the run document is still at the version its
//! sender read (its version bumped in the same transaction), once per deduplication key.

use jiff::Timestamp;
use nodus_core::store::{Change, Delivery, Error, ObjectKey};
use sqlx::Row;

use super::SqliteStore;
use crate::sql::{self, map_err};

pub(super) async fn post_message(
    store: &SqliteStore,
    run: &ObjectKey,
    expected_version: u64,
    key: Option<&str>,
    payload: &str,
    at: Timestamp,
) -> Result<Delivery, Error> {
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
    let row = sqlx::query(
        "SELECT version, uid FROM resources WHERE project = ? AND kind = ? AND name = ?",
    )
    .bind(&run.project)
    .bind(run.kind.plural())
    .bind(&run.name)
    .fetch_optional(&mut *tx)
    .await
    .map_err(map_err)?
    .ok_or_else(|| Error::NotFound(run.clone()))?;
    let current: i64 = row.try_get(0).map_err(map_err)?;
    let uid: Option<String> = row.try_get(1).map_err(map_err)?;
    let uid = sql::message_run_uid(run, uid)?;
    if let Some(key) = key {
        let seq: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM inbox WHERE run_uid = ? AND message_key = ?")
                .bind(&uid)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
        if let Some(seq) = seq {
            return Ok(Delivery::Duplicate(sql::to_u64(seq, "a message number")?));
        }
    }
    let version = sql::message_version(run, expected_version, current)?;
    let seq: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM inbox WHERE run_uid = ?")
            .bind(&uid)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
    sqlx::query(
        "INSERT INTO inbox (run_uid, seq, message_key, payload, received_at) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(&uid)
    .bind(seq)
    .bind(key)
    .bind(payload)
    .bind(at.to_string())
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    sqlx::query("UPDATE resources SET version = ? WHERE project = ? AND kind = ? AND name = ?")
        .bind(version)
        .bind(&run.project)
        .bind(run.kind.plural())
        .bind(&run.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    tx.announce(Change::Written(
        run.clone(),
        sql::to_u64(version, "a version")?,
    ));
    tx.commit().await?;
    drop(conn);
    Ok(Delivery::Delivered(sql::to_u64(seq, "a message number")?))
}
