//! The `Scheduler` with several KV cache groups: a window group releases
//! what its layers read no more, the engine's per-group tables follow the
//! plans' updates exactly, a prefix hit counts as far as every group serves
//! it, admission charges each group's need, and bad groups are refused.

use std::sync::Arc;

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_queue::{
    FinishReason, GroupBlocks, InferenceRequest, RequestId, Scheduler, SchedulerConfig,
    SchedulerError, StepPlan, StepReport,
};
use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};

use super::scheduler::{BS, Gpu, outputs};

const WINDOW: usize = 8; // two blocks

fn pool(blocks: usize) -> BlockManager<Gpu> {
    BlockManager::builder()
        .block_count(blocks)
        .block_size(BS)
        .build()
        .expect("valid pool")
}

/// gpt-oss's shape in small: full-attention layers and sliding-window ones.
pub(super) fn full_and_window() -> Arc<KvCacheGroups> {
    Arc::new(
        KvCacheGroups::new(
            BS,
            vec![
                KvCacheGroup::new(AttentionKind::Full, 2),
                KvCacheGroup::new(AttentionKind::SlidingWindow { window: WINDOW }, 2),
            ],
        )
        .expect("valid groups"),
    )
}

fn scheduler(blocks: usize, config: SchedulerConfig) -> Scheduler<Gpu> {
    Scheduler::with_kv_groups(pool(blocks), config, full_and_window()).expect("valid")
}

/// Submits request 1: tokens 0..40 (ten blocks), up to `max_new` more.
fn submit_forty_tokens(s: &mut Scheduler<Gpu>, max_new: u32) {
    let prompt: Vec<u32> = (0..40).collect();
    s.submit(InferenceRequest::new(RequestId(1), prompt, max_new))
        .unwrap();
}

/// An engine's view of one request's table in each group, kept only from
/// the plans' updates.
#[derive(Default)]
struct EngineTables(std::collections::HashMap<RequestId, Vec<(usize, Vec<BlockId>)>>);

impl EngineTables {
    fn follow(&mut self, plan: &StepPlan) {
        let works = (plan.prefill.iter().map(|p| (p.id, p.resumed, &p.groups)))
            .chain(plan.decode.iter().map(|d| (d.id, d.resumed, &d.groups)));
        for (id, resumed, groups) in works {
            let tables = self.0.entry(id).or_default();
            if resumed {
                tables.clear();
            }
            if groups.is_empty() {
                // No group's table changed this step.
                assert!(!resumed, "a fresh table lists every group");
                continue;
            }
            tables.resize_with(groups.len(), Default::default);
            for (table, update) in tables.iter_mut().zip(groups) {
                let GroupBlocks {
                    first_block,
                    new_blocks,
                    ..
                } = update;
                if resumed {
                    table.0 = *first_block;
                }
                table.1.extend(new_blocks);
            }
        }
        for id in plan
            .preempted
            .iter()
            .chain(plan.finished.iter().map(|f| &f.id))
        {
            self.0.remove(id);
        }
    }

    /// Drops the blocks a speculative apply gave back from the end of
    /// each group's table, checking they are the ones there.
    fn roll_back(&mut self, report: &StepReport) {
        for rolled in &report.rolled_back {
            let tables = self.0.get_mut(&rolled.id).expect("known");
            assert_eq!(rolled.groups.len(), tables.len(), "every group");
            assert_eq!(rolled.groups[0], rolled.blocks);
            for (table, given) in tables.iter_mut().zip(&rolled.groups) {
                for block in given {
                    assert_eq!(table.1.pop(), Some(*block), "the tail, last first");
                }
            }
        }
    }

    /// The engine's table from `first` on, as the scheduler's: entries
    /// before the group's first held one are stale but never read.
    fn agrees(&self, s: &Scheduler<Gpu>, id: RequestId, groups: usize) {
        let tables = &self.0[&id];
        for (group, (_, blocks)) in tables.iter().enumerate().take(groups) {
            let (first, held) = s.group_block_table(id, group).expect("running");
            let engine_first = tables[group].0;
            assert!(
                engine_first <= first,
                "group {group}: the engine's table starts past ours"
            );
            let from = first - engine_first;
            assert_eq!(&blocks[from..], &held[..], "group {group} of {id}");
        }
    }
}

