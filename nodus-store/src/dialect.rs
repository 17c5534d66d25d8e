//! The SQL dialect of the reads written over sqlx ([`crate::reads`]): how a selector condition
//! reads a JSON path, and how a read locks the row it is about to write. Placeholders are the
//! query builder's; values are read back as text with `CAST(… AS TEXT)`. Postgres is the one
//! sqlx database now (the SQLite store runs its statements synchronously, `crate::sqlite`,
//! with the same SQL in SQLite's spelling).

use std::future::Future;
use std::pin::Pin;

use sqlx::{Executor, QueryBuilder};

/// A database whose SQL the shared reads can write: implemented for [`sqlx::Postgres`].
pub(crate) trait Dialect: sqlx::Database {
    /// Appended to a read inside a write transaction that writes the row next, so that no
    /// other writer changes it in between.
    const LOCK_FOR_UPDATE: &'static str;

    /// Pushes ` AND` the condition that the document's label `label` is the text `value`,
    /// or nothing when this dialect cannot spell it (the in-process match decides then).
    fn push_label_match<'a>(query: &mut QueryBuilder<'a, Self>, label: &'a str, value: &'a str);

    /// Pushes ` AND` the condition that the document's dotted `field` may equal `value`:
    /// text equal to it, or a number or a boolean (matched against its text in process), or
    /// nothing when this dialect cannot spell the path.
    fn push_field_match<'a>(query: &mut QueryBuilder<'a, Self>, field: &'a str, value: &'a str);

    /// The rows of a built query, read through `executor`. (Here rather than in the shared
    /// reads: only a concrete database lets the query borrow its builder.)
    fn fetch_all<'f, 'e: 'f, 'a: 'f>(
        query: QueryBuilder<'a, Self>,
        executor: impl Executor<'e, Database = Self> + 'f,
    ) -> Fetch<'f, Vec<Self::Row>>;

    /// The first row of a built query, if any, read through `executor`.
    fn fetch_optional<'f, 'e: 'f, 'a: 'f>(
        query: QueryBuilder<'a, Self>,
        executor: impl Executor<'e, Database = Self> + 'f,
    ) -> Fetch<'f, Option<Self::Row>>;
}

/// A query on its way (boxed, as sqlx's own executors answer: a future of a generic
/// database that is `Send` for every lifetime it borrows).
pub(crate) type Fetch<'f, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'f>>;

/// [`Dialect::fetch_all`] and [`Dialect::fetch_optional`] of a concrete database.
macro_rules! fetch_through_builder {
    () => {
        fn fetch_all<'f, 'e: 'f, 'a: 'f>(
            mut query: QueryBuilder<'a, Self>,
            executor: impl Executor<'e, Database = Self> + 'f,
        ) -> Fetch<'f, Vec<Self::Row>> {
            Box::pin(async move { query.build().fetch_all(executor).await })
        }

        fn fetch_optional<'f, 'e: 'f, 'a: 'f>(
            mut query: QueryBuilder<'a, Self>,
            executor: impl Executor<'e, Database = Self> + 'f,
        ) -> Fetch<'f, Option<Self::Row>> {
            Box::pin(async move { query.build().fetch_optional(executor).await })
        }
    };
}

#[cfg(feature = "postgres")]
impl Dialect for sqlx::Postgres {
    const LOCK_FOR_UPDATE: &'static str = " FOR UPDATE";

    fetch_through_builder!();

    fn push_label_match<'a>(query: &mut QueryBuilder<'a, Self>, label: &'a str, value: &'a str) {
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
        query.push_bind(value);
    }

    fn push_field_match<'a>(query: &mut QueryBuilder<'a, Self>, field: &'a str, value: &'a str) {
        let path: Vec<String> = field.split('.').map(str::to_string).collect();
        query.push(" AND (json_typeof(document #> ");
        query.push_bind(path.clone());
        query.push(") IN ('number', 'boolean') OR (json_typeof(document #> ");
        query.push_bind(path.clone());
        query.push(") = 'string' AND document #>> ");
        query.push_bind(path);
        query.push(" = ");
        query.push_bind(value);
        query.push("))");
    }
}
