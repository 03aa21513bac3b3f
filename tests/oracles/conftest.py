"""Shared fixture: the cached chroots (built on first use; a build failure fails, never skips)."""

from __future__ import annotations

import pytest

from tests.oracles.chroots import SID, TRIXIE, ChrootBuildError, ensure_chroot, ensure_fake_libdrm
from tests.oracles.runner import Chroot
from tests.realtools import require_root, require_tool


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
