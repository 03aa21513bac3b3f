"""Sliding windows end to end: the simulator's alternating workload, a real exporter, a real Prometheus.

    amdgpu-exporter --demo (2 x MI250X + 1 x MI300X, "alternating": compute / communication steps of
      |                0.8 s, the junction swinging within each step; --fast.interval 100ms, --window 5s)
      '-- scraped every 1 s by Debian's prometheus

Every window family (temperature, power, busy, clock) and every stat (min, max, mean) of every device
is read back from Prometheus and held to the simulator's own window over the same 5 s (its truth file
keeps min / max / time-weighted mean of what the tree showed, and the exact means its accumulators
imply). The exporter's window for a scrape was computed when its poll cycle finished, which
amdgpu_exporter_last_poll_timestamp_seconds of the same scrape says; the truth written closest to
that instant is the one compared.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_alerting_e2e import demo
from tests.realtools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WINDOW_S = 5.0
FLEET = "2xMI250X,1xMI300X"  # GCDs 0-3: MI250X (no activity accumulators), GCD 4: MI300X (v1_4+)
# The tree changes every 200 ms (tick=0.2): every value it shows is held for two sampling intervals,
# so a 100 ms sampler sees each of them and the window's min and max can be held to the truth. (With
# the scenario's default tick, period / 20 = 40 ms, a value held for less than a sampling interval
# can fall between two samples: no sampler slower than the source can promise its extremes.)
SCENARIO = f"alternating:period=0.8,duty=0.6,swing=6,window={WINDOW_S:g},tick=0.2"
SETTLE_S = 1.0 + WINDOW_S + 3.0  # warm-up, one full window, and a few scrapes

FAMILIES = {
    "temperature": ("amdgpu_temperature_window_celsius", "sensor"),
    "power": ("amdgpu_power_window_watts", None),
    "busy": ("amdgpu_busy_window_ratio", "engine"),
    "clock": ("amdgpu_clock_window_hertz", "domain"),
}
# What each family must cover on every device that has it (more keys are compared when present).
REQUIRED = {
    "temperature": {"junction", "memory"},
    "busy": {"gfx", "memory"},
    "clock": {"gfx", "memory", "soc"},
    "power": {"socket"},
}


def tolerance(family: str, stat: str, truth: dict[str, float], exact: bool) -> float:
    """How far a sampled window may sit from the truth: sampling at 100 ms cannot see every 37.5 ms tick."""
    if family == "temperature":
        return 1.0 if stat in ("min", "max") else 0.5  # whole degrees; a peak may fall between two samples
    if family == "busy":
        return 0.03 if stat != "mean" or exact else 0.06
    if family == "power":
        span = truth["max"] - truth["min"]
        return 0.01 * truth["mean"] if stat == "mean" and exact else 0.05 * truth["mean"] + 0.1 * span
    return 0.02 * truth["max"]  # clocks


class TruthLog:
    """The simulator's truth file, read every 50 ms: (written_at, windows) of every version seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="truth-log", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                document = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            windows = document.get("windows")
            if not windows or windows.get("written_at") is None:
                continue
            if self.entries and self.entries[-1][0] == windows["written_at"]:
                continue
            self.entries.append((windows["written_at"], windows))

    def __enter__(self) -> TruthLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def closest(self, wall: float) -> tuple[float, dict[str, Any]]:
        assert self.entries, "the simulator wrote no windows into its truth file"
        return min(self.entries, key=lambda entry: abs(entry[0] - wall))

    def near(self, wall: float, seconds: float) -> list[dict[str, Any]]:
        """Every truth written within `seconds` of `wall`: the windows the exporter's could be."""
        return [windows for written_at, windows in self.entries if abs(written_at - wall) <= seconds]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, TruthLog]]:
    workdir = tmp_path_factory.mktemp("windows-e2e")
    truth_file = workdir / "truth.json"
    config = demo.StackConfig(
        workdir=workdir,
        prometheus=require_tool(demo.PROMETHEUS),
        alertmanager=require_tool(demo.ALERTMANAGER),
        fleet=FLEET,
        scenario=SCENARIO,
        push=False,
        # every window series, not only those rendered at defaults: each is held to the truth
        exporter_args=(
            f"--demo.truth-file={truth_file}",
            "--fast.interval=100ms",
            f"--window={WINDOW_S:g}s",
            "--window.all-series",
        ),
    )
    with demo.Stack(config) as running, TruthLog(truth_file) as truth:
        time.sleep(SETTLE_S)
        yield running, truth


