//! [`WireFormat`]: a block pool's [`EventMessage`]s as vLLM batches.

use kvbm_blocks::{CacheEvent, EventMessage, SequenceHash};
use kvbm_sequence::{group_of, without_group};
use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::{
    BlockHash, BlockRemoved, BlockStored, EventError, HashForm, KvEvent, KvEventBatch, WireGroup,
};

/// How one engine's cache events are written on vLLM's wire: its block
/// size, how hashes are sent, the medium, LoRA and data-parallel rank.
///
/// ```
/// use kvbm_blocks::{BlockManager, SequenceHash};
/// use kvbm_events::{HashForm, KvEvent, WireFormat};
/// # struct Gpu;
///
/// let manager = BlockManager::<Gpu>::builder().block_count(4).block_size(2).build()?;
/// let events = manager.subscribe_events(16);
/// let format = WireFormat::new(2).with_hash_form(HashForm::Int64);
///
/// let hash = SequenceHash::root(7);
/// let block = manager.allocate_blocks(1)?.pop().unwrap().stage(hash, 2)?;
/// let _held = manager.register_blocks_with_tokens(vec![block], &[10, 11])?;
/// manager.flush_events();
///
/// let wire: Vec<KvEvent> = events.drain().iter().flat_map(|m| format.events(m)).collect();
/// // The subscription's first message (a resync of the empty pool) clears;
/// // then the stored block, with its tokens.
/// assert_eq!(wire[0], KvEvent::AllBlocksCleared);
/// let KvEvent::BlockStored(stored) = &wire[1] else { panic!() };
/// assert_eq!(stored.token_ids, [10, 11]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct WireFormat {
    block_size: u32,
    hash_form: HashForm,
    medium: Option<String>,
    lora_name: Option<String>,
    data_parallel_rank: Option<i64>,
    /// A model's KV cache groups, by index (`None`: one group, no group
    /// fields written).
    groups: Option<Vec<WireGroup>>,
}

impl WireFormat {
    /// Blocks of `block_size` tokens on the GPU, hashes as bytes, no LoRA,
    /// data-parallel rank 0: vLLM's publisher stamps every batch with its
    /// engine's rank (`batch.data_parallel_rank = self._dp_rank`, 0 without
    /// data parallelism), so batches from here carry one too.
    pub fn new(block_size: u32) -> Self {
        Self {
            block_size,
            hash_form: HashForm::default(),
            medium: Some("GPU".to_owned()),
            lora_name: None,
            data_parallel_rank: Some(0),
            groups: None,
        }
    }

    /// An engine whose model's layers form KV cache groups, described by
    /// index (kvbm-sequence's `Salt::for_group` keeps a block's group in
    /// its hash: [`group_of`]): every event says
    /// its group, as vLLM 0.33's do, with the group taken off the block
    /// hashes (a block of one prefix hashes alike in every group, as in
    /// vLLM); a `BlockStored` also says the group's kind and window
    /// ([`WireGroup`]), and a removal of blocks of several groups is one
    /// `BlockRemoved` per group.
    ///
    /// ```
    /// use kvbm_events::{KvEvent, WireFormat, WireGroup};
    /// use kvbm_sequence::{AttentionKind, BlockSequence, Salt};
    ///
    /// let groups = [AttentionKind::Full, AttentionKind::SlidingWindow { window: 128 }];
    /// let format = WireFormat::new(4)
    ///     .with_kv_groups(groups.iter().map(|&kind| WireGroup::from_attention(kind)).collect());
    /// let tokens: Vec<u32> = (0..4).collect();
    /// let window = BlockSequence::with_salt(tokens.clone(), 4, Salt::NONE.for_group(1))?;
    /// let full = BlockSequence::with_salt(tokens.clone(), 4, Salt::NONE.for_group(0))?;
    /// let stored = kvbm_blocks::CacheEvent::Stored {
    ///     parent: None,
    ///     hashes: &[window.sequence_hashes()[0].value()],
    ///     tokens: &tokens,
    /// };
    /// let wire = format.events_of(stored);
    /// let KvEvent::BlockStored(event) = &wire[0] else { panic!() };
    /// assert_eq!(event.group_idx, Some(1));
    /// assert_eq!(event.kv_cache_spec_sliding_window, Some(128));
    /// // The hash is group 0's.
    /// assert_eq!(event.block_hashes[0], format.hash(full.sequence_hashes()[0]));
    /// # Ok::<(), kvbm_sequence::SequenceError>(())
    /// ```
    pub fn with_kv_groups(mut self, groups: Vec<WireGroup>) -> Self {
        self.groups = Some(groups);
        self
    }

