//! `GroupedSequence` against a reference of attention: for every layer
//! kind, the KV a token reads is held by its group's page table, the blocks
//! nothing reads any more are released (exactly those), every group moves in
//! lock-step, refusals change nothing, and the pool's census adds up; and a
//! driver that preempts when the pool runs dry finishes every request.

use std::sync::Arc;

use kvbm_blocks::BlockManager;
use kvbm_schedule::{GroupedSequence, SequenceState};
use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};
use proptest::prelude::*;

use crate::{BLOCK_SIZE, Gpu, audit, manager};

/// Whether a token at `position` reads the KV of token `source`: the
/// reference, written from the definitions, not from the crate's rules.
fn reads(kind: AttentionKind, position: usize, source: usize) -> bool {
    match kind {
        AttentionKind::Full => source <= position,
        AttentionKind::SlidingWindow { window } => source <= position && position - source < window,
        AttentionKind::ChunkedLocal { chunk } => {
            source <= position && source / chunk == position / chunk
        }
        _ => unreachable!("a kind this test does not know"),
    }
}

fn kind() -> impl Strategy<Value = AttentionKind> {
    prop_oneof![
        Just(AttentionKind::Full),
        (1..5usize).prop_map(|w| AttentionKind::SlidingWindow {
            window: w * BLOCK_SIZE
        }),
        (1..5usize).prop_map(|c| AttentionKind::ChunkedLocal {
            chunk: c * BLOCK_SIZE
        }),
    ]
}

fn groups() -> impl Strategy<Value = Arc<KvCacheGroups>> {
    prop::collection::vec(kind(), 1..4).prop_map(|kinds| {
        let groups = kinds.into_iter().map(|k| KvCacheGroup::new(k, 2)).collect();
        Arc::new(KvCacheGroups::new(BLOCK_SIZE, groups).expect("valid groups"))
    })
}

/// Prompts that share prefixes: a common stem cut at different lengths,
/// then a few tokens of their own.
fn prompts() -> impl Strategy<Value = Vec<(Vec<u32>, usize)>> {
    prop::collection::vec((0..40usize, 0..6usize, 0..10usize), 1..5).prop_map(|shapes| {
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, (stem, own, max_output))| {
                let mut prompt: Vec<u32> = (0..stem as u32).collect();
                prompt.extend((0..own as u32).map(|t| 1000 * (i as u32 + 1) + t));
                if prompt.is_empty() {
                    prompt.push(7);
                }
                (prompt, max_output)
            })
            .collect()
    })
}

/// Groups whose windows and chunks reach past the first run a prefix
/// match looks up at once (8 blocks), and long prompts sharing stems, so
/// that matches look up several runs per group.
fn long_groups() -> impl Strategy<Value = Arc<KvCacheGroups>> {
    let kind = prop_oneof![
        Just(AttentionKind::Full),
        (1..13usize).prop_map(|w| AttentionKind::SlidingWindow {
            window: w * BLOCK_SIZE
        }),
        (1..13usize).prop_map(|c| AttentionKind::ChunkedLocal {
            chunk: c * BLOCK_SIZE
        }),
    ];
    prop::collection::vec(kind, 1..4).prop_map(|kinds| {
        let groups = kinds.into_iter().map(|k| KvCacheGroup::new(k, 2)).collect();
        Arc::new(KvCacheGroups::new(BLOCK_SIZE, groups).expect("valid groups"))
    })
}

fn long_prompts() -> impl Strategy<Value = Vec<(Vec<u32>, usize)>> {
    prop::collection::vec((0..200usize, 0..6usize, 0..40usize), 1..5).prop_map(|shapes| {
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, (stem, own, max_output))| {
                let mut prompt: Vec<u32> = (0..stem as u32).collect();
                prompt.extend((0..own as u32).map(|t| 1000 * (i as u32 + 1) + t));
                prompt.push(7);
                (prompt, max_output)
            })
            .collect()
    })
}

