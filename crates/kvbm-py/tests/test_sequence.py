"""Sequences: chained block hashes, and a request's blocks in a pool."""

import pytest

import kvbm


def test_sequence_blocks_and_hashes():
    seq = kvbm.Sequence(list(range(10)), 4)
    assert (len(seq), seq.num_blocks, seq.partial_tokens) == (10, 2, [8, 9])
    assert seq.block_tokens(1) == [4, 5, 6, 7]
    assert seq.block_tokens(2) is None
    assert seq.append(10) is None
    assert seq.append(11) == 2
    assert list(seq) == list(range(12))
    third = seq.hashes[2]
    seq.truncate(9)
    assert seq.num_blocks == 2
    assert seq.extend([9, 10, 11]) == range(2, 3)
    assert seq.hashes[2] == third  # same tokens, same hash
    assert "Sequence(tokens=12" in repr(seq)


def test_hashes_chain_prefixes_and_salts():
    a = kvbm.Sequence(list(range(8)) + [1, 2, 3, 4], 4)
    b = kvbm.Sequence(list(range(8)) + [5, 6, 7, 8], 4)
    assert a.hashes[:2] == b.hashes[:2]
    assert a.hashes[2] != b.hashes[2]
    salted = kvbm.Sequence(list(range(8)), 4, salt="tenant-a")
    assert salted.hashes[0] != a.hashes[0]
    assert kvbm.Sequence(list(range(8)), 4, salt=b"tenant-a").hashes == salted.hashes
    assert all(0 <= h < 2**128 for h in a.hashes)


def test_request_sequence_lifecycle_shares_a_prompt():
    pool = kvbm.BlockPool(8, 4)
    system = list(range(8))
    first = kvbm.RequestSequence(system + [100, 101], 4, 4)
    assert first.match_prefix(pool) == 0
    assert first.allocate_for(pool) == 3
    assert first.register_pending(pool) == 2
    for token in (102, 103):
        filled = first.append_token(token)
    assert filled == 2
    assert first.register_pending(pool) == 1
    assert len(first.block_ids) == 3
    first.release()
    assert pool.metrics()["inactive_blocks"] == 3

    second = kvbm.RequestSequence(system + [200, 201, 202], 4, 4)
    assert second.match_prefix(pool) == 2
    assert second.new_tokens_for_prefill == 3
    assert second.hashes[:2] == first.hashes[:2]
    assert second.prefix_matched_blocks == 2
    assert "RequestSequence(" in repr(second)


def test_request_sequence_outlives_its_pool_object():
    pool = kvbm.BlockPool(8, 4)
    seq = kvbm.RequestSequence(list(range(8)), 2, 4)
    seq.allocate_for(pool)
    seq.register_pending(pool)
    held = seq.block_ids
    del pool  # the blocks keep the pool alive underneath
    assert seq.block_ids == held
    seq.release()
    assert seq.held_blocks == 0


def test_output_budget_and_truncation_refused_cleanly():
    pool = kvbm.BlockPool(8, 4)
    seq = kvbm.RequestSequence([1, 2, 3], 1, 4)
    seq.allocate_for(pool, 4)
    seq.append_token(4)
    assert seq.is_complete
    with pytest.raises(kvbm.SequenceError, match="output tokens remain"):
        seq.append_token(5)
    with pytest.raises(kvbm.SequenceError):
        seq.truncate(99)
    assert seq.total_tokens == 4
