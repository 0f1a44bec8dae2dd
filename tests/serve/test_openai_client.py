#!/usr/bin/env python3
"""The `openai` package against ch13_serve: completions and chat completions, streamed and not.

Runs in tools/.venv-clients (tools/setup.sh makes it); started with another Python it re-runs itself
there, and skips when that venv does not exist.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util as su  # noqa: E402

VENV = os.path.join(su.ROOT, "tools", ".venv-clients")
VENV_PYTHON = os.path.join(VENV, "bin", "python")
if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    if not os.access(VENV_PYTHON, os.X_OK):
        su.skip(f"no {VENV} (tools/setup.sh makes it with pip; it could not, or was not run)")
    os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__), *sys.argv[1:]])
try:
    import openai
except ImportError as e:
    su.skip(f"the openai package does not import in {VENV}: {e}")

CHATML = os.path.join(su.HERE, "chatml.jinja")
args = su.parse_args(__doc__)
watchdog = su.Watchdog(150)
server = su.Server(args.server, args.model, "--chat-template", CHATML, "--max-num-seqs", "4")
bare = su.Server(args.server, args.model)  # no chat template
client = None
MODEL = su.MODEL_NAME


def greedy_completion(max_tokens=24, **kw):
    return client.completions.create(model=MODEL, prompt=su.PROMPT, max_tokens=max_tokens, temperature=0, **kw)


def streamed_completion(**kw):
    """(text per choice index, finish_reason per index, usage or None, chunks) of a streamed completion."""
    texts, finish, usage, chunks = {}, {}, None, []
    for chunk in client.completions.create(model=MODEL, stream=True, **kw):
        chunks.append(chunk)
        su.eq(chunk.object, "text_completion", "a streamed chunk's object")
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.index in finish:
                raise AssertionError(f"choice {c.index} has a chunk after its finish_reason")
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    return texts, finish, usage, chunks


def check_usage(usage, completion_tokens=None):
    if usage is None:
        raise AssertionError("no usage")
    if usage.prompt_tokens <= 0:
        raise AssertionError(f"usage.prompt_tokens = {usage.prompt_tokens}")
    su.eq(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, "usage.total_tokens")
    if completion_tokens is not None:
        su.eq(usage.completion_tokens, completion_tokens, "usage.completion_tokens")


def bad_request(call, field, exc=None):
    """call() must raise openai.BadRequestError (or exc) whose error object names field."""
    exc = exc or openai.BadRequestError
    try:
        call()
    except exc as e:
        err = e.body if isinstance(e.body, dict) else {}
        err = err.get("error", err)  # the client may hand over the inner object or the whole body
        message = str(err.get("message", ""))
        if err.get("param") != field and field not in message:
            raise AssertionError(f"{exc.__name__} does not name {field!r}: {e.body!r}")
        su.eq(err.get("type"), "invalid_request_error", "error.type")
        return e
    raise AssertionError(f"no {exc.__name__} (expected one naming {field!r})")


# --- the cases -------------------------------------------------------------------------------


def models_list_names_the_model():
    ids = [m.id for m in client.models.list().data]
    su.eq(ids, [MODEL], "the ids of /v1/models")
    m = client.models.list().data[0]
    su.eq((m.object, m.owned_by), ("model", "inferlab"), "a model's object and owner")


def greedy_stream_equals_the_plain_text():
    plain = greedy_completion()
    su.eq(plain.object, "text_completion", "object")
    su.eq(plain.model, MODEL, "model")
    su.eq(len(plain.choices), 1, "number of choices")
    text = plain.choices[0].text
    if not text:
        raise AssertionError("the greedy text is empty")
    texts, finish, usage, chunks = streamed_completion(prompt=su.PROMPT, max_tokens=24, temperature=0,
                                                       stream_options={"include_usage": True})
    su.eq(texts, {0: text}, "the streamed text")
    su.eq(finish, {0: plain.choices[0].finish_reason}, "the streamed finish_reason")
    if len(chunks) < 3:
        raise AssertionError(f"a stream of 24 tokens came in {len(chunks)} chunks")
    check_usage(usage)
    su.eq(usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}),
          plain.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}),
          "the streamed usage")


def length_at_max_tokens():
    for n in (1, 7, 24):
        r = greedy_completion(max_tokens=n)
        su.eq(r.choices[0].finish_reason, "length", f"finish_reason at max_tokens={n}")
        check_usage(r.usage, completion_tokens=n)
    # The same prompt as a list holding one string and as token ids gives the same text.
    r = greedy_completion(max_tokens=8)
    r_list = client.completions.create(model=MODEL, prompt=[su.PROMPT], max_tokens=8, temperature=0)
    su.eq(r_list.choices[0].text, r.choices[0].text, "the text of a prompt given as a list of one string")


def stop_string_cuts_the_text():
    full = greedy_completion(max_tokens=32).choices[0].text
    # A stop string from the second half of the greedy text itself: greedy decoding repeats that text,
    # so the stop string must hit, and the answer is everything before its first occurrence.
    half = len(full) // 2
    stop = full[half:half + 4]
    if len(stop) < 4:
        raise AssertionError(f"the greedy text is too short to pick a stop string from: {full!r}")
    cut = full[:full.find(stop)]
    for stops in (stop, [stop], ["\u00a7never\u00a7", stop]):
        r = greedy_completion(max_tokens=32, stop=stops)
        su.eq(r.choices[0].finish_reason, "stop", f"finish_reason with stop={stops!r}")
        su.eq(r.choices[0].text, cut, f"the text with stop={stops!r} (full text {full!r})")
        check_usage(r.usage)
        if r.usage.completion_tokens > 32:
            raise AssertionError(f"completion_tokens {r.usage.completion_tokens} > max_tokens")
    texts, finish, usage, _ = streamed_completion(prompt=su.PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                                  stream_options={"include_usage": True})
    su.eq(texts, {0: cut}, f"the streamed text with stop={stop!r} (full text {full!r})")
    su.eq(finish, {0: "stop"}, "the streamed finish_reason")
    check_usage(usage)


def n_choices_reproducible_with_a_seed():
    def sample(seed):
        return client.completions.create(model=MODEL, prompt=su.PROMPT, max_tokens=16, temperature=1.0, n=3,
                                         seed=seed)

    a, b = sample(1234), sample(1234)
    su.eq(sorted(c.index for c in a.choices), [0, 1, 2], "the choices' indices")
    ta = {c.index: c.text for c in a.choices}
    tb = {c.index: c.text for c in b.choices}
    su.eq(tb, ta, "the choices of a second request with the same seed")
    if len(set(ta.values())) < 2:
        raise AssertionError(f"three samples at temperature 1 are all the same text: {ta!r}")
    lengths = sum(1 for c in a.choices if c.finish_reason == "length")
    check_usage(a.usage)
    if lengths == 3:
        su.eq(a.usage.completion_tokens, 48, "usage.completion_tokens of 3 choices of 16 tokens")
    texts, finish, _, _ = streamed_completion(prompt=su.PROMPT, max_tokens=16, temperature=1.0, n=3, seed=1234)
    su.eq(texts, ta, "the streamed choices with the same seed")
    su.eq(finish, {c.index: c.finish_reason for c in a.choices}, "the streamed finish_reasons")


def chat_streamed_and_not():
    messages = [{"role": "user", "content": "What did Jack name his duck?"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    su.eq(plain.object, "chat.completion", "object")
    msg = plain.choices[0].message
    su.eq(msg.role, "assistant", "message.role")
    if not msg.content:
        raise AssertionError("the greedy reply is empty")
    su.eq(plain.choices[0].finish_reason, "length" if plain.usage.completion_tokens == 16 else "stop",
          "finish_reason")
    check_usage(plain.usage)
    # The template was applied: the same prompt and text as a completion of the ChatML rendering.
    # The template begins with bos_token, as a completion's prompt begins with the BOS that the
    # tokenizer adds; a chat prompt gets no second one.
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    rendered += "<|im_start|>assistant\n"
    comp = client.completions.create(model=MODEL, prompt=rendered, max_tokens=16, temperature=0)
    su.eq(msg.content, comp.choices[0].text, "the reply beside a completion of the rendered template")
    su.eq(plain.usage.prompt_tokens, comp.usage.prompt_tokens, "prompt_tokens beside the rendered template's")

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    deltas = [(c.choices[0].delta, c.choices[0].finish_reason) for c in chunks if c.choices]
    for c in chunks:
        su.eq(c.object, "chat.completion.chunk", "a streamed chunk's object")
    su.eq(deltas[0][0].role, "assistant", "the first delta's role")
    content = "".join(d.content or "" for d, _ in deltas)
    su.eq(content, msg.content, "the streamed reply")
    su.eq([f for _, f in deltas[:-1]], [None] * (len(deltas) - 1), "finish_reason before the last chunk")
    su.eq(deltas[-1][1], plain.choices[0].finish_reason, "the last chunk's finish_reason")
    usages = [c.usage for c in chunks if c.usage is not None]
    su.eq(len(usages), 1, "chunks with usage")
    su.eq(usages[0].total_tokens, plain.usage.total_tokens, "the streamed usage.total_tokens")


def chat_stop_string():
    messages = [{"role": "user", "content": "Tell me a story."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                          temperature=0).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 4]
    if len(stop) < 4:
        raise AssertionError(f"the greedy reply is too short to pick a stop string from: {full!r}")
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0, stop=stop)
    su.eq(r.choices[0].finish_reason, "stop", "finish_reason")
    su.eq(r.choices[0].message.content, full[:full.find(stop)], f"the reply with stop={stop!r} (full {full!r})")


def errors_are_openai_errors():
    e = bad_request(lambda: greedy_completion(max_tokens=0), "max_tokens")
    su.eq(e.status_code, 400, "status")
    bad_request(lambda: greedy_completion(max_tokens=-3), "max_tokens")
    bad_request(lambda: greedy_completion(max_tokens="ten"), "max_tokens")
    bad_request(lambda: client.completions.create(model=MODEL, prompt=su.PROMPT, temperature="hot"), "temperature")
    bad_request(lambda: client.completions.create(model=MODEL, prompt=12, max_tokens=4), "prompt")
    # Longer than the context, as token ids and as text.
    bad_request(lambda: client.completions.create(model=MODEL, prompt=[5] * (su.CONTEXT + 40), max_tokens=4),
                "prompt")
    bad_request(lambda: client.completions.create(model=MODEL, prompt=su.PROMPT * 30, max_tokens=4), "prompt")
    bad_request(lambda: client.chat.completions.create(model=MODEL, messages="hello", max_tokens=4), "messages")
    bad_request(lambda: client.completions.create(model="no-such-model", prompt=su.PROMPT, max_tokens=4), "model",
                openai.NotFoundError)
    bad_request(lambda: client.chat.completions.create(model="no-such-model", max_tokens=4,
                                                       messages=[{"role": "user", "content": "hi"}]),
                "model", openai.NotFoundError)
    # The server still answers after the errors.
    su.eq(greedy_completion(max_tokens=3).choices[0].finish_reason, "length", "finish_reason after the errors")


def chat_without_a_template_is_a_400():
    with bare:
        plain = openai.OpenAI(base_url=bare.url + "/v1", api_key="none", max_retries=0, timeout=60)
        try:
            plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        except openai.BadRequestError as e:
            if "template" not in str(e.body).lower():
                raise AssertionError(f"the 400 does not say that the model has no chat template: {e.body!r}")
        else:
            raise AssertionError("a chat request to a model without a chat template succeeded")
        # Completions still work there.
        su.eq(plain.completions.create(model=MODEL, prompt=su.PROMPT, max_tokens=2).usage.completion_tokens, 2,
              "completion_tokens on the server without a template")


def main():
    global client
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        status = su.run_cases([models_list_names_the_model, greedy_stream_equals_the_plain_text, length_at_max_tokens,
                               stop_string_cuts_the_text, n_choices_reproducible_with_a_seed, chat_streamed_and_not,
                               chat_stop_string, errors_are_openai_errors, chat_without_a_template_is_a_400],
                              server, bare)
    watchdog.cancel()
    return status


if __name__ == "__main__":
    sys.exit(main())
