//! `serve` mode: requests arrive at their trace timestamps and run through
//! kvbm's continuous-batching [`Scheduler`] in simulated time.
//!
//! # The loop
//!
//! Simulated time starts at 0 (the trace's time origin) and only moves in
//! whole steps:
//!
//! 1. every request whose `timestamp` has come is [`submit`](Scheduler::submit)ted,
//!    in order of arrival (ties in trace order), with its prompt rebuilt
//!    from its `hash_ids` ([`prompt_tokens`]) and
//!    `max_new_tokens = output_length` (0 makes a prompt-only request);
//! 2. the scheduler plans a step ([`Scheduler::step`]); a stand-in engine
//!    "runs" it, sampling a synthetic token wherever one is due and never
//!    reporting a stop, so every request generates exactly its
//!    `output_length` tokens; the results go back through
//!    [`Scheduler::apply`];
//! 3. time advances by the step's [`StepTime`]; tokens emitted by the step
//!    count as emitted at its end;
//! 4. when nothing runs and nothing waits, time jumps to the next arrival.
//!
//! Time is counted exactly, in `u64` nanoseconds: arrivals (at most
//! [`MAX_TIMESTAMP_MS`](crate::MAX_TIMESTAMP_MS), the first half of the
//! range) convert without rounding, and a step that would end past the
//! clock's range stops the replay with [`SimError::ClockOverflow`] rather
//! than saturating.
//!
//! The replay ends when every request has left. The scheduler's census must
//! then balance (every accepted request finished), and
//! [`Scheduler::audit`] checks both conservation laws at the end and, with
//! [`ServeConfig::audit_every`], every so many steps.
//!
//! # What is counted
//!
//! - **Requests** are the ones the scheduler accepted. A request it refuses
//!   at submission is counted in [`ServeReport::rejected_requests`] and in
//!   nothing else: an empty prompt, or a prompt plus generation reserve
//!   larger than the whole pool.
//! - **Hits** ([`ServeReport::hits`]) are prefix-cache hits as the scheduler
//!   saw them when it *first admitted* each request: the tokens its matched
//!   prefix covered, which is where its first prefill chunk starts. That is
//!   `census().prefix_hit_tokens` counted once per request. Matches are
//!   whole blocks, so `hit_blocks = hit_tokens / block_size`; the match
//!   never covers a prompt's last token (a forward pass must sample the first
//!   token), so an entirely cached prompt hits one block less than in
//!   `cache` mode. `input_blocks` is `ceil(input_length / block_size)`.
//! - **Admissions** ([`ServeReport::admissions`]) count every admission,
//!   resumptions after preemption included, exactly as the scheduler's
//!   census does: a resumed request counts its prompt *and the tokens it had
//!   generated* in `admitted_tokens`, and the part of them it found cached
//!   (its own registered blocks, usually) in `admitted_hit_tokens`. Without
//!   preemptions the two accountings agree.
//! - **Latencies**: TTFT runs from arrival to the end of the step that
//!   emitted the request's first token; TPOT is a request's
//!   `(finish - first token) / (output_length - 1)`, for requests with at
//!   least two output tokens (vLLM's definitions); end-to-end runs from
//!   arrival to the end of the step that finished it. Each is summarized as
//!   nearest-rank percentiles over requests ([`Latency`]).
//! - **Throughput** divides generated tokens and finished requests by the
//!   simulated duration, from the first arrival to the end of the last step.
//! - **Wall time**: [`ServeReport::replay_time`] is the whole replay's,
//!   building prompts, submitting them and standing in for the engine
//!   included; [`ServeReport::scheduler_time`] is the part spent inside the
//!   scheduler's step loop alone (see `scheduler_clock.rs`). Divided by
//!   [`ServeReport::scheduled_requests`], either is a cost per scheduled
//!   request-step.

