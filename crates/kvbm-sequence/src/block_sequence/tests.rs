//! Unit tests for [`BlockSequence`]: splitting, chaining, append, extend, truncate.

use kvbm_blocks::SequenceHash;

use super::BlockSequence;
use crate::{Salt, SequenceError, block_hash, chain_hash};

fn seq(len: u32, block_size: usize) -> BlockSequence {
    BlockSequence::new((0..len).collect(), block_size).unwrap()
}

/// The hashes, computed the slow obvious way from the definition.
fn reference_hashes(tokens: &[u32], block_size: usize, salt: Salt) -> Vec<SequenceHash> {
    let mut hashes: Vec<SequenceHash> = Vec::new();
    for block in tokens.chunks_exact(block_size) {
        let next = match hashes.last() {
            Some(parent) => parent.child(chain_hash(parent.value(), block_hash(block))),
            None => SequenceHash::root(chain_hash(salt.get(), block_hash(block))),
        };
        hashes.push(next);
    }
    hashes
}

#[test]
fn zero_block_size_is_an_error() {
    assert_eq!(
        BlockSequence::new(vec![1, 2, 3], 0).unwrap_err(),
        SequenceError::ZeroBlockSize
    );
    assert_eq!(
        BlockSequence::with_salt(vec![], 0, Salt::new(7)).unwrap_err(),
        SequenceError::ZeroBlockSize
    );
}

#[test]
fn splits_into_full_blocks_and_a_partial_tail() {
    let s = seq(10, 4);
    assert_eq!(s.total_tokens(), 10);
    assert_eq!(s.num_blocks(), 2);
    assert_eq!(s.block_size(), 4);
    assert_eq!(s.salt(), Salt::NONE);
    assert!(!s.is_empty());
    assert_eq!(s.block_tokens(0), Some(&[0, 1, 2, 3][..]));
    assert_eq!(s.block_tokens(1), Some(&[4, 5, 6, 7][..]));
    assert_eq!(s.block_tokens(2), None, "the tail is not a full block");
    assert_eq!(s.partial_tokens(), &[8, 9]);
    assert_eq!(s.tokens(), (0..10).collect::<Vec<_>>());
}

#[test]
fn empty_and_exact_multiples() {
    let empty = seq(0, 4);
    assert!(empty.is_empty());
    assert_eq!((empty.num_blocks(), empty.partial_tokens()), (0, &[][..]));
    let exact = seq(8, 4);
    assert_eq!((exact.num_blocks(), exact.partial_tokens()), (2, &[][..]));
}

#[test]
fn hashes_chain_from_the_salt_with_positions_and_parents() {
    let salt = Salt::new(42);
    let s = BlockSequence::with_salt((0..12).collect(), 4, salt).unwrap();
    let hashes = s.sequence_hashes();
    assert_eq!(hashes, reference_hashes(&s.tokens().to_vec(), 4, salt));
    assert!(hashes[0].is_root());
    for (i, pair) in hashes.windows(2).enumerate() {
        assert_eq!(pair[1].parent(), Some(pair[0].value()));
        assert_eq!(pair[1].position() as usize, i + 1);
    }
}

#[test]
fn same_tokens_in_another_block_hash_differently() {
    // Blocks 0 and 1 hold the same tokens: their chained hashes still differ.
    let s = BlockSequence::new(vec![7, 7, 7, 7], 2).unwrap();
    assert_eq!(s.num_blocks(), 2);
    assert_ne!(
        s.sequence_hashes()[0].value(),
        s.sequence_hashes()[1].value()
    );
}

#[test]
fn append_reports_the_block_it_completes() {
    let mut s = seq(2, 3);
    assert_eq!(s.append(2), Some(0));
    assert_eq!(s.append(3), None);
    assert_eq!(s.append(4), None);
    assert_eq!(s.append(5), Some(1));
    assert_eq!(s.sequence_hashes(), seq(6, 3).sequence_hashes());
}

#[test]
fn block_size_one_completes_a_block_per_token() {
    let mut s = seq(0, 1);
    for token in 0..5 {
        assert_eq!(s.append(token), Some(token as usize));
    }
    assert_eq!(s.num_blocks(), 5);
    assert!(s.partial_tokens().is_empty());
}

#[test]
fn extend_reports_the_range_of_completed_blocks() {
    let mut s = seq(3, 4);
    assert_eq!(s.extend(&[]), 0..0);
    assert_eq!(s.extend(&[3]), 0..1);
    assert_eq!(s.extend(&[4, 5]), 1..1, "no block completed");
    assert_eq!(s.extend(&(6..16).collect::<Vec<_>>()), 1..4);
    assert_eq!(s, seq(16, 4));
}

