"""The live status page in a real browser (Debian's headless chromium, driven over the DevTools
pipe): on a mixed demo fleet every device has its tile, the values change as the page refreshes
itself from the JSON API, sparklines are drawn, no request leaves the exporter and nothing is
logged as an error; on a wall screen (1920x1080) a node of 64 partitions fits without scrolling, under
its name and the banner of its alerts, with a hot junction coloured by the loaded rules.
AMDGPU_EXPORTER_SCREENSHOT=path saves what the browser saw (docs/), AMDGPU_EXPORTER_WALL_SCREENSHOT
the wall screen's."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.cdp import Browser
from tests.faulty_tree import MIXED_FLEET, hang_device, release, write_tree
from tests.realtools import require_tool, start_exporter, wait_ready

pytestmark = pytest.mark.integration

TILES = """JSON.stringify(Array.from(document.querySelectorAll('article.tile')).map(t => ({
  gpu: Number(t.dataset.gpu),
  head: t.querySelector('.head').textContent,
  where: t.querySelector('.where').textContent,
  group: t.closest('section.group').querySelector('h2').textContent,
  junction: t.querySelector('[data-field=junction]').textContent,
  power: t.querySelector('[data-field=power]').textContent,
  busy: t.querySelector('[data-field=busy]').textContent,
  vram: t.querySelector('[data-field=vram]').textContent,
  sparks: Array.from(t.querySelectorAll('svg.spark polyline')).map(p => p.getAttribute('points').split(' ').length),
})))"""


@pytest.mark.parametrize("fast_sampler", [True, False], ids=["waveform", "page-history"])
def test_status_page_in_chromium(fast_sampler: bool) -> None:
    chromium = require_tool("chromium")
    fast = [] if fast_sampler else ["--fast.interval=0"]
    proc, port = start_exporter("--demo", f"--demo.fleet={MIXED_FLEET}", "--interval=500ms", *fast)
    browser = None
    try:
        wait_ready(port, proc)
        devices = httpx.get(f"http://127.0.0.1:{port}/api/v1/devices", timeout=5).json()["devices"]
        assert len(devices) == 7
        browser = Browser(chromium)
        browser.open_page()
        origin = f"http://127.0.0.1:{port}/"
        browser.send("Page.navigate", {"url": origin})
        deadline = time.monotonic() + 20
        first = None
        while time.monotonic() < deadline:  # the navigation is asynchronous: wait for the parsed page
            if browser.evaluate("document.readyState") == "complete":
                first = browser.evaluate(TILES)
                if first and len(json.loads(first)) == 7:
                    break
            time.sleep(0.2)
        before = json.loads(first)
        assert sorted(t["gpu"] for t in before) == list(range(7))
        by_gpu = {t["gpu"]: t for t in before}
        assert "d1" in by_gpu[3]["head"] and by_gpu[3]["where"].endswith("die 1")  # an MI250X die
        assert by_gpu[3]["power"] == "on die 0"
        assert "MI250X · package" in by_gpu[3]["group"] and "2 dies" in by_gpu[3]["group"]
        assert by_gpu[2]["group"] == by_gpu[3]["group"] != by_gpu[4]["group"]
        assert by_gpu[6]["where"].startswith(devices[6]["identity"]["pci_bus_id"])

        def refreshed() -> tuple[list[int], dict[int, dict]]:
            """The GPUs whose tiles the page has updated since `before`, and the tiles now."""
            after = {t["gpu"]: t for t in json.loads(browser.evaluate(TILES))}
            fields = ("power", "busy", "junction", "vram")
            return [g for g in range(7) if [after[g][f] for f in fields] != [by_gpu[g][f] for f in fields]], after

        # the page keeps refreshing from the API: most tiles change, and sparklines get several points
        # for junction, power (not on die 1) and busy
        deadline = time.monotonic() + 30
        while True:
            changed, after = refreshed()
            sparks = all(after[g]["sparks"][0] >= 3 and after[g]["sparks"][2] >= 3 for g in range(7))
            if len(changed) >= 5 and sparks:
                break
            assert time.monotonic() < deadline, (before, after)
            time.sleep(0.2)
        assert after[3]["power"] == "on die 0"  # the page's refresh says it too (the API's `unreported`)
        updated = browser.evaluate("document.getElementById('updated').textContent")
        assert updated.startswith("cycle "), updated
        shot = os.environ.get("AMDGPU_EXPORTER_SCREENSHOT")
        if shot and fast_sampler:
            Path(shot).write_bytes(browser.screenshot())
        requests = [e["request"]["url"] for e in browser.events_named("Network.requestWillBeSent")]
        assert any(url.endswith("/api/v1/devices") for url in requests)
        # the sparklines come from the fast sampler's ring (on by default), for every device it samples
        # (without it, from the page's own history of its polls)
        waveforms = {url.split("gpu=")[1].split("&")[0] for url in requests if "/api/v1/waveform?" in url}
        assert waveforms == ({str(g) for g in range(7)} if fast_sampler else set()), waveforms
        external = [url for url in requests if not url.startswith(origin) and not url.startswith("data:")]
        assert external == []
        console = [e for e in browser.events_named("Runtime.consoleAPICalled") if e["type"] in ("error", "assert")]
        exceptions = browser.events_named("Runtime.exceptionThrown")
        logged = [e["entry"] for e in browser.events_named("Log.entryAdded") if e["entry"]["level"] == "error"]
        failed = browser.events_named("Network.loadingFailed")
        assert (console, exceptions, logged, failed) == ([], [], [], [])
    finally:
        if browser is not None:
            browser.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_partitions_without_figures_of_their_own_say_why(tmp_path: Path) -> None:
    """v1_5 (kernels 6.7-6.12) has no per-partition figures: partitions 1-7's tiles say so, refreshed."""
    chromium = require_tool("chromium")
    proc, port = start_exporter("--demo", "--demo.fleet=MI300X:CPX:gpu_metrics=1.5", "--interval=500ms")
    browser = None
    try:
        wait_ready(port, proc)
        browser = Browser(chromium)
        browser.open_page()
        browser.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/"})
        deadline = time.monotonic() + 30
        tiles: list[dict] = []
        while time.monotonic() < deadline:  # until the page's own refresh has run
            updated = browser.evaluate("(document.getElementById('updated') || {}).textContent || ''")
            if updated.startswith("cycle ") and int(updated.split()[1]) >= 4:
                tiles = json.loads(browser.evaluate(TILES))
                break
            time.sleep(0.2)
        assert len(tiles) == 8, tiles
        for tile in tiles[1:]:
            assert (tile["power"], tile["busy"]) == ("on partition 0", "not in gpu_metrics 1.5"), tile
        assert tiles[0]["power"].endswith(" W") and tiles[0]["busy"].endswith(" %")
    finally:
        if browser is not None:
            browser.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_a_hung_device_is_shown_down_in_the_browser(tmp_path: Path) -> None:
    chromium = require_tool("chromium")
    simulator = write_tree(tmp_path / "sys", fleet="2xMI210")
    hung = hang_device(simulator, 1)
    proc, port = start_exporter(f"--path.sysfs={tmp_path / 'sys'}", "--interval=300ms", "--read-timeout=200ms")
    browser = None
    try:
        wait_ready(port, proc)
        browser = Browser(chromium)
        browser.open_page()
        browser.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/"})
        state = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if browser.evaluate("document.readyState") != "complete":
                time.sleep(0.1)
                continue
            state = browser.evaluate(
                "(() => { const t = document.getElementById('gpu-1');"
                " return t ? t.className + '|' + t.querySelector('.state').textContent : ''; })()"
            )
            if state.startswith("tile down|down: "):
                break
            time.sleep(0.2)
        assert state in ("tile down|down: timeout", "tile down|down: stuck"), state
        assert browser.evaluate("document.getElementById('gpu-0').className") == "tile"
        assert browser.events_named("Runtime.exceptionThrown") == []
    finally:
        if browser is not None:
            browser.close()
        release(hung)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


