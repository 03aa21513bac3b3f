"""`promtool check metrics` (Debian `prometheus`, 2.42) on a real scrape of the demo daemon.

promtool lints the Prometheus text format only (its parser is the 0.0.4 text parser): fed
OpenMetrics it reports every counter as "no help text", because OpenMetrics names a counter's
HELP without the _total its samples carry. So the text format is what is checked here; the
OpenMetrics form is checked against the same samples by test_exposition and the golden test.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realtools import require_tool, start_exporter, stop, wait_for_cycles, wait_ready

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# Lint problems in what the exporter serves today, each waiting for an exporter fix (issue 9, the
# restructuring branch). Keep this exact: a new problem fails the test, and so does a fixed one
# still listed here, so the list can only shrink.
KNOWN_EXPORTER_PROBLEMS: set[str] = set()


def promtool_problems(body: bytes) -> set[str]:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False)
    output = (result.stdout + result.stderr).decode()
    problems = {line.strip() for line in output.splitlines() if line.strip()}
    # 0 = clean, 3 = lint problems found; anything else (1: unparsable input) is a failure by itself.
    assert result.returncode in (0, 3), f"promtool failed ({result.returncode}): {output}"
    assert (result.returncode == 0) == (not problems), output
    return problems


FIRING = re.compile(rb"^amdgpu_alert_firing\{[^}]*\} 1\.0$", re.MULTILINE)
BANDWIDTH = re.compile(rb'^amdgpu_pcie_bandwidth(?:_upper_bound)?_bytes_per_second\{gpu="(\d+)"', re.MULTILINE)
GCDS = 6  # 1 x MI210, 2 x MI250X (two each), 1 x MI300X


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bytes]:
    require_tool("promtool")
    # The shipped rules with a 1 s `for`, so the scrape also carries a firing alert and the
    # suggested clock ceiling, series a quiet node never shows.
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    shipped = (REPO / "exporter" / "alerting" / "default_rules.yaml").read_text(encoding="utf-8")
    assert "    for: 60s\n" in shipped
    rules.write_text(shipped.replace("    for: 60s\n", "    for: 1s\n"), encoding="utf-8")
    proc, port = start_exporter(
        "--demo",
        "--demo.fleet=1xMI210,2xMI250X,1xMI300X",
        "--demo.scenario=thermal-excursion:start=0,hot=600,peak=100,gpus=1",
        f"--rules.file={rules}",
        "--interval=200ms",
        "--slow-interval=1s",
    )
    try:
        wait_ready(port, proc, timeout=30)
        wait_for_cycles(port, 7)  # past the first slow refresh (1 s: five cycles of 200 ms, two more published)
        deadline = time.monotonic() + 30
        while True:
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": "text/plain"}, timeout=10)
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
            # the alert fired, and every GCD's pcie_bw figures are in (the MI300X's from its gpu_metrics)
            if FIRING.search(response.content) and len(set(BANDWIDTH.findall(response.content))) == GCDS:
                break
            assert time.monotonic() < deadline, "the hot GPU's alert never fired, or a GCD has no pcie_bw figures"
            time.sleep(0.3)
        yield response.content
    finally:
        stop(proc)


def test_promtool_finds_only_the_known_problems_in_a_real_scrape(scrape: bytes) -> None:
    for family in (
        "amdgpu_up",
        "amdgpu_energy_joules_total",
        "amdgpu_exporter_poll_duration_seconds_bucket",
        "amdgpu_suggested_gfx_clock_max_hertz{",
    ):
        assert family.encode() in scrape, f"{family} missing from the scrape"
    assert promtool_problems(scrape) == KNOWN_EXPORTER_PROBLEMS


def test_promtool_does_lint_what_it_is_given() -> None:
    # A check that cannot fail proves nothing: the same call reports a counter without _total.
    bad = b"# HELP amdgpu_bad_things Bad things.\n# TYPE amdgpu_bad_things counter\namdgpu_bad_things 1\n"
    assert promtool_problems(bad) == {'amdgpu_bad_things counter metrics should have "_total" suffix'}