def query(stack: Any, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scraped_windows(stack: Any) -> tuple[float, dict[tuple[int, str, str, str], float]]:
    """(when the exporter computed them, {(gpu, family, key, stat): value}) from one scrape."""
    selector = "|".join(name for name, _ in FAMILIES.values())
    # One query, so every series comes from the same scrape as the poll timestamp.
    rows = query(stack, f'{{__name__=~"{selector}|amdgpu_exporter_last_poll_timestamp_seconds"}}')
    taken_at = None
    values: dict[tuple[int, str, str, str], float] = {}
    for row in rows:
        metric, value = row["metric"], float(row["value"][1])
        if metric["__name__"] == "amdgpu_exporter_last_poll_timestamp_seconds":
            taken_at = value
            continue
        family, (_, key_label) = next((f, spec) for f, spec in FAMILIES.items() if spec[0] == metric["__name__"])
        key = metric[key_label] if key_label else "socket"
        values[(int(metric["gpu"]), family, key, metric["stat"])] = value
    assert taken_at is not None, "no amdgpu_exporter_last_poll_timestamp_seconds in the scrape"
    return taken_at, values


def test_every_window_family_matches_the_simulators_truth(stack: tuple[Any, TruthLog]) -> None:
    running, truth_log = stack
    checked = 0
    for attempt in range(3):  # three scrapes a few seconds apart: the windows move, the match must hold
        if attempt:
            time.sleep(2.0)
        # The simulator writes its truth a few times a second; under load a write can come late, so
        # scrape again (a new window each time) until one has a truth written within 0.25 s of it.
        for _ in range(20):
            taken_at, scraped = scraped_windows(running)
            written_at, truth = truth_log.closest(taken_at)
            if abs(written_at - taken_at) < 0.25:
                break
            time.sleep(0.3)
        assert abs(written_at - taken_at) < 0.25, "no truth written near the exporter's window in 20 scrapes"
        assert truth["seconds"] == WINDOW_S
        # The exporter's window ends when its poll finished, the truth's when the simulator wrote it:
        # a quarter second apart at worst, and an edge that moves by 0.25 s can take in (or drop) one
        # of the tree's 200 ms values. Every truth written within that span is as good a reference,
        # so a stat must lie within their envelope (plus the sampling tolerance), no wider.
        around = truth_log.near(taken_at, 0.25)
        failures = []
        for device in truth["devices"]:
            gpu = device["gpu"]
            same_device = [d for t in around for d in t["devices"] if d["gpu"] == gpu]
            for family, (name, _) in FAMILIES.items():
                keys = set(device[family])
                if family == "power" and not keys:
                    assert not [k for k in scraped if k[0] == gpu and k[1] == "power"], f"gpu {gpu}: fake power"
                    continue
                for key in keys:
                    stats = device[family][key]
                    if (gpu, family, key, "max") not in scraped:
                        if key in REQUIRED[family]:
                            failures.append(f"gpu {gpu} {name}{{{key}}}: not exported")
                        continue  # a value the fast sampler does not read (fabric clock, media busy)
                    exact = "mean_acc" in stats
                    for stat in ("min", "max", "mean"):
                        field = "mean_acc" if stat == "mean" and exact else stat
                        wants = [d[family][key][field] for d in same_device if key in d[family]] or [stats[field]]
                        low, high = min(wants), max(wants)
                        got = scraped[(gpu, family, key, stat)]
                        allowed = tolerance(family, stat, stats, exact)
                        checked += 1
                        if not low - allowed <= got <= high + allowed:
                            span = f"{low:g}" if low == high else f"{low:g}..{high:g}"
                            failures.append(
                                f"gpu {gpu} {name}{{{key}, stat={stat}}} = {got:g}, truth {span} (± {allowed:g})"
                            )
        assert not failures, "\n".join(failures)
    assert checked >= 3 * 5 * 3 * 8  # 5 devices, every stat of 8+ series each, three times


def test_alternation_is_visible_in_the_busy_window(stack: tuple[Any, TruthLog]) -> None:
    running, _ = stack
    _, scraped = scraped_windows(running)
    for gpu in range(5):
        low, high = scraped[(gpu, "busy", "gfx", "min")], scraped[(gpu, "busy", "gfx", "max")]
        assert high - low > 0.5, f"gpu {gpu}: gfx busy {low:.2f}..{high:.2f} shows no compute/communication steps"
        swing = scraped[(gpu, "temperature", "junction", "max")] - scraped[(gpu, "temperature", "junction", "min")]
        assert swing >= 5.0, f"gpu {gpu}: a 6 °C junction swing shows as {swing:g} °C"


def test_window_length_and_fast_counters_are_exported(stack: tuple[Any, TruthLog]) -> None:
    running, _ = stack
    (window,) = query(running, "amdgpu_exporter_window_seconds")
    assert float(window["value"][1]) == WINDOW_S
    rates = query(running, "rate(amdgpu_exporter_fast_samples_total[5s])")
    assert len(rates) == 5
    for row in rates:
        assert 8.0 <= float(row["value"][1]) <= 11.0, row  # ten reads a second per device
    (cycles,) = query(running, "sum(rate(amdgpu_exporter_fast_cycle_duration_seconds_count[5s]))")
    assert 8.0 <= float(cycles["value"][1]) <= 11.0


def test_waveform_api_returns_the_fast_samples(stack: tuple[Any, TruthLog]) -> None:
    running, _ = stack
    response = httpx.get(f"{running.exporter_url}/api/v1/waveform", params={"gpu": 4, "seconds": 2}, timeout=5)
    assert response.status_code == 200, response.text
    wave = response.json()
    assert 15 <= len(wave["timestamps"]) <= 22
    assert wave["timestamps"] == sorted(wave["timestamps"])
    assert len(wave["temperatures_celsius"]["junction"]) == len(wave["timestamps"])
    assert len(wave["power_watts"]) == len(wave["timestamps"])
    gfx = wave["busy_ratio"]["gfx"]
    assert max(gfx) - min(gfx) > 0.5  # two seconds hold two compute and two communication phases
    for params, message in [
        ({"gpu": "x", "seconds": 2}, "gpu"),
        ({"gpu": 4, "seconds": 0}, "seconds"),
        ({"gpu": 4, "seconds": 60}, "seconds"),
        ({"seconds": 2}, "gpu"),
    ]:
        bad = httpx.get(f"{running.exporter_url}/api/v1/waveform", params=params, timeout=5)
        assert bad.status_code == 400, (params, bad.text)
        assert message in bad.json()["error"]
    missing = httpx.get(f"{running.exporter_url}/api/v1/waveform", params={"gpu": 9, "seconds": 1}, timeout=5)
    assert missing.status_code == 404
