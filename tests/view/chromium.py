"""A headless Chromium driven over the Chrome DevTools Protocol, for the viewer's browser tests.

The protocol runs over a pipe (``--remote-debugging-pipe``: the browser reads commands on fd 3 and writes on fd 4,
each message JSON ended by a NUL byte), so no websocket library and no port are needed. ``Browser.open(url)``
gives a ``Page`` attached with a flat session; it records console errors, uncaught exceptions, dialogs (an
``alert``) and every network request, which the tests check.

Debian's ``chromium`` package (``.ci/run`` installs it); ``find_chromium`` is None without it and the tests skip.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
SKIP_REASON = "no headless Chromium (Debian: apt-get install chromium; .ci/run installs it)"


def find_chromium() -> str | None:
    """The browser's executable: ``$CHROMIUM`` or the first of ``NAMES`` on the path."""
    given = os.environ.get("CHROMIUM")
    if given:
        return given
    return next((path for path in map(shutil.which, NAMES) if path), None)


class ProtocolError(RuntimeError):
    pass


class Browser:
    """One headless browser process (a context manager: closed, and its profile removed, on exit)."""

    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = ["--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--window-size=1400,1000", f"--user-data-dir={self.profile}", "about:blank"]
        # bash puts the two pipe ends on fds 3 and 4, where --remote-debugging-pipe expects them (dash takes one-digit
        # fds only)
        self.proc = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}',
                                      executable, *args], pass_fds=(to_browser_r, from_browser_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self._events: queue.Queue[dict] = queue.Queue()
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.pages: list[Page] = []

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._replies[-1] = {"closed": True}
                    self._lock.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._lock:
                        self._replies[message["id"]] = message
                        self._lock.notify_all()
                else:
                    for page in self.pages:
                        if message.get("sessionId") == page.session:
                            page.events.append(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """One command; its result (``ProtocolError`` on an error reply, ``TimeoutError`` without one)."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while ident not in self._replies:
                if -1 in self._replies:
                    raise ProtocolError(f"{method}: the browser closed the pipe")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{method}: no reply in {self.timeout} s")
                self._lock.wait(left)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str) -> Page:
        """A new tab at ``url``, loaded (its load event fired)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self.pages.append(page)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        page.send("Page.navigate", {"url": url})
        page.wait_for("Page.loadEventFired")
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (ProtocolError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: commands in its session, and the events the browser sent about it."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def wait_for(self, method: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        seen = 0
        while time.monotonic() < deadline:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            time.sleep(0.02)
        raise TimeoutError(f"no {method} in {timeout or self.browser.timeout} s")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (``ProtocolError`` if it throws)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads, as text."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", ""))
        return out

    def dialogs(self) -> list[str]:
        """Every dialog the page opened (``alert``, ``confirm``...): their messages."""
        return [e["params"].get("message", "") for e in self.events
                if e.get("method") == "Page.javascriptDialogOpening"]

    def requests(self) -> list[str]:
        """The URL of every request the page made."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]
