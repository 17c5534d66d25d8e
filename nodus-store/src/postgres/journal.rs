//! Run journals: appends and outcomes group-committed (many runs' steps in one statement per
//! round, one transaction), each checked against the run's fence (its lease row locked
//! `FOR SHARE`) and the journal's order inside the statement. (Reading a journal is
//! `crate::reads`'.)

use async_trait::async_trait;
use nodus_core::journal::{Completion, Step};
use nodus_core::store::{Error, Fence};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Connection, Postgres, Row};

use super::PostgresStore;
use super::leases::fenced;
use crate::commit::{self, Committer, JournalWrite};
use crate::sql::{self, map_err};

/// One round of journal writes (each run at most once) as one statement: the fence check
/// (the lease row locked `FOR SHARE`, so a concurrent claim waits or wins), the order check,
/// the inserts and the updates. Returns per write: the latest fence, the journal's length,
/// whether the step was completed already, and whether the write was done.
const JOURNAL_ROUND: &str = r#"
WITH input AS (
    SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::bool[], $6::text[])
        AS t(idx, run_uid, fence, seq, is_append, body)
),
lease AS (
    SELECT l.run_uid, l.fence FROM leases l
    WHERE l.run_uid IN (SELECT run_uid FROM input)
    FOR SHARE
),
state AS (
    SELECT i.idx, i.run_uid, i.fence, i.seq, i.is_append, i.body, l.fence AS latest,
        (SELECT COALESCE(MAX(s.seq) + 1, 0) FROM steps s WHERE s.run_uid = i.run_uid) AS len,
        COALESCE((SELECT s.completion IS NOT NULL FROM steps s
            WHERE s.run_uid = i.run_uid AND s.seq = i.seq), false) AS completed
    FROM input i LEFT JOIN lease l ON l.run_uid = i.run_uid
),
appended AS (
    INSERT INTO steps (run_uid, seq, step)
    SELECT run_uid, seq, body::json FROM state
    WHERE is_append AND latest = fence AND len = seq
    ON CONFLICT DO NOTHING
    RETURNING run_uid, seq
),
completed AS (
    UPDATE steps s SET completion = st.body::json FROM state st
    WHERE NOT st.is_append AND st.latest = st.fence
        AND s.run_uid = st.run_uid AND s.seq = st.seq AND s.completion IS NULL
    RETURNING s.run_uid, s.seq
)
SELECT st.idx, st.latest, st.len, st.completed,
    EXISTS (SELECT 1 FROM appended a WHERE a.run_uid = st.run_uid AND a.seq = st.seq)
    OR EXISTS (SELECT 1 FROM completed c WHERE c.run_uid = st.run_uid AND c.seq = st.seq)
FROM state st
"#;

/// The writer task's side of group commit, with a connection of its own (taken again from
/// the pool after a failure).
pub(super) struct JournalCommitter {
    pool: PgPool,
    conn: Option<sqlx::pool::PoolConnection<Postgres>>,
}

impl JournalCommitter {
    /// A committer that takes its connection from `pool` when it first writes.
    pub(super) fn new(pool: PgPool) -> Self {
        JournalCommitter { pool, conn: None }
    }
}

#[async_trait]
impl Committer<JournalWrite> for JournalCommitter {
    type Output = ();
    async fn commit(&mut self, writes: Vec<JournalWrite>) -> Result<Vec<Result<(), Error>>, Error> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.pool.acquire().await.map_err(map_err)?,
        };
        let result = match writes.as_slice() {
            [one] => write_one(&mut conn, one).await.map(|r| vec![r]),
            _ => commit_journal(&mut conn, writes).await,
        };
        if result.is_ok() {
            self.conn = Some(conn);
        }
        result
    }
}

/// Write a batch of journal writes: one statement per round, in one transaction when there
/// is more than one round; each write gets its own result.
async fn commit_journal(
    conn: &mut PgConnection,
    writes: Vec<JournalWrite>,
) -> Result<Vec<Result<(), Error>>, Error> {
    let mut results: Vec<Option<Result<(), Error>>> = (0..writes.len()).map(|_| None).collect();
    // Bodies first: a write that cannot be serialized is refused on its own.
    let mut bodies: Vec<Option<String>> = Vec::with_capacity(writes.len());
    for (index, write) in writes.iter().enumerate() {
        let body = match write {
            JournalWrite::Append { step, .. } => sql::step_text(step),
            JournalWrite::Complete { completion, .. } => sql::completion_text(completion),
        };
        match body {
            Ok(body) => bodies.push(Some(body)),
            Err(e) => {
                bodies.push(None);
                results[index] = Some(Err(e));
            }
        }
    }
    let rounds = commit::rounds(&writes);
    if rounds.len() == 1 {
        // One statement: its own transaction, one round trip, one commit.
        for round in &rounds {
            run_round(conn, &writes, &bodies, round, &mut results).await?;
        }
    } else {
        let mut tx = conn.begin().await.map_err(map_err)?;
        for round in &rounds {
            run_round(&mut tx, &writes, &bodies, round, &mut results).await?;
        }
        tx.commit().await.map_err(map_err)?;
    }
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Corrupt("a journal write was lost".to_string()))))
        .collect())
}

