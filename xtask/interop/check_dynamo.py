"""Publishes known KV event streams from kvbm's publisher to NVIDIA Dynamo's
standalone indexer (ai-dynamo-runtime, `python -m dynamo.indexer`) and checks
the overlap it reports per worker.

Usage: check_dynamo.py PUBLISH_STREAM_BINARY

Run by `cargo xtask dynamo-interop`, which installs the pinned
ai-dynamo-runtime into a virtualenv under target/ and builds the binary
(`kvbm-events` example `publish_stream`). The indexer hashes each stored
block's token_ids itself to answer queries and links blocks through the
engine's block hashes, so the tokens, block size and parent chain must be
right, not just the framing.
"""

import json
import socket
import subprocess
import sys
import time
import urllib.request

BLOCK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, tokens):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/query",
        data=json.dumps({"token_ids": tokens, "model_name": "default"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        scores = json.load(response)["scores"]
    return {worker: ranks.get("0", 0) for worker, ranks in scores.items()}


def wait_for_http(port, deadline):
    while time.time() < deadline:
        try:
            query(port, [0])
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the indexer never answered")


def main(binary):
    http, p1, p2 = free_port(), free_port(), free_port()
    indexer = subprocess.Popen(
        [sys.executable, "-m", "dynamo.indexer", "--block-size", str(BLOCK), "--port", str(http),
         "--workers", f"1=tcp://127.0.0.1:{p1},2=tcp://127.0.0.1:{p2}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(http, time.time() + 30)
        # Worker 1 stores 4 blocks of the prompt 0..64 and then removes the
        # last one; worker 2 stores the first 2.
        runs = [
            subprocess.Popen([binary, f"tcp://127.0.0.1:{p1}", "4", str(BLOCK), "20000", "1000", "1"]),
            subprocess.Popen([binary, f"tcp://127.0.0.1:{p2}", "2", str(BLOCK), "20000", "1000", "0"]),
        ]
        for run in runs:
            if run.wait(timeout=60) != 0:
                raise SystemExit(f"publisher failed: {run.args}")
        expectations = [
            (list(range(64)), {"1": 48, "2": 32}),
            (list(range(40)), {"1": 32, "2": 32}),
            (list(range(16)), {"1": 16, "2": 16}),
            (list(range(1000, 1064)), {}),
        ]
        deadline = time.time() + 20
        while True:
            results = [query(http, tokens) for tokens, _ in expectations]
            if all(got == want for got, (_, want) in zip(results, expectations)):
                break
            if time.time() > deadline:
                for got, (tokens, want) in zip(results, expectations):
                    print(f"query of {len(tokens)} tokens from {tokens[0]}: got {got}, want {want}")
                raise SystemExit("Dynamo's indexer does not report the expected overlaps")
            time.sleep(0.2)
        print("Dynamo's indexer reports the expected overlap for every worker and query")
    finally:
        indexer.terminate()
        indexer.wait(timeout=10)


if __name__ == "__main__":
    main(sys.argv[1])
