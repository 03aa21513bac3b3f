"""The OCI image `make image` builds (deploy/image/build.py), run as a container would run it.

No container engine runs here, so the test is the runtime: `umoci unpack` turns the image into a
runtime bundle (its config.json holds the image's command, environment and user), and the bundle's
root file system runs read-only in a private mount and PID namespace, as PID 1, as the image's
USER with every capability dropped and no_new_privs, with a simulated MI300X in CPX mode (eight
partitions) as its read-only /sys, a fresh /proc, /dev holding the usual character devices, and tmpfs on
/tmp and /dev/shm. The host's network is shared, so the test scrapes it on 127.0.0.1.

What stands in for the GPU's DRM nodes given to the container (`docker run --device /dev/dri`), as
in the oracle tests: a plain file per DRM node in /dev/dri, open to every user as udev makes render
nodes (mode 0666), and the libdrm_amdgpu stand-in (tests/oracles) first on LD_LIBRARY_PATH; and for a bare-metal
host, /proc/cpuinfo without the `hypervisor` flag (on a VM guest libamd_smi hides some values). With them,
librocm_smi64 6.4 in the image passes the exporter's self-check, so `--source auto` picks
rocm-smi: auto chooses librocm_smi64 when it can read this /sys and sysfs otherwise, never
amd-smi, which serves only when asked for by name.

The image's Debian layer is cached per machine (build.py), as are the sid chroot and the libdrm
stand-in (tests/oracles/chroots.py): only the first run on a machine builds them; every run
builds the exporter's own layer on top, as `make image` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from exporter import __version__
from exporter.simulator import Simulator
from tests.built import BuildError, release_image
from tests.integration.test_dockerfile import DOCKERFILE, exec_form, image_build, parse_dockerfile
from tests.oracles.chroots import SID, ChrootBuildError, ensure_chroot, ensure_fake_libdrm
from tests.oracles.runner import cpuinfo_without_hypervisor
from tests.realtools import free_port, listens_on, require_root, require_tool, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "image" / "build.py"

FAKE_LIBDRM_MOUNT = "/opt/fake-libdrm"
FLEET = "1xMI300X:CPX"
# Character devices a container runtime gives every container.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

# $1 rootfs, $2 tree, $3 scratch, $4 libdrm stand-in folder, then setpriv's and the command's argv.
# The root is made read-only after its mount points exist (docker run --read-only).
_CONTAINER_SCRIPT = r"""
set -e
root=$1 tree=$2 scratch=$3 libdrm=$4
shift 4
mkdir -p "$root@LIBDRM@"
mount --bind "$root" "$root"
mount --bind "$tree" "$root/sys"
mount -o remount,bind,ro "$root/sys"
mount -t proc proc "$root/proc"
mount --bind "$scratch/cpuinfo" "$root/proc/cpuinfo"
mount -t tmpfs -o mode=755 tmpfs "$root/dev"
for dev in @DEVICES@; do : > "$root/dev/$dev"; mount --bind "/dev/$dev" "$root/dev/$dev"; done
ln -s /proc/self/fd "$root/dev/fd"
mkdir "$root/dev/shm" "$root/dev/dri" "$root/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
for node in "$tree"/class/drm/card* "$tree"/class/drm/renderD*; do
  [ -e "$node" ] && : > "$root/dev/dri/${node##*/}" && chmod 666 "$root/dev/dri/${node##*/}"
