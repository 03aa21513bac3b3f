"""Where the daemon's CPU goes, in place: the real daemon run in this process on a tree, each stage's
CPU (time.thread_time, inclusive) and each thread's (from /proc/self/task), in ms per second.

    python -m bench.stagecost --seconds 30 -- --path.sysfs=TREE --source=sysfs --web.listen-address=127.0.0.1:0

`amdgpu-exporter simulate --path.sysfs DIR --fleet 8xMI250X` writes a tree. The stages are wrapped
(one thread_time pair per call, about a microsecond: fine for calls made at most a few hundred times
a second); the figures are the daemon's own calls, not a copy of them. Not scraped.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

STAGES = (
    "exporter.sources.sysfs.source:SysfsSource.read",
    "exporter.sources.sysfs.source:SysfsSource._slow_layer",
    "exporter.pipeline.poller:Poller._record_result",
    "exporter.pipeline.poller:Poller._snapshot",
    "exporter.cycle:Pipeline.on_snapshot",
    "exporter.cycle:Pipeline._evaluate_health",
    "exporter.cycle:Pipeline._account",
    "exporter.cycle:enrich",
    "exporter.cycle:evaluate",
    "exporter.cycle:read_process_stats",
    "exporter.cycle:render",
    "exporter.pipeline.sampler:Sampler.sample_once",
    "exporter.pipeline.sampler:Sampler.windows",
    "exporter.pipeline.sampler:Sampler.track",
)

_cpu: dict[str, float] = collections.defaultdict(float)
_calls: collections.Counter[str] = collections.Counter()


def _wrap(target: str) -> None:
    module_name, attr = target.split(":")
    module = importlib.import_module(module_name)
    owner: Any = module
    name = attr
    if "." in attr:
        cls, name = attr.split(".")
        owner = getattr(module, cls)
    original: Callable[..., Any] = getattr(owner, name)
    key = f"{module_name.rsplit('.', 1)[-1]}:{attr}"

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            _cpu[key] += time.thread_time() - started
            _calls[key] += 1

    setattr(owner, name, timed)


def _thread_cpu() -> dict[int, tuple[str, int]]:
    """native thread id -> (thread name, utime + stime in clock ticks)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (names.get(int(tid), "?"), int(fields[11]) + int(fields[12]))
    return out


def _report(settle: float, seconds: float) -> None:
    time.sleep(settle)
    _cpu.clear()
    _calls.clear()
    threads0, cpu0, wall0 = _thread_cpu(), time.process_time(), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    ticks = os.sysconf("SC_CLK_TCK")
    lines = [f"process: {cpu * 1e3 / wall:.2f} ms/s over {wall:.0f} s (load average {os.getloadavg()[0]:.2f})"]
    for key, spent in sorted(_cpu.items(), key=lambda item: -item[1]):
        per_call = spent * 1e6 / max(1, _calls[key])
        lines.append(f"  {key:45} {spent * 1e3 / wall:7.2f} ms/s {_calls[key] / wall:7.1f}/s {per_call:8.0f} us/call")
    by_thread: collections.Counter[str] = collections.Counter()
    for tid, (name, used) in _thread_cpu().items():
        by_thread[name.split(":")[0].rstrip("0123456789-")] += used - threads0.get(tid, (name, 0))[1]
    for name, used in by_thread.most_common():
        if used:
            lines.append(f"  thread {name:38} {used * 1e3 / ticks / wall:7.2f} ms/s")
    print("\n".join(lines), file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stagecost", description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds after start before measuring")
    parser.add_argument("daemon", nargs=argparse.REMAINDER, help="the daemon's flags, after --")
    args = parser.parse_args(argv)
    for target in STAGES:
        _wrap(target)
    threading.Thread(target=_report, args=(args.settle, args.seconds), daemon=True).start()
    from exporter.cli import main as daemon_main

    return daemon_main([a for a in args.daemon if a != "--"])


if __name__ == "__main__":
    raise SystemExit(main())
