//! The writer: SQLite has one writer at a time, so every write but batches of creates, deletes,
//! messages and rewrites (which take the writer connection for their own transaction,
//! `Db::write`) is queued for one writer task that group-commits whatever is queued in one
//! transaction (one fsync), carried out whole on the blocking pool, and answers each write
//! after the commit.

use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::store::{Change, Error, Record};
use rusqlite::Connection;

use super::batch;
use super::db::{Db, WriteTx, is_unique, map_err};
use super::documents::{insert, update_one};
use super::journal::journal_write;
use super::leases::grant;
use super::reads;
use super::write::{DocumentUpdate, SnapshotRow, Then, Write, Written};
use crate::commit::{Committer, JournalWrite};
use crate::sql;

/// The writer task's side of group commit: each batch in one transaction on the writer
/// connection, carried out on the blocking pool in one hand-off, and each document change
/// announced after the commit, while the connection is still held, so that changes arrive in
/// commit order.
pub(super) struct Writer {
    pub(super) db: Arc<Db>,
}

#[async_trait]
impl Committer<Write> for Writer {
    type Output = Written;

    async fn commit(&mut self, writes: Vec<Write>) -> Result<Vec<Result<Written, Error>>, Error> {
        self.db.write(move |tx| write_batch(tx, writes)).await
    }
}

/// A batch's writes in order, in the writer's transaction: each write's own result, or one
/// error when the database failed (the transaction then rolls back).
fn write_batch(
    tx: &mut WriteTx<'_>,
    writes: Vec<Write>,
) -> Result<Vec<Result<Written, Error>>, Error> {
    let mut results = Vec::with_capacity(writes.len());
    let mut announced = Vec::new();
    let mut writes = writes.into_iter().peekable();
    while let Some(write) = writes.next() {
        let (first, then) = match write {
            Write::Journal(write) => (write, None),
            Write::JournalThen(write, update) => (write, Some(update)),
            other => {
                results.push(write_one(tx, other, &mut announced)?);
                continue;
            }
        };
        // Consecutive journal writes (most of a busy batch) in a few statements, then the
        // documents some of them replace once done.
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
        results.extend(write_segment(tx, segment, thens, &mut announced)?);
    }
    for change in announced {
        tx.announce(change);
    }
    Ok(results)
}

/// One write of a batch: `Err` for a database failure (the batch fails), `Ok(Err)` for a
/// refused write (a stale version or fence, a lease held by another, a missing document).
fn write_one(
    conn: &Connection,
    write: Write,
    announced: &mut Vec<Change>,
) -> Result<Result<Written, Error>, Error> {
    let refused = |e: Error| match e {
        Error::Leased { .. } | Error::Fenced { .. } | Error::NotFound(_) => Ok(Err(e)),
        failure => Err(failure),
    };
    match write {
        Write::Journal(write) => one_of(write_segment(conn, vec![write], vec![None], announced)?),
        Write::JournalThen(write, then) => one_of(write_segment(
            conn,
            vec![write],
            vec![Some(then)],
            announced,
        )?),
        Write::Create {
            key,
            document,
            caps,
        } => {
            // Counted in the commit's transaction, after the writes queued before this one.
            let item = [(key, document)];
            if let Err(refused) = reads::check_caps(conn, &caps, &item) {
                return Ok(Err(refused));
            }
            let [(key, document)] = item;
            // A taken key fails this statement only (SQLite's ABORT): the batch goes on.
            match insert(conn, &key, &document) {
                Ok(()) => {}
                Err(e) if is_unique(&e) => {
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
        Write::Replace(update) => Ok(replace(conn, update, announced)?.map(|()| Written::Done)),
        Write::Edit { key, mut edit } => {
            let record = match reads::record(conn, &key) {
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
            let result = update_one(conn, &update)?;
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
        Write::Claim { run, lease } => match grant(conn, &run, &lease) {
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
            let done = conn
                .prepare_cached(
                    "UPDATE leases SET owner = ?1, expires_at = ?2 \
                     WHERE run_uid = ?3 AND fence = ?4",
                )
                .map_err(map_err)?
                .execute(rusqlite::params![
                    owner,
                    expires_at,
                    run,
                    sql::to_i64(fence.0).unwrap_or(-1)
                ])
                .map_err(map_err)?;
            if done == 0 {
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
fn write_segment(
    conn: &Connection,
    segment: Vec<JournalWrite>,
    thens: Vec<Option<Then>>,
    announced: &mut Vec<Change>,
) -> Result<Vec<Result<Written, Error>>, Error> {
    let written = journal_writes(conn, &segment)?;
    let done: Vec<&Then> = written
        .iter()
        .zip(&thens)
        .filter_map(|(result, then)| then.as_ref().filter(|_| result.is_ok()))
        .collect();
    let snapshots: Vec<&SnapshotRow> = done
        .iter()
        .filter_map(|then| then.snapshot.as_ref())
        .collect();
    batch::keep_snapshots(conn, &snapshots)?;
    let updates: Vec<&DocumentUpdate> = done
        .iter()
        .filter_map(|then| then.update.as_ref())
        .collect();
    let mut replaced = batch::replace_documents(conn, &updates)?.into_iter();
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
    let appended = journal_writes(conn, &nexts)?;
    for (index, answer) in next_of.into_iter().zip(appended) {
        if let Some(Ok(Written::Then(_, next))) = results.get_mut(index) {
            *next = Some(answer);
        }
    }
    Ok(results)
}

/// Journal writes checked and done in order: one statement for one, a few for several.
fn journal_writes(
    conn: &Connection,
    writes: &[JournalWrite],
) -> Result<Vec<Result<(), Error>>, Error> {
    match writes {
        [] => Ok(Vec::new()),
        [write] => Ok(vec![journal_write(conn, write)?]),
        writes => batch::journal_writes(conn, writes),
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
fn replace(
    conn: &Connection,
    update: DocumentUpdate,
    announced: &mut Vec<Change>,
) -> Result<Result<(), Error>, Error> {
    let result = update_one(conn, &update)?;
    if result.is_ok() {
        announced.push(Change::Written(update.key, update.expected + 1));
    }
    Ok(result)
}
