"""Fixtures the integration tests share."""

from __future__ import annotations

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