#[derive(Clone, Debug)]
enum Op {
    Match(usize),
    Prefill(usize, usize),
    Decode(usize),
    /// A speculative step verifying some drafts, of which the apply
    /// accepts some (the second number, modulo what was scheduled + 1).
    Speculate(usize, usize),
    Apply(usize, usize),
    Revert(usize),
    Preempt(usize),
    Restart(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..4usize;
    prop_oneof![
        2 => r.clone().prop_map(Op::Match),
        4 => (r.clone(), 1..20usize).prop_map(|(r, n)| Op::Prefill(r, n)),
        4 => r.clone().prop_map(Op::Decode),
        2 => (r.clone(), 1..12usize).prop_map(|(r, n)| Op::Speculate(r, n)),
        6 => (r.clone(), 0..16usize).prop_map(|(r, n)| Op::Apply(r, n)),
        1 => r.clone().prop_map(Op::Revert),
        1 => r.clone().prop_map(Op::Preempt),
        1 => r.prop_map(Op::Restart),
    ]
}

/// Runs one operation; refusals are fine, the checks that follow decide.
fn run(
    op: &Op,
    seqs: &mut [GroupedSequence<Gpu>],
    prompts: &[(Vec<u32>, usize)],
    groups: &Arc<KvCacheGroups>,
    pool: &BlockManager<Gpu>,
) {
    let pick = |r: usize| r % seqs.len();
    match *op {
        Op::Match(r) => {
            let _ = seqs[pick(r)].match_and_add_prefix(pool);
        }
        Op::Prefill(r, n) => {
            let seq = &mut seqs[pick(r)];
            let n = n.min(seq.remaining_prefill_tokens());
            let _ = seq.schedule_prefill(n, pool);
        }
        Op::Decode(r) => {
            let _ = seqs[pick(r)].schedule_decode(pool);
        }
        Op::Speculate(r, drafts) => {
            let _ = seqs[pick(r)].schedule_speculative(drafts, pool);
        }
        Op::Apply(r, accept) => {
            let seq = &mut seqs[pick(r)];
            let next = 500 + seq.tokens().len() as u32;
            match seq.state() {
                SequenceState::SpeculativeScheduled { num_tokens, .. } => {
                    // A prefix of the drafts (the last maybe the token sampled
                    // after them), at most as many as were scheduled.
                    let accepted: Vec<u32> = (0..accept % (num_tokens + 1))
                        .map(|i| next + i as u32)
                        .collect();
                    seq.apply_speculative(&accepted, pool)
                        .expect("a scheduled speculative step applies");
                }
                SequenceState::PrefillScheduled { .. } => apply_prefill(seq, next, pool),
                SequenceState::DecodeScheduled { .. } => {
                    seq.apply_decode(next, pool)
                        .expect("a scheduled decode applies");
                }
                _ => {}
            }
        }
        Op::Revert(r) => {
            let _ = seqs[pick(r)].revert_schedule();
        }
        Op::Preempt(r) => {
            let _ = seqs[pick(r)].release();
        }
        Op::Restart(r) => {
            let r = pick(r);
            let (prompt, max_output) = &prompts[r];
            seqs[r] =
                GroupedSequence::new(prompt.clone(), *max_output, groups.clone()).expect("valid");
        }
    }
}

/// Applies the scheduled prefill chunk with or without a token, whichever
/// it calls for: the wrong one is refused and must change nothing.
fn apply_prefill(seq: &mut GroupedSequence<Gpu>, next: u32, pool: &BlockManager<Gpu>) {
    let before = (seq.kv_position(), seq.held_blocks(), seq.tokens().to_vec());
    if seq.apply_prefill(None, pool).is_err() {
        assert_eq!(
            (seq.kv_position(), seq.held_blocks(), seq.tokens().to_vec()),
            before,
            "a refused apply changed something"
        );
        seq.apply_prefill(Some(next), pool)
            .expect("one of the two is right");
    }
}

fn check(seqs: &[GroupedSequence<Gpu>], pool: &BlockManager<Gpu>) -> Result<(), TestCaseError> {
    let census = audit(pool);
    let mut held = 0;
    for seq in seqs {
        let kv = seq.kv_position();
        prop_assert!(kv <= seq.total_tokens());
        for (g, group) in seq.groups().groups().iter().enumerate() {
            let member = seq.group(g).expect("one sequence per group");
            let inner = member.inner();
            // Lock-step: the same position, tokens and state in every group.
            prop_assert_eq!(member.kv_position(), kv);
            prop_assert_eq!(member.tokens(), seq.tokens());
            prop_assert_eq!(member.state(), seq.state());
            prop_assert!(inner.assignments().is_consistent_with(inner.sequence()));
            // Exactly the blocks nothing reads any more are released.
            let kind = group.kind();
            let skipped = inner.skipped_blocks();
            prop_assert_eq!(
                skipped,
                kind.first_needed_block(kv, BLOCK_SIZE),
                "group {} ({})",
                g,
                kind
            );
            // Every token the next one reads is in a block the table holds.
            let covered = skipped + inner.held_blocks();
            for source in (0..kv).filter(|&s| reads(kind, kv, s)) {
                let block = source / BLOCK_SIZE;
                prop_assert!(
                    (skipped..covered).contains(&block),
                    "group {} ({}): token {} reads {} in block {}, table {}..{}",
                    g,
                    kind,
                    kv,
                    source,
                    block,
                    skipped,
                    covered
                );
            }
        }
        held += seq.held_blocks();
    }
    // Shared blocks count once in the pool, once per holder here.
    prop_assert!(census.in_use_blocks() <= held, "{census:?} vs {held} held");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases(256)))]

    #[test]
    fn groups_hold_what_attention_reads(
        groups in groups(),
        prompts in prompts(),
        pool_blocks in 8..64usize,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let pool = manager(pool_blocks);
        let mut seqs: Vec<GroupedSequence<Gpu>> = prompts
            .iter()
            .map(|(p, m)| GroupedSequence::new(p.clone(), *m, groups.clone()).expect("valid"))
            .collect();
        for op in &ops {
            run(op, &mut seqs, &prompts, &groups, &pool);
            check(&seqs, &pool)?;
        }
        drop(seqs);
        prop_assert_eq!(audit(&pool).in_use_blocks(), 0);
    }

    /// A prefix match, which looks blocks up lazily (a run at a time, only
    /// where a group's rule needs them), takes exactly the longest hit every
    /// group serves according to a scan of each group's whole prompt,
    /// whatever the workload cached, released and evicted before.
    #[test]
    fn a_match_takes_the_longest_hit_a_full_scan_finds(
        groups in long_groups(),
        prompts in long_prompts(),
        pool_blocks in 16..160usize,
        ops in prop::collection::vec(op(), 1..120),
        extra in 0..3usize,
    ) {
        let pool = manager(pool_blocks);
        let mut seqs: Vec<GroupedSequence<Gpu>> = prompts
            .iter()
            .map(|(p, m)| GroupedSequence::new(p.clone(), *m, groups.clone()).expect("valid"))
            .collect();
        for op in &ops {
            let op = match *op {
                // Long prompts: chunks long enough to get somewhere.
                Op::Prefill(r, n) => Op::Prefill(r, n * 8),
                ref other => other.clone(),
            };
            run(&op, &mut seqs, &prompts, &groups, &pool);
        }
        for (prompt, max_output) in &prompts {
            let mut prompt = prompt.clone();
            prompt.extend((0..extra as u32).map(|t| 5000 + t));
            let mut fresh =
                GroupedSequence::new(prompt, *max_output, groups.clone()).expect("valid");
            let cap = (fresh.total_tokens() - 1) / BLOCK_SIZE;
            let scans: Vec<Vec<bool>> = (0..groups.len())
                .map(|g| {
                    let hashes = fresh.group(g).expect("a group").inner().sequence().sequence_hashes();
                    pool.scan_matches(&hashes[..cap])
                })
                .collect();
            let views: Vec<&[bool]> = scans.iter().map(Vec::as_slice).collect();
            let expected = groups.longest_common_hit(cap, &views);
            prop_assert_eq!(fresh.match_and_add_prefix(&pool).expect("idle"), expected);
            prop_assert_eq!(fresh.kv_position(), expected * BLOCK_SIZE);
            seqs.push(fresh);
            check(&seqs, &pool)?;
            seqs.pop().expect("just pushed").release().expect("idle");
        }
        drop(seqs);
        prop_assert_eq!(audit(&pool).in_use_blocks(), 0);
    }

    /// A first-come-first-served driver that preempts the newest running
    /// request when a step cannot allocate finishes every request, when the
    /// pool fits any one of them alone.
    #[test]
    fn every_request_that_fits_finishes(
        groups in groups(),
        prompts in prompts(),
        chunk in 1..12usize,
        spare in 0..8usize,
    ) {
        let fits_alone = prompts
            .iter()
            .map(|(p, m)| (p.len() + m).div_ceil(BLOCK_SIZE) + 1)
            .max()
            .unwrap_or(1)
            * groups.len();
        let pool = manager(fits_alone + spare);
        let mut seqs: Vec<GroupedSequence<Gpu>> = prompts
            .iter()
            .map(|(p, m)| GroupedSequence::new(p.clone(), *m, groups.clone()).expect("valid"))
            .collect();
        let mut finished = vec![false; seqs.len()];
        let mut steps = 0;
        while finished.iter().any(|f| !f) {
            steps += 1;
            prop_assert!(steps < 10_000, "no progress: {seqs:?}");
            for r in 0..seqs.len() {
                if finished[r] {
                    continue;
                }
                if seqs[r].held_blocks() == 0 && seqs[r].kv_position() == 0 {
                    seqs[r].match_and_add_prefix(&pool).expect("idle");
                }
                // Earlier requests come first: while the step cannot
                // allocate, preempt the last request after this one that
                // holds blocks, then retry; with none left, wait.
                let scheduled = loop {
                    let seq = &mut seqs[r];
                    let attempt = if seq.is_prefill_complete() {
                        seq.schedule_decode(&pool)
                    } else {
                        seq.schedule_prefill(chunk.min(seq.remaining_prefill_tokens()), &pool)
                    };
                    if attempt.is_ok() {
                        break true;
                    }
                    match (r + 1..seqs.len()).rev().find(|&v| seqs[v].held_blocks() > 0) {
                        Some(victim) => seqs[victim].release().expect("idle"),
                        None => break false,
                    }
                };
                let seq = &mut seqs[r];
                if !scheduled {
                    seq.release().expect("idle");
                    continue;
                }
                let next = 900 + seq.tokens().len() as u32;
                if let SequenceState::PrefillScheduled { .. } = seq.state() {
                    apply_prefill(seq, next, &pool);
                } else {
                    seq.apply_decode(next, &pool).expect("scheduled");
                }
                if seq.is_complete() && seq.is_prefill_complete() {
                    finished[r] = true;
                    seq.release().expect("idle");
                }
            }
            check(&seqs, &pool)?;
        }
        prop_assert_eq!(audit(&pool).in_use_blocks(), 0);
    }
}

