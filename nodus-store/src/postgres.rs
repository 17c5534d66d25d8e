//! The Postgres [`Store`]: several server replicas on one database.
//!
//! Runs are claimed with leases: every lease change is one conditional statement on the run's
//! lease row, so two replicas never both hold a run; journal writes lock that row (`FOR SHARE`) and check the fence, so a
//! replica whose lease was taken over cannot write. Journal writes are group-committed (see
//! [`crate::group`]): many runs' steps share one transaction, each acknowledged after commit.
//! Changes are announced with `pg_notify` inside the writing transaction (delivered on
//! commit, in commit order) and heard by one `LISTEN` connection per store; notifications
//! sent while that connection is being re-established are lost, so waiters should also
//! re-read on a timer.
//!
//! Documents are `json`, kept exactly as written. The schema is versioned and migrated on
//! connect; each store lives in one Postgres schema (`nodus` by default).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use nodus_core::journal::{Completion, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{
    Change, Delivery, Edit, Error, Fence, InboxMessage, Lease, ObjectKey, Record, RunRewrite,
    Selector, Store,
};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, Postgres, QueryBuilder, Row};
use tokio::sync::{broadcast, oneshot};

use crate::group::{self, Committer, GroupCommit, JournalWrite};
use crate::sql::{self, map_err};

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_CAPACITY: usize = 1024;

/// How many times a claim is tried again when a concurrent claim changed the lease between
/// reading and writing it.
const CLAIM_ATTEMPTS: usize = 16;

/// The migrations, applied on connect.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host:port/database`.
    pub url: String,
    /// The schema the store's tables live in (created if missing): lowercase letters, digits
    /// and `_`, at most 40 characters.
    pub schema: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long a call waits for a connection before failing with `Unavailable`.
    pub acquire_timeout: Duration,
}

impl PostgresOptions {
    /// Options for `url`, schema `nodus`.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            schema: "nodus".to_string(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
        }
    }

    /// The same, in another schema.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
}

/// A store in a Postgres schema. Cloning is cheap; clones share the pool, the listener and
/// the change channel.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    channel: String,
    journal: GroupCommit,
    /// Atomic edits ([`Store::modify`]), group-committed: many runs' reservations on one
    /// account share one transaction, which holds the account's row lock once.
    edits: GroupCommit<EditWrite, Record>,
    changes: broadcast::Sender<Change>,
    /// Who is waiting to hear their own notifications.
    heard: Arc<Heard>,
    /// Dropped with the store, which stops the listener task.
    _stop_listening: oneshot::Sender<()>,
}

