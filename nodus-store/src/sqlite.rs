//! The SQLite [`Store`]: the embedded default, one file, for **one process**.
//!
//! The file is in WAL mode with `synchronous = FULL`, so a write is acknowledged only after
//! it reached the disk and survives a power cut. All writes go through one connection (SQLite
//! allows one writer at a time), reads through a small pool that WAL lets run beside it.
//! Every write but creates and deletes (journal writes, document updates and edits, leases)
//! is group-committed (see [`crate::group`]). Leases and fences are kept in
//! the file like everywhere else, but change notification is an in-process channel: a second
//! process on the same file would not see this one's changes, so run one process per file
//! and use Postgres for several replicas.
//!
//! Opening refuses a file that is not a SQLite database, and a SQLite database of another
//! application (one without Nodus's `application_id` that already has tables), with a clear
//! message, before writing anything to it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use nodus_core::journal::{Completion, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{
    Change, Delivery, Edit, Error, Fence, InboxMessage, Lease, ObjectKey, Record, RunRewrite,
    Selector, Store,
};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection, QueryBuilder, Row, Sqlite};
use tokio::sync::broadcast;

use crate::group::{Committer, GroupCommit, JournalWrite};
use crate::sql::{self, map_err};

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

/// A store in one SQLite file. Cloning is cheap; clones share the connections and the change
/// channel.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    /// The one connection that writes.
    writer: SqlitePool,
    /// Connections that read.
    readers: SqlitePool,
    /// Every write but creates and deletes, group-committed: under load many runs' steps,
    /// status writes, account edits and leases share one durable commit.
    writes: GroupCommit<Write, Written>,
    changes: broadcast::Sender<Change>,
}

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

    fn notify(&self, change: Change) {
        let _ = self.inner.changes.send(change);
    }

    /// The writer connection, for one transaction; notifications are sent while it is held,
    /// so they arrive in commit order.
    async fn write_connection(&self) -> Result<sqlx::pool::PoolConnection<Sqlite>, Error> {
        self.inner.writer.acquire().await.map_err(map_err)
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

/// Every write but creates and deletes: queued for the one writer task, which group-commits
/// whatever is queued in one transaction (one fsync) and answers each after the commit.
enum Write {
    /// A journal write.
    Journal(JournalWrite),
    /// A document replaced if still at the version its writer read.
    Replace(DocumentUpdate),
    /// A document edited in place ([`Store::modify`]).
    Edit {
        /// The document.
        key: ObjectKey,
        /// The edit.
        edit: Edit,
    },
    /// A lease granted ([`Store::claim`]).
    Claim {
        /// The run's uid.
        run: String,
        /// The lease.
        lease: Lease,
    },
    /// A lease extended or given up ([`Store::renew`], [`Store::release`]).
    Lease {
        /// The run's uid.
        run: String,
        /// The holder's fence.
        fence: Fence,
        /// The new owner and expiry; `None` gives the lease up.
        renewal: Option<Lease>,
    },
}

/// What a write answers.
#[derive(Debug)]
enum Written {
    /// Done.
    Done,
    /// The edited document.
    Document(Record),
    /// The new fence.
    Fence(Fence),
}

impl Written {
    fn fence(self) -> Result<Fence, Error> {
        match self {
            Written::Fence(fence) => Ok(fence),
            _ => Err(Error::Corrupt(
                "a claim answered without a fence".to_string(),
            )),
        }
    }

    fn document(self) -> Result<Record, Error> {
        match self {
            Written::Document(record) => Ok(record),
            _ => Err(Error::Corrupt(
                "an edit answered without its document".to_string(),
            )),
        }
    }
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Write::Journal(write) => write.fmt(f),
            Write::Replace(update) => update.fmt(f),
            Write::Edit { key, .. } => write!(f, "Edit({key})"),
            Write::Claim { run, .. } => write!(f, "Claim({run})"),
            Write::Lease { run, .. } => write!(f, "Lease({run})"),
        }
    }
}

/// The writer task's side of group commit: one transaction per batch on the writer
/// connection (none for a batch of one: its statements commit by themselves), and each
/// document change announced after the commit, while the connection is still held, so that
/// changes arrive in commit order.
struct Writer {
    pool: SqlitePool,
    changes: broadcast::Sender<Change>,
}

