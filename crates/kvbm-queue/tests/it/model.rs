//! Model-based test: random operation sequences against a `Vec` reference
//! that sorts on every read, comparing every result, `len`, `contains`, the
//! service order and the counters after every operation. Ids come from a
//! small range so duplicates, reuse and stale handles happen all the time.
//! Depth: `PROPTEST_CASES` (default 256).
#![cfg(not(kvbm_loom))]

use proptest::prelude::*;

use kvbm_queue::{
    Admitted, Aging, GenerationReserve, Priority, QueueConfig, QueueError, QueueStats,
    RequestQueue, Selection, Ticket,
};

use crate::Req;

const IDS: u32 = 8;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        id: u32,
        priority: usize,
        prompt: u32,
        max_new: u32,
    },
    TryDequeue,
    DequeueTimeoutZero,
    Remove(u32),
    Cancel(usize),
    Select {
        max: usize,
        budget: u64,
    },
    Restore(usize),
    Clear,
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..IDS, 0..4usize, 0..40u32, 0..40u32).prop_map(|(id, priority, prompt, max_new)| {
            Op::Enqueue { id, priority, prompt, max_new }
        }),
        3 => Just(Op::TryDequeue),
        1 => Just(Op::DequeueTimeoutZero),
        2 => (0..IDS).prop_map(Op::Remove),
        2 => any::<usize>().prop_map(Op::Cancel),
        3 => (0..5usize, 0..14u64).prop_map(|(max, budget)| Op::Select { max, budget }),
        3 => any::<usize>().prop_map(Op::Restore),
        1 => Just(Op::Clear),
        1 => Just(Op::Close),
    ]
}

fn config() -> impl Strategy<Value = QueueConfig> {
    let reserve = prop_oneof![
        Just(GenerationReserve::Full),
        (0..20u32).prop_map(GenerationReserve::Capped)
    ];
    let selection = prop_oneof![
        Just(Selection::HeadOfLine),
        (1..6usize, 0..3u32).prop_map(|(max_scan, max_bypass)| Selection::SkipAhead {
            max_scan,
            max_bypass
        }),
    ];
    let aging = prop_oneof![Just(Aging::Strict), (0..4u64).prop_map(Aging::Window)];
    (
        prop::sample::select(vec![1u32, 4, 16]),
        1..12u64,
        reserve,
        selection,
        aging,
        0..4usize,
    )
        .prop_map(
            |(block_tokens, pool, reserve, selection, aging, capacity)| {
                QueueConfig::new(block_tokens, pool)
                    .with_reserve(reserve)
                    .with_selection(selection)
                    .with_aging(aging)
                    .with_capacity(capacity)
            },
        )
}

/// A queued request as the reference sees it.
#[derive(Debug, Clone)]
struct Queued {
    req: Req,
    seq: u64,
    blocks: u64,
    bypassed: u32,
}

/// The obvious implementation: an unordered `Vec`, sorted whenever order
/// matters, with every rule written out again independently.
struct Reference {
    config: QueueConfig,
    queued: Vec<Queued>,
    next_seq: u64,
    closed: bool,
    stats: QueueStats,
}

fn steps_below_critical(p: Priority) -> u64 {
    match p {
        Priority::Critical => 0,
        Priority::High => 1,
        Priority::Normal => 2,
        Priority::Low => 3,
    }
}

impl Reference {
    fn new(config: QueueConfig) -> Self {
        Self {
            config,
            queued: Vec::new(),
            next_seq: 0,
            closed: false,
            stats: QueueStats::default(),
        }
    }

    fn blocks(&self, req: &Req) -> u64 {
        let reserve = match self.config.reserve() {
            GenerationReserve::Full => req.max_new,
            GenerationReserve::Capped(cap) => req.max_new.min(cap),
            other => unimplemented!("the model has no {other:?}"),
        };
        let tokens = u64::from(req.prompt) + u64::from(reserve);
        let per_block = u64::from(self.config.block_tokens());
        tokens.div_ceil(per_block)
    }

