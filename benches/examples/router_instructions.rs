//! The event workloads of `--bench router`'s fleet rows, as a plain loop
//! to count instructions under callgrind: on a shared 2-core machine the
//! clock of a 2 µs event varies by half between runs, its instruction
//! count not at all.
//!
//! ```sh
//! cargo build --release -p kvbm-benches --example router_instructions
//! for n in 1000 11000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/router_instructions store-remove $n
//! done
//! ```
//!
//! The difference of the two totals over 10,000 iterations is the cost of
//! one iteration without the setup (1,024 workers, each holding a 64-block
//! chain shared by all and one of its own); divide by 128, the blocks an
//! iteration's two events carry. `store-remove` stores then removes a
//! chain of new blocks on one worker (`store+remove/fleet-1024`),
//! `remove-store-shared` removes then stores again its copy of the shared
//! chain (`store+remove/fleet-1024-shared`).

use std::process::ExitCode;

use kvbm_benches::fleet::{self, SHARED_CHAIN, chain, removed, stored};

/// The worker the events come from.
const WORKER: u64 = 5;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shared = match args.first().map(String::as_str) {
        Some("store-remove") => false,
        Some("remove-store-shared") => true,
        _ => return usage(),
    };
    let Some(iterations) = args.get(1).and_then(|n| n.parse::<usize>().ok()) else {
        return usage();
    };
    let router = match fleet::router() {
        Ok(router) => router,
        Err(error) => {
            eprintln!("router_instructions: the fleet could not be built: {error}");
            return ExitCode::FAILURE;
        }
    };
    let owner = if shared { SHARED_CHAIN } else { 1 << 40 };
    let (store, remove) = (stored(chain(owner)), removed(chain(owner)));
    let (first, second) = if shared {
        (&remove, &store)
    } else {
        (&store, &remove)
    };
    for _ in 0..iterations {
        if router.apply(WORKER, std::hint::black_box(first)).is_err()
            || router.apply(WORKER, std::hint::black_box(second)).is_err()
        {
            eprintln!("router_instructions: worker {WORKER} refused");
            return ExitCode::FAILURE;
        }
    }
    let held = router.stats(WORKER).map(|stats| stats.held_blocks);
    eprintln!("{iterations} iterations, worker {WORKER} holds {held:?} blocks");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: router_instructions store-remove|remove-store-shared ITERATIONS");
    ExitCode::FAILURE
}
