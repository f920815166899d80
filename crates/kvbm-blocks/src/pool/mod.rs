//! The pool's shared core: every slot's state, the free list, the registry and
//! the inactive pool, behind one mutex.
//!
//! Reference counts of registered blocks are plain integers under that mutex,
//! not per-handle atomics: a batch of handles ([`ImmutableBlocks`]) then costs
//! one lock acquisition however many blocks it pins, where per-handle `Arc`s
//! would cost two atomic read-modify-writes per block.
//!
//! [`ImmutableBlocks`]: crate::ImmutableBlocks

mod audit;
mod free;
mod registry;

use self::free::FreeList;
use self::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::events::{EventLog, EventSubscription};
use crate::eviction::{InactivePool, LruRing, StoreOrder};
use crate::hash::join;
use crate::sync::{Mutex, MutexGuard, lock};
use crate::{
    BlockError, BlockId, BlockInfo, DuplicatePolicy, EvictionPolicy, PoolMetrics, SequenceHash,
};

/// What every handle and manager clone points at.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<PoolState>,
    pub(crate) block_size: usize,
    pub(crate) total: usize,
    pub(crate) eviction: EvictionPolicy,
    pub(crate) duplicates: DuplicatePolicy,
    /// Whether the state has an event log: read without the lock, so a
    /// flush on a pool nobody subscribes to costs one load.
    subscribed: AtomicBool,
    /// Whether the state keeps a spare batch buffer: written under the
    /// lock, read without it, so that a match with none to take allocates
    /// its buffer before locking. A stale answer costs one allocation under
    /// the lock, or one a kept buffer could have spared; never a result.
    has_spare: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        total: usize,
        block_size: usize,
        eviction: EvictionPolicy,
        duplicates: DuplicatePolicy,
    ) -> Result<Self, BlockError> {
        let state = PoolState::new(total, eviction, duplicates)?;
        Ok(Self {
            state: Mutex::new(state),
            block_size,
            total,
            eviction,
            duplicates,
            subscribed: AtomicBool::new(false),
            has_spare: AtomicBool::new(false),
        })
    }

    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        lock(&self.state)
    }

    /// A new event subscription whose first message is a resync.
    pub(crate) fn subscribe(&self, capacity: usize) -> EventSubscription {
        let mut pool = self.lock();
        // Earlier subscribers get what is pending first, so the newcomer's
        // snapshot comes after the latest batch.
        pool.flush_events();
        let subscription = pool
            .events
            .get_or_insert_with(EventLog::new)
            .subscribe(capacity);
        self.subscribed.store(true, Ordering::Relaxed);
        pool.flush_events();
        subscription
    }

    /// Whether this pool's state probably keeps a spare batch buffer (read
    /// without the lock: another thread may take or give one back before
    /// [`take_spare`](Self::take_spare)).
    #[inline]
    pub(crate) fn may_have_spare(&self) -> bool {
        self.has_spare.load(Ordering::Relaxed)
    }

    /// A dropped batch's emptied buffer, if `pool` (this pool's state,
    /// locked) keeps one: a match filling it allocates nothing, and its
    /// batch's drop frees nothing.
    #[inline]
    pub(crate) fn take_spare(&self, pool: &mut PoolState) -> Option<Vec<BlockInfo>> {
        let spare = pool.spares.pop();
        if pool.spares.is_empty() {
            self.has_spare.store(false, Ordering::Relaxed);
        }
        spare
    }

    /// Keeps `buffer` (emptied) in `pool` (this pool's state, locked) for
    /// [`take_spare`](Self::take_spare) if it holds at most
    /// [`SPARE_CAPACITY`] blocks and fewer than [`SPARES`] are kept, and
    /// leaves `buffer` without capacity then; otherwise leaves it as it is,
    /// to be freed.
    #[inline]
    pub(crate) fn recycle(&self, pool: &mut PoolState, buffer: &mut Vec<BlockInfo>) {
        debug_assert!(buffer.is_empty());
        // `spares` was reserved for SPARES up front: this push never
        // allocates under the lock.
        if buffer.capacity() <= SPARE_CAPACITY && pool.spares.len() < SPARES {
            pool.spares.push(std::mem::take(buffer));
            self.has_spare.store(true, Ordering::Relaxed);
        }
    }

    /// Sends the pending events to the subscribers, if there are any.
    pub(crate) fn flush_events(&self) {
        if !self.subscribed.load(Ordering::Relaxed) {
            return;
        }
        let mut pool = self.lock();
        if !pool.flush_events() {
            self.subscribed.store(false, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum SlotState {
    /// On the free list.
    Free = 0,
    /// Owned by a `MutableBlock` or `CompleteBlock`.
    Held = 1,
    /// The registry's block for its hash; cached when `refs == 0`.
    Registered = 2,
    /// A second physical copy of a registered hash (`DuplicatePolicy::Allow`).
    Duplicate = 3,
}

impl SlotState {
    fn from_bits(bits: u32) -> Self {
        match bits & 3 {
            0 => Self::Free,
            1 => Self::Held,
            2 => Self::Registered,
            _ => Self::Duplicate,
        }
    }
}

/// One block's state, 44 bytes: a pool's largest table (a million blocks
/// take 44 MB of it), so every byte counts. The hash is stored as its raw
/// fields beside the others (a nested `SequenceHash`, with its own padding,
/// made it 56); the epoch and the state share one word; and the slot is
/// packed to 4-byte alignment, so the 44 bytes of fields are not padded to
/// 48. (Fields are only ever copied out, never borrowed, which packing
/// requires of the 8-byte ones; unaligned loads cost nothing on the
/// processors this runs on.)
#[derive(Clone, Copy, Debug)]
#[repr(Rust, packed(4))]
struct Slot {
    value: [u64; 2],
    parent: [u64; 2],
    position: u32,
    /// Handles pinning a registered or duplicate block. Sticky at `u32::MAX`:
    /// a block cloned four billion times stays pinned rather than wrapping.
    /// While the slot is `Free`, the next free slot instead ([`FreeList`]).
    refs: u32,
    /// The [`SlotState`] in the low two bits; above them the epoch, bumped
    /// whenever the slot stops holding registered content, so a
    /// `WeakBlock` from before cannot upgrade into the slot's next life.
    /// The epoch wraps after 2^30 lives of one slot; an upgrade also
    /// compares the hash, so a wrapped epoch can at worst revive a block
    /// holding the very content the handle named.
    life: u32,
}

/// The epoch's bits in [`Slot::life`], above the state's two.
const EPOCH_SHIFT: u32 = 2;

impl Slot {
    fn new(hash: SequenceHash, refs: u32, epoch: u32, state: SlotState) -> Self {
        let (value, parent, position) = hash.to_raw();
        Self {
            value,
            parent,
            position,
            refs,
            life: epoch << EPOCH_SHIFT | state as u32,
        }
    }

    /// The hash the slot holds (meaningful while registered or duplicate).
    fn hash(&self) -> SequenceHash {
        SequenceHash::from_raw(self.value, self.parent, self.position)
    }

    /// The chained value of [`hash`](Self::hash): the registry key.
    #[inline]
    fn value(&self) -> u128 {
        join(self.value)
    }

    #[inline]
    fn state(&self) -> SlotState {
        SlotState::from_bits(self.life)
    }

    #[inline]
    fn set_state(&mut self, state: SlotState) {
        self.life = self.life & !3 | state as u32;
    }

    /// The slot's epoch (30 bits).
    #[inline]
    fn epoch(&self) -> u32 {
        self.life >> EPOCH_SHIFT
    }

    /// Ends the slot's registered life: `Free`, with the next epoch.
    #[inline]
    fn end_life(&mut self) {
        self.life =
            (self.life >> EPOCH_SHIFT).wrapping_add(1) << EPOCH_SHIFT | SlotState::Free as u32;
    }
}

#[derive(Debug, Default)]
struct Counters {
    allocations: u64,
    registrations: u64,
    deduplications: u64,
    match_requested: u64,
    match_hit: u64,
    evictions: u64,
}

/// [`PoolState::match_prefix`]'s loop, over the fields it reads and
/// writes passed apart: as separate arguments the compiler knows a write to
/// a slot cannot change the registry's table, and keeps the table's fields
/// in registers instead of reloading them for every block.
#[inline(never)]
fn match_into(
    registry: &Registry,
    slots: &mut [Slot],
    inactive: &mut InactivePool,
    hashes: &[SequenceHash],
    out: &mut Vec<BlockInfo>,
) {
    // LRU, the default, in a loop of its own: its ring's removal inlines,
    // and no block asks which policy it is, or whether it counts hits. The
    // other policies' loop is a function of its own: in this one, its
    // calls (a list's unlink, a hit's count) made the compiler set aside
    // registers that the LRU loop then reloaded from the stack.
    if let InactivePool::Lru(ring) = inactive {
        for hash in hashes {
            let Some(id) = registered_in(registry, slots, hash.value()) else {
                break;
            };
            out.push(acquire_with(slots, id, |id| ring.remove(id)));
        }
        return;
    }
    match_other(registry, slots, inactive, hashes, out);
}

/// [`match_into`] under the policies other than LRU.
#[inline(never)]
fn match_other(
    registry: &Registry,
    slots: &mut [Slot],
    inactive: &mut InactivePool,
    hashes: &[SequenceHash],
    out: &mut Vec<BlockInfo>,
) {
    let tracks_hits = inactive.tracks_hits();
    for hash in hashes {
        let Some(id) = registered_in(registry, slots, hash.value()) else {
            break;
        };
        if tracks_hits {
            inactive.on_hit(*hash);
        }
        out.push(acquire_in(slots, inactive, id));
    }
}

/// The block `registry` has under a chained hash value (keys read from
/// `slots`).
#[inline]
fn registered_in(registry: &Registry, slots: &[Slot], value: u128) -> Option<BlockId> {
    registry.get(value, |id| slots[id.index()].value)
}

/// Takes a reference to the registered block `id`, reviving it from the
/// cache.
#[inline]
fn acquire_in(slots: &mut [Slot], inactive: &mut InactivePool, id: BlockId) -> BlockInfo {
    acquire_with(slots, id, |id| inactive.remove(id))
}

/// [`acquire_in`] with the inactive pool's removal of a cached block
/// given as `uncache`.
#[inline]
fn acquire_with<R>(
    slots: &mut [Slot],
    id: BlockId,
    uncache: impl FnOnce(BlockId) -> R,
) -> BlockInfo {
    let slot = &mut slots[id.index()];
    if slot.refs == 0 {
        uncache(id);
    }
    slot.refs = slot.refs.saturating_add(1);
    // Built from the slot's fields: the parent is not needed.
    BlockInfo::from_raw(id, slot.epoch(), slot.value, slot.position)
}

/// [`PoolState::touch_prefix`] under LRU: the longest registered prefix of
/// `hashes`, its cached blocks (collected in `ids`) taken out of the ring
/// and put back at its end last first, as `touch_prefix` puts them, in one
/// batch; how many blocks the prefix has. LRU counts no hits, and a pinned
/// block is not in the ring, so only the cached ones are collected.
fn touch_lru(
    registry: &Registry,
    slots: &[Slot],
    ring: &mut LruRing,
    hashes: &[SequenceHash],
    ids: &mut Vec<BlockId>,
) -> usize {
    let mut found = 0;
    for hash in hashes {
        let Some(id) = registered_in(registry, slots, hash.value()) else {
            break;
        };
        found += 1;
        if slots[id.index()].refs == 0 {
            ring.remove(id);
            ids.push(id);
        }
    }
    ring.push_last_first(ids);
    found
}

/// [`PoolState::release`] over the fields it changes, passed apart.
#[inline(always)]
fn release_in(slots: &mut [Slot], inactive: &mut InactivePool, free: &mut FreeList, id: BlockId) {
    let slot = &mut slots[id.index()];
    let refs = slot.refs;
    debug_assert!(refs > 0, "{id} released without a reference");
    // Another handle keeps the block (2 <= refs < MAX, one compare): the
    // common case of a shared prefix.
    if refs.wrapping_sub(2) < u32::MAX - 2 {
        slot.refs = refs - 1;
    } else if refs == 1 {
        slot.refs = 0;
        release_last(slots, inactive, free, id);
    }
    // Else sticky at MAX, or 0 (a bug the assertion catches).
}

/// The last reference to `id` is gone: caches or frees it. Out of line,
/// so the common case (another handle remains) inlines into batch drops.
#[inline(never)]
fn release_last(slots: &mut [Slot], inactive: &mut InactivePool, free: &mut FreeList, id: BlockId) {
    let slot = &mut slots[id.index()];
    match slot.state() {
        SlotState::Registered => inactive.insert(id, slot.hash()),
        SlotState::Duplicate => {
            slot.end_life();
            free.push(slots, id);
        }
        SlotState::Free | SlotState::Held => {
            debug_assert!(false, "{id} referenced in state {:?}", slot.state());
        }
    }
}

/// [`PoolState::hashes_of`]'s loop, over the slots passed apart: the
/// compiler then knows the writes to `out` leave the slots' table where it
/// is, and keeps its address and length in registers instead of reloading
/// them from the pool for every block (a lower tier's write-through reads
/// every stored block's hash this way).
#[inline(never)]
fn hashes_into(slots: &[Slot], blocks: &[BlockInfo], out: &mut Vec<SequenceHash>) {
    out.extend(
        blocks
            .iter()
            .map(|info| slots[info.block_id().index()].hash()),
    );
}

/// Evicts `order`'s victim: unregisters it, counts and publishes its
/// removal, and leaves its slot `Free` but off the free list, for the
/// caller to hand out; with what `read` takes of the slot (its key first).
/// [`PoolState::evict_reading`], and [`cache_into`]'s loop over the pool's
/// fields apart.
#[inline(always)]
fn evict_victim<T>(
    slots: &mut [Slot],
    registry: &mut Registry,
    order: &mut impl StoreOrder,
    counters: &mut Counters,
    events: &mut Option<EventLog>,
    read: impl FnOnce(&Slot) -> (u128, T),
) -> Option<(BlockId, T)> {
    let id = order.evict()?;
    let slot = &mut slots[id.index()];
    debug_assert!(slot.state() == SlotState::Registered && slot.refs == 0);
    let (value, read) = read(slot);
    slot.end_life();
    registry.remove(value, id);
    order.on_evicted(id, |b| slots[b.index()].epoch());
    counters.evictions += 1;
    if let Some(events) = events.as_mut() {
        events.removed(value);
    }
    Some((id, read))
}

/// The fields [`PoolState::cache`]'s loop reads and writes.
struct CacheFields<'a> {
    slots: &'a mut [Slot],
    free: &'a mut FreeList,
    registry: &'a mut Registry,
    counters: &'a mut Counters,
    events: &'a mut Option<EventLog>,
}

/// [`PoolState::cache`]'s loop: stores each of `hashes` not registered when
/// its turn comes in a block of its own (free, else the policy's victim),
/// up to `room` of them, their ids appended to `ids`; `hashes` keeps the
/// ones stored. Returns how many missing ones did not fit. `inactive` is
/// the pool's eviction order, or its LRU ring (see [`StoreOrder`]).
///
/// A function of its own, over the fields apart, for the reason
/// [`match_into`] is: as separate references the compiler knows a write to
/// a slot, the registry or the free list leaves the others where they
/// were, and keeps their pointers and lengths in registers across the loop
/// instead of reloading them from the pool after every store.
#[inline(never)]
fn cache_into(
    fields: CacheFields<'_>,
    inactive: &mut impl StoreOrder,
    hashes: &mut Vec<SequenceHash>,
    room: usize,
    ids: &mut Vec<BlockId>,
) -> usize {
    let CacheFields {
        slots,
        free,
        registry,
        counters,
        events,
    } = fields;
    let lineage = inactive.tracks_lineage();
    let mut skipped = 0;
    let mut kept = 0;
    for index in 0..hashes.len() {
        // Only the key until the block is stored: the whole hash is read
        // again for the slot, rather than held across the probe and the
        // eviction, where it would be spilled and reloaded.
        let value = hashes[index].value();
        // One bucket hash for the probe and the insert.
        let bucket = registry.hash(value);
        if (registry.get_hashed(bucket, value, |id| slots[id.index()].value)).is_some() {
            continue;
        }
        if ids.len() == room {
            skipped += 1;
            continue;
        }
        let id = match free.pop(slots) {
            Some(id) => id,
            // `available` counted every cached block, so one is there.
            None => {
                let read = |slot: &Slot| (slot.value(), ());
                match evict_victim(slots, registry, inactive, counters, events, read) {
                    Some((id, ())) => id,
                    None => {
                        skipped += 1;
                        continue;
                    }
                }
            }
        };
        let hash = hashes[index];
        // Only lineage-aware eviction links children to parents (see
        // `register`); the parent may be earlier in this batch.
        let parent = match lineage {
            true => (hash
                .parent()
                .and_then(|p| registered_in(registry, slots, p)))
            .map(|p| (p, slots[p.index()].epoch())),
            false => None,
        };
        registry.insert_new(bucket, id, |other| slots[other.index()].value);
        let slot = &mut slots[id.index()];
        *slot = Slot::new(hash, 0, slot.epoch(), SlotState::Registered);
        inactive.on_register(id, hash, parent);
        ids.push(id);
        if kept != index {
            hashes[kept] = hash;
        }
        kept += 1;
    }
    hashes.truncate(kept);
    skipped
}

/// The state behind the mutex. Every method runs with the lock held.
#[derive(Debug)]
pub(crate) struct PoolState {
    slots: Vec<Slot>,
    /// A stack: the most recently freed block is reused first (warm in cache).
    free: FreeList,
    /// Chained hash value to the registered block holding it.
    registry: Registry,
    inactive: InactivePool,
    duplicates: DuplicatePolicy,
    counters: Counters,
    /// Present while someone subscribes to events.
    events: Option<EventLog>,
    /// [`cache`](Self::cache)'s block ids, kept for its next call.
    scratch: Vec<BlockId>,
    /// [`evict_into`](Self::evict_into)'s victims' hashes.
    evicted: Vec<SequenceHash>,
    /// Emptied buffers of dropped batches, for the next matches to fill
    /// ([`Shared::take_spare`], [`Shared::recycle`]).
    spares: Vec<Vec<BlockInfo>>,
}

/// How many emptied batch buffers a pool keeps for its matches.
const SPARES: usize = 4;

/// The largest batch buffer (in blocks; 16 KiB) a pool keeps: a prefix's or
/// a short request's table. A longer table's allocation is a small part of
/// its cost, and keeping its buffer would hold memory no match may need.
const SPARE_CAPACITY: usize = 512;

impl PoolState {
    fn new(
        total: usize,
        eviction: EvictionPolicy,
        duplicates: DuplicatePolicy,
    ) -> Result<Self, BlockError> {
        let empty = Slot::new(SequenceHash::root(0), 0, 0, SlotState::Free);
        // The two largest tables, reserved fallibly: a pool too large for
        // this machine is a typed error, not an abort. (The smaller ones
        // below then fit in all but the narrowest margins.)
        let out_of_memory = |_| BlockError::OutOfMemory { blocks: total };
        let mut slots = Vec::new();
        slots.try_reserve_exact(total).map_err(out_of_memory)?;
        slots.resize(total, empty);
        let free = FreeList::all(&mut slots);
        Ok(Self {
            slots,
            free,
            registry: Registry::with_capacity(total),
            inactive: InactivePool::new(eviction, total),
            duplicates,
            counters: Counters::default(),
            events: None,
            scratch: Vec::new(),
            evicted: Vec::new(),
            spares: Vec::with_capacity(SPARES),
        })
    }

    /// Free plus evictable: what an allocation could take right now.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.inactive.len()
    }

    /// Takes `n` blocks, all or nothing: free ones first, then cached ones in
    /// eviction order, whose hashes go to `on_evicted` (a caller that does
    /// not want them collects nothing).
    pub(crate) fn allocate(
        &mut self,
        n: usize,
        on_evicted: impl FnMut(SequenceHash),
    ) -> Result<Vec<BlockId>, BlockError> {
        self.check_room(n)?;
        let mut ids = Vec::with_capacity(n);
        self.take_into(n, on_evicted, &mut ids)?;
        Ok(ids)
    }

    /// [`allocate`](Self::allocate), appending the ids to `ids`; on an error
    /// `ids` is as it was.
    pub(crate) fn allocate_onto(
        &mut self,
        n: usize,
        ids: &mut Vec<BlockId>,
    ) -> Result<(), BlockError> {
        self.check_room(n)?;
        self.take_into(n, |_| {}, ids)
    }

    /// Whether `n` blocks can be allocated now: the errors of
    /// [`allocate`](Self::allocate) that change nothing.
    #[inline]
    fn check_room(&self, n: usize) -> Result<(), BlockError> {
        let total = self.slots.len();
        if n > total {
            return Err(BlockError::ExceedsCapacity {
                requested: n,
                total,
            });
        }
        let available = self.available();
        if n > available {
            return Err(BlockError::InsufficientBlocks {
                requested: n,
                available,
            });
        }
        Ok(())
    }

    /// [`allocate`](Self::allocate) after [`check_room`](Self::check_room),
    /// appending the ids to `ids` (a buffer the caller may reuse); on an
    /// error `ids` is as it was.
    #[inline]
    fn take_into(
        &mut self,
        n: usize,
        mut on_evicted: impl FnMut(SequenceHash),
        ids: &mut Vec<BlockId>,
    ) -> Result<(), BlockError> {
        let start = ids.len();
        ids.reserve(n);
        for _ in 0..n.min(self.free.len()) {
            match self.free.pop(&mut self.slots) {
                Some(id) => ids.push(id),
                None => break,
            }
        }
        self.evict_into(n - (ids.len() - start), ids);
        self.evicted.iter().copied().for_each(&mut on_evicted);
        if ids.len() - start < n {
            let available = ids.len() - start;
            for id in ids.drain(start..) {
                self.free.push(&mut self.slots, id);
            }
            return Err(BlockError::InvariantViolated(format!(
                "inactive pool yielded {available} of the {n} blocks it counted"
            )));
        }
        for id in &ids[start..] {
            self.slots[id.index()].set_state(SlotState::Held);
        }
        self.counters.allocations += n as u64;
        Ok(())
    }

    /// Evicts up to `n` cached blocks in policy order and holds them: each is
    /// unregistered (a `Removed` event) and `Held` with its content, for a
    /// caller that copies it elsewhere before freeing it.
    pub(crate) fn evict_held(&mut self, n: usize) -> Vec<(BlockId, SequenceHash)> {
        let mut ids = Vec::with_capacity(n.min(self.inactive.len()));
        self.evict_into(n, &mut ids);
        for &id in &ids {
            self.slots[id.index()].set_state(SlotState::Held);
        }
        ids.into_iter().zip(self.evicted.iter().copied()).collect()
    }

    /// Evicts the policy's victim: unregisters it and leaves it `Free` but off
    /// the free list, for the caller to hand out or push.
    fn evict_one(&mut self) -> Option<(BlockId, SequenceHash)> {
        self.evict_reading(|slot| {
            let hash = slot.hash();
            (hash.value(), hash)
        })
    }

    /// Evicts up to `n` victims in policy order, appending their ids to `ids`
    /// and leaving their hashes in `self.evicted`, in the same order.
    ///
    /// Each victim costs a few cache misses (its ring word, its slot, its
    /// registry bucket), each waiting on the one before. Done in phases (the
    /// policy's picks, then the slots, then the registry's removals), one
    /// victim's misses overlap the next ones' instead. Lineage-aware
    /// eviction picks a victim only once the previous one is unlinked from
    /// its parent, so it goes one victim at a time.
    fn evict_into(&mut self, n: usize, ids: &mut Vec<BlockId>) {
        let first = ids.len();
        self.evicted.clear();
        if self.inactive.tracks_lineage() {
            while ids.len() - first < n {
                let Some((id, hash)) = self.evict_one() else {
                    break;
                };
                ids.push(id);
                self.evicted.push(hash);
            }
            return;
        }
        while ids.len() - first < n {
            let Some(id) = self.inactive.evict() else {
                break;
            };
            ids.push(id);
        }
        for &id in &ids[first..] {
            let slot = &mut self.slots[id.index()];
            debug_assert!(slot.state() == SlotState::Registered && slot.refs == 0);
            self.evicted.push(slot.hash());
            slot.end_life();
        }
        // (`InactivePool::on_evicted` has work only for lineage.)
        for (&id, hash) in ids[first..].iter().zip(&self.evicted) {
            self.registry.remove(hash.value(), id);
            if let Some(events) = &mut self.events {
                events.removed(hash.value());
            }
        }
        self.counters.evictions += (ids.len() - first) as u64;
    }

    /// [`evict_one`](Self::evict_one), reading the victim's key and what
    /// else the caller wants of its slot (nothing, in
    /// [`cache`](Self::cache)'s loop, where this is inlined).
    #[inline(always)]
    fn evict_reading<T>(&mut self, read: impl FnOnce(&Slot) -> (u128, T)) -> Option<(BlockId, T)> {
        evict_victim(
            &mut self.slots,
            &mut self.registry,
            &mut self.inactive,
            &mut self.counters,
            &mut self.events,
            read,
        )
    }

    /// A `MutableBlock` or `CompleteBlock` was dropped.
    pub(crate) fn free_held(&mut self, id: BlockId) {
        let slot = &mut self.slots[id.index()];
        debug_assert_eq!(slot.state(), SlotState::Held);
        slot.set_state(SlotState::Free);
        self.free.push(&mut self.slots, id);
    }

    /// Registers a held block under `hash`, returning the block that now
    /// stands for the hash with one reference taken for the caller.
    /// `tokens` (the block's, or empty) go into its `Stored` event.
    #[inline(always)]
    pub(crate) fn register(
        &mut self,
        id: BlockId,
        hash: SequenceHash,
        tokens: &[u32],
    ) -> BlockInfo {
        self.counters.registrations += 1;
        // Only lineage-aware eviction links children to parents; the other
        // policies skip the lookup (a registry probe per registration).
        let parent = match self.inactive.tracks_lineage() {
            true => (hash.parent().and_then(|p| self.registered(p)))
                .map(|p| (p, self.slots[p.index()].epoch())),
            false => None,
        };
        let slots = &self.slots;
        let registered =
            (self.registry).insert_or_get(hash.value(), id, |other| slots[other.index()].value);
        if let Some(existing) = registered {
            self.inactive.on_hit(hash);
            match self.duplicates {
                DuplicatePolicy::Allow => {
                    let slot = &mut self.slots[id.index()];
                    *slot = Slot::new(hash, 1, slot.epoch(), SlotState::Duplicate);
                    return BlockInfo::new(id, slot.epoch(), hash);
                }
                DuplicatePolicy::Deduplicate => {
                    self.counters.deduplications += 1;
                    self.free_held(id);
                    return self.acquire(existing);
                }
            }
        }
        let slot = &mut self.slots[id.index()];
        *slot = Slot::new(hash, 1, slot.epoch(), SlotState::Registered);
        let info = BlockInfo::new(id, slot.epoch(), hash);
        self.inactive.on_register(id, hash, parent);
        if let Some(events) = &mut self.events {
            events.stored(hash, tokens);
        }
        info
    }

    /// Allocates a block per hash and registers it at once (what
    /// `allocate`, then `register` of each, would do), appending the
    /// registered blocks, one reference each, to `out`. All or nothing, as
    /// `allocate`.
    pub(crate) fn store(
        &mut self,
        hashes: &[SequenceHash],
        out: &mut Vec<BlockInfo>,
    ) -> Result<(), BlockError> {
        let ids = self.allocate(hashes.len(), |_| {})?;
        self.register_held(&ids, hashes, out);
        Ok(())
    }

    /// Registers held blocks `ids`, each under its hash of `hashes` (one
    /// each), appending the registered blocks, one reference each, to
    /// `out`: `register` of each, with the events reserved for them all.
    #[inline]
    pub(crate) fn register_held(
        &mut self,
        ids: &[BlockId],
        hashes: &[SequenceHash],
        out: &mut Vec<BlockInfo>,
    ) {
        self.expect_registration(ids.len(), 0);
        out.reserve(ids.len());
        for (&id, &hash) in ids.iter().zip(hashes) {
            out.push(self.register(id, hash, &[]));
        }
        self.flush_if_full();
    }

    /// [`register_held`](Self::register_held) with the blocks then
    /// released last first, as a dropped batch is: they end cached (a
    /// deduplicated block stands for the one registered before it, whose
    /// id replaces its own in `ids`).
    #[inline]
    pub(crate) fn cache_held(&mut self, ids: &mut [BlockId], hashes: &[SequenceHash]) {
        self.expect_registration(ids.len(), 0);
        for (id, &hash) in ids.iter_mut().zip(hashes) {
            *id = self.register(*id, hash, &[]).block_id();
        }
        self.flush_if_full();
        for &id in ids.iter().rev() {
            self.release(id);
        }
    }

    /// Copies arriving in a lower tier: each of `hashes`, in order, not
    /// registered when its turn comes gets a block of its own (free, else
    /// the policy's victim), registered and cached (no reference held), as
    /// `allocate` and `register` of one block at a time and dropping them
    /// all would, while the blocks free or cached at the start last.
    /// `hashes` keeps the ones stored; returns how many that were missing
    /// did not fit.
    ///
    /// `store`'s work without its handles or its second look: each hash is
    /// probed once and a missing one goes into the registry without a
    /// second probe, so a hash twice in one batch is stored once. The new
    /// blocks join the inactive pool only at the end, last first, so no
    /// victim is one of them and the deepest ends first in line, as a
    /// dropped batch leaves it; the events list every removal before the
    /// stores.
    pub(crate) fn cache(&mut self, hashes: &mut Vec<SequenceHash>) -> usize {
        let room = self.available();
        // The ids standing for the stored hashes: a buffer the pool keeps
        // between calls, so a lower tier's write-through allocates nothing
        // per batch.
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        ids.reserve(hashes.len().min(room));
        let fields = CacheFields {
            slots: &mut self.slots,
            free: &mut self.free,
            registry: &mut self.registry,
            counters: &mut self.counters,
            events: &mut self.events,
        };
        // Under LRU the loop needs nothing of the order but its victims.
        let skipped = match &mut self.inactive {
            InactivePool::Lru(ring) => cache_into(fields, ring, hashes, room, &mut ids),
            inactive => cache_into(fields, inactive, hashes, room, &mut ids),
        };
        let kept = hashes.len();
        self.counters.allocations += kept as u64;
        self.counters.registrations += kept as u64;
        if let Some(events) = &mut self.events {
            events.reserve(kept, 0);
            for &hash in hashes.iter() {
                events.stored(hash, &[]);
            }
        }
        self.flush_if_full();
        self.inactive.insert_last_first(&ids, hashes);
        self.scratch = ids;
        skipped
    }

    /// Takes a reference to a registered block, reviving it from the cache.
    #[inline]
    fn acquire(&mut self, id: BlockId) -> BlockInfo {
        acquire_in(&mut self.slots, &mut self.inactive, id)
    }

    /// Appends the longest registered prefix of `hashes` to `out`, taking a
    /// reference to each block. The caller reserves room for `hashes` in
    /// `out` (its one caller does, for a capacity of its own), which
    /// otherwise grows as it fills.
    #[inline]
    pub(crate) fn match_prefix(&mut self, hashes: &[SequenceHash], out: &mut Vec<BlockInfo>) {
        let before = out.len();
        match_into(
            &self.registry,
            &mut self.slots,
            &mut self.inactive,
            hashes,
            out,
        );
        self.counters.match_requested += hashes.len() as u64;
        self.counters.match_hit += (out.len() - before) as u64;
    }

    /// The longest registered prefix of `hashes`, each block left where a
    /// match and its release would leave it (a cached one most recently
    /// used, the deepest first), with no reference taken; how many.
    /// Counted as a match of that prefix.
    pub(crate) fn touch_prefix(&mut self, hashes: &[SequenceHash]) -> usize {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        let found = if let InactivePool::Lru(ring) = &mut self.inactive {
            touch_lru(&self.registry, &self.slots, ring, hashes, &mut ids)
        } else {
            let tracks_hits = self.inactive.tracks_hits();
            for hash in hashes {
                let Some(id) = self.registered(hash.value()) else {
                    break;
                };
                if tracks_hits {
                    self.inactive.on_hit(*hash);
                }
                // A pinned block stays pinned; a cached one leaves its
                // place in line and rejoins at the end, below.
                if self.slots[id.index()].refs == 0 {
                    self.inactive.remove(id);
                }
                ids.push(id);
            }
            for (&id, &hash) in ids.iter().zip(hashes).rev() {
                if self.slots[id.index()].refs == 0 {
                    self.inactive.insert(id, hash);
                }
            }
            ids.len()
        };
        self.counters.match_requested += found as u64;
        self.counters.match_hit += found as u64;
        self.scratch = ids;
        found
    }

    /// The block registered under a chained hash value.
    #[inline]
    fn registered(&self, value: u128) -> Option<BlockId> {
        registered_in(&self.registry, &self.slots, value)
    }

    /// Whether `hash` is registered (held or cached).
    pub(crate) fn contains(&self, hash: SequenceHash) -> bool {
        self.registered(hash.value()).is_some()
    }

    /// The references pinning block `id` (0 for a free, held or cached
    /// block's slot; a sticky count reads as `usize::MAX`).
    pub(crate) fn references(&self, id: BlockId) -> usize {
        let slot = &self.slots[id.index()];
        match (slot.state(), slot.refs) {
            (SlotState::Registered | SlotState::Duplicate, u32::MAX) => usize::MAX,
            (SlotState::Registered | SlotState::Duplicate, refs) => refs as usize,
            (SlotState::Free | SlotState::Held, _) => 0,
        }
    }

    /// Another handle to a block the caller already pins.
    pub(crate) fn add_ref(&mut self, id: BlockId) {
        let slot = &mut self.slots[id.index()];
        debug_assert!(slot.refs > 0, "{id} cloned without a reference");
        slot.refs = slot.refs.saturating_add(1);
    }

    /// Drops one reference; the last one caches (or frees) the block.
    #[inline]
    pub(crate) fn release(&mut self, id: BlockId) {
        release_in(&mut self.slots, &mut self.inactive, &mut self.free, id);
    }

    /// [`release`](Self::release) of each of `blocks`, last first.
    #[inline]
    pub(crate) fn release_rev(&mut self, blocks: &[BlockInfo]) {
        // The fields apart, as in `match_into`: the compiler then knows a
        // last release leaves the slots' table where it is, and keeps its
        // address and length in registers instead of reloading them from
        // the pool for every block.
        let (slots, inactive, free) = (&mut self.slots[..], &mut self.inactive, &mut self.free);
        for info in blocks.iter().rev() {
            release_in(slots, inactive, free, info.block_id());
        }
    }

    /// The whole hash of a block a handle pins (its slot holds it).
    pub(crate) fn hash_of(&self, id: BlockId) -> SequenceHash {
        self.slots[id.index()].hash()
    }

    /// The whole hash of each of `blocks` ([`hash_of`](Self::hash_of)),
    /// appended to `out`.
    pub(crate) fn hashes_of(&self, blocks: &[BlockInfo], out: &mut Vec<SequenceHash>) {
        hashes_into(&self.slots, blocks, out);
    }

    /// Re-takes a reference to the block `info` described, if it still holds
    /// the same registered content (held, cached, or a live duplicate).
    pub(crate) fn upgrade(&mut self, info: &BlockInfo) -> bool {
        let slot = &self.slots[info.block_id().index()];
        let live = slot.epoch() == info.epoch()
            && slot.value() == info.hash_value()
            && match slot.state() {
                SlotState::Registered => true,
                SlotState::Duplicate => slot.refs > 0,
                SlotState::Free | SlotState::Held => false,
            };
        if live {
            self.acquire(info.block_id());
        }
        live
    }

    /// Evicts every cached block to the free pool. When that empties the
    /// registry (no block was pinned) subscribers get one `Cleared` event
    /// instead of a `Removed` naming every block.
    pub(crate) fn clear_cache(&mut self) -> Vec<SequenceHash> {
        let empties_registry = self.registry.len() == self.inactive.len();
        let log = match empties_registry {
            true => self.events.take(),
            false => None,
        };
        let mut ids = Vec::with_capacity(self.inactive.len());
        self.evict_into(self.inactive.len(), &mut ids);
        for id in ids {
            self.free.push(&mut self.slots, id);
        }
        let evicted = std::mem::take(&mut self.evicted);
        if let Some(mut log) = log {
            log.cleared();
            self.events = Some(log);
        }
        evicted
    }

    /// Tells the event log (if any) a registration of `blocks` blocks with
    /// `tokens` tokens is coming.
    pub(crate) fn expect_registration(&mut self, blocks: usize, tokens: usize) {
        if let Some(log) = &mut self.events {
            log.reserve(blocks, tokens);
        }
    }

    /// Sends pending events once they are many, so an unflushed pool's log
    /// stays bounded.
    pub(crate) fn flush_if_full(&mut self) {
        if self.events.as_ref().is_some_and(EventLog::is_full) {
            self.flush_events();
        }
    }

    /// Sends the pending events (and resyncs owed); drops the log when no
    /// subscriber is left. Returns whether one is.
    fn flush_events(&mut self) -> bool {
        let Some(log) = &self.events else {
            return false;
        };
        if log.is_idle() {
            // Most scheduler steps register nothing: nothing to send, and a
            // subscriber that hung up is noticed at the next real batch.
            return true;
        }
        let snapshot = log.wants_snapshot().then(|| self.registered_hashes());
        let Some(log) = &mut self.events else {
            return false;
        };
        let subscribed = log.flush(snapshot);
        if !subscribed {
            self.events = None;
        }
        subscribed
    }

    /// Every registered hash, parents before children (by position).
    fn registered_hashes(&self) -> Vec<SequenceHash> {
        let mut hashes: Vec<SequenceHash> = (self.slots.iter())
            .filter(|slot| slot.state() == SlotState::Registered)
            .map(Slot::hash)
            .collect();
        hashes.sort_unstable_by_key(|hash| hash.position());
        hashes
    }

    pub(crate) fn metrics(&self) -> PoolMetrics {
        let total = self.slots.len();
        let free = self.free.len();
        let inactive = self.inactive.len();
        PoolMetrics {
            total_blocks: total,
            free_blocks: free,
            inactive_blocks: inactive,
            in_use_blocks: total - free - inactive,
            allocations: self.counters.allocations,
            registrations: self.counters.registrations,
            deduplications: self.counters.deduplications,
            match_hashes_requested: self.counters.match_requested,
            match_hashes_hit: self.counters.match_hit,
            evictions: self.counters.evictions,
        }
    }
}

#[cfg(test)]
mod tests;
