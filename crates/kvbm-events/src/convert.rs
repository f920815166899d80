//! [`WireFormat`]: a block pool's [`EventMessage`]s as vLLM batches.

use kvbm_blocks::{CacheEvent, EventMessage, SequenceHash};
use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::{BlockHash, BlockRemoved, BlockStored, EventError, HashForm, KvEvent, KvEventBatch};

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
        }
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

    /// The wire form of one hash value ([`SequenceHash::value`]).
    pub fn hash_value(&self, value: u128) -> BlockHash {
        BlockHash::from_value(value, self.hash_form)
    }

    /// The wire events of one message. A [`Resync`](kvbm_blocks::Resync)
    /// becomes `AllBlocksCleared`: the pool keeps no tokens, so its snapshot
    /// cannot be re-announced in a form routers can hash, and forgetting is
    /// the safe error (a missed hit, never a route to a block that is gone).
    pub fn events(&self, message: &EventMessage) -> Vec<KvEvent> {
        match message {
            EventMessage::Batch(batch) => batch.events().map(|e| self.event(e)).collect(),
            EventMessage::Resync(_) => vec![KvEvent::AllBlocksCleared],
        }
    }

    /// One event in vLLM's form.
    pub fn event(&self, event: CacheEvent<'_>) -> KvEvent {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => KvEvent::BlockStored(BlockStored {
                block_hashes: hashes.iter().map(|&h| self.hash_value(h)).collect(),
                parent_block_hash: parent.map(|parent| self.hash_value(parent)),
                token_ids: tokens.to_vec(),
                block_size: self.block_size,
                lora_id: None,
                medium: self.medium.clone(),
                lora_name: self.lora_name.clone(),
            }),
            CacheEvent::Removed { hashes } => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: hashes.iter().map(|&h| self.hash_value(h)).collect(),
                medium: self.medium.clone(),
            }),
            CacheEvent::Cleared => KvEvent::AllBlocksCleared,
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

/// [`KvEventBatch`]'s layout over borrowed events.
#[derive(Serialize)]
struct BatchView<'a>(f64, EventsView<'a>, Option<i64>);

struct EventsView<'a>(&'a WireFormat, &'a EventMessage);

impl Serialize for EventsView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Self(format, message) = *self;
        match message {
            EventMessage::Batch(batch) => {
                let mut seq = serializer.serialize_seq(Some(batch.len()))?;
                for event in batch.events() {
                    seq.serialize_element(&EventView::new(format, event))?;
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
    },
    BlockRemoved {
        block_hashes: HashesView<'a>,
        medium: Option<&'a str>,
    },
    AllBlocksCleared,
}

impl<'a> EventView<'a> {
    fn new(format: &'a WireFormat, event: CacheEvent<'a>) -> Self {
        match event {
            CacheEvent::Stored {
                parent,
                hashes,
                tokens,
            } => EventView::BlockStored {
                block_hashes: HashesView(format.hash_form, hashes),
                parent_block_hash: parent.map(|parent| format.hash_value(parent)),
                token_ids: tokens,
                block_size: format.block_size,
                lora_id: None,
                medium: format.medium.as_deref(),
                lora_name: format.lora_name.as_deref(),
            },
            CacheEvent::Removed { hashes } => EventView::BlockRemoved {
                block_hashes: HashesView(format.hash_form, hashes),
                medium: format.medium.as_deref(),
            },
            CacheEvent::Cleared => EventView::AllBlocksCleared,
        }
    }
}

/// Hashes in their wire form, converted as they are written.
struct HashesView<'a>(HashForm, &'a [u128]);

impl Serialize for HashesView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.1.len()))?;
        for hash in self.1 {
            match self.0 {
                HashForm::Int64 => seq.serialize_element(&(*hash as u64))?,
                HashForm::Bytes => {
                    seq.serialize_element(serde_bytes::Bytes::new(&hash.to_be_bytes()))?;
                }
            }
        }
        seq.end()
    }
}
