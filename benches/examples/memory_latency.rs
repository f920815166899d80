//! How fast this machine's memory answers right now: the time of a load
//! from a random place in 1 GiB when each load's address depends on the
//! one before (latency: a cache miss and, with 4 KiB pages, a TLB miss
//! each), and when none does (the misses overlap). The replays whose time
//! the README quotes wait on such misses (block registrations, evictions,
//! the router's index at 1,024 engines), and these 2-core machines share
//! their caches and memory with other work, so the same binary's time
//! moves by 2x between days. Quote this beside a timing: whether it tells
//! a fast hour from a slow one is still to be seen (on 2026-11-28, a slow
//! day, it did not track the replays' noise within the afternoon).
//!
//! ```sh
//! cargo run --release -p kvbm-benches --example memory_latency
//! ```

use std::hint::black_box;
use std::time::Instant;

use kvbm_benches::mix64;

/// Entries of the array: 2^28 `u32`s, 1 GiB, far beyond any cache here.
const ENTRIES: usize = 1 << 28;

/// Loads timed per pass.
const LOADS: usize = 2_000_000;

fn main() {
    // Written, so every page is backed (untouched zeroed pages would all
    // map to one).
    let memory = vec![1u32; ENTRIES];
    let mask = (ENTRIES - 1) as u64;
    let (mut dependent, mut independent) = (f64::MAX, f64::MAX);
    for pass in 0..3u64 {
        let start = Instant::now();
        let mut at = pass;
        for _ in 0..LOADS {
            // The next address needs this load's value.
            let value = u64::from(memory[(at & mask) as usize]);
            at = mix64(at.wrapping_add(value));
        }
        black_box(at);
        dependent = dependent.min(start.elapsed().as_nanos() as f64 / LOADS as f64);

        let start = Instant::now();
        let mut sum = 0u64;
        for k in 0..LOADS as u64 {
            sum = sum.wrapping_add(u64::from(memory[(mix64(k ^ pass << 40) & mask) as usize]));
        }
        black_box(sum);
        independent = independent.min(start.elapsed().as_nanos() as f64 / LOADS as f64);
    }
    eprintln!(
        "random loads from 1 GiB, best of 3: {dependent:.0} ns each when dependent, \
         {independent:.1} ns each when independent"
    );
}
