//! The block-pool workloads of `--bench blocks`, as a plain loop to count
//! instructions under callgrind: a clock on a shared 2-core machine varies
//! ±30% between runs, an instruction count not at all.
//!
//! ```sh
//! cargo build --release -p kvbm-benches --example pool_instructions
//! for n in 1000 11000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/pool_instructions kvbm match-held $n
//! done
//! ```
//!
//! The difference of the two totals over 10,000 iterations is the cost of
//! one iteration without the setup; divide by the blocks an iteration
//! touches (128 for the matches, 32 for the cycle). `kvbm-logical` in place
//! of `kvbm` runs the peer on the same hash values. `cycle-events` is the
//! cycle with a subscriber drained after each iteration (the peer has no
//! events: it runs the plain cycle).

use std::hint::black_box;
use std::process::ExitCode;

use kvbm_benches::{Xorshift, chain_values, ours, peer};

/// Tokens per block, as in `--bench blocks`.
const BLOCK_SIZE: usize = 4;
/// Blocks per matched chain.
const CHAIN: usize = 128;
/// Blocks per cycle, and distinct hash sets cycled through.
const CYCLE: usize = 32;
const SETS: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    /// `match_blocks` on a chain other handles pin.
    MatchHeld,
    /// `match_blocks` on a cached chain (revived, then cached again).
    MatchCached,
    /// allocate → stage → register → drop in a full pool (evicting).
    Cycle,
    /// The cycle with an event subscriber drained after each iteration.
    CycleEvents,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workload = match args.get(1).map(String::as_str) {
        Some("match-held") => Workload::MatchHeld,
        Some("match-cached") => Workload::MatchCached,
        Some("cycle") => Workload::Cycle,
        Some("cycle-events") => Workload::CycleEvents,
        _ => return usage(),
    };
    let Some(iterations) = args.get(2).and_then(|n| n.parse::<usize>().ok()) else {
        return usage();
    };
    let blocks = match args.first().map(String::as_str) {
        Some("kvbm") => run_ours(workload, iterations),
        Some("kvbm-logical") => run_peer(workload, iterations),
        _ => return usage(),
    };
    eprintln!("{iterations} iterations, {blocks} blocks touched");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: pool_instructions kvbm|kvbm-logical match-held|match-cached|cycle|cycle-events ITERATIONS"
    );
    ExitCode::FAILURE
}

fn hash_sets() -> (Vec<u64>, Vec<Vec<u64>>) {
    let chain = chain_values(&mut Xorshift::new(CHAIN as u64), CHAIN);
    let mut rng = Xorshift::new(42);
    let sets = (0..SETS).map(|_| chain_values(&mut rng, CYCLE)).collect();
    (chain, sets)
}

fn run_ours(workload: Workload, iterations: usize) -> usize {
    let (chain, sets) = hash_sets();
    let mut touched = 0;
    if matches!(workload, Workload::Cycle | Workload::CycleEvents) {
        let manager = ours::manager(2 * CYCLE, BLOCK_SIZE);
        let subscription =
            (workload == Workload::CycleEvents).then(|| manager.subscribe_events(1024));
        let sets: Vec<_> = sets.iter().map(|values| ours::hashes(values)).collect();
        for i in 0..iterations {
            touched += ours::register(&manager, black_box(&sets[i % SETS])).len();
            if let Some(subscription) = &subscription {
                manager.flush_events();
                while let Some(message) = subscription.try_recv() {
                    black_box(message);
                }
            }
        }
        return touched;
    }
    let manager = ours::manager(CHAIN, BLOCK_SIZE);
    let hashes = ours::hashes(&chain);
    let pinned = ours::register(&manager, &hashes);
    let _pinned = (workload == Workload::MatchHeld).then_some(pinned);
    for _ in 0..iterations {
        touched += manager.match_blocks(black_box(&hashes)).len();
    }
    touched
}

fn run_peer(workload: Workload, iterations: usize) -> usize {
    let (chain, sets) = hash_sets();
    let mut touched = 0;
    if matches!(workload, Workload::Cycle | Workload::CycleEvents) {
        let manager = peer::manager(2 * CYCLE, BLOCK_SIZE);
        let sets: Vec<_> = sets.iter().map(|values| peer::hashes(values)).collect();
        for i in 0..iterations {
            touched += peer::register(&manager, black_box(&sets[i % SETS]), BLOCK_SIZE).len();
        }
        return touched;
    }
    let manager = peer::manager(CHAIN, BLOCK_SIZE);
    let hashes = peer::hashes(&chain);
    let pinned = peer::register(&manager, &hashes, BLOCK_SIZE);
    let _pinned = (workload == Workload::MatchHeld).then_some(pinned);
    for _ in 0..iterations {
        touched += manager.match_blocks(black_box(&hashes)).len();
    }
    touched
}
