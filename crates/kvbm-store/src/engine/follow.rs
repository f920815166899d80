//! Keeping a store's contents to what its tier holds: the tier's pool
//! announces every eviction as a `Removed` event, and the store drops those
//! keys before the engine writes into it again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use kvbm_blocks::{CacheEvent, EventMessage, EventSubscription, Resync};

use super::stats::{Counters, add};
use crate::BlockStore;

/// One lower tier's event subscription, applied to its store.
#[derive(Debug)]
pub(crate) struct Follower {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    subscription: EventSubscription,
    /// The first message of a subscription is the snapshot it starts from.
    started: bool,
}

impl Follower {
    pub(crate) fn new(subscription: EventSubscription) -> Self {
        Self {
            state: Mutex::new(State {
                subscription,
                started: false,
            }),
        }
    }

    /// Applies every removal announced so far to `store`. Workers call it
    /// before writing into the store, so a slot the tier freed is free in
    /// the store too.
    ///
    /// When the tier forgot more than the events said (it was cleared, or
    /// this subscription lagged and got a snapshot), every stored key the
    /// tier does not hold is removed. A block whose store just completed
    /// and is not yet reported to the tier may go with them: its load then
    /// finds it missing and the request recomputes; nothing wrong is ever
    /// loaded.
    pub(crate) fn sync(&self, store: &Arc<dyn BlockStore>, counters: &Counters) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(message) = state.subscription.try_recv() {
            match message {
                EventMessage::Batch(batch) => {
                    for event in batch.events() {
                        match event {
                            CacheEvent::Removed { hashes } => remove(store, hashes, counters),
                            CacheEvent::Cleared => retain(store, &HashSet::new(), counters),
                            CacheEvent::Stored { .. } => {}
                        }
                    }
                }
                EventMessage::Resync(resync) => {
                    if state.started || resync.missed_batches > 0 {
                        add(
                            &counters.missed_removal_batches,
                            usize::try_from(resync.missed_batches).unwrap_or(usize::MAX),
                        );
                        tracing::warn!(
                            missed = resync.missed_batches,
                            "a tier's event stream lagged: its store is brought back in line"
                        );
                        retain(store, &registered(&resync), counters);
                    }
                    state.started = true;
                }
            }
        }
    }
}

fn registered(resync: &Resync) -> HashSet<u128> {
    resync.registered.iter().map(|hash| hash.value()).collect()
}

fn remove(store: &Arc<dyn BlockStore>, keys: &[u128], counters: &Counters) {
    let removed = store.remove(keys);
    let hits = removed.iter().filter(|r| matches!(r, Ok(true)));
    add(&counters.removed_blocks, hits.count());
}

/// Removes every stored key not in `keep`.
fn retain(store: &Arc<dyn BlockStore>, keep: &HashSet<u128>, counters: &Counters) {
    match store.keys() {
        Ok(keys) => {
            let stale: Vec<u128> = keys.into_iter().filter(|k| !keep.contains(k)).collect();
            remove(store, &stale, counters);
        }
        Err(err) => tracing::warn!(%err, "a store kept keys its tier forgot"),
    }
}
