//! The Nodus server: the REST API, the controllers (run executor, group controller,
//! deadline and retention sweepers) and auth, on top of nodus-core.
//!
//! This crate is filled by the server issue; today it only names what it will own.

/// The API group and version the server serves.
pub const API_PATH: &str = "/apis/nodus.dev/v1";
