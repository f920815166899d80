//! Property tests of block hashing: equal prefixes give equal hashes, and any
//! differing token or salt changes every hash from its block on, for plain
//! (XXH3-128) and keyed (SipHash-1-3-128) salts alike.

use kvbm_sequence::{BlockSequence, HashKey, HashedPrompt, Salt, SequenceError};
use proptest::prelude::*;

fn tokens(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..64, 0..max_len)
}

/// Plain salts and keyed ones (a key and a tenant name).
fn salt() -> impl Strategy<Value = Salt> {
    prop_oneof![
        any::<u128>().prop_map(Salt::new),
        (any::<[u8; 16]>(), prop::collection::vec(any::<u8>(), 0..8))
            .prop_map(|(key, tenant)| Salt::keyed(HashKey::new(key).leak(), &tenant)),
    ]
}

fn values(seq: &BlockSequence) -> Vec<u128> {
    seq.sequence_hashes().iter().map(|h| h.value()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Two sequences agreeing on the first `shared` tokens have equal hashes
    /// for every block inside that prefix, and the first differing token
    /// changes the hash of its block and of every block after it.
    #[test]
    fn hashes_agree_exactly_on_the_shared_prefix(
        prefix in tokens(64),
        tail_a in tokens(32),
        tail_b in tokens(32),
        block_size in 1usize..9,
        salt in salt(),
    ) {
        let a_tokens = [&prefix[..], &tail_a[..]].concat();
        let b_tokens = [&prefix[..], &tail_b[..]].concat();
        let a = BlockSequence::with_salt(a_tokens.clone(), block_size, salt).unwrap();
        let b = BlockSequence::with_salt(b_tokens.clone(), block_size, salt).unwrap();
        let first_difference = a_tokens
            .iter()
            .zip(&b_tokens)
            .position(|(x, y)| x != y)
            .unwrap_or(a_tokens.len().min(b_tokens.len()));
        let shared_blocks = first_difference / block_size;
        let (a, b) = (values(&a), values(&b));
        for block in 0..a.len().min(b.len()) {
            if block < shared_blocks {
                prop_assert_eq!(a[block], b[block], "block {} is in the shared prefix", block);
            } else {
                prop_assert_ne!(a[block], b[block], "block {} is past a differing token", block);
            }
        }
    }

    /// Changing one token changes the hash of its block and every later one,
    /// and no earlier one.
    #[test]
    fn one_changed_token_changes_every_hash_from_its_block_on(
        original in prop::collection::vec(any::<u32>(), 1..96),
        index in any::<prop::sample::Index>(),
        delta in 1u32..,
        block_size in 1usize..17,
    ) {
        let at = index.index(original.len());
        let mut changed = original.clone();
        changed[at] = changed[at].wrapping_add(delta);
        let a = values(&BlockSequence::new(original, block_size).unwrap());
        let b = values(&BlockSequence::new(changed, block_size).unwrap());
        for block in 0..a.len() {
            prop_assert_eq!(a[block] == b[block], block < at / block_size, "block {}", block);
        }
    }

    /// Another salt changes every hash.
    #[test]
    fn another_salt_changes_every_hash(
        tokens in tokens(96),
        block_size in 1usize..9,
        salt in salt(),
        other in salt(),
    ) {
        prop_assume!(salt != other);
        let a = values(&BlockSequence::with_salt(tokens.clone(), block_size, salt).unwrap());
        let b = values(&BlockSequence::with_salt(tokens, block_size, other).unwrap());
        for (block, (x, y)) in a.iter().zip(&b).enumerate() {
            prop_assert_ne!(x, y, "block {}", block);
        }
    }

    /// However the tokens arrive (at once, one by one, in chunks, with
    /// rollbacks), the hashes depend only on the final tokens.
    #[test]
    fn hashes_depend_only_on_the_tokens(
        tokens in tokens(96),
        block_size in 1usize..9,
        chunks in prop::collection::vec(0usize..12, 1..20),
        rollback in any::<prop::sample::Index>(),
    ) {
        let whole = BlockSequence::new(tokens.clone(), block_size).unwrap();

        let mut one_by_one = BlockSequence::new(Vec::new(), block_size).unwrap();
        for (i, &token) in tokens.iter().enumerate() {
            let completed = one_by_one.append(token);
            let expected = ((i + 1) % block_size == 0).then_some(i / block_size);
            prop_assert_eq!(completed, expected);
        }
        prop_assert_eq!(&one_by_one, &whole);

        let mut chunked = BlockSequence::new(Vec::new(), block_size).unwrap();
        let mut rest = &tokens[..];
        for &len in chunks.iter().cycle().take(tokens.len() + 1) {
            let (chunk, tail) = rest.split_at(len.min(rest.len()));
            let before = chunked.num_blocks();
            let completed = chunked.extend(chunk);
            prop_assert_eq!(completed, before..chunked.num_blocks());
            rest = tail;
        }
        chunked.extend(rest); // whatever zero-length chunks left over
        prop_assert_eq!(&chunked, &whole);

        // Roll back to any point and replay: same hashes again.
        let at = rollback.index(tokens.len() + 1);
        chunked.truncate(at).unwrap();
        prop_assert_eq!(chunked.sequence_hashes(), &whole.sequence_hashes()[..at / block_size]);
        chunked.extend(&tokens[at..]);
        prop_assert_eq!(&chunked, &whole);
    }

    /// A prompt hashed once names its blocks exactly as a sequence of it
    /// does (any salt, plain or keyed, any block size), and a sequence
    /// started from it is the sequence that hashes the prompt itself, and
    /// grows the same way after.
    #[test]
    fn a_hashed_prompt_is_the_sequence_of_its_tokens(
        tokens in tokens(96),
        more in tokens(40),
        block_size in 1usize..9,
        salt in salt(),
        headroom in 0usize..64,
    ) {
        let prompt = HashedPrompt::new(tokens.clone(), block_size, salt).unwrap();
        let hashed = BlockSequence::with_salt(tokens.clone(), block_size, salt).unwrap();
        prop_assert_eq!(prompt.hashes(), hashed.sequence_hashes());
        prop_assert_eq!(prompt.tokens(), &tokens[..]);
        prop_assert!(prompt.fits(block_size, salt));
        prop_assert!(!prompt.fits(block_size + 1, salt));

        let mut from_prompt = BlockSequence::from_hashed(&prompt, headroom);
        let mut hashed = hashed;
        prop_assert_eq!(&from_prompt, &hashed);
        prop_assert_eq!(from_prompt.extend(&more), hashed.extend(&more));
        prop_assert_eq!(&from_prompt, &hashed);
    }
}

#[test]
fn a_hashed_prompt_refuses_blocks_of_no_tokens() {
    assert!(matches!(
        HashedPrompt::new(vec![1, 2, 3], 0, Salt::NONE),
        Err(SequenceError::ZeroBlockSize)
    ));
}
