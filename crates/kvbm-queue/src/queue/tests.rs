//! Unit tests that need the queue's insides: the lock, the waiter count and
//! the sequence counter.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use super::RequestQueue;
use crate::shared::Shared;
use crate::sync::is_locked;
use crate::{Priority, QueueConfig, QueueError, Request};

/// A request that checks, in every method and in `Drop`, whether the queue's
/// lock is held by someone (in a single-threaded test: by this thread).
struct Probe {
    id: u32,
    priority: Priority,
    prompt: u32,
    queue: Arc<OnceLock<Weak<Shared<Probe>>>>,
    checks: Arc<AtomicUsize>,
    violations: Arc<AtomicUsize>,
}

impl Probe {
    fn check(&self) {
        if let Some(shared) = self.queue.get().and_then(Weak::upgrade) {
            self.checks.fetch_add(1, SeqCst);
            if is_locked(&shared.inner) {
                self.violations.fetch_add(1, SeqCst);
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.check();
    }
}

impl Request for Probe {
    type Id = u32;
    fn id(&self) -> u32 {
        self.check();
        self.id
    }
    fn priority(&self) -> Priority {
        self.check();
        self.priority
    }
    fn prompt_tokens(&self) -> u32 {
        self.check();
        self.prompt
    }
    fn max_new_tokens(&self) -> u32 {
        self.check();
        0
    }
}

struct Probes {
    queue: RequestQueue<Probe>,
    weak: Arc<OnceLock<Weak<Shared<Probe>>>>,
    checks: Arc<AtomicUsize>,
    violations: Arc<AtomicUsize>,
}

impl Probes {
    fn new(config: QueueConfig) -> Self {
        let queue = RequestQueue::new(config).expect("valid config");
        let weak = Arc::new(OnceLock::new());
        assert!(weak.set(Arc::downgrade(&queue.shared)).is_ok());
        Self {
            queue,
            weak,
            checks: Arc::default(),
            violations: Arc::default(),
        }
    }

    fn probe(&self, id: u32, priority: Priority, prompt: u32) -> Probe {
        Probe {
            id,
            priority,
            prompt,
            queue: Arc::clone(&self.weak),
            checks: Arc::clone(&self.checks),
            violations: Arc::clone(&self.violations),
        }
    }
}

#[test]
fn the_probe_detects_a_held_lock() {
    let probes = Probes::new(QueueConfig::new(16, 8));
    let probe = probes.probe(1, Priority::Normal, 1);
    let guard = probes.queue.shared().lock();
    probe.check();
    drop(guard);
    probe.check();
    assert_eq!(probes.violations.load(SeqCst), 1);
    assert_eq!(probes.checks.load(SeqCst), 2);
}

#[test]
fn no_request_code_or_drop_runs_under_the_lock() {
    let probes = Probes::new(QueueConfig::new(16, 8));
    let q = &probes.queue;
    let p = |id, prio, prompt| probes.probe(id, prio, prompt);

    let h1 = q.enqueue(p(1, Priority::Low, 16)).expect("fresh id");
    q.enqueue(p(2, Priority::High, 16)).expect("fresh id");
    q.enqueue(p(3, Priority::Normal, 32)).expect("fresh id");
    q.enqueue(p(4, Priority::Normal, 16)).expect("fresh id");
    drop(
        q.enqueue(p(2, Priority::Normal, 16))
            .expect_err("duplicate"),
    );
    drop(
        q.enqueue(p(9, Priority::Normal, 16 * 9))
            .expect_err("too large"),
    );

    drop(q.try_dequeue().expect("queued")); // 2
    drop(q.cancel(h1).expect("queued")); // 1
    assert!(q.cancel_handle(h1).cancel().is_none());
    let mut batch = q.select_batch(4, 3); // 3 (2 blocks), 4 (1 block)
    assert_eq!(batch.len(), 2);
    let back = batch.split_off(0);
    for admitted in back {
        q.restore(admitted).expect("restorable");
    }
    drop(q.remove(4).expect("queued"));
    let admitted = q.select_batch(1, 8).into_iter().next().expect("3 fits");
    q.enqueue(p(3, Priority::Normal, 16))
        .expect("3 left the queue");
    drop(q.restore(admitted).expect_err("3 was queued again"));
    drop(q.dequeue_timeout(Duration::ZERO).expect("queued"));
    q.enqueue(p(5, Priority::Normal, 16)).expect("fresh id");
    q.enqueue(p(6, Priority::Normal, 16)).expect("fresh id");
    drop(q.clear());
    q.enqueue(p(7, Priority::Normal, 16)).expect("fresh id");
    q.close();
    drop(q.enqueue(p(8, Priority::Normal, 16)).expect_err("closed"));
    drop(q.dequeue().expect("drains"));
    q.enqueue(p(10, Priority::Normal, 16))
        .expect_err("closed")
        .into_inner();

    assert!(probes.checks.load(SeqCst) > 40, "the probes ran");
    assert_eq!(probes.violations.load(SeqCst), 0);
}

#[test]
fn defect_08_sequence_numbers_do_not_wrap_at_i32() {
    let queue = RequestQueue::<u32>::new(QueueConfig::new(16, 8)).expect("valid config");
    // As if 2^31 - 2 requests had passed through (about 2.5 days at 10k req/s).
    queue.shared().lock().next_seq = i32::MAX as u64 - 1;
    for id in 0..4 {
        let ticket = queue.enqueue(id).expect("fresh id");
        assert!(ticket.seq() >= i32::MAX as u64 - 1);
    }
    let order: Vec<u32> = std::iter::from_fn(|| queue.try_dequeue().ok()).collect();
    assert_eq!(order, [0, 1, 2, 3], "FIFO across the i32 boundary");

    queue.shared().lock().next_seq = u32::MAX as u64;
    queue.enqueue(10).expect("fresh id");
    queue.enqueue(11).expect("fresh id");
    assert_eq!(queue.queued_ids(), [10, 11], "FIFO across the u32 boundary");
}

/// Waits (without a time limit) until `n` consumers are blocked.
fn until_waiting<R: Request>(queue: &RequestQueue<R>, n: usize) {
    while queue.shared().lock().waiters != n {
        thread::yield_now();
    }
}

#[test]
fn defect_11_close_wakes_every_blocked_consumer() {
    let queue = RequestQueue::<u32>::new(QueueConfig::new(16, 8)).expect("valid config");
    let consumers: Vec<_> = (0..4)
        .map(|i| {
            let queue = queue.clone();
            thread::spawn(move || match i {
                0 => queue.dequeue(),
                1 => queue.dequeue_timeout(Duration::from_secs(3600)),
                2 => queue.dequeue_cancellable(&queue.wait_token()),
                _ => queue.dequeue_timeout(Duration::MAX),
            })
        })
        .collect();
    until_waiting(&queue, 4);
    assert!(queue.close());
    for consumer in consumers {
        assert_eq!(consumer.join().expect("no panic"), Err(QueueError::Closed));
    }
    assert_eq!(queue.shared().lock().waiters, 0);
}

#[test]
fn cancelling_a_token_wakes_only_its_waiters() {
    let queue = RequestQueue::<u32>::new(QueueConfig::new(16, 8)).expect("valid config");
    let token = queue.wait_token();
    let cancelled = {
        let (queue, token) = (queue.clone(), token.clone());
        thread::spawn(move || queue.dequeue_cancellable(&token))
    };
    let other = {
        let queue = queue.clone();
        thread::spawn(move || queue.dequeue())
    };
    until_waiting(&queue, 2);
    token.cancel();
    assert_eq!(
        cancelled.join().expect("no panic"),
        Err(QueueError::Cancelled)
    );
    until_waiting(&queue, 1);
    queue.enqueue(7).expect("fresh id");
    assert_eq!(other.join().expect("no panic"), Ok(7));
}

#[test]
fn enqueue_wakes_a_blocked_consumer() {
    let queue = RequestQueue::<u32>::new(QueueConfig::new(16, 8)).expect("valid config");
    let consumer = {
        let queue = queue.clone();
        thread::spawn(move || queue.dequeue())
    };
    until_waiting(&queue, 1);
    queue.enqueue(5).expect("fresh id");
    assert_eq!(consumer.join().expect("no panic"), Ok(5));
}

/// `u32` is a request with no prompt and no generation: it costs 0 blocks.
impl Request for u32 {
    type Id = u32;
    fn id(&self) -> u32 {
        *self
    }
    fn prompt_tokens(&self) -> u32 {
        0
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}
