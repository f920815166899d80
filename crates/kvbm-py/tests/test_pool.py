"""The block pool as an engine drives it: allocate, register, match, release."""

import array

import pytest

import kvbm

BLOCK = 16


def prompt(n_blocks, first=0):
    return list(range(first, first + n_blocks * BLOCK))


def test_register_then_match_prefix_in_one_call():
    pool = kvbm.BlockPool(64, BLOCK)
    tokens = prompt(4)
    hashes = kvbm.block_hashes(tokens, BLOCK)
    blocks = pool.allocate(4)
    assert pool.register(blocks, hashes) == blocks
    pool.release(blocks)
    assert pool.metrics()["inactive_blocks"] == 4  # cached, not freed

    # A longer request sharing the prefix finds the four blocks, in order.
    longer = kvbm.block_hashes(tokens + prompt(2, first=1000), BLOCK)
    hit = pool.match_prefix(longer)
    assert hit == blocks
    assert [pool.ref_count(b) for b in hit] == [1, 1, 1, 1]
    pool.release(hit)
    assert pool.num_held == 0


def test_hashes_travel_as_ints_bytes_or_a_sequence():
    pool = kvbm.BlockPool(32, BLOCK)
    seq = kvbm.Sequence(prompt(3), BLOCK)
    blocks = pool.allocate(3)
    pool.register(blocks, seq)
    assert pool.match_prefix(seq.hashes) == blocks
    assert pool.match_prefix(seq.packed_hashes) == blocks
    assert pool.match_prefix(seq) == blocks
    assert len(seq.packed_hashes) == 16 * 3
    assert [pool.ref_count(b) for b in blocks] == [4, 4, 4]
    pool.release(blocks * 4)
    assert pool.num_held == 0


def test_register_from_tokens_hashes_as_a_sequence_does():
    pool = kvbm.BlockPool(32, BLOCK)
    tokens = prompt(2)
    blocks = pool.allocate(2)
    pool.register(blocks, tokens=tokens)
    assert pool.contains(kvbm.Sequence(tokens, BLOCK).hashes) == [True, True]

    # Continuing the chain: the third block after the second one's hash.
    more = prompt(1, first=500)
    third = pool.allocate(1)
    seq = kvbm.Sequence(tokens + more, BLOCK)
    pool.register(third, tokens=more, parent=seq.hashes[1], position=2)
    assert pool.contains(seq) == [True, True, True]
    assert pool.match_prefix(seq) == blocks + third


def test_a_sequence_registers_a_slice_of_its_hashes():
    pool = kvbm.BlockPool(32, BLOCK)
    seq = kvbm.Sequence(prompt(4), BLOCK)
    first = pool.allocate(2)
    pool.register(first, seq)  # blocks 0 and 1
    rest = pool.allocate(2)
    pool.register(rest, seq, position=2)  # blocks 2 and 3
    assert pool.match_prefix(seq) == first + rest


def test_deduplication_returns_the_registered_block():
    pool = kvbm.BlockPool(8, BLOCK)
    hashes = kvbm.block_hashes(prompt(1), BLOCK)
    a = pool.allocate(1)
    b = pool.allocate(1)
    assert pool.register(a, hashes) == a
    assert pool.register(b, hashes) == a  # b went back to the free pool
    assert pool.ref_count(a[0]) == 2
    assert pool.ref_count(b[0]) == 0
    assert pool.metrics()["deduplications"] == 1
    pool.release(a + a)


def test_allocation_evicts_cached_blocks_lru_and_reports_events():
    pool = kvbm.BlockPool(4, BLOCK, events=True)
    first = pool.take_events()
    assert first == [{"type": "resync", "batch": 0, "missed_batches": 0, "registered": []}]
    tokens = prompt(4)
    hashes = kvbm.block_hashes(tokens, BLOCK)
    blocks = pool.allocate(4)
    pool.register(blocks, hashes, tokens=tokens)
    pool.release(blocks)
    stored = pool.take_events()
    assert [e["type"] for e in stored] == ["stored"]
    assert stored[0]["hashes"] == hashes
    assert stored[0]["parent"] is None
    assert stored[0]["tokens"] == tokens

    pool.allocate(2)  # evicts the two deepest blocks first
    removed = pool.take_events()
    assert [e["type"] for e in removed] == ["removed"]
    assert removed[0]["hashes"] == [hashes[3], hashes[2]]
    assert pool.match_prefix(hashes) == blocks[:2]
    assert pool.metrics()["evictions"] == 2


def test_clear_cache_and_usage():
    pool = kvbm.BlockPool(10, BLOCK)
    blocks = pool.allocate(5)
    assert pool.usage == pytest.approx(0.5)
    pool.register(blocks[:2], tokens=prompt(2))
    pool.release(blocks)
    assert pool.usage == 0.0
    assert pool.num_free_blocks == 10
    assert pool.clear_cache() == 2
    assert pool.metrics()["free_blocks"] == 10
    audit = pool.audit()
    assert audit["total_blocks"] == 10 and audit["free_blocks"] == 10


def test_eviction_policies_and_repr():
    for policy in ("lru", "multi-level", "lineage"):
        pool = kvbm.BlockPool(4, 8, eviction=policy)
        assert pool.eviction == policy
        assert pool.num_blocks == 4 and pool.block_size == 8
        assert "BlockPool(num_blocks=4" in repr(pool)


def test_tokens_may_be_a_buffer():
    tokens = array.array("I", prompt(2))
    assert kvbm.block_hashes(tokens, BLOCK) == kvbm.block_hashes(list(tokens), BLOCK)
    assert kvbm.block_hashes(iter(list(tokens)), BLOCK) == kvbm.block_hashes(list(tokens), BLOCK)
