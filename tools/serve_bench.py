#!/usr/bin/env python3
"""A load generator for any OpenAI-compatible completions server (ch13_serve, llama-server, ...).

Standard library only (threads and http.client), so the system python3 runs it.

    python3 tools/serve_bench.py --base-url http://127.0.0.1:8000 --concurrency 4 -n 32
    python3 tools/serve_bench.py --base-url URL --rate 2.5 -n 40 --max-duration 60 --out run.json

Every request is a streamed POST /v1/completions at temperature 0 whose prompt is cut from
data/corpus/val.txt (seeded): a run of whole words starting at a random word, its length in words
drawn from --prompt-words; max_tokens from --max-tokens. Both take a distribution:
  N          always N
  A:B        uniform integer in [A, B]
  exp:M      exponential with mean M, at least 1 (and at most 4 M)
--shared-prefix N puts the same N words (a fixed passage, "system text") before every prompt, to
exercise prefix caching; "ignore_eos": true goes with every request (llama-server honours it,
servers that do not know the field ignore it), so a request usually runs to max_tokens.

Load:
  --concurrency C   C workers, each sending its next request as soon as the last one ended
  --rate L          Poisson arrivals, L requests/s on average (exponential gaps, seeded),
                    each request on its own thread whatever is still in flight
Either way -n N requests at most, and --max-duration S seconds of wall time: no request starts
after S, and those in flight then get --timeout more seconds. --warmup K sends K requests first
(one at a time, same distributions, another seed) that are not counted.

Measured per request from the client's clock: TTFT (send to the first streamed chunk holding a
choice), TPOT (per request: time from its first to its last token chunk over completion_tokens-1,
completion_tokens as the server reports them in usage, else the number of token chunks; the
percentiles are then taken over the requests' TPOTs, so every request weighs the same), ITL
(every gap between consecutive token chunks, pooled over all requests), end-to-end latency.
Per run: output tokens/s and requests/s (completed ones over the time from the first send to the
last end), errors by kind. Prints a table; --out FILE writes it all as JSON.
"""
import argparse
import http.client
import json
import math
import os
import random
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- distributions -------------------------------------------------------------------------


