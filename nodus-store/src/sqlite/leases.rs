//! Run leases: a claim, a renewal and a release go through the writer, each checked against
//! the run's lease row; each claim makes a new fence.

use nodus_core::store::{Error, Fence, Lease};
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use super::write::Write;
use crate::sql::{self, map_err};

/// Grant `lease` on a run inside a write transaction.
pub(super) async fn grant(
    conn: &mut SqliteConnection,
    run_uid: &str,
    lease: &Lease,
) -> Result<Fence, Error> {
    let expires_at = sql::nanos(lease.expires_at()?)?;
    let now = sql::nanos(lease.now)?;
    let row = sqlx::query("SELECT fence, owner, expires_at FROM leases WHERE run_uid = ?")
        .bind(run_uid)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    let fence = match row {
        None => 1,
        Some(row) => {
            let fence: i64 = row.try_get(0).map_err(map_err)?;
            let owner: Option<String> = row.try_get(1).map_err(map_err)?;
            let until: i64 = row.try_get(2).map_err(map_err)?;
            if let Some(owner) = owner.filter(|o| *o != lease.owner && until > now) {
                return Err(Error::Leased {
                    run: run_uid.to_string(),
                    owner,
                    until: sql::from_nanos(until)?,
                });
            }
            fence.checked_add(1).ok_or_else(|| {
                Error::Corrupt(format!("run {run_uid}: no fence is left to claim"))
            })?
        }
    };
    sqlx::query(
        "INSERT INTO leases (run_uid, fence, owner, expires_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (run_uid) DO UPDATE SET fence = excluded.fence, owner = excluded.owner, \
         expires_at = excluded.expires_at",
    )
    .bind(run_uid)
    .bind(fence)
    .bind(&lease.owner)
    .bind(expires_at)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(Fence(sql::to_u64(fence, "a fence")?))
}

/// Refuse unless `fence` is the run's latest.
pub(super) async fn check_fence(
    conn: &mut SqliteConnection,
    run_uid: &str,
    fence: Fence,
) -> Result<(), Error> {
    let latest: Option<i64> = sqlx::query_scalar("SELECT fence FROM leases WHERE run_uid = ?")
        .bind(run_uid)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    if latest.is_some() && latest == sql::to_i64(fence.0) {
        Ok(())
    } else {
        Err(Error::Fenced {
            run: run_uid.to_string(),
        })
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
