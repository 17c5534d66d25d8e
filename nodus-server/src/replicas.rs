//! The fleet's replicas as the store knows them: each serving replica keeps a `Replica`
//! document in the system project (name, role, capacity, version; runs in use, last heartbeat,
//! draining), written at start and every [`HEARTBEAT`], marked draining when it drains and
//! removed once it has drained. `GET /apis/nodus.dev/v1/replicas` (`nodus get replicas`) lists
//! them; a replica that died keeps its last heartbeat, which says so.

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

/// The replica's document as of now.
fn document(info: &ReplicaInfo, in_use: usize, draining: bool, now: jiff::Timestamp) -> Value {
    json!({
        "apiVersion": nodus_core::resource::API_VERSION,
        "kind": "Replica",
        "metadata": {"name": info.name},
        "spec": {"role": info.role, "capacity": info.capacity, "version": env!("CARGO_PKG_VERSION")},
        "status": {"inUse": in_use, "heartbeat": now.to_string(), "draining": draining},
    })
}

/// Write the replica's document (create it, or replace what is stored).
pub async fn beat(
    store: &dyn Store,
    info: &ReplicaInfo,
    in_use: usize,
    draining: bool,
    now: jiff::Timestamp,
) -> Result<(), Error> {
    let key = ObjectKey::new(SYSTEM_PROJECT, REPLICA, &info.name);
    let document = document(info, in_use, draining, now);
    for _ in 0..3 {
        let written = match store.get(&key).await {
            Ok(record) => store.update(&key, record.version, document.clone()).await,
            Err(Error::NotFound(_)) => store.create(&key, document.clone()).await,
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
