"""The kubelet client against a real gRPC server on a unix socket (the fake kubelet of tests/fake_kubelet.py)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.attribution.kubernetes import KubernetesAttribution
from exporter.attribution.matching import resolve
from exporter.model import ByBdf, ByDrm, ByXcp, DeviceRef
from tests.fake_kubelet import FakeContainer, FakeKubelet, FakePod

pytestmark = pytest.mark.integration


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="kubelet-") as tmp:
        yield Path(tmp)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(str(socket_dir / "kubelet.sock")).start()
    yield fake
    fake.stop()


REFS = (
    DeviceRef(0, "0000:19:00.0", card=1, render_minor=128),
    DeviceRef(1, "0000:19:00.0", partition=1, xcp=0, card=2, render_minor=129),
    DeviceRef(2, "0000:3b:00.0", card=3, render_minor=130),
)


def _pod(name: str, device_ids: list[str], namespace: str = "ml") -> FakePod:
    return FakePod(name, namespace, [FakeContainer("main", {"amd.com/gpu": device_ids})])


def test_pods_coming_and_going(kubelet: FakeKubelet) -> None:
    source = KubernetesAttribution(kubelet.socket_path, timeout=2.0)
    try:
        kubelet.set_pods(
            [
                FakePod("train-0", "ml", [FakeContainer("trainer", {"amd.com/gpu": ["0000:19:00.0"]})]),
                FakePod("infer-1", "serve", [FakeContainer("server", {"amd.com/cpx_nps4": ["AMDGPU_XCP.0"]})]),
                # Not ours: another vendor's resource, and an AMD resource outside the prefix.
                FakePod("other", "x", [FakeContainer("c", {"example.com/fpga": ["0000:3b:00.0"]})]),
            ]
        )
        report = source.read_once()
        assert report.up and report.error == ""
        assert {(c.device, dict(c.labels)["pod"], c.resource) for c in report.claims} == {
            (ByBdf("0000:19:00.0"), "train-0", "amd.com/gpu"),
            (ByXcp(0), "infer-1", "amd.com/cpx_nps4"),
        }
        allocations = resolve(REFS, [report])
        assert [(a.gpu, dict(a.labels)) for a in allocations] == [
            (0, {"pod": "train-0", "namespace": "ml", "container": "trainer"}),
            (1, {"pod": "infer-1", "namespace": "serve", "container": "server"}),
        ]

        # train-0 finishes; a DRA pod takes the third GPU by its DRM names.
        kubelet.set_pods(
            [
                FakePod("infer-1", "serve", [FakeContainer("server", {"amd.com/cpx_nps4": ["amdgpu_xcp_0"]})]),
                FakePod("dra", "batch", [FakeContainer("w", dra=[("one-gpu", "gpu.amd.com", "gpu-3-130")])]),
            ]
        )
        report = source.read_once()
        assert report.up
        assert {c.device for c in report.claims} == {ByXcp(0), ByDrm(3, 130)}
        assert [(a.gpu, dict(a.labels)["pod"]) for a in resolve(REFS, [report])] == [(1, "infer-1"), (2, "dra")]
    finally:
        source.close()


def test_slower_than_the_deadline_is_down_and_recovers(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([_pod("train-0", ["0000:19:00.0"])])
    now = [1000.0]
    source = KubernetesAttribution(kubelet.socket_path, timeout=0.3, keep_for=30.0, clock=lambda: now[0])
    try:
        assert source.read_once().up
        kubelet.answering.clear()  # no answer at all: a read that did not keep its deadline never returns
        report = source.read_once()
        assert not report.up
        assert "did not answer within 0.3 s" in report.error
        # The last good claims are kept for keep_for after the last good read, then dropped.
        assert [dict(c.labels)["pod"] for c in report.claims] == ["train-0"]
        now[0] += 31.0
        assert source.read_once().claims == ()
        kubelet.answering.set()
        report = source.read_once()
        assert report.up and [dict(c.labels)["pod"] for c in report.claims] == ["train-0"]
    finally:
        source.close()


def test_missing_socket_is_down_quickly(socket_dir: Path) -> None:
    path = str(socket_dir / "absent.sock")
    # A deadline far past the test's own limit: a read that waited for it instead of failing at once never returns.
    source = KubernetesAttribution(path, timeout=600.0)
    try:
        report = source.read_once()
        assert not report.up
        assert path in report.error and "unavailable" in report.error
        assert "\n" not in report.error
    finally:
        source.close()


def test_kubelet_appearing_later_is_picked_up(socket_dir: Path) -> None:
    path = str(socket_dir / "kubelet.sock")
    source = KubernetesAttribution(path, timeout=1.0)
    try:
        assert not source.read_once().up
        kubelet = FakeKubelet(path).start()
        try:
            kubelet.set_pods([_pod("late", ["0000:3B:00.0"])])
            deadline = time.monotonic() + 10
            report = source.read_once()
            while not report.up and time.monotonic() < deadline:  # gRPC backs off between reconnects
                time.sleep(0.2)
                report = source.read_once()
            assert report.up and [c.device for c in report.claims] == [ByBdf("0000:3b:00.0")]
        finally:
            kubelet.stop()
    finally:
        source.close()


def test_scheduled_thread_reads_on_its_own(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([_pod("p", ["0000:19:00.0"])])
    source = KubernetesAttribution(kubelet.socket_path, interval=0.1, timeout=1.0)
    source.start()
    try:
        deadline = time.monotonic() + 5
        while kubelet.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kubelet.calls >= 3
        assert source.report.up
    finally:
        source.close()
    assert os.path.exists(kubelet.socket_path)