/// The first group's decode checks stand for all; a later group that
/// cannot allocate its block still undoes the first group's schedule, and
/// the decode runs once the pool has room.
#[test]
fn a_decode_a_later_group_cannot_allocate_leaves_every_group_idle() {
    let groups = Arc::new(
        KvCacheGroups::new(
            BLOCK_SIZE,
            vec![
                KvCacheGroup::new(AttentionKind::Full, 1),
                KvCacheGroup::new(
                    AttentionKind::SlidingWindow {
                        window: 2 * BLOCK_SIZE,
                    },
                    1,
                ),
            ],
        )
        .expect("valid groups"),
    );
    // Two blocks of prompt per group, and room for one decode block.
    let pool = manager(5);
    let prompt: Vec<u32> = (0..2 * BLOCK_SIZE as u32).collect();
    let mut seq = GroupedSequence::<Gpu>::new(prompt, 4, groups).expect("valid");
    seq.schedule_prefill(2 * BLOCK_SIZE, &pool).expect("fits");
    seq.apply_prefill(Some(100), &pool).expect("scheduled");
    assert_eq!(seq.held_blocks(), 4);

    let refused = seq.schedule_decode(&pool);
    assert!(refused.is_err(), "the window group finds no block");
    for g in 0..2 {
        let group = seq.group(g).expect("a group");
        assert_eq!(group.state(), SequenceState::Idle);
        assert_eq!(group.held_blocks(), 2);
    }
    assert_eq!(pool.available_blocks(), 1);

    // In a pool with room for both blocks the same request decodes.
    seq.release().expect("idle");
    let pool = manager(6);
    seq.reacquire(&pool).expect("idle");
    seq.schedule_prefill(seq.remaining_prefill_tokens(), &pool)
        .expect("fits");
    seq.apply_prefill(None, &pool).expect("scheduled");
    seq.schedule_decode(&pool).expect("room for both groups");
    seq.apply_decode(101, &pool).expect("scheduled");
    assert_eq!(seq.kv_position(), 2 * BLOCK_SIZE + 1);
    assert!((0..2).all(|g| seq.group(g).expect("a group").kv_position() == seq.kv_position()));
}

