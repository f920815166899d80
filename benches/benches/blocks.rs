//! Block pool benchmarks, kvbm beside kvbm-logical (placeholder until written).
fn main() {}
