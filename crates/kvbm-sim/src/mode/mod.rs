//! The simulation modes, one module each.
//!
//! Every mode reads the same [`Workload`](crate::Workload), reports hits with
//! the same [`HitStats`](crate::HitStats) and renders its report as text and
//! as one JSON object with at least `requests`, `input_blocks`, `hit_blocks`,
//! `input_tokens`, `hit_tokens` and `preemptions`.
//!
//! - [`cache`]: requests one after another through a block manager used as
//!   a prefix cache, to study hit rate against capacity and eviction policy.
//!
//! A `serve` mode (requests arriving at their timestamps into the queue and
//! running through the scheduler, with a step-time model and latency
//! percentiles) belongs beside `cache` as `mode::serve`, with its own config
//! and a report that adds latencies to the same hit accounting.

pub mod cache;
