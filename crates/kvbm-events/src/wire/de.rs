//! [`KvEvent`]'s `Deserialize`: one pass over the event map, each field
//! straight into its type.
//!
//! serde's derive for an internally tagged enum (`#[serde(tag = "type")]`)
//! cannot know the variant before it has read the tag, so it buffers the
//! whole map as generic `Content` values first: ~40x a `BlockStored`'s size
//! in heap, mostly its tokens. Here each field any event has goes into its
//! typed slot as its key comes (msgspec writes the tag first, but nothing
//! depends on it), other fields are skipped in place with [`IgnoredAny`],
//! and the tag picks the variant at the end. A field known to one event
//! must have its type in every event (it is read before the tag may be
//! known) and may appear once; then the variant takes the fields it has.
//! The two long fields, `token_ids` and `block_hashes`, go into vectors
//! sized to their arrays ([`ExactVec`]).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::{BlockHash, BlockRemoved, BlockStored, KvEvent};

/// The event types, by vLLM's class names.
const VARIANTS: &[&str] = &["BlockStored", "BlockRemoved", "AllBlocksCleared"];

/// The value under `"type"`.
#[derive(Clone, Copy)]
enum Tag {
    BlockStored,
    BlockRemoved,
    AllBlocksCleared,
}

impl<'de> Deserialize<'de> for Tag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TagVisitor;

        impl Visitor<'_> for TagVisitor {
            type Value = Tag;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event type name")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Tag, E> {
                self.visit_bytes(name.as_bytes())
            }

            fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<Tag, E> {
                match name {
                    b"BlockStored" => Ok(Tag::BlockStored),
                    b"BlockRemoved" => Ok(Tag::BlockRemoved),
                    b"AllBlocksCleared" => Ok(Tag::AllBlocksCleared),
                    other => Err(E::unknown_variant(
                        &String::from_utf8_lossy(other),
                        VARIANTS,
                    )),
                }
            }
        }

        deserializer.deserialize_identifier(TagVisitor)
    }
}

/// A key of the event map: a field some event has, or another.
enum Key {
    Type,
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    GroupIdx,
    KvCacheSpecKind,
    KvCacheSpecSlidingWindow,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
                self.visit_bytes(name.as_bytes())
            }

            fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<Key, E> {
                Ok(match name {
                    b"type" => Key::Type,
                    b"block_hashes" => Key::BlockHashes,
                    b"parent_block_hash" => Key::ParentBlockHash,
                    b"token_ids" => Key::TokenIds,
                    b"block_size" => Key::BlockSize,
                    b"lora_id" => Key::LoraId,
                    b"medium" => Key::Medium,
                    b"lora_name" => Key::LoraName,
                    b"group_idx" => Key::GroupIdx,
                    b"kv_cache_spec_kind" => Key::KvCacheSpecKind,
                    b"kv_cache_spec_sliding_window" => Key::KvCacheSpecSlidingWindow,
                    _ => Key::Other,
                })
            }
        }

        deserializer.deserialize_identifier(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for KvEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

struct EventVisitor;

/// `slot` (field `name`), filled from the map's next value unless it
/// already was.
fn fill<'de, A, T>(map: &mut A, name: &'static str, slot: &mut Option<T>) -> Result<(), A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// A field without which the event is not one.
fn required<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

impl<'de> Visitor<'de> for EventVisitor {
    type Value = KvEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a KV event map tagged under \"type\"")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KvEvent, A::Error> {
        let mut tag: Option<Tag> = None;
        let mut block_hashes: Option<ExactVec<BlockHash>> = None;
        let mut parent_block_hash: Option<Option<BlockHash>> = None;
        let mut token_ids: Option<ExactVec<u32>> = None;
        let mut block_size: Option<u32> = None;
        let mut lora_id: Option<Option<i64>> = None;
        let mut medium: Option<Option<String>> = None;
        let mut lora_name: Option<Option<String>> = None;
        let mut group_idx: Option<Option<i64>> = None;
        let mut spec_kind: Option<Option<String>> = None;
        let mut sliding_window: Option<Option<i64>> = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Type => fill(&mut map, "type", &mut tag)?,
                Key::BlockHashes => fill(&mut map, "block_hashes", &mut block_hashes)?,
                Key::ParentBlockHash => {
                    fill(&mut map, "parent_block_hash", &mut parent_block_hash)?
                }
                Key::TokenIds => fill(&mut map, "token_ids", &mut token_ids)?,
                Key::BlockSize => fill(&mut map, "block_size", &mut block_size)?,
                Key::LoraId => fill(&mut map, "lora_id", &mut lora_id)?,
                Key::Medium => fill(&mut map, "medium", &mut medium)?,
                Key::LoraName => fill(&mut map, "lora_name", &mut lora_name)?,
                Key::GroupIdx => fill(&mut map, "group_idx", &mut group_idx)?,
                Key::KvCacheSpecKind => fill(&mut map, "kv_cache_spec_kind", &mut spec_kind)?,
                Key::KvCacheSpecSlidingWindow => fill(
                    &mut map,
                    "kv_cache_spec_sliding_window",
                    &mut sliding_window,
                )?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        // Optional fields left out read as nil, as serde's derive reads a
        // missing `Option`.
        Ok(match required(tag, "type")? {
            Tag::BlockStored => KvEvent::BlockStored(BlockStored {
                block_hashes: required(block_hashes, "block_hashes")?.0,
                parent_block_hash: parent_block_hash.flatten(),
                token_ids: required(token_ids, "token_ids")?.0,
                block_size: required(block_size, "block_size")?,
                lora_id: lora_id.flatten(),
                medium: medium.flatten(),
                lora_name: lora_name.flatten(),
                group_idx: group_idx.flatten(),
                kv_cache_spec_kind: spec_kind.flatten(),
                kv_cache_spec_sliding_window: sliding_window.flatten(),
            }),
            Tag::BlockRemoved => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: required(block_hashes, "block_hashes")?.0,
                medium: medium.flatten(),
                group_idx: group_idx.flatten(),
            }),
            Tag::AllBlocksCleared => KvEvent::AllBlocksCleared,
        })
    }
}

/// A `Vec` read from an array, with room for the array's declared length
/// and no more. serde's own `Vec` preallocates at most 1 MiB and then
/// doubles, so it may end with twice the room its elements need (8 bytes
/// per 1-byte token). Here the declared length is trusted only as far as
/// elements come: the room at most doubles at each step, as with `Vec`, but
/// never past the declared length, so an honest array ends exactly full
/// and a lying one gets no more room than the elements it did send (past
/// the 1 MiB any declared length may preallocate).
struct ExactVec<T>(Vec<T>);

/// The most a declared length preallocates before its elements come (serde's
/// cap too).
const PREALLOCATE_BYTES: usize = 1 << 20;

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ExactVec<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(ExactVecVisitor(PhantomData))
    }
}

struct ExactVecVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ExactVecVisitor<T> {
    type Value = ExactVec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ExactVec<T>, A::Error> {
        let declared = seq.size_hint().unwrap_or(0);
        let mut items = Vec::with_capacity(declared.min(PREALLOCATE_BYTES / size_of::<T>().max(1)));
        while let Some(item) = seq.next_element()? {
            if items.len() == items.capacity() {
                let double = items.len().max(8);
                let left = declared.saturating_sub(items.len());
                items.reserve_exact(if left > 0 { left.min(double) } else { double });
            }
            items.push(item);
        }
        Ok(ExactVec(items))
    }
}
