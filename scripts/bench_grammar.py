#!/usr/bin/env python3
"""Grammar overhead: decode tokens/s of one streaming request with response_format json_schema
against the same request unconstrained, interleaved (A, B, A, B, ...), medians.

Both arms generate exactly --max-tokens tokens: the unconstrained arm with ignore_eos, the
constrained one with a schema whose string is longer than the budget (so it ends on "length").
Decode tok/s of a request = (completion tokens - 1) / (time of the last token - time of the
first), measured by the client, so the prompt and the grammar's set-up are left out.

  scripts/bench_grammar.py --bin build/bie-serve --gguf ~/.cache/bie/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  scripts/bench_grammar.py --url http://127.0.0.1:8080     # a server already running
Standard library only.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "steps": {"type": "array", "minItems": 8, "maxItems": 8,
              "items": {"type": "object", "properties": {
                  "n": {"type": "integer", "minimum": 1, "maximum": 99},
                  "text": {"type": "string", "minLength": 40, "maxLength": 120}},
                  "required": ["n", "text"], "additionalProperties": False}}},
    "required": ["title", "steps"], "additionalProperties": False}
PROMPT = "Give step-by-step instructions for baking bread at home, as JSON."


def stream(url, body, timeout):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:400]}")
    times, n_tokens, reason = [], 0, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            n_tokens = chunk["usage"]["completion_tokens"]
        for c in chunk.get("choices", []):
            if c.get("delta", {}).get("content"):
                times.append(time.perf_counter())
            reason = c.get("finish_reason") or reason
    conn.close()
    return n_tokens, times, reason


def one(url, model, constrained, max_tokens, timeout):
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "recipe", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    n, times, reason = stream(url, body, timeout)
    if n != max_tokens or len(times) < 2:
        raise RuntimeError(f"{'json_schema' if constrained else 'free'}: {n} tokens "
                           f"(finish {reason}); expected {max_tokens}")
    return (n - 1) / (times[-1] - times[0])


def start_server(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [args.bin, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(args.threads), "--max-model-len", "2048", "--max-num-seqs", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("bie-serve did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--bin", default="build/bie-serve")
    ap.add_argument("--gguf", default=os.path.expanduser(
        "~/.cache/bie/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=5, help="pairs of requests (A, B)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    try:
        one(url, args.model, True, args.max_tokens, args.timeout)  # warm-up: trie, caches
        one(url, args.model, False, args.max_tokens, args.timeout)
        free, constrained = [], []
        for _ in range(args.rounds):
            free.append(one(url, args.model, False, args.max_tokens, args.timeout))
            constrained.append(one(url, args.model, True, args.max_tokens, args.timeout))
        mf, mc = statistics.median(free), statistics.median(constrained)
        print(f"unconstrained decode tok/s: median {mf:.2f}  runs {' '.join(f'{x:.2f}' for x in free)}")
        print(f"json_schema   decode tok/s: median {mc:.2f}  runs "
              f"{' '.join(f'{x:.2f}' for x in constrained)}")
        print(f"ratio json_schema / unconstrained: {mc / mf:.3f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
