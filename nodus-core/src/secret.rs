//! Secret values that never print: `Debug` and `Display` show a placeholder.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use async_trait::async_trait;

/// A secret string, such as an API key. It has no `Serialize`, and formats as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wrap a secret.
    pub fn new(value: impl Into<String>) -> Self {
        SecretString(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a Secret's values could not be sealed or opened. It never holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SealError(pub String);

/// Where BYOK runs find their keys: the Secret resources of a project. A source that also
/// seals lets the engine store Secret resources (their values sealed, never in clear).
#[async_trait]
pub trait Secrets: Send + Sync {
    /// The value under `key` of the Secret `name` in `project`, if both exist.
    async fn lookup(&self, project: &str, name: &str, key: &str) -> Option<SecretString>;

    /// A Secret's values, sealed for the store (the `sealedData` of its document). By
    /// default a source keeps no Secret resources and refuses.
    fn seal(&self, values: &BTreeMap<String, SecretString>) -> Result<String, SealError> {
        let _ = values;
        Err(SealError(
            "this engine's secret source stores no Secret resources".to_string(),
        ))
    }

    /// What [`Secrets::seal`] made, opened again.
    fn open(&self, sealed: &str) -> Result<BTreeMap<String, SecretString>, SealError> {
        let _ = sealed;
        Err(SealError(
            "this engine's secret source stores no Secret resources".to_string(),
        ))
    }
}

/// The Secret values a run was created with, by Secret name and key: read when the run is
/// created, sealed beside it (never in a status, step or result) and opened for its sandbox
/// and its post-run action, so that changing or deleting a Secret afterwards does not change
/// the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedSecrets(BTreeMap<(String, String), SecretString>);

impl PinnedSecrets {
    /// None.
    pub fn new() -> Self {
        PinnedSecrets::default()
    }

    /// Keep `value` as key `key` of Secret `name`.
    pub fn insert(&mut self, name: &str, key: &str, value: SecretString) {
        self.0.insert((name.to_string(), key.to_string()), value);
    }

    /// The value of key `key` of Secret `name`, if it was pinned.
    pub fn get(&self, name: &str, key: &str) -> Option<&SecretString> {
        self.0.get(&(name.to_string(), key.to_string()))
    }

    /// Whether none was pinned.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sealed by `secrets` for the store. (A Secret's name is a DNS label, without `/`, so
    /// `name/key` reads back.)
    pub fn seal(&self, secrets: &dyn Secrets) -> Result<String, SealError> {
        let values = self
            .0
            .iter()
            .map(|((name, key), value)| (format!("{name}/{key}"), value.clone()))
            .collect();
        secrets.seal(&values)
    }

    /// What [`PinnedSecrets::seal`] made, opened again by `secrets`.
    pub fn open(sealed: &str, secrets: &dyn Secrets) -> Result<Self, SealError> {
        let mut pinned = PinnedSecrets::new();
        for (joined, value) in secrets.open(sealed)? {
            let Some((name, key)) = joined.split_once('/') else {
                return Err(SealError(
                    "a pinned Secret value is not filed under name/key".to_string(),
                ));
            };
            pinned.insert(name, key, value);
        }
        Ok(pinned)
    }
}

/// Secrets held in memory, as `(project, name, key) → value`; also the "no secrets" source
/// when empty.
#[derive(Debug, Clone, Default)]
pub struct StaticSecrets {
    values: HashMap<(String, String, String), SecretString>,
}

impl StaticSecrets {
    /// No secrets.
    pub fn new() -> Self {
        StaticSecrets::default()
    }

    /// With one more value.
    pub fn with(mut self, project: &str, name: &str, key: &str, value: SecretString) -> Self {
        self.values.insert(
            (project.to_string(), name.to_string(), key.to_string()),
            value,
        );
        self
    }
}

#[async_trait]
impl Secrets for StaticSecrets {
    async fn lookup(&self, project: &str, name: &str, key: &str) -> Option<SecretString> {
        self.values
            .get(&(project.to_string(), name.to_string(), key.to_string()))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_formats_the_value() {
        let secret = SecretString::new("sk-ant-12345");
        assert_eq!(
            format!("{secret} {secret:?} {:?}", Some(&secret)),
            "[redacted] [redacted] Some([redacted])"
        );
        assert_eq!(secret.expose(), "sk-ant-12345");
    }
}