/// One request of a [`Full`, `last`] model driven the way a
/// `GroupedSequence` drove its groups before the last group released its
/// unread blocks at registration: every group schedules and applies, then
/// the window group releases what it reads no more. The reference of
/// `a_last_window_group_releasing_at_registration_matches_releasing_after`.
///
/// [`Full`]: AttentionKind::Full
struct Unfused {
    groups: Vec<kvbm_schedule::SchedulableSequence<Gpu>>,
    last: AttentionKind,
}

impl Unfused {
    fn new(prompt: &[u32], max_output: usize, last: AttentionKind) -> Self {
        let groups = (0..2)
            .map(|g| {
                kvbm_schedule::SchedulableSequence::builder(prompt.to_vec(), max_output, BLOCK_SIZE)
                    .salt(kvbm_sequence::Salt::NONE.for_group(g))
                    .build()
                    .expect("valid")
            })
            .collect();
        Self { groups, last }
    }

    fn schedule(
        &mut self,
        mut step: impl FnMut(&mut kvbm_schedule::SchedulableSequence<Gpu>) -> bool,
    ) {
        if step(&mut self.groups[0]) && !step(&mut self.groups[1]) {
            self.groups[0].revert_schedule().expect("just scheduled");
        }
    }

    fn apply(&mut self, next: u32, pool: &BlockManager<Gpu>) {
        for seq in &mut self.groups {
            match seq.state() {
                SequenceState::PrefillScheduled { .. } => {
                    if seq.apply_prefill(None, pool).is_err() {
                        seq.apply_prefill(Some(next), pool).expect("one is right");
                    }
                }
                SequenceState::DecodeScheduled { .. } => {
                    seq.apply_decode(next, pool).expect("scheduled");
                }
                _ => return,
            }
        }
        self.groups[1].release_unread(self.last).expect("idle");
    }

