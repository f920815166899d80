//! KV cache groups: models whose layers attend differently (see
//! [`KvCacheGroups`]).

use std::fmt;
use std::ops::Range;

use crate::Salt;
use crate::hash::GROUP_SHIFT;

/// How the layers of one group attend to earlier tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttentionKind {
    /// Every earlier token: the KV of every token is kept for the
    /// request's life.
    Full,
    /// The last `window` tokens, the computed one included (Mistral,
    /// gpt-oss, Gemma's local layers): a token at position `p` reads KV of
    /// positions `p + 1 - window ..= p`.
    SlidingWindow {
        /// Tokens attended to, at least 1, a multiple of the block size.
        window: usize,
    },
    /// The tokens of the token's own chunk (Llama 4's local layers): a
    /// token at position `p` reads positions `p / chunk * chunk ..= p`.
    ChunkedLocal {
        /// Tokens per chunk, at least 1, a multiple of the block size.
        chunk: usize,
    },
}

impl AttentionKind {
    /// The first block a request still needs once `computed_tokens` tokens
    /// have their KV: the next token (at position `computed_tokens`) and
    /// every later one read nothing below it. Blocks before it may be
    /// released. For a sliding window it is vLLM's `(computed_tokens -
    /// window + 1) / block_size`; for a chunk, the block where the current
    /// chunk starts.
    // Inlined: a window group asks after every applied step.
    #[inline]
    pub fn first_needed_block(self, computed_tokens: usize, block_size: usize) -> usize {
        let block_size = block_size.max(1);
        match self {
            Self::Full => 0,
            Self::SlidingWindow { window } => {
                computed_tokens.saturating_add(1).saturating_sub(window) / block_size
            }
            Self::ChunkedLocal { chunk } => {
                let chunk = chunk.max(1);
                computed_tokens / chunk * chunk / block_size
            }
        }
    }

    /// The blocks that must be cached for a prefix hit of `hit_blocks`
    /// blocks: the request then holds exactly these and computes from
    /// token `hit_blocks * block_size` on.
    pub fn needed_for_hit(self, hit_blocks: usize, block_size: usize) -> Range<usize> {
        let first = match self {
            Self::Full => 0,
            Self::SlidingWindow { .. } | Self::ChunkedLocal { .. } => self
                .first_needed_block(hit_blocks.saturating_mul(block_size), block_size)
                .min(hit_blocks),
        };
        first..hit_blocks
    }

    /// The longest prefix hit, at most `cap` blocks, this kind can serve
    /// when `cached[i]` tells whether block `i` is cached (indices at or
    /// past `cached.len()` count as not cached).
    ///
    /// - Full: the cached run from block 0.
    /// - Sliding window: the right-most run of `ceil((window - 1) /
    ///   block_size)` cached blocks ending at or before `cap`, or, if none,
    ///   the cached run from block 0 (a window that reaches past the first
    ///   token needs no more). vLLM's right-to-left scan.
    /// - Chunked local: from the start of `cap`'s chunk, the cached run;
    ///   a chunk boundary needs nothing, so the hit is at least there (when
    ///   the chunk is a block multiple).
    pub fn longest_hit(self, cap: usize, cached: &[bool], block_size: usize) -> usize {
        self.longest_hit_by(cap, block_size, |i| cached.get(i).copied().unwrap_or(false))
    }

    /// [`longest_hit`](Self::longest_hit), asking `is_cached(i)` about
    /// block `i` only when the rule needs it, so a caller can look blocks
    /// up lazily: full attention asks from block 0 up to its first miss, a
    /// sliding window from `cap - 1` down until it has a run of the
    /// blocks it needs (or reaches block 0), a chunk from the start of
    /// `cap`'s chunk up. Only indices below `cap` are asked about, each at
    /// most once for full attention and a window.
    pub fn longest_hit_by(
        self,
        cap: usize,
        block_size: usize,
        mut is_cached: impl FnMut(usize) -> bool,
    ) -> usize {
        match self {
            Self::Full => (0..cap).find(|&i| !is_cached(i)).unwrap_or(cap),
            Self::SlidingWindow { window } => {
                let need = window.saturating_sub(1).div_ceil(block_size.max(1));
                if need == 0 {
                    return cap;
                }
                let mut run = 0;
                for i in (0..cap).rev() {
                    if is_cached(i) {
                        run += 1;
                        if run >= need {
                            return i + need;
                        }
                    } else {
                        run = 0;
                    }
                }
                // No full window anywhere: only a run from block 0, shorter
                // than the window, can serve (the window reaches past token
                // 0); `run` counts exactly that run when the scan ends.
                run
            }
            Self::ChunkedLocal { .. } => {
                // The first miss at or after `cap`'s chunk start bounds the
                // hit; below it the chunk may start earlier (a chunk that is
                // not a block multiple), so check again until it holds.
                let mut hit = cap;
                loop {
                    let start = self.first_needed_block(hit.saturating_mul(block_size), block_size);
                    let miss = (start..hit).find(|&i| !is_cached(i)).unwrap_or(hit);
                    if miss == hit {
                        return hit;
                    }
                    hit = miss;
                }
            }
        }
    }

