//! [`Request`], what the queue needs to know about a request, and [`Priority`].

use std::fmt::Debug;
use std::hash::Hash;

/// How urgent a request is: `Low < Normal < High < Critical`, higher served first.
///
/// Within one priority the queue is FIFO (by a `u64` arrival sequence number).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Background work, served when nothing more urgent waits.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Served before `Normal` and `Low`.
    High,
    /// Served before everything else.
    Critical,
}

impl Priority {
    /// All priorities, least urgent first.
    pub const ALL: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];

    /// How many priority steps this is below [`Priority::Critical`] (0 to 3).
    pub(crate) fn steps_below_max(self) -> u64 {
        match self {
            Priority::Critical => 0,
            Priority::High => 1,
            Priority::Normal => 2,
            Priority::Low => 3,
        }
    }

    /// Its name in lower case: `low`, `normal`, `high` or `critical`.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    /// A dense index, `Low = 0` to `Critical = 3`.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What the queue needs to know about a request.
///
/// The queue calls these methods once, in `enqueue`, before it takes its lock,
/// so they may do real work; it never calls them again. Token counts come from
/// the caller (tokenization belongs in front of the queue, never inside it).
///
/// The id's `Hash` and `Eq` *do* run under the queue's lock (the id index
/// needs them); keep them trivial, as they are for integers and small
/// newtypes.
pub trait Request {
    /// A request id, unique among queued requests.
    type Id: Copy + Eq + Hash + Debug;

    /// This request's id.
    fn id(&self) -> Self::Id;

    /// This request's priority; [`Priority::Normal`] unless overridden.
    fn priority(&self) -> Priority {
        Priority::Normal
    }

    /// Tokens in the prompt, which need KV blocks from the first step.
    fn prompt_tokens(&self) -> u32;

    /// The most tokens this request may generate.
    fn max_new_tokens(&self) -> u32;

    /// When it arrived, as time since the queue was built, for
    /// [`Aging::Timed`](crate::Aging::Timed); `None` (the default) means
    /// "now", read from the queue's clock at enqueue. A simulator passes
    /// simulated time here. Other aging policies ignore it.
    fn arrival(&self) -> Option<std::time::Duration> {
        None
    }
}
