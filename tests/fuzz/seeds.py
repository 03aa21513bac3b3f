"""Seed corpus for the fuzz target: real gpu_metrics tables and text files from a simulated tree."""

from __future__ import annotations

import sys
from pathlib import Path

from exporter.simulator import Simulator

TEXT_FILES = ("gpu_busy_percent", "mem_info_vram_used", "pp_dpm_sclk", "pp_dpm_pcie", "current_link_speed",
              "current_link_width", "unique_id", "vendor", "pcie_bw", "uevent", "ras/umc_err_count",
              "ras/gpu_vram_bad_pages", "aer_dev_fatal", "aer_dev_correctable", "devcoredump/data")  # fmt: skip


def write_seeds(corpus: Path, work: Path) -> int:
    """Seeds: selector byte 0 + a gpu_metrics blob per fleet model; selector 1 + a board/ temperature
    table (MI355X); selectors 3, 7, 11, ... + text files."""
    corpus.mkdir(parents=True, exist_ok=True)
    root = work / "sys"
    fleet = "1xMI210,1xMI250X,1xMI300X,1xMI300X:gpu_metrics=1.5,1xMI300X:gpu_metrics=1.4,1xMI355X"
    # faults mid-way on the MI300X (device 2): bad pages, AER counts, a coredump, CPER records
    faults = "bad_pages.2+aer_fatal.2+aer_correctable.2+reset.2+cper_fatal.2+cper_corrected.2,fault_at=0,fault_for=20"
    simulator = Simulator(root, fleet=fleet, scenario=f"idle:faults={faults}", seed=1)
    simulator.write_tree()
    simulator.tick(6.0)
    count = 0
    for device in simulator.truth():
        dev = Path(device.identity.device_dir)
        blob = dev / "gpu_metrics"
        if blob.exists():
            (corpus / f"metrics-{count}").write_bytes(b"\x00" + blob.read_bytes())
            count += 1
        for table in ("gpuboard_temp", "baseboard_temp"):
            if (dev / "board" / table).exists():
                (corpus / f"board-{count}").write_bytes(b"\x01" + (dev / "board" / table).read_bytes())
                count += 1
        for index, name in enumerate(TEXT_FILES):
            path = dev / name
            if path.is_file():
                (corpus / f"text-{count}").write_bytes(bytes([3 + 4 * index]) + path.read_bytes())
                count += 1
    for ring in sorted(root.glob("kernel/debug/dri/*/amdgpu_ring_cper")):
        (corpus / f"cper-{count}").write_bytes(b"\x02" + ring.read_bytes())
        count += 1
    return count


if __name__ == "__main__":
    print(write_seeds(Path(sys.argv[1]), Path(sys.argv[2])))
