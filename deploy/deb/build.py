"""Build the .deb: the exporter in its own venv under /opt, with the units, env file and Slurm scripts.

`make deb` runs `python -m deploy.deb.build`. The venv is made by the target release's own
python3 inside a chroot of that release (the cached mmdebstrap chroots of tests/oracles/chroots.py),
so its interpreter symlinks, shebangs and compiled extensions match the nodes that install the
package. The dependencies come from requirements/runtime.lock with their hashes checked,
downloaded on this host (its pip configuration: mirrors, proxies) as wheels for the target's Python
and glibc; inside the chroot pip installs them with no index at all.

What is slow is cached per machine under the chroots' cache, keyed by its inputs: the chroot (by
its suite and pins), the wheelhouse (by the lock file and the target Python) and the venv of the
dependencies (by both). A build with all three cached installs only the exporter's own wheel.
Needs root (mmdebstrap --mode=root, a private mount namespace for the overlays).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from exporter import __version__
from tests.oracles.chroots import ChrootBuildError, ChrootSpec, _locked, cache_root, debian_mirror, ensure_chroot

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PACKAGE = "amdgpu-exporter"
PREFIX = "/opt/amdgpu-exporter"
MAINTAINER = "amdgpu-exporter maintainers <amdgpu-exporter@localhost>"


@dataclass(frozen=True)
class Target:
    """The Debian release a package is built for: its chroot and the Python the venv is made with."""

    suite: str
    python: str  # "3.13": the interpreter /usr/bin/python3.X the venv links to (a package Depends on it)
    python_version: str  # the Debian version of python3.X, pinned in the build chroot
    glibc: tuple[int, int]  # newest manylinux tag the target's libc accepts
    # a node as a site has one: systemd (to verify the installed unit) and passwd (useradd)
    systemd_version: str
    passwd_version: str

    @property
    def build_chroot(self) -> ChrootSpec:
        py = f"python{self.python}"
        return ChrootSpec(suite=self.suite, pins=((py, self.python_version), (f"{py}-venv", self.python_version)))

    @property
    def install_chroot(self) -> ChrootSpec:
        """The fresh node the tests install the package on: no Python until the package pulls it in."""
        return ChrootSpec(suite=self.suite, pins=(("systemd", self.systemd_version), ("passwd", self.passwd_version)))


# Debian 13 is the stable release a site installs on; its python3.13 runs the locked wheels.
TRIXIE = Target(
    suite="trixie",
    python="3.13",
    python_version="3.13.5-2+deb13u5",
    glibc=(2, 41),
    systemd_version="257.13-1~deb13u1",
    passwd_version="1:4.17.4-2",
)
TARGET = TRIXIE

# The Debian architecture the locked native wheels (grpcio, uvloop, pydantic-core, ...) are for.
ARCH = "amd64"
_WHEEL_ARCH = "x86_64"
# Bump when the way the venv is made changes (not its inputs): the cache keys must change with it.
_BUILD_FORMAT = 1


class DebBuildError(RuntimeError):
    """One step of the build failed; the message says which and why in one line."""


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise DebBuildError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def wheelhouse(target: Target) -> Path:
    """The locked runtime as wheels for the target's CPython and glibc, hashes checked; cached."""
    lock = (REPO / "requirements/runtime.lock").read_bytes()
    key = _sha256(str(_BUILD_FORMAT).encode(), lock, target.python.encode(), repr(target.glibc).encode())
    final = cache_root() / f"deb-wheels-{key}"
    if (final / ".complete").exists():
        return final
    with _locked(cache_root() / f".{final.name}.lock"):
        if (final / ".complete").exists():
            return final
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        # pip expands only the legacy manylinux names by itself: every glibc tag up to the target's
        major, newest = target.glibc
        platforms = [f"manylinux_{major}_{minor}_{_WHEEL_ARCH}" for minor in range(newest, 4, -1)]
        platforms += [f"manylinux2014_{_WHEEL_ARCH}", f"manylinux2010_{_WHEEL_ARCH}", f"manylinux1_{_WHEEL_ARCH}"]
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                "--only-binary=:all:", "--no-deps", "--require-hashes", "--python-version", target.python,
                *(f"--platform={platform}" for platform in platforms),
                "-r", str(REPO / "requirements/runtime.lock"), "-d", str(partial)]  # fmt: skip
        _run(argv, f"downloading the locked wheels for CPython {target.python}")
        (partial / "runtime.lock").write_bytes(lock)
        (partial / ".complete").touch()
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final


