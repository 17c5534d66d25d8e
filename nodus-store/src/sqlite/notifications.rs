//! Change notification: an in-process channel. A write announces its changes after its
//! commit, while it still holds the writer connection, so that they arrive in commit order; a
//! second process on the same file would not see them.

use nodus_core::store::Change;
use tokio::sync::broadcast;

use super::SqliteStore;

impl SqliteStore {
    /// Changes from now on.
    pub(super) fn changes(&self) -> broadcast::Receiver<Change> {
        self.inner.db.changes().subscribe()
    }
}
