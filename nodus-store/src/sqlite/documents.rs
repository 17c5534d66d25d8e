//! Documents: create (alone or in an idempotent batch), list sparsely (one JSON row), replace
//! at a version and edit atomically (both through the writer), delete with a run's journal
//! and inbox, and rewrite a run's recorded contents. The other reads are `crate::reads`'.

use std::collections::{HashMap, HashSet};

use nodus_core::resource::Kind;
use nodus_core::store::{
    Change, Edit, Error, MemberCap, ObjectKey, Position, Record, RunRewrite, Seen, Selector,
    Sparse, Store,
};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::SqliteStore;
use super::db::{Query, WriteTx, get, is_unique, map_err};
use super::reads::{self, sqlite_json_path};
use super::write::{DocumentUpdate, Write};
use crate::sql;

/// One document update: `Err` for a database failure (the batch fails), `Ok(Err)` for a
/// refused update (a missing document, or a stale version).
pub(super) fn update_one(
    conn: &Connection,
    write: &DocumentUpdate,
) -> Result<Result<(), Error>, Error> {
    let key = &write.key;
    // A version that does not fit was never stored: refused below, like any stale one.
    if let Some(expected) = sql::to_i64(write.expected) {
        let version = sql::bump(key, expected)?;
        let done = conn
            .prepare_cached(
                "UPDATE resources SET version = ?1, uid = ?2, group_name = ?3, phase = ?4, \
                 document = ?5 WHERE project = ?6 AND kind = ?7 AND name = ?8 AND version = ?9",
            )
            .map_err(map_err)?
            .execute(params![
                version,
                write.columns.uid,
                write.columns.group,
                write.columns.phase,
                write.text,
                key.project,
                key.kind.plural(),
                key.name,
                expected
            ])
            .map_err(map_err)?;
        if done == 1 {
            return Ok(Ok(()));
        }
    }
    let current: Option<i64> = conn
        .prepare_cached(
            "SELECT version FROM resources WHERE project = ?1 AND kind = ?2 AND name = ?3",
        )
        .map_err(map_err)?
        .query_row(params![key.project, key.kind.plural(), key.name], |row| {
            row.get(0)
        })
        .optional()
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
pub(super) fn insert(
    conn: &Connection,
    key: &ObjectKey,
    document: &Value,
) -> Result<(), rusqlite::Error> {
    let columns = sql::Columns::of(document);
    conn.prepare_cached(
        "INSERT INTO resources (project, kind, name, version, uid, group_name, phase, document) \
         VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        key.project,
        key.kind.plural(),
        key.name,
        columns.uid,
        columns.group,
        columns.phase,
        sql::document_text(document)
    ])
    .map(drop)
}

/// [`Store::create`](nodus_core::Store::create), keeping `caps` (a run that joins a group).
pub(super) async fn create(
    store: &SqliteStore,
    key: &ObjectKey,
    document: Value,
    caps: Vec<MemberCap>,
) -> Result<Record, Error> {
    // Through the writer: under load a run's kept working directory (created as it ends), or
    // a run created alone, shares the commit of other runs' steps instead of an fsync of its
    // own.
    store
        .inner
        .writes
        .write(Write::Create {
            key: key.clone(),
            document,
            caps,
        })
        .await?
        .document()
}

