//! Integration tests for kvbm-queue: the C# spec's testing requirements, one
//! test per defect of the spec (named after it), selection policies, a
//! model-based proptest, a multi-thread stress test, auto traits, and the
//! `Scheduler` over the whole stack (hand-worked schedules and a random-driver
//! proptest). Tracing events are checked in their own binary, `tests/events.rs`.

#[cfg(not(kvbm_loom))]
mod aging;
#[cfg(not(kvbm_loom))]
mod credit;
mod defects;
#[cfg(not(kvbm_loom))]
mod edges;
#[cfg(not(kvbm_loom))]
mod fuzz;
#[cfg(not(kvbm_loom))]
mod groups;
mod groups_tiers;
mod hashed;
#[cfg(not(kvbm_loom))]
mod in_place;
#[cfg(not(kvbm_loom))]
mod kernels;
#[cfg(not(kvbm_loom))]
mod liveness;
mod model;
#[cfg(not(kvbm_loom))]
mod priority;
#[cfg(not(kvbm_loom))]
mod scheduler;
#[cfg(not(kvbm_loom))]
mod scheduler_model;
mod select;
mod send_sync;
mod spec;
#[cfg(not(kvbm_loom))]
mod speculative;
mod stress;
#[cfg(not(kvbm_loom))]
mod telemetry;
#[cfg(not(kvbm_loom))]
mod tiers;

#[cfg(not(kvbm_loom))]
use std::sync::Arc;

use kvbm_queue::{Priority, QueueConfig, Request, RequestQueue};
#[cfg(not(kvbm_loom))]
use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};
#[cfg(not(kvbm_loom))]
use proptest::prelude::*;

/// Cases per fuzz test: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N`
/// sets it), else `default`, sized for CI.
pub(crate) fn fuzz_cases(default: u32) -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}

/// KV cache groups over `block_size`: one to three of any kind, spans of
/// one to four blocks (the fuzzers' and the liveness property's models).
#[cfg(not(kvbm_loom))]
pub(crate) fn kv_groups(block_size: usize) -> impl Strategy<Value = Arc<KvCacheGroups>> {
    let kind = prop_oneof![
        Just(AttentionKind::Full),
        (1usize..5).prop_map(move |w| AttentionKind::SlidingWindow {
            window: w * block_size
        }),
        (1usize..5).prop_map(move |c| AttentionKind::ChunkedLocal {
            chunk: c * block_size
        }),
    ];
    prop::collection::vec(kind, 1..4).prop_map(move |kinds| {
        let groups = kinds.into_iter().map(|k| KvCacheGroup::new(k, 1)).collect();
        Arc::new(KvCacheGroups::new(block_size, groups).expect("valid groups"))
    })
}

/// A plain request. With the default 16-token blocks and `max_new: 0`, its
/// cost is `ceil(prompt / 16)` blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Req {
    pub(crate) id: u32,
    pub(crate) priority: Priority,
    pub(crate) prompt: u32,
    pub(crate) max_new: u32,
}

impl Request for Req {
    type Id = u32;
    fn id(&self) -> u32 {
        self.id
    }
    fn priority(&self) -> Priority {
        self.priority
    }
    fn prompt_tokens(&self) -> u32 {
        self.prompt
    }
    fn max_new_tokens(&self) -> u32 {
        self.max_new
    }
}

/// A one-block request.
pub(crate) fn req(id: u32, priority: Priority) -> Req {
    sized(id, priority, 1)
}

/// A request of exactly `blocks` 16-token blocks.
pub(crate) fn sized(id: u32, priority: Priority, blocks: u32) -> Req {
    Req {
        id,
        priority,
        prompt: 16 * blocks,
        max_new: 0,
    }
}

/// A queue of 16-token blocks over a pool of `pool` blocks.
pub(crate) fn queue(pool: u64) -> RequestQueue<Req> {
    with_config(QueueConfig::new(16, pool))
}

pub(crate) fn with_config(config: QueueConfig) -> RequestQueue<Req> {
    match RequestQueue::new(config) {
        Ok(queue) => queue,
        Err(error) => panic!("test config rejected: {error}"),
    }
}

/// Ids of everything `try_dequeue` hands out until the queue is empty.
pub(crate) fn drain_ids(queue: &RequestQueue<Req>) -> Vec<u32> {
    std::iter::from_fn(|| queue.try_dequeue().ok().map(|r| r.id)).collect()
}

/// Table-driven check: `f(input)` must equal `expect`.
pub(crate) fn check<I: std::fmt::Debug + Copy, O: std::fmt::Debug + PartialEq>(
    f: impl Fn(I) -> O,
    cases: &[(I, O)],
) {
    for (input, expect) in cases {
        assert_eq!(&f(*input), expect, "input: {input:?}");
    }
}
