#!/usr/bin/env python3
"""Does the spiky-attention fallback (--kv-fallback-entropy) catch retrieval prompts, and what
does it cost? For each prompt — needle haystacks (a passphrase planted at a depth, then asked
for) and plain continuations and questions over the same text — one engine with the fallback on
serves it three ways, prefix caching off so each is a full prefill:
  int4   the default regime, named by the request (never measured, never moved)
  auto   no regime named: measured at the prompt's last token, moved when spiky
  f16    f16 KV (the reference)
and prints the proxy, where `auto` ran, the passphrase's log-probability (needles) and TTFTs.

  PYTHONPATH=build/python python3 scripts/measure_kv_fallback.py -m qwen2.5-coder-1.5b \\
      --ctx 2048 --threshold 0.65 [--json out.json]
"""
import argparse
import json
import random
import sys

from benni_inference import BieEngine, EngineConfig, SamplingParams


def prompts(text, ctx, n_prose, n_question, depths, seed):
    nchar = int(ctx * 3.2)  # tinyshakespeare: ~3.3 characters per token on these tokenizers
    rng = random.Random(seed)
    out = []
    for i, depth in enumerate(depths):
        start = 20000 + i * 50000
        hay = text[start:start + nchar]
        at = hay.find("\n", int(len(hay) * depth / 100)) + 1
        secret = str(rng.randint(10000, 99999))
        p = (hay[:at] + "The secret passphrase is " + secret + ".\n" + hay[at:] +
             "\nQuestion: What is the secret passphrase?\nAnswer: The secret passphrase is")
        out.append((f"needle@{depth}%", p, secret))
    for i in range(n_prose):
        start = 300000 + i * 40000
        out.append((f"prose{i}", text[start:start + nchar], None))
    for i in range(n_question):
        start = 500000 + i * 40000
        out.append((f"question{i}", text[start:start + nchar] +
                    "\nQuestion: Who speaks in the last line above?\nAnswer:", None))
    return out


def answer_logprob(eng, out, secret):
    """Sum of the log-probabilities of the generated tokens up to the passphrase's end (None when
    the greedy answer is not the passphrase)."""
    lp = 0.0
    for i, l in enumerate(out.logprobs or []):
        lp += l
        if secret in eng.detokenize(out.token_ids[:i + 1]):
            return lp
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threshold", type=float, default=0.65)
    ap.add_argument("--depths", default="10,50,90")
    ap.add_argument("--prose", type=int, default=3)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    text = open(a.file, encoding="utf-8").read()
    eng = BieEngine(EngineConfig(
        model=a.model, kv_cache_dtype="int4_asym", kv_regimes=["f16"],
        kv_fallback_entropy=a.threshold, max_model_len=a.ctx + 256, kv_cache_memory="1GiB",
        threads=a.threads, max_num_seqs=1, enable_prefix_caching=False))
    rows = []
    print(f"{a.model}, ~{a.ctx}-token prompts, threshold {a.threshold}", flush=True)
    print(f"{'prompt':<12} {'tokens':>6} {'proxy':>6} {'auto ran in':<28} "
          f"{'logp int4':>9} {'auto':>7} {'f16':>7} {'ttft int4':>9} {'auto':>6}", flush=True)
    for name, p, secret in prompts(text, a.ctx, a.prose, a.questions,
                                   [int(d) for d in a.depths.split(",")], 1):
        res = {}
        for how, dtype in (("int4", "int4_asym"), ("auto", None), ("f16", "f16")):
            o = eng.generate(p, SamplingParams(temperature=0, max_tokens=8, logprobs=0,
                                               kv_cache_dtype=dtype))
            o = o[0] if isinstance(o, list) else o
            res[how] = o
        m = res["auto"].metrics
        row = {"prompt": name, "tokens": m.prompt_tokens, "proxy": m.attn_entropy,
               "fallback": m.kv_fallback, "auto_regime": m.kv_regime,
               "ttft_int4": res["int4"].metrics.ttft, "ttft_auto": m.ttft}
        for how, o in res.items():
            row[f"text_{how}"] = o.text
            if secret is not None:
                row[f"correct_{how}"] = secret in o.text
                row[f"logp_{how}"] = answer_logprob(eng, o, secret)
        rows.append(row)
        f = lambda v: "-" if v is None else f"{v:.3f}"
        print(f"{name:<12} {row['tokens']:>6} {row['proxy']:>6.3f} {row['auto_regime']:<28} "
              f"{f(row.get('logp_int4')):>9} {f(row.get('logp_auto')):>7} "
              f"{f(row.get('logp_f16')):>7} {row['ttft_int4']:>9.2f} {row['ttft_auto']:>6.2f}",
              flush=True)
    em = eng.metrics()
    print(f"measured {em['kv_entropy_probes']}, fell back {em['kv_fallbacks']}", flush=True)
    if a.json:
        json.dump({"model": a.model, "ctx": a.ctx, "threshold": a.threshold, "rows": rows},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
