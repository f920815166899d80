"""kvbm.VllmBlockPool, the Rust state of kvbm's drop-in for vLLM's
BlockPool, driven without vLLM: stand-in block objects with the attributes
of vLLM's KVCacheBlock, checked against a reference written from vLLM
0.33's FreeKVCacheBlockQueue and BlockPool semantics."""

import gc
import importlib.util
import random
import threading
import weakref

import pytest

import kvbm


class Block:
    """The attributes of vLLM's KVCacheBlock that its pool and managers use."""

    __slots__ = (
        "block_id",
        "ref_cnt",
        "_block_hash",
        "_block_hash_num_tokens",
        "is_null",
        "pool",
        "__weakref__",
    )

    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash = None
        self._block_hash_num_tokens = None
        self.is_null = False
        self.pool = None

    @property
    def block_hash(self):
        return self._block_hash


def make(n=8, **kwargs):
    blocks = [Block(i) for i in range(n)]
    return blocks, kvbm.VllmBlockPool(blocks, **kwargs)


def h(*parts):
    """A 32-byte block hash."""
    return bytes(parts).ljust(32, b"\x00")


def key(block_hash, group=0):
    return block_hash + group.to_bytes(4, "big")


def ids(blocks):
    return [b.block_id for b in blocks]


def test_starts_with_every_block_free_in_id_order_and_block_0_null():
    blocks, pool = make(6)
    assert pool.free_block_ids() == [1, 2, 3, 4, 5]
    assert pool.num_free_blocks == 5 and pool.num_blocks == 6
    assert pool.null_block is blocks[0] and blocks[0].is_null
    assert pool.usage == 0.0


def test_get_new_blocks_pops_the_front_with_one_reference():
    blocks, pool = make(6)
    got = pool.get_new_blocks(2)
    assert got == [blocks[1], blocks[2]] and got[0] is blocks[1]
    assert [b.ref_cnt for b in blocks] == [0, 1, 1, 0, 0, 0]
    assert pool.free_block_ids() == [3, 4, 5]
    assert pool.usage == pytest.approx(2 / 5)


def test_running_out_raises_and_changes_nothing():
    blocks, pool = make(4)
    pool.get_new_blocks(2)
    with pytest.raises(kvbm.PoolExhaustedError, match="cannot get 2"):
        pool.get_new_blocks(2)
    assert pool.free_block_ids() == [3]
    assert blocks[3].ref_cnt == 0


def test_free_puts_unhashed_blocks_first_and_cached_blocks_last():
    blocks, pool = make(8)
    a = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_full_blocks(a, [h(1), h(2), h(3)], 0, 2, 16, 0)  # 1, 2 cached
    # vLLM frees a request's blocks tail first.
    pool.free_blocks(list(reversed(a)))
    # 3 (no hash) goes to the front; 2 then 1 (cached) to the back.
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]
    assert [b.ref_cnt for b in a] == [0, 0, 0]


def test_free_takes_any_iterable_and_skips_the_null_block():
    blocks, pool = make(5)
    got = pool.get_new_blocks(2)
    pool.free_blocks(reversed([blocks[0], *got]))
    assert pool.free_block_ids() == [2, 1, 3, 4]
    assert blocks[0].ref_cnt == 0


def test_cache_full_blocks_sets_vllms_hash_attributes():
    blocks, pool = make(6)
    got = pool.get_new_blocks(3)
    hashes = [h(1), h(2), h(3)]
    stored = pool.cache_full_blocks(got, hashes, 0, 2, 16, 7)
    assert stored == [key(h(1), 7), key(h(2), 7)]
    assert got[0].block_hash == key(h(1), 7) and got[0]._block_hash_num_tokens == 16
    assert got[1]._block_hash_num_tokens == 32
    assert got[2].block_hash is None
    assert pool.get_cached_block(h(2), [7]) == [got[1]]
    assert pool.get_cached_block(h(2), [0]) is None
    assert pool.num_cached_keys == 2


