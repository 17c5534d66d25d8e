//! The writer: SQLite has one writer at a time, so every write but batches of creates, deletes,
//! messages and rewrites (which take the writer connection for their own transaction) is
//! queued for one writer task that group-commits whatever is queued in one transaction (one
//! fsync) and answers each write after the commit.

use async_trait::async_trait;
use nodus_core::store::{Change, Error, Record};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{Connection, Sqlite};
use tokio::sync::broadcast;

use super::documents::{insert, read_record, update_one};
use super::journal::journal_write;
use super::leases::grant;

use super::write::{DocumentUpdate, SnapshotRow, Then, Write, Written};
use super::{SqliteStore, batch};
use crate::commit::{Committer, JournalWrite};
use crate::sql::{self, map_err};

/// The writer task's side of group commit: one transaction per batch on the writer
/// connection (none for a batch of one: its statements commit by themselves), and each
/// document change announced after the commit, while the connection is still held, so that
/// changes arrive in commit order.
pub(super) struct Writer {
    pub(super) pool: SqlitePool,
    pub(super) changes: broadcast::Sender<Change>,
}

#[async_trait]
impl Committer<Write> for Writer {
    type Output = Written;

    async fn commit(&mut self, writes: Vec<Write>) -> Result<Vec<Result<Written, Error>>, Error> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let mut results = Vec::with_capacity(writes.len());
        let mut announced = Vec::new();
        // A journal write with a document is two statements: a transaction, even alone.
        if writes.len() == 1 && !matches!(writes.first(), Some(Write::JournalThen(..))) {
            for write in writes {
                results.push(write_one(&mut conn, write, &mut announced).await?);
            }
        } else {
            // Dropped on an error: the transaction rolls back and nothing was written.
            let mut tx = conn.begin().await.map_err(map_err)?;
            let mut writes = writes.into_iter().peekable();
            while let Some(write) = writes.next() {
                let (first, then) = match write {
                    Write::Journal(write) => (write, None),
                    Write::JournalThen(write, update) => (write, Some(update)),
                    other => {
                        results.push(write_one(&mut tx, other, &mut announced).await?);
                        continue;
                    }
                };
                // Consecutive journal writes (most of a busy batch) in a few statements, then
                // the documents some of them replace once done.
                let mut segment = vec![first];
                let mut thens = vec![then];
                while writes.peek().is_some_and(Write::is_journal) {
                    match writes.next() {
                        Some(Write::Journal(write)) => {
                            segment.push(write);
                            thens.push(None);
                        }
                        Some(Write::JournalThen(write, update)) => {
                            segment.push(write);
                            thens.push(Some(update));
                        }
                        _ => {}
                    }
                }
                results.extend(write_segment(&mut tx, segment, thens, &mut announced).await?);
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
        Write::Journal(write) => {
            one_of(write_segment(conn, vec![write], vec![None], announced).await?)
        }
        Write::JournalThen(write, then) => {
            one_of(write_segment(conn, vec![write], vec![Some(then)], announced).await?)
        }
        Write::Create { key, document } => {
            // A taken key fails this statement only (SQLite's ABORT): the batch goes on.
            match insert(conn, &key, &document).await {
                Ok(()) => {}
                Err(e) if sql::is_unique_violation(&e) => {
                    return Ok(Err(Error::AlreadyExists(key)));
                }
                Err(e) => return Err(map_err(e)),
            }
            announced.push(Change::Written(key.clone(), 1));
            Ok(Ok(Written::Document(Record {
                key,
                version: 1,
                document,
            })))
        }
        Write::Replace(update) => Ok(replace(conn, update, announced)
            .await?
            .map(|()| Written::Done)),
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
            let (owner, expires_at) = match &renewal {
                Some(lease) => (Some(lease.owner.as_str()), sql::nanos(lease.expires_at()?)?),
                None => (None, i64::MIN),
            };
            // Checked against the fence in the same statement: no row changed is a stale one
            // (a fence that does not fit matches no stored fence).
            let done = sqlx::query(
                "UPDATE leases SET owner = ?, expires_at = ? WHERE run_uid = ? AND fence = ?",
            )
            .bind(owner)
            .bind(expires_at)
            .bind(&run)
            .bind(sql::to_i64(fence.0).unwrap_or(-1))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
            if done.rows_affected() == 0 {
                return refused(Error::Fenced { run });
            }
            Ok(Ok(Written::Done))
        }
    }
}

