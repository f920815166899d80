//! The event history of a sequence: [`SequenceEvent`], the [`EventLog`] that
//! keeps them and the [`HistoryPolicy`] that bounds it.

use std::collections::VecDeque;
use std::fmt;

use crate::SequenceState;

/// One lifecycle transition of a
/// [`SchedulableSequence`](crate::SchedulableSequence), with the numbers an
/// observer needs. Positions are `kv_position` values: tokens whose KV is
/// computed, *after* the transition unless said otherwise.
///
/// Only successful calls record events; a refused call records nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SequenceEvent {
    /// The sequence was built.
    Created {
        /// Prompt tokens.
        num_input_tokens: usize,
        /// The output budget.
        max_output_tokens: usize,
        /// Tokens per block.
        block_size: usize,
    },
    /// [`match_and_add_prefix`](crate::SchedulableSequence::match_and_add_prefix)
    /// ran (also when nothing matched).
    PrefixMatched {
        /// Cached blocks added.
        blocks_matched: usize,
        /// `kv_position` after the match.
        kv_position: usize,
    },
    /// A prefill chunk was scheduled.
    PrefillScheduled {
        /// Tokens in the chunk.
        num_tokens: usize,
        /// Where the chunk starts.
        kv_position: usize,
        /// Blocks allocated for it.
        blocks_allocated: usize,
    },
    /// A prefill chunk was committed.
    PrefillApplied {
        /// Tokens in the chunk.
        num_tokens: usize,
        /// `kv_position` after the chunk (where it ends).
        kv_position: usize,
        /// Blocks the chunk made fully computed, now registered.
        blocks_registered: usize,
        /// The first generated token, on the chunk that emits it.
        token: Option<u32>,
    },
    /// A decode step was scheduled.
    DecodeScheduled {
        /// Where the step starts (the tail token's position).
        kv_position: usize,
        /// Blocks allocated for the tail token's slot (0 or 1).
        blocks_allocated: usize,
    },
    /// A decode step was committed.
    DecodeApplied {
        /// The sampled token, now the tail token.
        token: u32,
        /// `kv_position` after the step.
        kv_position: usize,
        /// Blocks the step made fully computed, now registered.
        blocks_registered: usize,
        /// Whether `token` filled a block (see [`DecodeOutcome`](crate::DecodeOutcome)).
        block_completed: bool,
    },
    /// A speculative step was scheduled.
    SpeculativeScheduled {
        /// Draft tokens asked for.
        requested: usize,
        /// Draft tokens scheduled, clamped to the output budget.
        num_tokens: usize,
        /// Where the step starts (the tail token's position).
        kv_position: usize,
        /// Blocks allocated for the tail token and the drafts.
        blocks_allocated: usize,
    },
    /// A speculative step was committed.
    SpeculativeApplied {
        /// Tokens accepted and appended.
        accepted: usize,
        /// Draft tokens scheduled.
        scheduled: usize,
        /// `kv_position` after the step.
        kv_position: usize,
        /// Blocks the step made fully computed, now registered.
        blocks_registered: usize,
        /// Pre-allocated blocks the rejected drafts would have used, given
        /// back LIFO.
        blocks_released: usize,
    },
    /// A scheduled step was reverted.
    ScheduleReverted {
        /// The step that was pending.
        reverted: SequenceState,
        /// Blocks it had allocated, given back LIFO.
        blocks_released: usize,
    },
    /// Unassigned blocks were given back because cache hits replaced them
    /// (a partially computed block that a prefix match covered).
    UnassignedDropped {
        /// Blocks given back.
        count: usize,
    },
    /// Registered blocks a layer group reads no more (behind a sliding
    /// window or a finished local chunk) went back to the cache.
    UnreadReleased {
        /// Blocks given back.
        count: usize,
        /// `kv_position` at the release.
        kv_position: usize,
    },
    /// Every block was given back (registered ones stay cached).
    Released {
        /// Blocks held before the release.
        blocks_released: usize,
        /// `kv_position` before the release: the KV this request lost.
        kv_position: usize,
    },
    /// The cached prefix was matched again after a release.
    Reacquired {
        /// Cached blocks matched.
        prefix_matched: usize,
        /// `kv_position` after the match.
        kv_position: usize,
        /// Tokens the prefill path must recompute before decoding resumes.
        tokens_to_recompute: usize,
    },
}

/// How much history a sequence keeps. Counting what it does not keep costs
/// nothing, so [`EventLog::dropped`] is always exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HistoryPolicy {
    /// Every event, as the append-only log of the seed (memory grows by one
    /// event per step).
    #[default]
    Full,
    /// The most recent `n` events, older ones dropped (a ring buffer): bounded
    /// memory for long generations.
    Last(usize),
    /// No events kept.
    Off,
}