    /// The window or chunk in tokens; `None` for full attention.
    pub fn span(self) -> Option<usize> {
        match self {
            Self::Full => None,
            Self::SlidingWindow { window } => Some(window),
            Self::ChunkedLocal { chunk } => Some(chunk),
        }
    }

    /// `"full"`, `"sliding_window"` or `"chunked_local"`: the name reports
    /// and command lines use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::SlidingWindow { .. } => "sliding_window",
            Self::ChunkedLocal { .. } => "chunked_local",
        }
    }
}

impl fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.span() {
            None => f.write_str(self.name()),
            Some(span) => write!(f, "{}:{span}", self.name()),
        }
    }
}

/// One group of layers that attend the same way: they share one block
/// table per request, each block holding the KV of all the group's layers
/// for `block_size` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheGroup {
    kind: AttentionKind,
    layers: usize,
}

impl KvCacheGroup {
    /// A group of `layers` layers of one kind (checked by
    /// [`KvCacheGroups::new`]).
    pub const fn new(kind: AttentionKind, layers: usize) -> Self {
        Self { kind, layers }
    }

    /// How the group's layers attend.
    pub const fn kind(&self) -> AttentionKind {
        self.kind
    }

    /// Layers in the group: a block's bytes are `layers` times a layer's.
    pub const fn layers(&self) -> usize {
        self.layers
    }
}

/// Why a description of KV cache groups was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// No group at all.
    #[error("a model needs at least one KV cache group")]
    NoGroups,
    /// `block_size == 0`.
    #[error("block size must be at least 1 token")]
    ZeroBlockSize,
    /// A group of no layers.
    #[error("KV cache group {group} has no layers")]
    NoLayers {
        /// The group's index.
        group: usize,
    },
    /// A window or chunk of 0 tokens.
    #[error("KV cache group {group} ({kind}) spans 0 tokens")]
    ZeroSpan {
        /// The group's index.
        group: usize,
        /// Its kind.
        kind: AttentionKind,
    },
    /// A window or chunk that does not end on a block boundary: its
    /// blocks could never be released whole.
    #[error("KV cache group {group} ({kind}) is not a multiple of the {block_size}-token block")]
    SpanNotBlockMultiple {
        /// The group's index.
        group: usize,
        /// Its kind.
        kind: AttentionKind,
        /// The block size.
        block_size: usize,
    },
    /// More groups than a group index can tell apart.
    #[error("{groups} KV cache groups are more than the {max} supported")]
    TooManyGroups {
        /// Groups given.
        groups: usize,
        /// The most accepted.
        max: usize,
    },
}

