"""The health verdict end to end, through the real daemon: each check fails on a simulated fault with
its reason and age, the node's drain and taint commands name the GPU, and the check clears by its
rule once the fault recovers; an unreadable GPU is not fit and /readyz names it; Node Problem
Detector's check script reads the verdict; `snapshot` and `doctor` show it.

One daemon serves a node of 2 x MI250X (gpu 0-3) and 4 x MI300X (gpu 4-7, the CPER ring and the XGMI
link state are MI300-class), every fault at once on the GPUs of FAULTS, from FAULT_AT for FAULT_FOR
simulated seconds, with a rule file of short windows (the shipped ones are an hour): one module fixture
watches /api/v1/health and /metrics until every check has failed and cleared, and a test per check
reads what it saw. Waits are on conditions, with deadlines only to end a broken run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Simulator
from tests.realtools import EXPORTER, poll_cycles, start_exporter, stop, wait_for_cycles, wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
NPD_CHECK = ROOT / "deploy" / "kubernetes" / "node-problem-detector" / "check_amdgpu_health.sh"
NODE = "gpu-node-1"
FLEET = "2xMI250X,4xMI300X"
FAULT_AT, FAULT_FOR = 8, 16
# check -> (the GPU whose fault raises it, the simulator's fault, words of its reason)
FAULTS: dict[str, tuple[int, str, str]] = {
    "ecc_uncorrectable": (0, "ecc_ue", "uncorrectable ECC errors"),
    "ecc_correctable_rate": (1, "ecc_ce", "correctable ECC errors"),
    "throttling_persistent": (1, "throttle", "clocks held back by ppt0"),
    "pcie_aer_fatal": (2, "aer_fatal", "fatal PCIe AER errors"),
    "pcie_link_degraded": (3, "pcie_downtrain", "PCIe link trained at 8 GT/s x8 of 16 GT/s x16"),
    "cper_fatal": (4, "cper_fatal", "fatal CPER record"),
    "pcie_aer_nonfatal": (4, "aer_nonfatal", "non-fatal PCIe AER errors"),
    "cper_nonfatal": (5, "cper_nonfatal", "nonfatal CPER record"),
    "xgmi_link_down": (5, "xgmi_down", "XGMI link 0 down"),
    "cper_corrected": (6, "cper_corrected", "corrected CPER record"),
    "gpu_reset": (6, "reset", "the GPU was reset"),
    "pcie_aer_correctable_rate": (6, "aer_correctable", "correctable PCIe AER errors"),
    "ecc_deferred": (7, "ecc_de", "deferred ECC errors"),
    "bad_pages_pending": (7, "bad_pages", "not yet retired"),
    "bad_pages_threshold": (7, "bad_pages", "of the driver's bad-page threshold"),
}
# The MI300X's throttle: the ppt residency counter (no throttle bits on MI300)
EXTRA = (("throttling_persistent", 7, "throttle"),)
# Retired pages stay retired: the RMA point does not clear by itself (unit-tested: a new board clears it).
STAYS = {"bad_pages_threshold"}
# The rule file of the run: the shipped checks with windows of seconds (counters 8 s, records 10 s, a
# reset 6 s: shorter than the fault, so it clears by its age while the coredump is still there).
RULES = """\
rules: []
health:
  advice_for: 30s
  checks:
    ecc_uncorrectable: {window: 8s}
    ecc_deferred: {window: 8s}
    ecc_correctable_rate: {threshold: 1, window: 8s}
    cper_fatal: {window: 10s}
    cper_nonfatal: {window: 10s}
    cper_corrected: {threshold: 1, window: 10s}
    gpu_reset: {window: 6s}
    pcie_aer_fatal: {window: 8s}
    pcie_aer_nonfatal: {window: 8s}
    pcie_aer_correctable_rate: {threshold: 1, window: 8s}
    xgmi_link_down: {for: 2s}
    pcie_link_degraded: {for: 2s}
    throttling_persistent:
      for: 3s
      reasons: [ppt0]
      asic_overrides:
        aqua_vanjaram: {reasons: [ppt]}
