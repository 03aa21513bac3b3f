"""A partition's own table (xcp/xcp_metrics, amdgpu_partition_metrics v1_0 and v1_1): decoded by the
gpu_metrics decoder, read for each partition in preference to the socket's table, and the per-XCC
figures (busy, decoders, clock below the host's limit) it and the socket's table give."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from exporter.abi.gpu_metrics import PARTITION_V1_0, XCP_V1_2
from exporter.simulator import Simulator
from exporter.simulator import gpu_metrics_writer as gm
from exporter.sources.gpu_metrics import GpuMetricsError, decode_partition_metrics
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs import source as sysfs_source
from exporter.sources.sysfs.table import OPTIONAL_FIELDS

_VALUES = {
    "current_gfxclk": [2100, 2000],
    "current_socclk": [1200],
    "current_vclk0": [900],
    "current_dclk0": [800],
    "current_uclk": 1300,
    "gfx_busy_inst": [40, 60],
    "jpeg_busy": [5, 0, 7],
    "vcn_busy": [25],
    "gfx_busy_acc": [1000, 2000],
    "gfx_below_host_limit_ppt_acc": [1500, 1600],
    "gfx_below_host_limit_thm_acc": [20, 30],
    "gfx_low_utilization_acc": [700, 800],
    "gfx_below_host_limit_total_acc": [2220, 2430],
}


def test_the_v1_0_layout_is_the_kernels() -> None:
    # struct amdgpu_partition_metrics_v1_0: clocks (u16) and padding to byte 48, then the members
    # of amdgpu_xcp_metrics_v1_2 in order: gfx_busy_inst at 48, gfx_busy_acc at 168, 488 bytes
    assert PARTITION_V1_0.size == 488 and PARTITION_V1_0.partitions_offset == 48
    offsets = {f.name: 48 + f.offset for f in XCP_V1_2.fields}
    assert offsets["gfx_busy_inst"] == 48 and offsets["jpeg_busy"] == 80 and offsets["vcn_busy"] == 160
    assert offsets["gfx_busy_acc"] == 168 and offsets["gfx_below_host_limit_total_acc"] == 424
    assert {f.name: f.offset for f in PARTITION_V1_0.fields}["current_uclk"] == 44


@pytest.mark.parametrize("version", [(1, 0), (1, 1)])
def test_both_versions_decode_to_the_same_figures(version: tuple[int, int]) -> None:
    metrics = decode_partition_metrics(gm.encode_partition_metrics(version, _VALUES))
    assert metrics.version == f"{version[0]}.{version[1]}"
    assert metrics.partition_gfx_busy == ((0.4, 0.6),)
    assert metrics.partition_vcn_busy == ((0.25,),) and metrics.partition_jpeg_busy == ((0.05, 0.0, 0.07),)
    assert metrics.partition_xcc_counters == (
        {"power": (1500, 1600), "thermal": (20, 30), "total": (2220, 2430), "low_utilization": (700, 800)},
    )
    assert dict(metrics.clocks_hertz) == {"gfx": 2100e6, "soc": 1200e6, "memory": 1300e6, "video": 900e6,
                                          "decode": 800e6}  # fmt: skip
    assert metrics.busy["media"] == 0.25


def test_a_partition_table_of_another_revision_is_refused_with_the_reason() -> None:
    blob = bytearray(gm.encode_partition_metrics((1, 0), _VALUES))
    struct.pack_into("<BB", blob, 2, 1, 2)
    with pytest.raises(GpuMetricsError, match=r"partition metrics revision 1\.2"):
        decode_partition_metrics(bytes(blob))
    # a gpu_metrics table is not a partition table
    with pytest.raises(GpuMetricsError):
        decode_partition_metrics(gm.encode((1, 8), {}))


def _cpx(root: Path, xcp_metrics: str = "1.0", metrics: str = "1.8") -> Simulator:
    options = f";xcp_metrics={xcp_metrics}" if xcp_metrics else ""
    simulator = Simulator(root, f"MI300X:CPX:gpu_metrics={metrics}{options}", "training:load=1.6", 3)
    simulator.write_tree()
    simulator.tick(20.0)
    return simulator


@pytest.mark.parametrize(("metrics", "xcp_metrics"), [("1.8", "1.0"), ("1.9", "1.1"), ("1.8", "")])
def test_each_partition_reports_its_own_xcc_figures(tmp_path: Path, metrics: str, xcp_metrics: str) -> None:
    simulator = _cpx(tmp_path / "sys", xcp_metrics, metrics)
    source = SysfsSource(tmp_path / "sys", wanted=OPTIONAL_FIELDS)
    devices = source.discover()
    truth = simulator.truth()
    assert len(devices) == len(truth) == 8
    for device, expected in zip(devices, truth, strict=True):
        part = expected.partition
        assert part is not None and part.below_host_limit_seconds is not None
        sample = source.read(device)
        assert dict(sample.xcc_busy) == pytest.approx(dict(enumerate(part.gfx_busy_per_xcc)))
        assert dict(sample.xcc_below_host_limit_seconds) == pytest.approx(dict(part.below_host_limit_seconds))
        assert dict(sample.xcc_below_host_limit_seconds)[0, "power"] > 0  # the load holds the socket at PPT
        if metrics == "1.9" and not xcp_metrics:
            assert not sample.media_engine_busy
        else:
            assert {engine for engine, _ in sample.media_engine_busy} == {"vcn", "jpeg"}
    source.close()


def test_a_partitions_own_table_wins_and_spares_the_socket_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    simulator = _cpx(tmp_path / "sys")
    partition = simulator.truth()[3].partition
    assert partition is not None
    own = gm.encode_partition_metrics((1, 0), {**_VALUES, "gfx_busy_inst": [33], "vcn_busy": [12]})
    (Path(partition.device_dir) / "xcp/xcp_metrics").write_bytes(own)
    source = SysfsSource(tmp_path / "sys", wanted=frozenset({"xcc_busy"}))
    devices = source.discover()
    read_paths: list[str] = []
    real = sysfs_source.read_file_bytes

    def counted(path: str) -> bytes | None:
        read_paths.append(path)
        return real(path)

    monkeypatch.setattr(sysfs_source, "read_file_bytes", counted)
    sample = source.read(devices[3])
    assert dict(sample.xcc_busy) == {0: 0.33}
    assert dict(sample.busy) == {"gfx": 0.33, "media": 0.12}
    assert not sample.media_engine_busy and not sample.xcc_below_host_limit_seconds  # the xcc collector at its defaults
    assert [Path(p).name for p in read_paths] == ["xcp_metrics"]  # not the socket's gpu_metrics
    source.close()
