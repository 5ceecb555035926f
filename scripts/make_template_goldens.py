#!/usr/bin/env python3
"""Renders every template in tests/golden/templates/ (listed in templates.json) over every
conversation in conversations.json, and every small feature template in features.json, with
Python's jinja2 configured as Hugging Face transformers renders chat templates, and writes
tests/golden/templates/goldens.json for BIE's parity test (tests/test_template_parity.cpp).

transformers' settings reproduced here: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols, a `generation` tag]), its own tojson filter
(json.dumps with ensure_ascii=False, indent, separators, sort_keys), raise_exception() raising
TemplateError, strftime_now() (here at a fixed time, so the goldens are deterministic), and the
context apply_chat_template builds: messages, tools and documents (None when absent),
add_generation_prompt and the special tokens (an absent token is left undefined).

Run with the python3 that has jinja2 (python3-jinja2 on Debian):
    python3 scripts/make_template_goldens.py
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                    "templates")
# What strftime_now() formats; the C++ test passes the same fields.
NOW = datetime(2026, 3, 14, 9, 26, 53)


class GenerationTag(Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def main():
    with open(os.path.join(HERE, "templates.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    env = make_env()
    cases = []
    for name, meta in manifest.items():
        with open(os.path.join(HERE, name), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        for conv in corpus["conversations"]:
            for gen in (True, False):
                ctx = {
                    "messages": conv["messages"],
                    "tools": corpus["tools"][conv["tools"]] if "tools" in conv else None,
                    "documents": conv.get("documents"),
                    "add_generation_prompt": gen,
                }
                if meta["bos"] is not None:
                    ctx["bos_token"] = meta["bos"]
                if meta["eos"] is not None:
                    ctx["eos_token"] = meta["eos"]
                case = {"template": name, "conversation": conv["name"],
                        "add_generation_prompt": gen}
                try:
                    case["text"] = template.render(**ctx)
                except Exception as e:  # the template refuses: BIE must refuse too
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    with open(os.path.join(HERE, "features.json"), encoding="utf-8") as f:
        features = json.load(f)
    feature_cases = []
    for feat in features["features"]:
        case = {"name": feat["name"]}
        try:  # a syntax error or an unknown filter fails in from_string, as in BIE's parse
            case["text"] = env.from_string(feat["template"]).render(**features["context"])
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        feature_cases.append(case)
    out = {"generator": {"jinja2": jinja2.__version__, "script": "scripts/make_template_goldens.py",
                         "now": NOW.isoformat()},
           "cases": cases, "features": feature_cases}
    path = os.path.join(HERE, "goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    f_err = sum(1 for c in feature_cases if "error" in c)
    print(f"wrote {len(cases)} cases ({n_err} refused by their template) and "
          f"{len(feature_cases)} feature cases ({f_err} errors) to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
