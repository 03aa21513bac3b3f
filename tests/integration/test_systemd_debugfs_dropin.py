"""Issue 31 case 11: the opt-in drop-in deploy/systemd/debugfs.conf lets the service read debugfs.

systemd is not PID 1 here, so its effect is rebuilt as test_systemd_unit.py does: the unit's transient
uid, no groups, and exactly the capabilities the merged unit gives (setpriv). Without the drop-in the
CPER ring under a root-only (0700) debugfs is never read; with it, the CPER series are there. The
merged unit still passes systemd-analyze verify, and its exposure is printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter.simulator import Simulator
from tests.integration.test_systemd_unit import in_namespace, parse_unit
from tests.realtools import EXPORTER, require_root, require_tool, start_listening, stop, wait_ready

pytestmark = pytest.mark.integration

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNIT, DROP_IN = SYSTEMD / "amdgpu-exporter.service", SYSTEMD / "debugfs.conf"
SERVICE_UID = 61184  # the first of systemd's DynamicUser range


def capabilities(text: str) -> set[str]:
    """The bounding set a unit's CapabilityBoundingSet= assignments give (each adds; an empty one resets)."""
    found: set[str] = set()
    for value in parse_unit(text)["Service"].get("CapabilityBoundingSet", []):
        found = set() if not value else found | set(value.split())
    return found


@pytest.fixture
def tree() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dropin-"))
    try:
        root.chmod(0o755)
        scenario = "idle:faults=cper_fatal.0,fault_at=0,fault_for=600"
        simulator = Simulator(root / "sys", fleet="MI300X", scenario=scenario)
        simulator.write_tree()
        simulator.tick(5.0)
        os.chmod(root / "sys" / "kernel" / "debug", 0o700)  # as the kernel mounts debugfs: root only
        yield root / "sys"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cper_series(sysfs: Path, caps: set[str]) -> list[str]:
    setpriv = require_tool("setpriv")
    names = ",".join(f"+{cap.lower().removeprefix('cap_')}" for cap in sorted(caps))
    added = f",{names}" if names else ""
    privileges = [f"--inh-caps=-all{added}", f"--bounding-set=-all{added}"]
    if names:
        privileges.append(f"--ambient-caps={names}")
    user = [setpriv, f"--reuid={SERVICE_UID}", f"--regid={SERVICE_UID}", "--clear-groups", *privileges]
    daemon = [EXPORTER, f"--path.sysfs={sysfs}", "--source=sysfs", "--slow-interval=0.5s"]
    process, port = start_listening(
        lambda port: [*user, *daemon, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL
    )
    try:
        wait_ready(port, process)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return [line for line in text.splitlines() if line.startswith("amdgpu_cper_records{")]
    finally:
        stop(process)


def test_the_drop_in_lets_the_service_uid_read_the_cper_ring(tree: Path) -> None:
    require_root()
    unit = UNIT.read_text()
    merged = unit + "\n" + DROP_IN.read_text()
    assert capabilities(unit) == set()
    assert capabilities(merged) == {"CAP_DAC_READ_SEARCH"}
    assert parse_unit(DROP_IN.read_text())["Service"]["AmbientCapabilities"] == ["CAP_DAC_READ_SEARCH"]
    assert cper_series(tree, capabilities(unit)) == [], "a root-only debugfs was read without the drop-in"
    series = cper_series(tree, capabilities(merged))
    assert any('severity="fatal"' in line for line in series), series


def test_the_merged_unit_verifies(install_root: Path, tmp_path: Path) -> None:
    systemd_analyze = require_tool("systemd-analyze")
    merged = tmp_path / UNIT.name
    merged.write_text(UNIT.read_text() + "\n" + DROP_IN.read_text())
    result = subprocess.run(
        in_namespace(install_root, [systemd_analyze, "verify", "--man=no", str(merged)]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr
    security = subprocess.run(
        [systemd_analyze, "security", "--offline=true", "--no-pager", str(merged)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", security.stdout)
    assert match, security.stdout + security.stderr
    print(f"exposure with the debugfs drop-in: {match.group(1)}")
    assert float(match.group(1)) <= 3.0, security.stdout
