//! Opening a SQLite store: the file checked (a Nodus database or a new file), WAL mode with
//! `synchronous = FULL`, the migrations, the writer connection, the readers and the writer
//! task.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nodus_core::store::Error;
use rusqlite::{Connection, params};
use tokio::sync::broadcast;

use super::db::{self, Db, map_err};
use super::writer::Writer;
use super::{Inner, SqliteStore};
use crate::commit::GroupCommit;

/// Nodus's SQLite `application_id` ("Nodu"), written into every file it creates.
pub const APPLICATION_ID: i64 = 0x4E6F_6475;

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_CAPACITY: usize = 1024;

/// The migrations, applied on open (sqlx embeds them and their checksums; they are applied
/// here, and recorded in sqlx's table, `_sqlx_migrations`, as files written by earlier
/// releases already record them).
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

impl SqliteStore {
    /// Open (or create) the store in the file at `path`, migrating its schema to this
    /// version. Refuses a file that is not a Nodus database with `Error::Corrupt`.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let writer = tokio::task::spawn_blocking(move || {
            let in_file = |e: Error| in_file(&opened, e);
            check_file(&opened)?;
            let writer = db::connect(&opened).map_err(in_file)?;
            migrate(&writer).map_err(in_file)?;
            Ok::<_, Error>(writer)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("opening {}: {e}", path.display())))??;
        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let db = Arc::new(Db::new(path, writer, changes));
        let writes = GroupCommit::spawn(Writer {
            db: Arc::clone(&db),
        });
        Ok(SqliteStore {
            inner: Arc::new(Inner { db, writes }),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.inner.db.path()
    }

    /// The writer's journal mode and `synchronous` level (2 is FULL), as SQLite reports them.
    pub async fn durability(&self) -> Result<(String, i64), Error> {
        let db = Arc::clone(&self.inner.db);
        tokio::task::spawn_blocking(move || {
            db.with_writer(|conn| {
                let mode: String = conn
                    .query_row("PRAGMA journal_mode", [], |row| row.get(0))
                    .map_err(map_err)?;
                let synchronous: i64 = conn
                    .query_row("PRAGMA synchronous", [], |row| row.get(0))
                    .map_err(map_err)?;
                Ok((mode, synchronous))
            })
        })
        .await
        .map_err(|e| Error::Unavailable(format!("the store's writer stopped: {e}")))?
    }

    /// Close the connections; later calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.inner.db.close();
    }
}

/// Refuse a file that is not a SQLite database, or a SQLite database of another application,
/// before anything writes to it; stamp a new file as Nodus's.
fn check_file(path: &Path) -> Result<(), Error> {
    let refuse = |e: rusqlite::Error| match map_err(e) {
        Error::Corrupt(message) => Error::Corrupt(format!(
            "{} is not a Nodus store: it is not a SQLite database, or it is damaged ({message})",
            path.display()
        )),
        other => in_file(path, other),
    };
    let conn = db::open(path).map_err(|e| in_file(path, e))?;
    let application_id: i64 = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(refuse)?;
    if application_id == APPLICATION_ID {
        return Ok(());
    }
    let mut statement = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
             ORDER BY name",
        )
        .map_err(refuse)?;
    let tables = statement
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(refuse)?
        .collect::<Result<Vec<String>, _>>()
        .map_err(refuse)?;
    if application_id != 0 || !tables.is_empty() {
        return Err(Error::Corrupt(format!(
            "{} is a SQLite database of another application (application_id {application_id:#x}, \
             tables: {}); Nodus will not use it",
            path.display(),
            if tables.is_empty() {
                "none".to_string()
            } else {
                tables.join(", ")
            }
        )));
    }
    conn.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}"))
        .map_err(refuse)
}

/// Apply the migrations not applied yet, each in a transaction of its own, recorded as sqlx
/// records them. Refuses a file migrated by a newer Nodus (a migration unknown here), one
/// whose migration failed part-way, and one whose applied migration differs from this one.
fn migrate(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations ( \
             version BIGINT PRIMARY KEY, \
             description TEXT NOT NULL, \
             installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
             success BOOLEAN NOT NULL, \
             checksum BLOB NOT NULL, \
             execution_time BIGINT NOT NULL)",
    )
    .map_err(map_err)?;
    let mut statement = conn
        .prepare("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
        .map_err(map_err)?;
    let applied = statement
        .query_map([], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, bool>(1)?,
                row.get::<_, Vec<u8>>(2)?,
            ))
        })
        .map_err(map_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(map_err)?;
    for (version, success, checksum) in &applied {
        let known = MIGRATOR.iter().find(|m| m.version == *version);
        match known {
            None => {
                return Err(Error::Corrupt(format!(
                    "the database was migrated by a newer Nodus (migration {version} is unknown here)"
                )));
            }
            Some(_) if !success => {
                return Err(Error::Corrupt(format!(
                    "schema migration failed: migration {version} was left part-way"
                )));
            }
            Some(migration) if *migration.checksum != checksum[..] => {
                return Err(Error::Corrupt(format!(
                    "schema migration failed: migration {version} was applied from other SQL"
                )));
            }
            Some(_) => {}
        }
    }
    for migration in MIGRATOR.iter() {
        if !migration.migration_type.is_up_migration()
            || applied
                .iter()
                .any(|(version, ..)| *version == migration.version)
        {
            continue;
        }
        let started = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE").map_err(map_err)?;
        let done = conn
            .execute_batch(&migration.sql)
            .and_then(|()| {
                conn.execute(
                    "INSERT INTO _sqlx_migrations \
                     (version, description, success, checksum, execution_time) \
                     VALUES (?1, ?2, TRUE, ?3, ?4)",
                    params![
                        migration.version,
                        migration.description.as_ref(),
                        migration.checksum.as_ref(),
                        i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX),
                    ],
                )
            })
            .and_then(|_| conn.execute_batch("COMMIT"));
        if let Err(e) = done {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(match map_err(e) {
                Error::Corrupt(m) => Error::Corrupt(format!(
                    "schema migration failed: migration {}: {m}",
                    migration.version
                )),
                other => other,
            });
        }
    }
    Ok(())
}

fn in_file(path: &Path, error: Error) -> Error {
    match error {
        Error::Unavailable(m) => Error::Unavailable(format!("{}: {m}", path.display())),
        Error::Corrupt(m) => Error::Corrupt(format!("{}: {m}", path.display())),
        other => other,
    }
}
