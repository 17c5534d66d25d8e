//! Sandbox latency benchmarks (written next).

fn main() {}
