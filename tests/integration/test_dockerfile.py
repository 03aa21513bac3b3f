"""The Dockerfile: hadolint-clean, and its install steps really produce a working exporter.

There is no container engine here, so the build is replayed on the host: each stage gets a folder
that stands for its root file system, COPY copies what the build context (after .dockerignore)
holds, and the Python RUN steps run as written with the image's paths mapped into those folders.
The result is started as the image's USER with the image's ENTRYPOINT, and the HEALTHCHECK command
is run against it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness import free_port
from tests.realtools import require_tool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

# deploy/image/build.py (not a package): what the reference image is made of
_spec = importlib.util.spec_from_file_location("image_build", REPO / "deploy" / "image" / "build.py")
assert _spec is not None and _spec.loader is not None
image_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image_build)
# The replay's stand-in for the runtime stage's `python3` must be one the image's USER can execute;
# the build stage's must have pip. (The image's own Python, sid's, runs in test_oci_image.py.)
RUNTIME_PYTHON = Path("/usr/bin/python3")
BUILD_TOOLS = re.compile(r"^(gcc|g\+\+|cpp|make|build-essential|clang|.*-dev)(=.*)?$")


# --- Reading the Dockerfile ----------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    flags: dict[str, str]  # --mount=..., --from=..., --interval=... (last one of a name wins)
    args: str


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for item in shlex.split(instruction.args):
                key, sep, value = item.partition("=")
                assert sep, f"use ENV KEY=value: {instruction.args!r}"
                env[key] = value
        return env


def parse_dockerfile(text: str) -> list[Stage]:
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue  # comments may sit between continuation lines
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append(pending + raw.strip())
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            stages.append(Stage(base=parts[0], name=parts[2] if len(parts) == 3 else str(len(stages))))
            continue
        assert stages, f"{keyword} before FROM"
        stages[-1].instructions.append(Instruction(keyword, flags, rest))
    return stages


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list), f"{instruction.keyword} must use the exec (JSON) form"
    return [str(item) for item in value]


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line, in order; Docker's rules: * and ? stay inside one path
    segment, ** spans segments, a pattern matching a folder matches everything in it."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        regex = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                regex, index = regex + "(?:.*/)?", index + 3
            elif pattern.startswith("**", index):
                regex, index = regex + ".*", index + 2
            elif pattern[index] == "*":
                regex, index = regex + "[^/]*", index + 1
            elif pattern[index] == "?":
                regex, index = regex + "[^/]", index + 1
            elif pattern[index] == "[":
                end = pattern.index("]", index)
                regex, index = regex + pattern[index : end + 1], end + 1
            else:
                regex, index = regex + re.escape(pattern[index]), index + 1
        patterns.append((negate, re.compile(regex)))
    return patterns


def in_build_context(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negate
    return not excluded


# --- Replaying the build -------------------------------------------------------------------------

# Top-level folders that are the host's own: paths under them mean the same inside the image.
HOST_TOPS = {"bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "sys", "tmp", "usr", "var"}


@dataclass
class Replay:
    root: Path  # stands for this stage's /
    stages: list[Stage]
    mounts: dict[str, Path] = field(default_factory=dict)  # RUN --mount target -> host folder

    def host_path(self, image_path: str) -> str:
        """Where an image path lives in the replay: mounts first, then the stage's root."""
        if not image_path.startswith("/"):
            return image_path
        for target, folder in self.mounts.items():
            if image_path == target or image_path.startswith(target.rstrip("/") + "/"):
                return str(folder) + image_path[len(target.rstrip("/")) :]
        if image_path.strip("/").split("/")[0] in HOST_TOPS:
            return image_path
        return str(self.root) + image_path

    def map_command(self, command: str, python: Path) -> str:
        """A RUN command with `python` and every image path replaced by their replay twins."""
        command = re.sub(r"(^|&&\s*|;\s*)python3?(?=\s)", lambda m: m.group(1) + shlex.quote(str(python)), command)
        return re.sub(r"(?<=[\s=])(/[^\s'\"]*)", lambda m: self.host_path(m.group(1)), command)


