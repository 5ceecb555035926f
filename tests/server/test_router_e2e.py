"""The tested deployment (deploy/): 3 bie-serve replicas of SmolLM2 behind vllm-router on
loopback. 8 users, each with its own ~1.5k-token system prompt, send BIE_E2E_TURNS chat turns
(2 in `make test`; 10 for the long form in docs/deploy.md) through a cache_aware router and then,
with fresh users, through a round_robin router over the same replicas: the prefix-cache hit rate
(from the replicas' /metrics) and the mean TTFT (client side, streaming) of both are printed and
cache_aware's hit rate must be at least round_robin's. Then kill -9 of a replica with requests in
flight (they end, cleanly, nothing hangs; the router marks it unhealthy; every later request
succeeds on the others), and SIGTERM of another (health 503 while its running request finishes,
exit 0)."""
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

import pytest
import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "deploy"))
import local_cluster  # noqa: E402

from conftest import MODEL, SERVE_BIN  # noqa: E402

TURNS = int(os.environ.get("BIE_E2E_TURNS", "2"))
USERS = 8
ROUTER_BIN = os.environ.get("BIE_VLLM_ROUTER", local_cluster.DEFAULT_ROUTER)
SERVE_ARGS = ["-m", MODEL, "--max-model-len", "4096", "--max-num-seqs", "4",
              "--kv-cache-memory", "160MiB"]
WORDS = ("river stone market signal harbor ledger violet engine orbit canyon meadow lantern "
         "copper tunnel falcon glacier piano harvest compass velvet summit archive beacon "
         "quartz timber saddle mirror thunder garden pepper rocket marble voyage").split()


def system_prompt(rng, user):
    words = " ".join(rng.choice(WORDS) for _ in range(1450))
    return f"You are assistant number {user}. Remember these notes exactly: {words}"


