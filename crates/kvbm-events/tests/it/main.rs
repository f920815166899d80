//! kvbm-events against vLLM's own bytes, and fuzzed.

mod convert;
mod fuzz;
mod golden;
#[cfg(feature = "zmq")]
mod transport;
