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
//! - [`serve`]: requests arriving at their timestamps into the queue and
//!   running through the scheduler in simulated time, with a step-time model,
//!   latency percentiles and the hit rate the scheduler saw.
//!
//! - [`cluster`]: the same arrivals routed over many serve-mode engines by a
//!   [`kvbm_router::Router`], one replay per routing policy.

pub mod cache;
pub mod cluster;
pub mod serve;
