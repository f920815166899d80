"""vLLM 0.33's own Scheduler and kvbm's on the same all-at-once replay, in
the same run: the cost of a scheduled request-step on each side, and their
ratio, measured within minutes of each other on the same machine (these
machines' speed varies from hour to hour, and a figure measured on one day
says little about another's).

Usage: vllm_step_cost.py TRACE --tests-root SDIST --kvbm-sim BINARY
           [--requests N] [--kvbm-runs R]

vLLM's side: its Scheduler as its own test helper builds it
(`tests/v1/core/utils.py:create_scheduler` from the sdist at SDIST, the
fake OPT-125m config, no model), with the settings of the README's
all-at-once command: 187,500 blocks of 16 tokens with prefix caching, 256
running requests, 8,192 tokens per step. Every request of the trace's
first N (all by default) is added before the first step: a prompt from its
`hash_ids` (512 tokens per id, cut to `input_length`, as `trace_workload`
builds them) and `output_length` decodes, EOS ignored. Each step runs
`schedule()`, a stand-in model runner (every request whose prompt is
computed samples one token) and `update_from_output()`; the time of the
two calls is summed, as vLLM's figure in the README times them.

kvbm's side: `kvbm-sim serve` with the README's all-at-once command, R
times before vLLM's run and R times after it; `scheduler_ms` is the time
in the same calls (the scheduler's step loop), `replay_ms` the whole
replay.

Both sides must do the same work: their steps within 1% and their token
hit rates within half a point, or the script exits non-zero.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import trace_workload
from check_vllm_pool import make_requests, timed_step

BLOCK_SIZE = 16
BLOCKS = 187_500
MAX_RUNNING = 256
TOKEN_BUDGET = 8192
# Far above the trace's longest prompt (126,195 tokens) and output (2,000).
MAX_PROMPT = 1 << 20
MAX_DECODES = 1 << 20
# Token ids `(id * 7919 + offset) % VOCAB + 1`: below 2^31 for every trace
# id below 271,000, so no two ids give the same tokens (with a smaller
# vocabulary, ids a multiple of it apart would share blocks kvbm's never
# do). The scheduler reads ids, never a vocabulary.
VOCAB = 1 << 31


def kvbm_run(binary, trace, requests):
    """One `kvbm-sim serve` run of the README's all-at-once command: its
    JSON report."""
    command = [
        binary, "serve", "--trace", trace,
        "--block-size", str(BLOCK_SIZE),
        "--capacity-blocks", str(BLOCKS),
        "--max-running", str(MAX_RUNNING),
        "--token-budget", str(TOKEN_BUDGET),
        "--chunk-size", str(TOKEN_BUDGET),
        "--watermark-blocks", "0",
        "--step-ms", "100000",
        "--json",
    ]
    if requests:
        command += ["--limit", str(requests)]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def vllm_run(tests_root, work):
    """vLLM's Scheduler over `work`, all queued at once: (steps, scheduled
    request-steps, seconds in `schedule()` + `update_from_output()`,
    prefix-cache hit tokens at each request's first scheduling, prompt
    tokens)."""
    # Prompts longer than the fake OPT config's 2,048 positions: nothing
    # runs a model, the scheduler only needs max_model_len to hold them.
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    sys.path.insert(0, tests_root)
    from tests.v1.core.utils import create_scheduler

    longest = max(len(tokens) + decodes for decodes, tokens in work)
    scheduler = create_scheduler(
        model="facebook/opt-125m",
        max_num_seqs=MAX_RUNNING,
        max_num_batched_tokens=TOKEN_BUDGET,
        enable_prefix_caching=True,
        num_blocks=BLOCKS,
        block_size=BLOCK_SIZE,
        max_model_len=longest + BLOCK_SIZE,
        skip_tokenizer_init=True,
    )
    for request in make_requests(work):
        scheduler.add_request(request)
    steps = request_steps = hit_tokens = 0
    seen = set()
    spent = 0.0
    while scheduler.has_unfinished_requests():
        step_spent, output, _ = timed_step(scheduler)
        spent += step_spent
        steps += 1
        request_steps += len(output.num_scheduled_tokens)
        for new in output.scheduled_new_reqs:
            if new.req_id not in seen:
                seen.add(new.req_id)
                hit_tokens += new.num_computed_tokens
        if steps > 1_000_000:
            raise SystemExit("vLLM made no progress after 1,000,000 steps")
    prompt_tokens = sum(len(tokens) for _, tokens in work)
    return steps, request_steps, spent, hit_tokens, prompt_tokens


def per_step_us(report, field):
    return report[field] * 1e3 / report["scheduled_requests"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--tests-root", required=True)
    parser.add_argument("--kvbm-sim", required=True)
    parser.add_argument("--requests", type=int, default=0)
    parser.add_argument("--kvbm-runs", type=int, default=2)
    args = parser.parse_args()

    ours = [kvbm_run(args.kvbm_sim, args.trace, args.requests) for _ in range(args.kvbm_runs)]
    count = args.requests or sum(1 for _ in open(args.trace))
    work = trace_workload.workload(
        args.trace, count, max_prompt=MAX_PROMPT, max_decodes=MAX_DECODES, vocab=VOCAB
    )
    began = time.perf_counter()
    steps, request_steps, spent, hits, prompt_tokens = vllm_run(args.tests_root, work)
    wall = time.perf_counter() - began
    ours += [kvbm_run(args.kvbm_sim, args.trace, args.requests) for _ in range(args.kvbm_runs)]

    theirs_us = spent * 1e6 / request_steps
    theirs_rate = hits / prompt_tokens
    print(
        f"{len(work)} requests queued at once, {BLOCKS} blocks of {BLOCK_SIZE} tokens, "
        f"{MAX_RUNNING} running, {TOKEN_BUDGET} tokens a step"
    )
    print(
        f"  vLLM 0.33 Scheduler: {steps} steps, {request_steps} request-steps, "
        f"token hit rate {theirs_rate:.2%}; schedule() + update_from_output() "
        f"{spent:.1f} s, {theirs_us:.2f} us per request-step ({wall:.0f} s in all)"
    )
    scheduler_us = [per_step_us(r, "scheduler_ms") for r in ours]
    replay_us = [per_step_us(r, "replay_ms") for r in ours]
    for when, report in zip(["before"] * args.kvbm_runs + ["after"] * args.kvbm_runs, ours):
        print(
            f"  kvbm Scheduler ({when}): {report['steps']} steps, "
            f"{report['scheduled_requests']} request-steps, token hit rate "
            f"{report['token_hit_rate']:.2%}; scheduler {per_step_us(report, 'scheduler_ms'):.3f} "
            f"us, replay {per_step_us(report, 'replay_ms'):.3f} us per request-step"
        )
    print(
        f"  vLLM / kvbm per request-step: {theirs_us / max(scheduler_us):.0f}-"
        f"{theirs_us / min(scheduler_us):.0f}x in the scheduler's calls "
        f"(median {theirs_us / statistics.median(scheduler_us):.0f}x), "
        f"{theirs_us / max(replay_us):.0f}-{theirs_us / min(replay_us):.0f}x "
        f"against the whole replay"
    )
    report = ours[0]
    if abs(report["steps"] - steps) > 0.01 * steps:
        print(f"the steps differ: vLLM {steps}, kvbm {report['steps']}", file=sys.stderr)
        return 1
    if abs(report["token_hit_rate"] - theirs_rate) > 0.005:
        print(
            f"the hit rates differ: vLLM {theirs_rate:.4f}, kvbm {report['token_hit_rate']:.4f}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
