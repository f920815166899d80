//! The request queue and the scheduler: the top layer of kvbm, and its API
//! boundary.
//!
//! Below it, `kvbm-blocks` owns KV blocks, `kvbm-sequence` maps tokens to
//! blocks and `kvbm-schedule` runs one request's schedule/apply protocol.
//! This crate holds the requests that are *waiting*: a thread-safe
//! [`RequestQueue`] that front ends feed from any thread; and the
//! [`Scheduler`] an engine calls every step, which admits, chunks, preempts
//! and finishes requests over all the layers (see its docs and the second
//! example below). For a model that mixes sliding-window, chunked-local and
//! full attention, [`Scheduler::with_kv_groups`] keeps one block table per
//! layer group and releases what each group reads no more.
//!
//! - **Order.** [`Priority`] `Low < Normal < High < Critical`, higher served
//!   first; FIFO within one priority by a `u64` arrival number (optionally
//!   [`Aging::Window`], so low priorities cannot starve).
//! - **Exactly once.** Every request that enters leaves exactly one way:
//!   dequeued, selected, removed, cancelled or cleared. Removal is real (the
//!   request is out and returned at once), `len`/`contains` are exact, and a
//!   duplicate id or a closed queue hands the request back ([`Rejected`]).
//! - **Waiting.** [`dequeue`](RequestQueue::dequeue) blocks,
//!   [`dequeue_timeout`](RequestQueue::dequeue_timeout) gives up,
//!   [`try_dequeue`](RequestQueue::try_dequeue) never waits, and
//!   [`dequeue_cancellable`](RequestQueue::dequeue_cancellable) stops when its
//!   [`WaitToken`] is cancelled. [`close`](RequestQueue::close) wakes every
//!   waiter; what is left can still be drained. Empty, timed out, closed and
//!   cancelled are distinct [`QueueError`]s.
//! - **Cancellation.** [`enqueue`](RequestQueue::enqueue) returns a
//!   [`Ticket`] (plain data) naming that request;
//!   [`cancel`](RequestQueue::cancel) or a [`CancelHandle`] made from it
//!   removes the request at once from any thread. Nothing is registered, so
//!   nothing leaks, and a stale ticket never hits a later request that reuses
//!   the id.
//! - **Admission.** [`select_batch`](RequestQueue::select_batch) takes, in
//!   service order, the requests whose KV cost fits a block budget. A cost is
//!   `ceil((prompt + generation reserve) / block_tokens)` blocks; budgets in
//!   bytes go through a model [`KvLayout`]. A request larger than the whole
//!   pool is refused at enqueue. When the next request does not fit, the
//!   [`Selection`] policy decides: stop (head of line, the default) or skip
//!   ahead with a bound on how often a request can be passed over. A selected
//!   request whose real allocation fails goes back to its original place with
//!   [`restore`](RequestQueue::restore).
//!
//! No request code runs and no request is dropped while the queue's lock is
//! held; operations emit `tracing` events (`debug` level) after unlocking.
//!
//! # Example: the queue
//!
//! ```
//! use std::thread;
//! use kvbm_queue::{Priority, QueueConfig, QueueError, Request, RequestQueue};
//!
//! #[derive(Debug)]
//! struct Prompt { id: u64, priority: Priority, tokens: u32, max_new: u32 }
//!
//! impl Request for Prompt {
//!     type Id = u64;
//!     fn id(&self) -> u64 { self.id }
//!     fn priority(&self) -> Priority { self.priority }
//!     fn prompt_tokens(&self) -> u32 { self.tokens }
//!     fn max_new_tokens(&self) -> u32 { self.max_new }
//! }
//!
//! // 16-token blocks, 64 blocks in the pool; the default reserve is
//! // min(max_new_tokens, 256) generated tokens.
//! let queue = RequestQueue::new(QueueConfig::new(16, 64))?;
//! let prompt = |id, priority, tokens| Prompt { id, priority, tokens, max_new: 16 };
//!
//! queue.enqueue(prompt(1, Priority::Normal, 200))?; // 216 tokens: 14 blocks
//! queue.enqueue(prompt(2, Priority::Critical, 100))?; // 8 blocks
//! let ticket = queue.enqueue(prompt(3, Priority::Normal, 50))?;
//! queue.enqueue(prompt(4, Priority::Low, 10))?;
//! // Too big for the whole pool: refused now, not stuck at the head forever.
//! let too_big = queue.enqueue(prompt(5, Priority::High, 5000)).unwrap_err();
//! assert!(matches!(too_big.error(), QueueError::TooLarge { needed: 314, pool: 64 }));
//!
//! // A client disconnects: any thread can cancel its request.
//! let doomed = queue.cancel_handle(ticket);
//! thread::spawn(move || doomed.cancel()).join().unwrap();
//! assert_eq!(queue.len(), 3);
//!
//! // The scheduler admits what fits its 25 free blocks, most urgent first.
//! let batch = queue.select_batch(8, 25);
//! let ids: Vec<u64> = batch.iter().map(|a| a.id()).collect();
//! assert_eq!(ids, [2, 1, 4]); // 8 + 14 + 2 blocks
//! assert_eq!(batch.blocks(), 24);
//!
//! // Request 4's allocation fails after all: it goes back where it was.
//! let mut batch = batch;
//! for admitted in batch.split_off(2) {
//!     queue.restore(admitted)?;
//! }
//!
//! // A consumer on another thread; closing wakes it once the queue is drained.
//! let consumer = {
//!     let queue = queue.clone();
//!     thread::spawn(move || {
//!         let mut served = Vec::new();
//!         while let Ok(prompt) = queue.dequeue() {
//!             served.push(prompt.id);
//!         }
//!         served
//!     })
//! };
//! queue.close();
//! assert_eq!(consumer.join().unwrap(), [4]);
//! assert_eq!(queue.try_dequeue().unwrap_err(), QueueError::Closed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: the full stack
//!
//! A block pool, a scheduler over it, and an engine loop: plan a step, "run
//! the model", apply what it sampled. The second request shares the first's
//! 32-token system prompt and prefills only its own tokens.
//!
//! ```
//! use kvbm_blocks::BlockManager;
//! use kvbm_queue::{EngineOutput, InferenceRequest, RequestId, Scheduler, SchedulerConfig};
//!
//! struct Gpu; // a storage-tier marker
//!
//! let manager = BlockManager::<Gpu>::builder().block_count(64).block_size(16).build()?;
//! let mut scheduler = Scheduler::new(manager, SchedulerConfig::default())?;
//!
//! let system: Vec<u32> = (0..32).collect();
//! let prompt = |tail: &[u32]| [&system[..], tail].concat();
//! scheduler.submit(InferenceRequest::new(RequestId(1), prompt(&[100, 101]), 4))?;
//!
//! // A stand-in engine: sample token 7 wherever a token is due.
//! fn engine(plan: &kvbm_queue::StepPlan) -> Vec<EngineOutput> {
//!     let prefill = plan.prefill.iter().map(|p| match p.emits_token {
//!         true => EngineOutput::token(p.id, 7),
//!         false => EngineOutput::no_token(p.id),
//!     });
//!     let decode = plan.decode.iter().map(|d| EngineOutput::token(d.id, 7));
//!     prefill.chain(decode).collect()
//! }
//!
//! let mut finished = Vec::new();
//! while !scheduler.is_idle() {
//!     let plan = scheduler.step()?;
//!     let report = scheduler.apply(&engine(&plan))?;
//!     finished.extend(report.finished);
//!     if finished.len() == 1 && scheduler.census().submitted == 1 {
//!         scheduler.submit(InferenceRequest::new(RequestId(2), prompt(&[200]), 4))?;
//!     }
//! }
//! assert!(finished.iter().all(|f| f.generated_tokens == 4));
//! let census = scheduler.audit()?; // every request and block accounted for
//! assert_eq!((census.finished, census.prefix_hit_tokens), (2, 32));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

mod batch;
mod config;
mod error;
mod handles;
mod layout;
mod pending;
mod queue;
mod request;
mod scheduler;
mod shared;
mod stats;
mod sync;

pub use batch::{Admitted, Batch};
pub use config::{Aging, GenerationReserve, MAX_BOOST_STEPS, QueueConfig, Selection};
pub use error::{QueueError, Rejected, SchedulerError};
pub use handles::{CancelHandle, Ticket, WaitToken};
pub use layout::KvLayout;
pub use queue::RequestQueue;
pub use request::{Priority, Request};
pub use scheduler::{
    Census, DecodeWork, DecodesInPlace, EngineOutput, FinishReason, Finished, GroupBlocks,
    InferenceRequest, LinkCost, LoadCost, OnboardStats, PAD_SLOT, Preemption, PrefillWork,
    RequestId, RolledBack, Scheduler, SchedulerConfig, StepPlan, StepReport, SubmitHandle,
    TiersConfig, describe_metrics, metric_names,
};
pub use stats::QueueStats;

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
