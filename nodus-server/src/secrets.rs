//! Secrets at rest: a Secret's values are encrypted with the server's key
//! (ChaCha20-Poly1305) before they reach the store, and never leave the server again except
//! as a BYOK run's API key.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use nodus_core::resource::Kind;
use nodus_core::secret::{SealError, SecretString, Secrets};
use nodus_core::store::{ObjectKey, Store};

use crate::auth::TokenKey;
use crate::paging::ContinueKey;

/// The file in the data directory with the server's secret key.
pub const KEY_FILE: &str = "secret.key";
const NONCE_BYTES: usize = 12;

/// Encrypts and decrypts secret values with the server's key, and gives the key that tokens
/// are hashed with (derived from the same key, so replicas that share `secret.key` share it).
#[derive(Clone)]
pub struct Cipher {
    cipher: ChaCha20Poly1305,
    tokens: TokenKey,
    pages: ContinueKey,
}

/// Why a secret could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum CipherError {
    /// No randomness.
    #[error("no randomness available: {0}")]
    Random(getrandom::Error),
    /// The key file is unusable.
    #[error("the server key file {path} is unusable: {reason}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Ciphertext that this key did not make, or that was changed.
    #[error("a stored secret cannot be decrypted with this server's key")]
    Open,
}

impl Cipher {
    /// A cipher with a fresh random key (for a server that keeps nothing on disk).
    pub fn ephemeral() -> Result<Self, CipherError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(CipherError::Random)?;
        Ok(Self::from_key(&key))
    }

    /// The cipher of a data directory: its key file, made on first use (owner-only).
    pub fn in_dir(dir: &Path) -> Result<Self, CipherError> {
        let path = dir.join(KEY_FILE);
        let key_error = |reason: String| CipherError::KeyFile {
            path: path.display().to_string(),
            reason,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                let mode = meta.permissions().mode() & 0o7777;
                if !meta.is_file() {
                    return Err(key_error("it is not a regular file".into()));
                }
                if mode & 0o066 != 0 {
                    return Err(key_error(format!(
                        "its mode is {mode:04o}: other users can read or write it, so Secrets \
                         sealed with it are not secret (and a key someone else wrote must not \
                         be used); check that it is the server's own key, then `chmod 600 {}`",
                        path.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(key_error(e.to_string())),
        }
        if !path.exists() {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(CipherError::Random)?;
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            crate::auth::write_private_file(&path, &hex).map_err(|e| key_error(e.to_string()))?;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| key_error(e.to_string()))?;
        let bytes = decode_hex(text.trim()).ok_or_else(|| key_error("not 64 hex digits".into()))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| key_error("not 64 hex digits".into()))?;
        Ok(Self::from_key(&key))
    }

    fn from_key(key: &[u8; 32]) -> Self {
        Cipher {
            cipher: ChaCha20Poly1305::new(Key::from_slice(key)),
            tokens: TokenKey::derive(key),
            pages: ContinueKey::derive(key),
        }
    }

    /// The key that tokens are hashed with.
    pub fn token_key(&self) -> TokenKey {
        self.tokens.clone()
    }

    /// The key that lists' `continue` tokens are signed with.
    pub fn continue_key(&self) -> &ContinueKey {
        &self.pages
    }

    /// Encrypt values; the result is hex of nonce ‖ ciphertext.
    pub fn seal(&self, values: &BTreeMap<String, String>) -> Result<String, CipherError> {
        let plaintext = serde_json::to_vec(values).map_err(|_| CipherError::Open)?;
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(CipherError::Random)?;
        let ciphertext = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plaintext.as_slice())
            .map_err(|_| CipherError::Open)?;
        Ok(nonce
            .iter()
            .chain(ciphertext.iter())
            .map(|b| format!("{b:02x}"))
            .collect())
    }

    /// Decrypt what [`Cipher::seal`] made.
    pub fn open(&self, sealed: &str) -> Result<BTreeMap<String, String>, CipherError> {
        let bytes = decode_hex(sealed).ok_or(CipherError::Open)?;
        if bytes.len() < NONCE_BYTES {
            return Err(CipherError::Open);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let plaintext = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map_err(|_| CipherError::Open)?;
        serde_json::from_slice(&plaintext).map_err(|_| CipherError::Open)
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

/// BYOK keys read from the Secret resources in the store.
pub struct StoreSecrets {
    store: Arc<dyn Store>,
    cipher: Cipher,
}

impl StoreSecrets {
    /// Secrets of this store, opened with this cipher.
    pub fn new(store: Arc<dyn Store>, cipher: Cipher) -> Self {
        StoreSecrets { store, cipher }
    }
}

#[async_trait]
impl Secrets for StoreSecrets {
    async fn lookup(&self, project: &str, name: &str, key: &str) -> Option<SecretString> {
        let record = self
            .store
            .get(&ObjectKey::new(project, Kind::Secret, name))
            .await
            .ok()?;
        let sealed = record.document["sealedData"].as_str()?;
        match self.cipher.open(sealed) {
            Ok(values) => values
                .get(key)
                .map(|value| SecretString::new(value.clone())),
            Err(error) => {
                tracing::warn!(project, secret = name, error = %error, "cannot open secret");
                None
            }
        }
    }

    fn seal(&self, values: &BTreeMap<String, SecretString>) -> Result<String, SealError> {
        let plain: BTreeMap<String, String> = values
            .iter()
            .map(|(key, value)| (key.clone(), value.expose().to_string()))
            .collect();
        self.cipher
            .seal(&plain)
            .map_err(|e| SealError(e.to_string()))
    }

    fn open(&self, sealed: &str) -> Result<BTreeMap<String, SecretString>, SealError> {
        let values = self
            .cipher
            .open(sealed)
            .map_err(|e| SealError(e.to_string()))?;
        Ok(values
            .into_iter()
            .map(|(key, value)| (key, SecretString::new(value)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_and_refuses_tampering() {
        let cipher = Cipher::ephemeral().expect("key");
        let values = BTreeMap::from([("ANTHROPIC_API_KEY".to_string(), "sk-ant-xyz".to_string())]);
        let sealed = cipher.seal(&values).expect("seal");
        assert!(
            !sealed.contains("sk-ant"),
            "the value is not in the sealed text"
        );
        assert_eq!(cipher.open(&sealed).expect("open"), values);
        let mut tampered = sealed.clone();
        tampered.replace_range(30..32, if &sealed[30..32] == "00" { "01" } else { "00" });
        assert!(cipher.open(&tampered).is_err());
        let other = Cipher::ephemeral().expect("key");
        assert!(other.open(&sealed).is_err(), "another key cannot open it");
    }

    #[test]
    fn the_key_file_is_made_once_and_owner_only() {
        let dir = std::env::temp_dir().join(format!("nodus-cipher-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = Cipher::in_dir(&dir).expect("cipher");
        let sealed = first.seal(&BTreeMap::new()).expect("seal");
        let again = Cipher::in_dir(&dir).expect("cipher");
        assert!(again.open(&sealed).is_ok(), "the same key is read back");
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
