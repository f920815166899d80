//! Cache events by subscription: what became matchable and what stopped
//! being, in order, for routers that mirror the cache.
//!
//! The pool appends events to a pending list as it registers and evicts
//! (under its lock, so the list is in the order things happened) and
//! [`BlockManager::flush_events`](crate::BlockManager::flush_events) sends
//! the list as one [`EventBatch`] to every subscriber: a scheduler flushes
//! once per step. Channels are bounded; a subscriber that falls behind loses
//! batches, never silently: its [`EventSubscription::missed_batches`] counter
//! grows and, as soon as its channel has room, it receives a [`Resync`] with
//! every registered hash, which replaces whatever it had mirrored.
//!
//! With no subscriber nothing is recorded: registration and eviction pay one
//! branch, and a flush one relaxed atomic load. With subscribers, a block
//! costs a push into the batch being built (its hashes and tokens are two
//! flat buffers); once every subscriber has dropped a batch, the pool
//! reuses it whole and allocates nothing per batch.

mod log;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Receiver;

use crate::SequenceHash;

pub(crate) use self::log::EventLog;

/// Pending events are flushed on their own once they name this many blocks,
/// so a pool nobody flushes keeps bounded memory (its subscribers then see
/// more, smaller batches, or lag).
pub const MAX_PENDING_BLOCKS: usize = 1 << 16;

/// A change to the set of matchable hashes, as a view into its
/// [`EventBatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheEvent<'a> {
    /// Consecutive blocks of one sequence became matchable (first
    /// registrations; deduplicated ones are not announced again): each
    /// hash after the first is its predecessor's child.
    Stored {
        /// The first block's parent ([`SequenceHash::parent`]), `None` for a
        /// sequence's first block.
        parent: Option<u128>,
        /// The blocks' hash values ([`SequenceHash::value`]), in chain
        /// order.
        hashes: &'a [u128],
        /// Their tokens, `block_size` per block in order, when the blocks
        /// were registered with
        /// [`register_blocks_with_tokens`](crate::BlockManager::register_blocks_with_tokens);
        /// empty otherwise.
        tokens: &'a [u32],
    },
    /// Blocks stopped being matchable (evicted), in eviction order.
    Removed {
        /// The evicted hash values.
        hashes: &'a [u128],
    },
    /// [`clear_cache`](crate::BlockManager::clear_cache) emptied the whole
    /// registry: nothing is matchable.
    Cleared,
}

/// The events between two flushes, oldest first.
///
/// Every event's hash values live in one buffer and every event's tokens
/// in another, so a batch is three buffers however many events it holds,
/// and the pool reuses them once subscribers drop the batch;
/// [`events`](Self::events) walks it as [`CacheEvent`] views. Events carry hash
/// values and a run's parent, what vLLM's wire carries: a block costs the
/// batch 16 bytes, not a whole [`SequenceHash`].
///
/// ```
/// use kvbm_blocks::{CacheEvent, EventBatch, SequenceHash};
///
/// let root = SequenceHash::root(7);
/// let child = root.child(8);
/// let mut batch = EventBatch::new(1);
/// batch.push_stored(None, &[root.value(), child.value()], &[]);
/// batch.push_cleared();
/// assert_eq!(batch.sequence(), 1);
/// assert_eq!(
///     batch.events().collect::<Vec<_>>(),
///     [CacheEvent::Stored { parent: None, hashes: &[7, 8], tokens: &[] }, CacheEvent::Cleared]
/// );
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventBatch {
    sequence: u64,
    hashes: Vec<u128>,
    tokens: Vec<u32>,
    /// Each event's kind and where its hashes and tokens start; they end
    /// where the next event's start (the last's, at the buffers' ends).
    spans: Vec<Span>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    kind: SpanKind,
    hashes: usize,
    tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanKind {
    /// With the first block's parent.
    Stored(Option<u128>),
    Removed,
    Cleared,
}

impl EventBatch {
    /// An empty batch numbered `sequence`.
    pub fn new(sequence: u64) -> Self {
        Self {
            sequence,
            ..Self::default()
        }
    }

    /// The pool's batch counter: consecutive for a subscriber that keeps up.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// What happened, in order.
    pub fn events(&self) -> Events<'_> {
        Events {
            batch: self,
            spans: self.spans.iter(),
        }
    }

    /// How many events.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether nothing happened.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Blocks named by all events together (stored and removed).
    pub fn blocks(&self) -> usize {
        self.hashes.len()
    }

    /// Appends a [`CacheEvent::Stored`] of the chain `hashes` (hash values)
    /// under `parent`, and their `tokens`.
    pub fn push_stored(&mut self, parent: Option<u128>, hashes: &[u128], tokens: &[u32]) {
        self.open(SpanKind::Stored(parent));
        self.hashes.extend_from_slice(hashes);
        self.tokens.extend_from_slice(tokens);
    }

    /// Appends a [`CacheEvent::Removed`] of `hashes` (hash values).
    pub fn push_removed(&mut self, hashes: &[u128]) {
        self.open(SpanKind::Removed);
        self.hashes.extend_from_slice(hashes);
    }

    /// Appends a [`CacheEvent::Cleared`].
    pub fn push_cleared(&mut self) {
        self.open(SpanKind::Cleared);
    }

    /// Starts an event of `kind`: the blocks pushed next are its.
    fn open(&mut self, kind: SpanKind) {
        self.spans.push(Span {
            kind,
            hashes: self.hashes.len(),
            tokens: self.tokens.len(),
        });
    }

    /// Adds a block to the newest event (the pool's log extends its runs
    /// block by block).
    #[inline]
    fn extend(&mut self, hash: u128, tokens: &[u32]) {
        self.hashes.push(hash);
        if !tokens.is_empty() {
            self.tokens.extend_from_slice(tokens);
        }
    }

    /// Empties the batch for reuse, keeping bounded buffers.
    fn clear(&mut self) {
        /// Kept capacities: a busy step's batch, without holding on to the
        /// largest batch ever flushed.
        const KEEP_HASHES: usize = 4_096;
        const KEEP_TOKENS: usize = 1 << 16;
        self.hashes.clear();
        self.tokens.clear();
        self.spans.clear();
        let kept = [self.hashes.capacity(), self.spans.capacity()];
        if kept.iter().any(|&c| c > KEEP_HASHES) || self.tokens.capacity() > KEEP_TOKENS {
            self.hashes.shrink_to(KEEP_HASHES);
            self.tokens.shrink_to(KEEP_TOKENS);
            self.spans.shrink_to(KEEP_HASHES);
        }
    }
}

