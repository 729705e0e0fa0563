"""A headless Chromium driven over the DevTools protocol, for tests and benchmarks of HTML pages.

Starts the system's ``chromium`` (Debian's package) with ``--headless --remote-debugging-port=0``,
reads the port it chose from ``DevToolsActivePort`` in a private profile folder, and speaks the
protocol over one websocket (aiohttp's client, already a dependency). It records what a test must
see: console errors, uncaught exceptions, log entries of level error (CSP violations among them) and
JavaScript dialogs (``alert``), which it dismisses.

    with Browser() as browser:
        browser.open(page.as_uri(), wait_for="document.body.dataset.ready === '1'")
        n = browser.evaluate("document.querySelectorAll('.card').length")
        browser.screenshot(tmp_path / "page.png")
        assert not browser.errors
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser could not be started or did not answer."""


def find_chromium() -> str | None:
    """The path of a Chromium-family browser on PATH (``BALCAPRL_CHROMIUM`` names one explicitly)."""
    named = os.environ.get("BALCAPRL_CHROMIUM")
    if named:
        return shutil.which(named) or (named if Path(named).is_file() else None)
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


class Browser:
    """One headless browser with one page; every method blocks (the protocol runs on its own loop)."""

    def __init__(
        self, executable: str | None = None, *, width: int = 1280, height: int = 900, timeout_s: float = 60
    ):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError(f"no Chromium found (looked for {', '.join(CANDIDATES)})")
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.errors: list[str] = []  # console errors, exceptions, error log entries
        self.dialogs: list[str] = []  # alert/confirm/prompt messages (dismissed)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="balcaprl-cdp", daemon=True)
        self._process: subprocess.Popen | None = None
        self._profile: str | None = None
        self._session_id: str | None = None
        self._http = self._ws = self._reader = None
        self._load_event: asyncio.Event | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> Browser:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Browser:
        self._profile = tempfile.mkdtemp(prefix="balcaprl-chromium-")
        args = [
            self.executable, "--headless", "--remote-debugging-port=0", f"--user-data-dir={self._profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--mute-audio", "--hide-scrollbars", "about:blank",
        ]  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while True:
            lines = port_file.read_text().splitlines() if port_file.is_file() else []
            if len(lines) >= 2:
                break
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError(
                    f"{self.executable} did not start (exit status {self._process.returncode})"
                )
            time.sleep(0.05)
        self._thread.start()
        self._run(self._connect(f"ws://127.0.0.1:{lines[0]}{lines[1]}"))
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # closing must not hide the test's own failure
                self._run(self._disconnect(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    # -- what tests call -----------------------------------------------------------------------------
    def open(self, url: str, wait_for: str | None = None) -> float:
        """Navigate and wait for the load event (and ``wait_for``, a JS expression, to be truthy);
        returns the seconds it took."""
        start = time.perf_counter()
        self._run(self._navigate(url))
        if wait_for is not None:
            self.wait_for(wait_for)
        return time.perf_counter() - start

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only)."""
        reply = self._run(self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                           "awaitPromise": True}))  # fmt: skip
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise BrowserError(
                f"{expression!r} raised: {details.get('exception', {}).get('description', details)}"
            )
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            time.sleep(0.02)

    def screenshot(self, path: Path | str, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        reply = self._run(self._send("Page.captureScreenshot", params))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path

    # -- the protocol -----------------------------------------------------------------------------------
    def _run(self, coroutine, timeout: float | None = None):
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout or self.timeout_s)

    async def _connect(self, url: str) -> None:
        import aiohttp

        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())
        self._load_event = asyncio.Event()
        target = await self._send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = await self._send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True},
                                    session=False)  # fmt: skip
        self._session_id = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            await self._send(f"{domain}.enable")
        await self._send("Emulation.setDeviceMetricsOverride",
                         {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip

    async def _disconnect(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
        if self._http is not None:
            await self._http.close()

    async def _navigate(self, url: str) -> None:
        assert self._load_event is not None
        self._load_event.clear()
        reply = await self._send("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise BrowserError(f"navigating to {url}: {reply['errorText']}")
        if reply.get("loaderId"):  # none for a same-document navigation (only the fragment changed)
            await asyncio.wait_for(self._load_event.wait(), self.timeout_s)

    async def _send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> dict:
        message: dict[str, Any] = {"id": next(self._ids), "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session_id
        future = self._loop.create_future()
        self._pending[message["id"]] = future
        await self._ws.send_json(message)
        reply = await asyncio.wait_for(future, self.timeout_s)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
        return reply.get("result", {})

    async def _read(self) -> None:
        import aiohttp

        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            await self._event(data.get("method", ""), data.get("params", {}))

    async def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired" and self._load_event is not None:
            self._load_event.set()
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.errors.append("console: " + " ".join(texts))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(
                "exception: " + str(details.get("exception", {}).get("description", details.get("text")))
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + str(params["entry"].get("text")))
        elif method == "Page.javascriptDialogOpening":
            self.dialogs.append(str(params.get("message")))
            asyncio.ensure_future(self._send("Page.handleJavaScriptDialog", {"accept": False}))