    /// The KV cache groups events name ([`with_kv_groups`](Self::with_kv_groups)).
    pub fn kv_groups(&self) -> Option<&[WireGroup]> {
        self.groups.as_deref()
    }

    /// How hashes are written (bytes by default).
    pub fn with_hash_form(mut self, form: HashForm) -> Self {
        self.hash_form = form;
        self
    }

    /// The medium named in every event (`"GPU"` by default).
    pub fn with_medium(mut self, medium: Option<String>) -> Self {
        self.medium = medium;
        self
    }

    /// The LoRA adapter the engine's blocks belong to.
    pub fn with_lora_name(mut self, lora_name: Option<String>) -> Self {
        self.lora_name = lora_name;
        self
    }

    /// The data-parallel rank written into every batch (0 by default);
    /// `None` writes nil, which vLLM's publisher never sends.
    pub fn with_rank(mut self, rank: Option<i64>) -> Self {
        self.data_parallel_rank = rank;
        self
    }

    /// Tokens per block, as every `BlockStored` says.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The medium every event names (`"GPU"` by default).
    pub fn medium(&self) -> Option<&str> {
        self.medium.as_deref()
    }

    /// The wire form of one hash.
    pub fn hash(&self, hash: SequenceHash) -> BlockHash {
        self.hash_value(hash.value())
    }

    /// The wire form of one hash value ([`SequenceHash::value`]); with KV
    /// cache groups, without the group.
    pub fn hash_value(&self, value: u128) -> BlockHash {
        BlockHash::from_value(self.wire_value(value), self.hash_form)
    }

    /// The value a hash is written from: with KV cache groups, the group
    /// taken off.
    fn wire_value(&self, value: u128) -> u128 {
        match self.groups {
            Some(_) => without_group(value),
            None => value,
        }
    }

    /// The group index and description an event of blocks of `value`'s
    /// group says (`None` without KV cache groups).
    fn group(&self, value: u128) -> Option<(i64, Option<&WireGroup>)> {
        let groups = self.groups.as_ref()?;
        let index = group_of(value);
        Some((index as i64, groups.get(index)))
    }

    /// What a store of `hashes` (after `parent`) says of its group:
    /// `group_idx`, `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`.
    fn stored_group(
        &self,
        parent: Option<u128>,
        hashes: &[u128],
    ) -> (Option<i64>, Option<&str>, Option<i64>) {
        let first = hashes.first().copied().or(parent).unwrap_or(0);
        match self.group(first) {
            None => (None, None, None),
            Some((index, group)) => (
                Some(index),
                group.map(|g| g.kind.as_str()),
                group.and_then(|g| g.sliding_window),
            ),
        }
    }

    /// The `group_idx` of a removal of `hashes`, blocks of one group.
    fn removed_group(&self, hashes: &[u128]) -> Option<i64> {
        (hashes.first())
            .and_then(|&h| self.group(h))
            .map(|(index, _)| index)
    }