/// A model's layers as groups of one [`AttentionKind`] each, over one block
/// size: checked once, then read by the sequences and the scheduler.
///
/// Most recent open models mix layer types: gpt-oss alternates 128-token
/// sliding-window layers with full ones, Gemma 3 has five 1,024-token local
/// layers per global one, Llama 4 uses chunked local attention. A layer with
/// a sliding window of `W` tokens never reads KV older than `W - 1` tokens
/// before the token it computes; a chunked-local layer reads only the tokens
/// of the current chunk. Keeping every token's KV for such layers wastes
/// memory, so a model is described as groups of layers, each with its
/// [`AttentionKind`], each holding one block table per request.
///
/// The rules that tell the groups apart are pure functions over block
/// indices (the sequences and the scheduler above apply them):
///
/// - which blocks a request still needs once `n` tokens are computed
///   ([`AttentionKind::first_needed_block`]): the rest are released into
///   the prefix cache, still matchable;
/// - which cached blocks a prefix hit of `h` blocks needs
///   ([`AttentionKind::needed_for_hit`]), and the longest hit one group can
///   serve ([`AttentionKind::longest_hit`]);
/// - the longest hit every group can serve at once
///   ([`KvCacheGroups::longest_common_hit`]), which is what a request skips.
///
/// The rules are vLLM 0.33's (`single_type_kv_cache_manager.py`): a
/// sliding-window hit needs the `ceil((W - 1) / block_size)` blocks before
/// the hit point, a chunked-local hit needs the blocks of the current chunk
/// before it, and the common hit is the fixed point of the groups' hits.
///
/// All groups share one block pool (as in vLLM, unlike SGLang's pool per
/// kind): memory flows to whichever group needs it, with no ratio to tune,
/// and one eviction order ranks every group's cached blocks. Each group's
/// blocks are cached under the request's chained hashes with a group tag
/// ([`Salt::for_group`]), so a full layer's block and a window layer's
/// block of the same tokens never match each other. Group 0 keeps the
/// request's own salt, so a single-group model hashes, matches and costs
/// exactly what it did before groups existed.
///
/// ```
/// use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};
///
/// // gpt-oss: full-attention layers and 128-token sliding-window layers.
/// let groups = KvCacheGroups::new(16, vec![
///     KvCacheGroup::new(AttentionKind::Full, 18),
///     KvCacheGroup::new(AttentionKind::SlidingWindow { window: 128 }, 18),
/// ])?;
///
/// // After 1,000 computed tokens the window group needs only the blocks
/// // covering tokens 873..1000 (blocks 54..63); the full group needs all.
/// assert_eq!(groups.group(1).unwrap().kind().first_needed_block(1000, 16), 54);
/// assert_eq!(groups.group(0).unwrap().kind().first_needed_block(1000, 16), 0);
///
/// // A 12-block prompt whose blocks are all cached under the full group's
/// // hashes, while the window group kept only blocks 2..10 (the others
/// // were released and evicted). A window hit needs the 8 blocks (127
/// // tokens) before the hit point, so the longest hit both serve is 10.
/// let full = [true; 12];
/// let mut window = [false; 12];
/// window[2..10].fill(true);
/// assert_eq!(groups.longest_common_hit(12, &[&full, &window]), 10);
///
/// // Had the window group lost block 2 too, no 8-block run is left, and
/// // the whole prompt is computed again.
/// window[2] = false;
/// assert_eq!(groups.longest_common_hit(12, &[&full, &window]), 0);
/// # Ok::<(), kvbm_sequence::GroupError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheGroups {
    block_size: usize,
    groups: Vec<KvCacheGroup>,
}

impl KvCacheGroups {
    /// The most groups a model may have (vLLM's largest hybrid models have
    /// a handful; the limit keeps per-request tables small).
    pub const MAX_GROUPS: usize = 64;