    fn tables(&self) -> Vec<(usize, Vec<kvbm_blocks::BlockId>)> {
        (self.groups.iter())
            .map(|seq| (seq.inner().skipped_blocks(), seq.block_ids().collect()))
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases(256)))]

    /// A model whose last group is its only window (or chunk) group, as
    /// gpt-oss's, releases that group's unread blocks as it registers them
    /// (most of a long prefill chunk's never join its table). The pool must
    /// not tell: the same tables, counters, events and eviction order as
    /// registering every block and releasing the unread ones after.
    #[test]
    fn fuzz_a_last_window_group_releasing_at_registration_matches_releasing_after(
        window in 1..6usize,
        chunked in any::<bool>(),
        prompts in long_prompts(),
        pool_blocks in 12..80usize,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let last = if chunked {
            AttentionKind::ChunkedLocal { chunk: window * BLOCK_SIZE }
        } else {
            AttentionKind::SlidingWindow { window: window * BLOCK_SIZE }
        };
        let groups = Arc::new(KvCacheGroups::new(
            BLOCK_SIZE,
            vec![KvCacheGroup::new(AttentionKind::Full, 1), KvCacheGroup::new(last, 1)],
        ).expect("valid groups"));
        let (fused_pool, unfused_pool) = (manager(pool_blocks), manager(pool_blocks));
        let (fused_events, unfused_events) =
            (fused_pool.subscribe_events(1 << 16), unfused_pool.subscribe_events(1 << 16));
        let mut fused: Vec<GroupedSequence<Gpu>> = (prompts.iter())
            .map(|(p, m)| GroupedSequence::new(p.clone(), *m, groups.clone()).expect("valid"))
            .collect();
        let mut unfused: Vec<Unfused> =
            prompts.iter().map(|(p, m)| Unfused::new(p, *m, last)).collect();
        for op in &ops {
            let r = match *op {
                Op::Prefill(r, _) | Op::Decode(r) | Op::Apply(r, _) | Op::Preempt(r) => {
                    r % fused.len()
                }
                _ => continue,
            };
            let (seq, reference) = (&mut fused[r], &mut unfused[r]);
            match *op {
                Op::Prefill(_, n) => {
                    let n = (n * 8).min(seq.remaining_prefill_tokens());
                    let _ = seq.schedule_prefill(n, &fused_pool);
                    reference.schedule(|g| g.schedule_prefill(n, &unfused_pool).is_ok());
                }
                Op::Decode(_) => {
                    let _ = seq.schedule_decode(&fused_pool);
                    reference.schedule(|g| g.schedule_decode(&unfused_pool).is_ok());
                }
                Op::Apply(..) => {
                    let next = 500 + seq.tokens().len() as u32;
                    match seq.state() {
                        SequenceState::PrefillScheduled { .. } => {
                            apply_prefill(seq, next, &fused_pool)
                        }
                        SequenceState::DecodeScheduled { .. } => {
                            seq.apply_decode(next, &fused_pool).expect("scheduled");
                        }
                        _ => {}
                    }
                    reference.apply(next, &unfused_pool);
                }
                _ => {
                    let _ = seq.release();
                    for g in &mut reference.groups {
                        let _ = g.release();
                    }
                }
            }
            let tables: Vec<_> = (0..2).map(|g| seq.block_table(g).expect("a group")).collect();
            prop_assert_eq!(tables, reference.tables(), "after {:?}", op);
            prop_assert_eq!(fused_pool.metrics(), unfused_pool.metrics(), "after {:?}", op);
        }
        drop((fused, unfused));
        fused_pool.flush_events();
        unfused_pool.flush_events();
        let events = |subscription: &kvbm_blocks::EventSubscription| -> Vec<String> {
            (subscription.drain().iter())
                .flat_map(|message| match message {
                    kvbm_blocks::EventMessage::Batch(batch) => {
                        batch.events().map(|e| format!("{e:?}")).collect()
                    }
                    other => vec![format!("{other:?}")],
                })
                .collect()
        };
        prop_assert_eq!(events(&fused_events), events(&unfused_events));
        let evicted = |pool: &BlockManager<Gpu>| {
            pool.allocate_blocks_with_evictions(pool.available_blocks())
                .expect("all available")
                .evicted
        };
        prop_assert_eq!(evicted(&fused_pool), evicted(&unfused_pool));
    }
}
