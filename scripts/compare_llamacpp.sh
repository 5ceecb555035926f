#!/usr/bin/env bash
# Side-by-side speed of BIE and llama.cpp on the same GGUF file, threads and shapes, interleaved
# ROUNDS times (the machine is shared: compare within one run, report medians and ratios).
#   scripts/compare_llamacpp.sh [MODEL] [THREADS] [ROUNDS]
# Needs build/bie and a llama-cpp-python venv (scripts/setup_reference.sh; $BIE_REF_PY overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-$HOME/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-2}"
ROUNDS="${3:-3}"
PY="${BIE_REF_PY:-.venv-ref/bin/python}"
out=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
  build/bie bench -m "$MODEL" -t "$THREADS" -p 128,512 -n 128 -r 3 --json > "$out/bie_$r.json"
  "$PY" scripts/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" --runs 3 --json > "$out/llama_$r.json"
done
python3 - "$out" "$ROUNDS" <<'PYEOF'
import json, statistics, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
bie, ref = {}, {}
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
print(f"{'test':<8} {'BIE t/s':>10} {'llama.cpp t/s':>14} {'ratio':>7}")
for t in bie:
    if t not in ref:
        continue
    b, l = statistics.median(bie[t]), statistics.median(ref[t])
    print(f"{t:<8} {b:>10.1f} {l:>14.1f} {b / l:>7.2f}")
print(f"peak RSS MiB: BIE {max(rss_b):.1f}, llama.cpp {max(rss_l):.1f}")
PYEOF
