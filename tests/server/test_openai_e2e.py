"""End-to-end: the real bie-serve with the default model, driven by the official `openai` client
(and raw HTTP where the client cannot express the case)."""
import json
import os
import signal
import socket
import threading
import time

import openai
import pytest
import requests

from conftest import DEVICE, MODEL, ServerProcess

KEY = "e2e-test-key"
MAX_LEN = 1024


def toks(n, on_device):
    """Tokens to generate: n, or on_device against a CPU Vulkan driver (BIE_E2E_DEVICE: lavapipe
    runs SmolLM2 at about half a token per second), enough for what each case checks."""
    return on_device if DEVICE else n


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A fresh BIE_HOME (models linked in, no digests yet) makes start-up hash the model file
    # (SHA-256 of ~100 MB, several 50 ms polls long), so the fixture sees /health answer 503 first.
    home = tmp_path_factory.mktemp("bie_home")
    os.symlink(os.path.dirname(MODEL), home / "models")
    s = ServerProcess("--max-model-len", str(MAX_LEN), "--max-num-seqs", "4",
                      "--kv-cache-memory", "256MiB", api_key=KEY, env={"BIE_HOME": str(home)})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def model_id(client):
    return client.models.list().data[0].id


def test_health_was_503_while_loading_then_ok(server):
    # The server listens before the model loads (and hashes it, see the fixture): the fixture's
    # polls saw 503 {"status": "loading"} before the 200.
    assert server.saw_loading, "bie-serve never answered /health with 503 while loading"
    r = requests.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_models(client):
    models = client.models.list().data
    assert len(models) == 1
    assert models[0].id == "SmolLM2-135M-Instruct.Q4_1"


def test_completion_and_usage(client):
    r = client.completions.create(model=model_id(client), prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == 5
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra["bie"]
    assert extra["kv"] and len(extra["model_sha256"]) == 64


def test_chat(client):
    r = client.chat.completions.create(
        model=model_id(client), temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert "Paris" in msg.content
    assert "<|im_end|>" not in msg.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_stream_equals_non_stream_greedy(client):
    kw = dict(model=model_id(client), temperature=0, max_tokens=toks(40, 8),
              messages=[{"role": "user", "content": "Write a short poem about the sea."}])
    # Compare like with like: the first request fills the prefix cache, the next two hit it
    # (a hit may change greedy text through float summation order; test_prefix_cache.py covers
    # that engine property).
    client.chat.completions.create(**kw)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts, finish, usage = [], None, None
    for chunk in client.chat.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(parts) == whole
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0

    # Completions too.
    ckw = dict(model=model_id(client), prompt="Once upon a time", max_tokens=toks(24, 6),
               temperature=0)
    client.completions.create(**ckw)
    whole = client.completions.create(**ckw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **ckw)
                       if c.choices)
    assert streamed == whole


def test_stream_raw_sse_has_done(server):
    r = requests.post(server.url + "/v1/completions", headers=server.headers(), stream=True,
                      json={"prompt": "Hello", "max_tokens": 5, "stream": True}, timeout=60)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines(decode_unicode=True)
              if line and not line.startswith(":")]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        json.loads(e[6:])


def test_errors_as_openai_exceptions(server, client):
    mid = model_id(client)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=mid, messages=msgs, max_tokens=-1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=mid, messages=msgs, max_tokens=10**12)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=mid, messages=msgs, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=mid, messages=msgs, top_p=1.5)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=mid, messages=[])
    assert "empty" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=mid, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=mid, prompt="x", n=129)  # n is 1..128
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=msgs)
    assert e.value.status_code == 404
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = requests.get(server.url + "/v1/models")  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # Prompt longer than --max-model-len.
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=mid, prompt="hello " * (MAX_LEN + 10), max_tokens=4)
    assert e.value.status_code == 413
    assert "max-model-len" in e.value.message
    # The server still answers.
    assert client.completions.create(model=mid, prompt="Hi", max_tokens=2).choices


