#!/usr/bin/env python3
"""A bounded soak of ch13_serve (about a minute, a fixed number of requests).

1. Random arrivals from a few client threads: plain and streamed completions and chat completions,
   clients that hang up after a few events, and malformed requests (bad JSON, wrong types, max_tokens
   beyond the context, an unknown model, a prompt longer than the context). Beside them, hostile
   clients of the HTTP front: senders of a byte at a time, batches of idle connections, chunked
   bodies of 100 MB and floods of headers, each refused as docs/reliability.md says while the others
   are served; the server's resident memory stays level.
2. A burst that overflows a small --max-waiting: the overflow gets 429 with Retry-After, nothing hangs.
3. Once idle: /metrics shows no running or waiting request and no KV block in use, and the process has
   no more threads than right after its first request.
4. SIGTERM with streams in flight: they finish, a new request is refused, the process exits 0.

Every 200 must be a complete answer (a finish_reason for every choice; a stream ends with [DONE])
unless the client hung up itself.
"""

import json
import os
import random
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util as su  # noqa: E402

args = su.parse_args(__doc__)
watchdog = su.Watchdog(110)
MAX_SEQS, MAX_WAITING = 2, 2
HEADER_TIMEOUT = 1
server = su.Server(args.server, args.model, "--chat-template", os.path.join(su.HERE, "chatml.jinja"),
                   "--max-num-seqs", str(MAX_SEQS), "--max-waiting", str(MAX_WAITING), "--threads", "1",
                   "--header-timeout", str(HEADER_TIMEOUT), "--log-format", "none")
CLIENTS, REQUESTS_PER_CLIENT, MIXED_SECONDS = 4, 60, 40
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.problems = []

    def add(self, kind, outcome):
        with self.lock:
            self.counts[(kind, outcome)] = self.counts.get((kind, outcome), 0) + 1

    def problem(self, what):
        with self.lock:
            self.problems.append(what)

    def total(self, outcome):
        return sum(v for (_, o), v in self.counts.items() if o == outcome)


tally = Tally()


def check_error_object(status, headers, parsed, what):
    if not (isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "message" in parsed["error"]):
        tally.problem(f"{what}: status {status} without an OpenAI error object: {parsed!r}")
    if status == 429 and "retry-after" not in headers:
        tally.problem(f"{what}: 429 without a Retry-After header")


def check_complete(body, n, what, chat=False):
    """A non-streamed 200: n choices, each with a finish_reason; usage adds up."""
    choices = body.get("choices", [])
    if sorted(c.get("index") for c in choices) != list(range(n)):
        tally.problem(f"{what}: choices {choices!r} for n={n}")
    for c in choices:
        if c.get("finish_reason") not in ("stop", "length"):
            tally.problem(f"{what}: finish_reason {c.get('finish_reason')!r}")
        if chat and not isinstance(c.get("message", {}).get("content"), str):
            tally.problem(f"{what}: a choice without message.content")
    u = body.get("usage", {})
    if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
        tally.problem(f"{what}: usage does not add up: {u!r}")


def plain(path, body, kind):
    status, headers, parsed, _ = server.post_json(path, body, timeout=60)
    tally.add(kind, status)
    if status == 200:
        check_complete(parsed or {}, body.get("n", 1), kind, chat=path == CHAT)
    elif status == 429:
        check_error_object(status, headers, parsed, kind)
    else:
        tally.problem(f"{kind}: status {status} for a valid request: {parsed!r}")


