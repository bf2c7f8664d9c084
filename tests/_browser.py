"""A headless Chromium driven over the DevTools protocol, standard library only.

Chromium started with `--remote-debugging-pipe` reads protocol messages
(JSON, each ended by a NUL byte) on its file descriptor 3 and writes replies
and events on 4: no WebSocket client and no browser-driver package needed.
`Browser.evaluate` runs JavaScript in the page and returns its value;
`Browser.screenshot` writes a PNG of what a reader sees.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["FLAGS", "Browser", "find_chromium", "page_urls"]

# Quiet, self-contained, no network besides the page's own server.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def find_chromium() -> Optional[str]:
    """The path of a Chromium or Chrome on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome",
                 "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page (a 1280 x 900 window)."""

    def __init__(self, executable: str, width: int = 1280,
                 height: int = 900) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: the pipes become fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self._process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            preexec_fn=wire, pass_fds=(3, 4),  # kept after `wire` ran
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self._call("Target.createTarget", {"url": "about:blank"})
        self._session = self._call("Target.attachToTarget", {
            "targetId": target["targetId"], "flatten": True})["sessionId"]
        self._call("Page.enable", session=True)
        self._call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1,
            "mobile": False}, session=True)

    def _read_message(self) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _call(self, method: str, params: Optional[Dict[str, Any]] = None,
              session: bool = False) -> Dict[str, Any]:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        """Loads `url` and waits until the document has loaded."""
        self._call("Page.navigate", {"url": url}, session=True)
        self.wait_for("document.readyState === 'complete' && "
                      f"location.href === {json.dumps(url)}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises are awaited)."""
        result = self._call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True,
            "awaitPromise": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: "
                               f"{result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Polls `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still falsy after {timeout} s: "
                                   f"{expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        """Writes a PNG of the window (or of the whole page) to `path`."""
        params: Dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, "
                                 "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": size[0], "height": size[1],
                "scale": 1})
        data = self._call("Page.captureScreenshot", params, session=True)
        Path(path).write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def page_urls(site: Path, base_url: str) -> List[str]:
    """The URL of every page mkdocs built (each folder's index.html)."""
    urls = []
    for index in sorted(site.glob("**/index.html")):
        relative = index.parent.relative_to(site).as_posix()
        if relative.startswith(("assets", "search")) or relative == "404":
            continue
        urls.append(base_url + ("" if relative == "." else relative + "/"))
    return urls
