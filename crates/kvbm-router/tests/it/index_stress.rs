//! The prefix index under many threads at once: owners storing and
//! evicting their workers' blocks, churners clearing, removing and
//! re-adding theirs (so slots retire, get swept and are reused while
//! lookups run), and readers looking up all along. Nothing is lost, no
//! worker is ever credited with blocks it never stored, and at the end the
//! index holds exactly what each worker's own log says.
//!
//! Every thread reports on a channel the test waits on with a deadline, so
//! a deadlock fails the test instead of hanging it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use kvbm_router::{PrefixIndex, WorkerId};

/// How long the threads may take before the test counts them as hung.
const DEADLINE: Duration = Duration::from_secs(120);

/// Stable workers: they hold the shared chain throughout (stored before
/// the threads start, never evicted) and churn private keys of their own.
const STABLE: u64 = 160;
/// Churned workers: cleared, removed and re-added all along; they never
/// store the shared chain.
const CHURNED: std::ops::Range<u64> = 10_000..10_064;
/// Threads owning the stable workers, churning, reading.
const OWNERS: u64 = 2;
const CHURNERS: u64 = 2;
const READERS: usize = 2;
const ROUNDS: u64 = 6_000;

/// The chain every stable worker holds: no one else ever stores it.
fn shared() -> Vec<u128> {
    (0..16).map(|i| (1u128 << 100) + i).collect()
}

/// Private key `i` of `worker`.
fn private(worker: WorkerId, i: u64) -> u128 {
    (u128::from(worker) << 32) | u128::from(i)
}

type Body = Box<dyn FnOnce() -> Result<Log, String> + Send>;

/// What a thread left each of its workers holding: on the device, and on
/// the CPU.
type Log = BTreeMap<WorkerId, [BTreeSet<u128>; 2]>;

/// Runs `bodies` on threads of their own and waits for all of them, at
/// most [`DEADLINE`] in all; their logs, merged.
fn run(bodies: Vec<Body>) -> Log {
    let (done, results) = mpsc::channel();
    let count = bodies.len();
    for (i, body) in bodies.into_iter().enumerate() {
        let done = done.clone();
        thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                .unwrap_or_else(|_| Err("panicked".to_owned()));
            let _ = done.send((i, result));
        });
    }
    let started = Instant::now();
    let mut merged = Log::new();
    for _ in 0..count {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match results.recv_timeout(left) {
            Ok((_, Ok(log))) => merged.extend(log),
            Ok((i, Err(error))) => panic!("thread {i}: {error}"),
            Err(_) => panic!("threads still running after {DEADLINE:?}: deadlock?"),
        }
    }
    merged
}

/// A tiny seeded generator (xorshift64*), one per thread.
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Owners: each of their stable workers stores and evicts private keys,
/// on the device (keys 0..32) and the CPU (32..64), checking every result
/// against its log.
fn owner(index: Arc<PrefixIndex>, owner: u64, finished: Arc<AtomicUsize>) -> Body {
    Box::new(move || {
        let mut draws = Draws(0x9e37_79b9 + owner);
        let mut log = Log::new();
        for worker in (owner..STABLE).step_by(OWNERS as usize) {
            log.entry(worker).or_default()[0].extend(shared());
        }
        let media = [None, Some("CPU")];
        for _ in 0..ROUNDS {
            let worker = owner + OWNERS * draws.below(STABLE / OWNERS);
            let on = draws.below(2) as usize;
            let keys: Vec<u128> = (0..1 + draws.below(4))
                .map(|_| private(worker, 32 * on as u64 + draws.below(32)))
                .collect();
            let held = &mut log.entry(worker).or_default()[on];
            if draws.below(3) == 0 {
                let distinct: BTreeSet<u128> = keys.iter().copied().collect();
                let expected = distinct.iter().filter(|k| held.remove(k)).count();
                let removed = index.remove_many_on(worker, media[on], keys);
                if removed != expected {
                    return Err(format!("worker {worker} evicted {removed}, log {expected}"));
                }
            } else {
                let expected = keys.iter().filter(|&&k| held.insert(k)).count();
                let stored = index.insert_many_on(worker, media[on], keys);
                if stored != Ok(expected) {
                    return Err(format!("worker {worker} stored {stored:?}, log {expected}"));
                }
            }
        }
        finished.fetch_add(1, Ordering::Release);
        Ok(log)
    })
}