def project_wheel(out: Path) -> Path:
    """The exporter's own wheel, built by this venv's setuptools (requirements/build.lock)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--no-build-isolation", "--wheel-dir", str(out), str(REPO)]  # fmt: skip
    _run(argv, "building the exporter's wheel")
    (wheel,) = out.glob("amdgpu_exporter-*.whl")
    return wheel


# Runs in a private mount namespace: "$1" lower layers, "$2" the work folder, "$3" the wheels, then
# the commands to run in the chroot, one argument each (sh -c strings). The overlay's upper layer
# keeps everything the commands changed once the namespace is gone.
_IN_OVERLAY = r"""
set -eu
lower=$1 work=$2 wheels=$3; shift 3
mkdir -p "$work/upper" "$work/work" "$work/root"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/work" "$work/root"
mkdir -p "$work/root/tmp/wheels"
mount --bind -o ro "$wheels" "$work/root/tmp/wheels"
mount -t proc proc "$work/root/proc"
for step in "$@"; do
  chroot "$work/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 /bin/sh -ec "$step"
done
"""


def _in_overlay(lower: list[Path], work: Path, wheels: Path, steps: list[str], what: str) -> Path:
    """Run steps in the chroot made of the lower layers (first on top); returns the upper layer."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    argv = ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", _IN_OVERLAY, "overlay",
            ":".join(map(str, lower)), str(work), str(wheels), *steps]  # fmt: skip
    _run(argv, what)
    return work / "upper"


def dependencies_venv(target: Target, chroot: Path, wheels: Path) -> Path:
    """An overlay layer holding PREFIX: a venv of the locked runtime, made in the build chroot; cached."""
    key = _sha256(str(_BUILD_FORMAT).encode(), chroot.name.encode(), wheels.name.encode())
    final = cache_root() / f"deb-venv-{key}"
    if (final / ".complete").exists():
        return final / "upper"
    with _locked(cache_root() / f".{final.name}.lock"):
        if (final / ".complete").exists():
            return final / "upper"
        partial = final.with_name(final.name + ".partial")
        steps = [
            f"/usr/bin/python{target.python} -m venv {PREFIX}",
            f"{PREFIX}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir --no-index"
            " --find-links /tmp/wheels --require-hashes -r /tmp/wheels/runtime.lock",
        ]
        upper = _in_overlay([chroot], partial, wheels, steps, "installing the locked runtime into the venv")
        # only PREFIX is the layer's; the mount points the script made are not
        for entry in upper.iterdir():
            if entry.name != "opt":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        shutil.rmtree(partial / "work", ignore_errors=True)
        shutil.rmtree(partial / "root", ignore_errors=True)
        (partial / ".complete").touch()
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final / "upper"


def venv(target: Target, wheel: Path, work: Path) -> Path:
    """PREFIX with the runtime and the exporter installed, copied out of the chroot; the folder holding it."""
    # both mostly wait on downloads: at once
    with ThreadPoolExecutor(max_workers=1) as pool:
        downloading = pool.submit(wheelhouse, target)
        chroot = ensure_chroot(target.build_chroot)
        wheels = downloading.result()
    deps = dependencies_venv(target, chroot, wheels)
    stage = work / "venv"
    stage.mkdir(parents=True)
    shutil.copy2(wheel, stage / wheel.name)
    steps = [
        f"{PREFIX}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir --no-index --no-deps"
        f" /tmp/wheels/{wheel.name}",
        f"{PREFIX}/bin/pip check",
        # dpkg owns the venv: nothing is installed into it by hand, so pip goes
        f"{PREFIX}/bin/pip uninstall --quiet --yes pip",
        f"{PREFIX}/bin/amdgpu-exporter --version",
    ]
    upper = _in_overlay([deps, chroot], work / "overlay", stage, steps, "installing the exporter into the venv")
    # the venv as the merged view saw it: the cached layer plus this build's changes (whiteouts applied)
    merged = work / "merged"
    merged.mkdir()
    argv = ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-ec",
            'mkdir -p "$3/m" && mount -t overlay overlay -o "lowerdir=$1:$2" "$3/m" && cp -a "$3/m/opt" "$3/tree"',
            "copy", str(upper), str(deps), str(merged)]  # fmt: skip
    _run(argv, "copying the venv out of the overlay")
    return merged / "tree"


