"""The simulator's replays: the command line's JSON reports, as dicts."""

import json
import os
import subprocess
import threading
import time

import pytest

import kvbm

# Keys that measure this run's wall time, not the replay.
TIMINGS = {"load_ms", "split_ms", "replay_ms", "scheduler_ms", "wall_ms"}


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_cache_replay_of_the_embedded_excerpt():
    report = kvbm.replay_cache()
    assert report["mode"] == "cache"
    assert report["trace"] == "embedded excerpt of the Mooncake conversation trace"
    # The README's numbers for `kvbm-sim` with no arguments.
    assert (report["requests"], report["input_blocks"], report["hit_blocks"]) == (500, 14162, 2283)
    assert report["evictions"] == 0
    bounded = kvbm.replay_cache(capacity_blocks=2000, eviction="lineage", block_size=256)
    assert bounded["capacity_blocks"] == 2000 and bounded["evictions"] > 0


def test_serve_replay_finishes_every_request():
    report = kvbm.replay_serve(limit=60, capacity_tokens=400_000, audit_every=50)
    assert report["mode"] == "serve"
    assert report["requests"] == 60 and report["finished_requests"] == 60
    assert report["ttft"]["count"] == 60
    assert 0 < report["ttft"]["p50_ms"] <= report["ttft"]["max_ms"]


def test_serve_replay_of_a_model_reports_its_groups():
    grouped = kvbm.replay_serve(limit=200, model="gpt-oss-120b", capacity_bytes="40G")
    full = kvbm.replay_serve(
        limit=200, model="gpt-oss-120b", capacity_bytes=40_000_000_000, full_attention_only=True
    )
    assert grouped["finished_requests"] == full["finished_requests"] == 200
    kinds = [(g["kind"], g["window"]) for g in grouped["kv_groups"]]
    assert kinds == [("full", None), ("sliding_window", 128)]
    assert [g["kind"] for g in full["kv_groups"]] == ["full"]
    # A window group holds about a window's blocks per request, so the
    # same bytes hold twice the blocks of half the layers each.
    assert grouped["capacity_blocks"] == 2 * full["capacity_blocks"]
    window = grouped["kv_groups"][1]["peak_blocks"]
    assert 0 < window < grouped["kv_groups"][0]["peak_blocks"]
    assert grouped["peak_kv_bytes"] <= 40_000_000_000


def test_serve_replay_of_a_model_with_a_host_tier_and_drafts():
    # 2 GB of GPU: prefixes are evicted, and come back from a host tier
    # holding twice the GPU's bytes (27,120 tokens of KV on the GPU).
    plain = kvbm.replay_serve(limit=150, model="gpt-oss-120b", capacity_bytes="2G")
    tiered = kvbm.replay_serve(
        limit=150, model="gpt-oss-120b", capacity_bytes="2G", host_tier_tokens=54_240,
        spec_tokens=2,
    )
    assert tiered["finished_requests"] == plain["finished_requests"]
    (host,) = tiered["tiers"]
    assert host["medium"] == "CPU" and host["capacity_blocks"] == 2 * 54_240 // 16
    assert tiered["onboarding"]["requests"] > 0
    assert tiered["spec_accepted_tokens"] > 0
    assert tiered["token_hit_rate"] > plain["token_hit_rate"]


def test_serve_replay_of_a_models_groups_moves_their_bytes():
    # Two layers of each kind at 64 bytes a token and layer: 2 KiB blocks.
    options = dict(
        limit=25, groups="sliding_window:32:2,full:2", kv_bytes_per_token_layer=64,
        capacity_bytes=3_000_000, host_tier_tokens=1 << 17,
    )
    plain = kvbm.replay_serve(**options)
    real = kvbm.replay_serve(data_plane="host", **options)
    data = real.pop("data_plane")
    assert without_timings(real) == without_timings(plain)
    (host,) = real["tiers"]
    assert host["loaded_blocks"] > 0
    assert data["loaded_blocks"] == data["verified_blocks"] == host["loaded_blocks"]
    assert data["wrong_blocks"] == 0 and data["block_bytes"] == 2048


