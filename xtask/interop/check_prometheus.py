"""Parses kvbm-sim's Prometheus exposition with the Prometheus project's own
Python parser (prometheus_client) and checks it against the run's JSON report.

Usage: check_prometheus.py METRICS_FILE REPORT_JSON

Run by `cargo xtask prometheus-interop`, which installs the pinned
prometheus_client into a virtualenv under target/.
"""

import json
import math
import sys

from prometheus_client.parser import text_string_to_metric_families


def main(metrics_path, report_path):
    with open(metrics_path) as f:
        text = f.read()
    with open(report_path) as f:
        report = json.load(f)
    # The parser raises on anything that is not valid exposition text.
    families = {family.name: family for family in text_string_to_metric_families(text)}

    def sample(family_name, sample_name):
        family = families.get(family_name)
        assert family is not None, f"missing family {family_name}: {sorted(families)}"
        values = [s.value for s in family.samples if s.name == sample_name]
        assert len(values) == 1, f"{sample_name}: {values}"
        return family, values[0]

    # Counters: prometheus_client names the family without `_total`.
    counters = {
        "kvbm_prefix_cache_queries": report["input_tokens"],
        "kvbm_prefix_cache_hits": report["hit_tokens"],
        "kvbm_num_preemptions": report["preemptions"],
        "kvbm_evictions": report["evictions"],
        "kvbm_request_generation_tokens": report["output_tokens"],
    }
    for name, expected in counters.items():
        family, value = sample(name, name + "_total")
        assert family.type == "counter", f"{name} is a {family.type}"
        assert value == expected, f"{name}_total = {value}, report says {expected}"

    for name in ["kvbm_kv_cache_usage_ratio", "kvbm_requests_running", "kvbm_requests_waiting"]:
        family, value = sample(name, name)
        assert family.type == "gauge", f"{name} is a {family.type}"
        assert value == 0, f"{name} = {value} after the replay"

    name = "kvbm_time_to_first_token_seconds"
    family = families[name]
    assert family.type == "histogram", f"{name} is a {family.type}"
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name == name + "_bucket"]
    assert buckets == sorted(buckets), "buckets out of order"
    counts = [count for _, count in buckets]
    assert counts == sorted(counts), "bucket counts not cumulative"
    assert buckets[-1][0] == math.inf, "no +Inf bucket"
    _, count = sample(name, name + "_count")
    _, total = sample(name, name + "_sum")
    assert buckets[-1][1] == count == report["ttft"]["count"], (buckets[-1], count, report["ttft"])
    mean_ms = total / count * 1000
    assert abs(mean_ms - report["ttft"]["mean_ms"]) < 1e-3 * max(1.0, mean_ms), (mean_ms, report["ttft"])
    print(f"prometheus_client parsed {len(families)} families; counters, gauges and the TTFT histogram match the report")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
