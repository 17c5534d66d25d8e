//! Run inboxes: a message is stored only while the run document is still at the version its
//! sender read (its version bumped in the same transaction), once per deduplication key.

use jiff::Timestamp;
use nodus_core::store::{Change, Delivery, Error, ObjectKey};
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::db::map_err;
use crate::sql;

pub(super) async fn post_message(
    store: &SqliteStore,
    run: &ObjectKey,
    expected_version: u64,
    key: Option<&str>,
    payload: &str,
    at: Timestamp,
) -> Result<Delivery, Error> {
    let (run, key, payload) = (run.clone(), key.map(str::to_string), payload.to_string());
    store
        .inner
        .db
        .write(move |tx| {
            let (current, uid): (i64, Option<String>) = tx
                .prepare_cached(
                    "SELECT version, uid FROM resources \
                     WHERE project = ?1 AND kind = ?2 AND name = ?3",
                )
                .map_err(map_err)?
                .query_row(params![run.project, run.kind.plural(), run.name], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
                .map_err(map_err)?
                .ok_or_else(|| Error::NotFound(run.clone()))?;
            let uid = sql::message_run_uid(&run, uid)?;
            if let Some(key) = &key {
                let seq: Option<i64> = tx
                    .prepare_cached("SELECT seq FROM inbox WHERE run_uid = ?1 AND message_key = ?2")
                    .map_err(map_err)?
                    .query_row(params![uid, key], |row| row.get(0))
                    .optional()
                    .map_err(map_err)?;
                if let Some(seq) = seq {
                    return Ok(Delivery::Duplicate(sql::to_u64(seq, "a message number")?));
                }
            }
            let version = sql::message_version(&run, expected_version, current)?;
            let seq: i64 = tx
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM inbox WHERE run_uid = ?1")
                .map_err(map_err)?
                .query_row(params![uid], |row| row.get(0))
                .map_err(map_err)?;
            tx.prepare_cached(
                "INSERT INTO inbox (run_uid, seq, message_key, payload, received_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(map_err)?
            .execute(params![uid, seq, key, payload, at.to_string()])
            .map_err(map_err)?;
            tx.prepare_cached(
                "UPDATE resources SET version = ?1 WHERE project = ?2 AND kind = ?3 AND name = ?4",
            )
            .map_err(map_err)?
            .execute(params![version, run.project, run.kind.plural(), run.name])
            .map_err(map_err)?;
            tx.announce(Change::Written(
                run.clone(),
                sql::to_u64(version, "a version")?,
            ));
            Ok(Delivery::Delivered(sql::to_u64(seq, "a message number")?))
        })
        .await
}
