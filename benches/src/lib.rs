//! Shared helpers for the kvbm benchmarks.
