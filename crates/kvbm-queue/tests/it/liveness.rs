//! Liveness: random workloads (pool, limits, reserve, prompts with shared
//! prefixes, arrivals over time, engine stops) run to completion within a
//! bound on steps. Every request whose prompt plus `max_new_tokens` fits the
//! pool finishes on its own terms (`MaxTokens` or `Stop`); a request that can
//! never fit is refused at submit or finishes with a reason, and nothing is
//! requeued forever. With aging on, a steady stream of urgent requests does
//! not starve a less urgent one. A third of the workloads run a model of
//! several KV cache groups (full, sliding-window and chunked-local layers):
//! a request fits when its groups' needs do. `cargo xtask fuzz` runs these
//! long.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kvbm_blocks::BlockManager;
use kvbm_blocks::{CacheEvent, EventMessage, EventSubscription};
use kvbm_queue::Scheduler;
use kvbm_queue::{
    Aging, FinishReason, Finished, GenerationReserve, InferenceRequest, Preemption, Priority,
    QueueError, RequestId, SchedulerConfig,
};
use kvbm_sequence::{KvCacheGroups, Salt, block_hash, chain_hash};
use proptest::prelude::*;

use super::scheduler::{Gpu, outputs, scheduler};
use super::{fuzz_cases, kv_groups};

/// Follows the scheduler's cache events as a router would, failing on any
/// that a router could not apply: a gap, a removal of something never
/// stored, a store before its parent, or tokens that do not hash to the
/// blocks they are sent with (Dynamo recomputes hashes from them).
///
/// With KV cache groups each group publishes its own chains, rooted in its
/// own salt, and a window group may register a block whose parent it
/// released and the pool evicted (vLLM's do too): `grouped` checks only the
/// bookkeeping (nothing stored twice, nothing removed that was not stored).
#[derive(Default)]
struct Mirror {
    registered: HashSet<u128>,
    sequence: u64,
    grouped: bool,
}

