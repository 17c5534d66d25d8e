//! The SQLite connections, synchronous (rusqlite): a read runs on the calling thread with a
//! reader connection taken from a small pool (opened when all are in use), a write runs on
//! the runtime's blocking pool with the one writer connection, in one transaction, and
//! announces its changes after the commit while it still holds the writer, so that they
//! arrive in commit order. A statement is a function call, not a hand-off to another thread
//! and back (what sqlx's driver did for each statement, about 40 µs of CPU apiece).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nodus_core::store::{Change, Error};
use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::broadcast;

/// How long a statement waits for a lock held by another connection.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many reader connections are kept between reads.
const READERS: usize = 4;

/// Prepared statements kept per connection: every fixed statement, and the built ones a
/// busy store repeats (a group's listings, a writer batch's multi-row statements of each
/// size); preparing (parsing and planning) is most of what a short statement costs.
const STATEMENT_CACHE: usize = 256;

/// The store's connections and its change channel.
#[derive(Debug)]
pub(super) struct Db {
    path: PathBuf,
    /// The one connection that writes; `None` once closed.
    writer: Mutex<Option<Connection>>,
    /// Idle reader connections; `None` once closed.
    readers: Mutex<Option<Vec<Connection>>>,
    /// Held by the one write on its way to the writer connection: the others wait for it
    /// here, as tasks, not each on a thread of the blocking pool.
    turn: tokio::sync::Mutex<()>,
    changes: broadcast::Sender<Change>,
}

/// An open write transaction on the writer connection with the changes it will announce
/// once it commits; dropped without committing, it rolls back and announces nothing.
pub(super) struct WriteTx<'c> {
    tx: rusqlite::Transaction<'c>,
    pending: Vec<Change>,
}

impl WriteTx<'_> {
    /// Announce `change` when this transaction commits.
    pub(super) fn announce(&mut self, change: Change) {
        self.pending.push(change);
    }
}

impl Deref for WriteTx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.tx
    }
}

impl Db {
    /// The connections to the file at `path` (checked and migrated by the caller's first
    /// connection, `writer`).
    pub(super) fn new(path: PathBuf, writer: Connection, changes: broadcast::Sender<Change>) -> Db {
        Db {
            path,
            writer: Mutex::new(Some(writer)),
            readers: Mutex::new(Some(Vec::new())),
            turn: tokio::sync::Mutex::new(()),
            changes,
        }
    }

    /// The file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The change channel.
    pub(super) fn changes(&self) -> &broadcast::Sender<Change> {
        &self.changes
    }

    /// Run `read` on the calling thread with a reader connection.
    pub(super) fn read<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let idle = lock(&self.readers).as_mut().ok_or_else(closed)?.pop();
        let conn = match idle {
            Some(conn) => conn,
            None => connect(&self.path)?,
        };
        let result = read(&conn);
        if let Some(readers) = lock(&self.readers).as_mut()
            && readers.len() < READERS
        {
            readers.push(conn);
        }
        result
    }

    /// Run `write` in one transaction on the writer connection, on the blocking pool, once
    /// the writes before it are done; commit when it answers `Ok` (then announce its
    /// changes), roll back when it answers `Err`.
    pub(super) async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        write: impl FnOnce(&mut WriteTx<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let _turn = self.turn.lock().await;
        let db = Arc::clone(self);
        tokio::task::spawn_blocking(move || db.write_here(write))
            .await
            .map_err(|e| Error::Unavailable(format!("the store's writer stopped: {e}")))?
    }

    /// [`Db::write`] on the calling thread (the writer's own thread, or the blocking pool).
    pub(super) fn write_here<T>(
        &self,
        write: impl FnOnce(&mut WriteTx<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut writer = lock(&self.writer);
        let conn = writer.as_mut().ok_or_else(closed)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(map_err)?;
        let mut tx = WriteTx {
            tx,
            pending: Vec::new(),
        };
        let answer = write(&mut tx)?;
        let WriteTx { tx, pending } = tx;
        tx.commit().map_err(map_err)?;
        for change in pending {
            let _ = self.changes.send(change);
        }
        Ok(answer)
    }

    /// Run `use_writer` with the writer connection outside any transaction (pragmas, checks).
    pub(super) fn with_writer<T>(
        &self,
        use_writer: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let writer = lock(&self.writer);
        use_writer(writer.as_ref().ok_or_else(closed)?)
    }

    /// Close every connection; later calls fail with `Unavailable`.
    pub(super) fn close(&self) {
        let writer = lock(&self.writer).take();
        let readers = lock(&self.readers).take();
        drop((writer, readers));
    }
}

/// A mutex's contents; a panic while it was held left nothing half-written that matters
/// (a transaction not committed rolls back), so a poisoned lock is taken as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn closed() -> Error {
    Error::Unavailable("the store was closed".to_string())
}

