//! Journal writes of a group-committed batch in three statements instead of one (or two) per
//! write: the runs' fences and journal lengths are read once, each write is checked in order
//! against them, and what passes is written with one multi-row insert and one multi-row
//! update, which says which of the steps it completes had no outcome yet (a completion of a
//! step completed before the batch is refused). Runs inside the writer's transaction, so
//! nothing can move between the reads and the writes.

use std::collections::{BTreeSet, HashMap, HashSet};

use nodus_core::store::Error;
use rusqlite::Connection;

use super::db::{Query, get};
use super::documents::update_one;
use super::write::{DocumentUpdate, SnapshotRow};
use crate::commit::JournalWrite;
use crate::sql;

/// What is known of one run while its writes are checked.
#[derive(Default)]
struct RunState {
    fence: Option<i64>,
    len: i64,
}

/// Write `writes` (consecutive journal writes of one batch, in order): each write's own result,
/// or one error when the database failed and the transaction must roll back.
pub(super) fn journal_writes(
    conn: &Connection,
    writes: &[JournalWrite],
) -> Result<Vec<Result<(), Error>>, Error> {
    let runs: BTreeSet<&str> = writes.iter().map(JournalWrite::run).collect();
    let mut state: HashMap<String, RunState> = HashMap::new();

    // One row per run: its fence and its journal's length (each a lookup in an index; a
    // grouped MAX would read every step of the run).
    let mut query = Query::new(
        "SELECT v.column1, (SELECT fence FROM leases WHERE run_uid = v.column1), \
         (SELECT MAX(seq) + 1 FROM steps WHERE run_uid = v.column1) FROM (",
    );
    query.values(&runs, |row, run| {
        row.bind(run.to_string());
    });
    query.push(") AS v");
    let rows = query.rows(conn, |row| {
        Ok((
            get::<String>(row, 0)?,
            get::<Option<i64>>(row, 1)?,
            get::<Option<i64>>(row, 2)?,
        ))
    })?;
    for (run, fence, len) in rows {
        state.insert(
            run,
            RunState {
                fence,
                len: len.unwrap_or(0),
            },
        );
    }
    // Which steps to be completed are already completed is learned from the update itself
    // (only steps without an outcome are updated, and it returns those): the batch checks
    // in order those its own writes completed.
    let mut completed: HashSet<(String, i64)> = HashSet::new();

    // Check each write in order against what the writes before it left.
    let mut results = Vec::with_capacity(writes.len());
    let mut appends: Vec<(&str, i64, String)> = Vec::new();
    // Each with its write's index and the journal's length when it was checked.
    let mut completions: Vec<(&str, i64, String, usize, i64)> = Vec::new();
    for write in writes {
        let run = write.run();
        let run_state = state.entry(run.to_string()).or_default();
        let fence = match write {
            JournalWrite::Append { fence, .. } | JournalWrite::Complete { fence, .. } => *fence,
        };
        if run_state.fence.is_none() || run_state.fence != sql::to_i64(fence.0) {
            results.push(Err(Error::Fenced {
                run: run.to_string(),
            }));
            continue;
        }
        let len = run_state.len;
        results.push(match write {
            JournalWrite::Append { step, .. } if i64::from(step.seq) != len => {
                Err(sql::append_refused(run, step.seq, len))
            }
            JournalWrite::Append { step, .. } => sql::step_text(step).map(|text| {
                run_state.len += 1;
                appends.push((run, i64::from(step.seq), text));
            }),
            JournalWrite::Complete { seq, .. } if i64::from(*seq) >= len => {
                Err(sql::complete_refused(run, *seq, len, false))
            }
            JournalWrite::Complete { seq, .. }
                if completed.contains(&(run.to_string(), i64::from(*seq))) =>
            {
                Err(sql::complete_refused(run, *seq, len, true))
            }
            JournalWrite::Complete {
                seq, completion, ..
            } => sql::completion_text(completion).map(|text| {
                completed.insert((run.to_string(), i64::from(*seq)));
                completions.push((run, i64::from(*seq), text, results.len(), len));
            }),
        });
    }

    // Appends first: a step may be appended and completed in the same batch.
    if !appends.is_empty() {
        let mut query = Query::new("INSERT INTO steps (run_uid, seq, step) ");
        query.values(&appends, |row, (run, seq, text)| {
            row.bind(run.to_string()).bind(*seq).bind(text.clone());
        });
        let done = query.execute(conn)?;
        expect_rows(done, appends.len(), "appended")?;
    }
    if !completions.is_empty() {
        let mut query = Query::new("UPDATE steps SET completion = v.column3 FROM (");
        query.values(&completions, |row, (run, seq, text, ..)| {
            row.bind(run.to_string()).bind(*seq).bind(text.clone());
        });
        query.push(
            ") AS v WHERE steps.run_uid = v.column1 AND steps.seq = v.column2 \
             AND steps.completion IS NULL RETURNING steps.run_uid, steps.seq",
        );
        let mut done: HashSet<(String, i64)> = query
            .rows(conn, |row| Ok((get(row, 0)?, get(row, 1)?)))?
            .into_iter()
            .collect();
        // A step left out had its outcome before this batch: that completion is refused.
        for (run, seq, _, index, len) in &completions {
            if !done.remove(&(run.to_string(), *seq)) {
                let seq = u32::try_from(*seq).unwrap_or(u32::MAX);
                results[*index] = Err(sql::complete_refused(run, seq, *len, true));
            }
        }
        if !done.is_empty() {
            return Err(Error::Corrupt(format!(
                "steps completed that no write of the batch named: {done:?}"
            )));
        }
    }
    Ok(results)
}

