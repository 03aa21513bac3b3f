"""The exporter as a user installs a release: its wheel built from the release's files, and a fresh
venv holding that wheel and the locked runtime. The fixtures in tests/integration/conftest.py make
the wheel and the runtime's wheels once per session for every test that installs them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What a source release of the exporter consists of (the Dockerfile's build stage copies the same).
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")
PACKAGE = "exporter"
BUILD_LOCK = REPO / "requirements" / "build.lock"
RUNTIME_LOCK = REPO / "requirements" / "runtime.lock"
PIP = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]


def locked_version(lock: Path, name: str) -> str:
    """The version `lock` pins for `name` (lines of the form `name==version \\`)."""
    for line in lock.read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].split()[0]
    raise AssertionError(f"{lock} pins no {name}")


def build_wheel(root: Path) -> Path:
    """The exporter's wheel, built under `root` from the release's files alone.

    Built by this venv's setuptools, the one build.lock pins (checked here), without build
    isolation: nothing is fetched.
    """
    assert version("setuptools") == locked_version(BUILD_LOCK, "setuptools"), "setuptools is not the locked one"
    source = root / "source"
    source.mkdir()
    for name in SOURCE_FILES:
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.py[co]"))
    dist = root / "dist"
    subprocess.run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", dist, source], check=True)
    (wheel,) = dist.glob("amdgpu_exporter-*.whl")
    return wheel


def download_runtime(folder: Path) -> Path:
    """The wheels runtime.lock pins, hashes checked, into `folder`."""
    subprocess.run([*PIP, "download", "--no-deps", "--require-hashes", "-r", RUNTIME_LOCK, "-d", folder], check=True)
    return folder


def install_release(python: Path, venv: Path, runtime_wheels: Path, exporter_wheel: Path) -> None:
    """A fresh venv of `python` at `venv` holding the locked runtime and the exporter's wheel, with
    nothing resolved or fetched; `pip check` proves the lock satisfies the wheel's requirements.

    This venv's pip installs into it (`pip --python`), so the new venv needs no pip of its own;
    no .pyc files are written ahead (the daemon compiles what it imports).
    """
    subprocess.run([python, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    target = [*PIP, "--python", venv / "bin" / "python"]
    local = ["install", "--no-compile", "--no-index", "--find-links", runtime_wheels]
    subprocess.run([*target, *local, "--require-hashes", "-r", RUNTIME_LOCK], check=True)
    subprocess.run([*target, *local, "--no-deps", exporter_wheel], check=True)
    subprocess.run([*target, "check"], check=True)