done
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount --bind "$libdrm" "$root@LIBDRM@"
mount -o remount,bind,ro "$root"
exec chroot "$root" "$@"
""".replace("@LIBDRM@", FAKE_LIBDRM_MOUNT).replace("@DEVICES@", " ".join(DEVICES))


@dataclass(frozen=True)
class Image:
    layout: Path
    tag: str
    bundle: Path  # `umoci unpack` of the image: config.json and rootfs/

    @property
    def rootfs(self) -> Path:
        return self.bundle / "rootfs"

    def runtime_config(self) -> dict:
        return json.loads((self.bundle / "config.json").read_text())

    def image_config(self) -> dict:
        index = json.loads((self.layout / "index.json").read_text())
        (entry,) = index["manifests"]
        manifest = json.loads(_blob(self.layout, entry["digest"]))
        return json.loads(_blob(self.layout, manifest["config"]["digest"]))


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    return (layout / "blobs" / algorithm / hexdigest).read_bytes()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    """The image as `make image` builds it, built once per machine for these inputs (tests/built.py;
    its Debian layer from build.py's own cache), unpacked for this run."""
    require_root()
    require_tool("mmdebstrap")
    umoci = require_tool("umoci")
    try:
        layout = release_image(sys.executable)
    except (BuildError, ChrootBuildError) as error:
        pytest.fail(str(error), pytrace=False)
    _name, tag = image_build.image_reference()
    work = tmp_path_factory.mktemp("oci-image")
    bundle = work / "bundle"
    result = subprocess.run([umoci, "unpack", "--image", f"{layout}:{tag}", bundle], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    yield Image(layout, tag, bundle)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def fake_libdrm() -> Path:
    try:
        return ensure_fake_libdrm(ensure_chroot(SID))
    except ChrootBuildError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated MI300X in CPX mode, written once and then frozen: every run reads the same values."""
    root = tmp_path_factory.mktemp("mi300x-cpx") / "sys"
    simulator = Simulator(root, fleet=FLEET, scenario="training", seed=7)
    simulator.write_tree()
    simulator.tick(21.0)
    # the container's user (65534) reads it as it reads a host's world-readable sysfs
    for parent in [root, *root.parents]:
        if parent == Path(tempfile.gettempdir()):
            break
        parent.chmod(parent.stat().st_mode | 0o755)
    return root


class Container:
    """The image's process, as a container runtime would start it; `pid` is its PID outside."""

    def __init__(self, image: Image, tree: Path, libdrm: Path, args: Sequence[str]) -> None:
        process_spec = image.runtime_config()["process"]
        user = process_spec["user"]
        entrypoint = exec_form_of(image.image_config()["config"]["Entrypoint"])
        # arguments after the image name replace its CMD, as with `docker run IMAGE ARGS`
        self.port = free_port()
        self.args = [*entrypoint, f"--web.listen-address=127.0.0.1:{self.port}", "--log.format=json", *args]
        env = [*process_spec["env"], f"LD_LIBRARY_PATH={FAKE_LIBDRM_MOUNT}"]
        self.drop = [
            "/usr/bin/setpriv", f"--reuid={user['uid']}", f"--regid={user['gid']}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            "/usr/bin/env", "-i", *env,
        ]  # fmt: skip
        self.scratch = Path(tempfile.mkdtemp(prefix="oci-container-"))
        self.final_output = ""
        (self.scratch / "cpuinfo").write_text(cpuinfo_without_hypervisor(Path("/proc/cpuinfo").read_text()))
        self.log = self.scratch / "log"
        unshare = require_tool("unshare")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [unshare, "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
                 "sh", "-c", _CONTAINER_SCRIPT, "container", image.rootfs, tree, self.scratch, libdrm,
                 *self.drop, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(lambda: self._child() is not None or self.process.poll() is not None)
        self.pid = self._child() or 0

    def _child(self) -> int | None:
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else self.final_output

    def wait_listening(self) -> None:
        def listening() -> bool:
            assert self.process.poll() is None, f"exited with {self.process.returncode}:\n{self.output()}"
            return listens_on(self.pid, self.port)

        wait_until(listening)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", headers={"Accept": "text/plain"}, timeout=30)

    def wait_ready(self) -> None:
        self.wait_listening()
        wait_until(lambda: self.get("/readyz").status_code == 200)

    def exec(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """argv beside the exporter (`docker exec`): in its namespaces and root, as its user."""
        nsenter = require_tool("nsenter")
        command = [nsenter, f"--target={self.pid}", "--mount", "--pid", "--root", "--wd", *self.drop, *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    def stop(self) -> int:
        """SIGTERM to the exporter (PID 1 in its namespace); its exit status."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.final_output = self.output()
            shutil.rmtree(self.scratch, ignore_errors=True)


def exec_form_of(value: object) -> list[str]:
    assert isinstance(value, list), value
    return [str(item) for item in value]


def _samples(text: str) -> dict[str, float]:
    """GPU samples of a /metrics page (series -> value); the exporter's own series left out."""
    out = {}
    for line in text.splitlines():
        if line.startswith("amdgpu_") and not line.startswith("amdgpu_exporter_"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def _status(pid: int) -> dict[str, str]:
    fields = (line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: value.strip() for key, value in fields}


# --- Tests ---------------------------------------------------------------------------------------


def test_image_config_is_the_dockerfiles(image: Image) -> None:
    """The same USER, ENTRYPOINT, CMD, EXPOSE, ENV, LABELs and HEALTHCHECK as the Dockerfile's last stage."""
    final = parse_dockerfile(DOCKERFILE.read_text())[-1]
    config = image.image_config()["config"]
    assert config["User"] == final.all("USER")[-1].args == "65534:65534"
    assert config["Entrypoint"] == exec_form(final.all("ENTRYPOINT")[-1])
    assert config["Cmd"] == exec_form(final.all("CMD")[-1])
    assert list(config["ExposedPorts"]) == [f"{final.all('EXPOSE')[-1].args}/tcp"]
    env = dict(item.split("=", 1) for item in config["Env"])
    runtime_env = {k: v for k, v in final.env().items() if not k.startswith("PIP_")}  # pip's are build-time only
    assert {k: env.get(k) for k in runtime_env} == runtime_env
    labels = dict(re.findall(r'(\S+)="([^"]*)"', " ".join(i.args for i in final.all("LABEL"))))
    assert labels and {k: config["Labels"].get(k) for k in labels} == labels
    assert config["Labels"]["org.opencontainers.image.version"] == image.tag == __version__
    healthcheck = final.all("HEALTHCHECK")[-1]
    kind, _, command = healthcheck.args.partition(" ")
    assert config["Healthcheck"]["Test"] == [kind, *json.loads(command)]
    seconds = 1_000_000_000
    for flag, key in (("interval", "Interval"), ("timeout", "Timeout"), ("start-period", "StartPeriod")):
        assert config["Healthcheck"][key] == int(healthcheck.flags[flag].rstrip("s")) * seconds, flag
    assert config["Healthcheck"]["Retries"] == int(healthcheck.flags["retries"])
    assert image.runtime_config()["process"]["user"]["uid"] == 65534


def test_image_holds_the_pinned_debian_packages_and_the_locked_wheels(image: Image) -> None:
    _suite, pins = image_build.read_packages()
    listing = subprocess.run(
        ["dpkg-query", f"--admindir={image.rootfs}/var/lib/dpkg", "-W", "-f=${Package} ${Version}\\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = dict(line.split(" ", 1) for line in listing.splitlines())
    assert {name: installed.get(name) for name in pins} == pins
    # what the Dockerfile links exists in the image: $ROCM_PATH's library and libdrm_amdgpu's bare name
    final = parse_dockerfile(DOCKERFILE.read_text())[-1]
    links = re.findall(r"ln -s\s+(\S+)\s+(\S+)", " ".join(r.args for r in final.all("RUN")))
    assert links
    for target, name in links:
        link = image.rootfs / name.lstrip("/")
        assert link.is_symlink() and os.readlink(link) == target, name
        pointed = image.rootfs / target.lstrip("/") if target.startswith("/") else link.parent / target
        assert pointed.is_file(), f"{name} -> {target}: no such library in the image"
    pip = [f"{image_build.VENV}/bin/pip", "--disable-pip-version-check"]
    freeze = subprocess.run(
        ["chroot", image.rootfs, *pip, "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    locked = set(re.findall(r"^([a-z0-9][a-z0-9._-]*==\S+) \\$", image_build.RUNTIME_LOCK.read_text(), re.MULTILINE))
    frozen = {line.lower().replace("_", "-") for line in freeze.splitlines()}
    assert {pin.lower() for pin in locked} <= frozen
    assert f"amdgpu-exporter=={__version__}" in frozen
    # --source=amd-smi needs Debian's amdsmi module, from the venv's Python
    found = subprocess.run(
        ["chroot", image.rootfs, f"{image_build.VENV}/bin/python", "-c", "import amdsmi; print(amdsmi.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.stdout.startswith("/usr/share/amd_smi/amdsmi/"), found.stderr
    assert not (image.rootfs / "dev").exists() or not any((image.rootfs / "dev").iterdir())


def test_container_picks_rocm_smi_reads_what_sysfs_reads_as_nobody_and_stops_on_sigterm(
    image: Image, tree: Path, fake_libdrm: Path
) -> None:
    sysfs = Container(image, tree, fake_libdrm, ["--source=sysfs"])
    try:
        sysfs.wait_ready()
        expected = _samples(sysfs.get("/metrics").text)
    finally:
        assert sysfs.stop() == 0, sysfs.output()

    amd_smi = Container(image, tree, fake_libdrm, ["--source=amd-smi"])
    try:
        amd_smi.wait_ready()
        (build_info,) = [line for line in amd_smi.get("/metrics").text.splitlines() if "_build_info{" in line]
        assert 'source="amd-smi"' in build_info, build_info
    finally:
        assert amd_smi.stop() == 0, amd_smi.output()

    container = Container(image, tree, fake_libdrm, [])  # --source auto, the default
    try:
        container.wait_ready()
        status = _status(container.pid)
        assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
        assert status["Groups"] == ""
        for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[caps], 16) == 0, (caps, status[caps])
        assert status["NoNewPrivs"] == "1"
        assert status["NSpid"].split()[-1] == "1", "the exporter is its namespace's PID 1, as in a container"

        metrics = container.get("/metrics").text
        (build_info,) = [line for line in metrics.splitlines() if line.startswith("amdgpu_exporter_build_info{")]
        assert 'source="rocm-smi"' in build_info, build_info
        devices = container.get("/api/v1/devices").json()
        assert len(devices["devices"]) == 8, devices

        # the image's HEALTHCHECK, run as Docker runs it, on the port the exporter listens on and on one it does not
        healthcheck = image.image_config()["config"]["Healthcheck"]["Test"]
        assert healthcheck[0] == "CMD"
        for port, healthy in ((container.port, True), (free_port(), False)):
            argv = [part.replace("127.0.0.1:9442", f"127.0.0.1:{port}") for part in healthcheck[1:]]
            result = container.exec(argv)
            assert (result.returncode == 0) == healthy, (port, result.stderr)

        samples = _samples(metrics)
        # when each was read; and PCIe throughput, which the library measures on its own schedule
        unequal = re.compile(r"^amdgpu_(sample_timestamp_seconds|pcie_\w*bandwidth)")
        ours = {series: value for series, value in samples.items() if not unequal.match(series)}
        theirs = {series: value for series, value in expected.items() if not unequal.match(series)}
        assert ours == theirs
        assert len(ours) > 100
    finally:
        exit_status = container.stop()
    assert exit_status == 0, container.output()
