//! [`BlockSequence`]: a request's tokens cut into blocks, each full block
//! named by a [`SequenceHash`] chained from its parent's.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use kvbm_blocks::SequenceHash;

use crate::tokens::Source;
use crate::{HashedPrompt, PromptTokens, Salt, SequenceError, Tokens};

/// The tokens of one request, split into full blocks of `block_size` tokens
/// plus a partial tail, with one [`SequenceHash`] per full block.
///
/// Block `i`'s hash chains [`block_hash`](crate::block_hash) of its tokens
/// onto block `i - 1`'s (block 0 chains onto the [`Salt`], whose key, if it
/// has one, makes both steps keyed SipHash), so two sequences share the hash of
/// block `i` exactly when they share the salt and every token up to the end of
/// block `i`. That makes the hash the prefix-cache key. Its position is the
/// block index and its parent the previous block's value.
///
/// Appending reports when a block completes; [`truncate`](Self::truncate)
/// rolls back to any earlier length (speculative decoding) in O(removed
/// blocks), without rehashing anything that stays.
///
/// A sequence built from a shared prompt ([`PromptTokens::shared`],
/// [`from_hashed`](Self::from_hashed)) reads the prompt's full blocks where
/// they are and keeps only the rest (the partial last block and what is
/// generated) in a buffer of its own, so a request, its sequences and its
/// router keys hold one copy of a prompt; [`tokens`](Self::tokens) reads
/// the two pieces as one list.
///
/// ```
/// use kvbm_sequence::BlockSequence;
///
/// let mut seq = BlockSequence::new((0..10).collect(), 4)?;
/// assert_eq!((seq.num_blocks(), seq.partial_tokens()), (2, &[8, 9][..]));
///
/// assert_eq!(seq.append(10), None);
/// assert_eq!(seq.append(11), Some(2)); // block 2 just filled up
/// let third = seq.sequence_hashes()[2];
/// assert_eq!(third.position(), 2);
/// assert_eq!(third.parent(), Some(seq.sequence_hashes()[1].value()));
///
/// seq.truncate(9)?; // speculative tokens rejected
/// assert_eq!((seq.total_tokens(), seq.num_blocks()), (9, 2));
/// assert_eq!(seq.extend(&[9, 10, 11]), 2..3); // same tokens, same hash
/// assert_eq!(seq.sequence_hashes()[2], third);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
#[derive(Clone)]
pub struct BlockSequence {
    /// A shared prompt whose first `head_len` tokens (whole blocks) are the
    /// sequence's first tokens, read in place.
    head: Option<Arc<[u32]>>,
    /// A multiple of `block_size`, at most `head`'s length.
    head_len: usize,
    /// Every token from `head_len` on: the sequence's own.
    tail: Vec<u32>,
    /// One per full block; `hashes.len() == total_tokens() / block_size`.
    hashes: Vec<SequenceHash>,
    block_size: usize,
    salt: Salt,
}

