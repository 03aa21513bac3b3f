"""/metrics of a frozen simulator tree, byte for byte against the committed golden files.

A change to what /metrics says shows as a diff here and in review of tests/golden/*.txt;
regenerate with `make golden` when the change is intended. See tests/golden/golden_metrics.py for
the exact wall-clock values that are normalised.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.exposition.selection import EVERYTHING
from tests.golden.golden_metrics import GOLDEN_FILES, WALL_CLOCK, normalise, render_golden

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rendered() -> dict[bool, str]:
    return render_golden()


def _diff(expected: str, actual: str, path: Path) -> str:
    lines = difflib.unified_diff(
        expected.splitlines(keepends=True),
        actual.splitlines(keepends=True),
        fromfile=f"{path.relative_to(ROOT)} (committed)",
        tofile="rendered now",
    )
    return "".join(lines)


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_metrics_equal_the_golden_file(rendered: dict[bool, str], openmetrics: bool) -> None:
    path = GOLDEN_FILES[openmetrics]
    expected = path.read_text(encoding="utf-8")
    actual = rendered[openmetrics]
    if actual != expected:
        pytest.fail(f"/metrics changed; if intended run `make golden` and commit:\n{_diff(expected, actual, path)}")


def test_golden_is_the_same_in_another_process_and_hash_seed(rendered: dict[bool, str], tmp_path: Path) -> None:
    # The exporter logs to stdout, so the other process writes the body to a file.
    out = tmp_path / "metrics.txt"
    code = (
        "import pathlib, sys; from tests.golden.golden_metrics import render_golden; "
        "pathlib.Path(sys.argv[1]).write_text(render_golden()[False], encoding='utf-8')"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, env=env, check=True, cwd=ROOT)
    other = out.read_text(encoding="utf-8")
    assert other == rendered[False], _diff(rendered[False], other, GOLDEN_FILES[False])


def test_the_golden_covers_every_asic_a_firing_alert_and_normalises_only_wall_clock(rendered: dict[bool, str]) -> None:
    text = rendered[False]
    for product in ("AMD Instinct MI210", "AMD Instinct MI250X", "AMD Instinct MI300X"):
        assert f'product="{product}"' in text
    normalised = sorted({line.split(" ")[0].split("{")[0] for line in text.splitlines() if line.endswith(WALL_CLOCK)})
    assert normalised == [
        "amdgpu_exporter_collector_duration_seconds",
        "amdgpu_exporter_last_poll_timestamp_seconds",
        "amdgpu_exporter_poll_duration_seconds_bucket",
        "amdgpu_exporter_poll_duration_seconds_sum",
        "amdgpu_sample_timestamp_seconds",
        "process_cpu_seconds_total",
        "process_max_fds",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
    ]
    assert 'amdgpu_exporter_poll_duration_seconds_bucket{le="+Inf"} 2.0' in text
    assert 'amdgpu_alert_firing{alert="GpuJunctionTemperatureHigh",gpu="1",severity="warning"} 1.0' in text
    assert 'amdgpu_suggested_gfx_clock_max_hertz{gpu="1"}' in text


def test_normalise_replaces_only_the_listed_series() -> None:
    body = "\n".join(
        [
            'amdgpu_sample_timestamp_seconds{gpu="0"} 1.7e9',
            'amdgpu_exporter_poll_duration_seconds_bucket{le="0.01"} 1.0',
            'amdgpu_exporter_poll_duration_seconds_bucket{le="+Inf"} 2.0',
            "amdgpu_exporter_poll_duration_seconds_count 2.0",
            'amdgpu_power_watts{gpu="0"} 300.0',
            "# HELP amdgpu_sample_timestamp_seconds Unix time of the device's latest good sample.",
        ]
    )
    assert normalise(body).splitlines() == [
        f'amdgpu_sample_timestamp_seconds{{gpu="0"}} {WALL_CLOCK}',
        f'amdgpu_exporter_poll_duration_seconds_bucket{{le="0.01"}} {WALL_CLOCK}',
        'amdgpu_exporter_poll_duration_seconds_bucket{le="+Inf"} 2.0',
        "amdgpu_exporter_poll_duration_seconds_count 2.0",
        'amdgpu_power_watts{gpu="0"} 300.0',
        "# HELP amdgpu_sample_timestamp_seconds Unix time of the device's latest good sample.",
    ]
    with pytest.raises(ValueError):
        normalise('amdgpu_sample_timestamp_seconds{gpu="0"} NaNx')


def test_identity_labels_are_on_every_per_gpu_series_and_change_nothing_else(rendered: dict[bool, str]) -> None:
    """--metrics.identity-labels on the golden tree: every per-GPU sample carries the chosen labels of
    its device's amdgpu_device_info; without them each sample is the golden one (same series, values)."""
    from prometheus_client.parser import text_string_to_metric_families

    chosen = ("serial", "product", "pci_bus_id")

    def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
        found = []
        for family in text_string_to_metric_families(text.replace(WALL_CLOCK, "0")):
            found += [(sample.name, dict(sample.labels), sample.value) for sample in family.samples]
        return found

    golden, labelled = (
        samples(rendered[False]),
        samples(render_golden(replace(EVERYTHING, identity_labels=chosen))[False]),
    )
    identity = {
        labels["gpu"]: {name: labels[name] for name in chosen}
        for name, labels, _ in golden
        if name == "amdgpu_device_info"
    }
    assert len(identity) == 6 and all(identity.values())
    per_gpu = 0
    for (name, labels, value), (golden_name, golden_labels, golden_value) in zip(labelled, golden, strict=True):
        if "gpu" in labels and name != "amdgpu_device_info":
            assert {key: labels.pop(key) for key in chosen} == identity[labels["gpu"]], name
            per_gpu += 1
        assert (name, labels) == (golden_name, golden_labels)
        assert value == golden_value, name
    assert per_gpu > 500