def test_cluster_replay_compares_policies():
    report = kvbm.replay_cluster(
        limit=40, engines=2, policies="round-robin,kv-aware", capacity_tokens=300_000, threads=1
    )
    assert report["mode"] == "cluster" and report["engines"] == 2
    assert [run["policy"] for run in report["runs"]] == ["round-robin", "kv-aware"]


def test_cluster_replay_of_a_models_groups():
    report = kvbm.replay_cluster(
        limit=40, engines=2, policies="kv-aware", model="gpt-oss-120b",
        capacity_bytes="10G", threads=1,
    )
    assert report["runs"][0]["finished_requests"] == 40
    with pytest.raises(kvbm.InvalidArgumentError):
        kvbm.replay_cluster(limit=5, model="gpt-oss-120b", capacity_bytes="10G", kv_bytes_per_token=8)


def test_traces_from_python_files_and_text(tmp_path):
    requests = [
        {"timestamp": 0, "input_length": 1200, "output_length": 20, "hash_ids": [1, 2, 3]},
        {"timestamp": 10, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 4]},
        {"timestamp": 20, "input_length": 300, "output_length": 5, "hash_ids": [5], "priority": 1},
    ]
    trace = kvbm.Trace.from_requests(requests)
    assert len(trace) == 3 and trace.requests() == requests
    assert trace.summary()["input_tokens"] == 2600
    report = kvbm.replay_cache(trace, block_size=256)
    assert (report["hit_blocks"], report["hit_tokens"]) == (4, 1024)
    assert kvbm.replay_cache(requests, block_size=256)["hit_blocks"] == 4

    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in requests))
    assert kvbm.replay_cache(path, block_size=256)["trace"] == str(path)
    assert kvbm.replay_cache(str(path), block_size=256)["hit_blocks"] == 4
    assert len(kvbm.Trace.load(path)) == 3
    assert len(kvbm.Trace.from_jsonl(path.read_text())) == 3
    assert "Trace(3 requests" in repr(kvbm.Trace.load(path))


def test_a_trace_object_replays_many_times():
    trace = kvbm.Trace.excerpt()
    first = kvbm.replay_cache(trace, capacity_blocks=3000)
    second = kvbm.replay_cache(trace, capacity_blocks=3000)
    assert without_timings(first) == without_timings(second)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: kvbm.replay_cache(block_size=7), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_cache(eviction="fifo"), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_cache(capacity_blocks=1, capacity_tokens=1), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_cache(capacity_blocks=-1), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_cache(capacity_blocks="many"), TypeError),
        (lambda: kvbm.replay_cache(no_such_option=1), TypeError),
        (lambda: kvbm.replay_cache(42), TypeError),
        (lambda: kvbm.replay_cache("/nonexistent/trace.jsonl"), kvbm.SimError),
        (lambda: kvbm.replay_serve(limit=0), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_serve(limit=5, step_ms=-1.0), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_serve(limit=5, priorities="x"), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_serve(limit=5, model="gpt-9"), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_serve(limit=5, model="gpt-oss-20b"), kvbm.InvalidArgumentError),
        (
            lambda: kvbm.replay_serve(
                limit=5, model="gpt-oss-20b", capacity_bytes="4G", capacity_blocks=100
            ),
            kvbm.InvalidArgumentError,
        ),
        (
            lambda: kvbm.replay_serve(
                limit=5, model="gpt-oss-20b", groups="full:4", capacity_bytes="4G"
            ),
            kvbm.InvalidArgumentError,
        ),
        (
            lambda: kvbm.replay_serve(limit=5, groups="full:4", capacity_bytes="4G"),
            kvbm.InvalidArgumentError,
        ),
        (
            lambda: kvbm.replay_serve(
                limit=5, groups="sliding_window:100:4,full:4",
                kv_bytes_per_token_layer=2048, capacity_bytes="4G",
            ),
            kvbm.InvalidArgumentError,
        ),
        (lambda: kvbm.replay_serve(limit=5, capacity_bytes="4G"), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_serve(limit=5, full_attention_only=True), kvbm.InvalidArgumentError),
        (
            lambda: kvbm.replay_serve(limit=5, model="gpt-oss-20b", capacity_bytes=-1),
            TypeError,
        ),
        (
            lambda: kvbm.replay_serve(limit=5, model="gpt-oss-20b", capacity_bytes="lots"),
            kvbm.InvalidArgumentError,
        ),
        (
            lambda: kvbm.replay_serve(
                limit=5, model="gpt-oss-20b", capacity_bytes="4G",
                host_tier_tokens=100_000, kv_bytes_per_token=4096,
            ),
            kvbm.InvalidArgumentError,
        ),
        (lambda: kvbm.replay_cluster(limit=5, engines=0), kvbm.InvalidArgumentError),
        (lambda: kvbm.replay_cluster(limit=5, policies=["best"]), kvbm.InvalidArgumentError),
        (lambda: kvbm.Trace.from_jsonl("{not json"), kvbm.SimError),
        (lambda: kvbm.Trace.from_jsonl(""), kvbm.SimError),
        (lambda: kvbm.Trace.from_requests([{"timestamp": 0}]), kvbm.InvalidArgumentError),
        (
            lambda: kvbm.Trace.from_requests(
                [{"timestamp": 0, "input_length": 5000, "output_length": 1, "hash_ids": [1]}]
            ),
            kvbm.SimError,
        ),
    ],
)
def test_bad_replays_raise_the_right_class(call, error):
    with pytest.raises(error):
        call()


