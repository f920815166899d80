"""vLLM 0.33's Scheduler with kvbm's block pool (kvbm.vllm.KvbmBlockPool)
and with its own, on the same trace, step for step, timed interleaved.

Usage: check_vllm_pool.py prepare DIR
       check_vllm_pool.py trace TRACE --tests-root SDIST [--requests N]
           [--blocks B] [--max-num-seqs S]
       check_vllm_pool.py junit BASELINE.xml KVBM.xml [--excluded N]

`prepare`: vLLM 0.33.0's source distribution from PyPI (its tests are not
in the wheel), checked against its sha256 and unpacked once under
DIR/vllm-0.33.0; and DIR/hf, a Hugging Face cache holding only the
`facebook/opt-125m` config.json vLLM's tests name (OPT-125m's published
shape, no weights, no tokenizer), for `HF_HOME` with `HF_HUB_OFFLINE=1`.

`trace`: two Schedulers, built by vLLM's own test helper
(`tests/v1/core/utils.py:create_scheduler` from the sdist at SDIST: the
small fake OPT model config, one full-attention group of 16-token blocks,
prefix caching on), get the first N requests of TRACE at once (all-at-once
replay: a prompt from each request's `hash_ids`, 512 tokens per id, cut to
`input_length` and 8,000 tokens; `min(output_length, 64)` decodes, EOS
ignored). Each step runs `schedule()` then `update_from_output()` (every
request whose prompt is computed samples one token, a function of its id
and length) on both, alternating which goes first; the scheduled requests,
their tokens and blocks, each new request's prefix-cache hit, the finished
and preempted requests and the free blocks must be equal, or the script
exits non-zero at the first difference. It prints the time of
`schedule()` + `update_from_output()` per step on each side; then, in a
run of its own with each pool, the share of that time spent in the
pool's entry points and the lookup loop (with vLLM's pool: the bound on the
speed-up any drop-in for them can give), and in a last run the share of
vLLM's whole `KVCacheManager`.

`junit`: vLLM's tests run with vLLM's pool (BASELINE) and with kvbm's
(KVBM): every test that passes with vLLM's pool must pass with kvbm's.
Tests that fail with vLLM's own pool here (a model config not available
offline, say) are counted, not compared.
"""

import argparse
import json
import os
import statistics
import sys
import time
import xml.etree.ElementTree as ET

import trace_workload

MAX_PROMPT = 8000
MAX_DECODES = 64
BLOCK_SIZE = 16


def workload(trace, count):
    return trace_workload.workload(
        trace, count, max_prompt=MAX_PROMPT, max_decodes=MAX_DECODES, vocab=50_000
    )


def make_requests(work):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    requests = []
    for i, (decodes, tokens) in enumerate(work):
        params = SamplingParams(ignore_eos=True, max_tokens=decodes)
        params.update_from_generation_config({}, 50256)
        requests.append(
            Request(
                request_id=str(i),
                prompt_token_ids=list(tokens),
                sampling_params=params,
                pooling_params=None,
                block_hasher=hasher,
            )
        )
    return requests


def engine_outputs(outputs):
    """The requests' new tokens, finish reasons and prefix-cache hits
    (`prefill_stats.num_local_cached_tokens`), as `update_from_output`
    reported them."""
    rows = []
    for client in outputs.values():
        for out in client.outputs:
            rows.append(
                (
                    out.request_id,
                    tuple(out.new_token_ids),
                    str(out.finish_reason),
                    out.prefill_stats.num_local_cached_tokens
                    if out.prefill_stats is not None
                    else None,
                )
            )
    return sorted(rows)


def digest(output, scheduler):
    """What a step decided, in comparable form."""
    new = sorted(
        (r.req_id, r.num_computed_tokens, tuple(map(tuple, r.block_ids)))
        for r in output.scheduled_new_reqs
    )
    cached = output.scheduled_cached_reqs
    cached_rows = sorted(
        zip(
            cached.req_ids,
            cached.num_computed_tokens,
            [None if b is None else tuple(map(tuple, b)) for b in cached.new_block_ids],
        )
    )
    return {
        "scheduled": sorted(output.num_scheduled_tokens.items()),
        "new": new,
        "cached": cached_rows,
        "finished": sorted(output.finished_req_ids),
        "preempted": sorted(getattr(output, "preempted_req_ids", None) or ()),
        "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
    }


