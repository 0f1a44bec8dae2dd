#!/usr/bin/env python3
"""The serving page (GET /) in a real browser: headless Chromium driven by Selenium, against ch13_serve
on a loopback port. The page loads with no console errors; a chat request streams its text into the
page piece by piece, and the text is what the same request gets without streaming; the KV block view
changes while requests run (parallel samples, several requests at once) and is empty again when they
end; a model without a chat template is served through /v1/completions. A screenshot of the page at
work is saved (--screenshot). Skips, saying why, where Chromium, its driver or Selenium is missing."""

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_util as su  # noqa: E402

SETUP = "tools/setup.sh installs Debian's chromium, chromium-driver and python3-selenium"


def import_selenium():
    """Selenium from this Python, or else from the system's (Debian's python3-selenium lives there)."""
    try:
        import selenium  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
            and "INFERLAB_SYSTEM_PYTHON" not in os.environ:
        os.environ["INFERLAB_SYSTEM_PYTHON"] = "1"
        os.execv(system, [system, *sys.argv])
    su.skip(f"no Selenium for Python ({SETUP})")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True, help="the ch13_serve executable")
    p.add_argument("--model", default=os.path.join(su.ROOT, "data", "models", su.MODEL_NAME))
    p.add_argument("--screenshot", default="ch13_serving_page.png", help="where the screenshot of the page goes")
    return p.parse_args()


args = parse_args()
import_selenium()
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

BROWSER = next((b for b in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if b), None)
DRIVER = shutil.which("chromedriver") or next((p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
                                               if os.path.exists(p)), None)
if BROWSER is None or DRIVER is None:
    su.skip(f"no {'Chromium' if BROWSER is None else 'chromedriver'} ({SETUP})")

watchdog = su.Watchdog(140)
# A small pool (64 blocks), so that a few requests fill a good part of it; a step budget that cuts
# prompts into chunks.
SERVER_ARGS = ("--kv-budget", "4", "--max-num-seqs", "8", "--max-batched-tokens", "64")
chat_server = su.Server(args.server, args.model, *SERVER_ARGS, "--chat-template", os.path.join(HERE, "chatml.jinja"))
plain_server = su.Server(args.server, args.model, *SERVER_ARGS)


def start_browser():
    o = webdriver.ChromeOptions()
    o.binary_location = BROWSER
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1440,1000",
              "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
              "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
              "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
              f"--user-data-dir={tempfile.mkdtemp(prefix='ch13-page-')}"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        d = webdriver.Chrome(service=Service(executable_path=DRIVER), options=o)
    except WebDriverException as e:
        su.skip(f"Chromium did not start here: {str(e).splitlines()[0]}")
    d.set_page_load_timeout(30)
    d.set_script_timeout(30)
    return d


def wait_for(what, check, seconds=20, every=0.05):
    """Polls check() until it returns something true; returns it, or fails naming `what`."""
    until = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(every)


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def page(driver):
    """The page's own account of itself (window.inferlabPage), as plain data."""
    return driver.execute_script(
        "const s = window.inferlabPage; return s && {events: s.events, connected: s.connected, info: s.info, "
        "usedNow: s.usedNow, maxUsed: s.maxUsed, mapsSeen: s.mapsSeen, cells: s.cells, "
        "batch: document.querySelectorAll('#batch tbody td .req').length, "
        "requests: s.requests.map((r) => ({id: r.id, chunks: r.chunks, texts: r.texts, finish: r.finish, error: r.error}))};")


def open_page(driver, server):
    driver.get(server.url + "/")
    return wait_for("the page to load and the engine's first event",
                    lambda: (p := page(driver)) and p["info"] and p["events"] >= 1 and p["cells"] and p)


def fill(driver, **fields):
    for name, value in fields.items():
        e = driver.find_element(By.ID, name.replace("_", "-"))
        e.clear()
        if value != "":
            e.send_keys(str(value))


