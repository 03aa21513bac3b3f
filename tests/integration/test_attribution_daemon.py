"""Attribution through the daemon as a process: a fake kubelet (real gRPC on a unix socket), the Slurm
prolog/epilog run with slurmd's environment, the simulator's kfd/proc; what /metrics and the log say."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fake_kubelet import FakeContainer, FakeKubelet, FakePod
from tests.harness import Daemon, Series, wait_until

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
POD_LABELS = ("pod", "namespace", "container")
JOB_LABELS = ("job_id", "job_user", "job_partition")
ATTRIBUTION_FAMILIES = {"amdgpu_allocation_info", "amdgpu_job_info", "amdgpu_exporter_attribution_up"}

Families = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value) of each sample


def by_name(series: Series) -> Families:
    result: Families = {}
    for (name, labels), number in series.items():
        result.setdefault(name, []).append((dict(labels), number))
    return result


def scrape(daemon: Daemon) -> Families:
    return by_name(daemon.scrape())


def wait_for(daemon: Daemon, condition: Callable[[Families], bool], what: str) -> Families:
    # every 0.2 s: the fake kubelet answers from this process, and must do so within its deadline
    return by_name(daemon.wait_for(lambda s: condition(by_name(s)), what, step=0.2))


def events(daemon: Daemon, event: str, **fields: str) -> list[dict]:
    """The daemon's JSON log lines of this event with these fields."""
    return [line for line in daemon.events(event) if all(line.get(k) == v for k, v in fields.items())]


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="attr-") as tmp:  # short: unix socket paths are limited
        yield Path(tmp)


def gpu_bdfs(series: Families) -> dict[str, str]:
    return {labels["gpu"]: labels["pci_bus_id"] for labels, _value in series["amdgpu_device_info"]}


def per_gpu_families(series: Families) -> dict[str, list[dict[str, str]]]:
    return {
        name: [labels for labels, _ in samples]
        for name, samples in series.items()
        if samples and "gpu" in samples[0][0] and not any(name.startswith(f) for f in ATTRIBUTION_FAMILIES)
    }


def holders(daemon: Daemon) -> dict[int, list[dict]]:
    """/api/v1/devices: each device's `holders` (absent when attribution is off), by gpu."""
    response = daemon.get("/api/v1/devices")
    assert response.status_code == 200
    return {device["gpu"]: device["holders"] for device in response.json()["devices"] if "holders" in device}


