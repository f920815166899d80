//! [`BlockSequence`]: a request's tokens cut into blocks, each full block
//! named by a [`SequenceHash`] chained from its parent's.

use std::fmt;
use std::ops::Range;

use kvbm_blocks::SequenceHash;

use crate::{HashedPrompt, Salt, SequenceError};

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
#[derive(Clone, PartialEq, Eq)]
pub struct BlockSequence {
    tokens: Vec<u32>,
    /// One per full block; `hashes.len() == tokens.len() / block_size`.
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
        if block_size == 0 {
            return Err(SequenceError::ZeroBlockSize);
        }
        let mut sequence = Self {
            // Room for the blocks the caller reserved token capacity for
            // (a prompt built with room for its generation).
            hashes: Vec::with_capacity(tokens.capacity() / block_size),
            tokens,
            block_size,
            salt,
        };
        sequence.hash_new_blocks();
        Ok(sequence)
    }

    /// One sequence of `tokens` per salt of `salts`, in order, each hashed
    /// under its own salt exactly as [`with_salt`](Self::with_salt) hashes
    /// it, but each block's tokens are hashed once for all of them when the
    /// salts share a hash function (the same key, or none: a block's
    /// [`Salt::block_hash`] depends on nothing else); only the chaining is
    /// done per salt. This is how the layer groups of one request, each
    /// under its own salt ([`Salt::for_group`]), hash one prompt.
    ///
    /// The first sequence takes `tokens`; the others get copies with the
    /// same capacity (room for the generation the caller reserved). No
    /// salts, no sequences.
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
        tokens: Vec<u32>,
        block_size: usize,
        salts: &[Salt],
    ) -> Result<Vec<Self>, SequenceError> {
        if block_size == 0 {
            return Err(SequenceError::ZeroBlockSize);
        }
        let Some((&first, rest)) = salts.split_first() else {
            return Ok(Vec::new());
        };
        let capacity = tokens.capacity();
        let empty = |salt| Self {
            tokens: Vec::new(),
            hashes: Vec::with_capacity(capacity / block_size),
            block_size,
            salt,
        };
        let mut sequences: Vec<Self> = salts.iter().map(|&salt| empty(salt)).collect();
        if rest.iter().all(|salt| first.shares_block_hash(*salt)) {
            chain_blocks_shared(&mut sequences, &tokens);
        } else {
            for sequence in &mut sequences {
                chain_blocks(&mut sequence.hashes, sequence.salt, &tokens, block_size);
            }
        }
        for sequence in &mut sequences[1..] {
            sequence.tokens.reserve_exact(capacity);
            sequence.tokens.extend_from_slice(&tokens);
        }
        sequences[0].tokens = tokens;
        Ok(sequences)
    }

    /// A sequence of `prompt`'s tokens with the hashes it already has:
    /// nothing is hashed. `headroom` more tokens fit before the token
    /// buffer grows (room for the generation, so the first sampled tokens
    /// do not copy the prompt to a larger buffer).
    pub fn from_hashed(prompt: &HashedPrompt, headroom: usize) -> Self {
        let block_size = prompt.block_size();
        let capacity = prompt.tokens().len().saturating_add(headroom);
        let mut tokens = Vec::with_capacity(capacity);
        tokens.extend_from_slice(prompt.tokens());
        let mut hashes = Vec::with_capacity(capacity / block_size);
        hashes.extend_from_slice(prompt.hashes());
        Self {
            tokens,
            hashes,
            block_size,
            salt: prompt.salt(),
        }
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

    /// Every token, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Number of tokens, full blocks and partial tail together.
    pub fn total_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the sequence has no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
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

    /// The tokens of full block `index`, if there is such a block.
    pub fn block_tokens(&self, index: usize) -> Option<&[u32]> {
        if index >= self.hashes.len() {
            return None;
        }
        let start = index * self.block_size;
        self.tokens.get(start..start + self.block_size)
    }

    /// The tokens after the last full block (fewer than `block_size`).
    pub fn partial_tokens(&self) -> &[u32] {
        let full = self.hashes.len() * self.block_size;
        self.tokens.get(full..).unwrap_or_default()
    }

    /// Appends one token; returns the index of the block it completed, if any.
    pub fn append(&mut self, token: u32) -> Option<usize> {
        self.tokens.push(token);
        let index = self.hashes.len();
        let start = index * self.block_size;
        if self.tokens.len() - start < self.block_size {
            return None;
        }
        let hash = self.next_hash(&self.tokens[start..]);
        self.hashes.push(hash);
        Some(index)
    }

    /// Appends tokens; returns the indices of the blocks they completed
    /// (empty when none did).
    pub fn extend(&mut self, tokens: &[u32]) -> Range<usize> {
        let first = self.hashes.len();
        self.tokens.extend_from_slice(tokens);
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
        if len > self.tokens.len() {
            return Err(SequenceError::TruncateOutOfRange {
                len,
                min: 0,
                max: self.tokens.len(),
            });
        }
        self.tokens.truncate(len);
        self.hashes.truncate(len / self.block_size);
        Ok(())
    }

    /// Hashes every full block past the last hashed one.
    fn hash_new_blocks(&mut self) {
        let hashed = self.hashes.len();
        let full = self.tokens.len() / self.block_size;
        if full <= hashed {
            return;
        }
        self.hashes.reserve(full - hashed);
        let pending = &self.tokens[hashed * self.block_size..full * self.block_size];
        chain_blocks(&mut self.hashes, self.salt, pending, self.block_size);
    }

    /// The hash of the block after the last hashed one, holding `tokens`.
    fn next_hash(&self, tokens: &[u32]) -> SequenceHash {
        chain(self.hashes.last().copied(), self.salt, tokens)
    }
}

