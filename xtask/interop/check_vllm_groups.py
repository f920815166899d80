"""vLLM 0.33's own KV cache manager against kvbm's GroupedSequence, for a
model of a full-attention group and a sliding-window group (window 128,
block 16): the same requests, one after another, must get the same
prefix-cache hits, and each group must hold the same blocks once a
request's prefill is allocated and once its decodes are.

Usage: check_vllm_groups.py TRACE GROUPS_REPLAY [--requests N] [--blocks B]

TRACE is a Mooncake-format JSONL trace; each request's prompt is built from
its `hash_ids` (512 tokens per id, a token a function of the id and its
offset, cut to `input_length`), and it decodes `min(output_length, 16)`
tokens. GROUPS_REPLAY is kvbm-schedule's `groups_replay` example binary.
Exits non-zero on the first difference, printing both sides.
"""

import argparse
import subprocess
import sys
import tempfile

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

import trace_workload

BLOCK_SIZE = 16
WINDOW = 128
MAX_PROMPT = 16384
MAX_DECODES = 16


def workload(trace, count):
    return trace_workload.workload(
        trace, count, max_prompt=MAX_PROMPT, max_decodes=MAX_DECODES, vocab=100_000
    )


def vllm_side(requests, num_blocks):
    init_none_hash(sha256)
    spec = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    config = KVCacheConfig(
        # vLLM's block 0 is its null block: one more keeps the pools equal.
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(**spec)),
            KVCacheGroupSpec(["window"], SlidingWindowSpec(**spec, sliding_window=WINDOW)),
        ],
    )
    manager = KVCacheManager(
        config,
        max_model_len=MAX_PROMPT + MAX_DECODES + 1,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
    )
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)

    def held(request):
        return [
            sum(1 for block in m.req_to_blocks.get(request.request_id, []) if not block.is_null)
            for m in manager.coordinator.single_type_managers
        ]

    def in_use():
        return num_blocks - manager.block_pool.get_num_free_blocks()

    rows = []
    for rid, (decodes, tokens) in enumerate(requests):
        request = Request(
            str(rid), tokens, SamplingParams(max_tokens=decodes + 1), None, block_hasher=hasher
        )
        blocks, hit, _ = manager.get_computed_blocks(request)
        new = request.num_tokens - hit
        if manager.allocate_slots(request, new, hit, blocks) is None:
            sys.exit(f"vLLM could not allocate request {rid}")
        prefill = held(request)
        used = in_use()
        request.num_computed_tokens = request.num_tokens
        for _ in range(decodes):
            request.append_output_token_ids(7)
            if manager.allocate_slots(request, 1) is None:
                sys.exit(f"vLLM could not allocate a decode of request {rid}")
            request.num_computed_tokens += 1
        decode = held(request)
        manager.free(request)
        rows.append([hit, *prefill, *decode, used])
    return rows


def kvbm_side(requests, num_blocks, binary):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as file:
        file.write(f"{BLOCK_SIZE} {num_blocks} {WINDOW}\n")
        for decodes, tokens in requests:
            file.write(" ".join(map(str, [decodes, *tokens])) + "\n")
        file.flush()
        out = subprocess.run([binary, file.name], check=True, capture_output=True, text=True)
    return [list(map(int, line.split())) for line in out.stdout.splitlines()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("binary")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=200_000)
    args = parser.parse_args()
    requests = workload(args.trace, args.requests)
    theirs = vllm_side(requests, args.blocks)
    ours = kvbm_side(requests, args.blocks, args.binary)
    names = "hit prefill_full prefill_window decode_full decode_window in_use".split()
    hits = sum(row[0] for row in theirs)
    for rid, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            print(f"request {rid} differs:")
            for name, x, y in zip(names, a, b):
                print(f"  {name:15} vLLM {x:>8}  kvbm {y:>8}{'  <--' if x != y else ''}")
            sys.exit(1)
    if len(theirs) != len(ours):
        sys.exit(f"{len(theirs)} vLLM rows, {len(ours)} kvbm rows")
    print(
        f"vLLM 0.33 and kvbm agree on {len(theirs)} requests: {hits} hit tokens, "
        f"every group's blocks after prefill and after decode, blocks in use"
    )


if __name__ == "__main__":
    main()