def send_and_wait(driver, count, seconds=60):
    """Clicks Send; waits until the page has `count` requests in all, every one ended."""
    driver.find_element(By.ID, "send").click()
    return wait_for("the requests to end", lambda: (p := page(driver)) and len(p["requests"]) == count and all(
        all(f is not None for f in r["finish"]) or r["error"] for r in p["requests"]) and p, seconds)


# A MutationObserver on the chat: every change of its text, with the time, while requests stream.
WATCH_TEXT = """
window.textSeen = [];
new MutationObserver(() => window.textSeen.push([performance.now(), document.getElementById('log').textContent.length]))
  .observe(document.getElementById('log'), {subtree: true, characterData: true, childList: true});
"""


def the_page_loads_with_no_console_errors(driver):
    p = open_page(driver, chat_server)
    su.eq(p["info"]["model"], su.MODEL_NAME, "the model the page names")
    su.eq(p["info"]["chat_template"], True, "whether the page chats")
    su.eq(len(p["cells"]), 64, "the blocks the page draws")
    su.eq(set(p["cells"]), {"."}, "the block states of an idle server")
    su.eq(p["usedNow"], 0, "blocks used")
    if not driver.find_element(By.ID, "kv-grid").is_displayed():
        raise AssertionError("the block view is not shown")
    su.eq(console_errors(driver), [], "console errors after loading")


def a_chat_request_streams_visible_tokens(driver):
    question = "Tell me a story about a dog."
    body = {"model": su.MODEL_NAME, "messages": [{"role": "user", "content": question}], "max_tokens": 400,
            "temperature": 0.8, "seed": 11}
    # The prompt is asked once first, so that the page's request and the plain one after it both
    # find it in the prefix cache: a prompt computed whole and one resumed from cached blocks go
    # through the model in batches of other shapes, and sampled text may differ in the last bits.
    status, _, _, raw = chat_server.post_json("/v1/chat/completions", dict(body, max_tokens=1))
    su.eq(status, 200, f"the first request's status ({raw[:200]!r})")
    driver.execute_script(WATCH_TEXT)
    fill(driver, prompt=question, max_tokens=400, temperature=0.8, seed=11, samples=1, copies=1)
    p = send_and_wait(driver, 1)
    r = p["requests"][0]
    if r["error"]:
        raise AssertionError(f"the page's request failed: {r['error']}")
    streamed = r["texts"][0]
    if not streamed:
        raise AssertionError("the answer is empty")
    bubble = driver.find_elements(By.CSS_SELECTOR, ".turn.assistant .bubble")[-1]
    if not bubble.is_displayed():
        raise AssertionError("the answer is not shown")
    su.eq(bubble.get_attribute("textContent"), streamed, "the text shown")
    su.eq(int(bubble.get_attribute("data-chunks")), r["chunks"], "the pieces the bubble took")
    if r["chunks"] < 3:
        raise AssertionError(f"the answer came in {r['chunks']} pieces: not streamed")
    seen = driver.execute_script("return window.textSeen;")
    lengths = sorted({n for _, n in seen})
    if len(lengths) < 4:
        raise AssertionError(f"the chat's text took {len(lengths)} lengths as it came: it did not grow piece by piece")
    # The same request, not streamed, through Python: the text the page showed is the answer.
    status, _, answer, raw = chat_server.post_json("/v1/chat/completions", body)
    su.eq(status, 200, f"the plain request's status ({raw[:200]!r})")
    su.eq(streamed, answer["choices"][0]["message"]["content"], "the streamed text against the plain answer")
    su.eq(r["finish"][0], answer["choices"][0]["finish_reason"], "the finish reason")
    su.eq(console_errors(driver), [], "console errors after a chat")