#[async_trait]
impl Committer<Write> for Writer {
    type Output = Written;

    async fn commit(&mut self, writes: Vec<Write>) -> Result<Vec<Result<Written, Error>>, Error> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let mut results = Vec::with_capacity(writes.len());
        let mut announced = Vec::new();
        if writes.len() == 1 {
            for write in writes {
                results.push(write_one(&mut conn, write, &mut announced).await?);
            }
        } else {
            // Dropped on an error: the transaction rolls back and nothing was written.
            let mut tx = conn.begin().await.map_err(map_err)?;
            let mut writes = writes.into_iter().peekable();
            while let Some(write) = writes.next() {
                let Write::Journal(first) = write else {
                    results.push(write_one(&mut tx, write, &mut announced).await?);
                    continue;
                };
                // Consecutive journal writes (most of a busy batch) in a few statements.
                let mut segment = vec![first];
                while let Some(Write::Journal(_)) = writes.peek() {
                    if let Some(Write::Journal(write)) = writes.next() {
                        segment.push(write);
                    }
                }
                if let [write] = segment.as_slice() {
                    results.push(journal_write(&mut tx, write).await?.map(|()| Written::Done));
                } else {
                    let written = batch::journal_writes(&mut tx, &segment).await?;
                    results.extend(written.into_iter().map(|r| r.map(|()| Written::Done)));
                }
            }
            tx.commit().await.map_err(map_err)?;
        }
        for change in announced {
            let _ = self.changes.send(change);
        }
        Ok(results)
    }
}

/// One write of a batch: `Err` for a database failure (the batch fails), `Ok(Err)` for a
/// refused write (a stale version or fence, a lease held by another, a missing document).
async fn write_one(
    conn: &mut SqliteConnection,
    write: Write,
    announced: &mut Vec<Change>,
) -> Result<Result<Written, Error>, Error> {
    let refused = |e: Error| match e {
        Error::Leased { .. } | Error::Fenced { .. } | Error::NotFound(_) => Ok(Err(e)),
        failure => Err(failure),
    };
    match write {
        Write::Journal(write) => Ok(journal_write(conn, &write).await?.map(|()| Written::Done)),
        Write::Replace(update) => {
            let result = update_one(conn, &update).await?;
            if result.is_ok() {
                announced.push(Change::Written(update.key, update.expected + 1));
            }
            Ok(result.map(|()| Written::Done))
        }
        Write::Edit { key, mut edit } => {
            let record = match read_record(&mut *conn, &key).await {
                Ok(record) => record,
                Err(e) => return refused(e),
            };
            let Some(document) = edit(&record.document) else {
                return Ok(Ok(Written::Document(record)));
            };
            let update = DocumentUpdate {
                key: key.clone(),
                expected: record.version,
                columns: sql::Columns::of(&document),
                text: sql::document_text(&document),
            };
            let result = update_one(conn, &update).await?;
            if result.is_ok() {
                announced.push(Change::Written(
                    key.clone(),
                    record.version.saturating_add(1),
                ));
            }
            Ok(result.map(|()| {
                Written::Document(Record {
                    key,
                    version: record.version.saturating_add(1),
                    document,
                })
            }))
        }
        Write::Claim { run, lease } => match grant(conn, &run, &lease).await {
            Ok(fence) => Ok(Ok(Written::Fence(fence))),
            Err(e) => refused(e),
        },
        Write::Lease {
            run,
            fence,
            renewal,
        } => {
            if let Err(e) = check_fence(conn, &run, fence).await {
                return refused(e);
            }
            let (owner, expires_at) = match &renewal {
                Some(lease) => (Some(lease.owner.as_str()), sql::nanos(lease.expires_at()?)?),
                None => (None, i64::MIN),
            };
            sqlx::query("UPDATE leases SET owner = ?, expires_at = ? WHERE run_uid = ?")
                .bind(owner)
                .bind(expires_at)
                .bind(&run)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
            Ok(Ok(Written::Done))
        }
    }
}

