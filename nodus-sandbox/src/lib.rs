//! Sandbox backends for Nodus.
