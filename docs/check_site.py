"""Open the built documentation site in headless Chromium, as a reader would, and check that it renders.

    python docs/check_site.py SCREENSHOT_FOLDER [--site docs/_build/html] [--chromium /usr/bin/chromium]

Renders the index, a user-guide page with equations, the API page of ``TGPRegressor`` and a gallery example,
and fails (exit status 1, each problem on stderr) when a page logs a console error, throws, fails to load a
resource, shows an image that did not load, leaves its equations unrendered or lacks its expected heading.
A PNG screenshot of each page is written to SCREENSHOT_FOLDER (the gallery example twice: its top and its first
figure).

Needs Chromium (Debian: ``apt-get install chromium``) and nothing else: the browser is driven through the
DevTools protocol over a pipe (``--remote-debugging-pipe``), with the standard library. The site is opened
from disk (``file://``) with networking disabled, so a page that needs the network to render fails here.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (page, file name of its screenshot, text its first heading must contain, whether it has equations)
PAGES = (
    ("index.html", "index.png", "flowgp", False),
    ("guide/tgp.html", "guide-tgp.png", "Transformed GPs", True),
    ("api/generated/flowgp.TGPRegressor.html", "api-TGPRegressor.png", "TGPRegressor", False),
    ("auto_examples/plot_01_tanh_sine.html", "gallery-tanh-sine.png", "Fig. 4", False),
)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-pipe",
         "--hide-scrollbars", "--mute-audio"]


class Browser:
    """Chromium driven over the DevTools pipe: fd 3 carries commands in, fd 4 results and events out, each
    message JSON ended by a NUL byte."""

    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="flowgp-check-site-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the child's ends, moved to fds >= 10 so that bash's "3<&r 4>&w" cannot clobber one with the other (dash takes one-digit fds only)
        child_r, child_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        command = [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        self.process = subprocess.Popen([shutil.which("bash") or "/bin/bash", "-c", f'exec "$0" "$@" 3<&{child_r} 4>&{child_w}', *command],
                                        pass_fds=(child_r, child_w), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        os.close(child_r)
        os.close(child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.page_id = None  # the DevTools id of the attached page

    def send(self, method: str, params: dict | None = None, to_page: bool = True, timeout: float = 60.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if to_page and self.page_id:
            message["sessionId"] = self.page_id
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"no answer to {method} within {timeout} s")

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("the browser stopped answering")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("the browser closed the connection (did it crash?)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close", to_page=False, timeout=5)
        except Exception:  # noqa: BLE001 - closing is best effort; the process is killed below anyway
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def problems_in(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and failed loads among the DevTools events."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            found.append("uncaught exception: " + str(details.get("exception", {}).get("description")
                                                      or details.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            found.append(f"browser log error: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"failed to load a resource: {params.get('errorText')}")
    return found


def check_page(browser: Browser, site: Path, page: str, shot: Path, heading: str, has_math: bool) -> list[str]:
    browser.events.clear()
    url = (site / page).resolve().as_uri()
    browser.send("Page.navigate", {"url": url})
    browser.wait_for("Page.loadEventFired")
    problems = []
    if has_math:
        rendered = browser.evaluate(
            "new Promise(done => { const t0 = Date.now(); (function poll() {"
            " const ok = window.MathJax && MathJax.startup && MathJax.startup.promise;"
            " if (ok) { MathJax.startup.promise.then(() => done(document.querySelectorAll('mjx-container').length)); }"
            " else if (Date.now() - t0 > 20000) { done(-1); } else { setTimeout(poll, 100); } })(); })")
        if not rendered or rendered < 1:
            problems.append(f"equations not rendered (MathJax containers: {rendered})")
    browser.evaluate("new Promise(done => setTimeout(done, 500))")  # late resources and fonts
    images = browser.evaluate("Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
    for src, complete, width in images:
        if not complete or not width:
            problems.append(f"image did not load: {src}")
    title = browser.evaluate("(document.querySelector('h1') || {}).textContent || ''")
    if heading not in title:
        problems.append(f"first heading {title.strip()!r} does not contain {heading!r}")
    browser.screenshot(shot)
    if "auto_examples" in page:
        figures = [src for src, _c, width in images if "sphx_glr_plot" in (src or "") and width]
        if not figures:
            problems.append("the example shows no figure")
        else:
            browser.evaluate("document.querySelector('img.sphx-glr-single-img, img.sphx-glr-multi-img')"
                             ".scrollIntoView({block: 'center'})")
            browser.evaluate("new Promise(done => setTimeout(done, 300))")
            browser.screenshot(shot.with_name(shot.stem + "-figure.png"))
    problems += problems_in(browser.events)
    return [f"{page}: {p}" for p in problems]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("screenshots", help="folder for the PNG screenshots (created if missing)")
    parser.add_argument("--site", default=str(ROOT / "docs" / "_build" / "html"), help="the built site")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium",
                        help="the Chromium executable")
    args = parser.parse_args(argv)
    site, out = Path(args.site), Path(args.screenshots)
    missing = [page for page, *_ in PAGES if not (site / page).is_file()]
    if missing:
        print(f"check_site: {site} lacks {', '.join(missing)}; build the site first "
              "(sphinx-build -W --keep-going -n -b html docs docs/_build/html)", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"check_site: no Chromium at {args.chromium} (apt-get install chromium, or --chromium PATH)",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    browser = Browser(args.chromium)
    problems = []
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"}, to_page=False)["targetId"]
        browser.page_id = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                       to_page=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable")
        browser.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1,
                                                            "mobile": False})
        for page, shot, heading, has_math in PAGES:
            found = check_page(browser, site, page, out / shot, heading, has_math)
            problems += found
            print(f"{'FAIL' if found else 'ok  '} {page} -> {out / shot}")
    finally:
        browser.close()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
