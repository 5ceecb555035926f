#!/usr/bin/env python3
"""Serving throughput: C concurrent streaming clients against an OpenAI-compatible server.

Each client loops over its prompts, sending /v1/chat/completions with stream=true and greedy decoding
(chat completions, temperature 0, max_tokens, stopping at EOS like any client), and records the time
to first token and the gaps between tokens. Reports output tokens/s over the whole run (all
clients), requests/s, and TTFT / inter-token latency p50 and p99. Works against bie-serve and
llama.cpp's C++ llama-server alike, so both can be run side by side on the same model file,
threads and prompts:

  scripts/bench_serve.py --server bie --threads 2              # starts build/bie-serve
  scripts/bench_serve.py --server llama-server --threads 2     # build/ref-native/bin/llama-server
  scripts/bench_serve.py --url http://127.0.0.1:8080           # a server already running
llama-server is the serving peer (scripts/setup_reference.sh native builds it): 16 parallel slots
over a 32,768-token context with continuous batching (-np 16 -c 32768), i.e. 2,048 tokens per
slot, the same per-sequence length bie-serve is started with. `--server llamacpp` (Python's
llama_cpp.server, one request at a time) is kept for old comparisons only; it is no peer.
Only the Python standard library is used.
"""
import argparse
import http.client
import os
import socket
import subprocess
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten-year-old.",
    "List five ideas for a weekend trip and say why each is fun.",
    "Describe the water cycle in a few paragraphs.",
    "Write a friendly email inviting a colleague to lunch on Friday.",
    "What are the benefits of regular exercise? Answer in detail.",
    "Summarise the plot of a detective novel you would like to read.",
    "Give step-by-step instructions for baking bread at home.",
]


def stream_one(url, model, prompt, max_tokens, timeout, ignore_eos):
    """One streamed greedy chat completion (both servers apply the model's chat template).
    Returns (streamed tokens, ttft_s, [inter-token gaps]); a token is a chunk with content."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    if ignore_eos:
        body["ignore_eos"] = True  # bie-serve (and vLLM) extension
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    n, ttft, gaps, last = 0, None, [], None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        choices = chunk.get("choices") or []
        if not choices or not (choices[0].get("delta") or {}).get("content"):
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            gaps.append(now - last)
        last = now
        n += 1
    conn.close()
    return n, ttft or 0.0, gaps


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    """Starts bie-serve or llama.cpp's server on a free port; returns (process, url)."""
    port = free_port()
    if args.server == "bie":
        cmd = [args.bin, "-m", args.gguf, "--port", str(port), "--threads", str(args.threads),
               "--max-num-seqs", "16", "--max-model-len", "2048"] + args.bie_args.split()
    elif args.server == "llama-server":
        cmd = [args.llama_server, "-m", args.gguf, "--port", str(port), "-t", str(args.threads),
               "-tb", str(args.threads), "-np", "16", "-c", "32768", "--cont-batching"]
        return launch(cmd, port, "/health"), f"http://127.0.0.1:{port}"
    else:
        # llama.cpp's Python server runs one request at a time; without this flag a new request
        # aborts the running one instead of queueing.
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.gguf, "--port", str(port),
               "--n_threads", str(args.threads), "--n_ctx", "2048", "--interrupt_requests", "False"]
    return launch(cmd, port, "/v1/models"), f"http://127.0.0.1:{port}"


def launch(cmd, port, ready_path):
    """Starts a server process and waits until GET ready_path answers 200 (120 s at most)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", ready_path)
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("server did not start: " + " ".join(cmd))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(args, conc):
    results, errors = [], []
    lock = threading.Lock()
    counter = iter(range(args.requests))

    def worker():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                r = stream_one(args.url, args.model, PROMPTS[i % len(PROMPTS)], args.max_tokens,
                               args.timeout, args.ignore_eos)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 — reported, not fatal
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    toks = sum(r[0] for r in results)
    ttfts = [r[1] for r in results]
    gaps = [g for r in results for g in r[2]]
    return {
        "concurrency": conc,
        "requests": len(results),
        "errors": len(errors),
        "output_tokens": toks,
        "wall_s": round(wall, 3),
        "output_tok_s": round(toks / wall, 2) if wall > 0 else 0,
        "ttft_p50_s": round(pct(ttfts, 50), 4),
        "ttft_p99_s": round(pct(ttfts, 99), 4),
        "itl_p50_ms": round(1000 * pct(gaps, 50), 2),
        "itl_p99_ms": round(1000 * pct(gaps, 99), 2),
        "first_error": errors[0] if errors else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="measure a server already running at this URL")
    ap.add_argument("--server", choices=["bie", "llama-server", "llamacpp"], default="bie",
                    help="which server to start when --url is not given (llamacpp: Python's "
                         "one-request-at-a-time llama_cpp.server, not a serving peer)")
    ap.add_argument("--llama-server", default="build/ref-native/bin/llama-server",
                    help="llama.cpp's C++ server binary for --server llama-server")
    ap.add_argument("--gguf", default=os.path.expanduser(
        "~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf"), help="model file to serve")
    ap.add_argument("--bin", default="build/bie-serve")
    ap.add_argument("--bie-args", default="", help="extra bie-serve flags, e.g. "
                    "'--speculative-draft-tokens 3'")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model", default=None, help="model name in requests (default: /v1/models)")
    ap.add_argument("--concurrency", default="1,4,16", help="comma list of client counts")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default 2 x clients, at least 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="ask for exactly --max-tokens tokens (bie-serve only; unfair vs servers "
                         "that stop at EOS)")
    ap.add_argument("--label", default="", help="name printed with each row (e.g. bie, llama.cpp)")
    ap.add_argument("--json", action="store_true", help="one JSON object per level")
    args = ap.parse_args()
    proc = None
    if args.url is None:
        proc, args.url = start_server(args)
        if not args.label:
            args.label = args.server
    try:
        if args.model is None:
            u = urllib.parse.urlparse(args.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            conn.request("GET", "/v1/models")
            args.model = json.loads(conn.getresponse().read())["data"][0]["id"]
        run_levels(args)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


def run_levels(args):
    for conc in [int(c) for c in args.concurrency.split(",")]:
        n_req = args.requests or max(4, 2 * conc)
        level_args = argparse.Namespace(**{**vars(args), "requests": n_req})
        r = run_level(level_args, conc)
        r["label"] = args.label
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"{args.label:>10} c={conc:>3} req={r['requests']:>3} err={r['errors']} "
                  f"out {r['output_tok_s']:8.2f} tok/s  ttft p50 {r['ttft_p50_s']:.3f}s "
                  f"p99 {r['ttft_p99_s']:.3f}s  itl p50 {r['itl_p50_ms']:.1f}ms p99 {r['itl_p99_ms']:.1f}ms",
                  flush=True)
            if r["first_error"]:
                print(f"  first error: {r['first_error']}", file=sys.stderr)


if __name__ == "__main__":
    main()
