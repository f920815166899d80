//! Cluster mode: the trace's arrivals routed over N engines, each a real
//! [`Scheduler`](kvbm_queue::Scheduler) with its own block pool (serve mode's engine and step-time
//! model), behind a [`kvbm_router::Router`].
//!
//! Each engine's cache events reach the router the way they would cross the
//! wire, minus the socket: the pool's subscription, keyed in [`WireFormat`]'s
//! hash form, applied by [`Router::apply_message`] (the same index as
//! [`Router::apply`] of vLLM's `KvEvent`s, without building them). After
//! each of its steps an engine reports its load (active blocks, prompt
//! tokens not yet prefilled, running requests) when it changed, and again
//! after each request routed to it, so a burst of arrivals does not all go
//! to the engine that looked idlest.
//!
//! Simulated time is discrete-event: the next thing to happen is either an
//! arrival or the step of the engine whose clock is furthest behind. An
//! arrival is routed once no engine can start a step before it; it sees the
//! events of steps that began before it (at most one step of lookahead per
//! engine).
//!
//! Request keys are the engines' chained block hashes of the prompt's full
//! blocks (`kvbm_sequence`'s, unsalted), sent as 64-bit integers.

mod config;
mod global_kv;
mod memory;
mod plot;
mod report;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_replicate;
#[cfg(test)]
mod tests_tiers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::iter::{IntoParallelRefIterator, IntoParallelRefMutIterator, ParallelIterator};

use kvbm_blocks::{BlockManager, EventMessage};
use kvbm_events::{HashForm, WireFormat};
use kvbm_router::{PrefixIndex, RouteRequest, Router, WorkerId, WorkerLoad, block_key};
use kvbm_sequence::{HashedPrompt, Salt};
use kvbm_tiers::Lower;

pub use self::config::{ClusterConfig, PolicyKind};
use self::global_kv::GlobalFeed;
pub use self::report::{ClusterReport, ClusterRun, ClusterTiers};
use super::serve::{ServeSim, SimPrompt, Simulated, shared_prompt};
#[cfg(test)]
use crate::ServeOutcome;
use crate::events::{EventTap, SUBSCRIPTION_CAPACITY};
use crate::{EventSink, SimError, Trace};

/// Replays `trace` (its [`replicate`](ClusterConfig::replicate) copies)
/// once per policy of `config`.
///
/// # Errors
///
/// [`ClusterConfig::validate`]'s errors ([`SimError::ZeroEngines`] for no
/// engines, [`SimError::ClusterTooLarge`] when all engines together would
/// hold more blocks than one pool may, among others);
/// [`SimError::ClusterMemory`] when the
/// [`memory_estimate`](ClusterConfig::memory_estimate) exceeds the
/// [`memory_budget`](ClusterConfig::memory_budget), before anything is
/// built; [`Trace::replicate`]'s errors for copies that cannot be made;
/// [`SimError::OutOfMemory`] if the machine refuses memory the estimate
/// allowed; as serve mode's replay for an engine that cannot be built or
/// stalls.
pub fn replay(trace: &Trace, config: &ClusterConfig) -> Result<ClusterReport, SimError> {
    let capacity_blocks = config.capacity_blocks()?;
    // The copies are checked before the estimate (which counts them) and
    // made after it.
    if config.replicate > 1 {
        trace.check_replicate(config.replicate)?;
    }
    let estimate_bytes = memory::estimate(config, capacity_blocks, trace);
    if estimate_bytes > config.memory_budget {
        return Err(SimError::ClusterMemory {
            engines: config.engines,
            capacity_blocks,
            estimate_bytes,
            budget_bytes: config.memory_budget,
        });
    }
    let replicated = match config.replicate {
        1 => None,
        copies => Some(trace.replicate(copies)?),
    };
    let trace = replicated.as_ref().unwrap_or(trace);
    let runs = (config.policies.iter())
        .map(|&policy| replay_policy(trace, config, capacity_blocks, policy))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterReport {
        engines: config.engines,
        replicate: config.replicate,
        block_size: config.engine.block_size,
        capacity_blocks,
        runs,
    })
}

impl ClusterReport {
    /// The policies compared as an SVG document (`--out`): mean TTFT and
    /// token hit rate per policy.
    ///
    /// # Errors
    ///
    /// [`SimError::Plot`] if the plot cannot be drawn.
    pub fn svg(&self) -> Result<String, SimError> {
        plot::policies_svg(self)
    }

