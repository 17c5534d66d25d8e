//! Run journals: appends and outcomes go through the writer (a busy batch's journal writes in
//! a few statements, see `batch`), each checked against the run's fence and the journal's
//! order in the writer's transaction. (Reading a journal is `crate::reads`'.)

use nodus_core::journal::{Completion, Step};
use nodus_core::store::{Error, Fence, OutcomeWritten, Record, WithOutcome, check_kept};
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::db::map_err;
use super::write::{DocumentUpdate, SnapshotRow, Then, Write};
use crate::commit::JournalWrite;
use crate::sql;

/// One journal write, checked and done in one statement: `Err` for a database failure (the
/// batch fails), `Ok(Err)` for a refused write, whose reason is then read.
pub(super) fn journal_write(
    conn: &Connection,
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
            conn.prepare_cached(
                "INSERT INTO steps (run_uid, seq, step) SELECT ?1, ?2, ?3 \
                 WHERE (SELECT fence FROM leases WHERE run_uid = ?1) = ?4 \
                 AND (SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = ?1) = ?2",
            )
            .map_err(map_err)?
            .execute(params![run, i64::from(seq), text, fence_value])
            .map_err(map_err)?
        }
        JournalWrite::Complete { completion, .. } => {
            let text = match sql::completion_text(completion) {
                Ok(text) => text,
                Err(e) => return Ok(Err(e)),
            };
            conn.prepare_cached(
                "UPDATE steps SET completion = ?1 WHERE run_uid = ?2 AND seq = ?3 \
                 AND completion IS NULL \
                 AND (SELECT fence FROM leases WHERE run_uid = ?2) = ?4",
            )
            .map_err(map_err)?
            .execute(params![text, run, i64::from(seq), fence_value])
            .map_err(map_err)?
        }
    };
    if done == 1 {
        return Ok(Ok(()));
    }
    // Refused: say why.
    let latest: Option<i64> = conn
        .prepare_cached("SELECT fence FROM leases WHERE run_uid = ?1")
        .map_err(map_err)?
        .query_row(params![run], |row| row.get(0))
        .optional()
        .map_err(map_err)?;
    if latest.is_none() || latest != sql::to_i64(fence.0) {
        return Ok(Err(Error::Fenced {
            run: run.to_string(),
        }));
    }
    let len: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = ?1")
        .map_err(map_err)?
        .query_row(params![run], |row| row.get(0))
        .map_err(map_err)?;
    Ok(Err(match write {
        JournalWrite::Append { .. } => sql::append_refused(run, seq, len),
        JournalWrite::Complete { .. } => sql::complete_refused(run, seq, len, i64::from(seq) < len),
    }))
}

pub(super) async fn append_step(
    store: &SqliteStore,
    run_uid: &str,
    fence: Fence,
    step: &Step,
) -> Result<(), Error> {
    store
        .inner
        .writes
        .write(Write::Journal(JournalWrite::Append {
            run: run_uid.to_string(),
            fence,
            step: step.clone(),
        }))
        .await
        .map(drop)
}

pub(super) async fn complete_step(
    store: &SqliteStore,
    run_uid: &str,
    fence: Fence,
    seq: u32,
    completion: &Completion,
) -> Result<(), Error> {
    store
        .inner
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

/// [`Store::complete_step_with`]: the outcome and what it carries in one submission to the
/// writer (one transaction, one commit); the outcome alone as [`complete_step`].
///
/// [`Store::complete_step_with`]: nodus_core::Store::complete_step_with
pub(super) async fn complete_step_with(
    store: &SqliteStore,
    run_uid: &str,
    fence: Fence,
    seq: u32,
    completion: &Completion,
    with: WithOutcome<'_>,
) -> Result<OutcomeWritten, Error> {
    let complete = JournalWrite::Complete {
        run: run_uid.to_string(),
        fence,
        seq,
        completion: completion.clone(),
    };
    if with.snapshot.is_none() && with.then.is_none() && with.next.is_none() {
        store.inner.writes.write(Write::Journal(complete)).await?;
        return Ok(OutcomeWritten {
            document: None,
            next: None,
        });
    }
    let snapshot = match with.snapshot {
        Some(snapshot) => {
            check_kept(run_uid, seq, snapshot)?;
            Some(SnapshotRow {
                run: run_uid.to_string(),
                seq,
                text: sql::snapshot_text(snapshot)?,
            })
        }
        None => None,
    };
    let update = with.then.map(|then| DocumentUpdate {
        key: then.key.clone(),
        expected: then.expected_version,
        columns: sql::Columns::of(&then.document),
        text: sql::document_text(&then.document),
    });
    let then = Then {
        snapshot,
        update,
        next: with.next.cloned(),
    };
    let (document, next) = store
        .inner
        .writes
        .write(Write::JournalThen(complete, then))
        .await?
        .then()?;
    Ok(OutcomeWritten {
        document: with.then.map(|then| {
            // Only used when the update succeeds, that is when `expected` is stored.
            document.map(|()| Record {
                key: then.key.clone(),
                version: then.expected_version.saturating_add(1),
                document: then.document.clone(),
            })
        }),
        next,
    })
}