def runner_output(output, scheduler):
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        if request.num_computed_tokens >= request.num_tokens:
            sampled.append([(int(req_id) * 7919 + request.num_tokens) % 50_000 + 1])
        else:
            sampled.append([])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def trace_main(args):
    # Prompts longer than the fake OPT config's 2,048 positions: nothing
    # runs a model, the scheduler only needs max_model_len to hold them.
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    sys.path.insert(0, args.tests_root)
    import kvbm.vllm
    from tests.v1.core.utils import create_scheduler

    def build():
        return create_scheduler(
            model="facebook/opt-125m",
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=8192,
            enable_prefix_caching=True,
            num_blocks=args.blocks,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_PROMPT + MAX_DECODES + BLOCK_SIZE,
            skip_tokenizer_init=True,
        )

    kvbm.vllm.uninstall()
    theirs = build()
    kvbm.vllm.install()
    ours = build()
    pool = ours.kv_cache_manager.block_pool
    assert isinstance(pool, kvbm.vllm.KvbmBlockPool), type(pool)
    assert not isinstance(theirs.kv_cache_manager.block_pool, kvbm.vllm.KvbmBlockPool)

    work = workload(args.trace, args.requests)
    for request in make_requests(work):
        theirs.add_request(request)
    for request in make_requests(work):
        ours.add_request(request)

    sides = {"vllm": theirs, "kvbm": ours}
    times = {"vllm": [], "kvbm": []}
    hits = {"vllm": 0, "kvbm": 0}
    steps = 0
    finished = 0
    preempted = 0
    while theirs.has_unfinished_requests() or ours.has_unfinished_requests():
        order = ("vllm", "kvbm") if steps % 2 == 0 else ("kvbm", "vllm")
        seen = {}
        for name in order:
            scheduler = sides[name]
            # Each side with its own lookup: vLLM's loop, or kvbm's call.
            if name == "kvbm":
                kvbm.vllm.install()
            else:
                kvbm.vllm.uninstall()
            spent, output, reported = timed_step(scheduler)
            times[name].append(spent)
            seen[name] = digest(output, scheduler)
            seen[name]["outputs"] = engine_outputs(reported)
            hits[name] += sum(r[1] for r in seen[name]["new"])
        if seen["vllm"] != seen["kvbm"]:
            print(f"step {steps}: the schedulers disagree", file=sys.stderr)
            for key in seen["vllm"]:
                if seen["vllm"][key] != seen["kvbm"][key]:
                    print(f"  {key}:", file=sys.stderr)
                    print(f"    vllm: {seen['vllm'][key]}", file=sys.stderr)
                    print(f"    kvbm: {seen['kvbm'][key]}", file=sys.stderr)
            return 1
        finished += sum(1 for row in seen["vllm"]["outputs"] if row[2] != "None")
        preempted += len(seen["vllm"]["preempted"])
        steps += 1
        if steps > 100_000:
            print("no progress after 100,000 steps", file=sys.stderr)
            return 1
    kvbm.vllm.uninstall()
    if finished != len(work):
        print(f"{finished} of {len(work)} requests finished", file=sys.stderr)
        return 1

    print(
        f"(a) {len(work)} trace requests, {steps} steps, {args.blocks} blocks of "
        f"{BLOCK_SIZE} tokens, max_num_seqs {args.max_num_seqs}: every step the same "
        f"scheduled requests, tokens, blocks, prefix-cache hits ({hits['kvbm']} tokens "
        f"hit), finished and preempted requests ({preempted} preemptions), free blocks"
    )
    print("(c) schedule() + update_from_output() per step, interleaved:")
    for name in ("vllm", "kvbm"):
        t = times[name]
        print(
            f"    {name + ' pool':<10} mean {statistics.fmean(t) * 1e6:8.1f} us  "
            f"median {statistics.median(t) * 1e6:8.1f} us  "
            f"p90 {sorted(t)[int(len(t) * 0.9)] * 1e6:8.1f} us  "
            f"total {sum(t) * 1e3:8.1f} ms"
        )
    ratio = sum(times["vllm"]) / sum(times["kvbm"])
    print(f"    vLLM's pool / kvbm's pool, total time: {ratio:.2f}x")
    kvbm.vllm.uninstall()
    pool_share(build(), work, "vLLM's")
    kvbm.vllm.install()
    pool_share(build(), work, "kvbm's")
    kvbm.vllm.uninstall()
    manager_share(build(), work)
    return 0


