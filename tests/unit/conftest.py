"""Settings for the unit tests: temporary files in memory (hypothesis's profile: tests/conftest.py).

Their temporary files (pytest's tmp_path and every `tempfile` folder, in this process and in the
processes it starts) go to a tmpfs when the machine has one (/dev/shm): the simulator writes
thousands of small files per tree, and on a shared disk creating and removing them cost more than
the tests themselves (the 64-device budget test: 60 s on disk, 8 s on tmpfs, on the same loaded
machine). sysfs is in memory too. AMDGPU_EXPORTER_TEST_TMPDIR names another folder; empty keeps TMPDIR.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _memory_tmpdir() -> Path | None:
    chosen = os.environ.get("AMDGPU_EXPORTER_TEST_TMPDIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        return None
    return shm / f"amdgpu-exporter-tests-{os.getuid()}"


_folder = _memory_tmpdir()
if _folder is not None:
    _folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(_folder)  # the processes the tests start
    tempfile.tempdir = str(_folder)  # this process: tempfile and pytest's tmp_path
