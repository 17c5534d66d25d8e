//! The reads the SQL stores share, written once over a [`Dialect`]: a document, listings
//! (selectors pushed down, pages in creation order), the projects, a group's phase counters,
//! a run's journal and inbox, and snapshots and their contents. Each backend calls them with
//! its own connections (SQLite's readers, Postgres's pool, or a write transaction); the
//! writes stay with each backend, where their locking and group commit differ.

use std::marker::PhantomData;
use std::num::NonZeroUsize;

use nodus_core::journal::Step;
use nodus_core::resource::Kind;
use nodus_core::snapshot::Snapshot;
use nodus_core::store::{Error, InboxMessage, ObjectKey, Page, Position, Record, Selector};
use sqlx::{Executor, QueryBuilder, Row};

use crate::dialect::Dialect;
use crate::sql::{self, map_err};

/// Whether a read inside a write transaction locks the row it reads, which that
/// transaction writes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// A plain read.
    None,
    /// Lock the row until the transaction ends ([`Dialect::LOCK_FOR_UPDATE`]).
    ForUpdate,
}

/// The shared reads over database `D` (the bounds, written once here, are what sqlx needs to
/// bind and read the values these reads use).
pub(crate) struct Reads<D>(PhantomData<D>);

impl<D: Dialect> Reads<D>
where
    usize: sqlx::ColumnIndex<D::Row>,
    i64: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D> + for<'q> sqlx::Encode<'q, D>,
    String: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D> + for<'q> sqlx::Encode<'q, D>,
    for<'q> &'q str: sqlx::Type<D> + sqlx::Encode<'q, D>,
    Vec<u8>: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D>,
{
    /// The document at `key`, read through `executor`.
    pub(crate) async fn record<'e>(
        executor: impl Executor<'e, Database = D>,
        key: &ObjectKey,
        lock: Lock,
    ) -> Result<Record, Error> {
        let mut query = QueryBuilder::<D>::new(
            "SELECT version, CAST(document AS TEXT) FROM resources WHERE project = ",
        );
        query.push_bind(key.project.as_str());
        query.push(" AND kind = ");
        query.push_bind(key.kind.plural());
        query.push(" AND name = ");
        query.push_bind(key.name.as_str());
        if lock == Lock::ForUpdate {
            query.push(D::LOCK_FOR_UPDATE);
        }
        let row = D::fetch_optional(query, executor)
            .await
            .map_err(map_err)?
            .ok_or_else(|| Error::NotFound(key.clone()))?;
        sql::record_of(key.clone(), &row, 0)
    }

    /// The conditions of a listing after `WHERE project = `: the project, the kind and the
    /// selector, pushed down (a column of its own, or a bound JSON path). The exact match is
    /// `Selector::matches` afterwards (numbers and booleans match their text there).
    pub(crate) fn push_conditions<'a>(
        query: &mut QueryBuilder<'a, D>,
        project: &'a str,
        kind: Kind,
        selector: &'a Selector,
    ) {
        query.push_bind(project);
        query.push(" AND kind = ");
        query.push_bind(kind.plural().to_string());
        for (label, value) in sql::bindable(&selector.labels) {
            D::push_label_match(query, label, value);
        }
        for (field, value) in sql::bindable(&selector.fields) {
            if !sql::push_column_match(query, field, value) {
                D::push_field_match(query, field, value);
            }
        }
    }

    /// [`Self::push_conditions`], in creation order.
    pub(crate) fn push_selection<'a>(
        query: &mut QueryBuilder<'a, D>,
        project: &'a str,
        kind: Kind,
        selector: &'a Selector,
    ) {
        Self::push_conditions(query, project, kind, selector);
        query.push(" ORDER BY ord");
    }

    /// The documents of `kind` in `project` that `selector` matches, in creation order.
    pub(crate) async fn list<'e>(
        executor: impl Executor<'e, Database = D>,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        let mut query = QueryBuilder::<D>::new(
            "SELECT name, version, CAST(document AS TEXT) FROM resources WHERE project = ",
        );
        Self::push_selection(&mut query, project, kind, selector);
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        sql::selected(project, kind, selector, &rows, sql::record_of)
    }

    /// A page of a listing ([`sql::PageReading`]): rows after the cursor in creation order.
    pub(crate) async fn list_page<'e>(
        executor: impl Executor<'e, Database = D> + Copy,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Result<Page, Error> {
        let mut reading = sql::PageReading::new(project, kind, selector, after, limit);
        while let Some((cursor, count)) = reading.next_fetch() {
            let mut query = QueryBuilder::<D>::new(
                "SELECT name, version, CAST(document AS TEXT), ord FROM resources \
                 WHERE project = ",
            );
            Self::push_conditions(&mut query, project, kind, selector);
            if let Some(cursor) = cursor {
                query.push(" AND ord > ");
                query.push_bind(cursor);
            }
            query.push(" ORDER BY ord LIMIT ");
            query.push_bind(count);
            let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
            let rows = rows
                .iter()
                .map(|row| {
                    Ok(sql::PageRow {
                        name: row.try_get(0).map_err(map_err)?,
                        version: row.try_get(1).map_err(map_err)?,
                        document: row.try_get(2).map_err(map_err)?,
                        ord: row.try_get(3).map_err(map_err)?,
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            reading.take(rows)?;
        }
        Ok(reading.page())
    }

    /// The projects that hold anything, in order.
    pub(crate) async fn projects<'e>(
        executor: impl Executor<'e, Database = D>,
    ) -> Result<Vec<String>, Error> {
        let query =
            QueryBuilder::<D>::new("SELECT DISTINCT project FROM resources ORDER BY project");
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(map_err))
            .collect()
    }

    /// [`Store::group_phases`](nodus_core::Store::group_phases): the group's counters, kept
    /// by triggers on `resources` (migration `group_phase_counts`): a few rows whatever the
    /// group's size, no document read.
    pub(crate) async fn group_phases<'e>(
        executor: impl Executor<'e, Database = D>,
        project: &str,
        group: &str,
    ) -> Result<Vec<(Option<String>, u64)>, Error> {
        let mut query = QueryBuilder::<D>::new(
            "SELECT phase_key, members FROM group_phase_counts WHERE project = ",
        );
        query.push_bind(project);
        query.push(" AND group_name = ");
        query.push_bind(group);
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        let counts = rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(map_err)?,
                    row.try_get(1).map_err(map_err)?,
                ))
            })
            .collect::<Result<Vec<(String, i64)>, Error>>()?;
        sql::group_phases_of(counts)
    }

    /// A run's journal, in order.
    pub(crate) async fn journal<'e>(
        executor: impl Executor<'e, Database = D>,
        run_uid: &str,
    ) -> Result<Vec<Step>, Error> {
        let mut query = QueryBuilder::<D>::new(
            "SELECT CAST(step AS TEXT), CAST(completion AS TEXT) FROM steps WHERE run_uid = ",
        );
        query.push_bind(run_uid);
        query.push(" ORDER BY seq");
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let step: String = row.try_get(0).map_err(map_err)?;
                let completion: Option<String> = row.try_get(1).map_err(map_err)?;
                sql::read_step(run_uid, &step, completion.as_deref())
            })
            .collect()
    }

    /// A run's inbox, in order.
    pub(crate) async fn inbox<'e>(
        executor: impl Executor<'e, Database = D>,
        run_uid: &str,
    ) -> Result<Vec<InboxMessage>, Error> {
        let mut query = QueryBuilder::<D>::new(
            "SELECT seq, message_key, payload, received_at FROM inbox WHERE run_uid = ",
        );
        query.push_bind(run_uid);
        query.push(" ORDER BY seq");
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        rows.iter().map(sql::message_of).collect()
    }

    /// A run's snapshots by step, each resolved against the snapshots before it.
    pub(crate) async fn snapshots<'e>(
        executor: impl Executor<'e, Database = D>,
        run_uid: &str,
    ) -> Result<Vec<(u32, Snapshot)>, Error> {
        let mut query =
            QueryBuilder::<D>::new("SELECT seq, snapshot FROM snapshots WHERE run_uid = ");
        query.push_bind(run_uid);
        query.push(" ORDER BY seq");
        let rows = D::fetch_all(query, executor).await.map_err(map_err)?;
        let stored = rows
            .iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(map_err)?;
                let text: String = row.try_get(1).map_err(map_err)?;
                sql::read_snapshot(run_uid, seq, &text)
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(nodus_core::snapshot::resolve(stored))
    }

    /// Whether the contents with `digest` are stored.
    pub(crate) async fn has_blob<'e>(
        executor: impl Executor<'e, Database = D>,
        digest: &str,
    ) -> Result<bool, Error> {
        let mut query = QueryBuilder::<D>::new("SELECT 1 FROM blobs WHERE digest = ");
        query.push_bind(digest);
        let row = D::fetch_optional(query, executor).await.map_err(map_err)?;
        Ok(row.is_some())
    }

    /// The digests of `digests` whose contents are not stored, in their order.
    pub(crate) async fn missing_blobs<'e>(
        executor: impl Executor<'e, Database = D> + Copy,
        digests: &[String],
    ) -> Result<Vec<String>, Error> {
        let mut missing = Vec::new();
        for digest in digests {
            if !Self::has_blob(executor, digest).await? {
                missing.push(digest.clone());
            }
        }
        Ok(missing)
    }

    /// The contents with `digest`, when stored.
    pub(crate) async fn blob<'e>(
        executor: impl Executor<'e, Database = D>,
        digest: &str,
    ) -> Result<Option<Vec<u8>>, Error> {
        let mut query = QueryBuilder::<D>::new("SELECT content FROM blobs WHERE digest = ");
        query.push_bind(digest);
        let row = D::fetch_optional(query, executor).await.map_err(map_err)?;
        row.map(|row| row.try_get(0).map_err(map_err)).transpose()
    }

    /// The bytes of all stored contents.
    pub(crate) async fn blob_bytes<'e>(
        executor: impl Executor<'e, Database = D>,
    ) -> Result<u64, Error> {
        let query =
            QueryBuilder::<D>::new("SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM blobs");
        let row = D::fetch_optional(query, executor).await.map_err(map_err)?;
        let total: i64 = match row {
            Some(row) => row.try_get(0).map_err(map_err)?,
            None => return Err(Error::Corrupt("the blobs' size: no row".to_string())),
        };
        sql::to_u64(total, "the blobs' size")
    }
}