    fn key(&self, q: &Queued) -> (u64, u64, u64) {
        let steps = steps_below_critical(q.req.priority);
        let rank = match self.config.aging() {
            Aging::Strict => steps,
            Aging::Window(w) => q.seq.saturating_add(steps.saturating_mul(w)),
            // Never configured here: its ranks come from the real clock. The
            // `Pending` model test covers them, and `liveness` its bound.
            Aging::Timed { .. } => unreachable!("the model does not use timed aging"),
            other => unimplemented!("the model has no {other:?}"),
        };
        (rank, steps, q.seq)
    }

    fn sort(&mut self) {
        let mut queued = std::mem::take(&mut self.queued);
        queued.sort_by_key(|q| self.key(q));
        self.queued = queued;
    }

    fn position(&self, id: u32) -> Option<usize> {
        self.queued.iter().position(|q| q.req.id == id)
    }

    fn enqueue(&mut self, req: Req) -> Result<u64, QueueError> {
        let blocks = self.blocks(&req);
        if blocks > self.config.pool_blocks() {
            return Err(QueueError::TooLarge {
                needed: blocks,
                pool: self.config.pool_blocks(),
            });
        }
        if self.closed {
            return Err(QueueError::Closed);
        }
        if self.position(req.id).is_some() {
            return Err(QueueError::Duplicate);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queued.push(Queued {
            req,
            seq,
            blocks,
            bypassed: 0,
        });
        self.stats.enqueued += 1;
        self.sort();
        Ok(seq)
    }

    fn pop(&mut self, empty: QueueError) -> Result<Req, QueueError> {
        if self.queued.is_empty() {
            return Err(if self.closed {
                QueueError::Closed
            } else {
                empty
            });
        }
        self.stats.dequeued += 1;
        Ok(self.queued.remove(0).req)
    }

    fn select(&mut self, max: usize, budget: u64) -> (Vec<Queued>, u64, usize) {
        let (max_scan, max_bypass) = match self.config.selection() {
            Selection::HeadOfLine => (usize::MAX, 0),
            Selection::SkipAhead {
                max_scan,
                max_bypass,
            } => (max_scan, max_bypass),
            other => unimplemented!("the model has no {other:?}"),
        };
        let mut taken = Vec::new();
        let mut skipped_ids = Vec::new();
        let mut bypassed_ids = Vec::new();
        let mut used = 0;
        let mut kept = Vec::new();
        let mut stop = max == 0;
        for (examined, q) in std::mem::take(&mut self.queued).into_iter().enumerate() {
            if stop || taken.len() == max || examined == max_scan {
                stop = true;
                kept.push(q);
                continue;
            }
            if used + q.blocks <= budget {
                used += q.blocks;
                bypassed_ids.append(&mut skipped_ids);
                taken.push(q);
            } else if q.bypassed >= max_bypass {
                stop = true;
                kept.push(q);
            } else {
                skipped_ids.push(q.req.id);
                kept.push(q);
            }
        }
        for q in &mut kept {
            if bypassed_ids.contains(&q.req.id) {
                q.bypassed += 1;
            }
        }
        self.queued = kept;
        self.stats.selected += taken.len() as u64;
        (taken, used, bypassed_ids.len())
    }

    fn restore(&mut self, q: Queued) -> Result<(), QueueError> {
        if self.closed {
            return Err(QueueError::Closed);
        }
        if self.position(q.req.id).is_some() {
            return Err(QueueError::Duplicate);
        }
        self.queued.push(q);
        self.stats.restored += 1;
        self.sort();
        Ok(())
    }

    fn stats(&self) -> QueueStats {
        let mut stats = self.stats;
        stats.len = self.queued.len();
        stats.closed = self.closed;
        stats
    }
}

fn run(config: QueueConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let queue: RequestQueue<Req> =
        RequestQueue::new(config).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut model = Reference::new(config);
    let mut tickets: Vec<Ticket<u32>> = Vec::new();
    let mut held: Vec<(Admitted<Req>, Queued)> = Vec::new();

    for op in ops {
        match op {
            Op::Enqueue {
                id,
                priority,
                prompt,
                max_new,
            } => {
                let req = Req {
                    id,
                    priority: Priority::ALL[priority],
                    prompt,
                    max_new,
                };
                let want = model.enqueue(req.clone());
                match queue.enqueue(req.clone()) {
                    Ok(ticket) => {
                        prop_assert_eq!(Ok(ticket.seq()), want.clone());
                        prop_assert_eq!(ticket.id(), id);
                        tickets.push(ticket);
                    }
                    Err(rejected) => {
                        let (error, back) = rejected.into_parts();
                        prop_assert_eq!(Err(error), want);
                        prop_assert_eq!(back, req, "the request comes back");
                    }
                }
            }
            Op::TryDequeue => {
                prop_assert_eq!(queue.try_dequeue(), model.pop(QueueError::Empty));
            }
            Op::DequeueTimeoutZero => {
                prop_assert_eq!(
                    queue.dequeue_timeout(std::time::Duration::ZERO),
                    model.pop(QueueError::Timeout)
                );
            }
            Op::Remove(id) => {
                let want = model.position(id).map(|i| model.queued.remove(i).req);
                if want.is_some() {
                    model.stats.removed += 1;
                }
                prop_assert_eq!(queue.remove(id), want);
            }
            Op::Cancel(k) => {
                if !tickets.is_empty() {
                    let ticket = tickets[k % tickets.len()];
                    let want = model
                        .queued
                        .iter()
                        .position(|q| q.req.id == ticket.id() && q.seq == ticket.seq())
                        .map(|i| model.queued.remove(i).req);
                    if want.is_some() {
                        model.stats.cancelled += 1;
                    }
                    prop_assert_eq!(queue.is_queued(ticket), want.is_some());
                    // Alternate the two ways to cancel.
                    let got = if k % 2 == 0 {
                        queue.cancel(ticket)
                    } else {
                        queue.cancel_handle(ticket).cancel()
                    };
                    prop_assert_eq!(got, want);
                }
            }
            Op::Select { max, budget } => {
                let batch = queue.select_batch(max, budget);
                let (taken, used, bypassed) = model.select(max, budget);
                let got: Vec<(u32, u64, u64)> = batch
                    .iter()
                    .map(|a| (a.id(), a.seq(), a.blocks()))
                    .collect();
                let want: Vec<(u32, u64, u64)> =
                    taken.iter().map(|q| (q.req.id, q.seq, q.blocks)).collect();
                prop_assert_eq!(got, want);
                prop_assert_eq!(batch.blocks(), used);
                prop_assert!(used <= budget);
                prop_assert_eq!(batch.bypassed(), bypassed);
                held.extend(batch.into_iter().zip(taken));
            }
            Op::Restore(k) => {
                if !held.is_empty() {
                    let (admitted, q) = held.remove(k % held.len());
                    let want = model.restore(q);
                    match queue.restore(admitted) {
                        Ok(()) => prop_assert_eq!(Ok(()), want),
                        Err(rejected) => prop_assert_eq!(Err(rejected.error().clone()), want),
                    }
                }
            }
            Op::Clear => {
                let want: Vec<Req> = model.queued.drain(..).map(|q| q.req).collect();
                model.stats.cleared += want.len() as u64;
                prop_assert_eq!(queue.clear(), want);
            }
            Op::Close => {
                let first = !model.closed;
                model.closed = true;
                prop_assert_eq!(queue.close(), first);
            }
        }
        let want_ids: Vec<u32> = model.queued.iter().map(|q| q.req.id).collect();
        prop_assert_eq!(queue.queued_ids(), want_ids);
        prop_assert_eq!(queue.len(), model.queued.len());
        prop_assert_eq!(queue.is_empty(), model.queued.is_empty());
        prop_assert_eq!(queue.is_closed(), model.closed);
        for id in 0..IDS {
            prop_assert_eq!(queue.contains(id), model.position(id).is_some());
        }
        let stats = queue.stats();
        prop_assert_eq!(stats, model.stats());
        prop_assert!(stats.is_balanced());
    }
    Ok(())
}

proptest! {
    #[test]
    fn queue_matches_the_vec_reference(config in config(), ops in prop::collection::vec(op(), 0..80)) {
        run(config, ops)?;
    }
}
