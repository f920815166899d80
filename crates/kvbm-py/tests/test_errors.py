"""Bad input from Python: exceptions of the right class, never a crash."""

import pytest

import kvbm


def test_the_exception_hierarchy():
    for name in ("PoolError", "SequenceError", "SchedulerError", "SimError", "InvalidArgumentError"):
        assert issubclass(getattr(kvbm, name), kvbm.KvbmError)
    assert issubclass(kvbm.PoolExhaustedError, kvbm.PoolError)
    assert issubclass(kvbm.InvalidArgumentError, ValueError)
    assert issubclass(kvbm.KvbmError, Exception)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: kvbm.BlockPool(0), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool(-4), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool(2**40), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool(2**80), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool(8, 0), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool("8"), TypeError),
        (lambda: kvbm.BlockPool(8.0), TypeError),
        (lambda: kvbm.BlockPool(8, eviction="fifo"), kvbm.InvalidArgumentError),
        (lambda: kvbm.BlockPool(8, duplicates="twice"), kvbm.InvalidArgumentError),
        (lambda: kvbm.Sequence([1, 2], 0), kvbm.InvalidArgumentError),
        (lambda: kvbm.Sequence([1, -2], 4), kvbm.InvalidArgumentError),
        (lambda: kvbm.Sequence([2**32], 4), kvbm.InvalidArgumentError),
        (lambda: kvbm.Sequence("abc", 4), TypeError),
        (lambda: kvbm.Sequence([1.5], 4), TypeError),
        (lambda: kvbm.Sequence([1], 4, salt=3), TypeError),
        (lambda: kvbm.RequestSequence([1], -1), kvbm.InvalidArgumentError),
        (lambda: kvbm.block_hashes([1, 2], 0), kvbm.InvalidArgumentError),
        (lambda: kvbm.Scheduler(0), kvbm.InvalidArgumentError),
    ],
)
def test_bad_arguments(call, error):
    with pytest.raises(error):
        call()


def test_pool_misuse():
    pool = kvbm.BlockPool(8, 4)
    with pytest.raises(kvbm.PoolExhaustedError, match="only has 8"):
        pool.allocate(9)
    with pytest.raises(kvbm.PoolExhaustedError):
        pool.allocate(2**62)
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.allocate(-1)
    blocks = pool.allocate(8)
    with pytest.raises(kvbm.PoolExhaustedError, match="only 0 are available"):
        pool.allocate(1)

    # Freeing twice, or a block never allocated: refused, nothing released.
    pool.release(blocks[:1])
    with pytest.raises(kvbm.PoolError, match="not held"):
        pool.release(blocks[:1])
    with pytest.raises(kvbm.PoolError):
        pool.release([blocks[1], blocks[1]])
    assert pool.ref_count(blocks[1]) == 1
    with pytest.raises(kvbm.PoolError):
        pool.release([1000])
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.release([-1])

    # Registering: wrong counts, unallocated blocks, malformed hashes.
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.register(blocks[1:3], [1])
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.register(blocks[1:3], tokens=[1, 2, 3])
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.register(blocks[1:2])
    with pytest.raises(kvbm.PoolError, match="not an allocated"):
        pool.register(blocks[:1], [1])
    with pytest.raises(kvbm.InvalidArgumentError, match="listed twice"):
        pool.register([blocks[1], blocks[1]], [1, 2])
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.register(blocks[1:2], [2**128])
    with pytest.raises(kvbm.InvalidArgumentError):
        pool.register(blocks[1:2], [-1])
    with pytest.raises(kvbm.InvalidArgumentError, match="16 bytes"):
        pool.register(blocks[1:2], b"\x00" * 15)
    with pytest.raises(TypeError):
        pool.register(blocks[1:2], "0123")
    with pytest.raises(kvbm.InvalidArgumentError, match="position"):
        pool.register(blocks[1:2], [5], parent=4)
    with pytest.raises(kvbm.InvalidArgumentError, match="parent"):
        pool.register(blocks[1:2], [5], position=3)
    # Every refusal above left the blocks allocated and unregistered.
    assert pool.register(blocks[1:2], [5]) == blocks[1:2]
    assert pool.audit()["total_blocks"] == 8

    with pytest.raises(kvbm.PoolError, match="events=True"):
        pool.take_events()


def test_blocks_of_one_pool_mean_nothing_to_another():
    a = kvbm.BlockPool(4, 4)
    b = kvbm.BlockPool(4, 4)
    ids = a.allocate(2)
    with pytest.raises(kvbm.PoolError):
        b.release(ids)
    with pytest.raises(kvbm.PoolError):
        b.register(ids, [1, 2])
    del a  # its blocks are freed with it; the ids are just ints now
    with pytest.raises(kvbm.PoolError):
        b.release(ids)


def test_a_request_sequence_refuses_a_second_pool():
    a = kvbm.BlockPool(8, 4)
    b = kvbm.BlockPool(8, 4)
    seq = kvbm.RequestSequence(list(range(8)), 4, 4)
    seq.allocate_for(a)
    with pytest.raises(kvbm.SequenceError, match="different block manager"):
        seq.allocate_blocks(1, b)
    with pytest.raises(kvbm.SequenceError):
        seq.reacquire(a)  # still holds blocks
    mismatched = kvbm.BlockPool(8, 8)
    fresh = kvbm.RequestSequence([1, 2, 3], 1, 4)
    with pytest.raises(kvbm.SequenceError, match="8-token blocks"):
        fresh.match_prefix(mismatched)
    with pytest.raises(kvbm.PoolExhaustedError):
        fresh.allocate_blocks(100, a)
    with pytest.raises(TypeError):
        fresh.match_prefix("pool")


def test_a_pool_too_large_for_the_machine_is_refused_not_fatal():
    # 4 billion blocks: within what a block id addresses, beyond any memory.
    with pytest.raises(kvbm.InvalidArgumentError, match="out of memory"):
        kvbm.BlockPool(2**32 - 2)
    with pytest.raises(kvbm.InvalidArgumentError, match="out of memory"):
        kvbm.Scheduler(2**32 - 2)
