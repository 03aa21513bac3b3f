"""Build the amdgpu-exporter OCI image from Debian packages: no container engine, no registry.

    python deploy/image/build.py --wheel dist/amdgpu_exporter-0.1.0-py3-none-any.whl --output build/image

The image has two layers:
1. base: a `mmdebstrap --variant=minbase` root file system of the suite and pinned packages in
   debian-packages.txt (man pages, docs and locales left out, as Debian's -slim images do), with
   the venv /opt/amdgpu-exporter holding exactly the wheels of requirements/runtime.lock (hashes
   checked, wheels only: nothing is compiled). Built once per machine and cached, keyed by a hash
   of everything it is made from, so a rebuild after a change to the exporter reuses it.
2. the exporter's own wheel, installed into that venv without resolving anything, then
   `pip check`: a few hundred kB, made on every build.
umoci packs them (`umoci insert` for the base, `umoci unpack`/`repack` for the diff above it) into
an OCI image layout directory; the image config (user, entrypoint, command, environment, port,
labels and Docker's HEALTHCHECK) is IMAGE_CONFIG below, the same as the Dockerfile's (a test
holds them equal). The image's name and tag are the `images:` entry of
deploy/kubernetes/kustomization.yaml.

Needs root: mmdebstrap --mode=root, chroot, and umoci keeping the files' owners.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PACKAGES_FILE = HERE / "debian-packages.txt"
RUNTIME_LOCK = REPO / "requirements" / "runtime.lock"
KUSTOMIZATION = REPO / "deploy" / "kubernetes" / "kustomization.yaml"
DEFAULT_CACHE = Path("/var/cache/amdgpu-exporter-image")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the way the base layer is built changes (not its inputs): the cache key changes with it.
BASE_FORMAT = 3
VENV = "/opt/amdgpu-exporter"
ARCH = "amd64"
ARCH_WHEEL = "x86_64"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
REF_NAME = "org.opencontainers.image.ref.name"
# Debian's amd-smi installs the `amdsmi` module (alone) in /usr/share/amd_smi; a .pth file in the
# venv adds that folder, and only it, to the venv's path, for --source=amd-smi. The Dockerfile runs
# the same line.
AMDSMI_PTH = "import site; open(site.getsitepackages()[0] + '/debian-amdsmi.pth', 'w').write('/usr/share/amd_smi\\n')"

# What the Dockerfile's final stage declares, in the OCI image config's terms. Healthcheck is
# Docker's extension of the config (durations in nanoseconds); OCI-only runtimes ignore it.
_SECOND = 1_000_000_000
IMAGE_CONFIG: dict[str, object] = {
    "User": "65534:65534",
    "ExposedPorts": {"9442/tcp": {}},
    "Env": [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
        "ROCM_PATH=/opt/rocm",
    ],
    "Entrypoint": [f"{VENV}/bin/amdgpu-exporter"],
    "Cmd": ["--web.listen-address=:9442", "--log.format=json"],
    "WorkingDir": "/",
    "Labels": {
        "org.opencontainers.image.title": "amdgpu-exporter",
        "org.opencontainers.image.description": "Prometheus exporter for AMD Instinct GPUs",
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
    "Healthcheck": {
        "Test": [
            "CMD",
            f"{VENV}/bin/python",
            "-c",
            "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9442/healthz', timeout=4)",
        ],
        "Interval": 30 * _SECOND,
        "Timeout": 5 * _SECOND,
        "StartPeriod": 10 * _SECOND,
        "Retries": 3,
    },
}


class BuildError(RuntimeError):
    """A build step failed; the message says which and why in one line (the log has the rest)."""


def read_packages(path: Path = PACKAGES_FILE) -> tuple[str, dict[str, str]]:
    """(suite, {package: version}) from debian-packages.txt."""
    fields = dict(
        line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    return fields.pop("suite"), fields


def image_reference(path: Path = KUSTOMIZATION) -> tuple[str, str]:
    """(name, tag) of the image: the one `images:` entry of the kustomization."""
    (entry,) = yaml.safe_load(path.read_text())["images"]
    return str(entry["name"]), str(entry["newTag"])


def base_key(suite: str, pins: dict[str, str], mirror: str) -> str:
    material = json.dumps([BASE_FORMAT, ARCH, suite, sorted(pins.items()), mirror, RUNTIME_LOCK.read_text()])
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


def _run(argv: list[str], log: Path, what: str) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise BuildError(f"{what} failed with exit status {result.returncode} (log: {log})")


def _chroot_env() -> list[str]:
    # Nothing of the host's environment (its pip configuration, proxies, paths) reaches the chroot.
    return ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"]


def ensure_base(cache: Path, mirror: str, log: Path) -> Path:
    """The cached OCI layout holding the base layer (tag `base`), built now if this machine has none."""
    suite, pins = read_packages()
    final = cache / f"base-{suite}-{base_key(suite, pins, mirror)}"
    if (final / ".complete").exists():
        return final
    with _locked(cache / f".{final.name}.lock"):
        if (final / ".complete").exists():  # another build made it while we waited
            return final
        _build_base(suite, pins, mirror, final, log)
    return final


def _build_base(suite: str, pins: dict[str, str], mirror: str, final: Path, log: Path) -> None:
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise BuildError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    partial.mkdir(parents=True)
    rootfs = partial / "rootfs"
    argv = [
        mmdebstrap, "--variant=minbase", "--mode=root", "--format=directory", f"--architectures={ARCH}",
        # sid's Release file can be past its Valid-Until date on a mirror that is not refreshed
        '--aptopt=Acquire::Check-Valid-Until "false"',
        '--aptopt=APT::Install-Recommends "false"',  # as the Dockerfile's --no-install-recommends
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--include=" + ",".join(f"{name}={version}" for name, version in pins.items()),
        # librocm_smi64 is loaded as $ROCM_PATH/lib/librocm_smi64.so (pyrsmi) and loads libdrm_amdgpu by
        # its unversioned name, which only libdrm-dev would install: link both to what Debian ships.
        '--customize-hook=mkdir -p "$1/opt/rocm/lib"',
        f'--customize-hook=ln -s {LIBDIR}/librocm_smi64.so.1 "$1/opt/rocm/lib/librocm_smi64.so"',
        f'--customize-hook=ln -s libdrm_amdgpu.so.1 "$1{LIBDIR}/libdrm_amdgpu.so"',
        suite, str(rootfs), mirror,
    ]  # fmt: skip
    _run(argv, log, f"mmdebstrap of {suite}")
    _install_locked_wheels(rootfs, log)
    # A runtime provides /dev, resolv.conf and the host name; the build machine's have no place in the image.
    for node in (rootfs / "dev").iterdir():
        if node.is_dir() and not node.is_symlink():
            shutil.rmtree(node)
        else:
            node.unlink()
    for name in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / name).unlink(missing_ok=True)
    layout = partial / "oci"
    umoci = _umoci()
    _run([umoci, "init", "--layout", str(layout)], log, "umoci init")
    _run([umoci, "new", "--image", f"{layout}:base"], log, "umoci new")
    _run([umoci, "insert", "--image", f"{layout}:base", "--history.created_by", f"mmdebstrap {suite}",
          str(rootfs), "/"], log, "umoci insert")  # fmt: skip
    shutil.rmtree(rootfs)
    (partial / ".complete").write_text(json.dumps({"suite": suite, "pins": pins, "mirror": mirror}))
    partial.rename(final)


def _installed(rootfs: Path, package: str) -> str:
    result = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f=${Version}", package],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0 or not result.stdout:
        raise BuildError(f"{package} is not installed in the image's root file system")
    return result.stdout


def _install_locked_wheels(rootfs: Path, log: Path) -> None:
    """The venv, with runtime.lock's wheels for the image's Python and glibc. They are fetched here,
    by this machine's pip and its index settings (hashes checked), and installed inside with
    --no-index: the chroot needs no network and no certificate of this machine's."""
    python = ".".join(_installed(rootfs, "python3").split(".")[:2])  # 3.14.8-1 -> 3.14
    glibc = int(_installed(rootfs, "libc6").split(".")[1].split("-")[0])  # 2.43-7 -> 43
    wheels = rootfs / "tmp" / "wheels"
    tags = [f"--platform=manylinux_2_{minor}_{ARCH_WHEEL}" for minor in range(5, glibc + 1)]
    tags += [f"--platform=manylinux{alias}_{ARCH_WHEEL}" for alias in ("1", "2010", "2014")]
    _run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--implementation=cp", f"--python-version={python}", *tags,
         "--require-hashes", "-r", str(RUNTIME_LOCK), "--dest", str(wheels)],
        log, f"downloading the locked wheels for Python {python}",
    )  # fmt: skip
    shutil.copy(RUNTIME_LOCK, wheels / "runtime.lock")
    chroot = ["chroot", str(rootfs), *_chroot_env()]
    _run([*chroot, "python3", "-m", "venv", VENV], log, "python3 -m venv")
    _run([*chroot, f"{VENV}/bin/python", "-c", AMDSMI_PTH], log, "the amdsmi module's .pth")
    _run(
        [*chroot, f"{VENV}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-index",
         "--find-links=/tmp/wheels", "--require-hashes", "-r", "/tmp/wheels/runtime.lock"],
        log, "pip install of the locked wheels",
    )  # fmt: skip
    shutil.rmtree(wheels)