/// A write returns only once this store's listener heard its change and passed it on to the
/// subscribers in this process, so that "changes from now on" means the same as in the
/// in-process backends: a subscriber made after a write returned never sees that write.
#[derive(Debug, Default)]
struct Heard {
    /// This store instance's name in notifications.
    instance: String,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl Heard {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, oneshot::Sender<()>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A token to put in a notification, and what tells when it was heard.
    fn expect(self: &Arc<Self>) -> (u64, Hearing) {
        let token = self.next.fetch_add(1, AtomicOrdering::Relaxed);
        let (heard, hearing) = oneshot::channel();
        self.lock().insert(token, heard);
        let hearing = Hearing {
            token,
            heard: Arc::clone(self),
            hearing,
        };
        (token, hearing)
    }

    fn heard(&self, instance: &str, token: u64) {
        if instance != self.instance {
            return;
        }
        if let Some(heard) = self.lock().remove(&token) {
            let _ = heard.send(());
        }
    }
}

/// Waits until a notification was heard; forgets it when dropped.
struct Hearing {
    token: u64,
    heard: Arc<Heard>,
    hearing: oneshot::Receiver<()>,
}

impl Hearing {
    /// Wait until heard, or for at most `HEARING`: the write is durable either way, and a
    /// listener that is reconnecting must not hold writers up.
    async fn wait(mut self) {
        let _ = tokio::time::timeout(HEARING, &mut self.hearing).await;
    }
}

impl Drop for Hearing {
    fn drop(&mut self) {
        self.heard.lock().remove(&self.token);
    }
}

/// How long a write waits to hear its own change notification.
const HEARING: Duration = Duration::from_secs(5);

/// Counts store instances in this process, to name each in notifications.
static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl PostgresStore {
    /// Extend the lease that `fence` holds to `renewal`, or give it up (`None`); `Fenced`
    /// once another claim took the run over.
    async fn set_lease(
        &self,
        run_uid: &str,
        fence: Fence,
        renewal: Option<&Lease>,
    ) -> Result<(), Error> {
        let (owner, expires_at) = match renewal {
            Some(lease) => (Some(lease.owner.as_str()), sql::nanos(lease.expires_at()?)?),
            None => (None, i64::MIN),
        };
        let Some(fence) = sql::to_i64(fence.0) else {
            return Err(fenced(run_uid));
        };
        let done = sqlx::query(
            "UPDATE leases SET owner = $1, expires_at = $2 WHERE run_uid = $3 AND fence = $4",
        )
        .bind(owner)
        .bind(expires_at)
        .bind(run_uid)
        .bind(fence)
        .execute(&self.inner.pool)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 0 {
            return Err(fenced(run_uid));
        }
        Ok(())
    }

    /// Connect, create the schema if needed, migrate it, and start listening for changes.
    pub async fn connect(options: PostgresOptions) -> Result<Self, Error> {
        let schema = options.schema.clone();
        if schema.is_empty()
            || schema.len() > 40
            || !schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(Error::Invalid(format!(
                "schema name {schema:?}: use lowercase letters, digits and _ (at most 40)"
            )));
        }
        let connect: PgConnectOptions = options
            .url
            .parse()
            .map_err(|e| Error::Invalid(format!("database URL: {e}")))?;
        // The schema name is checked above: it is an identifier, never user input.
        let mut conn = PgConnection::connect_with(&connect)
            .await
            .map_err(map_err)?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&mut conn)
            .await
            .or_else(|e| {
                // Two stores creating one schema at once: the loser sees a unique violation.
                if sql::is_unique_violation(&e) {
                    Ok(Default::default())
                } else {
                    Err(map_err(e))
                }
            })?;
        let _ = conn.close().await;
        let application = format!("nodus-{schema}");
        let connect = connect
            .options([("search_path", schema.as_str())])
            .application_name(&application);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(2))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(map_err)?;
        MIGRATOR.run(&pool).await.map_err(migrate_error)?;

        let channel = format!("nodus_changes_{schema}");
        let (changes, _) = broadcast::channel(CHANGE_CAPACITY);
        let mut listener = PgListener::connect_with(&pool).await.map_err(map_err)?;
        listener.listen(&channel).await.map_err(map_err)?;
        let (stop, stopped) = oneshot::channel();
        let heard = Arc::new(Heard {
            instance: format!(
                "{}-{}",
                nodus_core::store::process_owner(),
                INSTANCES.fetch_add(1, AtomicOrdering::Relaxed)
            ),
            ..Heard::default()
        });
        tokio::spawn(listen(
            listener,
            changes.clone(),
            Arc::clone(&heard),
            stopped,
        ));

        let journal = GroupCommit::spawn(JournalCommitter {
            pool: pool.clone(),
            conn: None,
        });
        let edits = GroupCommit::spawn(EditCommitter {
            pool: pool.clone(),
            channel: channel.clone(),
            heard: Arc::clone(&heard),
        });
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                channel,
                journal,
                edits,
                changes,
                heard,
                _stop_listening: stop,
            }),
        })
    }

    /// Close the pool; later calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    /// Announce a change when the transaction commits; after the commit, wait on what this
    /// returns.
    async fn notify(&self, conn: &mut PgConnection, change: &Change) -> Result<Hearing, Error> {
        notify(conn, &self.inner.channel, &self.inner.heard, change).await
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>, Error> {
        self.inner.pool.begin().await.map_err(map_err)
    }
}

