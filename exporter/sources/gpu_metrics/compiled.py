"""The full gpu_metrics decoder, compiled per fixed layout: same GpuMetrics, a fraction of the cost.

decode_gpu_metrics (gpu_metrics.py) is written for clarity: a raw table of every field, then a
unit-checked reader per value. On the poll's hot path that generality is most of a cycle's CPU,
although for a fixed layout every unit, offset and element count is known in advance. This module
turns each fixed layout, once, into one generated function: one struct call, then straight-line
code with the layout's constants folded in (which fields exist, their all-ones value, their unit
factor). Tests hold it to decode_gpu_metrics, field by field, on random tables of every layout.

What it does not compile goes to decode_gpu_metrics unchanged: v1.9 (self-describing), tables
without num_partition in a partitioned layout (which blocks are live is then decided by content),
and anything malformed (so errors are the decoder's own).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence

from exporter.model import frozen_map, slot_setters
from exporter.sources.gpu_metrics.decoder import (
    _ESM_CODES,
    _PCIE_RATES_100MTS,
    ENERGY_JOULES_PER_TICK,
    RESIDENCY_REASONS,
    GpuMetrics,
    decode_gpu_metrics,
    throttle_reasons,
)
from exporter.sources.gpu_metrics.layouts import C_TYPES, FIXED_FIELD_UNITS, FIXED_LAYOUTS, HEADER, AttrUnit, Layout

Decode = Callable[[bytes], GpuMetrics]

# SI value of one stored unit, as gpu_metrics.py converts them.
_FACTOR = {
    AttrUnit.TEMP_CELSIUS: 1.0,
    AttrUnit.POWER_WATT: 1.0,
    AttrUnit.CLOCK_MHZ: 1e6,
    AttrUnit.TIME_NS: 1e-9,
    AttrUnit.TIME_10NS: 1e-8,
    AttrUnit.SPEED_GTS: 1e9,
    AttrUnit.SPEED_100MTS: 1e8,
    AttrUnit.BANDWIDTH_GBS: 1e9,
    AttrUnit.DATA_KB: 1024.0,
}
_TEMPERATURES = (
    ("edge", "temperature_edge"),
    ("junction", "temperature_hotspot"),
    ("memory", "temperature_mem"),
    ("vr_gfx", "temperature_vrgfx"),
    ("vr_soc", "temperature_vrsoc"),
    ("vr_mem", "temperature_vrmem"),
)
_CLOCKS = (
    ("gfx", "current_gfxclk"),
    ("soc", "current_socclk"),
    ("memory", "current_uclk"),
    ("video", "current_vclk0"),
    ("decode", "current_dclk0"),
)
_AVERAGE_CLOCKS = (
    ("gfx", "average_gfxclk_frequency"),
    ("soc", "average_socclk_frequency"),
    ("memory", "average_uclk_frequency"),
    ("video", "average_vclk0_frequency"),
    ("decode", "average_dclk0_frequency"),
)
_VOLTAGES = (("gfx", "voltage_gfx"), ("soc", "voltage_soc"), ("memory", "voltage_mem"))
_RAW_SCALARS = (
    ("throttle_status", "throttle_status"),
    ("pcie_link_width", "pcie_link_width"),
    ("pcie_bandwidth_acc", "pcie_bandwidth_acc"),
    ("pcie_replays", "pcie_replay_count_acc"),
    ("pcie_recoveries", "pcie_l0_to_recov_count_acc"),
    ("pcie_replay_rollovers", "pcie_replay_rover_count_acc"),
    ("pcie_naks_sent", "pcie_nak_sent_count_acc"),
    ("pcie_naks_received", "pcie_nak_rcvd_count_acc"),
    ("xgmi_link_width", "xgmi_link_width"),
    ("gfx_activity_acc", "gfx_activity_acc"),
    ("mem_activity_acc", "mem_activity_acc"),
    ("num_partitions", "num_partition"),
    ("accumulation_counter", "accumulation_counter"),
)
_PARTITION_FIELDS = ("gfx_busy_inst", "vcn_busy", "jpeg_busy")


def _ratios(items: Sequence[int], all_ones: int) -> tuple[float, ...]:
    return tuple(v / 100 for v in items if v != all_ones and v <= 100)


def _highest(items: Sequence[int], all_ones: int, factor: float) -> float | None:
    supplied = [v for v in items if v != all_ones]
    return max(supplied) * factor if supplied else None


_THROTTLE_CACHE: dict[int, Mapping[str, bool]] = {}


def _throttle(indep: int) -> Mapping[str, bool]:
    # Throttle bits change rarely: one frozen mapping per bit pattern seen, bounded.
    found = _THROTTLE_CACHE.get(indep)
    if found is None:
        if len(_THROTTLE_CACHE) > 256:
            _THROTTLE_CACHE.clear()
        found = _THROTTLE_CACHE[indep] = frozen_map(throttle_reasons(indep))
    return found


_EMPTY = frozen_map()
# The decoder sets every field through its slot's setter, so there are no defaults to apply.
_SETTERS = slot_setters(GpuMetrics)
_GPU_METRICS_FIELDS = tuple(_SETTERS)


class _Fields:
    """Where each wanted field's elements land in the flat tuple of one compiled struct."""

    def __init__(self) -> None:
        self.parts: list[str] = ["<"]
        self.position = 0
        self.flat = 0
        self.slots: dict[str, tuple[int, int, int]] = {}  # name -> (first index, count, all-ones)

    def add(self, name: str, ctype: str, offset: int, count: int) -> tuple[int, int, int]:
        code, width, _ = C_TYPES[ctype]
        if offset > self.position:
            self.parts.append(f"{offset - self.position}x")
        self.parts.append(f"{count}{code}")
        self.position = offset + width * count
        slot = (self.flat, count, (1 << (8 * width)) - 1)
        self.flat += count
        return slot


