"""Prefix caching through the server: a second request sharing a ~2k-token system prompt starts
at least 5x faster than the first, the hit shows in /metrics, and greedy outputs with and
without caching (f16 KV) are compared."""
import time

import requests

from conftest import ServerProcess

ARGS = ["--max-model-len", "4096", "--max-num-seqs", "2", "--kv-cache-dtype", "f16",
        "--kv-cache-memory", "512MiB"]


def system_prompt(n_rules=90):
    colours = ["red", "green", "blue", "amber", "violet", "silver", "golden", "black"]
    things = ["lamp", "river", "engine", "garden", "ledger", "bridge", "window", "harbour"]
    rules = [f"Rule {i}: the {colours[i % 8]} {things[(i * 3) % 8]} must be checked every "
             f"{i % 7 + 2} days by the {things[(i * 5) % 8]} keeper." for i in range(n_rules)]
    return "You are the archivist of a small town. Follow these rules.\n" + "\n".join(rules)


def chat_stream(url, user, max_tokens=8, n_rules=90):
    """Returns (seconds to the first generated text, text, usage)."""
    body = {"messages": [{"role": "system", "content": system_prompt(n_rules)},
                         {"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    r = requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    import json
    ttft, text, usage = None, "", None
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk["choices"]:
            if c["delta"].get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += c["delta"]["content"]
    return ttft, text, usage


def test_second_request_ttft_at_least_5x_lower_and_hit_rate_visible():
    s = ServerProcess(*ARGS)
    try:
        t1, _, u1 = chat_stream(s.url, "Which keeper checks the lamp?")
        t2, _, u2 = chat_stream(s.url, "How often is the river checked?")
        print(f"\nprefix cache: prompt {u1['prompt_tokens']} tokens; TTFT first {t1 * 1000:.1f} ms, "
              f"second {t2 * 1000:.1f} ms ({t1 / t2:.1f}x), cached "
              f"{u2['prompt_tokens_details']['cached_tokens']} tokens")
        assert u1["prompt_tokens"] >= 1800
        assert u1["prompt_tokens_details"]["cached_tokens"] == 0
        assert u2["prompt_tokens_details"]["cached_tokens"] >= 1600
        m = s.metrics()
        assert m["bie_prefix_cache_hit_rate"] > 0.4
        assert m["bie_prefix_cache_hit_blocks_total"] >= 100
        assert t1 / t2 >= 5.0, f"TTFT first {t1:.3f}s, second {t2:.3f}s"
    finally:
        assert s.stop() == 0


def test_greedy_outputs_identical_with_and_without_caching():
    # A shorter shared prompt (~700 tokens) keeps the uncached server quick; the property does
    # not depend on the length.
    users = ["Which keeper checks the lamp?", "How often is the river checked?",
             "List two rules about gardens."]
    outputs = {}
    for flag in ["--enable-prefix-caching", "--no-enable-prefix-caching"]:
        s = ServerProcess(*ARGS, flag)
        try:
            outputs[flag] = [chat_stream(s.url, u, max_tokens=24, n_rules=30)[1] for u in users]
        finally:
            assert s.stop() == 0
    cached, plain = outputs["--enable-prefix-caching"], outputs["--no-enable-prefix-caching"]
    assert cached[0] == plain[0]  # the first request computes everything in both servers
    # Later requests hit the cache; the engine's kernels are batch-invariant (docs/serving.md §3),
    # so the text must not change.
    assert cached == plain
