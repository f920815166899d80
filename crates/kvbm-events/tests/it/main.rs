//! kvbm-events against vLLM's own bytes, and fuzzed.

mod convert;
mod decode;
mod fuzz;
mod golden;
mod msgpack;
#[cfg(feature = "zmq")]
mod peers;
#[cfg(feature = "zmq")]
mod transport;
#[cfg(feature = "zmq")]
mod transport_faults;
#[cfg(feature = "zmq")]
mod transport_fuzz;
