//! The group rules against a brute-force reference: a hit of `h` blocks is
//! servable by a group iff every block of its `needed_for_hit(h)` is cached,
//! and for every `computed` the released blocks are exactly those no later
//! token reads.

use proptest::prelude::*;

use super::*;

/// Whether a token at `position` reads the KV of token `source` (`source <=
/// position`) under `kind`: the reference every rule is checked against.
fn reads(kind: AttentionKind, position: usize, source: usize) -> bool {
    match kind {
        AttentionKind::Full => true,
        AttentionKind::SlidingWindow { window } => position - source < window,
        AttentionKind::ChunkedLocal { chunk } => source / chunk == position / chunk,
    }
}

fn servable(kind: AttentionKind, hit: usize, cached: &[bool], block_size: usize) -> bool {
    kind.needed_for_hit(hit, block_size)
        .all(|i| cached.get(i).copied().unwrap_or(false))
}

/// Any kind, spans of any length: the rules hold for spans that are not
/// block multiples too (only `KvCacheGroups` insists on multiples).
fn kind_strategy() -> impl Strategy<Value = AttentionKind> {
    prop_oneof![
        Just(AttentionKind::Full),
        (1..30usize).prop_map(|window| AttentionKind::SlidingWindow { window }),
        (1..30usize).prop_map(|chunk| AttentionKind::ChunkedLocal { chunk }),
    ]
}

proptest! {
    /// A block before `first_needed_block(computed)` is read by no token at
    /// or after `computed`; the block at it is read by the next token.
    #[test]
    fn released_blocks_are_never_read_again(
        block_size in 1..6usize,
        kind_seed in 0..3u8,
        span_blocks in 1..6usize,
        computed in 0..80usize,
    ) {
        let span = span_blocks * block_size;
        let kind = match kind_seed {
            0 => AttentionKind::Full,
            1 => AttentionKind::SlidingWindow { window: span },
            _ => AttentionKind::ChunkedLocal { chunk: span },
        };
        let first = kind.first_needed_block(computed, block_size);
        // Every token of a released block is unread by every later token
        // (reading only shrinks as the position grows, so checking a window
        // of positions past `computed` suffices).
        for source in 0..first * block_size {
            for position in computed..computed + 3 * span {
                prop_assert!(!reads(kind, position, source), "{kind} {computed}: {source} read by {position}");
            }
        }
        // The first kept block holds a token the next token reads.
        if computed > 0 && first * block_size < computed {
            let read = (first * block_size..(first + 1) * block_size)
                .any(|source| source <= computed && reads(kind, computed, source));
            prop_assert!(read, "{kind} {computed}: block {first} kept but unread");
        }
    }

    /// `longest_hit` is the largest servable hit up to `cap`.
    #[test]
    fn longest_hit_is_the_largest_servable(
        block_size in 1..5usize,
        kind in kind_strategy(),
        cached in prop::collection::vec(prop::bool::weighted(0.8), 0..40),
        cap in 0..45usize,
    ) {
        let expected = (0..=cap).rev().find(|&h| servable(kind, h, &cached, block_size)).unwrap_or(0);
        prop_assert_eq!(kind.longest_hit(cap, &cached, block_size), expected);
    }

    /// The common hit is the largest hit every group serves.
    #[test]
    fn common_hit_is_the_largest_every_group_serves(
        block_size in 1..5usize,
        spans in prop::collection::vec((0..3u8, 1..5usize, 1..4usize), 1..4),
        cached in prop::collection::vec(prop::collection::vec(prop::bool::weighted(0.85), 0..30), 4),
        cap in 0..32usize,
    ) {
        let groups: Vec<KvCacheGroup> = spans.iter().map(|&(kind, span, layers)| {
            let span = span * block_size;
            let kind = match kind {
                0 => AttentionKind::Full,
                1 => AttentionKind::SlidingWindow { window: span },
                _ => AttentionKind::ChunkedLocal { chunk: span },
            };
            KvCacheGroup::new(kind, layers)
        }).collect();
        let groups = KvCacheGroups::new(block_size, groups).unwrap();
        let views: Vec<&[bool]> = cached.iter().map(Vec::as_slice).collect();
        let expected = (0..=cap).rev().find(|&h| {
            groups.groups().iter().zip(&views).all(|(g, c)| servable(g.kind(), h, c, block_size))
        }).unwrap_or(0);
        prop_assert_eq!(groups.longest_common_hit(cap, &views), expected);
    }
}

