//! Which KV cache group of a worker's model the router scores prefixes on.
//!
//! vLLM 0.33 sends every group's block of one prefix under the same hash,
//! told apart by `group_idx`, so the index can follow one group only: a
//! full-attention one, whose blocks cover the whole prefix (a sliding
//! window's are released, and evicted, early). Stores name their group's
//! kind (`kv_cache_spec_kind`); removals only its index, so the group is
//! learned from the first store that names a full-attention kind (or, with
//! no kind said, group 0), and from then on only its events count. vLLM
//! numbers groups by the layers' order (gpt-oss's group 0 is its sliding
//! window), kvbm puts full attention first.

use kvbm_events::{KvEvent, WireFormat, WireGroup};
use kvbm_sequence::group_of;

/// Whether a group of `kind` (`None`: not said) at index `group` covers
/// whole prefixes.
fn is_full(kind: Option<&str>, group: i64) -> bool {
    match kind {
        Some(kind) => WireGroup::is_full_kind(kind),
        None => group == 0,
    }
}

/// Whether `event` counts for a worker scoring on `scored` (learned here
/// from a store if still `None`): events of no group always do.
pub(super) fn counts(event: &KvEvent, scored: &mut Option<i64>) -> bool {
    match event {
        KvEvent::BlockStored(stored) => match stored.group_idx {
            None => true,
            Some(group) => match *scored {
                Some(scored) => group == scored,
                None if is_full(stored.kv_cache_spec_kind.as_deref(), group) => {
                    *scored = Some(group);
                    true
                }
                None => false,
            },
        },
        // A removal of a group not learned yet names nothing indexed.
        KvEvent::BlockRemoved(removed) => removed.group_idx.is_none_or(|g| Some(g) == *scored),
        _ => true,
    }
}

/// The group a pool's messages in `format` are scored on: its first
/// full-attention group (group 0 if it names none); `None` for a format of
/// one group, whose blocks all count.
pub(super) fn scored_in(format: &WireFormat) -> Option<usize> {
    let groups = format.kv_groups()?;
    let full = (groups.iter()).position(|g| WireGroup::is_full_kind(&g.kind));
    Some(full.unwrap_or(0))
}

/// Whether a block of chained value `value` counts under `scored`
/// ([`scored_in`]).
pub(super) fn value_counts(value: u128, scored: Option<usize>) -> bool {
    scored.is_none_or(|scored| group_of(value) == scored)
}

#[cfg(test)]
mod tests {
    use kvbm_events::{BlockHash, BlockRemoved, BlockStored};

    use super::*;

    fn stored(group: i64, kind: &str) -> KvEvent {
        KvEvent::BlockStored(
            BlockStored::new(vec![BlockHash::Int(1)], None, vec![0; 4], 4)
                .with_group(group, &WireGroup::new(kind, None)),
        )
    }

    fn removed(group: i64) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(1)]).with_group(group))
    }

    #[test]
    fn the_first_full_group_stored_is_the_one_scored_as_vllm_numbers_gpt_oss() {
        // vLLM's gpt-oss: group 0 slides, group 1 is full.
        let mut scored = None;
        assert!(!counts(&removed(1), &mut scored), "nothing learned yet");
        assert!(!counts(&stored(0, "sliding_window"), &mut scored));
        assert!(counts(&stored(1, "full_attention"), &mut scored));
        assert_eq!(scored, Some(1));
        assert!(counts(&removed(1), &mut scored));
        assert!(!counts(&removed(0), &mut scored));
        assert!(
            !counts(&stored(2, "full_attention"), &mut scored),
            "one group"
        );
        // Events of no group always count.
        let plain = KvEvent::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(1)]));
        assert!(counts(&plain, &mut scored));
    }
}
