"""Operations end to end (BRIEF §3): the real bie-serve with a 4-bit default regime, an int8
regime requests may ask for, a length policy, and the f16 kill switch behind the API key. Every
response names its regime (bie.kv) and the server logs it."""
import openai
import pytest
import requests

from conftest import ServerProcess

KEY = "ops-key"


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "1024", "--max-num-seqs", "4", "--kv-cache-memory",
                      "64MiB", "--kv-cache-dtype", "int4_asym", "--kv-regimes", "int8",
                      "--kv-policy", "fp8_e4m3:900-", api_key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def kv_of(client, **extra):
    r = client.completions.create(model="default", prompt="The capital of France is",
                                  max_tokens=4, temperature=0, **extra)
    return r.model_extra["bie"]["kv"], r.choices[0].text


def test_regimes_policy_override_and_kill_switch(server, client):
    assert requests.get(server.url + "/admin/kv-policy").status_code == 401
    info = requests.get(server.url + "/admin/kv-policy", headers=server.headers()).json()
    names = [r["name"] for r in info["regimes"]]
    assert names == ["int4_asym", "f16", "int8", "fp8_e4m3"], info
    assert info["force_f16"] is False and info["policy"] == "fp8_e4m3:900-"
    default_kv, text4 = kv_of(client)
    assert default_kv == "k=int4_channel_t64 v=int4_asym_g64"
    assert kv_of(client, extra_body={"kv_cache_dtype": "int8"})[0] == "k=int8_channel_t64 v=int8"
    # prompt + max_tokens >= 900: the policy's regime
    r = client.completions.create(model="default", prompt="Hello", max_tokens=950, temperature=0,
                                  stop=["."])
    assert r.model_extra["bie"]["kv"] == "fp8_e4m3"
    with pytest.raises(openai.BadRequestError):
        kv_of(client, extra_body={"kv_cache_dtype": "int3"})

    on = requests.post(server.url + "/admin/kv-policy", json={"force_f16": True},
                       headers=server.headers())
    assert on.status_code == 200 and on.json()["force_f16"] is True
    assert server.metrics()["bie_kv_force_f16"] == 1
    kv, text16 = kv_of(client, extra_body={"kv_cache_dtype": "int8"})
    assert kv == "f16"
    assert "kill switch" not in text16  # plain generation still works
    off = requests.post(server.url + "/admin/kv-policy", json={"force_f16": False},
                        headers=server.headers())
    assert off.status_code == 200 and off.json()["force_f16"] is False
    assert kv_of(client)[0] == default_kv
    server.wait_idle()
    assert server.used_blocks() == 0
    logs = server.logs()
    assert "kv=f16" in logs and "kv=k=int8_channel_t64 v=int8" in logs and "force_f16 on" in logs


LEDGER = "".join(f"Entry {i}: crate {7 * i + 3} went to the harbour at dawn.\n" for i in range(48))
PROMPT = LEDGER + "The secret code is 4417.\nQuestion: What is the secret code?\nAnswer:"


@pytest.fixture(scope="module")
def fallback_server():
    # Threshold 1: every prompt that reaches its quantised body is spiky enough to fall back.
    s = ServerProcess("--max-model-len", "1024", "--max-num-seqs", "4", "--kv-cache-memory",
                      "64MiB", "--kv-cache-dtype", "int4_asym", "--kv-fallback-entropy", "1")
    yield s
    s.stop()


def test_spiky_requests_fall_back_and_say_so(fallback_server):
    s = fallback_server
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
    int8 = "k=int8_channel_t64 v=int8"
    r = c.completions.create(model="default", prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.model_extra["bie"]["kv"] == int8
    chunks = list(c.completions.create(model="default", prompt=PROMPT, max_tokens=4,
                                       temperature=0, stream=True))
    assert chunks and all(ch.model_extra["bie"]["kv"] == int8 for ch in chunks), \
        [ch.model_extra["bie"] for ch in chunks]
    # A short prompt sits in the FP16 sink and window: nothing to protect, the default serves.
    short = c.completions.create(model="default", prompt="The capital of France is",
                                 max_tokens=4, temperature=0)
    assert short.model_extra["bie"]["kv"] == "k=int4_channel_t64 v=int4_asym_g64"
    s.wait_idle()
    m = s.metrics()
    assert m["bie_kv_entropy_probes_total"] == 3
    assert m["bie_kv_fallbacks_total"] == 2
    assert s.used_blocks() == 0
    assert f"kv={int8}" in s.logs()


def test_fallback_flag_errors_are_one_line():
    for args, want in ((["--kv-fallback-entropy", "2"], "--kv-fallback-entropy must be in (0, 1]"),
                       (["--kv-fallback-entropy", "0.5", "--kv-fallback-regime", "int5"],
                        "--kv-fallback-entropy regime 'int5'")):
        with pytest.raises(RuntimeError) as e:
            ServerProcess("--max-model-len", "1024", "--kv-cache-dtype", "int4_asym", *args)
        assert want in str(e.value), str(e.value)