impl BlockSequence {
    /// Splits `tokens` into blocks of `block_size` and hashes the full ones,
    /// without a salt.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn new(tokens: Vec<u32>, block_size: usize) -> Result<Self, SequenceError> {
        Self::with_salt(tokens, block_size, Salt::NONE)
    }

    /// Like [`new`](Self::new), with every hash rooted in `salt`.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn with_salt(
        tokens: Vec<u32>,
        block_size: usize,
        salt: Salt,
    ) -> Result<Self, SequenceError> {
        Self::from_prompt(tokens.into(), block_size, salt)
    }

    /// Like [`with_salt`](Self::with_salt), from a prompt the sequence
    /// takes over or shares ([`PromptTokens`]).
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn from_prompt(
        prompt: PromptTokens,
        block_size: usize,
        salt: Salt,
    ) -> Result<Self, SequenceError> {
        if block_size == 0 {
            return Err(SequenceError::ZeroBlockSize);
        }
        let mut sequence = Self::unhashed(prompt, block_size, salt);
        sequence.hash_new_blocks();
        Ok(sequence)
    }

    /// The sequence of `prompt` with no hash computed yet, with room for
    /// the blocks of the generation the caller reserved room for (a
    /// prompt buffer's spare capacity, or a shared prompt's headroom).
    fn unhashed(prompt: PromptTokens, block_size: usize, salt: Salt) -> Self {
        let (head, head_len, tail) = match prompt.0 {
            Source::Owned(tokens) => (None, 0, tokens),
            Source::Shared { prompt, headroom } => {
                let head_len = prompt.len() / block_size * block_size;
                let rest = prompt.get(head_len..).unwrap_or_default();
                let mut tail = Vec::with_capacity(rest.len().saturating_add(headroom));
                tail.extend_from_slice(rest);
                (Some(prompt), head_len, tail)
            }
        };
        Self {
            hashes: Vec::with_capacity(head_len.saturating_add(tail.capacity()) / block_size),
            head,
            head_len,
            tail,
            block_size,
            salt,
        }
    }

    /// One sequence of `tokens` per salt of `salts`, in order, each hashed
    /// under its own salt exactly as [`with_salt`](Self::with_salt) hashes
    /// it, but each block's tokens are hashed once for all of them when the
    /// salts share a hash function (the same key, or none: a block's
    /// [`Salt::block_hash`] depends on nothing else), and only the chaining
    /// is done per salt. Salts that differ only by their group tags
    /// ([`Salt::for_group`] of one salt: the layer groups of one request)
    /// are chained once, and each other sequence's hashes are the first's
    /// retagged.
    ///
    /// The sequences share the prompt's full blocks (a prompt given as a
    /// buffer is copied once into a shared prompt first, when there are two
    /// sequences or more); each keeps its own partial block, with the room
    /// for the generation the caller reserved. No salts, no sequences.
    ///
    /// ```
    /// use kvbm_sequence::{BlockSequence, Salt};
    ///
    /// let salt = Salt::from_bytes(b"tenant");
    /// let salts = [salt.for_group(0), salt.for_group(1)];
    /// let tokens: Vec<u32> = (0..40).collect();
    /// let groups = BlockSequence::with_salts(tokens.clone(), 16, &salts)?;
    /// for (seq, salt) in groups.iter().zip(salts) {
    ///     assert_eq!(seq, &BlockSequence::with_salt(tokens.clone(), 16, salt)?);
    /// }
    /// assert_ne!(groups[0].sequence_hashes(), groups[1].sequence_hashes());
    /// # Ok::<(), kvbm_sequence::SequenceError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn with_salts(
        tokens: impl Into<PromptTokens>,
        block_size: usize,
        salts: &[Salt],
    ) -> Result<Vec<Self>, SequenceError> {
        if block_size == 0 {
            return Err(SequenceError::ZeroBlockSize);
        }
        let Some((&first, rest)) = salts.split_first() else {
            return Ok(Vec::new());
        };
        let prompt = match tokens.into() {
            PromptTokens(Source::Owned(tokens)) if !rest.is_empty() => {
                let headroom = tokens.capacity() - tokens.len();
                PromptTokens::shared(tokens.into(), headroom)
            }
            prompt => prompt,
        };
        // The others' copies are a shared prompt's handles; the first
        // takes the prompt itself (a lone sequence's buffer is not copied).
        let mut sequences: Vec<Self> = Vec::with_capacity(salts.len());
        sequences
            .extend((rest.iter()).map(|&salt| Self::unhashed(prompt.clone(), block_size, salt)));
        sequences.insert(0, Self::unhashed(prompt, block_size, first));
        if rest.iter().all(|salt| first.shares_chain(*salt)) {
            retag_from_first(&mut sequences);
        } else if rest.iter().all(|salt| first.shares_block_hash(*salt)) {
            chain_blocks_shared(&mut sequences);
        } else {
            for sequence in &mut sequences {
                sequence.hash_new_blocks();
            }
        }
        Ok(sequences)
    }

    /// A sequence of `prompt`'s tokens with the hashes it already has:
    /// nothing is hashed. `headroom` more tokens fit before the token
    /// buffer grows (room for the generation, so the first sampled tokens
    /// do not copy the prompt to a larger buffer).
    pub fn from_hashed(prompt: &HashedPrompt, headroom: usize) -> Self {
        let shared = PromptTokens::shared(prompt.shared_tokens().clone(), headroom);
        let mut sequence = Self::unhashed(shared, prompt.block_size(), prompt.salt());
        sequence.hashes.extend_from_slice(prompt.hashes());
        sequence
    }

    /// The hashes of the full blocks of `tokens`, as a sequence of them
    /// computes them.
    pub(crate) fn hash_blocks(
        tokens: &[u32],
        block_size: usize,
        salt: Salt,
    ) -> Result<Vec<SequenceHash>, SequenceError> {
        if block_size == 0 {
            return Err(SequenceError::ZeroBlockSize);
        }
        let mut hashes = Vec::with_capacity(tokens.len() / block_size);
        chain_blocks(&mut hashes, salt, tokens, block_size);
        Ok(hashes)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The salt every hash is rooted in.
    pub fn salt(&self) -> Salt {
        self.salt
    }

    /// Every token, in order (the shared prompt's blocks, then the
    /// sequence's own tokens; see [`Tokens`]).
    pub fn tokens(&self) -> Tokens<'_> {
        Tokens::new(self.head(), &self.tail)
    }

    /// The shared prompt's part of the tokens.
    fn head(&self) -> &[u32] {
        (self.head.as_deref())
            .and_then(|head| head.get(..self.head_len))
            .unwrap_or_default()
    }

    /// Number of tokens, full blocks and partial tail together.
    pub fn total_tokens(&self) -> usize {
        self.head_len + self.tail.len()
    }

    /// Whether the sequence has no tokens.
    pub fn is_empty(&self) -> bool {
        self.total_tokens() == 0
    }

    /// Number of full blocks.
    pub fn num_blocks(&self) -> usize {
        self.hashes.len()
    }

    /// Full blocks the sequence has room for before it grows: its tokens so
    /// far and the generation its builder reserved room for. A block table
    /// that grows with the sequence can be sized to it once.
    pub fn block_capacity(&self) -> usize {
        self.hashes.capacity()
    }

    /// The hashes of the full blocks, in order: what
    /// [`BlockManager::match_blocks`](kvbm_blocks::BlockManager::match_blocks) takes.
    pub fn sequence_hashes(&self) -> &[SequenceHash] {
        &self.hashes
    }

    /// The tokens of full block `index`, if there is such a block (a block
    /// lies wholly in the shared prompt or wholly in the sequence's own
    /// tokens, since the prompt's part is whole blocks).
    pub fn block_tokens(&self, index: usize) -> Option<&[u32]> {
        if index >= self.hashes.len() {
            return None;
        }
        let start = index * self.block_size;
        match start.checked_sub(self.head_len) {
            None => self.head().get(start..start + self.block_size),
            Some(at) => self.tail.get(at..at + self.block_size),
        }
    }

    /// The tokens after the last full block (fewer than `block_size`).
    pub fn partial_tokens(&self) -> &[u32] {
        let full = self.hashes.len() * self.block_size;
        // The prompt's part is whole, hashed blocks: `full >= head_len`.
        (self.tail)
            .get(full.saturating_sub(self.head_len)..)
            .unwrap_or_default()
    }

    /// Appends one token; returns the index of the block it completed, if any.
    // Inlined: a decode appends one token a step, and 15 of 16 complete
    // nothing; the hashing of a completed block is not.
    #[inline]
    pub fn append(&mut self, token: u32) -> Option<usize> {
        self.tail.push(token);
        let index = self.hashes.len();
        let start = index * self.block_size;
        if self.total_tokens() - start < self.block_size {
            return None;
        }
        self.hash_completed(index, start)
    }

    /// The block `index`, starting at token `start`, just filled: its hash
    /// joins the chain; `Some(index)`.
    #[inline(never)]
    fn hash_completed(&mut self, index: usize, start: usize) -> Option<usize> {
        let own = (self.tail)
            .get(start.saturating_sub(self.head_len)..)
            .unwrap_or_default();
        let hash = chain(self.hashes.last().copied(), self.salt, own);
        self.hashes.push(hash);
        Some(index)
    }

    /// Appends tokens; returns the indices of the blocks they completed
    /// (empty when none did).
    pub fn extend(&mut self, tokens: &[u32]) -> Range<usize> {
        let first = self.hashes.len();
        self.tail.extend_from_slice(tokens);
        self.hash_new_blocks();
        first..self.hashes.len()
    }

    /// Keeps the first `len` tokens. Blocks that stay full keep their hashes;
    /// nothing is rehashed.
    ///
    /// # Errors
    ///
    /// [`SequenceError::TruncateOutOfRange`] if `len` exceeds the current
    /// length (the sequence is unchanged).
    pub fn truncate(&mut self, len: usize) -> Result<(), SequenceError> {
        let total = self.total_tokens();
        if len > total {
            return Err(SequenceError::TruncateOutOfRange {
                len,
                min: 0,
                max: total,
            });
        }
        match len.checked_sub(self.head_len) {
            Some(own) => self.tail.truncate(own),
            None => {
                // Into the shared prompt: its whole blocks below `len` stay
                // shared, the partial block's tokens become the sequence's.
                let kept = len / self.block_size * self.block_size;
                let partial = self.head().get(kept..len).unwrap_or_default().to_vec();
                self.tail.clear();
                self.tail.extend_from_slice(&partial);
                self.head_len = kept;
            }
        }
        self.hashes.truncate(len / self.block_size);
        Ok(())
    }

    /// Hashes every full block past the last hashed one. The shared
    /// prompt's blocks are hashed when the sequence is built, so the new
    /// ones are the sequence's own.
    fn hash_new_blocks(&mut self) {
        let hashed = self.hashes.len();
        let full = self.total_tokens() / self.block_size;
        if full <= hashed {
            return;
        }
        self.hashes.reserve(full - hashed);
        let start = hashed * self.block_size;
        if let Some(head) = self.head.as_deref()
            && start < self.head_len
        {
            let pending = head.get(start..self.head_len).unwrap_or_default();
            chain_blocks(&mut self.hashes, self.salt, pending, self.block_size);
        }
        let own = start.saturating_sub(self.head_len)..full * self.block_size - self.head_len;
        let pending = self.tail.get(own).unwrap_or_default();
        chain_blocks(&mut self.hashes, self.salt, pending, self.block_size);
    }
}