    /// The runs of `hashes` of one group each (one run of all without KV
    /// cache groups, at no cost): a removal's events.
    fn group_runs<'h>(&self, hashes: &'h [u128]) -> GroupRuns<'h> {
        GroupRuns {
            rest: Some(hashes),
            grouped: self.groups.is_some(),
        }
    }

    /// The wire events of one message. A [`Resync`](kvbm_blocks::Resync)
    /// becomes `AllBlocksCleared`: the pool keeps no tokens, so its snapshot
    /// cannot be re-announced in a form routers can hash, and forgetting is
    /// the safe error (a missed hit, never a route to a block that is gone).
    pub fn events(&self, message: &EventMessage) -> Vec<KvEvent> {
        match message {
            EventMessage::Batch(batch) => {
                let mut out = Vec::with_capacity(batch.len());
                for event in batch.events() {
                    self.push_events(event, &mut out);
                }
                out
            }
            EventMessage::Resync(_) => vec![KvEvent::AllBlocksCleared],
        }
    }

    /// One event in vLLM's form: one `KvEvent`, or with KV cache groups one
    /// per group a removal's blocks span.
    pub fn events_of(&self, event: CacheEvent<'_>) -> Vec<KvEvent> {
        let mut out = Vec::with_capacity(1);
        self.push_events(event, &mut out);
        out
    }

    /// [`events_of`](Self::events_of), appended to `out`.
    pub fn push_events(&self, event: CacheEvent<'_>, out: &mut Vec<KvEvent>) {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => {
                let (group_idx, kind, sliding_window) = self.stored_group(parent, hashes);
                out.push(KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes.iter().map(|&h| self.hash_value(h)).collect(),
                    parent_block_hash: parent.map(|parent| self.hash_value(parent)),
                    token_ids: tokens.to_vec(),
                    block_size: self.block_size,
                    lora_id: None,
                    medium: self.medium.clone(),
                    lora_name: self.lora_name.clone(),
                    group_idx,
                    kv_cache_spec_kind: kind.map(str::to_owned),
                    kv_cache_spec_sliding_window: sliding_window,
                }));
            }
            CacheEvent::Removed { hashes } => {
                for run in self.group_runs(hashes) {
                    out.push(KvEvent::BlockRemoved(BlockRemoved {
                        block_hashes: run.iter().map(|&h| self.hash_value(h)).collect(),
                        medium: self.medium.clone(),
                        group_idx: self.removed_group(run),
                    }));
                }
            }
            CacheEvent::Cleared => out.push(KvEvent::AllBlocksCleared),
        }
    }

    /// One message as a batch stamped `ts` (seconds since the epoch, as
    /// vLLM stamps them).
    pub fn batch(&self, message: &EventMessage, ts: f64) -> KvEventBatch {
        KvEventBatch(ts, self.events(message), self.data_parallel_rank)
    }

    /// The msgpack payload of [`batch`](Self::batch)`(message, ts)`, byte
    /// for byte what [`encode`](crate::encode) makes of it, written straight
    /// from the message without building the batch (no copy of its tokens):
    /// what a publisher on an engine's hot path wants.
    ///
    /// # Errors
    ///
    /// [`EventError::Encode`] if msgpack cannot hold a value (unreachable).
    pub fn encode(&self, message: &EventMessage, ts: f64) -> Result<Vec<u8>, EventError> {
        let (blocks, tokens) = match message {
            EventMessage::Batch(batch) => (batch.events()).fold((0, 0), |(b, t), e| match e {
                CacheEvent::Stored { hashes, tokens, .. } => (b + hashes.len(), t + tokens.len()),
                CacheEvent::Removed { hashes } => (b + hashes.len(), t),
                CacheEvent::Cleared => (b, t),
            }),
            EventMessage::Resync(_) => (0, 0),
        };
        // Tokens take up to 5 bytes, hashes up to 19; most take fewer.
        let mut out = Vec::with_capacity(64 + 3 * tokens + 12 * blocks);
        let view = BatchView(ts, EventsView(self, message), self.data_parallel_rank);
        view.serialize(&mut rmp_serde::Serializer::new(&mut out).with_struct_map())?;
        Ok(out)
    }
}

/// [`WireFormat::group_runs`]: the rest of a removal's hashes, cut where
/// the group changes; without groups, all of them at once (an empty
/// removal too, as before groups).
struct GroupRuns<'h> {
    rest: Option<&'h [u128]>,
    grouped: bool,
}

impl<'h> Iterator for GroupRuns<'h> {
    type Item = &'h [u128];

