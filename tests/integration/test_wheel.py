"""The wheel, as a user gets it: built from the files a release ships, installed into a fresh venv
with the locked runtime dependencies, and run from there, away from this checkout.

One venv per test session (in pytest's tmp dir): the locked runtime is installed from
requirements/runtime.lock with its hashes checked, then the session's wheel (built by the locked
setuptools, see conftest.py), without resolving anything, so `pip check` proves the lock satisfies
the wheel's own requirements.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from exporter import __version__
from tests.realtools import free_port, stop, wait_ready
from tests.release import PACKAGE, REPO, install_release

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    @property
    def exporter(self) -> Path:
        return self.venv / "bin" / "amdgpu-exporter"


def _clean_env() -> dict[str, str]:
    """This process's environment without what would make the venv see this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{' '.join(map(str, argv))}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory, runtime_wheels: Path, exporter_wheel: Path) -> Installed:
    # The interpreter under the test's venv, not the venv itself: a fresh venv sees none of its packages.
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    install_release(Path(sys.executable), venv, runtime_wheels, exporter_wheel)
    return Installed(wheel=exporter_wheel, venv=venv)


def test_wheel_holds_every_module_the_package_data_and_the_licence(installed: Installed) -> None:
    assert installed.wheel.name == f"amdgpu_exporter-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        dist_info = f"amdgpu_exporter-{__version__}.dist-info"
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
        licence = wheel.read(f"{dist_info}/licenses/LICENSE")
    shipped = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".yaml", ".typed", ".proto")
    }
    assert f"{PACKAGE}/alerting/default_rules.yaml" in shipped and f"{PACKAGE}/py.typed" in shipped
    assert shipped <= names, f"missing from the wheel: {sorted(shipped - names)}"
    assert not {n for n in names if n.startswith("tests/") or "__pycache__" in n}
    assert licence == (REPO / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "amdgpu-exporter = exporter.cli:main" in entry_points

    # The wheel asks for what pyproject.toml declares, ranges included.
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    required = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    runtime = [r for r in required if "extra ==" not in r]

    def normal(requirement: str) -> tuple[str, str]:
        parsed = Requirement(requirement)
        return canonicalize_name(parsed.name), str(parsed.specifier)

    assert sorted(map(normal, runtime)) == sorted(map(normal, declared))


def test_installed_wheel_reports_its_version_from_its_own_venv(installed: Installed, tmp_path: Path) -> None:
    assert _run([installed.exporter, "--version"], cwd=tmp_path).strip() == f"amdgpu-exporter {__version__}"
    where = _run(
        [installed.venv / "bin" / "python", "-c", "import exporter; print(exporter.__file__)"], cwd=tmp_path
    ).strip()
    assert Path(where).is_relative_to(installed.venv), f"imported {where}, not the installed wheel"


def test_installed_wheel_serves_the_demo_with_its_shipped_rules(installed: Installed, tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [installed.exporter, "--demo", f"--web.listen-address=127.0.0.1:{port}", "--log.format=json"],
        cwd=tmp_path,
        env=_clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(port, process, timeout=30)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        alerts = httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5)
    finally:
        stop(process)  # type: ignore[arg-type]
    assert metrics.status_code == 200
    # The default demo: 4 x MI250X = 8 GCDs, each up.
    up = re.findall(r'^amdgpu_up\{gpu="(\d+)"\} 1\.0$', metrics.text, re.MULTILINE)
    assert sorted(map(int, up)) == list(range(8)), metrics.text[:2000]
    (build_info,) = re.findall(r"^amdgpu_exporter_build_info\{.*\} 1\.0$", metrics.text, re.MULTILINE)
    assert f'version="{__version__}"' in build_info
    # No --rules.file: the daemon parsed the wheel's default_rules.yaml at start-up (it exits when
    # it cannot), and the alerts endpoint answers from those rules.
    assert alerts.status_code == 200, alerts.text
    assert isinstance(alerts.json()["alerts"], list)


def test_installed_wheel_compiles_the_kubelet_proto(installed: Installed, tmp_path: Path) -> None:
    # The pod-resources stubs are made from the shipped .proto at import, in memory: no file is written.
    code = (
        "from exporter.attribution import kubernetes as k; pb = k.protos();"
        "r = pb.ListPodResourcesResponse(); p = r.pod_resources.add(name='p', namespace='n');"
        "p.containers.add(name='c').devices.add(resource_name='amd.com/gpu', device_ids=['0000:19:00.0']);"
        "print(k.claims_from_list_response(r.SerializeToString())[0].device_id, k.services().PodResourcesListerStub)"
    )
    out = _run([installed.venv / "bin" / "python", "-c", code], cwd=tmp_path)
    assert out.startswith("0000:19:00.0 <class"), out
    assert not list(installed.venv.rglob("podresources_v1_pb2*.py"))
