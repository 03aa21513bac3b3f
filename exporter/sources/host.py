"""Facts about the host that explain a GPU's behaviour: kernel, amdgpu driver, ROCm installs and
packages, the SMI libraries' versions. Read from folders standing for /sys, /proc and /opt, so
tests run on simulator trees; parsers are pure functions over text.

Shared by `doctor` (which judges them) and the daemon (which exports them as _info series).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model import HostInfo

# Packages worth naming in a version matrix (Debian/Ubuntu names of ROCm and its pieces).
PACKAGE_PATTERNS = ("rocm*", "librocm*", "hip*", "libhsa*", "hsa-*", "amd-smi*", "amdgpu*", "rocblas*", "rccl*")
_PROBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class LibraryVersion:
    name: str  # "librocm_smi64" | "libamd_smi"
    path: str  # "" when not found
    version: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class HostFacts:
    kernel_release: str | None = None
    driver_version: str | None = None  # /sys/module/amdgpu/version; None for the in-tree driver
    driver_loaded: bool = False
    driver_initstate: str | None = None
    ppfeaturemask: int | None = None
    rocm_installs: tuple[tuple[str, str], ...] = ()  # (folder, version) from <folder>/.info/version
    packages: tuple[tuple[str, str], ...] = ()  # (package, version), installed only
    libraries: tuple[LibraryVersion, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)


def parse_kernel_release(text: str) -> tuple[int, int] | None:
    """'6.1.0-18-amd64' -> (6, 1); None when it does not start with a version."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_mask(text: str) -> int | None:
    """A module parameter as the kernel prints it: '0xfff7bfff' or decimal '4294426623'."""
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def parse_dpkg_query(text: str) -> list[tuple[str, str]]:
    """Lines 'package<TAB>version<TAB>status' -> installed (package, version), sorted."""
    rows = (line.split("\t") for line in text.splitlines())
    return sorted({(row[0], row[1]) for row in rows if len(row) == 3 and row[2].endswith(" installed") and row[1]})


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def rocm_installs(rocm_parent: str) -> tuple[tuple[str, str], ...]:
    """Every <rocm_parent>/rocm* with a .info/version (the ROCm installer writes it), /opt/rocm first."""
    folders = sorted(glob.glob(os.path.join(rocm_parent, "rocm*")))
    versions = ((folder, _read(os.path.join(folder, ".info", "version"))) for folder in folders)
    return tuple((folder, version.splitlines()[0].strip()) for folder, version in versions if version)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """A probe's output as text, within _PROBE_TIMEOUT (raises OSError or TimeoutExpired)."""
    return subprocess.run(command, capture_output=True, text=True, timeout=_PROBE_TIMEOUT, check=False)


def installed_packages() -> tuple[tuple[str, str], ...]:
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return ()
    try:
        result = _run([dpkg, "-W", "-f", "${Package}\t${Version}\t${Status}\n", *PACKAGE_PATTERNS])
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(parse_dpkg_query(result.stdout))


def library_candidates(name: str, rocm_parent: str, environ: Mapping[str, str]) -> list[str]:
    """Where librocm_smi64 / libamd_smi may live, best first."""
    installs = [environ["ROCM_PATH"]] if environ.get("ROCM_PATH") else []
    installs += sorted(glob.glob(os.path.join(rocm_parent, "rocm*")))
    folders = [os.path.join(install, lib) for install in installs for lib in ("lib", "lib64")]
    folders += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return [os.path.join(folder, f"{name}.so{suffix}") for folder in folders for suffix in ("", ".1", ".5", ".6", ".7")]


def find_library(name: str, rocm_parent: str, environ: Mapping[str, str]) -> str:
    """The first candidate that exists (as found, not resolved); "" when there is none."""
    return next((path for path in library_candidates(name, rocm_parent, environ) if os.path.isfile(path)), "")