def test_cache_full_blocks_skips_masked_blocks_and_checks_lengths():
    blocks, pool = make(6)
    got = pool.get_new_blocks(3)
    pool.cache_full_blocks(got, [h(1), h(2), h(3)], 0, 3, 4, 0, block_mask=[True, False, True])
    assert got[1].block_hash is None and got[2].block_hash == key(h(3))
    with pytest.raises(kvbm.InvalidArgumentError, match="need 4 block hashes"):
        pool.cache_full_blocks(got + got[:1], [h(1)] * 3, 3, 4, 4, 0)
    with pytest.raises(kvbm.InvalidArgumentError, match="block_mask"):
        pool.cache_full_blocks(got, [h(1)] * 3, 0, 2, 4, 0, block_mask=[True])
    with pytest.raises(TypeError, match="bytes"):
        pool.cache_full_blocks(got, ["x"] * 3, 0, 1, 4, 1)


def test_find_longest_cache_hit_stops_at_the_first_miss_in_any_group():
    blocks, pool = make(12)
    got = pool.get_new_blocks(6)
    hashes = [h(i) for i in range(4)]
    pool.cache_full_blocks(got[:3], hashes, 0, 3, 16, 0)  # group 0: 3 blocks
    pool.cache_full_blocks(got[3:], hashes, 0, 2, 16, 1)  # group 1: 2 blocks
    (only,) = pool.find_longest_cache_hit(hashes, [0], 10)
    assert only == got[:3]
    g0, g1 = pool.find_longest_cache_hit(hashes, [0, 1], 10)
    assert g0 == got[:2] and g1 == got[3:5]
    (capped,) = pool.find_longest_cache_hit(hashes, [0], 1)
    assert capped == got[:1]
    # A miss on the first block finds nothing.
    assert pool.find_longest_cache_hit([h(9)] + hashes, [0], 10) == ([],)


def test_max_hash_num_tokens_is_the_largest_cached_length_or_zero():
    blocks, pool = make(8)
    got = pool.get_new_blocks(4)
    assert pool.max_hash_num_tokens(got) == 0  # nothing cached yet
    pool.cache_full_blocks(got, [h(1), h(2), h(3)], 0, 3, 16, 0)
    assert pool.max_hash_num_tokens(got) == 48
    assert pool.max_hash_num_tokens(reversed(got[:2])) == 32  # any iterable
    assert pool.max_hash_num_tokens([]) == 0
    # Whoever set the attribute, the call reads it as vLLM's loop does
    # (`block_hash_num_tokens or 0`).
    got[3]._block_hash_num_tokens = 0
    assert pool.max_hash_num_tokens(got[3:]) == 0
    with pytest.raises(TypeError):
        pool.max_hash_num_tokens(3)


def test_find_longest_cache_hit_views_hashes_at_a_larger_block_size():
    blocks, pool = make(6)
    got = pool.get_new_blocks(2)
    fine = [h(i) for i in range(5)]  # hashes of 16-token blocks
    # 32-token blocks: block i's hash is fine[2 * i + 1].
    pool.cache_full_blocks(got, fine, 0, 2, 32, 0, stride=2)
    assert got[1].block_hash == key(fine[3]) and got[1]._block_hash_num_tokens == 64
    (hit,) = pool.find_longest_cache_hit(fine, [0], 10, 2)
    assert hit == got
    with pytest.raises(kvbm.InvalidArgumentError, match="stride"):
        pool.find_longest_cache_hit(fine, [0], 10, 0)


def test_touch_takes_a_cached_free_block_out_of_the_queue():
    blocks, pool = make(6)
    got = pool.get_new_blocks(2)
    pool.cache_full_blocks(got, [h(1), h(2)], 0, 2, 16, 0)
    pool.free_blocks(reversed(got))
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]
    (hit,) = pool.find_longest_cache_hit([h(1), h(2)], [0], 2)
    pool.touch(hit)
    assert pool.free_block_ids() == [3, 4, 5]
    assert [b.ref_cnt for b in got] == [1, 1]
    pool.touch(hit + [blocks[0]])  # a second request; the null block is skipped
    assert [b.ref_cnt for b in got] == [2, 2] and blocks[0].ref_cnt == 0
    assert pool.num_free_blocks == 3


def test_touch_of_a_block_listed_twice_counts_both():
    blocks, pool = make(4)
    got = pool.get_new_blocks(1)
    pool.cache_full_blocks(got, [h(1)], 0, 1, 16, 0)
    pool.free_blocks(got)
    pool.touch([got[0], got[0]])
    assert got[0].ref_cnt == 2 and not pool.is_free(got[0].block_id)
    pool.free_blocks([got[0], got[0]])
    assert got[0].ref_cnt == 0 and pool.free_block_ids()[-1] == got[0].block_id


