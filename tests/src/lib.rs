//! End-to-end tests across the Nodus crates live in `tests/tests/`.
