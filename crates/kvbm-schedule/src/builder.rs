//! [`SchedulableSequenceBuilder`]: the optional settings of a sequence (salt,
//! history policy) on top of its three required ones.

use std::fmt;
use std::marker::PhantomData;

use kvbm_sequence::{PromptTokens, RequestSequence, Salt};

use crate::{HistoryPolicy, SchedulableSequence, ScheduleError};

/// Configures a [`SchedulableSequence`]: start from
/// [`SchedulableSequence::builder`] with the prompt, output budget and block
/// size, then set what differs from the defaults.
///
/// | Setting                     | Default                  |
/// |-----------------------------|--------------------------|
/// | [`salt`](Self::salt)        | [`Salt::NONE`]           |
/// | [`history`](Self::history)  | [`HistoryPolicy::Full`]  |
///
/// ```
/// use kvbm_schedule::{HistoryPolicy, SchedulableSequence};
/// use kvbm_sequence::Salt;
/// # struct Gpu;
/// let seq = SchedulableSequence::<Gpu>::builder(vec![1, 2, 3], 16, 4)
///     .salt(Salt::new(42)) // share cached blocks only with this tenant
///     .history(HistoryPolicy::Last(64))
///     .build()?;
/// assert_eq!(seq.salt(), Salt::new(42));
/// # Ok::<(), kvbm_schedule::ScheduleError>(())
/// ```
pub struct SchedulableSequenceBuilder<M> {
    tokens: PromptTokens,
    max_output_tokens: usize,
    block_size: usize,
    salt: Salt,
    history: HistoryPolicy,
    _tier: PhantomData<fn() -> M>,
}

impl<M> SchedulableSequenceBuilder<M> {
    pub(crate) fn new(tokens: PromptTokens, max_output_tokens: usize, block_size: usize) -> Self {
        Self {
            tokens,
            max_output_tokens,
            block_size,
            salt: Salt::NONE,
            history: HistoryPolicy::Full,
            _tier: PhantomData,
        }
    }

    /// Roots every block hash in `salt`, so the request shares cached blocks
    /// only with requests of the same salt.
    pub fn salt(mut self, salt: Salt) -> Self {
        self.salt = salt;
        self
    }

    /// How much event history to keep.
    pub fn history(mut self, policy: HistoryPolicy) -> Self {
        self.history = policy;
        self
    }

    /// Builds the sequence (idle, holding no blocks) and records
    /// [`SequenceEvent::Created`](crate::SequenceEvent::Created).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Sequence`] ([`ZeroBlockSize`]) if the block size is
    /// 0.
    ///
    /// [`ZeroBlockSize`]: kvbm_sequence::SequenceError::ZeroBlockSize
    pub fn build(self) -> Result<SchedulableSequence<M>, ScheduleError> {
        let inner = RequestSequence::from_prompt(
            self.tokens,
            self.max_output_tokens,
            self.block_size,
            self.salt,
        )?;
        Ok(SchedulableSequence::from_inner(inner, self.history))
    }
}

impl<M> fmt::Debug for SchedulableSequenceBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulableSequenceBuilder")
            .field("num_input_tokens", &self.tokens.len())
            .field("max_output_tokens", &self.max_output_tokens)
            .field("block_size", &self.block_size)
            .field("salt", &self.salt)
            .field("history", &self.history)
            .finish()
    }
}
