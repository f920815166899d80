//! The block pool's benchmark workloads (`--bench blocks` in kvbm-benches),
//! ours only, in a loop to count instructions with, which criterion's timings
//! on a shared machine are too noisy for:
//!
//! ```text
//! cargo build --release -p kvbm-blocks --example pool_instructions
//! valgrind --tool=callgrind target/release/examples/pool_instructions held 8 100000
//! ```
//!
//! and divide the total by the count (minus a run with a count of 0, the
//! setup). Workloads: `held N` and `cached N` (`match_blocks` on an N-block
//! chain that another handle pins, or that sits in the cache) and `cycle`
//! (allocate 32, stage, register and drop, in a 64-block pool that evicts
//! every time). The inputs are the benchmark's: the same hash values, block
//! size and pool size.

use std::hint::black_box;

use kvbm_blocks::{BlockManager, ImmutableBlocks, SequenceHash};

struct Gpu;

const BLOCK_SIZE: usize = 4;

/// kvbm-benches' `Xorshift`, so the hash values are the benchmark's.
struct Xorshift(u64);

impl Xorshift {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A chain of `len` blocks with the benchmark's random values.
fn chain(rng: &mut Xorshift, len: usize) -> Vec<SequenceHash> {
    let mut out: Vec<SequenceHash> = Vec::with_capacity(len);
    for _ in 0..len {
        let value = u128::from(rng.next_u64());
        out.push(match out.last() {
            Some(parent) => parent.child(value),
            None => SequenceHash::root(value),
        });
    }
    out
}

fn manager(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BLOCK_SIZE)
        .build()
        .expect("valid configuration")
}

fn register(manager: &BlockManager<Gpu>, hashes: &[SequenceHash]) -> ImmutableBlocks<Gpu> {
    let staged = (manager.allocate_blocks(hashes.len()).expect("room"))
        .into_iter()
        .zip(hashes)
        .map(|(block, &hash)| block.stage(hash, BLOCK_SIZE).expect("size"))
        .collect();
    manager.register_blocks(staged).expect("same manager")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: pool_instructions held|cached N ITERATIONS | cycle ITERATIONS";
    let number = |i: usize| -> usize {
        let arg: &String = args.get(i).expect(usage);
        arg.parse().expect(usage)
    };
    match args.first().map(String::as_str) {
        Some(workload @ ("held" | "cached")) => {
            let (n, iterations) = (number(1), number(2));
            let hashes = chain(&mut Xorshift::new(n as u64), n);
            let manager = manager(n);
            let pinned = register(&manager, &hashes);
            let _pinned = (workload == "held").then_some(pinned);
            for _ in 0..iterations {
                let matched = manager.match_blocks(black_box(&hashes));
                assert_eq!(black_box(matched).len(), n);
            }
        }
        Some("cycle") => {
            const N: usize = 32;
            let iterations = number(1);
            let mut rng = Xorshift::new(42);
            let sets: Vec<_> = (0..64).map(|_| chain(&mut rng, N)).collect();
            let manager = manager(2 * N);
            for i in 0..iterations {
                drop(black_box(register(&manager, &sets[(i + 1) % sets.len()])));
            }
        }
        _ => panic!("{usage}"),
    }
}
