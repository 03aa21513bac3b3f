"""What the simulated tree says, as the exporter's own data model (SI units), and its JSON form.

The truth is built from the same quantised readings that were rendered into the files, so a
correct reader of the tree reproduces it exactly. Conventions where the tree leaves room:
- MI250X secondary die: its power, power cap and energy read 0 -> None (not supplied);
  its power1_cap_max still reads the package limit.
- package = the board serial number (both dies of an MI250X share it), or die 0's serial when there is no
  FRU EEPROM (fleet option serial=unique_id); die = 0/1 in BDF order; secondary_die on die 1.
- topology = the KFD io_links: PCIe to the CPU node (peer "", hops 1, weight 20), then one XGMI
  link per hive peer (hops 1, weight 15 per PSP hop: 15 or 30). rocm-smi's GPU-pair view (PCIe
  pairs via the CPU: hops 2 on one NUMA node, 3 across, weights summed) follows from these.
- throttle: Aldebaran's reasons named after the kernel's SMU_THROTTLER_* bits (ppt0, temp_gpu..);
  MI300-class tables carry no throttle bits -> empty (a reader derives "active" from two reads of
  the v1_6+ residency counters, which a single truth cannot say); throttle_residency_seconds =
  the v1_6+ *_residency_acc counters x 1 ms (socket_thm -> socket_thermal, vr_thm, hbm_thm alike).
- Partitioned sockets (v1_6+): every partition's busy gfx is its own (its xcp_stats XCCs), partition
  0's included; fixed layouts (v1_6..v1_8) also give each partition its media (VCN) busy.
- PCIe bandwidth: MI200 (received + sent) x max payload from pcie_bw as the upper bound (its own
  field); MI300X pcie_bandwidth_inst GB/s x 1e9 as the measured bandwidth.
  XGMI link bytes/s = xgmi_link_speed (Gbps per lane) x xgmi_link_width x 1e9 / 8;
  XGMI bytes = KB x 1024.
- Partitions (MI300-class in DPX/QPX/CPX): one device per partition, `gpu` numbered socket by
  socket in BDF order, partition 0 first (the order amd-smi lists them). Partition 0's identity and
  sample are the socket's (exactly what an SPX socket reports); partitions 1..N-1 carry only their
  own values: busy["gfx"] from their xcp_stats block (v1_6+; nothing on v1_4/v1_5, whose table has
  no per-partition data). `partition` says where each partition lives and what it reports
  (per-XCC busy and accumulators); `gpu_metrics` (partition 0 only) is every value the driver
  wrote into the table, in the table's own units, so tests can hold a decoder to all of them.
- Accumulators: gfx/mem_activity_acc and gfx_busy_acc count %·s of simulated time (a mean busy
  over a window is Δacc / Δt / 100); the throttler residencies, host-limit and low-utilisation
  counters count accumulation_counter ticks (1 ms), so their ratio to Δaccumulation_counter is
  the share of the window spent in that state.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from exporter.model import CperRecord, DeviceIdentity, Sample, TopologyLink, frozen_map
from exporter.simulator.asics import AsicModel
from exporter.simulator.board import BoardReading
from exporter.simulator.file_contents import cper_unix_seconds
from exporter.simulator.fleet import GcdLayout
from exporter.simulator.physics import ENERGY_TICK_J, DieReading, bad_page_threshold
from exporter.simulator.tree import DRIVER_VERSION, KFD_PCIE_WEIGHT, kfd_partition_peers

MHZ = 1_000_000.0
# the exporter's clock name -> the DieReading field (and AsicModel `<field>_levels`) behind it
CLOCKS = (
    ("gfx", "sclk"), ("memory", "mclk"), ("fabric", "fclk"), ("soc", "socclk"), ("video", "vclk"), ("decode", "dclk"),
)  # fmt: skip
# gpu_metrics residency accumulator -> the exporter's throttle `reason` (ticks are 1 ms)
RESIDENCY_LABELS = {
    "prochot": "prochot",
    "ppt": "ppt",
    "socket_thm": "socket_thermal",
    "vr_thm": "vr_thermal",
    "hbm_thm": "hbm_thermal",
}


@dataclass(frozen=True, slots=True)
class PartitionTruth:
    """Where one compute partition lives in the tree and what its xcp_stats block says."""

    index: int  # 0..count-1
    count: int
    compute_partition: str
    memory_partition: str
    socket_gpu: int  # `gpu` of partition 0 of the same socket
    card: str
    render_node: str  # "renderD129"
    render_minor: int
    kfd_node: int
    gpu_id: int
    location_id: int  # KFD: partition << 28 | bus << 8 | device << 3 | function
    platform_device: str  # "amdgpu_xcp_0" ("" for partition 0: the PCI device)
    device_dir: str  # resolved: the PCI device (partition 0) or the platform device
    xcc_count: int
    simd_count: int
    memory_bytes: int  # KFD memory bank of the partition (VRAM / NPS count)
    gfx_busy: float | None  # ratio, from xcp_stats; None when the table has no partition blocks
    gfx_busy_per_xcc: tuple[float, ...] = ()
    gfx_busy_acc_per_xcc: tuple[int, ...] = ()
    # (XCC, reason) -> seconds below the host's clock limit (v1_8+ blocks or xcp_metrics: power,
    # thermal, low_utilization, total), what --collector.xcc serves
    below_host_limit_seconds: Mapping[tuple[int, str], float] | None = None
    xcp_metrics: Mapping[str, Any] | None = None  # the partition's xcp/xcp_metrics values, when written


@dataclass(frozen=True, slots=True)
class SimulatedDevice:
    gpu: int  # index in the order ROCm tools list devices: BDF order, partitions of a socket in a row
    identity: DeviceIdentity
    sample: Sample
    partition: PartitionTruth | None = None  # on partitionable (MI300-class) sockets
    gpu_metrics: Mapping[str, Any] | None = None  # partition 0 of MI300-class: the table's raw values


def topology(gcd: GcdLayout, gcds: list[GcdLayout], partition: int = 0) -> tuple[TopologyLink, ...]:
    """The KFD io_links of a GCD (of one of its partitions): PCIe to its CPU node (peer ""), then
    XGMI to each hive peer; a partitioned socket's node also links to every other partition of its
    own socket (weight 13) and to every partition of each peer, one link per KFD node, in node order."""
    xgmi = kfd_partition_peers(gcd, gcd.partitions[partition], gcds)
    return (
        TopologyLink("", "pcie", 1, KFD_PCIE_WEIGHT),
        *(TopologyLink(peer.bdf, "xgmi", 1, weight, peer_partition=part.index) for peer, part, weight in xgmi),
    )


def identity(
    gcd: GcdLayout, gcds: list[GcdLayout], device_dir: str, hwmon_dir: str, partition: int = 0
) -> DeviceIdentity:
    m = gcd.model
    return DeviceIdentity(
        pci_bus_id=gcd.bdf,
        card=gcd.partitions[partition].card,
        device_dir=device_dir,
        unique_id=f"{gcd.unique_id:016x}" if gcd.unique_id else "",
        hwmon_dir=hwmon_dir,
        vendor_id="0x1002",
        device_id=f"0x{m.device_id:04x}",
        product=m.product_name or _PRODUCT_BY_PCI_ID[m.device_id],
        product_number="" if gcd.guest else m.product_number,  # the FRU EEPROM: none on a VF
        asic=m.asic,
        serial=gcd.serial,
        vbios=m.vbios,
        driver_version=DRIVER_VERSION,
        package=gcd.package_id or gcd.serial,
        die=gcd.die,
        partition=partition,
        compute_partition=gcd.compute_partition,
        memory_partition=gcd.memory_partition,
        xgmi_hive_id=str(gcd.hive_id) if gcd.hive_id else "",
        xgmi_physical_id=gcd.xgmi_physical_id,
        numa_node=gcd.numa_node,
        firmware=frozen_map({block: f"0x{v:08x}" for block, v in m.firmware.items() if v}),
        topology=topology(gcd, gcds, partition),
        gpu_metrics_version=f"{gcd.metrics_version[0]}.{gcd.metrics_version[1]}",
        secondary_die=m.gcds_per_package > 1 and gcd.die > 0,
        deployment="guest" if gcd.guest else "baremetal",
    )


# A VF guest has no FRU product name: readers name it from its PCI id (pci.ids).
_PRODUCT_BY_PCI_ID = {0x74B5: "AMD Instinct MI300X VF", 0x74B9: "AMD Instinct MI325X VF"}


def partition_truth(
    gcd: GcdLayout, p: int, r: DieReading, socket_gpu: int, device_dir: str, gpu_metrics: Mapping[str, Any] | None
) -> PartitionTruth:
    part = gcd.partitions[p]
    busy: float | None = None
    per_xcc: tuple[float, ...] = ()
    acc: tuple[int, ...] = ()
    if gcd.metrics_version >= (1, 6) and gpu_metrics is not None:
        if "xcp_stats" in gpu_metrics:
            block = gpu_metrics["xcp_stats"][p]
            per_xcc = tuple(v / 100 for v in block["gfx_busy_inst"])
            acc = tuple(block["gfx_busy_acc"])
        else:  # v1.9: one device-wide per-XCC array
            span = slice(part.xcc_first, part.xcc_first + part.xcc_count)
            per_xcc = tuple(v / 100 for v in gpu_metrics["gfx_busy_inst"][span])
            acc = tuple(gpu_metrics["gfx_busy_acc"][span])
        busy = r.partition_gfx_busy[p] / 100
    below: dict[tuple[int, str], float] | None = None
    if gcd.metrics_version >= (1, 8) or gcd.xcp_metrics_version is not None:
        ppt, thm, low = r.below_host_limit_ppt_ticks, r.below_host_limit_thm_ticks, r.partition_low_utilization_ticks[p]
        ticks = {"power": ppt, "thermal": thm, "total": ppt + thm + low, "low_utilization": low}
        below = {(xcc, reason): t * 1e-3 for reason, t in ticks.items() for xcc in range(part.xcc_count)}
    return PartitionTruth(
        index=p,
        count=part.count,
        compute_partition=gcd.compute_partition,
        memory_partition=gcd.memory_partition,
        socket_gpu=socket_gpu,
        card=part.card,
        render_node=part.render,
        render_minor=part.render_minor,
        kfd_node=part.kfd_node,
        gpu_id=part.gpu_id,
        location_id=gcd.partition_location_id(p),
        platform_device=part.platform_device,
        device_dir=device_dir,
        xcc_count=part.xcc_count,
        simd_count=gcd.model.simd_count // part.count,
        memory_bytes=part.memory_bytes,
        gfx_busy=busy,
        gfx_busy_per_xcc=per_xcc,
        gfx_busy_acc_per_xcc=acc,
        below_host_limit_seconds=below,
    )


def partition_sample(gcd: GcdLayout, info: PartitionTruth, socket: Sample) -> Sample:
    """What one partition reports: its own busy (gfx from its xcp_stats block, v1_6+; in fixed
    layouts also media from its block's VCN instances, which read 0) and, on a partitioned socket,
    the VRAM it allocates from. Partition 0 adds them to the socket's values; partitions 1..N-1
    report nothing else (socket-wide values live on partition 0). Every partition's per-XCC busy is
    its own (from its xcp_metrics or its block of the socket's table). A v1.9 socket table cannot say
    which partition owns a decoder, so a partition there has media busy only from its own xcp_metrics."""
    busy: dict[str, float] = {}
    if info.gfx_busy is not None:
        busy["gfx"] = info.gfx_busy
        if gcd.metrics_version != (1, 9) or info.xcp_metrics is not None:
            busy["media"] = 0.0
    per_xcc = frozen_map(dict(enumerate(info.gfx_busy_per_xcc)))
    memory = {"partition_vram": float(info.memory_bytes)} if info.count > 1 else {}
    if info.index > 0:
        return Sample(
            timestamp=socket.timestamp,
            busy=frozen_map(busy),
            xcc_busy=per_xcc,
            memory_total_bytes=frozen_map(memory),
        )
    if info.count == 1:
        return replace(socket, xcc_busy=per_xcc)
    return replace(
        socket,
        busy=frozen_map({**socket.busy, **busy}),
        xcc_busy=per_xcc,
        memory_total_bytes=frozen_map({**socket.memory_total_bytes, **memory}),
    )


def _top_mhz(m: AsicModel, clock: str) -> int:
    return (m.sclk_range if clock == "sclk" else getattr(m, f"{clock}_levels"))[-1]


def _bottom_mhz(m: AsicModel, clock: str) -> int:
    return (m.sclk_range if clock == "sclk" else getattr(m, f"{clock}_levels"))[0]


def sample(
    gcd: GcdLayout, r: DieReading, timestamp: float, board: BoardReading | None = None, started_wall: float = 0.0
) -> Sample:
    """What the GCD's files say (`started_wall`: unix time of the tree's t=0, behind the records' times)."""
    m = gcd.model
    primary = gcd.die == 0
    thresholds = {}
    for sensor, limits in m.limits.items():
        thresholds[(sensor, "critical")] = float(limits.critical)
        thresholds[(sensor, "emergency")] = float(limits.emergency)
    busy = {"gfx": r.gfx_busy / 100.0, "memory": r.mem_busy / 100.0}
    if gcd.metrics_version != (1, 3):
        busy["media"] = 0.0  # vcn_activity / vcn_busy read 0 (Aldebaran leaves mm_activity unset)
    # MI200: an upper bound from pcie_bw (its own field); MI300X: the measured pcie_bandwidth_inst.
    pcie_bw_bound = float((r.pcie_bw[0] + r.pcie_bw[1]) * r.pcie_bw[2]) if r.pcie_bw is not None else None
    pcie_bw = r.pcie_bw_inst_gbs * 1e9 if r.pcie_bw is None and r.pcie_bw_inst_gbs is not None else None
    mi300 = gcd.metrics_version != (1, 3)
    return Sample(
        timestamp=timestamp,
        temperatures=frozen_map({k: float(v) for k, v in r.temps.items()}),
        temperature_thresholds=frozen_map(thresholds),
        power_watts=float(r.power_w) if r.power_w is not None else None,
        power_cap_watts=float(m.power_cap) if primary else None,
        power_cap_max_watts=float(m.power_cap),
        energy_joules=r.energy_ticks * ENERGY_TICK_J if r.energy_ticks is not None else None,
        busy=frozen_map(busy),
        memory_used_bytes=frozen_map(
            {"vram": float(r.vram_used), "visible_vram": float(r.vram_used), "gtt": float(r.gtt_used)}
        ),
        memory_total_bytes=frozen_map(
            {"vram": float(m.vram_bytes), "visible_vram": float(m.vram_bytes), "gtt": float(m.gtt_bytes)}
        ),
        clocks_hertz=frozen_map({name: getattr(r, clock) * MHZ for name, clock in CLOCKS}),
        # MI200 (v1_3) averages: the SMU's average is the clock it holds; Aldebaran leaves vclk0/dclk0's at 0
        clocks_average_hertz=frozen_map(
            {"gfx": r.sclk * MHZ, "soc": r.socclk * MHZ, "memory": r.mclk * MHZ, "video": 0.0, "decode": 0.0}
            if not mi300
            else {}
        ),
        gfx_dpm_levels_hertz=(m.sclk_range[0] * MHZ, m.sclk_range[1] * MHZ),
        clocks_max_hertz=frozen_map({name: _top_mhz(m, clock) * MHZ for name, clock in CLOCKS}),
        clocks_min_hertz=frozen_map({name: _bottom_mhz(m, clock) * MHZ for name, clock in CLOCKS}),
        voltages_volts=frozen_map({"gfx": r.vddgfx_mv / 1000.0} if r.vddgfx_mv is not None else {}),
        throttle=frozen_map(r.throttlers),
        throttle_residency_seconds=frozen_map(
            {RESIDENCY_LABELS[name]: ticks * 1e-3 for name, ticks in r.residency_ticks.items()}
            if gcd.metrics_version >= (1, 6)
            else {}
        ),
        memory_max_bandwidth_bytes_per_second=m.mem_max_bandwidth_gbs * 1e9 if gcd.metrics_version >= (1, 7) else None,
        pcie_link_transfers_per_second=r.pcie_gts * 1e9,
        pcie_max_link_transfers_per_second=m.pcie_gts * 1e9,
        pcie_link_width=r.pcie_width,
        pcie_max_link_width=m.pcie_width,
        pcie_bandwidth_bytes_per_second=pcie_bw,
        pcie_bandwidth_upper_bound_bytes_per_second=pcie_bw_bound,
        pcie_replays=r.pcie_replays,
        pcie_recoveries=r.pcie_recoveries,
        pcie_replay_rollovers=0 if mi300 else None,
        gfx_clock_lock_mask=0 if mi300 else None,  # no simulated XCC has its clock locked
        pcie_other_end_recoveries=0 if gcd.metrics_version >= (1, 6) else None,
        pcie_naks_sent=r.pcie_naks_sent if gcd.metrics_version >= (1, 5) else None,
        pcie_naks_received=r.pcie_naks_received if gcd.metrics_version >= (1, 5) else None,
        xgmi_link_width=m.xgmi_link_width if mi300 else None,
        xgmi_link_speed_bytes_per_second=m.xgmi_link_speed_gbps * m.xgmi_link_width * 1e9 / 8 if mi300 else None,
        xgmi_link_up=frozen_map(
            dict(enumerate(r.xgmi_links_up)) if r.xgmi_links_up and gcd.metrics_version >= (1, 7) else {}
        ),
        xgmi_read_bytes=frozen_map({i: kb * 1024.0 for i, kb in enumerate(r.xgmi_read_kb)} if r.xgmi_read_kb else {}),
        xgmi_write_bytes=frozen_map(
            {i: kb * 1024.0 for i, kb in enumerate(r.xgmi_write_kb)} if r.xgmi_write_kb else {}
        ),
        xgmi_error_events=0,
        ecc_errors=frozen_map(
            {
                **{
                    (block, kind): count
                    for block, (ue, ce) in r.ecc.items()
                    for kind, count in (("uncorrectable", ue), ("correctable", ce))
                },
                **{(block, "deferred"): count for block, count in r.ecc_deferred.items()},
            }
        ),
        ras_retired_pages=len(r.retired_pages),
        ras_pending_pages=len(r.pending_pages),
        ras_bad_page_threshold=bad_page_threshold(m),
        cper_records=tuple(
            CperRecord(float(cper_unix_seconds(started_wall, at)), severity, (), f"{gcd.xgmi_physical_id or 0}:{n:X}")
            for n, (at, severity) in enumerate(r.cper_records, start=1)
        ),
        last_reset_at=started_wall + r.reset_at if r.reset_at is not None else None,
        pcie_aer_errors=frozen_map(
            {(port, severity): r.aer.get((port, severity), 0) for port in ("device", "upstream") for severity in _AER}
        ),
        **(_board_fields(board) if board is not None else {}),
    )


_AER = ("correctable", "nonfatal", "fatal")


def _board_fields(board: BoardReading) -> dict[str, Any]:
    """The board/ group's values (MI350-class): the same on every GPU of the node but its own board's."""
    return {
        "board_temperatures": frozen_map({k: float(v) for k, v in board.gpuboard.items()}),
        "baseboard_temperatures": frozen_map({k: float(v) for k, v in board.baseboard.items()}),
        "node_power_watts": float(board.node_power_w),
        "node_power_limit_watts": float(board.node_power_limit_w),
        "node_power_limit_max_watts": float(board.max_node_power_limit_w),
        "node_power_management_enabled": board.npm_enabled,
        "baseboard_power_watts": float(board.baseboard_power_w),
        "baseboard_power_limit_watts": float(board.baseboard_power_limit_w),
    }


# ------------------------------------------------------------------------------------------ JSON
_TUPLE_KEYED = {
    "temperature_thresholds", "ecc_errors", "pcie_aer_errors", "media_engine_busy", "xcc_below_host_limit_seconds",
    "below_host_limit_seconds",
}  # fmt: skip
_INT_KEYED = {"xgmi_link_up", "xgmi_read_bytes", "xgmi_write_bytes", "xcc_busy"}


def _plain(value: Any, name: str = "") -> Any:
    if isinstance(value, Mapping):
        if name in _TUPLE_KEYED:
            return {"/".join(map(str, k)): v for k, v in value.items()}
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, TopologyLink | CperRecord):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_jsonable(devices: list[SimulatedDevice]) -> list[dict[str, Any]]:
    result = []
    for d in devices:
        entry: dict[str, Any] = {
            "gpu": d.gpu,
            "identity": {f.name: _plain(getattr(d.identity, f.name), f.name) for f in fields(d.identity)},
            "sample": {f.name: _plain(getattr(d.sample, f.name), f.name) for f in fields(d.sample)},
        }
        # only where there is something to say, so MI200 truth files read as they always did
        if d.partition is not None:
            entry["partition"] = {f.name: _plain(getattr(d.partition, f.name), f.name) for f in fields(d.partition)}
        if d.gpu_metrics is not None:
            entry["gpu_metrics"] = d.gpu_metrics
        result.append(entry)
    return result


def _restore(cls: type, data: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in _TUPLE_KEYED and value is not None:
            value = frozen_map({tuple(int(p) if p.isdigit() else p for p in k.split("/")): v for k, v in value.items()})
        elif f.name in _INT_KEYED:
            value = frozen_map({int(k): v for k, v in value.items()})
        elif f.name == "topology":
            value = tuple(TopologyLink(**link) for link in value)
        elif f.name == "cper_records":
            value = tuple(CperRecord(**{**rec, "afids": tuple(rec["afids"])}) for rec in value)
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = frozen_map(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def from_jsonable(data: list[Mapping[str, Any]]) -> list[SimulatedDevice]:
    return [
        SimulatedDevice(
            d["gpu"],
            _restore(DeviceIdentity, d["identity"]),
            _restore(Sample, d["sample"]),
            _restore(PartitionTruth, d["partition"]) if d.get("partition") else None,
            d.get("gpu_metrics"),
        )
        for d in data
    ]


def load_truth_json(path: str | os.PathLike[str]) -> list[SimulatedDevice]:
    """Read a file written by Simulator.write_truth_json."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return from_jsonable(data["devices"] if isinstance(data, dict) else data)
