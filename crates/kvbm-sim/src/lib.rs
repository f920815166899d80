//! Trace-driven simulation of kvbm: replay real LLM request traces through
//! every layer and report what the cache and the scheduler did.
//!
//! The simulator reads Mooncake-format JSONL traces ([`Trace`]): per
//! request, an arrival time, prompt and output lengths, and one hash id per
//! 512-token prompt block, where equal ids at equal positions mark a
//! reusable prefix. A [`Workload`] splits those blocks to the simulated
//! block size (any divisor of 512) into chained [`kvbm_blocks::SequenceHash`]es,
//! so a block matches only together with its whole prefix (the derivation is
//! documented on [`Workload`]).
//!
//! Modes ([`mode`]) replay a trace:
//!
//! - **cache** ([`mode::cache`]): requests one after another through a
//!   [`kvbm_blocks::BlockManager`] used as a prefix cache. Each request
//!   matches its longest cached prefix (the hits), allocates its misses
//!   (evicting by the chosen [`Eviction`] policy when the [`Capacity`] is
//!   full), registers them, and releases everything deepest block first, so
//!   chain ends are evicted before the prefixes they share, as in vLLM.
//!   It answers "what hit rate does this cache size and policy buy".
//! - **sweep** ([`sweep()`]): cache mode over a grid of capacities and
//!   policies, written as a table and an SVG plot of hit rate against
//!   capacity (the Mooncake paper's Figure 9).
//! - **serve** ([`mode::serve`]): requests arrive at their timestamps into
//!   kvbm-queue's continuous-batching [`Scheduler`](kvbm_queue::Scheduler),
//!   which admits, chunks, preempts and finishes them over a bounded block
//!   pool, while a stand-in engine samples synthetic tokens and a
//!   [`StepTime`] model advances simulated time. Prompts are rebuilt from
//!   the trace's block ids ([`trace_token`]) so that kvbm's own token
//!   hashing sees the trace's prefix sharing. It answers "what latency,
//!   throughput and preemptions does this pool and scheduler configuration
//!   give": TTFT and time-per-output-token percentiles, throughput, and the
//!   hit rate the scheduler saw ([`ServeReport`]). With a model's KV layout
//!   ([`KvSetup`]: a [`KvModel`] preset such as gpt-oss-120b or Gemma 3,
//!   from its published config, and the KV memory in bytes) the scheduler
//!   runs the model's sliding-window, chunked-local and full-attention KV
//!   cache groups in one pool, and the report says what each group held
//!   ([`KvReport`]).
//!
//! Hits are counted by [`HitStats`]: blocks, and tokens (a hit block counts
//! its block size, capped at the request's prompt length).
//!
//! The `kvbm-sim` binary wraps this library: `kvbm-sim cache --trace FILE
//! [--capacity-blocks N | --capacity-tokens N | --unbounded] [--eviction
//! lru|multi-level|lineage] [--json]`, `kvbm-sim sweep --out DIR`,
//! `kvbm-sim serve --trace FILE [--capacity-tokens N] [--max-running N]
//! [--token-budget N] [--chunk-size N] [--step-ms F] ... [--json]` (or
//! `--model NAME --capacity-bytes B [--full-attention-only]`), and with
//! no arguments a summary of the embedded excerpt of the Mooncake
//! conversation trace ([`CONVERSATION_EXCERPT`]).
//!
//! # Example: a tiny trace through a bounded and an unbounded cache
//!
//! ```
//! use kvbm_sim::{CacheConfig, Capacity, Eviction, Trace, Workload};
//!
//! // Ids 1 and 2 name the same two 512-token blocks in both first requests.
//! let trace = Trace::from_jsonl(concat!(
//!     r#"{"timestamp": 0, "input_length": 1200, "output_length": 20, "hash_ids": [1, 2, 3]}"#,
//!     "\n",
//!     r#"{"timestamp": 10, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 4]}"#,
//!     "\n",
//!     r#"{"timestamp": 20, "input_length": 300, "output_length": 5, "hash_ids": [5]}"#,
//! ))?;
//!
//! // At block size 256 each full trace block is two chained blocks; a
//! // request has ceil(input_length / 256) of them.
//! let workload = Workload::new(&trace, 256)?;
//! assert_eq!(workload.total_blocks(), 5 + 5 + 2);
//!
//! // Unbounded: the second request finds its first four blocks.
//! let report = CacheConfig::new(Capacity::Unbounded, Eviction::Lru).run(&workload)?;
//! assert_eq!((report.hits.hit_blocks, report.hits.hit_tokens), (4, 1024));
//! assert_eq!(report.evictions, 0);
//!
//! // Five blocks: the first request fills the cache, the second still hits
//! // its shared prefix (the tail block `3` is evicted for its own tail),
//! // and the third evicts two more.
//! let report = CacheConfig::new(Capacity::Blocks(5), Eviction::Lru).run(&workload)?;
//! assert_eq!(report.hits.hit_blocks, 4);
//! assert_eq!(report.evictions, 3);
//! println!("{report}"); // a readable summary; `report.to_json()` for machines
//! # Ok::<(), kvbm_sim::SimError>(())
//! ```
//!
//! # Example: serving a tiny trace in simulated time
//!
//! ```
//! use std::time::Duration;
//! use kvbm_sim::{Capacity, ServeConfig, StepTime, Trace};
//!
//! // Two 1000-token prompts sharing their first 512-token block; the second
//! // arrives 1 s after the first, which has finished by then.
//! let trace = Trace::from_jsonl(concat!(
//!     r#"{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]}"#,
//!     "\n",
//!     r#"{"timestamp": 1000, "input_length": 1000, "output_length": 3, "hash_ids": [1, 3]}"#,
//! ))?;
//!
//! // 16-token blocks in a 4096-token pool; 5 ms per step, 0.05 ms per
//! // prefill token, 0.1 ms per decoding request (the defaults).
//! let config = ServeConfig::new(16, Capacity::Tokens(4096))
//!     .with_step_time(StepTime::default())
//!     .with_audit_every(1); // check the scheduler's conservation every step
//! let report = config.run(&trace)?;
//!
//! // The second request found the shared block in the prefix cache.
//! assert_eq!((report.hits.hit_blocks, report.hits.hit_tokens), (32, 512));
//! assert_eq!(report.census.prefix_hit_tokens, 512);
//!
//! // First request: one step prefills 1000 tokens and emits the first
//! // token (5 + 1000 × 0.05 = 55 ms); two decodes of 5.1 ms follow.
//! let first = report.requests[0];
//! assert_eq!(first.ttft(), Some(Duration::from_millis(55)));
//! assert_eq!(first.tpot(), Some(Duration::from_micros(5_100)));
//! // Second request: only 488 tokens to prefill: 5 + 24.4 = 29.4 ms.
//! assert_eq!(report.requests[1].ttft(), Some(Duration::from_micros(29_400)));
//! assert_eq!((report.ttft.p50, report.ttft.max), (Duration::from_micros(29_400), Duration::from_millis(55)));
//! assert_eq!((report.output_tokens, report.preemptions), (6, 0));
//! println!("{report}"); // `report.to_json()` for machines
//! # Ok::<(), kvbm_sim::SimError>(())
//! ```
#![forbid(unsafe_code)]
// The serve report is one `serde_json::json!` object with many keys.
#![recursion_limit = "256"]
#![doc(test(attr(deny(warnings))))]

