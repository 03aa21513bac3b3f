"""The coverage-guided fuzz target (tests/fuzz/fuzz_parsers.py) run on real seeds for a fixed number of
inputs from a fixed seed: the same work on a busy machine as on an idle one (a time budget would test
less the busier the machine). AMDGPU_EXPORTER_FUZZ_RUNS asks for a longer run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.seeds import write_seeds

FUZZ_RUNS = int(os.environ.get("AMDGPU_EXPORTER_FUZZ_RUNS", "50000"))


def test_fuzz_target_finds_no_crash_in_a_fixed_run(tmp_path: Path) -> None:
    import atheris  # a test dependency: missing, this fails rather than skips

    del atheris
    corpus = tmp_path / "corpus"
    assert write_seeds(corpus, tmp_path / "tree") > 10
    result = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.fuzz_parsers", f"-runs={FUZZ_RUNS}", "-seed=1", "-rss_limit_mb=1024",
         "-timeout=5", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    report = result.stderr[-3000:]
    assert result.returncode == 0, f"the fuzzer found a crash:\n{report}"
    assert "Done" in result.stderr and "cov:" in result.stderr, report
    assert not list(tmp_path.glob("crash-*"))


def test_the_target_rejects_what_breaks_the_contract() -> None:
    """The harness itself can fail: a parser returning NaN is caught."""
    from tests.fuzz import fuzz_parsers

    with pytest.raises(AssertionError, match="non-finite"):
        fuzz_parsers._finite({"x": float("nan")})
