//! The prefill/decode/speculative schedule-apply state machine of one request.
//!
//! (Under construction.)
#![forbid(unsafe_code)]
