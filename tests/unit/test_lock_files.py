"""requirements/*.lock agree with pyproject.toml: every declared requirement is locked at a version
it allows, with hashes, and the runtime and test locks pin shared packages alike. A pyproject edit
without `make lock` fails here, before any install."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@dataclass(frozen=True)
class Pin:
    version: Version
    marker: Marker | None
    hashes: tuple[str, ...]


def parse_lock(text: str, name: str) -> dict[str, Pin]:
    """name -> pin of a pip requirements file with `name==version [; marker] \\ --hash=...` entries."""
    pins: dict[str, Pin] = {}
    # An entry: its first line, then continuation lines of --hash options; comments in between.
    entries = re.split(r"\n(?=[A-Za-z0-9])", re.sub(r"(?m)^\s*#.*\n", "", text))
    for entry in entries:
        if not entry.strip():
            continue
        head, *rest = entry.split("\\\n")
        requirement = Requirement(head.strip())
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{name}: {head.strip()} is not an exact pin"
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", "".join(rest)))
        pins[canonicalize_name(requirement.name)] = Pin(Version(specifier.version), requirement.marker, hashes)
    return pins


LOCKS = {
    name: parse_lock((REQUIREMENTS / f"{name}.lock").read_text(), f"{name}.lock")
    for name in ("build", "runtime", "test")
}


def _declared(group: str) -> list[Requirement]:
    if group == "runtime":
        return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    if group == "build":
        return [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    return [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][group]]


@pytest.mark.parametrize(
    ("lock", "groups"), [("build", ["build"]), ("runtime", ["runtime"]), ("test", ["runtime", "test"])]
)
def test_every_declared_requirement_is_locked_at_an_allowed_version(lock: str, groups: list[str]) -> None:
    pins = LOCKS[lock]
    for group in groups:
        for requirement in _declared(group):
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{requirement} is not in {lock}.lock: run make lock"
            assert requirement.specifier.contains(pins[name].version, prereleases=True), (
                f"{lock}.lock has {name}=={pins[name].version}, pyproject.toml wants {requirement}: run make lock"
            )


def test_every_pin_carries_hashes() -> None:
    for lock, pins in LOCKS.items():
        unhashed = [name for name, pin in pins.items() if not pin.hashes]
        assert not unhashed, f"{lock}.lock: no --hash for {unhashed}"


def test_runtime_and_test_locks_pin_the_same_versions() -> None:
    runtime, test = LOCKS["runtime"], LOCKS["test"]
    assert runtime.keys() <= test.keys(), f"only in runtime.lock: {sorted(runtime.keys() - test.keys())}"
    differing = {name: (pin.version, test[name].version) for name, pin in runtime.items() if test[name] != pin}
    assert not differing, differing


def test_the_lint_and_type_tools_are_pinned_exactly_in_pyproject() -> None:
    pinned: dict[str, Requirement] = {canonicalize_name(r.name): r for r in _declared("test")}
    for tool in ("ruff", "mypy"):
        (specifier,) = pinned[tool].specifier
        assert specifier.operator == "==", f"{tool} must be pinned exactly: {pinned[tool]}"


def test_prometheus_client_has_an_upper_bound() -> None:
    """/metrics is held to the library's bytes (test_render_format.py): the range ends below an untested release."""
    (requirement,) = [r for r in _declared("runtime") if canonicalize_name(r.name) == "prometheus-client"]
    assert any(s.operator == "<" for s in requirement.specifier), requirement


def test_parser_reads_entries_markers_and_hashes() -> None:
    text = (
        "# header\n"
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via pytest\n"
        "pyyaml==6.0.4\n"
    )
    pins = parse_lock(text, "example.lock")
    assert pins["colorama"] == Pin(Version("0.4.6"), Marker("sys_platform == 'win32'"), ("a" * 64, "b" * 64))
    assert pins["pyyaml"] == Pin(Version("6.0.4"), None, ())
