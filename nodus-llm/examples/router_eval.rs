//! Placeholder until the router evaluation lands.
fn main() {}
