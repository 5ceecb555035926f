#!/usr/bin/env python3
"""How much does llama.cpp disagree with itself? Re-runs the golden prompts of
tests/golden/<name>/logits.json (made with flash attention off) with flash attention ON and
reports the largest top-10 logit difference and how many greedy continuations stay identical;
then, teacher-forced (prompt + llama.cpp's own gen_ids), the largest top-10 logit difference at
every generated step and how far the top-2 margin moves (step_top_logits in the golden).
This is the noise floor the golden tests' tolerances are set against (docs/performance.md).

  scripts/setup_reference.sh && .venv-ref/bin/python scripts/llamacpp_self_agreement.py \
      --model ~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf --golden tests/golden/smollm2
"""
import argparse
import json
import os

import llama_cpp
import numpy as np


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def teacher_forced(llm, p):
    """Feeds prompt_ids + gen_ids (llama.cpp's own flash-off choices) with flash attention on and
    compares each step's logits with the golden step_top_logits. Returns (worst top-k |diff|,
    worst centred top-k |diff| (each step's mean difference over the top-k removed: softmax does
    not see a common shift), worst |change of the golden top-2 margin|, argmax flips, largest
    golden margin at a flip)."""
    llm.reset()
    llm.eval(p["prompt_ids"])
    worst, worst_c, worst_margin, flips, flip_margin = 0.0, 0.0, 0.0, 0, 0.0
    for i, top in enumerate(p["step_top_logits"]):
        if i > 0:
            llm.eval([p["gen_ids"][i - 1]])
        logits = last_logits(llm)
        d = [float(logits[t]) - v for t, v in top]
        worst = max(worst, max(abs(x) for x in d))
        mean = sum(d) / len(d)
        worst_c = max(worst_c, max(abs(x - mean) for x in d))
        (a, va), (b, vb) = top[0], top[1]
        worst_margin = max(worst_margin, abs((float(logits[a]) - float(logits[b])) - (va - vb)))
        if int(np.argmax(logits)) != a:
            flips += 1
            flip_margin = max(flip_margin, va - vb)
    return worst, worst_c, worst_margin, flips, flip_margin


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--golden", required=True, help="folder with logits.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--teacher-forced-only", action="store_true",
                    help="skip the free-running greedy comparison")
    args = ap.parse_args()
    golden = json.load(open(os.path.join(args.golden, "logits.json")))
    llm = llama_cpp.Llama(model_path=os.path.expanduser(args.model), n_ctx=golden["settings"]["n_ctx"],
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False, flash_attn=True)
    worst, identical = 0.0, 0
    tf_worst, tf_worst_c, tf_margin, tf_flips, tf_flip_margin = 0.0, 0.0, 0.0, 0, 0.0
    for p in golden["prompts"]:
        llm.reset()
        llm.eval(p["prompt_ids"])
        logits = last_logits(llm)
        diff = max(abs(float(logits[t]) - v) for t, v in p["top_logits"])
        worst = max(worst, diff)
        want, got = p["gen_ids"], []
        for _ in range(0 if args.teacher_forced_only else len(want)):
            tok = int(np.argmax(logits))
            got.append(tok)
            llm.eval([tok])
            logits = last_logits(llm)
        div = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        identical += div is None
        greedy = ("not run" if args.teacher_forced_only else "identical" if div is None
                  else f"diverges at step {div} (margin {p['gen_steps'][div][4]})")
        line = f"{p['name']:<22} top-10 max |diff| {diff:.4f}  greedy {greedy}"
        if "step_top_logits" in p:
            w, wc, m, f, fm = teacher_forced(llm, p)
            tf_worst, tf_worst_c, tf_margin = max(tf_worst, w), max(tf_worst_c, wc), max(tf_margin, m)
            tf_flips, tf_flip_margin = tf_flips + f, max(tf_flip_margin, fm)
            line += (f"  teacher-forced: top-10 {w:.4f} (centred {wc:.4f}), top-2 margin moves {m:.4f}, "
                     f"argmax flips {f} (largest margin {fm:.4f})")
        print(line)
    print(f"flash attention on vs off: worst top-10 logit difference {worst:.4f}; "
          f"identical greedy continuations {identical}/{len(golden['prompts'])}")
    if tf_worst > 0:
        print(f"teacher-forced over every generated step: worst top-10 logit difference {tf_worst:.4f} "
              f"(centred {tf_worst_c:.4f}); "
              f"the top-2 margin moves by up to {tf_margin:.4f} (noise floor); argmax flips {tf_flips}, "
              f"largest margin at a flip {tf_flip_margin:.4f}")


if __name__ == "__main__":
    main()
