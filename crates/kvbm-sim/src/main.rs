//! kvbm-sim: replays request traces through kvbm (under construction).
#![forbid(unsafe_code)]

fn main() {}
