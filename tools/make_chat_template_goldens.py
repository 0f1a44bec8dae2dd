#!/usr/bin/env python3
"""Goldens for common/chat_template.cpp: real chat templates rendered by transformers.

For every template in data/chat_templates/*.jinja (their models: data/chat_templates/README.md)
and a fixed set of conversations, this renders

    tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)

with a PreTrainedTokenizerFast built from data/models/tiny-mha/tokenizer.json, the template,
and the model's own bos / eos tokens, and writes data/golden/chat_templates/<name>.json:

    {"template": "<name>.jinja", "model": ..., "bos_token": ..., "eos_token": ..., "now": ...,
     "cases": [{"name", "messages", "tools" (only when given), "add_generation_prompt",
                "expected" (the text) or "error" {"type", "message"} (what the template raised)}]}

The tokenizer's vocabulary does not matter (tokenize=False); the template and the special
tokens do. A template that prints today's date (Llama 3.2's strftime_now) would change its
golden every day, so transformers' clock is frozen at NOW below (it patches the `datetime`
that transformers.utils.chat_template_utils.strftime_now reads); the C++ test gives the same
time to ChatTemplate::freeze_time from the file's "now" field.

Run from the repository root:  /work/main/tools/.venv/bin/python tools/make_chat_template_goldens.py
(any venv with tools/requirements.txt). Deterministic.
"""
from __future__ import annotations

import datetime as _dt
import json
import pathlib

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "data" / "chat_templates"
OUT = ROOT / "data" / "golden" / "chat_templates"
TOKENIZER = ROOT / "data" / "models" / "tiny-mha" / "tokenizer.json"

NOW = _dt.datetime(2024, 9, 5, 10, 30, 0)


class _FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: D102
        return NOW


ctu.datetime = _FrozenDatetime

# name -> (model the template ships with, bos, eos). Empty bos: the tokenizer has none.
MODELS = {
    "chatml": ("teknium/OpenHermes-2.5-Mistral-7B", "<s>", "<|im_end|>"),
    "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", "<|im_start|>", "<|im_end|>"),
    "qwen2.5": ("Qwen/Qwen2.5-3B-Instruct", "", "<|im_end|>"),
    "llama-2": ("meta-llama/Llama-2-7b-chat-hf", "<s>", "</s>"),
    "llama-3": ("meta-llama/Meta-Llama-3-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.1": ("meta-llama/Llama-3.3-70B-Instruct (Llama 3.1's template)", "<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("meta-llama/Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral-v0.1": ("mistralai/Mistral-7B-Instruct-v0.1", "<s>", "</s>"),
    "mistral-nemo": ("mistralai/Mistral-Nemo-Instruct-2407 (v3 tool-calling format)", "<s>", "</s>"),
    "zephyr": ("TinyLlama/TinyLlama-1.1B-Chat-v1.0 (Zephyr's template)", "<s>", "</s>"),
    "gemma-2": ("google/gemma-2-2b-it", "<bos>", "<eos>"),
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


CONVERSATIONS = {
    "system_user": [SYSTEM, user("Hello!")],
    "user_only": [user("What is 2+2?")],
    "multi_turn": [SYSTEM, user("Hi there"), assistant("   I am an assistant   "), user("Another question")],
    "multi_turn_no_system": [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")],
    "unicode": [user("Grüße, 世界! 🙂 naïve café — ﬁ\ttab\nnew line"), assistant("Ça va très bien 😀")],
    "empty_content": [{"role": "system", "content": ""}, user("")],
    "jinja_braces": [user("{{ messages }} {% if x %} {# c #} {%- raw -%} '\"\\n\\ backslash")],
    "whitespace": [user("  \n padded \t "), assistant("\n\nreply\n\n"), user(" x ")],
    "roles_not_alternating": [user("first"), user("second")],
    "assistant_first": [assistant("I speak first."), user("ok")],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
TOOL_CONVERSATIONS = {
    "tools_offered": [SYSTEM, user("Weather in Zürich?")],
    "tools_called": [
        user("Weather in Zürich?"),
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "tool_call_id": "call12345", "content": "sunny"},
    ],
}
TOOL_TEMPLATES = {"qwen2.5", "llama-3.1", "llama-3.2", "mistral-nemo"}


def render(tok, messages, add_generation_prompt, tools=None):
    try:
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
        return {"expected": text}
    except jinja2.exceptions.TemplateError as e:  # raise_exception, and Jinja's own errors
        return {"error": {"type": type(e).__name__, "message": str(e)}}
    except (TypeError, ValueError, KeyError, IndexError) as e:
        return {"error": {"type": type(e).__name__, "message": str(e)}}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    names = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))
    missing = set(names) ^ set(MODELS)
    assert not missing, f"templates and MODELS differ: {sorted(missing)}"
    for name in names:
        source = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
        model, bos, eos = MODELS[name]
        kwargs = {"tokenizer_file": str(TOKENIZER), "chat_template": source}
        if bos:
            kwargs["bos_token"] = bos
        if eos:
            kwargs["eos_token"] = eos
        tok = PreTrainedTokenizerFast(**kwargs)
        cases = []
        convs = [(k, v, None) for k, v in CONVERSATIONS.items()]
        if name in TOOL_TEMPLATES:
            convs += [(k, v, [WEATHER_TOOL]) for k, v in TOOL_CONVERSATIONS.items()]
        for conv_name, messages, tools in convs:
            for agp in (True, False):
                case = {"name": f"{conv_name}/{'gen' if agp else 'nogen'}", "messages": messages}
                if tools is not None:
                    case["tools"] = tools
                case["add_generation_prompt"] = agp
                case.update(render(tok, messages, agp, tools))
                cases.append(case)
        doc = {
            "template": f"{name}.jinja",
            "model": model,
            "bos_token": bos,
            "eos_token": eos,
            "now": NOW.strftime("%Y-%m-%d %H:%M:%S"),
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "cases": cases,
        }
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        errors = sum("error" in c for c in cases)
        print(f"{path.relative_to(ROOT)}: {len(cases)} cases, {errors} raising")


if __name__ == "__main__":
    main()
