//! Loom models of the request queue.
#![cfg(kvbm_loom)]
