#!/usr/bin/env python3
"""Generate BIE's golden reference outputs from llama.cpp (through llama-cpp-python).

    .venv-ref/bin/python scripts/make_goldens.py \
        --model ~/.cache/bie/models/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden/smollm2/

Writes into --out:
  tokenizer.json  token ids for a fixed corpus (special on/off, add_bos on/off) + detokenized bytes
  logits.json     per prompt: prompt ids, top-k next-token logits, greedy continuation with
                  per-step top-1/top-2 margins and per-step top-k logits (teacher forcing)

See tests/golden/README.md for the schemas. Needs the reference venv (scripts/setup_reference.sh).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import hashlib
import json
import os
import platform
import sys

import numpy as np

try:
    import llama_cpp
    from llama_cpp import Llama
except ImportError:  # pragma: no cover
    sys.exit("make_goldens: llama_cpp not importable; run scripts/setup_reference.sh and use its python")

# llama-cpp-python does not expose the vendored llama.cpp commit at run time; this table is taken
# from llama-cpp-python's CHANGELOG ("update llama.cpp to ggml-org/llama.cpp@...").
LLAMA_CPP_COMMIT_BY_VERSION = {
    "0.3.36": "0c1e57098",
}

TOKENIZER_SCHEMA = "bie-golden-tokenizer/1"
LOGITS_SCHEMA = "bie-golden-logits/1"

# --------------------------------------------------------------------------------------------
# Tokenizer corpus: (name, text). Names are stable identifiers for tests; keep them unique.
# --------------------------------------------------------------------------------------------
CORPUS: list[tuple[str, str]] = [
    # empty / trivial
    ("empty", ""),
    ("single_space", " "),
    ("single_char", "a"),
    ("single_newline", "\n"),
    # plain English
    ("english_sentence", "The quick brown fox jumps over the lazy dog."),
    ("english_hello", "Hello world"),
    ("english_leading_space", " Hello world"),
    ("english_mixed_case", "HELLO World hello WoRLD"),
    ("english_paragraph",
     "Large language models predict the next token. The KV cache stores keys and values for "
     "every past token, so memory grows linearly with context length."),
    ("english_question", "What is the capital of France?"),
    # contractions
    ("contractions_lower", "it's don't they're we've I'm you'll he'd"),
    ("contractions_upper", "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D"),
    ("contractions_mixed", "It'S Don'T They'Re We'Ve I'M You'Ll He'D"),
    ("contractions_attached", "'s 't 're 've 'm 'll 'd"),
    ("apostrophe_curly", "don\u2019t it\u2019s"),
    # digits and numbers
    ("digits_short", "0 1 12 123"),
    ("digits_long", "1234567890"),
    ("digits_very_long", "31415926535897932384626433832795028841971"),
    ("number_decimal", "3.14159"),
    ("number_negative_exp", "-2.5e-10 +6.022e23"),
    ("number_thousands", "1,000,000 and 1.000.000"),
    ("date_iso", "2024-01-15T13:45:30Z"),
    ("date_text", "On 12/25/2023 at 10:30am, version v1.2.3 shipped."),
    ("phone", "+1 (555) 123-4567"),
    # whitespace
    ("spaces_two", "a  b"),
    ("spaces_run", "a     b      c"),
    ("spaces_only", "        "),
    ("tabs", "a\tb\t\tc"),
    ("newlines_three", "\n\n\n"),
    ("newline_mix", "line1\nline2\r\nline3\n\nline5"),
    ("leading_trailing_spaces", "   padded text   "),
    ("trailing_newline", "end of line\n"),
    ("space_newline_mix", " \n \n\t \n  x"),
    # code
    ("code_python",
     "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("code_python_class",
     "class Foo(Base):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self, x: int = 0) -> None:\n"
     "        self._x = x  # comment\n"),
    ("code_cpp",
     "#include <vector>\n\nint main() {\n    std::vector<int> v{1, 2, 3};\n"
     "    for (auto& x : v) {\n        x *= 2;\n    }\n    return 0;\n}\n"),
    ("code_cpp_template", "template <typename T>\nstruct Span { T* p; size_t n; };"),
    ("code_json", "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}"),
    ("code_shell", "ls -la | grep '^d' && echo \"$HOME\" > /tmp/out.txt 2>&1"),
    # punctuation
    ("punct_run", "!!!??? ... --- === *** ###"),
    ("punct_mixed", "Wait... what?! (Really?) [yes] {no} <maybe>"),
    ("punct_quotes", "\"double\" 'single' `backtick` \u00abguillemets\u00bb \u201ccurly\u201d"),
    ("ellipsis_unicode", "wait\u2026 \u2014 dash \u2013 en"),
    # URL / email
    ("url", "https://example.com/path/to/page?query=1&x=y#frag"),
    ("email", "Contact: jane.doe+test@example.co.uk"),
    # emoji
    ("emoji_simple", "I love pizza \U0001F355 and cats \U0001F431!"),
    ("emoji_zwj_family", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466"),
    ("emoji_skin_tone", "\U0001F44D\U0001F3FD thumbs"),
    ("emoji_flags", "\U0001F1FA\U0001F1F8 \U0001F1EF\U0001F1F5 \U0001F1E9\U0001F1EA"),
    ("emoji_run", "\U0001F600\U0001F603\U0001F604\U0001F601\U0001F606"),
    ("emoji_keycap", "1\uFE0F\u20E3 #\uFE0F\u20E3"),
    # CJK
    ("chinese", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u5427\u3002"),
    ("japanese", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u6f22\u5b57\u3002"),
    ("korean", "\uc548\ub155\ud558\uc138\uc694, \ubc18\uac11\uc2b5\ub2c8\ub2e4."),
    ("cjk_mixed_ascii", "GPU\u5185\u5b58 is 80GB\u3002"),
    # European accents
    ("french", "C'est l\u00e0 o\u00f9 na\u00efve fa\u00e7ade caf\u00e9 cr\u00e8me br\u00fbl\u00e9e."),
    ("german", "Stra\u00dfe \u00fcber \u00c4rger \u00d6l \u00df GR\u00dcN"),
    ("spanish", "\u00bfD\u00f3nde est\u00e1 el ni\u00f1o? \u00a1Ma\u00f1ana!"),
    ("polish", "Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144"),
    # other scripts
    ("arabic", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"),
    ("hebrew", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"),
    ("cyrillic", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0401\u043b\u043a\u0430."),
    ("devanagari", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e"),
    ("greek", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5"),
    ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a"),
    # combining marks / unusual-but-valid UTF-8
    ("combining_acute", "e\u0301 a\u0300 n\u0303"),
    ("combining_stack", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319"),
    ("zero_width", "zero\u200bwidth\u200cjoin\u200dx\ufeffbom"),
    ("nbsp", "a\u00a0b\u2009c\u3000d"),
    ("math_symbols", "\u2200x \u2208 \u211d: x\u00b2 \u2265 0 \u2192 \u221e \u2211 \u222b"),
    ("supplementary_plane", "\U0001D400\U0001D401 \U00020000 \U0001F9EC"),
    ("replacement_char", "bad\ufffdchar"),
    # special-token strings (meaningful with special=True, plain text with special=False)
    ("chatml_user", "<|im_start|>user\nhi<|im_end|>"),
    ("chatml_full",
     "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("endoftext", "<|endoftext|>"),
    ("endoftext_in_text", "before<|endoftext|>after"),
    ("gemma_turns", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"),
    ("bos_eos_literals", "<s> </s> <bos> <eos> <pad> <unk>"),
    ("fake_special", "<|im_start_not|> <|unknown|> < |im_end| >"),
    # mixed
    ("mixed_everything",
     "Price: $1,299.99 (\u20ac1.199,99) \u2014 50% off! \U0001F389 \u65e5\u672c\u8a9e OK?\n\tDone."),
    ("repeated_word", "the the the the the the the the"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
]

# --------------------------------------------------------------------------------------------
# Prompts for logits / greedy generation.
# --------------------------------------------------------------------------------------------
LONG_PARAGRAPH = (
    "The history of computing is a story of abstraction layered on abstraction. Early machines "
    "were programmed by rewiring panels and flipping switches, and every program was tied to the "
    "exact hardware it ran on. Assembly languages gave names to instructions, compilers let people "
    "write formulas instead of opcodes, and operating systems hid the details of disks, memory and "
    "devices behind files and processes. Each step made machines easier to use, but it also moved "
    "the programmer further from what the hardware was actually doing. Today a single line of "
    "Python can start thousands of threads on a graphics card, and few people who write it could "
    "say how the memory of that card is organised. Understanding those lower layers is still "
    "valuable, because performance problems"
)

PROMPTS: list[tuple[str, str]] = [
    ("english_continuation", "Once upon a time, in a small village by the sea, there lived"),
    ("chatml_chat",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("chatml_explain",
     "<|im_start|>system\nYou are a concise teacher.<|im_end|>\n"
     "<|im_start|>user\nExplain what a hash table is.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("code_python", "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n"),
    ("code_cpp", "#include <iostream>\n\nint main() {\n    std::cout <<"),
    ("list", "Shopping list:\n1. Apples\n2. Bread\n3."),
    ("question", "Q: Why is the sky blue?\nA:"),
    ("long_paragraph", LONG_PARAGRAPH),
    ("one_word", "Hello"),
    ("numbers", "The first ten prime numbers are 2, 3, 5, 7,"),
]

GEMMA_CHAT_PROMPTS: list[tuple[str, str]] = [
    ("gemma_chat",
     "<start_of_turn>user\nWhat is the capital of France? Answer in one sentence.<end_of_turn>\n"
     "<start_of_turn>model\n"),
]

# Gemma 3 only: a prompt longer than twice its sliding window (512), so local layers' SWA mask is
# compared with llama.cpp's. The opening of ../shared/data/tinyshakespeare.txt (public domain),
# cut at a blank line; --long-text names another file.
LONG_TEXT_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                 "data", "tinyshakespeare.txt")
LONG_TEXT_CHARS = 4000


def long_prompts(path: str) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        text = f.read(LONG_TEXT_CHARS)
    cut = text.rfind("\n\n")
    return [("long_shakespeare_swa", text[:cut + 1] if cut > 0 else text)]


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def piece(vocab, tok: int, special: bool) -> bytes:
    """llama_token_to_piece with a buffer large enough for any token (lstrip=0)."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(tok), buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 1


