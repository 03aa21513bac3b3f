"""Issue 31 case 11: `doctor` says when the debugfs signals (CPER records, the driver's exact bad-page
threshold) cannot be read and why: not mounted, root only (the systemd unit's DynamicUser), or readable."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.integration.test_doctor_cli import Host, doctor, findings, make_host, one
from tests.realtools import require_root, require_tool

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> Iterator[Host]:
    made = make_host("MI300X")
    try:
        yield made
    finally:
        shutil.rmtree(made.root, ignore_errors=True)


def test_readable_debugfs_is_ok_and_says_what_it_holds(host: Host) -> None:
    require_root()
    finding = one(findings(doctor(host, "--json")), "debugfs")
    assert finding["status"] == "ok", finding
    assert "bad-page threshold on 1 of 1, a CPER ring on 1 of 1" in finding["value"]
    assert "deploy/systemd/debugfs.conf" in finding["value"]  # root: the service is another user


def test_root_only_debugfs_names_the_drop_in(host: Host) -> None:
    require_root()
    setpriv = require_tool("setpriv")
    os.chmod(host.sysfs / "kernel" / "debug", 0o700)  # as the kernel mounts it
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    finding = one(findings(doctor(host, "--json", prefix=prefix)), "debugfs")
    assert finding["status"] == "warn", finding
    assert "not readable by nobody (mode 0700, root only)" in finding["value"]
    assert "the cper_* checks are silent" in finding["value"]
    assert "/etc/systemd/system/amdgpu-exporter.service.d/debugfs.conf" in finding["advice"]
    text = doctor(host, prefix=prefix).stdout
    assert "debugfs" in text and "→ run as root; for the systemd service install its drop-in" in text


def test_unmounted_debugfs_says_so(host: Host) -> None:
    shutil.rmtree(host.sysfs / "kernel" / "debug")
    (host.sysfs / "kernel" / "debug").mkdir()  # the mount point, empty
    finding = one(findings(doctor(host, "--json")), "debugfs")
    assert finding["status"] == "warn" and finding["value"].startswith("not mounted at ")
    assert finding["advice"].startswith("mount -t debugfs")
