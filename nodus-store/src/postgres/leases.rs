//! Run leases: a claim, a renewal and a release are each one conditional statement on the
//! run's lease row, so two replicas never both hold a run, and each claim makes a new fence.

use jiff::Timestamp;
use nodus_core::store::{Error, Fence, Lease};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::PostgresStore;
use crate::sql::{self, map_err};

/// How many times a claim is tried again when a concurrent claim changed the lease between
/// reading and writing it.
const CLAIM_ATTEMPTS: usize = 16;

pub(super) async fn claim(
    store: &PostgresStore,
    run_uid: &str,
    lease: &Lease,
) -> Result<Fence, Error> {
    let expires_at = sql::nanos(lease.expires_at()?)?;
    let now = sql::nanos(lease.now)?;
    let mut conn = store.inner.pool.acquire().await.map_err(map_err)?;
    for _ in 0..CLAIM_ATTEMPTS {
        let fence: Option<i64> = sqlx::query_scalar(
            "INSERT INTO leases (run_uid, fence, owner, expires_at) VALUES ($1, 1, $2, $3) \
             ON CONFLICT (run_uid) DO UPDATE SET fence = leases.fence + 1, \
             owner = excluded.owner, expires_at = excluded.expires_at \
             WHERE leases.owner IS NULL OR leases.owner = excluded.owner \
             OR leases.expires_at <= $4 \
             RETURNING fence",
        )
        .bind(run_uid)
        .bind(&lease.owner)
        .bind(expires_at)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
        if let Some(fence) = fence {
            return Ok(Fence(sql::to_u64(fence, "a fence")?));
        }
        if let Some(refused) = leased(&mut conn, run_uid).await? {
            return Err(refused);
        }
        // Released between the two statements: try again.
    }
    Err(Error::Unavailable(format!(
        "run {run_uid}: the lease kept changing while claiming it"
    )))
}

pub(super) async fn renew(
    store: &PostgresStore,
    run_uid: &str,
    fence: Fence,
    lease: &Lease,
) -> Result<(), Error> {
    set_lease(store, run_uid, fence, Some(lease)).await
}

pub(super) async fn release(
    store: &PostgresStore,
    run_uid: &str,
    fence: Fence,
) -> Result<(), Error> {
    set_lease(store, run_uid, fence, None).await
}

/// Extend the lease that `fence` holds to `renewal`, or give it up (`None`); `Fenced`
/// once another claim took the run over.
pub(super) async fn set_lease(
    store: &PostgresStore,
    run_uid: &str,
    fence: Fence,
    renewal: Option<&Lease>,
) -> Result<(), Error> {
    let (owner, expires_at) = match renewal {
        Some(lease) => (Some(lease.owner.as_str()), sql::nanos(lease.expires_at()?)?),
        None => (None, i64::MIN),
    };
    let Some(fence) = sql::to_i64(fence.0) else {
        return Err(fenced(run_uid));
    };
    let done = sqlx::query(
        "UPDATE leases SET owner = $1, expires_at = $2 WHERE run_uid = $3 AND fence = $4",
    )
    .bind(owner)
    .bind(expires_at)
    .bind(run_uid)
    .bind(fence)
    .execute(&store.inner.pool)
    .await
    .map_err(map_err)?;
    if done.rows_affected() == 0 {
        return Err(fenced(run_uid));
    }
    Ok(())
}

/// A run's lease holder and expiry, to explain a refused claim.
async fn leased(conn: &mut PgConnection, run_uid: &str) -> Result<Option<Error>, Error> {
    let row = sqlx::query("SELECT owner, expires_at FROM leases WHERE run_uid = $1")
        .bind(run_uid)
        .fetch_optional(conn)
        .await
        .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let owner: Option<String> = row.try_get(0).map_err(map_err)?;
    let until: i64 = row.try_get(1).map_err(map_err)?;
    Ok(owner.map(|owner| Error::Leased {
        run: run_uid.to_string(),
        owner,
        until: sql::from_nanos(until).unwrap_or(Timestamp::MAX),
    }))
}

/// Check the fence of a write that names it.
pub(super) fn fenced(run_uid: &str) -> Error {
    Error::Fenced {
        run: run_uid.to_string(),
    }
}
