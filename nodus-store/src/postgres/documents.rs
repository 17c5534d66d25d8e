//! Documents: create (alone or in an idempotent batch), list sparsely (the other reads are
//! `crate::reads`'), replace at a version, edit atomically (group-committed: many edits of
//! one account in one transaction), delete with a run's journal and inbox, and rewrite a run's
//! recorded contents; each write announces its changes in its own transaction.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use nodus_core::resource::Kind;
use nodus_core::store::{
    Change, Edit, Error, MemberCap, ObjectKey, Position, Record, RunRewrite, Seen, Selector, Sparse,
};
use serde_json::Value;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Postgres, QueryBuilder, Row};

use super::PostgresStore;
use super::Read;
use super::notifications::Notifier;
use super::transaction::WriteTx;
use crate::commit::Committer;
use crate::reads::Lock;
use crate::sql::{self, map_err};

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
    .bind(key.kind.plural())
    .bind(&key.name)
    .bind(columns.uid)
    .bind(columns.group)
    .bind(columns.phase)
    .bind(sql::document_text(document))
    .execute(conn)
    .await
    .map(|_| ())
}

/// An edit queued for the edit committer.
pub(super) struct EditWrite {
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
pub(super) struct EditCommitter {
    pub(super) pool: PgPool,
    pub(super) notifier: Arc<Notifier>,
}

#[async_trait]
impl Committer<EditWrite> for EditCommitter {
    type Output = Record;

    async fn commit(
        &mut self,
        writes: Vec<EditWrite>,
    ) -> Result<Vec<Result<Record, Error>>, Error> {
        let mut tx = WriteTx::begin(&self.pool, &self.notifier).await?;
        let keys: std::collections::BTreeSet<&ObjectKey> = writes.iter().map(|w| &w.key).collect();
        let mut current: HashMap<ObjectKey, Option<Record>> = HashMap::new();
        for key in keys {
            let record = match Read::record(&mut *tx, key, Lock::ForUpdate).await {
                Ok(record) => Some(record),
                Err(Error::NotFound(_)) => None,
                Err(e) => return Err(e),
            };
            current.insert(key.clone(), record);
        }
        let mut results = Vec::with_capacity(writes.len());
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
            .bind(key.kind.plural())
            .bind(&key.name)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            record.version = sql::to_u64(version, "a version")?;
            record.document = document;
            let change = Change::Written(key, record.version);
            tx.announce(&change).await?;
            results.push(Ok(record.clone()));
        }
        tx.commit().await?;
        Ok(results)
    }
}

pub(super) async fn create(
    store: &PostgresStore,
    key: &ObjectKey,
    document: Value,
) -> Result<Record, Error> {
    let mut tx = store.write().await?;
    match insert(&mut tx, key, &document).await {
        Ok(()) => {}
        Err(e) if sql::is_unique_violation(&e) => {
            return Err(Error::AlreadyExists(key.clone()));
        }
        Err(e) => return Err(map_err(e)),
    }
    tx.announce(&Change::Written(key.clone(), 1)).await?;
    tx.commit().await?;
    Ok(Record {
        key: key.clone(),
        version: 1,
        document,
    })
}

pub(super) async fn create_batch(
    store: &PostgresStore,
    items: Vec<(ObjectKey, Value)>,
    idempotency_key: Option<&str>,
    caps: &[MemberCap],
) -> Result<Vec<Record>, Error> {
    let scope = match (idempotency_key, items.first()) {
        (Some(key), Some((first, _))) => Some((first.project.clone(), key.to_string())),
        _ => None,
    };
    let mut tx = store.write().await?;
    if let Some((project, key)) = &scope {
        // Repeats of one key wait for each other, then see the first one's records.
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/' || $1 || '/' || $2, 0))",
        )
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
    // Batches into a capped group take turns (across replicas: the lock is the database's),
    // in one order so that two never wait for each other: runs of different phases touch
    // different counter rows, which alone would not order them. Each reads and counts the
    // group once it holds the lock, and so sees every earlier batch committed, and every
    // write that closed the group ([`update`] takes the same lock to close it).
    let mut capped: Vec<&MemberCap> = caps.iter().collect();
    capped.sort_by(|a, b| (&a.project, &a.group).cmp(&(&b.project, &b.group)));
    for cap in &capped {
        lock_group(&mut tx, &cap.project, &cap.group).await?;
    }
    for cap in &capped {
        let group = Read::record(&mut *tx, &cap.group_key(), Lock::None).await;
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT phase_key, members FROM group_phase_counts \
             WHERE project = $1 AND group_name = $2",
        )
        .bind(&cap.project)
        .bind(&cap.group)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        cap.check(group, &sql::group_phases_of(rows)?, &items)?;
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
        tx.announce(&Change::Written(record.key.clone(), 1)).await?;
    }
    tx.commit().await?;
    Ok(records)
}

pub(super) async fn modify(
    store: &PostgresStore,
    key: &ObjectKey,
    edit: Edit,
) -> Result<Record, Error> {
    store
        .inner
        .edits
        .write(EditWrite {
            key: key.clone(),
            edit,
        })
        .await
}

pub(super) async fn list_sparse(
    store: &PostgresStore,
    project: &str,
    kind: Kind,
    selector: &Selector,
    paths: &[&str],
) -> Result<Vec<Record>, Error> {
    read_sparse(store, project, kind, selector, paths, None).await
}