def slurm(script: str, state: Path, job: str, gpus: str = "") -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": job,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "mi250",
        "SLURM_JOB_GPUS": gpus,
        "SLURM_SCRIPT_CONTEXT": f"{script.removesuffix('.sh')}_slurmd",
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
    }
    result = subprocess.run(["bash", str(DEPLOY / script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_pods_and_jobs_label_every_per_gpu_series_as_an_option_and_leave_nothing_behind(
    work: Path, start_daemon: Callable[..., Daemon]
) -> None:
    kubelet = FakeKubelet(str(work / "kubelet.sock")).start()
    state = work / "slurm"
    daemon = start_daemon(
        "--demo",
        "--demo.fleet=2xMI250X",
        "--interval=0.25s",
        "--slow-interval=0.5s",
        "--kubernetes",
        f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
        "--kubernetes.interval=0.25s",
        # the fake kubelet answers from this process: 2 s, so that on a loaded machine only the
        # deliberate silence below takes attribution down (0.5 s flaked at a load of 15 on 2 cores)
        "--kubernetes.timeout=2s",
        f"--slurm.state-dir={state}",
        "--collector.processes",
        "--collector.processes.top=2",
        "--attribution.series-labels",  # by default only amdgpu_allocation_info / amdgpu_job_info carry them
    )
    try:
        bdfs = gpu_bdfs(scrape(daemon))
        assert sorted(bdfs) == ["0", "1", "2", "3"]
        kubelet.set_pods(
            [
                FakePod("train-0", "ml", [FakeContainer("trainer", {"amd.com/gpu": [bdfs["0"].upper()]})]),
                FakePod("infer-1", "serve", [FakeContainer("server", {"amd.com/gpu": [bdfs["1"]]})]),
            ]
        )
        slurm("prolog.sh", state, "4242", gpus="2")

        series = wait_for(
            daemon,
            lambda s: len(s.get("amdgpu_allocation_info", [])) == 2 and len(s.get("amdgpu_job_info", [])) == 1,
            "two pods and one job",
        )
        assert sorted(labels["pod"] for labels, _ in series["amdgpu_allocation_info"]) == ["infer-1", "train-0"]
        assert {(lab["gpu"], lab["resource"]) for lab, _ in series["amdgpu_allocation_info"]} == {
            ("0", "amd.com/gpu"),
            ("1", "amd.com/gpu"),
        }
        assert series["amdgpu_job_info"] == [
            ({"gpu": "2", "job_id": "4242", "job_user": "alice", "job_partition": "mi250"}, 1.0)
        ]
        up = {labels["source"]: value for labels, value in series["amdgpu_exporter_attribution_up"]}
        assert up == {"kubernetes": 1.0, "slurm": 1.0, "processes": 1.0}

        # Every per-GPU series carries the six attribution labels; unallocated GPUs keep theirs, empty.
        expected = {
            "0": ("train-0", "ml", "trainer", "", "", ""),
            "1": ("infer-1", "serve", "server", "", "", ""),
            "2": ("", "", "", "4242", "alice", "mi250"),
            "3": ("", "", "", "", "", ""),
        }
        families = per_gpu_families(series)
        assert len(families) > 30, sorted(families)
        assert {"amdgpu_up", "amdgpu_device_info", "amdgpu_temperature_celsius", "amdgpu_process_memory_bytes"} <= set(
            families
        )
        for name, all_labels in families.items():
            for labels in all_labels:
                values = tuple(labels.get(label) for label in (*POD_LABELS, *JOB_LABELS))
                assert values == expected[labels["gpu"]], (name, labels)
        assert {labels["gpu"] for labels, _ in series["amdgpu_up"]} == {"0", "1", "2", "3"}
        # Processes: at most 2 per GPU, the launcher (pid 9001) on both dies of the first package.
        per_gpu: dict[str, list[str]] = {}
        for labels, _ in series["amdgpu_process_memory_bytes"]:
            per_gpu.setdefault(labels["gpu"], []).append(labels["pid"])
        assert all(len(pids) <= 2 for pids in per_gpu.values()) and set(per_gpu) == {"0", "1", "2", "3"}

        # /api/v1/devices names the same holders per device, and the same processes as /metrics.
        held = holders(daemon)
        assert sorted(held) == [0, 1, 2, 3]
        non_process = {gpu: [h for h in entries if h["source"] != "processes"] for gpu, entries in held.items()}
        assert non_process == {
            0: [
                {
                    "source": "kubernetes",
                    "pod": "train-0",
                    "namespace": "ml",
                    "container": "trainer",
                    "resource": "amd.com/gpu",
                    "device_id": bdfs["0"].upper(),
                }
            ],
            1: [
                {
                    "source": "kubernetes",
                    "pod": "infer-1",
                    "namespace": "serve",
                    "container": "server",
                    "resource": "amd.com/gpu",
                    "device_id": bdfs["1"],
                }
            ],
            2: [{"source": "slurm", "job_id": "4242", "job_user": "alice", "job_partition": "mi250", "device_id": "2"}],
            3: [],
        }
        process_memory = {
            (labels["gpu"], labels["pid"], labels["comm"]): value
            for labels, value in series["amdgpu_process_memory_bytes"]
        }
        api_processes = {
            (str(gpu), str(h["pid"]), h["comm"]): h["vram_bytes"]
            for gpu, entries in held.items()
            for h in entries
            if h["source"] == "processes"
        }
        assert api_processes and set(api_processes) == set(process_memory)
        assert all(isinstance(h["vram_bytes"], int) for e in held.values() for h in e if h["source"] == "processes")

        # train-0 goes away and job 4242 ends: no series anywhere keeps their label sets.
        kubelet.set_pods([FakePod("infer-1", "serve", [FakeContainer("server", {"amd.com/gpu": [bdfs["1"]]})])])
        slurm("epilog.sh", state, "4242")
        series = wait_for(
            daemon,
            lambda s: len(s.get("amdgpu_allocation_info", [])) == 1 and not s.get("amdgpu_job_info"),
            "train-0 and job 4242 gone",
        )
        for name, samples in series.items():
            for labels, _ in samples:
                assert labels.get("pod") != "train-0" and labels.get("job_id") != "4242", (name, labels)
        assert all(labels["pod"] == "" for labels, _ in series["amdgpu_up"] if labels["gpu"] == "0")
        held = holders(daemon)
        assert [h for h in held[0] + held[2] if h["source"] != "processes"] == []
        assert [h["pod"] for h in held[1] if h["source"] == "kubernetes"] == ["infer-1"]

        # The kubelet stops answering: source down, /metrics unaffected (a scrape that waited for the
        # source would wait for ever), one log line for the change.
        kubelet.answering.clear()
        series = wait_for(
            daemon,
            lambda s: ({"source": "kubernetes"}, 0.0) in s["amdgpu_exporter_attribution_up"],
            "kubernetes attribution down",
        )
        late = kubelet.calls
        wait_until(lambda: kubelet.calls >= late + 2, step=0.1)  # more reads, each given up at the 2 s deadline
        # The last good answer is kept (for 60 s after it): labels do not flap with the kubelet.
        series = scrape(daemon)
        assert [lab["pod"] for lab, _ in series["amdgpu_allocation_info"]] == ["infer-1"]
        assert [lab["pod"] for lab, _ in series["amdgpu_up"] if lab["gpu"] == "1"] == ["infer-1"]
        kubelet.answering.set()
        wait_for(
            daemon,
            lambda s: ({"source": "kubernetes"}, 1.0) in s["amdgpu_exporter_attribution_up"],
            "kubernetes attribution up again",
        )
        downs = events(daemon, "attribution_source_down", source="kubernetes")
        assert len(downs) == 1, downs
        assert "did not answer within 2 s" in downs[0]["error"]
        assert len(events(daemon, "attribution_source_up", source="kubernetes")) == 2  # at start and after
        # One line per claim change, with the holder's labels.
        assert len(events(daemon, "attribution_claim_removed", source="kubernetes", pod="train-0")) == 1
        assert len(events(daemon, "attribution_claim_added", source="slurm", job_id="4242")) == 1
        assert len(events(daemon, "attribution_claim_removed", source="slurm", job_id="4242")) == 1
    finally:
        kubelet.stop()


def test_missing_kubelet_socket_and_state_dir_are_down_and_metrics_still_served(
    work: Path, start_daemon: Callable[..., Daemon]
) -> None:
    daemon = start_daemon(
        "--demo",
        "--demo.fleet=1xMI210",
        "--interval=0.25s",
        "--kubernetes",
        f"--kubernetes.pod-resources-socket={work / 'absent.sock'}",
        "--kubernetes.interval=0.25s",
        f"--slurm.state-dir={work / 'absent'}",
    )
    series = wait_for(
        daemon,
        lambda s: (
            len(s.get("amdgpu_exporter_attribution_up", [])) == 2
            and all(v == 0.0 for _, v in s["amdgpu_exporter_attribution_up"])
        ),
        "both sources down",
    )
    (up,) = series["amdgpu_up"]
    assert up == ({"gpu": "0"}, 1.0)  # who holds it is on the _info series only (none here)
    assert "amdgpu_allocation_info" not in series and "amdgpu_job_info" not in series
    assert holders(daemon) == {0: []}  # attribution on, nobody holds it (both sources down)
    daemon.wait_cycles(4)  # a second of cycles; the kubelet is asked as often (0.25 s): still one line
    assert len(events(daemon, "attribution_source_down", source="kubernetes")) == 1
    (slurm_down,) = events(daemon, "attribution_source_down", source="slurm")
    assert "does not exist" in slurm_down["error"]


def test_attribution_off_adds_nothing(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon("--demo", "--demo.fleet=1xMI210", "--interval=0.25s")
    series = scrape(daemon)
    assert not ATTRIBUTION_FAMILIES & set(series)
    assert "amdgpu_process_memory_bytes" not in series
    assert set(series["amdgpu_up"][0][0]) == {"gpu"}
    assert holders(daemon) == {}  # no `holders` key at all with attribution off