/// Announce `change` on `channel` inside the caller's transaction; the answer tells when this
/// store heard it back.
async fn notify(
    conn: &mut PgConnection,
    channel: &str,
    heard: &Arc<Heard>,
    change: &Change,
) -> Result<Hearing, Error> {
    let (token, hearing) = heard.expect();
    sqlx::query("SELECT pg_notify($1, $2)::text")
        .bind(channel)
        .bind(change_payload(change, &heard.instance, token))
        .execute(conn)
        .await
        .map_err(map_err)?;
    Ok(hearing)
}

/// Hear notifications and pass them on, until the store is dropped.
/// The conditions of a listing after `WHERE project = `: the project, the kind and the
/// selector, pushed down through bound paths, in creation order. The exact match is
/// `Selector::matches` afterwards (numbers and booleans match their text there).
fn push_selection<'a>(
    query: &mut QueryBuilder<'a, Postgres>,
    project: &'a str,
    kind: Kind,
    selector: &'a Selector,
) {
    query.push_bind(project);
    query.push(" AND kind = ");
    query.push_bind(sql::kind_name(kind));
    for (label, value) in &selector.labels {
        let path = vec![
            "metadata".to_string(),
            "labels".to_string(),
            label.to_string(),
        ];
        query.push(" AND json_typeof(document #> ");
        query.push_bind(path.clone());
        query.push(") = 'string' AND document #>> ");
        query.push_bind(path);
        query.push(" = ");
        query.push_bind(value.as_str());
    }
    for (field, value) in &selector.fields {
        if sql::push_column_match(query, field, value) {
            continue;
        }
        let path: Vec<String> = field.split('.').map(str::to_string).collect();
        query.push(" AND (json_typeof(document #> ");
        query.push_bind(path.clone());
        query.push(") IN ('number', 'boolean') OR (json_typeof(document #> ");
        query.push_bind(path.clone());
        query.push(") = 'string' AND document #>> ");
        query.push_bind(path);
        query.push(" = ");
        query.push_bind(value.as_str());
        query.push("))");
    }
    query.push(" ORDER BY ord");
}

