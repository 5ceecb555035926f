#!/usr/bin/env python3
"""Speculative decoding speed: decode tokens/s (first to last streamed token) of bie-serve with and without the n-gram drafter
(or, with --draft-model, a draft model),
on input-grounded tasks (the answer copies text from the prompt) and on open chat.

Starts two bie-serve processes on the same model (--speculative-draft-tokens 0 and GAMMA) and
sends each prompt to both in turn (interleaved, so machine noise hits both alike), greedy, one
stream at a time; reports the median tok/s per task class, the speed-up, and the drafter's
acceptance from /metrics. Greedy outputs must be identical; the script checks that too.

  scripts/bench_spec.py --threads 2 --gamma 5 --reps 3
  scripts/bench_spec.py --threads 2 --gamma 3 --reps 3 --draft-model default
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import free_port, launch  # noqa: E402

CODE = '''def parse_config(path):
    with open(path) as f:
        lines = f.readlines()
    config = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config


def save_config(path, config):
    with open(path, "w") as f:
        for key, value in config.items():
            f.write(f"{key} = {value}\\n")
'''

JSON_DOC = '''{"orders": [
  {"id": 1041, "customer": "Ada Lovelace", "city": "London", "items": ["notebook", "pen"], "total": 12.5},
  {"id": 1042, "customer": "Alan Turing", "city": "Manchester", "items": ["chess set"], "total": 30.0},
  {"id": 1043, "customer": "Grace Hopper", "city": "New York", "items": ["compiler manual", "tape"], "total": 45.25},
  {"id": 1044, "customer": "Edsger Dijkstra", "city": "Eindhoven", "items": ["fountain pen"], "total": 18.75}
]}'''

ARTICLE = ("The river had flooded twice that spring. \"We lost the lower field,\" said Marta Ruiz, "
           "who has farmed the valley for thirty years. \"But the orchard survived, and the bees "
           "came back in May.\" The county engineer, Tom Okafor, said the new levee would be "
           "finished by October. \"It will hold a hundred-year flood,\" he said, \"if it is "
           "maintained.\" Residents remain sceptical. \"They said that last time,\" Ruiz said.")

GROUNDED = [
    ("code-edit", "Rename the function parse_config to load_config everywhere in this code and "
                  "print the whole file again:\n\n" + CODE),
    ("json", "Rewrite this JSON so that every order also has a field \"currency\": \"EUR\" right "
             "after \"total\". Output only the JSON.\n\n" + JSON_DOC),
    ("quotes", "Summarise this article using direct quotes from it:\n\n" + ARTICLE),
]
OPEN = [
    ("chat", "What are three good hobbies for someone who works from home? Explain each."),
    ("chat", "Tell me a short story about a dragon who is afraid of the dark."),
    ("chat", "How do I make a good first impression at a new job?"),
]


def start(binary, gguf, threads, gamma, ngram="2:3", adaptive=False, draft=None):
    port = free_port()
    cmd = [binary, "-m", gguf, "--port", str(port), "--threads", str(threads),
           "--max-num-seqs", "4", "--max-model-len", "4096", "--no-enable-prefix-caching",
           "--speculative-draft-tokens", str(gamma), "--speculative-ngram", ngram]
    if adaptive:
        cmd.append("--speculative-adaptive")
    if draft and gamma > 0:
        cmd += ["--speculative-model", draft]
    return launch(cmd, port, "/health"), port


def chat(port, text, max_tokens):
    """Streams one greedy chat completion; returns (text, tokens, decode seconds): the time from
    the first streamed token to the last, so prefill does not dilute the comparison."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "default", "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = c.getresponse()
    out, n, first, last = "", 0, None, None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if chunk.get("usage"):
            n = chunk["usage"]["completion_tokens"]
        for ch in chunk.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                out += piece
    return out, n, max((last or 0) - (first or 0), 1e-9)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("bie_spec_"):
            k, v = line.split()
            out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bie-serve")
    ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ngram", default="2:3", help="--speculative-ngram MIN:MAX")
    ap.add_argument("--adaptive", action="store_true", help="--speculative-adaptive")
    ap.add_argument("--draft-model", help="--speculative-model PATH (draft model instead of n-grams)")
    ap.add_argument("--only", choices=["grounded", "chat"], help="run one task class")
    a = ap.parse_args()
    base, pb = start(a.bin, a.gguf, a.threads, 0)
    spec, ps = start(a.bin, a.gguf, a.threads, a.gamma, a.ngram, a.adaptive, a.draft_model)
    try:
        rows = {}
        for name, text in GROUNDED + OPEN:
            cls = "open chat" if name == "chat" else "grounded"
            if a.only and (a.only == "chat") != (name == "chat"):
                continue
            for _ in range(a.reps):
                t_b, n_b, w_b = chat(pb, text, a.max_tokens)
                t_s, n_s, w_s = chat(ps, text, a.max_tokens)
                if t_b != t_s:
                    print(f"OUTPUT DIFFERS for {name}", file=sys.stderr)
                rows.setdefault((cls, name), []).append(((n_b - 1) / w_b, (n_s - 1) / w_s, n_b))
        by_class = {}
        for (cls, name), r in rows.items():
            b = statistics.median(x[0] for x in r)
            s = statistics.median(x[1] for x in r)
            print(f"{cls:>9} {name:>9}: {r[0][2]:4d} tokens  base {b:6.1f} tok/s  spec {s:6.1f} "
                  f"tok/s  x{s / b:.2f}")
            by_class.setdefault(cls, []).append(s / b)
        for cls, ratios in by_class.items():
            print(f"{cls}: median speed-up x{statistics.median(ratios):.2f}")
        m = metrics(ps)
        print("drafter: acceptance {:.2f}, mean accepted per step {:.2f}, drafted {:.0f}".format(
            m.get("bie_spec_acceptance_rate", 0), m.get("bie_spec_mean_accepted_per_step", 0),
            m.get("bie_spec_draft_tokens_total", 0)))
    finally:
        for p in (base, spec):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