/// Read a document through `executor` (the readers, or the writer inside its transaction).
async fn read_record<'e>(
    executor: impl sqlx::Executor<'e, Database = Sqlite>,
    key: &ObjectKey,
) -> Result<Record, Error> {
    let row = sqlx::query(
        "SELECT version, document FROM resources WHERE project = ? AND kind = ? AND name = ?",
    )
    .bind(&key.project)
    .bind(sql::kind_name(key.kind))
    .bind(&key.name)
    .fetch_optional(executor)
    .await
    .map_err(map_err)?
    .ok_or_else(|| Error::NotFound(key.clone()))?;
    sql::record_of(key.clone(), &row, 0)
}

/// A run's inbox, in order, read through `executor`.
async fn inbox_of<'e>(
    executor: impl sqlx::Executor<'e, Database = Sqlite>,
    run_uid: &str,
) -> Result<Vec<InboxMessage>, Error> {
    let rows = sqlx::query(
        "SELECT seq, message_key, payload, received_at FROM inbox WHERE run_uid = ? \
         ORDER BY seq",
    )
    .bind(run_uid)
    .fetch_all(executor)
    .await
    .map_err(map_err)?;
    rows.iter().map(sql::message_of).collect()
}

/// A document update, checked against the version its writer read.
#[derive(Debug)]
struct DocumentUpdate {
    key: ObjectKey,
    expected: u64,
    columns: sql::Columns,
    text: String,
}

/// One document update: `Err` for a database failure (the batch fails), `Ok(Err)` for a
/// refused update (a missing document, or a stale version).
async fn update_one(
    conn: &mut SqliteConnection,
    write: &DocumentUpdate,
) -> Result<Result<(), Error>, Error> {
    let key = &write.key;
    // A version that does not fit was never stored: refused below, like any stale one.
    if let Some(expected) = sql::to_i64(write.expected) {
        let version = sql::bump(key, expected)?;
        let done = sqlx::query(
            "UPDATE resources SET version = ?, uid = ?, group_name = ?, phase = ?, document = ? \
             WHERE project = ? AND kind = ? AND name = ? AND version = ?",
        )
        .bind(version)
        .bind(write.columns.uid.as_deref())
        .bind(write.columns.group.as_deref())
        .bind(write.columns.phase.as_deref())
        .bind(&write.text)
        .bind(&key.project)
        .bind(sql::kind_name(key.kind))
        .bind(&key.name)
        .bind(expected)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 1 {
            return Ok(Ok(()));
        }
    }
    let current: Option<i64> = sqlx::query_scalar(
        "SELECT version FROM resources WHERE project = ? AND kind = ? AND name = ?",
    )
    .bind(&key.project)
    .bind(sql::kind_name(key.kind))
    .bind(&key.name)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(Err(match current {
        None => Error::NotFound(key.clone()),
        Some(actual) => Error::Conflict {
            key: key.clone(),
            expected: write.expected,
            actual: sql::to_u64(actual, "a version")?,
        },
    }))
}

/// One journal write, checked and done in one statement: `Err` for a database failure (the
/// batch fails), `Ok(Err)` for a refused write, whose reason is then read.
async fn journal_write(
    conn: &mut SqliteConnection,
    write: &JournalWrite,
) -> Result<Result<(), Error>, Error> {
    let run = write.run();
    let (fence, seq) = match write {
        JournalWrite::Append { fence, step, .. } => (*fence, step.seq),
        JournalWrite::Complete { fence, seq, .. } => (*fence, *seq),
    };
    // A fence that does not fit matches no stored fence.
    let fence_value = sql::to_i64(fence.0).unwrap_or(-1);
    let done = match write {
        JournalWrite::Append { step, .. } => {
            let text = match sql::step_text(step) {
                Ok(text) => text,
                Err(e) => return Ok(Err(e)),
            };
            sqlx::query(
                "INSERT INTO steps (run_uid, seq, step) SELECT ?1, ?2, ?3 \
                 WHERE (SELECT fence FROM leases WHERE run_uid = ?1) = ?4 \
                 AND (SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = ?1) = ?2",
            )
            .bind(run)
            .bind(i64::from(seq))
            .bind(text)
            .bind(fence_value)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?
        }
        JournalWrite::Complete { completion, .. } => {
            let text = match sql::completion_text(completion) {
                Ok(text) => text,
                Err(e) => return Ok(Err(e)),
            };
            sqlx::query(
                "UPDATE steps SET completion = ?1 WHERE run_uid = ?2 AND seq = ?3 \
                 AND completion IS NULL \
                 AND (SELECT fence FROM leases WHERE run_uid = ?2) = ?4",
            )
            .bind(text)
            .bind(run)
            .bind(i64::from(seq))
            .bind(fence_value)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?
        }
    };
    if done.rows_affected() == 1 {
        return Ok(Ok(()));
    }
    // Refused: say why.
    let latest: Option<i64> = sqlx::query_scalar("SELECT fence FROM leases WHERE run_uid = ?")
        .bind(run)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    if latest.is_none() || latest != sql::to_i64(fence.0) {
        return Ok(Err(Error::Fenced {
            run: run.to_string(),
        }));
    }
    let len: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = ?")
            .bind(run)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
    Ok(Err(match write {
        JournalWrite::Append { .. } => sql::append_refused(run, seq, len),
        JournalWrite::Complete { .. } => sql::complete_refused(run, seq, len, i64::from(seq) < len),
    }))
}

