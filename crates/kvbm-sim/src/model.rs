//! Real models' KV layouts ([`KvModel`]): the attention each layer uses and
//! the bytes of KV a token takes per layer, from the models' published
//! Hugging Face `config.json`s, grouped into KV cache groups as vLLM's
//! hybrid KV cache manager groups them; and a serve replay's KV memory
//! ([`KvSetup`]).
//!
//! # The presets
//!
//! Each preset ([`ModelPreset::ALL`]) is read off the model's
//! `config.json` on Hugging Face (for multimodal checkpoints, its
//! `text_config`), with the KV cache in the model's own dtype (vLLM's
//! `--kv-cache-dtype auto`; all five are `bfloat16`, 2 bytes). A token's KV
//! in one layer is a key and a value per KV head:
//! `2 × num_key_value_heads × head_dim × 2` bytes.
//!
//! | preset | repository | layers (`num_hidden_layers`) | attention | `num_key_value_heads` × `head_dim` | bytes / token / layer |
//! |---|---|---:|---|---:|---:|
//! | `gpt-oss-120b` | `openai/gpt-oss-120b` | 36 | `layer_types` alternates `sliding_attention` and `full_attention` (from layer 0): 18 × `sliding_window` 128, 18 × full | 8 × 64 | 2,048 |
//! | `gpt-oss-20b` | `openai/gpt-oss-20b` | 24 | the same alternation: 12 × `sliding_window` 128, 12 × full | 8 × 64 | 2,048 |
//! | `gemma-3-27b` | `google/gemma-3-27b-it` (`text_config`) | 62 | `sliding_window_pattern` 6 (every 6th layer global): 52 × `sliding_window` 1024, 10 × full | 16 × 128 | 8,192 |
//! | `llama-3.1-8b` | `meta-llama/Llama-3.1-8B-Instruct` | 32 | all full | 8 × 128 (`hidden_size` 4096 / `num_attention_heads` 32) | 4,096 |
//! | `llama-4-scout` | `meta-llama/Llama-4-Scout-17B-16E-Instruct` (`text_config`) | 48 | every 4th layer NoPE and full attention (`no_rope_layers`, from `no_rope_layer_interval` 4: layers 3, 7, ..., 47), the others `ChunkedLocalAttention` over `attention_chunk_size` 8192 (vLLM's `llama4.py`: `use_chunked_local_attn = not self.nope and config.attention_chunk_size`): 36 × chunked 8192, 12 × full | 8 × 128 | 4,096 |
//!
//! # Grouping, as vLLM does
//!
//! vLLM (`vllm/v1/core/kv_cache_utils.py`,
//! `_get_kv_cache_groups_uniform_page_size`) keeps one block size in bytes
//! for every group, so that all of them share one pool: every group has the
//! same number of layers. It buckets the layers by attention spec, takes the
//! smallest bucket's size as the group size (or the largest, when the
//! largest is under 1.5 times the smallest), splits each bucket into
//! `ceil(layers / group size)` groups (layer `i` of the bucket to group
//! `i mod groups`) and pads the short ones with layers that hold nothing.
//! [`KvModel::groups`] does the same:
//!
//! - gpt-oss-120b: 18 full and 18 sliding layers: 2 groups of 18;
//! - gemma-3-27b: 10 full and 52 sliding: group size 10, one full group and
//!   six sliding groups of 9, 9, 9, 9, 8 and 8 layers (8 padding layers,
//!   vLLM's "may waste at most 15.38% KV cache memory" warning);
//! - llama-4-scout: 12 full and 36 chunked: one full group, three chunked;
//! - llama-3.1-8b: one full group of 32.
//!
//! A group's [`layers`](kvbm_sequence::KvCacheGroup::layers) are its real
//! layers; a block of any group is the group size's worth of layers
//! ([`KvModel::layers_per_group`]), padding included, so
//! `bytes per block = block_size × layers_per_group × bytes per token per
//! layer`. The groups are listed full attention first (vLLM lists them in
//! layer order; kvbm's group 0 is the one the prefix tiers and routers
//! read), which changes no count.
//!
//! `--full-attention-only` ([`KvSetup::full_attention_only`]) is vLLM's
//! `--disable-hybrid-kv-cache-manager` (`unify_hybrid_kv_cache_specs`):
//! every layer keeps every token's KV, one group of all the model's layers.