mod config;
mod draws;
mod in_place;
mod kv;
mod latency;
mod report;
mod scheduler_clock;
mod step;
mod step_time;
mod summary;
mod tier_report;
mod tokens;
mod tracks;
mod transfers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvbm_blocks::BlockManager;
use kvbm_queue::{EngineOutput, InferenceRequest, QueueError, RequestId, Scheduler, StepPlan};
use kvbm_sequence::HashedPrompt;
use tracing::instrument;

pub use self::config::ServeConfig;
pub use self::draws::{PriorityMix, priority_from_vllm};
use self::kv::KvPeaks;
pub use self::kv::{KvGroupReport, KvReport};
pub use self::latency::Latency;
pub(crate) use self::report::latencies;
pub use self::report::{AdmissionStats, RequestTimeline, ServeOutcome, ServeReport};
use self::scheduler_clock::SchedulerClock;
pub use self::step_time::StepTime;
pub use self::tier_report::{OnboardFigures, TierFigures, TierReport};
pub(crate) use self::tokens::shared_prompt;
pub use self::tokens::{prompt_tokens, trace_token};
pub(crate) use self::tracks::TRACK_BYTES;
use self::tracks::{Tracks, new_track};
use self::transfers::EngineTransfers;
use crate::events::{EventSink, EventTap, SUBSCRIPTION_CAPACITY};
use crate::tiers::LinkClock;
use crate::{Eviction, Progress, SimError, Trace};

/// A prompt as the simulator submits it: its tokens, or its tokens with the
/// block hashes a router already computed for them (so the engine's
/// sequence does not hash them again).
pub(crate) enum SimPrompt {
    Tokens(Arc<[u32]>),
    Hashed(HashedPrompt),
}

/// Finished requests between two progress reports.
const PROGRESS_EVERY: u64 = 256;

/// A timestamp that has not happened.
const NEVER: u64 = u64::MAX;

/// The storage-tier marker of the simulated pool.
#[derive(Debug)]
pub(crate) struct Simulated;

/// Replays `trace` in serve mode with `config`, reporting finished requests
/// to `progress`.
///
/// # Errors
///
/// [`SimError::InvalidBlockSize`] unless the block size divides 512;
/// [`SimError::InvalidAcceptance`] unless `spec_accept` is in `0..=1`;
/// [`SimError::UnboundedServe`], [`SimError::ZeroCapacity`],
/// [`SimError::CapacityTooLarge`] or [`SimError::CapacityBelowBlock`] for
/// a pool that cannot be built; with a model's KV layout
/// ([`ServeConfig::kv`]), [`SimError::Groups`] for groups the block size
/// does not fit and [`SimError::InvalidTiers`] for tiers its blocks
/// overflow;
/// [`SimError::Scheduler`] for a scheduler limit of zero, or if the
/// scheduler refuses an operation or fails an audit (a bug);
/// [`SimError::Stalled`] if it stops making progress (a bug);
/// [`SimError::ClockOverflow`] if simulated time runs past what the clock
/// counts (about 584 years).
pub fn replay(
    trace: &Trace,
    config: &ServeConfig,
    progress: &mut dyn Progress,
) -> Result<ServeReport, SimError> {
    replay_with_events(trace, config, progress, None)
}

/// [`replay`], handing the engine's cache events to `events` after every
/// step (vLLM's wire, say); the report then counts them
/// ([`ServeReport::kv_events`]).
///
/// # Errors
///
/// As [`replay`], and [`SimError::Events`] if the sink fails.
pub fn replay_with_events(
    trace: &Trace,
    config: &ServeConfig,
    progress: &mut dyn Progress,
    events: Option<&mut dyn EventSink>,
) -> Result<ServeReport, SimError> {
    replay_with_data_plane(trace, config, progress, events, None)
}

