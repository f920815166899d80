//! Loom models of the block pool.