def _umoci() -> str:
    umoci = shutil.which("umoci")
    if umoci is None:
        raise BuildError("umoci is not installed (apt-get install umoci)")
    return umoci


def build_image(wheel: Path, output: Path, cache: Path, mirror: str) -> str:
    """The image in the OCI layout `output` (replaced); returns its reference `output:tag`."""
    if os.geteuid() != 0:
        raise BuildError("building the image needs root (mmdebstrap --mode=root, chroot, umoci keeping owners)")
    cache.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    log = output.with_name(output.name + ".log")
    log.write_text("")
    base = ensure_base(cache, mirror, log)
    name, tag = image_reference()
    umoci = _umoci()
    work = Path(tempfile.mkdtemp(prefix="amdgpu-exporter-image-", dir=output.parent))
    try:
        layout = work / "oci"
        shutil.copytree(base / "oci", layout)
        bundle = work / "bundle"
        _run([umoci, "unpack", "--image", f"{layout}:base", str(bundle)], log, "umoci unpack")
        rootfs = bundle / "rootfs"
        shutil.copy(wheel, rootfs / "tmp" / wheel.name)
        pip = ["chroot", str(rootfs), *_chroot_env(), f"{VENV}/bin/pip", "--no-cache-dir"]
        pip.append("--disable-pip-version-check")  # the chroot has no network (nor DNS)
        _run([*pip, "install", "--no-index", "--no-deps", f"/tmp/{wheel.name}"], log, "pip install of the wheel")
        _run([*pip, "check"], log, "pip check")
        (rootfs / "tmp" / wheel.name).unlink()
        _run([umoci, "repack", "--image", f"{layout}:{tag}", "--history.created_by", f"pip install {wheel.name}",
              str(bundle)], log, "umoci repack")  # fmt: skip
        _run([umoci, "rm", "--image", f"{layout}:base"], log, "umoci rm")
        set_config(layout, tag, IMAGE_CONFIG, {"org.opencontainers.image.version": tag})
        _run([umoci, "gc", "--layout", str(layout)], log, "umoci gc")
        shutil.rmtree(output, ignore_errors=True)
        layout.rename(output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{name}:{tag} in the OCI layout {output} (base layer cached in {base})")
    return f"{output}:{tag}"


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _write_blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(layout, digest).write_bytes(data)
    return digest, len(data)


def set_config(layout: Path, tag: str, config: dict[str, object], labels: dict[str, str]) -> None:
    """Replace the `config` section of tag's image config (umoci has no HEALTHCHECK), and the
    manifest and index entry that name it by digest."""
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    (entry,) = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == tag]
    manifest = json.loads(_blob(layout, entry["digest"]).read_bytes())
    image = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
    section = json.loads(json.dumps(config))
    section["Labels"] = {**section.get("Labels", {}), **labels}
    image["config"] = section
    manifest["config"]["digest"], manifest["config"]["size"] = _write_blob(layout, json.dumps(image).encode())
    entry["digest"], entry["size"] = _write_blob(layout, json.dumps(manifest).encode())
    index_path.write_text(json.dumps(index))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the exporter's wheel (pip wheel --no-deps .)")
    parser.add_argument("--output", type=Path, default=REPO / "build" / "image", help="OCI layout to write")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the base layer is cached")
    parser.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"Debian archive URI (default {DEFAULT_MIRROR})")
    args = parser.parse_args(argv)
    try:
        build_image(args.wheel.resolve(), args.output.resolve(), args.cache, args.mirror)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
