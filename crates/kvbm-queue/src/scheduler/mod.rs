//! [`Scheduler`]: continuous batching over every kvbm layer.

mod abort;
mod admission;
mod apply;
mod census;
mod config;
mod in_place;
mod kv;
mod live;
mod lookups;
mod onboard;
mod onboard_groups;
mod plan;
mod preemption;
mod request;
mod running;
mod running_set;
mod step;
mod telemetry;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use kvbm_blocks::BlockManager;
use kvbm_sequence::KvCacheGroups;
use kvbm_tiers::Tiers;

pub use self::census::Census;
pub use self::config::{Preemption, SchedulerConfig};
pub use self::in_place::DecodesInPlace;
use self::kv::RequestKv;
use self::live::LiveIds;
pub use self::live::SubmitHandle;
pub use self::lookups::PAD_SLOT;
use self::onboard::Onboarding;
pub use self::onboard::{LinkCost, LoadCost, OnboardStats, TiersConfig};
pub use self::plan::{
    DecodeWork, EngineOutput, Finished, GroupBlocks, PrefillWork, RolledBack, StepPlan, StepReport,
};
pub use self::request::{FinishReason, InferenceRequest, RequestId};
use self::running::Scratch;
use self::running_set::RunningSet;
use self::telemetry::Telemetry;
pub use self::telemetry::{describe_metrics, names as metric_names};
use crate::{QueueConfig, Rejected, RequestQueue, SchedulerError};

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
    /// Admitted requests holding blocks, with their index by id (rebuilt
    /// after a public call changed them).
    running: RunningSet<M>,
    /// Sequences of waiting requests worth keeping (preempted ones, and
    /// candidates put back with their prompt hashed), until they resume.
    parked: HashMap<RequestId, Parked<M>>,
    /// The planned step awaiting `apply`, and requests aborted meanwhile.
    pending: Option<PendingStep>,
    next_step: u64,
    next_admission: u64,
    /// The head of the queue when prefix-credited admission last found it
    /// did not fit, with the room it had then.
    blocked_head: Option<(RequestId, u64)>,
    counters: Counters,
    /// Reused by `apply` so committing a step allocates nothing per request.
    scratch: Scratch,
    /// `apply`'s index of the engine's outputs, empty between calls.
    output_index: OutputIndex,
    /// Metric handles (no-ops without an installed recorder).
    telemetry: Telemetry,
    /// The tiers below the device, if any (`with_tiers`).
    tiers: Option<Tiers<M>>,
    tiers_config: TiersConfig,
    /// Admitted requests waiting for their prefix to be loaded, in
    /// admission order.
    onboarding: Vec<Onboarding<M>>,
    onboard_stats: OnboardStats,
    /// The model's KV cache groups; `None` for one full-attention group.
    groups: Option<Arc<KvCacheGroups>>,
}

/// The engine's outputs of one step, by request (a fast hasher: ids are ours).
/// Where each request's output is in the slice `apply` was given (kept
/// between steps so checking outputs allocates nothing).
type OutputIndex = HashMap<RequestId, usize, foldhash::fast::RandomState>;

/// A waiting request's sequence, holding no blocks.
struct Parked<M> {
    seq: RequestKv<M>,
    /// Whether it was admitted before (so a later admission is a
    /// resumption, not its first: prefix-cache queries count only first
    /// admissions).
    admitted_before: bool,
    /// Whether it may wait for loads from the tiers below the device: not
    /// after its onboarding timed out (it recomputes instead, even if its
    /// first try must wait for room).
    onboard: bool,
}

