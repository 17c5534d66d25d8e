//! The fleet's replicas as the store knows them: each serving replica keeps a `Replica`
//! document in the system project (name, role, capacity, version; runs in use, last heartbeat,
//! draining), written at start and every [`HEARTBEAT`], marked draining when it drains and
//! removed once it has drained. `GET /apis/nodus.dev/v1/replicas` (`nodus get replicas`) lists
//! them; a replica that died keeps its last heartbeat, which says so. `POST
//! …/replicas/NAME/drain` (`nodus server drain NAME`) sets `spec.drain` on a replica's document;
//! the replica, whichever process it is, hears the change ([`drain_requested`]) and drains as
//! on SIGTERM.

use std::time::Duration;

use nodus_core::resource::Kind;
use nodus_core::store::{Error, ObjectKey, Selector, Store};
use serde_json::{Value, json};

use crate::auth::SYSTEM_PROJECT;

/// The internal kind of the replicas' documents.
pub const REPLICA: Kind = Kind::extension("replicas");

/// How often a replica writes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// What a replica says of itself.
#[derive(Debug, Clone)]
pub struct ReplicaInfo {
    /// Its name (`replica-name` in its data directory).
    pub name: String,
    /// `all`, `api` or `worker`.
    pub role: &'static str,
    /// Live sandboxes it may hold at once (0 for an API replica).
    pub capacity: usize,
}

/// The replica's document as of now; `drain` when an operator asked it to drain.
fn document(
    info: &ReplicaInfo,
    in_use: usize,
    draining: bool,
    drain: bool,
    now: jiff::Timestamp,
) -> Value {
    let mut spec =
        json!({"role": info.role, "capacity": info.capacity, "version": env!("CARGO_PKG_VERSION")});
    if drain {
        spec["drain"] = Value::Bool(true);
    }
    json!({
        "apiVersion": nodus_core::resource::API_VERSION,
        "kind": "Replica",
        "metadata": {"name": info.name},
        "spec": spec,
        "status": {"inUse": in_use, "heartbeat": now.to_string(), "draining": draining},
    })
}

/// Whether a replica's stored document asks it to drain.
fn asks_drain(document: &Value) -> bool {
    document["spec"]["drain"] == Value::Bool(true)
}

/// Whether a heartbeat keeps a drain an operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The replica starts: a new life, whatever its name's last document asked.
    First,
    /// A later heartbeat: a drain asked for stays asked.
    Again,
}

/// Write the replica's document (create it, or replace what is stored).
pub async fn beat(
    store: &dyn Store,
    info: &ReplicaInfo,
    in_use: usize,
    draining: bool,
    now: jiff::Timestamp,
    beat: Beat,
) -> Result<(), Error> {
    let key = ObjectKey::new(SYSTEM_PROJECT, REPLICA, &info.name);
    for _ in 0..3 {
        let written = match store.get(&key).await {
            Ok(record) => {
                let drain = beat == Beat::Again && asks_drain(&record.document);
                let document = document(info, in_use, draining, drain, now);
                store.update(&key, record.version, document).await
            }
            Err(Error::NotFound(_)) => {
                let document = document(info, in_use, draining, false, now);
                store.create(&key, document).await
            }
            Err(error) => return Err(error),
        };
        match written {
            Ok(_) => return Ok(()),
            Err(Error::Conflict { .. } | Error::AlreadyExists(_)) => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Ask the replica `name` to drain: set `spec.drain` on its document (it may be another
/// process: it hears the change through the store). Returns the document as written.
pub async fn request_drain(store: &dyn Store, name: &str) -> Result<Value, Error> {
    let key = ObjectKey::new(SYSTEM_PROJECT, REPLICA, name);
    loop {
        let record = store.get(&key).await?;
        let mut document = record.document;
        document["spec"]["drain"] = Value::Bool(true);
        match store.update(&key, record.version, document.clone()).await {
            Ok(_) => return Ok(document),
            // A heartbeat wrote meanwhile: ask again on what it wrote.
            Err(Error::Conflict { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Resolves once the replica `name`'s document asks it to drain: on the store's change of
/// that document (any replica may have written the request), or at the latest one
/// [`HEARTBEAT`] after it, should a notification be missed.
pub async fn drain_requested(store: std::sync::Arc<dyn Store>, name: String) {
    let key = ObjectKey::new(SYSTEM_PROJECT, REPLICA, &name);
    let mut changes = store.subscribe();
    loop {
        if let Ok(record) = store.get(&key).await
            && asks_drain(&record.document)
        {
            return;
        }
        let heard = tokio::time::timeout(HEARTBEAT, async {
            loop {
                match changes.recv().await {
                    Ok(nodus_core::store::Change::Written(written, _)) if written == key => {
                        return;
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        });
        let _ = heard.await;
    }
}

/// Remove the replica's document (it has drained and stops).
pub async fn remove(store: &dyn Store, name: &str) {
    let key = ObjectKey::new(SYSTEM_PROJECT, REPLICA, name);
    match store.delete(&key).await {
        Ok(()) | Err(Error::NotFound(_)) => {}
        Err(error) => {
            tracing::warn!(replica = name, error = %error, "cannot remove the replica's record")
        }
    }
}

/// Every replica's document, in the order they first started.
pub async fn list(store: &dyn Store) -> Result<Vec<Value>, Error> {
    Ok(store
        .list(SYSTEM_PROJECT, REPLICA, &Selector::default())
        .await?
        .into_iter()
        .map(|record| record.document)
        .collect())
}
