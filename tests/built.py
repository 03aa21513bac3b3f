"""What the tests build from the release's files (the OCI image, the .deb), built once per machine
for each set of inputs and kept in the per-machine test cache (tests/oracles/chroots.py's, by default
/var/cache/amdgpu-exporter-tests), beside the chroots.

The key is a hash of every input file's path and bytes (the exporter package, pyproject.toml, the
lock files, deploy/) and of what else the build reads (the Debian mirror): a changed file builds
again; an unchanged tree reuses the last build, in this run and the next. A build holds an exclusive
lock on its own lock file, so two test processes never build the same thing at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.oracles.chroots import _locked, cache_root, debian_mirror

REPO = Path(__file__).resolve().parents[1]
# Every file a release build reads: the package, its metadata and locks, and the packaging itself.
RELEASE_INPUTS = ("exporter", "deploy", "pyproject.toml", "README.md", "LICENSE", "requirements")
# Builds of other inputs kept per kind (the newest ones): a branch switched back and forth stays warm.
KEEP = 3


def _files(paths: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = REPO / name
        if path.is_file():
            found.append(path)
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            found.extend(Path(folder) / f for f in sorted(files) if not f.endswith((".pyc", ".pyo")))
    return sorted(found)


def inputs_key(paths: Iterable[str] = RELEASE_INPUTS, *extra: str) -> str:
    """A short hash of the files under `paths` (path and content) and of `extra` strings."""
    digest = hashlib.sha256()
    for path in _files(paths):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    for text in extra:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]


def cached_build(kind: str, key: str, build: Callable[[Path], None]) -> Path:
    """The folder holding `kind` built from inputs `key`: `build(folder)` runs only when this machine
    has no complete one yet. A failed build leaves nothing behind."""
    root = cache_root()
    final = root / f"{kind}-{key}"
    if (final / ".complete").exists():
        os.utime(final)  # recently used: pruned last
        return final
    with _locked(root / f".{kind}.lock"):
        if (final / ".complete").exists():  # another process built it while we waited
            return final
        shutil.rmtree(final, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
        try:
            build(work)
            (work / ".complete").touch()
            os.replace(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        older = sorted(
            (p for p in root.glob(f"{kind}-*") if p.is_dir() and p != final),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for stale in older[KEEP - 1 :]:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def release_deb() -> Path:
    """dist/'s .deb as `make deb` builds it (deploy/deb/build.py), from the per-machine cache."""
    from deploy.deb.build import TARGET, build

    def make(folder: Path) -> None:
        build(folder)

    folder = cached_build("release-deb", inputs_key(RELEASE_INPUTS, debian_mirror(), repr(TARGET)), make)
    (deb,) = folder.glob("*.deb")
    return deb


def release_image(python: str) -> Path:
    """The OCI image layout `make image` builds (deploy/image/build.py), from the per-machine cache."""
    import subprocess

    def make(folder: Path) -> None:
        wheels = folder / "dist"
        result = subprocess.run(
            [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, REPO],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise BuildError(f"building the wheel failed: {result.stderr.strip()}")
        (wheel,) = wheels.glob("amdgpu_exporter-*.whl")
        script = str(REPO / "deploy/image/build.py")
        argv = [python, script, "--wheel", str(wheel), "--output", str(folder / "image"), "--mirror", debian_mirror()]
        build = subprocess.run(argv, capture_output=True, text=True, timeout=1500)
        if build.returncode != 0:
            raise BuildError(f"building the image failed: {build.stderr.strip()}")
        shutil.rmtree(wheels)

    return cached_build("release-image", inputs_key(RELEASE_INPUTS, debian_mirror()), make) / "image"


class BuildError(Exception):
    """A build the tests need failed (its own words)."""
