//! `Secret`: named values (a BYOK agent's provider key, under the key the engine's
//! [`Config::byok_secret_key`](crate::engine::Config::byok_secret_key) names), written as
//! `stringData`, stored sealed, and shown by their keys only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{API_VERSION, Kind, ObjectMeta};
use crate::secret::SecretString;

/// A Secret, in Kubernetes' shape: `metadata`, `type`, and its values as `stringData`.
///
/// Its `Serialize` is what reading shows: the keys, never a value (nor the sealed text).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Secret {
    /// Name, project, labels and the fields the store keeps.
    pub metadata: ObjectMeta,
    /// `type`, free-form (`Opaque`).
    pub secret_type: Option<String>,
    /// The values: present when written, and when opened for a merge patch; empty when read.
    pub values: BTreeMap<String, SecretString>,
    /// The names of its values.
    pub keys: Vec<String>,
    /// The values as the store holds them, sealed (`sealedData`); set when read.
    pub sealed: Option<String>,
}

impl Secret {
    /// A Secret with these values.
    pub fn new(name: impl Into<String>, values: BTreeMap<String, SecretString>) -> Self {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            keys: values.keys().cloned().collect(),
            values,
            ..Secret::default()
        }
    }

    /// The name, or `""`.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The document of a Secret: what the store holds (with `sealedData`) and what reading shows
/// (without).
#[derive(Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SecretDocument {
    pub api_version: String,
    pub kind: Kind,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub secret_type: Option<String>,
    #[serde(default)]
    pub keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_data: Option<String>,
}

impl SecretDocument {
    /// The document of `secret` with its sealed values, or without them.
    pub(crate) fn of(secret: &Secret, sealed: Option<String>) -> Self {
        SecretDocument {
            api_version: API_VERSION.to_string(),
            kind: Kind::Secret,
            metadata: secret.metadata.clone(),
            secret_type: secret.secret_type.clone(),
            keys: secret.keys.clone(),
            sealed_data: sealed,
        }
    }

    /// The Secret it describes (its values still sealed).
    pub(crate) fn into_secret(self) -> Secret {
        Secret {
            metadata: self.metadata,
            secret_type: self.secret_type,
            values: BTreeMap::new(),
            keys: self.keys,
            sealed: self.sealed_data,
        }
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SecretDocument::of(self, None).serialize(serializer)
    }
}
