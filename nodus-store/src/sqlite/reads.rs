//! The reads, each a few statements on the calling thread through whatever connection it is
//! given (a reader, or the writer inside its transaction): a document, listings (selectors
//! pushed down, pages in creation order), the projects, a group's phase counters, a run's
//! journal and inbox, and snapshots and their contents. The same SQL as the Postgres store's
//! (`crate::reads`), in SQLite's spelling of a JSON path.

use std::num::NonZeroUsize;

use nodus_core::journal::Step;
use nodus_core::resource::Kind;
use nodus_core::snapshot::Snapshot;
use nodus_core::store::{
    Error, InboxMessage, MemberCap, ObjectKey, Page, Position, Record, Selector,
};
use rusqlite::{Connection, OptionalExtension, params};

use super::db::{Query, get, map_err};
use crate::sql;

/// The document at `key`.
pub(super) fn record(conn: &Connection, key: &ObjectKey) -> Result<Record, Error> {
    let row: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT version, CAST(document AS TEXT) FROM resources \
             WHERE project = ?1 AND kind = ?2 AND name = ?3",
        )
        .map_err(map_err)?
        .query_row(params![key.project, key.kind.plural(), key.name], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()
        .map_err(map_err)?;
    let (version, text) = row.ok_or_else(|| Error::NotFound(key.clone()))?;
    sql::stored_record(key.clone(), version, &text)
}

/// The conditions of a listing after `WHERE project = `: the project, the kind and the
/// selector, pushed down (a column of its own, or a bound JSON path). The exact match is
/// `Selector::matches` afterwards (numbers and booleans match their text there).
pub(super) fn push_conditions(query: &mut Query, project: &str, kind: Kind, selector: &Selector) {
    query.bind(project.to_string());
    query.push(" AND kind = ");
    query.bind(kind.plural().to_string());
    for (label, value) in sql::bindable(&selector.labels) {
        push_label_match(query, label, value);
    }
    for (field, value) in sql::bindable(&selector.fields) {
        match sql::column_of(field) {
            Some(column) => {
                query.push(" AND ").push(column).push(" = ");
                query.bind(value.clone());
            }
            None => push_field_match(query, field, value),
        }
    }
}

/// ` AND` the document's label `label` is the text `value`; nothing for a label whose key
/// holds a dot or cannot be quoted (the in-process match decides then).
fn push_label_match(query: &mut Query, label: &str, value: &str) {
    if sql::path_parts(label).is_none_or(|parts| parts.len() != 1) {
        return;
    }
    let path = sqlite_json_path(&["metadata", "labels", label]);
    query.push(" AND json_type(document, ");
    query.bind(path.clone());
    query.push(") = 'text' AND json_extract(document, ");
    query.bind(path);
    query.push(") = ");
    query.bind(value.to_string());
}

/// ` AND` the document's dotted `field` may equal `value`: text equal to it, or a number or a
/// boolean (matched against its text in process); nothing when the path cannot be spelt.
fn push_field_match(query: &mut Query, field: &str, value: &str) {
    let Some(parts) = sql::path_parts(field) else {
        return;
    };
    let path = sqlite_json_path(&parts);
    query.push(" AND (json_type(document, ");
    query.bind(path.clone());
    query.push(") IN ('integer', 'real', 'true', 'false') OR (json_type(document, ");
    query.bind(path.clone());
    query.push(") = 'text' AND json_extract(document, ");
    query.bind(path);
    query.push(") = ");
    query.bind(value.to_string());
    query.push("))");
}

/// [`push_conditions`], in creation order.
pub(super) fn push_selection(query: &mut Query, project: &str, kind: Kind, selector: &Selector) {
    push_conditions(query, project, kind, selector);
    query.push(" ORDER BY ord");
}

/// The documents of `kind` in `project` that `selector` matches, in creation order.
pub(super) fn list(
    conn: &Connection,
    project: &str,
    kind: Kind,
    selector: &Selector,
) -> Result<Vec<Record>, Error> {
    let mut query =
        Query::new("SELECT name, version, CAST(document AS TEXT) FROM resources WHERE project = ");
    push_selection(&mut query, project, kind, selector);
    let rows = query.rows(conn, |row| {
        Ok((
            get::<String>(row, 0)?,
            get::<i64>(row, 1)?,
            get::<String>(row, 2)?,
        ))
    })?;
    let mut records = Vec::with_capacity(rows.len());
    for (name, version, text) in rows {
        let record = sql::stored_record(ObjectKey::new(project, kind, name), version, &text)?;
        if selector.matches(&record.document) {
            records.push(record);
        }
    }
    Ok(records)
}

/// A page of a listing ([`sql::PageReading`]): rows after the cursor in creation order.
pub(super) fn list_page(
    conn: &Connection,
    project: &str,
    kind: Kind,
    selector: &Selector,
    after: Option<Position>,
    limit: NonZeroUsize,
) -> Result<Page, Error> {
    let mut reading = sql::PageReading::new(project, kind, selector, after, limit);
    while let Some((cursor, count)) = reading.next_fetch() {
        let mut query = Query::new(
            "SELECT name, version, CAST(document AS TEXT), ord FROM resources WHERE project = ",
        );
        push_conditions(&mut query, project, kind, selector);
        if let Some(cursor) = cursor {
            query.push(" AND ord > ");
            query.bind(cursor);
        }
        query.push(" ORDER BY ord LIMIT ");
        query.bind(count);
        reading.take(query.rows(conn, |row| {
            Ok(sql::PageRow {
                name: get(row, 0)?,
                version: get(row, 1)?,
                document: get(row, 2)?,
                ord: get(row, 3)?,
            })
        })?)?;
    }
    Ok(reading.page())
}