def test_replays_release_the_gil():
    window = {}
    done = threading.Event()

    def replay():
        window["start"] = time.perf_counter()
        window["report"] = kvbm.replay_serve(capacity_tokens=400_000)
        window["end"] = time.perf_counter()
        done.set()

    stamps = []
    thread = threading.Thread(target=replay)
    thread.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
        time.sleep(0.0002)
    thread.join()
    assert window["report"]["finished_requests"] == 500
    # This thread runs only with the GIL: had the replay held it, no stamp
    # could fall in the replay's middle (one may before the call enters
    # Rust, while the GIL changes hands).
    start, end = window["start"], window["end"]
    span = end - start
    middle = [t for t in stamps if start + 0.25 * span < t < end - 0.1 * span]
    assert middle, f"no progress during the {span * 1e3:.0f} ms replay: the GIL was held"


@pytest.mark.skipif("KVBM_SIM" not in os.environ, reason="KVBM_SIM names no kvbm-sim binary")
@pytest.mark.parametrize(
    "args, call",
    [
        (["cache", "--capacity-blocks", "3000", "--eviction", "lineage"],
         lambda: kvbm.replay_cache(capacity_blocks=3000, eviction="lineage")),
        (["serve", "--limit", "80", "--capacity-tokens", "400000", "--block-size", "32"],
         lambda: kvbm.replay_serve(limit=80, capacity_tokens=400_000, block_size=32)),
        (["cluster", "--limit", "40", "--engines", "3", "--capacity-tokens", "300000"],
         lambda: kvbm.replay_cluster(limit=40, engines=3, capacity_tokens=300_000)),
        (["serve", "--limit", "80", "--model", "gpt-oss-20b", "--capacity-bytes", "2G"],
         lambda: kvbm.replay_serve(limit=80, model="gpt-oss-20b", capacity_bytes="2G")),
        (["serve", "--limit", "80", "--groups", "sliding_window:128:3,full:1",
          "--kv-bytes-per-token-layer", "2048", "--capacity-bytes", "300000000",
          "--full-attention-only"],
         lambda: kvbm.replay_serve(limit=80, groups="sliding_window:128:3,full:1",
                                   kv_bytes_per_token_layer=2048, capacity_bytes=300_000_000,
                                   full_attention_only=True)),
    ],
)
def test_reports_equal_the_command_lines_json(args, call):
    cli = subprocess.run(
        [os.environ["KVBM_SIM"], "--quiet", *args, "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert without_timings(call()) == without_timings(json.loads(cli.stdout))