/// [`replay_with_events`], moving real bytes through the stores
/// `data_plane` names behind the lower tiers (see
/// [`DataPlaneSpec`](crate::DataPlaneSpec)); the report then has
/// [`ServeReport::data_plane`]. Simulated time is unchanged; a transfer the
/// data plane fails fails in the replay too.
///
/// # Errors
///
/// As [`replay_with_events`], and [`SimError::DataPlane`] if there is no
/// lower tier, the stores cannot be opened, or device memory and host
/// arenas would exceed [`MAX_DATA_PLANE_BYTES`](crate::MAX_DATA_PLANE_BYTES).
/// With a model's KV layout the blocks are the model's (every group's
/// blocks move, each group's under its own hashes).
#[instrument(level = "debug", skip_all, fields(block_size = config.block_size, capacity = %config.capacity))]
pub fn replay_with_data_plane(
    trace: &Trace,
    config: &ServeConfig,
    progress: &mut dyn Progress,
    events: Option<&mut dyn EventSink>,
    data_plane: Option<&crate::DataPlaneSpec>,
) -> Result<ServeReport, SimError> {
    config.validate()?;
    let block_size = config.block_size;
    let capacity_blocks = config.capacity_blocks()?;
    let started = Instant::now();
    let manager = BlockManager::<Simulated>::builder()
        .block_count(capacity_blocks)
        .block_size(block_size)
        .eviction(config.eviction.policy())
        .build()?;
    let mut scheduler = config.build_scheduler(manager)?;
    scheduler.set_metrics_enabled(config.metrics);
    progress.start("serving", trace.len() as u64);
    let mut sim = ServeSim::new(trace, config, scheduler)?;
    sim.scheduler_clock = SchedulerClock::running();
    if let Some(spec) = data_plane {
        let block_bytes = config.replay_tiers()?.block_bytes(block_size)?;
        match &mut sim.transfers {
            Some(transfers) => transfers.attach_data_plane(spec, &sim.scheduler, block_bytes)?,
            None => {
                return Err(SimError::DataPlane {
                    reason: "--data-plane needs a tier below the GPU (--host-tier-tokens or --disk-tier-tokens)".into(),
                });
            }
        }
    }
    if events.is_some() {
        sim.tap_events();
    }
    let result = sim.run(progress, events);
    progress.finish();
    result?;
    let mut report = sim.report(capacity_blocks)?;
    report.replay_time = started.elapsed();
    Ok(report)
}

/// The replay loop's state: one engine (serve mode's whole replay, or one
/// engine of cluster mode, whose arrivals come from the router).
pub(crate) struct ServeSim<'a> {
    trace: &'a Trace,
    eviction: Eviction,
    step_time: StepTime,
    audit_every: Option<u64>,
    /// Whether decodes run in place ([`ServeConfig`]'s `in_place`).
    in_place: bool,
    spec_accept: f64,
    seed: u64,
    scheduler: Scheduler<Simulated>,
    /// Request indices in arrival order.
    arrivals: Vec<usize>,
    next_arrival: usize,
    tracks: Tracks,
    /// Priorities drawn for requests whose trace line has none.
    priorities: Option<PriorityMix>,
    /// Simulated time, nanoseconds.
    now: u64,
    /// Engine outputs, reused every step.
    outputs: Vec<EngineOutput>,
    /// The scheduler's plan, reused every step (boxed: taken out and put
    /// back each step, it moves as a pointer, not as the plan's 150 bytes).
    plan: Option<Box<StepPlan>>,
    /// Time to first token, in simulated seconds, through the `metrics`
    /// facade (a no-op without a recorder).
    ttft: metrics::Histogram,
    counters: Counters,
    /// The pool's cache events, when someone listens.
    events: Option<EventTap>,
    /// The engine's own lower tiers' cache events (not a shared pool's),
    /// with their media, when someone listens.
    lower_events: Vec<(String, EventTap)>,
    /// With tiers below the GPU: the transfers on their links (and, with
    /// a data plane, their bytes).
    transfers: Option<EngineTransfers>,
    /// With a model's KV layout: the pool's and the groups' peaks.
    kv: Option<KvPeaks>,
    /// The time in the scheduler's step loop, when kept.
    scheduler_clock: SchedulerClock,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    accepted: u64,
    rejected: u64,
    exited: u64,
    running: u64,
    max_running: u64,
    max_waiting: u64,
    steps: u64,
    scheduler_steps: u64,
    scheduled_requests: u64,
    busy: u64,
    prefill_tokens: u64,
    decode_tokens: u64,
    output_tokens: u64,
    admissions: u64,
    admitted_hit_tokens: u64,
    preemptions: u64,
    first_admissions: u64,
    unreported: u64,
    /// Prompt tokens of accepted requests without a first token yet.
    unprefilled_tokens: u64,
    /// Requests that waited for loads, and how long in all (nanoseconds).
    onboarded: u64,
    stall: u64,
}

