//! The workloads of `--bench tiers` as a plain loop, to count instructions
//! under callgrind (a clock on a shared 2-core machine varies ±30% between
//! runs, an instruction count not at all).
//!
//! ```sh
//! cargo build --release -p kvbm-benches --example tiers_instructions
//! for n in 1000 11000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/tiers_instructions store 32 $n
//! done
//! ```
//!
//! The difference of the two totals over 10,000 iterations is the cost of
//! one iteration without the setup; divide by the blocks it moves (the
//! batch, 32 above). `device-only` is the same device work with no tier.

use std::hint::black_box;
use std::process::ExitCode;

use kvbm_benches::tiers::{DeviceOnly, Load, Store};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| args.get(i).and_then(|n| n.parse::<usize>().ok());
    let (Some(batch), Some(iterations)) = (number(1), number(2)) else {
        return usage();
    };
    let mut step: Box<dyn FnMut() -> usize> = match args.first().map(String::as_str) {
        Some("device-only") => {
            let mut fixture = DeviceOnly::new(batch);
            Box::new(move || fixture.step())
        }
        Some("store") => {
            let mut fixture = Store::new(batch);
            Box::new(move || fixture.step())
        }
        Some("load") => {
            let mut fixture = Load::new(batch);
            Box::new(move || fixture.step())
        }
        _ => return usage(),
    };
    let mut moved = 0;
    for _ in 0..iterations {
        moved += black_box(step());
    }
    eprintln!("{iterations} iterations, {moved} blocks moved");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!("usage: tiers_instructions device-only|store|load BATCH ITERATIONS");
    ExitCode::FAILURE
}
