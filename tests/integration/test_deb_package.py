"""The .deb as a site installs it: built by `make deb`'s code, installed with apt into a fresh Debian
chroot of the release it is built for, then run there.

The node is an overlay over a cached mmdebstrap chroot of that release (tests/oracles/chroots.py)
holding only what a node has anyway (systemd, passwd): apt has to resolve the package's own
dependencies (python3.13) from the mirror. The overlay lives in a private mount namespace held by
one process for the module; every command enters it with nsenter, and the mounts go with it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deploy.deb.build import PREFIX, TARGET, DebBuildError
from exporter import __version__
from tests.built import release_deb
from tests.integration.test_doctor_cli import make_host
from tests.oracles.chroots import ChrootBuildError, cache_root, ensure_chroot
from tests.realtools import require_root, require_tool, start_listening, stop, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# Holds the namespace: mounts the node's overlay, says so, then waits for stdin to close.
_HOLD_NAMESPACE = r"""
set -eu
base=$1 work=$2 share=$3
mkdir -p "$work/upper" "$work/work" "$work/root"
mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/work" "$work/root"
mount -t proc proc "$work/root/proc"
mount -t tmpfs tmpfs "$work/root/dev/shm"
mkdir -p "$work/root/srv/test"
mount --bind "$share" "$work/root/srv/test"
echo mounted
exec cat >/dev/null
"""

# setpriv execs (runuser would fork): the process the tests wait on is the exporter itself
_AS_SERVICE_USER = ("setpriv", "--reuid=amdgpu-exporter", "--regid=amdgpu-exporter", "--init-groups")


@dataclass
class Node:
    """A fresh chroot of the target release, in a private mount namespace."""

    holder: subprocess.Popen[str]
    root: Path  # the merged overlay, as the namespace sees it
    share: Path  # a host folder the chroot sees as /srv/test

    def argv(self, *command: str) -> list[str]:
        env = ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "chroot", str(self.root), *env, *command]

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.argv(*command), capture_output=True, text=True, timeout=600, check=False)
        if check:
            assert result.returncode == 0, (
                f"{' '.join(command)}: exit {result.returncode}\n{result.stdout}{result.stderr}"
            )
        return result


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    """The .deb (built once per machine for these inputs: tests/built.py), and the cached chroot of a
    fresh node; on a new machine both are built from the mirror at once (mostly waiting on downloads
    and dpkg, not on the cores)."""
    require_root()
    for tool in ("mmdebstrap", "dpkg-deb", "unshare", "nsenter"):
        require_tool(tool)
    with ThreadPoolExecutor(max_workers=1) as pool:
        base = pool.submit(ensure_chroot, TARGET.install_chroot)
        try:
            deb = release_deb()
            return deb, base.result()
        except (ChrootBuildError, DebBuildError) as error:
            pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def deb(built: tuple[Path, Path]) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def node(built: tuple[Path, Path]) -> Iterator[Node]:
    deb, base = built
    work = Path(tempfile.mkdtemp(prefix="deb-node-", dir=cache_root()))
    share = Path(tempfile.mkdtemp(prefix="deb-share-"))
    share.chmod(0o755)  # the service user reads the simulated tree
    shutil.copy2(deb, share / deb.name)
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _HOLD_NAMESPACE, "hold", base, work, share],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "mounted", holder.stderr.read() if holder.stderr else ""
    made = Node(holder, work / "root", share)
    try:
        made.run("apt-get", "update", "-qq")
        made.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", f"/srv/test/{deb.name}")
        yield made
    finally:
        stop(holder)  # closes its stdin: the holder exits and the namespace's mounts go with it
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(share, ignore_errors=True)


def test_the_package_holds_the_venv_units_env_file_and_slurm_scripts(deb: Path) -> None:
    listing = subprocess.run(["dpkg-deb", "--contents", deb], capture_output=True, text=True, check=True).stdout
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    for path in (
        f"{PREFIX}/bin/amdgpu-exporter",
        f"{PREFIX}/pyvenv.cfg",
        "/usr/bin/amdgpu-exporter",
        "/usr/lib/systemd/system/amdgpu-exporter.service",
        "/usr/lib/systemd/system/amdgpu-exporter.socket",
        "/etc/default/amdgpu-exporter",
        "/usr/share/amdgpu-exporter/slurm/prolog.sh",
        "/usr/share/amdgpu-exporter/slurm/epilog.sh",
    ):
        assert path in paths, f"{path} is not in the package"
    # dpkg owns the venv: no pip inside to change it behind dpkg's back
    assert not any(path.startswith(f"{PREFIX}/bin/pip") for path in paths)
    fields = subprocess.run(["dpkg-deb", "--field", deb], capture_output=True, text=True, check=True).stdout
    assert f"Version: {__version__}\n" in fields
    assert f"python{TARGET.python} " in fields
    conffiles = subprocess.run(["dpkg-deb", "--ctrl-tarfile", deb], capture_output=True, check=True).stdout
    assert b"/etc/default/amdgpu-exporter" in conffiles


def test_installed_exporter_runs_on_the_release_python(node: Node) -> None:
    assert node.run("amdgpu-exporter", "--version").stdout.split()[-1] == __version__
    config = node.run("cat", f"{PREFIX}/pyvenv.cfg").stdout
    assert f"executable = /usr/bin/python{TARGET.python}" in config
    node.run(f"{PREFIX}/bin/python", "-c", "import grpc, uvloop, pydantic_core, yaml, bcrypt, httptools")


def test_service_user_is_a_system_user_in_video_and_render(node: Node) -> None:
    entry = node.run("getent", "passwd", "amdgpu-exporter").stdout.strip().split(":")
    assert int(entry[2]) < 1000, entry  # a system uid
    assert entry[6] == "/usr/sbin/nologin"
    groups = node.run("id", "-nG", "amdgpu-exporter").stdout.split()
    assert {"video", "render"} <= set(groups), groups
    # configuring again (an upgrade, dpkg-reconfigure) changes nothing and does not fail
    node.run("dpkg-reconfigure", "amdgpu-exporter")
    assert node.run("id", "-nG", "amdgpu-exporter").stdout.split() == groups


def test_installed_units_verify_and_the_service_is_enabled(node: Node) -> None:
    result = node.run(
        "systemd-analyze", "verify",
        "/usr/lib/systemd/system/amdgpu-exporter.service", "/usr/lib/systemd/system/amdgpu-exporter.socket",
        check=False,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    assert node.run("systemctl", "is-enabled", "amdgpu-exporter.service", check=False).stdout.strip() == "enabled"


def test_doctor_on_a_simulated_host_as_the_service_user(node: Node) -> None:
    made = make_host()
    host = node.share / "host"  # /srv/test/host in the chroot
    shutil.move(made.root, host)
    try:
        inside = Path("/srv/test/host")
        # device nodes as udev makes them, root:render 0660: only the groups the package gave its
        # user open them
        nodes = [inside / "dev/kfd", *(inside / "dev/dri" / entry.name for entry in (host / "dev/dri").iterdir())]
        node.run("chgrp", "render", *map(str, nodes))
        node.run("chmod", "0660", *map(str, nodes))
        args = [f"--path.{name}={inside / folder}" for name, folder in
                (("sysfs", "sys"), ("procfs", "proc"), ("dev", "dev"), ("rocm", "opt"))]  # fmt: skip
        result = node.run(*_AS_SERVICE_USER, "amdgpu-exporter", "doctor", *args)
        assert result.stdout.rstrip().endswith("0 fail"), result.stdout
        assert "7 found" in result.stdout
        assert "amdgpu-exporter in video and render" in result.stdout
    finally:
        shutil.rmtree(host, ignore_errors=True)


def test_demo_serves_metrics_as_the_service_user(node: Node) -> None:
    process, port = start_listening(
        lambda port: node.argv(
            *_AS_SERVICE_USER, "amdgpu-exporter", "--demo", f"--web.listen-address=127.0.0.1:{port}"
        ),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, process)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": "text/plain"}, timeout=10).text
        devices = [line for line in text.splitlines() if line.startswith("amdgpu_device_info{")]
        assert len(devices) == 8, text[:2000]  # the demo's 4 x MI250X = 8 GCDs
        assert f'version="{__version__}"' in text
    finally:
        stop(process)


def test_purge_removes_the_files_and_the_user(node: Node) -> None:
    """Last in the module: it removes the package the tests above use."""
    node.run("apt-get", "purge", "-y", "-qq", "amdgpu-exporter")
    assert node.run("getent", "passwd", "amdgpu-exporter", check=False).returncode == 2
    assert node.run("getent", "group", "amdgpu-exporter", check=False).returncode == 2
    assert node.run("getent", "group", "render").returncode == 0  # other users of the GPU keep it
    for path in (PREFIX, "/etc/default/amdgpu-exporter", "/usr/lib/systemd/system/amdgpu-exporter.service",
                 "/etc/systemd/system/multi-user.target.wants/amdgpu-exporter.service"):  # fmt: skip
        assert node.run("test", "-e", path, check=False).returncode == 1, f"{path} is still there"
