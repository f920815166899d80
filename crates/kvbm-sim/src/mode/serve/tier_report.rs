//! [`TierReport`]: what the tiers below the GPU did in a serve replay.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

use super::latency::ms;
use crate::format::group;

/// What one lower tier did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierFigures {
    /// Its medium (`"CPU"` for the host tier, `"DISK"`).
    pub medium: String,
    /// Its size in blocks.
    pub capacity_blocks: usize,
    /// Prompt tokens loaded from it onto the GPU (completed loads): the
    /// hits it served, its loaded blocks × the block size. With a model's
    /// KV cache groups every group's loaded blocks count (a full group's
    /// whole run and a window's last few), so it is tokens of KV moved,
    /// not tokens a request skipped (those are the report's hit tokens).
    pub hit_tokens: u64,
    /// Blocks stored into it.
    pub stored_blocks: u64,
    /// Blocks loaded from it.
    pub loaded_blocks: u64,
    /// Blocks it evicted to make room.
    pub evicted_blocks: u64,
    /// Bytes copied into it (planned stores).
    pub bytes_stored: u64,
    /// Bytes copied out of it (planned loads).
    pub bytes_loaded: u64,
    /// Blocks of loads from it given up at the timeout.
    pub failed_loads: u64,
    /// Blocks not stored because its link had `max_incoming_blocks` on the
    /// way already, or it had no room.
    pub skipped_stores: u64,
}

/// What onboarding did: requests that waited for loads before computing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnboardFigures {
    /// Requests that waited for loads.
    pub requests: u64,
    /// Blocks they waited for.
    pub blocks: u64,
    /// Their mean wait, from admission to their first chunk.
    pub mean_stall: Duration,
    /// Requests that stopped waiting at the timeout and recomputed.
    pub timeouts: u64,
    /// Requests whose prefix a lower tier held but the cost model had them
    /// recompute (loading would have been slower).
    pub declined: u64,
}

/// The tiers below the GPU in a serve replay ([`ServeReport::tiers`](super::ServeReport::tiers)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierReport {
    /// Each lower tier, the host first.
    pub tiers: Vec<TierFigures>,
    /// Onboarding.
    pub onboarding: OnboardFigures,
}

impl TierReport {
    /// Prompt tokens every lower tier served.
    pub fn hit_tokens(&self) -> u64 {
        self.tiers.iter().map(|t| t.hit_tokens).sum()
    }

    /// The `tiers` and `onboarding` members of the JSON report.
    pub(super) fn to_json(&self) -> (Value, Value) {
        let tiers = (self.tiers.iter())
            .map(|t| {
                json!({
                    "medium": t.medium,
                    "capacity_blocks": t.capacity_blocks,
                    "hit_tokens": t.hit_tokens,
                    "stored_blocks": t.stored_blocks,
                    "loaded_blocks": t.loaded_blocks,
                    "evicted_blocks": t.evicted_blocks,
                    "bytes_stored": t.bytes_stored,
                    "bytes_loaded": t.bytes_loaded,
                    "failed_loads": t.failed_loads,
                    "skipped_stores": t.skipped_stores,
                })
            })
            .collect();
        let o = &self.onboarding;
        let onboarding = json!({
            "requests": o.requests,
            "blocks": o.blocks,
            "mean_stall_ms": ms(o.mean_stall),
            "timeouts": o.timeouts,
            "declined": o.declined,
        });
        (Value::Array(tiers), onboarding)
    }
}

impl fmt::Display for TierReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.tiers {
            writeln!(
                f,
                "  tier {:<4} {} blocks: served {} tokens; stored {}, loaded {}, evicted {} blocks; \
                 {:.1} GB down, {:.1} GB up",
                t.medium,
                group(t.capacity_blocks as u64),
                group(t.hit_tokens),
                group(t.stored_blocks),
                group(t.loaded_blocks),
                group(t.evicted_blocks),
                t.bytes_stored as f64 / 1e9,
                t.bytes_loaded as f64 / 1e9,
            )?;
        }
        let o = &self.onboarding;
        writeln!(
            f,
            "  onboarding: {} requests waited for {} blocks, mean stall {:.2} ms, {} timed out, \
             {} recomputed by the cost model",
            group(o.requests),
            group(o.blocks),
            ms(o.mean_stall),
            group(o.timeouts),
            group(o.declined)
        )
    }
}
