//! The pool's side of event subscriptions: the events pending since the last
//! flush, the run the next block may extend, and the subscribers' channels.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Sender, TrySendError};

use super::{EventBatch, EventMessage, EventSubscription, MAX_PENDING_BLOCKS, Resync, SpanKind};
use crate::SequenceHash;

/// One subscription's sending end and what it has lost.
struct Subscriber {
    sender: Sender<EventMessage>,
    missed: Arc<AtomicU64>,
    /// Batches lost since the last resync this subscriber received.
    missed_since_resync: u64,
    /// Owes a resync (lost a batch, or just joined).
    behind: bool,
    /// Its receiver is gone: forgotten after this flush.
    hung_up: bool,
}

/// The pending events and the subscribers, kept in the pool's state.
pub(crate) struct EventLog {
    /// The events since the last flush: the next batch, built in place.
    batch: EventBatch,
    /// What the newest event is, while the next block may extend it.
    open: OpenRun,
    subscribers: Vec<Subscriber>,
    /// The sequence number of the last batch sent.
    last_sequence: u64,
    /// The last batch sent, kept so that once every subscriber has dropped
    /// it, it becomes the batch built next (allocation and buffers).
    last_batch: Option<Arc<EventBatch>>,
}

/// The newest event of the batch being built, if a block may extend it.
#[derive(Clone, Copy)]
enum OpenRun {
    None,
    Stored {
        /// The last hash's value: a block whose parent it is continues the
        /// run. Kept beside the batch rather than read from its last hash,
        /// which costs a registration 14 more instructions per block.
        tail: u128,
        /// Whether the run carries tokens (a block continues it only alike).
        with_tokens: bool,
    },
    Removed,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("pending", &self.batch.len())
            .field("subscribers", &self.subscribers.len())
            .field("last_sequence", &self.last_sequence)
            .finish()
    }
}

impl EventLog {
    pub(crate) fn new() -> Self {
        Self {
            batch: EventBatch::default(),
            open: OpenRun::None,
            subscribers: Vec::new(),
            last_sequence: 0,
            last_batch: None,
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
            hung_up: false,
        });
        EventSubscription { receiver, missed }
    }

    /// Makes room for a registration of up to `blocks` blocks and `tokens`
    /// tokens, so the batch does not regrow block by block.
    pub(crate) fn reserve(&mut self, blocks: usize, tokens: usize) {
        self.batch.hashes.reserve(blocks);
        self.batch.tokens.reserve(tokens);
    }

    /// Records a first registration, extending the last event when it is a
    /// `Stored` run this block continues (so a batch names a sequence's new
    /// blocks in one event, as routers expect).
    #[inline]
    pub(crate) fn stored(&mut self, hash: SequenceHash, tokens: &[u32]) {
        let with_tokens = !tokens.is_empty();
        match &mut self.open {
            OpenRun::Stored {
                tail,
                with_tokens: alike,
            } if Some(*tail) == hash.parent() && *alike == with_tokens => *tail = hash.value(),
            open => {
                *open = OpenRun::Stored {
                    tail: hash.value(),
                    with_tokens,
                };
                self.batch.open(SpanKind::Stored(hash.parent()));
            }
        }
        self.batch.extend(hash.value(), tokens);
    }

    /// Records the eviction of hash `value`, extending the last event when it
    /// is a `Removed`.
    #[inline]
    pub(crate) fn removed(&mut self, value: u128) {
        if !matches!(self.open, OpenRun::Removed) {
            self.open = OpenRun::Removed;
            self.batch.open(SpanKind::Removed);
        }
        self.batch.extend(value, &[]);
    }

    /// Records that the registry was emptied.
    pub(crate) fn cleared(&mut self) {
        self.open = OpenRun::None;
        self.batch.push_cleared();
    }

    /// Whether the pending events are due for a flush of their own.
    pub(crate) fn is_full(&self) -> bool {
        self.batch.blocks() >= MAX_PENDING_BLOCKS
    }

    /// Whether a flush would send nothing: no events are pending and no
    /// subscriber owes a resync it has room for.
    pub(crate) fn is_idle(&self) -> bool {
        self.batch.is_empty() && !self.wants_snapshot()
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
        self.open = OpenRun::None;
        let batch = (!self.batch.is_empty()).then(|| {
            self.last_sequence += 1;
            self.send_batch()
        });
        let sequence = self.last_sequence;
        let mut hung_up = false;
        for subscriber in &mut self.subscribers {
            hung_up |= !subscriber.deliver(batch.as_ref(), snapshot.as_deref(), sequence);
        }
        if hung_up {
            self.subscribers.retain(|subscriber| !subscriber.hung_up);
        }
        !self.subscribers.is_empty()
    }
}

impl EventLog {
    /// The batch built so far, numbered and shared, with an empty one in
    /// its place: the last batch sent when every subscriber has dropped it
    /// (allocation and buffers reused), a new one otherwise.
    fn send_batch(&mut self) -> Arc<EventBatch> {
        self.batch.sequence = self.last_sequence;
        if let Some(mut batch) = self.last_batch.take()
            && let Some(last) = Arc::get_mut(&mut batch)
        {
            std::mem::swap(last, &mut self.batch);
            self.batch.clear();
            self.last_batch = Some(batch.clone());
            return batch;
        }
        // Room for as much as this one held, so the next does not regrow.
        let room = EventBatch {
            sequence: 0,
            hashes: Vec::with_capacity(self.batch.hashes.len()),
            tokens: Vec::with_capacity(self.batch.tokens.len()),
            spans: Vec::with_capacity(self.batch.spans.len()),
        };
        let batch = Arc::new(std::mem::replace(&mut self.batch, room));
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
    /// Sends this flush's `batch` (if any) or, when owed one and there is a
    /// `snapshot` (the registered set after the batch), a resync; whether
    /// the receiver is still there.
    fn deliver(
        &mut self,
        batch: Option<&Arc<EventBatch>>,
        snapshot: Option<&[SequenceHash]>,
        sequence: u64,
    ) -> bool {
        let sent = match (self.behind, snapshot, batch) {
            (true, Some(registered), _) => {
                // The snapshot is the state after this batch, so a
                // subscriber that takes it loses nothing more.
                let resync = Resync {
                    sequence,
                    missed_batches: self.missed_since_resync,
                    registered: registered.to_vec(),
                };
                let sent = self.send(EventMessage::Resync(Arc::new(resync)));
                match sent {
                    Sent::Yes => {
                        self.behind = false;
                        self.missed_since_resync = 0;
                    }
                    Sent::Full => self.lose(batch.is_some()),
                    Sent::HungUp => {}
                }
                sent
            }
            (_, _, None) => Sent::Yes,
            (true, None, Some(_)) => {
                self.lose(true);
                Sent::Yes
            }
            (false, _, Some(batch)) => {
                let sent = self.send(EventMessage::Batch(batch.clone()));
                if let Sent::Full = sent {
                    self.behind = true;
                    self.lose(true);
                }
                sent
            }
        };
        self.hung_up = matches!(sent, Sent::HungUp);
        !self.hung_up
    }

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