#[derive(Debug)]
struct PendingStep {
    step: u64,
    /// Prefill work items in the plan (its decodes follow them in the
    /// order the engine usually answers in).
    prefills: usize,
    aborted: HashSet<RequestId>,
    /// Requests cancelled through a handle and ended while planning: the
    /// step's report lists them.
    cancelled: Vec<Finished>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    finished: u64,
    aborted_running: u64,
    /// Requests lost because the queue refused to take them back (closed).
    dropped_on_restore: u64,
    preemptions: u64,
    priority_preemptions: u64,
    prefix_hit_tokens: u64,
    prompt_tokens: u64,
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    generated_tokens: u64,
    spec_proposed_tokens: u64,
    spec_accepted_tokens: u64,
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
        let capacity = manager.total_blocks() as u64;
        Self::build(manager, config, capacity)
    }

    /// [`new`](Self::new) with a queue that refuses requests costing more
    /// than `queue_capacity` blocks.
    fn build(
        manager: BlockManager<M>,
        config: SchedulerConfig,
        queue_capacity: u64,
    ) -> Result<Self, SchedulerError> {
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
        let queue_config = QueueConfig::new(block_tokens, queue_capacity)
            .with_reserve(config.reserve)
            .with_selection(config.selection)
            .with_aging(config.aging);
        let queue = RequestQueue::new(queue_config)?;
        Ok(Self {
            manager,
            queue,
            live: LiveIds::default(),
            config,
            running: RunningSet::default(),
            parked: HashMap::new(),
            pending: None,
            next_step: 0,
            next_admission: 0,
            blocked_head: None,
            counters: Counters::default(),
            scratch: Scratch::default(),
            output_index: OutputIndex::default(),
            telemetry: Telemetry::default(),
            tiers: None,
            tiers_config: TiersConfig::default(),
            onboarding: Vec::new(),
            onboard_stats: OnboardStats::default(),
            groups: None,
        })
    }

    /// A scheduler over `manager`'s pool for a model whose layers form
    /// several KV cache groups (sliding-window, chunked-local and full
    /// attention layers): each request holds one block table per group in
    /// the shared pool, a group releases the blocks its layers read no more
    /// as the request advances, a prefix hit counts as far as every group
    /// serves it, and admission charges each group's own need (a
    /// sliding-window group about `window / block_size` blocks plus a
    /// chunk's, not the whole prompt). Each planned request lists its
    /// groups' table updates in [`PrefillWork::groups`] /
    /// [`DecodeWork::groups`]. One full-attention group is exactly
    /// [`new`](Self::new).
    ///
    /// A request whose groups' least need (its full-attention tables, its
    /// windows and one chunk) exceeds the pool cannot run: it finishes at
    /// admission with [`FinishReason::CapacityExceeded`] (the waiting queue
    /// cannot judge it, so it does not refuse it at submit).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`SchedulerError::InvalidGroups`] for groups
    /// over another block size than the pool's.
    pub fn with_kv_groups(
        manager: BlockManager<M>,
        config: SchedulerConfig,
        groups: Arc<KvCacheGroups>,
    ) -> Result<Self, SchedulerError> {
        if groups.block_size() != manager.block_size() {
            return Err(SchedulerError::InvalidGroups {
                reason: format!(
                    "{}-token blocks in a pool of {}-token blocks",
                    groups.block_size(),
                    manager.block_size()
                ),
            });
        }
        let one_full = groups.len() == 1 && groups.is_full_attention_only();
        if one_full {
            return Self::new(manager, config);
        }
        // The queue's estimate is one full-attention table: it would refuse
        // long prompts a window group fits. Admission charges each group's
        // own need and ends a request that cannot fit at all
        // (`FinishReason::CapacityExceeded`).
        let mut scheduler = Self::build(manager, config, u64::MAX)?;
        scheduler.groups = Some(groups);
        Ok(scheduler)
    }

    /// The model's KV cache groups, if it has any but one full-attention
    /// group ([`with_kv_groups`](Self::with_kv_groups)).
    pub fn kv_groups(&self) -> Option<&KvCacheGroups> {
        self.groups.as_deref()
    }

    /// A scheduler over `manager`'s pool (the device tier) with tiers below
    /// it: blocks its requests compute are offloaded as each tier's policy
    /// says, and a request whose prefix a lower tier holds is onboarded
    /// (its loads listed in [`StepPlan::transfers`], reported through
    /// [`report_transfers`](Self::report_transfers)) before it computes the
    /// rest. With no lower tier it is [`new`](Self::new).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`SchedulerError::Tier`] for a tier that
    /// cannot be built, [`SchedulerError::InvalidCost`] for a cost model
    /// with a negative or non-finite value, [`SchedulerError::ZeroLimit`]
    /// for `max_onboarding_blocks` 0.
    pub fn with_tiers(
        manager: BlockManager<M>,
        config: SchedulerConfig,
        tiers: TiersConfig,
    ) -> Result<Self, SchedulerError> {
        tiers.validate()?;
        let lower = Self::lower_tiers(&manager, &tiers)?;
        let mut scheduler = Self::new(manager, config)?;
        scheduler.tiers = lower;
        scheduler.tiers_config = tiers;
        Ok(scheduler)
    }

    /// A scheduler for a model of several KV cache groups
    /// ([`with_kv_groups`](Self::with_kv_groups)) with tiers below the
    /// device ([`with_tiers`](Self::with_tiers)). Every group's blocks go
    /// down as its tier's policy says (a group's blocks are keyed by its
    /// own tagged hashes, so the groups share each tier as they share the
    /// device). A request onboards the longest prefix every group can
    /// serve from the device and the tiers together: each group loads only
    /// the blocks it needs for that hit and the device lacks (a sliding
    /// window only the blocks its window reads), and the cost model weighs
    /// those loads against recomputing the tokens they cover.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvbm_blocks::BlockManager;
    /// use kvbm_queue::{Scheduler, SchedulerConfig, TiersConfig};
    /// use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};
    /// use kvbm_tiers::TierConfig;
    /// # struct Gpu;
    /// let groups = KvCacheGroups::new(
    ///     16,
    ///     vec![
    ///         KvCacheGroup::new(AttentionKind::Full, 18),
    ///         KvCacheGroup::new(AttentionKind::SlidingWindow { window: 128 }, 18),
    ///     ],
    /// )?;
    /// let pool = BlockManager::<Gpu>::builder().block_count(256).block_size(16).build()?;
    /// let tiers = TiersConfig::new(vec![TierConfig::new("CPU", 1024)]);
    /// let scheduler = Scheduler::with_kv_groups_and_tiers(
    ///     pool,
    ///     SchedulerConfig::default(),
    ///     Arc::new(groups),
    ///     tiers,
    /// )?;
    /// assert!(scheduler.tiers().is_some() && scheduler.kv_groups().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_kv_groups`](Self::with_kv_groups) and
    /// [`with_tiers`](Self::with_tiers).
    pub fn with_kv_groups_and_tiers(
        manager: BlockManager<M>,
        config: SchedulerConfig,
        groups: Arc<KvCacheGroups>,
        tiers: TiersConfig,
    ) -> Result<Self, SchedulerError> {
        tiers.validate()?;
        let lower = Self::lower_tiers(&manager, &tiers)?;
        let mut scheduler = Self::with_kv_groups(manager, config, groups)?;
        scheduler.tiers = lower;
        scheduler.tiers_config = tiers;
        Ok(scheduler)
    }

    /// The tiers `tiers` describes below `manager`'s pool; `None` for none.
    fn lower_tiers(
        manager: &BlockManager<M>,
        tiers: &TiersConfig,
    ) -> Result<Option<Tiers<M>>, SchedulerError> {
        if tiers.lower.is_empty() {
            return Ok(None);
        }
        Ok(Some(Tiers::new(manager.clone(), tiers.lower.clone())?))
    }

    /// The tiers below the device (`None` without [`with_tiers`](Self::with_tiers)).
    pub fn tiers(&self) -> Option<&Tiers<M>> {
        self.tiers.as_ref()
    }

    /// What onboarding has done.
    pub fn onboard_stats(&self) -> OnboardStats {
        self.onboard_stats
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
        SubmitHandle::new(self.queue.clone(), self.live.clone())
    }

    /// The block manager.
    pub fn manager(&self) -> &BlockManager<M> {
        &self.manager
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Whether nothing is waiting or running and every request submitted has
    /// been reported finished (a cancellation not yet reported keeps the
    /// scheduler busy until the next step reports it).
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.onboarding.is_empty() && self.live.state().live.is_empty()
    }

    /// A running (or just admitted) request leaves: counted as finished or
    /// aborted, and its id may be submitted again.
    fn exit(&mut self, id: RequestId, reason: FinishReason, generated_tokens: usize) -> Finished {
        match reason {
            FinishReason::MaxTokens | FinishReason::Stop => self.counters.finished += 1,
            FinishReason::Aborted | FinishReason::Cancelled | FinishReason::CapacityExceeded => {
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
