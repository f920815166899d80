//! kvbm-store-redis against real servers: the shared three-master cluster
//! `cargo xtask test` starts, and private servers the fault tests spawn and
//! kill.

mod engine;
mod faults;
mod send_sync;
mod store;
mod support;