/// The conditions of a listing after `WHERE project = `: the project, the kind and the
/// selector, pushed down through bound JSON paths, in creation order. The exact match is
/// `Selector::matches` afterwards (numbers and booleans match their text there).
fn push_selection<'a>(
    query: &mut QueryBuilder<'a, Sqlite>,
    project: &'a str,
    kind: Kind,
    selector: &'a Selector,
) {
    query.push_bind(project);
    query.push(" AND kind = ");
    query.push_bind(sql::kind_name(kind));
    for (label, value) in &selector.labels {
        if let Some(parts) = sql::path_parts(label) {
            let mut path = vec!["metadata", "labels"];
            if parts.len() == 1 {
                path.extend(parts);
                let path = json_path(&path);
                query.push(" AND json_type(document, ");
                query.push_bind(path.clone());
                query.push(") = 'text' AND json_extract(document, ");
                query.push_bind(path);
                query.push(") = ");
                query.push_bind(value.as_str());
            }
        }
    }
    for (field, value) in &selector.fields {
        if sql::push_column_match(query, field, value) {
            continue;
        }
        if let Some(parts) = sql::path_parts(field) {
            let path = json_path(&parts);
            query.push(" AND (json_type(document, ");
            query.push_bind(path.clone());
            query.push(") IN ('integer', 'real', 'true', 'false') OR (json_type(document, ");
            query.push_bind(path.clone());
            query.push(") = 'text' AND json_extract(document, ");
            query.push_bind(path);
            query.push(") = ");
            query.push_bind(value.as_str());
            query.push("))");
        }
    }
    query.push(" ORDER BY ord");
}

/// The JSON path (`$."a"."b"`) of dotted parts; the parts hold no double quote.
fn json_path(parts: &[&str]) -> String {
    let mut path = String::from("$");
    for part in parts {
        path.push_str(".\"");
        path.push_str(part);
        path.push('"');
    }
    path
}

/// Insert a document known to be new, inside a transaction.
async fn insert(
    conn: &mut SqliteConnection,
    key: &ObjectKey,
    document: &Value,
) -> Result<(), sqlx::Error> {
    let columns = sql::Columns::of(document);
    sqlx::query(
        "INSERT INTO resources (project, kind, name, version, uid, group_name, phase, document) \
         VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
    )
    .bind(&key.project)
    .bind(sql::kind_name(key.kind))
    .bind(&key.name)
    .bind(columns.uid)
    .bind(columns.group)
    .bind(columns.phase)
    .bind(sql::document_text(document))
    .execute(conn)
    .await
    .map(|_| ())
}

