//! Integration tests for kvbm-schedule, through the public API only.

mod errors;
#[cfg(not(kvbm_loom))]
mod fuzz;
#[cfg(not(kvbm_loom))]
mod groups;
mod history;
mod lifecycle;
#[cfg(not(kvbm_loom))]
mod model;
mod registration;
mod send_sync;

use std::fmt::Debug;

use kvbm_blocks::{BlockManager, PoolAudit};
use kvbm_schedule::{EventLog, SchedulableSequence, SequenceState};

/// The storage-tier marker used throughout the tests.
#[derive(Debug)]
pub(crate) struct Gpu;

pub(crate) const BLOCK_SIZE: usize = 4;

pub(crate) fn manager(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BLOCK_SIZE)
        .build()
        .expect("valid test configuration")
}

/// A request with prompt `0..prompt_len`, in `BLOCK_SIZE`-token blocks.
pub(crate) fn request(prompt_len: u32, max_output_tokens: usize) -> SchedulableSequence<Gpu> {
    SchedulableSequence::new((0..prompt_len).collect(), max_output_tokens, BLOCK_SIZE)
        .expect("non-zero block size")
}

/// Audits the pool and checks that the partition adds up to the total.
pub(crate) fn audit(manager: &BlockManager<Gpu>) -> PoolAudit {
    let audit = manager.audit().expect("pool is consistent");
    assert_eq!(audit.total_blocks(), manager.total_blocks(), "{audit:?}");
    audit
}

/// Everything observable about a sequence and its pool, to show that a
/// refused call changed nothing.
#[derive(Debug, PartialEq)]
pub(crate) struct Snapshot {
    state: SequenceState,
    kv_position: usize,
    tail_tokens: usize,
    tokens: Vec<u32>,
    blocks: (usize, usize, usize),
    page_table: Vec<u32>,
    history: EventLog,
    audit: PoolAudit,
    available: usize,
}

pub(crate) fn snapshot(seq: &SchedulableSequence<Gpu>, manager: &BlockManager<Gpu>) -> Snapshot {
    Snapshot {
        state: seq.state(),
        kv_position: seq.kv_position(),
        tail_tokens: seq.tail_tokens(),
        tokens: seq.tokens().to_vec(),
        blocks: (
            seq.assigned_blocks(),
            seq.staged_blocks(),
            seq.unassigned_blocks(),
        ),
        page_table: seq.page_indices(),
        history: seq.history().clone(),
        audit: audit(manager),
        available: manager.available_blocks(),
    }
}

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else `default`, sized for CI.
pub(crate) fn fuzz_cases(default: u32) -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}

/// Table-test helper: `actual` must equal `expected`, labelled by `case`.
#[track_caller]
pub(crate) fn check<T: PartialEq + Debug>(case: &str, actual: T, expected: T) {
    assert_eq!(actual, expected, "case: {case}");
}
