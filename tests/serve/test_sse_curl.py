#!/usr/bin/env python3
"""Server-sent events as curl sees them on the wire: `curl -N` against streamed completions and chat
completions of ch13_serve. Every event is one `data: ...` line and a blank line, every payload is JSON
but the last, `data: [DONE]`, the content type is text/event-stream, and the streamed text equals the
non-streamed answer's."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util as su  # noqa: E402

CURL = shutil.which("curl")
if CURL is None:
    su.skip("no curl (tools/setup.sh installs it)")
args = su.parse_args(__doc__)
watchdog = su.Watchdog(100)
server = su.Server(args.server, args.model, "--chat-template", os.path.join(su.HERE, "chatml.jinja"))


def curl(path, body):
    """(status, content type, raw body bytes) of a POST through curl -N."""
    with tempfile.NamedTemporaryFile(suffix=".headers") as h:
        p = subprocess.run([CURL, "-sS", "-N", "--max-time", "60", "-D", h.name, "-H", "Content-Type: application/json",
                            "--data-binary", json.dumps(body), server.url + path],
                           capture_output=True, timeout=90, check=False)
        if p.returncode != 0:
            raise AssertionError(f"curl exited {p.returncode}: {p.stderr.decode(errors='replace')}")
        head = open(h.name, "rb").read().decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    ctype = next((line.split(":", 1)[1].strip() for line in head if line.lower().startswith("content-type:")), None)
    return status, ctype, p.stdout


def events(raw):
    """The payloads of a raw event stream, checking its framing; the [DONE] marker is checked, not returned."""
    if not raw.endswith(b"\n\n"):
        raise AssertionError(f"the stream does not end with a blank line: ...{raw[-80:]!r}")
    blocks = raw[:-2].split(b"\n\n")
    for b in blocks:
        if not b.startswith(b"data: ") or b"\n" in b or b"\r" in b:
            raise AssertionError(f"an event that is not one `data: ...` line: {b[:200]!r}")
    su.eq(blocks[-1], b"data: [DONE]", "the last event")
    payloads = []
    for b in blocks[:-1]:
        try:
            payloads.append(json.loads(b[len(b"data: "):]))
        except ValueError as e:
            raise AssertionError(f"an event whose payload is not JSON ({e}): {b[:200]!r}") from None
    return payloads


def check_stream_headers(status, ctype):
    su.eq(status, 200, "status")
    if ctype is None or ctype.split(";")[0].strip() != "text/event-stream":
        raise AssertionError(f"content type {ctype!r}, expected text/event-stream")


def completion_stream_equals_the_plain_answer():
    body = {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 20, "temperature": 0}
    status, ctype, raw = curl("/v1/completions", body)
    su.eq(status, 200, "the plain request's status")
    if ctype is None or not ctype.startswith("application/json"):
        raise AssertionError(f"the plain answer's content type is {ctype!r}")
    plain = json.loads(raw)
    status, ctype, raw = curl("/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
    check_stream_headers(status, ctype)
    payloads = events(raw)
    text = "".join(c["text"] for p in payloads for c in p["choices"])
    su.eq(text, plain["choices"][0]["text"], "the streamed text")
    finishes = [c["finish_reason"] for p in payloads for c in p["choices"]]
    su.eq(finishes[:-1], [None] * (len(finishes) - 1), "finish_reason before the last chunk")
    su.eq(finishes[-1], plain["choices"][0]["finish_reason"], "the last finish_reason")
    ids = {p["id"] for p in payloads}
    su.eq(len(ids), 1, "the number of distinct ids in one stream")
    for p in payloads:
        su.eq(p["object"], "text_completion", "a chunk's object")
        su.eq(p["model"], su.MODEL_NAME, "a chunk's model")
    usage = [p["usage"] for p in payloads if p.get("usage")]
    su.eq(usage, [plain["usage"]], "the streamed usage")


def chat_stream_equals_the_plain_answer():
    body = {"model": su.MODEL_NAME, "messages": [{"role": "user", "content": "Who painted the doll?"}],
            "max_tokens": 20, "temperature": 0}
    status, _, raw = curl("/v1/chat/completions", body)
    su.eq(status, 200, "the plain request's status")
    plain = json.loads(raw)
    status, ctype, raw = curl("/v1/chat/completions", dict(body, stream=True))
    check_stream_headers(status, ctype)
    payloads = events(raw)
    for p in payloads:
        su.eq(p["object"], "chat.completion.chunk", "a chunk's object")
    deltas = [c["delta"] for p in payloads for c in p["choices"]]
    su.eq(deltas[0].get("role"), "assistant", "the first delta's role")
    su.eq(deltas[-1], {}, "the last delta")
    content = "".join(d.get("content") or "" for d in deltas)
    su.eq(content, plain["choices"][0]["message"]["content"], "the streamed reply")
    su.eq(payloads[-1]["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"], "the last finish_reason")


def an_error_is_not_a_stream():
    status, ctype, raw = curl("/v1/completions", {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 0,
                                                  "stream": True})
    su.eq(status, 400, "status of a streamed request with max_tokens 0")
    err = json.loads(raw)["error"]
    su.eq(err["param"], "max_tokens", "error.param")


def main():
    with server:
        status = su.run_cases([completion_stream_equals_the_plain_answer, chat_stream_equals_the_plain_answer,
                               an_error_is_not_a_stream], server)
    watchdog.cancel()
    return status


if __name__ == "__main__":
    sys.exit(main())
