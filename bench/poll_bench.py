"""Poll-cycle cost, file reads per GCD, scaling and memory: bench.pollcost children, driven from here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.servers import REPO, child_env
from bench.syscalls import file_kind, split_cycles

BACKGROUND_FILES = ("pcie_bw",)  # read by the source's background thread, not by the poll cycle


class PollBenchError(RuntimeError):
    pass


def run_child(args: list[str], timeout: float = 1800.0) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.pollcost", *args]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=timeout, check=False)
    if done.returncode != 0:
        raise PollBenchError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.strip()[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass(slots=True)
class CycleTrace:
    """What one kind of cycle (hot or full) asks of the kernel, per GCD and per cycle."""

    mode: str
    gcds: int
    cycles: int
    # file name -> files read per GCD per cycle (opened, or read through a descriptor kept open)
    opens_by_kind: dict[str, float] = field(default_factory=dict)
    reads_per_gcd: float = 0.0  # read() calls on device files per GCD per cycle
    syscalls_per_cycle: dict[str, float] = field(default_factory=dict)  # the strace -c view, per cycle
    background_opens: dict[str, float] = field(default_factory=dict)  # e.g. pcie_bw, per GCD per cycle
    floor_paths: list[str] = field(default_factory=list)  # the files one cycle read, in order

    @property
    def gpu_metrics_per_gcd(self) -> float:
        return self.opens_by_kind.get("gpu_metrics", 0.0)

    @property
    def other_files_per_gcd(self) -> float:
        return sum(v for k, v in self.opens_by_kind.items() if k != "gpu_metrics")

    @property
    def syscalls_total_per_cycle(self) -> float:
        return sum(self.syscalls_per_cycle.values())


def trace_cycles(sysfs: Path, mode: str, cycles: int, log_dir: Path, limit: int = 0) -> CycleTrace:
    strace = shutil.which("strace")
    if strace is None:
        raise PollBenchError("strace is not installed (Debian package strace; `make bench` installs it)")
    out = log_dir / f"strace-{mode}.txt"
    argv = [
        strace,
        "-f",
        "-qq",
        "-y",
        "-s",
        "0",
        "-o",
        str(out),
        sys.executable,
        "-m",
        "bench.pollcost",
        "trace",
        f"--sysfs={sysfs}",
        f"--mode={mode}",
        f"--cycles={cycles}",
        f"--limit={limit}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=600, check=False)
    if done.returncode != 0:
        raise PollBenchError(f"strace run exited {done.returncode}:\n{done.stderr.strip()[-3000:]}")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    with open(out, encoding="utf-8", errors="replace") as handle:
        traced = [c for c in split_cycles(handle) if c.cycle >= 0]
    if len(traced) != cycles:
        raise PollBenchError(f"expected {cycles} traced cycles in {out}, found {len(traced)}")
    return summarise(traced, mode, int(info["gcds"]), str(sysfs))


def summarise(traced: list[Any], mode: str, gcds: int, root: str) -> CycleTrace:
    root = root.rstrip("/") + "/"
    cycles = len(traced)
    opens: Counter[str] = Counter()
    background: Counter[str] = Counter()
    syscalls: Counter[str] = Counter()
    reads = 0
    for cycle in traced:
        syscalls.update(cycle.syscalls)
        for path in cycle.touched:
            if not path.startswith(root):
                continue
            kind = file_kind(path)
            (background if kind in BACKGROUND_FILES else opens)[kind] += 1
        reads += sum(n for path, n in cycle.reads.items() if file_kind(path) not in BACKGROUND_FILES)
    per = float(gcds * cycles)
    last = traced[-1]
    return CycleTrace(
        mode=mode,
        gcds=gcds,
        cycles=cycles,
        opens_by_kind={k: v / per for k, v in sorted(opens.items())},
        reads_per_gcd=reads / per,
        syscalls_per_cycle={k: v / cycles for k, v in syscalls.most_common()},
        background_opens={k: v / per for k, v in sorted(background.items())},
        floor_paths=[p for p in last.touched if p.startswith(root) and file_kind(p) not in BACKGROUND_FILES],
    )


def measure_cycles(
    sysfs: Path, mode: str, cycles: int, floor_paths: list[str] | None, work: Path, limit: int = 0, repeats: int = 3
) -> dict[str, Any]:
    """Best of `repeats` child runs, figure by figure: other work on the machine only ever adds time."""
    args = ["measure", f"--sysfs={sysfs}", f"--mode={mode}", f"--cycles={cycles}", f"--limit={limit}"]
    if floor_paths is not None:
        floor_file = work / f"floor-{mode}-{limit}.json"
        floor_file.write_text(json.dumps(floor_paths))
        args.append(f"--floor={floor_file}")
    runs = [run_child(args) for _ in range(max(1, repeats))]
    best = dict(runs[0])
    for key in ("cpu_per_cycle", "wall_per_cycle", "floor_cpu_per_cycle"):
        if key in best:
            best[key] = min(run[key] for run in runs)
    best["repeats"] = len(runs)
    return best


def soak(sysfs: Path, warmup: int, cycles: int, every: int) -> dict[str, Any]:
    args = ["soak", f"--sysfs={sysfs}", f"--warmup={warmup}", f"--cycles={cycles}", f"--every={every}"]
    return run_child(args, timeout=7200)
