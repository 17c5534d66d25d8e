//! Placeholder until the router benchmark lands.
fn main() {}