/// The events of an [`EventBatch`], oldest first.
#[derive(Clone, Debug)]
pub struct Events<'a> {
    batch: &'a EventBatch,
    spans: std::slice::Iter<'a, Span>,
}

impl<'a> Iterator for Events<'a> {
    type Item = CacheEvent<'a>;

    fn next(&mut self) -> Option<CacheEvent<'a>> {
        let span = self.spans.next()?;
        let batch = self.batch;
        // An event ends where the next begins, the last at the buffers' ends.
        let (hashes_end, tokens_end) = match self.spans.as_slice().first() {
            Some(next) => (next.hashes, next.tokens),
            None => (batch.hashes.len(), batch.tokens.len()),
        };
        let hashes = batch
            .hashes
            .get(span.hashes..hashes_end)
            .unwrap_or_default();
        Some(match span.kind {
            SpanKind::Stored(parent) => CacheEvent::Stored {
                parent,
                hashes,
                tokens: batch
                    .tokens
                    .get(span.tokens..tokens_end)
                    .unwrap_or_default(),
            },
            SpanKind::Removed => CacheEvent::Removed { hashes },
            SpanKind::Cleared => CacheEvent::Cleared,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for Events<'_> {}

/// Sent instead of the batches a lagging subscriber missed (and first to a
/// new subscriber): the whole registered set, which replaces the mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resync {
    /// The state reflects every batch up to and including this one; the
    /// next [`EventBatch`] is `sequence + 1`.
    pub sequence: u64,
    /// Batches this subscriber lost since its previous resync.
    pub missed_batches: u64,
    /// Every registered hash, by position, so a parent precedes its
    /// children. (Tokens are not kept by the pool, so a snapshot has none.)
    pub registered: Vec<SequenceHash>,
}

impl Resync {
    /// A snapshot of `registered` as of batch `sequence`, after
    /// `missed_batches` lost ones: what a pool sends, for a consumer's
    /// tests to build.
    pub fn new(sequence: u64, missed_batches: u64, registered: Vec<SequenceHash>) -> Self {
        Self {
            sequence,
            missed_batches,
            registered,
        }
    }
}

/// What a subscription delivers. Shared, so one batch fans out to many
/// subscribers without copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventMessage {
    /// The next batch.
    Batch(Arc<EventBatch>),
    /// Start over from this snapshot.
    Resync(Arc<Resync>),
}

/// The receiving end of [`BlockManager::subscribe_events`](crate::BlockManager::subscribe_events).
///
/// Dropping it unsubscribes (the pool notices at its next flush).
#[derive(Debug)]
pub struct EventSubscription {
    receiver: Receiver<EventMessage>,
    missed: Arc<AtomicU64>,
}

impl EventSubscription {
    /// The next message, if one is waiting.
    pub fn try_recv(&self) -> Option<EventMessage> {
        // A look at the channel's ends is cheaper than a failed receive, and
        // a consumer polling after each step mostly finds nothing.
        if self.receiver.is_empty() {
            return None;
        }
        self.receiver.try_recv().ok()
    }

    /// The next message, waiting up to `timeout`; `None` if none came or the
    /// pool is gone.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<EventMessage> {
        self.receiver.recv_timeout(timeout).ok()
    }

    /// Every message waiting now, oldest first.
    pub fn drain(&self) -> Vec<EventMessage> {
        self.receiver.try_iter().collect()
    }

    /// The channel itself, for `select!` with other channels.
    pub fn receiver(&self) -> &Receiver<EventMessage> {
        &self.receiver
    }

    /// Batches this subscription has lost to a full channel, ever (each loss
    /// is followed by a [`Resync`]).
    pub fn missed_batches(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}
