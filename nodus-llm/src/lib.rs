//! Model clients for Nodus.