use std::fmt;

use kvbm_blocks::MAX_BLOCKS;
use kvbm_sequence::{AttentionKind, KvCacheGroup, KvCacheGroups};

use crate::SimError;

/// Layers of one attention kind in a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerCount {
    /// How they attend.
    pub kind: AttentionKind,
    /// How many layers.
    pub layers: usize,
}

impl LayerCount {
    /// `layers` layers of `kind`.
    pub const fn new(kind: AttentionKind, layers: usize) -> Self {
        Self { kind, layers }
    }
}

const fn full(layers: usize) -> LayerCount {
    LayerCount::new(AttentionKind::Full, layers)
}

const fn sliding(window: usize, layers: usize) -> LayerCount {
    LayerCount::new(AttentionKind::SlidingWindow { window }, layers)
}

const fn chunked(chunk: usize, layers: usize) -> LayerCount {
    LayerCount::new(AttentionKind::ChunkedLocal { chunk }, layers)
}

/// A model whose KV layout the simulator knows, from its published
/// `config.json` (see [the module docs](self) for the fields read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelPreset {
    /// The name `--model` takes.
    pub name: &'static str,
    /// The Hugging Face repository whose `config.json` it follows.
    pub repository: &'static str,
    /// Its layers by attention kind, in the order the kinds first appear.
    pub layers: &'static [LayerCount],
    /// `num_key_value_heads`.
    pub kv_heads: u64,
    /// `head_dim`.
    pub head_dim: u64,
    /// Bytes of one KV element (2: `bfloat16`, the models' dtype).
    pub kv_dtype_bytes: u64,
}

impl ModelPreset {
    /// Every preset, in the order `--help` lists them.
    pub const ALL: [Self; 5] = [
        Self {
            name: "gpt-oss-120b",
            repository: "openai/gpt-oss-120b",
            layers: &[sliding(128, 18), full(18)],
            kv_heads: 8,
            head_dim: 64,
            kv_dtype_bytes: 2,
        },
        Self {
            name: "gpt-oss-20b",
            repository: "openai/gpt-oss-20b",
            layers: &[sliding(128, 12), full(12)],
            kv_heads: 8,
            head_dim: 64,
            kv_dtype_bytes: 2,
        },
        Self {
            name: "gemma-3-27b",
            repository: "google/gemma-3-27b-it",
            layers: &[sliding(1024, 52), full(10)],
            kv_heads: 16,
            head_dim: 128,
            kv_dtype_bytes: 2,
        },
        Self {
            name: "llama-3.1-8b",
            repository: "meta-llama/Llama-3.1-8B-Instruct",
            layers: &[full(32)],
            kv_heads: 8,
            head_dim: 128,
            kv_dtype_bytes: 2,
        },
        Self {
            name: "llama-4-scout",
            repository: "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            layers: &[chunked(8192, 36), full(12)],
            kv_heads: 8,
            head_dim: 128,
            kv_dtype_bytes: 2,
        },
    ];

    /// The preset called `name`.
    ///
    /// # Errors
    ///
    /// [`SimError::UnknownModel`] for any other name.
    pub fn named(name: &str) -> Result<Self, SimError> {
        (Self::ALL.iter())
            .find(|preset| preset.name == name.trim())
            .copied()
            .ok_or_else(|| SimError::UnknownModel {
                name: name.to_owned(),
            })
    }

    /// KV bytes of one token in one layer:
    /// `2 × kv_heads × head_dim × kv_dtype_bytes` (a key and a value).
    pub const fn bytes_per_token_layer(&self) -> u64 {
        2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes
    }

    /// The preset as a [`KvModel`].
    pub fn model(&self) -> KvModel {
        let mut kinds = [full(0); KvModel::MAX_KINDS];
        for (slot, layers) in kinds.iter_mut().zip(self.layers) {
            *slot = *layers;
        }
        KvModel {
            name: self.name,
            kinds,
            kind_count: self.layers.len().min(KvModel::MAX_KINDS),
            bytes_per_token_layer: self.bytes_per_token_layer(),
        }
    }
}

