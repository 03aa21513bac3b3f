"""Our health signals against the modern AMD tools reading the same faulted, frozen tree.

A simulated MI300X and MI250X mid-fault (ECC errors on two blocks' counters, pages found bad and
being retired, CPER records of every severity in the MI300X's debugfs ring) are read by our daemon
(a real process, `--source sysfs`) and, in chroots with the tree as /sys (tests/oracles/runner.py),
by amd-smi 10.1 (`bad-pages`, `metric --ecc --ecc-blocks`, `ras --cper`), its amdsmi module (the
bad-page threshold, which it takes from debugfs) and rocm-smi 6.1.2 / 6.4.1 (`--showrasinfo all`,
`--showretiredpages`, `--showpendingpages`, text only: they print no JSON for these). Each value a
tool reports for these signals must equal ours. Under CI=true a missing chroot or tool fails.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from exporter.simulator import Simulator
from tests.harness import Series, scrape, value
from tests.integration.test_crosscheck_real_tools import RAS_ROW, page_statuses, per_gpu
from tests.oracles.runner import Chroot, parse_json_output, run_json, run_tool
from tests.realtools import start_exporter, wait_ready

pytestmark = pytest.mark.integration

FLEET = "1xMI300X:gpu_metrics=1.5,1xMI250X"
FAULTS = (
    "bad_pages.0+bad_pages.1+ecc_ue.0+ecc_ce.1+ecc_de.0+cper_fatal.0+cper_nonfatal.0+cper_corrected.0"
    ",fault_at=2,fault_for=10"
)
AMD_SMI_SEVERITY = {"FATAL": "fatal", "NONFATAL-UNCORRECTED": "nonfatal", "NONFATAL-CORRECTED": "corrected"}
AMD_SMI_ECC_TYPES = {"correctable_count": "correctable", "uncorrectable_count": "uncorrectable"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oracle-health") / "sys"
    simulator = Simulator(root, fleet=FLEET, scenario=f"training:faults={FAULTS}", seed=11)
    simulator.write_tree()
    simulator.tick(8.0)  # mid-fault: pages pending and retired, records in the ring; then frozen
    return root


@pytest.fixture(scope="module")
def ours(tree: Path) -> Iterator[Series]:
    proc, port = start_exporter(f"--path.sysfs={tree}", "--source=sysfs", "--interval=200ms")
    try:
        wait_ready(port, proc)
        yield scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.terminate()
        proc.wait(10)


def _gpu_of_bdf(series: Series) -> dict[str, str]:
    return {dict(labels)["pci_bus_id"]: dict(labels)["gpu"] for name, labels in series if name == "amdgpu_device_info"}


def _amd_smi_gpus(chroot: Chroot, tree: Path, ours: Series) -> dict[int, str]:
    """amd-smi's GPU index -> our `gpu` label, through the PCI bus id."""
    static = run_json(chroot, tree, ["amd-smi", "static", "--bus", "--json"])
    gpu = _gpu_of_bdf(ours)
    return {entry["gpu"]: gpu[entry["bus"]["bdf"].lower()] for entry in static["gpu_data"]}


def _pages(listed: Any) -> list[Any]:
    """amd-smi's page list: a list, one page as a bare object, or a sentence when there are none."""
    return listed if isinstance(listed, list) else [listed] if isinstance(listed, dict) else []


def test_amd_smi_bad_pages_and_threshold_equal_ours(chroots: dict[str, Chroot], tree: Path, ours: Series) -> None:
    sid = chroots["sid"]
    gpus = _amd_smi_gpus(sid, tree, ours)
    report: list[dict[str, Any]] = run_json(sid, tree, ["amd-smi", "bad-pages", "--json"])
    assert len(report) == len(gpus)
    for entry in report:
        gpu = gpus[entry["gpu"]]
        retired, pending = (_pages(entry[key]) for key in ("retired", "pending"))
        assert len(retired) == value(ours, "amdgpu_ras_retired_pages", gpu=gpu) > 0, entry["gpu"]
        assert len(pending) == value(ours, "amdgpu_ras_pending_pages", gpu=gpu), entry["gpu"]
    probe = (
        "import amdsmi as s\ns.amdsmi_init(s.AmdSmiInitFlags.INIT_AMD_GPUS)\n"
        "print([s.amdsmi_get_gpu_bad_page_threshold(h) for h in s.amdsmi_get_processor_handles()])\n"
    )
    result = run_tool(sid, tree, ["python3", "-c", probe])
    assert result.returncode == 0, result.stderr[-1500:]
    thresholds = [int(n) for n in re.findall(r"[0-9]+", result.stdout.strip().splitlines()[-1])]
    assert [value(ours, "amdgpu_ras_bad_page_threshold_pages", gpu=gpus[i]) for i in range(len(gpus))] == thresholds
    assert sorted(thresholds) == [655, 655, 1966]  # 64 GiB (each MI250X die) and 192 GiB over 100 MiB


