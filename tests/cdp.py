"""A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (no websocket library, no
browser driver): headless Debian chromium, driven from the standard library only.

Chromium reads commands from fd 3 and writes answers and events to fd 4, one JSON message per
NUL-terminated chunk. One thread reads fd 4; commands wait for their answer by id; events are
kept in order for the test to inspect.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

# Flags that keep a test browser quiet and self-contained: no first-run UI, no background
# networking (component updates, safe browsing) that is not the page's own.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # tests run as root in a container
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)


class CdpError(RuntimeError):
    pass


class Browser:
    def __init__(self, chromium: str, *, window: tuple[int, int] = (1280, 900)) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="cdp-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The browser wants the pipe on fds 3 and 4 exactly: let bash put them there (dash refuses
        # fd numbers above 9, and a test process has many fds open).
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.process = subprocess.Popen(
            [
                shutil.which("bash") or "/bin/bash",
                "-c",
                script,
                chromium,
                *CHROMIUM_FLAGS,
                f"--window-size={window[0]},{window[1]}",
                f"--user-data-dir={self._profile.name}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=open(os.environ.get("CDP_BROWSER_LOG", os.devnull), "wb"),  # noqa: SIM115
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._ids = itertools.count(1)
        self._answers: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()
        self.session = ""

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    return
                buffer += chunk
                while b"\0" in buffer:
                    raw, buffer = buffer.split(b"\0", 1)
                    message = json.loads(raw)
                    if "id" in message:
                        with self._lock:
                            waiter = self._answers.get(message["id"])
                        if waiter is not None:
                            waiter.put(message)
                    else:
                        with self._lock:
                            self.events.append(message)

    def send(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 30.0) -> dict[str, Any]:
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        waiter: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1)
        with self._lock:
            self._answers[ident] = waiter
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        try:
            answer = waiter.get(timeout=timeout)
        except queue.Empty as error:
            raise CdpError(f"{method}: no answer within {timeout} s") from error
        finally:
            with self._lock:
                del self._answers[ident]
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def open_page(self, domains: Sequence[str] = ("Page", "Runtime", "Network", "Log")) -> None:
        """A new tab, attached (flat session), with the given domains' events enabled."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in domains:
            self.send(f"{domain}.enable")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CdpError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def events_named(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [event["params"] for event in self.events if event.get("method") == method]

    def close(self) -> None:
        with contextlib.suppress(CdpError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        os.close(self._to_browser)
        self._profile.cleanup()
