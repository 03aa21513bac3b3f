"""The KFD's per-process files (kfd/proc/<pid>/): simulated processes that come and go.

Deterministic in (GCDs, seed, elapsed): each KFD GPU (a GCD, or a compute partition) has LANES
lanes; lane j runs one process after another, each living `life` seconds then leaving a `gap`, so
pids appear and disappear over a run. One long-lived multi-GPU process (a launcher) holds every KFD
GPU of the first package. Per process
and GPU it writes what the driver does (kfd_process.c): `pasid`, `vram_<gpu_id>` (bytes),
`sdma_<gpu_id>` (SDMA time in microseconds, cumulative), `stats_<gpu_id>/cu_occupancy` (CUs its
waves occupy) and `queues/<n>/{gpuid,type,size}`.

Files are written atomically (temp + rename) and a process that leaves has its directory renamed
away before removal, so readers see a process either whole or not at all.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.simulator.atomic_tree import AtomicTree
from exporter.simulator.fleet import GcdLayout

PROC_DIR = "devices/virtual/kfd/kfd/proc"
LANES = 3
LAUNCHER_PID = 9001
_COMMS = ("python3", "rccl-tests", "hpl")
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    comm: str
    pasid: int
    # gpu_id -> (vram bytes, sdma microseconds, cu occupancy)
    gpus: tuple[tuple[int, int, int, int], ...]

    def vram_by_gpu_id(self) -> dict[int, int]:
        return {gpu_id: vram for gpu_id, vram, _sdma, _cu in self.gpus}


def kfd_gpus(gcds: Sequence[GcdLayout]) -> list[tuple[int, int, int]]:
    """(package index, gpu_id, compute units) of every KFD GPU node: a GCD, or each partition of one."""
    result: list[tuple[int, int, int]] = []
    for gcd in gcds:
        cus = max(1, gcd.model.simd_count // 4)  # 4 SIMDs per CU
        result.extend((gcd.package_index, p.gpu_id, max(1, cus // len(gcd.partitions))) for p in gcd.partitions)
    return result


def processes_at(gcds: Sequence[GcdLayout], elapsed: float, seed: int = 0) -> tuple[SimProcess, ...]:
    """Pure: the processes alive at `elapsed` seconds, sorted by pid."""
    result: list[SimProcess] = []
    gpus = kfd_gpus(gcds)
    for index, (_package, gpu_id, cus) in enumerate(gpus):
        for lane in range(LANES):
            life = 20.0 + 10.0 * lane + (seed % 7)
            gap = 5.0 + lane
            period = life + gap
            # Lanes start staggered so processes do not all come and go together.
            t = elapsed + (index * 3.0 + lane * 7.0) % period
            generation, age = divmod(t, period)
            if age >= life:
                continue
            pid = 10000 + (index * LANES + lane) * 1000 + int(generation) % 1000
            vram = (lane + 1) * _GIB + int(min(age, 60.0) * 16 * (1 << 20))
            sdma = int(age * 1e6 * 0.05 * (lane + 1))
            cu = (index * 5 + lane * 11 + int(generation)) % cus + 1
            result.append(SimProcess(pid, _COMMS[lane % len(_COMMS)], pid % 0xFFFF, ((gpu_id, vram, sdma, cu),)))
    if gpus:
        first_package = [gpu_id for package, gpu_id, _cus in gpus if package == gpus[0][0]]
        launcher = tuple((gpu_id, 256 << 20, int(elapsed * 1e4), 0) for gpu_id in first_package)
        result.append(SimProcess(LAUNCHER_PID, "torchrun", LAUNCHER_PID, launcher))
    return tuple(sorted(result, key=lambda p: p.pid))


def process_files(process: SimProcess, node_gpu_ids: Sequence[int]) -> dict[str, str]:
    """Pure: the files of one process's kfd/proc/<pid>/ directory, relative to it.

    As the driver does, a process that opened /dev/kfd has vram_/sdma_/stats_ files for every GPU of
    the node (0 where it uses none); queues only on the GPUs it submits work to.
    """
    files = {"pasid": f"{process.pasid}\n"}
    used = {gpu_id: (vram, sdma, cu) for gpu_id, vram, sdma, cu in process.gpus}
    for gpu_id in sorted(set(node_gpu_ids) | set(used)):
        vram, sdma, cu = used.get(gpu_id, (0, 0, 0))
        files[f"vram_{gpu_id}"] = f"{vram}\n"
        files[f"sdma_{gpu_id}"] = f"{sdma}\n"
        files[f"stats_{gpu_id}/cu_occupancy"] = f"{cu}\n"
        files[f"stats_{gpu_id}/evicted_ms"] = "0\n"
    for queue, (gpu_id, *_values) in enumerate(process.gpus):
        files[f"queues/{queue}/gpuid"] = f"{gpu_id}\n"
        files[f"queues/{queue}/type"] = "0\n"  # compute
        files[f"queues/{queue}/size"] = "1048576\n"
    return files


class KfdProcWriter:
    """Keeps root/devices/virtual/kfd/kfd/proc in step with processes_at(elapsed)."""

    def __init__(self, sysfs_root: Path, gcds: Sequence[GcdLayout], seed: int = 0) -> None:
        self.proc_dir = Path(sysfs_root) / PROC_DIR
        self.gcds = list(gcds)
        self.seed = seed
        self._trees: dict[int, AtomicTree] = {}  # pid -> its folder, which skips unchanged files

    def write(self, elapsed: float) -> tuple[SimProcess, ...]:
        processes = processes_at(self.gcds, elapsed, self.seed)
        self.proc_dir.mkdir(parents=True, exist_ok=True)
        alive = {p.pid for p in processes}
        for pid in sorted(set(self._trees) - alive):
            gone = self.proc_dir / str(pid)
            hidden = self.proc_dir / f".gone-{pid}"
            if gone.exists():
                os.replace(gone, hidden)
                shutil.rmtree(hidden, ignore_errors=True)
            del self._trees[pid]
        node_gpu_ids = [gpu_id for _package, gpu_id, _cus in kfd_gpus(self.gcds)]
        for process in processes:
            files = process_files(process, node_gpu_ids)
            tree = self._trees.get(process.pid)
            if tree is None:
                # Build the directory aside and rename it in: a new process appears whole.
                staging = self.proc_dir / f".new-{process.pid}"
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir()
                tree = self._trees[process.pid] = AtomicTree(staging)
                for rel, content in files.items():
                    tree.write(rel, content)
                tree.root = self.proc_dir / str(process.pid)
                os.replace(staging, tree.root)
            for rel, content in files.items():
                tree.write(rel, content)
        return processes