def _control(target: Target, installed_kib: int, release: str) -> str:
    # procps: the unit's ExecReload= is /bin/kill, which a minimal Debian does not have without it
    return f"""Package: {PACKAGE}
Version: {release}
Architecture: {ARCH}
Maintainer: {MAINTAINER}
Installed-Size: {installed_kib}
Depends: python{target.python} (>= {target.python_version.split("-")[0]}), libc6 (>= 2.34), passwd, procps
Suggests: librocm-smi64-1
Section: admin
Priority: optional
Description: Prometheus exporter for AMD Instinct GPUs
 Power, energy, temperatures, utilisation, memory, clocks, PCIe and XGMI
 links, ECC and throttling of every MI210, MI250X and MI300-class GPU,
 read from the amdgpu sysfs ABI (no ROCm needed) or the ROCm SMI library.
 Its own Python environment lives in {PREFIX}; the service runs as the
 system user {PACKAGE} in the video and render groups.
"""


def _copy(source: Path, dest: Path, mode: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    dest.chmod(mode)


def stage_tree(target: Target, venv_tree: Path, root: Path, release: str) -> None:
    """The package's file system and DEBIAN/ control folder under root."""
    (root / "opt").mkdir(parents=True)
    shutil.move(str(venv_tree / "amdgpu-exporter"), root / PREFIX.lstrip("/"))
    systemd = REPO / "deploy/systemd"
    _copy(systemd / "amdgpu-exporter.service", root / "usr/lib/systemd/system/amdgpu-exporter.service", 0o644)
    _copy(systemd / "amdgpu-exporter.socket", root / "usr/lib/systemd/system/amdgpu-exporter.socket", 0o644)
    _copy(systemd / "amdgpu-exporter.env", root / "etc/default/amdgpu-exporter", 0o644)
    # an opt-in drop-in (debugfs: CPER and the exact bad-page threshold), installed by the admin
    _copy(systemd / "debugfs.conf", root / "usr/share/amdgpu-exporter/systemd/debugfs.conf", 0o644)
    slurm = REPO / "deploy/slurm"
    share = root / "usr/share/amdgpu-exporter"
    _copy(slurm / "prolog.sh", share / "slurm/prolog.sh", 0o755)
    _copy(slurm / "epilog.sh", share / "slurm/epilog.sh", 0o755)
    _copy(slurm / "README.md", share / "slurm/README.md", 0o644)
    _copy(REPO / "LICENSE", root / "usr/share/doc/amdgpu-exporter/copyright", 0o644)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/amdgpu-exporter").symlink_to(f"{PREFIX}/bin/amdgpu-exporter")

    debian = root / "DEBIAN"
    debian.mkdir()
    for script in ("postinst", "prerm", "postrm"):
        _copy(HERE / script, debian / script, 0o755)
    (debian / "conffiles").write_text("/etc/default/amdgpu-exporter\n")
    sums: list[str] = []
    size = 0
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0] == "DEBIAN":
            continue
        info = path.lstat()
        size += info.st_size if not stat.S_ISDIR(info.st_mode) else 4096
        if stat.S_ISREG(info.st_mode) and not str(relative).startswith("etc/"):
            sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {relative}")
    (debian / "md5sums").write_text("\n".join(sums) + "\n")
    (debian / "control").write_text(_control(target, (size + 1023) // 1024, release))


def build(out: Path, target: Target = TARGET) -> Path:
    """Build the .deb into out; returns its path."""
    release = __version__
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{PACKAGE}_{release}_{ARCH}.deb"
    cache_root().mkdir(parents=True, exist_ok=True)  # a new machine has none until the first build
    with tempfile.TemporaryDirectory(prefix="amdgpu-exporter-deb-", dir=cache_root()) as tmp:
        work = Path(tmp)
        wheel = project_wheel(work / "dist")
        tree = venv(target, wheel, work)
        root = work / "root"
        stage_tree(target, tree, root, release)
        # zstd -9: 2 s where xz takes a minute, for ~20% more bytes (dpkg reads zstd since 1.21.18)
        _run(["dpkg-deb", "--root-owner-group", "-Zzstd", "-z9", "--build", str(root), str(deb)], "dpkg-deb")
    return deb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="folder for the .deb (default: dist/)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("make deb: needs root (mmdebstrap --mode=root and overlay mounts)", file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        print(f"building for Debian {TARGET.suite} (python{TARGET.python}) from {debian_mirror()}", flush=True)
        deb = build(args.out)
    except (ChrootBuildError, DebBuildError) as error:
        print(f"make deb: {error}", file=sys.stderr)
        return 1
    size = deb.stat().st_size
    print(f"{deb} ({size / 1e6:.1f} MB) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
