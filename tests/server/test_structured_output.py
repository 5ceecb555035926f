"""Structured output through the real bie-serve with the official openai client, greedy: 200
json_schema requests over 10 schemas (nested objects, arrays, enums, required/optional
properties, bounded numbers, patterns) sent concurrently to Qwen2.5-Coder-0.5B (the grammar, not
the model, makes an answer valid: the smaller model of the family runs them 3x sooner), every
answer validated with `jsonschema`; then on Qwen2.5-Coder-1.5B json_object; a forced tool call whose arguments validate against the
tool's parameters; logit_bias; and the bad inputs (an unsupported or invalid schema, a tool with a
bad schema: 400 naming the keyword; a tool call the model breaks: text with its finish reason)."""
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests

from conftest import ServerProcess

MODELS = os.path.join(os.environ.get("BIE_HOME", os.path.expanduser("~/.cache/bie")), "models")
QWEN = os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
QWEN_SMALL = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
CONCURRENCY = 8


def start(model):
    if not os.path.exists(model):
        if os.environ.get("BIE_ALLOW_MISSING_MODELS") == "1":
            pytest.skip(f"{model} not fetched (BIE_ALLOW_MISSING_MODELS=1)")
        raise AssertionError(f"{model} is missing: run `make models`")
    return ServerProcess("-m", model, "--max-model-len", "1024", "--max-num-seqs",
                         str(CONCURRENCY), "--kv-cache-memory", "256MiB")


@pytest.fixture(scope="module")
def server():
    s = start(QWEN)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def small_client():
    s = start(QWEN_SMALL)
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
    s.stop()


def s(properties, required=None):
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False}


# (name, schema, what to ask about): small schemas whose every value is bounded, so an answer
# completes well within max_tokens.
SCHEMAS = [
    ("person", s({"name": {"type": "string", "maxLength": 12},
                  "age": {"type": "integer", "minimum": 0, "maximum": 120}}), "a person"),
    ("color", s({"color": {"type": "string", "enum": ["red", "green", "blue"]},
                 "bright": {"type": "boolean"}}), "the color of a thing"),
    ("tags", s({"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                         "minItems": 1, "maxItems": 3}}), "tags for a topic"),
    ("point", s({"label": {"type": "string", "maxLength": 6},
                 "at": s({"x": {"type": "integer", "minimum": -50, "maximum": 50},
                          "y": {"type": "integer", "minimum": -50, "maximum": 50}})}),
     "a point on a map"),
    ("book", s({"title": {"type": "string", "maxLength": 16},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                "pages": {"type": "integer", "minimum": 1, "maximum": 999}},
               required=["title"]), "a book"),
    ("price", s({"price": {"type": "number", "minimum": 0, "maximum": 1000},
                 "currency": {"type": "string", "enum": ["EUR", "USD"]}}), "the price of a thing"),
    ("code", s({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
     "an airport-style code"),
    ("flag", s({"ok": {"type": "boolean"},
                "note": {"type": ["string", "null"], "maxLength": 10}}), "whether a claim holds"),
    ("list", s({"items": {"type": "array", "maxItems": 2,
                          "items": s({"id": {"type": "integer", "minimum": 1, "maximum": 99}})}}),
     "a short list of ids"),
    ("value", {"$defs": {"unit": {"type": "string", "enum": ["m", "kg", "s"]}},
               **s({"kind": {"const": "measure"},
                    "amount": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 500},
                                         {"type": "string", "maxLength": 5}]},
                    "unit": {"$ref": "#/$defs/unit"}})}, "a measurement"),
]
SUBJECTS = ["Paris", "a cat", "the moon", "coffee", "a bicycle", "Mozart", "a river", "chess",
            "a volcano", "bread", "a violin", "Tokyo", "a comet", "tea", "a lighthouse", "Newton",
            "a desert", "tennis", "a glacier", "honey"]


def ask_schema(client, name, schema, about, subject):
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": f"Give {about} related to {subject}, as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": name, "schema": schema, "strict": True}})
    return r.choices[0]


def test_200_json_schema_requests_validate(small_client):
    client = small_client
    jobs = [(n, sc, about, subj) for n, sc, about in SCHEMAS for subj in SUBJECTS]
    assert len(jobs) == 200
    t0 = time.time()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        choices = list(pool.map(lambda j: ask_schema(client, *j), jobs))
    elapsed = time.time() - t0
    failures = []
    for (name, schema, _, subj), c in zip(jobs, choices):
        try:
            assert c.finish_reason == "stop", c.finish_reason
            jsonschema.validate(json.loads(c.message.content), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as e:
            failures.append((name, subj, c.message.content, str(e)[:200]))
    print(f"200 json_schema requests in {elapsed:.1f} s")
    assert not failures, failures
    # Not one fixed answer per schema: the model follows the prompt inside the grammar.
    assert len({c.message.content for c in choices}) > 100


def test_json_schema_streams_and_works_on_completions(client, server):
    name, schema, about = SCHEMAS[0]
    text = ""
    for chunk in client.chat.completions.create(
            model="default", temperature=0, max_tokens=80, stream=True,
            messages=[{"role": "user", "content": f"Give {about} related to Rome, as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": name,
                                                                     "schema": schema}}):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    jsonschema.validate(json.loads(text), schema)
    r = requests.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "A person, as JSON:", "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), schema)


def test_json_object(client):
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=60, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Reply with only a JSON object with two keys, "
                                              "the name and the age of a dog."}])
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert isinstance(json.loads(c.message.content), dict), c.message.content


