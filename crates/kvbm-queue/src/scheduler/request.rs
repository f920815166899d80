//! [`InferenceRequest`]: what a front end hands the scheduler, and the ids and
//! reasons that name a request's fate.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kvbm_sequence::{HashedPrompt, Salt};

use crate::{Priority, Request};

/// Names one request for its whole life in a [`Scheduler`](crate::Scheduler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// A generation request: a tokenized prompt and how much it may generate.
///
/// Cloning is cheap (the prompt is shared).
#[derive(Clone)]
pub struct InferenceRequest {
    id: RequestId,
    priority: Priority,
    prompt: Prompt,
    max_new_tokens: u32,
    salt: Salt,
    arrival: Option<Duration>,
}

/// A request's prompt: its tokens, with their block hashes when whoever
/// built the request had them. One pointer wide either way, so a request
/// (and a refused one handed back) stays small.
#[derive(Clone)]
enum Prompt {
    Tokens(Arc<[u32]>),
    Hashed(HashedPrompt),
}

impl InferenceRequest {
    /// A [`Priority::Normal`] request without salt.
    pub fn new(id: RequestId, prompt: impl Into<Arc<[u32]>>, max_new_tokens: u32) -> Self {
        Self {
            id,
            priority: Priority::Normal,
            prompt: Prompt::Tokens(prompt.into()),
            max_new_tokens,
            salt: Salt::NONE,
            arrival: None,
        }
    }

    /// A [`Priority::Normal`] request for a prompt already hashed (by a
    /// router keying it, say), under the prompt's salt. When its block size
    /// is the scheduler's, the request's sequence takes those hashes instead
    /// of hashing the prompt again; otherwise (or after
    /// [`with_salt`](Self::with_salt) changed the salt) it hashes as usual.
    pub fn hashed(id: RequestId, prompt: HashedPrompt, max_new_tokens: u32) -> Self {
        Self {
            id,
            priority: Priority::Normal,
            salt: prompt.salt(),
            prompt: Prompt::Hashed(prompt),
            max_new_tokens,
            arrival: None,
        }
    }

    /// Sets the priority.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Isolates this request's cache entries (a LoRA adapter or tenant):
    /// only requests with the same salt share prefix blocks.
    pub fn with_salt(mut self, salt: Salt) -> Self {
        self.salt = salt;
        self
    }

    /// Sets its arrival time, as time since the scheduler was built, for
    /// [`Aging::Timed`](crate::Aging::Timed) (a simulator's clock; by default
    /// the queue reads its own at submission).
    pub fn with_arrival(mut self, arrival: Duration) -> Self {
        self.arrival = Some(arrival);
        self
    }

    /// The prompt tokens.
    pub fn prompt(&self) -> &[u32] {
        match &self.prompt {
            Prompt::Tokens(tokens) => tokens,
            Prompt::Hashed(prompt) => prompt.tokens(),
        }
    }

    /// The prompt's tokens, shared (one reference more, no copy): what a
    /// sequence reads in place.
    pub(crate) fn shared_prompt(&self) -> Arc<[u32]> {
        match &self.prompt {
            Prompt::Tokens(tokens) => tokens.clone(),
            Prompt::Hashed(prompt) => prompt.shared_tokens().clone(),
        }
    }

    /// The salt.
    pub fn salt(&self) -> Salt {
        self.salt
    }

    /// The prompt with its block hashes, if the request was built
    /// [`hashed`](Self::hashed).
    pub fn hashed_prompt(&self) -> Option<&HashedPrompt> {
        match &self.prompt {
            Prompt::Tokens(_) => None,
            Prompt::Hashed(prompt) => Some(prompt),
        }
    }
}

impl Request for InferenceRequest {
    type Id = RequestId;

    fn id(&self) -> RequestId {
        self.id
    }

    fn priority(&self) -> Priority {
        self.priority
    }

    fn prompt_tokens(&self) -> u32 {
        u32::try_from(self.prompt().len()).unwrap_or(u32::MAX)
    }

    fn max_new_tokens(&self) -> u32 {
        self.max_new_tokens
    }

    fn arrival(&self) -> Option<Duration> {
        self.arrival
    }
}

impl fmt::Debug for InferenceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InferenceRequest")
            .field("id", &self.id)
            .field("priority", &self.priority)
            .field("prompt_tokens", &self.prompt().len())
            .field("max_new_tokens", &self.max_new_tokens)
            .finish()
    }
}

/// Why a request left the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinishReason {
    /// It generated `max_new_tokens` tokens.
    MaxTokens,
    /// The engine reported a stop (end-of-sequence or a stop string).
    Stop,
    /// [`Scheduler::abort`](crate::Scheduler::abort) took it out, or it could
    /// not be scheduled at all.
    Aborted,
    /// [`SubmitHandle::cancel`](crate::SubmitHandle::cancel) (or
    /// [`Scheduler::cancel`](crate::Scheduler::cancel)) ended it.
    Cancelled,
    /// Its length outgrew the whole block pool: even running alone it could
    /// not get a block for its next token, or, preempted, it had grown too
    /// long to be resumed in the whole pool.
    CapacityExceeded,
}
