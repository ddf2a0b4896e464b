"""Open a report page in headless Chromium and read it back: console errors, values from the DOM, a screenshot.

Standard library only: Chromium is started with ``--remote-debugging-pipe`` and driven through the Chrome DevTools
Protocol over that pipe (JSON messages ended by a NUL byte; the browser reads commands on its fd 3 and writes on
its fd 4). The flags keep it off the network (no background networking, component updates or sync), so a page that
loads here loads from a file or a CI artifact.

Command line (the report screenshot in docs/)::

    python -m tests.support.browser results/<run>/report.html --screenshot docs/report-screenshot.png

Chromium: Debian's ``chromium`` package (``apt-get install -y chromium``), or ``$DRAFTBENCH_CHROMIUM``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars")


class BrowserError(RuntimeError):
    """Chromium could not be started, stopped answering, or a DevTools command failed."""


def find_chromium() -> str | None:
    """``$DRAFTBENCH_CHROMIUM``, else the first of chromium / chromium-browser / google-chrome on PATH."""
    env = os.environ.get("DRAFTBENCH_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless Chromium driven over the DevTools pipe; use as a context manager.

    ``open(url)`` navigates a new tab, waits for the load event and records console errors and uncaught
    exceptions in ``errors``; ``evaluate(expression)`` returns a JavaScript value; ``screenshot(path)`` saves a PNG.
    """

    def __init__(self, executable: str | None = None, timeout: float = 60.0, width: int = 1280, height: int = 900):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("no Chromium found (apt-get install -y chromium, or set $DRAFTBENCH_CHROMIUM)")
        self.timeout, self.width, self.height = timeout, width, height
        self.errors: list[str] = []
        self._id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self.session: str | None = None

    # ---- process and pipe ---------------------------------------------------------------------------------------
    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="draftbench-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds():  # the browser reads commands on fd 3 and writes answers on fd 4
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        cmd = [self.executable, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
               f"--window-size={self.width},{self.height}", "about:blank"]
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     preexec_fn=child_fds, pass_fds=(3, 4), close_fds=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self._send("Browser.close", session=False, wait=False)
                self.proc.wait(timeout=10)
        except (BrowserError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()
            self._profile.cleanup()

    def _stderr_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-1500:]

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium closed the DevTools pipe; its output:\n{self._stderr_tail()}")
                self._buffer += chunk
            elif self.proc.poll() is not None:
                raise BrowserError(f"Chromium exited ({self.proc.returncode}); its output:\n{self._stderr_tail()}")
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _send(self, method: str, params: dict[str, Any] | None = None, session: bool = True,
              wait: bool = True) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        if not wait:
            return {}
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._on_event(reply)

    def _on_event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        self._events.append(event)

    # ---- page ---------------------------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Open ``url`` in a new tab and wait for its load event (plus a short settle for late console output)."""
        target = self._send("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self._send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True},
                                  session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self._send(f"{domain}.enable")
        self._send("Emulation.setDeviceMetricsOverride",
                   {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        self._events.clear()
        nav = self._send("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise BrowserError(f"cannot open {url}: {nav['errorText']}")
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._on_event(self._read_message(deadline))
        self.evaluate("new Promise(r => setTimeout(r, 200))", await_promise=True)

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        """The value of a JavaScript expression in the open page (JSON-serialisable values)."""
        result = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                 "awaitPromise": await_promise})
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluating {expression[:60]!r}: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: str | Path, full_page: bool = False, max_height: int = 4000) -> Path:
        """Save a PNG of the viewport (or of the page up to ``max_height`` pixels with ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = min(int(self.evaluate("document.documentElement.scrollHeight")), max_height)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": height, "scale": 1})
        data = self._send("Page.captureScreenshot", params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.browser", description=__doc__.split("\n\n")[0])
    p.add_argument("page", help="an HTML file (e.g. results/<run>/report.html)")
    p.add_argument("--screenshot", help="write a PNG here")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--full-page", action="store_true")
    args = p.parse_args(argv)
    with Browser(width=args.width, height=args.height) as b:
        b.open(Path(args.page).resolve().as_uri())
        if args.screenshot:
            print(b.screenshot(args.screenshot, full_page=args.full_page))
        for e in b.errors:
            print(f"console error: {e}", file=sys.stderr)
    return 1 if b.errors else 0


if __name__ == "__main__":
    sys.exit(main())