/// The events of one sequence, oldest first, as its [`HistoryPolicy`]
/// allows, and how many were dropped.
///
/// ```
/// use kvbm_blocks::BlockManager;
/// use kvbm_schedule::{HistoryPolicy, SchedulableSequence, SequenceEvent};
/// # struct Gpu;
/// let manager = BlockManager::<Gpu>::builder().block_count(8).block_size(4).build()?;
/// let mut seq = SchedulableSequence::<Gpu>::builder((0..4).collect(), 100, 4)
///     .history(HistoryPolicy::Last(2))
///     .build()?;
/// seq.schedule_prefill(4, &manager)?;
/// seq.apply_prefill(Some(7), &manager)?;
/// seq.schedule_decode(&manager)?;
/// seq.apply_decode(8, &manager)?;
/// let log = seq.history();
/// assert_eq!((log.len(), log.dropped(), log.recorded()), (2, 3, 5));
/// assert!(matches!(log.last(), Some(SequenceEvent::DecodeApplied { token: 8, .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EventLog {
    events: VecDeque<SequenceEvent>,
    policy: HistoryPolicy,
    dropped: u64,
}

impl EventLog {
    /// An empty log keeping what `policy` allows.
    pub fn new(policy: HistoryPolicy) -> Self {
        Self {
            events: VecDeque::new(),
            policy,
            dropped: 0,
        }
    }

    /// Appends `event`, dropping the oldest one if the policy's bound is
    /// reached.
    // Inlined so that with no history kept (the scheduler's sequences, one
    // per KV cache group) no event is built, only counted.
    #[inline]
    pub(crate) fn record(&mut self, event: SequenceEvent) {
        match self.policy {
            HistoryPolicy::Full => self.events.push_back(event),
            HistoryPolicy::Last(0) | HistoryPolicy::Off => self.dropped += 1,
            HistoryPolicy::Last(bound) => {
                if self.events.len() >= bound {
                    self.events.pop_front();
                    self.dropped += 1;
                }
                self.events.push_back(event);
            }
        }
    }

    /// The kept events, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &SequenceEvent> + ExactSizeIterator {
        self.events.iter()
    }

    /// Events kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The oldest kept event.
    pub fn first(&self) -> Option<&SequenceEvent> {
        self.events.front()
    }

    /// The newest event, if kept.
    pub fn last(&self) -> Option<&SequenceEvent> {
        self.events.back()
    }

    /// The kept events, oldest first, copied out.
    pub fn to_vec(&self) -> Vec<SequenceEvent> {
        self.events.iter().cloned().collect()
    }

    /// Events recorded but not kept (older than the bound, or all of them
    /// with [`HistoryPolicy::Off`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Every event ever recorded: kept plus dropped.
    pub fn recorded(&self) -> u64 {
        self.dropped + self.events.len() as u64
    }

    /// The policy the log follows.
    pub fn policy(&self) -> HistoryPolicy {
        self.policy
    }
}

impl<'a> IntoIterator for &'a EventLog {
    type Item = &'a SequenceEvent;
    type IntoIter = std::collections::vec_deque::Iter<'a, SequenceEvent>;

    fn into_iter(self) -> Self::IntoIter {
        self.events.iter()
    }
}

impl fmt::Debug for EventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLog")
            .field("policy", &self.policy)
            .field("kept", &self.events.len())
            .field("dropped", &self.dropped)
            .field("last", &self.events.back())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(count: usize) -> SequenceEvent {
        SequenceEvent::UnassignedDropped { count }
    }

    fn counts(log: &EventLog) -> Vec<usize> {
        log.iter()
            .map(|e| match e {
                SequenceEvent::UnassignedDropped { count } => *count,
                _ => usize::MAX,
            })
            .collect()
    }

    #[test]
    fn full_keeps_everything_in_order() {
        let mut log = EventLog::new(HistoryPolicy::Full);
        (0..5).for_each(|i| log.record(event(i)));
        assert_eq!(counts(&log), [0, 1, 2, 3, 4]);
        assert_eq!((log.dropped(), log.recorded()), (0, 5));
        assert_eq!(log.first(), Some(&event(0)));
    }

    #[test]
    fn last_keeps_the_newest_and_counts_the_rest() {
        let mut log = EventLog::new(HistoryPolicy::Last(3));
        (0..10).for_each(|i| log.record(event(i)));
        assert_eq!(counts(&log), [7, 8, 9]);
        assert_eq!((log.dropped(), log.recorded()), (7, 10));
        assert_eq!(log.last(), Some(&event(9)));
    }

    #[test]
    fn off_and_last_zero_keep_nothing_but_count() {
        for policy in [HistoryPolicy::Off, HistoryPolicy::Last(0)] {
            let mut log = EventLog::new(policy);
            (0..4).for_each(|i| log.record(event(i)));
            assert!(log.is_empty(), "{policy:?}");
            assert_eq!(log.dropped(), 4, "{policy:?}");
            assert!(format!("{log:?}").contains("dropped: 4"));
        }
    }
}
