"""grafana/builder/memory_limits.py: the exporter-memory panels draw the limits the shipped units set."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grafana import builder
from grafana.builder import memory_limits
from grafana.builder.memory_limits import LimitsError

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024**2


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(dashboard: dict[str, Any], title: str) -> list[str]:
    (panel,) = [p for p in panels(dashboard) if p["title"] == title]
    return [target["expr"] for target in panel["targets"]]


@pytest.fixture
def units(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the shipped systemd unit and DaemonSet, to change."""
    unit = tmp_path / "amdgpu-exporter.service"
    daemonset = tmp_path / "daemonset.yaml"
    unit.write_text(memory_limits.SYSTEMD_UNIT.read_text(encoding="utf-8"), encoding="utf-8")
    daemonset.write_text(memory_limits.DAEMONSET.read_text(encoding="utf-8"), encoding="utf-8")
    return unit, daemonset


def test_the_shipped_limits_are_read() -> None:
    limits = memory_limits.load()
    unit_text = memory_limits.SYSTEMD_UNIT.read_text(encoding="utf-8")
    (memory_max,) = re.findall(r"^MemoryMax=(\d+)M$", unit_text, re.MULTILINE)
    assert limits.systemd_memory_max_bytes == int(memory_max) * MIB
    daemonset_text = memory_limits.DAEMONSET.read_text(encoding="utf-8")
    assert f"memory: {limits.kubernetes_memory_limit_bytes / MIB:g}Mi" in daemonset_text
    assert limits.tightest_bytes == min(limits.systemd_memory_max_bytes, limits.kubernetes_memory_limit_bytes)


def test_changed_limits_change_the_memory_panels(units: tuple[Path, Path]) -> None:
    unit, daemonset = units
    unit.write_text(re.sub(r"^MemoryMax=.*$", "MemoryMax=1G", unit.read_text(), flags=re.MULTILINE))
    daemonset.write_text(re.sub(r"memory: 256Mi", "memory: 384Mi", daemonset.read_text()))
    limits = memory_limits.load(unit, daemonset)
    assert (limits.systemd_memory_max_bytes, limits.kubernetes_memory_limit_bytes) == (1024 * MIB, 384 * MIB)

    generated = builder.dashboards(limits=limits)
    node, fleet = generated["amdgpu-node.json"], generated["amdgpu-fleet.json"]
    assert exprs(node, "Exporter memory against its limits")[2:] == [f"vector({1024 * MIB})", f"vector({384 * MIB})"]
    (share,) = exprs(node, "Memory share of the tighter limit")
    assert share.endswith(f" / {384 * MIB}")
    assert exprs(fleet, "Exporter resident memory across nodes")[1] == f"vector({384 * MIB})"
    (near,) = exprs(fleet, "Exporters near their memory limit")
    assert f"> {round(0.8 * 384 * MIB)})" in near
    (description,) = [p["description"] for p in panels(node) if p["title"] == "Exporter memory against its limits"]
    assert "1024 MiB" in description and "384 MiB" in description


def test_kubernetes_decimal_and_binary_quantities(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    for quantity, expected in (("256Mi", 256 * MIB), ("1Gi", 1024 * MIB), ("500M", 500e6), ("1048576", MIB)):
        text = (
            "kind: DaemonSet\nspec:\n  template:\n    spec:\n      containers:\n"
            f"        - name: amdgpu-exporter\n          resources: {{limits: {{memory: '{quantity}'}}}}\n"
        )
        assert memory_limits.kubernetes_memory_limit(text, path) == expected, quantity


def test_the_last_memory_max_of_the_service_section_counts(tmp_path: Path) -> None:
    text = "[Unit]\nMemoryMax=1M\n[Service]\nMemoryMax=100M\nMemoryMax=2G\n[Install]\n"
    assert memory_limits.systemd_memory_max(text, tmp_path / "u.service") == 2 * 1024**3


@pytest.mark.parametrize(
    ("unit_text", "daemonset_edit", "message"),
    [
        ("[Service]\nExecStart=/bin/true\n", None, r"amdgpu-exporter\.service: no MemoryMax= in \[Service\]"),
        ("[Service]\nMemoryMax=infinity\n", None, r"MemoryMax=infinity: want bytes"),
        (None, ("memory: 256Mi", "memory: lots"), r"daemonset\.yaml: container amdgpu-exporter: memory limit 'lots'"),
        (None, ("- name: amdgpu-exporter", "- name: other"), r"want one container named amdgpu-exporter, found 0"),
        (None, ("kind: DaemonSet", "kind: Deployment"), r"want one DaemonSet, found 0"),
    ],
)
def test_a_missing_or_bad_limit_is_a_one_line_error_naming_the_file(
    units: tuple[Path, Path], unit_text: str | None, daemonset_edit: tuple[str, str] | None, message: str
) -> None:
    unit, daemonset = units
    if unit_text is not None:
        unit.write_text(unit_text)
    if daemonset_edit is not None:
        old, new = daemonset_edit
        text = daemonset.read_text()
        assert old in text
        daemonset.write_text(text.replace(old, new))
    with pytest.raises(LimitsError, match=message) as raised:
        memory_limits.load(unit, daemonset)
    assert "\n" not in str(raised.value)

    command = [sys.executable, str(ROOT / "grafana" / "build_dashboards.py"), "--check"]
    result = subprocess.run(
        [*command, "--systemd-unit", str(unit), "--daemonset", str(daemonset)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert re.fullmatch(rf"build_dashboards: .*{message}.*\n", result.stderr), result.stderr
