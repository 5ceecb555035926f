#!/usr/bin/env bash
# Side-by-side speed of BIE and llama.cpp on the same GGUF file, threads and shapes, interleaved
# ROUNDS times (the machine is shared: compare within one run, report medians and ratios).
#   scripts/compare_llamacpp.sh [MODEL] [THREADS] [ROUNDS]
# llama.cpp is the NATIVE reference build (GGML_NATIVE=ON: this machine's best ISA, e.g. AVX-512;
# scripts/setup_reference.sh native -> build/.venv-ref-native); $BIE_REF_PY overrides it (the
# AVX2 goldens reference, .venv-ref, is not a speed peer on an AVX-512 machine).
# BIE_BASE=/path/to/other/bie adds a third column: another BIE build (e.g. main before a change),
# run in the same rounds. Needs build/bie.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-$HOME/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-2}"
ROUNDS="${3:-3}"
PY="${BIE_REF_PY:-build/.venv-ref-native/bin/python}"
BASE="${BIE_BASE:-}"
if [ ! -x "$PY" ]; then
  echo "compare_llamacpp: no reference python at $PY (scripts/setup_reference.sh native)" >&2
  exit 1
fi
echo "llama.cpp reference: $PY"
out=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
  build/bie bench -m "$MODEL" -t "$THREADS" -p 128,512 -n 128 -r 3 --json > "$out/bie_$r.json"
  "$PY" scripts/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" --runs 3 --json > "$out/llama_$r.json"
  if [ -n "$BASE" ]; then
    "$BASE" bench -m "$MODEL" -t "$THREADS" -p 128,512 -n 128 -r 3 --json > "$out/base_$r.json"
  fi
done
python3 - "$out" "$ROUNDS" <<'PYEOF'
import json, statistics, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
bie, ref, base = {}, {}, {}
rss_b, rss_l = [], []
for r in range(1, rounds + 1):
    b = json.load(open(os.path.join(out, f"bie_{r}.json")))
    rss_b.append(b["peak_rss_mib"])
    for x in b["results"]:
        bie.setdefault(x["test"], []).append(x["median_tps"])
    l = json.load(open(os.path.join(out, f"llama_{r}.json")))
    rss_l.append(l.get("peak_rss_mib", 0))
    for x in l["results"]:
        ref.setdefault(x["test"], []).append(x["tok_s"])
    bp = os.path.join(out, f"base_{r}.json")
    if os.path.exists(bp):
        for x in json.load(open(bp))["results"]:
            base.setdefault(x["test"], []).append(x["median_tps"])
hdr = f"{'test':<8} {'BIE t/s':>10} {'llama.cpp t/s':>14} {'ratio':>7}"
if base:
    hdr += f" {'base t/s':>10} {'vs base':>8}"
print(hdr)
for t in bie:
    if t not in ref:
        continue
    b, l = statistics.median(bie[t]), statistics.median(ref[t])
    line = f"{t:<8} {b:>10.1f} {l:>14.1f} {b / l:>7.2f}"
    if t in base:
        o = statistics.median(base[t])
        line += f" {o:>10.1f} {b / o:>8.2f}"
    print(line)
    print(f"         BIE runs {[round(v, 1) for v in bie[t]]}  llama.cpp runs {[round(v, 1) for v in ref[t]]}")
print(f"peak RSS MiB: BIE {max(rss_b):.1f}, llama.cpp {max(rss_l):.1f}")
PYEOF