/// A model's KV layout: its layers by attention kind and a token's KV bytes
/// in one layer (every layer alike, as vLLM's uniform-page grouping needs).
///
/// A preset ([`ModelPreset::model`], [`KvModel::preset`]) or a description
/// of layers ([`KvModel::parse_layers`], the command line's `--groups`).
/// Groups are made from the layers as vLLM makes them ([`groups`](Self::groups)).
///
/// ```
/// use kvbm_sim::KvModel;
///
/// let model = KvModel::preset("gemma-3-27b")?;
/// assert_eq!((model.total_layers(), model.bytes_per_token_layer()), (62, 8192));
/// // One full group and six sliding groups of (at most) 10 layers each.
/// let groups = model.groups(16)?;
/// assert_eq!(groups.len(), 7);
/// assert_eq!(model.layers_per_group(), 10);
/// // 16 tokens x 10 layers x 8 KiB.
/// assert_eq!(model.block_bytes(16)?, 1_310_720);
/// # Ok::<(), kvbm_sim::SimError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvModel {
    name: &'static str,
    /// The kinds, merged by kind and span; `kind_count` of them are used.
    kinds: [LayerCount; Self::MAX_KINDS],
    kind_count: usize,
    bytes_per_token_layer: u64,
}

impl KvModel {
    /// The most distinct attention kinds (kind and span) a model may have.
    pub const MAX_KINDS: usize = 8;

    /// The most layers a model may have.
    pub const MAX_LAYERS: usize = 1024;

    /// The largest window or chunk, in tokens.
    pub const MAX_SPAN: usize = 1 << 24;

    /// The most KV bytes of one token in one layer (16 MiB; real models
    /// take a few KiB).
    pub const MAX_BYTES_PER_TOKEN_LAYER: u64 = 1 << 24;

    /// The name a custom layout ([`parse_layers`](Self::parse_layers),
    /// [`custom`](Self::custom)) reports.
    pub const CUSTOM_NAME: &'static str = "custom";

    /// The preset called `name` ([`ModelPreset::named`]).
    ///
    /// # Errors
    ///
    /// [`SimError::UnknownModel`] for a name no preset has.
    pub fn preset(name: &str) -> Result<Self, SimError> {
        Ok(ModelPreset::named(name)?.model())
    }

    /// A layout of `layers` (entries of the same kind and span are
    /// merged, as vLLM buckets layers by spec) with `bytes_per_token_layer`
    /// KV bytes per token per layer.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidGroupSpec`] for no layers, a kind with no layers,
    /// a window or chunk of 0 or over [`MAX_SPAN`](Self::MAX_SPAN), more
    /// than [`MAX_KINDS`](Self::MAX_KINDS) kinds or
    /// [`MAX_LAYERS`](Self::MAX_LAYERS) layers;
    /// [`SimError::InvalidBytes`] for 0 bytes or more than
    /// [`MAX_BYTES_PER_TOKEN_LAYER`](Self::MAX_BYTES_PER_TOKEN_LAYER).
    pub fn custom(layers: &[LayerCount], bytes_per_token_layer: u64) -> Result<Self, SimError> {
        let spec = || {
            (layers.iter())
                .map(|l| describe(*l))
                .collect::<Vec<_>>()
                .join(",")
        };
        let invalid = |reason: String| SimError::InvalidGroupSpec {
            spec: spec(),
            reason,
        };
        if layers.is_empty() {
            return Err(invalid("no layers".into()));
        }
        let mut kinds = [full(0); Self::MAX_KINDS];
        let mut kind_count = 0;
        let mut total = 0usize;
        for entry in layers {
            if entry.layers == 0 {
                return Err(invalid(format!("{} has no layers", entry.kind)));
            }
            match entry.kind.span() {
                Some(0) => return Err(invalid(format!("{} spans 0 tokens", entry.kind))),
                Some(span) if span > Self::MAX_SPAN => {
                    return Err(invalid(format!(
                        "{} spans more than {} tokens",
                        entry.kind,
                        Self::MAX_SPAN
                    )));
                }
                _ => {}
            }
            total = total.saturating_add(entry.layers);
            if total > Self::MAX_LAYERS {
                return Err(invalid(format!(
                    "more than {} layers in all",
                    Self::MAX_LAYERS
                )));
            }
            match kinds[..kind_count]
                .iter_mut()
                .find(|k| k.kind == entry.kind)
            {
                Some(same) => same.layers += entry.layers,
                None if kind_count == Self::MAX_KINDS => {
                    return Err(invalid(format!(
                        "more than {} kinds of attention",
                        Self::MAX_KINDS
                    )));
                }
                None => {
                    kinds[kind_count] = *entry;
                    kind_count += 1;
                }
            }
        }
        check_bytes_per_token_layer(bytes_per_token_layer)?;
        Ok(Self {
            name: Self::CUSTOM_NAME,
            kinds,
            kind_count,
            bytes_per_token_layer,
        })
    }

