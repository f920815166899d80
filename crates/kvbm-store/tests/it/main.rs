//! Integration tests of kvbm-store.
mod arena;
