//! A write transaction that owns the change notifications it announces, as Postgres's
//! `WriteTx`: they go out after the commit, while the writer connection is still held (it is
//! borrowed from its holder), so that they arrive in commit order; dropped without
//! [`commit`](WriteTx::commit), it rolls back and announces nothing.

use std::ops::{Deref, DerefMut};

use nodus_core::store::{Change, Error};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Sqlite, Transaction};
use tokio::sync::broadcast;

use super::SqliteStore;
use crate::sql::map_err;

/// An open write transaction on the writer connection with the changes it will announce.
pub(super) struct WriteTx<'c> {
    tx: Transaction<'c, Sqlite>,
    changes: broadcast::Sender<Change>,
    pending: Vec<Change>,
}

impl WriteTx<'_> {
    /// Announce `change` when this transaction commits.
    pub(super) fn announce(&mut self, change: Change) {
        self.pending.push(change);
    }

    /// Commit, then announce every change, in the order announced.
    pub(super) async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await.map_err(map_err)?;
        for change in self.pending {
            let _ = self.changes.send(change);
        }
        Ok(())
    }
}

impl Deref for WriteTx<'_> {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for WriteTx<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl SqliteStore {
    /// Begin a write transaction on `conn`, the writer connection
    /// ([`SqliteStore::write_connection`]), held until the changes are announced.
    pub(super) async fn write<'c>(
        &self,
        conn: &'c mut PoolConnection<Sqlite>,
    ) -> Result<WriteTx<'c>, Error> {
        Ok(WriteTx {
            tx: conn.begin().await.map_err(map_err)?,
            changes: self.inner.changes.clone(),
            pending: Vec::new(),
        })
    }
}