class _Source:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.lines: list[str] = []
        fields = _Fields()
        entries: list[tuple[int, str, str, int, int]] = [
            (f.offset, f.name, f.ctype, f.count, -1) for f in layout.fields
        ]
        block = layout.partition_block
        if block is not None:
            for index in range(layout.partition_count):
                base = layout.partitions_offset + index * block.size
                for f in block.fields:
                    if f.name in _PARTITION_FIELDS:
                        entries.append((base + f.offset, f.name, f.ctype, f.count, index))
        self.partition_slots: dict[tuple[int, str], tuple[int, int, int]] = {}
        self.slots: dict[str, tuple[int, int, int]] = {}
        for offset, name, ctype, count, partition in sorted(entries):
            slot = fields.add(name, ctype, offset, count)
            if partition < 0:  # a top-level field
                self.slots[name] = slot
            else:
                self.partition_slots[(partition, name)] = slot
        self.codec = struct.Struct("".join(fields.parts))

    def unit_factor(self, name: str) -> float:
        return _FACTOR[FIXED_FIELD_UNITS[name]]

    def item(self, name: str, index: int = 0) -> tuple[str, int] | None:
        slot = self.slots.get(name)
        if slot is None:
            return None
        return f"v[{slot[0] + index}]", slot[2]

    def span(self, slot: tuple[int, int, int]) -> str:
        return f"v[{slot[0]}:{slot[0] + slot[1]}]"

    def scalar(self, name: str, factor: float | None = None) -> str:
        """An expression: the field's first element (x factor), or None when absent / all-ones."""
        found = self.item(name)
        if found is None:
            return "None"
        item, all_ones = found
        value = item if factor is None else f"{item} * {factor!r}"
        return f"(None if {item} == {all_ones} else {value})"

    def ratio_scalar(self, name: str) -> str:
        slot = self.slots.get(name)
        if slot is None:
            return "None"
        if slot[1] == 1:  # all-ones is above 100 in every unsigned type: one comparison drops both
            return f"(v[{slot[0]}] / 100 if v[{slot[0]}] <= 100 else None)"
        return f"next(iter(_ratios({self.span(slot)}, {slot[2]})), None)"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def build(self) -> str:
        layout = self.layout
        e = self.emit
        e("v = _unpack(data)")
        # temperatures
        e("t = {}")
        for sensor, name in _TEMPERATURES:
            found = self.item(name)
            if found:
                e(f"if {found[0]} != {found[1]}: t[{sensor!r}] = {found[0]} * {self.unit_factor(name)!r}")
        hbm = self.slots.get("temperature_hbm")
        if hbm is not None:
            for i in range(hbm[1]):
                e(f"if v[{hbm[0] + i}] != {hbm[2]}: t['hbm{i}'] = v[{hbm[0] + i}] * 1.0")
        # power, energy
        current = self.scalar("curr_socket_power", 1.0)
        average = self.scalar("average_socket_power", 1.0)
        e(f"power = {current}")
        e(f"if power is None: power = {average}")
        e(f"energy = {self.scalar('energy_accumulator', ENERGY_JOULES_PER_TICK)}")
        # partitions: the first num_partition blocks (decode_gpu_metrics decides when it is absent)
        if layout.partition_block is not None:
            count = layout.partition_count
            parts = self.item("num_partition")
            assert parts is not None, f"{layout.name}: a partitioned layout without num_partition"
            e(f"n = {parts[0]}")
            e(f"if n == {parts[1]}: return _fallback(data)")
            for name in _PARTITION_FIELDS:
                spans = ", ".join(
                    f"({self.span(self.partition_slots[(p, name)])}, {self.partition_slots[(p, name)][2]})"
                    for p in range(count)
                    if (p, name) in self.partition_slots
                )
                e(f"{name} = [_ratios(s, a) for s, a in ({spans},)[:n]]")
        else:
            e("gfx_busy_inst = []")
            e("vcn_busy = []")
            e("jpeg_busy = []")
        # busy
        e("b = {}")
        for engine, name in (("gfx", "average_gfx_activity"), ("memory", "average_umc_activity")):
            if name in self.slots:
                e(f"x = {self.ratio_scalar(name)}")
                e(f"if x is not None: b[{engine!r}] = x")
        vcn = self.slots.get("vcn_activity")
        e(f"vcn = list(_ratios({self.span(vcn)}, {vcn[2]}))" if vcn else "vcn = []")
        e("for r in vcn_busy: vcn.extend(r)")
        e(f"x = {self.ratio_scalar('average_mm_activity')}")
        e("if x is None and vcn: x = max(vcn)")
        e("if x is not None: b['media'] = x")
        # clocks
        e("c = {}")
        for domain, name in _CLOCKS:
            slot = self.slots.get(name)
            if slot is None:
                continue
            if slot[1] == 1:
                e(f"if v[{slot[0]}] != {slot[2]}: c[{domain!r}] = v[{slot[0]}] * 1000000.0")
            else:
                e(f"x = _highest({self.span(slot)}, {slot[2]}, 1000000.0)")
                e(f"if x is not None: c[{domain!r}] = x")
        e("ca = {}")
        for domain, name in _AVERAGE_CLOCKS:
            found = self.item(name)
            if found:
                e(f"if {found[0]} != {found[1]}: ca[{domain!r}] = {found[0]} * 1000000.0")
        e("vo = {}")
        for rail, name in _VOLTAGES:
            found = self.item(name)
            if found:
                e(f"if {found[0]} != {found[1]}: vo[{rail!r}] = {found[0]} / 1000.0")
        e(f"indep = {self.scalar('indep_throttle_status')}")
        fan = self.item("current_fan_speed")
        e(f"fan = None if {fan[0]} == {fan[1]} else float({fan[0]})" if fan else "fan = None")
        speed = self.item("pcie_link_speed")
        if speed is not None:
            e(f"s = {speed[0]}")
            e(f"pcie_rate = None if s == {speed[1]} or (s in _ESM and s not in _RATES) else s * 100000000.0")
        else:
            e("pcie_rate = None")
        e(f"lane = {self.scalar('xgmi_link_speed', 1e9)}")
        e(f"width = {self.scalar('xgmi_link_width')}")
        e("xgmi_rate = None if lane is None or width is None else lane * width / 8")
        status = self.slots.get("xgmi_link_status")
        e("up = {}")
        if status is not None:
            for i in range(status[1]):
                e(f"if v[{status[0] + i}] in (0, 1): up[{i}] = v[{status[0] + i}] == 1")
        for target, name in (("rd", "xgmi_read_data_acc"), ("wr", "xgmi_write_data_acc")):
            e(f"{target} = {{}}")
            slot = self.slots.get(name)
            if slot is not None:
                for i in range(slot[1]):
                    e(f"if v[{slot[0] + i}] != {slot[2]}: {target}[{i}] = v[{slot[0] + i}] * 1024.0")
        e("res = {}")
        for reason in RESIDENCY_REASONS:
            found = self.item(f"{reason}_residency_acc")
            if found:
                e(f"if {found[0]} != {found[1]}: res[{reason!r}] = {found[0]}")
        fields = [
            ("format_revision", str(layout.format_revision)),
            ("content_revision", str(layout.content_revision)),
            ("structure_size", str(layout.size)),
            ("temperatures", "_fm(t) if t else _EMPTY"),
            ("power_watts", "power"),
            ("energy_joules", "energy"),
            ("busy", "_fm(b) if b else _EMPTY"),
            ("clocks_hertz", "_fm(c) if c else _EMPTY"),
            ("clocks_average_hertz", "_fm(ca) if ca else _EMPTY"),
            ("voltages_volts", "_fm(vo) if vo else _EMPTY"),
            ("indep_throttle_status", "indep"),
            ("throttle", "_EMPTY if indep is None else _throttle(indep)"),
            ("fan_rpm", "fan"),
            ("pcie_link_transfers_per_second", "pcie_rate"),
            ("pcie_bandwidth_bytes_per_second", self.scalar("pcie_bandwidth_inst", 1e9)),
            ("xgmi_link_speed_bytes_per_second", "xgmi_rate"),
            ("xgmi_link_up", "_fm(up) if up else _EMPTY"),
            ("xgmi_read_bytes", "_fm(rd) if rd else _EMPTY"),
            ("xgmi_write_bytes", "_fm(wr) if wr else _EMPTY"),
            ("system_clock_counter_seconds", self.scalar("system_clock_counter", 1e-9)),
            ("firmware_timestamp_seconds", self.scalar("firmware_timestamp", 1e-8)),
            ("partition_gfx_busy", "tuple(gfx_busy_inst)"),
            ("partition_vcn_busy", "tuple(vcn_busy)"),
            ("partition_jpeg_busy", "tuple(jpeg_busy)"),
            ("residency_acc", "_fm(res) if res else _EMPTY"),
            *((attr, self.scalar(name)) for attr, name in _RAW_SCALARS),
        ]
        missing = set(_GPU_METRICS_FIELDS) - {name for name, _ in fields}
        assert not missing, f"the compiled decoder sets no value for {sorted(missing)}"
        # Every field set through its slot's descriptor (see _SETTERS), not the frozen __init__.
        e("g = _new(_GpuMetrics)")
        for name, expression in fields:
            e(f"_set_{name}(g, {expression})")
        e("return g")
        return "def decode(data):\n" + "\n".join(self.lines) + "\n"


