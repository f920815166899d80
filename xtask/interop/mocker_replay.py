"""Replays a Mooncake-format trace through NVIDIA Dynamo's cluster simulator
(the mocker in ai-dynamo-runtime) and prints its summary as one JSON line.

Usage: mocker_replay.py TRACE ROUTER_MODE [WORKERS]

ROUTER_MODE is the mocker's: `kv_router` or `round_robin`. Run by
`cargo xtask mocker-compare`, which installs the pinned ai-dynamo-runtime
into the virtualenv under target/ (the dynamo-interop gate's) and sets
DYN_LOG=warn. The mocker's engines use its defaults (block size 64,
16,384 blocks per worker); the trace's hash ids stand for 512 tokens.
"""

import json
import sys
import time

import dynamo._core as core


def main():
    trace, mode = sys.argv[1], sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    started = time.perf_counter()
    result = core.run_mocker_trace_replay(
        [trace], num_workers=workers, router_mode=mode, trace_block_size=512
    )
    elapsed = time.perf_counter() - started
    summary = result.summary
    print(
        json.dumps(
            {
                "router_mode": mode,
                "workers": workers,
                "wall_time_ms": summary["wall_time_ms"],
                "call_ms": elapsed * 1e3,
                "completed_requests": summary["completed_requests"],
                "prefix_cache_reused_ratio": summary["prefix_cache_reused_ratio"],
                "mean_ttft_ms": summary["mean_ttft_ms"],
            }
        )
    )


if __name__ == "__main__":
    main()
