//! Why the server could not start: its own module so that the pieces `app` starts (the
//! data directory's lock among them) can say so without importing `app`.

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory cannot be used.
    #[error("data directory {path}: {reason}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// A backend cannot be used.
    #[error("{0}")]
    Backend(String),
    /// The store failed during bootstrap.
    #[error("store: {0}")]
    Store(#[from] nodus_core::store::Error),
    /// Secrets cannot be sealed.
    #[error(transparent)]
    Cipher(#[from] crate::secrets::CipherError),
    /// The listen address cannot be bound.
    #[error("cannot listen on {address}: {reason}")]
    Listen {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
}