/// A connection to `path` as every connection of the store is set: WAL, `synchronous =
/// FULL`, the busy timeout, foreign keys on, a cache of prepared statements. The file is read
/// with `pread`, not through a memory map: in WAL mode a reader that finds the log changed
/// since its last read (after any other connection's commit, on a busy store nearly every
/// read) unmaps the whole file and maps it again, and the unmap is a TLB shootdown across
/// the process's CPUs; copying the few pages a read touches costs less.
pub(super) fn connect(path: &Path) -> Result<Connection, Error> {
    let conn = open(path)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;",
    )
    .map_err(map_err)?;
    Ok(conn)
}

/// A connection to `path` (made when missing) with the busy timeout, no pragma set.
pub(super) fn open(path: &Path) -> Result<Connection, Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(map_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// The one place where SQLite's errors become store errors: a busy or locked database, I/O
/// trouble and a file that cannot be opened are `Unavailable` (a retry may help), a full disk
/// says so, a damaged file or one that is not a database is `Corrupt`, as is data that cannot
/// be decoded. Callers that expect a unique violation (a create) check [`is_unique`] first.
pub(super) fn map_err(error: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode as C;
    match &error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            let message = match message {
                Some(message) => format!("{message} (code {})", failure.extended_code),
                None => format!("{failure} (code {})", failure.extended_code),
            };
            match failure.code {
                C::DiskFull => crate::sql::disk_full(&message),
                C::DatabaseCorrupt | C::NotADatabase => {
                    Error::Corrupt(format!("the database file is damaged: {message}"))
                }
                C::DatabaseBusy | C::DatabaseLocked | C::SystemIoFailure | C::CannotOpen => {
                    Error::Unavailable(message)
                }
                _ => Error::Corrupt(format!("the database refused a statement: {message}")),
            }
        }
        _ => Error::Corrupt(format!("unreadable database data: {error}")),
    }
}

/// Whether an error is a unique-key violation (a create of something that exists).
pub(super) fn is_unique(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(failure, _)
            if failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

/// A statement built piece by piece with its values bound in order (`?` placeholders).
#[derive(Debug, Default)]
pub(super) struct Query {
    text: String,
    values: Vec<Value>,
}

impl Query {
    /// A statement that starts with `text`.
    pub(super) fn new(text: &str) -> Query {
        Query {
            text: text.to_string(),
            values: Vec::new(),
        }
    }

    /// Append SQL text.
    pub(super) fn push(&mut self, text: &str) -> &mut Query {
        self.text.push_str(text);
        self
    }

    /// Append a placeholder bound to `value`.
    pub(super) fn bind(&mut self, value: impl Into<Value>) -> &mut Query {
        self.text.push('?');
        self.values.push(value.into());
        self
    }

    /// Append `VALUES (…), (…)`, one row per item, each row's values bound by `row`.
    pub(super) fn values<I>(&mut self, items: I, mut row: impl FnMut(&mut Row<'_>, I::Item))
    where
        I: IntoIterator,
    {
        self.text.push_str("VALUES ");
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.text.push('(');
            row(
                &mut Row {
                    query: self,
                    first: true,
                },
                item,
            );
            self.text.push(')');
        }
    }

    /// `EXPLAIN QUERY PLAN` of this statement, with its values.
    #[cfg(test)]
    pub(super) fn explained(&self) -> Query {
        Query {
            text: format!("EXPLAIN QUERY PLAN {}", self.text),
            values: self.values.clone(),
        }
    }

    /// Run for its rows, each read by `row`.
    pub(super) fn rows<T>(
        &self,
        conn: &Connection,
        mut row: impl FnMut(&rusqlite::Row<'_>) -> Result<T, Error>,
    ) -> Result<Vec<T>, Error> {
        let mut statement = conn.prepare_cached(&self.text).map_err(map_err)?;
        let mut rows = statement
            .query(rusqlite::params_from_iter(self.values.iter()))
            .map_err(map_err)?;
        let mut read = Vec::new();
        while let Some(next) = rows.next().map_err(map_err)? {
            read.push(row(next)?);
        }
        Ok(read)
    }

    /// Run, for the number of rows changed.
    pub(super) fn execute(&self, conn: &Connection) -> Result<usize, Error> {
        let mut statement = conn.prepare_cached(&self.text).map_err(map_err)?;
        statement
            .execute(rusqlite::params_from_iter(self.values.iter()))
            .map_err(map_err)
    }
}

/// One row of [`Query::values`].
pub(super) struct Row<'q> {
    query: &'q mut Query,
    first: bool,
}

impl Row<'_> {
    /// Bind the row's next value.
    pub(super) fn bind(&mut self, value: impl Into<Value>) -> &mut Self {
        if !self.first {
            self.query.text.push_str(", ");
        }
        self.first = false;
        self.query.bind(value);
        self
    }
}

/// A column of a row, or `Corrupt` when it cannot be read as `T`.
pub(super) fn get<T: rusqlite::types::FromSql>(
    row: &rusqlite::Row<'_>,
    index: usize,
) -> Result<T, Error> {
    row.get(index).map_err(map_err)
}
