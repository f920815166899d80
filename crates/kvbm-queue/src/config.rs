//! [`QueueConfig`]: block geometry, the generation reserve and the selection
//! and aging policies.

use crate::{KvLayout, Priority, QueueError};
use std::time::Duration;

/// How many generated tokens a request's KV cost reserves at admission.
///
/// Reserving the full `max_new_tokens` never preempts but admits fewer
/// requests; reserving a cap admits more and relies on the scheduler to grow
/// (or preempt) requests that generate past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GenerationReserve {
    /// Reserve `max_new_tokens` in full.
    Full,
    /// Reserve `min(max_new_tokens, cap)`; `Capped(0)` reserves nothing.
    Capped(u32),
}

impl Default for GenerationReserve {
    /// `Capped(256)`, the C# spec's `Math.Min(MaxTokens, 256)`.
    fn default() -> Self {
        GenerationReserve::Capped(256)
    }
}

impl GenerationReserve {
    pub(crate) fn tokens(self, max_new_tokens: u32) -> u32 {
        match self {
            GenerationReserve::Full => max_new_tokens,
            GenerationReserve::Capped(cap) => max_new_tokens.min(cap),
        }
    }
}

/// What `select_batch` does when the next request in priority order does not
/// fit the remaining budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Selection {
    /// Stop at the first request that does not fit (vLLM's policy). Nothing
    /// ever overtakes a waiting request, at the price of idle blocks while a
    /// large request waits for room.
    #[default]
    HeadOfLine,
    /// Skip requests that do not fit and keep scanning, so smaller requests
    /// behind them use the room.
    ///
    /// Starvation bound: a request that has been passed over (something behind
    /// it admitted while it did not fit) in `max_bypass` selections becomes a
    /// *reservation*: selections stop at it until it fits, exactly as under
    /// head-of-line. Only requests ahead of it in priority order can then be
    /// admitted before it. `max_scan` bounds how many queued requests one
    /// selection examines, which bounds the time spent under the lock.
    SkipAhead {
        /// Most queued requests one selection examines (at least 1).
        max_scan: usize,
        /// Selections that may pass a request over before it reserves the head.
        max_bypass: u32,
    },
}

/// How priority and arrival order combine into service order.
///
/// Every policy gives a queued request one ordering key, fixed while it
/// waits: its *rank*, smaller first. Priority counts as a head start in rank
/// units; a preemption boost ([`RequestQueue::restore_boosted`](crate::RequestQueue::restore_boosted))
/// takes priority steps off the rank, at most [`MAX_BOOST_STEPS`] in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Aging {
    /// Strict priority: a request is served only when nothing more urgent is
    /// queued. Under a steady stream of urgent work, `Low` waits forever.
    #[default]
    Strict,
    /// Priority as a head start measured in arrivals: each priority step is
    /// worth `w` arrivals. A request `s` steps below `Critical` is overtaken by
    /// at most `s × w` requests that arrive after it (so `Low` by at most
    /// `3 × w`, `Critical` by none), so nothing starves. `Window(0)` is plain
    /// FIFO.
    Window(u64),
    /// Priority as a head start measured in time: waiting `step` raises a
    /// request's urgency by one priority step (an aging rate of `1 / step`
    /// priority steps per second). A request `s` steps below `Critical` is
    /// overtaken only by requests that arrive less than `s × step` after it,
    /// however many. Arrival times come from
    /// [`Request::arrival`](crate::Request::arrival), or the queue's clock at
    /// enqueue.
    Timed {
        /// Waiting time worth one priority step.
        step: Duration,
    },
}

/// The most priority steps preemption boosts may add to one request's
/// urgency: the span from [`Priority::Low`] to [`Priority::Critical`], so a
/// boosted request can draw level with a `Critical` one that arrived with it,
/// never pass it.
pub const MAX_BOOST_STEPS: u32 = 3;

impl Aging {
    /// The first part of a request's service key `(rank, priority, seq)`;
    /// smaller first. `arrival_nanos` only matters for [`Aging::Timed`].
    pub(crate) fn rank(self, priority: Priority, seq: u64, arrival_nanos: u64) -> u64 {
        let head_start = priority.steps_below_max().saturating_mul(self.step_rank());
        match self {
            Aging::Strict => head_start,
            Aging::Window(_) => seq.saturating_add(head_start),
            Aging::Timed { .. } => arrival_nanos.saturating_add(head_start),
        }
    }

