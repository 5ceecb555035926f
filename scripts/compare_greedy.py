#!/usr/bin/env python3
"""Greedy continuations of every golden prompt from two bie binaries, compared byte for byte in
one run (greedy text is a function of the token ids): the check that a refactor changed nothing.

    scripts/compare_greedy.py OLD_BUILD/bie build/bie [--tokens 48]

Prompts: tests/golden/{smollm2,gemma3}/logits.json on SmolLM2 and Gemma 3, and three prompts on
each Qwen2.5-Coder model that is fetched. Exit 1 if any output differs."""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(os.environ.get("BIE_HOME", os.path.expanduser("~/.cache/bie")), "models")
QWEN_PROMPTS = ["def fibonacci(n):", "The capital of France is",
                "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args()
    work = []
    for file, golden in [("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
                         ("gemma-3-270m-q4_k_m.gguf", "gemma3")]:
        d = json.load(open(os.path.join(ROOT, "tests", "golden", golden, "logits.json")))
        work += [(os.path.join(MODELS, file), p["text"]) for p in d["prompts"]]
    for file in ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]:
        if os.path.exists(os.path.join(MODELS, file)):
            work += [(os.path.join(MODELS, file), p) for p in QWEN_PROMPTS]
    same = diff = 0
    for model, prompt in work:
        outs = []
        for binary in (a.old, a.new):
            r = subprocess.run([binary, "run", "-m", model, "-p", prompt, "-n", str(a.tokens),
                                "--temp", "0", "-t", "2", "--no-display-prompt", "--ignore-eos"],
                               capture_output=True, timeout=900)
            if r.returncode != 0:
                sys.exit(f"{binary} failed on {model}: {r.stderr.decode()[-500:]}")
            outs.append(r.stdout)
        if outs[0] == outs[1]:
            same += 1
        else:
            diff += 1
            print(f"DIFF {os.path.basename(model)} {prompt[:40]!r}\n  old {outs[0][:100]!r}\n"
                  f"  new {outs[1][:100]!r}")
    print(f"{same} identical, {diff} different ({a.tokens} greedy tokens each)")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