#[test]
fn bad_descriptions_are_refused() {
    let full = KvCacheGroup::new(AttentionKind::Full, 4);
    let window = |w| KvCacheGroup::new(AttentionKind::SlidingWindow { window: w }, 4);
    let chunk = |c| KvCacheGroup::new(AttentionKind::ChunkedLocal { chunk: c }, 4);
    assert_eq!(KvCacheGroups::new(16, vec![]), Err(GroupError::NoGroups));
    assert_eq!(
        KvCacheGroups::new(0, vec![full]),
        Err(GroupError::ZeroBlockSize)
    );
    assert_eq!(
        KvCacheGroups::new(16, vec![full, KvCacheGroup::new(AttentionKind::Full, 0)]),
        Err(GroupError::NoLayers { group: 1 })
    );
    assert!(matches!(
        KvCacheGroups::new(16, vec![full, window(0)]),
        Err(GroupError::ZeroSpan { group: 1, .. })
    ));
    assert!(matches!(
        KvCacheGroups::new(16, vec![chunk(0)]),
        Err(GroupError::ZeroSpan { group: 0, .. })
    ));
    assert!(matches!(
        KvCacheGroups::new(16, vec![full, window(100)]),
        Err(GroupError::SpanNotBlockMultiple {
            group: 1,
            block_size: 16,
            ..
        })
    ));
    assert!(matches!(
        KvCacheGroups::new(16, vec![chunk(24)]),
        Err(GroupError::SpanNotBlockMultiple { group: 0, .. })
    ));
    assert!(matches!(
        KvCacheGroups::new(16, vec![full; KvCacheGroups::MAX_GROUPS + 1]),
        Err(GroupError::TooManyGroups { .. })
    ));
    let ok = KvCacheGroups::new(16, vec![full, window(128), chunk(8192)]).unwrap();
    assert_eq!(
        (ok.len(), ok.total_layers(), ok.is_full_attention_only()),
        (3, 12, false)
    );
    assert!(
        KvCacheGroups::full_attention(16, 32)
            .unwrap()
            .is_full_attention_only()
    );
}

#[test]
fn huge_positions_do_not_overflow() {
    for kind in [
        AttentionKind::Full,
        AttentionKind::SlidingWindow { window: 128 },
        AttentionKind::ChunkedLocal { chunk: 8192 },
    ] {
        let first = kind.first_needed_block(usize::MAX, 16);
        assert!(first <= usize::MAX / 16);
        let range = kind.needed_for_hit(usize::MAX, 16);
        assert!(range.start <= range.end);
        assert_eq!(kind.longest_hit(3, &[true; 3], usize::MAX), 3);
    }
}

#[test]
fn group_salts_differ_and_group_zero_is_the_salt() {
    let salt = Salt::from_bytes(b"tenant");
    assert_eq!(salt.for_group(0), salt);
    let salts: Vec<u128> = (0..8).map(|g| salt.for_group(g).get()).collect();
    let mut unique = salts.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), salts.len());
    // Deterministic: every engine and router derives the same.
    assert_eq!(salt.for_group(3), salt.for_group(3));
    assert_ne!(Salt::NONE.for_group(1), Salt::NONE);
}

