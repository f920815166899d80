//! A thread-safe priority request queue and continuous-batching admission.
//!
//! (Under construction.)
#![forbid(unsafe_code)]