WALL_RULES = """rules:
  - alert: GpuJunctionTemperatureHigh
    metric: temperature_celsius
    sensor: junction
    comparison: ">"
    threshold: 85
    clear_threshold: 80
    for: 1s
    severity: warning
"""

WALL = """JSON.stringify((() => {
  const tiles = Array.from(document.querySelectorAll('article.tile'));
  const junction = g => document.querySelector('#gpu-' + g + ' [data-field=junction]');
  const node = document.getElementById('node');
  const banner = document.getElementById('banner');
  return {
    viewport: [window.innerWidth, window.innerHeight],
    scroll: [document.documentElement.scrollWidth, document.documentElement.scrollHeight],
    outside: tiles.filter(t => { const r = t.getBoundingClientRect();
      return r.left < 0 || r.top < 0 || r.right > window.innerWidth || r.bottom > window.innerHeight; }).length,
    tiles: tiles.length,
    node: node.textContent, nodePx: parseFloat(getComputedStyle(node).fontSize),
    banner: banner.hidden ? '' : banner.className + '|' + banner.textContent,
    bannerBottom: banner.getBoundingClientRect().bottom,
    firstTileTop: tiles.length ? tiles[0].getBoundingClientRect().top : 0,
    hot: [junction(8).textContent, junction(8).className, getComputedStyle(junction(8)).color],
    cool: [junction(0).textContent, junction(0).className, getComputedStyle(junction(0)).color],
  };
})())"""


