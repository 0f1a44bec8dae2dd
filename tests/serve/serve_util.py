"""Shared pieces of the chapter 13 server's client tests (tests/serve).

Each test program starts its own ch13_serve on 127.0.0.1 with --port 0, reads the URL the server
prints, talks to it, and kills it at the end whatever happened. Nothing here waits without a
timeout, and a watchdog ends the whole program (server included) before ctest's own TIMEOUT would.
"""

import argparse
import ctypes
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
URL_RE = re.compile(r"http://[0-9.]+:[0-9]+")
MODEL_NAME = "tiny-mha"
CONTEXT = 512  # tiny-mha's max_position_embeddings
# A prompt from the corpus the bundled models were trained on, so that greedy runs say something.
PROMPT = "Once upon a time there were 2 friends: Nina and Jack. Nina painted her doll grey. Jack named his duck"


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--server", required=True, help="the ch13_serve executable")
    p.add_argument("--model", default=os.path.join(ROOT, "data", "models", MODEL_NAME))
    return p.parse_args()


def skip(why):
    print(f"SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


try:
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl  # loaded here: the forked child only calls it
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent():
    """Run in the server's child process: it gets SIGKILL if the test program dies first (ctest's timeout)."""
    if _prctl is not None:
        _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class Server:
    """One ch13_serve process. Use as a context manager: it is killed on the way out."""

    live = []  # every server started, for the watchdog

    def __init__(self, binary, model, *args, start_timeout=60):
        self.cmd = [binary, "--model", model, "--host", "127.0.0.1", "--port", "0", *args]
        self.start_timeout = start_timeout
        self.proc = None
        self.url = None
        self.stdout = []
        self.stderr = []
        self._url_seen = threading.Event()

    def _drain(self, stream, lines, look_for_url):
        for line in iter(stream.readline, ""):
            lines.append(line.rstrip("\n"))
            if look_for_url and self.url is None:
                m = URL_RE.search(line)
                if m:
                    self.url = m.group(0)
                    self._url_seen.set()
        stream.close()
        self._url_seen.set()  # the process closed its output: stop waiting

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, preexec_fn=_die_with_parent)
        Server.live.append(self)
        for stream, lines, url in ((self.proc.stdout, self.stdout, True), (self.proc.stderr, self.stderr, False)):
            threading.Thread(target=self._drain, args=(stream, lines, url), daemon=True).start()
        self._url_seen.wait(self.start_timeout)
        if self.url is None:
            self.kill()
            raise RuntimeError(f"the server printed no URL within {self.start_timeout} s: {' '.join(self.cmd)}\n"
                               + self.log())
        parsed = urllib.parse.urlparse(self.url)
        self.host, self.port = parsed.hostname, parsed.port
        return self

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.running():
            self.proc.kill()
            self.proc.wait(10)

    def log(self, last=30):
        out = "\n".join(self.stdout[-last:])
        err = "\n".join(self.stderr[-last:])
        return f"--- server stdout (last lines) ---\n{out}\n--- server stderr (last lines) ---\n{err}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()
        return False

    # --- HTTP ----------------------------------------------------------------------------------

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """One request on a fresh connection: (status, headers as a dict with lower-case keys, body bytes).
        A dict or list body is sent as JSON; bytes or str are sent as they are."""
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c = self.conn(timeout)
        try:
            c.request(method, path, body=body, headers=hdrs)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def get_json(self, path, timeout=30):
        status, _, data = self.request("GET", path, timeout=timeout)
        if status != 200:
            raise AssertionError(f"GET {path}: status {status}: {data[:300]!r}")
        return json.loads(data)

    def post_json(self, path, body, timeout=60):
        status, headers, data = self.request("POST", path, body, timeout=timeout)
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return status, headers, parsed, data

    def metrics(self, timeout=30):
        status, _, data = self.request("GET", "/metrics", timeout=timeout)
        if status != 200:
            raise AssertionError(f"GET /metrics: status {status}")
        return parse_metrics(data.decode())


def parse_metrics(text):
    """Prometheus text format: {'name{labels}': value} for every sample line."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        samples[key.strip()] = float(value)
    return samples


def read_sse(response, on_event=None):
    """Reads the `data: ...` events of a streamed response until [DONE] or the end of the body.
    Returns (payloads parsed from JSON, whether [DONE] came). on_event(count) returning False stops early."""
    payloads, done = [], False
    while True:
        line = response.readline()
        if not line:
            break
        line = line.rstrip(b"\r\n")
        if not line:
            continue
        if not line.startswith(b"data: "):
            raise AssertionError(f"a stream line that is not an event: {line[:200]!r}")
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            done = True
            break
        payloads.append(json.loads(data))
        if on_event is not None and on_event(len(payloads)) is False:
            break
    return payloads, done


def sanitized(pid):
    """Whether the process runs under AddressSanitizer, whose quarantine keeps freed memory (up to
    256 MB by default): its resident memory says nothing of what the server itself holds."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any("libasan" in line for line in f)
    except OSError:
        return False


def stream_outcome(server, path, body, on_first):
    """One streamed request of one choice, read to its end: "complete" when it ended with [DONE]
    and one finish_reason, else what happened. on_first() is called once: at the first event, or
    as soon as it is clear none will come."""
    conn = server.conn(timeout=60)
    first = [True]

    def first_event(_count=None):
        if first[0]:
            first[0] = False
            on_first()

    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return f"status {r.status}"
        payloads, done = read_sse(r, first_event)
        reasons = [c["finish_reason"] for p in payloads for c in p.get("choices", []) if c.get("finish_reason")]
        return "complete" if done and len(reasons) == 1 else f"incomplete (done={done}, {reasons})"
    except Exception as e:  # noqa: BLE001 - the outcome is the finding
        return f"{type(e).__name__}: {e}"
    finally:
        first_event()
        conn.close()


class Watchdog:
    """Kills every server and ends the program with a failure after `seconds`."""

    def __init__(self, seconds):
        self.timer = threading.Timer(seconds, self._fire, args=(seconds,))
        self.timer.daemon = True
        self.timer.start()

    @staticmethod
    def _fire(seconds):
        print(f"FAILED: the test ran past its own limit of {seconds} s; killing the server", flush=True)
        for s in Server.live:
            try:
                s.kill()
                print(s.log(), flush=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        os._exit(1)

    def cancel(self):
        self.timer.cancel()


def run_cases(cases, *servers):
    """Runs each case (a function), printing one line per case and the server logs on failure.
    Returns the process exit status: 0 when every case passed."""
    passed, failed = 0, 0
    for case in cases:
        t0 = time.monotonic()
        try:
            case()
        except Exception:  # noqa: BLE001 - every failure is reported, then the next case runs
            failed += 1
            print(f"FAIL {case.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print(f"ok   {case.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
    if failed:
        for s in servers:
            print(s.log(), flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


def eq(actual, expected, what):
    if actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")
