//! Run inboxes: a message is stored only while the run document is still at the version its
//! sender read (the document's row locked, its version bumped), once per deduplication key.

use jiff::Timestamp;
use nodus_core::store::{Change, Delivery, Error, ObjectKey};
use sqlx::Row;

use super::PostgresStore;
use crate::sql::{self, map_err};

pub(super) async fn post_message(
    store: &PostgresStore,
    run: &ObjectKey,
    expected_version: u64,
    key: Option<&str>,
    payload: &str,
    at: Timestamp,
) -> Result<Delivery, Error> {
    let mut tx = store.write().await?;
    // Locking the run's row orders messages and updates of one run.
    let row = sqlx::query(
        "SELECT version, uid FROM resources WHERE project = $1 AND kind = $2 AND name = $3 \
         FOR UPDATE",
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
            sqlx::query_scalar("SELECT seq FROM inbox WHERE run_uid = $1 AND message_key = $2")
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
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO inbox (run_uid, seq, message_key, payload, received_at) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM inbox WHERE run_uid = $1 \
         RETURNING seq",
    )
    .bind(&uid)
    .bind(key)
    .bind(payload)
    .bind(at.to_string())
    .fetch_one(&mut *tx)
    .await
    .map_err(map_err)?;
    sqlx::query("UPDATE resources SET version = $1 WHERE project = $2 AND kind = $3 AND name = $4")
        .bind(version)
        .bind(&run.project)
        .bind(run.kind.plural())
        .bind(&run.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    let version = sql::to_u64(version, "a version")?;
    tx.announce(&Change::Written(run.clone(), version)).await?;
    tx.commit().await?;
    Ok(Delivery::Delivered(sql::to_u64(seq, "a message number")?))
}