def test_allocation_evicts_cached_blocks_from_the_front_with_events():
    blocks, pool = make(4, events=True)
    got = pool.get_new_blocks(3)
    pool.cache_full_blocks(got, [h(1), h(2), h(3)], 0, 3, 16, 0)
    pool.free_blocks(reversed(got))
    assert pool.take_events() == [("stored", [key(h(1)), key(h(2)), key(h(3))])]
    assert pool.free_block_ids() == [3, 2, 1]
    again = pool.get_new_blocks(2)
    assert ids(again) == [3, 2]
    assert again[0].block_hash is None and again[0]._block_hash_num_tokens is None
    assert pool.get_cached_block(h(3), [0]) is None
    assert pool.get_cached_block(h(1), [0]) == [blocks[1]]
    assert pool.take_events() == [("removed", key(h(3))), ("removed", key(h(2)))]
    assert pool.take_events() == []


def test_without_caching_freed_blocks_go_to_the_front():
    blocks, pool = make(5, enable_caching=False)
    got = pool.get_new_blocks(2)
    pool.cache_full_blocks(got, [h(1), h(2)], 0, 2, 16, 0)
    pool.free_blocks(reversed(got))
    assert pool.free_block_ids() == [2, 1, 3, 4]


def test_several_blocks_under_one_hash_return_the_earliest():
    blocks, pool = make(6)
    first = pool.get_new_blocks(1)
    second = pool.get_new_blocks(1)
    pool.cache_full_blocks(first, [h(1)], 0, 1, 16, 0)
    pool.cache_full_blocks(second, [h(1)], 0, 1, 16, 0)
    assert pool.cached_ids(key(h(1))) == [1, 2]
    assert pool.get_cached_block(h(1), [0]) == first
    pool.evict_blocks([1])
    assert pool.get_cached_block(h(1), [0]) == second
    assert first[0].block_hash is None and second[0].block_hash == key(h(1))


def test_evict_blocks_drops_hashes_but_keeps_queue_places():
    blocks, pool = make(5, events=True)
    got = pool.get_new_blocks(2)
    pool.cache_full_blocks(got, [h(1), h(2)], 0, 2, 16, 0)
    pool.free_blocks(reversed(got))
    pool.take_events()
    pool.evict_blocks({2, 3})
    assert pool.free_block_ids() == [3, 4, 2, 1]
    assert blocks[2].block_hash is None and blocks[1].block_hash == key(h(1))
    assert pool.take_events() == [("removed", key(h(2)))]
    with pytest.raises(kvbm.InvalidArgumentError, match="invalid block_id 9"):
        pool.evict_blocks([1, 9])
    assert blocks[1].block_hash == key(h(1))  # nothing evicted


def test_extra_keys_are_dropped_with_the_block():
    blocks, pool = make(4)
    got = pool.get_new_blocks(1)
    assert pool.insert_hash(key(h(1)), got[0], 8)
    assert pool.insert_hash(key(h(2)), got[0], 16)
    assert not pool.insert_hash(key(h(2)), got[0], 16)
    assert got[0].block_hash == key(h(1)) and got[0]._block_hash_num_tokens == 8
    assert pool.extra_keys(got[0].block_id) == [key(h(2))]
    assert pool.blocks_with_extra_keys() == [got[0].block_id]
    assert sorted(pool.remove_hashes(got[0])) == [key(h(1)), key(h(2))]
    assert got[0].block_hash is None and pool.num_cached_keys == 0
    assert pool.extra_keys(got[0].block_id) == []


def test_a_partial_entry_is_promoted_to_the_full_block():
    blocks, pool = make(4, events=True)
    got = pool.get_new_blocks(1)
    pool.insert_hash(key(h(5)), got[0], 8)  # a partial entry, 8 of 16 tokens
    pool.cache_full_blocks(got, [h(1)], 0, 1, 16, 0)
    assert got[0].block_hash == key(h(1)) and got[0]._block_hash_num_tokens == 16
    assert pool.get_one_block(key(h(5))) is None
    assert pool.take_events() == [("removed", key(h(5))), ("stored", [key(h(1))])]


