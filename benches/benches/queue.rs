//! Request queue benchmarks: kvbm-queue beside two baselines.
//!
//! - `crossbeam`: `crossbeam_channel::unbounded`, a lock-free FIFO with no
//!   priorities, no remove-by-id and no exact length: the ceiling for moving
//!   items between threads.
//! - `heap`: a `Mutex<BinaryHeap>` + `Condvar` priority queue, written here
//!   the way it usually is (FIFO within a priority by a sequence number,
//!   `notify_one` per push, `retain` to remove by id).
//! - `crossbeam+idset` (MPMC only): the crossbeam channel plus a `dashmap`
//!   set of queued ids, inserted before each send and removed after each
//!   receive: what refusing a duplicate id at enqueue costs on its own,
//!   still with no priorities, no remove-by-id and no exact `len`. It is a
//!   floor for `RequestQueue`, where plain crossbeam is the ceiling of a
//!   queue that keeps no per-request state at all.
//!
//! Groups: single-thread enqueue+dequeue at depth 0, 1k and 100k; remove by
//! id at depth 100k; `select_batch(256, ..)` at depth 100k; MPMC throughput
//! for 1/2/4 producers x 1/2/4 consumers; and the scheduler's shape, 1/2/4
//! producers feeding one consumer that takes up to 256 requests at a time.
//! Every group reports elements, so criterion prints ops/s (or items/s).
//!
//! Run: `cargo bench -p kvbm-benches --bench queue` (a few minutes);
//! smoke: `cargo test -p kvbm-benches --bench queue` (seconds, small depths).

use std::collections::BinaryHeap;
use std::hint::black_box;
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvbm_benches::is_smoke_test;
use kvbm_queue::{Priority, QueueConfig, Request, RequestQueue};

/// A request as small as a real one is cheap: an id, a priority and a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Req {
    id: u64,
    priority: Priority,
    blocks: u32,
}

impl Request for Req {
    type Id = u64;
    fn id(&self) -> u64 {
        self.id
    }
    fn priority(&self) -> Priority {
        self.priority
    }
    fn prompt_tokens(&self) -> u32 {
        self.blocks * BLOCK_TOKENS
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}

const BLOCK_TOKENS: u32 = 16;

/// The `i`-th request of a workload: priorities and sizes (1 to 4 blocks)
/// cycle with coprime periods so every mix occurs.
fn req(id: u64) -> Req {
    Req {
        id,
        priority: Priority::ALL[(id % 4) as usize],
        blocks: 1 + (id % 7 % 4) as u32,
    }
}

fn kvbm_queue() -> RequestQueue<Req> {
    RequestQueue::new(QueueConfig::new(BLOCK_TOKENS, 1 << 40)).expect("valid config")
}

/// The usual priority queue: one mutex over a binary heap, one condvar.
mod heap {
    use super::*;
    use std::cmp::{Ordering, Reverse};

    struct Item {
        priority: Priority,
        seq: Reverse<u64>,
        req: Req,
    }

    impl PartialEq for Item {
        fn eq(&self, other: &Self) -> bool {
            self.cmp(other) == Ordering::Equal
        }
    }
    impl Eq for Item {}
    impl PartialOrd for Item {
        fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Item {
        fn cmp(&self, other: &Self) -> Ordering {
            (self.priority, self.seq).cmp(&(other.priority, other.seq))
        }
    }

    #[derive(Default)]
    struct State {
        heap: BinaryHeap<Item>,
        next_seq: u64,
        closed: bool,
    }

    #[derive(Default)]
    pub(crate) struct HeapQueue {
        state: Mutex<State>,
        not_empty: Condvar,
    }

    impl HeapQueue {
        pub(crate) fn push(&self, req: Req) {
            let mut state = self.state.lock().expect("not poisoned");
            let seq = Reverse(state.next_seq);
            state.next_seq += 1;
            state.heap.push(Item {
                priority: req.priority,
                seq,
                req,
            });
            drop(state);
            self.not_empty.notify_one();
        }

