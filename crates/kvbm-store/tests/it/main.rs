//! Integration tests of kvbm-store.
mod arena;
mod disk;
mod engine;
mod support;