def chat(url, messages, max_tokens=8, timeout=120, ignore_eos=False):
    """Streams one chat completion; returns (ttft seconds, text, finish_reason)."""
    t0 = time.time()
    ttft = None
    text, finish = "", None
    with requests.post(url + "/v1/chat/completions", stream=True, timeout=timeout,
                       json={"model": "default", "messages": messages, "max_tokens": max_tokens,
                             "temperature": 0, "stream": True, "ignore_eos": ignore_eos}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            if ttft is None:
                ttft = time.time() - t0
            c = json.loads(line[6:])["choices"]
            if c:
                text += c[0]["delta"].get("content") or ""
                finish = c[0].get("finish_reason") or finish
    return ttft, text, finish


def prefix_counters(replicas):
    hit = queried = 0
    for r in replicas:
        m = r.metrics()
        hit += m.get("bie_prefix_cache_hit_blocks_total", 0)
        queried += m.get("bie_prefix_cache_queried_blocks_total", 0)
    return hit, queried


def run_users(router, replicas, seed):
    """USERS concurrent users, TURNS turns each; returns (hit rate, mean TTFT, requests)."""
    rng = random.Random(seed)
    prompts = [system_prompt(rng, u) for u in range(USERS)]
    ttfts, errors = [], []
    h0, q0 = prefix_counters(replicas)

    def user(u):
        msgs = [{"role": "system", "content": prompts[u]}]
        try:
            for t in range(TURNS):
                msgs.append({"role": "user", "content": f"Turn {t}: name one word from the notes."})
                ttft, text, _ = chat(router.url, msgs)
                ttfts.append(ttft)
                msgs.append({"role": "assistant", "content": text})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"user {u}: {e!r}")

    threads = [threading.Thread(target=user, args=(u,)) for u in range(USERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a user hung"
    assert not errors, errors
    h1, q1 = prefix_counters(replicas)
    return (h1 - h0) / max(1, q1 - q0), sum(ttfts) / len(ttfts), len(ttfts)


@pytest.fixture(scope="module")
def cluster():
    if not os.path.exists(ROUTER_BIN):
        pytest.fail(f"vllm-router not installed at {ROUTER_BIN}: run deploy/setup_router.sh")
    if not os.path.exists(MODEL):
        pytest.fail(f"model not fetched: {MODEL} (run `make models`)")
    run_dir = tempfile.mkdtemp(prefix="bie-e2e-")
    replicas = local_cluster.start_replicas(3, SERVE_ARGS, run_dir, SERVE_BIN, threads=1)
    routers = {}
    try:
        for policy in ("cache_aware", "round_robin"):
            routers[policy] = local_cluster.Router(ROUTER_BIN, [r.url for r in replicas], policy,
                                                   run_dir)
        for r in routers.values():
            r.wait_ready()
        yield replicas, routers
    finally:
        for r in routers.values():
            r.stop()
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()


def test_cache_aware_beats_round_robin_then_failover_and_drain(cluster):
    replicas, routers = cluster
    t_start = time.time()
    # cache_aware first: round_robin then runs on caches already under pressure, never the reverse.
    ca_hit, ca_ttft, n_ca = run_users(routers["cache_aware"], replicas, seed=1)
    rr_hit, rr_ttft, n_rr = run_users(routers["round_robin"], replicas, seed=2)
    print(f"\n{USERS} users x {TURNS} turns, 3 replicas:"
          f"\n  cache_aware: prefix-cache hit rate {ca_hit:.3f}, mean TTFT {ca_ttft:.3f} s ({n_ca} requests)"
          f"\n  round_robin: prefix-cache hit rate {rr_hit:.3f}, mean TTFT {rr_ttft:.3f} s ({n_rr} requests)"
          f"\n  ({time.time() - t_start:.0f} s)")
    assert ca_hit >= rr_hit, (ca_hit, rr_hit)
    # Only a user's first turn must miss where cache_aware sends it (ideal: (TURNS - 1) / TURNS,
    # less what eviction takes); it must hit at all.
    assert ca_hit > 0.1, ca_hit

    # ---- kill -9 of a replica with requests in flight ------------------------------------
    router = routers["cache_aware"]
    outcomes = []

    def long_request(i):
        try:
            ttft, text, finish = chat(router.url, [{"role": "user", "content": f"Story {i}:"}],
                                      max_tokens=200, timeout=120, ignore_eos=True)
            outcomes.append(("ok", finish))
        except (requests.RequestException, AssertionError, ValueError) as e:
            outcomes.append(("error", type(e).__name__))

    flights = [threading.Thread(target=long_request, args=(i,)) for i in range(4)]
    for t in flights:
        t.start()
    victim = None
    deadline = time.time() + 30
    while victim is None and time.time() < deadline:
        for r in replicas:
            if r.metrics().get("bie_requests_running", 0) > 0:
                victim = r
                break
        time.sleep(0.05)
    assert victim is not None, "no replica ever ran the long requests"
    in_flight = victim.metrics().get("bie_requests_running", 0)
    victim.proc.kill()  # SIGKILL
    victim.proc.wait()
    t_kill = time.time()
    for t in flights:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in flights), "a request in flight hung after kill -9"
    print(f"  kill -9 replica {victim.index} with {in_flight:.0f} running: outcomes {outcomes}")
    assert len(outcomes) == 4
    # The router takes the dead replica out of rotation.
    while router.workers().get(victim.url, True):
        assert time.time() - t_kill < 30, f"router still lists {victim.url} healthy"
        time.sleep(0.2)
    print(f"  router marked it unhealthy after {time.time() - t_kill:.1f} s")
    survivors = [r for r in replicas if r is not victim]
    before = sum(r.metrics().get("bie_requests_finished_total", 0) for r in survivors)
    for i in range(6):
        ttft, text, finish = chat(router.url, [{"role": "user", "content": f"After {i}"}], 4)
        assert finish in ("stop", "length"), finish
    # Every one of them ran on a survivor (finished counts are published just after the stream
    # ends, so allow a moment).
    deadline = time.time() + 5
    while True:
        after = sum(r.metrics().get("bie_requests_finished_total", 0) for r in survivors)
        if after - before >= 6 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert after - before == 6, (before, after)

    # ---- SIGTERM drains a replica ----------------------------------------------------------
    drained = survivors[0]
    result = {}

    def running_request():
        result["r"] = chat(drained.url, [{"role": "user", "content": "Count slowly:"}],
                           max_tokens=100, timeout=120, ignore_eos=True)

    t = threading.Thread(target=running_request)
    t.start()
    deadline = time.time() + 30
    while drained.metrics().get("bie_requests_running", 0) < 1:
        assert time.time() < deadline, "the drain request never started"
        time.sleep(0.05)
    drained.signal(signal.SIGTERM)
    saw_503 = False
    while t.is_alive():
        status, body = local_cluster.http_get(drained.url + "/health", timeout=2)
        if status == 503 and "shutting_down" in body:
            saw_503 = True
        time.sleep(0.05)
    t.join()
    assert saw_503, "/health never answered 503 while draining"
    assert result["r"][2] == "length", result  # the running request finished all its tokens
    assert drained.proc.wait(timeout=60) == 0
    # The router drops it too; requests go to the last replica.
    t_term = time.time()
    while router.workers().get(drained.url, True):
        assert time.time() - t_term < 30, "router still lists the drained replica healthy"
        time.sleep(0.2)
    for i in range(3):
        assert chat(router.url, [{"role": "user", "content": f"Last {i}"}], 4)[2] in ("stop", "length")
    print(f"  SIGTERM: health 503 while draining, running request finished, exit 0 "
          f"({time.time() - t_start:.0f} s in all)")
