"""KV events (--kv-events-endpoint, --kv-events-replay-endpoint): a subscriber that decodes the
ZMQ frames with msgpack rebuilds the replica's cached block set exactly — compared with the
engine's own prefix index (GET /admin/prefix-cache) after a workload that stores, hits and
evicts blocks in two KV regimes — including after it was dropped and caught up via the replay
socket."""
import os
import random
import threading
import time

import requests

from conftest import ServerProcess, free_port
from kv_events_client import Rebuilt, Subscriber, replay, zmq

BLOCK = 16


def index_of(s):
    r = requests.get(s.url + "/admin/prefix-cache", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    out = set()
    for st in body["stores"]:
        assert st["block_size"] == BLOCK
        out |= {(st["medium"], h) for h in st["hashes"]}
    assert body["blocks"] == len(out)
    return out


def workload(s, rng, prefixes, n, regimes=("", "f16")):
    """n completions over token-id prompts: a shared prefix (hits) plus a random tail (fresh
    blocks that fill the cache and force evictions); two clients at once."""
    def one(i):
        p = prefixes[i % len(prefixes)] + [rng.randrange(300, 40000) for _ in range(130 + 16 * (i % 5))]
        body = {"prompt": p, "max_tokens": 3, "temperature": 0}
        if regimes[i % len(regimes)]:
            body["kv_cache_dtype"] = regimes[i % len(regimes)]
        r = requests.post(s.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text

    for i in range(0, n, 2):
        ts = [threading.Thread(target=one, args=(j,)) for j in (i, i + 1) if j < n]
        for t in ts:
            t.start()
        for t in ts:
            t.join()


def apply_frames(state, frames, topic):
    for t, seq, payload in frames:
        assert t == topic, t
        state.apply(seq, payload)


def catch_up(ctx, state, sub, replay_ep, topic):
    """Replays what the live stream missed (from state.next_seq), then the live frames."""
    for seq, payload in replay(ctx, replay_ep, state.next_seq):
        state.apply(seq, payload)
    apply_frames(state, [f for f in sub.take() if f[1] >= state.next_seq], topic)


def wait_equal(s, ctx, state, sub, replay_ep, topic, timeout=10):
    s.wait_idle()
    truth = index_of(s)
    deadline = time.time() + timeout
    while True:
        catch_up(ctx, state, sub, replay_ep, topic)
        if state.blocks == truth or time.time() > deadline:
            break
        time.sleep(0.05)
    return truth


def test_subscriber_rebuilds_the_prefix_index_with_evictions_and_replay(tmp_path):
    pub_ep = f"ipc://{tmp_path}/kv-events.sock"
    replay_port = free_port()
    replay_ep = f"tcp://127.0.0.1:{replay_port}"
    # A small budget: two regimes' worth of blocks do not fit, so the prefix cache evicts.
    s = ServerProcess("--max-model-len", "512", "--max-num-seqs", "2", "--kv-cache-memory", "24MiB",
                      "--paged-block-size", str(BLOCK), "--kv-cache-dtype", "int4_asym",
                      "--kv-events-endpoint", pub_ep,
                      "--kv-events-replay-endpoint", replay_ep, "--kv-events-pod-id", "pod-a")
    ctx = zmq.Context()
    topic = b"kv@pod-a@SmolLM2-135M-Instruct.Q4_1"
    try:
        rng = random.Random(23)
        prefixes = [[rng.randrange(300, 40000) for _ in range(64)] for _ in range(3)]
        state = Rebuilt()
        sub = Subscriber(ctx, pub_ep)
        time.sleep(0.3)  # let the subscription reach the publisher
        # Everything before the subscription took hold (the start-up AllBlocksCleared) by replay.
        catch_up(ctx, state, sub, replay_ep, topic)
        assert state.cleared == 1 and state.next_seq >= 1

        workload(s, rng, prefixes, 16)
        truth = wait_equal(s, ctx, state, sub, replay_ep, topic)
        assert not state.errors, state.errors[:5]
        assert state.blocks == truth, (len(state.blocks), len(truth))
        assert truth, "the workload left nothing cached"
        first_removed = state.removed

        # Drop the subscriber; the replica keeps working (and evicting) without it.
        sub.close()
        missed_from = state.next_seq
        workload(s, rng, prefixes, 16)
        s.wait_idle()
        time.sleep(0.2)
        sub = Subscriber(ctx, pub_ep)
        time.sleep(0.3)
        truth = wait_equal(s, ctx, state, sub, replay_ep, topic)
        assert state.next_seq > missed_from + 1, "nothing was published while dropped"
        assert not state.errors, state.errors[:5]
        assert state.blocks == truth, (len(state.blocks), len(truth),
                                       sorted(truth - state.blocks)[:3],
                                       sorted(state.blocks - truth)[:3])

        m = s.metrics()
        print(f"\nkv events: {state.next_seq} batches, {state.stored} stored, {state.removed} "
              f"removed ({first_removed} before the drop), {len(truth)} cached now, media "
              f"{sorted(state.media)}")
        assert state.removed > 0 and first_removed > 0, "the workload never evicted"
        assert state.block_sizes == {BLOCK}
        # Both regimes report: the default int4 (FP16 sink/window pool + body) and f16.
        assert {"f16/body", "int4_asym/fp16", "int4_asym/body"} <= state.media, state.media
        assert m["bie_prefix_cache_hit_blocks_total"] > 0
        sub.close()
    finally:
        ctx.destroy(linger=0)
        s.stop()


def test_bad_endpoint_fails_at_start():
    import subprocess
    from conftest import SERVE_BIN
    r = subprocess.run([SERVE_BIN, "--port", "0", "--kv-events-endpoint", "tcp://*:notaport"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--kv-events-endpoint" in r.stderr, r.stderr