impl PartialEq for BlockSequence {
    /// The same tokens, blocks, hashes and salt, wherever the tokens are kept.
    fn eq(&self, other: &Self) -> bool {
        self.block_size == other.block_size
            && self.salt == other.salt
            && self.hashes == other.hashes
            && self.tokens() == other.tokens()
    }
}

impl Eq for BlockSequence {}

/// Appends to `hashes` the hashes of the full blocks of `tokens`, chained
/// onto the last hash in `hashes` (or first, under `salt`).
fn chain_blocks(hashes: &mut Vec<SequenceHash>, salt: Salt, tokens: &[u32], block_size: usize) {
    // One pass: parking block hashes for a second, chaining pass measured
    // slower than letting the CPU overlap each block's hash with the
    // previous chain step. The salt's tag and start are read once, not
    // per block.
    let (tag, start) = (salt.tag(), salt.untagged());
    let mut previous = hashes.last().copied();
    for block in tokens.chunks_exact(block_size) {
        let hash = chain_tagged(previous, salt, (tag, start), salt.block_hash(block));
        hashes.push(hash);
        previous = Some(hash);
    }
}

/// Hashes the full blocks of every (unhashed) sequence of `sequences`,
/// built from one shared prompt: each prompt block's tokens once (the
/// sequences' salts share a block hash function), its chaining under each
/// sequence's salt; then any full block of a sequence's own tokens.
fn chain_blocks_shared(sequences: &mut [BlockSequence]) {
    let Some(lead) = sequences.first() else {
        return;
    };
    let (hasher, block_size) = (lead.salt, lead.block_size);
    // A handle of its own on the prompt, out of the way of the sequences'
    // hashes written below.
    let (head, head_len) = (lead.head.clone(), lead.head_len);
    let prompt = (head.as_deref())
        .and_then(|head| head.get(..head_len))
        .unwrap_or_default();
    for block in prompt.chunks_exact(block_size) {
        let content = hasher.block_hash(block);
        for sequence in sequences.iter_mut() {
            let hash = chain_content(sequence.hashes.last().copied(), sequence.salt, content);
            sequence.hashes.push(hash);
        }
    }
    for sequence in sequences.iter_mut() {
        sequence.hash_new_blocks();
    }
}

