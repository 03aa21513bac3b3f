"""The sysfs reader as a table: which Sample field each sysfs file fills, how it is parsed, in what unit.

A device's Sample is assembled in layers:

1. the slow layer: SLOW_FILES plus the DPM, RAS, health-signal and xgmi_error readers in slow.py, re-read every
   --slow-interval (caps, thresholds, DPM tables and RAS counts change rarely or cost a firmware trip),
   but for its `static` rows (limits, totals, link maxima), read once after each discovery;
2. gpu_metrics: the fields of GPU_METRICS_FIELDS, from one binary table (one SMU round trip), win
   over the slow layer wherever they are supplied (current clocks, PCIe link state);
3. CYCLE_FILES: files read every cycle, each per its fill rule, most of them fallbacks for a device
   without a usable gpu_metrics table.

Adding a value read from a file is one row here; a test checks every row against Sample.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from exporter.model import SAMPLE_MAPPINGS, CperRecord, DeviceIdentity, Sample, frozen_map
from exporter.sources import textfiles as tf
from exporter.sources.errors import record
from exporter.sources.gpu_metrics import GpuMetrics
from exporter.sources.plausible import all_plausible, plausible
from exporter.sources.sysfs.files import parse_read, read_file_bytes

Key = str | int | tuple[str | int, str | int]
# always: the file's value is the field's; if_missing: only when no earlier layer (or row) supplied
# this field (this key, for a mapping); if_field_empty: only when no earlier layer supplied any key
# of this mapping (a partial gpu_metrics table is not mixed with hwmon readings).
Fill = Literal["always", "if_missing", "if_field_empty"]
Where = Literal["device", "hwmon"]


@dataclass(frozen=True, slots=True)
class FileField:
    """One sysfs file that fills one Sample field (or one key of a mapping field)."""

    field: str  # the Sample field
    key: Key | None  # the key within a mapping field; None for a scalar field
    where: Where  # the device's PCI directory or its amdgpu hwmon directory
    file: str  # path below `where`
    parse: Callable[[str], float | int | None]  # file text -> the field's SI value, named by the file's unit
    fill: Fill = "always"
    # A slow file whose value cannot change while the device stays what discovery found (a limit of
    # its firmware tables, its VRAM, its PCIe link's capability): read at the first slow refresh after
    # each discovery, then kept (slow.read_static_layer).
    static: bool = False

    def path(self, device: DeviceIdentity) -> str | None:
        base = device.device_dir if self.where == "device" else device.hwmon_dir
        return f"{base}/{self.file}" if base else None


# The parsers, by the unit the file holds (the kernel's sysfs and hwmon ABI): each gives the SI value.
_millidegrees = _millivolts = functools.partial(tf.parse_scaled, scale=1e-3)
_microwatts = functools.partial(tf.parse_scaled, scale=1e-6)
_percent = tf.parse_percent_ratio
_gigatransfers = tf.parse_link_speed  # "16.0 GT/s PCIe"
_lanes = tf.parse_link_width


def _microwatts_nonzero(text: str) -> float | None:
    # MI250X die 1 reports a power cap of 0: there is no cap to show, not a cap of zero.
    return tf.parse_scaled(text, 1e-6) or None


def _bytes(text: str) -> float:
    return float(tf.parse_unsigned(text))


_hertz = _bytes
_whole_watts = _bytes  # board/node_power: `%u\n` W


_HWMON_TEMPERATURES = (("edge", 1), ("junction", 2), ("memory", 3))
MEMORY_POOLS = (("vram", "mem_info_vram"), ("visible_vram", "mem_info_vis_vram"), ("gtt", "mem_info_gtt"))

CYCLE_FILES: tuple[FileField, ...] = (
    *(
        FileField("temperatures", sensor, "hwmon", f"temp{i}_input", _millidegrees, "if_field_empty")
        for sensor, i in _HWMON_TEMPERATURES
    ),
    FileField("busy", "gfx", "device", "gpu_busy_percent", _percent, "if_field_empty"),
    FileField("busy", "memory", "device", "mem_busy_percent", _percent, "if_field_empty"),
    FileField("power_watts", None, "hwmon", "power1_average", _microwatts, "if_missing"),
    FileField("power_watts", None, "hwmon", "power1_input", _microwatts, "if_missing"),
    # MI2xx leaves the gpu_metrics voltages unset; hwmon in0 (vddgfx) has the gfx rail.
    FileField("voltages_volts", "gfx", "hwmon", "in0_input", _millivolts, "if_missing"),
    FileField("clocks_hertz", "gfx", "hwmon", "freq1_input", _hertz, "if_missing"),
    *(FileField("memory_used_bytes", pool, "device", f"{prefix}_used", _bytes) for pool, prefix in MEMORY_POOLS),
    # MI350-class board/ group: the node's and the baseboard's power (the rest of board/ is read by
    # sysfs/board.py, slowly)
    FileField("node_power_watts", None, "device", "board/node_power", _whole_watts),
    FileField("baseboard_power_watts", None, "device", "board/baseboard_power", _whole_watts),
)

SLOW_FILES: tuple[FileField, ...] = (
    # The SMU's limits from its firmware tables, fixed at driver load.
    *(
        FileField(
            "temperature_thresholds", (sensor, threshold), "hwmon", f"temp{i}_{suffix}", _millidegrees, static=True
        )
        for sensor, i in _HWMON_TEMPERATURES
        for threshold, suffix in (("critical", "crit"), ("emergency", "emergency"))
    ),
    FileField("power_cap_watts", None, "hwmon", "power1_cap", _microwatts_nonzero),  # root may set it any time
    FileField("power_cap_max_watts", None, "hwmon", "power1_cap_max", _microwatts_nonzero, static=True),
    # Sized at driver load (a memory partition change re-enumerates the device: a rediscovery).
    *(
        FileField("memory_total_bytes", pool, "device", f"{prefix}_total", _bytes, static=True)
        for pool, prefix in MEMORY_POOLS
    ),
    # The link's capability (PCI core), not its trained state.
    FileField("pcie_max_link_transfers_per_second", None, "device", "max_link_speed", _gigatransfers, static=True),
    FileField("pcie_max_link_width", None, "device", "max_link_width", _lanes, static=True),
    FileField("pcie_link_transfers_per_second", None, "device", "current_link_speed", _gigatransfers),
    FileField("pcie_link_width", None, "device", "current_link_width", _lanes),
    FileField("pcie_replays", None, "device", "pcie_replay_count", tf.parse_unsigned),
)

# Sample fields read only while a family shown is made of them (exposition/selection.py, read_fields):
# no rule, health check or page reads them. Every other field is read whatever is shown.
OPTIONAL_FIELDS = frozenset(
    {
        "board_temperatures",  # board/gpuboard_temp: 19 sensors a GPU
        "baseboard_temperatures",  # board/baseboard_temp: 23 sensors a node
        "node_power_watts",  # board/node_power, every cycle
        "baseboard_power_watts",  # board/baseboard_power, every cycle
        "node_power_limit_watts",
        "node_power_limit_max_watts",
        "baseboard_power_limit_watts",
        "node_power_management_enabled",
        "xcc_busy",
        "media_engine_busy",
        "xcc_below_host_limit_seconds",
        "clocks_min_hertz",  # DPM floors (the ceilings feed the clock-down suggestion)
        "temperature_thresholds",
    }
)

# What a source made without a `wanted` set reads (a tool or test reading a tree): every optional
# field but the xcc collector's per-engine and per-reason detail, tens of series a GPU.
UNLESS_TOLD = OPTIONAL_FIELDS - {"media_engine_busy", "xcc_below_host_limit_seconds"}

_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(Sample))
# GpuMetrics fields copied into the Sample field of the same name, in SI units already: every field
# the two share (a decoded value with a Sample field of its name is never left out).
GPU_METRICS_FIELDS: tuple[str, ...] = tuple(name for name in GpuMetrics._fields if name in _SAMPLE_FIELDS)
# Every mapping field given as the one shared empty mapping: a Sample built with these calls no
# default factory for the twenty-odd fields a device leaves empty.
_NO_MAPPINGS = {name: frozen_map() for name in SAMPLE_MAPPINGS}


class SampleValues:
    """The fields of one Sample being assembled, layer by layer: scalars and mappings by field name.

    `mappings` holds only the mapping fields something was put in (mapping() adds one): a Sample
    has thirty-odd mapping fields, most of them empty on any one device, and a read copies the
    slow layer's values every cycle.
    """

    def __init__(self) -> None:
        self.scalars: dict[str, float | int | tuple[float, ...] | tuple[CperRecord, ...] | None] = {}
        self.mappings: dict[str, dict[Any, Any]] = {}

    def mapping(self, field: str) -> dict[Any, Any]:
        """The mapping field's values, to add to (created empty on first use)."""
        return self.mappings.setdefault(field, {})

    def supplied(self, field: str, key: Key | None = None) -> bool:
        if field in SAMPLE_MAPPINGS:
            found = self.mappings.get(field)
            return bool(found) if key is None else found is not None and key in found
        return self.scalars.get(field) is not None

    def set(self, field: str, key: Key | None, value: Any, origin: str = "") -> None:
        """Set one value read from `origin` (a file); an implausible one is counted against it and not set."""
        if origin and value is not None and not plausible(field, value):
            record(origin, "implausible", f"{field} {value!r}")
            return
        if key is None:
            self.scalars[field] = value
        else:
            self.mapping(field)[key] = value

    @classmethod
    def copy_of(cls, layer: SampleValues) -> SampleValues:
        """A new set of values holding what `layer` supplies (its scalars set, copies of its non-empty mappings)."""
        values = cls.__new__(cls)
        values.scalars = {name: value for name, value in layer.scalars.items() if value is not None}
        values.mappings = {name: mapping.copy() for name, mapping in layer.mappings.items() if mapping}
        return values

    def override_from(self, metrics: object, names: Iterable[str]) -> None:
        """Take the named attributes of a decoded table (GpuMetrics) over what is here, where it supplies them.

        Each value is checked like a file's, a rejected one counted against gpu_metrics. A mapping
        keeps the order of the keys already here (a key's first layer decides where it is listed).
        """
        for name in names:
            value = getattr(metrics, name)
            if name not in SAMPLE_MAPPINGS:
                if value is not None:
                    if plausible(name, value):
                        self.scalars[name] = value
                    else:
                        record("gpu_metrics", "implausible", f"{name} {value!r}")
            elif value:
                target = self.mapping(name)
                if all_plausible(name, value.values()):
                    target.update(value)
                    continue
                for key, item in value.items():
                    if plausible(name, item):
                        target[key] = item
                    else:
                        record("gpu_metrics", "implausible", f"{name} {item!r}")

    def sample(self, timestamp: float, file_errors: Mapping[tuple[str, str], int] | None = None) -> Sample:
        """The finished Sample. Call once, last: the Sample takes over these mappings (read-only views, no copies)."""
        if file_errors is not None:
            self.mappings["file_errors"] = dict(file_errors)
        views = {name: MappingProxyType(mapping) for name, mapping in self.mappings.items() if mapping}
        return Sample(timestamp=timestamp, **self.scalars, **{**_NO_MAPPINGS, **views})  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class RowPlan:
    """Rows with their paths resolved for one device, and the mapping fields whose rows fill only an
    empty field; `key` is what it was planned for (the owner plans again when that changes)."""

    rows: tuple[tuple[FileField, str], ...]
    judged_empty: frozenset[str]
    key: object = None


