"""Least privilege, shown on a real process: the daemon as an unprivileged user (the systemd
unit's DynamicUser in video and render) on a simulator tree with the driver's file modes serves
what root serves, and under strace it never opens anything below the sysfs root for writing."""

from __future__ import annotations

import contextlib
import grp
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Simulator
from tests.harness import free_port, start_daemon, stop, wait_for_cycles
from tests.realtools import require_root, require_tool

pytestmark = pytest.mark.integration

NOBODY = 65534
# Attributes the driver creates writable by root (0644); everything else it creates 0444, and the
# partition configuration folder 0400 (reference: amdgpu-driver-interface.md, partitions-and-modern-tools.md).
_WRITABLE = re.compile(
    r"(^pp_|^power_dpm_|^current_(compute|memory)_partition$|^fan\d_|^pwm\d|^power\d_cap$|^gpu_reset)"
)


def _driver_modes(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            if "compute_partition_config" in folder:
                mode = 0o400
            elif _WRITABLE.search(name):
                mode = 0o644
            else:
                mode = 0o444
            os.chmod(path, mode)


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    require_root()
    # Not under pytest's tmp_path: that is 0700, and the unprivileged daemon must reach the tree.
    top = Path(tempfile.mkdtemp(prefix="amdgpu-exporter-lp-"))
    top.chmod(0o755)
    root = top / "sys"
    simulator = Simulator(root, fleet="1xMI210,1xMI250X,1xMI300X", scenario="training", seed=5)
    simulator.write_tree()
    simulator.tick(10.0)
    _driver_modes(root)
    yield root
    shutil.rmtree(top, ignore_errors=True)


def _gpu_groups() -> list[int]:
    found = []
    for name in ("video", "render"):
        with contextlib.suppress(KeyError):
            found.append(grp.getgrnam(name).gr_gid)
    return found


def _run(argv_prefix: list[str], tree: Path) -> tuple[set[tuple[str, tuple]], str]:
    """Start the daemon (after argv_prefix), wait for two poll cycles, return its series and log."""
    # Its own session: under strace, SIGTERM to strace only detaches it and the traced daemon would
    # live on, so the whole group is stopped. strace forks the daemon: the port is given, not retried.
    daemon = start_daemon(
        Path(tempfile.mkdtemp(prefix="amdgpu-exporter-lp-")),
        f"--path.sysfs={tree}",
        "--source=sysfs",
        "--interval=0.5s",
        wrapper=argv_prefix,
        port=free_port(),
        ready=False,
        start_new_session=True,
    )
    process, log = daemon.process, daemon.log
    try:
        daemon.wait_ready()
        wait_for_cycles(daemon.port, 4)  # a few cycles, slow-schedule reads included
        text = daemon.scrape_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        stop(process)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the group's other members (the traced daemon) end too
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    series = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("amdgpu_") and not s.name.startswith("amdgpu_exporter_poll_duration")
    }
    out = log.read_text()
    shutil.rmtree(log.parent, ignore_errors=True)
    return series, out


def test_unprivileged_user_in_video_and_render_serves_what_root_serves(tree: Path) -> None:
    setpriv = require_tool("setpriv")
    groups = _gpu_groups() or [44]
    as_nobody = [
        setpriv,
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--groups=" + ",".join(map(str, groups)),
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    root_series, _ = _run([], tree)
    nobody_series, log = _run(as_nobody, tree)
    ups = {labels: name for name, labels in nobody_series if name == "amdgpu_up"}
    assert len(ups) == 4  # 1 MI210 + 2 MI250X GCDs + 1 MI300X
    assert nobody_series == root_series, sorted(root_series ^ nobody_series)[:10]
    assert "Traceback" not in log and "PermissionError" not in log


def test_never_opens_anything_under_the_sysfs_root_for_writing(tree: Path) -> None:
    strace = require_tool("strace")
    trace = Path(tempfile.mkstemp(prefix="amdgpu-exporter-strace-")[1])
    series, log = _run([strace, "-f", "-qq", "-e", "trace=%file", "-e", "signal=none", "-o", str(trace), "--"], tree)
    assert any(name == "amdgpu_up" for name, _ in series), log
    lines = trace.read_text(errors="replace").splitlines()
    trace.unlink()
    under = [line for line in lines if f'"{tree}' in line]
    assert len(under) > 100, "strace saw no sysfs reads: the test is not looking where the daemon reads"
    writes = [
        line
        for line in under
        if re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", line)
        or re.match(r"^\d+\s+(mkdir|unlink|rename|rmdir|chmod|chown|truncate|link|symlink|creat|utime)", line)
    ]
    assert not writes, writes[:5]