def compile_layout(layout: Layout) -> tuple[Decode, str]:
    """One layout's generated decoder and its source (for tests and anyone debugging a layout)."""
    generator = _Source(layout)
    source = generator.build()
    namespace: dict[str, object] = {
        "_unpack": generator.codec.unpack_from,
        "_ratios": _ratios,
        "_highest": _highest,
        "_throttle": _throttle,
        "_fm": frozen_map,
        "_EMPTY": _EMPTY,
        "_ESM": frozenset(_ESM_CODES),
        "_RATES": _PCIE_RATES_100MTS,
        "_GpuMetrics": GpuMetrics,
        "_new": object.__new__,
        "_fallback": decode_gpu_metrics,
        **{f"_set_{name}": setter for name, setter in _SETTERS.items()},
    }
    # Generated from the layout tables alone (names, offsets, counts, units), never from device data.
    exec(compile(source, f"<gpu_metrics decoder {layout.name}>", "exec"), namespace)
    return namespace["decode"], source  # type: ignore[return-value]


_COMPILED: dict[tuple[int, int, int], Decode] = {
    (layout.size, layout.format_revision, layout.content_revision): compile_layout(layout)[0]
    for layout in FIXED_LAYOUTS
}


def decode_gpu_metrics_compiled(blob: bytes | bytearray | memoryview) -> GpuMetrics:
    """decode_gpu_metrics, through the compiled decoder of the blob's layout where there is one."""
    if isinstance(blob, bytes) and len(blob) >= 4:
        key = HEADER.unpack_from(blob)
        decode = _COMPILED.get(key)
        if decode is not None and len(blob) >= key[0]:
            return decode(blob)
    return decode_gpu_metrics(blob)
