//! The one place this crate takes its locks and atomics from.
//!
//! Under `--cfg kvbm_loom` every one is loom's, so `tests/loom_router.rs`
//! explores the interleavings of the real router code. The workers map is a
//! [`WorkerMap`]: a `DashMap` normally, and under loom (dashmap's shard
//! locks are not loom's) two loom `RwLock<HashMap>` shards, by worker id
//! parity, so the models see both what one shard's lock serializes and what
//! two shards let overlap. The prefix index's locks (its worker table, key
//! shards and sweep lock) and its per-worker counters come from here too,
//! its shards shrunk to two under loom (`index/shards.rs`). The media
//! interner (`medium.rs`) stays on std: it takes no other lock inside its
//! own, so it adds no interleavings of interest.

use std::sync::PoisonError;

#[cfg(not(kvbm_loom))]
pub(crate) use std::sync::{
    Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence},
};

#[cfg(kvbm_loom)]
pub(crate) use loom::sync::{
    Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence},
};

pub(crate) use map::{WorkerMap, WorkerRef};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// No critical section in this crate panics halfway through a change (they
/// run no caller code), so a poisoned lock still guards consistent state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `lock`, recovering the data as [`lock`] does.
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `lock`, recovering the data as [`lock`] does.
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// A `DashMap` from worker ids, through exactly the operations the router
/// uses: each inlines to dashmap's own, and a lookup hands out dashmap's
/// `Ref` (its shard's read guard) as is.
#[cfg(not(kvbm_loom))]
mod map {
    use std::fmt;

    use dashmap::DashMap;
    use foldhash::fast::RandomState;

    use crate::WorkerId;

    /// One worker's entry, its shard read-locked while it lives.
    pub(crate) type WorkerRef<'a, V> = dashmap::mapref::one::Ref<'a, WorkerId, V>;

    /// Workers' entries, sharded: a lookup read-locks the key's shard, an
    /// insertion or removal write-locks it.
    pub(crate) struct WorkerMap<V>(DashMap<WorkerId, V, RandomState>);

    impl<V> WorkerMap<V> {
        pub(crate) fn new() -> Self {
            Self(DashMap::default())
        }

        /// Sets `worker`'s entry; the one it replaces.
        #[inline]
        pub(crate) fn insert(&self, worker: WorkerId, value: V) -> Option<V> {
            self.0.insert(worker, value)
        }

        /// Removes `worker`'s entry, once no lookup of its shard holds it.
        #[inline]
        pub(crate) fn remove(&self, worker: WorkerId) -> Option<V> {
            self.0.remove(&worker).map(|(_, value)| value)
        }

        /// `worker`'s entry, its shard read-locked until the `WorkerRef`
        /// drops.
        #[inline]
        pub(crate) fn get(&self, worker: WorkerId) -> Option<WorkerRef<'_, V>> {
            self.0.get(&worker)
        }

        /// Entries, counted shard by shard.
        pub(crate) fn len(&self) -> usize {
            self.0.len()
        }
    }

    impl<V: fmt::Debug> fmt::Debug for WorkerMap<V> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&self.0, f)
        }
    }
}

/// The loom stand-in: two shards, each a loom `RwLock<HashMap>`, worker
/// `id` in shard `id % 2`, locked as dashmap locks its shards.
#[cfg(kvbm_loom)]
mod map {
    use std::collections::HashMap;
    use std::ops::Deref;

    use super::{RwLock, RwLockReadGuard, read, write};
    use crate::WorkerId;

    const SHARDS: usize = 2;

    type Shard<V> = RwLock<HashMap<WorkerId, V>>;

    /// One worker's entry, its shard read-locked while it lives.
    #[derive(Debug)]
    pub(crate) struct WorkerRef<'a, V> {
        shard: RwLockReadGuard<'a, HashMap<WorkerId, V>>,
        worker: WorkerId,
    }

    impl<V> Deref for WorkerRef<'_, V> {
        type Target = V;

        fn deref(&self) -> &V {
            // Present: looked up under this same read guard.
            &self.shard[&self.worker]
        }
    }

    /// Workers' entries, in two shards.
    #[derive(Debug)]
    pub(crate) struct WorkerMap<V>([Shard<V>; SHARDS]);

    impl<V> WorkerMap<V> {
        pub(crate) fn new() -> Self {
            Self(std::array::from_fn(|_| RwLock::new(HashMap::new())))
        }

        fn shard(&self, worker: WorkerId) -> &Shard<V> {
            // The remainder is below `SHARDS`, a `usize`.
            &self.0[(worker % SHARDS as u64) as usize]
        }

        pub(crate) fn insert(&self, worker: WorkerId, value: V) -> Option<V> {
            write(self.shard(worker)).insert(worker, value)
        }

        pub(crate) fn remove(&self, worker: WorkerId) -> Option<V> {
            // The guard drops here, so the caller drops the entry after
            // the shard's lock, as dashmap's callers do.
            write(self.shard(worker)).remove(&worker)
        }

        pub(crate) fn get(&self, worker: WorkerId) -> Option<WorkerRef<'_, V>> {
            let shard = read(self.shard(worker));
            if shard.contains_key(&worker) {
                Some(WorkerRef { shard, worker })
            } else {
                None
            }
        }

        pub(crate) fn len(&self) -> usize {
            self.0.iter().map(|shard| read(shard).len()).sum()
        }
    }
}
