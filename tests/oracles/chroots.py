"""Debian trixie and sid chroots with the modern ROCm tools, built once per machine and cached.

bookworm's glibc (2.36) and libstdc++ (3.4.30) are too old for rocm-smi 6.x and amd-smi, so
they run in `mmdebstrap --variant=minbase` chroots of the suites that ship them, from the same
Debian mirror this machine's apt uses. Every package the tests depend on is pinned to an exact
version; the cache key is a hash of the suite, the pins and the mirror, so a changed pin builds a
new chroot beside the old one instead of testing against a stale one.

Concurrent test processes share the cache: a build holds an exclusive lock on its own lock file,
builds into a temporary folder and renames it into place when it is complete and verified, so a
reader never sees half a chroot.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "AMDGPU_EXPORTER_TEST_CACHE"
MIRROR_ENV = "AMDGPU_EXPORTER_TEST_MIRROR"
DEFAULT_CACHE = Path("/var/cache/amdgpu-exporter-tests")
# Bump when the way a chroot is built changes (not its pins): the key must change with it.
_BUILD_FORMAT = 1
_BUILD_TIMEOUT_S = 900.0


class ChrootBuildError(RuntimeError):
    """A chroot or the libdrm stand-in could not be built; the message says why in one line."""


@dataclass(frozen=True)
class ChrootSpec:
    suite: str
    # package -> exact Debian version (checked with apt-cache policy inside the suite)
    pins: tuple[tuple[str, str], ...]
    # sid's Release file on the mirror is past its Valid-Until date
    ignore_valid_until: bool = False


TRIXIE = ChrootSpec(
    suite="trixie",
    pins=(("rocm-smi", "6.1.2-1"), ("librocm-smi64-1", "6.1.2-1")),
)
SID = ChrootSpec(
    suite="sid",
    pins=(
        ("rocm-smi", "6.4.1-1.1"),
        ("librocm-smi64-1", "6.4.1-1.1"),
        ("amd-smi", "10.1-1"),
        ("libamd-smi27", "10.1-1"),
        ("python3", "3.14.8-1"),
        # headers only: the libdrm stand-in is compiled against libdrm's own struct layouts
        ("libdrm-dev", "2.4.134-3"),
    ),
    ignore_valid_until=True,
)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def debian_mirror() -> str:
    """The Debian archive URI this machine's apt uses (deb822 .sources or one-line .list files)."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override.rstrip("/")
    files: list[Path] = []
    for source in _SOURCES:
        if source.is_dir():
            files.extend(sorted(p for p in source.iterdir() if p.suffix in (".list", ".sources")))
        elif source.is_file():
            files.append(source)
    for path in files:
        for uri, suites in _entries(path.read_text(errors="replace"), deb822=path.suffix == ".sources"):
            # the main archive, not debian-security or a third-party repository
            if uri.rstrip("/").endswith("/debian") and any("-" not in suite for suite in suites):
                return uri.rstrip("/")
    raise ChrootBuildError(f"no Debian mirror found in {', '.join(map(str, _SOURCES))}; set {MIRROR_ENV}")


def _entries(text: str, deb822: bool) -> Iterator[tuple[str, list[str]]]:
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                for uri in fields.get("uris", "").split():
                    yield uri, fields.get("suites", "").split()
    else:
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                yield words[1], [words[2]]


def chroot_key(spec: ChrootSpec, mirror: str) -> str:
    material = json.dumps([_BUILD_FORMAT, spec.suite, list(spec.pins), spec.ignore_valid_until, mirror])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_chroot(spec: ChrootSpec) -> Path:
    """The cached chroot for spec, built now (about 20 s) if this machine has none yet."""
    mirror = debian_mirror()
    root = cache_root()
    final = root / f"{spec.suite}-{chroot_key(spec, mirror)}"
    if (final / ".complete").exists():
        return final
    with _locked(root / f".{final.name}.lock"):
        if (final / ".complete").exists():  # another process built it while we waited
            return final
        _build(spec, mirror, final)
    return final


def _build(spec: ChrootSpec, mirror: str, final: Path) -> None:
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise ChrootBuildError("mmdebstrap is not installed (see DEBIAN_TEST_PACKAGES in the Makefile)")
    partial = final.with_name(final.name + ".partial")
    log = final.with_name(final.name + ".log")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    argv = [mmdebstrap, "--variant=minbase", "--mode=root", "--format=directory"]
    if spec.ignore_valid_until:
        argv.append('--aptopt=Acquire::Check-Valid-Until "false"')
    argv.append("--include=" + ",".join(f"{name}={version}" for name, version in spec.pins))
    argv += [spec.suite, str(partial), mirror]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        shutil.rmtree(partial, ignore_errors=True)
        raise ChrootBuildError(f"building the {spec.suite} chroot took over {_BUILD_TIMEOUT_S:.0f} s") from None
    log.write_text(f"$ {' '.join(argv)}\n{result.stdout}\n{result.stderr}")
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        reason = _last_error(result.stderr) or f"exit status {result.returncode}"
        raise ChrootBuildError(f"building the {spec.suite} chroot from {mirror} failed: {reason} (full log: {log})")
    installed = _installed_versions(partial, [name for name, _ in spec.pins])
    wrong = {name: installed.get(name) for name, version in spec.pins if installed.get(name) != version}
    if wrong:
        shutil.rmtree(partial, ignore_errors=True)
        raise ChrootBuildError(f"the {spec.suite} chroot has {wrong} instead of the pinned {dict(spec.pins)}")
    (partial / ".complete").write_text(json.dumps({"suite": spec.suite, "mirror": mirror, "pins": dict(spec.pins)}))
    partial.rename(final)


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "mmdebstrap: error", "E "))]
    return (errors or lines or [""])[-1][:300]


def _installed_versions(root: Path, names: list[str]) -> dict[str, str]:
    result = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Package} ${Version}\\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


_FAKE_LIBDRM_SOURCE = Path(__file__).with_name("fake_libdrm_amdgpu.c")


def ensure_fake_libdrm(sid_root: Path) -> Path:
    """Folder holding the compiled libdrm_amdgpu stand-in (and its unversioned name), cached."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ChrootBuildError("gcc is not installed: it compiles the libdrm_amdgpu stand-in for the tests")
    source = _FAKE_LIBDRM_SOURCE.read_bytes()
    key = hashlib.sha256(source + sid_root.name.encode()).hexdigest()[:16]
    root = cache_root()
    final = root / f"fake-libdrm-{key}"
    if (final / ".complete").exists():
        return final
    with _locked(root / f".{final.name}.lock"):
        if (final / ".complete").exists():
            return final
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        include = sid_root / "usr/include"
        argv = [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                "-iquote", str(include), "-I", str(include / "libdrm"),
                "-Wl,-soname,libdrm_amdgpu.so.1", "-o", str(partial / "libdrm_amdgpu.so.1"),
                str(_FAKE_LIBDRM_SOURCE)]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
            raise ChrootBuildError(f"compiling the libdrm_amdgpu stand-in failed: {first[:300]}")
        # rocm-smi 6.4.1 dlopens the unversioned name, libamd_smi the .so.1
        (partial / "libdrm_amdgpu.so").symlink_to("libdrm_amdgpu.so.1")
        (partial / ".complete").touch()
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final
