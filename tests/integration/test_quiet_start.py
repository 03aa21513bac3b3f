"""On a host without an AMD GPU (this one), the default start — `--source auto` over the real /sys,
which probes librocm_smi64 through pyrsmi in a worker — prints the one-sentence error and nothing
else: no `cat: /sys/module/amdgpu/initstate` from pyrsmi, no worker warnings from the probe."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.realtools import EXPORTER, require_file

pytestmark = pytest.mark.integration


def _has_amdgpu() -> bool:
    try:
        return any(os.path.exists(f"/sys/class/drm/{n}/device/gpu_metrics") for n in os.listdir("/sys/class/drm"))
    except OSError:
        return False


@pytest.mark.skipif(_has_amdgpu(), reason="this host has an amdgpu device: the no-GPU start cannot be shown here")
@pytest.mark.parametrize("log_format", ["json", "console"])
def test_no_gpu_on_the_real_sys_prints_one_sentence(log_format: str) -> None:
    require_file("/usr/lib/librocm_smi64.so.1", "librocm-smi64-1")  # the probe must really run the library
    result = subprocess.run(
        [EXPORTER, "--web.listen-address=127.0.0.1:0", f"--log.format={log_format}"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("amdgpu-exporter: error: no AMD GPU found")


def test_amd_smi_source_without_the_amdsmi_module_is_one_sentence() -> None:
    """This host (bookworm) has no `amdsmi` module: asking for it fails at start, in one line."""
    result = subprocess.run(
        [EXPORTER, "--source=amd-smi", "--web.listen-address=127.0.0.1:0", "--log.format=json"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("amdgpu-exporter: error: --source=amd-smi was asked for but the amdsmi module")
    assert "No module named 'amdsmi'" in lines[0]