BOOKING = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table at a restaurant",
    "parameters": s({"restaurant": {"type": "string", "maxLength": 20},
                     "people": {"type": "integer", "minimum": 1, "maximum": 12},
                     "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}})}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": s({"city": {"type": "string", "maxLength": 20},
                     "unit": {"type": "string", "enum": ["C", "F"]}})}}


def test_forced_tool_call_arguments_validate(client):
    msgs = [{"role": "user", "content": "Hi! Tell me a joke about tables."}]
    for choice, name in (({"type": "function", "function": {"name": "book_table"}}, "book_table"),
                         ("required", None)):
        for stream in (False, True):
            kw = dict(model="default", temperature=0, max_tokens=80, messages=msgs,
                      tools=[WEATHER, BOOKING], tool_choice=choice)
            if stream:
                calls, reasons = {}, []
                for chunk in client.chat.completions.create(stream=True, **kw):
                    for tc in chunk.choices[0].delta.tool_calls or []:
                        calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
                        calls[tc.index]["arguments"] += tc.function.arguments or ""
                    if chunk.choices[0].finish_reason:
                        reasons.append(chunk.choices[0].finish_reason)
                assert reasons == ["tool_calls"], (choice, reasons)
                call = calls[0]
            else:
                c = client.chat.completions.create(**kw).choices[0]
                assert c.finish_reason == "tool_calls", (choice, c)
                call = c.message.tool_calls[0].function.model_dump()
            tool = {"book_table": BOOKING, "get_weather": WEATHER}[call["name"]]
            assert name is None or call["name"] == name
            jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])


def test_broken_tool_call_is_text_with_its_finish_reason(client):
    # Cut off inside the call: not valid JSON, so no tool_calls; the text and "length" stay.
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=12, tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris right now?"}])
    c = r.choices[0]
    assert not c.message.tool_calls, c
    assert c.finish_reason == "length", c
    assert "get_weather" in c.message.content, c  # (Qwen writes it <tool_call>-tagged or fenced)


def test_logit_bias(server):
    # Qwen2's byte-level vocabulary starts with the printable ASCII bytes: id 15 is "0", 16 "1".
    url = server.url + "/v1/completions"
    base = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
    free = requests.post(url, json=base, timeout=60).json()["choices"][0]["text"]
    assert free != "000"
    forced = requests.post(url, json={**base, "logit_bias": {"15": 100}}, timeout=60)
    assert forced.json()["choices"][0]["text"] == "000", forced.text
    # -100 wins over the model's preference; the other bias then decides.
    chat = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Say 0."}], "max_tokens": 3, "temperature": 0,
        "logit_bias": {"15": -100, "16": 100}})
    assert chat.json()["choices"][0]["message"]["content"] == "111", chat.text
    for bad in ({"5": 101}, {"x": 1}, {"999999999": 1}, {"5": "1"}):
        r = requests.post(url, json={**base, "logit_bias": bad}, timeout=10)
        assert r.status_code == 400, (bad, r.text)


def test_bad_schemas_are_400_naming_the_keyword(server):
    url = server.url + "/v1/chat/completions"
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def rf(schema):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}

    cases = [
        (rf({"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}),
         "response_format.json_schema.schema", "'format' at #/properties/when"),
        (rf({"type": "string", "pattern": "(?=a)"}), "response_format.json_schema.schema",
         "'pattern'"),
        (rf({"type": "integer", "minimum": "zero"}), "response_format.json_schema.schema",
         "minimum"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}}],
          "tool_choice": "required"},
         "tools[0].function.parameters", "'format' at #/properties/a"),
        ({"tools": [WEATHER, {"type": "function", "function": {"name": "g", "parameters": {
            "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "tools[1].function.parameters", "'multipleOf'"),
    ]
    for extra, param, words in cases:
        r = requests.post(url, json={**base, **extra}, timeout=30)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == param, r.text
        assert words in err["message"], r.text