    /// Parses the command line's `--groups`: comma-separated
    /// `full:LAYERS`, `sliding_window:WINDOW:LAYERS` and
    /// `chunked_local:CHUNK:LAYERS` entries (a model's layers by kind, as
    /// its `config.json` gives them; [`groups`](Self::groups) makes the
    /// groups), e.g. `sliding_window:128:18,full:18` for gpt-oss-120b's
    /// layers. `_` may separate digits.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidGroupSpec`] for a description that does not
    /// parse, and as [`custom`](Self::custom).
    pub fn parse_layers(spec: &str, bytes_per_token_layer: u64) -> Result<Self, SimError> {
        let invalid = |reason: String| SimError::InvalidGroupSpec {
            spec: spec.to_owned(),
            reason,
        };
        let mut layers = Vec::new();
        for entry in spec.split(',') {
            let entry = entry.trim();
            let fields: Vec<&str> = entry.split(':').map(str::trim).collect();
            let number = |text: &str, what: &str| {
                text.replace('_', "").parse::<usize>().map_err(|_| {
                    invalid(format!("`{entry}`: {what} `{text}` is not a whole number"))
                })
            };
            let kind = match fields.as_slice() {
                ["full", count] => LayerCount::new(AttentionKind::Full, number(count, "layers")?),
                ["sliding_window", window, count] => LayerCount::new(
                    AttentionKind::SlidingWindow {
                        window: number(window, "window")?,
                    },
                    number(count, "layers")?,
                ),
                ["chunked_local", chunk, count] => LayerCount::new(
                    AttentionKind::ChunkedLocal {
                        chunk: number(chunk, "chunk")?,
                    },
                    number(count, "layers")?,
                ),
                [""] => return Err(invalid("an empty entry".into())),
                ["full" | "sliding_window" | "chunked_local", ..] => {
                    return Err(invalid(format!(
                        "`{entry}` is not full:LAYERS, sliding_window:WINDOW:LAYERS \
                         or chunked_local:CHUNK:LAYERS"
                    )));
                }
                [other, ..] => {
                    return Err(invalid(format!(
                        "unknown attention kind `{other}` (expected full, \
                         sliding_window or chunked_local)"
                    )));
                }
                [] => return Err(invalid("an empty entry".into())),
            };
            layers.push(kind);
        }
        Self::custom(&layers, bytes_per_token_layer).map_err(|err| match err {
            SimError::InvalidGroupSpec { reason, .. } => invalid(reason),
            other => other,
        })
    }

    /// The preset's name, or [`CUSTOM_NAME`](Self::CUSTOM_NAME).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The layers by kind (kinds merged, in the order given).
    pub fn layer_counts(&self) -> &[LayerCount] {
        &self.kinds[..self.kind_count]
    }

    /// Layers over all kinds.
    pub fn total_layers(&self) -> usize {
        self.layer_counts().iter().map(|k| k.layers).sum()
    }

    /// KV bytes of one token in one layer.
    pub fn bytes_per_token_layer(&self) -> u64 {
        self.bytes_per_token_layer
    }

    /// vLLM's group size: the fewest layers of any kind, or the most when
    /// that is under 1.5 times the fewest. Every group's block holds this
    /// many layers (padding included).
    pub fn layers_per_group(&self) -> usize {
        let counts = self.layer_counts().iter().map(|k| k.layers);
        let fewest = counts.clone().min().unwrap_or(1).max(1);
        let most = counts.max().unwrap_or(1);
        // `most < 1.5 × fewest`, in integers.
        if 2 * most < 3 * fewest { most } else { fewest }
    }