def streamed(path, body, kind, hang_up_after=None):
    """A streamed request; with hang_up_after, the client closes the connection after that many events."""
    conn = server.conn(timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(dict(body, stream=True)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            data = r.read()
            tally.add(kind, r.status)
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            if r.status == 429:
                check_error_object(r.status, {k.lower(): v for k, v in r.getheaders()}, parsed, kind)
            else:
                tally.problem(f"{kind}: status {r.status} for a valid streamed request: {data[:200]!r}")
            return
        stop_at = (lambda count: count < hang_up_after) if hang_up_after else None
        payloads, done = su.read_sse(r, stop_at)
        if hang_up_after and len(payloads) >= hang_up_after:
            tally.add(kind, "hung up")
            return
        tally.add(kind, 200)
        finished = {c["index"] for p in payloads for c in p.get("choices", []) if c.get("finish_reason")}
        if not done:
            tally.problem(f"{kind}: a stream that ended without [DONE] after {len(payloads)} events")
        if finished != set(range(body.get("n", 1))):
            tally.problem(f"{kind}: finish_reason came for choices {sorted(finished)} of n={body.get('n', 1)}")
    finally:
        conn.close()


MALFORMED = [
    ("bad json", COMPLETIONS, b'{"model": "tiny-mha", "prompt": "Once', (400,)),
    ("wrong type", COMPLETIONS, {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": "many"}, (400,)),
    ("wrong type", CHAT, {"model": su.MODEL_NAME, "messages": [{"role": "user", "content": 3}]}, (400,)),
    ("unknown model", COMPLETIONS, {"model": "gpt-17", "prompt": su.PROMPT}, (404,)),
    ("prompt too long", COMPLETIONS, {"model": su.MODEL_NAME, "prompt": [9] * (su.CONTEXT + 1)}, (400,)),
    ("not an object", CHAT, [1, 2, 3], (400,)),
]


def huge_max_tokens(kind):
    """max_tokens beyond the context: a 400, or an answer that ends at the context."""
    body = {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 100000, "temperature": 0.8}
    status, headers, parsed, _ = server.post_json(COMPLETIONS, body, timeout=60)
    tally.add(kind, status)
    if status == 200:
        check_complete(parsed, 1, kind)
        if parsed["usage"]["total_tokens"] > su.CONTEXT:
            tally.problem(f"{kind}: {parsed['usage']} goes past the context of {su.CONTEXT}")
    elif status in (400, 429):
        check_error_object(status, headers, parsed, kind)
    else:
        tally.problem(f"{kind}: status {status}")


def one_random_request(rng):
    pick = rng.random()
    n = rng.choice((1, 1, 2))
    temperature = rng.choice((0, 0.7, 1.0))
    completion = {"model": su.MODEL_NAME, "prompt": su.PROMPT[:rng.randint(10, len(su.PROMPT))],
                  "max_tokens": rng.randint(1, 48), "temperature": temperature, "n": n, "seed": rng.randint(0, 99)}
    chat = {"model": su.MODEL_NAME, "messages": [{"role": "user", "content": "Who is Nina?"}],
            "max_tokens": rng.randint(1, 32), "temperature": temperature}
    if pick < 0.25:
        plain(COMPLETIONS, completion, "completion")
    elif pick < 0.45:
        streamed(COMPLETIONS, completion, "streamed completion")
    elif pick < 0.55:
        plain(CHAT, chat, "chat")
    elif pick < 0.65:
        streamed(CHAT, chat, "streamed chat")
    elif pick < 0.78:
        streamed(COMPLETIONS, dict(completion, max_tokens=400, n=1), "hang-up", hang_up_after=rng.randint(1, 4))
    elif pick < 0.83:
        huge_max_tokens("huge max_tokens")
    else:
        name, path, body, expected = rng.choice(MALFORMED)
        status, headers, parsed, raw = server.post_json(path, body, timeout=30)
        tally.add(name, status)
        if status not in expected:
            tally.problem(f"{name}: status {status}, expected {expected}: {raw[:200]!r}")
        else:
            check_error_object(status, headers, parsed, name)


def client_thread(seed, deadline):
    rng = random.Random(seed)
    for _ in range(REQUESTS_PER_CLIENT):
        if time.monotonic() > deadline:
            break
        time.sleep(rng.expovariate(1 / 0.15))  # Poisson arrivals, 0.15 s apart on average per client
        try:
            one_random_request(rng)
        except Exception as e:  # noqa: BLE001 - a timeout or a reset is a finding, not a crash of the test
            tally.problem(f"client {seed}: {type(e).__name__}: {e}")


# --- hostile clients of the front ---------------------------------------------------------------

def raw_status(answer):
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else answer[:60]


def raw_exchange(head, chunks, timeout=30):
    """Sends head and chunks while reading the answer; the answer's first bytes."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    got = [b""]

    def reader():
        try:
            while len(got[0]) < 4096:
                b = s.recv(4096)
                if not b:
                    break
                got[0] += b
        except OSError:
            pass

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        s.sendall(head)
        for c in chunks:
            if got[0]:
                break
            s.sendall(c)
    except OSError:
        pass
    th.join(timeout)
    s.close()
    return got[0]


def slow_sender():
    """A byte at a time: the head's deadline answers it 408."""
    s = socket.create_connection((server.host, server.port), timeout=HEADER_TIMEOUT + 20)
    try:
        for b in b"GET /health HTTP/1.1\r\n":
            s.sendall(bytes([b]))
            time.sleep(0.2)
    except OSError:
        pass
    answer = b""
    try:
        answer = s.recv(4096)
    except OSError:
        pass
    s.close()
    return 408, answer


def idle_batch():
    """100 connections that send nothing, held while /health is asked for."""
    conns = [socket.create_connection((server.host, server.port), timeout=30) for _ in range(100)]
    t0 = time.monotonic()
    status, _, _ = server.request("GET", "/health", timeout=30)
    seconds = time.monotonic() - t0
    for c in conns:
        c.close()
    if seconds > 5:
        tally.problem(f"hostile idle: /health took {seconds:.1f} s beside 100 idle connections")
    return 200, b"HTTP/1.1 %d" % status


def chunked_100mb():
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    return 413, raw_exchange(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                             (chunk for _ in range(100)))


def header_flood():
    flood = b"X-Flood: 1\r\n" * 100_000
    return 431, raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n", [flood])


HOSTILE = [slow_sender, idle_batch, chunked_100mb, header_flood]


HOSTILE_NOW = {}  # what each hostile thread is doing, for a hang's report


def hostile_thread(seed, deadline, done):
    rng = random.Random(seed)
    while time.monotonic() < deadline and not done.is_set():
        case = rng.choice(HOSTILE)
        HOSTILE_NOW[seed] = (case.__name__, time.monotonic())
        try:
            expected, answer = case()
        except Exception as e:  # noqa: BLE001
            tally.problem(f"hostile {case.__name__}: {type(e).__name__}: {e}")
            continue
        got = raw_status(answer)
        tally.add(f"hostile {case.__name__}", got)
        if got != expected:
            tally.problem(f"hostile {case.__name__}: got {got!r}, expected {expected}")
        time.sleep(rng.uniform(0.1, 0.5))


def rss_mib():
    with open(f"/proc/{server.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def run_threads(target, arglist, join_timeout):
    threads = [threading.Thread(target=target, args=a, daemon=True) for a in arglist]
    for t in threads:
        t.start()
    end = time.monotonic() + join_timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    if hung:
        raise AssertionError(f"{hung} client threads still waiting after {join_timeout} s (a hang)")


def thread_count():
    return len(os.listdir(f"/proc/{server.pid}/task"))


def wait_idle(seconds=8.0):
    """Polls /metrics until nothing runs, waits or holds a KV block; returns the last sample."""
    end = time.monotonic() + seconds
    while True:
        m = server.metrics()
        gauges = {k: m.get(k) for k in ("inferlab_num_requests_running", "inferlab_num_requests_waiting",
                                          "inferlab_kv_blocks_used")}
        if all(v == 0 for v in gauges.values()):
            return m
        if time.monotonic() > end:
            raise AssertionError(f"not idle {seconds} s after the last request: {gauges}")
        time.sleep(0.2)


# --- the phases --------------------------------------------------------------------------------

baseline = {}


def warm_up_and_count_threads():
    su.eq(server.get_json("/health"), {"status": "ok"}, "/health")
    status, _, body, _ = server.post_json(COMPLETIONS, {"model": su.MODEL_NAME, "prompt": su.PROMPT,
                                                        "max_tokens": 4, "stream": False})
    su.eq(status, 200, "the first request's status")
    wait_idle()
    m = server.metrics()
    for name in ("inferlab_requests_accepted_total", "inferlab_requests_rejected_total",
                 "inferlab_prompt_tokens_total", "inferlab_generation_tokens_total", "inferlab_kv_blocks_total",
                 "inferlab_prefix_cache_hit_blocks_total", "inferlab_time_to_first_token_seconds_count",
                 "inferlab_time_per_output_token_seconds_count"):
        if name not in m:
            raise AssertionError(f"/metrics has no {name}")
    baseline["threads"] = thread_count()
    print(f"     threads after the first request: {baseline['threads']}", flush=True)


def random_arrivals():
    deadline = time.monotonic() + MIXED_SECONDS
    rss_before = rss_mib()
    done = threading.Event()  # the hostile clients stop with the others
    hostile = [threading.Thread(target=hostile_thread, args=(100 + i, deadline, done), daemon=True) for i in range(2)]
    for t in hostile:
        t.start()
    try:
        run_threads(client_thread, [(seed, deadline) for seed in range(CLIENTS)], MIXED_SECONDS + 30)
    finally:
        done.set()
    for t in hostile:
        t.join(30)
    if any(t.is_alive() for t in hostile):
        tally.problem(f"a hostile client thread still waits 30 s after the mixed phase: {HOSTILE_NOW}")
    rss_grew = rss_mib() - rss_before
    print(f"     resident memory over the mixed phase: {rss_grew:+.1f} MiB", flush=True)
    if rss_grew > 64 and not su.sanitized(server.pid):  # ASan's quarantine keeps freed memory
        tally.problem(f"the server's resident memory grew {rss_grew:.1f} MiB over the mixed phase")
    for case in HOSTILE:
        if not any(k == f"hostile {case.__name__}" for (k, _) in tally.counts):
            tally.problem(f"the mixed phase ran no hostile {case.__name__}")
    for (kind, outcome), v in sorted(tally.counts.items(), key=str):
        print(f"     {kind}: {outcome} x{v}", flush=True)
    if tally.problems:
        raise AssertionError(f"{len(tally.problems)} problems:\n  " + "\n  ".join(tally.problems[:20]))
    if tally.total(200) < 10:
        raise AssertionError(f"only {tally.total(200)} requests got a 200")
    if tally.total("hung up") == 0:
        raise AssertionError("no client hung up mid-stream (the random mix should have some)")


def burst_overflows_the_queue():
    wait_idle()
    tally.problems.clear()
    results, lock = [], threading.Lock()
    start = threading.Barrier(24)

    def one(i):
        body = {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 200, "temperature": 0.8, "seed": i}
        start.wait(10)
        t0 = time.monotonic()
        try:
            status, headers, parsed, _ = server.post_json(COMPLETIONS, body, timeout=60)
        except Exception as e:  # noqa: BLE001
            status, headers, parsed = f"{type(e).__name__}: {e}", {}, None
        with lock:
            results.append((status, headers, parsed, time.monotonic() - t0))

    run_threads(one, [(i,) for i in range(24)], 60)
    statuses = sorted(str(r[0]) for r in results)
    print(f"     burst of 24: {statuses}", flush=True)
    for status, headers, parsed, seconds in results:
        if status == 200:
            check_complete(parsed, 1, "burst")
        elif status == 429:
            check_error_object(status, headers, parsed, "burst")
            if seconds > 5:
                tally.problem(f"burst: a 429 took {seconds:.1f} s")
            retry = headers.get("retry-after", "")
            if not retry.isdigit():
                tally.problem(f"burst: Retry-After {retry!r} is not a number of seconds")
        else:
            tally.problem(f"burst: status {status}")
    if tally.problems:
        raise AssertionError("\n  ".join(tally.problems[:20]))
    if "429" not in statuses:
        raise AssertionError(f"24 requests at once never overflowed --max-waiting {MAX_WAITING}")
    if "200" not in statuses:
        raise AssertionError("no request of the burst was served")


def idle_again_and_no_leaked_threads():
    m = wait_idle()
    finished = sum(v for k, v in m.items() if k.startswith("inferlab_requests_finished_total"))
    accepted = m["inferlab_requests_accepted_total"]
    if finished != accepted:
        raise AssertionError(f"idle, yet {accepted:g} requests accepted and {finished:g} finished")
    if m["inferlab_requests_rejected_total"] < tally.total(429):
        raise AssertionError(f"{tally.total(429)} 429s seen, inferlab_requests_rejected_total "
                             f"{m['inferlab_requests_rejected_total']:g}")
    end = time.monotonic() + 5
    while thread_count() > baseline["threads"] and time.monotonic() < end:
        time.sleep(0.2)
    if thread_count() > baseline["threads"]:
        raise AssertionError(f"{thread_count()} threads when idle, {baseline['threads']} after the first request")


def sigterm_finishes_what_is_in_flight():
    wait_idle()
    events_seen = threading.Semaphore(0)
    outcomes, lock = [], threading.Lock()
    body = {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 300, "temperature": 0.8, "stream": True}

    def stream(i):
        outcome = su.stream_outcome(server, COMPLETIONS, dict(body, seed=i), events_seen.release)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(MAX_SEQS)]
    for t in threads:
        t.start()
    for _ in threads:
        if not events_seen.acquire(timeout=30):
            raise AssertionError("the streams sent no event within 30 s")
    t_term = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    try:
        status, _, _, _ = server.post_json(COMPLETIONS, {"model": su.MODEL_NAME, "prompt": su.PROMPT}, timeout=10)
        refused = status == 503
        late = f"status {status}"
    except TimeoutError:
        refused, late = False, "no answer within 10 s"
    except OSError as e:  # the listening socket is closed: refused, or reset
        refused, late = True, f"{type(e).__name__}"
    for t in threads:
        t.join(max(0.0, t_term + 30 - time.monotonic()))
    try:
        code = server.proc.wait(timeout=max(0.5, t_term + 10 - time.monotonic()))
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
        code = None
    waited = time.monotonic() - t_term
    print(f"     in flight at SIGTERM: {outcomes}; a request after it: {late}; exit {code} after {waited:.1f} s",
          flush=True)
    su.eq(outcomes, ["complete"] * MAX_SEQS, "the streams in flight at SIGTERM")
    if not refused:
        raise AssertionError(f"a request sent after SIGTERM got {late}, expected 503 or a refused connection")
    su.eq(code, 0, "the exit status after SIGTERM (None: still running 10 s later)")


def main():
    t0 = time.monotonic()
    with server:
        status = su.run_cases([warm_up_and_count_threads, random_arrivals, burst_overflows_the_queue,
                               idle_again_and_no_leaked_threads, sigterm_finishes_what_is_in_flight], server)
    watchdog.cancel()
    print(f"soak: {time.monotonic() - t0:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