        /// Blocks while empty and open; `None` once closed and drained.
        pub(crate) fn pop(&self) -> Option<Req> {
            let mut state = self.state.lock().expect("not poisoned");
            loop {
                if let Some(item) = state.heap.pop() {
                    return Some(item.req);
                }
                if state.closed {
                    return None;
                }
                state = self.not_empty.wait(state).expect("not poisoned");
            }
        }

        pub(crate) fn try_pop(&self) -> Option<Req> {
            let mut state = self.state.lock().expect("not poisoned");
            state.heap.pop().map(|item| item.req)
        }

        /// Removal by id: a heap can only rebuild without it (O(n)).
        pub(crate) fn remove(&self, id: u64) -> bool {
            let mut state = self.state.lock().expect("not poisoned");
            let before = state.heap.len();
            state.heap.retain(|item| item.req.id != id);
            state.heap.len() != before
        }

        /// Head-of-line selection: pop while the head fits.
        pub(crate) fn select(&self, max: usize, mut budget: u64) -> Vec<(Req, u64)> {
            let mut out = Vec::with_capacity(max);
            let mut state = self.state.lock().expect("not poisoned");
            while out.len() < max {
                let Some(head) = state.heap.peek() else { break };
                let cost = u64::from(head.req.blocks);
                if cost > budget {
                    break;
                }
                budget -= cost;
                let item = state.heap.pop().expect("peeked");
                out.push((item.req, item.seq.0));
            }
            out
        }

        /// Puts selected requests back with their original sequence numbers.
        pub(crate) fn restore(&self, items: Vec<(Req, u64)>) {
            let mut state = self.state.lock().expect("not poisoned");
            for (req, seq) in items {
                state.heap.push(Item {
                    priority: req.priority,
                    seq: Reverse(seq),
                    req,
                });
            }
        }

