"""`amdgpu-exporter doctor` as a real process on simulator trees, healthy and with faults: a hung
device, missing files and nodes, a degraded PCIe link, firmware that differs from its siblings,
HSA_OVERRIDE_GFX_VERSION set, an old kernel, and an unprivileged user."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.simulator import Simulator
from tests.faulty_tree import degrade_pcie, device_dir, hang_device, release, remove, write_tree
from tests.realtools import EXPORTER, require_tool

pytestmark = pytest.mark.integration


@dataclass
class Host:
    """Folders standing for /sys, /proc, /dev and /opt of one simulated host."""

    root: Path
    simulator: Simulator

    @property
    def sysfs(self) -> Path:
        return self.root / "sys"

    def args(self) -> list[str]:
        return [
            f"--path.sysfs={self.sysfs}",
            f"--path.procfs={self.root / 'proc'}",
            f"--path.dev={self.root / 'dev'}",
            f"--path.rocm={self.root / 'opt'}",
        ]


def make_host(fleet: str | None = None) -> Host:
    # World-readable (not pytest's 0700 tmp_path) so a test can run the doctor as nobody.
    root = Path(tempfile.mkdtemp(prefix="doctor-"))
    root.chmod(0o755)
    simulator = write_tree(root / "sys") if fleet is None else write_tree(root / "sys", fleet=fleet)
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text("6.8.0-45-generic\n")
    (root / "dev" / "dri").mkdir(parents=True)
    (root / "dev" / "kfd").write_text("")
    for node in (root / "sys" / "class" / "drm").iterdir():
        if node.name.startswith("renderD"):
            (root / "dev" / "dri" / node.name).write_text("")
    (root / "opt" / "rocm-6.2.1" / ".info").mkdir(parents=True)
    (root / "opt" / "rocm-6.2.1" / ".info" / "version").write_text("6.2.1-112\n")
    return Host(root, simulator)


@pytest.fixture
def host() -> Iterator[Host]:
    made = make_host()
    try:
        yield made
    finally:
        shutil.rmtree(made.root, ignore_errors=True)


def doctor(host: Host, *extra: str, env: dict[str, str] | None = None, prefix: list[str] | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HSA_", "HIP_", "ROCR_"))}
    environ.update(env or {})
    return subprocess.run(
        [*(prefix or []), EXPORTER, "doctor", *host.args(), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )


def findings(result: subprocess.CompletedProcess[str]) -> list[dict]:
    return json.loads(result.stdout)["findings"]


def one(items: list[dict], check: str, gpu: int | None = None) -> dict:
    matches = [f for f in items if f["check"] == check and f["gpu"] == gpu]
    assert len(matches) == 1, (check, gpu, matches)
    return matches[0]


def test_healthy_host_is_all_ok(host: Host) -> None:
    result = doctor(host, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    items = findings(result)
    statuses = {(f["check"], f["gpu"]): f["status"] for f in items}
    bad = {key: status for key, status in statuses.items() if status != "ok"}
    assert bad == {}, bad
    assert one(items, "kernel")["value"] == "6.8.0-45-generic"
    assert one(items, "amdgpu driver")["value"].endswith("initstate live")
    assert one(items, "ppfeaturemask")["value"].startswith("0xfff7bfff")
    assert "6.2.1-112" in one(items, "ROCm")["value"]
    assert one(items, "devices")["value"] == "7 found"
    for gpu in range(7):
        assert one(items, "answers", gpu)["status"] == "ok"
        assert one(items, "PCIe width", gpu)["value"] == "x16"
        assert one(items, "vbios", gpu)["value"].startswith("113-")
    assert "same as its 3 siblings" in one(items, "firmware", 2)["value"]  # 2 MI250X packages = 4 GCDs
    text = doctor(host)
    assert text.returncode == 0 and text.stdout.rstrip().endswith("0 fail")
    assert all(
        line.split()[0] in ("ok", "GPU", "amdgpu-exporter") or "ok," in line for line in text.stdout.splitlines()
    )


def test_hung_device_fails_promptly(host: Host) -> None:
    hung = hang_device(host.simulator, 4)
    try:
        # The hung read never ends while the pipe is held: a doctor that waited for it would not exit
        # at all (doctor()'s 60 s limit only ends such a run).
        result = doctor(host, "--json", "--read-timeout=500ms")
    finally:
        release(hung)
    assert result.returncode == 1
    answers = one(findings(result), "answers", 4)
    assert answers["status"] == "fail" and "no answer within 0.5 s" in answers["value"]
    assert "hung" in answers["advice"]
    assert all(one(findings(result), "answers", gpu)["status"] == "ok" for gpu in range(7) if gpu != 4)


def test_degraded_pcie_link(host: Host) -> None:
    degrade_pcie(host.simulator, 1, width=8)  # narrow: fail
    degrade_pcie(host.simulator, 2, speed_gts=2.5)  # slow: warn (can be power saving)
    result = doctor(host, "--json")
    assert result.returncode == 1
    items = findings(result)
    width = one(items, "PCIe width", 1)
    assert width["status"] == "fail" and width["value"] == "x8 of x16" and width["advice"]
    speed = one(items, "PCIe speed", 2)
    assert speed["status"] == "warn" and speed["value"] == "2.5 GT/s of 16 GT/s" and "power saving" in speed["advice"]
    text = doctor(host).stdout
    assert "fail  PCIe width" in text and "→ the link trained narrow" in text


def test_missing_files_and_nodes(host: Host) -> None:
    remove(host.simulator, 0, "max_link_width")
    (host.sysfs / "module" / "amdgpu" / "parameters" / "ppfeaturemask").unlink()
    (host.root / "dev" / "kfd").unlink()
    render = sorted((host.root / "dev" / "dri").iterdir())[3]
    render.unlink()
    result = doctor(host, "--json")
    assert result.returncode == 1
    items = findings(result)
    assert one(items, "PCIe width", 0)["status"] == "warn"
    assert one(items, "ppfeaturemask")["status"] == "warn"
    kfd = one(items, "access kfd")
    assert kfd["status"] == "fail" and kfd["value"].endswith("kfd is missing")
    assert one(items, f"access {render.name}", 3)["status"] == "fail"


def test_no_driver_and_no_gpu(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class" / "drm").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    result = subprocess.run(
        [EXPORTER, "doctor", f"--path.sysfs={tmp_path / 'sys'}", f"--path.procfs={tmp_path / 'proc'}", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    items = findings(result)
    assert one(items, "amdgpu driver")["status"] == "fail"
    assert one(items, "devices")["value"] == "no AMD GPU found"
    assert one(items, "kernel")["status"] == "warn"  # no osrelease in this /proc


def test_firmware_and_vbios_that_differ_from_siblings(host: Host) -> None:
    folder = device_dir(host.simulator, 5)  # the second die of the second MI250X
    (folder / "fw_version" / "smc_fw_version").write_text("0x00443e00\n")
    (device_dir(host.simulator, 1) / "vbios_version").write_text("113-D67301-057\n")
    result = doctor(host, "--json")
    assert result.returncode == 0  # flagged, not failed
    items = findings(result)
    firmware = one(items, "firmware", 5)
    assert firmware["status"] == "warn" and "smc 0x00443e00" in firmware["value"]
    assert one(items, "firmware", 4)["status"] == "ok"
    vbios = one(items, "vbios", 1)
    assert vbios["status"] == "warn" and "113-D67301-063" in vbios["value"]


def test_hsa_override_on_an_instinct_part_warns_with_why(host: Host) -> None:
    result = doctor(host, "--json", env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0", "HIP_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0
    items = findings(result)
    override = one(items, "HSA_OVERRIDE_GFX_VERSION")
    assert override["status"] == "warn" and "gfx90a" in override["value"]
    assert "code built for 10.3.0" in override["advice"]
    assert "HIP_VISIBLE_DEVICES=0,1" in one(items, "HIP/HSA environment")["value"]


def test_mi210_on_an_old_kernel_fails(host: Host) -> None:
    (host.root / "proc" / "sys" / "kernel" / "osrelease").write_text("5.10.0-28-amd64\n")
    result = doctor(host, "--json")
    assert result.returncode == 1
    kernel = one(findings(result), "kernel")
    assert kernel["status"] == "fail" and "5.15" in kernel["advice"]


def test_unprivileged_user_without_groups(host: Host) -> None:
    setpriv = require_tool("setpriv")
    for node in [host.root / "dev" / "kfd", *(host.root / "dev" / "dri").iterdir()]:
        node.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)  # 0660 root:root
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    result = doctor(host, "--json", prefix=prefix)
    assert result.returncode == 1, result.stderr
    items = findings(result)
    groups = one(items, "groups")
    assert groups["status"] == "warn" and "usermod -aG video,render" in groups["advice"]
    assert one(items, "access kfd")["status"] == "fail"
    assert "permission denied" in one(items, "access kfd")["value"]


def test_bad_paths_are_one_sentence(host: Host) -> None:
    result = subprocess.run(
        [EXPORTER, "doctor", "--path.procfs=/nonexistent"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "amdgpu-exporter: error: --path.procfs: /nonexistent is missing (no such folder)"


def test_the_daemon_serves_the_same_versions_as_info_series(host: Host) -> None:
    """/metrics carries what doctor reports: the driver (from the tree), the kernel (this host's)."""
    import httpx

    from tests.realtools import start_exporter, wait_ready

    proc, port = start_exporter(
        f"--path.sysfs={host.sysfs}", "--interval=200ms", "--families.include=amdgpu_firmware_info"
    )
    try:
        wait_ready(port, proc)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    line = next(line for line in text.splitlines() if line.startswith("amdgpu_driver_info{"))
    for label in ('initstate="live"', f'kernel="{kernel}"', 'ppfeaturemask="0xfff7bfff"', 'version="6.7.0"'):
        assert label in line, line
    # when included, every package's firmware blocks, once per package (7 devices in 5 packages)
    assert text.count("amdgpu_firmware_info{") >= 5 * 9


def test_partitions_are_checked_once_per_socket_and_each_for_its_render_node() -> None:
    host = make_host("MI300X:CPX:NPS4")
    try:
        result = doctor(host, "--json")
    finally:
        shutil.rmtree(host.root, ignore_errors=True)
    assert result.returncode == 0, result.stdout
    items = findings(result)
    assert [f["gpu"] for f in items if f["check"] == "answers"] == list(range(8))
    assert [f["gpu"] for f in items if f["check"] == "PCIe width"] == [0]  # the socket's one link
    assert [f["gpu"] for f in items if f["check"] == "firmware"] == [0]
    renders = [f for f in items if f["check"].startswith("access renderD")]
    assert len(renders) == 8 and len({f["check"] for f in renders}) == 8
    assert all(f["status"] == "ok" for f in renders)
    assert {f["partition"] for f in items if f["gpu"] is not None} == {f"CPX {i}" for i in range(8)}


def test_a_vf_guest_is_ok_and_says_what_it_cannot_see() -> None:
    # An SR-IOV guest: no FRU, no firmware versions, no unique id. None of it is a fault to fix there.
    made = make_host("2xMI300X:guest")
    try:
        result = doctor(made, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        items = findings(result)
        assert {f["status"] for f in items if f["gpu"] is not None} == {"ok"}
        for gpu in range(2):
            deployment = one(items, "deployment", gpu)
            assert deployment["value"] == "guest: an SR-IOV virtual function (AMD Instinct MI300X VF)"
            assert "no firmware versions" in deployment["advice"] and "PCI address" in deployment["advice"]
            assert one(items, "firmware", gpu)["value"].startswith("hidden from a guest")
            assert one(items, "vbios", gpu)["value"] == "113-MI3SRIOV-001"
            assert not [f for f in items if f["gpu"] == gpu and f["check"].startswith("PCIe")]
    finally:
        shutil.rmtree(made.root, ignore_errors=True)