/// A batch of one write: a plain statement that commits by itself; the reason for a refusal
/// is read afterwards.
async fn write_one(
    conn: &mut PgConnection,
    write: &JournalWrite,
) -> Result<Result<(), Error>, Error> {
    let run = write.run();
    let (fence, seq, body) = match write {
        JournalWrite::Append { fence, step, .. } => (*fence, step.seq, sql::step_text(step)),
        JournalWrite::Complete {
            fence,
            seq,
            completion,
            ..
        } => (*fence, *seq, sql::completion_text(completion)),
    };
    let body = match body {
        Ok(body) => body,
        Err(e) => return Ok(Err(e)),
    };
    // A fence that does not fit a bigint matches no stored fence.
    let fence_value = sql::to_i64(fence.0).unwrap_or(-1);
    let statement = match write {
        JournalWrite::Append { .. } => {
            "WITH lease AS (SELECT fence FROM leases WHERE run_uid = $1 FOR SHARE) \
             INSERT INTO steps (run_uid, seq, step) SELECT $1, $2, $3::json \
             WHERE (SELECT fence FROM lease) = $4 \
             AND (SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = $1) = $2 \
             ON CONFLICT DO NOTHING"
        }
        JournalWrite::Complete { .. } => {
            "WITH lease AS (SELECT fence FROM leases WHERE run_uid = $1 FOR SHARE) \
             UPDATE steps SET completion = $3::json \
             WHERE run_uid = $1 AND seq = $2 AND completion IS NULL \
             AND (SELECT fence FROM lease) = $4"
        }
    };
    let done = sqlx::query(statement)
        .bind(run)
        .bind(i64::from(seq))
        .bind(body)
        .bind(fence_value)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    if done.rows_affected() == 1 {
        return Ok(Ok(()));
    }
    let row = sqlx::query(
        "SELECT (SELECT fence FROM leases WHERE run_uid = $1), \
         (SELECT COALESCE(MAX(seq) + 1, 0) FROM steps WHERE run_uid = $1), \
         COALESCE((SELECT completion IS NOT NULL FROM steps WHERE run_uid = $1 AND seq = $2), \
         false)",
    )
    .bind(run)
    .bind(i64::from(seq))
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    let latest: Option<i64> = row.try_get(0).map_err(map_err)?;
    let len: i64 = row.try_get(1).map_err(map_err)?;
    let completed: bool = row.try_get(2).map_err(map_err)?;
    Ok(Err(if latest.is_none() || latest != sql::to_i64(fence.0) {
        fenced(run)
    } else {
        match write {
            JournalWrite::Append { .. } => sql::append_refused(run, seq, len),
            JournalWrite::Complete { .. } => sql::complete_refused(run, seq, len, completed),
        }
    }))
}

/// One round of a batch (each run at most once) as one statement; fills in each write's
/// result.
async fn run_round(
    conn: &mut PgConnection,
    writes: &[JournalWrite],
    bodies: &[Option<String>],
    round: &[usize],
    results: &mut [Option<Result<(), Error>>],
) -> Result<(), Error> {
    let mut idx = Vec::new();
    let mut runs = Vec::new();
    let mut fences = Vec::new();
    let mut seqs = Vec::new();
    let mut appends = Vec::new();
    let mut texts = Vec::new();
    for &index in round {
        let (Some(write), Some(Some(body))) = (writes.get(index), bodies.get(index)) else {
            continue;
        };
        let (fence, seq, is_append) = match write {
            JournalWrite::Append { fence, step, .. } => (*fence, step.seq, true),
            JournalWrite::Complete { fence, seq, .. } => (*fence, *seq, false),
        };
        idx.push(i64::try_from(index).unwrap_or(i64::MAX));
        runs.push(write.run().to_string());
        // A fence that does not fit a bigint matches no stored fence.
        fences.push(sql::to_i64(fence.0).unwrap_or(-1));
        seqs.push(i64::from(seq));
        appends.push(is_append);
        texts.push(body.clone());
    }
    if idx.is_empty() {
        return Ok(());
    }
    let rows = sqlx::query(JOURNAL_ROUND)
        .bind(idx)
        .bind(runs)
        .bind(fences)
        .bind(seqs)
        .bind(appends)
        .bind(texts)
        .fetch_all(conn)
        .await
        .map_err(map_err)?;
    for row in rows {
        let index: i64 = row.try_get(0).map_err(map_err)?;
        let latest: Option<i64> = row.try_get(1).map_err(map_err)?;
        let len: i64 = row.try_get(2).map_err(map_err)?;
        let completed: bool = row.try_get(3).map_err(map_err)?;
        let done: bool = row.try_get(4).map_err(map_err)?;
        let Some(write) = usize::try_from(index).ok().and_then(|i| writes.get(i)) else {
            return Err(Error::Corrupt(format!("journal write {index} is unknown")));
        };
        let run = write.run();
        let result = match write {
            _ if done => Ok(()),
            JournalWrite::Append { fence, .. } | JournalWrite::Complete { fence, .. }
                if latest.is_none() || latest != sql::to_i64(fence.0) =>
            {
                Err(fenced(run))
            }
            JournalWrite::Append { step, .. } => Err(sql::append_refused(run, step.seq, len)),
            JournalWrite::Complete { seq, .. } => {
                Err(sql::complete_refused(run, *seq, len, completed))
            }
        };
        if let Some(slot) = usize::try_from(index).ok().and_then(|i| results.get_mut(i)) {
            *slot = Some(result);
        }
    }
    Ok(())
}

pub(super) async fn append_step(
    store: &PostgresStore,
    run_uid: &str,
    fence: Fence,
    step: &Step,
) -> Result<(), Error> {
    store
        .inner
        .journal
        .write(JournalWrite::Append {
            run: run_uid.to_string(),
            fence,
            step: step.clone(),
        })
        .await
}

pub(super) async fn complete_step(
    store: &PostgresStore,
    run_uid: &str,
    fence: Fence,
    seq: u32,
    completion: &Completion,
) -> Result<(), Error> {
    store
        .inner
        .journal
        .write(JournalWrite::Complete {
            run: run_uid.to_string(),
            fence,
            seq,
            completion: completion.clone(),
        })
        .await
}
