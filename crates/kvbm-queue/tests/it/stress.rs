//! Many producers, consumers, cancellers, a remover (that also clears now and
//! then) and a batch selector (that restores some of what it takes) at once.
//! Afterwards every request must be accounted for exactly once, as dequeued,
//! selected, removed, cancelled, cleared or drained, and dropped exactly once.
#![cfg(not(kvbm_loom))]

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, mpsc};
use std::thread;

use kvbm_queue::{Priority, QueueConfig, QueueError, Request, RequestQueue};

const PRODUCERS: u32 = 4;
const PER_PRODUCER: u32 = 1500;
const TOTAL: usize = (PRODUCERS * PER_PRODUCER) as usize;

/// How a request left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Outcome {
    Dequeued = 1,
    Selected,
    Removed,
    Cancelled,
    Cleared,
    Drained,
}

const OUTCOMES: [Outcome; 6] = [
    Outcome::Dequeued,
    Outcome::Selected,
    Outcome::Removed,
    Outcome::Cancelled,
    Outcome::Cleared,
    Outcome::Drained,
];

/// Per-id bookkeeping shared by every thread.
struct Ledger {
    outcome: Vec<AtomicU8>,
    recorded: Vec<AtomicU8>,
    drops: Vec<AtomicU8>,
}

impl Ledger {
    fn new() -> Self {
        let zeros = || (0..TOTAL).map(|_| AtomicU8::new(0)).collect();
        Self {
            outcome: zeros(),
            recorded: zeros(),
            drops: zeros(),
        }
    }

    fn record(&self, id: u32, outcome: Outcome) {
        let i = id as usize;
        self.recorded[i].fetch_add(1, SeqCst);
        self.outcome[i].store(outcome as u8, SeqCst);
    }
}

/// A request that counts its own drops.
struct Tracked {
    id: u32,
    priority: Priority,
    blocks: u32,
    ledger: Arc<Ledger>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.ledger.drops[self.id as usize].fetch_add(1, SeqCst);
    }
}

impl Request for Tracked {
    type Id = u32;
    fn id(&self) -> u32 {
        self.id
    }
    fn priority(&self) -> Priority {
        self.priority
    }
    fn prompt_tokens(&self) -> u32 {
        self.blocks * 16
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}

#[test]
fn defect_15_every_request_is_accounted_for_exactly_once_and_dropped_once() {
    let ledger = Arc::new(Ledger::new());
    let queue: RequestQueue<Tracked> =
        RequestQueue::new(QueueConfig::new(16, 8)).expect("valid config");
    let book: &Ledger = &ledger;
    let producers_done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);

    thread::scope(|s| {
        let (to_canceller, cancel_rx) = mpsc::channel();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (queue, ledger, to_canceller) = (&queue, &ledger, to_canceller.clone());
                let producers_done = &producers_done;
                s.spawn(move || {
                    for i in 0..PER_PRODUCER {
                        let id = p * PER_PRODUCER + i;
                        let request = Tracked {
                            id,
                            priority: Priority::ALL[(id % 4) as usize],
                            blocks: 1 + id % 3,
                            ledger: Arc::clone(ledger),
                        };
                        match queue.enqueue(request) {
                            Ok(ticket) if id.is_multiple_of(5) => {
                                let _ = to_canceller.send(queue.cancel_handle(ticket));
                            }
                            Ok(_) => {}
                            Err(rejected) => panic!("unique ids are accepted: {rejected}"),
                        }
                        thread::yield_now();
                    }
                    producers_done.fetch_add(1, SeqCst);
                })
            })
            .collect();
        drop(to_canceller);