/// Every token of the pending step has its slot, in each group, in the
/// block its position falls in in that group's table.
fn slots_are_in_each_groups_table(s: &Scheduler<Gpu>, plan: &StepPlan) {
    for group in 0..2 {
        let mut slots = Vec::new();
        s.group_slot_mapping(plan, group, &mut slots).unwrap();
        let mut slots = slots.into_iter();
        for p in &plan.prefill {
            let (first, table) = s.group_block_table(p.id, group).unwrap();
            for position in p.start..p.start + p.num_tokens {
                let slot = slots.next().expect("a slot per token");
                let block = table[position / BS - first];
                assert_eq!(
                    slot,
                    u64::from(block.get()) * BS as u64 + (position % BS) as u64
                );
            }
        }
        for d in &plan.decode {
            let (first, table) = s.group_block_table(d.id, group).unwrap();
            // The tail token's slot, then each draft's.
            for position in d.position..=d.position + d.draft_tokens {
                let slot = slots.next().expect("a slot per token");
                let block = table[position / BS - first];
                assert_eq!(
                    slot,
                    u64::from(block.get()) * BS as u64 + (position % BS) as u64
                );
            }
        }
        assert!(slots.next().is_none());
    }
    let mut none = Vec::new();
    s.group_slot_mapping(plan, 9, &mut none).unwrap();
    assert!(none.iter().all(|&slot| slot == kvbm_queue::PAD_SLOT));
}

#[test]
fn a_window_group_holds_its_window_and_the_engine_tables_follow() {
    let mut s = scheduler(64, SchedulerConfig::default().with_chunk_size(8));
    submit_forty_tokens(&mut s, 12);
    let mut engine = EngineTables::default();
    let mut most_window_blocks = 0;
    for _ in 0..40 {
        let plan = s.step().unwrap();
        engine.follow(&plan);
        for p in &plan.prefill {
            assert_eq!(p.groups.len(), 2);
            assert_eq!(p.groups[0].new_blocks, p.new_blocks);
            assert_eq!(
                p.groups[0].first_block, 0,
                "full attention releases nothing"
            );
        }
        slots_are_in_each_groups_table(&s, &plan);
        let report = s.apply(&outputs(&plan)).unwrap();
        s.audit().expect("conservation");
        if let Some(id) = s.running_ids().next() {
            engine.agrees(&s, id, 2);
            let held = s.held_blocks_by_group();
            most_window_blocks = most_window_blocks.max(held[1]);
            // The window reads 7 tokens back: 2 blocks and the tail's.
            assert!(held[1] <= WINDOW / BS + 1, "{held:?}");
        }
        if let Some(done) = report.finished.first() {
            assert_eq!(done.reason, FinishReason::MaxTokens);
            assert_eq!(done.generated_tokens, 12);
            assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
            assert!(most_window_blocks >= 2);
            return;
        }
    }
    panic!("did not finish");
}

#[test]
fn a_window_released_at_registration_sends_no_fresh_table() {
    // A lone request has nothing to deduplicate against: only its first
    // entry starts a table, however many blocks its window released while
    // they were registered (the whole prompt in one chunk, then decodes).
    let mut s = scheduler(64, SchedulerConfig::default());
    submit_forty_tokens(&mut s, 12);
    let mut engine = EngineTables::default();
    let mut fresh_tables = Vec::new();
    while !s.is_idle() {
        let plan = s.step().unwrap();
        let entries =
            (plan.prefill.iter().map(|p| p.resumed)).chain(plan.decode.iter().map(|d| d.resumed));
        fresh_tables.extend(entries);
        engine.follow(&plan);
        if let Some(id) = s.running_ids().next() {
            engine.agrees(&s, id, 2);
        }
        s.apply(&outputs(&plan)).unwrap();
    }
    assert_eq!(fresh_tables.len(), 12, "one prefill and 11 decodes");
    assert_eq!(fresh_tables.iter().filter(|&&fresh| fresh).count(), 1);
    assert!(fresh_tables[0]);
}

#[test]
fn a_prefix_hit_counts_as_far_as_every_group_serves_it() {
    let mut s = scheduler(64, SchedulerConfig::default());
    submit_forty_tokens(&mut s, 1);
    while !s.is_idle() {
        let plan = s.step().unwrap();
        s.apply(&outputs(&plan)).unwrap();
    }
    // The window group released blocks 0..8 into the cache: still there,
    // so the same prompt skips all but its last block in both groups.
    s.submit(InferenceRequest::new(
        RequestId(2),
        (0..40).collect::<Vec<u32>>(),
        1,
    ))
    .unwrap();
    let before = s.census().prefix_hit_tokens;
    let plan = s.step().unwrap();
    assert_eq!(s.census().prefix_hit_tokens - before, 36);
    assert_eq!(plan.prefill[0].start, 36);
    // The window group took only the two blocks its window reads.
    let (first, held) = s.group_block_table(RequestId(2), 1).unwrap();
    assert_eq!((first, held.len()), (7, 3)); // blocks 7, 8 and the new 9
    s.apply(&outputs(&plan)).unwrap();
    s.audit().unwrap();
}