    /// The model's KV cache groups over blocks of `block_size` tokens, made
    /// as vLLM makes them (see [the module docs](self)): each kind split
    /// into `ceil(layers / layers_per_group)` groups, full attention first.
    ///
    /// # Errors
    ///
    /// [`SimError::Groups`] if the groups are refused: a window or chunk
    /// that is not a multiple of the block size, more groups than
    /// [`KvCacheGroups::MAX_GROUPS`], a block size of 0.
    pub fn groups(&self, block_size: usize) -> Result<KvCacheGroups, SimError> {
        let size = self.layers_per_group();
        let mut groups = Vec::new();
        let full_first = (self.layer_counts().iter())
            .filter(|k| k.kind == AttentionKind::Full)
            .chain((self.layer_counts().iter()).filter(|k| k.kind != AttentionKind::Full));
        for kind in full_first {
            // At most `MAX_LAYERS` groups in all: `KvCacheGroups::new`
            // refuses more than it supports.
            let count = kind.layers.div_ceil(size);
            // vLLM gives layer `i` of the kind to group `i mod count`.
            for group in 0..count {
                let layers = kind.layers / count + usize::from(group < kind.layers % count);
                groups.push(KvCacheGroup::new(kind.kind, layers));
            }
        }
        Ok(KvCacheGroups::new(block_size, groups)?)
    }

    /// Bytes of one block in any group: `block_size × layers_per_group ×
    /// bytes_per_token_layer`.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidBytes`] if that overflows 64 bits.
    pub fn block_bytes(&self, block_size: usize) -> Result<u64, SimError> {
        block_bytes(
            block_size,
            self.layers_per_group(),
            self.bytes_per_token_layer,
        )
    }
}

impl fmt::Display for KvModel {
    /// `name (kind:layers, ...)`, e.g. `gpt-oss-120b (sliding_window:128 × 18, full × 18)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<String> = (self.layer_counts().iter())
            .map(|k| format!("{} × {}", k.kind, k.layers))
            .collect();
        write!(f, "{} ({})", self.name, kinds.join(", "))
    }
}

/// `kind[:span]:layers`, as `--groups` spells it.
fn describe(layers: LayerCount) -> String {
    format!("{}:{}", layers.kind, layers.layers)
}

fn check_bytes_per_token_layer(bytes: u64) -> Result<(), SimError> {
    if bytes == 0 || bytes > KvModel::MAX_BYTES_PER_TOKEN_LAYER {
        return Err(SimError::InvalidBytes {
            flag: "--kv-bytes-per-token-layer",
            text: bytes.to_string(),
            reason: "must be at least 1 and at most 16777216 (16 MiB)",
        });
    }
    Ok(())
}

fn block_bytes(block_size: usize, layers: usize, per_token_layer: u64) -> Result<u64, SimError> {
    (block_size as u64)
        .checked_mul(layers as u64)
        .and_then(|bytes| bytes.checked_mul(per_token_layer))
        .ok_or(SimError::InvalidBytes {
            flag: "--block-size",
            text: block_size.to_string(),
            reason: "makes a block of more bytes than 64 bits count",
        })
}

/// A serve replay's KV memory: the model's layout, the bytes its pool
/// holds, and whether every layer is treated as full attention.
///
/// The pool holds `floor(capacity_bytes / bytes per block)` blocks
/// ([`capacity_blocks`](Self::capacity_blocks)), every group's blocks from
/// the same pool (as in vLLM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvSetup {
    /// The model's layout.
    pub model: KvModel,
    /// KV memory in bytes.
    pub capacity_bytes: u64,
    /// Treat every layer as full attention: one group of all the model's
    /// layers, every token's KV kept (kvbm before KV cache groups, and
    /// vLLM's `--disable-hybrid-kv-cache-manager`), for comparison at the
    /// same bytes.
    pub full_attention_only: bool,
}

