#!/usr/bin/env python3
"""How much does llama.cpp disagree with itself? Re-runs the golden prompts of
tests/golden/<name>/logits.json (made with flash attention off) with flash attention ON and
reports the largest top-10 logit difference and how many greedy continuations stay identical.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--golden", required=True, help="folder with logits.json")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    golden = json.load(open(os.path.join(args.golden, "logits.json")))
    llm = llama_cpp.Llama(model_path=os.path.expanduser(args.model), n_ctx=golden["settings"]["n_ctx"],
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False, flash_attn=True)
    worst, identical = 0.0, 0
    for p in golden["prompts"]:
        llm.reset()
        llm.eval(p["prompt_ids"])
        logits = last_logits(llm)
        diff = max(abs(float(logits[t]) - v) for t, v in p["top_logits"])
        worst = max(worst, diff)
        want, got = p["gen_ids"], []
        for _ in range(len(want)):
            tok = int(np.argmax(logits))
            got.append(tok)
            llm.eval([tok])
            logits = last_logits(llm)
        div = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        identical += div is None
        print(f"{p['name']:<22} top-10 max |diff| {diff:.4f}  greedy "
              + ("identical" if div is None else f"diverges at step {div} (margin {p['gen_steps'][div][4]})"))
    print(f"flash attention on vs off: worst top-10 logit difference {worst:.4f}; "
          f"identical greedy continuations {identical}/{len(golden['prompts'])}")


if __name__ == "__main__":
    main()