    /// Checks and keeps `groups` over blocks of `block_size` tokens.
    ///
    /// # Errors
    ///
    /// [`GroupError`]: no groups or more than [`MAX_GROUPS`](Self::MAX_GROUPS),
    /// a zero block size, a group of no layers, a window or chunk of 0 or
    /// not a multiple of the block size.
    pub fn new(block_size: usize, groups: Vec<KvCacheGroup>) -> Result<Self, GroupError> {
        if block_size == 0 {
            return Err(GroupError::ZeroBlockSize);
        }
        if groups.is_empty() {
            return Err(GroupError::NoGroups);
        }
        if groups.len() > Self::MAX_GROUPS {
            return Err(GroupError::TooManyGroups {
                groups: groups.len(),
                max: Self::MAX_GROUPS,
            });
        }
        for (group, spec) in groups.iter().enumerate() {
            if spec.layers == 0 {
                return Err(GroupError::NoLayers { group });
            }
            let kind = spec.kind;
            match kind.span() {
                None => {}
                Some(0) => return Err(GroupError::ZeroSpan { group, kind }),
                Some(span) if span % block_size != 0 => {
                    return Err(GroupError::SpanNotBlockMultiple {
                        group,
                        kind,
                        block_size,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(Self { block_size, groups })
    }

    /// One full-attention group of `layers` layers: today's model.
    ///
    /// # Errors
    ///
    /// [`GroupError::ZeroBlockSize`] or [`GroupError::NoLayers`].
    pub fn full_attention(block_size: usize, layers: usize) -> Result<Self, GroupError> {
        Self::new(
            block_size,
            vec![KvCacheGroup::new(AttentionKind::Full, layers)],
        )
    }

    /// Tokens per block, the same in every group.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The groups, in index order.
    pub fn groups(&self) -> &[KvCacheGroup] {
        &self.groups
    }

    /// Group `index`, if there is one.
    pub fn group(&self, index: usize) -> Option<&KvCacheGroup> {
        self.groups.get(index)
    }

    /// How many groups.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Always false: a checked description has at least one group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Whether every group attends fully (a request then keeps every
    /// block, as before groups existed).
    pub fn is_full_attention_only(&self) -> bool {
        self.groups.iter().all(|g| g.kind == AttentionKind::Full)
    }

    /// Layers over all groups.
    pub fn total_layers(&self) -> usize {
        self.groups.iter().map(|g| g.layers).sum()
    }

    /// The longest prefix hit, at most `cap` blocks, that every group can
    /// serve at once, given each group's cached blocks (`cached[g][i]`:
    /// block `i` is cached under group `g`'s hashes; a missing group or
    /// index counts as not cached).
    ///
    /// vLLM's fixed point: each group's longest hit not past the current
    /// bound becomes the next bound, until no group lowers it. Each group's
    /// [`longest_hit`](AttentionKind::longest_hit) is the largest it can
    /// serve up to the bound, so the result is the largest hit all of them
    /// serve (any hit every group serves stays below every bound).
    pub fn longest_common_hit(&self, cap: usize, cached: &[&[bool]]) -> usize {
        self.longest_common_hit_by(cap, |g, i| {
            (cached.get(g)).is_some_and(|cached| cached.get(i).copied().unwrap_or(false))
        })
    }

    /// [`longest_common_hit`](Self::longest_common_hit), asking
    /// `is_cached(g, i)` whether block `i` is cached under group `g`'s
    /// hashes only when a rule needs it (see
    /// [`AttentionKind::longest_hit_by`]), so a prefix match looks up
    /// about the hit plus a window per group rather than every group's
    /// whole prompt.
    ///
    /// Full-attention groups go first: one scan from block 0 to the first
    /// miss bounds the hit for every other group, so a prompt nobody cached
    /// costs one look-up per full group. The result does not depend on the
    /// order: whichever group lowers the bound, a hit every group serves
    /// stays below it, and the loop ends only when every group serves the
    /// bound. Answers should not change during the call (a look-up that
    /// races with evictions is settled by taking the hit, all or nothing).
    pub fn longest_common_hit_by(
        &self,
        cap: usize,
        mut is_cached: impl FnMut(usize, usize) -> bool,
    ) -> usize {
        let block_size = self.block_size;
        let mut bound = cap;
        // A full group serves every hit up to its first miss, so it never
        // needs asking again once the bound is at or below that miss.
        for (g, group) in self.groups.iter().enumerate() {
            if group.kind == AttentionKind::Full && bound > 0 {
                bound = group
                    .kind
                    .longest_hit_by(bound, block_size, |i| is_cached(g, i));
            }
        }
        loop {
            let mut settled = true;
            for (g, group) in self.groups.iter().enumerate() {
                if group.kind == AttentionKind::Full || bound == 0 {
                    continue;
                }
                let hit = group
                    .kind
                    .longest_hit_by(bound, block_size, |i| is_cached(g, i));
                if hit < bound {
                    bound = hit;
                    settled = false;
                }
            }
            if settled || bound == 0 {
                return bound;
            }
        }
    }
}

impl Salt {
    /// The salt group `group`'s blocks are hashed under: this salt with
    /// `group` in the top 8 bits of every chained value ([`GROUP_SHIFT`]),
    /// which a chain step leaves 0. Group 0's is this salt itself, so a
    /// single-group model keeps today's hashes.
    ///
    /// A group's block is so cached under the same 120-bit chained value
    /// as group 0's and its group number, the way vLLM keys a group's
    /// blocks by (block hash, group): the tokens are chained once for every
    /// group of a request, each other group's hashes cost one XOR a block,
    /// and an event can name the block and its group as vLLM's do
    /// ([`group_of`](crate::group_of), [`without_group`](crate::without_group)).
    /// The tag is public, but a keyed
    /// salt's values stay as secret as group 0's, which they differ from
    /// in the group alone. Groups past 255 share tag 255 (a model has at
    /// most [`KvCacheGroups::MAX_GROUPS`]).
    ///
    /// ```
    /// use kvbm_sequence::{BlockSequence, Salt};
    ///
    /// let salt = Salt::from_bytes(b"tenant");
    /// let tokens: Vec<u32> = (0..48).collect();
    /// let full = BlockSequence::with_salt(tokens.clone(), 16, salt.for_group(0))?;
    /// let window = BlockSequence::with_salt(tokens, 16, salt.for_group(1))?;
    /// let tag = salt.for_group(1).get() ^ salt.get();
    /// assert_eq!(tag, 1 << 120);
    /// for (f, w) in full.sequence_hashes().iter().zip(window.sequence_hashes()) {
    ///     assert_ne!(f.value(), w.value());
    ///     assert_eq!(f.value() ^ tag, w.value());
    /// }
    /// # Ok::<(), kvbm_sequence::SequenceError>(())
    /// ```
    pub fn for_group(self, group: usize) -> Self {
        if group == 0 {
            return self;
        }
        let group = u8::try_from(group).unwrap_or(u8::MAX);
        self.tagged(u128::from(group) << GROUP_SHIFT)
    }
}

#[cfg(test)]
mod tests;