/// Hashes every (unhashed) sequence of `sequences`, built from one shared
/// prompt under salts that chain as the first one's up to their tags
/// (a request's layer groups, [`Salt::for_group`]): the first sequence as
/// a lone one is hashed, and each other's values are the first's with the
/// two tags' XOR on, one XOR a block instead of a chain step. The
/// sequences hold the same tokens when built, so the first's full blocks
/// are every sequence's.
fn retag_from_first(sequences: &mut [BlockSequence]) {
    let Some((lead, rest)) = sequences.split_first_mut() else {
        return;
    };
    lead.hash_new_blocks();
    for sequence in rest {
        debug_assert!(sequence.hashes.is_empty());
        debug_assert_eq!(sequence.total_tokens(), lead.total_tokens());
        let retag = lead.salt.retag(sequence.salt);
        (sequence.hashes).extend(lead.hashes.iter().map(|hash| hash.retagged(retag)));
    }
}

/// The hash of a block holding `tokens` after `previous` (or first, under `salt`).
/// Always inlined: out of line, each block's call copied the salt through
/// the stack.
#[inline(always)]
fn chain(previous: Option<SequenceHash>, salt: Salt, tokens: &[u32]) -> SequenceHash {
    chain_content(previous, salt, salt.block_hash(tokens))
}