# What a replacement of vLLM's pool and of its lookup loop can replace: the
# entry points its KV cache managers call (the lookup loop calls
# `get_cached_block` inside `find_longest_cache_hit`, counted once).
POOL_ENTRY_POINTS = (
    "get_cached_block",
    "cache_full_blocks",
    "get_new_blocks",
    "touch",
    "free_blocks",
    "evict_blocks",
    "get_num_free_blocks",
    "get_usage",
    "take_events",
)


class EntryTimer:
    """Time spent inside wrapped calls, outermost calls only (a
    perf_counter pair each, not a profiler, whose per-call cost would
    inflate many small calls)."""

    def __init__(self):
        self.spent = 0.0
        self.depth = 0

    def wrap(self, call):
        def wrapper(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.spent += time.perf_counter() - start

        return wrapper


def timed_step(scheduler):
    """One step: the time of `schedule()` + `update_from_output()` (not of
    the stand-in model runner between them), the scheduler output and what
    `update_from_output` reported."""
    start = time.perf_counter()
    output = scheduler.schedule()
    middle = time.perf_counter()
    result = runner_output(output, scheduler)
    resume = time.perf_counter()
    reported = scheduler.update_from_output(output, result)
    end = time.perf_counter()
    return (middle - start) + (end - resume), output, reported


def timed_run(scheduler, work):
    """The time of `schedule()` + `update_from_output()` of a whole run."""
    for request in make_requests(work):
        scheduler.add_request(request)
    total = 0.0
    steps = 0
    while scheduler.has_unfinished_requests() and steps <= 100_000:
        total += timed_step(scheduler)[0]
        steps += 1
    return total


def print_share(what, timer, total):
    share = timer.spent / total
    print(
        f"    {what}, timed at their entry points in a run of their own: "
        f"{timer.spent * 1e3:.1f} of {total * 1e3:.1f} ms ({share:.1%}); without "
        f"them the step would be at most {1 / (1 - share):.2f}x faster"
    )


def pool_share(scheduler, work, name):
    """Runs vLLM's Scheduler with the pool it was built with (`name`) once
    more, timing the pool's entry points and the lookup loop, and prints
    their share of `schedule()` + `update_from_output()`. With vLLM's pool
    that bounds what any drop-in can reach: a pool and lookup that took no
    time at all could make the step at most total / (total - time spent in
    them) faster."""
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    timer = EntryTimer()
    pool = scheduler.kv_cache_manager.block_pool
    for entry in POOL_ENTRY_POINTS:
        setattr(pool, entry, timer.wrap(getattr(pool, entry)))
    lookup = FullAttentionManager.__dict__["find_longest_cache_hit"]
    FullAttentionManager.find_longest_cache_hit = classmethod(timer.wrap(lookup.__func__))
    try:
        total = timed_run(scheduler, work)
    finally:
        FullAttentionManager.find_longest_cache_hit = lookup
    print_share(f"{name} pool and lookup", timer, total)


def manager_share(scheduler, work):
    """As `pool_share`, for every method of vLLM's `KVCacheManager` (which
    calls the pool): what a replacement of the whole manager could gain."""
    import inspect

    timer = EntryTimer()
    manager = scheduler.kv_cache_manager
    methods = inspect.getmembers(type(manager), predicate=inspect.isfunction)
    for method, _ in methods:
        if not method.startswith("__"):
            setattr(manager, method, timer.wrap(getattr(manager, method)))
    print_share("vLLM's whole KVCacheManager", timer, timed_run(scheduler, work))


def outcomes(path):
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.attrib.get('classname', '')}::{case.attrib['name']}"
        if case.find("skipped") is not None:
            result[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        else:
            result[name] = "passed"
    return result


def junit_main(args):
    baseline = outcomes(args.baseline)
    ours = outcomes(args.kvbm)
    passing = {name for name, state in baseline.items() if state == "passed"}
    environment = {name for name, state in baseline.items() if state == "failed"}
    regressions = sorted(
        name for name in passing if name in ours and ours[name] != "passed"
    )
    missing = sorted(name for name in passing if name not in ours)
    both = sum(1 for name in passing if ours.get(name) == "passed")
    print(
        f"(b) vLLM's tests/v1/core/test_prefix_caching.py and test_scheduler.py: "
        f"{both} pass with kvbm's pool (of {len(passing)} that pass with vLLM's own "
        f"here); {args.excluded} excluded as asserting the Python pool's internals; "
        f"{len(environment)} fail with vLLM's own pool too in this environment "
        "(not compared)"
    )
    for name in regressions:
        print(f"    FAILS with kvbm's pool: {name}", file=sys.stderr)
    for name in missing:
        print(f"    did not run with kvbm's pool: {name}", file=sys.stderr)
    return 1 if regressions or missing else 0


SDIST_URL = (
    "https://files.pythonhosted.org/packages/f7/25/"
    "aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz"
)
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"

# facebook/opt-125m's config.json, as published (the shape only).
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "do_layer_norm_before": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "word_embed_proj_dim": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "torch_dtype": "float16",
    "use_cache": True,
}


