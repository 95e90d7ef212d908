"""A headless Chromium driven over the DevTools protocol (a small client on aiohttp).

Debian's ``chromium`` package; ``.ci/run`` installs it. Console errors, uncaught
exceptions and failed loads are collected so a test can assert there were none.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Self

import aiohttp

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,1000",
    "--lang=en-US",  # numbers as the tests read them (1,234.5)
    "--remote-debugging-port=0",
)


def chromium_binary() -> str | None:
    """The Chromium on this machine, if any."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One headless browser with one page, driven through the DevTools protocol."""

    def __init__(self, profile: Path) -> None:
        self._profile = profile
        self._proc: subprocess.Popen[str] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.errors: list[str] = []

    async def __aenter__(self) -> Self:
        binary = chromium_binary()
        assert binary is not None, "chromium is not installed (apt-get install chromium)"
        self._proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = await asyncio.to_thread(self._devtools_port)
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()

    def _devtools_port(self) -> int:
        assert self._proc is not None
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                return int(match.group(1))
        raise RuntimeError(f"chromium exited ({self._proc.wait()}) without a DevTools port")

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            data = msg.json()
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._event(data["method"], data.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params["type"] in {"error", "assert"}:
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its result."""
        assert self._ws is not None
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send_json({"id": ident, "method": method, "params": params})
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply["result"])

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def before_load(self, script: str) -> None:
        """Run ``script`` in every document this page loads, before the document's own."""
        await self.send("Page.addScriptToEvaluateOnNewDocument", source=script)

    async def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        loaded = asyncio.get_running_loop().create_future()
        previous = self._event

        def watch(method: str, params: dict[str, Any]) -> None:
            previous(method, params)
            if method == "Page.loadEventFired" and not loaded.done():
                loaded.set_result(True)

        self._event = watch  # type: ignore[method-assign]
        try:
            await self.send("Page.navigate", url=url)
            await asyncio.wait_for(loaded, 30)
        finally:
            self._event = previous  # type: ignore[method-assign]

    async def screenshot(self, path: Path, clip: dict[str, float] | None = None) -> None:
        """Save a PNG of the whole page, or of ``clip`` (x, y, width, height in CSS pixels
        of the document) at one device pixel per CSS pixel."""
        extra: dict[str, Any] = {} if clip is None else {"clip": {**clip, "scale": 1}}
        result = await self.send(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True, **extra
        )
        path.write_bytes(base64.b64decode(result["data"]))
