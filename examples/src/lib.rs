//! Examples of embedding nodus-core; see `embedding.rs`.