        pub(crate) fn close(&self) {
            self.state.lock().expect("not poisoned").closed = true;
            self.not_empty.notify_all();
        }
    }
}

use heap::HeapQueue;

/// 100k in a real run; smaller in the (unoptimized) smoke run.
fn deep() -> u64 {
    if is_smoke_test() { 2_000 } else { 100_000 }
}

fn configure(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
}

fn enqueue_dequeue(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue/enqueue_dequeue");
    configure(&mut group);
    group.throughput(Throughput::Elements(1));
    for depth in [0, 1_000, deep()] {
        group.bench_with_input(BenchmarkId::new("kvbm", depth), &depth, |b, &depth| {
            let q = kvbm_queue();
            for id in 0..depth {
                q.enqueue(req(id)).expect("fresh id");
            }
            let mut next = depth;
            b.iter(|| {
                q.enqueue(req(next)).expect("fresh id");
                next += 1;
                black_box(q.try_dequeue().expect("non-empty"))
            });
        });
        group.bench_with_input(BenchmarkId::new("heap", depth), &depth, |b, &depth| {
            let q = HeapQueue::default();
            for id in 0..depth {
                q.push(req(id));
            }
            let mut next = depth;
            b.iter(|| {
                q.push(req(next));
                next += 1;
                black_box(q.try_pop().expect("non-empty"))
            });
        });
        group.bench_with_input(BenchmarkId::new("crossbeam", depth), &depth, |b, &depth| {
            let (tx, rx) = crossbeam_channel::unbounded();
            for id in 0..depth {
                tx.send(req(id)).expect("open");
            }
            let mut next = depth;
            b.iter(|| {
                tx.send(req(next)).expect("open");
                next += 1;
                black_box(rx.try_recv().expect("non-empty"))
            });
        });
    }
    group.finish();
}

/// Remove one request by id and enqueue a replacement, so the depth stays put.
fn remove(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue/remove+enqueue");
    configure(&mut group);
    group.throughput(Throughput::Elements(1));
    let depth = deep();
    group.bench_with_input(BenchmarkId::new("kvbm", depth), &depth, |b, &depth| {
        let q = kvbm_queue();
        for id in 0..depth {
            q.enqueue(req(id)).expect("fresh id");
        }
        let (mut oldest, mut next) = (0, depth);
        b.iter(|| {
            black_box(q.remove(oldest).expect("queued"));
            q.enqueue(req(next)).expect("fresh id");
            oldest += 1;
            next += 1;
        });
    });
    group.bench_with_input(BenchmarkId::new("heap", depth), &depth, |b, &depth| {
        let q = HeapQueue::default();
        for id in 0..depth {
            q.push(req(id));
        }
        let (mut oldest, mut next) = (0, depth);
        b.iter(|| {
            assert!(q.remove(oldest));
            q.push(req(next));
            oldest += 1;
            next += 1;
        });
    });
    group.finish();
}

/// Select 256 requests (every one fits the budget) and put them all back, so
/// the queue is the same for the next iteration.
fn select_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue/select_batch_256+restore");
    configure(&mut group);
    group.throughput(Throughput::Elements(256));
    let depth = deep();
    let budget = 256 * 4;
    group.bench_with_input(BenchmarkId::new("kvbm", depth), &depth, |b, &depth| {
        let q = kvbm_queue();
        for id in 0..depth {
            q.enqueue(req(id)).expect("fresh id");
        }
        b.iter(|| {
            let batch = q.select_batch(256, budget);
            assert_eq!(batch.len(), 256);
            for admitted in batch {
                q.restore(admitted).expect("restorable");
            }
        });
    });
    group.bench_with_input(BenchmarkId::new("heap", depth), &depth, |b, &depth| {
        let q = HeapQueue::default();
        for id in 0..depth {
            q.push(req(id));
        }
        b.iter(|| {
            let batch = q.select(256, budget);
            assert_eq!(batch.len(), 256);
            q.restore(batch);
        });
    });
    group.finish();
}

/// Requests per measured iteration of the MPMC group (divisible by 1, 2, 4).
const MPMC_ITEMS: u64 = 1_200;

/// One side of the MPMC comparison: how producers push, how consumers take,
/// and how the end is signalled.
trait Mpmc: Sync {
    /// What each producer thread holds (a sender clone, or a reference).
    type Producer<'a>: Send
    where
        Self: 'a;
    fn producer(&self) -> Self::Producer<'_>;
    fn push(producer: &Self::Producer<'_>, id: u64);
    /// Takes one item, blocking; `false` once the end was signalled and
    /// everything was taken.
    fn pop(&self) -> bool;
    /// Called after every producer finished (and dropped its handle).
    fn finish(&self);
}

impl Mpmc for RequestQueue<Req> {
    type Producer<'a> = &'a RequestQueue<Req>;
    fn producer(&self) -> &RequestQueue<Req> {
        self
    }
    fn push(queue: &&RequestQueue<Req>, id: u64) {
        queue.enqueue(req(id)).expect("fresh id");
    }
    fn pop(&self) -> bool {
        self.dequeue().is_ok()
    }
    fn finish(&self) {
        self.close();
    }
}

impl Mpmc for HeapQueue {
    type Producer<'a> = &'a HeapQueue;
    fn producer(&self) -> &HeapQueue {
        self
    }
    fn push(queue: &&HeapQueue, id: u64) {
        queue.push(req(id));
    }
    fn pop(&self) -> bool {
        HeapQueue::pop(self).is_some()
    }
    fn finish(&self) {
        self.close();
    }
}

/// crossbeam's own benchmark shape: each producer owns a sender clone; the
/// channel disconnects when the last one (the original, taken in `finish`)
/// is dropped.
struct Channel {
    tx: Mutex<Option<crossbeam_channel::Sender<Req>>>,
    rx: crossbeam_channel::Receiver<Req>,
}

impl Channel {
    fn new() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Self {
            tx: Mutex::new(Some(tx)),
            rx,
        }
    }
}

impl Mpmc for Channel {
    type Producer<'a> = crossbeam_channel::Sender<Req>;
    fn producer(&self) -> crossbeam_channel::Sender<Req> {
        self.tx
            .lock()
            .expect("not poisoned")
            .clone()
            .expect("not finished")
    }
    fn push(tx: &crossbeam_channel::Sender<Req>, id: u64) {
        tx.send(req(id)).expect("connected");
    }
    fn pop(&self) -> bool {
        self.rx.recv().is_ok()
    }
    fn finish(&self) {
        self.tx.lock().expect("not poisoned").take();
    }
}

/// crossbeam plus a concurrent set of queued ids: what duplicate rejection
/// alone costs (see the module docs).
struct IdSetChannel {
    ids: dashmap::DashSet<u64, foldhash::fast::RandomState>,
    channel: Channel,
}

impl Mpmc for IdSetChannel {
    type Producer<'a> = (
        &'a dashmap::DashSet<u64, foldhash::fast::RandomState>,
        crossbeam_channel::Sender<Req>,
    );
    fn producer(&self) -> Self::Producer<'_> {
        (&self.ids, self.channel.producer())
    }
    fn push((ids, tx): &Self::Producer<'_>, id: u64) {
        assert!(ids.insert(id), "fresh id");
        tx.send(req(id)).expect("connected");
    }
    fn pop(&self) -> bool {
        match self.channel.rx.recv() {
            Ok(taken) => {
                assert!(self.ids.remove(&taken.id).is_some(), "queued id");
                true
            }
            Err(_) => false,
        }
    }
    fn finish(&self) {
        self.channel.finish();
    }
}