def plan_rows(
    rows: Iterable[FileField], device: DeviceIdentity, exists: Callable[[str], bool] | None = None, key: object = None
) -> RowPlan:
    """The rows a device can read (its hwmon folder known, and with `exists` the file found by
    discovery), each with its path: computed once per device."""
    planned = tuple(
        (row, path) for row in rows if (path := row.path(device)) is not None and (exists is None or exists(path))
    )
    return RowPlan(planned, frozenset(row.field for row, _ in planned if row.fill == "if_field_empty"), key)


def read_rows(
    rows: Iterable[FileField],
    device: DeviceIdentity,
    values: SampleValues,
    read: Callable[[str], bytes | None] = read_file_bytes,
) -> None:
    """Apply table rows to `values`, each per its fill rule (emptiness judged before any row runs)."""
    read_planned(plan_rows(rows, device), values, read)


def read_planned(plan: RowPlan, values: SampleValues, read: Callable[[str], bytes | None] = read_file_bytes) -> None:
    """read_rows over a device's plan (the poll's every-cycle rows: paths not rebuilt every read)."""
    planned, judged_empty = plan.rows, plan.judged_empty
    mappings, scalars = values.mappings, values.scalars
    empty_before = {name for name in judged_empty if not mappings.get(name)}
    for row, path in planned:
        fill = row.fill
        if fill == "if_missing":
            key = row.key
            if (scalars.get(row.field) is not None) if key is None else (key in mappings.get(row.field, ())):
                continue
        elif fill == "if_field_empty" and row.field not in empty_before:
            continue
        raw = read(path)
        value = None if raw is None else parse_read(path, raw, row.parse)
        if value is not None:
            values.set(row.field, row.key, value, row.file)