/// Consecutive journal writes of a batch (in a few statements when there are several), then
/// what those that were done carry: their snapshots, then their documents, then the next
/// steps of those whose documents were replaced (or that had none), each kind in one
/// statement. Each write's own answer, or one error when the database failed.
async fn write_segment(
    conn: &mut SqliteConnection,
    segment: Vec<JournalWrite>,
    thens: Vec<Option<Then>>,
    announced: &mut Vec<Change>,
) -> Result<Vec<Result<Written, Error>>, Error> {
    let written = journal_writes(&mut *conn, &segment).await?;
    let done: Vec<&Then> = written
        .iter()
        .zip(&thens)
        .filter_map(|(result, then)| then.as_ref().filter(|_| result.is_ok()))
        .collect();
    let snapshots: Vec<&SnapshotRow> = done
        .iter()
        .filter_map(|then| then.snapshot.as_ref())
        .collect();
    batch::keep_snapshots(&mut *conn, &snapshots).await?;
    let updates: Vec<&DocumentUpdate> = done
        .iter()
        .filter_map(|then| then.update.as_ref())
        .collect();
    let mut replaced = batch::replace_documents(&mut *conn, &updates)
        .await?
        .into_iter();
    let mut results = Vec::with_capacity(segment.len());
    // The next steps to append, each with the index of the answer it belongs to.
    let mut nexts = Vec::new();
    let mut next_of = Vec::new();
    for ((write, result), then) in segment.into_iter().zip(written).zip(thens) {
        results.push(match (result, then) {
            (Err(refused), _) => Err(refused),
            (Ok(()), None) => Ok(Written::Done),
            (Ok(()), Some(then)) => {
                let document = match then.update {
                    None => Ok(()),
                    Some(update) => {
                        let replaced = replaced.next().ok_or_else(|| {
                            Error::Corrupt("a document update went unanswered".to_string())
                        })?;
                        if replaced.is_ok() {
                            announced.push(Change::Written(update.key, update.expected + 1));
                        }
                        replaced
                    }
                };
                if let (Some(step), Ok(())) = (then.next, &document) {
                    next_of.push(results.len());
                    nexts.push(JournalWrite::Append {
                        run: write.run().to_string(),
                        fence: write.fence(),
                        step,
                    });
                }
                Ok(Written::Then(document, None))
            }
        });
    }
    let appended = journal_writes(&mut *conn, &nexts).await?;
    for (index, answer) in next_of.into_iter().zip(appended) {
        if let Some(Ok(Written::Then(_, next))) = results.get_mut(index) {
            *next = Some(answer);
        }
    }
    Ok(results)
}

/// Journal writes checked and done in order: one statement for one, a few for several.
async fn journal_writes(
    conn: &mut SqliteConnection,
    writes: &[JournalWrite],
) -> Result<Vec<Result<(), Error>>, Error> {
    match writes {
        [] => Ok(Vec::new()),
        [write] => Ok(vec![journal_write(&mut *conn, write).await?]),
        writes => batch::journal_writes(&mut *conn, writes).await,
    }
}

/// The one answer of a segment of one write.
fn one_of(mut results: Vec<Result<Written, Error>>) -> Result<Result<Written, Error>, Error> {
    match (results.pop(), results.is_empty()) {
        (Some(result), true) => Ok(result),
        _ => Err(Error::Corrupt("a write went unanswered".to_string())),
    }
}

/// A document replaced if still at the version its writer read, and its change announced:
/// `Err` for a database failure (the batch fails), `Ok(Err)` for a refused update.
async fn replace(
    conn: &mut SqliteConnection,
    update: DocumentUpdate,
    announced: &mut Vec<Change>,
) -> Result<Result<(), Error>, Error> {
    let result = update_one(conn, &update).await?;
    if result.is_ok() {
        announced.push(Change::Written(update.key, update.expected + 1));
    }
    Ok(result)
}

impl SqliteStore {
    /// The writer connection, for one transaction; notifications are sent while it is held,
    /// so they arrive in commit order.
    pub(super) async fn write_connection(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<Sqlite>, Error> {
        self.inner.writer.acquire().await.map_err(map_err)
    }
}
