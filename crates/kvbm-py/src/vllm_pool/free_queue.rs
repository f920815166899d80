//! vLLM 0.33's `FreeKVCacheBlockQueue` as two arrays of links by block id:
//! free and cached blocks in one queue, evicted from the front.
//!
//! Links are ids, not pointers, so the queue is plain data beside the
//! block objects Python owns; ids `n` and `n + 1` of an `n`-block queue are
//! its head and tail sentinels, which keep every link operation free of
//! end cases.

/// No link: the block is not in the queue.
const NONE: u32 = u32::MAX;

/// The most blocks a queue takes: ids, sentinels and [`NONE`] stay distinct.
pub(super) const MAX_BLOCKS: usize = (NONE - 2) as usize;

/// The free queue of a pool of blocks `0..n`: see the module docs.
#[derive(Debug)]
pub(super) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    len: usize,
}

impl FreeQueue {
    /// Blocks `0..blocks`, all queued in id order (vLLM's start).
    /// `blocks` must be below [`MAX_BLOCKS`].
    pub(super) fn all(blocks: usize) -> Self {
        debug_assert!(blocks < MAX_BLOCKS);
        let (head, tail) = (blocks as u32, blocks as u32 + 1);
        let mut queue = Self {
            prev: vec![NONE; blocks + 2],
            next: vec![NONE; blocks + 2],
            len: 0,
        };
        queue.next[head as usize] = tail;
        queue.prev[tail as usize] = head;
        let ids: Vec<u32> = (0..blocks as u32).collect();
        queue.append(&ids);
        queue
    }

    fn head(&self) -> u32 {
        (self.prev.len() - 2) as u32
    }

    fn tail(&self) -> u32 {
        (self.prev.len() - 1) as u32
    }

    /// Blocks in the queue.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether block `id` is in the queue (`false` for an id out of range).
    pub(super) fn contains(&self, id: u32) -> bool {
        (id as usize) < self.prev.len() - 2 && self.prev[id as usize] != NONE
    }

    /// Takes block `id`, which is in the queue, out of it.
    pub(super) fn unlink(&mut self, id: u32) {
        debug_assert!(self.contains(id));
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.prev[id as usize] = NONE;
        self.next[id as usize] = NONE;
        self.len -= 1;
    }

    /// Puts `ids`, none of them queued, at the back, in order.
    pub(super) fn append(&mut self, ids: &[u32]) {
        let tail = self.tail();
        let last = self.prev[tail as usize];
        self.link_after(last, ids, tail);
    }

    /// Puts `ids`, none of them queued, at the front, in order.
    pub(super) fn prepend(&mut self, ids: &[u32]) {
        let head = self.head();
        let first = self.next[head as usize];
        self.link_after(head, ids, first);
    }

    /// Links `ids` in order between `before` and `after`, neighbours now.
    fn link_after(&mut self, before: u32, ids: &[u32], after: u32) {
        let mut last = before;
        for &id in ids {
            debug_assert!(!self.contains(id));
            self.prev[id as usize] = last;
            self.next[last as usize] = id;
            last = id;
        }
        self.next[last as usize] = after;
        self.prev[after as usize] = last;
        self.len += ids.len();
    }

    /// The ids from the front, in queue order (next evicted first).
    pub(super) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let tail = self.tail();
        std::iter::successors(Some(self.next[self.head() as usize]), |&at| {
            Some(self.next[at as usize])
        })
        .take_while(move |&at| at != tail)
    }

    /// Takes `ids`, the queue's first `ids.len()` blocks in order (as
    /// [`iter`](Self::iter) lists them), off the front.
    pub(super) fn detach_front(&mut self, ids: &[u32]) {
        let Some(&last) = ids.last() else {
            return;
        };
        debug_assert!(self.iter().take(ids.len()).eq(ids.iter().copied()));
        let head = self.head();
        let rest = self.next[last as usize];
        self.next[head as usize] = rest;
        self.prev[rest as usize] = head;
        for &id in ids {
            self.prev[id as usize] = NONE;
            self.next[id as usize] = NONE;
        }
        self.len -= ids.len();
    }

    /// An empty queue of no blocks (a pool the garbage collector cleared).
    pub(super) fn clear(&mut self) {
        *self = Self::all(0);
    }
}