impl Counters {
    /// `steps` scheduler steps begin, each finding the queue as it is now
    /// (more than one only when nothing in them changes it).
    fn steps_begin(&mut self, steps: u64) {
        self.scheduler_steps += steps;
        let waiting = self.accepted.saturating_sub(self.exited + self.running);
        self.max_waiting = self.max_waiting.max(waiting);
    }

    /// `steps` steps ran: `scheduled` request-steps, `prefill_tokens`
    /// prefilled and `decodes` decoded in all, over `busy` nanoseconds.
    fn ran(&mut self, steps: u64, scheduled: u64, prefill_tokens: u64, decodes: u64, busy: u64) {
        self.steps += steps;
        self.scheduled_requests += scheduled;
        self.busy = self.busy.saturating_add(busy);
        self.prefill_tokens += prefill_tokens;
        self.decode_tokens += decodes;
        self.max_running = self.max_running.max(self.running);
    }
}

impl<'a> ServeSim<'a> {
    /// Serve mode's engine: the trace's requests arrive at their
    /// timestamps.
    ///
    /// # Errors
    ///
    /// [`SimError::OutOfMemory`] if the per-request state cannot be
    /// allocated; [`SimError::TimestampTooLarge`] for a timestamp the clock
    /// cannot hold (never, for a checked [`Trace`]); as
    /// [`with_arrivals`](Self::with_arrivals).
    fn new(
        trace: &'a Trace,
        config: &ServeConfig,
        scheduler: Scheduler<Simulated>,
    ) -> Result<Self, SimError> {
        let requests = trace.requests();
        let mut arrivals: Vec<usize> = (0..requests.len()).collect();
        // Stable: equal timestamps keep trace order.
        arrivals.sort_by_key(|&index| requests.get(index).map_or(0, |r| r.timestamp));
        let mut tracks = Vec::new();
        // Fallible, as a routed engine's records are.
        (tracks.try_reserve_exact(requests.len())).map_err(|_| SimError::OutOfMemory {
            what: "an engine's per-request state",
            bytes: (requests.len() as u64).saturating_mul(TRACK_BYTES as u64),
        })?;
        for (index, request) in requests.iter().enumerate() {
            tracks.push(new_track(
                index,
                request,
                config.priorities.as_ref(),
                config.seed,
            )?);
        }
        Self::with_arrivals(trace, config, scheduler, arrivals, Tracks::All(tracks))
    }

    /// An engine whose requests arrive in the order of `arrivals` (request
    /// indices; empty when someone else submits them), with `tracks`.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidTiers`] for tiers that cannot be planned; as
    /// [`KvSetup::groups`](crate::KvSetup::groups) for a model's layout.
    fn with_arrivals(
        trace: &'a Trace,
        config: &ServeConfig,
        scheduler: Scheduler<Simulated>,
        arrivals: Vec<usize>,
        tracks: Tracks,
    ) -> Result<Self, SimError> {
        let tiers = config.replay_tiers()?;
        let plans = tiers.plan(config.block_size)?;
        let transfers = if plans.is_empty() {
            None
        } else {
            Some(EngineTransfers::new(LinkClock::new(
                &plans,
                tiers.block_bytes(config.block_size)?,
            )))
        };
        Ok(Self {
            trace,
            eviction: config.eviction,
            step_time: config.step_time,
            audit_every: config.audit_every,
            in_place: config.in_place,
            spec_accept: config.spec_accept,
            seed: config.seed,
            scheduler,
            arrivals,
            next_arrival: 0,
            tracks,
            priorities: config.priorities,
            now: 0,
            outputs: Vec::new(),
            plan: Some(Box::default()),
            ttft: metrics::histogram!(kvbm_queue::metric_names::TIME_TO_FIRST_TOKEN),
            counters: Counters::default(),
            events: None,
            lower_events: Vec::new(),
            transfers,
            kv: (config.kv)
                .map(|kv| KvPeaks::new(kv, config.block_size))
                .transpose()?,
            scheduler_clock: SchedulerClock::default(),
        })
    }

