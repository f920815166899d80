//! [`Tokens`]: a sequence's tokens read in place (a shared prompt's full
//! blocks, then the tokens the sequence keeps itself); [`PromptTokens`]:
//! what a new sequence starts from.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// The prompt a new sequence starts from.
///
/// - A `Vec<u32>` (`.into()`): the sequence takes the buffer over; its spare
///   capacity is room for the generation.
/// - [`shared`](Self::shared): a prompt other holders keep too (the request
///   it came with, a [`HashedPrompt`](crate::HashedPrompt), the request's
///   other layer groups). The sequence reads its full blocks in place and
///   never copies them; it copies only the partial last block (fewer than
///   `block_size` tokens) into a buffer of its own with room for `headroom`
///   generated tokens.
///
/// ```
/// use std::sync::Arc;
/// use kvbm_sequence::{BlockSequence, PromptTokens, Salt};
///
/// let prompt: Arc<[u32]> = (0..10).collect();
/// let shared = BlockSequence::from_prompt(PromptTokens::shared(prompt.clone(), 16), 4, Salt::NONE)?;
/// let owned = BlockSequence::new(prompt.to_vec(), 4)?;
/// assert_eq!(shared, owned); // the same tokens and hashes either way
/// assert_eq!(shared.tokens(), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
#[derive(Clone, Debug)]
pub struct PromptTokens(pub(crate) Source);

#[derive(Clone, Debug)]
pub(crate) enum Source {
    Owned(Vec<u32>),
    Shared { prompt: Arc<[u32]>, headroom: usize },
}

impl PromptTokens {
    /// A prompt read in place, with room for `headroom` generated tokens
    /// before the sequence's own buffer grows.
    pub fn shared(prompt: Arc<[u32]>, headroom: usize) -> Self {
        Self(Source::Shared { prompt, headroom })
    }

    /// Tokens in the prompt.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the prompt has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The prompt's tokens.
    pub fn as_slice(&self) -> &[u32] {
        match &self.0 {
            Source::Owned(tokens) => tokens,
            Source::Shared { prompt, .. } => prompt,
        }
    }
}

impl From<Vec<u32>> for PromptTokens {
    fn from(tokens: Vec<u32>) -> Self {
        Self(Source::Owned(tokens))
    }
}

/// A sequence's tokens, read where they are: the full blocks of a prompt
/// shared with other holders, then the tokens the sequence keeps itself
/// (see [`PromptTokens`]). A list of `u32`s in two pieces: compare it with
/// a slice, iterate it, or copy it out with [`to_vec`](Self::to_vec).
///
/// ```
/// use kvbm_sequence::BlockSequence;
///
/// let mut seq = BlockSequence::new(vec![1, 2, 3], 2)?;
/// seq.append(4);
/// let tokens = seq.tokens();
/// assert_eq!(tokens, [1, 2, 3, 4]);
/// assert_eq!((tokens.len(), tokens.get(3), tokens.last()), (4, Some(4), Some(4)));
/// assert_eq!(tokens.iter().sum::<u32>(), 10);
/// assert_eq!(tokens.range(1..3).as_deref(), Some(&[2, 3][..]));
/// # Ok::<(), kvbm_sequence::SequenceError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Tokens<'a> {
    head: &'a [u32],
    tail: &'a [u32],
}

impl<'a> Tokens<'a> {
    pub(crate) fn new(head: &'a [u32], tail: &'a [u32]) -> Self {
        Self { head, tail }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token at `index`.
    pub fn get(&self, index: usize) -> Option<u32> {
        match index.checked_sub(self.head.len()) {
            None => self.head.get(index).copied(),
            Some(at) => self.tail.get(at).copied(),
        }
    }

    /// The last token.
    pub fn last(&self) -> Option<u32> {
        self.tail.last().or(self.head.last()).copied()
    }

    /// Every token, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + 'a {
        self.head.iter().chain(self.tail).copied()
    }

    /// The two pieces, in order: the shared prompt's part, then the
    /// sequence's own (either may be empty).
    pub fn as_slices(&self) -> (&'a [u32], &'a [u32]) {
        (self.head, self.tail)
    }

    /// The tokens at `range`, borrowed when they lie in one piece (copied
    /// only when they straddle the two); `None` if it reaches past the end.
    pub fn range(&self, range: Range<usize>) -> Option<Cow<'a, [u32]>> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        let split = self.head.len();
        Some(if range.end <= split {
            Cow::Borrowed(&self.head[range])
        } else if range.start >= split {
            Cow::Borrowed(&self.tail[range.start - split..range.end - split])
        } else {
            Cow::Owned([&self.head[range.start..], &self.tail[..range.end - split]].concat())
        })
    }

    /// The tokens, copied into one buffer.
    pub fn to_vec(&self) -> Vec<u32> {
        [self.head, self.tail].concat()
    }
}

impl<'a> IntoIterator for Tokens<'a> {
    type Item = u32;
    type IntoIter =
        std::iter::Copied<std::iter::Chain<std::slice::Iter<'a, u32>, std::slice::Iter<'a, u32>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.head.iter().chain(self.tail).copied()
    }
}

impl PartialEq<[u32]> for Tokens<'_> {
    fn eq(&self, other: &[u32]) -> bool {
        let (head, tail) = other
            .split_at_checked(self.head.len())
            .unwrap_or((other, &[]));
        self.len() == other.len() && self.head == head && self.tail == tail
    }
}

impl PartialEq<&[u32]> for Tokens<'_> {
    fn eq(&self, other: &&[u32]) -> bool {
        *self == **other
    }
}

impl<const N: usize> PartialEq<[u32; N]> for Tokens<'_> {
    fn eq(&self, other: &[u32; N]) -> bool {
        *self == other[..]
    }
}

impl PartialEq<Vec<u32>> for Tokens<'_> {
    fn eq(&self, other: &Vec<u32>) -> bool {
        *self == other[..]
    }
}

impl PartialEq for Tokens<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Tokens<'_> {}

impl fmt::Debug for Tokens<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