/// The projects that hold anything, in order.
pub(super) fn projects(conn: &Connection) -> Result<Vec<String>, Error> {
    Query::new("SELECT DISTINCT project FROM resources ORDER BY project")
        .rows(conn, |row| get(row, 0))
}

/// [`Store::group_phases`](nodus_core::Store::group_phases): the group's counters, kept by
/// triggers on `resources` (migration `group_phase_counts`).
pub(super) fn group_phases(
    conn: &Connection,
    project: &str,
    group: &str,
) -> Result<Vec<(Option<String>, u64)>, Error> {
    let mut statement = conn
        .prepare_cached(
            "SELECT phase_key, members FROM group_phase_counts \
             WHERE project = ?1 AND group_name = ?2",
        )
        .map_err(map_err)?;
    let counts = statement
        .query_map(params![project, group], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .map_err(map_err)?
        .collect::<Result<Vec<(String, i64)>, _>>()
        .map_err(map_err)?;
    sql::group_phases_of(counts)
}

/// Whether each group of `caps` has room for `adding` ([`MemberCap::check`]), the group and
/// its counters read through `conn` (the writer's, in the transaction that would add them).
pub(super) fn check_caps(
    conn: &Connection,
    caps: &[MemberCap],
    adding: &[(ObjectKey, serde_json::Value)],
) -> Result<(), Error> {
    for cap in caps {
        let stored = group_phases(conn, &cap.project, &cap.group)?;
        cap.check(record(conn, &cap.group_key()), &stored, adding)?;
    }
    Ok(())
}

/// A run's journal, in order.
pub(super) fn journal(conn: &Connection, run_uid: &str) -> Result<Vec<Step>, Error> {
    let mut statement = conn
        .prepare_cached(
            "SELECT CAST(step AS TEXT), CAST(completion AS TEXT) FROM steps \
             WHERE run_uid = ?1 ORDER BY seq",
        )
        .map_err(map_err)?;
    let rows = statement
        .query_map(params![run_uid], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(map_err)?
        .collect::<Result<Vec<(String, Option<String>)>, _>>()
        .map_err(map_err)?;
    rows.iter()
        .map(|(step, completion)| sql::read_step(run_uid, step, completion.as_deref()))
        .collect()
}

/// A run's inbox, in order.
pub(super) fn inbox(conn: &Connection, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
    let mut statement = conn
        .prepare_cached(
            "SELECT seq, message_key, payload, received_at FROM inbox \
             WHERE run_uid = ?1 ORDER BY seq",
        )
        .map_err(map_err)?;
    let rows = statement
        .query_map(params![run_uid], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .map_err(map_err)?
        .collect::<Result<Vec<(i64, Option<String>, String, String)>, _>>()
        .map_err(map_err)?;
    rows.into_iter()
        .map(|(seq, key, payload, received_at)| {
            Ok(InboxMessage {
                seq: sql::to_u64(seq, "a message number")?,
                key,
                payload,
                received_at: sql::parse_time(&received_at)?,
            })
        })
        .collect()
}

/// A run's snapshots by step, each resolved against the snapshots before it.
pub(super) fn snapshots(conn: &Connection, run_uid: &str) -> Result<Vec<(u32, Snapshot)>, Error> {
    let mut statement = conn
        .prepare_cached("SELECT seq, snapshot FROM snapshots WHERE run_uid = ?1 ORDER BY seq")
        .map_err(map_err)?;
    let rows = statement
        .query_map(params![run_uid], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(map_err)?
        .collect::<Result<Vec<(i64, String)>, _>>()
        .map_err(map_err)?;
    let stored = rows
        .iter()
        .map(|(seq, text)| sql::read_snapshot(run_uid, *seq, text))
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(nodus_core::snapshot::resolve(stored))
}

/// Whether the contents with `digest` are stored.
pub(super) fn has_blob(conn: &Connection, digest: &str) -> Result<bool, Error> {
    conn.prepare_cached("SELECT 1 FROM blobs WHERE digest = ?1")
        .map_err(map_err)?
        .exists(params![digest])
        .map_err(map_err)
}

/// The digests of `digests` whose contents are not stored, in their order.
pub(super) fn missing_blobs(conn: &Connection, digests: &[String]) -> Result<Vec<String>, Error> {
    let mut missing = Vec::new();
    for digest in digests {
        if !has_blob(conn, digest)? {
            missing.push(digest.clone());
        }
    }
    Ok(missing)
}

/// The contents with `digest`, when stored.
pub(super) fn blob(conn: &Connection, digest: &str) -> Result<Option<Vec<u8>>, Error> {
    conn.prepare_cached("SELECT content FROM blobs WHERE digest = ?1")
        .map_err(map_err)?
        .query_row(params![digest], |row| row.get(0))
        .optional()
        .map_err(map_err)
}

/// The bytes of all stored contents.
pub(super) fn blob_bytes(conn: &Connection) -> Result<u64, Error> {
    let total: i64 = conn
        .prepare_cached("SELECT COALESCE(SUM(size), 0) FROM blobs")
        .map_err(map_err)?
        .query_row([], |row| row.get(0))
        .map_err(map_err)?;
    sql::to_u64(total, "the blobs' size")
}

/// SQLite's JSON path (`$."a"."b"`) of dotted parts; the parts hold no double quote.
pub(super) fn sqlite_json_path(parts: &[&str]) -> String {
    let mut path = String::from("$");
    for part in parts {
        path.push_str(".\"");
        path.push_str(part);
        path.push('"');
    }
    path
}
