"""Shared fixture: the cached chroots (built on first use; a build failure fails, never skips)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracles.chroots import SID, TRIXIE, ChrootBuildError, ensure_chroot, ensure_fake_libdrm
from tests.oracles.runner import Chroot
from tests.realtools import require_root, require_tool


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first oracle test builds the chroots from the mirror (about 1.5 min on a busy machine, more
    on a slow mirror): more room than the suite's per-test timeout."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.timeout(600))


@pytest.fixture(scope="session")
def chroots() -> dict[str, Chroot]:
    require_root()
    require_tool("mmdebstrap")
    require_tool("gcc")
    try:
        trixie = ensure_chroot(TRIXIE)
        sid = ensure_chroot(SID)
        fake_libdrm = ensure_fake_libdrm(sid)
    except ChrootBuildError as error:
        pytest.fail(str(error), pytrace=False)
    return {"trixie": Chroot(trixie), "sid": Chroot(sid, fake_libdrm)}