/// A group's hashes are group 0's chained hashes with the group's tag on
/// value and parent alike, at the same positions, for keyed salts too.
#[test]
fn group_hashes_are_the_same_chain_tagged() {
    let key = crate::HashKey::new(*b"0123456789abcdef").leak();
    let tokens: Vec<u32> = (0..100).map(|t| t * 7 + 3).collect();
    for salt in [Salt::NONE, Salt::from_bytes(b"t"), Salt::keyed(key, b"t")] {
        let lead = crate::BlockSequence::with_salt(tokens.clone(), 16, salt).unwrap();
        for g in 1..4 {
            let group = salt.for_group(g);
            let tag = group.get() ^ salt.get();
            assert_ne!(tag, 0);
            let seq = crate::BlockSequence::with_salt(tokens.clone(), 16, group).unwrap();
            assert_eq!(seq.num_blocks(), lead.num_blocks());
            for (a, b) in lead.sequence_hashes().iter().zip(seq.sequence_hashes()) {
                assert_eq!(a.value() ^ tag, b.value());
                assert_eq!(a.position(), b.position());
                match (a.parent(), b.parent()) {
                    (None, None) => {}
                    (Some(pa), Some(pb)) => assert_eq!(pa ^ tag, pb),
                    other => panic!("parents differ in kind: {other:?}"),
                }
            }
        }
    }
}

#[test]
fn display_names_the_kind_and_span() {
    assert_eq!(AttentionKind::Full.to_string(), "full");
    assert_eq!(
        AttentionKind::SlidingWindow { window: 128 }.to_string(),
        "sliding_window:128"
    );
    assert_eq!(
        AttentionKind::ChunkedLocal { chunk: 8192 }.to_string(),
        "chunked_local:8192"
    );
}

proptest! {
    /// The lazy rule agrees with the slice one, asks only about blocks
    /// below `cap`, and (full attention, window) each block at most once.
    #[test]
    fn longest_hit_by_asks_only_what_it_needs(
        block_size in 1..5usize,
        kind in kind_strategy(),
        cached in prop::collection::vec(prop::bool::weighted(0.8), 0..40),
        cap in 0..45usize,
    ) {
        let mut asked = vec![0usize; cap];
        let hit = kind.longest_hit_by(cap, block_size, |i| {
            asked[i] += 1; // out of bounds (a panic) if `i >= cap`
            cached.get(i).copied().unwrap_or(false)
        });
        prop_assert_eq!(hit, kind.longest_hit(cap, &cached, block_size));
        if !matches!(kind, AttentionKind::ChunkedLocal { .. }) {
            prop_assert!(asked.iter().all(|&n| n <= 1), "{:?}", asked);
        }
        if kind == AttentionKind::Full {
            // Up to the first miss, nothing past it.
            prop_assert_eq!(asked.iter().sum::<usize>(), (hit + 1).min(cap));
        }
    }
}

#[test]
fn a_full_group_miss_spares_the_other_groups_any_look_up() {
    let groups = KvCacheGroups::new(
        16,
        vec![
            KvCacheGroup::new(AttentionKind::SlidingWindow { window: 128 }, 1),
            KvCacheGroup::new(AttentionKind::Full, 1),
            KvCacheGroup::new(AttentionKind::ChunkedLocal { chunk: 256 }, 1),
        ],
    )
    .unwrap();
    let mut asked = Vec::new();
    let hit = groups.longest_common_hit_by(1000, |g, i| {
        asked.push((g, i));
        false
    });
    assert_eq!((hit, asked), (0, vec![(1, 0)]));

    // A 600-block full hit: the window group looks at the 8 blocks before
    // it, the chunk group at the blocks of its chunk (blocks 592..600), not
    // at the whole prompt.
    let mut asked = [0usize; 3];
    let hit = groups.longest_common_hit_by(1000, |g, i| {
        asked[g] += 1;
        g != 1 || i < 600
    });
    assert_eq!(hit, 600);
    assert_eq!(asked, [8, 601, 8]);
}