def _copy_into(source: Path, destination: Path, patterns: list[tuple[bool, re.Pattern[str]]]) -> int:
    copied = 0
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for path in files:
        if not in_build_context(path.relative_to(REPO).as_posix(), patterns):
            continue
        target = destination / (path.relative_to(source) if source.is_dir() else path.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += 1
    return copied


def _is_python_step(command: str) -> bool:
    return bool(re.match(r"\s*(python3?|/\S+/bin/(pip|python))\s", command))


def replay_stage(stage: Stage, replay: Replay, python: Path, stage_roots: dict[str, Path]) -> None:
    """WORKDIR, COPY and the Python RUN steps of one stage, in order."""
    patterns = dockerignore_patterns()
    env = {**os.environ, **stage.env()}
    workdir = "/"
    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = instruction.args
            Path(replay.host_path(workdir)).mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            assert "from" not in instruction.flags, "the runtime gets the wheels through a RUN mount only"
            *sources, destination = shlex.split(instruction.args)
            target = Path(replay.host_path(str(Path(workdir) / destination)))
            for source in sources:
                assert _copy_into(REPO / source, target, patterns), f"COPY {source}: not in the build context"
        elif instruction.keyword == "RUN":
            if not _is_python_step(instruction.args):
                continue  # OS packages: checked against apt and dpkg by their own test
            mount = instruction.flags.get("mount")
            mounts = dict(replay.mounts)
            if mount:
                spec = dict(item.split("=", 1) for item in mount.split(","))
                assert spec["type"] == "bind"
                source_stage = Replay(stage_roots[spec["from"]], replay.stages)
                mounts[spec["target"]] = Path(source_stage.host_path(spec["source"]))
            command = Replay(replay.root, replay.stages, mounts).map_command(instruction.args, python)
            result = subprocess.run(
                ["sh", "-ec", command],
                cwd=replay.host_path(workdir),
                env=env,
                capture_output=True,
                text=True,
                timeout=400,
            )
            assert result.returncode == 0, f"RUN {command}\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def replay() -> Iterator[Replay]:
    """The final stage's file system, built by replaying every stage."""
    require_tool("python3", path=str(RUNTIME_PYTHON.parent))
    stages = parse_dockerfile(DOCKERFILE.read_text())
    root = Path(tempfile.mkdtemp(prefix="amdgpu-exporter-docker-"))
    try:
        root.chmod(0o755)  # the image's USER must reach the venv inside
        stage_roots = {stage.name: root / "stages" / stage.name for stage in stages[:-1]}
        stage_roots[stages[-1].name] = root
        for stage in stages:
            # The build stage needs pip; the runtime's `python` must be executable by the image's USER.
            python = RUNTIME_PYTHON if stage is stages[-1] else Path(sys.executable)
            replay_stage(stage, Replay(stage_roots[stage.name], stages), python, stage_roots)
        yield Replay(root, stages)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


# --- Tests ---------------------------------------------------------------------------------------


def test_hadolint_finds_nothing() -> None:
    hadolint = require_tool("hadolint")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr

    # hadolint is really judging: the same file without --no-install-recommends draws DL3015.
    with tempfile.TemporaryDirectory() as tmp:
        worse = Path(tmp) / "Dockerfile"
        worse.write_text(DOCKERFILE.read_text().replace(" --no-install-recommends", ""))
        result = subprocess.run([hadolint, str(worse)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3015" in result.stdout


def test_stages_build_a_wheel_then_install_it_without_build_tools() -> None:
    stages = parse_dockerfile(DOCKERFILE.read_text())
    assert len(stages) >= 2
    build, final = stages[0], stages[-1]
    assert any("pip wheel" in run.args for run in build.all("RUN"))
    assert not final.all("COPY"), "the runtime stage copies nothing: wheels come through a RUN mount"
    for run in final.all("RUN"):
        for package in re.findall(r"apt-get install\s+(?:-\S+\s+)*([^&|;]+)", run.args):
            tools = [name for name in package.split() if BUILD_TOOLS.match(name)]
            assert not tools, f"build tools in the runtime image: {tools}"
    patterns = dockerignore_patterns()
    assert in_build_context("exporter/cli.py", patterns)
    for private in (".git/HEAD", ".venv/bin/python", "exporter/__pycache__/cli.cpython-311.pyc", "tests/x.py"):
        assert not in_build_context(private, patterns), f"{private} would be sent to the Docker daemon"
    (user,) = final.all("USER")[-1:]
    uid = user.args.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (runAsNonRoot checks it)"
    (expose,) = final.all("EXPOSE")
    entrypoint = exec_form(final.all("ENTRYPOINT")[-1]) + exec_form(final.all("CMD")[-1])
    assert f"--web.listen-address=:{expose.args}" in entrypoint
    assert Path(entrypoint[0]).name == "amdgpu-exporter"


def test_base_and_os_packages_are_the_reference_images() -> None:
    """Every stage starts from the -slim image of the reference image's Debian suite, and the runtime
    stage installs exactly its pinned packages (deploy/image/debian-packages.txt; test_oci_image.py
    checks the built image holds them and what the `ln -s` lines point at)."""
    suite, pins = image_build.read_packages()
    stages = parse_dockerfile(DOCKERFILE.read_text())
    assert {stage.base for stage in stages} == {f"debian:{suite}-slim"}
    assert _apt_pins(stages[-1]) == pins
    for stage in stages[:-1]:
        named = _apt_pins(stage)
        assert {name: pins.get(name) for name in named} == named, "the build stage's Python is the runtime's"


def _apt_pins(stage: Stage) -> dict[str, str]:
    """package -> version of every `name=version` in the stage's RUN lines."""
    return dict(re.findall(r"\s([a-z0-9][a-z0-9.+-]+)=([0-9][^\s&|;]*)", " ".join(r.args for r in stage.all("RUN"))))


def test_replayed_image_serves_as_its_user_and_passes_its_healthcheck(replay: Replay) -> None:
    setpriv = require_tool("setpriv")
    final = replay.stages[-1]
    entrypoint = [replay.host_path(part) for part in exec_form(final.all("ENTRYPOINT")[-1])]
    uid, _, gid = final.all("USER")[-1].args.partition(":")
    port = free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        **{key: replay.host_path(value) for key, value in final.env().items()},
    }
    as_user = [setpriv, f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups", "--no-new-privs"]
    log_path = replay.root / "exporter.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*as_user, *entrypoint, "--demo", f"--web.listen-address=127.0.0.1:{port}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    healthcheck = final.all("HEALTHCHECK")[-1]
    check = healthcheck.args.split(None, 1)
    assert check[0] == "CMD"
    check_argv = [
        replay.host_path(part).replace("127.0.0.1:9442", f"127.0.0.1:{port}") for part in json.loads(check[1])
    ]
    assert any(f"127.0.0.1:{port}/healthz" in part for part in check_argv), check_argv
    try:
        # /healthz as soon as it listens; /readyz (and /metrics) after the first poll cycle.
        pending = ["/healthz", "/readyz"]
        deadline = time.monotonic() + 30
        while pending:
            assert process.poll() is None, f"exited with {process.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"{pending} never answered 200:\n{log_path.read_text()}"
            with contextlib.suppress(OSError):  # not listening yet
                pending = [path for path in pending if _get(f"http://127.0.0.1:{port}{path}")[0] != 200]
            time.sleep(0.2)
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"amdgpu_exporter_build_info" in body
        result = subprocess.run([*as_user, *check_argv], env=env, capture_output=True, timeout=10)
        assert result.returncode == 0, result.stderr
    finally:
        process.terminate()
        process.wait(timeout=20)
    # With the exporter gone the same HEALTHCHECK reports unhealthy.
    result = subprocess.run([*as_user, *check_argv], env=env, capture_output=True, timeout=10)
    assert result.returncode != 0