/// Grant `lease` on a run inside a write transaction.
async fn grant(conn: &mut SqliteConnection, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
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
async fn check_fence(
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

#[async_trait]
impl Store for SqliteStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        let mut conn = self.write_connection().await?;
        match insert(&mut conn, key, &document).await {
            Ok(()) => {}
            Err(e) if sql::is_unique_violation(&e) => {
                return Err(Error::AlreadyExists(key.clone()));
            }
            Err(e) => return Err(map_err(e)),
        }
        self.notify(Change::Written(key.clone(), 1));
        drop(conn);
        Ok(Record {
            key: key.clone(),
            version: 1,
            document,
        })
    }

    async fn create_batch(
        &self,
        items: Vec<(ObjectKey, Value)>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<Record>, Error> {
        let scope = match (idempotency_key, items.first()) {
            (Some(key), Some((first, _))) => Some((first.project.clone(), key.to_string())),
            _ => None,
        };
        let mut conn = self.write_connection().await?;
        let mut tx = conn.begin().await.map_err(map_err)?;
        if let Some((project, key)) = &scope {
            let stored: Option<String> = sqlx::query_scalar(
                "SELECT records FROM batches WHERE project = ? AND idempotency_key = ?",
            )
            .bind(project)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            if let Some(stored) = stored {
                return sql::parse_batch(&stored);
            }
        }
        let mut seen = HashSet::with_capacity(items.len());
        for (key, document) in &items {
            if !seen.insert(key) {
                return Err(Error::AlreadyExists(key.clone()));
            }
            match insert(&mut tx, key, document).await {
                Ok(()) => {}
                Err(e) if sql::is_unique_violation(&e) => {
                    return Err(Error::AlreadyExists(key.clone()));
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        let records: Vec<Record> = items
            .into_iter()
            .map(|(key, document)| Record {
                key,
                version: 1,
                document,
            })
            .collect();
        if let Some((project, key)) = &scope {
            sqlx::query("INSERT INTO batches (project, idempotency_key, records) VALUES (?, ?, ?)")
                .bind(project)
                .bind(key)
                .bind(sql::batch_text(&records))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        for record in &records {
            self.notify(Change::Written(record.key.clone(), 1));
        }
        drop(conn);
        Ok(records)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        read_record(&self.inner.readers, key).await
    }

    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        let mut query: QueryBuilder<Sqlite> =
            QueryBuilder::new("SELECT name, version, document FROM resources WHERE project = ");
        push_selection(&mut query, project, kind, selector);
        let rows = query
            .build()
            .fetch_all(&self.inner.readers)
            .await
            .map_err(map_err)?;
        sql::selected(project, kind, selector, &rows, sql::record_of)
    }

    async fn list_sparse(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        paths: &[&str],
    ) -> Result<Vec<Record>, Error> {
        let wanted = selector.paths_with(paths);
        let Some(json_paths) = wanted
            .iter()
            .map(|path| sql::path_parts(path).map(|parts| json_path(&parts)))
            .collect::<Option<Vec<_>>>()
        else {
            // A path no JSON path can spell: whole documents, cut down here.
            let records = self.list(project, kind, selector).await?;
            return Ok(nodus_core::store::cut_down(records, &wanted));
        };
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new("SELECT name, version");
        for path in json_paths {
            // `->` answers JSON text (or NULL when the path is absent).
            query.push(", document -> ");
            query.push_bind(path);
        }
        query.push(" FROM resources WHERE project = ");
        push_selection(&mut query, project, kind, selector);
        let rows = query
            .build()
            .fetch_all(&self.inner.readers)
            .await
            .map_err(map_err)?;
        sql::selected(project, kind, selector, &rows, |key, row, at| {
            sql::sparse_record_of(key, row, at, &wanted)
        })
    }

    async fn projects(&self) -> Result<Vec<String>, Error> {
        sqlx::query_scalar("SELECT DISTINCT project FROM resources ORDER BY project")
            .fetch_all(&self.inner.readers)
            .await
            .map_err(map_err)
    }

    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: Value,
    ) -> Result<Record, Error> {
        // Only used when the update succeeds, that is when `expected_version` is stored.
        let version = expected_version.saturating_add(1);
        self.inner
            .writes
            .write(Write::Replace(DocumentUpdate {
                key: key.clone(),
                expected: expected_version,
                columns: sql::Columns::of(&document),
                text: sql::document_text(&document),
            }))
            .await?;
        Ok(Record {
            key: key.clone(),
            version,
            document,
        })
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), Error> {
        let mut conn = self.write_connection().await?;
        let mut tx = conn.begin().await.map_err(map_err)?;
        let uid: Option<Option<String>> = sqlx::query_scalar(
            "DELETE FROM resources WHERE project = ? AND kind = ? AND name = ? RETURNING uid",
        )
        .bind(&key.project)
        .bind(sql::kind_name(key.kind))
        .bind(&key.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(uid) = uid else {
            return Err(Error::NotFound(key.clone()));
        };
        if let Some(uid) = uid {
            for statement in [
                "DELETE FROM steps WHERE run_uid = ?",
                "DELETE FROM inbox WHERE run_uid = ?",
                // Old fences stay stale: the counter moves on and nobody holds it.
                "UPDATE leases SET fence = fence + 1, owner = NULL WHERE run_uid = ?",
            ] {
                sqlx::query(statement)
                    .bind(&uid)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            }
        }
        tx.commit().await.map_err(map_err)?;
        self.notify(Change::Deleted(key.clone()));
        drop(conn);
        Ok(())
    }

    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        self.inner
            .writes
            .write(Write::Claim {
                run: run_uid.to_string(),
                lease: lease.clone(),
            })
            .await?
            .fence()
    }

    async fn modify(&self, key: &ObjectKey, edit: Edit) -> Result<Record, Error> {
        self.inner
            .writes
            .write(Write::Edit {
                key: key.clone(),
                edit,
            })
            .await?
            .document()
    }

    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error> {
        self.inner
            .writes
            .write(Write::Lease {
                run: run_uid.to_string(),
                fence,
                renewal: Some(lease.clone()),
            })
            .await
            .map(drop)
    }

    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        self.inner
            .writes
            .write(Write::Lease {
                run: run_uid.to_string(),
                fence,
                renewal: None,
            })
            .await
            .map(drop)
    }

    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error> {
        self.inner
            .writes
            .write(Write::Journal(JournalWrite::Append {
                run: run_uid.to_string(),
                fence,
                step: step.clone(),
            }))
            .await
            .map(drop)
    }

    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.inner
            .writes
            .write(Write::Journal(JournalWrite::Complete {
                run: run_uid.to_string(),
                fence,
                seq,
                completion: completion.clone(),
            }))
            .await
            .map(drop)
    }

    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        let rows = sqlx::query("SELECT step, completion FROM steps WHERE run_uid = ? ORDER BY seq")
            .bind(run_uid)
            .fetch_all(&self.inner.readers)
            .await
            .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let step: String = row.try_get(0).map_err(map_err)?;
                let completion: Option<String> = row.try_get(1).map_err(map_err)?;
                sql::read_step(run_uid, &step, completion.as_deref())
            })
            .collect()
    }

    async fn post_message(
        &self,
        run: &ObjectKey,
        expected_version: u64,
        key: Option<&str>,
        payload: &str,
        at: Timestamp,
    ) -> Result<Delivery, Error> {
        let mut conn = self.write_connection().await?;
        let mut tx = conn.begin().await.map_err(map_err)?;
        let row = sqlx::query(
            "SELECT version, uid FROM resources WHERE project = ? AND kind = ? AND name = ?",
        )
        .bind(&run.project)
        .bind(sql::kind_name(run.kind))
        .bind(&run.name)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?
        .ok_or_else(|| Error::NotFound(run.clone()))?;
        let current: i64 = row.try_get(0).map_err(map_err)?;
        let uid: Option<String> = row.try_get(1).map_err(map_err)?;
        let uid = uid.ok_or_else(|| {
            sql::journal_error(&run.to_string(), "the run has no metadata.uid".to_string())
        })?;
        if let Some(key) = key {
            let seq: Option<i64> =
                sqlx::query_scalar("SELECT seq FROM inbox WHERE run_uid = ? AND message_key = ?")
                    .bind(&uid)
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(map_err)?;
            if let Some(seq) = seq {
                return Ok(Delivery::Duplicate(sql::to_u64(seq, "a message number")?));
            }
        }
        if sql::to_i64(expected_version) != Some(current) {
            return Err(Error::Conflict {
                key: run.clone(),
                expected: expected_version,
                actual: sql::to_u64(current, "a version")?,
            });
        }
        let version = sql::bump(run, current)?;
        let seq: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM inbox WHERE run_uid = ?")
                .bind(&uid)
                .fetch_one(&mut *tx)
                .await
                .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO inbox (run_uid, seq, message_key, payload, received_at) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&uid)
        .bind(seq)
        .bind(key)
        .bind(payload)
        .bind(at.to_string())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        sqlx::query("UPDATE resources SET version = ? WHERE project = ? AND kind = ? AND name = ?")
            .bind(version)
            .bind(&run.project)
            .bind(sql::kind_name(run.kind))
            .bind(&run.name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        self.notify(Change::Written(
            run.clone(),
            sql::to_u64(version, "a version")?,
        ));
        drop(conn);
        Ok(Delivery::Delivered(sql::to_u64(seq, "a message number")?))
    }

    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
        inbox_of(&self.inner.readers, run_uid).await
    }

    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, Error> {
        crate::check_rewrite_deletes(&rewrite.delete)?;
        let run = &rewrite.run;
        let mut conn = self.write_connection().await?;
        let mut tx = conn.begin().await.map_err(map_err)?;
        let mut record = read_record(&mut *tx, run).await?;
        if record.version != rewrite.expected_version {
            return Err(Error::Conflict {
                key: run.clone(),
                expected: rewrite.expected_version,
                actual: record.version,
            });
        }
        let uid = sql::uid_of(&record.document).map(str::to_string);
        (rewrite.document)(&mut record.document);
        let stored = sql::to_i64(record.version).ok_or_else(|| {
            Error::Corrupt(format!("{run}: version {} too large", record.version))
        })?;
        let version = sql::bump(run, stored)?;
        let columns = sql::Columns::of(&record.document);
        sqlx::query(
            "UPDATE resources SET version = ?, uid = ?, group_name = ?, phase = ?, document = ? \
             WHERE project = ? AND kind = ? AND name = ?",
        )
        .bind(version)
        .bind(columns.uid)
        .bind(columns.group)
        .bind(columns.phase)
        .bind(sql::document_text(&record.document))
        .bind(&run.project)
        .bind(sql::kind_name(run.kind))
        .bind(&run.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        record.version = sql::to_u64(version, "a version")?;
        if let Some(uid) = &uid {
            let steps =
                sqlx::query("SELECT step, completion FROM steps WHERE run_uid = ? ORDER BY seq")
                    .bind(uid)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(map_err)?;
            for row in steps {
                let step: String = row.try_get(0).map_err(map_err)?;
                let completion: Option<String> = row.try_get(1).map_err(map_err)?;
                let mut step = sql::read_step(uid, &step, completion.as_deref())?;
                (rewrite.step)(&mut step);
                let completion = step
                    .completion
                    .as_ref()
                    .map(sql::completion_text)
                    .transpose()?;
                sqlx::query(
                    "UPDATE steps SET step = ?, completion = ? WHERE run_uid = ? AND seq = ?",
                )
                .bind(sql::step_text(&step)?)
                .bind(completion)
                .bind(uid)
                .bind(i64::from(step.seq))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            }
            for mut message in inbox_of(&mut *tx, uid).await? {
                (rewrite.message)(&mut message);
                sqlx::query(
                    "UPDATE inbox SET message_key = ?, payload = ?, received_at = ? \
                     WHERE run_uid = ? AND seq = ?",
                )
                .bind(message.key)
                .bind(message.payload)
                .bind(message.received_at.to_string())
                .bind(uid)
                .bind(sql::to_i64(message.seq).unwrap_or(-1))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            }
        }
        let batches: Vec<(String, String)> =
            sqlx::query_as("SELECT idempotency_key, records FROM batches WHERE project = ?")
                .bind(&run.project)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
        for (idempotency_key, text) in batches {
            if let Some(text) = sql::edited_batch(&text, run, rewrite.document.as_ref())? {
                sqlx::query(
                    "UPDATE batches SET records = ? WHERE project = ? AND idempotency_key = ?",
                )
                .bind(text)
                .bind(&run.project)
                .bind(&idempotency_key)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            }
        }
        let mut deleted = Vec::new();
        for key in &rewrite.delete {
            let removed =
                sqlx::query("DELETE FROM resources WHERE project = ? AND kind = ? AND name = ?")
                    .bind(&key.project)
                    .bind(sql::kind_name(key.kind))
                    .bind(&key.name)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            if removed.rows_affected() > 0 {
                deleted.push(key.clone());
            }
        }
        tx.commit().await.map_err(map_err)?;
        self.notify(Change::Written(run.clone(), record.version));
        for key in deleted {
            self.notify(Change::Deleted(key));
        }
        drop(conn);
        Ok(record)
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }
}

mod batch;
#[cfg(test)]
mod tests;