#[test]
fn a_window_group_needs_fewer_blocks_than_full_attention() {
    // Three 24-token prompts generating 8 tokens each in 20 blocks. Two
    // full-attention groups need 8 blocks each per request (16); a
    // full and a window group 8 + 3, so requests preempt each other less
    // and the same work takes fewer steps.
    let config = SchedulerConfig::default().with_chunk_size(4);
    let all_full = Arc::new(
        KvCacheGroups::new(BS, vec![KvCacheGroup::new(AttentionKind::Full, 2); 2]).unwrap(),
    );
    let mut runs = Vec::new();
    for groups in [full_and_window(), all_full] {
        let mut s = Scheduler::with_kv_groups(pool(20), config, groups).unwrap();
        for id in 0..3u32 {
            let prompt: Vec<u32> = (0..24).map(|t| 100 * id + t).collect();
            s.submit(InferenceRequest::new(RequestId(id.into()), prompt, 8))
                .unwrap();
        }
        let mut steps = 0;
        let mut most_held = 0;
        while !s.is_idle() {
            let plan = s.step().unwrap();
            s.apply(&outputs(&plan)).unwrap();
            s.audit().unwrap();
            steps += 1;
            most_held = most_held.max(s.held_blocks_by_group().iter().sum::<usize>());
        }
        assert_eq!(s.census().finished, 3);
        runs.push((steps, s.census().preemptions, most_held));
    }
    let (grouped, full) = (runs[0], runs[1]);
    assert!(
        grouped.0 < full.0,
        "steps: grouped {grouped:?} vs all-full {full:?}"
    );
    assert!(
        grouped.1 <= full.1,
        "preemptions: grouped {grouped:?} vs all-full {full:?}"
    );
}

#[test]
fn a_request_whose_windows_alone_exceed_the_pool_ends_at_admission() {
    let groups = Arc::new(
        KvCacheGroups::new(
            BS,
            vec![KvCacheGroup::new(
                AttentionKind::SlidingWindow { window: 64 },
                1,
            )],
        )
        .unwrap(),
    );
    let mut s = Scheduler::with_kv_groups(pool(8), SchedulerConfig::default(), groups).unwrap();
    // 100 tokens need 16 window blocks, one chunk's and the tail's: never 8.
    s.submit(InferenceRequest::new(
        RequestId(1),
        (0..100).collect::<Vec<u32>>(),
        4,
    ))
    .unwrap();
    // A short one in the same model fits.
    s.submit(InferenceRequest::new(
        RequestId(2),
        (0..8).collect::<Vec<u32>>(),
        2,
    ))
    .unwrap();
    let plan = s.step().unwrap();
    assert_eq!(plan.finished.len(), 1);
    assert_eq!(plan.finished[0].id, RequestId(1));
    assert_eq!(plan.finished[0].reason, FinishReason::CapacityExceeded);
    s.apply(&outputs(&plan)).unwrap();
    while !s.is_idle() {
        let plan = s.step().unwrap();
        s.apply(&outputs(&plan)).unwrap();
    }
    assert_eq!(s.census().finished, 1);
    s.audit().unwrap();
}

#[test]
fn speculative_steps_roll_back_every_groups_tail_and_the_engine_tables_follow() {
    // Four drafts a step, of which the engine accepts 0 to 4 in turn: each
    // rejection gives back the same tail blocks in every group, and the
    // engine's tables, following plans and rollbacks, stay the scheduler's.
    let config = SchedulerConfig::default()
        .with_chunk_size(8)
        .with_speculative_tokens(4);
    let mut s = scheduler(64, config);
    submit_forty_tokens(&mut s, 30);
    let mut engine = EngineTables::default();
    let (mut rolled_back, mut accepted) = (0, 0);
    for step in 0..100usize {
        let plan = s.step().unwrap();
        engine.follow(&plan);
        slots_are_in_each_groups_table(&s, &plan);
        let mut outputs = outputs(&plan);
        for (output, d) in (outputs.iter_mut().skip(plan.prefill.len())).zip(&plan.decode) {
            let take = step % (d.draft_tokens + 1);
            output.accepted_drafts = (0..take as u32).map(|t| 3000 + t).collect();
            accepted += take;
        }
        let report = s.apply(&outputs).unwrap();
        s.audit().expect("conservation");
        engine.roll_back(&report);
        rolled_back += report.rolled_back.len();
        if let Some(id) = s.running_ids().next() {
            engine.agrees(&s, id, 2);
            let held = s.held_blocks_by_group();
            // The window reads 7 tokens back, and drafts reach 4 further.
            assert!(held[1] <= (WINDOW + 4) / BS + 2, "{held:?}");
        }
        if let Some(done) = report.finished.first() {
            assert_eq!(done.generated_tokens, 30);
            assert_eq!(s.manager().audit().unwrap().in_use_blocks(), 0);
            assert!(rolled_back > 0 && accepted > 0, "{rolled_back} {accepted}");
            assert_eq!(s.census().spec_accepted_tokens, accepted as u64);
            return;
        }
    }
    panic!("did not finish");
}

