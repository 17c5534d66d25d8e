//! The crate's one error type: what can go wrong outside a model call (a catalog file that
//! cannot be used, a client that cannot be built). A model call itself fails with
//! [`nodus_core::model::Error`], whose kind tells the engine whether to retry, park or fail.

/// Why a catalog or a client cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model catalog is unreadable or invalid.
    #[error("model catalog: {0}")]
    Catalog(String),
    /// A client's or router's configuration is invalid (a bad URL, a TLS setup that fails,
    /// a routing model without a price).
    #[error("model client configuration: {0}")]
    Config(String),
}

/// A result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
