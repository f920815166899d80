//! [`Scheduler`]: continuous batching over every kvbm layer.

mod config;
mod plan;
mod request;
mod running;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use kvbm_blocks::{BlockId, BlockManager};
use kvbm_schedule::{HistoryPolicy, SchedulableSequence, ScheduleError};
use tracing::debug;

pub use self::config::SchedulerConfig;
pub use self::plan::{DecodeWork, EngineOutput, Finished, PrefillWork, StepPlan, StepReport};
pub use self::request::{FinishReason, InferenceRequest, RequestId};
use self::running::Running;
use crate::{Admitted, QueueConfig, Rejected, Request, RequestQueue, SchedulerError};

/// Continuous-batching scheduler for one block pool.
///
/// Each [`step`](Scheduler::step) plans one engine iteration the way vLLM's
/// and SGLang's schedulers do:
///
/// 1. **Running requests first**, most important first (higher priority,
///    then earlier admission): each decodes one token, or prefills its next
///    chunk (at most `chunk_size` tokens) while its prompt (or, after a
///    preemption, its recomputation) is incomplete. Every request costs
///    tokens from the per-step `token_budget`.
/// 2. **Preemption when blocks run out**: the least important running request
///    not yet scheduled this step (lowest priority, most recently admitted),
///    or the one being scheduled if none is less important, is preempted.
///    Its blocks are released (the registered prefix stays cached) and it
///    goes back to the queue at its original priority and arrival place,
///    to reacquire its cached prefix and recompute the rest later.
/// 3. **Admission** (only in a step that preempted nobody): waiting requests
///    in queue order while running slots, tokens and blocks allow. The queue
///    charges each its prompt plus a generation reserve against the blocks
///    available above the watermark; head-of-line by default. A candidate
///    whose first chunk cannot be allocated goes back to its place and ends
///    admission for this step.
///
/// The engine runs the [`StepPlan`] and reports what it sampled through
/// [`apply`](Scheduler::apply), which commits every request through the
/// `SchedulableSequence` schedule/apply protocol: a block is published to the
/// prefix cache only once its KV is computed. Requests finish at
/// `max_new_tokens` or when the engine reports a stop; [`abort`](Scheduler::abort)
/// takes one out in any state. Every request is always in exactly one place
/// (waiting, running, finished or aborted; [`Scheduler::census`]) and the
/// block manager's conservation holds ([`Scheduler::audit`]).
pub struct Scheduler<M> {
    manager: BlockManager<M>,
    queue: RequestQueue<InferenceRequest>,
    live: LiveIds,
    config: SchedulerConfig,
    /// Admitted requests holding blocks, in no particular order between steps.
    running: Vec<Running<M>>,
    /// Sequences of preempted requests, waiting in the queue to resume.
    parked: HashMap<RequestId, SchedulableSequence<M>>,
    /// The planned step awaiting `apply`, and requests aborted meanwhile.
    pending: Option<PendingStep>,
    next_step: u64,
    next_admission: u64,
    counters: Counters,
    /// Reused by `apply` so committing a step allocates nothing per request.
    scratch: Vec<BlockId>,
}

/// The engine's outputs of one step, by request (a fast hasher: ids are ours).
type OutputsById = HashMap<RequestId, EngineOutput, foldhash::fast::RandomState>;

#[derive(Debug)]
struct PendingStep {
    step: u64,
    aborted: HashSet<RequestId>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    finished: u64,
    aborted_running: u64,
    /// Requests lost because the queue refused to take them back (closed).
    dropped_on_restore: u64,
    preemptions: u64,
    prefix_hit_tokens: u64,
    prompt_tokens: u64,
}

/// Where every request is: the scheduler's conservation law.
///
/// `submitted == waiting + running + finished + aborted` holds after every
/// call ([`is_balanced`](Self::is_balanced)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Census {
    /// Requests ever accepted by `submit`.
    pub submitted: u64,
    /// Requests in the waiting queue (new or preempted).
    pub waiting: u64,
    /// Requests admitted and holding blocks.
    pub running: u64,
    /// Requests that finished (max tokens or stop).
    pub finished: u64,
    /// Requests aborted, cancelled while waiting, or dropped because the
    /// queue was closed under them.
    pub aborted: u64,
    /// Preemptions so far (a request may be preempted more than once).
    pub preemptions: u64,
    /// Tokens of the sequences admitted, counting every admission: the prompt
    /// for a new request, prompt plus generated tokens for a resumption.
    pub prompt_tokens: u64,
    /// Of those, tokens served from the prefix cache.
    pub prefix_hit_tokens: u64,
}