    /// Writes `cluster.svg` ([`svg`](Self::svg)) and `cluster.json`
    /// ([`to_json`](Self::to_json)) into `dir`, creating it if missing;
    /// returns their paths.
    ///
    /// # Errors
    ///
    /// [`SimError::WriteOutput`] if a file cannot be written;
    /// [`SimError::Plot`] if the plot cannot be drawn.
    pub fn write_to(&self, dir: &Path) -> Result<[PathBuf; 2], SimError> {
        let (svg, json) = (dir.join("cluster.svg"), dir.join("cluster.json"));
        let (plot, report) = (self.svg()?, format!("{}\n", self.to_json()));
        crate::output::write_files(dir, &[(&svg, &plot), (&json, &report)])?;
        Ok([svg, json])
    }
}

/// One engine of the cluster.
struct Engine<'a> {
    id: WorkerId,
    sim: ServeSim<'a>,
    /// The load the router last heard of: most decode steps change none of
    /// it, and then there is nothing to tell.
    reported: Option<WorkerLoad>,
}

/// Feeds an engine's events to the router, as a subscriber of its wire
/// would.
struct RouterFeed<'r> {
    router: &'r Router,
    worker: WorkerId,
    format: &'r WireFormat,
    tier_formats: &'r [(String, WireFormat)],
}

impl EventSink for RouterFeed<'_> {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        (self.router.apply_message(self.worker, message, self.format)).map_err(|error| {
            SimError::Events {
                reason: error.to_string(),
            }
        })
    }

    fn publish_on(&mut self, medium: &str, message: &EventMessage) -> Result<(), SimError> {
        let Some((_, format)) = self.tier_formats.iter().find(|(m, _)| m == medium) else {
            return Ok(());
        };
        // Nothing to forget (a later resync, after lost events, does
        // forget everything: the safe error, relearned from the next
        // stores).
        if crate::events::is_empty_opening(message) {
            return Ok(());
        }
        (self.router.apply_message(self.worker, message, format)).map_err(|error| {
            SimError::Events {
                reason: error.to_string(),
            }
        })
    }
}

/// Arrivals whose prompts and keys are built together, off the serial path:
/// the first window on every thread, each later one on another thread while
/// the window before it is routed. Enough to be worth a task, few enough
/// that their prompts (about 50 KB each on the conversation trace) stay in
/// cache until they are submitted.
const PREPARE_WINDOW: usize = 32;

/// An arrival's prompt and request keys: everything about it that does not
/// depend on the engines, so built off the serial path.
struct Prepared {
    /// Hashed once: the keys are its hashes as the engines send them, and
    /// the engine's sequence takes the hashes as they are.
    prompt: Option<HashedPrompt>,
    keys: Vec<u128>,
}

impl Prepared {
    fn new(
        trace: &Trace,
        index: usize,
        block_size: usize,
        format: &WireFormat,
    ) -> Result<Self, SimError> {
        let tokens = (trace.requests().get(index)).and_then(shared_prompt);
        let prompt = match tokens {
            Some(tokens) => Some(HashedPrompt::new(tokens, block_size, Salt::NONE)?),
            None => None,
        };
        let keys = prompt
            .as_ref()
            .map_or_else(Vec::new, |p| request_keys(p, format));
        Ok(Self { prompt, keys })
    }
}

/// The keys of `prompt`'s full blocks, as the engines send them.
fn request_keys(prompt: &HashedPrompt, format: &WireFormat) -> Vec<u128> {
    (prompt.hashes().iter())
        .map(|hash| block_key(&format.hash(kvbm_blocks::SequenceHash::root(hash.value()))))
        .collect()
}