def test_amd_smi_ecc_per_block_equals_ours(chroots: dict[str, Chroot], tree: Path, ours: Series) -> None:
    sid = chroots["sid"]
    gpus = _amd_smi_gpus(sid, tree, ours)
    report = run_json(sid, tree, ["amd-smi", "metric", "--ecc", "--ecc-blocks", "--json"])
    checked = Counter[str]()
    for entry in report["gpu_data"]:
        gpu = gpus[entry["gpu"]]
        for block, counts in entry["ecc_blocks"].items():
            for key, kind in AMD_SMI_ECC_TYPES.items():
                ours_value = value(ours, "amdgpu_ecc_errors_total", gpu=gpu, block=block.lower(), type=kind)
                assert ours_value == counts[key], (gpu, block, kind)
                checked[kind] += int(counts[key])
            # amd-smi reads the "de:" line where the kernel prints one; we export deferred only then
            ours_deferred = value(ours, "amdgpu_ecc_errors_total", gpu=gpu, block=block.lower(), type="deferred")
            assert (ours_deferred or 0) == counts["deferred_count"], (gpu, block)
            checked["deferred"] += int(counts["deferred_count"])
    assert all(checked[kind] > 0 for kind in ("correctable", "uncorrectable", "deferred")), checked


def test_amd_smi_cper_records_equal_ours(chroots: dict[str, Chroot], tree: Path, ours: Series) -> None:
    sid = chroots["sid"]
    gpus = _amd_smi_gpus(sid, tree, ours)
    mi300x = _gpu_of_bdf(ours)[_mi300x_bdf(ours)]
    index = next(i for i, gpu in gpus.items() if gpu == mi300x)
    # asked of the MI250X, whose kernel has no CPER ring, the command fails (NOT_SUPPORTED) for all
    result = run_tool(sid, tree, ["amd-smi", "ras", "--cper", "-g", str(index), "--json"])
    assert result.returncode == 0, result.stderr[-1500:]
    records: list[dict[str, Any]] = parse_json_output(result.stdout)
    by_gpu: dict[str, list[tuple[str, float]]] = {}
    for record in records:
        when = datetime.strptime(record["timestamp"], "%Y/%m/%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        by_gpu.setdefault(gpus[record["gpu"]], []).append((AMD_SMI_SEVERITY[record["severity"]], when))
    assert set(by_gpu) == {mi300x}
    assert not any(name == "amdgpu_cper_records" and dict(labels)["gpu"] != mi300x for name, labels in ours)
    for gpu, found in by_gpu.items():
        counts = Counter(severity for severity, _ in found)
        for severity in AMD_SMI_SEVERITY.values():
            assert value(ours, "amdgpu_cper_records", gpu=gpu, severity=severity) == counts[severity] == 2
            newest = max(when for sev, when in found if sev == severity)
            assert value(ours, "amdgpu_cper_newest_record_timestamp_seconds", gpu=gpu, severity=severity) == newest


def _mi300x_bdf(ours: Series) -> str:
    return next(
        dict(labels)["pci_bus_id"]
        for name, labels in ours
        if name == "amdgpu_device_info" and "MI300X" in dict(labels)["product"]
    )


@pytest.mark.parametrize("release", ["trixie", "sid"])
def test_rocm_smi_ras_info_and_pages_equal_ours(
    chroots: dict[str, Chroot], tree: Path, ours: Series, release: str
) -> None:
    chroot = chroots[release]
    result = run_tool(chroot, tree, ["rocm-smi", "--showrasinfo", "all"])
    assert result.returncode == 0, result.stderr[-1500:]
    rows = 0
    for gpu, lines in per_gpu(result.stdout).items():
        for line in lines:
            match = RAS_ROW.match(line)
            if match:
                block, correctable, uncorrectable = match.group(1).lower(), int(match.group(2)), int(match.group(3))
                assert value(ours, "amdgpu_ecc_errors_total", gpu=gpu, block=block, type="correctable") == correctable
                assert (
                    value(ours, "amdgpu_ecc_errors_total", gpu=gpu, block=block, type="uncorrectable") == uncorrectable
                )
                rows += 1
    assert rows >= 14  # every RAS block of both GPUs
    result = run_tool(chroot, tree, ["rocm-smi", "--showretiredpages", "--showpendingpages"])
    assert result.returncode == 0, result.stderr[-1500:]
    sections = per_gpu(result.stdout)
    for gpu in _gpu_of_bdf(ours).values():
        statuses = page_statuses(sections.get(gpu, []))
        # --showretiredpages lists the reserved pages, --showpendingpages the pending ones
        assert statuses["reserved"] == value(ours, "amdgpu_ras_retired_pages", gpu=gpu), (release, gpu)
        assert statuses["pending"] == value(ours, "amdgpu_ras_pending_pages", gpu=gpu), (release, gpu)
