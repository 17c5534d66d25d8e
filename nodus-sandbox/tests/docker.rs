//! Docker-specific tests.
