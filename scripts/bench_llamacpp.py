#!/usr/bin/env python3
"""Benchmark llama.cpp (through llama-cpp-python) on the CPU: the baseline BIE is compared with.

    .venv-ref/bin/python scripts/bench_llamacpp.py \
        --model ~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 [--json]

Measures, each as the median of --runs runs after one warm-up run:
  pp128, pp512  prompt processing of a 128 / 512 token prompt in one llama_decode call (n_batch 512),
                starting from an empty KV cache
  tg128         decode of 128 tokens, one token per llama_decode, greedy, after a 1-token prompt
                (the same shape as llama-bench's tg128)
  --depth D     (list) also: tg at context depth D — the cache is first filled with D prompt tokens
                (untimed, like llama-bench -d), then --tg tokens are decoded and timed
  --type-k/-v   KV cache types (f16, q8_0, q4_0); quantised V needs --flash-attn on
Times come from llama.cpp's own counters (llama_perf_context: t_p_eval_ms / t_eval_ms), which
exclude Python overhead; wall-clock tok/s around the same calls is reported next to them.
Peak RSS: peak_rss_mib is llama.cpp's own share, this process's peak (ru_maxrss = VmHWM; the
model is mmapped, so it counts the pages touched) minus the peak of an idle interpreter of the
same Python with numpy imported, measured in a child process (baseline_rss_mib): what a
llama.cpp program without Python would hold, to within the llama_cpp module's own Python objects.
peak_rss_process_mib is the whole process, Python included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    import llama_cpp
    from llama_cpp import Llama
except ImportError:  # pragma: no cover
    sys.exit("bench_llamacpp: llama_cpp not importable; run scripts/setup_reference.sh and use its python")

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
            "q4_0": llama_cpp.GGML_TYPE_Q4_0}

LLAMA_CPP_COMMIT_BY_VERSION = {"0.3.36": "0c1e57098"}  # from llama-cpp-python's CHANGELOG

FILLER = (
    "In the beginning the engineers measured everything twice, because the machines were slow and "
    "the budgets were small. They wrote down how many tokens each second the model could read, how "
    "many it could write, and how much memory it needed to keep its cache of keys and values. "
    "Numbers like these decide whether a model fits on a laptop or needs a server room. "
)


def prompt_tokens(llm: Llama, n: int) -> list[int]:
    ids = llm.tokenize(FILLER.encode(), add_bos=False, special=False)
    bos = [llm.token_bos()] if llm._model.add_bos_token() else []
    out = list(bos)
    while len(out) < n:
        out += ids
    return out[:n]


def clear(llm: Llama) -> None:
    llm.reset()
    mem = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_clear(mem, True)
    llama_cpp.llama_perf_context_reset(llm.ctx)


def run_pp(llm: Llama, toks: list[int]) -> tuple[float, float]:
    clear(llm)
    t0 = time.perf_counter()
    llm.eval(toks)
    llama_cpp.llama_synchronize(llm.ctx)  # perf counters are updated on synchronize
    wall = time.perf_counter() - t0
    perf = llama_cpp.llama_perf_context(llm.ctx)
    n, ms = perf.n_p_eval, perf.t_p_eval_ms
    perf_tps = n / ms * 1000.0 if n > 0 and ms > 0 else float("nan")
    return perf_tps, len(toks) / wall


def run_tg(llm: Llama, n_gen: int, depth: int = 0) -> tuple[float, float]:
    clear(llm)
    if depth > 0:
        llm.eval(prompt_tokens(llm, depth))
    else:
        first = llm.token_bos() if llm.token_bos() >= 0 else prompt_tokens(llm, 1)[0]
        llm.eval([first])
    llama_cpp.llama_perf_context_reset(llm.ctx)
    n_vocab = llm.n_vocab()
    t0 = time.perf_counter()
    for _ in range(n_gen):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
    llama_cpp.llama_synchronize(llm.ctx)
    wall = time.perf_counter() - t0
    perf = llama_cpp.llama_perf_context(llm.ctx)
    n, ms = perf.n_eval, perf.t_eval_ms
    perf_tps = n / ms * 1000.0 if n > 0 and ms > 0 else float("nan")
    return perf_tps, n_gen / wall


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except Exception:
        pass
    return platform.processor() or "unknown"


def idle_interpreter_hwm_kib() -> int:
    """Peak RSS (VmHWM, KiB) of this Python with numpy imported and nothing else, in a child."""
    code = ("import numpy\n"
            "for line in open('/proc/self/status'):\n"
            "    if line.startswith('VmHWM:'):\n"
            "        print(int(line.split()[1]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pp", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--depth", type=int, nargs="*", default=[],
                    help="also time tg at these context depths (cache pre-filled, untimed)")
    ap.add_argument("--type-k", default="f16", choices=sorted(KV_TYPES))
    ap.add_argument("--type-v", default="f16", choices=sorted(KV_TYPES))
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off",
                    help="llama-cpp-python's flash_attn (its default is off)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()

    path = os.path.expanduser(args.model)
    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=args.n_ctx, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.n_batch, n_ubatch=args.n_batch,
                type_k=KV_TYPES[args.type_k], type_v=KV_TYPES[args.type_v],
                flash_attn=args.flash_attn == "on",
                logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0

    results = []
    for n in args.pp:
        toks = prompt_tokens(llm, n)
        run_pp(llm, toks)  # warm-up
        runs = [run_pp(llm, toks) for _ in range(args.runs)]
        results.append({"test": f"pp{n}", "n_tokens": n,
                         "tok_s": statistics.median(r[0] for r in runs),
                         "tok_s_wall": statistics.median(r[1] for r in runs),
                         "runs_tok_s": [round(r[0], 2) for r in runs]})
    run_tg(llm, min(16, args.tg))  # warm-up
    runs = [run_tg(llm, args.tg) for _ in range(args.runs)]
    results.append({"test": f"tg{args.tg}", "n_tokens": args.tg,
                    "tok_s": statistics.median(r[0] for r in runs),
                    "tok_s_wall": statistics.median(r[1] for r in runs),
                    "runs_tok_s": [round(r[0], 2) for r in runs]})

    for d in args.depth:
        runs = [run_tg(llm, args.tg, d) for _ in range(args.runs)]
        results.append({"test": f"tg{args.tg}@d{d}", "n_tokens": args.tg, "depth": d,
                         "tok_s": statistics.median(r[0] for r in runs),
                         "tok_s_wall": statistics.median(r[1] for r in runs),
                         "runs_tok_s": [round(r[0], 2) for r in runs]})

    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    baseline_kib = idle_interpreter_hwm_kib()
    ver = getattr(llama_cpp, "__version__", "unknown")
    report = {
        "model": os.path.basename(path),
        "model_bytes": os.path.getsize(path),
        "threads": args.threads, "type_k": args.type_k, "type_v": args.type_v,
        "flash_attn": args.flash_attn, "n_batch": args.n_batch, "n_ctx": args.n_ctx, "runs": args.runs,
        "llama_cpp_python_version": ver,
        "llama_cpp_commit": LLAMA_CPP_COMMIT_BY_VERSION.get(ver, "unknown"),
        "cpu": cpu_model(), "nproc": os.cpu_count(),
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "load_s": round(load_s, 3),
        "peak_rss_mib": round((maxrss_kib - baseline_kib) / 1024.0, 1),
        "peak_rss_process_mib": round(maxrss_kib / 1024.0, 1),
        "baseline_rss_mib": round(baseline_kib / 1024.0, 1),
        "peak_rss_method": "VmHWM of this process minus VmHWM of an idle child interpreter "
                           "(same python, numpy imported)",
        "results": [{**r, "tok_s": round(r["tok_s"], 2), "tok_s_wall": round(r["tok_s_wall"], 2)}
                    for r in results],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"llama.cpp {report['llama_cpp_commit']} via llama-cpp-python {ver} | {report['model']} | "
          f"threads {args.threads} | KV {args.type_k}/{args.type_v} FA {args.flash_attn} | n_batch {args.n_batch} | median of {args.runs}")
    print(f"CPU: {report['cpu']} ({report['nproc']} logical)")
    print(f"{'test':<12} {'tok/s':>10} {'tok/s wall':>11}   runs (tok/s, llama.cpp timers)")
    for r in report["results"]:
        print(f"{r['test']:<12} {r['tok_s']:>10.2f} {r['tok_s_wall']:>11.2f}   {r['runs_tok_s']}")
    print(f"peak RSS: {report['peak_rss_mib']} MiB llama.cpp (process {report['peak_rss_process_mib']} "
          f"MiB minus idle python+numpy {report['baseline_rss_mib']} MiB)   load: {report['load_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