#[test]
fn bad_groups_are_refused() {
    let other_size = Arc::new(KvCacheGroups::full_attention(16, 2).unwrap());
    let refused = Scheduler::with_kv_groups(pool(8), SchedulerConfig::default(), other_size);
    assert!(matches!(refused, Err(SchedulerError::InvalidGroups { .. })));
    let spec = SchedulerConfig::default().with_speculative_tokens(2);
    // One full-attention group is the plain scheduler, drafts and all.
    let one = Arc::new(KvCacheGroups::full_attention(BS, 2).unwrap());
    let s = Scheduler::with_kv_groups(pool(8), spec, one).unwrap();
    assert!(s.kv_groups().is_none());
    assert_eq!(s.held_blocks_by_group(), vec![0]);
}

#[test]
fn a_reused_plan_with_groups_is_the_plan_step_returns() {
    // Two grouped schedulers fed the same requests, one planning into a
    // plan it keeps (its block lists reused from step to step), one with
    // fresh plans: every step plans the same, tables, preemptions and all,
    // and the engine's tables follow the reused plan's updates.
    let config = SchedulerConfig::default().with_chunk_size(4);
    let submit = |s: &mut Scheduler<Gpu>| {
        for id in 0..3u32 {
            let prompt: Vec<u32> = (0..24).map(|t| 100 * id + t).collect();
            s.submit(InferenceRequest::new(RequestId(id.into()), prompt, 24))
                .unwrap();
        }
    };
    let mut fresh = scheduler(20, config);
    let mut reused = scheduler(20, config);
    submit(&mut fresh);
    submit(&mut reused);
    let mut plan = StepPlan::default();
    let mut engine = EngineTables::default();
    let mut held = vec![7; 5];
    let (mut preempted, mut resumed, mut planned, mut unchanged) = (0, 0, 0, 0);
    while !fresh.is_idle() {
        let expected = fresh.step().unwrap();
        reused.step_into(&mut plan).unwrap();
        assert_eq!(plan, expected);
        let prefills = plan.prefill.iter();
        let decodes = plan.decode.iter();
        let works = (prefills.map(|p| (p.resumed, &p.new_blocks, &p.groups)))
            .chain(decodes.map(|d| (d.resumed, &d.new_blocks, &d.groups)));
        for (fresh_table, new_blocks, groups) in works {
            // Every group or none: none exactly when no table changes.
            match groups.first() {
                Some(first) => {
                    assert_eq!(groups.len(), 2);
                    assert_eq!(&first.new_blocks, new_blocks);
                    assert!(fresh_table || !new_blocks.is_empty());
                }
                None => {
                    assert!(!fresh_table && new_blocks.is_empty());
                    unchanged += 1;
                }
            }
            resumed += usize::from(fresh_table);
        }
        planned += plan.prefill.len() + plan.decode.len();
        preempted += plan.preempted.len();
        engine.follow(&plan);
        reused.held_blocks_by_group_into(&mut held);
        assert_eq!(held, reused.held_blocks_by_group());
        assert_eq!(held.len(), 2);
        fresh.apply(&outputs(&expected)).unwrap();
        reused.apply(&outputs(&plan)).unwrap();
        reused.audit().unwrap();
        let ids: Vec<RequestId> = reused.running_ids().collect();
        for id in ids {
            engine.agrees(&reused, id, 2);
        }
    }
    assert!(reused.is_idle());
    assert_eq!(reused.census().finished, 3);
    assert!(planned > 10, "{planned} entries planned");
    assert!(preempted > 0, "the scenario preempts");
    assert!(resumed > 3, "preempted requests resume with whole tables");
    assert!(unchanged > 0, "decodes within a block list no group");
}
