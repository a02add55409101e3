#!/usr/bin/env python3
"""Writes transformers' own apply_chat_template ids for random chat rows, the reference that
tests/data/sft_chat_test.cpp (SftChat.IdsAreTransformersOwn) holds laoyao's chat tokenisation to.
Run on the GPU machine, where transformers is installed (it needs no GPU), from the repository root
with build/test-vocabs carried:

  python3 tests/gpu/chat_template_reference.py tests/data/chat_template_reference.json

Rows as Megatron-Bridge hands them to apply_chat_template (tool-call arguments already objects),
add_generation_prompt=False, tools and chat_template_kwargs per row. Llama 3 with
Meta-Llama-3-8B-Instruct's template (the base model's own appends the assistant header always);
Qwen3 with its tokenizer_config.json's.
"""
import json
import random
import sys

import transformers
from transformers import AutoTokenizer

LLAMA3_INSTRUCT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

TEXTS = [
    "Hello", " leading space", "trailing space ", "multi\nline\n", "unicode: héllo — 你好 🎉", "quote ' and \"",
    "<think>\nreasoning here\n</think>\n\nthe answer", "x</think>y", "", "{{ not a tag }}", "tab\there",
    "\n\nnewlines around\n\n", "What is 2+2?", "Numbers 12345 and 3.14159", "<|im_start|>user\nfake",
    "  indented\n    code()\n",
]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def conversation(rng, qwen):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        a = {"role": "assistant", "content": rng.choice(TEXTS)}
        if qwen and rng.random() < 0.25:
            a["reasoning_content"] = rng.choice(TEXTS)
        if qwen and rng.random() < 0.3:
            a["tool_calls"] = [{"type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]
            msgs.append(a)
            msgs.append({"role": "tool", "content": rng.choice(TEXTS)})
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
        else:
            msgs.append(a)
    return msgs


def ids_of(result):
    if isinstance(result, dict) or hasattr(result, "keys"):
        result = result["input_ids"]
    return [int(i) for i in result]


def main():
    rng = random.Random(20261205)
    cases = []
    for model in ("llama3", "qwen3"):
        tok = AutoTokenizer.from_pretrained(f"build/test-vocabs/{model}")
        if model == "llama3":
            tok.chat_template = LLAMA3_INSTRUCT
        qwen = model == "qwen3"
        for _ in range(40):
            row = {"messages": conversation(rng, qwen)}
            kwargs = {}
            if qwen and rng.random() < 0.3:
                row["tools"] = TOOLS
            if qwen and rng.random() < 0.25:
                row["chat_template_kwargs"] = {"enable_thinking": False}
                kwargs = dict(row["chat_template_kwargs"])
            ids = tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True,
                                          add_generation_prompt=False, **kwargs)
            cases.append({"model": model, "row": row, "input_ids": ids_of(ids)})
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "llama3_template": LLAMA3_INSTRUCT, "cases": cases}, f,
                  ensure_ascii=False)
    print(f"{len(cases)} rows, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
