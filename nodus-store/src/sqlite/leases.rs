//! Run leases: a claim, a renewal and a release go through the writer, each checked against
//! the run's lease row; each claim makes a new fence.

use nodus_core::store::{Error, Fence, Lease};
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::db::map_err;
use super::write::Write;
use crate::sql;

/// Grant `lease` on a run inside a write transaction: one statement when it is granted (the
/// row made, or taken with its fence bumped where nobody else holds an unexpired lease), a
/// second to say why only when it is refused.
pub(super) fn grant(conn: &Connection, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
    let expires_at = sql::nanos(lease.expires_at()?)?;
    let now = sql::nanos(lease.now)?;
    let granted: Option<i64> = conn
        .prepare_cached(
            "INSERT INTO leases (run_uid, fence, owner, expires_at) VALUES (?1, 1, ?2, ?3) \
         ON CONFLICT (run_uid) DO UPDATE SET fence = leases.fence + 1, owner = excluded.owner, \
         expires_at = excluded.expires_at \
         WHERE (leases.owner IS NULL OR leases.owner = excluded.owner OR leases.expires_at <= ?4) \
         AND leases.fence < 9223372036854775807 \
         RETURNING fence",
        )
        .map_err(map_err)?
        .query_row(params![run_uid, lease.owner, expires_at, now], |row| {
            row.get(0)
        })
        .optional()
        .map_err(map_err)?;
    if let Some(fence) = granted {
        return Ok(Fence(sql::to_u64(fence, "a fence")?));
    }
    // Refused: the row is there, held by another owner until later, or out of fences.
    let (owner, until): (Option<String>, i64) = conn
        .prepare_cached("SELECT owner, expires_at FROM leases WHERE run_uid = ?1")
        .map_err(map_err)?
        .query_row(params![run_uid], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(map_err)?;
    match owner.filter(|o| *o != lease.owner && until > now) {
        Some(owner) => Err(Error::Leased {
            run: run_uid.to_string(),
            owner,
            until: sql::from_nanos(until)?,
        }),
        None => Err(Error::Corrupt(format!(
            "run {run_uid}: no fence is left to claim"
        ))),
    }
}

pub(super) async fn claim(
    store: &SqliteStore,
    run_uid: &str,
    lease: &Lease,
) -> Result<Fence, Error> {
    store
        .inner
        .writes
        .write(Write::Claim {
            run: run_uid.to_string(),
            lease: lease.clone(),
        })
        .await?
        .fence()
}

pub(super) async fn renew(
    store: &SqliteStore,
    run_uid: &str,
    fence: Fence,
    lease: &Lease,
) -> Result<(), Error> {
    store
        .inner
        .writes
        .write(Write::Lease {
            run: run_uid.to_string(),
            fence,
            renewal: Some(lease.clone()),
        })
        .await
        .map(drop)
}

pub(super) async fn release(store: &SqliteStore, run_uid: &str, fence: Fence) -> Result<(), Error> {
    store
        .inner
        .writes
        .write(Write::Lease {
            run: run_uid.to_string(),
            fence,
            renewal: None,
        })
        .await
        .map(drop)
}
