//! Documents: create (alone or in an idempotent batch), list sparsely (one JSON row), replace
//! at a version and edit atomically (both through the writer), delete with a run's journal
//! and inbox, and rewrite a run's recorded contents. The other reads are `crate::reads`'.

use std::collections::{HashMap, HashSet};

use nodus_core::resource::Kind;
use nodus_core::store::{
    Change, Edit, Error, ObjectKey, Position, Record, RunRewrite, Seen, Selector, Sparse, Store,
};
use serde_json::Value;
use sqlx::sqlite::SqliteConnection;
use sqlx::{QueryBuilder, Row, Sqlite};

use super::Read;
use super::SqliteStore;
use super::write::{DocumentUpdate, Write};
use crate::dialect::sqlite_json_path;
use crate::reads::Lock;
use crate::sql::{self, map_err};

/// Read a document through `executor` (the readers, or the writer inside its transaction).
pub(super) async fn read_record<'e>(
    executor: impl sqlx::Executor<'e, Database = Sqlite>,
    key: &ObjectKey,
) -> Result<Record, Error> {
    Read::record(executor, key, Lock::None).await
}

/// One document update: `Err` for a database failure (the batch fails), `Ok(Err)` for a
/// refused update (a missing document, or a stale version).
pub(super) async fn update_one(
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
        .bind(key.kind.plural())
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
    .bind(key.kind.plural())
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

/// Insert a document known to be new, inside a transaction.
pub(super) async fn insert(
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

pub(super) async fn create(
    store: &SqliteStore,
    key: &ObjectKey,
    document: Value,
) -> Result<Record, Error> {
    // Through the writer: under load a run's kept working directory (created as it ends)
    // shares the commit of other runs' steps instead of an fsync of its own.
    store
        .inner
        .writes
        .write(Write::Create {
            key: key.clone(),
            document,
        })
        .await?
        .document()
}

pub(super) async fn create_batch(
    store: &SqliteStore,
    items: Vec<(ObjectKey, Value)>,
    idempotency_key: Option<&str>,
) -> Result<Vec<Record>, Error> {
    let scope = match (idempotency_key, items.first()) {
        (Some(key), Some((first, _))) => Some((first.project.clone(), key.to_string())),
        _ => None,
    };
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
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
    for record in &records {
        tx.announce(Change::Written(record.key.clone(), 1));
    }
    tx.commit().await?;
    drop(conn);
    Ok(records)
}

pub(super) async fn modify(
    store: &SqliteStore,
    key: &ObjectKey,
    edit: Edit,
) -> Result<Record, Error> {
    store
        .inner
        .writes
        .write(Write::Edit {
            key: key.clone(),
            edit,
        })
        .await?
        .document()
}

pub(super) async fn list_sparse(
    store: &SqliteStore,
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
    store: &SqliteStore,
    project: &str,
    kind: Kind,
    selector: &Selector,
    paths: &[&str],
    known: &HashMap<String, Seen>,
) -> Result<Vec<Sparse>, Error> {
    let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
        "SELECT json_group_array(json_array(name, ord, version) ORDER BY ord) FROM resources \
         WHERE project = ",
    );
    Read::push_conditions(&mut query, project, kind, selector);
    let listed: String = query
        .build_query_scalar()
        .fetch_one(&store.inner.readers)
        .await
        .map_err(map_err)?;
    let listed: Vec<(String, u64, u64)> = serde_json::from_str(&listed)
        .map_err(|e| Error::Corrupt(format!("a listing of names, places and versions: {e}")))?;
    let listed: Vec<(String, Seen)> = listed
        .into_iter()
        .map(|(name, ord, version)| {
            let at = Position(ord);
            (name, Seen { at, version })
        })
        .collect();
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
    store: &SqliteStore,
    project: &str,
    kind: Kind,
    selector: &Selector,
    paths: &[&str],
    named: Option<&[&str]>,
) -> Result<Vec<Record>, Error> {
    let wanted = selector.paths_with(paths);
    let Some(json_paths) = wanted
        .iter()
        .map(|path| sql::path_parts(path).map(|parts| sqlite_json_path(&parts)))
        .collect::<Option<Vec<_>>>()
    else {
        // A path no JSON path can spell: whole documents, cut down here.
        let mut records = store.list(project, kind, selector).await?;
        if let Some(named) = named {
            records.retain(|record| named.contains(&record.key.name.as_str()));
        }
        return Ok(nodus_core::store::cut_down(records, &wanted));
    };
    // One row: every document's name, version and, for each path, whether the document has
    // it and its value, in creation order, as one JSON array. A row apiece would cross from
    // SQLite's thread to the caller's once per row (a group's reconcile lists every member).
    let mut query: QueryBuilder<Sqlite> =
        QueryBuilder::new("SELECT json_group_array(json_array(name, version");
    for path in &json_paths {
        // `->` answers JSON (or NULL when the path is absent, told from a JSON null by
        // `json_type`).
        query.push(", json_type(document, ");
        query.push_bind(path.clone());
        query.push(") IS NOT NULL, document -> ");
        query.push_bind(path.clone());
    }
    query.push(") ORDER BY ord) FROM resources WHERE project = ");
    match named {
        None => Read::push_conditions(&mut query, project, kind, selector),
        Some(named) => {
            // By the unique index on (project, kind, name) alone: the selector is matched
            // exactly below, and a condition on the group's index as well let SQLite walk
            // every member of the group for a few names (4.6 ms for one of 10,000).
            let names = serde_json::to_string(named).map_err(|e| Error::Invalid(e.to_string()))?;
            query.push_bind(project);
            query.push(" AND kind = ");
            query.push_bind(kind.plural().to_string());
            query.push(" AND name IN (SELECT value FROM json_each(");
            query.push_bind(names);
            query.push("))");
        }
    }
    let listed: String = query
        .build_query_scalar()
        .fetch_one(&store.inner.readers)
        .await
        .map_err(map_err)?;
    let rows: Vec<Vec<Value>> = serde_json::from_str(&listed)
        .map_err(|e| Error::Corrupt(format!("a sparse listing: {e}")))?;
    let mut records = Vec::with_capacity(rows.len());
    for row in rows {
        let record = sparse_record(project, kind, row, &wanted)?;
        if selector.matches(&record.document) {
            records.push(record);
        }
    }
    Ok(records)
}

/// A record of a sparse listing's row: `[name, version, (has path, value) for each path]`.
fn sparse_record(
    project: &str,
    kind: Kind,
    row: Vec<Value>,
    paths: &[String],
) -> Result<Record, Error> {
    let corrupt = || Error::Corrupt("a sparse listing's row is not [name, version, …]".into());
    let mut row = row.into_iter();
    let name = match row.next() {
        Some(Value::String(name)) => name,
        _ => return Err(corrupt()),
    };
    let version = row.next().and_then(|v| v.as_u64()).ok_or_else(corrupt)?;
    let mut document = Value::Object(serde_json::Map::new());
    for path in paths {
        let (Some(has), Some(value)) = (row.next(), row.next()) else {
            return Err(corrupt());
        };
        if has.as_i64() == Some(1) {
            nodus_core::store::set_path(&mut document, path, value);
        }
    }
    Ok(Record {
        key: ObjectKey::new(project, kind, name),
        version,
        document,
    })
}

pub(super) async fn update(
    store: &SqliteStore,
    key: &ObjectKey,
    expected_version: u64,
    document: Value,
) -> Result<Record, Error> {
    // Only used when the update succeeds, that is when `expected_version` is stored.
    let version = expected_version.saturating_add(1);
    store
        .inner
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

pub(super) async fn delete(store: &SqliteStore, key: &ObjectKey) -> Result<(), Error> {
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
    let uid: Option<Option<String>> = sqlx::query_scalar(
        "DELETE FROM resources WHERE project = ? AND kind = ? AND name = ? RETURNING uid",
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
        super::snapshots::drop_snapshots(&mut tx, &uid).await?;
    }
    tx.announce(Change::Deleted(key.clone()));
    tx.commit().await?;
    drop(conn);
    Ok(())
}

pub(super) async fn rewrite_run(store: &SqliteStore, rewrite: RunRewrite) -> Result<Record, Error> {
    nodus_core::store::check_rewrite_deletes(&rewrite.delete)?;
    let run = &rewrite.run;
    let mut conn = store.write_connection().await?;
    let mut tx = store.write(&mut conn).await?;
    let mut record = read_record(&mut *tx, run).await?;
    let (uid, version) = sql::rewrite_document(&rewrite, &mut record)?;
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
    .bind(run.kind.plural())
    .bind(&run.name)
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    tx.announce(Change::Written(run.clone(), record.version));
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
            let (seq, step, completion) =
                sql::rewrite_step(&rewrite, uid, &step, completion.as_deref())?;
            sqlx::query("UPDATE steps SET step = ?, completion = ? WHERE run_uid = ? AND seq = ?")
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
            sqlx::query("UPDATE batches SET records = ? WHERE project = ? AND idempotency_key = ?")
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
            sqlx::query("DELETE FROM resources WHERE project = ? AND kind = ? AND name = ?")
                .bind(&key.project)
                .bind(key.kind.plural())
                .bind(&key.name)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        if removed.rows_affected() > 0 {
            tx.announce(Change::Deleted(key.clone()));
        }
    }
    tx.commit().await?;
    drop(conn);
    Ok(record)
}
