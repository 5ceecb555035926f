#!/usr/bin/env python3
"""The headline, measured: a synthetic Llama-3-8B (Q4_K weights) under an 8 GiB budget.

For each KV regime (contiguous-equivalent f16 from the planner; paged f16, fp8, int8 and
sink+window int4 measured) this runs `bie bench --fill synthetic` in a separate process per cell
(so each cell's peak RSS is its own), at 32k and 64k tokens and at the largest context the planner
says fits, and asks `bie plan` for its prediction of every cell. Writes docs/headline.md.

    python3 bench/headline.py                 # ~11 min on a 2-core AVX2 box (+20 s to synth)
    python3 bench/headline.py --quick         # fewer decode tokens, no int4 max-context run
    python3 bench/headline.py --render        # re-render docs/headline.md from docs/headline.json
    python3 bench/headline.py --boundary-only --model ~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --device-memory-gib 0.25 --out /tmp/h.md --raw /tmp/h.json   # the boundary check alone, ~1 min

The boundary is checked, not restated: at each regime's largest context per `bie plan`, the engine
must serve the cell, and one token more must be refused with exit code 2 and the engine's own
message naming that same largest context. Anything else (a crash, a refusal at the planner's
number, an acceptance one token above it, another message) fails the script (exit 1) after the
files are written.

The model is SYNTHETIC (random weights): the numbers are memory and speed, never quality.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
DEVICE_GIB = 8.0  # --device-memory-gib
UTIL = "0.90"
REGIMES = [  # (row label, --kv-cache-dtype)
    ("paged f16", "f16"),
    ("paged fp8 (e4m3)", "fp8_e4m3"),
    ("paged int8", "int8"),
    ("paged sink+window int4", "int4_asym"),
]
CLAIMED = {  # BRIEF §1: RTX 4060 Ti 8 GB, 8B AWQ, batch 1
    "contiguous f16": ("~10.5k (spills)", "-", "-", "-", "-"),
    "paged f16": ("~23k", "-", "-", "-", "-"),
    "paged fp8 (e4m3)": ("~46k", "-", "-", "41.8", "-"),
    "paged int8": ("-", "-", "-", "-", "-"),
    "paged sink+window int4": ("65,536+ (with spec.)", "6.02 GiB", "7.08 GiB", "61.4", "48.9"),
}


def log(msg):
    print(f"[headline {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout=3600):
    log(" ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def gib(b):
    return f"{b / GIB:.2f} GiB"


def device_memory():
    return f"{int(DEVICE_GIB * 1024)}MiB"


def plan(bie, model, dtype, max_len, bandwidth, extra=()):
    cmd = [bie, "plan", "--model", model, "--device", "cpu", "--vram", f"{DEVICE_GIB:g}",
           "--gpu-memory-utilization", UTIL, "--workspace", "0", "--max-model-len", str(max_len),
           "--kv-cache-dtype", dtype, "--no-compare", "--json"]
    if bandwidth:
        cmd += ["--bandwidth", f"{bandwidth:.3f}"]
    rc, out, err, _ = run(cmd + list(extra))
    if rc != 0:
        raise SystemExit(f"bie plan failed: {err}")
    return json.loads(out)


def bench(bie, model, dtype, ctx, n_gen, reps):
    """One cell in its own process: fill to ctx - n_gen synthetically, decode n_gen tokens."""
    cmd = [bie, "bench", "-m", model, "--fill", "synthetic", "-p", "0", "-n", str(n_gen),
           "-r", str(reps), "-d", str(ctx - n_gen), "--max-model-len", str(ctx),
           "--kv-cache-dtype", dtype, "--device-memory", device_memory(),
           "--gpu-memory-utilization", UTIL, "--json"]
    rc, out, err, sec = run(cmd)
    if rc != 0:
        msg = err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
        log(f"  refused/failed (exit {rc}): {msg}")
        return {"ok": False, "rc": rc, "message": msg, "seconds": sec, "cmd": cmd}
    j = json.loads(out)
    res = j["results"][0]
    log(f"  {res['median_tps']:.3f} tok/s, peak RSS {j['peak_rss_mib']:.0f} MiB, {sec:.0f} s")
    return {"ok": True, "rc": 0, "json": j, "tps": res["median_tps"], "runs": res["runs_tps"],
            "peak_rss": j["peak_rss_mib"] * (1 << 20), "kv_at_depth": res["kv_bytes_at_depth"],
            "fill_seconds": res["fill_seconds"], "seconds": sec, "cmd": cmd,
            "regime": j["regimes"][0]}


def machine():
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    flags = open("/proc/cpuinfo").read()
    isa = "AVX2" if " avx2" in flags else "no AVX2"
    return f"{cpu}, {os.cpu_count()} cores, {mem / GIB:.1f} GiB RAM, {isa}, {platform.system()} " \
           f"{platform.release()}"


def speed_at(p, depth):
    for s in p["options"][0]["speed"]:
        if s["depth"] == depth:
            return s["tok_s"]
    return None


def main():
    global DEVICE_GIB
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bie", default=os.path.join(ROOT, "build", "bie"))
    ap.add_argument("--model", default=os.path.expanduser(
        os.path.join(os.environ.get("BIE_HOME", "~/.cache/bie"), "synth", "llama-3-8b-Q4_K.gguf")))
    ap.add_argument("--n-gen", type=int, default=2, help="decode tokens per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    ap.add_argument("--quick", action="store_true", help="1 decode token x 2 reps; skip int4 max")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "headline.md"))
    ap.add_argument("--raw", default=os.path.join(ROOT, "docs", "headline.json"))
    ap.add_argument("--render", action="store_true",
                    help="only rewrite --out from the measurements in --raw (asks bie plan again)")
    ap.add_argument("--device-memory-gib", type=float, default=8.0,
                    help="device memory of every cell and of bie plan (default 8)")
    ap.add_argument("--boundary-only", action="store_true",
                    help="only the largest-context cells (served) and one token more (refused)")
    a = ap.parse_args()
    DEVICE_GIB = a.device_memory_gib
    if a.render:
        with open(a.raw) as f:
            render(a, json.load(f))
        return
    if a.quick:
        a.n_gen, a.reps = 1, 2
    t_start = time.time()

    synth_seconds = None
    if not os.path.exists(a.model):
        rc, out, err, synth_seconds = run([a.bie, "synth", "--preset", "llama-3-8b", "--weights",
                                           "Q4_K", "--out", a.model])
        sys.stderr.write(err)
        if rc != 0:
            raise SystemExit(f"bie synth failed: {err}")
        log(out.strip())

    # The planner's bandwidth for this machine (its `cpu` device profile: a 0.2 s STREAM-style
    # copy on all cores). On a box shared with other jobs one sample can be far too low, so take
    # the best of several: the bound is meant to be an upper bound.
    samples = [plan(a.bie, a.model, "f16", 65536, None)["device"]["bandwidth_gbs"]
               for _ in range(7)]
    bw = max(samples)
    log(f"memory bandwidth samples (STREAM copy, all cores): "
        f"{', '.join(f'{x:.1f}' for x in samples)} GB/s; using the best, {bw:.2f}")

    cells = {}
    for label, dtype in REGIMES:
        maxc = plan(a.bie, a.model, dtype, 65536, bw)["options"][0]["max_context"]
        cells[label] = {"dtype": dtype, "max_context_plan": maxc}
        for ctx in () if a.boundary_only else (32768, 65536):
            cells[label][str(ctx)] = bench(a.bie, a.model, dtype, ctx, a.n_gen, a.reps)
        if maxc < 65536 or not a.quick or a.boundary_only:
            top = min(maxc, 1 << 17)
            at_max = bench(a.bie, a.model, dtype, top, a.n_gen, a.reps)
            over = bench(a.bie, a.model, dtype, top + 1, a.n_gen, a.reps)
            cells[label]["max"] = {"ctx": top, "at": at_max, "over": over,
                                   "capped": maxc >= 1 << 17}

    raw = {"date": datetime.datetime.utcnow().isoformat() + "Z", "machine": machine(),
           "load_average_end": os.getloadavg(), "bandwidth_gbs": bw,
           "bandwidth_samples": samples, "model": a.model,
           "n_gen": a.n_gen, "reps": a.reps, "synth_seconds": synth_seconds,
           "total_seconds": time.time() - t_start, "cells": cells}
    raw["boundary_failures"] = boundary_failures(cells)
    raw["boundary_only"] = a.boundary_only
    with open(a.raw, "w") as f:
        json.dump(raw, f, indent=1, default=str)
    if not a.boundary_only:
        render(a, raw)
    log(f"done in {(time.time() - t_start) / 60:.1f} min; wrote {a.raw}"
        + ("" if a.boundary_only else f" and {a.out}"))
    for label, dtype in REGIMES:
        mx = cells[label].get("max")
        if mx:
            log(f"boundary {label}: {mx['ctx']} " + ("served" if mx["at"]["ok"] else "NOT served")
                + f", {mx['ctx'] + 1} " + ("refused (exit 2)" if refused(mx["over"], mx["ctx"])
                                           else f"NOT refused as expected: {mx['over']}"))
    if raw["boundary_failures"]:
        for f in raw["boundary_failures"]:
            print(f"headline: FAILED: {f}", file=sys.stderr)
        raise SystemExit(1)


def refused(cell, top):
    """True if the cell is the engine's refusal of one token over `top`: exit code 2 and the
    engine's message naming `top` as the largest context that fits."""
    return (cell is not None and not cell["ok"] and cell["rc"] == 2
            and f"the largest context that fits is {top} tokens" in cell["message"])


