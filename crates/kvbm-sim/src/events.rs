//! The engine's cache events during a replay: counted for the report and
//! handed to an [`EventSink`] (vLLM's wire in `kvbm-sim serve --kv-events`,
//! the router in cluster mode).

use kvbm_blocks::{CacheEvent, EventMessage, EventSubscription};
use serde_json::json;

use crate::SimError;

/// Messages a subscription may hold between two drains. The replay drains
/// after every step, and a step is one batch, so this is ample; overflow
/// would still be counted ([`KvEventCounts::missed_batches`]).
pub(crate) const SUBSCRIPTION_CAPACITY: usize = 1024;

/// Where a replay's cache events go, one message per scheduler step.
pub trait EventSink {
    /// Takes one message (a batch, or a resync after lag or at the start).
    ///
    /// # Errors
    ///
    /// Whatever the sink cannot do (a socket error): the replay stops with it.
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError>;

    /// Publishes one message of a lower tier's pool (`medium`: `"CPU"`,
    /// `"DISK"`): its stores and removals, to be sent with that medium. The
    /// default drops them (a sink that speaks for the device only).
    ///
    /// # Errors
    ///
    /// As [`publish`](Self::publish).
    fn publish_on(&mut self, medium: &str, message: &EventMessage) -> Result<(), SimError> {
        let _ = (medium, message);
        Ok(())
    }

    /// Called once the replay's last step is published: a sink that works
    /// in the background finishes here (the replay's time includes it).
    ///
    /// # Errors
    ///
    /// Whatever the sink could not do.
    fn finish(&mut self) -> Result<(), SimError> {
        Ok(())
    }
}

/// Whether `message` is the resync a subscription opens with, of a pool
/// still empty. Sent for a lower tier, vLLM's wire can only say it as
/// `AllBlocksCleared`, which a router applies to every medium of the
/// engine, its device blocks included: a lower tier's sink skips it (there
/// is nothing to forget).
pub(crate) fn is_empty_opening(message: &EventMessage) -> bool {
    matches!(message, EventMessage::Resync(resync)
        if resync.registered.is_empty() && resync.missed_batches == 0)
}

/// What a replay's event stream held (the JSON report's `kv_events`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEventCounts {
    /// Batches (one per step that stored or evicted something).
    pub batches: u64,
    /// Blocks announced as stored.
    pub stored_blocks: u64,
    /// Blocks announced as removed.
    pub removed_blocks: u64,
    /// Whole-cache clears.
    pub cleared: u64,
    /// Resyncs (the subscription's first message, and one after any lag).
    pub resyncs: u64,
    /// Batches the subscription lost to a full channel (0 unless the sink
    /// falls behind).
    pub missed_batches: u64,
}

impl KvEventCounts {
    /// Counts one message.
    pub fn record(&mut self, message: &EventMessage) {
        match message {
            EventMessage::Resync(_) => self.resyncs += 1,
            EventMessage::Batch(batch) => {
                self.batches += 1;
                for event in batch.events() {
                    match event {
                        CacheEvent::Stored { hashes, .. } => {
                            self.stored_blocks += hashes.len() as u64;
                        }
                        CacheEvent::Removed { hashes } => {
                            self.removed_blocks += hashes.len() as u64;
                        }
                        CacheEvent::Cleared => self.cleared += 1,
                    }
                }
            }
        }
    }

    /// Both streams' counts together.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            batches: self.batches + other.batches,
            stored_blocks: self.stored_blocks + other.stored_blocks,
            removed_blocks: self.removed_blocks + other.removed_blocks,
            cleared: self.cleared + other.cleared,
            resyncs: self.resyncs + other.resyncs,
            missed_batches: self.missed_batches + other.missed_batches,
        }
    }

    /// The counts as the JSON report's `kv_events` object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "batches": self.batches,
            "stored_blocks": self.stored_blocks,
            "removed_blocks": self.removed_blocks,
            "cleared": self.cleared,
            "resyncs": self.resyncs,
            "missed_batches": self.missed_batches,
        })
    }
}

/// One engine's subscription and what came through it.
#[derive(Debug)]
pub(crate) struct EventTap {
    subscription: EventSubscription,
    counts: KvEventCounts,
}

impl EventTap {
    pub(crate) fn new(subscription: EventSubscription) -> Self {
        Self {
            subscription,
            counts: KvEventCounts::default(),
        }
    }

    /// Hands every waiting message to `sink`, counting them.
    pub(crate) fn pump(&mut self, sink: &mut dyn EventSink) -> Result<(), SimError> {
        // Called every step, and most steps send nothing: looking at the
        // channel's ends is a fraction of a failed receive.
        let receiver = self.subscription.receiver();
        while !receiver.is_empty() {
            let Some(message) = self.subscription.try_recv() else {
                break;
            };
            self.counts.record(&message);
            sink.publish(&message)?;
        }
        Ok(())
    }

    /// [`pump`](Self::pump) of a lower tier's pool: each message goes to
    /// [`EventSink::publish_on`] with `medium`.
    pub(crate) fn pump_on(
        &mut self,
        medium: &str,
        sink: &mut dyn EventSink,
    ) -> Result<(), SimError> {
        let receiver = self.subscription.receiver();
        while !receiver.is_empty() {
            let Some(message) = self.subscription.try_recv() else {
                break;
            };
            self.counts.record(&message);
            sink.publish_on(medium, &message)?;
        }
        Ok(())
    }

    pub(crate) fn counts(&self) -> KvEventCounts {
        KvEventCounts {
            missed_batches: self.subscription.missed_batches(),
            ..self.counts
        }
    }
}