    fn next(&mut self) -> Option<&'h [u128]> {
        let rest = self.rest.take()?;
        if !self.grouped {
            return Some(rest);
        }
        let first = *rest.first()?;
        let end = (rest.iter())
            .position(|&h| group_of(h) != group_of(first))
            .unwrap_or(rest.len());
        let (run, after) = rest.split_at(end);
        self.rest = Some(after);
        Some(run)
    }
}

/// [`KvEventBatch`]'s layout over borrowed events.
#[derive(Serialize)]
struct BatchView<'a>(f64, EventsView<'a>, Option<i64>);

struct EventsView<'a>(&'a WireFormat, &'a EventMessage);

impl Serialize for EventsView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Self(format, message) = *self;
        match message {
            EventMessage::Batch(batch) => {
                let count = (batch.events())
                    .map(|event| match event {
                        CacheEvent::Removed { hashes } => format.group_runs(hashes).count(),
                        CacheEvent::Stored { .. } | CacheEvent::Cleared => 1,
                    })
                    .sum();
                let mut seq = serializer.serialize_seq(Some(count))?;
                for event in batch.events() {
                    match event {
                        CacheEvent::Removed { hashes } => {
                            for run in format.group_runs(hashes) {
                                seq.serialize_element(&EventView::removed(format, run))?;
                            }
                        }
                        CacheEvent::Stored { .. } | CacheEvent::Cleared => {
                            seq.serialize_element(&EventView::new(format, event))?;
                        }
                    }
                }
                seq.end()
            }
            EventMessage::Resync(_) => {
                let mut seq = serializer.serialize_seq(Some(1))?;
                seq.serialize_element(&EventView::AllBlocksCleared)?;
                seq.end()
            }
        }
    }
}

/// [`KvEvent`] over borrowed fields: the same tag, names and order.
#[derive(Serialize)]
#[serde(tag = "type")]
enum EventView<'a> {
    BlockStored {
        block_hashes: HashesView<'a>,
        parent_block_hash: Option<BlockHash>,
        token_ids: &'a [u32],
        block_size: u32,
        lora_id: Option<i64>,
        medium: Option<&'a str>,
        lora_name: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        group_idx: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kv_cache_spec_kind: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        kv_cache_spec_sliding_window: Option<i64>,
    },
    BlockRemoved {
        block_hashes: HashesView<'a>,
        medium: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        group_idx: Option<i64>,
    },
    AllBlocksCleared,
}

impl<'a> EventView<'a> {
    /// A stored run or a clear (a removal is [`removed`](Self::removed),
    /// one group's run at a time).
    fn new(format: &'a WireFormat, event: CacheEvent<'a>) -> Self {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => {
                let (group_idx, kind, sliding_window) = format.stored_group(parent, hashes);
                EventView::BlockStored {
                    block_hashes: HashesView(format, hashes),
                    parent_block_hash: parent.map(|parent| format.hash_value(parent)),
                    token_ids: tokens,
                    block_size: format.block_size,
                    lora_id: None,
                    medium: format.medium.as_deref(),
                    lora_name: format.lora_name.as_deref(),
                    group_idx,
                    kv_cache_spec_kind: kind,
                    kv_cache_spec_sliding_window: sliding_window,
                }
            }
            CacheEvent::Removed { hashes } => Self::removed(format, hashes),
            CacheEvent::Cleared => EventView::AllBlocksCleared,
        }
    }

    /// The removal of `hashes`, blocks of one group.
    fn removed(format: &'a WireFormat, hashes: &'a [u128]) -> Self {
        EventView::BlockRemoved {
            block_hashes: HashesView(format, hashes),
            medium: format.medium.as_deref(),
            group_idx: format.removed_group(hashes),
        }
    }
}

/// Hashes in their wire form, converted as they are written.
struct HashesView<'a>(&'a WireFormat, &'a [u128]);

impl Serialize for HashesView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.1.len()))?;
        for &hash in self.1 {
            let hash = self.0.wire_value(hash);
            match self.0.hash_form {
                HashForm::Int64 => seq.serialize_element(&(hash as u64))?,
                HashForm::Bytes => {
                    seq.serialize_element(serde_bytes::Bytes::new(&hash.to_be_bytes()))?;
                }
            }
        }
        seq.end()
    }
}
