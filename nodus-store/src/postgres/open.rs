//! Opening a Postgres store: the options, the schema (created if missing), the migrations,
//! the pool, the change listener and the writer tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use nodus_core::store::Error;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use tokio::sync::{broadcast, oneshot};

use super::documents::EditCommitter;
use super::journal::JournalCommitter;
use super::notifications::{Heard, Notifier, listen};
use super::{Inner, PostgresStore};
use crate::commit::GroupCommit;
use crate::sql::{self, map_err};

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_CAPACITY: usize = 1024;

/// The migrations, applied on connect.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Where and how to connect.
#[derive(Debug, Clone)]
#[non_exhaustive]
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

/// Counts store instances in this process, to name each in notifications.
static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl PostgresStore {
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
        let heard = Arc::new(Heard::new(format!(
            "{}-{}",
            nodus_core::store::process_owner(),
            INSTANCES.fetch_add(1, AtomicOrdering::Relaxed)
        )));
        tokio::spawn(listen(
            listener,
            changes.clone(),
            Arc::clone(&heard),
            stopped,
        ));

        let notifier = Arc::new(Notifier { channel, heard });
        let journal = GroupCommit::spawn(JournalCommitter::new(pool.clone()));
        let edits = GroupCommit::spawn(EditCommitter {
            pool: pool.clone(),
            notifier: Arc::clone(&notifier),
        });
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                notifier,
                journal,
                edits,
                changes,
                _stop_listening: stop,
            }),
        })
    }

    /// Close the pool; later calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }
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