#[test]
fn large_blocks_hash_the_same_as_their_definition() {
    // Past 64 tokens a block is encoded on the heap, not the stack.
    let tokens: Vec<u32> = (0..300).map(|t| t * 31 + 5).collect();
    for block_size in [63, 64, 65, 128] {
        let s = BlockSequence::new(tokens.clone(), block_size).unwrap();
        assert_eq!(
            s.sequence_hashes(),
            reference_hashes(&tokens, block_size, Salt::NONE)
        );
    }
}

#[test]
fn truncate_keeps_the_hashes_of_blocks_that_stay_full() {
    let mut s = seq(14, 4);
    let before = s.sequence_hashes().to_vec();
    s.truncate(9).unwrap();
    assert_eq!(s.total_tokens(), 9);
    assert_eq!(s.sequence_hashes(), &before[..2]);
    assert_eq!(s.partial_tokens(), &[8]);
    s.truncate(8).unwrap();
    assert_eq!((s.num_blocks(), s.partial_tokens()), (2, &[][..]));
    s.truncate(7).unwrap();
    assert_eq!(s.sequence_hashes(), &before[..1]);
    s.truncate(0).unwrap();
    assert!(s.is_empty() && s.sequence_hashes().is_empty());
}

#[test]
fn truncate_past_the_end_is_an_error_and_changes_nothing() {
    let mut s = seq(5, 4);
    assert_eq!(
        s.truncate(6).unwrap_err(),
        SequenceError::TruncateOutOfRange {
            len: 6,
            min: 0,
            max: 5
        }
    );
    assert_eq!(s, seq(5, 4));
    s.truncate(5).unwrap();
    assert_eq!(s, seq(5, 4), "truncating to the current length is a no-op");
}

#[test]
fn truncate_then_reappend_restores_the_hashes() {
    let mut s = seq(20, 4);
    let original = s.clone();
    s.truncate(6).unwrap();
    assert_eq!(s.extend(&(6..20).collect::<Vec<_>>()), 1..5);
    assert_eq!(s, original);
}

#[test]
fn debug_names_the_shape_not_every_token() {
    let text = format!("{:?}", seq(10, 4));
    assert!(
        text.contains("total_tokens: 10") && text.contains("num_blocks: 2"),
        "{text}"
    );
}

#[test]
fn with_salts_hashes_each_salt_as_with_salt_does() {
    let key = crate::HashKey::new(*b"0123456789abcdef").leak();
    let other_key = crate::HashKey::new(*b"fedcba9876543210").leak();
    let keyed = Salt::keyed(key, b"tenant");
    let plain = Salt::from_bytes(b"tenant");
    let cases: [Vec<Salt>; 6] = [
        // One chain up to the groups' tags: chained once, retagged.
        (0..3).map(|g| plain.for_group(g)).collect(),
        (0..3).map(|g| keyed.for_group(g)).collect(),
        // Led by a tagged salt: the others take the XOR of both tags.
        vec![plain.for_group(2), plain.for_group(1), plain],
        // One hash function, two chains: block hashes shared.
        vec![plain, plain.for_group(1), Salt::from_bytes(b"other")],
        // Mixed functions: each salt hashes its own blocks.
        vec![plain, keyed, Salt::keyed(other_key, b"tenant")],
        vec![keyed, Salt::keyed(other_key, b"tenant")],
    ];
    for block_size in [1, 3, 16] {
        for len in [0u32, 2, 16, 47, 48] {
            let mut tokens: Vec<u32> = Vec::with_capacity(len as usize + 20);
            tokens.extend((0..len).map(|t| t.wrapping_mul(0x9e37_79b9)));
            for salts in &cases {
                let mut roomy = Vec::with_capacity(tokens.capacity());
                roomy.extend_from_slice(&tokens);
                let seqs = BlockSequence::with_salts(roomy, block_size, salts).unwrap();
                assert_eq!(seqs.len(), salts.len());
                for (seq, &salt) in seqs.iter().zip(salts) {
                    let alone = BlockSequence::with_salt(tokens.clone(), block_size, salt).unwrap();
                    assert_eq!(seq, &alone, "block size {block_size}, {len} tokens");
                    // Each keeps the room reserved for the generation.
                    assert!(
                        seq.tail.capacity() - seq.tail.len() >= tokens.capacity() - tokens.len()
                    );
                    // The prompt's blocks are shared, not copied.
                    assert!(seq.tail.len() < block_size);
                    let shared = |s: &BlockSequence| s.head.clone().map(|h| h.as_ptr());
                    assert_eq!(shared(seq), shared(&seqs[0]));
                }
                if len as usize >= block_size {
                    assert_ne!(seqs[0].sequence_hashes(), seqs[1].sequence_hashes());
                }
            }
        }
    }
    // Appends after the shared hashing chain on as usual.
    let mut seqs = BlockSequence::with_salts(
        (0..10).collect::<Vec<u32>>(),
        4,
        &[plain, plain.for_group(1)],
    )
    .unwrap();
    let mut alone = BlockSequence::with_salt((0..10).collect(), 4, plain.for_group(1)).unwrap();
    assert_eq!(seqs[1].extend(&[10, 11, 12]), alone.extend(&[10, 11, 12]));
    assert_eq!(seqs[1], alone);
}