/// Fail the batch when a checked write did not land (the checks and the table disagree).
fn expect_rows(affected: usize, expected: usize, what: &str) -> Result<(), Error> {
    if affected == expected {
        Ok(())
    } else {
        Err(Error::Corrupt(format!(
            "{expected} journal steps were to be {what}, {affected} were"
        )))
    }
}

/// Keep the snapshots that journal writes of one segment carry (one multi-row insert; a
/// snapshot kept again replaces the earlier one, as one by one).
pub(super) fn keep_snapshots(conn: &Connection, rows: &[&SnapshotRow]) -> Result<(), Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut query = Query::new("INSERT INTO snapshots (run_uid, seq, snapshot) ");
    query.values(rows, |row, snapshot| {
        row.bind(snapshot.run.clone())
            .bind(i64::from(snapshot.seq))
            .bind(snapshot.text.clone());
    });
    query.push(" ON CONFLICT (run_uid, seq) DO UPDATE SET snapshot = excluded.snapshot");
    query.execute(conn)?;
    Ok(())
}

/// Replace the documents that journal writes of one segment carry, each if still at the
/// version its writer read, in one statement that says which it replaced: each update's own
/// answer (those it did not replace are tried alone, which says why: moved on, or gone), or
/// one error when the database failed. Updates that name one document twice are carried out
/// one by one, in order.
pub(super) fn replace_documents(
    conn: &Connection,
    updates: &[&DocumentUpdate],
) -> Result<Vec<Result<(), Error>>, Error> {
    let mut keys = HashSet::new();
    let rows: Option<Vec<(&DocumentUpdate, i64, i64)>> = updates
        .iter()
        .map(|update| {
            let expected = sql::to_i64(update.expected)?;
            let version = expected.checked_add(1)?;
            keys.insert(&update.key)
                .then_some((*update, expected, version))
        })
        .collect();
    let Some(rows) = rows.filter(|rows| rows.len() > 1) else {
        let mut results = Vec::with_capacity(updates.len());
        for update in updates {
            results.push(update_one(conn, update)?);
        }
        return Ok(results);
    };
    let mut query = Query::new(
        "UPDATE resources SET version = v.column9, uid = v.column4, group_name = v.column5, \
         phase = v.column6, document = v.column7 FROM (",
    );
    query.values(&rows, |row, (update, expected, version)| {
        row.bind(update.key.project.clone())
            .bind(update.key.kind.plural().to_string())
            .bind(update.key.name.clone())
            .bind(update.columns.uid.clone())
            .bind(update.columns.group.clone())
            .bind(update.columns.phase.clone())
            .bind(update.text.clone())
            .bind(*expected)
            .bind(*version);
    });
    query.push(
        ") AS v WHERE resources.project = v.column1 AND resources.kind = v.column2 \
         AND resources.name = v.column3 AND resources.version = v.column8 \
         RETURNING resources.project, resources.kind, resources.name",
    );
    let mut replaced: HashSet<(String, String, String)> = query
        .rows(conn, |row| Ok((get(row, 0)?, get(row, 1)?, get(row, 2)?)))?
        .into_iter()
        .collect();
    let mut results = Vec::with_capacity(rows.len());
    for (update, ..) in rows {
        let key = &update.key;
        let named = (
            key.project.clone(),
            key.kind.plural().to_string(),
            key.name.clone(),
        );
        results.push(if replaced.remove(&named) {
            Ok(())
        } else {
            // Refused: alone, the update says why (and replaces nothing).
            update_one(conn, update)?
        });
    }
    if !replaced.is_empty() {
        return Err(Error::Corrupt(format!(
            "documents replaced that no update of the batch named: {replaced:?}"
        )));
    }
    Ok(results)
}
