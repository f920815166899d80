//! Unit tests for the grouped sequence's private helpers.

use kvbm_sequence::AttentionKind;

use super::next_unread;

/// `next_unread` is exactly the first position whose first needed block
/// passes the skipped ones, for every kind, block size and skipped count
/// small enough to check by walking the positions.
#[test]
fn next_unread_is_the_first_position_that_releases_a_block() {
    for block_size in 1..5 {
        let mut kinds = vec![AttentionKind::Full];
        for blocks in 1..5 {
            kinds.push(AttentionKind::SlidingWindow {
                window: blocks * block_size,
            });
            kinds.push(AttentionKind::ChunkedLocal {
                chunk: blocks * block_size,
            });
        }
        for kind in kinds {
            for skipped in 0..6 {
                let expected = (0..200)
                    .find(|&n| kind.first_needed_block(n, block_size) > skipped)
                    .unwrap_or(usize::MAX);
                assert_eq!(
                    next_unread(kind, skipped, block_size),
                    expected,
                    "{kind:?}, block size {block_size}, skipped {skipped}"
                );
            }
        }
    }
}
