"""Fixtures the integration tests share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.release import build_wheel, download_runtime


@pytest.fixture(scope="session")
def exporter_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exporter's wheel, built once per session for every test that installs it."""
    return build_wheel(tmp_path_factory.mktemp("wheel-build"))


@pytest.fixture(scope="session")
def runtime_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The locked runtime's wheels, fetched once per session: the venvs made from them fetch nothing."""
    return download_runtime(tmp_path_factory.mktemp("runtime-wheels"))


@pytest.fixture(scope="session")
def install_root(runtime_wheels: Path, exporter_wheel: Path) -> Iterator[Path]:
    """A world-readable folder holding the release installed at the systemd unit's ExecStart venv
    (test_systemd_unit.install_into), made once per session: test_systemd_unit.py and
    test_systemd_debugfs_dropin.py only read it (each made its own, ~15-50 s)."""
    from tests.integration.test_systemd_unit import install_into

    root = Path(tempfile.mkdtemp(prefix="amdgpu-exporter-systemd-"))
    try:
        root.chmod(0o755)
        install_into(root, runtime_wheels, exporter_wheel)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
