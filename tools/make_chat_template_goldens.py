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

and data/golden/chat_templates/_constructs.json: small templates, one per group of Jinja
constructs the interpreter implements (CONSTRUCTS below), rendered the same way, so that each
construct is checked against transformers' own Jinja environment and not only the ones the real
templates happen to use. Its cases carry their "source" instead of a template file.

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


CONSTRUCT_MESSAGES = [
    {"role": "system", "content": "Sys 'single' \"double\""},
    user("hello world  foo"),
    assistant("Ok"),
    user("Bye é"),
]
CONSTRUCTS = {
    "filters_on_messages": "{{ messages | length }} {{ messages[-1].content | upper }} {{ messages[0]['role'] | capitalize }}",
    "loop_variables": "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role[0] }}"
    "{% if not loop.last %},{% endif %}{% endfor %}",
    "map_join": "{{ messages | map(attribute='role') | join(',') }}",
    "slices": "{{ messages[1:] | length }} {{ messages[:-1] | last | tojson }} {{ messages[::2] | map(attribute='role') | list }}",
    "string_methods": "{{ (messages | first).content.split(' ') }} {{ 'a-b-c'.split('-', 1) }} {{ 'abc'.startswith(('x', 'a')) }}"
    " {{ 'abc'.endswith('bc') }} {{ messages[1].content.split() }} {{ ' Ab '.rstrip() }}|{{ 'ab cd'.title() }}"
    " {{ 'aXbX'.replace('X', '-') }} {{ 'MiXed'.lower() }}{{ 'MiXed'.upper() }}",
    "dict_methods": "{{ {'x': 1, 'y': [1, 2]}.items() | list }} {{ {'x': 1}.keys() | list }} {{ {'x': 1}.values() | list }}"
    " {{ {'x': 1}.get('y', 'none') }} {{ {'x': 1}.get('y') }} {{ {'x': 1, 'y': 2} | items | list }}",
    "arithmetic": "{{ 10 / 4 }} {{ 10 // 4 }} {{ 10 % 4 }} {{ 2 ** 10 }} {{ -3 // 2 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }}"
    " {{ 1e20 }} {{ 1e-5 }} {{ 123456789.0 * 1000 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 - 5 }} {{ 1 + 2 * 3 }}",
    "comparisons": "{{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 3 >= 3.0 }} {{ none == none }} {{ x == y }} {{ 'é' | length }}"
    " {{ 1 != 2 }} {{ 'b' in ['a', 'b'] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}",
    "context": "{{ tools is none }} {{ documents is none }} {{ add_generation_prompt }} {{ bos_token }}{{ eos_token }}"
    " {{ tools is defined }} {{ undefined_name is defined }}",
    "namespace": "{%- set ns = namespace(sys=none, n=0) -%}{%- for m in messages -%}{%- if m.role == 'system' -%}"
    "{%- set ns.sys = m.content -%}{%- endif -%}{%- set ns.n = ns.n + 1 -%}{%- endfor -%}{{ ns.sys }}|{{ ns.n }}",
    "select_reject": "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}"
    " {{ messages | rejectattr('role', 'equalto', 'user') | list | length }} {{ [1, 2, 3] | select('odd') | list }}"
    " {{ [0, 1, none, 'a'] | select | list }} {{ [1, 2, 3, 4] | reject('divisibleby', 2) | list }}",
    "first_last_range": "{{ [3, 1, 2] | first }} {{ 'hello' | first }} {{ 'hello' | last }} {{ range(3) | list }}"
    " {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}",
    "conversions": "{{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 42 | string }}{{ 'x' ~ 4.0 }}|{{ '3' | int + 1 }}"
    "|{{ '2.5' | float }}|{{ -3 | abs }}|{{ 2.7 | int }}|{{ 'abc' | list }}|{{ none | string }}",
    "tojson": "{{ {'a': {'b': [1, {'c': 'é\"\\n\\t<>&'}]}} | tojson }}\n{{ {'a': [1, 2], 'b': {}} | tojson(indent=2) }}\n"
    "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ 'é' | tojson(ensure_ascii=true) }} {{ [1.0, 1e100, -0.5, true] | tojson }}",
    "python_repr": "{{ messages[0] }} {{ ['it\\'s', \"q\\\"\", 'line\\nbreak'] }} {{ {'n': none, 'f': 2.50} }}",
    "whitespace_control": "line1\n    {%- if true %}\n        kept\n    {%+ if true %}plus{% endif %}\n{% if true +%}\nafter\n"
    "{% endif %}\n{#- c -#}\n  end  \n   {# alone #}\n\t{% if true %}tab{% endif %}\n{{ 'x' -}}   \n\n  y\n"
    "    {% endif %}\n  {{ 'out' }}  \n  {%- if true -%}  \n  z  \n  {%- endif -%}  \n  w\n",
    "if_elif_else": "{% if messages | length > 5 %}many{% elif messages | length > 1 %}some{% else %}few{% endif %}"
    "{% if false %}no{% elif false %}no{% endif %}|{% if none %}{% else %}else{% endif %}",
    "conditional_expression": "{{ 'yes' if messages else 'no' }} {{ 'a' if false }}|{{ 1 if 0 else 2 if 1 else 3 }}",
    "literals": "{{ 'adjacent' \"strings\" }} {{ 'tab\\there' }} {{ '\\u00e9\\x41' }} {{ True }} {{ None }} {{ (1, 2) }} {{ [] }} {{ {} }}",
    "filtered_loop": "{% for x in messages if x.role != 'system' %}{{ loop.index0 }}{{ x.role }}{% else %}none{% endfor %}"
    "{% for x in messages if x.role == 'nobody' %}x{% else %}|none{% endfor %}",
    "loop_controls": "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if m.role == 'assistant' %}"
    "{% break %}{% endif %}{{ m.role }};{% endfor %}",
    "nested_loops": "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
    "set_scoping": "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %} {{ x }}"
    "{% if true %}{% set y = 'if' %}{% endif %} {{ y }}",
    "concatenation": "{{ messages[0].content.title() }} {{ 'a' * 3 }} {{ [1] + [2] }} {{ 1 ~ 2 ~ 'x' }} {{ 'a' + 'b' ~ 3 }}",
    "tuples": "{{ (1,) }} {{ {'a': 1}.items() | first }} {% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %}"
    " {{ (1, 2)[0] }} {{ (1, 2, 3)[1:] }} {{ (1, 2) | length }} {{ 1 in (1, 2) }} {{ (1, 2) | tojson }} {{ (1, 2) | list }}",
    "unicode_case": "{{ 'ÉCOLE Àb ÿ' | lower }} {{ 'éa ǆb' | upper }} {{ 'ǆemal' | capitalize }} {{ \"it's a-b (c) d_e\" | title }}"
    " {{ \"it's a-b d_e\".title() }} {{ 'ÉTÉ'.lower().capitalize() }}",
    "raise": "{% if messages | length > 0 %}{{ raise_exception('boom ' ~ messages | length) }}{% endif %}",
    "strftime": "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %A %b %B %j %d') }}",
    "generation_block": "{% for m in messages %}{% generation %}[{{ m.role }}]{% endgeneration %}{% endfor %}",
    "default_filter": "{{ missing | default('dflt') }} {{ missing | d('d2') }} {{ '' | default('e', true) }} {{ 0 | default(5) }}",
    "tests": "{{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ 'x' is sequence }}"
    " {{ 2 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is eq 'a' }} {{ 'a' is ne 'b' }} {{ true is true }} {{ x is undefined }}",
}


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
    constructs()


def constructs():
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), bos_token="<s>", eos_token="</s>")
    cases = []
    for name, source in CONSTRUCTS.items():
        tok.chat_template = source
        case = {"name": name, "source": source, "messages": CONSTRUCT_MESSAGES, "add_generation_prompt": True}
        case.update(render(tok, CONSTRUCT_MESSAGES, True))
        cases.append(case)
    doc = {"bos_token": "<s>", "eos_token": "</s>", "now": NOW.strftime("%Y-%m-%d %H:%M:%S"),
           "transformers": transformers.__version__, "jinja2": jinja2.__version__, "cases": cases}
    path = OUT / "_constructs.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {len(cases)} cases, {sum('error' in c for c in cases)} raising")


if __name__ == "__main__":
    main()
