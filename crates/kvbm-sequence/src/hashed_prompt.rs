//! [`HashedPrompt`]: a prompt hashed once, shared by whoever needs its
//! block hashes (a router keying the request, the engine's sequence).

use std::fmt;
use std::sync::Arc;

use kvbm_blocks::SequenceHash;

use crate::{BlockSequence, Salt, SequenceError};

/// A prompt and the [`SequenceHash`]es of its full blocks, computed once and
/// shared: a clone is one reference count (and a pointer in a request). A router can key the
/// request by [`hashes`](Self::hashes) and the engine's sequence start from
/// them ([`BlockSequence::from_hashed`]) instead of hashing the prompt again.
///
/// The only way to make one is [`new`](Self::new), which hashes the tokens
/// itself, so the hashes always name exactly these tokens under this salt
/// and block size. That is the rule that lets a sequence trust them: a
/// caller able to hand a sequence hashes of its choosing could register its
/// KV under another prompt's names, and every other tenant whose prompt
/// matches those names would be served that KV.
///
/// ```
/// use kvbm_sequence::{BlockSequence, HashedPrompt, Salt};
///
/// let prompt = HashedPrompt::new((0..10).collect::<Vec<u32>>(), 4, Salt::NONE)?;
/// assert_eq!(prompt.hashes().len(), 2);
/// let seq = BlockSequence::from_hashed(&prompt, 16);
/// assert_eq!(seq, BlockSequence::new((0..10).collect(), 4)?);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HashedPrompt(Arc<Hashed>);

#[derive(PartialEq, Eq)]
struct Hashed {
    tokens: Arc<[u32]>,
    hashes: Box<[SequenceHash]>,
    block_size: usize,
    salt: Salt,
}

impl HashedPrompt {
    /// Hashes the full blocks of `tokens` (blocks of `block_size`, rooted in
    /// `salt`), as a [`BlockSequence`] of them would.
    ///
    /// # Errors
    ///
    /// [`SequenceError::ZeroBlockSize`] if `block_size` is 0.
    pub fn new(
        tokens: impl Into<Arc<[u32]>>,
        block_size: usize,
        salt: Salt,
    ) -> Result<Self, SequenceError> {
        let tokens = tokens.into();
        let hashes = BlockSequence::hash_blocks(&tokens, block_size, salt)?;
        Ok(Self(Arc::new(Hashed {
            tokens,
            hashes: hashes.into(),
            block_size,
            salt,
        })))
    }

    /// The prompt's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.0.tokens
    }

    /// The prompt's tokens, shared.
    pub fn shared_tokens(&self) -> &Arc<[u32]> {
        &self.0.tokens
    }

    /// The hashes of the prompt's full blocks, in order.
    pub fn hashes(&self) -> &[SequenceHash] {
        &self.0.hashes
    }

    /// Tokens per block the hashes were computed for.
    pub fn block_size(&self) -> usize {
        self.0.block_size
    }

    /// The salt the hashes are rooted in.
    pub fn salt(&self) -> Salt {
        self.0.salt
    }

    /// Whether the hashes are the ones a sequence of `block_size` under
    /// `salt` would compute, so it may take them.
    pub fn fits(&self, block_size: usize, salt: Salt) -> bool {
        self.0.block_size == block_size && self.0.salt == salt
    }
}

impl fmt::Debug for HashedPrompt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashedPrompt")
            .field("tokens", &self.0.tokens.len())
            .field("blocks", &self.0.hashes.len())
            .field("block_size", &self.0.block_size)
            .field("salt", &self.0.salt)
            .finish()
    }
}
