//! The pool's side of event subscriptions: the events pending since the last
//! flush, the run the next block may extend, and the subscribers' channels.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Sender, TrySendError};

use super::spares::Spares;
use super::{CacheEvent, EventBatch, EventMessage, EventSubscription, MAX_PENDING_BLOCKS, Resync};
use crate::SequenceHash;

/// One subscription's sending end and what it has lost.
struct Subscriber {
    sender: Sender<EventMessage>,
    missed: Arc<AtomicU64>,
    /// Batches lost since the last resync this subscriber received.
    missed_since_resync: u64,
    /// Owes a resync (lost a batch, or just joined).
    behind: bool,
}

/// The pending events and the subscribers, kept in the pool's state.
pub(crate) struct EventLog {
    /// Finished events, oldest first; `open` comes after them.
    pending: Vec<CacheEvent>,
    /// The newest event while it may still grow, kept out of `pending` so
    /// that adding a block to it reaches into no list.
    open: OpenRun,
    pending_blocks: usize,
    /// Blocks and tokens the registration under way may still store: the
    /// capacity a new `Stored` run starts with, so it is not regrown block
    /// by block.
    run_hint: (usize, usize),
    /// Blocks recent batches removed (the last one's, or half the hint
    /// before it if more; at most a full batch): the capacity a batch's
    /// `Removed` starts with.
    removed_hint: usize,
    subscribers: Vec<Subscriber>,
    /// The sequence number of the last batch sent.
    last_sequence: u64,
    /// The last batch sent, kept so that once every subscriber has dropped
    /// it, its allocation and buffers serve the next batch.
    last_batch: Option<Arc<EventBatch>>,
    spares: Spares,
}

/// A run of blocks the next registration or eviction may extend.
enum OpenRun {
    None,
    Stored {
        hashes: Vec<SequenceHash>,
        tokens: Vec<u32>,
        /// The last hash's value: a block whose parent it is continues the run.
        tail: u128,
    },
    Removed {
        hashes: Vec<SequenceHash>,
    },
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("pending", &self.pending.len())
            .field("subscribers", &self.subscribers.len())
            .field("last_sequence", &self.last_sequence)
            .finish()
    }
}

impl EventLog {
    pub(crate) fn new() -> Self {
        Self {
            pending: Vec::new(),
            open: OpenRun::None,
            pending_blocks: 0,
            run_hint: (0, 0),
            removed_hint: 0,
            subscribers: Vec::new(),
            last_sequence: 0,
            last_batch: None,
            spares: Spares::default(),
        }
    }

    /// A new subscriber, owed a resync (it knows nothing yet).
    pub(crate) fn subscribe(&mut self, capacity: usize) -> EventSubscription {
        let (sender, receiver) = crossbeam_channel::bounded(capacity.max(1));
        let missed = Arc::new(AtomicU64::new(0));
        self.subscribers.push(Subscriber {
            sender,
            missed: missed.clone(),
            missed_since_resync: 0,
            behind: true,
        });
        EventSubscription { receiver, missed }
    }

    /// Announces a registration of up to `blocks` blocks and `tokens`
    /// tokens (see `run_hint`).
    pub(crate) fn expect_run(&mut self, blocks: usize, tokens: usize) {
        self.run_hint = (blocks, tokens);
    }

    /// Records a first registration, extending the last event when it is a
    /// `Stored` run this block continues (so a batch names a sequence's new
    /// blocks in one event, as routers expect).
    #[inline]
    pub(crate) fn stored(&mut self, hash: SequenceHash, tokens: &[u32]) {
        self.pending_blocks += 1;
        if let OpenRun::Stored {
            hashes,
            tokens: run,
            tail,
        } = &mut self.open
            && Some(*tail) == hash.parent()
            && run.is_empty() == tokens.is_empty()
        {
            hashes.push(hash);
            *tail = hash.value();
            if !tokens.is_empty() {
                run.extend_from_slice(tokens);
            }
            return;
        }
        self.close_run();
        let (blocks, run_tokens) = self.run_hint;
        let mut hashes = self.spares.hashes(blocks.max(1));
        hashes.push(hash);
        let mut run = self.spares.tokens(run_tokens.max(tokens.len()));
        run.extend_from_slice(tokens);
        self.open = OpenRun::Stored {
            hashes,
            tokens: run,
            tail: hash.value(),
        };
    }

    /// Records an eviction, extending the last event when it is a `Removed`.
    #[inline]
    pub(crate) fn removed(&mut self, hash: SequenceHash) {
        self.pending_blocks += 1;
        if let OpenRun::Removed { hashes } = &mut self.open {
            hashes.push(hash);
            return;
        }
        self.close_run();
        let mut hashes = self.spares.hashes(self.removed_hint.max(1));
        hashes.push(hash);
        self.open = OpenRun::Removed { hashes };
    }