    /// An engine of a cluster: no arrivals of its own (the router submits),
    /// its time-to-first-token histogram recorded under `labels`.
    ///
    /// # Errors
    ///
    /// As [`with_arrivals`](Self::with_arrivals).
    pub(crate) fn engine(
        trace: &'a Trace,
        config: &ServeConfig,
        scheduler: Scheduler<Simulated>,
        labels: &[(&'static str, String)],
    ) -> Result<Self, SimError> {
        let mut sim = Self::with_arrivals(trace, config, scheduler, Vec::new(), Tracks::routed())?;
        sim.ttft = metrics::histogram!(
            kvbm_queue::metric_names::TIME_TO_FIRST_TOKEN,
            labels
                .iter()
                .map(|(k, v)| metrics::Label::new(*k, v.clone()))
                .collect::<Vec<_>>()
        );
        Ok(sim)
    }

    /// The engine's clock: when its next step starts (nanoseconds).
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Moves an idle engine's clock up to `at` (a busy one is already past
    /// it or will be).
    pub(crate) fn wake_at(&mut self, at: u64) {
        self.now = self.now.max(at);
    }

    /// Whether nothing waits or runs: every request the scheduler
    /// accepted has left it (the plans and reports show every exit).
    ///
    /// Counted, not asked: a cluster asks each of its engines at every
    /// arrival, and the scheduler's answer takes a lock (at 1,024
    /// engines, 6% of the replay).
    pub(crate) fn is_idle(&self) -> bool {
        let idle = self.counters.accepted == self.counters.exited;
        debug_assert_eq!(idle, self.scheduler.is_idle());
        idle
    }

    /// Blocks in use, prompt tokens not yet prefilled, running requests.
    pub(crate) fn load(&self) -> (u64, u64, u64) {
        let manager = self.scheduler.manager();
        let active = (manager.total_blocks() - manager.available_blocks()) as u64;
        // The sim's own count of admitted requests (the plans show every
        // admission and exit): the census would lock the queue each step.
        debug_assert_eq!(self.counters.running, self.scheduler.census().running);
        (
            active,
            self.counters.unprefilled_tokens,
            self.counters.running,
        )
    }

    /// Hashes in the pool's registry, recounted.
    pub(crate) fn registered_blocks(&self) -> Result<usize, SimError> {
        Ok(self.scheduler.manager().audit()?.registered_hashes)
    }

    /// Subscribes to the pool's cache events (before the first step, so the
    /// subscription starts from an empty pool).
    pub(crate) fn tap_events(&mut self) {
        let subscription = (self.scheduler.manager()).subscribe_events(SUBSCRIPTION_CAPACITY);
        self.events = Some(EventTap::new(subscription));
        if let Some(tiers) = self.scheduler.tiers() {
            for tier in tiers.lower_ids() {
                let (Some(config), Some(pool)) = (tiers.config(tier), tiers.pool(tier)) else {
                    continue;
                };
                if config.shared_pool().is_some() {
                    continue; // its events are the cluster's, not this engine's
                }
                let tap = EventTap::new(pool.subscribe_events(SUBSCRIPTION_CAPACITY));
                self.lower_events.push((config.medium.clone(), tap));
            }
        }
    }

    /// Blocks the engine's own lower tiers register (shared pools left
    /// out), recounted.
    pub(crate) fn lower_registered_blocks(&self) -> Result<usize, SimError> {
        let Some(tiers) = self.scheduler.tiers() else {
            return Ok(0);
        };
        let mut blocks = 0;
        for tier in tiers.lower_ids() {
            if tiers
                .config(tier)
                .is_some_and(|c| c.shared_pool().is_some())
            {
                continue;
            }
            if let Some(pool) = tiers.pool(tier) {
                blocks += pool.audit()?.registered_hashes;
            }
        }
        Ok(blocks)
    }

    /// The next arrival or transfer end, whichever comes first.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let transfer = self.next_transfer_end();
        match (self.next_arrival_time(), transfer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the next transfer under way ends (`None` without tiers).
    pub(crate) fn next_transfer_end(&self) -> Option<u64> {
        self.transfers.as_ref().and_then(EngineTransfers::next_end)
    }

    /// Adds the link of a lower tier below the engine's own (a cluster's
    /// shared pool), for a scheduler built with that tier last.
    pub(crate) fn add_link(&mut self, link: crate::Link, block_bytes: u64) {
        match &mut self.transfers {
            Some(transfers) => transfers.links.push(link),
            None => {
                let mut links = LinkClock::new(&[], block_bytes);
                links.push(link);
                self.transfers = Some(EngineTransfers::new(links));
            }
        }
    }

    /// Reports every transfer that ended by now to the scheduler.
    fn deliver_transfers(&mut self) -> Result<(), SimError> {
        match &mut self.transfers {
            Some(transfers) => transfers.deliver(self.now, &mut self.scheduler),
            None => Ok(()),
        }
    }

    fn next_arrival_time(&self) -> Option<u64> {
        let &index = self.arrivals.get(self.next_arrival)?;
        self.tracks.get(index).map(|track| track.arrival)
    }

    fn run(
        &mut self,
        progress: &mut dyn Progress,
        mut sink: Option<&mut dyn EventSink>,
    ) -> Result<(), SimError> {
        if let Some(first) = self.next_arrival_time() {
            self.now = first;
        }
        loop {
            self.submit_arrivals()?;
            if self.scheduler.is_idle() {
                // Idle: the next arrival, or a transfer still under way
                // (its end is delivered by the next step).
                match self.next_event() {
                    Some(time) => {
                        self.now = self.now.max(time);
                        if self.next_transfer_end().is_some_and(|end| end <= self.now) {
                            // Delivered by a step (that plans nothing).
                            self.advance(sink.as_deref_mut())?;
                        }
                        continue;
                    }
                    None => break,
                }
            }
            // Steps before the next arrival that only decode the running
            // requests within their blocks run at once, same results.
            if self.advance_in_place(self.next_arrival_time())? > 0 {
                continue;
            }
            let changed = self.advance(sink.as_deref_mut())?;
            if !changed {
                // Nothing ran or moved: only an arrival or a transfer
                // ending can change that.
                match self.next_event() {
                    Some(time) => self.now = self.now.max(time),
                    None => return Err(self.stalled()),
                }
            }
            if self.counters.unreported >= PROGRESS_EVERY {
                progress.advance(self.counters.unreported);
                self.counters.unreported = 0;
            }
        }
        progress.advance(self.counters.unreported);
        self.counters.unreported = 0;
        if let Some(sink) = sink {
            sink.finish()?;
        }
        Ok(())
    }

    /// Plans, runs and applies one step, hands its cache events to `sink`
    /// and audits when due. Returns whether anything ran or changed.
    pub(crate) fn advance<'s>(
        &mut self,
        sink: Option<&mut (dyn EventSink + 's)>,
    ) -> Result<bool, SimError> {
        self.deliver_transfers()?;
        // The plan's lists are reused from step to step.
        let mut plan = self.plan.take().unwrap_or_default();
        let planned = (self.scheduler_clock).time(|| self.scheduler.step_into(&mut plan));
        if let (Ok(()), Some(kv)) = (&planned, &mut self.kv) {
            // The step's allocations are held; nothing it ends is freed yet.
            kv.observe(&self.scheduler);
        }
        let changed = planned
            .map_err(SimError::from)
            .and_then(|()| self.step(&plan));
        self.plan = Some(plan);
        let changed = changed?;
        if let (Some(tap), Some(sink)) = (&mut self.events, sink) {
            tap.pump(sink)?;
            for (medium, tap) in &mut self.lower_events {
                tap.pump_on(medium, sink)?;
            }
        }
        if self
            .audit_every
            .is_some_and(|every| self.counters.scheduler_steps.is_multiple_of(every))
        {
            self.scheduler.audit()?;
        }
        Ok(changed)
    }

    /// The error of a scheduler that cannot move and has nothing to wait for.
    pub(crate) fn stalled(&self) -> SimError {
        let census = self.scheduler.census();
        SimError::Stalled {
            step: self.counters.scheduler_steps,
            waiting: census.waiting,
            running: census.running,
        }
    }

    /// Submits every request that has arrived by now.
    fn submit_arrivals(&mut self) -> Result<(), SimError> {
        while let Some(&index) = self.arrivals.get(self.next_arrival) {
            if self.tracks.get(index).is_none_or(|t| t.arrival > self.now) {
                break;
            }
            self.next_arrival += 1;
            let prompt = self.prompt(index).map(SimPrompt::Tokens);
            self.submit(index, prompt)?;
        }
        Ok(())
    }

    /// Request `index`'s prompt, `None` if it has none.
    pub(crate) fn prompt(&mut self, index: usize) -> Option<Arc<[u32]>> {
        tokens::shared_prompt(self.trace.requests().get(index)?)
    }

    /// Submits request `index` with its `prompt` (from
    /// [`prompt`](Self::prompt), or hashed by a router) now.
    pub(crate) fn submit(
        &mut self,
        index: usize,
        prompt: Option<SimPrompt>,
    ) -> Result<(), SimError> {
        let Some(request) = self.trace.requests().get(index) else {
            return Ok(());
        };
        let (priorities, seed) = (self.priorities, self.seed);
        let make = || new_track(index, request, priorities.as_ref(), seed);
        let Some(track) = self.tracks.get_or_insert(index, make)? else {
            return Ok(());
        };
        let Some(prompt) = prompt else {
            track.outcome = ServeOutcome::RejectedEmpty;
            self.counters.rejected += 1;
            self.counters.unreported += 1;
            return Ok(());
        };
        let max_new = u32::try_from(request.output_length).unwrap_or(u32::MAX);
        // Arrival in simulated time, for time-based aging.
        let id = RequestId(index as u64);
        let inference = match prompt {
            SimPrompt::Tokens(tokens) => InferenceRequest::new(id, tokens, max_new),
            SimPrompt::Hashed(hashed) => InferenceRequest::hashed(id, hashed, max_new),
        };
        let inference = inference
            .with_priority(track.priority)
            .with_arrival(Duration::from_nanos(track.arrival));
        match self.scheduler.submit(inference) {
            Ok(()) => {
                self.counters.accepted += 1;
                self.counters.unprefilled_tokens += request.input_length;
            }
            Err(rejected) => {
                track.outcome = match rejected.error() {
                    QueueError::TooLarge { .. } => ServeOutcome::RejectedTooLarge,
                    QueueError::EmptyPrompt => ServeOutcome::RejectedEmpty,
                    other => {
                        return Err(SimError::Scheduler(other.clone().into()));
                    }
                };
                self.counters.rejected += 1;
                self.counters.unreported += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_data_plane;
#[cfg(test)]
mod tests_groups;
#[cfg(test)]
mod tests_groups_tiers;
#[cfg(test)]
mod tests_in_place;
#[cfg(test)]
mod tests_tiers;
