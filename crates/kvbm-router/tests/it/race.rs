//! Workers added and removed while others apply events, route and audit:
//! the router's worker list, counters and index stay one consistent state.
//! Every racing thread reports on a channel the test waits on with a
//! deadline, so a deadlock fails the test instead of hanging it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use kvbm_router::{Router, RouterError, WorkerId};

use crate::stored;

/// How long a racing test may take before it counts as hung.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `threads` on threads of their own and waits for all of them, at
/// most [`DEADLINE`] in all; the first failure (an error, a panic or the
/// deadline) fails the test.
fn race(threads: Vec<Box<dyn FnOnce() -> Result<(), String> + Send>>) {
    let (done, results) = mpsc::channel();
    let count = threads.len();
    for (i, body) in threads.into_iter().enumerate() {
        let done = done.clone();
        thread::spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                .unwrap_or_else(|_| Err("panicked".to_owned()));
            let _ = done.send((i, result));
        });
    }
    let started = std::time::Instant::now();
    for _ in 0..count {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match results.recv_timeout(left) {
            Ok((_, Ok(()))) => {}
            Ok((i, Err(error))) => panic!("thread {i}: {error}"),
            Err(_) => panic!("racing threads still running after {DEADLINE:?}: deadlock?"),
        }
    }
}

