//! Typed access to the store: resources to JSON documents and back.

use serde_json::Value;

use super::{Error, Result};
use crate::resource::{Object, Spec};
use crate::store::{ObjectKey, Record};

/// A typed object and the version it was read at.
#[derive(Debug, Clone)]
pub struct Versioned<S: Spec> {
    /// The object (its `metadata.resourceVersion` set to `version`).
    pub object: Object<S>,
    /// The store's version.
    pub version: u64,
}

/// The document to store: everything but the version, which the store keeps.
pub fn encode<S: Spec>(key: &ObjectKey, object: &Object<S>) -> Result<Value> {
    let mut object = object.clone();
    object.metadata.resource_version = None;
    serde_json::to_value(&object).map_err(|e| Error::Corrupt {
        key: key.to_string(),
        message: e.to_string(),
    })
}

/// A stored record as its kind.
pub fn decode<S: Spec>(record: Record) -> Result<Versioned<S>> {
    let key = record.key.to_string();
    let mut object: Object<S> =
        serde_json::from_value(record.document).map_err(|e| Error::Corrupt {
            key,
            message: e.to_string(),
        })?;
    object.metadata.resource_version = Some(record.version.to_string());
    Ok(Versioned {
        object,
        version: record.version,
    })
}