/// Appends to `hashes` the hashes of the full blocks of `tokens`, chained
/// onto the last hash in `hashes` (or first, under `salt`).
fn chain_blocks(hashes: &mut Vec<SequenceHash>, salt: Salt, tokens: &[u32], block_size: usize) {
    // One pass: parking block hashes for a second, chaining pass measured
    // slower than letting the CPU overlap each block's hash with the
    // previous chain step.
    let mut previous = hashes.last().copied();
    for block in tokens.chunks_exact(block_size) {
        let hash = chain(previous, salt, block);
        hashes.push(hash);
        previous = Some(hash);
    }
}

/// Hashes the full blocks of `tokens` into every (empty) sequence of
/// `sequences`, each block's tokens once (the sequences' salts share a
/// block hash function) and its chaining under each sequence's salt.
fn chain_blocks_shared(sequences: &mut [BlockSequence], tokens: &[u32]) {
    let Some(lead) = sequences.first() else {
        return;
    };
    let (hasher, block_size) = (lead.salt, lead.block_size);
    for block in tokens.chunks_exact(block_size) {
        let content = hasher.block_hash(block);
        for sequence in sequences.iter_mut() {
            let hash = chain_content(sequence.hashes.last().copied(), sequence.salt, content);
            sequence.hashes.push(hash);
        }
    }
}

/// The hash of a block holding `tokens` after `previous` (or first, under `salt`).
fn chain(previous: Option<SequenceHash>, salt: Salt, tokens: &[u32]) -> SequenceHash {
    let content = salt.block_hash(tokens);
    match previous {
        Some(parent) => parent.child(salt.chain_hash(parent.value(), content)),
        None => SequenceHash::root(salt.chain_hash(salt.get(), content)),
    }
}

/// As [`chain`], for a block whose tokens hash to `content` under `salt`'s
/// block hash function (`chain` is left as it was so the one-salt path
/// compiles as before).
#[inline(always)]
fn chain_content(previous: Option<SequenceHash>, salt: Salt, content: u128) -> SequenceHash {
    match previous {
        Some(parent) => parent.child(salt.chain_hash(parent.value(), content)),
        None => SequenceHash::root(salt.chain_hash(salt.get(), content)),
    }
}

impl fmt::Debug for BlockSequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockSequence")
            .field("total_tokens", &self.tokens.len())
            .field("num_blocks", &self.hashes.len())
            .field("block_size", &self.block_size)
            .field("salt", &self.salt)
            .field("last_hash", &self.hashes.last())
            .finish()
    }
}

#[cfg(test)]
mod tests;