/// Churners: their own churned workers stored to, cleared, removed (and
/// so re-added by their next store), checking every result against their
/// log.
fn churner(index: Arc<PrefixIndex>, churner: u64, finished: Arc<AtomicUsize>) -> Body {
    Box::new(move || {
        let mut draws = Draws(0x5851_f42d + churner);
        let mut log = Log::new();
        let mine: Vec<WorkerId> = CHURNED.filter(|w| w % CHURNERS == churner).collect();
        for _ in 0..ROUNDS {
            let worker = mine[draws.below(mine.len() as u64) as usize];
            let held = &mut log.entry(worker).or_default()[0];
            match draws.below(8) {
                0 => {
                    let removed = index.remove_worker(worker);
                    if removed != held.len() {
                        return Err(format!("removed {worker}: {removed}, log {}", held.len()));
                    }
                    log.remove(&worker);
                }
                1 => {
                    let cleared = index.clear_worker(worker);
                    if cleared != held.len() {
                        return Err(format!("cleared {worker}: {cleared}, log {}", held.len()));
                    }
                    held.clear();
                }
                _ => {
                    let keys: Vec<u128> = (0..1 + draws.below(8))
                        .map(|_| private(worker, draws.below(16)))
                        .collect();
                    let expected = keys.iter().filter(|&&k| held.insert(k)).count();
                    let stored = index.insert_many(worker, keys);
                    if stored != expected {
                        return Err(format!("worker {worker} stored {stored}, log {expected}"));
                    }
                }
            }
        }
        finished.fetch_add(1, Ordering::Release);
        Ok(log)
    })
}

/// Readers, until every writer is done: the shared chain is always
/// exactly the stable workers' (a churned worker credited with it would
/// be a recycled slot inheriting a stable worker's bits, or bits of a
/// worker gone).
fn reader(index: Arc<PrefixIndex>, writers: usize, finished: Arc<AtomicUsize>) -> Body {
    Box::new(move || {
        let chain = shared();
        let stable: Vec<(WorkerId, usize)> = (0..STABLE).map(|w| (w, chain.len())).collect();
        let ids: Vec<WorkerId> = (0..STABLE).collect();
        let mut lookups = 0u64;
        while finished.load(Ordering::Acquire) < writers || lookups < 10 {
            let seen = index.overlaps(&chain);
            if seen != stable {
                let strangers: Vec<_> = seen.iter().filter(|(w, _)| *w >= STABLE).collect();
                return Err(format!(
                    "the shared chain credited {strangers:?} ({} workers in all)",
                    seen.len()
                ));
            }
            if index.holders(chain[7]) != ids {
                return Err("the shared chain's holders changed".to_owned());
            }
            let tiered = index.tiered_overlaps(&[("CPU", 0.5)], &chain);
            let whole = |&(w, depth, credit): &(WorkerId, usize, f64)| {
                w < STABLE && depth == chain.len() && credit == 0.0
            };
            if tiered.len() != stable.len() || !tiered.iter().all(whole) {
                return Err(format!("tiered overlaps of the shared chain: {tiered:?}"));
            }
            lookups += 1;
        }
        Ok(Log::new())
    })
}

/// Owners, churners and readers at once; afterwards every worker holds
/// exactly its log, on each medium, and every key's holders are the logs'.
#[test]
fn many_threads_storing_churning_and_looking_up_lose_nothing() {
    let index = Arc::new(PrefixIndex::new());
    for worker in 0..STABLE {
        assert_eq!(index.insert_many(worker, shared()), shared().len());
    }
    let finished = Arc::new(AtomicUsize::new(0));
    let mut bodies: Vec<Body> = Vec::new();
    for n in 0..OWNERS {
        bodies.push(owner(Arc::clone(&index), n, Arc::clone(&finished)));
    }
    for n in 0..CHURNERS {
        bodies.push(churner(Arc::clone(&index), n, Arc::clone(&finished)));
    }
    let writers = bodies.len();
    for _ in 0..READERS {
        bodies.push(reader(Arc::clone(&index), writers, Arc::clone(&finished)));
    }
    let log = run(bodies);

    let mut holders: BTreeMap<u128, BTreeSet<WorkerId>> = BTreeMap::new();
    let mut distinct: BTreeSet<u128> = BTreeSet::new();
    for (&worker, [device, cpu]) in &log {
        assert_eq!(index.held_on(worker, None), device.len(), "worker {worker}");
        assert_eq!(
            index.held_on(worker, Some("CPU")),
            cpu.len(),
            "worker {worker}"
        );
        for &key in device {
            holders.entry(key).or_default().insert(worker);
        }
        distinct.extend(device.iter().chain(cpu));
    }
    for worker in CHURNED.filter(|w| !log.contains_key(w)) {
        assert_eq!(index.held(worker), 0, "removed worker {worker}");
    }
    assert_eq!(index.len(), distinct.len());
    for (key, workers) in holders {
        let found: BTreeSet<WorkerId> = index.holders(key).into_iter().collect();
        assert_eq!(found, workers, "key {key:#x}");
    }
    let chain = shared();
    let stable: Vec<(WorkerId, usize)> = (0..STABLE).map(|w| (w, chain.len())).collect();
    assert_eq!(index.overlaps(&chain), stable);
}