#[test]
fn with_salts_of_no_salts_or_a_zero_block_size() {
    assert!(
        BlockSequence::with_salts(vec![1, 2, 3], 2, &[])
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        BlockSequence::with_salts(vec![1, 2, 3], 0, &[Salt::NONE]),
        Err(SequenceError::ZeroBlockSize)
    ));
}

mod shared {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::BlockSequence;
    use crate::{HashedPrompt, PromptTokens, Salt};

    #[derive(Clone, Debug)]
    enum Op {
        Append(u32),
        Extend(Vec<u32>),
        /// Truncate to this fraction (per mille) of the length.
        Truncate(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => any::<u32>().prop_map(Op::Append),
            2 => prop::collection::vec(any::<u32>(), 0..12).prop_map(Op::Extend),
            1 => (0u16..=1000).prop_map(Op::Truncate),
        ]
    }

    fn same(a: &BlockSequence, b: &BlockSequence) -> Result<(), TestCaseError> {
        prop_assert_eq!(a, b);
        prop_assert_eq!(a.tokens().to_vec(), b.tokens().to_vec());
        prop_assert_eq!(a.partial_tokens(), b.partial_tokens());
        for i in 0..=a.num_blocks() {
            prop_assert_eq!(a.block_tokens(i), b.block_tokens(i));
        }
        let tokens = a.tokens();
        for start in 0..=tokens.len() {
            let end = (start + 5).min(tokens.len());
            let range = tokens.range(start..end).map(|r| r.into_owned());
            prop_assert_eq!(range, Some(tokens.to_vec()[start..end].to_vec()));
        }
        prop_assert!(tokens.range(0..tokens.len() + 1).is_none());
        Ok(())
    }

    /// Cases: `KVBM_FUZZ_CASES` (as `cargo xtask fuzz --cases N` sets it),
    /// else a CI-sized default.
    fn cases() -> u32 {
        (std::env::var("KVBM_FUZZ_CASES").ok())
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(512)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// A sequence reading a shared prompt in place behaves exactly as
        /// one owning a copy of it, through any appends, extends and
        /// truncations (into the prompt too), and so does one built from a
        /// hashed prompt.
        #[test]
        fn fuzz_a_shared_prompt_reads_as_an_owned_one(
            prompt in prop::collection::vec(any::<u32>(), 0..40),
            block_size in 1usize..6,
            headroom in 0usize..8,
            ops in prop::collection::vec(op(), 0..30),
        ) {
            let salt = Salt::new(9);
            let arc: Arc<[u32]> = prompt.clone().into();
            let mut owned = BlockSequence::with_salt(prompt.clone(), block_size, salt).unwrap();
            let shared_prompt = PromptTokens::shared(arc.clone(), headroom);
            let mut shared = BlockSequence::from_prompt(shared_prompt, block_size, salt).unwrap();
            let hashed = HashedPrompt::new(arc, block_size, salt).unwrap();
            let mut from_hashed = BlockSequence::from_hashed(&hashed, headroom);
            same(&owned, &shared)?;
            same(&owned, &from_hashed)?;
            for op in ops {
                match op {
                    Op::Append(token) => {
                        let completed = owned.append(token);
                        prop_assert_eq!(shared.append(token), completed);
                        prop_assert_eq!(from_hashed.append(token), completed);
                    }
                    Op::Extend(tokens) => {
                        let completed = owned.extend(&tokens);
                        prop_assert_eq!(shared.extend(&tokens), completed.clone());
                        prop_assert_eq!(from_hashed.extend(&tokens), completed);
                    }
                    Op::Truncate(per_mille) => {
                        let len = owned.total_tokens() * usize::from(per_mille) / 1000;
                        owned.truncate(len).unwrap();
                        shared.truncate(len).unwrap();
                        from_hashed.truncate(len).unwrap();
                    }
                }
                same(&owned, &shared)?;
                same(&owned, &from_hashed)?;
            }
            let past = owned.total_tokens() + 1;
            prop_assert!(shared.truncate(past).is_err());
            same(&owned, &shared)?;
        }
    }
}

#[test]
fn with_salts_of_one_salt_keeps_the_buffer_it_is_given() {
    let mut tokens: Vec<u32> = Vec::with_capacity(64);
    tokens.extend(0..40);
    let buffer = tokens.as_ptr();
    let seqs = BlockSequence::with_salts(tokens, 16, &[Salt::new(3)]).unwrap();
    assert_eq!(seqs[0].tail.as_ptr(), buffer, "not copied");
    assert!(seqs[0].head.is_none());
    assert_eq!(
        seqs[0],
        BlockSequence::with_salt((0..40).collect(), 16, Salt::new(3)).unwrap()
    );
}