impl Mirror {
    fn follow(&mut self, events: &EventSubscription) -> Result<(), TestCaseError> {
        prop_assert_eq!(events.missed_batches(), 0, "the channel is roomy");
        for message in events.drain() {
            match message {
                EventMessage::Resync(resync) => {
                    prop_assert_eq!(resync.sequence, 0, "only the first message");
                    self.registered = resync.registered.iter().map(|h| h.value()).collect();
                }
                EventMessage::Batch(batch) => {
                    prop_assert_eq!(batch.sequence(), self.sequence + 1);
                    self.sequence = batch.sequence();
                    for event in batch.events() {
                        self.apply(event)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn apply(&mut self, event: CacheEvent<'_>) -> Result<(), TestCaseError> {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => {
                prop_assert_eq!(tokens.len(), hashes.len() * BS as usize);
                if self.grouped {
                    for &hash in hashes {
                        prop_assert!(self.registered.insert(hash), "{:#x} stored twice", hash);
                    }
                    return Ok(());
                }
                prop_assert!(
                    parent.is_none_or(|p| self.registered.contains(&p)),
                    "{:#x} stored before its parent",
                    hashes[0]
                );
                // Each block's parent is the one before it, the first's the run's.
                let mut previous = parent.unwrap_or(Salt::NONE.get());
                for (&hash, tokens) in hashes.iter().zip(tokens.chunks(BS as usize)) {
                    prop_assert_eq!(hash, chain_hash(previous, block_hash(tokens)));
                    prop_assert!(self.registered.insert(hash), "{:#x} stored twice", hash);
                    previous = hash;
                }
            }
            CacheEvent::Removed { hashes } => {
                for hash in hashes {
                    prop_assert!(self.registered.remove(hash), "{:#x} never stored", hash);
                }
            }
            CacheEvent::Cleared => self.registered.clear(),
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct Arrival {
    step: u32,
    prompt: u32,
    family: u32,
    max_new: u32,
    priority: Priority,
}

fn arrival(pool_tokens: u32) -> impl Strategy<Value = Arrival> {
    let priority = prop_oneof![
        Just(Priority::Low),
        Just(Priority::Normal),
        Just(Priority::High),
        Just(Priority::Critical)
    ];
    (
        0u32..30,
        1..=pool_tokens,
        0u32..3,
        0..=pool_tokens * 2,
        priority,
    )
        .prop_map(|(step, prompt, family, max_new, priority)| Arrival {
            step,
            prompt,
            family,
            max_new,
            priority,
        })
}

#[derive(Clone, Debug)]
struct Workload {
    blocks: usize,
    config: SchedulerConfig,
    arrivals: Vec<Arrival>,
    /// Bit `k % 64` set: the `k`th sampled token of a step stops its request.
    stops: u64,
    /// The model's KV cache groups, if not one full-attention group.
    groups: Option<Arc<KvCacheGroups>>,
}

impl Workload {
    fn scheduler(&self) -> Scheduler<Gpu> {
        let Some(groups) = &self.groups else {
            return scheduler(self.blocks, self.config);
        };
        let manager = BlockManager::builder()
            .block_count(self.blocks)
            .block_size(BS as usize)
            .build()
            .expect("valid pool");
        Scheduler::with_kv_groups(manager, self.config, groups.clone()).expect("valid groups")
    }

    /// Blocks a request of `tokens` tokens needs at most: its whole length
    /// in a full-attention group, its span, a chunk and the tail's block in
    /// a window or chunk group.
    fn need(&self, tokens: u64) -> u64 {
        let full = tokens.div_ceil(u64::from(BS));
        let Some(groups) = &self.groups else {
            return full;
        };
        let chunk = (self.config.chunk_size as u64).div_ceil(u64::from(BS));
        (groups.groups().iter())
            .map(|g| match g.kind().span() {
                None => full,
                Some(span) => full.min((span as u64).div_ceil(u64::from(BS)) + chunk + 1),
            })
            .sum()
    }
}

/// A third of the workloads run a model of several KV cache groups.
fn groups() -> impl Strategy<Value = Option<Arc<KvCacheGroups>>> {
    prop_oneof![
        2 => Just(None),
        1 => kv_groups(BS as usize).prop_map(Some),
    ]
}

/// Block size of the workloads (the shared test scheduler's).
const BS: u32 = super::scheduler::BS as u32;

fn workload() -> impl Strategy<Value = Workload> {
    let reserve = prop_oneof![
        Just(GenerationReserve::Full),
        (0u32..24).prop_map(GenerationReserve::Capped)
    ];
    let preemption = prop_oneof![Just(Preemption::Never), Just(Preemption::ByPriority)];
    let boost = prop_oneof![2 => Just(0u32), 1 => 1u32..5, 1 => Just(u32::MAX)];
    let spec = prop_oneof![2 => Just(0usize), 1 => 1usize..6];
    let limits = (1usize..6, 1usize..40, 1usize..40, 0usize..3, spec);
    (2usize..16, limits, reserve, (preemption, boost), groups())
        .prop_flat_map(
            |(
                blocks,
                (max_running, budget, chunk, watermark, spec),
                reserve,
                (preemption, boost),
                groups,
            )| {
                let config = SchedulerConfig::default()
                    .with_max_running(max_running)
                    .with_token_budget(budget)
                    .with_chunk_size(chunk)
                    .with_watermark_blocks(watermark)
                    .with_reserve(reserve)
                    .with_preemption(preemption)
                    .with_speculative_tokens(spec)
                    .with_preemption_boost(boost);
                let pool_tokens = blocks as u32 * BS;
                (
                    Just(blocks),
                    Just(config),
                    Just(groups),
                    prop::collection::vec(arrival(pool_tokens), 1..10),
                    prop_oneof![Just(0u64), any::<u64>().prop_map(|s| s & s >> 7 & s >> 13)],
                )
            },
        )
        .prop_map(|(blocks, config, groups, arrivals, stops)| Workload {
            blocks,
            config,
            arrivals,
            stops,
            groups,
        })
}

/// Runs the workload until every accepted request finished; `None` for a
/// request refused at submit. Fails if that takes more steps than a generous
/// bound (a livelock), or if admission ever preempts a request for one that
/// is not strictly more urgent.
fn run_to_completion(w: &Workload) -> Result<Vec<Option<Finished>>, TestCaseError> {
    let mut s = w.scheduler();
    let events = s.manager().subscribe_events(4096);
    let mut mirror = Mirror {
        grouped: w.groups.is_some(),
        ..Mirror::default()
    };
    let work: u64 = w
        .arrivals
        .iter()
        .map(|a| u64::from(a.prompt) + u64::from(a.max_new) + 1)
        .sum();
    let max_steps = 40 * work + 1000;
    let mut accepted = vec![false; w.arrivals.len()];
    let mut finished: HashMap<RequestId, Finished> = HashMap::new();
    for step in 0..max_steps {
        for (i, a) in w.arrivals.iter().enumerate() {
            if u64::from(a.step) != step {
                continue;
            }
            let prompt: Vec<u32> = (0..a.prompt)
                .map(|t| {
                    if t < 6 {
                        a.family * 100 + t
                    } else {
                        1000 * i as u32 + t
                    }
                })
                .collect();
            let request = InferenceRequest::new(RequestId(i as u64), prompt, a.max_new)
                .with_priority(a.priority);
            match s.submit(request) {
                Ok(()) => accepted[i] = true,
                Err(rejected) => {
                    prop_assert!(
                        matches!(rejected.error(), QueueError::TooLarge { .. }),
                        "unexpected outcome"
                    );
                }
            }
        }
        let all_arrived = step
            >= w.arrivals
                .iter()
                .map(|a| u64::from(a.step))
                .max()
                .unwrap_or(0);
        if all_arrived && s.is_idle() {
            let census = s.audit().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(census.finished + census.aborted, census.submitted);
            return Ok((0..w.arrivals.len())
                .map(|i| finished.get(&RequestId(i as u64)).copied())
                .collect());
        }
        let running_before: Vec<RequestId> = s.running_ids().collect();
        let by_priority_before = s.census().priority_preemptions;
        let plan = s.step().map_err(|e| TestCaseError::fail(e.to_string()))?;
        if s.census().priority_preemptions > by_priority_before {
            let priority = |id: RequestId| w.arrivals[id.0 as usize].priority;
            // Admitted: new in the plan, as a prefill, or as a decode (a
            // preempted request whose blocks all stayed cached resumes
            // with its next token).
            let admitted = (plan.prefill.iter().map(|p| p.id))
                .chain(plan.decode.iter().map(|d| d.id))
                .filter(|id| !running_before.contains(id));
            let most_urgent = admitted.map(priority).max();
            for &victim in &plan.preempted {
                prop_assert!(
                    most_urgent.is_some_and(|urgent| priority(victim) < urgent),
                    "{victim} ({:?}) preempted for {most_urgent:?}",
                    priority(victim)
                );
            }
        }
        let mut out = outputs(&plan);
        for (k, output) in out.iter_mut().enumerate() {
            output.stop = output.token.is_some() && w.stops >> (k % 64) & 1 == 1;
        }
        // Speculative decodes accept a pseudo-random prefix of their drafts.
        let decodes = out.iter_mut().skip(plan.prefill.len());
        for (k, (output, d)) in decodes.zip(&plan.decode).enumerate() {
            let accepted = (w.stops >> (k % 64)) as usize % (d.draft_tokens + 1);
            output.accepted_drafts = vec![3; accepted];
        }
        let report = s
            .apply(&out)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        mirror.follow(&events)?;
        for done in plan.finished.into_iter().chain(report.finished) {
            prop_assert!(finished.insert(done.id, done).is_none(), "{:?} twice", done);
        }
    }
    Err(TestCaseError::fail(format!(
        "livelock: not idle after {max_steps} steps: {:?}",
        s.census()
    )))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(768)))]

    #[test]
    fn fuzz_every_request_that_fits_finishes(w in workload()) {
        let outcomes = run_to_completion(&w)?;
        for (a, outcome) in w.arrivals.iter().zip(outcomes) {
            let fits = w.need(u64::from(a.prompt) + u64::from(a.max_new)) <= w.blocks as u64;
            match outcome {
                Some(done) if fits => prop_assert!(
                    matches!(done.reason, FinishReason::MaxTokens | FinishReason::Stop),
                    "{a:?} fits the pool but ended {done:?}"
                ),
                Some(done) => prop_assert!(matches!(
                    done.reason,
                    FinishReason::MaxTokens | FinishReason::Stop | FinishReason::CapacityExceeded
                )),
                None => prop_assert!(!fits, "{a:?} fits the pool but was refused"),
            }
            if let Some(done) = outcome
                && done.reason == FinishReason::MaxTokens
            {
                prop_assert_eq!(done.generated_tokens, a.max_new as usize);
            }
        }
    }
}

/// A `Low` request submitted behind one `High` request, while another `High`
/// request arrives every step (more than the pool can serve; step `n` is at
/// `n` ms): the step at which the `Low` one finishes, if it does within
/// `steps`.
fn low_request_under_urgent_stream(aging: Aging, max_running: usize, steps: u64) -> Option<u64> {
    let config = SchedulerConfig::default()
        .with_max_running(max_running)
        .with_reserve(GenerationReserve::Full)
        .with_aging(aging);
    // 8 blocks of 4 tokens; every request costs 3 (8 prompt + 4 generated).
    let mut s = scheduler(8, config);
    let at = |step: u64| std::time::Duration::from_millis(step);
    let urgent = |id: u64, step: u64| {
        let prompt: Vec<u32> = (0..8).map(|t| id as u32 * 10 + t).collect();
        InferenceRequest::new(RequestId(id), prompt, 4)
            .with_priority(Priority::High)
            .with_arrival(at(step))
    };
    s.submit(urgent(1, 0)).unwrap();
    let low = InferenceRequest::new(RequestId(0), vec![9; 8], 4)
        .with_priority(Priority::Low)
        .with_arrival(at(0));
    s.submit(low).unwrap();
    for step in 0..steps {
        s.submit(urgent(step + 2, step)).unwrap();
        let plan = s.step().unwrap();
        let report = s.apply(&outputs(&plan)).unwrap();
        if let Some(done) = report.finished.iter().find(|f| f.id == RequestId(0)) {
            assert_eq!(done.reason, FinishReason::MaxTokens);
            return Some(step);
        }
    }
    None
}

#[test]
fn strict_priority_starves_a_low_request_under_an_urgent_stream() {
    assert_eq!(low_request_under_urgent_stream(Aging::Strict, 2, 500), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(64)))]

    /// `Aging::Window(w)`: a `Low` request is overtaken by at most `2w` later
    /// `High` arrivals, each of which runs 5 steps (prefill and 4 decodes),
    /// so it finishes within `5 (2w + 2) + 5` steps, however long the stream.
    #[test]
    fn fuzz_aging_bounds_how_long_a_low_request_waits(w in 0u64..24, max_running in 1usize..4) {
        let bound = 5 * (2 * w + 2) + 5;
        let finished = low_request_under_urgent_stream(Aging::Window(w), max_running, 10 * bound);
        prop_assert!(
            finished.is_some_and(|step| step <= bound),
            "finished at {finished:?}, bound {bound}"
        );
    }

    /// `Aging::Timed`, one priority step per `w` ms of waiting, one `High`
    /// arrival per ms: the `Low` request (two steps below `High`) is
    /// overtaken only by the `High` requests arriving less than `2w` ms
    /// after it, at most `2w + 1` of them, so the same bound holds.
    #[test]
    fn fuzz_timed_aging_bounds_how_long_a_low_request_waits(w in 0u64..24, max_running in 1usize..4) {
        let bound = 5 * (2 * w + 3) + 5;
        let aging = Aging::Timed { step: std::time::Duration::from_millis(w) };
        let finished = low_request_under_urgent_stream(aging, max_running, 10 * bound);
        prop_assert!(
            finished.is_some_and(|step| step <= bound),
            "finished at {finished:?}, bound {bound}"
        );
    }
}