        // Consumers stop when their token is cancelled, leaving the rest to
        // be drained after close. They yield after each request so the queue
        // stays deep enough for the other threads to find work.
        let token = queue.wait_token();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (token, queue) = (token.clone(), &queue);
                s.spawn(move || {
                    loop {
                        match queue.dequeue_cancellable(&token) {
                            Ok(r) => book.record(r.id, Outcome::Dequeued),
                            Err(error) => return error,
                        }
                        for _ in 0..4 {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();

        // Cancels every handle it is sent (many are already gone by then).
        let canceller = s.spawn(move || {
            for handle in cancel_rx {
                if let Some(r) = handle.cancel() {
                    book.record(r.id, Outcome::Cancelled);
                }
            }
        });

        let remover = s.spawn(|| {
            let mut round = 0u32;
            while !stop.load(SeqCst) {
                round += 1;
                let id = round.wrapping_mul(2_654_435_761) % TOTAL as u32;
                if let Some(r) = queue.remove(id) {
                    book.record(r.id, Outcome::Removed);
                }
                if round.is_multiple_of(1000) {
                    for r in queue.clear() {
                        book.record(r.id, Outcome::Cleared);
                    }
                }
                thread::yield_now();
            }
        });

        let selector = s.spawn(|| {
            let mut round = 0u32;
            while !stop.load(SeqCst) {
                round += 1;
                let mut batch = queue.select_batch(4, 6);
                // Every third batch "fails to allocate" its last request.
                let failed = if round.is_multiple_of(3) {
                    batch.split_off(batch.len().saturating_sub(1))
                } else {
                    Vec::new()
                };
                for admitted in batch {
                    book.record(admitted.id(), Outcome::Selected);
                }
                for admitted in failed {
                    if let Err(rejected) = queue.restore(admitted) {
                        // Closed meanwhile: the request stays with us.
                        assert_eq!(rejected.error(), &QueueError::Closed);
                        book.record(rejected.into_inner().id(), Outcome::Selected);
                    }
                }
                thread::yield_now();
            }
        });

        for producer in producers {
            producer.join().expect("producer panicked");
        }
        assert_eq!(producers_done.load(SeqCst), PRODUCERS as usize);
        canceller.join().expect("canceller panicked");
        // Let the others work the queue down, then stop the consumers and
        // leave the rest for the drain after close.
        while queue.len() > TOTAL / 20 {
            thread::yield_now();
        }
        token.cancel();
        for consumer in consumers {
            assert_eq!(
                consumer.join().expect("consumer panicked"),
                QueueError::Cancelled
            );
        }
        stop.store(true, SeqCst);
        remover.join().expect("remover panicked");
        selector.join().expect("selector panicked");
        queue.close();
    });

    // Whatever is left after close is drained.
    while let Ok(r) = queue.try_dequeue() {
        ledger.record(r.id, Outcome::Drained);
    }
    assert_eq!(queue.try_dequeue().err(), Some(QueueError::Closed));
    let stats = queue.stats();
    assert!(stats.is_balanced(), "{stats:?}");
    assert_eq!(stats.enqueued, TOTAL as u64);
    drop(queue);

    let mut by_outcome = [0u64; 6];
    for id in 0..TOTAL {
        assert_eq!(
            ledger.recorded[id].load(SeqCst),
            1,
            "request {id} left once"
        );
        assert_eq!(
            ledger.drops[id].load(SeqCst),
            1,
            "request {id} dropped once"
        );
        let outcome = ledger.outcome[id].load(SeqCst);
        let index = OUTCOMES
            .iter()
            .position(|&o| o as u8 == outcome)
            .expect("a known outcome");
        by_outcome[index] += 1;
    }
    eprintln!(
        "outcomes (dequeued, selected, removed, cancelled, cleared, drained): {by_outcome:?}; {stats:?}"
    );
    let [dequeued, selected, removed, cancelled, cleared, drained] = by_outcome;
    assert_eq!(dequeued + drained, stats.dequeued);
    assert_eq!(
        selected,
        stats.selected - stats.restored,
        "selected for good = selected - restored"
    );
    assert_eq!(removed, stats.removed);
    assert_eq!(cancelled, stats.cancelled);
    assert_eq!(cleared, stats.cleared);
}

#[test]
fn dropping_the_queue_drops_what_is_left_exactly_once() {
    let ledger = Arc::new(Ledger::new());
    let queue: RequestQueue<Tracked> =
        RequestQueue::new(QueueConfig::new(16, 8)).expect("valid config");
    let handles: Vec<_> = (0..100)
        .map(|id| {
            queue
                .enqueue(Tracked {
                    id,
                    priority: Priority::ALL[(id % 4) as usize],
                    blocks: 1,
                    ledger: Arc::clone(&ledger),
                })
                .map(|ticket| queue.cancel_handle(ticket))
                .expect("unique id")
        })
        .collect();
    let batch = queue.select_batch(10, 100);
    drop(queue);
    for id in 0..100 {
        assert_eq!(
            ledger.drops[id].load(SeqCst),
            0,
            "handles keep the queue alive"
        );
    }
    drop(handles);
    let dropped = |id: usize| ledger.drops[id].load(SeqCst);
    assert_eq!((0..100).filter(|&id| dropped(id) == 1).count(), 90);
    drop(batch);
    assert!((0..100).all(|id| dropped(id) == 1));
}
