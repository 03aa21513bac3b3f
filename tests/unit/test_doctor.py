"""doctor's pure parts: the host-fact parsers (fuzzed), judge() on hand-made facts, the library
probe surviving a library that kills its process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import DeviceIdentity, frozen_map
from exporter.operator.doctor import AccessFacts, DeviceFacts, Facts, judge
from exporter.sources import host as hostfacts
from exporter.sources.host import HostFacts, parse_dpkg_query, parse_kernel_release, parse_mask


def test_parsers() -> None:
    assert parse_kernel_release("6.1.0-18-amd64\n") == (6, 1)
    assert parse_kernel_release("5.15.0") == (5, 15)
    assert parse_kernel_release("garbage") is None
    assert parse_mask("0xfff7bfff\n") == 0xFFF7BFFF
    assert parse_mask("4294426623") == 0xFFF7BFFF
    assert parse_mask("0xzz") is None
    text = "rocm-smi\t5.2.3-2\tinstall ok installed\nhipcc\t\tunknown ok not-installed\nbad line\n"
    assert parse_dpkg_query(text) == [("rocm-smi", "5.2.3-2")]


@given(st.text())
def test_parsers_never_raise(text: str) -> None:
    release = parse_kernel_release(text)
    assert release is None or all(part >= 0 for part in release)
    parse_mask(text)
    for name, version in parse_dpkg_query(text):
        assert name is not None and version


def _device(gpu: int, device_id: str = "0x740f", asic: str = "aldebaran", **fields) -> DeviceFacts:
    identity = DeviceIdentity(
        pci_bus_id=f"0000:{gpu:02x}:00.0",
        card=f"card{gpu}",
        device_dir="/nonexistent",
        device_id=device_id,
        asic=asic,
        product="AMD Instinct MI210",
        vbios="113-D67301-063",
        firmware=frozen_map({"smc": "0x00443f00"}),
    )
    link = {"link_speed": 16e9, "link_max_speed": 16e9, "link_width": 16, "link_max_width": 16}
    link.update(fields)
    return DeviceFacts(gpu=gpu, identity=identity, up=True, down_reason="", **link)


def _facts(**host_fields) -> Facts:
    host = HostFacts(
        kernel_release="6.8.0",
        driver_version="6.7.0",
        driver_loaded=True,
        driver_initstate="live",
        ppfeaturemask=0xFFF7BFFF,
        rocm_installs=(("/opt/rocm-6.2.1", "6.2.1"),),
    )
    host = HostFacts(**{**{f: getattr(host, f) for f in host.__slots__}, **host_fields})
    return Facts(host=host, devices=(_device(0), _device(1)), access=AccessFacts(is_root=True, user="root", groups=()))


def _status(facts: Facts, check: str) -> tuple[str, str]:
    found = [f for f in judge(facts) if f.check == check]
    assert len(found) == 1
    return found[0].status, found[0].value


@pytest.mark.parametrize(
    ("mask", "status", "needle"),
    [
        (0xFFF7BFFF, "ok", "the default"),
        (0xFFFFFFFF, "ok", "overdrive unlocked"),  # the field notes' setting: noted, not a problem
        (0xFFF7BFEF, "warn", "power containment"),  # the power cap is not enforced
        (0xFFF7BFFC, "warn", "sclk DPM, mclk DPM"),
    ],
)
def test_ppfeaturemask(mask: int, status: str, needle: str) -> None:
    got, value = _status(_facts(ppfeaturemask=mask), "ppfeaturemask")
    assert got == status and needle in value


def test_kernel_and_driver_states() -> None:
    assert _status(_facts(kernel_release="5.14.21"), "kernel")[0] == "fail"  # MI210 needs 5.15
    assert _status(_facts(kernel_release="5.15.0-91-generic"), "kernel")[0] == "ok"
    assert _status(_facts(driver_initstate="coming"), "amdgpu driver")[0] == "fail"
    assert _status(_facts(driver_version=None), "amdgpu driver")[1].startswith("in-tree (kernel 6.8.0)")
    two = (("/opt/rocm-6.1.0", "6.1.0"), ("/opt/rocm-6.2.1", "6.2.1"))
    assert _status(_facts(rocm_installs=two), "ROCm")[0] == "warn"


def test_library_probe_that_kills_its_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """librocm_smi64 can abort() while loading: the doctor reports it and carries on."""
    rocm = tmp_path / "opt" / "rocm-6.2.1" / "lib"
    rocm.mkdir(parents=True)
    (rocm / "librocm_smi64.so").write_bytes(b"\x7fELF")
    aborting = tmp_path / "python"
    aborting.write_text("#!/bin/sh\nkill -ABRT $$\n")
    aborting.chmod(aborting.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(hostfacts.sys, "executable", str(aborting))
    result = hostfacts.library_version("librocm_smi64", str(tmp_path / "opt"), {})
    assert result.path == str(rocm / "librocm_smi64.so")
    assert result.error == "loading it killed the process (signal 6)"


def test_library_probe_on_a_file_that_is_not_a_library(tmp_path: Path) -> None:
    rocm = tmp_path / "opt" / "rocm-6.2.1" / "lib"
    rocm.mkdir(parents=True)
    (rocm / "libamd_smi.so").write_bytes(b"not a library")
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    result = hostfacts.library_version("libamd_smi", str(tmp_path / "opt"), env)
    assert result.version == "" and "libamd_smi.so" in result.error
