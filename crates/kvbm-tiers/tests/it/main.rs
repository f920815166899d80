//! kvbm-tiers through its public API: the offload policies, the two-phase
//! transfer protocol, onboarding across tiers, and a fuzzer over arbitrary
//! call sequences and engine reports.

mod adopt;
mod fuzz;
mod immediate;
mod onboard;
mod policies;
mod support;
mod transfers;
