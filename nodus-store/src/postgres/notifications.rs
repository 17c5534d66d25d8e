//! Change notification: a write announces its changes with `pg_notify` inside its transaction
//! (delivered on commit, in commit order); one `LISTEN` connection per store hears them and
//! passes them on to the subscribers in this process. A write returns only once its own
//! notifications were heard (or after a while, when the listener is reconnecting).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nodus_core::resource::Kind;
use nodus_core::store::{Change, Error, ObjectKey};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnection, PgListener};
use tokio::sync::{broadcast, oneshot};

use super::PostgresStore;
use crate::sql::map_err;

/// Where a store announces its changes, and who waits to hear them back.
#[derive(Debug)]
pub(super) struct Notifier {
    /// The schema's notification channel.
    pub(super) channel: String,
    /// Who is waiting to hear their own notifications.
    pub(super) heard: Arc<Heard>,
}

impl Notifier {
    /// Announce `change` inside the caller's transaction; the answer tells when this store
    /// heard it back.
    pub(super) async fn announce(
        &self,
        conn: &mut PgConnection,
        change: &Change,
    ) -> Result<Hearing, Error> {
        let (token, hearing) = self.heard.expect();
        sqlx::query("SELECT pg_notify($1, $2)::text")
            .bind(&self.channel)
            .bind(change_payload(change, &self.heard.instance, token))
            .execute(conn)
            .await
            .map_err(map_err)?;
        Ok(hearing)
    }
}

impl PostgresStore {
    /// Changes from now on.
    pub(super) fn changes(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }
}

/// A write returns only once this store's listener heard its change and passed it on to the
/// subscribers in this process, so that "changes from now on" means the same as in the
/// in-process backends: a subscriber made after a write returned never sees that write.
#[derive(Debug, Default)]
pub(super) struct Heard {
    /// This store instance's name in notifications.
    pub(super) instance: String,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl Heard {
    /// Nobody waiting yet, for the store instance named `instance` in notifications.
    pub(super) fn new(instance: String) -> Self {
        Heard {
            instance,
            ..Heard::default()
        }
    }

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
pub(super) struct Hearing {
    token: u64,
    heard: Arc<Heard>,
    hearing: oneshot::Receiver<()>,
}

impl Hearing {
    /// Wait until heard, or for at most `HEARING`: the write is durable either way, and a
    /// listener that is reconnecting must not hold writers up.
    pub(super) async fn wait(mut self) {
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

/// Hear notifications and pass them on, until the store is dropped.
pub(super) async fn listen(
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
    let kind = |key: &ObjectKey| key.kind.plural().to_string();
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
        Kind::stored(value.get(4)?.as_str()?)?,
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
