"""A snapshot as an 80-column text table: what `watch rocm-smi --showpower --showtemp --showuse`
shows, plus VRAM, clocks, PCIe link, ECC, throttling and the in-daemon suggestions.

Pure: (devices, alerts, when) -> str. Dies of one package (the two GCDs of an MI250X) and the
partitions of one socket (an MI300X in CPX mode) are listed under one header line, because an
operator reasons about the physical part: its power cap, its cooling, its serial number.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.model import AlertState, DeviceState, Sample

WIDTH = 80
GIB = 1024**3
# GPU unit temps power busy vram clocks pcie ecc
_ROW = "{gpu:>3} {unit:<4} {temps:<11} {power:<9} {busy:>4} {vram:<11} {clocks:<9} {pcie:<12} {ecc:<7}"
HEADER = _ROW.format(
    gpu="GPU",
    unit="",
    temps="edge/jn/mem",
    power="power/cap",
    busy="gfx",
    vram="VRAM GiB",
    clocks="MHz g/m",
    pcie="PCIe link",
    ecc="ECC c/u",
).rstrip()
_INDENT = " " * 8


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """The devices of one physical package or socket, in gpu order."""

    package: str
    devices: tuple[DeviceState, ...]

    @property
    def partitioned(self) -> bool:
        """True for a socket split into partitions (MI300X DPX/QPX/CPX), False for dies or one device."""
        return any(d.identity.compute_partition not in ("", "SPX") for d in self.devices)

    def unit_label(self, device: DeviceState) -> str:
        if len(self.devices) == 1 and not self.partitioned:
            return ""
        return f"p{device.identity.partition}" if self.partitioned else f"d{device.identity.die}"


def group_devices(devices: Iterable[DeviceState]) -> tuple[DeviceGroup, ...]:
    """Groups by package id, in the order of each package's first gpu index."""
    groups: dict[str, list[DeviceState]] = {}
    for device in sorted(devices, key=lambda d: d.gpu):
        key = device.identity.package or device.identity.pci_bus_id
        groups.setdefault(key, []).append(device)
    return tuple(DeviceGroup(package, tuple(members)) for package, members in groups.items())


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _temps(sample: Sample) -> str:
    t = sample.temperatures
    return "/".join(f"{_num(t.get(s)):>3}" for s in ("edge", "junction", "memory"))


def _power(sample: Sample) -> str:
    if sample.power_watts is None and sample.power_cap_watts is None:
        return f"{'-':>4}"  # the second die of an MI250X: its package is measured on die 0
    return f"{_num(sample.power_watts):>4}/{_num(sample.power_cap_watts)}"


def _busy(sample: Sample) -> str:
    gfx = sample.busy.get("gfx")
    return "-" if gfx is None else f"{gfx * 100:.0f}%"


def vram_used_total(sample: Sample) -> tuple[float | None, float | None]:
    """VRAM used and total, bytes; a partition that reports no use of its own shows its share."""
    used = sample.memory_used_bytes.get("vram")
    totals = sample.memory_total_bytes
    total = totals.get("vram") if used is not None else totals.get("partition_vram", totals.get("vram"))
    return used, total


def _vram(sample: Sample) -> str:
    used, total = vram_used_total(sample)
    if used is None and total is None:
        return f"{'-':>5}"
    return f"{_num(None if used is None else used / GIB, '{:.1f}'):>5}/{_num(None if total is None else total / GIB)}"


def _clocks(sample: Sample) -> str:
    gfx = sample.clocks_hertz.get("gfx")
    mem = sample.clocks_hertz.get("memory")
    if gfx is None and mem is None:
        return f"{'-':>4}"
    return f"{_num(None if gfx is None else gfx / 1e6):>4}/{_num(None if mem is None else mem / 1e6)}"


def _gts(value: float) -> str:
    return f"{value / 1e9:g}"