def test_a_node_of_64_partitions_on_a_wall_screen(tmp_path: Path) -> None:
    """8 MI300X in CPX mode, socket 1 (gpus 8-15) in a thermal excursion: at 1920x1080 every tile is
    in view without scrolling, the node's name is large at the top, the firing alert is a banner
    above the tiles, and the hot junction is drawn in another colour than a cool one."""
    chromium = require_tool("chromium")
    rules = tmp_path / "rules.yaml"
    rules.write_text(WALL_RULES)
    proc, port = start_exporter(
        "--demo",
        "--demo.fleet=8xMI300X:CPX",
        "--demo.scenario=thermal-excursion:start=0,hot=600,peak=95,gpus=1",
        f"--rules.file={rules}",
        "--node-name=gpu-node-7",
        "--interval=500ms",
    )
    browser = None
    try:
        wait_ready(port, proc)
        browser = Browser(chromium, window=(1920, 1080))
        browser.open_page()
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1920, "height": 1080, "deviceScaleFactor": 1, "mobile": False},
        )
        browser.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/"})
        deadline = time.monotonic() + 60
        wall: dict = {}
        while time.monotonic() < deadline:  # until the excursion has made the alert fire, seen by the page
            if browser.evaluate("document.readyState") == "complete":
                wall = json.loads(browser.evaluate(WALL))
                if wall["banner"].startswith("banner warning|") and wall["hot"][1] == "lvl-warning":
                    break
            time.sleep(0.3)
        shot = os.environ.get("AMDGPU_EXPORTER_WALL_SCREENSHOT")
        if shot:
            Path(shot).write_bytes(browser.screenshot())
        assert wall["banner"].startswith("banner warning|GpuJunctionTemperatureHigh firing on GPU 8 ("), wall
        assert wall["hot"][1] == "lvl-warning" and int(wall["hot"][0].split()[0]) > 85, wall
        assert wall["cool"][1] == "" and int(wall["cool"][0].split()[0]) < 80, wall
        assert wall["hot"][2] != wall["cool"][2], wall  # not the same white
        assert wall["node"] == "gpu-node-7" and wall["nodePx"] >= 28, wall
        assert wall["bannerBottom"] <= wall["firstTileTop"], wall  # above the tiles
        assert wall["viewport"] == [1920, 1080] and wall["tiles"] == 64, wall
        assert wall["outside"] == 0 and wall["scroll"][0] <= 1920 and wall["scroll"][1] <= 1080, wall
        assert browser.events_named("Runtime.exceptionThrown") == []
    finally:
        if browser is not None:
            browser.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