impl KvSetup {
    /// `model` in `capacity_bytes` of KV memory, with its own groups.
    pub fn new(model: KvModel, capacity_bytes: u64) -> Self {
        Self {
            model,
            capacity_bytes,
            full_attention_only: false,
        }
    }

    /// Sets [`full_attention_only`](Self::full_attention_only).
    pub fn with_full_attention_only(mut self, full_attention_only: bool) -> Self {
        self.full_attention_only = full_attention_only;
        self
    }

    /// Layers one block holds: the model's group size, or all its layers
    /// with [`full_attention_only`](Self::full_attention_only).
    pub fn layers_per_block(&self) -> usize {
        if self.full_attention_only {
            self.model.total_layers()
        } else {
            self.model.layers_per_group()
        }
    }

    /// The groups the scheduler runs over blocks of `block_size` tokens.
    ///
    /// # Errors
    ///
    /// As [`KvModel::groups`].
    pub fn groups(&self, block_size: usize) -> Result<KvCacheGroups, SimError> {
        if self.full_attention_only {
            return Ok(KvCacheGroups::full_attention(
                block_size,
                self.model.total_layers(),
            )?);
        }
        self.model.groups(block_size)
    }

    /// Bytes of one block: `block_size × layers_per_block × bytes per
    /// token per layer`.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidBytes`] if that overflows 64 bits.
    pub fn block_bytes(&self, block_size: usize) -> Result<u64, SimError> {
        block_bytes(
            block_size,
            self.layers_per_block(),
            self.model.bytes_per_token_layer(),
        )
    }

    /// The pool's size: `floor(capacity_bytes / block_bytes)` blocks.
    ///
    /// # Errors
    ///
    /// [`SimError::CapacityBelowBlock`] for less than one block,
    /// [`SimError::CapacityTooLarge`] for more than a pool addresses, and
    /// as [`block_bytes`](Self::block_bytes).
    pub fn capacity_blocks(&self, block_size: usize) -> Result<usize, SimError> {
        let block_bytes = self.block_bytes(block_size)?;
        let blocks = self.capacity_bytes.checked_div(block_bytes).unwrap_or(0);
        if blocks == 0 {
            return Err(SimError::CapacityBelowBlock {
                capacity_bytes: self.capacity_bytes,
                block_bytes,
            });
        }
        match usize::try_from(blocks) {
            Ok(count) if count <= MAX_BLOCKS => Ok(count),
            _ => Err(SimError::CapacityTooLarge {
                blocks,
                max: MAX_BLOCKS,
            }),
        }
    }
}

/// Parses a byte count for `flag`: a whole number, with an SI suffix
/// (`40G`: 10⁹) or in exponent notation (`40e9`, `2.5e9`), `_` allowed
/// between digits. The value must be a finite whole number of at least 1
/// byte (at most 2⁶³).
///
/// # Errors
///
/// [`SimError::InvalidBytes`] for anything else.
pub fn parse_bytes(flag: &'static str, text: &str) -> Result<u64, SimError> {
    let invalid = |reason: &'static str| SimError::InvalidBytes {
        flag,
        text: text.to_owned(),
        reason,
    };
    let value = match crate::Capacity::parse_count(text) {
        Ok(value) => value,
        Err(_) => {
            let cleaned = text.trim().replace('_', "");
            // Only plain decimal and exponent notation: no `inf`, `NaN`.
            if !cleaned
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
            {
                return Err(invalid(
                    "is not a number of bytes (such as 40000000000, 40G or 40e9)",
                ));
            }
            let float: f64 = cleaned.parse().map_err(|_| {
                invalid("is not a number of bytes (such as 40000000000, 40G or 40e9)")
            })?;
            if !float.is_finite() || float.fract() != 0.0 {
                return Err(invalid("must be a finite whole number of bytes"));
            }
            if !(0.0..=(1u64 << 63) as f64).contains(&float) {
                return Err(invalid("must be between 1 and 2^63 bytes"));
            }
            float as u64
        }
    };
    if value == 0 || value > 1 << 63 {
        return Err(invalid("must be between 1 and 2^63 bytes"));
    }
    Ok(value)
}

mod flags;

pub use flags::KvFlags;

#[cfg(test)]
mod tests;