impl Census {
    /// Whether every submitted request is in exactly one place.
    pub fn is_balanced(&self) -> bool {
        self.submitted == self.waiting + self.running + self.finished + self.aborted
    }
}

/// Ids of every request waiting or running, shared with the submit handles:
/// the queue alone knows only waiting ids, and an id must not be submitted
/// again while its request runs.
#[derive(Clone, Debug, Default)]
struct LiveIds(Arc<Mutex<HashSet<RequestId>>>);

impl LiveIds {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<RequestId>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request` unless its id is live.
    fn submit(
        &self,
        queue: &RequestQueue<InferenceRequest>,
        request: InferenceRequest,
    ) -> Result<(), Rejected<InferenceRequest>> {
        if request.prompt().is_empty() {
            return Err(Rejected::new(crate::QueueError::EmptyPrompt, request));
        }
        let id = request.id();
        if !self.set().insert(id) {
            return Err(Rejected::new(crate::QueueError::Duplicate, request));
        }
        queue.enqueue(request).map(drop).inspect_err(|_| {
            self.retire(id);
        })
    }

    /// `id` left the scheduler; it may be submitted again.
    fn retire(&self, id: RequestId) {
        self.set().remove(&id);
    }
}

/// A cheap, thread-safe handle for submitting and cancelling waiting
/// requests from other threads (the scheduler itself stays on one thread).
#[derive(Clone, Debug)]
pub struct SubmitHandle {
    queue: RequestQueue<InferenceRequest>,
    live: LiveIds,
}

impl SubmitHandle {
    /// Queues a request.
    ///
    /// # Errors
    ///
    /// The request comes back with [`QueueError::EmptyPrompt`](crate::QueueError::EmptyPrompt)
    /// (nothing to compute a first token from), [`QueueError::Duplicate`](crate::QueueError::Duplicate)
    /// if a request with its id is waiting or running, [`QueueError::TooLarge`](crate::QueueError::TooLarge)
    /// if it could never fit the pool, or [`QueueError::Closed`](crate::QueueError::Closed).
    pub fn submit(&self, request: InferenceRequest) -> Result<(), Rejected<InferenceRequest>> {
        self.live.submit(&self.queue, request)
    }

    /// Takes a request out of the waiting queue; `false` if it is not
    /// waiting (a running request is aborted with [`Scheduler::abort`]).
    /// A preempted request's progress is dropped at the scheduler's next step.
    pub fn cancel(&self, id: RequestId) -> bool {
        let taken = self.queue.remove(id).is_some();
        if taken {
            self.live.retire(id);
        }
        taken
    }
}

impl<M> Scheduler<M> {
    /// A scheduler over `manager`'s pool.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::ZeroLimit`] if `max_running`, `token_budget` or
    /// `chunk_size` is 0, or [`SchedulerError::Queue`] if the waiting queue
    /// refuses the geometry.
    pub fn new(manager: BlockManager<M>, config: SchedulerConfig) -> Result<Self, SchedulerError> {
        for (field, value) in [
            ("max_running", config.max_running),
            ("token_budget", config.token_budget),
            ("chunk_size", config.chunk_size),
        ] {
            if value == 0 {
                return Err(SchedulerError::ZeroLimit { field });
            }
        }
        let block_tokens = u32::try_from(manager.block_size()).unwrap_or(u32::MAX);
        let queue_config = QueueConfig::new(block_tokens, manager.total_blocks() as u64)
            .with_reserve(config.reserve)
            .with_selection(config.selection);
        let queue = RequestQueue::new(queue_config)?;
        Ok(Self {
            manager,
            queue,
            live: LiveIds::default(),
            config,
            running: Vec::new(),
            parked: HashMap::new(),
            pending: None,
            next_step: 0,
            next_admission: 0,
            counters: Counters::default(),
            scratch: Vec::new(),
        })
    }

    /// Queues a request (see [`SubmitHandle::submit`]).
    ///
    /// # Errors
    ///
    /// As [`SubmitHandle::submit`].
    pub fn submit(&self, request: InferenceRequest) -> Result<(), Rejected<InferenceRequest>> {
        self.live.submit(&self.queue, request)
    }

    /// A handle other threads can submit and cancel through.
    pub fn submit_handle(&self) -> SubmitHandle {
        SubmitHandle {
            queue: self.queue.clone(),
            live: self.live.clone(),
        }
    }

    /// The block manager.
    pub fn manager(&self) -> &BlockManager<M> {
        &self.manager
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty()
    }

    /// The ids of the running requests.
    pub fn running_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running.iter().map(Running::id)
    }

    /// The full block table of a running request (its page indices in order).
    pub fn block_table(&self, id: RequestId) -> Option<Vec<BlockId>> {
        let running = self.running.iter().find(|r| r.id() == id)?;
        Some(running.seq.block_ids().collect())
    }

    /// Tokens of a running request so far (prompt and generated).
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        let running = self.running.iter().find(|r| r.id() == id)?;
        Some(running.seq.tokens())
    }

    /// A running (or just admitted) request leaves: counted as finished or
    /// aborted, and its id may be submitted again.
    fn exit(&mut self, id: RequestId, reason: FinishReason, generated_tokens: usize) -> Finished {
        match reason {
            FinishReason::MaxTokens | FinishReason::Stop => self.counters.finished += 1,
            FinishReason::Aborted | FinishReason::CapacityExceeded => {
                self.counters.aborted_running += 1;
            }
        }
        self.live.retire(id);
        Finished {
            id,
            reason,
            generated_tokens,
        }
    }

    /// Plans the next engine iteration.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::StepPending`] if the previous plan was not applied.
    pub fn step(&mut self) -> Result<StepPlan, SchedulerError> {
        if let Some(pending) = &self.pending {
            return Err(SchedulerError::StepPending { step: pending.step });
        }
        let mut plan = StepPlan {
            step: self.next_step,
            ..StepPlan::default()
        };
        // Drop the progress of preempted requests cancelled meanwhile.
        let queue = &self.queue;
        self.parked.retain(|id, _| queue.contains(*id));
        let mut budget = self.config.token_budget;
        self.schedule_running(&mut budget, &mut plan);
        if plan.preempted.is_empty() {
            self.admit(&mut budget, &mut plan);
        }
        self.next_step += 1;
        self.pending = Some(PendingStep {
            step: plan.step,
            aborted: HashSet::new(),
        });
        debug!(
            step = plan.step,
            prefill = plan.prefill.len(),
            decode = plan.decode.len(),
            preempted = plan.preempted.len(),
            tokens = plan.num_tokens(),
            "step planned"
        );
        Ok(plan)
    }

    /// Running requests, most important first; preemption victims come from
    /// the end of this order.
    fn schedule_running(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        self.running
            .sort_by_key(|r| (std::cmp::Reverse(r.priority()), r.admission));
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            match self.running[i].schedule(&self.manager, *budget, self.config.chunk_size) {
                Ok(Some(work)) => {
                    *budget -= work.tokens();
                    self.running[i].push_work(work, plan);
                    i += 1;
                }
                Ok(None) => i += 1,
                Err(ScheduleError::AllocationFailed { .. }) if self.running.len() == 1 => {
                    // Alone and still out of blocks: its length outgrew the
                    // whole pool, and preempting it would only loop.
                    let done = self.running.remove(i);
                    debug!(id = %done.id(), "request outgrew the block pool");
                    let generated = done.seq.generated_tokens();
                    plan.finished.push(self.exit(
                        done.id(),
                        FinishReason::CapacityExceeded,
                        generated,
                    ));
                }
                Err(ScheduleError::AllocationFailed { .. }) => {
                    // The victim: the least important request not yet
                    // scheduled, which is the last one (possibly `i` itself).
                    let victim = self.running.len() - 1;
                    self.preempt(victim, plan);
                }
                Err(err) => {
                    // Unreachable for a consistent sequence; never panic:
                    // take the request out and keep the rest going.
                    let done = self.running.remove(i);
                    debug!(id = %done.id(), %err, "request failed to schedule");
                    let generated = done.seq.generated_tokens();
                    plan.finished
                        .push(self.exit(done.id(), FinishReason::Aborted, generated));
                }
            }
        }
    }

    /// Releases a running request's blocks and queues it again at its place.
    fn preempt(&mut self, index: usize, plan: &mut StepPlan) {
        let Running {
            admitted, mut seq, ..
        } = self.running.remove(index);
        let id = admitted.id();
        // Only unscheduled requests are preempted, so this cannot fail.
        let released = seq.release();
        debug_assert!(released.is_ok(), "preempted {id} mid-step");
        self.counters.preemptions += 1;
        plan.preempted.push(id);
        self.requeue(admitted, Some(seq));
        debug!(%id, "preempted");
    }

    /// Puts an admitted request back at its queue place, parking its sequence
    /// (if it has progress worth keeping) until it is admitted again.
    fn requeue(
        &mut self,
        admitted: Admitted<InferenceRequest>,
        seq: Option<SchedulableSequence<M>>,
    ) {
        let id = admitted.id();
        match self.queue.restore(admitted) {
            Ok(()) => {
                if let Some(seq) = seq.filter(|seq| seq.generated_tokens() > 0) {
                    self.parked.insert(id, seq);
                }
            }
            Err(_closed) => {
                // Only a closed queue refuses; the request cannot wait again.
                self.counters.dropped_on_restore += 1;
                self.live.retire(id);
            }
        }
    }

    /// Admits waiting requests in queue order while slots, tokens and blocks allow.
    fn admit(&mut self, budget: &mut usize, plan: &mut StepPlan) {
        let slots = self.config.max_running.saturating_sub(self.running.len());
        if slots == 0 || *budget == 0 {
            return;
        }
        // The watermark keeps room for running requests to grow into; with
        // none running it would only keep a large request waiting forever.
        let watermark = if self.running.is_empty() {
            0
        } else {
            self.config.watermark(self.manager.total_blocks())
        };
        let blocks = self.manager.available_blocks().saturating_sub(watermark) as u64;
        let mut candidates = self
            .queue
            .select_batch(slots, blocks)
            .split_off(0)
            .into_iter();
        // The queue charged every candidate its prompt plus a generation
        // reserve; a preempted one must recompute what it generated too.
        let mut room = blocks;
        while let Some(admitted) = candidates.next() {
            let id = admitted.id();
            let cost = match self.parked.get(&id) {
                Some(seq) => self.queue.config().request_blocks(
                    u32::try_from(seq.total_tokens()).unwrap_or(u32::MAX),
                    u32::try_from(seq.remaining_tokens()).unwrap_or(u32::MAX),
                ),
                None => admitted.blocks(),
            };
            if *budget == 0 || cost > room {
                // Head of line: it and everyone behind it keep their places,
                // and a preempted one is not reacquired just to be released.
                self.requeue(admitted, None);
                for admitted in candidates.by_ref() {
                    self.requeue(admitted, None);
                }
                break;
            }
            room -= cost;
            let mut seq = match self.resume_or_start(&admitted) {
                Ok(seq) => seq,
                Err(err) => {
                    debug!(%id, %err, "request cannot start");
                    plan.finished.push(self.exit(id, FinishReason::Aborted, 0));
                    continue;
                }
            };
            let prompt = seq.total_tokens() as u64;
            let hits = seq.kv_position() as u64;
            match Running::schedule_seq(&mut seq, &self.manager, *budget, self.config.chunk_size) {
                Ok(Some(work)) => {
                    *budget -= work.tokens();
                    self.counters.prompt_tokens += prompt;
                    self.counters.prefix_hit_tokens += hits;
                    let mut running = Running::new(admitted, seq, self.next_admission);
                    self.next_admission += 1;
                    running.push_work(work, plan);
                    self.running.push(running);
                }
                Err(ScheduleError::AllocationFailed { .. }) => {
                    // Its first chunk does not fit: back to its place, and so
                    // is everyone behind it (head of line).
                    let _ = seq.release();
                    self.requeue(admitted, Some(seq));
                    for admitted in candidates.by_ref() {
                        self.requeue(admitted, None);
                    }
                }
                Ok(None) | Err(_) => {
                    // Cannot run at all (unreachable for prompts `submit`
                    // accepts); never requeue what would block the line.
                    debug!(%id, "request cannot be scheduled");
                    plan.finished.push(self.exit(
                        id,
                        FinishReason::Aborted,
                        seq.generated_tokens(),
                    ));
                }
            }
        }
    }

    /// The sequence of an admitted request: a preempted one reacquires its
    /// cached prefix, a new one is built and matched.
    fn resume_or_start(
        &mut self,
        admitted: &Admitted<InferenceRequest>,
    ) -> Result<SchedulableSequence<M>, ScheduleError> {
        let id = admitted.id();
        if let Some(mut seq) = self.parked.remove(&id) {
            seq.reacquire(&self.manager)?;
            return Ok(seq);
        }
        let request = admitted.request();
        // Room for every token it may generate: no reallocation mid-decode.
        let mut tokens =
            Vec::with_capacity(request.prompt().len() + request.max_new_tokens() as usize);
        tokens.extend_from_slice(request.prompt());
        let mut seq = SchedulableSequence::builder(
            tokens,
            request.max_new_tokens() as usize,
            self.manager.block_size(),
        )
        .salt(request.salt())
        .history(HistoryPolicy::Off)
        .build()?;
        seq.match_and_add_prefix(&self.manager)?;
        Ok(seq)
    }

    /// Commits what the engine sampled for the pending plan.
    ///
    /// `outputs` holds one entry per planned request, in any order (entries
    /// for requests aborted since the plan are ignored).
    ///
    /// # Errors
    ///
    /// Nothing changes on error: [`SchedulerError::NoStepPending`],
    /// [`SchedulerError::MissingOutput`], [`SchedulerError::UnexpectedOutput`],
    /// [`SchedulerError::DuplicateOutput`], [`SchedulerError::MissingToken`]
    /// or [`SchedulerError::UnexpectedToken`].
    pub fn apply(&mut self, outputs: &[EngineOutput]) -> Result<StepReport, SchedulerError> {
        let pending = self.pending.as_ref().ok_or(SchedulerError::NoStepPending)?;
        let by_id = self.check_outputs(pending, outputs)?;
        let step = pending.step;
        self.pending = None;

        let mut report = StepReport {
            step,
            ..StepReport::default()
        };
        let mut i = 0;
        while i < self.running.len() {
            let running = &mut self.running[i];
            let Some(&output) = by_id.get(&running.id()) else {
                i += 1;
                continue;
            };
            match running.commit(output, &self.manager, &mut report, &mut self.scratch) {
                Ok(None) => i += 1,
                Ok(Some(reason)) => {
                    let done = self.running.swap_remove(i);
                    let generated = done.seq.generated_tokens();
                    report
                        .finished
                        .push(self.exit(done.id(), reason, generated));
                }
                Err(err) => {
                    // Unreachable after `check_outputs`; never panic.
                    let done = self.running.swap_remove(i);
                    debug!(id = %done.id(), %err, "request failed to apply");
                    let generated = done.seq.generated_tokens();
                    report
                        .finished
                        .push(self.exit(done.id(), FinishReason::Aborted, generated));
                }
            }
        }
        debug!(step, finished = report.finished.len(), "step applied");
        Ok(report)
    }

    /// Validates `outputs` against the plan without changing anything.
    fn check_outputs(
        &self,
        pending: &PendingStep,
        outputs: &[EngineOutput],
    ) -> Result<OutputsById, SchedulerError> {
        let mut by_id = OutputsById::with_capacity_and_hasher(outputs.len(), Default::default());
        for output in outputs {
            if pending.aborted.contains(&output.id) {
                continue;
            }
            if by_id.insert(output.id, *output).is_some() {
                return Err(SchedulerError::DuplicateOutput { id: output.id });
            }
        }
        let mut expected = 0;
        for running in &self.running {
            let Some(work) = running.work else { continue };
            expected += 1;
            let id = running.id();
            let output = by_id.get(&id).ok_or(SchedulerError::MissingOutput { id })?;
            match (work.samples_token(), output.token.is_some()) {
                (true, false) => return Err(SchedulerError::MissingToken { id }),
                (false, true) => return Err(SchedulerError::UnexpectedToken { id }),
                _ => {}
            }
        }
        if by_id.len() != expected {
            let scheduled: HashSet<RequestId> = self
                .running
                .iter()
                .filter(|r| r.work.is_some())
                .map(Running::id)
                .collect();
            let stray = by_id.keys().find(|id| !scheduled.contains(id));
            if let Some(&id) = stray {
                return Err(SchedulerError::UnexpectedOutput { id });
            }
        }
        Ok(by_id)
    }

    /// Takes a request out wherever it is: waiting (new or preempted) or
    /// running (even mid-step: its scheduled work is reverted, and its
    /// output, if the engine still sends one, is ignored). Everything it
    /// held goes back to the pool; its registered blocks stay cached.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::UnknownRequest`] if it is neither waiting nor running.
    pub fn abort(&mut self, id: RequestId) -> Result<Finished, SchedulerError> {
        if let Some(index) = self.running.iter().position(|r| r.id() == id) {
            let mut running = self.running.swap_remove(index);
            if running.work.take().is_some() {
                let reverted = running.seq.revert_schedule();
                debug_assert!(reverted.is_ok(), "{id} had work but no schedule");
                if let Some(pending) = &mut self.pending {
                    pending.aborted.insert(id);
                }
            }
            debug!(%id, "aborted while running");
            return Ok(self.exit(id, FinishReason::Aborted, running.seq.generated_tokens()));
        }
        if self.queue.remove(id).is_some() {
            let generated_tokens = self
                .parked
                .remove(&id)
                .map_or(0, |seq| seq.generated_tokens());
            debug!(%id, "aborted while waiting");
            self.live.retire(id);
            return Ok(Finished {
                id,
                reason: FinishReason::Aborted,
                generated_tokens,
            });
        }
        Err(SchedulerError::UnknownRequest { id })
    }

    /// Where every request is right now.
    pub fn census(&self) -> Census {
        let queue = self.queue.stats();
        Census {
            submitted: queue.enqueued,
            waiting: queue.len as u64,
            running: self.running.len() as u64,
            finished: self.counters.finished,
            aborted: self.counters.aborted_running
                + self.counters.dropped_on_restore
                + queue.removed
                + queue.cancelled,
            preemptions: self.counters.preemptions,
            prompt_tokens: self.counters.prompt_tokens,
            prefix_hit_tokens: self.counters.prefix_hit_tokens,
        }
    }

    /// Checks both conservation laws: every request in exactly one place, and
    /// every block in use held by exactly the running requests (assuming this
    /// scheduler is the manager's only user). O(blocks); for tests and
    /// debugging.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::InvariantViolated`] or [`SchedulerError::Block`]
    /// describing the first discrepancy.
    pub fn audit(&self) -> Result<Census, SchedulerError> {
        let fail = |msg: String| Err(SchedulerError::InvariantViolated(msg));
        let census = self.census();
        if !census.is_balanced() {
            return fail(format!("requests unaccounted for: {census:?}"));
        }
        let live = self.live.set().clone();
        for id in self.parked.keys() {
            // A parked request cancelled through a handle is dropped at the
            // next step; until then it is neither waiting nor live.
            if !self.queue.contains(*id) && live.contains(id) {
                return fail(format!("parked {id} is live but not waiting"));
            }
        }
        let running_ids: HashSet<RequestId> = self.running_ids().collect();
        if live.len() != running_ids.len() + census.waiting as usize
            || !running_ids.iter().all(|id| live.contains(id))
        {
            return fail(format!(
                "{} live ids for {} running and {} waiting requests",
                live.len(),
                running_ids.len(),
                census.waiting
            ));
        }
        let mut held = HashSet::new();
        for running in &self.running {
            if self.queue.contains(running.id()) {
                return fail(format!("{} is both running and waiting", running.id()));
            }
            held.extend(running.seq.block_ids());
        }
        let blocks = self.manager.audit()?;
        if blocks.in_use_blocks() != held.len() {
            return fail(format!(
                "{} blocks in use but running requests hold {}",
                blocks.in_use_blocks(),
                held.len()
            ));
        }
        Ok(census)
    }
}

impl<M> fmt::Debug for Scheduler<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("waiting", &self.queue.len())
            .field("running", &self.running.len())
            .field("next_step", &self.next_step)
            .finish_non_exhaustive()
    }
}
