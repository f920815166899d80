//! [`KvReport`]: what a model's KV cache groups took of the pool during a
//! serve replay ([`ServeConfig::kv`](super::ServeConfig::kv)).

use std::fmt;

use kvbm_queue::Scheduler;
use kvbm_sequence::{AttentionKind, KvCacheGroups};
use serde_json::json;

use super::Simulated;
use crate::format::group;
use crate::{KvSetup, SimError};

/// One KV cache group's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvGroupReport {
    /// How its layers attend (with the window or chunk).
    pub kind: AttentionKind,
    /// Its layers (without vLLM's padding layers).
    pub layers: usize,
    /// The most blocks the running requests held in the group after any
    /// step's planning. A block several running requests share (a cached
    /// prefix) counts once per request holding it, so this can exceed
    /// the blocks in use.
    pub peak_blocks: usize,
}

/// What a model's KV layout took of the pool: per group, the most blocks
/// its requests held; over the pool, the most blocks in use and their
/// bytes.
///
/// Both are read after every step's planning, when the step's
/// allocations are held and nothing it finishes is freed yet.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvReport {
    /// The model's name (a preset's, or `custom`).
    pub model: &'static str,
    /// Whether every layer was treated as full attention.
    pub full_attention_only: bool,
    /// KV memory given, in bytes.
    pub capacity_bytes: u64,
    /// Layers a block holds (vLLM's group size, padding included; all of
    /// them with `full_attention_only`).
    pub layers_per_block: usize,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// The groups, in the scheduler's order.
    pub groups: Vec<KvGroupReport>,
    /// The most blocks in use in the pool (held by requests: neither free
    /// nor only cached) after any step's planning. A block is counted once
    /// however many requests share it.
    pub peak_blocks_in_use: usize,
}

impl KvReport {
    /// The most KV bytes in use: `peak_blocks_in_use × block_bytes`.
    pub fn peak_kv_bytes(&self) -> u64 {
        (self.peak_blocks_in_use as u64).saturating_mul(self.block_bytes)
    }

    /// The JSON fields this adds to the serve report.
    pub(super) fn json_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let groups: Vec<serde_json::Value> = (self.groups.iter())
            .map(|g| {
                let (window, chunk) = match g.kind {
                    AttentionKind::SlidingWindow { window } => (Some(window), None),
                    AttentionKind::ChunkedLocal { chunk } => (None, Some(chunk)),
                    _ => (None, None),
                };
                json!({
                    "kind": g.kind.name(),
                    "window": window,
                    "chunk": chunk,
                    "layers": g.layers,
                    "peak_blocks": g.peak_blocks,
                })
            })
            .collect();
        let fields = json!({
            "model": self.model,
            "full_attention_only": self.full_attention_only,
            "capacity_bytes": self.capacity_bytes,
            "layers_per_block": self.layers_per_block,
            "kv_block_bytes": self.block_bytes,
            "kv_groups": groups,
            "peak_blocks_in_use": self.peak_blocks_in_use,
            "peak_kv_bytes": self.peak_kv_bytes(),
        });
        match fields {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }
}

impl fmt::Display for KvReport {
    /// Two lines: the model and its memory, then each group's peak.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  KV: {}{}, {} bytes per block ({} layers), peak {} blocks in use = {:.2} GB of {:.2} GB",
            self.model,
            if self.full_attention_only {
                " as full attention only"
            } else {
                ""
            },
            group(self.block_bytes),
            self.layers_per_block,
            group(self.peak_blocks_in_use as u64),
            self.peak_kv_bytes() as f64 / 1e9,
            self.capacity_bytes as f64 / 1e9,
        )?;
        let groups: Vec<String> = (self.groups.iter())
            .map(|g| {
                format!(
                    "{} × {} layers: {}",
                    g.kind,
                    g.layers,
                    group(g.peak_blocks as u64)
                )
            })
            .collect();
        writeln!(f, "  peak blocks held per group: {}", groups.join("; "))
    }
}

/// The peaks a replay tracks for [`KvReport`].
pub(super) struct KvPeaks {
    setup: KvSetup,
    groups: KvCacheGroups,
    block_bytes: u64,
    peak_blocks: Vec<usize>,
    peak_in_use: usize,
    /// Each group's held blocks at the last observation (a buffer kept
    /// between steps).
    held: Vec<usize>,
}

impl KvPeaks {
    /// Tracking for `setup` over blocks of `block_size` tokens.
    ///
    /// # Errors
    ///
    /// As [`KvSetup::groups`] and [`KvSetup::block_bytes`].
    pub(super) fn new(setup: KvSetup, block_size: usize) -> Result<Self, SimError> {
        let groups = setup.groups(block_size)?;
        Ok(Self {
            setup,
            block_bytes: setup.block_bytes(block_size)?,
            peak_blocks: vec![0; groups.len()],
            held: Vec::with_capacity(groups.len()),
            groups,
            peak_in_use: 0,
        })
    }

    /// Reads the pool and the running requests' tables now.
    pub(super) fn observe(&mut self, scheduler: &Scheduler<Simulated>) {
        let manager = scheduler.manager();
        let in_use = (manager.total_blocks()).saturating_sub(manager.available_blocks());
        self.peak_in_use = self.peak_in_use.max(in_use);
        scheduler.held_blocks_by_group_into(&mut self.held);
        for (peak, &held) in self.peak_blocks.iter_mut().zip(&self.held) {
            *peak = (*peak).max(held);
        }
    }

    pub(super) fn report(&self) -> KvReport {
        KvReport {
            model: self.setup.model.name(),
            full_attention_only: self.setup.full_attention_only,
            capacity_bytes: self.setup.capacity_bytes,
            layers_per_block: self.setup.layers_per_block(),
            block_bytes: self.block_bytes,
            groups: (self.groups.groups().iter())
                .zip(&self.peak_blocks)
                .map(|(g, &peak_blocks)| KvGroupReport {
                    kind: g.kind(),
                    layers: g.layers(),
                    peak_blocks,
                })
                .collect(),
            peak_blocks_in_use: self.peak_in_use,
        }
    }
}