    /// Rank units one priority step is worth.
    pub(crate) fn step_rank(self) -> u64 {
        match self {
            Aging::Strict => 1,
            Aging::Window(w) => w,
            Aging::Timed { step } => u64::try_from(step.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Whether ranks depend on arrival times.
    pub(crate) fn is_timed(self) -> bool {
        matches!(self, Aging::Timed { .. })
    }
}

/// How a [`RequestQueue`](crate::RequestQueue) prices and orders requests.
///
/// A request costs `ceil((prompt_tokens + reserve) / block_tokens)` KV blocks,
/// where the reserve follows [`GenerationReserve`]. A request that costs more
/// than `pool_blocks` is refused at enqueue.
///
/// ```
/// use kvbm_queue::{GenerationReserve, QueueConfig, Selection};
///
/// let config = QueueConfig::new(16, 1024)
///     .with_reserve(GenerationReserve::Full)
///     .with_selection(Selection::SkipAhead { max_scan: 64, max_bypass: 4 });
/// assert_eq!(config.request_blocks(16, 0), 1);
/// assert_eq!(config.request_blocks(16, 1), 2); // 17 tokens round up
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    block_tokens: u32,
    pool_blocks: u64,
    reserve: GenerationReserve,
    selection: Selection,
    aging: Aging,
    layout: Option<KvLayout>,
    capacity: usize,
}

impl QueueConfig {
    /// Blocks of `block_tokens` tokens in a pool of `pool_blocks`, with the
    /// defaults: `GenerationReserve::Capped(256)`, `Selection::HeadOfLine`,
    /// `Aging::Strict`, no KV layout (budgets in blocks only) and no
    /// capacity reserved.
    pub fn new(block_tokens: u32, pool_blocks: u64) -> Self {
        Self {
            block_tokens,
            pool_blocks,
            reserve: GenerationReserve::default(),
            selection: Selection::default(),
            aging: Aging::default(),
            layout: None,
            capacity: 0,
        }
    }

    /// Sets the generation reserve.
    pub fn with_reserve(self, reserve: GenerationReserve) -> Self {
        Self { reserve, ..self }
    }

    /// Sets the policy for a request that does not fit.
    pub fn with_selection(self, selection: Selection) -> Self {
        Self { selection, ..self }
    }

    /// Sets how priority and arrival order combine.
    pub fn with_aging(self, aging: Aging) -> Self {
        Self { aging, ..self }
    }

    /// Sets the model's KV layout, which lets budgets be given in bytes.
    pub fn with_layout(self, layout: KvLayout) -> Self {
        Self {
            layout: Some(layout),
            ..self
        }
    }

    /// Reserves room for `capacity` queued requests up front (the C# spec's
    /// `initialCapacity`), so a queue that will be deep does not grow, and
    /// rehash its index, under its lock while it fills.
    ///
    /// A hint, not a limit: at most [`MAX_RESERVED`](Self::MAX_RESERVED)
    /// requests' room is reserved, whatever is asked (a huge value must not
    /// abort the process), and the queue grows past it as requests arrive.
    pub fn with_capacity(self, capacity: usize) -> Self {
        Self { capacity, ..self }
    }

    /// The most requests [`with_capacity`](Self::with_capacity) reserves room
    /// for up front.
    pub const MAX_RESERVED: usize = 1 << 16;

    /// Requests the queue reserves room for before it allocates: the
    /// requested capacity, at most [`MAX_RESERVED`](Self::MAX_RESERVED).
    pub fn capacity(&self) -> usize {
        self.capacity.min(Self::MAX_RESERVED)
    }

    /// Tokens per KV block.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Blocks in the whole pool.
    pub fn pool_blocks(&self) -> u64 {
        self.pool_blocks
    }

    /// The generation reserve.
    pub fn reserve(&self) -> GenerationReserve {
        self.reserve
    }

    /// The selection policy.
    pub fn selection(&self) -> Selection {
        self.selection
    }

    /// The aging policy.
    pub fn aging(&self) -> Aging {
        self.aging
    }

    /// The KV layout, if set.
    pub fn layout(&self) -> Option<KvLayout> {
        self.layout
    }

    /// KV blocks a request with these token counts costs.
    ///
    /// With `block_tokens == 0` (an invalid configuration, refused by
    /// [`RequestQueue::new`](crate::RequestQueue::new)) this returns `u64::MAX`.
    pub fn request_blocks(&self, prompt_tokens: u32, max_new_tokens: u32) -> u64 {
        if self.block_tokens == 0 {
            return u64::MAX;
        }
        // u32 + u32 always fits in u64: the cost cannot overflow.
        let tokens = u64::from(prompt_tokens) + u64::from(self.reserve.tokens(max_new_tokens));
        tokens.div_ceil(u64::from(self.block_tokens))
    }

    /// Whole blocks that `bytes` of KV memory hold (rounded down), if a layout
    /// is set.
    ///
    /// # Errors
    ///
    /// [`QueueError::NoKvLayout`] without a layout; the checks of
    /// [`validate`](Self::validate) otherwise.
    pub fn blocks_in_bytes(&self, bytes: u64) -> Result<u64, QueueError> {
        Ok(bytes / self.bytes_per_block()?)
    }

    fn bytes_per_block(&self) -> Result<u64, QueueError> {
        let layout = self.layout.ok_or(QueueError::NoKvLayout)?;
        self.validate()?;
        layout
            .bytes_per_block(self.block_tokens)
            .ok_or(QueueError::LayoutOverflow { what: "block" })
    }

    /// Checks that the configuration can build a queue.
    ///
    /// # Errors
    ///
    /// [`QueueError::Zero`] for zero `block_tokens`, `pool_blocks` or
    /// `SkipAhead::max_scan`; [`QueueError::LayoutOverflow`] if a layout is
    /// set and one block's bytes overflow `u64`.
    pub fn validate(&self) -> Result<(), QueueError> {
        if self.block_tokens == 0 {
            return Err(QueueError::Zero {
                field: "block_tokens",
            });
        }
        if self.pool_blocks == 0 {
            return Err(QueueError::Zero {
                field: "pool_blocks",
            });
        }
        if let Selection::SkipAhead { max_scan: 0, .. } = self.selection {
            return Err(QueueError::Zero { field: "max_scan" });
        }
        if let Some(layout) = self.layout
            && layout.bytes_per_block(self.block_tokens).is_none()
        {
            return Err(QueueError::LayoutOverflow { what: "block" });
        }
        Ok(())
    }
}
