//! queue benchmarks, kvbm beside its peers (placeholder until written).
fn main() {}
