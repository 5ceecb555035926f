#!/usr/bin/env python3
"""llama.cpp's KV-cache quantisation quality on the same model, text and windows as `bie quality`.

    /work/.venv-ref/bin/python scripts/kv_quality_llamacpp.py \
        --model ~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --text /work/shared/data/tinyshakespeare.txt --ctx 2048,8192 --chunks 4 --json

For each KV type (default f16, q8_0, q4_0; K and V the same type; flash attention on, which
llama.cpp needs for a quantised V cache) and each context size n: the text is tokenized once, as
BIE does (no BOS for models whose metadata says add_bos false, parse_special off), cut into
non-overlapping windows of n tokens, and each window is run from an empty cache in batches of
--batch tokens. Logits at positions n/2 .. n-2 score the next token (the second half, as
llama-perplexity and `bie quality`). Reported per type: perplexity, ΔPPL % against llama.cpp's
own f16 cache, mean KL(P_f16 || P_type) in nats and top-1 agreement at the scored positions.
All types run in lock step, one batch at a time, so only one batch of logits per type is held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

try:
    import llama_cpp
except ImportError:  # pragma: no cover
    sys.exit("kv_quality_llamacpp: llama_cpp not importable; use /work/.venv-ref/bin/python")

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
# Bytes per stored value, block metadata included (q8_0: 34 B per 32 values, q4_0: 18 B per 32).
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def log(msg: str) -> None:
    print(f"kv_quality_llamacpp: {msg}", file=sys.stderr, flush=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


class Runner:
    """One llama.cpp context with a given KV type; decodes batches and returns chosen logit rows."""

    def __init__(self, model: str, n_ctx: int, batch: int, threads: int, kv: str):
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch,
                                   n_threads=threads, n_threads_batch=threads, flash_attn=True,
                                   type_k=KV_TYPES[kv], type_v=KV_TYPES[kv], logits_all=False,
                                   verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.batch = llama_cpp.llama_batch_init(batch, 0, 1)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)

    def decode(self, tokens: list[int], pos0: int, want: list[bool]) -> np.ndarray:
        """Appends tokens at pos0..; returns the logits of the rows flagged in `want`, in order."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if want[i] else 0
        if llama_cpp.llama_decode(self.llm.ctx, b) != 0:
            sys.exit("kv_quality_llamacpp: llama_decode failed")
        n_out = sum(want)
        if n_out == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self.llm.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).copy()


def measure(args: argparse.Namespace, tokens: list[int], n: int, kvs: list[str], bos: int | None):
    runners = {kv: Runner(args.model, n, args.batch, args.threads, kv) for kv in kvs}
    n_windows = min(args.chunks, len(tokens) // n)
    first = n // 2
    stats = {kv: {"nll": 0.0, "kld": 0.0, "kld_max": 0.0, "top1": 0, "n": 0} for kv in kvs}
    t0 = time.time()
    for w in range(n_windows):
        log(f"[{time.time() - t0:7.1f} s] ctx {n} window {w + 1}/{n_windows}")
        win = tokens[w * n:(w + 1) * n]
        if bos is not None:
            win[0] = bos
        for r in runners.values():
            r.clear()
        for c0 in range(0, n, args.batch):
            chunk = win[c0:c0 + args.batch]
            # rows j in [first, n-1) score token j+1
            want = [first <= c0 + i < n - 1 for i in range(len(chunk))]
            targets = np.array([win[c0 + i + 1] for i in range(len(chunk)) if want[i]], dtype=np.int64)
            base = None
            for kv in kvs:
                logits = runners[kv].decode(chunk, c0, want)
                if len(targets) == 0:
                    continue
                st = stats[kv]
                for s0 in range(0, len(targets), 64):  # bounded float64 temporaries
                    lp = log_softmax(logits[s0:s0 + 64])
                    tg = targets[s0:s0 + 64]
                    st["nll"] += float(-lp[np.arange(len(tg)), tg].sum())
                    st["n"] += len(tg)
                    if kv == kvs[0]:
                        base = lp if s0 == 0 else np.concatenate([base, lp])
                        st["top1"] += len(tg)
                        continue
                    lb = base[s0:s0 + 64]
                    kld = (np.exp(lb) * (lb - lp)).sum(axis=1)
                    st["kld"] += float(kld.sum())
                    st["kld_max"] = max(st["kld_max"], float(kld.max()))
                    st["top1"] += int((lb.argmax(axis=1) == lp.argmax(axis=1)).sum())
    base_ppl = float(np.exp(stats[kvs[0]]["nll"] / stats[kvs[0]]["n"]))
    out = []
    for kv in kvs:
        st = stats[kv]
        ppl = float(np.exp(st["nll"] / st["n"]))
        out.append({"kv": kv, "n_ctx": n, "windows": n_windows, "n_scored": st["n"], "ppl": ppl,
                    "delta_ppl_pct": 100.0 * (ppl / base_ppl - 1.0), "mean_kld": st["kld"] / st["n"],
                    "max_kld": st["kld_max"], "top1": st["top1"] / st["n"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", default="2048", help="comma-separated window sizes")
    ap.add_argument("--chunks", type=int, default=4, help="windows per context size")
    ap.add_argument("--kv", default="f16,q8_0,q4_0", help="KV types; the first is the baseline")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.model = os.path.expanduser(args.model)
    kvs = args.kv.split(",")
    for kv in kvs:
        if kv not in KV_TYPES:
            sys.exit(f"kv_quality_llamacpp: unknown KV type '{kv}' (known: {', '.join(KV_TYPES)})")
    if kvs[0] != "f16":
        sys.exit("kv_quality_llamacpp: the first KV type is the baseline and must be f16")

    llama_cpp.llama_backend_init()
    with open(args.text, "rb") as f:
        text = f.read()
    probe = llama_cpp.Llama(model_path=args.model, n_ctx=64, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(probe.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    # add_special off and parse_special off: BIE's tokenization of the text (BOS, if the model
    # wants one, replaces the first token of each window, as llama-perplexity does).
    tokens = probe.tokenize(text, add_bos=False, special=False)
    bos = int(llama_cpp.llama_vocab_bos(vocab)) if add_bos else None
    if bos is not None:
        # llama-perplexity tokenizes with add_special: BOS in front of the text, and then the first
        # token of every window overwritten with BOS (measure); `bie quality` does the same.
        tokens = [bos] + tokens
    log(f"{len(tokens)} tokens; add_bos {add_bos}")
    del probe

    results = []
    for n in (int(x) for x in args.ctx.split(",")):
        if len(tokens) < n:
            sys.exit(f"kv_quality_llamacpp: the text has {len(tokens)} tokens, too few for a window of {n}")
        results += measure(args, tokens, n, kvs, bos)

    report = {
        "model": args.model, "text": args.text, "text_tokens": len(tokens), "threads": args.threads,
        "batch": args.batch, "flash_attn": True, "llama_cpp_python": llama_cpp.__version__,
        "scored": "second half of each window: logits at n/2..n-2 score tokens n/2+1..n-1",
        "bytes_per_value": {kv: BYTES_PER_VALUE[kv] for kv in kvs},
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{'kv':<6} {'ctx':>6} {'win':>4} {'PPL':>9} {'ΔPPL%':>8} {'mean KLD':>9} {'top-1%':>8}")
    for r in results:
        print(f"{r['kv']:<6} {r['n_ctx']:>6} {r['windows']:>4} {r['ppl']:>9.4f} {r['delta_ppl_pct']:>+8.3f} "
              f"{r['mean_kld']:>9.5f} {100 * r['top1']:>8.2f}")


if __name__ == "__main__":
    main()
