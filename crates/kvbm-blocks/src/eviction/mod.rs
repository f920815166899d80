//! The inactive pool: registered blocks no handle holds, in eviction order.
//!
//! One enum rather than a trait object so the per-block calls on the match and
//! release paths are direct, inlinable branches.

mod lineage;
mod list;
mod multi_level;
mod ring;
pub(crate) mod sketch;

use crate::{BlockId, EvictionPolicy, SequenceHash};

use self::lineage::Lineage;
use self::multi_level::MultiLevel;
pub(crate) use self::ring::LruRing;

/// Cached blocks, ordered for eviction by the configured policy.
///
/// With an explicit tag (`repr(u8)`), asking which policy it is loads and
/// compares one byte. Without one the tag sat in a niche of a variant's
/// field, and every match, release and registration decoded it (about
/// ten instructions); the tag costs one word per pool.
#[derive(Debug)]
#[repr(u8)]
pub(crate) enum InactivePool {
    Lru(LruRing),
    MultiLevel(MultiLevel),
    Lineage(Lineage),
}

impl InactivePool {
    pub(crate) fn new(policy: EvictionPolicy, slots: usize) -> Self {
        match policy {
            EvictionPolicy::Lru => Self::Lru(LruRing::new(slots)),
            EvictionPolicy::MultiLevelLru => Self::MultiLevel(MultiLevel::new(slots)),
            EvictionPolicy::Lineage => Self::Lineage(Lineage::new(slots)),
        }
    }

    /// Cached blocks.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Lru(lru) => lru.len(),
            Self::MultiLevel(ml) => ml.len(),
            Self::Lineage(lin) => lin.len(),
        }
    }

    /// Whether registrations must say which registered block is the parent.
    pub(crate) fn tracks_lineage(&self) -> bool {
        matches!(self, Self::Lineage(_))
    }

    /// Whether `id` is cached here.
    pub(crate) fn contains(&self, id: BlockId) -> bool {
        let lists = match self {
            Self::Lru(lru) => return lru.contains(id),
            Self::MultiLevel(ml) => ml.lists(),
            Self::Lineage(lin) => lin.lists(),
        };
        lists.list_of(id).is_some()
    }

    /// A block was registered as the primary for `hash`; `parent` is the
    /// registered block holding the parent hash, if any, with its slot's
    /// epoch.
    #[inline]
    pub(crate) fn on_register(
        &mut self,
        id: BlockId,
        hash: SequenceHash,
        parent: Option<(BlockId, u32)>,
    ) {
        match self {
            Self::Lru(_) => {}
            Self::MultiLevel(ml) => ml.touch(hash),
            Self::Lineage(lin) => lin.link(id, parent),
        }
    }

    /// Whether [`on_hit`](Self::on_hit) does anything: a loop over many
    /// hits asks once.
    #[inline]
    pub(crate) fn tracks_hits(&self) -> bool {
        matches!(self, Self::MultiLevel(_))
    }

    /// A registered block was matched or deduplicated against.
    #[inline]
    pub(crate) fn on_hit(&mut self, hash: SequenceHash) {
        if let Self::MultiLevel(ml) = self {
            ml.touch(hash);
        }
    }

    /// The last handle of a registered block dropped: it is now cached.
    /// Always inlined: with several callers the compiler would call it, and
    /// a release pays the call for every block.
    #[inline(always)]
    pub(crate) fn insert(&mut self, id: BlockId, hash: SequenceHash) {
        match self {
            Self::Lru(lru) => lru.push(id),
            Self::MultiLevel(ml) => ml.insert(id, hash),
            Self::Lineage(lin) => lin.insert(id),
        }
    }

    /// [`insert`](Self::insert) of each of `ids` (with its hash of
    /// `hashes`), last first: a released batch, dispatched to the policy
    /// once rather than per block.
    #[inline]
    pub(crate) fn insert_last_first(&mut self, ids: &[BlockId], hashes: &[SequenceHash]) {
        let blocks = ids.iter().zip(hashes).rev();
        match self {
            Self::Lru(lru) => lru.push_last_first(ids),
            Self::MultiLevel(ml) => blocks.for_each(|(&id, &hash)| ml.insert(id, hash)),
            Self::Lineage(lin) => blocks.for_each(|(&id, _)| lin.insert(id)),
        }
    }

    /// A cached block was matched again and leaves the pool.
    #[inline]
    pub(crate) fn remove(&mut self, id: BlockId) {
        let removed = match self {
            Self::Lru(lru) => lru.remove(id),
            Self::MultiLevel(ml) => ml.lists_mut().unlink(id).is_some(),
            Self::Lineage(lin) => lin.lists_mut().unlink(id).is_some(),
        };
        debug_assert!(removed, "{id} was not cached");
    }

    /// Picks the next victim and removes it from the pool. The caller
    /// unregisters it and then calls [`on_evicted`](Self::on_evicted).
    /// Inlined: a dispatch to the policy, once per evicted block.
    #[inline]
    pub(crate) fn evict(&mut self) -> Option<BlockId> {
        match self {
            Self::Lru(lru) => lru.pop(),
            Self::MultiLevel(ml) => ml.evict(),
            Self::Lineage(lin) => lin.evict(),
        }
    }

    /// `id` is no longer registered (its slot will be reused); `epoch_of`
    /// reads a slot's epoch.
    pub(crate) fn on_evicted(&mut self, id: BlockId, epoch_of: impl Fn(BlockId) -> u32) {
        if let Self::Lineage(lin) = self {
            lin.unlink_parent(id, epoch_of);
        }
    }
}

/// What evicting a victim and registering a cached block ask of the
/// eviction order: the [`InactivePool`] calls of the same names.
/// Implemented by the pool, which dispatches on its policy at every call,
/// and by the LRU ring, for which a lower tier's store loop
/// (`PoolState::cache`) is compiled on its own with no dispatch and none of
/// the calls that do nothing under LRU (one per stored block and two per
/// evicted one).
pub(crate) trait StoreOrder {
    /// [`InactivePool::tracks_lineage`].
    fn tracks_lineage(&self) -> bool;
    /// [`InactivePool::evict`].
    fn evict(&mut self) -> Option<BlockId>;
    /// [`InactivePool::on_evicted`].
    fn on_evicted(&mut self, id: BlockId, epoch_of: impl Fn(BlockId) -> u32);
    /// [`InactivePool::on_register`].
    fn on_register(&mut self, id: BlockId, hash: SequenceHash, parent: Option<(BlockId, u32)>);
}

impl StoreOrder for InactivePool {
    #[inline]
    fn tracks_lineage(&self) -> bool {
        InactivePool::tracks_lineage(self)
    }

    #[inline]
    fn evict(&mut self) -> Option<BlockId> {
        InactivePool::evict(self)
    }

    #[inline]
    fn on_evicted(&mut self, id: BlockId, epoch_of: impl Fn(BlockId) -> u32) {
        InactivePool::on_evicted(self, id, epoch_of);
    }

    #[inline]
    fn on_register(&mut self, id: BlockId, hash: SequenceHash, parent: Option<(BlockId, u32)>) {
        InactivePool::on_register(self, id, hash, parent);
    }
}

impl StoreOrder for LruRing {
    #[inline]
    fn tracks_lineage(&self) -> bool {
        false
    }

    #[inline]
    fn evict(&mut self) -> Option<BlockId> {
        self.pop()
    }

    #[inline]
    fn on_evicted(&mut self, _: BlockId, _: impl Fn(BlockId) -> u32) {}

    #[inline]
    fn on_register(&mut self, _: BlockId, _: SequenceHash, _: Option<(BlockId, u32)>) {}
}