async fn listen(
    mut listener: PgListener,
    changes: broadcast::Sender<Change>,
    heard: Arc<Heard>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            received = listener.recv() => match received {
                Ok(notification) => match parse_change(notification.payload()) {
                    Some((change, instance, token)) => {
                        let _ = changes.send(change);
                        heard.heard(&instance, token);
                    }
                    None => tracing::warn!(
                        payload = notification.payload(),
                        "ignoring an unreadable change notification"
                    ),
                },
                Err(error) => {
                    tracing::warn!(%error, "change listener lost its connection; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
        }
    }
}

/// A change as a notification payload:
/// `[instance, token, "w", project, kind, name, version]` or
/// `[instance, token, "d", project, kind, name]`.
fn change_payload(change: &Change, instance: &str, token: u64) -> String {
    let kind = |key: &ObjectKey| sql::kind_name(key.kind);
    match change {
        Change::Written(key, version) => {
            json!([
                instance,
                token,
                "w",
                key.project,
                kind(key),
                key.name,
                version
            ])
        }
        Change::Deleted(key) => json!([instance, token, "d", key.project, kind(key), key.name]),
    }
    .to_string()
}

fn parse_change(payload: &str) -> Option<(Change, String, u64)> {
    let value: Value = serde_json::from_str(payload).ok()?;
    let key = ObjectKey::new(
        value.get(3)?.as_str()?,
        Kind::from_plural(value.get(4)?.as_str()?)?,
        value.get(5)?.as_str()?,
    );
    let change = match value.get(2)?.as_str()? {
        "w" => Change::Written(key, value.get(6)?.as_u64()?),
        "d" => Change::Deleted(key),
        _ => return None,
    };
    let instance = value.get(0)?.as_str()?.to_string();
    Some((change, instance, value.get(1)?.as_u64()?))
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
struct JournalCommitter {
    pool: PgPool,
    conn: Option<sqlx::pool::PoolConnection<Postgres>>,
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
    let rounds = group::rounds(&writes);
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

/// Insert a document known to be new.
async fn insert(
    conn: &mut PgConnection,
    key: &ObjectKey,
    document: &Value,
) -> Result<(), sqlx::Error> {
    let columns = sql::Columns::of(document);
    sqlx::query(
        "INSERT INTO resources (project, kind, name, version, uid, group_name, phase, document) \
         VALUES ($1, $2, $3, 1, $4, $5, $6, $7::json)",
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

/// A run's lease holder and expiry, to explain a refused claim.
async fn leased(conn: &mut PgConnection, run_uid: &str) -> Result<Option<Error>, Error> {
    let row = sqlx::query("SELECT owner, expires_at FROM leases WHERE run_uid = $1")
        .bind(run_uid)
        .fetch_optional(conn)
        .await
        .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let owner: Option<String> = row.try_get(0).map_err(map_err)?;
    let until: i64 = row.try_get(1).map_err(map_err)?;
    Ok(owner.map(|owner| Error::Leased {
        run: run_uid.to_string(),
        owner,
        until: sql::from_nanos(until).unwrap_or(Timestamp::MAX),
    }))
}

/// Check the fence of a write that names it.
fn fenced(run_uid: &str) -> Error {
    Error::Fenced {
        run: run_uid.to_string(),
    }
}

/// An edit queued for the edit committer.
struct EditWrite {
    key: ObjectKey,
    edit: Edit,
}

impl std::fmt::Debug for EditWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Edit({})", self.key)
    }
}

/// The edit writer's side of group commit: one transaction per batch locks each document
/// the batch edits (`FOR UPDATE`, in key order, so two replicas' batches cannot deadlock on
/// each other), applies the edits in the order they were queued, writes each version and
/// announces it, and commits once. Each edit is answered after the commit, once its change
/// was heard back.
struct EditCommitter {
    pool: PgPool,
    channel: String,
    heard: Arc<Heard>,
}

#[async_trait]
impl Committer<EditWrite> for EditCommitter {
    type Output = Record;

    async fn commit(
        &mut self,
        writes: Vec<EditWrite>,
    ) -> Result<Vec<Result<Record, Error>>, Error> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let keys: std::collections::BTreeSet<&ObjectKey> = writes.iter().map(|w| &w.key).collect();
        let mut current: HashMap<ObjectKey, Option<Record>> = HashMap::new();
        for key in keys {
            let record = match read_record(&mut *tx, key, " FOR UPDATE").await {
                Ok(record) => Some(record),
                Err(Error::NotFound(_)) => None,
                Err(e) => return Err(e),
            };
            current.insert(key.clone(), record);
        }
        let mut results = Vec::with_capacity(writes.len());
        let mut hearings = Vec::new();
        for EditWrite { key, mut edit } in writes {
            let Some(Some(record)) = current.get_mut(&key) else {
                results.push(Err(Error::NotFound(key)));
                continue;
            };
            let Some(document) = edit(&record.document) else {
                results.push(Ok(record.clone()));
                continue;
            };
            let stored = sql::to_i64(record.version).ok_or_else(|| {
                Error::Corrupt(format!("{key}: version {} too large", record.version))
            })?;
            let version = sql::bump(&key, stored)?;
            let columns = sql::Columns::of(&document);
            sqlx::query(
                "UPDATE resources SET version = $1, uid = $2, group_name = $3, phase = $4, \
                 document = $5::json WHERE project = $6 AND kind = $7 AND name = $8",
            )
            .bind(version)
            .bind(columns.uid)
            .bind(columns.group)
            .bind(columns.phase)
            .bind(sql::document_text(&document))
            .bind(&key.project)
            .bind(sql::kind_name(key.kind))
            .bind(&key.name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            record.version = sql::to_u64(version, "a version")?;
            record.document = document;
            let change = Change::Written(key, record.version);
            hearings.push(notify(&mut tx, &self.channel, &self.heard, &change).await?);
            results.push(Ok(record.clone()));
        }
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(results)
    }
}

/// A run's inbox, in order, read through `executor`.
async fn inbox_of<'e>(
    executor: impl sqlx::Executor<'e, Database = Postgres>,
    run_uid: &str,
) -> Result<Vec<InboxMessage>, Error> {
    let rows = sqlx::query(
        "SELECT seq, message_key, payload, received_at FROM inbox WHERE run_uid = $1 \
         ORDER BY seq",
    )
    .bind(run_uid)
    .fetch_all(executor)
    .await
    .map_err(map_err)?;
    rows.iter().map(sql::message_of).collect()
}

/// Read a document through `executor`; `lock` is appended to the query (`" FOR UPDATE"`
/// inside a transaction that writes it next).
async fn read_record<'e>(
    executor: impl sqlx::Executor<'e, Database = Postgres>,
    key: &ObjectKey,
    lock: &str,
) -> Result<Record, Error> {
    let query = format!(
        "SELECT version, document::text FROM resources \
         WHERE project = $1 AND kind = $2 AND name = $3{lock}"
    );
    let row = sqlx::query(&query)
        .bind(&key.project)
        .bind(sql::kind_name(key.kind))
        .bind(&key.name)
        .fetch_optional(executor)
        .await
        .map_err(map_err)?
        .ok_or_else(|| Error::NotFound(key.clone()))?;
    sql::record_of(key.clone(), &row, 0)
}

#[async_trait]
impl Store for PostgresStore {
    async fn create(&self, key: &ObjectKey, document: Value) -> Result<Record, Error> {
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        match insert(&mut tx, key, &document).await {
            Ok(()) => {}
            Err(e) if sql::is_unique_violation(&e) => {
                return Err(Error::AlreadyExists(key.clone()));
            }
            Err(e) => return Err(map_err(e)),
        }
        hearings.push(
            self.notify(&mut tx, &Change::Written(key.clone(), 1))
                .await?,
        );
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
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
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        if let Some((project, key)) = &scope {
            // Repeats of one key wait for each other, then see the first one's records.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
                .bind(project)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            let stored: Option<String> = sqlx::query_scalar(
                "SELECT records::text FROM batches WHERE project = $1 AND idempotency_key = $2",
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
        // In order: an item that exists, or that an earlier item named, refuses the batch.
        for (key, document) in &items {
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
            sqlx::query(
                "INSERT INTO batches (project, idempotency_key, records) VALUES ($1, $2, $3::json)",
            )
            .bind(project)
            .bind(key)
            .bind(sql::batch_text(&records))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        for record in &records {
            hearings.push(
                self.notify(&mut tx, &Change::Written(record.key.clone(), 1))
                    .await?,
            );
        }
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(records)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        read_record(&self.inner.pool, key, "").await
    }

    async fn modify(&self, key: &ObjectKey, edit: Edit) -> Result<Record, Error> {
        self.inner
            .edits
            .write(EditWrite {
                key: key.clone(),
                edit,
            })
            .await
    }

    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        let mut query: QueryBuilder<Postgres> = QueryBuilder::new(
            "SELECT name, version, document::text FROM resources WHERE project = ",
        );
        push_selection(&mut query, project, kind, selector);
        let rows = query
            .build()
            .fetch_all(&self.inner.pool)
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
        let mut query: QueryBuilder<Postgres> = QueryBuilder::new("SELECT name, version");
        for path in &wanted {
            // JSON text, or NULL when the path is absent.
            query.push(", (document #> ");
            query.push_bind(path.split('.').map(str::to_string).collect::<Vec<_>>());
            query.push(")::text");
        }
        query.push(" FROM resources WHERE project = ");
        push_selection(&mut query, project, kind, selector);
        let rows = query
            .build()
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map_err)?;
        sql::selected(project, kind, selector, &rows, |key, row, at| {
            sql::sparse_record_of(key, row, at, &wanted)
        })
    }

    async fn projects(&self) -> Result<Vec<String>, Error> {
        sqlx::query_scalar("SELECT DISTINCT project FROM resources ORDER BY project")
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map_err)
    }

    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: Value,
    ) -> Result<Record, Error> {
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        let columns = sql::Columns::of(&document);
        let updated: Option<i64> = match sql::to_i64(expected_version) {
            Some(expected) => sqlx::query_scalar(
                "UPDATE resources SET version = version + 1, uid = $1, group_name = $2, \
                 phase = $3, document = $4::json \
                 WHERE project = $5 AND kind = $6 AND name = $7 AND version = $8 \
                 RETURNING version",
            )
            .bind(columns.uid)
            .bind(columns.group)
            .bind(columns.phase)
            .bind(sql::document_text(&document))
            .bind(&key.project)
            .bind(sql::kind_name(key.kind))
            .bind(&key.name)
            .bind(expected)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?,
            None => None,
        };
        let Some(version) = updated else {
            let actual: Option<i64> = sqlx::query_scalar(
                "SELECT version FROM resources WHERE project = $1 AND kind = $2 AND name = $3",
            )
            .bind(&key.project)
            .bind(sql::kind_name(key.kind))
            .bind(&key.name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            return match actual {
                None => Err(Error::NotFound(key.clone())),
                Some(actual) => Err(Error::Conflict {
                    key: key.clone(),
                    expected: expected_version,
                    actual: sql::to_u64(actual, "a version")?,
                }),
            };
        };
        let version = sql::to_u64(version, "a version")?;
        hearings.push(
            self.notify(&mut tx, &Change::Written(key.clone(), version))
                .await?,
        );
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(Record {
            key: key.clone(),
            version,
            document,
        })
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), Error> {
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        let uid: Option<Option<String>> = sqlx::query_scalar(
            "DELETE FROM resources WHERE project = $1 AND kind = $2 AND name = $3 RETURNING uid",
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
                "DELETE FROM steps WHERE run_uid = $1",
                "DELETE FROM inbox WHERE run_uid = $1",
                // Old fences stay stale: the counter moves on and nobody holds it.
                "UPDATE leases SET fence = fence + 1, owner = NULL WHERE run_uid = $1",
            ] {
                sqlx::query(statement)
                    .bind(&uid)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            }
        }
        hearings.push(self.notify(&mut tx, &Change::Deleted(key.clone())).await?);
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(())
    }

    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        let expires_at = sql::nanos(lease.expires_at()?)?;
        let now = sql::nanos(lease.now)?;
        let mut conn = self.inner.pool.acquire().await.map_err(map_err)?;
        for _ in 0..CLAIM_ATTEMPTS {
            let fence: Option<i64> = sqlx::query_scalar(
                "INSERT INTO leases (run_uid, fence, owner, expires_at) VALUES ($1, 1, $2, $3) \
                 ON CONFLICT (run_uid) DO UPDATE SET fence = leases.fence + 1, \
                 owner = excluded.owner, expires_at = excluded.expires_at \
                 WHERE leases.owner IS NULL OR leases.owner = excluded.owner \
                 OR leases.expires_at <= $4 \
                 RETURNING fence",
            )
            .bind(run_uid)
            .bind(&lease.owner)
            .bind(expires_at)
            .bind(now)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
            if let Some(fence) = fence {
                return Ok(Fence(sql::to_u64(fence, "a fence")?));
            }
            if let Some(refused) = leased(&mut conn, run_uid).await? {
                return Err(refused);
            }
            // Released between the two statements: try again.
        }
        Err(Error::Unavailable(format!(
            "run {run_uid}: the lease kept changing while claiming it"
        )))
    }

    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error> {
        self.set_lease(run_uid, fence, Some(lease)).await
    }

    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        self.set_lease(run_uid, fence, None).await
    }

    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error> {
        self.inner
            .journal
            .write(JournalWrite::Append {
                run: run_uid.to_string(),
                fence,
                step: step.clone(),
            })
            .await
    }

    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.inner
            .journal
            .write(JournalWrite::Complete {
                run: run_uid.to_string(),
                fence,
                seq,
                completion: completion.clone(),
            })
            .await
    }

    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        let rows = sqlx::query(
            "SELECT step::text, completion::text FROM steps WHERE run_uid = $1 ORDER BY seq",
        )
        .bind(run_uid)
        .fetch_all(&self.inner.pool)
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
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        // Locking the run's row orders messages and updates of one run.
        let row = sqlx::query(
            "SELECT version, uid FROM resources WHERE project = $1 AND kind = $2 AND name = $3 \
             FOR UPDATE",
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
                sqlx::query_scalar("SELECT seq FROM inbox WHERE run_uid = $1 AND message_key = $2")
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
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO inbox (run_uid, seq, message_key, payload, received_at) \
             SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM inbox WHERE run_uid = $1 \
             RETURNING seq",
        )
        .bind(&uid)
        .bind(key)
        .bind(payload)
        .bind(at.to_string())
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        sqlx::query(
            "UPDATE resources SET version = $1 WHERE project = $2 AND kind = $3 AND name = $4",
        )
        .bind(version)
        .bind(&run.project)
        .bind(sql::kind_name(run.kind))
        .bind(&run.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let version = sql::to_u64(version, "a version")?;
        hearings.push(
            self.notify(&mut tx, &Change::Written(run.clone(), version))
                .await?,
        );
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(Delivery::Delivered(sql::to_u64(seq, "a message number")?))
    }

    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
        inbox_of(&self.inner.pool, run_uid).await
    }

    async fn rewrite_run(&self, rewrite: RunRewrite) -> Result<Record, Error> {
        crate::check_rewrite_deletes(&rewrite.delete)?;
        let run = &rewrite.run;
        let mut tx = self.begin().await?;
        let mut hearings = Vec::new();
        // Locked: writers of the run (a message, an update) wait for this write.
        let mut record = read_record(&mut *tx, run, " FOR UPDATE").await?;
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
            "UPDATE resources SET version = $1, uid = $2, group_name = $3, phase = $4, \
             document = $5::json WHERE project = $6 AND kind = $7 AND name = $8",
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
        hearings.push(
            self.notify(&mut tx, &Change::Written(run.clone(), record.version))
                .await?,
        );
        if let Some(uid) = &uid {
            let steps = sqlx::query(
                "SELECT step::text, completion::text FROM steps WHERE run_uid = $1 ORDER BY seq",
            )
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
                    "UPDATE steps SET step = $1::json, completion = $2::json \
                     WHERE run_uid = $3 AND seq = $4",
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
                    "UPDATE inbox SET message_key = $1, payload = $2, received_at = $3 \
                     WHERE run_uid = $4 AND seq = $5",
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
            sqlx::query_as("SELECT idempotency_key, records::text FROM batches WHERE project = $1")
                .bind(&run.project)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
        for (idempotency_key, text) in batches {
            if let Some(text) = sql::edited_batch(&text, run, rewrite.document.as_ref())? {
                sqlx::query(
                    "UPDATE batches SET records = $1::json \
                     WHERE project = $2 AND idempotency_key = $3",
                )
                .bind(text)
                .bind(&run.project)
                .bind(&idempotency_key)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            }
        }
        for key in &rewrite.delete {
            let removed =
                sqlx::query("DELETE FROM resources WHERE project = $1 AND kind = $2 AND name = $3")
                    .bind(&key.project)
                    .bind(sql::kind_name(key.kind))
                    .bind(&key.name)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
            if removed.rows_affected() > 0 {
                hearings.push(self.notify(&mut tx, &Change::Deleted(key.clone())).await?);
            }
        }
        tx.commit().await.map_err(map_err)?;
        for hearing in hearings {
            hearing.wait().await;
        }
        Ok(record)
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }
}

#[cfg(test)]
mod tests;