def detokenize(llm: Llama, vocab, ids: list[int], special: bool) -> bytes:
    """Same as Llama.detokenize (concatenated token pieces, leading space dropped after BOS),
    but without its fixed 32-byte piece buffer."""
    out = b"".join(piece(vocab, t, special) for t in ids)
    if ids and ids[0] == llm.token_bos() and out[:1] == b" ":
        out = out[1:]
    return out


def generator_info(args) -> dict:
    ver = getattr(llama_cpp, "__version__", "unknown")
    try:
        sysinfo = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # pragma: no cover
        sysinfo = None
    return {
        "tool": "scripts/make_goldens.py",
        "llama_cpp_python_version": ver,
        "llama_cpp_commit": LLAMA_CPP_COMMIT_BY_VERSION.get(ver, "unknown"),
        "llama_system_info": sysinfo,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def model_info(llm: Llama, vocab, path: str, sha: str) -> dict:
    md = llm.metadata or {}
    m = llm._model

    def tok_or_none(t: int):
        return None if t is None or t < 0 else int(t)

    def tok_text(t):
        if t is None:
            return None
        return piece(vocab, t, True).decode("utf-8", "replace")

    specials = {
        "bos": tok_or_none(llama_cpp.llama_vocab_bos(vocab)),
        "eos": tok_or_none(llama_cpp.llama_vocab_eos(vocab)),
        "eot": tok_or_none(llama_cpp.llama_vocab_eot(vocab)),
        "nl": tok_or_none(llama_cpp.llama_vocab_nl(vocab)),
        "pad": tok_or_none(llama_cpp.llama_vocab_pad(vocab)),
        "sep": tok_or_none(llama_cpp.llama_vocab_sep(vocab)),
    }
    n_vocab = m.n_vocab()
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    return {
        "file": os.path.basename(path),
        "sha256": sha,
        "desc": m.desc(),
        "architecture": md.get("general.architecture"),
        "n_params": int(m.n_params()),
        "n_ctx_train": int(m.n_ctx_train()),
        "n_vocab": int(n_vocab),
        "vocab_type": int(m.vocab_type()),  # llama_vocab_type: 1=SPM 2=BPE 3=WPM 4=UGM 5=RWKV
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "tokenizer_pre": md.get("tokenizer.ggml.pre"),
        "add_bos_token": bool(m.add_bos_token()),
        "add_eos_token": bool(m.add_eos_token()),
        "add_space_prefix_metadata": md.get("tokenizer.ggml.add_space_prefix"),
        "bos_id": specials["bos"],
        "eos_id": specials["eos"],
        "special_ids": specials,
        "special_texts": {k: tok_text(v) for k, v in specials.items()},
        "eog_ids": eog,
    }


def make_tokenizer(llm: Llama, vocab, header: dict, corpus) -> dict:
    cases = []
    names = set()
    for name, text in corpus:
        assert name not in names, name
        names.add(name)
        b = text.encode("utf-8")
        ids_special = llm.tokenize(b, add_bos=False, special=True)
        ids_plain = llm.tokenize(b, add_bos=False, special=False)
        ids_bos_special = llm.tokenize(b, add_bos=True, special=True)
        ids_bos_plain = llm.tokenize(b, add_bos=True, special=False)
        # Cross-check our detokenizer against llama-cpp-python's for short pieces.
        ref = llm.detokenize(ids_special, special=True)
        mine = detokenize(llm, vocab, ids_special, True)
        if ref != mine:
            print(f"make_goldens: note: Llama.detokenize differs for {name!r} (32-byte piece buffer?)",
                  file=sys.stderr)
        cases.append({
            "name": name,
            "text": text,
            "text_hex": b.hex(),
            "ids_special": ids_special,
            "ids_plain": ids_plain,
            "ids_bos_special": ids_bos_special,
            "ids_bos_plain": ids_bos_plain,
            "detok_hex": detokenize(llm, vocab, ids_special, False).hex(),
            "detok_special_hex": mine.hex(),
            "detok_plain_hex": detokenize(llm, vocab, ids_plain, False).hex(),
            "pieces_special_hex": [piece(vocab, t, True).hex() for t in ids_special],
        })
    out = {"schema": TOKENIZER_SCHEMA, **header}
    out["notes"] = (
        "ids_*: Llama.tokenize(text_utf8, add_bos=<bos>, special=<special>); add_bos=True adds BOS "
        "(and EOS) only where the model's add_bos_token/add_eos_token metadata says so. "
        "detok_hex: pieces of ids_special with special=False (special tokens render as empty); "
        "detok_special_hex: pieces of ids_special with special=True; detok_plain_hex: pieces of "
        "ids_plain with special=False. Pieces are llama_token_to_piece(lstrip=0), concatenated "
        "as Llama.detokenize does."
    )
    out["cases"] = cases
    return out


def last_logits(llm: Llama) -> np.ndarray:
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def topk(logits: np.ndarray, k: int) -> list[list]:
    idx = np.argpartition(-logits, k)[:k]
    # sort by logit desc, then token id asc for deterministic ties
    order = sorted(idx.tolist(), key=lambda t: (-float(logits[t]), t))
    return [[int(t), round(float(logits[t]), 5)] for t in order]


def make_logits(llm: Llama, vocab, header: dict, prompts, n_gen: int, k: int, settings: dict) -> dict:
    results = []
    for name, text in prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm)
        top = topk(logits, k)
        gen, steps, step_top = [], [], []
        stop = "length"
        for _ in range(n_gen):
            t2 = topk(logits, 2)
            tok = int(np.argmax(logits))  # first max on ties == llama.cpp greedy sampler
            steps.append([t2[0][0], t2[0][1], t2[1][0], t2[1][1], round(t2[0][1] - t2[1][1], 5)])
            # Teacher forcing: gen_ids are llama.cpp's own choices, so the distribution after
            # prompt + gen_ids[:i] (what a test feeding those ids must reproduce) is this one.
            step_top.append(topk(logits, k))
            gen.append(tok)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                stop = "eog"
                break
            llm.eval([tok])
            logits = last_logits(llm)
        text_bytes = detokenize(llm, vocab, gen, False)
        margins = [s[4] for s in steps]
        results.append({
            "name": name,
            "text": text,
            "prompt_ids": ids,
            "top_logits": top,
            "gen_ids": gen,
            "gen_text": text_bytes.decode("utf-8", "replace"),
            "gen_text_hex": text_bytes.hex(),
            "stop_reason": stop,
            "gen_steps": steps,
            "step_top_logits": step_top,
            "min_margin": min(margins) if margins else None,
            "near_tie_steps": [i for i, m in enumerate(margins) if m < settings["near_tie_threshold"]],
        })
        print(f"make_goldens: {name}: {len(ids)} prompt tokens, {len(gen)} generated ({stop}), "
              f"min margin {results[-1]['min_margin']}", file=sys.stderr)
    out = {"schema": LOGITS_SCHEMA, **header}
    out["settings"] = settings
    out["notes"] = (
        "prompt_ids = Llama.tokenize(text, add_bos=True, special=True) (BOS only where the model adds "
        "it). top_logits: [token_id, raw logit] x top_k for the next token after the whole prompt, "
        "sorted by logit desc. Generation: greedy argmax over raw logits (no temperature, no "
        "penalties, no sampler), one token per llama_decode, stop after max_new_tokens or at the "
        "first end-of-generation token (included in gen_ids). gen_steps[i] = [top1_id, top1_logit, "
        "top2_id, top2_logit, margin] for the distribution that produced gen_ids[i]; "
        "step_top_logits[i]: its top_k [token_id, raw logit] (teacher forcing: the logits after "
        "prompt_ids + gen_ids[:i], each token fed by one llama_decode); steps with "
        "margin < near_tie_threshold are listed in near_tie_steps and may legitimately differ "
        "between implementations (and everything after them)."
    )
    out["prompts"] = results
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--out", required=True, help="output directory, e.g. tests/golden/smollm2/")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--near-tie", type=float, default=0.1,
                    help="logit margin below which a greedy step counts as a near-tie")
    ap.add_argument("--only", choices=["tokenizer", "logits"], help="write just one file")
    ap.add_argument("--long-text", default=LONG_TEXT_DEFAULT,
                    help="text whose opening is Gemma's long (sliding-window) prompt")
    args = ap.parse_args()

    path = os.path.expanduser(args.model)
    os.makedirs(args.out, exist_ok=True)
    sha = sha256_file(path)
    llm = Llama(model_path=path, n_ctx=args.n_ctx, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.n_batch, seed=args.seed,
                logits_all=False, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    header = {"generator": generator_info(args), "model": model_info(llm, vocab, path, sha)}
    arch = header["model"]["architecture"] or ""

    if args.only in (None, "tokenizer"):
        tok = make_tokenizer(llm, vocab, header, CORPUS)
        write_json(os.path.join(args.out, "tokenizer.json"), tok)

    if args.only in (None, "logits"):
        prompts = list(PROMPTS)
        if arch.startswith("gemma"):
            prompts += GEMMA_CHAT_PROMPTS
            prompts += long_prompts(args.long_text)
        settings = {
            "n_ctx": args.n_ctx, "n_threads": args.threads, "n_batch": args.n_batch,
            "seed": args.seed, "max_new_tokens": args.max_new_tokens, "top_k": args.top_k,
            "near_tie_threshold": args.near_tie, "sampling": "greedy_argmax_raw_logits",
            "temperature": 0.0, "repeat_penalty": 1.0, "add_bos": "model_default",
            "special": True,
        }
        lg = make_logits(llm, vocab, header, prompts, args.max_new_tokens, args.top_k, settings)
        write_json(os.path.join(args.out, "logits.json"), lg)
    return 0


def write_json(path: str, obj) -> None:
    text = dumps_compact(obj)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    size = os.path.getsize(path)
    print(f"make_goldens: wrote {path} ({size} bytes)", file=sys.stderr)
    if size > 1 << 20:
        print(f"make_goldens: warning: {path} is over 1 MB", file=sys.stderr)


def dumps_compact(obj) -> str:
    """Indented JSON, but every list of scalars on a single line (readable diffs, small files).
    Done with placeholders, so string values are never touched."""
    stash: list[str] = []
    marker = "\u0000BIE_LIST_"

    def is_scalar(v):
        return v is None or isinstance(v, (bool, int, float, str))

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            if all(is_scalar(x) for x in v):
                stash.append(json.dumps(v, ensure_ascii=False, separators=(", ", ": ")))
                return f"{marker}{len(stash) - 1}"
            return [walk(x) for x in v]
        return v

    text = json.dumps(walk(obj), ensure_ascii=False, indent=1)
    for i in reversed(range(len(stash))):  # reversed: "..._12" replaced before "..._1"
        text = text.replace(json.dumps(f"{marker}{i}"), stash[i])
    json.loads(text)  # sanity
    return text


if __name__ == "__main__":
    sys.exit(main())