mod capacity;
mod data_plane;
mod error;
mod events;
mod eviction;
mod format;
pub mod mode;
pub mod model;
mod output;
mod plot;
mod progress;
mod stats;
mod sweep;
mod tier_sweep;
mod tiers;
mod trace;
#[cfg(feature = "kv-events")]
mod wire;
mod workload;

pub use capacity::Capacity;
pub use data_plane::{DataPlaneReport, DataPlaneSpec, MAX_DATA_PLANE_BYTES};
pub use error::SimError;
pub use events::{EventSink, KvEventCounts};
pub use eviction::Eviction;
pub use mode::cache::{
    CacheConfig, CacheOccupancy, CacheReport, CacheSim, CacheTierFigures, CacheTiers,
    RequestOutcome, TierHits,
};
pub use mode::cluster::{ClusterConfig, ClusterReport, ClusterRun, ClusterTiers, PolicyKind};
pub use mode::serve::{
    AdmissionStats, KvGroupReport, KvReport, Latency, PriorityMix, RequestTimeline, ServeConfig,
    ServeOutcome, ServeReport, StepTime, priority_from_vllm, prompt_tokens, trace_token,
};
pub use model::{KvFlags, KvModel, KvSetup, LayerCount, ModelPreset};
pub use output::FigureFiles;
pub use progress::{NoProgress, Progress};
pub use stats::HitStats;
pub use sweep::{Sweep, SweepConfig, SweepFiles, sweep};
pub use tier_sweep::{
    HostTierSize, TierPoint, TierSweep, TierSweepConfig, TierSweepFiles, tier_sweep,
};
pub use tiers::{Link, Offload, STORE_WINDOW_MS, TierSetup};
pub use trace::{
    CONVERSATION_EXCERPT, MAX_TIMESTAMP_MS, TRACE_BLOCK_TOKENS, Trace, TraceRequest, TraceSummary,
};
#[cfg(feature = "kv-events")]
pub use wire::ZmqEventSink;
pub use workload::{SUB_BLOCK_SEED, Workload, WorkloadRequest, sub_block_value};

/// The README's examples, run as doctests (the item exists only then).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