/// A health check removes a worker while discovery adds it back, over and
/// over: every time, the worker discovery added must be whole (listed,
/// counted, taking events), and the block it stored right after its
/// re-add must survive the removal that preceded it.
#[test]
fn a_worker_readded_while_its_removal_finishes_is_whole() {
    const ROUNDS: u64 = 10_000;
    const WORKER: WorkerId = 7;
    /// Bystanders, whose events keep the workers map's shards and the
    /// index busy (as a fleet's do) so the removal's steps interleave
    /// with the re-add's.
    const BYSTANDERS: std::ops::Range<WorkerId> = 100..132;
    let router = Arc::new(Router::new());
    router.add_worker(WORKER).unwrap();
    for bystander in BYSTANDERS {
        router.add_worker(bystander).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(2));
    let done = Arc::new(Barrier::new(2));
    let checked = Arc::new(Barrier::new(2));
    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let remover: Box<dyn FnOnce() -> Result<(), String> + Send> = {
        let (router, start, done, checked, failed, stop) = (
            Arc::clone(&router),
            Arc::clone(&start),
            Arc::clone(&done),
            Arc::clone(&checked),
            Arc::clone(&failed),
            Arc::clone(&stop),
        );
        Box::new(move || {
            for round in 0..ROUNDS {
                start.wait();
                let removed = router.remove_worker(WORKER);
                done.wait();
                // Quiescent: the adder has re-added the worker and stored
                // `round` on it.
                let verdict = check_readded(&router, WORKER, round, removed);
                let failing = verdict.is_err();
                if let Err(error) = verdict {
                    *failed.lock().unwrap() = Some(error);
                }
                checked.wait();
                if failing {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            failed.lock().unwrap().take().map_or(Ok(()), Err)
        })
    };
    let adder: Box<dyn FnOnce() -> Result<(), String> + Send> = {
        let (router, failed) = (Arc::clone(&router), Arc::clone(&failed));
        Box::new(move || {
            for round in 0..ROUNDS {
                start.wait();
                // Discovery retries until the removal has gone far enough
                // to let the worker in again.
                let mut tries = 0u64;
                while router.add_worker(WORKER) == Err(RouterError::DuplicateWorker(WORKER)) {
                    tries += 1;
                    if tries > 100_000_000 {
                        return Err(format!("round {round}: the worker was never removed"));
                    }
                    std::hint::spin_loop();
                }
                // Its first block after the re-add (refused if the worker
                // is a zombie already; the check below sees it).
                let _ = router.apply(WORKER, &stored(&[round]));
                done.wait();
                checked.wait();
                if failed.lock().unwrap().is_some() {
                    break;
                }
            }
            Ok(())
        })
    };
    let busy = |first: WorkerId| -> Box<dyn FnOnce() -> Result<(), String> + Send> {
        let (router, stop) = (Arc::clone(&router), Arc::clone(&stop));
        Box::new(move || {
            // Keys no round stores on the worker under test.
            let keys: Vec<u64> = (1 << 40..(1 << 40) + 64).collect();
            let request: Vec<u128> = keys.iter().map(|&k| u128::from(k)).collect();
            let mut bystander = first;
            while !stop.load(Ordering::Relaxed) {
                router
                    .apply(bystander, &stored(&keys))
                    .map_err(|e| e.to_string())?;
                router.index().overlaps(&request);
                bystander = if bystander + 1 < BYSTANDERS.end {
                    bystander + 1
                } else {
                    BYSTANDERS.start
                };
            }
            Ok(())
        })
    };
    race(vec![remover, adder, busy(BYSTANDERS.start)]);
}

/// After a remove racing a re-add: the worker is listed, has counters,
/// takes events, and holds exactly the block stored after the re-add.
fn check_readded(
    router: &Router,
    worker: WorkerId,
    round: u64,
    removed: Result<(), RouterError>,
) -> Result<(), String> {
    let fail = |what: String| Err(format!("round {round}: {what}"));
    if removed.is_err() {
        return fail(format!("removing the listed worker failed: {removed:?}"));
    }
    if !router.workers().contains(&worker) {
        return fail(format!("workers {:?}", router.workers()));
    }
    let Some(stats) = router.stats(worker) else {
        return fail("listed but without counters (a zombie)".to_owned());
    };
    if router.index().held(worker) != 1 || stats.held_blocks != 1 {
        return fail(format!(
            "the block stored after the re-add: index holds {}, counters say {}",
            router.index().held(worker),
            stats.held_blocks
        ));
    }
    let key = u128::from(round);
    if router.index().overlaps(&[key]) != [(worker, 1)] {
        return fail(format!("overlaps {:?}", router.index().overlaps(&[key])));
    }
    if let Err(error) = router.apply(worker, &stored(&[u64::MAX])) {
        return fail(format!("a listed worker refuses events: {error}"));
    }
    if router.index().held(worker) != 2 {
        return fail("an accepted event stored nothing".to_owned());
    }
    router
        .audit()
        .map(drop)
        .or_else(|error| fail(error.to_string()))
}

/// A tiny seeded generator (xorshift64*), one per thread.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Workers only their owner thread stores to and removes from, never
/// removed: what they hold at the end is exactly their owner's log.
const STABLE: [WorkerId; 2] = [0, 1];
/// Workers every churning thread adds, removes, stores to, removes from
/// and clears at random.
const CHURNED: [WorkerId; 3] = [2, 3, 4];
const PHASES: usize = 20;
const OPS_PER_PHASE: usize = 2_000;

fn churned_event(draws: &mut Draws) -> kvbm_events::KvEvent {
    let keys: Vec<u64> = (0..1 + draws.below(4)).map(|_| draws.below(16)).collect();
    let medium = [None, Some("GPU"), Some("CPU")][draws.below(3) as usize];
    match draws.below(8) {
        0 => kvbm_events::KvEvent::AllBlocksCleared,
        1..=3 => {
            let mut removed = kvbm_events::BlockRemoved::new(
                keys.into_iter().map(kvbm_events::BlockHash::Int).collect(),
            );
            removed.medium = medium.map(str::to_owned);
            kvbm_events::KvEvent::BlockRemoved(removed)
        }
        _ => {
            let mut event = stored(&keys);
            if let kvbm_events::KvEvent::BlockStored(stored) = &mut event {
                stored.medium = medium.map(str::to_owned);
            }
            event
        }
    }
}

/// Many threads add, remove, store, evict, clear, batch and route on a few
/// workers at once, auditing as they go (the audit holds at any moment),
/// and at quiescent points between phases every thread checks its part:
/// the router's live workers are exactly those with counters and a set in
/// the index, counters agree with the index, a stable worker holds exactly
/// what its owner's log says (nothing lost to the churn next door), and a
/// churned worker that is live takes a fresh block and credits it.
#[test]
fn concurrent_churn_events_and_routes_stay_consistent() {
    let router = Arc::new(Router::new());
    for worker in STABLE {
        router.add_worker(worker).unwrap();
    }
    let threads = STABLE.len() + 3;
    let phase_end = Arc::new(Barrier::new(threads));
    let phase_checked = Arc::new(Barrier::new(threads));
    type Body = Box<dyn FnOnce() -> Result<(), String> + Send>;
    let mut bodies: Vec<Body> = Vec::new();
    // Owners of the stable workers: stores and removals, single and
    // batched, on the device medium and the CPU, logged.
    for worker in STABLE {
        let (router, phase_end, phase_checked) = (
            Arc::clone(&router),
            Arc::clone(&phase_end),
            Arc::clone(&phase_checked),
        );
        bodies.push(Box::new(move || {
            let mut draws = Draws(0x9e37_79b9 + worker);
            let mut log: [std::collections::BTreeSet<u64>; 2] = Default::default();
            let media = [None, Some("CPU")];
            for phase in 0..PHASES {
                for _ in 0..OPS_PER_PHASE {
                    let on = draws.below(2) as usize;
                    let keys: Vec<u64> = (0..1 + draws.below(3)).map(|_| draws.below(64)).collect();
                    let event = if draws.below(3) == 0 {
                        keys.iter().for_each(|k| {
                            log[on].remove(k);
                        });
                        let mut removed = kvbm_events::BlockRemoved::new(
                            keys.into_iter().map(kvbm_events::BlockHash::Int).collect(),
                        );
                        removed.medium = media[on].map(str::to_owned);
                        kvbm_events::KvEvent::BlockRemoved(removed)
                    } else {
                        log[on].extend(&keys);
                        let mut event = stored(&keys);
                        if let kvbm_events::KvEvent::BlockStored(stored) = &mut event {
                            stored.medium = media[on].map(str::to_owned);
                        }
                        event
                    };
                    if draws.below(4) == 0 {
                        let batch = kvbm_events::KvEventBatch::new(0.0, vec![event.clone(), event]);
                        router.apply_batch(worker, &batch)
                    } else {
                        router.apply(worker, &event)
                    }
                    .map_err(|e| format!("stable worker {worker} refused: {e}"))?;
                }
                phase_end.wait();
                // Quiescent: nothing lost.
                for (on, held) in log.iter().enumerate() {
                    let indexed = router.index().held_on(worker, media[on]);
                    if indexed != held.len() {
                        return Err(format!(
                            "phase {phase}: worker {worker} holds {indexed} blocks on {:?}, its log {}",
                            media[on],
                            held.len()
                        ));
                    }
                }
                let prefix: Vec<u128> = (0..64).take_while(|k| log[0].contains(k)).map(u128::from).collect();
                let credited = router.index().overlaps(&prefix).into_iter().find(|&(w, _)| w == worker);
                if !prefix.is_empty() && credited != Some((worker, prefix.len())) {
                    return Err(format!("phase {phase}: worker {worker} credited {credited:?}"));
                }
                phase_checked.wait();
            }
            Ok(())
        }));
    }
    // Churners: anything goes on the churned workers; the first of them
    // also checks the router as a whole at quiescent points.
    for churner in 0..2u64 {
        let (router, phase_end, phase_checked) = (
            Arc::clone(&router),
            Arc::clone(&phase_end),
            Arc::clone(&phase_checked),
        );
        bodies.push(Box::new(move || {
            let mut draws = Draws(0x5851_f42d + churner);
            for phase in 0..PHASES {
                for _ in 0..OPS_PER_PHASE {
                    let worker = CHURNED[draws.below(CHURNED.len() as u64) as usize];
                    let result = match draws.below(10) {
                        0 => router.add_worker(worker),
                        1 => router.remove_worker(worker),
                        2 => router.clear_worker(worker),
                        3 => router.set_load(worker, kvbm_router::WorkerLoad::default()),
                        4 => {
                            let events = (0..3).map(|_| churned_event(&mut draws)).collect();
                            router.apply_batch(worker, &kvbm_events::KvEventBatch::new(0.0, events))
                        }
                        _ => router.apply(worker, &churned_event(&mut draws)),
                    };
                    match result {
                        Ok(())
                        | Err(RouterError::UnknownWorker(_) | RouterError::DuplicateWorker(_)) => {}
                        Err(error) => return Err(format!("churned worker {worker}: {error}")),
                    }
                }
                phase_end.wait();
                if churner == 0 {
                    check_quiescent(&router, phase)?;
                }
                phase_checked.wait();
            }
            Ok(())
        }));
    }
    // A router: routes and audits while everything else goes on.
    {
        let (router, phase_end, phase_checked) = (
            Arc::clone(&router),
            Arc::clone(&phase_end),
            Arc::clone(&phase_checked),
        );
        bodies.push(Box::new(move || {
            let keys: Vec<u128> = (0..16).collect();
            let mut policy = kvbm_router::KvAware::new(1);
            for phase in 0..PHASES {
                for _ in 0..OPS_PER_PHASE / 10 {
                    let request = kvbm_router::RouteRequest::new(&keys, 256, 16);
                    let candidates = router.candidates(&request);
                    let listed: Vec<WorkerId> = candidates.iter().map(|c| c.worker).collect();
                    if !STABLE.iter().all(|w| listed.contains(w)) || !listed.is_sorted() {
                        return Err(format!("phase {phase}: candidates {listed:?}"));
                    }
                    if router.route(&request, &mut policy).is_none() {
                        return Err("no route with stable workers live".to_owned());
                    }
                    router
                        .audit()
                        .map_err(|e| format!("phase {phase}, mid-flight: {e}"))?;
                }
                phase_end.wait();
                phase_checked.wait();
            }
            Ok(())
        }));
    }
    race(bodies);
    check_quiescent(&router, PHASES).unwrap();
}

/// The router as a whole, with nothing in flight.
fn check_quiescent(router: &Router, phase: usize) -> Result<(), String> {
    let fail = |what: String| format!("after phase {phase}: {what}");
    let audit = router.audit().map_err(|e| fail(e.to_string()))?;
    let listed = router.workers();
    let with_stats: Vec<WorkerId> = (0..8).filter(|&w| router.stats(w).is_some()).collect();
    if listed != with_stats || audit.workers != listed.len() {
        return Err(fail(format!(
            "workers {listed:?}, with counters {with_stats:?}"
        )));
    }
    let mut held = 0;
    for &worker in &listed {
        let counted = router.stats(worker).map_or(0, |s| s.held_blocks);
        if counted != router.index().held(worker) {
            return Err(fail(format!(
                "worker {worker}: counters {counted}, index {}",
                router.index().held(worker)
            )));
        }
        held += counted;
    }
    if held != audit.held_blocks {
        return Err(fail(format!("held {held}, audit {}", audit.held_blocks)));
    }
    for worker in (0..8).filter(|w| !listed.contains(w)) {
        if router.index().held(worker) != 0 {
            return Err(fail(format!("departed worker {worker} still holds blocks")));
        }
    }
    // Every live churned worker takes a fresh block and is credited for it.
    let fresh = 1_000 + phase as u64;
    for &worker in CHURNED.iter().filter(|w| listed.contains(w)) {
        let before = router.index().held(worker);
        router
            .apply(worker, &stored(&[fresh]))
            .map_err(|e| fail(format!("live worker {worker} refuses events: {e}")))?;
        if router.index().held(worker) != before + 1
            || router
                .index()
                .overlaps(&[u128::from(fresh)])
                .iter()
                .all(|&(w, _)| w != worker)
        {
            return Err(fail(format!("worker {worker} lost its fresh block")));
        }
    }
    router.audit().map(drop).map_err(|e| fail(e.to_string()))
}

/// Load reports from several threads per worker while others route: a
/// route reads loads without locking them, and must still see each
/// worker's load as one whole report (every report here has equal fields,
/// so a torn one shows), and after the reports each worker's last one.
#[test]
fn routes_racing_load_reports_see_whole_reports() {
    const WORKERS: u64 = 8;
    const REPORTS: u64 = 20_000;
    let router = Arc::new(Router::new());
    for worker in 0..WORKERS {
        router.add_worker(worker).expect("fresh worker");
    }
    let report = |k: u64| kvbm_router::WorkerLoad::new(k, k, k);
    let reporters_left = Arc::new(std::sync::atomic::AtomicUsize::new(2));
    let mut threads: Vec<Box<dyn FnOnce() -> Result<(), String> + Send>> = Vec::new();
    // Two reporters for every worker, one counting up to REPORTS, one
    // down to REPORTS + 1.
    for up in [true, false] {
        let (router, left) = (Arc::clone(&router), Arc::clone(&reporters_left));
        threads.push(Box::new(move || {
            for i in 1..=REPORTS {
                let k = if up { i } else { 2 * REPORTS + 1 - i };
                for worker in 0..WORKERS {
                    router
                        .set_load(worker, report(k))
                        .map_err(|e| e.to_string())?;
                }
            }
            left.fetch_sub(1, Ordering::Relaxed);
            Ok(())
        }));
    }
    for _ in 0..2 {
        let (router, left) = (Arc::clone(&router), Arc::clone(&reporters_left));
        threads.push(Box::new(move || {
            let request = kvbm_router::RouteRequest::new(&[], 16, 16);
            while left.load(Ordering::Relaxed) > 0 {
                for candidate in router.candidates(&request) {
                    if candidate.load != report(candidate.load.active_blocks) {
                        return Err(format!("a torn load: {candidate:?}"));
                    }
                }
            }
            Ok(())
        }));
    }
    race(threads);
    let last = [report(REPORTS), report(REPORTS + 1)];
    for candidate in router.candidates(&kvbm_router::RouteRequest::new(&[], 16, 16)) {
        assert!(
            last.contains(&candidate.load),
            "not a last report: {candidate:?}"
        );
    }
}
