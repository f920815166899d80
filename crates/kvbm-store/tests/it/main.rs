//! Integration tests of kvbm-store.
mod arena;
mod engine;
mod support;
