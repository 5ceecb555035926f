#!/usr/bin/env python3
"""Output tokens/s (streamed text chunks / wall time, greedy, same prompts, EOS allowed) of an
OpenAI-compatible server at several numbers of concurrent streams
(reported, not asserted). Starts bie-serve or llama-cpp-python's server on the same GGUF, threads
and prompts, or measures a server already running (--url).

  build/.venv-test/bin/python scripts/bench_serve.py --server bie --threads 2
  /opt/bieref/bin/python scripts/bench_serve.py --server llamacpp --threads 2
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how a bicycle gear works.",
           "List ten uses for a paperclip.", "Describe the water cycle to a child.",
           "What makes a good cup of tea?", "Summarise the plot of a detective novel you invent."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_stream(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    n = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                chunk = json.loads(line[6:])
                n += sum(1 for c in chunk.get("choices", []) if c.get("text"))
    return n


def level(url, conc, n_tokens, model):
    per_client = 2
    counts = []
    lock = threading.Lock()

    def client(i):
        for k in range(per_client):
            body = {"model": model, "prompt": PROMPTS[(i + k) % len(PROMPTS)],
                    "max_tokens": n_tokens, "temperature": 0, "stream": True}
            c = post_stream(url, body)
            with lock:
                counts.append(c)

    t0 = time.time()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    return sum(counts), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", choices=["bie", "llamacpp"], default="bie")
    ap.add_argument("--url")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--bin", default="build/bie-serve")
    a = ap.parse_args()
    proc = None
    url = a.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if a.server == "bie":
            cmd = [a.bin, "-m", a.model, "--port", str(port), "--threads", str(a.threads),
                   "--max-num-seqs", "16", "--max-model-len", "2048"]
        else:
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", a.model, "--port",
                   str(port), "--n_threads", str(a.threads), "--n_ctx", "2048",
                   "--interrupt_requests", "False"]  # else a new request aborts the running one
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1)
                break
            except Exception:  # noqa: BLE001 - still starting
                time.sleep(0.1)
    try:
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        for conc in [int(x) for x in a.levels.split(",")]:
            n, wall = level(url, conc, a.tokens, model)
            print(f"{a.server}: {conc:3d} streams: {n} tokens in {wall:.1f}s = "
                  f"{n / wall:.1f} output tok/s", flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
