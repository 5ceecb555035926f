"""n > 1 and echo through the real bie-serve with the official openai client (default model,
greedy and seeded): n choices come back with their indexes (streaming too, each chunk naming its
choice), greedy choices equal the n = 1 answer, usage counts every choice's tokens and the prompt
once; echo puts the prompt's text before the completion; the bad combinations are 400s. The KV
sharing itself (one copy of the prompt's blocks) is asserted in tests/test_engine_choices.cpp."""
import openai
import pytest
import requests

from conftest import ServerProcess


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "512", "--max-num-seqs", "4", "--kv-cache-memory", "64MiB")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


MSGS = [{"role": "user", "content": "Name a fruit."}]


def test_n_choices_greedy_and_seeded(client, server):
    one = client.chat.completions.create(model="default", messages=MSGS, temperature=0,
                                         max_tokens=12)
    four = client.chat.completions.create(model="default", messages=MSGS, temperature=0,
                                          max_tokens=12, n=4)
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    for c in four.choices:
        assert c.message.content == one.choices[0].message.content
        assert c.finish_reason == one.choices[0].finish_reason
    assert four.usage.prompt_tokens == one.usage.prompt_tokens
    assert four.usage.completion_tokens == 4 * one.usage.completion_tokens
    seeded = client.chat.completions.create(model="default", messages=MSGS, temperature=1.0,
                                            max_tokens=16, n=3, seed=5)
    assert len({c.message.content for c in seeded.choices}) > 1, seeded
    again = client.chat.completions.create(model="default", messages=MSGS, temperature=1.0,
                                           max_tokens=16, n=3, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content
                                                          for c in seeded.choices]
    assert server.wait_idle() == 0


def test_n_choices_stream_with_indexes(client):
    whole = client.completions.create(model="default", prompt="The capital of France is",
                                      temperature=1.0, max_tokens=10, n=3, seed=11)
    texts, reasons = {}, {}
    for chunk in client.completions.create(model="default", prompt="The capital of France is",
                                           temperature=1.0, max_tokens=10, n=3, seed=11,
                                           stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        if chunk.usage:
            usage = chunk.usage
    assert sorted(texts) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [c.text for c in whole.choices]
    assert sorted(reasons) == [0, 1, 2]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_echo(client, server):
    prompt = "The capital of France is"
    plain = client.completions.create(model="default", prompt=prompt, temperature=0, max_tokens=6)
    echoed = client.completions.create(model="default", prompt=prompt, temperature=0,
                                       max_tokens=6, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="default", prompt=prompt, temperature=0, max_tokens=6, echo=True, stream=True))
    assert streamed == echoed.choices[0].text
    r = requests.post(server.url + "/v1/completions", timeout=30, json={
        "prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
    r = requests.post(server.url + "/v1/completions", timeout=30,
                      json={"prompt": prompt, "max_tokens": 2, "n": 5})
    assert r.status_code == 400 and "n must be in [1, 4]" in r.json()["error"]["message"], r.text