def parse_dist(spec):
    """'N', 'A:B' or 'exp:M' -> a function of a random.Random giving a positive int."""
    try:
        if spec.startswith("exp:"):
            mean = float(spec[4:])
            if mean <= 0:
                raise ValueError
            return lambda rng: max(1, min(int(round(rng.expovariate(1.0 / mean))), int(4 * mean)))
        if ":" in spec:
            lo, hi = (int(x) for x in spec.split(":", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            return lambda rng: rng.randint(lo, hi)
        n = int(spec)
        if n < 1:
            raise ValueError
        return lambda rng: n
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{spec}' is not N, A:B or exp:M with positive numbers") from None


# ---- prompts -------------------------------------------------------------------------------


def make_prompts(words, count, length, max_tokens, seed, prefix_words):
    """count (prompt, max_tokens) pairs; the same seed gives the same list."""
    rng = random.Random(seed)
    prefix = ""
    if prefix_words > 0:
        # a fixed passage from the start of the corpus, not drawn, so every run shares it
        prefix = " ".join(words[i % len(words)] for i in range(prefix_words)) + "\n\n"
    out = []
    for _ in range(count):
        n = length(rng)
        start = rng.randrange(len(words))
        body = " ".join(words[(start + i) % len(words)] for i in range(n))
        out.append((prefix + body, max_tokens(rng)))
    return out


# ---- one streamed request ------------------------------------------------------------------


class Target:
    def __init__(self, base_url, model, timeout, ignore_eos):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise SystemExit(f"serve_bench: --base-url must be http://HOST:PORT, not '{base_url}'")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.model, self.timeout, self.ignore_eos = model, timeout, ignore_eos

    def get_json(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("GET", self.prefix + path)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status} {body[:200]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def complete(self, prompt, max_tokens):
        """One streamed completion; a dict of times (seconds after its send) and counts."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        if self.ignore_eos:
            body["ignore_eos"] = True
        rec = {"max_tokens": max_tokens, "ok": False, "error": None, "token_times": [],
               "completion_tokens": None, "prompt_tokens": None, "finish_reason": None}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        rec["start"] = time.time()
        try:
            conn.request("POST", self.prefix + "/v1/completions", json.dumps(body).encode(),
                         {"Content-Type": "application/json", "Accept": "text/event-stream"})
            r = conn.getresponse()
            if r.status != 200:
                text = r.read()[:300].decode("utf-8", "replace")
                rec["error"] = f"http_{r.status}"
                rec["error_text"] = text
                return rec
            done = False
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                now = time.perf_counter() - t0
                ev = json.loads(data)
                if "error" in ev:
                    rec["error"] = "stream_error"
                    rec["error_text"] = json.dumps(ev["error"])[:300]
                    return rec
                for ch in ev.get("choices") or []:
                    if ch.get("text") or ch.get("finish_reason") is None:
                        rec["token_times"].append(now)
                    if ch.get("finish_reason"):
                        rec["finish_reason"] = ch["finish_reason"]
                usage = ev.get("usage")
                if usage:
                    rec["completion_tokens"] = usage.get("completion_tokens")
                    rec["prompt_tokens"] = usage.get("prompt_tokens")
            rec["e2e"] = time.perf_counter() - t0
            if not done:
                rec["error"] = "no_done"
            elif not rec["token_times"] and not rec["completion_tokens"]:
                rec["error"] = "no_tokens"
            else:
                # tokens whose text is empty may never be streamed (llama-server sends no chunk for
                # them): such a request counts for throughput and e2e, not for TTFT or TPOT
                rec["ok"] = True
        except (OSError, http.client.HTTPException, ValueError) as e:
            rec["error"] = type(e).__name__
            rec["error_text"] = str(e)[:300]
        finally:
            rec.setdefault("e2e", time.perf_counter() - t0)
            rec["end"] = time.time()
            conn.close()
        return rec


# ---- load patterns -------------------------------------------------------------------------


def run_concurrency(target, work, concurrency, deadline):
    results, lock, next_i = [None] * len(work), threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= len(work) or time.monotonic() >= deadline:
                    return
                next_i[0] += 1
            results[i] = target.complete(*work[i])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def run_poisson(target, work, rate, deadline, seed):
    rng = random.Random(seed + 7919)
    results, threads = [None] * len(work), []
    t_next = time.monotonic()
    for i, item in enumerate(work):
        t_next += rng.expovariate(rate)
        wait = t_next - time.monotonic()
        if t_next >= deadline:
            break
        if wait > 0:
            time.sleep(wait)

        def one(i=i, item=item):
            results[i] = target.complete(*item)

        t = threading.Thread(target=one, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


# ---- statistics ----------------------------------------------------------------------------


def pct(xs, p):
    """Percentile p (0-100) of xs by linear interpolation between closest ranks; None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarise(results, sent_planned):
    ok = [r for r in results if r["ok"]]
    errors = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    ttft = [r["token_times"][0] for r in ok if r["token_times"]]
    e2e = [r["e2e"] for r in ok]
    tpot, itl, out_tokens, prompt_tokens = [], [], 0, []
    for r in ok:
        tt = r["token_times"]
        n = r["completion_tokens"] if r["completion_tokens"] is not None else len(tt)
        r["tokens"] = n
        out_tokens += n
        if r["prompt_tokens"] is not None:
            prompt_tokens.append(r["prompt_tokens"])
        if n > 1 and len(tt) > 1:
            tpot.append((tt[-1] - tt[0]) / (n - 1))
        itl.extend(b - a for a, b in zip(tt, tt[1:]))
    span = (max(r["end"] for r in results) - min(r["start"] for r in results)) if results else 0.0

    def ms(xs, p):
        v = pct(xs, p)
        return None if v is None else v * 1000.0

    return {
        "requests_planned": sent_planned, "requests_sent": len(results), "requests_ok": len(ok),
        "requests_ok_without_token_chunks": sum(1 for r in ok if not r["token_times"]),
        "errors": errors, "duration_s": span,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / span if span > 0 else None,
        "requests_per_s": len(ok) / span if span > 0 else None,
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
        "ttft_ms": {"p50": ms(ttft, 50), "p99": ms(ttft, 99), "mean": 1000 * sum(ttft) / len(ttft) if ttft else None},
        "tpot_ms": {"p50": ms(tpot, 50), "p99": ms(tpot, 99), "of": "per-request TPOTs"},
        "itl_ms": {"p50": ms(itl, 50), "p99": ms(itl, 99), "of": "pooled gaps between token chunks"},
        "e2e_ms": {"p50": ms(e2e, 50), "p99": ms(e2e, 99)},
    }


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(s, label):
    head = ["run", "ok/sent", "err", "tok/s", "req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
            "ITL p99", "e2e p50", "e2e p99"]
    row = [label, f"{s['requests_ok']}/{s['requests_sent']}", str(sum(s["errors"].values())),
           fmt(s["output_tokens_per_s"]), fmt(s["requests_per_s"], 2),
           fmt(s["ttft_ms"]["p50"]), fmt(s["ttft_ms"]["p99"]), fmt(s["tpot_ms"]["p50"], 2),
           fmt(s["tpot_ms"]["p99"], 2), fmt(s["itl_ms"]["p99"], 2), fmt(s["e2e_ms"]["p50"]), fmt(s["e2e_ms"]["p99"])]
    w = [max(len(a), len(b)) for a, b in zip(head, row)]
    print("  ".join(h.rjust(n) for h, n in zip(head, w)))
    print("  ".join(c.rjust(n) for c, n in zip(row, w)))
    print("(times in ms; TPOT percentiles over per-request TPOTs, ITL over pooled chunk gaps)")
    if s["errors"]:
        print("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(s["errors"].items())))


# ---- main ----------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="http://HOST:PORT of the server")
    ap.add_argument("--model", default=None, help="the model field (default: the first of GET /v1/models)")
    load = ap.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", "-c", type=int, help="C workers back to back")
    load.add_argument("--rate", type=float, help="Poisson arrivals, requests/s")
    ap.add_argument("-n", "--num-requests", type=int, default=32)
    ap.add_argument("--max-duration", type=float, default=120.0, help="no request starts after S seconds")
    ap.add_argument("--timeout", type=float, default=120.0, help="socket timeout per request, seconds")
    ap.add_argument("--warmup", type=int, default=0, help="K uncounted requests first, one at a time")
    ap.add_argument("--prompt-words", type=parse_dist, default="32:96", metavar="DIST")
    ap.add_argument("--max-tokens", type=parse_dist, default="64", metavar="DIST")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="N", help="N words of shared text first")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="do not send ignore_eos (requests may end at EOS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "data", "corpus", "val.txt"))
    ap.add_argument("--label", default=None, help="a name for this run in the table and the JSON")
    ap.add_argument("--out", default=None, help="write the summary and every request's record here")
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                    help="a field for the JSON's tags (repeatable), e.g. server=llama-server")
    ap.add_argument("--quiet", action="store_true", help="no table")
    a = ap.parse_args(argv)
    if (a.concurrency is not None and a.concurrency < 1) or (a.rate is not None and a.rate <= 0):
        ap.error("--concurrency must be >= 1 and --rate > 0")
    if a.num_requests < 1:
        ap.error("-n must be >= 1")

    with open(a.corpus, encoding="utf-8") as f:
        words = f.read().split()
    if not words:
        raise SystemExit(f"serve_bench: {a.corpus} holds no words")
    target = Target(a.base_url, a.model, a.timeout, a.ignore_eos)
    if not target.model:
        target.model = target.get_json("/v1/models")["data"][0]["id"]

    if a.warmup > 0:
        for prompt, mt in make_prompts(words, a.warmup, a.prompt_words, a.max_tokens, a.seed + 1_000_003,
                                       a.shared_prefix):
            r = target.complete(prompt, mt)
            if not r["ok"]:
                print(f"serve_bench: warm-up request failed: {r['error']} {r.get('error_text', '')}", file=sys.stderr)
    work = make_prompts(words, a.num_requests, a.prompt_words, a.max_tokens, a.seed, a.shared_prefix)
    deadline = time.monotonic() + a.max_duration
    if a.concurrency is not None:
        results = run_concurrency(target, work, a.concurrency, deadline)
        mode = {"mode": "concurrency", "concurrency": a.concurrency}
    else:
        results = run_poisson(target, work, a.rate, deadline, a.seed)
        mode = {"mode": "poisson", "rate": a.rate}
    s = summarise(results, a.num_requests)
    label = a.label or (f"c={a.concurrency}" if a.concurrency is not None else f"rate={a.rate}")
    if not a.quiet:
        print_table(s, label)
    if a.out:
        argv_used = sys.argv[1:] if argv is None else list(argv)
        tags = dict(t.split("=", 1) for t in a.tag if "=" in t)
        doc = {"label": label, "tags": tags, "base_url": a.base_url, "model": target.model, **mode,
               "num_requests": a.num_requests, "max_duration_s": a.max_duration, "warmup": a.warmup,
               "shared_prefix_words": a.shared_prefix, "ignore_eos": a.ignore_eos, "seed": a.seed,
               "argv": argv_used, "summary": s,
               "requests": [{k: v for k, v in r.items() if k != "token_times"} | {"ttft_s": r["token_times"][0] if r["token_times"] else None}
                            for r in results]}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if s["requests_ok"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
