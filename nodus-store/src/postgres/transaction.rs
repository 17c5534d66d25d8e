//! A write transaction that owns the change notifications it announces: they go out with the
//! commit, and [`WriteTx::commit`] returns once this store heard them, so that a subscriber
//! made after a write returned never sees that write.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use nodus_core::store::{Change, Error};
use sqlx::postgres::PgConnection;
use sqlx::{Postgres, Transaction};

use super::PostgresStore;
use super::notifications::{Hearing, Notifier};
use crate::sql::map_err;

/// An open write transaction with the notifications it will send; dropped without
/// [`commit`](WriteTx::commit), it rolls back and sends nothing.
pub(super) struct WriteTx {
    tx: Transaction<'static, Postgres>,
    notifier: Arc<Notifier>,
    pending: Vec<Hearing>,
}

impl WriteTx {
    /// Announce `change` when this transaction commits.
    pub(super) async fn announce(&mut self, change: &Change) -> Result<(), Error> {
        let hearing = self.notifier.announce(&mut self.tx, change).await?;
        self.pending.push(hearing);
        Ok(())
    }

    /// Commit, then wait until this store heard every change announced.
    pub(super) async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await.map_err(map_err)?;
        for hearing in self.pending {
            hearing.wait().await;
        }
        Ok(())
    }
}

impl Deref for WriteTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl PostgresStore {
    /// Begin a write transaction on the pool.
    pub(super) async fn write(&self) -> Result<WriteTx, Error> {
        WriteTx::begin(&self.inner.pool, &self.inner.notifier).await
    }
}

impl WriteTx {
    /// Begin a write transaction on `pool` that announces through `notifier`.
    pub(super) async fn begin(
        pool: &sqlx::PgPool,
        notifier: &Arc<Notifier>,
    ) -> Result<WriteTx, Error> {
        Ok(WriteTx {
            tx: pool.begin().await.map_err(map_err)?,
            notifier: Arc::clone(notifier),
            pending: Vec::new(),
        })
    }
}
