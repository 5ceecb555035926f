#!/usr/bin/env python3
"""Renders chat conversations with three chat templates (SmolLM2's ChatML, Gemma's, Llama 3's)
through Python's jinja2 configured as transformers renders chat templates (the environment of
scripts/make_template_goldens.py), and writes tests/golden/chat/templates.json for BIE's
ChatTemplate tests (tests/test_chat_template.cpp): the template text, the BOS/EOS token texts,
the messages and the expected prompt text.

Run with the python3 that has jinja2: python3 scripts/make_chat_goldens.py
"""
import json
import os
import sys

import jinja2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_template_goldens import make_env  # noqa: E402

# SmolLM2-135M-Instruct's tokenizer.chat_template, as stored in its GGUF file.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Gemma 3 instruct template (text-only part). The gemma-3-270m GGUF we test with is the base
# model and has no template; BIE falls back to the full Gemma 3 template from the vocabulary.
GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}"
)

# Meta-Llama-3-8B-Instruct template.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

FAMILIES = {
    "chatml": (SMOLLM2, "<|endoftext|>", "<|im_end|>"),
    "gemma": (GEMMA, "<bos>", "<eos>"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "  Be kind.\n"},
     {"role": "user", "content": "Count to 3."},
     {"role": "assistant", "content": "1, 2, 3."},
     {"role": "user", "content": " Again, in French \u00e9\u00e8.  "}],
    [{"role": "user", "content": "line one\nline two\n"}],
    [{"role": "user", "content": ""}],
]


def main():
    env = make_env()
    out = {"generator": {"jinja2": jinja2.__version__,
                         "renderer": "scripts/make_template_goldens.py make_env()"},
           "cases": []}
    for name, (src, bos, eos) in FAMILIES.items():
        template = env.from_string(src)
        for msgs in CONVERSATIONS:
            for gen in (True, False):
                text = template.render(messages=msgs, tools=None, documents=None,
                                       add_generation_prompt=gen, bos_token=bos, eos_token=eos)
                out["cases"].append({"family": name, "template": src, "bos": bos, "eos": eos,
                                     "add_generation_prompt": gen, "messages": msgs,
                                     "text": text})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "chat",
                        "templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(out['cases'])} cases to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
