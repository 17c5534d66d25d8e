//! Opening a SQLite store: the file checked (a Nodus database or a new file), WAL mode with
//! `synchronous = FULL`, the migrations, the writer connection, the readers and the writer
//! task.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nodus_core::store::Error;
use sqlx::Connection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::broadcast;

use super::writer::Writer;
use super::{Inner, SqliteStore};
use crate::commit::GroupCommit;
use crate::sql::map_err;

/// Nodus's SQLite `application_id` ("Nodu"), written into every file it creates.
pub const APPLICATION_ID: i64 = 0x4E6F_6475;

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_CAPACITY: usize = 1024;

/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections read beside the writer.
const READERS: u32 = 4;

/// The migrations, applied on open.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

impl SqliteStore {
    /// Open (or create) the store in the file at `path`, migrating its schema to this
    /// version. Refuses a file that is not a Nodus database with `Error::Corrupt`.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        check_file(&path).await?;
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT);
        let in_file = |e: Error| in_file(&path, e);
        // In-process connections need no liveness check before each use.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(|e| in_file(map_err(e)))?;
        MIGRATOR
            .run(&writer)
            .await
            .map_err(|e| in_file(migrate_error(e)))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(READERS)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|e| in_file(map_err(e)))?;
        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let writes = GroupCommit::spawn(Writer {
            pool: writer.clone(),
            changes: changes.clone(),
        });
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer,
                readers,
                writes,
                changes,
            }),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The writer's journal mode and `synchronous` level (2 is FULL), as SQLite reports them.
    pub async fn durability(&self) -> Result<(String, i64), Error> {
        let mut conn = self.write_connection().await?;
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        Ok((mode, synchronous))
    }

    /// Close the connections; later calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.inner.writer.close().await;
        self.inner.readers.close().await;
    }
}

/// Refuse a file that is not a SQLite database, or a SQLite database of another application,
/// before anything writes to it; stamp a new file as Nodus's.
async fn check_file(path: &Path) -> Result<(), Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .busy_timeout(BUSY_TIMEOUT);
    let refuse = |e: sqlx::Error| match map_err(e) {
        Error::Corrupt(message) => Error::Corrupt(format!(
            "{} is not a Nodus store: it is not a SQLite database, or it is damaged ({message})",
            path.display()
        )),
        other => in_file(path, other),
    };
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .map_err(refuse)?;
    let result = async {
        let application_id: i64 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&mut conn)
            .await
            .map_err(refuse)?;
        if application_id == APPLICATION_ID {
            return Ok(());
        }
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
             ORDER BY name",
        )
        .fetch_all(&mut conn)
        .await
        .map_err(refuse)?;
        if application_id != 0 || !tables.is_empty() {
            return Err(Error::Corrupt(format!(
                "{} is a SQLite database of another application (application_id {application_id:#x}, \
                 tables: {}); Nodus will not use it",
                path.display(),
                if tables.is_empty() { "none".to_string() } else { tables.join(", ") }
            )));
        }
        sqlx::query(&format!("PRAGMA application_id = {APPLICATION_ID}"))
            .execute(&mut conn)
            .await
            .map_err(refuse)?;
        Ok(())
    }
    .await;
    let _ = conn.close().await;
    result
}

fn in_file(path: &Path, error: Error) -> Error {
    match error {
        Error::Unavailable(m) => Error::Unavailable(format!("{}: {m}", path.display())),
        Error::Corrupt(m) => Error::Corrupt(format!("{}: {m}", path.display())),
        other => other,
    }
}

fn migrate_error(error: sqlx::migrate::MigrateError) -> Error {
    use sqlx::migrate::MigrateError as M;
    match error {
        M::Execute(e) | M::ExecuteMigration(e, _) => map_err(e),
        M::VersionMissing(v) => Error::Corrupt(format!(
            "the database was migrated by a newer Nodus (migration {v} is unknown here)"
        )),
        other => Error::Corrupt(format!("schema migration failed: {other}")),
    }
}
