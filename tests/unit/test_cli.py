"""The command line: --version, one-line errors with exit code 2, and `snapshot` on a simulated tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter import __version__
from exporter.cli import main
from exporter.simulator import Simulator


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one sentence, never a traceback
    return err[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"amdgpu-exporter {__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval=0s"], "--interval: '0s' must be longer than zero"),
        (["--source=nvml"], "--source: 'nvml' is not one of auto, sysfs, rocm-smi"),
        (["--web.listen-address=nowhere"], "--web.listen-address: 'nowhere' is not host:port"),
        (["--config.file=/nonexistent/amdgpu.yaml"], "config file /nonexistent/amdgpu.yaml: cannot read it"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    line = _error_line(capsys)
    assert line.startswith("amdgpu-exporter: error: ") and message in line


def test_a_bad_rule_file_is_one_line_naming_the_file_and_line(tmp_path: Path, capsys) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - alert: A\n    metric: power_watts\n    comparison: '>'\n    threshold: 1\n    for: 1m30s\n"
    )
    assert main([f"--rules.file={rules}", "--web.listen-address=127.0.0.1:0", f"--path.sysfs={tmp_path}"]) == 2
    assert f"{rules} line 6: 'for' must be a duration" in _error_line(capsys)


def test_snapshot_of_an_empty_root_says_no_gpu(tmp_path: Path, capsys) -> None:
    assert main(["snapshot", f"--path.sysfs={tmp_path}"]) == 2
    assert f"no AMD GPU found under {tmp_path}/class/drm" in _error_line(capsys)


def test_snapshot_prints_every_device_of_a_simulated_node(tmp_path: Path, capsys) -> None:
    root = tmp_path / "sys"
    Simulator(root, "1xMI210,1xMI250X", "idle", seed=3).write_tree()
    assert main(["snapshot", f"--path.sysfs={root}", "--source=sysfs", "--log.level=error", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "sysfs"
    products = [d["identity"]["product"] for d in out["devices"]]
    assert products == ["AMD Instinct MI210", "AMD Instinct MI250X", "AMD Instinct MI250X"]
    assert all(d["up"] and d["sample"]["temperatures"]["junction"] > 0 for d in out["devices"])
    assert [d["identity"]["die"] for d in out["devices"]] == [0, 0, 1]