def library_version(name: str, rocm_parent: str, environ: Mapping[str, str]) -> LibraryVersion:
    """The library's own version, asked in a child process (these libraries can abort or hang)."""
    path = find_library(name, rocm_parent, environ)
    if not path:
        return LibraryVersion(name, "")
    kind = {"librocm_smi64": "rocm_smi", "libamd_smi": "amd_smi"}[name]
    # The probe is a stdlib-only script run by file (-I: no site, no PYTHONPATH), so any Python can
    # run it; sys.executable first, then the interpreter the venv was made from (a service user may
    # not be allowed to execute the venv's link to it).
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libprobe.py")
    interpreters = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]
    error: OSError | None = None
    for interpreter in dict.fromkeys(i for i in interpreters if i):
        try:
            result = _run([interpreter, "-I", script, kind, path])
            break
        except subprocess.TimeoutExpired:
            return LibraryVersion(name, path, error=f"loading it did not finish within {_PROBE_TIMEOUT:g} s")
        except OSError as failed:
            error = failed
    else:
        reason = error.strerror if error is not None and error.strerror else str(error)
        return LibraryVersion(name, path, error=f"cannot start the probe: {reason}")
    if result.returncode < 0:
        return LibraryVersion(name, path, error=f"loading it killed the process (signal {-result.returncode})")
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return LibraryVersion(name, path, error=f"the probe failed: {result.stderr.strip()[-200:]}")
    return LibraryVersion(name, path, version=answer.get("version", ""), error=answer.get("error", ""))


# Variables that change what the HIP/HSA runtime does (or which GPUs it sees).
RUNTIME_VARIABLES = (
    "HSA_OVERRIDE_GFX_VERSION",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "HSA_ENABLE_SDMA",
    "HSA_XNACK",
    "HSA_FORCE_FINE_GRAIN_PCIE",
    "HSA_ENABLE_INTERRUPT",
    "HSA_NO_SCRATCH_RECLAIM",
    "HIP_LAUNCH_BLOCKING",
    "AMD_SERIALIZE_KERNEL",
    "AMD_SERIALIZE_COPY",
    "HIP_FORCE_DEV_KERNARG",
    "HIPCC_COMPILE_FLAGS_APPEND",
    "AMD_LOG_LEVEL",
    "ROCM_PATH",
    "HIP_PATH",
)


def collect(
    sysfs: str,
    procfs: str,
    rocm_parent: str,
    environ: Mapping[str, str],
    *,
    libraries: Sequence[str] = ("librocm_smi64", "libamd_smi"),
    packages: bool = True,
) -> HostFacts:
    module = os.path.join(sysfs, "module", "amdgpu")
    mask = _read(os.path.join(module, "parameters", "ppfeaturemask"))
    return HostFacts(
        kernel_release=_read(os.path.join(procfs, "sys", "kernel", "osrelease")),
        driver_version=_read(os.path.join(module, "version")),
        driver_loaded=os.path.isdir(module),
        driver_initstate=_read(os.path.join(module, "initstate")),
        ppfeaturemask=parse_mask(mask) if mask is not None else None,
        rocm_installs=rocm_installs(rocm_parent),
        packages=installed_packages() if packages else (),
        libraries=tuple(library_version(name, rocm_parent, environ) for name in libraries),
        environment={name: environ[name] for name in RUNTIME_VARIABLES if name in environ},
    )


def host_info(facts: HostFacts) -> HostInfo:
    """The facts the daemon exports as _info series (packages and environment stay out: too many)."""
    return HostInfo(
        kernel_release=facts.kernel_release or "",
        driver_version=facts.driver_version or "",
        driver_initstate=facts.driver_initstate or "",
        ppfeaturemask=f"0x{facts.ppfeaturemask:08x}" if facts.ppfeaturemask is not None else "",
        rocm=facts.rocm_installs,
        smi_libraries=tuple((lib.name, lib.version) for lib in facts.libraries if lib.version),
    )
