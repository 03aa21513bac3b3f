"""What the device-plugin health service answers for each GPU (exporter/web/device_plugin.gpu_states),
over constructed cycles: unfit is "unhealthy", fit "healthy", a GPU not judged yet or a stale verdict
left out (the plugin's own check decides), and Device the plugin's device ID. The wire itself is
tested through the real daemon (tests/integration/test_device_plugin_health_e2e.py)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from exporter.alerting.rulefile import default_health
from exporter.alerting.verdict import evaluate_health
from exporter.config import ConfigError, Settings, add_arguments, resolve
from exporter.model import (
    Allocation,
    Attribution,
    DeviceIdentity,
    DeviceState,
    ExporterStats,
    Published,
    Sample,
    Snapshot,
)
from exporter.web.device_plugin import HEALTHY, UNHEALTHY, gpu_states, plugin_device_id
from tests.unit.test_health_verdict import T0, ecc

SOCKET = DeviceIdentity(pci_bus_id="0000:c1:00.0", card="card0", device_dir="/sys/devices/pci0000:c0/0000:c1:00.0",
                        unique_id="abcdef0123456789", asic="aqua_vanjaram")  # fmt: skip


def state(gpu: int, sample: Sample | None, *, partition: int = 0, up: bool = True, reason: str = "") -> DeviceState:
    identity = SOCKET
    if partition:
        identity = dataclasses.replace(
            SOCKET, partition=partition, device_dir=f"/sys/devices/platform/amdgpu_xcp_{partition + 10}"
        )
    if gpu >= 8:  # another socket
        identity = dataclasses.replace(identity, pci_bus_id="0000:C2:00.0", unique_id="")
    return DeviceState(identity=identity, gpu=gpu, sample=sample, up=up, down_reason=reason)


def published(*cycles: tuple[DeviceState, ...], **stats: object) -> Published:
    verdict = None
    snapshot = Snapshot(taken_at=T0)
    for at, devices in enumerate(cycles):
        snapshot = Snapshot(taken_at=T0 + 30 * at, monotonic_at=30.0 * at, devices=devices)
        verdict = evaluate_health(verdict, snapshot, default_health(), "node")
    assert verdict is not None
    return Published(snapshot=snapshot, health=verdict, stats=ExporterStats(**stats))  # type: ignore[arg-type]


def answer(cycle: Published, now: float | None = None) -> dict[str, tuple[str, str]]:
    at = cycle.snapshot.monotonic_at if now is None else now
    return {s.id: (s.device, s.health) for s in gpu_states(cycle, at, max_age=5.0)}


def test_an_unfit_gpu_is_unhealthy_and_the_fit_ones_healthy() -> None:
    first = (state(0, ecc()), state(8, ecc()))
    grown = (state(0, ecc(uncorrectable=2)), state(8, ecc()))
    cycle = published(first, grown)
    assert answer(cycle) == {"0": ("0000:c1:00.0", UNHEALTHY), "8": ("0000:c2:00.0", HEALTHY)}
    (gpu0, _) = gpu_states(cycle, cycle.snapshot.monotonic_at, 5.0)
    assert gpu0.uuid == "abcdef0123456789" and gpu0.workloads == ()


def test_a_partition_is_named_by_its_platform_device_and_shares_its_sockets_verdict() -> None:
    first = (state(0, ecc()), state(1, Sample(timestamp=T0), partition=1))
    grown = (state(0, ecc(uncorrectable=2)), state(1, Sample(timestamp=T0), partition=1))
    assert answer(published(first, grown)) == {"0": ("0000:c1:00.0", UNHEALTHY), "1": ("amdgpu_xcp_11", UNHEALTHY)}
    # a partition whose folder is not an amdgpu_xcp_N platform device has no ID the plugin would know
    odd = dataclasses.replace(state(1, None, partition=1).identity, device_dir="/sys/devices/elsewhere")
    assert plugin_device_id(DeviceState(identity=odd, gpu=1, sample=None, up=False)) is None


def test_an_unreadable_gpu_is_unhealthy_but_one_not_read_yet_is_left_out() -> None:
    cycle = published((state(0, None, up=False, reason="timeout"), state(8, None, up=False, reason="not_read_yet")))
    assert answer(cycle) == {"0": ("0000:c1:00.0", UNHEALTHY)}


def test_a_stale_or_failed_verdict_answers_for_no_gpu() -> None:
    grown = (state(0, ecc(uncorrectable=2)),)
    cycle = published((state(0, ecc()),), grown)
    assert answer(cycle, now=cycle.snapshot.monotonic_at + 5.0) == {"0": ("0000:c1:00.0", UNHEALTHY)}
    assert answer(cycle, now=cycle.snapshot.monotonic_at + 5.1) == {}  # older than /readyz's limit
    failing = published((state(0, ecc()),), grown, failing_stages=("health",))
    assert answer(failing) == {}  # the health stage failing: its verdict is the last good one, kept
    assert gpu_states(None, 0.0, 5.0) == ()  # before the first cycle


def test_the_pods_and_jobs_on_a_gpu_are_its_workloads() -> None:
    cycle = published((state(0, ecc()),))
    pod = Allocation(0, "kubernetes", "0000:c1:00.0", "amd.com/gpu", (("pod", "train-0"), ("namespace", "ml")))
    job = Allocation(0, "slurm", "0", "gpu", (("job_id", "4242"),))
    cycle = dataclasses.replace(
        cycle, snapshot=dataclasses.replace(cycle.snapshot, attribution=Attribution(allocations=(pod, job, pod)))
    )
    (only,) = gpu_states(cycle, cycle.snapshot.monotonic_at, 5.0)
    assert only.workloads == ("ml/train-0", "4242")


def settings(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(list(argv)), {})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("relative/health.sock", "is not an absolute path"),
        ("/" + "x" * 120, "longer than a unix socket path may be"),
    ],
)
def test_the_socket_option_takes_an_absolute_path_a_socket_can_have(value: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        settings(f"--device-plugin.socket={value}")
    assert settings().device_plugin_socket == ""