def boundary_failures(cells):
    """Where the engine and bie plan disagree about the largest context (empty: they agree to
    the token in every regime probed)."""
    out = []
    for label, c in cells.items():
        mx = c.get("max")
        if not mx:
            continue
        top = mx["ctx"]
        if not mx["at"]["ok"]:
            out.append(f"{label}: bie plan's largest context {top} was not served "
                       f"(exit {mx['at']['rc']}: {mx['at']['message']})")
        if mx.get("capped"):
            continue  # the planner's number is its cap, not a boundary of the budget
        if not refused(mx["over"], top):
            o = mx["over"]
            out.append(f"{label}: {top + 1} tokens (one over bie plan's largest context) were not "
                       "refused with exit 2 naming " + str(top) + ": "
                       + ("ACCEPTED" if o["ok"] else f"exit {o['rc']}: {o['message']}"))
    return out


def fmt_cell_mem(c):
    if c is None:
        return "-"
    if not c["ok"]:
        return "does not fit (refused)" if c["rc"] == 2 else f"FAILED (exit {c['rc']})"
    return gib(c["peak_rss"])


def fmt_cell_tps(c):
    if c is None or not c["ok"]:
        return "-"
    return f"{c['tps']:.3f}"


def render(a, raw):
    """docs/headline.md from the measurements in raw and the planner's predictions (bie plan)."""
    bw = raw["bandwidth_gbs"]
    model = raw["model"]
    P = {}  # (dtype, max_model_len, extra) -> plan json

    def pl(dtype, max_len, extra=()):
        key = (dtype, max_len, tuple(extra))
        if key not in P:
            P[key] = plan(a.bie, model, dtype, max_len, bw, extra)
        return P[key]

    f16 = pl("f16", 65536)
    budget = f16["budget"]
    usable, weights, act = budget["usable_bytes"], budget["weights_bytes"], budget["activation_bytes"]
    kv_budget = budget["kv_budget_bytes"]
    f16_bpt = f16["options"][0]["bytes_per_token"]
    cells = raw["cells"]
    L = []
    w = L.append
    w("# The headline, measured: an 8B model with 64k context inside an 8 GiB budget")
    w("")
    w("**The model is SYNTHETIC**: Llama-3-8B's exact tensor names, shapes and types with random "
      "Q4_K weights (`bie synth --preset llama-3-8b --weights Q4_K`; `general.name` says "
      "\"synthetic\", `bie.synthetic = true`). These are memory and speed numbers, never quality.")
    w("")
    w("Regenerate everything (model, measurements, this file, `docs/headline.json`) with one "
      "command, from a Release build (`cmake --build build --target bie`):")
    w("")
    w("```sh")
    w("python3 bench/headline.py          # writes the 4.2 GiB model to ~/.cache/bie/synth/ if absent")
    w("python3 bench/headline.py --render # only re-render this file from docs/headline.json")
    w("```")
    w("")
    w(f"This run: {raw['date']}, {raw['total_seconds'] / 60:.1f} min in all"
      + (f" (the model written in {raw['synth_seconds']:.0f} s)" if raw.get("synth_seconds")
         else " (model already written; `bie synth` takes ~20 s)") + ".")
    w("")
    w("## Machine, budget, method")
    w("")
    w(f"- Machine: {raw['machine']}; CPU backend, 2 threads. Other agents were compiling on the "
      f"same two cores during the run (load average at the end: "
      f"{', '.join(f'{x:.1f}' for x in raw.get('load_average_end', []))}), so tok/s are "
      "pessimistic; memory numbers are not affected.")
    samples = raw.get("bandwidth_samples", [bw])
    w(f"- Memory bandwidth: **{bw:.2f} GB/s**, the best of {len(samples)} measurements by the "
      "planner's device profile (`bie plan --device cpu`: a 0.2 s STREAM-style copy on all "
      "cores, bytes read + written per second); the samples were "
      f"{', '.join(f'{x:.1f}' for x in samples)} GB/s, the spread being the other jobs on the "
      "box. The planner's decode bound is bandwidth / (weights read per token + KV bytes of the "
      "sequence), so it is an upper bound: a copy counts written bytes too, and decode only "
      "reads.")
    w(f"- Budget, the same for every regime: `--device-memory {device_memory()} "
      f"--gpu-memory-utilization {UTIL}` = {gib(usable)} usable = weights {gib(weights)} (exact, "
      f"from the GGUF) + prefill workspace {gib(act)} (chunk 512) + **KV {gib(kv_budget)}**. "
      "The engine sizes its pools with the same planner functions (`engine/kv_setup.h`); the "
      "planner columns below are `bie plan --model FILE --device cpu --vram 8 "
      "--gpu-memory-utilization 0.90 --workspace 0 --max-model-len N --kv-cache-dtype X`.")
    w(f"- Each measured cell is its own `bie bench` process: `bie bench -m FILE --fill synthetic "
      f"-p 0 -n {raw['n_gen']} -r {raw['reps']} -d CTX-{raw['n_gen']} --max-model-len CTX "
      f"--kv-cache-dtype X --device-memory {device_memory()} --gpu-memory-utilization {UTIL}`: "
      "the cache is filled with synthetic K/V of realistic statistics (Gaussian; keys with "
      "persistent 10-50x outlier channels) through the real append/store/re-quantisation path, "
      f"then {raw['n_gen']} tokens are decoded (a full 8B forward each), {raw['reps']} times; "
      "tok/s is the median. Peak memory is the process's peak RSS (`getrusage` ru_maxrss): the "
      "mapped weights it touched, the KV blocks it committed, and its buffers.")
    w("")
    w("## Results on this machine, with the planner's prediction for each cell")
    w("")
    w("| regime | KV bytes/token (body) | max context: planner / engine | peak RSS at 32k | "
      "peak RSS at 64k | planner total at 32k / 64k | decode tok/s 32k | decode tok/s 64k | "
      "planner bound 32k / 64k |")
    w("|---|---|---|---|---|---|---|---|---|")
    ctg_max = kv_budget // f16_bpt
    w(f"| contiguous-equivalent f16 (planner only) | {f16_bpt} | {ctg_max:,} / - | does not fit | "
      f"does not fit | {gib(weights + act + 32768 * f16_bpt)} / "
      f"{gib(weights + act + 65536 * f16_bpt)} | - | - | - |")
    for label, dtype in REGIMES:
        c = cells[label]
        p64 = pl(dtype, 65536)
        p32 = pl(dtype, 32768)
        o = p64["options"][0]
        mx = c.get("max")
        if mx:
            eng = (f"{mx['ctx']:,} served" if mx["at"]["ok"]
                   else f"{mx['ctx']:,} {fmt_cell_mem(mx['at'])}")
            if mx.get("over") is not None:
                eng += f", {mx['ctx'] + 1:,} " + ("refused" if refused(mx["over"], mx["ctx"])
                                                  else "NOT REFUSED AS EXPECTED")
        else:
            eng = "65,536 served"
        b32, b64 = speed_at(p64, 32768), speed_at(p64, 65536)
        w(f"| {label} | {o['bytes_per_token']} | {o['max_context']:,} / {eng} | "
          f"{fmt_cell_mem(c['32768'])} | {fmt_cell_mem(c['65536'])} | "
          f"{plan_total(p32['options'][0])} / {plan_total(o)} | {fmt_cell_tps(c['32768'])} | "
          f"{fmt_cell_tps(c['65536'])} | {b32:.3f} / {b64:.3f} |")
    for name, extra in (("n-gram drafter, γ = 5", ["--speculative-draft-tokens", "5"]),
                        ("draft model Llama-3.2-1B Q4_K_M, γ = 5",
                         ["--speculative-draft-tokens", "5", "--draft-preset", "llama-3.2-1b",
                          "--draft-weights", "Q4_K_M"])):
        sp_plan = pl("int4_asym", 65536, extra)
        sp = sp_plan["options"][0]
        sb = sp_plan["budget"]["speculative_bytes"]
        w(f"| sink+window int4 + speculative state: {name} (planner only; state {gib(sb)}) | "
          f"{sp['bytes_per_token']} | {sp['max_context']:,} / - | - | - | "
          f"- / {plan_total(sp)} | - | - | - |")
    w("")
    w("\"does not fit\" in a measured column is the engine refusing at start-up (exit code 2, "
      "message below), never an out-of-memory kill; in a planner column it carries the total the "
      "cell would need. The contiguous-equivalent row is what a cache that allocates "
      "max-model-len x 128 KiB up front would need: at `--max-model-len 65536` that is 8 GiB of "
      "KV alone, so it cannot start at any context in use.")
    w("")
    w("### At the largest context each regime fits")
    w("")
    w("The engine run at `--max-model-len` = the planner's largest context (filled, then "
      "decoded), and one token more (refused: exit code 2 and the engine's message naming the "
      "same largest context; `bench/headline.py` fails otherwise):")
    w("")
    w("| regime | context | synthetic fill | peak RSS | KV held | decode tok/s | planner bound | "
      "ratio to bound |")
    w("|---|---|---|---|---|---|---|---|")
    for label, dtype in REGIMES:
        mx = cells[label].get("max")
        if not mx:
            continue
        at = mx["at"]
        bound = speed_at(pl(dtype, mx["ctx"]), mx["ctx"])
        if at["ok"]:
            w(f"| {label} | {mx['ctx']:,} | {at['fill_seconds']:.0f} s | {gib(at['peak_rss'])} | "
              f"{gib(at['kv_at_depth'])} | {at['tps']:.3f} | {bound:.3f} | "
              f"{at['tps'] / bound:.2f} |")
        else:
            w(f"| {label} | {mx['ctx']:,} | - | {fmt_cell_mem(at)} | - | - | {bound:.3f} | - |")
    w("")
    w("### The headline checks")
    w("")
    i4 = cells["paged sink+window int4"]["65536"]
    f16max = cells["paged f16"].get("max")
    if i4["ok"]:
        w(f"- **int4 sink+window serves a 65,536-token sequence** of the synthetic 8B: peak RSS "
          f"{gib(i4['peak_rss'])} ≤ {gib(usable)} usable ≤ 8 GiB; KV held "
          f"{gib(i4['kv_at_depth'])}; planner total {plan_total(pl('int4_asym', 65536)['options'][0])}.")
    else:
        w(f"- int4 sink+window at 65,536: NOT served ({i4['message']})")
    f16_64 = cells["paged f16"]["65536"]
    if not f16_64["ok"]:
        w(f"- **f16 is refused** at 65,536: `{f16_64['message']}`")
    agree = []
    for label, dtype in REGIMES:
        mx = cells[label].get("max")
        if mx and mx["at"]["ok"] and refused(mx.get("over"), mx["ctx"]):
            agree.append(f"{label} {mx['ctx']:,}")
    fails = boundary_failures(cells)
    w("- Measured maximum contexts (served at the planner's number, refused one token above with "
      "exit code 2): " + "; ".join(agree) + "."
      + (" The engine and `bie plan` agree to the token (checked by the script)." if not fails
         else " DISAGREEMENT: " + "; ".join(fails)))
    if i4["ok"] and f16max and f16max["at"]["ok"]:
        f = f16max["at"]
        w(f"- Decode: int4 KV at 65,536 tokens {i4['tps']:.3f} tok/s vs f16 KV at its largest "
          f"context ({f16max['ctx']:,}) {f['tps']:.3f} tok/s: ratio {i4['tps'] / f['tps']:.2f} "
          f"with {65536 / f16max['ctx']:.2f}x the context.")
    for label, dtype in REGIMES:
        parts = []
        for ctx in (32768, 65536):
            cc = cells[label][str(ctx)]
            if cc["ok"]:
                b = speed_at(pl(dtype, 65536), ctx)
                parts.append(f"{ctx:,}: {cc['tps']:.3f} / {b:.3f} = **{cc['tps'] / b:.2f}**")
        if parts:
            w(f"- Ratio to the bandwidth bound, {label}: " + "; ".join(parts) + ".")
    w("")
    w("Why below the bound: the bound assumes every byte moves at the best measured copy rate "
      "with no compute cost. On 2 shared cores an 8B decode step is largely compute-bound: the "
      "Q4_K matvecs dequantise 4.2 GiB of weights per token, and at depth attention reads and "
      "dequantises the whole KV every step. At the largest contexts every regime holds the same "
      "2.85 GiB of KV (so the same bound); the spread of those rows is compute per KV byte plus "
      "machine noise. Medians of 3 x 2 tokens on a box shared with compilers vary by tens of "
      "percent between runs (an earlier run of this script measured f16 at 23,344 tokens at "
      "0.44 and int8 at 45,839 at 0.80 tok/s); read the ratios as rough. Only the int4 cell at "
      "its 82k maximum was the slowest in every run.")
    w("")
    w("### Refusals, verbatim")
    w("")
    seen = set()
    for label, _ in REGIMES:
        c = cells[label]
        items = [(k, c[k]) for k in ("32768", "65536")]
        mx = c.get("max")
        if mx and mx.get("over") is not None:
            items.append((str(mx["ctx"] + 1), mx["over"]))
        for k, cc in items:
            if not cc["ok"] and cc["message"] not in seen:
                seen.add(cc["message"])
                w(f"- {label}, `--max-model-len {k}`: `{cc['message']}`")
    w("")
    w("## The source document's claimed table (BRIEF §1), for comparison")
    w("")
    w("| regime | max context | peak 32k | peak 64k | tok/s 32k | tok/s 64k |")
    w("|---|---|---|---|---|---|")
    for k, v in CLAIMED.items():
        w(f"| {k} | " + " | ".join(v) + " |")
    w("")
    w("Claimed on an RTX 4060 Ti 8 GB (288 GB/s GDDR6, CUDA, AWQ 4-bit weights, batch 1); ours is "
      "a CPU. **Comparable**: maximum contexts and memory — same geometry, same bytes per token "
      "(128 KiB f16, 36 KiB int4 g64), same budget equation; our weights are Q4_K at 4.50 bpw "
      "(4.21 GiB, vs the source's 4.25 GiB AWQ), and the CPU backend counts no CUDA workspace "
      "(the source's 0.55 GiB), so our KV budget (2.85 GiB) sits at the top of the source's "
      "2.85-3.05 GiB. Our f16 (23.3k) and fp8 (45.8k) limits match the claimed ~23k and ~46k. "
      "The source does not derive its 10.5k for contiguous f16; our contiguous-equivalent row is "
      "a single max-length allocation filling the same KV budget, so it ends where paged f16 "
      "does (up to block rounding): contiguous allocation costs when max-model-len exceeds the "
      "context in use, which the 32k/64k columns show. **Not comparable**: tok/s (a 2-core CPU "
      f"at ~{bw:.0f} GB/s against a 288 GB/s GPU; "
      "compare each cell with its own bound instead), ΔPPL (random weights have no quality; "
      "see docs/kv-quality.md for real-model quality), and the speculative speed-up (BIE's "
      "speculative decoding lives in the serving engine and is not measured here; only its "
      "memory is planned above).")
    w("")
    with open(a.out, "w") as f:
        f.write("\n".join(L))


def plan_total(opt):
    """The planner's predicted total (weights + workspace + KV pools) for one cell."""
    if opt["fits"]:
        return gib(opt["total_bytes"])
    return f"does not fit ({gib(opt['total_bytes'])})"


if __name__ == "__main__":
    main()
