"""What a call from Python into kvbm costs, per call and per block.

Run it against an installed wheel (a release build):

    python crates/kvbm-py/bench/crossing.py

Each line is the best of several timed runs. "per item" divides by the
blocks (or requests) the call handles. Not part of CI: the numbers depend
on the machine and its load.
"""

import array
import time

import kvbm

BLOCK = 16
RUNS = 5


def best_ns(fn, loops):
    """The best per-call time of `fn` over RUNS runs of `loops` calls."""
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / loops)
    return best


def row(name, items, ns):
    per_item = f"{ns / items:10.1f}" if items > 1 else " " * 10
    print(f"{name:<44} {items:>6} {ns:12.0f} {per_item}")


def loops_for(items):
    return max(20, 20_000 // max(items, 1))


def main():
    print(f"kvbm {kvbm.__version__}: crossing costs (ns)\n")
    print(f"{'call':<44} {'items':>6} {'per call':>12} {'per item':>10}")

    def noop():
        pass

    row("python: an empty function (baseline)", 1, best_ns(noop, 200_000))

    pool = kvbm.BlockPool(8192, BLOCK)
    row("BlockPool.num_blocks (property)", 1, best_ns(lambda: pool.num_blocks, 200_000))
    row("BlockPool.ref_count(id)", 1, best_ns(lambda: pool.ref_count(0), 200_000))

    # One long cached chain to match prefixes of.
    longest = 1024
    tokens = list(range(longest * BLOCK))
    seq = kvbm.Sequence(tokens, BLOCK)
    ids = pool.allocate(longest)
    pool.register(ids, seq)
    pool.release(ids)

    for n in (1, 16, 128, 1024):
        prefix = kvbm.Sequence(tokens[: n * BLOCK], BLOCK)
        as_ints = prefix.hashes
        as_bytes = prefix.packed_hashes
        for label, hashes in (("ints", as_ints), ("bytes", as_bytes), ("Sequence", prefix)):
            loops = loops_for(n)
            matched = []

            def match():
                matched.append(pool.match_prefix(hashes))

            ns = best_ns(match, loops)
            row(f"BlockPool.match_prefix ({label})", n, ns)
            for held in matched:
                pool.release(held)
        # A request's blocks given back in one call.
        held = [pool.match_prefix(as_bytes) for _ in range(loops_for(n) * RUNS)]
        it = iter(held)
        row("BlockPool.release (a request's blocks)", n, best_ns(lambda: pool.release(next(it)), loops_for(n)))
        for rest in it:
            pool.release(rest)

    for n in (1, 16, 128):
        def cycle():
            pool.release(pool.allocate(n))

        row("BlockPool.allocate + release", n, best_ns(cycle, loops_for(n)))

    for n in (1, 16, 128):
        fresh = kvbm.Sequence(list(range(10**6, 10**6 + n * BLOCK)), BLOCK)
        fresh_hashes = fresh.packed_hashes

        def register():
            got = pool.allocate(n)
            pool.register(got, fresh_hashes)
            pool.release(got)
            pool.clear_cache()

        row("allocate + register + release + clear_cache", n, best_ns(register, loops_for(n)))

    for n in (1, 16, 128, 1024):
        chunk = tokens[: n * BLOCK]
        row("kvbm.block_hashes (per block of 16 tokens)", n, best_ns(lambda: kvbm.block_hashes(chunk, BLOCK), loops_for(n)))
        row("kvbm.Sequence(tokens) (per block)", n, best_ns(lambda: kvbm.Sequence(chunk, BLOCK), loops_for(n)))
        packed = array.array("I", chunk)
        row("kvbm.Sequence(array('I')) (per block)", n, best_ns(lambda: kvbm.Sequence(packed, BLOCK), loops_for(n)))
        prefix = kvbm.Sequence(chunk, BLOCK)
        row("Sequence.hashes (ints out, per block)", n, best_ns(lambda: prefix.hashes, loops_for(n)))
        row("Sequence.packed_hashes (bytes out)", n, best_ns(lambda: prefix.packed_hashes, loops_for(n)))

    # The per-block loop the one-call API replaces: a lookup per block.
    n = 128
    prefix = kvbm.Sequence(tokens[: n * BLOCK], BLOCK)
    singles = [[h] for h in prefix.hashes]

    def per_block():
        for one in singles:
            pool.contains(one)

    row("BlockPool.contains, one call per block", n, best_ns(per_block, 50))
    row("BlockPool.contains, one call for all", n, best_ns(lambda: pool.contains(prefix), 2000))

    # A scheduler in steady decode: one step() + apply() per engine step.
    for running in (1, 16, 128, 256):
        scheduler = kvbm.Scheduler(32768, BLOCK, max_running=running, token_budget=8192)
        for i in range(running):
            scheduler.submit(i, tokens[i * 64 : i * 64 + 128], 1_000_000)
        while True:  # until every request decodes
            plan = scheduler.step()
            scheduler.apply(plan.sample_all(7))
            if len(plan.decode) == running:
                break

        def step():
            plan = scheduler.step()
            scheduler.apply(plan.sample_all(7))

        row("Scheduler.step + sample_all + apply", running, best_ns(step, max(20, 2000 // running)))

        outputs = {i: 7 for i in range(running)}

        def step_prebuilt():
            scheduler.step()
            scheduler.apply(outputs)

        row("Scheduler.step + apply (outputs prebuilt)", running, best_ns(step_prebuilt, max(20, 2000 // running)))

        def step_with_slots():
            plan = scheduler.step()
            scheduler.slot_mapping(plan)
            scheduler.apply(outputs)

        row("Scheduler.step + slot_mapping + apply", running, best_ns(step_with_slots, max(20, 2000 // running)))

    vllm_pool_rows()


class _Block:
    """The attributes of vLLM's KVCacheBlock (kvbm.VllmBlockPool's blocks)."""

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "_block_hash_num_tokens", "is_null")

    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash = None
        self._block_hash_num_tokens = None
        self.is_null = False


def vllm_pool_rows():
    """kvbm.VllmBlockPool (kvbm.vllm's pool state), on stand-in blocks."""
    for n in (1, 16, 128, 1024):
        blocks = [_Block(i) for i in range(n + 1)]
        pool = kvbm.VllmBlockPool(blocks)
        hashes = [i.to_bytes(32, "little") for i in range(n)]
        loops = loops_for(n)

        def cycle():
            got = pool.get_new_blocks(n)  # evicts the blocks cached last time
            pool.cache_full_blocks(got, hashes, 0, n, BLOCK, 0)
            pool.free_blocks(reversed(got))

        row("VllmBlockPool get_new+cache_full+free", n, best_ns(cycle, loops))
        row(
            "VllmBlockPool.find_longest_cache_hit",
            n,
            best_ns(lambda: pool.find_longest_cache_hit(hashes, [0], n), loops),
        )

        def per_block():
            for block_hash in hashes:
                if not pool.get_cached_block(block_hash, [0]):
                    break

        row("VllmBlockPool.get_cached_block per block", n, best_ns(per_block, loops))


if __name__ == "__main__":
    main()