def prepare_main(args):
    import hashlib
    import shutil
    import tarfile
    import urllib.request

    root = os.path.abspath(args.dir)
    os.makedirs(root, exist_ok=True)
    tests = os.path.join(root, "vllm-0.33.0", "tests")
    if not os.path.isdir(tests):
        archive = os.path.join(root, "vllm-0.33.0.tar.gz")
        if not os.path.exists(archive):
            partial = archive + ".part"
            with urllib.request.urlopen(SDIST_URL, timeout=300) as response:
                with open(partial, "wb") as out:
                    shutil.copyfileobj(response, out)
            os.replace(partial, archive)
        digest = hashlib.sha256()
        with open(archive, "rb") as data:
            for chunk in iter(lambda: data.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != SDIST_SHA256:
            os.remove(archive)
            print(f"{archive}: sha256 {digest.hexdigest()}, not {SDIST_SHA256}")
            return 1
        with tarfile.open(archive) as tar:
            # The tests, and the manifest with their pytest markers.
            members = [
                m
                for m in tar.getmembers()
                if m.name.startswith("vllm-0.33.0/tests/")
                or m.name == "vllm-0.33.0/pyproject.toml"
            ]
            tar.extractall(root, members=members, filter="data")
    revision = "0" * 40
    repo = os.path.join(root, "hf", "hub", "models--facebook--opt-125m")
    snapshot = os.path.join(repo, "snapshots", revision)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as ref:
        ref.write(revision)
    with open(os.path.join(snapshot, "config.json"), "w") as config:
        json.dump(OPT_125M, config)
    print(f"vLLM 0.33.0's tests in {tests}; Hugging Face cache in {root}/hf")
    return 0


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare")
    prepare.add_argument("dir")
    trace = commands.add_parser("trace")
    trace.add_argument("trace")
    trace.add_argument("--tests-root", required=True)
    trace.add_argument("--requests", type=int, default=500)
    trace.add_argument("--blocks", type=int, default=3000)
    trace.add_argument("--max-num-seqs", type=int, default=64)
    junit = commands.add_parser("junit")
    junit.add_argument("baseline")
    junit.add_argument("kvbm")
    junit.add_argument("--excluded", type=int, default=0)
    args = parser.parse_args()
    if args.command == "prepare":
        return prepare_main(args)
    if args.command == "trace":
        return trace_main(args)
    return junit_main(args)


if __name__ == "__main__":
    sys.exit(main())
