"""Bounded load test: 64 concurrent streaming clients for BIE_LOAD_SECONDS (default 60) with
mixed prompt lengths and a shared system prompt. Every request must complete ([DONE]) or be
refused cleanly (429/503 with an OpenAI error body); none may hang; afterwards the used-block
gauge returns to its idle value."""
import json
import os
import random
import threading
import time

import requests

from conftest import ServerProcess

CLIENTS = int(os.environ.get("BIE_LOAD_CLIENTS", "64"))
SECONDS = float(os.environ.get("BIE_LOAD_SECONDS", "60"))
SYSTEM = ("You are a concise assistant for a hardware store. Answer in one or two sentences, "
          "mention a product when it helps, and never invent prices. ") * 4
WORDS = ("hammer nail screw drill paint brush ladder rope glue tape saw wrench bolt hinge lamp "
         "cable pipe valve tile brick").split()


def one_request(url, rng):
    n_words = rng.choice([3, 10, 40, 120, 300])
    user = "Question: " + " ".join(rng.choice(WORDS) for _ in range(n_words)) + "?"
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            "max_tokens": rng.randint(8, 40), "temperature": 0.7, "seed": rng.randint(0, 1 << 30),
            "stream": True}
    r = requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=(10, 120),
                      headers={"Connection": "close"})
    if r.status_code in (429, 503):
        err = r.json()["error"]
        assert err["message"] and err["type"], err
        return str(r.status_code), 0
    assert r.status_code == 200, (r.status_code, r.text[:300])
    last, tokens = None, 0
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            last = line
            if line != b"data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                tokens += sum(1 for c in chunk["choices"] if c["delta"].get("content"))
    assert last == b"data: [DONE]", last
    return "ok", tokens


def test_64_streaming_clients():
    # A KV budget of ~4k tokens for 16 sequences of up to ~700: admission waits for blocks and
    # decode can run out of them (preemption), as a loaded server does.
    s = ServerProcess("--max-model-len", "1024", "--max-num-seqs", "16", "--max-queue", "24",
                      "--kv-cache-memory", "96MiB")
    try:
        idle = s.wait_idle()
        deadline = time.time() + SECONDS
        outcomes, failures, lock = {}, [], threading.Lock()

        def client(i):
            rng = random.Random(i)
            while time.time() < deadline:
                try:
                    kind, tokens = one_request(s.url, rng)
                except Exception as e:  # noqa: BLE001 - every failure is collected and asserted
                    with lock:
                        failures.append(f"client {i}: {type(e).__name__}: {e}")
                    return
                with lock:
                    n, t = outcomes.get(kind, (0, 0))
                    outcomes[kind] = (n + 1, t + tokens)
                if kind != "ok":
                    time.sleep(0.2 + rng.random() * 0.3)  # back off after a refusal

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(CLIENTS)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, deadline + 240 - time.time()))
        hung = sum(t.is_alive() for t in threads)
        elapsed = time.time() - t0
        ok, ok_tokens = outcomes.get("ok", (0, 0))
        print(f"\nload: {CLIENTS} clients, {elapsed:.0f}s: {ok} completed ({ok_tokens} streamed "
              f"chunks, {ok_tokens / elapsed:.1f}/s), refused 429: "
              f"{outcomes.get('429', (0, 0))[0]}, 503: {outcomes.get('503', (0, 0))[0]}, "
              f"failures {len(failures)}, hung {hung}")
        assert hung == 0
        assert not failures, failures[:5]
        assert ok >= CLIENTS // 2
        assert s.wait_idle(timeout=60) == idle
        m = s.metrics()
        print(f"load: preemptions {m['bie_preemptions_total']:.0f}, admission refusals "
              f"{m['bie_admission_refusals_total']:.0f}, prefix hit rate "
              f"{m['bie_prefix_cache_hit_rate']:.2f}, mean batch {m['bie_batch_size_mean']:.1f}")
    finally:
        assert s.stop() == 0