"""
WINDOW = {"gpu_reset": 6.0, "cper_fatal": 10.0, "cper_nonfatal": 10.0, "cper_corrected": 10.0}
FOR = {"xgmi_link_down": 2.0, "pcie_link_degraded": 2.0, "throttling_persistent": 3.0}
COUNTER_WINDOW = 8.0


def rules_file(tmp: Path, text: str = RULES) -> Path:
    path = tmp / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run([EXPORTER, "check-rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return path


def get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


def health_series(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = get(port, "/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("amdgpu_health"):
            for sample in family.samples:
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def npd(port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AMDGPU_HEALTH_URL": f"http://127.0.0.1:{port}/api/v1/health"}
    return subprocess.run(["sh", str(NPD_CHECK)], capture_output=True, text=True, env=env, timeout=30, check=False)


@dataclass
class Seen:
    """What the watcher saw of one (gpu, check)."""

    first: dict[str, Any] | None = None  # the check's entry when first seen failing
    first_at: float = 0.0  # the document's taken_at then
    oldest_age: float = 0.0  # the largest age_seconds seen
    drain: str = ""  # the node's drain command while it failed
    taint: str = ""
    metric: float | None = None  # amdgpu_health_check while it failed
    since_metric: float | None = None  # the largest amdgpu_health_check_since_seconds seen
    status_metric: float | None = None  # amdgpu_health_status of its GPU while it failed
    cleared_at: float | None = None  # taken_at of the first document without it, after it failed


@dataclass
class Run:
    seen: dict[tuple[int, str], Seen] = field(default_factory=dict)
    documents: list[dict[str, Any]] = field(default_factory=list)
    npd_unfit: subprocess.CompletedProcess[str] | None = None
    last: dict[str, Any] = field(default_factory=dict)


def expected() -> list[tuple[int, str]]:
    return [(gpu, check) for check, (gpu, _kind, _words) in FAULTS.items()] + [(g, c) for c, g, _ in EXTRA]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("health")
    kinds = sorted({f"{kind}.{gpu}" for gpu, kind, _ in FAULTS.values()} | {f"{k}.{g}" for _c, g, k in EXTRA})
    scenario = f"training:faults={'+'.join(kinds)},fault_at={FAULT_AT},fault_for={FAULT_FOR}"
    process, port = start_exporter(
        "--demo",
        f"--demo.fleet={FLEET}",
        f"--demo.scenario={scenario}",
        f"--rules.file={rules_file(tmp)}",
        "--slow-interval=1s",
        f"--node-name={NODE}",
    )
    result = Run()
    try:
        wait_ready(port, process)
        deadline = time.monotonic() + 240
        pending = set(expected())
        while time.monotonic() < deadline:
            document = get(port, "/api/v1/health").json()
            series = health_series(port)
            result.documents.append(document)
            now = document["taken_at"]
            failing = {(g["gpu"], c["check"]): c for g in document["gpus"] for c in g["checks"]}
            for key, check in failing.items():
                seen = result.seen.setdefault(key, Seen())
                if seen.first is None:
                    seen.first, seen.first_at = check, now
                seen.oldest_age = max(seen.oldest_age, check["age_seconds"])
                seen.drain = document["commands"]["slurm"]["suggested_command"]
                seen.taint = document["commands"]["kubernetes"]["suggested_command"]
                gpu, name = str(key[0]), key[1]
                labels = (("check", name), ("gpu", gpu), ("severity", check["severity"]))
                # /metrics is read a moment after the document: a cycle may have cleared the check in
                # between. Only a scrape that still shows the check says what /metrics says about it.
                metric = series.get(("amdgpu_health_check", labels))
                if metric is not None:
                    seen.metric = metric
                    age = series.get(("amdgpu_health_check_since_seconds", (("check", name), ("gpu", gpu))))
                    seen.since_metric = max(seen.since_metric or 0.0, age or 0.0)
                    seen.status_metric = series.get(("amdgpu_health_status", (("gpu", gpu),)))
            for key, seen in result.seen.items():
                if key not in failing and seen.first is not None and seen.cleared_at is None:
                    seen.cleared_at = now
            if failing and result.npd_unfit is None:
                result.npd_unfit = npd(port)
            pending = {key for key in expected() if key[1] not in STAYS} - {
                key for key, seen in result.seen.items() if seen.cleared_at is not None
            }
            if not pending:
                break
            time.sleep(0.5)
        result.last = get(port, "/api/v1/health").json()
        assert not pending, f"never failed and cleared: {sorted(pending)}"
        yield result
    finally:
        stop(process)  # type: ignore[arg-type]


@pytest.mark.parametrize("check", sorted(FAULTS))
def test_each_check_fails_with_its_reason_and_age_and_clears_by_its_rule(run: Run, check: str) -> None:
    gpu, kind, words = FAULTS[check]
    seen = run.seen.get((gpu, check))
    assert seen is not None and seen.first is not None, f"{check} never failed on gpu {gpu} ({kind})"
    first = seen.first
    assert words in first["reason"], first["reason"]
    assert first["severity"] in ("warning", "critical")
    assert first["since"] <= seen.first_at and seen.oldest_age > 0
    # /metrics says the same: the check at 1 with its severity, its age, the GPU not fit
    assert seen.metric == 1 and (seen.since_metric or 0) > 0 and seen.status_metric == 0
    # the node's commands name the GPU and its check, and are the runnable ones
    assert seen.drain.startswith(f"scontrol update nodename={NODE} state=drain reason=")
    assert f"gpu {gpu}: " in seen.drain and check in seen.drain
    assert seen.taint.startswith(f"kubectl taint node {NODE} amd.com/gpu-unhealthy=") and f"gpu{gpu}" in seen.taint
    assert seen.taint.endswith(":NoSchedule --overwrite")
    if check in STAYS:
        last = {c["check"] for g in run.last["gpus"] if g["gpu"] == gpu for c in g["checks"]}
        assert check in last, "the RMA point stays until the board's count is below it"
        return
    assert seen.cleared_at is not None, f"{check} never cleared"
    # by its rule: a held condition fails only after its `for`; a record or reset clears once older
    # than its window, a counter once a window passed without growth
    if check in FOR:
        assert seen.first_at - first["since"] >= FOR[check] - 0.01
    else:
        assert seen.cleared_at - first["since"] >= WINDOW.get(check, COUNTER_WINDOW) - 0.01


def test_the_mi300_throttle_residency_counts_too(run: Run) -> None:
    seen = run.seen.get((7, "throttling_persistent"))
    assert seen is not None and seen.first is not None and "clocks held back by ppt" in seen.first["reason"]
    assert seen.cleared_at is not None


def test_node_problem_detector_sees_the_unfit_gpus(run: Run) -> None:
    assert run.npd_unfit is not None
    assert run.npd_unfit.returncode == 1, run.npd_unfit.stdout + run.npd_unfit.stderr
    assert run.npd_unfit.stdout.startswith("AMD GPU(s) not fit: gpu ")


def test_what_stays_is_only_what_has_not_gone(run: Run) -> None:
    # At the end every GPU is fit but the one whose retired pages reached the driver's threshold.
    unfit = {g["gpu"]: [c["check"] for c in g["checks"]] for g in run.last["gpus"] if not g["fit"]}
    assert unfit == {7: ["bad_pages_threshold"]}, unfit
    assert run.last["unfit_gpus"] == [7] and run.last["fit"] is False


# --- a GPU that cannot be read -------------------------------------------------------------------------


def hang(path: Path) -> bytes:
    """A named pipe in place of `path`: every read blocks, as on a hung SMU. Returns the old content."""
    content = path.read_bytes()
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)
    return content


def unhang(path: Path, content: bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(content)
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # the blocked open()s return; their read sees EOF
    os.close(fd)
    os.replace(temp, path)


def wait_health(port: int, condition: Any, what: str) -> dict[str, Any]:
    last: list[Any] = [None]

    def document() -> dict[str, Any] | None:
        last[0] = get(port, "/api/v1/health").json()
        return last[0] if condition(last[0]) else None

    try:
        return wait_until(document, what, step=0.1)
    except AssertionError as error:
        raise AssertionError(f"{error}; last: {last[0]}") from None


def test_an_unreadable_gpu_is_not_fit_and_readyz_names_it_then_it_recovers(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    simulator = Simulator(root, fleet="2xMI250X", scenario="training", seed=3)
    simulator.write_tree()
    simulator.tick(5.0)
    hung = simulator.truth()[1].identity
    process, port = start_exporter(
        f"--path.sysfs={root}", "--interval=200ms", "--read-timeout=300ms", f"--node-name={NODE}", "--rules.file",
        str(rules_file(tmp_path, "rules: []\nhealth: {advice_for: 1m}\n")),
    )  # fmt: skip
    try:
        wait_ready(port, process)
        gpu = next(d["gpu"] for d in get(port, "/api/v1/devices").json()["devices"]
                   if d["identity"]["pci_bus_id"] == hung.pci_bus_id)  # fmt: skip
        assert wait_health(port, lambda d: d["fit"], "every GPU fit at first")["suggestion"] is None
        assert npd(port).returncode == 0
        content = hang(Path(hung.device_dir) / "gpu_metrics")
        document = wait_health(port, lambda d: gpu in d["unfit_gpus"], "the hung GPU is not fit")
        (entry,) = [g for g in document["gpus"] if g["gpu"] == gpu]
        (check,) = [c for c in entry["checks"] if c["check"] == "device_down"]
        assert check["severity"] == "critical" and "cannot be read" in check["reason"]
        # /readyz stays 200 (the exporter serves the truth) and names the GPU from the same verdict
        ready = get(port, "/readyz")
        assert ready.status_code == 200 and f"not fit, cannot be read: gpu {gpu}: " in ready.text
        series = health_series(port)
        assert series[("amdgpu_health_status", (("gpu", str(gpu)),))] == 0
        assert series[("amdgpu_health_check", (("check", "device_down"), ("gpu", str(gpu)), ("severity", "critical")))]
        drain = document["commands"]["slurm"]["suggested_command"]
        assert drain == f'scontrol update nodename={NODE} state=drain reason="amdgpu-exporter: gpu {gpu}: device_down"'
        assert f"gpu {gpu}" in npd(port).stdout
        unhang(Path(hung.device_dir) / "gpu_metrics", content)
        document = wait_health(port, lambda d: d["fit"], "the GPU recovers")
        # fit again: the undo advice stays, the take-out-of-service commands are gone
        assert document["commands"]["slurm"] == {
            "suggested_command": None,
            "undo_command": f"scontrol update nodename={NODE} state=resume",
        }
        assert document["commands"]["kubernetes"]["undo_command"] == (
            f"kubectl taint node {NODE} amd.com/gpu-unhealthy:NoSchedule-"
        )
        assert "fit again" in document["suggestion"]
        assert get(port, "/readyz").text == "ready\n"
        checked = npd(port)
        assert checked.returncode == 0 and checked.stdout.strip() == "every AMD GPU on the node is fit"
    finally:
        stop(process)  # type: ignore[arg-type]


# --- the operator commands -----------------------------------------------------------------------------

DOWNTRAINED = "training:faults=pcie_downtrain.1,fault_at=0,fault_for=600"


def test_snapshot_shows_the_verdict_and_the_commands(tmp_path: Path) -> None:
    rules = rules_file(tmp_path, "rules: []\nhealth:\n  checks:\n    pcie_link_degraded: {for: 0}\n")
    result = subprocess.run(
        [EXPORTER, "snapshot", "--demo", f"--demo.scenario={DOWNTRAINED}", f"--rules.file={rules}",
         f"--node-name={NODE}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].endswith(" fit")
    rows = {line[:3].strip(): line for line in lines if line[:3].strip().isdigit()}
    assert rows["1"].endswith(" NO") and rows["0"].endswith(" yes")
    assert any("x pcie_link_degraded (warning, 0m00s): PCIe link trained at 8 GT/s x8" in line for line in lines)
    text = " ".join(result.stdout.split())
    assert f'scontrol update nodename={NODE} state=drain reason="amdgpu-exporter: gpu 1: pcie_link_degraded"' in text
    assert f"kubectl taint node {NODE} amd.com/gpu-unhealthy=gpu1:NoSchedule --overwrite" in text


def test_doctor_reports_what_the_verdict_would_be_now() -> None:
    result = subprocess.run(
        [EXPORTER, "doctor", "--demo", f"--demo.scenario={DOWNTRAINED}", f"--node-name={NODE}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = result.stdout.splitlines()
    gpu1 = lines.index(next(line for line in lines if line.startswith("GPU 1 ")))
    finding = next(line for line in lines[gpu1:] if "health" in line.split())
    assert finding.split()[0] == "warn" and "pcie_link_degraded: PCIe link trained at 8 GT/s x8" in finding
    assert f"scontrol update nodename={NODE} state=drain" in result.stdout
    gpu0 = lines.index(next(line for line in lines if line.startswith("GPU 0 ")))
    assert next(line for line in lines[gpu0:] if "health" in line.split()).split()[:3] == ["ok", "health", "fit"]


def test_sighup_rereads_the_health_thresholds_and_an_invalid_section_keeps_them(tmp_path: Path) -> None:
    off = "rules: []\nhealth:\n  checks:\n    pcie_link_degraded: {enabled: false}\n"
    rules = rules_file(tmp_path, off)
    process, port = start_exporter("--demo", f"--demo.scenario={DOWNTRAINED}", f"--rules.file={rules}")
    try:
        wait_ready(port, process)
        wait_for_cycles(port, poll_cycles(port) + 2)
        assert 1 not in get(port, "/api/v1/health").json()["unfit_gpus"]  # turned off: the downtrained link is fine
        rules.write_text("rules: []\nhealth:\n  checks:\n    pcie_link_degraded: {for: 0}\n", encoding="utf-8")
        process.send_signal(signal.SIGHUP)
        document = wait_health(port, lambda d: 1 in d["unfit_gpus"], "the re-read threshold judges the link")
        (entry,) = [g for g in document["gpus"] if g["gpu"] == 1]
        assert [c["check"] for c in entry["checks"]] == ["pcie_link_degraded"]
        # an invalid health section: what runs stays, the failure is counted
        rules.write_text("rules: []\nhealth:\n  checks:\n    pcie_link_degraded: {for: soon}\n", encoding="utf-8")
        process.send_signal(signal.SIGHUP)
        wait_until(
            lambda: 'amdgpu_exporter_reloads_total{result="failure",what="rules"} 1.0' in get(port, "/metrics").text
        )
        wait_for_cycles(port, poll_cycles(port) + 2)
        assert 1 in get(port, "/api/v1/health").json()["unfit_gpus"]
    finally:
        stop(process)  # type: ignore[arg-type]


def test_check_rules_names_the_line_of_a_bad_health_threshold(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: []\nhealth:\n  checks:\n    cper_fatal:\n      window: soon\n", encoding="utf-8")
    result = subprocess.run([EXPORTER, "check-rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"amdgpu-exporter: error: {path} line 5: 'window' must be a duration"), (
        result.stderr
    )