/// [`Store::list_sparse_known`] in two reads: every document's name, place and version (no
/// path of any document is read), then the paths of those not known there at that version
/// (by name; all of them, by the selector alone, when nothing is known).
pub(super) async fn list_sparse_known(
    store: &PostgresStore,
    project: &str,
    kind: Kind,
    selector: &Selector,
    paths: &[&str],
    known: &HashMap<String, Seen>,
) -> Result<Vec<Sparse>, Error> {
    let mut query: QueryBuilder<Postgres> =
        QueryBuilder::new("SELECT name, ord, version FROM resources WHERE project = ");
    Read::push_selection(&mut query, project, kind, selector);
    let rows = query
        .build()
        .fetch_all(&store.inner.pool)
        .await
        .map_err(map_err)?;
    let mut listed = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row.try_get(0).map_err(map_err)?;
        let ord: i64 = row.try_get(1).map_err(map_err)?;
        let version: i64 = row.try_get(2).map_err(map_err)?;
        let seen = Seen {
            at: Position(sql::to_u64(ord, "a creation number")?),
            version: sql::to_u64(version, "a version")?,
        };
        listed.push((name, seen));
    }
    let read = if known.is_empty() {
        read_sparse(store, project, kind, selector, paths, None).await?
    } else {
        let unknown = sql::unknown(&listed, known);
        match unknown.is_empty() {
            true => Vec::new(),
            false => read_sparse(store, project, kind, selector, paths, Some(&unknown)).await?,
        }
    };
    Ok(sql::known_or_read(listed, known, read))
}

/// The documents `selector` matches, each with only the values at `paths` (and the
/// selector's), in creation order; `named`: only those with these names.
async fn read_sparse(
    store: &PostgresStore,
    project: &str,
    kind: Kind,
    selector: &Selector,
    paths: &[&str],
    named: Option<&[&str]>,
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
    Read::push_conditions(&mut query, project, kind, selector);
    if let Some(named) = named {
        query.push(" AND name = ANY(");
        query.push_bind(
            named
                .iter()
                .map(|name| (*name).to_string())
                .collect::<Vec<_>>(),
        );
        query.push(")");
    }
    query.push(" ORDER BY ord");
    let rows = query
        .build()
        .fetch_all(&store.inner.pool)
        .await
        .map_err(map_err)?;
    sql::selected(project, kind, selector, &rows, |key, row, at| {
        sql::sparse_record_of(key, row, at, &wanted)
    })
}

/// Take the transaction-long lock of group `group` of `project` that orders the batches
/// joining it ([`create_batch`]) with the writes that close it ([`update`]) or remove it
/// ([`delete`]). Advisory locks are the database's: the schema is in the key, so that the
/// stores of two schemas never wait for each other.
async fn lock_group(conn: &mut PgConnection, project: &str, group: &str) -> Result<(), Error> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/' || $1 || '/' || $2, 1))",
    )
        .bind(project)
        .bind(group)
        .execute(conn)
        .await
        .map(drop)
        .map_err(map_err)
}

pub(super) async fn update(
    store: &PostgresStore,
    key: &ObjectKey,
    expected_version: u64,
    document: Value,
) -> Result<Record, Error> {
    let mut tx = store.write().await?;
    // A group written closed (sealed, cancelled, finished) waits for the batches joining it
    // that read it open, and those after read it closed. First, before any row is locked,
    // as a batch takes it first: the two cannot wait for each other.
    if key.kind == Kind::AgentGroup && !MemberCap::takes_runs(&document) {
        lock_group(&mut tx, &key.project, &key.name).await?;
    }
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
        .bind(key.kind.plural())
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
        .bind(key.kind.plural())
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
    tx.announce(&Change::Written(key.clone(), version)).await?;
    tx.commit().await?;
    Ok(Record {
        key: key.clone(),
        version,
        document,
    })
}

pub(super) async fn delete(store: &PostgresStore, key: &ObjectKey) -> Result<(), Error> {
    let mut tx = store.write().await?;
    // As a write that closes a group ([`update`]): the batches that read it there are
    // written before it goes, those after find it gone.
    if key.kind == Kind::AgentGroup {
        lock_group(&mut tx, &key.project, &key.name).await?;
    }
    let uid: Option<Option<String>> = sqlx::query_scalar(
        "DELETE FROM resources WHERE project = $1 AND kind = $2 AND name = $3 RETURNING uid",
    )
    .bind(&key.project)
    .bind(key.kind.plural())
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
        super::snapshots::drop_snapshots(&mut tx, &uid).await?;
    }
    tx.announce(&Change::Deleted(key.clone())).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn rewrite_run(
    store: &PostgresStore,
    rewrite: RunRewrite,
) -> Result<Record, Error> {
    nodus_core::store::check_rewrite_deletes(&rewrite.delete)?;
    let run = &rewrite.run;
    let mut tx = store.write().await?;
    // Locked: writers of the run (a message, an update) wait for this write.
    let mut record = Read::record(&mut *tx, run, Lock::ForUpdate).await?;
    let (uid, version) = sql::rewrite_document(&rewrite, &mut record)?;
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
    .bind(run.kind.plural())
    .bind(&run.name)
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    tx.announce(&Change::Written(run.clone(), record.version))
        .await?;
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
            let (seq, step, completion) =
                sql::rewrite_step(&rewrite, uid, &step, completion.as_deref())?;
            sqlx::query(
                "UPDATE steps SET step = $1::json, completion = $2::json \
                 WHERE run_uid = $3 AND seq = $4",
            )
            .bind(step)
            .bind(completion)
            .bind(uid)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        for mut message in Read::inbox(&mut *tx, uid).await? {
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
                .bind(key.kind.plural())
                .bind(&key.name)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        if removed.rows_affected() > 0 {
            tx.announce(&Change::Deleted(key.clone())).await?;
        }
    }
    tx.commit().await?;
    Ok(record)
}
