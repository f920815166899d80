//! Integration tests of kvbm-store.
mod arena;
mod contract;
mod disk;
mod engine;
mod restart;
mod support;
