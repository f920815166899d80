"""Requests of a Mooncake-format trace as token lists, for the vLLM gates.

Each trace block id stands for 512 tokens derived from it, so requests that
share block ids share those tokens (and their prefix-cache blocks), as in
the trace. The Rust side of a gate derives the same tokens (see
`kvbm-schedule`'s `groups_replay` example).
"""

import json

TRACE_BLOCK = 512


def workload(trace, count, *, max_prompt, max_decodes, vocab):
    """The first `count` requests of `trace` with at least two prompt
    tokens: (decodes, tokens), prompts cut to `max_prompt` tokens, decodes
    to 1..`max_decodes`, token ids in 1..=`vocab`."""
    requests = []
    with open(trace) as lines:
        for line in lines:
            if len(requests) == count:
                break
            entry = json.loads(line)
            length = min(entry["input_length"], max_prompt)
            tokens = [
                (h * 7919 + i) % vocab + 1
                for h in entry["hash_ids"]
                for i in range(TRACE_BLOCK)
            ][:length]
            if len(tokens) < 2:
                continue
            decodes = max(1, min(entry["output_length"], max_decodes))
            requests.append((decodes, tokens))
    return requests
