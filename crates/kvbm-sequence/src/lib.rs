//! Tokens split into blocks with chained hashes; per-request block tracking.
//!
//! (Under construction.)
#![forbid(unsafe_code)]