def test_reset_prefix_cache_only_when_nothing_is_used():
    blocks, pool = make(4, events=True)
    got = pool.get_new_blocks(2)
    pool.cache_full_blocks(got, [h(1), h(2)], 0, 2, 16, 0)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(reversed(got))
    order = pool.free_block_ids()
    pool.take_events()
    assert pool.reset_prefix_cache()
    assert pool.free_block_ids() == order
    assert all(b.block_hash is None for b in blocks)
    assert pool.num_cached_keys == 0
    assert pool.take_events() == [("cleared", None)]


def test_unpin_appends_released_blocks_at_the_back_hash_or_not():
    blocks, pool = make(5)
    got = pool.get_new_blocks(2)
    pool.unpin(got)
    assert pool.free_block_ids() == [3, 4, 1, 2]
    with pytest.raises(kvbm.PoolError):
        pool.unpin(got)


def test_freeing_twice_raises_and_changes_nothing():
    blocks, pool = make(5)
    got = pool.get_new_blocks(2)
    pool.free_blocks(got[:1])
    queue = pool.free_block_ids()
    with pytest.raises(kvbm.PoolError, match="freed more often"):
        pool.free_blocks([got[1], got[0]])
    assert pool.free_block_ids() == queue and got[1].ref_cnt == 1
    with pytest.raises(kvbm.PoolError, match="freed more often"):
        pool.free_blocks([got[1], got[1]])
    assert got[1].ref_cnt == 1


def test_blocks_of_another_pool_are_handed_back_or_refused():
    blocks, pool = make(4)
    other_blocks, other = make(4)
    mine = pool.get_new_blocks(1)
    theirs = other.get_new_blocks(1)
    assert pool.free_blocks(mine + theirs) == theirs
    assert theirs[0].ref_cnt == 1  # left for its own pool
    with pytest.raises(kvbm.PoolError, match="not a block of this pool"):
        pool.touch(theirs)
    with pytest.raises(kvbm.PoolError, match="not a block of this pool"):
        pool.cache_full_blocks(theirs, [h(1)], 0, 1, 16, 0)
    assert pool.free_blocks(mine[:0]) is None


def test_bad_construction_and_arguments_raise():
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.VllmBlockPool([])
    with pytest.raises(kvbm.InvalidArgumentError, match="block_id"):
        kvbm.VllmBlockPool([Block(1)])
    busy = Block(0)
    busy.ref_cnt = 1
    with pytest.raises(kvbm.InvalidArgumentError, match="referenced"):
        kvbm.VllmBlockPool([busy])
    with pytest.raises(AttributeError):
        kvbm.VllmBlockPool([object()])
    blocks, pool = make(4)
    with pytest.raises(kvbm.InvalidArgumentError, match="negative"):
        pool.get_new_blocks(-1)
    with pytest.raises(TypeError):
        pool.get_new_blocks("2")
    with pytest.raises(kvbm.InvalidArgumentError, match="out of range"):
        pool.block(4)
    with pytest.raises(TypeError, match="bytes"):
        pool.get_cached_block("abc", [0])
    with pytest.raises(TypeError):
        pool.touch(5)


def test_a_ref_cnt_changed_behind_the_pools_back_is_refused():
    blocks, pool = make(4)
    blocks[1].ref_cnt = 3  # in the queue, yet referenced
    with pytest.raises(kvbm.PoolError, match="behind the pool's back"):
        pool.get_new_blocks(1)
    assert pool.free_block_ids() == [1, 2, 3]


def test_a_pool_in_a_reference_cycle_is_collected():
    class Owner:
        pass

    blocks, pool = make(4)
    owner = Owner()
    owner.core = pool
    for block in blocks:
        block.pool = owner  # as vLLM's blocks point to their pool
    gone = weakref.ref(owner)
    del owner, pool, blocks, block
    gc.collect()
    assert gone() is None


