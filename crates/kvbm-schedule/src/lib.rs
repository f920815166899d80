//! The prefill/decode/speculative schedule-apply state machine of one request.
//!
//! The third layer of kvbm, on top of `kvbm-sequence` (tokens, hashes, block
//! handles of one request) and `kvbm-blocks` (the pool and its prefix cache).
//! [`SchedulableSequence`] wraps one request's
//! [`RequestSequence`](kvbm_sequence::RequestSequence) in a two-phase
//! protocol, so an engine can plan a step, run the model, then commit the step
//! or roll it back. It tracks which tokens have their KV computed
//! (`kv_position`), registers a block only once its KV is computed, and
//! keeps an event history. Which request runs when is not its business: that
//! is the queue above it.
//!
//! # State machine
//!
//! ```text
//!          schedule_prefill         apply_prefill
//!  Idle ───────────────────► PrefillScheduled ──────────► Idle
//!   │                                                      ▲
//!   │     schedule_decode          apply_decode            │
//!   ├───────────────────► DecodeScheduled ─────────────────┤
//!   │                                                      │
//!   │   schedule_speculative     apply_speculative         │
//!   └───────────────────► SpeculativeScheduled ────────────┤
//!                          (any scheduled state)           │
//!                                 │   revert_schedule      │
//!                                 └────────────────────────┘
//!
//!  Idle only: match_and_add_prefix, release, reacquire
//! ```
//!
//! Every `schedule_*` call validates its preconditions and pre-allocates the
//! blocks the step writes, all or nothing. Every `apply_*` call commits: it
//! appends the sampled tokens, advances `kv_position` and registers the
//! blocks that became fully computed. [`revert_schedule`] undoes a schedule,
//! giving its blocks back last allocated first (LIFO). A failed call is
//! atomic: a refused `schedule_*` allocates nothing and changes nothing; a
//! refused `apply_*` leaves the schedule pending, so a corrected retry works.
//! Nothing here panics on caller input.
//!
//! # `kv_position` and the tail
//!
//! [`kv_position`] counts the tokens whose KV is computed, by this request's
//! steps or taken from the cache. [`tail_tokens`] `= total_tokens -
//! kv_position` counts the others. A forward pass computes the KV of the
//! tokens it is fed and samples one token from the last position, which is
//! appended with its KV *not* computed: it is the **tail** (or dangling)
//! token, fed to the next step. So after the chunk that completes the prompt
//! and after every decode or speculative step, `tail_tokens() == 1`, and
//! decode and speculative steps require exactly that.
//!
//! ```text
//!  tokens:   p0 p1 p2 p3 | p4 p5 p6 g0 | g1          block_size = 4
//!  KV:       ■  ■  ■  ■  | ■  ■  ■  ■  | □           kv_position = 8, tail = 1
//!            registered    registered    allocated by the next schedule_decode
//! ```
//!
//! # Registration timing
//!
//! A block becomes registered (matchable by other requests) only once
//! `kv_position` covers every one of its tokens. A block whose last token is
//! still the tail is full in tokens but not in KV; sharing it would let
//! another request read a KV slot that is not written yet. So
//! `apply_prefill` registers the blocks the chunk completed,
//! `apply_decode(token)` registers the block completed by the *previous* tail
//! token (now computed) and appends `token` as the new tail, and
//! `apply_speculative` registers every block completed before its last
//! accepted token. (`kvbm-logical` 1.6.1 registers such a block one step
//! early; this crate does not.)
//!
//! ```
//! use kvbm_blocks::BlockManager;
//! use kvbm_schedule::SchedulableSequence;
//! # struct Gpu;
//! let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! let mut first = SchedulableSequence::<Gpu>::new((0..7).collect(), 8, 4)?;
//! first.schedule_prefill(7, &manager)?;
//! first.apply_prefill(Some(100), &manager)?; // 100 fills block 1: [4, 5, 6, 100]
//! assert_eq!((first.kv_position(), first.assigned_blocks()), (7, 1));
//!
//! // Another request with the same 8 tokens sees only block 0 ...
//! let mut other = SchedulableSequence::<Gpu>::new([first.tokens().to_vec(), vec![7, 7]].concat(), 8, 4)?;
//! assert_eq!(other.match_and_add_prefix(&manager)?, 1);
//!
//! // ... until the decode step that computes the KV of 100.
//! first.schedule_decode(&manager)?;
//! first.apply_decode(101, &manager)?;
//! assert_eq!((first.kv_position(), first.assigned_blocks()), (8, 2));
//! assert_eq!(other.match_and_add_prefix(&manager)?, 1); // block 1, mid-prefill
//! assert_eq!(other.kv_position(), 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Typical lifecycle
//!
//! ```
//! use kvbm_blocks::BlockManager;
//! use kvbm_schedule::{DecodeOutcome, SchedulableSequence};
//! # struct Gpu;
//! let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! let mut next = 1000;
//! let mut forward = |_: &SchedulableSequence<Gpu>| { next += 1; next }; // the model
//!
//! let tokens: Vec<u32> = (0..8).collect();
//! let mut seq = SchedulableSequence::<Gpu>::new(tokens, 10, 4)?;
//!
//! // 1. Optional prefix matching
//! let matched = seq.match_and_add_prefix(&manager)?;
//!
//! // 2. Prefill (single chunk)
//! seq.schedule_prefill(8 - matched * 4, &manager)?;
//! let first_generated_token = forward(&seq);
//! seq.apply_prefill(Some(first_generated_token), &manager)?;
//! assert_eq!((seq.kv_position(), seq.tail_tokens()), (8, 1));
//!
//! // 3. Decode loop
//! let mut blocks_completed = 0;
//! while !seq.is_complete() {
//!     seq.schedule_decode(&manager)?;
//!     let token = forward(&seq);
//!     let outcome = seq.apply_decode(token, &manager)?;
//!     // outcome: Continue | BlockCompleted | MaxLength | BlockCompletedAndMaxLength
//!     blocks_completed += usize::from(outcome.block_completed());
//!     if seq.is_complete() {
//!         assert_eq!(outcome, DecodeOutcome::MaxLength);
//!     }
//! }
//! assert_eq!((seq.generated_tokens(), seq.kv_position(), blocks_completed), (10, 17, 2));
//! assert_eq!(seq.assigned_blocks(), 4); // 17 computed tokens: 4 full blocks
//!
//! // 4. Release
//! seq.release()?;
//! assert_eq!(manager.metrics().inactive_blocks, 4); // still cached for others
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Models with several KV cache groups
//!
//! A model whose layers attend differently (gpt-oss's sliding-window and
//! full layers, say) is a [`GroupedSequence`]: one [`SchedulableSequence`]
//! per [`KvCacheGroup`](kvbm_sequence::KvCacheGroup) in one shared pool,
//! moved in lock-step, each group releasing what its layers read no more
//! ([`SchedulableSequence::release_unread`]) and a prefix hit counted only
//! as far as every group can serve it. Its page shows an example.
//!
//! # Chunked prefill
//!
//! Split prefill across chunks. Only the chunk that reaches the prompt's end
//! (`num_input_tokens`) carries the first generated token; the others must
//! not. A refused apply leaves the chunk scheduled, so the caller can retry.
//!
//! ```
//! # use kvbm_blocks::BlockManager;
//! # use kvbm_schedule::SchedulableSequence;
//! use kvbm_schedule::ApplyError;
//! # struct Gpu;
//! # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! let mut seq = SchedulableSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
//! # let first_token = 1000;
//! // Chunk 1 (non-final): no token
//! seq.schedule_prefill(4, &manager)?;
//! assert!(matches!(
//!     seq.apply_prefill(Some(first_token), &manager),
//!     Err(ApplyError::TokenOnNonFinalChunk { chunk_end: 4, prefill_target: 8, .. })
//! ));
//! seq.apply_prefill(None, &manager)?; // the retry works
//!
//! // Chunk 2 (final): must provide the first generated token
//! seq.schedule_prefill(4, &manager)?;
//! assert!(matches!(
//!     seq.apply_prefill(None, &manager),
//!     Err(ApplyError::MissingTokenOnFinalChunk { prefill_target: 8 })
//! ));
//! seq.apply_prefill(Some(first_token), &manager)?;
//! assert_eq!((seq.kv_position(), seq.tail_tokens(), seq.assigned_blocks()), (8, 1, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Speculative decode
//!
//! Schedule a batch of draft tokens (blocks for all of them are allocated),
//! then accept a prefix. The blocks the rejected drafts would have used go
//! back LIFO; the tail is still one token.
//!
//! ```
//! # use kvbm_blocks::BlockManager;
//! # use kvbm_schedule::SchedulableSequence;
//! use kvbm_schedule::DecodeOutcome;
//! # struct Gpu;
//! # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! # let mut seq = SchedulableSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
//! # seq.schedule_prefill(8, &manager)?;
//! # seq.apply_prefill(Some(1000), &manager)?;
//! # let (tok1, tok2, tok3) = (1, 2, 3);
//! // 9 tokens, 8 computed, 2 blocks held
//! seq.schedule_speculative(5, &manager)?;
//! assert_eq!(seq.held_blocks(), 4); // slots 8..=13: the tail token and 5 drafts
//! // Model verifies draft tokens, accepts first 3
//! let outcome = seq.apply_speculative(&[tok1, tok2, tok3], &manager)?;
//! assert_eq!(outcome, DecodeOutcome::BlockCompleted); // tok3 filled block 2
//! assert_eq!((seq.kv_position(), seq.tail_tokens()), (11, 1));
//! assert_eq!(seq.held_blocks(), 3); // the fourth block went back
//! assert_eq!(seq.assigned_blocks(), 2); // block 2 waits for tok3's KV
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Preemption
//!
//! [`release`](SchedulableSequence::release) gives every block back
//! (registered ones stay cached) and drops `kv_position` to 0.
//! [`reacquire`](SchedulableSequence::reacquire) later re-matches the cached
//! prefix and sets `kv_position` to it; it does not allocate the generation
//! block, the next `schedule_decode` does. Tokens past the cached prefix,
//! generated ones included, lost their KV and are recomputed through the
//! prefill path up to [`prefill_target`](SchedulableSequence::prefill_target)
//! (`total_tokens - 1` once a token was generated), without a token on the
//! final chunk; then decoding resumes. The general loop:
//!
//! ```
//! # use kvbm_blocks::BlockManager;
//! # use kvbm_schedule::SchedulableSequence;
//! # struct Gpu;
//! # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! # let mut next = 1000;
//! # let mut forward = |_: &SchedulableSequence<Gpu>| { next += 1; next };
//! # let mut seq = SchedulableSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
//! # seq.schedule_prefill(8, &manager)?;
//! # seq.apply_prefill(Some(forward(&seq)), &manager)?;
//! # for _ in 0..3 {
//! #     seq.schedule_decode(&manager)?;
//! #     seq.apply_decode(forward(&seq), &manager)?;
//! # }
//! // 12 tokens, 11 computed: blocks 0 and 1 registered, block 2 partial
//! seq.release()?;
//! // ... later ...
//! let matched = seq.reacquire(&manager)?;
//! assert_eq!((matched, seq.kv_position(), seq.tail_tokens()), (2, 8, 4));
//! const CHUNK: usize = 512;
//! while !seq.is_prefill_complete() {
//!     let remaining = seq.remaining_prefill_tokens();
//!     let chunk = remaining.min(CHUNK);
//!     seq.schedule_prefill(chunk, &manager)?;
//!     // Only a prompt's final chunk emits a token; recompute chunks never do.
//!     let token = (chunk == remaining && seq.final_chunk_emits_token()).then(|| forward(&seq));
//!     seq.apply_prefill(token, &manager)?;
//! }
//! assert_eq!(seq.tail_tokens(), 1);
//! seq.schedule_decode(&manager)?;
//! # seq.apply_decode(forward(&seq), &manager)?;
//! # assert_eq!(seq.kv_position(), 12);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! When the whole sequence is still cached (every full block before the tail
//! token), prefill is complete right after `reacquire` and decoding resumes
//! at once:
//!
//! ```
//! # use kvbm_blocks::BlockManager;
//! # use kvbm_schedule::SchedulableSequence;
//! # struct Gpu;
//! # let manager = BlockManager::<Gpu>::builder().block_count(16).block_size(4).build()?;
//! # let mut seq = SchedulableSequence::<Gpu>::new((0..8).collect(), 10, 4)?;
//! # seq.schedule_prefill(8, &manager)?;
//! # seq.apply_prefill(Some(1000), &manager)?;
//! seq.release()?;
//! // ... later ...
//! let matched = seq.reacquire(&manager)?;
//! assert_eq!((matched, seq.tail_tokens()), (2, 1));
//! // Reacquire does not allocate a generation block;
//! // the next schedule_decode handles that.
//! assert_eq!(seq.unassigned_blocks(), 0);
//! seq.schedule_decode(&manager)?;
//! assert_eq!(seq.unassigned_blocks(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Error handling
//!
//! | Error                                      | When                                                  |
//! |--------------------------------------------|-------------------------------------------------------|
//! | [`ScheduleError::NotIdle`]                 | `schedule_*` (or match, reacquire) while scheduled    |
//! | [`ScheduleError::PrefillNotComplete`]      | decode/speculative before prefill (recompute) is done |
//! | [`ScheduleError::PrefillComplete`]         | `schedule_prefill` with nothing left to prefill       |
//! | [`ScheduleError::PrefillOverrun`]          | chunk would pass the prefill target                   |
//! | [`ScheduleError::AllocationFailed`]        | not enough blocks in the manager                      |
//! | [`ScheduleError::GenerationComplete`]      | already hit `max_output_tokens`                       |
//! | [`ScheduleError::WrongDanglingCount`]      | tail tokens != 1 for decode/speculative               |
//! | [`ScheduleError::NotReleased`]             | `reacquire` while blocks are held                     |
//! | [`ApplyError::WrongState`]                 | `apply_*`, revert or release in the wrong state       |
//! | [`ApplyError::TokenOnNonFinalChunk`]       | token given on a prefill chunk that emits none        |
//! | [`ApplyError::MissingTokenOnFinalChunk`]   | the prompt's final chunk without a token              |
//! | [`ApplyError::AcceptedExceedsScheduled`]   | more accepted than draft tokens scheduled             |
//! | `ScheduleError::Sequence`, `ApplyError::Sequence` | a manager of another block size or pool        |
//!
//! # Event history
//!
//! Every successful transition is recorded in an append-only [`EventLog`],
//! accessible via [`history`](SchedulableSequence::history): `Created`,
//! `PrefixMatched`, `PrefillScheduled`, `PrefillApplied`, `DecodeScheduled`,
//! `DecodeApplied`, `SpeculativeScheduled`, `SpeculativeApplied`,
//! `ScheduleReverted`, `UnassignedDropped`, `Released` and `Reacquired` (see
//! [`SequenceEvent`]). A [`HistoryPolicy`] set on the
//! [builder](SchedulableSequence::builder) keeps everything (the default),
//! the last `n` events, or none, so a 100k-token decode need not grow memory
//! without limit; the log counts what it dropped.
//!
//! [`revert_schedule`]: SchedulableSequence::revert_schedule
//! [`kv_position`]: SchedulableSequence::kv_position
//! [`tail_tokens`]: SchedulableSequence::tail_tokens
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod acquire;
mod builder;
mod decode;
mod error;
mod grouped;
mod history;
mod prefill;
mod revert;
mod sequence;
mod speculative;
mod state;
mod window;

pub use builder::SchedulableSequenceBuilder;
pub use error::{ApplyError, ScheduleError};
pub use grouped::GroupedSequence;
pub use history::{EventLog, HistoryPolicy, SequenceEvent};
pub use sequence::SchedulableSequence;
pub use state::{DecodeOutcome, SequenceState};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
