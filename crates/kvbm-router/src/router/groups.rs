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

/// What one event does for a worker scoring on `scored`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Left out: another group's, or a group's not learned yet.
    Skip,
    /// Counts.
    Count,
    /// A store of the first full-attention group: counts, and makes its
    /// group the scored one once the store is taken (a store refused for
    /// its block size or medium teaches nothing, as it changes nothing).
    Learn(i64),
}

/// What `event` does for a worker scoring on `scored` (`None`: not
/// learned yet); events of no group always count.
pub(super) fn verdict(event: &KvEvent, scored: Option<i64>) -> Verdict {
    let counts = |yes: bool| if yes { Verdict::Count } else { Verdict::Skip };
    match event {
        KvEvent::BlockStored(stored) => match (stored.group_idx, scored) {
            (None, _) => Verdict::Count,
            (Some(group), Some(scored)) => counts(group == scored),
            (Some(group), None) if is_full(stored.kv_cache_spec_kind.as_deref(), group) => {
                Verdict::Learn(group)
            }
            (Some(_), None) => Verdict::Skip,
        },
        // A removal of a group not learned yet names nothing indexed.
        KvEvent::BlockRemoved(removed) => {
            counts(removed.group_idx.is_none_or(|g| Some(g) == scored))
        }
        _ => Verdict::Count,
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
        use Verdict::{Count, Learn, Skip};
        // vLLM's gpt-oss: group 0 slides, group 1 is full.
        assert_eq!(verdict(&removed(1), None), Skip, "nothing learned yet");
        assert_eq!(verdict(&stored(0, "sliding_window"), None), Skip);
        assert_eq!(verdict(&stored(1, "full_attention"), None), Learn(1));
        let scored = Some(1);
        assert_eq!(verdict(&stored(1, "full_attention"), scored), Count);
        assert_eq!(verdict(&removed(1), scored), Count);
        assert_eq!(verdict(&removed(0), scored), Skip);
        assert_eq!(
            verdict(&stored(2, "full_attention"), scored),
            Skip,
            "one group"
        );
        // Events of no group always count.
        let plain = KvEvent::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(1)]));
        assert_eq!(verdict(&plain, scored), Count);
        // No kind said: group 0 is taken for the full one.
        let mut unnamed = BlockStored::new(vec![BlockHash::Int(1)], None, vec![0; 4], 4);
        unnamed.group_idx = Some(0);
        assert_eq!(verdict(&KvEvent::BlockStored(unnamed), None), Learn(0));
    }
}