pub(super) async fn create_batch(
    store: &SqliteStore,
    mut items: Vec<(ObjectKey, Value)>,
    idempotency_key: Option<&str>,
    caps: &[MemberCap],
) -> Result<Vec<Record>, Error> {
    // One document and nothing to remember: a create, through the writer.
    if items.len() == 1
        && idempotency_key.is_none()
        && let Some((key, document)) = items.pop()
    {
        return Ok(vec![create(store, &key, document, caps.to_vec()).await?]);
    }
    let scope = match (idempotency_key, items.first()) {
        (Some(key), Some((first, _))) => Some((first.project.clone(), key.to_string())),
        _ => None,
    };
    let caps = caps.to_vec();
    store
        .inner
        .db
        .write(move |tx| {
            if let Some((project, key)) = &scope {
                let stored: Option<String> = tx
                    .prepare_cached(
                        "SELECT records FROM batches WHERE project = ?1 AND idempotency_key = ?2",
                    )
                    .map_err(map_err)?
                    .query_row(params![project, key], |row| row.get(0))
                    .optional()
                    .map_err(map_err)?;
                if let Some(stored) = stored {
                    return sql::parse_batch(&stored);
                }
            }
            // In the writer's transaction: no other write comes between the count and the
            // batch's.
            super::reads::check_caps(tx, &caps, &items)?;
            let mut seen = HashSet::with_capacity(items.len());
            for (key, document) in &items {
                if !seen.insert(key) {
                    return Err(Error::AlreadyExists(key.clone()));
                }
                match insert(tx, key, document) {
                    Ok(()) => {}
                    Err(e) if is_unique(&e) => return Err(Error::AlreadyExists(key.clone())),
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
                tx.prepare_cached(
                    "INSERT INTO batches (project, idempotency_key, records) VALUES (?1, ?2, ?3)",
                )
                .map_err(map_err)?
                .execute(params![project, key, sql::batch_text(&records)])
                .map_err(map_err)?;
            }
            for record in &records {
                tx.announce(Change::Written(record.key.clone(), 1));
            }
            Ok(records)
        })
        .await
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
    // A row apiece: a row is a function call here, cheaper than building and parsing one
    // JSON array of them.
    let mut query = Query::new("SELECT name, ord, version FROM resources WHERE project = ");
    reads::push_selection(&mut query, project, kind, selector);
    let listed: Vec<(String, Seen)> = store.read(|conn| {
        query.rows(conn, |row| {
            let seen = Seen {
                at: Position(sql::to_u64(get(row, 1)?, "a creation order")?),
                version: sql::to_u64(get(row, 2)?, "a version")?,
            };
            Ok((get(row, 0)?, seen))
        })
    })?;
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
    // it and its value, in creation order, as one JSON array (the values are JSON already,
    // and the array is parsed in one go).
    let mut query = Query::new("SELECT json_group_array(json_array(name, version");
    for path in &json_paths {
        // `->` answers JSON (or NULL when the path is absent, told from a JSON null by
        // `json_type`).
        query.push(", json_type(document, ");
        query.bind(path.clone());
        query.push(") IS NOT NULL, document -> ");
        query.bind(path.clone());
    }
    query.push(") ORDER BY ord) FROM resources WHERE project = ");
    match named {
        None => reads::push_conditions(&mut query, project, kind, selector),
        Some(named) => {
            // By the unique index on (project, kind, name) alone: the selector is matched
            // exactly below, and a condition on the group's index as well let SQLite walk
            // every member of the group for a few names (4.6 ms for one of 10,000).
            let names = serde_json::to_string(named).map_err(|e| Error::Invalid(e.to_string()))?;
            query.bind(project.to_string());
            query.push(" AND kind = ");
            query.bind(kind.plural().to_string());
            query.push(" AND name IN (SELECT value FROM json_each(");
            query.bind(names);
            query.push("))");
        }
    }
    let listed: String = store.read(|conn| one_text(conn, &query))?;
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

/// The one text a JSON aggregate answers.
fn one_text(conn: &Connection, query: &Query) -> Result<String, Error> {
    query
        .rows(conn, |row| get(row, 0))?
        .pop()
        .ok_or_else(|| Error::Corrupt("an aggregate answered no row".to_string()))
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
    let key = key.clone();
    store
        .inner
        .db
        .write(move |tx| {
            let uid: Option<Option<String>> = tx
                .prepare_cached(
                    "DELETE FROM resources WHERE project = ?1 AND kind = ?2 AND name = ?3 \
                     RETURNING uid",
                )
                .map_err(map_err)?
                .query_row(params![key.project, key.kind.plural(), key.name], |row| {
                    row.get(0)
                })
                .optional()
                .map_err(map_err)?;
            let Some(uid) = uid else {
                return Err(Error::NotFound(key));
            };
            if let Some(uid) = uid {
                for statement in [
                    "DELETE FROM steps WHERE run_uid = ?1",
                    "DELETE FROM inbox WHERE run_uid = ?1",
                    // Old fences stay stale: the counter moves on and nobody holds it.
                    "UPDATE leases SET fence = fence + 1, owner = NULL WHERE run_uid = ?1",
                ] {
                    tx.prepare_cached(statement)
                        .map_err(map_err)?
                        .execute(params![uid])
                        .map_err(map_err)?;
                }
                super::snapshots::drop_snapshots(tx, &uid)?;
            }
            tx.announce(Change::Deleted(key));
            Ok(())
        })
        .await
}

pub(super) async fn rewrite_run(store: &SqliteStore, rewrite: RunRewrite) -> Result<Record, Error> {
    nodus_core::store::check_rewrite_deletes(&rewrite.delete)?;
    store
        .inner
        .db
        .write(move |tx| rewrite_in(tx, &rewrite))
        .await
}

/// [`rewrite_run`] in the writer's transaction.
fn rewrite_in(tx: &mut WriteTx<'_>, rewrite: &RunRewrite) -> Result<Record, Error> {
    let run = &rewrite.run;
    let mut record = reads::record(tx, run)?;
    let (uid, version) = sql::rewrite_document(rewrite, &mut record)?;
    let columns = sql::Columns::of(&record.document);
    tx.prepare_cached(
        "UPDATE resources SET version = ?1, uid = ?2, group_name = ?3, phase = ?4, document = ?5 \
         WHERE project = ?6 AND kind = ?7 AND name = ?8",
    )
    .map_err(map_err)?
    .execute(params![
        version,
        columns.uid,
        columns.group,
        columns.phase,
        sql::document_text(&record.document),
        run.project,
        run.kind.plural(),
        run.name
    ])
    .map_err(map_err)?;
    tx.announce(Change::Written(run.clone(), record.version));
    if let Some(uid) = &uid {
        let steps: Vec<(String, Option<String>)> = tx
            .prepare_cached("SELECT step, completion FROM steps WHERE run_uid = ?1 ORDER BY seq")
            .map_err(map_err)?
            .query_map(params![uid], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(map_err)?
            .collect::<Result<_, _>>()
            .map_err(map_err)?;
        for (step, completion) in steps {
            let (seq, step, completion) =
                sql::rewrite_step(rewrite, uid, &step, completion.as_deref())?;
            tx.prepare_cached(
                "UPDATE steps SET step = ?1, completion = ?2 WHERE run_uid = ?3 AND seq = ?4",
            )
            .map_err(map_err)?
            .execute(params![step, completion, uid, seq])
            .map_err(map_err)?;
        }
        for mut message in reads::inbox(tx, uid)? {
            (rewrite.message)(&mut message);
            tx.prepare_cached(
                "UPDATE inbox SET message_key = ?1, payload = ?2, received_at = ?3 \
                 WHERE run_uid = ?4 AND seq = ?5",
            )
            .map_err(map_err)?
            .execute(params![
                message.key,
                message.payload,
                message.received_at.to_string(),
                uid,
                sql::to_i64(message.seq).unwrap_or(-1)
            ])
            .map_err(map_err)?;
        }
    }
    let batches: Vec<(String, String)> = tx
        .prepare_cached("SELECT idempotency_key, records FROM batches WHERE project = ?1")
        .map_err(map_err)?
        .query_map(params![run.project], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(map_err)?
        .collect::<Result<_, _>>()
        .map_err(map_err)?;
    for (idempotency_key, text) in batches {
        if let Some(text) = sql::edited_batch(&text, run, rewrite.document.as_ref())? {
            tx.prepare_cached(
                "UPDATE batches SET records = ?1 WHERE project = ?2 AND idempotency_key = ?3",
            )
            .map_err(map_err)?
            .execute(params![text, run.project, idempotency_key])
            .map_err(map_err)?;
        }
    }
    for key in &rewrite.delete {
        let removed = tx
            .prepare_cached("DELETE FROM resources WHERE project = ?1 AND kind = ?2 AND name = ?3")
            .map_err(map_err)?
            .execute(params![key.project, key.kind.plural(), key.name])
            .map_err(map_err)?;
        if removed > 0 {
            tx.announce(Change::Deleted(key.clone()));
        }
    }
    Ok(record)
}
