//! Journal append benchmark (written next).
fn main() {}