    /// Records that the registry was emptied.
    pub(crate) fn cleared(&mut self) {
        self.close_run();
        self.pending.push(CacheEvent::Cleared);
    }

    /// Moves the open run, if any, to the end of `pending`.
    fn close_run(&mut self) {
        match std::mem::replace(&mut self.open, OpenRun::None) {
            OpenRun::None => {}
            OpenRun::Stored { hashes, tokens, .. } => {
                self.pending.push(CacheEvent::Stored { hashes, tokens });
            }
            OpenRun::Removed { hashes } => self.pending.push(CacheEvent::Removed { hashes }),
        }
    }

    /// Whether the pending events are due for a flush of their own.
    pub(crate) fn is_full(&self) -> bool {
        self.pending_blocks >= MAX_PENDING_BLOCKS
    }

    /// Whether a flush would send nothing: no events are pending and no
    /// subscriber owes a resync it has room for.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && matches!(self.open, OpenRun::None) && !self.wants_snapshot()
    }

    /// Whether a flush would need a snapshot: some subscriber owes a resync
    /// and has room for it.
    pub(crate) fn wants_snapshot(&self) -> bool {
        self.subscribers
            .iter()
            .any(|s| s.behind && !s.sender.is_full())
    }

    /// Sends the pending events as one batch to every subscriber that keeps
    /// up, and `snapshot` (the registered set after them) to those owed a
    /// resync. Forgets subscribers that hung up; returns whether any remain.
    pub(crate) fn flush(&mut self, snapshot: Option<Vec<SequenceHash>>) -> bool {
        self.close_run();
        let batch = (!self.pending.is_empty()).then(|| {
            self.last_sequence += 1;
            self.pending_blocks = 0;
            let removed = (self.pending.iter())
                .map(|event| match event {
                    CacheEvent::Removed { hashes } => hashes.len(),
                    _ => 0,
                })
                .sum();
            // Halving, not forgetting: a batch without evictions between
            // two with them leaves the next removal run room to start.
            self.removed_hint = (self.removed_hint / 2).max(removed);
            self.next_batch()
        });
        let sequence = self.last_sequence;
        self.subscribers.retain_mut(|subscriber| {
            if subscriber.behind
                && let Some(registered) = &snapshot
            {
                // The snapshot is the state after this batch, so a
                // subscriber that takes it loses nothing more.
                let resync = Resync {
                    sequence,
                    missed_batches: subscriber.missed_since_resync,
                    registered: registered.clone(),
                };
                return match subscriber.send(EventMessage::Resync(Arc::new(resync))) {
                    Sent::Yes => {
                        subscriber.behind = false;
                        subscriber.missed_since_resync = 0;
                        true
                    }
                    Sent::Full => {
                        subscriber.lose(batch.is_some());
                        true
                    }
                    Sent::HungUp => false,
                };
            }
            let Some(batch) = &batch else {
                return true;
            };
            if subscriber.behind {
                subscriber.lose(true);
                return true;
            }
            match subscriber.send(EventMessage::Batch(batch.clone())) {
                Sent::Yes => true,
                Sent::Full => {
                    subscriber.behind = true;
                    subscriber.lose(true);
                    true
                }
                Sent::HungUp => false,
            }
        });
        !self.subscribers.is_empty()
    }
}

impl EventLog {
    /// The pending events as the next batch: in the last batch's allocation
    /// when every subscriber has dropped it (its buffers become spares),
    /// in a new one otherwise.
    fn next_batch(&mut self) -> Arc<EventBatch> {
        let sequence = self.last_sequence;
        if let Some(mut batch) = self.last_batch.take()
            && let Some(last) = Arc::get_mut(&mut batch)
        {
            self.spares.reclaim(&mut last.events);
            last.sequence = sequence;
            std::mem::swap(&mut last.events, &mut self.pending);
            self.last_batch = Some(batch.clone());
            return batch;
        }
        // A batch is a removal run and a few stored runs: room for as many
        // events as this one had (and a removal and a store at least), so
        // the next does not regrow.
        let room = Vec::with_capacity(self.pending.len().max(2));
        let batch = Arc::new(EventBatch {
            sequence,
            events: std::mem::replace(&mut self.pending, room),
        });
        self.last_batch = Some(batch.clone());
        batch
    }
}

enum Sent {
    Yes,
    Full,
    HungUp,
}

impl Subscriber {
    fn send(&self, message: EventMessage) -> Sent {
        match self.sender.try_send(message) {
            Ok(()) => Sent::Yes,
            Err(TrySendError::Full(_)) => Sent::Full,
            Err(TrySendError::Disconnected(_)) => Sent::HungUp,
        }
    }

    fn lose(&mut self, lost: bool) {
        if lost {
            self.missed_since_resync += 1;
            self.missed.fetch_add(1, Ordering::Relaxed);
        }
    }
}