def test_malformed_json_and_wrong_types(server):
    h = dict(server.headers(), **{"Content-Type": "application/json"})
    r = requests.post(server.url + "/v1/chat/completions", data=b'{"messages": [', headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = requests.post(server.url + "/v1/chat/completions", headers=h,
                      json={"messages": [{"role": "user", "content": "x"}], "max_tokens": "10"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_invalid_utf8_is_400(server):
    h = dict(server.headers(), **{"Content-Type": "application/json"})
    body = b'{"messages": [{"role": "user", "content": "caf\xc3\x28 \xff"}]}'
    r = requests.post(server.url + "/v1/chat/completions", data=body, headers=h)
    assert r.status_code == 400
    assert "UTF-8" in r.json()["error"]["message"]


def test_50mb_body_is_413(server):
    size = 50 * 1000 * 1000
    # With "Expect: 100-continue" (as curl sends for large bodies) the refusal comes before any
    # of the body is sent.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {size}\r\n"
                f"Expect: 100-continue\r\n\r\n")
        s.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert b" 413 " in data.split(b"\r\n", 1)[0], data[:200]
    # A client that just sends it all (the openai client, requests) gets 413 once the body is
    # drained (it is read and discarded, never held in memory).
    r = requests.post(server.url + "/v1/completions", headers=server.headers(),
                      data=b"x" * size, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"
    assert requests.get(server.url + "/health").status_code == 200


def test_client_disconnect_frees_blocks(server):
    idle = server.wait_idle()
    r = requests.post(server.url + "/v1/completions", headers=server.headers(), stream=True,
                      json={"prompt": "Tell me a very long story.", "max_tokens": 900,
                            "stream": True, "ignore_eos": True, "temperature": 0},
                      timeout=60)
    lines = r.iter_lines()
    got = 0
    for line in lines:
        if line.startswith(b"data: "):
            got += 1
            if got == 5:
                break
    assert server.used_blocks() > idle
    r.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # drop the connection mid-stream
    r.close()
    assert server.wait_idle() == idle
    m = server.metrics()
    assert m["bie_generation_tokens_total"] < 10000
    assert "finish=cancelled" in server.logs()


def test_device_memory_metrics(server):
    # On a GPU the device-local bytes are held from start-up (the start-up report's weights +
    # workspace + KV pools; tests/test_vulkan_engine.cpp checks the equality) and never grow.
    m = server.metrics()
    if DEVICE:
        assert "memory on vulkan:" in server.logs()
        assert m["bie_device_memory_bytes"] > 0
        assert m["bie_device_memory_peak_bytes"] == m["bie_device_memory_bytes"]
    else:
        assert m["bie_device_memory_bytes"] == 0


def test_metrics_names(server):
    m = server.metrics()
    for name in ["bie_prefix_cache_hit_rate", "bie_preemptions_total",
                 "bie_admission_refusals_total", "bie_requests_running", "bie_requests_waiting",
                 "bie_prompt_tokens_total", "bie_generation_tokens_total",
                 "bie_time_to_first_token_seconds_count", "bie_inter_token_latency_seconds_count",
                 "bie_batch_size_mean"]:
        assert name in m, name
    assert any(k.startswith("bie_kv_blocks_total{format=") for k in m)
    assert m["bie_time_to_first_token_seconds_count"] >= 1


def test_sigterm_finishes_inflight_and_exits_0():
    s = ServerProcess("--max-model-len", "512", "--max-num-seqs", "2", "--kv-cache-memory", "64MiB")
    result = {}

    def stream():
        r = requests.post(s.url + "/v1/completions", stream=True, timeout=60,
                          json={"prompt": "Count:", "max_tokens": toks(40, 10),
                                "ignore_eos": True, "stream": True})
        result["lines"] = [l for l in r.iter_lines() if l.startswith(b"data: ")]

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)
    # A CPU Vulkan driver (BIE_E2E_DEVICE) runs its 10 tokens at about half a token per second.
    assert s.stop(signal.SIGTERM, timeout=600 if DEVICE else 60) == 0
    t.join(timeout=30)
    logs = s.logs()
    assert result["lines"][-1] == b"data: [DONE]"
    assert len(result["lines"]) >= toks(40, 10)
    assert "SIGTERM" in logs
