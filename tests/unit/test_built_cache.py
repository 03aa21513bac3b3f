"""tests/built.py: a build runs once per machine for one set of inputs, and again when they change."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import built
from tests.oracles.chroots import CACHE_ENV


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_build_runs_once_per_key_and_a_new_key_builds_again(cache: Path) -> None:
    runs: list[Path] = []

    def build(folder: Path) -> None:
        runs.append(folder)
        (folder / "thing").write_text(str(len(runs)))

    first = built.cached_build("thing", "aaaa", build)
    again = built.cached_build("thing", "aaaa", build)
    assert first == again == cache / "thing-aaaa" and len(runs) == 1
    assert (first / "thing").read_text() == "1" and (first / ".complete").exists()
    other = built.cached_build("thing", "bbbb", build)
    assert other != first and len(runs) == 2 and (other / "thing").read_text() == "2"


def test_a_failed_build_leaves_nothing_and_the_next_call_builds(cache: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise built.BuildError("no mirror")

    with pytest.raises(built.BuildError, match="no mirror"):
        built.cached_build("thing", "cccc", broken)
    assert not list(cache.glob("thing-*")) and not list(cache.glob(".thing-*"))
    done = built.cached_build("thing", "cccc", lambda folder: (folder / "whole").write_text("y"))
    assert (done / "whole").exists() and not (done / "half").exists()


def test_only_the_newest_builds_of_a_kind_are_kept(cache: Path) -> None:
    for key in ("k1", "k2", "k3", "k4", "k5"):
        built.cached_build("thing", key, lambda folder: None)
    kept = sorted(p.name for p in cache.glob("thing-*"))
    assert len(kept) == built.KEEP and "thing-k5" in kept


def test_the_key_follows_the_inputs_bytes_and_names() -> None:
    key = built.inputs_key(("pyproject.toml",))
    assert key == built.inputs_key(("pyproject.toml",))
    assert key != built.inputs_key(("pyproject.toml",), "another mirror")
    assert key != built.inputs_key(("LICENSE",))
    assert built.inputs_key() != built.inputs_key(("exporter",)), "every release input counts"