/// One policy's replay of a validated `config` whose engines each have
/// `capacity_blocks` blocks.
fn replay_policy(
    trace: &Trace,
    config: &ClusterConfig,
    capacity_blocks: usize,
    kind: PolicyKind,
) -> Result<ClusterRun, SimError> {
    let engine_config = &config.engine;
    let block_size = engine_config.block_size;
    let started = Instant::now();
    let mut router = Router::new();
    for (medium, weight) in config.medium_weights()? {
        router = router.with_medium_weight(medium, weight);
    }
    // With a model's KV cache groups, every event says its group and the
    // router scores on the full-attention one.
    let format = engine_config.wire_format()?.with_hash_form(HashForm::Int64);
    let engine_tiers = engine_config.replay_tiers()?;
    // Each own lower tier's events reach the router under its medium.
    let tier_formats: Vec<(String, WireFormat)> = (engine_tiers.plan(block_size)?.iter())
        .map(|plan| {
            (
                plan.medium.to_owned(),
                format.clone().with_medium(Some(plan.medium.to_owned())),
            )
        })
        .collect();
    let block_bytes = engine_tiers.block_bytes(block_size)?;
    // The pool every engine shares, with the index of what it holds.
    let pooled = kind == PolicyKind::GlobalKv || !config.pool_only_for_global_kv;
    let global_pool = match config.global_pool_blocks()?.filter(|_| pooled) {
        None => None,
        Some(blocks) => Some(
            BlockManager::<Lower>::builder()
                .block_count(blocks)
                .block_size(block_size)
                .eviction(engine_config.eviction.policy())
                .build()?,
        ),
    };
    let pool_index = Arc::new(PrefixIndex::new());
    let mut pool_tap = (global_pool.as_ref())
        .map(|pool| EventTap::new(pool.subscribe_events(SUBSCRIPTION_CAPACITY)));
    let remote = global_pool.as_ref().map(|pool| (pool, config.network));
    let mut engines = Vec::new();
    // Fallible, as everything allocated per engine here: a machine that
    // cannot hold what the estimate allowed gives an error, not an abort.
    (engines.try_reserve_exact(config.engines)).map_err(|_| SimError::OutOfMemory {
        what: "the cluster's engines",
        bytes: (config.engines as u64).saturating_mul(size_of::<Engine<'_>>() as u64),
    })?;
    for i in 0..config.engines {
        let manager = BlockManager::<Simulated>::builder()
            .block_count(capacity_blocks)
            .block_size(block_size)
            .eviction(engine_config.eviction.policy())
            .build()?;
        let tiers = engine_tiers.scheduler_config_with_remote(
            block_size,
            &engine_config.step_time,
            remote,
        )?;
        let mut scheduler = engine_config.scheduler_with(manager, tiers)?;
        scheduler.set_metrics_enabled(engine_config.metrics);
        let labels = [
            ("engine", i.to_string()),
            ("policy", kind.name().to_owned()),
        ];
        scheduler.set_metric_labels(labels.clone().map(|(k, v)| (k.to_owned(), v)));
        let mut sim = ServeSim::engine(trace, engine_config, scheduler, &labels)?;
        if remote.is_some() {
            sim.add_link(config.network, block_bytes);
        }
        sim.tap_events();
        let id = i as WorkerId;
        router.add_worker(id).map_err(|error| SimError::Events {
            reason: error.to_string(),
        })?;
        engines.push(Engine {
            id,
            sim,
            reported: None,
        });
    }
    let mut policy = config.policy(kind, &pool_index)?;
    let mut arrivals: Vec<usize> = (0..trace.len()).collect();
    arrivals.sort_by_key(|&i| trace.requests().get(i).map_or(0, |r| r.timestamp));
    let mut assigned = vec![usize::MAX; trace.len()];
    // Engines that share a pool step one after another: the pool's order
    // of stores and evictions must not depend on thread timing.
    let threads = match global_pool {
        Some(_) => Threads::Here,
        None => Threads::new(config.threads, config.engines)?,
    };
    let wire = Wire {
        router: &router,
        format: &format,
        tier_formats: &tier_formats,
    };
    let mut pool_feed = GlobalFeed {
        index: &pool_index,
        format: &format,
    };
    let prepare = |index: usize| Prepared::new(trace, index, block_size, &format);
    // The whole loop on the pool's first thread: each arrival's steps then
    // fork from a worker (the other one often still spinning) rather than
    // waking the pool from outside and sleeping until it is done.
    threads.within(|| -> Result<(), SimError> {
        let mut windows = arrivals.chunks(PREPARE_WINDOW);
        // The first window on every thread; each later one beside the
        // routing of the window before it, below.
        let mut next = windows
            .next()
            .map(|window| (window, threads.map(window, prepare)));
        while let Some((window, prepared)) = next.take() {
            // The next window's prompts are built on another thread while
            // this one's arrivals are routed and the engines step to them
            // (mostly one engine at a time, on this thread).
            let following = windows.next();
            let (routed, built) = threads.join(
                || -> Result<(), SimError> {
                    for (&index, prepared) in window.iter().zip(prepared) {
                        let Prepared { prompt, keys } = prepared?;
                        let at = arrival(trace, index)?;
                        // Every step that begins before the arrival, on every engine.
                        threads.run_until(&mut engines, Some(at), wire)?;
                        if let Some(tap) = &mut pool_tap {
                            tap.pump(&mut pool_feed)?;
                        }
                        let prompt_tokens = prompt.as_ref().map_or(0, |p| p.tokens().len());
                        let request = RouteRequest::new(&keys, prompt_tokens, block_size);
                        let worker = router
                            .route(&request, policy.as_mut())
                            .map_or(0, |decision| decision.worker as usize);
                        assigned[index] = worker;
                        let engine = &mut engines[worker];
                        engine.sim.wake_at(at);
                        engine.sim.submit(index, prompt.map(SimPrompt::Hashed))?;
                        // Its queued prompt tokens now include this one, so a burst of
                        // arrivals spreads before the engine next steps.
                        engine.report_load(&router)?;
                    }
                    Ok(())
                },
                || following.map(|window| (window, window.iter().map(|&i| prepare(i)).collect())),
            );
            routed?;
            next = built;
        }
        threads.run_until(&mut engines, None, wire)
    })?;
    if let Some(tap) = &mut pool_tap {
        tap.pump(&mut pool_feed)?;
    }
    check_router(&router, &engines, engine_config.kv.is_some())?;
    report::merge(
        trace,
        kind,
        engines.into_iter().map(|e| e.sim),
        &assigned,
        capacity_blocks,
        started,
    )
}

/// When request `index` arrives, in simulated nanoseconds.
///
/// # Errors
///
/// [`SimError::TimestampTooLarge`] for a timestamp the clock cannot hold
/// (never, for a checked [`Trace`]).
fn arrival(trace: &Trace, index: usize) -> Result<u64, SimError> {
    let timestamp = trace.requests().get(index).map_or(0, |r| r.timestamp);
    crate::trace::arrival_nanos(timestamp).ok_or(SimError::TimestampTooLarge {
        line: index + 1,
        timestamp,
    })
}

/// Checks that the router, fed only by events, holds exactly the blocks
/// each engine's pool registers.
fn check_router(router: &Router, engines: &[Engine<'_>], grouped: bool) -> Result<(), SimError> {
    for (engine, state) in engines.iter().enumerate() {
        let router_blocks = router.stats(state.id).map_or(0, |stats| stats.held_blocks);
        // Its device's and its own lower tiers' blocks, every medium; with
        // KV cache groups the router holds the full-attention group's only,
        // which the pools do not count apart.
        let pool_blocks = state.sim.registered_blocks()? + state.sim.lower_registered_blocks()?;
        let agrees = match grouped {
            false => router_blocks == pool_blocks,
            true => router_blocks <= pool_blocks,
        };
        if !agrees {
            return Err(SimError::RouterOutOfSync {
                engine,
                router_blocks,
                pool_blocks,
            });
        }
    }
    Ok(())
}

impl Engine<'_> {
    /// Steps until the engine is idle or its next step would begin at or
    /// after `until` (never, for `None`), feeding its events and load to
    /// the router after each step.
    ///
    /// A step that changes nothing waits for `until`: only an arrival can
    /// unblock it, and without one the engine has stalled.
    fn run_until(&mut self, until: Option<u64>, wire: Wire<'_>) -> Result<(), SimError> {
        loop {
            if self.sim.is_idle() {
                // Idle, but a transfer may still end before `until`: its
                // end must reach the scheduler (a store lands in a pool
                // other engines read) before anything is routed.
                match self.sim.next_transfer_end() {
                    Some(end) if until.is_none_or(|at| end < at) => self.sim.wake_at(end),
                    _ => break,
                }
            }
            if until.is_some_and(|at| self.sim.now() >= at) {
                break;
            }
            // Steps before `until` that only decode within blocks, at once
            // (same results; they send no event and leave the load as is).
            if self.sim.advance_in_place(until)? > 0 {
                continue;
            }
            let mut feed = RouterFeed {
                router: wire.router,
                worker: self.id,
                format: wire.format,
                tier_formats: wire.tier_formats,
            };
            if !self.sim.advance(Some(&mut feed))? {
                // Only an arrival or a transfer ending can unblock it.
                let next = match (until, self.sim.next_transfer_end()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                match next {
                    Some(at) => self.sim.wake_at(at),
                    // The last transfer settled an idle engine: done.
                    None if self.sim.is_idle() => break,
                    None => return Err(self.sim.stalled()),
                }
            }
            self.report_load(wire.router)?;
        }
        Ok(())
    }

    /// Tells the router this engine's load, if it changed.
    fn report_load(&mut self, router: &Router) -> Result<(), SimError> {
        let (active_blocks, queued_prefill_tokens, running_requests) = self.sim.load();
        let load = WorkerLoad::new(active_blocks, queued_prefill_tokens, running_requests);
        if self.reported == Some(load) {
            return Ok(());
        }
        self.reported = Some(load);
        router
            .set_load(self.id, load)
            .map_err(|error| SimError::Events {
                reason: error.to_string(),
            })
    }
}

/// Where an engine's events and load go.
#[derive(Clone, Copy)]
struct Wire<'r> {
    router: &'r Router,
    format: &'r WireFormat,
    /// The format of each own lower tier's events, by medium.
    tier_formats: &'r [(String, WireFormat)],
}

/// The most threads a cluster replay starts, whatever it is asked for.
const MAX_THREADS: usize = 256;

/// How the engines step between two arrivals: each on its own (nothing an
/// engine does depends on another's steps, and the router is a concurrent
/// index), spread over a thread pool, or in turn on this thread.
///
/// Either way the replay is the same: an arrival is routed only once every
/// engine has run each step that begins before it, and the policies see
/// the index as a set, whatever order its updates came in.
enum Threads {
    Here,
    Pool(rayon::ThreadPool),
}

impl Threads {
    /// `Some(0 | 1)` steps on this thread; `None` uses every core. Never
    /// more threads than engines (the rest would idle) nor than
    /// [`MAX_THREADS`].
    fn new(threads: Option<usize>, engines: usize) -> Result<Self, SimError> {
        let threads = threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
            })
            .min(engines)
            .min(MAX_THREADS);
        if threads <= 1 {
            return Ok(Self::Here);
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map(Self::Pool)
            .map_err(|error| SimError::Threads {
                reason: error.to_string(),
            })
    }

    /// Runs `f` on the pool's first thread (here, without a pool), so the
    /// parallel calls it makes fork from a worker.
    fn within<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Self::Pool(pool) => pool.install(f),
            Self::Here => f(),
        }
    }

    /// `a` and `b`, `b` on another of the pool's threads if one is free
    /// (in turn, without a pool).
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        match self {
            Self::Pool(pool) => pool.join(a, b),
            Self::Here => (a(), b()),
        }
    }

    /// `f` of each of `items`, in order.
    fn map<T: Send>(&self, items: &[usize], f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        match self {
            Self::Pool(pool) => pool.install(|| items.par_iter().map(|&item| f(item)).collect()),
            Self::Here => items.iter().map(|&item| f(item)).collect(),
        }
    }

    fn run_until(
        &self,
        engines: &mut [Engine<'_>],
        until: Option<u64>,
        wire: Wire<'_>,
    ) -> Result<(), SimError> {
        let due = |engine: &Engine<'_>| {
            let before = |time: u64| until.is_none_or(|at| time < at);
            (!engine.sim.is_idle() && before(engine.sim.now()))
                || engine.sim.next_transfer_end().is_some_and(before)
        };
        // Counted, not collected: a list of the due engines would be an
        // allocation in proportion to the engines at every arrival. Only
        // with a pool to wake: on one thread it would be a second scan.
        let several_due =
            |engines: &[Engine<'_>]| engines.iter().filter(|engine| due(engine)).nth(1).is_some();
        match self {
            // One engine due (most gaps between arrivals): waking the pool
            // would cost more than it could share.
            Self::Pool(pool) if several_due(engines) => pool.install(|| {
                (engines.par_iter_mut())
                    .filter(|engine| due(engine))
                    .try_for_each(|engine| engine.run_until(until, wire))
            }),
            _ => (engines.iter_mut())
                .filter(|engine| due(engine))
                .try_for_each(|engine| engine.run_until(until, wire)),
        }
    }
}