def pcie_link(sample: Sample) -> str:
    """'16GT x16'; a link below its maximum shows the maximum too: '8/16GT x8/16'."""
    speed, max_speed = sample.pcie_link_transfers_per_second, sample.pcie_max_link_transfers_per_second
    width, max_width = sample.pcie_link_width, sample.pcie_max_link_width
    if speed is None and width is None:
        return "-"
    speed_text = "-" if speed is None else _gts(speed)
    if speed is not None and max_speed is not None and speed < max_speed:
        speed_text += f"/{_gts(max_speed)}"
    width_text = "-" if width is None else str(width)
    if width is not None and max_width is not None and width < max_width:
        width_text += f"/{max_width}"
    return f"{speed_text}GT x{width_text}"


def _ecc(sample: Sample) -> str:
    if not sample.ecc_errors:
        return "-"
    correctable = sum(v for (_, kind), v in sample.ecc_errors.items() if kind == "correctable")
    uncorrectable = sum(v for (_, kind), v in sample.ecc_errors.items() if kind == "uncorrectable")
    return f"{correctable}/{uncorrectable}"


def _device_lines(device: DeviceState, unit: str, alerts: Sequence[AlertState], now: float) -> list[str]:
    sample = device.sample
    if not device.up:
        age = f", last sample {now - sample.timestamp:.0f} s ago" if sample is not None else ""
        lines = [f"{device.gpu:>3} {unit:<3} DOWN ({device.down_reason or 'unknown'}{age})"]
    else:
        assert sample is not None
        row = _ROW.format(
            gpu=device.gpu,
            unit=unit,
            temps=_temps(sample),
            power=_power(sample),
            busy=_busy(sample),
            vram=_vram(sample),
            clocks=_clocks(sample),
            pcie=pcie_link(sample),
            ecc=_ecc(sample),
        )
        lines = [row.rstrip()]
        throttled = sorted(reason for reason, active in sample.throttle.items() if active)
        if throttled:
            lines += textwrap.wrap(
                "throttling: " + ", ".join(throttled), WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT + "  "
            )
    for alert in alerts:
        state = "firing" if alert.firing else "pending"
        text = f"! {alert.alert} ({alert.severity}, {state})"
        if alert.suggestion:
            text += ": " + " ".join(alert.suggestion.split())
        lines += textwrap.wrap(
            text, WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT + "  ", break_on_hyphens=False
        )
    return lines


def _group_header(group: DeviceGroup) -> str:
    first = group.devices[0].identity
    product = first.product or first.device_id or "unknown device"
    parts = [product]
    if group.partitioned:
        partition = "/".join(p for p in (first.compute_partition, first.memory_partition) if p)
        count = len(group.devices)
        parts.append(f"socket {first.serial or group.package}, {partition}, {count} partition{'s' * (count != 1)}")
    elif len(group.devices) > 1:
        parts.append(f"package {first.serial or group.package}, {len(group.devices)} dies")
    else:
        parts.append(first.pci_bus_id)
    header = "── " + " · ".join(parts) + " "
    return header[:WIDTH].ljust(WIDTH, "─")


def render_table(
    devices: Sequence[DeviceState],
    alerts: Sequence[AlertState] = (),
    *,
    source: str = "",
    taken_at: float | None = None,
) -> str:
    """The whole table, every line at most 80 columns, ending in a newline."""
    now = time.time() if taken_at is None else taken_at
    down = sum(1 for d in devices if not d.up)
    title = f"amdgpu-exporter snapshot · {len(devices)} device{'s' if len(devices) != 1 else ''}"
    if down:
        title += f" ({down} down)"
    if source:
        title += f" · {source}"
    title += " · " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    lines = [title[:WIDTH], HEADER]
    active = [a for a in alerts if a.firing or a.pending_since is not None]
    for group in group_devices(devices):
        lines.append(_group_header(group))
        for device in group.devices:
            mine = [a for a in active if a.gpu == device.gpu]
            lines += _device_lines(device, group.unit_label(device), mine, now)
    if not devices:
        lines.append("no devices")
    return "\n".join(line[:WIDTH] for line in lines) + "\n"
