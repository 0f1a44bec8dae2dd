#!/usr/bin/env python3
"""ch13_serve's HTTP front against the inputs that used to break it (docs/reliability.md).

Each case sends what a hostile or careless client sent and checks the answer and the server's
resident memory: a chunked body of 100 MB, 2,000,000 headers, request lines of 10 MB, bodies of
8 MB of '[' from four clients at once, a thousand idle connections and 300 slow senders beside a
client that must be served, non-streamed requests whose clients hang up, SIGHUP during 16 streams,
and the lines of the access log. About half a minute in all.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util as su  # noqa: E402

args = su.parse_args(__doc__)
watchdog = su.Watchdog(150)
HEADER_TIMEOUT = 2
server = su.Server(args.server, args.model, "--max-num-seqs", "16", "--max-waiting", "16", "--threads", "1",
                   "--header-timeout", str(HEADER_TIMEOUT), "--drain-timeout", "30")
MIB = 1 << 20


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def connect(port=None, timeout=30):
    s = socket.create_connection((server.host, port or server.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s, limit=1 << 20, timeout=30):
    """What the server sends until it closes (or `limit` bytes, or the timeout)."""
    s.settimeout(timeout)
    out = b""
    try:
        while len(out) < limit:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def status_of(response):
    return int(response[9:12]) if response.startswith(b"HTTP/1.1 ") else 0


def send_while_reading(head, body_chunks):
    """Sends head and then each chunk while a thread reads the answer; returns (answer, seconds to
    the first byte of it, bytes sent)."""
    s = connect()
    got, first = [b""], [None]
    t0 = time.monotonic()

    def reader():
        s.settimeout(60)
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                if first[0] is None:
                    first[0] = time.monotonic() - t0
                got[0] += b
        except OSError:
            pass

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    sent = 0
    try:
        s.sendall(head)
        for c in body_chunks:
            if got[0]:
                break
            s.sendall(c)
            sent += len(c)
    except OSError:  # the server closed after its answer
        pass
    th.join(30)
    s.close()
    return got[0], first[0], sent


def memory_flat(what, grew_mib, limit_mib):
    print(f"     {what}: resident memory {grew_mib:+.1f} MiB", flush=True)
    if su.sanitized(server.pid):
        print("     (not checked: AddressSanitizer keeps freed memory in its quarantine)", flush=True)
        return
    if grew_mib > limit_mib:
        raise AssertionError(f"{what}: the server's resident memory grew {grew_mib:.1f} MiB (at most {limit_mib})")


def chunked_100mb_is_413_at_the_limit():
    before = rss_mib(server.pid)
    chunk = b"%x\r\n" % MIB + b"a" * MIB + b"\r\n"
    answer, first, sent = send_while_reading(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        (chunk for _ in range(100)))
    su.eq(status_of(answer), 413, f"a 100 MB chunked body ({answer[:120]!r})")
    print(f"     413 after {first:.2f} s and {sent / MIB:.0f} MiB sent", flush=True)
    if sent > 40 * MIB:
        raise AssertionError(f"the 413 came after {sent / MIB:.0f} MiB: the body was read past the 8 MiB limit")
    memory_flat("a 100 MB chunked body", rss_mib(server.pid) - before, 24)


def header_flood_is_431():
    before = rss_mib(server.pid)
    flood = b"X-Flood: 1234567890\r\n" * 2_000_000  # about 42 MB of headers
    answer, _, sent = send_while_reading(b"GET /health HTTP/1.1\r\nHost: x\r\n",
                                         (flood[i:i + MIB] for i in range(0, len(flood), MIB)))
    su.eq(status_of(answer), 431, f"2,000,000 headers ({answer[:120]!r})")
    memory_flat(f"2,000,000 headers ({sent / MIB:.0f} MiB sent before the 431)", rss_mib(server.pid) - before, 8)


def long_request_lines_are_414_and_memory_flat():
    line = b"GET /" + b"a" * (10 * MIB) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    answer, _, _ = send_while_reading(b"", [line])  # the first one makes what the next ones reuse
    su.eq(status_of(answer), 414, "a 10 MB request line")
    before = rss_mib(server.pid)
    for i in range(10):
        answer, _, _ = send_while_reading(b"", [line])
        su.eq(status_of(answer), 414, f"request line {i}")
    memory_flat("10 request lines of 10 MB", rss_mib(server.pid) - before, 8)


def deep_json_from_four_clients_is_400():
    # Each used to take 560 MB while it was parsed; four at once peaked at 3.4 GB and kept 3.2 GB.
    deep_json_round()  # the buffers four requests at once make, which the next rounds reuse
    before = rss_mib(server.pid)
    for _ in range(3):
        deep_json_round()
    # Blocks of 1 MiB and more go back to the system when freed (the server's M_MMAP_THRESHOLD);
    # below that glibc keeps what each thread's arena freed, up to 8 arenas a core (16 here), each
    # holding about 1 MiB of a body's smaller buffers: a bound, reached once, not a growth.
    memory_flat("3 more rounds of 4 bodies of 8 MB of '[' at once", rss_mib(server.pid) - before, 32)


def deep_json_round():
    body = b"[" * (8 * MIB - 64)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    answers = [None] * 4

    def one(i):
        answers[i] = send_while_reading(head, [body])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for a in answers:
        su.eq(status_of(a or b""), 400, "8 MB of '['")
        if b"deeper than 64 levels" not in (a or b""):
            raise AssertionError(f"8 MB of '[': {a[:200]!r}")


def health_beside_idle_and_slow_connections():
    # 700 idle connections used to delay /health 35 s, 300 senders at a byte a second 15 s.
    idle = [connect() for _ in range(1000)]
    time.sleep(0.5)
    t0 = time.monotonic()
    status, _, _ = server.request("GET", "/health", timeout=30)
    idle_ms = (time.monotonic() - t0) * 1000
    su.eq(status, 200, "/health beside 1,000 idle connections")
    for s in idle[700:]:
        s.close()
    idle = idle[:700]
    slow = [connect() for _ in range(300)]
    for s in slow:
        s.sendall(b"G")
    time.sleep(0.5)
    t0 = time.monotonic()
    status, _, _ = server.request("GET", "/health", timeout=30)
    ms = (time.monotonic() - t0) * 1000
    su.eq(status, 200, "/health beside 700 idle and 300 slow connections")
    t0 = time.monotonic()
    status, _, parsed, _ = server.post_json("/v1/completions", {"prompt": su.PROMPT, "max_tokens": 16}, timeout=30)
    completion_ms = (time.monotonic() - t0) * 1000
    su.eq(status, 200, "a completion beside them")
    su.eq(parsed["usage"]["completion_tokens"], 16, "its tokens")
    print(f"     /health beside 1,000 idle connections {idle_ms:.1f} ms; beside 700 idle and 300 slow ones {ms:.1f} ms, "
          f"a 16-token completion {completion_ms:.0f} ms", flush=True)
    # Not a speed target (those live in benchmarks): the bug was a wait of 15-35 s behind the
    # connections, and a 2-core machine running the tests two at a time answers in a fraction of 5 s.
    if max(ms, idle_ms) > 5000:
        raise AssertionError(f"/health took {max(ms, idle_ms):.0f} ms beside idle connections: "
                             "it waited behind them")
    for s in slow:  # a byte a second: still a head that takes too long
        s.sendall(b"E")
    answers = [read_all(s, timeout=HEADER_TIMEOUT + 10) for s in slow[:20]]
    for a in answers:
        su.eq(status_of(a), 408, f"a head sent a byte at a time ({a[:120]!r})")
    for s in idle + slow:
        s.close()


def non_streamed_clients_that_leave_are_aborted():
    before = server.metrics()
    body = json.dumps({"prompt": su.PROMPT, "max_tokens": 400, "ignore_eos": True}).encode()
    conns = []
    for _ in range(15):
        s = connect()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        conns.append(s)
    end = time.monotonic() + 20
    while server.metrics()["inferlab_num_requests_running"] < 1 and time.monotonic() < end:
        time.sleep(0.02)
    for s in conns:
        s.close()
    end = time.monotonic() + 10
    while time.monotonic() < end:
        m = server.metrics()
        if m["inferlab_num_requests_running"] == 0 and m["inferlab_num_requests_waiting"] == 0 and m["inferlab_kv_blocks_used"] == 0:
            break
        time.sleep(0.05)
    su.eq((m["inferlab_num_requests_running"], m["inferlab_num_requests_waiting"], m["inferlab_kv_blocks_used"]), (0, 0, 0),
          "running, waiting and KV blocks after 15 clients hung up")
    aborted = m['inferlab_requests_finished_total{reason="abort"}'] - before['inferlab_requests_finished_total{reason="abort"}']
    su.eq(aborted, 15, "requests aborted")
    generated = m["inferlab_generation_tokens_total"] - before["inferlab_generation_tokens_total"]
    if generated >= 15 * 400:
        raise AssertionError(f"{generated:g} tokens generated: the requests ran to max_tokens")


def bad_content_length_and_seed_are_named():
    for value in (b"-5", b"abc"):
        s = connect()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n")
        a = read_all(s, timeout=10)
        s.close()
        su.eq(status_of(a), 400, f"Content-Length {value!r}")
        if b"invalid Content-Length" not in a:
            raise AssertionError(f"Content-Length {value!r}: {a[:200]!r}")
    for seed in ("9223372036854775808", "9223372036854775809", "9.223372036854775807e18"):
        status, _, parsed, raw = server.post_json("/v1/completions", json.loads(
            '{"prompt": "Once", "max_tokens": 2, "seed": %s}' % seed))
        if seed != "9.223372036854775807e18":  # json.loads keeps the big integers exact
            su.eq(status, 400, f"seed {seed}")
            su.eq(parsed["error"]["param"], "seed", f"seed {seed}")
    s = connect()
    body = b'{"prompt": "Once", "max_tokens": 2, "seed": 9.223372036854775807e18}'
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    a = read_all(s, timeout=10)
    su.eq(status_of(a), 400, "seed 9.223372036854775807e18")


def the_access_log_has_a_line_per_request():
    marker = f"/v1/models?log-check-{time.time_ns()}"
    server.request("GET", marker)
    server.request("GET", "/no-such-path")
    # Each line is written after its answer is sent: wait for both (a slow machine, or ASan, writes them late).
    def logged():
        return (any(marker in line for line in server.stderr)
                and any('"GET /no-such-path" 404 ' in line for line in server.stderr))
    end = time.monotonic() + 10
    while time.monotonic() < end and not logged():
        time.sleep(0.05)
    lines = [line for line in server.stderr if marker in line]
    su.eq(len(lines), 1, f"access-log lines for {marker}")
    if '"GET ' + marker + '" 200 ' not in lines[0]:
        raise AssertionError(f"access-log line: {lines[0]!r}")
    if not any('"GET /no-such-path" 404 ' in line and "no such endpoint" in line for line in server.stderr):
        raise AssertionError("no access-log line with the 404's reason")
    if not any('"POST /v1/completions" 200 ' in line and "prompt_tokens=" in line and "completion_tokens=16" in line
               for line in server.stderr):
        raise AssertionError("no access-log line with a completion's tokens")


def sighup_drains_every_stream():
    body = {"prompt": su.PROMPT, "max_tokens": 200, "temperature": 0.8, "stream": True, "ignore_eos": True}
    outcomes, lock, started = [], threading.Lock(), threading.Semaphore(0)

    def stream(i):
        outcome = su.stream_outcome(server, "/v1/completions", dict(body, seed=i), started.release)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    for _ in threads:
        if not started.acquire(timeout=30):
            raise AssertionError("the 16 streams did not all start within 30 s")
    server.proc.send_signal(signal.SIGHUP)
    for t in threads:
        t.join(60)
    code = server.proc.wait(timeout=30)
    su.eq(sorted(outcomes), ["complete"] * 16, "the 16 streams in flight at SIGHUP")
    su.eq(code, 0, "the exit status after SIGHUP")
    if not any("SIGHUP: no new requests; finishing the" in line for line in server.stderr):
        raise AssertionError("the server did not say it drains on SIGHUP")


def a_fractional_drain_timeout_is_printed_as_given():
    with su.Server(args.server, args.model, "--drain-timeout", "0.5") as s:
        if not any("up to 0.5 s" in line for line in s.stdout):
            raise AssertionError(f"--drain-timeout 0.5 printed as: {s.stdout!r}")
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=20)
        time.sleep(0.2)
        if not any("(up to 0.5 s)" in line for line in s.stderr):
            raise AssertionError(f"the drain line: {s.stderr!r}")


def an_ipv6_host_is_printed_as_a_url():
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError as e:
        print(f"     skipped: no IPv6 loopback here ({e})", flush=True)
        return
    cmd = [args.server, "--model", args.model, "--host", "::1", "--port", "0"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line1 = p.stdout.readline()
        line2 = p.stdout.readline()
        if "on http://[::1]:" not in line1 or "curl http://[::1]:" not in line2:
            raise AssertionError(f"--host ::1 printed: {line1!r} {line2!r}")
        port = int(line1.split("http://[::1]:")[1].split()[0])
        c = socket.create_connection(("::1", port), timeout=10)
        c.sendall(b"GET /health HTTP/1.1\r\nHost: [::1]\r\nConnection: close\r\n\r\n")
        su.eq(status_of(read_all(c, timeout=10)), 200, "/health over IPv6")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


def main():
    t0 = time.monotonic()
    with server:
        status = su.run_cases([chunked_100mb_is_413_at_the_limit, header_flood_is_431,
                               long_request_lines_are_414_and_memory_flat, deep_json_from_four_clients_is_400,
                               health_beside_idle_and_slow_connections, non_streamed_clients_that_leave_are_aborted,
                               bad_content_length_and_seed_are_named, the_access_log_has_a_line_per_request,
                               sighup_drains_every_stream], server)
    status |= su.run_cases([a_fractional_drain_timeout_is_printed_as_given, an_ipv6_host_is_printed_as_a_url])
    watchdog.cancel()
    print(f"front: {time.monotonic() - t0:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