def the_block_view_follows_the_requests(driver):
    # 4 requests at once, 2 samples each: the prefix cache shares their prompt, the samples fork
    # it (copy-on-write), and together they may need more blocks than the pool has. (On the page
    # of the model without a chat template: stories read better in the screenshot.)
    fill(driver, prompt=su.PROMPT, max_tokens=400, temperature=0.9, seed="", samples=2, copies=4)
    before = len(page(driver)["requests"])
    maps_before = page(driver)["mapsSeen"]
    driver.find_element(By.ID, "send").click()
    states, shot, most = set(), False, 0
    until = time.monotonic() + 60
    while time.monotonic() < until:
        p = page(driver)
        mine = p["requests"][before:]
        states |= set(p["cells"])
        most = max(most, p["usedNow"] or 0)
        if not shot and p["usedNow"] >= 32 and p["batch"] >= 3:
            driver.save_screenshot(args.screenshot)
            shot = True
        if len(mine) == 4 and all(all(f is not None for f in r["finish"]) or r["error"] for r in mine):
            break
        time.sleep(0.03)
    else:
        raise AssertionError("the 4 requests did not end within 60 s")
    errors = [r["error"] for r in mine if r["error"]]
    if errors:
        raise AssertionError(f"requests failed: {errors}")
    if most == 0 or not states & set("upsw"):
        raise AssertionError(f"the block view never showed a used block (states seen: {sorted(states)})")
    if page(driver)["mapsSeen"] - maps_before < 3:
        raise AssertionError("the block view hardly changed while the requests ran")
    if not shot:
        print(f"note: the screenshot was taken after the requests (the most blocks used at once: {most})", flush=True)
        driver.save_screenshot(args.screenshot)
    p = wait_for("the block view to be empty again", lambda: (p := page(driver)) and p["usedNow"] == 0
                 and not set(p["cells"]) & set("upsw") and p, 10)
    grid = driver.find_element(By.ID, "kv-grid")
    su.eq(grid.get_attribute("data-used"), "0", "the used blocks the grid was drawn with")
    print(f"     blocks used at most {most} of 64; block states seen {''.join(sorted(states))}; "
          f"{p['events']} engine events", flush=True)
    su.eq(console_errors(driver), [], "console errors after the requests")


def a_model_without_a_chat_template_gets_completions(driver):
    p = open_page(driver, plain_server)
    su.eq(p["info"]["chat_template"], False, "whether the page chats")
    note = driver.find_element(By.ID, "mode-note").text
    if "no chat template" not in note:
        raise AssertionError(f"the page does not say why it completes: {note!r}")
    body = {"model": su.MODEL_NAME, "prompt": su.PROMPT, "max_tokens": 24, "temperature": 0}
    status, _, _, raw = plain_server.post_json("/v1/completions", dict(body, max_tokens=1))  # as in the chat case
    su.eq(status, 200, f"the first request's status ({raw[:200]!r})")
    fill(driver, prompt=su.PROMPT, max_tokens=24, temperature=0, seed="", samples=1, copies=1)
    r = send_and_wait(driver, 1)["requests"][0]
    status, _, answer, raw = plain_server.post_json("/v1/completions", body)
    su.eq(status, 200, f"the plain request's status ({raw[:200]!r})")
    su.eq(r["texts"][0], answer["choices"][0]["text"], "the streamed completion against the plain one")
    su.eq(console_errors(driver), [], "console errors")


def bound(case, driver):
    def run():
        case(driver)
    run.__name__ = case.__name__
    return run


def main():
    chat_server.start()
    plain_server.start()
    driver = start_browser()
    try:
        cases = [the_page_loads_with_no_console_errors, a_chat_request_streams_visible_tokens,
                 a_model_without_a_chat_template_gets_completions, the_block_view_follows_the_requests]
        status = su.run_cases([bound(c, driver) for c in cases], chat_server, plain_server)
    finally:
        driver.quit()
        chat_server.kill()
        plain_server.kill()
    if os.path.exists(args.screenshot):
        print(f"screenshot: {os.path.abspath(args.screenshot)}", flush=True)
    watchdog.cancel()
    return status


if __name__ == "__main__":
    sys.exit(main())