/// Runs `producers` threads that push `total` items between them and
/// `consumers` threads that take them until the end. Returns the wall time
/// from the first spawn to the last join.
fn mpmc_run<Q: Mpmc>(queue: &Q, producers: u64, consumers: u64, total: u64) -> Duration {
    let per_producer = total / producers;
    let start = Instant::now();
    thread::scope(|s| {
        let takers: Vec<_> = (0..consumers)
            .map(|_| {
                s.spawn(|| {
                    let mut taken = 0u64;
                    while queue.pop() {
                        taken += 1;
                    }
                    taken
                })
            })
            .collect();
        let givers: Vec<_> = (0..producers)
            .map(|p| {
                let producer = queue.producer();
                s.spawn(move || {
                    for i in 0..per_producer {
                        Q::push(&producer, p * per_producer + i);
                    }
                })
            })
            .collect();
        for giver in givers {
            giver.join().expect("producer");
        }
        queue.finish();
        let taken: u64 = takers
            .into_iter()
            .map(|t| t.join().expect("consumer"))
            .sum();
        assert_eq!(taken, per_producer * producers);
    });
    start.elapsed()
}

fn mpmc(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue/mpmc");
    configure(&mut group);
    group.sample_size(10);
    group.throughput(Throughput::Elements(MPMC_ITEMS));
    for producers in [1u64, 2, 4] {
        for consumers in [1u64, 2, 4] {
            let shape = format!("{producers}p{consumers}c");
            let total = |iters: u64| iters * MPMC_ITEMS;
            group.bench_function(BenchmarkId::new("kvbm", &shape), |b| {
                b.iter_custom(|iters| mpmc_run(&kvbm_queue(), producers, consumers, total(iters)));
            });
            group.bench_function(BenchmarkId::new("crossbeam", &shape), |b| {
                b.iter_custom(|iters| {
                    mpmc_run(&Channel::new(), producers, consumers, total(iters))
                });
            });
            group.bench_function(BenchmarkId::new("crossbeam+idset", &shape), |b| {
                b.iter_custom(|iters| {
                    let floor = IdSetChannel {
                        ids: dashmap::DashSet::with_hasher(Default::default()),
                        channel: Channel::new(),
                    };
                    mpmc_run(&floor, producers, consumers, total(iters))
                });
            });
            group.bench_function(BenchmarkId::new("heap", &shape), |b| {
                b.iter_custom(|iters| {
                    mpmc_run(&HeapQueue::default(), producers, consumers, total(iters))
                });
            });
        }
    }
    group.finish();
}

