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
//! branch, and a flush one relaxed atomic load. With subscribers that drop
//! each batch before the next flush, the pool reuses the batch's buffers and
//! allocates nothing per batch.

mod log;
mod spares;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Receiver;

use crate::SequenceHash;

pub(crate) use self::log::EventLog;

/// Pending events are flushed on their own once they name this many blocks,
/// so a pool nobody flushes keeps bounded memory (its subscribers then see
/// more, smaller batches, or lag).
pub const MAX_PENDING_BLOCKS: usize = 1 << 16;

/// A change to the set of matchable hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive blocks of one sequence became matchable (first
    /// registrations; deduplicated ones are not announced again).
    /// `hashes[0].parent()` is the parent of the first; each later hash is
    /// its predecessor's child.
    Stored {
        /// The blocks' hashes, in chain order.
        hashes: Vec<SequenceHash>,
        /// Their tokens, `block_size` per block in order, when the blocks
        /// were registered with
        /// [`register_blocks_with_tokens`](crate::BlockManager::register_blocks_with_tokens);
        /// empty otherwise.
        tokens: Vec<u32>,
    },
    /// Blocks stopped being matchable (evicted), in eviction order.
    Removed {
        /// The evicted hashes.
        hashes: Vec<SequenceHash>,
    },
    /// [`clear_cache`](crate::BlockManager::clear_cache) emptied the whole
    /// registry: nothing is matchable.
    Cleared,
}

/// The events between two flushes, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventBatch {
    /// The pool's batch counter: consecutive for a subscriber that keeps up.
    pub sequence: u64,
    /// What happened, in order.
    pub events: Vec<CacheEvent>,
}

/// Sent instead of the batches a lagging subscriber missed (and first to a
/// new subscriber): the whole registered set, which replaces the mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
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