def test_threads_get_results_or_exceptions_never_a_crash():
    blocks, pool = make(64)
    errors = []

    def work(seed):
        rng = random.Random(seed)
        for _ in range(300):
            try:
                got = pool.get_new_blocks(rng.randint(0, 3))
                pool.free_blocks(reversed(got))
            except (kvbm.PoolError, RuntimeError) as err:
                errors.append(err)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.num_free_blocks + sum(b.ref_cnt for b in blocks[1:]) == 63
    assert sorted(pool.free_block_ids()) == [
        b.block_id for b in blocks[1:] if b.ref_cnt == 0
    ]


class Reference:
    """vLLM 0.33's BlockPool and FreeKVCacheBlockQueue, reduced to ids."""

    def __init__(self, n):
        self.queue = list(range(1, n))
        self.refs = [0] * n
        self.hash = [None] * n
        self.cache = {}

    def get_new_blocks(self, count):
        got, self.queue = self.queue[:count], self.queue[count:]
        for i in got:
            if self.hash[i] is not None:
                ids = self.cache[self.hash[i]]
                ids.remove(i)
                if not ids:
                    del self.cache[self.hash[i]]
                self.hash[i] = None
            self.refs[i] = 1
        return got

    def cache_full_blocks(self, got, hashes, start, end):
        for i in range(start, end):
            block = got[i]
            k = key(hashes[i])
            if self.hash[block] is None and block not in self.cache.get(k, []):
                self.hash[block] = k
                self.cache.setdefault(k, []).append(block)

    def lookup(self, hashes):
        found = []
        for x in hashes:
            ids = self.cache.get(key(x))
            if not ids:
                break
            found.append(ids[0])
        return found

    def touch(self, got):
        for i in got:
            if self.refs[i] == 0:
                self.queue.remove(i)
            self.refs[i] += 1

    def free(self, ordered):
        first, last = [], []
        for i in ordered:
            self.refs[i] -= 1
            if self.refs[i] == 0:
                (first if self.hash[i] is None else last).append(i)
        self.queue = first + self.queue + last


@pytest.mark.parametrize("seed", range(20))
def test_matches_vllms_queue_and_cache_on_random_requests(seed):
    rng = random.Random(seed)
    n = 24
    blocks, pool = make(n)
    ref = Reference(n)
    running = []
    prefixes = [[h(p, i) for i in range(6)] for p in range(3)]
    for _ in range(200):
        if running and (rng.random() < 0.45 or pool.num_free_blocks < 7):
            got = running.pop(rng.randrange(len(running)))
            pool.free_blocks(reversed([blocks[i] for i in got]))
            ref.free(list(reversed(got)))
        else:
            hashes = rng.choice(prefixes)[: rng.randint(1, 6)]
            (hit,) = pool.find_longest_cache_hit(hashes, [0], len(hashes))
            assert ids(hit) == ref.lookup(hashes)
            pool.touch(hit)
            ref.touch(ids(hit))
            new = pool.get_new_blocks(len(hashes) - len(hit))
            assert ids(new) == ref.get_new_blocks(len(hashes) - len(hit))
            got = ids(hit) + ids(new)
            full = rng.randint(len(hit), len(hashes))
            pool.cache_full_blocks(hit + new, hashes, len(hit), full, 16, 0)
            ref.cache_full_blocks(got, hashes, len(hit), full)
            running.append(got)
        assert pool.free_block_ids() == ref.queue
        assert [b.ref_cnt for b in blocks[1:]] == ref.refs[1:]
        assert [b.block_hash for b in blocks[1:]] == ref.hash[1:]


def test_kvbm_vllm_imports_without_vllm_and_says_what_is_missing():
    import kvbm.vllm

    if importlib.util.find_spec("vllm") is not None:
        assert kvbm.vllm.AVAILABLE
        return
    assert not kvbm.vllm.AVAILABLE
    assert not kvbm.vllm.installed()
    with pytest.raises(ImportError, match="vLLM"):
        kvbm.vllm.install()
    kvbm.vllm.uninstall()  # a no-op


def test_the_adapter_is_vllms_block_pool_with_vllms_blocks():
    pytest.importorskip("vllm")
    import kvbm.vllm
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    pool = kvbm.vllm.KvbmBlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    assert isinstance(pool, BlockPool)
    got = pool.get_new_blocks(3)
    assert all(type(b) is KVCacheBlock and b.pool is pool for b in got)
    pool.free_blocks(reversed(got))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 2, 1, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="Cannot get 8 free blocks"):
        pool.get_new_blocks(8)