/// As [`chain`], for a block whose tokens hash to `content` under `salt`'s
/// block hash function.
#[inline(always)]
fn chain_content(previous: Option<SequenceHash>, salt: Salt, content: u128) -> SequenceHash {
    chain_tagged(previous, salt, (salt.tag(), salt.untagged()), content)
}

/// As [`chain_content`], with `salt`'s tag and untagged start value read
/// already (by a caller chaining many blocks): the chain runs untagged and
/// each value takes the tag on the way out, as [`Salt::chain_hash`] does.
#[inline(always)]
fn chain_tagged(
    previous: Option<SequenceHash>,
    salt: Salt,
    (tag, start): (u128, u128),
    content: u128,
) -> SequenceHash {
    match previous {
        Some(parent) => parent.child(tag ^ salt.untagged_chain_hash(parent.value() ^ tag, content)),
        None => SequenceHash::root(tag ^ salt.untagged_chain_hash(start, content)),
    }
}

impl fmt::Debug for BlockSequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockSequence")
            .field("total_tokens", &self.total_tokens())
            .field("num_blocks", &self.hashes.len())
            .field("block_size", &self.block_size)
            .field("salt", &self.salt)
            .field("last_hash", &self.hashes.last())
            .finish()
    }
}

#[cfg(test)]
mod tests;
