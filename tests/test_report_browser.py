"""The demo report in headless Chromium: every figure decodes, no console error, no
network request, and a screenshot is kept as a test artifact.

A tiny DevTools-protocol client (``websocket-client``, pinned in the ``dev`` extra)
drives Debian's ``chromium`` (installed by ``.ci/run``): it loads the report from a
file URL, records console messages, exceptions, log entries and every network request,
asks the page for each image's decoded size, and captures the page as PNG into
``artifacts/`` at the repository root (git-ignored).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_demo import demo_once

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--remote-debugging-port=0", "--window-size=1400,1000",
)  # fmt: skip
PAGE_JS = """JSON.stringify({
  title: document.title,
  images: Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, w: i.naturalWidth,
                                                  h: i.naturalHeight, data: i.src.startsWith('data:image/png;base64,')})),
  scripts: document.scripts.length,
  links: Array.from(document.querySelectorAll('link[href],[src]')).map(e => e.getAttribute('src') || e.getAttribute('href'))
         .filter(u => !u.startsWith('data:')),
  height: document.documentElement.scrollHeight,
  width: document.documentElement.scrollWidth,
})"""


class DevTools:
    """Just enough of the Chrome DevTools protocol: commands and the events between them."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        for e in self.events:
            if e.get("method") == method:
                return e
        while time.monotonic() < deadline:
            e = json.loads(self.ws.recv())
            self.events.append(e)
            if e.get("method") == method:
                return e
        raise TimeoutError(method)


def open_in_chromium(html: Path, shot: Path) -> tuple[dict, list[dict]]:
    """Load ``html``; return what the page reports about itself and every DevTools event."""
    # chromium's helper processes may still write to the profile while it shuts down
    with tempfile.TemporaryDirectory(prefix="calib-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            ws_url = None
            deadline = time.monotonic() + 60
            while ws_url is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {proc.returncode}")
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                ws_url = m.group(1) if m else None
            assert ws_url, "chromium did not open its DevTools port"
            dt = DevTools(ws_url)
            target = dt.send("Target.createTarget", url="about:blank")["targetId"]
            sid = dt.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                dt.send(f"{domain}.enable", session=sid)
            dt.send("Emulation.setDeviceMetricsOverride", session=sid, width=1400, height=1000,
                    deviceScaleFactor=1, mobile=False)  # fmt: skip
            dt.send("Page.navigate", session=sid, url=html.resolve().as_uri())
            dt.wait_for("Page.loadEventFired")
            info = json.loads(
                dt.send("Runtime.evaluate", session=sid, expression=PAGE_JS, returnByValue=True)["result"][
                    "value"
                ]
            )
            # the first screens at full width (what a reader sees first), then the whole page scaled down
            top = dt.send("Page.captureScreenshot", session=sid, format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": 1400, "height": min(info["height"], 2600), "scale": 1})  # fmt: skip
            shot.write_bytes(base64.b64decode(top["data"]))
            full = dt.send("Page.captureScreenshot", session=sid, format="png", captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": 1400, "height": min(info["height"], 60000), "scale": 0.25})  # fmt: skip
            shot.with_name(shot.stem + "-full.png").write_bytes(base64.b64decode(full["data"]))
            events = list(dt.events)
            dt.ws.close()
            return info, events
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the browser and all its helper processes
            proc.wait(timeout=30)


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"), reason="chromium not installed")
def test_report_in_headless_chromium(capsys) -> None:
    """Never skipped in CI (CI=true): .ci/run installs chromium before the tests."""
    demo_report, _, _ = demo_once()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    info, events = open_in_chromium(demo_report, shot)
    with capsys.disabled():  # shown in CI's output too
        print(f"\nscreenshot: {shot} (whole page: {shot.with_name(shot.stem + '-full.png')})")

    n_figs = len(list((demo_report.parent / "figures").glob("*.png")))
    assert n_figs >= 15
    assert len(info["images"]) == n_figs, "every figure is embedded once"
    for img in info["images"]:
        assert img["data"], f"{img['alt']}: not an embedded PNG"
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, f"{img['alt']}: did not load"
    assert info["scripts"] == 0 and info["links"] == [], "the report loads nothing from anywhere"
    errors = [e for e in events if e.get("method") == "Runtime.exceptionThrown"]
    errors += [
        e
        for e in events
        if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")
    ]
    errors += [
        e for e in events if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
    ]
    assert errors == [], errors
    requests = [
        e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert shot.stat().st_size > 50_000
