//! The cache-mode replay of `--bench sim` (LRU, 6,000 blocks of 512
//! tokens), with or without an event subscriber drained after every
//! request, as a plain run to count instructions under callgrind: what the
//! events cost, free of this machine's clock noise.
//!
//! ```sh
//! cargo build --release -p kvbm-benches --example replay_instructions
//! for events in off on; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='replay_instructions::replay*' \
//!     target/release/examples/replay_instructions $events [TRACE]
//! done
//! ```
//!
//! Only the replay is counted (not reading and splitting the trace); divide
//! the totals by the requests it prints. It also prints the replay's wall
//! time, for a rough look outside valgrind. Without a trace file it replays
//! kvbm-sim's embedded excerpt.

use std::process::ExitCode;
use std::time::Instant;

use kvbm_sim::{CacheSim, Eviction, KvEventCounts, Trace, Workload};

const BLOCK_SIZE: usize = 512;
const CAPACITY_BLOCKS: usize = 6_000;
/// The subscription's bound, as in the bench.
const EVENT_CAPACITY: usize = 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let events = match args.first().map(String::as_str) {
        Some("on") => true,
        Some("off") => false,
        _ => {
            eprintln!("usage: replay_instructions on|off [TRACE]");
            return ExitCode::FAILURE;
        }
    };
    let loaded = match args.get(1) {
        Some(path) => Trace::from_path(path),
        None => Trace::conversation_excerpt(),
    }
    .and_then(|trace| Workload::new(&trace, BLOCK_SIZE))
    .and_then(|workload| {
        Ok((
            CacheSim::new(BLOCK_SIZE, CAPACITY_BLOCKS, Eviction::Lru)?,
            workload,
        ))
    });
    let (mut sim, workload) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("replay_instructions: {err}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let result = match events {
        true => replay_with_events(&mut sim, &workload),
        false => replay(&mut sim, &workload),
    };
    let elapsed = started.elapsed();
    match result {
        Ok(stored) => {
            eprintln!(
                "{} requests in {:.1} ms, {} hit blocks, {stored} stored blocks seen by the subscriber",
                workload.len(),
                elapsed.as_secs_f64() * 1e3,
                sim.hits().hit_blocks
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("replay_instructions: {err}");
            ExitCode::FAILURE
        }
    }
}

#[inline(never)]
fn replay(sim: &mut CacheSim, workload: &Workload) -> Result<u64, kvbm_sim::SimError> {
    for request in workload.requests() {
        sim.replay_request(&request)?;
    }
    Ok(0)
}

#[inline(never)]
fn replay_with_events(sim: &mut CacheSim, workload: &Workload) -> Result<u64, kvbm_sim::SimError> {
    let subscription = sim.subscribe_events(EVENT_CAPACITY);
    let mut counts = KvEventCounts::default();
    for request in workload.requests() {
        sim.replay_request(&request)?;
        while let Some(message) = subscription.try_recv() {
            counts.record(&message);
        }
    }
    Ok(counts.stored_blocks)
}
