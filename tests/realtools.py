"""Helpers for tests that run real tools (rocm-smi, librocm_smi64, node_exporter, prometheus ...).

A missing tool skips the test on a developer machine but FAILS it in CI (CI=true), so CI can
never pass by quietly testing nothing.

librocm_smi64 hard-codes /sys, so tools that use it run in a private mount namespace with the
simulated tree bind-mounted over /sys and a private tmpfs on /dev/shm (the library keeps
process-shared mutexes there; a private one means no stale lock from another test can block it).
Needs root (CAP_SYS_ADMIN) for unshare/mount.

Starting the daemon, ports, scrapes and waits live in tests/harness.py; the names re-exported at the
end keep older imports working.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROCM_SMI_LIBRARY = "/usr/lib/librocm_smi64.so.1"
NODE_EXPORTER = "prometheus-node-exporter"

# $0 is the tree, "$@" the command: bind the tree over /sys, give the library its own /dev/shm
_NAMESPACE_SCRIPT = 'mount --bind "$0" /sys && mount -t tmpfs tmpfs /dev/shm && exec "$@"'


def _missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (required in CI)")
    pytest.skip(message)


def require_tool(name: str, path: str | None = None) -> str:
    """Path of an executable; skip when missing, fail under CI=true.

    An absolute path is taken as is; otherwise the project's venv (PyPI-installed tools) is
    searched first, then PATH; `path` pins the search to one folder.
    """
    if os.path.isabs(name):
        found = name if os.access(name, os.X_OK) else None
    elif path:
        found = shutil.which(name, path=path)
    else:
        found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        _missing(f"{name} is not installed (see DEBIAN_TEST_PACKAGES in the Makefile and the test extras)")
    assert found is not None
    return found


def require_file(path: str, what: str) -> str:
    if not os.path.exists(path):
        _missing(f"{what} ({path}) is not installed")
    return path


def require_root() -> None:
    if os.geteuid() != 0:
        _missing("running tools in a private mount namespace needs root")


def namespace_argv(sys_dir: Path, argv: Sequence[str]) -> list[str]:
    """The command line that runs argv with sys_dir mounted over /sys in a private namespace."""
    require_root()
    unshare = require_tool("unshare")
    return [unshare, "-m", "--propagation", "private", "sh", "-c", _NAMESPACE_SCRIPT, str(sys_dir), *argv]


def run_in_sysfs_namespace(
    sys_dir: Path, argv: list[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv to completion with sys_dir as /sys; text output captured."""
    return subprocess.run(
        namespace_argv(sys_dir, argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else None,
        check=False,
    )


def start_in_sysfs_namespace(
    sys_dir: Path, argv: list[str], env: Mapping[str, str] | None = None, **popen_kwargs: object
) -> subprocess.Popen[str]:
    """Start a long-running argv (a server) with sys_dir as /sys. The caller stops it."""
    kwargs: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    kwargs.update(popen_kwargs)
    return subprocess.Popen(  # type: ignore[call-overload]
        namespace_argv(sys_dir, argv), env=dict(env) if env is not None else None, **kwargs
    )


# The daemon, ports, scrapes and waits: tests/harness.py (names kept here for the files that import them from here).
from tests.harness import (  # noqa: E402
    BIND_FAILURES,
    EXPORTER,
    free_port,
    listens_on,
    poll_cycles,
    start_exporter,
    start_listening,
    stop,
    wait_for_cycles,
    wait_for_port,
    wait_ready,
    wait_until,
)

__all__ = [
    "BIND_FAILURES",
    "EXPORTER",
    "NODE_EXPORTER",
    "ROCM_SMI_LIBRARY",
    "free_port",
    "listens_on",
    "namespace_argv",
    "poll_cycles",
    "require_file",
    "require_root",
    "require_tool",
    "run_in_sysfs_namespace",
    "start_exporter",
    "start_in_sysfs_namespace",
    "start_listening",
    "stop",
    "wait_for_cycles",
    "wait_for_port",
    "wait_ready",
    "wait_until",
]