/// Requests a batch consumer takes at most at a time (vLLM's default
/// `max_num_seqs`).
const BATCH: usize = 256;

/// The scheduler's side of a queue: take up to [`BATCH`] requests without
/// blocking, and report how many came.
trait BatchConsumer: Sync {
    fn push(&self, id: u64);
    fn take_batch(&self) -> usize;
}

impl BatchConsumer for RequestQueue<Req> {
    fn push(&self, id: u64) {
        self.enqueue(req(id)).expect("fresh id");
    }
    fn take_batch(&self) -> usize {
        self.select_batch(BATCH, u64::MAX).len()
    }
}

impl BatchConsumer for HeapQueue {
    fn push(&self, id: u64) {
        HeapQueue::push(self, req(id));
    }
    fn take_batch(&self) -> usize {
        self.select(BATCH, u64::MAX).len()
    }
}

/// A bare channel: producers share one sender (no lock; `Sender` is `Sync`).
type Pipe = (
    crossbeam_channel::Sender<Req>,
    crossbeam_channel::Receiver<Req>,
);

impl BatchConsumer for Pipe {
    fn push(&self, id: u64) {
        self.0.send(req(id)).expect("connected");
    }
    fn take_batch(&self) -> usize {
        self.1.try_iter().take(BATCH).count()
    }
}

/// `producers` threads push `total` requests between them while one
/// consumer takes batches until they are done and everything is taken (it
/// yields when it finds nothing, as a scheduler between steps would wait).
fn batch_run<Q: BatchConsumer>(queue: &Q, producers: u64, total: u64) -> Duration {
    use std::sync::atomic::{AtomicBool, Ordering};
    let per_producer = total / producers;
    let done = AtomicBool::new(false);
    let start = Instant::now();
    thread::scope(|s| {
        let taker = s.spawn(|| {
            let mut taken = 0u64;
            loop {
                let got = queue.take_batch();
                taken += got as u64;
                if got == 0 {
                    // Every push happened before `done` was set: looks after
                    // seeing it find whatever is left, and count it (a batch
                    // found here used to be dropped from the count).
                    if done.load(Ordering::Acquire) {
                        match queue.take_batch() {
                            0 => return taken,
                            last => taken += last as u64,
                        }
                        continue;
                    }
                    thread::yield_now();
                }
            }
        });
        let givers: Vec<_> = (0..producers)
            .map(|p| {
                s.spawn(move || {
                    for i in 0..per_producer {
                        queue.push(p * per_producer + i);
                    }
                })
            })
            .collect();
        for giver in givers {
            giver.join().expect("producer");
        }
        done.store(true, Ordering::Release);
        assert_eq!(taker.join().expect("consumer"), per_producer * producers);
    });
    start.elapsed()
}

fn batch_consumer(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue/batch_consumer");
    configure(&mut group);
    group.sample_size(10);
    group.throughput(Throughput::Elements(MPMC_ITEMS));
    for producers in [1u64, 2, 4] {
        let shape = format!("{producers}p");
        let total = |iters: u64| iters * MPMC_ITEMS;
        group.bench_function(BenchmarkId::new("kvbm", &shape), |b| {
            b.iter_custom(|iters| batch_run(&kvbm_queue(), producers, total(iters)));
        });
        group.bench_function(BenchmarkId::new("crossbeam", &shape), |b| {
            b.iter_custom(|iters| {
                batch_run(&crossbeam_channel::unbounded(), producers, total(iters))
            });
        });
        group.bench_function(BenchmarkId::new("heap", &shape), |b| {
            b.iter_custom(|iters| batch_run(&HeapQueue::default(), producers, total(iters)));
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    enqueue_dequeue,
    remove,
    select_batch,
    mpmc,
    batch_consumer
);
criterion_main!(benches);
