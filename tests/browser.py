"""A headless Chromium driven over the Chrome DevTools Protocol (the websockets client from PyPI;
the browser from the system: Debian's `chromium`, or $REVOLTA_CHROMIUM)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect


def chromium_binary() -> str | None:
    if os.environ.get("REVOLTA_CHROMIUM"):
        return os.environ["REVOLTA_CHROMIUM"]
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def headless():
    """For a module fixture (`yield from`): a Browser on the system's Chromium, closed after; the
    test fails, naming what to install, when there is none."""
    import pytest

    binary = chromium_binary()
    if binary is None:
        pytest.fail("the playground tests drive Chromium: install it (Debian: apt-get install chromium) or set "
                    "REVOLTA_CHROMIUM to a Chrome/Chromium binary")
    b = Browser(binary)
    yield b
    b.close()


class Browser:
    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="revolta-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "--window-size=1280,800", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"{binary} did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page")
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None))
        self.ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params):
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait(lambda: self.eval("document.readyState") == "complete")

    def wait(self, ok, timeout: float = 60.0, what: str = "condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = ok()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        if hasattr(self, "stack"):
            self.stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
