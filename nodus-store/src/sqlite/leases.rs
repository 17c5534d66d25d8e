//! Run leases: a claim, a renewal and a release go through the writer, each checked against
//! the run's lease row; each claim makes a new fence.

use nodus_core::store::{Error, Fence, Lease};
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use super::write::Write;
use crate::sql::{self, map_err};

/// Grant `lease` on a run inside a write transaction: one statement when it is granted (the
/// row made, or taken with its fence bumped where nobody else holds an unexpired lease), a
/// second to say why only when it is refused.
pub(super) async fn grant(
    conn: &mut SqliteConnection,
    run_uid: &str,
    lease: &Lease,
) -> Result<Fence, Error> {
    let expires_at = sql::nanos(lease.expires_at()?)?;
    let now = sql::nanos(lease.now)?;
    let granted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leases (run_uid, fence, owner, expires_at) VALUES (?1, 1, ?2, ?3) \
         ON CONFLICT (run_uid) DO UPDATE SET fence = leases.fence + 1, owner = excluded.owner, \
         expires_at = excluded.expires_at \
         WHERE (leases.owner IS NULL OR leases.owner = excluded.owner OR leases.expires_at <= ?4) \
         AND leases.fence < 9223372036854775807 \
         RETURNING fence",
    )
    .bind(run_uid)
    .bind(&lease.owner)
    .bind(expires_at)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    if let Some(fence) = granted {
        return Ok(Fence(sql::to_u64(fence, "a fence")?));
    }
    // Refused: the row is there, held by another owner until later, or out of fences.
    let row = sqlx::query("SELECT owner, expires_at FROM leases WHERE run_uid = ?")
        .bind(run_uid)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let owner: Option<String> = row.try_get(0).map_err(map_err)?;
    let until: i64 = row.try_get(1).map_err(map_err)?;
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
